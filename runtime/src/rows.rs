//! Rows of a view from JSON: one strict reading shared by JSON-lines ingest, Kafka
//! messages (`quiver stream`), `quiver push` and the server's `/push`.
//!
//! A JSON object becomes a [`ViewRow`] when its join keys are set and of the key type,
//! its event time (and created time, when the view has one) is RFC 3339 text with a
//! zone, and every feature present has the feature's type. Absent or `null` features are
//! null values; fields the view does not know are ignored. Numbers are never narrowed
//! with loss: `1.5` is not an int64, and an int64 beyond 2^53 is not a float64. A float
//! (or a float list's item) may also be the text `"NaN"`, `"Infinity"` or `"-Infinity"`,
//! the forms the server answers them in ([`non_finite`]); any other text is refused.
//! The reason a row is refused names the field and what was expected.

use serde_json::{Map, Value as Json};

use crate::encoding::{KeyValue, OnlineRow, Value, expire_at_ms, store_key};
use quiver_sdk::definitions::{Definitions, FeatureView, JoinKey};
use quiver_sdk::types::{DType, KeyType, ListElement, format_instant, parse_instant};

mod typed;
use typed::Slots;

/// Where a push writes (docs/online.md `to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Online,
    Offline,
    OnlineAndOffline,
}

impl Target {
    /// Where a push goes unless told, in every front end (`quiver push`, `/push`,
    /// Python): both stores for a view that takes online writes, offline only for one
    /// with `online: false`.
    pub fn default_for(view: &FeatureView) -> Target {
        if view.takes_online_writes() { Target::OnlineAndOffline } else { Target::Offline }
    }

    pub fn online(self) -> bool {
        self != Target::Offline
    }
    pub fn offline(self) -> bool {
        self != Target::Online
    }
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Target, String> {
        match s {
            "online" => Ok(Target::Online),
            "offline" => Ok(Target::Offline),
            // The CLI's spelling before there was one, still understood.
            "online_and_offline" | "online-and-offline" => Ok(Target::OnlineAndOffline),
            other => Err(format!("`to` is `{other}` (expected online, offline or online_and_offline)")),
        }
    }
}

/// One typed row of a view.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewRow {
    /// In the view's join-key order.
    pub keys: Vec<KeyValue>,
    /// UTC microseconds.
    pub event_ts: i64,
    /// UTC microseconds; `None` when the view has no created-time column.
    pub created_ts: Option<i64>,
    /// In the view's feature order.
    pub values: Vec<Value>,
}

/// A view's row layout, resolved once for many rows.
#[derive(Debug, Clone)]
pub struct RowReader {
    pub view: FeatureView,
    pub keys: Vec<JoinKey>,
    /// The latest event time accepted (UTC microseconds): the wall clock plus
    /// `max_future_skew` (docs/limits.md). `None` accepts any time.
    pub latest_event: Option<i64>,
    /// The fields a message is read into on the typed path (see `typed`).
    slots: Slots,
}

impl RowReader {
    /// A reader that accepts rows of `view` with any event time; see
    /// [`RowReader::with_latest_event`].
    pub fn new(defs: &Definitions, view: &FeatureView) -> RowReader {
        let keys = defs.join_keys(view);
        let slots = Slots::of_view(view, &keys);
        RowReader { view: view.clone(), keys, latest_event: None, slots }
    }

    /// Refuses rows whose event time is after `latest` (UTC microseconds).
    #[must_use]
    pub fn with_latest_event(mut self, latest: i64) -> RowReader {
        self.latest_event = Some(latest);
        self
    }

    /// Reads one message or line: it must be a JSON object.
    ///
    /// # Errors
    /// The reason, naming the field at fault.
    pub fn from_slice(&self, bytes: &[u8]) -> Result<ViewRow, String> {
        // Good rows are read typed (see `typed`); the rest whole, which says why.
        if let Some(row) = self.read_typed(bytes) {
            return Ok(row);
        }
        match serde_json::from_slice::<Json>(bytes) {
            Ok(Json::Object(map)) => self.from_object(&map),
            Ok(other) => Err(format!("not a JSON object (got {})", kind(&other))),
            Err(e) => Err(format!("not valid JSON: {e}")),
        }
    }

    /// Reads one JSON object.
    ///
    /// # Errors
    /// The reason, naming the field at fault.
    pub fn from_object(&self, map: &Map<String, Json>) -> Result<ViewRow, String> {
        self.from_fields(|name| map.get(name))
    }

    /// Reads one row given a lookup of its fields (a row of a column-major frame).
    ///
    /// # Errors
    /// The reason, naming the field at fault.
    pub fn from_fields<'j>(&self, get: impl Fn(&str) -> Option<&'j Json>) -> Result<ViewRow, String> {
        let mut keys = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let v = get(&key.name).unwrap_or(&Json::Null);
            keys.push(match (key.dtype, v) {
                (_, Json::Null) => return Err(format!("join key `{}` is missing", key.name)),
                (KeyType::Int64, Json::Number(n)) if n.is_i64() => KeyValue::Int(n.as_i64().expect("checked")),
                (KeyType::String, Json::String(s)) if !s.is_empty() => KeyValue::Str(s.clone()),
                (KeyType::String, Json::String(_)) => {
                    return Err(format!("join key `{}` is an empty string", key.name));
                }
                (dtype, other) => {
                    return Err(format!("join key `{}` must be {dtype}, got {}", key.name, short(other)));
                }
            });
        }
        let time = |field: &str| -> Result<i64, String> {
            match get(field) {
                None | Some(Json::Null) => Err(format!("`{field}` is missing (every row needs it)")),
                Some(Json::String(s)) => parse_instant(s).map_err(|m| format!("`{field}`: {m}")),
                Some(other) => Err(format!("`{field}` must be RFC 3339 text with a zone, got {}", short(other))),
            }
        };
        let event_ts = time(&self.view.source.timestamp_field)?;
        if let Some(latest) = self.latest_event {
            check_event_time(&self.view.source.timestamp_field, event_ts, latest)?;
        }
        let created_ts = match &self.view.source.created_timestamp_field {
            Some(c) => Some(time(c)?),
            None => None,
        };
        let mut values = Vec::with_capacity(self.view.features.len());
        for f in &self.view.features {
            let v = get(&f.name).unwrap_or(&Json::Null);
            values.push(from_json(v, f.dtype).ok_or_else(|| {
                // A write-time view reads its raw columns here too: name them as such.
                let what = if self.view.source.raw.iter().any(|r| r.name == f.name) { "raw column" } else { "feature" };
                format!("{what} `{}` must be {}, got {}", f.name, f.dtype, short(v))
            })?);
        }
        Ok(ViewRow { keys, event_ts, created_ts, values })
    }
}

impl ViewRow {
    /// The online store's key, packed row and expiry for this row.
    pub fn online(&self, project: &str, view: &FeatureView, fingerprint: u64) -> (String, Vec<u8>, Option<i64>) {
        let row = OnlineRow::encode_parts(self.event_ts, self.created_ts.unwrap_or(i64::MIN), fingerprint, &self.values);
        (store_key(project, &view.storage_name(), &self.keys), row, expire_at_ms(view, self.event_ts))
    }
}

/// Refuses an event time after `latest` (the wall clock plus `max_future_skew`): a row
/// from the future would win every guarded write of its key until its time came.
///
/// # Errors
/// The reason, naming `field`, the time and the limit.
pub fn check_event_time(field: &str, event_ts: i64, latest: i64) -> Result<(), String> {
    if event_ts <= latest {
        return Ok(());
    }
    Err(format!(
        "`{field}` {} is in the future (later than {}, now + max_future_skew); a future event would block every later update of its key",
        format_instant(event_ts),
        format_instant(latest)
    ))
}

/// A JSON value as a value of `dtype`; `None` when it does not fit without loss.
pub fn from_json(v: &Json, dtype: DType) -> Option<Value> {
    if v.is_null() {
        return Some(Value::Null);
    }
    let int = |v: &Json| v.as_i64().filter(|_| v.is_i64() || v.is_u64());
    // A float column takes any number; an integer only while it is exact; and NaN and
    // the infinities in the text JSON writes them as.
    let float = |v: &Json| match v {
        Json::Number(n) if n.is_f64() => n.as_f64(),
        Json::Number(n) => n.as_i64().filter(|i| i.unsigned_abs() <= 1 << 53).map(|i| i as f64),
        Json::String(s) => non_finite(s),
        _ => None,
    };
    Some(match dtype {
        DType::Int32 => Value::Int32(i32::try_from(int(v)?).ok()?),
        DType::Int64 => Value::Int64(int(v)?),
        DType::Float32 => Value::Float32(float(v)? as f32),
        DType::Float64 => Value::Float64(float(v)?),
        DType::Bool => Value::Bool(v.as_bool()?),
        DType::String => Value::String(v.as_str()?.to_string()),
        DType::Bytes => Value::Bytes(v.as_array()?.iter().map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok())).collect::<Option<_>>()?),
        DType::Timestamp => Value::Timestamp(parse_instant(v.as_str()?).ok()?),
        DType::List(ListElement::Int64) => Value::ListInt64(v.as_array()?.iter().map(int).collect::<Option<_>>()?),
        DType::List(ListElement::Float32) => {
            Value::ListFloat32(v.as_array()?.iter().map(|x| float(x).map(|f| f as f32)).collect::<Option<_>>()?)
        }
        DType::List(ListElement::Float64) => Value::ListFloat64(v.as_array()?.iter().map(float).collect::<Option<_>>()?),
        DType::List(ListElement::String) => {
            Value::ListString(v.as_array()?.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<_>>()?)
        }
    })
}

/// A float JSON numbers cannot hold, from the text the server answers it as (protobuf's
/// JSON mapping, as Feast's server writes them; docs/online.md): `"NaN"`, `"Infinity"`,
/// `"-Infinity"`, exactly so spelled. `None` for any other text.
pub fn non_finite(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// A value for a message, cut short.
fn short(v: &Json) -> String {
    let text = v.to_string();
    if text.chars().count() > 60 { format!("{}...", text.chars().take(57).collect::<String>()) } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_sdk::definitions::Entity;
    use quiver_sdk::types::Ttl;

    pub(super) fn defs() -> Definitions {
        Definitions::default().with_entity(Entity::new("driver").with_join_key("driver_id", KeyType::Int64)).with_feature_view(
            FeatureView::new("stats")
                .with_entity("driver")
                .with_ttl(Ttl::parse("1h").unwrap())
                .with_feature("rate", DType::Float64)
                .with_feature("trips", DType::Int64)
                .with_feature("small", DType::Int32)
                .with_feature("emb", DType::List(ListElement::Float32)),
        )
    }

    #[test]
    fn good_rows_read_exactly() {
        let defs = defs();
        let r = RowReader::new(&defs, &defs.feature_views[0]);
        let row = r
            .from_slice(br#"{"driver_id": 7, "event_timestamp": "2024-01-01T01:00:00+01:00", "rate": 2, "trips": 3, "emb": [1, 0.5], "extra": {"x": 1}}"#)
            .unwrap();
        assert_eq!(row.keys, vec![KeyValue::Int(7)]);
        assert_eq!(row.event_ts, 1_704_067_200_000_000);
        assert_eq!(row.created_ts, None);
        assert_eq!(row.values, vec![Value::Float64(2.0), Value::Int64(3), Value::Null, Value::ListFloat32(vec![1.0, 0.5])]);
    }

    #[test]
    fn bad_rows_name_the_field() {
        let defs = defs();
        let r = RowReader::new(&defs, &defs.feature_views[0]);
        let cases: [(&[u8], &str); 11] = [
            (b"not json", "not valid JSON"),
            (b"[1, 2]", "not a JSON object (got an array)"),
            (br#"{"event_timestamp": "2024-01-01T00:00:00Z"}"#, "join key `driver_id` is missing"),
            (br#"{"driver_id": "7", "event_timestamp": "2024-01-01T00:00:00Z"}"#, "join key `driver_id` must be int64, got \"7\""),
            (br#"{"driver_id": 7}"#, "`event_timestamp` is missing"),
            (br#"{"driver_id": 7, "event_timestamp": "2024-01-01T00:00:00"}"#, "has no time zone"),
            (br#"{"driver_id": 7, "event_timestamp": 1704067200}"#, "must be RFC 3339 text with a zone"),
            (br#"{"driver_id": 7, "event_timestamp": "2024-01-01T00:00:00Z", "trips": 1.5}"#, "feature `trips` must be int64, got 1.5"),
            (br#"{"driver_id": 7, "event_timestamp": "2024-01-01T00:00:00Z", "small": 3000000000}"#, "feature `small` must be int32"),
            (br#"{"driver_id": 7, "event_timestamp": "2024-01-01T00:00:00Z", "rate": 9007199254740993}"#, "feature `rate` must be float64"),
            (br#"{"driver_id": 7, "event_timestamp": "2024-01-01T00:00:00Z", "emb": [1, "x"]}"#, "feature `emb` must be list<float32>"),
        ];
        for (input, want) in cases {
            let err = r.from_slice(input).unwrap_err();
            assert!(err.contains(want), "{}: {err}", String::from_utf8_lossy(input));
        }
    }

    /// NaN and the infinities, as the server answers them, are read back for float
    /// features and float list items, of both widths; other text for a float, a
    /// lowercase `nan` or `inf` included, and the same text for other types are refused.
    #[test]
    fn non_finite_floats_are_read_from_their_json_text() {
        let defs = defs();
        let r = RowReader::new(&defs, &defs.feature_views[0]);
        let row = |fields: &str| format!(r#"{{"driver_id": 7, "event_timestamp": "2024-01-01T00:00:00Z", {fields}}}"#);
        for (text, want) in [("NaN", f64::NAN), ("Infinity", f64::INFINITY), ("-Infinity", f64::NEG_INFINITY)] {
            let line = row(&format!(r#""rate": "{text}", "emb": ["{text}", 1.5]"#));
            let got = r.from_slice(line.as_bytes()).unwrap();
            let map: Map<String, Json> = serde_json::from_str(&line).unwrap();
            // The typed path and the path through a JSON object alike.
            for values in [got.values, r.from_object(&map).unwrap().values] {
                let (Value::Float64(rate), Value::ListFloat32(emb)) = (&values[0], &values[3]) else { panic!("{values:?}") };
                assert_eq!(rate.to_bits(), want.to_bits(), "{text}: {rate}");
                assert_eq!((emb[0].to_bits(), emb[1]), ((want as f32).to_bits(), 1.5), "{text}: {emb:?}");
            }
        }
        assert_eq!(from_json(&Json::from("NaN"), DType::Float32).map(|v| matches!(v, Value::Float32(x) if x.is_nan())), Some(true));
        assert_eq!(from_json(&Json::from("-Infinity"), DType::List(ListElement::Float64)), None, "not a list");
        let cases = [
            (row(r#""rate": "nan""#), "feature `rate` must be float64, got \"nan\""),
            (row(r#""rate": "inf""#), "feature `rate` must be float64"),
            (row(r#""rate": "+Infinity""#), "feature `rate` must be float64"),
            (row(r#""rate": " NaN""#), "feature `rate` must be float64"),
            (row(r#""rate": "1.5""#), "feature `rate` must be float64"),
            (row(r#""emb": ["Infinity", "x"]"#), "feature `emb` must be list<float32>"),
            (row(r#""trips": "NaN""#), "feature `trips` must be int64, got \"NaN\""),
            (row(r#""small": "Infinity""#), "feature `small` must be int32"),
        ];
        for (line, want) in cases {
            let err = r.from_slice(line.as_bytes()).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
        assert_eq!(non_finite("NaN").map(f64::is_nan), Some(true));
        assert_eq!(non_finite("Infinity"), Some(f64::INFINITY));
        assert_eq!(non_finite("-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(non_finite("Inf"), None);
    }

    #[test]
    fn event_times_after_the_horizon_are_refused() {
        let defs = defs();
        let latest = 1_704_067_500_000_000; // 2024-01-01T00:05:00Z
        let r = RowReader::new(&defs, &defs.feature_views[0]).with_latest_event(latest);
        assert!(r.from_slice(br#"{"driver_id": 7, "event_timestamp": "2024-01-01T00:05:00Z"}"#).is_ok(), "the limit itself is accepted");
        let err = r.from_slice(br#"{"driver_id": 7, "event_timestamp": "2024-01-01T00:05:00.000001Z"}"#).unwrap_err();
        assert!(err.contains("`event_timestamp` 2024-01-01T00:05:00.000001Z is in the future") && err.contains("max_future_skew"), "{err}");
        let err = r.from_slice(br#"{"driver_id": 7, "event_timestamp": "9999-12-31T23:59:59Z"}"#).unwrap_err();
        assert!(err.contains("9999-12-31T23:59:59Z"), "{err}");
        let open = RowReader::new(&defs, &defs.feature_views[0]);
        assert!(open.from_slice(br#"{"driver_id": 7, "event_timestamp": "9999-12-31T23:59:59Z"}"#).is_ok());
    }
}
