//! `features.yaml`: parsed raw (names and types as text), converted into
//! [`Definitions`] with errors that name the definition, then validated.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::aggregation::{AggFunction, Aggregation};
use crate::definitions::{
    Definitions, Entity, Feature, FeatureRef, FeatureService, FeatureView, JoinKey, OnDemandFeature, OnDemandView, Source,
};
use crate::error::{DefinitionError, Error, Result};
use crate::monitoring::{Monitoring, Thresholds};
use crate::types::{DTYPE_NAMES, DType, KeyType, Ttl};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDefinitions {
    #[serde(default)]
    entities: Option<Vec<RawEntity>>,
    #[serde(default)]
    feature_views: Option<Vec<RawView>>,
    #[serde(default)]
    feature_services: Option<Vec<RawService>>,
    #[serde(default)]
    on_demand_views: Option<Vec<RawOnDemandView>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOnDemandView {
    name: String,
    #[serde(default)]
    inputs: Vec<String>,
    #[serde(default)]
    request: Vec<RawFeature>,
    #[serde(default)]
    features: Vec<RawComputed>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    monitoring: Option<Thresholds>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawComputed {
    name: String,
    dtype: String,
    expr: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    monitoring: Option<Thresholds>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntity {
    name: String,
    #[serde(default)]
    join_keys: Vec<RawJoinKey>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJoinKey {
    name: String,
    dtype: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawView {
    name: String,
    #[serde(default)]
    entities: Vec<String>,
    #[serde(default)]
    features: Vec<RawFeature>,
    #[serde(default)]
    ttl: Option<serde_yaml::Value>,
    #[serde(default)]
    source: Option<Source>,
    #[serde(default)]
    online: Option<bool>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    aggregations: Vec<RawAggregation>,
    #[serde(default)]
    monitoring: Option<Thresholds>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAggregation {
    name: String,
    function: String,
    column: String,
    #[serde(default, alias = "time_window")]
    window: Option<serde_yaml::Value>,
    #[serde(default)]
    hop: Option<serde_yaml::Value>,
    #[serde(default)]
    k: Option<u32>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    monitoring: Option<Thresholds>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFeature {
    name: String,
    dtype: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    expr: String,
    #[serde(default)]
    monitoring: Option<Thresholds>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    name: String,
    #[serde(default)]
    features: Vec<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    monitoring: Option<Thresholds>,
}

/// Parses and validates the text of a `features.yaml`.
///
/// # Errors
/// [`Error::Definition`] with the YAML position for syntax and shape errors, or the
/// definition and field for bad types, TTLs and references.
///
/// ```
/// let defs = quiver_sdk::yaml::parse_definitions(r#"
/// entities: [{name: driver, join_keys: [{name: driver_id, dtype: int64}]}]
/// feature_views:
///   - {name: stats, entities: [driver], ttl: 2h, features: [{name: trips, dtype: int64}]}
/// "#).unwrap();
/// assert_eq!(defs.feature_views[0].ttl.secs(), 7200);
/// ```
pub fn parse_definitions(text: &str) -> Result<Definitions> {
    let defs = parse_unvalidated(text)?;
    defs.validate()?;
    Ok(defs)
}

/// As [`parse_definitions`], validated as a file to apply is
/// ([`Definitions::validate_unmerged`]: a service's references to features the latest
/// versions lack are checked once merged with the registry's pins).
///
/// # Errors
/// As [`parse_definitions`], less those references.
pub fn parse_definitions_unmerged(text: &str) -> Result<Definitions> {
    let defs = parse_unvalidated(text)?;
    defs.validate_unmerged()?;
    Ok(defs)
}

fn parse_unvalidated(text: &str) -> Result<Definitions> {
    let raw: RawDefinitions = if is_blank(text) {
        RawDefinitions::default()
    } else {
        serde_yaml::from_str(text).map_err(|e| DefinitionError::Yaml(yaml_message(&e)))?
    };
    Ok(convert(raw)?)
}

/// Reads, parses and validates a `features.yaml`; errors name the file.
///
/// # Errors
/// As [`parse_definitions`], plus [`Error::Io`] when the file cannot be read.
pub fn load_definitions(path: &Path) -> Result<Definitions> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_definitions(&text).map_err(|e| e.in_file(path))
}

/// As [`load_definitions`], validated as [`parse_definitions_unmerged`] does.
///
/// # Errors
/// As [`parse_definitions_unmerged`], plus [`Error::Io`] when the file cannot be read.
pub fn load_definitions_unmerged(path: &Path) -> Result<Definitions> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_definitions_unmerged(&text).map_err(|e| e.in_file(path))
}

/// True for a document of only comments and blank lines (an `init` skeleton).
fn is_blank(text: &str) -> bool {
    text.lines().map(str::trim).all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// serde_yaml's message, one line, with its position.
pub(crate) fn yaml_message(e: &serde_yaml::Error) -> String {
    e.to_string().replace('\n', " ")
}

fn convert(raw: RawDefinitions) -> Result<Definitions, DefinitionError> {
    let mut defs = Definitions::default();
    for e in raw.entities.unwrap_or_default() {
        let mut join_keys = Vec::new();
        for k in e.join_keys {
            let dtype: KeyType = k.dtype.parse().map_err(|_| DefinitionError::BadKeyType {
                entity: e.name.clone(),
                key: k.name.clone(),
                got: k.dtype.clone(),
            })?;
            join_keys.push(JoinKey { name: k.name, dtype });
        }
        defs.entities.push(Entity { name: e.name, join_keys, description: e.description, tags: e.tags });
    }
    for v in raw.feature_views.unwrap_or_default() {
        let mut features = Vec::new();
        let mut monitoring = Monitoring { view: v.monitoring.unwrap_or_default(), features: BTreeMap::new() };
        for a in &v.aggregations {
            if let Some(t) = a.monitoring {
                monitoring.features.insert(a.name.clone(), t);
            }
        }
        for f in v.features {
            if let Some(t) = f.monitoring {
                monitoring.features.insert(f.name.clone(), t);
            }
            let dtype: DType = f.dtype.parse().map_err(|_| DefinitionError::BadDtype {
                view: v.name.clone(),
                feature: f.name.clone(),
                got: f.dtype.clone(),
                expected: DTYPE_NAMES,
            })?;
            features.push(Feature { name: f.name, dtype, description: f.description, expr: f.expr });
        }
        let ttl = parse_ttl(&v.name, v.ttl.as_ref())?;
        let aggregations = v.aggregations.into_iter().map(|a| convert_aggregation(&v.name, a)).collect::<Result<_, _>>()?;
        defs.feature_views.push(FeatureView {
            name: v.name,
            version: crate::definitions::FIRST_VERSION,
            entities: v.entities,
            features,
            ttl,
            source: v.source.unwrap_or_default(),
            online: v.online.unwrap_or(true),
            tags: v.tags,
            description: v.description,
            aggregations,
            monitoring,
        });
    }
    for s in raw.feature_services.unwrap_or_default() {
        let mut features = Vec::new();
        for text in s.features {
            let r: FeatureRef = text.parse().map_err(|_| DefinitionError::BadFeatureRef { service: s.name.clone(), got: text.clone() })?;
            features.push(r);
        }
        defs.feature_services.push(FeatureService {
            name: s.name,
            features,
            description: s.description,
            tags: s.tags,
            monitoring: s.monitoring.unwrap_or_default(),
        });
    }
    for v in raw.on_demand_views.unwrap_or_default() {
        let dtype = |what: &str, name: &str, text: &str| -> Result<DType, DefinitionError> {
            text.parse().map_err(|_| DefinitionError::OnDemand {
                view: v.name.clone(),
                reason: format!("{what} `{name}`: unknown dtype `{text}` (expected one of {DTYPE_NAMES})"),
            })
        };
        let mut request = Vec::new();
        for f in &v.request {
            if f.monitoring.is_some() {
                return Err(DefinitionError::OnDemand {
                    view: v.name.clone(),
                    reason: format!("request field `{}` has `monitoring` (monitor the features computed from it)", f.name),
                });
            }
            if !f.expr.is_empty() {
                return Err(DefinitionError::OnDemand {
                    view: v.name.clone(),
                    reason: format!("request field `{}` has an `expr` (a request field is a value the request carries)", f.name),
                });
            }
            request.push(Feature {
                name: f.name.clone(),
                dtype: dtype("request field", &f.name, &f.dtype)?,
                description: f.description.clone(),
                expr: String::new(),
            });
        }
        let mut features = Vec::new();
        let mut monitoring = Monitoring { view: v.monitoring.unwrap_or_default(), features: BTreeMap::new() };
        for f in &v.features {
            if let Some(t) = f.monitoring {
                monitoring.features.insert(f.name.clone(), t);
            }
            features.push(OnDemandFeature {
                name: f.name.clone(),
                dtype: dtype("feature", &f.name, &f.dtype)?,
                expr: f.expr.clone(),
                description: f.description.clone(),
            });
        }
        defs.on_demand_views.push(OnDemandView {
            name: v.name,
            version: crate::definitions::FIRST_VERSION,
            inputs: v.inputs,
            request,
            features,
            description: v.description,
            tags: v.tags,
            monitoring,
        });
    }
    Ok(defs)
}

fn convert_aggregation(view: &str, a: RawAggregation) -> Result<Aggregation, DefinitionError> {
    let bad = |reason: String| DefinitionError::BadAggregation { view: view.to_string(), aggregation: a.name.clone(), reason };
    let function: AggFunction = a.function.parse().map_err(bad)?;
    let duration = |what: &str, value: &serde_yaml::Value| -> Result<Ttl, DefinitionError> {
        let text = match value {
            serde_yaml::Value::Number(n) => {
                return n
                    .as_u64()
                    .map(Ttl::from_secs)
                    .ok_or_else(|| bad(format!("bad {what} `{n}`: expected whole, non-negative seconds")));
            }
            serde_yaml::Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
        };
        Ttl::parse(&text).map_err(|e| bad(format!("bad {what} `{}`: {} (expected e.g. 30m, 1h, 7d)", e.text, e.reason)))
    };
    let window = match &a.window {
        Some(w) => duration("window", w)?,
        None => return Err(bad("no window (expected e.g. `window: 1h`)".to_string())),
    };
    let hop = a.hop.as_ref().map(|h| duration("hop", h)).transpose()?;
    Ok(Aggregation { name: a.name.clone(), function, column: a.column.clone(), window, hop, k: a.k, description: a.description.clone() })
}

fn parse_ttl(view: &str, value: Option<&serde_yaml::Value>) -> Result<Ttl, DefinitionError> {
    let bad = |got: String, reason: &str| DefinitionError::BadTtl { view: view.to_string(), got, reason: reason.to_string() };
    match value {
        None | Some(serde_yaml::Value::Null) => Ok(Ttl::UNBOUNDED),
        Some(serde_yaml::Value::Number(n)) => match n.as_u64() {
            Some(secs) => Ok(Ttl::from_secs(secs)),
            None => Err(bad(n.to_string(), "expected whole, non-negative seconds")),
        },
        Some(serde_yaml::Value::String(s)) => Ttl::parse(s).map_err(|e| bad(e.text, e.reason)),
        Some(other) => Err(bad(serde_yaml::to_string(other).unwrap_or_default().trim().to_string(), "expected a duration")),
    }
}
