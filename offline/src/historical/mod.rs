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
pub mod events;
mod gather;
mod kernel_input;
pub mod latest;
pub mod output;
mod scan;
pub mod spine;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema};
use quiver_gpu_join::{AsOfKernel, NO_ROW};
use quiver_sdk::{Config, Definitions, FeatureRef, FeatureView};

use crate::error::{Error, Result};
use crate::ingest::Progress;
use crate::input::widen;
use crate::keys::EntityIndex;
use crate::schema::{arrow_type, key_type};
use kernel_input::KernelColumns;
use scan::{Scan, ScanRange, scan_view_at};

pub use events::{EntityEvents, events_since};
pub use latest::{Latest, Window, latest_per_entity};
pub use output::write_parquet;
pub use scan::{TableSummary, read_view, table_summary, table_versions};
pub use spine::{SPINE_TIMESTAMP, read_spine};

/// The requested features, grouped by view in order of first mention.
#[derive(Debug, Clone)]
pub struct ViewRequest<'a> {
    pub view: &'a FeatureView,
    pub features: Vec<&'a str>,
    /// For each feature, its position in the request (output columns keep that order).
    pub positions: Vec<usize>,
}

/// Checks feature references against the registry and groups them by view.
///
/// # Errors
/// [`Error::NotFound`] naming an unknown view or feature, [`Error::Request`] for a
/// duplicate.
pub fn resolve<'a>(defs: &'a Definitions, refs: &[FeatureRef]) -> Result<Vec<ViewRequest<'a>>> {
    let mut out: Vec<ViewRequest<'a>> = Vec::new();
    if refs.is_empty() {
        return Err(Error::Request("no features requested".to_string()));
    }
    for (position, r) in refs.iter().enumerate() {
        let (view, feature) = defs.find_feature(r).map_err(|e| Error::NotFound(e.0))?;
        let entry = match out.iter_mut().position(|v| v.view.name == view.name) {
            Some(i) => &mut out[i],
            None => {
                out.push(ViewRequest { view, features: Vec::new(), positions: Vec::new() });
                out.last_mut().expect("just pushed")
            }
        };
        // The name as the view holds it (an aggregation's, for an event log).
        let name: &'a str = match view.aggregation(&feature.name) {
            Some(a) => &a.name,
            None => &view.feature(&feature.name).expect("a served feature").name,
        };
        if entry.features.contains(&name) {
            return Err(Error::Request(format!("feature `{r}` requested twice")));
        }
        entry.features.push(name);
        entry.positions.push(position);
    }
    Ok(out)
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
}

impl HistoricalOptions {
    /// Whether `view`'s rows are cut by their created time: under `created_cutoff`, for
    /// views with a `created_timestamp_field`. A view without one counts each row as
    /// created at its event time, which the join's own `event time <= spine time`
    /// already requires.
    pub fn cuts_by_created(&self, view: &FeatureView) -> bool {
        self.created_cutoff && view.source.created_timestamp_field.is_some()
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
    requests: &[ViewRequest<'_>],
    options: HistoricalOptions,
    kernel: &dyn AsOfKernel,
    progress: Progress<'_>,
) -> Result<RecordBatch> {
    let times = spine::spine_times(spine.source, spine.rows)?;
    let n_features: usize = requests.iter().map(|r| r.features.len()).sum();
    let mut joined: Vec<Option<(Field, ArrayRef)>> = vec![None; n_features];
    let mut event_times: Vec<(Field, ArrayRef)> = Vec::new();
    let join = Join { defs, spine, times: &times, options: &options, kernel, progress };
    for request in requests {
        let view = match &options.cluster {
            None => join.view(config, request).await?,
            Some(cluster) => distributed::join_view(&join, config, cluster, request).await?,
        };
        for (k, column) in view.features.into_iter().enumerate() {
            joined[request.positions[k]] = Some(column);
        }
        event_times.extend(view.event_time);
    }
    let mut fields: Vec<Field> = spine.rows.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns: Vec<ArrayRef> = spine.rows.columns().to_vec();
    for (field, column) in joined.into_iter().flatten().chain(event_times) {
        fields.push(field);
        columns.push(canonical(column));
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
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
    progress: Progress<'a>,
}

/// One view's joined columns: each requested feature, and its event times if asked.
struct ViewJoined {
    features: Vec<(Field, ArrayRef)>,
    event_time: Option<(Field, ArrayRef)>,
}

impl ViewJoined {
    /// `request`'s columns, named and typed by [`joined_fields`].
    fn new(request: &ViewRequest<'_>, features: Vec<ArrayRef>, event_time: Option<ArrayRef>) -> ViewJoined {
        let mut fields = joined_fields(request, event_time.is_some()).into_iter();
        let features = fields.by_ref().zip(features).collect();
        ViewJoined { features, event_time: event_time.map(|c| (fields.next().expect("an event time field"), c)) }
    }
}

impl Join<'_> {
    /// The spine's keys for `view`, in the key types.
    fn spine_keys(&self, view: &FeatureView) -> Result<Vec<ArrayRef>> {
        let mut keys = Vec::new();
        for key in self.defs.join_keys(view) {
            let Some(column) = self.spine.rows.column_by_name(&key.name) else {
                return Err(Error::input(
                    self.spine.source,
                    format!("missing join key column `{}` needed by feature view `{}`", key.name, view.name),
                ));
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
        let version = self.options.versions.get(&view.name).copied();
        if view.is_event_log() {
            return Ok(aggregate::need(request, min_t, max_t, version));
        }
        let range = ScanRange { lo: view.ttl_us().map(|ttl| min_t.saturating_sub(ttl)), hi: max_t, extra: None, version };
        Ok(ScanNeed { columns: request.features.clone(), range })
    }

    /// Scans, runs the kernel on and gathers one requested view.
    async fn view(&self, config: &Config, request: &ViewRequest<'_>) -> Result<ViewJoined> {
        let view = request.view;
        let need = self.need(request)?;
        let index = EntityIndex::build(&self.spine_keys(view)?)?;
        let phase = std::time::Instant::now();
        let scan = scan_view_at(&config.view_table(view), self.defs, view, &need.columns, need.range).await?;
        (self.progress)(&format!("scanned {}", view.name), scan.rows as u64);
        tracing::debug!(view = %view.name, rows = scan.rows, secs = phase.elapsed().as_secs_f64(), "scanned");
        self.scanned(request, index, scan)
    }

    /// Joins one requested view's scanned rows (`need`'s columns and rows, in any
    /// order) with the spine: what the local join does after its scan, and what each
    /// partition of a cluster join does with its share of the rows.
    fn scanned(&self, request: &ViewRequest<'_>, index: EntityIndex, scan: Scan) -> Result<ViewJoined> {
        let view = request.view;
        if view.is_event_log() {
            return self.aggregate(request, index, scan);
        }
        let ttl_us = view.ttl_us();
        let has_created = view.source.created_timestamp_field.is_some();
        let columns = KernelColumns::fill(&scan, &index, self.defs, view, has_created)?;
        // Keep only the feature columns of the scan while the kernel runs.
        let scan = scan.features_only()?;
        let input = columns.input(&index, self.times, ttl_us, self.options.cuts_by_created(view));
        let phase = std::time::Instant::now();
        let winners = self.kernel.join(&input)?;
        tracing::debug!(view = %view.name, engine = self.kernel.name(), secs = phase.elapsed().as_secs_f64(), "kernel");
        let event_time = self.options.event_times.then(|| {
            let ts: arrow::array::TimestampMicrosecondArray =
                winners.iter().map(|&w| (w != NO_ROW).then(|| columns.ts[w as usize])).collect();
            Arc::new(ts.with_timezone("UTC")) as ArrayRef
        });
        drop(columns);
        (self.progress)(&format!("joined {}", view.name), winners.len() as u64);
        let phase = std::time::Instant::now();
        let types: Vec<_> = request.features.iter().map(|f| arrow_type(view.feature(f).expect("resolved").dtype)).collect();
        let gathered = gather::gather_features(self.kernel, &scan.batches, &scan.feature_columns, &types, &winners)?;
        tracing::debug!(view = %view.name, secs = phase.elapsed().as_secs_f64(), "gathered");
        Ok(ViewJoined::new(request, gathered, event_time))
    }
}
