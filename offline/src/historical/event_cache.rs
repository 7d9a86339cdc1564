//! The events an event log's online records are rebuilt from, kept between rebuilds by a
//! writer that lives long (a stream, a server taking pushes): after an entity's events
//! are read once, each rebuild reads only the table versions committed since, so a
//! rebuild's cost follows the batch, not the table (docs/aggregations.md#writes). A
//! long-lived writer's cache ([`EventCache::long_lived`]) reads every entity of a table
//! in one scan on its first rebuild (and after it started over), not the table once per
//! batch of entities it has not seen yet.
//!
//! What a rebuild gets is what [`events_since`](super::events_since) reads from the table
//! at the same version: the cache holds, per entity it has read, every event of it with
//! event time at or after the entity's `since`, complete through one table version. It is
//! dropped, and read afresh, when the table was made again (its log entry at the cache's
//! version is not the one read), a commit removed files (anything but appends: a
//! compaction, a delete), or the view's event columns or times changed (an aggregation
//! added or changed keeps it: the events are the same).

use std::collections::HashMap;

use datafusion::prelude::{ident, lit};
use deltalake::DeltaTable;
use quiver_runtime::encoding::KeyValue;
use quiver_runtime::record::Event;
use quiver_sdk::config::StoreLocation;
use quiver_sdk::{Config, Definitions, FeatureView, JoinKey};

use super::events::{EntityEvents, by_entity, entity_filter};
use super::scan::{ScanRange, scan_files, scan_table};
use crate::delta::{added_files, log_entry, open_table, removes_files};
use crate::error::{Error, Result};
use crate::schema::SEQ_COLUMN;

/// Beyond this many events held for one view (once those older than the window are
/// dropped) the cache starts over: a rebuild then reads its entities from the table
/// again, as it would without a cache.
const MAX_EVENTS: usize = 2_000_000;

/// Per view table: the events read so far (see the module docs). Shared by the tasks
/// of one writer; rebuilds of one cache take turns.
#[derive(Debug)]
pub struct EventCache {
    tables: tokio::sync::Mutex<HashMap<String, Cached>>,
    /// Whether a table's first rebuild reads every entity (a long-lived writer), or
    /// the entities asked for alone (a one-off push).
    whole: bool,
    /// The events it holds of one view at the most.
    limit: usize,
}

impl Default for EventCache {
    fn default() -> EventCache {
        EventCache { tables: tokio::sync::Mutex::default(), whole: false, limit: MAX_EVENTS }
    }
}

struct Cached {
    /// The view and its join keys (another view's or keys start afresh: [`reads_same`]).
    view: FeatureView,
    keys: Vec<JoinKey>,
    table: DeltaTable,
    /// Every loaded entity's events are complete through this version.
    version: u64,
    /// Its log entry: a table made again under the cache has another one (`None`: not
    /// found, then the cache is not kept).
    entry: Option<Vec<u8>>,
    entities: HashMap<Vec<KeyValue>, Loaded>,
    /// `Some(w)`: every entity was read from `w` — one not in `entities` has no event
    /// from the later of `w` and `floor` on.
    all: Option<i64>,
    /// The latest `since` the versions read after an entity's first read were read
    /// from: an entity is complete from the later of this and its own `since`.
    floor: i64,
    held: usize,
    /// [`EventCache`]'s `limit`.
    limit: usize,
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

impl Loaded {
    /// Its events older than `since` dropped (when it holds any from before); how many.
    fn drop_before(&mut self, since: i64) -> usize {
        if self.since >= since {
            return 0;
        }
        let before = self.events.len();
        self.events.retain(|e| e.order.0 >= since);
        self.since = since;
        before - self.events.len()
    }
}

impl EventCache {
    /// A cache for one rebuild or a few: it reads the entities asked for alone.
    pub fn new() -> EventCache {
        EventCache::default()
    }

    /// A long-lived writer's cache (a stream, a server): a table's first rebuild reads
    /// every entity's events in one scan (the entities asked for alone when there are
    /// more than it holds), so later rebuilds read only what was committed since.
    pub fn long_lived() -> EventCache {
        EventCache { whole: true, ..EventCache::default() }
    }

    /// The same cache holding at most `limit` events of one view (2,000,000 unless set).
    pub fn with_limit(self, limit: usize) -> EventCache {
        EventCache { limit, ..self }
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
        let kept = tables.remove(&name).filter(|c| reads_same(&c.view, view) && c.keys == keys).map(|mut c| {
            c.view = view.clone();
            c
        });
        let cached = match kept {
            Some(cached) => cached.advance(&location, defs, since).await?,
            None => None,
        };
        let cached = match cached {
            Some(cached) => Some(cached),
            None => Cached::open(&location, view, keys, self.limit).await?,
        };
        let Some(mut cached) = cached else {
            return Ok(EntityEvents { entities: Vec::new(), version: None });
        };
        cached.load(&name, defs, since, &unique, self.whole).await?;
        let events = cached.take(since, &unique);
        if cached.held > self.limit {
            cached.drop_before(since);
        }
        if cached.held <= self.limit && cached.entry.is_some() {
            tables.insert(name, cached);
        }
        Ok(events)
    }

    /// Reads every entity's events of `view` with event time `since` or later, as a
    /// long-lived cache's first rebuild would: a stream does this before its first batch
    /// (after a restart, say), so that batch's rebuild reads only what was committed
    /// since. Nothing for a cache that reads entities alone, one that holds the view
    /// already, or a view without a table; more events than the cache holds are not kept.
    ///
    /// # Errors
    /// An unreadable table.
    pub async fn warm(&self, config: &Config, defs: &Definitions, view: &FeatureView, since: i64) -> Result<()> {
        if !self.whole {
            return Ok(());
        }
        let location = config.view_table(view);
        let name = location.to_string();
        let mut tables = self.tables.lock().await;
        if tables.contains_key(&name) {
            return Ok(());
        }
        let Some(mut cached) = Cached::open(&location, view, defs.join_keys(view), self.limit).await? else { return Ok(()) };
        if cached.read_all(&name, defs, since).await?.is_none() {
            tables.insert(name, cached);
        }
        Ok(())
    }
}

/// Whether events read for view `a` are those of `b`: the same feature columns, of the
/// same types, and the same times (what else a view holds — its aggregations, TTL,
/// tags — is not in the events).
fn reads_same(a: &FeatureView, b: &FeatureView) -> bool {
    a.features.iter().map(|f| (&f.name, f.dtype)).eq(b.features.iter().map(|f| (&f.name, f.dtype)))
        && a.source.timestamp_field == b.source.timestamp_field
        && a.source.created_timestamp_field == b.source.created_timestamp_field
}

impl Cached {
    /// The table at `location` as it is now, with no entity read yet (`None`: no table).
    async fn open(location: &StoreLocation, view: &FeatureView, keys: Vec<JoinKey>, limit: usize) -> Result<Option<Cached>> {
        let Some(table) = open_table(location).await? else { return Ok(None) };
        let Some(version) = table.version() else { return Ok(None) };
        let entry = log_entry(location, version).await?;
        Ok(Some(Cached {
            view: view.clone(),
            keys,
            table,
            version,
            entry,
            entities: HashMap::new(),
            all: None,
            floor: i64::MIN,
            held: 0,
            limit,
        }))
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
        let mut added = Some(Vec::new());
        for version in self.version + 1..=now {
            match log_entry(location, version).await? {
                Some(entry) if !removes_files(&entry) => {
                    added = added.zip(added_files(&entry)).map(|(mut all, files)| {
                        all.extend(files);
                        all
                    });
                    self.entry = Some(entry);
                }
                _ => return Ok(None),
            }
        }
        // The files those versions added, read alone; or, when they cannot be, the rows
        // of versions after ours from the table: `_quiver_seq`'s high half is the version
        // (docs/offline.md), and the files' statistics leave the older files unread.
        let features = self.features();
        let read = match &added {
            Some(files) => scan_files(location, &self.table, defs, &self.view, &features, files, since).await?,
            None => None,
        };
        let scan = match read {
            Some(scan) => scan,
            None => {
                let first_new = i64::try_from(self.version + 1).unwrap_or(i64::MAX >> 32) << 32;
                let extra = Some(ident(SEQ_COLUMN).gt_eq(lit(first_new)));
                scan_table(
                    &self.table,
                    &name,
                    defs,
                    &self.view,
                    &features,
                    ScanRange { lo: Some(since), hi: i64::MAX, extra, version: None },
                )
                .await?
            }
        };
        for (keys, mut events) in by_entity(defs, &self.view, scan)? {
            // An entity holds its events from its own `since` (or, not read yet, from
            // `all`'s) on: the rows read here from an earlier `since` are left out.
            let Some(from) = self.entities.get(&keys).map(|l| l.since).or(self.all) else { continue };
            events.retain(|e| e.order.0 >= from);
            self.held += events.len();
            self.entities.entry(keys).or_insert_with(|| Loaded { since: from, events: Vec::new() }).events.extend(events);
        }
        self.version = now;
        self.floor = self.floor.max(since);
        Ok(Some(self))
    }

    /// Reads the events of those of `entities` not loaded (or loaded from a later
    /// `since`) at the version the cache is at; with `whole`, on a cache that has read
    /// nothing yet, every entity's.
    async fn load(&mut self, name: &str, defs: &Definitions, since: i64, entities: &[Vec<KeyValue>], whole: bool) -> Result<()> {
        let floor = self.floor;
        let all = self.all;
        let missing: Vec<Vec<KeyValue>> = entities
            .iter()
            .filter(|e| match self.entities.get(*e) {
                Some(l) => l.since.max(floor) > since,
                None => all.is_none_or(|w| w.max(floor) > since),
            })
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let read = if whole && self.all.is_none() && self.entities.is_empty() {
            match self.read_all(name, defs, since).await? {
                None => return Ok(()),
                // More than the cache holds: the entities asked for alone, of those read.
                Some(read) => read,
            }
        } else {
            let range = ScanRange { lo: Some(since), hi: i64::MAX, extra: Some(entity_filter(&self.keys, &missing)), version: None };
            self.read(name, defs, range).await?
        };
        let mut read: HashMap<Vec<KeyValue>, Vec<Event>> = read.into_iter().collect();
        for keys in missing {
            let events = read.remove(&keys).unwrap_or_default();
            self.held += events.len();
            if let Some(old) = self.entities.insert(keys, Loaded { since, events }) {
                self.held -= old.events.len();
            }
        }
        Ok(())
    }

    /// Every entity's events from `since`, at the version the cache is at, held (`None`)
    /// or, when they are more than the cache holds, returned and not held.
    async fn read_all(&mut self, name: &str, defs: &Definitions, since: i64) -> Result<Option<Vec<(Vec<KeyValue>, Vec<Event>)>>> {
        let read = self.read(name, defs, ScanRange { lo: Some(since), hi: i64::MAX, extra: None, version: None }).await?;
        if read.iter().map(|(_, events)| events.len()).sum::<usize>() > self.limit {
            return Ok(Some(read));
        }
        for (keys, events) in read {
            self.held += events.len();
            if let Some(old) = self.entities.insert(keys, Loaded { since, events }) {
                self.held -= old.events.len();
            }
        }
        self.all = Some(since);
        Ok(None)
    }

    /// The rows of `range` at the version the cache is at, by entity.
    async fn read(&self, name: &str, defs: &Definitions, range: ScanRange) -> Result<Vec<(Vec<KeyValue>, Vec<Event>)>> {
        let scan = scan_table(&self.table, name, defs, &self.view, &self.features(), range).await?;
        if scan.version != Some(self.version) {
            return Err(Error::Request(format!("delta table {name}: read version {:?}, expected {}", scan.version, self.version)));
        }
        by_entity(defs, &self.view, scan)
    }

    /// The events of `entities` (distinct; those with none left out) from `since`,
    /// dropping the older ones held.
    fn take(&mut self, since: i64, entities: &[Vec<KeyValue>]) -> EntityEvents {
        let mut out = Vec::new();
        for keys in entities {
            let Some(loaded) = self.entities.get_mut(keys) else { continue };
            self.held -= loaded.drop_before(since);
            if !loaded.events.is_empty() {
                out.push((keys.clone(), loaded.events.clone()));
            }
        }
        EntityEvents { entities: out, version: Some(self.version) }
    }

    /// Every entity's events older than `since` dropped (an entity keeps its place, so
    /// the cache still knows it read it).
    fn drop_before(&mut self, since: i64) {
        for loaded in self.entities.values_mut() {
            self.held -= loaded.drop_before(since);
        }
    }

    fn features(&self) -> Vec<&str> {
        self.view.features.iter().map(|f| f.name.as_str()).collect()
    }
}
