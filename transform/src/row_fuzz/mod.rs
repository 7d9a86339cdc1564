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

use arrow::array::{ArrayRef, RecordBatch};
use datafusion::common::ScalarValue;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Column, FUNCTIONS, Output, Program};

mod generate;

use generate::{Gen, NEGATIVE_NAN, T, TYPES, declared, inputs, value};

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
