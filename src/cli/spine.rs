//! Where a join's spine comes from, for `historical` and `export`: a file, or made from
//! the offline store (docs/export.md#without-a-spine).

use std::path::PathBuf;

use quiver::ops::{MadeSpine, RowsOf, Spine, parse_time};
use quiver::sdk::Timestamp;

/// The spine options `historical` and `export` share.
#[derive(Debug, clap::Args)]
pub struct SpineArgs {
    /// The spine (Parquet or CSV): join keys, event_timestamp, labels.
    #[arg(long, conflicts_with_all = ["entities_at", "rows_of"])]
    pub spine: Option<PathBuf>,
    /// Instead of a spine: every entity with a row at or before TIME in the joined
    /// views (which must share one entity), with its features as of TIME.
    #[arg(long, value_name = "TIME", conflicts_with = "rows_of")]
    pub entities_at: Option<String>,
    /// Instead of a spine: every row of VIEW (labels, events), its own columns kept, its
    /// event time the row's point in time.
    #[arg(long, value_name = "VIEW")]
    pub rows_of: Option<String>,
    /// With --rows-of: only rows with event times from T1 up to (not including) T2.
    #[arg(long, num_args = 2, value_names = ["T1", "T2"])]
    pub between: Vec<String>,
    /// With --rows-of: keep each row with probability R (0 < R <= 1), the same rows for
    /// the same --seed.
    #[arg(long, value_name = "R")]
    pub sample: Option<f64>,
    /// The sample's seed (default 0).
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
}

impl SpineArgs {
    /// The spine asked for.
    ///
    /// # Errors
    /// None given, or a time that does not parse (naming the option).
    pub fn chosen(self) -> anyhow::Result<Spine> {
        let now = Timestamp::now();
        // Where --between, --sample and --seed have no place to go; their values are
        // checked by `RowsOf::new`, as Python's are.
        if self.rows_of.is_none() && (self.sample.is_some() || self.seed.is_some() || !self.between.is_empty()) {
            anyhow::bail!("--between, --sample and --seed go with --rows-of VIEW");
        }
        if let Some(path) = self.spine {
            return Ok(Spine::File(path));
        }
        if let Some(at) = self.entities_at {
            return Ok(Spine::Made(MadeSpine::EntitiesAt { at: parse_time("--entities-at", &at, now)?.micros() }));
        }
        let Some(view) = self.rows_of else {
            anyhow::bail!("a spine is needed: --spine FILE, --entities-at TIME or --rows-of VIEW");
        };
        let between = match self.between.as_slice() {
            [a, b] => Some((parse_time("--between", a, now)?.micros(), parse_time("--between", b, now)?.micros())),
            _ => None,
        };
        Ok(Spine::Made(MadeSpine::RowsOf(RowsOf::new(view, between, self.sample, self.seed)?)))
    }
}
