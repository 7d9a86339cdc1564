//! The HTTP feature server (docs/online.md), in Feast's wire shape so Feast clients work.
//!
//! `router(state)` builds the axum `Router`; `crate::listen::serve` binds it with the
//! connection limits and graceful shutdown, answering `POST /get-online-features`
//! itself through the same guard and handler (the hot route skips the router). Routes: `POST /get-online-features`,
//! `POST /push`, `GET /health`, `GET /metrics` (Prometheus text), `GET /registry`, and
//! the web UI's `GET /ui` and `/api/...` ([`ui`]).
//! Errors are JSON `{"error": "..."}` with 400 (bad request, unknown or duplicate
//! feature, a view that is not online), 401 (token), 404 (unknown feature service), 408
//! (body not sent in time), 413 (too large: body, entity rows, or entity rows x features
//! over `max_cells`), 503 (store unavailable or slow); store calls time out, and nothing
//! panics on bad input. The registry is re-read when its file changes, without a
//! restart; a registry that cannot be read keeps the last good definitions.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use quiver_runtime::rows::ViewRow;
use quiver_sdk::Definitions;
use serde_json::{Value as Json_, json};

use crate::serving_log::ServingLog;
use crate::store::OnlineStore;

mod features;
mod limits;
mod metrics;
mod pending;
mod push;
mod registry_cache;
pub mod ui;

pub use limits::{Limit, Limits};
pub use metrics::Metrics;
pub use pending::{MAX_PENDING_ROWS, PendingWrites};
pub use registry_cache::{REGISTRY_CHECK, RegistryCache};
pub use ui::Insights;

/// Largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Most entity rows in one request (413 beyond).
pub use crate::lookup::MAX_ENTITY_ROWS;
/// How long a store call may take before the request fails with 503.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// The bounds of docs/limits.md.
    pub limits: Limits,
    /// What the web UI reports of the offline side; `None` answers its endpoints 501.
    pub insights: Option<Arc<dyn Insights>>,
    /// Online writes of pushes whose offline half committed while the store failed,
    /// retried in the background ([`pending`]).
    pub pending: PendingWrites,
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
            Ok(Err(e)) if matches!(e.kind(), quiver_sdk::ErrorKind::Invalid | quiver_sdk::ErrorKind::NotFound) => Err(ApiError::of(&e)),
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
    Box::new(|| SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64))
}

/// An error answer: a status and a one-line message, as `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl ApiError {
    /// The answer to a request that failed with `e`: the status from its kind, in this
    /// one place (invalid 400; not found 400 too, since what is not found is a name in
    /// the request's body, as Feast answers — 404 is for paths; conflict 409,
    /// unavailable 503, internal 500; a request over a lookup's bounds 413), and its
    /// message.
    pub(crate) fn of(e: &crate::Error) -> ApiError {
        use quiver_sdk::ErrorKind as K;
        let status = match (e, e.kind()) {
            (crate::Error::TooLarge { .. }, _) => StatusCode::PAYLOAD_TOO_LARGE,
            (_, K::Invalid | K::NotFound) => StatusCode::BAD_REQUEST,
            (_, K::Conflict) => StatusCode::CONFLICT,
            (_, K::Unavailable) => StatusCode::SERVICE_UNAVAILABLE,
            (_, K::Internal) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }

    /// [`ApiError::of`] a refusal before any work, counted by the bound it hit.
    fn refused(metrics: &Metrics, e: &crate::Error) -> ApiError {
        if let crate::Error::TooLarge { bound, .. } = e {
            metrics.refused(if *bound == "max_cells" { Limit::MaxCells } else { Limit::MaxEntityRows });
        }
        ApiError::of(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// Refuses a request body in which an object repeats a key, anywhere in it: a JSON
/// reader keeps one of the values, or both, without a word, and the answer would go
/// under names the client maps to other values (docs/online.md). Reads the body without
/// building its values. `/push` runs it first; `/get-online-features` only for a body
/// its fast reading refused (that reading refuses a repeated key itself, see
/// [`Unique`]), so a good request is read once.
///
/// # Errors
/// A 400 naming the key and the key whose value repeats it: `request body: key
/// "customer_id" appears twice in "entities" at line 1 column 60`.
fn unique_keys(body: &[u8]) -> Result<(), ApiError> {
    use serde::de::DeserializeSeed;
    let mut reader = serde_json::Deserializer::from_slice(body);
    match (Unique { within: None }).deserialize(&mut reader) {
        Err(e) if e.is_data() => Err(bad(format!("request body: {e}"))),
        // Anything else wrong with the body is for the handler's reading to say.
        _ => Ok(()),
    }
}

/// A JSON value read only to refuse an object in it that repeats a key; `within`: the
/// key whose value it is (`None`: the whole body).
#[derive(Debug, Clone, Copy)]
struct Unique<'k> {
    within: Option<&'k str>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Unique<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Unique<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys: Vec<std::borrow::Cow<'de, str>> = Vec::new();
        while let Some(key) = map.next_key_seed(Key)? {
            map.next_value_seed(Unique { within: Some(&*key) })?;
            keys.push(key);
        }
        match repeated(keys.iter().map(|k| &**k)) {
            Some(key) => Err(serde::de::Error::custom(twice(key, self.within))),
            None => Ok(()),
        }
    }
}

/// An object's key, borrowed from the body unless it holds an escape.
struct Key;

impl<'de> serde::de::DeserializeSeed<'de> for Key {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Key {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v.to_string()))
    }
}

/// The first of an object's `keys` (in order) met twice: scanned while few, hashed past
/// that, so a body of many keys is not read in quadratic time.
fn repeated<'k>(mut keys: impl Iterator<Item = &'k str> + Clone) -> Option<&'k str> {
    if keys.clone().nth(16).is_none() {
        return keys.clone().enumerate().find(|&(i, k)| keys.clone().take(i).any(|m| m == k)).map(|(_, k)| k);
    }
    let mut met = std::collections::HashSet::new();
    keys.find(|k| !met.insert(*k))
}

/// The refusal of `key` repeated in the value of `within` (`None`: in the body).
fn twice(key: &str, within: Option<&str>) -> String {
    match within {
        Some(within) => format!("key {key:?} appears twice in {within:?}"),
        None => format!("key {key:?} appears twice"),
    }
}

/// The router, without binding a socket (tests call it directly).
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/get-online-features", post(features::get_features))
        .route("/push", post(push::push))
        .route("/health", get(|| async { Json(json!({ "status": "ok" })) }))
        .route("/metrics", get(metrics))
        .route("/registry", get(registry))
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::index))
        .route("/ui/app.js", get(ui::app_js))
        .route("/ui/app.css", get(ui::app_css))
        .route("/api/registry", get(ui::registry))
        .route("/api/freshness", get(ui::freshness))
        .route("/api/statistics/{view}", get(ui::statistics))
        .route("/api/verify-reports", get(ui::verify_reports))
        .route("/api/monitor-reports", get(ui::monitor_reports))
        .route("/api/lineage", get(ui::lineage))
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

/// Routes counted under their own name in `/metrics` (labels stay bounded).
const ROUTES: [&str; 8] =
    ["/get-online-features", "/push", "/health", "/metrics", "/registry", "/api/registry", "/api/freshness", "/api/verify-reports"];

/// Bearer-token check, the body's deadline and size, and metrics around every route.
async fn guard(State(state): State<Arc<ServerState>>, request: Request, next: Next) -> Response {
    // Known routes by name; anything else counts as `other` (bounded metric labels).
    let path = request.uri().path();
    let route: &'static str = match path {
        p if p.starts_with("/api/statistics/") => "/api/statistics",
        p if ui::STATIC.contains(&p) => "/ui",
        p => ROUTES.iter().find(|r| **r == p).copied().unwrap_or("other"),
    };
    guarded(&state, route, request, |parts, body| next.run(Request::from_parts(parts, axum::body::Body::from(body)))).await
}

/// `POST /get-online-features` behind the same guard as [`router`]'s routes, without
/// the router: what the listener calls for the one route that is hot (the router's
/// matching, middleware and extractors cost ~10% of a single-entity request).
pub(crate) async fn features_route(state: Arc<ServerState>, request: Request) -> Response {
    let handler = state.clone();
    guarded(
        &state,
        "/get-online-features",
        request,
        |_, body| async move { features::get_features(State(handler), body).await.into_response() },
    )
    .await
}

/// [`guard`]'s work around `run` (given the request's head and whole body), counted
/// under `route`.
async fn guarded<F, Fut>(state: &ServerState, route: &'static str, request: Request, run: F) -> Response
where
    F: FnOnce(axum::http::request::Parts, axum::body::Bytes) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let started = Instant::now();
    let response = match &state.auth_token {
        // Health checks (load balancers, probes) and the UI's static page need no token.
        Some(token) if route != "/health" && route != "/ui" && !authorized(request.headers(), token) => {
            ApiError(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()).into_response()
        }
        _ => match read_body(state, request).await {
            Ok((parts, body)) => run(parts, body).await,
            Err(refusal) => refusal.into_response(),
        },
    };
    state.metrics.record(route, response.status().as_u16(), started.elapsed());
    response
}

/// The whole body, read within `request_timeout` (408 after) and up to
/// [`MAX_BODY_BYTES`] (413 beyond), so a slow or endless body never holds a handler.
async fn read_body(state: &ServerState, request: Request) -> Result<(axum::http::request::Parts, axum::body::Bytes), ApiError> {
    let (parts, body) = request.into_parts();
    let timeout = state.limits.request_timeout;
    let read = axum::body::to_bytes(body, MAX_BODY_BYTES);
    tokio::pin!(read);
    // A body that is here already (a small one comes with the headers) is read
    // without arming a timer.
    let read = match futures::poll!(read.as_mut()) {
        std::task::Poll::Ready(bytes) => Ok(bytes),
        std::task::Poll::Pending => tokio::time::timeout(timeout, read).await,
    };
    match read {
        Ok(Ok(bytes)) => Ok((parts, bytes)),
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
    let mut out = quiver_runtime::metrics::Exposition::new();
    state.metrics.render(&mut out);
    out.gauge(
        "quiver_push_online_pending_rows",
        "Pushed rows in the offline table whose online write waits for the online store.",
        state.pending.rows(),
    );
    state.registry.render_metrics(&mut out);
    quiver_runtime::metrics::LINEAGE_EVENTS.render(&mut out);
    if let Some(log) = &state.serving_log {
        log.render_metrics(&mut out);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out.finish())
}

async fn registry(State(state): State<Arc<ServerState>>) -> Json<Json_> {
    let defs = state.registry.current();
    Json(serde_json::to_value(&defs.definitions).expect("definitions serialise"))
}

/// Appends pushed rows to a view's offline table; the streaming crate's Delta write
/// path implements it (this crate knows no Delta).
#[async_trait::async_trait]
pub trait OfflineWriter: Send + Sync {
    /// Appends `rows` of `view` in one commit; returns the table version committed.
    /// `owes_online`: the push writes them online next, and the commit records that it
    /// does, so that a server killed in between has them written by the next one to
    /// start (docs/online.md#push-when-the-online-store-fails).
    async fn append(&self, defs: &Definitions, view: &quiver_sdk::FeatureView, rows: &[ViewRow], owes_online: bool) -> Result<u64, String>;

    /// Rebuilds the online records of an event log's `entities` from its table (after
    /// their events were appended); returns the records written.
    async fn refresh_event_log(
        &self,
        defs: &Definitions,
        view: &quiver_sdk::FeatureView,
        entities: &[Vec<quiver_runtime::encoding::KeyValue>],
        store: &dyn crate::OnlineStore,
    ) -> Result<usize, String>;

    /// Told of every push answered: `view`, whether it went online, and the table
    /// version committed when it went offline (the lineage of pushes, docs/lineage.md).
    /// By default nothing.
    fn pushed(&self, defs: &Definitions, view: &quiver_sdk::FeatureView, online: bool, offline_version: Option<u64>) {
        let _ = (defs, view, online, offline_version);
    }
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
}
