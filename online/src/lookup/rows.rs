//! Stored rows of a plain view decoded for a lookup: each row once, into one reused
//! buffer, only the requested values built; a row written under an earlier layout of
//! the view read by name.

use std::collections::HashMap;

use quiver_runtime::encoding::{OnlineRow, Value};
use quiver_sdk::FeatureView;
use quiver_sdk::definitions::fingerprint;
use quiver_sdk::registry::EarlierLayouts;

use super::{Column, Row, ViewPlan};

/// Earlier layouts of one view met in a lookup: for each schema fingerprint, where each
/// current feature sits in the old row (`None`: the feature is new, or its type
/// changed: it reads as null).
#[derive(Default)]
struct Layouts(HashMap<u64, Option<Vec<Option<usize>>>>);

impl Layouts {
    /// `row` (written under another schema of `view`) in the view's current feature
    /// order; `None` when the registry does not know the schema it was written under.
    fn conform(&mut self, earlier: &EarlierLayouts, view: &quiver_sdk::FeatureView, row: OnlineRow) -> Option<OnlineRow> {
        let positions = self
            .0
            .entry(row.fingerprint)
            .or_insert_with(|| {
                let old = earlier.online_layout(row.fingerprint)?;
                Some(view.features.iter().map(|f| old.iter().position(|o| o.name == f.name && o.dtype == f.dtype)).collect())
            })
            .as_ref()?;
        let width = earlier.online_layout(row.fingerprint).map_or(0, <[_]>::len);
        if row.values.len() != width {
            return None;
        }
        let mut values = row.values;
        let conformed = positions.iter().map(|p| p.map_or(Value::Null, |i| std::mem::replace(&mut values[i], Value::Null))).collect();
        Some(OnlineRow { values: conformed, fingerprint: fingerprint(view), ..row })
    }
}

/// Reads the stored rows of one plain view: each decoded once into one reused buffer,
/// only the requested values built; a row written under another layout of the view is
/// read by name, one that cannot be read is missing. Judged at `now` against the TTL.
pub(super) struct RowReader<'a> {
    earlier: &'a EarlierLayouts,
    view: &'a FeatureView,
    planned: &'a ViewPlan,
    now: i64,
    layouts: Layouts,
}

impl<'a> RowReader<'a> {
    pub(super) fn new(earlier: &'a EarlierLayouts, view: &'a FeatureView, planned: &'a ViewPlan, now: i64) -> RowReader<'a> {
        RowReader { earlier, view, planned, now, layouts: Layouts::default() }
    }

    /// Reads `bytes` (`None`: no row stored) into `values`, in the view's feature order.
    pub(super) fn read(&mut self, bytes: Option<&[u8]>, values: &mut Vec<Value>) -> Row {
        let (print, keep) = (self.planned.fingerprint, &self.planned.keep);
        let event_ts = bytes.and_then(|bytes| {
            let quiver_runtime::encoding::RowHeader { event_ts, created_ts, fingerprint: written } =
                OnlineRow::decode_into(bytes, Some((print, keep)), values).ok()?;
            if written == print && values.len() == self.view.features.len() {
                return Some(event_ts);
            }
            // A row written before the view's features changed: read by name.
            let row = OnlineRow { event_ts, created_ts, fingerprint: written, values: std::mem::take(values) };
            *values = self.layouts.conform(self.earlier, self.view, row)?.values;
            Some(event_ts)
        });
        Row::judge(self.view, event_ts, self.now)
    }
}

/// The requested features of a plain view for each stored row, judged at `now`: each
/// value moved into its column (cloned only for a feature requested twice).
pub(super) fn feature_columns(
    earlier: &EarlierLayouts,
    view: &FeatureView,
    planned: &ViewPlan,
    names: &[String],
    stored: &[Option<Vec<u8>>],
    now: i64,
    mut live: Option<&mut Vec<Option<i64>>>,
) -> Vec<Column> {
    let n = stored.len();
    let mut columns: Vec<Column> = planned.wanted.iter().map(|&(j, _)| Column::empty(&names[j], n)).collect();
    let mut reader = RowReader::new(earlier, view, planned, now);
    let mut values: Vec<Value> = Vec::new();
    for bytes in stored {
        let row = reader.read(bytes.as_deref(), &mut values);
        if let Some(live) = live.as_deref_mut() {
            live.push(if let Row::Live(ts) = row { Some(ts) } else { None });
        }
        for ((column, &(_, k)), &shared) in columns.iter_mut().zip(&planned.wanted).zip(&planned.shared) {
            let value = match row {
                Row::Missing | Row::Expired(_) => Value::Null,
                Row::Live(_) if shared => values[k].clone(),
                Row::Live(_) => std::mem::replace(&mut values[k], Value::Null),
            };
            let status = row.status(matches!(value, Value::Null));
            column.values.push(value);
            column.statuses.push(status);
            column.event_ts.push(row.event_ts());
        }
    }
    columns
}
