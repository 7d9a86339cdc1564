//! The micro-batch: messages read, rows and dead letters gathered, written to both
//! stores and committed; shared with the rebalance callbacks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quiver_offline::delta::txn_versions;
use quiver_offline::ingest::AppendOptions;
use quiver_online::OnlineStore;
use quiver_sdk::rows::{RowReader, ViewRow};
use quiver_sdk::{Config, Definitions, FeatureView, FileRegistry};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tokio::runtime::Handle;

use super::dead_letters::DeadLetter;
use super::events::Event;
use super::{StreamContext, StreamOptions, app_id};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::write::write_offline;

/// How far a batch got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    /// In every store: its offsets may be committed.
    All,
    /// Shutdown interrupted a retry: nothing is committed, the batch is read again on
    /// the next start.
    Interrupted,
    /// Another member appended some of these partitions first: nothing is committed and
    /// the consumer seeks back.
    Fenced,
}

/// The state of the current micro-batch, shared with the rebalance callbacks.
pub(super) struct Pipeline {
    pub(super) config: Config,
    pub(super) defs: Arc<Definitions>,
    /// Indexes into `defs.feature_views`.
    pub(super) views: Vec<usize>,
    /// The row reader of each view (same order as `views`).
    pub(super) readers: Vec<RowReader>,
    /// The registry file, re-read between batches when it changes.
    pub(super) registry: FileRegistry,
    pub(super) registry_mtime: Option<std::time::SystemTime>,
    /// Lowest offset read per (topic, partition) in this batch: where to seek back to
    /// when the batch cannot be committed.
    pub(super) first: BTreeMap<(String, i32), i64>,
    pub(super) by_topic: HashMap<String, Vec<usize>>,
    pub(super) store: Arc<dyn OnlineStore>,
    pub(super) producer: FutureProducer,
    pub(super) options: StreamOptions,
    pub(super) rt: Handle,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: Arc<AtomicBool>,
    /// Per view (same order as `views`): good rows.
    pub(super) rows: Vec<Vec<ViewRow>>,
    /// Per view: rows of messages its table already holds (read again after a crash or
    /// a rebalance). An event log rebuilds their entities' online records, which a
    /// crash may have left without them.
    pub(super) replayed: Vec<Vec<ViewRow>>,
    pub(super) dead: Vec<DeadLetter>,
    /// Highest offset read per (topic, partition) in this batch.
    pub(super) consumed: BTreeMap<(String, i32), i64>,
    /// (view index, partition) -> the last offset its Delta table recorded.
    pub(super) floors: HashMap<(usize, i32), i64>,
    pub(super) pending: usize,
    pub(super) started: Option<Instant>,
    /// An error met in a rebalance callback, which cannot return it: the loop stops.
    pub(super) fatal: Option<Error>,
}

impl Pipeline {
    pub(super) fn view(&self, i: usize) -> &FeatureView {
        &self.defs.feature_views[self.views[i]]
    }

    pub(super) fn topic(&self, i: usize) -> &str {
        &self.view(i).source.stream.as_ref().expect("stream views only").topic
    }

    pub(super) fn add(&mut self, topic: &str, partition: i32, offset: i64, key: Option<&[u8]>, payload: Option<&[u8]>) {
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
                if self.readers[i].view.is_event_log()
                    && let Ok(row) = self.readers[i].from_slice(payload)
                {
                    self.replayed[i].push(row);
                }
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

    pub(super) fn due(&self) -> bool {
        self.pending >= self.options.batch_rows || self.started.is_some_and(|t| t.elapsed() >= self.options.batch_interval)
    }

    /// Runs `step` until it succeeds, backing off up to 5 s between tries. Gives up
    /// (`false`) only when shutdown is asked for: nothing is committed then, and the
    /// batch is read again on the next start.
    pub(super) fn retry<T>(&self, what: &str, mut step: impl FnMut() -> Result<T>) -> Option<T> {
        let mut wait = Duration::from_millis(100);
        loop {
            match step() {
                Ok(v) => return Some(v),
                Err(e) => {
                    Metrics::add(&self.metrics.retries, 1);
                    self.options.hooks.warn(format!("{what} failed ({e}); retrying in {wait:?}"));
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
    pub(super) fn flush(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<bool> {
        if self.consumed.is_empty() {
            return Ok(true);
        }
        let outcome = self.write_batch();
        let done = matches!(outcome, Ok(Written::All));
        if done {
            self.options.hooks.committing(self.metrics.batches.load(Ordering::Relaxed) + 1);
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
    pub(super) fn clear(&mut self) {
        for rows in self.rows.iter_mut().chain(&mut self.replayed) {
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
    pub(super) fn seek_back(&self, consumer: &BaseConsumer<StreamContext>) {
        for ((topic, partition), first) in &self.first {
            if let Err(e) = consumer.seek(topic, *partition, Offset::Offset(*first), Duration::from_secs(5)) {
                tracing::info!(error = %e, topic, partition, "not seeking back (partition no longer owned)");
            }
        }
    }

    /// The partitions were lost (another member has them): the batch is dropped
    /// unwritten; the new owner reads it from the committed offsets.
    pub(super) fn drop_lost(&mut self, tpl: &TopicPartitionList) {
        if !self.consumed.is_empty() {
            Metrics::add(&self.metrics.lost_batches, 1);
            self.options.hooks.warn(format!(
                "partitions lost before the batch was flushed; dropping {} unwritten messages (their new owner reads them)",
                self.pending
            ));
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
    pub(super) fn reload_registry(&mut self) -> Result<()> {
        let mtime = std::fs::metadata(self.registry.path()).and_then(|m| m.modified()).ok();
        if mtime.is_none() || mtime == self.registry_mtime {
            return Ok(());
        }
        self.registry_mtime = mtime;
        let doc = match self.registry.load_or_empty(&self.config.project) {
            Ok(doc) if doc.version > 0 => doc,
            Ok(_) => {
                Metrics::add(&self.metrics.registry_errors, 1);
                let registry = self.registry.path().display();
                self.options.hooks.warn(format!("registry {registry} is empty; streaming on with the last good definitions"));
                return Ok(());
            }
            Err(e) => {
                Metrics::add(&self.metrics.registry_errors, 1);
                self.options.hooks.warn(format!("registry changed but cannot be read ({e}); streaming on with the last good definitions"));
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
        self.options.hooks.emit(Event::Reloaded { version: doc.version });
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
            if self.rows[i].is_empty() && self.replayed[i].is_empty() {
                continue;
            }
            match self.write_view(i)? {
                Written::All => {}
                Written::Interrupted => return Ok(Written::Interrupted),
                Written::Fenced => outcome = Written::Fenced,
            }
        }
        Ok(outcome)
    }

    /// Writes view `i`'s rows of the batch: 2. online, through the guarded write (not
    /// for offline-only views); 3. offline, with the partitions' last offsets in the
    /// same commit, after the progress this consumer knows of (else another member
    /// took over: fenced).
    fn write_view(&mut self, i: usize) -> Result<Written> {
        let view = self.view(i).clone();
        let rows: Vec<ViewRow> = std::mem::take(&mut self.rows[i]);
        if view.is_event_log() {
            return self.write_event_log(i, &view, rows);
        }
        let rt = self.rt.clone();
        if view.online {
            let writes = quiver_online::WriteRow::of_rows(&self.config.project, &view, &rows);
            let store = self.store.clone();
            let Some(written) = self.retry(&format!("writing `{}` online", view.name), || Ok(rt.block_on(store.write(&writes))?)) else {
                return Ok(Written::Interrupted);
            };
            Metrics::add(&self.metrics.written_online, written);
            let now = chrono::Utc::now().timestamp_micros();
            for r in &rows {
                self.metrics.observe_freshness((now - r.event_ts) as f64 / 1e6);
            }
        }
        self.append_offline(i, &view, &rows)
    }

    /// An event log's rows of the batch (SPEC §11): 2. offline first, as any view's;
    /// 3. then the online records of the batch's entities — of its new rows and of
    /// those read again — rebuilt from the table. A record is a function of the
    /// table, so a crash anywhere, and the replay after it, never counts an event
    /// twice or loses one.
    fn write_event_log(&mut self, i: usize, view: &FeatureView, rows: Vec<ViewRow>) -> Result<Written> {
        if !rows.is_empty() {
            match self.append_offline(i, view, &rows)? {
                Written::All => {}
                other => return Ok(other),
            }
        }
        if !view.online {
            return Ok(Written::All);
        }
        let replayed = std::mem::take(&mut self.replayed[i]);
        let entities: Vec<Vec<quiver_sdk::encoding::KeyValue>> = rows.iter().chain(&replayed).map(|r| r.keys.clone()).collect();
        let (rt, store, config, defs) = (self.rt.clone(), self.store.clone(), self.config.clone(), self.defs.clone());
        let refresh = || rt.block_on(crate::write::refresh_event_log(&config, &defs, view, &entities, store.as_ref()));
        let Some(written) = self.retry(&format!("rebuilding `{}` online", view.name), refresh) else {
            return Ok(Written::Interrupted);
        };
        Metrics::add(&self.metrics.written_online, written);
        let now = chrono::Utc::now().timestamp_micros();
        for r in &rows {
            self.metrics.observe_freshness((now - r.event_ts) as f64 / 1e6);
        }
        Ok(Written::All)
    }

    /// Appends view `i`'s rows to its Delta table with the partitions' last offsets.
    fn append_offline(&mut self, i: usize, view: &FeatureView, rows: &[ViewRow]) -> Result<Written> {
        let rt = self.rt.clone();
        let view = view.clone();
        let topic = self.topic(i).to_string();
        let partitions: Vec<(i32, i64)> = self.consumed.iter().filter(|((t, _), _)| *t == topic).map(|((_, p), o)| (*p, *o)).collect();
        let app_ids: Vec<String> = partitions.iter().map(|(p, _)| app_id(&view.name, &topic, *p)).collect();
        let txns: Vec<(String, i64)> = app_ids.iter().cloned().zip(partitions.iter().map(|(_, o)| *o)).collect();
        let expected: Vec<(String, Option<i64>)> =
            app_ids.iter().cloned().zip(partitions.iter().map(|(p, _)| self.floors.get(&(i, *p)).copied())).collect();
        let source = format!("kafka topic {topic}");
        let location = self.config.view_table(&view);
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
            match rt.block_on(write_offline(&self.config, &self.defs, &view, &source, rows, options)) {
                Ok(report) => Ok(Some(report.rows)),
                Err(Error::Offline(e @ quiver_offline::Error::Fenced { .. })) => {
                    let name = &view.name;
                    self.options.hooks.warn(format!("{e}; this consumer's batch of `{name}` is dropped and read again"));
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        });
        match appended {
            None => Ok(Written::Interrupted),
            Some(Some(n)) => {
                Metrics::add(&self.metrics.appended_offline, n);
                for (p, o) in &partitions {
                    self.floors.insert((i, *p), *o);
                }
                Ok(Written::All)
            }
            Some(None) => {
                Metrics::add(&self.metrics.fenced, 1);
                self.reread_floors(i, &view.name, &location, &partitions, &app_ids)
            }
        }
    }

    /// After a fenced append: what the table holds now is view `i`'s floor.
    fn reread_floors(
        &mut self,
        i: usize,
        name: &str,
        location: &quiver_sdk::StoreLocation,
        partitions: &[(i32, i64)],
        app_ids: &[String],
    ) -> Result<Written> {
        let rt = self.rt.clone();
        let Some(recorded) =
            self.retry(&format!("reading `{name}`'s stream progress"), || Ok(rt.block_on(txn_versions(location, app_ids))?))
        else {
            return Ok(Written::Interrupted);
        };
        for ((p, _), got) in partitions.iter().zip(recorded) {
            match got {
                Some(v) => self.floors.insert((i, *p), v),
                None => self.floors.remove(&(i, *p)),
            };
        }
        Ok(Written::Fenced)
    }

    /// Reads back from Delta how far each view has appended the newly assigned
    /// partitions, so replayed messages are not appended twice.
    pub(super) fn assigned(&mut self, tpl: &TopicPartitionList) {
        for elem in tpl.elements() {
            let (topic, partition) = (elem.topic().to_string(), elem.partition());
            let Some(views) = self.by_topic.get(&topic).cloned() else { continue };
            for i in views {
                let view = self.view(i).clone();
                let location = self.config.view_table(&view);
                let app = vec![app_id(&view.name, &topic, partition)];
                let rt = self.rt.clone();
                let Some(got) =
                    self.retry(&format!("reading `{}`'s stream progress", view.name), || Ok(rt.block_on(txn_versions(&location, &app))?))
                else {
                    return;
                };
                match got[0] {
                    Some(v) => self.floors.insert((i, partition), v),
                    None => self.floors.remove(&(i, partition)),
                };
            }
            self.options.hooks.emit(Event::Assigned { topic, partition });
        }
    }

    pub(super) fn revoked(&mut self, tpl: &TopicPartitionList) {
        for elem in tpl.elements() {
            self.options.hooks.emit(Event::Revoked { topic: elem.topic().to_string(), partition: elem.partition() });
            let Some(views) = self.by_topic.get(elem.topic()).cloned() else { continue };
            for i in views {
                self.floors.remove(&(i, elem.partition()));
            }
        }
    }
}
