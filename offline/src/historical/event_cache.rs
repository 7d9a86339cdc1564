//! The events an event log's online records are rebuilt from, kept between rebuilds by a
//! writer that lives long (a stream, a server taking pushes): after an entity's events
//! are read once, each rebuild reads only the table versions committed since, so a
//! rebuild's cost follows the batch, not the table (docs/aggregations.md#writes).
//!
//! What a rebuild gets is what [`events_since`](super::events_since) reads from the table
//! at the same version: the cache holds, per entity it has read, every event of it with
//! event time at or after the entity's `since`, complete through one table version. It is
//! dropped, and read afresh, when the table was made again (its log entry at the cache's
//! version is not the one read), a commit removed files (anything but appends: a
//! compaction, a delete), or the view's definition changed.

use std::collections::HashMap;

use datafusion::prelude::{ident, lit};
use deltalake::DeltaTable;
use quiver_runtime::encoding::KeyValue;
use quiver_runtime::record::Event;
use quiver_sdk::config::StoreLocation;
use quiver_sdk::{Config, Definitions, FeatureView, JoinKey};

use super::events::{EntityEvents, by_entity, entity_filter};
use super::scan::{ScanRange, scan_table};
use crate::delta::{log_entry, open_table, removes_files};
use crate::error::{Error, Result};
use crate::schema::SEQ_COLUMN;

/// Beyond this many events held for one view the cache starts over: a rebuild then
/// reads its entities from the table again, as it would without a cache.
const MAX_EVENTS: usize = 2_000_000;

/// Per view table: the events read so far (see the module docs). Shared by the tasks
/// of one writer; rebuilds of one cache take turns.
#[derive(Debug, Default)]
pub struct EventCache {
    tables: tokio::sync::Mutex<HashMap<String, Cached>>,
}

struct Cached {
    /// The view and its join keys as they were when read: another definition starts afresh.
    view: FeatureView,
    keys: Vec<JoinKey>,
    table: DeltaTable,
    /// Every loaded entity's events are complete through this version.
    version: u64,
    /// Its log entry: a table made again under the cache has another one (`None`: not
    /// found, then the cache is not kept).
    entry: Option<Vec<u8>>,
    entities: HashMap<Vec<KeyValue>, Loaded>,
    /// The latest `since` the versions read after an entity's first read were read
    /// from: an entity is complete from the later of this and its own `since`.
    floor: i64,
    held: usize,
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached").field("view", &self.view.name).field("version", &self.version).field("held", &self.held).finish()
    }
}

/// One entity's events with event time `since` or later.
#[derive(Debug)]
struct Loaded {
    since: i64,
    events: Vec<Event>,
}

impl EventCache {
    pub fn new() -> EventCache {
        EventCache::default()
    }

    /// The events of `entities` (those that have any) with event time `since` or
    /// later, from the table of `view` as it is now: what
    /// [`events_since`](super::events_since) with `only` returns, reading only what
    /// was committed since the last call for the entities read before.
    ///
    /// # Errors
    /// An unreadable table; the cache of the view is dropped then.
    pub async fn events(
        &self,
        config: &Config,
        defs: &Definitions,
        view: &FeatureView,
        since: i64,
        entities: &[Vec<KeyValue>],
    ) -> Result<EntityEvents> {
        let location = config.view_table(view);
        let name = location.to_string();
        let keys = defs.join_keys(view);
        let mut unique = entities.to_vec();
        unique.sort();
        unique.dedup();
        let mut tables = self.tables.lock().await;
        // Out of the map while it is brought up to date: an error leaves no cache behind.
        let kept = tables.remove(&name).filter(|c| c.view == *view && c.keys == keys);
        let cached = match kept {
            Some(cached) => cached.advance(&location, defs, since).await?,
            None => None,
        };
        let cached = match cached {
            Some(cached) => Some(cached),
            None => Cached::open(&location, view, keys).await?,
        };
        let Some(mut cached) = cached else {
            return Ok(EntityEvents { entities: Vec::new(), version: None });
        };
        cached.load(&name, defs, since, &unique).await?;
        let events = cached.take(since, &unique);
        if cached.held <= MAX_EVENTS && cached.entry.is_some() {
            tables.insert(name, cached);
        }
        Ok(events)
    }
}

impl Cached {
    /// The table at `location` as it is now, with no entity read yet (`None`: no table).
    async fn open(location: &StoreLocation, view: &FeatureView, keys: Vec<JoinKey>) -> Result<Option<Cached>> {
        let Some(table) = open_table(location).await? else { return Ok(None) };
        let Some(version) = table.version() else { return Ok(None) };
        let entry = log_entry(location, version).await?;
        Ok(Some(Cached { view: view.clone(), keys, table, version, entry, entities: HashMap::new(), floor: i64::MIN, held: 0 }))
    }

    /// Brought to the table's latest version: the rows committed since added to the
    /// entities loaded. `None` when it cannot be (the table was made again, or a commit
    /// since removed files): start afresh.
    async fn advance(mut self, location: &StoreLocation, defs: &Definitions, since: i64) -> Result<Option<Cached>> {
        let name = location.to_string();
        if log_entry(location, self.version).await? != self.entry || self.table.update_incremental(None).await.is_err() {
            return Ok(None);
        }
        let Some(now) = self.table.version() else { return Ok(None) };
        if now < self.version {
            return Ok(None);
        }
        if now == self.version {
            return Ok(Some(self));
        }
        for version in self.version + 1..=now {
            match log_entry(location, version).await? {
                Some(entry) if !removes_files(&entry) => self.entry = Some(entry),
                _ => return Ok(None),
            }
        }
        // Rows of versions after ours: `_quiver_seq`'s high half is the version
        // (docs/offline.md), and the files' statistics leave the older files unread.
        let first_new = i64::try_from(self.version + 1).unwrap_or(i64::MAX >> 32) << 32;
        let range = ScanRange { lo: Some(since), hi: i64::MAX, extra: Some(ident(SEQ_COLUMN).gt_eq(lit(first_new))), version: None };
        let scan = scan_table(&self.table, &name, defs, &self.view, &self.features(), range).await?;
        for (keys, events) in by_entity(defs, &self.view, scan)? {
            if let Some(loaded) = self.entities.get_mut(&keys) {
                self.held += events.len();
                loaded.events.extend(events);
            }
        }
        self.version = now;
        self.floor = self.floor.max(since);
        Ok(Some(self))
    }

    /// Reads the events of those of `entities` not loaded (or loaded from a later
    /// `since`) at the version the cache is at.
    async fn load(&mut self, name: &str, defs: &Definitions, since: i64, entities: &[Vec<KeyValue>]) -> Result<()> {
        let floor = self.floor;
        let missing: Vec<Vec<KeyValue>> =
            entities.iter().filter(|e| self.entities.get(*e).is_none_or(|l| l.since.max(floor) > since)).cloned().collect();
        if missing.is_empty() {
            return Ok(());
        }
        let range = ScanRange { lo: Some(since), hi: i64::MAX, extra: Some(entity_filter(&self.keys, &missing)), version: None };
        let scan = scan_table(&self.table, name, defs, &self.view, &self.features(), range).await?;
        if scan.version != Some(self.version) {
            return Err(Error::Request(format!("delta table {name}: read version {:?}, expected {}", scan.version, self.version)));
        }
        let mut read: HashMap<Vec<KeyValue>, Vec<Event>> = by_entity(defs, &self.view, scan)?.into_iter().collect();
        for keys in missing {
            let events = read.remove(&keys).unwrap_or_default();
            self.held += events.len();
            if let Some(old) = self.entities.insert(keys, Loaded { since, events }) {
                self.held -= old.events.len();
            }
        }
        Ok(())
    }

    /// The events of `entities` (distinct; those with none left out) from `since`,
    /// dropping the older ones held.
    fn take(&mut self, since: i64, entities: &[Vec<KeyValue>]) -> EntityEvents {
        let mut out = Vec::new();
        for keys in entities {
            let Some(loaded) = self.entities.get_mut(keys) else { continue };
            if loaded.since < since {
                let before = loaded.events.len();
                loaded.events.retain(|e| e.order.0 >= since);
                loaded.since = since;
                self.held -= before - loaded.events.len();
            }
            if !loaded.events.is_empty() {
                out.push((keys.clone(), loaded.events.clone()));
            }
        }
        EntityEvents { entities: out, version: Some(self.version) }
    }

    fn features(&self) -> Vec<&str> {
        self.view.features.iter().map(|f| f.name.as_str()).collect()
    }
}
