//! A feature repository on disk: `quiver.yaml`, `features.yaml` and the registry they
//! point to.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use quiver_offline::DeltaProbe;
use quiver_sdk::registry::{self, ApplyOutcome, Origin};
use quiver_sdk::{Config, Definitions, FileRegistry, Plan, RegistryDoc};

use crate::error::Result;

impl Repo {
    /// Two views writing one Delta table would corrupt each other's reads, however the
    /// path is spelled (`./data/t/`, `data//t`, a symlink, `file:///.../t`); a view's
    /// table inside another's folder, or at the serving log's table, likewise.
    fn check_tables_distinct(&self, defs: &Definitions) -> Result<()> {
        let refuse = |source: quiver_sdk::DefinitionError| -> crate::Error {
            quiver_sdk::Error::Definition { file: Some(self.definitions_path.clone()), error: Box::new(source) }.into()
        };
        let log = table_identity(&self.config.serving_log.location);
        let mut seen: Vec<(String, String, String)> = Vec::new();
        for view in defs.all_view_versions() {
            let location = self.config.view_table(view);
            let id = table_identity(&location);
            if id == log || id.starts_with(&format!("{log}/")) || log.starts_with(&format!("{id}/")) {
                return Err(refuse(quiver_sdk::DefinitionError::ServingLogTable { view: view.name.clone(), table: location.to_string() }));
            }
            for (other_id, other, other_location) in &seen {
                if *other_id == id {
                    return Err(refuse(quiver_sdk::DefinitionError::SharedTable {
                        first: other.to_string(),
                        second: view.versioned_name(),
                        table: location.to_string(),
                    }));
                }
                // (outer view, inner view, inner table)
                let nested = if id.starts_with(&format!("{other_id}/")) {
                    Some((other.clone(), view.versioned_name(), location.to_string()))
                } else if other_id.starts_with(&format!("{id}/")) {
                    Some((view.versioned_name(), other.clone(), other_location.clone()))
                } else {
                    None
                };
                if let Some((first, second, table)) = nested {
                    return Err(refuse(quiver_sdk::DefinitionError::NestedTable { first, second, table }));
                }
            }
            seen.push((id, view.versioned_name(), location.to_string()));
        }
        Ok(())
    }
}

/// One spelling per table location: local paths absolute, `.` and `..` resolved,
/// symlinks of the part that exists followed, no trailing slash (`file://` URIs are
/// local paths); object-store URIs with the scheme and host lowercased and repeated or
/// trailing slashes dropped.
pub fn table_identity(location: &quiver_sdk::config::StoreLocation) -> String {
    use quiver_sdk::config::StoreLocation;
    match location {
        StoreLocation::Local(path) => local_identity(path),
        StoreLocation::Uri(uri, _) => match uri.strip_prefix("file://") {
            Some(path) => local_identity(Path::new(path)),
            None => {
                let (scheme, rest) = uri.split_once("://").unwrap_or(("", uri));
                let mut parts = rest.split('/').filter(|p| !p.is_empty() && *p != ".");
                let host = parts.next().unwrap_or("").to_ascii_lowercase();
                let mut path: Vec<&str> = Vec::new();
                for p in parts {
                    if p == ".." {
                        path.pop();
                    } else {
                        path.push(p);
                    }
                }
                format!("{}://{host}/{}", scheme.to_ascii_lowercase(), path.join("/"))
            }
        },
    }
}

fn local_identity(path: &Path) -> String {
    use std::path::Component;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut clean = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                clean.pop();
            }
            Component::CurDir => {}
            other => clean.push(other),
        }
    }
    // Follow symlinks of the longest part that exists.
    let mut existing = clean.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name().map(std::ffi::OsStr::to_os_string), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out = std::fs::canonicalize(&existing).unwrap_or(existing);
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    out.to_string_lossy().trim_end_matches('/').to_string()
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
        Ok(Repo { definitions_path: dir.join(DEFINITIONS_FILE), config })
    }

    /// The definitions in `features.yaml`, validated as a file to apply: its services'
    /// references to features the views' latest versions lack are checked by `plan` and
    /// `apply` once the registry's pins are in place
    /// ([`Definitions::validate_unmerged`]).
    ///
    /// # Errors
    /// A one-line error naming the file and the definition at fault.
    pub fn definitions(&self) -> Result<Definitions> {
        Ok(quiver_sdk::yaml::load_definitions_unmerged(&self.definitions_path)?)
    }

    /// `error` of the definitions applied from `origin`, naming `features.yaml` when
    /// they came from it.
    fn in_definitions(&self, origin: &Origin, error: quiver_sdk::Error) -> quiver_sdk::Error {
        if origin.name == DEFINITIONS_FILE { error.in_file(&self.definitions_path) } else { error }
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

    /// The diff from the registry to `features.yaml`, removing also the objects named in
    /// `remove` (`kind/name` or a name) that another front end defined; the objects
    /// another front end defined are otherwise kept ([`Plan::kept`]); the views a
    /// breaking change gives a new version ([`Plan::versions`]). `runtime` reads the
    /// Delta tables; call from outside it.
    ///
    /// # Errors
    /// As [`Repo::definitions`] and [`Repo::applied`], and a name in `remove` that is not
    /// registered or that `features.yaml` defines.
    pub fn plan(&self, remove: Vec<String>, runtime: tokio::runtime::Handle) -> Result<Plan> {
        let defs = self.definitions()?;
        let origin = Origin::new(DEFINITIONS_FILE).removing(remove);
        let probe = DeltaProbe::new(&self.config, runtime);
        let (merged, plan, _) = self.applied()?.plan_versions(&defs, &origin, &probe, false)?;
        // What an apply would record, checked as it would check it: the services'
        // references with the registry's pins in place.
        merged.validate().and_then(|()| merged.check_versions()).map_err(|e| self.in_definitions(&origin, e.into()))?;
        Ok(plan)
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
    pub fn apply(&self, force: bool, now: DateTime<Utc>, runtime: tokio::runtime::Handle) -> Result<Applied> {
        self.apply_from(self.definitions()?, &Origin::new(DEFINITIONS_FILE), force, now, runtime)
    }

    /// Applies `defs` (from the Rust builder) exactly as [`Repo::apply`] applies
    /// `features.yaml`, after the same validation; recorded as defined from `rust`.
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
        self.apply_from(defs, &Origin::new("rust"), force, now, runtime)
    }

    /// Applies `defs` from the front end `origin` names: what that front end defined
    /// before and `defs` lacks is removed, what another one defined is kept unless
    /// `origin.remove` names it ([`RegistryDoc::plan_from`]).
    ///
    /// # Errors
    /// As [`Repo::apply`].
    pub fn apply_from(
        &self,
        defs: Definitions,
        origin: &Origin,
        force: bool,
        now: DateTime<Utc>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Applied> {
        let lineage = crate::lineage::Lineage::of(self);
        if !lineage.enabled() {
            return self.apply_unrecorded(defs, origin, force, now, runtime);
        }
        // A lineage run `apply`: the definitions read, the registry written at its version.
        use crate::lineage::Dataset;
        let source = if origin.name == DEFINITIONS_FILE {
            Dataset::at(&self.definitions_path.display().to_string())
        } else {
            Dataset { namespace: "quiver".into(), name: format!("{}/{}", self.config.project, origin.name), facets: Default::default() }
        };
        let registry = Dataset::at(&self.config.registry_path.display().to_string());
        let run = lineage.start("apply", std::slice::from_ref(&source), std::slice::from_ref(&registry));
        let result = self.apply_unrecorded(defs, origin, force, now, runtime);
        let written = registry.version(result.as_ref().ok().map(|a| a.outcome.version));
        run.end(&result, &[source], &[written]);
        result
    }

    fn apply_unrecorded(
        &self,
        defs: Definitions,
        origin: &Origin,
        force: bool,
        now: DateTime<Utc>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Applied> {
        defs.validate_unmerged().map_err(|e| self.in_definitions(origin, e.into()))?;
        let probe = DeltaProbe::new(&self.config, runtime.clone());
        let mut created_tables = Vec::new();
        // Missing tables (every live version's) are created after every check passed
        // and before the registry is written, so a failure leaves the registry as it was.
        let mut ensure_tables = |recorded: &Definitions| -> quiver_sdk::Result<()> {
            self.check_tables_distinct(recorded).map_err(|e| match e {
                crate::Error::Sdk(e) => e,
                other => quiver_sdk::Error::Store(quiver_sdk::ErrorKind::Invalid, other.to_string()),
            })?;
            for view in recorded.all_view_versions() {
                let location = self.config.view_table(view);
                let schema = quiver_offline::schema::table_schema(recorded, view);
                let created = runtime
                    .block_on(quiver_offline::delta::ensure_table(&location, &schema, &view.name))
                    .map_err(|e| quiver_sdk::Error::Store(e.kind(), e.to_string()))?;
                if created {
                    created_tables.push(location.to_string());
                }
            }
            Ok(())
        };
        let request = registry::ApplyRequest { new: &defs, origin, probe: &probe, force, now };
        let outcome = registry::apply_with(&self.registry(), &self.config.project, &request, &mut ensure_tables)
            .map_err(|e| self.in_definitions(origin, e))?;
        if !outcome.written {
            // Nothing changed; still make sure every view has its table.
            ensure_tables(&self.applied()?.definitions)?;
        }
        Ok(Applied { outcome, created_tables })
    }
}
