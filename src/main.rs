//! The `quiver` command line: argument parsing, printing, exit codes. The work is done
//! by the `quiver` library and the crates behind it.
//!
//! Exit codes: 0 success; 1 an error (bad input, a refused change, a store failure),
//! printed as one line; 2 a usage error or a command that is not available yet.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use quiver::Repo;
use quiver::sdk::registry::{ObjectMeta, format_time};
use quiver::sdk::{Definitions, RegistryDoc};

/// Quiver: a feature store. Define features once, build point-in-time correct training
/// sets from Delta Lake, serve the same values online, stream fresh events into both.
#[derive(Debug, Parser)]
#[command(name = "quiver", version, propagate_version = true, max_term_width = 100)]
struct Cli {
    /// The feature repository (the folder holding quiver.yaml).
    #[arg(long, global = true, env = "QUIVER_REPO", default_value = ".")]
    repo: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Engine {
    Auto,
    Cpu,
    Gpu,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExportFormat {
    Parquet,
    Arrow,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PushTarget {
    Online,
    Offline,
    OnlineAndOffline,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a new feature repository in DIR.
    Init {
        dir: PathBuf,
        /// Add demo definitions (drivers and customers) and sample Parquet data.
        #[arg(long)]
        demo: bool,
    },
    /// Show what `apply` would change in the registry, per field.
    Plan,
    /// Record features.yaml in the registry as its next version.
    Apply {
        /// Apply even changes that break views already holding data.
        #[arg(long)]
        force: bool,
    },
    /// List what the registry holds.
    List,
    /// Show one entity, feature view or feature service of the registry.
    Describe {
        /// Its name (`kind/name`, e.g. `feature_view/driver_hourly`, when names clash).
        name: String,
    },
    /// Append a Parquet, CSV or JSON-lines file to a view's Delta table.
    Ingest { view: String, file: PathBuf },
    /// Point-in-time join of a spine with features, to Parquet.
    Historical {
        /// The entity dataframe: join keys, event_timestamp, any labels (Parquet or CSV).
        #[arg(long)]
        spine: PathBuf,
        /// Features as view:feature, comma separated.
        #[arg(long, value_delimiter = ',', required_unless_present = "service", conflicts_with = "service")]
        features: Vec<String>,
        /// A feature service instead of --features.
        #[arg(long)]
        service: Option<String>,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        engine: Engine,
        /// Only rows created by the spine time are candidates (guards against backfill leakage).
        #[arg(long)]
        created_cutoff: bool,
    },
    /// Export a sharded, reproducible training set with a manifest.json.
    Export {
        /// The feature service whose features the training set holds.
        #[arg(long, required_unless_present = "reproduce")]
        service: Option<String>,
        /// The spine (Parquet or CSV): join keys, event_timestamp, labels.
        #[arg(long, required_unless_present = "reproduce")]
        spine: Option<PathBuf>,
        /// The folder for the shards and manifest.json.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_enum, default_value = "parquet")]
        format: ExportFormat,
        /// Spine rows per shard (bounds memory: one shard's result at a time).
        #[arg(long, default_value_t = 500_000)]
        shard_rows: u64,
        #[arg(long, value_enum, default_value = "auto")]
        engine: Engine,
        /// Only rows created by each spine time are candidates.
        #[arg(long)]
        created_cutoff: bool,
        /// Rebuild the training set of this manifest.json (same Delta versions) into --out.
        #[arg(long, conflicts_with_all = ["service", "spine"])]
        reproduce: Option<PathBuf>,
    },
    /// Load the latest values between START and END from the offline into the online store.
    Materialize {
        start: String,
        end: String,
        views: Vec<String>,
    },
    /// Load what arrived since the last materialization, up to END.
    MaterializeIncremental { end: String },
    /// Look up online features for one entity.
    Online {
        #[arg(long, value_delimiter = ',', required = true)]
        features: Vec<String>,
        /// A join key value, KEY=VALUE; repeat for composite keys.
        #[arg(long = "entity", required = true)]
        entities: Vec<String>,
    },
    /// Run the HTTP feature server.
    Serve {
        #[arg(long)]
        host: Option<String>,
        #[arg(long)]
        port: Option<u16>,
    },
    /// Consume the views' Kafka topics into both stores.
    Stream {
        /// Views to stream (default: every view with a stream source).
        views: Vec<String>,
        /// Flush a micro-batch when it holds this many messages.
        #[arg(long, default_value_t = 10_000)]
        batch_rows: usize,
        /// Flush a micro-batch when its oldest message waited this many milliseconds.
        #[arg(long, default_value_t = 500)]
        batch_ms: u64,
        /// Serve Prometheus metrics on this port (at the server host, /metrics).
        #[arg(long)]
        metrics_port: Option<u16>,
    },
    /// Write rows through the streaming write path.
    Push {
        view: String,
        file: PathBuf,
        /// Default: both stores for an online view, offline for a view with `online: false`.
        #[arg(long, value_enum)]
        to: Option<PushTarget>,
    },
    /// Compare the online store with the offline store; non-zero exit over the threshold.
    Verify {
        #[arg(long, required_unless_present = "sample", conflicts_with = "sample")]
        since: Option<String>,
        #[arg(long, requires = "since")]
        until: Option<String>,
        #[arg(long)]
        sample: Option<u64>,
        #[arg(long, default_value_t = 0.0)]
        max_mismatch: f64,
        /// With --since: only rows created by each request time count, as in
        /// `historical --created-cutoff`.
        #[arg(long, requires = "since")]
        created_cutoff: bool,
    },
    /// Check config, registry, stores, Kafka and the GPU.
    Doctor {
        /// Also compile the CUDA kernels to PTX and report it.
        #[arg(long)]
        compile_kernels: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIVER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the whole chain, outermost first.
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let repo_dir = cli.repo;
    match cli.command {
        Command::Init { dir, demo } => cmd_init(&dir, demo),
        Command::Plan => cmd_plan(&repo_dir),
        Command::Apply { force } => cmd_apply(&repo_dir, force),
        Command::List => cmd_list(&repo_dir),
        Command::Describe { name } => cmd_describe(&repo_dir, &name),
        Command::Ingest { view, file } => cmd_ingest(&repo_dir, &view, &file),
        Command::Historical {
            spine,
            features,
            service,
            out,
            engine,
            created_cutoff,
        } => cmd_historical(
            &repo_dir,
            &spine,
            &features,
            service.as_deref(),
            &out,
            engine,
            created_cutoff,
        ),
        Command::Export { service, spine, out, format, shard_rows, engine, created_cutoff, reproduce } => {
            cmd_export(&repo_dir, service, spine, &out, format, shard_rows, engine, created_cutoff, reproduce)
        }
        Command::Materialize { start, end, views } => cmd_materialize(&repo_dir, &start, &end, &views),
        Command::MaterializeIncremental { end } => cmd_materialize_incremental(&repo_dir, &end),
        Command::Online { features, entities } => cmd_online(&repo_dir, &features, &entities),
        Command::Serve { host, port } => cmd_serve(&repo_dir, host, port),
        Command::Stream { views, batch_rows, batch_ms, metrics_port } => {
            cmd_stream(&repo_dir, &views, batch_rows, batch_ms, metrics_port)
        }
        Command::Push { view, file, to } => cmd_push(&repo_dir, &view, &file, to),
        Command::Verify { since: Some(since), until, max_mismatch, created_cutoff, .. } => {
            cmd_verify_log(&repo_dir, &since, until.as_deref(), max_mismatch, created_cutoff)
        }
        Command::Verify { sample, max_mismatch, .. } => cmd_verify(&repo_dir, sample.unwrap_or(0), max_mismatch),
        Command::Doctor { compile_kernels } => cmd_doctor(&repo_dir, compile_kernels),
    }
}

/// `verify --sample N`: the online store against the offline store at now, per feature;
/// exit 1 when a feature's share of disagreeing rows is over `max_mismatch`.
fn cmd_verify(dir: &Path, n: u64, max_mismatch: f64) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&max_mismatch) {
        anyhow::bail!("--max-mismatch must be between 0 and 1, got {max_mismatch}");
    }
    let repo = Repo::open(dir)?;
    let defs = repo.applied()?.definitions;
    let rt = runtime()?;
    let now = chrono::Utc::now().timestamp_micros();
    let reports = rt.block_on(async {
        let store = quiver::online::open_store(&repo.config).await?;
        anyhow::Ok(quiver::verify::verify_sample(&repo.config, &defs, store.as_ref(), n as usize, now, now as u64).await?)
    })?;
    print_verify(&reports, max_mismatch)
}

/// `verify --since T [--until T]`: replays the serving log.
fn cmd_verify_log(dir: &Path, since: &str, until: Option<&str>, max_mismatch: f64, created_cutoff: bool) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&max_mismatch) {
        anyhow::bail!("--max-mismatch must be between 0 and 1, got {max_mismatch}");
    }
    let now = chrono::Utc::now().timestamp_micros();
    let since_us = instant_arg("--since", since, now)?;
    let until_us = until.map(|u| instant_arg("--until", u, now)).transpose()?.unwrap_or(now);
    if since_us >= until_us {
        anyhow::bail!("--since {since} is not before --until {}", until.unwrap_or("now"));
    }
    let repo = Repo::open(dir)?;
    let defs = repo.applied()?.definitions;
    let rt = runtime()?;
    let report = rt.block_on(quiver::verify::verify_log(&repo.config, &defs, since_us, until_us, created_cutoff, &quiver::gpu_join::CpuKernel::new()))?;
    println!(
        "serving log {}: {} requests, {} rows from {} to {}",
        repo.config.serving_log.location,
        report.requests,
        report.rows,
        quiver::sdk::rows::format_instant(since_us),
        quiver::sdk::rows::format_instant(until_us)
    );
    for s in &report.skipped {
        println!("skipped: {s}");
    }
    if report.rows == 0 {
        anyhow::bail!(
            "verify: nothing logged between {} and {} (is `serving_log: {{enabled: true}}` set in quiver.yaml, and has the server answered since?)",
            quiver::sdk::rows::format_instant(since_us),
            quiver::sdk::rows::format_instant(until_us)
        );
    }
    if report.features.iter().all(|f| f.compared == 0) {
        anyhow::bail!("verify: {} rows logged, none could be compared (see the skipped lines above)", report.rows);
    }
    print_verify(&report.features, max_mismatch)
}

/// A time argument: RFC 3339, a date (midnight UTC), or a duration before now (`90m`,
/// `2h`, `7d`).
fn instant_arg(flag: &str, text: &str, now: i64) -> anyhow::Result<i64> {
    if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).expect("midnight").and_utc().timestamp_micros());
    }
    let expected = "expected an RFC 3339 time (2026-11-30T12:00:00Z), a date (2026-11-30) or a duration before now (90m, 2h, 7d)";
    match quiver::sdk::rows::parse_instant(text) {
        Ok(t) => return Ok(t),
        // Looks like a time: its own message (e.g. a missing zone) says more.
        Err(e) if text.contains(':') => anyhow::bail!("{flag} `{text}`: {e}"),
        Err(_) => {}
    }
    // A duration needs its unit: a bare number could as well be epoch seconds.
    if !text.trim_end().ends_with(|c: char| c.is_ascii_alphabetic()) {
        anyhow::bail!("{flag} `{text}`: {expected}");
    }
    match quiver::sdk::Ttl::parse(text) {
        Ok(ttl) if !ttl.is_unbounded() => Ok(now.saturating_sub(i64::try_from(ttl.secs()).unwrap_or(i64::MAX / 1_000_000).saturating_mul(1_000_000))),
        _ => anyhow::bail!("{flag} `{text}`: {expected}"),
    }
}

fn print_verify(reports: &[quiver::verify::FeatureReport], max_mismatch: f64) -> anyhow::Result<()> {
    println!("{:<40} {:>9} {:>9} {:>10} {:>14} {:>15}", "feature", "compared", "matches", "mismatches", "missing online", "missing offline");
    for r in reports {
        println!("{:<40} {:>9} {:>9} {:>10} {:>14} {:>15}", r.feature, r.compared, r.matches, r.mismatches, r.missing_online, r.missing_offline);
        for e in &r.examples {
            println!("    {e}");
        }
    }
    let worst = reports.iter().map(quiver::verify::FeatureReport::mismatch_rate).fold(0.0, f64::max);
    let compared: u64 = reports.iter().map(|r| r.compared).sum();
    let bad: u64 = reports.iter().map(|r| r.mismatches + r.missing_online + r.missing_offline).sum();
    println!("{bad} of {compared} compared values disagree; worst feature {:.2}% (limit {:.2}%)", worst * 100.0, max_mismatch * 100.0);
    if worst > max_mismatch {
        anyhow::bail!("verify: online and offline disagree on {:.2}% of a feature's rows, over --max-mismatch {max_mismatch}", worst * 100.0);
    }
    Ok(())
}

/// `doctor`: what this machine and repository offer, one line per check. Exits 1 when
/// a check that the repository needs fails (config, registry, online store, a kernel
/// that does not compile when asked for); a missing GPU or broker is reported only.
fn cmd_doctor(dir: &Path, compile_kernels: bool) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    let line = |ok: bool, what: &str, detail: String| println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
    let note = |what: &str, detail: String| println!("--   {what}: {detail}");
    match Repo::open(dir) {
        Ok(repo) => {
            line(true, "config", format!("project `{}` in {}", repo.config.project, dir.display()));
            match repo.applied() {
                Ok(doc) => line(
                    true,
                    "registry",
                    format!(
                        "version {}, {} feature views, {} services",
                        doc.version,
                        doc.definitions.feature_views.len(),
                        doc.definitions.feature_services.len()
                    ),
                ),
                Err(e) => {
                    line(false, "registry", e.to_string());
                    failed.push("registry");
                }
            }
            let rt = runtime()?;
            match rt.block_on(async {
                let store = quiver::online::open_store(&repo.config).await?;
                store.read(&["quiver:doctor:probe".to_string()]).await?;
                anyhow::Ok(store.name())
            }) {
                Ok(name) => line(true, "online store", format!("{name} answers")),
                Err(e) => {
                    line(false, "online store", format!("{e:#}"));
                    failed.push("online store");
                }
            }
            if repo.config.server.auth_token_in_file {
                note("auth", format!("{} holds server.auth_token; keep it out of version control or set QUIVER_SERVER_AUTH_TOKEN instead", dir.join(quiver::sdk::config::CONFIG_FILE).display()));
            }
            let brokers = &repo.config.kafka_brokers;
            let reachable: Vec<String> = brokers
                .split(',')
                .filter(|b| {
                    use std::net::ToSocketAddrs;
                    b.trim().to_socket_addrs().ok().and_then(|mut a| a.next()).is_some_and(|a| {
                        std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(1)).is_ok()
                    })
                })
                .map(str::to_string)
                .collect();
            if reachable.is_empty() {
                note("kafka", format!("no broker of `{brokers}` accepts connections (needed only by `quiver stream`)"));
            } else {
                line(true, "kafka", format!("{} reachable", reachable.join(", ")));
            }
        }
        Err(e) => {
            line(false, "config", e.to_string());
            failed.push("config");
        }
    }
    let probe = quiver::gpu_join::cuda::probe();
    if probe.devices.is_empty() {
        note("gpu", probe.driver_error.clone().unwrap_or_else(|| "no CUDA device".into()) + " (joins run on the CPU)");
    }
    for (i, (name, (major, minor), mem)) in probe.devices.iter().enumerate() {
        line(true, "gpu", format!("device {i}: {name}, compute capability {major}.{minor}, {:.1} GiB", *mem as f64 / (1u64 << 30) as f64));
    }
    match probe.nvrtc {
        Some((major, minor)) => line(true, "nvrtc", format!("version {major}.{minor}")),
        None => note("nvrtc", "libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12 and put its lib folder on LD_LIBRARY_PATH)".into()),
    }
    if compile_kernels {
        let arch = probe.devices.first().map_or("compute_80".to_string(), |(_, (major, minor), _)| format!("compute_{major}{minor}"));
        let arch: &'static str = Box::leak(arch.into_boxed_str());
        let began = std::time::Instant::now();
        match quiver::gpu_join::cuda::compile_ptx(Some(arch)) {
            Ok(ptx) => {
                for name in quiver::gpu_join::cuda::KERNEL_NAMES {
                    let found = ptx.contains(&format!(".entry {name}("));
                    line(found, "kernel", format!("{name} {}", if found { "compiled" } else { "missing from the PTX" }));
                    if !found {
                        failed.push("kernels");
                    }
                }
                line(true, "ptx", format!("{} bytes for {arch} in {:.0} ms", ptx.len(), began.elapsed().as_secs_f64() * 1000.0));
            }
            Err(e) => {
                line(false, "kernels", e.to_string());
                failed.push("kernels");
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("doctor: {} failed", failed.join(", "))
    }
}

fn cmd_init(dir: &Path, demo: bool) -> anyhow::Result<()> {
    let files = quiver::init::init(dir, demo, chrono::Utc::now())?;
    println!(
        "created {}repository `{}` in {} ({} files)",
        if demo { "demo " } else { "" },
        quiver::init::project_name(dir),
        dir.display(),
        files.len()
    );
    if demo {
        println!(
            "next: cd {} && quiver apply && quiver list",
            dir.display()
        );
    } else {
        println!("next: define features in {}/features.yaml, then `quiver apply`", dir.display());
    }
    Ok(())
}

fn cmd_plan(dir: &Path) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let applied = repo.applied()?;
    let plan = applied.plan(&repo.definitions()?);
    if plan.is_empty() {
        println!("no changes: registry is at version {}", applied.version);
    } else {
        println!("{plan}");
        println!("run `quiver apply` to record this as version {}", applied.version + 1);
    }
    Ok(())
}

fn cmd_apply(dir: &Path, force: bool) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let rt = runtime()?;
    let applied = repo.apply(force, chrono::Utc::now(), rt.handle().clone())?;
    for table in &applied.created_tables {
        println!("created delta table {table}");
    }
    let outcome = applied.outcome;
    if !outcome.written {
        println!("no changes: registry stays at version {}", outcome.version);
        return Ok(());
    }
    println!("{}", outcome.plan);
    for b in &outcome.forced {
        eprintln!("warning: forced: {b}");
    }
    println!(
        "applied: registry {} is at version {}",
        repo.config.registry_path.display(),
        outcome.version
    );
    Ok(())
}

/// A spinner with the current phase and row count on a terminal; nothing otherwise.
fn progress_bar() -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn applied_view<'a>(
    defs: &'a Definitions,
    name: &str,
) -> anyhow::Result<&'a quiver::sdk::FeatureView> {
    defs.feature_view(name).ok_or_else(|| {
        let known: Vec<&str> = defs.feature_views.iter().map(|v| v.name.as_str()).collect();
        anyhow::anyhow!(
            "unknown feature view `{name}` in the registry (known: {}); is it applied?",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        )
    })
}

fn cmd_ingest(dir: &Path, view: &str, file: &Path) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let view = applied_view(&doc.definitions, view)?;
    let rt = runtime()?;
    let bar = progress_bar();
    let progress = |phase: &str, rows: u64| bar.set_message(format!("{phase} {rows} rows"));
    let latest = repo.config.event_horizon(chrono::Utc::now().timestamp_micros());
    let report = rt.block_on(quiver::offline::ingest::ingest(
        &repo.config.view_table(view),
        &doc.definitions,
        view,
        file,
        latest,
        &progress,
    ))?;
    bar.finish_and_clear();
    println!(
        "ingested {} rows into {} (table version {}) in {:.2} s",
        report.rows, view.name, report.version, report.seconds
    );
    Ok(())
}

fn cmd_push(dir: &Path, view: &str, file: &Path, to: Option<PushTarget>) -> anyhow::Result<()> {
    use quiver::streaming::Target;
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let view = applied_view(&doc.definitions, view)?;
    let target = match to {
        Some(PushTarget::Online) => Target::Online,
        Some(PushTarget::Offline) => Target::Offline,
        Some(PushTarget::OnlineAndOffline) => Target::OnlineAndOffline,
        None => Target::default_for(view),
    };
    let began = std::time::Instant::now();
    let rt = runtime()?;
    let report = rt.block_on(async {
        let store = if target.online() { Some(quiver::online::open_store(&repo.config).await?) } else { None };
        anyhow::Ok(
            quiver::streaming::write::push_file(&repo.config, &doc.definitions, view, file, target, store.as_deref()).await?,
        )
    })?;
    let mut parts = Vec::new();
    if let Some(v) = report.offline_version {
        parts.push(format!("offline: table version {v}"));
    }
    if let Some(w) = report.online_written {
        parts.push(format!("online: {w} written, {} older than the stored rows", report.rows - w));
    }
    println!("pushed {} rows into {} ({}) in {:.2} s", report.rows, view.name, parts.join("; "), began.elapsed().as_secs_f64());
    Ok(())
}

fn cmd_stream(dir: &Path, views: &[String], batch_rows: usize, batch_ms: u64, metrics_port: Option<u16>) -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let repo = Repo::open(dir)?;
    let defs = Arc::new(repo.applied()?.definitions);
    // Checked before connecting anywhere.
    quiver::streaming::consumer::stream_views(&defs, views)?;
    if batch_rows == 0 || batch_ms == 0 {
        anyhow::bail!("--batch-rows and --batch-ms must be at least 1");
    }
    let mut options = quiver::streaming::StreamOptions::new(&repo.config);
    options.batch_rows = batch_rows;
    options.batch_interval = std::time::Duration::from_millis(batch_ms);
    let rt = runtime()?;
    let store = rt.block_on(quiver::online::open_store(&repo.config))?;
    let metrics = Arc::new(quiver::streaming::Metrics::default());
    let shutdown = Arc::new(AtomicBool::new(false));
    {
        let shutdown = shutdown.clone();
        rt.spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            eprintln!("stopping: flushing the current batch");
            shutdown.store(true, Ordering::Relaxed);
        });
    }
    if let Some(port) = metrics_port {
        let addr: std::net::SocketAddr = format!("{}:{port}", repo.config.server.host)
            .parse()
            .map_err(|e| anyhow::anyhow!("metrics address `{}:{port}`: {e}", repo.config.server.host))?;
        let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).with_context(|| format!("binding {addr}"))?;
        warn_exposure(&repo.config, &addr, "stream --metrics-port");
        let metrics = metrics.clone();
        let token = repo.config.server.auth_token.clone();
        // The same rules as `quiver serve`: with server.auth_token set, a bearer token.
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move |headers: axum::http::HeaderMap| {
                let metrics = metrics.clone();
                let token = token.clone();
                async move {
                    use axum::response::IntoResponse;
                    let given = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
                    match (&token, given) {
                        (Some(t), Some(g)) if quiver::online::server::constant_time_eq(g, t.as_bytes()) => metrics.render().into_response(),
                        (Some(_), _) => (axum::http::StatusCode::UNAUTHORIZED, "{\"error\": \"missing or wrong bearer token\"}").into_response(),
                        (None, _) => metrics.render().into_response(),
                    }
                }
            }),
        );
        rt.spawn(async move { axum::serve(listener, app).await });
        eprintln!("metrics on http://{addr}/metrics");
    }
    let report = quiver::streaming::run(
        &repo.config,
        defs,
        views,
        store,
        options,
        metrics,
        shutdown,
        rt.handle().clone(),
    )?;
    println!(
        "consumed {} messages: {} written online, {} appended offline, {} dead-lettered",
        report.consumed, report.written_online, report.appended_offline, report.dead_lettered
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn cmd_export(
    dir: &Path,
    service: Option<String>,
    spine: Option<PathBuf>,
    out: &Path,
    format: ExportFormat,
    shard_rows: u64,
    engine: Engine,
    created_cutoff: bool,
    reproduce: Option<PathBuf>,
) -> anyhow::Result<()> {
    use quiver::export::{ExportOptions, ShardFormat};
    let began = std::time::Instant::now();
    let repo = Repo::open(dir)?;
    let rt = runtime()?;
    let bar = progress_bar();
    let progress = |k: u64, n: u64| bar.set_message(format!("shard {k} of {n}"));
    let reproducing = reproduce.is_some();
    let exported = match reproduce {
        Some(manifest) => {
            let (kernel, _) = pick_engine(engine, 0)?;
            rt.block_on(quiver::export::reproduce(&repo, &manifest, out, kernel.as_ref(), &progress))?
        }
        None => {
            let spine = spine.expect("clap requires it");
            let options = ExportOptions {
                service: service.expect("clap requires it"),
                format: match format {
                    ExportFormat::Parquet => ShardFormat::Parquet,
                    ExportFormat::Arrow => ShardFormat::Arrow,
                },
                shard_rows,
                created_cutoff,
            };
            let (kernel, _) = pick_engine(engine, usize::try_from(shard_rows).unwrap_or(usize::MAX))?;
            rt.block_on(quiver::export::export(&repo, &spine, out, options, kernel.as_ref(), &progress))?
        }
    };
    bar.finish_and_clear();
    for file in &exported.repaired {
        eprintln!("repaired {}: it no longer matched the manifest; written again from the reproduced rows", out.join(file).display());
    }
    let manifest = &exported.manifest;
    println!(
        "{} training set {}: {} rows in {} shards to {} in {:.2} s{}",
        if reproducing { "reproduced" } else { "exported" },
        manifest.training_set_id,
        manifest.rows,
        manifest.shards.len(),
        out.display(),
        began.elapsed().as_secs_f64(),
        if reproducing { ", every shard identical to the manifest" } else { "" }
    );
    Ok(())
}

/// Spine rows from which `--engine auto` prefers a GPU: below, transfers and kernel
/// compilation cost more than the CPU join takes.
const GPU_MIN_SPINE_ROWS: usize = 1_000_000;

/// The join engine for `--engine`, and one line saying which one runs and why.
fn pick_engine(engine: Engine, spine_rows: usize) -> anyhow::Result<(Box<dyn quiver::gpu_join::AsOfKernel>, String)> {
    use quiver::gpu_join::{CpuKernel, CudaKernel};
    let cpu = |why: String| -> anyhow::Result<(Box<dyn quiver::gpu_join::AsOfKernel>, String)> {
        Ok((Box::new(CpuKernel::new()), format!("engine: cpu ({why})")))
    };
    match engine {
        Engine::Cpu => cpu("asked for".into()),
        Engine::Gpu => {
            let k = CudaKernel::new().map_err(|e| anyhow::anyhow!("--engine gpu: {e}"))?;
            let note = format!("engine: cuda on {} (asked for)", k.device());
            Ok((Box::new(k), note))
        }
        Engine::Auto => {
            let probe = quiver::gpu_join::cuda::probe();
            if probe.devices.is_empty() {
                let why = probe.driver_error.unwrap_or_else(|| "the driver reports no device".into());
                return cpu(format!("auto: no GPU: {why}"));
            }
            if spine_rows < GPU_MIN_SPINE_ROWS {
                return cpu(format!("auto: {spine_rows} spine rows, fewer than the {GPU_MIN_SPINE_ROWS} a GPU pays off at"));
            }
            match CudaKernel::new() {
                Ok(k) => {
                    let note = format!("engine: cuda on {} (auto: {spine_rows} spine rows)", k.device());
                    Ok((Box::new(k), note))
                }
                Err(e) => cpu(format!("auto: the GPU is unusable: {e}")),
            }
        }
    }
}

fn cmd_historical(
    dir: &Path,
    spine_path: &Path,
    features: &[String],
    service: Option<&str>,
    out: &Path,
    engine: Engine,
    created_cutoff: bool,
) -> anyhow::Result<()> {
    use quiver::offline::historical::{self, HistoricalOptions};
    let start = std::time::Instant::now();
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let defs = &doc.definitions;
    let refs: Vec<quiver::sdk::FeatureRef> = match service {
        Some(name) => {
            let svc = defs.feature_service(name).ok_or_else(|| {
                let known: Vec<&str> =
                    defs.feature_services.iter().map(|s| s.name.as_str()).collect();
                anyhow::anyhow!(
                    "unknown feature service `{name}` (known: {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )
            })?;
            svc.features.clone()
        }
        None => features
            .iter()
            .map(|f| {
                f.parse().map_err(|_| {
                    anyhow::anyhow!("--features: bad feature reference `{f}` (expected view:feature)")
                })
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let requests = historical::resolve(defs, &refs)?;
    let key_types: Vec<(String, arrow::datatypes::DataType)> = requests
        .iter()
        .flat_map(|r| defs.join_keys(r.view))
        .map(|k| (k.name.clone(), quiver::offline::schema::key_type(k.dtype)))
        .collect();
    let spine = historical::read_spine(spine_path, &key_types)?;
    tracing::debug!(secs = start.elapsed().as_secs_f64(), rows = spine.num_rows(), "spine read");
    let (kernel, engine_note) = pick_engine(engine, spine.num_rows())?;
    let rt = runtime()?;
    let bar = progress_bar();
    let progress = |phase: &str, rows: u64| bar.set_message(format!("{phase}: {rows} rows"));
    let joined = rt.block_on(historical::historical(
        &repo.config,
        defs,
        spine_path,
        &spine,
        &requests,
        HistoricalOptions { created_cutoff, ..Default::default() },
        kernel.as_ref(),
        &progress,
    ))?;
    bar.set_message("writing");
    let write_start = std::time::Instant::now();
    historical::write_parquet(out, &joined)?;
    tracing::debug!(secs = write_start.elapsed().as_secs_f64(), "written");
    bar.finish_and_clear();
    println!(
        "historical: {} rows x {} features -> {} in {:.2} s ({engine_note})",
        joined.num_rows(),
        refs.len(),
        out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A time argument: RFC 3339 with a zone, or `now`; UTC microseconds.
fn parse_time(what: &str, text: &str) -> anyhow::Result<i64> {
    if text == "now" {
        return Ok(chrono::Utc::now().timestamp_micros());
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_micros())
        .map_err(|_| anyhow::anyhow!("{what} `{text}`: expected an RFC 3339 time with a zone (e.g. 2024-01-01T00:00:00Z) or `now`"))
}

fn cmd_materialize(dir: &Path, start: &str, end: &str, names: &[String]) -> anyhow::Result<()> {
    let began = std::time::Instant::now();
    let (start, end) = (parse_time("START", start)?, parse_time("END", end)?);
    if start > end {
        anyhow::bail!("START is after END");
    }
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let defs = &doc.definitions;
    let views: Vec<&quiver::sdk::FeatureView> = if names.is_empty() {
        defs.feature_views.iter().filter(|v| v.online).collect()
    } else {
        names
            .iter()
            .map(|n| {
                let v = applied_view(defs, n)?;
                if !v.online {
                    anyhow::bail!("feature view `{n}` is not online (it has `online: false`)");
                }
                Ok(v)
            })
            .collect::<anyhow::Result<_>>()?
    };
    let rt = runtime()?;
    let bar = progress_bar();
    let progress = |phase: &str, rows: u64| bar.set_message(format!("{phase}: {rows} rows"));
    let reports = rt.block_on(async {
        let store = quiver::online::open_store(&repo.config).await?;
        quiver::materialize::materialize(&repo.config, defs, &views, start, end, store.as_ref(), &progress).await
    })?;
    bar.finish_and_clear();
    print_materialized(&reports, began);
    Ok(())
}

/// A line per view, then the total with the rate.
fn print_materialized(reports: &[quiver::materialize::ViewReport], began: std::time::Instant) {
    let mut total = 0;
    for r in reports {
        println!("{}: {} entities, {} written", r.view, r.entities, r.written);
        total += r.entities;
    }
    let secs = began.elapsed().as_secs_f64();
    println!(
        "materialized {total} rows from {} views in {secs:.2} s ({:.0} rows/s)",
        reports.len(),
        total as f64 / secs.max(1e-9)
    );
}

fn cmd_materialize_incremental(dir: &Path, end: &str) -> anyhow::Result<()> {
    let began = std::time::Instant::now();
    let end = parse_time("END", end)?;
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let defs = &doc.definitions;
    let views: Vec<&quiver::sdk::FeatureView> = defs.feature_views.iter().filter(|v| v.online).collect();
    let rt = runtime()?;
    let bar = progress_bar();
    let progress = |phase: &str, rows: u64| bar.set_message(format!("{phase}: {rows} rows"));
    let reports = rt.block_on(async {
        let store = quiver::online::open_store(&repo.config).await?;
        quiver::materialize::materialize_incremental(&repo.config, defs, &views, end, store.as_ref(), &progress).await
    })?;
    bar.finish_and_clear();
    print_materialized(&reports, began);
    Ok(())
}

/// Warnings for a listener reachable from other machines without a token, and for a
/// token written into `quiver.yaml` (a file that is easily committed).
fn warn_exposure(config: &quiver::sdk::Config, addr: &std::net::SocketAddr, what: &str) {
    if !addr.ip().is_loopback() && config.server.auth_token.is_none() {
        eprintln!(
            "warning: {what} listens on {addr}, reachable from other machines, with no server.auth_token: anyone who can connect can read{}",
            if what == "serve" { " and push features" } else { " the metrics" }
        );
    }
    if config.server.auth_token_in_file {
        eprintln!(
            "warning: {} holds server.auth_token; keep it out of version control (add it to .gitignore) or set QUIVER_SERVER_AUTH_TOKEN instead",
            config.repo.join(quiver::sdk::config::CONFIG_FILE).display()
        );
    }
}

fn cmd_serve(dir: &Path, host: Option<String>, port: Option<u16>) -> anyhow::Result<()> {
    use quiver::online::server::serve;
    let repo = Repo::open(dir)?;
    // Precedence: flag > environment > file > default (the config holds the last three).
    let host = host.unwrap_or_else(|| repo.config.server.host.clone());
    let port = port.unwrap_or(repo.config.server.port);
    let addr: std::net::SocketAddr = format!("{host}:{port}")
        .parse()
        .or_else(|_| {
            use std::net::ToSocketAddrs;
            format!("{host}:{port}").to_socket_addrs().map_err(anyhow::Error::from)?.next().ok_or_else(|| anyhow::anyhow!("no address"))
        })
        .map_err(|e| anyhow::anyhow!("server address `{host}:{port}`: {e}"))?;
    let rt = runtime()?;
    rt.block_on(async {
        let store = quiver::online::open_store(&repo.config).await?;
        let log = repo.config.serving_log.enabled.then(|| quiver::serving_log::DeltaServingLog::start(&repo.config.serving_log));
        let state = std::sync::Arc::new(quiver::server::server_state(&repo.config, store, log.clone())?);
        warn_exposure(&repo.config, &addr, "serve");
        println!("serving project `{}` on http://{addr} (Ctrl-C to stop)", repo.config.project);
        if log.is_some() {
            println!("logging answers to {} (serving_log in quiver.yaml)", repo.config.serving_log.location);
        }
        serve(state, addr).await.with_context(|| format!("serving on {addr}"))?;
        if let Some(log) = &log {
            // The last batch; a store that is briefly down gets a few more tries.
            let mut tries = 0;
            while let Err(e) = log.flush().await {
                tries += 1;
                if tries == 5 {
                    anyhow::bail!("serving log: the last batch was not written: {e}");
                }
                eprintln!("serving log: {e}; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
        println!("stopped");
        anyhow::Ok(())
    })
}

fn show_value(v: &quiver::sdk::encoding::Value) -> String {
    use quiver::sdk::encoding::Value;
    match v {
        Value::Null => "null".into(),
        Value::Int32(x) => x.to_string(),
        Value::Int64(x) => x.to_string(),
        Value::Float32(x) => format!("{x:?}"),
        Value::Float64(x) => format!("{x:?}"),
        Value::Bool(x) => x.to_string(),
        Value::String(x) => format!("{x:?}"),
        Value::Bytes(x) => format!("<{} bytes>", x.len()),
        Value::Timestamp(x) => quiver::sdk::rows::format_instant(*x),
        Value::ListInt64(x) => format!("{x:?}"),
        Value::ListFloat32(x) => format!("{x:?}"),
        Value::ListFloat64(x) => format!("{x:?}"),
        Value::ListString(x) => format!("{x:?}"),
    }
}


fn cmd_online(dir: &Path, features: &[String], entities: &[String]) -> anyhow::Result<()> {
    use quiver::sdk::encoding::KeyValue;
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let defs = &doc.definitions;
    let refs: Vec<quiver::sdk::FeatureRef> = features
        .iter()
        .map(|f| f.parse().map_err(|_| anyhow::anyhow!("--features: bad feature reference `{f}` (expected view:feature)")))
        .collect::<anyhow::Result<_>>()?;
    let mut columns = Vec::new();
    for e in entities {
        let Some((name, text)) = e.split_once('=') else {
            anyhow::bail!("--entity `{e}`: expected KEY=VALUE");
        };
        let key_type = defs
            .feature_views
            .iter()
            .flat_map(|v| defs.join_keys(v))
            .find(|k| k.name == name)
            .map(|k| k.dtype)
            .ok_or_else(|| anyhow::anyhow!("--entity `{e}`: `{name}` is not a join key of any feature view"))?;
        let value = match key_type {
            quiver::sdk::KeyType::Int64 => KeyValue::Int(
                text.parse().map_err(|_| anyhow::anyhow!("--entity `{e}`: `{name}` is int64, `{text}` is not an integer"))?,
            ),
            quiver::sdk::KeyType::String => KeyValue::Str(text.to_string()),
        };
        columns.push((name.to_string(), vec![value]));
    }
    let rt = runtime()?;
    let result = rt.block_on(async {
        let store = quiver::online::open_store(&repo.config).await?;
        quiver::online::lookup::get_online_features(
            store.as_ref(),
            &repo.config.project,
            defs,
            &refs,
            &columns,
            chrono::Utc::now().timestamp_micros(),
            true,
        )
        .await
    })?;
    for column in result.iter().skip(columns.len()) {
        println!(
            "{:<36} {:<24} {:<16} {}",
            column.name,
            show_value(&column.values[0]),
            column.statuses[0].as_str(),
            column.event_ts[0].map(quiver::sdk::rows::format_instant).unwrap_or_default()
        );
    }
    Ok(())
}

fn cmd_list(dir: &Path) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    if doc.version == 0 {
        println!("registry is empty: nothing applied yet (run `quiver apply`)");
        return Ok(());
    }
    print!("{}", render_list(&doc));
    Ok(())
}

fn meta<'a>(doc: &'a RegistryDoc, kind: &str, name: &str) -> Option<&'a ObjectMeta> {
    doc.objects.get(&format!("{kind}/{name}"))
}

fn render_list(doc: &RegistryDoc) -> String {
    let defs: &Definitions = &doc.definitions;
    let mut out = format!(
        "project {} · registry version {}{}\n",
        doc.project,
        doc.version,
        doc.updated_at
            .map(|t| format!(" · applied {}", format_time(&t)))
            .unwrap_or_default()
    );
    out.push_str(&format!("\nentities ({})\n", defs.entities.len()));
    for e in &defs.entities {
        let keys: Vec<String> = e
            .join_keys
            .iter()
            .map(|k| format!("{}:{}", k.name, k.dtype))
            .collect();
        out.push_str(&format!("  {:<24} keys {}\n", e.name, keys.join(", ")));
    }
    out.push_str(&format!("\nfeature views ({})\n", defs.feature_views.len()));
    for v in &defs.feature_views {
        out.push_str(&format!(
            "  {:<24} v{:<3} entities {:<20} ttl {:<6} {:>2} features{}\n",
            v.name,
            meta(doc, "feature_view", &v.name).map_or(0, |m| m.version),
            v.entities.join(","),
            v.ttl.to_string(),
            v.features.len(),
            if v.online { "  online" } else { "" }
        ));
    }
    out.push_str(&format!("\nfeature services ({})\n", defs.feature_services.len()));
    for s in &defs.feature_services {
        out.push_str(&format!(
            "  {:<24} v{:<3} {} features\n",
            s.name,
            meta(doc, "feature_service", &s.name).map_or(0, |m| m.version),
            s.features.len()
        ));
    }
    out
}

fn cmd_describe(dir: &Path, name: &str) -> anyhow::Result<()> {
    let repo = Repo::open(dir)?;
    let doc = repo.applied()?;
    let defs = &doc.definitions;
    let (kind_filter, name) = match name.split_once('/') {
        Some((k, n)) => (Some(k), n),
        None => (None, name),
    };
    let wanted = |kind: &str| kind_filter.is_none_or(|k| k == kind);
    let mut found: Vec<(&str, serde_json::Value)> = Vec::new();
    if let Some(e) = defs.entity(name).filter(|_| wanted("entity")) {
        found.push(("entity", serde_json::to_value(e)?));
    }
    if let Some(v) = defs.feature_view(name).filter(|_| wanted("feature_view")) {
        let mut value = serde_json::to_value(v)?;
        let keys: Vec<String> = defs
            .join_keys(v)
            .iter()
            .map(|k| format!("{}:{}", k.name, k.dtype))
            .collect();
        value["join_keys"] = keys.into();
        value["table"] = repo.config.view_table(v).to_string().into();
        found.push(("feature_view", value));
    }
    if let Some(s) = defs.feature_service(name).filter(|_| wanted("feature_service")) {
        let mut value = serde_json::to_value(s)?;
        value["output_columns"] = s
            .features
            .iter()
            .map(|r| r.column_name())
            .collect::<Vec<_>>()
            .into();
        found.push(("feature_service", value));
    }
    if found.is_empty() {
        let mut all: Vec<&str> = defs.entities.iter().map(|e| e.name.as_str()).collect();
        all.extend(defs.feature_views.iter().map(|v| v.name.as_str()));
        all.extend(defs.feature_services.iter().map(|s| s.name.as_str()));
        anyhow::bail!(
            "`{name}` is not in the registry (version {}; known: {})",
            doc.version,
            if all.is_empty() { "none".to_string() } else { all.join(", ") }
        );
    }
    for (i, (kind, mut value)) in found.into_iter().enumerate() {
        if i > 0 {
            println!("---");
        }
        if let Some(m) = meta(&doc, kind, name) {
            value["version"] = m.version.into();
            value["created_at"] = format_time(&m.created_at).into();
            value["updated_at"] = format_time(&m.updated_at).into();
        }
        println!("kind: {kind}");
        print!("{}", serde_yaml::to_string(&value)?);
    }
    Ok(())
}
