//! `quiver monitor`: is production served what the model was trained on, and is the
//! data moving? One row per feature; exit 1 when a threshold is crossed.

use quiver::monitor::{FeatureDrift, Window};
use quiver::sdk::Timestamp;

use super::{Ctx, runtime};

/// Compare a current window of feature values with a reference (a training set, an
/// offline window); exit 1 when a feature crosses a threshold. The report is stored
/// under .quiver/monitor/.
#[derive(Debug, clap::Args)]
pub struct Monitor {
    /// A feature service: its features, and its thresholds.
    #[arg(long, required_unless_present = "features", conflicts_with = "features")]
    service: Option<String>,
    /// `view:feature` references, comma-separated or repeated.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    features: Vec<String>,
    /// `training:DIR` (an exported training set) or `offline:T1..T2`.
    #[arg(long)]
    reference: String,
    /// `serving:T1..T2` (the serving log) or `offline:T1..T2`.
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
            if let Some(path) = &done.path {
                println!("report: {}", path.display());
            }
        }
        let breached: Vec<&str> = report.features.iter().filter(|f| !f.breaches.is_empty()).map(|f| f.feature.as_str()).collect();
        if !breached.is_empty() {
            anyhow::bail!("monitor: {} of {} features crossed a threshold: {}", breached.len(), report.features.len(), breached.join(", "));
        }
        Ok(())
    }
}

/// One feature's line of the table, its name padded to `width`.
fn row(f: &FeatureDrift, width: usize) -> String {
    let stat = |v: Option<f64>, limit: f64| v.map_or_else(|| "-".to_string(), |v| format!("{v:.4} ({limit})"));
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0));
    let nulls = format!("{} -> {} ({})", pct(f.null_rate.reference), pct(f.null_rate.current), f.limits.null_rate);
    let verdict = if f.breaches.is_empty() { "ok".to_string() } else { format!("BREACH {}", f.breaches.join(", ")) };
    format!(
        "{:<width$} {:>16} {:>16} {:>24} {:>10}  {verdict}",
        f.feature,
        stat(f.psi, f.limits.psi),
        stat(f.ks, f.limits.ks),
        nulls,
        pct(f.not_found_rate)
    )
}
