//! The online half of `/push` requests whose offline half committed while the online
//! store failed: kept in order and written by one background task as soon as the store
//! takes it (docs/online.md#push-when-the-online-store-fails).
//!
//! The offline table is the truth and the online write is guarded (the newest event
//! time wins), so a late write never replaces a newer row: writing it seconds later is
//! what the request would have done. A server killed with writes still pending loses
//! them; the next `materialize-incremental` loads them from the table.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver_runtime::encoding::KeyValue;
use quiver_sdk::FeatureView;
use quiver_sdk::registry::Registered;

use super::{STORE_TIMEOUT, ServerState};
use crate::store::WriteRow;

/// Rows a server keeps pending at most; a push beyond them answers 503 (its rows are in
/// the offline table, and `materialize-incremental` loads them).
pub const MAX_PENDING_ROWS: u64 = 100_000;

/// The first wait after a failed retry; it doubles up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(200);
const MAX_WAIT: Duration = Duration::from_secs(5);

/// One push's online write.
pub(super) enum Write {
    /// A latest-value view's rows.
    Rows(Vec<WriteRow>),
    /// An event log's entities, whose records are rebuilt from its table.
    EventLog { defs: Arc<Registered>, view: Box<FeatureView>, entities: Vec<Vec<KeyValue>> },
}

/// The pending writes, oldest first, and whether the task writing them runs.
#[derive(Default)]
pub struct PendingWrites {
    queue: Mutex<(VecDeque<(Write, u64)>, bool)>,
    rows: AtomicU64,
}

impl std::fmt::Debug for PendingWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingWrites").field("rows", &self.rows()).finish()
    }
}

impl PendingWrites {
    /// Rows waiting for the online store.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Keeps `write` (of `rows` rows) for the background task, started if it is not
    /// running; `false` (nothing kept) when that would pass [`MAX_PENDING_ROWS`].
    pub(super) fn add(&self, state: &Arc<ServerState>, write: Write, rows: u64) -> bool {
        let mut queue = self.queue.lock().expect("pending lock");
        if self.rows() + rows > MAX_PENDING_ROWS {
            return false;
        }
        queue.0.push_back((write, rows));
        self.rows.fetch_add(rows, Ordering::Relaxed);
        if !queue.1 {
            queue.1 = true;
            tokio::spawn(drain(Arc::clone(state)));
        }
        true
    }
}

/// Writes the pending writes in order, waiting after each failure (200 ms doubling to
/// 5 s) until the store takes them; ends when none is left.
async fn drain(state: Arc<ServerState>) {
    let pending = &state.pending;
    let mut wait = FIRST_WAIT;
    loop {
        let Some((write, rows)) = ({
            let mut queue = pending.queue.lock().expect("pending lock");
            let next = queue.0.pop_front();
            if next.is_none() {
                queue.1 = false;
            }
            next
        }) else {
            return;
        };
        match attempt(&state, &write).await {
            Ok(()) => {
                pending.rows.fetch_sub(rows, Ordering::Relaxed);
                wait = FIRST_WAIT;
                tracing::info!(rows, "a pending push was written online");
            }
            Err(e) => {
                pending.queue.lock().expect("pending lock").0.push_front((write, rows));
                tracing::warn!(error = %e, "writing a pending push online failed; retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_WAIT);
            }
        }
    }
}

/// One try: a store write under [`STORE_TIMEOUT`]; an event log's rebuild, which reads
/// its table first, without it.
async fn attempt(state: &ServerState, write: &Write) -> Result<(), String> {
    match write {
        Write::Rows(rows) => match tokio::time::timeout(STORE_TIMEOUT, state.store.write(rows)).await {
            Ok(written) => written.map(drop).map_err(|e| e.to_string()),
            Err(_) => Err("timed out".to_string()),
        },
        Write::EventLog { defs, view, entities } => {
            let offline = state.offline.as_ref().ok_or("no offline store")?;
            offline.refresh_event_log(defs, view, entities, state.store.as_ref()).await.map(drop)
        }
    }
}
