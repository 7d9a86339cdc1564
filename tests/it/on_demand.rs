//! On-demand features (docs/transformations.md), end to end: for the demo's data with
//! on-demand views over every kind of input (plain views, an event log's aggregations,
//! an earlier on-demand view, request fields, `request_time`), the online answer for a
//! request `(keys, fields)` at time `t` equals the offline join's for a spine row `(keys,
//! t, fields)` — bit for bit, floats included, except where an expression reads an
//! aggregation's float sum (added in another order online, docs/aggregations.md: within
//! 1e-9 relative). On the embedded store and on the real Redis `./run test` starts.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use quiver::Repo;
use quiver::offline::historical::{HistoricalOptions, SpineRows, historical, resolve};
use quiver::offline::schema::value_at;
use quiver::online::lookup::{Status, get_online_features};
use quiver::online::{EmbeddedStore, OnlineStore, RedisStore};
use quiver::runtime::encoding::{KeyValue, Value};
use quiver::sdk::{FeatureRef, Timestamp};
use rand::{Rng, SeedableRng};

const HOUR_US: i64 = 3_600_000_000;

/// The on-demand views appended to the demo's definitions.
pub const ON_DEMAND: &str = r#"
on_demand_views:
  - name: trip_scoring
    inputs: [driver_hourly, customer_profile, customer_rides]
    request: [{name: amount, dtype: float64}, {name: pickup_city, dtype: string}]
    features:
      - {name: conv_x_acc, dtype: float64, expr: "driver_hourly.conv_rate * driver_hourly.acc_rate"}
      - {name: fare_ratio, dtype: float64, expr: "amount / NULLIF(customer_rides.fare_avg_1d, 0)"}
      - {name: per_unit, dtype: int64, expr: "driver_hourly.avg_daily_trips / CAST(amount AS BIGINT)"}
      - {name: home_city, dtype: bool, expr: "customer_profile.city = lower(pickup_city)"}
      - {name: tier, dtype: string,
         expr: "CASE WHEN customer_profile.lifetime_value > 500 THEN 'gold' WHEN customer_profile.age < 30 THEN 'young' ELSE concat(upper(pickup_city), '-', customer_id) END"}
      - {name: profile_age_h, dtype: float64,
         expr: "date_part('epoch', request_time - customer_profile.event_timestamp) / 3600"}
      - {name: emb_norm, dtype: float64, expr: "sqrt(inner_product(customer_profile.embedding, customer_profile.embedding))"}
      - {name: rides_per_trip, dtype: float64, expr: "customer_rides.rides_7d / (driver_hourly.avg_daily_trips + amount)"}
  - name: boosted
    inputs: [trip_scoring, driver_customer]
    features:
      - {name: score, dtype: float64, expr: "COALESCE(trip_scoring.conv_x_acc, 0) * driver_customer.avg_rating + ln(abs(amount) + 1)"}
  - name: pair_stats
    inputs: [driver_customer]
    features:
      - {name: rated_rides, dtype: float64, expr: "driver_customer.avg_rating * driver_customer.rides_together"}
"#;

/// The features that read an aggregation's float sum (compared within 1e-9).
const READ_SUMS: [&str; 1] = ["trip_scoring:fare_ratio"];

async fn check(store: Arc<dyn OnlineStore>, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(format!("{name}{}", std::process::id()));
    let now = chrono::Utc::now();
    quiver::init(&dir, true, now).unwrap();
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    std::fs::write(dir.join("features.yaml"), format!("{yaml}{ON_DEMAND}")).unwrap();
    let repo = Repo::open(&dir).unwrap();
    let (applying, handle) = (repo.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || applying.apply(false, now, handle).unwrap()).await.unwrap();
    let defs = repo.applied().unwrap().registered();
    for view in &defs.feature_views {
        let file = dir.join(format!("sample_data/{}.parquet", view.name));
        let horizon = repo.config.event_horizon(chrono::Utc::now().timestamp_micros());
        quiver::offline::ingest::ingest(&repo.config.view_table(view), &defs, view, &file, horizon, &|_, _| {}).await.unwrap();
    }
    repo.materialize(Timestamp::MIN, now.into()).with_store(store.clone()).await.unwrap();

    // Every driver x customer pair (and unknown ones), with random request fields:
    // zeros, negatives and fractions (integer division by zero), cities of any case.
    let mut rng = rand::rngs::StdRng::seed_from_u64(40);
    let (mut drivers, mut customers, mut amounts, mut cities) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let city_names = ["paris", "PARIS", "Berlin", "london", "", "Tokyo"];
    for d in 1000..=1011 {
        for c in 0..=21 {
            drivers.push(d);
            customers.push(format!("C{c:03}"));
            amounts.push(match rng.random_range(0..5) {
                0 => 0.0,
                1 => 0.5,
                2 => -rng.random_range(1.0..100.0),
                _ => rng.random_range(1.0..500.0),
            });
            cities.push(city_names[rng.random_range(0..city_names.len())].to_string());
        }
    }
    let refs: Vec<FeatureRef> = defs
        .on_demand_views
        .iter()
        .flat_map(|v| v.features.iter().map(|f| FeatureRef::new(&v.name, &f.name)))
        .chain([FeatureRef::new("driver_hourly", "conv_rate")])
        .collect();
    let n = drivers.len();
    let (mut compared, mut nulls) = (vec![0usize; refs.len()], vec![0usize; refs.len()]);
    // At `now`, and three hours later, when the 2h-TTL view is out of date (null inputs).
    for at in [now.timestamp_micros(), now.timestamp_micros() + 3 * HOUR_US] {
        let spine = RecordBatch::try_from_iter([
            ("driver_id", Arc::new(Int64Array::from(drivers.clone())) as ArrayRef),
            ("customer_id", Arc::new(StringArray::from(customers.clone()))),
            ("event_timestamp", Arc::new(TimestampMicrosecondArray::from(vec![at; n]).with_timezone("UTC"))),
            ("amount", Arc::new(Float64Array::from(amounts.clone()))),
            ("pickup_city", Arc::new(StringArray::from(cities.clone()))),
        ])
        .unwrap();
        let requests = resolve(&defs, &refs).unwrap();
        let kernel = quiver::gpu_join::CpuKernel::new();
        let rows = SpineRows { source: "spine", rows: &spine };
        let offline = historical(&repo.config, &defs, rows, &requests, HistoricalOptions::default(), &kernel, &|_, _| {}).await.unwrap();
        assert_eq!(offline.num_columns(), 5 + refs.len(), "the inputs read are not returned");
        let entities = vec![
            ("driver_id".to_string(), drivers.iter().map(|&d| KeyValue::Int(d)).collect()),
            ("customer_id".to_string(), customers.iter().map(|c| KeyValue::Str(c.clone())).collect()),
        ];
        let fields = vec![
            ("amount".to_string(), amounts.iter().map(|&a| Value::Float64(a)).collect()),
            ("pickup_city".to_string(), cities.iter().map(|c| Value::String(c.clone())).collect()),
        ];
        let online = get_online_features(store.as_ref(), &repo.config.project, &defs, &refs, (&entities, &fields), at, true).await.unwrap();
        assert_eq!(online.len(), 2 + refs.len());
        for (k, r) in refs.iter().enumerate() {
            let column = &online[2 + k];
            assert_eq!(column.name, r.column_name());
            let dtype = defs.feature_dtype(r).unwrap();
            for i in 0..n {
                let want = value_at(offline.column(5 + k).as_ref(), i, dtype);
                let got = &column.values[i];
                let same = match (got, &want) {
                    (Value::Float64(a), Value::Float64(b)) if READ_SUMS.contains(&r.to_string().as_str()) => {
                        (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
                    }
                    (Value::Float64(a), Value::Float64(b)) => a.to_bits() == b.to_bits(),
                    _ => got == &want,
                };
                assert!(
                    same,
                    "{r} row {i} at {at} ({} {}, {} {:?}): online {got:?}, offline {want:?}",
                    drivers[i], customers[i], amounts[i], cities[i]
                );
                if r.view != "driver_hourly" {
                    let status = if *got == Value::Null { Status::NullValue } else { Status::Present };
                    assert_eq!(column.statuses[i], status, "{r} row {i}: the status follows from the value");
                    assert!(column.event_ts[i].is_some(), "{r} row {i}: an on-demand value always has an event time");
                }
                compared[k] += 1;
                nulls[k] += usize::from(*got == Value::Null);
            }
        }
    }
    // Every feature computed values and (division by zero, missing inputs) nulls.
    for (k, r) in refs.iter().enumerate() {
        assert!(nulls[k] < compared[k], "{r}: never computed a value");
    }
    let per_unit = refs.iter().position(|r| r.feature == "per_unit").unwrap();
    assert!(nulls[per_unit] > 0, "integer division by zero gives null");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_features_online_equal_offline_on_the_embedded_store() {
    let tmp = tempfile::tempdir().unwrap();
    check(Arc::new(EmbeddedStore::open(&tmp.path().join("online.db")).unwrap()), "ondemand").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_features_online_equal_offline_on_redis() {
    let Some(url) = crate::common::redis_url("on_demand_features_online_equal_offline_on_redis") else { return };
    check(Arc::new(RedisStore::connect(&url).await.unwrap()), "ondemandredis").await;
}
