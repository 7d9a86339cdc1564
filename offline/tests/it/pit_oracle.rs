//! Differential test of the offline store: random feature rows ingested through every
//! input format (several files, several Delta versions), then `historical`, compared
//! cell by cell with a naive row-by-row oracle written here from the rule as docs/offline.md states it.
//!
//! The data has duplicate event times, equal created times, null features, unsorted
//! rows, spine rows exactly at a feature time and exactly at `t - ttl`, entities missing
//! on either side, a composite key, a string key, and a view without created times
//! (where only ingestion order breaks ties).

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Builder, Float64Array, Int32Array, Int64Array, ListBuilder, RecordBatch, StringArray,
    TimestampMillisecondArray,
};
use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type};
use quiver_gpu_join::CpuKernel;
use quiver_offline::historical::{HistoricalOptions, SpineRows, historical, join, resolve};
use quiver_offline::ingest::ingest;
use quiver_sdk::yaml::parse_definitions;
use quiver_sdk::{Config, Definitions, FeatureRef};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common::{opt, ts_array, write_parquet};

const DEFS: &str = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
feature_views:
  - name: dh
    entities: [driver]
    ttl: 50s
    source: {created_timestamp_field: created_timestamp}
    features:
      - {name: f_f64, dtype: float64}
      - {name: f_i64, dtype: int64}
      - {name: f_str, dtype: string}
  - name: cp
    entities: [customer]
    features:
      - {name: v, dtype: float64}
      - {name: emb, dtype: list<float32>}
  - name: pair
    entities: [driver, customer]
    ttl: 30s
    source: {timestamp_field: ts, created_timestamp_field: created}
    features:
      - {name: n, dtype: int32}
      - {name: flag, dtype: bool}
"#;

const T0: i64 = 1_700_000_000_000_000; // microseconds
const SEC: i64 = 1_000_000;

/// One feature row as the oracle sees it.
#[derive(Debug, Clone)]
struct Row {
    driver: Option<i64>,
    customer: Option<String>,
    ts: i64,
    created: i64,
    /// (ingest number, row in that ingest): the ingestion order.
    order: (usize, usize),
    values: Vec<Value>,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    F64(Option<f64>),
    I64(Option<i64>),
    I32(Option<i32>),
    Str(Option<String>),
    Bool(Option<bool>),
    Emb(Option<Vec<f32>>),
}

fn coarse_time(rng: &mut StdRng) -> i64 {
    T0 + rng.random_range(0..30) * 10 * SEC
}

fn driver(rng: &mut StdRng) -> i64 {
    1000 + rng.random_range(0..12)
}

fn customer(rng: &mut StdRng) -> String {
    format!("c{}", rng.random_range(0..10))
}

fn gen_rows(rng: &mut StdRng, view: &str, ingest_no: usize, n: usize) -> Vec<Row> {
    (0..n)
        .map(|i| {
            let ts = coarse_time(rng);
            let created = ts + rng.random_range(0..3) * 10 * SEC;
            let (d, c, values) = match view {
                "dh" => (
                    Some(driver(rng)),
                    None,
                    vec![
                        Value::F64(opt(rng.random_bool(0.1), rng.random_range(0.0..1.0))),
                        Value::I64(opt(rng.random_bool(0.1), rng.random_range(-5..1000))),
                        Value::Str(opt(rng.random_bool(0.1), format!("s{}", rng.random_range(0..100)))),
                    ],
                ),
                "cp" => (
                    None,
                    Some(customer(rng)),
                    vec![
                        Value::F64(opt(rng.random_bool(0.1), rng.random_range(0.0..1.0))),
                        Value::Emb(opt(rng.random_bool(0.1), (0..3).map(|_| rng.random_range(-1.0..1.0f32)).collect())),
                    ],
                ),
                _ => (
                    Some(driver(rng)),
                    Some(customer(rng)),
                    vec![
                        Value::I32(opt(rng.random_bool(0.1), rng.random_range(0..50))),
                        Value::Bool(opt(rng.random_bool(0.1), rng.random_bool(0.5))),
                    ],
                ),
            };
            Row { driver: d, customer: c, ts, created, order: (ingest_no, i), values }
        })
        .collect()
}

/// The rows as a batch with the view's columns (and some deliberate type variety:
/// `int32` driver ids and millisecond timestamps in odd ingests, to be widened).
fn to_batch(view: &str, rows: &[Row], ingest_no: usize) -> RecordBatch {
    let mut cols: Vec<(&str, ArrayRef)> = Vec::new();
    let (ts_name, created_name) = if view == "pair" { ("ts", "created") } else { ("event_timestamp", "created_timestamp") };
    if view != "cp" {
        let ids: Vec<i64> = rows.iter().map(|r| r.driver.unwrap()).collect();
        let arr: ArrayRef = if ingest_no % 2 == 1 {
            Arc::new(Int32Array::from(ids.iter().map(|&v| v as i32).collect::<Vec<_>>()))
        } else {
            Arc::new(Int64Array::from(ids))
        };
        cols.push(("driver_id", arr));
    }
    if view != "dh" {
        cols.push(("customer_id", Arc::new(StringArray::from(rows.iter().map(|r| r.customer.clone().unwrap()).collect::<Vec<_>>()))));
    }
    let ts: Vec<i64> = rows.iter().map(|r| r.ts).collect();
    if ingest_no % 2 == 1 {
        let ms: Vec<i64> = ts.iter().map(|t| t / 1000).collect();
        cols.push((ts_name, Arc::new(TimestampMillisecondArray::from(ms).with_timezone("+02:00"))));
    } else {
        cols.push((ts_name, ts_array(ts.iter().copied())));
    }
    if view != "cp" {
        cols.push((created_name, ts_array(rows.iter().map(|r| r.created))));
    }
    let names: &[&str] = match view {
        "dh" => &["f_f64", "f_i64", "f_str"],
        "cp" => &["v", "emb"],
        _ => &["n", "flag"],
    };
    for (k, name) in names.iter().enumerate() {
        let arr: ArrayRef = match &rows[0].values[k] {
            Value::F64(_) => Arc::new(Float64Array::from(
                rows.iter()
                    .map(|r| match &r.values[k] {
                        Value::F64(v) => *v,
                        _ => unreachable!(),
                    })
                    .collect::<Vec<_>>(),
            )),
            Value::I64(_) => Arc::new(Int64Array::from(
                rows.iter()
                    .map(|r| match &r.values[k] {
                        Value::I64(v) => *v,
                        _ => unreachable!(),
                    })
                    .collect::<Vec<_>>(),
            )),
            Value::I32(_) => Arc::new(Int32Array::from(
                rows.iter()
                    .map(|r| match &r.values[k] {
                        Value::I32(v) => *v,
                        _ => unreachable!(),
                    })
                    .collect::<Vec<_>>(),
            )),
            Value::Str(_) => Arc::new(StringArray::from(
                rows.iter()
                    .map(|r| match &r.values[k] {
                        Value::Str(v) => v.clone(),
                        _ => unreachable!(),
                    })
                    .collect::<Vec<_>>(),
            )),
            Value::Bool(_) => Arc::new(BooleanArray::from(
                rows.iter()
                    .map(|r| match &r.values[k] {
                        Value::Bool(v) => *v,
                        _ => unreachable!(),
                    })
                    .collect::<Vec<_>>(),
            )),
            Value::Emb(_) => {
                let mut b = ListBuilder::new(Float32Builder::new());
                for r in rows {
                    match &r.values[k] {
                        Value::Emb(Some(v)) => {
                            b.values().append_slice(v);
                            b.append(true);
                        }
                        _ => b.append(false),
                    }
                }
                Arc::new(b.finish())
            }
        };
        cols.push((name, arr));
    }
    RecordBatch::try_from_iter(cols).unwrap()
}

fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).unwrap().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Writes the rows as JSON lines by hand (times as RFC 3339 text).
fn write_jsonl(path: &Path, view: &str, rows: &[Row]) {
    let mut out = String::new();
    for r in rows {
        let mut obj = serde_json::Map::new();
        if let Some(d) = r.driver {
            obj.insert("driver_id".into(), d.into());
        }
        if let Some(c) = &r.customer {
            obj.insert("customer_id".into(), c.clone().into());
        }
        let (ts_name, created_name) = if view == "pair" { ("ts", "created") } else { ("event_timestamp", "created_timestamp") };
        obj.insert(ts_name.into(), rfc3339(r.ts).into());
        if view != "cp" {
            obj.insert(created_name.into(), rfc3339(r.created).into());
        }
        let names: &[&str] = match view {
            "dh" => &["f_f64", "f_i64", "f_str"],
            "cp" => &["v", "emb"],
            _ => &["n", "flag"],
        };
        for (k, name) in names.iter().enumerate() {
            let v: serde_json::Value = match &r.values[k] {
                Value::F64(v) => serde_json::json!(v),
                Value::I64(v) => serde_json::json!(v),
                Value::I32(v) => serde_json::json!(v),
                Value::Str(v) => serde_json::json!(v),
                Value::Bool(v) => serde_json::json!(v),
                Value::Emb(v) => serde_json::json!(v),
            };
            obj.insert(name.to_string(), v);
        }
        out.push_str(&serde_json::Value::Object(obj).to_string());
        out.push('\n');
    }
    std::fs::write(path, out).unwrap();
}

/// Writes the rows as CSV by hand (no list columns: only for dh and pair).
fn write_csv(path: &Path, view: &str, rows: &[Row]) {
    let mut out = String::new();
    let header = if view == "dh" {
        "f_str,driver_id,event_timestamp,created_timestamp,f_f64,f_i64"
    } else {
        "driver_id,customer_id,ts,created,n,flag"
    };
    out.push_str(header);
    out.push('\n');
    let s = |v: Option<String>| v.unwrap_or_default();
    for r in rows {
        let line = if view == "dh" {
            let (Value::F64(f), Value::I64(i), Value::Str(st)) = (&r.values[0], &r.values[1], &r.values[2]) else { unreachable!() };
            format!(
                "{},{},{},{},{},{}",
                s(st.clone()),
                r.driver.unwrap(),
                rfc3339(r.ts),
                rfc3339(r.created),
                s(f.map(|v| format!("{v:?}"))),
                s(i.map(|v| v.to_string()))
            )
        } else {
            let (Value::I32(n), Value::Bool(b)) = (&r.values[0], &r.values[1]) else { unreachable!() };
            format!(
                "{},{},{},{},{},{}",
                r.driver.unwrap(),
                r.customer.clone().unwrap(),
                rfc3339(r.ts),
                rfc3339(r.created),
                s(n.map(|v| v.to_string())),
                s(b.map(|v| v.to_string()))
            )
        };
        out.push_str(&line);
        out.push('\n');
    }
    std::fs::write(path, out).unwrap();
}

/// docs/offline.md for one spine row and one view, by looking at every row.
fn oracle<'a>(
    rows: &'a [Row],
    view: &str,
    ttl: Option<i64>,
    has_created: bool,
    (d, c, t): (i64, &str, i64),
    cutoff: bool,
) -> Option<&'a Row> {
    rows.iter()
        .filter(|r| match view {
            "dh" => r.driver == Some(d),
            "cp" => r.customer.as_deref() == Some(c),
            _ => r.driver == Some(d) && r.customer.as_deref() == Some(c),
        })
        .filter(|r| r.ts <= t && ttl.is_none_or(|ttl| r.ts >= t - ttl))
        // A view without created times counts each row as created at its event time.
        .filter(|r| !cutoff || (if has_created { r.created } else { r.ts }) <= t)
        .max_by_key(|r| (r.ts, if has_created { r.created } else { 0 }, r.order))
}

fn cell(array: &ArrayRef, i: usize, like: &Value) -> Value {
    let valid = array.is_valid(i);
    match like {
        Value::F64(_) => Value::F64(valid.then(|| array.as_primitive::<Float64Type>().value(i))),
        Value::I64(_) => Value::I64(valid.then(|| array.as_primitive::<Int64Type>().value(i))),
        Value::I32(_) => Value::I32(valid.then(|| array.as_primitive::<Int32Type>().value(i))),
        Value::Str(_) => Value::Str(valid.then(|| array.as_string::<i32>().value(i).to_string())),
        Value::Bool(_) => Value::Bool(valid.then(|| array.as_boolean().value(i))),
        Value::Emb(_) => Value::Emb(valid.then(|| array.as_list::<i32>().value(i).as_primitive::<Float32Type>().values().to_vec())),
    }
}

fn null_like(v: &Value) -> Value {
    match v {
        Value::F64(_) => Value::F64(None),
        Value::I64(_) => Value::I64(None),
        Value::I32(_) => Value::I32(None),
        Value::Str(_) => Value::Str(None),
        Value::Bool(_) => Value::Bool(None),
        Value::Emb(_) => Value::Emb(None),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn historical_matches_the_row_by_row_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    let config = Config::parse(repo, &repo.join("quiver.yaml"), "project: t\n", Vec::new()).unwrap();
    let defs: Definitions = parse_definitions(DEFS).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let noop = |_: &str, _: u64| {};

    // Three ingests per view, in different formats, each in shuffled order.
    let mut all: std::collections::HashMap<&str, Vec<Row>> = Default::default();
    for view_name in ["dh", "cp", "pair"] {
        let view = defs.feature_view(view_name).unwrap();
        for ingest_no in 0..3 {
            let n = rng.random_range(150..400);
            let mut rows = gen_rows(&mut rng, view_name, ingest_no, n);
            rows.shuffle(&mut rng);
            for (i, r) in rows.iter_mut().enumerate() {
                r.order = (ingest_no, i);
            }
            let format = match (view_name, ingest_no) {
                (_, 0) => "parquet",
                ("cp", _) => {
                    if ingest_no == 1 {
                        "jsonl"
                    } else {
                        "parquet"
                    }
                }
                (_, 1) => "csv",
                _ => "jsonl",
            };
            let path = repo.join(format!("{view_name}_{ingest_no}.{format}"));
            match format {
                "parquet" => write_parquet(&path, &to_batch(view_name, &rows, ingest_no)),
                "csv" => write_csv(&path, view_name, &rows),
                _ => write_jsonl(&path, view_name, &rows),
            }
            let report = ingest(&config.view_table(view), &defs, view, &path, i64::MAX, &noop).await.unwrap();
            assert_eq!(report.rows, rows.len(), "{}", path.display());
            all.entry(view_name).or_default().extend(rows);
        }
    }

    // The spine: exact feature times, exact TTL edges, one microsecond past them,
    // unknown entities, duplicates, in random order, with a label column.
    let mut spine: Vec<(i64, String, i64)> = Vec::new();
    for _ in 0..600 {
        let (d, c) = (driver(&mut rng) + if rng.random_bool(0.05) { 100 } else { 0 }, customer(&mut rng));
        let base = all["dh"][rng.random_range(0..all["dh"].len())].ts;
        let t = match rng.random_range(0..5) {
            0 => base,
            1 => base + 50 * SEC,
            2 => base + 50 * SEC + 1,
            3 => base + 30 * SEC,
            _ => coarse_time(&mut rng) + rng.random_range(-SEC..SEC),
        };
        spine.push((d, c, t));
    }
    for i in 0..20 {
        spine.push(spine[i].clone());
    }
    spine.shuffle(&mut rng);
    let spine_batch = RecordBatch::try_from_iter([
        ("label", Arc::new(Int64Array::from((0..spine.len() as i64).collect::<Vec<_>>())) as ArrayRef),
        ("driver_id", Arc::new(Int64Array::from(spine.iter().map(|s| s.0).collect::<Vec<_>>()))),
        ("customer_id", Arc::new(StringArray::from(spine.iter().map(|s| s.1.clone()).collect::<Vec<_>>()))),
        ("event_timestamp", ts_array(spine.iter().map(|s| s.2))),
    ])
    .unwrap();

    let refs: Vec<FeatureRef> =
        ["pair:flag", "dh:f_f64", "cp:emb", "dh:f_str", "cp:v", "dh:f_i64", "pair:n"].iter().map(|s| s.parse().unwrap()).collect();
    // `cp` has no created timestamps: under the cutoff its rows count as created at
    // their event time.
    let mut matched = 0;
    for (refs_now, cutoff) in [(refs.clone(), false), (refs.clone(), true)] {
        let requests = resolve(&defs, &refs_now).unwrap();
        let out = historical(
            &config,
            &defs,
            SpineRows { source: "spine.parquet", rows: &spine_batch },
            &requests,
            HistoricalOptions { created_cutoff: cutoff, ..Default::default() },
            &CpuKernel::new(),
            &noop,
        )
        .await
        .unwrap();
        assert_eq!(out.num_rows(), spine.len());
        // The device-gather path (as the CUDA engine takes it), with the gather run on
        // the host: the same batch, value for value and null for null.
        let via_engine_gather = historical(
            &config,
            &defs,
            SpineRows { source: "spine.parquet", rows: &spine_batch },
            &requests,
            HistoricalOptions { created_cutoff: cutoff, ..Default::default() },
            &quiver_gpu_join::cuda::HostGather(CpuKernel::new()),
            &noop,
        )
        .await
        .unwrap();
        assert_eq!(via_engine_gather, out, "engine gather vs host interleave (cutoff {cutoff})");
        // Spine columns come first, unchanged.
        for (k, name) in ["label", "driver_id", "customer_id", "event_timestamp"].iter().enumerate() {
            assert_eq!(out.schema().field(k).name(), name);
            assert_eq!(out.column(k).as_ref(), spine_batch.column(k).as_ref());
        }
        for (k, r) in refs_now.iter().enumerate() {
            let column = out.column(4 + k);
            assert_eq!(out.schema().field(4 + k).name(), &r.column_name());
            let view = defs.feature_view(&r.view).unwrap();
            let fi = view.features.iter().position(|f| f.name == r.feature).unwrap();
            let ttl = view.ttl.as_duration().map(|d| d.as_micros() as i64);
            let has_created = view.source.created_timestamp_field.is_some();
            let like = all[r.view.as_str()][0].values[fi].clone();
            for (i, (d, c, t)) in spine.iter().enumerate() {
                let want = match oracle(&all[r.view.as_str()], &r.view, ttl, has_created, (*d, c, *t), cutoff) {
                    Some(row) => {
                        matched += 1;
                        row.values[fi].clone()
                    }
                    None => null_like(&like),
                };
                assert_eq!(cell(column, i, &like), want, "cutoff {cutoff}, {r}, spine row {i} ({d}, {c}, {t})");
            }
        }
    }
    assert!(matched > 1000, "too few matches exercised: {matched}");

    // Joined once, assembled by ranges (as `export` writes shards): the same rows as the
    // whole join, whichever way each view is held. The spine as it is holds some views'
    // columns gathered; five times over, it outnumbers every scan, so each view is held
    // as its scan and winners and gathered by range.
    let requests = resolve(&defs, &refs).unwrap();
    let kernel = CpuKernel::new();
    let whole = |spine| {
        historical(
            &config,
            &defs,
            SpineRows { source: "spine.parquet", rows: spine },
            &requests,
            HistoricalOptions::default(),
            &kernel,
            &noop,
        )
    };
    let five = arrow::compute::concat_batches(&spine_batch.schema(), &vec![spine_batch.clone(); 5]).unwrap();
    for (spine, gathered) in [(&spine_batch, true), (&five, false)] {
        let expected = whole(spine).await.unwrap();
        let rows = SpineRows { source: "spine.parquet", rows: spine };
        let joined = join(&config, &defs, rows, &requests, HistoricalOptions::default(), &kernel, &noop).await.unwrap();
        assert_eq!(!joined.gathered_views().is_empty(), gathered, "{:?}", joined.gathered_views());
        let n = spine.num_rows();
        let parts: Vec<RecordBatch> = (0..n.div_ceil(97)).map(|k| joined.rows(k * 97..((k + 1) * 97).min(n)).unwrap()).collect();
        assert_eq!(arrow::compute::concat_batches(&expected.schema(), &parts).unwrap(), expected, "ranges of {n} rows");
        assert_eq!(joined.rows(0..0).unwrap().num_rows(), 0);
        assert!(joined.rows(n..n + 1).is_err(), "a range past the spine is refused");
    }
    // Five times over, the whole join is the first one's rows five times.
    let once = whole(&spine_batch).await.unwrap();
    let again = whole(&five).await.unwrap();
    assert_eq!(again, arrow::compute::concat_batches(&once.schema(), &vec![once.clone(); 5]).unwrap());
}
