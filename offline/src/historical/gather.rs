//! Turning the kernel's winning row indices into feature columns: on the engine's
//! device when it offers a gather, else on the host with one `interleave` per column.

use arrow::array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow::compute::interleave;
use arrow::datatypes::DataType;
use quiver_gpu_join::{AsOfKernel, NO_ROW};

use crate::error::{Error, Result};
use crate::input::widen;

/// Each requested feature's column for the spine rows, by the winners (`NO_ROW`:
/// null); `sources[k]` is feature k's column in `batches` (`None`: the table has no
/// such column yet) and `types[k]` its output type.
pub(super) fn gather_features(
    kernel: &dyn AsOfKernel,
    batches: &[RecordBatch],
    sources: &[Option<usize>],
    types: &[DataType],
    winners: &[u32],
) -> Result<Vec<ArrayRef>> {
    let mut starts = Vec::with_capacity(batches.len());
    let mut total = 0usize;
    for b in batches {
        starts.push(total);
        total += b.num_rows();
    }
    let null_source = batches.len();
    let picks: Vec<(usize, usize)> = winners
        .iter()
        .map(|&w| {
            if w == NO_ROW {
                (null_source, 0)
            } else {
                let w = w as usize;
                let b = starts.partition_point(|&s| s <= w) - 1;
                (b, w - starts[b])
            }
        })
        .collect();
    let mut out = Vec::with_capacity(sources.len());
    for (source, dtype) in sources.iter().zip(types) {
        let column = match source {
            // No such column yet, or no rows in range: all null.
            _ if batches.is_empty() => new_null_array(dtype, winners.len()),
            None => new_null_array(dtype, winners.len()),
            Some(i) => {
                let source_type = batches[0].column(*i).data_type().clone();
                let gathered = match device_gather(kernel, batches, *i, &source_type, winners)? {
                    Some(on_device) => on_device,
                    None => {
                        let null_row = new_null_array(&source_type, 1);
                        let mut arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(*i).as_ref()).collect();
                        arrays.push(null_row.as_ref());
                        interleave(&arrays, &picks)?
                    }
                };
                widen(&gathered, dtype).map_err(Error::Request)?
            }
        };
        out.push(column);
    }
    Ok(out)
}

/// Gathers one fixed-width feature column (8- or 4-byte values) by the winners on the
/// engine's device, when it has one ([`AsOfKernel::gather`]); `None` leaves the gather to
/// the host. The result equals the host gather value for value and null for null.
fn device_gather(
    kernel: &dyn AsOfKernel,
    batches: &[RecordBatch],
    column: usize,
    source_type: &DataType,
    winners: &[u32],
) -> Result<Option<ArrayRef>> {
    use arrow::array::{ArrayData, make_array};
    use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
    use quiver_gpu_join::{FixedColumn, Gathered};
    let wide = match source_type {
        DataType::Int64 | DataType::Float64 | DataType::Timestamp(_, _) | DataType::Date64 => true,
        DataType::Int32 | DataType::Float32 | DataType::Date32 => false,
        _ => return Ok(None),
    };
    let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(column).as_ref()).collect();
    let whole = arrow::compute::concat(&arrays)?;
    let data = whole.to_data();
    let (offset, len) = (data.offset(), data.len());
    let valid: Option<Vec<u8>> = whole.nulls().map(|n| (0..len).map(|r| u8::from(n.is_valid(r))).collect());
    let buffer = data.buffers()[0].clone();
    let wide_values;
    let narrow_values;
    let fixed = if wide {
        wide_values = ScalarBuffer::<u64>::new(buffer, offset, len);
        FixedColumn::U64 { values: &wide_values, valid: valid.as_deref() }
    } else {
        narrow_values = ScalarBuffer::<u32>::new(buffer, offset, len);
        FixedColumn::U32 { values: &narrow_values, valid: valid.as_deref() }
    };
    let Some(result) = kernel.gather(&[fixed], winners) else {
        return Ok(None);
    };
    let gathered = result?.pop().ok_or_else(|| Error::Request("the engine's gather returned no column".into()))?;
    let (values, ok) = match gathered {
        Gathered::U64(v, ok) => (Buffer::from_vec(v), ok),
        Gathered::U32(v, ok) => (Buffer::from_vec(v), ok),
    };
    let nulls = NullBuffer::from(ok.iter().map(|&b| b != 0).collect::<Vec<bool>>());
    let out = ArrayData::builder(source_type.clone()).len(winners.len()).add_buffer(values).nulls(Some(nulls)).build()?;
    Ok(Some(make_array(out)))
}
