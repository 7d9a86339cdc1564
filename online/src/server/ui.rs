//! The web UI (docs/online.md): `GET /ui` and its two assets, compiled into the binary, and
//! the JSON endpoints the page reads — `/api/registry` (the definitions with the
//! registry version), `/api/freshness`, `/api/statistics/{view}`, `/api/verify-reports`,
//! `/api/monitor-reports`, `/api/lineage` — beside the server's own `/get-online-features` for the lookup panel. The page
//! needs no token; the endpoints do when `server.auth_token` is set. What lives offline
//! (Delta tables, the repository's state files) comes through [`Insights`], which the
//! root implements: this crate knows no Delta.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_sdk::Definitions;
use serde_json::{Value, json};

use super::{ApiError, ServerState};

const INDEX: &[u8] = include_bytes!("ui/index.html");
const APP_JS: &[u8] = include_bytes!("ui/app.js");
const APP_CSS: &[u8] = include_bytes!("ui/app.css");

/// The static paths, served without a token.
pub(super) const STATIC: &[&str] = &["/ui", "/ui/", "/ui/app.js", "/ui/app.css"];

/// What the UI shows of the offline side, as JSON (shapes in docs/online.md, "The web
/// UI"). Errors are one line, answered as 503; an unknown view is the caller's
/// check.
#[async_trait::async_trait]
pub trait Insights: Send + Sync {
    /// Per view: its table's version, rows and newest event time, the last
    /// materialization per online store, and the age against the TTL at `now`.
    async fn freshness(&self, defs: &Definitions, now: i64) -> Result<Value, String>;
    /// One view's rows, null rate and histogram per feature (cached by table version).
    async fn statistics(&self, defs: &Definitions, view: &str) -> Result<Value, String>;
    /// The stored `verify` reports, oldest first.
    async fn verify_reports(&self) -> Result<Value, String>;
    /// The stored `monitor` reports, oldest first (docs/monitoring.md).
    async fn monitor_reports(&self) -> Result<Value, String>;
    /// The lineage graph of `defs` and the training sets under the repository, as
    /// `quiver lineage` reads it (docs/lineage.md#quiver-lineage).
    async fn lineage(&self, defs: &Definitions) -> Result<Value, String>;
}

fn asset(body: &'static [u8], content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

pub(super) async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

pub(super) async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

pub(super) async fn app_css() -> Response {
    asset(APP_CSS, "text/css; charset=utf-8")
}

pub(super) async fn registry(State(state): State<Arc<ServerState>>) -> Json<Value> {
    let defs = state.registry.current();
    let mut definitions = serde_json::to_value(&defs.definitions).expect("definitions serialise");
    // An aggregation that names no hop carries the one it gets, for the page to show.
    for (view, shown) in defs.feature_views.iter().zip(definitions["feature_views"].as_array_mut().into_iter().flatten()) {
        for (a, shown) in view.aggregations.iter().zip(shown["aggregations"].as_array_mut().into_iter().flatten()) {
            if a.hop.is_none() {
                shown["default_hop"] = a.hop().to_string().into();
            }
        }
    }
    Json(json!({
        "project": state.project,
        "version": state.registry.version(),
        "store": state.store.name(),
        "history": serde_json::to_value(state.registry.history()).expect("history serialises"),
        "definitions": definitions,
    }))
}

fn insights(state: &ServerState) -> Result<&Arc<dyn Insights>, ApiError> {
    state.insights.as_ref().ok_or_else(|| ApiError(StatusCode::NOT_IMPLEMENTED, "this server has no offline store to report on".into()))
}

fn failed(state: &ServerState, what: &str, e: String) -> ApiError {
    state.unavailable(what, &e)
}

pub(super) async fn freshness(State(state): State<Arc<ServerState>>) -> Result<Json<Value>, ApiError> {
    let defs = state.registry.current();
    let now = (state.clock)();
    insights(&state)?.freshness(&defs, now).await.map(Json).map_err(|e| failed(&state, "offline store", e))
}

pub(super) async fn statistics(State(state): State<Arc<ServerState>>, Path(view): Path<String>) -> Result<Json<Value>, ApiError> {
    let defs = state.registry.current();
    if let Err(e) = defs.find_view(&view) {
        return Err(ApiError(StatusCode::NOT_FOUND, e.0));
    }
    insights(&state)?.statistics(&defs, &view).await.map(Json).map_err(|e| failed(&state, "offline store", e))
}

pub(super) async fn verify_reports(State(state): State<Arc<ServerState>>) -> Result<Json<Value>, ApiError> {
    insights(&state)?.verify_reports().await.map(Json).map_err(|e| failed(&state, "verify reports", e))
}

pub(super) async fn monitor_reports(State(state): State<Arc<ServerState>>) -> Result<Json<Value>, ApiError> {
    insights(&state)?.monitor_reports().await.map(Json).map_err(|e| failed(&state, "monitor reports", e))
}

pub(super) async fn lineage(State(state): State<Arc<ServerState>>) -> Result<Json<Value>, ApiError> {
    let defs = state.registry.current();
    insights(&state)?.lineage(&defs.definitions).await.map(Json).map_err(|e| failed(&state, "lineage", e))
}
