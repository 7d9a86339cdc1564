//! The HTTP feature server (SPEC §6), in Feast's wire shape so Feast clients work.
//!
//! `router(state)` builds the axum `Router`; [`serve`] (in `listen`) binds it with the
//! connection limits and graceful shutdown. Routes: `POST /get-online-features`,
//! `POST /push`, `GET /health`, `GET /metrics` (Prometheus text), `GET /registry`.
//! Errors are JSON `{"error": "..."}` with 400 (bad request, unknown or duplicate
//! feature, a view that is not online), 401 (token), 404 (unknown feature service), 408
//! (body not sent in time), 413 (too large: body, entity rows, or entity rows x features
//! over `max_cells`), 503 (store unavailable or slow); store calls time out, and nothing
//! panics on bad input. The registry is re-read when its file changes, without a
//! restart; a registry that cannot be read keeps the last good definitions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use quiver_sdk::encoding::{KeyValue, Value};
use quiver_sdk::rows::ViewRow;
use quiver_sdk::{Definitions, FeatureRef, FileRegistry};
use serde_json::{Value as Json_, json};

pub use crate::listen::{serve, serve_until, shutdown_signal};
use crate::lookup::{Column, get_online_features};
use crate::serving_log::{Served, ServingLog};
use crate::store::OnlineStore;

/// Largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Most entity rows in one request (413 beyond).
pub const MAX_ENTITY_ROWS: usize = 10_000;
/// How long a store call may take before the request fails with 503.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// The definitions the server answers from, re-read when the registry file changes.
///
/// A registry that cannot be read (half-written by hand, deleted, another project's)
/// never takes the server down: the last good definitions stay, the failure is logged
/// once per change of the file and counted (`quiver_registry_errors_total`), and
/// `quiver_registry_stale` is 1 until a good registry is read again.
#[derive(Debug)]
pub struct RegistryCache {
    registry: FileRegistry,
    project: String,
    cached: RwLock<Cached>,
    errors: AtomicU64,
}

#[derive(Debug)]
struct Cached {
    /// The file's modification time when last looked at (`None`: missing).
    mtime: Option<SystemTime>,
    defs: Arc<Definitions>,
    /// The registry version `defs` came from (0: nothing applied yet).
    version: u64,
    /// Why the file's current content is not in use, when it is not.
    stale: Option<String>,
}

impl RegistryCache {
    /// # Errors
    /// When the registry exists and cannot be read (at start, there is no last good).
    pub fn new(path: PathBuf, project: &str) -> quiver_sdk::Result<RegistryCache> {
        let registry = FileRegistry::new(path);
        let mtime = mtime_of(registry.path());
        let doc = registry.load_or_empty(project)?;
        Ok(RegistryCache {
            registry,
            project: project.to_string(),
            cached: RwLock::new(Cached { mtime, defs: Arc::new(doc.definitions), version: doc.version, stale: None }),
            errors: AtomicU64::new(0),
        })
    }

    /// The current definitions: re-read when the file's modification time changed;
    /// the last good ones when the file cannot be read.
    pub fn current(&self) -> Arc<Definitions> {
        let mtime = mtime_of(self.registry.path());
        {
            let cached = self.cached.read().expect("registry lock");
            if cached.mtime == mtime {
                return cached.defs.clone();
            }
        }
        let mut cached = self.cached.write().expect("registry lock");
        if cached.mtime == mtime {
            return cached.defs.clone();
        }
        cached.mtime = mtime;
        let loaded = match mtime {
            // A registry that was applied to does not become "nothing applied".
            None if cached.version > 0 => Err("the file is missing".to_string()),
            _ => self.registry.load_or_empty(&self.project).map_err(|e| e.to_string()),
        };
        match loaded {
            Ok(doc) => {
                cached.defs = Arc::new(doc.definitions);
                cached.version = doc.version;
                cached.stale = None;
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    registry = %self.registry.path().display(),
                    error = %e,
                    version = cached.version,
                    "registry cannot be read; serving on with the last good definitions"
                );
                cached.stale = Some(e);
            }
        }
        cached.defs.clone()
    }

    /// Why the registry file is not in use (`None`: it is).
    pub fn stale(&self) -> Option<String> {
        self.cached.read().expect("registry lock").stale.clone()
    }

    fn metrics_text(&self) -> String {
        let stale = u8::from(self.stale().is_some());
        format!(
            "# TYPE quiver_registry_errors_total counter\nquiver_registry_errors_total {}\n# TYPE quiver_registry_stale gauge\nquiver_registry_stale {stale}\n# TYPE quiver_registry_version gauge\nquiver_registry_version {}\n",
            self.errors.load(Ordering::Relaxed),
            self.cached.read().expect("registry lock").version
        )
    }
}

fn mtime_of(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The bounds the server enforces (SPEC §13; `server:` and `max_future_skew` in
/// `quiver.yaml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Entity rows x features above which `/get-online-features` answers 413.
    pub max_cells: usize,
    /// Headers, and then the body, must arrive within this.
    pub request_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// How far after the server's clock a pushed event time may be, microseconds.
    pub max_future_skew_us: i64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::of(&quiver_sdk::config::ServerConfig::new("127.0.0.1", 0), Duration::from_secs(quiver_sdk::config::DEFAULT_MAX_FUTURE_SKEW_SECS))
    }
}

impl Limits {
    /// The limits of a server config, with the project's `max_future_skew`.
    pub fn of(server: &quiver_sdk::config::ServerConfig, max_future_skew: Duration) -> Limits {
        Limits {
            max_cells: server.max_cells,
            request_timeout: server.request_timeout,
            max_connections: server.max_connections,
            max_future_skew_us: i64::try_from(max_future_skew.as_micros()).unwrap_or(i64::MAX),
        }
    }
}

/// The limits whose refusals `/metrics` counts (`quiver_limit_refusals_total{limit}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    MaxCells,
    MaxEntityRows,
    MaxBody,
    RequestTimeout,
    MaxConnections,
    MaxFutureSkew,
}

impl Limit {
    const ALL: [Limit; 6] =
        [Limit::MaxCells, Limit::MaxEntityRows, Limit::MaxBody, Limit::RequestTimeout, Limit::MaxConnections, Limit::MaxFutureSkew];

    fn as_str(self) -> &'static str {
        match self {
            Limit::MaxCells => "max_cells",
            Limit::MaxEntityRows => "max_entity_rows",
            Limit::MaxBody => "max_body_bytes",
            Limit::RequestTimeout => "request_timeout",
            Limit::MaxConnections => "max_connections",
            Limit::MaxFutureSkew => "max_future_skew",
        }
    }
}

/// Request counts and latencies, as Prometheus text.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (route, status) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Latency histogram buckets (seconds) of /get-online-features.
    buckets: [AtomicU64; 10],
    latency_sum_us: AtomicU64,
    latency_count: AtomicU64,
    store_errors: AtomicU64,
    /// Refusals per [`Limit`], in [`Limit::ALL`] order.
    refusals: [AtomicU64; 6],
    connections: AtomicU64,
}

const BUCKETS: [f64; 10] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0];

impl Metrics {
    /// One request or connection refused by `limit`.
    pub fn refused(&self, limit: Limit) {
        let i = Limit::ALL.iter().position(|l| *l == limit).expect("listed");
        self.refusals[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections open now.
    pub fn connections_open(&self, n: usize) {
        self.connections.store(n as u64, Ordering::Relaxed);
    }

    fn record(&self, route: &str, status: u16, elapsed: Duration) {
        *self
            .requests
            .lock()
            .expect("metrics lock")
            .entry((route.to_string(), status))
            .or_default() += 1;
        if route == "/get-online-features" {
            let secs = elapsed.as_secs_f64();
            for (i, b) in BUCKETS.iter().enumerate() {
                if secs <= *b {
                    self.buckets[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            self.latency_sum_us.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
            self.latency_count.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn render(&self) -> String {
        let mut out = String::from("# TYPE quiver_requests_total counter\n");
        for ((route, status), n) in self.requests.lock().expect("metrics lock").iter() {
            out.push_str(&format!("quiver_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}\n"));
        }
        out.push_str("# TYPE quiver_request_seconds histogram\n");
        for (i, b) in BUCKETS.iter().enumerate() {
            out.push_str(&format!(
                "quiver_request_seconds_bucket{{route=\"/get-online-features\",le=\"{b}\"}} {}\n",
                self.buckets[i].load(Ordering::Relaxed)
            ));
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        out.push_str(&format!("quiver_request_seconds_bucket{{route=\"/get-online-features\",le=\"+Inf\"}} {count}\n"));
        out.push_str(&format!(
            "quiver_request_seconds_sum{{route=\"/get-online-features\"}} {}\n",
            self.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6
        ));
        out.push_str(&format!("quiver_request_seconds_count{{route=\"/get-online-features\"}} {count}\n"));
        out.push_str("# TYPE quiver_store_errors_total counter\n");
        out.push_str(&format!("quiver_store_errors_total {}\n", self.store_errors.load(Ordering::Relaxed)));
        out.push_str("# TYPE quiver_limit_refusals_total counter\n");
        for (limit, n) in Limit::ALL.iter().zip(&self.refusals) {
            out.push_str(&format!("quiver_limit_refusals_total{{limit=\"{}\"}} {}\n", limit.as_str(), n.load(Ordering::Relaxed)));
        }
        out.push_str("# TYPE quiver_connections_open gauge\n");
        out.push_str(&format!("quiver_connections_open {}\n", self.connections.load(Ordering::Relaxed)));
        out
    }
}

/// What every handler shares.
pub struct ServerState {
    pub store: Arc<dyn OnlineStore>,
    pub registry: RegistryCache,
    pub project: String,
    /// When set, requests need `Authorization: Bearer <token>`.
    pub auth_token: Option<String>,
    pub metrics: Metrics,
    /// The time lookups are answered at, UTC microseconds (injectable for tests).
    pub clock: Box<dyn Fn() -> i64 + Send + Sync>,
    /// Where `/push` with `to: offline` writes; `None` answers those with 501.
    pub offline: Option<Arc<dyn OfflineWriter>>,
    /// Where answers are logged (`serving_log` in quiver.yaml); `None`: not logged.
    pub serving_log: Option<Arc<dyn ServingLog>>,
    /// The bounds of SPEC §13.
    pub limits: Limits,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState").field("store", &self.store.name()).field("project", &self.project).finish()
    }
}

impl ServerState {
    /// One online-store call under [`STORE_TIMEOUT`], its error mapped once: a
    /// request that does not fit the registry is 400, a store that failed or is slow
    /// 503 (counted, the detail logged, not sent).
    async fn store_call<T>(&self, call: impl std::future::Future<Output = crate::Result<T>>) -> Result<T, ApiError> {
        match tokio::time::timeout(STORE_TIMEOUT, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if matches!(e.kind(), quiver_sdk::ErrorKind::Invalid | quiver_sdk::ErrorKind::NotFound) => Err(bad(e.to_string())),
            Ok(Err(e)) => Err(self.unavailable("online store", &e)),
            Err(_) => Err(self.unavailable("online store", &"timed out")),
        }
    }

    /// A 503 for `store`, counted; the detail goes to the log.
    fn unavailable(&self, store: &str, e: &dyn std::fmt::Display) -> ApiError {
        self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, "{store} failed");
        ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("{store} unavailable"))
    }
}

/// The system clock in UTC microseconds.
pub fn system_clock() -> Box<dyn Fn() -> i64 + Send + Sync> {
    Box::new(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    })
}

/// An error answer: a status and a one-line message, as `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// The router, without binding a socket (tests call it directly).
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/get-online-features", post(get_features))
        .route("/push", post(push))
        .route("/health", get(|| async { Json(json!({ "status": "ok" })) }))
        .route("/metrics", get(metrics))
        .route("/registry", get(registry))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// A router with `/metrics` alone, answering `render()`, behind the same bearer-token
/// rule as the server (for `quiver stream --metrics-port`).
pub fn metrics_router(render: impl Fn() -> String + Clone + Send + Sync + 'static, token: Option<String>) -> Router {
    Router::new().route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let (render, token) = (render.clone(), token.clone());
            async move {
                match &token {
                    Some(t) if !authorized(&headers, t) => {
                        ApiError(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()).into_response()
                    }
                    _ => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], render()).into_response(),
                }
            }
        }),
    )
}

/// Bearer-token check, the body's deadline and size, and metrics around every route.
async fn guard(State(state): State<Arc<ServerState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // Known routes by name; anything else counts as `other` (bounded metric labels).
    let path = request.uri().path();
    let route = match path {
        "/get-online-features" | "/push" | "/health" | "/metrics" | "/registry" => path.to_string(),
        _ => "other".to_string(),
    };
    let response = match &state.auth_token {
        // Health checks (load balancers, probes) need no token.
        Some(token) if route != "/health" && !authorized(request.headers(), token) => {
            ApiError(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()).into_response()
        }
        _ => match read_body(&state, request).await {
            Ok(request) => next.run(request).await,
            Err(refusal) => refusal.into_response(),
        },
    };
    state.metrics.record(&route, response.status().as_u16(), started.elapsed());
    response
}

/// The whole body, read within `request_timeout` (408 after) and up to
/// [`MAX_BODY_BYTES`] (413 beyond), so a slow or endless body never holds a handler.
async fn read_body(state: &ServerState, request: Request) -> Result<Request, ApiError> {
    let (parts, body) = request.into_parts();
    let timeout = state.limits.request_timeout;
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(bytes)) => Ok(Request::from_parts(parts, axum::body::Body::from(bytes))),
        Ok(Err(_)) => {
            state.metrics.refused(Limit::MaxBody);
            Err(ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("{} {}: the body is over {MAX_BODY_BYTES} bytes (or broken off)", parts.method, parts.uri.path()),
            ))
        }
        Err(_) => {
            state.metrics.refused(Limit::RequestTimeout);
            Err(ApiError(
                StatusCode::REQUEST_TIMEOUT,
                format!("{} {}: the body did not arrive within {timeout:?} (server.request_timeout)", parts.method, parts.uri.path()),
            ))
        }
    }
}

/// Whether the request carries `Authorization: Bearer <token>`, compared in constant
/// time (the time taken does not tell how much of a guess was right).
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|given| constant_time_eq(given, token.as_bytes()))
}

/// Byte strings compared without an early exit; only the lengths leak.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

async fn metrics(State(state): State<Arc<ServerState>>) -> impl IntoResponse {
    let mut text = state.metrics.render();
    text.push_str(&state.registry.metrics_text());
    if let Some(log) = &state.serving_log {
        text.push_str(&log.metrics_text());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

async fn registry(State(state): State<Arc<ServerState>>) -> Json<Json_> {
    let defs = state.registry.current();
    Json(serde_json::to_value(defs.as_ref()).expect("definitions serialise"))
}

/// The entity map of a request, in the order the client wrote it (the answer echoes
/// the join keys in that order, as Feast does).
#[derive(Debug, Default)]
struct OrderedEntities(Vec<(String, Json_)>);

impl<'de> serde::Deserialize<'de> for OrderedEntities {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = OrderedEntities;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of join key to values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<OrderedEntities, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, Json_>()? {
                    out.push(entry);
                }
                Ok(OrderedEntities(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A `/get-online-features` request. Fields it does not know are ignored, never
/// rejected (Feast clients send `include_feature_view_version_metadata` and more).
#[derive(Debug, serde::Deserialize)]
struct FeaturesRequest {
    #[serde(default)]
    entities: Option<OrderedEntities>,
    #[serde(default)]
    features: Option<Json_>,
    #[serde(default)]
    feature_service: Option<Json_>,
    #[serde(default)]
    full_feature_names: Option<Json_>,
}

async fn get_features(
    State(state): State<Arc<ServerState>>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let request: FeaturesRequest =
        serde_json::from_slice(&body).map_err(|e| bad(format!("request body is not a valid request: {e}")))?;
    let defs = state.registry.current();
    // Features: a list of `view:feature`, or a feature service. Unknown fields are ignored.
    let refs: Vec<FeatureRef> = match (&request.features, &request.feature_service) {
        (Some(features), _) if !features.is_null() => {
            let list = features.as_array().ok_or_else(|| bad("`features` must be a list of \"view:feature\""))?;
            list.iter()
                .map(|f| {
                    f.as_str()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad(format!("bad feature reference {f} (expected \"view:feature\")")))
                })
                .collect::<Result<_, _>>()?
        }
        (_, Some(service)) if !service.is_null() => {
            let name = service.as_str().ok_or_else(|| bad("`feature_service` must be a name"))?;
            defs.feature_service(name)
                .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("unknown feature service `{name}`")))?
                .features
                .clone()
        }
        _ => return Err(bad("the request needs `features` or `feature_service`")),
    };
    if let Some(dup) = refs.iter().enumerate().find_map(|(i, r)| refs[..i].contains(r).then_some(r)) {
        return Err(bad(format!("feature `{dup}` is asked for twice")));
    }
    for r in &refs {
        if let Some(view) = defs.feature_view(&r.view).filter(|v| !v.online) {
            return Err(bad(format!("feature `{r}`: feature view `{}` is offline only (`online: false`)", view.name)));
        }
    }
    let full_names = request.full_feature_names.as_ref().and_then(Json_::as_bool).unwrap_or(false);
    let entities = request
        .entities
        .ok_or_else(|| bad("the request needs `entities`: {join_key: [values]}"))?;
    let mut columns = Vec::new();
    for (name, values) in &entities.0 {
        let values = values.as_array().ok_or_else(|| bad(format!("entity `{name}` must be a list of values")))?;
        if values.len() > MAX_ENTITY_ROWS {
            state.metrics.refused(Limit::MaxEntityRows);
            return Err(ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("{} entity rows; at most {MAX_ENTITY_ROWS} per request", values.len()),
            ));
        }
        let cells = values.len().saturating_mul(refs.len());
        if cells > state.limits.max_cells {
            state.metrics.refused(Limit::MaxCells);
            return Err(ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "{} entity rows x {} features = {cells} values; at most {} per request (server.max_cells)",
                    values.len(),
                    refs.len(),
                    state.limits.max_cells
                ),
            ));
        }
        let keys = values
            .iter()
            .map(|v| KeyValue::from_json(v).ok_or_else(|| bad(format!("entity `{name}`: {v} is not an integer or a string"))))
            .collect::<Result<Vec<_>, _>>()?;
        columns.push((name.clone(), keys));
    }
    let now = (state.clock)();
    let result = state
        .store_call(get_online_features(state.store.as_ref(), &state.project, &defs, &refs, &columns, now, full_names))
        .await?;
    let body = response_json(&result);
    if let Some(log) = &state.serving_log {
        // After the answer is written: the log gets the columns, the client the bytes.
        log.log(Served { request_time: now, defs, refs, n_keys: columns.len(), columns: result });
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The `/get-online-features` answer, written straight into one buffer: building a
/// `serde_json::Value` tree first costs an allocation per value, which dominates the
/// server's time at 100 entities x 20 features.
fn response_json(columns: &[Column]) -> Vec<u8> {
    let cells: usize = columns.iter().map(|c| c.values.len()).sum();
    let mut out = Vec::with_capacity(64 + cells * 48);
    out.extend_from_slice(br#"{"metadata":{"feature_names":["#);
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_str(&mut out, &c.name);
    }
    out.extend_from_slice(br#"]},"results":["#);
    let mut previous_times: Option<(usize, std::ops::Range<usize>)> = None;
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"values":["#);
        for (j, v) in c.values.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            write_value(&mut out, v);
        }
        out.extend_from_slice(br#"],"statuses":["#);
        for (j, s) in c.statuses.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(s.as_str().as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(br#"],"event_timestamps":["#);
        // Features of one view share their rows' times: copy the previous column's text.
        match previous_times {
            Some((prev, ref range)) if columns[prev].event_ts == c.event_ts => {
                out.extend_from_within(range.clone());
            }
            _ => {
                let start = out.len();
                for (j, t) in c.event_ts.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.push(b'"');
                    write_rfc3339(&mut out, t.unwrap_or(0));
                    out.push(b'"');
                }
                previous_times = Some((i, start..out.len()));
            }
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"]}");
    out
}

pub(crate) fn json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

/// One value as JSON. Floats always carry a decimal point (`50.0`), as Feast's client
/// infers the type from the JSON form; non-finite floats become `null`.
pub(crate) fn write_value(out: &mut Vec<u8>, v: &Value) {
    fn float(out: &mut Vec<u8>, x: f64) {
        if x.is_finite() {
            serde_json::to_writer(&mut *out, &x).expect("writing to a Vec cannot fail");
        } else {
            out.extend_from_slice(b"null");
        }
    }
    fn list<T>(out: &mut Vec<u8>, items: &[T], mut each: impl FnMut(&mut Vec<u8>, &T)) {
        out.push(b'[');
        for (i, x) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            each(out, x);
        }
        out.push(b']');
    }
    let int = |out: &mut Vec<u8>, x: i64| serde_json::to_writer(&mut *out, &x).expect("writing to a Vec cannot fail");
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Int32(x) => int(out, i64::from(*x)),
        Value::Int64(x) => int(out, *x),
        Value::Float32(x) => float(out, f64::from(*x)),
        Value::Float64(x) => float(out, *x),
        Value::Bool(x) => out.extend_from_slice(if *x { b"true" } else { b"false" }),
        Value::String(x) => json_str(out, x),
        Value::Bytes(x) => list(out, x, |out, b| int(out, i64::from(*b))),
        Value::Timestamp(x) => {
            out.push(b'"');
            write_rfc3339(out, *x);
            out.push(b'"');
        }
        Value::ListInt64(x) => list(out, x, |out, v| int(out, *v)),
        Value::ListFloat32(x) => list(out, x, |out, v| float(out, f64::from(*v))),
        Value::ListFloat64(x) => list(out, x, |out, v| float(out, *v)),
        Value::ListString(x) => list(out, x, |out, v| json_str(out, v)),
    }
}

#[cfg(test)]
fn rfc3339(us: i64) -> String {
    let mut out = Vec::new();
    write_rfc3339(&mut out, us);
    String::from_utf8(out).expect("ascii")
}

/// UTC microseconds as RFC 3339 (`2024-02-29T12:34:56.123456Z`), with no fraction,
/// milliseconds or microseconds as the value needs (chrono's `AutoSi`), without the
/// allocations of a general formatter.
fn write_rfc3339(out: &mut Vec<u8>, us: i64) {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        // Outside four-digit years: the general formatter.
        let text = chrono::DateTime::from_timestamp_micros(us)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
            .unwrap_or_default();
        out.extend_from_slice(text.as_bytes());
        return;
    }
    fn digits(out: &mut Vec<u8>, n: i64, width: usize) {
        let mut buf = [b'0'; 6];
        let mut n = n;
        for slot in buf[..width].iter_mut().rev() {
            *slot = b'0' + (n % 10) as u8;
            n /= 10;
        }
        out.extend_from_slice(&buf[..width]);
    }
    digits(out, year, 4);
    out.push(b'-');
    digits(out, month, 2);
    out.push(b'-');
    digits(out, day, 2);
    out.push(b'T');
    digits(out, sod / 3600, 2);
    out.push(b':');
    digits(out, sod / 60 % 60, 2);
    out.push(b':');
    digits(out, sod % 60, 2);
    if micros % 1000 == 0 && micros != 0 {
        out.push(b'.');
        digits(out, micros / 1000, 3);
    } else if micros != 0 {
        out.push(b'.');
        digits(out, micros, 6);
    }
    out.push(b'Z');
}

/// A `/push` request: rows of one view, column-major.
#[derive(Debug, serde::Deserialize)]
struct PushRequest {
    #[serde(default)]
    feature_view: Option<String>,
    #[serde(default)]
    push_source_name: Option<String>,
    df: BTreeMap<String, Vec<Json_>>,
    #[serde(default)]
    to: Option<String>,
}

/// `POST /push`: rows read by the strict row reader shared with ingest and streaming,
/// written offline (through [`OfflineWriter`], the streaming write path) and then
/// through the guarded online write, as `to` asks (default `online`).
async fn push(State(state): State<Arc<ServerState>>, body: axum::body::Bytes) -> Result<Json<Json_>, ApiError> {
    let request: PushRequest =
        serde_json::from_slice(&body).map_err(|e| bad(format!("request body is not a valid push: {e}")))?;
    let target: quiver_sdk::rows::Target = request.to.as_deref().unwrap_or("online").parse().map_err(bad)?;
    let (online, offline) = (target.online(), target.offline());
    let defs = state.registry.current();
    let name = request
        .feature_view
        .or(request.push_source_name)
        .ok_or_else(|| bad("the push needs `feature_view` (or `push_source_name`)"))?;
    let view = defs.feature_view(&name).ok_or_else(|| bad(format!("unknown feature view `{name}`")))?;
    if online && !view.online {
        return Err(bad(format!(
            "feature view `{name}` is offline only (`online: false`): it takes no online writes (push with \"to\": \"offline\")"
        )));
    }
    let n = request.df.values().next().map_or(0, Vec::len);
    if n > MAX_ENTITY_ROWS {
        state.metrics.refused(Limit::MaxEntityRows);
        return Err(ApiError(StatusCode::PAYLOAD_TOO_LARGE, format!("{n} rows; at most {MAX_ENTITY_ROWS} per push")));
    }
    if n == 0 {
        return Err(bad("the push has no rows"));
    }
    if let Some((c, v)) = request.df.iter().find(|(_, v)| v.len() != n) {
        return Err(bad(format!("df column `{c}` has {} values, another has {n}", v.len())));
    }
    // A column the view needs must be there (a typo would otherwise push nulls).
    let latest = (state.clock)().saturating_add(state.limits.max_future_skew_us);
    let reader = quiver_sdk::rows::RowReader::new(&defs, view);
    let mut needed: Vec<&str> = reader.keys.iter().map(|k| k.name.as_str()).collect();
    needed.push(&view.source.timestamp_field);
    needed.extend(view.source.created_timestamp_field.as_deref());
    needed.extend(view.features.iter().map(|f| f.name.as_str()));
    if let Some(c) = needed.iter().find(|c| !request.df.contains_key(**c)) {
        return Err(bad(format!("df lacks column `{c}` of feature view `{name}`")));
    }
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let row = reader.from_fields(|c| request.df.get(c).map(|v| &v[i])).map_err(|m| bad(format!("row {}: {m}", i + 1)))?;
        if let Err(m) = quiver_sdk::rows::check_event_time(&view.source.timestamp_field, row.event_ts, latest) {
            state.metrics.refused(Limit::MaxFutureSkew);
            return Err(bad(format!("row {}: {m}", i + 1)));
        }
        rows.push(row);
    }
    let mut answer = serde_json::Map::new();
    answer.insert("rows".into(), json!(n));
    if offline {
        let Some(writer) = &state.offline else {
            return Err(ApiError(StatusCode::NOT_IMPLEMENTED, "this server has no offline store to push to".into()));
        };
        let version = writer.append(&defs, view, &rows).await.map_err(|e| state.unavailable("offline store", &e))?;
        answer.insert("offline_version".into(), json!(version));
    }
    if online {
        let writes = crate::store::WriteRow::of_rows(&state.project, view, &rows);
        let written = state.store_call(state.store.write(&writes)).await?;
        answer.insert("written".into(), json!(written));
    }
    Ok(Json(Json_::Object(answer)))
}

/// Appends pushed rows to a view's offline table; the streaming crate's Delta write
/// path implements it (this crate knows no Delta).
#[async_trait::async_trait]
pub trait OfflineWriter: Send + Sync {
    /// Appends `rows` of `view` in one commit; returns the table version committed.
    async fn append(&self, defs: &Definitions, view: &quiver_sdk::FeatureView, rows: &[ViewRow]) -> Result<u64, String>;
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        assert!(super::constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!super::constant_time_eq(b"s3cres", b"s3cret"));
        assert!(!super::constant_time_eq(b"s3cre", b"s3cret"));
        assert!(!super::constant_time_eq(b"", b"s3cret"));
    }

    #[test]
    fn timestamps_print_as_rfc3339() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_704_067_200_000_000), "2024-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_709_210_096_123_456), "2024-02-29T12:34:56.123456Z");
        assert_eq!(super::rfc3339(-1), "1969-12-31T23:59:59.999999Z");
        assert_eq!(super::rfc3339(1_709_210_096_120_000), "2024-02-29T12:34:56.120Z");
    }

    /// The hand-written formatter against chrono's, over random instants from year 1 to
    /// 9999 and beyond (where it hands over to chrono), at every sub-second precision.
    #[test]
    fn rfc3339_matches_chrono() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let chrono = |us: i64| {
            chrono::DateTime::from_timestamp_micros(us)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        };
        for _ in 0..200_000 {
            let mut us = rng.random_range(-62_135_596_800_000_000..300_000_000_000_000_000i64);
            match rng.random_range(0..3) {
                0 => us -= us.rem_euclid(1_000_000),
                1 => us -= us.rem_euclid(1_000),
                _ => {}
            }
            assert_eq!(super::rfc3339(us), chrono(us), "{us}");
        }
    }

    /// The direct writer against a `serde_json::Value` built the plain way, for every
    /// value kind: same JSON document, and floats keep their decimal point.
    #[test]
    fn response_json_matches_serde() {
        use super::{Column, Value};
        use crate::lookup::Status;
        use serde_json::json;
        let values = vec![
            Value::Null,
            Value::Int32(-7),
            Value::Int64(i64::MIN),
            Value::Float32(0.1),
            Value::Float64(50.0),
            Value::Float64(f64::NAN),
            Value::Bool(true),
            Value::String("quote\" and \u{e9}\n".into()),
            Value::Bytes(vec![0, 255]),
            Value::Timestamp(1_709_210_096_123_000),
            Value::ListInt64(vec![1, -2]),
            Value::ListFloat32(vec![1.0, 0.5]),
            Value::ListFloat64(vec![2.0, f64::INFINITY]),
            Value::ListString(vec!["a".into(), "b\"".into()]),
        ];
        let n = values.len();
        let times: Vec<Option<i64>> = (0..n).map(|i| (i % 2 == 0).then_some(i as i64 * 1_000_001)).collect();
        let column = |name: &str, values: Vec<Value>, times: Vec<Option<i64>>| Column {
            name: name.into(),
            values,
            statuses: vec![Status::Present; n],
            event_ts: times,
        };
        // Two columns with the same times (one view), then one with other times.
        let columns = vec![
            column("f\"1", values.clone(), times.clone()),
            column("g", values.clone(), times.clone()),
            column("h", values.clone(), times.iter().map(|t| t.map(|t| t + 7)).collect()),
        ];
        let text = String::from_utf8(super::response_json(&columns)).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        let f = |x: f64| json!(x);
        let result = |times: &[Option<i64>]| {
            json!({
                "values": [null, -7, i64::MIN, f(f64::from(0.1f32)), 50.0, null, true, "quote\" and \u{e9}\n",
                           [0, 255], "2024-02-29T12:34:56.123Z", [1, -2], [1.0, 0.5], [2.0, null], ["a", "b\""]],
                "statuses": vec!["PRESENT"; n],
                "event_timestamps": times.iter().map(|t| super::rfc3339(t.unwrap_or(0))).collect::<Vec<_>>(),
            })
        };
        let later: Vec<Option<i64>> = times.iter().map(|t| t.map(|t| t + 7)).collect();
        let want = json!({
            "metadata": {"feature_names": ["f\"1", "g", "h"]},
            "results": [result(&times), result(&times), result(&later)]
        });
        assert_eq!(parsed, want);
        assert!(text.contains("50.0") && text.contains("[1.0,0.5]"), "{text}");
    }
}
