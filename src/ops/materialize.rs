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
        let run = Recorded::start(self.repo, &views).await;
        let result =
            crate::materialize::materialize(&self.repo.config, &defs, &views, self.start, self.end, store.as_ref(), &move |p, n| {
                progress.report(p, n)
            })
            .await;
        run.end(&result);
        result
    }
}

awaitable!(Materialize => Vec<ViewReport>);

impl<'a> MaterializeIncremental<'a> {
    async fn run(self) -> Result<Vec<ViewReport>> {
        let defs = self.repo.defs()?;
        let views = online_views(&defs, &[])?;
        let store = self.repo.store_or_open(self.store).await?;
        let progress = self.progress.clone();
        let run = Recorded::start(self.repo, &views).await;
        let result =
            crate::materialize::materialize_incremental(&self.repo.config, &defs, &views, self.end, store.as_ref(), &move |p, n| {
                progress.report(p, n)
            })
            .await;
        run.end(&result);
        result
    }
}

awaitable!(MaterializeIncremental => Vec<ViewReport>);

/// A materialization as a lineage run `materialize` (docs/lineage.md): each view's Delta
/// table, at the version it read, into its key space in the online store.
struct Recorded {
    run: Option<crate::lineage::Run>,
    inputs: Vec<crate::lineage::Dataset>,
    outputs: Vec<crate::lineage::Dataset>,
}

impl Recorded {
    async fn start(repo: &Repo, views: &[&FeatureView]) -> Recorded {
        let lineage = crate::lineage::Lineage::of(repo);
        if !lineage.enabled() {
            return Recorded { run: None, inputs: Vec::new(), outputs: Vec::new() };
        }
        let versions = quiver_offline::historical::table_versions(&repo.config, views).await.unwrap_or_default();
        let inputs: Vec<_> = views
            .iter()
            .map(|v| {
                let version = versions.get(&v.versioned_name()).copied().flatten();
                crate::lineage::Dataset::at(&repo.config.view_table(v).to_string()).version(version)
            })
            .collect();
        let outputs: Vec<_> = views.iter().map(|v| crate::lineage::online_keys(&repo.config, v)).collect();
        let run = Some(lineage.start("materialize", &inputs, &outputs));
        Recorded { run, inputs, outputs }
    }

    fn end<T>(self, result: &Result<T>) {
        if let Some(run) = self.run {
            run.end(result, &self.inputs, &self.outputs);
        }
    }
}
