//! On-demand views as data (docs/transformations.md): compiled by
//! [`crate::on_demand::compile`], evaluated by `quiver_runtime::on_demand`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Feature;
use crate::types::DType;

/// Features computed at request time from stored features, aggregations and what the
/// request carries (docs/transformations.md): every expression reads one row of its
/// inputs, as of the request, and is computed by the one expression engine online and
/// offline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnDemandView {
    pub name: String,
    /// Its version (docs/versions.md): a change of a feature's expression or type
    /// creates the next one beside it. Assigned by the registry.
    #[serde(default = "super::first_version", skip_serializing_if = "super::is_first_version")]
    pub version: u32,
    /// The feature views (or on-demand views defined before this one) its expressions
    /// read, as of the request: `view` reads the latest version, `view@N` version `N`
    /// (pinned by `apply` when the view it read gets a new version).
    #[serde(default)]
    pub inputs: Vec<String>,
    /// The values each request (or spine row) carries for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request: Vec<Feature>,
    pub features: Vec<OnDemandFeature>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Drift and skew thresholds of the view and its features (docs/monitoring.md).
    #[serde(default, skip_serializing_if = "crate::monitoring::Monitoring::is_empty")]
    pub monitoring: crate::monitoring::Monitoring,
}

/// One feature of an on-demand view: a typed SQL scalar expression.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnDemandFeature {
    pub name: String,
    pub dtype: DType,
    pub expr: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

impl OnDemandView {
    /// `name` for version 1, `name@N` otherwise.
    pub fn versioned_name(&self) -> String {
        super::versioned_name(&self.name, (self.version != super::FIRST_VERSION).then_some(self.version))
    }

    pub fn feature(&self, name: &str) -> Option<&OnDemandFeature> {
        self.features.iter().find(|f| f.name == name)
    }
}

impl OnDemandView {
    pub fn new(name: impl Into<String>) -> Self {
        OnDemandView {
            name: name.into(),
            version: super::FIRST_VERSION,
            inputs: Vec::new(),
            request: Vec::new(),
            features: Vec::new(),
            description: String::new(),
            tags: BTreeMap::new(),
            monitoring: crate::monitoring::Monitoring::default(),
        }
    }

    /// Reads the features of `view` (a feature view or an earlier on-demand view).
    #[must_use]
    pub fn with_input(mut self, view: impl Into<String>) -> Self {
        self.inputs.push(view.into());
        self
    }

    /// A value each request carries.
    #[must_use]
    pub fn with_request(mut self, name: impl Into<String>, dtype: DType) -> Self {
        self.request.push(Feature { name: name.into(), dtype, description: String::new(), expr: String::new() });
        self
    }

    /// A feature computed by `expr`.
    #[must_use]
    pub fn with_feature(mut self, name: impl Into<String>, dtype: DType, expr: impl Into<String>) -> Self {
        self.features.push(OnDemandFeature { name: name.into(), dtype, expr: expr.into(), description: String::new() });
        self
    }
}
