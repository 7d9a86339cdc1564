//! Where events go. `file`: one JSON line per event, appended under the file's lock so
//! concurrent processes never interleave; a failure is logged and counted, never
//! returned. (`http` is not built yet: such a configuration writes nothing and says so
//! once.)

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use quiver_sdk::config::LineageTransport;
use serde_json::Value;

static SENT: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

pub(super) fn counters() -> (u64, u64) {
    (SENT.load(Ordering::Relaxed), FAILED.load(Ordering::Relaxed))
}

#[derive(Debug)]
pub(super) enum Sink {
    File(PathBuf),
    Unsupported,
}

impl Sink {
    pub(super) fn open(transport: &LineageTransport) -> Sink {
        match transport {
            LineageTransport::File { path } => Sink::File(path.clone()),
            _ => {
                tracing::warn!("lineage.transport http is not built yet: no lineage events are sent");
                Sink::Unsupported
            }
        }
    }

    pub(super) fn send(&self, event: &Value) {
        let Sink::File(path) = self else { return };
        let mut line = event.to_string();
        line.push('\n');
        match append(path, line.as_bytes()) {
            Ok(()) => {
                SENT.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                FAILED.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(file = %path.display(), error = %e, "lineage event not written; the job goes on");
            }
        }
    }
}

/// `bytes` appended to `path` in one write, under `<path>.lock`.
fn append(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let lock = path.with_extension("lock");
    let _guard = quiver_sdk::files::FileLock::acquire(&lock, std::time::Duration::from_secs(10))?;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(bytes)?;
    file.flush()
}
