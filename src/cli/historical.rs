//! `quiver historical`: a point-in-time join to Parquet.

use quiver_sdk::error::count;
use std::path::PathBuf;

use super::spine::SpineArgs;
use super::{Ctx, EngineArg, progress_bar, progress_on, runtime};

/// Point-in-time join of a spine with features, to Parquet.
#[derive(Debug, clap::Args)]
pub struct Historical {
    #[command(flatten)]
    spine: SpineArgs,
    /// Features as view:feature, comma separated.
    #[arg(long, value_delimiter = ',', required_unless_present = "service", conflicts_with = "service")]
    features: Vec<String>,
    /// A feature service instead of --features.
    #[arg(long)]
    service: Option<String>,
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "auto")]
    engine: EngineArg,
    /// Only rows created by the spine time are candidates (guards against backfill leakage).
    #[arg(long)]
    created_cutoff: bool,
    /// Join on a DataFusion Ballista cluster: df://HOST:PORT of its scheduler (see
    /// `quiver cluster`); `?partitions=N` sets the hash partitions (default 8).
    #[arg(long)]
    cluster: Option<String>,
}

impl Historical {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let start = std::time::Instant::now();
        let repo = ctx.open()?;
        let rt = runtime()?;
        let bar = progress_bar();
        let spine = self.spine.chosen()?;
        let mut op = repo
            .historical(spine)
            .with_engine(self.engine.into())
            .with_created_cutoff(self.created_cutoff)
            .with_cluster(self.cluster)
            .with_progress(progress_on(&bar));
        op = match self.service {
            Some(service) => op.with_service(service),
            None => op.with_features(self.features),
        };
        let joined = rt.block_on(op.write_parquet(&self.out))?;
        bar.finish_and_clear();
        println!(
            "historical: {} x {} -> {} in {:.2} s ({})",
            count(joined.batch.num_rows(), "row"),
            count(joined.refs.len(), "feature"),
            self.out.display(),
            start.elapsed().as_secs_f64(),
            joined.engine_note
        );
        Ok(())
    }
}
