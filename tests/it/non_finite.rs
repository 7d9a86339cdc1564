//! NaN and the infinities end to end (docs/online.md, docs/consistency.md): read from
//! JSON lines and `/push` in the text the server answers them in, served `PRESENT` as
//! `"NaN"`, `"Infinity"`, `"-Infinity"` (stored and on-demand features alike, as Feast's
//! server answers them), printed by `quiver online`, and compared by `verify`: a NaN
//! online and offline agree, a NaN against a null or an infinity does not.

use std::path::Path;
use std::process::Output;

use serde_json::json;

use crate::common;

use quiver::online::{EmbeddedStore, OnlineStore, WriteRow};
use quiver::runtime::encoding::{KeyValue, OnlineRow, Value, store_key};

fn quiver(dir: &Path, args: &[&str]) -> Output {
    common::quiver(dir, args, &[])
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The verify table's numbers for one feature: compared, matches, mismatches, missing
/// online, missing offline.
fn numbers(out: &str, feature: &str) -> Vec<u64> {
    let line = out.lines().find(|l| l.split_whitespace().next() == Some(feature)).unwrap_or_else(|| panic!("no {feature} in {out}"));
    line.split_whitespace().skip(1).map(|n| n.parse().unwrap()).collect()
}

const FEATURES: &str = r#"entities:
  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}
feature_views:
  - name: trips
    entities: [rider]
    ttl: 1d
    source: {timestamp_field: event_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: rating, dtype: float32}
      - {name: emb, dtype: list<float64>}
on_demand_views:
  - name: scored
    inputs: [trips]
    features:
      - {name: double_fare, dtype: float64, expr: "trips.fare * 2"}
"#;

const ASK: &str = r#"["trips:fare", "trips:rating", "trips:emb", "scored:double_fare"]"#;

/// `quiver serve` until `requests` (path, body) have been answered, each with the
/// status line given; SIGTERM flushes the serving log. The answers' bodies.
fn serve(repo: &Path, requests: &[(&str, String, &str)]) -> Vec<serde_json::Value> {
    let (child, port) = common::spawn_serve(repo);
    let answers = requests
        .iter()
        .map(|(path, body, want)| {
            let (status, answer) = common::http(port, "POST", path, body);
            assert_eq!(status, *want, "{path} {body}: {answer}");
            serde_json::from_str::<serde_json::Value>(&answer).unwrap()
        })
        .collect();
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_and_infinities_are_served_as_strings_and_verified() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(
        repo.join("quiver.yaml"),
        "project: nonfinite\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\nserving_log:\n  enabled: true\n  batch_ms: 100\n",
    )
    .unwrap();
    std::fs::write(repo.join("features.yaml"), FEATURES).unwrap();
    assert!(quiver(&repo, &["apply"]).status.success());

    // JSON lines take the server's text for NaN and the infinities, in float features
    // of both widths and in float lists; any other text for a float is still refused.
    let at = (chrono::Utc::now() - chrono::TimeDelta::hours(2)).to_rfc3339();
    let lines = [
        format!(r#"{{"rider_id": 1, "event_timestamp": "{at}", "fare": "NaN", "rating": "Infinity", "emb": ["NaN", 1.0]}}"#),
        format!(r#"{{"rider_id": 2, "event_timestamp": "{at}", "fare": "Infinity", "rating": "-Infinity", "emb": ["-Infinity"]}}"#),
        format!(r#"{{"rider_id": 3, "event_timestamp": "{at}", "fare": "-Infinity", "rating": 2.5, "emb": [2.0]}}"#),
        format!(r#"{{"rider_id": 4, "event_timestamp": "{at}", "fare": null, "rating": null, "emb": null}}"#),
        format!(r#"{{"rider_id": 5, "event_timestamp": "{at}", "fare": 1.5, "rating": 0.5, "emb": []}}"#),
    ];
    std::fs::write(repo.join("trips.jsonl"), lines.join("\n") + "\n").unwrap();
    let ingested = quiver(&repo, &["ingest", "trips", "trips.jsonl"]);
    assert!(ingested.status.success(), "{:?}", text(&ingested));
    std::fs::write(repo.join("bad.jsonl"), format!("{{\"rider_id\": 9, \"event_timestamp\": \"{at}\", \"fare\": \"nan\"}}\n")).unwrap();
    common::fails(&repo, &["ingest", "trips", "bad.jsonl"], &["row 1", r#"feature `fare` must be float64, got "nan""#]);
    assert!(quiver(&repo, &["materialize", "2000-01-01T00:00:00Z", "now"]).status.success());

    // `verify --sample`: a NaN online and a NaN offline are the same value.
    let sampled = quiver(&repo, &["verify", "--sample", "100"]);
    let (out, err) = text(&sampled);
    assert!(sampled.status.success(), "{out}{err}");
    for f in ["trips:fare", "trips:rating", "trips:emb", "scored:double_fare"] {
        assert_eq!(numbers(&out, f), vec![5, 5, 0, 0, 0], "{f}: {out}");
    }

    // `quiver online` prints them, as a value with status PRESENT.
    let shown = common::ok(&repo, &["online", "--features", "trips:fare,scored:double_fare", "--entity", "rider_id=2"]);
    for name in ["trips__fare", "scored__double_fare"] {
        let line = shown.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{shown}"));
        assert!(line.contains("PRESENT") && line.to_lowercase().contains("inf") && !line.contains("null"), "{line}");
    }
    let shown = common::ok(&repo, &["online", "--features", "trips:fare", "--entity", "rider_id=1"]);
    assert!(shown.contains("NaN") && shown.contains("PRESENT"), "{shown}");

    // `/push` takes the same text; the server answers every NaN and infinity as a
    // string, PRESENT, never as null; on-demand features computed from them too.
    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let fresh = (chrono::Utc::now() - chrono::TimeDelta::seconds(30)).to_rfc3339();
    let push = format!(
        r#"{{"feature_view": "trips", "df": {{"rider_id": [6], "event_timestamp": ["{fresh}"], "fare": ["NaN"], "rating": ["-Infinity"], "emb": [["Infinity", 0.5]]}}}}"#
    );
    let bad_push = format!(
        r#"{{"feature_view": "trips", "df": {{"rider_id": [7], "event_timestamp": ["{fresh}"], "fare": ["Inf"], "rating": [1.0], "emb": [null]}}}}"#
    );
    let ask = format!(r#"{{"entities": {{"rider_id": [1, 2, 3, 4, 5, 6]}}, "features": {ASK}}}"#);
    let answers = serve(
        &repo,
        &[
            ("/push", push, "HTTP/1.1 200 OK"),
            ("/push", bad_push, "HTTP/1.1 400 Bad Request"),
            ("/get-online-features", ask, "HTTP/1.1 200 OK"),
        ],
    );
    assert_eq!(answers[0]["rows"], 1, "{}", answers[0]);
    assert!(answers[1]["error"].as_str().unwrap().contains("row 1: feature `fare` must be float64, got \"Inf\""), "{}", answers[1]);
    let r = &answers[2]["results"];
    assert_eq!(r[1]["values"], json!(["NaN", "Infinity", "-Infinity", null, 1.5, "NaN"]), "{}", answers[2]);
    assert_eq!(r[1]["statuses"], json!(["PRESENT", "PRESENT", "PRESENT", "NULL_VALUE", "PRESENT", "PRESENT"]));
    assert_eq!(r[2]["values"], json!(["Infinity", "-Infinity", 2.5, null, 0.5, "-Infinity"]), "{}", answers[2]);
    assert_eq!(r[3]["values"], json!([["NaN", 1.0], ["-Infinity"], [2.0], null, [], ["Infinity", 0.5]]), "{}", answers[2]);
    assert_eq!(r[4]["values"], json!(["NaN", "Infinity", "-Infinity", null, 3.0, "NaN"]), "{}", answers[2]);
    assert_eq!(r[4]["statuses"], json!(["PRESENT", "PRESENT", "PRESENT", "NULL_VALUE", "PRESENT", "PRESENT"]));

    // `verify --since`: what was served, NaN and infinities included, is what the
    // offline join gives.
    let agree = quiver(&repo, &["verify", "--since", &began.to_rfc3339()]);
    let (out, err) = text(&agree);
    assert!(agree.status.success(), "{out}{err}");
    for f in ["trips:fare", "trips:rating", "trips:emb", "scored:double_fare"] {
        assert_eq!(numbers(&out, f), vec![6, 6, 0, 0, 0], "{f}: {out}");
    }

    // Three fares changed behind the offline store's back, same times (equal replaces):
    // NaN -> +inf, -inf -> NaN, null -> NaN. Each is a mismatch, of the stored feature
    // and of the on-demand one computed from it; the other features still agree.
    {
        let store = EmbeddedStore::open(&repo.join("online.db")).unwrap();
        for (rider, fare) in [(1, f64::INFINITY), (3, f64::NAN), (4, f64::NAN)] {
            let key = store_key("nonfinite", "trips", &[KeyValue::Int(rider)]);
            let got = store.read(std::slice::from_ref(&key)).await.unwrap();
            let mut row = OnlineRow::decode(got[0].as_ref().expect("materialized")).unwrap();
            row.values[0] = Value::Float64(fare);
            assert_eq!(store.write(&[WriteRow { key, row: row.encode(), expire_at_ms: None }]).await.unwrap(), 1);
        }
    }
    let began = chrono::Utc::now() - chrono::TimeDelta::milliseconds(10);
    let ask = format!(r#"{{"entities": {{"rider_id": [1, 2, 3, 4, 5]}}, "features": {ASK}}}"#);
    let answers = serve(&repo, &[("/get-online-features", ask, "HTTP/1.1 200 OK")]);
    assert_eq!(answers[0]["results"][1]["values"], json!(["Infinity", "Infinity", "NaN", "NaN", 1.5]), "{}", answers[0]);
    let wrong = quiver(&repo, &["verify", "--since", &began.to_rfc3339()]);
    let (out, err) = text(&wrong);
    assert_eq!(wrong.status.code(), Some(1), "{out}{err}");
    assert_eq!(numbers(&out, "trips:fare"), vec![5, 2, 3, 0, 0], "{out}");
    assert_eq!(numbers(&out, "scored:double_fare"), vec![5, 2, 3, 0, 0], "{out}");
    assert_eq!(numbers(&out, "trips:rating"), vec![5, 5, 0, 0, 0], "{out}");
    assert_eq!(numbers(&out, "trips:emb"), vec![5, 5, 0, 0, 0], "{out}");
    // trips:fare's examples: the indented lines under its row of the table.
    let examples: Vec<&str> =
        out.lines().skip_while(|l| !l.starts_with("trips:fare ")).skip(1).take_while(|l| l.starts_with("    ")).collect();
    let example = |rider: i64| {
        let marker = format!(r#"mismatch: {{"rider_id":{rider}}} at "#);
        examples.iter().find(|l| l.contains(&marker)).unwrap_or_else(|| panic!("no {marker} in {out}")).to_string()
    };
    // An infinity served where the training set holds a NaN (both were null before).
    let one = example(1);
    assert!(one.contains(r#"served PRESENT "Infinity" (event "#) && one.contains(r#"offline PRESENT "NaN" (event "#), "{one}");
    let three = example(3);
    assert!(three.contains(r#"served PRESENT "NaN" (event "#) && three.contains(r#"offline PRESENT "-Infinity" (event "#), "{three}");
    // A NaN served where the training set holds a null.
    let four = example(4);
    assert!(four.contains(r#"served PRESENT "NaN" (event "#) && four.contains("offline NULL_VALUE null (event "), "{four}");
}
