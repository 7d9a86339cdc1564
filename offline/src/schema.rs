//! The Arrow schema of a view's Delta table, and of its joined output columns.
//!
//! A table holds the view's join keys, its event time, its created time (when the view
//! has one), the features, and `_quiver_seq`: the ingestion order, used as the last
//! tie-break (SPEC §3) and kept through any rewrite of the files.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use quiver_sdk::{DType, Definitions, FeatureView, KeyType, ListElement};

/// The hidden ingestion-order column: `(table version of the ingest << 32) | row`.
pub const SEQ_COLUMN: &str = "_quiver_seq";

/// UTC microseconds: the one timestamp type in tables and outputs.
pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// The Arrow type a feature of `dtype` is stored as.
pub fn arrow_type(dtype: DType) -> DataType {
    match dtype {
        DType::Int32 => DataType::Int32,
        DType::Int64 => DataType::Int64,
        DType::Float32 => DataType::Float32,
        DType::Float64 => DataType::Float64,
        DType::Bool => DataType::Boolean,
        DType::String => DataType::Utf8,
        DType::Bytes => DataType::Binary,
        DType::Timestamp => timestamp_type(),
        DType::List(e) => DataType::new_list(
            match e {
                ListElement::Int64 => DataType::Int64,
                ListElement::Float32 => DataType::Float32,
                ListElement::Float64 => DataType::Float64,
                ListElement::String => DataType::Utf8,
            },
            true,
        ),
    }
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
    cols.push((
        Field::new(&view.source.timestamp_field, timestamp_type(), false),
        Role::EventTime,
    ));
    if let Some(created) = &view.source.created_timestamp_field {
        cols.push((Field::new(created, timestamp_type(), false), Role::CreatedTime));
    }
    for f in &view.features {
        cols.push((Field::new(&f.name, arrow_type(f.dtype), true), Role::Feature));
    }
    cols
}

/// The schema of a view's Delta table.
pub fn table_schema(defs: &Definitions, view: &FeatureView) -> SchemaRef {
    let mut fields: Vec<Field> = view_columns(defs, view).into_iter().map(|(f, _)| f).collect();
    fields.push(Field::new(SEQ_COLUMN, DataType::Int64, false));
    Arc::new(Schema::new(fields))
}
