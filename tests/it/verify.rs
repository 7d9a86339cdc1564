//! `quiver verify --sample N` on the demo repository: everything missing online before
//! materialization, full agreement after it, and a value written straight into the
//! online store (a real inconsistency) reported with its entity and both values.

use std::path::Path;
use std::process::Output;

use crate::common;

use quiver::online::{EmbeddedStore, OnlineStore, WriteRow};
use quiver::runtime::encoding::{KeyValue, OnlineRow, Value, store_key};

fn quiver(dir: &Path, args: &[&str]) -> Output {
    common::quiver(dir, args, &[])
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_what_the_online_store_gets_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(quiver(tmp.path(), &["init", "demo", "--demo"]).status.success());
    let repo = tmp.path().join("demo");
    assert!(quiver(&repo, &["apply"]).status.success());
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        assert!(quiver(&repo, &["ingest", v, &format!("sample_data/{v}.parquet")]).status.success());
    }

    // Nothing materialized yet: every sampled entity is missing online.
    let before = quiver(&repo, &["verify", "--sample", "1000"]);
    let (out, err) = text(&before);
    assert_eq!(before.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("missing online"), "{out}");
    assert!(err.contains("over --max-mismatch 0"), "{err}");

    assert!(quiver(&repo, &["materialize-incremental", "now"]).status.success());
    let agree = quiver(&repo, &["verify", "--sample", "1000"]);
    let (out, err) = text(&agree);
    assert!(agree.status.success(), "{out}{err}");
    assert!(out.contains("0 of ") && out.contains("driver_hourly:conv_rate"), "{out}");

    // A different value straight into the online store, same times (equal replaces).
    {
        let store = EmbeddedStore::open(&repo.join("online.db")).unwrap();
        let key = store_key("demo", "driver_hourly", &[KeyValue::Int(1001)]);
        let got = store.read(std::slice::from_ref(&key)).await.unwrap();
        let mut row = OnlineRow::decode(got[0].as_ref().expect("materialized")).unwrap();
        row.values[0] = Value::Float64(42.0);
        let written = store.write(&[WriteRow { key, row: row.encode(), expire_at_ms: None }]).await.unwrap();
        assert_eq!(written, 1);
    }
    let wrong = quiver(&repo, &["verify", "--sample", "1000"]);
    let (out, err) = text(&wrong);
    assert_eq!(wrong.status.code(), Some(1), "{out}{err}");
    let line = out.lines().find(|l| l.starts_with("driver_hourly:conv_rate")).unwrap();
    let numbers: Vec<u64> = line.split_whitespace().skip(1).map(|n| n.parse().unwrap()).collect();
    assert_eq!(numbers[2], 1, "one mismatch: {line}");
    assert_eq!(numbers[0], numbers[1] + 1, "every other row matches: {line}");
    // Values as the server answers them (JSON), never Rust's debug forms.
    assert!(out.contains("driver_id=1001: online PRESENT 42.0, offline PRESENT 0."), "{out}");
    assert!(!out.contains("Float64(") && !out.contains("String("), "{out}");
    // Other features of the same row still agree.
    let acc = out.lines().find(|l| l.starts_with("driver_hourly:acc_rate")).unwrap();
    assert_eq!(acc.split_whitespace().nth(3), Some("0"), "{acc}");
    // One row in ten is within a 50% allowance.
    let allowed = quiver(&repo, &["verify", "--sample", "1000", "--max-mismatch", "0.5"]);
    assert!(allowed.status.success(), "{:?}", text(&allowed));
}

/// The demo repository in `parent` with the serving log on and `definitions` added to
/// its features: applied, its sample data ingested and materialized.
fn logged_demo(parent: &Path, definitions: &str) -> std::path::PathBuf {
    assert!(quiver(parent, &["init", "demo", "--demo"]).status.success());
    let repo = parent.join("demo");
    let mut config = std::fs::read_to_string(repo.join("quiver.yaml")).unwrap();
    config.push_str("serving_log:\n  enabled: true\n  batch_ms: 100\n");
    std::fs::write(repo.join("quiver.yaml"), config).unwrap();
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    std::fs::write(repo.join("features.yaml"), format!("{yaml}{definitions}")).unwrap();
    assert!(quiver(&repo, &["apply"]).status.success());
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        assert!(quiver(&repo, &["ingest", v, &format!("sample_data/{v}.parquet")]).status.success());
    }
    assert!(quiver(&repo, &["materialize-incremental", "now"]).status.success());
    repo
}

/// `quiver serve` with the serving log on, until `requests` have been answered; SIGTERM
/// flushes the log.
fn serve_and_ask(repo: &Path, requests: &[String]) -> Vec<serde_json::Value> {
    let (child, port) = common::spawn_serve(repo);
    let answers = requests
        .iter()
        .map(|r| {
            let path = if r.contains("\"df\"") { "/push" } else { "/get-online-features" };
            let (status, body) = common::http(port, "POST", path, r);
            assert_eq!(status, "HTTP/1.1 200 OK", "{r}: {body}");
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        })
        .collect();
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("logging answers to"), "{}", String::from_utf8_lossy(&out.stdout));
    answers
}

/// The verify table's numbers for one feature: compared, matches, mismatches, missing
/// online, missing offline.
fn numbers(out: &str, feature: &str) -> Vec<u64> {
    let line = out.lines().find(|l| l.split_whitespace().next() == Some(feature)).unwrap_or_else(|| panic!("no {feature} in {out}"));
    line.split_whitespace().skip(1).map(|n| n.parse().unwrap()).collect()
}

/// The serving log end to end: `quiver serve` logs what it answers; `verify --since`
/// replays it through the offline join. A consistent store agrees everywhere; then a
/// value written straight into the online store, a row pushed online only and a row
/// appended offline only are each reported as their own kind, with examples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_since_replays_the_serving_log() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = logged_demo(tmp.path(), "");

    // Nothing logged yet: a clear refusal, not a vacuous pass.
    let empty = quiver(&repo, &["verify", "--since", "1h"]);
    assert_eq!(empty.status.code(), Some(1));
    assert!(text(&empty).1.contains("nothing logged between"), "{:?}", text(&empty));

    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let drivers: Vec<String> = (1001..=1010).map(|d| d.to_string()).collect();
    let ask = format!(
        r#"{{"entities": {{"driver_id": [{}, 5555], "customer_id": [{}]}}, "feature_service": "ranker_v1"}}"#,
        drivers.join(", "),
        (0..11).map(|i| format!("\"C{:03}\"", i + 1)).collect::<Vec<_>>().join(", ")
    );
    let answers = serve_and_ask(&repo, &[ask.clone(), ask.clone()]);
    assert_eq!(answers[0]["results"][0]["values"][10], 5555, "{}", answers[0]);
    let agree = quiver(&repo, &["verify", "--since", &began.to_rfc3339()]);
    let (out, err) = text(&agree);
    assert!(agree.status.success(), "{out}{err}");
    assert!(out.contains(": 2 requests, "), "{out}");
    // 11 entity rows per request, two requests: every feature compared 22 times, all equal
    // (5555 is NOT_FOUND on both sides).
    for feature in ["driver_hourly:conv_rate", "customer_profile:embedding", "driver_customer:rides_together"] {
        assert_eq!(numbers(&out, feature), vec![22, 22, 0, 0, 0], "{feature}: {out}");
    }
    assert!(out.contains("0 of ") && !out.contains("skipped"), "{out}");

    // Three real inconsistencies, with the server stopped (the embedded store is one
    // process's file): a different value for 1001, same times ...
    {
        let store = EmbeddedStore::open(&repo.join("online.db")).unwrap();
        let key = store_key("demo", "driver_hourly", &[KeyValue::Int(1001)]);
        let got = store.read(std::slice::from_ref(&key)).await.unwrap();
        let mut row = OnlineRow::decode(got[0].as_ref().expect("materialized")).unwrap();
        row.values[0] = Value::Float64(42.0);
        assert_eq!(store.write(&[WriteRow { key, row: row.encode(), expire_at_ms: None }]).await.unwrap(), 1);
    }
    // ... a driver only the offline store has ...
    let fresh = (chrono::Utc::now() - chrono::TimeDelta::seconds(30)).to_rfc3339();
    // (6666 is a backfill: created an hour from now, so not known at request time.)
    let later = (chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339();
    std::fs::write(
        repo.join("offline_only.jsonl"),
        format!(
            "{}\n{}\n",
            format_args!(r#"{{"driver_id": 7777, "event_timestamp": "{fresh}", "created_timestamp": "{fresh}", "conv_rate": 0.5, "acc_rate": 0.5, "avg_daily_trips": 5}}"#),
            format_args!(r#"{{"driver_id": 6666, "event_timestamp": "{fresh}", "created_timestamp": "{later}", "conv_rate": 0.5, "acc_rate": 0.5, "avg_daily_trips": 5}}"#)
        ),
    )
    .unwrap();
    let pushed = quiver(&repo, &["push", "driver_hourly", "offline_only.jsonl", "--to", "offline"]);
    assert!(pushed.status.success(), "{:?}", text(&pushed));
    let began = chrono::Utc::now() - chrono::TimeDelta::milliseconds(10);
    // ... and one only the online store has (pushed online only, then served).
    let push_online = format!(
        r#"{{"feature_view": "driver_hourly", "to": "online", "df": {{"driver_id": [8888], "event_timestamp": ["{fresh}"], "created_timestamp": ["{fresh}"], "conv_rate": [0.25], "acc_rate": [0.5], "avg_daily_trips": [3]}}}}"#
    );
    let ask =
        r#"{"entities": {"driver_id": [1001, 1002, 7777, 8888, 6666]}, "features": ["driver_hourly:conv_rate", "driver_hourly:acc_rate"]}"#;
    let answers = serve_and_ask(&repo, &[push_online, ask.to_string()]);
    assert_eq!(answers[1]["results"][1]["values"][0], 42.0);
    let wrong = quiver(&repo, &["verify", "--since", &began.to_rfc3339()]);
    let (out, err) = text(&wrong);
    assert_eq!(wrong.status.code(), Some(1), "{out}{err}");
    assert!(err.contains("over --max-mismatch 0"), "{err}");
    assert_eq!(numbers(&out, "driver_hourly:conv_rate"), vec![5, 1, 1, 2, 1], "{out}");
    // acc_rate of 1001 was not touched: only the missing rows disagree.
    assert_eq!(numbers(&out, "driver_hourly:acc_rate"), vec![5, 2, 0, 2, 1], "{out}");
    assert!(out.contains(r#"mismatch: {"driver_id":1001} at "#) && out.contains("served PRESENT 42.0 (event "), "{out}");
    assert!(out.contains(r#"missing online: {"driver_id":7777} at "#) && out.contains("served NOT_FOUND, offline PRESENT 0.5"), "{out}");
    assert!(out.contains(r#"missing offline: {"driver_id":8888} at "#) && out.contains("served PRESENT 0.25 (event"), "{out}");
    // Judged by what was known at each request (created time), the backfill of 6666 is
    // no longer missing online.
    let known = quiver(&repo, &["verify", "--since", &began.to_rfc3339(), "--created-cutoff"]);
    assert_eq!(numbers(&text(&known).0, "driver_hourly:conv_rate"), vec![5, 2, 1, 1, 1], "{:?}", text(&known));
    // The first window still agrees; a 50% allowance passes; bad times are refused.
    let until = began.to_rfc3339();
    assert!(quiver(&repo, &["verify", "--since", "1d", "--until", &until]).status.success());
    assert!(quiver(&repo, &["verify", "--since", &until, "--max-mismatch", "0.8"]).status.success());
    let bad = quiver(&repo, &["verify", "--since", "yesterday"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad).1.contains("--since `yesterday`: expected an RFC 3339 time"), "{:?}", text(&bad));
    // A bare number is not taken for seconds ago; a time without a zone says so.
    let bare = quiver(&repo, &["verify", "--since", "1735689600"]);
    assert!(text(&bare).1.contains("--since `1735689600`: expected an RFC 3339 time"), "{:?}", text(&bare));
    let naive = quiver(&repo, &["verify", "--since", "2026-11-30T10:00:00"]);
    assert!(text(&naive).1.contains("zone"), "{:?}", text(&naive));
}

/// The serving log keeps each aggregation's own event time (the latest event in its
/// window), so `verify --since` describes a served aggregation with the time the server
/// answered — never the epoch of another aggregation of the same view whose window is
/// empty.
#[test]
fn verify_since_shows_each_aggregations_own_event_time() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(
        repo.join("quiver.yaml"),
        "project: logtimes\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\nserving_log:\n  enabled: true\n  batch_ms: 100\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("features.yaml"),
        r#"entities:
  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}
feature_views:
  - name: rides
    entities: [rider]
    source: {timestamp_field: event_timestamp}
    features: [{name: fare, dtype: float64}]
    aggregations:
      - {name: n_1h, function: count, column: fare, window: 1h}
      - {name: n_7d, function: count, column: fare, window: 7d}
"#,
    )
    .unwrap();
    assert!(quiver(&repo, &["apply"]).status.success());
    let at = |hours_ago: i64| (chrono::Utc::now() - chrono::TimeDelta::hours(hours_ago)).to_rfc3339();
    std::fs::write(repo.join("rides.jsonl"), format!("{{\"rider_id\": 1, \"event_timestamp\": \"{}\", \"fare\": 3.0}}\n", at(48))).unwrap();
    let ingested = quiver(&repo, &["ingest", "rides", "rides.jsonl"]);
    assert!(ingested.status.success(), "{:?}", text(&ingested));
    assert!(quiver(&repo, &["materialize", "2000-01-01T00:00:00Z", "now"]).status.success());
    // A ride only the offline store learns of: the served count of 7 days is stale.
    std::fs::write(repo.join("late.jsonl"), format!("{{\"rider_id\": 1, \"event_timestamp\": \"{}\", \"fare\": 5.0}}\n", at(24))).unwrap();
    assert!(quiver(&repo, &["push", "rides", "late.jsonl", "--to", "offline"]).status.success());
    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let ask = r#"{"entities": {"rider_id": [1]}, "features": ["rides:n_1h", "rides:n_7d"]}"#.to_string();
    let answers = serve_and_ask(&repo, &[ask]);
    let results = &answers[0]["results"];
    assert_eq!(results[1]["values"][0], 0, "{}", answers[0]);
    assert_eq!(results[2]["values"][0], 1, "{}", answers[0]);
    let served_time = results[2]["event_timestamps"][0].as_str().unwrap().to_string();
    assert!(!served_time.starts_with("1970"), "{served_time}");
    let out = quiver(&repo, &["verify", "--since", &began.to_rfc3339()]);
    let (out, err) = text(&out);
    assert_eq!(numbers(&out, "rides:n_7d"), vec![1, 0, 1, 0, 0], "{out}{err}");
    assert!(out.contains(&format!("served PRESENT 1 (event {served_time}), offline PRESENT 2")), "{out}");
    assert!(!out.contains("1970"), "{out}");
}

/// On-demand features through the server with the serving log on
/// (docs/transformations.md): request fields beside the join keys, values that cannot
/// be computed answered null and counted on `/metrics`, the request fields logged, and
/// `verify --since` replaying every on-demand feature through the offline join bit for
/// bit — then reporting the one whose stored input was changed behind its back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_since_replays_on_demand_features() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = logged_demo(tmp.path(), crate::on_demand::ON_DEMAND);
    // `--sample` covers the on-demand view without request fields.
    let sampled = quiver(&repo, &["verify", "--sample", "20"]);
    let (out, err) = text(&sampled);
    assert!(sampled.status.success(), "{out}{err}");
    let rated = numbers(&out, "pair_stats:rated_rides");
    assert!(rated[0] > 0 && rated[0] == rated[1], "{out}");
    let features: Vec<String> =
        ["conv_x_acc", "fare_ratio", "per_unit", "home_city", "tier", "profile_age_h", "emb_norm", "rides_per_trip"]
            .iter()
            .map(|f| format!("\"trip_scoring:{f}\""))
            .chain(["\"boosted:score\"".to_string()])
            .collect();
    // Ten rows; 0.5 makes `per_unit` divide by zero (null, counted).
    let ask = format!(
        r#"{{"entities": {{"driver_id": [{}], "customer_id": [{}], "amount": [12.5, 0.5, 30, -4.25, 99.9, 1, 2, 3, 4, 5], "pickup_city": ["paris", "Paris", "", "BERLIN", "x", "y", "z", "w", "v", "u"]}}, "features": [{}]}}"#,
        (1001..=1010).map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
        (1..=10).map(|i| format!("\"C{i:03}\"")).collect::<Vec<_>>().join(", "),
        features.join(", ")
    );
    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let (child, port) = common::spawn_serve(&repo);
    let (status, body) = common::http(port, "POST", "/get-online-features", &ask);
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    // Keys first (the request fields are not echoed), then the features.
    assert_eq!(answer["metadata"]["feature_names"][2], "conv_x_acc", "{answer}");
    let per_unit = &answer["results"][4];
    assert_eq!(per_unit["values"][1], serde_json::Value::Null, "{answer}");
    assert_eq!(per_unit["statuses"][1], "NULL_VALUE", "{answer}");
    let (_, metrics) = common::http(port, "GET", "/metrics", "");
    let uncomputed = metrics.lines().find(|l| l.starts_with("quiver_on_demand_uncomputed_total ")).unwrap_or_else(|| panic!("{metrics}"));
    assert_ne!(uncomputed, "quiver_on_demand_uncomputed_total 0", "{metrics}");
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait_with_output().unwrap().status.success());

    let agree = quiver(&repo, &["verify", "--since", &began.to_rfc3339()]);
    let (out, err) = text(&agree);
    assert!(agree.status.success(), "{out}{err}");
    for f in ["conv_x_acc", "per_unit", "home_city", "tier", "profile_age_h", "emb_norm"] {
        assert_eq!(numbers(&out, &format!("trip_scoring:{f}")), vec![10, 10, 0, 0, 0], "{f}: {out}");
    }
    assert_eq!(numbers(&out, "boosted:score"), vec![10, 10, 0, 0, 0], "{out}");
    assert!(!out.contains("skipped"), "{out}");

    // A stored input changed behind the log's back: the on-demand feature reading it
    // no longer replays to what was served.
    {
        let store = EmbeddedStore::open(&repo.join("online.db")).unwrap();
        let key = store_key("demo", "driver_hourly", &[KeyValue::Int(1001)]);
        let got = store.read(std::slice::from_ref(&key)).await.unwrap();
        let mut row = OnlineRow::decode(got[0].as_ref().expect("materialized")).unwrap();
        row.values[0] = Value::Float64(42.0);
        assert_eq!(store.write(&[WriteRow { key, row: row.encode(), expire_at_ms: None }]).await.unwrap(), 1);
    }
    let began = chrono::Utc::now() - chrono::TimeDelta::milliseconds(10);
    let (child, port) = common::spawn_serve(&repo);
    let (status, body) = common::http(port, "POST", "/get-online-features", &ask);
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let wrong = quiver(&repo, &["verify", "--since", &began.to_rfc3339()]);
    let (out, err) = text(&wrong);
    assert_eq!(wrong.status.code(), Some(1), "{out}{err}");
    assert_eq!(numbers(&out, "trip_scoring:conv_x_acc"), vec![10, 9, 1, 0, 0], "{out}");
    assert_eq!(numbers(&out, "trip_scoring:tier"), vec![10, 10, 0, 0, 0], "{out}");
    assert!(out.contains(r#"mismatch: {"driver_id":1001,"customer_id":"C001","amount":12.5,"pickup_city":"paris"} at "#), "{out}");
}
