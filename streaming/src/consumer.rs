//! `quiver stream`: Kafka topics into both stores, exactly once into Delta.
//!
//! One consumer (group `quiver-<project>`, manual offset commits) reads the topics of
//! the chosen views. Each message is read by the strict row reader shared with ingest
//! and push ([`quiver_sdk::rows`]). Messages gather in a micro-batch, flushed when it
//! holds `batch_rows` messages or is `batch_interval` old:
//!
//! 1. bad messages go to `<topic>.dlq` with the reason and source in headers;
//! 2. good rows go through the guarded online write;
//! 3. good rows are appended to each view's Delta table in one commit that also records,
//!    as Delta `txn` actions (`quiver-stream/<view>/<topic>/<partition>`), the last
//!    offset of each partition it covers;
//! 4. only then are the offsets committed to Kafka.
//!
//! A crash anywhere replays from Kafka's committed offsets; messages at offsets the
//! Delta table already recorded are not appended again (the online write is idempotent
//! anyway), so no row is lost and none is written twice. A store or broker that fails
//! is retried with backoff and nothing is committed meanwhile. On a rebalance the batch
//! is flushed and committed before partitions are given up; on assignment the recorded
//! offsets are read back from Delta. SIGINT/SIGTERM flush the current batch and stop.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_offline::delta::txn_versions;
use quiver_online::OnlineStore;
use quiver_sdk::rows::{RowReader, ViewRow};
use quiver_sdk::{Config, Definitions, FeatureView};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::runtime::Handle;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::write::write_offline;

/// How `quiver stream` batches and where it connects.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    pub brokers: String,
    /// Default `quiver-<project>`.
    pub group_id: String,
    /// Flush when this many messages are pending.
    pub batch_rows: usize,
    /// Flush when the oldest pending message waited this long.
    pub batch_interval: Duration,
    /// Dead letters of topic `t` go to `t` + this suffix.
    pub dlq_suffix: String,
}

impl StreamOptions {
    pub fn new(config: &Config) -> StreamOptions {
        StreamOptions {
            brokers: config.kafka_brokers.clone(),
            group_id: format!("quiver-{}", config.project),
            batch_rows: 10_000,
            batch_interval: Duration::from_millis(500),
            dlq_suffix: ".dlq".to_string(),
        }
    }
}

/// The views `quiver stream VIEW...` reads: those named, or every view with a stream
/// source when none is named.
///
/// # Errors
/// [`Error::Config`] for an unknown view, a view without a stream source, or none at all.
pub fn stream_views<'a>(defs: &'a Definitions, names: &[String]) -> Result<Vec<&'a FeatureView>> {
    if names.is_empty() {
        let views: Vec<&FeatureView> = defs.feature_views.iter().filter(|v| v.source.stream.is_some()).collect();
        if views.is_empty() {
            return Err(Error::Config(
                "no feature view has a stream source (add `stream: {topic: ..., format: json}` to a view's source)".into(),
            ));
        }
        return Ok(views);
    }
    names
        .iter()
        .map(|n| {
            let view = defs.feature_view(n).ok_or_else(|| Error::Config(format!("unknown feature view `{n}`")))?;
            if view.source.stream.is_none() {
                return Err(Error::Config(format!("feature view `{n}` has no stream source")));
            }
            Ok(view)
        })
        .collect()
}

/// The Delta `txn` app id under which a view's table records a partition's progress.
pub fn app_id(view: &str, topic: &str, partition: i32) -> String {
    format!("quiver-stream/{view}/{topic}/{partition}")
}

/// What a stream run did, for the final summary line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamReport {
    pub consumed: u64,
    pub written_online: u64,
    pub appended_offline: u64,
    pub dead_lettered: u64,
}

/// A message that failed the view's schema, bound for the dead-letter topic.
struct DeadLetter {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    reason: String,
}

/// The state of the current micro-batch, shared with the rebalance callbacks.
struct Pipeline {
    config: Config,
    defs: Arc<Definitions>,
    /// Indexes into `defs.feature_views`.
    views: Vec<usize>,
    /// The row reader of each view (same order as `views`).
    readers: Vec<RowReader<'static>>,
    by_topic: HashMap<String, Vec<usize>>,
    store: Arc<dyn OnlineStore>,
    producer: FutureProducer,
    options: StreamOptions,
    rt: Handle,
    metrics: Arc<Metrics>,
    shutdown: Arc<AtomicBool>,
    /// Per view (same order as `views`): good rows.
    rows: Vec<Vec<ViewRow>>,
    dead: Vec<DeadLetter>,
    /// Highest offset read per (topic, partition) in this batch.
    consumed: BTreeMap<(String, i32), i64>,
    /// (view index, partition) -> the last offset its Delta table recorded.
    floors: HashMap<(usize, i32), i64>,
    pending: usize,
    started: Option<Instant>,
    /// Test hook (`QUIVER_STREAM_ABORT_AFTER_DELTA=N`): abort the process after the Nth
    /// batch is in both stores but before its offsets are committed to Kafka, the window
    /// that exactly-once has to get right.
    abort_after: Option<u64>,
}

impl Pipeline {
    fn view(&self, i: usize) -> &FeatureView {
        &self.defs.feature_views[self.views[i]]
    }

    fn topic(&self, i: usize) -> &str {
        &self.view(i).source.stream.as_ref().expect("stream views only").topic
    }

    fn add(&mut self, topic: &str, partition: i32, offset: i64, key: Option<&[u8]>, payload: Option<&[u8]>) {
        let slot = self.consumed.entry((topic.to_string(), partition)).or_insert(offset);
        *slot = (*slot).max(offset);
        Metrics::add(&self.metrics.consumed, 1);
        self.started.get_or_insert_with(Instant::now);
        self.pending += 1;
        let Some(views) = self.by_topic.get(topic) else { return };
        let payload = payload.unwrap_or_default();
        let mut reason = None;
        let mut replayed = true;
        for &i in views {
            if self.floors.get(&(i, partition)).is_some_and(|&floor| offset <= floor) {
                continue;
            }
            replayed = false;
            match self.readers[i].from_slice(payload) {
                Ok(row) => self.rows[i].push(row),
                Err(r) => reason = Some(format!("feature view `{}`: {r}", self.readers[i].view.name)),
            }
        }
        if replayed {
            Metrics::add(&self.metrics.skipped_replayed, 1);
        }
        if let Some(reason) = reason {
            self.dead.push(DeadLetter {
                topic: topic.to_string(),
                partition,
                offset,
                key: key.map(<[u8]>::to_vec),
                payload: payload.to_vec(),
                reason,
            });
        }
    }

    fn due(&self) -> bool {
        self.pending >= self.options.batch_rows
            || self.started.is_some_and(|t| t.elapsed() >= self.options.batch_interval)
    }

    /// Runs `step` until it succeeds, backing off up to 5 s between tries. Gives up
    /// (`false`) only when shutdown is asked for: nothing is committed then, and the
    /// batch is read again on the next start.
    fn retry<T>(&self, what: &str, mut step: impl FnMut() -> Result<T>) -> Option<T> {
        let mut wait = Duration::from_millis(100);
        loop {
            match step() {
                Ok(v) => return Some(v),
                Err(e) => {
                    Metrics::add(&self.metrics.retries, 1);
                    tracing::warn!(error = %e, "{what} failed; retrying in {wait:?}");
                    eprintln!("warning: {what} failed ({e}); retrying in {wait:?}");
                    let until = Instant::now() + wait;
                    while Instant::now() < until {
                        if self.shutdown.load(Ordering::Relaxed) {
                            return None;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Writes the batch to the dead-letter topics, the online store and Delta, then
    /// commits the offsets. Returns `false` when shutdown interrupted a retry (nothing
    /// committed; the batch is dropped from memory and will be read again).
    fn flush(&mut self, consumer: &BaseConsumer<StreamContext>) -> bool {
        if self.consumed.is_empty() {
            return true;
        }
        let done = self.write_batch();
        if done && self.abort_after.is_some_and(|n| self.metrics.batches.load(Ordering::Relaxed) + 1 >= n) {
            eprintln!("aborting before the offset commit (QUIVER_STREAM_ABORT_AFTER_DELTA)");
            std::process::abort();
        }
        if done {
            let mut tpl = TopicPartitionList::new();
            for ((topic, partition), offset) in &self.consumed {
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(offset + 1));
            }
            if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
                // The next commit covers these offsets; a replay before it is deduplicated.
                Metrics::add(&self.metrics.retries, 1);
                tracing::warn!(error = %e, "committing offsets failed");
            }
            Metrics::add(&self.metrics.batches, 1);
        }
        for rows in &mut self.rows {
            rows.clear();
        }
        self.dead.clear();
        self.consumed.clear();
        self.pending = 0;
        self.started = None;
        done
    }

    fn write_batch(&mut self) -> bool {
        // 1. Dead letters, acknowledged by the broker.
        if !self.dead.is_empty() {
            let dead = std::mem::take(&mut self.dead);
            let ok = self.retry("sending dead letters", || self.send_dead_letters(&dead));
            if ok.is_none() {
                return false;
            }
            Metrics::add(&self.metrics.dead_lettered, dead.len());
        }
        for i in 0..self.views.len() {
            if self.rows[i].is_empty() {
                continue;
            }
            let view = self.view(i).clone();
            let rows: Vec<ViewRow> = std::mem::take(&mut self.rows[i]);
            // 2. Online, through the guarded write.
            let writes = quiver_online::WriteRow::of_rows(&self.config.project, &view, &rows);
            let store = self.store.clone();
            let rt = self.rt.clone();
            let Some(written) = self.retry(&format!("writing `{}` online", view.name), || {
                Ok(rt.block_on(store.write(&writes))?)
            }) else {
                return false;
            };
            Metrics::add(&self.metrics.written_online, written);
            let now = chrono::Utc::now().timestamp_micros();
            for r in &rows {
                self.metrics.observe_freshness((now - r.event_ts) as f64 / 1e6);
            }
            // 3. Offline, with the partitions' last offsets in the same commit.
            let topic = self.topic(i).to_string();
            let txns: Vec<(String, i64)> = self
                .consumed
                .iter()
                .filter(|((t, _), _)| *t == topic)
                .map(|((t, p), o)| (app_id(&view.name, t, *p), *o))
                .collect();
            let source = PathBuf::from(format!("kafka topic {topic}"));
            let location = self.config.view_table(&view);
            let app_ids: Vec<String> = txns.iter().map(|(a, _)| a.clone()).collect();
            let mut attempt = 0;
            let appended = self.retry(&format!("appending `{}` to Delta", view.name), || {
                attempt += 1;
                if attempt > 1 {
                    // The last try may have committed before failing to say so.
                    let recorded = rt.block_on(txn_versions(&location, &app_ids))?;
                    if txns.iter().zip(&recorded).all(|((_, want), got)| got.is_some_and(|g| g >= *want)) {
                        return Ok(0);
                    }
                }
                let report = rt.block_on(write_offline(&self.config, &self.defs, &view, &source, &rows, txns.clone()))?;
                Ok(report.rows)
            });
            let Some(appended) = appended else { return false };
            Metrics::add(&self.metrics.appended_offline, appended);
            for ((_, p), o) in self.consumed.iter().filter(|((t, _), _)| *t == topic) {
                self.floors.insert((i, *p), *o);
            }
        }
        true
    }

    fn send_dead_letters(&self, dead: &[DeadLetter]) -> Result<()> {
        let kafka = |e: String| Error::Kafka { brokers: self.options.brokers.clone(), message: e };
        self.rt.block_on(async {
            let targets: Vec<(String, String, String)> = dead
                .iter()
                .map(|d| (format!("{}{}", d.topic, self.options.dlq_suffix), d.partition.to_string(), d.offset.to_string()))
                .collect();
            let mut sends = Vec::with_capacity(dead.len());
            for (d, (dlq, partition, offset)) in dead.iter().zip(&targets) {
                let headers = OwnedHeaders::new()
                    .insert(Header { key: "quiver.error", value: Some(d.reason.as_bytes()) })
                    .insert(Header { key: "quiver.source.topic", value: Some(d.topic.as_bytes()) })
                    .insert(Header { key: "quiver.source.partition", value: Some(partition.as_bytes()) })
                    .insert(Header { key: "quiver.source.offset", value: Some(offset.as_bytes()) });
                let mut record = FutureRecord::to(dlq).payload(&d.payload).headers(headers);
                if let Some(key) = &d.key {
                    record = record.key(key);
                }
                sends.push(self.producer.send(record, Duration::from_secs(10)));
            }
            for r in futures::future::join_all(sends).await {
                r.map_err(|(e, _)| kafka(format!("dead letter not delivered: {e}")))?;
            }
            Ok(())
        })
    }

    /// Reads back from Delta how far each view has appended the newly assigned
    /// partitions, so replayed messages are not appended twice.
    fn assigned(&mut self, tpl: &TopicPartitionList) {
        for elem in tpl.elements() {
            let (topic, partition) = (elem.topic().to_string(), elem.partition());
            let Some(views) = self.by_topic.get(&topic).cloned() else { continue };
            for i in views {
                let view = self.view(i).clone();
                let location = self.config.view_table(&view);
                let app = vec![app_id(&view.name, &topic, partition)];
                let rt = self.rt.clone();
                let Some(got) = self.retry(&format!("reading `{}`'s stream progress", view.name), || {
                    Ok(rt.block_on(txn_versions(&location, &app))?)
                }) else {
                    return;
                };
                match got[0] {
                    Some(v) => self.floors.insert((i, partition), v),
                    None => self.floors.remove(&(i, partition)),
                };
            }
            eprintln!("assigned {topic}[{partition}]");
        }
    }

    fn revoked(&mut self, tpl: &TopicPartitionList) {
        for elem in tpl.elements() {
            eprintln!("revoked {}[{}]", elem.topic(), elem.partition());
            let Some(views) = self.by_topic.get(elem.topic()).cloned() else { continue };
            for i in views {
                self.floors.remove(&(i, elem.partition()));
            }
        }
    }
}

/// The consumer's context: flushes and commits before partitions are revoked, reads
/// the Delta progress of partitions when they are assigned.
pub struct StreamContext {
    pipeline: Arc<Mutex<Pipeline>>,
}

impl std::fmt::Debug for StreamContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamContext").finish_non_exhaustive()
    }
}

impl ClientContext for StreamContext {}

impl ConsumerContext for StreamContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut pipeline = self.pipeline.lock().expect("pipeline lock");
            pipeline.flush(consumer);
            pipeline.revoked(tpl);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.pipeline.lock().expect("pipeline lock").assigned(tpl);
        }
    }
}

/// Creates the dead-letter topics when missing (one partition each).
async fn ensure_dead_letter_topics(options: &StreamOptions, topics: &[String]) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let kafka = |e: String| Error::Kafka { brokers: options.brokers.clone(), message: e };
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &options.brokers)
        .create()
        .map_err(|e| kafka(e.to_string()))?;
    let names: Vec<String> = topics.iter().map(|t| format!("{t}{}", options.dlq_suffix)).collect();
    let new: Vec<NewTopic> = names.iter().map(|n| NewTopic::new(n, 1, TopicReplication::Fixed(1))).collect();
    let results = admin
        .create_topics(&new, &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))))
        .await
        .map_err(|e| kafka(format!("creating dead-letter topics: {e}")))?;
    for r in results {
        match r {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(kafka(format!("creating dead-letter topic {topic}: {code}"))),
        }
    }
    Ok(())
}

/// Consumes the topics of `views` until `shutdown` is set, then flushes the current
/// batch, commits and returns. Runs on the calling thread; async work (stores, Delta,
/// the producer) runs on `rt`, which must not be the caller's own runtime thread.
///
/// # Errors
/// [`Error::Kafka`] when the consumer or producer cannot be created; [`Error::Config`]
/// for views that cannot stream. Store and broker failures while running are retried,
/// never returned.
pub fn run(
    config: &Config,
    defs: Arc<Definitions>,
    views: &[String],
    store: Arc<dyn OnlineStore>,
    options: StreamOptions,
    metrics: Arc<Metrics>,
    shutdown: Arc<AtomicBool>,
    rt: Handle,
) -> Result<StreamReport> {
    let chosen: Vec<usize> = stream_views(&defs, views)?
        .iter()
        .map(|v| defs.feature_views.iter().position(|w| w.name == v.name).expect("from defs"))
        .collect();
    let mut by_topic: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, &vi) in chosen.iter().enumerate() {
        let topic = defs.feature_views[vi].source.stream.as_ref().expect("stream views").topic.clone();
        by_topic.entry(topic).or_default().push(i);
    }
    let mut topics: Vec<String> = by_topic.keys().cloned().collect();
    topics.sort();
    let kafka = |e: rdkafka::error::KafkaError| Error::Kafka { brokers: options.brokers.clone(), message: e.to_string() };
    rt.block_on(ensure_dead_letter_topics(&options, &topics))?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &options.brokers)
        .set("message.timeout.ms", "10000")
        .create()
        .map_err(kafka)?;
    // The readers borrow the definitions for as long as the process streams.
    let forever: &'static Definitions = Box::leak(Box::new((*defs).clone()));
    let readers = chosen.iter().map(|&vi| RowReader::new(forever, &forever.feature_views[vi])).collect();
    let pipeline = Arc::new(Mutex::new(Pipeline {
        readers,
        config: config.clone(),
        rows: vec![Vec::new(); chosen.len()],
        views: chosen,
        defs,
        by_topic,
        store,
        producer,
        options: options.clone(),
        rt: rt.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        dead: Vec::new(),
        consumed: BTreeMap::new(),
        floors: HashMap::new(),
        pending: 0,
        started: None,
        abort_after: std::env::var("QUIVER_STREAM_ABORT_AFTER_DELTA").ok().and_then(|v| v.parse().ok()),
    }));
    let consumer: BaseConsumer<StreamContext> = ClientConfig::new()
        .set("bootstrap.servers", &options.brokers)
        .set("group.id", &options.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .create_with_context(StreamContext { pipeline: pipeline.clone() })
        .map_err(kafka)?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).map_err(kafka)?;
    eprintln!("streaming {} into both stores (group {}); Ctrl-C to stop", topics.join(", "), options.group_id);

    let mut last_lag = Instant::now();
    while !shutdown.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => pipeline.lock().expect("pipeline lock").add(
                m.topic(),
                m.partition(),
                m.offset(),
                m.key(),
                m.payload(),
            ),
            Some(Err(e)) => {
                Metrics::add(&metrics.retries, 1);
                tracing::warn!(error = %e, "consumer error");
            }
            None => {}
        }
        {
            let mut p = pipeline.lock().expect("pipeline lock");
            if p.due() {
                p.flush(&consumer);
            }
        }
        if last_lag.elapsed() >= Duration::from_secs(5) {
            update_lag(&consumer, &metrics);
            last_lag = Instant::now();
        }
    }
    // Graceful stop: what is pending is written and committed.
    // (A store that is down now is not waited for: the batch is read again next start.)
    let clean = pipeline.lock().expect("pipeline lock").flush(&consumer);
    consumer.unsubscribe();
    drop(consumer);
    if !clean {
        eprintln!("warning: the last batch was not committed; it is read again on the next start");
    }
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    Ok(StreamReport {
        consumed: load(&metrics.consumed),
        written_online: load(&metrics.written_online),
        appended_offline: load(&metrics.appended_offline),
        dead_lettered: load(&metrics.dead_lettered),
    })
}

fn update_lag(consumer: &BaseConsumer<StreamContext>, metrics: &Metrics) {
    let Ok(position) = consumer.position() else { return };
    let mut lag = BTreeMap::new();
    for elem in position.elements() {
        let Ok((_, high)) = consumer.fetch_watermarks(elem.topic(), elem.partition(), Duration::from_millis(500)) else {
            continue;
        };
        let at = match elem.offset() {
            Offset::Offset(o) => o,
            _ => continue,
        };
        lag.insert((elem.topic().to_string(), elem.partition()), (high - at).max(0));
    }
    *metrics.lag.lock().expect("metrics lock") = lag;
}
