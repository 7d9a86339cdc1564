//! An event log's answers for a lookup, from its stored records: each record's
//! aggregations at `now`, records of an earlier layout answered by definition.

use quiver_runtime::encoding::Value;
use quiver_runtime::record::{AggRecord, Layout, WindowAnswer};
use quiver_sdk::FeatureView;
use quiver_sdk::registry::EarlierLayouts;

use super::{Column, Row, Status};

/// Every aggregation's value at `now` and the time of the latest event in its window.
type Answer = Vec<WindowAnswer>;

/// The answers of an event log's records at `now` for one lookup, one per stored row.
pub(super) struct Answers {
    rows: Vec<Answered>,
    /// Per earlier layout met: where each of the view's aggregations is among that
    /// layout's (`None`: the aggregation is new since, or defined otherwise then).
    earlier: Vec<Vec<Option<usize>>>,
}

/// One record's answer.
enum Answered {
    /// Written under the view's current aggregations (or no record: no events).
    Current(Answer),
    /// Written under earlier aggregations of the view ([`Answers::earlier`] index).
    Earlier(Answer, usize),
    /// Not a record the registry knows the layout of: `NOT_FOUND`.
    Unreadable,
}

impl Answers {
    /// Aggregation `k` of row `row`: its value, status, and the time of the latest
    /// event in its window (0 when none). `NOT_FOUND` for a record that cannot be read
    /// and for an aggregation its layout lacks (until the entity is written again).
    pub(super) fn cell(&self, row: usize, k: usize) -> (&Value, Status, i64) {
        let found = match &self.rows[row] {
            Answered::Current(a) => Some(&a[k]),
            Answered::Earlier(a, layout) => self.earlier[*layout][k].map(|i| &a[i]),
            Answered::Unreadable => None,
        };
        match found {
            None => (&Value::Null, Row::Missing.status(true), 0),
            Some(WindowAnswer { value, latest_event }) => {
                let ts = latest_event.unwrap_or(0);
                (value, Row::Live(ts).status(matches!(value, Value::Null)), ts)
            }
        }
    }
}

impl Answers {
    /// The latest event among the `wanted` aggregations of row `row`, as an on-demand
    /// feature's event time reads it; `None` when none has an event.
    pub(super) fn latest(&self, row: usize, wanted: &[(usize, usize)]) -> Option<i64> {
        wanted
            .iter()
            .filter_map(|&(_, k)| {
                let (_, status, ts) = self.cell(row, k);
                (status != Status::NotFound && ts != 0).then_some(ts)
            })
            .max()
    }
}

/// The answers of an event log's records at `now` (docs/aggregations.md): an entity without a
/// record has no events in any window; a record written under earlier aggregations of
/// the view (before an `apply` changed them, until the entity is written again) answers
/// those still defined the same way.
pub(super) fn answer_records(earlier: &EarlierLayouts, view: &FeatureView, stored: &[Option<Vec<u8>>], now: i64) -> Answers {
    let layout = Layout::of(view);
    // An entity without a record: the answer of no events, the same for all.
    let none = AggRecord::empty(&layout).answer(&layout, now);
    let tails = layout.tails(now);
    let mut other: Vec<(u64, usize)> = Vec::new();
    let rows = stored
        .iter()
        .enumerate()
        .map(|(row, b)| match b {
            None => Answered::Current(none.clone()),
            Some(bytes) => match AggRecord::answer_stored_at(&layout, &tails, bytes) {
                Ok(answer) => Answered::Current(answer),
                Err(_) => {
                    if let Some(print) = AggRecord::layout_of(bytes).filter(|p| *p != layout.fingerprint) {
                        other.push((print, row));
                    }
                    Answered::Unreadable
                }
            },
        })
        .collect();
    let mut answers = Answers { rows, earlier: Vec::new() };
    // Records of earlier layouts, a layout at a time.
    other.sort_unstable();
    for group in other.chunk_by(|a, b| a.0 == b.0) {
        let Some(old) = earlier.earlier_view(view, group[0].0) else { continue };
        let old_layout = Layout::of(&old);
        let old_tails = old_layout.tails(now);
        let index = answers.earlier.len();
        answers
            .earlier
            .push(view.aggregations.iter().map(|a| old.aggregations.iter().position(|o| same_aggregation(&old, o, view, a))).collect());
        for &(_, row) in group {
            let bytes = stored[row].as_deref().expect("a stored record");
            if let Ok(answer) = AggRecord::answer_stored_at(&old_layout, &old_tails, bytes) {
                answers.rows[row] = Answered::Earlier(answer, index);
            }
        }
    }
    answers
}

/// Whether aggregation `a` of `old` computes what `b` of `view` does: the same name,
/// function, column (of the same type), window, hop and k.
fn same_aggregation(old: &FeatureView, a: &quiver_sdk::Aggregation, view: &FeatureView, b: &quiver_sdk::Aggregation) -> bool {
    let dtype = |v: &FeatureView, column: &str| v.feature(column).map(|f| f.dtype);
    a.name == b.name
        && a.function == b.function
        && a.column == b.column
        && a.window_us() == b.window_us()
        && a.hop_us() == b.hop_us()
        && a.keep() == b.keep()
        && dtype(old, &a.column) == dtype(view, &b.column)
}

/// Aggregation `k` of an event log for each entity: PRESENT, or NULL_VALUE for a
/// null value; the event time is the latest event in the window (epoch 0 when none).
pub(super) fn aggregation_column(k: usize, name: &str, answers: &Answers) -> Column {
    let mut column = Column::empty(name, answers.rows.len());
    for row in 0..answers.rows.len() {
        let (value, status, ts) = answers.cell(row, k);
        column.values.push(value.clone());
        column.statuses.push(status);
        column.event_ts.push((status != Status::NotFound).then_some(ts));
    }
    column
}
