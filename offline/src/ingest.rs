//! `ingest`: a user file appended to a view's Delta table in one commit.
//!
//! The whole file is read and checked before anything is written, and the append is a
//! single Delta commit, so a failed ingest leaves the table exactly as it was.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use quiver_sdk::config::StoreLocation;
use quiver_sdk::{Definitions, FeatureView};

use crate::delta::{ensure_table, open_table};
use crate::error::{Error, Result};
use crate::input::{Wanted, conform, read_file};
use crate::schema::{table_schema, view_columns};

/// What an ingest did.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestReport {
    pub rows: usize,
    /// The table version the append committed.
    pub version: u64,
    pub seconds: f64,
}

/// Progress of long work: called with a phase name and the rows handled so far.
pub type Progress<'a> = &'a (dyn Fn(&str, u64) + Sync);

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
    progress: Progress<'_>,
) -> Result<IngestReport> {
    let start = Instant::now();
    let wanted: Vec<Wanted> = view_columns(defs, view);
    let batches = read_file(file, &wanted)?;
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    progress("read", rows as u64);
    if rows == 0 {
        return Err(Error::input(file, "no rows to ingest"));
    }

    let schema = table_schema(defs, view);
    ensure_table(location, &schema, &view.name).await?;
    let table = open_table(location)
        .await?
        .ok_or_else(|| Error::Request(format!("delta table {location} vanished while ingesting")))?;
    let next_version = table.version().map_or(0, |v| v + 1);
    // Ingestion order: later ingests (higher versions) and later rows win ties.
    let seq_base = (next_version as i64) << 32;

    let mut conformed = Vec::with_capacity(batches.len());
    let mut row0 = 0usize;
    for batch in &batches {
        let mut columns = conform(file, batch, &wanted, row0)?;
        let seq: Int64Array = (0..batch.num_rows())
            .map(|i| seq_base + (row0 + i) as i64)
            .collect();
        columns.push(Arc::new(seq) as ArrayRef);
        conformed.push(RecordBatch::try_new(schema.clone(), columns)?);
        row0 += batch.num_rows();
        progress("checked", row0 as u64);
    }
    drop(batches);

    let table = table
        .write(conformed)
        .with_save_mode(SaveMode::Append)
        // A view that gained features since its table was created gains the columns.
        .with_schema_mode(SchemaMode::Merge)
        .await
        .map_err(|e| Error::delta(location, e))?;
    progress("written", rows as u64);
    Ok(IngestReport {
        rows,
        version: table.version().unwrap_or(0),
        seconds: start.elapsed().as_secs_f64(),
    })
}
