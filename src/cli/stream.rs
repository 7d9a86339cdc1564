//! `quiver stream`: the views' Kafka topics into both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

use super::serve::{socket_addr, warn_exposure};
use super::{Ctx, runtime};

/// Consume the views' Kafka topics into both stores.
#[derive(Debug, clap::Args)]
pub struct Stream {
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
}

/// Events go to stderr as lines. `QUIVER_STREAM_ABORT_AFTER_DELTA=N` (for the crash
/// tests) aborts the process once the Nth batch is in both stores but before its
/// offsets are committed to Kafka, the window exactly-once has to get right.
fn hooks() -> quiver::streaming::Hooks {
    let hooks = quiver::streaming::Hooks::default().on_event(|event| eprintln!("{event}"));
    match std::env::var("QUIVER_STREAM_ABORT_AFTER_DELTA").ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(n) => hooks.before_commit(move |batch| {
            if batch >= n {
                eprintln!("aborting before the offset commit (QUIVER_STREAM_ABORT_AFTER_DELTA)");
                std::process::abort();
            }
        }),
        None => hooks,
    }
}

impl Stream {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let metrics = Arc::new(quiver::streaming::Metrics::default());
        let shutdown = Arc::new(AtomicBool::new(false));
        let op = repo
            .stream(self.views)
            .with_batch(self.batch_rows, std::time::Duration::from_millis(self.batch_ms))
            .with_metrics(metrics.clone())
            .with_shutdown(shutdown.clone())
            .with_hooks(hooks());
        // Checked before connecting anywhere.
        op.check()?;
        let rt = runtime()?;
        {
            let shutdown = shutdown.clone();
            rt.spawn(async move {
                quiver::online::listen::shutdown_signal().await;
                eprintln!("stopping: flushing the current batch");
                shutdown.store(true, Ordering::Relaxed);
            });
        }
        if let Some(port) = self.metrics_port {
            let addr = socket_addr(&repo.config.server.host, port)?;
            let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).with_context(|| format!("binding {addr}"))?;
            warn_exposure(&repo.config, &addr, "stream --metrics-port");
            let metrics = metrics.clone();
            let app = quiver::online::server::metrics_router(move || metrics.render(), repo.config.server.auth_token.clone());
            rt.spawn(async move { axum::serve(listener, app).await });
            eprintln!("metrics on http://{addr}/metrics");
        }
        let report = op.run_blocking(rt.handle().clone())?;
        println!(
            "consumed {}: {} written online, {} appended offline, {} dead-lettered{}",
            quiver_sdk::error::count(report.consumed, "message"),
            report.written_online,
            report.appended_offline,
            report.dead_lettered,
            super::ingest::shaped_note(report.filtered as usize, report.uncomputed)
        );
        Ok(())
    }
}
