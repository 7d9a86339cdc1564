//! One suite, every online store: the embedded store always, Redis when the test script
//! started one (`QUIVER_TEST_REDIS_URL`), a Redis Cluster likewise
//! (`QUIVER_TEST_REDIS_CLUSTER_URLS`). With `QUIVER_REQUIRE_REDIS=1` (set by `./run
//! test`) a missing one fails the suite instead of skipping it.

use std::sync::Arc;

use quiver_online::{EmbeddedStore, OnlineStore, RedisClusterStore, RedisStore, WriteRow};
use quiver_runtime::encoding::{KeyValue, OnlineRow, Value, store_key};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn packed(event_ts: i64, created_ts: i64, v: i64) -> Vec<u8> {
    OnlineRow { event_ts, created_ts, fingerprint: 7, values: vec![Value::Int64(v), Value::String(format!("v{v}"))] }.encode()
}

fn value_of(bytes: &Option<Vec<u8>>) -> Option<i64> {
    bytes.as_ref().map(|b| match OnlineRow::decode(b).unwrap().values[0] {
        Value::Int64(v) => v,
        ref other => panic!("{other:?}"),
    })
}

fn row(key: &str, event_ts: i64, created_ts: i64, v: i64) -> WriteRow {
    WriteRow { key: key.to_string(), row: packed(event_ts, created_ts, v), expire_at_ms: None }
}

/// A prefix no other test run shares, so runs against one Redis do not collide.
fn prefix(store: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("test{}{store}", nanos)
}

async fn round_trip_and_missing(store: &dyn OnlineStore, p: &str) {
    let k = |i: i64| store_key(p, "v", &[KeyValue::Int(i)]);
    assert_eq!(store.read(&[k(1)]).await.unwrap(), vec![None]);
    assert_eq!(store.write(&[row(&k(1), 10, 0, 100), row(&k(3), 10, 0, 300)]).await.unwrap(), 2);
    let got = store.read(&[k(3), k(2), k(1)]).await.unwrap();
    assert_eq!(got.iter().map(value_of).collect::<Vec<_>>(), [Some(300), None, Some(100)]);
    assert_eq!(got[0].as_deref(), Some(packed(10, 0, 300).as_slice()), "bytes come back as written");
    assert!(store.read(&[]).await.unwrap().is_empty());
}

async fn guarded_write_rules(store: &dyn OnlineStore, p: &str) {
    let k = store_key(p, "v", &[KeyValue::Str("e".into())]);
    assert_eq!(store.write(&[row(&k, 100, 5, 1)]).await.unwrap(), 1);
    // Older event time: ignored.
    assert_eq!(store.write(&[row(&k, 99, 50, 2)]).await.unwrap(), 0);
    // Same event time, older created time: ignored.
    assert_eq!(store.write(&[row(&k, 100, 4, 3)]).await.unwrap(), 0);
    assert_eq!(value_of(&store.read(std::slice::from_ref(&k)).await.unwrap()[0]), Some(1));
    // Equal (event, created): replaces.
    assert_eq!(store.write(&[row(&k, 100, 5, 4)]).await.unwrap(), 1);
    assert_eq!(value_of(&store.read(std::slice::from_ref(&k)).await.unwrap()[0]), Some(4));
    // Same event time, newer created time: replaces; newer event time: replaces.
    assert_eq!(store.write(&[row(&k, 100, 6, 5)]).await.unwrap(), 1);
    assert_eq!(store.write(&[row(&k, 101, -1, 6)]).await.unwrap(), 1);
    assert_eq!(value_of(&store.read(std::slice::from_ref(&k)).await.unwrap()[0]), Some(6));
    // Negative (pre-1970) times order correctly too.
    let k2 = store_key(p, "v", &[KeyValue::Int(-1)]);
    store.write(&[row(&k2, -5, 0, 1)]).await.unwrap();
    assert_eq!(store.write(&[row(&k2, -6, 0, 2)]).await.unwrap(), 0);
    assert_eq!(store.write(&[row(&k2, 0, 0, 3)]).await.unwrap(), 1);
    // Within one batch, later rows of the same key are checked against earlier ones.
    let k3 = store_key(p, "batch", &[KeyValue::Int(3)]);
    let n = store.write(&[row(&k3, 5, 0, 1), row(&k3, 4, 0, 2), row(&k3, 6, 0, 3)]).await.unwrap();
    assert_eq!(n, 2);
    assert_eq!(value_of(&store.read(&[k3]).await.unwrap()[0]), Some(3));
}

/// Random versions, written in random order in random batches: the newest wins.
async fn out_of_order_writes(store: &dyn OnlineStore, p: &str) {
    let mut rng = StdRng::seed_from_u64(5);
    let keys: Vec<String> = (0..50).map(|i| store_key(p, "w", &[KeyValue::Int(i)])).collect();
    let mut rows = Vec::new();
    let mut best = vec![(i64::MIN, i64::MIN, 0i64); keys.len()];
    for (i, k) in keys.iter().enumerate() {
        for _ in 0..20 {
            let (e, c) = (rng.random_range(0..10), rng.random_range(0..3));
            let v = rng.random_range(0..1_000_000);
            rows.push((i, row(k, e, c, v)));
        }
    }
    rows.shuffle(&mut rng);
    // The expected winner: the greatest (event, created); among equals the last written
    // (rows are written in this order below).
    for (i, r) in &rows {
        let decoded = OnlineRow::decode(&r.row).unwrap();
        let Value::Int64(v) = decoded.values[0] else { unreachable!() };
        let cand = (decoded.event_ts, decoded.created_ts, v);
        if (cand.0, cand.1) >= (best[*i].0, best[*i].1) {
            best[*i] = cand;
        }
    }
    let mut at = 0;
    while at < rows.len() {
        let n = rng.random_range(1..200).min(rows.len() - at);
        let batch: Vec<WriteRow> = rows[at..at + n].iter().map(|(_, r)| r.clone()).collect();
        store.write(&batch).await.unwrap();
        at += n;
    }
    let got = store.read(&keys).await.unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(value_of(g), Some(best[i].2), "key {i}");
    }
}

/// Several writers at once on the same keys: nobody regresses a value.
async fn concurrent_writers(store: Arc<dyn OnlineStore>, p: &str) {
    let keys: Vec<String> = (0..20).map(|i| store_key(p, "c", &[KeyValue::Int(i)])).collect();
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (store, keys) = (store.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(w);
            for _ in 0..30 {
                let batch: Vec<WriteRow> = keys
                    .iter()
                    .map(|k| {
                        let e = rng.random_range(0..1000);
                        row(k, e, 0, e * 10 + w as i64)
                    })
                    .collect();
                store.write(&batch).await.unwrap();
            }
        }));
    }
    // Meanwhile the newest row of every key is written once; no writer may undo it.
    let top: Vec<WriteRow> = keys.iter().map(|k| row(k, 5000, 0, -1)).collect();
    store.write(&top).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let got = store.read(&keys).await.unwrap();
    assert!(got.iter().all(|g| value_of(g) == Some(-1)), "a newer row was overwritten");
}

async fn expiry(store: &dyn OnlineStore, p: &str) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let (gone, kept) = (store_key(p, "x", &[KeyValue::Int(1)]), store_key(p, "x", &[KeyValue::Int(2)]));
    let rows = [
        WriteRow { key: gone.clone(), row: packed(1, 0, 1), expire_at_ms: Some(now - 1000) },
        WriteRow { key: kept.clone(), row: packed(1, 0, 2), expire_at_ms: Some(now + 600_000) },
    ];
    store.write(&rows).await.unwrap();
    let got = store.read(&[gone.clone(), kept]).await.unwrap();
    assert_eq!(got.iter().map(value_of).collect::<Vec<_>>(), [None, Some(2)]);
    // An expired row does not guard: an older row may take its place.
    assert_eq!(store.write(&[row(&gone, 0, 0, 9)]).await.unwrap(), 1);
    assert_eq!(value_of(&store.read(&[gone]).await.unwrap()[0]), Some(9));
}

/// A stored row dated after the store's clock plus `max_future_skew` (written before
/// writers refused such rows, or by a writer whose clock was far off) never blocks its
/// key: the next write replaces it. Rows within the skew still guard as usual.
async fn future_rows_never_block(store: &dyn OnlineStore, p: &str) {
    let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as i64;
    let k = store_key(p, "future", &[KeyValue::Int(1)]);
    let year_9999 = 253_402_300_799_000_000;
    assert_eq!(store.write(&[row(&k, year_9999, 0, 1)]).await.unwrap(), 1);
    assert_eq!(store.write(&[row(&k, now_us, 0, 2)]).await.unwrap(), 1, "a real update replaces the year-9999 row");
    assert_eq!(value_of(&store.read(std::slice::from_ref(&k)).await.unwrap()[0]), Some(2));
    // A minute ahead is within the default 5 minutes: it guards.
    let k2 = store_key(p, "future", &[KeyValue::Int(2)]);
    store.write(&[row(&k2, now_us + 60_000_000, 0, 1)]).await.unwrap();
    assert_eq!(store.write(&[row(&k2, now_us, 0, 2)]).await.unwrap(), 0);
    assert_eq!(value_of(&store.read(&[k2]).await.unwrap()[0]), Some(1));
}

/// Rows dated before 1970 of a view with a TTL have long expired: both stores read
/// them as absent (Redis used to keep such keys forever: a negative expiry was taken
/// for none), and the expiry [`quiver_runtime::encoding::expire_at_ms`] gives is never 0.
async fn rows_before_1970_expire(store: &dyn OnlineStore, p: &str) {
    let view = quiver_sdk::FeatureView::new("old").with_feature("a", quiver_sdk::DType::Int64).with_ttl(quiver_sdk::Ttl::from_secs(3600));
    let k = store_key(p, "old", &[KeyValue::Int(1)]);
    let event_ts = -86_400_000_000 * 30; // 1969-12-02
    let expire_at_ms = quiver_runtime::encoding::expire_at_ms(&view, event_ts);
    assert!(expire_at_ms.is_some_and(|at| at > 0));
    store.write(&[WriteRow { key: k.clone(), row: packed(event_ts, 0, 1), expire_at_ms }]).await.unwrap();
    assert_eq!(store.read(&[k]).await.unwrap(), vec![None]);
    // Without a TTL a row from 1969 stays, in both stores.
    let kept = store_key(p, "old", &[KeyValue::Int(2)]);
    store.write(&[WriteRow { key: kept.clone(), row: packed(event_ts, 0, 2), expire_at_ms: None }]).await.unwrap();
    assert_eq!(value_of(&store.read(&[kept]).await.unwrap()[0]), Some(2));
}

async fn large_batches(store: &dyn OnlineStore, p: &str) {
    let keys: Vec<String> = (0..25_000).map(|i| store_key(p, "big", &[KeyValue::Int(i)])).collect();
    let rows: Vec<WriteRow> = keys.iter().enumerate().map(|(i, k)| row(k, 1, 0, i as i64)).collect();
    assert_eq!(store.write(&rows).await.unwrap(), keys.len());
    let got = store.read(&keys).await.unwrap();
    assert!(got.iter().enumerate().all(|(i, g)| value_of(g) == Some(i as i64)));
}

/// Batches mixing absent keys, stored keys and a key given several times (the Redis
/// store writes absent keys with `SET NX` and sends only the stored ones through the
/// guarded script): the same answers as one guarded write per row, in order.
async fn absent_and_stored_keys_in_one_batch(store: &dyn OnlineStore, p: &str) {
    let k = |name: &str| store_key(p, "mixed", &[KeyValue::Str(name.into())]);
    let (a, b, c, d, e) = (k("a"), k("b"), k("c"), k("d"), k("e"));
    let n = store.write(&[row(&a, 5, 0, 1), row(&a, 4, 0, 2), row(&a, 6, 0, 3), row(&b, 1, 0, 4)]).await.unwrap();
    assert_eq!(n, 3, "a at 5, a at 6 over it, b; not a at 4");
    let n = store.write(&[row(&a, 7, 0, 5), row(&c, 1, 0, 6), row(&a, 3, 0, 7), row(&d, 1, 0, 8), row(&e, 1, 0, 9)]).await.unwrap();
    assert_eq!(n, 4, "a at 7 and c, d, e; not a at 3");
    let got = store.read(&[a, b, c, d, e]).await.unwrap();
    assert_eq!(got.iter().map(value_of).collect::<Vec<_>>(), [Some(5), Some(4), Some(6), Some(8), Some(9)]);
}

/// A view version's keys are counted and removed by their prefix, and nothing else:
/// not the keys of another version of the view, nor of a view whose name the first's
/// prefix starts.
async fn keys_by_prefix(store: &dyn OnlineStore, p: &str) {
    let rows = |view: &str, n: i64| (0..n).map(|i| row(&store_key(p, view, &[KeyValue::Int(i)]), 1, 0, i)).collect::<Vec<_>>();
    store.write(&rows("stats", 40)).await.unwrap();
    store.write(&rows("stats@2", 25)).await.unwrap();
    store.write(&rows("stats2", 3)).await.unwrap();
    let prefix = |view: &str| format!("quiver:{p}:{view}:");
    assert_eq!(store.keys_with_prefix(&prefix("stats@2"), false).await.unwrap(), 25);
    assert_eq!(store.keys_with_prefix(&prefix("stats"), false).await.unwrap(), 40);
    assert_eq!(store.keys_with_prefix(&prefix("stats@2"), true).await.unwrap(), 25);
    assert_eq!(store.keys_with_prefix(&prefix("stats@2"), false).await.unwrap(), 0);
    let kept = store.read(&[store_key(p, "stats", &[KeyValue::Int(7)]), store_key(p, "stats2", &[KeyValue::Int(2)])]).await.unwrap();
    assert_eq!(kept.iter().map(value_of).collect::<Vec<_>>(), [Some(7), Some(2)], "other versions and views are kept");
    assert_eq!(store.read(&[store_key(p, "stats@2", &[KeyValue::Int(3)])]).await.unwrap(), [None]);
}

async fn suite(store: Arc<dyn OnlineStore>, name: &str) {
    let p = prefix(name);
    keys_by_prefix(store.as_ref(), &p).await;
    absent_and_stored_keys_in_one_batch(store.as_ref(), &p).await;
    round_trip_and_missing(store.as_ref(), &p).await;
    guarded_write_rules(store.as_ref(), &p).await;
    out_of_order_writes(store.as_ref(), &p).await;
    concurrent_writers(store.clone(), &p).await;
    expiry(store.as_ref(), &p).await;
    future_rows_never_block(store.as_ref(), &p).await;
    rows_before_1970_expire(store.as_ref(), &p).await;
    large_batches(store.as_ref(), &p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("online.db")).unwrap();
    suite(Arc::new(store), "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_passes_the_suite() {
    let Ok(url) = std::env::var("QUIVER_TEST_REDIS_URL") else {
        assert!(std::env::var("QUIVER_REQUIRE_REDIS").is_err(), "QUIVER_REQUIRE_REDIS is set but QUIVER_TEST_REDIS_URL is not");
        eprintln!("SKIPPED redis_store_passes_the_suite: no Redis (set QUIVER_TEST_REDIS_URL, or use ./run test)");
        return;
    };
    let store = RedisStore::connect(&url).await.unwrap();
    suite(Arc::new(store), "redis").await;
}

/// The test cluster's seed nodes (`QUIVER_TEST_REDIS_CLUSTER_URLS`, comma separated).
fn cluster_urls(test: &str) -> Option<Vec<String>> {
    match std::env::var("QUIVER_TEST_REDIS_CLUSTER_URLS") {
        Ok(urls) => Some(urls.split(',').map(str::to_string).collect()),
        Err(_) => {
            assert!(
                std::env::var("QUIVER_REQUIRE_REDIS").is_err(),
                "QUIVER_REQUIRE_REDIS is set but QUIVER_TEST_REDIS_CLUSTER_URLS is not"
            );
            eprintln!("SKIPPED {test}: no Redis Cluster (set QUIVER_TEST_REDIS_CLUSTER_URLS, or use ./run test)");
            None
        }
    }
}

/// Every node's key count.
async fn keys_per_node(urls: &[String]) -> Vec<i64> {
    let mut counts = Vec::new();
    for url in urls {
        let mut conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
        counts.push(redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap());
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_store_passes_the_suite() {
    let Some(urls) = cluster_urls("redis_cluster_store_passes_the_suite") else { return };
    for acks in [0, 1] {
        let store = RedisClusterStore::connect(&urls, acks).await.unwrap();
        suite(Arc::new(store), &format!("cluster{acks}")).await;
    }
    // The suite's keys spread over every master (and so every replica): reads and writes
    // really crossed nodes.
    let counts = keys_per_node(&urls).await;
    assert!(counts.iter().all(|&n| n > 1000), "keys per node: {counts:?}");
}

#[tokio::test]
async fn an_unreachable_redis_fails_fast_with_a_clear_error() {
    // Port 1 on loopback: nothing listens there.
    let started = std::time::Instant::now();
    let err = RedisStore::connect("redis://127.0.0.1:1/0").await.unwrap_err().to_string();
    assert!(err.starts_with("online store redis://127.0.0.1:1/0: "), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
}
