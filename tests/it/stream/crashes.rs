//! Crashes and outages: every message lands once in Delta and online across a killed
//! stream, an S3 table, an event log's counts, a Redis restart, and a crash between the
//! Delta commit and the online write.

use super::*;

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

/// The stream on Delta tables in an object store (docs/settings.md): a crash between the Delta
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
    let defs = repo.applied().unwrap().registered();
    let store = RedisStore::connect(&s.redis).await.unwrap();
    let refs: Vec<FeatureRef> = ["trips", "fare_sum", "last_seq"].iter().map(|a| FeatureRef::new("trip_log", *a)).collect();
    let drivers: Vec<i64> = (0..DRIVERS).collect();
    let entities = vec![("driver_id".to_string(), drivers.iter().map(|&d| KeyValue::Int(d)).collect())];
    let now = chrono::Utc::now().timestamp_micros();
    let online =
        quiver::online::lookup::get_online_features(&store, &s.project, &defs, &refs, (&entities, &Vec::new()), now, true).await.unwrap();
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
