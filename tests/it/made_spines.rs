//! Spines made from the offline store (`--entities-at`, `--rows-of`) against the naive
//! oracle: the same spine built here from the ingested files, given to `historical` as
//! a file, must give the same rows; an export of a made spine records it and rebuilds it
//! from the pinned versions after more rows arrived; the refusals.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{Int64Type, TimestampMicrosecondType};

use crate::common::{fails_alone, ok, quiver};
use crate::export::{demo, manifest, read};

fn whole(path: &Path) -> RecordBatch {
    let batches = read(path);
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

fn write(path: &Path, batch: &RecordBatch) {
    let mut w = parquet::arrow::ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

fn times(batch: &RecordBatch) -> Vec<i64> {
    batch.column_by_name("event_timestamp").unwrap().as_primitive::<TimestampMicrosecondType>().values().to_vec()
}

fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn ts_array(values: Vec<i64>) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from(values).with_timezone("UTC"))
}

/// The two outputs hold the same columns (names, types) and values.
fn assert_same_rows(made: &RecordBatch, given: &RecordBatch, what: &str) {
    let names = |b: &RecordBatch| b.schema().fields().iter().map(|f| (f.name().clone(), f.data_type().clone())).collect::<Vec<_>>();
    assert_eq!(names(made), names(given), "{what}: columns");
    assert_eq!(made.num_rows(), given.num_rows(), "{what}: rows");
    for (k, (a, b)) in made.columns().iter().zip(given.columns()).enumerate() {
        assert_eq!(a.to_data(), b.to_data(), "{what}: column {}", made.schema().field(k).name());
    }
}

#[test]
fn entities_at_is_every_entity_with_a_row_by_then_in_any_joined_view() {
    let (_tmp, repo) = demo();
    // Two views of one entity (customers): a profile and an event log.
    let profile = whole(&repo.join("sample_data/customer_profile.parquet"));
    let rides = whole(&repo.join("sample_data/customer_rides.parquet"));
    let mut all: Vec<i64> = times(&profile).into_iter().chain(times(&rides)).collect();
    all.sort_unstable();
    for t in [all[all.len() / 3], all[all.len() - 1] + 1] {
        let mut expected: BTreeSet<String> = BTreeSet::new();
        for batch in [&profile, &rides] {
            let ids = batch.column_by_name("customer_id").unwrap().as_string::<i32>();
            for (i, at) in times(batch).into_iter().enumerate() {
                if at <= t {
                    expected.insert(ids.value(i).to_string());
                }
            }
        }
        assert!(!expected.is_empty());
        let spine = RecordBatch::try_from_iter([
            ("customer_id", Arc::new(StringArray::from(expected.iter().cloned().collect::<Vec<_>>())) as ArrayRef),
            ("event_timestamp", ts_array(vec![t; expected.len()])),
        ])
        .unwrap();
        write(&repo.join("oracle.parquet"), &spine);
        let features = "customer_profile:lifetime_value,customer_rides:rides_7d,customer_rides:fare_sum_1h";
        ok(&repo, &["historical", "--entities-at", &rfc3339(t), "--features", features, "--out", "made.parquet"]);
        ok(&repo, &["historical", "--spine", "oracle.parquet", "--features", features, "--out", "given.parquet"]);
        let made = whole(&repo.join("made.parquet"));
        assert_same_rows(&made, &whole(&repo.join("given.parquet")), &format!("--entities-at {}", rfc3339(t)));
        // Features as of then: not every value is null.
        assert!(made.column_by_name("customer_profile__lifetime_value").unwrap().null_count() < made.num_rows());
    }
}

#[test]
fn rows_of_a_view_keep_its_columns_in_event_time_order_and_sample_the_same_rows() {
    let (_tmp, repo) = demo();
    let pairs = whole(&repo.join("sample_data/driver_customer.parquet"));
    let mut sorted = times(&pairs);
    sorted.sort_unstable();
    let (t1, t2) = (sorted[sorted.len() / 4], sorted[3 * sorted.len() / 4]);
    // The oracle: the file's rows in [t1, t2), by event time, then keys, then file order
    // (one ingest: its ingestion order), keys and time first, the view's features after.
    let ts = times(&pairs);
    let drivers = pairs.column_by_name("driver_id").unwrap().as_primitive::<Int64Type>().clone();
    let customers = pairs.column_by_name("customer_id").unwrap().as_string::<i32>().clone();
    let mut rows: Vec<usize> = (0..pairs.num_rows()).filter(|&i| ts[i] >= t1 && ts[i] < t2).collect();
    rows.sort_by(|&a, &b| (ts[a], drivers.value(a), customers.value(a)).cmp(&(ts[b], drivers.value(b), customers.value(b))));
    let take = |name: &str| {
        arrow::compute::take(
            pairs.column_by_name(name).unwrap(),
            &arrow::array::UInt32Array::from_iter_values(rows.iter().map(|&i| i as u32)),
            None,
        )
        .unwrap()
    };
    let spine =
        RecordBatch::try_from_iter(["driver_id", "customer_id", "event_timestamp", "rides_together", "avg_rating"].map(|n| (n, take(n))))
            .unwrap();
    write(&repo.join("oracle.parquet"), &spine);
    let features = "driver_hourly:conv_rate,customer_profile:lifetime_value,driver_customer:rides_together";
    let (a, b) = (rfc3339(t1), rfc3339(t2));
    ok(&repo, &["historical", "--rows-of", "driver_customer", "--between", &a, &b, "--features", features, "--out", "made.parquet"]);
    ok(&repo, &["historical", "--spine", "oracle.parquet", "--features", features, "--out", "given.parquet"]);
    let made = whole(&repo.join("made.parquet"));
    assert_same_rows(&made, &whole(&repo.join("given.parquet")), "--rows-of --between");
    assert!(made.num_rows() > 50, "{}", made.num_rows());

    // A sample: about its rate, a subset of every row, the same rows for the same seed.
    let all_rows = |args: &[&str], out: &str| {
        let mut full = vec!["historical", "--rows-of", "driver_customer", "--features", "driver_hourly:conv_rate", "--out", out];
        full.extend_from_slice(args);
        ok(&repo, &full);
        let b = whole(&repo.join(out));
        let d = b.column_by_name("driver_id").unwrap().as_primitive::<Int64Type>().clone();
        let c = b.column_by_name("customer_id").unwrap().as_string::<i32>().clone();
        times(&b).into_iter().enumerate().map(|(i, t)| (t, d.value(i), c.value(i).to_string())).collect::<Vec<_>>()
    };
    let every = all_rows(&[], "every.parquet");
    assert_eq!(every.len(), pairs.num_rows());
    let half = all_rows(&["--sample", "0.5", "--seed", "7"], "half.parquet");
    assert!((60..=140).contains(&half.len()), "{} of 200", half.len());
    let every_set: BTreeSet<_> = every.iter().cloned().collect();
    assert!(half.iter().all(|r| every_set.contains(r)), "a sample holds rows of the view");
    assert_eq!(all_rows(&["--sample", "0.5", "--seed", "7"], "again.parquet"), half, "the same seed, the same rows");
    assert_ne!(all_rows(&["--sample", "0.5", "--seed", "8"], "other.parquet"), half, "another seed, other rows");
}

#[test]
fn an_export_of_a_made_spine_records_it_and_reproduces_it_after_more_rows_arrive() {
    let (_tmp, repo) = demo();
    let args = [
        "export",
        "--service",
        "ranker_v1",
        "--rows-of",
        "driver_customer",
        "--sample",
        "0.5",
        "--seed",
        "3",
        "--out",
        "ts",
        "--shard-rows",
        "40",
    ];
    ok(&repo, &args);
    let m = manifest(&repo.join("ts"));
    assert_eq!(m["spine"]["made"], serde_json::json!({"kind": "rows_of", "view": "driver_customer", "sample": 0.5, "seed": 3}));
    assert_eq!(m["spine"]["path"], "--rows-of driver_customer --sample 0.5 --seed 3");
    let rows = m["rows"].as_u64().unwrap();
    assert!((60..=140).contains(&rows), "{rows}");
    assert_eq!(m["shards"].as_array().unwrap().len() as u64, rows.div_ceil(40));
    assert!(m["delta_versions"]["driver_customer"].is_u64());

    // More rows for the view: the same pairs an hour later.
    let pairs = whole(&repo.join("sample_data/driver_customer.parquet"));
    let later: Vec<i64> = times(&pairs).into_iter().map(|t| t + 3_600_000_000).collect();
    let mut columns = pairs.columns().to_vec();
    for name in ["event_timestamp", "created_timestamp"] {
        columns[pairs.schema().index_of(name).unwrap()] = ts_array(later.clone());
    }
    write(&repo.join("more.parquet"), &RecordBatch::try_new(pairs.schema(), columns).unwrap());
    ok(&repo, &["ingest", "driver_customer", "more.parquet"]);

    // The manifest makes the same spine from the versions it pinned: the same shards.
    let out = ok(&repo, &["export", "--reproduce", "ts/manifest.json", "--out", "ts2"]);
    assert!(out.contains("every shard identical to the manifest"), "{out}");
    for s in m["shards"].as_array().unwrap() {
        let f = s["file"].as_str().unwrap();
        assert_eq!(std::fs::read(repo.join("ts").join(f)).unwrap(), std::fs::read(repo.join("ts2").join(f)).unwrap(), "{f}");
    }
    // A new export reads the new rows: about twice as many.
    ok(&repo, &["export", "--service", "ranker_v1", "--rows-of", "driver_customer", "--sample", "0.5", "--seed", "3", "--out", "ts3"]);
    let m3 = manifest(&repo.join("ts3"));
    assert_ne!(m3["training_set_id"], m["training_set_id"]);
    assert!(m3["rows"].as_u64().unwrap() > rows + 40, "{} vs {rows}", m3["rows"]);

    // --entities-at in an export: every driver as of the end of the data.
    let hourly = whole(&repo.join("sample_data/driver_hourly.parquet"));
    let end = times(&hourly).into_iter().max().unwrap();
    let drivers: BTreeSet<i64> = hourly.column_by_name("driver_id").unwrap().as_primitive::<Int64Type>().values().iter().copied().collect();
    let at = rfc3339(end);
    let mut yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    yaml += "  - name: drivers\n    features: [driver_hourly:conv_rate, driver_hourly:acc_rate]\n";
    std::fs::write(repo.join("features.yaml"), yaml).unwrap();
    ok(&repo, &["apply"]);
    ok(&repo, &["export", "--service", "drivers", "--entities-at", &at, "--out", "ea"]);
    let m4 = manifest(&repo.join("ea"));
    assert_eq!(m4["spine"]["made"]["kind"], "entities_at");
    let shard = whole(&repo.join("ea/part-00000.parquet"));
    let got: Vec<i64> = shard.column_by_name("driver_id").unwrap().as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(got, drivers.into_iter().collect::<Vec<_>>(), "every driver once, in key order");
}

#[test]
fn made_spines_refuse_what_cannot_be_made() {
    let (_tmp, repo) = demo();
    fn join<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["historical", "--out", "x.parquet"];
        args.extend_from_slice(extra);
        args
    }
    fails_alone(&repo, &join(&["--entities-at", "now", "--service", "ranker_v1"]), 1, &["the views must share one entity"]);
    fails_alone(&repo, &join(&["--rows-of", "nope", "--features", "driver_hourly:conv_rate"]), 1, &["unknown feature view `nope`"]);
    fails_alone(
        &repo,
        &join(&["--rows-of", "driver_customer", "--between", "2026-01-02", "2026-01-01", "--features", "driver_hourly:conv_rate"]),
        1,
        &["the window is empty"],
    );
    fails_alone(
        &repo,
        &join(&["--rows-of", "driver_customer", "--sample", "2", "--features", "driver_hourly:conv_rate"]),
        1,
        &["--sample must be"],
    );
    fails_alone(
        &repo,
        &join(&["--rows-of", "driver_hourly", "--features", "customer_profile:lifetime_value"]),
        1,
        &["missing join key column `customer_id`"],
    );
    fails_alone(
        &repo,
        &join(&["--entities-at", "2000-01-01", "--features", "driver_hourly:conv_rate"]),
        1,
        &["no entity has a row at or before then"],
    );
    fails_alone(
        &repo,
        &join(&["--entities-at", "yesterday-ish", "--features", "driver_hourly:conv_rate"]),
        1,
        &["--entities-at `yesterday-ish`"],
    );
    fails_alone(
        &repo,
        &join(&["--features", "driver_hourly:conv_rate"]),
        1,
        &["a spine is needed: --spine FILE, --entities-at TIME or --rows-of VIEW"],
    );
    fails_alone(
        &repo,
        &join(&["--entities-at", "now", "--sample", "0.5", "--features", "driver_hourly:conv_rate"]),
        1,
        &["go with --rows-of"],
    );
    fails_alone(
        &repo,
        &join(&["--rows-of", "driver_customer", "--seed", "3", "--features", "driver_hourly:conv_rate"]),
        1,
        &["--seed goes with --sample R"],
    );
    // Spine options beside --reproduce: a usage error, not silently ignored.
    let beside = quiver(&repo, &["export", "--reproduce", "ts/manifest.json", "--sample", "0.5", "--out", "again"], &[]);
    assert_eq!(beside.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&beside.stderr).contains("'--reproduce <REPRODUCE>' cannot be used with '--sample <R>'"));
    // Two spines at once: a usage error.
    let two = quiver(
        &repo,
        &join(&["--spine", "sample_data/spine.parquet", "--entities-at", "now", "--features", "driver_hourly:conv_rate"]),
        &[],
    );
    assert_eq!(two.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&two.stderr).contains("'--spine <SPINE>' cannot be used with '--entities-at <TIME>'"));
    assert!(!repo.join("x.parquet").exists(), "nothing written");
}
