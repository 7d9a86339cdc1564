//! `verify --since T`: the serving log replayed through the offline join.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::TimestampMicrosecondType as Micros;
use quiver_gpu_join::AsOfKernel;
use quiver_offline::historical::{Arrival, HistoricalOptions, Resolved, ScanCache, SpineRows, historical, resolve};
use quiver_offline::schema::value_at;
use quiver_online::lookup::wire::value_json;
use quiver_online::lookup::{Row, Status};
use quiver_runtime::encoding::{KeyValue, Value};
use quiver_sdk::definitions::FIRST_VERSION;
use quiver_sdk::error::count;
use quiver_sdk::on_demand;
use quiver_sdk::types::format_instant;
use quiver_sdk::{Config, Definitions, FeatureRef, FeatureView, OnDemandView, Timestamp};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::{EXAMPLES, FeatureReport, LogReport};

mod moments;
use crate::error::Result;
use crate::serving_log::LogBatch;

/// Per table (a view's storage name), each version's commit time (UTC microseconds).
type CommitTimes = HashMap<String, HashMap<u64, i64>>;

/// A logged row: (batch, row) in the batches read.
type Logged = (usize, usize);

/// A status, the value as JSON, the row's event time: what was served, or should have been.
type Answer = (Status, String, Option<i64>);

/// How `verify --since` decides what should have been served (docs/consistency.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// By event time at each request time; with `created_cutoff`, only rows created by
    /// then count (as `historical --created-cutoff`: for models trained that way, and
    /// to tell backfills apart).
    EventTime { created_cutoff: bool },
    /// By arrival: a row counts from its Delta commit, and an answer is right when it
    /// is the offline answer at some moment within `lag_us` of its request time — the
    /// moments checked are the request time and every eighth of `lag_us` either side.
    AsArrived { lag_us: i64 },
}

/// Replays the answers logged with `since <= request time < until` (UTC microseconds)
/// through the offline point-in-time join, per feature view, and compares, by `rule`.
///
/// # Errors
/// An unreadable log or table, or a kernel failure.
pub async fn verify_log(
    config: &Config,
    defs: &Definitions,
    since: i64,
    until: i64,
    rule: Rule,
    kernel: &dyn AsOfKernel,
) -> Result<LogReport> {
    let (created_cutoff, arrival) = match rule {
        Rule::EventTime { created_cutoff } => (created_cutoff, None),
        Rule::AsArrived { lag_us } => {
            let mut commits = HashMap::new();
            for view in &defs.feature_views {
                let times = quiver_offline::delta::commit_times(&config.view_table(view)).await?;
                commits.insert(view.storage_name().to_string(), times);
            }
            (false, Some((Arc::new(commits), lag_us.max(0))))
        }
    };
    let batches = crate::serving_log::read(&config.serving_log.location, Timestamp(since)..Timestamp(until)).await?;
    let mut report = LogReport::default();
    // Log rows per view as (batch, row), borrowing the batches' text: millions of rows
    // must not become millions of small allocations.
    let mut by_view: HashMap<&str, Vec<Logged>> = HashMap::new();
    let mut request_ids: HashSet<&str> = HashSet::new();
    for (bi, b) in batches.iter().enumerate() {
        for r in 0..b.num_rows() {
            request_ids.insert(b.request_id(r));
            by_view.entry(b.view(r)).or_default().push((bi, r));
        }
    }
    report.requests = request_ids.len() as u64;
    let replay = Replay { config, defs, batches: &batches, created_cutoff, arrival, kernel };
    let mut names: Vec<&str> = by_view.keys().copied().collect();
    names.sort_unstable();
    for name in names {
        let logged = &by_view[name];
        report.rows += logged.len() as u64;
        // The log names the version read as its storage does: `view` for version 1.
        let version = if name.contains('@') { name.to_string() } else { format!("{name}@{FIRST_VERSION}") };
        if let Some(view) = defs.on_demand_view(&version) {
            replay.on_demand(view, logged, &mut report).await?;
            continue;
        }
        let Some(view) = defs.feature_view(&version) else {
            report.skipped.push(format!("{} of feature view `{name}`, which is no longer defined", count(logged.len(), "row")));
            continue;
        };
        replay.view(view, logged, &mut report).await?;
    }
    Ok(report)
}

/// What every view's replay reads.
struct Replay<'a> {
    config: &'a Config,
    defs: &'a Definitions,
    batches: &'a [LogBatch],
    created_cutoff: bool,
    /// Under [`Rule::AsArrived`]: each table's commit times, and the lag.
    arrival: Option<(Arc<CommitTimes>, i64)>,
    kernel: &'a dyn AsOfKernel,
}

impl Replay<'_> {
    fn row(&self, (bi, r): Logged) -> (&LogBatch, usize) {
        (&self.batches[bi], r)
    }

    /// The joins to run: `base` once, or under [`Rule::AsArrived`] once per shift of
    /// `shifts`, all reading one scan of each table (`scans`).
    fn joins(&self, base: HistoricalOptions, shifts: &[i64], scans: &ScanCache) -> Vec<HistoricalOptions> {
        let Some((commits, _)) = &self.arrival else { return vec![base] };
        shifts
            .iter()
            .map(|&shift_us| {
                let arrival = Arrival { commits: Arc::clone(commits), shift_us, scans: scans.clone() };
                HistoricalOptions { arrival: Some(arrival), ..base.clone() }
            })
            .collect()
    }

    /// Replays one view's logged rows into `report`.
    async fn view(&self, view: &FeatureView, logged: &[Logged], report: &mut LogReport) -> Result<()> {
        let name = &view.versioned_name();
        // The spine: each logged row's keys at its request time.
        let keys = self.defs.join_keys(view);
        let mut parsed: Vec<Vec<KeyValue>> = Vec::with_capacity(logged.len());
        let mut kept: Vec<Logged> = Vec::with_capacity(logged.len());
        for &at in logged {
            let (b, r) = self.row(at);
            let entity: serde_json::Value = serde_json::from_str(b.entity(r)).unwrap_or_default();
            let values: Option<Vec<KeyValue>> =
                keys.iter().map(|k| entity.get(&k.name).and_then(|v| KeyValue::from_json_as(v, k.dtype))).collect();
            if let Some(v) = values {
                parsed.push(v);
                kept.push(at);
            }
        }
        let unparsed = logged.len() - kept.len();
        if unparsed > 0 {
            report.skipped.push(format!("{} of `{name}` whose entity does not match the view's join keys", count(unparsed, "row")));
        }
        if kept.is_empty() {
            return Ok(());
        }
        let spine = super::spine_batch(&keys, &parsed, kept.iter().map(|&at| self.row(at).0.request_time(at.1)))?;
        drop(parsed);
        let scans = ScanCache::default();
        let joins = self.offline_join(view, &spine, &self.grid(), &scans).await?;
        let served = view.served_features();
        let first = spine.num_columns();
        // An event log's join has no event-time column: its aggregations are judged
        // by status and value (docs/aggregations.md: the status follows from the value).
        let grid = Replayed::all(&joins, first, view, &served);
        let at_grid = |j: usize| -> Vec<(&Replayed<'_>, usize)> { grid.iter().map(|r| (r, j)).collect() };
        let mut reports: Vec<FeatureReport> =
            served.iter().map(|f| FeatureReport { feature: format!("{name}:{}", f.name), ..FeatureReport::default() }).collect();
        let mut unreadable = vec![0u64; served.len()];
        let mut gone: BTreeSet<String> = BTreeSet::new();
        // Each row judged against the grid's moments, except (as arrived) one no moment of
        // the grid agrees with: kept, parsed, to be judged after it is checked again at
        // every state within the lag.
        let mut held: Vec<(usize, LoggedRow)> = Vec::new();
        let hold = self.arrival.is_some();
        for (j, &at) in kept.iter().enumerate() {
            let row = self.logged_row(at);
            if !self.compare_row(&at_grid(j), at, &row, Some((&mut reports, &mut unreadable, &mut gone)), hold) && hold {
                held.push((j, row));
            }
        }
        let bad: Vec<usize> = held.iter().map(|(j, _)| *j).collect();
        let table = view.storage_name();
        let (refined_joins, refined_at) = match self.refine(Some(&*table), &spine, &kept, &bad, name, report)? {
            Some((sub, shifts, at)) => (self.offline_join(view, &sub, &shifts, &scans).await?, at),
            None => (Vec::new(), HashMap::new()),
        };
        let refined = Replayed::all(&refined_joins, first, view, &served);
        for (j, row) in held {
            let mut candidates = at_grid(j);
            if let Some(&p) = refined_at.get(&j) {
                candidates.extend(refined.iter().map(|r| (r, p)));
            }
            self.compare_row(&candidates, kept[j], &row, Some((&mut reports, &mut unreadable, &mut gone)), false);
        }
        for gone in gone {
            report.skipped.push(format!("feature `{name}:{gone}` is logged but no longer defined"));
        }
        for (k, n) in unreadable.into_iter().enumerate().filter(|(_, n)| *n > 0) {
            report.skipped.push(format!("{n} logged values of `{name}:{}` with an unknown status", served[k].name));
        }
        // Features never asked for in the window are not reported.
        report.features.extend(reports.into_iter().filter(|f| f.compared > 0));
        Ok(())
    }

    /// The view's features at each spine row, with their event times (one join per
    /// shift of the request times). Unbounded TTL in the join, so a stale row is still
    /// found: the status is decided here, as the online lookup decides it.
    async fn offline_join(&self, view: &FeatureView, spine: &RecordBatch, shifts: &[i64], scans: &ScanCache) -> Result<Vec<RecordBatch>> {
        let refs: Vec<FeatureRef> =
            view.served_features().iter().map(|f| super::versioned_ref(&view.name, view.version, &f.name)).collect();
        // The version logged in place of the latest, as the request that read it did.
        let mut unbounded = crate::ops::pinned(self.defs, &refs)?.into_owned();
        for v in unbounded.feature_views.iter_mut().filter(|v| v.name == view.name) {
            v.ttl = quiver_sdk::Ttl::UNBOUNDED;
        }
        let resolved = resolve(&unbounded, &refs)?;
        let options = HistoricalOptions { event_times: !view.is_event_log(), created_cutoff: self.created_cutoff, ..Default::default() };
        let rows = SpineRows { source: "serving log", rows: spine };
        let mut joins = Vec::new();
        for options in self.joins(options, shifts, scans) {
            joins.push(historical(self.config, &unbounded, rows, &resolved, options, self.kernel, &|_, _| {}).await?);
        }
        Ok(joins)
    }

    /// Logged row `at`'s JSON, parsed once for all of its features.
    fn logged_row(&self, at: Logged) -> LoggedRow {
        let (b, r) = self.row(at);
        let object = |text: &str| match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        // An event log's aggregations each have their own time.
        LoggedRow { values: object(b.values(r)), statuses: object(b.statuses(r)), times: b.event_timestamps(r).map(object) }
    }

    /// Logged row `at` (parsed: `row`) against the offline answers (`candidates`: a
    /// join and the row in it, one per moment checked), feature by feature: whether
    /// every feature agrees with one of them, counted into `out` (reports, unreadable
    /// statuses, features no longer defined) when given — with `only_agreeing`, only
    /// when every feature agrees (a row held to be judged again is counted then).
    fn compare_row(
        &self,
        candidates: &[(&Replayed<'_>, usize)],
        at: Logged,
        row: &LoggedRow,
        out: Option<Judged<'_>>,
        only_agreeing: bool,
    ) -> bool {
        let (b, r) = self.row(at);
        let first = candidates[0].0;
        let view = first.view;
        let LoggedRow { values, statuses, times } = row;
        let request_time = b.request_time(r);
        // Each feature asked for: its answers, or `None` for a status that does not parse.
        let mut judged: Vec<(usize, Option<(Answer, Answer)>)> = Vec::with_capacity(first.served.len());
        for (k, feature) in first.served.iter().enumerate() {
            let Some(status) = statuses.get(&feature.name) else {
                continue; // not asked for in this request
            };
            let Some(served_status) = status.as_str().and_then(Status::parse) else {
                judged.push((k, None));
                continue;
            };
            let served_value = values.get(&feature.name).map_or_else(|| "null".to_string(), ToString::to_string);
            let served_ts = match &times {
                Some(times) => times.get(&feature.name).and_then(|t| t.as_str()).and_then(|t| quiver_sdk::types::parse_instant(t).ok()),
                None => b.event_ts(r),
            };
            let served = (served_status, served_value, served_ts);
            let expected = closest(&served, candidates.iter().map(|(joined, j)| joined.expected(*j, k, request_time, served.2)), false);
            judged.push((k, Some((served, expected))));
        }
        let all = judged.iter().all(|(_, a)| a.as_ref().is_none_or(|(served, expected)| agrees(served, expected, false)));
        if let Some((reports, unreadable, gone)) = out.filter(|_| all || !only_agreeing) {
            for logged in statuses.keys().filter(|f| view.served_feature(f).is_none()) {
                gone.insert(logged.clone());
            }
            for (k, answers) in &judged {
                match answers {
                    Some((served, expected)) => judge(&mut reports[*k], served, expected, request_time, b.entity(r), false),
                    None => unreadable[*k] += 1,
                }
            }
        }
        all
    }
}

/// A logged row's values, statuses and (an event log's) event times by feature.
struct LoggedRow {
    values: serde_json::Map<String, serde_json::Value>,
    statuses: serde_json::Map<String, serde_json::Value>,
    times: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Where [`Replay::compare_row`] counts: the reports per feature, the values with an
/// unknown status per feature, the features logged but no longer defined.
type Judged<'a> = (&'a mut [FeatureReport], &'a mut [u64], &'a mut BTreeSet<String>);

impl Replay<'_> {
    /// Replays one on-demand view's logged rows into `report`: each row's join keys and
    /// request fields (as logged) at its request time through the offline join, which
    /// computes the view's features; the values must be the same bit for bit, the
    /// status follows from the value, and the event time is the one served
    /// (docs/transformations.md#consistency).
    async fn on_demand(&self, view: &OnDemandView, logged: &[Logged], report: &mut LogReport) -> Result<()> {
        let name = &view.versioned_name();
        let keys = on_demand::keys(self.defs, view);
        let fields = on_demand::request_fields(self.defs, view);
        // The features logged (each row names those asked for), still defined.
        let mut asked: Vec<&str> = Vec::new();
        let mut gone: BTreeSet<String> = BTreeSet::new();
        let object = |text: &str| match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        for &at in logged {
            let (b, r) = self.row(at);
            for f in object(b.statuses(r)).keys() {
                match view.feature(f) {
                    Some(feature) if !asked.contains(&feature.name.as_str()) => asked.push(&feature.name),
                    Some(_) => {}
                    None => {
                        gone.insert(f.clone());
                    }
                }
            }
        }
        for gone in gone {
            report.skipped.push(format!("feature `{name}:{gone}` is logged but no longer defined"));
        }
        if asked.is_empty() {
            return Ok(());
        }
        // The spine: the keys the request gave (every row the same ones) and the fields.
        let entities: Vec<serde_json::Map<String, serde_json::Value>> =
            logged.iter().map(|&at| object(self.row(at).0.entity(at.1))).collect();
        let given: Vec<&quiver_sdk::JoinKey> = keys.iter().filter(|k| entities.first().is_some_and(|e| e.contains_key(&k.name))).collect();
        let mut key_rows: Vec<Vec<KeyValue>> = Vec::with_capacity(logged.len());
        let mut field_rows: Vec<Vec<Value>> = Vec::with_capacity(logged.len());
        let mut kept: Vec<Logged> = Vec::with_capacity(logged.len());
        for (entity, &at) in entities.iter().zip(logged) {
            let k: Option<Vec<KeyValue>> =
                given.iter().map(|k| entity.get(&k.name).and_then(|v| KeyValue::from_json_as(v, k.dtype))).collect();
            let f: Option<Vec<Value>> = fields
                .iter()
                .map(|f| quiver_runtime::rows::from_json(entity.get(&f.name).unwrap_or(&serde_json::Value::Null), f.dtype))
                .collect();
            if let (Some(k), Some(f)) = (k, f) {
                key_rows.push(k);
                field_rows.push(f);
                kept.push(at);
            }
        }
        let unparsed = logged.len() - kept.len();
        if unparsed > 0 {
            report.skipped.push(format!("{} of `{name}` whose join keys or request fields do not parse", count(unparsed, "row")));
        }
        if kept.is_empty() {
            return Ok(());
        }
        let given: Vec<quiver_sdk::JoinKey> = given.into_iter().cloned().collect();
        let spine = super::spine_batch(&given, &key_rows, kept.iter().map(|&at| self.row(at).0.request_time(at.1)))?;
        let spine = with_fields(spine, &fields, &field_rows)?;
        drop((key_rows, field_rows));
        let refs: Vec<FeatureRef> = asked.iter().map(|f| super::versioned_ref(&view.name, view.version, f)).collect();
        let defs = crate::ops::pinned(self.defs, &refs)?;
        let resolved = resolve(&defs, &refs)?;
        let options = HistoricalOptions { created_cutoff: self.created_cutoff, ..Default::default() };
        let scans = ScanCache::default();
        let joins = match self.on_demand_joins(&defs, &resolved, &spine, &options, &self.grid(), &scans).await {
            Ok(joins) => joins,
            Err(e) => {
                report.skipped.push(format!("{} of `{name}` cannot be replayed: {e}", count(kept.len(), "row")));
                return Ok(());
            }
        };
        let first = spine.num_columns();
        // Bit for bit, unless the view reads an aggregation, whose float sums are added
        // in another order online (docs/aggregations.md: within 1e-9 relative).
        let exact = !super::reads_aggregations(self.defs, view);
        // Logged row `at` against the offline answers (a join and the row in it, one per
        // moment checked), feature by feature: whether every feature agrees with one,
        // counted into `reports` when given.
        let compare = |candidates: &[(&RecordBatch, usize)], at: Logged, mut reports: Option<&mut [FeatureReport]>| -> bool {
            let (b, r) = self.row(at);
            let (values, statuses) = (object(b.values(r)), object(b.statuses(r)));
            let times = b.event_timestamps(r).map(object).unwrap_or_default();
            let request_time = b.request_time(r);
            let mut all = true;
            for (k, feature) in asked.iter().enumerate() {
                let Some(status) = statuses.get(*feature).and_then(|s| s.as_str()).and_then(Status::parse) else { continue };
                let served_value = values.get(*feature).map_or_else(|| "null".to_string(), ToString::to_string);
                let served_ts = times.get(*feature).and_then(|t| t.as_str()).and_then(|t| quiver_sdk::types::parse_instant(t).ok());
                let dtype = view.feature(feature).expect("asked").dtype;
                let served = (status, served_value, served_ts);
                let expected = closest(
                    &served,
                    candidates.iter().map(|(joined, j)| {
                        let v = value_at(joined.column(first + k).as_ref(), *j, dtype);
                        let expected_status = if v == Value::Null { Status::NullValue } else { Status::Present };
                        (expected_status, value_json(&v), served_ts)
                    }),
                    exact,
                );
                all &= agrees(&served, &expected, exact);
                if let Some(reports) = reports.as_mut() {
                    judge(&mut reports[k], &served, &expected, request_time, b.entity(r), exact);
                }
            }
            all
        };
        let at_grid = |j: usize| -> Vec<(&RecordBatch, usize)> { joins.iter().map(|joined| (joined, j)).collect() };
        let bad: Vec<usize> = match self.arrival {
            Some(_) => (0..kept.len()).filter(|&j| !compare(&at_grid(j), kept[j], None)).collect(),
            None => Vec::new(),
        };
        // Its inputs' tables: every view's, for simplicity (more states, not fewer).
        let (refined, refined_at) = match self.refine(None, &spine, &kept, &bad, name, report)? {
            Some((sub, shifts, at)) => (self.on_demand_joins(&defs, &resolved, &sub, &options, &shifts, &scans).await?, at),
            None => (Vec::new(), HashMap::new()),
        };
        let mut reports: Vec<FeatureReport> =
            asked.iter().map(|f| FeatureReport { feature: format!("{name}:{f}"), ..FeatureReport::default() }).collect();
        for (j, &at) in kept.iter().enumerate() {
            let mut candidates = at_grid(j);
            if let Some(&p) = refined_at.get(&j) {
                candidates.extend(refined.iter().map(|joined| (joined, p)));
            }
            compare(&candidates, at, Some(&mut reports));
        }
        report.features.extend(reports.into_iter().filter(|f| f.compared > 0));
        Ok(())
    }
}

impl Replay<'_> {
    /// An on-demand view's joins of `spine`, one per shift.
    async fn on_demand_joins(
        &self,
        defs: &Definitions,
        resolved: &Resolved<'_>,
        spine: &RecordBatch,
        options: &HistoricalOptions,
        shifts: &[i64],
        scans: &ScanCache,
    ) -> Result<Vec<RecordBatch>> {
        let rows = SpineRows { source: "serving log", rows: spine };
        let mut joins = Vec::new();
        for options in self.joins(options.clone(), shifts, scans) {
            joins.push(historical(self.config, defs, rows, resolved, options, self.kernel, &|_, _| {}).await?);
        }
        Ok(joins)
    }
}

/// `spine` with one column per request field, typed.
fn with_fields(spine: RecordBatch, fields: &[quiver_sdk::Feature], rows: &[Vec<Value>]) -> Result<RecordBatch> {
    use arrow::datatypes::{Field, Schema};
    let mut schema: Vec<Field> = spine.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = spine.columns().to_vec();
    for (i, f) in fields.iter().enumerate() {
        let column = quiver_runtime::arrays::values_to_array(f.dtype, rows.iter().map(|r| &r[i]));
        schema.push(Field::new(&f.name, column.data_type().clone(), true));
        columns.push(column);
    }
    Ok(RecordBatch::try_new(std::sync::Arc::new(Schema::new(schema)), columns)?)
}

/// The offline join of one view's spine: the spine's columns, then the features, then
/// their event time.
struct Replayed<'a> {
    batch: &'a RecordBatch,
    first: usize,
    view: &'a FeatureView,
    /// The view's served features (an event log's aggregations).
    served: &'a [quiver_sdk::Feature],
    /// The winning rows' event times (the column after the features); none for an
    /// event log.
    offline_ts: Option<&'a arrow::array::PrimitiveArray<Micros>>,
}

impl<'a> Replayed<'a> {
    /// Each of `joins` of `view`'s spine (its columns before `first`).
    fn all(joins: &'a [RecordBatch], first: usize, view: &'a FeatureView, served: &'a [quiver_sdk::Feature]) -> Vec<Replayed<'a>> {
        joins
            .iter()
            .map(|joined| {
                let offline_ts = (!view.is_event_log()).then(|| joined.column(first + served.len()).as_primitive::<Micros>());
                Replayed { batch: joined, first, view, served, offline_ts }
            })
            .collect()
    }

    /// What should have been served for feature `k` at spine row `j`, requested at
    /// `request_time`. An aggregation's event time is not judged: the served one is
    /// taken as it is.
    fn expected(&self, j: usize, k: usize, request_time: i64, served_ts: Option<i64>) -> Answer {
        let value = || value_at(self.batch.column(self.first + k).as_ref(), j, self.served[k].dtype);
        let Some(offline_ts) = self.offline_ts else {
            // An aggregation is live whenever asked: its status follows from its value.
            let v = value();
            return (Row::Live(request_time).status(v == Value::Null), value_json(&v), served_ts);
        };
        let found = (!offline_ts.is_null(j)).then(|| offline_ts.value(j));
        // No row, or past the TTL and the key's grace period (the store dropped it): no
        // value and no time; past the TTL: the row's time, no value.
        let row = Row::judge(self.view, found, request_time);
        let v = if matches!(row, Row::Live(_)) { value() } else { Value::Null };
        (row.status(v == Value::Null), value_json(&v), row.event_ts())
    }
}

/// The same status and event time, and values that are floats within 1e-9 relative
/// ([`super::floats_close`]).
fn floats_agree(served: &Answer, expected: &Answer) -> bool {
    let float = |s: &str| s.parse::<f64>().ok();
    match (served.0 == expected.0 && served.2 == expected.2, float(&served.1), float(&expected.1)) {
        (true, Some(a), Some(b)) => super::floats_close(a, b),
        _ => false,
    }
}

/// Of the answers the offline store gives (one, or one per moment checked under
/// [`Rule::AsArrived`]), the one `served` agrees with, else the first (the request
/// time's).
fn closest(served: &Answer, expected: impl IntoIterator<Item = Answer>, exact: bool) -> Answer {
    let mut first = None;
    for e in expected {
        if agrees(served, &e, exact) {
            return e;
        }
        first.get_or_insert(e);
    }
    first.expect("one join at least")
}

/// Whether `served` is `expected`: the same, or (not `exact`) floats that agree.
fn agrees(served: &Answer, expected: &Answer, exact: bool) -> bool {
    served == expected || (!exact && floats_agree(served, expected))
}

/// Counts one served answer against the expected one, keeping a few examples.
fn judge(report: &mut FeatureReport, served: &Answer, expected: &Answer, request_time: i64, entity: &str, exact: bool) {
    report.compared += 1;
    let kind = if agrees(served, expected, exact) {
        report.matches += 1;
        return;
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
    let describe = |(status, value, ts): &Answer| match ts {
        Some(ts) => format!("{} {value} (event {})", status.as_str(), format_instant(*ts)),
        None => status.as_str().to_string(),
    };
    let example =
        format!("{kind}: {entity} at {}: served {}, offline {}", format_instant(request_time), describe(served), describe(expected));
    if report.examples.iter().filter(|e| e.starts_with(kind)).count() < EXAMPLES && !report.examples.contains(&example) {
        report.examples.push(example);
    }
}
