//! `quiver materialize START END [VIEW...]` and `quiver materialize-incremental END`.

use quiver::ViewReport;
use quiver::ops::parse_time;
use quiver::sdk::Timestamp;
use quiver_sdk::error::count;

use super::{Ctx, progress_bar, progress_on, runtime};

/// Load the latest values between START and END from the offline into the online store.
#[derive(Debug, clap::Args)]
pub struct Materialize {
    start: String,
    end: String,
    views: Vec<String>,
}

/// Load what arrived since the last materialization, up to END.
#[derive(Debug, clap::Args)]
pub struct MaterializeIncremental {
    end: String,
}

impl Materialize {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let began = std::time::Instant::now();
        let now = Timestamp::now();
        let (start, end) = (parse_time("START", &self.start, now)?, parse_time("END", &self.end, now)?);
        let repo = ctx.open()?;
        let rt = runtime()?;
        let bar = progress_bar();
        let reports = rt.block_on(async { repo.materialize(start, end).with_views(self.views).with_progress(progress_on(&bar)).await })?;
        bar.finish_and_clear();
        print_materialized(&reports, began);
        Ok(())
    }
}

impl MaterializeIncremental {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let began = std::time::Instant::now();
        let end = parse_time("END", &self.end, Timestamp::now())?;
        let repo = ctx.open()?;
        let rt = runtime()?;
        let bar = progress_bar();
        let reports = rt.block_on(async { repo.materialize_incremental(end).with_progress(progress_on(&bar)).await })?;
        bar.finish_and_clear();
        print_materialized(&reports, began);
        Ok(())
    }
}

/// A line per view, then the total with the rate.
fn print_materialized(reports: &[ViewReport], began: std::time::Instant) {
    let mut total = 0;
    for r in reports {
        // Every entity is written, left out as expired, or older than the stored row.
        let mut line = format!("{}: {}, {} written", r.view, quiver_sdk::error::count(r.entities, "entity"), r.written);
        if r.expired > 0 {
            line.push_str(&format!(", {} skipped as already expired (past the ttl and its day of grace)", r.expired));
        }
        let older = r.entities.saturating_sub(r.written + r.expired);
        if older > 0 {
            line.push_str(&format!(", {older} older than the row stored"));
        }
        println!("{line}");
        total += r.entities;
    }
    let secs = began.elapsed().as_secs_f64();
    println!(
        "materialized {} from {} in {secs:.2} s ({:.0} rows/s)",
        count(total, "row"),
        count(reports.len(), "view"),
        total as f64 / secs.max(1e-9)
    );
}
