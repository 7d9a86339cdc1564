use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Float64Array, Int64Array, ListArray, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Float64Type, TimeUnit};
use rand::{Rng, SeedableRng};

use super::*;

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn columns() -> Vec<Column> {
    vec![
        Column::qualified("v", "a", DataType::Int64),
        Column::qualified("v", "b", DataType::Int64),
        Column::qualified("v", "x", DataType::Float64),
        Column::qualified("v", "y", DataType::Float64),
        Column::qualified("v", "s", DataType::Utf8),
        Column::qualified("v", "event_timestamp", ts()),
        Column::qualified("w", "e", DataType::List(Arc::new(arrow::datatypes::Field::new_list_field(DataType::Float64, true)))),
        Column::bare("amount", DataType::Float64),
        Column::bare("request_time", ts()),
    ]
}

fn out(name: &str, dtype: DataType, expr: &str) -> Output {
    Output { name: name.into(), dtype, expr: expr.into() }
}

fn compile(dtype: DataType, expr: &str) -> Result<Program, ExprError> {
    Program::compile(&columns(), &[out("f", dtype, expr)])
}

/// A batch of the columns above; `a`, `b`, `x`, `y` and `s` from the given rows.
fn batch(a: &[Option<i64>], b: &[Option<i64>], x: &[Option<f64>], y: &[Option<f64>], s: &[Option<&str>]) -> RecordBatch {
    let n = a.len();
    let hour = 3_600_000_000i64;
    let lists = ListArray::from_iter_primitive::<Float64Type, _, _>((0..n).map(|i| Some(vec![Some(i as f64), Some(1.0)])));
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(a.to_vec())),
        Arc::new(Int64Array::from(b.to_vec())),
        Arc::new(Float64Array::from(x.to_vec())),
        Arc::new(Float64Array::from(y.to_vec())),
        Arc::new(StringArray::from(s.to_vec())),
        Arc::new(TimestampMicrosecondArray::from(vec![1_700_000_000_000_000i64; n]).with_timezone("UTC")),
        Arc::new(lists),
        Arc::new(Float64Array::from(vec![Some(10.0); n])),
        Arc::new(TimestampMicrosecondArray::from(vec![1_700_000_000_000_000i64 + 3 * hour; n]).with_timezone("UTC")),
    ];
    let program = compile(DataType::Int64, "v.a").unwrap();
    RecordBatch::try_new(program.input_schema().clone(), arrays).unwrap()
}

fn one(dtype: DataType, expr: &str, batch: &RecordBatch) -> (ArrayRef, u64) {
    let program = compile(dtype, expr).unwrap_or_else(|e| panic!("{e}"));
    let mut done = program.evaluate(batch).unwrap();
    (done.columns.remove(0), done.failed[0])
}

fn floats(a: &ArrayRef) -> Vec<Option<f64>> {
    a.as_any().downcast_ref::<Float64Array>().unwrap().iter().collect()
}

fn ints(a: &ArrayRef) -> Vec<Option<i64>> {
    a.as_any().downcast_ref::<Int64Array>().unwrap().iter().collect()
}

#[test]
fn the_language_computes_what_it_says() {
    let b = batch(
        &[Some(7), Some(-7), None],
        &[Some(2), Some(0), Some(1)],
        &[Some(1.5), Some(-0.5), Some(4.0)],
        &[Some(0.5), Some(0.0), None],
        &[Some("Paris"), Some(""), None],
    );
    // Integer division truncates; by zero it is null and counted.
    let (v, failed) = one(DataType::Int64, "v.a / v.b", &b);
    assert_eq!((ints(&v), failed), (vec![Some(3), None, None], 1));
    // A float divisor of zero is null too, not infinity.
    let (v, failed) = one(DataType::Float64, "v.x / v.y", &b);
    assert_eq!((floats(&v), failed), (vec![Some(3.0), None, None], 1));
    let (v, _) = one(DataType::Float64, "amount / NULLIF(v.y, 0)", &b);
    assert_eq!(floats(&v), vec![Some(20.0), None, None]);
    // An int64 result held by a float64 feature.
    let (v, _) = one(DataType::Float64, "v.a * 2", &b);
    assert_eq!(floats(&v), vec![Some(14.0), Some(-14.0), None]);
    let (v, _) = one(DataType::Int64, "CASE WHEN v.a > 0 THEN 1 WHEN v.a < 0 THEN -1 ELSE 0 END", &b);
    assert_eq!(ints(&v), vec![Some(1), Some(-1), Some(0)]);
    let (v, _) = one(DataType::Int64, "COALESCE(v.a, v.b, 99)", &b);
    assert_eq!(ints(&v), vec![Some(7), Some(-7), Some(1)]);
    let (v, _) = one(DataType::Boolean, "lower(v.s) = 'paris' AND v.s LIKE 'P%'", &b);
    let v: Vec<Option<bool>> = v.as_any().downcast_ref::<BooleanArray>().unwrap().iter().collect();
    assert_eq!(v, vec![Some(true), Some(false), None]);
    let (v, _) = one(DataType::Int64, "length(v.s)", &b);
    assert_eq!(ints(&v), vec![Some(5), Some(0), None]);
    let (v, _) = one(DataType::Utf8, "concat(upper(substr(v.s, 1, 2)), '-', v.s)", &b);
    let v: Vec<Option<&str>> = v.as_any().downcast_ref::<StringArray>().unwrap().iter().collect();
    assert_eq!(v, vec![Some("PA-Paris"), Some("-"), Some("-")]);
    // Time: three hours between the request and the row.
    let (v, _) = one(DataType::Float64, "date_part('epoch', request_time - v.event_timestamp) / 3600", &b);
    assert_eq!(floats(&v), vec![Some(3.0); 3]);
    // Seconds with their fraction, however long the difference (DataFusion alone keeps
    // the fraction only below about two seconds).
    let (v, _) = one(DataType::Float64, "date_part('epoch', (request_time + INTERVAL '250 milliseconds') - v.event_timestamp)", &b);
    assert_eq!(floats(&v), vec![Some(10_800.25); 3]);
    let (v, _) = one(DataType::Float64, "date_part('EPOCH', v.event_timestamp - (v.event_timestamp + INTERVAL '1500 milliseconds'))", &b);
    assert_eq!(floats(&v), vec![Some(-1.5); 3]);
    let (v, _) = one(DataType::Float64, "extract(hour FROM request_time)", &b);
    assert_eq!(floats(&v), vec![Some(1.0); 3], "1_700_000_000 s is 22:13 UTC; three hours later, 01:13");
    // Lists: [i, 1] against [1, 1].
    let (v, _) = one(DataType::Float64, "dot_product(w.e, [1.0, 1.0])", &b);
    assert_eq!(floats(&v), vec![Some(1.0), Some(2.0), Some(3.0)]);
    let (v, _) = one(DataType::Int64, "array_length(w.e)", &b);
    assert_eq!(ints(&v), vec![Some(2); 3]);
    let (v, _) = one(DataType::Float64, "array_element(w.e, 1) + power(2, 3) + sqrt(16) + abs(-1.5)", &b);
    assert_eq!(floats(&v), vec![Some(13.5), Some(14.5), Some(15.5)]);
    // Lists of unequal length give null, counted.
    let (v, failed) = one(DataType::Float64, "array_distance(w.e, [1.0, 1.0, 1.0])", &b);
    assert_eq!((floats(&v), failed), (vec![None; 3], 3));
}

#[test]
fn overflow_and_invalid_casts_give_null_for_that_row_alone() {
    let b =
        batch(&[Some(i64::MAX), Some(1), Some(3)], &[Some(1), Some(1), Some(1)], &[None; 3], &[None; 3], &[Some("12"), Some("x"), None]);
    let (v, failed) = one(DataType::Int64, "v.a + v.b", &b);
    assert_eq!((ints(&v), failed), (vec![None, Some(2), Some(4)], 1));
    let (v, failed) = one(DataType::Int64, "CAST(v.s AS BIGINT)", &b);
    assert_eq!((ints(&v), failed), (vec![Some(12), None, None], 1));
}

#[test]
fn what_is_outside_the_language_is_refused_naming_it() {
    let refused = |dtype: DataType, expr: &str, want: &str| {
        let err = compile(dtype, expr).map(|_| ()).unwrap_err();
        assert_eq!(err.feature, "f");
        assert!(err.to_string().contains(want), "`{expr}`: {err}");
    };
    refused(DataType::Float64, "sum(v.x)", "aggregate");
    refused(DataType::Float64, "random()", "the function `random`");
    refused(DataType::Int64, "(SELECT 1)", "subqueries");
    refused(DataType::Float64, "v.nope + 1", "unknown name");
    refused(DataType::Float64, "v.nope + 1", "known: v.a, v.b, v.x");
    refused(DataType::Int64, "v.x * 2", "computes float64, which an int64 feature cannot hold");
    refused(DataType::Boolean, "v.s", "computes string");
    refused(DataType::Utf8, "v.s ILIKE 'p%'", "ILIKE");
    refused(DataType::Int64, "TRY_CAST(v.s AS BIGINT)", "TRY_CAST");
    refused(DataType::Int64, "", "empty expression");
    refused(DataType::Int64, "v.a +", "");
    // A pathological expression is refused at once, before it is parsed.
    let huge = vec!["v.a"; 100_000].join(" + ");
    let start = std::time::Instant::now();
    refused(DataType::Int64, &huge, "characters long");
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
    let deep = format!("{}v.a{}", "v.a + (".repeat(150), ")".repeat(150));
    refused(DataType::Int64, &deep, "nests more than 100 levels deep");
    let wide = vec!["1"; 3_000].join("+");
    refused(DataType::Int64, &wide, "more than 5000 terms");
    let nested = format!("{}v.a{}", "(".repeat(3_000), ")".repeat(3_000));
    refused(DataType::Int64, &nested, "nests more than 100 levels deep");
}

#[test]
fn a_batch_of_other_types_is_refused() {
    let program = compile(DataType::Int64, "v.a").unwrap();
    let wrong = RecordBatch::try_from_iter([("a", Arc::new(StringArray::from(vec!["1"])) as ArrayRef)]).unwrap();
    assert!(program.evaluate(&wrong).unwrap_err().to_string().contains("expected columns of types [int64, int64, float64"));
}

/// A small expression over `v.a`, `v.b` (int64) and `v.x`, `v.y` (float64), as SQL
/// text and as a tree the oracle below evaluates.
#[derive(Debug, Clone)]
enum Gen {
    Col(usize),
    Int(i64),
    Float(f64),
    Bin(&'static str, Box<Gen>, Box<Gen>),
    Neg(Box<Gen>),
    Coalesce(Box<Gen>, Box<Gen>),
    Case(Box<Gen>, Box<Gen>, Box<Gen>, Box<Gen>),
    Abs(Box<Gen>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    Null,
    I(i64),
    F(f64),
}

const COLS: [&str; 4] = ["v.a", "v.b", "v.x", "v.y"];

impl Gen {
    fn random(rng: &mut impl Rng, depth: u32) -> Gen {
        if depth == 0 || rng.random_bool(0.3) {
            return match rng.random_range(0..4) {
                0 | 1 => Gen::Col(rng.random_range(0..4)),
                2 => Gen::Int(*[0i64, 1, -1, 2, 7, i64::MAX, i64::MIN + 1].get(rng.random_range(0..7)).unwrap()),
                _ => Gen::Float(*[0.0, 0.5, -2.25, 1e300, 3.0].get(rng.random_range(0..5)).unwrap()),
            };
        }
        let sub = |rng: &mut _| Box::new(Gen::random(rng, depth - 1));
        match rng.random_range(0..8) {
            0..=3 => {
                let op = ["+", "-", "*", "/", "%"][rng.random_range(0..5)];
                Gen::Bin(op, sub(rng), sub(rng))
            }
            4 => Gen::Neg(sub(rng)),
            5 => Gen::Coalesce(sub(rng), sub(rng)),
            6 => Gen::Case(sub(rng), sub(rng), sub(rng), sub(rng)),
            _ => Gen::Abs(sub(rng)),
        }
    }

    fn sql(&self) -> String {
        match self {
            Gen::Col(i) => COLS[*i].to_string(),
            Gen::Int(v) if *v < 0 => format!("({v})"),
            Gen::Int(v) => v.to_string(),
            Gen::Float(v) => format!("CAST({v:e} AS DOUBLE)"),
            Gen::Bin(op, a, b) => format!("({} {op} {})", a.sql(), b.sql()),
            Gen::Neg(a) => format!("(- {})", a.sql()),
            Gen::Coalesce(a, b) => format!("COALESCE({}, {})", a.sql(), b.sql()),
            Gen::Case(a, b, t, e) => format!("(CASE WHEN {} > {} THEN {} ELSE {} END)", a.sql(), b.sql(), t.sql(), e.sql()),
            Gen::Abs(a) => format!("abs({})", a.sql()),
        }
    }

    fn is_float(&self) -> bool {
        match self {
            Gen::Col(i) => *i >= 2,
            Gen::Int(_) => false,
            Gen::Float(_) => true,
            Gen::Bin(_, a, b) | Gen::Coalesce(a, b) => a.is_float() || b.is_float(),
            Gen::Case(_, _, t, e) => t.is_float() || e.is_float(),
            Gen::Neg(a) | Gen::Abs(a) => a.is_float(),
        }
    }

    /// The value by the language's rules, computed by hand: nulls propagate, a zero
    /// divisor or an integer overflow makes the whole row fail (`Err`), floats are IEEE,
    /// CASE and COALESCE compute only the branch or argument they return.
    fn eval(&self, row: &[Val; 4]) -> Result<Val, ()> {
        let float = self.is_float();
        let as_f = |v: Val| match v {
            Val::I(i) => Val::F(i as f64),
            other => other,
        };
        Ok(match self {
            Gen::Col(i) => row[*i],
            Gen::Int(v) => Val::I(*v),
            Gen::Float(v) => Val::F(*v),
            Gen::Neg(a) => match a.eval(row)? {
                Val::I(i) => Val::I(i.checked_neg().ok_or(())?),
                Val::F(f) => Val::F(-f),
                Val::Null => Val::Null,
            },
            Gen::Abs(a) => match a.eval(row)? {
                Val::I(i) => Val::I(i.checked_abs().ok_or(())?),
                Val::F(f) => Val::F(f.abs()),
                Val::Null => Val::Null,
            },
            Gen::Coalesce(a, b) => {
                // The second argument is computed only when the first is null.
                let x = a.eval(row)?;
                let v = if x == Val::Null { b.eval(row)? } else { x };
                if float { as_f(v) } else { v }
            }
            Gen::Case(a, b, t, e) => {
                let (x, y) = (a.eval(row)?, b.eval(row)?);
                let gt = match (as_f(x), as_f(y), x, y) {
                    (_, _, Val::I(p), Val::I(q)) => Some(p > q),
                    (Val::F(p), Val::F(q), _, _) => Some(p > q),
                    _ => None,
                };
                let v = if gt == Some(true) { t.eval(row)? } else { e.eval(row)? };
                if float { as_f(v) } else { v }
            }
            Gen::Bin(op, a, b) => {
                let (x, y) = (a.eval(row)?, b.eval(row)?);
                match (x, y) {
                    (Val::Null, _) | (_, Val::Null) => Val::Null,
                    (Val::I(p), Val::I(q)) => Val::I(
                        match *op {
                            "+" => p.checked_add(q),
                            "-" => p.checked_sub(q),
                            "*" => p.checked_mul(q),
                            "/" => p.checked_div(q),
                            // The remainder of MIN by -1 is 0: nothing overflows.
                            _ => (q != 0).then(|| p.wrapping_rem(q)),
                        }
                        .ok_or(())?,
                    ),
                    (p, q) => {
                        let (Val::F(p), Val::F(q)) = (as_f(p), as_f(q)) else { unreachable!() };
                        Val::F(match *op {
                            "+" => p + q,
                            "-" => p - q,
                            "*" => p * q,
                            "/" if q == 0.0 => return Err(()),
                            "/" => p / q,
                            _ if q == 0.0 => return Err(()),
                            _ => p % q,
                        })
                    }
                }
            }
        })
    }
}

/// The engine against the hand oracle above over random expressions and rows with
/// nulls, zeros, negatives and extremes: the same value (floats bit for bit) or null
/// where the oracle's row fails, with the failures counted.
#[test]
fn random_arithmetic_agrees_with_a_hand_evaluator() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let ints_pool = [None, Some(0), Some(1), Some(-1), Some(5), Some(-12), Some(i64::MAX), Some(i64::MIN)];
    let floats_pool = [None, Some(0.0), Some(-0.0), Some(1.5), Some(-3.25), Some(1e308), Some(f64::MIN_POSITIVE)];
    let n = 64;
    let pick_i = |rng: &mut rand::rngs::StdRng| ints_pool[rng.random_range(0..ints_pool.len())];
    let pick_f = |rng: &mut rand::rngs::StdRng| floats_pool[rng.random_range(0..floats_pool.len())];
    let a: Vec<Option<i64>> = (0..n).map(|_| pick_i(&mut rng)).collect();
    let b: Vec<Option<i64>> = (0..n).map(|_| pick_i(&mut rng)).collect();
    let x: Vec<Option<f64>> = (0..n).map(|_| pick_f(&mut rng)).collect();
    let y: Vec<Option<f64>> = (0..n).map(|_| pick_f(&mut rng)).collect();
    let batch = batch(&a, &b, &x, &y, &vec![None; n]);
    let mut checked = 0;
    for _ in 0..400 {
        let g = Gen::random(&mut rng, 3);
        let dtype = if g.is_float() { DataType::Float64 } else { DataType::Int64 };
        let program = match compile(dtype.clone(), &g.sql()) {
            Ok(p) => p,
            // Constant folding at planning can fail the whole expression (a literal
            // overflow): refused at apply, which is what a user would want.
            Err(e) if e.reason.contains("Overflow") || e.reason.contains("overflow") || e.reason.contains("Divide by zero") => continue,
            Err(e) => panic!("{}: {e}", g.sql()),
        };
        let done = program.evaluate(&batch).unwrap();
        let mut want_failed = 0;
        for r in 0..n {
            let row = [
                a[r].map_or(Val::Null, Val::I),
                b[r].map_or(Val::Null, Val::I),
                x[r].map_or(Val::Null, Val::F),
                y[r].map_or(Val::Null, Val::F),
            ];
            let want = g.eval(&row).unwrap_or_else(|()| {
                want_failed += 1;
                Val::Null
            });
            let got = if dtype == DataType::Float64 {
                floats(&done.columns[0])[r].map_or(Val::Null, Val::F)
            } else {
                ints(&done.columns[0])[r].map_or(Val::Null, Val::I)
            };
            let same = match (want, got) {
                (Val::F(p), Val::F(q)) => p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                (Val::I(p), Val::F(q)) => (p as f64).to_bits() == q.to_bits(),
                (p, q) => p == q,
            };
            assert!(same, "{}: row {r} {row:?}: want {want:?}, got {got:?}", g.sql());
        }
        assert_eq!(done.failed[0], want_failed, "{}", g.sql());
        checked += 1;
    }
    assert!(checked > 300, "only {checked} expressions compiled");
}

/// Dense failures — a third of the divisors zero, an overflow, a text that is no number
/// — are null for their rows alone and counted once, whether found where they fail
/// (a division every row reaches) or by splitting the batch (one under a CASE); each
/// value equals the row's value computed alone.
#[test]
fn dense_failures_are_null_for_their_rows_alone() {
    let n = 900;
    let a: Vec<Option<i64>> = (0..n)
        .map(|i| {
            if i == 5 {
                Some(i64::MIN)
            } else if i % 7 == 0 {
                None
            } else {
                Some(i as i64 - 300)
            }
        })
        .collect();
    let b: Vec<Option<i64>> = (0..n).map(|i| if i == 5 { Some(-1) } else { Some(i as i64 % 3) }).collect();
    let x: Vec<Option<f64>> = (0..n).map(|i| Some(i as f64 * 0.5)).collect();
    let y: Vec<Option<f64>> = (0..n).map(|i| if i % 4 == 0 { Some(-0.0) } else { Some((i % 5) as f64) }).collect();
    let s: Vec<Option<&str>> = (0..n).map(|i| if i % 10 == 0 { Some("x") } else { Some("12") }).collect();
    let batch = batch(&a, &b, &x, &y, &s);
    for expr in [
        "v.a / v.b",
        "(v.a / v.b) + 1",
        "v.a % v.b",
        "v.x / v.y",
        "CAST(v.s AS BIGINT) * 2 + v.a / v.b",
        "CASE WHEN v.x > 100 THEN v.a / v.b ELSE 0 END",
        "COALESCE(v.a / v.b, 7)",
        "abs(v.a / v.b)",
    ] {
        let dtype = if expr.contains("v.x / v.y") { DataType::Float64 } else { DataType::Int64 };
        let program = compile(dtype.clone(), expr).unwrap();
        let whole = program.evaluate(&batch).unwrap();
        let mut failed = 0;
        for r in 0..n {
            let alone = program.evaluate(&batch.slice(r, 1)).unwrap();
            failed += alone.failed[0];
            let (got, want) = (whole.columns[0].slice(r, 1), alone.columns[0].clone());
            assert_eq!(got.to_data(), want.to_data(), "{expr}: row {r}");
        }
        assert_eq!(whole.failed[0], failed, "{expr}: values not computed");
        assert!(failed > 0 || expr.starts_with("COALESCE"), "{expr}: the data makes some rows fail");
    }
}

/// Columns `x0` to `x9` (float64), `n` (int64) and `k` (int64), all bare.
fn short_columns() -> Vec<Column> {
    let mut out: Vec<Column> = (0..10).map(|i| Column::bare(format!("x{i}"), DataType::Float64)).collect();
    out.push(Column::bare("n", DataType::Int64));
    out.push(Column::bare("k", DataType::Int64));
    out
}

/// A batch of [`short_columns`]: `x{i}` is `rows[r] * (i + 1)`, `n` is `rows[r]` as an
/// integer, `k` from `k`.
fn short_batch(program: &Program, rows: &[f64], k: &[i64]) -> RecordBatch {
    let mut arrays: Vec<ArrayRef> =
        (0..10).map(|i| Arc::new(Float64Array::from(rows.iter().map(|r| r * (i + 1) as f64).collect::<Vec<_>>())) as ArrayRef).collect();
    arrays.push(Arc::new(Int64Array::from(rows.iter().map(|r| *r as i64).collect::<Vec<_>>())));
    arrays.push(Arc::new(Int64Array::from(k.to_vec())));
    RecordBatch::try_new(program.input_schema().clone(), arrays).unwrap()
}

/// Issue 53: a chain of one operator is one level, however long: a 1,000-term linear
/// score and a 2,000-term sum compile, and compute in a loop — on a thread with a small
/// stack, bit for bit the left-to-right sum a hand evaluation gives.
#[test]
fn long_chains_of_one_operator_compile_and_compute_in_a_loop() {
    // Weights of a quarter each, from -2.5 to 2.5: `0.125+1.75*x0-2.25*x1+...`.
    let weights: Vec<f64> = (0..1_000).map(|t| ((t * 37) % 21) as f64 / 4.0 - 2.5).collect();
    let score = std::iter::once("0.125".to_string())
        .chain(weights.iter().enumerate().map(|(t, w)| format!("{w:?}*x{}", t % 10)))
        .collect::<Vec<_>>()
        .join("+")
        .replace("+-", "-");
    assert!(score.len() <= MAX_EXPR_CHARS, "{} characters", score.len());
    let sum = vec!["n"; 2_000].join("+");
    let ands = std::iter::once("k <> 0 AND 10 / k > 1".to_string())
        .chain((0..700).map(|_| "k < 99".to_string()))
        .collect::<Vec<_>>()
        .join(" AND ");
    let program = Program::compile(
        &short_columns(),
        &[out("score", DataType::Float64, &score), out("sum", DataType::Int64, &sum), out("ands", DataType::Boolean, &ands)],
    )
    .unwrap_or_else(|e| panic!("{}", e.reason));
    let rows = [1.5, -2.0, 0.0, 1e300];
    let batch = short_batch(&program, &rows, &[0, 5, 20, 3]);
    // 1 MiB of stack: a tree 2,000 deep evaluated by recursion needs more.
    let done = std::thread::Builder::new().stack_size(1 << 20).spawn(move || program.evaluate(&batch).unwrap()).unwrap().join().unwrap();
    for (r, row) in rows.iter().enumerate() {
        let mut want = 0.125f64;
        for (t, w) in weights.iter().enumerate() {
            // `a - w*x` where the text says `- w*x` for a negative weight: the same value.
            let x = row * ((t % 10) + 1) as f64;
            want = if *w < 0.0 { want - (-w) * x } else { want + w * x };
        }
        let got = floats(&done.columns[0])[r].unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "row {r}: {got} against {want}");
    }
    // 2,000 times `n`; i64::MAX (1e300 as an integer) overflows: null, counted.
    assert_eq!(ints(&done.columns[1]), [Some(2_000), Some(-4_000), Some(0), None]);
    assert_eq!(done.failed[1], 1);
    // An AND computes its right side only where its left does not decide: `10 / k` of
    // k = 0 is never computed, so no row fails.
    let ands: Vec<Option<bool>> = done.columns[2].as_any().downcast_ref::<BooleanArray>().unwrap().iter().collect();
    assert_eq!(ands, [Some(false), Some(true), Some(false), Some(true)]);
    assert_eq!(done.failed[2], 0);
}

/// Issue 53: nesting is bounded by levels, not by the parser: 50 parentheses and 40
/// nested CASE compile; 101 levels are refused in one sentence, without repeating the
/// expression.
#[test]
fn nesting_is_refused_past_its_bound_in_one_sentence() {
    let parens = format!("{}v.a + 1{}", "(".repeat(50), ")".repeat(50));
    let b = batch(&[Some(1), Some(2)], &[None; 2], &[None; 2], &[None; 2], &[None; 2]);
    assert_eq!(ints(&one(DataType::Int64, &parens, &b).0), [Some(2), Some(3)]);
    let case = |depth: usize| format!("{}v.a{}", "CASE WHEN v.a > 0 THEN ".repeat(depth), " ELSE 0 END".repeat(depth));
    assert_eq!(ints(&one(DataType::Int64, &case(40), &b).0), [Some(1), Some(2)]);
    for deep in [case(100), format!("{}v.a{}", "abs(".repeat(150), ")".repeat(150)), format!("{}1{}", "(".repeat(3_000), ")".repeat(3_000))]
    {
        let err = compile(DataType::Int64, &deep).map(|_| ()).unwrap_err();
        assert!(err.reason.starts_with("the expression nests more than 100 levels deep ("), "{}", err.reason);
        assert!(!err.reason.contains("RecursionLimit") && !err.reason.contains("ParserError"), "{}", err.reason);
        assert!(err.to_string().len() < 400, "the refusal repeats the expression: {err}");
        assert!(err.expr.ends_with('…') && err.expr.chars().count() == 81, "{}", err.expr);
    }
    let long = vec!["v.a"; 6_500].join("+");
    let err = compile(DataType::Int64, &long).map(|_| ()).unwrap_err();
    assert_eq!(err.reason, "the expression is 25999 characters long; at most 10000 are allowed");
    assert!(err.to_string().len() < 300, "{err}");
}

/// Issue 53: a request field named like an input's feature — `amount` beside
/// `stats.amount` — is the bare name; the qualified one is the stored feature; a bare
/// name no bare column has is the one feature of that name, and one that more than one
/// input has is refused naming both.
#[test]
fn a_bare_name_is_the_bare_column_beside_a_qualified_one_of_that_name() {
    let columns = [
        Column::qualified("stats", "amount", DataType::Int64),
        Column::qualified("stats", "rate", DataType::Float64),
        Column::qualified("other", "amount", DataType::Int64),
        Column::bare("amount", DataType::Float64),
        Column::bare("request_time", ts()),
    ];
    let program = Program::compile(
        &columns,
        &[
            out("request", DataType::Float64, "amount * 2"),
            out("stored", DataType::Int64, "stats.amount + 1"),
            out("both", DataType::Float64, "amount - stats.amount - other.amount + rate"),
        ],
    )
    .unwrap_or_else(|e| panic!("{}: {}", e.feature, e.reason));
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![10, 20])),
        Arc::new(Float64Array::from(vec![0.5, 0.25])),
        Arc::new(Int64Array::from(vec![100, 200])),
        Arc::new(Float64Array::from(vec![1.5, 2.5])),
        Arc::new(TimestampMicrosecondArray::from(vec![0i64, 0]).with_timezone("UTC")),
    ];
    let batch = RecordBatch::try_new(program.input_schema().clone(), arrays).unwrap();
    let done = program.evaluate(&batch).unwrap();
    assert_eq!(floats(&done.columns[0]), [Some(3.0), Some(5.0)]);
    assert_eq!(ints(&done.columns[1]), [Some(11), Some(21)]);
    assert_eq!(floats(&done.columns[2]), [Some(1.5 - 10.0 - 100.0 + 0.5), Some(2.5 - 20.0 - 200.0 + 0.25)]);
    // Each output reads what it names, by its position in the columns given.
    assert_eq!((program.reads(0), program.reads(1), program.reads(2)), (vec![3], vec![0], vec![0, 1, 2, 3]));
    let without_bare = &columns[..3];
    let err = Program::compile(without_bare, &[out("f", DataType::Int64, "amount + 1")]).map(|_| ()).unwrap_err();
    assert_eq!((err.feature.as_str(), err.expr.as_str()), ("f", "amount + 1"));
    assert!(err.reason.contains("`amount` is a feature of more than one input: write `stats.amount` or `other.amount`"), "{}", err.reason);
}

/// Issue 53: refusals of the text are sentences — where it stops parsing, a function
/// named as written with the language's own, an article that agrees.
#[test]
fn refusals_of_the_text_are_sentences() {
    let reason = |expr: &str| compile(DataType::Int64, expr).map(|_| ()).unwrap_err().reason;
    let err = reason("v.a v.b");
    assert!(err.starts_with("it does not parse at line 1, column 5: expected end of expression, found `v"), "{err}");
    let err = reason("v.a +\n  ");
    assert!(err.starts_with("it does not parse at line 2, column ") && err.contains("found the end of the expression"), "{err}");
    let err = reason("'open");
    assert!(err.starts_with("it does not parse at line 1, column "), "{err}");
    for err in [reason("v.a v.b"), reason("v.a +"), reason("'open")] {
        assert!(!err.contains("ParserError") && !err.contains("\"") && !err.contains("Line:"), "{err}");
    }
    let err = reason("frobnicate(v.a)");
    assert!(err.starts_with("unknown function `frobnicate` (the functions of the expression language: abs, "), "{err}");
    assert!(!err.contains("Invalid function"), "{err}");
    let err = compile(DataType::Utf8, "trim(v.s)").map(|_| ()).unwrap_err().reason;
    assert!(err.starts_with("the function `trim` is not part of the expression language (its functions: abs, "), "{err}");
    assert!(!err.contains("btrim"), "{err}");
    let err = compile(DataType::Utf8, "TRIM(v.s)").map(|_| ()).unwrap_err().reason;
    assert!(err.starts_with("the function `TRIM` is not part"), "{err}");
    assert_eq!(reason("v.x * 2"), "computes float64, which an int64 feature cannot hold");
    assert_eq!(compile(DataType::Float64, "v.s").map(|_| ()).unwrap_err().reason, "computes string, which a float64 feature cannot hold");
}
