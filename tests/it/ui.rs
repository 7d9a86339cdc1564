//! The web UI (docs/online.md): its JSON endpoints through the router against golden JSON
//! worked out by hand from a small repository, the token rule (the page is public, the
//! endpoints are not), and the page itself in headless Chromium on the demo repository:
//! the rendered DOM shows the views, features, services and freshness, the lookup panel
//! answers, and screenshots are kept under `target/ui-screenshots/`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common;

const FEATURES: &str = r#"entities:
  - name: rider
    join_keys: [{name: rider_id, dtype: int64}]
feature_views:
  - name: trips
    entities: [rider]
    ttl: 2h
    source:
      timestamp_field: event_timestamp
      created_timestamp_field: created_timestamp
      stream: {topic: trips_topic, format: json}
    features:
      - {name: fare, dtype: float64}
      - {name: n, dtype: int64}
      - {name: city, dtype: string}
feature_services:
  - name: ranker
    features: [trips:fare, trips:city]
"#;

/// 2026-01-01T03:00:00Z, the server's clock in these tests.
const NOW: i64 = 1_767_236_400_000_000;

/// The servers here answer in-process; the address is never bound.
const ANY_PORT: std::net::SocketAddr = std::net::SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0));

/// Six trips between 00:30 and 02:30 on 2026-01-01; fares 0, 10, 20, 20, 100 and one
/// missing; n 1..=6; no city missing.
fn repository(dir: &Path) {
    common::ok(dir.parent().unwrap(), &["init", dir.file_name().unwrap().to_str().unwrap()]);
    std::fs::write(dir.join("features.yaml"), FEATURES).unwrap();
    common::ok(dir, &["apply"]);
    let fares = [Some(0.0), Some(10.0), Some(20.0), Some(20.0), Some(100.0), None];
    let lines: Vec<String> = (0..6)
        .map(|i| {
            let t = format!("2026-01-01T{:02}:{:02}:00Z", (30 + i * 24) / 60, (30 + i * 24) % 60);
            json!({"rider_id": i % 3, "event_timestamp": t, "created_timestamp": t, "fare": fares[i], "n": i + 1, "city": format!("c{i}")})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("trips.jsonl"), lines.join("\n") + "\n").unwrap();
    common::ok(dir, &["ingest", "trips", "trips.jsonl"]);
    common::ok(dir, &["materialize-incremental", "2026-01-01T02:00:00Z"]);
}

async fn get(router: &axum::Router, path: &str, token: Option<&str>) -> (StatusCode, Vec<u8>) {
    let mut request = Request::get(path);
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    let response = router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    (status, axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap().to_vec())
}

fn parse(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_answer_what_the_repository_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    repository(&dir);
    common::ok(&dir, &["verify", "--sample", "10"]);
    // Two stream processes' /metrics (as `quiver stream --metrics-port` words them: lag
    // per partition) and one that is not there.
    let metrics = [
        "quiver_stream_lag{topic=\"trips_topic\",partition=\"0\"} 5\nquiver_stream_lag{topic=\"other\",partition=\"0\"} 9\n",
        "# TYPE quiver_stream_lag gauge\nquiver_stream_lag{topic=\"trips_topic\",partition=\"1\"} 7\n",
    ];
    let mut urls: Vec<String> = metrics.iter().map(|body| serve_text(body)).collect();
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    urls.push(format!("http://127.0.0.1:{gone}/metrics"));
    let mut repo = quiver::Repo::open(&dir).unwrap();
    repo.config.server.stream_metrics = urls;
    let store = quiver::online::open_store(&repo.config).await.unwrap();
    let mut state = repo.serve(ANY_PORT).with_store(store.clone()).state().await.unwrap();
    state.clock = Box::new(|| NOW);
    let router = quiver::online::server::router(Arc::new(state));

    // Freshness: newest event 02:30, 30 minutes before the clock, inside the 2h ttl;
    // materialized until 02:00 from table version 1.
    let (status, body) = get(&router, "/api/freshness", None).await;
    assert_eq!(status, StatusCode::OK);
    let mut freshness = parse(&body);
    let errors = freshness["stream_errors"].take();
    assert_eq!(errors.as_array().map(Vec::len), Some(1), "{errors}");
    assert!(errors[0].as_str().unwrap().starts_with(&format!("http://127.0.0.1:{gone}/metrics: ")), "{errors}");
    let store_name = freshness["views"][0]["materialized"][0]["store"].take();
    assert!(store_name.as_str().is_some_and(|s| s.starts_with("embedded")), "{store_name}");
    assert_eq!(
        freshness,
        json!({"now": "2026-01-01T03:00:00Z", "views": [{
            "view": "trips", "online": true, "ttl_seconds": 7200, "table_version": 1, "rows": 6,
            "newest_event": "2026-01-01T02:30:00Z", "age_seconds": 1800, "stale": false,
            "materialized": [{"store": null, "until": "2026-01-01T02:00:00Z", "table_version": 1}],
            "stream": {"topic": "trips_topic", "lag": 12},
        }], "stream_errors": null})
    );

    // Statistics: 20 bins. fare over [0, 100] (bins of 5): 0 -> 0, 10 -> 2, 20 -> 4
    // twice, 100 -> the last; n over [1, 6] (bins of 0.25): 1..6 -> 0, 4, 8, 12, 16, 19.
    let (status, body) = get(&router, "/api/statistics/trips", None).await;
    assert_eq!(status, StatusCode::OK);
    let mut fare_bins = vec![0u64; 20];
    for b in [0, 2, 4, 4, 19] {
        fare_bins[b] += 1;
    }
    let mut n_bins = vec![0u64; 20];
    for b in [0, 4, 8, 12, 16, 19] {
        n_bins[b] += 1;
    }
    assert_eq!(
        parse(&body),
        json!({"view": "trips", "table_version": 1, "rows": 6, "features": [
            {"name": "fare", "dtype": "float64", "nulls": 1, "null_rate": 1.0 / 6.0, "min": 0.0, "max": 100.0,
             "histogram": {"lo": 0.0, "hi": 100.0, "counts": fare_bins}},
            {"name": "n", "dtype": "int64", "nulls": 0, "null_rate": 0.0, "min": 1.0, "max": 6.0,
             "histogram": {"lo": 1.0, "hi": 6.0, "counts": n_bins}},
            {"name": "city", "dtype": "string", "nulls": 0, "null_rate": 0.0},
        ]})
    );
    let (status, body) = get(&router, "/api/statistics/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{}", String::from_utf8_lossy(&body));

    // The verify run above stored its report: 3 riders compared per feature.
    let (status, body) = get(&router, "/api/verify-reports", None).await;
    assert_eq!(status, StatusCode::OK);
    let reports = parse(&body);
    let reports = reports["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0]["kind"], "sample");
    let compared: Vec<(String, u64)> = reports[0]["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["feature"].as_str().unwrap().to_string(), f["compared"].as_u64().unwrap()))
        .collect();
    assert_eq!(compared, vec![("trips:fare".into(), 3), ("trips:n".into(), 3), ("trips:city".into(), 3)]);

    // The registry with its version; the page and its assets.
    let (_, body) = get(&router, "/api/registry", None).await;
    let registry = parse(&body);
    assert_eq!((registry["project"].as_str(), registry["version"].as_u64()), (Some("repo"), Some(1)));
    assert_eq!(registry["definitions"]["feature_views"][0]["name"], "trips");
    let history = registry["history"].as_array().unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0]["version"], 1);
    assert!(history[0]["changes"].as_array().unwrap().iter().any(|c| c == "+ feature_view trips"), "{history:?}");
    for path in ["/ui", "/ui/app.js", "/ui/app.css"] {
        let (status, body) = get(&router, path, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(body.len() > 500, "{path}: {} bytes", body.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_page_is_public_and_the_endpoints_are_not() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    repository(&dir);
    let repo = quiver::Repo::open(&dir).unwrap();
    let mut state = repo.serve(ANY_PORT).state().await.unwrap();
    state.auth_token = Some("s3cret".into());
    let router = quiver::online::server::router(Arc::new(state));
    assert_eq!(get(&router, "/ui", None).await.0, StatusCode::OK);
    assert_eq!(get(&router, "/ui/app.js", None).await.0, StatusCode::OK);
    for path in ["/api/registry", "/api/freshness", "/api/statistics/trips", "/api/verify-reports", "/api/monitor-reports"] {
        assert_eq!(get(&router, path, None).await.0, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(get(&router, path, Some("wrong")).await.0, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(get(&router, path, Some("s3cret")).await.0, StatusCode::OK, "{path}");
    }
}

/// Answers every request on a loopback port with `body` (a stream process's metrics
/// text); its URL.
fn serve_text(body: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://127.0.0.1:{port}/metrics")
}

/// Chromium (`QUIVER_TEST_CHROMIUM`, or `chromium` on the PATH); see the skip rule of
/// the other services.
fn chromium() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("QUIVER_TEST_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let found = std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("chromium")).find(|p| p.is_file()));
    if found.is_none() {
        assert!(std::env::var("QUIVER_REQUIRE_CHROMIUM").is_err(), "QUIVER_REQUIRE_CHROMIUM is set but no chromium");
        eprintln!("SKIPPED the page in headless Chromium: no chromium (apt install chromium, or use ./run test)");
    }
    found
}

/// Headless Chromium on `url`: the DOM after the page's scripts ran, and a screenshot.
fn browse(chromium: &Path, url: &str, screenshot: &Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let common_args = [
        "--headless=new".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-dev-shm-usage".into(),
        format!("--user-data-dir={}", profile.path().display()),
        "--virtual-time-budget=8000".into(),
        "--window-size=1280,900".into(),
    ];
    let dom = std::process::Command::new(chromium).args(&common_args).arg("--dump-dom").arg(url).output().unwrap();
    assert!(dom.status.success(), "chromium: {}", String::from_utf8_lossy(&dom.stderr));
    let shot = std::process::Command::new(chromium)
        .args(&common_args)
        .arg(format!("--screenshot={}", screenshot.display()))
        .arg(url)
        .output()
        .unwrap();
    assert!(shot.status.success() && screenshot.is_file(), "chromium screenshot: {}", String::from_utf8_lossy(&shot.stderr));
    String::from_utf8(dom.stdout).unwrap()
}

#[test]
fn the_page_renders_the_demo_repository_in_headless_chromium() {
    let Some(chromium) = chromium() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    assert!(common::quiver(tmp.path(), &["init", "repo", "--demo"], &[]).status.success());
    let dir = tmp.path().join("repo");
    let on_demand = "\non_demand_views:\n  - name: scoring\n    inputs: [driver_hourly]\n    request: [{name: amount, dtype: float64}]\n    \
                     features: [{name: conv_x_acc, dtype: float64, expr: \"driver_hourly.conv_rate * driver_hourly.acc_rate\"}]\n";
    let mut features = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    features.push_str(on_demand);
    std::fs::write(dir.join("features.yaml"), features).unwrap();
    common::ok(&dir, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        common::ok(&dir, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    common::ok(&dir, &["materialize-incremental", "now"]);
    common::ok(&dir, &["verify", "--sample", "50"]);
    // Two monitor runs: the training set against itself (quiet), then a profile whose
    // values moved (a breach, marked).
    common::ok(&dir, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "training"]);
    let features = "driver_hourly:conv_rate,driver_hourly:avg_daily_trips";
    common::ok(&dir, &["monitor", "--features", features, "--reference", "training:training", "--current", "training:training"]);
    let manifest = dir.join("training/manifest.json");
    let mut moved: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let original = moved.clone();
    // conv_rate as if every value had doubled: its mean, and every quantile, moved.
    let shifted = shifted_profile(&dir, &moved["profile"]["driver_hourly:conv_rate"]);
    moved["profile"]["driver_hourly:conv_rate"] = shifted;
    std::fs::create_dir_all(dir.join("moved")).unwrap();
    std::fs::write(dir.join("moved/manifest.json"), moved.to_string()).unwrap();
    let out =
        common::quiver(&dir, &["monitor", "--features", features, "--reference", "training:training", "--current", "training:moved"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(original["profile"].as_object().unwrap().len(), moved["profile"].as_object().unwrap().len());
    // A breaking change to a view with data: its version 2 beside version 1.
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    let changed = yaml.replacen("{name: avg_rating, dtype: float32}", "{name: avg_rating, dtype: float64}", 1);
    assert_ne!(changed, yaml);
    std::fs::write(dir.join("features.yaml"), changed).unwrap();
    assert!(common::ok(&dir, &["apply"]).contains("version 2 beside version 1"));
    // The CLI's answer, before the server holds the embedded store.
    let online = common::ok(&dir, &["online", "--features", "driver_hourly:conv_rate", "--entity", "driver_id=1001"]);
    let (server, port) = common::spawn_serve(&dir);
    let _server = KillOnDrop(server);
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let base = format!("http://127.0.0.1:{port}/ui");

    let registry = browse(&chromium, &format!("{base}#registry"), &shots.join("registry.png"));
    assert!(registry.contains(r#"data-ready="registry""#), "the page did not finish: {registry}");
    assert!(registry.contains("Registry versions"), "no registry versions");
    for name in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides", "ranker_v1", "conv_rate", "fare_sum_1h"] {
        assert!(registry.contains(name), "the registry page lacks {name}");
    }
    // Both versions of the view, each its own card, the latest marked.
    assert!(registry.contains(r#"data-name="driver_customer@2""#) && registry.contains(r#"data-name="driver_customer""#), "{registry}");
    assert!(registry.contains("version 2 (latest) of 1, 2") && registry.contains("version 1 of 1, 2"), "{registry}");
    // Each aggregation's hop: the default one a window gets, or the one it names.
    assert!(registry.contains("window 1h, hop 5m (default)"), "no default hop shown: {registry}");
    assert!(registry.contains("window 30m, hop 10m<"), "the named hop is not shown: {registry}");
    // An on-demand view: its inputs, request fields and expressions.
    assert!(registry.contains(r#"data-name="scoring""#) && registry.contains("on-demand view"), "no on-demand view: {registry}");
    assert!(registry.contains("driver_hourly.conv_rate * driver_hourly.acc_rate"), "no expression shown: {registry}");
    assert!(registry.contains("amount: float64"), "no request field shown: {registry}");
    let freshness = browse(&chromium, &format!("{base}#freshness"), &shots.join("freshness.png"));
    assert!(freshness.contains(r#"data-ready="freshness""#), "{freshness}");
    for view in ["driver_hourly", "customer_rides"] {
        assert!(freshness.contains(&format!(r#"data-view="{view}""#)), "no freshness row for {view}");
    }
    assert!(freshness.contains("class=\"age-bar\""), "no age bars");
    let stats = browse(&chromium, &format!("{base}#statistics"), &shots.join("statistics.png"));
    assert!(stats.contains("class=\"histogram\""), "no histogram on the statistics page");
    let lineage = browse(&chromium, &format!("{base}#lineage"), &shots.join("lineage.png"));
    assert!(lineage.contains("lineage-graph") && lineage.contains("ranker_v1"), "no lineage graph");
    // The graph `quiver lineage` reads: the training set from its manifest, the on-demand
    // feature, both versions' features.
    let training = std::fs::canonicalize(dir.join("training")).unwrap();
    for id in [
        format!("training_set:{}", training.display()),
        "on_demand_feature:scoring:conv_x_acc".to_string(),
        "feature:driver_customer@2:avg_rating".to_string(),
        "feature:driver_customer:avg_rating".to_string(),
    ] {
        assert!(lineage.contains(&format!(r#"data-id="{id}""#)), "the lineage page lacks {id}: {lineage}");
    }
    // One feature's lineage: its view, what reads it, nothing else.
    let around = browse(&chromium, &format!("{base}#lineage?node=feature:driver_hourly:conv_rate"), &shots.join("lineage-feature.png"));
    for id in ["feature_view:driver_hourly", "on_demand_feature:scoring:conv_x_acc", "feature_service:ranker_v1"] {
        assert!(around.contains(&format!(r#"data-id="{id}""#)), "the feature's lineage lacks {id}: {around}");
    }
    assert!(around.contains(&format!(r#"data-id="training_set:{}""#, training.display())), "{around}");
    assert!(!around.contains(r#"data-id="feature_view:customer_profile""#), "another view in the feature's lineage: {around}");
    assert!(around.contains("lineage-details"), "{around}");
    let consistency = browse(&chromium, &format!("{base}#consistency"), &shots.join("consistency.png"));
    assert!(consistency.contains("mismatch-chart"), "no mismatch chart");
    let monitoring = browse(&chromium, &format!("{base}#monitoring"), &shots.join("monitoring.png"));
    assert!(monitoring.contains(r#"data-ready="monitoring""#), "{monitoring}");
    for feature in ["driver_hourly:conv_rate", "driver_hourly:avg_daily_trips"] {
        assert!(monitoring.contains(&format!(r#"class="monitor-chart" data-feature="{feature}""#)), "no chart of {feature}: {monitoring}");
    }
    // conv_rate's second run crossed PSI and KS: two points marked; nothing else is.
    assert_eq!(monitoring.matches(r#"class="breach""#).count(), 2, "{monitoring}");
    assert!(monitoring.contains("latest: BREACH psi, ks"), "{monitoring}");

    // The lookup panel: driver 1001's conv_rate, as the CLI answers it.
    let lookup = browse(&chromium, &format!("{base}#lookup?features=driver_hourly:conv_rate&driver_id=1001"), &shots.join("lookup.png"));
    assert!(lookup.contains("id=\"lookup-table\""), "the lookup panel did not answer: {lookup}");
    let value = lookup.split("lookup-value").nth(2).and_then(|s| s.split('>').nth(1)).and_then(|s| s.split('<').next()).unwrap();
    assert!(online.contains(value), "the panel's {value} is not the CLI's answer: {online}");
    assert!(lookup.contains("curl -s -X POST"), "no curl command");
    eprintln!("screenshots in {}", shots.display());
    drop(_server);

    // With a token: the page loads without it, asks for it in its form and shows the
    // endpoint's refusal instead of data.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_quiver"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("QUIVER_")) {
        cmd.env_remove(k);
    }
    let guarded = cmd
        .current_dir(&dir)
        .env("QUIVER_SERVER_AUTH_TOKEN", "s3cret")
        .args(["serve", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _guarded = KillOnDrop(guarded);
    let began = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(began.elapsed().as_secs() < 30, "the server did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let page = browse(&chromium, &format!("http://127.0.0.1:{port}/ui#registry"), &shots.join("token.png"));
    assert!(page.contains(r#"id="token-form""#), "the page did not ask for the token: {page}");
    assert!(page.contains("/api/registry: 401"), "no refusal shown: {page}");
    assert!(!page.contains("driver_hourly"), "data shown without the token");
}

/// A server that goes when the test does, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The profile of the training set's conv_rate values doubled, as a manifest holds it.
fn shifted_profile(dir: &Path, original: &Value) -> Value {
    use arrow::array::{Array, AsArray, Float64Array};
    use quiver::{Profile, ProfileDoc};
    let mut profile = Profile::default();
    for entry in std::fs::read_dir(dir.join("training")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "parquet") {
            continue;
        }
        let file = std::fs::File::open(&path).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let column = batch.column_by_name("driver_hourly__conv_rate").unwrap().as_primitive::<arrow::datatypes::Float64Type>();
            let doubled: Float64Array = column.iter().map(|v| v.map(|v| v * 2.0)).collect();
            profile.add_array(&doubled as &dyn Array, quiver::sdk::DType::Float64);
        }
    }
    let doc = ProfileDoc::from(&profile);
    assert_eq!(Value::from(doc.count), original["count"], "every row profiled again");
    serde_json::to_value(doc).unwrap()
}
