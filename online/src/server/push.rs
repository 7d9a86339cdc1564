//! `POST /push`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value as Json_, json};

use super::pending::{MAX_PENDING_ROWS, Write};
use super::{ApiError, Limit, MAX_ENTITY_ROWS, ServerState, bad, unique_keys};

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

/// `POST /push`: rows read by the strict row reader shared with ingest and streaming
/// (raw rows, shaped by the view's write-time expressions, for a view with them),
/// written offline (through [`OfflineWriter`], the streaming write path) and then
/// through the guarded online write, as `to` asks (default: both stores, offline only
/// for a view with `online: false`, as every front end pushes). When the online store
/// fails after the offline commit, the online write waits in [`super::pending`] and the
/// answer is 202 with `online_pending` (docs/online.md#push-when-the-online-store-fails).
pub(super) async fn push(State(state): State<Arc<ServerState>>, body: axum::body::Bytes) -> Result<(StatusCode, Json<Json_>), ApiError> {
    // A column written twice in `df` (or any repeated key) is refused, never half read.
    unique_keys(&body)?;
    let request: PushRequest = serde_json::from_slice(&body).map_err(|e| bad(format!("request body is not a valid push: {e}")))?;
    let asked: Option<quiver_runtime::rows::Target> = request.to.as_deref().map(str::parse).transpose().map_err(bad)?;
    let defs = state.registry.current();
    let name =
        request.feature_view.or(request.push_source_name).ok_or_else(|| bad("the push needs `feature_view` (or `push_source_name`)"))?;
    let view = defs.find_view(&name).map_err(|e| bad(e.0))?;
    let target = asked.unwrap_or_else(|| quiver_runtime::rows::Target::default_for(view));
    let (online, offline) = (target.online(), target.offline());
    if online {
        view.check_online_writes().map_err(bad)?;
    }
    let n = request.df.values().next().map_or(0, Vec::len);
    if n > MAX_ENTITY_ROWS {
        state.metrics.refused(Limit::MaxEntityRows);
        return Err(ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{}; at most {MAX_ENTITY_ROWS} per push", quiver_sdk::error::count(n, "row")),
        ));
    }
    if n == 0 {
        return Err(bad("the push has no rows"));
    }
    if let Some((c, v)) = request.df.iter().find(|(_, v)| v.len() != n) {
        return Err(bad(format!("df column `{c}` has {}, another has {n}", quiver_sdk::error::count(v.len(), "value"))));
    }
    // A column the view needs must be there (a typo would otherwise push nulls).
    let latest = (state.clock)().saturating_add(state.limits.max_future_skew_us);
    // A view with write-time expressions takes its raw rows (docs/transformations.md#write-time).
    let transform = state
        .registry
        .write_transform(&defs, &view.versioned_name(), || quiver_runtime::write_time::WriteTransform::new(&defs, view))
        .map_err(|e| bad(format!("feature view `{name}`: {e}")))?;
    let reads = transform.as_deref().map_or(view, |t| t.raw_view());
    let reader = quiver_runtime::rows::RowReader::new(&defs, reads);
    let mut needed: Vec<&str> = reader.keys.iter().map(|k| k.name.as_str()).collect();
    needed.push(&view.source.timestamp_field);
    needed.extend(view.source.created_timestamp_field.as_deref());
    needed.extend(reads.features.iter().map(|f| f.name.as_str()));
    if let Some(c) = needed.iter().find(|c| !request.df.contains_key(**c)) {
        // A view with write-time expressions reads raw columns, which are not features.
        let what = if view.source.raw.iter().any(|r| r.name == *c) { "raw column" } else { "column" };
        return Err(bad(format!("df lacks {what} `{c}` of feature view `{name}`")));
    }
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let row = reader.from_fields(|c| request.df.get(c).map(|v| &v[i])).map_err(|m| bad(format!("row {}: {m}", i + 1)))?;
        if let Err(m) = quiver_runtime::rows::check_event_time(&view.source.timestamp_field, row.event_ts, latest) {
            state.metrics.refused(Limit::MaxFutureSkew);
            return Err(bad(format!("row {}: {m}", i + 1)));
        }
        rows.push(row);
    }
    let mut answer = serde_json::Map::new();
    if let Some(transform) = &transform {
        let (stored, dropped, uncomputed) = transform.apply_rows(&defs, &rows);
        state.metrics.pushed(dropped, uncomputed);
        answer.insert("dropped".into(), json!(dropped));
        answer.insert("uncomputed".into(), json!(uncomputed));
        rows = stored;
    }
    answer.insert("rows".into(), json!(rows.len()));
    if rows.is_empty() {
        // Every row failed the filter: nothing to write.
        return Ok((StatusCode::OK, Json(Json_::Object(answer))));
    }
    // An event log's online records come from its table: its events go there first,
    // and then its entities' records are rebuilt from it.
    let mut offline_version = None;
    if offline || view.is_event_log() {
        let Some(writer) = &state.offline else {
            return Err(ApiError(StatusCode::NOT_IMPLEMENTED, "this server has no offline store to push to".into()));
        };
        let version =
            writer.append(&defs, view, &rows, online && !view.is_event_log()).await.map_err(|e| state.unavailable("offline store", &e))?;
        answer.insert("offline_version".into(), json!(version));
        offline_version = Some(version);
    }
    let mut status = StatusCode::OK;
    if online {
        let write = if view.is_event_log() {
            let entities = rows.iter().map(|r| r.keys.clone()).collect();
            Write::EventLog { defs: Arc::clone(&defs), view: Box::new(view.clone()), entities }
        } else {
            Write::Rows(crate::store::WriteRow::of_rows(&state.project, view, &rows))
        };
        match online_write(&state, &write).await {
            Ok(written) => {
                answer.insert("online_written".into(), json!(written));
            }
            // The rows are in the offline table: the online write is kept and retried
            // until the store takes it, never half done and never asked for again.
            Err(e) if e.0 == StatusCode::SERVICE_UNAVAILABLE && offline_version.is_some() => {
                let version = offline_version.expect("checked");
                if !state.pending.add(&state, write, rows.len() as u64) {
                    return Err(ApiError(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "online store unavailable, and {MAX_PENDING_ROWS} rows already wait for it: the rows are in the \
                             offline table at version {version}, not online (`quiver materialize-incremental` loads them; \
                             pushing them again would append them twice)"
                        ),
                    ));
                }
                answer.insert("online_pending".into(), json!(rows.len()));
                status = StatusCode::ACCEPTED;
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(writer) = &state.offline {
        writer.pushed(&defs, view, online, offline_version);
    }
    Ok((status, Json(Json_::Object(answer))))
}

/// One push's online write, now: the rows written (`0` for those the guard kept out).
async fn online_write(state: &ServerState, write: &Write) -> Result<usize, ApiError> {
    match write {
        Write::Rows(rows) => state.store_call(state.store.write(rows)).await,
        Write::EventLog { defs, view, entities } => {
            // No store timeout here: the rebuild reads the table first, which may take
            // longer than a store call (as it did before pushes could wait).
            let writer = state.offline.as_ref().expect("an event log's push went offline first");
            writer.refresh_event_log(defs, view, entities, state.store.as_ref()).await.map_err(|e| state.unavailable("online store", &e))
        }
    }
}
