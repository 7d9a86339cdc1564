//! The whole product in one run, on embedded defaults (local Delta tables, the embedded
//! online store): what `./run quickstart` runs.
//!
//!     cargo run --example quickstart [DIR]
//!
//! Creates the demo repository (drivers and riders with hourly, daily and pairwise
//! features), generates 30 days of data for 500 drivers and 2,000 riders, applies,
//! ingests, builds a point-in-time training set, materializes, starts the feature
//! server in-process (with the serving log on) and queries it over HTTP, pushes a fresh
//! event and sees it served, exports a reproducible training set, and checks that the
//! online and offline stores agree twice: by sampling entities, and by replaying every
//! logged answer through the offline join. Prints one timed line per step.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use quiver::Repo;
use quiver::ops::{Engine, Rows, Spine};
use quiver::sdk::Timestamp;

#[path = "common/mod.rs"]
mod common;
use common::{enable_serving_log, post, step};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "quickstart-demo".into()));
    let began = Instant::now();
    println!("quiver quick start in {}", dir.display());
    let now = chrono::Utc::now();
    let (repo, scale) = create(&dir, now).await?;
    let spine_path = dir.join("sample_data/spine.parquet");
    offline(&repo, &dir, &spine_path).await?;

    let t = Instant::now();
    let store: Arc<dyn quiver::online::OnlineStore> = repo.open_store().await?;
    let reports = repo.materialize_incremental(now.into()).with_store(store.clone()).await?;
    let written: usize = reports.iter().map(|r| r.written).sum();
    step("materialize", t, format!("{written} latest rows into the embedded online store"));

    let t = Instant::now();
    let serving_began = chrono::Utc::now().timestamp_micros();
    let server = repo.serve(([127, 0, 0, 1], 0).into()).with_store(store.clone()).with_serving_log(true).start().await?;
    let addr = server.addr();
    query(addr, &scale, t).await?;
    push_and_query(addr).await?;

    let t = Instant::now();
    let out = dir.join("training_set");
    let manifest = repo.export("ranker_v1", &spine_path, &out).with_shard_rows(25_000).with_engine(Engine::Cpu).await?.manifest;
    step(
        "export",
        t,
        format!("{} rows in {} shards, training set {}", manifest.rows, manifest.shards.len(), &manifest.training_set_id[..12]),
    );

    server.flush_log().await?;
    verify(&repo, store, serving_began).await?;
    println!(
        "done in {:.2} s: repository {}, training set {}, export {}",
        began.elapsed().as_secs_f64(),
        dir.display(),
        dir.join("training.parquet").display(),
        out.display()
    );
    Ok(())
}

/// `init --demo`, a month of sample data, `apply`.
async fn create(dir: &Path, now: chrono::DateTime<chrono::Utc>) -> anyhow::Result<(Repo, quiver::demo::Scale)> {
    let t = Instant::now();
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let files = quiver::init(dir, true, now)?;
    step("init --demo", t, format!("{} files: quiver.yaml, features.yaml, sample data", files.len()));

    let t = Instant::now();
    let scale = quiver::demo::Scale::MONTH;
    quiver::demo::write_sample_data_at(&dir.join(quiver::demo::SAMPLE_DIR), now, scale)?;
    // Log what the server answers, for `verify --since`.
    enable_serving_log(dir)?;
    step(
        "generate",
        t,
        format!("{} drivers and {} riders over 30 days, {} training requests", scale.drivers, scale.customers, scale.spine_rows),
    );

    let t = Instant::now();
    let repo = Repo::open(dir)?;
    let (repo2, handle) = (repo.clone(), tokio::runtime::Handle::current());
    let applied = tokio::task::spawn_blocking(move || repo2.apply(false, now, handle)).await??;
    let defs = repo.applied()?.definitions;
    step(
        "apply",
        t,
        format!(
            "registry version {}, {} feature views, {} Delta tables",
            applied.outcome.version,
            defs.feature_views.len(),
            applied.created_tables.len()
        ),
    );
    Ok((repo, scale))
}

/// `ingest` of every view, then the point-in-time training set.
async fn offline(repo: &Repo, dir: &Path, spine_path: &Path) -> anyhow::Result<()> {
    let t = Instant::now();
    let defs = repo.applied()?.definitions;
    let mut rows = 0;
    for view in &defs.feature_views {
        let file = dir.join(format!("sample_data/{}.parquet", view.name));
        rows += repo.ingest(&view.name, Rows::File(file)).await?.rows;
    }
    step("ingest", t, format!("{rows} rows into {} Delta tables", defs.feature_views.len()));

    let t = Instant::now();
    let training = repo
        .historical(Spine::File(spine_path.to_path_buf()))
        .with_service("ranker_v1")
        .with_engine(Engine::Cpu)
        .write_parquet(&dir.join("training.parquet"))
        .await?;
    step(
        "historical",
        t,
        format!("{} rows x {} features, point in time -> training.parquet", training.batch.num_rows(), training.refs.len()),
    );
    Ok(())
}

/// Ride requests as a ranking model sends them: one driver, ten candidate riders.
async fn query(addr: SocketAddr, scale: &quiver::demo::Scale, t: Instant) -> anyhow::Result<()> {
    let queries: Vec<String> = (0..200)
        .map(|i| {
            let riders: Vec<String> = (0..10).map(|j| format!("\"C{:03}\"", (i * 10 + j) % scale.customers + 1)).collect();
            format!(
                r#"{{"entities": {{"driver_id": [{}], "customer_id": [{}]}}, "feature_service": "ranker_v1"}}"#,
                std::iter::repeat_n((1001 + i as i64 % scale.drivers).to_string(), 10).collect::<Vec<_>>().join(","),
                riders.join(",")
            )
        })
        .collect();
    let (answer, mut latencies) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut latencies = Vec::new();
        let mut last = serde_json::Value::Null;
        for q in &queries {
            let sent = Instant::now();
            last = post(addr, "/get-online-features", q)?;
            latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
        }
        Ok((last, latencies))
    })
    .await??;
    latencies.sort_by(f64::total_cmp);
    step(
        "serve + query",
        t,
        format!(
            "http://{addr}: {} requests x 10 rows x {} features, p50 {:.2} ms (new connection each); conv_rate {}, rides_7d {}",
            latencies.len(),
            answer["metadata"]["feature_names"].as_array().map_or(0, |f| f.len() - 2),
            latencies[latencies.len() / 2],
            answer["results"][2]["values"][0],
            feature(&answer, "rides_7d")
        ),
    );
    Ok(())
}

/// A fresh event pushed to both stores, then served.
async fn push_and_query(addr: SocketAddr) -> anyhow::Result<()> {
    let t = Instant::now();
    // Event time now: every request before this push was answered before the event, so
    // the point-in-time join agrees with what was served then (an older event time would
    // make them disagree: the late arrival `verify --since` is there to catch).
    let fresh = chrono::Utc::now().to_rfc3339();
    let push = format!(
        r#"{{"feature_view": "driver_hourly", "to": "online_and_offline", "df": {{"driver_id": [1001], "event_timestamp": ["{fresh}"], "created_timestamp": ["{fresh}"], "conv_rate": [0.99], "acc_rate": [0.5], "avg_daily_trips": [42]}}}}"#
    );
    let pushed = tokio::task::spawn_blocking(move || post(addr, "/push", &push)).await??;
    let one = r#"{"entities": {"driver_id": [1001]}, "features": ["driver_hourly:conv_rate"]}"#;
    let after = tokio::task::spawn_blocking(move || post(addr, "/get-online-features", one)).await??;
    anyhow::ensure!(after["results"][1]["values"][0] == 0.99, "the pushed value is not served: {after}");
    step(
        "push + query",
        t,
        format!("served {} right after the push (Delta version {})", after["results"][1]["values"][0], pushed["offline_version"]),
    );

    // A ride event for an event log: its windows count it as soon as it is pushed.
    let t = Instant::now();
    let count = r#"{"entities": {"customer_id": ["C001"]}, "features": ["customer_rides:rides_7d", "customer_rides:last_cities"]}"#;
    let before = tokio::task::spawn_blocking(move || post(addr, "/get-online-features", count)).await??;
    // Dated after the request above, which was rightly answered without it.
    let fresh = chrono::Utc::now().to_rfc3339();
    let ride = format!(
        r#"{{"feature_view": "customer_rides", "df": {{"customer_id": ["C001"], "event_timestamp": ["{fresh}"], "created_timestamp": ["{fresh}"], "fare": [12.5], "minutes": [14], "city": ["Quickstart"]}}}}"#
    );
    tokio::task::spawn_blocking(move || post(addr, "/push", &ride)).await??;
    let after = tokio::task::spawn_blocking(move || post(addr, "/get-online-features", count)).await??;
    let (n0, n1) = (before["results"][1]["values"][0].as_i64(), after["results"][1]["values"][0].as_i64());
    anyhow::ensure!(n1 == n0.map(|n| n + 1), "the pushed ride is not counted: {before} then {after}");
    step(
        "push an event",
        t,
        format!(
            "customer_rides:rides_7d of C001 {} -> {}, last_cities {}",
            n0.unwrap_or(0),
            n1.unwrap_or(0),
            after["results"][2]["values"][0]
        ),
    );
    Ok(())
}

/// The value of `name` for the first entity row of a Feast-shaped answer.
fn feature<'a>(answer: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let names = answer["metadata"]["feature_names"].as_array();
    let at = names.and_then(|n| n.iter().position(|f| f.as_str().is_some_and(|f| f.ends_with(name))));
    at.map_or(&serde_json::Value::Null, |i| &answer["results"][i]["values"][0])
}

/// Online and offline agree: every logged answer replayed, then sampled entities.
async fn verify(repo: &Repo, store: Arc<dyn quiver::online::OnlineStore>, serving_began: i64) -> anyhow::Result<()> {
    let t = Instant::now();
    // Every logged answer, replayed through the offline join at its request time.
    let replayed = repo.verify_log(Timestamp(serving_began), Timestamp::now()).await?;
    let compared: u64 = replayed.features.iter().map(|r| r.compared).sum();
    let bad: u64 = replayed.features.iter().map(|r| r.mismatches + r.missing_online + r.missing_offline).sum();
    step(
        "verify --since",
        t,
        format!("{} logged requests replayed offline: {compared} values compared, {bad} disagree", replayed.requests),
    );
    anyhow::ensure!(bad == 0 && compared > 0, "online and offline disagree on {bad} of {compared} served values");

    let t = Instant::now();
    // The pushed row is offline too; materialize what arrived, then compare.
    let check_now = chrono::Utc::now().timestamp_micros();
    repo.materialize_incremental(Timestamp(check_now)).with_store(store.clone()).await?;
    let verified = repo.verify_sample(1000).at(Timestamp(check_now)).with_store(store).await?;
    let compared: u64 = verified.iter().map(|r| r.compared).sum();
    let bad: u64 = verified.iter().map(|r| r.mismatches + r.missing_online).sum();
    step("verify --sample", t, format!("1000 entities per view sampled: {compared} values compared online vs offline, {bad} disagree"));
    anyhow::ensure!(bad == 0, "online and offline disagree on {bad} values");
    Ok(())
}
