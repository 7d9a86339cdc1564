//! The demo repository of `init --demo`: ride-hailing drivers and customers, three
//! feature views (one with a composite key, one with an embedding), one feature service,
//! and seeded sample data ending at a given time, written as Parquet.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, BooleanArray, Float32Array, Float32Builder, Float64Array, Int32Array, Int64Array, ListBuilder, RecordBatch,
    StringArray, TimestampMicrosecondArray,
};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

/// The demo's `features.yaml`.
pub const FEATURES_YAML: &str = r#"# Demo feature repository: ride-hailing drivers and customers.
# Edit, then run `quiver plan` to see the change and `quiver apply` to record it.
entities:
  - name: driver
    description: A driver on the platform.
    join_keys: [{name: driver_id, dtype: int64}]
  - name: customer
    description: A rider.
    join_keys: [{name: customer_id, dtype: string}]

feature_views:
  - name: driver_hourly
    description: Hourly driver quality statistics.
    entities: [driver]
    ttl: 2h
    online: true
    tags: {team: marketplace}
    source:
      timestamp_field: event_timestamp
      created_timestamp_field: created_timestamp
    features:
      - {name: conv_rate, dtype: float64}
      - {name: acc_rate, dtype: float64}
      - {name: avg_daily_trips, dtype: int64}

  - name: customer_profile
    description: Slowly changing customer attributes, snapshotted daily.
    entities: [customer]
    ttl: 0                                  # unbounded: the latest snapshot always counts
    online: true
    source: {timestamp_field: event_timestamp, created_timestamp_field: created_timestamp}
    features:
      - {name: age, dtype: int32}
      - {name: city, dtype: string}
      - {name: lifetime_value, dtype: float64}
      - {name: embedding, dtype: list<float32>}

  - name: driver_customer
    description: What one driver and one customer have done together (a composite key).
    entities: [driver, customer]
    ttl: 30d
    online: true
    source: {timestamp_field: event_timestamp, created_timestamp_field: created_timestamp}
    features:
      - {name: rides_together, dtype: int64}
      - {name: avg_rating, dtype: float32}

  - name: customer_rides
    description: Every ride a customer took (an event log), aggregated over time windows.
    entities: [customer]
    online: true
    source: {timestamp_field: event_timestamp, created_timestamp_field: created_timestamp}
    features:                               # the events' columns
      - {name: fare, dtype: float64}
      - {name: minutes, dtype: int64}
      - {name: city, dtype: string}
    aggregations:                           # the served features
      - {name: fare_sum_1h, function: sum, column: fare, window: 1h}
      - {name: rides_7d, function: count, column: fare, window: 7d}
      - {name: minutes_min_30m, function: min, column: minutes, window: 30m, hop: 10m}
      - {name: fare_avg_1d, function: avg, column: fare, window: 1d}
      - {name: last_cities, function: last_k, k: 3, column: city, window: 7d}

feature_services:
  - name: ranker_v1
    description: Features of the ride-ranking model.
    features:
      - driver_hourly:conv_rate
      - driver_hourly:acc_rate
      - driver_hourly:avg_daily_trips
      - customer_profile:lifetime_value
      - customer_profile:embedding
      - driver_customer:rides_together
      - customer_rides:rides_7d
      - customer_rides:fare_sum_1h
"#;

/// Where `init --demo` puts the sample data, relative to the repository.
pub const SAMPLE_DIR: &str = "sample_data";

/// How much sample data to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    /// Drivers `1001..`, each with a row per hour.
    pub drivers: i64,
    /// Customers (riders) `C001..`, each with a daily profile snapshot.
    pub customers: usize,
    /// Hours of driver statistics before `now`.
    pub hours: i64,
    /// Days of customer snapshots.
    pub profile_days: i64,
    /// Driver/customer rides, spread over `ride_days`.
    pub rides: usize,
    pub ride_days: i64,
    /// Ride requests in the training spine, over the last `hours`.
    pub spine_rows: usize,
}

impl Scale {
    /// `init --demo`: 10 drivers over 72 hours, 20 customers, 500 spine rows.
    pub const SAMPLE: Scale = Scale { drivers: 10, customers: 20, hours: 72, profile_days: 7, rides: 200, ride_days: 20, spine_rows: 500 };
    /// The quick start: 500 drivers and 2,000 riders over 30 days (360,000 hourly
    /// driver rows), 50,000 rides, 100,000 spine rows.
    pub const MONTH: Scale =
        Scale { drivers: 500, customers: 2000, hours: 30 * 24, profile_days: 30, rides: 50_000, ride_days: 30, spine_rows: 100_000 };

    fn driver_ids(&self) -> std::ops::RangeInclusive<i64> {
        1001..=1000 + self.drivers
    }
}

const CITIES: [&str; 5] = ["Lisbon", "Porto", "Braga", "Coimbra", "Faro"];

fn customer_id(i: usize) -> String {
    format!("C{:03}", i + 1)
}

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn timestamps(values: Vec<i64>) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from(values).with_timezone("UTC"))
}

/// Writes the demo's sample Parquet files under `dir`, with data for the 72 hours (and
/// for slower views, days) before `now` rounded down to the hour. Returns the files.
/// The same `now` gives the same files.
///
/// # Errors
/// When a file cannot be written.
pub fn write_sample_data(dir: &Path, now: DateTime<Utc>) -> Result<Vec<PathBuf>> {
    write_sample_data_at(dir, now, Scale::SAMPLE)
}

/// [`write_sample_data`] at another scale.
///
/// # Errors
/// When a file cannot be written.
pub fn write_sample_data_at(dir: &Path, now: DateTime<Utc>, scale: Scale) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let anchor = now.duration_trunc(TimeDelta::hours(1)).expect("an hour divides any timestamp");
    let mut rng = StdRng::seed_from_u64(42);
    let batches = [
        ("driver_hourly", driver_hourly(&mut rng, anchor, &scale)?),
        ("customer_profile", customer_profile(&mut rng, anchor, &scale)?),
        ("driver_customer", driver_customer(&mut rng, anchor, &scale)?),
        ("customer_rides", customer_rides(&mut rng, anchor, &scale)?),
        ("spine", spine(&mut rng, anchor, &scale)?),
    ];
    let mut files = Vec::new();
    for (name, batch) in batches {
        let batch = created_by(batch, micros(now))?;
        let path = dir.join(format!("{name}.parquet"));
        write_parquet(&path, &batch)?;
        files.push(path);
    }
    Ok(files)
}

/// No row is created after `now`, the moment the data is made: a row whose lag would put
/// its creation later (a late correction of the last hour) is created at `now`. So a
/// join with the created-time cutoff at any time after `now` sees every row.
fn created_by(batch: RecordBatch, now: i64) -> Result<RecordBatch> {
    let Ok(i) = batch.schema().index_of("created_timestamp") else { return Ok(batch) };
    let created = batch.column(i).as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
    let clamped = timestamps(created.values().iter().map(|&c| c.min(now)).collect());
    let mut columns = batch.columns().to_vec();
    columns[i] = clamped;
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let parquet_err = |error| Error::Parquet { path: path.to_path_buf(), error };
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(parquet_err)?;
    writer.write(batch).map_err(parquet_err)?;
    writer.close().map_err(parquet_err)?;
    Ok(())
}

/// Hourly rows per driver; about 2% null conversion rates, and about 3% of hours get a
/// late correction: a second row for the same event time, created an hour later.
fn driver_hourly(rng: &mut StdRng, anchor: DateTime<Utc>, scale: &Scale) -> Result<RecordBatch> {
    let (mut ids, mut events, mut created) = (Vec::new(), Vec::new(), Vec::new());
    let (mut conv, mut acc, mut trips) = (Vec::new(), Vec::new(), Vec::new());
    for hour in (0..scale.hours).rev() {
        let event = anchor - TimeDelta::hours(hour);
        for driver in scale.driver_ids() {
            let c = rng.random_range(0.2..0.95_f64);
            let versions = if rng.random_bool(0.03) { 2 } else { 1 };
            for v in 0..versions {
                ids.push(driver);
                events.push(micros(event));
                let lag = TimeDelta::seconds(rng.random_range(1..300)) + TimeDelta::hours(v);
                created.push(micros(event + lag));
                conv.push((!rng.random_bool(0.02)).then_some(c + 0.01 * v as f64));
                acc.push(Some(rng.random_range(0.5..1.0_f64)));
                trips.push(rng.random_range(5..40_i64));
            }
        }
    }
    Ok(RecordBatch::try_from_iter([
        ("driver_id", Arc::new(Int64Array::from(ids)) as ArrayRef),
        ("event_timestamp", timestamps(events)),
        ("created_timestamp", timestamps(created)),
        ("conv_rate", Arc::new(Float64Array::from(conv))),
        ("acc_rate", Arc::new(Float64Array::from(acc))),
        ("avg_daily_trips", Arc::new(Int64Array::from(trips))),
    ])?)
}

/// A daily snapshot per customer, with a 4-dimensional embedding.
fn customer_profile(rng: &mut StdRng, anchor: DateTime<Utc>, scale: &Scale) -> Result<RecordBatch> {
    let customers = scale.customers;
    let (mut ids, mut events, mut created) = (Vec::new(), Vec::new(), Vec::new());
    let (mut age, mut city, mut ltv) = (Vec::new(), Vec::new(), Vec::new());
    let mut embedding = ListBuilder::new(Float32Builder::new());
    let ages: Vec<i32> = (0..customers).map(|_| rng.random_range(18..80)).collect();
    let homes: Vec<&str> = (0..customers).map(|_| CITIES[rng.random_range(0..CITIES.len())]).collect();
    let mut value: Vec<f64> = (0..customers).map(|_| rng.random_range(10.0..500.0)).collect();
    for day in (0..scale.profile_days).rev() {
        let event = anchor - TimeDelta::days(day);
        for c in 0..customers {
            value[c] += rng.random_range(0.0..40.0);
            ids.push(customer_id(c));
            events.push(micros(event));
            created.push(micros(event + TimeDelta::minutes(5)));
            age.push(ages[c]);
            city.push(homes[c]);
            ltv.push((value[c] * 100.0).round() / 100.0);
            for _ in 0..4 {
                embedding.values().append_value(rng.random_range(-1.0..1.0_f32));
            }
            embedding.append(true);
        }
    }
    Ok(RecordBatch::try_from_iter([
        ("customer_id", Arc::new(StringArray::from(ids)) as ArrayRef),
        ("event_timestamp", timestamps(events)),
        ("created_timestamp", timestamps(created)),
        ("age", Arc::new(Int32Array::from(age))),
        ("city", Arc::new(StringArray::from(city))),
        ("lifetime_value", Arc::new(Float64Array::from(ltv))),
        ("embedding", Arc::new(embedding.finish())),
    ])?)
}

/// Rides of driver/customer pairs, with the running count per pair.
fn driver_customer(rng: &mut StdRng, anchor: DateTime<Utc>, scale: &Scale) -> Result<RecordBatch> {
    let mut rides: Vec<(i64, String, i64)> = (0..scale.rides)
        .map(|_| {
            let driver = rng.random_range(scale.driver_ids());
            let customer = customer_id(rng.random_range(0..scale.customers));
            let at = anchor - TimeDelta::seconds(rng.random_range(0..scale.ride_days * 86_400));
            (driver, customer, micros(at))
        })
        .collect();
    rides.sort_by_key(|r| r.2);
    let mut counts = std::collections::HashMap::new();
    let (mut drivers, mut customers, mut events, mut created) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut together, mut rating) = (Vec::new(), Vec::new());
    for (driver, customer, at) in rides {
        let n = counts.entry((driver, customer.clone())).or_insert(0_i64);
        *n += 1;
        drivers.push(driver);
        customers.push(customer);
        events.push(at);
        created.push(at + 60_000_000);
        together.push(*n);
        rating.push(rng.random_range(3.5..5.0_f32));
    }
    Ok(RecordBatch::try_from_iter([
        ("driver_id", Arc::new(Int64Array::from(drivers)) as ArrayRef),
        ("customer_id", Arc::new(StringArray::from(customers))),
        ("event_timestamp", timestamps(events)),
        ("created_timestamp", timestamps(created)),
        ("rides_together", Arc::new(Int64Array::from(together))),
        ("avg_rating", Arc::new(Float32Array::from(rating))),
    ])?)
}

/// Ride events of customers over the last 7 days (three per driver/customer ride of
/// the demo's scale), several per hour for busy customers, some with no fare.
fn customer_rides(rng: &mut StdRng, anchor: DateTime<Utc>, scale: &Scale) -> Result<RecordBatch> {
    let n = scale.rides * 3;
    let (mut ids, mut events, mut created) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fare, mut minutes, mut city) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        // Busy customers first: the lower ids ride more often.
        let c = rng.random_range(0..scale.customers).min(rng.random_range(0..scale.customers));
        let span = if rng.random_bool(0.25) { 3 * 3600 } else { 7 * 86_400 };
        let at = anchor - TimeDelta::seconds(rng.random_range(0..span));
        ids.push(customer_id(c));
        events.push(micros(at));
        created.push(micros(at + TimeDelta::seconds(rng.random_range(1..120))));
        fare.push((!rng.random_bool(0.05)).then(|| (rng.random_range(5.0..60.0_f64) * 100.0).round() / 100.0));
        minutes.push(rng.random_range(3..90_i64));
        city.push(CITIES[rng.random_range(0..CITIES.len())]);
    }
    Ok(RecordBatch::try_from_iter([
        ("customer_id", Arc::new(StringArray::from(ids)) as ArrayRef),
        ("event_timestamp", timestamps(events)),
        ("created_timestamp", timestamps(created)),
        ("fare", Arc::new(Float64Array::from(fare))),
        ("minutes", Arc::new(Int64Array::from(minutes))),
        ("city", Arc::new(StringArray::from(city))),
    ])?)
}

/// The entity dataframe of a training set: ride requests with a label.
fn spine(rng: &mut StdRng, anchor: DateTime<Utc>, scale: &Scale) -> Result<RecordBatch> {
    let (mut drivers, mut customers, mut events, mut labels) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..scale.spine_rows {
        drivers.push(rng.random_range(scale.driver_ids()));
        customers.push(customer_id(rng.random_range(0..scale.customers)));
        events.push(micros(anchor - TimeDelta::seconds(rng.random_range(0..scale.hours * 3600))));
        labels.push(rng.random_bool(0.3));
    }
    Ok(RecordBatch::try_from_iter([
        ("driver_id", Arc::new(Int64Array::from(drivers)) as ArrayRef),
        ("customer_id", Arc::new(StringArray::from(customers))),
        ("event_timestamp", timestamps(events)),
        ("accepted", Arc::new(BooleanArray::from(labels))),
    ])?)
}
