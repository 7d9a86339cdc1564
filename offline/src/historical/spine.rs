//! Reading a spine, and its points in time.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema, TimestampMicrosecondType};

use crate::error::{Error, Result};
use crate::input::to_utc_micros;

/// The spine column holding each row's point in time.
pub const SPINE_TIMESTAMP: &str = "event_timestamp";

/// Reads a spine (Parquet, or CSV with a header) into one batch. In CSV, the
/// `key_types` columns are read as text and typed as ingest types a CSV file's, a value
/// that does not parse named by its row and column; `event_timestamp` is read as text
/// and parsed as RFC 3339 into UTC microsecond times; other CSV columns are inferred.
///
/// # Errors
/// [`Error::Input`] naming the file (and the row and column of a value that does not
/// parse).
pub fn read_spine(path: &Path, key_types: &[(String, DataType)]) -> Result<RecordBatch> {
    let fail = |e: &dyn std::fmt::Display| Error::input(path.display(), e.to_string());
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    let batches: Vec<RecordBatch> = match ext.as_str() {
        "parquet" | "pq" => {
            let file = File::open(path).map_err(|e| fail(&e))?;
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| fail(&e))?
                .with_batch_size(64 * 1024)
                .build()
                .map_err(|e| fail(&e))?
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| fail(&e))?
        }
        "csv" => {
            let file = File::open(path).map_err(|e| fail(&e))?;
            let (inferred, _) = arrow::csv::reader::Format::default()
                .with_header(true)
                .infer_schema(File::open(path).map_err(|e| fail(&e))?, None)
                .map_err(|e| fail(&e))?;
            let fields: Vec<Field> = inferred
                .fields()
                .iter()
                .map(|f| {
                    // The columns the join reads are typed below, from their text.
                    let typed_later = f.name() == SPINE_TIMESTAMP || key_types.iter().any(|(n, _)| n == f.name());
                    Field::new(f.name(), if typed_later { DataType::Utf8 } else { f.data_type().clone() }, true)
                })
                .collect();
            let text: Vec<RecordBatch> = arrow::csv::ReaderBuilder::new(Arc::new(Schema::new(fields)))
                .with_header(true)
                .with_batch_size(64 * 1024)
                .build(file)
                .map_err(|e| fail(&e))?
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| fail(&e))?;
            let mut row0 = 0;
            let mut typed = Vec::with_capacity(text.len());
            for batch in text {
                typed.push(typed_columns(&batch, key_types, row0).map_err(|m| Error::input(path.display(), m))?);
                row0 += batch.num_rows();
            }
            typed
        }
        _ => {
            return Err(Error::input(path.display(), format!("unknown spine file type `.{ext}` (expected .parquet or .csv)")));
        }
    };
    let schema = match batches.first() {
        Some(b) => b.schema(),
        None => return Err(Error::input(path.display(), "the spine has no rows")),
    };
    let spine = concat_batches(&schema, &batches)?;
    if ext == "csv" { Ok(timed(spine)?) } else { Ok(spine) }
}

/// A CSV spine batch read as text with its `key_types` columns typed: numbers and
/// booleans as ingest types them (a value that does not parse named by its row, from 1
/// after the header, and column), other types cast from their text.
fn typed_columns(batch: &RecordBatch, key_types: &[(String, DataType)], row0: usize) -> std::result::Result<RecordBatch, String> {
    let wanted: Vec<crate::input::Wanted> =
        key_types.iter().map(|(name, t)| (Field::new(name, t.clone(), true), crate::schema::Role::Feature)).collect();
    let batch = crate::input::type_csv_batch(batch, &wanted, row0)?;
    let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = batch.columns().to_vec();
    for (i, field) in fields.iter_mut().enumerate() {
        let Some((_, t)) = key_types.iter().find(|(n, _)| n == field.name()) else { continue };
        if field.data_type() != t {
            columns[i] = arrow::compute::cast(&columns[i], t).map_err(|e| format!("column `{}`: {e}", field.name()))?;
            *field = Field::new(field.name(), t.clone(), true);
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

/// A CSV spine's `event_timestamp` text as UTC microsecond times, so the join's output
/// (a training set's column) holds times, as from a Parquet spine. Text that does not
/// parse stays, for the join to refuse naming its row.
fn timed(spine: RecordBatch) -> Result<RecordBatch> {
    let Some(at) = spine.schema().index_of(SPINE_TIMESTAMP).ok() else { return Ok(spine) };
    let Ok(times) = to_utc_micros(spine.column(at)) else { return Ok(spine) };
    let mut fields: Vec<Field> = spine.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields[at] = Field::new(SPINE_TIMESTAMP, times.data_type().clone(), true);
    let mut columns = spine.columns().to_vec();
    columns[at] = times;
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// The spine's points in time, as UTC microseconds (exact: zone-less or sub-microsecond
/// times are refused, as at ingest).
pub(super) fn spine_times(source: &str, spine: &RecordBatch) -> Result<Vec<i64>> {
    let Some(column) = spine.column_by_name(SPINE_TIMESTAMP) else {
        return Err(Error::input(source, format!("missing column `{SPINE_TIMESTAMP}` (the point in time of each spine row)")));
    };
    let ts = to_utc_micros(column).map_err(|(row, msg)| match row {
        Some(r) => Error::input(source, format!("row {}: column `{SPINE_TIMESTAMP}`: {msg}", r + 1)),
        None => Error::input(source, format!("column `{SPINE_TIMESTAMP}` {msg}")),
    })?;
    let ts = ts.as_primitive::<TimestampMicrosecondType>();
    if let Some(i) = (0..ts.len()).find(|&i| ts.is_null(i)) {
        return Err(Error::input(source, format!("row {}: column `{SPINE_TIMESTAMP}` is empty", i + 1)));
    }
    Ok(ts.values().to_vec())
}
