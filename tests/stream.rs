//! `quiver stream` end to end against the real Kafka-protocol broker (tansu) and the
//! real Redis that `./run test` starts: the `quiver` binary runs as a child process so it
//! can be killed. Every test checks the Delta table row by row against what was
//! produced (each good message exactly once), the online store against the latest good
//! message per driver, and the dead-letter topic against the bad messages.
//!
//! Needs `QUIVER_TEST_KAFKA_BROKERS` and `QUIVER_TEST_REDIS_URL`; skipped with a message
//! without them, unless `QUIVER_REQUIRE_KAFKA` is set. tansu can take about 20 s to give a
//! consumer group its first assignment, so waits are generous.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int64Type, TimestampMicrosecondType};
use quiver::Repo;
use quiver::online::{OnlineStore, RedisStore};
use quiver::sdk::encoding::{KeyValue, OnlineRow, Value, store_key};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};

mod common;

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

/// An event log of the same topic (SPEC §11): every trip counted, summed, the latest.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_is_exactly_once_across_crashes() {
    let Some((brokers, redis)) = services("stream_is_exactly_once_across_crashes") else { return };
    let s = setup("scrash", &brokers, &redis, 2).await;
    produce(&s, 0..1000, 2).await;
    // 1. Abort right after the third batch reached both stores, before its offsets are
    //    committed to Kafka: the restart replays that batch, which Delta already holds.
    let a = start(&s, "a", &[("QUIVER_STREAM_ABORT_AFTER_DELTA", "3")]);
    let mut child = a;
    let status = wait_exit(&mut child.child, WAIT);
    assert!(!status.success(), "the hook aborts the process");
    assert!(child.log().contains("aborting before the offset commit"), "{}", child.log());
    let (before, _) = delta_rows(&s).await;
    assert!(before > 0 && before < expected_rows(0..1000).len(), "aborted mid-stream with {before} rows");
    // 2. Restart, let it work, kill -9 in the middle of more messages, restart again.
    let b = start(&s, "b", &[]);
    wait_for_rows(&s, expected_rows(0..1000).len(), &[&b]).await;
    produce(&s, 1000..3000, 2).await;
    wait_for_rows(&s, expected_rows(0..1000).len() + 50, &[&b]).await;
    b.kill9();
    let c = start(&s, "c", &[]);
    wait_for_rows(&s, expected_rows(0..3000).len(), &[&c]).await;
    // Give a duplicate the chance to show up before checking.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, _) = c.stop();
    assert!(status.success());
    assert_exactly_once(&s, 0..3000).await;
    assert_online(&s, 0..3000).await;
}

/// The stream on Delta tables in an object store (SPEC §12): a crash between the Delta
/// commit and the offset commit replays a batch the S3 table already holds, and every
/// message still lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_on_s3_tables_is_exactly_once_across_a_crash() {
    let test = "stream_on_s3_tables_is_exactly_once_across_a_crash";
    let Some((brokers, redis)) = services(test) else { return };
    let Some(common::S3 { section: offline, .. }) = common::s3_offline_store(test, &unique("stream")) else { return };
    let online = format!("online_store:\n  type: redis\n  url: {redis}\n");
    let s = setup_in("s3crash", &brokers, &redis, &online, 2, "", &offline).await;
    assert!(!s.dir.join("data").exists());
    produce(&s, 0..1000, 2).await;
    let mut a = start(&s, "a", &[("QUIVER_STREAM_ABORT_AFTER_DELTA", "3")]);
    let status = wait_exit(&mut a.child, WAIT);
    assert!(!status.success(), "the hook aborts the process");
    assert!(a.log().contains("aborting before the offset commit"), "{}", a.log());
    let (before, _) = delta_rows(&s).await;
    assert!(before > 0 && before < expected_rows(0..1000).len(), "aborted mid-stream with {before} rows");
    let b = start(&s, "b", &[]);
    wait_for_rows(&s, expected_rows(0..1000).len(), &[&b]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, _) = b.stop();
    assert!(status.success());
    assert_exactly_once(&s, 0..1000).await;
    assert_online(&s, 0..1000).await;
}

/// The event log's online answers at `now` for every driver: each good message of
/// `produced` counted exactly once (a crash replays batches: none counted twice, none
/// lost), and equal to the offline answer for a spine row at `now`.
async fn assert_event_log(s: &Setup, produced: std::ops::Range<i64>) {
    use quiver::sdk::FeatureRef;
    let repo = Repo::open(&s.dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    let store = RedisStore::connect(&s.redis).await.unwrap();
    let refs: Vec<FeatureRef> = ["trips", "fare_sum", "last_seq"].iter().map(|a| FeatureRef::new("trip_log", *a)).collect();
    let drivers: Vec<i64> = (0..DRIVERS).collect();
    let entities = vec![("driver_id".to_string(), drivers.iter().map(|&d| KeyValue::Int(d)).collect())];
    let now = chrono::Utc::now().timestamp_micros();
    let online = quiver::online::lookup::get_online_features(&store, &s.project, &defs, &refs, &entities, now, true).await.unwrap();
    let spine = arrow::array::RecordBatch::try_from_iter([
        ("driver_id", std::sync::Arc::new(arrow::array::Int64Array::from(drivers.clone())) as arrow::array::ArrayRef),
        (
            "event_timestamp",
            std::sync::Arc::new(arrow::array::TimestampMicrosecondArray::from(vec![now; drivers.len()]).with_timezone("UTC")),
        ),
    ])
    .unwrap();
    let requests = quiver::offline::historical::resolve(&defs, &refs).unwrap();
    let rows = quiver::offline::historical::SpineRows { source: "spine", rows: &spine };
    let kernel = quiver::gpu_join::CpuKernel::new();
    let options = quiver::offline::historical::HistoricalOptions::default();
    let offline =
        quiver::offline::historical::historical(&repo.config, &defs, rows, &requests, options, &kernel, &|_, _| {}).await.unwrap();
    for (k, d) in drivers.iter().enumerate() {
        let good: Vec<i64> = produced.clone().filter(|&i| kind(i) == Kind::Good && i % DRIVERS == *d).collect();
        let sum: f64 = good.iter().map(|&i| fare(i)).sum();
        assert_eq!(online[1].values[k], Value::Int64(good.len() as i64), "driver {d}: trips");
        let Value::Float64(got) = online[2].values[k] else { panic!("driver {d}: fare_sum {:?}", online[2].values[k]) };
        assert!((got - sum).abs() <= 1e-9 * sum.abs(), "driver {d}: fare_sum {got} vs {sum}");
        assert_eq!(online[3].values[k], Value::Int64(*good.last().unwrap()), "driver {d}: last_seq");
        for (j, r) in refs.iter().enumerate() {
            let dtype = defs.feature_view("trip_log").unwrap().served_feature(&r.feature).unwrap().dtype;
            let off = quiver::offline::schema::value_at(offline.column(2 + j).as_ref(), k, dtype);
            match (&online[1 + j].values[k], &off) {
                (Value::Float64(a), Value::Float64(b)) => assert!((a - b).abs() <= 1e-9 * a.abs(), "{r} driver {d}"),
                (a, b) => assert_eq!(a, b, "{r} driver {d}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_log_counts_each_event_once_across_crashes() {
    let Some((brokers, redis)) = services("an_event_log_counts_each_event_once_across_crashes") else { return };
    let s = setup_with("elog", &brokers, &redis, 2, TRIP_LOG).await;
    produce(&s, 0..600, 2).await;
    // 1. Abort after the second batch reached both tables and the online records,
    //    before its offsets are committed: the restart reads it again.
    let mut a = start(&s, "a", &[("QUIVER_STREAM_ABORT_AFTER_DELTA", "2")]);
    let status = wait_exit(&mut a.child, WAIT);
    assert!(!status.success(), "the hook aborts the process");
    // 2. Restart, kill -9 in the middle of more messages, restart again.
    let b = start(&s, "b", &[]);
    wait_for_rows(&s, expected_rows(0..600).len(), &[&b]).await;
    produce(&s, 600..1800, 2).await;
    wait_for_rows(&s, expected_rows(0..600).len() + 40, &[&b]).await;
    b.kill9();
    let c = start(&s, "c", &[]);
    wait_for_rows(&s, expected_rows(0..1800).len(), &[&c]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, _) = c.stop();
    assert!(status.success());
    assert_exactly_once(&s, 0..1800).await;
    assert_event_log(&s, 0..1800).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_in_a_group_split_the_partitions() {
    let Some((brokers, redis)) = services("two_streams_in_a_group_split_the_partitions") else { return };
    group_splits_partitions(setup("sgroup", &brokers, &redis, 4).await).await;
}

/// The same on a Redis Cluster as the online store (SPEC §12): the processes share the
/// partitions, each message once in Delta, each driver's latest row on its slot's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_share_the_partitions_on_a_redis_cluster() {
    let test = "two_streams_share_the_partitions_on_a_redis_cluster";
    let Some((brokers, redis)) = services(test) else { return };
    let Some((urls, _)) = common::redis_cluster(test) else { return };
    let online = format!("online_store:\n  type: redis_cluster\n  urls: [{}]\n", urls.join(", "));
    let s = setup_in("sgroupcl", &brokers, &redis, &online, 4, "", "offline_store:\n  path: data\n").await;
    group_splits_partitions(s).await;
}

/// Two `quiver stream` processes of one group on `s`'s 4 partitions: each holds some,
/// none twice, every message consumed once, Delta and the online store as expected.
async fn group_splits_partitions(s: Setup) {
    let a = start(&s, "a", &[]);
    let b = start(&s, "b", &[]);
    // Wait until the group settled: each process holds some partitions, none twice.
    let held = |log: &str| {
        let mut set = BTreeSet::new();
        for line in log.lines() {
            if let Some(p) = line.strip_prefix("assigned ") {
                set.insert(p.to_string());
            } else if let Some(p) = line.strip_prefix("revoked ") {
                set.remove(p);
            }
        }
        set
    };
    let began = Instant::now();
    loop {
        let (ha, hb) = (held(&a.log()), held(&b.log()));
        if !ha.is_empty() && !hb.is_empty() && ha.is_disjoint(&hb) && ha.len() + hb.len() == 4 {
            break;
        }
        assert!(began.elapsed() < WAIT, "the group did not settle:\n{}\n---\n{}", a.log(), b.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    produce(&s, 0..2000, 4).await;
    wait_for_rows(&s, expected_rows(0..2000).len(), &[&a, &b]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (sa, out_a) = a.stop();
    let (sb, out_b) = b.stop();
    assert!(sa.success() && sb.success());
    let consumed =
        |out: &str| -> u64 { out.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("summary: {out}")) };
    let (ca, cb) = (consumed(&out_a), consumed(&out_b));
    assert!(ca > 0 && cb > 0, "both consumed: {ca} and {cb}");
    assert_eq!(ca + cb, 2000, "each message consumed once across the group");
    assert_exactly_once(&s, 0..2000).await;
    assert_online(&s, 0..2000).await;
}

/// A private Redis on a free port, to stop and restart.
struct PrivateRedis {
    port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start(port: u16) -> PrivateRedis {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let began = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(began.elapsed() < Duration::from_secs(10), "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        PrivateRedis { port, child: Some(child) }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private Redis, a setup streaming into it, and a stream that has messages 0..400 in
/// both stores.
async fn streaming_400_on_a_private_redis(brokers: &str, tag: &str) -> (PrivateRedis, Setup, Streamer) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let redis = PrivateRedis::start(port);
    let s = setup(tag, brokers, &format!("redis://127.0.0.1:{port}/0"), 2).await;
    let streamer = start(&s, "a", &[]);
    produce(&s, 0..400, 2).await;
    wait_for_rows(&s, expected_rows(0..400).len(), &[&streamer]).await;
    (redis, s, streamer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_survives_redis_restart_without_loss() {
    let Some((brokers, _)) = services("stream_survives_redis_restart_without_loss") else { return };
    let (mut redis, s, streamer) = streaming_400_on_a_private_redis(&brokers, "sredis").await;
    // Redis goes away; more messages arrive; nothing is committed while it is down: the
    // batch in flight may reach Delta (written beside the online write, which retries),
    // the batches after it wait.
    redis.stop();
    produce(&s, 400..1000, 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (during, _) = delta_rows(&s).await;
    let before = expected_rows(0..400).len();
    assert!(during <= before + 100, "at most one batch (100 messages) goes on while Redis is down: {during} rows, {before} before");
    assert!(streamer.log().contains("failed"), "the outage is reported: {}", streamer.log());
    // It comes back (empty: no persistence); the stream catches up on its own.
    let _redis = PrivateRedis::start(redis.port);
    wait_for_rows(&s, expected_rows(0..1000).len(), &[&streamer]).await;
    let (status, _) = streamer.stop();
    assert!(status.success());
    assert_exactly_once(&s, 0..1000).await;
    // Messages 400.. came after the restart and carry every driver's latest event.
    assert_online(&s, 400..1000).await;
}

/// A crash after a batch reached Delta but before its online write did (Redis down, the
/// online write retrying): the next start reads those messages again as ones Delta
/// already holds, appends nothing and writes them online.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_delta_commit_and_the_online_write_loses_nothing_online() {
    let test = "a_crash_between_the_delta_commit_and_the_online_write_loses_nothing_online";
    let Some((brokers, _)) = services(test) else { return };
    let (mut redis, s, a) = streaming_400_on_a_private_redis(&brokers, "sgap").await;
    redis.stop();
    // One message per driver: whatever reaches Delta is its driver's latest.
    produce(&s, 400..400 + DRIVERS, 2).await;
    wait_for_rows(&s, expected_rows(0..400).len() + 1, &[&a]).await;
    a.kill9();
    let (in_delta, _) = delta_rows(&s).await;
    // Redis comes back empty (no persistence): only the new messages are checked online.
    let _redis = PrivateRedis::start(redis.port);
    let b = start(&s, "b", &[]);
    wait_for_rows(&s, expected_rows(0..400 + DRIVERS).len(), &[&b]).await;
    wait_online(&s, 400..400 + DRIVERS, &[&b]).await;
    let (status, _) = b.stop();
    assert!(status.success());
    assert!(in_delta > expected_rows(0..400).len(), "the crash came after a Delta commit");
    assert_exactly_once(&s, 0..400 + DRIVERS).await;
    assert_online(&s, 400..400 + DRIVERS).await;
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

/// SPEC §13 / issue 14: a consumer that lost its partition while holding a batch (here
/// SIGSTOPped past the session timeout while another member took over and wrote the
/// same messages) never appends that batch again, nor records a stale offset: Delta
/// holds each message once and the partition's `txn` version is the last offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_consumer_never_appends_over_its_successor() {
    let Some((brokers, redis)) = services("a_paused_consumer_never_appends_over_its_successor") else { return };
    let s = setup("sfence", &brokers, &redis, 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // A holds its batch for 4 s before it is due.
    let a = start_with(&s, "a", &[], &["--batch-rows", "100000", "--batch-ms", "4000", "--metrics-port", &port.to_string()]);
    wait_until("A's assignment", &[&a], || a.log().contains("assigned "));
    produce(&s, 0..300, 1).await;
    wait_until("A reading the 300 messages", &[&a], || {
        let (status, body) = common::http(port, "GET", "/metrics", "");
        status.contains("200") && counter(&body, "quiver_stream_consumed_total") >= 300.0
    });
    signal(&a.child, "STOP");
    // Past the session timeout (10 s) the broker gives the partition to B.
    std::thread::sleep(Duration::from_secs(13));
    let b = start(&s, "b", &[]);
    wait_for_rows(&s, expected_rows(0..300).len(), &[&a, &b]).await;
    // B has written and committed everything; A wakes up with its stale batch.
    std::thread::sleep(Duration::from_secs(2));
    signal(&a.child, "CONT");
    // A's batch is overdue: it flushes (or learns of the lost partition) at once.
    std::thread::sleep(Duration::from_secs(8));
    let a_log = a.log();
    let (sa, _) = a.stop();
    let (sb, _) = b.stop();
    assert_exactly_once(&s, 0..300).await;
    assert!(sa.success() && sb.success(), "{sa:?} {sb:?}");
    assert!(
        a_log.contains("another writer took over") || a_log.contains("partitions lost before the batch was flushed"),
        "A says why it dropped its batch: {a_log}"
    );
    let repo = Repo::open(&s.dir).unwrap();
    let view = repo.applied().unwrap().definitions.feature_views[0].clone();
    let app = quiver::streaming::consumer::app_id("trips", &s.topic, 0);
    let recorded = quiver::offline::delta::txn_versions(&repo.config.view_table(&view), &[app]).await.unwrap();
    assert_eq!(recorded, vec![Some(299)], "the partition's progress is the last offset, never regressed");
}

/// A dead letter the dead-letter topic refuses (too large once the headers are added)
/// does not stall the partition: after bounded retries it is sent cut short, with the
/// original size in a header, and the messages after it are written. An event from the
/// future is a dead letter too, and never reaches the online store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_dead_letters_and_future_events_do_not_stall_the_stream() {
    let Some((brokers, redis)) = services("refused_dead_letters_and_future_events_do_not_stall_the_stream") else { return };
    let s = setup("sbig", &brokers, &redis, 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // Fits the source topic (librdkafka's default message.max.bytes is 1,000,000), but
    // not once the dead letter's headers are added.
    let big = vec![b'x'; 999_850];
    let future = br#"{"driver_id": 1, "event_timestamp": "9999-12-31T23:59:59Z", "fare": 1.0, "seq": -1, "city": "z"}"#.to_vec();
    let mut payloads = vec![message(0).into_bytes(), big.clone(), future];
    payloads.extend((1..50).filter(|&i| kind(i) == Kind::Good).map(|i| message(i).into_bytes()));
    produce_raw(&s, &payloads).await;
    let a = start_with(&s, "a", &[], &["--metrics-port", &port.to_string()]);
    let good: Vec<i64> = (0..50).filter(|&i| kind(i) == Kind::Good).collect();
    wait_for_rows(&s, good.len(), &[&a]).await;
    let letters = {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &s.brokers)
            .set("group.id", unique("dlqreader"))
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[&format!("{}.dlq", s.topic)]).unwrap();
        let mut out = Vec::new();
        let began = Instant::now();
        while out.len() < 2 && began.elapsed() < WAIT {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                let header = |name: &str| {
                    m.headers()
                        .and_then(|h| h.iter().find(|x| x.key == name))
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                };
                out.push((
                    header("quiver.source.offset"),
                    header("quiver.payload.truncated"),
                    m.payload().map_or(0, <[u8]>::len),
                    header("quiver.error"),
                ));
            }
        }
        out
    };
    assert_eq!(letters.len(), 2, "{letters:?}");
    let big_letter = letters.iter().find(|l| l.0.as_deref() == Some("1")).expect("the large message's dead letter");
    assert_eq!(big_letter.1.as_deref(), Some("999850"), "the original size is recorded");
    assert_eq!(big_letter.2, quiver::streaming::consumer::TRUNCATED_PAYLOAD_BYTES);
    let future_letter = letters.iter().find(|l| l.0.as_deref() == Some("2")).expect("the future event's dead letter");
    assert!(future_letter.3.as_deref().is_some_and(|r| r.contains("is in the future")), "{future_letter:?}");
    let (_, body) = common::http(port, "GET", "/metrics", "");
    assert_eq!(counter(&body, "quiver_stream_dead_letters_truncated_total"), 1.0);
    assert!(a.log().contains("refused the dead letter"), "{}", a.log());
    let (status, _) = a.stop();
    assert!(status.success());
    // Driver 1's online row is its real latest event, not the one from year 9999.
    let store = RedisStore::connect(&s.redis).await.unwrap();
    let row = store.read(&[store_key(&s.project, "trips", &[KeyValue::Int(1)])]).await.unwrap()[0].clone().unwrap();
    assert_eq!(OnlineRow::decode(&row).unwrap().event_ts, BASE_TS + 41 * 1_000_000);
}

/// A view with `online: false` streams into Delta only; a feature added by `apply`
/// while the stream runs is picked up without a restart (Delta gains the column, the
/// online rows carry the value, the features already served stay served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_views_get_no_online_writes_and_a_changed_registry_is_picked_up() {
    let Some((brokers, redis)) = services("offline_views_get_no_online_writes_and_a_changed_registry_is_picked_up") else { return };
    let s = setup("sreload", &brokers, &redis, 1).await;
    let features = std::fs::read_to_string(s.dir.join("features.yaml")).unwrap();
    let audit = format!(
        "  - name: audit\n    entities: [driver]\n    online: false\n    source:\n      timestamp_field: event_timestamp\n      stream: {{topic: {}, format: json}}\n    features:\n      - {{name: fare, dtype: float64}}\n",
        s.topic
    );
    let with_audit = format!("{features}{audit}");
    std::fs::write(s.dir.join("features.yaml"), &with_audit).unwrap();
    quiver_ok(&s.dir, &["apply"]);
    // The metrics port follows the server's token rule.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let a = start_with(&s, "a", &[("QUIVER_SERVER_AUTH_TOKEN", "t0ken")], &["--metrics-port", &port.to_string()]);
    produce(&s, 0..100, 1).await;
    wait_for_rows(&s, expected_rows(0..100).len(), &[&a]).await;
    let (status, _) = common::http(port, "GET", "/metrics", "");
    assert!(status.contains("401"), "{status}");
    let (code, body) = common::request(port, "GET", "/metrics", &[("Authorization", "Bearer t0ken")], "");
    assert_eq!(code, 200);
    assert!(body.contains("quiver_stream_consumed_total"), "{body}");
    let store = RedisStore::connect(&s.redis).await.unwrap();
    let keys: Vec<String> = (0..DRIVERS).map(|d| store_key(&s.project, "audit", &[KeyValue::Int(d)])).collect();
    assert!(store.read(&keys).await.unwrap().iter().all(Option::is_none), "an offline-only view has no online rows");
    let repo = Repo::open(&s.dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    // `wait_for_rows` waited for the online view's table; the offline-only view's commit
    // of the same micro-batch may land a moment later.
    let mut audit_rows = 0;
    for _ in 0..100 {
        audit_rows = quiver::offline::historical::read_view(&repo.config, &defs, defs.feature_view("audit").unwrap())
            .await
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum();
        if audit_rows >= expected_rows(0..100).len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(audit_rows, expected_rows(0..100).len(), "but every event is in its Delta table");

    // A feature is added while the stream runs.
    let added = with_audit
        .replace("      - {name: city, dtype: string}\n", "      - {name: city, dtype: string}\n      - {name: tip, dtype: float64}\n");
    assert_ne!(added, with_audit);
    std::fs::write(s.dir.join("features.yaml"), &added).unwrap();
    quiver_ok(&s.dir, &["apply"]);
    wait_until("the stream reloading the registry", &[&a], || a.log().contains("definitions reloaded"));
    let ts = chrono::DateTime::from_timestamp_micros(BASE_TS + 500 * 1_000_000).unwrap().to_rfc3339();
    let tipped = format!(r#"{{"driver_id": 3, "event_timestamp": "{ts}", "fare": 2.5, "seq": 500, "city": "c1", "tip": 0.75}}"#);
    produce_raw(&s, &[tipped.into_bytes()]).await;
    wait_for_rows(&s, expected_rows(0..100).len() + 1, &[&a]).await;
    let (status, _) = a.stop();
    assert!(status.success(), "{}", a_log_or(&s));
    let row = store.read(&[store_key(&s.project, "trips", &[KeyValue::Int(3)])]).await.unwrap()[0].clone().unwrap();
    let row = OnlineRow::decode(&row).unwrap();
    assert_eq!(row.values, vec![Value::Float64(2.5), Value::Int64(500), Value::String("c1".into()), Value::Float64(0.75)]);
    // Driver 4's row was written before the feature existed: still served, tip null.
    let out = quiver_ok(&s.dir, &["online", "--features", "trips:fare,trips:tip", "--entity", "driver_id=4"]);
    let fare_line = out.lines().find(|l| l.starts_with("trips__fare")).unwrap();
    assert!(fare_line.contains("PRESENT"), "{out}");
    let tip_line = out.lines().find(|l| l.starts_with("trips__tip")).unwrap();
    assert!(tip_line.contains("NULL_VALUE"), "{out}");
}

fn a_log_or(s: &Setup) -> String {
    std::fs::read_to_string(s.dir.join("stream-a.log")).unwrap_or_default()
}
