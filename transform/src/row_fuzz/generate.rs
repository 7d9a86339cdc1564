//! The fuzzer's generator: random well-typed expressions from the language's grammar,
//! recording the functions and operators they use, and rows of edge values.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::ListArray;
use arrow::datatypes::{DataType, Field, Float64Type, TimeUnit};
use datafusion::common::ScalarValue;
use rand::Rng;
use rand::rngs::StdRng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum T {
    Int,
    Float,
    Str,
    Bool,
    Time,
    List,
}

pub(super) const TYPES: [T; 6] = [T::Int, T::Float, T::Str, T::Bool, T::Time, T::List];

pub(super) fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

pub(super) fn list() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true)))
}

/// The input columns: name, type, what the generator reads it as.
pub(super) fn inputs() -> Vec<(&'static str, DataType, T)> {
    vec![
        ("i", DataType::Int64, T::Int),
        ("j", DataType::Int64, T::Int),
        ("n", DataType::Int32, T::Int),
        ("f", DataType::Float64, T::Float),
        ("g", DataType::Float64, T::Float),
        ("h", DataType::Float32, T::Float),
        ("s", DataType::Utf8, T::Str),
        ("u", DataType::Utf8, T::Str),
        ("b", DataType::Boolean, T::Bool),
        ("t", ts(), T::Time),
        ("r", ts(), T::Time),
        ("l", list(), T::List),
        ("m", list(), T::List),
    ]
}

pub(super) fn declared(t: T) -> DataType {
    match t {
        T::Int => DataType::Int64,
        T::Float => DataType::Float64,
        T::Str => DataType::Utf8,
        T::Bool => DataType::Boolean,
        T::Time => ts(),
        T::List => list(),
    }
}

pub(super) const INT_LITERALS: &[&str] =
    &["0", "1", "-1", "2", "7", "-7", "3", "10", "9223372036854775807", "-9223372036854775807", "2147483647", "-2147483648"];
pub(super) const FLOAT_LITERALS: &[&str] = &[
    "0.0",
    "-0.0",
    "1.5",
    "-2.5",
    "0.1",
    "0.5",
    "2.675",
    "1e308",
    "-1e308",
    "1e-310",
    "CAST('NaN' AS DOUBLE)",
    "CAST('inf' AS DOUBLE)",
    "CAST('-inf' AS DOUBLE)",
];
pub(super) const STRINGS: &[&str] =
    &["", "a", "ß", "İ", "ΣΑΣ", "Straße", "ﬃ", "ǅ", "a_b%c", "it's", "😀x", "123", "-7", "1e3", "NaN", " x ", "abcdefghij"];
pub(super) const PATTERNS: &[&str] = &["a%", "%", "_", "%ß%", "a\\_b%", "a\\%", "_b%", "%x", "", "%a_b%c%", "Σ%", "\\\\"];
pub(super) const PARTS: &[&str] =
    &["year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond", "dow", "doy", "epoch"];

pub(super) fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Random expressions of a type, recording the functions and operators they use.
pub(super) struct Gen {
    pub(super) rng: StdRng,
    pub(super) used: BTreeSet<&'static str>,
}

impl Gen {
    pub(super) fn pick<'a, X>(&mut self, xs: &'a [X]) -> &'a X {
        &xs[self.rng.random_range(0..xs.len())]
    }

    pub(super) fn leaf(&mut self, t: T) -> String {
        let columns: Vec<&str> = inputs().into_iter().filter(|c| c.2 == t).map(|c| c.0).collect();
        if self.rng.random_bool(0.6) || t == T::Time {
            return (*self.pick(&columns)).to_string();
        }
        if self.rng.random_bool(0.05) {
            self.used.insert("CAST");
            return format!("CAST(NULL AS {})", sql_type(t));
        }
        match t {
            T::Int => (*self.pick(INT_LITERALS)).to_string(),
            T::Float => (*self.pick(FLOAT_LITERALS)).to_string(),
            T::Str => quoted(self.pick::<&str>(STRINGS)),
            T::Bool => (*self.pick(&["TRUE", "FALSE"])).to_string(),
            T::Time => unreachable!(),
            T::List => {
                self.used.insert("make_array");
                let n = self.rng.random_range(1..4);
                let items: Vec<String> = (0..n).map(|_| self.leaf(T::Float)).collect();
                format!("[{}]", items.join(", "))
            }
        }
    }

    pub(super) fn expr(&mut self, t: T, depth: usize) -> String {
        if depth == 0 || self.rng.random_bool(0.25) {
            return self.leaf(t);
        }
        let d = depth - 1;
        // The forms every type has.
        match self.rng.random_range(0..14) {
            0 => {
                self.used.insert("CASE");
                let (w, a, b) = (self.expr(T::Bool, d), self.expr(t, d), self.expr(t, d));
                return if self.rng.random_bool(0.3) {
                    format!("CASE WHEN {w} THEN {a} END")
                } else {
                    format!("CASE WHEN {w} THEN {a} ELSE {b} END")
                };
            }
            1 if t != T::List => {
                self.used.insert("CASE");
                let k = *self.pick(&[T::Int, T::Str, T::Float]);
                let (base, v1, v2) = (self.expr(k, d), self.leaf(k), self.expr(k, d));
                let (a, b, c) = (self.expr(t, d), self.expr(t, d), self.expr(t, d));
                return format!("CASE {base} WHEN {v1} THEN {a} WHEN {v2} THEN {b} ELSE {c} END");
            }
            2 => {
                self.used.insert("coalesce");
                let (a, b) = (self.expr(t, d), self.expr(t, d));
                return format!("coalesce({a}, {b})");
            }
            3 if t != T::List && t != T::Bool => {
                self.used.insert("nullif");
                let (a, b) = (self.expr(t, d), self.expr(t, d));
                return format!("nullif({a}, {b})");
            }
            4 if matches!(t, T::Int | T::Float | T::Str | T::Time) => {
                let f = *self.pick(&["least", "greatest"]);
                self.used.insert(f);
                let (a, b) = (self.expr(t, d), self.expr(t, d));
                return format!("{f}({a}, {b})");
            }
            _ => {}
        }
        match t {
            T::Int => self.int(d),
            T::Float => self.float(d),
            T::Str => self.string(d),
            T::Bool => self.boolean(d),
            T::Time | T::List => self.leaf(t),
        }
    }

    pub(super) fn int(&mut self, d: usize) -> String {
        match self.rng.random_range(0..10) {
            0..=3 => {
                let op = *self.pick(&["+", "-", "*", "/", "%"]);
                self.used.insert(op);
                let (a, b) = (self.expr(T::Int, d), self.expr(T::Int, d));
                format!("({a} {op} {b})")
            }
            4 => {
                self.used.insert("-x");
                format!("(-{})", self.expr(T::Int, d))
            }
            5 => {
                self.used.insert("abs");
                format!("abs({})", self.expr(T::Int, d))
            }
            6 => {
                self.used.insert("CAST");
                let from = *self.pick(&[T::Float, T::Str, T::Bool]);
                format!("CAST({} AS BIGINT)", self.expr(from, d))
            }
            7 => {
                let f = *self.pick(&["character_length", "length"]);
                self.used.insert("character_length");
                format!("{f}({})", self.expr(T::Str, d))
            }
            8 => {
                self.used.insert("array_length");
                format!("CAST(array_length({}) AS BIGINT)", self.expr(T::List, d))
            }
            _ => {
                self.used.insert("date_part");
                let part = *self.pick(&["year", "month", "day", "hour", "minute", "dow", "doy", "quarter", "week"]);
                format!("CAST(date_part('{part}', {}) AS BIGINT)", self.expr(T::Time, d))
            }
        }
    }

    pub(super) fn float(&mut self, d: usize) -> String {
        match self.rng.random_range(0..13) {
            0..=2 => {
                let op = *self.pick(&["+", "-", "*", "/", "%"]);
                self.used.insert(op);
                match op {
                    "/" => self.used.insert("quiver_float_division"),
                    "%" => self.used.insert("quiver_float_remainder"),
                    _ => true,
                };
                let right = if self.rng.random_bool(0.2) { T::Int } else { T::Float };
                let (a, b) = (self.expr(T::Float, d), self.expr(right, d));
                format!("({a} {op} {b})")
            }
            3 => {
                self.used.insert("-x");
                format!("(-{})", self.expr(T::Float, d))
            }
            4 | 5 => {
                let f = *self.pick(&["abs", "ln", "log10", "exp", "sqrt", "floor", "ceil", "round"]);
                self.used.insert(f);
                format!("{f}({})", self.expr(T::Float, d))
            }
            6 => {
                self.used.insert("round");
                let digits = *self.pick(&["0", "1", "2", "-1", "3"]);
                format!("round({}, {digits})", self.expr(T::Float, d))
            }
            7 => {
                let f = *self.pick(&["power", "pow"]);
                self.used.insert("power");
                format!("{f}({}, {})", self.expr(T::Float, d), self.expr(T::Float, d))
            }
            8 => {
                self.used.insert("CAST");
                let from = *self.pick(&[T::Int, T::Str]);
                format!("CAST({} AS DOUBLE)", self.expr(from, d))
            }
            9 => {
                let f = *self.pick(&["inner_product", "dot_product", "cosine_distance", "array_distance"]);
                self.used.insert(if f == "dot_product" { "inner_product" } else { f });
                format!("{f}({}, {})", self.expr(T::List, d), self.expr(T::List, d))
            }
            10 => {
                self.used.insert("array_element");
                let (l, i) = (self.expr(T::List, d), self.expr(T::Int, d));
                if self.rng.random_bool(0.5) { format!("array_element({l}, {i})") } else { format!("({l})[{i}]") }
            }
            11 => {
                self.used.insert("date_part");
                let (a, b) = (self.expr(T::Time, d), self.expr(T::Time, d));
                self.used.insert("t - t");
                format!("date_part('epoch', {a} - {b})")
            }
            _ => {
                self.used.insert("date_part");
                let part = *self.pick(PARTS);
                if self.rng.random_bool(0.5) {
                    format!("CAST(date_part('{part}', {}) AS DOUBLE)", self.expr(T::Time, d))
                } else {
                    self.used.insert("extract");
                    format!("CAST(extract({part} FROM {}) AS DOUBLE)", self.expr(T::Time, d))
                }
            }
        }
    }

    pub(super) fn string(&mut self, d: usize) -> String {
        match self.rng.random_range(0..8) {
            0 => {
                let f = *self.pick(&["lower", "upper"]);
                self.used.insert(f);
                format!("{f}({})", self.expr(T::Str, d))
            }
            1 | 2 => {
                let f = *self.pick(&["substr", "substring"]);
                self.used.insert("substr");
                let (s, i) = (self.expr(T::Str, d), self.expr(T::Int, d));
                if self.rng.random_bool(0.5) { format!("{f}({s}, {i})") } else { format!("{f}({s}, {i}, {})", self.expr(T::Int, d)) }
            }
            3 | 4 => {
                self.used.insert("concat");
                let k = *self.pick(&[T::Str, T::Str, T::Int, T::Float, T::Bool]);
                format!("concat({}, {})", self.expr(T::Str, d), self.expr(k, d))
            }
            _ => {
                self.used.insert("CAST");
                let from = *self.pick(&[T::Int, T::Float, T::Bool, T::Time]);
                format!("CAST({} AS VARCHAR)", self.expr(from, d))
            }
        }
    }

    pub(super) fn boolean(&mut self, d: usize) -> String {
        match self.rng.random_range(0..12) {
            0..=2 => {
                let op = *self.pick(&["=", "<>", "!=", "<", "<=", ">", ">="]);
                self.used.insert("comparison");
                let k = *self.pick(&[T::Int, T::Float, T::Str, T::Bool, T::Time, T::Int, T::Float]);
                format!("({} {op} {})", self.expr(k, d), self.expr(k, d))
            }
            3 => {
                let op = *self.pick(&["AND", "OR"]);
                self.used.insert(op);
                format!("({} {op} {})", self.expr(T::Bool, d), self.expr(T::Bool, d))
            }
            4 => {
                self.used.insert("NOT");
                format!("(NOT {})", self.expr(T::Bool, d))
            }
            5 => {
                let op = *self.pick(&["IS NULL", "IS NOT NULL"]);
                self.used.insert(op);
                let k = *self.pick(&TYPES);
                format!("({} {op})", self.expr(k, d))
            }
            6 | 7 => {
                let op = *self.pick(&["LIKE", "NOT LIKE"]);
                self.used.insert("LIKE");
                let pattern = if self.rng.random_bool(0.8) { quoted(self.pick::<&str>(PATTERNS)) } else { self.expr(T::Str, d) };
                format!("({} {op} {pattern})", self.expr(T::Str, d))
            }
            8 => {
                let op = *self.pick(&["IN", "NOT IN"]);
                self.used.insert("IN");
                let k = *self.pick(&[T::Int, T::Float, T::Str]);
                let n = self.rng.random_range(1..4);
                let items: Vec<String> = (0..n).map(|_| self.expr(k, d)).collect();
                format!("({} {op} ({}))", self.expr(k, d), items.join(", "))
            }
            9 => {
                self.used.insert("BETWEEN");
                let k = *self.pick(&[T::Int, T::Float, T::Str]);
                format!("({} BETWEEN {} AND {})", self.expr(k, d), self.expr(k, d), self.expr(k, d))
            }
            _ => {
                self.used.insert("starts_with");
                format!("starts_with({}, {})", self.expr(T::Str, d), self.expr(T::Str, d))
            }
        }
    }
}

pub(super) fn sql_type(t: T) -> &'static str {
    match t {
        T::Int => "BIGINT",
        T::Float => "DOUBLE",
        T::Str => "VARCHAR",
        T::Bool => "BOOLEAN",
        T::Time => "TIMESTAMP",
        T::List => "DOUBLE[]",
    }
}

/// One random value of a column's type, edge values most often.
pub(super) fn value(rng: &mut StdRng, dtype: &DataType) -> ScalarValue {
    let null = rng.random_bool(0.1);
    match dtype {
        DataType::Int64 => ScalarValue::Int64((!null).then(|| {
            *[
                0,
                1,
                -1,
                2,
                -2,
                7,
                i64::MAX,
                i64::MIN,
                i64::MAX - 1,
                i64::from(i32::MAX),
                i64::from(i32::MIN),
                3_000_000_000,
                rng.random_range(-100..100),
            ]
            .get(rng.random_range(0..13))
            .expect("in range")
        })),
        DataType::Int32 => ScalarValue::Int32(
            (!null).then(|| *[0, 1, -1, 3, i32::MAX, i32::MIN, rng.random_range(-50..50)].get(rng.random_range(0..7)).expect("in range")),
        ),
        DataType::Float64 => ScalarValue::Float64((!null).then(|| float(rng))),
        DataType::Float32 => ScalarValue::Float32((!null).then(|| float(rng) as f32)),
        DataType::Utf8 => ScalarValue::Utf8((!null).then(|| {
            let long = "é".repeat(rng.random_range(40..200));
            let picked = rng.random_range(0..STRINGS.len() + 2);
            match picked {
                p if p < STRINGS.len() => STRINGS[p].to_string(),
                p if p == STRINGS.len() => long,
                _ => (0..rng.random_range(0..6)).map(|_| rng.random_range(b'a'..=b'd') as char).collect(),
            }
        })),
        DataType::Boolean => ScalarValue::Boolean((!null).then(|| rng.random_bool(0.5))),
        DataType::Timestamp(..) => ScalarValue::TimestampMicrosecond(
            (!null).then(|| {
                *[
                    0,
                    -1,
                    1,
                    86_399_999_999,
                    -86_400_000_000,
                    1_700_000_000_123_456,
                    951_782_400_000_000, // 2000-02-29
                    253_402_300_799_999_999,
                    -62_135_596_800_000_000,
                    rng.random_range(-2_000_000_000_000_000..2_000_000_000_000_000),
                ]
                .get(rng.random_range(0..10))
                .expect("in range")
            }),
            Some("UTC".into()),
        ),
        DataType::List(_) => {
            let items: Option<Vec<Option<f64>>> = (!null).then(|| {
                let n = *[0usize, 1, 2, 3, 3, 3].get(rng.random_range(0..6)).expect("in range");
                (0..n).map(|_| if rng.random_bool(0.1) { None } else { Some(float(rng)) }).collect()
            });
            ScalarValue::List(Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(std::iter::once(items))))
        }
        other => panic!("no values of {other}"),
    }
}

/// The NaN x86 computes for `inf / inf`: the sign bit set.
pub(super) const NEGATIVE_NAN: f64 = f64::from_bits(0xfff8_0000_0000_0000);

pub(super) fn float(rng: &mut StdRng) -> f64 {
    let edges = [
        NEGATIVE_NAN,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.5,
        -2.5,
        0.1,
        2.675,
        1.0000000000000002,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        1e15 + 0.5,
        9_007_199_254_740_993.0,
    ];
    if rng.random_bool(0.7) { edges[rng.random_range(0..edges.len())] } else { rng.random_range(-1e6..1e6) }
}
