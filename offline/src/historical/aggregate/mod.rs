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

mod plan;
mod sweep;
mod table;
mod window_index;

use std::time::Instant;

use arrow::array::{Array, ArrayRef, new_null_array};
use quiver_gpu_join::EntityRuns;
use quiver_sdk::Aggregation;

use plan::{Plan, SpineRuns};
use sweep::Events;

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
        let has_created = self.options.has_created(view);
        let mut kernel = KernelColumns::fill(&scan, &index, self.defs, view, has_created, self.options.arrivals(view))?;
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
