//! The sweeps (the module's doc, `super`): one per entity, its spine rows in time
//! order, every requested aggregation of the view answered at once.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;

use quiver_gpu_join::EntityRuns;
use quiver_runtime::encoding::Value;
use quiver_runtime::state::{Partial, Sums};
use quiver_sdk::AggFunction;

use super::plan::{Plan, SpineRuns, is_prefix, is_sums};
use super::table::{Table, TableSlice};
use super::window_index::WindowIndex;

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
pub(super) struct Events<'a> {
    pub(super) runs: &'a EntityRuns,
    /// By table row, under the cutoff (else empty).
    pub(super) created: &'a [i64],
    pub(super) cutoff: bool,
}

impl Events<'_> {
    /// Every planned aggregation for every spine row: its answer, or the empty
    /// window's, in the order of [`SpineRuns::rows`].
    pub(super) fn aggregate(&self, plan: &Plan<'_>, spine: &SpineRuns, times: &[i64], threads: usize) -> Table {
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
