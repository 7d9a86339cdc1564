//! The latest row of every entity of a view: what materialization loads online and
//! `verify --sample` expects.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, new_null_array};
use arrow::datatypes::{Field, Int64Type, Schema, TimestampMicrosecondType};
use datafusion::prelude::{ident, lit};
use quiver_sdk::{Config, Definitions, FeatureView};

use super::scan::{ScanRange, scan_view_at, ts_literal};
use crate::error::{Error, Result};
use crate::input::widen;
use crate::keys::EntityIndex;
use crate::schema::{SEQ_COLUMN, ViewLayout, arrow_type, key_type, timestamp_type};

/// Which rows [`latest_per_entity`] considers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventRange {
    /// Rows with event time in `[start, end]` (UTC microseconds).
    Range { start: i64, end: i64 },
    /// Rows with event time `<= end` that were not considered by an earlier window
    /// which read table version `version` up to `prev_end`: rows ingested after that
    /// version (whatever their event time: late data), or with event time after
    /// `prev_end`.
    Since { version: u64, prev_end: i64, end: i64 },
    /// Every row the listed table versions committed (whatever their event time).
    Versions(Vec<u64>),
}

/// The latest rows of a view, and the table version they were read from (`None`
/// when there is no table).
#[derive(Debug, Clone)]
pub struct Latest {
    pub batch: Option<RecordBatch>,
    pub version: Option<u64>,
}

/// The latest row of every entity of a view among the rows of `window`: the docs/offline.md
/// winner — greatest event time, then created time, then ingestion order. One batch
/// with the view's columns (keys, event time, created time if any, then every feature;
/// a feature the table lacks is all null), or none when the window holds no rows. This
/// is what materialization loads online.
///
/// # Errors
/// An unreadable table.
pub async fn latest_per_entity(config: &Config, defs: &Definitions, view: &FeatureView, window: EventRange) -> Result<Latest> {
    let location = config.view_table(view);
    let features: Vec<&str> = view.features.iter().map(|f| f.name.as_str()).collect();
    // Under `Versions`, the versions whose rows count (the scan reads the span of them).
    let mut only: Option<std::collections::HashSet<i64>> = None;
    let (lo, hi, extra) = match window {
        EventRange::Range { start, end } => (Some(start), end, None),
        EventRange::Since { version, prev_end, end } => {
            let first_new = i64::try_from(version + 1).unwrap_or(i64::MAX >> 32) << 32;
            let ts = ident(&view.source.timestamp_field);
            let extra = ident(SEQ_COLUMN).gt_eq(lit(first_new)).or(ts.gt(ts_literal(prev_end)));
            (None, end, Some(extra))
        }
        EventRange::Versions(versions) => {
            // One range over the span, the versions picked from it row by row: an `or`
            // of a range per version, for the hundreds of pushes of a quarter of an
            // hour, kept a server's cores busy for minutes (seen in a soak).
            let of = |v: u64| i64::try_from(v).unwrap_or(i64::MAX >> 32);
            let (Some(&first), Some(&last)) = (versions.iter().min(), versions.iter().max()) else {
                return Ok(Latest { batch: None, version: None });
            };
            only = Some(versions.iter().map(|&v| of(v)).collect());
            let extra = ident(SEQ_COLUMN).gt_eq(lit(of(first) << 32)).and(ident(SEQ_COLUMN).lt(lit((of(last) + 1) << 32)));
            (None, i64::MAX, Some(extra))
        }
    };
    let mut scan = scan_view_at(&location, defs, view, &features, ScanRange { lo, hi, extra, version: None }).await?;
    let version = scan.version;
    if scan.batches.is_empty() {
        return Ok(Latest { batch: None, version });
    }
    // The scanned batches stay as they are (no copy of every column into one): only the
    // keys are joined, for the entity index; the winners are picked from the batches.
    let batches = std::mem::take(&mut scan.batches);
    let schema = batches[0].schema();
    let column = |i: usize| -> Vec<&dyn Array> { batches.iter().map(|b| b.column(i).as_ref()).collect() };
    let keys = defs.join_keys(view);
    let key_arrays: Vec<ArrayRef> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| widen(&arrow::compute::concat(&column(i))?, &key_type(k.dtype)).map_err(Error::Request))
        .collect::<Result<_>>()?;
    let index = EntityIndex::build(&key_arrays)?;
    let layout = ViewLayout::scanned(defs, view);
    let seq_col = layout.seq().expect("scanned rows");
    // Per entity: its latest row so far, as (batch, row in the batch, row overall, order).
    type Best = (usize, usize, u32, (i64, i64, i64));
    let mut best: Vec<Option<Best>> = vec![None; index.n_entities as usize];
    let mut first = 0usize;
    for (b, batch) in batches.iter().enumerate() {
        let micros = |i: usize| arrow::compute::cast(batch.column(i), &timestamp_type());
        let ts = micros(layout.event_time())?;
        let ts = ts.as_primitive::<TimestampMicrosecondType>().values();
        let created = layout.created_time().map(micros).transpose()?;
        let created = created.as_ref().map(|c| c.as_primitive::<TimestampMicrosecondType>().values());
        let seq = batch.column(seq_col).as_primitive::<Int64Type>().values();
        for (r, &e) in index.spine_ids[first..first + batch.num_rows()].iter().enumerate() {
            if e == quiver_gpu_join::NO_ENTITY || only.as_ref().is_some_and(|o| !o.contains(&(seq[r] >> 32))) {
                continue;
            }
            let order = (ts[r], created.map_or(0, |c| c[r]), seq[r]);
            let slot = &mut best[e as usize];
            if slot.is_none_or(|(_, _, _, o)| order >= o) {
                *slot = Some((b, r, (first + r) as u32, order));
            }
        }
        first += batch.num_rows();
    }
    let winners: Vec<(usize, usize)> = best.iter().flatten().map(|&(b, r, _, _)| (b, r)).collect();
    let overall = arrow::array::UInt32Array::from(best.iter().flatten().map(|&(_, _, at, _)| at).collect::<Vec<_>>());
    let pick = |i: usize| arrow::compute::interleave(&column(i), &winners);
    // The view's columns: keys and times as scanned, features by name (null if absent).
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        fields.push(Field::new(&key.name, key_type(key.dtype), false));
        columns.push(arrow::compute::take(&key_arrays[i], &overall, None)?);
    }
    for i in layout.event_time()..seq_col {
        fields.push(Field::new(schema.field(i).name(), timestamp_type(), false));
        columns.push(arrow::compute::cast(&pick(i)?, &timestamp_type())?);
    }
    for (k, feature) in view.features.iter().enumerate() {
        let dtype = arrow_type(feature.dtype);
        let column = match scan.feature_columns[k] {
            Some(i) => widen(&pick(i)?, &dtype).map_err(Error::Request)?,
            None => new_null_array(&dtype, winners.len()),
        };
        fields.push(Field::new(&feature.name, dtype, true));
        columns.push(column);
    }
    Ok(Latest { batch: Some(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?), version })
}
