//! The serving log under a server: what it records and how it survives a table that
//! cannot be written.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use quiver_online::server::router;
use quiver_online::serving_log::ServingLog;
use quiver_online::{EmbeddedStore, OnlineStore};
use quiver_sdk::Timestamp;
use tower::ServiceExt;

use super::{DeltaServingLog, read};
use crate::ops::Rows;
use crate::repo::Repo;

#[test]
fn sampling_keeps_about_the_rate_and_everything_at_one() {
    let kept = (0..100_000u64).filter(|&s| super::sampled(s, 0.25)).count();
    assert!((24_000..26_000).contains(&kept), "{kept}");
    assert!((0..1000u64).all(|s| super::sampled(s, 1.0)));
}

/// The demo repository created in `dir` and applied; with `data`, its hourly driver
/// stats ingested and materialized up to now.
async fn demo(dir: &Path, data: bool) -> Repo {
    let now = chrono::Utc::now();
    crate::init::init(dir, true, now).unwrap();
    let repo = Repo::open(dir).unwrap();
    let (applying, handle) = (repo.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || applying.apply(false, now, handle)).await.unwrap().unwrap();
    if data {
        repo.ingest("driver_hourly", Rows::file(dir.join("sample_data/driver_hourly.parquet"))).await.unwrap();
        repo.materialize_incremental(now.into()).await.unwrap();
    }
    repo
}

/// The replay decides statuses as the online lookup does, at each request's own time:
/// answers at now, three hours later (past the 2h TTL: OUTSIDE_MAX_AGE on both sides)
/// agree; answers five hours in the past, served from rows that did not exist yet at
/// that time, are mismatches. The server's routes run in-process with a settable clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_log_judges_each_answer_at_its_request_time() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let repo = demo(&dir, true).await;
    let defs = repo.applied().unwrap().definitions;
    let now = chrono::Utc::now().timestamp_micros();
    let hour = 3_600_000_000;
    let clock = Arc::new(AtomicI64::new(now));
    let log = DeltaServingLog::start(&repo.config.serving_log, None);
    let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.join("online.db")).unwrap());
    let mut state = crate::server::server_state(&repo.config, store, Some(log.clone())).unwrap();
    state.clock = {
        let c = clock.clone();
        Box::new(move || c.load(Ordering::SeqCst))
    };
    let state = Arc::new(state);
    let body = r#"{"entities": {"driver_id": [1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010]}, "features": ["driver_hourly:conv_rate", "driver_hourly:avg_daily_trips"]}"#;
    let ask = |at: i64| {
        clock.store(at, Ordering::SeqCst);
        let state = state.clone();
        async move {
            let req = axum::http::Request::builder().method("POST").uri("/get-online-features").header("content-type", "application/json");
            let resp = router(state).oneshot(req.body(axum::body::Body::from(body)).unwrap()).await.unwrap();
            assert_eq!(resp.status(), 200);
            let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        }
    };
    // Every demo driver's latest row is at the same hour (the demo's last).
    let first = ask(now).await;
    let latest = first["results"][1]["event_timestamps"][0].as_str().unwrap();
    let latest = chrono::DateTime::parse_from_rfc3339(latest).unwrap().timestamp_micros();
    for at in [now + 3 * hour, now - 5 * hour, latest + 2 * hour, latest + 2 * hour + 1] {
        ask(at).await;
    }
    log.flush().await.unwrap();
    let req = axum::http::Request::builder().uri("/metrics").body(axum::body::Body::empty()).unwrap();
    let metrics = router(state.clone()).oneshot(req).await.unwrap().into_body();
    let metrics = String::from_utf8(http_body_util::BodyExt::collect(metrics).await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(
        metrics.contains("quiver_serving_log_requests_total 5\n") && metrics.contains("quiver_serving_log_rows_written_total 50\n"),
        "{metrics}"
    );
    // The stale answers are in the log as such.
    let logged = read(&repo.config.serving_log.location, Timestamp(now - 6 * hour)..Timestamp(now + 4 * hour)).await.unwrap();
    let statuses: Vec<String> = logged.iter().flat_map(|b| (0..b.num_rows()).map(move |r| b.statuses(r).to_string())).collect();
    assert_eq!(statuses.len(), 50);
    // Stale at now + 3h and one microsecond past the 2h TTL; not at exactly 2h.
    assert_eq!(statuses.iter().filter(|s| s.contains("OUTSIDE_MAX_AGE")).count(), 20, "{statuses:?}");

    let report = crate::verify::verify_log(
        &repo.config,
        &defs,
        now - 6 * hour,
        now + 4 * hour,
        crate::verify::Rule::EventTime { created_cutoff: false },
        &quiver_gpu_join::CpuKernel::new(),
    )
    .await
    .unwrap();
    assert_eq!(report.requests, 5);
    let trips = report.features.iter().find(|f| f.feature == "driver_hourly:avg_daily_trips").unwrap();
    assert_eq!(
        (trips.compared, trips.matches, trips.mismatches, trips.missing_online, trips.missing_offline),
        (50, 40, 10, 0, 0),
        "{trips:?}"
    );
    // Five hours back the store served rows from after the request.
    assert!(trips.examples.iter().all(|e| e.starts_with("mismatch (served a row from after the request): ")), "{:?}", trips.examples);
    // Only the past window disagrees.
    let agree = crate::verify::verify_log(
        &repo.config,
        &defs,
        now,
        now + 4 * hour,
        crate::verify::Rule::EventTime { created_cutoff: false },
        &quiver_gpu_join::CpuKernel::new(),
    )
    .await
    .unwrap();
    assert!(agree.features.iter().all(|f| f.compared == 40 && f.matches == 40), "{:?}", agree.features);
}

/// A log that cannot be written never fails a request: answers stay 200 while appends
/// fail (counted), the rows wait, and they are written once the table can be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_serving_log_never_fails_a_request_and_keeps_its_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let repo = demo(&dir, false).await;
    // The log's folder is under a plain file: nothing can be created there.
    std::fs::write(dir.join("blocker"), "not a folder").unwrap();
    let mut config = repo.config.serving_log.clone();
    config.location = quiver_sdk::StoreLocation::Local(dir.join("blocker/log"));
    let log = DeltaServingLog::start(&config, None);
    let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.join("online.db")).unwrap());
    let state = Arc::new(crate::server::server_state(&repo.config, store, Some(log.clone())).unwrap());
    let body = r#"{"entities": {"driver_id": [1001, 1002, 1003]}, "features": ["driver_hourly:conv_rate"]}"#;
    for _ in 0..4 {
        let req = axum::http::Request::builder().method("POST").uri("/get-online-features").header("content-type", "application/json");
        let resp = router(state.clone()).oneshot(req.body(axum::body::Body::from(body)).unwrap()).await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let err = log.flush().await.unwrap_err();
    assert!(err.contains("blocker/log"), "{err}");
    let metrics = log.metrics_text();
    assert!(
        metrics.contains("quiver_serving_log_write_errors_total 1\n") && metrics.contains("quiver_serving_log_rows_written_total 0\n"),
        "{metrics}"
    );
    // The way is clear again: the 12 waiting rows are written, none lost.
    std::fs::remove_file(dir.join("blocker")).unwrap();
    log.flush().await.unwrap();
    let metrics = log.metrics_text();
    assert!(
        metrics.contains("quiver_serving_log_rows_written_total 12\n") && metrics.contains("quiver_serving_log_rows_dropped_total 0\n"),
        "{metrics}"
    );
    let rows: usize = read(&config.location, Timestamp::MIN..Timestamp(i64::MAX)).await.unwrap().iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 12);
}

/// Each log row names the version it read as its storage does (`driver_hourly` for
/// version 1, `driver_hourly@2`), and `verify --since` replays each against that
/// version: a pinned request for version 1 and a plain one for version 2, whose
/// answers differ, both agree with their own version's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_and_its_replay_read_the_version_each_request_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let repo = demo(&dir, true).await;
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    let changed = yaml.replacen("{name: avg_daily_trips, dtype: int64}", "{name: avg_daily_trips, dtype: float64}", 1);
    std::fs::write(dir.join("features.yaml"), changed).unwrap();
    let (applying, handle) = (repo.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || applying.apply(false, chrono::Utc::now(), handle)).await.unwrap().unwrap();
    repo.backfill("driver_hourly@2").await.unwrap();
    let at = quiver_sdk::types::format_instant(chrono::Utc::now().timestamp_micros() - 60_000_000);
    let row = format!(
        "{{\"driver_id\": 1001, \"event_timestamp\": \"{at}\", \"created_timestamp\": \"{at}\", \"conv_rate\": 0.5, \"acc_rate\": 0.5, \"avg_daily_trips\": 99.5}}\n"
    );
    std::fs::write(dir.join("v2.jsonl"), row).unwrap();
    let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.join("online.db")).unwrap());
    repo.materialize_incremental(chrono::Utc::now().into()).with_store(store.clone()).await.unwrap();
    repo.push("driver_hourly@2", Rows::file(dir.join("v2.jsonl"))).with_store(store.clone()).await.unwrap();
    let defs = repo.applied().unwrap().definitions;
    let log = DeltaServingLog::start(&repo.config.serving_log, None);
    let state = Arc::new(crate::server::server_state(&repo.config, store, Some(log.clone())).unwrap());
    let now = chrono::Utc::now().timestamp_micros();
    let mut answers = Vec::new();
    for features in [r#"["driver_hourly@1:avg_daily_trips"]"#, r#"["driver_hourly:avg_daily_trips"]"#] {
        let body = format!(r#"{{"entities": {{"driver_id": [1001, 1002]}}, "features": {features}}}"#);
        let req = axum::http::Request::builder().method("POST").uri("/get-online-features").header("content-type", "application/json");
        let resp = router(state.clone()).oneshot(req.body(axum::body::Body::from(body)).unwrap()).await.unwrap();
        assert_eq!(resp.status(), 200);
        let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        answers.push(answer["results"][1]["values"][0].clone());
    }
    assert_ne!(answers[0], answers[1], "version 2 has its own row for driver 1001: {answers:?}");
    assert_eq!(answers[1], serde_json::json!(99.5));
    log.flush().await.unwrap();
    let logged = read(&repo.config.serving_log.location, Timestamp(now - 3_600_000_000)..Timestamp(now + 3_600_000_000)).await.unwrap();
    let mut views: Vec<String> = logged.iter().flat_map(|b| (0..b.num_rows()).map(move |r| b.view(r).to_string())).collect();
    views.dedup();
    assert_eq!(views, ["driver_hourly", "driver_hourly@2"]);
    let report = crate::verify::verify_log(
        &repo.config,
        &defs,
        now - 3_600_000_000,
        now + 3_600_000_000,
        crate::verify::Rule::EventTime { created_cutoff: false },
        &quiver_gpu_join::CpuKernel::new(),
    )
    .await
    .unwrap();
    let judged: Vec<(&str, u64, u64)> = report.features.iter().map(|f| (f.feature.as_str(), f.compared, f.matches)).collect();
    assert_eq!(judged, [("driver_hourly:avg_daily_trips", 2, 2), ("driver_hourly@2:avg_daily_trips", 2, 2)], "{:?}", report.features);
}

/// The demo repository served in-process with its serving log on, for the replays of
/// driver 7777's answers.
struct Served {
    repo: Repo,
    defs: quiver_sdk::Definitions,
    log: Arc<DeltaServingLog>,
    state: Arc<crate::online::server::ServerState>,
}

impl Served {
    async fn start(dir: &Path) -> Served {
        let repo = demo(dir, false).await;
        let defs = repo.applied().unwrap().definitions;
        let log = DeltaServingLog::start(&repo.config.serving_log, None);
        let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.join("online.db")).unwrap());
        let state = Arc::new(crate::server::server_state(&repo.config, store, Some(log.clone())).unwrap());
        Served { repo, defs, log, state }
    }

    async fn call(&self, uri: &'static str, body: String) -> (axum::http::StatusCode, serde_json::Value) {
        let req = axum::http::Request::builder().method("POST").uri(uri).header("content-type", "application/json");
        let resp = router(self.state.clone()).oneshot(req.body(axum::body::Body::from(body)).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        (status, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap())
    }

    /// Pushes one row of driver 7777 with event (and created) time `event`, `to` a
    /// store or both.
    async fn push_7777(&self, event: i64, rate: f64, to: &'static str) {
        let at = quiver_sdk::types::format_instant(event);
        let body = serde_json::json!({"feature_view": "driver_hourly", "to": to, "df": {"driver_id": [7777],
            "event_timestamp": [at], "created_timestamp": [at], "conv_rate": [rate], "acc_rate": [0.5], "avg_daily_trips": [3]}});
        let (status, answer) = self.call("/push", body.to_string()).await;
        assert_eq!(status, 200, "{answer}");
    }
}

/// `verify --since --as-arrived` judges an answer by the rows that had arrived offline
/// around its request time. Driver 7777's answers, at real times: (1) its first row,
/// served; then a row from *before* that request arrives 3 s after it — the event time
/// rule calls answer 1 wrong, arrival calls it right; (2) that row, served; then a newer
/// row arrives offline only, and 3 s later (3) the older one is still served: online
/// trails offline, wrong by both rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_as_arrived_judges_answers_by_what_had_arrived() {
    let tmp = tempfile::tempdir().unwrap();
    let served = Served::start(&tmp.path().join("demo")).await;
    let (repo, defs, log) = (&served.repo, &served.defs, &served.log);
    let call = |uri: &'static str, body: String| served.call(uri, body);
    let now = || chrono::Utc::now().timestamp_micros();
    let push = |event: i64, rate: f64, to: &'static str| served.push_7777(event, rate, to);
    let ask = || async {
        let body = r#"{"entities": {"driver_id": [7777]}, "features": ["driver_hourly:conv_rate"]}"#;
        let (status, answer) = call("/get-online-features", body.to_string()).await;
        assert_eq!(status, 200, "{answer}");
        answer["results"][1]["values"][0].as_f64().unwrap()
    };
    let began = now();
    push(began - 60_000_000, 0.1, "online_and_offline").await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let asked = now();
    assert_eq!(ask().await, 0.1);
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    // An event from before answer 1 arrives now (3 s after it).
    push(asked - 1_000_000, 0.2, "online_and_offline").await;
    assert_eq!(ask().await, 0.2);
    push(now(), 0.3, "offline").await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(ask().await, 0.2, "online never got 0.3");
    log.flush().await.unwrap();
    let until = now() + 1;
    let kernel = quiver_gpu_join::CpuKernel::new();
    let rate = |r: &crate::verify::LogReport| {
        let f = r.features.iter().find(|f| f.feature == "driver_hourly:conv_rate").unwrap().clone();
        (f.compared, f.matches, f.examples)
    };
    let by_event =
        crate::verify::verify_log(&repo.config, defs, began, until, crate::verify::Rule::EventTime { created_cutoff: false }, &kernel)
            .await
            .unwrap();
    let (compared, matches, examples) = rate(&by_event);
    assert_eq!((compared, matches), (3, 1), "{examples:?}");
    let arrived = crate::verify::Rule::AsArrived { lag_us: 2_000_000 };
    let (compared, matches, examples) = rate(&crate::verify::verify_log(&repo.config, defs, began, until, arrived, &kernel).await.unwrap());
    assert_eq!((compared, matches), (3, 2), "{examples:?}");
    assert!(
        examples.len() == 1 && examples[0].contains("served PRESENT 0.2") && examples[0].contains("offline PRESENT 0.3"),
        "{examples:?}"
    );
}

/// `verify --as-arrived` checks the moments within the lag a step apart (an eighth of
/// it), and then, for an answer none of them agrees with, every state the offline store
/// passed through within the lag: a state shorter than a step is one none of the
/// moments may land in. Driver 7777: a row arrives online and offline, a newer one
/// offline only right after, and the answer then (the first row, the store's state
/// between the two commits) is right; with a lag of 60 s the moments are 7.5 s apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_as_arrived_finds_a_state_shorter_than_its_step() {
    let tmp = tempfile::tempdir().unwrap();
    let served = Served::start(&tmp.path().join("demo")).await;
    let now = || chrono::Utc::now().timestamp_micros();
    let began = now();
    served.push_7777(began - 2_000_000, 0.1, "online_and_offline").await;
    served.push_7777(began - 1_000_000, 0.2, "offline").await;
    let body = r#"{"entities": {"driver_id": [7777]}, "features": ["driver_hourly:conv_rate"]}"#;
    let (status, answer) = served.call("/get-online-features", body.to_string()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][1]["values"][0].as_f64(), Some(0.1));
    let asked = now();
    assert!(asked - began < 7_000_000, "the pushes and the lookup took {} s: past a step of the grid", (asked - began) / 1_000_000);
    served.log.flush().await.unwrap();
    let kernel = quiver_gpu_join::CpuKernel::new();
    let arrived = crate::verify::Rule::AsArrived { lag_us: 60_000_000 };
    let report = crate::verify::verify_log(&served.repo.config, &served.defs, began, now() + 1, arrived, &kernel).await.unwrap();
    let f = report.features.iter().find(|f| f.feature == "driver_hourly:conv_rate").unwrap();
    assert_eq!((f.compared, f.matches), (1, 1), "{:?} {:?}", f.examples, report.skipped);
}
