//! The Redis Cluster online store (docs/settings.md): the same keys and packed rows as
//! [`crate::RedisStore`], each key on its slot's master.
//!
//! - Reads: one MGET of all keys, which the redis crate splits by slot and sends to the
//!   slots' masters at once, pipelined on one multiplexed connection per node — one
//!   round trip per node, answers put back in key order.
//! - Writes: the keys grouped by slot, each group one call of the same guarded-write
//!   script (a script's keys must share a slot), all groups in flight together; still
//!   guarded and atomic per key. With `replica_acks` each call is followed, in the same
//!   pipeline, by `WAIT replica_acks`: a write is acknowledged once that many replicas
//!   hold it, so a failover loses no acknowledged write.
//! - Failover: while a slot has no master its calls fail fast (the client retries
//!   briefly, then `Unavailable`: the server answers 503); once the cluster promotes a
//!   replica the store finds the new master by itself (a failed call renews the
//!   connection and its slot map from the seeds), without a restart.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;

use crate::error::{Error, Result};
use crate::redis_store::{GUARDED_WRITE, KEYS_PER_CALL, eviction_refusal, guarded_call, horizon, redact};
use crate::store::{OnlineStore, WriteRow};

/// Script calls in flight at once across the cluster.
const CALLS_IN_FLIGHT: usize = 64;
/// How long a write waits for its replicas (`WAIT`'s timeout; under the 2 s response timeout).
const REPLICA_WAIT_MS: u64 = 1_000;
/// The least time between two rebuilds of the connection after failures.
const REBUILD_EVERY: Duration = Duration::from_millis(500);

/// The connection and what renews it. The redis crate reconnects to a node that went
/// away but learns a new slot map only from a MOVED reply, which never comes while every
/// call goes to a dead master: after a failed call the store builds a new connection
/// from the seeds (in the background, at most every [`REBUILD_EVERY`]), whose slot map
/// names the promoted replica once the cluster has promoted one.
struct Shared {
    client: ClusterClient,
    conn: RwLock<ClusterConnection>,
    rebuilding: AtomicBool,
    last_rebuild: Mutex<Option<Instant>>,
}

/// A Redis Cluster through the redis crate's cluster client.
#[derive(Clone)]
pub struct RedisClusterStore {
    urls: Vec<String>,
    shared: Arc<Shared>,
    script: redis::Script,
    max_future_skew_us: i64,
    replica_acks: u32,
}

impl std::fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterStore").field("urls", &self.name()).finish()
    }
}

impl RedisClusterStore {
    /// Connects through the seed nodes `urls` (2 s connection and response timeouts,
    /// two quick retries), and checks the seeds' eviction policy as
    /// [`crate::RedisStore::connect`] does.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no seed answers or the cluster has no slot map;
    /// [`Error::Misconfigured`] for a seed that evicts any key.
    pub async fn connect(urls: &[String], replica_acks: u32) -> Result<RedisClusterStore> {
        let name = urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        let unavailable = |e: redis::RedisError| Error::Unavailable { store: format!("redis cluster {name}"), message: e.to_string() };
        let client = ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .retries(2)
            .min_retry_wait(50)
            .max_retry_wait(500)
            .build()
            .map_err(unavailable)?;
        let conn = client.get_async_connection().await.map_err(unavailable)?;
        let shared = Shared { client, conn: RwLock::new(conn), rebuilding: AtomicBool::new(false), last_rebuild: Mutex::new(None) };
        let store = RedisClusterStore {
            urls: urls.to_vec(),
            shared: Arc::new(shared),
            script: redis::Script::new(GUARDED_WRITE),
            max_future_skew_us: crate::store::DEFAULT_MAX_FUTURE_SKEW_US,
            replica_acks,
        };
        for url in urls {
            store.check_eviction_policy(url).await?;
        }
        Ok(store)
    }

    /// As [`crate::RedisStore::with_max_future_skew`].
    #[must_use]
    pub fn with_max_future_skew(mut self, skew: Duration) -> RedisClusterStore {
        self.max_future_skew_us = i64::try_from(skew.as_micros()).unwrap_or(i64::MAX);
        self
    }

    /// A seed node's `maxmemory-policy`, on a connection of its own (a cluster's nodes
    /// are configured alike; the seeds stand for them).
    async fn check_eviction_policy(&self, url: &str) -> Result<()> {
        let policy: Option<String> = async {
            let client = redis::Client::open(url).ok()?;
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(2)));
            let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.ok()?;
            let pair: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut conn).await.ok()?;
            pair.get(1).cloned()
        }
        .await;
        match eviction_refusal(policy.as_deref()) {
            Some(message) => Err(Error::Misconfigured { store: redact(url), message }),
            None => Ok(()),
        }
    }

    fn conn(&self) -> ClusterConnection {
        self.shared.conn.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A failed call: the error for the caller (503 from the server), and a new
    /// connection built in the background (see [`Shared`]).
    fn unavailable(&self, e: &redis::RedisError) -> Error {
        let shared = self.shared.clone();
        let due =
            shared.last_rebuild.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_none_or(|t| t.elapsed() >= REBUILD_EVERY);
        if due && !shared.rebuilding.swap(true, Ordering::AcqRel) {
            tokio::spawn(async move {
                if let Ok(conn) = shared.client.get_async_connection().await {
                    *shared.conn.write().unwrap_or_else(std::sync::PoisonError::into_inner) = conn;
                }
                *shared.last_rebuild.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
                shared.rebuilding.store(false, Ordering::Release);
            });
        }
        Error::Unavailable { store: self.name(), message: e.to_string() }
    }

    /// One slot's guarded-write call, with its `WAIT` when replicas must acknowledge.
    /// Returns how many rows were written.
    async fn write_slot(&self, rows: &[&WriteRow], horizon: &[u8; 8]) -> Result<usize> {
        let call = |script: Option<&str>| {
            let mut cmd = match script {
                None => redis::cmd("EVALSHA"),
                Some(_) => redis::cmd("EVAL"),
            };
            cmd.arg(script.unwrap_or(self.script.get_hash()));
            guarded_call(&mut cmd, rows, horizon);
            let mut pipe = redis::pipe();
            pipe.add_command(cmd);
            if self.replica_acks > 0 {
                pipe.cmd("WAIT").arg(self.replica_acks).arg(REPLICA_WAIT_MS);
            }
            pipe
        };
        let mut conn = self.conn();
        let answer: redis::RedisResult<Vec<i64>> = call(None).query_async(&mut conn).await;
        let answer = match answer {
            // A node that never saw the script (new, restarted, promoted): send it whole.
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                call(Some(GUARDED_WRITE)).query_async(&mut conn).await
            }
            other => other,
        }
        .map_err(|e| self.unavailable(&e))?;
        let written = answer.first().copied().unwrap_or(0);
        if self.replica_acks > 0 {
            let acked = answer.get(1).copied().unwrap_or(0);
            if acked < i64::from(self.replica_acks) {
                return Err(Error::Unavailable {
                    store: self.name(),
                    message: format!(
                        "a write reached {acked} of the {} replicas online_store.replica_acks asks for within {REPLICA_WAIT_MS} ms",
                        self.replica_acks
                    ),
                });
            }
        }
        Ok(usize::try_from(written).unwrap_or(0))
    }
}

#[async_trait::async_trait]
impl OnlineStore for RedisClusterStore {
    fn name(&self) -> String {
        format!("redis cluster {}", self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(","))
    }

    async fn write(&self, rows: &[WriteRow]) -> Result<usize> {
        let mut by_slot: HashMap<Slot, Vec<&WriteRow>> = HashMap::new();
        for r in rows {
            by_slot.entry(Slot::for_key(r.key.as_bytes())).or_default().push(r);
        }
        let horizon = horizon(self.max_future_skew_us);
        let mut calls = Vec::new();
        for group in by_slot.values() {
            for chunk in group.chunks(KEYS_PER_CALL) {
                calls.push(self.write_slot(chunk, &horizon));
            }
        }
        let counts: Vec<Result<usize>> = futures::stream::iter(calls).buffer_unordered(CALLS_IN_FLIGHT).collect().await;
        counts.into_iter().sum()
    }

    async fn read(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn();
        redis::cmd("MGET").arg(keys).query_async(&mut conn).await.map_err(|e| self.unavailable(&e))
    }

    /// Scans every master on a connection of its own (a SCAN cursor is one node's).
    async fn keys_with_prefix(&self, prefix: &str, remove: bool) -> Result<u64> {
        let mut conn = self.conn();
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await.map_err(|e| self.unavailable(&e))?;
        let mut total = 0;
        for addr in masters(&nodes) {
            let url = node_url(&self.urls[0], &addr);
            let failed = |e: redis::RedisError| Error::Unavailable { store: format!("redis cluster node {addr}"), message: e.to_string() };
            let client = redis::Client::open(url.as_str()).map_err(failed)?;
            let mut node = client.get_multiplexed_async_connection().await.map_err(failed)?;
            total += crate::redis_store::scan_prefix(&mut node, prefix, remove, true).await.map_err(failed)?;
        }
        Ok(total)
    }
}

/// The `host:port` of every master that is not failing, from `CLUSTER NODES`.
fn masters(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            let master = flags.split(',').any(|f| f == "master") && !flags.contains("fail");
            master.then(|| fields[1].split('@').next().unwrap_or(fields[1]).to_string())
        })
        .collect()
}

/// The seed's URL (scheme, credentials, database) at another node's address.
fn node_url(seed: &str, addr: &str) -> String {
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    let (auth, host) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let tail = host.find('/').map_or("", |slash| &host[slash..]);
    format!("{scheme}://{auth}{addr}{tail}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let nodes = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7003@17003 slave a1 0 0 1 connected\n\
                     c3 127.0.0.1:7001@17001,host master - 0 0 2 connected 5461-10922\n\
                     d4 127.0.0.1:7002@17002 master,fail - 0 0 3 connected\n";
        assert_eq!(super::masters(nodes), ["127.0.0.1:7000", "127.0.0.1:7001"]);
        assert_eq!(super::node_url("redis://:pw@10.0.0.1:7000/0", "10.0.0.2:7001"), "redis://:pw@10.0.0.2:7001/0");
        assert_eq!(super::node_url("redis://10.0.0.1:7000", "10.0.0.2:7001"), "redis://10.0.0.2:7001");
    }
}
