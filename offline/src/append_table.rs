//! Append-only Delta tables read back by a time range: the storage of the serving log
//! (whose schema and rows are `quiver::serving_log`'s; this module knows neither).

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::prelude::{SessionConfig, SessionContext, ident, lit};
use datafusion::scalar::ScalarValue;
use deltalake::kernel::transaction::TransactionError;
use deltalake::kernel::{Action, Add};
use deltalake::logstore::{CommitOrBytes, LogStoreRef};
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::{DeltaTableError, checkpoints};
use quiver_sdk::config::StoreLocation;

use crate::delta::{ensure_table, open_table};
use crate::error::{Error, Result};

/// An append-only table, kept open between appends.
///
/// An append writes its data file and puts the next log entry itself: deltalake's write
/// keeps a snapshot of every file in the table and, after a commit another writer made
/// first, reads that snapshot again whole — a cost that grows with the table's files, a
/// commit a batch (two servers logging five batches a second each spent a growing share
/// of their CPU on it). A blind append conflicts with no other append, so when another
/// writer took the version it reads that entry and takes the next one; an entry that
/// changed the table's schema or protocol makes it open the table again. Every
/// [`CHECKPOINT_EVERY`] versions the writer of the version checkpoints the table, so
/// that opening it reads a checkpoint and the entries after it.
#[derive(Debug)]
pub struct AppendTable {
    location: StoreLocation,
    schema: SchemaRef,
    /// What the table is, for messages and the table's name.
    name: &'static str,
    open: Option<Open>,
}

/// A table's log, a writer of its data files and the version last seen.
struct Open {
    log: LogStoreRef,
    writer: RecordBatchWriter,
    columns: Vec<String>,
    version: u64,
}

impl std::fmt::Debug for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Open").field("columns", &self.columns).field("version", &self.version).finish_non_exhaustive()
    }
}

/// A checkpoint every this many versions (deltalake's default interval).
pub const CHECKPOINT_EVERY: u64 = 100;

impl AppendTable {
    pub fn new(location: StoreLocation, schema: SchemaRef, name: &'static str) -> AppendTable {
        AppendTable { location, schema, name, open: None }
    }

    /// Appends `batch` (in the table's schema) as one commit, creating the table if
    /// needed; returns the version committed. Concurrent appenders (other servers) are
    /// fine: a version another writer took first is skipped.
    ///
    /// # Errors
    /// [`Error::Delta`] when the table cannot be created or written; the table is then
    /// unchanged (a data file no log entry names may be left; vacuum removes it).
    pub async fn append(&mut self, batch: RecordBatch) -> Result<u64> {
        for _ in 0..3 {
            let open = match self.open.as_mut() {
                Some(open) => open,
                None => self.open.insert(reopen(&self.location, &self.schema, self.name).await?),
            };
            if !open.fits(&batch) {
                // A table written before a column was added gains it, through deltalake's
                // write (a schema change is no blind append).
                self.open = None;
                return self.append_merging(batch).await;
            }
            match open.append(batch.clone()).await {
                Ok(Some(version)) => {
                    if version % CHECKPOINT_EVERY == 0 {
                        checkpoint(&self.location).await;
                    }
                    return Ok(version);
                }
                // Another writer changed the schema or protocol: open the table again.
                Ok(None) => self.open = None,
                Err(e) => {
                    self.open = None;
                    return Err(Error::delta(&self.location, e));
                }
            }
        }
        self.append_merging(batch).await
    }

    /// Through deltalake's write, which merges a batch's new columns into the table's schema.
    async fn append_merging(&mut self, batch: RecordBatch) -> Result<u64> {
        let location = &self.location;
        let table = open_for_append(location, &self.schema, self.name)
            .await?
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(SchemaMode::Merge)
            .await
            .map_err(|e| Error::delta(location, e))?;
        Ok(table.version().unwrap_or(0) as u64)
    }
}

/// The table at `location`, created first when missing.
async fn open_for_append(location: &StoreLocation, schema: &SchemaRef, name: &str) -> Result<deltalake::DeltaTable> {
    ensure_table(location, schema, name).await?;
    open_table(location).await?.ok_or_else(|| Error::Request(format!("{} {location} vanished while writing", name.replace('_', " "))))
}

/// The table at `location` opened for blind appends. Free of `AppendTable`: its writer
/// is not `Sync`, and an append's future must be `Send`.
async fn reopen(location: &StoreLocation, schema: &SchemaRef, name: &str) -> Result<Open> {
    let table = open_for_append(location, schema, name).await?;
    let writer = RecordBatchWriter::for_table(&table).map_err(|e| Error::delta(location, e))?;
    let snapshot = table.snapshot().map_err(|e| Error::delta(location, e))?;
    let columns = snapshot.schema().fields().map(|f| f.name().to_string()).collect();
    Ok(Open { log: table.log_store(), writer, columns, version: table.version().unwrap_or(0) as u64 })
}

/// A checkpoint of the table as it is now; a failure costs readers time, not data.
async fn checkpoint(location: &StoreLocation) {
    let done = match open_table(location).await {
        Ok(Some(table)) => checkpoints::create_checkpoint(&table, None).await.map_err(|e| e.to_string()),
        Ok(None) => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(error) = done {
        tracing::warn!(%error, table = %location, "checkpoint failed; the next one is due in {CHECKPOINT_EVERY} versions");
    }
}

impl Open {
    /// The batch has exactly the table's columns (their types the writer conforms).
    fn fits(&self, batch: &RecordBatch) -> bool {
        let schema = batch.schema();
        schema.fields().len() == self.columns.len() && self.columns.iter().all(|c| schema.field_with_name(c).is_ok())
    }

    /// Writes `batch` as a data file and commits it at the first free version after the
    /// last one seen: `None` when a version taken meanwhile changed the table's schema or
    /// protocol (the file is then left unnamed).
    async fn append(&mut self, batch: RecordBatch) -> std::result::Result<Option<u64>, DeltaTableError> {
        self.writer.write(batch).await?;
        let adds = self.writer.flush().await?;
        let entry = commit_entry(adds)?;
        let id = uuid::Uuid::new_v4();
        let mut version = self.version + 1;
        loop {
            match self.log.write_commit_entry(version, CommitOrBytes::LogBytes(entry.clone()), id).await {
                Ok(()) => {
                    self.version = version;
                    return Ok(Some(version));
                }
                Err(TransactionError::VersionAlreadyExists(_)) => {
                    let theirs = self.log.read_commit_entry(version).await?;
                    if theirs.as_deref().is_none_or(changes_table) {
                        return Ok(None);
                    }
                    version += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A log entry that appends `adds`, as Delta's JSON lines.
fn commit_entry(adds: Vec<Add>) -> std::result::Result<bytes::Bytes, DeltaTableError> {
    let info = serde_json::json!({"commitInfo": {
        "timestamp": chrono::Utc::now().timestamp_millis(),
        "operation": "WRITE",
        "operationParameters": {"mode": "Append"},
        "isBlindAppend": true,
        "engineInfo": concat!("quiver ", env!("CARGO_PKG_VERSION")),
    }});
    let mut out = serde_json::to_vec(&info).map_err(|e| DeltaTableError::Generic(e.to_string()))?;
    for add in adds {
        out.push(b'\n');
        out.extend(serde_json::to_vec(&Action::Add(add)).map_err(|e| DeltaTableError::Generic(e.to_string()))?);
    }
    Ok(out.into())
}

/// Whether a log entry changes the table's schema, properties or protocol (or cannot be
/// read as JSON lines).
fn changes_table(entry: &[u8]) -> bool {
    entry.split(|b| *b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)).any(|line| {
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line)
            .map_or(true, |action| action.contains_key("metaData") || action.contains_key("protocol"))
    })
}

/// The rows with `time_column` in `times` (`since..until`), in `schema`'s
/// columns and types, in no particular order; empty when there is no table. A nullable
/// column the table does not have yet (written before it was added) reads as nulls.
///
/// # Errors
/// [`Error::Delta`]/[`Error::Query`] when the table cannot be read.
pub async fn read_range(
    location: &StoreLocation,
    schema: &SchemaRef,
    time_column: &str,
    times: std::ops::Range<quiver_sdk::Timestamp>,
) -> Result<Vec<RecordBatch>> {
    let (since, until) = (times.start.0, times.end.0);
    let Some(table) = open_table(location).await? else {
        return Ok(Vec::new());
    };
    let query = |source| Error::query(location, source);
    let mut session = SessionConfig::new();
    // Plain Utf8 columns, as written (not DataFusion's default string views).
    session.options_mut().execution.parquet.schema_force_view_types = false;
    let ctx = SessionContext::new_with_config(session);
    table.update_datafusion_session(&ctx.state()).map_err(|e| Error::delta(location, e))?;
    let provider = table.table_provider().await.map_err(query)?;
    let at = |v: i64| lit(ScalarValue::TimestampMicrosecond(Some(v), Some("UTC".into())));
    let has = provider.schema();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            if has.field_with_name(f.name()).is_ok() || !f.is_nullable() {
                return Ok(ident(f.name()));
            }
            Ok(lit(ScalarValue::try_from(f.data_type()).map_err(query)?).alias(f.name()))
        })
        .collect::<Result<Vec<_>>>()?;
    let batches = ctx
        .read_table(provider)
        .map_err(query)?
        .filter(ident(time_column).gt_eq(at(since)).and(ident(time_column).lt(at(until))))
        .map_err(query)?
        .select(columns)
        .map_err(query)?
        .collect()
        .await
        .map_err(query)?;
    // Back to the written types (a reader may hand strings over as views).
    batches
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| {
            let columns = b
                .columns()
                .iter()
                .zip(schema.fields())
                .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(RecordBatch::try_new(schema.clone(), columns)?)
        })
        .collect()
}
