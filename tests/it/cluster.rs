//! `quiver cluster scheduler` and `quiver cluster executor` as separate processes on
//! loopback (docs/settings.md): the executors register, a query from a Ballista client runs on
//! both and answers as DataFusion does locally; `historical` and `export` with
//! `--cluster` write the local join's bytes, with tasks on both executors; an executor
//! killed mid-join never yields a wrong answer.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, Int64Array};

use crate::common;

/// A `quiver cluster ...` process, its output collected in a file; killed on drop.
struct Node {
    child: Child,
    log: std::path::PathBuf,
}

impl Node {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Node {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("QUIVER_")) {
            cmd.env_remove(k);
        }
        let child = cmd
            .current_dir(dir)
            .env("QUIVER_LOG", "warn,ballista_executor=info")
            .arg("cluster")
            .args(args)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Node { child, log }
    }

    fn log(&self) -> String {
        let mut text = String::new();
        std::fs::File::open(&self.log).unwrap().read_to_string(&mut text).unwrap();
        text
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct free ports: the listeners are all held until every port is chosen, so
/// the system cannot hand out one twice.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// A scheduler and `n` executors (2 task slots each), registered.
struct Cluster {
    scheduler: Node,
    executors: Vec<Node>,
    port: u16,
}

impl Cluster {
    /// `fast_failover`: heartbeats every second and an executor lost after 6 s without
    /// one (the defaults are 60 s and 180 s).
    fn start(dir: &Path, n: usize, fast_failover: bool) -> Cluster {
        // The scheduler's port and each executor's two, all distinct.
        let ports = free_ports(1 + 2 * n);
        let port = ports[0];
        let mut args = vec!["scheduler".to_string(), "--port".into(), port.to_string()];
        if fast_failover {
            args.extend(["--executor-timeout".into(), "6".into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let scheduler = Node::start(dir, "scheduler", &args);
        wait_listening(port, &scheduler);
        let executors: Vec<Node> = (0..n)
            .map(|i| {
                let (flight, grpc) = (ports[1 + 2 * i], ports[2 + 2 * i]);
                let name = format!("executor{i}");
                let work = dir.join(&name);
                std::fs::create_dir_all(&work).unwrap();
                let mut args: Vec<String> = [
                    "executor",
                    "--scheduler",
                    &format!("127.0.0.1:{port}"),
                    "--port",
                    &flight.to_string(),
                    "--grpc-port",
                    &grpc.to_string(),
                    "--concurrency",
                    "2",
                    "--work-dir",
                    work.to_str().unwrap(),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if fast_failover {
                    args.extend(["--heartbeat-interval".into(), "1".into()]);
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Node::start(dir, &name, &args)
            })
            .collect();
        let began = Instant::now();
        while !executors.iter().all(|e| e.log().contains("registration succeed") || e.log().contains("Starting poll work loop")) {
            let logs: Vec<String> = executors.iter().map(Node::log).collect();
            assert!(began.elapsed() < Duration::from_secs(60), "executors did not register:\n{}", logs.join("\n"));
            std::thread::sleep(Duration::from_millis(100));
        }
        Cluster { scheduler, executors, port }
    }

    fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    /// The tasks each executor logged so far.
    fn tasks(&self) -> Vec<usize> {
        self.executors.iter().map(|e| e.log().matches("Received task").count() + e.log().matches("Execute task").count()).collect()
    }

    fn logs(&self) -> String {
        std::iter::once(&self.scheduler).chain(&self.executors).map(Node::log).collect::<Vec<_>>().join("\n----\n")
    }
}

/// The demo repository (int, string and composite keys, TTLs, created times, a list
/// feature, an event log with windowed aggregations), its sample data ingested.
fn demo(parent: &Path) -> std::path::PathBuf {
    assert!(common::quiver(parent, &["init", "repo", "--demo"], &[]).status.success());
    let dir = parent.join("repo");
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    std::fs::write(dir.join("features.yaml"), format!("{yaml}{DERIVED}")).unwrap();
    common::ok(&dir, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        common::ok(&dir, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    dir
}

/// On-demand features over the demo's views (no request fields: the sample spine has none).
const DERIVED: &str = r#"
on_demand_views:
  - name: derived
    inputs: [driver_hourly, customer_profile, customer_rides]
    features:
      - {name: conv_x_acc, dtype: float64, expr: "driver_hourly.conv_rate * driver_hourly.acc_rate"}
      - {name: fare_per_ride, dtype: float64, expr: "customer_rides.fare_sum_1h / customer_rides.rides_7d"}
      - {name: profile_age_h, dtype: float64, expr: "date_part('epoch', request_time - customer_profile.event_timestamp) / 3600"}
"#;

/// Every feature of the demo, aggregations and on-demand features included.
const ALL: &str = "driver_hourly:conv_rate,driver_hourly:acc_rate,driver_hourly:avg_daily_trips,\
customer_profile:age,customer_profile:city,customer_profile:lifetime_value,customer_profile:embedding,\
driver_customer:rides_together,driver_customer:avg_rating,customer_rides:fare_sum_1h,customer_rides:rides_7d,\
customer_rides:minutes_min_30m,customer_rides:fare_avg_1d,customer_rides:last_cities,\
derived:conv_x_acc,derived:fare_per_ride,derived:profile_age_h";

/// The sample spine repeated `times` times, each copy a minute later than the last.
fn big_spine(dir: &Path, times: usize) {
    use arrow::array::{AsArray, TimestampMicrosecondArray};
    use arrow::datatypes::TimestampMicrosecondType;
    use std::sync::Arc;
    let file = std::fs::File::open(dir.join("sample_data/spine.parquet")).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(file, 1 << 20).unwrap();
    let batches: Vec<_> = reader.map(Result::unwrap).collect();
    let spine = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let at = spine.schema().index_of("event_timestamp").unwrap();
    let copies: Vec<_> = (0..times)
        .map(|k| {
            let ts = spine.column(at).as_primitive::<TimestampMicrosecondType>();
            let shifted: TimestampMicrosecondArray = ts.iter().map(|t| t.map(|t| t + k as i64 * 60_000_000)).collect();
            let mut columns = spine.columns().to_vec();
            columns[at] = Arc::new(shifted.with_timezone_opt(ts.timezone()));
            arrow::array::RecordBatch::try_new(spine.schema(), columns).unwrap()
        })
        .collect();
    let out = std::fs::File::create(dir.join("big_spine.parquet")).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(out, spine.schema(), None).unwrap();
    for c in &copies {
        w.write(c).unwrap();
    }
    w.close().unwrap();
}

#[test]
fn historical_and_export_on_the_cluster_write_the_local_joins_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = demo(tmp.path());
    let cluster = Cluster::start(tmp.path(), 2, false);
    let url = cluster.url();
    for (name, extra) in [("plain", vec![]), ("cutoff", vec!["--created-cutoff"])] {
        let local = format!("{name}-local.parquet");
        let mut args = vec!["historical", "--spine", "sample_data/spine.parquet", "--features", ALL, "--out", &local];
        args.extend(extra.iter().copied());
        common::ok(&dir, &args);
        for cluster_url in [url.clone(), format!("{url}?partitions=3")] {
            let remote = format!("{name}-cluster.parquet");
            let mut args = vec!["historical", "--spine", "sample_data/spine.parquet", "--features", ALL, "--out", &remote];
            args.extend(extra.iter().copied());
            args.extend(["--cluster", &cluster_url]);
            let out = common::ok(&dir, &args);
            assert!(out.contains("500 rows x 17 features"), "{out}");
            assert!(
                std::fs::read(dir.join(&remote)).unwrap() == std::fs::read(dir.join(&local)).unwrap(),
                "{name} join on {cluster_url}: the Parquet bytes differ from the local join's"
            );
        }
    }
    let tasks = cluster.tasks();
    eprintln!("tasks per executor: {tasks:?}");
    assert!(tasks.iter().all(|&n| n > 0), "tasks per executor: {tasks:?}\n{}", cluster.logs());
    // The staged spines are gone.
    let staging = dir.join("data/_quiver_cluster");
    assert!(!staging.exists() || std::fs::read_dir(&staging).unwrap().next().is_none(), "staged spines left behind");

    // export: the same shards (by SHA-256) as the local export, and --reproduce on the
    // cluster checks them.
    common::ok(
        &dir,
        &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "set-local", "--shard-rows", "200"],
    );
    let out = common::ok(
        &dir,
        &[
            "export",
            "--service",
            "ranker_v1",
            "--spine",
            "sample_data/spine.parquet",
            "--out",
            "set-cluster",
            "--shard-rows",
            "200",
            "--cluster",
            &url,
        ],
    );
    assert!(out.contains("500 rows in 3 shards"), "{out}");
    let shards = |set: &str| {
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(set).join("manifest.json")).unwrap()).unwrap();
        (m["training_set_id"].clone(), m["shards"].clone())
    };
    assert_eq!(shards("set-cluster"), shards("set-local"), "the cluster export's shards");
    let again = common::ok(&dir, &["export", "--reproduce", "set-local/manifest.json", "--out", "again", "--cluster", &url]);
    assert!(again.contains("every shard identical to the manifest"), "{again}");

    // Bad addresses: one line, nothing written.
    let closed = free_port();
    let bad = [
        (
            format!("df://127.0.0.1:{closed}"),
            format!("cluster df://127.0.0.1:{closed}: no scheduler answers at 127.0.0.1:{closed} (connection refused)"),
        ),
        ("http://127.0.0.1:1".to_string(), "--cluster `http://127.0.0.1:1`: not a df:// address".to_string()),
        (format!("{url}?partitions=0"), "partitions must be 1 to 4096".to_string()),
    ];
    for (address, expected) in &bad {
        let args = ["historical", "--spine", "sample_data/spine.parquet", "--service", "ranker_v1", "--out", "bad.parquet"];
        let mut args = args.to_vec();
        args.extend(["--cluster", address.as_str()]);
        // No scheduler there is a cluster that cannot be reached (exit 3); the others are refused (1).
        let code = if address.starts_with("df://127.0.0.1") && !address.contains('?') { 3 } else { 1 };
        eprintln!("{}", common::fails_with(&dir, &args, code, &[expected.as_str()]));
    }
    assert!(!dir.join("bad.parquet").exists());
}

#[test]
fn the_cluster_joins_tables_on_s3_as_the_local_join_does() {
    let test = "the_cluster_joins_tables_on_s3_as_the_local_join_does";
    let Some(common::S3 { section, .. }) = common::s3_offline_store(test, &common::unique("cluster")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    assert!(common::quiver(tmp.path(), &["init", "repo", "--demo"], &[]).status.success());
    let dir = tmp.path().join("repo");
    let config = std::fs::read_to_string(dir.join("quiver.yaml")).unwrap();
    let at = config.lines().position(|l| l.starts_with("offline_store:")).unwrap();
    let mut lines: Vec<&str> = config.lines().collect();
    lines.splice(at..at + 2, section.lines());
    std::fs::write(dir.join("quiver.yaml"), lines.join("\n")).unwrap();
    let yaml = std::fs::read_to_string(dir.join("features.yaml")).unwrap();
    std::fs::write(dir.join("features.yaml"), format!("{yaml}{DERIVED}")).unwrap();
    common::ok(&dir, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        common::ok(&dir, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    let cluster = Cluster::start(tmp.path(), 2, false);
    common::ok(&dir, &["historical", "--spine", "sample_data/spine.parquet", "--features", ALL, "--out", "local.parquet"]);
    common::ok(
        &dir,
        &["historical", "--spine", "sample_data/spine.parquet", "--features", ALL, "--out", "cluster.parquet", "--cluster", &cluster.url()],
    );
    assert!(
        std::fs::read(dir.join("cluster.parquet")).unwrap() == std::fs::read(dir.join("local.parquet")).unwrap(),
        "the cluster's join of S3 tables differs from the local join's"
    );
    assert!(!dir.join("data").exists(), "something was staged locally");
    // The storage options reach the executors inside the plan, never their logs.
    let hex: String = "quiver-secret".bytes().map(|b| format!("{b:02x}")).collect();
    let logs = cluster.logs();
    assert!(!logs.contains("quiver-secret") && !logs.contains(&hex), "a secret in the cluster's logs");
}

#[test]
fn an_executor_killed_mid_join_never_yields_a_wrong_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = demo(tmp.path());
    big_spine(&dir, 400);
    common::ok(&dir, &["historical", "--spine", "big_spine.parquet", "--features", ALL, "--out", "local.parquet"]);
    let mut cluster = Cluster::start(tmp.path(), 2, true);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("QUIVER_")) {
        cmd.env_remove(k);
    }
    let url = format!("{}?partitions=16", cluster.url());
    let mut join = cmd
        .current_dir(&dir)
        .args(["historical", "--spine", "big_spine.parquet", "--features", ALL, "--out", "cluster.parquet", "--cluster", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill executor 0 once it has begun the job's tasks.
    let began = Instant::now();
    while cluster.tasks()[0] == 0 && join.try_wait().unwrap().is_none() {
        assert!(began.elapsed() < Duration::from_secs(120), "no task reached executor 0:\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(join.try_wait().unwrap().is_none(), "the join ended before executor 0 took a task: the kill tests nothing");
    let killed = cluster.executors.remove(0);
    drop(killed);
    let began = Instant::now();
    eprintln!("executor 0 killed");
    let status = loop {
        if let Some(status) = join.try_wait().unwrap() {
            break status;
        }
        if began.elapsed() > Duration::from_secs(240) {
            let _ = join.kill();
            panic!("the join neither finished nor failed 240 s after the kill:\n{}", cluster.logs());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = join.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if status.success() {
        eprintln!("the join completed on the surviving executor, {:.1} s after the kill", began.elapsed().as_secs_f64());
        assert!(
            std::fs::read(dir.join("cluster.parquet")).unwrap() == std::fs::read(dir.join("local.parquet")).unwrap(),
            "after the kill the cluster's answer differs from the local join's"
        );
    } else {
        eprintln!("the join failed: {stderr}");
        assert!(stderr.contains("error: cluster df://127.0.0.1:"), "the failure is not a clear cluster error: {stderr}");
        assert!(!dir.join("cluster.parquet").exists(), "a failed join wrote its output");
    }
}

fn wait_listening(port: u16, node: &Node) {
    let began = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(began.elapsed() < Duration::from_secs(60), "nothing listens on {port}: {}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Eight Parquet files of 10,000 rows: `k` (0..100) and `v`.
fn write_files(dir: &Path) {
    use std::sync::Arc;
    std::fs::create_dir_all(dir).unwrap();
    for f in 0..8i64 {
        let k: Int64Array = (0..10_000).map(|i| (i * 7 + f) % 100).collect();
        let v: Int64Array = (0..10_000).map(|i| i * f - 3).collect();
        let batch = arrow::array::RecordBatch::try_from_iter([("k", Arc::new(k) as _), ("v", Arc::new(v) as _)]).unwrap();
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
}

const QUERY: &str = "SELECT k, sum(v) AS s, count(*) AS n FROM t GROUP BY k ORDER BY k";

async fn answer(ctx: &datafusion::prelude::SessionContext, data: &Path) -> Vec<(i64, i64, i64)> {
    ctx.register_parquet("t", data.to_str().unwrap(), datafusion::prelude::ParquetReadOptions::default()).await.unwrap();
    let batches = ctx.sql(QUERY).await.unwrap().collect().await.unwrap();
    let mut rows = Vec::new();
    for b in &batches {
        let col = |i: usize| b.column(i).as_any().downcast_ref::<Int64Array>().unwrap().clone();
        let (k, s, n) = (col(0), col(1), col(2));
        for r in 0..b.num_rows() {
            assert!(!s.is_null(r));
            rows.push((k.value(r), s.value(r), n.value(r)));
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_runs_on_two_executor_processes_as_it_runs_locally() {
    use ballista::prelude::SessionContextExt;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t");
    write_files(&data);
    let cluster = Cluster::start(tmp.path(), 2, false);

    let local = answer(&datafusion::prelude::SessionContext::new(), &data).await;
    assert_eq!(local.len(), 100);
    assert_eq!(local.iter().map(|r| r.2).sum::<i64>(), 80_000);
    let remote = datafusion::prelude::SessionContext::remote(&cluster.url()).await.unwrap();
    assert_eq!(answer(&remote, &data).await, local, "the cluster's answer");
    let tasks = cluster.tasks();
    eprintln!("tasks per executor: {tasks:?}");
    assert!(tasks.iter().all(|&n| n > 0), "tasks per executor: {tasks:?}\n{}", cluster.logs());
}
