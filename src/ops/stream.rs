//! `stream`: the views' Kafka topics into both stores (the work is in
//! [`quiver_streaming::consumer`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use quiver_online::OnlineStore;
use quiver_streaming::{Hooks, Metrics, StreamOptions, StreamReport};

use crate::error::{Error, Result};
use crate::repo::Repo;

/// Consumes the views' topics until shutdown ([`Repo::stream`]).
#[derive(Debug)]
#[must_use]
pub struct Stream<'a> {
    repo: &'a Repo,
    views: Vec<String>,
    batch_rows: usize,
    batch_interval: Duration,
    metrics: Arc<Metrics>,
    shutdown: Arc<AtomicBool>,
    hooks: Hooks,
    brokers: Option<String>,
    store: Option<Arc<dyn OnlineStore>>,
}

setters!(Stream { store });

impl Repo {
    /// Streams `views` (every view with a stream source when empty) into both stores.
    pub fn stream(&self, views: Vec<String>) -> Stream<'_> {
        Stream {
            repo: self,
            views,
            batch_rows: 10_000,
            batch_interval: Duration::from_millis(500),
            metrics: Arc::new(Metrics::default()),
            shutdown: Arc::new(AtomicBool::new(false)),
            hooks: Hooks::default(),
            brokers: None,
            store: None,
        }
    }
}

impl Stream<'_> {
    /// Flush a micro-batch at this many messages, or when its oldest waited `interval`.
    pub fn with_batch(mut self, rows: usize, interval: Duration) -> Self {
        self.batch_rows = rows;
        self.batch_interval = interval;
        self
    }

    /// Counters to fill (for a metrics endpoint).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Set to stop: the current batch is flushed and committed.
    pub fn with_shutdown(mut self, shutdown: Arc<AtomicBool>) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Where the run's events go (by default `tracing`), and an injected fault.
    pub fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// These bootstrap servers instead of `kafka.brokers`.
    pub fn with_brokers(mut self, brokers: impl Into<String>) -> Self {
        self.brokers = Some(brokers.into());
        self
    }

    /// Checks the views and settings before connecting anywhere.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a batch size or interval of 0, or views that cannot stream.
    pub fn check(&self) -> Result<()> {
        if self.batch_rows == 0 || self.batch_interval.is_zero() {
            return Err(Error::Invalid("--batch-rows and --batch-ms must be at least 1".into()));
        }
        let defs = self.repo.defs()?;
        quiver_streaming::consumer::stream_views(&defs, &self.views)?;
        Ok(())
    }

    /// Runs on the calling thread until shutdown; store, Delta and broker work runs on
    /// `rt` (which must not be the caller's own runtime thread).
    ///
    /// # Errors
    /// As [`quiver_streaming::run`].
    pub fn run_blocking(self, rt: tokio::runtime::Handle) -> Result<StreamReport> {
        self.check()?;
        let defs = Arc::new(self.repo.defs()?);
        let mut options = StreamOptions::new(&self.repo.config);
        options.batch_rows = self.batch_rows;
        options.batch_interval = self.batch_interval;
        options.metrics = self.metrics;
        options.shutdown = self.shutdown;
        options.hooks = self.hooks;
        if let Some(brokers) = self.brokers {
            options.brokers = brokers;
        }
        let store = rt.block_on(self.repo.store_or_open(self.store))?;
        let recorded = recorded(self.repo, &defs, &self.views, &options, &rt);
        let result = quiver_streaming::run(&self.repo.config, defs, &self.views, store, options, rt);
        if let Some(run) = recorded {
            run.end(&result);
        }
        Ok(result?)
    }
}

/// The stream as a long-running lineage run `stream` (docs/lineage.md#long-running-jobs):
/// its topics (`kafka://<first broker>`, the topic) into each view's table and key
/// space; per `lineage.interval` in which it committed a batch, a RUNNING event with the
/// tables at their versions then (read at the tick: this consumer's last commit or a
/// later one).
fn recorded(
    repo: &Repo,
    defs: &quiver_sdk::Definitions,
    names: &[String],
    options: &StreamOptions,
    rt: &tokio::runtime::Handle,
) -> Option<crate::lineage::Ongoing> {
    use crate::lineage::{Dataset, online_keys, view_table};
    let lineage = crate::lineage::Lineage::of(repo);
    if !lineage.enabled() {
        return None;
    }
    let views: Vec<quiver_sdk::FeatureView> = quiver_streaming::consumer::stream_views(defs, names).ok()?.into_iter().cloned().collect();
    let broker = options.brokers.split(',').next().unwrap_or_default().trim();
    let topic = |v: &quiver_sdk::FeatureView| Dataset {
        namespace: format!("kafka://{broker}"),
        name: v.source.stream.as_ref().map(|s| s.topic.clone()).unwrap_or_default(),
        facets: serde_json::Map::new(),
    };
    let mut inputs: Vec<Dataset> = Vec::new();
    for v in &views {
        let t = topic(v);
        if !inputs.contains(&t) {
            inputs.push(t);
        }
    }
    let tables: Vec<(quiver_sdk::FeatureView, Dataset)> =
        views.iter().map(|v| (v.clone(), view_table(&repo.config, defs, v, Some(&topic(v))))).collect();
    let keys: Vec<Dataset> = views.iter().filter(|v| v.takes_online_writes()).map(|v| online_keys(&repo.config, v)).collect();
    let start: Vec<Dataset> = tables.iter().map(|(_, t)| t.clone()).chain(keys.iter().cloned()).collect();
    let (config, rt, metrics) = (repo.config.clone(), rt.clone(), options.metrics.clone());
    let mut seen = 0;
    let poll: crate::lineage::Poll = Box::new(move || {
        let batches = metrics.batches.load(std::sync::atomic::Ordering::Relaxed);
        if batches == seen {
            return None;
        }
        seen = batches;
        let views: Vec<&quiver_sdk::FeatureView> = tables.iter().map(|(v, _)| v).collect();
        let versions = rt.block_on(quiver_offline::historical::table_versions(&config, &views)).unwrap_or_default();
        let wrote = tables.iter().map(|(v, t)| t.clone().version(versions.get(&v.versioned_name()).copied().flatten()));
        Some(wrote.chain(keys.iter().cloned()).collect())
    });
    lineage.ongoing("stream", inputs, &start, poll)
}
