//! Which aggregations of an event log share a hop (a series of tiles) and a cell (one
//! partial per tile), and what a cell does with an event.

use crate::state::{EventOrder, Num, Partial, pick};
use quiver_sdk::aggregation::{AggFunction, Aggregation};
use quiver_sdk::definitions::FeatureView;
use quiver_sdk::definitions::fingerprint;

use crate::encoding::Value;
use quiver_sdk::types::DType;

/// What one cell holds per tile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CellKind {
    /// Count, sum, avg, stddev: the count of non-null values and, for a numeric column,
    /// the sums (with the integer sum for an integer column, the squares when a stddev
    /// reads it).
    Sums { numeric: bool, integer: bool, squares: bool },
    /// Min or max.
    Extreme(AggFunction),
    /// Last and last_k: the latest `k` non-null values.
    Latest { k: usize },
}

/// Which aggregations of a view share a hop and a cell, and where their columns are.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    pub view: &'a FeatureView,
    /// Per hop (in order of first appearance): the hop and its cells (column position
    /// among the view's features, kind).
    pub series: Vec<(i64, Vec<(usize, CellKind)>)>,
    /// Per aggregation: its series and cell.
    pub cells: Vec<(usize, usize)>,
    /// Per series: its aggregations, longest window first — in the order of their
    /// tails at any `now` (a hop's multiples), so one pass of a series' tiles finds each.
    pub by_tail: Vec<Vec<usize>>,
    /// Per series and cell: the aggregations reading it, longest window first.
    pub readers: Vec<Vec<Vec<usize>>>,
    /// Per aggregation: its column's position among the view's features and type.
    pub columns: Vec<(usize, DType)>,
    /// The view's [`fingerprint`], computed once: every record is stamped and checked
    /// with it.
    pub fingerprint: u64,
}

impl<'a> Layout<'a> {
    /// The layout of a (validated) event log.
    pub fn of(view: &'a FeatureView) -> Layout<'a> {
        let columns: Vec<(usize, DType)> = view
            .aggregations
            .iter()
            .map(|a| view.features.iter().enumerate().find(|(_, f)| f.name == a.column).map_or((0, DType::Int64), |(k, f)| (k, f.dtype)))
            .collect();
        let mut series: Vec<(i64, Vec<(usize, CellKind)>)> = Vec::new();
        let mut cells = Vec::with_capacity(view.aggregations.len());
        for (i, a) in view.aggregations.iter().enumerate() {
            let s = match series.iter().position(|(h, _)| *h == a.hop_us()) {
                Some(s) => s,
                None => {
                    series.push((a.hop_us(), Vec::new()));
                    series.len() - 1
                }
            };
            let (column, dtype) = columns[i];
            let numeric = matches!(dtype, DType::Int32 | DType::Int64 | DType::Float32 | DType::Float64);
            let kind = match a.function {
                AggFunction::Count | AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev => {
                    CellKind::Sums { numeric, integer: matches!(dtype, DType::Int32 | DType::Int64), squares: false }
                }
                AggFunction::Min | AggFunction::Max => CellKind::Extreme(a.function),
                AggFunction::Last | AggFunction::LastK => CellKind::Latest { k: a.keep() },
            };
            let same = |k: &CellKind| match (k, kind) {
                (CellKind::Sums { .. }, CellKind::Sums { .. }) | (CellKind::Latest { .. }, CellKind::Latest { .. }) => true,
                (CellKind::Extreme(f), CellKind::Extreme(g)) => *f == g,
                _ => false,
            };
            let members = &mut series[s].1;
            let c = match members.iter().position(|(col, k)| *col == column && same(k)) {
                Some(c) => c,
                None => {
                    members.push((column, kind));
                    members.len() - 1
                }
            };
            match &mut members[c].1 {
                CellKind::Sums { squares, .. } => *squares |= a.function == AggFunction::Stddev,
                CellKind::Latest { k } => *k = (*k).max(a.keep()),
                CellKind::Extreme(_) => {}
            }
            cells.push((s, c));
        }
        let cells_of = |i: usize| cells[i].1;
        let mut by_tail: Vec<Vec<usize>> = vec![Vec::new(); series.len()];
        for (i, &(s, _)) in cells.iter().enumerate() {
            by_tail[s].push(i);
        }
        for members in &mut by_tail {
            members.sort_by_key(|&i| std::cmp::Reverse(view.aggregations[i].window_us()));
        }
        let readers = by_tail
            .iter()
            .zip(&series)
            .map(|(members, (_, cells))| {
                (0..cells.len()).map(|c| members.iter().copied().filter(|&i| cells_of(i) == c).collect()).collect()
            })
            .collect();
        Layout { view, series, cells, by_tail, readers, columns, fingerprint: fingerprint(view) }
    }

    /// Every aggregation's window tail at `now`, in hops and in time: what a lookup
    /// computes once for all the records it answers.
    pub fn tails(&self, now: i64) -> Tails {
        let hops: Vec<i64> = self.view.aggregations.iter().map(|a| now.saturating_sub(a.window_us()).div_euclid(a.hop_us())).collect();
        let times =
            hops.iter().zip(&self.view.aggregations).map(|(t, a)| t.checked_mul(a.hop_us()).unwrap_or_else(|| a.tail(now))).collect();
        Tails { now, hops, times }
    }

    pub(super) fn agg(&self, i: usize) -> &Aggregation {
        &self.view.aggregations[i]
    }

    /// The first event time any window of the view can count at `now`: what a record
    /// built at `now` must be built from.
    pub fn earliest_tail(&self, now: i64) -> i64 {
        self.view.aggregations.iter().map(|a| a.tail(now)).min().unwrap_or(now)
    }

    /// The longest window plus hop of the view: how long after its latest event a
    /// record can still count it.
    pub fn reach_us(&self) -> i64 {
        self.view.aggregations.iter().map(|a| a.window_us().saturating_add(a.hop_us())).max().unwrap_or(0)
    }

    /// The earliest tail at `now` of the aggregations of series `s`.
    pub(super) fn series_tail(&self, s: usize, now: i64) -> i64 {
        self.cells.iter().enumerate().filter(|(_, (si, _))| *si == s).map(|(i, _)| self.agg(i).tail(now)).min().unwrap_or(now)
    }
}

/// Every aggregation's window tail at one time ([`Layout::tails`]).
#[derive(Debug, Clone)]
pub struct Tails {
    /// The time.
    pub now: i64,
    /// Per aggregation: its tail in hops since the epoch.
    pub hops: Vec<i64>,
    /// Per aggregation: its tail (`hops` times the hop).
    pub times: Vec<i64>,
}

impl CellKind {
    /// Adds one event's value (nulls count for nothing).
    pub(super) fn push(&self, p: &mut Partial, order: EventOrder, value: &Value) {
        if matches!(value, Value::Null) {
            return;
        }
        match *self {
            CellKind::Sums { squares, .. } => match Num::of(value) {
                Some(x) => p.sums.add_all(x, squares),
                None => p.sums.n += 1,
            },
            CellKind::Extreme(f) => {
                if let Some(x) = Num::of(value) {
                    p.extreme = Some(pick(f, p.extreme, x));
                }
            }
            CellKind::Latest { k } => p.push_latest(order, value, k),
        }
    }

    /// Merges the partial of other events into `p`.
    pub(super) fn merge(&self, p: &mut Partial, o: &Partial) {
        match *self {
            CellKind::Sums { .. } => p.sums.merge(&o.sums),
            CellKind::Extreme(f) => {
                if let Some(x) = o.extreme {
                    p.extreme = Some(pick(f, p.extreme, x));
                }
            }
            CellKind::Latest { .. } => {
                for (order, value) in &o.latest {
                    self.push(p, *order, value);
                }
            }
        }
    }
}
