//! The registry: per-field diff, apply, breaking changes made into new versions,
//! --force, no-op.

use std::cell::RefCell;
use std::collections::BTreeSet;

use chrono::{TimeZone, Utc};
use quiver_sdk::registry::{ChangeOp, FileRegistry, apply, diff};
use quiver_sdk::yaml::parse_definitions;
use quiver_sdk::{DataProbe, Definitions, Error, FeatureView, Result};

const BASE: &str = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
feature_views:
  - name: stats
    entities: [driver]
    ttl: 2h
    features: [{name: conv_rate, dtype: float64}, {name: trips, dtype: int64}]
  - name: empty_view
    entities: [driver]
    features: [{name: x, dtype: int64}]
feature_services:
  - {name: ranker, features: ["stats:conv_rate"]}
"#;

fn defs(text: &str) -> Definitions {
    parse_definitions(text).unwrap()
}

fn changed(from: &str, to: &str) -> Definitions {
    assert!(BASE.contains(from), "fixture lacks {from:?}");
    defs(&BASE.replacen(from, to, 1))
}

/// Views listed here hold data; records which views were asked about.
struct Holding {
    views: BTreeSet<&'static str>,
    asked: RefCell<Vec<String>>,
}

impl Holding {
    fn new(views: &[&'static str]) -> Self {
        Holding { views: views.iter().copied().collect(), asked: RefCell::new(Vec::new()) }
    }
}

impl DataProbe for Holding {
    fn holds_data(&self, view: &FeatureView) -> Result<bool> {
        self.asked.borrow_mut().push(view.name.clone());
        Ok(self.views.contains(view.name.as_str()))
    }
}

fn t(hour: u32) -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, hour, 0, 0).unwrap()
}

#[test]
fn diff_reports_each_changed_field() {
    let old = defs(BASE);
    let new = changed("ttl: 2h", "ttl: 3h").clone();
    let new = {
        let mut n = new;
        n.feature_views[0].features[1].dtype = quiver_sdk::DType::Float64;
        n.feature_views[0].features.push(quiver_sdk::Feature {
            name: "temp".into(),
            dtype: quiver_sdk::DType::Float32,
            description: String::new(),
            expr: String::new(),
        });
        n.feature_services.clear();
        n.entities[0].description = "drives".into();
        n
    };
    let plan = diff(&old, &new);
    assert_eq!(plan.counts(), (0, 2, 1));
    let view = plan.changes.iter().find(|c| c.name == "stats").unwrap();
    let ChangeOp::Changed(fields) = &view.op else { panic!("stats should be changed: {view:?}") };
    let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["features[trips].dtype", "features[temp]", "ttl"]);
    assert_eq!(fields[0].old, Some(serde_json::json!("int64")));
    assert_eq!(fields[0].new, Some(serde_json::json!("float64")));
    assert_eq!(fields[1].old, None);
    let text = plan.to_string();
    assert!(text.contains("~ feature_view stats"), "{text}");
    assert!(text.contains("    ttl: \"2h\" -> \"3h\""), "{text}");
    assert!(text.contains("- feature_service ranker"), "{text}");
    assert!(text.contains("    description: added \"drives\""), "{text}");
    assert!(text.ends_with("0 to add, 2 to change, 1 to remove"), "{text}");
    // Reordering features is a change too (it reorders columns).
    let mut reordered = old.clone();
    reordered.feature_views[0].features.reverse();
    let plan = diff(&old, &reordered);
    assert_eq!(plan.changes.len(), 1, "{plan}");
    assert!(plan.to_string().contains("features (order)"), "{plan}");
}

#[test]
fn apply_writes_versions_and_is_a_no_op_when_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    let probe = Holding::new(&[]);
    let first = apply(&reg, "demo", &defs(BASE), &probe, false, t(1)).unwrap();
    assert!(first.written);
    assert_eq!(first.version, 1);
    assert_eq!(first.plan.counts(), (4, 0, 0));
    let doc = reg.load().unwrap().unwrap();
    assert_eq!(doc.version, 1);
    assert_eq!(doc.definitions, defs(BASE));
    assert_eq!(doc.objects["feature_service/ranker"].version, 1);

    let bytes = std::fs::read(reg.path()).unwrap();
    let again = apply(&reg, "demo", &defs(BASE), &probe, false, t(2)).unwrap();
    assert!(!again.written);
    assert_eq!(again.version, 1);
    assert_eq!(std::fs::read(reg.path()).unwrap(), bytes, "a no-op must not rewrite");

    let svc2 = changed("[\"stats:conv_rate\"]", "[\"stats:conv_rate\", \"stats:trips\"]");
    let second = apply(&reg, "demo", &svc2, &probe, false, t(3)).unwrap();
    assert_eq!(second.version, 2);
    let doc = reg.load().unwrap().unwrap();
    assert_eq!(doc.objects["feature_service/ranker"].version, 2, "service versions bump");
    assert_eq!(doc.objects["feature_view/stats"].version, 1, "untouched objects keep theirs");
    assert_eq!(doc.history.len(), 2);
    assert_eq!(doc.history[1].changes, ["~ feature_service ranker (features)"]);
    assert_eq!(doc.updated_at, Some(t(3)));
    // No temp files are left behind (the apply lock's file stays, empty).
    let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["registry.json", "registry.json.lock"]);
}

/// An apply that changes a view's features keeps the layout rows were written under
/// before, by fingerprint, so the online lookup can still read them; it is not part of
/// the plan (a second apply of the same definitions is a no-op).
#[test]
fn changed_features_keep_the_earlier_online_layout() {
    use quiver_sdk::definitions::fingerprint;
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    let probe = Holding::new(&["stats"]);
    apply(&reg, "demo", &defs(BASE), &probe, false, t(1)).unwrap();
    let before = reg.load().unwrap().unwrap();
    assert!(before.layouts.is_empty());
    let old_view = before.definitions.feature_view("stats").unwrap().clone();
    let added = changed("{name: trips, dtype: int64}]", "{name: tip, dtype: float64}, {name: trips, dtype: int64}]");
    assert_ne!(added, defs(BASE), "the change applies");
    let outcome = apply(&reg, "demo", &added, &probe, false, t(2)).unwrap();
    assert!(outcome.written && outcome.forced.is_empty(), "adding a feature needs no --force");
    let doc = reg.load().unwrap().unwrap();
    assert_eq!(doc.layouts.online_layout(fingerprint(&old_view)), Some(old_view.features.as_slice()));
    assert_eq!(doc.layouts.online_layouts.len(), 1);
    let again = apply(&reg, "demo", &added, &probe, false, t(3)).unwrap();
    assert!(!again.written, "the layouts are not a change");
    // Kept beside the definitions, not in them.
    let text = std::fs::read_to_string(reg.path()).unwrap();
    let stored: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(stored["definitions"].get("online_layouts").is_none(), "{text}");
    assert_eq!(stored["layouts"]["online_layouts"].as_object().map(|o| o.len()), Some(1), "{text}");

    // A registry written when the layouts were kept inside `definitions` reads the same.
    let mut old_form = stored.clone();
    let layouts = old_form.as_object_mut().unwrap().remove("layouts").unwrap();
    old_form["definitions"]["online_layouts"] = layouts["online_layouts"].clone();
    let old_reg = FileRegistry::new(dir.path().join("old.json"));
    std::fs::write(old_reg.path(), serde_json::to_string(&old_form).unwrap()).unwrap();
    let read = old_reg.load().unwrap().unwrap();
    assert_eq!(read.layouts, doc.layouts);
    assert_eq!(read.definitions, doc.definitions);
}

/// A breaking change to a view that holds data is made into the view's next version,
/// beside the previous one, with the registered service pinned to the previous one
/// (docs/versions.md); `--force` replaces in place instead.
#[test]
fn breaking_changes_to_views_with_data_become_new_versions_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    apply(&reg, "demo", &defs(BASE), &Holding::new(&[]), false, t(1)).unwrap();
    let holding = Holding::new(&["stats"]);
    let before = std::fs::read(reg.path()).unwrap();

    let cases = [
        (
            changed("{name: trips, dtype: int64}", "{name: trips, dtype: float64}"),
            "feature `trips` would change type from int64 to float64",
        ),
        (changed(", {name: trips, dtype: int64}", ""), "feature `trips` would be removed"),
        (
            defs(
                &BASE
                    .replacen("feature_views:", "  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}\nfeature_views:", 1)
                    .replacen("  - name: stats\n    entities: [driver]", "  - name: stats\n    entities: [rider]", 1),
            ),
            "its join keys would change from [driver_id:int64] to [rider_id:int64]",
        ),
    ];
    for (new, expected) in &cases {
        std::fs::write(reg.path(), &before).unwrap();
        let outcome = apply(&reg, "demo", new, &holding, false, t(2)).unwrap();
        assert_eq!(outcome.version, 2);
        assert!(outcome.forced.is_empty());
        let [made] = &outcome.plan.versions[..] else { panic!("{:?}", outcome.plan.versions) };
        assert_eq!((made.view.as_str(), made.version, made.previous), ("stats", 2, 1));
        assert!(made.reasons.iter().any(|r| r.contains(expected)), "{:?}", made.reasons);
        assert_eq!(made.pinned, ["feature_service ranker"]);
        assert!(outcome.plan.to_string().contains("^ feature_view stats: version 2 beside version 1 ("), "{}", outcome.plan);
        let doc = reg.load().unwrap().unwrap();
        let d = &doc.definitions;
        assert_eq!(d.feature_view("stats").unwrap().version, 2);
        assert_eq!(d.feature_view("stats@1").unwrap(), defs(BASE).feature_view("stats").unwrap(), "version 1 kept as it was");
        assert_eq!(d.feature_service("ranker").unwrap().features[0].to_string(), "stats@1:conv_rate");
        assert!(doc.history.last().unwrap().changes.iter().any(|c| c.starts_with("^ feature_view stats: version 2")), "{:?}", doc.history);
        // The same definitions again change nothing: the service stays pinned.
        assert!(!apply(&reg, "demo", new, &holding, false, t(3)).unwrap().written);
    }

    // A change to an entity's keys is no new version: every version reads them.
    std::fs::write(reg.path(), &before).unwrap();
    let err =
        apply(&reg, "demo", &changed("driver_id, dtype: int64}]}", "driver_id, dtype: string}]}"), &holding, false, t(2)).unwrap_err();
    assert!(matches!(err, Error::Breaking(_)), "{err}");
    assert!(err.to_string().contains("its join keys would change from [driver_id:int64] to [driver_id:string] (an entity's keys"), "{err}");
    assert_eq!(std::fs::read(reg.path()).unwrap(), before, "refused apply wrote");

    // The same change to a view with no data is made in place.
    std::fs::write(reg.path(), &before).unwrap();
    let new = changed("{name: x, dtype: int64}", "{name: x, dtype: string}");
    let outcome = apply(&reg, "demo", &new, &holding, false, t(2)).unwrap();
    assert_eq!((outcome.version, outcome.plan.versions.len()), (2, 0));
    assert_eq!(reg.load().unwrap().unwrap().definitions.feature_view("empty_view").unwrap().version, 1);
    // Adding a feature to a view with data breaks nothing: same version.
    let mut added = new.clone();
    added.feature_views[0].features.push(quiver_sdk::Feature {
        name: "temp".into(),
        dtype: quiver_sdk::DType::Float64,
        description: String::new(),
        expr: String::new(),
    });
    let outcome = apply(&reg, "demo", &added, &holding, false, t(3)).unwrap();
    assert_eq!((outcome.version, outcome.plan.versions.len()), (3, 0));

    // --force replaces in place and records that it did.
    let mut forced = added.clone();
    forced.feature_views[0].features.retain(|f| f.name != "trips");
    let outcome = apply(&reg, "demo", &forced, &holding, true, t(4)).unwrap();
    assert_eq!(outcome.version, 4);
    assert_eq!(outcome.forced.len(), 1);
    assert!(outcome.plan.versions.is_empty());
    let doc = reg.load().unwrap().unwrap();
    assert!(doc.history.last().unwrap().forced);
    let stats = doc.definitions.feature_view("stats").unwrap();
    assert!(stats.feature("trips").is_none());
    assert_eq!(stats.version, 1);
    assert!(doc.definitions.earlier_versions.is_empty());
}

#[test]
fn removing_a_view_with_data_is_breaking() {
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    apply(&reg, "demo", &defs(BASE), &Holding::new(&[]), false, t(1)).unwrap();
    let mut new = defs(BASE);
    new.feature_services.clear();
    new.feature_views.retain(|v| v.name != "stats");
    let err = apply(&reg, "demo", &new, &Holding::new(&["stats"]), false, t(2)).unwrap_err();
    assert!(err.to_string().contains("feature view `stats` holds data and would be removed"), "{err}");
}

#[test]
fn unchanged_views_are_not_probed() {
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    apply(&reg, "demo", &defs(BASE), &Holding::new(&[]), false, t(1)).unwrap();
    let probe = Holding::new(&["stats", "empty_view"]);
    let new = changed("[\"stats:conv_rate\"]", "[\"stats:trips\"]");
    apply(&reg, "demo", &new, &probe, false, t(2)).unwrap();
    assert!(probe.asked.borrow().is_empty(), "{:?}", probe.asked.borrow());
}

#[test]
fn a_registry_of_another_project_or_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    apply(&reg, "demo", &defs(BASE), &Holding::new(&[]), false, t(1)).unwrap();
    let err = apply(&reg, "other", &defs(BASE), &Holding::new(&[]), false, t(2)).unwrap_err();
    assert!(err.to_string().contains("holds project `demo`, but quiver.yaml names project `other`"), "{err}");
    std::fs::write(reg.path(), "{\"format\": 9}").unwrap();
    let err = reg.load().unwrap_err().to_string();
    assert!(err.contains("format 9"), "{err}");
    std::fs::write(reg.path(), "not json").unwrap();
    assert!(reg.load().unwrap_err().to_string().contains("not valid JSON"));
}

/// Where definitions come from is recorded per object; a front end removes only what it
/// defined itself: `features.yaml` without Python's objects keeps them (listed as kept),
/// and removing one of them takes naming it.
#[test]
fn a_front_end_never_removes_what_another_defined_unless_told() {
    use quiver_sdk::registry::{ApplyRequest, Origin, apply_with};
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    let probe = Holding::new(&[]);
    let run = |new: &Definitions, origin: &Origin| {
        let request = ApplyRequest { new, origin, probe: &probe, force: false, now: t(1) };
        apply_with(&reg, "demo", &request, &mut |_| Ok(()))
    };
    // Python defines everything.
    run(&defs(BASE), &Origin::new("python")).unwrap();
    let doc = reg.load().unwrap().unwrap();
    assert!(doc.objects.values().all(|m| m.origin.as_deref() == Some("python")), "{:?}", doc.objects);
    // An empty features.yaml plans nothing to remove: all four are kept.
    let empty = Definitions::default();
    let (merged, plan) = doc.plan_from(&empty, &Origin::new("features.yaml")).unwrap();
    assert!(plan.is_empty(), "{plan}");
    assert_eq!(plan.kept.len(), 4, "{plan}");
    assert_eq!(merged, doc.definitions);
    let shown = plan.to_string();
    assert!(shown.contains("= feature_view stats (kept: defined from python; `--remove feature_view/stats` removes it)"), "{shown}");
    assert!(shown.ends_with("0 to add, 0 to change, 0 to remove, 4 kept (defined elsewhere)"), "{shown}");
    let outcome = run(&empty, &Origin::new("features.yaml")).unwrap();
    assert!(!outcome.written);
    // Named, one goes (with the service that names it: removing the view alone would
    // leave the service pointing at nothing, which validation refuses).
    let err = run(&empty, &Origin::new("features.yaml").removing(vec!["feature_view/stats".into()])).unwrap_err();
    assert!(err.to_string().contains("feature service `ranker`: unknown feature view `stats`"), "{err}");
    let remove = vec!["empty_view".to_string()];
    let outcome = run(&empty, &Origin::new("features.yaml").removing(remove)).unwrap();
    assert_eq!(outcome.plan.counts(), (0, 0, 1), "{}", outcome.plan);
    assert!(reg.load().unwrap().unwrap().definitions.feature_view("empty_view").is_none());
    // What features.yaml defines is its own: taking it out of the file removes it.
    let own = defs("entities:\n  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}\n");
    run(&own, &Origin::new("features.yaml")).unwrap();
    let doc = reg.load().unwrap().unwrap();
    assert_eq!(doc.objects["entity/rider"].origin.as_deref(), Some("features.yaml"));
    let outcome = run(&empty, &Origin::new("features.yaml")).unwrap();
    assert_eq!(outcome.plan.counts(), (0, 0, 1), "{}", outcome.plan);
    assert!(reg.load().unwrap().unwrap().definitions.entity("rider").is_none());
    // Removal names must be registered objects the front end does not define itself.
    for (remove, part) in [("nope", "cannot remove `nope`: the registry holds no such object"), ("stats", "features.yaml defines it")] {
        let err = run(&defs(BASE), &Origin::new("features.yaml").removing(vec![remove.into()])).unwrap_err();
        assert!(err.to_string().contains(part), "{err}");
    }
}

/// A view's write-time filter or expression changed while it holds data is a breaking
/// change (its rows were computed by the old one); adding a filter too; a view without
/// data takes any of them.
#[test]
fn changed_write_time_expressions_are_breaking() {
    const SHAPED: &str = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
feature_views:
  - name: pay
    entities: [driver]
    source: {filter: "cents > 0", raw: [{name: cents, dtype: int64}]}
    features: [{name: amount, dtype: float64, expr: "CAST(cents AS DOUBLE) / 100"}]
"#;
    let dir = tempfile::tempdir().unwrap();
    let reg = FileRegistry::new(dir.path().join("registry.json"));
    apply(&reg, "demo", &defs(SHAPED), &Holding::new(&[]), false, t(1)).unwrap();
    let holding = Holding::new(&["pay"]);
    let cases = [
        (
            SHAPED.replace("/ 100\"", "/ 1000\""),
            "feature `amount` would change its expression from `CAST(cents AS DOUBLE) / 100` to `CAST(cents AS DOUBLE) / 1000`",
        ),
        (SHAPED.replace("cents > 0", "cents >= 0"), "its source filter would change from `cents > 0` to `cents >= 0`"),
        (SHAPED.replace("filter: \"cents > 0\", ", ""), "its source filter would change from `cents > 0` to none"),
        (
            SHAPED.replace("{name: cents, dtype: int64}", "{name: cents, dtype: float64}"),
            "raw column `cents` would change type from int64 to float64",
        ),
    ];
    let before = std::fs::read(reg.path()).unwrap();
    for (text, expected) in &cases {
        std::fs::write(reg.path(), &before).unwrap();
        let outcome = apply(&reg, "demo", &defs(text), &holding, false, t(2)).unwrap();
        let [made] = &outcome.plan.versions[..] else { panic!("{:?}", outcome.plan.versions) };
        assert!(made.reasons.iter().any(|r| r.contains(expected)), "{:?}", made.reasons);
    }
    std::fs::write(reg.path(), &before).unwrap();
    let outcome = apply(&reg, "demo", &defs(&cases[0].0), &Holding::new(&[]), false, t(2)).unwrap();
    assert_eq!((outcome.version, outcome.plan.versions.len()), (2, 0), "no data: changed in place");
}
