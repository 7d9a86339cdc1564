//! The store contract.

use std::sync::Arc;

use quiver_sdk::{Config, OnlineStoreConfig};

use crate::error::Result;

/// One guarded write: a store key, its packed row, and when the key expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRow {
    pub key: String,
    /// A packed row ([`quiver_runtime::encoding::OnlineRow::encode`]); its first 16 bytes
    /// order it against the stored row.
    pub row: Vec<u8>,
    /// Expiry, milliseconds since the epoch; `None` keeps the key.
    pub expire_at_ms: Option<i64>,
}

impl WriteRow {
    /// The guarded writes of typed rows of `view` (messages, pushes), under `project`.
    pub fn of_rows(project: &str, view: &quiver_sdk::FeatureView, rows: &[quiver_runtime::rows::ViewRow]) -> Vec<WriteRow> {
        let print = quiver_sdk::definitions::fingerprint(view);
        rows.iter()
            .map(|r| {
                let (key, row, expire_at_ms) = r.online(project, view, print);
                WriteRow { key, row, expire_at_ms }
            })
            .collect()
    }
}

/// An online store.
///
/// Both operations take many keys at once: a Redis implementation sends them in one
/// round trip (a pipeline), so a request of N entities x V views costs one.
#[async_trait::async_trait]
pub trait OnlineStore: Send + Sync + std::fmt::Debug {
    /// A short description for messages (`redis://127.0.0.1:6379/0`, `embedded online.db`).
    fn name(&self) -> String;

    /// Guarded writes: each row replaces its key's row unless the stored row has a
    /// greater (event_ts, created_ts); an equal one is replaced, and so is a stored row
    /// dated more than the store's `max_future_skew` after its clock (it should never
    /// have been written, and would otherwise block the key until its time came).
    /// Returns how many rows were written (the rest were older than what is stored).
    ///
    /// # Errors
    /// [`crate::Error::Unavailable`] when the store cannot be reached.
    async fn write(&self, rows: &[WriteRow]) -> Result<usize>;

    /// The packed rows of `keys`, in order; `None` for a key never written or expired.
    ///
    /// # Errors
    /// [`crate::Error::Unavailable`] when the store cannot be reached.
    async fn read(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>>;

    /// How many keys start with `prefix` — one version of a view's key space,
    /// `quiver:<project>:<view>@N:` ([`view_prefix`]) — and, with `remove`, removes
    /// them: for `quiver retire` and `quiver versions` (docs/versions.md).
    ///
    /// # Errors
    /// [`crate::Error::Unavailable`] when the store cannot be reached;
    /// [`crate::Error::Misconfigured`] from a store that cannot list its keys.
    async fn keys_with_prefix(&self, prefix: &str, remove: bool) -> Result<u64> {
        let _ = (prefix, remove);
        Err(crate::Error::Misconfigured { store: self.name(), message: "this store cannot list its keys".to_string() })
    }
}

/// The prefix of every key of one version of a view: `quiver:<project>:<storage name>:`.
pub fn view_prefix(project: &str, view: &quiver_sdk::FeatureView) -> String {
    format!("quiver:{project}:{}:", view.storage_name())
}

/// The `max_future_skew` a store uses unless told otherwise: 5 minutes, microseconds.
pub const DEFAULT_MAX_FUTURE_SKEW_US: i64 = 300_000_000;

/// Opens the online store the project's config names, with its `max_future_skew`.
///
/// # Errors
/// When the embedded file cannot be opened, Redis cannot be reached, or Redis evicts
/// keys that have no expiry ([`crate::RedisStore::connect`]).
pub async fn open_store(config: &Config) -> Result<Arc<dyn OnlineStore>> {
    let skew = config.max_future_skew;
    Ok(match &config.online_store {
        OnlineStoreConfig::Embedded { path } => Arc::new(crate::EmbeddedStore::open(path)?.with_max_future_skew(skew)),
        OnlineStoreConfig::Redis { url } => Arc::new(crate::RedisStore::connect(url).await?.with_max_future_skew(skew)),
        OnlineStoreConfig::RedisCluster { urls, replica_acks } => {
            Arc::new(crate::RedisClusterStore::connect(urls, *replica_acks).await?.with_max_future_skew(skew))
        }
    })
}
