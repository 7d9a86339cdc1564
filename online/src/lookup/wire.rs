//! The `/get-online-features` wire format: its JSON primitives (strings, values, statuses)
//! and the answer written from a lookup's columns ([`response_json`]; [`super::LookupPlan::answer_json`]
//! writes the same bytes straight from stored rows).

use quiver_runtime::encoding::Value;
use quiver_sdk::types::write_rfc3339;

use super::{Column, Status};

/// The `/get-online-features` answer, written straight into one buffer: building a
/// `serde_json::Value` tree first costs an allocation per value, which dominates the
/// server's time at 100 entities x 20 features.
#[cfg(test)]
pub(crate) fn response_json(columns: &[Column]) -> Vec<u8> {
    response_json_with(columns, &[])
}

/// [`response_json`] with `metadata` (members, each after a comma) after the feature
/// names.
pub(crate) fn response_json_with(columns: &[Column], metadata: &[u8]) -> Vec<u8> {
    // A cell is about 60 bytes (a value, `"PRESENT",` and a 27-character time): sized
    // once, so a 100 KB answer is not copied as it grows.
    let cells: usize = columns.iter().map(|c| c.values.len()).sum();
    let names: usize = columns.iter().map(|c| c.name.len() + 3).sum();
    let mut out = Vec::with_capacity(64 + names + cells * 64);
    out.extend_from_slice(br#"{"metadata":{"feature_names":["#);
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_str(&mut out, &c.name);
    }
    out.push(b']');
    out.extend_from_slice(metadata);
    out.extend_from_slice(br#"},"results":["#);
    let mut previous_times: Option<(usize, std::ops::Range<usize>)> = None;
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"values":["#);
        for (j, v) in c.values.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            write_value(&mut out, v);
        }
        out.extend_from_slice(br#"],"statuses":["#);
        for (j, s) in c.statuses.iter().enumerate() {
            // `"PRESENT",` and the like, the comma dropped for the first.
            out.extend_from_slice(&quoted(*s)[usize::from(j == 0)..]);
        }
        out.extend_from_slice(br#"],"event_timestamps":["#);
        // Features of one view share their rows' times: copy the previous column's text.
        match previous_times {
            Some((prev, ref range)) if columns[prev].event_ts == c.event_ts => {
                out.extend_from_within(range.clone());
            }
            _ => {
                let start = out.len();
                for (j, t) in c.event_ts.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.push(b'"');
                    write_rfc3339(&mut out, t.unwrap_or(0));
                    out.push(b'"');
                }
                previous_times = Some((i, start..out.len()));
            }
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"]}");
    out
}

/// `,"STATUS"`: a status as JSON after a comma.
pub(crate) fn quoted(s: Status) -> &'static [u8] {
    match s {
        Status::Present => br#","PRESENT""#,
        Status::NullValue => br#","NULL_VALUE""#,
        Status::NotFound => br#","NOT_FOUND""#,
        Status::OutsideMaxAge => br#","OUTSIDE_MAX_AGE""#,
    }
}

/// `s` as a JSON string.
pub fn json_str(out: &mut Vec<u8>, s: &str) {
    // Most names and strings need no escape: copied as they are.
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
    }
}

/// One value as JSON. Floats always carry a decimal point (`50.0`), as Feast's client
/// infers the type from the JSON form; NaN and the infinities, which JSON numbers cannot
/// hold, are the strings `"NaN"`, `"Infinity"` and `"-Infinity"` (protobuf's JSON
/// mapping, as Feast's server answers them; docs/online.md), never `null`: a NaN is a
/// value, not a missing one.
pub fn write_value(out: &mut Vec<u8>, v: &Value) {
    fn float(out: &mut Vec<u8>, x: f64) {
        if x.is_finite() {
            serde_json::to_writer(&mut *out, &x).expect("writing to a Vec cannot fail");
        } else if x.is_nan() {
            out.extend_from_slice(br#""NaN""#);
        } else if x > 0.0 {
            out.extend_from_slice(br#""Infinity""#);
        } else {
            out.extend_from_slice(br#""-Infinity""#);
        }
    }
    fn list<T>(out: &mut Vec<u8>, items: &[T], mut each: impl FnMut(&mut Vec<u8>, &T)) {
        out.push(b'[');
        for (i, x) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            each(out, x);
        }
        out.push(b']');
    }
    let int = |out: &mut Vec<u8>, x: i64| serde_json::to_writer(&mut *out, &x).expect("writing to a Vec cannot fail");
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Int32(x) => int(out, i64::from(*x)),
        Value::Int64(x) => int(out, *x),
        Value::Float32(x) => float(out, f64::from(*x)),
        Value::Float64(x) => float(out, *x),
        Value::Bool(x) => out.extend_from_slice(if *x { b"true" } else { b"false" }),
        Value::String(x) => json_str(out, x),
        Value::Bytes(x) => list(out, x, |out, b| int(out, i64::from(*b))),
        Value::Timestamp(x) => {
            out.push(b'"');
            write_rfc3339(out, *x);
            out.push(b'"');
        }
        Value::ListInt64(x) => list(out, x, |out, v| int(out, *v)),
        Value::ListFloat32(x) => list(out, x, |out, v| float(out, f64::from(*v))),
        Value::ListFloat64(x) => list(out, x, |out, v| float(out, *v)),
        Value::ListString(x) => list(out, x, |out, v| json_str(out, v)),
    }
}

/// A value as the server writes it in JSON (floats keep a decimal point; NaN and the
/// infinities are `"NaN"`, `"Infinity"`, `"-Infinity"`): the form the serving log holds,
/// and what `verify` compares.
pub fn value_json(v: &Value) -> String {
    let mut out = Vec::new();
    write_value(&mut out, v);
    String::from_utf8(out).expect("JSON is UTF-8")
}

#[cfg(test)]
mod tests {
    /// The direct writer against a `serde_json::Value` built the plain way, for every
    /// value kind: same JSON document, and floats keep their decimal point.
    #[test]
    fn response_json_matches_serde() {
        use super::super::Status;
        use super::{Column, Value};
        use serde_json::json;
        let values = vec![
            Value::Null,
            Value::Int32(-7),
            Value::Int64(i64::MIN),
            Value::Float32(0.1),
            Value::Float64(50.0),
            Value::Float64(f64::NAN),
            Value::Bool(true),
            Value::String("quote\" and \u{e9}\n".into()),
            Value::Bytes(vec![0, 255]),
            Value::Timestamp(1_709_210_096_123_000),
            Value::ListInt64(vec![1, -2]),
            Value::ListFloat32(vec![1.0, 0.5]),
            Value::ListFloat64(vec![2.0, f64::INFINITY]),
            Value::ListString(vec!["a".into(), "b\"".into()]),
        ];
        let n = values.len();
        const ALL: [Status; 4] = [Status::Present, Status::NullValue, Status::NotFound, Status::OutsideMaxAge];
        let times: Vec<Option<i64>> = (0..n).map(|i| (i % 2 == 0).then_some(i as i64 * 1_000_001)).collect();
        let column = |name: &str, values: Vec<Value>, times: Vec<Option<i64>>| Column {
            name: name.into(),
            values,
            statuses: (0..n).map(|i| ALL[i % 4]).collect(),
            event_ts: times,
        };
        // Two columns with the same times (one view), then one with other times.
        let columns = vec![
            column("f\"1\u{1}\\ é", values.clone(), times.clone()),
            column("g", values.clone(), times.clone()),
            column("h", values.clone(), times.iter().map(|t| t.map(|t| t + 7)).collect()),
        ];
        let text = String::from_utf8(super::response_json(&columns)).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        let f = |x: f64| json!(x);
        let result = |times: &[Option<i64>]| {
            json!({
                "values": [null, -7, i64::MIN, f(f64::from(0.1f32)), 50.0, "NaN", true, "quote\" and \u{e9}\n",
                           [0, 255], "2024-02-29T12:34:56.123Z", [1, -2], [1.0, 0.5], [2.0, "Infinity"], ["a", "b\""]],
                "statuses": (0..n).map(|i| ALL[i % 4].as_str()).collect::<Vec<_>>(),
                "event_timestamps": times.iter().map(|t| quiver_sdk::types::format_instant(t.unwrap_or(0))).collect::<Vec<_>>(),
            })
        };
        let later: Vec<Option<i64>> = times.iter().map(|t| t.map(|t| t + 7)).collect();
        let want = json!({
            "metadata": {"feature_names": ["f\"1\u{1}\\ é", "g", "h"]},
            "results": [result(&times), result(&times), result(&later)]
        });
        assert_eq!(parsed, want);
        assert!(text.contains("50.0") && text.contains("[1.0,0.5]"), "{text}");
    }

    /// NaN and the infinities, of both float widths and inside lists, are the strings of
    /// protobuf's JSON mapping (what Feast's server answers), not `null`; -0.0 and the
    /// largest floats stay numbers.
    #[test]
    fn non_finite_floats_are_written_as_protobuf_json_strings() {
        use super::{Value, value_json};
        let cases = [
            (Value::Float64(f64::NAN), r#""NaN""#),
            (Value::Float64(-f64::NAN), r#""NaN""#),
            (Value::Float64(f64::INFINITY), r#""Infinity""#),
            (Value::Float64(f64::NEG_INFINITY), r#""-Infinity""#),
            (Value::Float32(f32::NAN), r#""NaN""#),
            (Value::Float32(f32::INFINITY), r#""Infinity""#),
            (Value::Float32(f32::NEG_INFINITY), r#""-Infinity""#),
            (Value::Float64(-0.0), "-0.0"),
            (Value::Float64(f64::MAX), "1.7976931348623157e+308"),
            (Value::ListFloat32(vec![f32::NAN, 1.5, f32::NEG_INFINITY]), r#"["NaN",1.5,"-Infinity"]"#),
            (Value::ListFloat64(vec![f64::INFINITY, f64::NAN, 2.0]), r#"["Infinity","NaN",2.0]"#),
            (Value::Null, "null"),
        ];
        for (value, want) in cases {
            assert_eq!(value_json(&value), want, "{value:?}");
        }
    }
}
