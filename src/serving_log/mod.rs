//! The serving log, one module: its table ([`table`]: schema, append, read by column
//! name), its rows ([`rows`]: one answer into log rows) and its writer (here), read
//! back by `verify --since`.
//!
//! The writer: the server hands each answered request to
//! [`DeltaServingLog::log`] (a non-blocking queue send), and a background task turns
//! answers into log rows and appends them to the log's Delta table in batches
//! (`serving_log.batch_rows` rows or `batch_ms` after a batch's first row, whichever
//! comes first). When the queue holds [`QUEUE_ROWS`] entity rows the record is dropped
//! and counted: logging never slows or fails a request. A failed append is retried no
//! sooner than `batch_ms` later; rows beyond ten batches' worth waiting are dropped
//! and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quiver_online::serving_log::{Served, ServingLog};
use quiver_sdk::config::ServingLogConfig;
use tokio::sync::{mpsc, oneshot};

pub mod rows;
pub mod table;

pub(crate) use rows::logged_view;
pub use rows::{LogColumns, append_log_rows};
pub use table::{LogBatch, LogTable, read};

/// What watches the answers the log records (the monitor's live profiles,
/// docs/monitoring.md): the writer tells it of each answer it takes, and its metric
/// families are rendered with the log's. The log knows nothing of what it does.
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// One answer, as the writer takes it off the queue.
    fn served(&self, served: &Served);
    /// Its metric families at `now` (UTC microseconds).
    fn render(&self, out: &mut quiver_runtime::metrics::Exposition, now: i64);
}

/// Entity rows of answers waiting for the writer; an answer that would go beyond this
/// is dropped (it bounds the queue's memory by rows, not by requests).
pub const QUEUE_ROWS: usize = 1_000_000;

enum Message {
    Served(Served, u64),
    Flush(oneshot::Sender<Result<(), String>>),
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    rows_written: AtomicU64,
    requests_dropped: AtomicU64,
    rows_dropped: AtomicU64,
    commits: AtomicU64,
    write_errors: AtomicU64,
}

/// The serving log, writing to its Delta table from a background task.
#[derive(Debug)]
pub struct DeltaServingLog {
    tx: mpsc::UnboundedSender<Message>,
    /// Told of each answer the writer takes.
    observer: Option<Arc<dyn Observer>>,
    /// Entity rows queued and not yet taken by the writer.
    queued: Arc<AtomicU64>,
    sample_rate: f64,
    seq: AtomicU64,
    counters: Arc<Counters>,
}

impl DeltaServingLog {
    /// Starts the writer on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(config: &ServingLogConfig, observer: Option<Arc<dyn Observer>>) -> Arc<DeltaServingLog> {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let queued = Arc::new(AtomicU64::new(0));
        // Request ids: this server's start time, then a sequence number.
        let server = format!("{:x}", chrono::Utc::now().timestamp_micros());
        tokio::spawn(writer(config.clone(), server, rx, counters.clone(), queued.clone(), observer.clone()));
        Arc::new(DeltaServingLog { tx, observer, queued, sample_rate: config.sample_rate, seq: AtomicU64::new(0), counters })
    }

    /// Writes everything logged so far and waits for the commit.
    ///
    /// # Errors
    /// The append's error, when the table cannot be written.
    pub async fn flush(&self) -> Result<(), String> {
        let (ack, done) = oneshot::channel();
        self.tx.send(Message::Flush(ack)).map_err(|_| "the serving log writer stopped".to_string())?;
        done.await.map_err(|_| "the serving log writer stopped".to_string())?
    }
}

/// Whether request `seq` is in the sample: a fixed hash of the sequence number against
/// the rate, so the choice does not bunch.
fn sampled(seq: u64, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    let mut z = seq.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 11) as f64) < rate * (1u64 << 53) as f64
}

impl ServingLog for DeltaServingLog {
    fn log(&self, served: Served) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if !sampled(seq, self.sample_rate) {
            return;
        }
        let rows = served.columns.first().map_or(0, |c| c.values.len()).max(1) as u64;
        let before = self.queued.fetch_add(rows, Ordering::Relaxed);
        if before + rows > QUEUE_ROWS as u64 || self.tx.send(Message::Served(served, seq)).is_err() {
            self.queued.fetch_sub(rows, Ordering::Relaxed);
            self.counters.requests_dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn render_metrics(&self, out: &mut quiver_runtime::metrics::Exposition) {
        let c = &self.counters;
        for (name, help, v) in [
            ("quiver_serving_log_requests_total", "answers queued for the serving log", &c.requests),
            ("quiver_serving_log_requests_dropped_total", "answers dropped because the log's queue was full", &c.requests_dropped),
            ("quiver_serving_log_rows_written_total", "log rows committed to the Delta table", &c.rows_written),
            ("quiver_serving_log_rows_dropped_total", "log rows dropped after failed appends", &c.rows_dropped),
            ("quiver_serving_log_commits_total", "Delta commits of the serving log", &c.commits),
            ("quiver_serving_log_write_errors_total", "failed appends (retried with the next batch)", &c.write_errors),
        ] {
            out.counter(name, help, v);
        }
        if let Some(observer) = &self.observer {
            observer.render(out, chrono::Utc::now().timestamp_micros());
        }
    }
}

async fn writer(
    config: ServingLogConfig,
    server: String,
    mut rx: mpsc::UnboundedReceiver<Message>,
    counters: Arc<Counters>,
    queued: Arc<AtomicU64>,
    observer: Option<Arc<dyn Observer>>,
) {
    let mut pending = LogColumns::default();
    let mut table = LogTable::new(config.location.clone());
    let mut first_at: Option<Instant> = None;
    // After a failed append, a full batch waits for the timer instead of retrying at once.
    let mut failed_at: Option<Instant> = None;
    let wait = Duration::from_millis(config.batch_ms);
    loop {
        let message = match first_at {
            Some(t) => match tokio::time::timeout((t + wait).saturating_duration_since(Instant::now()), rx.recv()).await {
                Ok(m) => m,
                Err(_) => {
                    // The batch is due.
                    failed_at = write(&config, &mut table, &mut pending, &counters).await.err().map(|_| Instant::now());
                    first_at = (!pending.is_empty()).then(Instant::now);
                    continue;
                }
            },
            None => rx.recv().await,
        };
        match message {
            Some(Message::Served(served, seq)) => {
                let rows = served.columns.first().map_or(0, |c| c.values.len()).max(1) as u64;
                queued.fetch_sub(rows, Ordering::Relaxed);
                append_log_rows(&served, &format!("{server}-{seq}"), &mut pending);
                if let Some(observer) = &observer {
                    observer.served(&served);
                }
                drop(served);
                if first_at.is_none() && !pending.is_empty() {
                    first_at = Some(Instant::now());
                }
                let full = pending.len() >= config.batch_rows || pending.bytes() >= MAX_BATCH_BYTES;
                if full && failed_at.is_none_or(|t| t.elapsed() >= wait) {
                    failed_at = write(&config, &mut table, &mut pending, &counters).await.err().map(|_| Instant::now());
                    first_at = (!pending.is_empty()).then(Instant::now);
                }
            }
            Some(Message::Flush(ack)) => {
                let result = write(&config, &mut table, &mut pending, &counters).await;
                failed_at = result.as_ref().err().map(|_| Instant::now());
                first_at = (!pending.is_empty()).then(Instant::now);
                let _ = ack.send(result);
            }
            None => {
                let _ = write(&config, &mut table, &mut pending, &counters).await;
                return;
            }
        }
    }
}

/// Appends the pending rows as one commit. On failure they wait for the next try, up to
/// ten batches' worth; beyond that they are dropped, counted.
async fn write(config: &ServingLogConfig, table: &mut LogTable, pending: &mut LogColumns, counters: &Counters) -> Result<(), String> {
    if pending.is_empty() {
        return Ok(());
    }
    let rows = pending.len() as u64;
    match table.append(pending).await {
        Ok(_) => {
            counters.rows_written.fetch_add(rows, Ordering::Relaxed);
            counters.commits.fetch_add(1, Ordering::Relaxed);
            *pending = LogColumns::default();
            Ok(())
        }
        Err(e @ quiver_offline::Error::Arrow(_)) => {
            // Rows that cannot form a batch never will: drop them, counted.
            counters.write_errors.fetch_add(1, Ordering::Relaxed);
            counters.rows_dropped.fetch_add(rows, Ordering::Relaxed);
            *pending = LogColumns::default();
            Err(format!("serving log {}: {e}", config.location))
        }
        Err(e) => {
            counters.write_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, rows, "serving log append failed; retrying with the next batch");
            if pending.len() > config.batch_rows.saturating_mul(10) || pending.bytes() >= 4 * MAX_BATCH_BYTES {
                counters.rows_dropped.fetch_add(rows, Ordering::Relaxed);
                *pending = LogColumns::default();
            }
            Err(format!("serving log {}: {e}", config.location))
        }
    }
}

/// A batch is written once a text column holds this many bytes, whatever its rows.
const MAX_BATCH_BYTES: usize = 256 << 20;

#[cfg(test)]
mod tests;
