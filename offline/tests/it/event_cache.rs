//! The event cache a stream or server rebuilds event logs' records through
//! (`EventCache`, docs/aggregations.md#writes) against a fresh read of the table
//! (`events_since` with the same entities) after every change: random appends from two
//! writers, a clock that mostly advances and sometimes goes back, entities asked for
//! that have no events or fell out of the window, a delete (a commit that removes
//! files) and the table deleted and made again.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use quiver_offline::historical::{EntityEvents, EventCache, events_since};
use quiver_offline::ingest::{AppendOptions, OpenTable, append};
use quiver_runtime::encoding::KeyValue;
use quiver_sdk::yaml::parse_definitions;
use quiver_sdk::{Config, Definitions, FeatureView, StoreLocation};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DEFS: &str = r#"
entities:
  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}
feature_views:
  - name: rides
    entities: [rider]
    source: {created_timestamp_field: created_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: city, dtype: string}
    aggregations:
      - {name: n_1h, function: count, column: fare, window: 1h}
"#;

const MIN: i64 = 60_000_000;
const T0: i64 = 1_700_000_000_000_000;

/// The rows of `rides`: rider, event time, created time, fare, city.
fn batch(ids: Vec<i64>, ts: Vec<i64>, created: Vec<i64>, fares: Vec<Option<f64>>, cities: Vec<Option<String>>) -> RecordBatch {
    let utc_type = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("rider_id", DataType::Int64, false),
        Field::new("event_timestamp", utc_type(), false),
        Field::new("created_timestamp", utc_type(), true),
        Field::new("fare", DataType::Float64, true),
        Field::new("city", DataType::Utf8, true),
    ]));
    let utc = |v: Vec<i64>| Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC")) as ArrayRef;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        utc(ts),
        utc(created),
        Arc::new(Float64Array::from(fares)),
        Arc::new(StringArray::from(cities)),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

/// `n` random events of riders 0..12 around minute `at`.
fn rows(rng: &mut StdRng, at: i64, n: usize) -> RecordBatch {
    let ids: Vec<i64> = (0..n).map(|_| rng.random_range(0..12)).collect();
    let ts: Vec<i64> = (0..n).map(|_| T0 + (at + rng.random_range(-90..10)) * MIN).collect();
    let created: Vec<i64> = ts.iter().map(|t| t + rng.random_range(0..3) * MIN).collect();
    let fares: Vec<Option<f64>> = (0..n).map(|_| rng.random_bool(0.9).then(|| f64::from(rng.random_range(0..100u32)))).collect();
    let cities: Vec<Option<String>> = (0..n).map(|_| rng.random_bool(0.8).then(|| format!("c{}", rng.random_range(0..4)))).collect();
    batch(ids, ts, created, fares, cities)
}

/// One event per `(rider, minute)`, created at its event time, its fare the minute.
fn events_at(events: &[(i64, i64)]) -> RecordBatch {
    let ts: Vec<i64> = events.iter().map(|(_, m)| T0 + m * MIN).collect();
    let fares = events.iter().map(|(_, m)| Some(*m as f64)).collect();
    batch(events.iter().map(|(r, _)| *r).collect(), ts.clone(), ts, fares, vec![None; events.len()])
}

/// Per entity, its events as comparable text, in order.
fn normal(events: &EntityEvents) -> BTreeMap<String, Vec<String>> {
    events
        .entities
        .iter()
        .map(|(keys, events)| {
            let mut out: Vec<String> = events.iter().map(|e| format!("{:?} {:?}", e.order, e.values)).collect();
            out.sort();
            (format!("{keys:?}"), out)
        })
        .collect()
}

/// An empty repository with the event log `rides`, and an event cache over it.
struct Fixture {
    _dir: tempfile::TempDir,
    config: Config,
    defs: Definitions,
    view: FeatureView,
    location: StoreLocation,
    cache: EventCache,
}

impl Fixture {
    fn new(cache: EventCache) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse(dir.path(), &dir.path().join("quiver.yaml"), "project: t\n", Vec::new()).unwrap();
        let defs: Definitions = parse_definitions(DEFS).unwrap();
        let view = defs.find_view("rides").unwrap().clone();
        let location = config.view_table(&view);
        Fixture { _dir: dir, config, defs, view, location, cache }
    }

    async fn append(&self, batch: RecordBatch, options: AppendOptions) {
        append(&self.location, &self.defs, &self.view, "events", vec![batch], options, &|_, _| {}).await.unwrap();
    }

    async fn cached(&self, since: i64, asked: &[Vec<KeyValue>]) -> EntityEvents {
        self.cache.events(&self.config, &self.defs, &self.view, since, asked).await.unwrap()
    }

    /// The cache's events of `asked` against a fresh read of the table.
    async fn check(&self, since: i64, asked: &[Vec<KeyValue>], step: &str) {
        self.check_as(&self.defs, &self.view, since, asked, step).await;
    }

    /// [`Fixture::check`] with the view as `defs` define it now.
    async fn check_as(&self, defs: &Definitions, view: &FeatureView, since: i64, asked: &[Vec<KeyValue>], step: &str) {
        let cached = self.cache.events(&self.config, defs, view, since, asked).await.unwrap();
        let read = events_since(&self.config, defs, view, since, Some(asked)).await.unwrap();
        assert_eq!(cached.version, read.version, "{step}: version");
        assert_eq!(normal(&cached), normal(&read), "{step}: events of {asked:?} since {since}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_cache_reads_what_the_table_holds() {
    reads_what_the_table_holds(EventCache::new()).await;
}

/// A long-lived writer's cache, which reads every entity on its first rebuild (and
/// after starting over): an entity it holds nothing for has no events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lived_event_cache_reads_what_the_table_holds() {
    reads_what_the_table_holds(EventCache::long_lived()).await;
}

/// A long-lived cache holding 40 events at the most: it drops the events older than the
/// window, starts over, and reads the entities asked for alone when every entity's are
/// more than it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_event_cache_reads_what_the_table_holds() {
    reads_what_the_table_holds(EventCache::long_lived().with_limit(40)).await;
}

async fn reads_what_the_table_holds(cache: EventCache) {
    let f = Fixture::new(cache);
    let mut rng = StdRng::seed_from_u64(7);
    let stream = OpenTable::default();
    let rider = |i: i64| vec![KeyValue::Int(i)];

    // No table yet.
    f.check(T0, &[rider(1)], "no table").await;
    let mut minute = 0i64;
    let mut clock = T0;
    for step in 0..60 {
        let step = format!("step {step}");
        minute += rng.random_range(0..4);
        // Appends by a writer keeping its table open, and by others.
        for _ in 0..rng.random_range(0..3) {
            let options =
                if rng.random_bool(0.5) { AppendOptions::new(None).with_open_table(stream.clone()) } else { AppendOptions::new(None) };
            let n = rng.random_range(1..8);
            f.append(rows(&mut rng, minute, n), options).await;
        }
        // The window's start follows the events; now and then the clock goes back.
        let back = if rng.random_bool(0.2) { rng.random_range(1..30) } else { 0 };
        clock = T0 + (minute - 60 - back) * MIN;
        let asked: Vec<Vec<KeyValue>> = (0..rng.random_range(1..6)).map(|_| rider(rng.random_range(0..14))).collect();
        f.check(clock, &asked, &step).await;
    }

    // A commit that removes files: rider 3's events deleted.
    let table = quiver_offline::delta::open_table(&f.location).await.unwrap().unwrap();
    let (table, _) = table.delete().with_predicate("rider_id = 3").await.unwrap();
    assert!(table.version().is_some());
    let all: Vec<Vec<KeyValue>> = (0..12).map(rider).collect();
    f.check(clock, &all, "after the delete").await;
    f.append(rows(&mut rng, minute, 20), AppendOptions::new(None)).await;
    f.check(clock, &all, "an append after the delete").await;

    // The table deleted and made again, to fewer versions than the cache had read.
    let StoreLocation::Local(path) = &f.location else { panic!("a local table") };
    std::fs::remove_dir_all(path).unwrap();
    f.check(clock, &all, "the table gone").await;
    f.append(rows(&mut rng, minute, 30), AppendOptions::new(None)).await;
    f.check(clock, &all, "the table made again").await;
}

/// Versions read for other entities skip rows older than the window then: an entity
/// asked for again with an earlier window start (the clock went back) is read afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_window_start_reads_what_the_cache_skipped() {
    let f = Fixture::new(EventCache::new());
    let (one, two) = (vec![KeyValue::Int(1)], vec![KeyValue::Int(2)]);
    f.append(events_at(&[(1, 10), (2, 20)]), AppendOptions::new(None)).await;
    f.check(T0, &[one.clone(), two.clone()], "both read").await;
    // A late event of rider 2, and rider 1's window starting after it.
    f.append(events_at(&[(2, 5), (2, 30), (1, 40)]), AppendOptions::new(None)).await;
    f.check(T0 + 15 * MIN, std::slice::from_ref(&one), "rider 1 from minute 15").await;
    // The clock back at minute 0: rider 2's late event counts again.
    let events = f.cached(T0, std::slice::from_ref(&two)).await;
    let times: Vec<i64> =
        events.entities[0].1.iter().map(|e| (e.order.0 - T0) / MIN).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(times, vec![5, 20, 30], "rider 2's events from minute 0");
}

/// Versions read for other entities from an earlier window start (the clock went back)
/// add nothing older than an entity's own start to it: asked again from there, it gets
/// the events from there alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_read_from_an_earlier_start_are_not_held_for_a_later_one() {
    for cache in [EventCache::new(), EventCache::long_lived()] {
        let f = Fixture::new(cache);
        let (one, two) = (vec![KeyValue::Int(1)], vec![KeyValue::Int(2)]);
        f.append(events_at(&[(1, 30)]), AppendOptions::new(None)).await;
        f.check(T0 + 20 * MIN, std::slice::from_ref(&one), "rider 1 from minute 20").await;
        // A late event of rider 1 (minute 10), read while rider 2 is asked for from minute 0.
        f.append(events_at(&[(1, 10), (1, 40), (2, 5)]), AppendOptions::new(None)).await;
        f.check(T0, std::slice::from_ref(&two), "rider 2 from minute 0").await;
        f.check(T0 + 20 * MIN, std::slice::from_ref(&one), "rider 1 from minute 20 again").await;
    }
}

/// A view redefined under the cache: with another aggregation its events are the same
/// (the cache goes on); without a feature column they are not (it starts afresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_redefined_is_read_as_defined_now() {
    for cache in [EventCache::new(), EventCache::long_lived()] {
        let f = Fixture::new(cache);
        let riders: Vec<Vec<KeyValue>> = (1..=3).map(|i| vec![KeyValue::Int(i)]).collect();
        f.append(events_at(&[(1, 10), (2, 20), (3, 30)]), AppendOptions::new(None)).await;
        f.check(T0, &riders, "as defined first").await;
        let more = DEFS.replace("window: 1h}", "window: 1h}\n      - {name: top_1h, function: max, column: fare, window: 1h}");
        let defs: Definitions = parse_definitions(&more).unwrap();
        f.append(events_at(&[(1, 40)]), AppendOptions::new(None)).await;
        f.check_as(&defs, defs.find_view("rides").unwrap(), T0, &riders, "another aggregation").await;
        let fewer = DEFS.replace("      - {name: city, dtype: string}\n", "");
        let defs: Definitions = parse_definitions(&fewer).unwrap();
        f.check_as(&defs, defs.find_view("rides").unwrap(), T0, &riders, "without `city`").await;
    }
}

/// A stream's cache read ahead of its first batch (`warm`): what it then gives is what
/// the table holds, for entities read ahead, ones with no events in the window, ones
/// that appear later, and a window that starts earlier than the one read ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_read_ahead_reads_what_the_table_holds() {
    let f = Fixture::new(EventCache::long_lived());
    let riders: Vec<Vec<KeyValue>> = (1..=4).map(|i| vec![KeyValue::Int(i)]).collect();
    f.append(events_at(&[(1, 10), (2, 20), (2, 30), (3, 5)]), AppendOptions::new(None)).await;
    f.cache.warm(&f.config, &f.defs, &f.view, T0 + 15 * MIN).await.unwrap();
    f.append(events_at(&[(4, 40), (1, 12), (2, 50)]), AppendOptions::new(None)).await;
    f.check(T0 + 15 * MIN, &riders, "from minute 15").await;
    f.check(T0, &riders, "from minute 0").await;
}
