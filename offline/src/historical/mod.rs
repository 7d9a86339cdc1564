//! Historical retrieval: the point-in-time join of a spine with feature views (docs/offline.md).
//!
//! By stage, one module each: [`spine`] reads the spine and its points in time;
//! `scan` reads each requested view's Delta table with DataFusion, projected to the
//! columns needed and pruned to `[min spine time - ttl, max spine time]`;
//! `kernel_input` numbers the entities ([`crate::keys`]) and lays out the kernel's
//! arrays on all cores; the as-of kernel (any [`AsOfKernel`]) returns one winning row
//! index per spine row; `gather` turns the winners into feature columns, once per
//! column; [`output`] writes the result. The output is the spine, unchanged and in
//! order, followed by one `view__feature` column per requested feature. [`latest`]
//! is the same scan's other use: each entity's latest row, for materialization.

mod aggregate;
pub mod distributed;
pub mod event_cache;
pub mod events;
mod gather;
mod joined;
mod kernel_input;
pub mod latest;
pub mod made;
pub mod output;
pub(crate) mod scan;
pub mod spine;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field};
use quiver_gpu_join::{AsOfKernel, NO_ROW};
use quiver_runtime::on_demand::{Computation, Input};
use quiver_sdk::{Config, Definitions, FeatureRef, FeatureView, Found, OnDemandView};

use crate::error::{Error, Result};
use crate::ingest::OnProgress;
use crate::input::widen;
use crate::keys::EntityIndex;
use crate::schema::{arrow_type, key_type};
use kernel_input::KernelColumns;
use scan::{Scan, ScanRange, scan_view_at};

pub use event_cache::EventCache;
pub use events::{EntityEvents, events_since};
pub use joined::HeldJoin;
use joined::{Held, Won};
pub use latest::{EventRange, Latest, latest_per_entity};
pub use made::{MadeSpine, RowsOf};
pub use output::write_parquet;
pub use scan::ScanCache;
pub use scan::{TableSummary, read_view, table_summary, table_versions, window_streams};
pub use spine::{SPINE_TIMESTAMP, read_spine};

/// The requested features of one view, and those on-demand features read of it.
#[derive(Debug, Clone)]
pub struct ViewRequest<'a> {
    pub view: &'a FeatureView,
    pub features: Vec<&'a str>,
    /// For each feature, its position among the joined columns: the requested ones
    /// first, in request order (output columns keep that order), then those only
    /// on-demand features read.
    pub positions: Vec<usize>,
    /// Whether on-demand features read the winning rows' event times.
    pub event_time: bool,
}

/// Features resolved against the registry: the views to join, grouped in order of
/// first mention, and the on-demand features computed from their columns after the
/// join (docs/transformations.md#offline).
#[derive(Debug, Clone)]
pub struct Resolved<'a> {
    pub views: Vec<ViewRequest<'a>>,
    /// How many features were asked for: the output's feature columns.
    asked: usize,
    /// How many columns the views' joins give (asked and read only by on-demand ones).
    joined: usize,
    on_demand: Option<OnDemandJoin>,
}

impl<'a> std::ops::Deref for Resolved<'a> {
    type Target = [ViewRequest<'a>];
    fn deref(&self) -> &[ViewRequest<'a>] {
        &self.views
    }
}

/// The on-demand features of a join: their computation, where each of its inputs is
/// found, and where each feature goes in the output.
#[derive(Debug, Clone)]
struct OnDemandJoin {
    computation: Computation,
    sources: Vec<Supplied>,
    positions: Vec<usize>,
}

/// Where an on-demand computation's input comes from in a join.
#[derive(Debug, Clone)]
enum Supplied {
    /// A joined column (position among the joined columns).
    Joined(usize),
    /// The event times of the view joined by request `.0`.
    EventTime(usize),
    /// Nothing offline: an event log's event time (docs/transformations.md#event-times).
    Null,
    /// A spine column (a join key, a request field) of this type.
    Spine(String, DataType),
    /// The spine's times.
    RequestTime,
}

impl Resolved<'_> {
    /// The spine columns the join reads and their types: every view's join keys, then
    /// the request fields of the on-demand features (a CSV spine is read with them).
    pub fn spine_types(&self, defs: &Definitions) -> Vec<(String, DataType)> {
        let mut out: Vec<(String, DataType)> = Vec::new();
        let keys = self.views.iter().flat_map(|r| defs.join_keys(r.view)).map(|k| (k.name.clone(), key_type(k.dtype)));
        let fields = self.on_demand.iter().flat_map(|o| &o.sources).filter_map(|s| match s {
            Supplied::Spine(name, dtype) => Some((name.clone(), dtype.clone())),
            _ => None,
        });
        for (name, dtype) in keys.chain(fields) {
            if !out.iter().any(|(n, _)| *n == name) {
                out.push((name, dtype));
            }
        }
        out
    }
}

impl Resolved<'_> {
    /// Refuses a spine without a column the join reads — a view's join key or an
    /// on-demand feature's request field — naming it, before any table is read.
    ///
    /// # Errors
    /// [`Error::Input`] naming the spine and the column.
    pub fn check_spine(&self, defs: &Definitions, spine: SpineRows<'_>) -> Result<()> {
        for request in &self.views {
            if let Some(key) = defs.join_keys(request.view).into_iter().find(|k| spine.rows.column_by_name(&k.name).is_none()) {
                return Err(Error::input(spine.source, missing_key(&key.name, request.view)));
            }
        }
        if let Some(on_demand) = &self.on_demand {
            for (source, input) in on_demand.sources.iter().zip(on_demand.computation.inputs()) {
                if let Supplied::Spine(name, _) = source
                    && spine.rows.column_by_name(name).is_none()
                {
                    return Err(Error::input(spine.source, missing_spine_column(defs, input, name)));
                }
            }
        }
        Ok(())
    }
}

/// Checks feature references against the registry and groups them by view; an
/// on-demand feature's inputs are joined too, without being returned unless asked for.
///
/// # Errors
/// [`Error::NotFound`] naming an unknown view or feature, [`Error::Request`] for a
/// duplicate.
pub fn resolve<'a>(defs: &'a Definitions, refs: &[FeatureRef]) -> Result<Resolved<'a>> {
    if refs.is_empty() {
        return Err(Error::Request("no features requested".to_string()));
    }
    let mut out = Resolved { views: Vec::new(), asked: refs.len(), joined: refs.len(), on_demand: None };
    let mut wanted: Vec<(&'a OnDemandView, &'a str)> = Vec::new();
    let mut wanted_at: Vec<usize> = Vec::new();
    for (position, r) in refs.iter().enumerate() {
        if refs[..position].contains(r) {
            return Err(Error::Request(format!("feature `{r}` requested twice")));
        }
        match defs.find(r).map_err(|e| Error::NotFound(e.0))? {
            Found::Stored(view, feature) => {
                // The name as the view holds it, already joined: asked for twice.
                if out.join(view, &feature.name, Some(position)) != position {
                    return Err(Error::Request(format!("feature `{r}` requested twice")));
                }
            }
            Found::OnDemand(view, feature) => {
                wanted.push((view, &feature.name));
                wanted_at.push(position);
            }
        }
    }
    if wanted.is_empty() {
        return Ok(out);
    }
    let computation = Computation::new(defs, &wanted).map_err(|e| Error::Request(e.to_string()))?;
    let mut sources = Vec::with_capacity(computation.inputs().len());
    for input in computation.inputs() {
        sources.push(match input {
            Input::Feature { view, feature, .. } => {
                let view = defs.feature_view(view).expect("validated");
                Supplied::Joined(out.join(view, feature, None))
            }
            Input::EventTime { view } => {
                let view = defs.feature_view(view).expect("validated");
                if view.is_event_log() {
                    Supplied::Null
                } else {
                    out.view(view);
                    let i = out.views.iter().position(|r| r.view.name == view.name).expect("just added");
                    out.views[i].event_time = true;
                    Supplied::EventTime(i)
                }
            }
            Input::Key(key) => Supplied::Spine(key.name.clone(), key_type(key.dtype)),
            Input::Request(field) => Supplied::Spine(field.name.clone(), arrow_type(field.dtype)),
            Input::RequestTime => Supplied::RequestTime,
        });
    }
    out.on_demand = Some(OnDemandJoin { computation, sources, positions: wanted_at });
    Ok(out)
}

impl<'a> Resolved<'a> {
    /// `view`'s request, added when new.
    fn view(&mut self, view: &'a FeatureView) -> &mut ViewRequest<'a> {
        let i = match self.views.iter().position(|v| v.view.name == view.name) {
            Some(i) => i,
            None => {
                self.views.push(ViewRequest { view, features: Vec::new(), positions: Vec::new(), event_time: false });
                self.views.len() - 1
            }
        };
        &mut self.views[i]
    }

    /// Joins `feature` of `view` at `position` (`None`: only on-demand features read
    /// it, after the asked ones), once; its position among the joined columns.
    fn join(&mut self, view: &'a FeatureView, feature: &str, position: Option<usize>) -> usize {
        // The name as the view holds it (an aggregation's, for an event log).
        let name: &'a str = match view.aggregation(feature) {
            Some(a) => &a.name,
            None => &view.feature(feature).expect("a served feature").name,
        };
        let next = self.joined;
        let entry = self.view(view);
        if let Some(k) = entry.features.iter().position(|f| *f == name) {
            return entry.positions[k];
        }
        let at = position.unwrap_or(next);
        entry.features.push(name);
        entry.positions.push(at);
        if position.is_none() {
            self.joined += 1;
        }
        at
    }
}

/// Options of a historical retrieval.
#[derive(Debug, Clone, Default)]
pub struct HistoricalOptions {
    /// Only rows created by the spine time are candidates; a view without a created
    /// time counts each row as created at its event time (so nothing more is cut).
    /// [`HistoricalOptions::cuts_by_created`] is the rule per view.
    pub created_cutoff: bool,
    /// After the features, one `view__event_timestamp` column per view: the event time
    /// of the row each spine row joined (null when none). `verify` uses it to tell a
    /// stale row from no row.
    pub event_times: bool,
    /// The Delta version to read each named view's table at (time travel; the latest
    /// version for views it does not name), so a training set can be rebuilt exactly
    /// after more data arrived.
    pub versions: BTreeMap<String, u64>,
    /// Run the join on a DataFusion Ballista cluster (`df://HOST:PORT`, docs/settings.md)
    /// instead of in this process; the answer is the same.
    pub cluster: Option<String>,
    /// Rows count from when they arrived, not from their created time: `verify --since
    /// --as-arrived` (docs/consistency.md). In this process only.
    pub arrival: Option<Arrival>,
}

/// Every row's created time taken as the commit time of its table version (its
/// `_quiver_seq`'s high half) plus `shift_us`, and every view cut by it: the join then
/// answers with the rows that had arrived by `spine time - shift_us`. Ties of event
/// time go to the row that arrived later.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// Per table (a view's storage name), each version's commit time (UTC
    /// microseconds); a version not listed (its log entry cleaned up) arrived before any.
    pub commits: Arc<HashMap<String, HashMap<u64, i64>>>,
    pub shift_us: i64,
    /// Shared by the joins of one spine at its moments, so each table is scanned once.
    pub scans: ScanCache,
}

impl HistoricalOptions {
    /// Whether `view`'s rows are cut by their created time: under `created_cutoff`, for
    /// views with a `created_timestamp_field`. A view without one counts each row as
    /// created at its event time, which the join's own `event time <= spine time`
    /// already requires.
    pub fn cuts_by_created(&self, view: &FeatureView) -> bool {
        self.arrival.is_some() || (self.created_cutoff && view.source.created_timestamp_field.is_some())
    }

    /// Whether the kernel reads created times for `view`: its own, or its arrivals.
    pub(crate) fn has_created(&self, view: &FeatureView) -> bool {
        self.arrival.is_some() || view.source.created_timestamp_field.is_some()
    }

    /// `view`'s commit times and the shift, under [`HistoricalOptions::arrival`].
    pub(crate) fn arrivals(&self, view: &FeatureView) -> Option<(Option<&HashMap<u64, i64>>, i64)> {
        self.arrival.as_ref().map(|a| (a.commits.get(&*view.storage_name()), a.shift_us))
    }
}

/// What one view's join reads of its table.
struct ScanNeed<'a> {
    columns: Vec<&'a str>,
    range: ScanRange,
}

/// A spine: its rows, and where they came from (named in errors).
#[derive(Debug, Clone, Copy)]
pub struct SpineRows<'a> {
    /// What errors call the spine (its file, or `entity_df`).
    pub source: &'a str,
    pub rows: &'a RecordBatch,
}

/// The point-in-time join of `spine` with the requested views, as one batch: the
/// spine's columns, then one `view__feature` column per requested feature, in request
/// order.
///
/// # Errors
/// [`Error::Input`] for a spine without `event_timestamp` or a needed join key, or with
/// naive or null times; store and kernel errors; a version the table does not have.
pub async fn historical(
    config: &Config,
    defs: &Definitions,
    spine: SpineRows<'_>,
    requests: &Resolved<'_>,
    options: HistoricalOptions,
    kernel: &dyn AsOfKernel,
    progress: OnProgress<'_>,
) -> Result<RecordBatch> {
    let rows = spine.rows.num_rows();
    join(config, defs, spine, requests, options, kernel, progress).await?.rows(0..rows)
}

/// The point-in-time join of `spine`, done once, its output assembled by ranges of spine
/// rows ([`HeldJoin::rows`]): `export` writes each shard from it as the shard is due, with
/// no second join (docs/export.md).
///
/// # Errors
/// As [`historical`].
pub async fn join<'a>(
    config: &Config,
    defs: &'a Definitions,
    spine: SpineRows<'a>,
    requests: &'a Resolved<'a>,
    options: HistoricalOptions,
    kernel: &'a dyn AsOfKernel,
    progress: OnProgress<'a>,
) -> Result<HeldJoin<'a>> {
    let times = spine::spine_times(spine.source, spine.rows)?;
    requests.check_spine(defs, spine)?;
    let mut views = Vec::with_capacity(requests.views.len());
    let join = Join { defs, spine, times: &times, options: &options, kernel, progress };
    for request in &requests.views {
        views.push(match &options.cluster {
            None => join.view(config, request).await?,
            Some(cluster) => Held::Gathered(distributed::join_view(&join, config, cluster, request).await?),
        });
    }
    Ok(HeldJoin { defs, spine, times, requests, options, kernel, progress, views })
}

/// The columns the join of `request` adds, as [`historical`] names and types them: one
/// per feature (an aggregation's output type for an event log), then the event time of
/// the joined row when asked (not for event logs, whose answers span many rows).
fn joined_fields(request: &ViewRequest<'_>, event_times: bool) -> Vec<Field> {
    let view = request.view;
    let mut fields: Vec<Field> = request
        .features
        .iter()
        .map(|name| {
            let dtype = match view.aggregation(name) {
                Some(a) => a.output_dtype(view.feature(&a.column).expect("validated").dtype).expect("validated"),
                None => view.feature(name).expect("resolved").dtype,
            };
            Field::new(format!("{}__{}", view.name, name), arrow_type(dtype), true)
        })
        .collect();
    if event_times && !view.is_event_log() {
        fields.push(Field::new(format!("{}__event_timestamp", view.name), crate::schema::timestamp_type(), true));
    }
    fields
}

/// `array` without validity buffers that mark nothing null, at any depth. The same
/// values then have the same layout whichever way they were computed (gathered from one
/// scan, or assembled from a cluster's partitions), so writers produce the same bytes:
/// Parquet's writer, for one, pages a column with an all-valid buffer differently.
fn canonical(array: ArrayRef) -> ArrayRef {
    // Through `ArrayData`, whose builder drops them at every level (no copy).
    arrow::array::make_array(array.to_data())
}

/// What one join holds for every view it joins.
struct Join<'a> {
    defs: &'a Definitions,
    spine: SpineRows<'a>,
    times: &'a [i64],
    options: &'a HistoricalOptions,
    kernel: &'a dyn AsOfKernel,
    progress: OnProgress<'a>,
}

/// One view's joined columns: each requested feature, and its event times if asked.
struct ViewJoined {
    features: Vec<(Field, ArrayRef)>,
    event_time: Option<(Field, ArrayRef)>,
}

impl ViewJoined {
    /// Spine rows `range` of the columns (no copy).
    fn slice(&self, range: std::ops::Range<usize>) -> ViewJoined {
        let cut = |(f, a): &(Field, ArrayRef)| (f.clone(), a.slice(range.start, range.len()));
        ViewJoined { features: self.features.iter().map(cut).collect(), event_time: self.event_time.as_ref().map(cut) }
    }

    /// `request`'s columns, named and typed by [`joined_fields`].
    fn new(request: &ViewRequest<'_>, features: Vec<ArrayRef>, event_time: Option<ArrayRef>) -> ViewJoined {
        let mut fields = joined_fields(request, event_time.is_some()).into_iter();
        let features = fields.by_ref().zip(features).collect();
        ViewJoined { features, event_time: event_time.map(|c| (fields.next().expect("an event time field"), c)) }
    }
}

impl Join<'_> {
    /// Whether the join of `request` gives the winning rows' event times: asked for,
    /// or read by on-demand features; never for an event log.
    fn event_time(&self, request: &ViewRequest<'_>) -> bool {
        (self.options.event_times || request.event_time) && !request.view.is_event_log()
    }

    /// The on-demand features of the join, from the joined columns (`view_times`: per
    /// request, its event times when joined) and the spine.
    fn on_demand(
        &self,
        on_demand: &OnDemandJoin,
        joined: &[Option<(Field, ArrayRef)>],
        view_times: &[Option<(Field, ArrayRef)>],
    ) -> Result<Vec<(Field, ArrayRef)>> {
        let rows = self.spine.rows.num_rows();
        let computation = &on_demand.computation;
        let mut supplied: Vec<ArrayRef> = Vec::with_capacity(on_demand.sources.len());
        for (source, input) in on_demand.sources.iter().zip(computation.inputs()) {
            supplied.push(match source {
                Supplied::Joined(p) => joined[*p].as_ref().expect("joined").1.clone(),
                Supplied::EventTime(i) => view_times[*i].as_ref().expect("joined with its event times").1.clone(),
                Supplied::Null => arrow::array::new_null_array(&input.arrow_type(), rows),
                Supplied::Spine(name, dtype) => {
                    let Some(column) = self.spine.rows.column_by_name(name) else {
                        return Err(Error::input(self.spine.source, missing_spine_column(self.defs, input, name)));
                    };
                    widen(column, dtype).map_err(|m| Error::input(self.spine.source, format!("column `{name}`: {m}")))?
                }
                Supplied::RequestTime => Arc::new(arrow::array::TimestampMicrosecondArray::from(self.times.to_vec()).with_timezone("UTC")),
            });
        }
        let phase = std::time::Instant::now();
        let computed = computation.evaluate(rows, &supplied, false).map_err(|e| Error::Request(format!("on-demand features: {}", e.0)))?;
        tracing::debug!(rows, failed = computed.failed, secs = phase.elapsed().as_secs_f64(), "on-demand features");
        (self.progress)("computed on-demand features", rows as u64);
        Ok(computed
            .columns
            .into_iter()
            .zip(computation.outputs())
            .map(|(column, (view, feature, dtype))| (Field::new(format!("{view}__{feature}"), arrow_type(dtype), true), column))
            .collect())
    }

    /// The spine's keys for `view`, in the key types.
    fn spine_keys(&self, view: &FeatureView) -> Result<Vec<ArrayRef>> {
        let mut keys = Vec::new();
        for key in self.defs.join_keys(view) {
            let Some(column) = self.spine.rows.column_by_name(&key.name) else {
                return Err(Error::input(self.spine.source, missing_key(&key.name, view)));
            };
            let conformed = widen(column, &key_type(key.dtype))
                .map_err(|m| Error::input(self.spine.source, format!("join key column `{}`: {m}", key.name)))?;
            keys.push(conformed);
        }
        Ok(keys)
    }

    /// What `request` reads of its view's table: the columns (the requested features,
    /// or an event log's aggregated columns) and the rows (event times from the
    /// earliest spine time less the TTL or the longest window, to the latest).
    fn need<'r>(&self, request: &ViewRequest<'r>) -> Result<ScanNeed<'r>> {
        let view = request.view;
        let (min_t, max_t) = (self.times.iter().min().copied().unwrap_or(0), self.times.iter().max().copied().unwrap_or(0));
        let version = self.options.versions.get(&*view.storage_name()).copied();
        if view.is_event_log() {
            return Ok(aggregate::need(request, min_t, max_t, version));
        }
        let range = ScanRange { lo: view.ttl_us().map(|ttl| min_t.saturating_sub(ttl)), hi: max_t, extra: None, version };
        Ok(ScanNeed { columns: request.features.clone(), range })
    }

    /// Scans and runs the kernel on one requested view; holds the answer
    /// gathered, or its scan and winners when the scan holds fewer rows than the spine.
    async fn view(&self, config: &Config, request: &ViewRequest<'_>) -> Result<Held> {
        let view = request.view;
        let need = self.need(request)?;
        let index = EntityIndex::build(&self.spine_keys(view)?)?;
        let phase = std::time::Instant::now();
        let location = config.view_table(view);
        let scan = match &self.options.arrival {
            Some(arrival) => arrival.scans.scan(&location, self.defs, view, &need.columns, need.range).await?,
            None => scan_view_at(&location, self.defs, view, &need.columns, need.range).await?,
        };
        (self.progress)(&format!("scanned {}", view.name), scan.rows as u64);
        tracing::debug!(view = %view.name, rows = scan.rows, secs = phase.elapsed().as_secs_f64(), "scanned");
        if view.is_event_log() {
            return Ok(Held::Gathered(self.aggregate(request, index, scan)?));
        }
        let won = self.won(request, index, scan)?;
        if won.scan.rows < won.winners.len() {
            return Ok(Held::Won(won));
        }
        Ok(Held::Gathered(won.gather(self.kernel, request, 0..won.winners.len())?))
    }

    /// Joins one requested view's scanned rows (`need`'s columns and rows, in any
    /// order) with the spine: what the local join does after its scan, and what each
    /// partition of a cluster join does with its share of the rows.
    fn scanned(&self, request: &ViewRequest<'_>, index: EntityIndex, scan: Scan) -> Result<ViewJoined> {
        if request.view.is_event_log() {
            return self.aggregate(request, index, scan);
        }
        let won = self.won(request, index, scan)?;
        won.gather(self.kernel, request, 0..won.winners.len())
    }

    /// Runs the kernel on a plain view's scanned rows: each spine row's winning row.
    fn won(&self, request: &ViewRequest<'_>, index: EntityIndex, scan: Scan) -> Result<Won> {
        let view = request.view;
        let ttl_us = view.ttl_us();
        let has_created = self.options.has_created(view);
        let columns = KernelColumns::fill(&scan, &index, self.defs, view, has_created, self.options.arrivals(view))?;
        // Keep only the feature columns of the scan while the kernel runs.
        let scan = scan.features_only()?;
        let input = columns.input(&index, self.times, ttl_us, self.options.cuts_by_created(view));
        let phase = std::time::Instant::now();
        let winners = self.kernel.join(&input)?;
        tracing::debug!(view = %view.name, engine = self.kernel.name(), secs = phase.elapsed().as_secs_f64(), "kernel");
        let event_time = self.event_time(request).then(|| {
            let ts: arrow::array::TimestampMicrosecondArray =
                winners.iter().map(|&w| (w != NO_ROW).then(|| columns.ts[w as usize])).collect();
            Arc::new(ts.with_timezone("UTC")) as ArrayRef
        });
        drop(columns);
        (self.progress)(&format!("joined {}", view.name), winners.len() as u64);
        let types: Vec<_> = request.features.iter().map(|f| arrow_type(view.feature(f).expect("resolved").dtype)).collect();
        Ok(Won { scan, types, winners, event_time })
    }
}

/// Why a spine lacks join key `key` of `view`.
fn missing_key(key: &str, view: &FeatureView) -> String {
    format!("missing join key column `{key}` needed by feature view `{}`", view.name)
}

/// Why a spine lacks a column an on-demand feature reads: a request field (naming the
/// on-demand view declaring it) or a join key.
fn missing_spine_column(defs: &Definitions, input: &Input, name: &str) -> String {
    match input {
        Input::Request(_) => {
            let view = defs.on_demand_views.iter().find(|v| v.request.iter().any(|f| f.name == name)).map_or("", |v| v.name.as_str());
            format!("missing column `{name}`: a request field of on-demand view `{view}`, which the spine must carry")
        }
        _ => format!("missing join key column `{name}` needed by on-demand features"),
    }
}
