//! Versions of views in the definitions (docs/versions.md): the earlier live versions
//! the registry keeps beside the latest, what a request reads at which version
//! ([`Definitions::pinned`]), and how a reference that was read is recorded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Definitions, FeatureRef, FeatureView, Found, NotFound, OnDemandView, split_version};

/// The version of every view that was never changed in a breaking way.
pub const FIRST_VERSION: u32 = 1;

pub(crate) fn first_version() -> u32 {
    FIRST_VERSION
}

pub(crate) fn is_first_version(v: &u32) -> bool {
    *v == FIRST_VERSION
}

/// The live versions of views before their latest ones, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlierVersions {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_views: Vec<FeatureView>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_demand_views: Vec<OnDemandView>,
}

impl EarlierVersions {
    pub fn is_empty(&self) -> bool {
        self.feature_views.is_empty() && self.on_demand_views.is_empty()
    }
}

impl Definitions {
    /// Every live version of the feature view `name`, oldest first (none: no such view).
    pub fn view_versions(&self, name: &str) -> Vec<&FeatureView> {
        let earlier = self.earlier_versions.feature_views.iter().filter(|v| v.name == name);
        let Some(latest) = self.feature_views.iter().find(|v| v.name == name) else { return Vec::new() };
        let mut all: Vec<&FeatureView> = earlier.chain(std::iter::once(latest)).collect();
        all.sort_by_key(|v| v.version);
        all
    }

    /// Every live version of every feature view: the latest ones, then the earlier.
    pub fn all_view_versions(&self) -> impl Iterator<Item = &FeatureView> {
        self.feature_views.iter().chain(&self.earlier_versions.feature_views)
    }

    /// These definitions with every live version of every feature view in
    /// `feature_views` (the latest first, then the earlier ones): for a reader that
    /// addresses views by position, such as the stream, which feeds every live version
    /// of a view that reads its topic. `feature_view(name)` still reads the latest.
    #[must_use]
    pub fn every_version_listed(&self) -> Definitions {
        let mut out = self.clone();
        out.feature_views.extend(self.earlier_versions.feature_views.iter().cloned());
        out
    }

    /// Every live version of the on-demand view `name`, oldest first.
    pub fn on_demand_versions(&self, name: &str) -> Vec<&OnDemandView> {
        let earlier = self.earlier_versions.on_demand_views.iter().filter(|v| v.name == name);
        let Some(latest) = self.on_demand_views.iter().find(|v| v.name == name) else { return Vec::new() };
        let mut all: Vec<&OnDemandView> = earlier.chain(std::iter::once(latest)).collect();
        all.sort_by_key(|v| v.version);
        all
    }

    /// For `view@N` of a view that exists but has no live version `N`: the one message
    /// naming the live ones (`None` for a live version, an unknown view, or no version).
    pub(crate) fn missing_version(&self, name: &str) -> Option<NotFound> {
        let (view, Some(n)) = split_version(name)? else { return None };
        if self.feature_view(name).is_some() || self.on_demand_view(name).is_some() {
            return None;
        }
        let live: Vec<String> = if self.feature_views.iter().any(|v| v.name == view) {
            self.view_versions(view).iter().map(|v| v.version.to_string()).collect()
        } else if self.on_demand_views.iter().any(|v| v.name == view) {
            self.on_demand_versions(view).iter().map(|v| v.version.to_string()).collect()
        } else {
            return None;
        };
        Some(NotFound(format!("view `{view}` has no version {n} (it never had one, or it was retired; live: {})", live.join(", "))))
    }

    /// The definitions a request for `refs` reads (docs/versions.md#references): each
    /// view a reference names at a version — directly, or as an input of an on-demand
    /// view asked for — put in place of its latest, so that everything below reads the
    /// view by its name. A request reads each view at one version. Borrowed when every
    /// view is read at its latest.
    ///
    /// # Errors
    /// [`VersionError::NotFound`] for a version that is not live (naming the live
    /// ones; an unknown view is left to what reads it); [`VersionError::Conflict`] for
    /// one view asked at two versions, naming both references.
    pub fn pinned(&self, refs: &[FeatureRef]) -> Result<std::borrow::Cow<'_, Definitions>, VersionError> {
        // (is on-demand, view) -> (version, who asked for it)
        let mut pins: BTreeMap<(bool, String), (u32, String)> = BTreeMap::new();
        let mut pending: Vec<(String, String)> = refs.iter().map(|r| (r.view_name(), format!("`{r}`"))).collect();
        let mut seen = 0;
        while let Some((name, asked)) = pending.pop() {
            seen += 1;
            if seen > 10_000 {
                break; // validation refuses cycles; never loop on a registry that has one
            }
            let Some((view, _)) = split_version(&name) else { continue };
            let (on_demand, version) = if let Some(o) = self.on_demand_view(&name) {
                let by = format!("on-demand view `{}`", o.versioned_name());
                pending.extend(o.inputs.iter().map(|input| (input.clone(), by.clone())));
                (true, o.version)
            } else if let Some(v) = self.feature_view(&name) {
                (false, v.version)
            } else if let Some(missing) = self.missing_version(&name) {
                return Err(VersionError::NotFound(missing));
            } else {
                // An unknown view: what reads it refuses it with the one message.
                continue;
            };
            match pins.get(&(on_demand, view.to_string())) {
                Some((other, first)) if *other != version => {
                    return Err(VersionError::Conflict(format!(
                        "view `{view}` is asked at version {other} ({first}) and at version {version} ({asked}): a request reads each view at one version"
                    )));
                }
                Some(_) => {}
                None => {
                    pins.insert((on_demand, view.to_string()), (version, asked));
                }
            }
        }
        let earlier = |on_demand: bool, view: &str, version: u32| {
            let latest = if on_demand { self.on_demand_view(view).map(|v| v.version) } else { self.feature_view(view).map(|v| v.version) };
            latest != Some(version)
        };
        let read = |o: &OnDemandView| pins.contains_key(&(true, o.name.clone()));
        let versioned_inputs = |d: &Definitions| d.on_demand_views.iter().any(|o| read(o) && o.inputs.iter().any(|i| i.contains('@')));
        if !pins.iter().any(|((o, v), (n, _))| earlier(*o, v, *n)) && !versioned_inputs(self) {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        let mut out = self.clone();
        for ((on_demand, view), (version, _)) in &pins {
            if !earlier(*on_demand, view, *version) {
                continue;
            }
            let name = format!("{view}@{version}");
            if *on_demand {
                let pinned = self.on_demand_view(&name).expect("found above").clone();
                let slot = out.on_demand_views.iter_mut().find(|v| v.name == *view).expect("the latest");
                out.earlier_versions.on_demand_views.push(std::mem::replace(slot, pinned));
                out.earlier_versions.on_demand_views.retain(|v| !(v.name == *view && v.version == *version));
            } else {
                let pinned = self.feature_view(&name).expect("found above").clone();
                let slot = out.feature_views.iter_mut().find(|v| v.name == *view).expect("the latest");
                out.earlier_versions.feature_views.push(std::mem::replace(slot, pinned));
                out.earlier_versions.feature_views.retain(|v| !(v.name == *view && v.version == *version));
            }
        }
        // Each input read is now its view's name: the version it pins is the one here.
        for o in &mut out.on_demand_views {
            if pins.contains_key(&(true, o.name.clone())) {
                for input in &mut o.inputs {
                    if let Some((name, Some(_))) = split_version(input) {
                        *input = name.to_string();
                    }
                }
            }
        }
        Ok(std::borrow::Cow::Owned(out))
    }

    /// The version of its view `r` reads: the one it names, else the view's latest (an
    /// on-demand view's or a feature view's); version 1 for a view these definitions
    /// lack.
    pub fn version_read(&self, r: &FeatureRef) -> u32 {
        r.version.unwrap_or_else(|| {
            self.on_demand_view(&r.view)
                .map(|o| o.version)
                .or_else(|| self.feature_view(&r.view).map(|v| v.version))
                .unwrap_or(FIRST_VERSION)
        })
    }

    /// `r` as a record of what was read (a training set's manifest): `view:feature`
    /// when it reads version 1 of its view (what every reference read before views had
    /// versions), `view@N:feature` for version `N` from 2. `r` itself when it names
    /// nothing.
    pub fn as_read(&self, r: &FeatureRef) -> FeatureRef {
        let version = match self.find(r) {
            Ok(Found::Stored(view, _)) => view.version,
            Ok(Found::OnDemand(view, _)) => view.version,
            Err(_) => return r.clone(),
        };
        FeatureRef { version: (version != FIRST_VERSION).then_some(version), ..r.clone() }
    }
}

/// Why [`Definitions::pinned`] cannot read a request's views.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// A version that is not live.
    #[error("{0}")]
    NotFound(NotFound),
    /// One view asked at two versions.
    #[error("{0}")]
    Conflict(String),
}
