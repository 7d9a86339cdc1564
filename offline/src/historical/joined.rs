//! A point-in-time join done once, its output assembled by ranges of spine rows
//! (docs/export.md: one join whatever the number of shards).

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use quiver_gpu_join::AsOfKernel;
use quiver_sdk::Definitions;

use super::scan::Scan;
use super::{HistoricalOptions, Join, Resolved, SpineRows, ViewJoined, ViewRequest, canonical, gather};
use crate::error::{Error, Result};
use crate::ingest::OnProgress;

/// A point-in-time join whose views are joined ([`join`]): each view's answer for every
/// spine row is held, as gathered columns or as its scan and winning rows, whichever
/// holds fewer rows, so peak memory is the join's working set whatever the ranges asked.
pub struct HeldJoin<'a> {
    pub(super) defs: &'a Definitions,
    pub(super) spine: SpineRows<'a>,
    pub(super) times: Vec<i64>,
    pub(super) requests: &'a Resolved<'a>,
    pub(super) options: HistoricalOptions,
    pub(super) kernel: &'a dyn AsOfKernel,
    pub(super) progress: OnProgress<'a>,
    /// Per request of `requests.views`.
    pub(super) views: Vec<Held>,
}

impl std::fmt::Debug for HeldJoin<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldJoin").field("spine", &self.spine.source).field("rows", &self.times.len()).finish_non_exhaustive()
    }
}

impl HeldJoin<'_> {
    /// The views whose columns the join holds gathered; the others are held as their
    /// scans and winning rows, gathered by range.
    pub fn gathered_views(&self) -> Vec<&str> {
        self.requests
            .views
            .iter()
            .zip(&self.views)
            .filter(|(_, h)| matches!(h, Held::Gathered(_)))
            .map(|(r, _)| r.view.name.as_str())
            .collect()
    }

    /// Spine rows `range` of the join (in `0..spine rows`): those rows of the spine,
    /// unchanged, then one `view__feature` column per requested feature in request
    /// order, with the on-demand features computed for those rows. Any cut of the spine
    /// into ranges gives, together, [`historical`]'s batch.
    ///
    /// # Errors
    /// An on-demand computation's or a gather's error; a range past the spine's rows.
    pub fn rows(&self, range: std::ops::Range<usize>) -> Result<RecordBatch> {
        if range.start > range.end || range.end > self.times.len() {
            return Err(Error::Request(format!("rows {range:?} of a join of {} spine rows", self.times.len())));
        }
        let rows = self.spine.rows.slice(range.start, range.len());
        let spine = SpineRows { source: self.spine.source, rows: &rows };
        let join = Join {
            defs: self.defs,
            spine,
            times: &self.times[range.clone()],
            options: &self.options,
            kernel: self.kernel,
            progress: self.progress,
        };
        let requests = self.requests;
        let mut joined: Vec<Option<(Field, ArrayRef)>> = vec![None; requests.joined];
        let mut view_times: Vec<Option<(Field, ArrayRef)>> = Vec::with_capacity(requests.views.len());
        for (request, held) in requests.views.iter().zip(&self.views) {
            let view = held.rows(self.kernel, request, range.clone())?;
            for (k, column) in view.features.into_iter().enumerate() {
                joined[request.positions[k]] = Some(column);
            }
            view_times.push(view.event_time);
        }
        if let Some(on_demand) = &requests.on_demand {
            let computed = join.on_demand(on_demand, &joined, &view_times)?;
            for (&position, column) in on_demand.positions.iter().zip(computed) {
                joined[position] = Some(column);
            }
        }
        let mut fields: Vec<Field> = rows.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
        // The asked features, then (when asked) the event times of the views they read.
        let event_times = requests
            .views
            .iter()
            .zip(view_times)
            .filter(|(r, _)| self.options.event_times && r.positions.iter().any(|&p| p < requests.asked))
            .filter_map(|(_, t)| t);
        for (field, column) in joined.into_iter().take(requests.asked).flatten().chain(event_times) {
            fields.push(field);
            columns.push(canonical(column));
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
    }
}

/// One view's answer for every spine row, between the join and its output.
pub(super) enum Held {
    /// Its columns, gathered: an event log's aggregations, a cluster's answer, or a
    /// view whose scan holds more rows than the spine.
    Gathered(ViewJoined),
    /// Its scan and each spine row's winning row, gathered by range: a view whose scan
    /// holds fewer rows than the spine (the gathered columns would hold more).
    Won(Won),
}

impl Held {
    /// The view's columns for spine rows `range`.
    fn rows(&self, kernel: &dyn AsOfKernel, request: &ViewRequest<'_>, range: std::ops::Range<usize>) -> Result<ViewJoined> {
        match self {
            Held::Gathered(v) => Ok(v.slice(range)),
            Held::Won(w) => w.gather(kernel, request, range),
        }
    }
}

/// A plain view joined, not yet gathered: its scan (feature columns only), each spine
/// row's winning row in it (`NO_ROW`: none) and the winners' event times if asked.
pub(super) struct Won {
    pub(super) scan: Scan,
    pub(super) types: Vec<DataType>,
    pub(super) winners: Vec<u32>,
    pub(super) event_time: Option<ArrayRef>,
}

impl Won {
    /// The columns of spine rows `range`.
    pub(super) fn gather(&self, kernel: &dyn AsOfKernel, request: &ViewRequest<'_>, range: std::ops::Range<usize>) -> Result<ViewJoined> {
        let phase = std::time::Instant::now();
        let winners = &self.winners[range.clone()];
        let gathered = gather::gather_features(kernel, &self.scan.batches, &self.scan.feature_columns, &self.types, winners)?;
        tracing::debug!(view = %request.view.name, rows = winners.len(), secs = phase.elapsed().as_secs_f64(), "gathered");
        Ok(ViewJoined::new(request, gathered, self.event_time.as_ref().map(|t| t.slice(range.start, range.len()))))
    }
}
