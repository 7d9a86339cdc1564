//! Windowed aggregations offline (docs/aggregations.md): each spine row's value of every requested
//! aggregation of an event log, point in time.
//!
//! Not a range join. The events are grouped by entity and sorted by (ts, created,
//! seq) — the as-of kernel's [`EntityRuns`] — and the entity's spine rows by time.
//! One sweep per entity walks its spine rows in time order and answers every requested
//! aggregation of the view at once. The window is `floor(t - w, h) <= ts <= t`; both
//! edges only move forward as `t` grows, so each is a pointer into the run, shared by
//! the aggregations with the same window and hop:
//!
//! - count, sum, avg: differences of the column's prefix sums (double-double sums,
//!   wrapping integer sums), built once per column for all its aggregations;
//! - min, max: a monotonic deque of the window's candidates;
//! - last, last_k: the column's non-null positions, read back from the window's end
//!   (the run's order is the tie-break order).
//!
//! So an entity costs O(events + spine rows) per aggregation, whatever the window: big
//! windows over dense entities are not quadratic. Under `--created-cutoff` an event may
//! be seen only from the later of its event and created times, so what is visible is no
//! longer a prefix of the run; the sweep then inserts each event at that time into a
//! Fenwick tree (sums, extremes) or an ordered set (latest) and answers for the
//! window's suffix, O(log n) per event and spine row. Stddev, whose squares minus
//! squared sum cancel too much for differences of whole-history prefixes, and prefix
//! sums that overflow to infinity (inf - inf would be NaN) only ever add: the window
//! is a queue of two stacks (running sums at the back, suffix sums at the front).
//!
//! Numeric values come from the same [`Partial::finish`] the online lookup uses; last
//! and last_k keep the table rows of the chosen events, newest first, and their values
//! are taken from the column at the end (what `finish` does with them: the first, or
//! the list).

mod table;
mod window_index;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, AsArray, new_null_array};
use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type};
use quiver_gpu_join::{EntityRuns, NO_ENTITY};
use quiver_runtime::encoding::Value;
use quiver_runtime::state::{Num, Partial, Sums};
use quiver_sdk::{AggFunction, Aggregation, DType, FeatureView};
use table::{Table, TableSlice};
use window_index::WindowIndex;

use super::kernel_input::KernelColumns;
use super::scan::{Scan, ScanRange};
use super::{Join, ScanNeed, ViewJoined, ViewRequest};
use crate::error::Result;
use crate::keys::EntityIndex;
use crate::schema::arrow_type;

impl Join<'_> {
    /// The requested aggregations of an event log, one column each, from the scanned
    /// rows of [`need`].
    pub(super) fn aggregate(&self, request: &ViewRequest<'_>, index: EntityIndex, scan: Scan) -> Result<ViewJoined> {
        let view = request.view;
        let started = Instant::now();
        let aggs: Vec<&Aggregation> = request.features.iter().map(|name| view.aggregation(name).expect("resolved")).collect();
        let columns = event_columns(&aggs);
        let has_created = view.source.created_timestamp_field.is_some();
        let mut kernel = KernelColumns::fill(&scan, &index, self.defs, view, has_created)?;
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
        let cutoff = self.options.cuts_by_created(view);
        let input = kernel.input(&index, self.times, None, cutoff);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let runs = EntityRuns::build(&input, threads);
        // Past here only the cutoff reads the kernel's columns (the created times): the
        // runs hold the order. Freed now, their memory serves what follows.
        let created = if cutoff { std::mem::take(&mut kernel.created) } else { Vec::new() };
        drop(kernel);
        let spine = SpineRuns::build(&index.spine_ids, self.times, index.n_entities as usize);
        tracing::debug!(view = %view.name, ms = started.elapsed().as_millis() as u64, "aggregation: events grouped and sorted");
        let plan = Plan::new(view, &aggs, &columns, values, &runs);
        tracing::debug!(view = %view.name, ms = started.elapsed().as_millis() as u64, "aggregation: columns in run order");
        let events = Events { runs: &runs, created: &created, cutoff };
        let table = events.aggregate(&plan, &spine, self.times, threads);
        tracing::debug!(view = %view.name, ms = started.elapsed().as_millis() as u64, "aggregation: swept");
        // In request order, as the plan holds the aggregations.
        let columns = table.into_columns(&plan, &spine.positions(self.times.len()), threads)?;
        (self.progress)(&format!("aggregated {}", view.name), self.times.len() as u64);
        tracing::debug!(view = %view.name, ms = started.elapsed().as_millis() as u64, "aggregation: columns built");
        Ok(ViewJoined::new(request, columns, None))
    }
}

/// The event columns `aggs` read, each once, in order of first use.
fn event_columns<'a>(aggs: &[&'a Aggregation]) -> Vec<&'a str> {
    let mut columns: Vec<&str> = Vec::new();
    for a in aggs {
        if !columns.contains(&a.column.as_str()) {
            columns.push(&a.column);
        }
    }
    columns
}

/// What an event log's aggregations read: their columns, and the events that can fall
/// in a window of a spine time in `[min_t, max_t]` (the longest window and hop before
/// the earliest).
pub(super) fn need<'a>(request: &ViewRequest<'a>, min_t: i64, max_t: i64, version: Option<u64>) -> ScanNeed<'a> {
    let view = request.view;
    let aggs: Vec<&'a Aggregation> = request.features.iter().map(|name| view.aggregation(name).expect("resolved")).collect();
    let reach = aggs.iter().map(|a| a.window_us().saturating_add(a.hop_us())).max().unwrap_or(0);
    let range = ScanRange { lo: Some(min_t.saturating_sub(reach)), hi: max_t, extra: None, version };
    ScanNeed { columns: event_columns(&aggs), range }
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

    /// For each spine row, its position in `rows` (`NO_ENTITY` for a row whose key is
    /// missing or null: it gets the empty window's value).
    fn positions(&self, n_rows: usize) -> Vec<u32> {
        let mut position = vec![NO_ENTITY; n_rows];
        for (p, &r) in self.rows.iter().enumerate() {
            position[r as usize] = p as u32;
        }
        position
    }
}

/// What the sweeps read: the requested aggregations and their event columns.
struct Plan<'a> {
    aggs: Vec<Planned<'a>>,
    columns: Vec<RunColumn>,
    /// One aggregation per distinct (window, hop): what the window pointers follow.
    tails: Vec<&'a Aggregation>,
}

/// One requested aggregation.
struct Planned<'a> {
    agg: &'a Aggregation,
    /// Index into [`Plan::columns`].
    column: usize,
    /// Index into [`Plan::tails`].
    tail: usize,
    dtype: DType,
    output: DType,
}

/// One event column: in the runs' order (position `p` of [`EntityRuns::rows`]) what
/// the sweeps read per event, and by table row (as the kernel's rows) the values
/// last/last_k take (for other columns dropped once in run order).
struct RunColumn {
    array: Option<ArrayRef>,
    valid: Vec<bool>,
    nums: Numbers,
    /// Whether count, sum or avg read it (its prefix sums are built); whether last or
    /// last_k read it (its non-null positions).
    sums: bool,
    latest: bool,
}

/// A numeric column's values in run order (a null reads as 0: check validity).
enum Numbers {
    None,
    Int(Vec<i64>),
    Float(Vec<f64>),
}

impl Numbers {
    fn of(array: &dyn Array, dtype: DType, rows: &[u32]) -> Numbers {
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
    fn at(&self, p: usize) -> Option<Num> {
        match self {
            Numbers::None => None,
            Numbers::Int(v) => Some(Num::I(v[p])),
            Numbers::Float(v) => Some(Num::F(v[p])),
        }
    }
}

impl<'a> Plan<'a> {
    fn new(view: &FeatureView, aggs: &[&'a Aggregation], names: &[&str], arrays: Vec<ArrayRef>, runs: &EntityRuns) -> Plan<'a> {
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

fn is_sums(function: AggFunction) -> bool {
    matches!(function, AggFunction::Count | AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev)
}

/// Whether the prefix-sum difference answers `function` to 1e-9: count, sum and avg.
/// Not stddev: its squares minus the squared sum cancel, and a difference of prefixes
/// as large as an entity's whole history loses the window's few digits (a window of
/// 1.0 and 1.001 after an event of 1e12); it adds the window's sums instead.
fn is_prefix(function: AggFunction) -> bool {
    matches!(function, AggFunction::Count | AggFunction::Sum | AggFunction::Avg)
}

fn is_latest(function: AggFunction) -> bool {
    matches!(function, AggFunction::Last | AggFunction::LastK)
}

/// What one thread reuses from entity to entity.
#[derive(Default)]
struct Scratch {
    /// Per column: the prefix sums of the entity's run (when the column has sums).
    prefix: Vec<Vec<Sums>>,
    /// Per column: whether its prefix sums stayed finite.
    finite: Vec<bool>,
    /// Per column: the run positions of non-null values (when last/last_k read it).
    present: Vec<Vec<u32>>,
    /// Per column: how many of `present` are before the window's end.
    present_hi: Vec<usize>,
    /// Per aggregation: the candidates of min/max.
    deques: Vec<VecDeque<u32>>,
    /// Per window: its first position.
    lo: Vec<usize>,
    /// The sliding sweep's suffix sums.
    front: Vec<Sums>,
}

/// One entity's spine rows, by time, and where their answers go: aggregation `i`'s
/// answer for `rows[j]` is row `at + j` of `out`.
struct Asks<'a, 'o, 't> {
    rows: &'a [u32],
    /// Each spine row's time, by spine row.
    times: &'a [i64],
    out: &'o mut TableSlice<'t>,
    at: usize,
}

impl Asks<'_, '_, '_> {
    fn time(&self, j: usize) -> i64 {
        self.times[self.rows[j] as usize]
    }

    fn put(&mut self, j: usize, i: usize, value: &Value) {
        self.out.put(self.at + j, i, value);
    }

    fn put_rows(&mut self, j: usize, i: usize, rows: impl Iterator<Item = u32>) {
        self.out.put_rows(self.at + j, i, rows);
    }
}

/// The events, grouped and sorted, with what their visibility needs.
struct Events<'a> {
    runs: &'a EntityRuns,
    /// By table row, under the cutoff (else empty).
    created: &'a [i64],
    cutoff: bool,
}

impl Events<'_> {
    /// Every planned aggregation for every spine row: its answer, or the empty
    /// window's, in the order of [`SpineRuns::rows`].
    fn aggregate(&self, plan: &Plan<'_>, spine: &SpineRuns, times: &[i64], threads: usize) -> Table {
        let n_entities = spine.offsets.len() - 1;
        let longest = self.runs.offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        let mut table = Table::new(plan, spine.rows.len(), longest);
        // Entities in chunks of about equal work (events plus spine rows), each chunk
        // with its own slice of the table.
        let total = self.runs.rows.len() + spine.rows.len();
        let target = total.div_ceil(threads * 4).max(1);
        let mut chunks: Vec<Range<usize>> = Vec::new();
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
        let mut slices: Vec<TableSlice<'_>> = Vec::with_capacity(chunks.len());
        let mut rest = table.slice();
        for range in &chunks {
            let (head, tail) = rest.split_at((spine.offsets[range.end] - spine.offsets[range.start]) as usize);
            slices.push(head);
            rest = tail;
        }
        let work = Mutex::new(chunks.into_iter().zip(slices));
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                let work = &work;
                s.spawn(move || {
                    let mut scratch = Scratch::default();
                    loop {
                        let next = work.lock().expect("no panic while holding the chunks").next();
                        let Some((range, mut out)) = next else { break };
                        let base = spine.offsets[range.start] as usize;
                        for e in range {
                            let (a, b) = (spine.offsets[e] as usize, spine.offsets[e + 1] as usize);
                            let mut asks = Asks { rows: &spine.rows[a..b], times, out: &mut out, at: a - base };
                            self.entity(plan, e, &mut asks, &mut scratch);
                        }
                    }
                });
            }
        });
        table
    }

    /// The sweep of one entity's spine rows for every aggregation.
    fn entity(&self, plan: &Plan<'_>, e: usize, asks: &mut Asks<'_, '_, '_>, scratch: &mut Scratch) {
        let (r0, r1) = (self.runs.offsets[e] as usize, self.runs.offsets[e + 1] as usize);
        if asks.rows.is_empty() || r0 == r1 {
            return;
        }
        if self.cutoff {
            for i in 0..plan.aggs.len() {
                self.visible_sweep(plan, i, r0..r1, asks);
            }
            return;
        }
        let ts = &self.runs.ts[r0..r1];
        let n = ts.len();
        let n_columns = plan.columns.len();
        scratch.prefix.resize_with(n_columns, Vec::new);
        scratch.present.resize_with(n_columns, Vec::new);
        scratch.finite.resize(n_columns, true);
        scratch.present_hi.resize(n_columns, 0);
        scratch.deques.resize_with(plan.aggs.len(), VecDeque::new);
        for (c, column) in plan.columns.iter().enumerate() {
            let prefix = &mut scratch.prefix[c];
            prefix.clear();
            scratch.finite[c] = true;
            if column.sums {
                let mut running = Sums::default();
                prefix.push(running);
                for p in r0..r1 {
                    if column.valid[p] {
                        match column.nums.at(p) {
                            Some(x) => running.add_all(x, false),
                            None => running.n += 1,
                        }
                    }
                    prefix.push(running);
                }
                scratch.finite[c] = running.sum.hi.is_finite();
            }
            let present = &mut scratch.present[c];
            present.clear();
            if column.latest {
                present.extend((r0..r1).filter(|&p| column.valid[p]).map(|p| (p - r0) as u32));
            }
            scratch.present_hi[c] = 0;
        }
        // Stddev, and sums that overflowed: a sweep that adds instead of subtracting.
        for (i, planned) in plan.aggs.iter().enumerate() {
            let f = planned.agg.function;
            if f == AggFunction::Stddev || (is_prefix(f) && !scratch.finite[planned.column]) {
                self.sliding_sweep(plan, i, r0..r1, asks, &mut scratch.front);
            }
        }
        for d in &mut scratch.deques {
            d.clear();
        }
        scratch.lo.clear();
        scratch.lo.resize(plan.tails.len(), 0);
        let mut hi = 0;
        for j in 0..asks.rows.len() {
            let t = asks.time(j);
            let before = hi;
            while hi < n && ts[hi] <= t {
                hi += 1;
            }
            for (w, rep) in plan.tails.iter().enumerate() {
                let tail = rep.tail(t);
                let lo = &mut scratch.lo[w];
                while *lo < hi && ts[*lo] < tail {
                    *lo += 1;
                }
            }
            for c in 0..n_columns {
                let present = &scratch.present[c];
                let mut h = scratch.present_hi[c];
                while h < present.len() && (present[h] as usize) < hi {
                    h += 1;
                }
                scratch.present_hi[c] = h;
            }
            for (i, planned) in plan.aggs.iter().enumerate() {
                let lo = scratch.lo[planned.tail];
                let column = &plan.columns[planned.column];
                let mut partial = Partial::default();
                match planned.agg.function {
                    f if is_sums(f) => {
                        if f == AggFunction::Stddev || !scratch.finite[planned.column] {
                            continue;
                        }
                        let prefix = &scratch.prefix[planned.column];
                        partial.sums = prefix[hi].since(&prefix[lo]);
                    }
                    f @ (AggFunction::Min | AggFunction::Max) => {
                        let deque = &mut scratch.deques[i];
                        for p in before..hi {
                            let Some(x) = column.nums.at(r0 + p).filter(|_| column.valid[r0 + p]) else { continue };
                            // Keep only candidates better than every later one.
                            while let Some(&q) = deque.back() {
                                let order = column.nums.at(r0 + q as usize).expect("numeric").order(&x);
                                let dominated = if f == AggFunction::Min { order.is_ge() } else { order.is_le() };
                                if !dominated {
                                    break;
                                }
                                deque.pop_back();
                            }
                            deque.push_back(p as u32);
                        }
                        while deque.front().is_some_and(|&q| (q as usize) < lo) {
                            deque.pop_front();
                        }
                        partial.extreme = deque.front().and_then(|&q| column.nums.at(r0 + q as usize));
                    }
                    _ => {
                        let present = &scratch.present[planned.column][..scratch.present_hi[planned.column]];
                        let chosen = present.iter().rev().take_while(|&&p| p as usize >= lo).map(|&p| self.runs.rows[r0 + p as usize]);
                        asks.put_rows(j, i, chosen);
                        continue;
                    }
                }
                asks.put(j, i, &partial.finish(planned.agg, planned.dtype));
            }
        }
    }

    /// The sweep of one entity's spine rows for a sums aggregation `i` (without the
    /// cutoff, so a window is a stretch `lo..hi` of the run): the window as a queue of
    /// two stacks. Events enter the back, whose sums run forward; when the window's
    /// start passes the front's end, the back becomes the front, as suffix sums. Each
    /// event is added at most twice and nothing is ever subtracted, so the sums keep
    /// their precision (as the Fenwick tree's would), in O(1) per event and spine row.
    fn sliding_sweep(&self, plan: &Plan<'_>, i: usize, run: Range<usize>, asks: &mut Asks<'_, '_, '_>, front: &mut Vec<Sums>) {
        let planned = &plan.aggs[i];
        let (agg, dtype) = (planned.agg, planned.dtype);
        let column = &plan.columns[planned.column];
        let r0 = run.start;
        let ts = &self.runs.ts[run];
        // What event `p` adds to the window's sums (as the Fenwick tree's insert).
        let one = |p: usize| {
            let mut sums = Sums::default();
            if column.valid[r0 + p] {
                match (agg.function, column.nums.at(r0 + p)) {
                    (AggFunction::Count, _) => sums.n = 1,
                    (f, Some(x)) => sums.add(f, x),
                    (_, None) => {}
                }
            }
            sums
        };
        front.clear();
        // The front holds the suffix sums of `start..mid`, the back the sums of `mid..hi`.
        let (mut start, mut mid, mut lo, mut hi) = (0, 0, 0, 0);
        let mut back = Sums::default();
        for j in 0..asks.rows.len() {
            let t = asks.time(j);
            while hi < ts.len() && ts[hi] <= t {
                back.merge(&one(hi));
                hi += 1;
            }
            let tail = agg.tail(t);
            while lo < hi && ts[lo] < tail {
                lo += 1;
            }
            if lo >= mid {
                front.clear();
                let mut running = Sums::default();
                for p in (lo..hi).rev() {
                    running.merge(&one(p));
                    front.push(running);
                }
                front.reverse();
                (start, mid, back) = (lo, hi, Sums::default());
            }
            let mut partial = Partial::default();
            if lo < mid {
                partial.sums = front[lo - start];
            }
            partial.sums.merge(&back);
            asks.put(j, i, &partial.finish(agg, dtype));
        }
    }

    /// The general sweep of one entity's spine rows for aggregation `i`: each event is
    /// inserted once it may be seen (at its event time, or under the cutoff at the
    /// later of its event and created times) and each spine row reads the window's
    /// suffix of what was inserted.
    fn visible_sweep(&self, plan: &Plan<'_>, i: usize, run: Range<usize>, asks: &mut Asks<'_, '_, '_>) {
        let planned = &plan.aggs[i];
        let (agg, dtype) = (planned.agg, planned.dtype);
        let column = &plan.columns[planned.column];
        let r0 = run.start;
        let rows = &self.runs.rows[run.clone()];
        let ts = &self.runs.ts[run];
        // When each position may be seen, and the positions in that order.
        let visible = |p: usize| if self.cutoff { ts[p].max(self.created[rows[p] as usize]) } else { ts[p] };
        let mut arrival: Vec<u32> = (0..rows.len() as u32).collect();
        if self.cutoff {
            arrival.sort_by_key(|&p| (visible(p as usize), p));
        }
        let mut index = WindowIndex::new(agg, rows.len());
        let mut inserted = 0;
        for j in 0..asks.rows.len() {
            let t = asks.time(j);
            while inserted < arrival.len() && visible(arrival[inserted] as usize) <= t {
                let p = arrival[inserted] as usize;
                if column.valid[r0 + p] {
                    index.insert(agg, p, column.nums.at(r0 + p));
                }
                inserted += 1;
            }
            let tail = ts.partition_point(|&x| x < agg.tail(t));
            match &index {
                WindowIndex::Latest(set) => {
                    asks.put_rows(j, i, set.range(tail as u32..).rev().map(|&p| rows[p as usize]));
                }
                _ => asks.put(j, i, &index.query(agg, tail).finish(agg, dtype)),
            }
        }
    }
}
