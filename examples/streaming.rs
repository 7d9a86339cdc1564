//! Streaming, for users with a Kafka broker: events produced to a topic reach the online
//! store and the Delta table through `quiver stream`'s write path, are served at once,
//! and the two stores still agree. What `./run stream-example` runs (it starts a local
//! Kafka-protocol broker when `QUIVER_KAFKA_BROKERS` is not set).
//!
//!     QUIVER_KAFKA_BROKERS=host:9092 cargo run --example streaming [DIR]
//!
//! Creates the demo repository with `driver_hourly` fed from a topic (a new topic per
//! run), ingests and materializes the history, starts the consumer and the feature
//! server (serving log on) in-process, produces 20,000 driver events and 20 malformed
//! messages, waits until the last event of every driver is served, then stops the
//! consumer and checks: every good event appended to Delta exactly once, the malformed
//! ones dead-lettered, and the served answers replayed through the offline join: those
//! answered while events were in flight lag it (reported), the last one agrees exactly.
//! The online store is the embedded one unless `QUIVER_ONLINE_STORE_TYPE=redis` (and
//! `QUIVER_ONLINE_STORE_URL`) say otherwise.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quiver::Repo;
use quiver::ops::Rows;
use quiver::sdk::Timestamp;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

#[path = "common/mod.rs"]
mod common;
use common::{enable_serving_log, post, step};

const EVENTS: i64 = 20_000;
const BAD: i64 = 20;
const DRIVERS: i64 = 10;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "streaming-demo".into()));
    let brokers = std::env::var("QUIVER_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let began = Instant::now();
    println!("quiver streaming example in {} (Kafka at {brokers})", dir.display());
    let setup = setup(&dir).await?;
    let (running, server) = start(&setup, &brokers).await?;
    let t = Instant::now();
    let (last, bad) = produce(&brokers, &setup.topic).await?;
    let produced = t.elapsed();
    let last_poll = wait_served(running.addr, &last, produced).await?;
    let serving_began = running.serving_began;
    stop_and_check(&setup, running, bad).await?;
    server.stop().await?;
    verify(&setup.repo, serving_began, last_poll).await?;
    println!("done in {:.2} s: repository {}", began.elapsed().as_secs_f64(), dir.display());
    Ok(())
}

/// The demo repository with `driver_hourly` fed from a new topic, its history ingested
/// and materialized.
struct Setup {
    repo: Repo,
    defs: Arc<quiver::sdk::Definitions>,
    topic: String,
    history: usize,
    store: Arc<dyn quiver::online::OnlineStore>,
}

async fn setup(dir: &Path) -> anyhow::Result<Setup> {
    let t = Instant::now();
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let now = chrono::Utc::now();
    quiver::init(dir, true, now)?;
    let topic = format!("driver_events_{}", now.timestamp_micros());
    // driver_hourly gains a stream source: the topic's JSON events.
    let features = std::fs::read_to_string(dir.join("features.yaml"))?;
    let marker = "      created_timestamp_field: created_timestamp\n";
    anyhow::ensure!(features.contains(marker), "the demo's features.yaml changed shape");
    let features = features.replacen(marker, &format!("{marker}      stream: {{topic: {topic}, format: json}}\n"), 1);
    std::fs::write(dir.join("features.yaml"), features)?;
    enable_serving_log(dir)?;
    let repo = Repo::open(dir)?;
    let (repo2, handle) = (repo.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || repo2.apply(false, now, handle)).await??;
    let defs = Arc::new(repo.applied()?.definitions);
    let file = dir.join("sample_data/driver_hourly.parquet");
    let history = repo.ingest("driver_hourly", Rows::File(file)).await?.rows;
    let store: Arc<dyn quiver::online::OnlineStore> = repo.open_store().await?;
    repo.materialize(quiver::sdk::Timestamp::MIN, now.into()).with_views(vec!["driver_hourly".into()]).with_store(store.clone()).await?;
    step(
        "setup",
        t,
        format!("demo repo, driver_hourly <- topic {topic}; {history} historical rows ingested and materialized ({})", store.name()),
    );

    Ok(Setup { repo, defs, topic, history, store })
}

/// The consumer (on its own thread), running beside the server.
struct Running {
    consumer: std::thread::JoinHandle<quiver::Result<quiver::streaming::StreamReport>>,
    shutdown: Arc<AtomicBool>,
    metrics: Arc<quiver::streaming::Metrics>,
    serving_began: i64,
    addr: SocketAddr,
}

async fn start(setup: &Setup, brokers: &str) -> anyhow::Result<(Running, quiver::ops::Server)> {
    let Setup { repo, topic, store, .. } = setup;
    let t = Instant::now();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| anyhow::anyhow!("Kafka at {brokers}: {e} (set QUIVER_KAFKA_BROKERS, or use ./run stream-example)"))?;
    for r in created {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    let stream_metrics = Arc::new(quiver::streaming::Metrics::default());
    let consumer = {
        let (repo, store, shutdown, metrics, brokers) =
            (repo.clone(), store.clone(), shutdown.clone(), stream_metrics.clone(), brokers.to_string());
        let handle = tokio::runtime::Handle::current();
        std::thread::spawn(move || {
            repo.stream(Vec::new())
                .with_batch(10_000, Duration::from_millis(200))
                .with_brokers(brokers)
                .with_store(store)
                .with_metrics(metrics)
                .with_shutdown(shutdown)
                .run_blocking(handle)
        })
    };
    let serving_began = chrono::Utc::now().timestamp_micros();
    let server = repo.serve(([127, 0, 0, 1], 0).into()).with_store(store.clone()).with_serving_log(true).start().await?;
    let addr = server.addr();
    step("start", t, format!("topic with 3 partitions, consumer group quiver-{}, server on http://{addr}", repo.config.project));

    Ok((Running { consumer, shutdown, metrics: stream_metrics, serving_began, addr }, server))
}

/// Produces the events; returns each driver's last event number and the malformed count.
async fn produce(brokers: &str, topic: &str) -> anyhow::Result<(std::collections::BTreeMap<i64, i64>, i64)> {
    // Events: driver 1001 + i % 10, stamped when produced, with a trip count that tells
    // which event was the last; every 1001st message is malformed.
    let t = Instant::now();
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", brokers).set("linger.ms", "5").create()?;
    let mut sends = Vec::new();
    let mut last = std::collections::BTreeMap::new();
    for i in 0..EVENTS + BAD {
        let driver = 1001 + i % DRIVERS;
        let payload = if i % ((EVENTS + BAD) / BAD) == 7 {
            format!(r#"{{"driver_id": "not a number {i}", "event_timestamp": "2026-01-01T00:00:00Z"}}"#)
        } else {
            let at = chrono::Utc::now().to_rfc3339();
            last.insert(driver, i);
            format!(
                r#"{{"driver_id": {driver}, "event_timestamp": "{at}", "created_timestamp": "{at}", "conv_rate": {:.4}, "acc_rate": 0.9, "avg_daily_trips": {i}}}"#,
                (i % 97) as f64 / 100.0
            )
        };
        let key = driver.to_string();
        sends.push(producer.send_result(FutureRecord::to(topic).key(&key).payload(&payload)).map_err(|(e, _)| anyhow::anyhow!("{e}"))?);
    }
    for s in sends {
        s.await?.map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
    }
    let good = last.len() as i64;
    let bad = (0..EVENTS + BAD).filter(|i| i % ((EVENTS + BAD) / BAD) == 7).count() as i64;
    step("produce", t, format!("{} good events for {good} drivers and {bad} malformed messages", EVENTS + BAD - bad));

    Ok((last, bad))
}

/// Polls until every driver's last event is served; returns the last poll's time.
async fn wait_served(addr: SocketAddr, last: &std::collections::BTreeMap<i64, i64>, produced: Duration) -> anyhow::Result<i64> {
    // Poll the server until every driver's last event is served (a broker can take some
    // seconds to give a new consumer group its partitions).
    let t = Instant::now();
    let drivers: Vec<String> = last.keys().map(ToString::to_string).collect();
    let ask = format!(
        r#"{{"entities": {{"driver_id": [{}]}}, "features": ["driver_hourly:avg_daily_trips", "driver_hourly:conv_rate"]}}"#,
        drivers.join(",")
    );
    let want: Vec<serde_json::Value> = last.values().map(|&i| serde_json::json!(i)).collect();
    let mut polls = 0;
    let mut last_poll;
    loop {
        polls += 1;
        last_poll = chrono::Utc::now().timestamp_micros();
        let ask = ask.clone();
        let answer = tokio::task::spawn_blocking(move || post(addr, "/get-online-features", &ask)).await??;
        if answer["results"][1]["values"].as_array() == Some(&want) {
            break;
        }
        anyhow::ensure!(t.elapsed() < Duration::from_secs(180), "the last events were not served within 3 minutes: {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    step(
        "served",
        t,
        format!(
            "every driver's last event served {:.2} s after producing ended ({polls} polls; {:.0} events/s end to end)",
            t.elapsed().as_secs_f64(),
            EVENTS as f64 / (produced + t.elapsed()).as_secs_f64()
        ),
    );

    Ok(last_poll)
}

/// Stops the consumer once it took every message, then checks the Delta table and the
/// dead letters.
async fn stop_and_check(setup: &Setup, running: Running, bad: i64) -> anyhow::Result<()> {
    let Setup { repo, defs, topic, history, .. } = setup;
    let history = *history;
    let Running { consumer, shutdown, metrics: stream_metrics, .. } = running;
    let view = defs.feature_view("driver_hourly").expect("demo view");
    // Stop the consumer (it flushes and commits), then check both stores.
    let t = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while stream_metrics.appended_offline.load(Ordering::Relaxed) < EVENTS as u64
        || stream_metrics.dead_lettered.load(Ordering::Relaxed) < bad as u64
    {
        anyhow::ensure!(Instant::now() < deadline, "the consumer did not finish: {}", stream_metrics.render());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.store(true, Ordering::Relaxed);
    let report = tokio::task::spawn_blocking(move || consumer.join().expect("consumer thread")).await??;
    let rows = quiver::offline::historical::read_view(&repo.config, defs, view).await?;
    let total: usize = rows.iter().map(|b| b.num_rows()).sum();
    anyhow::ensure!(total as u64 == history as u64 + EVENTS as u64, "Delta holds {total} rows, expected {history} + {EVENTS}");
    anyhow::ensure!(report.dead_lettered == bad as u64, "{} dead letters, expected {bad}", report.dead_lettered);
    step(
        "stores",
        t,
        format!("Delta: {total} rows ({history} history + {EVENTS} streamed, each once); {} messages in {topic}.dlq", report.dead_lettered),
    );

    Ok(())
}

/// Every poll replayed through the offline join.
async fn verify(repo: &Repo, serving_began: i64, last_poll: i64) -> anyhow::Result<()> {
    // Every poll replayed through the offline join at its request time. Polls answered
    // while events were still in flight served a row older than the newest event time:
    // the freshness lag, as a model trained on point-in-time joins sees it. The final
    // poll, after the stream caught up, must agree exactly.
    let t = Instant::now();
    let until = chrono::Utc::now().timestamp_micros();
    let during = repo.verify_log(Timestamp(serving_began), Timestamp(last_poll)).await?;
    let lagged: u64 = during.features.iter().map(|r| r.compared - r.matches).sum();
    let compared: u64 = during.features.iter().map(|r| r.compared).sum();
    let after = repo.verify_log(Timestamp(last_poll), Timestamp(until)).await?;
    let bad: u64 = after.features.iter().map(|r| r.compared - r.matches).sum();
    let checked: u64 = after.features.iter().map(|r| r.compared).sum();
    step(
        "verify --since",
        t,
        format!(
            "{} polls while streaming: {lagged} of {compared} served values behind the offline join (events in flight); after catching up: {bad} of {checked} disagree",
            during.requests
        ),
    );
    anyhow::ensure!(bad == 0 && checked > 0, "after the stream caught up, online and offline disagree: {:?}", after.features);
    Ok(())
}
