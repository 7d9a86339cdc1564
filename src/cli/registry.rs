//! The registry commands: `plan`, `apply`, `list`, `describe`, `versions`, `retire`.

use std::path::Path;

use quiver::Repo;
use quiver::sdk::registry::{ObjectMeta, Origin, format_time};
use quiver::sdk::{Definitions, RegistryDoc};

use super::{Ctx, runtime};

/// Show what `apply` would change in the registry, per field.
#[derive(Debug, clap::Args)]
pub struct Plan {
    /// Also remove this object, defined by another front end (Python): `kind/name` or
    /// a name; repeatable. Objects defined elsewhere are otherwise kept.
    #[arg(long, value_name = "OBJECT")]
    remove: Vec<String>,
}

/// Record features.yaml in the registry as its next version.
#[derive(Debug, clap::Args)]
pub struct Apply {
    /// Apply even changes that break views already holding data.
    #[arg(long)]
    force: bool,
    /// Also remove this object, defined by another front end (Python): `kind/name` or
    /// a name; repeatable. Objects defined elsewhere are otherwise kept.
    #[arg(long, value_name = "OBJECT")]
    remove: Vec<String>,
}

/// List what the registry holds.
#[derive(Debug, clap::Args)]
pub struct List {}

/// Show one entity, feature view or feature service of the registry.
#[derive(Debug, clap::Args)]
pub struct Describe {
    /// Its name (`kind/name`, e.g. `feature_view/driver_hourly`, when names clash).
    name: String,
}

/// Show every live version of a view: when it was made, what changed from the
/// previous one, its rows offline and keys online, and what reads it.
#[derive(Debug, clap::Args)]
pub struct Versions {
    /// A feature view or an on-demand view.
    view: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Retire a version of a view no service or on-demand view reads: its online keys and
/// registry entry go (its Delta table stays unless --delete-data).
#[derive(Debug, clap::Args)]
pub struct Retire {
    /// The version, `view@N`.
    #[arg(value_name = "VIEW@N")]
    target: String,
    /// Also delete the version's Delta table.
    #[arg(long)]
    delete_data: bool,
}

impl Versions {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let rt = runtime()?;
        let versions = repo.versions(&self.view, rt.handle())?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&versions)?);
            return Ok(());
        }
        print!("{}", render_versions(&self.view, &versions));
        Ok(())
    }
}

impl Retire {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let rt = runtime()?;
        let r = repo.retire(&self.target, self.delete_data, chrono::Utc::now(), rt.handle())?;
        let table = match (&r.table, r.table_deleted) {
            (Some(t), true) => format!("; its table {t} deleted"),
            (Some(t), false) => format!("; its table {t} kept (--delete-data deletes it)"),
            (None, _) => String::new(),
        };
        println!(
            "retired {}: {} online removed{table}; registry is at version {}",
            r.name,
            quiver_sdk::error::count(r.keys_removed, "key"),
            r.registry_version
        );
        Ok(())
    }
}

/// One line per version, then its changes from the previous one, indented.
fn render_versions(name: &str, versions: &[quiver::ops::VersionInfo]) -> String {
    let mut out = format!("{name}: {} live\n", quiver_sdk::error::count(versions.len(), "version"));
    out.push_str(&format!(
        "  {:<12} {:<22} {:<9} {:>12} {:>12}  {}\n",
        "version", "created", "registry", "rows offline", "keys online", "read by"
    ));
    let or_dash = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |n| n.to_string());
    for v in versions {
        let version = if v.latest { format!("{} (latest)", v.version) } else { v.version.to_string() };
        let read_by = if v.read_by.is_empty() { "-".to_string() } else { v.read_by.join(", ") };
        out.push_str(&format!(
            "  {:<12} {:<22} {:<9} {:>12} {:>12}  {read_by}\n",
            version,
            v.created.as_deref().unwrap_or("-"),
            or_dash(v.registry_version),
            or_dash(v.rows_offline),
            or_dash(v.keys_online),
        ));
        for change in &v.changes {
            out.push_str(&format!("      {change}\n"));
        }
    }
    out
}

impl Plan {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        cmd_plan(&ctx.repo, self.remove)
    }
}

impl Apply {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        cmd_apply(&ctx.repo, self.force, self.remove)
    }
}

impl List {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        cmd_list(&ctx.repo)
    }
}

impl Describe {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        cmd_describe(&ctx.repo, &self.name)
    }
}

fn cmd_plan(dir: &Path, remove: Vec<String>) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let applied = repo.applied()?;
    let rt = runtime()?;
    let plan = repo.plan(remove, rt.handle().clone())?;
    if !plan.is_empty() || !plan.kept.is_empty() {
        println!("{plan}");
    }
    if plan.is_empty() {
        println!("no changes: registry is at version {}", applied.version);
    } else {
        println!("run `quiver apply` to record this as version {}", applied.version + 1);
    }
    Ok(())
}

fn cmd_apply(dir: &Path, force: bool, remove: Vec<String>) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let rt = runtime()?;
    let origin = Origin::new(quiver::DEFINITIONS_FILE).removing(remove);
    let applied = repo.apply_from(repo.definitions()?, &origin, force, chrono::Utc::now(), rt.handle().clone())?;
    for table in &applied.created_tables {
        println!("created delta table {table}");
    }
    let outcome = applied.outcome;
    if !outcome.written {
        if !outcome.plan.kept.is_empty() {
            println!("{}", outcome.plan);
        }
        println!("no changes: registry stays at version {}", outcome.version);
        return Ok(());
    }
    println!("{}", outcome.plan);
    for b in &outcome.forced {
        eprintln!("warning: forced: {b}");
    }
    println!("applied: registry {} is at version {}", repo.config.registry_path.display(), outcome.version);
    Ok(())
}

fn cmd_list(dir: &Path) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    if doc.version == 0 {
        println!("registry is empty: nothing applied yet (run `quiver apply`)");
        return Ok(());
    }
    print!("{}", render_list(&doc));
    Ok(())
}

fn meta<'a>(doc: &'a RegistryDoc, kind: &str, name: &str) -> Option<&'a ObjectMeta> {
    doc.objects.get(&format!("{kind}/{name}"))
}

fn render_list(doc: &RegistryDoc) -> String {
    let defs: &Definitions = &doc.definitions;
    let mut out = format!(
        "project {} · registry version {}{}\n",
        doc.project,
        doc.version,
        doc.updated_at.map(|t| format!(" · applied {}", format_time(&t))).unwrap_or_default()
    );
    out.push_str(&format!("\nentities ({})\n", defs.entities.len()));
    for e in &defs.entities {
        let keys: Vec<String> = e.join_keys.iter().map(|k| format!("{}:{}", k.name, k.dtype)).collect();
        out.push_str(&format!("  {:<24} keys {}\n", e.name, keys.join(", ")));
    }
    out.push_str(&format!("\nfeature views ({})\n", defs.feature_views.len()));
    for v in &defs.feature_views {
        // An event log's served features are its aggregations, over its event columns.
        let (window, served) = if v.is_event_log() {
            ("events".to_string(), format!("{:>2} aggregations of {} columns", v.aggregations.len(), v.features.len()))
        } else {
            (format!("ttl {}", v.ttl), format!("{:>2} features", v.features.len()))
        };
        out.push_str(&format!(
            "  {:<24} v{:<3} entities {:<20} {:<10} {served}{}{}\n",
            v.name,
            meta(doc, "feature_view", &v.name).map_or(0, |m| m.version),
            v.entities.join(","),
            window,
            if v.online { "  online" } else { "" },
            live_versions(defs.view_versions(&v.name).iter().map(|v| v.version)),
        ));
    }
    out.push_str(&format!("\nfeature services ({})\n", defs.feature_services.len()));
    for s in &defs.feature_services {
        out.push_str(&format!(
            "  {:<24} v{:<3} {}\n",
            s.name,
            meta(doc, "feature_service", &s.name).map_or(0, |m| m.version),
            quiver_sdk::error::count(s.features.len(), "feature")
        ));
    }
    if !defs.on_demand_views.is_empty() {
        out.push_str(&format!("\non-demand views ({})\n", defs.on_demand_views.len()));
        for v in &defs.on_demand_views {
            out.push_str(&format!(
                "  {:<24} v{:<3} inputs {:<20} {:>2} features, {} request fields",
                v.name,
                meta(doc, "on_demand_view", &v.name).map_or(0, |m| m.version),
                v.inputs.join(","),
                v.features.len(),
                v.request.len()
            ));
            out.push_str(&live_versions(defs.on_demand_versions(&v.name).iter().map(|v| v.version)));
            out.push('\n');
        }
    }
    out
}

/// `  versions 1, 2 (latest 2)` when a view has more than one live version
/// (docs/versions.md); nothing otherwise.
fn live_versions(versions: impl Iterator<Item = u32>) -> String {
    let all: Vec<String> = versions.map(|v| v.to_string()).collect();
    match all.last() {
        Some(latest) if all.len() > 1 => format!("  versions {} (latest {latest})", all.join(", ")),
        _ => String::new(),
    }
}

fn cmd_describe(dir: &Path, name: &str) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let defs = &doc.definitions;
    let (kind_filter, name) = match name.split_once('/') {
        Some((k, n)) => (Some(k), n),
        None => (None, name),
    };
    let wanted = |kind: &str| kind_filter.is_none_or(|k| k == kind);
    let mut found: Vec<(&str, serde_json::Value)> = Vec::new();
    if let Some(e) = defs.entity(name).filter(|_| wanted("entity")) {
        found.push(("entity", serde_json::to_value(e)?));
    }
    if let Some(v) = defs.feature_view(name).filter(|_| wanted("feature_view")) {
        let mut value = serde_json::to_value(v)?;
        let keys: Vec<String> = defs.join_keys(v).iter().map(|k| format!("{}:{}", k.name, k.dtype)).collect();
        value["join_keys"] = keys.into();
        value["table"] = repo.config.view_table(v).to_string().into();
        // An aggregation that names no hop shows the one it gets.
        for (a, shown) in v.aggregations.iter().zip(value["aggregations"].as_array_mut().into_iter().flatten()) {
            if a.hop.is_none() {
                shown["hop"] = format!("{} (default for a {} window)", a.hop(), a.window).into();
            }
        }
        found.push(("feature_view", value));
    }
    if let Some(s) = defs.feature_service(name).filter(|_| wanted("feature_service")) {
        let mut value = serde_json::to_value(s)?;
        value["output_columns"] = s.features.iter().map(|r| r.column_name()).collect::<Vec<_>>().into();
        found.push(("feature_service", value));
    }
    if let Some(v) = defs.on_demand_view(name).filter(|_| wanted("on_demand_view")) {
        let mut value = serde_json::to_value(v)?;
        // What the request must carry (its own fields and those of the views it reads),
        // and the join keys that find its inputs' rows.
        let fields = quiver::sdk::on_demand::request_fields(defs, v);
        value["request_fields"] = fields.iter().map(|f| format!("{}:{}", f.name, f.dtype)).collect::<Vec<_>>().into();
        value["join_keys"] =
            quiver::sdk::on_demand::keys(defs, v).iter().map(|k| format!("{}:{}", k.name, k.dtype)).collect::<Vec<_>>().into();
        found.push(("on_demand_view", value));
    }
    if found.is_empty() {
        let mut all: Vec<&str> = defs.entities.iter().map(|e| e.name.as_str()).collect();
        all.extend(defs.feature_views.iter().map(|v| v.name.as_str()));
        all.extend(defs.feature_services.iter().map(|s| s.name.as_str()));
        all.extend(defs.on_demand_views.iter().map(|v| v.name.as_str()));
        anyhow::bail!("`{name}` is not in the registry (version {}; known: {})", doc.version, quiver::sdk::known(all));
    }
    for (i, (kind, mut value)) in found.into_iter().enumerate() {
        if i > 0 {
            println!("---");
        }
        if let Some(m) = meta(&doc, kind, name) {
            value["version"] = m.version.into();
            value["created_at"] = format_time(&m.created_at).into();
            value["updated_at"] = format_time(&m.updated_at).into();
        }
        println!("kind: {kind}");
        print!("{}", serde_yaml::to_string(&value)?);
    }
    Ok(())
}
