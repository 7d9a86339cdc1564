//! `verify`: does the online store agree with the offline store? (the work is in
//! [`crate::verify`]).

use std::sync::Arc;

use quiver_online::OnlineStore;

use quiver_sdk::Timestamp;

use super::{Engine, pick_engine};
use crate::error::Result;
use crate::repo::Repo;
use crate::verify::{FeatureReport, LogReport};

/// Replays the serving log between two times ([`Repo::verify_log`]).
#[derive(Debug)]
#[must_use]
pub struct VerifyLog<'a> {
    repo: &'a Repo,
    since: i64,
    until: i64,
    created_cutoff: bool,
    arrival: Option<std::time::Duration>,
    engine: Engine,
}

/// Compares sampled entities at now ([`Repo::verify_sample`]).
#[derive(Debug)]
#[must_use]
pub struct VerifySample<'a> {
    repo: &'a Repo,
    n: usize,
    now: Option<i64>,
    store: Option<Arc<dyn OnlineStore>>,
}

impl Repo {
    /// Replays the answers logged with `since <= request time < until` through the
    /// offline join and compares.
    pub fn verify_log(&self, since: Timestamp, until: Timestamp) -> VerifyLog<'_> {
        VerifyLog { repo: self, since: since.0, until: until.0, created_cutoff: false, arrival: None, engine: Engine::Cpu }
    }

    /// Draws up to `n` entities per online view and compares online with offline.
    pub fn verify_sample(&self, n: usize) -> VerifySample<'_> {
        VerifySample { repo: self, n, now: None, store: None }
    }
}

setters!(VerifyLog { engine });
setters!(VerifySample { store });

impl<'a> VerifyLog<'a> {
    /// Only rows created by each request time count.
    pub fn with_created_cutoff(mut self, on: bool) -> Self {
        self.created_cutoff = on;
        self
    }

    /// Judges each answer by the rows that had arrived offline (their Delta commit)
    /// within `lag` of its request time, either way (docs/consistency.md#as-arrived).
    pub fn as_arrived(mut self, lag: Option<std::time::Duration>) -> Self {
        self.arrival = lag;
        self
    }

    async fn run(self) -> Result<LogReport> {
        let defs = self.repo.defs()?;
        let (kernel, _) = pick_engine(self.engine, 0)?;
        let rule = match self.arrival {
            Some(lag) => crate::verify::Rule::AsArrived { lag_us: i64::try_from(lag.as_micros()).unwrap_or(i64::MAX) },
            None => crate::verify::Rule::EventTime { created_cutoff: self.created_cutoff },
        };
        let report = crate::verify::verify_log(&self.repo.config, &defs, self.since, self.until, rule, kernel.as_ref()).await?;
        let window = Some((self.since, self.until));
        crate::reports::store(
            &self.repo.config.repo,
            &crate::verify::VerifyReport::new("since", Timestamp::now().0, window, &report.features),
        )?;
        Ok(report)
    }
}

awaitable!(VerifyLog => LogReport);

impl<'a> VerifySample<'a> {
    /// Compares at `now` instead of the wall clock.
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = Some(now.0);
        self
    }

    async fn run(self) -> Result<Vec<FeatureReport>> {
        let defs = self.repo.registered()?;
        let store = self.repo.store_or_open(self.store).await?;
        let now = self.now.unwrap_or_else(|| Timestamp::now().0);
        let features = crate::verify::verify_sample(&self.repo.config, &defs, store.as_ref(), self.n, now, now as u64).await?;
        crate::reports::store(&self.repo.config.repo, &crate::verify::VerifyReport::new("sample", now, None, &features))?;
        Ok(features)
    }
}

awaitable!(VerifySample => Vec<FeatureReport>);
