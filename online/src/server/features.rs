//! `POST /get-online-features`.
//!
//! A request is read twice only when it is bad: first straight into typed values
//! (feature names borrowed from the body, entity keys without a `serde_json::Value`
//! tree), and when that fails, into `serde_json::Value`s, whose checks name what is
//! wrong. The features asked for are resolved once per distinct list and registry
//! version ([`RegistryCache::plan`]), so a steady stream of the same request parses no
//! feature reference and searches no definitions. A body in which an object repeats a
//! key is refused by both readings, and named by [`unique_keys`] (docs/online.md).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use quiver_runtime::encoding::KeyValue;
use quiver_sdk::definitions::Asked;
use quiver_sdk::registry::Registered;
use serde_json::Value as Json_;

use super::registry_cache::RegistryCache;
use super::{ApiError, Metrics, ServerState, Unique, bad, repeated, twice, unique_keys};
use crate::lookup::wire::response_json_with;
use crate::lookup::{AnswerAt, EntityColumns, LookupPhases, LookupPlan, RequestFields, check_size, request_values};
use crate::serving_log::Served;

/// One value of an `entities` column as read: a join-key value, or any other JSON value
/// (a request field's, told apart once the features asked for are known).
#[derive(Debug, Clone, PartialEq)]
enum Given {
    Key(KeyValue),
    Other(Json_),
}

impl Given {
    /// The value as JSON.
    fn json(&self) -> Json_ {
        match self {
            Given::Key(KeyValue::Int(i)) => Json_::from(*i),
            Given::Key(KeyValue::Str(s)) => Json_::String(s.clone()),
            Given::Other(j) => j.clone(),
        }
    }
}

/// The `entities` columns as read, in the client's order.
type GivenColumns = Vec<(String, Vec<Given>)>;

/// A request as read: its entity columns, and the features it asks for.
#[derive(Debug, PartialEq)]
struct Parsed<'a> {
    entities: Option<GivenColumns>,
    features: Option<Features<'a>>,
    /// A feature service's name; `Err` with the message when it is not a string.
    service: Option<Result<String, String>>,
    full_names: bool,
    /// Feast's `include_feature_view_version_metadata`: the answer's metadata names each
    /// view read and its version (docs/versions.md).
    versions: bool,
}

/// A `features` list: its strings, or why it is not a list of strings.
#[derive(Debug, PartialEq)]
enum Features<'a> {
    List(Vec<&'a str>),
    Bad(String),
}

/// The fast reading: every field typed. Fields it does not know are ignored, never
/// rejected (Feast clients send more), but read to refuse a repeated key in them, as a
/// repeated field is refused.
#[derive(Debug)]
struct TypedRequest<'a> {
    /// Each value an integer that fits `i64` or a string.
    entities: Option<Ordered<Vec<TypedKey>>>,
    features: Option<Vec<&'a str>>,
    /// A scalar (a list or an object is left to the checked reading).
    feature_service: Option<TypedKey>,
    /// Anything but a boolean (or null) is left to the checked reading to refuse.
    full_feature_names: Option<bool>,
    /// Likewise.
    include_feature_view_version_metadata: Option<bool>,
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for TypedRequest<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = TypedRequest<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a request object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TypedRequest<'a>, A::Error> {
                let mut r = TypedRequest {
                    entities: None,
                    features: None,
                    feature_service: None,
                    full_feature_names: None,
                    include_feature_view_version_metadata: None,
                };
                // The fields met (nothing allocated unless the body has others); keys
                // with escapes are left to the checked reading.
                let (mut met, mut others) = ([false; 5], Vec::<&'de str>::new());
                while let Some(key) = map.next_key::<&'de str>()? {
                    let field = match key {
                        "entities" => 0,
                        "features" => 1,
                        "feature_service" => 2,
                        "full_feature_names" => 3,
                        "include_feature_view_version_metadata" => 4,
                        _ => {
                            map.next_value_seed(Unique { within: Some(key) })?;
                            others.push(key);
                            continue;
                        }
                    };
                    if std::mem::replace(&mut met[field], true) {
                        return Err(serde::de::Error::custom(twice(key, None)));
                    }
                    match field {
                        0 => r.entities = map.next_value()?,
                        1 => r.features = map.next_value()?,
                        2 => r.feature_service = map.next_value()?,
                        3 => r.full_feature_names = map.next_value()?,
                        _ => r.include_feature_view_version_metadata = map.next_value()?,
                    }
                }
                match repeated(others.iter().copied()) {
                    Some(key) => Err(serde::de::Error::custom(twice(key, None))),
                    None => Ok(r),
                }
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// One `entities` value (or the `feature_service`) of the fast reading: a scalar (lists
/// and objects are left to the checked reading).
#[derive(Debug)]
struct TypedKey(Given);

impl<'de> serde::Deserialize<'de> for TypedKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = TypedKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TypedKey, E> {
                Ok(TypedKey(Given::Key(KeyValue::Int(v))))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TypedKey, E> {
                Ok(TypedKey(i64::try_from(v).map_or_else(|_| Given::Other(Json_::from(v)), |v| Given::Key(KeyValue::Int(v)))))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<TypedKey, E> {
                Ok(TypedKey(Given::Other(Json_::from(v))))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<TypedKey, E> {
                Ok(TypedKey(Given::Other(Json_::Bool(v))))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<TypedKey, E> {
                Ok(TypedKey(Given::Other(Json_::Null)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TypedKey, E> {
                Ok(TypedKey(Given::Key(KeyValue::Str(v.to_string()))))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<TypedKey, E> {
                Ok(TypedKey(Given::Key(KeyValue::Str(v))))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// The `entities` object's entries in the order written (the answer echoes the join
/// keys in the client's order, as Feast does); a name written twice is refused (one
/// column would be answered under a name the client maps to the other's values).
#[derive(Debug, Default)]
struct Ordered<V>(Vec<(String, V)>);

impl<'de, V: serde::Deserialize<'de>> serde::Deserialize<'de> for Ordered<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<V>(std::marker::PhantomData<V>);
        impl<'de, V: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of join key to values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Ordered<V>, A::Error> {
                let mut out: Vec<(String, V)> = Vec::new();
                while let Some(entry) = map.next_entry::<String, V>()? {
                    out.push(entry);
                }
                match repeated(out.iter().map(|(name, _)| name.as_str())) {
                    Some(name) => Err(serde::de::Error::custom(twice(name, Some("entities")))),
                    None => Ok(Ordered(out)),
                }
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// The checked reading: values as JSON, so each check can say what is wrong.
#[derive(Debug, serde::Deserialize)]
struct CheckedRequest {
    #[serde(default)]
    entities: Option<Ordered<Json_>>,
    #[serde(default)]
    features: Option<Json_>,
    #[serde(default)]
    feature_service: Option<Json_>,
    #[serde(default)]
    full_feature_names: Option<Json_>,
    #[serde(default)]
    include_feature_view_version_metadata: Option<Json_>,
}

fn service_of(service: Option<Json_>) -> Option<Result<String, String>> {
    match service? {
        Json_::Null => None,
        Json_::String(name) => Some(Ok(name)),
        _ => Some(Err("`feature_service` must be a name".to_string())),
    }
}

/// A flag (`full_feature_names`): a boolean, or absent or null (false).
fn flag_of(name: &str, flag: Option<&Json_>) -> Result<bool, ApiError> {
    match flag {
        None | Some(Json_::Null) => Ok(false),
        Some(Json_::Bool(b)) => Ok(*b),
        Some(other) => Err(bad(format!("`{name}` must be true or false, got {other}"))),
    }
}

impl<'a> Parsed<'a> {
    /// The fast reading; `None` when the body is not a well-formed request of plain
    /// values (the checked reading then says why, or reads what this one cannot).
    fn typed(body: &'a [u8]) -> Option<Parsed<'a>> {
        // UTF-8 checked once for the body, not once per string.
        let r: TypedRequest<'a> = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
        Some(Parsed {
            entities: r.entities.map(|e| e.0.into_iter().map(|(name, given)| (name, given.into_iter().map(|k| k.0).collect())).collect()),
            features: r.features.map(Features::List),
            service: service_of(r.feature_service.map(|s| s.0.json())),
            full_names: r.full_feature_names.unwrap_or(false),
            versions: r.include_feature_view_version_metadata.unwrap_or(false),
        })
    }

    /// The checked reading of `r` (read from the body).
    fn checked(r: &'a CheckedRequest, metrics: &Metrics) -> Result<Parsed<'a>, ApiError> {
        let features = match &r.features {
            None | Some(Json_::Null) => None,
            Some(Json_::Array(list)) => Some(match list.iter().find(|f| !f.is_string()) {
                Some(f) => Features::Bad(quiver_sdk::definitions::BadFeatureRef(f.to_string()).to_string()),
                None => Features::List(list.iter().filter_map(Json_::as_str).collect()),
            }),
            Some(_) => Some(Features::Bad("`features` must be a list of \"view:feature\"".to_string())),
        };
        let entities = match &r.entities {
            None => None,
            Some(entities) => {
                let mut columns = Vec::with_capacity(entities.0.len());
                for (name, values) in &entities.0 {
                    let values = values.as_array().ok_or_else(|| bad(format!("entity `{name}` must be a list of values")))?;
                    check_size(values.len(), 0, usize::MAX).map_err(|e| ApiError::refused(metrics, &e))?;
                    let given = values.iter().map(|v| KeyValue::from_json(v).map_or_else(|| Given::Other(v.clone()), Given::Key)).collect();
                    columns.push((name.clone(), given));
                }
                Some(columns)
            }
        };
        Ok(Parsed {
            entities,
            features,
            service: service_of(r.feature_service.clone()),
            full_names: flag_of("full_feature_names", r.full_feature_names.as_ref())?,
            versions: flag_of("include_feature_view_version_metadata", r.include_feature_view_version_metadata.as_ref())?,
        })
    }

    /// What the request names its features by.
    fn asked(&self) -> Result<Asked<'_>, ApiError> {
        match (&self.features, &self.service) {
            (Some(Features::List(list)), _) => Ok(Asked::Features(list)),
            (Some(Features::Bad(message)), _) => Err(bad(message.clone())),
            (None, Some(Ok(name))) => Ok(Asked::Service(name)),
            (None, Some(Err(message))) => Err(bad(message.clone())),
            (None, None) => Err(bad("the request needs `features` or `feature_service`")),
        }
    }
}

/// The plan of what `request` asks for under `defs`: the references read (or the
/// service's), then [`LookupPlan::new`]'s checks, which every front end shares.
fn plan(registry: &RegistryCache, defs: &Arc<Registered>, asked: Asked<'_>, full_names: bool) -> Result<Arc<LookupPlan>, ApiError> {
    registry.plan(defs, asked, full_names, || {
        let refs = asked.refs(defs.as_ref()).map_err(|e| bad(e.to_string()))?;
        LookupPlan::new(defs, refs, full_names).map_err(|e| ApiError::of(&e))
    })
}

pub(super) async fn get_features(State(state): State<Arc<ServerState>>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let began = Instant::now();
    let checked: CheckedRequest;
    let request = match Parsed::typed(&body) {
        Some(request) => request,
        None => {
            // The fast reading refuses a repeated key too: this names it.
            unique_keys(&body)?;
            checked = serde_json::from_slice(&body).map_err(|e| bad(format!("request body is not a valid request: {e}")))?;
            Parsed::checked(&checked, &state.metrics)?
        }
    };
    let mut defs = state.registry.recent();
    let columns = request.entities.as_ref().ok_or_else(|| bad("the request needs `entities`: {join_key: [values]}"))?;
    // The bounds first, before any work (docs/limits.md).
    let asked = request.asked()?;
    let n_features = asked.len(&defs);
    for (_, values) in columns {
        check_size(values.len(), n_features, state.limits.max_cells).map_err(|e| ApiError::refused(&state.metrics, &e))?;
    }
    let plan = match plan(&state.registry, &defs, asked, request.full_names) {
        Ok(plan) => plan,
        // The registry may have changed since it was last looked at: look now.
        Err(e) => {
            let current = state.registry.current();
            if Arc::ptr_eq(&current, &defs) {
                return Err(e);
            }
            defs = current;
            plan(&state.registry, &defs, asked, request.full_names)?
        }
    };
    let (keys, fields) = split(columns, &plan)?;
    let now = (state.clock)();
    let parsed = began.elapsed();
    let mut lookup = LookupPhases::default();
    let (store, project) = (state.store.as_ref(), &state.project);
    let body = match &state.serving_log {
        // No columns needed: the answer is written straight from the stored rows.
        None => {
            state
                .store_call(plan.answer_json(
                    store,
                    project,
                    &defs,
                    (&keys, &fields),
                    AnswerAt { now, versions: request.versions },
                    &mut lookup,
                ))
                .await?
        }
        Some(log) => {
            let result = state.store_call(plan.lookup(store, project, &defs, (&keys, &fields), now, &mut lookup)).await?;
            let encoding = Instant::now();
            let body = response_json_with(&result, if request.versions { plan.versions_json() } else { &[] });
            lookup.encode = encoding.elapsed();
            // After the answer is written: the log gets the columns, the client the bytes.
            log.log(Served { request_time: now, defs, refs: plan.refs.clone(), n_keys: keys.len(), columns: result, fields });
            body
        }
    };
    state.metrics.phases(parsed, &lookup);
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The `entities` columns split into the join keys and the request fields of the
/// on-demand features `plan` asks for (typed: a 400 naming a field of the wrong type);
/// any other name is a 400 naming those allowed ([`LookupPlan::given`]).
fn split(given: &GivenColumns, plan: &LookupPlan) -> Result<(EntityColumns, RequestFields), ApiError> {
    let (mut keys, mut fields) = (EntityColumns::with_capacity(given.len()), RequestFields::new());
    for (name, values) in given {
        if let Some(field) = plan.given(name).map_err(|e| ApiError::of(&e))? {
            let json: Vec<Json_> = values.iter().map(Given::json).collect();
            fields.push((name.clone(), request_values(field, &json).map_err(|e| ApiError::of(&e))?));
            continue;
        }
        let column = values
            .iter()
            .map(|v| match v {
                Given::Key(k) => Ok(k.clone()),
                Given::Other(v) => Err(bad(format!("entity `{name}`: {v} is not an integer or a string"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        keys.push((name.clone(), column));
    }
    Ok((keys, fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    /// The fast reading agrees with the checked one on every body it reads; the
    /// checked reading is the oracle (it is the request reader the server had before).
    #[test]
    fn the_fast_reading_agrees_with_the_checked_one() {
        let metrics = Metrics::default();
        let bodies = [
            r#"{"entities": {"driver_id": [1, 2]}, "features": ["a:x", "b:y"]}"#,
            r#"{"entities": {"id": ["p", "q\"|"], "n": [-9223372036854775808, 9223372036854775807]}, "features": ["a:x"], "full_feature_names": true}"#,
            r#"{"features": null, "feature_service": "svc", "entities": {"k": []}, "extra": {"nested": [1, 2]}}"#,
            r#"{"features": ["a:\u0078"], "entities": {"k": ["caf\u00e9"]}}"#,
            r#"{"features": ["a:x"], "entities": {"k": [9223372036854775808]}}"#,
            r#"{"features": ["a:x"], "entities": {"k": [1.5]}}"#,
            r#"{"features": ["a:x"], "entities": {"k": [1e3]}}"#,
            r#"{"features": ["a:x"], "entities": {"k": [true]}}"#,
            r#"{"features": ["a:x"], "entities": {"k": 1}}"#,
            r#"{"features": "a:x", "entities": {"k": [1]}}"#,
            r#"{"features": ["a:x", 3], "entities": {"k": [1]}}"#,
            r#"{"feature_service": 7, "entities": {"k": [1]}}"#,
            r#"{"feature_service": null, "entities": {"k": [1], "j": [2]}, "full_feature_names": "yes"}"#,
            r#"{"entities": {"k": [1]}}"#,
        ];
        let mut fast = 0;
        for body in bodies {
            let checked: CheckedRequest = serde_json::from_str(body).unwrap();
            let oracle = Parsed::checked(&checked, &metrics).map_err(|e| e.1);
            match Parsed::typed(body.as_bytes()) {
                Some(read) => {
                    fast += 1;
                    assert_eq!(Ok(&read), oracle.as_ref(), "{body}");
                }
                // What the fast reading refuses is a request with a mistake, or one
                // with escaped feature names, which the checked reading reads.
                None => assert!(
                    match &oracle {
                        Err(_) => true,
                        Ok(p) => matches!(p.features, Some(Features::Bad(_))) || body.contains(r"\u0078"),
                    },
                    "{body}: {oracle:?}"
                ),
            }
        }
        assert_eq!(fast, 9, "the plain requests are read the fast way (any scalar entity value)");
        // A flag that is not a boolean is refused, never read as false.
        let body = r#"{"features": ["a:x"], "entities": {"k": [1]}, "full_feature_names": "yes"}"#;
        assert!(Parsed::typed(body.as_bytes()).is_none());
        let checked: CheckedRequest = serde_json::from_str(body).unwrap();
        let refused = Parsed::checked(&checked, &metrics).unwrap_err();
        assert_eq!((refused.0, refused.1.as_str()), (StatusCode::BAD_REQUEST, r#"`full_feature_names` must be true or false, got "yes""#));
    }

    /// Issue 53: a body in which an object repeats a key is refused by the fast reading
    /// and named by the check after it, wherever the object is; the same key in two
    /// objects is no repeat.
    #[test]
    fn a_repeated_key_is_refused_naming_it() {
        let many: String = (0..40).map(|i| format!(r#""k{i}": [1], "#)).collect();
        let cases = [
            (
                r#"{"entities": {"customer_id": ["C05"], "customer_id": ["C06"]}, "features": ["a:x"]}"#.to_string(),
                r#"request body: key "customer_id" appears twice in "entities""#,
            ),
            (
                r#"{"features": ["a:x"], "entities": {"k": [1]}, "features": ["b:y"]}"#.to_string(),
                r#"request body: key "features" appears twice"#,
            ),
            (r#"{"entities": {"k": [1]}, "features": ["a:x"], "x": 1, "x": 2}"#.to_string(), r#"request body: key "x" appears twice"#),
            (
                r#"{"entities": {"k": [1]}, "features": ["a:x"], "extra": [{"a": 1, "b": {"c": 1, "c": 2}}]}"#.to_string(),
                r#"request body: key "c" appears twice in "b""#,
            ),
            (
                r#"{"entities": {"k": [1]}, "feature_service": {"a": 1, "a": 2}}"#.to_string(),
                r#"request body: key "a" appears twice in "feature_service""#,
            ),
            // Past the few a scan reads: hashed.
            (
                format!(r#"{{"entities": {{{many}"k7": [2]}}, "features": ["a:x"]}}"#),
                r#"request body: key "k7" appears twice in "entities""#,
            ),
            // An escaped key is the same key.
            (
                r#"{"entities": {"k": [1], "\u006b": [2]}, "features": ["a:x"]}"#.to_string(),
                r#"request body: key "k" appears twice in "entities""#,
            ),
        ];
        for (body, want) in cases {
            assert!(Parsed::typed(body.as_bytes()).is_none(), "{body}");
            let refused = unique_keys(body.as_bytes()).unwrap_err();
            assert_eq!(refused.0, StatusCode::BAD_REQUEST);
            assert!(refused.1.starts_with(want), "{body}: {}", refused.1);
        }
        let fine =
            r#"{"entities": {"k": [1], "j": ["x"]}, "features": ["a:x"], "extra": {"k": 1, "j": {"k": 2}}, "more": [{"k": 1}, {"k": 2}]}"#;
        assert!(Parsed::typed(fine.as_bytes()).is_some());
        assert!(unique_keys(fine.as_bytes()).is_ok());
        // Not JSON: left to the reading after it, which says so.
        assert!(unique_keys(b"{not json").is_ok());
    }
}
