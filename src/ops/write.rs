//! `ingest` and `push`: rows from outside into the stores, checked whole first.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::RecordBatch;
use quiver_offline::ingest::{AppendOptions, IngestReport};
use quiver_online::OnlineStore;
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

    /// The batches, read from the file when it is one.
    /// The batches, and what errors call them (the file's path, or the name given).
    fn read(self, defs: &quiver_sdk::Definitions, view: &quiver_sdk::FeatureView) -> Result<(Vec<RecordBatch>, String)> {
        match self {
            Rows::File(path) => Ok((quiver_offline::input::read_file(&path, defs, view)?, path.display().to_string())),
            Rows::Batches(batches, name) => Ok((batches, name)),
        }
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
    /// event time after now + `max_future_skew`), then one commit.
    pub fn ingest(&self, view: &str, rows: Rows) -> Ingest<'_> {
        Ingest { repo: self, view: view.to_string(), rows, progress: no_progress() }
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
    async fn run(self) -> Result<IngestReport> {
        let began = std::time::Instant::now();
        let defs = self.repo.defs()?;
        let view = view(&defs, &self.view)?;
        let (batches, source) = self.rows.read(&defs, view)?;
        let progress = self.progress.clone();
        let options = AppendOptions::new(Some(self.repo.event_horizon()));
        let location = self.repo.config.view_table(view);
        let mut report =
            quiver_offline::ingest::append(&location, &defs, view, &source, batches, options, &move |p, n| progress.report(p, n)).await?;
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

    async fn run(self) -> Result<PushReport> {
        let defs = self.repo.defs()?;
        let view = view(&defs, &self.view)?;
        let target = self.target.unwrap_or_else(|| Target::default_for(view));
        quiver_streaming::write::check_target(view, target).map_err(crate::Error::Invalid)?;
        let (batches, source) = self.rows.read(&defs, view)?;
        let store = match (target.online(), self.store) {
            (true, Some(s)) => Some(s),
            (true, None) => Some(self.repo.open_store().await?),
            (false, _) => None,
        };
        Ok(quiver_streaming::write::push_batches(&self.repo.config, &defs, view, &source, batches, target, store.as_deref()).await?)
    }
}

awaitable!(Push => PushReport);
