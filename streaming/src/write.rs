//! The one write path for fresh rows: Kafka messages (`quiver stream`), files
//! (`quiver push`) and the server's `/push` all end here, as do materialization's
//! online writes.
//!
//! - Online: each row becomes the packed row of docs/online.md under its entity's key and goes
//!   through the store's guarded write (newer `(event_ts, created_ts)` wins, equal
//!   replaces), so replays and out-of-order writers never regress a value.
//! - Offline: rows are appended to the view's Delta table through the same code as
//!   `ingest` (checks, sort, ingestion order, one commit), optionally with Delta `txn`
//!   actions recording how far a Kafka partition has been appended.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::TimestampMicrosecondType;
use quiver_offline::delta::OWES_ONLINE;
use quiver_offline::historical::{EntityEvents, EventCache};
use quiver_offline::ingest::{AppendOptions, IngestReport, append};
use quiver_offline::schema::{ViewLayout, key_at, rows_to_columns, table_schema, value_at};
use quiver_online::{OnlineStore, WriteRow};
use quiver_runtime::encoding::{KeyValue, OnlineRow, expire_at_ms, store_key};
use quiver_runtime::record::{AggRecord, Layout};
use quiver_runtime::rows::ViewRow;
use quiver_sdk::definitions::fingerprint;
use quiver_sdk::{Config, Definitions, FeatureView};

use crate::error::{Error, Result};

pub use quiver_runtime::rows::Target;

/// The online rows of a batch laid out as the view's table columns (keys, event time,
/// created time when the view has one, features), as materialization and `push` of a
/// file produce them.
pub fn online_rows(project: &str, defs: &Definitions, view: &FeatureView, batch: &RecordBatch) -> Vec<WriteRow> {
    let keys = defs.join_keys(view);
    let layout = ViewLayout::rows(defs, view);
    let ts = batch.column(layout.event_time()).as_primitive::<TimestampMicrosecondType>();
    let created = layout.created_time().map(|c| batch.column(c).as_primitive::<TimestampMicrosecondType>());
    let print = fingerprint(view);
    (0..batch.num_rows())
        .map(|r| {
            let key_values: Vec<KeyValue> = keys.iter().enumerate().map(|(i, k)| key_at(k.dtype, batch.column(i), r)).collect();
            let event_ts = ts.value(r);
            let row = OnlineRow {
                event_ts,
                created_ts: created.map_or(i64::MIN, |c| c.value(r)),
                fingerprint: print,
                values: view
                    .features
                    .iter()
                    .enumerate()
                    .map(|(k, f)| value_at(batch.column(layout.feature(k)).as_ref(), r, f.dtype))
                    .collect(),
            };
            WriteRow {
                key: store_key(project, &view.storage_name(), &key_values),
                row: row.encode(),
                expire_at_ms: expire_at_ms(view, event_ts),
            }
        })
        .collect()
}

/// Writes typed rows to the online store through the guarded write. Returns the rows
/// the store took (the others were older than what it held).
///
/// # Errors
/// [`Error::Online`] when the store is unavailable; nothing is retried here.
pub async fn write_online(project: &str, view: &FeatureView, rows: &[ViewRow], store: &dyn OnlineStore) -> Result<usize> {
    Ok(store.write(&WriteRow::of_rows(project, view, rows)).await?)
}

/// Appends typed rows to the view's Delta table in one commit, as `options` says
/// (`txn` actions, the versions they must follow). The rows' event times were checked
/// where they were read ([`quiver_runtime::rows::RowReader::with_latest_event`]).
///
/// # Errors
/// [`Error::Offline`] when the commit fails or is fenced; the table is then unchanged.
pub async fn write_offline(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    source: &str,
    rows: &[ViewRow],
    options: AppendOptions,
) -> Result<IngestReport> {
    let schema = table_schema(defs, view);
    let fields: Vec<_> = schema.fields().iter().take(schema.fields().len() - 1).cloned().collect();
    let batch = RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), rows_to_columns(view, rows))
        .map_err(|e| Error::Offline(quiver_offline::Error::Arrow(e)))?;
    Ok(append(&config.view_table(view), defs, view, source, vec![batch], options, &|_, _| {}).await?)
}

/// What a push did.
#[derive(Debug, Clone, PartialEq)]
pub struct PushReport {
    pub rows: usize,
    /// Rows the online store took (`None`: not written online).
    pub online_written: Option<usize>,
    /// The Delta version committed (`None`: not written offline).
    pub offline_version: Option<u64>,
    /// Rows the view's source filter dropped (docs/transformations.md#write-time).
    pub dropped: usize,
    /// Values its write-time expressions could not compute (stored null).
    pub uncomputed: u64,
}

/// Pushes a file (Parquet, CSV, JSON lines) of `view`'s rows to `target`, checked by
/// the same code as `ingest` before anything is written (event times after the wall
/// clock plus `max_future_skew` included).
///
/// # Errors
/// [`Error::Config`] for an online push to a view with `online: false`;
/// [`Error::Offline`] naming the file, column and row for input that does not fit; the
/// failing store's error otherwise.
pub async fn push_file(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    file: &Path,
    target: Target,
    store: Option<&dyn OnlineStore>,
) -> Result<PushReport> {
    let transform = quiver_offline::ingest::write_transform(defs, view, &file.display().to_string())?;
    let batches = quiver_offline::input::read_file(file, defs, transform.as_ref().map_or(view, |t| t.raw_view()))?;
    push_batches(config, defs, view, &file.display().to_string(), batches, target, store).await
}

/// Pushes batches of `view`'s rows (any column order; extra columns ignored) to
/// `target`, all checked before anything is written; `source` names them in errors. A
/// view with write-time expressions takes its raw rows, shaped before the writes.
///
/// # Errors
/// As [`push_file`].
pub async fn push_batches(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    source: &str,
    batches: Vec<RecordBatch>,
    target: Target,
    store: Option<&dyn OnlineStore>,
) -> Result<PushReport> {
    check_target(view, target).map_err(Error::Config)?;
    let latest = config.event_horizon(chrono::Utc::now().timestamp_micros());
    let transform = quiver_offline::ingest::write_transform(defs, view, source)?;
    let shaped = quiver_offline::ingest::shape(defs, transform.as_ref(), source, batches, Some(latest))?;
    let (dropped, uncomputed) = (shaped.dropped, shaped.uncomputed);
    // Every row filtered out: nothing to write, and not an error (docs/transformations.md#write-time).
    if shaped.batches.is_empty() && dropped > 0 {
        return Ok(PushReport { rows: 0, online_written: target.online().then_some(0), offline_version: None, dropped, uncomputed });
    }
    // Shaped rows are the view's rows already; others are checked here, once.
    let conformed = if transform.is_some() {
        shaped.batches
    } else {
        quiver_offline::ingest::conform_batches(defs, view, source, &shaped.batches, Some(latest))?
    };
    let rows = conformed.iter().map(RecordBatch::num_rows).sum();
    // An event log's online records come from its table: its events go there first.
    let offline_version = if target.offline() || view.is_event_log() {
        append(&config.view_table(view), defs, view, source, conformed.clone(), AppendOptions::new(None), &|_, _| {}).await?.version
    } else {
        None
    };
    let online = async {
        Ok::<_, Error>(match (target.online(), store) {
            (true, Some(store)) if view.is_event_log() => {
                let entities = batch_entities(defs, view, &conformed);
                Some(refresh_event_log(config, defs, view, &entities, store, &EventCache::new()).await?)
            }
            (true, Some(store)) => {
                let mut written = 0;
                for batch in &conformed {
                    written += store.write(&online_rows(&config.project, defs, view, batch)).await?;
                }
                Some(written)
            }
            (true, None) => return Err(Error::Config("no online store to push to".into())),
            (false, _) => None,
        })
    };
    // Rows committed offline whose online write fails are not half a push the caller
    // could retry: the error says where they are (docs/online.md#push-when-the-online-store-fails).
    let online_written = match (online.await, offline_version) {
        (Ok(written), _) => written,
        (Err(e), Some(version)) => return Err(Error::OnlineAfterOffline { version, source: Box::new(e) }),
        (Err(e), None) => return Err(e),
    };
    Ok(PushReport { rows, online_written, offline_version, dropped, uncomputed })
}

/// The online records of an event log's entities (docs/aggregations.md), built at `now` from their
/// events read at table `version`: one guarded write per entity, dated by the version.
pub fn event_log_rows(project: &str, view: &FeatureView, events: &EntityEvents, now: i64) -> Vec<WriteRow> {
    let layout = Layout::of(view);
    let version = events.version.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
    events
        .entities
        .iter()
        .map(|(keys, events)| {
            let record = AggRecord::build(&layout, events, quiver_sdk::Timestamp(now), version);
            WriteRow {
                key: store_key(project, &view.storage_name(), keys),
                row: record.encode(&layout),
                expire_at_ms: record.expire_at_ms(&layout),
            }
        })
        .collect()
}

/// Rebuilds the online records of `entities` of an event log from its Delta table, as
/// it is now: how pushes and the stream update an event log online, after their
/// Delta commit. A record is a function of the table, so a replay writes the same
/// record again and no event is counted twice or lost. The events come through
/// `cache`, which a long-lived writer keeps: it reads only the versions committed
/// since its last rebuild. Returns the records written.
///
/// # Errors
/// An unreadable table or an unavailable store.
pub async fn refresh_event_log(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    entities: &[Vec<KeyValue>],
    store: &dyn OnlineStore,
    cache: &EventCache,
) -> Result<usize> {
    if entities.is_empty() {
        return Ok(0);
    }
    let now = chrono::Utc::now().timestamp_micros();
    let began = std::time::Instant::now();
    let events = cache.events(config, defs, view, Layout::of(view).earliest_tail(now), entities).await?;
    let read = began.elapsed();
    let rows = event_log_rows(&config.project, view, &events, now);
    let built = began.elapsed() - read;
    let written = store.write(&rows).await?;
    tracing::debug!(view = %view.name, entities = rows.len(), ?read, ?built, written = ?began.elapsed() - read - built, "event log records rebuilt");
    Ok(written)
}

/// The join-key values of each row of batches laid out as the view's table columns.
pub fn batch_entities(defs: &Definitions, view: &FeatureView, batches: &[RecordBatch]) -> Vec<Vec<KeyValue>> {
    let keys = defs.join_keys(view);
    let mut out = Vec::new();
    for batch in batches {
        for r in 0..batch.num_rows() {
            out.push(keys.iter().enumerate().map(|(i, k)| key_at(k.dtype, batch.column(i), r)).collect());
        }
    }
    out
}

/// Refuses an online write to a view with `online: false` (docs/limits.md: such a view takes
/// no online writes).
///
/// # Errors
/// The reason, naming the view.
pub fn check_target(view: &FeatureView, target: Target) -> std::result::Result<(), String> {
    if target.online() {
        view.check_online_writes()?;
    }
    Ok(())
}

/// The server's `/push` offline half: appends to the view's Delta table through
/// [`write_offline`], the table read afresh each time (kept open between pushes, three
/// clients pushing at once to one view got 503s in the abuse test's short soak);
/// rebuilds event logs' records through one [`EventCache`].
#[derive(Debug, Clone)]
pub struct DeltaWriter {
    pub config: Config,
    events: Arc<EventCache>,
}

impl DeltaWriter {
    pub fn new(config: Config) -> DeltaWriter {
        DeltaWriter { config, events: Arc::new(EventCache::long_lived()) }
    }
}

#[async_trait::async_trait]
impl quiver_online::server::OfflineWriter for DeltaWriter {
    async fn append(
        &self,
        defs: &Definitions,
        view: &FeatureView,
        rows: &[ViewRow],
        owes_online: bool,
    ) -> std::result::Result<u64, String> {
        let mut options = AppendOptions::new(None);
        if owes_online {
            // The marker's version is the time: only its presence in the entry is read.
            options = options.with_txns(vec![(OWES_ONLINE.to_string(), chrono::Utc::now().timestamp_millis())]);
        }
        write_offline(&self.config, defs, view, "/push request", rows, options)
            .await
            .map(|r| r.version.expect("an append of rows commits a version"))
            .map_err(|e| e.to_string())
    }

    async fn refresh_event_log(
        &self,
        defs: &Definitions,
        view: &FeatureView,
        entities: &[Vec<KeyValue>],
        store: &dyn OnlineStore,
    ) -> std::result::Result<usize, String> {
        refresh_event_log(&self.config, defs, view, entities, store, &self.events).await.map_err(|e| e.to_string())
    }
}
