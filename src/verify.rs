//! `verify --sample N`: does the online store agree with the offline store now?
//!
//! For every online view, the offline winner of each entity at `now` (SPEC §3: the
//! latest row by event time, created time, ingestion order, within the ttl) is the
//! expectation; `N` entities are drawn at random (seeded) and looked up online at the
//! same `now`, through the same lookup the server uses. Per feature: rows compared,
//! exact matches, mismatches (a different value or status), and missing online (the
//! offline store has the entity, the online store does not). Entities only the online
//! store has cannot be found by sampling the offline store; that needs the serving log
//! (`verify --since`, not built yet).

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use quiver_offline::historical::{Window, latest_per_entity};
use quiver_offline::schema::value_at;
use quiver_online::OnlineStore;
use quiver_online::lookup::{Status, get_online_features};
use quiver_sdk::encoding::{KeyValue, Value};
use quiver_sdk::{Config, Definitions, FeatureRef, KeyType};
use rand::SeedableRng;
use rand::seq::index::sample;

use crate::error::Result;

/// What one feature's comparison found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FeatureReport {
    /// `view:feature`.
    pub feature: String,
    pub compared: u64,
    pub matches: u64,
    pub mismatches: u64,
    pub missing_online: u64,
    /// A few mismatches and missing rows, described for people.
    pub examples: Vec<String>,
}

impl FeatureReport {
    /// Mismatched or missing rows over rows compared.
    pub fn mismatch_rate(&self) -> f64 {
        if self.compared == 0 {
            0.0
        } else {
            (self.mismatches + self.missing_online) as f64 / self.compared as f64
        }
    }
}

const EXAMPLES: usize = 3;

/// Compares up to `n` sampled entities per online view at `now` (UTC microseconds).
///
/// # Errors
/// An unreadable table or an unavailable online store.
pub async fn verify_sample(
    config: &Config,
    defs: &Definitions,
    store: &dyn OnlineStore,
    n: usize,
    now: i64,
    seed: u64,
) -> Result<Vec<FeatureReport>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut reports = Vec::new();
    for view in defs.feature_views.iter().filter(|v| v.online) {
        let mut per_feature: Vec<FeatureReport> = view
            .features
            .iter()
            .map(|f| FeatureReport { feature: format!("{}:{}", view.name, f.name), ..FeatureReport::default() })
            .collect();
        let latest = latest_per_entity(config, defs, view, Window::Range { start: i64::MIN, end: now }).await?;
        let Some(batch) = latest.batch else {
            reports.extend(per_feature);
            continue;
        };
        let keys = defs.join_keys(view);
        let rows: Vec<usize> = sample(&mut rng, batch.num_rows(), n.min(batch.num_rows())).into_iter().collect();
        let entities: Vec<(String, Vec<KeyValue>)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let col = batch.column(i);
                let values = rows
                    .iter()
                    .map(|&r| match k.dtype {
                        KeyType::Int64 => KeyValue::Int(col.as_primitive::<Int64Type>().value(r)),
                        KeyType::String => KeyValue::Str(col.as_string::<i32>().value(r).to_string()),
                    })
                    .collect();
                (k.name.clone(), values)
            })
            .collect();
        let refs: Vec<FeatureRef> = view.features.iter().map(|f| FeatureRef::new(&view.name, &f.name)).collect();
        let online = get_online_features(store, &config.project, defs, &refs, &entities, now, false).await?;
        let ts = batch.column(keys.len()).as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        let first_feature = keys.len() + 1 + usize::from(view.source.created_timestamp_field.is_some());
        let ttl_us = view.ttl_us();
        for (k, feature) in view.features.iter().enumerate() {
            let column = &online[keys.len() + k];
            let report = &mut per_feature[k];
            for (j, &r) in rows.iter().enumerate() {
                let stale = ttl_us.is_some_and(|ttl| now.saturating_sub(ts.value(r)) > ttl);
                let offline = value_at(batch.column(first_feature + k).as_ref(), r, feature.dtype);
                let expected = match (&offline, stale) {
                    (_, true) => (Status::OutsideMaxAge, Value::Null),
                    (Value::Null, false) => (Status::NullValue, Value::Null),
                    (v, false) => (Status::Present, v.clone()),
                };
                let got = (column.statuses[j], column.values[j].clone());
                report.compared += 1;
                let entity = || entities.iter().map(|(name, v)| format!("{name}={}", v[j])).collect::<Vec<_>>().join(",");
                if got == expected {
                    report.matches += 1;
                } else if got.0 == Status::NotFound {
                    report.missing_online += 1;
                    if report.examples.len() < EXAMPLES {
                        report.examples.push(format!("{}: missing online (offline {:?} {})", entity(), expected.0, show(&expected.1)));
                    }
                } else {
                    report.mismatches += 1;
                    if report.examples.len() < EXAMPLES {
                        report.examples.push(format!(
                            "{}: online {} {}, offline {} {}",
                            entity(),
                            got.0.as_str(),
                            show(&got.1),
                            expected.0.as_str(),
                            show(&expected.1)
                        ));
                    }
                }
            }
        }
        reports.extend(per_feature);
    }
    Ok(reports)
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        other => format!("{other:?}"),
    }
}
