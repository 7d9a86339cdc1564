//! `verify`: does the online store agree with the offline store?
//!
//! `verify --since T [--until T]` ([`verify_log`]) replays the serving log: every
//! logged answer is joined point in time at its request time by the offline join, and
//! each served value, status and event time is compared with what the offline store
//! says should have been served then (docs/offline.md, docs/online.md: the latest row by event time, created
//! time and ingestion order at or before the request; TTL -> OUTSIDE_MAX_AGE; null ->
//! NULL_VALUE; no row -> NOT_FOUND). Served NOT_FOUND where offline has a row is
//! *missing online*; a served row where offline has none is *missing offline*.
//!
//! `verify --sample N` ([`verify_sample`]) needs no log:
//! For every online view, the offline winner of each entity at `now` (docs/offline.md: the
//! latest row by event time, created time, ingestion order, within the ttl) is the
//! expectation; `N` entities are drawn at random (seeded) and looked up online at the
//! same `now`, through the same lookup the server uses. Per feature: rows compared,
//! exact matches, mismatches (a different value or status), and missing online (the
//! offline store has the entity, the online store does not). Entities only the online
//! store has cannot be found by sampling the offline store; that needs the serving log.

mod log;
mod sample;

pub use log::{Rule, verify_log};
pub use sample::verify_sample;

use std::sync::Arc;

use arrow::array::Array;
use serde::{Deserialize, Serialize};

use quiver_runtime::encoding::{KeyValue, Value};

/// What one feature's comparison found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FeatureReport {
    /// `view:feature`.
    pub feature: String,
    pub compared: u64,
    pub matches: u64,
    pub mismatches: u64,
    pub missing_online: u64,
    /// Served a row where the offline store has none (only the serving log can tell).
    pub missing_offline: u64,
    /// A few mismatches and missing rows, described for people.
    pub examples: Vec<String>,
}

impl FeatureReport {
    /// Mismatched or missing rows over rows compared.
    pub fn mismatch_rate(&self) -> f64 {
        if self.compared == 0 { 0.0 } else { (self.mismatches + self.missing_online + self.missing_offline) as f64 / self.compared as f64 }
    }
}

const EXAMPLES: usize = 3;

/// A `verify` run's stored report (`.quiver/verify/`, one file per run), which the web
/// UI's consistency page lists and charts: `kind` (`since` or `sample`), when it ran,
/// the window it replayed (for `since`), and per feature the rows compared, the
/// disagreements and the rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub kind: String,
    /// When it ran (RFC 3339).
    pub at: String,
    pub since: Option<String>,
    pub until: Option<String>,
    pub features: Vec<StoredFeature>,
    /// When it ran (UTC microseconds): its file's name.
    #[serde(skip)]
    at_us: i64,
}

/// One feature's line of a [`VerifyReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredFeature {
    pub feature: String,
    pub compared: u64,
    pub mismatches: u64,
    pub missing_online: u64,
    pub missing_offline: u64,
    pub rate: f64,
}

impl VerifyReport {
    /// The report of a run of `kind` at `at` over `window` (UTC microseconds).
    pub(crate) fn new(kind: &str, at: i64, window: Option<(i64, i64)>, features: &[FeatureReport]) -> VerifyReport {
        use quiver_sdk::types::format_instant;
        VerifyReport {
            kind: kind.to_string(),
            at: format_instant(at),
            since: window.map(|(s, _)| format_instant(s)),
            until: window.map(|(_, u)| format_instant(u)),
            features: features
                .iter()
                .map(|f| StoredFeature {
                    feature: f.feature.clone(),
                    compared: f.compared,
                    mismatches: f.mismatches,
                    missing_online: f.missing_online,
                    missing_offline: f.missing_offline,
                    rate: f.mismatch_rate(),
                })
                .collect(),
            at_us: at,
        }
    }
}

impl crate::reports::Report for VerifyReport {
    const DIR: &'static str = ".quiver/verify";

    /// Named by time (microseconds, zero-padded): listing order is run order.
    fn file_name(&self) -> String {
        format!("{:020}-{}.json", self.at_us, self.kind)
    }
}

/// What replaying the serving log found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogReport {
    /// Distinct requests replayed.
    pub requests: u64,
    /// Log rows (entity rows x views) replayed.
    pub rows: u64,
    pub features: Vec<FeatureReport>,
    /// Log rows that could not be replayed, and why (a view or feature no longer
    /// defined, an entity that does not parse).
    pub skipped: Vec<String>,
}

/// Floats that agree to 1e-9 relative (docs/aggregations.md: an aggregation's float sums are added
/// in another order online than offline). An infinity agrees with the same infinity
/// only, a NaN with a NaN only (docs/consistency.md).
/// `name@N:feature`: version `version` of a view (docs/versions.md), whichever is the
/// latest, so that a request for it reads that version.
pub(crate) fn versioned_ref(name: &str, version: u32, feature: &str) -> quiver_sdk::FeatureRef {
    quiver_sdk::FeatureRef::new(name, feature).at(version)
}

pub(crate) fn floats_close(a: f64, b: f64) -> bool {
    if a.is_finite() && b.is_finite() { (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) } else { a == b || (a.is_nan() && b.is_nan()) }
}

/// Whether two values are the same, as the server would answer them: `==`, except that
/// a NaN (a float's, or a float list item's) is the same as a NaN (the server answers
/// both `"NaN"`; docs/consistency.md). A NaN and a null, or a NaN and an infinity, differ.
pub(crate) fn same_value(a: &Value, b: &Value) -> bool {
    let f64s = |x: f64, y: f64| x == y || (x.is_nan() && y.is_nan());
    let f32s = |x: &f32, y: &f32| f64s(f64::from(*x), f64::from(*y));
    match (a, b) {
        (Value::Float64(x), Value::Float64(y)) => f64s(*x, *y),
        (Value::Float32(x), Value::Float32(y)) => f32s(x, y),
        (Value::ListFloat64(x), Value::ListFloat64(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| f64s(*x, *y)),
        (Value::ListFloat32(x), Value::ListFloat32(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| f32s(x, y)),
        _ => a == b,
    }
}

/// Whether `view` reads an event log's aggregations, directly or through the on-demand
/// views it reads.
pub(crate) fn reads_aggregations(defs: &quiver_sdk::Definitions, view: &quiver_sdk::OnDemandView) -> bool {
    view.inputs.iter().any(|input| match (defs.feature_view(input), defs.on_demand_view(input)) {
        (Some(v), _) => v.is_event_log(),
        (None, Some(o)) => o.name != view.name && reads_aggregations(defs, o),
        (None, None) => false,
    })
}

/// A value as the server answers it (JSON), for the reports' examples.
pub(crate) fn show(v: &Value) -> String {
    quiver_online::lookup::wire::value_json(v)
}

/// A spine of the view's keys and `event_timestamp` = the request times.
pub(crate) fn spine_batch(
    keys: &[quiver_sdk::JoinKey],
    rows: &[Vec<KeyValue>],
    times: impl Iterator<Item = i64>,
) -> crate::error::Result<arrow::array::RecordBatch> {
    use arrow::array::{ArrayRef, TimestampMicrosecondArray};
    use arrow::datatypes::{Field, Schema};
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let column = quiver_offline::schema::key_array(k.dtype, rows.iter().map(|r| &r[i]));
        fields.push(Field::new(&k.name, column.data_type().clone(), false));
        columns.push(column);
    }
    let ts = TimestampMicrosecondArray::from_iter_values(times).with_timezone("UTC");
    fields.push(Field::new(quiver_offline::historical::SPINE_TIMESTAMP, ts.data_type().clone(), false));
    columns.push(Arc::new(ts));
    Ok(arrow::array::RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

#[cfg(test)]
mod tests {
    use quiver_runtime::encoding::Value;

    /// A NaN is the same as a NaN (the server answers both `"NaN"`), never as a null, an
    /// infinity or a number; an infinity only as the same infinity, in scalars and in
    /// list items, at both widths, and within the 1e-9 allowance too.
    #[test]
    fn a_nan_is_the_same_as_a_nan_only() {
        use super::{floats_close, same_value};
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        assert!(same_value(&Value::Float64(nan), &Value::Float64(-nan)));
        assert!(same_value(&Value::Float32(f32::NAN), &Value::Float32(f32::NAN)));
        assert!(same_value(&Value::ListFloat64(vec![1.0, nan]), &Value::ListFloat64(vec![1.0, nan])));
        assert!(same_value(&Value::ListFloat32(vec![f32::NAN, f32::INFINITY]), &Value::ListFloat32(vec![f32::NAN, f32::INFINITY])));
        assert!(same_value(&Value::Float64(inf), &Value::Float64(inf)));
        assert!(same_value(&Value::String("NaN".into()), &Value::String("NaN".into())));
        for (a, b) in [
            (Value::Float64(nan), Value::Null),
            (Value::Float64(nan), Value::Float64(inf)),
            (Value::Float64(inf), Value::Float64(-inf)),
            (Value::Float64(nan), Value::Float64(0.0)),
            (Value::Float32(f32::NAN), Value::Null),
            (Value::ListFloat64(vec![nan]), Value::ListFloat64(vec![nan, nan])),
            (Value::ListFloat64(vec![nan, 1.0]), Value::ListFloat64(vec![nan, 2.0])),
            (Value::ListFloat32(vec![f32::NAN]), Value::ListFloat32(vec![f32::NEG_INFINITY])),
        ] {
            assert!(!same_value(&a, &b) && !same_value(&b, &a), "{a:?} vs {b:?}");
        }
        assert!(floats_close(nan, nan) && floats_close(inf, inf) && floats_close(-inf, -inf));
        assert!(floats_close(1.0, 1.0 + 1e-12));
        assert!(!floats_close(nan, 1.0) && !floats_close(inf, -inf) && !floats_close(inf, f64::MAX) && !floats_close(nan, inf));
    }
}
