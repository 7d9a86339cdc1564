//! Historical retrieval: the point-in-time join of a spine with feature views (SPEC §3).
//!
//! Per requested view: a DataFusion scan of its Delta table, projected to the columns
//! needed and pruned to `[min spine time - ttl, max spine time]`; entity ids for the
//! spine's keys and the scanned rows ([`crate::keys`]); the as-of kernel (any
//! [`AsOfKernel`]) returning one winning row index per spine row; and one gather per
//! feature column at the end. The output is the spine, unchanged and in order, followed
//! by one `view__feature` column per requested feature.

use std::fs::File;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, new_null_array};
use arrow::compute::{concat_batches, interleave};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, TimestampMicrosecondType};
use datafusion::prelude::{Expr, SessionConfig, SessionContext, ident, lit};
use datafusion::scalar::ScalarValue;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use quiver_gpu_join::{AsOfInput, AsOfKernel, NO_ROW};
use quiver_sdk::{Config, Definitions, FeatureRef, FeatureView};

use crate::delta::open_table;
use crate::error::{Error, Result};
use crate::ingest::Progress;
use crate::input::{to_utc_micros, widen};
use crate::keys::EntityIndex;
use crate::schema::{SEQ_COLUMN, arrow_type, key_type, timestamp_type};

/// The spine column holding each row's point in time.
pub const SPINE_TIMESTAMP: &str = "event_timestamp";

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
/// [`Error::Unknown`] naming an unknown view or feature, [`Error::Request`] for a
/// duplicate.
pub fn resolve<'a>(defs: &'a Definitions, refs: &[FeatureRef]) -> Result<Vec<ViewRequest<'a>>> {
    let mut out: Vec<ViewRequest<'a>> = Vec::new();
    if refs.is_empty() {
        return Err(Error::Request("no features requested".to_string()));
    }
    for (position, r) in refs.iter().enumerate() {
        let Some(view) = defs.feature_view(&r.view) else {
            let known: Vec<&str> = defs.feature_views.iter().map(|v| v.name.as_str()).collect();
            return Err(Error::Unknown(format!(
                "unknown feature view `{}` in `{r}` (known: {})",
                r.view,
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )));
        };
        let Some(feature) = view.feature(&r.feature) else {
            let known: Vec<&str> = view.features.iter().map(|f| f.name.as_str()).collect();
            return Err(Error::Unknown(format!(
                "unknown feature `{r}` (feature view `{}` has: {})",
                view.name,
                known.join(", ")
            )));
        };
        let entry = match out.iter_mut().position(|v| v.view.name == view.name) {
            Some(i) => &mut out[i],
            None => {
                out.push(ViewRequest {
                    view,
                    features: Vec::new(),
                    positions: Vec::new(),
                });
                out.last_mut().expect("just pushed")
            }
        };
        if entry.features.contains(&feature.name.as_str()) {
            return Err(Error::Request(format!("feature `{r}` requested twice")));
        }
        entry.features.push(&feature.name);
        entry.positions.push(position);
    }
    Ok(out)
}

/// Reads a spine (Parquet, or CSV with a header) into one batch. In CSV, the
/// `key_types` columns get their key types and `event_timestamp` is read as text (then
/// parsed as RFC 3339 by the join); other CSV columns are inferred.
///
/// # Errors
/// [`Error::Input`] naming the file.
pub fn read_spine(path: &Path, key_types: &[(String, DataType)]) -> Result<RecordBatch> {
    let fail = |e: &dyn std::fmt::Display| Error::input(path, e.to_string());
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let batches: Vec<RecordBatch> = match ext.as_str() {
        "parquet" | "pq" => {
            let file = File::open(path).map_err(|e| fail(&e))?;
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| fail(&e))?
                .with_batch_size(64 * 1024)
                .build()
                .map_err(|e| fail(&e))?
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| fail(&e))?
        }
        "csv" => {
            let file = File::open(path).map_err(|e| fail(&e))?;
            let (inferred, _) = arrow::csv::reader::Format::default()
                .with_header(true)
                .infer_schema(File::open(path).map_err(|e| fail(&e))?, None)
                .map_err(|e| fail(&e))?;
            let fields: Vec<Field> = inferred
                .fields()
                .iter()
                .map(|f| {
                    let dtype = if f.name() == SPINE_TIMESTAMP {
                        DataType::Utf8
                    } else if let Some((_, t)) = key_types.iter().find(|(n, _)| n == f.name()) {
                        t.clone()
                    } else {
                        f.data_type().clone()
                    };
                    Field::new(f.name(), dtype, true)
                })
                .collect();
            arrow::csv::ReaderBuilder::new(Arc::new(Schema::new(fields)))
                .with_header(true)
                .with_batch_size(64 * 1024)
                .build(file)
                .map_err(|e| fail(&e))?
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| fail(&e))?
        }
        _ => {
            return Err(Error::input(
                path,
                format!("unknown spine file type `.{ext}` (expected .parquet or .csv)"),
            ));
        }
    };
    let schema = match batches.first() {
        Some(b) => b.schema(),
        None => return Err(Error::input(path, "the spine has no rows")),
    };
    Ok(concat_batches(&schema, &batches)?)
}

/// The spine's points in time, as UTC microseconds (exact: zone-less or sub-microsecond
/// times are refused, as at ingest).
fn spine_times(path: &Path, spine: &RecordBatch) -> Result<Vec<i64>> {
    let Some(column) = spine.column_by_name(SPINE_TIMESTAMP) else {
        return Err(Error::input(
            path,
            format!("missing column `{SPINE_TIMESTAMP}` (the point in time of each spine row)"),
        ));
    };
    let ts = to_utc_micros(column).map_err(|(row, msg)| match row {
        Some(r) => Error::input(path, format!("row {}: column `{SPINE_TIMESTAMP}`: {msg}", r + 1)),
        None => Error::input(path, format!("column `{SPINE_TIMESTAMP}` {msg}")),
    })?;
    let ts = ts.as_primitive::<TimestampMicrosecondType>();
    if let Some(i) = (0..ts.len()).find(|&i| ts.is_null(i)) {
        return Err(Error::input(path, format!("row {}: column `{SPINE_TIMESTAMP}` is empty", i + 1)));
    }
    Ok(ts.values().to_vec())
}

/// Options of a historical retrieval.
#[derive(Debug, Clone, Copy, Default)]
pub struct HistoricalOptions {
    /// Only rows created by the spine time are candidates (SPEC §3.5).
    pub created_cutoff: bool,
    /// After the features, one `view__event_timestamp` column per view: the event time
    /// of the row each spine row joined (null when none). `verify` uses it to tell a
    /// stale row from no row.
    pub event_times: bool,
}

/// The point-in-time join of `spine` (read from `spine_path`, named in errors) with
/// the requested views, as one batch: the spine's columns, then one `view__feature`
/// column per requested feature, in request order.
///
/// # Errors
/// A spine without a needed key or time, an unreadable table, or a kernel failure.
pub async fn historical(
    config: &Config,
    defs: &Definitions,
    spine_path: &Path,
    spine: &RecordBatch,
    requests: &[ViewRequest<'_>],
    options: HistoricalOptions,
    kernel: &dyn AsOfKernel,
    progress: Progress<'_>,
) -> Result<RecordBatch> {
    historical_at(config, defs, spine_path, spine, requests, options, &BTreeMap::new(), kernel, progress).await
}

/// [`historical`] reading each view's table at the Delta version `versions` names for
/// it (time travel; the latest version for views it does not name), so a training set
/// can be rebuilt exactly after more data arrived.
///
/// # Errors
/// As [`historical`], and a version the table does not have.
#[allow(clippy::too_many_arguments)]
pub async fn historical_at(
    config: &Config,
    defs: &Definitions,
    spine_path: &Path,
    spine: &RecordBatch,
    requests: &[ViewRequest<'_>],
    options: HistoricalOptions,
    versions: &BTreeMap<String, u64>,
    kernel: &dyn AsOfKernel,
    progress: Progress<'_>,
) -> Result<RecordBatch> {
    let times = spine_times(spine_path, spine)?;
    let (min_t, max_t) = match (times.iter().min(), times.iter().max()) {
        (Some(&lo), Some(&hi)) => (lo, hi),
        _ => (0, 0),
    };
    let n_features: usize = requests.iter().map(|r| r.features.len()).sum();
    let mut joined: Vec<Option<(Field, ArrayRef)>> = vec![None; n_features];
    let mut event_times: Vec<(Field, ArrayRef)> = Vec::new();
    for request in requests {
        let view = request.view;
        if options.created_cutoff && view.source.created_timestamp_field.is_none() {
            return Err(Error::Request(format!(
                "--created-cutoff needs a created timestamp, and feature view `{}` has no created_timestamp_field",
                view.name
            )));
        }
        // The spine's keys for this view, in the key types.
        let mut spine_keys = Vec::new();
        for key in defs.join_keys(view) {
            let Some(column) = spine.column_by_name(&key.name) else {
                return Err(Error::input(
                    spine_path,
                    format!("missing join key column `{}` needed by feature view `{}`", key.name, view.name),
                ));
            };
            let conformed = widen(column, &key_type(key.dtype)).map_err(|m| {
                Error::input(spine_path, format!("join key column `{}`: {m}", key.name))
            })?;
            spine_keys.push(conformed);
        }
        let index = EntityIndex::build(&spine_keys)?;
        // A TTL beyond what microseconds in an i64 can hold (292,000 years) is unbounded.
        let ttl_us = view.ttl_us();
        let lo = ttl_us.map(|ttl| min_t.saturating_sub(ttl));
        let location = config.view_table(view);
        let phase = std::time::Instant::now();
        let scan = scan_view_at(
            &location.to_string(),
            &location,
            defs,
            view,
            &request.features,
            lo,
            max_t,
            None,
            versions.get(&view.name).copied(),
        )
        .await?;
        progress(&format!("scanned {}", view.name), scan.rows as u64);
        tracing::debug!(view = %view.name, rows = scan.rows, secs = phase.elapsed().as_secs_f64(), "scanned");
        let phase = std::time::Instant::now();

        // Kernel input: entity ids and times of every scanned row, filled in parallel.
        let has_created = view.source.created_timestamp_field.is_some();
        let columns = KernelColumns::fill(&scan, &index, defs, view, has_created)?;
        let (feature_entity, feature_ts, feature_created, feature_seq) = (
            columns.entity,
            columns.ts,
            has_created.then_some(columns.created),
            columns.seq,
        );
        // Keep only the feature columns of the scan while the kernel runs (the key and
        // time arrays are dropped here).
        let Scan {
            batches,
            rows,
            feature_columns,
            ..
        } = scan;
        let present: Vec<usize> = feature_columns.iter().flatten().copied().collect();
        let mut next = 0;
        let scan = Scan {
            batches: batches
                .into_iter()
                .map(|b| b.project(&present))
                .collect::<std::result::Result<_, _>>()?,
            rows,
            version: None,
            feature_columns: feature_columns
                .iter()
                .map(|c| {
                    c.map(|_| {
                        next += 1;
                        next - 1
                    })
                })
                .collect(),
        };
        let input = AsOfInput {
            spine_entity: &index.spine_ids,
            spine_ts: &times,
            feature_entity: &feature_entity,
            feature_ts: &feature_ts,
            feature_created: feature_created.as_deref(),
            feature_seq: &feature_seq,
            n_entities: index.n_entities,
            ttl_us,
            created_cutoff: options.created_cutoff,
        };
        tracing::debug!(view = %view.name, secs = phase.elapsed().as_secs_f64(), "kernel input built");
        let phase = std::time::Instant::now();
        let winners = kernel.join(&input)?;
        tracing::debug!(view = %view.name, engine = kernel.name(), secs = phase.elapsed().as_secs_f64(), "kernel");
        let phase = std::time::Instant::now();
        if options.event_times {
            let ts: arrow::array::TimestampMicrosecondArray =
                winners.iter().map(|&w| (w != NO_ROW).then(|| feature_ts[w as usize])).collect();
            event_times.push((
                Field::new(format!("{}__event_timestamp", view.name), crate::schema::timestamp_type(), true),
                Arc::new(ts.with_timezone("UTC")),
            ));
        }
        drop((feature_entity, feature_ts, feature_created, feature_seq));
        progress(&format!("joined {}", view.name), winners.len() as u64);

        // Gather each feature column once.
        let mut starts = Vec::with_capacity(scan.batches.len());
        let mut total = 0usize;
        for b in &scan.batches {
            starts.push(total);
            total += b.num_rows();
        }
        let null_source = scan.batches.len();
        let picks: Vec<(usize, usize)> = winners
            .iter()
            .map(|&w| {
                if w == NO_ROW {
                    (null_source, 0)
                } else {
                    let w = w as usize;
                    let b = starts.partition_point(|&s| s <= w) - 1;
                    (b, w - starts[b])
                }
            })
            .collect();
        for (k, feature) in request.features.iter().enumerate() {
            let dtype = arrow_type(view.feature(feature).expect("resolved").dtype);
            let column = match scan.feature_columns[k] {
                // No such column yet, or no rows in range: all null.
                _ if scan.batches.is_empty() => new_null_array(&dtype, spine.num_rows()),
                None => new_null_array(&dtype, spine.num_rows()),
                Some(i) => {
                    let source_type = scan.batches[0].column(i).data_type().clone();
                    let gathered = match device_gather(kernel, &scan.batches, i, &source_type, &winners)? {
                        Some(on_device) => on_device,
                        None => {
                            let null_row = new_null_array(&source_type, 1);
                            let mut arrays: Vec<&dyn Array> = scan.batches.iter().map(|b| b.column(i).as_ref()).collect();
                            arrays.push(null_row.as_ref());
                            interleave(&arrays, &picks)?
                        }
                    };
                    widen(&gathered, &dtype).map_err(Error::Request)?
                }
            };
            let field = Field::new(format!("{}__{}", view.name, feature), dtype, true);
            joined[request.positions[k]] = Some((field, column));
        }
        tracing::debug!(view = %view.name, secs = phase.elapsed().as_secs_f64(), "gathered");
    }
    let mut fields: Vec<Field> = spine.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns: Vec<ArrayRef> = spine.columns().to_vec();
    for (field, column) in joined.into_iter().flatten().chain(event_times) {
        fields.push(field);
        columns.push(column);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// Gathers one fixed-width feature column (8- or 4-byte values) by the winners on the
/// engine's device, when it has one ([`AsOfKernel::gather`]); `None` leaves the gather to
/// the host. The result equals the host gather value for value and null for null.
fn device_gather(
    kernel: &dyn AsOfKernel,
    batches: &[RecordBatch],
    column: usize,
    source_type: &DataType,
    winners: &[u32],
) -> Result<Option<ArrayRef>> {
    use arrow::array::{ArrayData, make_array};
    use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
    use quiver_gpu_join::{FixedColumn, Gathered};
    let wide = match source_type {
        DataType::Int64 | DataType::Float64 | DataType::Timestamp(_, _) | DataType::Date64 => true,
        DataType::Int32 | DataType::Float32 | DataType::Date32 => false,
        _ => return Ok(None),
    };
    let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(column).as_ref()).collect();
    let whole = arrow::compute::concat(&arrays)?;
    let data = whole.to_data();
    let (offset, len) = (data.offset(), data.len());
    let valid: Option<Vec<u8>> = whole.nulls().map(|n| (0..len).map(|r| u8::from(n.is_valid(r))).collect());
    let buffer = data.buffers()[0].clone();
    let wide_values;
    let narrow_values;
    let fixed = if wide {
        wide_values = ScalarBuffer::<u64>::new(buffer, offset, len);
        FixedColumn::U64 { values: &wide_values, valid: valid.as_deref() }
    } else {
        narrow_values = ScalarBuffer::<u32>::new(buffer, offset, len);
        FixedColumn::U32 { values: &narrow_values, valid: valid.as_deref() }
    };
    let Some(result) = kernel.gather(&[fixed], winners) else {
        return Ok(None);
    };
    let gathered = result?.pop().ok_or_else(|| Error::Request("the engine's gather returned no column".into()))?;
    let (values, ok) = match gathered {
        Gathered::U64(v, ok) => (Buffer::from_vec(v), ok),
        Gathered::U32(v, ok) => (Buffer::from_vec(v), ok),
    };
    let nulls = NullBuffer::from(ok.iter().map(|&b| b != 0).collect::<Vec<bool>>());
    let out = ArrayData::builder(source_type.clone())
        .len(winners.len())
        .add_buffer(values)
        .nulls(Some(nulls))
        .build()?;
    Ok(Some(make_array(out)))
}

/// The kernel's per-row arrays for one view's scanned rows.
struct KernelColumns {
    entity: Vec<u32>,
    ts: Vec<i64>,
    created: Vec<i64>,
    seq: Vec<i64>,
}

impl KernelColumns {
    /// Flattens the scan into entity ids, times and seqs, splitting the batches over
    /// the cores (the hash lookups dominate).
    fn fill(
        scan: &Scan,
        index: &EntityIndex,
        defs: &Definitions,
        view: &FeatureView,
        has_created: bool,
    ) -> Result<KernelColumns> {
        let n = scan.rows;
        let mut out = KernelColumns {
            entity: vec![0; n],
            ts: vec![0; n],
            created: if has_created { vec![0; n] } else { Vec::new() },
            seq: vec![0; n],
        };
        let keys = defs.join_keys(view);
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let per_thread = n.div_ceil(threads).max(1);
        // Batch ranges of about `per_thread` rows each.
        let mut ranges = Vec::new();
        let (mut first, mut rows) = (0, 0);
        for (b, batch) in scan.batches.iter().enumerate() {
            rows += batch.num_rows();
            if rows >= per_thread || b + 1 == scan.batches.len() {
                ranges.push((first, b + 1, rows));
                first = b + 1;
                rows = 0;
            }
        }
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let mut entity: &mut [u32] = &mut out.entity;
            let mut ts: &mut [i64] = &mut out.ts;
            let mut created: &mut [i64] = &mut out.created;
            let mut seq: &mut [i64] = &mut out.seq;
            let mut handles = Vec::new();
            for &(b0, b1, len) in &ranges {
                let (e, rest) = std::mem::take(&mut entity).split_at_mut(len);
                entity = rest;
                let (t, rest) = std::mem::take(&mut ts).split_at_mut(len);
                ts = rest;
                let (c, rest) = if has_created {
                    std::mem::take(&mut created).split_at_mut(len)
                } else {
                    (&mut [][..], &mut [][..])
                };
                created = rest;
                let (q, rest) = std::mem::take(&mut seq).split_at_mut(len);
                seq = rest;
                let (batches, keys) = (&scan.batches[b0..b1], &keys);
                handles.push(s.spawn(move || -> Result<()> {
                    let mut at = 0;
                    for batch in batches {
                        let m = batch.num_rows();
                        let key_arrays: Vec<ArrayRef> = keys
                            .iter()
                            .enumerate()
                            .map(|(i, k)| widen(batch.column(i), &key_type(k.dtype)).map_err(Error::Request))
                            .collect::<Result<_>>()?;
                        index.lookup(&key_arrays, &mut e[at..at + m])?;
                        let micros = |i: usize| -> Result<ArrayRef> {
                            Ok(arrow::compute::cast(batch.column(i), &timestamp_type())?)
                        };
                        let mut next = keys.len();
                        t[at..at + m].copy_from_slice(micros(next)?.as_primitive::<TimestampMicrosecondType>().values());
                        next += 1;
                        if has_created {
                            c[at..at + m].copy_from_slice(micros(next)?.as_primitive::<TimestampMicrosecondType>().values());
                            next += 1;
                        }
                        q[at..at + m].copy_from_slice(batch.column(next).as_primitive::<Int64Type>().values());
                        at += m;
                    }
                    Ok(())
                }));
            }
            handles.into_iter().map(|h| h.join().expect("no panic in the flatten")).collect()
        });
        results.into_iter().collect::<Result<()>>()?;
        Ok(out)
    }
}

/// The scanned rows of one view: keys, event time, created time (if any), seq, then
/// the requested features that the table has.
struct Scan {
    batches: Vec<RecordBatch>,
    rows: usize,
    /// The table version read (`None`: no table).
    version: Option<u64>,
    /// For each requested feature, its column in `batches`, or `None` when the table
    /// has no such column yet (a feature added after the data was written).
    feature_columns: Vec<Option<usize>>,
}

fn ts_literal(v: i64) -> Expr {
    lit(ScalarValue::TimestampMicrosecond(Some(v), Some("UTC".into())))
}

#[allow(clippy::too_many_arguments)]
async fn scan_view_at(
    name: &str,
    location: &quiver_sdk::StoreLocation,
    defs: &Definitions,
    view: &FeatureView,
    features: &[&str],
    lo: Option<i64>,
    hi: i64,
    extra: Option<Expr>,
    version: Option<u64>,
) -> Result<Scan> {
    let Some(mut table) = open_table(location).await? else {
        return Ok(Scan {
            batches: Vec::new(),
            rows: 0,
            version: None,
            feature_columns: vec![None; features.len()],
        });
    };
    if let Some(v) = version {
        if table.version() != Some(v) {
            table.load_version(v).await.map_err(|e| Error::delta(name, e))?;
        }
    }
    let query = |source| Error::Query {
        table: name.to_string(),
        source,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut config = SessionConfig::new()
        .with_target_partitions(threads)
        .with_batch_size(64 * 1024);
    config
        .options_mut()
        .execution
        .parquet
        .schema_force_view_types = false;
    let ctx = SessionContext::new_with_config(config);
    table
        .update_datafusion_session(&ctx.state())
        .map_err(|e| Error::delta(name, e))?;
    let provider = table.table_provider().await.map_err(query)?;
    let df = ctx.read_table(provider).map_err(query)?;
    let available: Vec<String> = df.schema().fields().iter().map(|f| f.name().clone()).collect();

    let mut select: Vec<String> = defs.join_keys(view).into_iter().map(|k| k.name).collect();
    let ts = view.source.timestamp_field.clone();
    select.push(ts.clone());
    if let Some(created) = &view.source.created_timestamp_field {
        select.push(created.clone());
    }
    select.push(SEQ_COLUMN.to_string());
    for column in &select {
        if !available.contains(column) {
            return Err(Error::Request(format!(
                "delta table {name} has no column `{column}` (it holds: {})",
                available.join(", ")
            )));
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
    let mut filter = ident(&ts).lt_eq(ts_literal(hi));
    if let Some(lo) = lo {
        filter = filter.and(ident(&ts).gt_eq(ts_literal(lo)));
    }
    if let Some(extra) = extra {
        filter = filter.and(extra);
    }
    let version = table.version();
    let df = df
        .filter(filter)
        .map_err(query)?
        .select(select.iter().map(ident).collect::<Vec<_>>())
        .map_err(query)?;
    let batches: Vec<RecordBatch> = df
        .collect()
        .await
        .map_err(query)?
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .collect();
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    Ok(Scan {
        batches,
        rows,
        version,
        feature_columns,
    })
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
    Ok(scan_view_at(&location.to_string(), &location, defs, view, &features, None, i64::MAX, None, None).await?.batches)
}

/// The latest Delta version of each view's table (`None`: no table yet).
///
/// # Errors
/// [`Error::Delta`] when a table cannot be read.
pub async fn table_versions(config: &Config, views: &[&FeatureView]) -> Result<BTreeMap<String, Option<u64>>> {
    let mut out = BTreeMap::new();
    for view in views {
        let table = open_table(&config.view_table(view)).await?;
        out.insert(view.name.clone(), table.and_then(|t| t.version()));
    }
    Ok(out)
}

/// Writes a batch to Parquet atomically (a temp file renamed into place), so a failed
/// write leaves no partial file.
///
/// # Errors
/// [`Error::Output`] naming the file.
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let fail = |m: String| Error::Output {
        file: path.to_path_buf(),
        message: m,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::result::Result<(), String> {
        let file = File::create(&tmp).map_err(|e| e.to_string())?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(|e| e.to_string())?;
        let step = 128 * 1024;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = step.min(batch.num_rows() - offset);
            writer.write(&batch.slice(offset, len)).map_err(|e| e.to_string())?;
            offset += len;
        }
        writer.close().map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())
    };
    write().map_err(|m| {
        let _ = std::fs::remove_file(&tmp);
        fail(m)
    })
}

/// Which rows [`latest_per_entity`] considers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Rows with event time in `[start, end]` (UTC microseconds).
    Range { start: i64, end: i64 },
    /// Rows with event time `<= end` that were not considered by an earlier window
    /// which read table version `version` up to `prev_end`: rows ingested after that
    /// version (whatever their event time: late data), or with event time after
    /// `prev_end`.
    Since { version: u64, prev_end: i64, end: i64 },
}

/// The latest rows of a view, and the table version they were read from (`None`
/// when there is no table).
#[derive(Debug, Clone)]
pub struct Latest {
    pub batch: Option<RecordBatch>,
    pub version: Option<u64>,
}

/// The latest row of every entity of a view among the rows of `window`: the SPEC §3
/// winner — greatest event time, then created time, then ingestion order. One batch
/// with the view's columns (keys, event time, created time if any, then every feature;
/// a feature the table lacks is all null), or none when the window holds no rows. This
/// is what materialization loads online.
///
/// # Errors
/// An unreadable table.
pub async fn latest_per_entity(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    window: Window,
) -> Result<Latest> {
    let location = config.view_table(view);
    let features: Vec<&str> = view.features.iter().map(|f| f.name.as_str()).collect();
    let (lo, hi, extra) = match window {
        Window::Range { start, end } => (Some(start), end, None),
        Window::Since { version, prev_end, end } => {
            let first_new = i64::try_from(version + 1).unwrap_or(i64::MAX >> 32) << 32;
            let ts = ident(&view.source.timestamp_field);
            let extra = ident(SEQ_COLUMN).gt_eq(lit(first_new)).or(ts.gt(ts_literal(prev_end)));
            (None, end, Some(extra))
        }
    };
    let mut scan = scan_view_at(&location.to_string(), &location, defs, view, &features, lo, hi, extra, None).await?;
    let version = scan.version;
    if scan.batches.is_empty() {
        return Ok(Latest { batch: None, version });
    }
    let schema = scan.batches[0].schema();
    let all = concat_batches(&schema, &std::mem::take(&mut scan.batches))?;
    let keys = defs.join_keys(view);
    let key_arrays: Vec<ArrayRef> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| widen(all.column(i), &key_type(k.dtype)).map_err(Error::Request))
        .collect::<Result<_>>()?;
    let index = EntityIndex::build(&key_arrays)?;
    let micros = |i: usize| -> Result<Vec<i64>> {
        let a = arrow::compute::cast(all.column(i), &timestamp_type())?;
        Ok(a.as_primitive::<TimestampMicrosecondType>().values().to_vec())
    };
    let n_keys = keys.len();
    let ts = micros(n_keys)?;
    let has_created = view.source.created_timestamp_field.is_some();
    let created = if has_created { Some(micros(n_keys + 1)?) } else { None };
    let seq_col = n_keys + 1 + usize::from(has_created);
    let seq = all.column(seq_col).as_primitive::<Int64Type>().values().to_vec();
    let order = |r: usize| (ts[r], created.as_ref().map_or(0, |c| c[r]), seq[r]);
    let mut best: Vec<Option<usize>> = vec![None; index.n_entities as usize];
    for (r, &e) in index.spine_ids.iter().enumerate() {
        if e == quiver_gpu_join::NO_ENTITY {
            continue;
        }
        let slot = &mut best[e as usize];
        if slot.is_none_or(|b| order(r) >= order(b)) {
            *slot = Some(r);
        }
    }
    let winners = arrow::array::UInt32Array::from(best.into_iter().flatten().map(|r| r as u32).collect::<Vec<_>>());
    // The view's columns: keys and times as scanned, features by name (null if absent).
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        fields.push(Field::new(&key.name, key_type(key.dtype), false));
        columns.push(arrow::compute::take(&key_arrays[i], &winners, None)?);
    }
    for i in n_keys..seq_col {
        fields.push(Field::new(schema.field(i).name(), timestamp_type(), false));
        let micros = arrow::compute::cast(all.column(i), &timestamp_type())?;
        columns.push(arrow::compute::take(&micros, &winners, None)?);
    }
    for (k, feature) in view.features.iter().enumerate() {
        let dtype = arrow_type(feature.dtype);
        let column = match scan.feature_columns[k] {
            Some(i) => widen(&arrow::compute::take(all.column(i), &winners, None)?, &dtype).map_err(Error::Request)?,
            None => new_null_array(&dtype, winners.len()),
        };
        fields.push(Field::new(&feature.name, dtype, true));
        columns.push(column);
    }
    Ok(Latest {
        batch: Some(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?),
        version,
    })
}
