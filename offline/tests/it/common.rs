//! Helpers the offline tests share.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, TimestampMicrosecondArray};

/// `v`, or null when `null` (a draw of the test's null chance).
pub fn opt<T>(null: bool, v: T) -> Option<T> {
    (!null).then_some(v)
}

/// UTC microsecond timestamps.
pub fn ts_array(values: impl IntoIterator<Item = i64>) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from(values.into_iter().collect::<Vec<_>>()).with_timezone("UTC"))
}

/// `batch` as one Parquet file at `path`.
pub fn write_parquet(path: &Path, batch: &RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}
