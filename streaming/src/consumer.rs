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
//!
//! Faults (SPEC §13):
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

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_offline::delta::txn_versions;
use quiver_offline::ingest::AppendOptions;
use quiver_online::OnlineStore;
use quiver_sdk::rows::{RowReader, ViewRow};
use quiver_sdk::{Config, Definitions, FeatureView, FileRegistry};
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

/// The payload bytes a dead letter keeps when the dead-letter topic refused it whole.
pub const TRUNCATED_PAYLOAD_BYTES: usize = 1024;

/// Tries of a dead letter the dead-letter topic refuses, in each form (whole, then cut).
const REFUSED_TRIES: u32 = 3;

/// A message that failed the view's schema, bound for the dead-letter topic.
struct DeadLetter {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    reason: String,
}

/// How far a batch got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// In every store: its offsets may be committed.
    All,
    /// Shutdown interrupted a retry: nothing is committed, the batch is read again on
    /// the next start.
    Interrupted,
    /// Another member appended some of these partitions first: nothing is committed and
    /// the consumer seeks back.
    Fenced,
}

/// Whether the broker refused a record for what it is (too large, invalid, not
/// allowed), so that sending it again unchanged cannot succeed.
fn refused(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::InvalidRecord
                | C::BadMessage
                | C::MessageBatchTooLarge
                | C::InvalidTopic
                | C::TopicAuthorizationFailed
                | C::PolicyViolation
                | C::InvalidRequiredAcks
        )
    )
}

/// The state of the current micro-batch, shared with the rebalance callbacks.
struct Pipeline {
    config: Config,
    defs: Arc<Definitions>,
    /// Indexes into `defs.feature_views`.
    views: Vec<usize>,
    /// The row reader of each view (same order as `views`).
    readers: Vec<RowReader>,
    /// The registry file, re-read between batches when it changes.
    registry: FileRegistry,
    registry_mtime: Option<std::time::SystemTime>,
    /// Lowest offset read per (topic, partition) in this batch: where to seek back to
    /// when the batch cannot be committed.
    first: BTreeMap<(String, i32), i64>,
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
    /// An error met in a rebalance callback, which cannot return it: the loop stops.
    fatal: Option<Error>,
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
        let slot = self.first.entry((topic.to_string(), partition)).or_insert(offset);
        *slot = (*slot).min(offset);
        Metrics::add(&self.metrics.consumed, 1);
        self.started.get_or_insert_with(Instant::now);
        self.pending += 1;
        let Some(views) = self.by_topic.get(topic) else { return };
        let payload = payload.unwrap_or_default();
        let latest = self.config.event_horizon(chrono::Utc::now().timestamp_micros());
        let mut reason = None;
        let mut replayed = true;
        for &i in views {
            if self.floors.get(&(i, partition)).is_some_and(|&floor| offset <= floor) {
                continue;
            }
            replayed = false;
            self.readers[i].latest_event = Some(latest);
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
    /// commits the offsets. Returns `false` when the batch was not committed: shutdown
    /// interrupted a retry (it is read again on the next start), or another member took
    /// its partitions (the consumer seeks back to the batch's first offsets).
    ///
    /// # Errors
    /// A dead letter that the dead-letter topic refuses even cut short: nothing of the
    /// batch is committed, and the stream must stop.
    fn flush(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<bool> {
        if self.consumed.is_empty() {
            return Ok(true);
        }
        let outcome = self.write_batch();
        let done = matches!(outcome, Ok(Written::All));
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
        if matches!(outcome, Ok(Written::Fenced)) {
            self.seek_back(consumer);
        }
        self.clear();
        outcome.map(|_| done)
    }

    /// Forgets the batch (its rows, dead letters and offsets).
    fn clear(&mut self) {
        for rows in &mut self.rows {
            rows.clear();
        }
        self.dead.clear();
        self.consumed.clear();
        self.first.clear();
        self.pending = 0;
        self.started = None;
    }

    /// After a batch was fenced: every partition of the batch is read again from the
    /// batch's first offset (what a view's Delta table already holds is skipped). A
    /// partition this consumer no longer owns is not sought: its new owner reads it.
    fn seek_back(&self, consumer: &BaseConsumer<StreamContext>) {
        for ((topic, partition), first) in &self.first {
            if let Err(e) = consumer.seek(topic, *partition, Offset::Offset(*first), Duration::from_secs(5)) {
                tracing::info!(error = %e, topic, partition, "not seeking back (partition no longer owned)");
            }
        }
    }

    /// The partitions were lost (another member has them): the batch is dropped
    /// unwritten; the new owner reads it from the committed offsets.
    fn drop_lost(&mut self, tpl: &TopicPartitionList) {
        if !self.consumed.is_empty() {
            Metrics::add(&self.metrics.lost_batches, 1);
            eprintln!("warning: partitions lost before the batch was flushed; dropping {} unwritten messages (their new owner reads them)", self.pending);
        }
        self.clear();
        self.revoked(tpl);
    }

    /// Re-reads the registry if its file changed; call only between batches (the rows
    /// of a batch were read under the definitions they will be written with).
    ///
    /// # Errors
    /// [`Error::Config`] when a streamed view was removed or its topic changed: the
    /// consumer's subscription no longer fits, it must be restarted.
    fn reload_registry(&mut self) -> Result<()> {
        let mtime = std::fs::metadata(self.registry.path()).and_then(|m| m.modified()).ok();
        if mtime.is_none() || mtime == self.registry_mtime {
            return Ok(());
        }
        self.registry_mtime = mtime;
        let doc = match self.registry.load_or_empty(&self.config.project) {
            Ok(doc) if doc.version > 0 => doc,
            Ok(_) => {
                Metrics::add(&self.metrics.registry_errors, 1);
                eprintln!("warning: registry {} is empty; streaming on with the last good definitions", self.registry.path().display());
                return Ok(());
            }
            Err(e) => {
                Metrics::add(&self.metrics.registry_errors, 1);
                eprintln!("warning: registry changed but cannot be read ({e}); streaming on with the last good definitions");
                return Ok(());
            }
        };
        let defs = Arc::new(doc.definitions);
        let mut views = Vec::with_capacity(self.views.len());
        for i in 0..self.views.len() {
            let old = self.view(i);
            let Some(at) = defs.feature_views.iter().position(|v| v.name == old.name) else {
                return Err(Error::Config(format!(
                    "registry version {}: feature view `{}` is no longer defined; restart `quiver stream`",
                    doc.version, old.name
                )));
            };
            let new_topic = defs.feature_views[at].source.stream.as_ref().map(|s| s.topic.as_str());
            if new_topic != Some(self.topic(i)) {
                return Err(Error::Config(format!(
                    "registry version {}: feature view `{}` no longer streams from `{}`; restart `quiver stream`",
                    doc.version,
                    old.name,
                    self.topic(i)
                )));
            }
            views.push(at);
        }
        self.readers = views.iter().map(|&vi| RowReader::new(&defs, &defs.feature_views[vi])).collect();
        self.views = views;
        self.defs = defs;
        Metrics::add(&self.metrics.registry_reloads, 1);
        eprintln!("registry version {}: definitions reloaded", doc.version);
        Ok(())
    }

    fn write_batch(&mut self) -> Result<Written> {
        // 1. Dead letters, acknowledged by the broker.
        if !self.dead.is_empty() {
            let dead = std::mem::take(&mut self.dead);
            match self.deliver_dead_letters(&dead)? {
                true => Metrics::add(&self.metrics.dead_lettered, dead.len()),
                false => return Ok(Written::Interrupted),
            }
        }
        let mut outcome = Written::All;
        for i in 0..self.views.len() {
            if self.rows[i].is_empty() {
                continue;
            }
            let view = self.view(i).clone();
            let rows: Vec<ViewRow> = std::mem::take(&mut self.rows[i]);
            let rt = self.rt.clone();
            // 2. Online, through the guarded write (not for offline-only views).
            if view.online {
                let writes = quiver_online::WriteRow::of_rows(&self.config.project, &view, &rows);
                let store = self.store.clone();
                let Some(written) = self.retry(&format!("writing `{}` online", view.name), || {
                    Ok(rt.block_on(store.write(&writes))?)
                }) else {
                    return Ok(Written::Interrupted);
                };
                Metrics::add(&self.metrics.written_online, written);
                let now = chrono::Utc::now().timestamp_micros();
                for r in &rows {
                    self.metrics.observe_freshness((now - r.event_ts) as f64 / 1e6);
                }
            }
            // 3. Offline, with the partitions' last offsets in the same commit, after
            //    the progress this consumer knows of (else another member took over).
            let topic = self.topic(i).to_string();
            let partitions: Vec<(i32, i64)> =
                self.consumed.iter().filter(|((t, _), _)| *t == topic).map(|((_, p), o)| (*p, *o)).collect();
            let txns: Vec<(String, i64)> = partitions.iter().map(|(p, o)| (app_id(&view.name, &topic, *p), *o)).collect();
            let expected: Vec<(String, Option<i64>)> =
                partitions.iter().map(|(p, _)| (app_id(&view.name, &topic, *p), self.floors.get(&(i, *p)).copied())).collect();
            let source = PathBuf::from(format!("kafka topic {topic}"));
            let location = self.config.view_table(&view);
            let app_ids: Vec<String> = txns.iter().map(|(a, _)| a.clone()).collect();
            let mut attempt = 0;
            let appended = self.retry(&format!("appending `{}` to Delta", view.name), || {
                attempt += 1;
                if attempt > 1 {
                    // The last try may have committed before failing to say so.
                    let recorded = rt.block_on(txn_versions(&location, &app_ids))?;
                    if txns.iter().zip(&recorded).all(|((_, want), got)| *got == Some(*want)) {
                        return Ok(Some(0));
                    }
                }
                let options = AppendOptions::new(None).with_txns(txns.clone()).with_expected_txns(expected.clone());
                match rt.block_on(write_offline(&self.config, &self.defs, &view, &source, &rows, options)) {
                    Ok(report) => Ok(Some(report.rows)),
                    Err(Error::Offline(e @ quiver_offline::Error::Fenced { .. })) => {
                        eprintln!("warning: {e}; this consumer's batch of `{}` is dropped and read again", view.name);
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            });
            match appended {
                None => return Ok(Written::Interrupted),
                Some(Some(n)) => {
                    Metrics::add(&self.metrics.appended_offline, n);
                    for (p, o) in &partitions {
                        self.floors.insert((i, *p), *o);
                    }
                }
                Some(None) => {
                    Metrics::add(&self.metrics.fenced, 1);
                    // What the table holds now is this view's floor.
                    let Some(recorded) = self.retry(&format!("reading `{}`'s stream progress", view.name), || {
                        Ok(rt.block_on(txn_versions(&location, &app_ids))?)
                    }) else {
                        return Ok(Written::Interrupted);
                    };
                    for ((p, _), got) in partitions.iter().zip(recorded) {
                        match got {
                            Some(v) => self.floors.insert((i, *p), v),
                            None => self.floors.remove(&(i, *p)),
                        };
                    }
                    outcome = Written::Fenced;
                }
            }
        }
        Ok(outcome)
    }

    /// Sends the dead letters, each acknowledged by the broker. Transient failures are
    /// retried until they pass (or shutdown: `Ok(false)`); a letter the topic refuses
    /// ([`refused`]) is tried [`REFUSED_TRIES`] times whole, then as many times with
    /// its payload cut to [`TRUNCATED_PAYLOAD_BYTES`].
    ///
    /// # Errors
    /// [`Error::Kafka`] when a dead letter is refused even cut short.
    fn deliver_dead_letters(&self, dead: &[DeadLetter]) -> Result<bool> {
        let mut pending: Vec<(usize, bool)> = (0..dead.len()).map(|i| (i, false)).collect();
        let mut refusals = vec![0u32; dead.len()];
        let mut wait = Duration::from_millis(100);
        while !pending.is_empty() {
            let results = self.send_dead_letters(dead, &pending);
            let mut next = Vec::new();
            let mut transient = None;
            for ((i, cut), result) in pending.iter().copied().zip(results) {
                let Err(e) = result else {
                    if cut {
                        Metrics::add(&self.metrics.dead_letters_truncated, 1);
                    }
                    continue;
                };
                if !refused(&e) {
                    transient = Some(e);
                    next.push((i, cut));
                    continue;
                }
                refusals[i] += 1;
                let d = &dead[i];
                if refusals[i] < REFUSED_TRIES {
                    next.push((i, cut));
                } else if !cut {
                    eprintln!(
                        "warning: {}{} refused the dead letter of {}[{}]@{} ({e}); sending it with the payload cut to {TRUNCATED_PAYLOAD_BYTES} bytes (the whole message stays in {} at that offset)",
                        d.topic, self.options.dlq_suffix, d.topic, d.partition, d.offset, d.topic
                    );
                    refusals[i] = 0;
                    next.push((i, true));
                } else {
                    return Err(Error::Kafka {
                        brokers: self.options.brokers.clone(),
                        message: format!(
                            "{}{} refused the dead letter of {}[{}]@{} even cut to {TRUNCATED_PAYLOAD_BYTES} bytes ({e}); stopping with nothing of the batch committed",
                            d.topic, self.options.dlq_suffix, d.topic, d.partition, d.offset
                        ),
                    });
                }
            }
            pending = next;
            if pending.is_empty() {
                break;
            }
            Metrics::add(&self.metrics.retries, 1);
            if let Some(e) = transient {
                tracing::warn!(error = %e, "sending dead letters failed; retrying in {wait:?}");
                eprintln!("warning: sending dead letters failed ({e}); retrying in {wait:?}");
            }
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if self.shutdown.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        Ok(true)
    }

    /// Sends the dead letters `which` names (index, payload cut short), one result each.
    fn send_dead_letters(&self, dead: &[DeadLetter], which: &[(usize, bool)]) -> Vec<std::result::Result<(), rdkafka::error::KafkaError>> {
        let texts: Vec<(String, String, String, String)> = which
            .iter()
            .map(|&(i, _)| {
                let d = &dead[i];
                (format!("{}{}", d.topic, self.options.dlq_suffix), d.partition.to_string(), d.offset.to_string(), d.payload.len().to_string())
            })
            .collect();
        self.rt.block_on(async {
            let mut sends = Vec::with_capacity(which.len());
            for (&(i, cut), (dlq, partition, offset, size)) in which.iter().zip(&texts) {
                let d = &dead[i];
                let mut headers = OwnedHeaders::new()
                    .insert(Header { key: "quiver.error", value: Some(d.reason.as_bytes()) })
                    .insert(Header { key: "quiver.source.topic", value: Some(d.topic.as_bytes()) })
                    .insert(Header { key: "quiver.source.partition", value: Some(partition.as_bytes()) })
                    .insert(Header { key: "quiver.source.offset", value: Some(offset.as_bytes()) });
                let payload = if cut {
                    headers = headers.insert(Header { key: "quiver.payload.truncated", value: Some(size.as_bytes()) });
                    &d.payload[..d.payload.len().min(TRUNCATED_PAYLOAD_BYTES)]
                } else {
                    &d.payload[..]
                };
                let mut record = FutureRecord::to(dlq).payload(payload).headers(headers);
                if let Some(key) = &d.key {
                    record = record.key(key);
                }
                sends.push(self.producer.send(record, Duration::from_secs(10)));
            }
            futures::future::join_all(sends).await.into_iter().map(|r| r.map(|_| ()).map_err(|(e, _)| e)).collect()
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
    let readers = chosen.iter().map(|&vi| RowReader::new(&defs, &defs.feature_views[vi])).collect();
    let registry = FileRegistry::new(config.registry_path.clone());
    let registry_mtime = std::fs::metadata(registry.path()).and_then(|m| m.modified()).ok();
    let pipeline = Arc::new(Mutex::new(Pipeline {
        readers,
        registry,
        registry_mtime,
        first: BTreeMap::new(),
        fatal: None,
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
    let mut last_registry_check = Instant::now();
    let mut failed: Option<Error> = None;
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
            if p.due()
                && let Err(e) = p.flush(&consumer)
            {
                p.fatal.get_or_insert(e);
            }
            if let Some(e) = p.fatal.take() {
                failed = Some(e);
                break;
            }
            if p.pending == 0 && last_registry_check.elapsed() >= Duration::from_secs(1) {
                last_registry_check = Instant::now();
                if let Err(e) = p.reload_registry() {
                    failed = Some(e);
                    break;
                }
            }
        }
        if last_lag.elapsed() >= Duration::from_secs(5) {
            update_lag(&consumer, &metrics);
            last_lag = Instant::now();
        }
    }
    if let Some(e) = failed {
        // Nothing of the current batch is committed: it is read again on the next start.
        consumer.unsubscribe();
        return Err(e);
    }
    // Graceful stop: what is pending is written and committed.
    // (A store that is down now is not waited for: the batch is read again next start.)
    let clean = pipeline.lock().expect("pipeline lock").flush(&consumer);
    consumer.unsubscribe();
    drop(consumer);
    match clean {
        Ok(true) => {}
        Ok(false) => eprintln!("warning: the last batch was not committed; it is read again on the next start"),
        Err(e) => return Err(e),
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
