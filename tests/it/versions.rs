//! Versions of definitions end to end (docs/versions.md), over real Redis and Delta: a
//! service trained on version 1, a breaking change making version 2, both served side
//! by side with their own values, the service still answering version 1's values
//! unchanged, the training set exported before the change reproduced byte for byte
//! after it, the service moved, and version 1 retired.

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
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
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
    assert_eq!(listed[1]["keys_online"], 1);
    assert_eq!(listed[1]["rows_offline"], 1);
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
    assert_eq!(redis_keys(&url, &format!("quiver:{project}:driver_hourly@2:")), 1, "version 2's keys stay");
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
