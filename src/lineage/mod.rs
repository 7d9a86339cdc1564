//! The jobs' OpenLineage events (docs/lineage.md): a run of a job — `apply`, `ingest`,
//! ... — is a START event, then COMPLETE or FAIL, sent where `quiver.yaml`'s `lineage:`
//! says; a long-running job (the stream, the server's pushes) is one run with a RUNNING
//! event per interval in which it wrote ([`Ongoing`]). Emission never fails or waits on
//! the job it describes: an event that cannot be delivered is logged and counted, and
//! the job goes on. [`graph`] is the lineage `quiver lineage` answers from, [`columns`]
//! which column comes from which.

pub mod columns;
mod event;
pub mod graph;
mod transport;

use std::sync::Arc;

pub use event::{ColumnFrom, Dataset, InputField, PRODUCER, column_lineage, schema_facet};
use quiver_sdk::config::LineageConfig;
use serde_json::{Value, json};

use crate::repo::Repo;

/// Where a repository's events go, with what every event of its jobs carries.
#[derive(Debug, Clone)]
pub struct Lineage {
    namespace: String,
    interval: std::time::Duration,
    sink: Option<Arc<transport::Sink>>,
    /// Job facets every run carries: the registry's version, the repository's code
    /// version (git commit and dirty flag, when the repository is in git).
    job_facets: serde_json::Map<String, Value>,
}

/// One run of a job: started on creation, ended by [`Run::complete`] or [`Run::fail`].
#[derive(Debug)]
pub struct Run {
    lineage: Lineage,
    job: String,
    id: String,
}

impl Lineage {
    /// The repository's lineage: off (every call a no-op) unless `lineage.transport`
    /// is set.
    pub fn of(repo: &Repo) -> Lineage {
        let config: &LineageConfig = &repo.config.lineage;
        let sink = transport::Sink::open(&config.transport).map(Arc::new);
        let mut job_facets = serde_json::Map::new();
        if sink.is_some() {
            let registry = repo.applied().map(|d| d.version).unwrap_or(0);
            job_facets.insert("quiver".into(), event::quiver_facet(registry, CodeVersion::of(&repo.config.repo)));
        }
        Lineage { namespace: config.namespace.clone(), interval: config.interval, sink, job_facets }
    }

    pub fn enabled(&self) -> bool {
        self.sink.is_some()
    }

    /// Starts a run of `job` (emitting START with what it will read and write, as far
    /// as known).
    pub fn start(&self, job: &str, inputs: &[Dataset], outputs: &[Dataset]) -> Run {
        let run = Run { lineage: self.clone(), job: job.to_string(), id: event::run_id() };
        run.emit("START", inputs, outputs, None);
        run
    }
}

impl Run {
    /// RUNNING, with what the run read and wrote since its last event.
    pub fn running(&self, inputs: &[Dataset], outputs: &[Dataset]) {
        self.emit("RUNNING", inputs, outputs, None);
    }

    /// COMPLETE, with what the run read and wrote.
    pub fn complete(self, inputs: &[Dataset], outputs: &[Dataset]) {
        self.emit("COMPLETE", inputs, outputs, None);
    }

    /// FAIL, with the error's message.
    pub fn fail(self, error: &dyn std::fmt::Display) {
        self.emit("FAIL", &[], &[], Some(error.to_string()));
    }

    /// The run's end from a job's result.
    pub fn end<T, E: std::fmt::Display>(self, result: &Result<T, E>, inputs: &[Dataset], outputs: &[Dataset]) {
        match result {
            Ok(_) => self.complete(inputs, outputs),
            Err(e) => self.fail(e),
        }
    }

    fn emit(&self, kind: &str, inputs: &[Dataset], outputs: &[Dataset], error: Option<String>) {
        let Some(sink) = &self.lineage.sink else { return };
        let mut run_facets = serde_json::Map::new();
        if let Some(message) = error {
            run_facets.insert("errorMessage".into(), event::error_facet(&message));
        }
        let mut job_facets = self.lineage.job_facets.clone();
        job_facets.insert("jobType".into(), event::job_type_facet(&self.job));
        let event = json!({
            "eventType": kind,
            "eventTime": event::now(),
            "producer": event::PRODUCER,
            "schemaURL": event::RUN_EVENT_SCHEMA,
            "run": {"runId": self.id, "facets": run_facets},
            "job": {"namespace": self.lineage.namespace, "name": self.job, "facets": job_facets},
            "inputs": inputs.iter().map(Dataset::json).collect::<Vec<_>>(),
            "outputs": outputs.iter().map(Dataset::json).collect::<Vec<_>>(),
        });
        sink.send(&event);
    }
}

/// What a long-running job wrote since it last said, asked at each interval: `None`
/// when it wrote nothing.
pub type Poll = Box<dyn FnMut() -> Option<Vec<Dataset>> + Send>;

/// A long-running job's run (the stream, the server's pushes; docs/lineage.md#long-running-jobs):
/// START when it begins, then per `lineage.interval` in which it wrote a RUNNING event
/// with what it wrote (asked of its [`Poll`]), and COMPLETE (with all it wrote) or FAIL
/// when it ends. Off the job's path: a thread of its own asks and sends.
pub struct Ongoing {
    ticker: Option<std::thread::JoinHandle<(Run, Vec<Dataset>)>>,
    stop: std::sync::mpsc::Sender<()>,
    inputs: Vec<Dataset>,
}

impl std::fmt::Debug for Ongoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ongoing").field("inputs", &self.inputs.len()).finish_non_exhaustive()
    }
}

impl Lineage {
    /// Starts a long-running run of `job` reading `inputs`, writing (as far as known
    /// now) `outputs`; `None` when lineage is off.
    pub fn ongoing(&self, job: &str, inputs: Vec<Dataset>, outputs: &[Dataset], mut poll: Poll) -> Option<Ongoing> {
        if !self.enabled() {
            return None;
        }
        let run = self.start(job, &inputs, outputs);
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (interval, ins) = (self.interval, inputs.clone());
        let ticker = std::thread::Builder::new()
            .name("lineage-ticker".into())
            .spawn(move || {
                let mut all = Vec::new();
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    if let Some(wrote) = poll() {
                        run.running(&ins, &wrote);
                        merge(&mut all, wrote);
                    }
                }
                if let Some(wrote) = poll() {
                    merge(&mut all, wrote);
                }
                (run, all)
            })
            .ok();
        Some(Ongoing { ticker, stop, inputs })
    }
}

impl Ongoing {
    /// COMPLETE with everything the job wrote (each dataset at the last version it
    /// wrote), or FAIL with its error.
    pub fn end<T, E: std::fmt::Display>(mut self, result: &Result<T, E>) {
        let _ = self.stop.send(());
        let Some(Ok((run, wrote))) = self.ticker.take().map(std::thread::JoinHandle::join) else { return };
        run.end(result, &self.inputs, &wrote);
    }
}

/// `wrote` into `all`, a dataset written again replacing the earlier mention.
fn merge(all: &mut Vec<Dataset>, wrote: Vec<Dataset>) {
    for d in wrote {
        match all.iter_mut().find(|a| a.namespace == d.namespace && a.name == d.name) {
            Some(a) => *a = d,
            None => all.push(d),
        }
    }
}

/// A feature repository's code version: its git commit, and whether the work tree had
/// uncommitted changes (docs/lineage.md#provenance).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CodeVersion {
    pub commit: String,
    pub dirty: bool,
}

impl CodeVersion {
    /// `dir`'s, when it is in a git work tree (and git is installed).
    pub fn of(dir: &std::path::Path) -> Option<CodeVersion> {
        let git =
            |args: &[&str]| std::process::Command::new("git").arg("-C").arg(dir).args(args).output().ok().filter(|o| o.status.success());
        let commit = String::from_utf8(git(&["rev-parse", "HEAD"])?.stdout).ok()?.trim().to_string();
        let dirty = git(&["status", "--porcelain"]).is_some_and(|o| !o.stdout.is_empty());
        Some(CodeVersion { commit, dirty })
    }
}

/// Before the process ends: the events still queued for an HTTP endpoint sent while it
/// answers, at most its timeout (docs/lineage.md#transports).
pub fn flush() {
    transport::flush();
}

/// `view`'s Delta table as a dataset: its schema, and when `source` (the raw rows it
/// was written from) is known, the lineage of each feature from `source`'s columns — a
/// feature stored as it comes from the column of its name, a write-time expression's
/// from the columns it reads (docs/lineage.md).
pub fn view_table(
    config: &quiver_sdk::Config,
    defs: &quiver_sdk::Definitions,
    view: &quiver_sdk::FeatureView,
    source: Option<&Dataset>,
) -> Dataset {
    let columns = quiver_offline::schema::view_columns(defs, view);
    let schema = schema_facet(columns.iter().map(|(f, _)| (f.name().as_str(), f.data_type().to_string())));
    let mut dataset = Dataset::at(&config.view_table(view).to_string()).facet("schema", schema);
    let Some(source) = source else { return dataset };
    let from = |field: &str| (source.namespace.clone(), source.name.clone(), field.to_string());
    let lineage: Vec<ColumnFrom> = columns::feature_columns(defs, view)
        .into_iter()
        .map(|(output, reads, how)| ColumnFrom { output, inputs: reads.iter().map(|c| from(c)).collect(), how })
        .collect();
    dataset = dataset.facet("columnLineage", column_lineage(&lineage));
    dataset
}

/// `view`'s key space in the online store as a dataset: the store by its URL (a Redis
/// server's or a cluster's first seed node's, without credentials or database; the
/// embedded store's file) and the keys' prefix (`quiver:<project>:<view>:`).
pub fn online_keys(config: &quiver_sdk::Config, view: &quiver_sdk::FeatureView) -> Dataset {
    use quiver_sdk::OnlineStoreConfig;
    let server = |url: &str| {
        let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
        let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://{}", rest.split('/').next().unwrap_or(rest))
    };
    let namespace = match &config.online_store {
        OnlineStoreConfig::Embedded { path } => format!("file://{}", Dataset::at(&path.display().to_string()).name),
        OnlineStoreConfig::Redis { url } => server(url),
        OnlineStoreConfig::RedisCluster { urls, .. } => server(urls.first().map_or("", String::as_str)),
    };
    Dataset { namespace, name: quiver_online::view_prefix(&config.project, view), facets: serde_json::Map::new() }
}
