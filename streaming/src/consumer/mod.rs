//! `quiver stream`: Kafka topics into both stores, exactly once into Delta.
//!
//! One consumer (group `quiver-<project>`, manual offset commits) reads the topics of
//! the chosen views. Each message is read by the strict row reader shared with ingest
//! and push ([`quiver_runtime::rows`]). Messages gather in a micro-batch, flushed when it
//! holds `batch_rows` messages or is `batch_interval` old:
//!
//! 1. bad messages go to `<topic>.dlq` with the reason and source in headers;
//! 2. good rows go through the guarded online write and, at the same time, are
//!    appended to each view's Delta table in one commit that also records, as Delta
//!    `txn` actions (`quiver-stream/<view>/<topic>/<partition>`), the last offset of
//!    each partition it covers;
//! 3. only when both are done are the offsets committed to Kafka.
//!
//! Steps 1-2 run on the writer's thread ([`writer`]; the online write on a second one)
//! while the consumer gathers the next batch; step 3 runs on the consumer's thread when
//! the writer reports the batch in both stores. At most one batch is written at a time,
//! so batches land and commit in the order they were read; a batch that is due waits
//! for the one in flight. A batch in flight that is fenced or interrupted takes the
//! batch gathered after it along: both are read again.
//!
//! A crash anywhere replays from Kafka's committed offsets; messages at offsets the
//! Delta table already recorded are not appended again but are written online again
//! (the crash may have come before their online write, which is idempotent), so no row
//! is lost and none is written twice. A store or broker that fails is retried with
//! backoff and nothing is committed meanwhile. On a rebalance the batch is flushed and
//! committed before partitions are given up; on assignment the recorded offsets are
//! read back from Delta. Setting `shutdown` (the CLI does on SIGINT/SIGTERM) flushes
//! the current batch and stops.
//!
//! Faults (docs/limits.md):
//! - A consumer that lost its partitions while holding a batch (paused past the
//!   session timeout, a store outage longer than it) never appends that batch over
//!   another member's work: each Delta append states the `txn` versions it follows
//!   and is refused ("fenced") when another member recorded more; a batch whose
//!   partitions were reported lost is dropped unwritten. Either way the consumer seeks
//!   back to the batch's first offsets and nothing is committed, so nothing is lost.
//! - A dead letter the dead-letter topic refuses (too large with the added headers,
//!   say) is retried 3 times, then sent with its payload cut to
//!   [`TRUNCATED_PAYLOAD_BYTES`] and a `quiver.payload.truncated` header giving the
//!   original size (the full message stays in the source topic at the offset the
//!   headers name); if even that is refused the stream stops with an error and commits
//!   nothing. Transient broker errors are retried until they pass.
//! - Messages with an event time after the wall clock plus `max_future_skew` are dead
//!   letters; views with `online: false` get no online writes.
//! - The registry is re-read between batches when its file changes, so a feature added
//!   by `apply` is streamed without a restart; an unreadable registry keeps the last
//!   good definitions.

mod dead_letters;
mod events;
mod pipeline;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_online::OnlineStore;
use quiver_sdk::{Config, Definitions, FeatureView, FileRegistry};
use rdkafka::Offset;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use tokio::runtime::Handle;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
pub use dead_letters::TRUNCATED_PAYLOAD_BYTES;
use dead_letters::ensure_dead_letter_topics;
pub use events::{Event, Hooks};
use pipeline::Pipeline;
use writer::{Batch, Writer};

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
    /// Counters the run fills (for a metrics endpoint and the final report).
    pub metrics: Arc<Metrics>,
    /// Set to stop: the current batch is flushed and committed.
    pub shutdown: Arc<AtomicBool>,
    /// Where events go, and the injected fault.
    pub hooks: Hooks,
}

impl StreamOptions {
    pub fn new(config: &Config) -> StreamOptions {
        StreamOptions {
            brokers: config.kafka_brokers.clone(),
            group_id: format!("quiver-{}", config.project),
            batch_rows: 10_000,
            batch_interval: Duration::from_millis(500),
            dlq_suffix: ".dlq".to_string(),
            metrics: Arc::new(Metrics::default()),
            shutdown: Arc::new(AtomicBool::new(false)),
            hooks: Hooks::default(),
        }
    }
}

/// The views `quiver stream VIEW...` reads: those named (`view` or `view@N`), or every
/// live version of every view with a stream source when none is named (`defs` as
/// [`Definitions::every_version_listed`] gives them).
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
            let view = defs.find_view(n).map_err(|e| Error::Config(e.0))?;
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
    /// Rows views' source filters dropped (docs/transformations.md#write-time).
    pub filtered: u64,
    /// Values write-time expressions could not compute (stored null).
    pub uncomputed: u64,
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
            if consumer.assignment_lost() {
                // Another member may already be writing these partitions.
                pipeline.drop_lost(tpl);
                return;
            }
            if let Err(e) = pipeline.flush(consumer) {
                // Nothing of the batch is committed; the loop stops on the same error.
                pipeline.fatal.get_or_insert(e);
            }
            pipeline.revoked(tpl);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.pipeline.lock().expect("pipeline lock").assigned(tpl);
        }
    }
}

/// Consumes the topics of `views` until `options.shutdown` is set, then flushes the
/// current batch, commits and returns. Runs on the calling thread; async work (stores,
/// Delta, the producer) runs on `rt`, which must not be the caller's own runtime thread.
///
/// # Errors
/// [`Error::Kafka`] when the consumer or producer cannot be created, and when a dead
/// letter is refused even cut short; [`Error::Config`] for views that cannot stream,
/// and when a registry change removes a streamed view or changes its topic. Other store
/// and broker failures while running are retried, never returned. Whatever is
/// returned, nothing of the batch in hand was committed.
pub fn run(
    config: &Config,
    defs: Arc<Definitions>,
    views: &[String],
    store: Arc<dyn OnlineStore>,
    options: StreamOptions,
    rt: Handle,
) -> Result<StreamReport> {
    let (pipeline, consumer) = connect(config, defs, views, store, &options, rt)?;
    let outcome = poll_until_shutdown(&pipeline, &consumer, &options);
    if let Err(e) = outcome {
        // Nothing of the current batch is committed: it is read again on the next start.
        pipeline.lock().expect("pipeline lock").abandon();
        consumer.unsubscribe();
        return Err(e);
    }
    // Graceful stop: what is pending is written and committed.
    // (A store that is down now is not waited for: the batch is read again next start.)
    let clean = pipeline.lock().expect("pipeline lock").flush(&consumer);
    consumer.unsubscribe();
    drop(consumer);
    if !clean? {
        options.hooks.warn("the last batch was not committed; it is read again on the next start".into());
    }
    let metrics = &options.metrics;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    Ok(StreamReport {
        consumed: load(&metrics.consumed),
        written_online: load(&metrics.written_online),
        appended_offline: load(&metrics.appended_offline),
        dead_lettered: load(&metrics.dead_lettered),
        filtered: load(&metrics.filtered),
        uncomputed: load(&metrics.uncomputed),
    })
}

/// The pipeline of the chosen views, the dead-letter producer and the subscribed consumer.
fn connect(
    config: &Config,
    defs: Arc<Definitions>,
    views: &[String],
    store: Arc<dyn OnlineStore>,
    options: &StreamOptions,
    rt: Handle,
) -> Result<(Arc<Mutex<Pipeline>>, BaseConsumer<StreamContext>)> {
    // Every live version of a view is fed, each into its own table and keys.
    let defs = Arc::new(defs.every_version_listed());
    let chosen: Vec<usize> = stream_views(&defs, views)?
        .iter()
        .map(|v| defs.feature_views.iter().position(|w| w.name == v.name && w.version == v.version).expect("from defs"))
        .collect();
    let mut by_topic: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, &vi) in chosen.iter().enumerate() {
        let topic = defs.feature_views[vi].source.stream.as_ref().expect("stream views").topic.clone();
        by_topic.entry(topic).or_default().push(i);
    }
    let mut topics: Vec<String> = by_topic.keys().cloned().collect();
    topics.sort();
    let kafka = |e: rdkafka::error::KafkaError| Error::Kafka { brokers: options.brokers.clone(), message: e.to_string() };
    rt.block_on(ensure_dead_letter_topics(options, &topics))?;
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", &options.brokers).set("message.timeout.ms", "10000").create().map_err(kafka)?;
    let (readers, transforms) = pipeline::readers(&defs, &chosen)?;
    let registry = FileRegistry::new(config.registry_path.clone());
    let registry_mtime = std::fs::metadata(registry.path()).and_then(|m| m.modified()).ok();
    let floors = Arc::new(Mutex::new(HashMap::new()));
    let writer = Writer {
        config: config.clone(),
        store,
        producer,
        options: options.clone(),
        rt: rt.clone(),
        metrics: options.metrics.clone(),
        shutdown: options.shutdown.clone(),
        floors: floors.clone(),
        tables: Mutex::default(),
        events: quiver_offline::historical::EventCache::long_lived(),
    };
    // The event logs' events read before the first batch: its rebuild (a restarted
    // consumer's, with every entity of the messages replayed) then reads only what was
    // committed since. A failure here costs that rebuild its time, nothing else.
    let now = chrono::Utc::now().timestamp_micros();
    for &vi in &chosen {
        let view = &defs.feature_views[vi];
        if view.is_event_log() && view.takes_online_writes() {
            let since = quiver_runtime::record::Layout::of(view).earliest_tail(now);
            if let Err(e) = rt.block_on(writer.events.warm(config, &defs, view, since)) {
                options.hooks.warn(format!("reading `{}`'s events ahead failed ({e}); the first batch reads them", view.name));
            }
        }
    }
    let mut pipeline = Pipeline {
        readers,
        transforms,
        registry,
        registry_mtime,
        config: config.clone(),
        views: chosen,
        defs,
        by_topic,
        every_view: views.is_empty(),
        options: options.clone(),
        rt,
        metrics: options.metrics.clone(),
        batch: Batch::default(),
        floors,
        pending: 0,
        started: None,
        writer: Some(writer),
        in_flight: None,
        fatal: None,
    };
    pipeline.clear();
    let pipeline = Arc::new(Mutex::new(pipeline));
    let consumer: BaseConsumer<StreamContext> = ClientConfig::new()
        .set("bootstrap.servers", &options.brokers)
        .set("group.id", &options.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // The least Kafka brokers allow by default: a consumer killed without leaving the
        // group holds its partitions this long before another member takes them.
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        // When its local queue is full, librdkafka postpones a partition's next fetch by
        // this much (1 s by default): with a backlog, each batch written then found the
        // queue empty and the stream idle for ~0.5 s every second or so.
        .set("fetch.queue.backoff.ms", "10")
        .create_with_context(StreamContext { pipeline: pipeline.clone() })
        .map_err(kafka)?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).map_err(kafka)?;
    options.hooks.emit(Event::Started { topics, group: options.group_id.clone() });
    Ok((pipeline, consumer))
}

/// How many messages already received are read in a row (see [`poll_until_shutdown`]).
const POLL_GROUP: usize = 256;

/// Reads messages into the pipeline, flushing batches when due and re-reading the
/// registry between them, until shutdown (`Ok`) or an error the stream cannot go on after.
fn poll_until_shutdown(pipeline: &Mutex<Pipeline>, consumer: &BaseConsumer<StreamContext>, options: &StreamOptions) -> Result<()> {
    let metrics = &options.metrics;
    let mut last_lag = Instant::now();
    let mut last_registry_check = Instant::now();
    while !options.shutdown.load(Ordering::Relaxed) {
        // A wait for the next message, then up to `POLL_GROUP` already at hand before
        // the checks below, and one reading of the clock for their event-time horizon:
        // per message, the clock readings were a twentieth of the stream's CPU.
        let mut wait = Duration::from_millis(100);
        let mut latest = None;
        for _ in 0..POLL_GROUP {
            match consumer.poll(wait) {
                Some(Ok(m)) => {
                    let mut p = pipeline.lock().expect("pipeline lock");
                    let latest = *latest.get_or_insert_with(|| p.config.event_horizon(chrono::Utc::now().timestamp_micros()));
                    p.add(m.topic(), m.partition(), m.offset(), m.key(), m.payload(), latest);
                    if p.pending >= options.batch_rows {
                        break;
                    }
                }
                Some(Err(e)) => {
                    Metrics::add(&metrics.retries, 1);
                    tracing::warn!(error = %e, "consumer error");
                    break;
                }
                None => break,
            }
            wait = Duration::ZERO;
        }
        {
            let mut p = pipeline.lock().expect("pipeline lock");
            // The batch in flight is committed as soon as it is written; a due batch
            // waits for it, then goes to the writer while the next one is gathered.
            let step = p.settle_if_done(consumer).and_then(|()| if p.due() { p.start_flush(consumer) } else { Ok(()) });
            if let Err(e) = step {
                p.fatal.get_or_insert(e);
            }
            if let Some(e) = p.fatal.take() {
                return Err(e);
            }
            if p.pending == 0 && last_registry_check.elapsed() >= Duration::from_secs(1) {
                last_registry_check = Instant::now();
                let assigned: Vec<(String, i32)> = consumer
                    .assignment()
                    .map(|tpl| tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect())
                    .unwrap_or_default();
                p.reload_registry(&assigned)?;
            }
        }
        if last_lag.elapsed() >= Duration::from_secs(5) {
            update_lag(consumer, metrics);
            last_lag = Instant::now();
        }
    }
    Ok(())
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
