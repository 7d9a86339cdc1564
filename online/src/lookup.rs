//! Online lookups: features for entity rows, with SPEC §4's statuses, in Feast's
//! column-major shape (the join keys first, then one column per feature).

use std::collections::HashMap;

use quiver_sdk::aggregation::record::{AggRecord, Layout};
use quiver_sdk::encoding::{KeyValue, OnlineRow, Value, fingerprint, store_key};
use quiver_sdk::{Definitions, FeatureRef, FeatureView, KeyType};

use crate::error::{Error, Result};
use crate::store::OnlineStore;

/// The status of one value (Feast's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Present,
    NullValue,
    NotFound,
    OutsideMaxAge,
}

impl Status {
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Present => "PRESENT",
            Status::NullValue => "NULL_VALUE",
            Status::NotFound => "NOT_FOUND",
            Status::OutsideMaxAge => "OUTSIDE_MAX_AGE",
        }
    }

    /// The status named as in answers and the serving log (`PRESENT`, ...).
    pub fn parse(text: &str) -> Option<Status> {
        [Status::Present, Status::NullValue, Status::NotFound, Status::OutsideMaxAge].into_iter().find(|s| s.as_str() == text)
    }
}

/// What the online store answers at `at` (UTC microseconds) for an entity whose latest
/// row has event time `event_ts` (`None`: no row was ever written): [`Status::NotFound`]
/// once the key has expired (the TTL plus [`quiver_sdk::encoding::KEY_GRACE_MS`] after
/// the event, as both stores expire keys), [`Status::OutsideMaxAge`] past the TTL, else
/// [`Status::Present`] (or [`Status::NullValue`], which depends on the value). The rule
/// `verify` judges the stores by.
pub fn expected_status(view: &quiver_sdk::FeatureView, event_ts: Option<i64>, at: i64) -> Status {
    let Some(ts) = event_ts else { return Status::NotFound };
    if quiver_sdk::encoding::expire_at_ms(view, ts).is_some_and(|expire| at.div_euclid(1000) >= expire) {
        return Status::NotFound;
    }
    if view.ttl_us().is_some_and(|ttl| at.saturating_sub(ts) > ttl) {
        return Status::OutsideMaxAge;
    }
    Status::Present
}

/// One output column: a join key or a feature, one entry per entity row.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub values: Vec<Value>,
    pub statuses: Vec<Status>,
    /// Event time of each value (UTC microseconds); `None` for keys and missing rows.
    pub event_ts: Vec<Option<i64>>,
}

/// Earlier layouts of one view met in a lookup: for each schema fingerprint, where each
/// current feature sits in the old row (`None`: the feature is new, or its type
/// changed: it reads as null).
#[derive(Default)]
struct Layouts(HashMap<u64, Option<Vec<Option<usize>>>>);

impl Layouts {
    /// `row` (written under another schema of `view`) in the view's current feature
    /// order; `None` when the registry does not know the schema it was written under.
    fn conform(&mut self, defs: &Definitions, view: &quiver_sdk::FeatureView, row: OnlineRow) -> Option<OnlineRow> {
        let positions = self
            .0
            .entry(row.fingerprint)
            .or_insert_with(|| {
                let old = defs.online_layout(row.fingerprint)?;
                Some(view.features.iter().map(|f| old.iter().position(|o| o.name == f.name && o.dtype == f.dtype)).collect())
            })
            .as_ref()?;
        let width = defs.online_layout(row.fingerprint).map_or(0, <[_]>::len);
        if row.values.len() != width {
            return None;
        }
        let mut values = row.values;
        let conformed = positions.iter().map(|p| p.map_or(Value::Null, |i| std::mem::replace(&mut values[i], Value::Null))).collect();
        Some(OnlineRow { values: conformed, fingerprint: fingerprint(view), ..row })
    }
}

/// The entity rows of a request, column-major: each join key and its values.
pub type EntityColumns = Vec<(String, Vec<KeyValue>)>;

/// Reads `refs` for every entity row at time `now` (UTC microseconds), in one store
/// round trip. Columns: the join keys as given, then the features in request order,
/// named `view__feature` with `full_names`, else `feature`.
///
/// # Errors
/// [`Error::Unknown`] for an unknown view or feature; [`Error::Request`] for a missing
/// or mistyped join key, or key columns of different lengths; [`Error::Unavailable`] from the store.
pub async fn get_online_features(
    store: &dyn OnlineStore,
    project: &str,
    defs: &Definitions,
    refs: &[FeatureRef],
    entities: &EntityColumns,
    now: i64,
    full_names: bool,
) -> Result<Vec<Column>> {
    get_online_features_timed(store, project, defs, refs, entities, now, full_names, &mut LookupPhases::default()).await
}

/// Where one lookup's time went (the server's `/metrics` phase histogram).
#[derive(Debug, Clone, Copy, Default)]
pub struct LookupPhases {
    /// Resolving the features to views and building the store keys.
    pub keys: std::time::Duration,
    /// The store round trip.
    pub store: std::time::Duration,
    /// Decoding the stored rows and records into the answer's columns.
    pub decode: std::time::Duration,
}

/// [`get_online_features`], recording the time of its phases in `phases`.
///
/// # Errors
/// As [`get_online_features`].
#[allow(clippy::too_many_arguments)]
pub async fn get_online_features_timed(
    store: &dyn OnlineStore,
    project: &str,
    defs: &Definitions,
    refs: &[FeatureRef],
    entities: &EntityColumns,
    now: i64,
    full_names: bool,
    phases: &mut LookupPhases,
) -> Result<Vec<Column>> {
    let began = std::time::Instant::now();
    let bad = |m: String| Error::Request(m);
    let n = entities.first().map_or(0, |(_, v)| v.len());
    if let Some((name, v)) = entities.iter().find(|(_, v)| v.len() != n) {
        return Err(bad(format!("entity column `{name}` has {} values, the first has {n} (each join key needs one per row)", v.len())));
    }
    // One store key per (view, row), all read at once.
    let mut views: Vec<&str> = Vec::new();
    // Per requested feature: its view's position in `views`.
    let mut view_of: Vec<usize> = Vec::with_capacity(refs.len());
    for r in refs {
        let (view, _) = defs.find_feature(r).map_err(|e| Error::Unknown(e.0))?;
        let at = views.iter().position(|v| *v == view.name).unwrap_or_else(|| {
            views.push(&view.name);
            views.len() - 1
        });
        view_of.push(at);
    }
    let keys = store_keys(project, defs, &views, entities, n)?;
    let sent = std::time::Instant::now();
    phases.keys = sent - began;
    let stored = store.read(&keys).await?;
    let read = std::time::Instant::now();
    phases.store = read - sent;
    // Each view's columns, put in request order.
    let mut columns: Vec<Option<Column>> = refs.iter().map(|_| None).collect();
    for (i, name) in views.iter().enumerate() {
        let view = defs.feature_view(name).expect("checked");
        let stored = &stored[i * n..(i + 1) * n];
        let wanted: Vec<(usize, Wanted<'_>)> = refs
            .iter()
            .enumerate()
            .filter(|(j, _)| view_of[*j] == i)
            .map(|(j, r)| (j, Wanted { feature: &r.feature, name: if full_names { r.column_name() } else { r.feature.clone() } }))
            .collect();
        let built: Vec<Column> = if view.is_event_log() {
            let answers = answer_records(view, stored, now);
            wanted.iter().map(|(_, w)| aggregation_column(view, w.feature, w.name.clone(), &answers)).collect()
        } else {
            feature_columns(defs, view, stored, wanted.iter().map(|(_, w)| w), now)
        };
        for ((j, _), column) in wanted.iter().zip(built) {
            columns[*j] = Some(column);
        }
    }
    let mut out: Vec<Column> = entities.iter().map(|(name, values)| key_column(name, values)).collect();
    out.extend(columns.into_iter().map(|c| c.expect("every requested feature's view is read")));
    phases.decode = read.elapsed();
    Ok(out)
}

/// A requested feature of one view, and the name of its column in the answer.
struct Wanted<'a> {
    feature: &'a str,
    name: String,
}

/// Every aggregation's value at `now` and the time of the latest event in its window.
type Answer = Vec<(Value, Option<i64>)>;

/// The answers of an event log's records at `now` (SPEC §11): an entity without a
/// record has no events in any window; `None` for a record written under other
/// aggregations (until the view is materialized again).
fn answer_records(view: &FeatureView, stored: &[Option<Vec<u8>>], now: i64) -> Vec<Option<Answer>> {
    let layout = Layout::of(view);
    // An entity without a record: the answer of no events, the same for all.
    let none = AggRecord::empty(&layout).answer(&layout, now);
    let tails = layout.tails(now);
    stored
        .iter()
        .map(|b| match b {
            None => Some(none.clone()),
            Some(bytes) => AggRecord::answer_stored_at(&layout, &tails, bytes).ok(),
        })
        .collect()
}

/// Aggregation `feature` of an event log for each entity: PRESENT, or NULL_VALUE for a
/// null value; the event time is the latest event in the window (epoch 0 when none).
fn aggregation_column(view: &FeatureView, feature: &str, name: String, answers: &[Option<Answer>]) -> Column {
    let k = view.aggregations.iter().position(|a| a.name == feature).expect("checked");
    let n = answers.len();
    let mut column = Column { name, values: Vec::with_capacity(n), statuses: Vec::with_capacity(n), event_ts: Vec::with_capacity(n) };
    for answer in answers {
        let (value, status, ts) = match answer {
            None => (Value::Null, Status::NotFound, None),
            Some(a) => match &a[k] {
                (Value::Null, ts) => (Value::Null, Status::NullValue, Some(ts.unwrap_or(0))),
                (v, ts) => (v.clone(), Status::Present, Some(ts.unwrap_or(0))),
            },
        };
        column.values.push(value);
        column.statuses.push(status);
        column.event_ts.push(ts);
    }
    column
}

/// One store key per (view, row), views in `views` order, after checking that every
/// view's join keys are given with the right types.
fn store_keys(project: &str, defs: &Definitions, views: &[&str], entities: &EntityColumns, n: usize) -> Result<Vec<String>> {
    let bad = |m: String| Error::Request(m);
    let mut keys = Vec::with_capacity(views.len() * n);
    for name in views {
        let view = defs.feature_view(name).expect("checked");
        let mut columns = Vec::new();
        for key in defs.join_keys(view) {
            let Some((_, values)) = entities.iter().find(|(k, _)| *k == key.name) else {
                return Err(bad(format!("missing join key `{}` for feature view `{name}`", key.name)));
            };
            if let Some(v) =
                values.iter().find(|v| !matches!((v, key.dtype), (KeyValue::Int(_), KeyType::Int64) | (KeyValue::Str(_), KeyType::String)))
            {
                return Err(bad(format!("join key `{}` is {}, got `{v}`", key.name, key.dtype)));
            }
            columns.push(values);
        }
        let mut values: Vec<KeyValue> = Vec::with_capacity(columns.len());
        for row in 0..n {
            values.clear();
            values.extend(columns.iter().map(|c| c[row].clone()));
            keys.push(store_key(project, name, &values));
        }
    }
    Ok(keys)
}

/// A join-key column of the answer, the keys as given.
fn key_column(name: &str, values: &[KeyValue]) -> Column {
    let n = values.len();
    Column {
        name: name.to_string(),
        values: values
            .iter()
            .map(|v| match v {
                KeyValue::Int(i) => Value::Int64(*i),
                KeyValue::Str(s) => Value::String(s.clone()),
            })
            .collect(),
        statuses: vec![Status::Present; n],
        event_ts: vec![None; n],
    }
}

/// The requested features of a plain view for each stored row, judged at `now` against
/// the TTL: one pass over the rows, each decoded once into one reused buffer, only the
/// requested values built, each moved into its column (cloned only for a feature
/// requested twice). A row written under another layout of the view is read by name;
/// one that cannot be read is `NOT_FOUND`.
fn feature_columns<'a>(
    defs: &Definitions,
    view: &FeatureView,
    stored: &[Option<Vec<u8>>],
    wanted: impl Iterator<Item = &'a Wanted<'a>>,
    now: i64,
) -> Vec<Column> {
    let n = stored.len();
    let (mut columns, positions): (Vec<Column>, Vec<usize>) = wanted
        .map(|w| {
            let k = view.features.iter().position(|f| f.name == w.feature).expect("checked");
            let column = Column {
                name: w.name.clone(),
                values: Vec::with_capacity(n),
                statuses: Vec::with_capacity(n),
                event_ts: Vec::with_capacity(n),
            };
            (column, k)
        })
        .unzip();
    let mut keep = vec![false; view.features.len()];
    for &k in &positions {
        keep[k] = true;
    }
    // Whether a later column reads the same value (this one then takes a copy).
    let shared: Vec<bool> = positions.iter().enumerate().map(|(j, k)| positions[j + 1..].contains(k)).collect();
    let print = fingerprint(view);
    let ttl_us = view.ttl_us();
    let mut layouts = Layouts::default();
    let mut values: Vec<Value> = Vec::new();
    for bytes in stored {
        let event_ts = bytes.as_ref().and_then(|bytes| {
            let (event_ts, created_ts, written) = OnlineRow::decode_into(bytes, Some((print, &keep)), &mut values).ok()?;
            if written == print && values.len() == view.features.len() {
                return Some(event_ts);
            }
            // A row written before the view's features changed: read by name.
            let row = OnlineRow { event_ts, created_ts, fingerprint: written, values: std::mem::take(&mut values) };
            values = layouts.conform(defs, view, row)?.values;
            Some(event_ts)
        });
        for ((column, &k), &shared) in columns.iter_mut().zip(&positions).zip(&shared) {
            let (value, status, ts) = match event_ts {
                None => (Value::Null, Status::NotFound, None),
                Some(ts) if ttl_us.is_some_and(|ttl| now.saturating_sub(ts) > ttl) => (Value::Null, Status::OutsideMaxAge, Some(ts)),
                Some(ts) => match &mut values[k] {
                    Value::Null => (Value::Null, Status::NullValue, Some(ts)),
                    v if shared => (v.clone(), Status::Present, Some(ts)),
                    v => (std::mem::replace(v, Value::Null), Status::Present, Some(ts)),
                },
            };
            column.values.push(value);
            column.statuses.push(status);
            column.event_ts.push(ts);
        }
    }
    columns
}
