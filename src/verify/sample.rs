//! `verify --sample N`: sampled entities looked up online against the offline winners.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::TimestampMicrosecondType;
use quiver_offline::historical::{EventRange, latest_per_entity};
use quiver_offline::schema::{ViewLayout, key_at, value_at};
use quiver_online::OnlineStore;
use quiver_online::lookup::{Column, Row, Status, get_online_features};
use quiver_runtime::encoding::{KeyValue, Value};
use quiver_sdk::on_demand;
use quiver_sdk::registry::Registered;
use quiver_sdk::{Config, FeatureRef, FeatureView, JoinKey, OnDemandView};
use rand::SeedableRng;
use rand::seq::index::sample;

use super::{EXAMPLES, FeatureReport, floats_close, same_value, show};
use crate::error::Result;

/// Compares up to `n` sampled entities per online view at `now` (UTC microseconds):
/// every live version of each, its features reported as `view@N:feature` for a version
/// after the first (docs/versions.md).
///
/// # Errors
/// An unreadable table or an unavailable online store.
pub async fn verify_sample(
    config: &Config,
    defs: &Registered,
    store: &dyn OnlineStore,
    n: usize,
    now: i64,
    seed: u64,
) -> Result<Vec<FeatureReport>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut reports = Vec::new();
    // Each view's versions together, oldest first.
    let views: Vec<&FeatureView> = defs.feature_views.iter().flat_map(|v| defs.view_versions(&v.name)).filter(|v| v.online).collect();
    for &view in &views {
        if view.is_event_log() {
            reports.extend(sample_event_log(config, defs, store, view, n, now, &mut rng).await?);
            continue;
        }
        let mut per_feature: Vec<FeatureReport> = view
            .features
            .iter()
            .map(|f| FeatureReport { feature: format!("{}:{}", view.versioned_name(), f.name), ..FeatureReport::default() })
            .collect();
        let latest = latest_per_entity(config, defs, view, EventRange::Range { start: i64::MIN, end: now }).await?;
        let Some(batch) = latest.batch else {
            reports.extend(per_feature);
            continue;
        };
        let keys = defs.join_keys(view);
        let rows: Vec<usize> = sample(&mut rng, batch.num_rows(), n.min(batch.num_rows())).into_iter().collect();
        let entities = sampled_entities(&batch, &keys, &rows);
        let refs: Vec<FeatureRef> = view.features.iter().map(|f| super::versioned_ref(&view.name, view.version, &f.name)).collect();
        let online = get_online_features(store, &config.project, defs, &refs, (&entities, &Vec::new()), now, false).await?;
        let sampled = Sampled { view, batch: &batch, layout: ViewLayout::rows(defs, view), rows: &rows, entities: &entities, now };
        for (k, report) in per_feature.iter_mut().enumerate() {
            sampled.compare(k, &online[keys.len() + k], report);
        }
        reports.extend(per_feature);
    }
    let on_demand = defs.on_demand_views.iter().chain(&defs.earlier_versions.on_demand_views);
    for view in on_demand.filter(|v| on_demand::request_fields(defs, v).is_empty()) {
        reports.extend(sample_on_demand(config, defs, store, view, n, now, &mut rng).await?);
    }
    Ok(reports)
}

/// An on-demand view without request fields: sampled entities (each join key's values
/// from the latest rows of a feature view taking it) looked up online at `now` against
/// `historical` for spine rows at `now` — bit for bit, or within 1e-9 relative where the
/// view reads an aggregation; the status follows from the value. Nothing when a view it
/// reads is offline only, or no entity has a row.
async fn sample_on_demand(
    config: &Config,
    defs: &Registered,
    store: &dyn OnlineStore,
    view: &OnDemandView,
    n: usize,
    now: i64,
    rng: &mut rand::rngs::StdRng,
) -> Result<Vec<FeatureReport>> {
    let refs: Vec<FeatureRef> = view.features.iter().map(|f| super::versioned_ref(&view.name, view.version, &f.name)).collect();
    if quiver_online::lookup::LookupPlan::new(defs, refs.clone(), false).is_err() {
        return Ok(Vec::new());
    }
    let keys = on_demand::keys(defs, view);
    let mut columns: Vec<Vec<KeyValue>> = Vec::with_capacity(keys.len());
    for key in &keys {
        let Some(source) = defs.feature_views.iter().find(|v| !v.is_event_log() && defs.join_keys(v).iter().any(|k| k.name == key.name))
        else {
            return Ok(Vec::new());
        };
        let latest = latest_per_entity(config, defs, source, EventRange::Range { start: i64::MIN, end: now }).await?;
        let Some(batch) = latest.batch else { return Ok(Vec::new()) };
        let at = defs.join_keys(source).iter().position(|k| k.name == key.name).expect("found");
        let column = batch.column(ViewLayout::rows(defs, source).keys().start + at);
        let rows = sample(rng, batch.num_rows(), n.min(batch.num_rows()));
        columns.push(rows.into_iter().map(|r| key_at(key.dtype, column.as_ref(), r)).collect());
    }
    let m = columns.iter().map(Vec::len).min().unwrap_or(0);
    if m == 0 {
        return Ok(Vec::new());
    }
    let entities: Vec<(String, Vec<KeyValue>)> = keys.iter().zip(&columns).map(|(k, c)| (k.name.clone(), c[..m].to_vec())).collect();
    let online = get_online_features(store, &config.project, defs, &refs, (&entities, &Vec::new()), now, false).await?;
    let picked: Vec<Vec<KeyValue>> = (0..m).map(|j| columns.iter().map(|c| c[j].clone()).collect()).collect();
    let spine = super::spine_batch(&keys, &picked, std::iter::repeat_n(now, m))?;
    // The versions its inputs are pinned to, in place of the latest.
    let pinned = crate::ops::pinned(defs, &refs)?;
    let requests = quiver_offline::historical::resolve(&pinned, &refs)?;
    let rows = quiver_offline::historical::SpineRows { source: "verify --sample", rows: &spine };
    let kernel = quiver_gpu_join::CpuKernel::new();
    let options = quiver_offline::historical::HistoricalOptions::default();
    let offline = quiver_offline::historical::historical(config, &pinned, rows, &requests, options, &kernel, &|_, _| {}).await?;
    let exact = !super::reads_aggregations(defs, view);
    let mut reports = Vec::with_capacity(refs.len());
    for (k, feature) in view.features.iter().enumerate() {
        let mut report = FeatureReport { feature: format!("{}:{}", view.versioned_name(), feature.name), ..FeatureReport::default() };
        let column = &online[keys.len() + k];
        for j in 0..m {
            let want = value_at(offline.column(spine.num_columns() + k).as_ref(), j, feature.dtype);
            let expected = (if want == Value::Null { Status::NullValue } else { Status::Present }, want);
            let got = (column.statuses[j], column.values[j].clone());
            report.compared += 1;
            let same = match (&got.1, &expected.1) {
                (Value::Float64(a), Value::Float64(b)) if !exact => got.0 == expected.0 && floats_close(*a, *b),
                (Value::Float64(a), Value::Float64(b)) => got.0 == expected.0 && (a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
                _ => got.0 == expected.0 && same_value(&got.1, &expected.1),
            };
            if same {
                report.matches += 1;
                continue;
            }
            report.mismatches += 1;
            if report.examples.len() < EXAMPLES {
                let entity = entities.iter().map(|(name, v)| format!("{name}={}", v[j])).collect::<Vec<_>>().join(",");
                report.examples.push(format!(
                    "{entity}: online {} {}, offline {} {}",
                    got.0.as_str(),
                    show(&got.1),
                    expected.0.as_str(),
                    show(&expected.1)
                ));
            }
        }
        reports.push(report);
    }
    Ok(reports)
}

/// An event log's sampled entities (among those with events its windows can count at
/// `now`): each aggregation online at `now` against `historical` for a spine row at
/// `now` (docs/aggregations.md), floats within 1e-9 relative.
async fn sample_event_log(
    config: &Config,
    defs: &Registered,
    store: &dyn OnlineStore,
    view: &FeatureView,
    n: usize,
    now: i64,
    rng: &mut rand::rngs::StdRng,
) -> Result<Vec<FeatureReport>> {
    let served = view.served_features();
    let mut reports: Vec<FeatureReport> = served
        .iter()
        .map(|f| FeatureReport { feature: format!("{}:{}", view.versioned_name(), f.name), ..FeatureReport::default() })
        .collect();
    let since = quiver_runtime::record::Layout::of(view).earliest_tail(now);
    let events = quiver_offline::historical::events_since(config, defs, view, since, None).await?;
    if events.entities.is_empty() {
        return Ok(reports);
    }
    let picked: Vec<Vec<KeyValue>> =
        sample(rng, events.entities.len(), n.min(events.entities.len())).into_iter().map(|i| events.entities[i].0.clone()).collect();
    let keys = defs.join_keys(view);
    let entities: Vec<(String, Vec<KeyValue>)> =
        keys.iter().enumerate().map(|(i, k)| (k.name.clone(), picked.iter().map(|p| p[i].clone()).collect())).collect();
    let refs: Vec<FeatureRef> = served.iter().map(|f| super::versioned_ref(&view.name, view.version, &f.name)).collect();
    let online = get_online_features(store, &config.project, defs, &refs, (&entities, &Vec::new()), now, false).await?;
    let spine = super::spine_batch(&keys, &picked, std::iter::repeat_n(now, picked.len()))?;
    // The version sampled in place of the latest, as any request for it reads it.
    let pinned = crate::ops::pinned(defs, &refs)?;
    let requests = quiver_offline::historical::resolve(&pinned, &refs)?;
    let rows = quiver_offline::historical::SpineRows { source: "verify --sample", rows: &spine };
    let kernel = quiver_gpu_join::CpuKernel::new();
    let options = quiver_offline::historical::HistoricalOptions::default();
    let offline = quiver_offline::historical::historical(config, &pinned, rows, &requests, options, &kernel, &|_, _| {}).await?;
    for (k, report) in reports.iter_mut().enumerate() {
        let column = &online[keys.len() + k];
        let off = offline.column(spine.num_columns() + k);
        for j in 0..picked.len() {
            let want = value_at(off.as_ref(), j, served[k].dtype);
            // An aggregation is live whenever asked: its status follows from its value.
            let expected = (Row::Live(now).status(want == Value::Null), want);
            let got = (column.statuses[j], column.values[j].clone());
            report.compared += 1;
            let close = match (&got.1, &expected.1) {
                (Value::Float64(a), Value::Float64(b)) => got.0 == expected.0 && floats_close(*a, *b),
                _ => false,
            };
            if (got.0 == expected.0 && same_value(&got.1, &expected.1)) || close {
                report.matches += 1;
                continue;
            }
            let entity = entities.iter().map(|(name, v)| format!("{name}={}", v[j])).collect::<Vec<_>>().join(",");
            if got.0 == Status::NotFound {
                report.missing_online += 1;
            } else {
                report.mismatches += 1;
            }
            if report.examples.len() < EXAMPLES {
                report.examples.push(format!("{entity}: online {} {}, offline {}", got.0.as_str(), show(&got.1), show(&expected.1)));
            }
        }
    }
    Ok(reports)
}

/// The join keys of the offline winners at `rows`, as the lookup takes them.
fn sampled_entities(batch: &RecordBatch, keys: &[JoinKey], rows: &[usize]) -> Vec<(String, Vec<KeyValue>)> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| {
            let col = batch.column(i);
            let values = rows.iter().map(|&r| key_at(k.dtype, col, r)).collect();
            (k.name.clone(), values)
        })
        .collect()
}

/// One view's sampled offline winners, and the entities looked up.
struct Sampled<'a> {
    view: &'a FeatureView,
    batch: &'a RecordBatch,
    layout: ViewLayout,
    rows: &'a [usize],
    entities: &'a [(String, Vec<KeyValue>)],
    now: i64,
}

impl Sampled<'_> {
    /// Feature `k`'s online answers (`column`) against its offline winners.
    fn compare(&self, k: usize, column: &Column, report: &mut FeatureReport) {
        let feature = &self.view.features[k];
        let ts = self.batch.column(self.layout.event_time()).as_primitive::<TimestampMicrosecondType>();
        for (j, &r) in self.rows.iter().enumerate() {
            // Judged as the lookup answers: an expired key is NOT_FOUND, not missing.
            let offline = value_at(self.batch.column(self.layout.feature(k)).as_ref(), r, feature.dtype);
            let row = Row::judge(self.view, Some(ts.value(r)), self.now);
            let value = if matches!(row, Row::Live(_)) { offline } else { Value::Null };
            let expected = (row.status(value == Value::Null), value);
            let got = (column.statuses[j], column.values[j].clone());
            report.compared += 1;
            let entity = || self.entities.iter().map(|(name, v)| format!("{name}={}", v[j])).collect::<Vec<_>>().join(",");
            // A NaN online and offline agree (docs/consistency.md).
            if got.0 == expected.0 && same_value(&got.1, &expected.1) {
                report.matches += 1;
            } else if got.0 == Status::NotFound {
                report.missing_online += 1;
                if report.examples.len() < EXAMPLES {
                    report.examples.push(format!("{}: missing online (offline {} {})", entity(), expected.0.as_str(), show(&expected.1)));
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
}
