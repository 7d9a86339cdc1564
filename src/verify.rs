//! `verify`: does the online store agree with the offline store?
//!
//! `verify --since T [--until T]` ([`verify_log`]) replays the serving log: every
//! logged answer is joined point in time at its request time by the offline join, and
//! each served value, status and event time is compared with what the offline store
//! says should have been served then (SPEC §3/§4: the latest row by event time, created
//! time and ingestion order at or before the request; TTL -> OUTSIDE_MAX_AGE; null ->
//! NULL_VALUE; no row -> NOT_FOUND). Served NOT_FOUND where offline has a row is
//! *missing online*; a served row where offline has none is *missing offline*.
//!
//! `verify --sample N` ([`verify_sample`]) needs no log:
//! For every online view, the offline winner of each entity at `now` (SPEC §3: the
//! latest row by event time, created time, ingestion order, within the ttl) is the
//! expectation; `N` entities are drawn at random (seeded) and looked up online at the
//! same `now`, through the same lookup the server uses. Per feature: rows compared,
//! exact matches, mismatches (a different value or status), and missing online (the
//! offline store has the entity, the online store does not). Entities only the online
//! store has cannot be found by sampling the offline store; that needs the serving log.

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use quiver_offline::historical::{Window, latest_per_entity};
use quiver_offline::schema::value_at;
use quiver_online::OnlineStore;
use quiver_online::lookup::{Status, expected_status, get_online_features};
use quiver_sdk::encoding::{KeyValue, Value};
use quiver_sdk::{Config, Definitions, FeatureRef, KeyType};
use rand::SeedableRng;
use rand::seq::index::sample;
use std::sync::Arc;

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
    /// Served a row where the offline store has none (only the serving log can tell).
    pub missing_offline: u64,
    /// A few mismatches and missing rows, described for people.
    pub examples: Vec<String>,
}

impl FeatureReport {
    /// Mismatched or missing rows over rows compared.
    pub fn mismatch_rate(&self) -> f64 {
        if self.compared == 0 { 0.0 } else { (self.mismatches + self.missing_online + self.missing_offline) as f64 / self.compared as f64 }
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
        let layout = quiver_offline::schema::ViewLayout::rows(defs, view);
        let ts = batch.column(layout.event_time()).as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        for (k, feature) in view.features.iter().enumerate() {
            let column = &online[keys.len() + k];
            let report = &mut per_feature[k];
            for (j, &r) in rows.iter().enumerate() {
                // Judged as the lookup answers: an expired key is NOT_FOUND, not missing.
                let offline = value_at(batch.column(layout.feature(k)).as_ref(), r, feature.dtype);
                let expected = match (expected_status(view, Some(ts.value(r)), now), &offline) {
                    (Status::Present, Value::Null) => (Status::NullValue, Value::Null),
                    (Status::Present, v) => (Status::Present, v.clone()),
                    (status, _) => (status, Value::Null),
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

/// What replaying the serving log found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogReport {
    /// Distinct requests replayed.
    pub requests: u64,
    /// Log rows (entity rows x views) replayed.
    pub rows: u64,
    pub features: Vec<FeatureReport>,
    /// Log rows that could not be replayed, and why (a view or feature no longer
    /// defined, an entity that does not parse).
    pub skipped: Vec<String>,
}

/// Replays the answers logged with `since <= request time < until` (UTC microseconds)
/// through the offline point-in-time join, per feature view, and compares. With
/// `created_cutoff`, only rows created by each request time count (as `historical
/// --created-cutoff`: for models trained that way, and to tell backfills apart).
///
/// # Errors
/// An unreadable log or table, or a kernel failure.
pub async fn verify_log(
    config: &Config,
    defs: &Definitions,
    since: i64,
    until: i64,
    created_cutoff: bool,
    kernel: &dyn quiver_gpu_join::AsOfKernel,
) -> Result<LogReport> {
    use arrow::datatypes::TimestampMicrosecondType as Micros;
    use std::collections::{BTreeSet, HashMap, HashSet};
    let batches = quiver_offline::serving_log::read(&config.serving_log.location, since, until).await?;
    let mut report = LogReport::default();
    // Log rows per view as (batch, row), borrowing the batches' text: millions of rows
    // must not become millions of small allocations.
    let mut by_view: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
    let mut request_ids: HashSet<&str> = HashSet::new();
    for (bi, b) in batches.iter().enumerate() {
        let (ids, views) = (b.column(0).as_string::<i32>(), b.column(2).as_string::<i32>());
        for r in 0..b.num_rows() {
            request_ids.insert(ids.value(r));
            by_view.entry(views.value(r)).or_default().push((bi, r));
        }
    }
    report.requests = request_ids.len() as u64;
    let text = |bi: usize, column: usize, r: usize| batches[bi].column(column).as_string::<i32>().value(r);
    let time = |bi: usize, r: usize| batches[bi].column(1).as_primitive::<Micros>().value(r);
    let served_ts = |bi: usize, r: usize| {
        let c = batches[bi].column(4).as_primitive::<Micros>();
        c.is_valid(r).then(|| c.value(r))
    };
    let mut names: Vec<&str> = by_view.keys().copied().collect();
    names.sort_unstable();
    for name in names {
        let logged = &by_view[name];
        report.rows += logged.len() as u64;
        let Some(view) = defs.feature_view(name) else {
            report.skipped.push(format!("{} rows of feature view `{name}`, which is no longer defined", logged.len()));
            continue;
        };
        // The spine: each logged row's keys at its request time.
        let keys = defs.join_keys(view);
        let mut parsed: Vec<Vec<KeyValue>> = Vec::with_capacity(logged.len());
        let mut kept: Vec<(usize, usize)> = Vec::with_capacity(logged.len());
        let mut unparsed = 0;
        for &(bi, r) in logged {
            let entity: serde_json::Value = serde_json::from_str(text(bi, 3, r)).unwrap_or_default();
            let values: Option<Vec<KeyValue>> =
                keys.iter().map(|k| entity.get(&k.name).and_then(|v| KeyValue::from_json_as(v, k.dtype))).collect();
            match values {
                Some(v) => {
                    parsed.push(v);
                    kept.push((bi, r));
                }
                None => unparsed += 1,
            }
        }
        if unparsed > 0 {
            report.skipped.push(format!("{unparsed} rows of `{name}` whose entity does not match the view's join keys"));
        }
        let features: Vec<&quiver_sdk::Feature> = view.features.iter().collect();
        let mut reports: Vec<FeatureReport> =
            features.iter().map(|f| FeatureReport { feature: format!("{name}:{}", f.name), ..FeatureReport::default() }).collect();
        if kept.is_empty() {
            continue;
        }
        let spine = spine_batch(&keys, &parsed, kept.iter().map(|&(bi, r)| time(bi, r)))?;
        drop(parsed);
        // Unbounded TTL in the join, so a stale row is still found: the status is decided
        // here, as the online lookup decides it.
        let mut unbounded = defs.clone();
        for v in unbounded.feature_views.iter_mut().filter(|v| v.name == name) {
            v.ttl = quiver_sdk::Ttl::UNBOUNDED;
        }
        let refs: Vec<FeatureRef> = features.iter().map(|f| FeatureRef::new(name, &f.name)).collect();
        let resolved = quiver_offline::historical::resolve(&unbounded, &refs)?;
        let joined = quiver_offline::historical::historical(
            config,
            &unbounded,
            quiver_offline::historical::SpineRows { source: std::path::Path::new("serving log"), rows: &spine },
            &resolved,
            quiver_offline::historical::HistoricalOptions {
                event_times: true,
                // Views without a created time have nothing to cut by.
                created_cutoff: created_cutoff && view.source.created_timestamp_field.is_some(),
                ..Default::default()
            },
            kernel,
            &|_, _| {},
        )
        .await?;
        let first = spine.num_columns();
        let offline_ts = joined.column(first + features.len()).as_primitive::<Micros>();
        let mut unreadable = vec![0u64; features.len()];
        let mut gone: BTreeSet<String> = BTreeSet::new();
        for (j, &(bi, r)) in kept.iter().enumerate() {
            // Each row's JSON parsed once, for all of its features.
            let object = |column| match serde_json::from_str::<serde_json::Value>(text(bi, column, r)) {
                Ok(serde_json::Value::Object(m)) => m,
                _ => serde_json::Map::new(),
            };
            let (values, statuses) = (object(5), object(6));
            for logged in statuses.keys().filter(|f| view.feature(f).is_none()) {
                gone.insert(logged.clone());
            }
            let (request_time, event_ts) = (time(bi, r), served_ts(bi, r));
            // The offline expectation, up to the value: the row's event time and status.
            let found = (!offline_ts.is_null(j)).then(|| offline_ts.value(j));
            for (k, feature) in features.iter().enumerate() {
                let Some(status) = statuses.get(&feature.name) else {
                    continue; // not asked for in this request
                };
                let Some(served_status) = status.as_str().and_then(quiver_online::serving_log::parse_status) else {
                    unreadable[k] += 1;
                    continue;
                };
                let served_value = values.get(&feature.name).map_or_else(|| "null".to_string(), ToString::to_string);
                let served = (served_status, served_value, event_ts);
                let expected = match (expected_status(view, found, request_time), found) {
                    // No row, or past the TTL and the key's grace period: the store dropped it.
                    (Status::NotFound, _) | (_, None) => (Status::NotFound, "null".to_string(), None),
                    (Status::OutsideMaxAge, ts) => (Status::OutsideMaxAge, "null".to_string(), ts),
                    (_, Some(ts)) => match value_at(joined.column(first + k).as_ref(), j, feature.dtype) {
                        Value::Null => (Status::NullValue, "null".to_string(), Some(ts)),
                        v => (Status::Present, quiver_online::serving_log::value_json(&v), Some(ts)),
                    },
                };
                let report = &mut reports[k];
                report.compared += 1;
                let kind = if served == expected {
                    report.matches += 1;
                    continue;
                } else if served.2.is_some_and(|t| t > request_time) {
                    // The online store held a row from after the request: never right.
                    report.mismatches += 1;
                    "mismatch (served a row from after the request)"
                } else if served.0 == Status::NotFound {
                    report.missing_online += 1;
                    "missing online"
                } else if expected.0 == Status::NotFound {
                    report.missing_offline += 1;
                    "missing offline"
                } else {
                    report.mismatches += 1;
                    "mismatch"
                };
                let describe = |(status, value, ts): &(Status, String, Option<i64>)| match ts {
                    Some(ts) => format!("{} {value} (event {})", status.as_str(), quiver_sdk::rows::format_instant(*ts)),
                    None => status.as_str().to_string(),
                };
                let example = format!(
                    "{kind}: {} at {}: served {}, offline {}",
                    text(bi, 3, r),
                    quiver_sdk::rows::format_instant(request_time),
                    describe(&served),
                    describe(&expected)
                );
                if report.examples.iter().filter(|e| e.starts_with(kind)).count() < EXAMPLES && !report.examples.contains(&example) {
                    report.examples.push(example);
                }
            }
        }
        for gone in gone {
            report.skipped.push(format!("feature `{name}:{gone}` is logged but no longer defined"));
        }
        for (k, n) in unreadable.into_iter().enumerate().filter(|(_, n)| *n > 0) {
            report.skipped.push(format!("{n} logged values of `{name}:{}` with an unknown status", features[k].name));
        }
        // Features never asked for in the window are not reported.
        report.features.extend(reports.into_iter().filter(|f| f.compared > 0));
    }
    Ok(report)
}

/// A spine of the view's keys and `event_timestamp` = the request times.
fn spine_batch(
    keys: &[quiver_sdk::JoinKey],
    rows: &[Vec<KeyValue>],
    times: impl Iterator<Item = i64>,
) -> Result<arrow::array::RecordBatch> {
    use arrow::array::{ArrayRef, TimestampMicrosecondArray};
    use arrow::datatypes::{Field, Schema};
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let column = quiver_offline::schema::key_array(k.dtype, rows.iter().map(|r| &r[i]));
        fields.push(Field::new(&k.name, column.data_type().clone(), false));
        columns.push(column);
    }
    let ts = TimestampMicrosecondArray::from_iter_values(times).with_timezone("UTC");
    fields.push(Field::new(quiver_offline::historical::SPINE_TIMESTAMP, ts.data_type().clone(), false));
    columns.push(Arc::new(ts));
    Ok(arrow::array::RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}
