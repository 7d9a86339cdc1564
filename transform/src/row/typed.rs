//! The row evaluator's plan with its types known: each operation over floats, integers,
//! booleans, strings and timestamps compiled to a function of the row returning its
//! value unboxed (an `Option<f64>` in two registers, not a [`Cell`] in memory), the
//! operations of the commonest types the cost of their arithmetic. What it does is
//! what [`Node::evaluate`] does for the same node — the same element functions, the
//! same order, the same short circuits and failures — and every node it has no typed
//! form for is computed by [`Node::evaluate`] itself. The differential fuzzer holds
//! it, like the rest, equal to DataFusion.

use std::sync::Arc;

use arrow::datatypes::{ArrowNativeTypeOp, DataType, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;

use super::cell::{Cell, Computed, Failed};
use super::values::{is_comparison, letters, ord, ord_bytes};
use super::{Binary, Case, Node};

type Row<'a> = &'a [ScalarValue];
type Of<T> = Op<T>;
type RowFn<T> = Arc<dyn Fn(Row<'_>) -> Computed<Option<T>> + Send + Sync>;
type StrFn = Arc<dyn for<'a> Fn(Row<'a>) -> Computed<Option<Text<'a>>> + Send + Sync>;

/// A typed operation: a column or a literal read where it is used (most operands are
/// one), any other a function of the row.
#[derive(Clone)]
pub(crate) enum Op<T> {
    Column(usize),
    /// A timestamp column (microseconds).
    Micros(usize),
    Literal(Option<T>),
    Fn(RowFn<T>),
}

/// A type held unboxed: how a row's value of it is read.
pub(crate) trait Native: Copy + 'static {
    fn read(v: &ScalarValue) -> Option<Option<Self>>;

    fn read_micros(_: &ScalarValue) -> Option<Option<Self>> {
        None
    }
}

impl Native for f64 {
    fn read(v: &ScalarValue) -> Option<Option<f64>> {
        if let ScalarValue::Float64(x) = v { Some(*x) } else { None }
    }
}

impl Native for i64 {
    fn read(v: &ScalarValue) -> Option<Option<i64>> {
        if let ScalarValue::Int64(x) = v { Some(*x) } else { None }
    }

    fn read_micros(v: &ScalarValue) -> Option<Option<i64>> {
        if let ScalarValue::TimestampMicrosecond(x, _) = v { Some(*x) } else { None }
    }
}

impl Native for bool {
    fn read(v: &ScalarValue) -> Option<Option<bool>> {
        if let ScalarValue::Boolean(x) = v { Some(*x) } else { None }
    }
}

impl<T: Native> Op<T> {
    /// The value for `row` (the row's values are of its columns' types).
    #[inline(always)]
    fn get(&self, row: Row<'_>) -> Computed<Option<T>> {
        match self {
            Op::Column(i) => T::read(&row[*i]).ok_or(Failed),
            Op::Micros(i) => T::read_micros(&row[*i]).ok_or(Failed),
            Op::Literal(x) => Ok(*x),
            Op::Fn(f) => f(row),
        }
    }
}
/// A typed string operation, as [`Op`].
#[derive(Clone)]
pub(crate) enum OfStr {
    Column(usize),
    Literal(Option<Arc<str>>),
    Fn(StrFn),
}

impl OfStr {
    #[inline(always)]
    fn get<'a>(&self, row: Row<'a>) -> Computed<Option<Text<'a>>> {
        match self {
            OfStr::Column(i) => match &row[*i] {
                ScalarValue::Utf8(x) => Ok(x.as_deref().map(Text::Row)),
                _ => Err(Failed),
            },
            OfStr::Literal(x) => Ok(x.clone().map(Text::Literal)),
            OfStr::Fn(f) => f(row),
        }
    }
}

/// A string: read from the row, a literal of the plan (shared: a function of the row
/// cannot lend what it holds), or computed.
pub(crate) enum Text<'a> {
    Row(&'a str),
    Literal(Arc<str>),
    Owned(String),
}

impl Text<'_> {
    fn as_str(&self) -> &str {
        match self {
            Text::Row(s) => s,
            Text::Literal(s) => s,
            Text::Owned(s) => s,
        }
    }

    fn into_string(self) -> String {
        match self {
            Text::Row(s) => s.to_owned(),
            Text::Literal(s) => String::from(&*s),
            Text::Owned(s) => s,
        }
    }
}

/// An operation of the plan, compiled for its type.
#[derive(Clone)]
pub(crate) enum Typed {
    F64(Of<f64>),
    I64(Of<i64>),
    Bool(Of<bool>),
    Str(OfStr),
    /// Microseconds, in the zone of the type.
    Ts(Of<i64>, Option<Arc<str>>),
    /// A duration in microseconds.
    Duration(Of<i64>),
    /// Any other: computed by [`Node::evaluate`].
    Node(Arc<Node>),
}

impl std::fmt::Debug for Typed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Typed::F64(_) => "Typed::F64",
            Typed::I64(_) => "Typed::I64",
            Typed::Bool(_) => "Typed::Bool",
            Typed::Str(_) => "Typed::Str",
            Typed::Ts(..) => "Typed::Ts",
            Typed::Duration(_) => "Typed::Duration",
            Typed::Node(_) => "Typed::Node",
        })
    }
}

/// The one NaN, as every operation computing a float gives it.
#[inline(always)]
fn one(x: f64) -> f64 {
    if x.is_nan() { f64::NAN } else { x }
}

impl Typed {
    /// `node` (a plan over `schema`) compiled for its type.
    pub(crate) fn of(node: &Node, schema: &SchemaRef) -> Typed {
        typed(node, schema).unwrap_or_else(|| Typed::Node(Arc::new(node.clone())))
    }

    /// Pushes the value for `row` as the output's `dtype` onto `out`, when this form
    /// computes a value of that type (else `None`: the caller takes
    /// [`Node::evaluate`]'s path); nothing is pushed when it cannot be computed.
    #[inline]
    pub(crate) fn push(&self, row: Row<'_>, dtype: &DataType, out: &mut Vec<ScalarValue>) -> Option<Computed<()>> {
        let mut put = |v| {
            out.push(v);
            Ok(())
        };
        Some(match (self, dtype) {
            (Typed::F64(f), DataType::Float64) => f.get(row).and_then(|v| put(ScalarValue::Float64(v))),
            (Typed::I64(f), DataType::Int64) => f.get(row).and_then(|v| put(ScalarValue::Int64(v))),
            (Typed::Bool(f), DataType::Boolean) => f.get(row).and_then(|v| put(ScalarValue::Boolean(v))),
            (Typed::Str(f), DataType::Utf8) => f.get(row).and_then(|s| put(ScalarValue::Utf8(s.map(Text::into_string)))),
            _ => return None,
        })
    }
}

/// `f` as a typed operation (its signature fixed where the closure is written).
fn of<T, F>(f: F) -> Of<T>
where
    F: Fn(Row<'_>) -> Computed<Option<T>> + Send + Sync + 'static,
{
    Op::Fn(Arc::new(f))
}

/// `f` as a string operation.
fn text<F>(f: F) -> OfStr
where
    F: for<'a> Fn(Row<'a>) -> Computed<Option<Text<'a>>> + Send + Sync + 'static,
{
    OfStr::Fn(Arc::new(f))
}

/// `node`'s value as `T`, computed by [`Node::evaluate`].
fn by_node<T: 'static>(node: &Node, get: fn(Cell<'_>) -> Option<Option<T>>) -> Of<T> {
    let node = node.clone();
    of(move |row| get(node.evaluate(row)?).ok_or(Failed))
}

fn as_bool(c: Cell<'_>) -> Option<Option<bool>> {
    c.boolean()
}

/// `node`'s typed form, `None` where it has none.
fn typed(node: &Node, schema: &SchemaRef) -> Option<Typed> {
    Some(match node {
        Node::Column(i) => {
            let i = *i;
            match schema.field(i).data_type() {
                DataType::Float64 => Typed::F64(Op::Column(i)),
                DataType::Int64 => Typed::I64(Op::Column(i)),
                DataType::Boolean => Typed::Bool(Op::Column(i)),
                DataType::Utf8 => Typed::Str(OfStr::Column(i)),
                // The row's values are of the column's type, its zone too.
                DataType::Timestamp(TimeUnit::Microsecond, zone) => Typed::Ts(Op::Micros(i), zone.clone()),
                _ => return None,
            }
        }
        Node::Literal(v) => match v.clone() {
            ScalarValue::Float64(x) => Typed::F64(Op::Literal(x)),
            ScalarValue::Int64(x) => Typed::I64(Op::Literal(x)),
            ScalarValue::Boolean(x) => Typed::Bool(Op::Literal(x)),
            ScalarValue::Utf8(x) => {
                let x: Option<Arc<str>> = x.map(Arc::from);
                Typed::Str(OfStr::Literal(x))
            }
            ScalarValue::TimestampMicrosecond(x, zone) => Typed::Ts(Op::Literal(x), zone),
            _ => return None,
        },
        Node::Binary(b) => binary(b.op, Typed::of(&b.left, schema), b, schema)?,
        Node::Chain { first, links } => {
            let mut so_far = Typed::of(first, schema);
            for link in links {
                so_far = binary(link.op, so_far, link, schema)?;
            }
            so_far
        }
        Node::Not(n) => {
            let input = boolean(n, schema);
            Typed::Bool(of(move |row| Ok(input.get(row)?.map(|b| !b))))
        }
        Node::IsNull(n) | Node::IsNotNull(n) => {
            let null = matches!(node, Node::IsNull(_));
            let input = Typed::of(n, schema);
            Typed::Bool(of(move |row| Ok(Some(is_null(&input, row)? == null))))
        }
        Node::Case(c) => case(c, schema)?,
        Node::Widen { input, to } => {
            let input = Typed::of(input, schema);
            match (input, to) {
                (Typed::I64(f), DataType::Int64) | (Typed::Duration(f), DataType::Int64) => Typed::I64(f),
                (Typed::F64(f), DataType::Float64) => Typed::F64(f),
                (Typed::I64(f) | Typed::Duration(f), DataType::Float64) => Typed::F64(of(move |row| Ok(f.get(row)?.map(|x| x as f64)))),
                _ => return None,
            }
        }
        Node::FloatDivision { remainder, left, right } => {
            let (Typed::F64(l), Typed::F64(r)) = (Typed::of(left, schema), Typed::of(right, schema)) else { return None };
            let remainder = *remainder;
            Typed::F64(of(move |row| match (l.get(row)?, r.get(row)?) {
                (Some(x), Some(y)) => {
                    if y == 0.0 {
                        return Err(Failed);
                    }
                    Ok(Some(one(if remainder { x % y } else { x / y })))
                }
                _ => Ok(None),
            }))
        }
        Node::Letters { upper, input } => {
            let Typed::Str(input) = Typed::of(input, schema) else { return None };
            let upper = *upper;
            Typed::Str(text(move |row| Ok(input.get(row)?.map(|s| Text::Owned(letters(s.as_str(), upper))))))
        }
        Node::NullIf { left, right, .. } => match (Typed::of(left, schema), Typed::of(right, schema)) {
            // Null where equal in Arrow's order (-0.0 is not 0.0, NaN is NaN).
            (Typed::F64(l), Typed::F64(r)) => Typed::F64(of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(match (a, b) {
                    (Some(x), Some(y)) if x.is_eq(y) => None,
                    (a, _) => a.map(one),
                })
            })),
            (Typed::I64(l), Typed::I64(r)) => Typed::I64(of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(match (a, b) {
                    (Some(x), Some(y)) if x == y => None,
                    (a, _) => a,
                })
            })),
            _ => return None,
        },
        Node::InList(_) | Node::Own(_) | Node::Whole(_) => return None,
    })
}

/// Whether `t`'s value for `row` is null.
fn is_null(t: &Typed, row: Row<'_>) -> Computed<bool> {
    Ok(match t {
        Typed::F64(f) => f.get(row)?.is_none(),
        Typed::I64(f) | Typed::Duration(f) | Typed::Ts(f, _) => f.get(row)?.is_none(),
        Typed::Bool(f) => f.get(row)?.is_none(),
        Typed::Str(f) => f.get(row)?.is_none(),
        Typed::Node(n) => n.evaluate(row)?.is_null(),
    })
}

/// `node` as a boolean (a value of another type fails the row, as in [`Node::evaluate`]).
fn boolean(node: &Node, schema: &SchemaRef) -> Of<bool> {
    match Typed::of(node, schema) {
        Typed::Bool(f) => f,
        _ => by_node(node, as_bool),
    }
}

/// `left op right` (`b`'s right operand), typed where both operands are of one type
/// computed here.
fn binary(op: Operator, left: Typed, b: &Binary, schema: &SchemaRef) -> Option<Typed> {
    let right = Typed::of(&b.right, schema);
    if matches!(op, Operator::And | Operator::Or) {
        let l = match left {
            Typed::Bool(f) => f,
            Typed::Node(n) => by_node(&n, as_bool),
            _ => return None,
        };
        let r = match right {
            Typed::Bool(f) => f,
            _ => by_node(&b.right, as_bool),
        };
        let and = op == Operator::And;
        return Some(Typed::Bool(of(move |row| {
            let l = l.get(row)?;
            if l == Some(!and) {
                return Ok(l);
            }
            let r = r.get(row)?;
            if l == Some(and) {
                return Ok(r);
            }
            Ok(match (and, r) {
                (true, Some(false)) => Some(false),
                (false, Some(true)) => Some(true),
                _ => None,
            })
        })));
    }
    if is_comparison(op) {
        return Some(Typed::Bool(match (left, right) {
            (Typed::F64(l), Typed::F64(r)) => of(move |row| {
                // -0.0 taken as 0.0, then Arrow's total order.
                let zero = |x: f64| if x == 0.0 { 0.0 } else { x };
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(a.zip(b).map(|(a, b)| ord(op, zero(a), zero(b))))
            }),
            (Typed::I64(l), Typed::I64(r)) => of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(a.zip(b).map(|(a, b)| ord(op, a, b)))
            }),
            (Typed::Ts(l, za), Typed::Ts(r, zb)) if za == zb => of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(a.zip(b).map(|(a, b)| ord(op, a, b)))
            }),
            (Typed::Bool(l), Typed::Bool(r)) => of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(a.zip(b).map(|(a, b)| ord(op, u8::from(a), u8::from(b))))
            }),
            (Typed::Str(l), Typed::Str(r)) => of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(a.zip(b).map(|(a, b)| ord_bytes(op, a.as_str().as_bytes(), b.as_str().as_bytes())))
            }),
            _ => return None,
        }));
    }
    Some(match (left, right) {
        (Typed::F64(l), Typed::F64(r)) => {
            let f: fn(f64, f64) -> f64 = match op {
                Operator::Plus => |a, b| a + b,
                Operator::Minus => |a, b| a - b,
                Operator::Multiply => |a, b| a * b,
                _ => return None,
            };
            Typed::F64(of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                Ok(a.zip(b).map(|(a, b)| one(f(a, b))))
            }))
        }
        (Typed::I64(l), Typed::I64(r)) => {
            // Checked, as Arrow's kernels: an overflow or a zero divisor fails the row;
            // `%` by -1 wraps.
            let f: fn(i64, i64) -> Result<i64, arrow::error::ArrowError> = match op {
                Operator::Plus => |a, b| a.add_checked(b),
                Operator::Minus => |a, b| a.sub_checked(b),
                Operator::Multiply => |a, b| a.mul_checked(b),
                Operator::Divide => |a, b| a.div_checked(b),
                Operator::Modulo => |a, b| if b.is_zero() { Err(arrow::error::ArrowError::DivideByZero) } else { Ok(a.mod_wrapping(b)) },
                _ => return None,
            };
            Typed::I64(of(move |row| {
                let (a, b) = (l.get(row)?, r.get(row)?);
                match a.zip(b) {
                    Some((a, b)) => f(a, b).map(Some).map_err(Failed::from),
                    None => Ok(None),
                }
            }))
        }
        (Typed::Ts(l, za), Typed::Ts(r, zb)) if op == Operator::Minus && za == zb => Typed::Duration(of(move |row| {
            let (a, b) = (l.get(row)?, r.get(row)?);
            match a.zip(b) {
                Some((a, b)) => a.sub_checked(b).map(Some).map_err(Failed::from),
                None => Ok(None),
            }
        })),
        _ => return None,
    })
}

/// A `CASE` without a base whose every branch computes a value of the case's type.
fn case(c: &Case, schema: &SchemaRef) -> Option<Typed> {
    if c.base.is_some() {
        return None;
    }
    // A `WHEN` is taken where it is true; a value of another type never is.
    let whens: Vec<Of<bool>> = c
        .whens
        .iter()
        .map(|(w, _, _)| match Typed::of(w, schema) {
            Typed::Bool(f) => f,
            _ => by_node(w, |c| Some(if let Cell::Bool(b) = c { b } else { None })),
        })
        .collect();
    let mut branches: Vec<Typed> = c.whens.iter().map(|(_, t, _)| Typed::of(t, schema)).collect();
    // No `ELSE`: the null of the case's type.
    branches.push(match &c.otherwise {
        Some(e) => Typed::of(e, schema),
        None => Typed::of(&Node::Literal(c.null.clone()), schema),
    });
    // The branch the row takes: the first `WHEN` that is true, else the last.
    let taken = move |row: Row<'_>| -> Computed<usize> {
        for (k, when) in whens.iter().enumerate() {
            if when.get(row)? == Some(true) {
                return Ok(k);
            }
        }
        Ok(whens.len())
    };
    macro_rules! all {
        ($variant:ident) => {{
            let fs =
                branches.iter().map(|b| if let Typed::$variant(f) = b { Some(f.clone()) } else { None }).collect::<Option<Vec<_>>>()?;
            Typed::$variant(of(move |row| fs[taken(row)?].get(row)))
        }};
    }
    Some(match &c.dtype {
        DataType::Float64 => all!(F64),
        DataType::Int64 => all!(I64),
        DataType::Boolean => all!(Bool),
        DataType::Utf8 => {
            let fs = branches.iter().map(|b| if let Typed::Str(f) = b { Some(f.clone()) } else { None }).collect::<Option<Vec<_>>>()?;
            Typed::Str(text(move |row| fs[taken(row)?].get(row)))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, TimeUnit};

    use super::Typed;
    use crate::{Column, Output, Program};

    /// The on-demand benchmark's five expressions (bench/on_demand_serve_bench.py) each
    /// compile to a typed form: none is left to the slower node-by-node path.
    #[test]
    fn the_benchmark_expressions_are_typed() {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let mut columns: Vec<Column> = (0..5).map(|i| Column::qualified("a", format!("a{i}"), DataType::Float64)).collect();
        columns.push(Column::qualified("a", "event_timestamp", ts.clone()));
        columns.push(Column::bare("amount", DataType::Float64));
        columns.push(Column::bare("pickup_city", DataType::Utf8));
        columns.push(Column::bare("request_time", ts));
        let outputs = [
            ("ratio", DataType::Float64, "a.a0 * a.a1 + a.a2"),
            ("band", DataType::Utf8, "CASE WHEN a.a3 > 50 THEN 'high' ELSE 'low' END"),
            ("city_up", DataType::Utf8, "upper(pickup_city)"),
            ("per_amount", DataType::Float64, "amount / NULLIF(a.a4, 0)"),
            ("age_s", DataType::Float64, "date_part('epoch', request_time - a.event_timestamp)"),
        ]
        .map(|(name, dtype, expr)| Output { name: name.into(), dtype, expr: expr.into() });
        let program = Program::compile(&columns, &outputs).unwrap();
        for (output, compiled) in outputs.iter().zip(&program.outputs) {
            assert!(!matches!(compiled.typed, Typed::Node(_)), "{} is computed node by node", output.expr);
        }
    }
}
