//! `export`: a sharded, reproducible training set (the work is in [`crate::export`]).

use std::path::PathBuf;
use std::sync::Arc;

use super::{Engine, Progress, no_progress, pick_engine};
use crate::error::Result;
use crate::export::{ExportOptions, Exported, Hooks, Joiner, ShardFormat};
use crate::repo::Repo;
use crate::spine::Spine;

/// Exports a feature service's point-in-time join of a spine ([`Repo::export`]).
#[derive(Debug)]
#[must_use]
pub struct Export<'a> {
    repo: &'a Repo,
    spine: Spine,
    out: PathBuf,
    options: ExportOptions,
    engine: Engine,
    progress: Progress,
    shard_written: Option<ShardWritten>,
    cluster: Option<String>,
}

/// The injected fault of [`Export::with_shard_written`].
#[derive(Clone)]
struct ShardWritten(Arc<dyn Fn(usize) + Send + Sync>);

impl std::fmt::Debug for ShardWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardWritten(..)")
    }
}

/// Rebuilds the training set of a manifest ([`Repo::reproduce`]).
#[derive(Debug)]
#[must_use]
pub struct Reproduce<'a> {
    repo: &'a Repo,
    manifest: PathBuf,
    out: PathBuf,
    engine: Engine,
    progress: Progress,
    cluster: Option<String>,
}

impl Repo {
    /// Exports `service` joined with `spine` (a file, or a [`MadeSpine`](quiver_offline::historical::MadeSpine))
    /// into the folder `out` (Parquet shards of 500,000 spine rows unless set otherwise).
    pub fn export(&self, service: &str, spine: impl Into<Spine>, out: impl Into<PathBuf>) -> Export<'_> {
        Export {
            repo: self,
            spine: spine.into(),
            out: out.into(),
            options: ExportOptions {
                service: service.to_string(),
                format: ShardFormat::Parquet,
                shard_rows: 500_000,
                created_cutoff: false,
                group_rows: Some(crate::export::GROUP_ROWS),
            },
            engine: Engine::Auto,
            progress: no_progress(),
            shard_written: None,
            cluster: None,
        }
    }

    /// Rebuilds the training set `manifest` describes into `out`, checking every shard.
    pub fn reproduce(&self, manifest: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Reproduce<'_> {
        Reproduce { repo: self, manifest: manifest.into(), out: out.into(), engine: Engine::Auto, progress: no_progress(), cluster: None }
    }
}

setters!(Export { engine, progress });
setters!(Reproduce { engine, progress });

impl Reproduce<'_> {
    /// Joins the shards on the Ballista cluster at `cluster` (`df://HOST:PORT`); they
    /// must still hash to the manifest's.
    pub fn with_cluster(mut self, cluster: Option<String>) -> Self {
        self.cluster = cluster;
        self
    }
}

impl<'a> Export<'a> {
    pub fn with_format(mut self, format: ShardFormat) -> Self {
        self.options.format = format;
        self
    }

    /// Spine rows per shard (bounds memory: one shard's result at a time).
    pub fn with_shard_rows(mut self, rows: u64) -> Self {
        self.options.shard_rows = rows;
        self
    }

    pub fn with_created_cutoff(mut self, on: bool) -> Self {
        self.options.created_cutoff = on;
        self
    }

    /// Joins the shards on the Ballista cluster at `cluster` (`df://HOST:PORT`): the
    /// same training set, the same manifest.
    pub fn with_cluster(mut self, cluster: Option<String>) -> Self {
        self.cluster = cluster;
        self
    }

    /// An injected fault: `f` is called with the number of shards this run wrote, after
    /// each one is in place and recorded (a crash test aborts the process there).
    pub fn with_shard_written(mut self, f: impl Fn(usize) + Send + Sync + 'static) -> Self {
        self.shard_written = Some(ShardWritten(Arc::new(f)));
        self
    }

    async fn run(self) -> Result<Exported> {
        // The engine is chosen by the shard size: one shard is joined at a time.
        let (kernel, _) = pick_engine(self.engine, usize::try_from(self.options.shard_rows).unwrap_or(usize::MAX))?;
        let progress = self.progress.clone();
        let shard_written = self.shard_written.clone();
        let hooks = Hooks {
            progress: &move |k, n| progress.report(&format!("shard {k} of {n}"), k),
            shard_written: &move |written| {
                if let Some(ShardWritten(f)) = &shard_written {
                    f(written);
                }
            },
        };
        let joiner = Joiner { kernel: kernel.as_ref(), cluster: self.cluster.as_deref() };
        let lineage = crate::lineage::Lineage::of(self.repo);
        let folder = crate::lineage::Dataset::at(&self.out.display().to_string());
        let run = lineage.enabled().then(|| lineage.start("export", &[], std::slice::from_ref(&folder)));
        let result = crate::export::export(self.repo, &self.spine, &self.out, self.options, joiner, hooks).await;
        if let Some(run) = run {
            match &result {
                Ok(done) => {
                    let (inputs, output) = training_set_lineage(self.repo, &done.manifest, folder);
                    run.complete(&inputs, &[output]);
                }
                Err(e) => run.fail(e),
            }
        }
        result
    }
}

/// What a training set read (its spine, each view's table at the Delta version it
/// read) and the training set itself (its folder, its id as the version, its schema),
/// as lineage datasets (docs/lineage.md).
fn training_set_lineage(
    repo: &Repo,
    manifest: &crate::export::Manifest,
    folder: crate::lineage::Dataset,
) -> (Vec<crate::lineage::Dataset>, crate::lineage::Dataset) {
    use crate::lineage::{Dataset, schema_facet};
    let mut inputs = Vec::new();
    // A made spine's `path` says how it was made: no file to name.
    let spine = (!manifest.spine.path.is_empty() && manifest.spine.made.is_none()).then(|| Dataset::at(&manifest.spine.path));
    inputs.extend(spine.clone());
    let mut tables = std::collections::BTreeMap::new();
    let defs = repo.defs().ok();
    if let Some(defs) = &defs {
        for (read, version) in &manifest.delta_versions {
            // The manifest names a view as read: `view` for version 1.
            let Some((name, at)) = quiver_sdk::definitions::split_version(read) else { continue };
            let Some(view) = defs.feature_view(&format!("{name}@{}", at.unwrap_or(quiver_sdk::definitions::FIRST_VERSION))) else {
                continue;
            };
            let table = Dataset::at(&repo.config.view_table(view).to_string()).version(Some(*version));
            tables.insert(view.versioned_name(), table.clone());
            inputs.push(table);
        }
    }
    let schema = schema_facet(manifest.schema.iter().map(|(name, dtype)| (name.as_str(), dtype.clone())));
    let mut output = folder.facet("schema", schema);
    if let Some(defs) = &defs {
        let refs: Vec<quiver_sdk::FeatureRef> = manifest.features.iter().filter_map(|f| f.reference.parse().ok()).collect();
        let columns: Vec<String> = manifest.schema.iter().map(|(name, _)| name.clone()).collect();
        let lineage = crate::lineage::columns::joined_columns(defs, &refs, &tables, spine.as_ref(), &columns);
        output = output.facet("columnLineage", crate::lineage::column_lineage(&lineage));
    }
    output.facets.insert(
        "version".into(),
        serde_json::json!({
            "_producer": crate::lineage::PRODUCER,
            "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/DatasetVersionDatasetFacet.json#/$defs/DatasetVersionDatasetFacet",
            "datasetVersion": manifest.training_set_id,
        }),
    );
    (inputs, output)
}

awaitable!(Export => Exported);

impl<'a> Reproduce<'a> {
    async fn run(self) -> Result<Exported> {
        let (kernel, _) = pick_engine(self.engine, 0)?;
        let progress = self.progress.clone();
        let hooks = Hooks { progress: &move |k, n| progress.report(&format!("shard {k} of {n}"), k), ..Hooks::default() };
        let joiner = Joiner { kernel: kernel.as_ref(), cluster: self.cluster.as_deref() };
        crate::export::reproduce(self.repo, &self.manifest, &self.out, joiner, hooks).await
    }
}

awaitable!(Reproduce => Exported);
