//! Materialization: the latest offline row of every entity, written to the online store
//! through the guarded write (docs/online.md), in large pipelined batches.

use std::time::Instant;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use quiver_offline::historical::{EventRange, events_since, latest_per_entity};
use quiver_online::OnlineStore;
use quiver_sdk::{Config, Definitions, FeatureView};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Rows per store write call (Redis: several pipelines in flight; embedded: one
/// transaction), and so per progress step.
const WRITE_BATCH: usize = 50_000;

/// What materializing one view did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewReport {
    pub view: String,
    /// Entities whose latest row was loaded from the offline store.
    pub entities: usize,
    /// Rows the store took.
    pub written: usize,
    /// Rows not sent because their key would expire at once (the view's TTL and the
    /// key's day of grace have passed since their event time). The rest of
    /// `entities - written - expired` were older than what the store held.
    pub expired: usize,
}

/// The online rows of one view's latest-per-entity batch (the shared write path's).
pub use quiver_streaming::write::online_rows;

/// Loads one view's latest rows in `window` into the store.
async fn load_view(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    window: EventRange,
    store: &dyn OnlineStore,
    progress: &(dyn Fn(&str, u64) + Sync),
) -> Result<(ViewReport, Option<u64>)> {
    if view.is_event_log() {
        let end = match window {
            EventRange::Range { end, .. } | EventRange::Since { end, .. } => end,
            EventRange::Versions(_) => i64::MAX,
        };
        // Records are built as of END, but never as of a time still to come: `materialize
        // 2000-01-01 2100-01-01` must count the windows of today, not of 2100 (events
        // after the clock stay pending in the record and count once due).
        return load_event_log(config, defs, view, end.min(quiver_sdk::Timestamp::now().0), store, progress).await;
    }
    let began = Instant::now();
    let latest = latest_per_entity(config, defs, view, window).await?;
    let Some(batch) = latest.batch else {
        return Ok((ViewReport { view: view.versioned_name(), entities: 0, written: 0, expired: 0 }, latest.version));
    };
    let scanned = began.elapsed();
    // Each batch is encoded when its turn comes, while the store still works on the
    // batch before it: the encoding overlaps the writes instead of preceding them all.
    let project = &config.project;
    let batches = (0..batch.num_rows()).step_by(WRITE_BATCH).map(|at| {
        let part = batch.slice(at, WRITE_BATCH.min(batch.num_rows() - at));
        move || Cow::Owned(online_rows(project, defs, view, &part))
    });
    let Written { written, expired } = write_batches(store, batches, &view.storage_name(), progress).await?;
    tracing::debug!(
        view = %view.name,
        entities = batch.num_rows(),
        written,
        scan_s = scanned.as_secs_f64(),
        encode_and_write_s = (began.elapsed() - scanned).as_secs_f64(),
        "materialized"
    );
    Ok((ViewReport { view: view.versioned_name(), entities: batch.num_rows(), written, expired }, latest.version))
}

/// Rebuilds the online records of an event log (docs/aggregations.md) from every event its windows
/// can still count at `now` (and those after it, kept pending): one record per entity,
/// dated by the table version, so the guarded write keeps the newest rebuild and a
/// rerun writes the same records again.
async fn load_event_log(
    config: &Config,
    defs: &Definitions,
    view: &FeatureView,
    now: i64,
    store: &dyn OnlineStore,
    progress: &(dyn Fn(&str, u64) + Sync),
) -> Result<(ViewReport, Option<u64>)> {
    let since = quiver_runtime::record::Layout::of(view).earliest_tail(now);
    let events = events_since(config, defs, view, since, None).await?;
    let rows = quiver_streaming::write::event_log_rows(&config.project, view, &events, now);
    let Written { written, expired } = write_all(store, &rows, &view.storage_name(), progress).await?;
    Ok((ViewReport { view: view.versioned_name(), entities: rows.len(), written, expired }, events.version))
}

/// What the writes of one view did.
struct Written {
    /// Rows the store took.
    written: usize,
    /// Rows left out because their key would expire at once.
    expired: usize,
}

/// Writes `rows` in batches of [`WRITE_BATCH`], two in flight (one being answered while
/// the next is sent), reporting progress as each completes.
async fn write_all(
    store: &dyn OnlineStore,
    rows: &[quiver_online::WriteRow],
    view: &str,
    progress: &(dyn Fn(&str, u64) + Sync),
) -> Result<Written> {
    write_batches(store, rows.chunks(WRITE_BATCH).map(|chunk| move || Cow::Borrowed(chunk)), view, progress).await
}

/// Writes the batches `encode` makes, each made when its write starts, two in flight,
/// reporting progress as each completes. A row whose key would expire at once (by the
/// wall clock, as the stores expire keys) is not sent: it could only delete its key.
async fn write_batches<'a, F>(
    store: &'a dyn OnlineStore,
    encode: impl Iterator<Item = F>,
    view: &str,
    progress: &(dyn Fn(&str, u64) + Sync),
) -> Result<Written>
where
    F: FnOnce() -> Cow<'a, [quiver_online::WriteRow]> + Send + 'a,
{
    use futures::StreamExt;
    type Call<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = (usize, usize, quiver_online::Result<usize>)> + Send + 'a>>;
    let now_ms = quiver_sdk::Timestamp::now().0.div_euclid(1000);
    // (Boxed and collected first, so the stream's type holds no closure: see
    // `RedisStore::write`.)
    let calls: Vec<Call<'a>> = encode
        .map(|make| -> Call<'a> {
            Box::pin(async move {
                let mut rows = make();
                let len = rows.len();
                if rows.iter().any(|r| r.expire_at_ms.is_some_and(|at| at <= now_ms)) {
                    rows.to_mut().retain(|r| r.expire_at_ms.is_none_or(|at| at > now_ms));
                }
                (len, len - rows.len(), store.write(&rows).await)
            })
        })
        .collect();
    let mut done = futures::stream::iter(calls).buffered(2);
    let (mut out, mut sent) = (Written { written: 0, expired: 0 }, 0u64);
    while let Some((len, expired, result)) = done.next().await {
        out.written += result?;
        out.expired += expired;
        sent += len as u64;
        progress(&format!("materializing {view}"), sent);
    }
    Ok(out)
}

/// Loads, for each view, the latest row per entity with event time in `[start, end]`
/// (UTC microseconds) into the online store.
///
/// # Errors
/// An unreadable table or an unavailable store; rows written before the failure stay
/// (a rerun is idempotent: the guarded write replaces equal rows and keeps newer ones).
pub async fn materialize(
    config: &Config,
    defs: &Definitions,
    views: &[&FeatureView],
    start: i64,
    end: i64,
    store: &dyn OnlineStore,
    progress: &(dyn Fn(&str, u64) + Sync),
) -> Result<Vec<ViewReport>> {
    let mut reports = Vec::new();
    for view in views {
        let (report, _) = load_view(config, defs, view, EventRange::Range { start, end }, store, progress).await?;
        reports.push(report);
    }
    Ok(reports)
}

/// How far back a starting server looks for pushes' rows owed to the online store.
pub const OWED_WINDOW_US: i64 = 15 * 60 * 1_000_000;

/// Writes online the rows of the pushes committed in the last `window_us` (UTC
/// microseconds) that owed them to the online store ([`quiver_offline::delta::OWES_ONLINE`]):
/// a server killed between a push's commit and its online write leaves them offline
/// only, and a starting server writes them (docs/online.md#push-when-the-online-store-fails).
/// The latest such row per entity goes through the guarded write, so a newer row
/// online stays, and a push that was written already is written again unchanged.
/// Event logs are left to their next write or materialization. Returns the rows the
/// store took.
///
/// # Errors
/// An unreadable table or an unavailable store.
pub async fn write_owed(config: &Config, defs: &Definitions, store: &dyn OnlineStore, window_us: i64) -> Result<usize> {
    let since = quiver_sdk::Timestamp::now().0.saturating_sub(window_us);
    let mut written = 0;
    for view in defs.feature_views.iter().filter(|v| v.takes_online_writes() && !v.is_event_log()) {
        let location = config.view_table(view);
        let mut recent: Vec<u64> =
            quiver_offline::delta::commit_times(&location).await?.into_iter().filter(|&(_, t)| t >= since).map(|(v, _)| v).collect();
        recent.sort_unstable();
        let mut owed = Vec::new();
        for v in recent {
            if quiver_offline::delta::log_entry(&location, v).await?.is_some_and(|entry| quiver_offline::delta::owes_online(&entry)) {
                owed.push(v);
            }
        }
        if owed.is_empty() {
            continue;
        }
        let (report, _) = load_view(config, defs, view, EventRange::Versions(owed), store, &|_, _| {}).await?;
        written += report.written;
    }
    Ok(written)
}

/// Where incremental materialization records its progress: per online store, per view,
/// the Delta table version read and the END reached.
pub const STATE_FILE: &str = ".quiver/materialized.json";

/// Progress of one view in one store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewProgress {
    pub version: u64,
    /// UTC microseconds.
    pub end: i64,
}

/// The state file's content: store name -> view -> progress.
pub type State = BTreeMap<String, BTreeMap<String, ViewProgress>>;

/// The state file at `path` (empty when there is none yet).
///
/// # Errors
/// A file that cannot be read or parsed.
pub(crate) fn load_state(path: &Path) -> Result<State> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| Error::Init {
            path: path.to_path_buf(),
            message: format!("unreadable materialization state: {e} (delete it to start over)"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::new()),
        Err(e) => Err(Error::io(path, e)),
    }
}

fn save_state(path: &Path, state: &State) -> Result<()> {
    let dir = path.parent().expect("the state file is in a folder");
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    crate::export::write_atomic(path, serde_json::to_string_pretty(state).expect("state serialises").as_bytes())
}

/// Loads what arrived since the last incremental run, up to `end`: per view, rows
/// ingested after the Delta version the last run read (whatever their event time, so
/// late rows are picked up) and rows with event time after the last run's end. A view
/// never materialized incrementally into this store gets everything up to `end`.
///
/// The progress is written (atomically) only after every view is loaded, so a crash
/// leaves it unchanged and a rerun loads the same rows again, harmlessly.
///
/// # Errors
/// As [`materialize`], and an unreadable state file.
pub async fn materialize_incremental(
    config: &Config,
    defs: &Definitions,
    views: &[&FeatureView],
    end: i64,
    store: &dyn OnlineStore,
    progress: &(dyn Fn(&str, u64) + Sync),
) -> Result<Vec<ViewReport>> {
    let path = config.repo.join(STATE_FILE);
    let mut state = load_state(&path)?;
    let mut updates = Vec::new();
    let mut reports = Vec::new();
    let done = state.get(&store.name()).cloned().unwrap_or_default();
    for view in views {
        let before = done.get(&*view.storage_name()).copied();
        let window = match before {
            Some(p) => EventRange::Since { version: p.version, prev_end: p.end, end },
            None => EventRange::Range { start: i64::MIN, end },
        };
        let (report, version) = load_view(config, defs, view, window, store, progress).await?;
        if let Some(version) = version {
            let end = before.map_or(end, |p| p.end.max(end));
            updates.push((view.versioned_name(), ViewProgress { version, end }));
        }
        reports.push(report);
    }
    let entry = state.entry(store.name()).or_default();
    for (view, p) in updates {
        entry.insert(view, p);
    }
    save_state(&path, &state)?;
    Ok(reports)
}
