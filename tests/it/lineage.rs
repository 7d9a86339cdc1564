//! `quiver lineage` (docs/lineage.md#quiver-lineage) on a repository built here: its
//! answers equal what the registry and the training sets' manifests say, and the
//! manifest records the repository's git commit.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn json(dir: &Path, args: &[&str]) -> Value {
    serde_json::from_str(&common::ok(dir, args)).unwrap()
}

fn ids(nodes: &Value) -> Vec<String> {
    nodes.as_array().unwrap().iter().map(|n| n["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn lineage_answers_what_the_registry_and_the_manifests_say() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(common::quiver(tmp.path(), &["init", "repo", "--demo"], &[]).status.success());
    let dir = tmp.path().join("repo");
    // A write-time expression (conv_pct from the raw conv_rate) and an on-demand feature
    // reading it with a request field.
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    let computed = yaml
        .replacen(
            "      created_timestamp_field: created_timestamp\n    features:\n      - {name: conv_rate, dtype: float64}\n",
            "      created_timestamp_field: created_timestamp\n      raw: [{name: conv_rate, dtype: float64}]\n    features:\n      - {name: conv_pct, dtype: float64, expr: \"conv_rate * 100\"}\n",
            1,
        )
        .replace("driver_hourly:conv_rate", "driver_hourly:conv_pct");
    assert_ne!(computed, yaml);
    let on_demand = "\non_demand_views:\n  - name: scoring\n    inputs: [driver_hourly]\n    request: [{name: amount, dtype: float64}]\n    \
                     features: [{name: tip, dtype: float64, expr: \"driver_hourly.conv_pct * amount\"}]\n";
    std::fs::write(dir.join("features.yaml"), computed + on_demand).unwrap();
    common::ok(&dir, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        common::ok(&dir, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    git(&dir, &["init", "-q"]);
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "features"]);
    let head = git(&dir, &["rev-parse", "HEAD"]);
    // One training set outside the repository (found with --training-sets), one inside.
    let sets = tmp.path().join("sets");
    let outside = sets.join("ranker");
    common::ok(&dir, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", outside.to_str().unwrap()]);
    let manifest: Value = serde_json::from_slice(&std::fs::read(outside.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["code_version"], serde_json::json!({"commit": head, "dirty": false}), "{}", git(&dir, &["status", "--porcelain"]));

    // training:DIR: the manifest's id, versions, spine and code version; upstream the
    // features it read, their views and the service.
    let answer = json(&dir, &["lineage", &format!("training:{}", outside.display()), "--json"]);
    let t = &answer["target"]["details"];
    assert_eq!(t["training_set_id"], manifest["training_set_id"]);
    assert_eq!(t["delta_versions"], manifest["delta_versions"]);
    assert_eq!(t["registry_version"], manifest["registry_version"]);
    assert_eq!(t["code_version"]["commit"], head.as_str());
    assert_eq!(t["spine"]["sha256"], manifest["spine"]["sha256"]);
    let up = ids(&answer["upstream"]);
    for f in manifest["features"].as_array().unwrap() {
        let reference = f["reference"].as_str().unwrap();
        assert!(up.contains(&format!("feature:{reference}")), "{reference} not upstream of the training set: {up:?}");
    }
    for view in manifest["delta_versions"].as_object().unwrap().keys() {
        assert!(up.contains(&format!("feature_view:{view}")), "{view}: {up:?}");
    }
    assert!(up.contains(&"feature_service:ranker_v1".to_string()), "{up:?}");
    assert!(answer["downstream"].as_array().unwrap().is_empty());
    let table = common::ok(&dir, &["lineage", &format!("training:{}", outside.display())]);
    assert!(table.contains(&format!("code version {head}")) && table.contains("read driver_hourly at Delta version 1"), "{table}");

    // VIEW:FEATURE: the raw column and expression upstream; the on-demand feature, the
    // service and the training set downstream — the one outside only when named.
    let inside = dir.join("training");
    common::ok(&dir, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "training"]);
    let inside = std::fs::canonicalize(inside).unwrap();
    let outside = std::fs::canonicalize(outside).unwrap();
    let feature = json(&dir, &["lineage", "driver_hourly:conv_pct", "--json"]);
    assert_eq!(feature["target"]["details"]["columns"], serde_json::json!(["conv_rate"]));
    assert_eq!(feature["target"]["details"]["expr"], "conv_rate * 100");
    assert_eq!(ids(&feature["upstream"]), ["feature_view:driver_hourly"]);
    let down = ids(&feature["downstream"]);
    assert_eq!(
        down,
        [
            "on_demand_feature:scoring:tip".to_string(),
            "feature_service:ranker_v1".to_string(),
            format!("training_set:{}", inside.display()),
        ]
    );
    let named = ids(&json(&dir, &["lineage", "driver_hourly:conv_pct", "--json", "--training-sets", sets.to_str().unwrap()])["downstream"]);
    assert!(named.contains(&format!("training_set:{}", outside.display())), "{named:?}");
    // An on-demand feature: from the stored feature and the request field.
    let tip = json(&dir, &["lineage", "scoring:tip", "--json"]);
    let up = ids(&tip["upstream"]);
    for id in ["feature:driver_hourly:conv_pct", "request_field:scoring:amount", "on_demand_view:scoring", "feature_view:driver_hourly"] {
        assert!(up.contains(&id.to_string()), "{id}: {up:?}");
    }
    // An aggregation: from its event column.
    let agg = json(&dir, &["lineage", "customer_rides:fare_sum_1h", "--json"]);
    assert_eq!(agg["target"]["details"]["columns"], serde_json::json!(["fare"]));
    assert_eq!(agg["target"]["details"]["expr"], "sum of fare over 1h");
    // service:NAME: downstream exactly the training sets exported from it.
    let service = json(&dir, &["lineage", "service:ranker_v1", "--json", "--training-sets", sets.to_str().unwrap()]);
    let mut want = vec![format!("training_set:{}", inside.display()), format!("training_set:{}", outside.display())];
    want.sort();
    assert_eq!(ids(&service["downstream"]), want);
    // A change not committed: the next export says the tree was dirty.
    std::fs::write(dir.join("notes.txt"), "uncommitted").unwrap();
    common::ok(
        &dir,
        &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", sets.join("dirty").to_str().unwrap()],
    );
    let dirty: Value = serde_json::from_slice(&std::fs::read(sets.join("dirty/manifest.json")).unwrap()).unwrap();
    assert_eq!(dirty["code_version"], serde_json::json!({"commit": head, "dirty": true}));
    assert_eq!(dirty["training_set_id"], manifest["training_set_id"], "the code version is not part of the id");

    // Bad input: names that do not exist (naming those that do), a folder without a manifest.
    common::fails(&dir, &["lineage", "nope"], &["no feature view or on-demand view `nope`", "driver_hourly", "service:ranker_v1"]);
    common::fails(&dir, &["lineage", "driver_hourly:nope"], &["unknown feature `driver_hourly:nope`", "conv_pct"]);
    common::fails(&dir, &["lineage", "service:nope"], &["unknown feature service `nope`", "ranker_v1"]);
    common::fails(&dir, &["lineage", "training:sample_data"], &["sample_data: no manifest.json"]);
}
