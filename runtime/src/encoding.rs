//! The online encoding shared by every online store and by streaming: entity keys as
//! store keys, and a view's latest row packed into bytes.
//!
//! A packed row starts with its ordering header — event time then created time, each as
//! 8 big-endian bytes with the sign bit flipped — so that comparing the first 16 bytes
//! as unsigned bytes orders rows exactly as the guarded write of docs/online.md does ("newer
//! (event_ts, created_ts) wins, equal replaces"). A Redis script and the embedded store
//! can both apply the guard without decoding anything else. Then come a format byte,
//! the view's schema fingerprint (so a row written under another schema is recognised),
//! and the values.

use std::fmt;

use quiver_sdk::definitions::FeatureView;
use quiver_sdk::types::{DType, ListElement};

/// Length of the ordering header at the start of every packed row.
pub const ORDER_HEADER_LEN: usize = 16;
const FORMAT: u8 = 1;

/// How long a key outlives its view's TTL in an online store, so that reads in that
/// window say OUTSIDE_MAX_AGE (after it they say NOT_FOUND).
pub const KEY_GRACE_MS: i64 = 24 * 3600 * 1000;

/// When the online key of a row with event time `event_ts` (UTC microseconds) expires,
/// in milliseconds since the epoch: the TTL plus [`KEY_GRACE_MS`] after the event, and
/// never before 1 ms after the epoch (Redis takes no expiry at or before it, and 0
/// means "none" to the stores: a row dated before 1970 has long expired in both);
/// `None` (never) for a view without a TTL.
pub fn expire_at_ms(view: &FeatureView, event_ts: i64) -> Option<i64> {
    let ttl_ms = i64::try_from(view.ttl.as_duration()?.as_millis()).ok()?;
    Some(event_ts.div_euclid(1000).saturating_add(ttl_ms).saturating_add(KEY_GRACE_MS).max(1))
}

/// One join-key value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyValue {
    Int(i64),
    Str(String),
}

impl KeyValue {
    /// A join-key value from JSON: an integer that fits an int64, or a string; `None`
    /// for anything else (a float, a bool, null).
    ///
    /// ```
    /// use quiver_runtime::encoding::KeyValue;
    /// assert_eq!(KeyValue::from_json(&serde_json::json!(7)), Some(KeyValue::Int(7)));
    /// assert_eq!(KeyValue::from_json(&serde_json::json!("a")), Some(KeyValue::Str("a".into())));
    /// assert_eq!(KeyValue::from_json(&serde_json::json!(1.5)), None);
    /// ```
    pub fn from_json(v: &serde_json::Value) -> Option<KeyValue> {
        match v {
            serde_json::Value::Number(n) => n.as_i64().map(KeyValue::Int),
            serde_json::Value::String(s) => Some(KeyValue::Str(s.clone())),
            _ => None,
        }
    }

    /// As [`KeyValue::from_json`], of the key type `dtype` only.
    pub fn from_json_as(v: &serde_json::Value, dtype: quiver_sdk::KeyType) -> Option<KeyValue> {
        match (dtype, KeyValue::from_json(v)?) {
            (quiver_sdk::KeyType::Int64, k @ KeyValue::Int(_)) | (quiver_sdk::KeyType::String, k @ KeyValue::Str(_)) => Some(k),
            _ => None,
        }
    }
}

/// The entity part of a store key: each key value as `i<decimal>` or
/// `s<byte length>:<text>`, joined by `|`. Length prefixes keep it unambiguous whatever
/// the strings hold.
///
/// ```
/// use quiver_runtime::encoding::{KeyValue, entity_key};
/// assert_eq!(entity_key(&[KeyValue::Int(1001), KeyValue::Str("a|b".into())]), "i1001|s3:a|b");
/// ```
pub fn entity_key(values: &[KeyValue]) -> String {
    let mut out = String::new();
    push_entity_key(&mut out, values);
    out
}

/// [`entity_key`], appended to `out` (no allocation of its own).
fn push_entity_key(out: &mut String, values: &[KeyValue]) {
    let mut digits = itoa::Buffer::new();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        match v {
            KeyValue::Int(n) => {
                out.push('i');
                out.push_str(digits.format(*n));
            }
            KeyValue::Str(s) => {
                out.push('s');
                out.push_str(digits.format(s.len()));
                out.push(':');
                out.push_str(s);
            }
        }
    }
}

/// The store key of one entity's row of one view: `quiver:<project>:<view>:<entity>`.
/// Built in one allocation: a lookup of 100 entities builds a key per entity and view.
pub fn store_key(project: &str, view: &str, values: &[KeyValue]) -> String {
    let entity: usize = values.iter().map(|v| if let KeyValue::Str(s) = v { s.len() + 12 } else { 21 }).sum();
    let mut out = String::with_capacity(9 + project.len() + view.len() + entity);
    out.push_str("quiver:");
    out.push_str(project);
    out.push(':');
    out.push_str(view);
    out.push(':');
    push_entity_key(&mut out, values);
    out
}

/// One feature value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int32(i32),
    Int64(i64),
    Float32(f32),
    Float64(f64),
    Bool(bool),
    String(String),
    Bytes(Vec<u8>),
    /// UTC microseconds.
    Timestamp(i64),
    ListInt64(Vec<i64>),
    ListFloat32(Vec<f32>),
    ListFloat64(Vec<f64>),
    ListString(Vec<String>),
}

impl Value {
    /// Whether this value may stand in a feature of `dtype` (null fits any).
    pub fn fits(&self, dtype: DType) -> bool {
        matches!(
            (self, dtype),
            (Value::Null, _)
                | (Value::Int32(_), DType::Int32)
                | (Value::Int64(_), DType::Int64)
                | (Value::Float32(_), DType::Float32)
                | (Value::Float64(_), DType::Float64)
                | (Value::Bool(_), DType::Bool)
                | (Value::String(_), DType::String)
                | (Value::Bytes(_), DType::Bytes)
                | (Value::Timestamp(_), DType::Timestamp)
                | (Value::ListInt64(_), DType::List(ListElement::Int64))
                | (Value::ListFloat32(_), DType::List(ListElement::Float32))
                | (Value::ListFloat64(_), DType::List(ListElement::Float64))
                | (Value::ListString(_), DType::List(ListElement::String))
        )
    }
}

/// A view's row for one entity, as the online store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineRow {
    /// Event time, UTC microseconds.
    pub event_ts: i64,
    /// Created time, UTC microseconds (`i64::MIN` when the view has none).
    pub created_ts: i64,
    /// The view's schema fingerprint when written.
    pub fingerprint: u64,
    /// One value per feature of the view, in the view's order.
    pub values: Vec<Value>,
}

/// Why bytes are not a packed row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("packed online row: {0}")]
pub struct DecodeError(pub String);

pub(crate) fn order_bytes(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

fn from_order_bytes(b: [u8; 8]) -> i64 {
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

impl OnlineRow {
    /// Packs the row.
    pub fn encode(&self) -> Vec<u8> {
        OnlineRow::encode_parts(self.event_ts, self.created_ts, self.fingerprint, &self.values)
    }

    /// Packs a row from its parts, borrowing the values (no [`OnlineRow`] to build).
    pub fn encode_parts(event_ts: i64, created_ts: i64, fingerprint: u64, values: &[Value]) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + values.len() * 9);
        out.extend_from_slice(&order_bytes(event_ts));
        out.extend_from_slice(&order_bytes(created_ts));
        out.push(FORMAT);
        out.extend_from_slice(&fingerprint.to_le_bytes());
        out.extend_from_slice(&(values.len() as u32).to_le_bytes());
        for v in values {
            write_value(&mut out, v);
        }
        out
    }

    /// Unpacks a row.
    ///
    /// # Errors
    /// [`DecodeError`] for truncated bytes, an unknown format or value tag, or bad UTF-8.
    pub fn decode(bytes: &[u8]) -> Result<OnlineRow, DecodeError> {
        let mut values = Vec::new();
        let RowHeader { event_ts, created_ts, fingerprint } = OnlineRow::decode_into(bytes, None, &mut values)?;
        Ok(OnlineRow { event_ts, created_ts, fingerprint, values })
    }

    /// Unpacks a row's header and its values into `values` (cleared first; reused from row to row, it allocates once). With
    /// `keep` = (fingerprint, which values), a row of that fingerprint and that many
    /// values has only the kept ones decoded; the others read as null and cost no
    /// allocation. Any other row is decoded whole.
    ///
    /// # Errors
    /// As [`OnlineRow::decode`]; `values` is then unspecified.
    pub fn decode_into(bytes: &[u8], keep: Option<(u64, &[bool])>, values: &mut Vec<Value>) -> Result<RowHeader, DecodeError> {
        let mut r = Reader { bytes, at: 0 };
        let event_ts = from_order_bytes(r.array()?);
        let created_ts = from_order_bytes(r.array()?);
        let format = r.take(1)?[0];
        if format != FORMAT {
            return Err(DecodeError(format!("unknown format {format}")));
        }
        let fingerprint = u64::from_le_bytes(r.array()?);
        let n = r.len()?;
        let keep = keep.filter(|(print, keep)| *print == fingerprint && keep.len() == n).map(|(_, keep)| keep);
        values.clear();
        values.reserve(n.min(4096));
        for k in 0..n {
            if keep.is_some_and(|keep| !keep[k]) {
                r.skip_value()?;
                values.push(Value::Null);
            } else {
                values.push(r.value()?);
            }
        }
        if r.at != bytes.len() {
            return Err(DecodeError(format!("{} trailing bytes", bytes.len() - r.at)));
        }
        Ok(RowHeader { event_ts, created_ts, fingerprint })
    }
}

/// A packed row's header ([`OnlineRow::decode_into`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowHeader {
    /// Event time, UTC microseconds.
    pub event_ts: i64,
    /// Created time, UTC microseconds.
    pub created_ts: i64,
    /// The schema fingerprint the values were written under.
    pub fingerprint: u64,
}

/// Appends one value in the packed encoding (a tag byte, then the value).
pub(crate) fn write_value(out: &mut Vec<u8>, v: &Value) {
    let len = |out: &mut Vec<u8>, n: usize| out.extend_from_slice(&(n as u32).to_le_bytes());
    match v {
        Value::Null => out.push(0),
        Value::Int32(x) => {
            out.push(1);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Int64(x) => {
            out.push(2);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Float32(x) => {
            out.push(3);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Float64(x) => {
            out.push(4);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Bool(x) => {
            out.push(5);
            out.push(u8::from(*x));
        }
        Value::String(s) => {
            out.push(6);
            len(out, s.len());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bytes(b) => {
            out.push(7);
            len(out, b.len());
            out.extend_from_slice(b);
        }
        Value::Timestamp(x) => {
            out.push(8);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::ListInt64(xs) => {
            out.push(9);
            len(out, xs.len());
            xs.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        Value::ListFloat32(xs) => {
            out.push(10);
            len(out, xs.len());
            xs.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        Value::ListFloat64(xs) => {
            out.push(11);
            len(out, xs.len());
            xs.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        Value::ListString(xs) => {
            out.push(12);
            len(out, xs.len());
            for s in xs {
                len(out, s.len());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }
}

/// An event time as the 8 order-preserving bytes that start a packed row's header
/// (compare them as unsigned bytes to compare the times).
pub fn event_order_bytes(event_ts: i64) -> [u8; 8] {
    order_bytes(event_ts)
}

/// The guarded write's rule with a horizon (UTC microseconds: the writer's clock plus
/// `max_future_skew`): a stored row dated after it is one that should never have been
/// written, and any write replaces it; otherwise [`replaces`].
pub fn replaces_before(stored: &[u8], incoming: &[u8], horizon: i64) -> bool {
    if incoming.len() < ORDER_HEADER_LEN {
        return false;
    }
    match stored.get(..8) {
        Some(ts) if ts > &order_bytes(horizon)[..] => true,
        _ => replaces(stored, incoming),
    }
}

/// The guarded write's rule on two packed rows: `incoming` replaces `stored` unless
/// `stored` has a greater (event_ts, created_ts). Rows shorter than the header never win.
pub fn replaces(stored: &[u8], incoming: &[u8]) -> bool {
    match (stored.get(..ORDER_HEADER_LEN), incoming.get(..ORDER_HEADER_LEN)) {
        (Some(s), Some(i)) => i >= s,
        (None, Some(_)) => true,
        (_, None) => false,
    }
}

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    /// How many bytes are left.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// Whether every byte was read.
    pub(crate) fn is_done(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// One value written by [`write_value`]. Inlined: called out of line, each value's
    /// `Result<Value, _>` was copied twice through the stack, and those copies were most
    /// of a 100-entity lookup's decoding time (`perf annotate`).
    #[inline]
    pub(crate) fn value(&mut self) -> Result<Value, DecodeError> {
        let tag = self.take(1)?[0];
        Ok(match tag {
            0 => Value::Null,
            1 => Value::Int32(i32::from_le_bytes(self.array()?)),
            2 => Value::Int64(i64::from_le_bytes(self.array()?)),
            3 => Value::Float32(f32::from_le_bytes(self.array()?)),
            4 => Value::Float64(f64::from_le_bytes(self.array()?)),
            5 => Value::Bool(self.take(1)?[0] != 0),
            6 => Value::String(self.string()?),
            7 => {
                let n = self.len()?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            8 => Value::Timestamp(i64::from_le_bytes(self.array()?)),
            9 => Value::ListInt64(self.list(|r| Ok(i64::from_le_bytes(r.array()?)))?),
            10 => Value::ListFloat32(self.list(|r| Ok(f32::from_le_bytes(r.array()?)))?),
            11 => Value::ListFloat64(self.list(|r| Ok(f64::from_le_bytes(r.array()?)))?),
            12 => Value::ListString(self.list(Reader::string)?),
            other => return Err(DecodeError(format!("unknown value tag {other}"))),
        })
    }

    /// Steps over one value written by [`write_value`] without building it (its tag and
    /// lengths are checked as [`Reader::value`] checks them; a string's UTF-8 is not).
    pub(crate) fn skip_value(&mut self) -> Result<(), DecodeError> {
        let tag = self.take(1)?[0];
        let fixed = |r: &mut Self, width: usize| r.take(width).map(|_| ());
        match tag {
            0 => Ok(()),
            1 | 3 => fixed(self, 4),
            2 | 4 | 8 => fixed(self, 8),
            5 => fixed(self, 1),
            6 | 7 => {
                let n = self.len()?;
                fixed(self, n)
            }
            9 | 11 => {
                let n = self.len()?;
                fixed(self, n.checked_mul(8).ok_or_else(|| self.truncated())?)
            }
            10 => {
                let n = self.len()?;
                fixed(self, n.checked_mul(4).ok_or_else(|| self.truncated())?)
            }
            12 => {
                for _ in 0..self.len()? {
                    let n = self.len()?;
                    fixed(self, n)?;
                }
                Ok(())
            }
            other => Err(DecodeError(format!("unknown value tag {other}"))),
        }
    }

    /// The next byte.
    #[inline]
    pub(crate) fn byte(&mut self) -> Result<u8, DecodeError> {
        match self.bytes.get(self.at) {
            Some(&b) => {
                self.at += 1;
                Ok(b)
            }
            None => Err(self.truncated()),
        }
    }

    #[cold]
    fn truncated(&self) -> DecodeError {
        DecodeError(format!("truncated at byte {}", self.at))
    }

    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.truncated());
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    pub(crate) fn len(&mut self) -> Result<usize, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }

    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        let n = self.len()?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| DecodeError("bad UTF-8".into()))
    }

    pub(crate) fn list<T>(&mut self, item: impl Fn(&mut Self) -> Result<T, DecodeError>) -> Result<Vec<T>, DecodeError> {
        let n = self.len()?;
        let mut out = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            out.push(item(self)?);
        }
        Ok(out)
    }
}

impl fmt::Display for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyValue::Int(n) => write!(f, "{n}"),
            KeyValue::Str(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests;
