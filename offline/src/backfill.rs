//! `backfill`: a view version's rows derived from an earlier version's stored rows
//! (docs/versions.md#backfill).
//!
//! The earlier version's table is read as if its rows were written again to the new
//! version: each column the new version's writers read (its raw view when it has
//! write-time expressions) must be a column of the earlier table, of a type the ingest
//! rules widen to the new one; the new version's filter and expressions then run as
//! on any write. Rows the new table already holds (a stream feeding both versions, an
//! earlier backfill) are not written again, so a backfill is idempotent; what is left is
//! appended in one commit.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch, new_null_array};
use arrow::compute::{concat_batches, filter_record_batch, sort_to_indices, take_record_batch};
use arrow::datatypes::{Field, Schema};
use arrow::row::{RowConverter, SortField};
use quiver_runtime::write_time::WriteTransform;
use quiver_sdk::{Config, Definitions, FeatureView};

use crate::error::{Error, Result};
use crate::historical::scan::{ScanRange, scan_view_at};
use crate::ingest::{AppendOptions, OnProgress, append, conform_batches, shape, write_transform};
use crate::input::{can_widen, display_type};
use crate::schema::{Role, view_columns};

/// What a backfill did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillReport {
    /// The version read (`view@N`) and the version filled.
    pub from: String,
    pub to: String,
    /// Rows of the earlier version's table read, and its Delta version (`None`: no table).
    pub read: usize,
    pub from_table_version: Option<u64>,
    /// Rows the new version's source filter dropped, and values its expressions could
    /// not compute (stored null).
    pub dropped: usize,
    pub uncomputed: u64,
    /// Derived rows the new table already held, not written again.
    pub already: usize,
    /// Rows appended, and the commit that holds them (`None`: nothing to append).
    pub written: usize,
    pub table_version: Option<u64>,
}

/// Why `to` cannot be derived from `from`'s stored rows, naming the column: `None` when
/// it can. Every column `to`'s writers read must be one `from` stores (keys by name,
/// the event and created times by role), of a type the ingest rules widen to the one
/// `to` reads; a filter `from` applied cannot be replaced by another (rows it dropped
/// are gone).
pub fn underivable(defs: &Definitions, from: &FeatureView, to: &FeatureView) -> Option<String> {
    let (old, new) = (label(from), label(to));
    if let Some(filter) = &from.source.filter
        && to.source.filter.as_ref() != Some(filter)
    {
        return Some(format!(
            "{old}'s rows were kept by the filter `{filter}`, which {new} does not apply: rows it dropped cannot be recovered (ingest the raw rows into {new})"
        ));
    }
    let read = reads(to);
    let stored = view_columns(defs, from);
    for (field, role) in view_columns(defs, &read) {
        let name = field.name();
        let have = match role {
            Role::EventTime => stored.iter().find(|(_, r)| *r == Role::EventTime),
            Role::CreatedTime => stored.iter().find(|(_, r)| *r == Role::CreatedTime),
            Role::Key | Role::Feature => stored.iter().find(|(f, r)| f.name() == name && (*r == role)),
        };
        let Some((have, _)) = have else {
            let what = match role {
                Role::Key => "join key",
                Role::EventTime => "event time",
                Role::CreatedTime => "created time",
                Role::Feature => "column",
            };
            return Some(format!("{new} reads the {what} `{name}`, which {old} does not store"));
        };
        let (source, target) = (have.data_type(), field.data_type());
        if source != target && !can_widen(source, target) {
            return Some(format!(
                "{new} reads `{name}` as {}, and {old} stores it as {}, which cannot be converted without loss",
                display_type(target),
                display_type(source)
            ));
        }
    }
    None
}

/// `view@N`, whatever the version (a backfill always names two).
fn label(view: &FeatureView) -> String {
    format!("{}@{}", view.name, view.version)
}

/// The view whose columns `view`'s writers read: its raw view when it has write-time
/// expressions.
fn reads(view: &FeatureView) -> FeatureView {
    if view.has_write_expressions() { quiver_sdk::write_time::raw_view(view) } else { view.clone() }
}

/// Fills `to`'s table from `from`'s stored rows (see the module's documentation).
///
/// # Errors
/// [`Error::Request`] naming the column when `to` cannot be derived from `from`
/// ([`underivable`]); a table that cannot be read or written. Nothing is written then.
pub async fn backfill(
    config: &Config,
    defs: &Definitions,
    from: &FeatureView,
    to: &FeatureView,
    progress: OnProgress<'_>,
) -> Result<BackfillReport> {
    if let Some(why) = underivable(defs, from, to) {
        return Err(Error::Request(format!("cannot backfill {} from {}: {why}", label(to), label(from))));
    }
    let source = format!("{} (backfill from {})", label(to), label(from));
    let mut report = BackfillReport {
        from: label(from),
        to: label(to),
        read: 0,
        from_table_version: None,
        dropped: 0,
        uncomputed: 0,
        already: 0,
        written: 0,
        table_version: None,
    };
    let read = reads(to);
    let features: Vec<&str> = read.features.iter().map(|f| f.name.as_str()).collect();
    let scan = scan_view_at(&config.view_table(from), defs, from, &features, ScanRange::all()).await?;
    report.read = scan.rows;
    report.from_table_version = scan.version;
    progress("read", scan.rows as u64);
    if scan.rows == 0 {
        return Ok(report);
    }
    let rows = as_written(defs, from, &read, scan)?;
    let transform: Option<WriteTransform> = write_transform(defs, to, &source)?;
    let shaped = shape(defs, transform.as_ref(), &source, vec![rows], None)?;
    (report.dropped, report.uncomputed) = (shaped.dropped, shaped.uncomputed);
    let derived = match transform {
        Some(_) => shaped.batches,
        None => conform_batches(defs, to, &source, &shaped.batches, None)?,
    };
    let (fresh, already) = not_held(config, defs, to, derived).await?;
    report.already = already;
    let rows: usize = fresh.iter().map(RecordBatch::num_rows).sum();
    if rows == 0 {
        return Ok(report);
    }
    let appended = append(&config.view_table(to), defs, to, &source, fresh, AppendOptions::new(None), progress).await?;
    report.written = appended.rows;
    report.table_version = appended.version;
    Ok(report)
}

/// The scanned rows of `from` as rows written to `read` (the columns `to`'s writers
/// read, by name; the times renamed), in the order they were ingested; a feature the
/// table lacks (added after its rows were written) is null.
fn as_written(defs: &Definitions, from: &FeatureView, read: &FeatureView, scan: crate::historical::scan::Scan) -> Result<RecordBatch> {
    let n_keys = defs.join_keys(from).len();
    let has_created = from.source.created_timestamp_field.is_some();
    let all = concat_batches(&scan.batches[0].schema(), &scan.batches)?;
    // The ingestion order, so that ties between equal times break as they did.
    let seq = n_keys + 1 + usize::from(has_created);
    let all = take_record_batch(&all, &sort_to_indices(all.column(seq), None, None)?)?;
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, role) in view_columns(defs, read) {
        let column = match role {
            Role::Key => {
                let at = defs.join_keys(from).iter().position(|k| k.name == *field.name()).expect("checked by underivable");
                all.column(at).clone()
            }
            Role::EventTime => all.column(n_keys).clone(),
            Role::CreatedTime => all.column(n_keys + 1).clone(),
            Role::Feature => {
                let k = read.features.iter().position(|f| f.name == *field.name()).expect("a feature of the view");
                match scan.feature_columns[k] {
                    Some(c) => all.column(c).clone(),
                    None => new_null_array(field.data_type(), all.num_rows()),
                }
            }
        };
        fields.push(Field::new(field.name(), column.data_type().clone(), true));
        columns.push(column);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// `derived` (rows of `to`, as [`view_columns`] lays them out) less the rows `to`'s
/// table already holds, counted as a multiset (two equal rows held once: one written);
/// and how many were held.
async fn not_held(config: &Config, defs: &Definitions, to: &FeatureView, derived: Vec<RecordBatch>) -> Result<(Vec<RecordBatch>, usize)> {
    let wanted = view_columns(defs, to);
    let features: Vec<&str> = to.features.iter().map(|f| f.name.as_str()).collect();
    let held = scan_view_at(&config.view_table(to), defs, to, &features, ScanRange::all()).await?;
    if held.rows == 0 {
        return Ok((derived, 0));
    }
    let converter = RowConverter::new(wanted.iter().map(|(f, _)| SortField::new(f.data_type().clone())).collect())?;
    let n_fixed = wanted.iter().filter(|(_, r)| *r != Role::Feature).count();
    let mut counts: HashMap<Box<[u8]>, usize> = HashMap::new();
    for batch in &held.batches {
        // keys and times, then (after the ingestion order) the features present.
        let mut columns: Vec<ArrayRef> = batch.columns()[..n_fixed].to_vec();
        for (k, (field, _)) in wanted[n_fixed..].iter().enumerate() {
            columns.push(match held.feature_columns[k] {
                Some(c) => batch.column(c).clone(),
                None => new_null_array(field.data_type(), batch.num_rows()),
            });
        }
        let rows = converter.convert_columns(&columns)?;
        for row in rows.iter() {
            *counts.entry(row.as_ref().into()).or_default() += 1;
        }
    }
    let mut already = 0;
    let mut fresh = Vec::with_capacity(derived.len());
    for batch in derived {
        let rows = converter.convert_columns(batch.columns())?;
        let keep: BooleanArray = rows
            .iter()
            .map(|row| match counts.get_mut(row.as_ref()) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    already += 1;
                    Some(false)
                }
                _ => Some(true),
            })
            .collect();
        let kept = filter_record_batch(&batch, &keep)?;
        if kept.num_rows() > 0 {
            fresh.push(kept);
        }
    }
    Ok((fresh, already))
}

#[cfg(test)]
mod tests {
    use quiver_sdk::yaml::parse_definitions;

    use super::*;

    /// A view `v` (entity `e`, key `id`) with `source` and `features`, at `version`.
    fn view(source: &str, features: &str, version: u32) -> (Definitions, FeatureView) {
        let yaml = format!(
            "entities:\n  - {{name: e, join_keys: [{{name: id, dtype: int64}}]}}\n  - {{name: f, join_keys: [{{name: other, dtype: string}}]}}\nfeature_views:\n  - name: v\n    entities: [e]\n    source: {source}\n    features: {features}\n"
        );
        let defs = parse_definitions(&yaml).unwrap();
        let mut view = defs.feature_views[0].clone();
        view.version = version;
        (defs, view)
    }

    fn why(from: (&str, &str), to: (&str, &str)) -> Option<String> {
        let (defs, old) = view(from.0, from.1, 1);
        let (_, new) = view(to.0, to.1, 2);
        underivable(&defs, &old, &new)
    }

    const TS: &str = "{timestamp_field: ts}";

    #[test]
    fn a_version_is_derivable_from_stored_columns_widened_dropped_or_computed() {
        let stored = "[{name: a, dtype: int32}, {name: b, dtype: string}]";
        // Widened, one dropped.
        assert_eq!(why((TS, stored), (TS, "[{name: a, dtype: float64}]")), None);
        // A write-time expression over a stored column, a filter over one.
        let computed = "[{name: a2, dtype: int64, expr: \"a * 2\"}, {name: b, dtype: string}]";
        let raw = "{timestamp_field: ts, raw: [{name: a, dtype: int64}], filter: \"a > 1\"}";
        assert_eq!(why((TS, stored), (raw, computed)), None);
        // Event time under another name.
        assert_eq!(why((TS, stored), ("{timestamp_field: at}", "[{name: b, dtype: string}]")), None);
    }

    #[test]
    fn what_cannot_be_derived_is_refused_naming_the_column() {
        let stored = "[{name: a, dtype: float64}]";
        assert_eq!(
            why((TS, stored), (TS, "[{name: a, dtype: int64}]")).unwrap(),
            "v@2 reads `a` as int64, and v@1 stores it as float64, which cannot be converted without loss"
        );
        assert_eq!(
            why((TS, stored), (TS, "[{name: a, dtype: float64}, {name: c, dtype: int64}]")).unwrap(),
            "v@2 reads the column `c`, which v@1 does not store"
        );
        let raw = "{timestamp_field: ts, raw: [{name: cents, dtype: int64}]}";
        assert_eq!(
            why((TS, stored), (raw, "[{name: a, dtype: float64, expr: \"cents / 100.0\"}]")).unwrap(),
            "v@2 reads the column `cents`, which v@1 does not store"
        );
        assert_eq!(
            why((TS, stored), ("{timestamp_field: ts, created_timestamp_field: made}", stored)).unwrap(),
            "v@2 reads the created time `made`, which v@1 does not store"
        );
        let filtered = "{timestamp_field: ts, filter: \"a > 0\"}";
        let refused = why((filtered, stored), (TS, stored)).unwrap();
        assert!(refused.starts_with("v@1's rows were kept by the filter `a > 0`, which v@2 does not apply"), "{refused}");
        assert_eq!(why((filtered, stored), (filtered, stored)), None, "the same filter keeps the same rows");
    }

    #[test]
    fn other_entities_are_refused_naming_the_key() {
        let (defs, old) = view(TS, "[{name: a, dtype: float64}]", 1);
        let mut new = old.clone();
        new.version = 2;
        new.entities = vec!["f".into()];
        assert_eq!(underivable(&defs, &old, &new).unwrap(), "v@2 reads the join key `other`, which v@1 does not store");
    }
}
