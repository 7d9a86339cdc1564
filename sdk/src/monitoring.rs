//! Monitoring thresholds (docs/monitoring.md): what `quiver monitor` and the server's
//! gauges hold a feature's drift and skew statistics against. Set on a feature, a view
//! or a service in the definitions; each statistic's threshold is the most specific one
//! set — the feature's, then its view's, then the service's it is monitored through —
//! else the defaults ([`Limits::DEFAULT`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::definitions::{Definitions, FeatureRef, FeatureService};

/// Thresholds as written: each statistic optional (unset: the next scope's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// The population stability index, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<f64>,
    /// The Kolmogorov–Smirnov distance, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ks: Option<f64>,
    /// The change of the null rate (absolute, as a share), at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub null_rate: Option<f64>,
    /// Of a serving window: the share of lookups that found no row, at most. No default:
    /// unset, it is reported and never a breach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_found_rate: Option<f64>,
}

// Validated finite (JSON and YAML cannot hold NaN past `check`), so equality is total.
impl Eq for Thresholds {}

impl Thresholds {
    pub fn is_empty(&self) -> bool {
        *self == Thresholds::default()
    }

    /// `self`'s thresholds where set, else `under`'s.
    fn over(self, under: Thresholds) -> Thresholds {
        Thresholds {
            psi: self.psi.or(under.psi),
            ks: self.ks.or(under.ks),
            null_rate: self.null_rate.or(under.null_rate),
            not_found_rate: self.not_found_rate.or(under.not_found_rate),
        }
    }

    /// Each threshold a finite number in its range: PSI at least 0, the others shares.
    ///
    /// # Errors
    /// The first out of range, named.
    pub fn check(&self) -> Result<(), String> {
        let shares = [("ks", self.ks), ("null_rate", self.null_rate), ("not_found_rate", self.not_found_rate)];
        if let Some(psi) = self.psi
            && !(psi.is_finite() && psi >= 0.0)
        {
            return Err(format!("monitoring.psi must be a number at least 0, got {psi}"));
        }
        for (name, value) in shares {
            if let Some(v) = value
                && !(0.0..=1.0).contains(&v)
            {
                return Err(format!("monitoring.{name} must be between 0 and 1, got {v}"));
            }
        }
        Ok(())
    }
}

/// A view's thresholds: its own, and its features' by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Monitoring {
    #[serde(flatten)]
    pub view: Thresholds,
    /// Per served feature (of an event log: per aggregation).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, Thresholds>,
}

impl Monitoring {
    pub fn is_empty(&self) -> bool {
        self.view.is_empty() && self.features.is_empty()
    }

    /// Each threshold in range, each feature named one of `served`.
    ///
    /// # Errors
    /// The reason, naming the feature.
    pub fn check<'a>(&self, served: impl Iterator<Item = &'a str> + Clone) -> Result<(), String> {
        self.view.check()?;
        for (name, t) in &self.features {
            if !served.clone().any(|s| s == name) {
                let known: Vec<&str> = served.clone().collect();
                return Err(format!("monitoring of unknown feature `{name}` (served: {})", known.join(", ")));
            }
            t.check().map_err(|e| format!("feature `{name}`: {e}"))?;
        }
        Ok(())
    }
}

/// Thresholds resolved: every statistic's limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub psi: f64,
    pub ks: f64,
    pub null_rate: f64,
    /// `None`: reported, never a breach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_found_rate: Option<f64>,
}

impl Limits {
    /// The defaults: PSI 0.2 (the usual "significant shift"), KS 0.1, a null rate moved
    /// by 5 points.
    pub const DEFAULT: Limits = Limits { psi: 0.2, ks: 0.1, null_rate: 0.05, not_found_rate: None };
}

impl Definitions {
    /// The limits `feature` is held to, monitored through `service` (if any): the
    /// feature's thresholds, then its view's, then the service's, then the defaults.
    pub fn limits(&self, service: Option<&FeatureService>, feature: &FeatureRef) -> Limits {
        let view = match (self.feature_view(&feature.view), self.on_demand_view(&feature.view)) {
            (Some(v), _) => Some(&v.monitoring),
            (None, Some(o)) => Some(&o.monitoring),
            (None, None) => None,
        };
        let own = view.and_then(|m| m.features.get(&feature.feature)).copied().unwrap_or_default();
        let view = view.map(|m| m.view).unwrap_or_default();
        let service = service.map(|s| s.monitoring).unwrap_or_default();
        let t = own.over(view).over(service);
        let d = Limits::DEFAULT;
        Limits {
            psi: t.psi.unwrap_or(d.psi),
            ks: t.ks.unwrap_or(d.ks),
            null_rate: t.null_rate.unwrap_or(d.null_rate),
            not_found_rate: t.not_found_rate.or(d.not_found_rate),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Entity, FeatureView, KeyType};

    fn defs() -> Definitions {
        Definitions::default()
            .with_entity(Entity::new("driver").with_join_key("driver_id", KeyType::Int64))
            .with_feature_view(
                FeatureView::new("stats").with_entity("driver").with_feature("a", DType::Float64).with_feature("b", DType::Int64),
            )
            .with_feature_service(FeatureService::new("ranker").with_feature("stats", "a").with_feature("stats", "b"))
    }

    #[test]
    fn the_most_specific_threshold_wins_each_statistic_on_its_own() {
        let mut d = defs();
        d.feature_services[0].monitoring = Thresholds { psi: Some(0.5), ks: Some(0.3), null_rate: Some(0.2), not_found_rate: Some(0.4) };
        d.feature_views[0].monitoring.view = Thresholds { psi: Some(0.4), ks: Some(0.25), ..Default::default() };
        d.feature_views[0].monitoring.features.insert("a".into(), Thresholds { psi: Some(0.3), ..Default::default() });
        d.validate().unwrap();
        let service = d.feature_service("ranker");
        let a = d.limits(service, &FeatureRef::new("stats", "a"));
        assert_eq!(a, Limits { psi: 0.3, ks: 0.25, null_rate: 0.2, not_found_rate: Some(0.4) });
        let b = d.limits(service, &FeatureRef::new("stats", "b"));
        assert_eq!(b, Limits { psi: 0.4, ks: 0.25, null_rate: 0.2, not_found_rate: Some(0.4) });
        // Without the service (monitoring by --features): the view's, then the defaults.
        let b = d.limits(None, &FeatureRef::new("stats", "b"));
        assert_eq!(b, Limits { psi: 0.4, ks: 0.25, null_rate: 0.05, not_found_rate: None });
        assert_eq!(defs().limits(None, &FeatureRef::new("stats", "a")), Limits::DEFAULT);
    }

    #[test]
    fn thresholds_out_of_range_or_of_unknown_features_are_refused_by_name() {
        let mut d = defs();
        d.feature_views[0].monitoring.features.insert("nope".into(), Thresholds::default());
        let e = d.validate().unwrap_err().to_string();
        assert_eq!(e, "feature view `stats`: monitoring of unknown feature `nope` (served: a, b)");
        let mut d = defs();
        d.feature_views[0].monitoring.features.insert("a".into(), Thresholds { ks: Some(1.5), ..Default::default() });
        let e = d.validate().unwrap_err().to_string();
        assert_eq!(e, "feature view `stats`: feature `a`: monitoring.ks must be between 0 and 1, got 1.5");
        let mut d = defs();
        d.feature_services[0].monitoring.psi = Some(-1.0);
        let e = d.validate().unwrap_err().to_string();
        assert_eq!(e, "feature service `ranker`: monitoring.psi must be a number at least 0, got -1");
    }
}
