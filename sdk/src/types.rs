//! Value types of features and join keys, and feature-view TTLs.
//!
//! Types are written as lowercase strings everywhere users see them (`int64`,
//! `list<float32>`), and serialised the same way in the registry, so a registry file
//! reads like the YAML it came from.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The element type of a list feature (docs/concepts.md: lists of int64/float32/float64/string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListElement {
    Int64,
    Float32,
    Float64,
    String,
}

/// The type of a feature value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Int32,
    Int64,
    Float32,
    Float64,
    Bool,
    String,
    Bytes,
    /// A UTC instant with microsecond precision.
    Timestamp,
    /// A list, e.g. `list<float32>` for embeddings.
    List(ListElement),
}

/// The spelling of every accepted dtype, for error messages.
pub const DTYPE_NAMES: &str = "int32, int64, float32, float64, bool, string, bytes, timestamp, \
     list<int64>, list<float32>, list<float64>, list<string>";

/// The Arrow type of a UTC instant: microseconds, zone `UTC`.
pub fn timestamp_arrow_type() -> arrow::datatypes::DataType {
    arrow::datatypes::DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into()))
}

impl DType {
    /// The Arrow type a value of this type is stored and computed as, everywhere.
    pub fn arrow_type(&self) -> arrow::datatypes::DataType {
        use arrow::datatypes::DataType;
        let element = |e: &ListElement| match e {
            ListElement::Int64 => DataType::Int64,
            ListElement::Float32 => DataType::Float32,
            ListElement::Float64 => DataType::Float64,
            ListElement::String => DataType::Utf8,
        };
        match self {
            DType::Int32 => DataType::Int32,
            DType::Int64 => DataType::Int64,
            DType::Float32 => DataType::Float32,
            DType::Float64 => DataType::Float64,
            DType::Bool => DataType::Boolean,
            DType::String => DataType::Utf8,
            DType::Bytes => DataType::Binary,
            DType::Timestamp => timestamp_arrow_type(),
            DType::List(e) => DataType::new_list(element(e), true),
        }
    }

    /// The canonical spelling (`list<float32>`).
    pub fn as_str(&self) -> &'static str {
        match self {
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::Bool => "bool",
            DType::String => "string",
            DType::Bytes => "bytes",
            DType::Timestamp => "timestamp",
            DType::List(ListElement::Int64) => "list<int64>",
            DType::List(ListElement::Float32) => "list<float32>",
            DType::List(ListElement::Float64) => "list<float64>",
            DType::List(ListElement::String) => "list<string>",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of parsing a dtype or key type: the text that did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownType(pub String);

impl FromStr for DType {
    type Err = UnknownType;

    /// Parses a dtype. Spelling is case-insensitive and ignores blanks, and a few
    /// common aliases are accepted (`float` = float32, `double` = float64,
    /// `int` = int64, `str` = string, `array<T>` = `list<T>`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm: String = s.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
        let scalar = |t: &str| -> Option<DType> {
            Some(match t {
                "int32" => DType::Int32,
                "int64" | "int" => DType::Int64,
                "float32" | "float" => DType::Float32,
                "float64" | "double" => DType::Float64,
                "bool" | "boolean" => DType::Bool,
                "string" | "str" => DType::String,
                "bytes" | "binary" => DType::Bytes,
                "timestamp" | "unix_timestamp" | "unixtimestamp" => DType::Timestamp,
                _ => return None,
            })
        };
        let inner = norm.strip_prefix("list<").or_else(|| norm.strip_prefix("array<")).and_then(|rest| rest.strip_suffix('>'));
        let parsed = match inner {
            Some(inner) => match scalar(inner) {
                Some(DType::Int64) => Some(DType::List(ListElement::Int64)),
                Some(DType::Float32) => Some(DType::List(ListElement::Float32)),
                Some(DType::Float64) => Some(DType::List(ListElement::Float64)),
                Some(DType::String) => Some(DType::List(ListElement::String)),
                _ => None,
            },
            None => scalar(&norm),
        };
        parsed.ok_or_else(|| UnknownType(s.to_string()))
    }
}

impl Serialize for DType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for DType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|_| serde::de::Error::custom(format!("unknown dtype `{s}` (expected one of {DTYPE_NAMES})")))
    }
}

/// The type of a join key: docs/concepts.md allows `int64` and `string`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    Int64,
    String,
}

impl KeyType {
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyType::Int64 => "int64",
            KeyType::String => "string",
        }
    }

    /// The same type as a feature dtype.
    pub fn dtype(&self) -> DType {
        match self {
            KeyType::Int64 => DType::Int64,
            KeyType::String => DType::String,
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KeyType {
    type Err = UnknownType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse::<DType>() {
            Ok(DType::Int64) => Ok(KeyType::Int64),
            Ok(DType::String) => Ok(KeyType::String),
            _ => Err(UnknownType(s.to_string())),
        }
    }
}

impl Serialize for KeyType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for KeyType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|_| serde::de::Error::custom(format!("unknown join key dtype `{s}` (expected int64 or string)")))
    }
}

/// A feature view's time to live: how far back from a spine timestamp a feature row is
/// still a candidate (docs/offline.md). `Ttl::UNBOUNDED` (written as absent or `0`) means no
/// lower bound. Whole seconds only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ttl(u64);

/// Why a TTL did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTtl {
    pub text: String,
    pub reason: &'static str,
}

impl Ttl {
    /// No lower bound.
    pub const UNBOUNDED: Ttl = Ttl(0);

    pub fn from_secs(secs: u64) -> Ttl {
        Ttl(secs)
    }

    /// `None` when unbounded.
    pub fn as_duration(&self) -> Option<Duration> {
        (self.0 > 0).then(|| Duration::from_secs(self.0))
    }

    /// Seconds; 0 when unbounded.
    pub fn secs(&self) -> u64 {
        self.0
    }

    pub fn is_unbounded(&self) -> bool {
        self.0 == 0
    }

    /// Parses `90s`, `15m`, `2h`, `7d`, `1h30m`, a bare number of seconds, or `0`.
    ///
    /// # Errors
    /// A [`BadTtl`] naming the text and what was wrong with it.
    ///
    /// ```
    /// use quiver_sdk::Ttl;
    /// assert_eq!(Ttl::parse("1h30m").unwrap().secs(), 5400);
    /// assert!(Ttl::parse("0").unwrap().is_unbounded());
    /// assert!(Ttl::parse("2 weeks").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Ttl, BadTtl> {
        let bad = |reason| BadTtl { text: text.to_string(), reason };
        let s = text.trim();
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s.starts_with('-') {
            return Err(bad("negative"));
        }
        if s.chars().all(|c| c.is_ascii_digit()) {
            return s.parse().map(Ttl).map_err(|_| bad("too large"));
        }
        let mut total: u64 = 0;
        let mut digits = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return Err(bad("expected a number followed by s, m, h or d")),
            };
            if digits.is_empty() {
                return Err(bad("expected a number before each unit"));
            }
            let n: u64 = digits.parse().map_err(|_| bad("too large"))?;
            digits.clear();
            total = n.checked_mul(unit).and_then(|v| total.checked_add(v)).ok_or_else(|| bad("too large"))?;
        }
        if !digits.is_empty() {
            return Err(bad("a number without a unit (s, m, h or d) at the end"));
        }
        Ok(Ttl(total))
    }
}

impl fmt::Display for Ttl {
    /// The shortest spelling with the largest units: `2h`, `1h30m`, `0` for unbounded.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0");
        }
        let mut rest = self.0;
        for (unit, name) in [(86_400, 'd'), (3600, 'h'), (60, 'm'), (1, 's')] {
            if rest >= unit {
                write!(f, "{}{}", rest / unit, name)?;
                rest %= unit;
            }
        }
        Ok(())
    }
}

impl Serialize for Ttl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Ttl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Ttl(s)),
            Raw::Text(t) => Ttl::parse(&t).map_err(|e| serde::de::Error::custom(format!("bad ttl `{}`: {}", e.text, e.reason))),
        }
    }
}

/// A point in time: UTC microseconds since the Unix epoch, the one unit of time in
/// Quiver (Delta timestamps, the packed row's header, every clock). Operations and the
/// records crossing crates take it, so a time is never confused with another number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// Before every time.
    pub const MIN: Timestamp = Timestamp(i64::MIN);

    /// The wall clock.
    pub fn now() -> Timestamp {
        Timestamp(chrono::Utc::now().timestamp_micros())
    }

    /// UTC microseconds since the epoch.
    pub fn micros(self) -> i64 {
        self.0
    }
}

impl From<chrono::DateTime<chrono::Utc>> for Timestamp {
    fn from(t: chrono::DateTime<chrono::Utc>) -> Timestamp {
        Timestamp(t.timestamp_micros())
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match chrono::DateTime::from_timestamp_micros(self.0) {
            Some(t) => write!(f, "{}", t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
            None => write!(f, "{} us", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_round_trip_through_their_spelling() {
        for name in DTYPE_NAMES.split(", ") {
            let t: DType = name.parse().unwrap();
            assert_eq!(t.as_str(), name);
        }
        assert_eq!("Array<Float32>".parse::<DType>().unwrap(), DType::List(ListElement::Float32));
        assert_eq!("double".parse::<DType>().unwrap(), DType::Float64);
        assert!("list<bool>".parse::<DType>().is_err());
        assert!("list<list<int64>>".parse::<DType>().is_err());
        assert!("flaot64".parse::<DType>().is_err());
    }

    #[test]
    fn key_types_are_int64_or_string_only() {
        assert_eq!("int64".parse::<KeyType>().unwrap(), KeyType::Int64);
        assert_eq!("string".parse::<KeyType>().unwrap(), KeyType::String);
        assert!("float64".parse::<KeyType>().is_err());
        assert!("int32".parse::<KeyType>().is_err());
    }

    #[test]
    fn ttls_parse_and_print() {
        let cases = [("30s", 30), ("15m", 900), ("2h", 7200), ("7d", 604_800), ("1h30m", 5400), ("3600", 3600), ("0", 0)];
        for (text, secs) in cases {
            assert_eq!(Ttl::parse(text).unwrap().secs(), secs, "{text}");
        }
        assert_eq!(Ttl::from_secs(5400).to_string(), "1h30m");
        assert_eq!(Ttl::from_secs(172_800).to_string(), "2d");
        assert_eq!(Ttl::from_secs(0).to_string(), "0");
        for bad in ["", "-1h", "2w", "h", "1h30", "two hours"] {
            assert!(Ttl::parse(bad).is_err(), "{bad} should not parse");
        }
    }
}
