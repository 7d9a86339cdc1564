//! The two operators a cluster join adds to DataFusion's: [`StoreScope`], which makes a
//! table's object store reachable to the Parquet scan beneath it on whichever executor
//! runs it, and [`AsOfJoinExec`], which joins one hash partition of the spine with the
//! same partition of a view's rows by the local join's own code.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::{concat_batches, filter_record_batch, sort_to_indices, take_record_batch};
use arrow::datatypes::{Field, Schema, SchemaRef, TimestampMicrosecondType};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, InputDistributionRequirements, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::TryStreamExt;
use quiver_gpu_join::CpuKernel;
use quiver_sdk::Definitions;
use serde::{Deserialize, Serialize};

use super::super::scan::Scan;
use super::super::{HistoricalOptions, Join, SpineRows, ViewRequest};
use crate::keys::EntityIndex;

/// The spine's staged columns after the join keys: each row's point in time, and its
/// row number in the caller's spine (what puts the answer back in order).
pub(super) const SPINE_TIME: &str = "_quiver_spine_time";
pub(super) const SPINE_ROW: &str = "_quiver_spine_row";

fn properties(schema: SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Final,
        Boundedness::Bounded,
    ))
}

fn exec_error(message: impl fmt::Display) -> DataFusionError {
    DataFusionError::Execution(message.to_string())
}

/// What each partition of a view's cluster join runs: the view (with the definitions
/// its keys come from), the requested features, the options, and the event-time range
/// the local join scans (so both read the same rows).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct JoinTask {
    pub(super) defs: Definitions,
    pub(super) view: String,
    pub(super) features: Vec<String>,
    pub(super) created_cutoff: bool,
    pub(super) event_times: bool,
    pub(super) lo: Option<i64>,
    pub(super) hi: i64,
    /// For each feature, its column in the view's rows (`None`: the table lacks it).
    pub(super) feature_columns: Vec<Option<usize>>,
}

impl JoinTask {
    fn request(&self) -> DfResult<ViewRequest<'_>> {
        let view = self.defs.find_view(&self.view).map_err(|e| exec_error(e.0))?;
        Ok(ViewRequest {
            view,
            features: self.features.iter().map(String::as_str).collect(),
            positions: (0..self.features.len()).collect(),
            event_time: false,
        })
    }

    /// The number of join keys: the first columns of both inputs.
    fn n_keys(&self) -> DfResult<usize> {
        Ok(self.defs.join_keys(self.request()?.view).len())
    }

    /// What a partition returns: the spine row number, then the view's joined columns
    /// as the local join names and types them.
    pub(super) fn output_schema(&self) -> DfResult<SchemaRef> {
        let request = self.request()?;
        let mut fields = vec![Field::new(SPINE_ROW, arrow::datatypes::DataType::UInt64, false)];
        fields.extend(super::super::joined_fields(&request, self.event_times));
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Joins one partition: `spine` (keys, time, row number) with `rows` (the view's
    /// scanned columns), both holding only this partition's entities.
    fn run(&self, spine: &[RecordBatch], spine_schema: &SchemaRef, rows: Vec<RecordBatch>) -> DfResult<RecordBatch> {
        let schema = self.output_schema()?;
        let spine = concat_batches(spine_schema, spine)?;
        let n_keys = self.n_keys()?;
        // The spine in its caller's order, as the local join sees it.
        let order = sort_to_indices(spine.column(n_keys + 1), None, None)?;
        let spine = take_record_batch(&spine, &order)?;
        let times: Vec<i64> = spine.column(n_keys).as_primitive::<TimestampMicrosecondType>().values().to_vec();
        let row_numbers = spine.column(n_keys + 1).clone();
        let rows = rows
            .iter()
            .map(|b| self.in_range(b, n_keys))
            .filter(|b| b.as_ref().map_or(true, |b| b.num_rows() > 0))
            .collect::<DfResult<Vec<_>>>()?;
        let n_rows = rows.iter().map(RecordBatch::num_rows).sum();
        let scan = Scan { batches: rows, rows: n_rows, version: None, feature_columns: self.feature_columns.clone() };
        let request = self.request()?;
        let options = HistoricalOptions { created_cutoff: self.created_cutoff, event_times: self.event_times, ..Default::default() };
        let kernel = CpuKernel::new();
        let join = Join {
            defs: &self.defs,
            spine: SpineRows { source: "the spine", rows: &spine },
            times: &times,
            options: &options,
            kernel: &kernel,
            progress: &|_, _| {},
        };
        let joined = (|| {
            let index = EntityIndex::build(&join.spine_keys(request.view)?)?;
            join.scanned(&request, index, scan)
        })()
        .map_err(exec_error)?;
        let mut columns: Vec<ArrayRef> = vec![row_numbers];
        columns.extend(joined.features.into_iter().map(|(_, c)| c));
        columns.extend(joined.event_time.map(|(_, c)| c));
        Ok(RecordBatch::try_new(schema, columns)?)
    }

    /// The rows of `batch` whose event time (the column after the keys) the local
    /// join's scan reads: `[lo, hi]`.
    fn in_range(&self, batch: &RecordBatch, n_keys: usize) -> DfResult<RecordBatch> {
        let ts = batch.column(n_keys).as_primitive::<TimestampMicrosecondType>();
        let keep: BooleanArray = ts.iter().map(|t| Some(t.is_some_and(|t| t <= self.hi && self.lo.is_none_or(|lo| t >= lo)))).collect();
        Ok(filter_record_batch(batch, &keep)?)
    }
}

/// The point-in-time join of one hash partition: input 0 the spine's rows, input 1 the
/// view's, both hash-partitioned by the join keys (their first columns) into the same
/// number of partitions, so an entity's spine rows and feature rows meet in one.
#[derive(Debug)]
pub(super) struct AsOfJoinExec {
    pub(super) task: Arc<JoinTask>,
    spine: Arc<dyn ExecutionPlan>,
    rows: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl AsOfJoinExec {
    pub(super) fn try_new(task: Arc<JoinTask>, spine: Arc<dyn ExecutionPlan>, rows: Arc<dyn ExecutionPlan>) -> DfResult<AsOfJoinExec> {
        let (left, right) = (spine.output_partitioning().partition_count(), rows.output_partitioning().partition_count());
        if left != right {
            return Err(DataFusionError::Internal(format!(
                "AsOfJoinExec: the spine has {left} partitions and the rows {right}; they must be partitioned alike"
            )));
        }
        let properties = properties(task.output_schema()?, left);
        Ok(AsOfJoinExec { task, spine, rows, properties })
    }

    fn keys(&self) -> DfResult<Vec<Arc<dyn PhysicalExpr>>> {
        let n = self.task.n_keys()?;
        let schema = self.spine.schema();
        Ok((0..n).map(|i| Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>).collect())
    }
}

impl DisplayAs for AsOfJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "AsOfJoinExec: view={} features=[{}]", self.task.view, self.task.features.join(", "))
    }
}

impl ExecutionPlan for AsOfJoinExec {
    fn name(&self) -> &str {
        "AsOfJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.spine, &self.rows]
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        match self.keys() {
            Ok(keys) => {
                InputDistributionRequirements::new(vec![Distribution::KeyPartitioned(keys.clone()), Distribution::KeyPartitioned(keys)])
            }
            Err(_) => InputDistributionRequirements::new(vec![Distribution::UnspecifiedDistribution; 2]),
        }
    }

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [spine, rows]: [Arc<dyn ExecutionPlan>; 2] = children
            .try_into()
            .map_err(|c: Vec<_>| DataFusionError::Internal(format!("AsOfJoinExec takes two inputs, given {}", c.len())))?;
        Ok(Arc::new(AsOfJoinExec::try_new(self.task.clone(), spine, rows)?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        let spine = self.spine.execute(partition, context.clone())?;
        let rows = self.rows.execute(partition, context)?;
        let spine_schema = self.spine.schema();
        let task = self.task.clone();
        let schema = self.properties.eq_properties.schema().clone();
        let joined = async move {
            let spine: Vec<RecordBatch> = spine.try_collect().await?;
            let rows: Vec<RecordBatch> = rows.try_collect().await?;
            // The kernel and the sweeps are CPU work: off the runtime's threads.
            tokio::task::spawn_blocking(move || task.run(&spine, &spine_schema, rows))
                .await
                .map_err(|e| exec_error(format!("the join of a partition panicked: {e}")))?
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::once(joined))))
    }
}
