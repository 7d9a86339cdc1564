//! A stream feeds every live version of a view that reads its topic (docs/versions.md):
//! after a breaking change makes `trips@2`, one `quiver stream` writes each good message
//! once into each version's own table and keys, version 1 going on from where it was.

use std::collections::BTreeMap;

use arrow::array::AsArray;
use arrow::datatypes::{Float64Type, Int64Type, TimestampMicrosecondType};
use quiver::Repo;
use quiver::runtime::encoding::{KeyValue, OnlineRow, Value, store_key};

use super::{BASE_TS, DRIVERS, Kind, fare, kind, produce, quiver_ok, services, setup, start, wait_for_rows};

/// Version `version` of `trips`'s table: (driver, event time) -> (fare, seq as f64),
/// and how many rows it holds (duplicates counted).
async fn rows_of(dir: &std::path::Path, version: u32) -> (usize, BTreeMap<(i64, i64), (f64, f64)>) {
    let repo = Repo::open(dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    let view = defs.feature_view(&format!("trips@{version}")).unwrap();
    let batches = quiver::offline::historical::read_view(&repo.config, &defs, view).await.unwrap();
    let (mut n, mut rows) = (0, BTreeMap::new());
    for b in &batches {
        let d = b.column(0).as_primitive::<Int64Type>();
        let ts = b.column(1).as_primitive::<TimestampMicrosecondType>();
        let fare = b.column(3).as_primitive::<Float64Type>();
        let seq = arrow::compute::cast(b.column(4), &arrow::datatypes::DataType::Float64).unwrap();
        let seq = seq.as_primitive::<Float64Type>();
        for r in 0..b.num_rows() {
            n += 1;
            rows.insert((d.value(r), ts.value(r)), (fare.value(r), seq.value(r)));
        }
    }
    (n, rows)
}

/// Until version 1 holds every good message of 0..400 and version 2 those of 200..400.
async fn wait_for_both(dir: &std::path::Path, stream: &super::Streamer) {
    let began = std::time::Instant::now();
    loop {
        let (n1, _) = rows_of(dir, 1).await;
        let (n2, _) = rows_of(dir, 2).await;
        if n1 >= expected(0..400).len() && n2 >= expected(200..400).len() {
            return;
        }
        assert!(began.elapsed() < super::WAIT, "{n1} / {n2} rows after {:?}; log:\n{}", super::WAIT, stream.log());
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

fn expected(produced: std::ops::Range<i64>) -> BTreeMap<(i64, i64), (f64, f64)> {
    produced.filter(|&i| kind(i) == Kind::Good).map(|i| ((i % DRIVERS, BASE_TS + i * 1_000_000), (fare(i), i as f64))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_feeds_every_live_version_of_a_view_once_each() {
    let Some((brokers, redis)) = services("a_stream_feeds_every_live_version_of_a_view_once_each") else { return };
    let s = setup("sver", &brokers, &redis, 2).await;
    produce(&s, 0..200, 2).await;
    let first = start(&s, "v1", &[]);
    wait_for_rows(&s, expected(0..200).len(), &[&first]).await;
    let (status, _) = first.stop();
    assert!(status.success());

    // A breaking change: `seq` becomes a float. Version 2 beside version 1.
    let yaml = std::fs::read_to_string(s.dir.join("features.yaml")).unwrap();
    std::fs::write(s.dir.join("features.yaml"), yaml.replace("{name: seq, dtype: int64}", "{name: seq, dtype: float64}")).unwrap();
    let out = quiver_ok(&s.dir, &["apply"]);
    assert!(out.contains("^ feature_view trips: version 2 beside version 1"), "{out}");

    produce(&s, 200..400, 2).await;
    let second = start(&s, "v2", &[]);
    wait_for_both(&s.dir, &second).await;
    let (status, _) = second.stop();
    assert!(status.success());
    // Each version holds each good message it read exactly once: version 1 all of them,
    // version 2 those produced after it was made (the group's committed offsets were
    // there; a batch the first run wrote but had not committed may be read again, which
    // version 1's table refuses as already appended and version 2 takes).
    let (n1, rows1) = rows_of(&s.dir, 1).await;
    assert_eq!((n1, &rows1), (expected(0..400).len(), &expected(0..400)));
    let (n2, rows2) = rows_of(&s.dir, 2).await;
    assert_eq!(n2, rows2.len(), "duplicates in version 2");
    assert!(expected(200..400).iter().all(|(k, v)| rows2.get(k) == Some(v)), "version 2 lacks a message produced after it");
    assert!(rows2.iter().all(|(k, v)| rows1.get(k) == Some(v)), "version 2 holds a row no message gave");
    // Online: each version's keys hold its latest message, each in its own types.
    let store = quiver::online::open_store(&Repo::open(&s.dir).unwrap().config).await.unwrap();
    let i = (200..400).rev().find(|&i| kind(i) == Kind::Good && i % DRIVERS == 5).unwrap();
    let read = |view: &str| store_key(&s.project, view, &[KeyValue::Int(5)]);
    let got = store.read(&[read("trips"), read("trips@2")]).await.unwrap();
    let one = OnlineRow::decode(got[0].as_ref().unwrap()).unwrap();
    let two = OnlineRow::decode(got[1].as_ref().unwrap()).unwrap();
    assert_eq!(one.values[..2], [Value::Float64(fare(i)), Value::Int64(i)]);
    assert_eq!(two.values[..2], [Value::Float64(fare(i)), Value::Float64(i as f64)]);
    assert_eq!((one.event_ts, two.event_ts), (BASE_TS + i * 1_000_000, BASE_TS + i * 1_000_000));
}

/// A running stream (started without naming views) feeds a version made while it runs
/// from its next batch on, without a restart: messages read before go to version 1
/// alone, those after to both, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_stream_feeds_a_version_made_while_it_runs() {
    let Some((brokers, redis)) = services("a_running_stream_feeds_a_version_made_while_it_runs") else { return };
    let s = setup("sverlive", &brokers, &redis, 2).await;
    produce(&s, 0..200, 2).await;
    let stream = start(&s, "live", &[]);
    wait_for_rows(&s, expected(0..200).len(), &[&stream]).await;

    let yaml = std::fs::read_to_string(s.dir.join("features.yaml")).unwrap();
    std::fs::write(s.dir.join("features.yaml"), yaml.replace("{name: seq, dtype: int64}", "{name: seq, dtype: float64}")).unwrap();
    let out = quiver_ok(&s.dir, &["apply"]);
    assert!(out.contains("^ feature_view trips: version 2 beside version 1"), "{out}");
    let began = std::time::Instant::now();
    while !stream.log().contains("feeding trips@2 from") {
        assert!(began.elapsed() < super::WAIT, "the stream did not pick up version 2; log:\n{}", stream.log());
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    produce(&s, 200..400, 2).await;
    wait_for_both(&s.dir, &stream).await;
    let (status, _) = stream.stop();
    assert!(status.success());
    let (n1, rows1) = rows_of(&s.dir, 1).await;
    assert_eq!((n1, &rows1), (expected(0..400).len(), &expected(0..400)));
    let (n2, rows2) = rows_of(&s.dir, 2).await;
    assert_eq!((n2, &rows2), (expected(200..400).len(), &expected(200..400)), "version 2: exactly what was read after it was made");
}
