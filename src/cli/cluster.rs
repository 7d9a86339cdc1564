//! `quiver cluster scheduler` and `quiver cluster executor`: DataFusion Ballista's own
//! scheduler and executor processes (Ballista 55, on DataFusion 55 like the offline
//! store), for joins spread over machines (docs/settings.md). They are Ballista's, configured
//! from the command line, with Quiver's physical codec ([`QuiverCodec`]) so executors
//! can run the as-of join of `historical --cluster` / `export --cluster`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use quiver_offline::historical::distributed::{self, QuiverCodec};

use super::{Ctx, runtime};

/// Run a DataFusion Ballista scheduler or executor.
#[derive(Debug, clap::Args)]
pub struct Cluster {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, clap::Subcommand)]
enum Role {
    /// The scheduler: plans jobs into stages and hands their tasks to executors.
    Scheduler(Scheduler),
    /// An executor: registers with the scheduler and runs the tasks it is given.
    Executor(Executor),
}

#[derive(Debug, clap::Args)]
struct Scheduler {
    /// The address to listen on (gRPC, for clients and executors).
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    #[arg(long, default_value_t = 50050)]
    port: u16,
    /// Seconds without a heartbeat after which an executor counts as lost (its tasks
    /// are run again elsewhere).
    #[arg(long, default_value_t = 180)]
    executor_timeout: u64,
}

#[derive(Debug, clap::Args)]
struct Executor {
    /// The scheduler's HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:50050")]
    scheduler: String,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// The Arrow Flight port other executors fetch shuffle data from.
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// The gRPC port the scheduler reaches the executor on.
    #[arg(long, default_value_t = 50052)]
    grpc_port: u16,
    /// How many tasks run at once (default: the machine's cores).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Where shuffle files go (default: a temporary folder).
    #[arg(long)]
    work_dir: Option<String>,
    /// Seconds between heartbeats to the scheduler (keep it under the scheduler's
    /// --executor-timeout).
    #[arg(long, default_value_t = 60)]
    heartbeat_interval: u64,
}

impl Cluster {
    pub fn run(self, _ctx: &Ctx) -> anyhow::Result<()> {
        let rt = runtime()?;
        match self.role {
            Role::Scheduler(s) => rt.block_on(s.run()),
            Role::Executor(e) => rt.block_on(e.run()),
        }
    }
}

impl Scheduler {
    async fn run(self) -> anyhow::Result<()> {
        use ballista_scheduler::cluster::BallistaCluster;
        use ballista_scheduler::config::SchedulerConfig;
        let addr: SocketAddr = format!("{}:{}", self.bind, self.port)
            .parse()
            .with_context(|| format!("--bind {} --port {}: not an address to listen on", self.bind, self.port))?;
        let config = SchedulerConfig {
            bind_host: self.bind.clone(),
            bind_port: self.port,
            external_host: self.bind,
            executor_timeout_seconds: self.executor_timeout,
            expire_dead_executor_interval_seconds: self.executor_timeout.clamp(1, 15),
            override_physical_codec: Some(Arc::new(QuiverCodec::default())),
            // Plans name the offline store's files under quiver:// URLs.
            override_session_builder: Some(Arc::new(distributed::scheduler_session)),
            ..Default::default()
        };
        let cluster = BallistaCluster::new_from_config(&config).await.context("starting the Ballista scheduler")?;
        println!("ballista scheduler listening on {addr}");
        ballista_scheduler::scheduler_process::start_server(cluster, addr, Arc::new(config))
            .await
            .with_context(|| format!("the Ballista scheduler on {addr}"))
    }
}

impl Executor {
    async fn run(self) -> anyhow::Result<()> {
        use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
        let (host, port) = self
            .scheduler
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
            .with_context(|| format!("--scheduler `{}`: expected HOST:PORT", self.scheduler))?;
        let work = self.work_dir.clone();
        let mut config = ExecutorProcessConfig {
            bind_host: self.bind.clone(),
            external_host: Some(self.bind),
            port: self.port,
            grpc_port: self.grpc_port,
            scheduler_host: host,
            scheduler_port: port,
            scheduler_connect_timeout_seconds: 30,
            work_dir: self.work_dir,
            print_thread_info: false,
            executor_heartbeat_interval_seconds: self.heartbeat_interval.max(1),
            override_physical_codec: Some(Arc::new(QuiverCodec::default())),
            // Plans name the offline store's files under quiver:// URLs.
            override_runtime_producer: Some(Arc::new(move |_| distributed::runtime_env(work.as_deref()))),
            ..Default::default()
        };
        if let Some(n) = self.concurrency {
            anyhow::ensure!(n > 0, "--concurrency 0: expected at least 1 task at a time");
            config.vcores = n;
        }
        println!(
            "ballista executor on {}:{} (flight) / {} (grpc), scheduler {}",
            config.bind_host, config.port, config.grpc_port, self.scheduler
        );
        start_executor_process(Arc::new(config)).await.context("the Ballista executor")
    }
}
