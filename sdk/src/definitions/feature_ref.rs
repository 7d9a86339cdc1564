//! `view:feature` references: their one text form and its parsing, and what a request
//! asks for — references or a feature service — resolved with one set of errors.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Definitions, NotFound};
pub use crate::error::BadFeatureRef;

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
