//! The point-in-time join on a DataFusion Ballista cluster (docs/settings.md): `historical`
//! and `export` with `--cluster df://HOST:PORT`.
//!
//! Per requested view, the client resolves what the local join would scan (the table's
//! data files at the pinned version, the columns, the event-time range) and stages the
//! spine's join keys, times and row numbers as Parquet next to the offline store. It
//! submits one physical plan to the scheduler:
//!
//! ```text
//! AsOfJoinExec                     one task per hash partition: the local join's code
//!   RepartitionExec(hash(keys), N)   ── shuffle ──  DataSourceExec(staged spine)
//!   RepartitionExec(hash(keys), N)   ── shuffle ──  DataSourceExec(table files)
//! ```
//!
//! Ballista cuts the plan into stages at the repartitions: scan tasks write their rows
//! hash-partitioned by entity, and each join task reads one partition of both sides —
//! every row of an entity, spine and features, meets in one task — and runs
//! [`Join::scanned`], the code the local join runs after its scan, on the same rows.
//! The answers come back with their spine row numbers; the client puts them in spine
//! order, so the result is the local join's, byte for byte.

mod codec;
mod exec;
mod stores;

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray, UInt64Array};
use arrow::compute::{concat_batches, sort_to_indices, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use ballista_core::config::BallistaConfig;
use ballista_core::extension::SessionConfigExt;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, PhysicalExpr};
use datafusion::prelude::SessionConfig;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use quiver_sdk::{Config, StoreLocation};

pub use codec::QuiverCodec;
use exec::{AsOfJoinExec, JoinTask, SPINE_ROW, SPINE_TIME};
pub use stores::QuiverStores;
use stores::store_url;

use super::scan::{Scan, scan_columns};
use super::{Join, ViewJoined, ViewRequest};
use crate::delta::{object_store, open_table};
use crate::error::{Error, Result};
use crate::keys::EntityIndex;
use crate::schema::key_type;

/// A DataFusion runtime for a cluster process: its object stores include the offline
/// store's `quiver://` locations ([`QuiverStores`]); spill files go to `work_dir` (an
/// executor's) if given.
///
/// # Errors
/// DataFusion's, building the runtime.
pub fn runtime_env(work_dir: Option<&str>) -> datafusion::error::Result<Arc<RuntimeEnv>> {
    let mut builder = RuntimeEnvBuilder::new().with_object_store_registry(Arc::new(QuiverStores::default()));
    if let Some(dir) = work_dir {
        builder = builder.with_temp_file_path(dir);
    }
    Ok(Arc::new(builder.build()?))
}

/// The scheduler's session: Ballista's, on a [`runtime_env`] (the scheduler decodes
/// the submitted plans, whose scans open their stores then).
///
/// # Errors
/// DataFusion's, building the session.
pub fn scheduler_session(config: SessionConfig) -> datafusion::error::Result<SessionState> {
    let state = ballista_core::utils::default_session_builder(config)?;
    Ok(SessionStateBuilder::new_from_existing(state).with_runtime_env(runtime_env(None)?).build())
}

/// Hash partitions of a join when the address names none (`?partitions=N`).
const DEFAULT_PARTITIONS: usize = 8;

/// A scheduler's address, as `--cluster` gives it: `df://HOST:PORT[?partitions=N]`.
#[derive(Debug, Clone)]
struct Target {
    /// As given, for errors.
    given: String,
    /// The scheduler's gRPC endpoint.
    endpoint: String,
    partitions: usize,
}

impl Target {
    fn parse(given: &str) -> Result<Target> {
        let bad = |why: &str| Error::Request(format!("--cluster `{given}`: {why} (expected df://HOST:PORT[?partitions=N])"));
        let rest = given.strip_prefix("df://").ok_or_else(|| bad("not a df:// address"))?;
        let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad("no host, or a port that is not a number up to 65535"));
        }
        let mut partitions = DEFAULT_PARTITIONS;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("partitions", n)) => {
                    partitions = n.parse().ok().filter(|&n| (1..=4096).contains(&n)).ok_or_else(|| bad("partitions must be 1 to 4096"))?;
                }
                _ => return Err(bad(&format!("unknown setting `{pair}`"))),
            }
        }
        Ok(Target { given: given.to_string(), endpoint: format!("http://{host}:{port}"), partitions })
    }

    fn error(&self, message: impl std::fmt::Display) -> Error {
        let message = message.to_string();
        // Ballista words an unreachable scheduler as a transport error's Debug dump.
        let message = if message.contains("tcp connect error") {
            let why = ["Connection refused", "timed out", "No route to host"]
                .into_iter()
                .find(|w| message.contains(w))
                .map_or("cannot connect".to_string(), str::to_lowercase);
            format!("no scheduler answers at {} ({why})", self.endpoint.trim_start_matches("http://"))
        } else {
            message.replace('\n', " ")
        };
        Error::Cluster { cluster: self.given.clone(), message }
    }
}

/// Joins one requested view on the cluster at `cluster`: what [`Join::view`] answers,
/// computed by the cluster's executors.
pub(super) async fn join_view(join: &Join<'_>, config: &Config, cluster: &str, request: &ViewRequest<'_>) -> Result<ViewJoined> {
    let target = Target::parse(cluster)?;
    let view = request.view;
    let need = join.need(request)?;
    let keys = join.spine_keys(view)?;
    let location = config.view_table(view);
    let name = location.to_string();
    let nothing = |n: usize| Scan { batches: Vec::new(), rows: 0, version: None, feature_columns: vec![None; n] };
    let Some(mut table) = open_table(&location).await? else {
        return join.scanned(request, EntityIndex::build(&keys)?, nothing(need.columns.len()));
    };
    if let Some(v) = need.range.version
        && table.version() != Some(v)
    {
        table.load_version(v).await.map_err(|e| Error::delta(&name, e))?;
    }
    let snapshot = table.snapshot().map_err(|e| Error::delta(&name, e))?;
    let table_schema = snapshot.snapshot().arrow_schema();
    let available: Vec<String> = table_schema.fields().iter().map(|f| f.name().clone()).collect();
    let (select, feature_columns) = scan_columns(&name, &available, join.defs, view, &need.columns)?;
    let files: Vec<(String, u64)> =
        snapshot.log_data().into_iter().map(|f| (f.object_store_path().to_string(), f.size().max(0) as u64)).collect();
    if files.is_empty() || join.times.is_empty() {
        return join.scanned(request, EntityIndex::build(&keys)?, nothing(need.columns.len()));
    }

    // The view's rows, as the local scan selects them; keys in their key types, so a
    // key hashes alike on both sides.
    let key_fields: Vec<Field> = join.defs.join_keys(view).iter().map(|k| Field::new(&k.name, key_type(k.dtype), true)).collect();
    let n_keys = key_fields.len();
    let mut row_fields = key_fields.clone();
    for column in &select[n_keys..] {
        let field = table_schema.field_with_name(column)?;
        let dtype = match field.data_type() {
            DataType::Utf8View => DataType::Utf8,
            DataType::BinaryView => DataType::Binary,
            other => other.clone(),
        };
        row_fields.push(Field::new(column, dtype, true));
    }
    let row_schema = Arc::new(Schema::new(row_fields));

    let job = format!("{}-{}-{}", std::process::id(), view.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"), unique());
    let staging = config.offline_root.join("_quiver_cluster").join(&job);
    let staged = stage_spine(&staging, &key_fields, &keys, join.times, target.partitions).await?;
    let task = JoinTask {
        defs: join.defs.clone(),
        view: view.name.clone(),
        features: request.features.iter().map(|f| f.to_string()).collect(),
        created_cutoff: join.options.created_cutoff,
        event_times: join.event_time(request),
        lo: need.range.lo,
        hi: need.range.hi,
        feature_columns,
    };
    let answer = run(&target, task, &location, row_schema, files, &staging, &staged).await;
    if let Err(e) = unstage(&staging, &staged.files).await {
        tracing::warn!(staging = %staging, error = %e, "could not remove the staged spine");
    }
    let (schema, batches) = answer?;
    (join.progress)(&format!("joined {} on the cluster", view.name), join.times.len() as u64);
    assemble(&target, request, join, schema, &batches)
}

/// A process-unique number for staging names.
fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{nanos:x}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The staged spine: its Parquet files (paths in the staging folder) and schema.
struct Staged {
    files: Vec<(String, u64)>,
    schema: SchemaRef,
}

/// Writes the spine's keys, times and row numbers as Parquet files in `staging`, one
/// per slice of about `rows / slices` rows.
async fn stage_spine(staging: &StoreLocation, keys: &[Field], arrays: &[ArrayRef], times: &[i64], slices: usize) -> Result<Staged> {
    let mut fields = keys.to_vec();
    fields.push(Field::new(SPINE_TIME, crate::schema::timestamp_type(), false));
    fields.push(Field::new(SPINE_ROW, DataType::UInt64, false));
    let schema = Arc::new(Schema::new(fields));
    let mut columns = arrays.to_vec();
    columns.push(Arc::new(TimestampMicrosecondArray::from(times.to_vec()).with_timezone("UTC")));
    columns.push(Arc::new(UInt64Array::from_iter_values(0..times.len() as u64)));
    let spine = RecordBatch::try_new(schema.clone(), columns)?;
    let failed = |e: &dyn std::fmt::Display| Error::Location { table: staging.to_string(), message: format!("staging the spine: {e}") };
    if let StoreLocation::Local(path) = staging {
        std::fs::create_dir_all(path).map_err(|e| failed(&e))?;
    }
    let store = object_store(staging)?;
    let per_slice = spine.num_rows().div_ceil(slices.max(1)).max(1);
    let mut files = Vec::new();
    for (i, offset) in (0..spine.num_rows()).step_by(per_slice).enumerate() {
        let slice = spine.slice(offset, per_slice.min(spine.num_rows() - offset));
        let mut bytes = Vec::new();
        let mut writer = parquet::arrow::ArrowWriter::try_new(&mut bytes, schema.clone(), None).map_err(|e| failed(&e))?;
        writer.write(&slice).map_err(|e| failed(&e))?;
        writer.close().map_err(|e| failed(&e))?;
        let path = format!("spine-{i}.parquet");
        let size = bytes.len() as u64;
        store.put(&StorePath::from(path.as_str()), bytes.into()).await.map_err(|e| failed(&e))?;
        files.push((path, size));
    }
    Ok(Staged { files, schema })
}

/// Removes the staged spine.
async fn unstage(staging: &StoreLocation, files: &[(String, u64)]) -> Result<()> {
    let failed = |e: &dyn std::fmt::Display| Error::Location { table: staging.to_string(), message: e.to_string() };
    if let StoreLocation::Local(path) = staging {
        return std::fs::remove_dir_all(path).map_err(|e| failed(&e));
    }
    let store = object_store(staging)?;
    for (path, _) in files {
        store.delete(&StorePath::from(path.as_str())).await.map_err(|e| failed(&e))?;
    }
    Ok(())
}

/// A Parquet scan of `files` (paths under the store registered as `url`), one file
/// group per partition, read as `schema` (a column a file lacks reads as nulls).
fn parquet_scan(url: &str, schema: SchemaRef, groups: Vec<Vec<(String, u64)>>) -> Result<Arc<dyn ExecutionPlan>> {
    let url = ObjectStoreUrl::parse(url).map_err(|e| Error::Request(e.to_string()))?;
    let groups =
        groups.into_iter().map(|g| FileGroup::new(g.into_iter().map(|(path, size)| PartitionedFile::new(path, size)).collect())).collect();
    let config = FileScanConfigBuilder::new(url, Arc::new(ParquetSource::new(schema))).with_file_groups(groups).build();
    Ok(DataSourceExec::from_data_source(config))
}

/// `input` hash-partitioned by its first `n_keys` columns into `n` partitions.
fn by_keys(input: Arc<dyn ExecutionPlan>, n_keys: usize, n: usize) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = input.schema();
    let keys: Vec<Arc<dyn PhysicalExpr>> =
        (0..n_keys).map(|i| Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>).collect();
    Ok(Arc::new(RepartitionExec::try_new(input, Partitioning::Hash(keys, n)).map_err(|e| Error::query("the cluster plan", e))?))
}

/// Builds the plan, submits it and collects its partitions' answers.
async fn run(
    target: &Target,
    task: JoinTask,
    table: &StoreLocation,
    row_schema: SchemaRef,
    files: Vec<(String, u64)>,
    staging: &StoreLocation,
    staged: &Staged,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let n = target.partitions;
    let n_keys = staged.schema.fields().len() - 2;
    let spine_url = store_url(staging);
    let spine_groups = staged.files.iter().map(|f| vec![f.clone()]).collect();
    let spine = parquet_scan(&spine_url, staged.schema.clone(), spine_groups)?;
    let n_groups = files.len().min(n);
    let mut groups = vec![Vec::new(); n_groups];
    for (i, file) in files.into_iter().enumerate() {
        groups[i % n_groups].push(file);
    }
    let rows = parquet_scan(&store_url(table), row_schema, groups)?;
    let plan = AsOfJoinExec::try_new(Arc::new(task), by_keys(spine, n_keys, n)?, by_keys(rows, n_keys, n)?)
        .map_err(|e| Error::query("the cluster plan", e))?;
    let schema = plan.schema();
    let session = format!("quiver-{}", unique());
    let stream = ballista_core::execution_plans::execute_physical_plan::<datafusion_proto::protobuf::PhysicalPlanNode>(
        target.endpoint.clone(),
        &BallistaConfig::default(),
        Arc::new(plan),
        &QuiverCodec::default(),
        session,
        SessionConfig::new_with_ballista(),
    )
    .await
    .map_err(|e| target.error(e))?;
    let batches: Vec<RecordBatch> = stream.try_collect().await.map_err(|e| target.error(e))?;
    Ok((schema, batches))
}

/// The partitions' answers in spine order: every spine row exactly once, or an error.
fn assemble(target: &Target, request: &ViewRequest<'_>, join: &Join<'_>, schema: SchemaRef, batches: &[RecordBatch]) -> Result<ViewJoined> {
    let n = join.times.len();
    let all = concat_batches(&schema, batches)?;
    if all.num_rows() != n {
        return Err(target.error(format!(
            "the join returned {} for a spine of {n}; no result written",
            quiver_sdk::error::count(all.num_rows(), "row")
        )));
    }
    let order = sort_to_indices(all.column(0), None, None)?;
    let sorted = take_record_batch(&all, &order)?;
    let rows = sorted.column(0).as_primitive::<UInt64Type>();
    if let Some(i) = (0..n).find(|&i| rows.value(i) != i as u64) {
        return Err(target.error(format!("spine row {} is missing or answered twice; no result written", i + 1)));
    }
    let mut columns: Vec<ArrayRef> = sorted.columns()[1..].to_vec();
    let event_time = join.event_time(request).then(|| columns.pop().expect("an event time column"));
    Ok(ViewJoined::new(request, columns, event_time))
}
