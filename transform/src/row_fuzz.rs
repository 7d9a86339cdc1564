//! The differential fuzzer of the row evaluator (docs/transformations.md#which-evaluator-runs-where):
//! random well-typed expressions from the language's grammar — every operator and
//! function, nested up to five levels, literals of every type — computed by the row
//! evaluator and by the vectorized path on random rows of edge values, each row alone
//! and within a batch of the others at a random position; constants are not folded
//! (both compute them), but in every fourth expression (folded, as in production).
//! Value for value, bit for bit, and the same rows uncomputed.
//!
//! In `./run test`: a fixed seed for at least 100,000 expression x row cases, then a
//! fresh seed (printed on failure) for a few thousand. `./run fuzz-rows [SECONDS]
//! [SEED]` runs it for as long as asked. Every disagreement found is a named case in
//! [`regressions`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, ListArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Float64Type, TimeUnit};
use datafusion::common::ScalarValue;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Column, FUNCTIONS, Output, Program};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum T {
    Int,
    Float,
    Str,
    Bool,
    Time,
    List,
}

const TYPES: [T; 6] = [T::Int, T::Float, T::Str, T::Bool, T::Time, T::List];

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn list() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true)))
}

/// The input columns: name, type, what the generator reads it as.
fn inputs() -> Vec<(&'static str, DataType, T)> {
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

fn declared(t: T) -> DataType {
    match t {
        T::Int => DataType::Int64,
        T::Float => DataType::Float64,
        T::Str => DataType::Utf8,
        T::Bool => DataType::Boolean,
        T::Time => ts(),
        T::List => list(),
    }
}

const INT_LITERALS: &[&str] =
    &["0", "1", "-1", "2", "7", "-7", "3", "10", "9223372036854775807", "-9223372036854775807", "2147483647", "-2147483648"];
const FLOAT_LITERALS: &[&str] = &[
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
const STRINGS: &[&str] =
    &["", "a", "ß", "İ", "ΣΑΣ", "Straße", "ﬃ", "ǅ", "a_b%c", "it's", "😀x", "123", "-7", "1e3", "NaN", " x ", "abcdefghij"];
const PATTERNS: &[&str] = &["a%", "%", "_", "%ß%", "a\\_b%", "a\\%", "_b%", "%x", "", "%a_b%c%", "Σ%", "\\\\"];
const PARTS: &[&str] =
    &["year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond", "dow", "doy", "epoch"];

fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Random expressions of a type, recording the functions and operators they use.
struct Gen {
    rng: StdRng,
    used: BTreeSet<&'static str>,
}

impl Gen {
    fn pick<'a, X>(&mut self, xs: &'a [X]) -> &'a X {
        &xs[self.rng.random_range(0..xs.len())]
    }

    fn leaf(&mut self, t: T) -> String {
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

    fn expr(&mut self, t: T, depth: usize) -> String {
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

    fn int(&mut self, d: usize) -> String {
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

    fn float(&mut self, d: usize) -> String {
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

    fn string(&mut self, d: usize) -> String {
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

    fn boolean(&mut self, d: usize) -> String {
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

fn sql_type(t: T) -> &'static str {
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
fn value(rng: &mut StdRng, dtype: &DataType) -> ScalarValue {
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
const NEGATIVE_NAN: f64 = f64::from_bits(0xfff8_0000_0000_0000);

fn float(rng: &mut StdRng) -> f64 {
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

/// Whether the two evaluators' values are the same, bit for bit.
fn same(a: &ScalarValue, b: &ScalarValue) -> bool {
    match (a, b) {
        (ScalarValue::Float64(x), ScalarValue::Float64(y)) => x.map(f64::to_bits) == y.map(f64::to_bits),
        (ScalarValue::Float32(x), ScalarValue::Float32(y)) => x.map(f32::to_bits) == y.map(f32::to_bits),
        _ => a.data_type() == b.data_type() && format!("{a:?}") == format!("{b:?}"),
    }
}

/// What one run compared.
#[derive(Debug, Default)]
struct Tally {
    expressions: usize,
    refused: usize,
    cases: usize,
    failed: usize,
}

/// Compares the evaluators on `exprs` random expressions of `rows` rows each from
/// `seed` (or until `until`), panicking with the case on the first disagreement.
fn run(seed: u64, exprs: usize, rows: usize, until: Option<Instant>) -> (Tally, BTreeSet<&'static str>) {
    let mut generator = Gen { rng: StdRng::seed_from_u64(seed), used: BTreeSet::new() };
    let mut data = StdRng::seed_from_u64(seed ^ 0x5eed);
    let columns: Vec<Column> = inputs().into_iter().map(|(name, dtype, _)| Column::bare(name, dtype)).collect();
    let mut tally = Tally::default();
    let mut k = 0;
    while until.map_or(k < exprs, |u| Instant::now() < u) {
        k += 1;
        let t = *generator.pick(&TYPES);
        let depth = generator.rng.random_range(1..=5);
        let text = generator.expr(t, depth);
        let output = Output { name: "x".into(), dtype: declared(t), expr: text.clone() };
        tally.expressions += 1;
        // Constants computed per row by both evaluators, but for every fourth expression
        // (folded at compile time, as in production).
        let Ok(program) = Program::compile_with(&columns, &[output], k % 4 == 0) else {
            tally.refused += 1;
            continue;
        };
        let table: Vec<Vec<ScalarValue>> = (0..rows).map(|_| columns.iter().map(|c| value(&mut data, &c.dtype)).collect()).collect();
        let batch = to_batch(&program, &table);
        let whole = program.evaluate(&batch).expect("the program's columns");
        let mut failed_alone = 0;
        for (at, row) in table.iter().enumerate() {
            let mut out = Vec::new();
            let failed = program.evaluate_row(row, &mut out).expect("one value per column");
            let alone = program.evaluate(&to_batch(&program, std::slice::from_ref(row))).expect("the program's columns");
            let batch_value = ScalarValue::try_from_array(&alone.columns[0], 0).expect("a value");
            let within = ScalarValue::try_from_array(&whole.columns[0], at).expect("a value");
            let case = || format!("seed {seed}, expression {k}: `{text}`\nrow: {}", show(&columns, row));
            assert!(
                same(&out[0], &batch_value) && failed == alone.failed[0],
                "the row evaluator disagrees with DataFusion on a row alone\n{}\nrow evaluator: {:?} ({failed} uncomputed)\nvectorized: {batch_value:?} ({} uncomputed)",
                case(),
                out[0],
                alone.failed[0]
            );
            assert!(
                same(&within, &batch_value),
                "the vectorized path gives a row within a batch another value than alone\n{}\nalone: {batch_value:?}\nat {at} of {rows}: {within:?}",
                case()
            );
            failed_alone += alone.failed[0];
            tally.cases += 1;
            tally.failed += failed as usize;
        }
        assert_eq!(whole.failed[0], failed_alone, "seed {seed}, `{text}`: the batch counts other rows uncomputed than its rows alone");
    }
    (tally, generator.used)
}

fn to_batch(program: &Program, rows: &[Vec<ScalarValue>]) -> RecordBatch {
    let n_columns = program.input_schema().fields().len();
    let columns: Vec<ArrayRef> =
        (0..n_columns).map(|c| ScalarValue::iter_to_array(rows.iter().map(|r| r[c].clone())).expect("values of one type")).collect();
    RecordBatch::try_new(Arc::clone(program.input_schema()), columns).expect("the program's columns")
}

fn show(columns: &[Column], row: &[ScalarValue]) -> String {
    columns.iter().zip(row).map(|(c, v)| format!("{}={v:?}", c.name)).collect::<Vec<_>>().join(", ")
}

/// At least 100,000 expression x row cases from a fixed seed, every function and
/// operator of the language generated, most expressions accepted.
#[test]
fn the_row_evaluator_equals_the_vectorized_path_on_a_fixed_seed() {
    let (tally, used) = run(20_261_206, 2_100, 50, None);
    eprintln!("row fuzz, fixed seed: {tally:?}");
    assert!(tally.cases >= 100_000, "{tally:?}");
    assert!(tally.refused * 4 < tally.expressions, "most generated expressions type-check: {tally:?}");
    assert!(tally.failed > 100, "rows that cannot be computed are among the cases: {tally:?}");
    for f in FUNCTIONS {
        assert!(used.contains(f), "the generator never writes the function `{f}`");
    }
    for op in
        ["+", "-", "*", "/", "%", "-x", "comparison", "AND", "OR", "NOT", "IS NULL", "IS NOT NULL", "IN", "BETWEEN", "LIKE", "CASE", "CAST"]
    {
        assert!(used.contains(op), "the generator never writes `{op}`");
    }
}

/// A few thousand cases from a fresh seed (printed, to replay a failure with
/// `./run fuzz-rows SECONDS SEED`); `QUIVER_ROW_FUZZ_SECONDS` runs for that long.
#[test]
fn the_row_evaluator_equals_the_vectorized_path_on_a_fresh_seed() {
    let seed = std::env::var("QUIVER_ROW_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64));
    let seconds = std::env::var("QUIVER_ROW_FUZZ_SECONDS").ok().and_then(|s| s.parse::<u64>().ok());
    eprintln!("row fuzz, seed {seed} (replay: ./run fuzz-rows SECONDS {seed})");
    let (tally, _) = run(seed, 60, 50, seconds.map(|s| Instant::now() + Duration::from_secs(s)));
    eprintln!("row fuzz, seed {seed}: {tally:?}");
    assert!(tally.cases > 0);
}

/// Disagreements the fuzzer found, each kept as a case of its own: the expression, and
/// the row's values that told the evaluators apart (the other columns null).
#[test]
fn regressions() {
    use ScalarValue as S;
    let columns: Vec<Column> = inputs().into_iter().map(|(name, dtype, _)| Column::bare(name, dtype)).collect();
    type Case = (&'static str, T, Vec<(&'static str, S)>);
    let cases: Vec<Case> = vec![
        // DataFusion's comparisons take -0.0 as 0.0 (Arrow's kernels alone order them).
        (
            "(date_part('epoch', r - r) = CASE WHEN TRUE THEN h END)",
            T::Bool,
            vec![("r", S::TimestampMicrosecond(Some(-86_400_000_000), Some("UTC".into()))), ("h", S::Float32(Some(-0.0)))],
        ),
        ("f = g", T::Bool, vec![("f", S::Float64(Some(0.0))), ("g", S::Float64(Some(-0.0)))]),
        ("f < g", T::Bool, vec![("f", S::Float64(Some(-0.0))), ("g", S::Float64(Some(0.0)))]),
        // ... but its `CASE x WHEN v` does not.
        ("CASE f WHEN g THEN 1 ELSE 2 END", T::Int, vec![("f", S::Float64(Some(0.0))), ("g", S::Float64(Some(-0.0)))]),
        // `IN` stops at the first equal item: the overflowing one is never computed for
        // this row, alone or beside a row (all null) that computes every item.
        ("(i IN (j, (-9223372036854775807 - 2) + i))", T::Bool, vec![("i", S::Int64(Some(1))), ("j", S::Int64(Some(1)))]),
        // inf / inf is a negative NaN on x86 and NaN + NaN keeps either operand's: every
        // computed NaN is the one NaN, which `greatest` takes over any number.
        ("greatest(0.1, (CAST('NaN' AS DOUBLE) + (g / exp(greatest(g, -0.0)))))", T::Float, vec![("g", S::Float64(Some(f64::INFINITY)))]),
        ("greatest(0.1, f / g)", T::Float, vec![("f", S::Float64(Some(f64::INFINITY))), ("g", S::Float64(Some(f64::INFINITY)))]),
        // ... in constants folded at compile time too (found by review).
        ("greatest(f, CAST('inf' AS DOUBLE) / CAST('inf' AS DOUBLE))", T::Float, vec![("f", S::Float64(Some(1.0)))]),
        ("CASE WHEN sqrt(-1.0) < 0 THEN 1 ELSE i END", T::Int, vec![("i", S::Int64(Some(5)))]),
        // `nullif` passes on a NaN read from a column as the one NaN.
        ("(nullif(f, 0.0) > 1.0)", T::Bool, vec![("f", S::Float64(Some(NEGATIVE_NAN)))]),
        // An `IN` item that overflows fails the row (DataFusion had computed its set of
        // constants with wrapping arithmetic).
        ("(i IN (9223372036854775807 + 1))", T::Bool, vec![("i", S::Int64(Some(i64::MIN)))]),
        // An `IN` list DataFusion takes for constant (its items compute a value without a
        // row) though an item reads columns: computed by its code over the whole row.
        (
            "coalesce(m, CASE WHEN (concat(upper(s), CASE s WHEN '1e3' THEN TRUE WHEN s THEN FALSE ELSE b END) IN (CASE CAST(n AS VARCHAR) WHEN u THEN s WHEN substring(u, j) THEN CAST(i AS VARCHAR) ELSE coalesce('1e3', u) END, CAST(CASE WHEN FALSE THEN 1e-310 ELSE -1e308 END AS VARCHAR))) THEN m ELSE m END)",
            T::List,
            vec![
                ("i", S::Int64(Some(7))),
                ("j", S::Int64(Some(2))),
                ("n", S::Int32(Some(-1))),
                ("s", S::Utf8(Some("😀x".into()))),
                ("u", S::Utf8(Some(" x ".into()))),
                ("b", S::Boolean(Some(false))),
            ],
        ),
    ];
    for ((text, t, given), fold) in cases.into_iter().flat_map(|case| [(case.clone(), false), (case, true)]) {
        let program = Program::compile_with(&columns, &[Output { name: "x".into(), dtype: declared(t), expr: text.into() }], fold)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut row: Vec<S> = columns.iter().map(|c| S::try_from(&c.dtype).unwrap()).collect();
        for (name, v) in given {
            row[columns.iter().position(|c| c.name == name).unwrap()] = v;
        }
        let mut out = Vec::new();
        let failed = program.evaluate_row(&row, &mut out).unwrap();
        let alone = program.evaluate(&to_batch(&program, std::slice::from_ref(&row))).unwrap();
        let want = S::try_from_array(&alone.columns[0], 0).unwrap();
        assert!(
            same(&out[0], &want) && failed == alone.failed[0],
            "`{text}` on {}: row {:?}, vectorized {want:?}",
            show(&columns, &row),
            out[0]
        );
        let nulls: Vec<S> = columns.iter().map(|c| S::try_from(&c.dtype).unwrap()).collect();
        let beside = program.evaluate(&to_batch(&program, &[nulls, row.clone()])).unwrap();
        let within = S::try_from_array(&beside.columns[0], 1).unwrap();
        assert!(same(&within, &want), "`{text}`: beside another row {within:?}, alone {want:?}");
    }
}
