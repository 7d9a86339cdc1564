//! `POST /get-online-features`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_sdk::FeatureRef;
use quiver_sdk::encoding::KeyValue;
use serde_json::Value as Json_;

use super::json::response_json;
use super::{ApiError, Limit, MAX_ENTITY_ROWS, ServerState, bad};
use crate::lookup::{LookupPhases, get_online_features_timed};
use crate::serving_log::Served;

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

pub(super) async fn get_features(State(state): State<Arc<ServerState>>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let began = Instant::now();
    let request: FeaturesRequest = serde_json::from_slice(&body).map_err(|e| bad(format!("request body is not a valid request: {e}")))?;
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
            defs.find_service(name).map_err(|e| ApiError(StatusCode::NOT_FOUND, e.0))?.features.clone()
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
    let entities = request.entities.ok_or_else(|| bad("the request needs `entities`: {join_key: [values]}"))?;
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
    let parsed = began.elapsed();
    let mut lookup = LookupPhases::default();
    let result = state
        .store_call(get_online_features_timed(state.store.as_ref(), &state.project, &defs, &refs, &columns, now, full_names, &mut lookup))
        .await?;
    let encoding = Instant::now();
    let body = response_json(&result);
    state.metrics.phases(parsed, &lookup, encoding.elapsed());
    if let Some(log) = &state.serving_log {
        // After the answer is written: the log gets the columns, the client the bytes.
        log.log(Served { request_time: now, defs, refs, n_keys: columns.len(), columns: result });
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
