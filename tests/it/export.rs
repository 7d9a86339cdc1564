//! `quiver export` on the demo repository: the manifest's content (checked against the
//! files and against `quiver historical`, the oracle), an exact rebuild from the manifest
//! after more data was ingested (Delta time travel), resume after an export killed
//! between shards, and the refusals.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::common;
use common::{fails_alone, ok, quiver};

use arrow::array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sha2::{Digest, Sha256};

pub(crate) fn demo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "demo", "--demo"]);
    let repo = tmp.path().join("demo");
    ok(&repo, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        ok(&repo, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    (tmp, repo)
}

pub(crate) fn read(path: &Path) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap().build().unwrap().map(Result::unwrap).collect()
}

pub(crate) fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

fn sha256(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn export_writes_shards_and_a_manifest_that_rebuilds_them_exactly() {
    let (_tmp, repo) = demo();
    let spine = "sample_data/spine.parquet";
    let out = ok(&repo, &["export", "--service", "ranker_v1", "--spine", spine, "--out", "ts1", "--shard-rows", "100", "--engine", "cpu"]);
    assert!(out.contains("exported training set "), "{out}");
    let m = manifest(&repo.join("ts1"));

    // The oracle: the same join in one piece.
    ok(&repo, &["historical", "--spine", spine, "--service", "ranker_v1", "--out", "whole.parquet", "--engine", "cpu"]);
    let whole = read(&repo.join("whole.parquet"));
    let whole = arrow::compute::concat_batches(&whole[0].schema(), &whole).unwrap();
    let n = whole.num_rows();
    assert_eq!(m["rows"].as_u64().unwrap() as usize, n);
    assert_eq!(m["spine"]["rows"].as_u64().unwrap() as usize, n);
    let shards = m["shards"].as_array().unwrap();
    assert_eq!(shards.len(), n.div_ceil(100));
    let mut parts = Vec::new();
    for (k, s) in shards.iter().enumerate() {
        let file = repo.join("ts1").join(s["file"].as_str().unwrap());
        assert_eq!(s["file"], format!("part-{k:05}.parquet"));
        assert_eq!(s["sha256"].as_str().unwrap(), sha256(&file), "shard {k} checksum");
        let batches = read(&file);
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>() as u64, s["rows"].as_u64().unwrap());
        parts.extend(batches);
    }
    let joined = arrow::compute::concat_batches(&whole.schema(), &parts).unwrap();
    assert_eq!(joined, whole, "the shards together are the point-in-time join");
    // Features with types, versions read, schema, id.
    let features: Vec<(String, String)> = m["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["reference"].as_str().unwrap().to_string(), f["dtype"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(features[0], ("driver_hourly:conv_rate".to_string(), "float64".to_string()));
    assert_eq!(features[4], ("customer_profile:embedding".to_string(), "list<float32>".to_string()));
    assert_eq!(
        m["delta_versions"],
        serde_json::json!({"customer_profile": 1, "customer_rides": 1, "driver_customer": 1, "driver_hourly": 1})
    );
    assert_eq!(m["schema"].as_array().unwrap().len(), whole.num_columns());
    assert_eq!(m["training_set_id"].as_str().unwrap().len(), 32);
    assert_eq!(m["spine"]["sha256"].as_str().unwrap(), sha256(&repo.join(spine)));

    // Exporting the same again into the same folder is a no-op; another set is refused.
    let again = ok(&repo, &["export", "--service", "ranker_v1", "--spine", spine, "--out", "ts1", "--shard-rows", "100"]);
    assert!(again.contains("was already in ts1") && again.contains("nothing written"), "{again}");
    fails_alone(
        &repo,
        &["export", "--service", "ranker_v1", "--spine", spine, "--out", "ts1", "--shard-rows", "50"],
        1,
        &["holds another training set"],
    );

    // More data arrives: the same rows with other conversion rates, which win every tie
    // (ingested later). The manifest still rebuilds the same bytes (time travel).
    let hourly = read(&repo.join("sample_data/driver_hourly.parquet"));
    let hourly = arrow::compute::concat_batches(&hourly[0].schema(), &hourly).unwrap();
    let i = hourly.schema().index_of("conv_rate").unwrap();
    let shifted = arrow::compute::kernels::numeric::add(hourly.column(i), &arrow::array::Float64Array::new_scalar(1.0)).unwrap();
    let mut columns = hourly.columns().to_vec();
    columns[i] = shifted;
    let changed = RecordBatch::try_new(hourly.schema(), columns).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(File::create(repo.join("changed.parquet")).unwrap(), changed.schema(), None).unwrap();
    w.write(&changed).unwrap();
    w.close().unwrap();
    ok(&repo, &["ingest", "driver_hourly", "changed.parquet"]);
    ok(&repo, &["export", "--reproduce", "ts1/manifest.json", "--out", "ts2"]);
    let m2 = manifest(&repo.join("ts2"));
    assert_eq!(m2["training_set_id"], m["training_set_id"]);
    for s in shards {
        let f = s["file"].as_str().unwrap();
        assert_eq!(std::fs::read(repo.join("ts1").join(f)).unwrap(), std::fs::read(repo.join("ts2").join(f)).unwrap(), "{f}");
    }
    // A new export reads the new version: another training set.
    ok(&repo, &["export", "--service", "ranker_v1", "--spine", spine, "--out", "ts3", "--shard-rows", "100"]);
    let m3 = manifest(&repo.join("ts3"));
    assert_ne!(m3["training_set_id"], m["training_set_id"]);
    assert_eq!(m3["delta_versions"]["driver_hourly"], 2);
    assert_ne!(m3["shards"][0]["sha256"], m["shards"][0]["sha256"], "the new data changes the join");
}

#[test]
fn an_interrupted_export_resumes_after_its_last_shard() {
    let (_tmp, repo) = demo();
    let args = ["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "ts", "--shard-rows", "64"];
    let killed = quiver(&repo, &args, &[("QUIVER_EXPORT_ABORT_AFTER_SHARDS", "2")]);
    assert!(!killed.status.success());
    assert!(!repo.join("ts/manifest.json").exists(), "no manifest before the end");
    let first = repo.join("ts/part-00000.parquet");
    let before = (std::fs::metadata(&first).unwrap().modified().unwrap(), sha256(&first));
    assert!(repo.join("ts/part-00001.parquet").exists() && !repo.join("ts/part-00002.parquet").exists());
    ok(&repo, &args);
    let m = manifest(&repo.join("ts"));
    assert!(!repo.join("ts/_progress.json").exists());
    assert_eq!(std::fs::metadata(&first).unwrap().modified().unwrap(), before.0, "finished shards are not rewritten");
    // The resumed export equals one done in a single run.
    ok(&repo, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "clean", "--shard-rows", "64"]);
    let clean = manifest(&repo.join("clean"));
    assert_eq!(m["shards"], clean["shards"]);
    assert_eq!(m["training_set_id"], clean["training_set_id"]);
    assert_eq!(m["shards"][0]["sha256"].as_str().unwrap(), before.1);
}

#[test]
fn export_refuses_what_cannot_be_done() {
    let (_tmp, repo) = demo();
    let spine = "sample_data/spine.parquet";
    fails_alone(&repo, &["export", "--service", "nope", "--spine", spine, "--out", "x"], 1, &["unknown feature service `nope`"]);
    fails_alone(&repo, &["export", "--service", "ranker_v1", "--spine", "missing.parquet", "--out", "x"], 1, &["missing.parquet"]);
    fails_alone(
        &repo,
        &["export", "--service", "ranker_v1", "--spine", spine, "--out", "x", "--shard-rows", "0"],
        1,
        &["--shard-rows must be at least 1"],
    );
    // A spine that changed after the export cannot be reproduced.
    std::fs::copy(repo.join(spine), repo.join("spine2.parquet")).unwrap();
    ok(&repo, &["export", "--service", "ranker_v1", "--spine", "spine2.parquet", "--out", "ts", "--shard-rows", "500"]);
    std::fs::copy(repo.join("sample_data/driver_hourly.parquet"), repo.join("spine2.parquet")).unwrap();
    fails_alone(&repo, &["export", "--reproduce", "ts/manifest.json", "--out", "ts2"], 1, &["the spine changed since the export"]);
}

/// Issue 53: `--reproduce` compares what the training set read, not the registry's
/// version: an apply of something else reproduces byte for byte; a change to a view it
/// read is refused, naming the view, and nothing is written.
#[test]
fn reproduce_survives_an_unrelated_apply_and_names_a_change_to_what_it_read() {
    let (_tmp, repo) = demo();
    ok(&repo, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "ts", "--shard-rows", "200"]);
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    assert!(yaml.trim_end().ends_with("customer_rides:fare_sum_1h"), "the services come last: {yaml}");
    // Another service, and a new description of a view the set reads: nothing it read.
    let unrelated = yaml.replace("description: Hourly driver quality statistics.", "description: Hourly driver statistics.")
        + "  - name: other\n    features: [driver_customer:avg_rating]\n";
    std::fs::write(repo.join("features.yaml"), &unrelated).unwrap();
    ok(&repo, &["apply"]);
    let out = ok(&repo, &["export", "--reproduce", "ts/manifest.json", "--out", "ts2"]);
    assert!(out.contains("every shard identical to the manifest"), "{out}");
    let m = manifest(&repo.join("ts"));
    assert_eq!(manifest(&repo.join("ts2"))["training_set_id"], m["training_set_id"]);
    for s in m["shards"].as_array().unwrap() {
        let f = s["file"].as_str().unwrap();
        assert_eq!(std::fs::read(repo.join("ts").join(f)).unwrap(), std::fs::read(repo.join("ts2").join(f)).unwrap(), "{f}");
    }
    // The ttl of a view it read: refused by name.
    std::fs::write(repo.join("features.yaml"), unrelated.replace("ttl: 2h", "ttl: 3h")).unwrap();
    ok(&repo, &["apply", "--force"]);
    fails_alone(
        &repo,
        &["export", "--reproduce", "ts/manifest.json", "--out", "ts3"],
        1,
        &["cannot reproduce: feature view `driver_hourly` changed since the export read it (registry version 1 then, 3 now)"],
    );
    assert!(!repo.join("ts3").exists(), "nothing written");
}

/// Issue 14: `--reproduce` into the original folder rebuilds every shard and checks it
/// against the manifest; a shard damaged since (truncated here) is written again from
/// the reproduced rows and reported, never passed over.
#[test]
fn reproducing_into_the_original_folder_checks_and_repairs_every_shard() {
    let (_tmp, repo) = demo();
    let args = ["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "ts", "--shard-rows", "100"];
    ok(&repo, &args);
    let m = manifest(&repo.join("ts"));
    let damaged = repo.join("ts/part-00001.parquet");
    let bytes = std::fs::read(&damaged).unwrap();
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let untouched = std::fs::metadata(repo.join("ts/part-00000.parquet")).unwrap().modified().unwrap();
    let out = quiver(&repo, &["export", "--reproduce", "ts/manifest.json", "--out", "ts"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("repaired") && stderr.contains("part-00001.parquet"), "{stderr}");
    assert!(!stderr.contains("part-00000"), "intact shards are not reported: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("every shard identical to the manifest"));
    assert_eq!(sha256(&damaged), m["shards"][1]["sha256"].as_str().unwrap(), "the shard is whole again");
    assert_eq!(std::fs::read(&damaged).unwrap(), bytes);
    assert_eq!(std::fs::metadata(repo.join("ts/part-00000.parquet")).unwrap().modified().unwrap(), untouched, "intact shards are left");
    // A plain export into the same folder finds a damaged shard too, and repairs it.
    std::fs::write(&damaged, b"garbage").unwrap();
    ok(&repo, &args);
    assert_eq!(std::fs::read(&damaged).unwrap(), bytes);
}

/// Issue 14: an export into a folder that holds files of no export of this training set
/// (a stray `part-00000.parquet`, say) is refused before anything is written.
#[test]
fn export_refuses_a_folder_holding_other_files() {
    let (_tmp, repo) = demo();
    std::fs::create_dir_all(repo.join("busy")).unwrap();
    std::fs::write(repo.join("busy/part-00000.parquet"), b"someone else's shard").unwrap();
    std::fs::write(repo.join("busy/notes.txt"), b"keep me").unwrap();
    let args = ["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "busy"];
    fails_alone(&repo, &args, 1, &["is not empty and holds no export of this training set (found notes.txt, part-00000.parquet)"]);
    assert_eq!(std::fs::read(repo.join("busy/part-00000.parquet")).unwrap(), b"someone else's shard");
    assert!(!repo.join("busy/manifest.json").exists() && !repo.join("busy/_progress.json").exists());
    // And reproducing into it is refused the same way.
    ok(&repo, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "ts"]);
    fails_alone(&repo, &["export", "--reproduce", "ts/manifest.json", "--out", "busy"], 1, &["is not empty"]);
    assert_eq!(std::fs::read(repo.join("busy/part-00000.parquet")).unwrap(), b"someone else's shard");
}

/// A service with on-demand features exports them as `historical` computes them (the
/// oracle), their type in the manifest; a spine without their request field is refused,
/// naming it, and nothing is written.
#[test]
fn export_computes_on_demand_features() {
    use arrow::array::{ArrayRef, Float64Array};
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "demo", "--demo"]);
    let repo = tmp.path().join("demo");
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    let yaml = yaml.replacen(
        "feature_services:\n",
        "feature_services:\n  - name: scored\n    features: [\"derived:tip_share\", \"driver_hourly:conv_rate\"]\n",
        1,
    );
    let derived = "on_demand_views:\n  - name: derived\n    inputs: [driver_hourly]\n    request: [{name: tip, dtype: float64}]\n    \
                   features:\n      - {name: tip_share, dtype: float64, expr: \"tip * driver_hourly.conv_rate\"}\n";
    std::fs::write(repo.join("features.yaml"), format!("{yaml}{derived}")).unwrap();
    ok(&repo, &["apply"]);
    ok(&repo, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    let refused = fails_alone(
        &repo,
        &["export", "--service", "scored", "--spine", "sample_data/spine.parquet", "--out", "bad"],
        1,
        &["missing column `tip`: a request field of on-demand view `derived`"],
    );
    assert!(!repo.join("bad").join("manifest.json").exists(), "{refused}");
    // The sample spine with a tip on every row.
    let spine = read(&repo.join("sample_data/spine.parquet"));
    let spine = arrow::compute::concat_batches(&spine[0].schema(), &spine).unwrap();
    let tips: ArrayRef = std::sync::Arc::new(Float64Array::from_iter_values((0..spine.num_rows()).map(|i| (i % 7) as f64 * 0.5)));
    let mut fields: Vec<arrow::datatypes::Field> = spine.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(arrow::datatypes::Field::new("tip", arrow::datatypes::DataType::Float64, false));
    let mut columns = spine.columns().to_vec();
    columns.push(tips);
    let with_tips = RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), columns).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(File::create(repo.join("tips.parquet")).unwrap(), with_tips.schema(), None).unwrap();
    w.write(&with_tips).unwrap();
    w.close().unwrap();

    ok(&repo, &["export", "--service", "scored", "--spine", "tips.parquet", "--out", "set", "--shard-rows", "200"]);
    ok(&repo, &["historical", "--spine", "tips.parquet", "--service", "scored", "--out", "whole.parquet"]);
    let m = manifest(&repo.join("set"));
    assert_eq!(m["features"][0]["dtype"], "float64", "{m}");
    let mut parts = Vec::new();
    for s in m["shards"].as_array().unwrap() {
        parts.extend(read(&repo.join("set").join(s["file"].as_str().unwrap())));
    }
    let exported = arrow::compute::concat_batches(&parts[0].schema(), &parts).unwrap();
    let whole = read(&repo.join("whole.parquet"));
    let whole = arrow::compute::concat_batches(&whole[0].schema(), &whole).unwrap();
    assert_eq!(exported, whole, "the export's rows are historical's");
    let share = whole.column_by_name("derived__tip_share").unwrap();
    assert!(share.null_count() < share.len(), "some tip shares computed");
}
