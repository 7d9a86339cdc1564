//! The registry's file: read, written atomically, locked for an apply; and the apply
//! that plans against it, checks for breaking changes and writes the next version.

use std::fmt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{Breaking, DataProbe, Origin, Plan, REGISTRY_FORMAT, RegistryDoc};
use crate::definitions::Definitions;
use crate::error::{Error, Result};

/// The registry document in a local JSON file.
#[derive(Debug, Clone)]
pub struct FileRegistry {
    path: PathBuf,
}

impl FileRegistry {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileRegistry { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored document, or `None` when the file does not exist yet.
    ///
    /// # Errors
    /// [`Error::Registry`] for a file that does not parse or was written by a newer
    /// format; [`Error::Io`] when it cannot be read.
    pub fn load(&self) -> Result<Option<RegistryDoc>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&self.path, e)),
        };
        let bad = |message: String| Error::Registry { file: self.path.clone(), message };
        let mut value: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let format = value.get("format").and_then(Value::as_u64).unwrap_or(0);
        if format != u64::from(REGISTRY_FORMAT) {
            return Err(bad(format!("format {format} is not the format this quiver reads ({REGISTRY_FORMAT})")));
        }
        moved_layouts(&mut value);
        let doc = serde_json::from_value(value).map_err(|e| bad(format!("unreadable: {e}")))?;
        Ok(Some(doc))
    }

    /// The stored document, or an empty one for `project`; refuses a registry that
    /// belongs to another project.
    ///
    /// # Errors
    /// As [`FileRegistry::load`], and [`Error::Registry`] on a project mismatch.
    pub fn load_or_empty(&self, project: &str) -> Result<RegistryDoc> {
        match self.load()? {
            Some(doc) if doc.project != project => Err(Error::Registry {
                file: self.path.clone(),
                message: format!("holds project `{}`, but quiver.yaml names project `{project}`", doc.project),
            }),
            Some(doc) => Ok(doc),
            None => Ok(RegistryDoc::empty(project)),
        }
    }

    /// Writes the document atomically: a temp file in the same folder, fsync, rename
    /// over the old file, fsync of the folder. A reader sees the old or the new
    /// document, never a part of one.
    ///
    /// # Errors
    /// [`Error::Io`]; the old file is then untouched and the temp file removed.
    pub fn save(&self, doc: &RegistryDoc) -> Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let mut text = serde_json::to_string_pretty(doc).expect("registry serialises");
        text.push('\n');
        crate::files::write_atomic(&self.path, text.as_bytes()).map_err(|e| Error::io(&self.path, e))
    }

    /// The lock that serialises applies to this registry (`<registry>.lock`): a second
    /// `apply` waits for the first up to `wait`, then fails naming the lock.
    ///
    /// # Errors
    /// [`Error::Locked`] when another apply still holds it; [`Error::Io`] when the lock
    /// file cannot be opened.
    pub fn lock(&self, wait: std::time::Duration) -> Result<crate::files::FileLock> {
        let mut name = self.path.as_os_str().to_os_string();
        name.push(".lock");
        let lock = PathBuf::from(name);
        if let Some(dir) = lock.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        crate::files::FileLock::acquire(&lock, wait).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => Error::Locked { lock: lock.clone(), wait },
            _ => Error::io(&lock, e),
        })
    }
}

/// How long an `apply` waits for another one to finish.
pub const APPLY_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What [`apply`] did.
#[derive(Debug, Clone)]
pub struct ApplyOutcome {
    pub plan: Plan,
    /// The registry version after the apply.
    pub version: u64,
    /// False when nothing changed and nothing was written.
    pub written: bool,
    /// Breaking changes that `force` let through.
    pub forced: Vec<Breaking>,
}

/// Registries written before the earlier layouts had their own place kept them inside
/// `definitions`: move them to `layouts`, where this version reads them.
fn moved_layouts(doc: &mut Value) {
    let Some(definitions) = doc.get_mut("definitions").and_then(Value::as_object_mut) else { return };
    let moved: Vec<(String, Value)> = ["online_layouts", "online_aggregations"]
        .into_iter()
        .filter_map(|key| definitions.remove(key).map(|v| (key.to_string(), v)))
        .collect();
    if moved.is_empty() {
        return;
    }
    let Some(object) = doc.as_object_mut() else { return };
    let layouts = object.entry("layouts").or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(layouts) = layouts.as_object_mut() {
        layouts.extend(moved);
    }
}

/// Applies `new` to the registry: a no-op when nothing changed; otherwise makes each
/// breaking change to a view that holds data into the view's next version (or, with
/// `force`, replaces it in place), refuses the removal of a view that holds data
/// (unless `force`), then writes version + 1.
///
/// # Errors
/// [`Error::Breaking`] naming the first breaking change (the registry is unchanged), or
/// the errors of loading and saving the registry.
pub fn apply(
    registry: &FileRegistry,
    project: &str,
    new: &Definitions,
    probe: &dyn DataProbe,
    force: bool,
    now: DateTime<Utc>,
) -> Result<ApplyOutcome> {
    let request = ApplyRequest { new, origin: &Origin::new("rust"), probe, force, now };
    apply_with(registry, project, &request, &mut |_| Ok(()))
}

/// One apply: the definitions, where they come from, how to probe the views for data,
/// whether to force breaking changes, and the time to record.
#[derive(Clone, Copy)]
pub struct ApplyRequest<'a> {
    pub new: &'a Definitions,
    pub origin: &'a Origin,
    pub probe: &'a dyn DataProbe,
    pub force: bool,
    pub now: DateTime<Utc>,
}

impl fmt::Debug for ApplyRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApplyRequest")
            .field("origin", self.origin)
            .field("force", &self.force)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// As [`apply`] of `request`, calling `before_write` with the definitions to record
/// (every live version of every view) after every check has passed and before the
/// registry is written (not at all for a no-op), so that the stores can be
/// prepared first: if it fails, the registry is left as it was. The definitions recorded
/// are [`RegistryDoc::plan_from`]'s: objects another front end defined are kept.
///
/// # Errors
/// As [`apply`], invalid definitions after the merge, and whatever `before_write`
/// returns.
pub fn apply_with(
    registry: &FileRegistry,
    project: &str,
    request: &ApplyRequest<'_>,
    before_write: &mut dyn FnMut(&Definitions) -> Result<()>,
) -> Result<ApplyOutcome> {
    // Load, check and write under one lock: two applies never both read version N and
    // write N + 1 (the second waits and applies on top of the first).
    let _lock = registry.lock(APPLY_LOCK_WAIT)?;
    let doc = registry.load_or_empty(project)?;
    let (new, plan, breaking) = doc.plan_versions(request.new, request.origin, request.probe, request.force)?;
    if plan.is_empty() {
        return Ok(ApplyOutcome { plan, version: doc.version, written: false, forced: Vec::new() });
    }
    new.validate()?;
    new.check_versions()?;
    if let Some(first) = breaking.first()
        && !request.force
    {
        let more = match breaking.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        return Err(Error::Breaking(format!("{first}{more}")));
    }
    let next = doc.applied_from(&new, &plan, request.now, request.force && !breaking.is_empty(), Some(&request.origin.name));
    before_write(&next.definitions)?;
    registry.save(&next)?;
    Ok(ApplyOutcome { plan, version: next.version, written: true, forced: breaking })
}

/// RFC 3339 to the second, as the CLI prints registry times (through the one
/// formatter of instants, [`crate::types::format_instant`]).
pub fn format_time(t: &DateTime<Utc>) -> String {
    crate::types::format_instant(t.timestamp().saturating_mul(1_000_000))
}
