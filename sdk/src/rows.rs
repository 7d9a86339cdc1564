//! Rows of a view from JSON: one strict reading shared by JSON-lines ingest, Kafka
//! messages (`quiver stream`), `quiver push` and the server's `/push`.
//!
//! A JSON object becomes a [`ViewRow`] when its join keys are set and of the key type,
//! its event time (and created time, when the view has one) is RFC 3339 text with a
//! zone, and every feature present has the feature's type. Absent or `null` features are
//! null values; fields the view does not know are ignored. Numbers are never narrowed
//! with loss: `1.5` is not an int64, and an int64 beyond 2^53 is not a float64.
//! The reason a row is refused names the field and what was expected.

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::definitions::{Definitions, FeatureView, JoinKey};
use crate::encoding::{KeyValue, OnlineRow, Value, expire_at_ms, store_key};
use crate::types::{DType, KeyType, ListElement};

/// Where a push writes (SPEC §6 `to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Online,
    Offline,
    OnlineAndOffline,
}

impl Target {
    /// Where a push goes unless told: both stores for an online view, offline only
    /// for a view with `online: false`.
    pub fn default_for(view: &FeatureView) -> Target {
        if view.online { Target::OnlineAndOffline } else { Target::Offline }
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
            "online_and_offline" => Ok(Target::OnlineAndOffline),
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
    /// `max_future_skew` (SPEC §13). `None` accepts any time.
    pub latest_event: Option<i64>,
    /// The fields a row is read from, for reading a message without building its
    /// JSON object first (see [`Slots`]).
    slots: Slots,
}

/// The fields a row is read from, each given a slot: the join keys, the event time, the
/// created time (where the view has one) and the features, in that order, a name read
/// by two of them (a feature named as a key, say) sharing one slot. A message is read
/// into one value per slot, dropping every field the view does not know, instead of
/// into a JSON object of all its fields: a stream's messages are read this way, and
/// building the object (a map, a string per field name) took most of the reading.
#[derive(Debug, Clone)]
struct Slots {
    /// The name of each slot.
    names: Vec<String>,
    /// Open addressing by the name's hash: slot + 1, or 0 for none. At most half full,
    /// so an unknown name meets a 0 soon; a name is found with one comparison, mostly.
    table: Vec<u32>,
    /// The slot of each field, in the order the reader reads them.
    of_field: Vec<usize>,
    /// What each slot's value is read as on the typed path; `None` when no slot is
    /// read by two fields (only then is there a typed path).
    types: Option<Vec<SlotType>>,
}

/// What a slot's value is read as on the typed path (see [`RowReader::from_slice`]).
#[derive(Debug, Clone, Copy)]
enum SlotType {
    Key(KeyType),
    Time,
    /// A scalar feature, read as its value directly.
    Scalar(DType),
    /// A list or bytes feature: read as JSON, then as its value.
    Json,
}

impl Slots {
    fn new<'a>(fields: impl Iterator<Item = (&'a str, SlotType)>) -> Slots {
        let mut names: Vec<String> = Vec::new();
        let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut of_field = Vec::new();
        let mut types = Some(Vec::new());
        for (name, ty) in fields {
            let slot = match seen.get(name) {
                Some(&slot) => {
                    types = None;
                    slot
                }
                None => {
                    seen.insert(name, names.len());
                    names.push(name.to_string());
                    if let Some(types) = &mut types {
                        types.push(ty);
                    }
                    names.len() - 1
                }
            };
            of_field.push(slot);
        }
        let mut table = vec![0u32; (names.len() * 2).next_power_of_two().max(4)];
        let mask = table.len() - 1;
        for (slot, name) in names.iter().enumerate() {
            let mut at = Self::hash(name) & mask;
            while table[at] != 0 {
                at = (at + 1) & mask;
            }
            table[at] = u32::try_from(slot + 1).expect("fewer than 2^32 fields");
        }
        Slots { names, table, of_field, types }
    }

    /// FNV-1a: field names are short, and chosen by the view's author, not by the
    /// messages (an unknown name costs a probe, never an entry).
    fn hash(name: &str) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in name.as_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h as usize
    }

    fn slot(&self, name: &str) -> Option<usize> {
        let mask = self.table.len() - 1;
        let mut at = Self::hash(name) & mask;
        loop {
            match self.table[at] {
                0 => return None,
                s if self.names[s as usize - 1] == name => return Some(s as usize - 1),
                _ => at = (at + 1) & mask,
            }
        }
    }
}

impl RowReader {
    /// A reader that accepts rows of `view` with any event time; see
    /// [`RowReader::with_latest_event`].
    pub fn new(defs: &Definitions, view: &FeatureView) -> RowReader {
        let keys = defs.join_keys(view);
        let source = &view.source;
        let feature = |dtype: DType| match dtype {
            DType::Bytes | DType::List(_) => SlotType::Json,
            scalar => SlotType::Scalar(scalar),
        };
        let names = keys
            .iter()
            .map(|k| (k.name.as_str(), SlotType::Key(k.dtype)))
            .chain(std::iter::once((source.timestamp_field.as_str(), SlotType::Time)))
            .chain(source.created_timestamp_field.as_deref().map(|c| (c, SlotType::Time)))
            .chain(view.features.iter().map(|f| (f.name.as_str(), feature(f.dtype))));
        let slots = Slots::new(names);
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
        match self.read_typed(bytes) {
            Some(row) => Ok(row),
            None => self.read_json(bytes),
        }
    }

    /// The typed path: each field's value read straight as what its slot holds (an
    /// int64 feature as an `i64`, an event time as text parsed in place), no JSON value
    /// built. `None` for anything but a good row — not JSON, not an object, a field
    /// missing or of another type, an event time past the horizon — and for a view
    /// with a name read by two fields: [`RowReader::read_json`] then reads it and
    /// says why. The two agree on every row (a differential test holds them to it).
    fn read_typed(&self, bytes: &[u8]) -> Option<ViewRow> {
        let types = self.slots.types.as_deref()?;
        let mut values: Vec<Option<Typed>> = Vec::with_capacity(types.len());
        values.resize_with(types.len(), || None);
        let mut de = serde_json::Deserializer::from_slice(bytes);
        serde::Deserializer::deserialize_map(&mut de, TypedVisitor { slots: &self.slots, types, values: &mut values }).ok()?;
        de.end().ok()?;
        let slots = &self.slots.of_field;
        let mut keys = Vec::with_capacity(self.keys.len());
        for slot in &slots[..self.keys.len()] {
            match values[*slot].take() {
                Some(Typed::Key(k)) => keys.push(k),
                _ => return None,
            }
        }
        let mut at = self.keys.len();
        let time = |at: usize| match values[slots[at]] {
            Some(Typed::Time(t)) => Some(t),
            _ => None,
        };
        let event_ts = time(at)?;
        if self.latest_event.is_some_and(|latest| event_ts > latest) {
            return None;
        }
        let created_ts = match self.view.source.created_timestamp_field {
            Some(_) => {
                at += 1;
                Some(time(at)?)
            }
            None => None,
        };
        let mut row = Vec::with_capacity(self.view.features.len());
        for (f, slot) in self.view.features.iter().zip(&slots[at + 1..]) {
            row.push(match values[*slot].take() {
                None => Value::Null,
                Some(Typed::Value(v)) => v,
                Some(Typed::Json(j)) => from_json(&j, f.dtype)?,
                Some(_) => return None,
            });
        }
        Some(ViewRow { keys, event_ts, created_ts, values: row })
    }

    /// Reads a message into one JSON value per slot, then the row from them: any
    /// message, with the reason when it is not a good row.
    fn read_json(&self, bytes: &[u8]) -> Result<ViewRow, String> {
        let mut values = vec![None; self.slots.names.len()];
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let read = serde::Deserializer::deserialize_any(&mut de, SlotVisitor { slots: &self.slots, values: &mut values });
        match read.and_then(|read| de.end().map(|()| read)) {
            Ok(None) => self.read(|field, _| values[self.slots.of_field[field]].as_ref()),
            Ok(Some(kind)) => Err(format!("not a JSON object (got {kind})")),
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
        self.read(|_, name| get(name))
    }

    /// Reads one row given a lookup of its fields by their position in [`Slots`]'s
    /// order (keys, event time, created time, features) and name.
    fn read<'j>(&self, get: impl Fn(usize, &str) -> Option<&'j Json>) -> Result<ViewRow, String> {
        let mut keys = Vec::with_capacity(self.keys.len());
        for (k, key) in self.keys.iter().enumerate() {
            let v = get(k, &key.name).unwrap_or(&Json::Null);
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
        let time = |at: usize, field: &str| -> Result<i64, String> {
            match get(at, field) {
                None | Some(Json::Null) => Err(format!("`{field}` is missing (every row needs it)")),
                Some(Json::String(s)) => parse_instant(s).map_err(|m| format!("`{field}`: {m}")),
                Some(other) => Err(format!("`{field}` must be RFC 3339 text with a zone, got {}", short(other))),
            }
        };
        let mut at = self.keys.len();
        let event_ts = time(at, &self.view.source.timestamp_field)?;
        if let Some(latest) = self.latest_event {
            check_event_time(&self.view.source.timestamp_field, event_ts, latest)?;
        }
        let created_ts = match &self.view.source.created_timestamp_field {
            Some(c) => {
                at += 1;
                Some(time(at, c)?)
            }
            None => None,
        };
        let mut values = Vec::with_capacity(self.view.features.len());
        for (f, at) in self.view.features.iter().zip(at + 1..) {
            let v = get(at, &f.name).unwrap_or(&Json::Null);
            values.push(from_json(v, f.dtype).ok_or_else(|| format!("feature `{}` must be {}, got {}", f.name, f.dtype, short(v)))?);
        }
        Ok(ViewRow { keys, event_ts, created_ts, values })
    }
}

impl ViewRow {
    /// The online store's key, packed row and expiry for this row.
    pub fn online(&self, project: &str, view: &FeatureView, fingerprint: u64) -> (String, Vec<u8>, Option<i64>) {
        let row = OnlineRow::encode_parts(self.event_ts, self.created_ts.unwrap_or(i64::MIN), fingerprint, &self.values);
        (store_key(project, &view.name, &self.keys), row, expire_at_ms(view, self.event_ts))
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
    // A float column takes any number; an integer only while it is exact.
    let float = |v: &Json| match v {
        Json::Number(n) if n.is_f64() => n.as_f64(),
        Json::Number(n) => n.as_i64().filter(|i| i.unsigned_abs() <= 1 << 53).map(|i| i as f64),
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

/// UTC microseconds as RFC 3339 text with as many fraction digits as it needs
/// (`2026-11-30T12:00:00Z`, `...:00.123Z`); the inverse of [`parse_instant`].
pub fn format_instant(us: i64) -> String {
    let mut out = Vec::with_capacity(32);
    write_rfc3339(&mut out, us);
    String::from_utf8(out).expect("RFC 3339 text is ASCII")
}

/// UTC microseconds as RFC 3339 (`2024-02-29T12:34:56.123456Z`), with no fraction,
/// milliseconds or microseconds as the value needs (chrono's `AutoSi`), without the
/// allocations of a general formatter: the one formatter of instants (the server's
/// answers, the serving log, the CLI, Python all print through it).
pub fn write_rfc3339(out: &mut Vec<u8>, us: i64) {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        // Outside four-digit years: the general formatter.
        let text =
            chrono::DateTime::from_timestamp_micros(us).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)).unwrap_or_default();
        out.extend_from_slice(text.as_bytes());
        return;
    }
    // Written into one stack buffer, two digits at a time, and appended once (an
    // answer of 100 entities writes hundreds of times).
    const PAIRS: &[u8; 200] = b"00010203040506070809101112131415161718192021222324252627282930313233343536373839\
        404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";
    fn two(slot: &mut [u8], n: i64) {
        let i = 2 * n as usize;
        slot[0] = PAIRS[i];
        slot[1] = PAIRS[i + 1];
    }
    let mut buf = *b"0000-00-00T00:00:00.000000Z";
    two(&mut buf[0..2], year / 100);
    two(&mut buf[2..4], year % 100);
    two(&mut buf[5..7], month);
    two(&mut buf[8..10], day);
    two(&mut buf[11..13], sod / 3600);
    two(&mut buf[14..16], sod / 60 % 60);
    two(&mut buf[17..19], sod % 60);
    let len = if micros == 0 {
        buf[19] = b'Z';
        20
    } else if micros % 1000 == 0 {
        let ms = micros / 1000;
        buf[20] = b'0' + (ms / 100) as u8;
        two(&mut buf[21..23], ms % 100);
        buf[23] = b'Z';
        24
    } else {
        two(&mut buf[20..22], micros / 10_000);
        two(&mut buf[22..24], micros / 100 % 100);
        two(&mut buf[24..26], micros % 100);
        27
    };
    out.extend_from_slice(&buf[..len]);
}

/// RFC 3339 text (`T` or a space between date and time) as UTC microseconds. Text
/// without a zone is refused, never guessed.
///
/// # Errors
/// The reason, quoting the text.
pub fn parse_instant(text: &str) -> Result<i64, String> {
    let s = text.trim();
    match chrono::DateTime::parse_from_rfc3339(s).or_else(|_| chrono::DateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f%:z")) {
        Ok(t) => Ok(t.timestamp_micros()),
        Err(_) => {
            let naive = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
                .or_else(|_| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f"))
                .is_ok();
            if naive {
                Err(format!("`{s}` has no time zone; quiver stores UTC instants and never guesses a zone (write e.g. `{s}Z`)"))
            } else {
                Err(format!("`{s}` is not an RFC 3339 timestamp (expected e.g. 2024-01-01T00:00:00Z)"))
            }
        }
    }
}

/// A slot's value read on the typed path.
enum Typed {
    Key(KeyValue),
    Time(i64),
    Value(Value),
    Json(Json),
    /// Not what the slot holds: the row is not good, unless the field comes again.
    Bad,
}

/// Reads a JSON object into typed slots.
struct TypedVisitor<'a> {
    slots: &'a Slots,
    types: &'a [SlotType],
    values: &'a mut [Option<Typed>],
}

impl<'de> serde::de::Visitor<'de> for TypedVisitor<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(slot) = map.next_key_seed(SlotOf(self.slots))? {
            match slot {
                Some(slot) => self.values[slot] = Some(map.next_value_seed(TypedSeed(self.types[slot]))?),
                // As on the JSON path: a value JSON cannot hold refuses the message.
                None => drop(map.next_value::<Json>()?),
            }
        }
        Ok(())
    }
}

/// One field's value as its slot's type.
struct TypedSeed(SlotType);

impl<'de> serde::de::DeserializeSeed<'de> for TypedSeed {
    type Value = Typed;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Typed, D::Error> {
        match self.0 {
            SlotType::Json => Json::deserialize(d).map(Typed::Json),
            _ => d.deserialize_any(self),
        }
    }
}

/// The typed reading of one value, exactly as [`from_json`] and the join-key and
/// event-time readings take the same value as JSON; anything else is [`Typed::Bad`]
/// (read to its end: the same field given again later may still be good).
impl<'de> serde::de::Visitor<'de> for TypedSeed {
    type Value = Typed;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Typed, E> {
        match self.0 {
            SlotType::Scalar(_) => Ok(Typed::Value(Value::Null)),
            _ => Ok(Typed::Bad),
        }
    }
    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Typed, E> {
        match self.0 {
            SlotType::Scalar(DType::Bool) => Ok(Typed::Value(Value::Bool(b))),
            _ => Ok(Typed::Bad),
        }
    }
    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Typed, E> {
        let exact = i.unsigned_abs() <= 1 << 53;
        match self.0 {
            SlotType::Key(KeyType::Int64) => Ok(Typed::Key(KeyValue::Int(i))),
            SlotType::Scalar(DType::Int64) => Ok(Typed::Value(Value::Int64(i))),
            SlotType::Scalar(DType::Int32) => Ok(i32::try_from(i).map_or(Typed::Bad, |i| Typed::Value(Value::Int32(i)))),
            SlotType::Scalar(DType::Float64) if exact => Ok(Typed::Value(Value::Float64(i as f64))),
            SlotType::Scalar(DType::Float32) if exact => Ok(Typed::Value(Value::Float32(i as f64 as f32))),
            _ => Ok(Typed::Bad),
        }
    }
    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Typed, E> {
        match i64::try_from(u) {
            Ok(i) => self.visit_i64(i),
            Err(_) => Ok(Typed::Bad),
        }
    }
    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Typed, E> {
        match self.0 {
            SlotType::Scalar(DType::Float64) => Ok(Typed::Value(Value::Float64(f))),
            SlotType::Scalar(DType::Float32) => Ok(Typed::Value(Value::Float32(f as f32))),
            _ => Ok(Typed::Bad),
        }
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Typed, A::Error> {
        while seq.next_element::<Json>()?.is_some() {}
        Ok(Typed::Bad)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Typed, A::Error> {
        while map.next_entry::<String, Json>()?.is_some() {}
        Ok(Typed::Bad)
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Typed, E> {
        match self.0 {
            SlotType::Key(KeyType::String) if !s.is_empty() => Ok(Typed::Key(KeyValue::Str(s.to_string()))),
            SlotType::Time => Ok(parse_instant(s).map_or(Typed::Bad, Typed::Time)),
            SlotType::Scalar(DType::String) => Ok(Typed::Value(Value::String(s.to_string()))),
            SlotType::Scalar(DType::Timestamp) => Ok(parse_instant(s).map_or(Typed::Bad, |t| Typed::Value(Value::Timestamp(t)))),
            _ => Ok(Typed::Bad),
        }
    }
}

/// Reads a JSON document into [`Slots`]: an object's fields the view reads into their
/// slots (a field given twice: the last one, as in a JSON object), the rest dropped.
/// `Some(kind)` when the document is not an object.
struct SlotVisitor<'a> {
    slots: &'a Slots,
    values: &'a mut [Option<Json>],
}

/// An object's field name as its slot, without copying the name.
struct SlotOf<'a>(&'a Slots);

impl<'de> serde::de::DeserializeSeed<'de> for SlotOf<'_> {
    type Value = Option<usize>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl serde::de::Visitor<'_> for SlotOf<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(self.0.slot(name))
    }
}

impl<'de> serde::de::Visitor<'de> for SlotVisitor<'_> {
    type Value = Option<&'static str>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while let Some(slot) = map.next_key_seed(SlotOf(self.slots))? {
            match slot {
                Some(slot) => self.values[slot] = Some(map.next_value()?),
                // Parsed and dropped, not skipped: a value JSON cannot hold (a number
                // beyond f64, say) refuses the message, as it does when read whole.
                None => drop(map.next_value::<Json>()?),
            }
        }
        Ok(None)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Json>()?.is_some() {}
        Ok(Some("an array"))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Some("null"))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Some("a boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Some("a number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Some("a number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Some("a number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Some("a string"))
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
    use crate::definitions::{Entity, Source};
    use crate::types::Ttl;

    fn defs() -> Definitions {
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

    /// The oracle for [`RowReader::from_slice`]: the whole document parsed into a JSON
    /// value first, then read by field name, as the reader did before it read into slots.
    fn read_through_a_json_object(r: &RowReader, bytes: &[u8]) -> Result<ViewRow, String> {
        match serde_json::from_slice::<Json>(bytes) {
            Ok(Json::Object(map)) => r.from_object(&map),
            Ok(other) => Err(format!(
                "not a JSON object (got {})",
                match other {
                    Json::Null => "null",
                    Json::Bool(_) => "a boolean",
                    Json::Number(_) => "a number",
                    Json::String(_) => "a string",
                    Json::Array(_) => "an array",
                    Json::Object(_) => unreachable!(),
                }
            )),
            Err(e) => Err(format!("not valid JSON: {e}")),
        }
    }

    /// Reading a message into slots against reading it through a JSON object, over
    /// random documents: fields of the view and others, in any order, given twice,
    /// spelled with escapes, of every JSON type; documents that are not objects, cut
    /// short or followed by more; a view whose created time and a feature share a field
    /// name with others. Same row or same error, every time.
    #[test]
    fn reading_into_slots_matches_reading_through_a_json_object() {
        use rand::{Rng, SeedableRng};
        let plain = defs();
        // Two views of trips, timed by `ts` and created at `created`: in the first a
        // feature is named `created` too (two fields read one slot: no typed path).
        let trips = |name: &str, features: &[(&str, DType)]| {
            let view = features.iter().fold(
                FeatureView::new(name)
                    .with_entity("trip")
                    .with_source(Source::new().with_timestamp_field("ts").with_created_timestamp_field("created")),
                |view, (f, dtype)| view.with_feature(*f, *dtype),
            );
            Definitions::default()
                .with_entity(Entity::new("trip").with_join_key("driver_id", KeyType::Int64).with_join_key("trip_id", KeyType::String))
                .with_feature_view(view)
        };
        let ids = ("ids", DType::List(ListElement::Int64));
        let shared = trips("trips", &[("created", DType::Timestamp), ("name", DType::String), ("ok", DType::Bool), ids]);
        let typed = trips(
            "typed",
            &[
                ("name", DType::String),
                ("ok", DType::Bool),
                ("when", DType::Timestamp),
                ("f32", DType::Float32),
                ("i32", DType::Int32),
                ids,
            ],
        );
        let readers = [
            RowReader::new(&plain, &plain.feature_views[0]),
            RowReader::new(&shared, &shared.feature_views[0]),
            RowReader::new(&typed, &typed.feature_views[0]).with_latest_event(1_709_290_000_000_000),
        ];
        // Only a view with a name read by two fields goes without the typed path.
        assert!(readers[0].slots.types.is_some() && readers[1].slots.types.is_none() && readers[2].slots.types.is_some());
        let names = [
            "driver_id",
            "\\u0064river_id",
            "trip_id",
            "event_timestamp",
            "ts",
            "created",
            "rate",
            "trips",
            "small",
            "emb",
            "name",
            "ok",
            "ids",
            "extra",
            "",
            "Driver_id",
            "when",
            "f32",
            "i32",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        /// A random JSON value.
        fn value(rng: &mut rand::rngs::StdRng, depth: u32) -> String {
            match rng.random_range(0..16) {
                0 => "null".into(),
                1 => "true".into(),
                2 => format!("{}", rng.random_range(-5i64..5)),
                3 => format!("{}", rng.random::<i64>()),
                4 => format!("{}", rng.random::<u64>()),
                5 => format!("{:?}", rng.random_range(-1e3..1e3f64)),
                6 => "1e400".into(),
                7 => "\"2024-01-01T00:00:00Z\"".into(),
                8 => "\"2024-01-01T00:00:00.5+02:00\"".into(),
                9 => "\"2024-01-01 00:00\"".into(),
                10 => "\"\"".into(),
                11 => "\"x\\u00e9\\n\"".into(),
                12 if depth < 3 => {
                    let n = rng.random_range(0..4);
                    format!("[{}]", (0..n).map(|_| value(rng, depth + 1)).collect::<Vec<_>>().join(","))
                }
                13 if depth < 3 => format!("{{\"a\": {}}}", value(rng, depth + 1)),
                14 => "9007199254740993".into(),
                _ => "2.5".into(),
            }
        }
        let mut read = 0;
        for case in 0..40_000 {
            let fields = rng.random_range(0..12);
            // Mostly documents that start with every field either view requires.
            let mut doc = String::from(match rng.random_range(0..3) {
                0 => "{",
                _ => {
                    r#"{"driver_id": 1, "trip_id": "t", "event_timestamp": "2024-03-01T10:00:00Z", "ts": "2024-03-01T10:00:00Z", "created": "2024-03-01T10:00:01Z""#
                }
            });
            for _ in 0..fields {
                if doc.len() > 1 {
                    doc.push(',');
                }
                let name = names[rng.random_range(0..names.len())];
                // Mostly well-typed values for the fields the view reads, so most rows read.
                let v = match (name, rng.random_range(0..6)) {
                    (_, 0) => value(&mut rng, 0),
                    ("driver_id" | "\\u0064river_id", _) => format!("{}", rng.random_range(0..100)),
                    // Past the typed view's horizon (2024-03-01T10:46:40Z), sometimes.
                    ("ts", 1) => "\"2024-03-01T11:00:00Z\"".into(),
                    ("event_timestamp" | "ts" | "created", _) => "\"2024-03-01T10:00:00Z\"".into(),
                    ("trip_id" | "name", _) => "\"t1\"".into(),
                    ("when", _) => "\"2024-03-01T10:00:00.25-01:00\"".into(),
                    ("ok", _) => "false".into(),
                    ("f32" | "i32", _) => ["-0", "0.1", "7", "-2147483648", "2147483648", "1e38", "1e39"][rng.random_range(0..7)].into(),
                    ("emb" | "ids", _) => "[1, 2]".into(),
                    _ => value(&mut rng, 0),
                };
                doc.push_str(&format!(" \"{name}\" : {v}"));
            }
            doc.push('}');
            let mut bytes = doc.into_bytes();
            match rng.random_range(0..12) {
                0 => bytes.truncate(rng.random_range(0..=bytes.len())),
                1 => bytes.extend_from_slice(b" x"),
                2 => bytes.extend_from_slice(b" \n "),
                3 => bytes = value(&mut rng, 0).into_bytes(),
                _ => {}
            }
            for r in &readers {
                let (fast, oracle) = (r.from_slice(&bytes), read_through_a_json_object(r, &bytes));
                assert_eq!(fast, oracle, "case {case}: {}", String::from_utf8_lossy(&bytes));
                if r.slots.types.is_some() {
                    // The typed path reads every good row itself, and only those.
                    assert_eq!(r.read_typed(&bytes).ok_or(()), oracle.map_err(|_| ()), "case {case}: {}", String::from_utf8_lossy(&bytes));
                }
                read += usize::from(fast.is_ok());
            }
        }
        // The documents exercise both outcomes.
        assert!(read > 12_000 && read < 108_000, "{read} of 120,000 read");
    }

    #[test]
    fn timestamps_print_as_rfc3339() {
        assert_eq!(super::format_instant(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::format_instant(1_704_067_200_000_000), "2024-01-01T00:00:00Z");
        assert_eq!(super::format_instant(1_709_210_096_123_456), "2024-02-29T12:34:56.123456Z");
        assert_eq!(super::format_instant(-1), "1969-12-31T23:59:59.999999Z");
        assert_eq!(super::format_instant(1_709_210_096_120_000), "2024-02-29T12:34:56.120Z");
    }

    /// The hand-written formatter against chrono's, over random instants from year 1 to
    /// 9999 and beyond (where it hands over to chrono), at every sub-second precision.
    #[test]
    fn rfc3339_matches_chrono() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let chrono = |us: i64| chrono::DateTime::from_timestamp_micros(us).unwrap().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        for _ in 0..200_000 {
            let mut us = rng.random_range(-62_135_596_800_000_000..300_000_000_000_000_000i64);
            match rng.random_range(0..3) {
                0 => us -= us.rem_euclid(1_000_000),
                1 => us -= us.rem_euclid(1_000),
                _ => {}
            }
            assert_eq!(super::format_instant(us), chrono(us), "{us}");
        }
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
