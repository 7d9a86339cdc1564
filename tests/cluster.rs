//! `quiver cluster scheduler` and `quiver cluster executor` as separate processes on
//! loopback: the executors register, a query from a Ballista client runs on both, and
//! its answer equals the same query run locally by DataFusion.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, Int64Array};

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
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
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
    let port = free_port();
    let scheduler = Node::start(tmp.path(), "scheduler", &["scheduler", "--port", &port.to_string()]);
    wait_listening(port, &scheduler);
    let executors: Vec<Node> = (0..2)
        .map(|i| {
            let (flight, grpc) = (free_port(), free_port());
            let name = format!("executor{i}");
            std::fs::create_dir_all(tmp.path().join(&name)).unwrap();
            let work = tmp.path().join(&name);
            Node::start(
                tmp.path(),
                &name,
                &[
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
                ],
            )
        })
        .collect();
    let began = Instant::now();
    while !executors.iter().all(|e| e.log().contains("registration succeed") || e.log().contains("Starting poll work loop")) {
        assert!(began.elapsed() < Duration::from_secs(60), "executors did not register:\n{}\n{}", executors[0].log(), executors[1].log());
        std::thread::sleep(Duration::from_millis(100));
    }

    let local = answer(&datafusion::prelude::SessionContext::new(), &data).await;
    assert_eq!(local.len(), 100);
    assert_eq!(local.iter().map(|r| r.2).sum::<i64>(), 80_000);
    let remote = datafusion::prelude::SessionContext::remote(&format!("df://127.0.0.1:{port}")).await.unwrap();
    assert_eq!(answer(&remote, &data).await, local, "the cluster's answer");
    let tasks: Vec<usize> =
        executors.iter().map(|e| e.log().matches("Received task").count() + e.log().matches("Execute task").count()).collect();
    eprintln!("tasks per executor: {tasks:?}");
    assert!(tasks.iter().all(|&n| n > 0), "tasks per executor: {tasks:?}\n{}\n{}", executors[0].log(), executors[1].log());
}
