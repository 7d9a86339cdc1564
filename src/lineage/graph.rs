//! The repository's lineage as a graph (docs/lineage.md#quiver-lineage): sources into
//! feature views, views into their features (a stored feature from its column, a
//! write-time expression from the raw columns it reads, an aggregation from its event
//! column), features into on-demand features, features into services, and services and
//! features into the training sets exported from them (read from their manifests).
//! `quiver lineage` answers from a node's ancestors and descendants; the UI's lineage
//! page draws the whole graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quiver_sdk::{Config, Definitions, FeatureView, OnDemandView};
use serde::Serialize;
use serde_json::{Value, json};

use super::columns::{OnDemandInput, feature_columns, on_demand_inputs};
use crate::export::Manifest;

/// What a node stands for, in the order the graph flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Source,
    FeatureView,
    Feature,
    RequestField,
    OnDemandView,
    OnDemandFeature,
    FeatureService,
    TrainingSet,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Source => "source",
            Kind::FeatureView => "feature view",
            Kind::Feature => "feature",
            Kind::RequestField => "request field",
            Kind::OnDemandView => "on-demand view",
            Kind::OnDemandFeature => "on-demand feature",
            Kind::FeatureService => "feature service",
            Kind::TrainingSet => "training set",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    pub id: String,
    pub kind: Kind,
    pub name: String,
    /// What the node is made of or holds: a feature's columns and expression, a view's
    /// table and version, a training set's manifest.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub details: serde_json::Map<String, Value>,
}

/// `from` is read to make `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

/// A node with what it reads from, transitively (`upstream`) and what reads it
/// (`downstream`), and the edges among them: `quiver lineage`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub target: Node,
    pub upstream: Vec<Node>,
    pub downstream: Vec<Node>,
    pub edges: Vec<Edge>,
}

fn id(kind: Kind, name: &str) -> String {
    let prefix = match kind {
        Kind::Source => "source",
        Kind::FeatureView => "feature_view",
        Kind::Feature => "feature",
        Kind::RequestField => "request_field",
        Kind::OnDemandView => "on_demand_view",
        Kind::OnDemandFeature => "on_demand_feature",
        Kind::FeatureService => "feature_service",
        Kind::TrainingSet => "training_set",
    };
    format!("{prefix}:{name}")
}

impl Graph {
    /// The graph of `defs` (every live version) and `training_sets` (folder, manifest).
    pub fn build(config: &Config, defs: &Definitions, training_sets: &[(PathBuf, Manifest)]) -> Graph {
        let mut g = Graph::default();
        for view in defs.all_view_versions() {
            g.feature_view(config, defs, view);
        }
        let mut on_demand: Vec<&OnDemandView> = defs.on_demand_views.iter().chain(&defs.earlier_versions.on_demand_views).collect();
        on_demand.sort_by_key(|o| (o.name.clone(), o.version));
        for view in on_demand {
            g.on_demand_view(defs, view);
        }
        for service in &defs.feature_services {
            let sid = g.node(Kind::FeatureService, &service.name, serde_json::Map::new());
            for r in &service.features {
                let from = g.reference(defs, &defs.as_read(r).to_string());
                g.edge(&from, &sid);
            }
        }
        for (folder, manifest) in training_sets {
            g.training_set(defs, folder, manifest);
        }
        g
    }

    fn node(&mut self, kind: Kind, name: &str, details: serde_json::Map<String, Value>) -> String {
        let id = id(kind, name);
        match self.nodes.iter_mut().find(|n| n.id == id) {
            Some(n) => n.details.extend(details),
            None => self.nodes.push(Node { id: id.clone(), kind, name: name.to_string(), details }),
        }
        id
    }

    fn edge(&mut self, from: &str, to: &str) {
        let edge = Edge { from: from.to_string(), to: to.to_string() };
        if !self.edges.contains(&edge) {
            self.edges.push(edge);
        }
    }

    fn feature_view(&mut self, config: &Config, defs: &Definitions, view: &FeatureView) {
        let name = view.versioned_name();
        let table = super::Dataset::at(&config.view_table(view).to_string());
        let table = if table.namespace == "file" { table.name } else { format!("{}{}", table.namespace, table.name) };
        let details = object(json!({"version": view.version, "table": table, "entities": view.entities}));
        let vid = self.node(Kind::FeatureView, &name, details);
        if let Some(path) = &view.source.path {
            let sid = self.node(Kind::Source, path, serde_json::Map::new());
            self.edge(&sid, &vid);
        }
        if let Some(stream) = &view.source.stream {
            let sid = self.node(Kind::Source, &format!("kafka:{}", stream.topic), serde_json::Map::new());
            self.edge(&sid, &vid);
        }
        let feature = |columns: &[String], expr: &str, dtype: String| {
            let mut d = object(json!({"dtype": dtype, "columns": columns}));
            if !expr.is_empty() {
                d.insert("expr".into(), expr.into());
            }
            d
        };
        if view.is_event_log() {
            for agg in &view.aggregations {
                let dtype = view.served_feature(&agg.name).map(|f| f.dtype.as_str().to_string()).unwrap_or_default();
                let how = format!("{} of {} over {}", agg.function, agg.column, agg.window);
                let fid =
                    self.node(Kind::Feature, &format!("{name}:{}", agg.name), feature(std::slice::from_ref(&agg.column), &how, dtype));
                self.edge(&vid, &fid);
            }
            return;
        }
        for (f, columns, expr) in feature_columns(defs, view) {
            let dtype = view.feature(&f).map(|x| x.dtype.as_str().to_string()).unwrap_or_default();
            let fid = self.node(Kind::Feature, &format!("{name}:{f}"), feature(&columns, &expr, dtype));
            self.edge(&vid, &fid);
        }
    }

    fn on_demand_view(&mut self, defs: &Definitions, view: &OnDemandView) {
        let name = view.versioned_name();
        let oid = self.node(Kind::OnDemandView, &name, object(json!({"version": view.version})));
        for input in &view.inputs {
            let from = match (defs.feature_view(input), defs.on_demand_view(input)) {
                (Some(v), _) => id(Kind::FeatureView, &v.versioned_name()),
                (None, Some(o)) => id(Kind::OnDemandView, &o.versioned_name()),
                (None, None) => continue,
            };
            self.edge(&from, &oid);
        }
        for (f, inputs, expr) in on_demand_inputs(defs, view) {
            let dtype = view.feature(&f).map(|x| x.dtype.as_str().to_string()).unwrap_or_default();
            let fid = self.node(Kind::OnDemandFeature, &format!("{name}:{f}"), object(json!({"dtype": dtype, "expr": expr})));
            self.edge(&oid, &fid);
            for input in inputs {
                let from = match input {
                    OnDemandInput::Stored { view, feature } => id(Kind::Feature, &format!("{view}:{feature}")),
                    OnDemandInput::EventTime { view } => id(Kind::FeatureView, &view),
                    OnDemandInput::Computed { view, feature } => id(Kind::OnDemandFeature, &format!("{view}:{feature}")),
                    OnDemandInput::Request(field) => self.node(Kind::RequestField, &format!("{name}:{field}"), serde_json::Map::new()),
                };
                self.edge(&from, &fid);
            }
        }
    }

    /// The node of a reference as read (`view:feature`, `view@N:feature`): a stored or
    /// an on-demand feature; one the registry no longer has (a retired version) is
    /// added, marked so.
    fn reference(&mut self, defs: &Definitions, reference: &str) -> String {
        let Ok(r) = reference.parse::<quiver_sdk::FeatureRef>() else {
            return self.node(Kind::Feature, reference, object(json!({"live": false})));
        };
        let versioned = |kind: Kind, name: String| id(kind, &format!("{name}:{}", r.feature));
        match defs.find(&r) {
            Ok(quiver_sdk::definitions::Found::Stored(view, _)) => versioned(Kind::Feature, view.versioned_name()),
            Ok(quiver_sdk::definitions::Found::OnDemand(view, _)) => versioned(Kind::OnDemandFeature, view.versioned_name()),
            Err(_) => self.node(Kind::Feature, reference, object(json!({"live": false}))),
        }
    }

    fn training_set(&mut self, defs: &Definitions, folder: &Path, manifest: &Manifest) {
        let mut details = object(json!({
            "training_set_id": manifest.training_set_id,
            "service": manifest.options.service,
            "rows": manifest.rows,
            "registry_version": manifest.registry_version,
            "delta_versions": manifest.delta_versions,
            "spine": {"path": manifest.spine.path, "sha256": manifest.spine.sha256, "rows": manifest.spine.rows},
            "features": manifest.features.iter().map(|f| json!({"reference": f.reference, "column": f.column, "dtype": f.dtype})).collect::<Vec<_>>(),
        }));
        if let Some(made) = &manifest.spine.made {
            details["spine"]["made"] = serde_json::to_value(made).unwrap_or(Value::Null);
        }
        if let Some(code) = &manifest.code_version {
            details.insert("code_version".into(), json!(code));
        }
        let tid = self.node(Kind::TrainingSet, &folder.display().to_string(), details);
        if defs.feature_service(&manifest.options.service).is_some() {
            self.edge(&id(Kind::FeatureService, &manifest.options.service), &tid);
        }
        for f in &manifest.features {
            let from = self.reference(defs, &f.reference);
            self.edge(&from, &tid);
        }
    }

    /// `target`'s ancestors and descendants.
    pub fn around(&self, target: &str) -> Option<Answer> {
        let node = self.nodes.iter().find(|n| n.id == target)?.clone();
        let walk = |forward: bool| -> BTreeSet<&str> {
            let mut seen = BTreeSet::new();
            let mut stack = vec![target];
            while let Some(at) = stack.pop() {
                for e in &self.edges {
                    let (here, next) = if forward { (&e.from, &e.to) } else { (&e.to, &e.from) };
                    if here == at && seen.insert(next.as_str()) {
                        stack.push(next);
                    }
                }
            }
            seen
        };
        let (up, down) = (walk(false), walk(true));
        let nodes = |ids: &BTreeSet<&str>| {
            let mut out: Vec<Node> = self.nodes.iter().filter(|n| ids.contains(n.id.as_str())).cloned().collect();
            out.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
            out
        };
        let within = |id: &str| id == target || up.contains(id) || down.contains(id);
        let edges = self.edges.iter().filter(|e| within(&e.from) && within(&e.to)).cloned().collect();
        Some(Answer { target: node, upstream: nodes(&up), downstream: nodes(&down), edges })
    }
}

fn object(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// What `quiver lineage` is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `training:DIR`.
    Training(PathBuf),
    /// `service:NAME`.
    Service(String),
    /// `VIEW` or `VIEW:FEATURE` (a feature view, `view@N`, or an on-demand view).
    View { view: String, feature: Option<String> },
}

impl Target {
    pub fn parse(text: &str) -> Target {
        if let Some(dir) = text.strip_prefix("training:") {
            return Target::Training(PathBuf::from(dir));
        }
        if let Some(name) = text.strip_prefix("service:") {
            return Target::Service(name.to_string());
        }
        match text.split_once(':') {
            Some((view, feature)) => Target::View { view: view.to_string(), feature: Some(feature.to_string()) },
            None => Target::View { view: text.to_string(), feature: None },
        }
    }

    /// The target's node id in the graph of `defs`.
    ///
    /// # Errors
    /// What is unknown, naming what is known.
    pub fn node(&self, defs: &Definitions) -> Result<String, String> {
        match self {
            Target::Training(dir) => {
                Ok(id(Kind::TrainingSet, &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone()).display().to_string()))
            }
            Target::Service(name) => defs.find_service(name).map(|s| id(Kind::FeatureService, &s.name)).map_err(|e| e.0),
            Target::View { view, feature: Some(feature) } => {
                let r: quiver_sdk::FeatureRef = format!("{view}:{feature}").parse().map_err(|e| format!("`{view}:{feature}`: {e}"))?;
                match defs.find(&r).map_err(|e| e.0)? {
                    quiver_sdk::definitions::Found::Stored(v, _) => Ok(id(Kind::Feature, &format!("{}:{feature}", v.versioned_name()))),
                    quiver_sdk::definitions::Found::OnDemand(v, _) => {
                        Ok(id(Kind::OnDemandFeature, &format!("{}:{feature}", v.versioned_name())))
                    }
                }
            }
            Target::View { view, feature: None } => {
                if let Some(v) = defs.feature_view(view) {
                    return Ok(id(Kind::FeatureView, &v.versioned_name()));
                }
                if let Some(o) = defs.on_demand_view(view) {
                    return Ok(id(Kind::OnDemandView, &o.versioned_name()));
                }
                let views = defs.feature_views.iter().map(|v| v.name.as_str());
                let on_demand = defs.on_demand_views.iter().map(|v| v.name.as_str());
                let services = defs.feature_services.iter().map(|s| format!("service:{}", s.name)).collect::<Vec<_>>();
                Err(format!(
                    "no feature view or on-demand view `{view}` (known: {}; or service:NAME ({}), training:DIR)",
                    quiver_sdk::definitions::known(views.chain(on_demand)),
                    quiver_sdk::definitions::known(services.iter().map(String::as_str)),
                ))
            }
        }
    }
}

/// The training sets in `folders` and below (a folder holding `manifest.json`; Delta
/// tables and hidden folders are not searched, nor deeper than four levels), by
/// canonical folder, each once.
pub fn find_training_sets(folders: &[PathBuf]) -> Vec<(PathBuf, Manifest)> {
    fn walk(dir: &Path, depth: usize, out: &mut BTreeMap<PathBuf, Manifest>) {
        let manifest = dir.join("manifest.json");
        if let Some(m) = std::fs::read(&manifest).ok().and_then(|b| serde_json::from_slice::<Manifest>(&b).ok()) {
            out.insert(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()), m);
            return;
        }
        if depth == 0 || dir.join("_delta_log").is_dir() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let hidden = entry.file_name().to_str().is_none_or(|n| n.starts_with('.'));
            if !hidden && entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&entry.path(), depth - 1, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    for folder in folders {
        walk(folder, 4, &mut out);
    }
    out.into_iter().collect()
}

/// The manifest of the training set in `dir`.
///
/// # Errors
/// A folder without one, or one that does not read, naming the file.
pub fn read_manifest(dir: &Path) -> Result<(PathBuf, Manifest), String> {
    let file = dir.join("manifest.json");
    let bytes = std::fs::read(&file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{}: no manifest.json (is it a finished `quiver export`?)", dir.display()),
        _ => format!("{}: {e}", file.display()),
    })?;
    let manifest = serde_json::from_slice(&bytes).map_err(|e| format!("{}: not a training set's manifest: {e}", file.display()))?;
    Ok((std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()), manifest))
}

impl crate::Repo {
    /// `quiver lineage TARGET`: what `target` (`training:DIR`, `service:NAME`, `VIEW`,
    /// `VIEW:FEATURE`) reads, transitively, and what reads it.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] for an unknown name (naming the known ones) or a
    /// folder without a manifest; [`crate::Error::Invalid`] for a manifest that does
    /// not read.
    pub fn lineage(&self, target: &str, training_sets: &[PathBuf]) -> crate::Result<Answer> {
        let defs = self.defs()?;
        let mut folders = vec![self.config.repo.clone()];
        folders.extend(training_sets.iter().cloned());
        let mut sets = find_training_sets(&folders);
        let parsed = Target::parse(target);
        let node = match &parsed {
            Target::Training(dir) => {
                let (folder, manifest) = read_manifest(dir)
                    .map_err(|e| if dir.join("manifest.json").exists() { crate::Error::Invalid(e) } else { crate::Error::NotFound(e) })?;
                sets.retain(|(f, _)| *f != folder);
                sets.push((folder.clone(), manifest));
                id(Kind::TrainingSet, &folder.display().to_string())
            }
            other => other.node(&defs).map_err(crate::Error::NotFound)?,
        };
        let graph = Graph::build(&self.config, &defs, &sets);
        graph.around(&node).ok_or_else(|| crate::Error::NotFound(format!("`{target}` is not in the lineage graph")))
    }
}
