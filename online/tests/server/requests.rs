//! Issue 53: what a request may give (docs/online.md#request-fields) — the join keys of
//! the views read and the request fields the features asked for read, a null among
//! them, nothing else — and a key repeated anywhere in a body, refused naming it, on
//! `/get-online-features` and `/push`.

use std::sync::Arc;

use axum::http::StatusCode;
use quiver_online::server::{Metrics, RegistryCache, ServerState};
use quiver_online::{EmbeddedStore, OnlineStore, WriteRow};
use quiver_runtime::encoding::{KeyValue, OnlineRow, Value, store_key};
use quiver_sdk::definitions::fingerprint;
use quiver_sdk::registry::{FileRegistry, RegistryDoc};
use quiver_sdk::yaml::parse_definitions;
use serde_json::{Value as Json, json};

use super::{HOUR, NOW, call};

/// `fraud:channel_norm` reads only `channel`, `fraud:ratio` only `amount`; `second`
/// reads `amount` through `fraud:ratio`.
const DEFS: &str = r#"
entities:
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
feature_views:
  - {name: stats, entities: [customer], ttl: 2h, features: [{name: avg, dtype: float64}]}
  - {name: cars, entities: [driver], features: [{name: seats, dtype: int64}]}
  - name: payments
    entities: [customer]
    source: {timestamp_field: event_timestamp, raw: [{name: cents, dtype: int64}]}
    features: [{name: paid, dtype: float64, expr: "CAST(cents AS DOUBLE) / 100"}]
on_demand_views:
  - name: fraud
    inputs: [stats]
    request: [{name: amount, dtype: float64}, {name: channel, dtype: string}]
    features:
      - {name: ratio, dtype: float64, expr: "amount / stats.avg"}
      - {name: channel_norm, dtype: string, expr: "lower(channel)"}
  - name: second
    inputs: [fraud]
    features:
      - {name: doubled, dtype: float64, expr: "fraud.ratio * 2"}
"#;

/// A server over `DEFS`, with `stats.avg` 4.0 for customer C05.
async fn served() -> (tempfile::TempDir, Arc<ServerState>) {
    let dir = tempfile::tempdir().unwrap();
    let registry_path = dir.path().join("registry.json");
    let defs = parse_definitions(DEFS).unwrap();
    let doc = RegistryDoc::empty("p");
    let plan = doc.plan(&defs);
    FileRegistry::new(&registry_path).save(&doc.applied(&defs, &plan, chrono::Utc::now(), false)).unwrap();
    let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.path().join("online.db")).unwrap());
    let stats = defs.feature_view("stats").unwrap();
    let row = OnlineRow { event_ts: NOW - HOUR, created_ts: i64::MIN, fingerprint: fingerprint(stats), values: vec![Value::Float64(4.0)] };
    let key = store_key("p", "stats", &[KeyValue::Str("C05".into())]);
    store.write(&[WriteRow { key, row: row.encode(), expire_at_ms: None }]).await.unwrap();
    let state = Arc::new(ServerState {
        store,
        registry: RegistryCache::new(registry_path, "p").unwrap(),
        project: "p".into(),
        auth_token: None,
        metrics: Metrics::default(),
        clock: Box::new(|| NOW),
        offline: None,
        serving_log: None,
        limits: quiver_online::server::Limits::default(),
        insights: None,
        pending: Default::default(),
    });
    (dir, state)
}

/// Posts `body` (JSON text, keys in the order written) to `path`.
async fn post(state: &Arc<ServerState>, path: &str, body: &str) -> (StatusCode, Json) {
    let (status, text) = call(state, "POST", path, Some(body.to_string()), None).await;
    (status, serde_json::from_str(&text).unwrap_or(Json::String(text)))
}

/// Before: the first body answered two key columns and C05's value under C06's name;
/// a repeated unknown field or `df` column was read without a word (the last column
/// pushed).
#[tokio::test]
async fn a_key_repeated_anywhere_in_a_body_is_a_400_naming_it() {
    let (_dir, state) = served().await;
    let cases = [
        (
            "/get-online-features",
            r#"{"entities": {"customer_id": ["C05"], "customer_id": ["C06"]}, "features": ["stats:avg"]}"#,
            r#"request body: key "customer_id" appears twice in "entities""#,
        ),
        (
            "/get-online-features",
            r#"{"features": ["stats:avg"], "entities": {"customer_id": ["C05"]}, "features": ["cars:seats"]}"#,
            r#"request body: key "features" appears twice"#,
        ),
        (
            "/get-online-features",
            r#"{"entities": {"customer_id": ["C05"]}, "features": ["stats:avg"], "meta": {"a": 1, "a": 2}}"#,
            r#"request body: key "a" appears twice in "meta""#,
        ),
        (
            "/push",
            r#"{"feature_view": "cars", "to": "online", "df": {"driver_id": [7], "event_timestamp": ["2024-01-01T09:30:00Z"], "seats": [4], "seats": [5]}}"#,
            r#"request body: key "seats" appears twice in "df""#,
        ),
        (
            "/push",
            r#"{"feature_view": "cars", "feature_view": "stats", "to": "online", "df": {"driver_id": [7], "event_timestamp": ["2024-01-01T09:30:00Z"], "seats": [4]}}"#,
            r#"request body: key "feature_view" appears twice"#,
        ),
    ];
    for (path, body, want) in cases {
        let (status, answer) = post(&state, path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let error = answer["error"].as_str().unwrap_or_else(|| panic!("{body}: {answer}"));
        assert!(error.starts_with(want), "{body}: {error:?} should start with {want:?}");
    }
    // Nothing was pushed.
    let (status, answer) = post(&state, "/get-online-features", r#"{"entities": {"driver_id": [7]}, "features": ["cars:seats"]}"#).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["results"][1]["statuses"], json!(["NOT_FOUND"]), "{answer}");
    // The same key in two objects is no repeat.
    let body = r#"{"entities": {"customer_id": ["C05"]}, "features": ["stats:avg"], "meta": {"customer_id": 1, "features": [{"a": 1}, {"a": 2}]}}"#;
    let (status, answer) = post(&state, "/get-online-features", body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["results"][1]["values"], json!([4.0]), "{answer}");
}

/// Before: `channel_norm` demanded `amount` too ("needed by `fraud:channel_norm`"); an
/// undeclared name with an integer was echoed as a key column, with a float refused as
/// an entity; a declared field the features do not read, and a key no view read
/// takes, were taken without a word.
#[tokio::test]
async fn entities_take_the_join_keys_and_the_request_fields_read() {
    let (_dir, state) = served().await;
    let answered = [
        (r#"{"entities": {"customer_id": ["C05"], "channel": ["WEB"]}, "features": ["fraud:channel_norm"]}"#, json!("web")),
        (r#"{"entities": {"customer_id": ["C05"], "amount": [2.0]}, "features": ["fraud:ratio"]}"#, json!(0.5)),
        // Read through an on-demand feature.
        (r#"{"entities": {"customer_id": ["C05"], "amount": [2]}, "features": ["second:doubled"]}"#, json!(1.0)),
        // A null request value is a null input.
        (r#"{"entities": {"customer_id": ["C05"], "amount": [null]}, "features": ["fraud:ratio"]}"#, Json::Null),
    ];
    for (body, want) in answered {
        let (status, answer) = post(&state, "/get-online-features", body).await;
        assert_eq!(status, StatusCode::OK, "{body}: {answer}");
        assert_eq!(answer["metadata"]["feature_names"].as_array().unwrap().len(), 2, "request fields are not echoed: {answer}");
        assert_eq!(answer["results"][1]["values"][0], want, "{body}: {answer}");
        let status = if want.is_null() { "NULL_VALUE" } else { "PRESENT" };
        assert_eq!(answer["results"][1]["statuses"][0], status, "{body}: {answer}");
    }
    let refused = [
        (
            r#"{"entities": {"customer_id": ["C05"], "extra": [5]}, "features": ["stats:avg"]}"#,
            "`extra` is neither a join key nor a request field of the features asked for (allowed: `customer_id`)",
        ),
        (
            r#"{"entities": {"customer_id": ["C05"], "extra": [1.5]}, "features": ["stats:avg"]}"#,
            "`extra` is neither a join key nor a request field of the features asked for (allowed: `customer_id`)",
        ),
        (
            r#"{"entities": {"customer_id": ["C05"], "driver_id": [1]}, "features": ["stats:avg"]}"#,
            "`driver_id` is neither a join key nor a request field of the features asked for (allowed: `customer_id`)",
        ),
        (
            r#"{"entities": {"customer_id": ["C05"], "channel": ["x"], "amount": [2.0]}, "features": ["fraud:channel_norm"]}"#,
            "`amount` is neither a join key nor a request field of the features asked for (allowed: `customer_id`, `channel`)",
        ),
        (
            r#"{"entities": {"customer_id": ["C05"], "amount": [2.0], "channel": ["x"]}, "features": ["second:doubled"]}"#,
            "`channel` is neither a join key nor a request field of the features asked for (allowed: `customer_id`, `amount`)",
        ),
        // A missing field names only the features that read it.
        (
            r#"{"entities": {"customer_id": ["C05"], "channel": ["x"]}, "features": ["fraud:channel_norm", "fraud:ratio"]}"#,
            "missing request field `amount` (float64, needed by `fraud:ratio`, goes beside the join keys in `entities`)",
        ),
    ];
    for (body, want) in refused {
        let (status, answer) = post(&state, "/get-online-features", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"], want, "{body}");
    }
}

/// Before: a raw column missing from `df` was named as a plain column of the view.
#[tokio::test]
async fn push_names_a_missing_raw_column_as_one() {
    let (_dir, state) = served().await;
    let body =
        r#"{"feature_view": "payments", "to": "online", "df": {"customer_id": ["C1"], "event_timestamp": ["2024-01-01T09:30:00Z"]}}"#;
    let (status, answer) = post(&state, "/push", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"], "df lacks raw column `cents` of feature view `payments`", "{answer}");
}

/// A raw column of the wrong type is named as a raw column (not as a feature), with
/// the row and the value.
#[tokio::test]
async fn push_names_a_raw_column_of_the_wrong_type_as_one() {
    let (_dir, state) = served().await;
    let body = r#"{"feature_view": "payments", "to": "online", "df": {"customer_id": ["C1"], "event_timestamp": ["2024-01-01T09:30:00Z"], "cents": ["x"]}}"#;
    let (status, answer) = post(&state, "/push", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert_eq!(error, r#"row 1: raw column `cents` must be int64, got "x""#);
}
