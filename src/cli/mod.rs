//! The `quiver` commands: one module per command, each a clap `Args` struct with
//! `fn run(self, ctx)`, a thin front end over [`quiver::ops`] that parses, prints and
//! picks the exit code.

pub mod cluster;
pub mod doctor;
pub mod export;
pub mod historical;
pub mod ingest;
pub mod init;
pub mod lineage;
pub mod materialize;
pub mod monitor;
pub mod online;
pub mod registry;
pub mod serve;
pub mod spine;
pub mod stream;
pub mod verify;

use std::path::PathBuf;

use anyhow::Context;
use quiver::Repo;

/// What every command gets: where the repository is.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub repo: PathBuf,
}

impl Ctx {
    /// The repository, with its config validated.
    pub fn open(&self) -> anyhow::Result<Repo> {
        Ok(Repo::open(&self.repo)?)
    }
}

/// A multi-threaded runtime for the commands that do async work.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

/// A spinner with the current phase and count on a terminal; nothing otherwise.
pub fn progress_bar() -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("valid template"));
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// An operation's progress shown on `bar` as `phase: n rows`.
pub fn progress_on(bar: &indicatif::ProgressBar) -> quiver::ops::Progress {
    let bar = bar.clone();
    quiver::ops::Progress::new(move |phase, n| bar.set_message(format!("{phase}: {n} rows")))
}

/// The `--engine` flag.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum EngineArg {
    Auto,
    Cpu,
    Gpu,
}

impl From<EngineArg> for quiver::ops::Engine {
    fn from(e: EngineArg) -> Self {
        match e {
            EngineArg::Auto => quiver::ops::Engine::Auto,
            EngineArg::Cpu => quiver::ops::Engine::Cpu,
            EngineArg::Gpu => quiver::ops::Engine::Gpu,
        }
    }
}
