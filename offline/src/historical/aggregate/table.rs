//! The answers of a sweep: row-major while the entities are swept, then gathered into
//! one column per aggregation in spine order.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, ListArray, UInt32Array};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::DataType;
use quiver_gpu_join::NO_ENTITY;
use quiver_runtime::encoding::Value;
use quiver_runtime::state::Partial;
use quiver_sdk::DType;

use super::plan::{Plan, Planned, is_latest};
use crate::error::Result;
use crate::schema::arrow_type;

/// Every aggregation's answer for every spine row, row-major in the order of
/// [`SpineRuns::rows`], so that putting the rows back in spine order reads each row's
/// answers together (one cache miss per row, not one per value). A row is `masks`
/// words of null bits, then per aggregation its words: a numeric value (an integer, or
/// the bits of a float, widened losslessly), or for last/last_k the table rows of the
/// chosen events, newest first (`NO_ROW` past the last one).
pub(super) struct Table {
    words: Vec<u64>,
    layout: Layout,
}

const NO_ROW: u64 = u64::MAX;

/// Where each aggregation's answer sits in a [`Table`] row.
#[derive(Clone)]
struct Layout {
    slots: Vec<Slot>,
    width: usize,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    /// A numeric value in word `at`, null when bit `bit` of the masks is set.
    Value { at: usize, bit: usize },
    /// Up to `k` table rows in words `at..at + k`.
    Rows { at: usize, k: usize },
}

/// A chunk of a [`Table`]: the rows of some consecutive entities.
pub(super) struct TableSlice<'a> {
    words: &'a mut [u64],
    layout: &'a Layout,
}

impl Layout {
    /// `longest`: the most events of one entity (no last_k can choose more).
    fn new(plan: &Plan<'_>, longest: usize) -> Layout {
        let n_values = plan.aggs.iter().filter(|a| !is_latest(a.agg.function)).count();
        let mut at = n_values.div_ceil(64);
        let mut bit = 0;
        let slots = plan
            .aggs
            .iter()
            .map(|a| {
                let slot = if is_latest(a.agg.function) {
                    Slot::Rows { at, k: a.agg.keep().min(longest) }
                } else {
                    bit += 1;
                    Slot::Value { at, bit: bit - 1 }
                };
                at += match slot {
                    Slot::Rows { k, .. } => k,
                    Slot::Value { .. } => 1,
                };
                slot
            })
            .collect();
        Layout { slots, width: at }
    }

    /// A row of every aggregation's empty-window answer.
    fn empty_row(&self, plan: &Plan<'_>) -> Vec<u64> {
        let mut row = vec![0u64; self.width];
        for (planned, &slot) in plan.aggs.iter().zip(&self.slots) {
            match slot {
                Slot::Value { .. } => Layout::put(&mut row, slot, &Partial::default().finish(planned.agg, planned.dtype)),
                Slot::Rows { .. } => Layout::put_rows(&mut row, slot, std::iter::empty()),
            }
        }
        row
    }

    /// Writes a numeric value (or null) into a row.
    fn put(row: &mut [u64], slot: Slot, value: &Value) {
        let Slot::Value { at, bit } = slot else { unreachable!("a value goes to a value slot") };
        let word = match *value {
            Value::Int32(x) => Some(i64::from(x) as u64),
            Value::Int64(x) => Some(x as u64),
            Value::Float32(x) => Some(f64::from(x).to_bits()),
            Value::Float64(x) => Some(x.to_bits()),
            _ => None,
        };
        let (mask, bit) = (bit / 64, 1u64 << (bit % 64));
        match word {
            Some(w) => {
                row[at] = w;
                row[mask] &= !bit;
            }
            None => row[mask] |= bit,
        }
    }

    /// Writes the chosen table rows (newest first) into a row.
    fn put_rows(row: &mut [u64], slot: Slot, rows: impl Iterator<Item = u32>) {
        let Slot::Rows { at, k } = slot else { unreachable!("rows go to a rows slot") };
        let words = &mut row[at..at + k];
        words.fill(NO_ROW);
        for (w, r) in words.iter_mut().zip(rows) {
            *w = u64::from(r);
        }
    }
}

impl Table {
    /// `n` rows, each with every aggregation's empty-window answer.
    pub(super) fn new(plan: &Plan<'_>, n: usize, longest: usize) -> Table {
        let layout = Layout::new(plan, longest);
        let words = layout.empty_row(plan).repeat(n);
        Table { words, layout }
    }

    pub(super) fn slice(&mut self) -> TableSlice<'_> {
        TableSlice { words: &mut self.words, layout: &self.layout }
    }

    /// One column per aggregation, in spine order (`position` from
    /// [`SpineRuns::positions`]; a row without one gets the empty window's answer).
    /// Last and last_k take their values from the column by the rows chosen.
    /// The rows are gathered by `threads` threads, each a stretch of the spine.
    pub(super) fn into_columns(self, plan: &Plan<'_>, position: &[u32], threads: usize) -> Result<Vec<ArrayRef>> {
        let empty = self.layout.empty_row(plan);
        let stretch = position.len().div_ceil(threads.max(1)).max(1);
        let mut parts: Vec<Vec<Gathered>> = std::thread::scope(|s| {
            let handles: Vec<_> = position.chunks(stretch).map(|part| s.spawn(|| self.gather(part, &empty))).collect();
            handles.into_iter().map(|h| h.join().expect("a gathering thread panicked")).collect()
        });
        if parts.is_empty() {
            parts.push(self.gather(&[], &empty));
        }
        drop(self.words);
        let mut gathered = parts.remove(0);
        for part in parts {
            for (all, more) in gathered.iter_mut().zip(part) {
                all.append(more);
            }
        }
        plan.aggs.iter().zip(gathered).map(|(planned, out)| out.into_array(planned, plan.columns[planned.column].array.as_ref())).collect()
    }

    /// Every aggregation's answers for the spine rows at `position`, in that order.
    fn gather(&self, position: &[u32], empty: &[u64]) -> Vec<Gathered> {
        let layout = &self.layout;
        let n = position.len();
        let mut gathered: Vec<Gathered> = layout
            .slots
            .iter()
            .map(|slot| match slot {
                Slot::Value { .. } => Gathered::Values(Vec::with_capacity(n), Vec::with_capacity(n)),
                Slot::Rows { k, .. } => Gathered::Rows(Vec::with_capacity(n * k.min(&4)), vec![0]),
            })
            .collect();
        for &p in position {
            let row = if p == NO_ENTITY { empty } else { &self.words[p as usize * layout.width..(p as usize + 1) * layout.width] };
            for (slot, out) in layout.slots.iter().zip(&mut gathered) {
                match (*slot, out) {
                    (Slot::Value { at, bit }, Gathered::Values(words, valid)) => {
                        words.push(row[at]);
                        valid.push(row[bit / 64] & (1 << (bit % 64)) == 0);
                    }
                    (Slot::Rows { at, k }, Gathered::Rows(items, offsets)) => {
                        items.extend(row[at..at + k].iter().take_while(|&&r| r != NO_ROW).map(|&r| r as u32));
                        offsets.push(items.len() as i32);
                    }
                    _ => unreachable!("gathered by slot"),
                }
            }
        }
        gathered
    }
}

/// One aggregation's answers in spine order, before they are an array.
enum Gathered {
    /// Words and validity.
    Values(Vec<u64>, Vec<bool>),
    /// The chosen table rows of every spine row, and where each spine row's start.
    Rows(Vec<u32>, Vec<i32>),
}

impl Gathered {
    /// `more`, the answers of the spine rows after these, appended.
    fn append(&mut self, more: Gathered) {
        match (self, more) {
            (Gathered::Values(words, valid), Gathered::Values(w, v)) => {
                words.extend_from_slice(&w);
                valid.extend_from_slice(&v);
            }
            (Gathered::Rows(items, offsets), Gathered::Rows(i, o)) => {
                let base = items.len() as i32;
                items.extend_from_slice(&i);
                offsets.extend(o[1..].iter().map(|x| x + base));
            }
            _ => unreachable!("appended by slot"),
        }
    }

    fn into_array(self, planned: &Planned<'_>, column: Option<&ArrayRef>) -> Result<ArrayRef> {
        Ok(match self {
            Gathered::Values(w, valid) => {
                let nulls = valid.iter().any(|v| !v).then(|| NullBuffer::from(valid));
                match planned.output {
                    DType::Int32 => Arc::new(Int32Array::new(w.into_iter().map(|x| x as i64 as i32).collect(), nulls)),
                    DType::Int64 => Arc::new(Int64Array::new(w.into_iter().map(|x| x as i64).collect(), nulls)),
                    DType::Float32 => Arc::new(Float32Array::new(w.into_iter().map(|x| f64::from_bits(x) as f32).collect(), nulls)),
                    _ => Arc::new(Float64Array::new(w.into_iter().map(f64::from_bits).collect(), nulls)),
                }
            }
            Gathered::Rows(items, offsets) => {
                let column = column.expect("kept for last and last_k");
                match arrow_type(planned.output) {
                    // last_k: the values of the chosen rows, as the list's item type.
                    DataType::List(field) => {
                        let values = arrow::compute::take(column, &UInt32Array::from(items), None)?;
                        let values = arrow::compute::cast(&values, field.data_type())?;
                        Arc::new(ListArray::try_new(field, OffsetBuffer::new(offsets.into()), values, None)?)
                    }
                    // last: the first chosen row's value, null when there is none.
                    _ => {
                        let first: UInt32Array = offsets.windows(2).map(|w| (w[1] > w[0]).then(|| items[w[0] as usize])).collect();
                        arrow::compute::take(column, &first, None)?
                    }
                }
            }
        })
    }
}

impl<'a> TableSlice<'a> {
    /// The first `rows` rows, and the rest.
    pub(super) fn split_at(self, rows: usize) -> (TableSlice<'a>, TableSlice<'a>) {
        let (a, b) = self.words.split_at_mut(rows * self.layout.width);
        (TableSlice { words: a, layout: self.layout }, TableSlice { words: b, layout: self.layout })
    }

    fn row(&mut self, j: usize) -> &mut [u64] {
        let w = self.layout.width;
        &mut self.words[j * w..(j + 1) * w]
    }

    /// Aggregation `i`'s numeric value for row `j` of the slice.
    pub(super) fn put(&mut self, j: usize, i: usize, value: &Value) {
        let slot = self.layout.slots[i];
        Layout::put(self.row(j), slot, value);
    }

    /// Aggregation `i`'s chosen table rows (newest first) for row `j` of the slice.
    pub(super) fn put_rows(&mut self, j: usize, i: usize, rows: impl Iterator<Item = u32>) {
        let slot = self.layout.slots[i];
        Layout::put_rows(self.row(j), slot, rows);
    }
}
