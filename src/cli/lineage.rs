//! `quiver lineage`: what a training set, a feature, a view or a service was made from,
//! and what reads it (docs/lineage.md#quiver-lineage).

use std::fmt::Write;
use std::path::PathBuf;

use quiver::lineage::graph::{Answer, Kind, Node};

use super::Ctx;

/// Show what a training set, view, feature or service reads (sources, raw columns,
/// expressions, versions) and what reads it (on-demand features, services, training sets).
#[derive(Debug, clap::Args)]
pub struct Lineage {
    /// `training:DIR`, `service:NAME`, `VIEW` (or `VIEW@N`, or an on-demand view), or
    /// `VIEW:FEATURE`.
    target: String,
    /// Also read the training sets under this folder (those under the repository are
    /// always read); repeatable.
    #[arg(long = "training-sets", value_name = "DIR")]
    training_sets: Vec<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl Lineage {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        for dir in &self.training_sets {
            if !dir.is_dir() {
                anyhow::bail!("--training-sets {}: not a folder", dir.display());
            }
        }
        let answer = repo.lineage(&self.target, &self.training_sets)?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        } else {
            print!("{}", render(&answer));
        }
        Ok(())
    }
}

/// What a node is made of or holds, in a few words.
fn what(node: &Node) -> String {
    let d = &node.details;
    let text = |k: &str| d.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    match node.kind {
        Kind::FeatureView => format!("version {}, table {}", d.get("version").map_or(String::new(), ToString::to_string), text("table")),
        Kind::Feature if d.get("live") == Some(&serde_json::Value::Bool(false)) => "no longer in the registry (retired)".to_string(),
        Kind::Feature => {
            let columns: Vec<String> =
                d.get("columns").and_then(|c| c.as_array()).into_iter().flatten().filter_map(|c| c.as_str().map(String::from)).collect();
            match text("expr") {
                e if e.is_empty() => format!("{}, stored from column {}", text("dtype"), columns.join(", ")),
                e => format!("{}, {e} (reads {})", text("dtype"), columns.join(", ")),
            }
        }
        Kind::OnDemandFeature => format!("{}, {}", text("dtype"), text("expr")),
        Kind::OnDemandView => format!("version {}", d.get("version").map_or(String::new(), ToString::to_string)),
        Kind::TrainingSet => format!(
            "id {}, service {}, {} rows",
            text("training_set_id"),
            text("service"),
            d.get("rows").map_or(String::new(), ToString::to_string)
        ),
        Kind::Source | Kind::RequestField | Kind::FeatureService => String::new(),
    }
}

/// One line of a node: its kind, name and what it is made of.
fn line(node: &Node) -> String {
    let what = what(node);
    format!("  {:<18} {}{}\n", node.kind.label(), node.name, if what.is_empty() { String::new() } else { format!("  ({what})") })
}

fn render(answer: &Answer) -> String {
    let mut out = String::new();
    let t = &answer.target;
    let _ = writeln!(out, "{} {}", t.kind.label(), t.name);
    let about = what(t);
    if !about.is_empty() {
        let _ = writeln!(out, "  {about}");
    }
    if t.kind == Kind::TrainingSet {
        out.push_str(&provenance(t));
    }
    for (title, nodes) in [("upstream", &answer.upstream), ("downstream", &answer.downstream)] {
        let _ = writeln!(out, "{title}:");
        if nodes.is_empty() {
            out.push_str("  (nothing)\n");
        }
        for n in nodes {
            out.push_str(&line(n));
        }
    }
    out
}

/// A training set's manifest as its provenance: spine, registry and code versions, the
/// Delta version read of each table, its features.
fn provenance(node: &Node) -> String {
    let d = &node.details;
    let mut out = String::new();
    let spine = &d["spine"];
    let _ = writeln!(
        out,
        "  spine {} ({} rows, sha256 {}){}",
        spine["path"].as_str().unwrap_or_default(),
        spine["rows"],
        spine["sha256"].as_str().unwrap_or_default(),
        if spine.get("made").is_some() { format!(", made: {}", spine["made"]) } else { String::new() }
    );
    let _ = writeln!(out, "  registry version {}", d["registry_version"]);
    match d.get("code_version") {
        Some(code) => {
            let dirty = if code["dirty"].as_bool() == Some(true) { " (with uncommitted changes)" } else { "" };
            let _ = writeln!(out, "  code version {}{dirty}", code["commit"].as_str().unwrap_or_default());
        }
        None => out.push_str("  code version: not recorded (the repository was not in git, or the set predates it)\n"),
    }
    for (view, version) in d["delta_versions"].as_object().into_iter().flatten() {
        let _ = writeln!(out, "  read {view} at Delta version {version}");
    }
    for f in d["features"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "  column {} <- {}", f["column"].as_str().unwrap_or_default(), f["reference"].as_str().unwrap_or_default());
    }
    out
}
