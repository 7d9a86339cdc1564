//! An online lookup (docs/online.md), as `quiver online` and the Python SDK do it.

use quiver_online::lookup::{Column, EntityColumns, RequestFields, request_values};
use quiver_runtime::encoding::KeyValue;

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
    /// Columns as JSON, join keys and request fields alike ([`Lookup::with_columns`]).
    given: Vec<(String, Vec<serde_json::Value>)>,
    features: Features,
    full_names: bool,
    now: Option<i64>,
}

impl Repo {
    /// Features for the entity rows `entities` (each join key and its values).
    pub fn lookup(&self, entities: EntityColumns) -> Lookup<'_> {
        Lookup { repo: self, entities, given: Vec::new(), features: Features::None, full_names: false, now: None }
    }
}

setters!(Lookup { features });

impl<'a> Lookup<'a> {
    /// Columns named `view__feature` instead of `feature`.
    pub fn with_full_names(mut self, on: bool) -> Self {
        self.full_names = on;
        self
    }

    /// More entity columns, as JSON: join keys, and the request fields of the on-demand
    /// features asked for (Feast's `entities`), told apart by those features; any other
    /// name is refused ([`quiver_online::lookup::LookupPlan::given`]).
    pub fn with_columns(mut self, given: Vec<(String, Vec<serde_json::Value>)>) -> Self {
        self.given.extend(given);
        self
    }

    /// Answers at `now` instead of the wall clock.
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = Some(now.0);
        self
    }

    async fn run(mut self) -> Result<Vec<Column>> {
        let defs = self.repo.registered()?;
        let refs = self.features.resolve(&defs)?;
        // The bounds every front end holds a lookup to, before any work.
        let rows = self.entities.first().map_or(0, |(_, v)| v.len()).max(self.given.first().map_or(0, |(_, v)| v.len()));
        quiver_online::lookup::check_size(rows, refs.len(), self.repo.config.server.max_cells)?;
        // The request's own checks before the store is opened: a lookup that cannot be
        // answered is refused as such, not as a store that cannot be reached.
        let plan = quiver_online::lookup::LookupPlan::new(&defs, refs.clone(), self.full_names).map_err(request)?;
        // Each name once: two columns of one name would be answered under names the
        // caller maps to the other's values.
        let names: Vec<&str> = self.entities.iter().map(|(n, _)| n).chain(self.given.iter().map(|(n, _)| n)).map(String::as_str).collect();
        if let Some((_, name)) = names.iter().enumerate().find(|&(i, n)| names[..i].contains(n)) {
            return Err(Error::Invalid(format!("`{name}` is given twice")));
        }
        let mut fields = RequestFields::new();
        for (name, values) in std::mem::take(&mut self.given) {
            match plan.given(&name).map_err(request)? {
                Some(field) => fields.push((name, request_values(field, &values).map_err(request)?)),
                None => {
                    let keys = values
                        .iter()
                        .map(|v| {
                            KeyValue::from_json(v)
                                .ok_or_else(|| Error::Invalid(format!("entity `{name}`: {v} is not an integer or a string")))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    self.entities.push((name, keys));
                }
            }
        }
        plan.check_given((&self.entities, &fields)).map_err(request)?;
        let store = self.repo.open_store().await?;
        let now = self.now.unwrap_or_else(|| Timestamp::now().0);
        quiver_online::lookup::get_online_features(
            store.as_ref(),
            &self.repo.config.project,
            &defs,
            &refs,
            (&self.entities, &fields),
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
