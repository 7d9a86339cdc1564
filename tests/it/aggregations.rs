//! Windowed aggregations end to end through the binary (docs/aggregations.md): events ingested,
//! materialized, pushed (`quiver push` and the server's `/push`), and the online
//! answer at `now` compared with the offline answer for a spine row at `now`, with the
//! expected counts written here by hand. Rebuilding or pushing again never counts an
//! event twice.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray};
use quiver::Repo;
use quiver::offline::historical::{HistoricalOptions, SpineRows, historical, resolve};
use quiver::offline::schema::value_at;
use quiver::online::lookup::{Status, get_online_features};
use quiver::online::{EmbeddedStore, OnlineStore};
use quiver::runtime::encoding::{KeyValue, Value};
use quiver::sdk::FeatureRef;

use crate::common;

const FEATURES: &str = r#"entities:
  - name: rider
    join_keys: [{name: rider_id, dtype: int64}]
feature_views:
  - name: rides
    entities: [rider]
    source: {timestamp_field: event_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: city, dtype: string}
    aggregations:
      - {name: n_1h, function: count, column: fare, window: 1h}
      - {name: fare_sum_1h, function: sum, column: fare, window: 1h}
      - {name: cities, function: last_k, k: 2, column: city, window: 1d}
"#;

fn quiver(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver")).arg("--repo").arg(dir).args(args).output().unwrap();
    assert!(out.status.success(), "quiver {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).unwrap().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// JSON lines of (rider, minutes before `now`, fare, city).
fn events(path: &Path, now: i64, rows: &[(i64, i64, Option<f64>, &str)]) {
    let lines: Vec<String> = rows
        .iter()
        .map(|(rider, ago, fare, city)| {
            serde_json::json!({"rider_id": rider, "event_timestamp": rfc3339(now - ago * 60_000_000), "fare": fare, "city": city})
                .to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// The online answer at `at` and the offline answer for spine rows at `at`, for
/// riders 1..=3: they must agree; returns the online values per rider.
async fn answers(dir: &Path, at: i64) -> Vec<Vec<Value>> {
    let repo = Repo::open(dir).unwrap();
    let defs = repo.applied().unwrap().registered();
    let view = defs.feature_view("rides").unwrap();
    let refs: Vec<FeatureRef> = view.aggregations.iter().map(|a| FeatureRef::new("rides", &a.name)).collect();
    let riders = [1i64, 2, 3];
    let store = EmbeddedStore::open(&dir.join("online.db")).unwrap();
    let entities = vec![("rider_id".to_string(), riders.iter().map(|&r| KeyValue::Int(r)).collect())];
    let online = get_online_features(&store as &dyn OnlineStore, "aggs", &defs, &refs, (&entities, &Vec::new()), at, true).await.unwrap();
    let spine = RecordBatch::try_from_iter([
        ("rider_id", Arc::new(Int64Array::from(riders.to_vec())) as ArrayRef),
        ("event_timestamp", Arc::new(TimestampMicrosecondArray::from(vec![at; 3]).with_timezone("UTC"))),
    ])
    .unwrap();
    let requests = resolve(&defs, &refs).unwrap();
    let rows = SpineRows { source: "spine", rows: &spine };
    let kernel = quiver::gpu_join::CpuKernel::new();
    let offline = historical(&repo.config, &defs, rows, &requests, HistoricalOptions::default(), &kernel, &|_, _| {}).await.unwrap();
    let mut out = vec![Vec::new(); 3];
    for (k, r) in refs.iter().enumerate() {
        let dtype = view.served_feature(&r.feature).unwrap().dtype;
        for i in 0..3 {
            let (got, status) = (&online[1 + k].values[i], online[1 + k].statuses[i]);
            assert_eq!(got, &value_at(offline.column(2 + k).as_ref(), i, dtype), "{r} rider {}", riders[i]);
            assert_eq!(status == Status::NullValue, got == &Value::Null, "{r} rider {}: {status:?}", riders[i]);
            out[i].push(got.clone());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn materialize_and_push_keep_online_equal_to_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("quiver.yaml"),
        "project: aggs\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\n",
    )
    .unwrap();
    std::fs::write(dir.join("features.yaml"), FEATURES).unwrap();
    quiver(&dir, &["apply"]);
    let now = chrono::Utc::now().timestamp_micros();
    let file = tmp.path().join("events.jsonl");
    // Rider 1: three rides in the last hour (one without a fare), one two hours ago.
    // Rider 2: one ride yesterday, outside every window but the day's.
    events(
        &file,
        now,
        &[(1, 5, Some(10.0), "a"), (1, 20, None, "b"), (1, 40, Some(2.5), "c"), (1, 130, Some(7.0), "d"), (2, 60 * 23, Some(1.0), "x")],
    );
    quiver(&dir, &["ingest", "rides", file.to_str().unwrap()]);
    quiver(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let at = chrono::Utc::now().timestamp_micros();
    let got = answers(&dir, at).await;
    let strs = |v: &[&str]| Value::ListString(v.iter().map(|s| s.to_string()).collect());
    assert_eq!(got[0], [Value::Int64(2), Value::Float64(12.5), strs(&["a", "b"])]);
    assert_eq!(got[1], [Value::Int64(0), Value::Null, strs(&["x"])]);
    assert_eq!(got[2], [Value::Int64(0), Value::Null, strs(&[])], "an entity without events: the empty windows");

    // Materializing again rebuilds the same records: nothing counted twice. An END in
    // the future builds them as of now, not as of then (when every window is empty).
    quiver(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    assert_eq!(answers(&dir, at).await[0][0], Value::Int64(2));
    quiver(&dir, &["materialize", "2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z"]);
    assert_eq!(answers(&dir, at).await[0][..2], [Value::Int64(2), Value::Float64(12.5)]);

    // A push appends events to Delta and rebuilds the entities' records: two more
    // rides of rider 1 count, and pushing the same file again is two more events.
    let more = tmp.path().join("more.jsonl");
    events(&more, now, &[(1, 1, Some(1.0), "e"), (3, 2, Some(4.0), "z")]);
    let out = quiver(&dir, &["push", "rides", more.to_str().unwrap()]);
    assert!(out.contains("pushed 2 rows into rides"), "{out}");
    let got = answers(&dir, chrono::Utc::now().timestamp_micros()).await;
    assert_eq!(got[0][..2], [Value::Int64(3), Value::Float64(13.5)]);
    assert_eq!(got[0][2], strs(&["e", "a"]));
    assert_eq!(got[2][..2], [Value::Int64(1), Value::Float64(4.0)]);
    quiver(&dir, &["push", "rides", more.to_str().unwrap()]);
    let got = answers(&dir, chrono::Utc::now().timestamp_micros()).await;
    assert_eq!(got[0][..2], [Value::Int64(4), Value::Float64(14.5)]);

    // Once the hour has passed, the windows have moved on without any write.
    let later = now + 3 * 3_600_000_000;
    let got = answers(&dir, later).await;
    assert_eq!(got[0][..2], [Value::Int64(0), Value::Null]);
    assert_eq!(got[0][2], strs(&["e", "e"]), "the day's window still holds the latest two");

    // verify --sample judges the aggregations and finds them equal.
    let verified = quiver(&dir, &["verify", "--sample", "10"]);
    assert!(verified.contains("rides:n_1h") && verified.contains("0 of 9 compared values disagree"), "{verified}");
}

/// An aggregation added to a served event log by `apply` (no `--force`) never blanks the
/// aggregations already served: records written before it answer the ones they hold,
/// the new one is NOT_FOUND until a materialize (or a write) brings it. On the embedded
/// store, Redis and the Redis Cluster, through `quiver online` and (Redis) the server.
#[test]
fn adding_an_aggregation_keeps_the_served_ones() {
    let mut stores = vec![("embedded", "{type: embedded, path: online.db}".to_string())];
    if let Some(url) = common::redis_url("adding_an_aggregation_keeps_the_served_ones (redis)") {
        stores.push(("redis", format!("{{type: redis, url: \"{url}\"}}")));
    }
    if let Some((urls, _)) = common::redis_cluster("adding_an_aggregation_keeps_the_served_ones (cluster)") {
        stores.push(("redis cluster", format!("{{type: redis_cluster, urls: [{}]}}", urls.join(", "))));
    }
    for (name, store) in stores {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("repo");
        std::fs::create_dir_all(&dir).unwrap();
        let project = common::unique("addagg");
        std::fs::write(
            dir.join("quiver.yaml"),
            format!("project: {project}\nregistry: registry.json\noffline_store:\n  path: data\nonline_store: {store}\n"),
        )
        .unwrap();
        std::fs::write(dir.join("features.yaml"), FEATURES).unwrap();
        common::ok(&dir, &["apply"]);
        let now = chrono::Utc::now().timestamp_micros();
        events(&dir.join("events.jsonl"), now, &[(1, 5, Some(10.0), "a"), (1, 40, Some(2.5), "c"), (2, 30, Some(4.0), "x")]);
        common::ok(&dir, &["ingest", "rides", "events.jsonl"]);
        common::ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
        // (value, status) per feature from `quiver online`, rider 1.
        let online = |features: &str| -> Vec<(String, String)> {
            let out = common::ok(&dir, &["online", "--features", features, "--entity", "rider_id=1"]);
            out.lines()
                .map(|l| {
                    let (value, status) = l.split_once('"').map_or_else(
                        || {
                            let parts: Vec<&str> = l.split_whitespace().collect();
                            (parts[1].to_string(), parts[2].to_string())
                        },
                        // A list of strings: everything between the name and the status.
                        |_| {
                            let start = l.find('[').unwrap();
                            let end = l.rfind(']').unwrap();
                            (l[start..=end].to_string(), l[end + 1..].split_whitespace().next().unwrap().to_string())
                        },
                    );
                    (value, status)
                })
                .collect()
        };
        let served =
            [("2".to_string(), "PRESENT".to_string()), ("12.5".into(), "PRESENT".into()), (r#"["a", "c"]"#.into(), "PRESENT".into())];
        assert_eq!(online("rides:n_1h,rides:fare_sum_1h,rides:cities"), served, "{name}: before the apply");

        let added = FEATURES.replace(
            "      - {name: cities, function: last_k, k: 2, column: city, window: 1d}\n",
            "      - {name: cities, function: last_k, k: 2, column: city, window: 1d}\n      - {name: fare_max_1d, function: max, column: fare, window: 1d}\n",
        );
        assert_ne!(added, FEATURES);
        std::fs::write(dir.join("features.yaml"), &added).unwrap();
        let out = common::ok(&dir, &["apply"]);
        assert!(out.contains("applied"), "{name}: {out}");
        let mut after = online("rides:n_1h,rides:fare_sum_1h,rides:cities,rides:fare_max_1d");
        let new = after.pop().unwrap();
        assert_eq!(after, served, "{name}: the served aggregations stay served");
        assert_eq!(new, ("null".to_string(), "NOT_FOUND".to_string()), "{name}: the new one waits for a write");

        if name != "embedded" {
            // The server (one process may hold the embedded store's file): the same.
            let (mut child, port) = common::spawn_serve(&dir);
            let body = r#"{"entities": {"rider_id": [1, 2]}, "features": ["rides:n_1h", "rides:fare_sum_1h", "rides:fare_max_1d"]}"#;
            let (status, text) = common::http(port, "POST", "/get-online-features", body);
            let _ = child.kill();
            let _ = child.wait();
            assert_eq!(status, "HTTP/1.1 200 OK", "{name}: {text}");
            let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
            let results = &answer["results"];
            assert_eq!(results[1]["values"], serde_json::json!([2, 1]), "{name}: {text}");
            assert_eq!(results[1]["statuses"], serde_json::json!(["PRESENT", "PRESENT"]), "{name}: {text}");
            assert_eq!(results[2]["values"], serde_json::json!([12.5, 4.0]), "{name}: {text}");
            assert_eq!(results[3]["statuses"], serde_json::json!(["NOT_FOUND", "NOT_FOUND"]), "{name}: {text}");
            // The window's latest event: a real time, not the epoch.
            assert!(!results[1]["event_timestamps"][0].as_str().unwrap().starts_with("1970"), "{name}: {text}");
        }

        common::ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
        let mut after = online("rides:n_1h,rides:fare_sum_1h,rides:cities,rides:fare_max_1d");
        assert_eq!(after.pop().unwrap(), ("10.0".to_string(), "PRESENT".to_string()), "{name}: materialized");
        assert_eq!(after, served, "{name}");
    }
}
