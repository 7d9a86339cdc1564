//! The Redis online store: one string key per (project, view, entity) holding the packed
//! row; reads with one MGET, guarded writes with a server-side Lua script, pipelined.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::{Error, Result};
use crate::store::{OnlineStore, WriteRow};

/// The guarded write, for any number of keys. ARGV[1] is the horizon (the writer's
/// clock plus `max_future_skew`, as the 8 order-preserving bytes of an event time),
/// then (row, expire-at ms or 0) per key. A row replaces the stored one unless the
/// stored header (first 16 bytes: event time then created time, order-preserving) is
/// greater; equal replaces; a stored event time after the horizon never blocks. The
/// headers are compared as four big-endian 32-bit words (`struct.unpack`), so the
/// server's locale plays no part (Lua's `<` on strings would use strcoll). The stored
/// rows are read with one MGET for all keys, rows without an expiry written with one
/// MSET: a call costs Redis two commands plus one SET per row with an expiry, not a GET
/// and a SET per row; the expiry passes through as the string it came as (no number
/// conversions). A key given twice is judged against the row written first.
pub(crate) const GUARDED_WRITE: &str = r#"
local h1, h2 = struct.unpack('>I4I4', ARGV[1])
local stored = redis.call('MGET', unpack(KEYS))
local plain = {}
local taken = {}
local written = 0
for i, key in ipairs(KEYS) do
  local new = ARGV[2 * i]
  local cur = taken[key] or stored[i]
  local take = true
  if cur and #cur >= 16 then
    local c1, c2, c3, c4 = struct.unpack('>I4I4I4I4', cur)
    if c1 < h1 or (c1 == h1 and c2 <= h2) then
      if #new < 16 then
        take = false
      else
        local n1, n2, n3, n4 = struct.unpack('>I4I4I4I4', new)
        if n1 ~= c1 then take = n1 > c1
        elseif n2 ~= c2 then take = n2 > c2
        elseif n3 ~= c3 then take = n3 > c3
        else take = n4 >= c4 end
      end
    end
  end
  if take then
    taken[key] = new
    local expire_at = ARGV[2 * i + 1]
    if expire_at ~= '0' then
      redis.call('SET', key, new, 'PXAT', expire_at)
    else
      plain[#plain + 1] = key
      plain[#plain + 1] = new
    end
    written = written + 1
  end
end
if #plain > 0 then
  redis.call('MSET', unpack(plain))
end
return written
"#;

/// Keys per script call; several calls go out in one pipeline.
pub(crate) const KEYS_PER_CALL: usize = 500;
/// Script calls per pipeline (one round trip).
const CALLS_PER_PIPELINE: usize = 20;

/// Pipelines sent before the first answer comes back.
const PIPELINES_IN_FLIGHT: usize = 4;

/// Redis through a multiplexed connection manager (reconnects on its own).
#[derive(Clone)]
pub struct RedisStore {
    url: String,
    conn: ConnectionManager,
    script: redis::Script,
    /// A stored row dated more than this after the clock never blocks a write.
    max_future_skew_us: i64,
    /// Whether the keys written lately were mostly absent: then a batch is first sent
    /// as plain `SET ... NX` (what the guarded write does to an absent key, at the cost
    /// of one command and no script), and only the keys that exist go through the
    /// script. Cleared once a batch finds most of its keys stored.
    absent: Arc<AtomicBool>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("url", &self.url).finish()
    }
}

impl RedisStore {
    /// Connects, with a 2 s connection timeout and a 2 s response timeout, so a Redis
    /// that is down makes calls fail fast instead of hanging.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when Redis cannot be reached.
    pub async fn connect(url: &str) -> Result<RedisStore> {
        let unavailable = |e: redis::RedisError| Error::Unavailable { store: redact(url), message: e.to_string() };
        let client = redis::Client::open(url).map_err(unavailable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config).await.map_err(unavailable)?;
        let store = RedisStore {
            url: url.to_string(),
            conn,
            script: redis::Script::new(GUARDED_WRITE),
            max_future_skew_us: crate::store::DEFAULT_MAX_FUTURE_SKEW_US,
            absent: Arc::new(AtomicBool::new(true)),
        };
        store.check_eviction_policy().await?;
        Ok(store)
    }

    /// How far after the clock a stored row's event time may be and still block older
    /// writes (the project's `max_future_skew`; default 5 minutes).
    #[must_use]
    pub fn with_max_future_skew(mut self, skew: Duration) -> RedisStore {
        self.max_future_skew_us = i64::try_from(skew.as_micros()).unwrap_or(i64::MAX);
        self
    }

    /// Refuses a Redis whose `maxmemory-policy` evicts any key (`allkeys-*`): an evicted
    /// key lets an older row win the guarded write, and a view without a TTL would lose
    /// values silently. `volatile-*` policies evict only keys with an expiry (views with
    /// a TTL, whose evicted keys read NOT_FOUND) and `noeviction` refuses writes when
    /// full (the writers retry). A Redis that hides `CONFIG` (a managed service) is
    /// accepted with a warning in the log.
    async fn check_eviction_policy(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let answer: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut conn).await;
        match answer {
            Ok(pair) => match eviction_refusal(pair.get(1).map(String::as_str)) {
                Some(message) => Err(Error::Misconfigured { store: redact(&self.url), message }),
                None => Ok(()),
            },
            Err(e) => {
                tracing::warn!(store = %redact(&self.url), error = %e, "cannot read maxmemory-policy (CONFIG GET refused); make sure Redis does not evict keys without expiry (allkeys-*)");
                Ok(())
            }
        }
    }

    fn unavailable(&self, e: redis::RedisError) -> Error {
        Error::Unavailable { store: redact(&self.url), message: e.to_string() }
    }

    async fn write_pipeline(&self, rows: &[WriteRow]) -> redis::RedisResult<usize> {
        let horizon = horizon(self.max_future_skew_us);
        let mut pipe = redis::pipe();
        for chunk in rows.chunks(KEYS_PER_CALL) {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.script.get_hash());
            guarded_call(&mut cmd, chunk, &horizon);
            pipe.add_command(cmd);
        }
        let mut conn = self.conn.clone();
        let counts: Vec<usize> = pipe.query_async(&mut conn).await?;
        Ok(counts.iter().sum())
    }

    /// Plain `SET key row NX [PXAT t]` for every row, in one pipeline: the rows whose key
    /// was absent are written (the guarded write's answer for an absent key); the
    /// others are returned.
    async fn write_absent<'a>(&self, batch: &'a [WriteRow]) -> redis::RedisResult<(usize, Vec<&'a WriteRow>)> {
        let mut pipe = redis::pipe();
        for r in batch {
            let cmd = pipe.cmd("SET").arg(&r.key).arg(&r.row[..]).arg("NX");
            if let Some(at) = r.expire_at_ms {
                cmd.arg("PXAT").arg(at);
            }
        }
        let mut conn = self.conn.clone();
        let answers: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let stored: Vec<&WriteRow> = batch.iter().zip(&answers).filter(|(_, a)| matches!(a, redis::Value::Nil)).map(|(r, _)| r).collect();
        Ok((batch.len() - stored.len(), stored))
    }

    /// One pipeline: the absent keys by `SET NX` while most keys are absent, the rest
    /// through the guarded script.
    async fn write_batch(&self, batch: &[WriteRow]) -> Result<usize> {
        if !self.absent.load(Ordering::Relaxed) {
            return self.write_guarded(batch).await;
        }
        let (written, stored) = self.write_absent(batch).await.map_err(|e| self.unavailable(e))?;
        if stored.len() * 2 > batch.len() {
            self.absent.store(false, Ordering::Relaxed);
        }
        if stored.is_empty() {
            return Ok(written);
        }
        let rest: Vec<WriteRow> = stored.into_iter().cloned().collect();
        Ok(written + self.write_guarded(&rest).await?)
    }

    /// One pipeline of guarded script calls, loading the script first if Redis forgot
    /// it (restarted, flushed).
    async fn write_guarded(&self, batch: &[WriteRow]) -> Result<usize> {
        match self.write_pipeline(batch).await {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut conn = self.conn.clone();
                self.script.prepare_invoke().load_async(&mut conn).await.map_err(|e| self.unavailable(e))?;
                self.write_pipeline(batch).await.map_err(|e| self.unavailable(e))
            }
            Err(e) => Err(self.unavailable(e)),
        }
    }
}

/// The guarded write's ARGV[1]: the clock plus `max_future_skew_us`, as the 8
/// order-preserving bytes of an event time.
pub(crate) fn horizon(max_future_skew_us: i64) -> [u8; 8] {
    let now_us =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    quiver_runtime::encoding::event_order_bytes(now_us.saturating_add(max_future_skew_us))
}

/// The rest of one guarded-write call after its script (`EVALSHA sha` or `EVAL body`):
/// the key count, the keys, the horizon, then (row, expire-at ms or 0) per key.
pub(crate) fn guarded_call<R: std::borrow::Borrow<WriteRow>>(cmd: &mut redis::Cmd, rows: &[R], horizon: &[u8; 8]) {
    cmd.arg(rows.len());
    for r in rows {
        cmd.arg(&r.borrow().key);
    }
    cmd.arg(&horizon[..]);
    for r in rows {
        let r = r.borrow();
        cmd.arg(&r.row[..]).arg(r.expire_at_ms.unwrap_or(0));
    }
}

/// Refuses a `maxmemory-policy` that evicts any key (see [`RedisStore::connect`]);
/// `None` when the server hides `CONFIG`.
pub(crate) fn eviction_refusal(policy: Option<&str>) -> Option<String> {
    policy.filter(|p| p.starts_with("allkeys-")).map(|policy| {
        format!(
            "maxmemory-policy is `{policy}`: Redis may evict any key, and an evicted key lets an older row win the guarded write (views without a TTL would lose values silently); set `maxmemory-policy noeviction` or a `volatile-*` policy"
        )
    })
}

/// The URL without a password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match url.find('@') {
        Some(at) => match url.find("://") {
            Some(scheme) => format!("{}***{}", &url[..scheme + 3], &url[at..]),
            None => "redis (credentials hidden)".to_string(),
        },
        None => url.to_string(),
    }
}

#[async_trait::async_trait]
impl OnlineStore for RedisStore {
    fn name(&self) -> String {
        redact(&self.url)
    }

    async fn write(&self, rows: &[WriteRow]) -> Result<usize> {
        // Several pipelines in flight on the multiplexed connection, the next one sent
        // as soon as one is answered, so Redis never waits on the network or on the
        // encoding between them. Each pipeline is independent: the guarded write makes
        // the order between them irrelevant.
        use futures::StreamExt;
        type Call<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<usize>> + Send + 'a>>;
        // (Boxed and collected first: a stream holding the closure would not be `Send`
        // for every lifetime, which the trait's boxed future needs.)
        let calls: Vec<Call<'_>> =
            rows.chunks(KEYS_PER_CALL * CALLS_PER_PIPELINE).map(|batch| -> Call<'_> { Box::pin(self.write_batch(batch)) }).collect();
        let counts: Vec<Result<usize>> = futures::stream::iter(calls).buffered(PIPELINES_IN_FLIGHT).collect().await;
        counts.into_iter().sum()
    }

    async fn read(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        redis::cmd("MGET").arg(keys).query_async(&mut conn).await.map_err(|e| self.unavailable(e))
    }

    async fn keys_with_prefix(&self, prefix: &str, remove: bool) -> Result<u64> {
        let mut conn = self.conn.clone();
        scan_prefix(&mut conn, prefix, remove, false).await.map_err(|e| self.unavailable(e))
    }
}

/// `SCAN ... MATCH prefix*` over one node, the keys each counted once (a SCAN may return
/// a key twice), and with `remove` each page `UNLINK`ed as it comes — one `UNLINK` per
/// hash slot with `by_slot` (a cluster node refuses keys of several slots in one
/// command). The count is of the keys removed when removing.
pub(crate) async fn scan_prefix<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    prefix: &str,
    remove: bool,
    by_slot: bool,
) -> redis::RedisResult<u64> {
    let pattern = format!("{}*", glob_escape(prefix));
    let (mut cursor, mut seen, mut removed) = (0u64, std::collections::HashSet::new(), 0u64);
    loop {
        let (next, keys): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000).query_async(conn).await?;
        if remove && !keys.is_empty() {
            let mut groups: std::collections::HashMap<Option<redis::cluster_routing::Slot>, Vec<&String>> =
                std::collections::HashMap::new();
            for key in &keys {
                groups.entry(by_slot.then(|| redis::cluster_routing::Slot::for_key(key.as_bytes()))).or_default().push(key);
            }
            let mut pipe = redis::pipe();
            for group in groups.values() {
                pipe.cmd("UNLINK").arg(group);
            }
            let counts: Vec<u64> = pipe.query_async(conn).await?;
            removed += counts.iter().sum::<u64>();
        }
        seen.extend(keys);
        if next == 0 {
            return Ok(if remove { removed } else { seen.len() as u64 });
        }
        cursor = next;
    }
}

/// `text` with Redis's glob characters escaped, so it matches only itself.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_matches_only_itself() {
        assert_eq!(super::glob_escape("quiver:p:v@2:"), "quiver:p:v@2:");
        assert_eq!(super::glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(super::redact("redis://:hunter2@127.0.0.1:6379/0"), "redis://***@127.0.0.1:6379/0");
        assert_eq!(super::redact("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
    }
}
