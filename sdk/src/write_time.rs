//! Write-time expressions (docs/transformations.md#write-time), compiled: a view's source
//! `filter` and its features' `expr`, over the raw rows its writers read ([`raw_view`]).
//! Validation compiles them to type-check them at `apply`; the writers evaluate them
//! through `quiver_runtime::write_time`, which compiles through [`compile`] too.

use quiver_transform::{Column, ExprError, Output, Program};

use crate::definitions::{Definitions, Feature, FeatureView};
use crate::types::timestamp_arrow_type;

/// The name a source filter's errors give it in place of a feature's (no feature's
/// name has a dot).
pub const FILTER: &str = "source.filter";

/// A view's write-time expressions compiled against its raw row.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The view as its writers read it ([`raw_view`]).
    pub raw: FeatureView,
    /// Over the raw row's columns, one boolean output.
    pub filter: Option<Program>,
    /// Over the raw row's columns, one output per computed feature, in the view's order.
    pub program: Option<Program>,
    /// The raw row's leading columns: join keys and times.
    pub prefix: usize,
}

/// The view's write-time expressions compiled, or `None` when it has none (its writers
/// store rows as they come).
///
/// # Errors
/// The first expression refused ([`Program::compile`]), named as its feature (the
/// filter as [`FILTER`]).
pub fn compile(defs: &Definitions, view: &FeatureView) -> Result<Option<Compiled>, ExprError> {
    if !view.has_write_expressions() {
        return Ok(None);
    }
    let raw = raw_view(view);
    let keys = defs.join_keys(view);
    let mut columns: Vec<Column> = keys.iter().map(|k| Column::bare(&k.name, k.dtype.dtype().arrow_type())).collect();
    columns.push(Column::bare(&view.source.timestamp_field, timestamp_arrow_type()));
    if let Some(created) = &view.source.created_timestamp_field {
        columns.push(Column::bare(created, timestamp_arrow_type()));
    }
    let prefix = columns.len();
    columns.extend(raw.features.iter().map(|f| Column::bare(&f.name, f.dtype.arrow_type())));
    let filter = match &view.source.filter {
        Some(expr) => {
            let output = Output { name: FILTER.into(), dtype: arrow::datatypes::DataType::Boolean, expr: expr.clone() };
            Some(Program::compile(&columns, &[output])?)
        }
        None => None,
    };
    let outputs: Vec<Output> = view
        .features
        .iter()
        .filter(|f| !f.expr.is_empty())
        .map(|f| Output { name: f.name.clone(), dtype: f.dtype.arrow_type(), expr: f.expr.clone() })
        .collect();
    let program = if outputs.is_empty() { None } else { Some(Program::compile(&columns, &outputs)?) };
    Ok(Some(Compiled { raw, filter, program, prefix }))
}

/// `view` as its writers read it: the same name, keys and times; its features the
/// features stored as they come, then the raw columns.
pub fn raw_view(view: &FeatureView) -> FeatureView {
    let mut features: Vec<Feature> = view.features.iter().filter(|f| f.expr.is_empty()).cloned().collect();
    features.extend(view.source.raw.iter().cloned());
    FeatureView { features, aggregations: Vec::new(), ..view.clone() }
}

#[cfg(test)]
mod tests {
    use crate::yaml::parse_definitions;

    const HEAD: &str = "entities:\n  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}\nfeature_views:\n";

    fn view(source: &str, features: &str) -> String {
        format!("{HEAD}  - name: payments\n    entities: [customer]\n    source: {source}\n    features: {features}\n")
    }

    fn refused(source: &str, features: &str) -> String {
        parse_definitions(&view(source, features)).unwrap_err().to_string()
    }

    #[test]
    fn apply_refuses_what_cannot_be_computed_naming_it() {
        let raw = "{filter: \"status = 'ok'\", raw: [{name: cents, dtype: int64}, {name: status, dtype: string}]}";
        let err = refused(raw, "[{name: amount, dtype: float64, expr: \"cent / 100\"}]");
        assert!(err.contains("feature view `payments`, feature `amount`: `cent / 100`: unknown name"), "{err}");
        assert!(err.contains("known: customer_id, event_timestamp, cents, status"), "{err}");
        let err = refused("{filter: \"cents + 1\", raw: [{name: cents, dtype: int64}]}", "[{name: amount, dtype: int64, expr: \"cents\"}]");
        assert!(err.contains("feature view `payments`, source filter: `cents + 1`: computes int64, not a boolean"), "{err}");
        let err = refused(raw, "[{name: amount, dtype: int64, expr: \"CAST(cents AS DOUBLE) / 100\"}]");
        assert!(
            err.contains("feature `amount`: `CAST(cents AS DOUBLE) / 100`: computes float64, which an int64 feature cannot hold"),
            "{err}"
        );
        let err = refused(
            "{raw: [{name: amount, dtype: int64}]}",
            "[{name: amount, dtype: int64}, {name: twice, dtype: int64, expr: \"amount * 2\"}]",
        );
        assert!(err.contains("raw column `amount` is named like a feature"), "{err}");
        let err = refused("{raw: [{name: customer_id, dtype: string}]}", "[{name: n, dtype: int64, expr: \"1\"}]");
        assert!(err.contains("raw column `customer_id` is a join key"), "{err}");
        let err = refused("{raw: [{name: cents, dtype: int64}]}", "[{name: n, dtype: int64}]");
        assert!(err.contains("declares raw columns but no `source.filter` or feature `expr` reads them"), "{err}");
        let err = refused("{filter: \"sum(cents) > 1\", raw: [{name: cents, dtype: int64}]}", "[{name: n, dtype: int64}]");
        assert!(err.contains("source filter: `sum(cents) > 1`: the aggregate `sum` is not allowed"), "{err}");
        // An expression may read a feature stored as it comes and the timestamp, never
        // another computed feature.
        let err = refused(raw, "[{name: a, dtype: int64, expr: \"cents\"}, {name: b, dtype: int64, expr: \"a + 1\"}]");
        assert!(err.contains("feature `b`: `a + 1`: unknown name"), "{err}");
        parse_definitions(&view(
            raw,
            "[{name: n, dtype: int64}, {name: hour, dtype: float64, expr: \"date_part('hour', event_timestamp) + n\"}]",
        ))
        .unwrap();
    }
}
