//! Where events go (docs/lineage.md#transports). `file`: one JSON line per event,
//! appended under the file's lock so concurrent processes never interleave. `http`: a
//! POST per event from one thread of the process, off the job's path — a bounded queue
//! (an event that does not fit is dropped), a timeout per request, bounded retries with
//! backoff. A failure is logged and counted (`quiver_lineage_events_total` on
//! `/metrics`), never returned to the job.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use quiver_runtime::metrics::LINEAGE_EVENTS as COUNT;
use quiver_sdk::config::LineageTransport;
use serde_json::Value;

#[derive(Debug)]
pub(super) enum Sink {
    File(PathBuf),
    Http(Arc<Http>),
}

impl Sink {
    /// The sink of `transport`; `None` for `none`. One HTTP sender per endpoint and
    /// process, however many jobs the process runs.
    pub(super) fn open(transport: &LineageTransport) -> Option<Sink> {
        match transport {
            LineageTransport::None => None,
            LineageTransport::File { path } => Some(Sink::File(path.clone())),
            LineageTransport::Http { .. } => Some(Sink::Http(Http::shared(transport))),
        }
    }

    pub(super) fn send(&self, event: &Value) {
        match self {
            Sink::File(path) => {
                let mut line = event.to_string();
                line.push('\n');
                match append(path, line.as_bytes()) {
                    Ok(()) => {
                        COUNT.sent.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        COUNT.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(file = %path.display(), error = %e, "lineage event not written; the job goes on");
                    }
                }
            }
            Sink::Http(http) => http.enqueue(event.to_string()),
        }
    }
}

/// `bytes` appended to `path` in one write, under `<path>.lock`.
fn append(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let lock = path.with_extension("lock");
    let _guard = quiver_sdk::files::FileLock::acquire(&lock, Duration::from_secs(10))?;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(bytes)?;
    file.flush()
}

/// An HTTP endpoint's sender: the queue its thread drains.
#[derive(Debug)]
pub(super) struct Http {
    transport: LineageTransport,
    queue: mpsc::SyncSender<String>,
    /// Events queued or being sent.
    pending: AtomicUsize,
    /// Whether the last attempt failed (the endpoint refused, failed or did not answer).
    failing: AtomicBool,
    /// When the attempt in flight began, if one is.
    in_flight: Mutex<Option<Instant>>,
    timeout: Duration,
}

/// How long an attempt may be in flight before a process's exit stops waiting for it:
/// an endpoint that answers waits out a job's last events, one that does not answer
/// costs a short job this at most, and a longer job nothing.
const PATIENCE: Duration = Duration::from_millis(500);

/// The process's HTTP senders, one per endpoint configuration.
static SENDERS: Mutex<Vec<Arc<Http>>> = Mutex::new(Vec::new());

impl Http {
    fn shared(transport: &LineageTransport) -> Arc<Http> {
        let mut senders = SENDERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(http) = senders.iter().find(|h| h.transport == *transport) {
            return http.clone();
        }
        let LineageTransport::Http { url, token, timeout, retries, queue } = transport.clone() else {
            unreachable!("an http sender of an http transport")
        };
        let (tx, rx) = mpsc::sync_channel(queue);
        let http = Arc::new(Http {
            transport: transport.clone(),
            queue: tx,
            pending: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            in_flight: Mutex::new(None),
            timeout,
        });
        let worker = http.clone();
        let spawned = std::thread::Builder::new().name("lineage-http".into()).spawn(move || {
            let endpoint = Endpoint { url, token, retries };
            worker.drain(&rx, &endpoint);
        });
        if let Err(e) = spawned {
            // Its receiver is gone with the closure: every event counts as dropped.
            tracing::warn!(error = %e, "lineage: the http sender did not start; events are dropped");
        }
        senders.push(http.clone());
        http
    }

    fn enqueue(&self, body: String) {
        self.pending.fetch_add(1, Ordering::SeqCst);
        if self.queue.try_send(body).is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            if COUNT.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!("lineage queue full: events are dropped (counted on /metrics); the job goes on");
            }
        }
    }

    fn drain(&self, rx: &mpsc::Receiver<String>, endpoint: &Endpoint) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        // A plain-http endpoint needs no certificates (loading the system's costs a
        // process start milliseconds of CPU).
        let https = endpoint.url.starts_with("https:");
        let client = reqwest::Client::builder().timeout(self.timeout).tls_built_in_root_certs(https).build();
        let (Ok(runtime), Ok(client)) = (runtime, client) else {
            tracing::warn!("lineage: the http client did not start; events are dropped");
            return;
        };
        for body in rx {
            runtime.block_on(self.deliver(&client, endpoint, body));
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// One event to the endpoint: retried after a failure, a timeout or a 5xx (also
    /// 408 and 429) with backoff from 200 ms; another 4xx is the endpoint refusing it.
    async fn deliver(&self, client: &reqwest::Client, endpoint: &Endpoint, body: String) {
        let mut last = String::new();
        for attempt in 0..=endpoint.retries {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << (attempt - 1).min(4))).await;
            }
            let mut request = client.post(&endpoint.url).header("content-type", "application/json").body(body.clone());
            if let Some(token) = &endpoint.token {
                request = request.bearer_auth(token);
            }
            self.mark_in_flight(Some(Instant::now()));
            let sent = request.send().await;
            self.mark_in_flight(None);
            let status = match sent {
                Ok(answer) => answer.status(),
                Err(e) => {
                    last = if e.is_timeout() { format!("no answer within {:?}", self.timeout) } else { e.to_string() };
                    self.failed_attempt(endpoint, &last);
                    continue;
                }
            };
            if status.is_success() {
                COUNT.sent.fetch_add(1, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::SeqCst) {
                    tracing::info!(url = %endpoint.url, "lineage endpoint answers again");
                }
                return;
            }
            last = format!("answered {status}");
            self.failed_attempt(endpoint, &last);
            if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429 {
                break;
            }
        }
        COUNT.failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(url = %endpoint.url, error = %last, "lineage event not delivered; dropped");
    }

    fn mark_in_flight(&self, since: Option<Instant>) {
        *self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = since;
    }

    /// Whether the attempt in flight has waited longer than [`PATIENCE`].
    fn stalled(&self) -> bool {
        self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_some_and(|t| t.elapsed() > PATIENCE)
    }

    fn failed_attempt(&self, endpoint: &Endpoint, error: &str) {
        if !self.failing.swap(true, Ordering::SeqCst) {
            tracing::warn!(url = %endpoint.url, %error, "lineage endpoint failing: events are retried, then dropped and counted on /metrics; jobs go on");
        }
    }
}

#[derive(Debug)]
struct Endpoint {
    url: String,
    token: Option<String>,
    retries: u32,
}

/// Before the process ends: waits for queued events while their endpoint answers (each
/// attempt within [`PATIENCE`]), at most its timeout in all; what is left is counted
/// dropped. An endpoint already failing, or one sitting on an attempt, is not waited
/// for, so a dead or stalled one never holds a job's exit.
pub(super) fn flush() {
    let senders = SENDERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    for http in senders {
        let deadline = Instant::now() + http.timeout;
        while http.pending.load(Ordering::SeqCst) > 0
            && !http.failing.load(Ordering::SeqCst)
            && !http.stalled()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let left = http.pending.load(Ordering::SeqCst);
        if left > 0 {
            COUNT.dropped.fetch_add(left as u64, Ordering::Relaxed);
            tracing::warn!(events = left, "lineage events not sent before exit (the endpoint is failing or slow); dropped");
        }
    }
}
