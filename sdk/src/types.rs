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

    /// Microseconds, as times are kept (saturating); 0 when unbounded.
    pub fn micros(&self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX).saturating_mul(1_000_000)
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
            Some(_) => f.write_str(&format_instant(self.0)),
            None => write!(f, "{} us", self.0),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_print_as_rfc3339() {
        assert_eq!(format_instant(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_instant(1_704_067_200_000_000), "2024-01-01T00:00:00Z");
        assert_eq!(format_instant(1_709_210_096_123_456), "2024-02-29T12:34:56.123456Z");
        assert_eq!(format_instant(-1), "1969-12-31T23:59:59.999999Z");
        assert_eq!(format_instant(1_709_210_096_120_000), "2024-02-29T12:34:56.120Z");
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
            assert_eq!(format_instant(us), chrono(us), "{us}");
        }
    }

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
