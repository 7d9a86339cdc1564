//! Write-time expressions evaluated (docs/transformations.md#write-time). Every writer —
//! ingest, `push`, the server's `/push`, the stream — reads raw rows as the view's
//! [`WriteTransform::raw_view`] (so each checks types and names the file, row and column
//! as for any view), then computes the stored rows with the one [`WriteTransform`]: rows
//! failing the filter dropped and counted, each expression computed by the expression
//! engine, a value it cannot compute null. What is stored is what is served.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, TimestampMicrosecondArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Field, Schema};
use quiver_sdk::definitions::{Definitions, Feature, FeatureView};
use quiver_sdk::types::timestamp_arrow_type;
use quiver_sdk::write_time::compile;
use quiver_transform::{ExprError, InputError, Program};

use crate::arrays::{key_array, key_at, value_at, values_to_array};
use crate::rows::ViewRow;

/// A view's write-time expressions, compiled: what its writers read, and how the
/// stored rows are computed from it.
#[derive(Debug, Clone)]
pub struct WriteTransform {
    raw: FeatureView,
    /// Over the raw row's columns, one boolean output.
    filter: Option<Program>,
    /// Over the raw row's columns, one output per computed feature.
    program: Option<Program>,
    /// The stored features, in the view's order, and where each one's values come from.
    stored: Vec<Feature>,
    take: Vec<Take>,
    /// The raw row's leading columns: join keys and times.
    prefix: usize,
}

#[derive(Debug, Clone, Copy)]
enum Take {
    /// The raw row's feature at this position (stored as it comes).
    Raw(usize),
    /// The program's output at this position.
    Computed(usize),
}

/// What [`WriteTransform::apply`] made of a batch of raw rows.
#[derive(Debug, Clone)]
pub struct Shaped {
    /// The rows kept, laid out as the view's rows: join keys, times, stored features.
    pub batch: RecordBatch,
    /// Rows the filter dropped (false or null).
    pub dropped: usize,
    /// Values that could not be computed (null), the filter's included (its row dropped).
    pub uncomputed: u64,
}

impl WriteTransform {
    /// The view's write-time expressions compiled ([`compile`]), or `None` when it has
    /// none (its writers store rows as they come).
    ///
    /// # Errors
    /// The first expression refused, named as its feature (the filter as
    /// [`quiver_sdk::write_time::FILTER`]).
    pub fn new(defs: &Definitions, view: &FeatureView) -> Result<Option<WriteTransform>, ExprError> {
        let Some(compiled) = compile(defs, view)? else { return Ok(None) };
        let raw = compiled.raw;
        let mut computed = 0;
        let take = view
            .features
            .iter()
            .map(|f| {
                if f.expr.is_empty() {
                    Take::Raw(raw.features.iter().position(|r| r.name == f.name).expect("stored as it comes"))
                } else {
                    computed += 1;
                    Take::Computed(computed - 1)
                }
            })
            .collect();
        Ok(Some(WriteTransform {
            raw,
            filter: compiled.filter,
            program: compiled.program,
            stored: view.features.clone(),
            take,
            prefix: compiled.prefix,
        }))
    }

    /// The view as its writers read it: the same name, keys and times; its features the
    /// features stored as they come, then the raw columns.
    pub fn raw_view(&self) -> &FeatureView {
        &self.raw
    }

    /// The stored rows of a batch of raw rows laid out as the raw view's rows (join keys,
    /// times, the raw view's features, in order; types as the view's).
    ///
    /// # Errors
    /// [`InputError`] when the batch is not laid out so.
    pub fn apply(&self, batch: &RecordBatch) -> Result<Shaped, InputError> {
        let (kept, dropped, mut uncomputed) = self.filtered(batch)?;
        let computed = match &self.program {
            Some(program) => {
                let evaluated = program.evaluate(&kept)?;
                uncomputed += evaluated.failed.iter().sum::<u64>();
                evaluated.columns
            }
            None => Vec::new(),
        };
        let schema = kept.schema();
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().take(self.prefix).cloned().collect();
        let mut columns: Vec<ArrayRef> = kept.columns().iter().take(self.prefix).cloned().collect();
        for (take, feature) in self.take.iter().zip(&self.stored) {
            fields.push(Arc::new(Field::new(&feature.name, feature.dtype.arrow_type(), true)));
            columns.push(match *take {
                Take::Raw(k) => Arc::clone(kept.column(self.prefix + k)),
                Take::Computed(o) => Arc::clone(&computed[o]),
            });
        }
        let options = RecordBatchOptions::new().with_row_count(Some(kept.num_rows()));
        let batch =
            RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), columns, &options).map_err(|e| InputError(e.to_string()))?;
        Ok(Shaped { batch, dropped, uncomputed })
    }

    /// [`WriteTransform::apply`] to typed rows of the raw view: the stored rows of those
    /// kept, in order, how many were dropped and how many values could not be computed.
    pub fn apply_rows(&self, defs: &Definitions, rows: &[ViewRow]) -> (Vec<ViewRow>, usize, u64) {
        let batch = self.raw_batch(defs, rows);
        let applied = self.apply(&batch).expect("laid out as the raw view's rows");
        let keys = defs.join_keys(&self.raw);
        let batch = &applied.batch;
        let created = self.raw.source.created_timestamp_field.is_some();
        let times = |c: usize| batch.column(c).as_primitive::<arrow::datatypes::TimestampMicrosecondType>().clone();
        let event = times(keys.len());
        let created_at = created.then(|| times(keys.len() + 1));
        let features = &self.stored;
        let out = (0..batch.num_rows())
            .map(|r| ViewRow {
                keys: keys.iter().enumerate().map(|(i, k)| key_at(k.dtype, batch.column(i).as_ref(), r)).collect(),
                event_ts: event.value(r),
                created_ts: created_at.as_ref().map(|c| c.value(r)),
                values: features.iter().enumerate().map(|(k, f)| value_at(batch.column(self.prefix + k).as_ref(), r, f.dtype)).collect(),
            })
            .collect();
        (out, applied.dropped, applied.uncomputed)
    }

    /// The rows the filter keeps, how many it dropped and how many rows it could not
    /// judge (dropped too).
    fn filtered(&self, batch: &RecordBatch) -> Result<(RecordBatch, usize, u64), InputError> {
        let Some(filter) = &self.filter else { return Ok((batch.clone(), 0, 0)) };
        let evaluated = filter.evaluate(batch)?;
        let mask = evaluated.columns[0].as_boolean();
        // Null (unknown, or not computable) keeps no row.
        let mask = if mask.null_count() == 0 { mask.clone() } else { BooleanArray::from_iter(mask.iter().map(|v| Some(v == Some(true)))) };
        let kept = filter_record_batch(batch, &mask).map_err(|e| InputError(e.to_string()))?;
        let dropped = batch.num_rows() - kept.num_rows();
        Ok((kept, dropped, evaluated.failed[0]))
    }

    /// Typed rows of the raw view as a batch laid out as its rows.
    fn raw_batch(&self, defs: &Definitions, rows: &[ViewRow]) -> RecordBatch {
        let keys = defs.join_keys(&self.raw);
        let mut fields = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            fields.push(Field::new(&key.name, key.dtype.dtype().arrow_type(), false));
            columns.push(key_array(key.dtype, rows.iter().map(|r| &r.keys[i])));
        }
        let stamps = |t: Vec<i64>| -> ArrayRef { Arc::new(TimestampMicrosecondArray::from(t).with_timezone("UTC")) };
        fields.push(Field::new(&self.raw.source.timestamp_field, timestamp_arrow_type(), false));
        columns.push(stamps(rows.iter().map(|r| r.event_ts).collect()));
        if let Some(created) = &self.raw.source.created_timestamp_field {
            fields.push(Field::new(created, timestamp_arrow_type(), false));
            columns.push(stamps(rows.iter().map(|r| r.created_ts.unwrap_or(i64::MIN)).collect()));
        }
        for (k, f) in self.raw.features.iter().enumerate() {
            fields.push(Field::new(&f.name, f.dtype.arrow_type(), true));
            columns.push(values_to_array(f.dtype, rows.iter().map(|r| &r.values[k])));
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), columns, &options).expect("columns of their fields' types")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use quiver_sdk::yaml::parse_definitions;

    const HEAD: &str = "entities:\n  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}\nfeature_views:\n";

    fn view(source: &str, features: &str) -> String {
        format!("{HEAD}  - name: payments\n    entities: [customer]\n    source: {source}\n    features: {features}\n")
    }

    fn refused(source: &str, features: &str) -> String {
        parse_definitions(&view(source, features)).unwrap_err().to_string()
    }

    #[test]
    fn the_filter_drops_and_expressions_compute_on_what_it_keeps() {
        let defs = parse_definitions(&view(
            "{filter: \"status = 'ok'\", raw: [{name: cents, dtype: int64}, {name: status, dtype: string}]}",
            "[{name: amount, dtype: float64, expr: \"CAST(cents AS DOUBLE) / 100\"}, {name: n, dtype: int64}, {name: per, dtype: int64, expr: \"cents / n\"}]",
        ))
        .unwrap();
        let view = &defs.feature_views[0];
        let transform = WriteTransform::new(&defs, view).unwrap().expect("it has expressions");
        let raw = transform.raw_view();
        assert_eq!(raw.features.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["n", "cents", "status"]);
        let stamps = TimestampMicrosecondArray::from(vec![1, 2, 3, 4]).with_timezone("UTC");
        let batch = RecordBatch::try_from_iter([
            ("customer_id", Arc::new(StringArray::from(vec!["a", "b", "c", "d"])) as ArrayRef),
            ("event_timestamp", Arc::new(stamps)),
            ("n", Arc::new(Int64Array::from(vec![Some(2), Some(0), Some(1), None]))),
            ("cents", Arc::new(Int64Array::from(vec![Some(250), Some(7), Some(9), Some(1)]))),
            ("status", Arc::new(StringArray::from(vec![Some("ok"), Some("ok"), Some("failed"), None]))),
        ])
        .unwrap();
        let applied = transform.apply(&batch).unwrap();
        assert_eq!((applied.dropped, applied.uncomputed), (2, 1), "two filtered, 7 / 0 not computed");
        let b = &applied.batch;
        let names: Vec<&str> = b.schema_ref().fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["customer_id", "event_timestamp", "amount", "n", "per"]);
        assert_eq!(b.column(2).as_any().downcast_ref::<Float64Array>().unwrap().iter().collect::<Vec<_>>(), [Some(2.5), Some(0.07)]);
        assert_eq!(b.column(4).as_primitive::<arrow::datatypes::Int64Type>().iter().collect::<Vec<_>>(), [Some(125), None]);
        // Typed rows give the same.
        let rows: Vec<ViewRow> = (0..4)
            .map(|r| ViewRow {
                keys: vec![key_at(quiver_sdk::KeyType::String, batch.column(0).as_ref(), r)],
                event_ts: r as i64 + 1,
                created_ts: None,
                values: raw.features.iter().enumerate().map(|(k, f)| value_at(batch.column(2 + k).as_ref(), r, f.dtype)).collect(),
            })
            .collect();
        let (stored, dropped, uncomputed) = transform.apply_rows(&defs, &rows);
        assert_eq!((dropped, uncomputed), (2, 1));
        assert_eq!(
            stored.iter().map(|r| r.values.clone()).collect::<Vec<_>>(),
            [
                vec![crate::encoding::Value::Float64(2.5), crate::encoding::Value::Int64(2), crate::encoding::Value::Int64(125)],
                vec![crate::encoding::Value::Float64(0.07), crate::encoding::Value::Int64(0), crate::encoding::Value::Null],
            ]
        );
        assert_eq!(stored.iter().map(|r| r.event_ts).collect::<Vec<_>>(), [1, 2]);
    }

    /// Issue 53: a column normalized in place — `raw: [country]`, feature `country:
    /// lower(country)` — is accepted: in the view's expressions and filter the name is
    /// the raw column, and what is stored under it is the computed value.
    #[test]
    fn a_feature_computed_from_a_raw_column_may_take_its_name() {
        let defs = parse_definitions(&view(
            "{filter: \"country <> 'XX'\", raw: [{name: country, dtype: string}, {name: amount, dtype: int64}]}",
            "[{name: country, dtype: string, expr: \"lower(country)\"}, {name: amount, dtype: float64, expr: \"CAST(amount AS DOUBLE) / 100\"}, \
             {name: is_fr, dtype: bool, expr: \"country = 'FR'\"}]",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let transform = WriteTransform::new(&defs, &defs.feature_views[0]).unwrap().expect("it has expressions");
        let raw = transform.raw_view();
        assert_eq!(
            raw.features.iter().map(|f| (f.name.as_str(), f.dtype)).collect::<Vec<_>>(),
            [("country", quiver_sdk::DType::String), ("amount", quiver_sdk::DType::Int64)]
        );
        let batch = RecordBatch::try_from_iter([
            ("customer_id", Arc::new(StringArray::from(vec!["a", "b", "c"])) as ArrayRef),
            ("event_timestamp", Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3]).with_timezone("UTC"))),
            ("country", Arc::new(StringArray::from(vec![Some("FR"), Some("XX"), Some("De")]))),
            ("amount", Arc::new(Int64Array::from(vec![Some(1250), Some(1), None]))),
        ])
        .unwrap();
        let applied = transform.apply(&batch).unwrap();
        assert_eq!(applied.dropped, 1, "the filter reads the raw `XX`");
        let b = &applied.batch;
        let names: Vec<&str> = b.schema_ref().fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["customer_id", "event_timestamp", "country", "amount", "is_fr"]);
        assert_eq!(b.column(2).as_string::<i32>().iter().collect::<Vec<_>>(), [Some("fr"), Some("de")]);
        assert_eq!(b.column(3).as_any().downcast_ref::<Float64Array>().unwrap().iter().collect::<Vec<_>>(), [Some(12.5), None]);
        assert_eq!(b.column(4).as_boolean().iter().collect::<Vec<_>>(), [Some(true), Some(false)], "`country` is the raw column");
        // A feature stored as it comes still cannot share its name with a raw column.
        let err =
            refused("{raw: [{name: country, dtype: string}]}", "[{name: country, dtype: string}, {name: n, dtype: int64, expr: \"1\"}]");
        assert!(err.contains("raw column `country` is named like a feature without `expr`"), "{err}");
    }
}
