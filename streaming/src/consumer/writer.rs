//! The write half of the micro-batch: a gathered batch into the dead-letter topics,
//! the online store and Delta. It runs on its own thread while the consumer gathers
//! the next batch; the consumer commits the offsets once it hears back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_offline::delta::txn_versions;
use quiver_offline::ingest::{AppendOptions, OpenTable};
use quiver_online::OnlineStore;
use quiver_runtime::rows::ViewRow;
use quiver_runtime::write_time::WriteTransform;
use quiver_sdk::{Config, Definitions, FeatureView};
use rdkafka::producer::FutureProducer;
use tokio::runtime::Handle;

use super::dead_letters::DeadLetter;
use super::{StreamOptions, app_id};
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

/// (view index, partition) -> the last offset the view's Delta table recorded. Read by
/// the gathering side (what a replay skips), written by the writer after each append.
pub(super) type Floors = Arc<Mutex<HashMap<(usize, i32), i64>>>;

/// Per view of a stream: its write-time expressions compiled, when it has them.
pub(super) type Transforms = Vec<Option<Arc<WriteTransform>>>;

/// A gathered micro-batch: what its write needs, taken from the gathering side.
#[derive(Default)]
pub(super) struct Batch {
    /// The definitions its rows were read under.
    pub(super) defs: Arc<Definitions>,
    /// Indexes into `defs.feature_views`.
    pub(super) views: Vec<usize>,
    /// Per view: its write-time expressions, when it has them (its rows are raw rows).
    pub(super) transforms: Transforms,
    /// Per view (same order as `views`): good rows.
    pub(super) rows: Vec<Vec<ViewRow>>,
    /// Per view (online views only): rows of messages its table already holds (read
    /// again after a crash or a rebalance). A crash may have come after the Delta
    /// commit and before the online write: they are written online again, and an event
    /// log rebuilds their entities' online records.
    pub(super) replayed: Vec<Vec<ViewRow>>,
    pub(super) dead: Vec<DeadLetter>,
    /// Highest offset read per (topic, partition).
    pub(super) consumed: BTreeMap<(String, i32), i64>,
    /// Lowest offset read per (topic, partition): where to seek back to when the batch
    /// cannot be committed.
    pub(super) first: BTreeMap<(String, i32), i64>,
}

impl Batch {
    fn view(&self, i: usize) -> &FeatureView {
        &self.defs.feature_views[self.views[i]]
    }

    fn topic(&self, i: usize) -> &str {
        &self.view(i).source.stream.as_ref().expect("stream views only").topic
    }
}

/// Runs `step` until it succeeds, backing off up to 1 s between tries (a store back
/// from an outage is written to within a second). Gives up
/// (`None`) only when shutdown is asked for: nothing is committed then, and the batch
/// is read again on the next start.
pub(super) fn retry<T>(options: &StreamOptions, what: &str, mut step: impl FnMut() -> Result<T>) -> Option<T> {
    let mut wait = Duration::from_millis(100);
    loop {
        match step() {
            Ok(v) => return Some(v),
            Err(e) => {
                Metrics::add(&options.metrics.retries, 1);
                options.hooks.warn(format!("{what} failed ({e}); retrying in {wait:?}"));
                let until = Instant::now() + wait;
                while Instant::now() < until {
                    if options.shutdown.load(Ordering::Relaxed) {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// What writes batches: the stores, the dead-letter producer, the runtime.
pub(super) struct Writer {
    pub(super) config: Config,
    pub(super) store: Arc<dyn OnlineStore>,
    pub(super) producer: FutureProducer,
    pub(super) options: StreamOptions,
    pub(super) rt: Handle,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: Arc<AtomicBool>,
    pub(super) floors: Floors,
    /// The views' Delta tables by location, kept open between batches (see [`OpenTable`]).
    pub(super) tables: Mutex<HashMap<String, OpenTable>>,
    /// The event logs' events read so far, for their records' rebuilds.
    pub(super) events: quiver_offline::historical::EventCache,
}

impl Writer {
    fn floor(&self, i: usize, partition: i32) -> Option<i64> {
        self.floors.lock().expect("floors lock").get(&(i, partition)).copied()
    }

    /// Writes the batch to the dead-letter topics, the online store and Delta; the
    /// caller commits the offsets when this says [`Written::All`].
    ///
    /// # Errors
    /// A dead letter that the dead-letter topic refuses even cut short: nothing of the
    /// batch may be committed, and the stream must stop.
    pub(super) fn write_batch(&self, batch: &mut Batch) -> Result<Written> {
        // 1. Dead letters, acknowledged by the broker.
        if !batch.dead.is_empty() {
            let dead = std::mem::take(&mut batch.dead);
            match self.deliver_dead_letters(&dead)? {
                true => Metrics::add(&self.metrics.dead_lettered, dead.len()),
                false => return Ok(Written::Interrupted),
            }
        }
        let mut outcome = Written::All;
        for i in 0..batch.views.len() {
            if batch.rows[i].is_empty() && batch.replayed[i].is_empty() {
                continue;
            }
            match self.write_view(batch, i)? {
                Written::All => {}
                Written::Interrupted => return Ok(Written::Interrupted),
                Written::Fenced => outcome = Written::Fenced,
            }
        }
        Ok(outcome)
    }

    /// Writes view `i`'s rows of the batch, online (through the guarded write; not for
    /// offline-only views) and to Delta (with the partitions' last offsets in the same
    /// commit, after the progress this consumer knows of, else another member took
    /// over: fenced) at the same time, on two threads: each half waits on its own
    /// store, and one after the other they were the stream's slowest step. A crash
    /// between the two leaves rows in Delta that are not online; the next start reads
    /// them again as rows of messages the table already holds, and writes those online
    /// (the guarded write takes a row it already has as a no-op).
    fn write_view(&self, batch: &mut Batch, i: usize) -> Result<Written> {
        let view = batch.view(i).clone();
        let rows = std::mem::take(&mut batch.rows[i]);
        let (rows, shaped) = self.shape(batch, i, rows);
        if view.is_event_log() {
            return self.write_event_log(batch, i, &view, rows, shaped);
        }
        let replayed = std::mem::take(&mut batch.replayed[i]);
        let (replayed, _) = self.shape(batch, i, replayed);
        let began = Instant::now();
        let batch = &*batch;
        let ((offline, offline_took), online) = std::thread::scope(|scope| {
            let online = view.takes_online_writes().then(|| scope.spawn(|| (self.write_online(&view, &rows, &replayed), began.elapsed())));
            let offline = if rows.is_empty() { Ok(Written::All) } else { self.append_offline(batch, i, &view, &rows) };
            let offline_took = began.elapsed();
            ((offline, offline_took), online.map(|h| h.join().expect("the online write does not panic")))
        });
        let online_took = online.map(|(_, took)| took);
        tracing::debug!(view = %view.name, rows = rows.len(), replayed = replayed.len(), online = ?online_took, offline = ?offline_took, "batch written");
        let offline = offline?;
        if matches!(offline, Written::All) {
            self.count_shaped(shaped);
        }
        match offline {
            _ if online.is_some_and(|(written, _)| written.is_none()) => Ok(Written::Interrupted),
            outcome => Ok(outcome),
        }
    }

    /// View `i`'s raw rows shaped by its write-time expressions (docs/transformations.md#write-time):
    /// those failing its filter dropped, its features computed; with the counts of rows
    /// dropped and values not computed. Rows of a view without them, as they are.
    fn shape(&self, batch: &Batch, i: usize, rows: Vec<ViewRow>) -> (Vec<ViewRow>, (usize, u64)) {
        let Some(transform) = batch.transforms.get(i).and_then(Option::as_ref) else { return (rows, (0, 0)) };
        if rows.is_empty() {
            return (rows, (0, 0));
        }
        let (stored, dropped, uncomputed) = transform.apply_rows(&batch.defs, &rows);
        (stored, (dropped, uncomputed))
    }

    /// Counts a batch's shaped rows once its offline append committed them: a batch
    /// that was fenced or interrupted is read again, and counted then.
    fn count_shaped(&self, (dropped, uncomputed): (usize, u64)) {
        Metrics::add(&self.metrics.filtered, dropped);
        Metrics::add(&self.metrics.uncomputed, uncomputed as usize);
    }

    /// The online half of [`Writer::write_view`]: the batch's new rows and the rows read
    /// again, retried until written; `None` when shutdown interrupted the retries.
    fn write_online(&self, view: &FeatureView, rows: &[ViewRow], replayed: &[ViewRow]) -> Option<()> {
        let project = &self.config.project;
        let mut writes = quiver_online::WriteRow::of_rows(project, view, rows);
        writes.extend(quiver_online::WriteRow::of_rows(project, view, replayed));
        if writes.is_empty() {
            return Some(());
        }
        let (rt, store) = (&self.rt, &self.store);
        let written = retry(&self.options, &format!("writing `{}` online", view.name), || Ok(rt.block_on(store.write(&writes))?))?;
        Metrics::add(&self.metrics.written_online, written);
        self.observe_freshness(rows);
        Some(())
    }

    fn observe_freshness(&self, rows: &[ViewRow]) {
        let now = chrono::Utc::now().timestamp_micros();
        for r in rows {
            self.metrics.observe_freshness((now - r.event_ts) as f64 / 1e6);
        }
    }

    /// An event log's rows of the batch (docs/aggregations.md): 2. offline first, as any view's;
    /// 3. then the online records of the batch's entities — of its new rows and of
    /// those read again — rebuilt from the table. A record is a function of the
    /// table, so a crash anywhere, and the replay after it, never counts an event
    /// twice or loses one.
    fn write_event_log(
        &self,
        batch: &mut Batch,
        i: usize,
        view: &FeatureView,
        rows: Vec<ViewRow>,
        shaped: (usize, u64),
    ) -> Result<Written> {
        if !rows.is_empty() {
            match self.append_offline(batch, i, view, &rows)? {
                Written::All => {}
                other => return Ok(other),
            }
        }
        self.count_shaped(shaped);
        if !view.takes_online_writes() {
            return Ok(Written::All);
        }
        let replayed = std::mem::take(&mut batch.replayed[i]);
        let (replayed, _) = self.shape(batch, i, replayed);
        let entities: Vec<Vec<quiver_runtime::encoding::KeyValue>> = rows.iter().chain(&replayed).map(|r| r.keys.clone()).collect();
        let (rt, store, config, defs) = (&self.rt, &self.store, &self.config, &batch.defs);
        let committed = Instant::now();
        let refresh = || rt.block_on(crate::write::refresh_event_log(config, defs, view, &entities, store.as_ref(), &self.events));
        let Some(written) = retry(&self.options, &format!("rebuilding `{}` online", view.name), refresh) else {
            return Ok(Written::Interrupted);
        };
        Metrics::add(&self.metrics.written_online, written);
        tracing::debug!(view = %view.name, entities = entities.len(), took = ?committed.elapsed(), "event log records rebuilt after the commit");
        self.observe_freshness(&rows);
        Ok(Written::All)
    }

    /// Appends view `i`'s rows to its Delta table with the partitions' last offsets.
    fn append_offline(&self, batch: &Batch, i: usize, view: &FeatureView, rows: &[ViewRow]) -> Result<Written> {
        let rt = &self.rt;
        let topic = batch.topic(i).to_string();
        let partitions: Vec<(i32, i64)> = batch.consumed.iter().filter(|((t, _), _)| *t == topic).map(|((_, p), o)| (*p, *o)).collect();
        let app_ids: Vec<String> = partitions.iter().map(|(p, _)| app_id(&view.name, &topic, *p)).collect();
        let txns: Vec<(String, i64)> = app_ids.iter().cloned().zip(partitions.iter().map(|(_, o)| *o)).collect();
        let expected: Vec<(String, Option<i64>)> = app_ids.iter().cloned().zip(partitions.iter().map(|(p, _)| self.floor(i, *p))).collect();
        let source = format!("kafka topic {topic}");
        let location = self.config.view_table(view);
        // By location: an `apply` that moves the view's table moves the stream with it.
        let table = self.tables.lock().expect("tables lock").entry(location.to_string()).or_default().clone();
        let mut attempt = 0;
        let appended = retry(&self.options, &format!("appending `{}` to Delta", view.name), || {
            attempt += 1;
            if attempt > 1 {
                // The last try may have committed before failing to say so.
                let recorded = rt.block_on(txn_versions(&location, &app_ids))?;
                if txns.iter().zip(&recorded).all(|((_, want), got)| *got == Some(*want)) {
                    return Ok(Some(0));
                }
            }
            let options =
                AppendOptions::new(None).with_txns(txns.clone()).with_expected_txns(expected.clone()).with_open_table(table.clone());
            match rt.block_on(write_offline(&self.config, &batch.defs, view, &source, rows, options)) {
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
                let mut floors = self.floors.lock().expect("floors lock");
                for (p, o) in &partitions {
                    floors.insert((i, *p), *o);
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
        &self,
        i: usize,
        name: &str,
        location: &quiver_sdk::StoreLocation,
        partitions: &[(i32, i64)],
        app_ids: &[String],
    ) -> Result<Written> {
        let rt = &self.rt;
        let Some(recorded) =
            retry(&self.options, &format!("reading `{name}`'s stream progress"), || Ok(rt.block_on(txn_versions(location, app_ids))?))
        else {
            return Ok(Written::Interrupted);
        };
        let mut floors = self.floors.lock().expect("floors lock");
        for ((p, _), got) in partitions.iter().zip(recorded) {
            match got {
                Some(v) => floors.insert((i, *p), v),
                None => floors.remove(&(i, *p)),
            };
        }
        Ok(Written::Fenced)
    }
}
