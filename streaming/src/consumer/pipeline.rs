//! The micro-batch: messages read, rows and dead letters gathered into a [`Batch`],
//! handed to the [`Writer`] on its own thread while the next batch is gathered, and
//! committed when the writer reports it in both stores. At most one batch is being
//! written at a time, so batches land (and commit) in the order they were read.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use quiver_offline::delta::txn_versions;
use quiver_runtime::rows::RowReader;
use quiver_runtime::write_time::WriteTransform;
use quiver_sdk::{Config, Definitions, FeatureView, FileRegistry};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::runtime::Handle;

use super::dead_letters::DeadLetter;
use super::events::Event;
use super::writer::{Batch, Floors, Transforms, Writer, Written, retry};
use super::{StreamContext, StreamOptions, app_id};
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// A batch on the writer's thread, with the offsets its outcome decides about.
pub(super) struct InFlight {
    handle: JoinHandle<(Writer, Result<Written>)>,
    consumed: BTreeMap<(String, i32), i64>,
    first: BTreeMap<(String, i32), i64>,
}

/// The gathering side of the stream, shared with the rebalance callbacks.
pub(super) struct Pipeline {
    pub(super) config: Config,
    pub(super) defs: Arc<Definitions>,
    /// Indexes into `defs.feature_views`.
    pub(super) views: Vec<usize>,
    /// The row reader of each view (same order as `views`): of its raw rows for a view
    /// with write-time expressions, which the writer shapes with its transform.
    pub(super) readers: Vec<RowReader>,
    pub(super) transforms: Transforms,
    /// The registry file, re-read between batches when it changes.
    pub(super) registry: FileRegistry,
    pub(super) registry_mtime: Option<std::time::SystemTime>,
    pub(super) by_topic: HashMap<String, Vec<usize>>,
    /// Started without naming views: every live version of every streamed view is fed,
    /// and a version made while it runs is added when the registry shows it.
    pub(super) every_view: bool,
    pub(super) options: StreamOptions,
    pub(super) rt: Handle,
    pub(super) metrics: Arc<Metrics>,
    /// The batch being gathered (its `defs` and `views` are set when it is handed over).
    pub(super) batch: Batch,
    /// Shared with the writer, which moves a view's floor after each append.
    pub(super) floors: Floors,
    pub(super) pending: usize,
    pub(super) started: Option<Instant>,
    /// The writer, when no batch is in flight.
    pub(super) writer: Option<Writer>,
    pub(super) in_flight: Option<InFlight>,
    /// An error met in a rebalance callback, which cannot return it: the loop stops.
    pub(super) fatal: Option<Error>,
}

/// The row reader of each of `views` (indexes into `defs.feature_views`), and its
/// write-time expressions compiled: a view with them is read as its raw rows.
///
/// # Errors
/// [`Error::Config`] for an expression that does not compile (definitions that did not
/// pass validation).
pub(super) fn readers(defs: &Definitions, views: &[usize]) -> Result<(Vec<RowReader>, Transforms)> {
    let mut readers = Vec::with_capacity(views.len());
    let mut transforms = Vec::with_capacity(views.len());
    for &vi in views {
        let view = &defs.feature_views[vi];
        let transform = WriteTransform::new(defs, view).map_err(|e| Error::Config(format!("feature view `{}`: {e}", view.name)))?;
        readers.push(RowReader::new(defs, transform.as_ref().map_or(view, WriteTransform::raw_view)));
        transforms.push(transform.map(Arc::new));
    }
    Ok((readers, transforms))
}

impl Pipeline {
    pub(super) fn view(&self, i: usize) -> &FeatureView {
        &self.defs.feature_views[self.views[i]]
    }

    pub(super) fn topic(&self, i: usize) -> &str {
        &self.view(i).source.stream.as_ref().expect("stream views only").topic
    }

    fn floor(&self, i: usize, partition: i32) -> Option<i64> {
        self.floors.lock().expect("floors lock").get(&(i, partition)).copied()
    }

    /// Reads one message into the batch; `latest` is the latest event time accepted
    /// (the wall clock, read at most a few milliseconds before, plus `max_future_skew`).
    pub(super) fn add(&mut self, topic: &str, partition: i32, offset: i64, key: Option<&[u8]>, payload: Option<&[u8]>, latest: i64) {
        let batch = &mut self.batch;
        // The key is allocated once per partition and batch, not per message.
        match batch.consumed.iter_mut().find(|((t, p), _)| *p == partition && t == topic) {
            Some((_, last)) => *last = (*last).max(offset),
            None => {
                batch.consumed.insert((topic.to_string(), partition), offset);
            }
        }
        match batch.first.iter_mut().find(|((t, p), _)| *p == partition && t == topic) {
            Some((_, first)) => *first = (*first).min(offset),
            None => {
                batch.first.insert((topic.to_string(), partition), offset);
            }
        }
        Metrics::add(&self.metrics.consumed, 1);
        self.started.get_or_insert_with(Instant::now);
        self.pending += 1;
        let Some(views) = self.by_topic.get(topic) else { return };
        let payload = payload.unwrap_or_default();
        let mut reason = None;
        let mut replayed = true;
        for &i in views {
            if self.floor(i, partition).is_some_and(|floor| offset <= floor) {
                if self.readers[i].view.takes_online_writes()
                    && let Ok(row) = self.readers[i].from_slice(payload)
                {
                    self.batch.replayed[i].push(row);
                }
                continue;
            }
            replayed = false;
            self.readers[i].latest_event = Some(latest);
            match self.readers[i].from_slice(payload) {
                Ok(row) => self.batch.rows[i].push(row),
                Err(r) => reason = Some(format!("feature view `{}`: {r}", self.readers[i].view.name)),
            }
        }
        if replayed {
            Metrics::add(&self.metrics.skipped_replayed, 1);
        }
        if let Some(reason) = reason {
            self.batch.dead.push(DeadLetter {
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

    /// Hands the gathered batch to the writer's thread, after the batch before it
    /// settled (see [`Pipeline::settle`]), and returns without waiting for it.
    ///
    /// # Errors
    /// The error the batch before it ended with (the stream must stop).
    pub(super) fn start_flush(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<()> {
        let waiting = Instant::now();
        self.settle(consumer)?;
        if self.batch.consumed.is_empty() {
            return Ok(());
        }
        let gathering = self.started.map(|t| t.elapsed());
        tracing::debug!(messages = self.pending, ?gathering, waited = ?waiting.elapsed(), "batch handed to the writer");
        let mut batch = std::mem::take(&mut self.batch);
        batch.defs = self.defs.clone();
        batch.views = self.views.clone();
        batch.transforms = self.transforms.clone();
        self.clear();
        let (consumed, first) = (batch.consumed.clone(), batch.first.clone());
        let writer = self.writer.take().expect("no batch in flight, so the writer is here");
        let handle = std::thread::Builder::new()
            .name("quiver-stream-write".into())
            .spawn(move || {
                let outcome = writer.write_batch(&mut batch);
                (writer, outcome)
            })
            .map_err(|e| Error::Config(format!("cannot start the stream's writer thread: {e}")))?;
        self.in_flight = Some(InFlight { handle, consumed, first });
        Ok(())
    }

    /// Writes the gathered batch and waits for it (and for the one before it): `false`
    /// when something was not committed — shutdown interrupted a retry (it is read
    /// again on the next start), or another member took its partitions (the consumer
    /// seeks back to the batch's first offsets).
    ///
    /// # Errors
    /// A dead letter that the dead-letter topic refuses even cut short: nothing of the
    /// batch is committed, and the stream must stop.
    pub(super) fn flush(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<bool> {
        let before = self.settle(consumer)?;
        self.start_flush(consumer)?;
        Ok(self.settle(consumer)? && before)
    }

    /// When the batch in flight has been written, settles it (without waiting).
    ///
    /// # Errors
    /// As [`Pipeline::settle`].
    pub(super) fn settle_if_done(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<()> {
        if self.in_flight.as_ref().is_some_and(|f| f.handle.is_finished()) {
            self.settle(consumer)?;
        }
        Ok(())
    }

    /// Waits for the batch in flight, if any, and acts on its outcome: in both stores,
    /// its offsets are committed; fenced, the consumer seeks back to its first offsets
    /// (and the batch gathered since is dropped: it is read again); interrupted or
    /// failed, nothing is committed and the batch gathered since is dropped too.
    /// `false` when the batch in flight was not committed.
    ///
    /// # Errors
    /// The writer's error (the stream must stop).
    pub(super) fn settle(&mut self, consumer: &BaseConsumer<StreamContext>) -> Result<bool> {
        let Some(flight) = self.in_flight.take() else { return Ok(true) };
        let (writer, outcome) = match flight.handle.join() {
            Ok(done) => done,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        self.writer = Some(writer);
        match outcome {
            Ok(Written::All) => {
                self.options.hooks.committing(self.metrics.batches.load(std::sync::atomic::Ordering::Relaxed) + 1);
                let mut tpl = TopicPartitionList::new();
                for ((topic, partition), offset) in &flight.consumed {
                    let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(offset + 1));
                }
                if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
                    // The next commit covers these offsets; a replay before it is deduplicated.
                    Metrics::add(&self.metrics.retries, 1);
                    tracing::warn!(error = %e, "committing offsets failed");
                }
                Metrics::add(&self.metrics.batches, 1);
                Ok(true)
            }
            Ok(Written::Fenced) => {
                // Read again from the first offset of either batch, whichever is lower.
                let mut first = std::mem::take(&mut self.batch.first);
                for (tp, offset) in flight.first {
                    first.insert(tp, offset);
                }
                self.seek_back(consumer, &first);
                self.clear();
                Ok(false)
            }
            Ok(Written::Interrupted) => {
                self.clear();
                Ok(false)
            }
            Err(e) => {
                self.clear();
                Err(e)
            }
        }
    }

    /// Waits for the batch in flight, if any, without committing it (a replay finds it
    /// in Delta's recorded offsets and skips it). `true` when there was one.
    pub(super) fn abandon(&mut self) -> bool {
        let Some(flight) = self.in_flight.take() else { return false };
        match flight.handle.join() {
            Ok((writer, _)) => self.writer = Some(writer),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        true
    }

    /// Forgets the batch being gathered (its rows, dead letters and offsets).
    pub(super) fn clear(&mut self) {
        let views = self.views.len();
        let batch = &mut self.batch;
        batch.rows.iter_mut().chain(&mut batch.replayed).for_each(Vec::clear);
        batch.rows.resize_with(views, Vec::new);
        batch.replayed.resize_with(views, Vec::new);
        batch.dead.clear();
        batch.consumed.clear();
        batch.first.clear();
        self.pending = 0;
        self.started = None;
    }

    /// After a batch was fenced: every partition of `first` is read again from its
    /// offset there (what a view's Delta table already holds is skipped). A partition
    /// this consumer no longer owns is not sought: its new owner reads it.
    fn seek_back(&self, consumer: &BaseConsumer<StreamContext>, first: &BTreeMap<(String, i32), i64>) {
        for ((topic, partition), first) in first {
            if let Err(e) = consumer.seek(topic, *partition, rdkafka::Offset::Offset(*first), std::time::Duration::from_secs(5)) {
                tracing::info!(error = %e, topic, partition, "not seeking back (partition no longer owned)");
            }
        }
    }

    /// The partitions were lost (another member has them): the batch in flight is
    /// waited for and not committed, the one being gathered is dropped unwritten; the
    /// new owner reads both from the committed offsets.
    pub(super) fn drop_lost(&mut self, tpl: &TopicPartitionList) {
        let unwritten = self.pending;
        if self.abandon() {
            Metrics::add(&self.metrics.lost_batches, 1);
        }
        if unwritten > 0 {
            Metrics::add(&self.metrics.lost_batches, 1);
            self.options.hooks.warn(format!(
                "partitions lost before the batch was flushed; dropping {unwritten} unwritten messages (their new owner reads them)"
            ));
        }
        self.clear();
        self.revoked(tpl);
    }

    /// Re-reads the registry if its file changed; call only between batches (the rows
    /// of a batch were read under the definitions they will be written with).
    ///
    /// Started without naming views ([`Pipeline::every_view`]), a streamed version the
    /// registry now holds and the stream does not feed — one `apply` made — is fed
    /// from the next batch on when it reads a topic the stream reads (its progress read
    /// from its table for the `assigned` partitions, as on an assignment); one reading
    /// another topic is warned about (the subscription is fixed: restart).
    ///
    /// # Errors
    /// [`Error::Config`] when a streamed view was removed or its topic changed: the
    /// consumer's subscription no longer fits, it must be restarted.
    pub(super) fn reload_registry(&mut self, assigned: &[(String, i32)]) -> Result<()> {
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
        let defs = Arc::new(doc.definitions.every_version_listed());
        let mut views = Vec::with_capacity(self.views.len());
        for i in 0..self.views.len() {
            let old = self.view(i);
            let Some(at) = defs.feature_views.iter().position(|v| v.name == old.name && v.version == old.version) else {
                return Err(Error::Config(format!(
                    "registry version {}: feature view `{}` is no longer defined; restart `quiver stream`",
                    doc.version,
                    old.versioned_name()
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
        let mut added = Vec::new();
        if self.every_view {
            for (at, view) in defs.feature_views.iter().enumerate() {
                let Some(stream) = &view.source.stream else { continue };
                if views.contains(&at) {
                    continue;
                }
                if self.by_topic.contains_key(&stream.topic) {
                    added.push((views.len(), stream.topic.clone(), view.versioned_name()));
                    views.push(at);
                } else {
                    self.options.hooks.warn(format!(
                        "registry version {}: feature view `{}` streams from `{}`, which this stream does not read; restart `quiver stream` to feed it",
                        doc.version,
                        view.versioned_name(),
                        stream.topic
                    ));
                }
            }
        }
        (self.readers, self.transforms) = readers(&defs, &views)?;
        self.views = views;
        self.defs = defs;
        self.clear();
        Metrics::add(&self.metrics.registry_reloads, 1);
        self.options.hooks.emit(Event::Reloaded { version: doc.version });
        for (i, topic, view) in added {
            self.by_topic.entry(topic.clone()).or_default().push(i);
            for (_, partition) in assigned.iter().filter(|(t, _)| *t == topic) {
                if !self.read_floor(i, &topic, *partition) {
                    return Ok(());
                }
            }
            self.options.hooks.emit(Event::Added { view, topic });
        }
        Ok(())
    }

    /// Reads from view `i`'s Delta table how far it has appended `partition` of
    /// `topic` into the floors; `false` when shutdown interrupted the reading.
    fn read_floor(&mut self, i: usize, topic: &str, partition: i32) -> bool {
        let view = self.view(i).clone();
        let location = self.config.view_table(&view);
        let app = vec![app_id(&view.name, topic, partition)];
        let rt = self.rt.clone();
        let Some(got) =
            retry(&self.options, &format!("reading `{}`'s stream progress", view.name), || Ok(rt.block_on(txn_versions(&location, &app))?))
        else {
            return false;
        };
        let mut floors = self.floors.lock().expect("floors lock");
        match got[0] {
            Some(v) => floors.insert((i, partition), v),
            None => floors.remove(&(i, partition)),
        };
        true
    }

    /// Reads back from Delta how far each view has appended the newly assigned
    /// partitions, so replayed messages are not appended twice.
    pub(super) fn assigned(&mut self, tpl: &TopicPartitionList) {
        for elem in tpl.elements() {
            let (topic, partition) = (elem.topic().to_string(), elem.partition());
            let Some(views) = self.by_topic.get(&topic).cloned() else { continue };
            for i in views {
                if !self.read_floor(i, &topic, partition) {
                    return;
                }
            }
            self.options.hooks.emit(Event::Assigned { topic, partition });
        }
    }

    pub(super) fn revoked(&mut self, tpl: &TopicPartitionList) {
        for elem in tpl.elements() {
            self.options.hooks.emit(Event::Revoked { topic: elem.topic().to_string(), partition: elem.partition() });
            let Some(views) = self.by_topic.get(elem.topic()).cloned() else { continue };
            let mut floors = self.floors.lock().expect("floors lock");
            for i in views {
                floors.remove(&(i, elem.partition()));
            }
        }
    }
}
