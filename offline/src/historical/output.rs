//! Writing a join's result.

use std::path::Path;

use arrow::array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

/// Writes a batch to Parquet atomically (a temp file renamed into place), so a failed
/// write leaves no partial file.
///
/// # Errors
/// [`Error::Output`] naming the file.
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let fail = |e: std::io::Error| Error::Output { file: path.to_path_buf(), message: e.to_string() };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    quiver_sdk::files::write_atomic_with(path, |file| {
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(std::io::Error::other)?;
        let step = 128 * 1024;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = step.min(batch.num_rows() - offset);
            writer.write(&batch.slice(offset, len)).map_err(std::io::Error::other)?;
            offset += len;
        }
        writer.close().map_err(std::io::Error::other)?;
        Ok(())
    })
    .map_err(fail)
}
