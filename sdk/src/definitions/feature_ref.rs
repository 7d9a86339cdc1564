//! `view:feature` references: their one text form and its parsing, and what a request
//! asks for — references or a feature service — resolved with one set of errors.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Definitions, NotFound};
pub use crate::error::BadFeatureRef;

/// A `view:feature` reference, or `view@N:feature` for version `N` of the view
/// (docs/versions.md); without a version it reads the latest. Output columns are
/// named `view__feature` whatever the version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FeatureRef {
    pub view: String,
    pub feature: String,
    /// The view's version asked for; `None`: the latest.
    pub version: Option<u32>,
}

impl FeatureRef {
    pub fn new(view: impl Into<String>, feature: impl Into<String>) -> Self {
        FeatureRef { view: view.into(), feature: feature.into(), version: None }
    }

    /// The same reference pinned to `version` of its view.
    #[must_use]
    pub fn at(mut self, version: u32) -> Self {
        self.version = Some(version);
        self
    }

    /// The output column name, `view__feature` (the version is not part of it: a
    /// model's inputs keep their names across versions).
    pub fn column_name(&self) -> String {
        format!("{}__{}", self.view, self.feature)
    }

    /// The view as a name [`super::Definitions::feature_view`] reads: `view` or
    /// `view@N`.
    pub fn view_name(&self) -> String {
        versioned_name(&self.view, self.version)
    }
}

/// `view` or `view@N`.
pub fn versioned_name(view: &str, version: Option<u32>) -> String {
    match version {
        Some(n) => format!("{view}@{n}"),
        None => view.to_string(),
    }
}

/// Splits `view@N` into the view and its version; `view` alone has none. `None` for a
/// malformed version (`view@`, `view@x`, `view@0`, `view@1@2`).
pub fn split_version(text: &str) -> Option<(&str, Option<u32>)> {
    match text.split_once('@') {
        None => Some((text, None)),
        Some((view, n)) => {
            let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
            let n: u32 = if digits { n.parse().ok()? } else { return None };
            (!view.is_empty() && n >= 1).then_some((view, Some(n)))
        }
    }
}

impl fmt::Display for FeatureRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.version {
            Some(n) => write!(f, "{}@{n}:{}", self.view, self.feature),
            None => write!(f, "{}:{}", self.view, self.feature),
        }
    }
}

impl FromStr for FeatureRef {
    type Err = BadFeatureRef;

    /// Parses `view:feature` or `view@N:feature`: both parts non-empty, exactly one
    /// colon, `N` a whole number from 1.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadFeatureRef(s.to_string());
        match s.split_once(':') {
            Some((v, f)) if !v.is_empty() && !f.is_empty() && !f.contains(':') => {
                let (view, version) = split_version(v.trim()).ok_or_else(bad)?;
                Ok(FeatureRef { view: view.to_string(), feature: f.trim().to_string(), version })
            }
            _ => Err(bad()),
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

/// What a join, an export or a lookup asks for: `view:feature` texts, or a feature
/// service by name. Every front end reads its request into this; [`Asked::refs`]
/// resolves it with the one set of errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked<'a, S = &'a str> {
    Features(&'a [S]),
    Service(&'a str),
}

/// Why [`Asked::refs`] has no references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskedError {
    /// A text that is not `view:feature`.
    Bad(BadFeatureRef),
    UnknownService(NotFound),
    /// An empty list.
    Nothing,
}

impl fmt::Display for AskedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AskedError::Bad(bad) => bad.fmt(f),
            AskedError::UnknownService(e) => f.write_str(&e.0),
            AskedError::Nothing => f.write_str("no features asked for: give feature references (view:feature) or a feature service"),
        }
    }
}

impl std::error::Error for AskedError {}

impl<S: AsRef<str>> Asked<'_, S> {
    /// The references asked for: the texts parsed, or the service's.
    ///
    /// # Errors
    /// [`AskedError`]: a text that does not parse, an unknown service, no texts.
    pub fn refs(&self, defs: &Definitions) -> Result<Vec<FeatureRef>, AskedError> {
        match self {
            Asked::Service(name) => Ok(defs.find_service(name).map_err(AskedError::UnknownService)?.features.clone()),
            Asked::Features([]) => Err(AskedError::Nothing),
            Asked::Features(list) => list.iter().map(|t| t.as_ref().parse().map_err(AskedError::Bad)).collect(),
        }
    }

    /// How many features are asked for (0 for an unknown service), before any is read.
    pub fn len(&self, defs: &Definitions) -> usize {
        match self {
            Asked::Features(list) => list.len(),
            Asked::Service(name) => defs.feature_service(name).map_or(0, |s| s.features.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Asked, AskedError, FeatureRef};
    use crate::{DType, Definitions, FeatureService, FeatureView};

    #[test]
    fn what_is_asked_resolves_with_one_set_of_errors() {
        let defs = Definitions::default()
            .with_feature_view(FeatureView::new("v").with_feature("a", DType::Int64))
            .with_feature_service(FeatureService::new("s").with_feature("v", "a"));
        let want = vec![FeatureRef::new("v", "a")];
        assert_eq!(Asked::Features(&["v:a"]).refs(&defs).unwrap(), want);
        assert_eq!(Asked::Features(&["v:a".to_string()][..]).refs(&defs).unwrap(), want, "owned texts alike");
        assert_eq!(Asked::<&str>::Service("s").refs(&defs).unwrap(), want);
        assert_eq!(Asked::Features(&["va"]).refs(&defs).unwrap_err().to_string(), "bad feature reference `va` (expected `view:feature`)");
        assert!(matches!(Asked::<&str>::Service("t").refs(&defs), Err(AskedError::UnknownService(_))));
        assert_eq!(Asked::<&str>::Features(&[]).refs(&defs), Err(AskedError::Nothing));
        assert_eq!((Asked::<&str>::Service("s").len(&defs), Asked::<&str>::Service("t").len(&defs)), (1, 0));
    }
}
