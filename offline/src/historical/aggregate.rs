//! Windowed aggregations offline (SPEC §11): each spine row's value of every requested
//! aggregation of an event log, point in time.
//!
//! Not a range join. The events are grouped by entity and sorted by (ts, created,
//! seq) — the as-of kernel's [`EntityRuns`] — and the entity's spine rows by time.
//! One sweep per (entity, aggregation) walks the spine rows in time order and inserts
//! each event once it may be seen: at its event time, or under `--created-cutoff` at
//! the later of its event and created times. Every structure answers for a suffix of
//! the run (the window is `floor(t - w, h) <= ts`, found by binary search) over what
//! was inserted so far (`ts <= t`, and `created <= t` under the cutoff):
//!
//! - count, sum, avg, stddev: a Fenwick tree of [`Sums`] (double-double sums);
//! - min, max: a Fenwick tree of the extreme;
//! - last, last_k: an ordered set of the inserted non-null positions, read from the
//!   top (the run's order is the tie-break order).
//!
//! So each event costs O(log n) and each spine row O(log n) (plus `k`), whatever the
//! window: big windows over dense entities are not quadratic. The value comes from the
//! same [`Partial::finish`] the online lookup uses.

use std::collections::BTreeSet;

use arrow::array::{Array, ArrayRef, new_null_array};
use arrow::datatypes::Field;
use quiver_gpu_join::{EntityRuns, NO_ENTITY};
use quiver_sdk::aggregation::state::{Num, Partial, Sums};
use quiver_sdk::encoding::Value;
use quiver_sdk::{AggFunction, Aggregation, DType};

use super::kernel_input::KernelColumns;
use super::scan::{ScanRange, scan_view_at};
use super::{Join, ViewJoined, ViewRequest};
use crate::error::Result;
use crate::keys::EntityIndex;
use crate::schema::{arrow_type, value_at, values_to_array};

impl Join<'_> {
    /// The requested aggregations of an event log, one column each.
    pub(super) async fn aggregate(&self, request: &ViewRequest<'_>, index: EntityIndex) -> Result<ViewJoined> {
        let view = request.view;
        let aggs: Vec<&Aggregation> = request.features.iter().map(|name| view.aggregation(name).expect("resolved")).collect();
        let mut columns: Vec<&str> = Vec::new();
        for a in &aggs {
            if !columns.contains(&a.column.as_str()) {
                columns.push(&a.column);
            }
        }
        let (min_t, max_t) = (self.times.iter().min().copied().unwrap_or(0), self.times.iter().max().copied().unwrap_or(0));
        let reach = aggs.iter().map(|a| a.window_us().saturating_add(a.hop_us())).max().unwrap_or(0);
        let range = ScanRange {
            lo: Some(min_t.saturating_sub(reach)),
            hi: max_t,
            extra: None,
            version: self.options.versions.get(&view.name).copied(),
        };
        let scan = scan_view_at(&self.config.view_table(view), self.defs, view, &columns, range).await?;
        (self.progress)(&format!("scanned {}", view.name), scan.rows as u64);
        let has_created = view.source.created_timestamp_field.is_some();
        let kernel = KernelColumns::fill(&scan, &index, self.defs, view, has_created)?;
        // Each event column as one array, indexed like the kernel's rows.
        let values: Vec<ArrayRef> = columns
            .iter()
            .zip(&scan.feature_columns)
            .map(|(name, at)| {
                let dtype = arrow_type(view.feature(name).expect("validated").dtype);
                Ok(match at {
                    Some(i) => {
                        let parts: Vec<&dyn Array> = scan.batches.iter().map(|b| b.column(*i).as_ref()).collect();
                        let joined = if parts.is_empty() { new_null_array(&dtype, 0) } else { arrow::compute::concat(&parts)? };
                        crate::input::widen(&joined, &dtype).map_err(crate::error::Error::Request)?
                    }
                    None => new_null_array(&dtype, scan.rows),
                })
            })
            .collect::<Result<_>>()?;
        drop(scan);
        let input = kernel.input(&index, self.times, None, self.options.created_cutoff);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let runs = EntityRuns::build(&input, threads);
        let spine = SpineRuns::build(&index.spine_ids, self.times, index.n_entities as usize);
        let events = Events { runs: &runs, kernel: &kernel, cutoff: self.options.created_cutoff };
        let mut features = Vec::with_capacity(aggs.len());
        for agg in aggs {
            let column = &values[columns.iter().position(|c| *c == agg.column).expect("collected")];
            let dtype = view.feature(&agg.column).expect("validated").dtype;
            let out = events.aggregate(agg, column, dtype, &spine, self.times, threads);
            let output = agg.output_dtype(dtype).expect("validated");
            let array = values_to_array(output, out.iter());
            features.push((Field::new(format!("{}__{}", view.name, agg.name), arrow_type(output), true), array));
        }
        (self.progress)(&format!("aggregated {}", view.name), self.times.len() as u64);
        Ok(ViewJoined { features, event_time: None })
    }
}

/// The spine rows of each entity, by time (then row).
struct SpineRuns {
    offsets: Vec<u32>,
    rows: Vec<u32>,
}

impl SpineRuns {
    fn build(ids: &[u32], times: &[i64], n_entities: usize) -> SpineRuns {
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
}

/// The events, grouped and sorted, with what their order and visibility need.
struct Events<'a> {
    runs: &'a EntityRuns,
    kernel: &'a KernelColumns,
    cutoff: bool,
}

impl Events<'_> {
    /// One aggregation for every spine row: its value, or the empty window's.
    fn aggregate(
        &self,
        agg: &Aggregation,
        column: &ArrayRef,
        dtype: DType,
        spine: &SpineRuns,
        times: &[i64],
        threads: usize,
    ) -> Vec<Value> {
        let n_entities = spine.offsets.len() - 1;
        let empty = Partial::default().finish(agg, dtype);
        let mut out = vec![empty; times.len()];
        // Entities in chunks of about equal work (events plus spine rows).
        let total = self.runs.rows.len() + spine.rows.len();
        let target = total.div_ceil(threads * 4).max(1);
        let mut chunks = Vec::new();
        let mut first = 0;
        let mut work = 0;
        for e in 0..n_entities {
            work += (self.runs.offsets[e + 1] - self.runs.offsets[e]) as usize + (spine.offsets[e + 1] - spine.offsets[e]) as usize;
            if work >= target || e + 1 == n_entities {
                chunks.push(first..e + 1);
                first = e + 1;
                work = 0;
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Vec<(u32, Value)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads.min(chunks.len()).max(1))
                .map(|_| {
                    let (chunks, next) = (&chunks, &next);
                    s.spawn(move || {
                        let mut found = Vec::new();
                        loop {
                            let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(range) = chunks.get(c) else { break };
                            for e in range.clone() {
                                self.entity(agg, column.as_ref(), dtype, e, spine, times, &mut found);
                            }
                        }
                        found
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("no panic in the sweep")).collect()
        });
        for (row, value) in results.into_iter().flatten() {
            out[row as usize] = value;
        }
        out
    }

    /// The sweep of one entity's spine rows for one aggregation.
    #[allow(clippy::too_many_arguments)]
    fn entity(
        &self,
        agg: &Aggregation,
        column: &dyn Array,
        dtype: DType,
        e: usize,
        spine: &SpineRuns,
        times: &[i64],
        found: &mut Vec<(u32, Value)>,
    ) {
        let (r0, r1) = (self.runs.offsets[e] as usize, self.runs.offsets[e + 1] as usize);
        let rows = &self.runs.rows[r0..r1];
        let ts = &self.runs.ts[r0..r1];
        let asks = &spine.rows[spine.offsets[e] as usize..spine.offsets[e + 1] as usize];
        if asks.is_empty() || rows.is_empty() {
            return;
        }
        if !self.cutoff && prefix_sums(agg, column, dtype, rows, ts, asks, times, found) {
            return;
        }
        let k = self.kernel;
        let created = |p: usize| if k.created.is_empty() { 0 } else { k.created[rows[p] as usize] };
        // When each position may be seen, and the positions in that order.
        let visible = |p: usize| if self.cutoff { ts[p].max(created(p)) } else { ts[p] };
        let mut arrival: Vec<u32> = (0..rows.len() as u32).collect();
        if self.cutoff {
            arrival.sort_by_key(|&p| (visible(p as usize), p));
        }
        let mut index = WindowIndex::new(agg, rows.len());
        let mut inserted = 0;
        for &s in asks {
            let t = times[s as usize];
            while inserted < arrival.len() && visible(arrival[inserted] as usize) <= t {
                let p = arrival[inserted] as usize;
                index.insert(agg, p, column, rows[p] as usize, dtype);
                inserted += 1;
            }
            let tail = ts.partition_point(|&x| x < agg.tail(t));
            let partial = index.query(agg, tail, |p| {
                let r = rows[p] as usize;
                ((ts[p], created(p), k.seq[r]), value_at(column, r, dtype))
            });
            found.push((s, partial.finish(agg, dtype)));
        }
    }
}

/// The fast path of count, sum, avg and stddev without the created-time cutoff: what
/// is visible at `t` is then a prefix of the run (`ts <= t`), so a window is a
/// difference of prefix sums (double-double sums, wrapping integer sums: exact enough,
/// and exact for integers). False, having pushed nothing, when it does not apply: another
/// function, or a value or prefix that is not finite (inf - inf would be NaN: the
/// Fenwick path adds instead).
#[allow(clippy::too_many_arguments)]
fn prefix_sums(
    agg: &Aggregation,
    column: &dyn Array,
    dtype: DType,
    rows: &[u32],
    ts: &[i64],
    asks: &[u32],
    times: &[i64],
    found: &mut Vec<(u32, Value)>,
) -> bool {
    if !matches!(agg.function, AggFunction::Count | AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev) {
        return false;
    }
    let mut prefix: Vec<Sums> = Vec::with_capacity(rows.len() + 1);
    let mut running = Sums::default();
    prefix.push(running);
    for &r in rows {
        let r = r as usize;
        if !column.is_null(r) {
            match agg.function {
                AggFunction::Count => running.n += 1,
                f => {
                    if let Some(x) = Num::of(&value_at(column, r, dtype)) {
                        running.add(f, x);
                    }
                }
            }
        }
        if !(running.sum.hi.is_finite() && running.squares.hi.is_finite()) {
            return false;
        }
        prefix.push(running);
    }
    for &s in asks {
        let t = times[s as usize];
        let hi = ts.partition_point(|&x| x <= t);
        let lo = ts.partition_point(|&x| x < agg.tail(t)).min(hi);
        let (a, b) = (&prefix[lo], &prefix[hi]);
        let sums =
            Sums { n: b.n - a.n, int_sum: b.int_sum.wrapping_sub(a.int_sum), sum: b.sum.minus(a.sum), squares: b.squares.minus(a.squares) };
        let partial = Partial { sums, ..Partial::default() };
        found.push((s, partial.finish(agg, dtype)));
    }
    true
}

/// What one sweep keeps for one aggregation.
enum WindowIndex {
    Sums(Fenwick<Sums>),
    Extreme(Fenwick<Option<Num>>),
    Latest(BTreeSet<u32>),
}

impl WindowIndex {
    fn new(agg: &Aggregation, n: usize) -> WindowIndex {
        match agg.function {
            AggFunction::Count | AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev => WindowIndex::Sums(Fenwick::new(n)),
            AggFunction::Min | AggFunction::Max => WindowIndex::Extreme(Fenwick::new(n)),
            AggFunction::Last | AggFunction::LastK => WindowIndex::Latest(BTreeSet::new()),
        }
    }

    /// Makes run position `p` (table row `row`) visible; null values are skipped.
    fn insert(&mut self, agg: &Aggregation, p: usize, column: &dyn Array, row: usize, dtype: DType) {
        if column.is_null(row) {
            return;
        }
        match self {
            WindowIndex::Sums(tree) => {
                let mut one = Sums::default();
                match agg.function {
                    AggFunction::Count => one.n = 1,
                    f => match Num::of(&value_at(column, row, dtype)) {
                        Some(x) => one.add(f, x),
                        None => return,
                    },
                }
                tree.add(p, &one, |a, b| a.merge(b));
            }
            WindowIndex::Extreme(tree) => {
                if let Some(x) = Num::of(&value_at(column, row, dtype)) {
                    let function = agg.function;
                    tree.add(p, &Some(x), |a, b| *a = extreme(function, *a, *b));
                }
            }
            WindowIndex::Latest(set) => {
                set.insert(p as u32);
            }
        }
    }

    /// The partial of the visible events at run positions `tail..`.
    fn query(&self, agg: &Aggregation, tail: usize, event: impl Fn(usize) -> ((i64, i64, i64), Value)) -> Partial {
        let mut partial = Partial::default();
        match self {
            WindowIndex::Sums(tree) => partial.sums = tree.suffix(tail, |a, b| a.merge(b)),
            WindowIndex::Extreme(tree) => {
                let function = agg.function;
                partial.extreme = tree.suffix(tail, |a, b| *a = extreme(function, *a, *b));
            }
            WindowIndex::Latest(set) => {
                partial.latest = set.range(tail as u32..).rev().take(agg.keep()).map(|&p| event(p as usize)).collect();
            }
        }
        partial
    }
}

fn extreme(function: AggFunction, a: Option<Num>, b: Option<Num>) -> Option<Num> {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(a), Some(b)) => {
            let order = b.order(&a);
            let take_b = if function == AggFunction::Min { order.is_lt() } else { order.is_gt() };
            Some(if take_b { b } else { a })
        }
    }
}

/// A Fenwick tree answering for suffixes: position `p` is stored at `n - 1 - p`, so a
/// suffix `p..` is a prefix of the reversed positions. Insert-only (no inverse is
/// needed, so min and max work too).
struct Fenwick<T> {
    tree: Vec<T>,
}

impl<T: Clone + Default> Fenwick<T> {
    fn new(n: usize) -> Self {
        Fenwick { tree: vec![T::default(); n] }
    }

    fn add(&mut self, p: usize, x: &T, merge: impl Fn(&mut T, &T)) {
        let n = self.tree.len();
        let mut i = n - 1 - p;
        while i < n {
            merge(&mut self.tree[i], x);
            i |= i + 1;
        }
    }

    fn suffix(&self, p: usize, merge: impl Fn(&mut T, &T)) -> T {
        let mut out = T::default();
        let n = self.tree.len();
        if p >= n {
            return out;
        }
        // Prefix of reversed positions 0..=n-1-p.
        let mut i = (n - 1 - p) as isize;
        while i >= 0 {
            merge(&mut out, &self.tree[i as usize]);
            i = (i & (i + 1)) - 1;
        }
        out
    }
}
