//! What a training set read of the definitions, recorded in its manifest so that
//! `--reproduce` refuses a change to one of them, naming it, and nothing else
//! (docs/export.md#reproducing-a-training-set).

use std::collections::{BTreeMap, BTreeSet};

use quiver_offline::historical::Resolved;
use quiver_sdk::definitions::Found;
use quiver_sdk::{Definitions, FeatureService, FeatureView};
use serde::Serialize;
use serde_json::Value as Json;

use super::sha256_hex;

/// Fields that change no row of a training set: left out of a definition's digest.
const COSMETIC: [&str; 5] = ["description", "tags", "monitoring", "online", "owner"];

/// The definitions a training set reads, each as the SHA-256 of its JSON less what
/// changes no row ([`COSMETIC`]), by `kind:name` (`feature_view:driver_hourly`): the
/// service, every view joined (of a plain view only the features read), the entities of
/// their keys, every on-demand view computed and those it reads, and the `--rows-of`
/// view of a made spine.
pub(super) fn definitions_read(
    defs: &Definitions,
    service: &FeatureService,
    requests: &Resolved<'_>,
    rows_of: Option<&FeatureView>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    // The references as read: a service pinned to version 1 reads what it read unpinned.
    let as_read = FeatureService { features: service.features.iter().map(|r| defs.as_read(r)).collect(), ..service.clone() };
    out.insert(format!("feature_service:{}", service.name), digest(&as_read, None));
    let mut views: BTreeMap<&str, (&FeatureView, BTreeSet<&str>)> = BTreeMap::new();
    for r in requests.iter() {
        views.entry(r.view.name.as_str()).or_insert_with(|| (r.view, BTreeSet::new())).1.extend(r.features.iter().copied());
    }
    if let Some(view) = rows_of {
        views.entry(view.name.as_str()).or_insert_with(|| (view, BTreeSet::new()));
    }
    for (name, (view, read)) in &views {
        // An event log's aggregations read its event columns: all of them count.
        let read = (!view.is_event_log()).then_some(read);
        out.insert(format!("feature_view:{name}"), digest(view, read));
        for entity in &view.entities {
            if let Some(e) = defs.entity(entity) {
                out.insert(format!("entity:{entity}"), digest(e, None));
            }
        }
    }
    // On-demand views computed, and the on-demand views they read, transitively.
    let mut due: Vec<&str> = service
        .features
        .iter()
        .filter_map(|r| match defs.find(r) {
            Ok(Found::OnDemand(view, _)) => Some(view.name.as_str()),
            _ => None,
        })
        .collect();
    while let Some(name) = due.pop() {
        let key = format!("on_demand_view:{name}");
        if out.contains_key(&key) {
            continue;
        }
        if let Some(view) = defs.on_demand_view(name) {
            out.insert(key, digest(view, None));
            due.extend(view.inputs.iter().filter(|i| defs.on_demand_view(i).is_some()).map(String::as_str));
        }
    }
    out
}

/// The SHA-256 of `object`'s JSON less [`COSMETIC`] fields; with `read`, only those
/// features and aggregations of it.
fn digest(object: &impl Serialize, read: Option<&BTreeSet<&str>>) -> String {
    let mut json = serde_json::to_value(object).expect("definitions serialise");
    if let Json::Object(fields) = &mut json {
        for name in COSMETIC {
            fields.remove(name);
        }
        if let Some(read) = read {
            for list in ["features", "aggregations"] {
                if let Some(Json::Array(items)) = fields.get_mut(list) {
                    items.retain(|item| item.get("name").and_then(Json::as_str).is_some_and(|n| read.contains(n)));
                }
            }
        }
    }
    // serde_json's maps are sorted: the text is canonical.
    sha256_hex(json.to_string().as_bytes())
}

/// `feature_view:driver_hourly` as a reader says it: feature view `driver_hourly`.
pub(super) fn describe(key: &str) -> String {
    let (kind, name) = key.split_once(':').unwrap_or(("definition", key));
    format!("{} `{name}`", kind.replace('_', " ").replace("on demand", "on-demand"))
}

/// What changed between the definitions an export read and today's: each one changed
/// or gone, described.
pub(super) fn changed(then: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    then.iter()
        .filter(|(key, digest)| now.get(*key) != Some(digest))
        .map(|(key, _)| {
            let gone = !now.contains_key(key);
            format!("{}{}", describe(key), if gone { " (no longer read, or removed)" } else { "" })
        })
        .chain(now.keys().filter(|k| !then.contains_key(*k)).map(|k| format!("{} (read now, not then)", describe(k))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_as_their_kind_and_name() {
        assert_eq!(describe("feature_view:driver_hourly"), "feature view `driver_hourly`");
        assert_eq!(describe("on_demand_view:scoring"), "on-demand view `scoring`");
        assert_eq!(describe("feature_service:ranker"), "feature service `ranker`");
    }

    #[test]
    fn a_change_is_named_and_an_equal_map_is_none() {
        let then: BTreeMap<String, String> = [("feature_view:a", "1"), ("entity:e", "2")].map(|(k, v)| (k.into(), v.into())).into();
        assert!(changed(&then, &then).is_empty());
        let mut now = then.clone();
        now.insert("feature_view:a".into(), "3".into());
        assert_eq!(changed(&then, &now), ["feature view `a`"]);
        now.remove("entity:e");
        assert_eq!(changed(&then, &now), ["entity `e` (no longer read, or removed)", "feature view `a`"]);
    }

    #[test]
    fn a_description_changes_no_digest_and_a_type_does() {
        let view = |description: &str, dtype: &str| -> FeatureView {
            serde_json::from_value(serde_json::json!({
                "name": "v", "entities": ["e"], "description": description,
                "features": [{"name": "f", "dtype": dtype}, {"name": "g", "dtype": "int64"}],
            }))
            .unwrap()
        };
        let read: BTreeSet<&str> = ["f"].into();
        assert_eq!(digest(&view("one", "float64"), Some(&read)), digest(&view("two", "float64"), Some(&read)));
        assert_ne!(digest(&view("one", "float64"), Some(&read)), digest(&view("one", "float32"), Some(&read)));
        // A feature not read is not part of it.
        let g_read: BTreeSet<&str> = ["g"].into();
        assert_eq!(digest(&view("one", "float64"), Some(&g_read)), digest(&view("one", "float32"), Some(&g_read)));
    }
}
