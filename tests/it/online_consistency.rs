//! The invariant of docs/online.md, end to end: after materializing everything, the online answer
//! for entity `e` at time `now` equals the offline point-in-time answer for a spine row
//! `(e, now)` — values cell by cell, and a null offline exactly where the online status
//! is not PRESENT. Run against the embedded store and against the real Redis that
//! `./run test` starts. And materialization over several appends, against the latest
//! rows worked out here.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use quiver::Repo;
use quiver::offline::historical::{HistoricalOptions, SpineRows, historical, resolve};
use quiver::offline::schema::value_at;
use quiver::online::lookup::{Status, get_online_features};
use quiver::online::{EmbeddedStore, OnlineStore, RedisStore};
use quiver::runtime::encoding::{KeyValue, Value};
use quiver::sdk::{FeatureRef, Timestamp};

const HOUR_US: i64 = 3_600_000_000;

async fn check(store: Arc<dyn OnlineStore>) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("consistency");
    let now = chrono::Utc::now();
    quiver::init(&dir, true, now).unwrap();
    let repo = Repo::open(&dir).unwrap();
    let handle = tokio::runtime::Handle::current();
    let repo2 = repo.clone();
    tokio::task::spawn_blocking(move || repo2.apply(false, now, handle).unwrap()).await.unwrap();
    let defs = repo.applied().unwrap().registered();
    for view in &defs.feature_views {
        let file = dir.join(format!("sample_data/{}.parquet", view.name));
        quiver::offline::ingest::ingest(
            &repo.config.view_table(view),
            &defs,
            view,
            &file,
            repo.config.event_horizon(chrono::Utc::now().timestamp_micros()),
            &|_, _| {},
        )
        .await
        .unwrap();
    }
    let now_us = now.timestamp_micros();
    let reports = repo.materialize(Timestamp::MIN, now.into()).with_store(store.clone()).await.unwrap();
    assert_eq!(reports.len(), defs.feature_views.len());
    assert!(reports.iter().all(|r| r.entities > 0 && r.written == r.entities), "{reports:?}");
    // Materializing again writes the same rows again (equal replaces): idempotent.
    let again = repo.materialize(Timestamp::MIN, now.into()).with_store(store.clone()).await.unwrap();
    assert_eq!(again, reports);

    // Every driver x customer pair, plus unknown ones.
    let mut drivers = Vec::new();
    let mut customers = Vec::new();
    for d in 1000..=1011 {
        for c in 0..=21 {
            drivers.push(d);
            customers.push(format!("C{c:03}"));
        }
    }
    let refs: Vec<FeatureRef> =
        defs.feature_views.iter().flat_map(|v| v.served_features().into_iter().map(|f| FeatureRef::new(&v.name, &f.name))).collect();
    let mut seen_statuses = std::collections::BTreeSet::new();
    // At `now`, and three hours later, when the 2h-TTL view is out of date.
    for at in [now_us, now_us + 3 * HOUR_US] {
        let n = drivers.len();
        let spine = RecordBatch::try_from_iter([
            ("driver_id", Arc::new(Int64Array::from(drivers.clone())) as ArrayRef),
            ("customer_id", Arc::new(StringArray::from(customers.clone()))),
            ("event_timestamp", Arc::new(TimestampMicrosecondArray::from(vec![at; n]).with_timezone("UTC"))),
        ])
        .unwrap();
        let requests = resolve(&defs, &refs).unwrap();
        let offline = historical(
            &repo.config,
            &defs,
            SpineRows { source: "spine", rows: &spine },
            &requests,
            HistoricalOptions::default(),
            &quiver::gpu_join::CpuKernel::new(),
            &|_, _| {},
        )
        .await
        .unwrap();
        let entities = vec![
            ("driver_id".to_string(), drivers.iter().map(|&d| KeyValue::Int(d)).collect()),
            ("customer_id".to_string(), customers.iter().map(|c| KeyValue::Str(c.clone())).collect()),
        ];
        let online =
            get_online_features(store.as_ref(), &repo.config.project, &defs, &refs, (&entities, &Vec::new()), at, true).await.unwrap();
        assert_eq!(online.len(), 2 + refs.len());
        let mut present = 0;
        let mut aggregated = 0;
        for (k, r) in refs.iter().enumerate() {
            let column = &online[2 + k];
            assert_eq!(column.name, r.column_name());
            let view = defs.feature_view(&r.view).unwrap();
            let dtype = view.served_feature(&r.feature).unwrap().dtype;
            let off = offline.column(3 + k);
            for i in 0..n {
                let want = value_at(off.as_ref(), i, dtype);
                let (got, status) = (&column.values[i], column.statuses[i]);
                seen_statuses.insert(status.as_str());
                match status {
                    Status::Present => {
                        present += 1;
                        assert!(agrees(got, &want), "{r} row {i} at {at}: online {got:?}, offline {want:?}");
                        if view.is_event_log() && want != Value::Int64(0) {
                            aggregated += 1;
                        }
                    }
                    _ => {
                        assert_eq!(got, &Value::Null);
                        assert_eq!(want, Value::Null, "{r} row {i} at {at}: online {status:?}, offline has a value");
                    }
                }
            }
        }
        assert!(present > 500, "too few present values compared: {present}");
        if at == now_us {
            assert!(aggregated > 300, "too few aggregation values compared: {aggregated}");
        }
    }
    for s in ["PRESENT", "NOT_FOUND", "OUTSIDE_MAX_AGE"] {
        assert!(seen_statuses.contains(s), "status {s} never exercised: {seen_statuses:?}");
    }
}

/// Equal, or (docs/aggregations.md) floats within 1e-9 relative: an aggregation's float sums are
/// added in another order online (tile by tile) than offline.
fn agrees(online: &Value, offline: &Value) -> bool {
    match (online, offline) {
        (Value::Float64(a), Value::Float64(b)) => (a - b).abs() <= 1e-9 * a.abs().max(b.abs()),
        _ => online == offline,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_equals_offline_on_the_embedded_store() {
    let tmp = tempfile::tempdir().unwrap();
    check(Arc::new(EmbeddedStore::open(&tmp.path().join("online.db")).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_equals_offline_on_redis() {
    let Ok(url) = std::env::var("QUIVER_TEST_REDIS_URL") else {
        assert!(std::env::var("QUIVER_REQUIRE_REDIS").is_err(), "QUIVER_REQUIRE_REDIS is set but QUIVER_TEST_REDIS_URL is not");
        eprintln!("SKIPPED online_equals_offline_on_redis: no Redis (set QUIVER_TEST_REDIS_URL, or use ./run test)");
        return;
    };
    check(Arc::new(RedisStore::connect(&url).await.unwrap())).await;
}

/// Materialization over three appends — two of distinct drivers, a third repeating
/// every third driver with a row that ties on (event time, created time) and so wins by
/// ingestion order (even drivers), or is older and loses (odd drivers): the store ends
/// with each driver's latest row (docs/offline.md), and a second run writes the same rows
/// again. The store's guard keeps the later of two tied writes, so a tie must be
/// settled before anything is written.
async fn check_appends(store: Arc<dyn OnlineStore>) {
    use quiver::offline::ingest::{AppendOptions, append};
    const T0: i64 = 1_700_000_000_000_000;
    let tmp = tempfile::tempdir().unwrap();
    let project = format!("appends{}", std::process::id());
    std::fs::write(tmp.path().join("quiver.yaml"), format!("project: {project}\n")).unwrap();
    std::fs::write(
        tmp.path().join("features.yaml"),
        "entities:\n  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}\nfeature_views:\n  - name: v\n    entities: [driver]\n    \
         source: {created_timestamp_field: created}\n    features:\n      - {name: x, dtype: int64}\n",
    )
    .unwrap();
    let repo = Repo::open(tmp.path()).unwrap();
    let (applying, handle) = (repo.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || applying.apply(false, chrono::Utc::now(), handle).unwrap()).await.unwrap();
    let (config, defs) = (repo.config.clone(), repo.applied().unwrap().registered());
    let view = defs.feature_view("v").unwrap();
    let batch = |drivers: Vec<i64>, ts: &dyn Fn(i64) -> i64, x: &dyn Fn(i64) -> i64| {
        let time = |f: &dyn Fn(i64) -> i64| {
            Arc::new(TimestampMicrosecondArray::from(drivers.iter().map(|&d| f(d)).collect::<Vec<_>>()).with_timezone("UTC")) as ArrayRef
        };
        RecordBatch::try_from_iter([
            ("driver_id", Arc::new(Int64Array::from(drivers.clone())) as ArrayRef),
            ("event_timestamp", time(ts)),
            ("created", time(&|d| T0 + d % 5)),
            ("x", Arc::new(Int64Array::from(drivers.iter().map(|&d| x(d)).collect::<Vec<_>>()))),
        ])
        .unwrap()
    };
    let first_ts = |d: i64| T0 + (d % 7) * 1_000_000;
    let n = 6000;
    let appends = [
        batch((0..n / 2).collect(), &first_ts, &|d| 1000 + d),
        batch((n / 2..n).collect(), &first_ts, &|d| 2000 + d),
        batch((0..n).step_by(3).collect(), &|d| if d % 2 == 0 { first_ts(d) } else { first_ts(d) - 1 }, &|d| 3000 + d),
    ];
    for (i, rows) in appends.into_iter().enumerate() {
        append(&config.view_table(view), &defs, view, &format!("append {i}"), vec![rows], AppendOptions::new(None), &|_, _| {})
            .await
            .unwrap();
    }
    let expected = |d: i64| {
        if d % 3 == 0 && d % 2 == 0 {
            3000 + d
        } else if d < n / 2 {
            1000 + d
        } else {
            2000 + d
        }
    };

    for run in 0..2 {
        let reports = repo.materialize(Timestamp::MIN, Timestamp(i64::MAX)).with_store(store.clone()).await.unwrap();
        let report = &reports[0];
        assert_eq!((report.entities, report.written), (n as usize, n as usize), "run {run}: {report:?}");
        let refs = [FeatureRef::new("v", "x")];
        let entities = vec![("driver_id".to_string(), (0..n).map(KeyValue::Int).collect())];
        let online =
            get_online_features(store.as_ref(), &project, &defs, &refs, (&entities, &Vec::new()), T0 + 3_600_000_000, true).await.unwrap();
        let x = &online[1];
        for d in 0..n {
            assert_eq!(x.statuses[d as usize], Status::Present, "run {run}: driver {d}");
            assert_eq!(x.values[d as usize], Value::Int64(expected(d)), "run {run}: driver {d}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn materialization_keeps_the_latest_across_appends_on_the_embedded_store() {
    let tmp = tempfile::tempdir().unwrap();
    check_appends(Arc::new(EmbeddedStore::open(&tmp.path().join("online.db")).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn materialization_keeps_the_latest_across_appends_on_redis() {
    let Ok(url) = std::env::var("QUIVER_TEST_REDIS_URL") else {
        assert!(std::env::var("QUIVER_REQUIRE_REDIS").is_err(), "QUIVER_REQUIRE_REDIS is set but QUIVER_TEST_REDIS_URL is not");
        eprintln!(
            "SKIPPED materialization_keeps_the_latest_across_appends_on_redis: no Redis (set QUIVER_TEST_REDIS_URL, or use ./run test)"
        );
        return;
    };
    check_appends(Arc::new(RedisStore::connect(&url).await.unwrap())).await;
}
