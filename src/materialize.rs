//! Materialization: the latest offline row of every entity, written to the online store
//! through the guarded write (SPEC §4), in large pipelined batches.

use std::time::Instant;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use quiver_offline::historical::latest_per_entity;
use quiver_offline::schema::value_at;
use quiver_online::{OnlineStore, WriteRow};
use quiver_sdk::encoding::{KeyValue, OnlineRow, fingerprint, store_key};
use quiver_sdk::{Config, Definitions, FeatureView, KeyType};

use crate::error::Result;

/// How long a key outlives its TTL in the online store, so that reads in that window
/// say OUTSIDE_MAX_AGE (after it they say NOT_FOUND).
pub const KEY_GRACE_MS: i64 = 24 * 3600 * 1000;

/// Rows per store write (each one pipelined round trip or one embedded transaction).
const WRITE_BATCH: usize = 10_000;

/// What materializing one view did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewReport {
    pub view: String,
    /// Entities whose latest row was loaded from the offline store.
    pub entities: usize,
    /// Rows the store took (the rest were older than what it held).
    pub written: usize,
}

/// The online rows of one view's latest-per-entity batch.
pub fn online_rows(project: &str, defs: &Definitions, view: &FeatureView, batch: &RecordBatch) -> Vec<WriteRow> {
    let keys = defs.join_keys(view);
    let n_keys = keys.len();
    let ts = batch.column(n_keys).as_primitive::<TimestampMicrosecondType>();
    let created = view
        .source
        .created_timestamp_field
        .as_ref()
        .map(|_| batch.column(n_keys + 1).as_primitive::<TimestampMicrosecondType>());
    let first_feature = n_keys + 1 + usize::from(created.is_some());
    let print = fingerprint(view);
    let ttl_ms = view.ttl.as_duration().map(|d| d.as_millis() as i64);
    (0..batch.num_rows())
        .map(|r| {
            let key_values: Vec<KeyValue> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| match k.dtype {
                    KeyType::Int64 => KeyValue::Int(batch.column(i).as_primitive::<Int64Type>().value(r)),
                    KeyType::String => KeyValue::Str(batch.column(i).as_string::<i32>().value(r).to_string()),
                })
                .collect();
            let event_ts = ts.value(r);
            let row = OnlineRow {
                event_ts,
                created_ts: created.map_or(i64::MIN, |c| c.value(r)),
                fingerprint: print,
                values: view
                    .features
                    .iter()
                    .enumerate()
                    .map(|(k, f)| value_at(batch.column(first_feature + k).as_ref(), r, f.dtype))
                    .collect(),
            };
            WriteRow {
                key: store_key(project, &view.name, &key_values),
                row: row.encode(),
                expire_at_ms: ttl_ms.map(|ttl| event_ts.div_euclid(1000).saturating_add(ttl).saturating_add(KEY_GRACE_MS)),
            }
        })
        .collect()
}

/// Loads, for each view, the latest row per entity with event time in `[start, end]`
/// (UTC microseconds) into the online store.
///
/// # Errors
/// An unreadable table or an unavailable store; rows written before the failure stay
/// (a rerun is idempotent: the guarded write ignores nothing newer and replaces equals).
pub async fn materialize(
    config: &Config,
    defs: &Definitions,
    views: &[&FeatureView],
    start: i64,
    end: i64,
    store: &dyn OnlineStore,
    progress: &(dyn Fn(&str, u64) + Sync),
) -> Result<Vec<ViewReport>> {
    let mut reports = Vec::new();
    for view in views {
        let began = Instant::now();
        let Some(batch) = latest_per_entity(config, defs, view, start, end).await? else {
            reports.push(ViewReport { view: view.name.clone(), entities: 0, written: 0 });
            continue;
        };
        let rows = online_rows(&config.project, defs, view, &batch);
        let mut written = 0;
        for (i, chunk) in rows.chunks(WRITE_BATCH).enumerate() {
            written += store.write(chunk).await?;
            progress(&format!("materializing {}", view.name), ((i + 1) * WRITE_BATCH).min(rows.len()) as u64);
        }
        tracing::debug!(view = %view.name, entities = rows.len(), written, secs = began.elapsed().as_secs_f64(), "materialized");
        reports.push(ViewReport { view: view.name.clone(), entities: rows.len(), written });
    }
    Ok(reports)
}
