//! Writing a join's result.

use std::path::Path;

use arrow::array::{ArrayRef, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnChunk, ArrowColumnWriter, compute_leaves};
use parquet::basic::Compression;
use parquet::file::properties::{DEFAULT_MAX_ROW_GROUP_ROW_COUNT, WriterProperties};

use crate::error::{Error, Result};

/// Rows handed to the column writers at a time.
const STEP: usize = 128 * 1024;

/// Writes a batch to Parquet atomically (a temp file renamed into place), so a failed
/// write leaves no partial file. The columns of each row group are encoded on all
/// cores, into the bytes one `ArrowWriter` fed the batch in steps of 128k rows writes
/// (same row groups, pages and metadata): the same answer is the same file.
///
/// # Errors
/// [`Error::Output`] naming the file.
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let fail = |e: std::io::Error| Error::Output { file: path.to_path_buf(), message: e.to_string() };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    quiver_sdk::files::write_atomic_with(path, |file| write_batch(file, batch).map_err(std::io::Error::other)).map_err(fail)
}

fn write_batch<W: std::io::Write + Send>(out: W, batch: &RecordBatch) -> parquet::errors::Result<()> {
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let group = props.max_row_group_row_count().unwrap_or(DEFAULT_MAX_ROW_GROUP_ROW_COUNT).max(1);
    // The file writer and column writer factory exactly as ArrowWriter sets them up.
    let (mut writer, factory) = ArrowWriter::try_new(out, batch.schema(), Some(props))?.into_serialized_writer()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let schema = batch.schema();
    let mut start = 0;
    let mut index = 0;
    while start < batch.num_rows() {
        let rows = group.min(batch.num_rows() - start);
        // One job per Parquet leaf column: its writer, the Arrow column it is a leaf of
        // (with the column's field), and which of the column's leaves it is.
        let mut writers = factory.create_column_writers(index)?.into_iter();
        let mut jobs: Vec<Job<'_>> = Vec::new();
        for (column, field) in batch.columns().iter().zip(schema.fields()) {
            let column = column.slice(start, rows);
            for leaf in 0..compute_leaves(field, &column.slice(0, 0))?.len() {
                let writer = writers.next().expect("a writer per leaf");
                jobs.push(Job { writer, column: column.clone(), field, leaf });
            }
        }
        let chunks = encode(jobs, threads)?;
        let mut row_group = writer.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut row_group)?;
        }
        row_group.close()?;
        start += rows;
        index += 1;
    }
    writer.close()?;
    Ok(())
}

/// One Parquet leaf column of a row group to encode.
struct Job<'a> {
    writer: ArrowColumnWriter,
    column: ArrayRef,
    field: &'a arrow::datatypes::Field,
    /// Which of the column's leaves.
    leaf: usize,
}

/// Encodes every job on `threads` threads, each column in 128k-row steps; the chunks
/// in job order.
fn encode(jobs: Vec<Job<'_>>, threads: usize) -> parquet::errors::Result<Vec<ArrowColumnChunk>> {
    let n = jobs.len();
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate());
    let encoded: Vec<Vec<(usize, ArrowColumnChunk)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.clamp(1, n.max(1)))
            .map(|_| {
                s.spawn(|| -> parquet::errors::Result<Vec<(usize, ArrowColumnChunk)>> {
                    let mut out = Vec::new();
                    loop {
                        let next = queue.lock().expect("no panic while holding the queue").next();
                        let Some((at, Job { mut writer, column, field, leaf })) = next else { break };
                        let mut offset = 0;
                        while offset < column.len() {
                            let part = column.slice(offset, STEP.min(column.len() - offset));
                            writer.write(&compute_leaves(field, &part)?[leaf])?;
                            offset += STEP;
                        }
                        out.push((at, writer.close()?));
                    }
                    Ok(out)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("an encoding thread panicked")).collect::<parquet::errors::Result<_>>()
    })?;
    let mut done: Vec<(usize, ArrowColumnChunk)> = encoded.into_iter().flatten().collect();
    done.sort_by_key(|(at, _)| *at);
    Ok(done.into_iter().map(|(_, chunk)| chunk).collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, ListArray, StringArray, StructArray};
    use arrow::datatypes::{DataType, Field, Int64Type};

    use super::*;

    /// What one ArrowWriter fed in 128k-row steps writes: the bytes to match.
    fn one_writer(batch: &RecordBatch) -> Vec<u8> {
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = STEP.min(batch.num_rows() - offset);
            writer.write(&batch.slice(offset, len)).unwrap();
            offset += len;
        }
        writer.close().unwrap();
        out
    }

    #[test]
    fn the_parallel_writer_writes_what_one_writer_writes() {
        // Over a row group and a half, with nulls, strings, lists and a struct (leaves
        // of more than one Parquet column).
        for rows in [0usize, 1, 1000, DEFAULT_MAX_ROW_GROUP_ROW_COUNT + 300_001] {
            let ints = Int64Array::from_iter((0..rows as i64).map(|i| (i % 7 != 0).then_some(i * 31 % 1000)));
            let floats = Float64Array::from_iter_values((0..rows).map(|i| i as f64 / 3.0));
            let strings = StringArray::from_iter((0..rows).map(|i| (i % 5 != 0).then(|| format!("s{}", i % 97))));
            let lists = ListArray::from_iter_primitive::<Int64Type, _, _>(
                (0..rows as i64).map(|i| (i % 11 != 0).then(|| (0..i % 4).map(|j| Some(i + j)).collect::<Vec<_>>())),
            );
            let structs = StructArray::from(vec![
                (Arc::new(Field::new("a", DataType::Int64, true)), Arc::new(ints.clone()) as ArrayRef),
                (Arc::new(Field::new("b", DataType::Utf8, true)), Arc::new(strings.clone()) as ArrayRef),
            ]);
            let batch = RecordBatch::try_from_iter([
                ("ints", Arc::new(ints) as ArrayRef),
                ("floats", Arc::new(floats) as ArrayRef),
                ("strings", Arc::new(strings) as ArrayRef),
                ("lists", Arc::new(lists) as ArrayRef),
                ("structs", Arc::new(structs) as ArrayRef),
            ])
            .unwrap();
            let mut parallel = Vec::new();
            write_batch(&mut parallel, &batch).unwrap();
            assert!(parallel == one_writer(&batch), "{rows} rows: the files differ");
        }
    }
}
