//! What the sweeps read: each entity's spine rows by time, the requested aggregations
//! and their event columns in the runs' order.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type};
use quiver_gpu_join::{EntityRuns, NO_ENTITY};
use quiver_runtime::state::Num;
use quiver_sdk::{AggFunction, Aggregation, DType, FeatureView};

/// The spine rows of each entity, by time (then row).
pub(super) struct SpineRuns {
    pub(super) offsets: Vec<u32>,
    pub(super) rows: Vec<u32>,
}

impl SpineRuns {
    pub(super) fn build(ids: &[u32], times: &[i64], n_entities: usize) -> SpineRuns {
        let mut rows: Vec<u32> = (0..ids.len() as u32).filter(|&i| ids[i as usize] != NO_ENTITY).collect();
        rows.sort_unstable_by_key(|&i| (ids[i as usize], times[i as usize], i));
        let mut offsets = vec![0u32; n_entities + 1];
        for &r in &rows {
            offsets[ids[r as usize] as usize + 1] += 1;
        }
        for e in 0..n_entities {
            offsets[e + 1] += offsets[e];
        }
        SpineRuns { offsets, rows }
    }

    /// For each spine row, its position in `rows` (`NO_ENTITY` for a row whose key is
    /// missing or null: it gets the empty window's value).
    pub(super) fn positions(&self, n_rows: usize) -> Vec<u32> {
        let mut position = vec![NO_ENTITY; n_rows];
        for (p, &r) in self.rows.iter().enumerate() {
            position[r as usize] = p as u32;
        }
        position
    }
}

/// What the sweeps read: the requested aggregations and their event columns.
pub(super) struct Plan<'a> {
    pub(super) aggs: Vec<Planned<'a>>,
    pub(super) columns: Vec<RunColumn>,
    /// One aggregation per distinct (window, hop): what the window pointers follow.
    pub(super) tails: Vec<&'a Aggregation>,
}

/// One requested aggregation.
pub(super) struct Planned<'a> {
    pub(super) agg: &'a Aggregation,
    /// Index into [`Plan::columns`].
    pub(super) column: usize,
    /// Index into [`Plan::tails`].
    pub(super) tail: usize,
    pub(super) dtype: DType,
    pub(super) output: DType,
}

/// One event column: in the runs' order (position `p` of [`EntityRuns::rows`]) what
/// the sweeps read per event, and by table row (as the kernel's rows) the values
/// last/last_k take (for other columns dropped once in run order).
pub(super) struct RunColumn {
    pub(super) array: Option<ArrayRef>,
    pub(super) valid: Vec<bool>,
    pub(super) nums: Numbers,
    /// Whether count, sum or avg read it (its prefix sums are built); whether last or
    /// last_k read it (its non-null positions).
    pub(super) sums: bool,
    pub(super) latest: bool,
}

/// A numeric column's values in run order (a null reads as 0: check validity).
pub(super) enum Numbers {
    None,
    Int(Vec<i64>),
    Float(Vec<f64>),
}

impl Numbers {
    pub(super) fn of(array: &dyn Array, dtype: DType, rows: &[u32]) -> Numbers {
        match dtype {
            DType::Int32 => {
                let a = array.as_primitive::<Int32Type>().values();
                Numbers::Int(rows.iter().map(|&r| i64::from(a[r as usize])).collect())
            }
            DType::Int64 => {
                let a = array.as_primitive::<Int64Type>().values();
                Numbers::Int(rows.iter().map(|&r| a[r as usize]).collect())
            }
            DType::Float32 => {
                let a = array.as_primitive::<Float32Type>().values();
                Numbers::Float(rows.iter().map(|&r| f64::from(a[r as usize])).collect())
            }
            DType::Float64 => {
                let a = array.as_primitive::<Float64Type>().values();
                Numbers::Float(rows.iter().map(|&r| a[r as usize]).collect())
            }
            _ => Numbers::None,
        }
    }

    /// The value at run position `p`; `None` for a non-numeric column.
    pub(super) fn at(&self, p: usize) -> Option<Num> {
        match self {
            Numbers::None => None,
            Numbers::Int(v) => Some(Num::I(v[p])),
            Numbers::Float(v) => Some(Num::F(v[p])),
        }
    }
}

impl<'a> Plan<'a> {
    pub(super) fn new(view: &FeatureView, aggs: &[&'a Aggregation], names: &[&str], arrays: Vec<ArrayRef>, runs: &EntityRuns) -> Plan<'a> {
        let reads = |c: &str, f: fn(AggFunction) -> bool| aggs.iter().any(|a| a.column == c && f(a.function));
        let mut columns: Vec<RunColumn> = names
            .iter()
            .zip(arrays)
            .map(|(name, array)| {
                let dtype = view.feature(name).expect("validated").dtype;
                let valid = runs.rows.iter().map(|&r| array.is_valid(r as usize)).collect();
                let nums = Numbers::of(array.as_ref(), dtype, &runs.rows);
                let latest = reads(name, is_latest);
                RunColumn { array: latest.then_some(array), valid, nums, sums: false, latest }
            })
            .collect();
        let mut tails: Vec<&Aggregation> = Vec::new();
        let planned = aggs
            .iter()
            .map(|&agg| {
                let column = names.iter().position(|c| *c == agg.column).expect("collected");
                let tail = match tails.iter().position(|t| (t.window_us(), t.hop_us()) == (agg.window_us(), agg.hop_us())) {
                    Some(i) => i,
                    None => {
                        tails.push(agg);
                        tails.len() - 1
                    }
                };
                let c = &mut columns[column];
                if is_prefix(agg.function) {
                    c.sums = true;
                }
                let dtype = view.feature(&agg.column).expect("validated").dtype;
                Planned { agg, column, tail, dtype, output: agg.output_dtype(dtype).expect("validated") }
            })
            .collect();
        Plan { aggs: planned, columns, tails }
    }
}

pub(super) fn is_sums(function: AggFunction) -> bool {
    matches!(function, AggFunction::Count | AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev)
}

/// Whether the prefix-sum difference answers `function` to 1e-9: count, sum and avg.
/// Not stddev: its squares minus the squared sum cancel, and a difference of prefixes
/// as large as an entity's whole history loses the window's few digits (a window of
/// 1.0 and 1.001 after an event of 1e12); it adds the window's sums instead.
pub(super) fn is_prefix(function: AggFunction) -> bool {
    matches!(function, AggFunction::Count | AggFunction::Sum | AggFunction::Avg)
}

pub(super) fn is_latest(function: AggFunction) -> bool {
    matches!(function, AggFunction::Last | AggFunction::LastK)
}
