//! The embedded online store: a single redb file, for local use with no server.
//!
//! Why redb: pure Rust (no C toolchain or system library), ACID with crash-safe commits,
//! readers that never block the writer (MVCC), one file, and an actively maintained
//! stable format. SQLite would work too but brings C and a second query language for a
//! key-value job; sled's format is not stable.
//!
//! Each value is the expiry (8 bytes, ms since the epoch, 0 = none) followed by the
//! packed row. Expired keys read as absent, as they do in Redis. Nothing is ever
//! evicted: the file grows with the keys of views without a TTL.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use quiver_runtime::encoding::replaces_before;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::error::{Error, Result};
use crate::store::{OnlineStore, WriteRow};

const ROWS: TableDefinition<&str, &[u8]> = TableDefinition::new("rows");

/// The embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    path: PathBuf,
    db: Arc<Database>,
    /// A stored row dated more than this after the clock never blocks a write.
    max_future_skew_us: i64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl EmbeddedStore {
    /// Opens (or creates) the store file.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the file is not a store or cannot be opened (another
    /// process holding it open, for one).
    pub fn open(path: &Path) -> Result<EmbeddedStore> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::Corrupt { store: path.display().to_string(), message: e.to_string() })?;
        }
        let db = Database::create(path).map_err(|e| Error::Corrupt { store: path.display().to_string(), message: e.to_string() })?;
        Ok(EmbeddedStore { path: path.to_path_buf(), db: Arc::new(db), max_future_skew_us: crate::store::DEFAULT_MAX_FUTURE_SKEW_US })
    }

    /// How far after the clock a stored row's event time may be and still block older
    /// writes (the project's `max_future_skew`; default 5 minutes).
    #[must_use]
    pub fn with_max_future_skew(mut self, skew: std::time::Duration) -> EmbeddedStore {
        self.max_future_skew_us = i64::try_from(skew.as_micros()).unwrap_or(i64::MAX);
        self
    }

    fn fail(&self, e: impl std::fmt::Display) -> Error {
        Error::Corrupt { store: self.path.display().to_string(), message: e.to_string() }
    }

    fn write_blocking(&self, rows: &[WriteRow]) -> Result<usize> {
        let now = now_ms();
        let horizon = now.saturating_mul(1000).saturating_add(self.max_future_skew_us);
        let txn = self.db.begin_write().map_err(|e| self.fail(e))?;
        let mut written = 0;
        {
            let mut table = txn.open_table(ROWS).map_err(|e| self.fail(e))?;
            for r in rows {
                let take = match table.get(r.key.as_str()).map_err(|e| self.fail(e))? {
                    Some(stored) => {
                        let stored = stored.value();
                        let live = expiry(stored).is_none_or(|at| at > now);
                        !live || replaces_before(&stored[8..], &r.row, horizon)
                    }
                    None => true,
                };
                if take {
                    let mut value = Vec::with_capacity(8 + r.row.len());
                    value.extend_from_slice(&r.expire_at_ms.unwrap_or(0).to_le_bytes());
                    value.extend_from_slice(&r.row);
                    table.insert(r.key.as_str(), value.as_slice()).map_err(|e| self.fail(e))?;
                    written += 1;
                }
            }
        }
        txn.commit().map_err(|e| self.fail(e))?;
        Ok(written)
    }

    fn read_blocking(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        let now = now_ms();
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let table = match txn.open_table(ROWS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(vec![None; keys.len()]),
            Err(e) => return Err(self.fail(e)),
        };
        keys.iter()
            .map(|k| {
                Ok(table.get(k.as_str()).map_err(|e| self.fail(e))?.and_then(|v| {
                    let v = v.value();
                    let live = expiry(v).is_none_or(|at| at > now);
                    live.then(|| v[8..].to_vec())
                }))
            })
            .collect()
    }

    fn prefix_blocking(&self, prefix: &str, remove: bool) -> Result<u64> {
        let now = now_ms();
        if remove {
            let txn = self.db.begin_write().map_err(|e| self.fail(e))?;
            let removed;
            {
                let mut table = txn.open_table(ROWS).map_err(|e| self.fail(e))?;
                let mut keys = Vec::new();
                for entry in table.range(prefix..).map_err(|e| self.fail(e))? {
                    let (key, value) = entry.map_err(|e| self.fail(e))?;
                    if !key.value().starts_with(prefix) {
                        break;
                    }
                    keys.push((key.value().to_string(), expiry(value.value()).is_none_or(|at| at > now)));
                }
                for (key, _) in &keys {
                    table.remove(key.as_str()).map_err(|e| self.fail(e))?;
                }
                removed = keys.iter().filter(|(_, live)| *live).count();
            }
            txn.commit().map_err(|e| self.fail(e))?;
            return Ok(removed as u64);
        }
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let table = match txn.open_table(ROWS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(self.fail(e)),
        };
        let mut live = 0;
        for entry in table.range(prefix..).map_err(|e| self.fail(e))? {
            let (key, value) = entry.map_err(|e| self.fail(e))?;
            if !key.value().starts_with(prefix) {
                break;
            }
            live += u64::from(expiry(value.value()).is_none_or(|at| at > now));
        }
        Ok(live)
    }
}

/// The expiry of a stored value, `None` for none (or a value too short to have one).
fn expiry(stored: &[u8]) -> Option<i64> {
    let at = i64::from_le_bytes(stored.get(..8)?.try_into().ok()?);
    (at != 0).then_some(at)
}

#[async_trait::async_trait]
impl OnlineStore for EmbeddedStore {
    fn name(&self) -> String {
        format!("embedded {}", self.path.display())
    }

    async fn write(&self, rows: &[WriteRow]) -> Result<usize> {
        let this = self.clone();
        let rows = rows.to_vec();
        tokio::task::spawn_blocking(move || this.write_blocking(&rows)).await.map_err(|e| self.fail(e))?
    }

    async fn read(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        let this = self.clone();
        let keys = keys.to_vec();
        tokio::task::spawn_blocking(move || this.read_blocking(&keys)).await.map_err(|e| self.fail(e))?
    }

    async fn keys_with_prefix(&self, prefix: &str, remove: bool) -> Result<u64> {
        let this = self.clone();
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || this.prefix_blocking(&prefix, remove)).await.map_err(|e| self.fail(e))?
    }
}
