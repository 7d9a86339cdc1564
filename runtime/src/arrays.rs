//! Values and Arrow arrays, both ways: the online encoding's [`Value`](crate::encoding::Value)s
//! of a feature as the array of its Arrow type ([`DType::arrow_type`]) and back. The
//! offline join, the online store's on-demand inputs and `verify` convert with these.

use std::sync::Arc;

use quiver_sdk::{DType, KeyType, ListElement};

/// One join key's value at a row of its column (laid out as [`KeyType::dtype`]'s Arrow type).
pub fn key_at(dtype: KeyType, array: &dyn arrow::array::Array, row: usize) -> crate::encoding::KeyValue {
    use crate::encoding::KeyValue;
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;
    match dtype {
        KeyType::Int64 => KeyValue::Int(array.as_primitive::<Int64Type>().value(row)),
        KeyType::String => KeyValue::Str(array.as_string::<i32>().value(row).to_string()),
    }
}

/// The value at `row` of a column holding a feature of `dtype`, as the online encoding's
/// [`Value`](crate::encoding::Value). The column must have `dtype`'s Arrow type
/// ([`DType::arrow_type`]); anything else reads as null.
pub fn value_at(array: &dyn arrow::array::Array, row: usize, dtype: DType) -> crate::encoding::Value {
    use crate::encoding::Value;
    use arrow::array::AsArray;
    use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
    if array.is_null(row) {
        return Value::Null;
    }
    let list = |row: usize| array.as_list_opt::<i32>().map(|l| l.value(row));
    match dtype {
        DType::Int32 => array.as_primitive_opt::<Int32Type>().map_or(Value::Null, |a| Value::Int32(a.value(row))),
        DType::Int64 => array.as_primitive_opt::<Int64Type>().map_or(Value::Null, |a| Value::Int64(a.value(row))),
        DType::Float32 => array.as_primitive_opt::<Float32Type>().map_or(Value::Null, |a| Value::Float32(a.value(row))),
        DType::Float64 => array.as_primitive_opt::<Float64Type>().map_or(Value::Null, |a| Value::Float64(a.value(row))),
        DType::Bool => array.as_boolean_opt().map_or(Value::Null, |a| Value::Bool(a.value(row))),
        DType::String => array.as_string_opt::<i32>().map_or(Value::Null, |a| Value::String(a.value(row).to_string())),
        DType::Bytes => array.as_binary_opt::<i32>().map_or(Value::Null, |a| Value::Bytes(a.value(row).to_vec())),
        DType::Timestamp => array.as_primitive_opt::<TimestampMicrosecondType>().map_or(Value::Null, |a| Value::Timestamp(a.value(row))),
        DType::List(e) => {
            let Some(items) = list(row) else { return Value::Null };
            match e {
                ListElement::Int64 => Value::ListInt64(items.as_primitive::<Int64Type>().iter().map(|v| v.unwrap_or_default()).collect()),
                ListElement::Float32 => {
                    Value::ListFloat32(items.as_primitive::<Float32Type>().iter().map(|v| v.unwrap_or(f32::NAN)).collect())
                }
                ListElement::Float64 => {
                    Value::ListFloat64(items.as_primitive::<Float64Type>().iter().map(|v| v.unwrap_or(f64::NAN)).collect())
                }
                ListElement::String => {
                    Value::ListString(items.as_string::<i32>().iter().map(|v| v.unwrap_or_default().to_string()).collect())
                }
            }
        }
    }
}

/// Values of one join key as an array of its Arrow type; a value of the
/// other kind is null.
pub fn key_array<'a>(dtype: KeyType, values: impl Iterator<Item = &'a crate::encoding::KeyValue>) -> arrow::array::ArrayRef {
    use crate::encoding::KeyValue;
    use arrow::array::{Int64Array, StringArray};
    match dtype {
        KeyType::Int64 => Arc::new(values.map(|v| if let KeyValue::Int(i) = v { Some(*i) } else { None }).collect::<Int64Array>()),
        KeyType::String => {
            Arc::new(values.map(|v| if let KeyValue::Str(s) = v { Some(s.as_str()) } else { None }).collect::<StringArray>())
        }
    }
}

/// Values of one feature as an array of its Arrow type ([`DType::arrow_type`]); a value of
/// another kind is null (rows from [`crate::rows`] never hold one).
pub fn values_to_array<'a>(dtype: DType, values: impl ExactSizeIterator<Item = &'a crate::encoding::Value>) -> arrow::array::ArrayRef {
    use crate::encoding::Value;
    use arrow::array::*;
    use arrow::datatypes::{Float32Type, Float64Type, Int64Type};
    let n = values.len();
    match dtype {
        DType::Int32 => Arc::new(values.map(|v| if let Value::Int32(x) = v { Some(*x) } else { None }).collect::<Int32Array>()),
        DType::Int64 => Arc::new(values.map(|v| if let Value::Int64(x) = v { Some(*x) } else { None }).collect::<Int64Array>()),
        DType::Float32 => Arc::new(values.map(|v| if let Value::Float32(x) = v { Some(*x) } else { None }).collect::<Float32Array>()),
        DType::Float64 => Arc::new(values.map(|v| if let Value::Float64(x) = v { Some(*x) } else { None }).collect::<Float64Array>()),
        DType::Bool => Arc::new(values.map(|v| if let Value::Bool(x) = v { Some(*x) } else { None }).collect::<BooleanArray>()),
        DType::String => Arc::new(values.map(|v| if let Value::String(x) = v { Some(x.as_str()) } else { None }).collect::<StringArray>()),
        DType::Bytes => Arc::new(values.map(|v| if let Value::Bytes(x) = v { Some(x.as_slice()) } else { None }).collect::<BinaryArray>()),
        DType::Timestamp => Arc::new(
            values
                .map(|v| if let Value::Timestamp(x) = v { Some(*x) } else { None })
                .collect::<TimestampMicrosecondArray>()
                .with_timezone("UTC"),
        ),
        DType::List(ListElement::Int64) => Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(
            values.map(|v| if let Value::ListInt64(x) = v { Some(x.iter().map(|e| Some(*e)).collect::<Vec<_>>()) } else { None }),
        )),
        DType::List(ListElement::Float32) => Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
            values.map(|v| if let Value::ListFloat32(x) = v { Some(x.iter().map(|e| Some(*e)).collect::<Vec<_>>()) } else { None }),
        )),
        DType::List(ListElement::Float64) => Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(
            values.map(|v| if let Value::ListFloat64(x) = v { Some(x.iter().map(|e| Some(*e)).collect::<Vec<_>>()) } else { None }),
        )),
        DType::List(ListElement::String) => {
            let mut builder = ListBuilder::with_capacity(StringBuilder::new(), n);
            for v in values {
                if let Value::ListString(x) = v {
                    for s in x {
                        builder.values().append_value(s);
                    }
                    builder.append(true);
                } else {
                    builder.append(false);
                }
            }
            Arc::new(builder.finish())
        }
    }
}

/// The zone of every timestamp value: shared, not allocated per value.
static UTC: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("UTC"));

/// A value of a feature of `dtype` as the row evaluator takes it (of [`DType::arrow_type`]);
/// a value of another kind is null, as in [`values_to_array`].
pub fn scalar_of(dtype: DType, v: &crate::encoding::Value) -> quiver_transform::ScalarValue {
    use crate::encoding::Value;
    use quiver_transform::ScalarValue as S;
    match (dtype, v) {
        (DType::Int32, Value::Int32(x)) => S::Int32(Some(*x)),
        (DType::Int64, Value::Int64(x)) => S::Int64(Some(*x)),
        (DType::Float32, Value::Float32(x)) => S::Float32(Some(*x)),
        (DType::Float64, Value::Float64(x)) => S::Float64(Some(*x)),
        (DType::Bool, Value::Bool(x)) => S::Boolean(Some(*x)),
        (DType::String, Value::String(x)) => S::Utf8(Some(x.clone())),
        (DType::Bytes, Value::Bytes(x)) => S::Binary(Some(x.clone())),
        (DType::Timestamp, Value::Timestamp(x)) => timestamp_scalar(Some(*x)),
        (DType::List(_), _) => {
            let array = values_to_array(dtype, std::iter::once(v));
            S::try_from_array(&array, 0).unwrap_or_else(|_| null_scalar(dtype))
        }
        _ => null_scalar(dtype),
    }
}

/// Makes `slot` [`scalar_of`]`(dtype, v)`, keeping what it holds where it is of the same
/// kind (a string's buffer, a timestamp's zone): a row evaluator's input row refilled
/// for each entity row allocates nothing.
pub fn set_scalar(dtype: DType, v: &crate::encoding::Value, slot: &mut quiver_transform::ScalarValue) {
    use crate::encoding::Value;
    use quiver_transform::ScalarValue as S;
    match (dtype, v, &mut *slot) {
        (DType::Float64, Value::Float64(x), S::Float64(s)) => *s = Some(*x),
        (DType::Int64, Value::Int64(x), S::Int64(s)) => *s = Some(*x),
        (DType::Int32, Value::Int32(x), S::Int32(s)) => *s = Some(*x),
        (DType::Float32, Value::Float32(x), S::Float32(s)) => *s = Some(*x),
        (DType::Bool, Value::Bool(x), S::Boolean(s)) => *s = Some(*x),
        (DType::String, Value::String(x), S::Utf8(Some(s))) => {
            s.clear();
            s.push_str(x);
        }
        (DType::Timestamp, Value::Timestamp(x), S::TimestampMicrosecond(s, Some(_))) => *s = Some(*x),
        _ => *slot = scalar_of(dtype, v),
    }
}

/// Makes `slot` [`timestamp_scalar`]`(micros)`, keeping its zone.
pub fn set_timestamp(micros: Option<i64>, slot: &mut quiver_transform::ScalarValue) {
    match slot {
        quiver_transform::ScalarValue::TimestampMicrosecond(s, Some(_)) => *s = micros,
        _ => *slot = timestamp_scalar(micros),
    }
}

/// Makes `slot` [`key_scalar`]`(dtype, v)`, keeping a string's buffer.
pub fn set_key(dtype: KeyType, v: &crate::encoding::KeyValue, slot: &mut quiver_transform::ScalarValue) {
    use crate::encoding::KeyValue;
    use quiver_transform::ScalarValue as S;
    match (dtype, v, &mut *slot) {
        (KeyType::Int64, KeyValue::Int(i), S::Int64(s)) => *s = Some(*i),
        (KeyType::String, KeyValue::Str(x), S::Utf8(Some(s))) => {
            s.clear();
            s.push_str(x);
        }
        _ => *slot = key_scalar(dtype, v),
    }
}

/// A timestamp (UTC microseconds) as the row evaluator takes it.
pub fn timestamp_scalar(micros: Option<i64>) -> quiver_transform::ScalarValue {
    quiver_transform::ScalarValue::TimestampMicrosecond(micros, Some(Arc::clone(&UTC)))
}

/// A join key's value as the row evaluator takes it (of [`KeyType::dtype`]'s type).
pub fn key_scalar(dtype: KeyType, v: &crate::encoding::KeyValue) -> quiver_transform::ScalarValue {
    use crate::encoding::KeyValue;
    use quiver_transform::ScalarValue as S;
    match (dtype, v) {
        (KeyType::Int64, KeyValue::Int(i)) => S::Int64(Some(*i)),
        (KeyType::String, KeyValue::Str(s)) => S::Utf8(Some(s.clone())),
        (KeyType::Int64, _) => S::Int64(None),
        (KeyType::String, _) => S::Utf8(None),
    }
}

/// The null of a feature of `dtype`, as the row evaluator takes it.
pub fn null_scalar(dtype: DType) -> quiver_transform::ScalarValue {
    quiver_transform::ScalarValue::try_from(&dtype.arrow_type()).unwrap_or(quiver_transform::ScalarValue::Null)
}

/// A value the row evaluator computed for a feature of `dtype` (of its Arrow type) as
/// the online encoding's value: what [`value_at`] reads from a column of such values
/// (a string or bytes moved, not copied).
pub fn value_of(dtype: DType, v: quiver_transform::ScalarValue) -> crate::encoding::Value {
    use crate::encoding::Value;
    use quiver_transform::ScalarValue as S;
    match (dtype, v) {
        (DType::Int32, S::Int32(Some(x))) => Value::Int32(x),
        (DType::Int64, S::Int64(Some(x))) => Value::Int64(x),
        (DType::Float32, S::Float32(Some(x))) => Value::Float32(x),
        (DType::Float64, S::Float64(Some(x))) => Value::Float64(x),
        (DType::Bool, S::Boolean(Some(x))) => Value::Bool(x),
        (DType::String, S::Utf8(Some(x))) => Value::String(x),
        (DType::Bytes, S::Binary(Some(x))) => Value::Bytes(x),
        (DType::Timestamp, S::TimestampMicrosecond(Some(x), _)) => Value::Timestamp(x),
        (DType::List(_), S::List(list)) => value_at(list.as_ref(), 0, dtype),
        _ => Value::Null,
    }
}
