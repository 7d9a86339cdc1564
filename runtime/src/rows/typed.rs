//! A message read straight into its view's typed slots: each field's value as what its
//! slot holds (an int64 feature as an `i64`, an event time as text parsed in place),
//! no JSON value per field. Only good rows are read this way; anything else is read
//! again whole by [`RowReader::from_slice`], which names what is wrong.

use serde::Deserialize;
use serde_json::Value as Json;

use super::{RowReader, ViewRow, from_json, non_finite};
use crate::encoding::{KeyValue, Value};
use quiver_sdk::definitions::{FeatureView, JoinKey};
use quiver_sdk::types::parse_instant;
use quiver_sdk::types::{DType, KeyType};

/// The fields a row is read from, each given a slot: the join keys, the event time, the
/// created time (where the view has one) and the features, in that order, a name read
/// by two of them (a feature named as a key, say) sharing one slot. A message is read
/// into one value per slot, dropping every field the view does not know, instead of
/// into a JSON object of all its fields: a stream's messages are read this way, and
/// building the object (a map, a string per field name) took most of the reading.
#[derive(Debug, Clone)]
pub(super) struct Slots {
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
    /// The slots of a view whose join keys are `keys`.
    pub(super) fn of_view(view: &FeatureView, keys: &[JoinKey]) -> Slots {
        let source = &view.source;
        let feature = |dtype: DType| match dtype {
            DType::Bytes | DType::List(_) => SlotType::Json,
            scalar => SlotType::Scalar(scalar),
        };
        let fields = keys
            .iter()
            .map(|k| (k.name.as_str(), SlotType::Key(k.dtype)))
            .chain(std::iter::once((source.timestamp_field.as_str(), SlotType::Time)))
            .chain(source.created_timestamp_field.as_deref().map(|c| (c, SlotType::Time)))
            .chain(view.features.iter().map(|f| (f.name.as_str(), feature(f.dtype))));
        Slots::new(fields)
    }

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
    /// The typed path: each field's value read straight as what its slot holds (an
    /// int64 feature as an `i64`, an event time as text parsed in place), no JSON value
    /// built. `None` for anything but a good row — not JSON, not an object, a field
    /// missing or of another type, an event time past the horizon — and for a view
    /// with a name read by two fields: [`RowReader::from_slice`] then reads the
    /// message whole and says why. The two agree on every row (a differential test
    /// holds them to it).
    pub(super) fn read_typed(&self, bytes: &[u8]) -> Option<ViewRow> {
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
                // As when read whole: a value JSON cannot hold refuses the message.
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
            // NaN and the infinities as the server answers them (`"NaN"`, ...).
            SlotType::Scalar(DType::Float64) => Ok(non_finite(s).map_or(Typed::Bad, |f| Typed::Value(Value::Float64(f)))),
            SlotType::Scalar(DType::Float32) => Ok(non_finite(s).map_or(Typed::Bad, |f| Typed::Value(Value::Float32(f as f32)))),
            _ => Ok(Typed::Bad),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_sdk::definitions::{Definitions, Entity, FeatureView, Source};
    use quiver_sdk::types::ListElement;

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
        let plain = super::super::tests::defs();
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
            match rng.random_range(0..17) {
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
                15 => ["\"NaN\"", "\"Infinity\"", "\"-Infinity\"", "\"nan\"", "\"-inf\""][rng.random_range(0..5)].into(),
                _ => "2.5".into(),
            }
        }
        let mut read = 0;
        let mut non_finite_read = 0;
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
                    ("f32" | "i32", _) => ["-0", "0.1", "7", "-2147483648", "2147483648", "1e38", "1e39", "\"NaN\"", "\"-Infinity\""]
                        [rng.random_range(0..9)]
                    .into(),
                    ("rate", _) => ["0.5", "\"NaN\"", "\"Infinity\"", "\"-Infinity\"", "\"Nan\""][rng.random_range(0..5)].into(),
                    ("emb", _) => ["[1, 2]", "[\"NaN\", 0.5]", "[\"Infinity\", \"-Infinity\"]"][rng.random_range(0..3)].into(),
                    ("ids", _) => "[1, 2]".into(),
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
                // Compared as Debug text, which tells every float apart and has a NaN
                // equal to itself (`==` has it unequal).
                assert_eq!(format!("{fast:?}"), format!("{oracle:?}"), "case {case}: {}", String::from_utf8_lossy(&bytes));
                if r.slots.types.is_some() {
                    // The typed path reads every good row itself, and only those.
                    let (typed, oracle) = (r.read_typed(&bytes).ok_or(()), oracle.map_err(|_| ()));
                    assert_eq!(format!("{typed:?}"), format!("{oracle:?}"), "case {case}: {}", String::from_utf8_lossy(&bytes));
                }
                non_finite_read += usize::from(fast.as_ref().is_ok_and(|row| {
                    row.values.iter().any(|v| match v {
                        Value::Float32(x) => !x.is_finite(),
                        Value::Float64(x) => !x.is_finite(),
                        Value::ListFloat32(x) => x.iter().any(|x| !x.is_finite()),
                        _ => false,
                    })
                }));
                read += usize::from(fast.is_ok());
            }
        }
        // The documents exercise both outcomes.
        assert!(read > 12_000 && read < 108_000, "{read} of 120,000 read");
        // NaN and the infinities, in their JSON text, among the rows read.
        assert!(non_finite_read > 1_000, "{non_finite_read} rows with a NaN or an infinity read");
    }
}
