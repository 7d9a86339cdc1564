//! The HTTP server, called through its router without a socket: Feast's wire shape,
//! statuses, every bad request kind, auth, limits, metrics, registry reloads, and 503
//! from a failing store; and through the listener, whose hot route must answer as the
//! router does ([`listener`]).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use quiver_online::server::{Metrics, RegistryCache, ServerState, router};
use quiver_online::{EmbeddedStore, OnlineStore, WriteRow};
use quiver_runtime::encoding::{KeyValue, OnlineRow, Value, store_key};
use quiver_sdk::definitions::fingerprint;
use quiver_sdk::registry::{FileRegistry, RegistryDoc};
use quiver_sdk::yaml::parse_definitions;
use serde_json::{Value as Json, json};
use tower::ServiceExt;

mod listener;
mod requests;

const DEFS: &str = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
feature_views:
  - {name: stats, entities: [driver], ttl: 2h, features: [{name: rate, dtype: float64}, {name: trips, dtype: int64}, {name: emb, dtype: list<float32>}]}
  - {name: pair, entities: [driver, customer], features: [{name: n, dtype: int32}]}
feature_services:
  - {name: ranker, features: ["stats:rate", "pair:n"]}
"#;

const NOW: i64 = 1_704_103_200_000_000; // 2024-01-01T10:00:00Z
const HOUR: i64 = 3_600_000_000;

struct Fixture {
    _dir: tempfile::TempDir,
    registry_path: std::path::PathBuf,
    state: Arc<ServerState>,
}

async fn fixture(store: Option<Arc<dyn OnlineStore>>, token: Option<&str>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let registry_path = dir.path().join("registry.json");
    let defs = parse_definitions(DEFS).unwrap();
    let doc = RegistryDoc::empty("p");
    let plan = doc.plan(&defs);
    FileRegistry::new(&registry_path).save(&doc.applied(&defs, &plan, chrono::Utc::now(), false)).unwrap();
    let store: Arc<dyn OnlineStore> = match store {
        Some(s) => s,
        None => Arc::new(EmbeddedStore::open(&dir.path().join("online.db")).unwrap()),
    };
    let stats = defs.feature_view("stats").unwrap();
    let pair = defs.feature_view("pair").unwrap();
    let row = |view, ts, values| OnlineRow { event_ts: ts, created_ts: i64::MIN, fingerprint: fingerprint(view), values }.encode();
    let rows = vec![
        // Fresh: PRESENT (a whole float stays a float on the wire).
        WriteRow {
            key: store_key("p", "stats", &[KeyValue::Int(1)]),
            row: row(stats, NOW - HOUR, vec![Value::Float64(50.0), Value::Int64(7), Value::ListFloat32(vec![0.5, 1.0])]),
            expire_at_ms: None,
        },
        // Three hours old with a 2h TTL: OUTSIDE_MAX_AGE.
        WriteRow {
            key: store_key("p", "stats", &[KeyValue::Int(2)]),
            row: row(stats, NOW - 3 * HOUR, vec![Value::Float64(0.25), Value::Int64(1), Value::Null]),
            expire_at_ms: None,
        },
        // Fresh, with a null rate: NULL_VALUE.
        WriteRow {
            key: store_key("p", "stats", &[KeyValue::Int(3)]),
            row: row(stats, NOW, vec![Value::Null, Value::Int64(2), Value::Null]),
            expire_at_ms: None,
        },
        WriteRow {
            key: store_key("p", "pair", &[KeyValue::Int(1), KeyValue::Str("c1".into())]),
            row: row(pair, NOW, vec![Value::Int32(4)]),
            expire_at_ms: None,
        },
    ];
    if store.name().starts_with("embedded") {
        store.write(&rows).await.unwrap();
    }
    let state = Arc::new(ServerState {
        store,
        registry: RegistryCache::new(registry_path.clone(), "p").unwrap(),
        project: "p".into(),
        auth_token: token.map(str::to_string),
        metrics: Metrics::default(),
        clock: Box::new(|| NOW),
        offline: None,
        serving_log: None,
        limits: quiver_online::server::Limits::default(),
        insights: None,
        pending: Default::default(),
    });
    Fixture { _dir: dir, registry_path, state }
}

async fn call(state: &Arc<ServerState>, method: &str, path: &str, body: Option<String>, token: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::builder().method(method).uri(path).header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(body.map_or_else(Body::empty, Body::from)).unwrap();
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// Posts a request; `body` is JSON text, so that the order of its keys is the client's
/// (a `json!` map would sort them).
async fn features(state: &Arc<ServerState>, body: impl ToString) -> (StatusCode, Json) {
    let (status, text) = call(state, "POST", "/get-online-features", Some(body.to_string()), None).await;
    (status, serde_json::from_str(&text).unwrap_or(Json::String(text)))
}

#[tokio::test]
async fn feast_shaped_answers_with_statuses() {
    let f = fixture(None, None).await;
    let (status, body) = features(
        &f.state,
        json!({
            "entities": {"driver_id": [1, 2, 3, 4]},
            "features": ["stats:rate", "stats:trips", "stats:emb"],
            "full_feature_names": true,
            "include_feature_view_version_metadata": false,
            "some_future_field": {"ignored": true}
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["metadata"]["feature_names"], json!(["driver_id", "stats__rate", "stats__trips", "stats__emb"]));
    let r = &body["results"];
    assert_eq!(r[0]["values"], json!([1, 2, 3, 4]));
    assert_eq!(r[0]["statuses"], json!(["PRESENT", "PRESENT", "PRESENT", "PRESENT"]));
    assert_eq!(r[1]["statuses"], json!(["PRESENT", "OUTSIDE_MAX_AGE", "NULL_VALUE", "NOT_FOUND"]));
    assert_eq!(r[1]["values"], json!([50.0, null, null, null]));
    assert_eq!(r[1]["event_timestamps"][0], "2024-01-01T09:00:00Z");
    assert_eq!(r[2]["values"], json!([7, null, 2, null]));
    assert_eq!(r[3]["values"][0], json!([0.5, 1.0]));
    // Floats stay floats in the JSON text itself: 50.0, never 50.
    let text = call(
        &f.state,
        "POST",
        "/get-online-features",
        Some(json!({"entities": {"driver_id": [1]}, "features": ["stats:rate"]}).to_string()),
        None,
    )
    .await
    .1;
    assert!(text.contains("[50.0]"), "{text}");
    assert!(text.contains("\"feature_names\":[\"driver_id\",\"rate\"]"), "short names by default: {text}");
    // The same list with full names: the server's plan for a list is kept per naming.
    let (_, body) =
        features(&f.state, json!({"entities": {"driver_id": [1]}, "features": ["stats:rate"], "full_feature_names": true})).await;
    assert_eq!(body["metadata"]["feature_names"], json!(["driver_id", "stats__rate"]));
    assert!(body["metadata"].get("feature_view_metadata").is_none(), "only when asked: {body}");
    // Feast's `include_feature_view_version_metadata`: each view read, its version.
    let asked = json!({"entities": {"driver_id": [1], "customer_id": ["c1"]}, "features": ["stats:rate", "pair:n", "stats@1:trips"],
        "include_feature_view_version_metadata": true});
    let (status, body) = features(&f.state, asked).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["metadata"]["feature_view_metadata"], json!([{"name": "stats", "version": 1}, {"name": "pair", "version": 1}]));
    assert_eq!(body["results"][2]["values"], json!([50.0]));
    let (status, body) =
        features(&f.state, json!({"entities": {"driver_id": [1]}, "features": ["stats:rate"], "include_feature_view_version_metadata": 1}))
            .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.to_string().contains("`include_feature_view_version_metadata` must be true or false, got 1"), "{body}");
}

/// Captures what the server hands its serving log.
#[derive(Default)]
struct Captured(std::sync::Mutex<Vec<quiver_online::serving_log::Served>>);

impl quiver_online::serving_log::ServingLog for Captured {
    fn log(&self, served: quiver_online::serving_log::Served) {
        self.0.lock().unwrap().push(served);
    }
}

/// Features of two views interleaved: each answer column holds its own feature's
/// values, statuses and times (the answer is held per view, row by row, until it is
/// written), and a serving log gets the same columns the client got.
#[tokio::test]
async fn interleaved_views_answer_each_feature_and_log_the_same() {
    let f = fixture(None, None).await;
    let log = Arc::new(Captured::default());
    let logged = Arc::new(ServerState {
        store: f.state.store.clone(),
        registry: RegistryCache::new(f.registry_path.clone(), "p").unwrap(),
        project: "p".into(),
        auth_token: None,
        metrics: Metrics::default(),
        clock: Box::new(|| NOW),
        offline: None,
        serving_log: Some(log.clone()),
        limits: quiver_online::server::Limits::default(),
        insights: None,
        pending: Default::default(),
    });
    let body = r#"{"entities": {"driver_id": [1, 2, 3, 9], "customer_id": ["c1", "c1", "c1", "c1"]},
                   "features": ["stats:trips", "pair:n", "stats:rate", "stats:emb"]}"#;
    let (status, answer) = features(&f.state, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (_, with_log) = features(&logged, body).await;
    assert_eq!(answer, with_log, "the serving log changes nothing in the answer");
    assert_eq!(answer["metadata"]["feature_names"], json!(["driver_id", "customer_id", "trips", "n", "rate", "emb"]));
    let r = &answer["results"];
    let (epoch, t7, t9, t10) = ("1970-01-01T00:00:00Z", "2024-01-01T07:00:00Z", "2024-01-01T09:00:00Z", "2024-01-01T10:00:00Z");
    assert_eq!(r[1]["values"], json!(["c1", "c1", "c1", "c1"]));
    assert_eq!(r[2]["values"], json!([7, null, 2, null]));
    assert_eq!(r[2]["statuses"], json!(["PRESENT", "OUTSIDE_MAX_AGE", "PRESENT", "NOT_FOUND"]));
    assert_eq!(r[2]["event_timestamps"], json!([t9, t7, t10, epoch]));
    assert_eq!(r[3]["values"], json!([4, null, null, null]));
    assert_eq!(r[3]["statuses"], json!(["PRESENT", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND"]));
    assert_eq!(r[3]["event_timestamps"], json!([t10, epoch, epoch, epoch]));
    assert_eq!(r[4]["values"], json!([50.0, null, null, null]));
    assert_eq!(r[4]["statuses"], json!(["PRESENT", "OUTSIDE_MAX_AGE", "NULL_VALUE", "NOT_FOUND"]));
    assert_eq!(r[5]["values"], json!([[0.5, 1.0], null, null, null]));
    assert_eq!(r[5]["statuses"], json!(["PRESENT", "OUTSIDE_MAX_AGE", "NULL_VALUE", "NOT_FOUND"]));
    assert_eq!(r[5]["event_timestamps"], json!([t9, t7, t10, epoch]));
    // The logged columns, written out here by hand, are the answer.
    let served = log.0.lock().unwrap();
    assert_eq!(served.len(), 1);
    assert_eq!((served[0].n_keys, served[0].columns.len()), (2, 6));
    for (i, c) in served[0].columns.iter().enumerate() {
        assert_eq!(answer["metadata"]["feature_names"][i], json!(c.name));
        let values: Vec<Json> =
            c.values.iter().map(|v| serde_json::from_str(&quiver_online::lookup::wire::value_json(v)).unwrap()).collect();
        assert_eq!(r[i]["values"], json!(values), "{}", c.name);
        assert_eq!(r[i]["statuses"], json!(c.statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>()), "{}", c.name);
        let times: Vec<String> = c.event_ts.iter().map(|t| quiver_sdk::types::format_instant(t.unwrap_or(0))).collect();
        assert_eq!(r[i]["event_timestamps"], json!(times), "{}", c.name);
    }
}

#[tokio::test]
async fn services_and_composite_keys() {
    let f = fixture(None, None).await;
    let (status, body) =
        features(&f.state, r#"{"entities": {"driver_id": [1, 1], "customer_id": ["c1", "c2"]}, "feature_service": "ranker"}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["metadata"]["feature_names"], json!(["driver_id", "customer_id", "rate", "n"]));
    assert_eq!(body["results"][3]["values"], json!([4, null]));
    assert_eq!(body["results"][3]["statuses"], json!(["PRESENT", "NOT_FOUND"]));
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let f = fixture(None, None).await;
    let cases = [
        // Unknown names are 400 whatever names them (a feature, a view, a service): they are in the body.
        (json!({"entities": {"driver_id": [1]}, "features": ["stats:speed"]}), StatusCode::BAD_REQUEST, "unknown feature `stats:speed`"),
        (json!({"entities": {"driver_id": [1]}, "features": ["nope:x"]}), StatusCode::BAD_REQUEST, "unknown feature view `nope`"),
        (
            json!({"entities": {"driver_id": [1]}, "features": ["rate"]}),
            StatusCode::BAD_REQUEST,
            "bad feature reference `rate` (expected `view:feature`)",
        ),
        (json!({"entities": {"driver_id": [1]}, "feature_service": "nope"}), StatusCode::BAD_REQUEST, "unknown feature service `nope`"),
        (json!({"entities": {"driver_id": [1]}}), StatusCode::BAD_REQUEST, "needs `features` or `feature_service`"),
        (json!({"features": ["stats:rate"]}), StatusCode::BAD_REQUEST, "needs `entities`"),
        (json!({"entities": {"customer_id": ["c1"]}, "features": ["pair:n"]}), StatusCode::BAD_REQUEST, "missing join key `driver_id`"),
        // A key of another view is not a key of the features asked for.
        (
            json!({"entities": {"customer_id": ["c1"]}, "features": ["stats:rate"]}),
            StatusCode::BAD_REQUEST,
            "`customer_id` is neither a join key nor a request field of the features asked for (allowed: `driver_id`)",
        ),
        // A misspelt key is named with the names allowed.
        (
            json!({"entities": {"driverid": [1]}, "features": ["stats:rate"]}),
            StatusCode::BAD_REQUEST,
            "`driverid` is neither a join key nor a request field of the features asked for (allowed: `driver_id`)",
        ),
        // A field of the wrong type is refused, not read as its default.
        (
            json!({"entities": {"driver_id": [1]}, "features": ["stats:rate"], "full_feature_names": "yes"}),
            StatusCode::BAD_REQUEST,
            "`full_feature_names` must be true or false, got \"yes\"",
        ),
        (json!({"entities": {"driver_id": ["one"]}, "features": ["stats:rate"]}), StatusCode::BAD_REQUEST, "join key `driver_id` is int64"),
        (json!({"entities": {"driver_id": [1.5]}, "features": ["stats:rate"]}), StatusCode::BAD_REQUEST, "is not an integer or a string"),
        (
            json!({"entities": {"customer_id": ["c1"], "driver_id": [1, 2]}, "features": ["pair:n"]}),
            StatusCode::BAD_REQUEST,
            "has 2 values, the first has 1",
        ),
        (
            json!({"entities": {"driver_id": (0..10_001).collect::<Vec<_>>()}, "features": ["stats:rate"]}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "at most 10000",
        ),
    ];
    for (body, code, part) in cases {
        let (status, answer) = features(&f.state, body.clone()).await;
        assert_eq!(status, code, "{body}: {answer}");
        let message = answer["error"].as_str().unwrap_or_else(|| panic!("no error field: {answer}"));
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
    let (status, text) = call(&f.state, "POST", "/get-online-features", Some("{not json".into()), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("request body is not a valid request"), "{text}");
    let huge = format!("{{\"entities\": {{\"driver_id\": [1]}}, \"features\": [\"stats:rate\"], \"pad\": \"{}\"}}", "x".repeat(2 << 20));
    assert_eq!(call(&f.state, "POST", "/get-online-features", Some(huge), None).await.0, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn health_registry_metrics_and_auth() {
    let f = fixture(None, Some("s3cret")).await;
    assert_eq!(call(&f.state, "GET", "/registry", None, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(call(&f.state, "GET", "/registry", None, Some("wrong")).await.0, StatusCode::UNAUTHORIZED);
    let body = r#"{"entities": {"driver_id": [1]}, "features": ["stats:rate"]}"#.to_string();
    assert_eq!(call(&f.state, "POST", "/get-online-features", Some(body.clone()), None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(call(&f.state, "POST", "/get-online-features", Some(body), Some("s3cret")).await.0, StatusCode::OK);
    // Health checks need no token.
    let (status, body) = call(&f.state, "GET", "/health", None, None).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "{\"status\":\"ok\"}"));
    assert_eq!(call(&f.state, "GET", "/no/such/path", None, Some("s3cret")).await.0, StatusCode::NOT_FOUND);
    let (status, body) = call(&f.state, "GET", "/registry", None, Some("s3cret")).await;
    assert_eq!(status, StatusCode::OK);
    let defs: Json = serde_json::from_str(&body).unwrap();
    assert_eq!(defs["feature_views"][0]["name"], "stats");
    let (_, text) = call(&f.state, "GET", "/metrics", None, Some("s3cret")).await;
    assert!(text.contains("quiver_requests_total{route=\"/registry\",status=\"401\"} 2"), "{text}");
    assert!(text.contains("quiver_requests_total{route=\"/registry\",status=\"200\"} 1"), "{text}");
    assert!(text.contains("quiver_requests_total{route=\"/get-online-features\",status=\"200\"} 1"), "{text}");
    assert!(text.contains("quiver_requests_total{route=\"other\",status=\"404\"} 1"), "{text}");
    assert!(text.contains("quiver_request_seconds_count{route=\"/get-online-features\"} 2"), "{text}");
    // The phases of the one answered lookup (the refused one has none), in one family.
    for phase in ["parse", "keys", "store", "decode", "encode"] {
        assert!(text.contains(&format!("quiver_request_phase_seconds_count{{phase=\"{phase}\"}} 1")), "{phase}: {text}");
        assert!(text.contains(&format!("quiver_request_phase_seconds_bucket{{phase=\"{phase}\",le=\"+Inf\"}} 1")), "{phase}: {text}");
    }
    assert_eq!(text.matches("# TYPE quiver_request_phase_seconds histogram").count(), 1, "{text}");
}

#[tokio::test]
async fn the_registry_is_reloaded_when_apply_changes_it() {
    let f = fixture(None, None).await;
    let body = json!({"entities": {"driver_id": [1]}, "features": ["stats:rate"]});
    assert_eq!(features(&f.state, body.clone()).await.0, StatusCode::OK);
    // A new registry version without the view: seen within REGISTRY_CHECK, no restart
    // (and the plan kept for this feature list is not used with the new definitions).
    std::thread::sleep(std::time::Duration::from_millis(20));
    let registry = FileRegistry::new(&f.registry_path);
    let doc = registry.load().unwrap().unwrap();
    let mut defs = doc.definitions.clone();
    defs.feature_services.clear();
    defs.feature_views.retain(|v| v.name != "stats");
    let plan = doc.plan(&defs);
    let without = doc.applied(&defs, &plan, chrono::Utc::now(), true);
    registry.save(&without).unwrap();
    std::thread::sleep(quiver_online::server::REGISTRY_CHECK + std::time::Duration::from_millis(20));
    let (status, answer) = features(&f.state, body.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("unknown feature view `stats`"));
    // The view applied again: a request naming it is answered at once — a lookup of
    // something the definitions do not know looks at the file without waiting.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let plan = without.plan(&doc.definitions);
    registry.save(&without.applied(&doc.definitions, &plan, chrono::Utc::now(), true)).unwrap();
    let (status, answer) = features(&f.state, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["metadata"]["feature_names"], json!(["driver_id", "rate"]));
}

/// A store that is down.
#[derive(Debug)]
struct Down;

#[async_trait::async_trait]
impl OnlineStore for Down {
    fn name(&self) -> String {
        "down".into()
    }
    async fn write(&self, _: &[WriteRow]) -> quiver_online::Result<usize> {
        Err(quiver_online::Error::Unavailable { store: "down".into(), message: "connection refused".into() })
    }
    async fn read(&self, _: &[String]) -> quiver_online::Result<Vec<Option<Vec<u8>>>> {
        Err(quiver_online::Error::Unavailable { store: "down".into(), message: "connection refused".into() })
    }
}

#[tokio::test]
async fn an_unavailable_store_gives_503_and_is_counted() {
    let f = fixture(Some(Arc::new(Down)), None).await;
    let (status, answer) = features(&f.state, json!({"entities": {"driver_id": [1]}, "features": ["stats:rate"]})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer["error"], "online store unavailable");
    let (_, text) = call(&f.state, "GET", "/metrics", None, None).await;
    assert!(text.contains("quiver_store_errors_total 1"), "{text}");
}

/// Starts a throwaway redis-server on `port`; returns its pid file.
fn start_redis(port: u16, dir: &std::path::Path) -> std::path::PathBuf {
    let pid = dir.join(format!("redis-{port}.pid"));
    let status = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "yes"])
        .arg("--pidfile")
        .arg(&pid)
        .status()
        .expect("redis-server runs");
    assert!(status.success());
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed().as_secs() < 10, "redis did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    pid
}

fn stop_redis(pid: &std::path::Path) {
    let pid = std::fs::read_to_string(pid).unwrap();
    std::process::Command::new("kill").arg(pid.trim()).status().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_gives_503_quickly_and_serving_recovers_when_it_returns() {
    if std::process::Command::new("redis-server").arg("--version").output().is_err() {
        assert!(std::env::var("QUIVER_REQUIRE_REDIS").is_err(), "QUIVER_REQUIRE_REDIS is set but redis-server is missing");
        eprintln!("SKIPPED redis_down_gives_503...: no redis-server binary (use ./run test)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let pid = start_redis(port, dir.path());
    let store = quiver_online::RedisStore::connect(&format!("redis://127.0.0.1:{port}/0")).await.unwrap();
    let f = fixture(Some(Arc::new(store.clone())), None).await;
    let key = store_key("p", "stats", &[KeyValue::Int(1)]);
    let stats = parse_definitions(DEFS).unwrap();
    let row = OnlineRow {
        event_ts: NOW,
        created_ts: i64::MIN,
        fingerprint: fingerprint(stats.feature_view("stats").unwrap()),
        values: vec![Value::Float64(2.5), Value::Int64(1), Value::Null],
    };
    let write = [WriteRow { key, row: row.encode(), expire_at_ms: None }];
    store.write(&write).await.unwrap();
    let body = r#"{"entities": {"driver_id": [1]}, "features": ["stats:rate"]}"#;
    assert_eq!(features(&f.state, body).await.1["results"][1]["values"], json!([2.5]));

    stop_redis(&pid);
    let started = std::time::Instant::now();
    let (status, answer) = features(&f.state, body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "503 took {:?}", started.elapsed());

    // Redis returns (empty: no persistence); the server reconnects by itself.
    let pid = start_redis(port, dir.path());
    store.write(&write).await.ok();
    let mut recovered = false;
    for _ in 0..50 {
        let (status, answer) = features(&f.state, body).await;
        if status == StatusCode::OK {
            store.write(&write).await.unwrap();
            let (_, answer) = features(&f.state, body).await;
            assert_eq!(answer["results"][1]["values"], json!([2.5]));
            recovered = true;
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    stop_redis(&pid);
    assert!(recovered, "serving did not recover after Redis came back");
}

#[tokio::test]
async fn push_writes_online_through_the_guarded_write() {
    let f = fixture(None, None).await;
    let push = |body: &str| {
        let state = f.state.clone();
        let body = body.to_string();
        async move {
            let (status, text) = call(&state, "POST", "/push", Some(body), None).await;
            (status, serde_json::from_str::<Json>(&text).unwrap())
        }
    };
    // `pair` has no TTL, so its keys never expire (the store's own clock is the real
    // one, while this server answers at a fixed 2024 time).
    let (status, answer) = push(
        r#"{"feature_view": "pair", "to": "online", "df": {
        "driver_id": [7, 8], "customer_id": ["a", "b"],
        "event_timestamp": ["2024-01-01T09:30:00Z", "2024-01-01T10:00:00+01:00"],
        "n": [5, null], "extra_column": [1, 2]}}"#,
    )
    .await;
    assert_eq!((status, &answer), (StatusCode::OK, &json!({"rows": 2, "online_written": 2})));
    let query = r#"{"entities": {"driver_id": [7, 8], "customer_id": ["a", "b"]}, "features": ["pair:n"]}"#;
    let (_, got) = features(&f.state, query).await;
    assert_eq!(got["results"][2]["values"], json!([5, null]), "{got}");
    assert_eq!(got["results"][2]["statuses"], json!(["PRESENT", "NULL_VALUE"]));
    assert_eq!(got["results"][2]["event_timestamps"][1], "2024-01-01T09:00:00Z");
    // An older row for (7, a) is ignored; the stored one stays.
    let (_, answer) = push(r#"{"push_source_name": "pair", "to": "online", "df": {"driver_id": [7], "customer_id": ["a"], "event_timestamp": ["2024-01-01T09:00:00Z"], "n": [9]}}"#).await;
    assert_eq!(answer, json!({"rows": 1, "online_written": 0}));
    let (_, got) = features(&f.state, query).await;
    assert_eq!(got["results"][2]["values"], json!([5, null]));

    let bad_cases = [
        (r#"{"feature_view": "nope", "df": {}}"#, StatusCode::BAD_REQUEST, "unknown feature view `nope`"),
        (
            r#"{"feature_view": "stats", "df": {"driver_id": [1], "event_timestamp": ["2024-01-01T09:00:00Z"], "rate": [1.0], "trips": [1]}}"#,
            StatusCode::BAD_REQUEST,
            "df lacks column `emb`",
        ),
        (
            r#"{"feature_view": "stats", "df": {"driver_id": [1], "event_timestamp": ["2024-01-01T09:00:00"], "rate": [1.0], "trips": [1], "emb": [null]}}"#,
            StatusCode::BAD_REQUEST,
            "row 1: `event_timestamp`: `2024-01-01T09:00:00` has no time zone",
        ),
        (
            r#"{"feature_view": "stats", "df": {"driver_id": [1], "event_timestamp": ["2024-01-01T09:00:00Z"], "rate": ["high"], "trips": [1], "emb": [null]}}"#,
            StatusCode::BAD_REQUEST,
            "row 1: feature `rate` must be float64",
        ),
        (
            r#"{"feature_view": "stats", "df": {"driver_id": ["x"], "event_timestamp": ["2024-01-01T09:00:00Z"], "rate": [1.0], "trips": [1], "emb": [null]}}"#,
            StatusCode::BAD_REQUEST,
            "row 1: join key `driver_id` must be int64, got \"x\"",
        ),
        (
            r#"{"feature_view": "stats", "df": {"driver_id": [1, 2], "event_timestamp": ["2024-01-01T09:00:00Z"], "rate": [1.0], "trips": [1], "emb": [null]}}"#,
            StatusCode::BAD_REQUEST,
            "has 1 value, another has 2",
        ),
        (
            r#"{"feature_view": "stats", "df": {"driver_id": [1], "event_timestamp": ["2024-01-01T09:00:00Z"], "rate": [1.5], "trips": [1.5], "emb": [null]}}"#,
            StatusCode::BAD_REQUEST,
            "row 1: feature `trips` must be int64, got 1.5",
        ),
        (
            r#"{"feature_view": "stats", "df": {"driver_id": [], "event_timestamp": [], "rate": [], "trips": [], "emb": []}}"#,
            StatusCode::BAD_REQUEST,
            "no rows",
        ),
        (r#"{"feature_view": "stats", "to": "everywhere", "df": {"driver_id": [1]}}"#, StatusCode::BAD_REQUEST, "`to` is `everywhere`"),
        // This server was built without an offline writer.
        (
            r#"{"feature_view": "stats", "to": "offline", "df": {"driver_id": [1], "event_timestamp": ["2024-01-01T09:00:00Z"], "rate": [1.0], "trips": [1], "emb": [null]}}"#,
            StatusCode::NOT_IMPLEMENTED,
            "no offline store",
        ),
        (r#"{"feature_view": "stats"}"#, StatusCode::BAD_REQUEST, "not a valid push"),
    ];
    for (body, code, part) in bad_cases {
        let (status, answer) = push(body).await;
        assert_eq!(status, code, "{body}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains(part), "{answer} lacks {part:?}");
    }
}

/// NaN and the infinities are values: answered `PRESENT` as the strings of protobuf's
/// JSON mapping (`"NaN"`, `"Infinity"`, `"-Infinity"`, as Feast's server answers them),
/// alone and as list items, never as `null` (docs/online.md).
#[tokio::test]
async fn non_finite_floats_are_answered_as_strings() {
    let f = fixture(None, None).await;
    let defs = parse_definitions(DEFS).unwrap();
    let stats = defs.feature_view("stats").unwrap();
    let rows: Vec<WriteRow> = [(21, f64::NAN), (22, f64::INFINITY), (23, f64::NEG_INFINITY)]
        .into_iter()
        .map(|(driver, rate)| {
            let values = vec![Value::Float64(rate), Value::Int64(1), Value::ListFloat32(vec![f32::NAN, 1.0, f32::NEG_INFINITY])];
            let row = OnlineRow { event_ts: NOW - HOUR, created_ts: i64::MIN, fingerprint: fingerprint(stats), values }.encode();
            WriteRow { key: store_key("p", "stats", &[KeyValue::Int(driver)]), row, expire_at_ms: None }
        })
        .collect();
    assert_eq!(f.state.store.write(&rows).await.unwrap(), 3);
    let (status, body) =
        features(&f.state, r#"{"entities": {"driver_id": [21, 22, 23, 3]}, "features": ["stats:rate", "stats:emb"]}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let r = &body["results"];
    assert_eq!(r[1]["values"], json!(["NaN", "Infinity", "-Infinity", null]), "{body}");
    assert_eq!(r[1]["statuses"], json!(["PRESENT", "PRESENT", "PRESENT", "NULL_VALUE"]), "{body}");
    assert_eq!(r[2]["values"][0], json!(["NaN", 1.0, "-Infinity"]), "{body}");
    assert_eq!(r[2]["statuses"][0], "PRESENT", "{body}");
}
