//! The values the row evaluator computes itself, as Arrow's kernels and DataFusion
//! compute each element: comparisons, arithmetic, widening casts, a value's type, and
//! an output's value as its declared type.

use std::sync::LazyLock;

use arrow::compute::CastOptions;
use arrow::datatypes::{ArrowNativeTypeOp, DataType, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;

use super::cell::{Cell, Computed, Failed};

/// Whether Arrow casts `from` to `to` exactly, with `as`, for every value.
pub(super) fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    from == to
        || matches!((from, to), (Int8 | Int16 | Int32, Int64) | (Int8 | Int16, Int32) | (Float32, Float64))
        || matches!((from, to), (Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64, Float64))
        || matches!((from, to), (Duration(_), Int64))
}

/// `v`, its NaN the one NaN.
pub(super) fn one_nan(v: Cell<'_>) -> Cell<'_> {
    match v {
        Cell::F64(Some(x)) if x.is_nan() => Cell::F64(Some(f64::NAN)),
        Cell::F32(Some(x)) if x.is_nan() => Cell::F32(Some(f32::NAN)),
        v => v,
    }
}

pub(super) fn is_true(v: &Cell<'_>) -> bool {
    matches!(v, Cell::Bool(Some(true)))
}

/// Whether `v` is of type `dtype` (the common types without building a `DataType`).
pub(super) fn of_type(v: &Cell<'_>, dtype: &DataType) -> bool {
    match (v, dtype) {
        (Cell::F64(_), DataType::Float64)
        | (Cell::F32(_), DataType::Float32)
        | (Cell::I64(_), DataType::Int64)
        | (Cell::I32(_), DataType::Int32)
        | (Cell::Bool(_), DataType::Boolean)
        | (Cell::Str(_), DataType::Utf8)
        | (Cell::Duration(_), DataType::Duration(TimeUnit::Microsecond)) => true,
        (Cell::Ts(_, zone), DataType::Timestamp(TimeUnit::Microsecond, want)) => zone.as_deref() == want.as_deref(),
        (Cell::Other(v), _) => &v.data_type() == dtype,
        (Cell::Owned(v), _) => &v.data_type() == dtype,
        _ => false,
    }
}

pub(super) fn is_comparison(op: Operator) -> bool {
    matches!(op, Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq)
}

/// `l op r` for two values of one type Arrow compares element by element as here
/// (`None`: other types, left to DataFusion's code). Floats in Arrow's total order
/// (NaN equals NaN and is greatest, -0.0 is below 0.0) — with `zeros_equal`, -0.0 taken
/// as 0.0 first, as DataFusion's comparison operators do (its `CASE x WHEN v` does
/// not); strings by their bytes.
pub(super) fn compare<'a>(op: Operator, l: &Cell<'_>, r: &Cell<'_>, zeros_equal: bool) -> Option<Cell<'a>> {
    fn with<'a, T: Copy>(op: Operator, a: Option<T>, b: Option<T>, f: impl Fn(Operator, T, T) -> bool) -> Cell<'a> {
        Cell::Bool(a.zip(b).map(|(a, b)| f(op, a, b)))
    }
    Some(match (l, r) {
        (Cell::I64(a), Cell::I64(b)) => with(op, *a, *b, ord),
        (Cell::I32(a), Cell::I32(b)) => with(op, *a, *b, ord),
        (Cell::F64(a), Cell::F64(b)) => {
            let zero = |x: Option<f64>| x.map(|x| if zeros_equal && x == 0.0 { 0.0 } else { x });
            with(op, zero(*a), zero(*b), ord)
        }
        (Cell::F32(a), Cell::F32(b)) => {
            let zero = |x: Option<f32>| x.map(|x| if zeros_equal && x == 0.0 { 0.0 } else { x });
            with(op, zero(*a), zero(*b), ord)
        }
        (Cell::Bool(a), Cell::Bool(b)) => with(op, *a, *b, |op, a: bool, b: bool| ord(op, u8::from(a), u8::from(b))),
        (Cell::Str(a), Cell::Str(b)) => Cell::Bool(a.as_deref().zip(b.as_deref()).map(|(a, b)| ord_bytes(op, a.as_bytes(), b.as_bytes()))),
        (Cell::Ts(a, za), Cell::Ts(b, zb)) if za == zb => with(op, *a, *b, ord),
        _ => return None,
    })
}

/// `a op b` in Arrow's order of `T` (floats: total, NaN greatest).
pub(super) fn ord<T: ArrowNativeTypeOp>(op: Operator, a: T, b: T) -> bool {
    match op {
        Operator::Eq => a.is_eq(b),
        Operator::NotEq => a.is_ne(b),
        Operator::Lt => a.is_lt(b),
        Operator::LtEq => a.is_le(b),
        Operator::Gt => a.is_gt(b),
        _ => a.is_ge(b),
    }
}

pub(super) fn ord_bytes(op: Operator, a: &[u8], b: &[u8]) -> bool {
    match op {
        Operator::Eq => a == b,
        Operator::NotEq => a != b,
        Operator::Lt => a < b,
        Operator::LtEq => a <= b,
        Operator::Gt => a > b,
        _ => a >= b,
    }
}

/// `l op r` for two values of one numeric type, as Arrow's kernels compute each
/// element (`None`: other types, left to DataFusion's code): integers checked (an
/// overflow or a zero divisor fails the row; `%` by -1 wraps), floats as IEEE; the
/// difference of two timestamps checked, as Arrow's.
pub(super) fn arithmetic<'a>(op: Operator, l: &Cell<'_>, r: &Cell<'_>) -> Option<Computed<Cell<'a>>> {
    /// Integers checked, floats as IEEE; `/` and `%` of floats are never here (the
    /// plan's float division).
    fn numeric<T: ArrowNativeTypeOp>(op: Operator, a: Option<T>, b: Option<T>, integer: bool) -> Option<Computed<Option<T>>> {
        let applies = matches!(op, Operator::Plus | Operator::Minus | Operator::Multiply)
            || integer && matches!(op, Operator::Divide | Operator::Modulo);
        if !applies {
            return None;
        }
        let (Some(a), Some(b)) = (a, b) else { return Some(Ok(None)) };
        Some(
            match (op, integer) {
                (Operator::Plus, true) => a.add_checked(b),
                (Operator::Minus, true) => a.sub_checked(b),
                (Operator::Multiply, true) => a.mul_checked(b),
                (Operator::Plus, false) => Ok(a.add_wrapping(b)),
                (Operator::Minus, false) => Ok(a.sub_wrapping(b)),
                (Operator::Multiply, false) => Ok(a.mul_wrapping(b)),
                (Operator::Divide, _) => a.div_checked(b),
                _ if b.is_zero() => Err(arrow::error::ArrowError::DivideByZero),
                _ => Ok(a.mod_wrapping(b)),
            }
            .map(Some)
            .map_err(Failed::from),
        )
    }
    match (l, r) {
        (Cell::I64(a), Cell::I64(b)) => numeric(op, *a, *b, true).map(|v| v.map(Cell::I64)),
        (Cell::I32(a), Cell::I32(b)) => numeric(op, *a, *b, true).map(|v| v.map(Cell::I32)),
        (Cell::F64(a), Cell::F64(b)) => numeric(op, *a, *b, false).map(|v| v.map(Cell::F64)),
        (Cell::F32(a), Cell::F32(b)) => numeric(op, *a, *b, false).map(|v| v.map(Cell::F32)),
        (Cell::Ts(a, za), Cell::Ts(b, zb)) if op == Operator::Minus && za == zb => {
            let (Some(a), Some(b)) = (a, b) else { return Some(Ok(Cell::Duration(None))) };
            Some(a.sub_checked(*b).map(|d| Cell::Duration(Some(d))).map_err(Failed::from))
        }
        _ => None,
    }
}

/// `upper(s)` or `lower(s)`: Unicode's case mapping, as DataFusion's.
pub(super) fn letters(s: &str, upper: bool) -> String {
    if upper { s.to_uppercase() } else { s.to_lowercase() }
}

/// `v` cast to `to` where Arrow casts with `as` ([`widens`]).
pub(super) fn widen<'a>(v: Cell<'a>, to: &DataType) -> Computed<Cell<'a>> {
    if of_type(&v, to) {
        return Ok(v);
    }
    Ok(match (to, v) {
        (DataType::Int64, Cell::I32(x)) => Cell::I64(x.map(i64::from)),
        (DataType::Int64, Cell::Duration(x)) => Cell::I64(x),
        (DataType::Float64, Cell::F32(x)) => Cell::F64(x.map(f64::from)),
        (DataType::Float64, Cell::I32(x)) => Cell::F64(x.map(f64::from)),
        (DataType::Float64, Cell::I64(x) | Cell::Duration(x)) => Cell::F64(x.map(|x| x as f64)),
        (_, Cell::Other(v)) => Cell::owned(widen_scalar(v, to)?),
        (_, Cell::Owned(v)) => Cell::owned(widen_scalar(&v, to)?),
        _ => return Err(Failed),
    })
}

/// [`widen`] of a value of a type not held inline.
fn widen_scalar(v: &ScalarValue, to: &DataType) -> Computed<ScalarValue> {
    use ScalarValue as S;
    let int = |v: &S| -> Option<Option<i64>> {
        Some(match v {
            S::Int8(x) => x.map(i64::from),
            S::Int16(x) => x.map(i64::from),
            S::Int32(x) => x.map(i64::from),
            S::Int64(x) => *x,
            S::DurationSecond(x) | S::DurationMillisecond(x) | S::DurationMicrosecond(x) | S::DurationNanosecond(x) => *x,
            _ => return None,
        })
    };
    Ok(match to {
        DataType::Int64 => S::Int64(int(v).ok_or(Failed)?),
        DataType::Int32 => match v {
            S::Int8(x) => S::Int32(x.map(i32::from)),
            S::Int16(x) => S::Int32(x.map(i32::from)),
            _ => return Err(Failed),
        },
        DataType::Float64 => S::Float64(match v {
            S::Float32(x) => x.map(f64::from),
            S::UInt8(x) => x.map(f64::from),
            S::UInt16(x) => x.map(f64::from),
            S::UInt32(x) => x.map(f64::from),
            S::UInt64(x) => x.map(|x| x as f64),
            other => int(other).ok_or(Failed)?.map(|x| x as f64),
        }),
        _ => return Err(Failed),
    })
}

/// `v` (an output's value) as the output's declared type, as the vectorized path casts
/// its column (Arrow's default options: a value that does not fit is null).
pub(crate) fn declared(v: Cell<'_>, dtype: &DataType) -> Computed<ScalarValue> {
    if of_type(&v, dtype) {
        return Ok(v.into_scalar());
    }
    static OPTIONS: LazyLock<CastOptions<'static>> = LazyLock::new(CastOptions::default);
    Ok(v.into_scalar().cast_to_with_options(dtype, &OPTIONS)?)
}

/// The null of `dtype`.
pub(crate) fn null_of(dtype: &DataType) -> ScalarValue {
    ScalarValue::try_from(dtype).unwrap_or(ScalarValue::Null)
}
