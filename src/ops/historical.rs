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
        self.recorded(None).await
    }

    /// The join, as a lineage run `historical` when lineage is on (docs/lineage.md):
    /// the spine's file and each view's table at the version it read, into `out` when
    /// the result is written there.
    async fn recorded(self, out: Option<&Path>) -> Result<Joined> {
        let lineage = crate::lineage::Lineage::of(self.repo);
        if !lineage.enabled() {
            let joined = self.join().await?;
            if let Some(out) = out {
                historical::write_parquet(out, &joined.batch)?;
            }
            return Ok(joined);
        }
        use crate::lineage::Dataset;
        let mut inputs = Vec::new();
        if let Spine::File(path) = &self.spine {
            inputs.push(Dataset::at(&path.display().to_string()));
        }
        let outputs: Vec<Dataset> = out.map(|p| Dataset::at(&p.display().to_string())).into_iter().collect();
        let spine = inputs.first().cloned();
        let registry = self.repo.defs()?;
        let read =
            self.features.resolve(&registry).ok().and_then(|refs| super::pinned(&registry, &refs).ok().map(|d| (refs, d.into_owned())));
        let tables: Vec<quiver_sdk::FeatureView> = read
            .as_ref()
            .and_then(|(refs, defs)| historical::resolve(defs, refs).ok().map(|r| r.iter().map(|q| q.view.clone()).collect()))
            .unwrap_or_default();
        let latest =
            quiver_offline::historical::table_versions(&self.repo.config, &tables.iter().collect::<Vec<_>>()).await.unwrap_or_default();
        let mut datasets = std::collections::BTreeMap::new();
        for view in &tables {
            let name = view.versioned_name();
            let version = self.versions.get(&name).copied().or_else(|| latest.get(&name).copied().flatten());
            let table = Dataset::at(&self.repo.config.view_table(view).to_string()).version(version);
            datasets.insert(name, table.clone());
            inputs.push(table);
        }
        let run = lineage.start("historical", &inputs, &outputs);
        let result = async {
            let joined = self.join().await?;
            if let Some(out) = out {
                historical::write_parquet(out, &joined.batch)?;
            }
            Ok(joined)
        }
        .await;
        // The output's columns, each from the table or spine column it was read from.
        let outputs: Vec<Dataset> = match (&result, &read) {
            (Ok(joined), Some((refs, defs))) => {
                let columns: Vec<String> = joined.batch.schema().fields().iter().map(|f| f.name().clone()).collect();
                let lineage = crate::lineage::columns::joined_columns(defs, refs, &datasets, spine.as_ref(), &columns);
                outputs.into_iter().map(|o| o.facet("columnLineage", crate::lineage::column_lineage(&lineage))).collect()
            }
            _ => outputs,
        };
        run.end(&result, &inputs, &outputs);
        result
    }

    async fn join(self) -> Result<Joined> {
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
        self.recorded(Some(out)).await
    }
}

awaitable!(Historical => Joined);
