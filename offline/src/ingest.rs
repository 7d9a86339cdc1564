//! `ingest`: a user file appended to a view's Delta table in one commit.
//!
//! The whole file is read and checked before anything is written, and the append is a
//! single Delta commit, so a failed ingest leaves the table exactly as it was.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::{DataType, Int64Type, Schema, TimestampMicrosecondType};
use arrow::row::{RowConverter, SortField};
use deltalake::kernel::Transaction;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use quiver_runtime::write_time::WriteTransform;
use quiver_sdk::config::StoreLocation;
use quiver_sdk::{Definitions, FeatureView};

use crate::delta::{ensure_table, open_table};
use crate::error::{Error, Result};
use crate::input::{Wanted, conform, read_file};
use crate::schema::{table_schema, view_columns};

/// What an ingest did.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestReport {
    /// Rows appended (for a duplicate, the rows of the content already there).
    pub rows: usize,
    /// The table version the append committed (for a duplicate, the version that
    /// holds the same content); `None` when the view's source filter dropped every
    /// row, so nothing was appended (not an error: docs/transformations.md#write-time).
    pub version: Option<u64>,
    pub seconds: f64,
    /// The same content was appended before, at `version`, so nothing was appended
    /// ([`AppendOptions::with_content`]).
    pub duplicate: bool,
    /// Rows the view's source filter dropped before the append ([`shape`]).
    pub dropped: usize,
    /// Values its write-time expressions could not compute (stored null).
    pub uncomputed: u64,
}

/// Progress of long work: called with a phase name and the rows handled so far.
pub type OnProgress<'a> = &'a (dyn Fn(&str, u64) + Sync);

/// Appends `file` (Parquet, CSV or JSON lines) to the table of `view` at `location`,
/// creating the table if it is missing.
///
/// # Errors
/// [`Error::Input`] naming the file, column and first bad row when the file does not fit
/// the view; [`Error::Delta`] when the commit fails. Either way the table is unchanged.
pub async fn ingest(
    location: &StoreLocation,
    defs: &Definitions,
    view: &FeatureView,
    file: &Path,
    latest_event: i64,
    progress: OnProgress<'_>,
) -> Result<IngestReport> {
    let start = Instant::now();
    let source = file.display().to_string();
    let transform = write_transform(defs, view, &source)?;
    let batches = read_file(file, defs, transform.as_ref().map_or(view, WriteTransform::raw_view))?;
    let shaped = shape(defs, transform.as_ref(), &source, batches, Some(latest_event))?;
    let mut report = append_shaped(location, defs, view, &source, shaped, AppendOptions::new(Some(latest_event)), progress).await?;
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// [`append`] of [`shape`]d rows, the report counting what the filter dropped and the
/// values not computed.
///
/// When the filter dropped every row (a day of only failed payments) nothing is
/// appended and the report says so: no rows, no version, the rows dropped.
///
/// # Errors
/// As [`append`].
pub async fn append_shaped(
    location: &StoreLocation,
    defs: &Definitions,
    view: &FeatureView,
    source: &str,
    shaped: Shaped,
    options: AppendOptions,
    progress: OnProgress<'_>,
) -> Result<IngestReport> {
    let (dropped, uncomputed) = (shaped.dropped, shaped.uncomputed);
    if shaped.batches.is_empty() && dropped > 0 {
        return Ok(IngestReport { rows: 0, version: None, seconds: 0.0, duplicate: false, dropped, uncomputed });
    }
    let report = append(location, defs, view, source, shaped.batches, options, progress).await?;
    Ok(IngestReport { dropped, uncomputed, ..report })
}

/// An application's progress recorded in the same Delta commit as its rows (a Delta
/// `txn` action): `quiver stream` records the last Kafka offset of each partition it
/// appended, so a replay after a crash can tell what the table already holds.
pub type AppTxn = (String, i64);

/// How an [`append`] checks and commits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct AppendOptions {
    /// Event times after this (UTC microseconds: the wall clock plus
    /// `max_future_skew`) are refused; `None` for rows already checked where they were
    /// read.
    pub latest_event: Option<i64>,
    /// `txn` actions committed atomically with the rows.
    pub txns: Vec<AppTxn>,
    /// The `txn` versions the table must hold when the rows are committed (`None`:
    /// no version recorded for that app); anything else — another writer recorded
    /// progress meanwhile — refuses the append with [`Error::Fenced`] and writes
    /// nothing. The check and the commit are one step: the commit must land on the
    /// version the check read.
    pub expected_txns: Vec<(String, Option<i64>)>,
    /// The table as this writer last left it: brought up to date from the log entries
    /// after it instead of read from the log's start (`None`: opened afresh).
    pub open: Option<OpenTable>,
    /// The content's identity (a hash), recorded with the commit; see
    /// [`AppendOptions::with_content`].
    pub content: Option<Content>,
}

/// What an append of one file's (or table's) content records about it, so that the same
/// content is not appended twice by mistake (a retry after a timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Content {
    /// A hash of the content, e.g. `sha256:<hex>`.
    pub hash: String,
    /// Append even when the table already holds this content.
    pub allow_duplicate: bool,
}

impl Content {
    /// The Delta `txn` application id a commit of this content records, with the table
    /// version it was committed as.
    fn app(&self) -> String {
        format!("quiver-ingest:{}", self.hash)
    }
}

/// A Delta table one writer keeps open between its appends (a stream: one commit per
/// micro-batch). Before each commit only the log entries written since are read, so
/// an append does not slow down as the log grows; another writer's commits are seen
/// all the same.
#[derive(Clone, Default)]
pub struct OpenTable(Arc<std::sync::Mutex<Option<deltalake::DeltaTable>>>);

impl OpenTable {
    fn take(&self) -> Option<deltalake::DeltaTable> {
        self.0.lock().expect("open table lock").take()
    }

    fn keep(&self, table: deltalake::DeltaTable) {
        *self.0.lock().expect("open table lock") = Some(table);
    }
}

impl std::fmt::Debug for OpenTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenTable").finish_non_exhaustive()
    }
}

impl PartialEq for OpenTable {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for OpenTable {}

impl AppendOptions {
    pub fn new(latest_event: Option<i64>) -> AppendOptions {
        AppendOptions { latest_event, ..AppendOptions::default() }
    }

    pub fn with_txns(mut self, txns: Vec<AppTxn>) -> AppendOptions {
        self.txns = txns;
        self
    }

    pub fn with_expected_txns(mut self, expected: Vec<(String, Option<i64>)>) -> AppendOptions {
        self.expected_txns = expected;
        self
    }

    pub fn with_open_table(mut self, open: OpenTable) -> AppendOptions {
        self.open = Some(open);
        self
    }

    /// Records `content` with the commit (a Delta `txn` action: `quiver-ingest:<hash>`
    /// at the version committed). When the table already records it — checked on the
    /// snapshot the commit would land on, so two concurrent appends of one content
    /// append it once — nothing is appended and the report says which version holds
    /// it, unless `content.allow_duplicate`.
    pub fn with_content(mut self, content: Content) -> AppendOptions {
        self.content = Some(content);
        self
    }
}

/// Appends rows of `view` to its table in one commit, creating the table if missing:
/// the shared write path of `ingest`, `push` and `stream`. `source` names where the
/// rows came from in errors; `options` bounds the event times and carries the `txn`
/// actions committed atomically with the rows and the versions they must follow.
///
/// # Errors
/// [`Error::Input`] when a batch does not fit the view; [`Error::Fenced`] when the
/// table's `txn` versions are not the expected ones; [`Error::Delta`] when the commit
/// fails (after starting over [`COMMIT_TRIES`] times when other writers keep committing
/// first). Either way the table is unchanged.
pub async fn append(
    location: &StoreLocation,
    defs: &Definitions,
    view: &FeatureView,
    source: &str,
    batches: Vec<RecordBatch>,
    options: AppendOptions,
    progress: OnProgress<'_>,
) -> Result<IngestReport> {
    let AppendOptions { latest_event, txns, expected_txns, open, content } = options;
    let start = Instant::now();
    let file = source;
    let wanted: Vec<Wanted> = view_columns(defs, view);
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    progress("read", rows as u64);
    if rows == 0 {
        return Err(Error::input(file, "no rows to ingest"));
    }

    // Check every row and sort, all before touching the table.
    let schema = table_schema(defs, view);
    let conformed: Vec<Vec<ArrayRef>> =
        conform_batches(defs, view, file, &batches, latest_event)?.into_iter().map(|b| b.columns().to_vec()).collect();
    progress("checked", rows as u64);
    drop(batches);
    let has_created = view.source.created_timestamp_field.is_some();
    let (sorted, order) = sort_for_reads(&wanted, conformed, defs.join_keys(view).len(), has_created)?;
    progress("sorted", rows as u64);

    let mut kept = open.as_ref().and_then(OpenTable::take);
    if kept.is_none() {
        ensure_table(location, &schema, &view.name).await?;
    }
    // Ingestion order: later ingests (higher versions) and later rows win ties. A
    // commit must land as exactly the version its seq numbers were made for, so it
    // never retries past a concurrent writer inside deltalake; it starts over here
    // instead (the table read again, the fence checked again, new seq numbers).
    let commit = Commit {
        location,
        schema: &schema,
        sorted: &sorted,
        order: &order,
        txns: &txns,
        expected_txns: &expected_txns,
        content: content.as_ref(),
    };
    let mut attempt = 0u32;
    let version = loop {
        attempt += 1;
        match commit_once(commit, kept.take()).await {
            Err(CommitError::Lost(e)) if attempt < COMMIT_TRIES => {
                tracing::debug!(table = %location, attempt, error = %e, "another writer committed first; appending again");
                tokio::time::sleep(std::time::Duration::from_millis(5 * u64::from(attempt) + u64::from(attempt * 7 % 11))).await;
            }
            Err(CommitError::Lost(e)) => return Err(Error::delta(location, e)),
            Err(CommitError::Duplicate(version)) => {
                return Ok(IngestReport {
                    rows,
                    version: Some(version),
                    seconds: start.elapsed().as_secs_f64(),
                    duplicate: true,
                    dropped: 0,
                    uncomputed: 0,
                });
            }
            Err(CommitError::Other(e)) => return Err(e),
            Ok((version, table)) => {
                if let Some(open) = &open {
                    open.keep(table);
                }
                break version;
            }
        }
    };
    progress("written", rows as u64);
    Ok(IngestReport { rows, version: Some(version), seconds: start.elapsed().as_secs_f64(), duplicate: false, dropped: 0, uncomputed: 0 })
}

/// How often an append starts over after other writers committed first (concurrent
/// pushes, a stream and an ingest on one table).
const COMMIT_TRIES: u32 = 50;

/// Why one commit attempt failed.
enum CommitError {
    /// Another writer took the version this commit was made for: try again.
    Lost(deltalake::DeltaTableError),
    /// The table already holds the content, appended at this version.
    Duplicate(u64),
    Other(Error),
}

impl From<Error> for CommitError {
    fn from(e: Error) -> Self {
        CommitError::Other(e)
    }
}

impl From<arrow::error::ArrowError> for CommitError {
    fn from(e: arrow::error::ArrowError) -> Self {
        CommitError::Other(e.into())
    }
}

/// What every try of an [`append`] commits, and what it checks first.
#[derive(Clone, Copy)]
struct Commit<'a> {
    location: &'a StoreLocation,
    schema: &'a arrow::datatypes::SchemaRef,
    /// The checked rows' columns, per batch, and the order to write them in.
    sorted: &'a [Vec<ArrayRef>],
    order: &'a [u32],
    txns: &'a [AppTxn],
    expected_txns: &'a [(String, Option<i64>)],
    content: Option<&'a Content>,
}

/// One try at committing the sorted rows as the table's next version, after checking
/// the `txn` fence and the content's record on the snapshot it lands on; `kept`, when
/// given, is brought up to date instead of opening the table. Returns the version
/// committed and the table as it is after the commit.
async fn commit_once(
    commit: Commit<'_>,
    kept: Option<deltalake::DeltaTable>,
) -> std::result::Result<(u64, deltalake::DeltaTable), CommitError> {
    use deltalake::DeltaTableError;
    use deltalake::kernel::transaction::TransactionError;
    let Commit { location, schema, sorted, order, txns, expected_txns, content } = commit;
    let table = match kept {
        Some(table) => match still_current(table).await {
            Some(table) => table,
            None => open_table(location).await?.ok_or_else(|| Error::Request(format!("delta table {location} vanished")))?,
        },
        None => open_table(location).await?.ok_or_else(|| Error::Request(format!("delta table {location} vanished while ingesting")))?,
    };
    let next_version = table.version().map_or(0, |v| v + 1);
    if !expected_txns.is_empty() {
        // Read from the snapshot this commit lands on top of: a writer that recorded
        // progress after it makes the commit fail instead, and the check run again.
        let snapshot = table.snapshot().map_err(|e| Error::delta(location, e))?;
        for (app, expected) in expected_txns {
            let recorded = snapshot.transaction_version(table.log_store().as_ref(), app).await.map_err(|e| Error::delta(location, e))?;
            if recorded != *expected {
                return Err(Error::Fenced { table: location.to_string(), app: app.clone(), expected: *expected, recorded }.into());
            }
        }
    }
    let mut txns = txns.to_vec();
    if let Some(content) = content {
        let app = content.app();
        if !content.allow_duplicate {
            let snapshot = table.snapshot().map_err(|e| Error::delta(location, e))?;
            let recorded = snapshot.transaction_version(table.log_store().as_ref(), &app).await.map_err(|e| Error::delta(location, e))?;
            if let Some(version) = recorded {
                return Err(CommitError::Duplicate(version as u64));
            }
        }
        txns.push((app, next_version as i64));
    }
    let seq_base = (next_version as i64) << 32;
    let mut batches_out = Vec::with_capacity(sorted.len());
    let mut at = 0usize;
    for columns in sorted {
        let m = columns.first().map_or(0, |c| c.len());
        let seq: Int64Array = order[at..at + m].iter().map(|&i| seq_base + i64::from(i)).collect();
        let mut columns = columns.clone();
        columns.push(Arc::new(seq) as ArrayRef);
        batches_out.push(RecordBatch::try_new(schema.clone(), columns)?);
        at += m;
    }
    let written = table
        .write(batches_out)
        .with_save_mode(SaveMode::Append)
        .with_commit_properties(
            CommitProperties::default()
                .with_max_retries(0)
                .with_application_transactions(txns.iter().map(|(app, v)| Transaction::new(app.clone(), *v)).collect()),
        )
        // A view that gained features since its table was created gains the columns.
        .with_schema_mode(SchemaMode::Merge)
        .await;
    let table = match written {
        Ok(t) => t,
        Err(
            e @ DeltaTableError::Transaction {
                source:
                    TransactionError::MaxCommitAttempts(_) | TransactionError::VersionAlreadyExists(_) | TransactionError::CommitConflict(_),
            },
        ) => return Err(CommitError::Lost(e)),
        Err(e) => return Err(Error::delta(location, e).into()),
    };
    let version = table.version().unwrap_or(0);
    if version != next_version {
        // Cannot happen without retries; kept as a guard on the seq invariant.
        return Err(Error::Request(format!("delta table {location}: committed version {version}, expected {next_version}")).into());
    }
    Ok((version, table))
}

/// A kept table brought up to date with the log entries written since, when its log
/// still holds the entry of the version it is at: `None` (open it afresh) when the
/// update fails or the table was deleted or recreated under it.
async fn still_current(mut table: deltalake::DeltaTable) -> Option<deltalake::DeltaTable> {
    table.update_incremental(None).await.ok()?;
    let version = table.version()?;
    table.log_store().read_commit_entry(version).await.ok()?.map(|_| table)
}

/// Rows of a view shaped by its write-time expressions ([`shape`]).
#[derive(Debug, Clone)]
pub struct Shaped {
    /// Of a view with write-time expressions: laid out as the view's rows
    /// ([`view_columns`]), none empty. Of one without: as given, still to be conformed.
    pub batches: Vec<RecordBatch>,
    /// Rows read.
    pub read: usize,
    /// Rows the source filter dropped.
    pub dropped: usize,
    /// Values the expressions could not compute (null).
    pub uncomputed: u64,
}

/// The view's write-time expressions compiled (docs/transformations.md#write-time), and
/// the view its writers read rows as: its raw view, or itself when it has none.
///
/// # Errors
/// [`Error::Input`] naming `source` when an expression does not compile (definitions
/// that did not pass validation).
pub fn write_transform(defs: &Definitions, view: &FeatureView, source: &str) -> Result<Option<WriteTransform>> {
    WriteTransform::new(defs, view).map_err(|e| Error::input(source, format!("feature view `{}`: {e}", view.name)))
}

/// Raw rows read as `transform`'s raw view checked against it as [`conform_batches`]
/// does, then shaped into the view's rows: the rows failing the filter dropped, the
/// features computed. Without a transform, the rows as given (a view's rows are
/// conformed where they are written, once).
///
/// # Errors
/// As [`conform_batches`], naming the raw columns.
pub fn shape(
    defs: &Definitions,
    transform: Option<&WriteTransform>,
    source: &str,
    batches: Vec<RecordBatch>,
    latest_event: Option<i64>,
) -> Result<Shaped> {
    let read = batches.iter().map(RecordBatch::num_rows).sum();
    let Some(transform) = transform else {
        // Rows stored as they come: checked once, by whoever writes them (`append`).
        return Ok(Shaped { batches, read, dropped: 0, uncomputed: 0 });
    };
    let raw = conform_batches(defs, transform.raw_view(), source, &batches, latest_event)?;
    drop(batches);
    let mut shaped = Shaped { batches: Vec::with_capacity(raw.len()), read, dropped: 0, uncomputed: 0 };
    for batch in &raw {
        let applied = transform.apply(batch).map_err(|e| Error::input(source, e.to_string()))?;
        shaped.dropped += applied.dropped;
        shaped.uncomputed += applied.uncomputed;
        if applied.batch.num_rows() > 0 {
            shaped.batches.push(applied.batch);
        }
    }
    Ok(shaped)
}

/// Checks `batches` against the view and converts them to its table columns
/// ([`view_columns`], without the ingestion-order column): safe widening only, UTC
/// times, no missing keys or times, no event time after `latest_event`. `source`
/// names the input in errors, with the row.
///
/// # Errors
/// [`Error::Input`] naming `source`, the column and the first bad row.
pub fn conform_batches(
    defs: &Definitions,
    view: &FeatureView,
    source: &str,
    batches: &[RecordBatch],
    latest_event: Option<i64>,
) -> Result<Vec<RecordBatch>> {
    let wanted: Vec<Wanted> = view_columns(defs, view);
    let schema = Arc::new(Schema::new(wanted.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>()));
    let mut out = Vec::with_capacity(batches.len());
    let mut row0 = 0usize;
    for batch in batches {
        out.push(RecordBatch::try_new(schema.clone(), conform(source, batch, &wanted, row0, latest_event)?)?);
        row0 += batch.num_rows();
    }
    Ok(out)
}

/// Rows of one ingest sorted by (join keys, event time, created time, row in the file),
/// as column sets of a million rows each, plus the original row number of every sorted
/// row (the ingestion order). Reads then find each entity's rows together and already in
/// as-of order, so the join's per-entity sort is only a check.
fn sort_for_reads(
    wanted: &[Wanted],
    batches: Vec<Vec<ArrayRef>>,
    n_keys: usize,
    has_created: bool,
) -> Result<(Vec<Vec<ArrayRef>>, Vec<u32>)> {
    let schema = Arc::new(Schema::new(wanted.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>()));
    let batches: Vec<RecordBatch> =
        batches.into_iter().map(|columns| RecordBatch::try_new(schema.clone(), columns)).collect::<std::result::Result<_, _>>()?;
    let all = concat_batches(&schema, &batches)?;
    drop(batches);
    let n = all.num_rows();
    if n > u32::MAX as usize {
        return Err(Error::Request(format!("{n} rows in one ingest: split the file (at most {} rows)", u32::MAX)));
    }
    // The layout is [keys.., event time, created time?, features..].
    let mut order: Vec<u32> = (0..n as u32).collect();
    let single_int = n_keys == 1 && *schema.field(0).data_type() == DataType::Int64;
    let micros = |i: usize| all.column(i).as_primitive::<TimestampMicrosecondType>().values().clone();
    let ts = micros(n_keys);
    let created = has_created.then(|| micros(n_keys + 1));
    if single_int {
        let key = all.column(0).as_primitive::<Int64Type>().values();
        let mut tuples: Vec<(i64, i64, i64, u32)> =
            (0..n).map(|i| (key[i], ts[i], created.as_ref().map_or(0, |c| c[i]), i as u32)).collect();
        tuples.sort_unstable();
        for (slot, t) in order.iter_mut().zip(&tuples) {
            *slot = t.3;
        }
    } else {
        let columns: Vec<ArrayRef> = (0..n_keys).map(|i| all.column(i).clone()).collect();
        let converter = RowConverter::new(columns.iter().map(|c| SortField::new(c.data_type().clone())).collect())?;
        let keys = converter.convert_columns(&columns)?;
        order.sort_unstable_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            keys.row(a)
                .cmp(&keys.row(b))
                .then(ts[a].cmp(&ts[b]))
                .then_with(|| created.as_ref().map_or(std::cmp::Ordering::Equal, |c| c[a].cmp(&c[b])))
                .then(a.cmp(&b))
        });
    }
    let sorted = take_record_batch(&all, &UInt32Array::from(order.clone()))?;
    drop(all);
    let step = 1 << 20;
    let parts = (0..n).step_by(step).map(|at| sorted.slice(at, step.min(n - at)).columns().to_vec()).collect();
    Ok((parts, order))
}
