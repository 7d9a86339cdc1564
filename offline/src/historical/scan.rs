//! Scanning a view's Delta table with DataFusion: projected to the columns a join
//! needs, pruned to a time range, at a pinned version when asked.

use std::collections::BTreeMap;

use arrow::array::RecordBatch;
use datafusion::prelude::{Expr, SessionConfig, SessionContext, ident, lit};
use datafusion::scalar::ScalarValue;
use quiver_sdk::{Config, Definitions, FeatureView};

use crate::delta::open_table;
use crate::error::{Error, Result};
use crate::schema::SEQ_COLUMN;

/// The scanned rows of one view: keys, event time, created time (if any), seq, then
/// the requested features that the table has.
#[derive(Clone)]
pub(crate) struct Scan {
    pub(crate) batches: Vec<RecordBatch>,
    pub(crate) rows: usize,
    /// The table version read (`None`: no table).
    pub(crate) version: Option<u64>,
    /// For each requested feature, its column in `batches`, or `None` when the table
    /// has no such column yet (a feature added after the data was written).
    pub(crate) feature_columns: Vec<Option<usize>>,
}

impl Scan {
    /// The scan with only its feature columns (the keys and times, once the kernel's
    /// input is built, are dropped).
    pub(crate) fn features_only(self) -> Result<Scan> {
        let present: Vec<usize> = self.feature_columns.iter().flatten().copied().collect();
        let mut next = 0;
        Ok(Scan {
            batches: self.batches.into_iter().map(|b| b.project(&present)).collect::<std::result::Result<_, _>>()?,
            rows: self.rows,
            version: None,
            feature_columns: self
                .feature_columns
                .iter()
                .map(|c| {
                    c.map(|_| {
                        next += 1;
                        next - 1
                    })
                })
                .collect(),
        })
    }
}

/// Scans kept for joins that read the same rows of the same tables again: `verify
/// --as-arrived` joins one spine at up to 17 moments (docs/consistency.md#as-arrived),
/// and scanning each table once instead of once per moment is most of its time. Keyed
/// by table, columns and range; every join given one cache reads the tables as they
/// were at the first scan.
#[derive(Clone, Default)]
pub struct ScanCache(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Scan>>>);

impl std::fmt::Debug for ScanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.lock().map_or(0, |m| m.len());
        f.debug_struct("ScanCache").field("scans", &held).finish()
    }
}

impl ScanCache {
    /// [`scan_view_at`], or its rows as the first call with the same arguments read them.
    pub(crate) async fn scan(
        &self,
        location: &quiver_sdk::StoreLocation,
        defs: &Definitions,
        view: &FeatureView,
        features: &[&str],
        range: ScanRange,
    ) -> Result<Scan> {
        let key = format!("{location}\u{1f}{features:?}\u{1f}{range:?}");
        if let Some(held) = self.0.lock().expect("scan cache lock").get(&key) {
            return Ok(held.clone());
        }
        let scan = scan_view_at(location, defs, view, features, range).await?;
        self.0.lock().expect("scan cache lock").entry(key).or_insert(scan.clone());
        Ok(scan)
    }
}

pub(crate) fn ts_literal(v: i64) -> Expr {
    lit(ScalarValue::TimestampMicrosecond(Some(v), Some("UTC".into())))
}

/// Which rows of a table a scan reads: event times in `[lo, hi]` (no lower bound for
/// `None`), an extra filter, at a Delta version (the latest for `None`).
#[derive(Debug, Clone)]
pub(crate) struct ScanRange {
    pub(crate) lo: Option<i64>,
    pub(crate) hi: i64,
    pub(crate) extra: Option<Expr>,
    pub(crate) version: Option<u64>,
}

impl ScanRange {
    /// Every row, at the latest version.
    pub(crate) fn all() -> ScanRange {
        ScanRange { lo: None, hi: i64::MAX, extra: None, version: None }
    }
}

/// Scans `view`'s table at `location`: keys, event time, created time (if any), seq,
/// then those of `features` the table has, for the rows of `range`.
pub(crate) async fn scan_view_at(
    location: &quiver_sdk::StoreLocation,
    defs: &Definitions,
    view: &FeatureView,
    features: &[&str],
    range: ScanRange,
) -> Result<Scan> {
    let name = &location.to_string();
    let Some(mut table) = open_table(location).await? else {
        return Ok(Scan { batches: Vec::new(), rows: 0, version: None, feature_columns: vec![None; features.len()] });
    };
    if let Some(v) = range.version
        && table.version() != Some(v)
    {
        table.load_version(v).await.map_err(|e| Error::delta(name, e))?;
    }
    scan_table(&table, name, defs, view, features, range).await
}

/// [`scan_view_at`] of a table already open (named `name` in errors), at the version
/// it is at (`range.version` is not read).
pub(crate) async fn scan_table(
    table: &deltalake::DeltaTable,
    name: &str,
    defs: &Definitions,
    view: &FeatureView,
    features: &[&str],
    range: ScanRange,
) -> Result<Scan> {
    let ScanRange { lo, hi, extra, .. } = range;
    let query = |source| Error::query(name, source);
    let df = read_table(table, name).await?;
    let available: Vec<String> = df.schema().fields().iter().map(|f| f.name().clone()).collect();
    let (select, feature_columns) = scan_columns(name, &available, defs, view, features)?;
    let ts = view.source.timestamp_field.clone();
    let mut filter = ident(&ts).lt_eq(ts_literal(hi));
    if let Some(lo) = lo {
        filter = filter.and(ident(&ts).gt_eq(ts_literal(lo)));
    }
    if let Some(extra) = extra {
        filter = filter.and(extra);
    }
    let version = table.version();
    let df = df.filter(filter).map_err(query)?.select(select.iter().map(ident).collect::<Vec<_>>()).map_err(query)?;
    let batches: Vec<RecordBatch> = df.collect().await.map_err(query)?.into_iter().filter(|b| b.num_rows() > 0).collect();
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    Ok(Scan { batches, rows, version, feature_columns })
}

/// The rows of `files` of `table` (at `location`; paths as its log's add actions name
/// them) with event time `lo` or later: what [`scan_table`] reads of those files, read
/// from them alone — no planning over the table's other files. `None` when the files
/// cannot be read so (a partitioned table, a file without one of the columns the scan
/// needs: column mapping), for the caller to scan the table instead.
///
/// # Errors
/// A file that cannot be read.
pub(crate) async fn scan_files(
    location: &quiver_sdk::StoreLocation,
    table: &deltalake::DeltaTable,
    defs: &Definitions,
    view: &FeatureView,
    features: &[&str],
    files: &[String],
    lo: i64,
) -> Result<Option<Scan>> {
    use arrow::array::{AsArray, BooleanArray, new_null_array};
    use arrow::compute::{cast, filter_record_batch};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit, TimestampMicrosecondType};
    use object_store::ObjectStoreExt;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let name = location.to_string();
    let state = table.snapshot().map_err(|e| Error::delta(&name, e))?;
    if !state.metadata().partition_columns().is_empty() {
        return Ok(None);
    }
    let schema = state.snapshot().arrow_schema();
    let available: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let (select, feature_columns) = scan_columns(&name, &available, defs, view, features)?;
    let fields: Vec<Field> = select
        .iter()
        .map(|c| schema.field_with_name(c).map(|f| Field::new(c, f.data_type().clone(), true)))
        .collect::<std::result::Result<_, _>>()?;
    let out = std::sync::Arc::new(Schema::new(fields));
    let ts_at = defs.join_keys(view).len();
    let micros = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let store = crate::delta::object_store(location)?;
    let unreadable =
        |file: &str, e: &dyn std::fmt::Display| Error::Location { table: name.clone(), message: format!("cannot read {file}: {e}") };
    let mut batches = Vec::new();
    for file in files {
        let path = object_store::path::Path::from_url_path(file).map_err(|e| unreadable(file, &e))?;
        let bytes = store.get(&path).await.map_err(|e| unreadable(file, &e))?.bytes().await.map_err(|e| unreadable(file, &e))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.with_batch_size(64 * 1024).build())
            .map_err(|e| unreadable(file, &e))?;
        for batch in reader {
            let batch = batch?;
            let mut columns = Vec::with_capacity(out.fields().len());
            for (i, field) in out.fields().iter().enumerate() {
                match batch.schema().index_of(field.name()) {
                    Ok(at) => columns.push(cast(batch.column(at), field.data_type())?),
                    // A feature added after the file was written.
                    Err(_) if feature_columns.contains(&Some(i)) => columns.push(new_null_array(field.data_type(), batch.num_rows())),
                    Err(_) => return Ok(None),
                }
            }
            let ts = cast(&columns[ts_at], &micros)?;
            let keep: BooleanArray =
                ts.as_primitive::<TimestampMicrosecondType>().iter().map(|t| Some(t.is_some_and(|t| t >= lo))).collect();
            let batch = filter_record_batch(&RecordBatch::try_new(out.clone(), columns)?, &keep)?;
            if batch.num_rows() > 0 {
                batches.push(batch);
            }
        }
    }
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    Ok(Some(Scan { batches, rows, version: table.version(), feature_columns }))
}

/// A DataFrame over `table` (named `name` in errors): all cores, 64k-row batches,
/// strings as `Utf8` (not views).
async fn read_table(table: &deltalake::DeltaTable, name: &str) -> Result<datafusion::dataframe::DataFrame> {
    let query = |source| Error::query(name, source);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut config = SessionConfig::new().with_target_partitions(threads).with_batch_size(64 * 1024);
    config.options_mut().execution.parquet.schema_force_view_types = false;
    let ctx = SessionContext::new_with_config(config);
    table.update_datafusion_session(&ctx.state()).map_err(|e| Error::delta(name, e))?;
    let provider = table.table_provider().await.map_err(query)?;
    ctx.read_table(provider).map_err(query)
}

/// The columns a scan of `view`'s table (`name`, holding `available`) selects: keys,
/// event time, created time (if any), seq, then those of `features` the table has;
/// and for each feature its position in that list (`None`: the table lacks it).
///
/// # Errors
/// [`Error::Request`] when the table lacks a key, time or seq column.
pub(crate) fn scan_columns(
    name: &str,
    available: &[String],
    defs: &Definitions,
    view: &FeatureView,
    features: &[&str],
) -> Result<(Vec<String>, Vec<Option<usize>>)> {
    let mut select: Vec<String> = defs.join_keys(view).into_iter().map(|k| k.name).collect();
    select.push(view.source.timestamp_field.clone());
    if let Some(created) = &view.source.created_timestamp_field {
        select.push(created.clone());
    }
    select.push(SEQ_COLUMN.to_string());
    for column in &select {
        if !available.contains(column) {
            return Err(Error::Request(format!("delta table {name} has no column `{column}` (it holds: {})", available.join(", "))));
        }
    }
    let mut feature_columns = Vec::new();
    for f in features {
        if available.iter().any(|a| a == f) {
            feature_columns.push(Some(select.len()));
            select.push(f.to_string());
        } else {
            feature_columns.push(None);
        }
    }
    Ok((select, feature_columns))
}

/// Every row of a view's table: keys, event time, created time (if any), the
/// ingestion-order column, then the view's features that the table has (in view order).
/// An empty list when the table does not exist.
///
/// # Errors
/// [`Error::Delta`]/[`Error::Query`] when the table cannot be read.
pub async fn read_view(config: &Config, defs: &Definitions, view: &FeatureView) -> Result<Vec<RecordBatch>> {
    let location = config.view_table(view);
    let features: Vec<&str> = view.features.iter().map(|f| f.name.as_str()).collect();
    Ok(scan_view_at(&location, defs, view, &features, ScanRange::all()).await?.batches)
}

/// A view's rows with event times in `since..until`, their `features` only, as
/// DataFusion reads them: one stream per partition, so a caller consumes them on every
/// core (monitoring's offline windows). Each feature's column in the streams' batches,
/// or `None` when the table lacks it (a feature added after the rows were written).
/// `None` when the view has no table.
///
/// # Errors
/// [`Error::Delta`]/[`Error::Query`] when the table cannot be read.
pub async fn window_streams(
    config: &Config,
    view: &FeatureView,
    features: &[&str],
    since: i64,
    until: i64,
) -> Result<Option<(Vec<datafusion::execution::SendableRecordBatchStream>, Vec<Option<usize>>)>> {
    let location = config.view_table(view);
    let name = &location.to_string();
    let Some(table) = open_table(&location).await? else {
        return Ok(None);
    };
    let query = |source| Error::query(name, source);
    let df = read_table(&table, name).await?;
    let available: Vec<String> = df.schema().fields().iter().map(|f| f.name().clone()).collect();
    let mut select = Vec::new();
    let columns: Vec<Option<usize>> = features
        .iter()
        .map(|f| {
            available.iter().any(|a| a == f).then(|| {
                select.push(ident(*f));
                select.len() - 1
            })
        })
        .collect();
    if select.is_empty() {
        // Only counted: read the times alone.
        select.push(ident(&view.source.timestamp_field));
    }
    let ts = ident(&view.source.timestamp_field);
    let filter = ts.clone().gt_eq(ts_literal(since)).and(ts.lt(ts_literal(until)));
    let df = df.filter(filter).map_err(query)?.select(select).map_err(query)?;
    Ok(Some((df.execute_stream_partitioned().await.map_err(query)?, columns)))
}

/// The latest Delta version of each view's table (`None`: no table yet).
///
/// # Errors
/// [`Error::Delta`] when a table cannot be read.
pub async fn table_versions(config: &Config, views: &[&FeatureView]) -> Result<BTreeMap<String, Option<u64>>> {
    let mut out = BTreeMap::new();
    for view in views {
        let table = open_table(&config.view_table(view)).await?;
        out.insert(view.versioned_name(), table.and_then(|t| t.version()));
    }
    Ok(out)
}

/// A view's table at a glance: its version, rows and newest event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSummary {
    pub version: u64,
    pub rows: u64,
    /// UTC microseconds; `None` for an empty table.
    pub newest_event: Option<i64>,
}

/// The [`TableSummary`] of `view`'s table (`None`: no table yet), from one aggregate
/// query (DataFusion answers it from the Parquet statistics where it can).
///
/// # Errors
/// [`Error::Delta`]/[`Error::Query`] when the table cannot be read.
pub async fn table_summary(config: &Config, view: &FeatureView) -> Result<Option<TableSummary>> {
    use datafusion::functions_aggregate::expr_fn::{count, max};
    let location = config.view_table(view);
    let name = &location.to_string();
    let Some(table) = open_table(&location).await? else {
        return Ok(None);
    };
    let query = |source| Error::query(name, source);
    let version = table.version().unwrap_or(0);
    let ts = ident(&view.source.timestamp_field);
    let df = read_table(&table, name).await?.aggregate(vec![], vec![count(lit(1)), max(ts)]).map_err(query)?;
    let batches = df.collect().await.map_err(query)?;
    let (mut rows, mut newest) = (0u64, None);
    if let Some(b) = batches.iter().find(|b| b.num_rows() > 0) {
        use arrow::array::{Array, AsArray};
        rows = b.column(0).as_primitive::<arrow::datatypes::Int64Type>().value(0) as u64;
        let t = arrow::compute::cast(b.column(1), &arrow::datatypes::DataType::Int64)?;
        let t = t.as_primitive::<arrow::datatypes::Int64Type>();
        newest = (!t.is_null(0)).then(|| t.value(0));
    }
    Ok(Some(TableSummary { version, rows, newest_event: newest }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::prelude::{ident, lit};

    use super::*;
    use crate::ingest::{AppendOptions, append};

    const DEFS: &str = r#"
entities:
  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}
feature_views:
  - name: rides
    entities: [rider]
    features:
      - {name: fare, dtype: float64}
      - {name: city, dtype: string}
    aggregations:
      - {name: n_1h, function: count, column: fare, window: 1h}
"#;

    fn rides(ids: Vec<i64>, minutes: Vec<i64>) -> RecordBatch {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Arc::new(Schema::new(vec![
            Field::new("rider_id", DataType::Int64, false),
            Field::new("event_timestamp", utc, false),
            Field::new("fare", DataType::Float64, true),
            Field::new("city", DataType::Utf8, true),
        ]));
        let n = ids.len();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(TimestampMicrosecondArray::from(minutes.iter().map(|m| 60_000_000 * m).collect::<Vec<_>>()).with_timezone("UTC")),
            Arc::new(Float64Array::from(minutes.iter().map(|m| (*m % 3 != 0).then_some(*m as f64)).collect::<Vec<_>>())),
            Arc::new(StringArray::from((0..n).map(|i| (i % 2 == 0).then(|| format!("c{i}"))).collect::<Vec<_>>())),
        ];
        RecordBatch::try_new(schema, columns).unwrap()
    }

    /// The definitions, `rides` and the location of its table in a repository at `dir`.
    fn rides_table(dir: &std::path::Path) -> (Definitions, FeatureView, quiver_sdk::StoreLocation) {
        let config = Config::parse(dir, &dir.join("quiver.yaml"), "project: t\n", Vec::new()).unwrap();
        let defs = quiver_sdk::yaml::parse_definitions(DEFS).unwrap();
        let view = defs.find_view("rides").unwrap().clone();
        let location = config.view_table(&view);
        (defs, view, location)
    }

    /// A rebuild's read of the files a version added (the event cache's): the rows the
    /// table's scan finds of that version, from the event-time bound on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_files_a_version_added_read_alone_are_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (defs, view, location) = rides_table(dir.path());
        let write = |batch| append(&location, &defs, &view, "rides", vec![batch], AppendOptions::new(None), &|_, _| {});
        write(rides(vec![1, 2, 3], vec![10, 20, 30])).await.unwrap();
        write(rides(vec![1, 2, 3, 4, 1, 5], vec![5, 12, 18, 25, 40, 7])).await.unwrap();
        let table = open_table(&location).await.unwrap().unwrap();
        // The last version: the second append's.
        let version = table.version().unwrap();
        let entry = crate::delta::log_entry(&location, version).await.unwrap().unwrap();
        let files = crate::delta::added_files(&entry).unwrap();
        assert!(!files.is_empty());
        let lo = 10 * 60_000_000;
        let features = ["fare", "city"];
        let alone = scan_files(&location, &table, &defs, &view, &features, &files, lo).await.unwrap().expect("the files read alone");
        let range =
            ScanRange { lo: Some(lo), hi: i64::MAX, extra: Some(ident(SEQ_COLUMN).gt_eq(lit((version as i64) << 32))), version: None };
        let scanned = scan_table(&table, "rides", &defs, &view, &features, range).await.unwrap();
        assert_eq!((alone.rows, scanned.rows), (4, 4), "the second append's rows from minute 10");
        assert_eq!(alone.version, scanned.version);
        let events = |scan| {
            let mut out: Vec<String> = super::super::events::by_entity(&defs, &view, scan)
                .unwrap()
                .into_iter()
                .map(|(keys, mut events)| {
                    events.sort_by_key(|e| e.order);
                    format!("{keys:?} {events:?}")
                })
                .collect();
            out.sort();
            out
        };
        assert_eq!(events(alone), events(scanned));
    }

    /// The joins sharing a cache read the table as the first scan found it, and a scan
    /// of other columns or another range is a scan of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scan_cache_answers_the_same_scan_with_the_first_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (defs, view, location) = rides_table(dir.path());
        let write = |batch| append(&location, &defs, &view, "rides", vec![batch], AppendOptions::new(None), &|_, _| {});
        write(rides(vec![1, 2, 3], vec![10, 20, 30])).await.unwrap();
        let cache = ScanCache::default();
        let from = |minute: i64| ScanRange { lo: Some(minute * 60_000_000), hi: i64::MAX, extra: None, version: None };
        let first = cache.scan(&location, &defs, &view, &["fare"], from(0)).await.unwrap();
        assert_eq!(first.rows, 3);
        write(rides(vec![4, 5], vec![40, 50])).await.unwrap();
        let again = cache.clone().scan(&location, &defs, &view, &["fare"], from(0)).await.unwrap();
        assert_eq!((again.rows, again.version), (3, first.version), "the same scan: the first one's rows");
        let columns = cache.scan(&location, &defs, &view, &["fare", "city"], from(0)).await.unwrap();
        assert_eq!(columns.rows, 5, "other columns: scanned afresh");
        let range = cache.scan(&location, &defs, &view, &["fare"], from(15)).await.unwrap();
        assert_eq!(range.rows, 4, "another range: scanned afresh");
        assert_eq!(scan_view_at(&location, &defs, &view, &["fare"], from(0)).await.unwrap().rows, 5);
    }
}
