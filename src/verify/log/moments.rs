//! `verify --as-arrived`'s moments: the grid every answer is checked at, and the states
//! within the lag an answer none of them agrees with is checked at again
//! (docs/consistency.md#--as-arrived-judging-a-live-stream-by-arrival).

use std::collections::HashMap;

use arrow::array::RecordBatch;
use quiver_sdk::error::count;

use super::{Logged, Replay};
use crate::error::Result;
use crate::verify::LogReport;

/// What [`Replay::refine`] checks again: a spine of the rows no moment agreed with, the
/// shifts to join it at, and each such row's row (of the view's spine) in it.
type Refining = (RecordBatch, Vec<i64>, HashMap<usize, usize>);

/// The most joins [`Replay::refining`] runs for one view's replay.
const MAX_REFINING_JOINS: usize = 4096;

impl Replay<'_> {
    /// The moments every row is checked at under [`super::Rule::AsArrived`], as shifts from
    /// its request time: 0, then every eighth of the lag either side.
    pub(super) fn grid(&self) -> Vec<i64> {
        let Some((_, lag)) = &self.arrival else { return vec![0] };
        let step = (lag / 8).max(1);
        let mut shifts = vec![0];
        let mut at = step;
        while at <= *lag {
            shifts.extend([-at, at]);
            at += step;
        }
        shifts
    }

    /// Shifts that reach every state the offline store passed through within the lag
    /// of each of `times`: a row none of [`Replay::grid`]'s moments agrees with may
    /// have been served a state that lasted less than a step (two commits 200 ms
    /// apart, with moments 250 ms apart: seen in the soak). The states change at the
    /// commits of `tables`; each state from a commit on is reached by shifting the
    /// request time to that commit. One shift serves every row whose state it reaches,
    /// so the fewest shifts are chosen that reach each state of each row (the greedy
    /// stabbing of intervals); `None` when that would take more than
    /// [`MAX_REFINING_JOINS`] joins.
    fn refining(&self, tables: &[&str], times: &[i64]) -> Option<Vec<i64>> {
        let (commits, lag) = self.arrival.as_ref()?;
        let lag = *lag;
        let mut at: Vec<i64> = tables.iter().filter_map(|t| commits.get(*t)).flat_map(|c| c.values().copied()).collect();
        at.sort_unstable();
        at.dedup();
        // Each state, as the shifts that reach it: (lo, hi], hi reached by shifting to
        // the commit that began it.
        let mut states: Vec<(i64, i64)> = Vec::new();
        for &t in times {
            let from = at.partition_point(|&c| c <= t - lag);
            let to = at.partition_point(|&c| c <= t + lag);
            for i in from..to {
                let lo = if i + 1 < to { t - at[i + 1] } else { -lag - 1 };
                states.push((lo, t - at[i]));
            }
        }
        states.sort_unstable_by_key(|&(_, hi)| hi);
        let mut shifts = Vec::new();
        let mut last: Option<i64> = None;
        for (lo, hi) in states {
            if last.is_some_and(|p| lo < p && p <= hi) {
                continue;
            }
            shifts.push(hi);
            last = Some(hi);
            if shifts.len() > MAX_REFINING_JOINS {
                return None;
            }
        }
        Some(shifts)
    }

    /// What checks spine rows `bad` (of `kept`'s rows) at every state within the lag:
    /// a spine of those rows alone, the shifts to join it at ([`Replay::refining`],
    /// the commits of `table`, or of every table for `None`), and each bad row's row
    /// in it. `None` when there is nothing to check, or it would take too many joins
    /// (then `report` says so).
    pub(super) fn refine(
        &self,
        table: Option<&str>,
        spine: &RecordBatch,
        kept: &[Logged],
        bad: &[usize],
        name: &str,
        report: &mut LogReport,
    ) -> Result<Option<Refining>> {
        let Some((commits, _)) = &self.arrival else { return Ok(None) };
        if bad.is_empty() {
            return Ok(None);
        }
        let tables: Vec<&str> = match table {
            Some(t) => vec![t],
            None => commits.keys().map(String::as_str).collect(),
        };
        let times: Vec<i64> = bad.iter().map(|&j| self.row(kept[j]).0.request_time(kept[j].1)).collect();
        let Some(shifts) = self.refining(&tables, &times) else {
            report.skipped.push(format!(
                "{} of `{name}` judged at the grid's moments only: every state within the lag would take over {MAX_REFINING_JOINS} joins",
                count(bad.len(), "row")
            ));
            return Ok(None);
        };
        if shifts.is_empty() {
            return Ok(None);
        }
        let indices = arrow::array::UInt32Array::from_iter_values(bad.iter().map(|&j| j as u32));
        let sub = arrow::compute::take_record_batch(spine, &indices)?;
        Ok(Some((sub, shifts, bad.iter().enumerate().map(|(p, &j)| (j, p)).collect())))
    }
}
