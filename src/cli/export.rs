//! `quiver export`: a sharded, reproducible training set.

use quiver_sdk::error::count;
use std::path::PathBuf;

use quiver::ShardFormat;

use super::spine::SpineArgs;
use super::{Ctx, EngineArg, progress_bar, runtime};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ExportFormat {
    Parquet,
    Arrow,
}

/// Export a sharded, reproducible training set with a manifest.json.
#[derive(Debug, clap::Args)]
pub struct Export {
    /// The feature service whose features the training set holds.
    #[arg(long, required_unless_present = "reproduce")]
    service: Option<String>,
    #[command(flatten)]
    spine: SpineArgs,
    /// The folder for the shards and manifest.json.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "parquet")]
    format: ExportFormat,
    /// Spine rows per shard (the join runs once; each shard is written as it is due).
    #[arg(long, default_value_t = 500_000)]
    shard_rows: u64,
    #[arg(long, value_enum, default_value = "auto")]
    engine: EngineArg,
    /// Only rows created by each spine time are candidates.
    #[arg(long)]
    created_cutoff: bool,
    /// Rebuild the training set of this manifest.json (same Delta versions) into --out.
    #[arg(long, conflicts_with_all = ["service", "spine", "entities_at", "rows_of", "between", "sample", "seed"])]
    reproduce: Option<PathBuf>,
    /// Join on a DataFusion Ballista cluster: df://HOST:PORT of its scheduler (see
    /// `quiver cluster`); `?partitions=N` sets the hash partitions (default 8).
    #[arg(long)]
    cluster: Option<String>,
}

/// `QUIVER_EXPORT_ABORT_AFTER_SHARDS=N` (for the crash test of resuming) aborts the
/// process once this run wrote N shards.
fn abort_after_shards() -> impl Fn(usize) + Send + Sync + 'static {
    let after: Option<usize> = std::env::var("QUIVER_EXPORT_ABORT_AFTER_SHARDS").ok().and_then(|v| v.parse().ok());
    move |written| {
        if after.is_some_and(|a| written >= a) {
            eprintln!("aborting after {written} shards (QUIVER_EXPORT_ABORT_AFTER_SHARDS)");
            std::process::abort();
        }
    }
}

impl Export {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let began = std::time::Instant::now();
        let repo = ctx.open()?;
        let rt = runtime()?;
        let bar = progress_bar();
        let shown = bar.clone();
        let progress = quiver::ops::Progress::new(move |phase, _| shown.set_message(phase.to_string()));
        let out = &self.out;
        let reproducing = self.reproduce.is_some();
        let spine = match (reproducing, self.spine.chosen()) {
            (true, _) => None,
            (false, chosen) => Some(chosen?),
        };
        let exported = rt.block_on(async {
            match self.reproduce {
                Some(manifest) => {
                    repo.reproduce(manifest, out).with_engine(self.engine.into()).with_cluster(self.cluster).with_progress(progress).await
                }
                None => {
                    repo.export(&self.service.expect("clap requires it"), spine.expect("not reproducing"), out)
                        .with_format(match self.format {
                            ExportFormat::Parquet => ShardFormat::Parquet,
                            ExportFormat::Arrow => ShardFormat::Arrow,
                        })
                        .with_shard_rows(self.shard_rows)
                        .with_created_cutoff(self.created_cutoff)
                        .with_cluster(self.cluster)
                        .with_engine(self.engine.into())
                        .with_progress(progress)
                        .with_shard_written(abort_after_shards())
                        .await
                }
            }
        })?;
        bar.finish_and_clear();
        for file in &exported.repaired {
            eprintln!("repaired {}: it no longer matched the manifest; written again from the reproduced rows", out.join(file).display());
        }
        let manifest = &exported.manifest;
        if !reproducing && exported.joined == 0 && exported.repaired.is_empty() {
            println!(
                "training set {} was already in {}: {} in {}, every shard intact; nothing written",
                manifest.training_set_id,
                out.display(),
                count(manifest.rows, "row"),
                count(manifest.shards.len(), "shard")
            );
            return Ok(());
        }
        println!(
            "{} training set {}: {} in {} to {} in {:.2} s{}",
            if reproducing { "reproduced" } else { "exported" },
            manifest.training_set_id,
            count(manifest.rows, "row"),
            count(manifest.shards.len(), "shard"),
            out.display(),
            began.elapsed().as_secs_f64(),
            if reproducing { ", every shard identical to the manifest" } else { "" }
        );
        Ok(())
    }
}
