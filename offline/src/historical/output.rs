//! Writing a join's result.

use std::fs::File;
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
    let fail = |m: String| Error::Output { file: path.to_path_buf(), message: m };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::result::Result<(), String> {
        let file = File::create(&tmp).map_err(|e| e.to_string())?;
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(|e| e.to_string())?;
        let step = 128 * 1024;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = step.min(batch.num_rows() - offset);
            writer.write(&batch.slice(offset, len)).map_err(|e| e.to_string())?;
            offset += len;
        }
        writer.close().map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())
    };
    write().map_err(|m| {
        let _ = std::fs::remove_file(&tmp);
        fail(m)
    })
}
