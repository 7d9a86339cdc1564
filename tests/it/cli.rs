//! The `quiver` binary end to end on temporary repositories: init --demo, plan, apply,
//! list, describe, refused definitions, --force against a real Delta table with data.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow::datatypes::{DataType, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use quiver::sdk::{DType, ListElement};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

use crate::common;
use common::{fails_alone as fails, ok};

fn quiver_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let Output { status, stdout, stderr } = common::quiver(dir, args, env);
    Run { code: status.code().unwrap_or(-1), stdout: String::from_utf8(stdout).unwrap(), stderr: String::from_utf8(stderr).unwrap() }
}

fn demo_repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = ok(tmp.path(), &["init", "demo", "--demo"]);
    assert!(out.contains("created demo repository `demo`"), "{out}");
    let repo = tmp.path().join("demo");
    (tmp, repo)
}

fn parquet_schema(path: &Path) -> (Vec<(String, DataType)>, usize) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let rows = builder.metadata().file_metadata().num_rows() as usize;
    let fields = builder.schema().fields().iter().map(|f| (f.name().clone(), f.data_type().clone())).collect();
    (fields, rows)
}

/// The Arrow type a feature of `dtype` is stored as (written here independently of the
/// code under test).
fn arrow_type(dtype: DType) -> DataType {
    let utc = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    match dtype {
        DType::Int32 => DataType::Int32,
        DType::Int64 => DataType::Int64,
        DType::Float32 => DataType::Float32,
        DType::Float64 => DataType::Float64,
        DType::Bool => DataType::Boolean,
        DType::String => DataType::Utf8,
        DType::Bytes => DataType::Binary,
        DType::Timestamp => utc(),
        DType::List(e) => {
            let inner = match e {
                ListElement::Int64 => DataType::Int64,
                ListElement::Float32 => DataType::Float32,
                ListElement::Float64 => DataType::Float64,
                ListElement::String => DataType::Utf8,
            };
            DataType::new_list(inner, true)
        }
    }
}

#[test]
fn demo_sample_data_matches_the_demo_definitions() {
    let (_tmp, repo) = demo_repo();
    for name in ["quiver.yaml", "features.yaml", ".gitignore"] {
        assert!(repo.join(name).is_file(), "{name} missing");
    }
    let defs = quiver::sdk::yaml::load_definitions(&repo.join("features.yaml")).unwrap();
    assert_eq!(defs.entities.len(), 2);
    assert_eq!(defs.feature_views.len(), 4);
    assert_eq!(defs.feature_services.len(), 1);
    let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    for view in &defs.feature_views {
        let (fields, rows) = parquet_schema(&repo.join(format!("sample_data/{}.parquet", view.name)));
        assert!(rows > 100, "{}: only {rows} rows", view.name);
        let mut expected: Vec<(String, DataType)> =
            defs.join_keys(view).iter().map(|k| (k.name.clone(), arrow_type(k.dtype.dtype()))).collect();
        expected.push((view.source.timestamp_field.clone(), utc.clone()));
        expected.push((view.source.created_timestamp_field.clone().unwrap(), utc.clone()));
        expected.extend(view.features.iter().map(|f| (f.name.clone(), arrow_type(f.dtype))));
        assert_eq!(fields, expected, "{}", view.name);
    }
    // The spine has every join key the service needs, an event time and a label.
    let (fields, rows) = parquet_schema(&repo.join("sample_data/spine.parquet"));
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["driver_id", "customer_id", "event_timestamp", "accepted"]);
    assert_eq!(rows, 500);
}

#[test]
fn init_plan_apply_list_describe() {
    let (_tmp, repo) = demo_repo();
    let plan = ok(&repo, &["plan"]);
    for line in [
        "+ entity customer",
        "+ entity driver",
        "+ feature_view customer_profile",
        "+ feature_view customer_rides",
        "+ feature_view driver_customer",
        "+ feature_view driver_hourly",
        "+ feature_service ranker_v1",
        "7 to add, 0 to change, 0 to remove",
        "as version 1",
    ] {
        assert!(plan.contains(line), "plan lacks {line:?}:\n{plan}");
    }
    assert!(!repo.join("registry.json").exists(), "plan must not write");

    let applied = ok(&repo, &["apply"]);
    assert!(applied.contains("is at version 1"), "{applied}");
    let registry: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repo.join("registry.json")).unwrap()).unwrap();
    assert_eq!(registry["version"], 1);
    assert_eq!(registry["project"], "demo");
    assert_eq!(registry["definitions"]["feature_views"].as_array().unwrap().len(), 4);

    let before = std::fs::read(repo.join("registry.json")).unwrap();
    let again = ok(&repo, &["apply"]);
    assert!(again.contains("no changes: registry stays at version 1"), "{again}");
    assert_eq!(std::fs::read(repo.join("registry.json")).unwrap(), before);
    assert!(ok(&repo, &["plan"]).contains("no changes: registry is at version 1"));

    let list = ok(&repo, &["list"]);
    for part in [
        "registry version 1",
        "driver_id:int64",
        "customer_id:string",
        "driver_hourly",
        "ttl 2h",
        "ranker_v1",
        "8 features",
        "5 aggregations of 3 columns",
    ] {
        assert!(list.contains(part), "list lacks {part:?}:\n{list}");
    }

    let described = ok(&repo, &["describe", "driver_customer"]);
    let value: serde_yaml::Value = serde_yaml::from_str(described.trim_start_matches("kind: feature_view\n")).unwrap();
    assert_eq!(value["ttl"], "30d");
    assert_eq!(value["version"], 1);
    let keys: Vec<&str> = value["join_keys"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(keys, ["driver_id:int64", "customer_id:string"]);
    assert!(value["table"].as_str().unwrap().ends_with("data/driver_customer"));

    // An aggregation that names no hop shows the one it gets.
    let rides = ok(&repo, &["describe", "customer_rides"]);
    let value: serde_yaml::Value = serde_yaml::from_str(rides.trim_start_matches("kind: feature_view\n")).unwrap();
    let hops: Vec<(&str, &str)> = value["aggregations"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap(), a["hop"].as_str().unwrap_or_else(|| panic!("{rides}"))))
        .collect();
    assert_eq!(
        hops,
        [
            ("fare_sum_1h", "5m (default for a 1h window)"),
            ("rides_7d", "1h (default for a 7d window)"),
            ("minutes_min_30m", "10m"),
            ("fare_avg_1d", "1h (default for a 1d window)"),
            ("last_cities", "1h (default for a 7d window)"),
        ]
    );

    let svc = ok(&repo, &["describe", "ranker_v1"]);
    assert!(svc.contains("kind: feature_service"), "{svc}");
    assert!(svc.contains("driver_hourly__conv_rate"), "{svc}");

    fails(&repo, &["describe", "nope"], 1, &["`nope` is not in the registry", "driver_hourly"]);

    // A later edit shows up per field, and applies as version 2.
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    std::fs::write(repo.join("features.yaml"), yaml.replacen("ttl: 2h", "ttl: 3h", 1)).unwrap();
    let plan = ok(&repo, &["plan"]);
    assert!(plan.contains("~ feature_view driver_hourly\n    ttl: \"2h\" -> \"3h\""), "{plan}");
    assert!(ok(&repo, &["apply"]).contains("is at version 2"));
}

#[test]
fn a_service_naming_an_unknown_view_is_refused_and_the_registry_is_unchanged() {
    let (_tmp, repo) = demo_repo();
    ok(&repo, &["apply"]);
    let before = std::fs::read(repo.join("registry.json")).unwrap();
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    let broken = yaml.replacen("- driver_hourly:acc_rate", "- driver_weekly:acc_rate", 1);
    assert_ne!(broken, yaml);
    std::fs::write(repo.join("features.yaml"), broken).unwrap();
    for verb in ["apply", "plan"] {
        fails(&repo, &[verb], 1, &["features.yaml", "feature service `ranker_v1`", "unknown feature view `driver_weekly`"]);
    }
    assert_eq!(std::fs::read(repo.join("registry.json")).unwrap(), before);
}

#[test]
fn bad_definitions_name_the_file_and_field() {
    let (_tmp, repo) = demo_repo();
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    std::fs::write(repo.join("features.yaml"), yaml.replacen("{name: avg_rating, dtype: float32}", "{name: avg_rating, dtype: real}", 1))
        .unwrap();
    fails(&repo, &["apply"], 1, &["features.yaml", "feature view `driver_customer`, feature `avg_rating`", "unknown dtype `real`"]);
    assert!(!repo.join("registry.json").exists());
    // A validation error (not a parse error) names the view and aggregation once.
    let bad = yaml.replacen("function: count, column: fare", "function: sum, column: city", 1);
    assert_ne!(bad, yaml, "the demo's event log counts fares");
    std::fs::write(repo.join("features.yaml"), bad).unwrap();
    fails(&repo, &["apply"], 1, &["features.yaml: feature view `customer_rides`, aggregation", "sum needs a numeric column"]);
}

/// A breaking change to a view with data makes its next version (docs/versions.md): a
/// new Delta table beside the first, the service pinned to version 1; `--force`
/// replaces in place instead.
#[test]
fn breaking_changes_to_a_view_with_data_make_a_new_version_or_are_forced() {
    let (_tmp, repo) = demo_repo();
    ok(&repo, &["apply"]);
    ok(&repo, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    std::fs::write(
        repo.join("features.yaml"),
        yaml.replacen("{name: avg_daily_trips, dtype: int64}", "{name: avg_daily_trips, dtype: float64}", 1)
            // The same kind of change to a view without data is made in place.
            .replacen("{name: rides_together, dtype: int64}", "{name: rides_together, dtype: int32}", 1),
    )
    .unwrap();
    let before = std::fs::read(repo.join("registry.json")).unwrap();
    let plan = ok(&repo, &["plan"]);
    assert!(
        plan.contains("^ feature_view driver_hourly: version 2 beside version 1 (feature `avg_daily_trips` would change type from int64 to float64); stays on version 1: feature_service ranker_v1"),
        "{plan}"
    );
    assert_eq!(std::fs::read(repo.join("registry.json")).unwrap(), before, "plan writes nothing");
    let out = ok(&repo, &["apply"]);
    assert!(out.contains("is at version 2"), "{out}");
    assert!(out.contains("created delta table") && out.contains("driver_hourly.v2"), "{out}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(repo.join("registry.json")).unwrap()).unwrap();
    let defs = &doc["definitions"];
    let view = |v: &serde_json::Value| (v["name"].as_str().unwrap().to_string(), v["version"].as_u64().unwrap_or(1));
    let latest: Vec<_> = defs["feature_views"].as_array().unwrap().iter().map(view).collect();
    assert!(latest.contains(&("driver_hourly".to_string(), 2)) && latest.contains(&("driver_customer".to_string(), 1)), "{latest:?}");
    assert_eq!(defs["earlier_versions"]["feature_views"][0]["name"], "driver_hourly");
    assert_eq!(defs["feature_services"][0]["features"][0], "driver_hourly@1:conv_rate");
    assert!(repo.join("data/driver_hourly.v2/_delta_log").is_dir(), "version 2 has its own table");
    // A version that does not exist, or a malformed one, is refused by name.
    fails(
        &repo,
        &["online", "--features", "driver_hourly@3:conv_rate", "--entity", "driver_id=1001"],
        1,
        &["view `driver_hourly` has no version 3 (it never had one, or it was retired; live: 1, 2)"],
    );
    fails(
        &repo,
        &["online", "--features", "driver_hourly@x:conv_rate", "--entity", "driver_id=1001"],
        1,
        &["bad feature reference `driver_hourly@x:conv_rate` (expected `view:feature` or `view@N:feature`"],
    );
    // --force replaces in place.
    std::fs::write(repo.join("registry.json"), &before).unwrap();
    let forced = quiver_in(&repo, &["apply", "--force"], &[]);
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert!(forced.stdout.contains("is at version 2"), "{}", forced.stdout);
    assert!(forced.stderr.contains("warning: forced: feature view `driver_hourly` holds data"), "{}", forced.stderr);
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(repo.join("registry.json")).unwrap()).unwrap();
    assert!(doc["definitions"].get("earlier_versions").is_none(), "{}", doc["definitions"]);
}

#[test]
fn two_views_on_one_table_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "r"]);
    let repo = tmp.path().join("r");
    std::fs::write(
        repo.join("features.yaml"),
        "entities: [{name: u, join_keys: [{name: id, dtype: int64}]}]\n\
         feature_views:\n\
         \x20 - {name: a, entities: [u], source: {path: data/shared}, features: [{name: x, dtype: int64}]}\n\
         \x20 - {name: shared, entities: [u], features: [{name: y, dtype: int64}]}\n",
    )
    .unwrap();
    fails(&repo, &["apply"], 1, &["feature views `a` and `shared` use the same table", "data/shared"]);
    assert!(!repo.join("registry.json").exists());
    assert!(!repo.join("data").exists(), "no table is created by a refused apply");
}

#[test]
fn environment_overrides_the_file() {
    let (_tmp, repo) = demo_repo();
    let run = quiver_in(&repo, &["apply"], &[("QUIVER_REGISTRY", "state/reg.json")]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(repo.join("state/reg.json").is_file());
    assert!(!repo.join("registry.json").exists());
    let run = quiver_in(&repo, &["list"], &[("QUIVER_SERVER_PROT", "1")]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("QUIVER_SERVER_PROT") && run.stderr.contains("unknown setting"), "{}", run.stderr);
}

#[test]
fn init_refuses_an_existing_repository_and_makes_a_valid_skeleton() {
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "plain"]);
    let repo = tmp.path().join("plain");
    assert!(ok(&repo, &["plan"]).contains("no changes: registry is at version 0"));
    assert!(ok(&repo, &["list"]).contains("registry is empty"));
    fails(tmp.path(), &["init", "plain"], 1, &["already holds a repository"]);
    // No temp folders are left next to it.
    let names: Vec<String> =
        std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["plain"]);
    // The template names every online store, and its commented lines for each are
    // settings `quiver.yaml` takes.
    let template = std::fs::read_to_string(repo.join("quiver.yaml")).unwrap();
    assert!(template.contains("type: embedded                       # embedded | redis | redis_cluster"), "{template}");
    let uncomment = |setting: &str| {
        let line = template.lines().find(|l| l.trim_start().starts_with(&format!("# {setting}:"))).unwrap_or_else(|| panic!("{template}"));
        line.replacen("# ", "", 1)
    };
    for (kind, setting) in [("redis", "url"), ("redis_cluster", "urls")] {
        let config = template
            .replace("  type: embedded ", &format!("  type: {kind} "))
            .replace("  path: online.db", &uncomment(setting))
            .replace(&format!("\n  # {setting}:"), "\n  # was:");
        std::fs::write(repo.join("quiver.yaml"), &config).unwrap();
        assert!(ok(&repo, &["list"]).contains("registry is empty"), "{kind}: {config}");
    }
}

#[test]
fn commands_outside_a_repository_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    fails(tmp.path(), &["list"], 1, &["quiver.yaml", "not a quiver repository"]);
}

#[test]
fn every_verb_is_in_help() {
    let tmp = tempfile::tempdir().unwrap();
    let help = ok(tmp.path(), &["--help"]);
    for verb in [
        "init",
        "plan",
        "apply",
        "list",
        "describe",
        "ingest",
        "historical",
        "export",
        "materialize",
        "materialize-incremental",
        "online",
        "serve",
        "stream",
        "push",
        "verify",
        "doctor",
    ] {
        assert!(help.lines().any(|l| l.trim_start().starts_with(&format!("{verb} "))), "help lacks {verb}:\n{help}");
    }
}

#[test]
fn stream_and_push_refuse_what_cannot_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    ok(tmp.path(), &["init", dir.to_str().unwrap(), "--demo"]);
    ok(&dir, &["apply"]);
    fails(&dir, &["stream"], 1, &["no feature view has a stream source"]);
    fails(&dir, &["stream", "driver_hourly"], 1, &["feature view `driver_hourly` has no stream source"]);
    fails(&dir, &["stream", "nope"], 1, &["unknown feature view `nope`"]);
    fails(&dir, &["push", "driver_hourly", "missing.parquet"], 1, &["missing.parquet"]);
    fails(&dir, &["push", "nope", "sample_data/driver_hourly.parquet"], 1, &["nope"]);
}

fn read_parquet(path: &Path) -> arrow::array::RecordBatch {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap().build().unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

fn delta_commits(table: &Path) -> usize {
    std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "json"))
        .count()
}

#[test]
fn ingest_then_historical_on_the_demo() {
    use arrow::array::{Array, AsArray};
    let (_tmp, repo) = demo_repo();
    let applied = ok(&repo, &["apply"]);
    assert!(applied.contains("created delta table"), "{applied}");
    for view in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        let out = ok(&repo, &["ingest", view, &format!("sample_data/{view}.parquet")]);
        assert!(out.contains(&format!("rows into {view} (table version 1)")), "{out}");
    }
    let out = ok(&repo, &["historical", "--spine", "sample_data/spine.parquet", "--service", "ranker_v1", "--out", "train.parquet"]);
    assert!(out.contains("historical: 500 rows x 8 features"), "{out}");
    let spine = read_parquet(&repo.join("sample_data/spine.parquet"));
    let joined = read_parquet(&repo.join("train.parquet"));
    assert_eq!(joined.num_rows(), 500);
    let names: Vec<&str> = joined.schema_ref().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>();
    assert_eq!(
        names,
        [
            "driver_id",
            "customer_id",
            "event_timestamp",
            "accepted",
            "driver_hourly__conv_rate",
            "driver_hourly__acc_rate",
            "driver_hourly__avg_daily_trips",
            "customer_profile__lifetime_value",
            "customer_profile__embedding",
            "driver_customer__rides_together",
            "customer_rides__rides_7d",
            "customer_rides__fare_sum_1h",
        ]
    );
    // A count is never null: 0 for a window without events.
    let rides = joined.column(10).as_primitive::<arrow::datatypes::Int64Type>();
    assert_eq!(rides.null_count(), 0);
    assert!(rides.values().iter().any(|&n| n > 0) && rides.values().contains(&0), "{rides:?}");
    for i in 0..4 {
        assert_eq!(joined.column(i).as_ref(), spine.column(i).as_ref(), "spine column {i} changed");
    }
    // Hourly data with a 2h TTL covers nearly every spine row; the profile (unbounded
    // TTL, daily snapshots) covers those after its first snapshot.
    let acc = joined.column(5).as_primitive::<arrow::datatypes::Float64Type>();
    assert!(acc.null_count() < 25, "{} nulls", acc.null_count());
    assert!(joined.column(8).as_list::<i32>().null_count() < 500);

    // --features picks columns in the order given; a second run overwrites atomically.
    ok(
        &repo,
        &[
            "historical",
            "--spine",
            "sample_data/spine.parquet",
            "--features",
            "customer_profile:city,driver_hourly:conv_rate",
            "--out",
            "train.parquet",
            "--engine",
            "cpu",
        ],
    );
    let joined = read_parquet(&repo.join("train.parquet"));
    let names: Vec<&str> = joined.schema_ref().fields().iter().skip(4).map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["customer_profile__city", "driver_hourly__conv_rate"]);
}

#[test]
fn doctor_reports_and_compiles_the_kernels() {
    let (_tmp, repo) = demo_repo();
    ok(&repo, &["apply"]);
    let out = ok(&repo, &["doctor"]);
    for part in ["ok   config: project `demo`", "ok   registry: version 1, 4 feature views", "ok   online store: embedded"] {
        assert!(out.contains(part), "{out}");
    }
    // The demo's broker address has nothing listening: reported, not a failure.
    assert!(out.contains("kafka"), "{out}");
    // SAFETY: only tries to dlopen the library.
    let nvrtc = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    let run = quiver_in(&repo, &["doctor", "--compile-kernels"], &[]);
    if nvrtc {
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        for name in ["asof_search", "gather_u64", "gather_u32"] {
            assert!(run.stdout.contains(&format!("ok   kernel: {name} compiled")), "{}", run.stdout);
        }
        assert!(run.stdout.contains("ok   ptx: ") && run.stdout.contains(" bytes for compute_"), "{}", run.stdout);
    } else {
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        assert!(run.stdout.contains("FAIL kernels: cuda engine: NVRTC (libnvrtc.so) not found"), "{}", run.stdout);
        eprintln!("doctor --compile-kernels checked without NVRTC only (no libnvrtc on LD_LIBRARY_PATH)");
    }
    // Outside a repository: the config check fails, exit 1.
    let tmp = tempfile::tempdir().unwrap();
    let run = quiver_in(tmp.path(), &["doctor"], &[]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("FAIL config"), "{}", run.stdout);
}

/// `--engine`: `auto` says which engine ran and why; `gpu` without a usable GPU is a
/// clear error (never a panic); with one, it gives the CPU engine's exact output.
#[test]
fn engines_fall_back_or_fail_clearly() {
    let (_tmp, repo) = demo_repo();
    ok(&repo, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        ok(&repo, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    let args = |engine: &str, out: &str| {
        vec!["historical", "--spine", "sample_data/spine.parquet", "--service", "ranker_v1", "--out", out, "--engine", engine]
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<String>>()
    };
    let run = |a: Vec<String>| quiver_in(&repo, &a.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let cpu = run(args("cpu", "cpu.parquet"));
    assert_eq!(cpu.code, 0, "{}", cpu.stderr);
    assert!(cpu.stdout.contains("engine: cpu (asked for)"), "{}", cpu.stdout);
    let auto = run(args("auto", "auto.parquet"));
    assert_eq!(auto.code, 0, "{}", auto.stderr);
    let probe = quiver::gpu_join::cuda::probe();
    if probe.devices.is_empty() {
        assert!(auto.stdout.contains("engine: cpu (auto: no GPU: "), "{}", auto.stdout);
        let gpu = run(args("gpu", "gpu.parquet"));
        assert_eq!(gpu.code, 1, "{}{}", gpu.stdout, gpu.stderr);
        assert!(gpu.stderr.starts_with("error: --engine gpu: cuda engine: "), "{}", gpu.stderr);
        assert_eq!(gpu.stderr.trim_end().lines().count(), 1, "{}", gpu.stderr);
        assert!(!repo.join("gpu.parquet").exists());
        eprintln!("GPU part of engines_fall_back_or_fail_clearly skipped: no CUDA device ({:?})", probe.driver_error);
    } else {
        // The demo spine is small: auto stays on the CPU and says why.
        assert!(auto.stdout.contains("spine rows, fewer than"), "{}", auto.stdout);
        let gpu = run(args("gpu", "gpu.parquet"));
        assert_eq!(gpu.code, 0, "{}", gpu.stderr);
        assert!(gpu.stdout.contains("engine: cuda on "), "{}", gpu.stdout);
        assert_eq!(std::fs::read(repo.join("gpu.parquet")).unwrap(), std::fs::read(repo.join("cpu.parquet")).unwrap());
    }
    assert_eq!(std::fs::read(repo.join("auto.parquet")).unwrap(), std::fs::read(repo.join("cpu.parquet")).unwrap());
}

const GOLDEN_FEATURES: &str = r#"
entities:
  - {name: user, join_keys: [{name: user_id, dtype: int64}]}
feature_views:
  - name: score
    entities: [user]
    ttl: 1h
    source: {created_timestamp_field: created_timestamp}
    features: [{name: score, dtype: float64}]
"#;

fn golden_repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "golden"]);
    let repo = tmp.path().join("golden");
    std::fs::write(repo.join("features.yaml"), GOLDEN_FEATURES).unwrap();
    ok(&repo, &["apply"]);
    std::fs::write(
        repo.join("scores.csv"),
        "user_id,event_timestamp,created_timestamp,score\n\
         1,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,1.0\n\
         1,2024-01-01T10:00:00Z,2024-01-01T10:05:00Z,2.0\n\
         1,2024-01-01T11:00:00Z,2024-01-01T11:30:00Z,3.0\n\
         2,2024-01-01T09:00:00+01:00,2024-01-01T09:00:00+01:00,\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("spine.csv"),
        "user_id,event_timestamp,label\n\
         1,2024-01-01T09:59:59Z,a\n\
         1,2024-01-01T10:00:00Z,b\n\
         1,2024-01-01T11:00:00Z,c\n\
         1,2024-01-01T12:00:00Z,d\n\
         1,2024-01-01T12:00:01Z,e\n\
         2,2024-01-01T09:30:00Z,f\n\
         3,2024-01-01T10:00:00Z,g\n",
    )
    .unwrap();
    (tmp, repo)
}

fn scores(repo: &Path, extra: &[&str]) -> Vec<Option<f64>> {
    use arrow::array::{Array, AsArray};
    let mut args = vec!["historical", "--spine", "spine.csv", "--features", "score:score", "--out", "out.parquet"];
    args.extend_from_slice(extra);
    ok(repo, &args);
    let out = read_parquet(&repo.join("out.parquet"));
    let labels: Vec<&str> = (0..out.num_rows()).map(|i| out.column(2).as_string::<i32>().value(i)).collect();
    assert_eq!(labels, ["a", "b", "c", "d", "e", "f", "g"], "spine order and columns kept");
    // A CSV spine's times come out as times (UTC microseconds), not as its text.
    let times = out.column(1).as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
    assert_eq!(times.value(0), 1_704_103_199_000_000, "2024-01-01T09:59:59Z");
    assert!(
        matches!(out.schema().field(1).data_type(), arrow::datatypes::DataType::Timestamp(_, Some(tz)) if tz.as_ref() == "UTC"),
        "{}",
        out.schema().field(1)
    );
    let s = out.column(3).as_primitive::<arrow::datatypes::Float64Type>();
    (0..s.len()).map(|i| s.is_valid(i).then(|| s.value(i))).collect()
}

#[test]
fn golden_point_in_time_cases() {
    let (_tmp, repo) = golden_repo();
    ok(&repo, &["ingest", "score", "scores.csv"]);
    // a: before any row; b: tie on event time -> later created; c: exactly at the event;
    // d: exactly t - ttl (inclusive); e: 1 s outside the TTL; f: user 2's only row is at
    // 09:00+01:00 = 08:00Z, 90 minutes before, outside the TTL; g: an unknown user.
    assert_eq!(scores(&repo, &[]), [None, Some(2.0), Some(3.0), Some(3.0), None, None, None]);
    // The cutoff drops rows created after the spine time: b sees only the 10:00 row
    // created at 10:00; c cannot see the 11:00 row (created 11:30) and falls back to 2.0.
    assert_eq!(scores(&repo, &["--created-cutoff"]), [None, Some(1.0), Some(2.0), Some(3.0), None, None, None]);
    // A full tie on (event, created) goes to the row ingested last.
    std::fs::write(
        repo.join("more.csv"),
        "user_id,event_timestamp,created_timestamp,score\n1,2024-01-01T11:00:00Z,2024-01-01T11:30:00Z,4.0\n",
    )
    .unwrap();
    ok(&repo, &["ingest", "score", "more.csv"]);
    assert_eq!(scores(&repo, &[]), [None, Some(2.0), Some(4.0), Some(4.0), None, None, None]);
}

/// Ingest is idempotent by content: the same file again (a retry after a timeout, or
/// a copy under another name) appends nothing and says which version holds it;
/// `--allow-duplicate` appends it again on purpose.
#[test]
fn ingesting_the_same_content_twice_appends_it_once() {
    let (_tmp, repo) = golden_repo();
    let table = repo.join("data/score");
    let first = ok(&repo, &["ingest", "score", "scores.csv"]);
    assert!(first.contains("ingested 4 rows into score (table version 1)"), "{first}");
    let commits = delta_commits(&table);
    let again = ok(&repo, &["ingest", "score", "scores.csv"]);
    assert!(
        again.contains("scores.csv: already ingested into score (table version 1 holds the same content): nothing appended"),
        "{again}"
    );
    assert_eq!(delta_commits(&table), commits, "a duplicate appended a commit");
    std::fs::copy(repo.join("scores.csv"), repo.join("copy.csv")).unwrap();
    assert!(ok(&repo, &["ingest", "score", "copy.csv"]).contains("already ingested"), "the same bytes under another name");
    // The rows count once: the golden answers are unchanged.
    assert_eq!(scores(&repo, &[]), [None, Some(2.0), Some(3.0), Some(3.0), None, None, None]);
    let forced = ok(&repo, &["ingest", "score", "scores.csv", "--allow-duplicate"]);
    assert!(forced.contains("ingested 4 rows into score (table version 2)"), "{forced}");
    assert_eq!(delta_commits(&table), commits + 1);
    assert!(ok(&repo, &["ingest", "score", "scores.csv"]).contains("table version 2 holds the same content"));
    // Other content appends as always.
    std::fs::write(
        repo.join("more.csv"),
        "user_id,event_timestamp,created_timestamp,score\n3,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,9.0\n",
    )
    .unwrap();
    assert!(ok(&repo, &["ingest", "score", "more.csv"]).contains("ingested 1 row into score (table version 3)"));
}

/// One rule for `--created-cutoff`: a view without a created timestamp counts each row as
/// created at its event time. `historical --service` takes a service mixing such a view
/// with one that has created times (the cutoff applies to the latter), as `verify` does.
#[test]
fn the_created_cutoff_counts_rows_without_created_times_as_created_at_their_event_time() {
    use arrow::array::{Array, AsArray};
    let (_tmp, repo) = golden_repo();
    let yaml = format!(
        "{GOLDEN_FEATURES}  - name: level\n    entities: [user]\n    source: {{timestamp_field: event_timestamp}}\n    features: [{{name: level, dtype: int64}}]\nfeature_services:\n  - {{name: both, features: [\"score:score\", \"level:level\"]}}\n"
    );
    std::fs::write(repo.join("features.yaml"), yaml).unwrap();
    ok(&repo, &["apply"]);
    ok(&repo, &["ingest", "score", "scores.csv"]);
    std::fs::write(repo.join("levels.csv"), "user_id,event_timestamp,level\n1,2024-01-01T10:00:00Z,7\n1,2024-01-01T11:00:00Z,8\n").unwrap();
    ok(&repo, &["ingest", "level", "levels.csv"]);
    let run = |extra: &[&str]| {
        let mut args = vec!["historical", "--spine", "spine.csv", "--service", "both", "--out", "both.parquet"];
        args.extend_from_slice(extra);
        ok(&repo, &args);
        let out = read_parquet(&repo.join("both.parquet"));
        let score = out.column(3).as_primitive::<arrow::datatypes::Float64Type>();
        let level = out.column(4).as_primitive::<arrow::datatypes::Int64Type>();
        let scores: Vec<Option<f64>> = (0..out.num_rows()).map(|i| score.is_valid(i).then(|| score.value(i))).collect();
        let levels: Vec<Option<i64>> = (0..out.num_rows()).map(|i| level.is_valid(i).then(|| level.value(i))).collect();
        (scores, levels)
    };
    let (plain_scores, plain_levels) = run(&[]);
    let (cut_scores, cut_levels) = run(&["--created-cutoff"]);
    assert_eq!(plain_levels, [None, Some(7), Some(8), Some(8), Some(8), None, None]);
    assert_eq!(cut_levels, plain_levels, "rows without created times are known at their event time");
    assert_eq!(plain_scores, [None, Some(2.0), Some(3.0), Some(3.0), None, None, None]);
    assert_eq!(cut_scores, [None, Some(1.0), Some(2.0), Some(3.0), None, None, None], "the cutoff still applies to `score`");
}

#[test]
fn a_spine_before_all_data_gets_nulls() {
    use arrow::array::Array;
    let (_tmp, repo) = golden_repo();
    ok(&repo, &["ingest", "score", "scores.csv"]);
    std::fs::write(repo.join("early.csv"), "user_id,event_timestamp\n1,2023-01-01T00:00:00Z\n2,2023-06-01T00:00:00Z\n").unwrap();
    ok(&repo, &["historical", "--spine", "early.csv", "--features", "score:score", "--out", "early.parquet"]);
    let out = read_parquet(&repo.join("early.parquet"));
    assert_eq!(out.num_rows(), 2);
    assert_eq!(out.column(2).null_count(), 2);
}

#[test]
fn a_null_winner_gives_null_not_an_older_value() {
    let (_tmp, repo) = golden_repo();
    std::fs::write(
        repo.join("nulls.csv"),
        "user_id,event_timestamp,created_timestamp,score\n\
         2,2024-01-01T09:00:00Z,2024-01-01T09:00:00Z,5.0\n\
         2,2024-01-01T09:20:00Z,2024-01-01T09:20:00Z,\n",
    )
    .unwrap();
    ok(&repo, &["ingest", "score", "nulls.csv"]);
    assert_eq!(scores(&repo, &[])[5], None, "row f: the 09:20 row wins and is null");
}

#[test]
fn bad_ingest_input_is_refused_and_leaves_the_table_unchanged() {
    let (_tmp, repo) = golden_repo();
    ok(&repo, &["ingest", "score", "scores.csv"]);
    let table = repo.join("data/score");
    let commits = delta_commits(&table);
    let cases: [(&str, &str, &[&str]); 9] = [
        (
            "nofeature.jsonl",
            "{\"user_id\": 1, \"event_timestamp\": \"2024-01-01T10:00:00Z\", \"created_timestamp\": \"2024-01-01T10:00:00Z\", \"scor\": 1.0}\n",
            &["nofeature.jsonl", "missing column `score`"],
        ),
        (
            "naive.csv",
            "user_id,event_timestamp,created_timestamp,score\n1,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,1\n1,2024-01-01 10:00:00,2024-01-01T10:00:00Z,1\n",
            &["naive.csv", "row 2", "column `event_timestamp`", "has no time zone"],
        ),
        (
            "nokey.csv",
            "user_id,event_timestamp,created_timestamp,score\n,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,1\n",
            &["nokey.csv", "row 1", "column `user_id` is empty"],
        ),
        (
            "nocreated.csv",
            "user_id,event_timestamp,score\n1,2024-01-01T10:00:00Z,1\n",
            &["nocreated.csv", "missing column `created_timestamp`"],
        ),
        (
            "badnum.csv",
            "user_id,event_timestamp,created_timestamp,score\n1,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,high\n",
            &["badnum.csv", "high"],
        ),
        (
            "garbage.jsonl",
            "{\"user_id\": 1, \"event_timestamp\": \"yesterday\", \"created_timestamp\": \"2024-01-01T10:00:00Z\", \"score\": 1.0}\n",
            &["garbage.jsonl", "row 1", "`yesterday` is not an RFC 3339 timestamp"],
        ),
        ("data.txt", "x\n", &["data.txt", "unknown file type `.txt`"]),
        // A number that is not of its column's type: file, row, column and type, in
        // Quiver's words (not the CSV parser's).
        (
            "float_key.csv",
            "user_id,event_timestamp,created_timestamp,score\n1,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,1\n30.0,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,1\n",
            &["float_key.csv: row 2: column `user_id`: `30.0` does not parse as int64"],
        ),
        (
            "word.csv",
            "user_id,event_timestamp,created_timestamp,score\n1,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,high\n",
            &["word.csv: row 1: column `score`: `high` does not parse as float64"],
        ),
    ];
    for (name, text, parts) in cases {
        std::fs::write(repo.join(name), text).unwrap();
        fails(&repo, &["ingest", "score", name], 1, parts);
        assert_eq!(delta_commits(&table), commits, "{name} changed the table");
    }
    // Naive timestamps in Parquet, and a feature type that would lose data.
    use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
    use std::sync::Arc;
    let write = |name: &str, cols: Vec<(&str, ArrayRef)>| {
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(File::create(repo.join(name)).unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    let ts = |tz: Option<&str>| {
        let a = TimestampMicrosecondArray::from(vec![1_704_103_200_000_000]);
        Arc::new(match tz {
            Some(z) => a.with_timezone(z),
            None => a,
        }) as ArrayRef
    };
    write(
        "naive.parquet",
        vec![
            ("user_id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("event_timestamp", ts(None)),
            ("created_timestamp", ts(Some("UTC"))),
            ("score", Arc::new(Float64Array::from(vec![1.0]))),
        ],
    );
    fails(
        &repo,
        &["ingest", "score", "naive.parquet"],
        1,
        &["naive.parquet", "column `event_timestamp` has timestamps without a time zone"],
    );
    write(
        "text.parquet",
        vec![
            ("user_id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("event_timestamp", ts(Some("UTC"))),
            ("created_timestamp", ts(Some("UTC"))),
            ("score", Arc::new(StringArray::from(vec!["1.0"]))),
        ],
    );
    fails(&repo, &["ingest", "score", "text.parquet"], 1, &["text.parquet", "column `score`", "cannot be stored as float64"]);
    write(
        "bigint.parquet",
        vec![
            ("user_id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            ("event_timestamp", Arc::new(TimestampMicrosecondArray::from(vec![1, 2]).with_timezone("UTC")) as ArrayRef),
            ("created_timestamp", Arc::new(TimestampMicrosecondArray::from(vec![1, 2]).with_timezone("UTC")) as ArrayRef),
            ("score", Arc::new(Int64Array::from(vec![3, (1 << 53) + 1]))),
        ],
    );
    fails(
        &repo,
        &["ingest", "score", "bigint.parquet"],
        1,
        &["bigint.parquet", "column `score`", "row 2", "does not fit a float64 exactly"],
    );
    assert_eq!(delta_commits(&table), commits);
    // A failed ingest into a view whose table is missing creates no table either.
    std::fs::remove_dir_all(&table).unwrap();
    fails(&repo, &["ingest", "score", "naive.csv"], 1, &["has no time zone"]);
    assert!(!table.exists(), "a failed ingest created the table");
    fails(&repo, &["ingest", "nope", "scores.csv"], 1, &["unknown feature view `nope`", "known: score"]);
}

#[test]
fn bad_historical_requests_are_refused_and_write_nothing() {
    let (_tmp, repo) = golden_repo();
    ok(&repo, &["ingest", "score", "scores.csv"]);
    std::fs::write(repo.join("nokeys.csv"), "uid,event_timestamp\n1,2024-01-01T10:00:00Z\n").unwrap();
    std::fs::write(repo.join("naive.csv"), "user_id,event_timestamp\n1,2024-01-01T10:00:00\n").unwrap();
    // Issue 53: a key that does not parse is named by its row and column, as ingest names it.
    std::fs::write(repo.join("badkey.csv"), "user_id,event_timestamp\n1,2024-01-01T10:00:00Z\nx7,2024-01-01T10:00:00Z\n").unwrap();
    let cases: [(&[&str], &[&str]); 6] = [
        (&["--spine", "badkey.csv", "--features", "score:score"], &["badkey.csv", "row 2: column `user_id`: `x7` does not parse as int64"]),
        (
            &["--spine", "nokeys.csv", "--features", "score:score"],
            &["nokeys.csv", "missing join key column `user_id` needed by feature view `score`"],
        ),
        (&["--spine", "naive.csv", "--features", "score:score"], &["naive.csv", "row 1", "has no time zone"]),
        (&["--spine", "spine.csv", "--features", "score:rank"], &["unknown feature `score:rank`", "has: score"]),
        (&["--spine", "spine.csv", "--features", "scores:score"], &["unknown feature view `scores`"]),
        (&["--spine", "spine.csv", "--service", "ranker"], &["unknown feature service `ranker`"]),
    ];
    for (args, parts) in cases {
        let mut all = vec!["historical", "--out", "out.parquet"];
        all.extend_from_slice(args);
        fails(&repo, &all, 1, parts);
        assert!(!repo.join("out.parquet").exists(), "{args:?} wrote output");
    }
}

#[test]
fn materialize_then_online_lookup_from_the_shell() {
    let (_tmp, repo) = demo_repo();
    ok(&repo, &["apply"]);
    for view in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        ok(&repo, &["ingest", view, &format!("sample_data/{view}.parquet")]);
    }
    let out = ok(&repo, &["materialize", "2000-01-01T00:00:00Z", "now", "driver_hourly", "customer_profile"]);
    assert!(out.contains("driver_hourly: 10 entities, 10 written"), "{out}");
    assert!(out.contains("customer_profile: 20 entities, 20 written"), "{out}");
    let out = ok(
        &repo,
        &[
            "online",
            "--features",
            "driver_hourly:avg_daily_trips,customer_profile:city,driver_customer:avg_rating",
            "--entity",
            "driver_id=1001",
            "--entity",
            "customer_id=C001",
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("driver_hourly__avg_daily_trips") && lines[0].contains("PRESENT"), "{out}");
    assert!(lines[1].starts_with("customer_profile__city") && lines[1].contains("PRESENT"), "{out}");
    // driver_customer was not materialized.
    assert!(lines[2].starts_with("driver_customer__avg_rating") && lines[2].contains("null") && lines[2].contains("NOT_FOUND"), "{out}");

    fails(&repo, &["materialize", "yesterday", "now"], 1, &["START `yesterday`", "RFC 3339"]);
    fails(&repo, &["materialize", "2024-01-02T00:00:00Z", "2024-01-01T00:00:00Z"], 1, &["START is after END"]);
    fails(&repo, &["materialize", "2024-01-01T00:00:00Z", "now", "nope"], 1, &["unknown feature view `nope`"]);
    fails(
        &repo,
        &["online", "--features", "driver_hourly:speed", "--entity", "driver_id=1001"],
        1,
        &["unknown feature `driver_hourly:speed`"],
    );
    fails(
        &repo,
        &["online", "--features", "driver_hourly:acc_rate", "--entity", "driver_id=abc"],
        1,
        &["`driver_id` is int64, `abc` is not an integer"],
    );
    fails(
        &repo,
        &["online", "--features", "driver_customer:avg_rating", "--entity", "driver_id=1001"],
        1,
        &["missing join key `customer_id` for feature view `driver_customer`"],
    );
    fails(&repo, &["online", "--features", "driver_hourly:acc_rate", "--entity", "rider=1"], 1, &["`rider` is not a join key"]);
}

#[test]
fn serve_answers_over_http_and_stops_gracefully() {
    let (_tmp, repo) = demo_repo();
    ok(&repo, &["apply"]);
    ok(&repo, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    ok(&repo, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let (child, port) = common::spawn_serve(&repo);
    let (status, body) = common::http(
        port,
        "POST",
        "/get-online-features",
        r#"{"entities": {"driver_id": [1001, 999]}, "features": ["driver_hourly:conv_rate"], "full_feature_names": true}"#,
    );
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["metadata"]["feature_names"], serde_json::json!(["driver_id", "driver_hourly__conv_rate"]));
    assert_eq!(answer["results"][1]["statuses"], serde_json::json!(["PRESENT", "NOT_FOUND"]));
    assert!(answer["results"][1]["values"][0].is_f64());
    let (status, _) = common::http(port, "POST", "/get-online-features", "{}");
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
    // SIGTERM: the server finishes and exits cleanly.
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped"));
}

/// The offline-only view the lookup cases ask for (`tests/it/lookup_cases.json`).
const AUDIT_VIEW: &str = "  - name: audit\n    entities: [driver]\n    online: false\n    source: {timestamp_field: event_timestamp}\n    features: [{name: note, dtype: string}]\n\n";

/// The on-demand view the lookup cases ask for.
const SCORING_VIEW: &str = "on_demand_views:\n  - name: scoring\n    inputs: [driver_hourly]\n    request: [{name: amount, dtype: float64}, {name: city, dtype: string}]\n    features:\n      - {name: conv_x_acc, dtype: float64, expr: 'driver_hourly.conv_rate * driver_hourly.acc_rate'}\n      - {name: per_trip, dtype: int64, expr: 'CAST(amount AS BIGINT) / driver_hourly.avg_daily_trips'}\n      - {name: shout, dtype: string, expr: 'upper(city)'}\n";

/// One table of lookups (`tests/it/lookup_cases.json`) through `quiver online` and the
/// server: the same requests answered (with the same statuses), the others refused with
/// the same message — exit 1, and the status of the error's kind. Python drives the
/// same table (`python/tests/test_sdk.py`).
#[test]
fn one_table_of_lookups_is_answered_alike_by_the_cli_and_the_server() {
    let table: serde_json::Value = serde_json::from_str(include_str!("lookup_cases.json")).unwrap();
    let cases = table["cases"].as_array().unwrap();
    let (_tmp, repo) = demo_repo();
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    let yaml = yaml.replacen("\nfeature_services:", &format!("\n{AUDIT_VIEW}feature_services:"), 1);
    std::fs::write(repo.join("features.yaml"), format!("{yaml}{SCORING_VIEW}")).unwrap();
    let config = std::fs::read_to_string(repo.join("quiver.yaml")).unwrap();
    assert!(config.contains("# max_cells: 1000000"), "{config}");
    std::fs::write(repo.join("quiver.yaml"), config.replacen("# max_cells: 1000000", "max_cells: 8", 1)).unwrap();
    ok(&repo, &["apply"]);
    ok(&repo, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    ok(&repo, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    const STATUSES: [&str; 4] = ["PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"];
    // The CLI first (the server holds the embedded store's file while it runs).
    let mut cli_statuses = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut args: Vec<String> = vec!["online".into()];
        match (case.get("features"), case.get("service")) {
            (Some(f), _) => {
                let refs: Vec<&str> = f.as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
                args.extend(["--features".into(), refs.join(",")]);
            }
            (None, Some(s)) => args.extend(["--service".into(), s.as_str().unwrap().into()]),
            (None, None) => panic!("{name}: features or service"),
        }
        let given = |what: &str| case.get(what).and_then(|v| v.as_object()).cloned().unwrap_or_default();
        for (flag, what) in [("--entity", "entities"), ("--request", "request")] {
            for (key, values) in given(what) {
                let value = match &values[0] {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                args.extend([flag.into(), format!("{key}={value}")]);
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = quiver_in(&repo, &args, &[]);
        match case.get("refused") {
            None => {
                assert_eq!(run.code, 0, "{name}: {}", run.stderr);
                let statuses: Vec<&str> = run
                    .stdout
                    .lines()
                    .map(|l| *l.split_whitespace().filter(|w| STATUSES.contains(w)).collect::<Vec<_>>().last().unwrap())
                    .collect();
                cli_statuses.push(statuses.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            }
            Some(refused) => {
                let message = refused["message"].as_str().unwrap();
                assert_eq!(run.code, 1, "{name}: {}{}", run.stdout, run.stderr);
                assert!(run.stderr.starts_with("error: ") && run.stderr.contains(message), "{name}: {:?} lacks {message:?}", run.stderr);
                cli_statuses.push(Vec::new());
            }
        }
    }
    let (mut child, port) = common::spawn_serve(&repo);
    for (case, cli) in cases.iter().zip(&cli_statuses) {
        let name = case["name"].as_str().unwrap();
        // Request fields go beside the join keys (Feast's convention).
        let mut entities = case["entities"].clone();
        for (name, values) in case.get("request").and_then(|v| v.as_object()).cloned().unwrap_or_default() {
            entities[name] = values;
        }
        let mut body = serde_json::json!({"entities": entities, "full_feature_names": true});
        match (case.get("features"), case.get("service")) {
            (Some(f), _) => body["features"] = f.clone(),
            (_, service) => body["feature_service"] = service.unwrap().clone(),
        }
        let (code, text) = common::request(port, "POST", "/get-online-features", &[], &body.to_string());
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{name}: {text}"));
        match case.get("refused") {
            None => {
                assert_eq!(code, 200, "{name}: {text}");
                let keys = case["entities"].as_object().unwrap().len();
                let statuses: Vec<String> =
                    answer["results"].as_array().unwrap()[keys..].iter().map(|r| r["statuses"][0].as_str().unwrap().to_string()).collect();
                assert_eq!(&statuses, cli, "{name}: the server and the CLI answer alike");
            }
            Some(refused) => {
                assert_eq!(u64::from(code), refused["http"].as_u64().unwrap(), "{name}: {text}");
                let message = refused["message"].as_str().unwrap();
                assert!(answer["error"].as_str().unwrap().contains(message), "{name}: {text} lacks {message:?}");
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The exit code comes from the error's kind: 1 for a refused request, 2 for usage, 3
/// for a store that cannot be reached (a scheduler may retry that one).
#[test]
fn the_exit_code_says_whether_a_retry_can_help() {
    let (_tmp, repo) = demo_repo();
    ok(&repo, &["apply"]);
    let lookup = ["online", "--features", "driver_hourly:conv_rate", "--entity", "driver_id=1001"];
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("redis://127.0.0.1:{closed}/0");
    let down = [("QUIVER_ONLINE_STORE_TYPE", "redis"), ("QUIVER_ONLINE_STORE_URL", url.as_str())];
    let run = quiver_in(&repo, &lookup, &down);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.starts_with("error: ") && run.stderr.contains(&format!("127.0.0.1:{closed}")), "{}", run.stderr);
    let run = quiver_in(&repo, &["online", "--features", "driver_hourly:speed", "--entity", "driver_id=1001"], &down);
    assert_eq!(run.code, 1, "an unknown feature is refused before the store is asked: {}", run.stderr);
    assert_eq!(quiver_in(&repo, &["online", "--bogus"], &[]).code, 2);
}
