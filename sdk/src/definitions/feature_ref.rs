//! `view:feature` references: their one text form and its parsing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `view:feature` reference. Output columns are named `view__feature`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FeatureRef {
    pub view: String,
    pub feature: String,
}

impl FeatureRef {
    pub fn new(view: impl Into<String>, feature: impl Into<String>) -> Self {
        FeatureRef { view: view.into(), feature: feature.into() }
    }

    /// The output column name, `view__feature`.
    pub fn column_name(&self) -> String {
        format!("{}__{}", self.view, self.feature)
    }
}

impl fmt::Display for FeatureRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.view, self.feature)
    }
}

/// Error of parsing a feature reference: the text, which is not `view:feature`. Its
/// message is the one wording of a bad reference, whatever front end read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFeatureRef(pub String);

impl fmt::Display for BadFeatureRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad feature reference `{}` (expected `view:feature`)", self.0)
    }
}

impl std::error::Error for BadFeatureRef {}

impl FromStr for FeatureRef {
    type Err = BadFeatureRef;

    /// Parses `view:feature`; both parts non-empty, exactly one colon.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some((v, f)) if !v.is_empty() && !f.is_empty() && !f.contains(':') => Ok(FeatureRef::new(v.trim(), f.trim())),
            _ => Err(BadFeatureRef(s.to_string())),
        }
    }
}

impl Serialize for FeatureRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FeatureRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
