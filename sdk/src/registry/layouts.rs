//! What the registry keeps beside the definitions so that online rows written under
//! earlier definitions of a view stay readable (docs/online.md, "Changing a view"): the
//! features and aggregations each view had, by the schema fingerprint of the rows it
//! wrote then. Never written by hand, not part of a plan, not a definition.

use std::collections::BTreeMap;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

use crate::aggregation::Aggregation;
use crate::definitions::{Definitions, Feature, FeatureView, fingerprint};

/// The earlier online layouts of the views, by fingerprint (16 hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlierLayouts {
    /// The features of online rows written under earlier definitions of a view: a
    /// lookup reads such a row by feature name and type, so a feature added by `apply`
    /// never blanks the features already served.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub online_layouts: BTreeMap<String, Vec<Feature>>,
    /// The aggregations of event-log records written under earlier definitions of a
    /// view, by the same fingerprint: a lookup answers such a record's aggregations by
    /// definition, so an aggregation added by `apply` never blanks those already served.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub online_aggregations: BTreeMap<String, Vec<Aggregation>>,
}

impl EarlierLayouts {
    pub fn is_empty(&self) -> bool {
        self.online_layouts.is_empty() && self.online_aggregations.is_empty()
    }

    /// The features of rows written under the schema `fingerprint` of a view, when the
    /// registry kept them.
    pub fn online_layout(&self, fingerprint: u64) -> Option<&[Feature]> {
        self.online_layouts.get(&format!("{fingerprint:016x}")).map(Vec::as_slice)
    }

    /// `view` as it was defined when online rows or records of `fingerprint` were
    /// written: its features and (an event log) aggregations then, when the registry
    /// kept them and they give that fingerprint.
    pub fn earlier_view(&self, view: &FeatureView, fingerprint: u64) -> Option<FeatureView> {
        let key = format!("{fingerprint:016x}");
        let features = self.online_layouts.get(&key)?.clone();
        let aggregations = self.online_aggregations.get(&key).cloned().unwrap_or_default();
        let earlier = FeatureView { features, aggregations, ..view.clone() };
        (self::fingerprint(&earlier) == fingerprint).then_some(earlier)
    }

    /// Keeps the layout of every view of `old` whose fingerprint `new` changes, so the
    /// rows it wrote stay readable by name.
    pub(super) fn keep(&mut self, old: &Definitions, new: &Definitions) {
        for view in &old.feature_views {
            let (before, after) = (fingerprint(view), new.feature_view(&view.name).map(fingerprint));
            if after.is_some_and(|after| after != before) {
                self.online_layouts.insert(format!("{before:016x}"), view.features.clone());
                if view.is_event_log() {
                    self.online_aggregations.insert(format!("{before:016x}"), view.aggregations.clone());
                }
            }
        }
    }
}

/// The applied definitions with the earlier layouts the registry kept: what a lookup
/// needs to read every online row. Reads as the [`Definitions`] it holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registered {
    pub definitions: Definitions,
    pub layouts: EarlierLayouts,
}

impl Registered {
    /// Definitions no earlier layout was kept for (nothing applied before them).
    pub fn new(definitions: Definitions) -> Registered {
        Registered { definitions, layouts: EarlierLayouts::default() }
    }
}

impl Deref for Registered {
    type Target = Definitions;

    fn deref(&self) -> &Definitions {
        &self.definitions
    }
}
