//! The serving log's rows in memory: one per entity row, feature view and answered
//! request, laid out as the table's columns ([`LogColumns`]) as they are built, so a
//! batch of them becomes Arrow columns without a per-row allocation.

use quiver_online::lookup::Column;
use quiver_online::lookup::wire;
use quiver_online::serving_log::Served;
use quiver_sdk::on_demand;

/// One row of the log: one entity row of one feature view in one request (the unit
/// tests read rows back as these).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
pub struct LogRow {
    pub request_id: String,
    pub request_time: i64,
    pub view: String,
    /// The view's join keys as a JSON object, in definition order: `{"driver_id":1001}`;
    /// of an on-demand view, then its request fields: `{"driver_id":1001,"amount":12.5}`.
    pub entity: String,
    /// The event time of the row served (`None` when nothing was found); of an event
    /// log, the latest of its aggregations' times.
    pub event_ts: Option<i64>,
    /// Of an event log, each aggregation's own event time (the latest event in its
    /// window) as a JSON object of RFC 3339 times, `{"rides_7d":"2026-...Z"}`, without
    /// those that have none; empty for other views, whose features share the row's.
    pub event_timestamps: String,
    /// `{"feature": value, ...}` for the view's features asked for, values as served.
    pub values: String,
    /// `{"feature": "PRESENT", ...}`.
    pub statuses: String,
}

/// Text values laid out as Arrow lays out a string column: the bytes one after the
/// other and where each ends, so a batch of them becomes a column without a copy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextColumn {
    pub bytes: Vec<u8>,
    /// `offsets[i]..offsets[i + 1]` is value `i`; starts with 0 once a value is added.
    pub offsets: Vec<i32>,
}

impl TextColumn {
    pub(super) fn start(&mut self) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
    }

    pub(super) fn end(&mut self) {
        self.offsets.push(i32::try_from(self.bytes.len()).expect("a log batch under 2 GiB per column"));
    }

    pub(super) fn push(&mut self, text: &str) {
        self.start();
        self.bytes.extend_from_slice(text.as_bytes());
        self.end();
    }

    /// Value `i` as text.
    #[cfg(test)]
    pub fn value(&self, i: usize) -> &str {
        std::str::from_utf8(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]).expect("JSON is UTF-8")
    }
}

/// Log rows, column by column (the log table's columns), built without a per-row
/// allocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogColumns {
    pub request_id: TextColumn,
    pub request_time: Vec<i64>,
    pub view: TextColumn,
    pub entity: TextColumn,
    pub event_ts: Vec<Option<i64>>,
    /// Empty for a row whose features share its event time (null in the table).
    pub event_timestamps: TextColumn,
    pub values: TextColumn,
    pub statuses: TextColumn,
}

impl LogColumns {
    pub fn len(&self) -> usize {
        self.request_time.len()
    }

    pub fn is_empty(&self) -> bool {
        self.request_time.is_empty()
    }

    /// The largest text column's bytes.
    pub fn bytes(&self) -> usize {
        self.values.bytes.len().max(self.statuses.bytes.len()).max(self.entity.bytes.len())
    }

    /// Row `i`, for reading back.
    #[cfg(test)]
    pub fn row(&self, i: usize) -> LogRow {
        LogRow {
            request_id: self.request_id.value(i).to_string(),
            request_time: self.request_time[i],
            view: self.view.value(i).to_string(),
            entity: self.entity.value(i).to_string(),
            event_ts: self.event_ts[i],
            event_timestamps: self.event_timestamps.value(i).to_string(),
            values: self.values.value(i).to_string(),
            statuses: self.statuses.value(i).to_string(),
        }
    }
}

/// The name the log gives the view `r` reads, as its storage names it: `view` for
/// version 1, `view@N` after it (a plain reference reads the latest).
pub(crate) fn logged_view(defs: &quiver_sdk::Definitions, r: &quiver_sdk::FeatureRef) -> String {
    use quiver_sdk::definitions::{FIRST_VERSION, versioned_name};
    let version = defs.version_read(r);
    versioned_name(&r.view, (version != FIRST_VERSION).then_some(version))
}

/// [`logged_view`], and `view@N`, which finds that version in `defs`.
fn version_read(defs: &quiver_sdk::Definitions, r: &quiver_sdk::FeatureRef) -> (String, String) {
    (logged_view(defs, r), format!("{}@{}", r.view, defs.version_read(r)))
}

/// Appends the log rows of one answer to `out`: per feature view asked for, one row
/// per entity row. Views whose keys the answer lacks (it cannot happen for a
/// successful lookup) are skipped.
pub fn append_log_rows(served: &Served, request_id: &str, out: &mut LogColumns) {
    let keys = &served.columns[..served.n_keys.min(served.columns.len())];
    let n = keys.first().map_or(0, |c| c.values.len());
    // Each reference's view as the version it read is stored: `view` for version 1,
    // `view@N` after it (a plain reference reads the latest).
    let read: Vec<(String, String)> = served.refs.iter().map(|r| version_read(&served.defs, r)).collect();
    let mut views: Vec<&(String, String)> = Vec::new();
    for r in &read {
        if !views.contains(&r) {
            views.push(r);
        }
    }
    for (name, asked) in views {
        // A feature view: its join keys; an on-demand view: the join keys its inputs
        // take that the request gave, then its request fields as given.
        let (key_columns, fields, own_times) = if let Some(view) = served.defs.feature_view(asked) {
            let key_columns: Option<Vec<&Column>> =
                served.defs.join_keys(view).iter().map(|k| keys.iter().find(|c| c.name == k.name)).collect();
            let Some(key_columns) = key_columns else { continue };
            (key_columns, Vec::new(), view.is_event_log())
        } else if let Some(view) = served.defs.on_demand_view(asked) {
            let key_columns: Vec<&Column> =
                on_demand::keys(&served.defs, view).iter().filter_map(|k| keys.iter().find(|c| c.name == k.name)).collect();
            let fields: Vec<&(String, Vec<quiver_runtime::encoding::Value>)> = on_demand::request_fields(&served.defs, view)
                .iter()
                .filter_map(|f| served.fields.iter().find(|(n, _)| *n == f.name))
                .collect();
            (key_columns, fields, true)
        } else {
            continue;
        };
        // This view's feature columns, each feature once.
        let mut features: Vec<(&str, &Column)> = Vec::new();
        for (i, r) in served.refs.iter().enumerate() {
            if read[i].0 == *name
                && !features.iter().any(|(f, _)| *f == r.feature)
                && let Some(c) = served.columns.get(served.n_keys + i)
            {
                features.push((&r.feature, c));
            }
        }
        // Each feature's `"name":` once, written before every value.
        let labels: Vec<Vec<u8>> = features
            .iter()
            .map(|(f, _)| {
                let mut label = Vec::new();
                wire::json_str(&mut label, f);
                label.push(b':');
                label
            })
            .collect();
        for row in 0..n {
            out.request_id.push(request_id);
            out.request_time.push(served.request_time);
            out.view.push(name);
            let times = &mut out.event_timestamps;
            times.start();
            if own_times {
                // Each aggregation's (on-demand feature's) own time; the row's, the
                // latest of them.
                out.event_ts.push(features.iter().filter_map(|(_, c)| c.event_ts[row]).filter(|&t| t != 0).max());
                times.bytes.push(b'{');
                let mut first = true;
                for (label, (_, c)) in labels.iter().zip(&features) {
                    if let Some(ts) = c.event_ts[row].filter(|&t| t != 0) {
                        if !std::mem::take(&mut first) {
                            times.bytes.push(b',');
                        }
                        times.bytes.extend_from_slice(label);
                        times.bytes.push(b'"');
                        quiver_sdk::types::write_rfc3339(&mut times.bytes, ts);
                        times.bytes.push(b'"');
                    }
                }
                times.bytes.push(b'}');
            } else {
                out.event_ts.push(features.first().and_then(|(_, c)| c.event_ts[row]));
            }
            times.end();
            let entity = &mut out.entity;
            entity.start();
            entity.bytes.push(b'{');
            for (i, c) in key_columns.iter().enumerate() {
                if i > 0 {
                    entity.bytes.push(b',');
                }
                wire::json_str(&mut entity.bytes, &c.name);
                entity.bytes.push(b':');
                wire::write_value(&mut entity.bytes, &c.values[row]);
            }
            for (i, (field, values)) in fields.iter().enumerate() {
                if i > 0 || !key_columns.is_empty() {
                    entity.bytes.push(b',');
                }
                wire::json_str(&mut entity.bytes, field);
                entity.bytes.push(b':');
                wire::write_value(&mut entity.bytes, &values[row]);
            }
            entity.bytes.push(b'}');
            entity.end();
            let (values, statuses) = (&mut out.values, &mut out.statuses);
            values.start();
            statuses.start();
            values.bytes.push(b'{');
            statuses.bytes.push(b'{');
            for (i, (_, c)) in features.iter().enumerate() {
                if i > 0 {
                    values.bytes.push(b',');
                    statuses.bytes.push(b',');
                }
                values.bytes.extend_from_slice(&labels[i]);
                wire::write_value(&mut values.bytes, &c.values[row]);
                statuses.bytes.extend_from_slice(&labels[i]);
                statuses.bytes.push(b'"');
                statuses.bytes.extend_from_slice(c.statuses[row].as_str().as_bytes());
                statuses.bytes.push(b'"');
            }
            values.bytes.push(b'}');
            statuses.bytes.push(b'}');
            values.end();
            statuses.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use quiver_runtime::encoding::Value;
    use quiver_sdk::{DType, Definitions, Entity, FeatureRef, FeatureView, KeyType};

    use quiver_online::lookup::wire::value_json;
    use quiver_online::lookup::{Column, Status};
    use quiver_online::serving_log::Served;

    use super::{LogColumns, LogRow, append_log_rows};

    fn column(name: &str, values: Vec<Value>, statuses: Vec<Status>, ts: Vec<Option<i64>>) -> Column {
        Column { name: name.into(), values, statuses, event_ts: ts }
    }

    /// A request naming view `v` twice around view `w` (one row per view and entity row,
    /// each feature once), a string key that needs escaping and an int64 key past 2^53.
    #[test]
    fn one_row_per_view_and_entity_row_with_the_answer_as_json() {
        let defs = Definitions::default()
            .with_entity(Entity::new("user").with_join_key("user_id", KeyType::String))
            .with_entity(Entity::new("item").with_join_key("item_id", KeyType::Int64))
            .with_feature_view(FeatureView::new("v").with_entity("user").with_feature("a", DType::Float64).with_feature("b", DType::Int64))
            .with_feature_view(FeatureView::new("w").with_entity("item").with_feature("x", DType::String));
        let refs: Vec<FeatureRef> = ["v:a", "w:x", "v:b", "v:a"].iter().map(|r| r.parse().unwrap()).collect();
        let big = (1i64 << 53) + 1;
        let served = Served {
            request_time: 42,
            defs: Arc::new(quiver_sdk::registry::Registered::new(defs)),
            refs,
            n_keys: 2,
            fields: Vec::new(),
            columns: vec![
                column("user_id", vec![Value::String("q\"u".into()), Value::String("u2".into())], vec![Status::Present; 2], vec![None; 2]),
                column("item_id", vec![Value::Int64(big), Value::Int64(7)], vec![Status::Present; 2], vec![None; 2]),
                column("a", vec![Value::Float64(50.0), Value::Null], vec![Status::Present, Status::NotFound], vec![Some(5), None]),
                column(
                    "x",
                    vec![Value::Null, Value::String("s".into())],
                    vec![Status::OutsideMaxAge, Status::Present],
                    vec![Some(1), Some(2)],
                ),
                column("b", vec![Value::Int64(3), Value::Null], vec![Status::Present, Status::NotFound], vec![Some(5), None]),
                column("a", vec![Value::Float64(50.0), Value::Null], vec![Status::Present, Status::NotFound], vec![Some(5), None]),
            ],
        };
        let mut columns = LogColumns::default();
        append_log_rows(&served, "r-1", &mut columns);
        let rows: Vec<LogRow> = (0..columns.len()).map(|i| columns.row(i)).collect();
        let row = |view: &str, entity: &str, ts, values: &str, statuses: &str| LogRow {
            request_id: "r-1".into(),
            request_time: 42,
            view: view.into(),
            entity: entity.into(),
            event_ts: ts,
            event_timestamps: String::new(),
            values: values.into(),
            statuses: statuses.into(),
        };
        assert_eq!(
            rows,
            vec![
                row("v", r#"{"user_id":"q\"u"}"#, Some(5), r#"{"a":50.0,"b":3}"#, r#"{"a":"PRESENT","b":"PRESENT"}"#),
                row("v", r#"{"user_id":"u2"}"#, None, r#"{"a":null,"b":null}"#, r#"{"a":"NOT_FOUND","b":"NOT_FOUND"}"#),
                row("w", &format!(r#"{{"item_id":{big}}}"#), Some(1), r#"{"x":null}"#, r#"{"x":"OUTSIDE_MAX_AGE"}"#),
                row("w", r#"{"item_id":7}"#, Some(2), r#"{"x":"s"}"#, r#"{"x":"PRESENT"}"#),
            ]
        );
        // What verify parses back: the same JSON values.
        let parsed: serde_json::Value = serde_json::from_str(&rows[2].entity).unwrap();
        assert_eq!(parsed["item_id"].as_i64(), Some(big));
        assert_eq!(value_json(&Value::Float32(0.1)), serde_json::to_string(&f64::from(0.1f32)).unwrap());
    }

    /// NaN and the infinities are logged as they are answered (`"NaN"`, `"Infinity"`,
    /// `"-Infinity"`), never as `null`, so that `verify` tells a served NaN from a served
    /// null (docs/consistency.md); the logged text reads back as the float.
    #[test]
    fn non_finite_floats_are_logged_as_answered() {
        use quiver_sdk::ListElement;
        let emb = DType::List(ListElement::Float32);
        let defs = Definitions::default()
            .with_entity(Entity::new("item").with_join_key("item_id", KeyType::Int64))
            .with_feature_view(FeatureView::new("w").with_entity("item").with_feature("x", DType::Float64).with_feature("e", emb));
        let nulls = vec![Status::Present, Status::NullValue, Status::NullValue];
        let served = Served {
            request_time: 42,
            defs: Arc::new(quiver_sdk::registry::Registered::new(defs)),
            refs: vec!["w:x".parse().unwrap(), "w:e".parse().unwrap()],
            n_keys: 1,
            fields: Vec::new(),
            columns: vec![
                column("item_id", vec![Value::Int64(1), Value::Int64(2), Value::Int64(3)], vec![Status::Present; 3], vec![None; 3]),
                column(
                    "x",
                    vec![Value::Float64(f64::NAN), Value::Float64(f64::INFINITY), Value::Null],
                    vec![Status::Present, Status::Present, Status::NullValue],
                    vec![Some(5); 3],
                ),
                column("e", vec![Value::ListFloat32(vec![f32::NEG_INFINITY, 0.5]), Value::Null, Value::Null], nulls, vec![Some(5); 3]),
            ],
        };
        let mut columns = LogColumns::default();
        append_log_rows(&served, "r-3", &mut columns);
        let values: Vec<String> = (0..columns.len()).map(|i| columns.row(i).values).collect();
        assert_eq!(values, [r#"{"x":"NaN","e":["-Infinity",0.5]}"#, r#"{"x":"Infinity","e":null}"#, r#"{"x":null,"e":null}"#]);
        let parsed: serde_json::Value = serde_json::from_str(&values[0]).unwrap();
        let x = quiver_runtime::rows::from_json(&parsed["x"], DType::Float64);
        assert!(matches!(x, Some(Value::Float64(x)) if x.is_nan()), "{x:?}");
        assert_eq!(quiver_runtime::rows::from_json(&parsed["e"], emb), Some(Value::ListFloat32(vec![f32::NEG_INFINITY, 0.5])));
    }

    /// An event log's row keeps each aggregation's own time (none for an empty window);
    /// the row's time is the latest of them.
    #[test]
    fn an_event_logs_row_keeps_each_aggregations_time() {
        use quiver_sdk::{AggFunction, Aggregation, Ttl};
        let count = |name: &str, window: &str| Aggregation {
            name: name.into(),
            function: AggFunction::Count,
            column: "fare".into(),
            window: Ttl::parse(window).unwrap(),
            hop: None,
            k: None,
            description: String::new(),
        };
        let defs = Definitions::default().with_entity(Entity::new("rider").with_join_key("rider_id", KeyType::Int64)).with_feature_view(
            FeatureView::new("rides")
                .with_entity("rider")
                .with_feature("fare", DType::Float64)
                .with_aggregation(count("n_1h", "1h"))
                .with_aggregation(count("n_7d", "7d")),
        );
        let t = 1_764_504_000_000_000; // 2025-11-30T12:00:00Z
        let served = Served {
            request_time: t + 1,
            defs: Arc::new(quiver_sdk::registry::Registered::new(defs)),
            refs: vec!["rides:n_1h".parse().unwrap(), "rides:n_7d".parse().unwrap()],
            n_keys: 1,
            fields: Vec::new(),
            columns: vec![
                column("rider_id", vec![Value::Int64(1)], vec![Status::Present], vec![None]),
                column("n_1h", vec![Value::Int64(0)], vec![Status::Present], vec![Some(0)]),
                column("n_7d", vec![Value::Int64(3)], vec![Status::Present], vec![Some(t)]),
            ],
        };
        let mut columns = LogColumns::default();
        append_log_rows(&served, "r-2", &mut columns);
        let row = columns.row(0);
        assert_eq!(row.event_ts, Some(t));
        assert_eq!(row.event_timestamps, r#"{"n_7d":"2025-11-30T12:00:00Z"}"#);
        assert_eq!(row.values, r#"{"n_1h":0,"n_7d":3}"#);
    }
}
