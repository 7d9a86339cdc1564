//! An event log's recent events, per entity: what materialization builds the online
//! records (tiles) of an aggregation view from.

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use datafusion::prelude::{Expr, ident, lit};
use quiver_runtime::encoding::KeyValue;
use quiver_runtime::record::Event;
use quiver_sdk::{Config, Definitions, FeatureView};

use super::scan::{Scan, ScanRange, scan_view_at};
use crate::error::{Error, Result};
use crate::input::widen;
use crate::keys::EntityIndex;
use crate::schema::{ViewLayout, arrow_type, key_at, key_type, timestamp_type, value_at};

/// The events of each entity, and the table version they were read at.
#[derive(Debug, Clone, Default)]
pub struct EntityEvents {
    /// Per entity: its join-key values and its events (in no particular order).
    pub entities: Vec<(Vec<KeyValue>, Vec<Event>)>,
    /// `None`: no table yet.
    pub version: Option<u64>,
}

/// Every event of `view` with event time `since` or later (all of them after any
/// clock: those are kept pending online), grouped by entity; with `only`, of those
/// entities alone.
///
/// # Errors
/// An unreadable table.
pub async fn events_since(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    since: i64,
    only: Option<&[Vec<KeyValue>]>,
) -> Result<EntityEvents> {
    let features: Vec<&str> = view.features.iter().map(|f| f.name.as_str()).collect();
    let extra = only.map(|entities| entity_filter(&defs.join_keys(view), entities));
    let range = ScanRange { lo: Some(since), hi: i64::MAX, extra, version: None };
    let scan = scan_view_at(&config.view_table(view), defs, view, &features, range).await?;
    let version = scan.version;
    Ok(EntityEvents { entities: by_entity(defs, view, scan)?, version })
}

/// The scanned rows of `view` grouped by entity, as events.
pub(super) fn by_entity(defs: &Definitions, view: &FeatureView, mut scan: Scan) -> Result<Vec<(Vec<KeyValue>, Vec<Event>)>> {
    if scan.batches.is_empty() {
        return Ok(Vec::new());
    }
    let schema = scan.batches[0].schema();
    let all: RecordBatch = concat_batches(&schema, &std::mem::take(&mut scan.batches))?;
    let keys = defs.join_keys(view);
    let key_arrays: Vec<ArrayRef> =
        keys.iter().enumerate().map(|(i, k)| widen(all.column(i), &key_type(k.dtype)).map_err(Error::Request)).collect::<Result<_>>()?;
    let index = EntityIndex::build(&key_arrays)?;
    let layout = ViewLayout::scanned(defs, view);
    let micros = |i: usize| -> Result<ArrayRef> { Ok(arrow::compute::cast(all.column(i), &timestamp_type())?) };
    let ts = micros(layout.event_time())?;
    let ts = ts.as_primitive::<TimestampMicrosecondType>();
    let created = layout.created_time().map(micros).transpose()?;
    let created = created.as_ref().map(|c| c.as_primitive::<TimestampMicrosecondType>());
    let seq = all.column(layout.seq().expect("scanned rows")).as_primitive::<Int64Type>();
    let columns: Vec<Option<ArrayRef>> = view
        .features
        .iter()
        .zip(&scan.feature_columns)
        .map(|(f, at)| at.map(|i| widen(all.column(i), &arrow_type(f.dtype)).map_err(Error::Request)).transpose())
        .collect::<Result<_>>()?;
    let mut entities: Vec<(Vec<KeyValue>, Vec<Event>)> = vec![(Vec::new(), Vec::new()); index.n_entities as usize];
    for (r, &e) in index.spine_ids.iter().enumerate() {
        if e == quiver_gpu_join::NO_ENTITY {
            continue;
        }
        let (key, events) = &mut entities[e as usize];
        if key.is_empty() {
            *key = keys.iter().zip(&key_arrays).map(|(k, a)| key_at(k.dtype, a.as_ref(), r)).collect();
        }
        let values = view
            .features
            .iter()
            .zip(&columns)
            .map(|(f, c)| c.as_ref().map_or(quiver_runtime::encoding::Value::Null, |c| value_at(c.as_ref(), r, f.dtype)))
            .collect();
        let order = (ts.value(r), created.map_or(0, |c| c.value(r)), seq.value(r));
        events.push(Event { order, values });
    }
    Ok(entities)
}

/// `key IN (...)` for one join key, an OR of ANDs for composite keys.
pub(super) fn entity_filter(keys: &[quiver_sdk::JoinKey], entities: &[Vec<KeyValue>]) -> Expr {
    let literal = |v: &KeyValue| match v {
        KeyValue::Int(i) => lit(*i),
        KeyValue::Str(s) => lit(s.clone()),
    };
    if keys.len() == 1 {
        return ident(&keys[0].name).in_list(entities.iter().map(|e| literal(&e[0])).collect(), false);
    }
    entities
        .iter()
        .map(|e| keys.iter().zip(e).map(|(k, v)| ident(&k.name).eq(literal(v))).reduce(Expr::and).unwrap_or(lit(true)))
        .reduce(Expr::or)
        .unwrap_or(lit(false))
}
