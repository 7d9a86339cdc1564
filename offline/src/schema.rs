//! The Arrow schema of a view's Delta table, and of its joined output columns.
//!
//! A table holds the view's join keys, its event time, its created time (when the view
//! has one), the features, and `_quiver_seq`: the ingestion order, used as the last
//! tie-break (docs/offline.md) and kept through any rewrite of the files.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
pub use quiver_runtime::arrays::{key_array, key_at, value_at, values_to_array};
use quiver_sdk::{DType, Definitions, FeatureView, KeyType};

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

/// Typed rows (from JSON: files, messages, pushes) as the columns of
/// [`view_columns`], in that order, ready for [`crate::ingest::append`].
pub fn rows_to_columns(view: &FeatureView, rows: &[quiver_runtime::rows::ViewRow]) -> Vec<arrow::array::ArrayRef> {
    use arrow::array::{ArrayRef, TimestampMicrosecondArray};
    use quiver_runtime::encoding::KeyValue;
    let n_keys = rows.first().map_or(0, |r| r.keys.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(n_keys + 2 + view.features.len());
    for k in 0..n_keys {
        let dtype = match &rows[0].keys[k] {
            KeyValue::Int(_) => KeyType::Int64,
            KeyValue::Str(_) => KeyType::String,
        };
        columns.push(key_array(dtype, rows.iter().map(|r| &r.keys[k])));
    }
    let times = |f: &dyn Fn(&quiver_runtime::rows::ViewRow) -> i64| -> ArrayRef {
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
