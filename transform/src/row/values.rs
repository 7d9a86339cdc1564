//! The values the row evaluator computes itself, as Arrow's kernels and DataFusion
//! compute each element: comparisons, arithmetic, widening casts, a value's type, and
//! an output's value as its declared type.

use std::borrow::Cow;
use std::sync::LazyLock;

use arrow::compute::CastOptions;
use arrow::datatypes::{ArrowNativeTypeOp, DataType, TimeUnit};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::Operator;

use super::{Result, Value};

/// Whether Arrow casts `from` to `to` exactly, with `as`, for every value.
pub(super) fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    from == to
        || matches!((from, to), (Int8 | Int16 | Int32, Int64) | (Int8 | Int16, Int32) | (Float32, Float64))
        || matches!((from, to), (Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64, Float64))
        || matches!((from, to), (Duration(_), Int64))
}

/// `v`, its NaN the one NaN.
pub(super) fn one_nan(v: Value<'_>) -> Value<'_> {
    match v.as_ref() {
        ScalarValue::Float64(Some(x)) if x.is_nan() => Cow::Owned(ScalarValue::Float64(Some(f64::NAN))),
        ScalarValue::Float32(Some(x)) if x.is_nan() => Cow::Owned(ScalarValue::Float32(Some(f32::NAN))),
        _ => v,
    }
}

pub(super) fn is_true(v: &ScalarValue) -> bool {
    matches!(v, ScalarValue::Boolean(Some(true)))
}

/// Whether `v` is of type `dtype` (the common types without building a `DataType`).
pub(super) fn of_type(v: &ScalarValue, dtype: &DataType) -> bool {
    use ScalarValue as S;
    match (v, dtype) {
        (S::Float64(_), DataType::Float64)
        | (S::Float32(_), DataType::Float32)
        | (S::Int64(_), DataType::Int64)
        | (S::Int32(_), DataType::Int32)
        | (S::Boolean(_), DataType::Boolean)
        | (S::Utf8(_), DataType::Utf8) => true,
        (S::TimestampMicrosecond(_, zone), DataType::Timestamp(TimeUnit::Microsecond, want)) => zone.as_deref() == want.as_deref(),
        (S::Float64(_) | S::Float32(_) | S::Int64(_) | S::Int32(_) | S::Boolean(_) | S::Utf8(_), _) => false,
        _ => &v.data_type() == dtype,
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
pub(super) fn compare(op: Operator, l: &ScalarValue, r: &ScalarValue, zeros_equal: bool) -> Option<ScalarValue> {
    use ScalarValue as S;
    fn ord<T: ArrowNativeTypeOp>(op: Operator, a: T, b: T) -> bool {
        match op {
            Operator::Eq => a.is_eq(b),
            Operator::NotEq => a.is_ne(b),
            Operator::Lt => a.is_lt(b),
            Operator::LtEq => a.is_le(b),
            Operator::Gt => a.is_gt(b),
            _ => a.is_ge(b),
        }
    }
    fn with<T: Copy>(op: Operator, a: Option<T>, b: Option<T>, f: impl Fn(Operator, T, T) -> bool) -> ScalarValue {
        ScalarValue::Boolean(a.zip(b).map(|(a, b)| f(op, a, b)))
    }
    Some(match (l, r) {
        (S::Int64(a), S::Int64(b)) => with(op, *a, *b, ord),
        (S::Int32(a), S::Int32(b)) => with(op, *a, *b, ord),
        (S::Float64(a), S::Float64(b)) => {
            let zero = |x: Option<f64>| x.map(|x| if zeros_equal && x == 0.0 { 0.0 } else { x });
            with(op, zero(*a), zero(*b), ord)
        }
        (S::Float32(a), S::Float32(b)) => {
            let zero = |x: Option<f32>| x.map(|x| if zeros_equal && x == 0.0 { 0.0 } else { x });
            with(op, zero(*a), zero(*b), ord)
        }
        (S::Boolean(a), S::Boolean(b)) => with(op, *a, *b, |op, a: bool, b: bool| ord(op, u8::from(a), u8::from(b))),
        (S::Utf8(a), S::Utf8(b)) => {
            ScalarValue::Boolean(a.as_deref().zip(b.as_deref()).map(|(a, b)| ord_bytes(op, a.as_bytes(), b.as_bytes())))
        }
        (S::TimestampMicrosecond(a, za), S::TimestampMicrosecond(b, zb)) if za == zb => with(op, *a, *b, ord),
        _ => return None,
    })
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
/// overflow or a zero divisor fails the row; `%` by -1 wraps), floats as IEEE.
pub(super) fn arithmetic(op: Operator, l: &ScalarValue, r: &ScalarValue) -> Option<Result<ScalarValue>> {
    use ScalarValue as S;
    /// Integers checked, floats as IEEE; `/` and `%` of floats are never here (the
    /// plan's float division).
    fn numeric<T: ArrowNativeTypeOp>(
        op: Operator,
        a: Option<T>,
        b: Option<T>,
        integer: bool,
    ) -> Option<std::result::Result<Option<T>, arrow::error::ArrowError>> {
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
            .map(Some),
        )
    }
    let arrow = |e: arrow::error::ArrowError| DataFusionError::ArrowError(Box::new(e), None);
    match (l, r) {
        (S::Int64(a), S::Int64(b)) => numeric(op, *a, *b, true).map(|v| v.map(S::Int64).map_err(arrow)),
        (S::Int32(a), S::Int32(b)) => numeric(op, *a, *b, true).map(|v| v.map(S::Int32).map_err(arrow)),
        (S::Float64(a), S::Float64(b)) => numeric(op, *a, *b, false).map(|v| v.map(S::Float64).map_err(arrow)),
        (S::Float32(a), S::Float32(b)) => numeric(op, *a, *b, false).map(|v| v.map(S::Float32).map_err(arrow)),
        (S::TimestampMicrosecond(a, za), S::TimestampMicrosecond(b, zb)) if op == Operator::Minus && za == zb => {
            let (Some(a), Some(b)) = (a, b) else { return Some(Ok(S::DurationMicrosecond(None))) };
            Some(a.sub_checked(*b).map(|d| S::DurationMicrosecond(Some(d))).map_err(arrow))
        }
        _ => None,
    }
}

/// `v` cast to `to` where Arrow casts with `as` ([`widens`]).
pub(super) fn widen(v: &ScalarValue, to: &DataType) -> Result<ScalarValue> {
    use ScalarValue as S;
    if of_type(v, to) {
        return Ok(v.clone());
    }
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
        DataType::Int64 => S::Int64(int(v).ok_or_else(|| cannot(v, to))?),
        DataType::Int32 => match v {
            S::Int8(x) => S::Int32(x.map(i32::from)),
            S::Int16(x) => S::Int32(x.map(i32::from)),
            _ => return Err(cannot(v, to)),
        },
        DataType::Float64 => S::Float64(match v {
            S::Float32(x) => x.map(f64::from),
            S::UInt8(x) => x.map(f64::from),
            S::UInt16(x) => x.map(f64::from),
            S::UInt32(x) => x.map(f64::from),
            S::UInt64(x) => x.map(|x| x as f64),
            other => int(other).ok_or_else(|| cannot(v, to))?.map(|x| x as f64),
        }),
        _ => return Err(cannot(v, to)),
    })
}

pub(super) fn cannot(v: &ScalarValue, to: &DataType) -> DataFusionError {
    DataFusionError::Internal(format!("widening {} to {to}", v.data_type()))
}

/// `v` (an output's value) as the output's declared type, as the vectorized path casts
/// its column (Arrow's default options: a value that does not fit is null).
pub(crate) fn declared(v: Value<'_>, dtype: &DataType) -> Result<ScalarValue> {
    if of_type(&v, dtype) {
        return Ok(v.into_owned());
    }
    static OPTIONS: LazyLock<CastOptions<'static>> = LazyLock::new(CastOptions::default);
    v.cast_to_with_options(dtype, &OPTIONS)
}

/// The null of `dtype`.
pub(crate) fn null_of(dtype: &DataType) -> ScalarValue {
    ScalarValue::try_from(dtype).unwrap_or(ScalarValue::Null)
}
