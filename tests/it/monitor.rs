//! `quiver monitor` end to end. Drift: two months of offline rows, generated here with
//! known distributions — stable features, a mean shift, a null-rate jump, a category
//! mix change — and the report's statistics checked against an independent computation
//! over the same rows (exact null rates, the exact two-sample KS distance, each decile
//! bin's share counted directly, PSI recomputed from those shares); two halves of one
//! month raise nothing at the default thresholds. Skew: a training set exported,
//! then served as trained (quiet), then served values that moved and entities the store
//! lacks (found from the serving log, against thresholds set in the definitions).

use std::fmt::Write as _;
use std::path::Path;

use rand::{Rng, SeedableRng};

use crate::common::{self, fails, fails_with, ok};

const FEATURES: &str = r#"entities:
  - {name: user, join_keys: [{name: user_id, dtype: int64}]}
feature_views:
  - name: m
    entities: [user]
    source: {timestamp_field: ts}
    features:
      - {name: stable, dtype: float64}
      - {name: shifted, dtype: float64}
      - {name: sparse, dtype: int64}
      - {name: mix, dtype: string}
      - {name: steady, dtype: string}
      - {name: tags, dtype: list<int64>}
  - name: ev
    entities: [user]
    source: {timestamp_field: ts}
    features: [{name: x, dtype: float64}]
    aggregations: [{name: x_sum_1d, function: sum, column: x, window: 1d}]
"#;

/// Jan 1 and Feb 1 2026, UTC microseconds.
const JAN: i64 = 1_767_225_600_000_000;
const FEB: i64 = 1_769_904_000_000_000;
const DAY: i64 = 86_400_000_000;

/// One generated row.
#[derive(Debug, Clone)]
struct Row {
    ts: i64,
    stable: f64,
    shifted: f64,
    sparse: Option<i64>,
    mix: &'static str,
    steady: &'static str,
    tags: usize,
}

fn normal(rng: &mut impl Rng) -> f64 {
    let (u, v): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

fn pick(rng: &mut impl Rng, values: &[&'static str], weights: &[f64]) -> &'static str {
    let mut x: f64 = rng.random();
    for (v, w) in values.iter().zip(weights) {
        if x < *w {
            return v;
        }
        x -= w;
    }
    values[values.len() - 1]
}

/// `n` rows over the month from `start`; `drifted` moves `shifted`, `sparse`'s nulls
/// and `mix`.
fn month(rng: &mut impl Rng, start: i64, n: usize, drifted: bool) -> Vec<Row> {
    (0..n)
        .map(|_| Row {
            ts: start + rng.random_range(0..28 * DAY),
            stable: normal(rng),
            shifted: normal(rng) + if drifted { 0.6 } else { 0.0 },
            sparse: (rng.random::<f64>() >= if drifted { 0.12 } else { 0.02 }).then(|| rng.random_range(0..100)),
            mix: pick(rng, &["a", "b", "c"], if drifted { &[0.3, 0.3, 0.4] } else { &[0.5, 0.3, 0.2] }),
            steady: pick(rng, &["p", "q", "r", "s", "t"], &[0.2; 5]),
            tags: rng.random_range(0..6),
        })
        .collect()
}

fn jsonl(rows: &[Row]) -> String {
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let sparse = r.sparse.map_or_else(|| "null".to_string(), |v| v.to_string());
        let tags: Vec<String> = (0..r.tags).map(|t| t.to_string()).collect();
        writeln!(
            out,
            r#"{{"user_id": {}, "ts": "{}", "stable": {:?}, "shifted": {:?}, "sparse": {sparse}, "mix": "{}", "steady": "{}", "tags": [{}]}}"#,
            i % 2000,
            quiver::sdk::types::format_instant(r.ts),
            r.stable,
            r.shifted,
            r.mix,
            r.steady,
            tags.join(",")
        )
        .unwrap();
    }
    out
}

fn repo(dir: &Path, features: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("quiver.yaml"),
        "project: watch\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\nserving_log:\n  enabled: true\n  batch_ms: 100\n",
    )
    .unwrap();
    std::fs::write(dir.join("features.yaml"), features).unwrap();
    ok(dir, &["apply"]);
}

/// The exact two-sample Kolmogorov–Smirnov distance.
fn exact_ks(a: &[f64], b: &[f64]) -> f64 {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (mut i, mut j, mut d) = (0, 0, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
    }
    d
}

/// Each bin's share of `values`: bin k holds values above edge k-1 up to edge k.
fn shares(values: &[f64], edges: &[f64]) -> Vec<f64> {
    let mut counts = vec![0usize; edges.len() + 1];
    for v in values {
        counts[edges.iter().position(|e| v <= e).unwrap_or(edges.len())] += 1;
    }
    counts.iter().map(|c| *c as f64 / values.len() as f64).collect()
}

/// PSI written out on its own: Σ (c − r) ln(c / r), shares floored at 1e-4.
fn direct_psi(r: &[f64], c: &[f64]) -> f64 {
    r.iter().zip(c).map(|(r, c)| (c.max(1e-4) - r.max(1e-4)) * (c.max(1e-4) / r.max(1e-4)).ln()).sum()
}

fn feature<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["features"].as_array().unwrap().iter().find(|f| f["feature"] == name).unwrap_or_else(|| panic!("no {name} in {report}"))
}

fn breaches(f: &serde_json::Value) -> Vec<&str> {
    f["breaches"].as_array().unwrap().iter().map(|b| b.as_str().unwrap()).collect()
}

/// `quiver monitor ... --json`: its exit code and report.
fn monitor(dir: &Path, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["monitor", "--json"];
    all.extend_from_slice(args);
    let out = common::quiver(dir, &all, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), report)
}

#[test]
fn monitor_finds_injected_drift_and_stays_quiet_on_stable_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    repo(dir, FEATURES);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let (jan, feb) = (month(&mut rng, JAN, 20_000, false), month(&mut rng, FEB, 20_000, true));
    std::fs::write(dir.join("jan.jsonl"), jsonl(&jan)).unwrap();
    std::fs::write(dir.join("feb.jsonl"), jsonl(&feb)).unwrap();
    ok(dir, &["ingest", "m", "jan.jsonl"]);
    ok(dir, &["ingest", "m", "feb.jsonl"]);
    let all = "m:stable,m:shifted,m:sparse,m:mix,m:steady,m:tags";

    // February against January: the drift injected is found, and only it.
    let (code, report) =
        monitor(dir, &["--features", all, "--reference", "offline:2026-01-01..2026-02-01", "--current", "offline:2026-02-01..2026-03-01"]);
    assert_eq!(code, Some(1), "{report}");
    let expect: [(&str, &[&str]); 6] = [
        ("m:stable", &[]),
        ("m:shifted", &["psi", "ks"]),
        ("m:sparse", &["null_rate"]),
        ("m:mix", &["psi"]),
        ("m:steady", &[]),
        ("m:tags", &[]),
    ];
    for (name, want) in expect {
        assert_eq!(breaches(feature(&report, name)), want, "{name}: {}", feature(&report, name));
    }
    // Offline rows are no lookups: no NOT_FOUND rate.
    assert_eq!(feature(&report, "m:stable")["not_found_rate"], serde_json::Value::Null);
    // The statistics against a computation of our own over the same rows.
    type Column = fn(&Row) -> Option<f64>;
    let numeric: [(&str, Column); 4] = [
        ("m:stable", |r| Some(r.stable)),
        ("m:shifted", |r| Some(r.shifted)),
        ("m:sparse", |r| r.sparse.map(|v| v as f64)),
        ("m:tags", |r| Some(r.tags as f64)),
    ];
    for (name, column) in numeric {
        let f = feature(&report, name);
        let (r, c): (Vec<f64>, Vec<f64>) = (jan.iter().filter_map(column).collect(), feb.iter().filter_map(column).collect());
        let ks = f["ks"].as_f64().unwrap();
        let exact = exact_ks(&r, &c);
        assert!((ks - exact).abs() <= 0.02, "{name}: ks {ks} vs exact {exact}");
        let bins = &f["bins"];
        let edges: Vec<f64> = bins["edges"].as_array().unwrap().iter().map(|e| e.as_f64().unwrap()).collect();
        let got = |side: &str| -> Vec<f64> { bins[side].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect() };
        let (rs, cs) = (got("reference"), got("current"));
        // Each bin's share within the sketch's rank error of the share counted here.
        for (side, reported, values) in [("reference", &rs, &r), ("current", &cs, &c)] {
            for (k, (a, b)) in reported.iter().zip(shares(values, &edges)).enumerate() {
                assert!((a - b).abs() <= 0.02, "{name} {side} bin {k}: {a} vs {b} (edges {edges:?})");
            }
        }
        // PSI is exactly the formula over the reported shares, and close to PSI over
        // the shares counted here.
        let psi = f["psi"].as_f64().unwrap();
        assert!((psi - direct_psi(&rs, &cs)).abs() <= 1e-9, "{name}: psi {psi} vs {}", direct_psi(&rs, &cs));
        let counted = direct_psi(&shares(&r, &edges), &shares(&c, &edges));
        assert!((psi - counted).abs() <= 0.03 + 0.1 * counted, "{name}: psi {psi} vs counted {counted}");
    }
    // Null rates are exact; categories are counted exactly (few distinct values).
    let sparse = feature(&report, "m:sparse");
    let nulls = |rows: &[Row]| rows.iter().filter(|r| r.sparse.is_none()).count() as f64 / rows.len() as f64;
    assert!((sparse["null_rate"]["reference"].as_f64().unwrap() - nulls(&jan)).abs() < 1e-12, "{sparse}");
    assert!((sparse["null_rate"]["current"].as_f64().unwrap() - nulls(&feb)).abs() < 1e-12, "{sparse}");
    for (name, column) in [("m:mix", (|r: &Row| r.mix) as fn(&Row) -> &str), ("m:steady", |r: &Row| r.steady)] {
        let f = feature(&report, name);
        let cats = &f["categories"];
        let values: Vec<&str> = cats["values"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let share = |rows: &[Row], v: &str| rows.iter().filter(|r| column(r) == v).count() as f64 / rows.len() as f64;
        let mut rs: Vec<f64> = values[..values.len() - 1].iter().map(|v| share(&jan, v)).collect();
        let mut cs: Vec<f64> = values[..values.len() - 1].iter().map(|v| share(&feb, v)).collect();
        rs.push(0.0);
        cs.push(0.0);
        assert_eq!(values.len(), if name == "m:mix" { 4 } else { 6 }, "{f}");
        let psi = f["psi"].as_f64().unwrap();
        assert!((psi - direct_psi(&rs, &cs)).abs() <= 1e-9, "{name}: psi {psi} vs {}", direct_psi(&rs, &cs));
        assert_eq!(f["ks"], serde_json::Value::Null, "{f}");
    }

    // Two halves of January: nothing moved, nothing raised; exit 0.
    let (code, report) =
        monitor(dir, &["--features", all, "--reference", "offline:2026-01-01..2026-01-15", "--current", "offline:2026-01-15..2026-02-01"]);
    assert_eq!(code, Some(0), "{report}");
    assert!(report["features"].as_array().unwrap().iter().all(|f| f["breaches"].as_array().unwrap().is_empty()), "{report}");

    // The table, and every report stored.
    let out = common::quiver(
        dir,
        &[
            "monitor",
            "--features",
            "m:shifted,m:stable,m:shifted", // named twice: compared once
            "--reference",
            "offline:2026-01-01..2026-02-01",
            "--current",
            "offline:2026-02-01..2026-03-01",
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = |f: &str| text.lines().find(|l| l.starts_with(f)).unwrap_or_else(|| panic!("no {f} in {text}")).to_string();
    assert!(line("m:shifted").ends_with("BREACH psi, ks"), "{text}");
    assert!(line("m:stable").ends_with(" ok"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("monitor: 1 of 2 features crossed a threshold: m:shifted"));
    let stored = std::fs::read_dir(dir.join(".quiver/monitor")).unwrap().count();
    assert_eq!(stored, 3, "one report per run");

    // Refusals, each naming what is wrong.
    let range = ["--reference", "offline:2026-01-01..2026-02-01", "--current", "offline:2026-02-01..2026-03-01"];
    fn with<'a>(features: &'a str, range: &[&'a str]) -> Vec<&'a str> {
        [&["monitor", "--features", features][..], range].concat()
    }
    // Each exits 2: a comparison that could not run, told from a breach (1).
    fails_with(dir, &with("m:nope", &range), 2, &["m:nope"]);
    fails_with(
        dir,
        &with("ev:x_sum_1d", &range),
        2,
        &["`ev:x_sum_1d` is an aggregation of an event log", "offline:2026-01-01T00:00:00Z.."],
    );
    fails_with(
        dir,
        &[
            "monitor",
            "--features",
            "m:stable",
            "--reference",
            "offline:2025-01-01..2025-02-01",
            "--current",
            "offline:2026-02-01..2026-03-01",
        ],
        2,
        &["offline:2025-01-01T00:00:00Z..2025-02-01T00:00:00Z: no rows of feature view `m` have event times in the window"],
    );
    fails_with(
        dir,
        &[
            "monitor",
            "--features",
            "m:stable",
            "--reference",
            "offline:2026-02-01..2026-01-01",
            "--current",
            "offline:2026-02-01..2026-03-01",
        ],
        2,
        &["--reference `offline:2026-02-01..2026-01-01`", "is not before"],
    );
    fails_with(
        dir,
        &["monitor", "--features", "m:stable", "--reference", "yesterday", "--current", "serving:1h..now"],
        2,
        &["--reference `yesterday`", "expected training:DIR, offline:T1..T2 or serving:T1..T2"],
    );
    fails_with(
        dir,
        &["monitor", "--features", "m:stable", "--reference", "training:nowhere", "--current", "serving:1h..now"],
        2,
        &["nowhere/manifest.json"],
    );
    fails_with(
        dir,
        &["monitor", "--features", "m:stable", "--reference", "offline:2026-01-01..2026-02-01", "--current", "serving:1h..now"],
        2,
        &["nothing logged for view `m`"],
    );
    assert_eq!(std::fs::read_dir(dir.join(".quiver/monitor")).unwrap().count(), 3, "a refused run stores nothing");
}

const SERVED: &str = r#"entities:
  - {name: user, join_keys: [{name: user_id, dtype: int64}]}
feature_views:
  - name: s
    entities: [user]
    source: {timestamp_field: ts}
    monitoring: {not_found_rate: 0.1}
    features:
      - {name: score, dtype: float64}
      - {name: plan, dtype: string, monitoring: {psi: 10.0}}
feature_services:
  - {name: model, features: ["s:score", "s:plan"], monitoring: {ks: 0.2}}
"#;

#[test]
fn monitor_finds_skew_between_a_training_set_and_what_was_served() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    repo(dir, SERVED);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let plans = ["free", "pro", "team"];
    let users = 1000;
    let scores: Vec<f64> = (0..users).map(|_| rng.random::<f64>()).collect();
    let mut rows = String::new();
    for (u, score) in scores.iter().enumerate() {
        writeln!(rows, r#"{{"user_id": {u}, "ts": "2026-01-01T00:00:00Z", "score": {score:?}, "plan": "{}"}}"#, plans[u % 3]).unwrap();
    }
    std::fs::write(dir.join("s.jsonl"), rows).unwrap();
    ok(dir, &["ingest", "s", "s.jsonl"]);
    let mut spine = "user_id,event_timestamp\n".to_string();
    for u in 0..users {
        writeln!(spine, "{u},2026-01-02T00:00:00Z").unwrap();
    }
    std::fs::write(dir.join("spine.csv"), spine).unwrap();
    ok(dir, &["export", "--service", "model", "--spine", "spine.csv", "--out", "train", "--shard-rows", "300"]);
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("train/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["profile"]["s:score"]["count"], users, "{}", manifest["profile"]);
    assert_eq!(manifest["profile"]["s:plan"]["categories"]["total"], users);
    ok(dir, &["materialize", "2025-12-01T00:00:00Z", "2026-02-01T00:00:00Z"]);

    let ask = |port: u16, ids: &[usize]| {
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let body = format!(r#"{{"entities": {{"user_id": [{}]}}, "feature_service": "model"}}"#, ids.join(","));
        let (status, answer) = common::http(port, "POST", "/get-online-features", &body);
        assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
    };
    let stop = |child: std::process::Child| {
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(child.wait_with_output().unwrap().status.success());
    };
    let everyone: Vec<usize> = (0..users).collect();

    // Served as trained: quiet.
    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let (child, port) = common::spawn_serve(dir);
    for chunk in everyone.chunks(100) {
        ask(port, chunk);
    }
    stop(child);
    let served = format!("serving:{}..now", began.to_rfc3339());
    let (code, report) = monitor(dir, &["--service", "model", "--reference", "training:train", "--current", &served]);
    assert_eq!(code, Some(0), "{report}");
    let score = feature(&report, "s:score");
    assert_eq!(score["count"]["current"], users, "{score}");
    assert_eq!(score["not_found_rate"], 0.0, "{score}");
    // The same values on both sides: KS within the two sketches' errors of 0.
    assert!(score["ks"].as_f64().unwrap() <= 0.02, "{score}");
    // Limits: the feature's own, then the view's, then the service's, then the defaults.
    assert_eq!(score["limits"], serde_json::json!({"psi": 0.2, "ks": 0.2, "null_rate": 0.05, "not_found_rate": 0.1}));
    assert_eq!(feature(&report, "s:plan")["limits"]["psi"], 10.0);

    // Values that moved online (pushed there only) and users the store lacks: skew.
    let mut moved = "user_id,ts,score,plan\n".to_string();
    for (u, score) in scores.iter().enumerate() {
        writeln!(moved, "{u},2026-01-03T00:00:00Z,{},pro", score * 0.5 + 0.5).unwrap();
    }
    std::fs::write(dir.join("moved.csv"), moved).unwrap();
    ok(dir, &["push", "s", "moved.csv", "--to", "online"]);
    // After everything the first server logged.
    let began = chrono::Utc::now();
    let (child, port) = common::spawn_serve(dir);
    for chunk in everyone.chunks(100) {
        ask(port, chunk);
    }
    ask(port, &(5000..5200).collect::<Vec<_>>());
    stop(child);
    let served = format!("serving:{}..now", began.to_rfc3339());
    let (code, report) = monitor(dir, &["--service", "model", "--reference", "training:train", "--current", &served]);
    assert_eq!(code, Some(1), "{report}");
    let score = feature(&report, "s:score");
    assert_eq!(breaches(score), ["psi", "ks", "null_rate", "not_found_rate"], "{score}");
    assert!((score["not_found_rate"].as_f64().unwrap() - 200.0 / 1200.0).abs() < 1e-12, "{score}");
    assert!((score["null_rate"]["current"].as_f64().unwrap() - 200.0 / 1200.0).abs() < 1e-12, "{score}");
    // `plan` all "pro" now: PSI far over the default, under its own limit of 10.
    let plan = feature(&report, "s:plan");
    assert!(plan["psi"].as_f64().unwrap() > 1.0, "{plan}");
    assert_eq!(breaches(plan), ["null_rate", "not_found_rate"], "{plan}");

    // Continuously: `quiver serve` against the training set, the window's gauges on
    // /metrics as it serves (the exact rates equal the report's).
    let config = std::fs::read_to_string(dir.join("quiver.yaml")).unwrap();
    std::fs::write(dir.join("quiver.yaml"), format!("{config}monitoring:\n  reference: training:train\n  window: 1h\n")).unwrap();
    let (child, port) = common::spawn_serve(dir);
    for chunk in everyone.chunks(100) {
        ask(port, chunk);
    }
    ask(port, &(5000..5200).collect::<Vec<_>>());
    let gauge = |text: &str, name: &str, feature: &str| -> Option<f64> {
        let prefix = format!("{name}{{view=\"s\",version=\"1\",feature=\"{feature}\",reference=\"training:train\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().unwrap())
    };
    let started = std::time::Instant::now();
    let metrics = loop {
        let (_, text) = common::http(port, "GET", "/metrics", "");
        // The writer profiles after answering: wait for all 1,200 lookups.
        if gauge(&text, "quiver_feature_not_found_rate", "score").is_some_and(|r| (r - 200.0 / 1200.0).abs() < 1e-12) {
            break text;
        }
        assert!(started.elapsed().as_secs() < 20, "no gauges: {text}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    stop(child);
    // The served scores are the trained ones moved into (0.5, 1): KS 0.5, and PSI as
    // `quiver monitor` computed it from the log of the same answers (both count the
    // served values exactly into the reference's bins).
    let live_psi = gauge(&metrics, "quiver_feature_psi", "score").unwrap();
    assert!((live_psi - score["psi"].as_f64().unwrap()).abs() <= 1e-9, "{live_psi} vs {score}");
    assert!((gauge(&metrics, "quiver_feature_ks", "score").unwrap() - 0.5).abs() <= 0.02, "{metrics}");
    assert_eq!(gauge(&metrics, "quiver_feature_null_rate", "score"), score["null_rate"]["current"].as_f64(), "{metrics}");
    assert_eq!(gauge(&metrics, "quiver_feature_breach", "score"), Some(1.0), "{metrics}");
    assert_eq!(gauge(&metrics, "quiver_feature_ks", "plan"), None, "a category has no KS: {metrics}");
    assert!(gauge(&metrics, "quiver_feature_psi", "plan").unwrap() > 1.0, "{metrics}");
    // Without the serving log there is no serving window to keep: refused at start.
    std::fs::write(
        dir.join("quiver.yaml"),
        format!("{}monitoring:\n  reference: training:train\n", config.replace("  enabled: true", "  enabled: false")),
    )
    .unwrap();
    fails(dir, &["serve", "--port", "0"], &["monitoring.reference needs the serving log"]);
    std::fs::write(dir.join("quiver.yaml"), format!("{config}monitoring:\n  reference: training:nowhere\n")).unwrap();
    fails(dir, &["serve", "--port", "0"], &["quiver.yaml: monitoring.reference `training:nowhere`", "manifest.json"]);
    std::fs::write(dir.join("quiver.yaml"), &config).unwrap();

    // A manifest without a profile, a feature the training set lacks.
    let mut old = manifest.clone();
    old.as_object_mut().unwrap().remove("profile");
    std::fs::create_dir_all(dir.join("old")).unwrap();
    std::fs::write(dir.join("old/manifest.json"), old.to_string()).unwrap();
    fails_with(
        dir,
        &["monitor", "--service", "model", "--reference", "training:old", "--current", &served],
        2,
        &["old/manifest.json: the manifest has no profile", "export the training set again"],
    );
    let mut partial = manifest.clone();
    partial["profile"].as_object_mut().unwrap().remove("s:plan");
    std::fs::create_dir_all(dir.join("partial")).unwrap();
    std::fs::write(dir.join("partial/manifest.json"), partial.to_string()).unwrap();
    fails_with(
        dir,
        &["monitor", "--service", "model", "--reference", "training:partial", "--current", &served],
        2,
        &["has no feature `s:plan` (it holds: s:score)"],
    );
}

/// `quiver monitor`'s exit code tells a breach (1) from a comparison that could not run
/// (2, where every other command's bad input exits 1): an unknown feature, an empty
/// window, a bad window, neither `--service` nor `--features` (which names both). Its
/// `--help` names every window kind for either window.
#[test]
fn monitor_exits_1_on_a_breach_and_2_on_an_error_and_its_help_names_every_window() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    repo(dir, FEATURES);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (jan, feb) = (month(&mut rng, JAN, 3000, false), month(&mut rng, FEB, 3000, true));
    std::fs::write(dir.join("jan.jsonl"), jsonl(&jan)).unwrap();
    std::fs::write(dir.join("feb.jsonl"), jsonl(&feb)).unwrap();
    ok(dir, &["ingest", "m", "jan.jsonl"]);
    ok(dir, &["ingest", "m", "feb.jsonl"]);
    let (jan_w, feb_w) = ("offline:2026-01-01..2026-02-01", "offline:2026-02-01..2026-03-01");

    let (code, report) = monitor(dir, &["--features", "m:shifted", "--reference", jan_w, "--current", feb_w]);
    assert_eq!(code, Some(1), "a breach: {report}");
    assert_eq!(breaches(feature(&report, "m:shifted")), ["psi", "ks"]);
    let (code, report) = monitor(dir, &["--features", "m:stable", "--reference", jan_w, "--current", feb_w]);
    assert_eq!(code, Some(0), "{report}");

    fails_with(dir, &["monitor", "--features", "m:nope", "--reference", jan_w, "--current", feb_w], 2, &["m:nope"]);
    fails_with(
        dir,
        &["monitor", "--features", "m:stable", "--reference", "offline:2025-01-01..2025-02-01", "--current", feb_w],
        2,
        &["no rows of feature view `m` have event times in the window"],
    );
    fails_with(
        dir,
        &["monitor", "--features", "m:stable", "--reference", "last month", "--current", feb_w],
        2,
        &["--reference `last month`"],
    );
    // Neither names the features: a usage error (2) naming both.
    let out = common::quiver(dir, &["monitor", "--reference", jan_w, "--current", feb_w], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--service") && err.contains("--features"), "{err}");

    let help = ok(dir, &["monitor", "--help"]);
    let at = |flag: &str| help.rfind(flag).unwrap_or_else(|| panic!("no {flag} in {help}"));
    let (reference, current) =
        (&help[at("--reference <REFERENCE>")..at("--current <CURRENT>")], &help[at("--current <CURRENT>")..at("--json")]);
    for kind in ["training:DIR", "offline:T1..T2", "serving:T1..T2"] {
        assert!(reference.contains(kind), "--reference's help lacks {kind}: {reference}");
        assert!(current.contains(kind), "--current's help lacks {kind}: {current}");
    }
}

/// The same served rows, NaN and the infinities among them, through the server's live
/// window (`/metrics`) and through `quiver monitor` over the serving log: one PSI, to
/// 1e-9, equal to PSI computed here over the report's bins by a plain loop; NaN and
/// infinities are values (served as `"NaN"`, `"Infinity"`, `"-Infinity"`), not nulls,
/// counted apart on both sides and in the training set's profile.
#[test]
fn the_gauge_and_the_report_give_one_psi_for_the_same_served_rows() {
    use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    repo(dir, SERVED);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let plans = ["free", "pro", "team"];
    let users = 1000usize;
    let mut scores: Vec<Option<f64>> = (0..users).map(|_| Some(rng.random::<f64>())).collect();
    scores[..4].copy_from_slice(&[Some(f64::NAN), Some(f64::INFINITY), Some(f64::NEG_INFINITY), None]);
    let batch = RecordBatch::try_from_iter([
        ("user_id", Arc::new(Int64Array::from_iter_values(0..users as i64)) as ArrayRef),
        ("ts", Arc::new(TimestampMicrosecondArray::from_iter_values((0..users).map(|_| JAN)).with_timezone("UTC"))),
        ("score", Arc::new(Float64Array::from(scores.clone()))),
        ("plan", Arc::new(StringArray::from_iter_values((0..users).map(|u| plans[u % 3])))),
    ])
    .unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(dir.join("s.parquet")).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    ok(dir, &["ingest", "s", "s.parquet"]);
    let mut spine = "user_id,event_timestamp\n".to_string();
    for u in 0..users {
        writeln!(spine, "{u},2026-01-02T00:00:00Z").unwrap();
    }
    std::fs::write(dir.join("spine.csv"), spine).unwrap();
    ok(dir, &["export", "--service", "model", "--spine", "spine.csv", "--out", "train"]);
    ok(dir, &["materialize", "2025-12-01T00:00:00Z", "2026-02-01T00:00:00Z"]);
    // Users from 10 on served moved values (pushed online only), the first ten as trained.
    let mut moved = "user_id,ts,score,plan\n".to_string();
    let mut served: Vec<Option<f64>> = scores.clone();
    for u in 10..users {
        let x = scores[u].unwrap() * 0.5 + 0.5;
        served[u] = Some(x);
        writeln!(moved, "{u},2026-01-03T00:00:00Z,{x},pro").unwrap();
    }
    std::fs::write(dir.join("moved.csv"), moved).unwrap();
    ok(dir, &["push", "s", "moved.csv", "--to", "online"]);

    let config = std::fs::read_to_string(dir.join("quiver.yaml")).unwrap();
    std::fs::write(dir.join("quiver.yaml"), format!("{config}monitoring:\n  reference: training:train\n  window: 1h\n")).unwrap();
    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let (child, port) = common::spawn_serve(dir);
    let ask = |ids: &[usize]| {
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let body = format!(r#"{{"entities": {{"user_id": [{}]}}, "feature_service": "model"}}"#, ids.join(","));
        let (status, answer) = common::http(port, "POST", "/get-online-features", &body);
        assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
    };
    for chunk in (0..users).collect::<Vec<_>>().chunks(100) {
        ask(chunk);
    }
    ask(&(5000..5200).collect::<Vec<_>>());
    let gauge = |text: &str, name: &str, feature: &str| -> Option<f64> {
        let prefix = format!("{name}{{view=\"s\",version=\"1\",feature=\"{feature}\",reference=\"training:train\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().unwrap())
    };
    let lookups = 1200.0;
    let started = std::time::Instant::now();
    let metrics = loop {
        let (_, text) = common::http(port, "GET", "/metrics", "");
        if gauge(&text, "quiver_feature_not_found_rate", "score").is_some_and(|r| (r - 200.0 / lookups).abs() < 1e-12) {
            break text;
        }
        assert!(started.elapsed().as_secs() < 20, "no gauges: {text}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait_with_output().unwrap().status.success());

    let window = format!("serving:{}..now", began.to_rfc3339());
    let (code, report) = monitor(dir, &["--service", "model", "--reference", "training:train", "--current", &window]);
    assert_eq!(code, Some(1), "{report}");
    let score = feature(&report, "s:score");
    assert_eq!(score["count"]["current"], 1200, "{score}");
    assert!(score["bins"].get("current_error").is_none(), "counted, not read off a sketch: {score}");
    let report_psi = score["psi"].as_f64().unwrap();
    let live_psi = gauge(&metrics, "quiver_feature_psi", "score").unwrap();
    assert!((live_psi - report_psi).abs() <= 1e-9, "gauge {live_psi} vs report {report_psi}");
    let plan_psi = feature(&report, "s:plan")["psi"].as_f64().unwrap();
    assert!((gauge(&metrics, "quiver_feature_psi", "plan").unwrap() - plan_psi).abs() <= 1e-9, "{metrics}");

    // PSI over the report's bins, by hand: every finite served value in the first bin
    // whose edge is at or above it, else the last.
    let numbers = |v: &serde_json::Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
    let (edges, reference) = (numbers(&score["bins"]["edges"]), numbers(&score["bins"]["reference"]));
    let mut counts = vec![0usize; edges.len() + 1];
    for x in served.iter().flatten().filter(|x| x.is_finite()) {
        let mut k = edges.len();
        for (i, e) in edges.iter().enumerate() {
            if x <= e {
                k = i;
                break;
            }
        }
        counts[k] += 1;
    }
    let total: usize = counts.iter().sum();
    assert_eq!(total, users - 4);
    let direct: f64 = reference
        .iter()
        .zip(&counts)
        .map(|(r, k)| {
            let (r, c) = (r.max(1e-4), (*k as f64 / total as f64).max(1e-4));
            (c - r) * (c / r).ln()
        })
        .sum();
    assert!((report_psi - direct).abs() <= 1e-9, "report {report_psi} vs direct {direct}");

    // NaN and the infinities: values on every side, counted apart; the one null and the
    // 200 lookups that found nothing are the nulls.
    assert_eq!(score["non_finite_rate"], serde_json::json!({"reference": 3.0 / 1000.0, "current": 3.0 / lookups}), "{score}");
    assert_eq!(score["null_rate"], serde_json::json!({"reference": 1.0 / 1000.0, "current": 201.0 / lookups}), "{score}");
    assert_eq!(gauge(&metrics, "quiver_feature_non_finite_rate", "score"), Some(3.0 / lookups), "{metrics}");
    assert_eq!(gauge(&metrics, "quiver_feature_null_rate", "score"), Some(201.0 / lookups), "{metrics}");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("train/manifest.json")).unwrap()).unwrap();
    let trained = &manifest["profile"]["s:score"];
    let counted = (trained["nulls"].as_u64(), trained["numbers"]["nan"].as_u64(), trained["numbers"]["infinite"].as_u64());
    assert_eq!(counted, (Some(1), Some(1), Some(2)), "{trained}");
}
