//! The definition types of docs/concepts.md — entities, sources, feature views, feature services —
//! and the Rust builder API that produces them.
//!
//! These serde structures are the one shape of a definition: `features.yaml`
//! ([`crate::yaml`]), the builders here and the Python SDK all produce a
//! [`Definitions`], and [`Definitions::validate`] checks it the same way whichever way it
//! was written. The registry stores them as JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::aggregation::Aggregation;
use crate::error::DefinitionError;
use crate::monitoring::{Monitoring, Thresholds};
use crate::types::{DType, KeyType, Ttl};

mod build;
mod feature_ref;
mod fingerprint;
mod on_demand;
mod versions;

pub use feature_ref::{Asked, AskedError, BadFeatureRef, FeatureRef, split_version, versioned_name};
pub use fingerprint::fingerprint;
pub use on_demand::{OnDemandFeature, OnDemandView};
pub use versions::{EarlierVersions, FIRST_VERSION, VersionError};
pub(crate) use versions::{first_version, is_first_version};

/// One join key of an entity: a spine column and its type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinKey {
    pub name: String,
    pub dtype: KeyType,
}

/// What features are about (a driver, a customer), identified by one or more join keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entity {
    pub name: String,
    pub join_keys: Vec<JoinKey>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// Message format of a stream source. JSON is the one format so far (docs/streaming.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamFormat {
    #[default]
    Json,
}

/// A Kafka topic that feeds a view; its messages land in the view's batch source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSource {
    pub topic: String,
    #[serde(default)]
    pub format: StreamFormat,
}

/// The column that holds event time when a source does not name one.
pub const DEFAULT_TIMESTAMP_FIELD: &str = "event_timestamp";

fn default_timestamp_field() -> String {
    DEFAULT_TIMESTAMP_FIELD.to_string()
}

/// Where a view's history lives: a Delta table, its event-time column and optional
/// created-time column, and an optional stream that lands in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Local path or object-store URI of the Delta table; `None` means the default,
    /// `<offline root>/<view name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default = "default_timestamp_field")]
    pub timestamp_field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_timestamp_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamSource>,
    /// A write-time filter over the raw row: rows for which it is not true are not
    /// written (docs/transformations.md#write-time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Input columns that are not features, read only by the filter and expressions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw: Vec<Feature>,
}

impl Default for Source {
    fn default() -> Self {
        Source {
            path: None,
            timestamp_field: default_timestamp_field(),
            created_timestamp_field: None,
            stream: None,
            filter: None,
            raw: Vec::new(),
        }
    }
}

/// One typed feature of a view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Feature {
    pub name: String,
    pub dtype: DType,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// A feature view's feature computed at write time from the raw row
    /// (docs/transformations.md#write-time); empty: stored as it comes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expr: String,
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// A group of features of the same entities, read from one source with one TTL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureView {
    pub name: String,
    /// Its version (docs/versions.md): 1 until `apply` makes a breaking change to it
    /// while it holds data, which creates the next one beside it. Assigned by the
    /// registry, never written in a definition.
    #[serde(default = "first_version", skip_serializing_if = "is_first_version")]
    pub version: u32,
    pub entities: Vec<String>,
    pub features: Vec<Feature>,
    /// `Ttl::UNBOUNDED` when absent or 0.
    #[serde(default)]
    pub ttl: Ttl,
    #[serde(default)]
    pub source: Source,
    /// Whether materialization and streaming keep this view in the online store.
    /// Defaults to true, as in Feast.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub online: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Windowed aggregations of the view's events (docs/aggregations.md). A view with any is an
    /// event log: its rows are events, its served features are these aggregations, and
    /// its `features` are the event columns they read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregations: Vec<Aggregation>,
    /// Drift and skew thresholds of the view and its features (docs/monitoring.md).
    #[serde(default, skip_serializing_if = "Monitoring::is_empty")]
    pub monitoring: Monitoring,
}

impl FeatureView {
    /// The name its storage goes by (docs/versions.md#storage): the view's name for
    /// version 1 (the table and keys it always had), `name@N` for version `N` — the
    /// online keys' view part; the Delta table is [`crate::Config::view_table`]'s.
    pub fn storage_name(&self) -> std::borrow::Cow<'_, str> {
        if self.version == FIRST_VERSION {
            std::borrow::Cow::Borrowed(&self.name)
        } else {
            std::borrow::Cow::Owned(format!("{}@{}", self.name, self.version))
        }
    }

    /// `name` for version 1, `name@N` otherwise: how messages name this version.
    pub fn versioned_name(&self) -> String {
        self.storage_name().into_owned()
    }

    /// Whether the view takes online writes (materialize, push, `/push`, the stream):
    /// the one rule, `online: true`. Reads of a view that does not are refused too.
    pub fn takes_online_writes(&self) -> bool {
        self.online
    }

    /// [`FeatureView::takes_online_writes`] as the one refusal of an online write.
    ///
    /// # Errors
    /// The reason, naming the view.
    pub fn check_online_writes(&self) -> Result<(), String> {
        if self.takes_online_writes() {
            return Ok(());
        }
        Err(format!("feature view `{}` is offline only (`online: false`): it takes no online writes", self.name))
    }

    /// Whether its writers compute what they store: a source filter, or a feature with
    /// an expression (docs/transformations.md#write-time).
    pub fn has_write_expressions(&self) -> bool {
        self.source.filter.is_some() || self.features.iter().any(|f| !f.expr.is_empty())
    }

    /// Whether the view is an event log (it has aggregations).
    pub fn is_event_log(&self) -> bool {
        !self.aggregations.is_empty()
    }

    /// The aggregation of this name, if any.
    pub fn aggregation(&self, name: &str) -> Option<&Aggregation> {
        self.aggregations.iter().find(|a| a.name == name)
    }

    /// The served feature `name`: an aggregation (typed by its output) of an event log,
    /// a feature of any other view.
    pub fn served_feature(&self, name: &str) -> Option<Feature> {
        if !self.is_event_log() {
            return self.feature(name).cloned();
        }
        let agg = self.aggregation(name)?;
        let dtype = agg.output_dtype(self.feature(&agg.column)?.dtype)?;
        Some(Feature { name: agg.name.clone(), dtype, description: agg.description.clone(), expr: String::new() })
    }

    /// Every served feature, in order (see [`FeatureView::served_feature`]).
    pub fn served_features(&self) -> Vec<Feature> {
        if !self.is_event_log() {
            return self.features.clone();
        }
        self.aggregations.iter().filter_map(|a| self.served_feature(&a.name)).collect()
    }

    /// The ttl in microseconds; `None` when unbounded (absent, 0, or beyond an i64).
    pub fn ttl_us(&self) -> Option<i64> {
        self.ttl.as_duration().and_then(|d| i64::try_from(d.as_micros()).ok())
    }

    /// The feature of this name, if any.
    pub fn feature(&self, name: &str) -> Option<&Feature> {
        self.features.iter().find(|f| f.name == name)
    }
}

/// A named list of feature references for one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureService {
    pub name: String,
    pub features: Vec<FeatureRef>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Drift and skew thresholds of its features (docs/monitoring.md).
    #[serde(default, skip_serializing_if = "Thresholds::is_empty")]
    pub monitoring: Thresholds,
}

/// The first definition in `value` (a [`Definitions`] document as JSON) that does not
/// read as its type, named: `feature view \`rides\`, aggregation \`n\``.
fn locate_json_error(value: &serde_json::Value) -> Option<DefinitionError> {
    fn fails<T: serde::de::DeserializeOwned>(item: &serde_json::Value) -> Option<String> {
        serde_json::from_value::<T>(item.clone()).err().map(|e| e.to_string())
    }
    let name = |item: &serde_json::Value| item.get("name").and_then(serde_json::Value::as_str).unwrap_or("(unnamed)").to_string();
    let items = |key: &str| value.get(key).and_then(serde_json::Value::as_array).into_iter().flatten();
    for item in items("entities") {
        if let Some(reason) = fails::<Entity>(item) {
            return Some(DefinitionError::Shape { what: format!("entity `{}`", name(item)), reason });
        }
    }
    for item in items("feature_views") {
        let Some(reason) = fails::<FeatureView>(item) else { continue };
        let view = name(item);
        let aggregations = item.get("aggregations").and_then(serde_json::Value::as_array).into_iter().flatten();
        for a in aggregations {
            if let Some(reason) = fails::<Aggregation>(a) {
                return Some(DefinitionError::BadAggregation { view, aggregation: name(a), reason });
            }
        }
        for f in item.get("features").and_then(serde_json::Value::as_array).into_iter().flatten() {
            if let Some(reason) = fails::<Feature>(f) {
                return Some(DefinitionError::Shape { what: format!("feature view `{view}`, feature `{}`", name(f)), reason });
            }
        }
        return Some(DefinitionError::Shape { what: format!("feature view `{view}`"), reason });
    }
    for item in items("feature_services") {
        if let Some(reason) = fails::<FeatureService>(item) {
            return Some(DefinitionError::Shape { what: format!("feature service `{}`", name(item)), reason });
        }
    }
    for item in items("on_demand_views") {
        let Some(reason) = fails::<OnDemandView>(item) else { continue };
        let view = name(item);
        for f in item.get("features").and_then(serde_json::Value::as_array).into_iter().flatten() {
            if let Some(reason) = fails::<OnDemandFeature>(f) {
                return Some(DefinitionError::Shape { what: format!("on-demand view `{view}`, feature `{}`", name(f)), reason });
            }
        }
        return Some(DefinitionError::Shape { what: format!("on-demand view `{view}`"), reason });
    }
    None
}

/// Everything a feature repository defines.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definitions {
    #[serde(default)]
    pub entities: Vec<Entity>,
    #[serde(default)]
    pub feature_views: Vec<FeatureView>,
    #[serde(default)]
    pub feature_services: Vec<FeatureService>,
    /// Request-time features (docs/transformations.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_demand_views: Vec<OnDemandView>,
    /// The live versions of views before their latest (which the lists above hold):
    /// kept by the registry, never defined by hand (docs/versions.md).
    #[serde(default, skip_serializing_if = "EarlierVersions::is_empty")]
    pub earlier_versions: EarlierVersions,
}

impl Definitions {
    /// Definitions as JSON of these structures (what the Python SDK sends), not yet
    /// validated. An error names the entity, feature view (and aggregation) or feature
    /// service whose shape is wrong, never a position in the text.
    ///
    /// # Errors
    /// [`DefinitionError::Shape`] or [`DefinitionError::BadAggregation`]; a text that is
    /// not JSON at all, [`DefinitionError::Yaml`].
    pub fn from_json(text: &str) -> Result<Definitions, DefinitionError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| DefinitionError::Yaml(format!("definitions are not valid JSON: {e}")))?;
        serde_json::from_value::<Definitions>(value.clone()).map_err(|whole| {
            locate_json_error(&value)
                .unwrap_or_else(|| DefinitionError::Shape { what: "definitions".to_string(), reason: whole.to_string() })
        })
    }

    pub fn entity(&self, name: &str) -> Option<&Entity> {
        self.entities.iter().find(|e| e.name == name)
    }

    /// The feature view `name` (its latest version), or `name@N` (version `N`, the
    /// latest or an earlier live one).
    pub fn feature_view(&self, name: &str) -> Option<&FeatureView> {
        let (name, version) = split_version(name)?;
        let latest = self.feature_views.iter().find(|v| v.name == name)?;
        match version {
            None => Some(latest),
            Some(n) if n == latest.version => Some(latest),
            Some(n) => self.earlier_versions.feature_views.iter().find(|v| v.name == name && v.version == n),
        }
    }

    pub fn feature_service(&self, name: &str) -> Option<&FeatureService> {
        self.feature_services.iter().find(|s| s.name == name)
    }

    /// The on-demand view `name` (its latest version), or `name@N`.
    pub fn on_demand_view(&self, name: &str) -> Option<&OnDemandView> {
        let (name, version) = split_version(name)?;
        let latest = self.on_demand_views.iter().find(|v| v.name == name)?;
        match version {
            None => Some(latest),
            Some(n) if n == latest.version => Some(latest),
            Some(n) => self.earlier_versions.on_demand_views.iter().find(|v| v.name == name && v.version == n),
        }
    }

    /// The view called `name` (or `name@N`), or the one "unknown feature view" message.
    ///
    /// # Errors
    /// [`NotFound`] naming the views there are, or the live versions of the view.
    pub fn find_view(&self, name: &str) -> Result<&FeatureView, NotFound> {
        self.feature_view(name).ok_or_else(|| {
            if let Some(missing) = self.missing_version(name) {
                return missing;
            }
            NotFound(format!("unknown feature view `{name}` (known: {})", known(self.feature_views.iter().map(|v| v.name.as_str()))))
        })
    }

    /// The entity called `name`, or the one "unknown entity" message.
    ///
    /// # Errors
    /// [`NotFound`] naming the entities there are.
    pub fn find_entity(&self, name: &str) -> Result<&Entity, NotFound> {
        self.entity(name)
            .ok_or_else(|| NotFound(format!("unknown entity `{name}` (known: {})", known(self.entities.iter().map(|e| e.name.as_str())))))
    }

    /// The service called `name`, or the one "unknown feature service" message.
    ///
    /// # Errors
    /// [`NotFound`] naming the services there are.
    pub fn find_service(&self, name: &str) -> Result<&FeatureService, NotFound> {
        self.feature_service(name).ok_or_else(|| {
            NotFound(format!("unknown feature service `{name}` (known: {})", known(self.feature_services.iter().map(|s| s.name.as_str()))))
        })
    }

    /// The stored feature (or an event log's aggregation) a reference names.
    ///
    /// # Errors
    /// [`NotFound`]: an unknown view (naming the views there are), an unknown feature
    /// (naming the view's features), or an on-demand feature (computed, not stored).
    pub fn find_feature(&self, r: &FeatureRef) -> Result<(&FeatureView, Feature), NotFound> {
        match self.find(r)? {
            Found::Stored(view, feature) => Ok((view, feature)),
            Found::OnDemand(..) => Err(NotFound(format!("`{r}` is an on-demand feature: computed when read, never stored"))),
        }
    }

    /// What a reference names: a stored feature (or aggregation), or an on-demand one.
    ///
    /// # Errors
    /// [`NotFound`]: an unknown view (naming the views there are, both kinds) or an
    /// unknown feature (naming the view's features).
    pub fn find(&self, r: &FeatureRef) -> Result<Found<'_>, NotFound> {
        let name = r.view_name();
        if self.feature_view(&name).is_none()
            && self.on_demand_view(&name).is_none()
            && let Some(missing) = self.missing_version(&name)
        {
            return Err(missing);
        }
        if let Some(view) = self.on_demand_view(&name) {
            let feature = view.feature(&r.feature).ok_or_else(|| {
                NotFound(format!(
                    "unknown feature `{r}` (on-demand view `{}` has: {})",
                    view.name,
                    known(view.features.iter().map(|f| f.name.as_str()))
                ))
            })?;
            return Ok(Found::OnDemand(view, feature));
        }
        let Some(view) = self.feature_view(&name) else {
            return Err(NotFound(format!(
                "unknown feature view `{}` in `{r}` (known: {})",
                r.view,
                known(self.feature_views.iter().map(|v| v.name.as_str()).chain(self.on_demand_views.iter().map(|v| v.name.as_str())))
            )));
        };
        let feature = view.served_feature(&r.feature).ok_or_else(|| {
            NotFound(format!(
                "unknown feature `{r}` (feature view `{}` has: {})",
                view.name,
                known(view.served_features().iter().map(|f| f.name.as_str()))
            ))
        })?;
        Ok(Found::Stored(view, feature))
    }

    /// The type of the feature `r` names, of either kind; `None` when unknown.
    pub fn feature_dtype(&self, r: &FeatureRef) -> Option<DType> {
        match self.find(r).ok()? {
            Found::Stored(_, feature) => Some(feature.dtype),
            Found::OnDemand(_, feature) => Some(feature.dtype),
        }
    }

    /// The join keys of a view, in order: its entities' keys, de-duplicated by name.
    /// Empty when the view or one of its entities is unknown (validation rejects that).
    pub fn join_keys(&self, view: &FeatureView) -> Vec<JoinKey> {
        let mut keys: Vec<JoinKey> = Vec::new();
        for entity in &view.entities {
            let Some(entity) = self.entity(entity) else {
                return Vec::new();
            };
            for key in &entity.join_keys {
                if !keys.iter().any(|k| k.name == key.name) {
                    keys.push(key.clone());
                }
            }
        }
        keys
    }

    /// Adds definitions (the builder API's way of collecting them).
    #[must_use]
    pub fn with_entity(mut self, entity: Entity) -> Self {
        self.entities.push(entity);
        self
    }

    #[must_use]
    pub fn with_feature_view(mut self, view: FeatureView) -> Self {
        self.feature_views.push(view);
        self
    }

    #[must_use]
    pub fn with_feature_service(mut self, service: FeatureService) -> Self {
        self.feature_services.push(service);
        self
    }

    #[must_use]
    pub fn with_on_demand_view(mut self, view: OnDemandView) -> Self {
        self.on_demand_views.push(view);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_refs_parse_and_name_columns() {
        let r: FeatureRef = "driver_hourly:conv_rate".parse().unwrap();
        assert_eq!(r.view, "driver_hourly");
        assert_eq!(r.column_name(), "driver_hourly__conv_rate");
        assert_eq!(r.to_string(), "driver_hourly:conv_rate");
        for bad in ["conv_rate", ":x", "v:", "a:b:c", ""] {
            assert!(bad.parse::<FeatureRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn composite_join_keys_are_collected_once_in_order() {
        let defs = Definitions::default()
            .with_entity(Entity::new("driver").with_join_key("driver_id", KeyType::Int64))
            .with_entity(Entity::new("trip").with_join_key("driver_id", KeyType::Int64).with_join_key("trip_id", KeyType::String));
        let view = FeatureView::new("v").with_entity("driver").with_entity("trip");
        let names: Vec<_> = defs.join_keys(&view).into_iter().map(|k| k.name).collect();
        assert_eq!(names, ["driver_id", "trip_id"]);
    }
}

/// The description and tags setters of every named definition, written once.
macro_rules! described {
    ($($ty:ident),*) => {$(
        impl $ty {
            #[must_use]
            pub fn with_description(mut self, description: impl Into<String>) -> Self {
                self.description = description.into();
                self
            }

            #[must_use]
            pub fn with_tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
                self.tags.insert(key.into(), value.into());
                self
            }
        }
    )*};
}

described!(Entity, FeatureView, FeatureService, OnDemandView);

/// `a, b, c`, or `none`: the list of what is known in every "unknown ..." message.
pub fn known<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    if names.is_empty() { "none".to_string() } else { names.join(", ") }
}

/// A name the definitions lack; the message names those they have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotFound(pub String);

/// What a feature reference names ([`Definitions::find`]).
#[derive(Debug, Clone)]
pub enum Found<'a> {
    /// A feature view's served feature (an event log's aggregation).
    Stored(&'a FeatureView, Feature),
    /// An on-demand view's feature.
    OnDemand(&'a OnDemandView, &'a OnDemandFeature),
}
