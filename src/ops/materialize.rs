//! `materialize` and `materialize-incremental`: offline to online (docs/online.md).

use std::sync::Arc;

use quiver_online::OnlineStore;
use quiver_sdk::{FeatureView, Timestamp};

use super::{Progress, no_progress, view};
use crate::error::{Error, Result};
use crate::materialize::ViewReport;
use crate::repo::Repo;

/// Loads the latest row per entity with event time in `[start, end]`
/// ([`Repo::materialize`]).
#[derive(Debug)]
#[must_use]
pub struct Materialize<'a> {
    repo: &'a Repo,
    start: i64,
    end: i64,
    views: Vec<String>,
    store: Option<Arc<dyn OnlineStore>>,
    progress: Progress,
}

/// Loads what arrived since the last incremental run ([`Repo::materialize_incremental`]).
#[derive(Debug)]
#[must_use]
pub struct MaterializeIncremental<'a> {
    repo: &'a Repo,
    end: i64,
    store: Option<Arc<dyn OnlineStore>>,
    progress: Progress,
}

impl Repo {
    /// Materializes every online view (or those of [`Materialize::with_views`]) for
    /// event times in `[start, end]`.
    pub fn materialize(&self, start: Timestamp, end: Timestamp) -> Materialize<'_> {
        Materialize { repo: self, start: start.0, end: end.0, views: Vec::new(), store: None, progress: no_progress() }
    }

    /// Materializes, into this store, what arrived since its last incremental run, up
    /// to `end`.
    pub fn materialize_incremental(&self, end: Timestamp) -> MaterializeIncremental<'_> {
        MaterializeIncremental { repo: self, end: end.0, store: None, progress: no_progress() }
    }
}

/// The online views among `names` (all online views when empty).
fn online_views<'d>(defs: &'d quiver_sdk::Definitions, names: &[String]) -> Result<Vec<&'d FeatureView>> {
    if names.is_empty() {
        return Ok(defs.all_view_versions().filter(|v| v.takes_online_writes()).collect());
    }
    names
        .iter()
        .map(|n| {
            let v = view(defs, n)?;
            v.check_online_writes().map_err(Error::Invalid)?;
            Ok(v)
        })
        .collect()
}

setters!(Materialize { store, progress });
setters!(MaterializeIncremental { store, progress });

impl<'a> Materialize<'a> {
    /// Only these views (each must be online).
    pub fn with_views(mut self, names: Vec<String>) -> Self {
        self.views = names;
        self
    }

    async fn run(self) -> Result<Vec<ViewReport>> {
        if self.start > self.end {
            return Err(Error::Invalid("START is after END".into()));
        }
        let defs = self.repo.defs()?;
        let views = online_views(&defs, &self.views)?;
        let store = self.repo.store_or_open(self.store).await?;
        let progress = self.progress.clone();
        crate::materialize::materialize(&self.repo.config, &defs, &views, self.start, self.end, store.as_ref(), &move |p, n| {
            progress.report(p, n)
        })
        .await
    }
}

awaitable!(Materialize => Vec<ViewReport>);

impl<'a> MaterializeIncremental<'a> {
    async fn run(self) -> Result<Vec<ViewReport>> {
        let defs = self.repo.defs()?;
        let views = online_views(&defs, &[])?;
        let store = self.repo.store_or_open(self.store).await?;
        let progress = self.progress.clone();
        crate::materialize::materialize_incremental(&self.repo.config, &defs, &views, self.end, store.as_ref(), &move |p, n| {
            progress.report(p, n)
        })
        .await
    }
}

awaitable!(MaterializeIncremental => Vec<ViewReport>);
