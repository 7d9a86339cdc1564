//! `quiver versions VIEW`, `quiver backfill VIEW@N` and `quiver retire VIEW@N`
//! (docs/versions.md): the live versions of a view, filling a new one from an earlier
//! one's rows, and taking one out of service.

use chrono::{DateTime, Utc};
use quiver_online::view_prefix;
use quiver_sdk::registry::{self, ChangeOp, Retiring, diff, format_time};
use quiver_sdk::{Definitions, ErrorKind, RegistryDoc};
use serde::Serialize;

use quiver_offline::backfill::BackfillReport;

use crate::error::{Error, Result};
use crate::repo::Repo;

/// One live version of a view, as `quiver versions` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    pub version: u32,
    pub latest: bool,
    /// When `apply` made it, and the registry version it made (from the history).
    pub created: Option<String>,
    pub registry_version: Option<u64>,
    /// What differs from the previous live version, one line per field.
    pub changes: Vec<String>,
    /// Its Delta table and rows (feature views only).
    pub table: Option<String>,
    pub rows_offline: Option<u64>,
    /// Its keys in the online store (online feature views only; `None` when the store
    /// cannot be reached or list its keys).
    pub keys_online: Option<u64>,
    /// The services and on-demand views that read it.
    pub read_by: Vec<String>,
}

/// What `quiver retire` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetireReport {
    pub name: String,
    /// Online keys removed.
    pub keys_removed: u64,
    /// The version's Delta table, kept or deleted.
    pub table: Option<String>,
    pub table_deleted: bool,
    /// The registry's version after it.
    pub registry_version: u64,
}

/// Fills a version of a view from an earlier version's stored rows ([`Repo::backfill`]).
#[derive(Debug)]
#[must_use]
pub struct Backfill<'a> {
    repo: &'a Repo,
    view: String,
    from: Option<u32>,
    progress: super::Progress,
}

setters!(Backfill { progress });

impl Backfill<'_> {
    /// The version read (default: the newest live one before the version filled).
    pub fn from_version(mut self, version: Option<u32>) -> Self {
        self.from = version;
        self
    }

    async fn run(self) -> Result<BackfillReport> {
        let defs = self.repo.defs()?;
        let to = super::view(&defs, &self.view)?;
        let mut earlier = defs.view_versions(&to.name).into_iter().filter(|v| v.version < to.version);
        let from = match self.from {
            Some(n) if n >= to.version => {
                return Err(Error::Invalid(format!(
                    "backfill {}@{} from version {n}: the version read must be earlier than the one filled",
                    to.name, to.version
                )));
            }
            Some(n) => super::view(&defs, &quiver_sdk::definitions::versioned_name(&to.name, Some(n)))?,
            None => earlier.next_back().ok_or_else(|| {
                Error::Invalid(format!(
                    "{}@{} is the first live version of `{}`: there is no earlier one to backfill it from",
                    to.name, to.version, to.name
                ))
            })?,
        };
        let progress = self.progress.clone();
        // A lineage run `backfill.<view@N>`: the earlier version's table into the new one's.
        let lineage = crate::lineage::Lineage::of(self.repo);
        let source = crate::lineage::Dataset::at(&self.repo.config.view_table(from).to_string());
        let target = crate::lineage::view_table(&self.repo.config, &defs, to, Some(&source));
        let job = format!("backfill.{}@{}", to.name, to.version);
        let run = lineage.enabled().then(|| lineage.start(&job, std::slice::from_ref(&source), std::slice::from_ref(&target)));
        let result = quiver_offline::backfill::backfill(&self.repo.config, &defs, from, to, &move |p, n| progress.report(p, n)).await;
        if let Some(run) = run {
            let read = result.as_ref().ok().and_then(|r| r.from_table_version);
            let written = result.as_ref().ok().and_then(|r| r.table_version);
            run.end(&result, &[source.version(read)], &[target.version(written)]);
        }
        Ok(result?)
    }
}

awaitable!(Backfill => BackfillReport);

impl Repo {
    /// Fills `view` (`view@N`; the latest without a version) from an earlier live
    /// version's stored rows, where every column it reads can be derived from them:
    /// one Delta commit of the rows its table does not already hold
    /// (docs/versions.md#backfill). Its online keys are filled by `materialize`.
    pub fn backfill(&self, view: &str) -> Backfill<'_> {
        Backfill { repo: self, view: view.to_string(), from: None, progress: super::no_progress() }
    }

    /// Every live version of the view `name` (a feature view or an on-demand view),
    /// oldest first. `runtime` reads the tables and the online store; call from outside
    /// it.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown view; a table that cannot be read.
    pub fn versions(&self, name: &str, runtime: &tokio::runtime::Handle) -> Result<Vec<VersionInfo>> {
        let doc = self.applied()?;
        let d = &doc.definitions;
        let store = runtime.block_on(self.open_store()).ok();
        if d.feature_view(name).is_some() {
            let versions = d.view_versions(name);
            let mut out = Vec::new();
            for (i, view) in versions.iter().enumerate() {
                let previous = i.checked_sub(1).map(|p| versions[p]);
                let one = |v: &quiver_sdk::FeatureView| Definitions { feature_views: vec![v.clone()], ..Definitions::default() };
                let changes = previous.map_or_else(Vec::new, |p| field_changes(&one(p), &one(view)));
                let summary = runtime.block_on(quiver_offline::historical::table_summary(&self.config, view))?;
                let keys_online = match &store {
                    Some(store) if view.online => {
                        runtime.block_on(store.keys_with_prefix(&view_prefix(&self.config.project, view), false)).ok()
                    }
                    _ => None,
                };
                let (created, registry_version) = created(&doc, "feature_view", name, view.version);
                out.push(VersionInfo {
                    version: view.version,
                    latest: i + 1 == versions.len(),
                    created,
                    registry_version,
                    changes,
                    table: Some(self.config.view_table(view).to_string()),
                    rows_offline: Some(summary.map_or(0, |s| s.rows)),
                    keys_online,
                    read_by: doc.readers(name, view.version),
                });
            }
            return Ok(out);
        }
        let versions = d.on_demand_versions(name);
        if versions.is_empty() {
            return Err(Error::NotFound(d.find_view(name).map(|_| ()).unwrap_err().0));
        }
        let one = |v: &quiver_sdk::OnDemandView| Definitions { on_demand_views: vec![v.clone()], ..Definitions::default() };
        Ok(versions
            .iter()
            .enumerate()
            .map(|(i, view)| {
                let (created, registry_version) = created(&doc, "on_demand_view", name, view.version);
                VersionInfo {
                    version: view.version,
                    latest: i + 1 == versions.len(),
                    created,
                    registry_version,
                    changes: i.checked_sub(1).map_or_else(Vec::new, |p| field_changes(&one(versions[p]), &one(view))),
                    table: None,
                    rows_offline: None,
                    keys_online: None,
                    read_by: doc.readers(name, view.version),
                }
            })
            .collect())
    }

    /// Retires `name` (`view@N`): removes its online keys and its registry entry, and
    /// with `delete_data` its Delta table (kept otherwise). Refused — nothing changed —
    /// for the latest version while older ones live, a view's only version, or a
    /// version a service or an on-demand view reads. `runtime` runs the store work;
    /// call from outside it.
    ///
    /// # Errors
    /// The refusals above, naming what reads it; an unknown version naming the live
    /// ones; a store that cannot be reached (the registry then keeps the version, and
    /// the retire can be run again).
    pub fn retire(&self, name: &str, delete_data: bool, now: DateTime<Utc>, runtime: &tokio::runtime::Handle) -> Result<RetireReport> {
        let mut report = RetireReport { name: name.to_string(), keys_removed: 0, table: None, table_deleted: false, registry_version: 0 };
        let store_error = |e: String, kind: ErrorKind| quiver_sdk::Error::Store(kind, e);
        let mut before_write = |r: &Retiring| -> quiver_sdk::Result<()> {
            let Some(view) = &r.view else { return Ok(()) };
            if view.online {
                let store = runtime.block_on(self.open_store()).map_err(|e| store_error(e.to_string(), e.kind()))?;
                let prefix = view_prefix(&self.config.project, view);
                report.keys_removed =
                    runtime.block_on(store.keys_with_prefix(&prefix, true)).map_err(|e| store_error(e.to_string(), e.kind()))?;
            }
            let location = self.config.view_table(view);
            report.table = Some(location.to_string());
            if delete_data {
                runtime.block_on(quiver_offline::delta::delete_table(&location)).map_err(|e| store_error(e.to_string(), e.kind()))?;
                report.table_deleted = true;
            }
            Ok(())
        };
        let (_, version) = registry::retire(&self.registry(), &self.config.project, name, now, &mut before_write)?;
        report.registry_version = version;
        Ok(report)
    }
}

/// `field: old -> new` for each field that differs from `old` to `new` (one view each),
/// the version itself left out.
fn field_changes(old: &Definitions, new: &Definitions) -> Vec<String> {
    let show = |v: &Option<serde_json::Value>| v.as_ref().map_or_else(|| "(absent)".to_string(), ToString::to_string);
    diff(old, new)
        .changes
        .into_iter()
        .flat_map(|c| match c.op {
            ChangeOp::Changed(fields) => fields,
            _ => Vec::new(),
        })
        .filter(|f| f.path != "version")
        .map(|f| format!("{}: {} -> {}", f.path, show(&f.old), show(&f.new)))
        .collect()
}

/// When `apply` made version `version` of `name`, and which registry version that was:
/// from the history's `+ kind name` (version 1) or `^ kind name: version N` line.
fn created(doc: &RegistryDoc, kind: &str, name: &str, version: u32) -> (Option<String>, Option<u64>) {
    let made = if version == 1 { format!("+ {kind} {name}") } else { format!("^ {kind} {name}: version {version} beside") };
    doc.history
        .iter()
        .rev()
        .find(|h| h.changes.iter().any(|c| c == &made || (version != 1 && c.starts_with(&made))))
        .map_or((None, None), |h| (Some(format_time(&h.applied_at)), Some(h.version)))
}
