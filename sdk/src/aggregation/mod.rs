//! Windowed aggregations (docs/aggregations.md): their definitions and the window rule.
//!
//! A view with `aggregations` is an event log. For a request at `t`, an aggregation
//! with window `w` and hop `h` covers the events with `floor(t - w, h) <= ts <= t`: the
//! tail moves in steps of `h`, the head is exact (Chronon's sawtooth window).
//!
//! The arithmetic both paths use lives in `quiver_runtime`: `state` (the mergeable
//! partial aggregate and the one place a value is finished from it) and `record` (one
//! entity's online record and the lookup's answer from it).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::types::{DType, ListElement, Ttl};

/// An aggregation function (docs/aggregations.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggFunction {
    Count,
    Sum,
    Avg,
    Stddev,
    Min,
    Max,
    Last,
    LastK,
}

/// Every function's spelling, for error messages.
pub const FUNCTION_NAMES: &str = "count, sum, avg, stddev, min, max, last, last_k";

impl AggFunction {
    pub fn as_str(&self) -> &'static str {
        match self {
            AggFunction::Count => "count",
            AggFunction::Sum => "sum",
            AggFunction::Avg => "avg",
            AggFunction::Stddev => "stddev",
            AggFunction::Min => "min",
            AggFunction::Max => "max",
            AggFunction::Last => "last",
            AggFunction::LastK => "last_k",
        }
    }

    /// Whether the function needs a numeric (int32/int64/float32/float64) column.
    pub fn is_numeric(&self) -> bool {
        matches!(self, AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev | AggFunction::Min | AggFunction::Max)
    }
}

impl fmt::Display for AggFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AggFunction {
    type Err = String;

    /// Parses a function name, case-insensitively (`mean` = avg, `std` = stddev,
    /// `lastk` = last_k).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "count" => AggFunction::Count,
            "sum" => AggFunction::Sum,
            "avg" | "mean" => AggFunction::Avg,
            "stddev" | "std" => AggFunction::Stddev,
            "min" => AggFunction::Min,
            "max" => AggFunction::Max,
            "last" => AggFunction::Last,
            "last_k" | "lastk" => AggFunction::LastK,
            _ => return Err(format!("unknown function `{s}` (expected one of {FUNCTION_NAMES})")),
        })
    }
}

impl Serialize for AggFunction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AggFunction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The largest `k` of `last_k`.
pub const MAX_K: u32 = 1000;

/// One windowed aggregation of an event log: a served feature named `name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Aggregation {
    pub name: String,
    pub function: AggFunction,
    /// The event column it reads (one of the view's `features`).
    pub column: String,
    /// Feast spells it `time_window`.
    #[serde(alias = "time_window")]
    pub window: Ttl,
    /// The step the window's tail moves in; `None`: the default for the window
    /// ([`default_hop`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hop: Option<Ttl>,
    /// How many values `last_k` keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// The hop of a window that names none: 1d for windows of 12d or more, 1h for 12h or
/// more, else 5m.
pub fn default_hop(window: Ttl) -> Ttl {
    let secs = window.secs();
    Ttl::from_secs(if secs >= 12 * 86_400 {
        86_400
    } else if secs >= 12 * 3600 {
        3600
    } else {
        300
    })
}

impl Aggregation {
    /// `function` of `column` over `window`, with the default hop.
    ///
    /// ```
    /// use quiver_sdk::aggregation::{AggFunction, Aggregation};
    /// use quiver_sdk::Ttl;
    /// let a = Aggregation::new("fare_sum_1h", AggFunction::Sum, "fare", Ttl::parse("1h").unwrap());
    /// assert_eq!(a.hop_us(), 300_000_000);
    /// // The window at 10:07 starts at 09:05 (the tail moves in 5-minute steps).
    /// let t = 10 * 3_600_000_000 + 7 * 60_000_000;
    /// assert_eq!(a.tail(t), 9 * 3_600_000_000 + 5 * 60_000_000);
    /// ```
    pub fn new(name: impl Into<String>, function: AggFunction, column: impl Into<String>, window: Ttl) -> Self {
        Aggregation { name: name.into(), function, column: column.into(), window, hop: None, k: None, description: String::new() }
    }

    #[must_use]
    pub fn with_hop(mut self, hop: Ttl) -> Self {
        self.hop = Some(hop);
        self
    }

    #[must_use]
    pub fn with_k(mut self, k: u32) -> Self {
        self.k = Some(k);
        self
    }

    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// The hop, given or default.
    pub fn hop(&self) -> Ttl {
        self.hop.unwrap_or_else(|| default_hop(self.window))
    }

    /// The window in microseconds.
    pub fn window_us(&self) -> i64 {
        self.window.micros()
    }

    /// The hop in microseconds (at least 1).
    pub fn hop_us(&self) -> i64 {
        self.hop().micros().max(1)
    }

    /// How many values the function keeps of the latest events: `k` for last_k, 1 for
    /// last, 0 for the others.
    pub fn keep(&self) -> usize {
        match self.function {
            AggFunction::LastK => self.k.unwrap_or(1) as usize,
            AggFunction::Last => 1,
            _ => 0,
        }
    }

    /// The first event time the window at `t` (UTC microseconds) covers:
    /// `floor(t - w, h)`, the largest multiple of the hop not after `t - w`.
    pub fn tail(&self, t: i64) -> i64 {
        let x = t.saturating_sub(self.window_us());
        x.saturating_sub(x.rem_euclid(self.hop_us()))
    }

    /// The type of the served value when the column has type `column`; `None` when the
    /// function cannot read such a column (validation refuses it).
    pub fn output_dtype(&self, column: DType) -> Option<DType> {
        let numeric = matches!(column, DType::Int32 | DType::Int64 | DType::Float32 | DType::Float64);
        let integer = matches!(column, DType::Int32 | DType::Int64);
        Some(match self.function {
            AggFunction::Count => DType::Int64,
            _ if self.function.is_numeric() && !numeric => return None,
            AggFunction::Sum if integer => DType::Int64,
            AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev => DType::Float64,
            AggFunction::Min | AggFunction::Max | AggFunction::Last => column,
            AggFunction::LastK => DType::List(list_element(column)?),
        })
    }
}

/// The list element `last_k` of a `column` yields: int32 and int64 as int64, floats as
/// themselves, strings; `None` for types without a list type (bool, bytes, timestamp,
/// lists).
pub fn list_element(column: DType) -> Option<ListElement> {
    Some(match column {
        DType::Int32 | DType::Int64 => ListElement::Int64,
        DType::Float32 => ListElement::Float32,
        DType::Float64 => ListElement::Float64,
        DType::String => ListElement::String,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_hops_follow_the_window() {
        let hop = |w: &str| default_hop(Ttl::parse(w).unwrap()).to_string();
        assert_eq!(hop("30m"), "5m");
        assert_eq!(hop("11h"), "5m");
        assert_eq!(hop("12h"), "1h");
        assert_eq!(hop("7d"), "1h");
        assert_eq!(hop("12d"), "1d");
    }

    #[test]
    fn the_tail_is_a_multiple_of_the_hop_at_or_before_t_minus_w() {
        let a = Aggregation::new("x", AggFunction::Count, "c", Ttl::from_secs(3600)).with_hop(Ttl::from_secs(600));
        let (w, h) = (3_600_000_000i64, 600_000_000i64);
        for t in [0, 1, h - 1, h, w, w + 1, w + h, -1, -w - 1, 1_700_000_000_123_456] {
            let tail = a.tail(t);
            assert_eq!(tail.rem_euclid(h), 0, "{t}");
            assert!(tail <= t - w && t - w < tail + h, "{t}: {tail}");
        }
    }

    #[test]
    fn output_types() {
        let a = |f| Aggregation::new("x", f, "c", Ttl::from_secs(60));
        assert_eq!(a(AggFunction::Sum).output_dtype(DType::Int32), Some(DType::Int64));
        assert_eq!(a(AggFunction::Sum).output_dtype(DType::Float32), Some(DType::Float64));
        assert_eq!(a(AggFunction::Min).output_dtype(DType::Float32), Some(DType::Float32));
        assert_eq!(a(AggFunction::Count).output_dtype(DType::Bytes), Some(DType::Int64));
        assert_eq!(a(AggFunction::Avg).output_dtype(DType::String), None);
        assert_eq!(a(AggFunction::LastK).output_dtype(DType::Int32), Some(DType::List(ListElement::Int64)));
        assert_eq!(a(AggFunction::LastK).output_dtype(DType::Bool), None);
        assert_eq!(a(AggFunction::Last).output_dtype(DType::Bool), Some(DType::Bool));
    }
}
