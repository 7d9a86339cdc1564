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
