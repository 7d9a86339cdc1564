//! `quiver monitor`: is production served what the model was trained on, and is the
//! data moving? One row per feature; exit 1 when a threshold is crossed ([`Breach`]),
//! 2 when the comparison could not run, 3 when a store could not be reached
//! (src/main.rs, docs/monitoring.md).

use quiver::sdk::Timestamp;
use quiver::{FeatureDrift, Window};

use super::{Ctx, runtime};

/// Compare a current window of feature values with a reference, feature by feature.
///
/// The features are a service's (`--service`) or listed (`--features`): one of the two
/// is needed. Each window is `training:DIR` (the training set exported to DIR),
/// `offline:T1..T2` (the views' stored rows with event times in [T1, T2)) or
/// `serving:T1..T2` (the serving log's answers with request times in [T1, T2)); a time
/// is RFC 3339, a date, `now` or a duration before now (`7d`). Exit 0 when no threshold
/// is crossed, 1 when one is, 2 when the comparison could not run (a bad argument, an
/// unknown feature, an empty window), 3 when a store could not be reached. The report
/// is stored under .quiver/monitor/.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("monitored").required(true).args(["service", "features"])))]
pub struct Monitor {
    /// A feature service: its features, and its thresholds (or `--features`).
    #[arg(long)]
    service: Option<String>,
    /// `view:feature` references, comma-separated or repeated (or `--service`).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    features: Vec<String>,
    /// The reference window: `training:DIR` (an exported training set, the usual
    /// reference), `offline:T1..T2` or `serving:T1..T2`.
    #[arg(long)]
    reference: String,
    /// The current window: `serving:T1..T2` (what was served), `offline:T1..T2` or
    /// `training:DIR`.
    #[arg(long)]
    current: String,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    json: bool,
}

impl Monitor {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let now = Timestamp::now();
        let reference = Window::parse("--reference", &self.reference, now)?;
        let current = Window::parse("--current", &self.current, now)?;
        let repo = ctx.open()?;
        let op = repo.monitor(reference, current);
        let op = match self.service {
            Some(s) => op.with_service(s),
            None => op.with_features(self.features),
        };
        let done = runtime()?.block_on(async { op.await })?;
        let report = &done.report;
        if self.json {
            println!("{}", serde_json::to_string_pretty(report)?);
        } else {
            println!("reference {}\ncurrent   {}", report.reference, report.current);
            let width = report.features.iter().map(|f| f.feature.len()).max().unwrap_or(0).max(7);
            println!(
                "{:<width$} {:>16} {:>16} {:>24} {:>10}  verdict",
                "feature", "psi (limit)", "ks (limit)", "null rate (limit)", "not found"
            );
            for f in &report.features {
                println!("{}", row(f, width));
            }
            // A training set as the current window: its shares come off its sketches.
            let sketched: Vec<String> = report
                .features
                .iter()
                .filter_map(|f| {
                    let error = f.bins.as_ref().and_then(|b| b.current_error).or(f.categories.as_ref().and_then(|c| c.current_error))?;
                    (error > 0.0).then(|| format!("{} ±{:.2}%", f.feature, error * 100.0))
                })
                .collect();
            if !sketched.is_empty() {
                println!("note: the current shares are read off the training set's sketches, each within: {}", sketched.join(", "));
            }
            for f in &report.features {
                if let Some(v) = f.versions {
                    println!(
                        "note: {} compares version {} of its view (reference) with version {} (current): a drift may be the new definition's",
                        f.feature, v.reference, v.current
                    );
                }
            }
            if let Some(path) = &done.path {
                println!("report: {}", path.display());
            }
        }
        let breached: Vec<&str> = report.features.iter().filter(|f| !f.breaches.is_empty()).map(|f| f.feature.as_str()).collect();
        if !breached.is_empty() {
            let what =
                format!("monitor: {} of {} features crossed a threshold: {}", breached.len(), report.features.len(), breached.join(", "));
            return Err(Breach(what).into());
        }
        Ok(())
    }
}

/// A comparison that ran and found features past their thresholds: `quiver monitor`
/// exits 1 on it, and 2 or 3 on an error that stopped the comparison (src/main.rs).
#[derive(Debug)]
pub struct Breach(String);

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Breach {}

/// One feature's line of the table, its name padded to `width`.
fn row(f: &FeatureDrift, width: usize) -> String {
    let stat = |v: Option<f64>, limit: f64| v.map_or_else(|| "-".to_string(), |v| format!("{v:.4} ({limit})"));
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0));
    let nulls = format!("{} -> {} ({})", pct(f.null_rate.reference), pct(f.null_rate.current), f.limits.null_rate);
    let verdict = if f.breaches.is_empty() {
        "ok".to_string()
    } else {
        format!("BREACH {}", f.breaches.iter().map(|b| b.as_str()).collect::<Vec<_>>().join(", "))
    };
    format!(
        "{:<width$} {:>16} {:>16} {:>24} {:>10}  {verdict}",
        f.feature,
        stat(f.psi, f.limits.psi),
        stat(f.ks, f.limits.ks),
        nulls,
        pct(f.not_found_rate)
    )
}
