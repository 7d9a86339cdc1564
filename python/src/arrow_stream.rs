//! Tables across the Arrow PyCapsule interface (`__arrow_c_stream__`, arrow's
//! `ffi_stream`): in, any object that offers a stream (pyarrow, polars, ...); out, an
//! [`ArrowStream`] that pyarrow (or anything else that speaks the interface) reads.
//! No pyarrow on the Rust side, so arrow needs no `pyarrow` feature and the extension
//! builds on the main target dir.

use std::ffi::CStr;
use std::sync::Mutex;

use arrow::array::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use arrow::datatypes::SchemaRef;
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::{QuiverError, ValidationError};

/// The capsule name the interface specifies for a stream.
const STREAM: &CStr = c"arrow_array_stream";

/// The schema and the non-empty batches of a table-like object; `what` names it in errors.
pub fn read_table(table: &Bound<'_, PyAny>, what: &str) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    let not_a_stream = |e: PyErr| ValidationError::new_err(format!("{what}: not an Arrow table ({e})"));
    let capsule = table.call_method0("__arrow_c_stream__").map_err(not_a_stream)?;
    let capsule = capsule.cast::<PyCapsule>().map_err(|e| ValidationError::new_err(format!("{what}: __arrow_c_stream__ gave {e}")))?;
    let pointer = capsule.pointer_checked(Some(STREAM))?;
    // SAFETY: a capsule named `arrow_array_stream` holds an `FFI_ArrowArrayStream` (the
    // interface's contract); `from_raw` moves it out and leaves a released stream, which
    // the capsule's own destructor then ignores.
    let reader = unsafe { ArrowArrayStreamReader::from_raw(pointer.as_ptr().cast()) }
        .map_err(|e| ValidationError::new_err(format!("{what}: {e}")))?;
    let schema = reader.schema();
    let batches = reader
        .filter(|b| b.as_ref().map_or(true, |b| b.num_rows() > 0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ValidationError::new_err(format!("{what}: {e}")))?;
    Ok((schema, batches))
}

/// A result table, read once through `__arrow_c_stream__` (`pyarrow.table(stream)`,
/// `pyarrow.RecordBatchReader.from_stream(stream)`).
#[pyclass(name = "ArrowStream", module = "quiver._quiver", frozen)]
pub struct ArrowStream(Mutex<Option<FFI_ArrowArrayStream>>);

impl std::fmt::Debug for ArrowStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArrowStream(..)")
    }
}

impl ArrowStream {
    pub fn new(batch: RecordBatch) -> ArrowStream {
        let schema = batch.schema();
        let reader = RecordBatchIterator::new(vec![Ok(batch)], schema);
        ArrowStream(Mutex::new(Some(FFI_ArrowArrayStream::new(Box::new(reader)))))
    }
}

#[pymethods]
impl ArrowStream {
    /// The stream as a capsule; `requested_schema` is not supported (the table is given
    /// as it is).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyCapsule>> {
        if requested_schema.is_some_and(|s| !s.is_none()) {
            return Err(QuiverError::new_err("requested_schema is not supported: read the table as it is, then cast"));
        }
        let stream =
            self.0.lock().expect("stream lock").take().ok_or_else(|| QuiverError::new_err("this Arrow stream was already read"))?;
        PyCapsule::new_with_value(py, stream, STREAM)
    }
}
