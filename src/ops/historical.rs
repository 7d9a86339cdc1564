//! `historical`: the point-in-time join of a spine with features (docs/offline.md).

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::datatypes::DataType;
use quiver_offline::historical::{self, HistoricalOptions};
use quiver_sdk::FeatureRef;

use super::{Engine, Features, Progress, no_progress, pick_engine};
use crate::error::Result;
use crate::repo::Repo;
use crate::spine::Spine;

/// What a join gave: the spine's rows with one column per feature, the references in
/// output order, and which engine ran.
#[derive(Debug, Clone)]
pub struct Joined {
    pub batch: RecordBatch,
    pub refs: Vec<FeatureRef>,
    pub engine_note: String,
}

/// The point-in-time join ([`Repo::historical`]).
#[derive(Debug)]
#[must_use]
pub struct Historical<'a> {
    repo: &'a Repo,
    spine: Spine,
    features: Features,
    engine: Engine,
    options: HistoricalOptions,
    versions: BTreeMap<String, u64>,
    progress: Progress,
}

impl Repo {
    /// Joins `spine` point in time with the features asked for by
    /// [`Historical::with_features`] or [`Historical::with_service`].
    pub fn historical(&self, spine: Spine) -> Historical<'_> {
        Historical {
            repo: self,
            spine,
            features: Features::None,
            engine: Engine::Auto,
            options: HistoricalOptions::default(),
            versions: BTreeMap::new(),
            progress: no_progress(),
        }
    }
}

setters!(Historical { features, engine, progress });

impl<'a> Historical<'a> {
    /// Only rows created by each spine time are candidates (docs/offline.md).
    pub fn with_created_cutoff(mut self, on: bool) -> Self {
        self.options.created_cutoff = on;
        self
    }

    /// After the features, each view's winning event time (`view__event_timestamp`).
    pub fn with_event_times(mut self, on: bool) -> Self {
        self.options.event_times = on;
        self
    }

    /// Runs the join on the Ballista cluster at `cluster` (`df://HOST:PORT`, docs/settings.md)
    /// instead of in this process; the answer is the same.
    pub fn with_cluster(mut self, cluster: Option<String>) -> Self {
        self.options.cluster = cluster;
        self
    }

    /// Reads the views' tables at these Delta versions (time travel).
    pub fn with_versions(mut self, versions: BTreeMap<String, u64>) -> Self {
        self.versions = versions;
        self
    }

    async fn run(self) -> Result<Joined> {
        let registry = self.repo.defs()?;
        let refs = self.features.resolve(&registry)?;
        let defs = super::pinned(&registry, &refs)?;
        let requests = historical::resolve(&defs, &refs)?;
        let key_types: Vec<(String, DataType)> = requests.spine_types(&defs);
        let label = self.spine.label();
        let joined: Vec<_> = requests.iter().map(|r| r.view).collect();
        let spine = self.spine.read(self.repo, &defs, &key_types, &joined, &self.versions).await?;
        let (kernel, engine_note) = pick_engine(self.engine, spine.num_rows())?;
        let progress = self.progress.clone();
        let mut options = self.options;
        options.versions = self.versions;
        let batch = historical::historical(
            &self.repo.config,
            &defs,
            historical::SpineRows { source: &label, rows: &spine },
            &requests,
            options,
            kernel.as_ref(),
            &move |phase, rows| progress.report(phase, rows),
        )
        .await?;
        Ok(Joined { batch, refs, engine_note })
    }

    /// Joins and writes the result to a Parquet file at `out` (atomically).
    ///
    /// # Errors
    /// As the join, and when `out` cannot be written.
    pub async fn write_parquet(self, out: &Path) -> Result<Joined> {
        let joined = self.run().await?;
        historical::write_parquet(out, &joined.batch)?;
        Ok(joined)
    }
}

awaitable!(Historical => Joined);
