//! The registry commands: `plan`, `apply`, `list`, `describe`.

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
    let plan = repo.plan(remove)?;
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
            "  {:<24} v{:<3} entities {:<20} {:<10} {served}{}\n",
            v.name,
            meta(doc, "feature_view", &v.name).map_or(0, |m| m.version),
            v.entities.join(","),
            window,
            if v.online { "  online" } else { "" }
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
                "  {:<24} v{:<3} inputs {:<20} {:>2} features, {} request fields\n",
                v.name,
                meta(doc, "on_demand_view", &v.name).map_or(0, |m| m.version),
                v.inputs.join(","),
                v.features.len(),
                v.request.len()
            ));
        }
    }
    out
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
