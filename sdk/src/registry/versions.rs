//! Versions of views in an apply (docs/versions.md): the version each definition gets,
//! a breaking change made into the next version beside the previous one, and the pins
//! that keep registered services and on-demand views on the version they read.

use std::collections::BTreeMap;
use std::fmt;

use super::{Breaking, DataProbe, Origin, Plan, RegistryDoc, diff};
use crate::definitions::{Definitions, FIRST_VERSION, FeatureView, split_version, versioned_name};
use crate::error::Result;

/// A view an apply gives a new version, beside its previous one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVersion {
    /// Of an on-demand view.
    pub on_demand: bool,
    pub view: String,
    /// The new version; the previous one is `version - 1`'s predecessor still live.
    pub version: u32,
    pub previous: u32,
    /// The breaking changes that make it a new version.
    pub reasons: Vec<String>,
    /// What stays on the previous version: `feature_service s`, `on_demand_view o`.
    pub pinned: Vec<String>,
}

impl fmt::Display for NewVersion {
    /// `feature_view v: version 2 beside version 1 (reason; reason)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.on_demand { "on_demand_view" } else { "feature_view" };
        write!(f, "{kind} {}: version {} beside version {} ({})", self.view, self.version, self.previous, self.reasons.join("; "))?;
        if !self.pinned.is_empty() {
            write!(f, "; stays on version {}: {}", self.previous, self.pinned.join(", "))?;
        }
        Ok(())
    }
}

impl RegistryDoc {
    /// What an apply of `new` from `origin` records and its plan, with each breaking
    /// change made into a new version (unless `force`, which replaces in place), and
    /// the breaking changes no version can take (a removed view holding data), which
    /// an apply refuses unless `force`.
    ///
    /// # Errors
    /// As [`RegistryDoc::plan_from`] and [`RegistryDoc::breaking_changes`].
    pub fn plan_versions(
        &self,
        new: &Definitions,
        origin: &Origin,
        probe: &dyn DataProbe,
        force: bool,
    ) -> Result<(Definitions, Plan, Vec<Breaking>)> {
        let (mut merged, mut plan) = self.plan_from(new, origin)?;
        if plan.is_empty() {
            return Ok((merged, plan, Vec::new()));
        }
        let breaking = self.breaking_changes(&merged, probe)?;
        if force {
            return Ok((merged, plan, breaking));
        }
        let (versions, refused) = self.versioned(&mut merged, breaking);
        if !versions.is_empty() {
            let kept = std::mem::take(&mut plan.kept);
            plan = diff(&self.definitions, &merged);
            plan.kept = kept;
            plan.versions = versions;
        }
        Ok((merged, plan, refused))
    }

    /// `new` as the registry reads it: each view at its registered latest version, the
    /// registry's earlier versions of the views it defines, and each reference a
    /// registered service or on-demand view pins kept pinned (an unpinned reference
    /// in the definitions does not move it: docs/versions.md#services).
    pub(super) fn stamp(&self, new: &mut Definitions) {
        let old = &self.definitions;
        for v in &mut new.feature_views {
            v.version = old.feature_views.iter().find(|o| o.name == v.name).map_or(FIRST_VERSION, |o| o.version);
        }
        for v in &mut new.on_demand_views {
            v.version = old.on_demand_views.iter().find(|o| o.name == v.name).map_or(FIRST_VERSION, |o| o.version);
        }
        new.earlier_versions = old.earlier_versions.clone();
        for s in &mut new.feature_services {
            let Some(was) = old.feature_service(&s.name) else { continue };
            for r in s.features.iter_mut().filter(|r| r.version.is_none()) {
                if let Some(p) = was.features.iter().find(|p| p.view == r.view && p.feature == r.feature) {
                    r.version = p.version;
                }
            }
        }
        for o in &mut new.on_demand_views {
            let Some(was) = old.on_demand_views.iter().find(|w| w.name == o.name) else { continue };
            for input in o.inputs.iter_mut().filter(|i| !i.contains('@')) {
                let pinned = was.inputs.iter().find(|p| split_version(p).is_some_and(|(n, v)| n == input.as_str() && v.is_some()));
                if let Some(p) = pinned {
                    input.clone_from(p);
                }
            }
        }
    }

    /// Makes the breaking changes to each view into its next version: the new
    /// definition becomes version N+1, the registered one stays as version N beside
    /// it, and every registered service and on-demand view that read the view
    /// unpinned is pinned to N. Returns the new versions and the breaking changes no
    /// version takes ([`Breaking::in_place`]).
    fn versioned(&self, merged: &mut Definitions, breaking: Vec<Breaking>) -> (Vec<NewVersion>, Vec<Breaking>) {
        let mut refused = Vec::new();
        let mut by_view: BTreeMap<(bool, String), Vec<String>> = BTreeMap::new();
        for b in breaking {
            if b.in_place {
                refused.push(b);
            } else {
                by_view.entry((b.on_demand, b.view.clone())).or_default().push(b.reason);
            }
        }
        let old = &self.definitions;
        // First every new version, so that the pins below know which on-demand views
        // are new definitions (they read the latest) and which are what was applied.
        let mut out = Vec::new();
        for ((on_demand, view), reasons) in by_view {
            let previous = if on_demand {
                let Some(was) = old.on_demand_views.iter().find(|v| v.name == view) else { continue };
                let Some(slot) = merged.on_demand_views.iter_mut().find(|v| v.name == view) else { continue };
                slot.version = was.version + 1;
                merged.earlier_versions.on_demand_views.push(was.clone());
                was.version
            } else {
                let Some(was) = old.feature_views.iter().find(|v| v.name == view) else { continue };
                let Some(slot) = merged.feature_views.iter_mut().find(|v| v.name == view) else { continue };
                slot.version = was.version + 1;
                merged.earlier_versions.feature_views.push(was.clone());
                was.version
            };
            out.push(NewVersion { on_demand, view, version: previous + 1, previous, reasons, pinned: Vec::new() });
        }
        let renewed: Vec<String> = out.iter().filter(|v| v.on_demand).map(|v| v.view.clone()).collect();
        for made in &mut out {
            let (view, previous) = (made.view.as_str(), made.previous);
            // A service's reference it was applied with stays on what it read; one
            // added now reads the latest.
            for s in &mut merged.feature_services {
                let Some(was) = old.feature_service(&s.name) else { continue };
                let mut any = false;
                for r in s.features.iter_mut().filter(|r| r.view == view && r.version.is_none()) {
                    if was.features.iter().any(|w| w.view == r.view && w.feature == r.feature) {
                        r.version = Some(previous);
                        any = true;
                    }
                }
                if any {
                    made.pinned.push(format!("feature_service {}", s.name));
                }
            }
            // An on-demand view as applied (not one this apply gives a new version),
            // and every earlier version of one, stays on what it read.
            let applied = merged
                .on_demand_views
                .iter_mut()
                .filter(|o| old.on_demand_views.iter().any(|w| w.name == o.name) && !renewed.contains(&o.name));
            for o in applied.chain(merged.earlier_versions.on_demand_views.iter_mut()) {
                let mut any = false;
                for input in o.inputs.iter_mut().filter(|i| *i == view) {
                    *input = versioned_name(view, Some(previous));
                    any = true;
                }
                if any {
                    made.pinned.push(format!("on_demand_view {}", o.versioned_name()));
                }
            }
        }
        (out, refused)
    }
}

/// A version `quiver retire` takes out of the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retiring {
    /// The feature view version (whose online keys and table go); `None` for an
    /// on-demand view, which stores nothing.
    pub view: Option<FeatureView>,
    pub name: String,
    pub version: u32,
}

impl RegistryDoc {
    /// Who reads version `version` of view `name`: `feature_service s` for a service
    /// reference pinned to it (or unpinned, of the latest), `on_demand_view o@N` for an
    /// on-demand view (of any live version) whose input is pinned to it (or unpinned).
    pub fn readers(&self, name: &str, version: u32) -> Vec<String> {
        let d = &self.definitions;
        let latest = d.feature_view(name).map(|v| v.version).or_else(|| d.on_demand_view(name).map(|v| v.version));
        let reads = |v: Option<u32>| v.or(latest) == Some(version);
        let mut out = Vec::new();
        for s in &d.feature_services {
            if s.features.iter().any(|r| r.view == name && reads(r.version)) {
                out.push(format!("feature_service {}", s.name));
            }
        }
        for o in d.on_demand_views.iter().chain(&d.earlier_versions.on_demand_views) {
            let pinned = o.inputs.iter().filter_map(|i| split_version(i)).any(|(n, v)| n == name && reads(v));
            if pinned && o.name != name {
                out.push(format!("on_demand_view {}", o.versioned_name()));
            }
        }
        out
    }

    /// This document with `name` (`view@N`) retired — the version gone from the
    /// definitions, the next registry version recording it — and what it was.
    ///
    /// # Errors
    /// [`Error::Version`]: a malformed or unknown version (naming the live ones), the
    /// latest version while older ones live, a view's only version, or a version a
    /// service or an on-demand view reads (naming them).
    pub fn retired(&self, name: &str, now: chrono::DateTime<chrono::Utc>) -> Result<(RegistryDoc, Retiring)> {
        use crate::error::{Error, ErrorKind};
        let refuse = |kind: ErrorKind, message: String| Error::Version(kind, message);
        let Some((view, Some(version))) = split_version(name) else {
            return Err(refuse(ErrorKind::Invalid, format!("cannot retire `{name}`: name a version, `view@N` (N from 1)")));
        };
        let d = &self.definitions;
        let live: Vec<u32> = match (d.feature_view(view), d.on_demand_view(view)) {
            (Some(_), _) => d.view_versions(view).iter().map(|v| v.version).collect(),
            (None, Some(_)) => d.on_demand_versions(view).iter().map(|v| v.version).collect(),
            (None, None) => return Err(refuse(ErrorKind::NotFound, d.find_view(view).map(|_| ()).unwrap_err().0)),
        };
        let listed = live.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        if !live.contains(&version) {
            return Err(refuse(
                ErrorKind::NotFound,
                format!("view `{view}` has no version {version} (it never had one, or it was retired; live: {listed})"),
            ));
        }
        let latest = *live.last().expect("a live version");
        if version == latest {
            let why = if live.len() == 1 {
                "it is the view's only version (remove the view from its definitions instead)".to_string()
            } else {
                format!("it is the latest while older ones live (live: {listed}); retire those first")
            };
            return Err(refuse(ErrorKind::Invalid, format!("cannot retire `{name}`: {why}")));
        }
        let readers = self.readers(view, version);
        if !readers.is_empty() {
            return Err(refuse(
                ErrorKind::Conflict,
                format!("cannot retire `{name}`: read by {} (move them to another version first)", readers.join(", ")),
            ));
        }
        let mut next = self.clone();
        next.version += 1;
        next.updated_at = Some(now);
        let earlier = &mut next.definitions.earlier_versions;
        let retired_view = earlier.feature_views.iter().find(|v| v.name == view && v.version == version).cloned();
        earlier.feature_views.retain(|v| !(v.name == view && v.version == version));
        earlier.on_demand_views.retain(|v| !(v.name == view && v.version == version));
        let kind = if retired_view.is_some() { "feature_view" } else { "on_demand_view" };
        next.history.push(super::HistoryEntry {
            version: next.version,
            applied_at: now,
            forced: false,
            changes: vec![format!("- {kind} {name} (retired)")],
        });
        Ok((next, Retiring { view: retired_view, name: name.to_string(), version }))
    }
}

/// Retires `name` (`view@N`) in the registry under the apply lock, calling
/// `before_write` (which removes the version's online keys, and its table if asked)
/// after every check passed and before the registry is written: a refused retire
/// changes nothing, and one whose `before_write` failed can be run again.
///
/// # Errors
/// As [`RegistryDoc::retired`], the registry's load and save, and `before_write`'s.
pub fn retire(
    registry: &super::FileRegistry,
    project: &str,
    name: &str,
    now: chrono::DateTime<chrono::Utc>,
    before_write: &mut dyn FnMut(&Retiring) -> Result<()>,
) -> Result<(Retiring, u64)> {
    let _lock = registry.lock(super::APPLY_LOCK_WAIT)?;
    let doc = registry.load_or_empty(project)?;
    let (next, retiring) = doc.retired(name, now)?;
    before_write(&retiring)?;
    registry.save(&next)?;
    Ok((retiring, next.version))
}

#[cfg(test)]
mod tests;
