//! The definitions the server answers from.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use quiver_runtime::write_time::WriteTransform;
use quiver_sdk::FileRegistry;
use quiver_sdk::definitions::Asked;
use quiver_sdk::registry::Registered;

use crate::lookup::LookupPlan;

/// How long [`RegistryCache::recent`] answers without looking at the registry file.
pub const REGISTRY_CHECK: Duration = Duration::from_millis(100);
/// Most lookup plans kept (all are dropped when one more would not fit).
const MAX_PLANS: usize = 1024;
/// Most views' write-time transforms kept (as many as a registry defines, mostly).
const MAX_TRANSFORMS: usize = 1024;
/// The largest feature list (bytes of its texts, about) whose plan is kept.
const MAX_PLAN_KEY: usize = 16 << 10;

/// The definitions the server answers from, re-read when the registry file changes.
///
/// A registry that cannot be read (half-written by hand, deleted, another project's)
/// never takes the server down: the last good definitions stay, the failure is logged
/// once per change of the file and counted (`quiver_registry_errors_total`), and
/// `quiver_registry_stale` is 1 until a good registry is read again.
///
/// It also keeps the lookup [`LookupPlan`]s built from the definitions in use, by the
/// feature list a request names, so a server resolves each distinct list once per
/// registry version; and each view's compiled write-time expressions, for `/push`.
#[derive(Debug)]
pub struct RegistryCache {
    registry: FileRegistry,
    project: String,
    cached: RwLock<Cached>,
    errors: AtomicU64,
    /// When the file was last looked at: milliseconds since `born`.
    born: Instant,
    checked_ms: AtomicU64,
    plans: RwLock<Memo<PlanKey, Arc<LookupPlan>>>,
    /// By view (`None`: a view without write-time expressions).
    transforms: RwLock<Memo<String, Option<Arc<WriteTransform>>>>,
}

#[derive(Debug)]
struct Cached {
    /// The file's modification time when last looked at (`None`: missing).
    mtime: Option<SystemTime>,
    defs: Arc<Registered>,
    /// The registry version `defs` came from (0: nothing applied yet).
    version: u64,
    /// Why the file's current content is not in use, when it is not.
    stale: Option<String>,
}

/// A kept plan's key: what was asked, and whether columns get full names.
#[derive(Debug, PartialEq, Eq)]
struct PlanKey {
    /// The feature texts, or the one name of a service.
    texts: Vec<String>,
    service: bool,
    full_names: bool,
}

/// A request's key, looked up without building a [`PlanKey`].
struct Probe<'a>(Asked<'a>, bool);

impl Probe<'_> {
    /// (service, texts): what the key holds.
    fn parts(&self) -> (bool, &[&str]) {
        match &self.0 {
            Asked::Features(list) => (false, list),
            Asked::Service(name) => (true, std::slice::from_ref(name)),
        }
    }

    fn key(&self) -> PlanKey {
        let (service, texts) = self.parts();
        PlanKey { texts: texts.iter().map(|t| (*t).to_string()).collect(), service, full_names: self.1 }
    }

    /// The bytes its key would hold, about.
    fn size(&self) -> usize {
        self.parts().1.iter().map(|t| t.len() + 24).sum()
    }
}

/// Both hash as (full names, service, each text), so a probe finds its key.
fn hash_key<H: std::hash::Hasher>(h: &mut H, full_names: bool, service: bool, texts: impl ExactSizeIterator<Item = impl AsRef<str>>) {
    use std::hash::Hash;
    (full_names, service, texts.len()).hash(h);
    texts.for_each(|t| t.as_ref().hash(h));
}

impl std::hash::Hash for PlanKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        hash_key(h, self.full_names, self.service, self.texts.iter());
    }
}

impl std::hash::Hash for Probe<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let (service, texts) = self.parts();
        hash_key(h, self.1, service, texts.iter());
    }
}

impl hashbrown::Equivalent<PlanKey> for Probe<'_> {
    fn equivalent(&self, key: &PlanKey) -> bool {
        let (service, texts) = self.parts();
        self.1 == key.full_names && service == key.service && texts.iter().eq(key.texts.iter())
    }
}

/// What was built from one set of definitions, by key; dropped whole when the
/// definitions change or one more would pass `cap`.
#[derive(Debug)]
struct Memo<K, V> {
    /// The definitions the values were built from.
    defs: Option<Arc<Registered>>,
    by_key: hashbrown::HashMap<K, V>,
    cap: usize,
}

impl<K: std::hash::Hash + Eq, V: Clone> Memo<K, V> {
    fn new(cap: usize) -> Self {
        Memo { defs: None, by_key: hashbrown::HashMap::new(), cap }
    }

    /// The value kept for `probe` under `defs`.
    fn get<Q: std::hash::Hash + hashbrown::Equivalent<K> + ?Sized>(&self, defs: &Arc<Registered>, probe: &Q) -> Option<V> {
        self.defs.as_ref().filter(|d| Arc::ptr_eq(d, defs)).and_then(|_| self.by_key.get(probe)).cloned()
    }

    fn insert(&mut self, defs: &Arc<Registered>, key: K, value: V) {
        if !self.defs.as_ref().is_some_and(|d| Arc::ptr_eq(d, defs)) || self.by_key.len() >= self.cap {
            self.by_key.clear();
            self.defs = Some(defs.clone());
        }
        self.by_key.insert(key, value);
    }
}

/// Looks `probe` up in `memo` under `defs`, or builds, keeps and answers the value (an
/// error is not kept).
fn memoized<K: std::hash::Hash + Eq, V: Clone, Q: std::hash::Hash + hashbrown::Equivalent<K> + ?Sized, E>(
    memo: &RwLock<Memo<K, V>>,
    defs: &Arc<Registered>,
    probe: &Q,
    key: impl FnOnce() -> Option<K>,
    build: impl FnOnce() -> Result<V, E>,
) -> Result<V, E> {
    if let Some(found) = memo.read().expect("memo lock").get(defs, probe) {
        return Ok(found);
    }
    let built = build()?;
    if let Some(key) = key() {
        memo.write().expect("memo lock").insert(defs, key, built.clone());
    }
    Ok(built)
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
            cached: RwLock::new(Cached { mtime, version: doc.version, defs: Arc::new(doc.registered()), stale: None }),
            errors: AtomicU64::new(0),
            born: Instant::now(),
            checked_ms: AtomicU64::new(0),
            plans: RwLock::new(Memo::new(MAX_PLANS)),
            transforms: RwLock::new(Memo::new(MAX_TRANSFORMS)),
        })
    }

    /// The definitions, looking at the file only when it was last looked at more
    /// than [`REGISTRY_CHECK`] ago: an apply reaches lookups within that time (a
    /// lookup naming a view, feature or service it does not know looks at once,
    /// through [`Self::current`]). Saves the lookup path a `stat` per request.
    pub fn recent(&self) -> Arc<Registered> {
        let now = self.millis();
        if now < self.checked_ms.load(Ordering::Relaxed).saturating_add(REGISTRY_CHECK.as_millis() as u64) {
            return self.cached.read().expect("registry lock").defs.clone();
        }
        self.current()
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The plan for `asked` under `defs` (which [`Self::recent`] or [`Self::current`]
    /// answered): kept from an earlier request, or built by `build` and kept when it
    /// is built.
    ///
    /// # Errors
    /// `build`'s; an error is not kept.
    pub fn plan<E>(
        &self,
        defs: &Arc<Registered>,
        asked: Asked<'_>,
        full_names: bool,
        build: impl FnOnce() -> Result<LookupPlan, E>,
    ) -> Result<Arc<LookupPlan>, E> {
        let probe = Probe(asked, full_names);
        let key = || (probe.size() <= MAX_PLAN_KEY).then(|| probe.key());
        memoized(&self.plans, defs, &probe, key, || build().map(Arc::new))
    }

    /// View `view`'s write-time transform under `defs`: compiled by `build` once per
    /// view and set of definitions (an expression is planned once, not per push).
    ///
    /// # Errors
    /// `build`'s; an error is not kept.
    pub fn write_transform<E>(
        &self,
        defs: &Arc<Registered>,
        view: &str,
        build: impl FnOnce() -> Result<Option<WriteTransform>, E>,
    ) -> Result<Option<Arc<WriteTransform>>, E> {
        memoized(&self.transforms, defs, view, || Some(view.to_string()), || build().map(|t| t.map(Arc::new)))
    }

    /// The registry's applies, oldest first (version, time, changes), read from the
    /// file; empty when it cannot be read.
    pub fn history(&self) -> Vec<quiver_sdk::registry::HistoryEntry> {
        self.registry.load_or_empty(&self.project).map(|doc| doc.history).unwrap_or_default()
    }

    /// The registry version [`Self::current`] last answered with (0: nothing applied).
    pub fn version(&self) -> u64 {
        self.cached.read().expect("registry lock").version
    }

    /// The current definitions: re-read when the file's modification time changed;
    /// the last good ones when the file cannot be read.
    pub fn current(&self) -> Arc<Registered> {
        self.checked_ms.store(self.millis(), Ordering::Relaxed);
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
                cached.version = doc.version;
                cached.defs = Arc::new(doc.registered());
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

    /// Its families, the file looked at first (a scrape says how the file is now).
    pub(super) fn render_metrics(&self, out: &mut quiver_runtime::metrics::Exposition) {
        self.current();
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Registered, RegistryCache};
    use crate::lookup::LookupPlan;
    use quiver_sdk::definitions::Asked;

    /// A view's write-time transform is built once per set of definitions.
    #[test]
    fn write_transforms_are_kept_by_view_and_definitions() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RegistryCache::new(dir.path().join("registry.json"), "p").unwrap();
        let defs = cache.current();
        let builds = std::cell::Cell::new(0);
        let get = |defs: &Arc<Registered>, view: &str| {
            cache
                .write_transform(defs, view, || {
                    builds.set(builds.get() + 1);
                    Ok::<_, String>(None)
                })
                .unwrap()
        };
        assert!(get(&defs, "a").is_none() && get(&defs, "a").is_none());
        assert_eq!(builds.get(), 1, "built once for the same view and definitions");
        get(&defs, "b");
        assert_eq!(builds.get(), 2, "another view");
        let other = Arc::new((*defs).clone());
        get(&other, "a");
        assert_eq!(builds.get(), 3, "other definitions (an apply)");
        assert!(cache.write_transform(&other, "c", || Err("bad")).is_err());
        get(&other, "a");
        assert_eq!(builds.get(), 3, "an error is not kept, nor does it drop the others");
    }

    /// A plan is kept per (what was asked, naming, definitions) and built again for
    /// anything else, lists that run together included.
    #[test]
    fn plans_are_kept_by_what_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RegistryCache::new(dir.path().join("registry.json"), "p").unwrap();
        let defs = cache.current();
        let builds = std::cell::Cell::new(0);
        let plan = |defs: &Arc<Registered>, asked, full| {
            cache
                .plan(defs, asked, full, || {
                    builds.set(builds.get() + 1);
                    LookupPlan::new(defs, Vec::new(), full)
                })
                .unwrap()
        };
        let first = plan(&defs, Asked::Features(&["a:b", "c:d"]), false);
        assert!(Arc::ptr_eq(&first, &plan(&defs, Asked::Features(&["a:b", "c:d"]), false)));
        assert_eq!(builds.get(), 1);
        for (asked, full) in [
            (Asked::Features(&["a:b", "c:d"][..]), true),
            (Asked::Features(&["a:bc:d"]), false),
            (Asked::Features(&["a:b"]), false),
            (Asked::Features(&["c:d", "a:b"]), false),
            (Asked::Service("a:b"), false),
        ] {
            let before = builds.get();
            plan(&defs, asked, full);
            assert_eq!(builds.get(), before + 1, "{asked:?} {full}");
        }
        // Other definitions (a registry read again): built again.
        let other = Arc::new(defs.as_ref().clone());
        plan(&other, Asked::Features(&["a:b", "c:d"]), false);
        assert_eq!(builds.get(), 7);
    }
}
