//! `quiver verify`: do the online and offline stores agree?

use quiver::FeatureReport;
use quiver::ops::parse_time;
use quiver::sdk::Timestamp;
use quiver::sdk::types::format_instant;
use quiver_sdk::error::count;

use super::{Ctx, runtime};

/// Compare the online store with the offline store; non-zero exit over the threshold.
#[derive(Debug, clap::Args)]
pub struct Verify {
    #[arg(long, required_unless_present = "sample", conflicts_with = "sample")]
    since: Option<String>,
    #[arg(long, requires = "since")]
    until: Option<String>,
    #[arg(long)]
    sample: Option<u64>,
    #[arg(long, default_value_t = 0.0)]
    max_mismatch: f64,
    /// With --since: only rows created by each request time count, as in
    /// `historical --created-cutoff`.
    #[arg(long, requires = "since")]
    created_cutoff: bool,
    /// With --since: judge each answer by the rows that had arrived offline (their Delta
    /// commit) around its request time, not by event time — for a live stream.
    #[arg(long, requires = "since", conflicts_with = "created_cutoff")]
    as_arrived: bool,
    /// With --as-arrived: how far (seconds) an answer's moment may be from its request
    /// time, either way (an online write and its Delta commit are not simultaneous).
    #[arg(long, requires = "as_arrived", default_value_t = 2.0, value_name = "SECONDS")]
    arrival_lag: f64,
}

impl Verify {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        if !(0.0..=1.0).contains(&self.max_mismatch) {
            anyhow::bail!("--max-mismatch must be between 0 and 1, got {}", self.max_mismatch);
        }
        match &self.since {
            Some(since) => self.log(ctx, since),
            None => self.sample(ctx),
        }
    }

    /// `verify --sample N`: the online store against the offline store at now.
    fn sample(&self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let rt = runtime()?;
        let n = usize::try_from(self.sample.unwrap_or(0)).unwrap_or(usize::MAX);
        let reports = rt.block_on(async { repo.verify_sample(n).await })?;
        print_verify(&reports, self.max_mismatch)
    }

    /// `verify --since T [--until T]`: replays the serving log.
    fn log(&self, ctx: &Ctx, since: &str) -> anyhow::Result<()> {
        let now = Timestamp::now();
        let since_us = parse_time("--since", since, now)?;
        let until_us = self.until.as_deref().map(|u| parse_time("--until", u, now)).transpose()?.unwrap_or(now);
        if since_us >= until_us {
            anyhow::bail!("--since {since} is not before --until {}", self.until.as_deref().unwrap_or("now"));
        }
        let repo = ctx.open()?;
        let rt = runtime()?;
        if !(0.0..=3600.0).contains(&self.arrival_lag) {
            anyhow::bail!("--arrival-lag must be between 0 and 3600 seconds, got {}", self.arrival_lag);
        }
        let arrival = self.as_arrived.then(|| std::time::Duration::from_secs_f64(self.arrival_lag));
        let report =
            rt.block_on(async { repo.verify_log(since_us, until_us).with_created_cutoff(self.created_cutoff).as_arrived(arrival).await })?;
        println!(
            "serving log {}: {}, {} from {} to {}",
            repo.config.serving_log.location,
            count(report.requests, "request"),
            count(report.rows, "row"),
            format_instant(since_us.0),
            format_instant(until_us.0)
        );
        for s in &report.skipped {
            println!("skipped: {s}");
        }
        if report.rows == 0 {
            anyhow::bail!(
                "verify: nothing logged between {} and {} (is `serving_log: {{enabled: true}}` set in quiver.yaml, and has the server answered since?)",
                format_instant(since_us.0),
                format_instant(until_us.0)
            );
        }
        if report.features.iter().all(|f| f.compared == 0) {
            anyhow::bail!("verify: {} logged, none could be compared (see the skipped lines above)", count(report.rows, "row"));
        }
        print_verify(&report.features, self.max_mismatch)
    }
}

fn print_verify(reports: &[FeatureReport], max_mismatch: f64) -> anyhow::Result<()> {
    println!(
        "{:<40} {:>9} {:>9} {:>10} {:>14} {:>15}",
        "feature", "compared", "matches", "mismatches", "missing online", "missing offline"
    );
    for r in reports {
        println!(
            "{:<40} {:>9} {:>9} {:>10} {:>14} {:>15}",
            r.feature, r.compared, r.matches, r.mismatches, r.missing_online, r.missing_offline
        );
        for e in &r.examples {
            println!("    {e}");
        }
    }
    let worst = reports.iter().map(FeatureReport::mismatch_rate).fold(0.0, f64::max);
    let compared: u64 = reports.iter().map(|r| r.compared).sum();
    let bad: u64 = reports.iter().map(|r| r.mismatches + r.missing_online + r.missing_offline).sum();
    println!("{bad} of {compared} compared values disagree; worst feature {:.2}% (limit {:.2}%)", worst * 100.0, max_mismatch * 100.0);
    if worst > max_mismatch {
        anyhow::bail!(
            "verify: online and offline disagree on {:.2}% of a feature's rows, over --max-mismatch {max_mismatch}",
            worst * 100.0
        );
    }
    Ok(())
}
