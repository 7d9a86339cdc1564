//! The operations: everything the product does to a repository, each in one place, as
//! a `#[must_use]` builder on [`Repo`] with `with_*` setters, run by `.await` (the
//! delta-rs `operations/` style). The CLI, the Python extension and the examples are
//! front ends over these; what they share — the engine choice, the time grammar,
//! feature-reference resolution, opening the stores — lives here once.
//!
//! ```no_run
//! # async fn f() -> quiver::Result<()> {
//! use quiver::ops::{Engine, Spine};
//! let repo = quiver::Repo::open(std::path::Path::new("repo"))?;
//! let joined = repo
//!     .historical(Spine::file("spine.parquet"))
//!     .with_service("ranker_v1")
//!     .with_engine(Engine::Auto)
//!     .await?;
//! println!("{} rows ({})", joined.batch.num_rows(), joined.engine_note);
//! # Ok(()) }
//! ```

/// The setters several builders share, written once: `setters!(Type { engine, store, ... })`
/// gives `Type` the `with_*` setter of each (the fields they set are named alike).
/// `.await` on a builder runs its `async fn run(self) -> Result<T>`:
/// `awaitable!(Export => Exported)`.
macro_rules! awaitable {
    ($ty:ident => $out:ty) => {
        impl<'a> std::future::IntoFuture for $ty<'a> {
            type Output = $crate::error::Result<$out>;
            type IntoFuture = $crate::ops::OpFuture<'a, $out>;
            fn into_future(self) -> Self::IntoFuture {
                Box::pin(self.run())
            }
        }
    };
}

macro_rules! setters {
    ($ty:ident { $($setter:ident),* $(,)? }) => {
        impl $ty<'_> {
            $(setters!(@ $setter);)*
        }
    };
    (@ engine) => {
        /// The join engine: auto (the default, but verify's CPU), cpu or gpu.
        pub fn with_engine(mut self, engine: $crate::ops::Engine) -> Self {
            self.engine = engine;
            self
        }
    };
    (@ progress) => {
        /// Called as the work goes (phases, rows, shards).
        pub fn with_progress(mut self, progress: $crate::ops::Progress) -> Self {
            self.progress = progress;
            self
        }
    };
    (@ store) => {
        /// Uses `store` instead of opening the online store `quiver.yaml` names.
        pub fn with_store(mut self, store: std::sync::Arc<dyn quiver_online::OnlineStore>) -> Self {
            self.store = Some(store);
            self
        }
    };
    (@ features) => {
        /// `view:feature` references.
        pub fn with_features<S: Into<String>>(mut self, refs: impl IntoIterator<Item = S>) -> Self {
            self.features = $crate::ops::Features::Refs(refs.into_iter().map(Into::into).collect());
            self
        }

        /// A feature service's references.
        pub fn with_service(mut self, name: impl Into<String>) -> Self {
            self.features = $crate::ops::Features::Service(name.into());
            self
        }
    };
}

mod export;
mod historical;
mod lookup;
mod materialize;
mod monitor;
mod serve;
mod stream;
mod verify;
mod versions;
mod write;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use quiver_gpu_join::{AsOfKernel, CpuKernel, CudaKernel};
use quiver_online::OnlineStore;
use quiver_sdk::{Definitions, FeatureRef, FeatureView};

use crate::error::{Error, Result};
use crate::repo::Repo;

pub use export::{Export, Reproduce};
pub use historical::{Historical, Joined};
pub use lookup::Lookup;
pub use materialize::{Materialize, MaterializeIncremental};
pub use monitor::{Monitor, Monitored};
pub use quiver_offline::backfill::BackfillReport;
pub use quiver_offline::historical::{MadeSpine, RowsOf};
pub use serve::{Serve, Server};
pub use stream::Stream;
pub use verify::{VerifyLog, VerifySample};
pub use versions::{Backfill, RetireReport, VersionInfo};
pub use write::{Ingest, Push, Rows};

pub use crate::spine::Spine;

/// A boxed future an operation's `.await` runs.
pub type OpFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Which join engine runs a point-in-time join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// The GPU when one is usable and the spine is large enough, else the CPU.
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl std::str::FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Engine, String> {
        match s {
            "auto" => Ok(Engine::Auto),
            "cpu" => Ok(Engine::Cpu),
            "gpu" => Ok(Engine::Gpu),
            other => Err(format!("engine `{other}` (expected auto, cpu or gpu)")),
        }
    }
}

/// Spine rows from which `Engine::Auto` prefers a GPU: below, transfers and kernel
/// compilation cost more than the CPU join takes.
pub(crate) const GPU_MIN_SPINE_ROWS: usize = 1_000_000;

/// The join engine for `engine` and a spine of `spine_rows` rows, and one line saying
/// which one runs and why.
///
/// # Errors
/// [`Error::Engine`] for `Engine::Gpu` without a usable GPU.
pub(crate) fn pick_engine(engine: Engine, spine_rows: usize) -> Result<(Box<dyn AsOfKernel>, String)> {
    let cpu = |why: String| -> Result<(Box<dyn AsOfKernel>, String)> { Ok((Box::new(CpuKernel::new()), format!("engine: cpu ({why})"))) };
    match engine {
        Engine::Cpu => cpu("asked for".into()),
        Engine::Gpu => {
            let k = CudaKernel::new().map_err(|e| Error::Engine(format!("--engine gpu: {e}")))?;
            let note = format!("engine: cuda on {} (asked for)", k.device());
            Ok((Box::new(k), note))
        }
        Engine::Auto => {
            let probe = quiver_gpu_join::cuda::probe();
            if probe.devices.is_empty() {
                let why = probe.driver_error.unwrap_or_else(|| "the driver reports no device".into());
                return cpu(format!("auto: no GPU: {why}"));
            }
            if spine_rows < GPU_MIN_SPINE_ROWS {
                return cpu(format!("auto: {spine_rows} spine rows, fewer than the {GPU_MIN_SPINE_ROWS} a GPU pays off at"));
            }
            match CudaKernel::new() {
                Ok(k) => {
                    let note = format!("engine: cuda on {} (auto: {spine_rows} spine rows)", k.device());
                    Ok((Box::new(k), note))
                }
                Err(e) => cpu(format!("auto: the GPU is unusable: {e}")),
            }
        }
    }
}

/// The one grammar of time arguments (`materialize START END`, `verify --since`):
/// RFC 3339 with a zone, a date (midnight UTC), `now`, or a duration before `now`
/// (`90m`, `2h`, `7d`). Text without a zone, and bare numbers (seconds? a year?), are
/// refused.
///
/// # Errors
/// [`Error::Invalid`] naming `what` and the text.
///
/// ```
/// use quiver::ops::parse_time;
/// use quiver::sdk::Timestamp;
/// assert_eq!(parse_time("--since", "2024-01-01", Timestamp(0)).unwrap(), Timestamp(1_704_067_200_000_000));
/// assert_eq!(parse_time("--since", "2h", Timestamp(7_200_000_000)).unwrap(), Timestamp(0));
/// assert!(parse_time("START", "1704067200", Timestamp(0)).is_err());
/// ```
pub fn parse_time(what: &str, text: &str, now: quiver_sdk::Timestamp) -> Result<quiver_sdk::Timestamp> {
    parse_micros(what, text, now.0).map(quiver_sdk::Timestamp)
}

fn parse_micros(what: &str, text: &str, now: i64) -> Result<i64> {
    let bad = |m: String| Error::Invalid(format!("{what} `{text}`: {m}"));
    let expected = "expected an RFC 3339 time (2026-11-30T12:00:00Z), a date (2026-11-30), `now` or a duration before now (90m, 2h, 7d)";
    if text == "now" {
        return Ok(now);
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).expect("midnight").and_utc().timestamp_micros());
    }
    match quiver_sdk::types::parse_instant(text) {
        Ok(t) => return Ok(t),
        // Looks like a time: its own message (e.g. a missing zone) says more.
        Err(e) if text.contains(':') => return Err(bad(e)),
        Err(_) => {}
    }
    // A duration needs its unit: a bare number could as well be epoch seconds.
    if !text.trim_end().ends_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(bad(expected.to_string()));
    }
    match quiver_sdk::Ttl::parse(text) {
        Ok(ttl) if !ttl.is_unbounded() => Ok(now.saturating_sub(ttl.micros())),
        _ => Err(bad(expected.to_string())),
    }
}

/// What a join or a lookup asks for: references, or a feature service.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Features {
    #[default]
    None,
    /// `view:feature` texts, parsed when the operation runs.
    Refs(Vec<String>),
    Service(String),
}

impl Features {
    /// The references, checked against `defs`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown service; [`Error::Invalid`] for a reference
    /// that does not parse, or for no features at all.
    pub(crate) fn resolve(&self, defs: &Definitions) -> Result<Vec<FeatureRef>> {
        use quiver_sdk::definitions::{Asked, AskedError};
        let asked = match self {
            Features::Service(name) => Asked::Service(name),
            Features::Refs(list) => Asked::Features(list),
            Features::None => Asked::Features(&[]),
        };
        asked.refs(defs).map_err(|e| match e {
            AskedError::UnknownService(e) => Error::NotFound(e.0),
            e => Error::Invalid(e.to_string()),
        })
    }
}

impl Repo {
    /// The applied definitions (the registry's), not `features.yaml`'s.
    ///
    /// # Errors
    /// When the registry cannot be read.
    pub(crate) fn defs(&self) -> Result<Definitions> {
        Ok(self.applied()?.definitions)
    }

    /// The applied definitions with the earlier online layouts the registry kept: what
    /// a lookup reads rows written under earlier definitions with.
    ///
    /// # Errors
    /// When the registry cannot be read.
    pub(crate) fn registered(&self) -> Result<quiver_sdk::registry::Registered> {
        Ok(self.applied()?.registered())
    }

    /// The online store `quiver.yaml` names, with the project's `max_future_skew`.
    ///
    /// # Errors
    /// When it cannot be opened or reached ([`quiver_online::open_store`]).
    pub async fn open_store(&self) -> Result<Arc<dyn OnlineStore>> {
        Ok(quiver_online::open_store(&self.config).await?)
    }

    /// `store` when a caller gave one, else [`Repo::open_store`].
    ///
    /// # Errors
    /// As [`Repo::open_store`].
    pub(crate) async fn store_or_open(&self, store: Option<Arc<dyn OnlineStore>>) -> Result<Arc<dyn OnlineStore>> {
        match store {
            Some(store) => Ok(store),
            None => self.open_store().await,
        }
    }

    /// The latest event time accepted now: the wall clock plus `max_future_skew`.
    pub(crate) fn event_horizon(&self) -> i64 {
        self.config.event_horizon(quiver_sdk::Timestamp::now().0)
    }
}

/// The definitions a request for `refs` reads: each view at the version asked for
/// (docs/versions.md#references).
///
/// # Errors
/// [`Error::NotFound`] for a version that is not live; [`Error::Invalid`] for one view
/// asked at two versions.
pub(crate) fn pinned<'a>(defs: &'a Definitions, refs: &[FeatureRef]) -> Result<std::borrow::Cow<'a, Definitions>> {
    use quiver_sdk::definitions::VersionError;
    defs.pinned(refs).map_err(|e| match e {
        VersionError::NotFound(e) => Error::NotFound(e.0),
        VersionError::Conflict(e) => Error::Invalid(e),
    })
}

/// The applied view called `name`.
///
/// # Errors
/// [`Error::NotFound`] naming the views the registry has.
pub(crate) fn view<'a>(defs: &'a Definitions, name: &str) -> Result<&'a FeatureView> {
    defs.find_view(name).map_err(|e| Error::NotFound(format!("{e}; is it applied?")))
}

/// Progress of long work: called with a phase (or a shard number) and a count so far.
#[derive(Clone)]
pub struct Progress(Arc<ProgressFn>);

type ProgressFn = dyn Fn(&str, u64) + Send + Sync;

impl Progress {
    pub fn new(f: impl Fn(&str, u64) + Send + Sync + 'static) -> Progress {
        Progress(Arc::new(f))
    }

    pub fn report(&self, phase: &str, n: u64) {
        (self.0)(phase, n);
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// A progress callback that reports nothing.
pub fn no_progress() -> Progress {
    Progress::new(|_, _| {})
}
