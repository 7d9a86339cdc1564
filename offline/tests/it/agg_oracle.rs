//! Differential test of windowed aggregations offline (docs/aggregations.md): random events in two
//! ingests (the second with late events and exact duplicates), then `historical`,
//! compared cell by cell with a naive oracle written here from the rule as docs/aggregations.md states it: for each
//! spine row, look at every event.
//!
//! The events sit on a one-minute grid, so many share a time and many fall exactly on
//! hop boundaries and window edges; the spine has rows exactly at events, exactly at
//! `event + window` (the edge), one microsecond past, before the first event and after
//! the last. Every function, over int32, int64, float32, float64 and string columns
//! with nulls; an int key with created times (run with and without the cutoff) and a
//! string key without; sums that overflow to infinity.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type};
use quiver_gpu_join::CpuKernel;
use quiver_offline::historical::{HistoricalOptions, SpineRows, historical, resolve};
use quiver_offline::ingest::ingest;
use quiver_sdk::yaml::parse_definitions;
use quiver_sdk::{Config, Definitions, FeatureRef};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common::{opt, ts_array, write_parquet};

const DEFS: &str = r#"
entities:
  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}
  - {name: user, join_keys: [{name: user, dtype: string}]}
feature_views:
  - name: rides
    entities: [rider]
    source: {created_timestamp_field: created_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: minutes, dtype: int64}
      - {name: city, dtype: string}
      - {name: m32, dtype: int32}
      - {name: f32, dtype: float32}
    aggregations:
      - {name: fare_sum_1h, function: sum, column: fare, window: 1h}
      - {name: fare_avg_30m, function: avg, column: fare, window: 30m, hop: 10m}
      - {name: fare_std_2h, function: stddev, column: fare, window: 2h, hop: 1h}
      - {name: minutes_sum, function: sum, column: minutes, window: 1h, hop: 15m}
      - {name: minutes_min, function: min, column: minutes, window: 30m, hop: 10m}
      - {name: minutes_max, function: max, column: minutes, window: 1d}
      - {name: minutes_std, function: stddev, column: minutes, window: 3h}
      - {name: n_7d, function: count, column: city, window: 7d}
      - {name: last_city, function: last, column: city, window: 2h}
      - {name: cities, function: last_k, k: 3, column: city, window: 1d}
      - {name: m32_max, function: max, column: m32, window: 1h}
      - {name: m32_sum, function: sum, column: m32, window: 1h}
      - {name: m32_avg, function: avg, column: m32, window: 1h}
      - {name: m32_last_k, function: last_k, k: 2, column: m32, window: 1h}
      - {name: f32_min, function: min, column: f32, window: 1h}
      - {name: f32_sum, function: sum, column: f32, window: 1h}
      - {name: f32_last_k, function: last_k, k: 4, column: f32, window: 2h}
      - {name: fare_last_k, function: last_k, k: 2, column: fare, window: 30m}
      - {name: fare_last, function: last, column: fare, window: 30m, hop: 30m}
      - {name: f32_last, function: last, column: f32, window: 1h}
  - name: tags
    entities: [user]
    features:
      - {name: score, dtype: float64}
      - {name: label, dtype: string}
    aggregations:
      - {name: labels_30m, function: count, column: label, window: 30m, hop: 5m}
      - {name: last_labels, function: last_k, k: 2, column: label, window: 1h}
      - {name: score_sum, function: sum, column: score, window: 1h}
      - {name: score_max, function: max, column: score, window: 20m, hop: 20m}
"#;

const MIN: i64 = 60_000_000;
/// A day boundary, so hops line up with the grid.
const T0: i64 = 19_675 * 86_400_000_000;

#[derive(Debug, Clone, PartialEq)]
enum V {
    F64(Option<f64>),
    F32(Option<f32>),
    I64(Option<i64>),
    I32(Option<i32>),
    Str(Option<String>),
}

impl V {
    fn is_null(&self) -> bool {
        matches!(self, V::F64(None) | V::F32(None) | V::I64(None) | V::I32(None) | V::Str(None))
    }

    fn num(&self) -> f64 {
        match self {
            V::F64(Some(x)) => *x,
            V::F32(Some(x)) => f64::from(*x),
            V::I64(Some(x)) => *x as f64,
            V::I32(Some(x)) => f64::from(*x),
            _ => panic!("not a number: {self:?}"),
        }
    }

    fn int(&self) -> i64 {
        match self {
            V::I64(Some(x)) => *x,
            V::I32(Some(x)) => i64::from(*x),
            _ => panic!("not an int: {self:?}"),
        }
    }
}

#[derive(Debug, Clone)]
struct Event {
    key: String,
    ts: i64,
    created: i64,
    /// (ingest, row): the ingestion order.
    order: (usize, usize),
    values: HashMap<&'static str, V>,
}

fn gen_event(rng: &mut StdRng, view: &str, late: bool) -> Event {
    let minute = if late { rng.random_range(0..200) } else { rng.random_range(100..400) };
    let ts = T0 + minute * MIN;
    let created = ts + rng.random_range(0..3) * 10 * MIN;
    let mut values = HashMap::new();
    let key = if view == "rides" {
        // Now and then a huge fare: the windows after it must not lose their own few
        // digits to it (a stddev from differences of whole-history prefix sums would).
        let fare = if rng.random_bool(0.02) { 1e15 } else { rng.random_range(1.0..100.0) };
        values.insert("fare", V::F64(opt(rng.random_bool(0.12), fare)));
        values.insert("minutes", V::I64(opt(rng.random_bool(0.12), 1000 + rng.random_range(-50..50))));
        values.insert("city", V::Str(opt(rng.random_bool(0.12), format!("c{}", rng.random_range(0..6)))));
        values.insert("m32", V::I32(opt(rng.random_bool(0.12), rng.random_range(-1000..1000))));
        values.insert("f32", V::F32(opt(rng.random_bool(0.12), rng.random_range(-10.0..10.0f32))));
        format!("{}", 7 + rng.random_range(0..8))
    } else {
        // Now and then a score near f64::MAX, so sums overflow to infinity (the sweep
        // must then add, not subtract prefix sums: inf - inf is NaN).
        let score = if rng.random_bool(0.03) { 1.5e308 } else { rng.random_range(0.0..5.0) };
        values.insert("score", V::F64(opt(rng.random_bool(0.12), score)));
        values.insert("label", V::Str(opt(rng.random_bool(0.12), format!("l{}", rng.random_range(0..4)))));
        format!("u{}", rng.random_range(0..6))
    };
    Event { key, ts, created, order: (0, 0), values }
}

fn to_batch(view: &str, events: &[Event]) -> RecordBatch {
    let mut cols: Vec<(&str, ArrayRef)> = Vec::new();
    if view == "rides" {
        cols.push(("rider_id", Arc::new(Int64Array::from(events.iter().map(|e| e.key.parse::<i64>().unwrap()).collect::<Vec<_>>()))));
        cols.push(("event_timestamp", ts_array(events.iter().map(|e| e.ts))));
        cols.push(("created_timestamp", ts_array(events.iter().map(|e| e.created))));
    } else {
        cols.push(("user", Arc::new(StringArray::from(events.iter().map(|e| e.key.clone()).collect::<Vec<_>>()))));
        cols.push(("event_timestamp", ts_array(events.iter().map(|e| e.ts))));
    }
    let names: &[&'static str] = if view == "rides" { &["fare", "minutes", "city", "m32", "f32"] } else { &["score", "label"] };
    for name in names {
        let get = |e: &Event| e.values[name].clone();
        let array: ArrayRef = match get(&events[0]) {
            V::F64(_) => Arc::new(events.iter().map(|e| if let V::F64(x) = get(e) { x } else { None }).collect::<Float64Array>()),
            V::F32(_) => Arc::new(events.iter().map(|e| if let V::F32(x) = get(e) { x } else { None }).collect::<Float32Array>()),
            V::I64(_) => Arc::new(events.iter().map(|e| if let V::I64(x) = get(e) { x } else { None }).collect::<Int64Array>()),
            V::I32(_) => Arc::new(events.iter().map(|e| if let V::I32(x) = get(e) { x } else { None }).collect::<Int32Array>()),
            V::Str(_) => Arc::new(events.iter().map(|e| if let V::Str(x) = get(e) { x } else { None }).collect::<StringArray>()),
        };
        cols.push((name, array));
    }
    RecordBatch::try_from_iter(cols).unwrap()
}

/// What the oracle answers, typed loosely.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Null,
    Int(i64),
    Float(f64),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Strs(Vec<String>),
}

/// docs/aggregations.md for one spine row and one aggregation, by looking at every event.
fn oracle(events: &[Event], agg: &quiver_sdk::Aggregation, has_created: bool, key: &str, t: i64, cutoff: bool) -> Want {
    let (w, h) = (agg.window.secs() as i64 * 1_000_000, agg.hop().secs() as i64 * 1_000_000);
    let tail = (t - w).div_euclid(h) * h;
    let mut window: Vec<&Event> = events
        .iter()
        .filter(|e| e.key == key && e.ts >= tail && e.ts <= t && (!cutoff || e.created <= t))
        .filter(|e| !e.values[agg.column.as_str()].is_null())
        .collect();
    // Newest first: event time, then created time, then ingestion order.
    window.sort_by_key(|e| std::cmp::Reverse((e.ts, if has_created { e.created } else { 0 }, e.order)));
    let vals: Vec<&V> = window.iter().map(|e| &e.values[agg.column.as_str()]).collect();
    let n = vals.len();
    use quiver_sdk::AggFunction as F;
    match agg.function {
        F::Count => Want::Int(n as i64),
        _ if n == 0 && agg.function != F::LastK => Want::Null,
        F::Sum => match vals[0] {
            V::I64(_) | V::I32(_) => Want::Int(vals.iter().map(|v| v.int()).sum()),
            _ => Want::Float(vals.iter().map(|v| v.num()).sum()),
        },
        F::Avg => Want::Float(vals.iter().map(|v| v.num()).sum::<f64>() / n as f64),
        F::Stddev if n < 2 => Want::Null,
        F::Stddev => {
            let mean = vals.iter().map(|v| v.num()).sum::<f64>() / n as f64;
            Want::Float((vals.iter().map(|v| (v.num() - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt())
        }
        F::Min | F::Max => {
            let best = if agg.function == F::Min {
                vals.iter().min_by(|a, b| a.num().total_cmp(&b.num()))
            } else {
                vals.iter().max_by(|a, b| a.num().total_cmp(&b.num()))
            };
            scalar(best.unwrap())
        }
        F::Last => scalar(vals[0]),
        F::LastK => {
            let k = agg.k.unwrap() as usize;
            let top = &vals[..n.min(k)];
            match events.iter().find(|e| e.values.contains_key(agg.column.as_str())).map(|e| &e.values[agg.column.as_str()]) {
                Some(V::Str(_)) => {
                    Want::Strs(top.iter().map(|v| if let V::Str(Some(s)) = v { s.clone() } else { unreachable!() }).collect())
                }
                Some(V::I64(_) | V::I32(_)) => Want::Ints(top.iter().map(|v| v.int()).collect()),
                _ => Want::Floats(top.iter().map(|v| v.num()).collect()),
            }
        }
    }
}

fn scalar(v: &V) -> Want {
    match v {
        V::F64(Some(x)) => Want::Float(*x),
        V::F32(Some(x)) => Want::Float(f64::from(*x)),
        V::I64(Some(x)) => Want::Int(*x),
        V::I32(Some(x)) => Want::Int(i64::from(*x)),
        V::Str(Some(s)) => Want::Str(s.clone()),
        _ => Want::Null,
    }
}

fn got(array: &ArrayRef, i: usize) -> Want {
    use arrow::datatypes::DataType as D;
    if array.is_null(i) {
        return Want::Null;
    }
    match array.data_type() {
        D::Int64 => Want::Int(array.as_primitive::<Int64Type>().value(i)),
        D::Int32 => Want::Int(i64::from(array.as_primitive::<Int32Type>().value(i))),
        D::Float64 => Want::Float(array.as_primitive::<Float64Type>().value(i)),
        D::Float32 => Want::Float(f64::from(array.as_primitive::<Float32Type>().value(i))),
        D::Utf8 => Want::Str(array.as_string::<i32>().value(i).to_string()),
        D::List(f) => {
            let items = array.as_list::<i32>().value(i);
            match f.data_type() {
                D::Int64 => Want::Ints(items.as_primitive::<Int64Type>().values().to_vec()),
                D::Float64 => Want::Floats(items.as_primitive::<Float64Type>().values().to_vec()),
                D::Float32 => Want::Floats(items.as_primitive::<Float32Type>().values().iter().map(|x| f64::from(*x)).collect()),
                D::Utf8 => Want::Strs(items.as_string::<i32>().iter().map(|s| s.unwrap().to_string()).collect()),
                other => panic!("unexpected list of {other}"),
            }
        }
        other => panic!("unexpected type {other}"),
    }
}

/// Integers, strings and lists exactly; floats to 1e-9 relative.
fn agrees(a: &Want, b: &Want) -> bool {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0);
    match (a, b) {
        (Want::Float(x), Want::Float(y)) => x == y || close(*x, *y),
        (Want::Floats(x), Want::Floats(y)) => x == y,
        _ => a == b,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregations_match_the_row_by_row_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    let config = Config::parse(repo, &repo.join("quiver.yaml"), "project: t\n", Vec::new()).unwrap();
    let defs: Definitions = parse_definitions(DEFS).unwrap();
    let mut rng = StdRng::seed_from_u64(16);
    let noop = |_: &str, _: u64| {};

    let mut all: HashMap<&str, Vec<Event>> = HashMap::new();
    for view_name in ["rides", "tags"] {
        let view = defs.feature_view(view_name).unwrap();
        for ingest_no in 0..2 {
            let n = if view_name == "rides" { 1500 } else { 500 };
            // The second ingest is mostly late: events before much of the first's.
            let mut events: Vec<Event> = (0..n).map(|_| gen_event(&mut rng, view_name, ingest_no == 1)).collect();
            if ingest_no == 1 {
                // Exact duplicates of earlier events: two events, both counted.
                for i in 0..40 {
                    let mut twin = all[view_name][i * 7].clone();
                    twin.order = (0, 0);
                    events.push(twin);
                }
            }
            events.shuffle(&mut rng);
            for (i, e) in events.iter_mut().enumerate() {
                e.order = (ingest_no, i);
            }
            let path = repo.join(format!("{view_name}_{ingest_no}.parquet"));
            write_parquet(&path, &to_batch(view_name, &events));
            let report = ingest(&config.view_table(view), &defs, view, &path, i64::MAX, &noop).await.unwrap();
            assert_eq!(report.rows, events.len());
            all.entry(view_name).or_default().extend(events);
        }
    }

    for view_name in ["rides", "tags"] {
        let view = defs.feature_view(view_name).unwrap();
        let events = &all[view_name];
        let keys: Vec<String> = {
            let mut k: Vec<String> = events.iter().map(|e| e.key.clone()).collect();
            k.sort();
            k.dedup();
            k.push(if view_name == "rides" { "999".into() } else { "nobody".into() });
            k
        };
        let mut spine: Vec<(String, i64)> = Vec::new();
        for _ in 0..900 {
            let key = keys[rng.random_range(0..keys.len())].clone();
            let base = events[rng.random_range(0..events.len())].ts;
            let agg = &view.aggregations[rng.random_range(0..view.aggregations.len())];
            let (w, h) = (agg.window_us(), agg.hop_us());
            let t = match rng.random_range(0..8) {
                0 => base,
                1 => base + w,
                2 => base + w + 1,
                3 => base + w + h,
                4 => base - 1,
                5 => T0 - 3 * 60 * MIN,
                6 => T0 + 9 * 86_400_000_000,
                _ => T0 + rng.random_range(0..500 * MIN),
            };
            spine.push((key, t));
        }
        let keys_col: ArrayRef = if view_name == "rides" {
            Arc::new(Int64Array::from(spine.iter().map(|(k, _)| k.parse::<i64>().unwrap()).collect::<Vec<_>>()))
        } else {
            Arc::new(StringArray::from(spine.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()))
        };
        let key_name = if view_name == "rides" { "rider_id" } else { "user" };
        let spine_batch = RecordBatch::try_from_iter([
            ("label", Arc::new(Int64Array::from((0..spine.len() as i64).collect::<Vec<_>>())) as ArrayRef),
            (key_name, keys_col),
            ("event_timestamp", ts_array(spine.iter().map(|s| s.1))),
        ])
        .unwrap();
        let mut refs: Vec<FeatureRef> = view.aggregations.iter().map(|a| FeatureRef::new(view_name, &a.name)).collect();
        refs.reverse();
        let has_created = view.source.created_timestamp_field.is_some();
        let mut compared = 0;
        let mut non_empty = 0;
        for cutoff in if has_created { vec![false, true] } else { vec![false] } {
            let requests = resolve(&defs, &refs).unwrap();
            let out = historical(
                &config,
                &defs,
                SpineRows { source: "spine", rows: &spine_batch },
                &requests,
                HistoricalOptions { created_cutoff: cutoff, ..Default::default() },
                &CpuKernel::new(),
                &noop,
            )
            .await
            .unwrap();
            assert_eq!(out.num_rows(), spine.len());
            for k in 0..3 {
                assert_eq!(out.column(k).as_ref(), spine_batch.column(k).as_ref(), "spine columns untouched");
            }
            for (j, r) in refs.iter().enumerate() {
                assert_eq!(out.schema().field(3 + j).name(), &r.column_name());
                let agg = view.aggregation(&r.feature).unwrap();
                let column = out.column(3 + j);
                for (i, (key, t)) in spine.iter().enumerate() {
                    let want = oracle(events, agg, has_created, key, *t, cutoff);
                    let have = got(column, i);
                    assert!(agrees(&have, &want), "{r} (cutoff {cutoff}) at spine row {i} ({key}, {t}): got {have:?}, want {want:?}");
                    compared += 1;
                    if !matches!(want, Want::Null | Want::Int(0)) && want != Want::Strs(vec![]) {
                        non_empty += 1;
                    }
                }
            }
        }
        assert!(non_empty * 2 > compared, "{view_name}: too many empty windows ({non_empty} of {compared})");
    }
}
