//! The value the row evaluator passes between its operations: the types it computes
//! itself held inline (a string borrowed from the row or the plan until an operation
//! makes a new one), any other type as a [`ScalarValue`]. Thirty-two bytes, where a
//! `ScalarValue` is twice that and a `Result` of one with DataFusion's error more: moving
//! values up the plan is most of what a row costs.

use std::borrow::Cow;
use std::sync::Arc;

use datafusion::common::{DataFusionError, ScalarValue};

/// A value of one row, of the type of the operation that computed it.
#[derive(Debug, Clone)]
pub(crate) enum Cell<'a> {
    Bool(Option<bool>),
    I32(Option<i32>),
    I64(Option<i64>),
    F32(Option<f32>),
    F64(Option<f64>),
    Str(Option<Cow<'a, str>>),
    /// A timestamp in microseconds, with the zone of the value it was read from.
    Ts(Option<i64>, &'a Option<Arc<str>>),
    /// A duration in microseconds (a difference of timestamps).
    Duration(Option<i64>),
    /// A value of any other type (the null of no type too), from the row or the plan.
    Other(&'a ScalarValue),
    /// A value of any other type that an operation computed.
    Owned(Box<ScalarValue>),
}

/// A value that cannot be computed for the row: it is null and counted, whatever the
/// reason (the vectorized path counts it the same way), so no reason is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failed;

impl From<DataFusionError> for Failed {
    fn from(_: DataFusionError) -> Failed {
        Failed
    }
}

impl From<arrow::error::ArrowError> for Failed {
    fn from(_: arrow::error::ArrowError) -> Failed {
        Failed
    }
}

/// What an operation computes for a row.
pub(crate) type Computed<T> = std::result::Result<T, Failed>;

impl<'a> Cell<'a> {
    /// `v`, borrowed.
    #[inline]
    pub(crate) fn of(v: &'a ScalarValue) -> Cell<'a> {
        use ScalarValue as S;
        match v {
            S::Boolean(b) => Cell::Bool(*b),
            S::Int32(x) => Cell::I32(*x),
            S::Int64(x) => Cell::I64(*x),
            S::Float32(x) => Cell::F32(*x),
            S::Float64(x) => Cell::F64(*x),
            S::Utf8(s) => Cell::Str(s.as_deref().map(Cow::Borrowed)),
            S::TimestampMicrosecond(t, zone) => Cell::Ts(*t, zone),
            S::DurationMicrosecond(d) => Cell::Duration(*d),
            other => Cell::Other(other),
        }
    }

    /// `v`, a value an operation computed (a timestamp keeps its own zone: held whole).
    pub(crate) fn owned(v: ScalarValue) -> Cell<'a> {
        use ScalarValue as S;
        match v {
            S::Boolean(b) => Cell::Bool(b),
            S::Int32(x) => Cell::I32(x),
            S::Int64(x) => Cell::I64(x),
            S::Float32(x) => Cell::F32(x),
            S::Float64(x) => Cell::F64(x),
            S::Utf8(s) => Cell::Str(s.map(Cow::Owned)),
            S::DurationMicrosecond(d) => Cell::Duration(d),
            other => Cell::Owned(Box::new(other)),
        }
    }

    /// This value as a [`ScalarValue`] (a borrowed string copied).
    pub(crate) fn into_scalar(self) -> ScalarValue {
        use ScalarValue as S;
        match self {
            Cell::Bool(b) => S::Boolean(b),
            Cell::I32(x) => S::Int32(x),
            Cell::I64(x) => S::Int64(x),
            Cell::F32(x) => S::Float32(x),
            Cell::F64(x) => S::Float64(x),
            Cell::Str(s) => S::Utf8(s.map(Cow::into_owned)),
            Cell::Ts(t, zone) => S::TimestampMicrosecond(t, zone.clone()),
            Cell::Duration(d) => S::DurationMicrosecond(d),
            Cell::Other(v) => v.clone(),
            Cell::Owned(v) => *v,
        }
    }

    pub(crate) fn is_null(&self) -> bool {
        match self {
            Cell::Bool(b) => b.is_none(),
            Cell::I32(x) => x.is_none(),
            Cell::I64(x) | Cell::Duration(x) | Cell::Ts(x, _) => x.is_none(),
            Cell::F32(x) => x.is_none(),
            Cell::F64(x) => x.is_none(),
            Cell::Str(s) => s.is_none(),
            Cell::Other(v) => v.is_null(),
            Cell::Owned(v) => v.is_null(),
        }
    }

    /// Whether this is the null of no type (a bare `NULL` of the plan).
    pub(crate) fn is_untyped_null(&self) -> bool {
        match self {
            Cell::Other(v) => matches!(v, ScalarValue::Null),
            Cell::Owned(v) => matches!(**v, ScalarValue::Null),
            _ => false,
        }
    }

    /// The null of this value's type.
    pub(crate) fn null(&self) -> Cell<'a> {
        match self {
            Cell::Bool(_) => Cell::Bool(None),
            Cell::I32(_) => Cell::I32(None),
            Cell::I64(_) => Cell::I64(None),
            Cell::F32(_) => Cell::F32(None),
            Cell::F64(_) => Cell::F64(None),
            Cell::Str(_) => Cell::Str(None),
            Cell::Ts(_, zone) => Cell::Ts(None, zone),
            Cell::Duration(_) => Cell::Duration(None),
            Cell::Other(v) => Cell::owned(super::null_of(&v.data_type())),
            Cell::Owned(v) => Cell::owned(super::null_of(&v.data_type())),
        }
    }

    /// `Some(b)` for a boolean (null: `None` inside), `None` for a value of another
    /// type; the null of no type is a null boolean.
    pub(crate) fn boolean(&self) -> Option<Option<bool>> {
        match self {
            Cell::Bool(b) => Some(*b),
            other if other.is_untyped_null() => Some(None),
            _ => None,
        }
    }
}
