//! Versions of definitions end to end (docs/versions.md), over real Redis and Delta: a
//! service trained on version 1, a breaking change making version 2, both served side
//! by side with their own values, the service still answering version 1's values
//! unchanged, the training set exported before the change reproduced byte for byte
//! after it, version 2 backfilled from version 1's rows, the service moved, and version
//! 1 retired.

use std::path::Path;

use crate::common::{self, fails, ok, unique};

/// `quiver online`'s answer for driver 1001 (and customer C001 for the service) of
/// `--service NAME` or `--features LIST`.
fn online(dir: &Path, how: &[&str]) -> String {
    let mut args = vec!["online"];
    args.extend_from_slice(how);
    args.extend_from_slice(&["--entity", "driver_id=1001"]);
    if how[0] == "--service" {
        args.extend_from_slice(&["--entity", "customer_id=C001"]);
    }
    ok(dir, &args)
}

/// The online store's keys under `prefix`, counted in Redis itself.
fn redis_keys(url: &str, prefix: &str) -> usize {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut conn).unwrap();
    keys.len()
}

#[test]
fn a_breaking_change_is_served_beside_the_version_a_service_was_trained_on() {
    let Some(url) = common::redis_url("a_breaking_change_is_served_beside_the_version_a_service_was_trained_on") else { return };
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "demo", "--demo"]);
    let dir = tmp.path().join("demo");
    let project = unique("versions");
    let config = std::fs::read_to_string(dir.join("quiver.yaml")).unwrap();
    let config = config.replacen("project: demo", &format!("project: {project}"), 1).replacen(
        "type: embedded",
        &format!("type: redis\n  url: \"{url}\""),
        1,
    );
    std::fs::write(dir.join("quiver.yaml"), config).unwrap();
    ok(&dir, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        ok(&dir, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    ok(&dir, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "train_v1"]);
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let trained = online(&dir, &["--service", "ranker_v1"]);
    assert!(trained.contains("driver_hourly__avg_daily_trips") || trained.contains("avg_daily_trips"), "{trained}");
    let v1_keys = redis_keys(&url, &format!("quiver:{project}:driver_hourly:"));
    assert!(v1_keys > 0);

    // The breaking change: version 2 beside version 1, with its own empty table.
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    let changed = yaml.replacen("{name: avg_daily_trips, dtype: int64}", "{name: avg_daily_trips, dtype: float64}", 1);
    assert_ne!(changed, yaml);
    std::fs::write(dir.join("features.yaml"), &changed).unwrap();
    let out = ok(&dir, &["apply"]);
    assert!(out.contains("^ feature_view driver_hourly: version 2 beside version 1"), "{out}");
    assert!(out.contains("stays on version 1: feature_service ranker_v1"), "{out}");

    // Version 2 gets its own rows, through its own keys.
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    std::fs::write(
        dir.join("v2.jsonl"),
        format!(
            "{{\"driver_id\": 1001, \"event_timestamp\": \"{now}\", \"created_timestamp\": \"{now}\", \"conv_rate\": 0.25, \"acc_rate\": 0.75, \"avg_daily_trips\": 20.5}}\n"
        ),
    )
    .unwrap();
    ok(&dir, &["push", "driver_hourly@2", "v2.jsonl"]);
    assert_eq!(redis_keys(&url, &format!("quiver:{project}:driver_hourly@2:")), 1);
    // Version 1's rows backfilled into version 2 (the pushed row is not version 1's).
    let out = ok(&dir, &["backfill", "driver_hourly@2"]);
    assert!(out.contains("from driver_hourly@1: read 736 rows; wrote 736 rows"), "{out}");
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    assert_eq!(redis_keys(&url, &format!("quiver:{project}:driver_hourly@2:")), v1_keys, "every driver, in version 2's keys");
    // The service answers what it answered before, byte for byte; version 2 its own.
    assert_eq!(online(&dir, &["--service", "ranker_v1"]), trained, "the pinned service's answer changed");
    let latest = online(&dir, &["--features", "driver_hourly:avg_daily_trips,driver_hourly:conv_rate"]);
    assert!(latest.contains("20.5") && latest.contains("0.25"), "{latest}");
    let pinned = online(&dir, &["--features", "driver_hourly@1:avg_daily_trips"]);
    assert!(!pinned.contains("20.5"), "{pinned}");
    fails(
        &dir,
        &["online", "--features", "driver_hourly@1:conv_rate,driver_hourly:acc_rate", "--entity", "driver_id=1001"],
        &["view `driver_hourly` is asked at version", "`driver_hourly@1:conv_rate`", "`driver_hourly:acc_rate`"],
    );

    // The training set exported before the change reproduces byte for byte.
    let out = ok(&dir, &["export", "--reproduce", "train_v1/manifest.json", "--out", "train_again"]);
    assert!(out.contains("every shard identical to the manifest"), "{out}");

    // `versions` lists both; version 1 cannot be retired while the service reads it.
    let listed = ok(&dir, &["versions", "driver_hourly", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["version"], 1);
    assert_eq!(listed[0]["read_by"], serde_json::json!(["feature_service ranker_v1"]));
    assert_eq!(listed[0]["keys_online"], v1_keys);
    assert_eq!(listed[1]["keys_online"], v1_keys);
    assert_eq!(listed[1]["rows_offline"], 737);
    assert_eq!(listed[1]["changes"], serde_json::json!(["features[avg_daily_trips].dtype: \"int64\" -> \"float64\""]));
    let before = std::fs::read(dir.join("registry.json")).unwrap();
    fails(&dir, &["retire", "driver_hourly@1"], &["cannot retire `driver_hourly@1`: read by feature_service ranker_v1"]);
    fails(&dir, &["retire", "driver_hourly@2"], &["it is the latest while older ones live"]);
    fails(&dir, &["retire", "driver_hourly@3"], &["view `driver_hourly` has no version 3", "live: 1, 2"]);
    fails(&dir, &["retire", "driver_hourly"], &["name a version"]);
    assert_eq!(std::fs::read(dir.join("registry.json")).unwrap(), before, "a refused retire writes nothing");
    assert_eq!(redis_keys(&url, &format!("quiver:{project}:driver_hourly:")), v1_keys);

    // Moving the service is one explicit change; then version 1 retires.
    let moved = changed.replace("      - driver_hourly:", "      - driver_hourly@2:");
    std::fs::write(dir.join("features.yaml"), &moved).unwrap();
    let plan = ok(&dir, &["plan"]);
    assert!(plan.contains("~ feature_service ranker_v1"), "{plan}");
    ok(&dir, &["apply"]);
    let served = online(&dir, &["--service", "ranker_v1"]);
    assert!(served.contains("20.5"), "{served}");
    // A reproduction reads what the training set read, not what its service reads now.
    let out = ok(&dir, &["export", "--reproduce", "train_v1/manifest.json", "--out", "train_again2"]);
    assert!(out.contains("every shard identical to the manifest"), "{out}");
    let out = ok(&dir, &["retire", "driver_hourly@1"]);
    assert!(out.contains(&format!("retired driver_hourly@1: {v1_keys} keys online removed")), "{out}");
    assert_eq!(redis_keys(&url, &format!("quiver:{project}:driver_hourly:")), 0);
    assert_eq!(redis_keys(&url, &format!("quiver:{project}:driver_hourly@2:")), v1_keys, "version 2's keys stay");
    assert!(dir.join("data/driver_hourly/_delta_log").is_dir(), "the table stays without --delete-data");
    fails(
        &dir,
        &["online", "--features", "driver_hourly@1:conv_rate", "--entity", "driver_id=1001"],
        &["view `driver_hourly` has no version 1", "live: 2"],
    );
    fails(
        &dir,
        &["export", "--reproduce", "train_v1/manifest.json", "--out", "train_again3"],
        &["view `driver_hourly` has no version 1 (it never had one, or it was retired; live: 2)"],
    );
    assert!(!dir.join("train_again3").exists(), "a refused reproduction writes nothing");
}

/// `(driver_id, event time in UTC microseconds, a float64 column, an int64 or float64
/// column as float64)` of every row of the Parquet `files`, sorted.
type Row = (i64, i64, Option<u64>, Option<u64>);

fn rows_of(files: &[std::path::PathBuf], float: &str, scale: f64, number: &str) -> Vec<Row> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit};
    let mut out = Vec::new();
    for file in files {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(file).unwrap())
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let cast = |name: &str, to: &DataType| arrow::compute::cast(batch.column_by_name(name).unwrap(), to).unwrap();
            let ids = cast("driver_id", &DataType::Int64);
            let times = cast("event_timestamp", &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())));
            let times = arrow::compute::cast(&times, &DataType::Int64).unwrap();
            let (floats, numbers) = (cast(float, &DataType::Float64), cast(number, &DataType::Float64));
            let (floats, numbers) = (floats.as_primitive::<Float64Type>(), numbers.as_primitive::<Float64Type>());
            for i in 0..batch.num_rows() {
                let at = |a: &arrow::array::Float64Array| (!a.is_null(i)).then(|| a.value(i));
                out.push((
                    ids.as_primitive::<Int64Type>().value(i),
                    times.as_primitive::<Int64Type>().value(i),
                    at(floats).map(|v| (v * scale).to_bits()),
                    at(numbers).map(f64::to_bits),
                ));
            }
        }
    }
    out.sort_unstable();
    out
}

/// The Parquet files of the Delta table in `dir` (a table written by appends only: every
/// file is live).
fn table_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "parquet")).collect()
}

/// The commits in a Delta table's log.
fn commits(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("_delta_log"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "json"))
        .count()
}

#[test]
fn backfill_derives_a_version_from_the_stored_rows_or_refuses_naming_the_column() {
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "demo", "--demo"]);
    let dir = tmp.path().join("demo");
    ok(&dir, &["apply"]);
    ok(&dir, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    let trained = ["--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "trained"];
    ok(&dir, &[&["export"][..], &trained[..]].concat());
    // Version 2: a stored feature made a write-time expression of the column version 1
    // stored, with a filter over it; a type widened; a feature dropped.
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    let v2 = yaml.replacen(
        "      created_timestamp_field: created_timestamp\n    features:\n      - {name: conv_rate, dtype: float64}\n      - {name: acc_rate, dtype: float64}\n      - {name: avg_daily_trips, dtype: int64}",
        "      created_timestamp_field: created_timestamp\n      raw: [{name: conv_rate, dtype: float64}]\n      filter: \"conv_rate > 0.5\"\n    features:\n      - {name: conv_pct, dtype: float64, expr: \"conv_rate * 100\"}\n      - {name: avg_daily_trips, dtype: float64}",
        1,
    );
    assert_ne!(v2, yaml);
    std::fs::write(dir.join("features.yaml"), &v2).unwrap();
    // The service reading the removed features stays on version 1 without a change to it.
    let out = ok(&dir, &["apply"]);
    assert!(out.contains("version 2 beside version 1") && out.contains("stays on version 1: feature_service ranker_v1"), "{out}");

    // The oracle: the sample's rows as version 2 defines them, computed here.
    let sample = rows_of(&[dir.join("sample_data/driver_hourly.parquet")], "conv_rate", 1.0, "avg_daily_trips");
    let kept: Vec<Row> = sample
        .iter()
        .filter(|r| r.2.is_some_and(|c| f64::from_bits(c) > 0.5))
        .map(|r| (r.0, r.1, r.2.map(|c| (f64::from_bits(c) * 100.0).to_bits()), r.3))
        .collect();
    assert!(!kept.is_empty() && kept.len() < sample.len(), "the filter keeps some rows and drops some");
    let table = dir.join("data/driver_hourly.v2");
    let out = ok(&dir, &["backfill", "driver_hourly@2"]);
    assert!(
        out.contains(&format!("backfilled driver_hourly@2 from driver_hourly@1: read {} rows; wrote {} rows", sample.len(), kept.len())),
        "{out}"
    );
    assert!(out.contains(&format!("{} rows dropped by the source filter", sample.len() - kept.len())), "{out}");
    assert_eq!(rows_of(&table_files(&table), "conv_pct", 1.0, "avg_daily_trips"), kept);
    // One commit after the table's creation; run again, nothing is written.
    assert_eq!(commits(&table), 2);
    let out = ok(&dir, &["backfill", "driver_hourly@2"]);
    assert!(out.contains(&format!("{} rows already there; nothing to write", kept.len())), "{out}");
    assert_eq!(commits(&table), 2, "a second backfill commits nothing");

    // Version 3 narrows the type back: not derivable from version 2, which is refused
    // naming the column and writes nothing; version 1 stores it as version 3 reads it.
    let v3 = v2.replacen("{name: avg_daily_trips, dtype: float64}", "{name: avg_daily_trips, dtype: int64}", 1);
    std::fs::write(dir.join("features.yaml"), &v3).unwrap();
    ok(&dir, &["apply"]);
    fails(
        &dir,
        &["backfill", "driver_hourly@3"],
        &[
            "cannot backfill driver_hourly@3 from driver_hourly@2: driver_hourly@3 reads `avg_daily_trips` as int64, and driver_hourly@2 stores it as float64, which cannot be converted without loss",
        ],
    );
    assert_eq!(commits(&dir.join("data/driver_hourly.v3")), 1, "a refused backfill writes nothing");
    let out = ok(&dir, &["backfill", "driver_hourly@3", "--from", "1"]);
    assert!(out.contains(&format!("wrote {} rows", kept.len())), "{out}");
    fails(&dir, &["backfill", "driver_hourly@1"], &["driver_hourly@1 is the first live version of `driver_hourly`"]);
    fails(&dir, &["backfill", "driver_hourly@3", "--from", "3"], &["the version read must be earlier than the one filled"]);
    fails(&dir, &["backfill", "driver_hourly@9"], &["view `driver_hourly` has no version 9", "live: 1, 2, 3"]);
    // `versions` counts the rows it holds.
    let out = ok(&dir, &["versions", "driver_hourly", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[2]["rows_offline"], kept.len());
    // `verify` samples every live version online against its own table.
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let out = ok(&dir, &["verify", "--sample", "20"]);
    for feature in ["driver_hourly:conv_rate", "driver_hourly@2:conv_pct", "driver_hourly@3:avg_daily_trips"] {
        let line = out.lines().find(|l| l.split_whitespace().next() == Some(feature)).unwrap_or_else(|| panic!("{feature}: {out}"));
        let counts: Vec<u64> = line.split_whitespace().skip(1).map(|n| n.parse().unwrap()).collect();
        assert!(counts[0] > 0 && counts[0] == counts[1], "{line}");
    }
    assert!(out.lines().any(|l| l.starts_with("0 of ")), "{out}");
    // `monitor` says when the two sides read different versions of a view.
    let args = ["monitor", "--features", "driver_hourly:avg_daily_trips", "--reference", "training:trained", "--current"];
    let out = common::quiver(&dir, &[&args[..], &["offline:2000-01-01T00:00:00Z..now"][..]].concat(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("note: driver_hourly:avg_daily_trips compares version 1 of its view (reference) with version 3 (current)"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let args = ["monitor", "--features", "driver_hourly@1:avg_daily_trips", "--reference", "training:trained", "--current"];
    let out = common::quiver(&dir, &[&args[..], &["offline:2000-01-01T00:00:00Z..now"][..]].concat(), &[]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("note: driver_hourly"), "{}", String::from_utf8_lossy(&out.stdout));
}

/// A push naming a version is refused as a push to the view is: online to a version of
/// an offline-only view (naming it), to a version that does not exist (naming the live
/// ones); nothing is written.
#[test]
fn a_push_to_a_version_is_refused_as_to_its_view() {
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "demo", "--demo"]);
    let dir = tmp.path().join("demo");
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    let offline = yaml.replacen("    ttl: 2h\n    online: true\n", "    ttl: 2h\n    online: false\n", 1);
    assert_ne!(offline, yaml);
    std::fs::write(dir.join("features.yaml"), &offline).unwrap();
    ok(&dir, &["apply"]);
    ok(&dir, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    let v2 = offline.replacen("{name: avg_daily_trips, dtype: int64}", "{name: avg_daily_trips, dtype: float64}", 1);
    std::fs::write(dir.join("features.yaml"), v2).unwrap();
    ok(&dir, &["apply"]);
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    std::fs::write(
        dir.join("row.jsonl"),
        format!("{{\"driver_id\": 1001, \"event_timestamp\": \"{now}\", \"created_timestamp\": \"{now}\", \"conv_rate\": 0.5, \"acc_rate\": 0.5, \"avg_daily_trips\": 2.5}}\n"),
    )
    .unwrap();
    fails(&dir, &["push", "driver_hourly@2", "row.jsonl", "--to", "online"], &["feature view `driver_hourly` is offline only"]);
    fails(&dir, &["push", "driver_hourly@3", "row.jsonl"], &["view `driver_hourly` has no version 3", "live: 1, 2"]);
    assert_eq!(commits(&dir.join("data/driver_hourly.v2")), 1, "a refused push writes nothing");
    let out = ok(&dir, &["push", "driver_hourly@2", "row.jsonl"]);
    assert!(out.contains("offline: table version 1"), "{out}");
}
