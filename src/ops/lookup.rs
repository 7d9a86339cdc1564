//! An online lookup (docs/online.md), as `quiver online` and the Python SDK do it.

use quiver_online::lookup::{Column, EntityColumns};

use quiver_sdk::Timestamp;

use super::Features;
use crate::error::{Error, Result};
use crate::repo::Repo;

/// Looks up features for entity rows at now ([`Repo::lookup`]).
#[derive(Debug)]
#[must_use]
pub struct Lookup<'a> {
    repo: &'a Repo,
    entities: EntityColumns,
    features: Features,
    full_names: bool,
    now: Option<i64>,
}

impl Repo {
    /// Features for the entity rows `entities` (each join key and its values).
    pub fn lookup(&self, entities: EntityColumns) -> Lookup<'_> {
        Lookup { repo: self, entities, features: Features::None, full_names: false, now: None }
    }
}

setters!(Lookup { features });

impl<'a> Lookup<'a> {
    /// Columns named `view__feature` instead of `feature`.
    pub fn with_full_names(mut self, on: bool) -> Self {
        self.full_names = on;
        self
    }

    /// Answers at `now` instead of the wall clock.
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = Some(now.0);
        self
    }

    async fn run(self) -> Result<Vec<Column>> {
        let defs = self.repo.defs()?;
        let refs = self.features.resolve(&defs)?;
        // The bounds every front end holds a lookup to, before any work.
        let rows = self.entities.first().map_or(0, |(_, values)| values.len());
        quiver_online::lookup::check_size(rows, refs.len(), self.repo.config.server.max_cells)?;
        // The request's own checks before the store is opened: a lookup that cannot be
        // answered is refused as such, not as a store that cannot be reached.
        quiver_online::lookup::Plan::new(&defs, refs.clone(), self.full_names).map_err(request)?;
        let store = self.repo.open_store().await?;
        let now = self.now.unwrap_or_else(|| Timestamp::now().0);
        quiver_online::lookup::get_online_features(
            store.as_ref(),
            &self.repo.config.project,
            &defs,
            &refs,
            &self.entities,
            now,
            self.full_names,
        )
        .await
        .map_err(request)
    }
}

fn request(e: quiver_online::Error) -> Error {
    match e {
        quiver_online::Error::Request(m) => Error::Invalid(m),
        other => other.into(),
    }
}

awaitable!(Lookup => Vec<Column>);
