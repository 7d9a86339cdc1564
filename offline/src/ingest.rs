//! `ingest`: a user file appended to a view's Delta table in one commit.
//!
//! The whole file is read and checked before anything is written, and the append is a
//! single Delta commit, so a failed ingest leaves the table exactly as it was.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::{DataType, Int64Type, SchemaRef, TimestampMicrosecondType};
use arrow::row::{RowConverter, SortField};
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
    let has_created = view.source.created_timestamp_field.is_some();
    let sorted = sort_for_reads(&schema, conformed, defs.join_keys(view).len(), has_created)?;
    progress("sorted", rows as u64);

    let table = table
        .write(sorted)
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

/// Rows of one ingest sorted by (join keys, event time, created time, seq), written in
/// batches of a million rows. Reads find each entity's rows together and already in
/// as-of order, so the join's per-entity sort is only a check.
fn sort_for_reads(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
    n_keys: usize,
    has_created: bool,
) -> Result<Vec<RecordBatch>> {
    let all = concat_batches(schema, &batches)?;
    drop(batches);
    let n = all.num_rows();
    // The table layout is [keys.., event time, created time?, features.., seq].
    let seq_col = schema.fields().len() - 1;
    let mut sort_cols: Vec<usize> = (0..=n_keys).collect();
    if has_created {
        sort_cols.push(n_keys + 1);
    }
    sort_cols.push(seq_col);
    let mut order: Vec<u32> = (0..n as u32).collect();
    let single_int = n_keys == 1 && *schema.field(0).data_type() == DataType::Int64;
    if single_int {
        let key = all.column(0).as_primitive::<Int64Type>().values();
        let micros = |i: usize| all.column(i).as_primitive::<TimestampMicrosecondType>().values().clone();
        let ts = micros(1);
        let created = has_created.then(|| micros(2));
        let seq = all.column(seq_col).as_primitive::<Int64Type>().values();
        let mut tuples: Vec<(i64, i64, i64, i64, u32)> = (0..n)
            .map(|i| (key[i], ts[i], created.as_ref().map_or(0, |c| c[i]), seq[i], i as u32))
            .collect();
        tuples.sort_unstable();
        for (slot, t) in order.iter_mut().zip(&tuples) {
            *slot = t.4;
        }
    } else {
        let columns: Vec<ArrayRef> = sort_cols.iter().map(|&i| all.column(i).clone()).collect();
        let converter = RowConverter::new(
            columns.iter().map(|c| SortField::new(c.data_type().clone())).collect(),
        )?;
        let encoded = converter.convert_columns(&columns)?;
        order.sort_unstable_by(|&a, &b| encoded.row(a as usize).cmp(&encoded.row(b as usize)));
    }
    let sorted = take_record_batch(&all, &UInt32Array::from(order))?;
    drop(all);
    let step = 1 << 20;
    Ok((0..n)
        .step_by(step)
        .map(|at| sorted.slice(at, step.min(n - at)))
        .collect())
}
