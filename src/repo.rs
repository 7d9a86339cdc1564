//! A feature repository on disk: `quiver.yaml`, `features.yaml` and the registry they
//! point to.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use quiver_offline::DeltaProbe;
use quiver_sdk::registry::{self, ApplyOutcome};
use quiver_sdk::{Config, Definitions, FileRegistry, Plan, RegistryDoc};

use crate::error::Result;

impl Repo {
    /// Two views writing one Delta table would corrupt each other's reads.
    fn check_tables_distinct(&self, defs: &Definitions) -> Result<()> {
        let mut seen: Vec<(String, &str)> = Vec::new();
        for view in &defs.feature_views {
            let location = self.config.view_table(view).to_string();
            if let Some((_, other)) = seen.iter().find(|(l, _)| *l == location) {
                return Err(quiver_sdk::Error::Definition {
                    file: Some(self.definitions_path.clone()),
                    source: quiver_sdk::DefinitionError::SharedTable {
                        first: other.to_string(),
                        second: view.name.clone(),
                        table: location,
                    },
                }
                .into());
            }
            seen.push((location, &view.name));
        }
        Ok(())
    }
}

/// What [`Repo::apply`] did.
#[derive(Debug, Clone)]
pub struct Applied {
    pub outcome: ApplyOutcome,
    /// Delta tables created for views that had none.
    pub created_tables: Vec<String>,
}

/// The definitions file of a repository.
pub const DEFINITIONS_FILE: &str = "features.yaml";

/// An opened repository: its validated config and where its definitions are.
#[derive(Debug, Clone)]
pub struct Repo {
    pub config: Config,
    pub definitions_path: PathBuf,
}

impl Repo {
    /// Opens the repository in `dir`, with the process environment's overrides.
    ///
    /// # Errors
    /// When `quiver.yaml` is missing or invalid.
    pub fn open(dir: &Path) -> Result<Repo> {
        let config = Config::load(dir)?;
        Ok(Repo {
            definitions_path: dir.join(DEFINITIONS_FILE),
            config,
        })
    }

    /// The definitions in `features.yaml`, validated.
    ///
    /// # Errors
    /// A one-line error naming the file and the definition at fault.
    pub fn definitions(&self) -> Result<Definitions> {
        Ok(quiver_sdk::yaml::load_definitions(&self.definitions_path)?)
    }

    pub fn registry(&self) -> FileRegistry {
        FileRegistry::new(&self.config.registry_path)
    }

    /// What the registry holds (an empty document before the first apply).
    ///
    /// # Errors
    /// When the registry exists but cannot be read or belongs to another project.
    pub fn applied(&self) -> Result<RegistryDoc> {
        Ok(self.registry().load_or_empty(&self.config.project)?)
    }

    /// The diff from the registry to `features.yaml`.
    ///
    /// # Errors
    /// As [`Repo::definitions`] and [`Repo::applied`].
    pub fn plan(&self) -> Result<Plan> {
        let defs = self.definitions()?;
        Ok(self.applied()?.plan(&defs))
    }

    /// Applies `features.yaml`: refuses breaking changes to views whose Delta tables hold
    /// data unless `force`, writes the next registry version (or nothing when nothing
    /// changed), then creates the Delta tables that are missing. `runtime` runs the
    /// Delta work; call from outside it.
    ///
    /// # Errors
    /// Invalid definitions, a refused breaking change, or an unreadable registry or
    /// table; the registry is unchanged in each of these cases. Creating a table is
    /// idempotent, so an apply that failed there is completed by running it again.
    pub fn apply(
        &self,
        force: bool,
        now: DateTime<Utc>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Applied> {
        self.apply_definitions(self.definitions()?, force, now, runtime)
    }

    /// Applies `defs` (from the Python SDK or the Rust builder) exactly as [`Repo::apply`]
    /// applies `features.yaml`, after the same validation.
    ///
    /// # Errors
    /// As [`Repo::apply`].
    pub fn apply_definitions(
        &self,
        defs: Definitions,
        force: bool,
        now: DateTime<Utc>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Applied> {
        defs.validate().map_err(quiver_sdk::Error::from)?;
        self.check_tables_distinct(&defs)?;
        let probe = DeltaProbe::new(&self.config, runtime.clone());
        let mut created_tables = Vec::new();
        // Missing tables are created after every check passed and before the registry
        // is written, so a failure leaves the registry as it was.
        let mut ensure_tables = || -> quiver_sdk::Result<()> {
            for view in &defs.feature_views {
                let location = self.config.view_table(view);
                let schema = quiver_offline::schema::table_schema(&defs, view);
                let created = runtime
                    .block_on(quiver_offline::delta::ensure_table(&location, &schema, &view.name))
                    .map_err(|e| quiver_sdk::Error::Store(e.to_string()))?;
                if created {
                    created_tables.push(location.to_string());
                }
            }
            Ok(())
        };
        let outcome = registry::apply_with(
            &self.registry(),
            &self.config.project,
            &defs,
            &probe,
            force,
            now,
            &mut ensure_tables,
        )?;
        if !outcome.written {
            // Nothing changed; still make sure every view has its table.
            ensure_tables()?;
        }
        Ok(Applied {
            outcome,
            created_tables,
        })
    }
}
