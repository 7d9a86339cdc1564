//! `monitor`: a reference window against a current one, feature by feature (the work
//! is in [`crate::monitor`]).

use std::path::PathBuf;

use super::Features;
use crate::error::Result;
use crate::monitor::{MonitorReport, Window, binnings, compare, sources};
use crate::repo::Repo;
use crate::reports::store;

/// Compares two windows' profiles ([`Repo::monitor`]).
#[derive(Debug)]
#[must_use]
pub struct Monitor<'a> {
    repo: &'a Repo,
    reference: Window,
    current: Window,
    features: Features,
    keep: bool,
}

/// A comparison and where it was stored.
#[derive(Debug, Clone)]
pub struct Monitored {
    pub report: MonitorReport,
    /// `None` when it was not stored ([`Monitor::with_store_report`]).
    pub path: Option<PathBuf>,
}

impl Repo {
    /// Profiles `features` over `reference` and `current` and compares them against
    /// their limits; the report is stored under `.quiver/monitor/`.
    pub fn monitor(&self, reference: Window, current: Window) -> Monitor<'_> {
        Monitor { repo: self, reference, current, features: Features::None, keep: true }
    }
}

setters!(Monitor { features });

impl Monitor<'_> {
    /// Whether to store the report under `.quiver/monitor/` (the default).
    pub fn with_store_report(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    async fn run(self) -> Result<Monitored> {
        let defs = self.repo.defs()?;
        let mut refs = self.features.resolve(&defs)?;
        // A feature named twice is compared once.
        let mut seen = std::collections::HashSet::new();
        refs.retain(|r| seen.insert(r.to_string()));
        for r in &refs {
            defs.find(r).map_err(|e| crate::error::Error::NotFound(e.0))?;
        }
        let service = match &self.features {
            Features::Service(name) => defs.feature_service(name),
            _ => None,
        };
        let reference = sources::profiles(self.repo, &defs, &self.reference, &refs).await?;
        // The current values counted exactly into the reference's bins, as the server's
        // gauges count them: one PSI for the same rows (docs/monitoring.md).
        let current = sources::profiles_counting(self.repo, &defs, &self.current, &refs, &binnings(&reference)).await?;
        let served = matches!(self.current, Window::Serving { .. });
        let features = refs
            .iter()
            .map(|r| {
                let name = r.to_string();
                let mut drift = compare(&name, &reference[&name], &current[&name], defs.limits(service, r), served);
                let versions = crate::monitor::Versions {
                    reference: self.reference.version_read(&defs, r),
                    current: self.current.version_read(&defs, r),
                };
                drift.versions = (versions.reference != versions.current).then_some(versions);
                drift
            })
            .collect();
        let report = MonitorReport {
            reference: self.reference.describe(),
            current: self.current.describe(),
            created_at: quiver_sdk::types::format_instant(quiver_sdk::Timestamp::now().0),
            service: service.map(|s| s.name.clone()),
            features,
        };
        let path = if self.keep { Some(store(&self.repo.config.repo, &report)?) } else { None };
        Ok(Monitored { report, path })
    }
}

awaitable!(Monitor => Monitored);
