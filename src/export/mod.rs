//! `export`: a training set as shards plus `manifest.json`, rebuildable exactly.
//!
//! The Delta version of every view is pinned when the export starts; the spine is
//! joined once at the pinned versions ([`join`]) and cut into shards of `shard_rows`
//! rows, each assembled from the join and written atomically as it is due, so memory
//! holds the join's working set and one shard, whatever the number of shards. `manifest.json` records the training-set id (a hash of the
//! definitions read, the pinned versions, the spine's content hash and the options),
//! the feature references with their types, the schema, and each shard's rows and
//! SHA-256. Rebuilding from a manifest reads the same versions (time travel) and must
//! give byte-identical shards. An interrupted export resumes after the last complete
//! shard (`_progress.json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use quiver_gpu_join::AsOfKernel;
use quiver_offline::historical::{HistoricalOptions, MadeSpine, SpineRows, join, read_spine, resolve, table_versions};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::monitor::profile::ProfileDoc;
use quiver_sdk::Definitions;

use crate::Repo;
use crate::error::{Error, Result};
use crate::spine::Spine;

mod folder;
mod profile;
mod read;

use folder::{check_folder, check_reproduces, finish, intact, listed_shards, read_shard};
use profile::TrainingProfile;

/// The file format of the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardFormat {
    Parquet,
    /// Arrow IPC file.
    Arrow,
}

impl ShardFormat {
    fn extension(self) -> &'static str {
        match self {
            ShardFormat::Parquet => "parquet",
            ShardFormat::Arrow => "arrow",
        }
    }
}

/// What to export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportOptions {
    pub service: String,
    pub format: ShardFormat,
    pub shard_rows: u64,
    pub created_cutoff: bool,
    /// Rows per Parquet row group (per record batch of an Arrow file): the blocks the
    /// loader reads and shuffles (docs/export.md#the-pytorch-loader). Absent from
    /// manifests written before it was set: their shards are one group each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_rows: Option<u64>,
}

/// Rows per row group of a new export's shards.
pub const GROUP_ROWS: u64 = 65_536;

/// String columns with more distinct values than this get no vocabulary in the manifest.
pub const VOCABULARY_LIMIT: usize = 100_000;

/// One feature of the training set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFeature {
    /// `view:feature`.
    pub reference: String,
    /// The output column, `view__feature`.
    pub column: String,
    pub dtype: String,
}

/// One written shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub file: String,
    pub rows: u64,
    pub sha256: String,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub training_set_id: String,
    pub project: String,
    pub registry_version: u64,
    pub options: ExportOptions,
    /// The Delta version read of each view's table.
    pub delta_versions: BTreeMap<String, u64>,
    pub spine: SpineInfo,
    pub features: Vec<ManifestFeature>,
    /// Output columns and their Arrow types.
    pub schema: Vec<(String, String)>,
    pub rows: u64,
    pub shards: Vec<Shard>,
    /// Each feature's profile over every row, by `view:feature` (docs/monitoring.md): the
    /// reference `quiver monitor --reference training:DIR` compares with. Absent from
    /// manifests written before profiles were.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profile: BTreeMap<String, ProfileDoc>,
    /// Each string column's distinct values, sorted (those with at most
    /// [`VOCABULARY_LIMIT`]): the loader gives a value as its position here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vocabularies: BTreeMap<String, Vec<String>>,
    /// The definitions the training set read, each one's digest by `kind:name`
    /// (`feature_view:driver_hourly`; docs/export.md#reproducing-a-training-set):
    /// `--reproduce` refuses a change to one of them and to nothing else. Absent from
    /// manifests written before it was: those reproduce at their registry version only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub definitions: BTreeMap<String, String>,
    /// The feature repository's code version when the set was exported (git commit and
    /// dirty flag; docs/lineage.md#provenance), when the repository is in git. Not part
    /// of the id: the same rows from another commit are the same training set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_version: Option<crate::lineage::CodeVersion>,
}

/// Where the spine came from and what it held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpineInfo {
    /// The spine's file; for a made spine, how it was made (`--rows-of labels`).
    pub path: String,
    /// Of the file's bytes; of a made spine's rows as an Arrow IPC stream.
    pub sha256: String,
    pub rows: u64,
    /// How the spine was made from the offline store, when it was (docs/export.md):
    /// `--reproduce` makes it again from the pinned versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<MadeSpine>,
}

/// Progress of an export that has not finished.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Unfinished {
    training_set_id: String,
    shards: Vec<Shard>,
}

const MANIFEST: &str = "manifest.json";
const PROGRESS: &str = "_progress.json";

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn out_err(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::Init { path: path.to_path_buf(), message: message.to_string() }
}

/// Writes `bytes` to `path` atomically and durably ([`quiver_sdk::files::write_atomic`]:
/// temp file, fsync, rename, fsync of the folder), as the registry is written; the
/// facade's one way of replacing a file (shards, manifests, progress, materialization
/// state).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    quiver_sdk::files::write_atomic(path, bytes).map_err(|e| Error::io(path, e))
}

/// The shard's bytes, in groups of `group_rows` rows (`None`: one group, as manifests
/// before groups were written); `path` is where they are going, for errors.
fn encode(path: &Path, batch: &RecordBatch, format: ShardFormat, group_rows: Option<u64>) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let parquet = |error| Error::Parquet { path: path.to_path_buf(), error };
    match format {
        ShardFormat::Parquet => {
            let props = group_rows.map(|g| {
                parquet::file::properties::WriterProperties::builder()
                    .set_max_row_group_row_count(Some(usize::try_from(g).unwrap_or(usize::MAX)))
                    .build()
            });
            let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), props).map_err(parquet)?;
            w.write(batch).map_err(parquet)?;
            w.close().map_err(parquet)?;
        }
        ShardFormat::Arrow => {
            let mut w = arrow::ipc::writer::FileWriter::try_new(&mut buf, &batch.schema())?;
            let step = group_rows.map_or(batch.num_rows(), |g| usize::try_from(g).unwrap_or(usize::MAX)).max(1);
            let mut at = 0;
            loop {
                w.write(&batch.slice(at, step.min(batch.num_rows() - at)))?;
                at += step;
                if at >= batch.num_rows() {
                    break;
                }
            }
            w.finish()?;
        }
    }
    Ok(buf)
}

/// What one export is about, before any shard is written.
struct Plan {
    manifest: Manifest,
    spine: RecordBatch,
    /// The registry's definitions the manifest was made from: every shard joins with
    /// these, even if `apply` runs during the export.
    defs: Definitions,
}

/// What [`export`] plans; `original`, for a reproduction, pins the Delta versions and
/// the id's form (a manifest without `definitions` has the registry version in its id).
async fn plan(repo: &Repo, source: &Spine, options: ExportOptions, original: Option<&Manifest>) -> Result<Plan> {
    let label = source.label();
    if options.shard_rows == 0 {
        return Err(out_err(Path::new(&label), "--shard-rows must be at least 1"));
    }
    let doc = repo.applied()?;
    let registry_version = doc.version;
    let registered = doc.definitions.find_service(&options.service).map_err(|e| Error::NotFound(e.0))?;
    // A reproduction reads the versions the training set read, whatever the service
    // reads now (docs/versions.md#training-sets): its manifest's references, each at the
    // version it names (`view:feature`, as recorded, is version 1).
    let service = match original.filter(|m| !m.features.is_empty()) {
        Some(m) => {
            let mut features = Vec::with_capacity(m.features.len());
            for f in &m.features {
                let r: quiver_sdk::FeatureRef = f
                    .reference
                    .parse()
                    .map_err(|e: quiver_sdk::definitions::BadFeatureRef| out_err(Path::new(&m.spine.path), e.to_string()))?;
                let version = r.version.unwrap_or(quiver_sdk::definitions::FIRST_VERSION);
                features.push(r.at(version));
            }
            quiver_sdk::FeatureService { features, ..registered.clone() }
        }
        None => registered.clone(),
    };
    let service = &service;
    // Each view at the version the service reads (docs/versions.md#references).
    let pinned = crate::ops::pinned(&doc.definitions, &service.features)?;
    let mut owned = pinned.into_owned();
    // The shards join the service as planned here.
    if let Some(slot) = owned.feature_services.iter_mut().find(|s| s.name == service.name) {
        slot.clone_from(service);
    }
    let defs: &Definitions = &owned;
    let requests = resolve(defs, &service.features)?;
    let mut views: Vec<&quiver_sdk::FeatureView> = requests.iter().map(|r| r.view).collect();
    // A `--rows-of` view is read at a pinned version too.
    let rows_of = match source {
        Spine::Made(made) => match made.source_view() {
            Some(name) => Some(defs.find_view(name).map_err(|e| Error::NotFound(format!("--rows-of: {}", e.0)))?),
            None => None,
        },
        Spine::File(_) | Spine::Batch(..) => None,
    };
    if let Some(view) = rows_of
        && !views.iter().any(|v| v.name == view.name)
    {
        views.push(view);
    }
    let definitions = read::definitions_read(defs, service, &requests, rows_of);
    let delta_versions = match original {
        Some(m) => m.delta_versions.clone(),
        None => {
            let mut out = BTreeMap::new();
            for (view, version) in table_versions(&repo.config, &views).await? {
                let version = version.ok_or_else(|| {
                    Error::Offline(quiver_offline::Error::Request(format!(
                        "feature view `{view}` has no Delta table yet (run `quiver apply`)"
                    )))
                })?;
                out.insert(view, version);
            }
            out
        }
    };
    let key_types: Vec<(String, arrow::datatypes::DataType)> = requests.spine_types(defs);
    let (spine, sha256, path) = match source {
        Spine::File(path) => {
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            let spine = read_spine(path, &key_types)?;
            (spine, sha256_hex(&bytes), std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()).display().to_string())
        }
        // Rows in memory have no file to hash and find again: a training set is
        // reproducible only from a file or a made spine.
        Spine::Batch(_, name) => {
            return Err(out_err(Path::new(name), "an export's spine is a file or a made spine (rows in memory cannot be reproduced)"));
        }
        Spine::Made(made) => {
            let joined: Vec<_> = requests.iter().map(|r| r.view).collect();
            let spine = made.make(&repo.config, defs, &joined, &delta_versions).await?;
            (spine.clone(), sha256_hex(&ipc_bytes(&spine)?), label.clone())
        }
    };
    let features: Vec<ManifestFeature> = service
        .features
        .iter()
        .map(|r| ManifestFeature {
            reference: defs.as_read(r).to_string(),
            column: r.column_name(),
            dtype: defs.feature_dtype(r).map_or_else(String::new, |t| t.as_str().to_string()),
        })
        .collect();
    let made = match source {
        Spine::Made(m) => Some(m.clone()),
        Spine::File(_) | Spine::Batch(..) => None,
    };
    let spine_info = SpineInfo { path, sha256, rows: spine.num_rows() as u64, made };
    // The id: what determines the rows, and nothing else (not paths, not times, not
    // definitions the training set does not read). Manifests written before
    // `definitions` was recorded have the registry's version in their id instead.
    let mut identity = serde_json::json!({
        "project": repo.config.project,
        "delta_versions": delta_versions,
        "spine_sha256": spine_info.sha256,
        "features": service.features.iter().map(|r| defs.as_read(r).to_string()).collect::<Vec<_>>(),
        "options": options,
    });
    if original.is_some_and(|m| m.definitions.is_empty()) {
        identity["registry_version"] = registry_version.into();
    } else {
        identity["definitions"] = serde_json::to_value(&definitions).expect("a map of strings");
    }
    let training_set_id = sha256_hex(identity.to_string().as_bytes())[..32].to_string();
    Ok(Plan {
        manifest: Manifest {
            format_version: 1,
            training_set_id,
            project: repo.config.project.clone(),
            registry_version,
            options,
            delta_versions,
            spine: spine_info,
            features,
            schema: Vec::new(),
            rows: 0,
            shards: Vec::new(),
            profile: BTreeMap::new(),
            vocabularies: BTreeMap::new(),
            definitions,
            code_version: crate::lineage::CodeVersion::of(&repo.config.repo),
        },
        spine,
        defs: owned.clone(),
    })
}

/// A made spine's rows as an Arrow IPC stream: what its SHA-256 is of.
fn ipc_bytes(spine: &RecordBatch) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &spine.schema())?;
    w.write(spine)?;
    w.finish()?;
    drop(w);
    Ok(buf)
}

/// What [`export`] or [`reproduce`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub manifest: Manifest,
    /// Shards that were in the folder but damaged (their bytes no longer matched the
    /// manifest) and were written again.
    pub repaired: Vec<String>,
    /// Shards assembled from this run's join (the rest were already there, intact).
    pub joined: usize,
}

/// What joins an export's shards: a kernel in this process, or a Ballista cluster
/// (`df://HOST:PORT`, docs/settings.md) whose executors run the same join.
#[derive(Clone, Copy)]
pub struct Joiner<'a> {
    pub kernel: &'a dyn AsOfKernel,
    pub cluster: Option<&'a str>,
}

impl std::fmt::Debug for Joiner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joiner").field("kernel", &self.kernel.name()).field("cluster", &self.cluster).finish()
    }
}

/// What the caller hears of an export as it goes.
#[derive(Clone, Copy)]
pub struct Hooks<'h> {
    /// Called with the shards done so far (written now, or found intact) and their count.
    pub progress: &'h (dyn Fn(u64, u64) + Sync),
    /// An injected fault: called with the number of shards this run wrote, after each
    /// one's file and progress record are in place (a crash test aborts the process there).
    pub shard_written: &'h (dyn Fn(usize) + Sync),
}

impl std::fmt::Debug for Hooks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

impl Default for Hooks<'_> {
    fn default() -> Self {
        Hooks { progress: &|_, _| {}, shard_written: &|_| {} }
    }
}

/// Runs the export into `out`. A folder holding this training set already (complete, or
/// an unfinished run) is completed: intact shards stay, damaged or missing ones are
/// joined again. A folder holding anything else is refused before anything is written.
/// With `expected` (a reproduction), every shard is joined again and must hash to the
/// expected shard's SHA-256 before it is written; a file already equal to it is left.
async fn run(repo: &Repo, plan: Plan, out: &Path, joiner: Joiner<'_>, hooks: Hooks<'_>, expected: Option<&[Shard]>) -> Result<Exported> {
    let Plan { mut manifest, spine, defs } = plan;
    let progress_path = out.join(PROGRESS);
    let listed = listed_shards(out, &mut manifest, expected.is_some())?;
    check_folder(out, &listed)?;
    let service = defs.feature_service(&manifest.options.service).expect("planned");
    let requests = resolve(&defs, &service.features)?;
    // Every column the join reads is there, before any folder is made.
    requests.check_spine(&defs, SpineRows { source: &manifest.spine.path, rows: &spine })?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    // Finished shards whose files are still intact; the others are damaged.
    let (mut done, damaged): (Vec<Shard>, Vec<Shard>) = listed.into_iter().partition(|s| intact(out, s));
    let n = spine.num_rows() as u64;
    let per = manifest.options.shard_rows;
    let n_shards = n.div_ceil(per).max(1);
    let (mut written_now, mut joined_now, mut repaired) = (0usize, 0usize, Vec::new());
    // A reproduction keeps the manifest's profile (the sketches are randomized); a
    // finished export found again keeps its own.
    let mut profiles = (expected.is_none() && (manifest.profile.is_empty() || done.len() as u64 != n_shards))
        .then(|| TrainingProfile::new(&defs, &manifest.features));
    let file_of = |k: u64| format!("part-{k:05}.{}", manifest.options.format.extension());
    // One join for every shard still to write (none when all are there, intact).
    let due = expected.is_some() || (0..n_shards).any(|k| !done.iter().any(|s| s.file == file_of(k)));
    let options = HistoricalOptions {
        created_cutoff: manifest.options.created_cutoff,
        versions: manifest.delta_versions.clone(),
        cluster: joiner.cluster.map(str::to_string),
        ..Default::default()
    };
    let rows = SpineRows { source: &manifest.spine.path, rows: &spine };
    let joined = if due { Some(join(&repo.config, &defs, rows, &requests, options, joiner.kernel, &|_, _| {}).await?) } else { None };
    for k in 0..n_shards {
        let file = file_of(k);
        if expected.is_none() && done.iter().any(|s| s.file == file) {
            if let Some(p) = profiles.as_mut() {
                for batch in read_shard(&out.join(&file), manifest.options.format)? {
                    p.add(&batch);
                }
            }
            (hooks.progress)(k + 1, n_shards);
            continue;
        }
        let start = (k * per).min(n);
        let end = (start + per).min(n);
        let joined = joined.as_ref().expect("joined when a shard is due").rows(start as usize..end as usize)?;
        joined_now += 1;
        if manifest.schema.is_empty() {
            manifest.schema = joined.schema().fields().iter().map(|f| (f.name().clone(), f.data_type().to_string())).collect();
        }
        let bytes = encode(&out.join(&file), &joined, manifest.options.format, manifest.options.group_rows)?;
        if let Some(p) = profiles.as_mut() {
            p.add(&joined);
        }
        let shard = Shard { file, rows: joined.num_rows() as u64, sha256: sha256_hex(&bytes) };
        if let Some(expected) = expected {
            check_reproduces(out, expected, &shard)?;
            done.retain(|s| s.file != shard.file);
            if intact(out, &shard) {
                done.push(shard);
                (hooks.progress)(k + 1, n_shards);
                continue;
            }
        }
        write_atomic(&out.join(&shard.file), &bytes)?;
        if damaged.iter().any(|s| s.file == shard.file) {
            repaired.push(shard.file.clone());
        }
        done.push(shard);
        if !out.join(MANIFEST).exists() {
            let record = Unfinished { training_set_id: manifest.training_set_id.clone(), shards: done.clone() };
            write_atomic(&progress_path, &serde_json::to_vec_pretty(&record).expect("progress serialises"))?;
        }
        (hooks.progress)(k + 1, n_shards);
        written_now += 1;
        (hooks.shard_written)(written_now);
    }
    if let Some(p) = profiles {
        (manifest.profile, manifest.vocabularies) = p.finish();
    }
    let manifest = finish(out, manifest, done)?;
    Ok(Exported { manifest, repaired, joined: joined_now })
}

/// Exports the point-in-time join of `spine` with `options.service` into `out`.
///
/// # Errors
/// Unknown service, a view without a table, an unreadable spine, a folder holding
/// another training set, or a failing join or write; finished shards stay for a resume.
pub async fn export(
    repo: &Repo,
    spine: &Spine,
    out: &Path,
    options: ExportOptions,
    joiner: Joiner<'_>,
    hooks: Hooks<'_>,
) -> Result<Exported> {
    let plan = plan(repo, spine, options, None).await?;
    run(repo, plan, out, joiner, hooks, None).await
}

/// Rebuilds the training set of `manifest_path` into `out`: the same Delta versions,
/// spine (checked by hash) and options. Every shard is joined again and must match the
/// manifest's SHA-256 before it is written; into the original folder, intact shards
/// are left as they are and damaged ones are written again (reported as repaired).
///
/// # Errors
/// As [`export`], plus a spine that changed, a definition the export read that changed
/// since (each named; for a manifest without `definitions`, a registry at another
/// version), or a shard that does not reproduce (nothing of it written).
pub async fn reproduce(repo: &Repo, manifest_path: &Path, out: &Path, joiner: Joiner<'_>, hooks: Hooks<'_>) -> Result<Exported> {
    let original: Manifest = serde_json::from_slice(&std::fs::read(manifest_path).map_err(|e| Error::io(manifest_path, e))?)
        .map_err(|e| out_err(manifest_path, format!("unreadable manifest: {e}")))?;
    let spine = match &original.spine.made {
        Some(made) => Spine::Made(made.clone()),
        None => Spine::File(PathBuf::from(&original.spine.path)),
    };
    let plan = plan(repo, &spine, original.options.clone(), Some(&original)).await?;
    if plan.manifest.spine.sha256 != original.spine.sha256 {
        return Err(out_err(
            Path::new(&original.spine.path),
            "the spine changed since the export (its SHA-256 differs from the manifest's)",
        ));
    }
    let changed = read::changed(&original.definitions, &plan.manifest.definitions);
    if !original.definitions.is_empty() && !changed.is_empty() {
        return Err(out_err(
            manifest_path,
            format!(
                "cannot reproduce: {} changed since the export read {} (registry version {} then, {} now)",
                changed.join(", "),
                if changed.len() == 1 { "it" } else { "them" },
                original.registry_version,
                plan.manifest.registry_version
            ),
        ));
    }
    if plan.manifest.training_set_id != original.training_set_id {
        let why = if original.definitions.is_empty() {
            // A manifest from before `definitions`: its id holds the registry version.
            format!("the registry is at version {}, the export read version {}", plan.manifest.registry_version, original.registry_version)
        } else {
            format!("its id is {}, the manifest's {}", plan.manifest.training_set_id, original.training_set_id)
        };
        return Err(out_err(manifest_path, format!("cannot reproduce: {why}")));
    }
    let mut plan = plan;
    plan.manifest.profile = original.profile.clone();
    plan.manifest.vocabularies = original.vocabularies.clone();
    let rebuilt = run(repo, plan, out, joiner, hooks, Some(&original.shards)).await?;
    if original.shards != rebuilt.manifest.shards {
        return Err(out_err(
            out,
            format!("{} shards rebuilt, the manifest lists {}", rebuilt.manifest.shards.len(), original.shards.len()),
        ));
    }
    Ok(rebuilt)
}
