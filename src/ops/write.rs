//! `ingest` and `push`: rows from outside into the stores, checked whole first.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::RecordBatch;
use quiver_offline::ingest::{AppendOptions, IngestReport};
use quiver_online::OnlineStore;
use quiver_runtime::write_time::WriteTransform;
use quiver_streaming::{PushReport, Target};

use super::{Progress, no_progress, view};
use crate::error::Result;
use crate::repo::Repo;

/// Rows of one view: a file (Parquet, CSV, JSON lines), or batches in memory.
#[derive(Debug, Clone)]
pub enum Rows {
    File(PathBuf),
    /// Batches, and the name errors call them by (`table`).
    Batches(Vec<RecordBatch>, String),
}

impl Rows {
    pub fn file(path: impl Into<PathBuf>) -> Rows {
        Rows::File(path.into())
    }

    /// What errors call them: the file's path, or the name given.
    fn name(&self) -> String {
        match self {
            Rows::File(path) => path.display().to_string(),
            Rows::Batches(_, name) => name.clone(),
        }
    }

    /// The batches, and what errors call them (the file's path, or the name given).
    fn read(self, defs: &quiver_sdk::Definitions, view: &quiver_sdk::FeatureView) -> Result<(Vec<RecordBatch>, String)> {
        match self {
            Rows::File(path) => Ok((quiver_offline::input::read_file(&path, defs, view)?, path.display().to_string())),
            Rows::Batches(batches, name) => Ok((batches, name)),
        }
    }

    /// The rows as a lineage dataset: a file by its path; batches in memory by their name.
    fn dataset(&self) -> crate::lineage::Dataset {
        match self {
            Rows::File(path) => crate::lineage::Dataset::at(&path.display().to_string()),
            Rows::Batches(_, name) => {
                crate::lineage::Dataset { namespace: "memory".into(), name: name.clone(), facets: Default::default() }
            }
        }
    }

    /// `sha256:<hex>` of the content: a file's bytes, or batches as an Arrow IPC
    /// stream (the same table gives the same bytes).
    fn content_hash(&self) -> Result<String> {
        use sha2::{Digest, Sha256};
        /// Bytes written into the hash.
        struct Hashing(Sha256);
        impl std::io::Write for Hashing {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.update(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut hasher = Hashing(Sha256::new());
        match self {
            Rows::File(path) => {
                let mut file = std::fs::File::open(path).map_err(|e| crate::Error::io(path, e))?;
                std::io::copy(&mut file, &mut hasher).map_err(|e| crate::Error::io(path, e))?;
            }
            Rows::Batches(batches, name) => {
                let schema = batches.first().map(RecordBatch::schema).unwrap_or_else(|| Arc::new(arrow::datatypes::Schema::empty()));
                let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut hasher, &schema)
                    .map_err(|e| crate::Error::Invalid(format!("{name}: {e}")))?;
                for batch in batches {
                    writer.write(batch).map_err(|e| crate::Error::Invalid(format!("{name}: {e}")))?;
                }
                writer.finish().map_err(|e| crate::Error::Invalid(format!("{name}: {e}")))?;
            }
        }
        Ok(format!("sha256:{}", hasher.0.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>()))
    }
}

/// Appends rows to a view's Delta table in one commit ([`Repo::ingest`]).
#[derive(Debug)]
#[must_use]
pub struct Ingest<'a> {
    repo: &'a Repo,
    view: String,
    rows: Rows,
    progress: Progress,
    allow_duplicate: bool,
}

/// Writes rows through the streaming write path ([`Repo::push`]).
#[derive(Debug)]
#[must_use]
pub struct Push<'a> {
    repo: &'a Repo,
    view: String,
    rows: Rows,
    target: Option<Target>,
    store: Option<Arc<dyn OnlineStore>>,
}

impl Repo {
    /// Appends `rows` to `view`'s Delta table: checked whole (types, zoned times, no
    /// event time after now + `max_future_skew`), then one commit. Idempotent by
    /// content: rows whose content the table already holds (the same file's bytes, or
    /// the same table) are not appended again — the report says which version holds
    /// them — unless [`Ingest::allow_duplicate`].
    pub fn ingest(&self, view: &str, rows: Rows) -> Ingest<'_> {
        Ingest { repo: self, view: view.to_string(), rows, progress: no_progress(), allow_duplicate: false }
    }

    /// Pushes `rows` of `view` to both stores (offline only for a view with `online:
    /// false`) or to [`Push::with_target`]'s.
    pub fn push(&self, view: &str, rows: Rows) -> Push<'_> {
        Push { repo: self, view: view.to_string(), rows, target: None, store: None }
    }
}

setters!(Ingest { progress });
setters!(Push { store });

impl<'a> Ingest<'a> {
    /// Appends the rows even when the table already holds the same content (they will
    /// count twice).
    pub fn allow_duplicate(mut self, on: bool) -> Self {
        self.allow_duplicate = on;
        self
    }

    /// The ingest, as a lineage run `ingest.<view>` when lineage is on (docs/lineage.md).
    async fn run(self) -> Result<IngestReport> {
        let lineage = crate::lineage::Lineage::of(self.repo);
        if !lineage.enabled() {
            return self.write().await;
        }
        let input = self.rows.dataset();
        let defs = self.repo.defs()?;
        let target = view(&defs, &self.view).ok();
        let output = target.map(|v| crate::lineage::view_table(&self.repo.config, &defs, v, Some(&input)));
        let job = format!("ingest.{}", target.map_or_else(|| self.view.clone(), |v| v.versioned_name()));
        let run = lineage.start(&job, std::slice::from_ref(&input), output.as_slice());
        let result = self.write().await;
        let written = output.map(|o| o.version(result.as_ref().ok().and_then(|r| r.version)));
        run.end(&result, &[input], written.as_slice());
        result
    }

    async fn write(self) -> Result<IngestReport> {
        let began = std::time::Instant::now();
        let defs = self.repo.defs()?;
        let view = view(&defs, &self.view)?;
        let hash = self.rows.content_hash()?;
        let transform = quiver_offline::ingest::write_transform(&defs, view, &self.rows.name())?;
        // A view with write-time expressions is read as its raw rows, then shaped.
        let (batches, source) = self.rows.read(&defs, transform.as_ref().map_or(view, WriteTransform::raw_view))?;
        let latest = Some(self.repo.event_horizon());
        let shaped = quiver_offline::ingest::shape(&defs, transform.as_ref(), &source, batches, latest)?;
        let progress = self.progress.clone();
        let content = quiver_offline::ingest::Content { hash, allow_duplicate: self.allow_duplicate };
        let options = AppendOptions::new(latest).with_content(content);
        let location = self.repo.config.view_table(view);
        let mut report =
            quiver_offline::ingest::append_shaped(&location, &defs, view, &source, shaped, options, &move |p, n| progress.report(p, n))
                .await?;
        report.seconds = began.elapsed().as_secs_f64();
        Ok(report)
    }
}

awaitable!(Ingest => IngestReport);

impl<'a> Push<'a> {
    /// Where the rows go; default both stores (offline for an offline-only view).
    pub fn with_target(mut self, target: Option<Target>) -> Self {
        self.target = target;
        self
    }

    /// The push, as a lineage run `push.<view>` when lineage is on (docs/lineage.md):
    /// the rows' file into the view's table (at the version written) and its keys.
    async fn run(self) -> Result<PushReport> {
        let lineage = crate::lineage::Lineage::of(self.repo);
        if !lineage.enabled() {
            return self.write().await;
        }
        let input = self.rows.dataset();
        let defs = self.repo.defs()?;
        let Ok(view) = view(&defs, &self.view) else { return self.write().await };
        let target = self.target.unwrap_or_else(|| Target::default_for(view));
        let table = target.offline().then(|| crate::lineage::view_table(&self.repo.config, &defs, view, Some(&input)));
        let keys = target.online().then(|| crate::lineage::online_keys(&self.repo.config, view));
        let run = lineage.start(
            &format!("push.{}", view.versioned_name()),
            std::slice::from_ref(&input),
            &[table.clone(), keys.clone()].into_iter().flatten().collect::<Vec<_>>(),
        );
        let result = self.write().await;
        let version = result.as_ref().ok().and_then(|r| r.offline_version);
        let outputs: Vec<_> = [table.map(|t| t.version(version)), keys].into_iter().flatten().collect();
        run.end(&result, &[input], &outputs);
        result
    }

    async fn write(self) -> Result<PushReport> {
        let defs = self.repo.defs()?;
        let view = view(&defs, &self.view)?;
        let target = self.target.unwrap_or_else(|| Target::default_for(view));
        quiver_streaming::write::check_target(view, target).map_err(crate::Error::Invalid)?;
        let transform = quiver_offline::ingest::write_transform(&defs, view, &self.rows.name())?;
        let (batches, source) = self.rows.read(&defs, transform.as_ref().map_or(view, WriteTransform::raw_view))?;
        let store = match (target.online(), self.store) {
            (true, Some(s)) => Some(s),
            (true, None) => Some(self.repo.open_store().await?),
            (false, _) => None,
        };
        Ok(quiver_streaming::write::push_batches(&self.repo.config, &defs, view, &source, batches, target, store.as_deref()).await?)
    }
}

awaitable!(Push => PushReport);
