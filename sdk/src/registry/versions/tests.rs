//! Versions in the registry: references, pins, the definitions a request reads.

use std::path::Path;

use chrono::{TimeZone, Utc};

use crate::definitions::{FeatureRef, VersionError};
use crate::registry::{ApplyRequest, DataProbe, FileRegistry, Origin, apply_with};
use crate::{Definitions, FeatureView, Result};

const V1: &str = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
feature_views:
  - name: stats
    entities: [driver]
    features: [{name: conv_rate, dtype: float64}, {name: trips, dtype: int64}]
on_demand_views:
  - name: scored
    inputs: [stats]
    features: [{name: double_rate, dtype: float64, expr: "stats.conv_rate * 2"}]
feature_services:
  - {name: ranker, features: ["stats:conv_rate", "scored:double_rate"]}
"#;

/// Every view holds data.
struct All;

impl DataProbe for All {
    fn holds_data(&self, _: &FeatureView) -> Result<bool> {
        Ok(true)
    }
}

fn defs(text: &str) -> Definitions {
    crate::yaml::parse_definitions(text).unwrap()
}

fn apply(reg: &FileRegistry, text: &str) -> Result<super::super::ApplyOutcome> {
    let new = defs(text);
    let origin = Origin::new("features.yaml");
    let request =
        ApplyRequest { new: &new, origin: &origin, probe: &All, force: false, now: Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap() };
    apply_with(reg, "demo", &request, &mut |_| Ok(()))
}

/// `conv_rate` becomes a string in version 2.
fn v2() -> String {
    V1.replace("{name: conv_rate, dtype: float64}", "{name: conv_rate, dtype: string}")
        .replace("stats.conv_rate * 2", "CAST(length(stats.conv_rate) AS DOUBLE)")
}

fn registry(dir: &Path) -> FileRegistry {
    FileRegistry::new(dir.join("registry.json"))
}

#[test]
fn references_name_a_version_or_the_latest() {
    let r: FeatureRef = "stats@2:conv_rate".parse().unwrap();
    assert_eq!((r.view.as_str(), r.feature.as_str(), r.version), ("stats", "conv_rate", Some(2)));
    assert_eq!(r.to_string(), "stats@2:conv_rate");
    assert_eq!(r.column_name(), "stats__conv_rate", "the version is not part of the column's name");
    assert_eq!("stats:conv_rate".parse::<FeatureRef>().unwrap().version, None);
    for bad in [
        "stats@x:conv_rate",
        "stats@0:conv_rate",
        "stats@:conv_rate",
        "stats@1@2:conv_rate",
        "@1:conv_rate",
        "stats@-1:a",
        "stats@99999999999:a",
    ] {
        let err = bad.parse::<FeatureRef>().unwrap_err().to_string();
        assert_eq!(err, format!("bad feature reference `{bad}` (expected `view:feature` or `view@N:feature`, N a version from 1)"));
    }
}

#[test]
fn a_breaking_change_is_served_beside_the_version_services_were_applied_with() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    apply(&reg, V1).unwrap();
    let outcome = apply(&reg, &v2()).unwrap();
    let made: Vec<String> = outcome.plan.versions.iter().map(ToString::to_string).collect();
    assert_eq!(made.len(), 2, "{made:?}");
    assert_eq!(
        made[0],
        "feature_view stats: version 2 beside version 1 (feature `conv_rate` would change type from float64 to string); stays on version 1: feature_service ranker, on_demand_view scored"
    );
    assert!(
        made[1].starts_with("on_demand_view scored: version 2 beside version 1 (feature `double_rate` would change its expression"),
        "{made:?}"
    );
    assert!(made[1].ends_with("; stays on version 1: feature_service ranker"), "{made:?}");
    let d = reg.load().unwrap().unwrap().definitions;
    // The service reads what it was applied with: both views at version 1.
    let ranker: Vec<String> = d.feature_service("ranker").unwrap().features.iter().map(ToString::to_string).collect();
    assert_eq!(ranker, ["stats@1:conv_rate", "scored@1:double_rate"]);
    assert_eq!(d.on_demand_view("scored@1").unwrap().inputs, ["stats@1"], "version 1 of the on-demand view reads version 1");
    assert_eq!(d.on_demand_view("scored").unwrap().inputs, ["stats"], "the new version reads the latest");
    assert_eq!(d.feature_view("stats").unwrap().storage_name(), "stats@2");
    assert_eq!(d.feature_view("stats@1").unwrap().storage_name(), "stats");

    // What a request reads: each view at the version asked for, by its name.
    let refs = |texts: &[&str]| -> Vec<FeatureRef> { texts.iter().map(|t| t.parse().unwrap()).collect() };
    let pinned = d.pinned(&d.feature_service("ranker").unwrap().features).unwrap();
    assert_eq!(pinned.feature_view("stats").unwrap().feature("conv_rate").unwrap().dtype, crate::DType::Float64);
    assert_eq!(pinned.on_demand_view("scored").unwrap().features[0].expr, "stats.conv_rate * 2");
    assert_eq!(pinned.on_demand_view("scored").unwrap().inputs, ["stats"]);
    assert!(pinned.find(&"stats@1:conv_rate".parse().unwrap()).is_ok());
    assert!(matches!(d.pinned(&refs(&["stats:conv_rate", "scored:double_rate"])).unwrap(), std::borrow::Cow::Borrowed(_)));
    let latest = d.pinned(&refs(&["stats:conv_rate"])).unwrap();
    assert_eq!(latest.feature_view("stats").unwrap().feature("conv_rate").unwrap().dtype, crate::DType::String);

    // One view at two versions is refused naming both; so is a version not live.
    let err = d.pinned(&refs(&["stats@1:conv_rate", "stats:trips"])).unwrap_err();
    assert!(matches!(err, VersionError::Conflict(_)));
    assert!(err.to_string().starts_with("view `stats` is asked at version "), "{err}");
    assert!(err.to_string().contains("(`stats@1:conv_rate`)") && err.to_string().contains("(`stats:trips`)"), "{err}");
    let err = d.pinned(&refs(&["scored@1:double_rate", "stats:trips"])).unwrap_err();
    assert!(err.to_string().contains("on-demand view `scored`") || err.to_string().contains("(`stats:trips`)"), "{err}");
    let err = d.pinned(&refs(&["stats@3:trips"])).unwrap_err();
    assert_eq!(err.to_string(), "view `stats` has no version 3 (it never had one, or it was retired; live: 1, 2)");
    let err = d.find(&"stats@3:trips".parse().unwrap()).unwrap_err();
    assert_eq!(err.to_string(), "view `stats` has no version 3 (it never had one, or it was retired; live: 1, 2)");

    // Applying the same file again changes nothing: the pins stay.
    assert!(!apply(&reg, &v2()).unwrap().written);
    // Moving the service is one explicit change, in the plan.
    let moved = v2().replace(r#"["stats:conv_rate", "scored:double_rate"]"#, r#"["stats@2:conv_rate", "scored@2:double_rate"]"#);
    let outcome = apply(&reg, &moved).unwrap();
    let shown = outcome.plan.to_string();
    assert!(shown.contains("~ feature_service ranker"), "{shown}");
    assert!(shown.contains("\"stats@1:conv_rate\""), "{shown}");
    assert_eq!(outcome.plan.counts(), (0, 1, 0), "{shown}");
    // A service applied first after the new version reads the latest.
    let fresh = moved.clone() + "  - {name: fresh, features: [\"stats:conv_rate\"]}\n";
    apply(&reg, &fresh).unwrap();
    let d = reg.load().unwrap().unwrap().definitions;
    assert_eq!(d.feature_service("fresh").unwrap().features[0].to_string(), "stats:conv_rate");
    // A third breaking change: version 3, version 2 kept beside 1; `fresh` pinned to 2.
    let v3 = fresh.replace("{name: trips, dtype: int64}", "{name: trips, dtype: float64}");
    apply(&reg, &v3).unwrap();
    let d = reg.load().unwrap().unwrap().definitions;
    let live: Vec<u32> = d.view_versions("stats").iter().map(|v| v.version).collect();
    assert_eq!(live, [1, 2, 3]);
    assert_eq!(d.feature_service("fresh").unwrap().features[0].to_string(), "stats@2:conv_rate");
    d.validate().unwrap();
}

#[test]
fn each_version_has_its_own_table() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("quiver.yaml"), "project: demo\n").unwrap();
    let config = crate::Config::load(dir.path()).unwrap();
    let mut view = FeatureView::new("stats");
    let one = config.view_table(&view).to_string();
    view.version = 2;
    assert_eq!(config.view_table(&view).to_string(), format!("{one}.v2"));
    view.source.path = Some("s3://bucket/tables/stats/".into());
    assert_eq!(config.view_table(&view).to_string(), "s3://bucket/tables/stats.v2");
}

#[test]
fn a_version_retires_only_when_nothing_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    apply(&reg, V1).unwrap();
    apply(&reg, &v2()).unwrap();
    let doc = reg.load().unwrap().unwrap();
    let now = Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, 0).unwrap();
    let refused = |name: &str| doc.retired(name, now).unwrap_err().to_string();
    assert_eq!(
        refused("stats@1"),
        "cannot retire `stats@1`: read by feature_service ranker, on_demand_view scored (move them to another version first)"
    );
    assert_eq!(refused("stats@2"), "cannot retire `stats@2`: it is the latest while older ones live (live: 1, 2); retire those first");
    assert_eq!(refused("stats@9"), "view `stats` has no version 9 (it never had one, or it was retired; live: 1, 2)");
    assert_eq!(refused("stats"), "cannot retire `stats`: name a version, `view@N` (N from 1)");
    assert_eq!(refused("nope@1"), "unknown feature view `nope` (known: stats)");
    // The service and the on-demand view move to version 2; the old on-demand view
    // version is retired first (it reads stats@1), then stats@1.
    let moved = v2().replace(r#"["stats:conv_rate", "scored:double_rate"]"#, r#"["stats@2:conv_rate", "scored@2:double_rate"]"#);
    apply(&reg, &moved).unwrap();
    let doc = reg.load().unwrap().unwrap();
    assert!(
        doc.retired("stats@1", now)
            .unwrap_err()
            .to_string()
            .ends_with("read by on_demand_view scored (move them to another version first)")
    );
    let (next, retiring) = doc.retired("scored@1", now).unwrap();
    assert_eq!((retiring.view, retiring.version), (None, 1));
    reg.save(&next).unwrap();
    let mut removed = Vec::new();
    let (retiring, version) = super::retire(&reg, "demo", "stats@1", now, &mut |r| {
        removed.push(r.view.as_ref().map(|v| (v.name.clone(), v.version)));
        Ok(())
    })
    .unwrap();
    assert_eq!(removed, [Some(("stats".to_string(), 1))]);
    assert_eq!(retiring.name, "stats@1");
    let doc = reg.load().unwrap().unwrap();
    assert_eq!(doc.version, version);
    assert!(doc.definitions.earlier_versions.is_empty());
    assert_eq!(doc.history.last().unwrap().changes, ["- feature_view stats@1 (retired)"]);
    assert!(doc.definitions.find(&"stats@1:trips".parse().unwrap()).unwrap_err().to_string().ends_with("live: 2)"));
    // A refused retire (the only version) leaves the registry as it was.
    let before = std::fs::read(reg.path()).unwrap();
    assert!(super::retire(&reg, "demo", "stats@2", now, &mut |_| Ok(())).is_err());
    assert_eq!(std::fs::read(reg.path()).unwrap(), before);
}
