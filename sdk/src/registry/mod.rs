//! The registry: one versioned JSON document holding the applied definitions, the one
//! source of truth read by every command and by the server.
//!
//! [`RegistryDoc::plan`] diffs new definitions against the applied ones, per field;
//! [`RegistryDoc::breaking_changes`] finds the changes that would break a view that
//! already holds data; [`apply`] puts it together and writes the next version through
//! [`FileRegistry`], atomically (temp file, fsync, rename, fsync of the folder).

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::definitions::{Definitions, FeatureView};
use crate::error::Result;

mod file;
mod layouts;
mod plan;
mod versions;

pub use file::{APPLY_LOCK_WAIT, ApplyOutcome, ApplyRequest, FileRegistry, apply, apply_with, format_time};
pub use layouts::{EarlierLayouts, Registered};
pub use plan::{Change, ChangeOp, FieldChange, Plan, diff};
pub use versions::{NewVersion, Retiring, retire};

/// The registry file format this version reads and writes.
pub const REGISTRY_FORMAT: u32 = 1;

/// The registry document as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegistryDoc {
    pub format: u32,
    pub project: String,
    /// 0 for a registry nothing was applied to; each effective `apply` adds one.
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<DateTime<Utc>>,
    pub definitions: Definitions,
    /// The layouts of online rows written under earlier definitions of the views.
    #[serde(default, skip_serializing_if = "EarlierLayouts::is_empty")]
    pub layouts: EarlierLayouts,
    /// Per object (`feature_view/driver_hourly`): its own version, bumped whenever the
    /// object changes, so a feature service's version names one list of features.
    #[serde(default)]
    pub objects: BTreeMap<String, ObjectMeta>,
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
}

/// Version, times and origin of one object in the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub version: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The front end that last added or changed it ([`Origin::name`]: `features.yaml`,
    /// `python`); `None` for objects recorded before origins were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// Where the definitions of an apply come from, and what it removes explicitly. A
/// front end removes what it defined itself and no longer defines; an object another
/// front end defined (or one recorded before origins were) is kept unless named in
/// `remove`, so no front end silently removes what another one defined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// `features.yaml` for `quiver apply`, `python` for the Python SDK.
    pub name: String,
    /// Objects to remove whoever defined them: `kind/name` or a name.
    pub remove: Vec<String>,
}

impl Origin {
    pub fn new(name: impl Into<String>) -> Origin {
        Origin { name: name.into(), remove: Vec::new() }
    }

    pub fn removing(mut self, remove: Vec<String>) -> Origin {
        self.remove = remove;
        self
    }
}

/// A registered object an apply leaves as it is, though its definitions lack it: it was
/// defined by another front end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub kind: ObjectKind,
    pub name: String,
    /// Where it was defined (`None`: before origins were recorded).
    pub origin: Option<String>,
}

/// One effective `apply`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub version: u64,
    pub applied_at: DateTime<Utc>,
    #[serde(default)]
    pub forced: bool,
    /// One line per changed object, as `plan` prints them.
    pub changes: Vec<String>,
}

/// The kinds of registry object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    Entity,
    FeatureView,
    FeatureService,
    OnDemandView,
}

impl ObjectKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            ObjectKind::Entity => "entity",
            ObjectKind::FeatureView => "feature_view",
            ObjectKind::FeatureService => "feature_service",
            ObjectKind::OnDemandView => "on_demand_view",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Answers whether a feature view already holds data, so that `apply` can refuse
/// changes that would break it. The offline store implements it.
pub trait DataProbe {
    /// # Errors
    /// When the store cannot be read; `apply` then stops rather than guess.
    fn holds_data(&self, view: &FeatureView) -> Result<bool>;
}

/// A change that would break a view holding data, or what a model trained on an
/// on-demand feature is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breaking {
    pub view: String,
    /// Of an on-demand view (which holds no data: its features are what its
    /// expressions compute).
    pub on_demand: bool,
    /// No new version can take it, only `--force`: the view's removal, or a change to
    /// an entity it reads (every version of the view reads its entities' keys).
    pub in_place: bool,
    pub reason: String,
}

impl fmt::Display for Breaking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.on_demand {
            write!(f, "on-demand view `{}`: {}", self.view, self.reason)
        } else {
            write!(f, "feature view `{}` holds data and {}", self.view, self.reason)
        }
    }
}

impl RegistryDoc {
    /// A registry nothing has been applied to yet.
    pub fn empty(project: impl Into<String>) -> Self {
        RegistryDoc {
            format: REGISTRY_FORMAT,
            project: project.into(),
            version: 0,
            updated_at: None,
            definitions: Definitions::default(),
            layouts: EarlierLayouts::default(),
            objects: BTreeMap::new(),
            history: Vec::new(),
        }
    }

    /// The applied definitions with the earlier layouts, as a lookup reads them.
    pub fn registered(self) -> Registered {
        Registered { definitions: self.definitions, layouts: self.layouts }
    }

    /// What applying `new` would change.
    pub fn plan(&self, new: &Definitions) -> Plan {
        diff(&self.definitions, new)
    }

    /// The definitions an apply of `new` from `origin` records, and its plan: `new`,
    /// plus each registered object `new` lacks that `origin` may not remove (defined
    /// by another front end, or before origins were recorded, and not named in
    /// `origin.remove`), listed in the plan as kept.
    ///
    /// # Errors
    /// [`Error::Definition`] for a name in `origin.remove` that is not registered, or
    /// that `new` defines.
    pub fn plan_from(&self, new: &Definitions, origin: &Origin) -> Result<(Definitions, Plan)> {
        let mut merged = new.clone();
        self.stamp(&mut merged);
        let mut kept = Vec::new();
        let named = |kind: ObjectKind, name: &str| origin.remove.iter().any(|r| *r == name || *r == format!("{kind}/{name}"));
        for r in &origin.remove {
            let (kind, name) = match r.split_once('/') {
                Some((k, n)) => (Some(k), n),
                None => (None, r.as_str()),
            };
            let is = |k: ObjectKind| kind.is_none_or(|want| want == k.as_str());
            let registered = (is(ObjectKind::Entity) && self.definitions.entity(name).is_some())
                || (is(ObjectKind::FeatureView) && self.definitions.feature_view(name).is_some())
                || (is(ObjectKind::FeatureService) && self.definitions.feature_service(name).is_some())
                || (is(ObjectKind::OnDemandView) && self.definitions.on_demand_view(name).is_some());
            let defined = (is(ObjectKind::Entity) && new.entity(name).is_some())
                || (is(ObjectKind::FeatureView) && new.feature_view(name).is_some())
                || (is(ObjectKind::FeatureService) && new.feature_service(name).is_some())
                || (is(ObjectKind::OnDemandView) && new.on_demand_view(name).is_some());
            let refuse = |reason: String| crate::error::DefinitionError::BadRemoval { name: r.clone(), reason };
            if !registered {
                return Err(refuse("the registry holds no such object".to_string()).into());
            }
            if defined {
                return Err(refuse(format!("{} defines it (take it out there to remove it)", origin.name)).into());
            }
        }
        // An object the new definitions lack stays unless this front end defined it
        // or it is named for removal.
        let mut keep = |kind: ObjectKind, name: &str| -> bool {
            let meta = self.objects.get(&format!("{kind}/{name}"));
            let from = meta.and_then(|m| m.origin.clone());
            if named(kind, name) || from.as_deref() == Some(origin.name.as_str()) {
                return false;
            }
            kept.push(Kept { kind, name: name.to_string(), origin: from });
            true
        };
        for e in &self.definitions.entities {
            if new.entity(&e.name).is_none() && keep(ObjectKind::Entity, &e.name) {
                merged.entities.push(e.clone());
            }
        }
        for v in &self.definitions.feature_views {
            if new.feature_view(&v.name).is_none() && keep(ObjectKind::FeatureView, &v.name) {
                merged.feature_views.push(v.clone());
            }
        }
        for s in &self.definitions.feature_services {
            if new.feature_service(&s.name).is_none() && keep(ObjectKind::FeatureService, &s.name) {
                merged.feature_services.push(s.clone());
            }
        }
        for v in &self.definitions.on_demand_views {
            if new.on_demand_view(&v.name).is_none() && keep(ObjectKind::OnDemandView, &v.name) {
                merged.on_demand_views.push(v.clone());
            }
        }
        // A view removed takes its earlier versions with it.
        let views: Vec<String> = merged.feature_views.iter().map(|v| v.name.clone()).collect();
        let demands: Vec<String> = merged.on_demand_views.iter().map(|v| v.name.clone()).collect();
        merged.earlier_versions.feature_views.retain(|v| views.contains(&v.name));
        merged.earlier_versions.on_demand_views.retain(|v| demands.contains(&v.name));
        let mut plan = diff(&self.definitions, &merged);
        plan.kept = kept;
        Ok((merged, plan))
    }

    /// The changes in `new` that would break a view that holds data: a removed view, a
    /// changed key (entity list or join key type), a removed feature, a changed feature
    /// type or write-time expression, a changed source filter or raw column type, a
    /// changed timestamp column or table path. Adding features breaks nothing.
    ///
    /// # Errors
    /// When the probe cannot tell whether a view holds data.
    pub fn breaking_changes(&self, new: &Definitions, probe: &dyn DataProbe) -> Result<Vec<Breaking>> {
        let old = &self.definitions;
        let mut out = Vec::new();
        for view in &old.feature_views {
            let next = new.feature_view(&view.name);
            if next == Some(view) && old.join_keys(view) == new.join_keys(view) {
                continue;
            }
            if !probe.holds_data(view)? {
                continue;
            }
            let mut reasons: Vec<(bool, String)> = Vec::new();
            let mut add = |reason: String| reasons.push((false, reason));
            let Some(next) = next else {
                out.push(Breaking { view: view.name.clone(), on_demand: false, in_place: true, reason: "would be removed".to_string() });
                continue;
            };
            let keys = |d: &Definitions, v: &FeatureView| {
                d.join_keys(v).iter().map(|k| format!("{}:{}", k.name, k.dtype)).collect::<Vec<_>>().join(", ")
            };
            let (old_keys, new_keys) = (keys(old, view), keys(new, next));
            let mut shared_keys = None;
            if old_keys != new_keys && view.entities == next.entities {
                // The same entities with other keys: every version of every view
                // reading them would read its keys anew.
                shared_keys = Some(format!(
                    "its join keys would change from [{old_keys}] to [{new_keys}] (an entity's keys are shared by every version of every view reading it: define a new entity for the new keys, or --force)"
                ));
            } else if old_keys != new_keys {
                add(format!("its join keys would change from [{old_keys}] to [{new_keys}]"));
            }
            for feature in &view.features {
                match next.feature(&feature.name) {
                    None => add(format!("feature `{}` would be removed", feature.name)),
                    Some(f) if f.dtype != feature.dtype => {
                        add(format!("feature `{}` would change type from {} to {}", feature.name, feature.dtype, f.dtype))
                    }
                    // The rows stored hold what the old expression computed.
                    Some(f) if f.expr != feature.expr => add(format!(
                        "feature `{}` would change its expression from `{}` to `{}` (the rows stored hold the old one's values; give the new expression a new name, or --force)",
                        feature.name, feature.expr, f.expr
                    )),
                    Some(_) => {}
                }
            }
            let (a, b) = (&view.source, &next.source);
            // A raw column's type is part of what an unchanged expression computes.
            for raw in &a.raw {
                if let Some(r) = b.raw.iter().find(|r| r.name == raw.name && r.dtype != raw.dtype) {
                    add(format!(
                        "raw column `{}` would change type from {} to {} (what the expressions reading it compute may change; --force to keep the rows stored)",
                        raw.name, raw.dtype, r.dtype
                    ));
                }
            }
            if a.filter != b.filter {
                let text = |f: &Option<String>| f.as_ref().map_or_else(|| "none".to_string(), |f| format!("`{f}`"));
                add(format!(
                    "its source filter would change from {} to {} (the rows stored were chosen by the old one; --force to keep them)",
                    text(&a.filter),
                    text(&b.filter)
                ));
            }
            if a.timestamp_field != b.timestamp_field {
                add(format!("its timestamp field would change from `{}` to `{}`", a.timestamp_field, b.timestamp_field));
            }
            if a.created_timestamp_field != b.created_timestamp_field {
                add(format!(
                    "its created timestamp field would change from {:?} to {:?}",
                    a.created_timestamp_field, b.created_timestamp_field
                ));
            }
            if a.path != b.path {
                add(format!("its table path would change from {:?} to {:?}", a.path, b.path));
            }
            reasons.extend(shared_keys.map(|reason| (true, reason)));
            let breaking =
                reasons.into_iter().map(|(in_place, reason)| Breaking { view: view.name.clone(), on_demand: false, in_place, reason });
            out.extend(breaking);
        }
        // An on-demand feature whose expression or type changes is another feature
        // under the same name: a model trained on it would be served something else.
        for view in &old.on_demand_views {
            let Some(next) = new.on_demand_view(&view.name) else { continue };
            for feature in &view.features {
                let Some(f) = next.feature(&feature.name) else { continue };
                let mut add = |reason: String| out.push(Breaking { view: view.name.clone(), on_demand: true, in_place: false, reason });
                if f.expr != feature.expr {
                    add(format!(
                        "feature `{}` would change its expression from `{}` to `{}` (give the new expression a new name, or --force)",
                        feature.name, feature.expr, f.expr
                    ));
                } else if f.dtype != feature.dtype {
                    add(format!(
                        "feature `{}` would change type from {} to {} (give it a new name, or --force)",
                        feature.name, feature.dtype, f.dtype
                    ));
                }
            }
        }
        Ok(out)
    }

    /// The next version of this document with `new` applied as `plan` describes.
    pub fn applied(&self, new: &Definitions, plan: &Plan, now: DateTime<Utc>, forced: bool) -> Self {
        self.applied_from(new, plan, now, forced, None)
    }

    /// [`RegistryDoc::applied`], recording `origin` on every object added or changed.
    pub fn applied_from(&self, new: &Definitions, plan: &Plan, now: DateTime<Utc>, forced: bool, origin: Option<&str>) -> Self {
        let origin = origin.map(str::to_string);
        let mut next = self.clone();
        next.version += 1;
        next.updated_at = Some(now);
        next.definitions = new.clone();
        // Online rows written under the views' current features stay readable by name.
        next.layouts.keep(&self.definitions, new);
        for change in &plan.changes {
            let key = change.key();
            match change.op {
                ChangeOp::Added => {
                    // A re-added object keeps counting from its last version.
                    let version = self.objects.get(&key).map_or(1, |m| m.version + 1);
                    next.objects.insert(key, ObjectMeta { version, created_at: now, updated_at: now, origin: origin.clone() });
                }
                ChangeOp::Changed(_) => {
                    let meta = next.objects.entry(key).or_insert(ObjectMeta { version: 0, created_at: now, updated_at: now, origin: None });
                    meta.version += 1;
                    meta.updated_at = now;
                    if origin.is_some() {
                        meta.origin.clone_from(&origin);
                    }
                }
                // Removed objects keep their meta so a re-added one continues the count;
                // `definitions` alone says what exists.
                ChangeOp::Removed => {}
            }
        }
        next.history.push(HistoryEntry {
            version: next.version,
            applied_at: now,
            forced,
            changes: plan.changes.iter().map(Change::summary).chain(plan.versions.iter().map(|v| format!("^ {v}"))).collect(),
        });
        next
    }
}
