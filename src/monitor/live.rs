//! Continuous monitoring in `quiver serve`: the serving log's writer hands every answer
//! it logs to [`Live::add`], which adds the values to the profiles of the current time
//! bucket (a twelfth of `monitoring.window`); `/metrics` merges the buckets of the last
//! window and compares them with the reference loaded at start ([`Live::render`]). No
//! second pass over the log, and nothing on the request's path: the writer's task does
//! the profiling after the answer has gone.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use quiver_online::lookup::Status;
use quiver_online::serving_log::Served;
use quiver_sdk::metrics::{Exposition, Kind};
use quiver_sdk::monitoring::Limits;
use quiver_sdk::profile::Profile;

use super::{Window, compare, sources};
use crate::error::{Error, Result};
use crate::repo::Repo;

/// Buckets per window: the window slides by a twelfth.
const BUCKETS: i64 = 12;

/// The serving window's profiles against a reference.
#[derive(Debug)]
pub struct Live {
    /// As in the gauges' `reference` label.
    reference_name: String,
    window_us: i64,
    bucket_us: i64,
    /// Feature slots by view, then feature.
    slots: HashMap<String, HashMap<String, usize>>,
    /// Per slot: (view, feature), the reference's profile, the limits.
    features: Vec<(String, String, Profile, Limits)>,
    /// (bucket start, a profile per slot), oldest first.
    buckets: Mutex<VecDeque<(i64, Vec<Profile>)>>,
}

impl Live {
    /// The live monitor `quiver.yaml`'s `monitoring:` asks for, its reference profiled
    /// now; `None` when no reference is set.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the setting: a bad reference or service, a reference
    /// that cannot be profiled.
    pub async fn start(repo: &Repo) -> Result<Option<Live>> {
        let config = &repo.config.monitoring;
        let Some(text) = &config.reference else {
            return Ok(None);
        };
        let bad = |e: Error| Error::Invalid(format!("quiver.yaml: monitoring.reference `{text}`: {e}"));
        let mut window = Window::parse("monitoring.reference", text, quiver_sdk::Timestamp::now())?;
        if let Window::Training(dir) = &window
            && dir.is_relative()
        {
            window = Window::Training(repo.config.repo.join(dir));
        }
        let defs = repo.defs()?;
        let service = match &config.service {
            Some(name) => Some(defs.find_service(name).map_err(|e| Error::Invalid(format!("quiver.yaml: monitoring.service: {}", e.0)))?),
            None => None,
        };
        let refs = match (service, &window) {
            (Some(s), _) => s.features.clone(),
            (None, Window::Training(dir)) => training_features(dir).map_err(bad)?,
            (None, _) => {
                return Err(Error::Invalid(format!(
                    "quiver.yaml: monitoring.reference `{text}` names no features: set monitoring.service to the service to gauge"
                )));
            }
        };
        let mut reference = sources::profiles(repo, &defs, &window, &refs).await.map_err(bad)?;
        let mut slots: HashMap<String, HashMap<String, usize>> = HashMap::new();
        let mut features = Vec::new();
        for r in &refs {
            let profile = reference.remove(&r.to_string()).unwrap_or_default();
            slots.entry(r.view.clone()).or_default().insert(r.feature.clone(), features.len());
            features.push((r.view.clone(), r.feature.clone(), profile, defs.limits(service, r)));
        }
        let window_us = i64::try_from(config.window.as_micros()).unwrap_or(i64::MAX);
        Ok(Some(Live {
            reference_name: text.replace(['"', '\\', '\n'], "_"),
            window_us,
            bucket_us: (window_us / BUCKETS).max(1),
            slots,
            features,
            buckets: Mutex::new(VecDeque::new()),
        }))
    }

    /// Adds an answer's values to the current bucket.
    pub fn add(&self, served: &Served) {
        let at = served.request_time - served.request_time.rem_euclid(self.bucket_us);
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Buckets past the window go; answers come in time order, give or take a bucket.
        while buckets.front().is_some_and(|(start, _)| *start + self.bucket_us <= served.request_time - self.window_us) {
            buckets.pop_front();
        }
        let profiles = match buckets.iter_mut().rposition(|(start, _)| *start == at) {
            Some(i) => &mut buckets[i].1,
            None => {
                buckets.push_back((at, vec![Profile::default(); self.features.len()]));
                &mut buckets.back_mut().expect("just pushed").1
            }
        };
        for (i, r) in served.refs.iter().enumerate() {
            let (Some(slot), Some(column)) =
                (self.slots.get(&r.view).and_then(|v| v.get(&r.feature)), served.columns.get(served.n_keys + i))
            else {
                continue;
            };
            let profile = &mut profiles[*slot];
            for (value, status) in column.values.iter().zip(&column.statuses) {
                profile.add_value(value);
                match status {
                    Status::NotFound => profile.not_found += 1,
                    Status::OutsideMaxAge => profile.outside_max_age += 1,
                    Status::Present | Status::NullValue => {}
                }
            }
        }
    }

    /// The gauges of each feature served in the window ending `now` (UTC microseconds).
    pub fn render(&self, out: &mut Exposition, now: i64) {
        let mut current = vec![Profile::default(); self.features.len()];
        {
            let buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (_, profiles) in buckets.iter().filter(|(start, _)| *start + self.bucket_us > now - self.window_us) {
                for (c, p) in current.iter_mut().zip(profiles) {
                    c.merge(p);
                }
            }
        }
        let drifts: Vec<_> = self
            .features
            .iter()
            .zip(&current)
            .filter(|(_, c)| c.count > 0)
            .map(|((view, feature, reference, limits), c)| {
                (view, feature, compare(&format!("{view}:{feature}"), reference, c, *limits, true))
            })
            .collect();
        type Stat = fn(&super::FeatureDrift) -> Option<f64>;
        let families: [(&str, &str, Stat); 5] = [
            ("quiver_feature_psi", "population stability index of the serving window against the reference", |d| d.psi),
            ("quiver_feature_ks", "Kolmogorov-Smirnov distance of the serving window from the reference", |d| d.ks),
            ("quiver_feature_null_rate", "share of null values served in the window", |d| d.null_rate.current),
            ("quiver_feature_not_found_rate", "share of lookups in the window that found no row", |d| d.not_found_rate),
            ("quiver_feature_breach", "1 when a statistic crosses its threshold, else 0", |d| {
                Some(f64::from(u8::from(!d.breaches.is_empty())))
            }),
        ];
        for (name, help, stat) in families {
            out.family(name, Kind::Gauge, help);
            for (view, feature, drift) in &drifts {
                if let Some(v) = stat(drift) {
                    out.sample(name, &[("view", view), ("feature", feature), ("reference", &self.reference_name)], v);
                }
            }
        }
    }
}

/// The features a training set's manifest profiles.
fn training_features(dir: &std::path::Path) -> Result<Vec<quiver_sdk::FeatureRef>> {
    let path = dir.join("manifest.json");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let manifest: crate::export::Manifest =
        serde_json::from_slice(&bytes).map_err(|e| Error::Invalid(format!("{}: not a training set's manifest: {e}", path.display())))?;
    manifest
        .features
        .iter()
        .map(|f| f.reference.parse().map_err(|e: quiver_sdk::definitions::BadFeatureRef| Error::Invalid(e.to_string())))
        .collect()
}
