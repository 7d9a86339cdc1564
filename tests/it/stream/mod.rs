//! `quiver stream` end to end against the real Kafka-protocol broker (tansu) and the
//! real Redis that `./run test` starts: the `quiver` binary runs as a child process so it
//! can be killed. Every test checks the Delta table row by row against what was
//! produced (each good message exactly once), the online store against the latest good
//! message per driver, and the dead-letter topic against the bad messages.
//!
//! Needs `QUIVER_TEST_KAFKA_BROKERS` and `QUIVER_TEST_REDIS_URL`; skipped with a message
//! without them, unless `QUIVER_REQUIRE_KAFKA` is set. tansu can take about 20 s to give a
//! consumer group its first assignment, so waits are generous.
//!
//! This file holds the harness (services, setup, producing, the `quiver stream` child,
//! the checks of both stores) and the plain end-to-end test; `crashes`, `groups` and
//! `edges` hold the rest, one test binary for all.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int64Type, TimestampMicrosecondType};
use quiver::Repo;
use quiver::online::{OnlineStore, RedisStore};
use quiver::runtime::encoding::{KeyValue, OnlineRow, Value, store_key};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::common;
mod crashes;
mod edges;
mod groups;
mod lineage;
mod versions;

use common::unique;

const BASE_TS: i64 = 1_735_689_600_000_000; // 2025-01-01T00:00:00Z
const DRIVERS: i64 = 40;
const WAIT: Duration = Duration::from_secs(150);

fn services(test: &str) -> Option<(String, String)> {
    match (std::env::var("QUIVER_TEST_KAFKA_BROKERS"), std::env::var("QUIVER_TEST_REDIS_URL")) {
        (Ok(k), Ok(r)) => Some((k, r)),
        _ => {
            assert!(
                std::env::var("QUIVER_REQUIRE_KAFKA").is_err(),
                "QUIVER_REQUIRE_KAFKA is set but QUIVER_TEST_KAFKA_BROKERS or QUIVER_TEST_REDIS_URL is not"
            );
            eprintln!(
                "SKIPPED {test}: no Kafka broker or Redis (set QUIVER_TEST_KAFKA_BROKERS and QUIVER_TEST_REDIS_URL, or use ./run test)"
            );
            None
        }
    }
}

/// A repository with one streamed view, its topic created with `partitions`.
struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    topic: String,
    project: String,
    brokers: String,
    redis: String,
}

async fn setup(name: &str, brokers: &str, redis: &str, partitions: i32) -> Setup {
    setup_with(name, brokers, redis, partitions, "").await
}

/// An event log of the same topic (docs/aggregations.md): every trip counted, summed, the latest.
const TRIP_LOG: &str = r#"  - name: trip_log
    entities: [driver]
    online: true
    source:
      timestamp_field: event_timestamp
      stream: {topic: TOPIC, format: json}
    features:
      - {name: fare, dtype: float64}
      - {name: seq, dtype: int64}
    aggregations:
      - {name: trips, function: count, column: seq, window: 1000d}
      - {name: fare_sum, function: sum, column: fare, window: 1000d}
      - {name: last_seq, function: last, column: seq, window: 1000d}
"#;

async fn setup_with(name: &str, brokers: &str, redis: &str, partitions: i32, extra_views: &str) -> Setup {
    let online = format!("online_store:\n  type: redis\n  url: {redis}\n");
    setup_in(name, brokers, redis, &online, partitions, extra_views, "offline_store:\n  path: data\n").await
}

/// As [`setup_with`], the stores where `online` and `offline` (quiver.yaml sections) put
/// them.
async fn setup_in(name: &str, brokers: &str, redis: &str, online: &str, partitions: i32, extra_views: &str, offline: &str) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    let project = unique(name);
    let topic = format!("{project}_events");
    std::fs::write(
        dir.join("quiver.yaml"),
        format!("project: {project}\nregistry: registry.json\n{offline}{online}kafka:\n  brokers: {brokers}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("features.yaml"),
        format!(
            r#"entities:
  - name: driver
    join_keys: [{{name: driver_id, dtype: int64}}]
feature_views:
  - name: trips
    entities: [driver]
    online: true
    source:
      timestamp_field: event_timestamp
      stream: {{topic: {topic}, format: json}}
    features:
      - {{name: fare, dtype: float64}}
      - {{name: seq, dtype: int64}}
      - {{name: city, dtype: string}}
{}"#,
            extra_views.replace("TOPIC", &topic)
        ),
    )
    .unwrap();
    quiver_ok(&dir, &["apply"]);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    Setup { _tmp: tmp, dir, topic, project, brokers: brokers.to_string(), redis: redis.to_string() }
}

fn quiver_ok(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver")).arg("--repo").arg(dir).args(args).output().unwrap();
    assert!(out.status.success(), "quiver {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What message `i` is: good ones carry driver `i % DRIVERS`, event time `BASE + i` s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Good,
    NotJson,
    MissingKey,
    WrongType,
    NaiveTime,
}

fn kind(i: i64) -> Kind {
    match i % 29 {
        3 => Kind::NotJson,
        11 => Kind::MissingKey,
        17 => Kind::WrongType,
        23 => Kind::NaiveTime,
        _ => Kind::Good,
    }
}

fn message(i: i64) -> String {
    let ts = chrono::DateTime::from_timestamp_micros(BASE_TS + i * 1_000_000).unwrap().to_rfc3339();
    let d = i % DRIVERS;
    match kind(i) {
        Kind::Good => {
            format!(r#"{{"driver_id": {d}, "event_timestamp": "{ts}", "fare": {}, "seq": {i}, "city": "c{}", "extra": 1}}"#, fare(i), i % 7)
        }
        Kind::NotJson => format!("driver {d} at {ts}"),
        Kind::MissingKey => format!(r#"{{"event_timestamp": "{ts}", "fare": 1.0, "seq": {i}}}"#),
        Kind::WrongType => format!(r#"{{"driver_id": {d}, "event_timestamp": "{ts}", "fare": "cheap", "seq": {i}}}"#),
        Kind::NaiveTime => format!(r#"{{"driver_id": {d}, "event_timestamp": "2025-01-01T00:00:00", "seq": {i}}}"#),
    }
}

fn fare(i: i64) -> f64 {
    // Whole and fractional values, some not exactly representable in binary.
    (i % 13) as f64 * 1.1 + if i % 2 == 0 { 0.0 } else { 0.25 }
}

/// Produces messages `range` round robin over `partitions` partitions.
async fn produce(s: &Setup, range: std::ops::Range<i64>, partitions: i32) {
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", &s.brokers).set("message.timeout.ms", "10000").create().unwrap();
    let bodies: Vec<(i64, String, String)> = range.map(|i| (i, message(i), (i % DRIVERS).to_string())).collect();
    let mut sends = Vec::new();
    for (i, body, key) in &bodies {
        let record = FutureRecord::to(&s.topic).payload(body).key(key).partition((*i % i64::from(partitions)) as i32);
        sends.push(producer.send(record, Duration::from_secs(10)));
    }
    for r in futures::future::join_all(sends).await {
        r.unwrap();
    }
}

/// A running `quiver stream` with its stderr collected in a file.
struct Streamer {
    child: Child,
    log: PathBuf,
}

fn start(s: &Setup, tag: &str, env: &[(&str, &str)]) -> Streamer {
    start_with(s, tag, env, &[])
}

fn start_with(s: &Setup, tag: &str, env: &[(&str, &str)], extra: &[&str]) -> Streamer {
    let log = s.dir.join(format!("stream-{tag}.log"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver"));
    cmd.arg("--repo").arg(&s.dir).arg("stream");
    for (flag, default) in [("--batch-rows", "100"), ("--batch-ms", "100")] {
        if !extra.contains(&flag) {
            cmd.args([flag, default]);
        }
    }
    cmd.args(extra);
    cmd.stdout(Stdio::piped()).stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    Streamer { child: cmd.spawn().unwrap(), log }
}

impl Streamer {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status and stdout (the summary line).
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let status = wait_exit(&mut self.child, Duration::from_secs(60));
        let mut out = String::new();
        self.child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        (status, out)
    }

    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(began.elapsed() < limit, "the stream did not stop within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Delta table's rows: (driver, event ts) -> (fare, seq, city), failing on duplicates.
async fn delta_rows(s: &Setup) -> (usize, BTreeMap<(i64, i64), (Option<f64>, i64, String)>) {
    let repo = Repo::open(&s.dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    let batches = quiver::offline::historical::read_view(&repo.config, &defs, &defs.feature_views[0]).await.unwrap();
    let mut rows = BTreeMap::new();
    let mut n = 0;
    for b in &batches {
        // keys, ts, seq column, fare, seq, city
        let d = b.column(0).as_primitive::<Int64Type>();
        let ts = b.column(1).as_primitive::<TimestampMicrosecondType>();
        let fare = b.column(3).as_primitive::<Float64Type>();
        let seq = b.column(4).as_primitive::<Int64Type>();
        let city = arrow::compute::cast(b.column(5), &arrow::datatypes::DataType::Utf8).unwrap();
        let city = city.as_string::<i32>();
        for r in 0..b.num_rows() {
            n += 1;
            let value = ((!fare.is_null(r)).then(|| fare.value(r)), seq.value(r), city.value(r).to_string());
            rows.insert((d.value(r), ts.value(r)), value);
        }
    }
    (n, rows)
}

/// The rows the good messages among `produced` should leave in Delta.
fn expected_rows(produced: impl Iterator<Item = i64>) -> BTreeMap<(i64, i64), (Option<f64>, i64, String)> {
    produced
        .filter(|&i| kind(i) == Kind::Good)
        .map(|i| ((i % DRIVERS, BASE_TS + i * 1_000_000), (Some(fare(i)), i, format!("c{}", i % 7))))
        .collect()
}

async fn wait_for_rows(s: &Setup, want: usize, streamers: &[&Streamer]) {
    let began = Instant::now();
    loop {
        let (n, _) = delta_rows(s).await;
        if n >= want {
            return;
        }
        if began.elapsed() > WAIT {
            let logs: Vec<String> = streamers.iter().map(|s| s.log()).collect();
            panic!("{n} of {want} rows in Delta after {WAIT:?}; stream logs:\n{}", logs.join("\n---\n"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Delta holds each good message of `produced` exactly once.
async fn assert_exactly_once(s: &Setup, produced: std::ops::Range<i64>) {
    let want = expected_rows(produced);
    let (n, rows) = delta_rows(s).await;
    assert_eq!(n, want.len(), "row count (duplicates or losses)");
    assert_eq!(rows.len(), n, "duplicate (driver, time) rows");
    assert_eq!(rows, want);
}

/// The online store holds, for every driver, its latest good message.
async fn assert_online(s: &Setup, produced: std::ops::Range<i64>) {
    if let Some(wrong) = online_mismatch(s, produced).await {
        panic!("{wrong}");
    }
}

/// Waits until the online store holds every driver's latest good message of `produced`.
async fn wait_online(s: &Setup, produced: std::ops::Range<i64>, streamers: &[&Streamer]) {
    let began = Instant::now();
    while let Some(wrong) = online_mismatch(s, produced.clone()).await {
        if began.elapsed() > WAIT {
            let logs: Vec<String> = streamers.iter().map(|s| s.log()).collect();
            panic!("{wrong} after {WAIT:?}; stream logs:\n{}", logs.join("\n---\n"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The first driver whose online row is not its latest good message of `produced`.
async fn online_mismatch(s: &Setup, produced: std::ops::Range<i64>) -> Option<String> {
    let store = quiver::online::open_store(&Repo::open(&s.dir).unwrap().config).await.unwrap();
    let mut latest: BTreeMap<i64, i64> = BTreeMap::new();
    for i in produced.filter(|&i| kind(i) == Kind::Good) {
        latest.insert(i % DRIVERS, i);
    }
    let keys: Vec<String> = latest.keys().map(|d| store_key(&s.project, "trips", &[KeyValue::Int(*d)])).collect();
    let stored = store.read(&keys).await.unwrap();
    for ((d, i), bytes) in latest.iter().zip(stored) {
        let Some(bytes) = bytes else { return Some(format!("driver {d} missing online (latest message {i})")) };
        let row = OnlineRow::decode(&bytes).unwrap();
        let want = (BASE_TS + i * 1_000_000, vec![Value::Float64(fare(*i)), Value::Int64(*i), Value::String(format!("c{}", i % 7))]);
        if (row.event_ts, &row.values) != (want.0, &want.1) {
            return Some(format!("driver {d}: online {:?} {:?}, want message {i}: {want:?}", row.event_ts, row.values));
        }
    }
    None
}

/// A GET on loopback that must answer 200; the body as text.
fn http_get(port: u16, path: &str) -> String {
    let (status, body) = common::http(port, "GET", path, "");
    assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
    body
}

/// Reads the dead-letter topic: (source partition, source offset) -> reason.
fn dead_letters(s: &Setup, want: usize) -> BTreeMap<(i32, i64), String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &s.brokers)
        .set("group.id", unique("dlqreader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&format!("{}.dlq", s.topic)]).unwrap();
    let mut out = BTreeMap::new();
    let began = Instant::now();
    while out.len() < want && began.elapsed() < WAIT {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let headers = m.headers().expect("dead letters carry headers");
            let get = |name: &str| {
                headers
                    .iter()
                    .find(|h| h.key == name)
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_else(|| panic!("header {name}"))
            };
            assert_eq!(get("quiver.source.topic"), s.topic);
            let key = (get("quiver.source.partition").parse().unwrap(), get("quiver.source.offset").parse().unwrap());
            assert!(out.insert(key, get("quiver.error")).is_none(), "dead letter {key:?} twice");
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_writes_both_stores_and_dead_letters() {
    let Some((brokers, redis)) = services("stream_writes_both_stores_and_dead_letters") else { return };
    let s = setup("sdlq", &brokers, &redis, 3).await;
    let n = 600;
    produce(&s, 0..n, 3).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let streamer = start_with(&s, "a", &[], &["--metrics-port", &port.to_string()]);
    wait_for_rows(&s, expected_rows(0..n).len(), &[&streamer]).await;
    // Every bad message is in the DLQ once, with its reason and source.
    let bad: Vec<i64> = (0..n).filter(|&i| kind(i) != Kind::Good).collect();
    let letters = dead_letters(&s, bad.len());
    assert_eq!(letters.len(), bad.len(), "dead letters");
    // Partition p holds messages p, p+3, ... at offsets 0, 1, ...
    for i in &bad {
        let key = ((i % 3) as i32, i / 3);
        let reason = letters.get(&key).unwrap_or_else(|| panic!("message {i} ({key:?}) not dead-lettered"));
        let want = match kind(*i) {
            Kind::NotJson => "not valid JSON",
            Kind::MissingKey => "join key `driver_id` is missing",
            Kind::WrongType => "feature `fare` must be float64, got \"cheap\"",
            Kind::NaiveTime => "has no time zone",
            Kind::Good => unreachable!(),
        };
        assert!(reason.contains(want), "message {i}: {reason}");
    }
    // The metrics count the same (the offsets are committed once the batch is in Delta,
    // so give the last batch a moment to finish).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = http_get(port, "/metrics");
    let metric = |name: &str| -> f64 {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or_else(|| panic!("{name} in {text}"))
    };
    assert_eq!(metric("quiver_stream_consumed_total "), n as f64);
    assert_eq!(metric("quiver_stream_dead_lettered_total "), bad.len() as f64);
    assert_eq!(metric("quiver_stream_appended_offline_total "), (n as usize - bad.len()) as f64);
    assert_eq!(metric("quiver_stream_event_to_online_seconds_count "), (n as usize - bad.len()) as f64);
    assert!(text.contains("quiver_stream_lag{topic="), "{text}");
    let (status, out) = streamer.stop();
    assert!(status.success(), "{status:?}");
    assert!(out.contains(&format!("{} dead-lettered", bad.len())), "{out}");
    assert_exactly_once(&s, 0..n).await;
    assert_online(&s, 0..n).await;
}

/// Produces raw payloads to partition 0 of the setup's topic, in order.
async fn produce_raw(s: &Setup, payloads: &[Vec<u8>]) {
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", &s.brokers).set("message.timeout.ms", "10000").create().unwrap();
    for p in payloads {
        producer.send(FutureRecord::<(), _>::to(&s.topic).payload(p).partition(0), Duration::from_secs(10)).await.unwrap();
    }
}

/// A Prometheus counter from a metrics text.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

fn wait_until(what: &str, streamers: &[&Streamer], mut done: impl FnMut() -> bool) {
    let began = Instant::now();
    while !done() {
        if began.elapsed() > WAIT {
            let logs: Vec<String> = streamers.iter().map(|s| s.log()).collect();
            panic!("{what} did not happen within {WAIT:?}; stream logs:\n{}", logs.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status().unwrap().success());
}

fn a_log_or(s: &Setup) -> String {
    std::fs::read_to_string(s.dir.join("stream-a.log")).unwrap_or_default()
}
