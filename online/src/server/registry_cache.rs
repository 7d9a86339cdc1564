//! The definitions the server answers from.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use quiver_sdk::{Definitions, FileRegistry};

/// The definitions the server answers from, re-read when the registry file changes.
///
/// A registry that cannot be read (half-written by hand, deleted, another project's)
/// never takes the server down: the last good definitions stay, the failure is logged
/// once per change of the file and counted (`quiver_registry_errors_total`), and
/// `quiver_registry_stale` is 1 until a good registry is read again.
#[derive(Debug)]
pub struct RegistryCache {
    registry: FileRegistry,
    project: String,
    cached: RwLock<Cached>,
    errors: AtomicU64,
}

#[derive(Debug)]
struct Cached {
    /// The file's modification time when last looked at (`None`: missing).
    mtime: Option<SystemTime>,
    defs: Arc<Definitions>,
    /// The registry version `defs` came from (0: nothing applied yet).
    version: u64,
    /// Why the file's current content is not in use, when it is not.
    stale: Option<String>,
}

impl RegistryCache {
    /// # Errors
    /// When the registry exists and cannot be read (at start, there is no last good).
    pub fn new(path: PathBuf, project: &str) -> quiver_sdk::Result<RegistryCache> {
        let registry = FileRegistry::new(path);
        let mtime = mtime_of(registry.path());
        let doc = registry.load_or_empty(project)?;
        Ok(RegistryCache {
            registry,
            project: project.to_string(),
            cached: RwLock::new(Cached { mtime, defs: Arc::new(doc.definitions), version: doc.version, stale: None }),
            errors: AtomicU64::new(0),
        })
    }

    /// The current definitions: re-read when the file's modification time changed;
    /// the last good ones when the file cannot be read.
    /// The registry's applies, oldest first (version, time, changes), read from the
    /// file; empty when it cannot be read.
    pub fn history(&self) -> Vec<quiver_sdk::registry::HistoryEntry> {
        self.registry.load_or_empty(&self.project).map(|doc| doc.history).unwrap_or_default()
    }

    /// The registry version [`Self::current`] last answered with (0: nothing applied).
    pub fn version(&self) -> u64 {
        self.cached.read().expect("registry lock").version
    }

    pub fn current(&self) -> Arc<Definitions> {
        let mtime = mtime_of(self.registry.path());
        {
            let cached = self.cached.read().expect("registry lock");
            if cached.mtime == mtime {
                return cached.defs.clone();
            }
        }
        let mut cached = self.cached.write().expect("registry lock");
        if cached.mtime == mtime {
            return cached.defs.clone();
        }
        cached.mtime = mtime;
        let loaded = match mtime {
            // A registry that was applied to does not become "nothing applied".
            None if cached.version > 0 => Err("the file is missing".to_string()),
            _ => self.registry.load_or_empty(&self.project).map_err(|e| e.to_string()),
        };
        match loaded {
            Ok(doc) => {
                cached.defs = Arc::new(doc.definitions);
                cached.version = doc.version;
                cached.stale = None;
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    registry = %self.registry.path().display(),
                    error = %e,
                    version = cached.version,
                    "registry cannot be read; serving on with the last good definitions"
                );
                cached.stale = Some(e);
            }
        }
        cached.defs.clone()
    }

    /// Why the registry file is not in use (`None`: it is).
    pub fn stale(&self) -> Option<String> {
        self.cached.read().expect("registry lock").stale.clone()
    }

    pub(super) fn render_metrics(&self, out: &mut quiver_sdk::metrics::Exposition) {
        out.counter("quiver_registry_errors_total", "Registry changes that could not be read.", &self.errors)
            .gauge(
                "quiver_registry_stale",
                "1 while the registry file is not in use (the last good definitions answer).",
                u8::from(self.stale().is_some()),
            )
            .gauge("quiver_registry_version", "The registry version answering.", self.cached.read().expect("registry lock").version);
    }
}

fn mtime_of(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
