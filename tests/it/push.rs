//! `quiver push` and the server's `/push` write through the streaming write path into
//! both stores: the Delta table gets exactly the pushed rows (read back from Delta), the
//! online store the latest per entity; bad input is refused with the file or row named
//! and nothing written anywhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int64Type, TimestampMicrosecondType};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use quiver::Repo;
use quiver::online::server::{Metrics, RegistryCache, ServerState, router};
use quiver::online::{EmbeddedStore, OnlineStore};
use quiver::runtime::encoding::{KeyValue, OnlineRow, Value, store_key};
use tower::ServiceExt;

const FEATURES: &str = r#"entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
feature_views:
  - name: trips
    entities: [driver]
    online: true
    source: {timestamp_field: event_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: seq, dtype: int64}
"#;

fn repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("quiver.yaml"),
        "project: pushes\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\n",
    )
    .unwrap();
    std::fs::write(dir.join("features.yaml"), FEATURES).unwrap();
    quiver(dir, &["apply"]);
}

/// A repository applied in a temporary folder (kept while the first value lives), its
/// folder, and the repository opened.
fn applied_repo() -> (tempfile::TempDir, PathBuf, Repo) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    repo(&dir);
    let opened = Repo::open(&dir).unwrap();
    (tmp, dir, opened)
}

fn quiver(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver")).arg("--repo").arg(dir).args(args).output().unwrap();
    if args[0] == "apply" {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    out
}

/// Delta rows as (driver, event ts, fare, seq), sorted.
async fn delta(dir: &Path) -> Vec<(i64, i64, Option<f64>, i64)> {
    let repo = Repo::open(dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    let mut out = Vec::new();
    for b in quiver::offline::historical::read_view(&repo.config, &defs, &defs.feature_views[0]).await.unwrap() {
        let fare = b.column(3).as_primitive::<Float64Type>();
        for r in 0..b.num_rows() {
            out.push((
                b.column(0).as_primitive::<Int64Type>().value(r),
                b.column(1).as_primitive::<TimestampMicrosecondType>().value(r),
                (!fare.is_null(r)).then(|| fare.value(r)),
                b.column(4).as_primitive::<Int64Type>().value(r),
            ));
        }
    }
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out
}

async fn online(dir: &Path, driver: i64) -> Option<OnlineRow> {
    let store = EmbeddedStore::open(&dir.join("online.db")).unwrap();
    let got = store.read(&[store_key("pushes", "trips", &[KeyValue::Int(driver)])]).await.unwrap();
    got[0].as_ref().map(|b| OnlineRow::decode(b).unwrap())
}

const T0: i64 = 1_735_689_600_000_000; // 2025-01-01T00:00:00Z

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiver_push_writes_both_stores_or_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    repo(&dir);
    let file = tmp.path().join("rows.jsonl");
    std::fs::write(
        &file,
        concat!(
            r#"{"driver_id": 1, "event_timestamp": "2025-01-01T00:00:00Z", "fare": 2.5, "seq": 1}"#,
            "\n",
            r#"{"driver_id": 1, "event_timestamp": "2025-01-01T01:00:00Z", "fare": 3, "seq": 2}"#,
            "\n",
            r#"{"driver_id": 2, "event_timestamp": "2025-01-01T00:30:00+00:30", "fare": null, "seq": 3}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = quiver(&dir, &["push", "trips", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("pushed 3 rows into trips") && stdout.contains("offline: table version"), "{stdout}");
    let h = 3_600_000_000;
    assert_eq!(delta(&dir).await, vec![(1, T0, Some(2.5), 1), (1, T0 + h, Some(3.0), 2), (2, T0, None, 3)]);
    let d1 = online(&dir, 1).await.unwrap();
    assert_eq!((d1.event_ts, d1.values.clone()), (T0 + h, vec![Value::Float64(3.0), Value::Int64(2)]));
    assert_eq!(online(&dir, 2).await.unwrap().values, vec![Value::Null, Value::Int64(3)]);

    // Online only: Delta unchanged, the online row moves on.
    let later = tmp.path().join("later.jsonl");
    std::fs::write(&later, r#"{"driver_id": 2, "event_timestamp": "2025-01-02T00:00:00Z", "fare": 9.75, "seq": 4}"#).unwrap();
    let out = quiver(&dir, &["push", "trips", later.to_str().unwrap(), "--to", "online"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(delta(&dir).await.len(), 3);
    assert_eq!(online(&dir, 2).await.unwrap().values, vec![Value::Float64(9.75), Value::Int64(4)]);

    // A bad row: one line naming file and row, exit 1, nothing written anywhere.
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        concat!(
            r#"{"driver_id": 3, "event_timestamp": "2025-01-03T00:00:00Z", "fare": 1.0, "seq": 5}"#,
            "\n",
            r#"{"driver_id": 3, "event_timestamp": "2025-01-03T00:00:00Z", "fare": 1.0, "seq": 5.5}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = quiver(&dir, &["push", "trips", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad.jsonl: row 2: feature `seq` must be int64, got 5.5"), "{err}");
    assert_eq!(delta(&dir).await.len(), 3);
    assert!(online(&dir, 3).await.is_none());
}

/// The server's state over `repo` and `store`, its clock at `T0`, pushing to Delta.
fn server(repo: &Repo, store: Arc<dyn OnlineStore>) -> Arc<ServerState> {
    Arc::new(ServerState {
        store,
        registry: RegistryCache::new(repo.config.registry_path.clone(), "pushes").unwrap(),
        project: "pushes".into(),
        auth_token: None,
        metrics: Metrics::default(),
        clock: Box::new(|| T0),
        offline: Some(Arc::new(quiver::streaming::write::DeltaWriter::new(repo.config.clone()))),
        serving_log: None,
        limits: quiver::online::server::Limits::default(),
        insights: None,
        pending: Default::default(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_push_offline_goes_through_delta() {
    let (_tmp, dir, repo) = applied_repo();
    let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.join("online.db")).unwrap());
    let state = server(&repo, store.clone());
    let push = |body: &'static str| {
        let state = state.clone();
        async move {
            let req = Request::builder().method("POST").uri("/push").header("content-type", "application/json");
            let resp = router(state).oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap())
        }
    };
    let (status, answer) = push(
        r#"{"feature_view": "trips", "to": "online_and_offline", "df": {"driver_id": [5, 6],
            "event_timestamp": ["2025-01-01T00:00:00Z", "2025-01-01T00:00:01Z"], "fare": [1.25, 2.0], "seq": [10, 11]}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["rows"], 2);
    assert_eq!(answer["online_written"], 2);
    assert!(answer["offline_version"].is_u64(), "{answer}");
    assert_eq!(delta(&dir).await, vec![(5, T0, Some(1.25), 10), (6, T0 + 1_000_000, Some(2.0), 11)]);
    let (status, answer) = push(
        r#"{"feature_view": "trips", "to": "offline", "df": {"driver_id": [7], "event_timestamp": ["2025-01-01T00:00:00Z"], "fare": [3.5], "seq": [12]}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.get("online_written").is_none(), "offline only: {answer}");
    assert_eq!(delta(&dir).await.len(), 3);
    let got = store.read(&[store_key("pushes", "trips", &[KeyValue::Int(7)])]).await.unwrap();
    assert!(got[0].is_none(), "offline-only push must not reach the online store");
    // The push to both stores recorded that it owed the online store its rows (for a
    // server killed before writing them); the offline one did not.
    let location = repo.config.view_table(&repo.applied().unwrap().definitions.feature_views[0]);
    let owed = |v: u64| {
        let location = location.clone();
        async move { quiver::offline::delta::owes_online(&quiver::offline::delta::log_entry(&location, v).await.unwrap().unwrap()) }
    };
    let versions = quiver::offline::delta::commit_times(&location).await.unwrap();
    let last = versions.keys().max().copied().unwrap();
    assert_eq!((owed(last - 1).await, owed(last).await), (true, false));
    // A bad row refuses the whole push: nothing appended.
    let (status, answer) = push(
        r#"{"feature_view": "trips", "to": "offline", "df": {"driver_id": [8, 9], "event_timestamp": ["2025-01-01T00:00:00Z", "yesterday"], "fare": [1.0, 1.0], "seq": [1, 2]}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(answer["error"].as_str().unwrap().contains("row 2: `event_timestamp`: `yesterday` is not an RFC 3339 timestamp"), "{answer}");
    assert_eq!(delta(&dir).await.len(), 3);
}

/// An online store that refuses every call while `down` is set.
#[derive(Debug)]
struct Switched {
    inner: EmbeddedStore,
    down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl OnlineStore for Switched {
    fn name(&self) -> String {
        "switched".into()
    }
    async fn write(&self, rows: &[quiver::online::WriteRow]) -> quiver::online::Result<usize> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(quiver::online::Error::Unavailable { store: "switched".into(), message: "connection refused".into() });
        }
        self.inner.write(rows).await
    }
    async fn read(&self, keys: &[String]) -> quiver::online::Result<Vec<Option<Vec<u8>>>> {
        self.inner.read(keys).await
    }
}

/// A push to both stores while the online store is down: the rows are committed
/// offline, the answer says so (202, `online_pending`), and the online write lands by
/// itself once the store is back — never half written, never to be pushed again. A push
/// online only is refused whole (503), nothing appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_whose_online_store_fails_is_written_online_when_it_returns() {
    let (_tmp, dir, repo) = applied_repo();
    let store =
        Arc::new(Switched { inner: EmbeddedStore::open(&dir.join("online.db")).unwrap(), down: std::sync::atomic::AtomicBool::new(true) });
    let state = server(&repo, store.clone());
    let call = |method: &'static str, uri: &'static str, body: &'static str| {
        let state = state.clone();
        async move {
            let req = Request::builder().method(method).uri(uri).header("content-type", "application/json");
            let resp = router(state).oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
            let status = resp.status();
            (status, String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
        }
    };
    let key = |d: i64| store_key("pushes", "trips", &[KeyValue::Int(d)]);
    let (status, answer) = call(
        "POST",
        "/push",
        r#"{"feature_view": "trips", "df": {"driver_id": [5, 6],
            "event_timestamp": ["2025-01-01T00:00:00Z", "2025-01-01T00:00:01Z"], "fare": [1.25, 2.0], "seq": [10, 11]}}"#,
    )
    .await;
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!((answer["rows"].as_u64(), answer["online_pending"].as_u64()), (Some(2), Some(2)), "{answer}");
    assert!(answer["offline_version"].is_u64() && answer.get("online_written").is_none(), "{answer}");
    assert_eq!(delta(&dir).await.len(), 2, "the rows are committed offline");
    assert!(store.read(&[key(5)]).await.unwrap()[0].is_none());
    let (_, metrics) = call("GET", "/metrics", "").await;
    assert!(metrics.contains("quiver_push_online_pending_rows 2"), "{metrics}");

    // Online only, while the store is down: refused whole, nothing appended.
    let (status, answer) = call(
        "POST",
        "/push",
        r#"{"feature_view": "trips", "to": "online", "df": {"driver_id": [7], "event_timestamp": ["2025-01-01T00:00:00Z"], "fare": [3.5], "seq": [12]}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(delta(&dir).await.len(), 2);

    // The store returns: the pending rows are written without another request.
    store.down.store(false, std::sync::atomic::Ordering::SeqCst);
    let began = std::time::Instant::now();
    while store.read(&[key(5), key(6)]).await.unwrap().iter().any(Option::is_none) {
        assert!(began.elapsed() < std::time::Duration::from_secs(15), "the pending push never reached the online store");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let stored = store.read(&[key(6)]).await.unwrap()[0].clone().unwrap();
    let row = OnlineRow::decode(&stored).unwrap();
    assert_eq!((row.event_ts, row.values[0].clone()), (T0 + 1_000_000, Value::Float64(2.0)));
    let (_, metrics) = call("GET", "/metrics", "").await;
    assert!(metrics.contains("quiver_push_online_pending_rows 0"), "{metrics}");
    assert_eq!(delta(&dir).await.len(), 2, "nothing appended twice");
}

/// A server killed between a push's Delta commit and its online write leaves the rows
/// owed to the online store (the commit records it); the next server to start writes
/// them. Rows pushed offline alone owe nothing and stay offline, also between two owed
/// commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_server_writes_the_rows_a_killed_push_owed() {
    use arrow::array::{Float64Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use quiver::offline::ingest::{AppendOptions, append};
    let (_tmp, dir, repo) = applied_repo();
    let defs = repo.applied().unwrap().definitions;
    let view = &defs.feature_views[0];
    let at = chrono::Utc::now().timestamp_micros() - 60_000_000;
    let batch = |driver: i64, fare: f64| {
        let schema = Arc::new(Schema::new(vec![
            Field::new("driver_id", DataType::Int64, false),
            Field::new("event_timestamp", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
            Field::new("fare", DataType::Float64, true),
            Field::new("seq", DataType::Int64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![driver])),
                Arc::new(TimestampMicrosecondArray::from(vec![at]).with_timezone("UTC")),
                Arc::new(Float64Array::from(vec![fare])),
                Arc::new(Int64Array::from(vec![1])),
            ],
        )
        .unwrap()
    };
    let location = repo.config.view_table(view);
    // The commit a push to both stores makes, its online write never made ...
    let owed = AppendOptions::new(None).with_txns(vec![(quiver::offline::delta::OWES_ONLINE.to_string(), 1)]);
    append(&location, &defs, view, "/push request", vec![batch(7, 1.5)], owed, &|_, _| {}).await.unwrap();
    // ... one of a push to the offline store alone, and another owed after it.
    append(&location, &defs, view, "/push request", vec![batch(8, 2.5)], AppendOptions::new(None), &|_, _| {}).await.unwrap();
    let owed = AppendOptions::new(None).with_txns(vec![(quiver::offline::delta::OWES_ONLINE.to_string(), 2)]);
    append(&location, &defs, view, "/push request", vec![batch(9, 3.5)], owed, &|_, _| {}).await.unwrap();
    let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.join("online.db")).unwrap());
    let read = |driver: i64| {
        let store = store.clone();
        async move {
            let got = store.read(&[store_key("pushes", "trips", &[KeyValue::Int(driver)])]).await.unwrap();
            got[0].as_ref().map(|b| OnlineRow::decode(b).unwrap().values[0].clone())
        }
    };
    assert_eq!(read(7).await, None);
    let server = repo.serve("127.0.0.1:0".parse().unwrap()).with_store(store.clone()).start().await.unwrap();
    let began = std::time::Instant::now();
    while (read(7).await.is_none() || read(9).await.is_none()) && began.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(read(7).await, Some(Value::Float64(1.5)), "the owed row, written by the starting server");
    assert_eq!(read(9).await, Some(Value::Float64(3.5)));
    assert_eq!(read(8).await, None, "a row pushed offline alone stays offline");
    server.stop().await.unwrap();
}
