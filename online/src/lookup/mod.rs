//! Online lookups: features for entity rows, with the statuses of docs/online.md, in Feast's
//! column-major shape (the join keys first, then one column per feature).

use quiver_runtime::encoding::{KeyValue, Value, store_key};
use quiver_sdk::definitions::fingerprint;
use quiver_sdk::registry::Registered;
use quiver_sdk::{Definitions, FeatureRef, FeatureView, Found, KeyType};

use crate::error::{Error, Result};
use crate::store::OnlineStore;

mod json;
mod on_demand;
mod records;
mod rows;
mod status;
pub mod wire;

pub use json::AnswerAt;
use on_demand::OnDemandPlan;
pub use on_demand::{Evaluator, RequestFields, request_values};
use records::{aggregation_column, answer_records};
use rows::{RowReader, feature_columns};
pub use status::{Row, Status};

/// One output column: a join key or a feature, one entry per entity row.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub values: Vec<Value>,
    pub statuses: Vec<Status>,
    /// Event time of each value (UTC microseconds); `None` for keys and missing rows.
    pub event_ts: Vec<Option<i64>>,
}

impl Column {
    /// An empty column named `name` with room for `n` rows.
    fn empty(name: &str, n: usize) -> Column {
        Column { name: name.to_string(), values: Vec::with_capacity(n), statuses: Vec::with_capacity(n), event_ts: Vec::with_capacity(n) }
    }
}

/// The entity rows of a request, column-major: each join key and its values.
pub type EntityColumns = Vec<(String, Vec<KeyValue>)>;

/// Reads `refs` for every entity row (`asked`: the join keys, and the request fields of
/// the on-demand features) at time `now` (UTC microseconds), in one store round trip.
/// Columns: the join keys as given, then the features in request order,
/// named `view__feature` with `full_names`, else `feature`.
///
/// # Errors
/// [`Error::NotFound`] for an unknown view or feature; [`Error::Request`] for a missing
/// or mistyped join key, a name the features asked for do not take ([`LookupPlan::given`]),
/// or key columns of different lengths; [`Error::Unavailable`] from the store.
pub async fn get_online_features(
    store: &dyn OnlineStore,
    project: &str,
    defs: &Registered,
    refs: &[FeatureRef],
    asked: Entities<'_>,
    now: i64,
    full_names: bool,
) -> Result<Vec<Column>> {
    check_lengths(asked.0)?;
    let plan = LookupPlan::new(defs, refs.to_vec(), full_names)?;
    plan.check_given(asked)?;
    plan.lookup(store, project, defs, asked, now, &mut LookupPhases::default()).await
}

/// What one lookup is asked for each entity row: its join keys, and the request fields
/// of the on-demand features asked for.
pub type Entities<'a> = (&'a EntityColumns, &'a RequestFields);

/// Where one lookup's time went (the server's `/metrics` phase histogram).
#[derive(Debug, Clone, Copy, Default)]
pub struct LookupPhases {
    /// Resolving the features to views and building the store keys.
    pub keys: std::time::Duration,
    /// The store round trip.
    pub store: std::time::Duration,
    /// Decoding the stored rows and records into the answer's columns (the direct
    /// answer, [`LookupPlan::answer_json`]: into each feature's JSON text).
    pub decode: std::time::Duration,
    /// Writing the JSON answer.
    pub encode: std::time::Duration,
    /// On-demand values that could not be computed (null): division by zero, overflow,
    /// an invalid cast (docs/transformations.md).
    pub uncomputed: u64,
}

/// The most entity rows one lookup may ask for.
pub const MAX_ENTITY_ROWS: usize = 10_000;

/// Refuses a lookup of `rows` entity rows x `features` features before any work: more
/// than [`MAX_ENTITY_ROWS`] rows, or more values than `max_cells` (`server.max_cells`).
/// Every front end checks a lookup with it.
///
/// # Errors
/// [`Error::TooLarge`], naming the bound.
pub fn check_size(rows: usize, features: usize, max_cells: usize) -> Result<()> {
    if rows > MAX_ENTITY_ROWS {
        return Err(Error::TooLarge {
            bound: "max_entity_rows",
            message: format!("{rows} entity rows; at most {MAX_ENTITY_ROWS} per request"),
        });
    }
    let cells = rows.saturating_mul(features);
    if cells > max_cells {
        return Err(Error::TooLarge {
            bound: "max_cells",
            message: format!(
                "{rows} entity rows x {features} features = {cells} values; at most {max_cells} per request (server.max_cells)"
            ),
        });
    }
    Ok(())
}

/// Every entity column has as many values as the first.
fn check_lengths(entities: &EntityColumns) -> Result<usize> {
    let n = entities.first().map_or(0, |(_, v)| v.len());
    if let Some((name, v)) = entities.iter().find(|(_, v)| v.len() != n) {
        return Err(Error::Request(format!(
            "entity column `{name}` has {}, the first has {n} (each join key needs one per row)",
            quiver_sdk::error::count(v.len(), "value")
        )));
    }
    Ok(n)
}

/// A lookup of a list of features resolved against one set of definitions: the views
/// to read, their join keys, and where each requested feature sits in its view's row
/// and in the answer. Everything a lookup knows before it sees entity rows, so a
/// server can build it once per distinct feature list and answer every request for
/// that list from it. Valid only with the definitions it was built from.
#[derive(Debug)]
pub struct LookupPlan {
    /// The features asked for, in answer order.
    pub refs: Vec<FeatureRef>,
    /// Each feature's column name in the answer.
    names: Vec<String>,
    /// The names as the answer's JSON writes them, each after a comma.
    names_json: Vec<u8>,
    /// `,"feature_view_metadata":[{"name":...,"version":N},...]`: each view the
    /// features asked for are of, in request order, with the version read (Feast's
    /// `include_feature_view_version_metadata`; docs/versions.md).
    versions_json: Vec<u8>,
    /// The views read, in order of first request; one store key per (view, row).
    views: Vec<ViewPlan>,
    /// The join keys a request may give ([`LookupPlan::given`]): those of the views read and
    /// of the inputs of the on-demand views asked for, each once.
    keys: Vec<String>,
    /// The on-demand features asked for, computed from what the views read (answer
    /// positions past `refs` are read for them only, never answered).
    on_demand: Option<OnDemandPlan>,
}

#[derive(Debug)]
struct ViewPlan {
    /// Its position in `Definitions::feature_views` of the definitions the plan read.
    index: usize,
    /// The view, at the version the plan reads (docs/versions.md#references).
    view: FeatureView,
    /// Its keys' view part (`view`, `view@N`), made once per plan, not per request.
    storage: String,
    join_keys: Vec<quiver_sdk::JoinKey>,
    /// Per requested feature of this view: its position in the answer's features and
    /// among the view's features (an event log: its aggregations).
    wanted: Vec<(usize, usize)>,
    /// Per entry of `wanted`: whether a later one reads the same value.
    shared: Vec<bool>,
    /// Which of the view's features the answer reads (plain views).
    keep: Vec<bool>,
    fingerprint: u64,
    /// Whether on-demand features read its rows' event times.
    times: bool,
}

impl LookupPlan {
    /// Resolves `refs` (`full_names`: columns named `view__feature`): the one check of
    /// a lookup's features, whichever front end asks (the server, `quiver online`,
    /// Python).
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown view or feature; [`Error::Request`] for a
    /// feature asked for twice, or one of a view that is not online (`online: false`).
    pub fn new(defs: &Definitions, refs: Vec<FeatureRef>, full_names: bool) -> Result<LookupPlan> {
        let pinned = defs.pinned(&refs).map_err(|e| match e {
            quiver_sdk::definitions::VersionError::NotFound(e) => Error::NotFound(e.0),
            quiver_sdk::definitions::VersionError::Conflict(e) => Error::Request(e),
        })?;
        let defs: &Definitions = &pinned;
        let mut views: Vec<ViewPlan> = Vec::new();
        let mut names = Vec::with_capacity(refs.len());
        let mut wanted = Vec::new();
        // Each view the features are of, with the version read, in request order.
        let mut read_versions: Vec<(&str, u32)> = Vec::new();
        for (j, r) in refs.iter().enumerate() {
            let found = defs.find(r).map_err(|e| Error::NotFound(e.0))?;
            let version = match &found {
                Found::Stored(view, _) => view.version,
                Found::OnDemand(view, _) => view.version,
            };
            if !read_versions.iter().any(|(v, _)| *v == r.view) {
                read_versions.push((&r.view, version));
            }
            // `v:f` and `v@1:f` of a view at version 1 are one feature asked twice.
            if refs[..j].iter().any(|o| o.view == r.view && o.feature == r.feature) {
                return Err(Error::Request(format!("feature `{r}` is asked for twice")));
            }
            names.push(if full_names { r.column_name() } else { r.feature.clone() });
            match found {
                Found::Stored(view, _) => {
                    if !view.online {
                        return Err(Error::Request(format!(
                            "feature `{r}`: feature view `{}` is offline only (`online: false`)",
                            view.name
                        )));
                    }
                    read(&mut views, defs, view, j, &r.feature);
                }
                Found::OnDemand(view, feature) => wanted.push((view, feature.name.as_str(), j)),
            }
        }
        let on_demand = if wanted.is_empty() { None } else { Some(OnDemandPlan::new(defs, &wanted, &mut views, &mut names)?) };
        let mut keys: Vec<String> = Vec::new();
        let taken = views.iter().flat_map(|v| v.join_keys.clone());
        for key in taken.chain(wanted.iter().flat_map(|(view, _, _)| quiver_sdk::on_demand::keys(defs, view))) {
            if !keys.contains(&key.name) {
                keys.push(key.name);
            }
        }
        for v in &mut views {
            v.shared = v.wanted.iter().enumerate().map(|(i, (_, k))| v.wanted[i + 1..].iter().any(|(_, l)| l == k)).collect();
        }
        let mut versions_json = br#","feature_view_metadata":["#.to_vec();
        for (k, (view, version)) in read_versions.iter().enumerate() {
            if k > 0 {
                versions_json.push(b',');
            }
            versions_json.extend_from_slice(br#"{"name":"#);
            wire::json_str(&mut versions_json, view);
            versions_json.extend_from_slice(format!(r#","version":{version}}}"#).as_bytes());
        }
        versions_json.push(b']');
        let mut names_json = Vec::new();
        for name in &names[..refs.len()] {
            names_json.push(b',');
            wire::json_str(&mut names_json, name);
        }
        Ok(LookupPlan { refs, names, names_json, versions_json, views, keys, on_demand })
    }

    /// The answer's `feature_view_metadata` member, with its leading comma: each view
    /// read and its version (docs/versions.md).
    pub fn versions_json(&self) -> &[u8] {
        &self.versions_json
    }

    /// The request fields the on-demand features asked for read (directly or through
    /// the on-demand features they read), each once.
    pub fn request_fields(&self) -> &[quiver_sdk::Feature] {
        self.on_demand.as_ref().map_or(&[], |o| o.request_fields())
    }

    /// What `name`, given in a request's `entities` (`quiver online --entity` or
    /// `--request`, a key of Python's `entity_rows`), is to this plan: a request field
    /// the features asked for read (`Some`), or a join key of a view they read (`None`).
    /// The one rule of every front end (docs/online.md#request-fields).
    ///
    /// # Errors
    /// [`Error::Request`] for any other name, naming it and the names allowed.
    pub fn given(&self, name: &str) -> Result<Option<&quiver_sdk::Feature>> {
        if let Some(field) = self.request_fields().iter().find(|f| f.name == name) {
            return Ok(Some(field));
        }
        if self.keys.iter().any(|k| k == name) {
            return Ok(None);
        }
        let fields = self.request_fields().iter().map(|f| f.name.as_str());
        let allowed: Vec<String> = self.keys.iter().map(String::as_str).chain(fields).map(|n| format!("`{n}`")).collect();
        let allowed = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
        Err(Error::Request(format!("`{name}` is neither a join key nor a request field of the features asked for (allowed: {allowed})")))
    }

    /// Computes the plan's on-demand features with `evaluator` instead of the configured
    /// one ([`Evaluator::configured`]).
    pub fn set_evaluator(&mut self, evaluator: Evaluator) {
        if let Some(on_demand) = &mut self.on_demand {
            on_demand.evaluator = evaluator;
        }
    }

    /// [`LookupPlan::given`] for every name of `asked`: each join key one the plan takes,
    /// each request field one the features asked for read.
    ///
    /// # Errors
    /// [`Error::Request`] naming the first name that is not.
    pub fn check_given(&self, (entities, fields): Entities<'_>) -> Result<()> {
        for (name, _) in entities {
            if self.given(name)?.is_some() {
                return Err(Error::Request(format!("`{name}` is a request field, given as a join key")));
            }
        }
        for (name, _) in fields {
            if self.given(name)?.is_none() {
                return Err(Error::Request(format!("`{name}` is a join key, given as a request field")));
            }
        }
        Ok(())
    }

    /// Reads the plan's features for every entity row at time `now` (UTC microseconds)
    /// in one store round trip, recording the time of its phases in `phases`. `defs` are
    /// the definitions the plan was built from.
    ///
    /// # Errors
    /// [`Error::Request`] for a missing or mistyped join key, or key columns of
    /// different lengths; [`Error::Unavailable`] from the store.
    pub async fn lookup(
        &self,
        store: &dyn OnlineStore,
        project: &str,
        defs: &Registered,
        (entities, fields): Entities<'_>,
        now: i64,
        phases: &mut LookupPhases,
    ) -> Result<Vec<Column>> {
        if let Some(on_demand) = &self.on_demand {
            on_demand.check(entities, fields)?;
        }
        let (n, stored, read) = self.read_stored(store, project, entities, phases).await?;
        // Each view's columns, put in answer order (then those on-demand features read).
        let mut columns: Vec<Option<Column>> = self.names.iter().map(|_| None).collect();
        let mut times: Vec<Option<Vec<Option<i64>>>> = Vec::with_capacity(self.views.len());
        for (i, planned) in self.views.iter().enumerate() {
            let view = &planned.view;
            let stored = &stored[i * n..(i + 1) * n];
            let mut live = planned.times.then(|| Vec::with_capacity(n));
            let built: Vec<Column> = if view.is_event_log() {
                let answers = answer_records(&defs.layouts, view, stored, now);
                if let Some(live) = &mut live {
                    live.extend((0..n).map(|row| answers.latest(row, &planned.wanted)));
                }
                planned.wanted.iter().map(|&(j, k)| aggregation_column(k, &self.names[j], &answers)).collect()
            } else {
                feature_columns(&defs.layouts, view, planned, &self.names, stored, now, live.as_mut())
            };
            times.push(live);
            for (&(j, _), column) in planned.wanted.iter().zip(built) {
                columns[j] = Some(column);
            }
        }
        if let Some(on_demand) = &self.on_demand {
            phases.uncomputed += on_demand.compute(&mut columns, &self.names, &times, (entities, fields), now, n)?;
        }
        let mut out: Vec<Column> = Vec::with_capacity(entities.len() + self.refs.len());
        out.extend(entities.iter().map(|(name, values)| key_column(name, values)));
        out.extend(columns.into_iter().take(self.refs.len()).map(|c| c.expect("every requested feature's view is read")));
        phases.decode = read.elapsed();
        Ok(out)
    }

    /// The stored rows of every (view, entity row), views in plan order, `n` rows each,
    /// and when they came back; the keys and store phases recorded in `phases`.
    async fn read_stored(
        &self,
        store: &dyn OnlineStore,
        project: &str,
        entities: &EntityColumns,
        phases: &mut LookupPhases,
    ) -> Result<(usize, Vec<Option<Vec<u8>>>, std::time::Instant)> {
        let began = std::time::Instant::now();
        let n = check_lengths(entities)?;
        let keys = self.store_keys(project, entities, n)?;
        let sent = std::time::Instant::now();
        phases.keys = sent - began;
        let stored = store.read(&keys).await?;
        let read = std::time::Instant::now();
        phases.store = read - sent;
        Ok((n, stored, read))
    }

    /// One store key per (view, row), views in plan order, after checking that every
    /// view's join keys are given with the right types.
    fn store_keys(&self, project: &str, entities: &EntityColumns, n: usize) -> Result<Vec<String>> {
        let bad = |m: String| Error::Request(m);
        let mut keys = Vec::with_capacity(self.views.len() * n);
        let mut columns = Vec::new();
        let mut values: Vec<KeyValue> = Vec::new();
        for planned in &self.views {
            let name = &planned.storage;
            columns.clear();
            for key in &planned.join_keys {
                let Some((_, values)) = entities.iter().find(|(k, _)| *k == key.name) else {
                    return Err(bad(format!("missing join key `{}` for feature view `{name}`", key.name)));
                };
                if let Some(v) = values
                    .iter()
                    .find(|v| !matches!((v, key.dtype), (KeyValue::Int(_), KeyType::Int64) | (KeyValue::Str(_), KeyType::String)))
                {
                    return Err(bad(format!("join key `{}` is {}, got `{v}`", key.name, key.dtype)));
                }
                columns.push(values);
            }
            for row in 0..n {
                values.clear();
                values.extend(columns.iter().map(|c| c[row].clone()));
                keys.push(store_key(project, name, &values));
            }
        }
        Ok(keys)
    }
}

/// Adds feature `feature` of `view` at answer position `j` to the views read.
fn read(views: &mut Vec<ViewPlan>, defs: &Definitions, view: &FeatureView, j: usize, feature: &str) -> usize {
    let index = defs.feature_views.iter().position(|v| v.name == view.name).expect("found");
    let at = view_plan(views, defs, view, index);
    let k = if view.is_event_log() {
        view.aggregations.iter().position(|a| a.name == feature)
    } else {
        view.features.iter().position(|f| f.name == feature)
    }
    .expect("found");
    let planned = &mut views[at];
    planned.wanted.push((j, k));
    if !view.is_event_log() {
        planned.keep[k] = true;
    }
    at
}

/// The position of `view`'s plan among `views`, added when new.
fn view_plan(views: &mut Vec<ViewPlan>, defs: &Definitions, view: &FeatureView, index: usize) -> usize {
    if let Some(at) = views.iter().position(|v| v.index == index) {
        return at;
    }
    views.push(ViewPlan {
        index,
        view: view.clone(),
        storage: view.storage_name().into_owned(),
        join_keys: defs.join_keys(view),
        wanted: Vec::new(),
        shared: Vec::new(),
        keep: vec![false; view.features.len()],
        fingerprint: fingerprint(view),
        times: false,
    });
    views.len() - 1
}

/// A join-key column of the answer, the keys as given.
fn key_column(name: &str, values: &[KeyValue]) -> Column {
    let mut column = Column::empty(name, values.len());
    column.values.extend(values.iter().map(|v| match v {
        KeyValue::Int(i) => Value::Int64(*i),
        KeyValue::Str(s) => Value::String(s.clone()),
    }));
    column.statuses.resize(values.len(), Status::Present);
    column.event_ts.resize(values.len(), None);
    column
}
