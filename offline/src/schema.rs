//! The Arrow schema of a view's Delta table, and of its joined output columns.
//!
//! A table holds the view's join keys, its event time, its created time (when the view
//! has one), the features, and `_quiver_seq`: the ingestion order, used as the last
//! tie-break (docs/offline.md) and kept through any rewrite of the files.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use quiver_sdk::{DType, Definitions, FeatureView, KeyType, ListElement};

/// The hidden ingestion-order column: `(table version of the ingest << 32) | row`.
pub const SEQ_COLUMN: &str = "_quiver_seq";

/// UTC microseconds: the one timestamp type in tables and outputs.
pub fn timestamp_type() -> DataType {
    quiver_sdk::timestamp_arrow_type()
}

/// The Arrow type a feature of `dtype` is stored as.
pub fn arrow_type(dtype: DType) -> DataType {
    dtype.arrow_type()
}

/// The Arrow type of a join key.
pub fn key_type(key: KeyType) -> DataType {
    arrow_type(key.dtype())
}

/// The role of a column in a view's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Key,
    EventTime,
    CreatedTime,
    Feature,
}

/// The columns a view's rows must have, in table order, with their role (no seq).
pub fn view_columns(defs: &Definitions, view: &FeatureView) -> Vec<(Field, Role)> {
    let mut cols = Vec::new();
    for key in defs.join_keys(view) {
        cols.push((Field::new(&key.name, key_type(key.dtype), false), Role::Key));
    }
    cols.push((Field::new(&view.source.timestamp_field, timestamp_type(), false), Role::EventTime));
    if let Some(created) = &view.source.created_timestamp_field {
        cols.push((Field::new(created, timestamp_type(), false), Role::CreatedTime));
    }
    for f in &view.features {
        cols.push((Field::new(&f.name, arrow_type(f.dtype), true), Role::Feature));
    }
    cols
}

/// Where each role's columns sit in a view's rows: the join keys, the event time, the
/// created time when the view has one, the ingestion-order column when the rows come
/// from a scan of the table, then the features. One type instead of column
/// arithmetic repeated wherever such rows are read (materialization, pushes, the
/// join's kernel input, `verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewLayout {
    keys: usize,
    created: bool,
    seq: bool,
}

impl ViewLayout {
    /// Rows as [`view_columns`] lays them out (no ingestion-order column): conformed
    /// input, pushes, [`crate::historical::latest_per_entity`].
    pub fn rows(defs: &Definitions, view: &FeatureView) -> ViewLayout {
        ViewLayout { keys: defs.join_keys(view).len(), created: view.source.created_timestamp_field.is_some(), seq: false }
    }

    /// Rows as a scan of the table returns them: the ingestion order after the times.
    pub fn scanned(defs: &Definitions, view: &FeatureView) -> ViewLayout {
        ViewLayout { seq: true, ..ViewLayout::rows(defs, view) }
    }

    /// The columns of the join keys, in the view's key order.
    pub fn keys(&self) -> std::ops::Range<usize> {
        0..self.keys
    }

    pub fn event_time(&self) -> usize {
        self.keys
    }

    pub fn created_time(&self) -> Option<usize> {
        self.created.then_some(self.keys + 1)
    }

    /// The ingestion-order column ([`SEQ_COLUMN`]), in scanned rows.
    pub fn seq(&self) -> Option<usize> {
        self.seq.then_some(self.keys + 1 + usize::from(self.created))
    }

    /// The column of the view's `k`-th feature.
    pub fn feature(&self, k: usize) -> usize {
        self.keys + 1 + usize::from(self.created) + usize::from(self.seq) + k
    }
}

/// The schema of a view's Delta table.
pub fn table_schema(defs: &Definitions, view: &FeatureView) -> SchemaRef {
    let mut fields: Vec<Field> = view_columns(defs, view).into_iter().map(|(f, _)| f).collect();
    fields.push(Field::new(SEQ_COLUMN, DataType::Int64, false));
    Arc::new(Schema::new(fields))
}

/// One join key's value at a row of its column (laid out as [`key_type`]).
pub fn key_at(dtype: KeyType, array: &dyn arrow::array::Array, row: usize) -> quiver_sdk::encoding::KeyValue {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;
    use quiver_sdk::encoding::KeyValue;
    match dtype {
        KeyType::Int64 => KeyValue::Int(array.as_primitive::<Int64Type>().value(row)),
        KeyType::String => KeyValue::Str(array.as_string::<i32>().value(row).to_string()),
    }
}

/// The value at `row` of a column holding a feature of `dtype`, as the online encoding's
/// [`Value`](quiver_sdk::encoding::Value). The column must have `dtype`'s Arrow type
/// ([`arrow_type`]); anything else reads as null.
pub fn value_at(array: &dyn arrow::array::Array, row: usize, dtype: DType) -> quiver_sdk::encoding::Value {
    use arrow::array::AsArray;
    use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
    use quiver_sdk::encoding::Value;
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

/// Typed rows (from JSON: files, messages, pushes) as the columns of
/// [`view_columns`], in that order, ready for [`crate::ingest::append`].
pub fn rows_to_columns(view: &FeatureView, rows: &[quiver_sdk::rows::ViewRow]) -> Vec<arrow::array::ArrayRef> {
    use arrow::array::{ArrayRef, TimestampMicrosecondArray};
    use quiver_sdk::encoding::KeyValue;
    let n_keys = rows.first().map_or(0, |r| r.keys.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(n_keys + 2 + view.features.len());
    for k in 0..n_keys {
        let dtype = match &rows[0].keys[k] {
            KeyValue::Int(_) => KeyType::Int64,
            KeyValue::Str(_) => KeyType::String,
        };
        columns.push(key_array(dtype, rows.iter().map(|r| &r.keys[k])));
    }
    let times = |f: &dyn Fn(&quiver_sdk::rows::ViewRow) -> i64| -> ArrayRef {
        Arc::new(TimestampMicrosecondArray::from_iter_values(rows.iter().map(f)).with_timezone("UTC"))
    };
    columns.push(times(&|r| r.event_ts));
    if view.source.created_timestamp_field.is_some() {
        columns.push(times(&|r| r.created_ts.unwrap_or(r.event_ts)));
    }
    for (i, f) in view.features.iter().enumerate() {
        columns.push(values_to_array(f.dtype, rows.iter().map(|r| &r.values[i])));
    }
    columns
}

/// Values of one join key as an array of its Arrow type ([`key_type`]); a value of the
/// other kind is null.
pub fn key_array<'a>(dtype: KeyType, values: impl Iterator<Item = &'a quiver_sdk::encoding::KeyValue>) -> arrow::array::ArrayRef {
    use arrow::array::{Int64Array, StringArray};
    use quiver_sdk::encoding::KeyValue;
    match dtype {
        KeyType::Int64 => Arc::new(values.map(|v| if let KeyValue::Int(i) = v { Some(*i) } else { None }).collect::<Int64Array>()),
        KeyType::String => {
            Arc::new(values.map(|v| if let KeyValue::Str(s) = v { Some(s.as_str()) } else { None }).collect::<StringArray>())
        }
    }
}

/// Values of one feature as an array of its Arrow type ([`arrow_type`]); a value of
/// another kind is null (rows from [`quiver_sdk::rows`] never hold one).
pub fn values_to_array<'a>(dtype: DType, values: impl ExactSizeIterator<Item = &'a quiver_sdk::encoding::Value>) -> arrow::array::ArrayRef {
    use arrow::array::*;
    use arrow::datatypes::{Float32Type, Float64Type, Int64Type};
    use quiver_sdk::encoding::Value;
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
