//! `quiver ingest VIEW FILE`, `quiver push VIEW FILE [--to ...]` and `quiver backfill
//! VIEW@N [--from M]`.

use std::path::PathBuf;

use quiver::ops::Rows;
use quiver::streaming::Target;
use quiver_sdk::error::count;

use super::{Ctx, progress_bar, progress_on, runtime};

/// Append a Parquet, CSV or JSON-lines file to a view's Delta table.
#[derive(Debug, clap::Args)]
pub struct Ingest {
    view: String,
    file: PathBuf,
    /// Append the file even when the table already holds its content (an ingest is
    /// otherwise a no-op for content ingested before: a retry never doubles rows).
    #[arg(long)]
    allow_duplicate: bool,
}

impl Ingest {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let rt = runtime()?;
        let bar = progress_bar();
        let file = self.file.display().to_string();
        let report = rt.block_on(async {
            repo.ingest(&self.view, Rows::File(self.file)).allow_duplicate(self.allow_duplicate).with_progress(progress_on(&bar)).await
        })?;
        bar.finish_and_clear();
        if report.duplicate {
            println!(
                "{file}: already ingested into {} (table version {} holds the same content): nothing appended; --allow-duplicate appends it again",
                self.view,
                report.version.expect("a duplicate is held by a version")
            );
            return Ok(());
        }
        let Some(version) = report.version else {
            // The source filter dropped every row: nothing appended, and not an error.
            println!("ingested no rows into {}: {} in {:.2} s; nothing appended", self.view, filtered(report.dropped), report.seconds);
            return Ok(());
        };
        println!(
            "ingested {} into {} (table version {version}) in {:.2} s{}",
            rows(report.rows),
            self.view,
            report.seconds,
            shaped_note(report.dropped, report.uncomputed)
        );
        Ok(())
    }
}

/// The spellings are those of `/push`'s `to` (the hyphenated one is still taken).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PushTarget {
    Online,
    Offline,
    #[value(name = "online_and_offline", alias = "online-and-offline")]
    OnlineAndOffline,
}

/// Write rows through the streaming write path.
#[derive(Debug, clap::Args)]
pub struct Push {
    view: String,
    file: PathBuf,
    /// Default: both stores for an online view, offline for a view with `online: false`.
    #[arg(long, value_enum)]
    to: Option<PushTarget>,
}

impl Push {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let target = self.to.map(|t| match t {
            PushTarget::Online => Target::Online,
            PushTarget::Offline => Target::Offline,
            PushTarget::OnlineAndOffline => Target::OnlineAndOffline,
        });
        let began = std::time::Instant::now();
        let rt = runtime()?;
        let report = rt.block_on(async { repo.push(&self.view, Rows::File(self.file)).with_target(target).await })?;
        let mut parts = Vec::new();
        if let Some(v) = report.offline_version {
            parts.push(format!("offline: table version {v}"));
        }
        if let Some(w) = report.online_written {
            parts.push(format!("online: {w} written, {} older than the stored rows", report.rows - w));
        }
        if report.rows == 0 {
            // The source filter dropped every row: nothing written, and not an error.
            println!(
                "pushed no rows into {}: {} in {:.2} s; nothing written",
                self.view,
                filtered(report.dropped),
                began.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        println!(
            "pushed {} into {} ({}) in {:.2} s{}",
            rows(report.rows),
            self.view,
            parts.join("; "),
            began.elapsed().as_secs_f64(),
            shaped_note(report.dropped, report.uncomputed)
        );
        Ok(())
    }
}

/// Fill a version of a view from an earlier version's stored rows, where every column
/// it reads can be derived from them (one Delta commit; rows it already holds are not
/// written again). `quiver materialize` then fills its online keys.
#[derive(Debug, clap::Args)]
pub struct Backfill {
    /// The version filled, `view@N` (the latest without `@N`).
    #[arg(value_name = "VIEW@N")]
    view: String,
    /// The version read (default: the newest live version before it).
    #[arg(long, value_name = "M")]
    from: Option<u32>,
}

impl Backfill {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let rt = runtime()?;
        let bar = progress_bar();
        let began = std::time::Instant::now();
        let r = rt.block_on(async { repo.backfill(&self.view).from_version(self.from).with_progress(progress_on(&bar)).await })?;
        bar.finish_and_clear();
        let held = if r.already > 0 { format!(", {} already there", rows(r.already)) } else { String::new() };
        let what = match r.table_version {
            Some(v) => format!("wrote {} (table version {v})", rows(r.written)),
            None => "nothing to write".to_string(),
        };
        println!(
            "backfilled {} from {}: read {}{held}; {what} in {:.2} s{}",
            r.to,
            r.from,
            rows(r.read),
            began.elapsed().as_secs_f64(),
            shaped_note(r.dropped, r.uncomputed)
        );
        Ok(())
    }
}

/// What a view's write-time expressions did, for the summary line: the rows its filter
/// dropped and the values that could not be computed; nothing when neither happened.
pub(super) fn shaped_note(dropped: usize, uncomputed: u64) -> String {
    let mut parts = Vec::new();
    if dropped > 0 {
        parts.push(filtered(dropped));
    }
    if uncomputed > 0 {
        parts.push(format!("{} could not be computed (stored null)", count(uncomputed, "value")));
    }
    if parts.is_empty() { String::new() } else { format!("; {}", parts.join(", ")) }
}

/// `n` rows, said as a reader would: `1 row`, `2 rows`.
pub(super) fn rows(n: usize) -> String {
    count(n, "row")
}

/// `n` rows the source filter dropped.
fn filtered(n: usize) -> String {
    format!("{} dropped by the source filter", rows(n))
}
