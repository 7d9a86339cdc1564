//! Where profiles come from: a training set's manifest, a view's Delta rows by event
//! time (partitions profiled on every core, then merged), the serving log by request
//! time (each logged value as the server wrote it; NaN and the infinities as the strings
//! `"NaN"`, `"Infinity"`, `"-Infinity"`, read back as floats).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::monitor::profile::{Binning, Profile, ProfileDoc};
use futures::StreamExt;
use quiver_sdk::types::format_instant;
use quiver_sdk::{DType, Definitions, FeatureRef};

use super::{Profiles, Window};
use crate::error::{Error, Result};
use crate::export::Manifest;
use crate::repo::Repo;

/// The profiles of `features` over `window`, keyed by `view:feature`.
///
/// # Errors
/// [`Error::Invalid`] for a window holding none of a view's rows, a training set
/// without a profile or without a feature, a feature an offline window cannot profile;
/// the stores' errors.
pub async fn profiles(repo: &Repo, defs: &Definitions, window: &Window, features: &[FeatureRef]) -> Result<Profiles> {
    profiles_counting(repo, defs, window, features, &BTreeMap::new()).await
}

/// As [`profiles`], each feature's values also counted exactly into the bins `bins`
/// gives it by `view:feature` ([`Profile::counting`]): of an offline or a serving
/// window. A training set's profile is its manifest's, whose values are not at hand:
/// it counts none.
///
/// # Errors
/// As [`profiles`].
pub async fn profiles_counting(
    repo: &Repo,
    defs: &Definitions,
    window: &Window,
    features: &[FeatureRef],
    bins: &BTreeMap<String, Arc<Binning>>,
) -> Result<Profiles> {
    let empty = |f: &FeatureRef| bins.get(&f.to_string()).map_or_else(Profile::default, |b| Profile::counting(b.clone()));
    match window {
        Window::Training(dir) => training(dir, features),
        Window::Offline { since, until } => offline(repo, defs, features, *since, *until, &empty).await,
        Window::Serving { since, until } => serving(repo, defs, features, *since, *until, &empty).await,
    }
}

/// The profile `export` wrote into `dir`'s manifest.
fn training(dir: &Path, features: &[FeatureRef]) -> Result<Profiles> {
    let (path, manifest) = read_manifest(dir)?;
    if manifest.profile.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: the manifest has no profile (exported before export wrote profiles); export the training set again",
            path.display()
        )));
    }
    let mut out = Profiles::new();
    for f in features {
        // The manifest names what it read as read: `view:feature` for version 1.
        let first = f.version == Some(quiver_sdk::definitions::FIRST_VERSION);
        let name = if first { FeatureRef { version: None, ..f.clone() }.to_string() } else { f.to_string() };
        let doc: &ProfileDoc = manifest.profile.get(&name).ok_or_else(|| {
            Error::Invalid(format!(
                "the training set in {} has no feature `{name}` (it holds: {})",
                dir.display(),
                manifest.profile.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let profile = Profile::try_from(doc).map_err(|e| Error::Invalid(format!("{}: feature `{name}`: {e}", path.display())))?;
        out.insert(f.to_string(), profile);
    }
    Ok(out)
}

/// `dir`'s `manifest.json` (its path, for messages), read as a training set's.
///
/// # Errors
/// When it cannot be read, or is not a manifest.
pub(super) fn read_manifest(dir: &Path) -> Result<(std::path::PathBuf, Manifest)> {
    let path = dir.join("manifest.json");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let manifest =
        serde_json::from_slice(&bytes).map_err(|e| Error::Invalid(format!("{}: not a training set's manifest: {e}", path.display())))?;
    Ok((path, manifest))
}

/// The profiles of stored features over views' Delta rows with event times in the window,
/// each begun as `empty` makes it.
async fn offline(
    repo: &Repo,
    defs: &Definitions,
    features: &[FeatureRef],
    since: i64,
    until: i64,
    empty: &(dyn Fn(&FeatureRef) -> Profile + Sync),
) -> Result<Profiles> {
    let window = || format!("offline:{}..{}", format_instant(since), format_instant(until));
    // Keyed by the version read (`view@N` for a pinned reference: its own table).
    let mut by_view: BTreeMap<String, Vec<(&FeatureRef, DType)>> = BTreeMap::new();
    for f in features {
        let Some(view) = defs.feature_view(&f.view_name()) else {
            return Err(Error::Invalid(format!(
                "{}: `{f}` is an on-demand feature, computed at request time and stored nowhere; compare it over a training set or a serving window",
                window()
            )));
        };
        let Some(stored) = view.features.iter().find(|s| s.name == f.feature).filter(|_| view.aggregations.is_empty()) else {
            return Err(Error::Invalid(format!(
                "{}: `{f}` is an aggregation of an event log, answered at a time and stored nowhere; compare it over a training set or a serving window",
                window()
            )));
        };
        by_view.entry(f.view_name()).or_default().push((f, stored.dtype));
    }
    let mut out = Profiles::new();
    for (name, wanted) in by_view {
        let view = defs.feature_view(&name).expect("found above");
        let names: Vec<&str> = wanted.iter().map(|(f, _)| f.feature.as_str()).collect();
        let dtypes: Vec<DType> = wanted.iter().map(|(_, t)| *t).collect();
        let empties: Vec<Profile> = wanted.iter().map(|&(f, _)| empty(f)).collect();
        let Some((streams, columns)) = quiver_offline::historical::window_streams(&repo.config, view, &names, since, until).await? else {
            return Err(Error::Invalid(format!(
                "{}: feature view `{name}` has no Delta table yet (ingest or stream into it first)",
                window()
            )));
        };
        let table = repo.config.view_table(view).to_string();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|mut stream| {
                let (columns, dtypes, table, mut profiles) = (columns.clone(), dtypes.clone(), table.clone(), empties.clone());
                tokio::spawn(async move {
                    while let Some(batch) = stream.next().await {
                        let batch = batch.map_err(|e| quiver_offline::Error::query(&table, e))?;
                        for ((column, dtype), profile) in columns.iter().zip(&dtypes).zip(&mut profiles) {
                            match column {
                                Some(c) => {
                                    // As written (a reader may hand strings over as views).
                                    let want = quiver_offline::schema::arrow_type(*dtype);
                                    let column = batch.column(*c);
                                    if column.data_type() == &want {
                                        profile.add_array(column.as_ref(), *dtype);
                                    } else {
                                        let cast = arrow::compute::cast(column, &want).map_err(quiver_offline::Error::from)?;
                                        profile.add_array(cast.as_ref(), *dtype);
                                    }
                                }
                                // A feature added after these rows were written: null in them.
                                None => {
                                    profile.count += batch.num_rows() as u64;
                                    profile.nulls += batch.num_rows() as u64;
                                }
                            }
                        }
                    }
                    Ok::<_, quiver_offline::Error>(profiles)
                })
            })
            .collect();
        let mut merged = empties;
        for task in tasks {
            let profiles = task.await.map_err(|e| Error::Invalid(format!("profiling feature view `{name}`: {e}")))??;
            for (m, p) in merged.iter_mut().zip(&profiles) {
                m.merge(p);
            }
        }
        if merged.first().is_none_or(|p| p.count == 0) {
            return Err(Error::Invalid(format!("{}: no rows of feature view `{name}` have event times in the window", window())));
        }
        for ((f, _), p) in wanted.iter().zip(merged) {
            out.insert(f.to_string(), p);
        }
    }
    Ok(out)
}

/// A feature of a serving window: its name, type and profile so far.
/// A feature asked for: its name in the log's rows, type, profile, and the reference as
/// asked (the profile's key).
type Slot<'a> = (&'a str, DType, Profile, String);

/// The profiles of what was served with request times in the window, from the serving
/// log: every logged lookup of a feature counts, `NOT_FOUND` and `OUTSIDE_MAX_AGE`
/// (served as null) among the nulls and in their own shares.
async fn serving(
    repo: &Repo,
    defs: &Definitions,
    features: &[FeatureRef],
    since: i64,
    until: i64,
    empty: &(dyn Fn(&FeatureRef) -> Profile + Sync),
) -> Result<Profiles> {
    let window = || format!("serving:{}..{}", format_instant(since), format_instant(until));
    // Per view asked for: whether the window logged it, and its features' profiles.
    let mut views: Vec<(String, bool, Vec<Slot<'_>>)> = Vec::new();
    for f in features {
        let dtype = defs.feature_dtype(f).ok_or_else(|| Error::NotFound(format!("unknown feature `{f}`")))?;
        let logged = crate::serving_log::logged_view(defs, f);
        let at = match views.iter().position(|v| v.0 == logged) {
            Some(at) => at,
            None => {
                views.push((logged, false, Vec::new()));
                views.len() - 1
            }
        };
        views[at].2.push((f.feature.as_str(), dtype, empty(f), f.to_string()));
    }
    let location = &repo.config.serving_log.location;
    let batches = crate::serving_log::read(location, quiver_sdk::Timestamp(since)..quiver_sdk::Timestamp(until)).await?;
    for batch in &batches {
        for r in 0..batch.num_rows() {
            let Some((view, seen, profiles)) = views.iter_mut().find(|v| v.0 == batch.view(r)) else {
                continue;
            };
            *seen = true;
            let bad = |what: &str, e: String| {
                Error::Invalid(format!("serving log {location}, request {}: {what} of view `{view}`: {e}", batch.request_id(r)))
            };
            let values: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(batch.values(r)).map_err(|e| bad("values", e.to_string()))?;
            let statuses: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(batch.statuses(r)).map_err(|e| bad("statuses", e.to_string()))?;
            for (feature, dtype, profile, _) in profiles.iter_mut() {
                // A request that did not ask for this feature.
                let Some(value) = values.get(*feature) else {
                    continue;
                };
                profile.add_json(value, *dtype).map_err(|e| bad(&format!("feature `{feature}`"), e))?;
                match statuses.get(*feature).and_then(serde_json::Value::as_str) {
                    Some("NOT_FOUND") => profile.not_found += 1,
                    Some("OUTSIDE_MAX_AGE") => profile.outside_max_age += 1,
                    _ => {}
                }
            }
        }
    }
    let mut out = Profiles::new();
    for (view, seen, profiles) in views {
        if !seen {
            return Err(Error::Invalid(format!(
                "{}: nothing logged for view `{view}` (is `serving_log: {{enabled: true}}` set in quiver.yaml, and has the server answered for it in the window?)",
                window()
            )));
        }
        for (feature, _, profile, asked) in profiles {
            if profile.count == 0 {
                return Err(Error::Invalid(format!("{}: no request in the window asked for `{view}:{feature}`", window())));
            }
            out.insert(asked, profile);
        }
    }
    Ok(out)
}
