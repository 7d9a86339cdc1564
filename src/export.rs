//! `export`: a training set as shards plus `manifest.json`, rebuildable exactly.
//!
//! The Delta version of every view is pinned when the export starts; the spine is cut
//! into shards of `shard_rows` rows, each joined at the pinned versions
//! ([`historical`] with pinned versions) and written atomically as it is done, so memory holds one shard's
//! result at a time. `manifest.json` records the training-set id (a hash of the
//! registry version, the pinned versions, the spine's content hash and the options),
//! the feature references with their types, the schema, and each shard's rows and
//! SHA-256. Rebuilding from a manifest reads the same versions (time travel) and must
//! give byte-identical shards. An interrupted export resumes after the last complete
//! shard (`_progress.json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use quiver_gpu_join::AsOfKernel;
use quiver_offline::historical::{HistoricalOptions, SpineRows, historical, read_spine, resolve, table_versions};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use quiver_sdk::Definitions;

use crate::Repo;
use crate::error::{Error, Result};

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
}

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// Where the spine came from and what it held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpineInfo {
    pub path: String,
    pub sha256: String,
    pub rows: u64,
}

/// Progress of an export that has not finished.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Progress {
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

fn encode(batch: &RecordBatch, format: ShardFormat) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    match format {
        ShardFormat::Parquet => {
            let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), None)
                .map_err(|e| Error::Parquet { path: PathBuf::from("shard"), source: e })?;
            w.write(batch).map_err(|e| Error::Parquet { path: PathBuf::from("shard"), source: e })?;
            w.close().map_err(|e| Error::Parquet { path: PathBuf::from("shard"), source: e })?;
        }
        ShardFormat::Arrow => {
            let mut w = arrow::ipc::writer::FileWriter::try_new(&mut buf, &batch.schema())?;
            w.write(batch)?;
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

async fn plan(repo: &Repo, spine_path: &Path, options: ExportOptions, pinned: Option<BTreeMap<String, u64>>) -> Result<Plan> {
    if options.shard_rows == 0 {
        return Err(out_err(spine_path, "--shard-rows must be at least 1"));
    }
    let doc = repo.applied()?;
    let registry_version = doc.version;
    let defs = &doc.definitions;
    let service = defs
        .feature_service(&options.service)
        .ok_or_else(|| {
            Error::NotFound(format!(
                "unknown feature service `{}` (known: {})",
                options.service,
                crate::ops::known(defs.feature_services.iter().map(|s| s.name.as_str()))
            ))
        })?;
    let requests = resolve(defs, &service.features)?;
    let views: Vec<_> = requests.iter().map(|r| r.view).collect();
    let delta_versions = match pinned {
        Some(v) => v,
        None => {
            let mut out = BTreeMap::new();
            for (view, version) in table_versions(&repo.config, &views).await? {
                let version = version.ok_or_else(|| {
                    Error::Offline(quiver_offline::Error::Request(format!("feature view `{view}` has no Delta table yet (run `quiver apply`)")))
                })?;
                out.insert(view, version);
            }
            out
        }
    };
    let spine_bytes = std::fs::read(spine_path).map_err(|e| Error::io(spine_path, e))?;
    let key_types: Vec<(String, arrow::datatypes::DataType)> = requests
        .iter()
        .flat_map(|r| defs.join_keys(r.view))
        .map(|k| (k.name.clone(), quiver_offline::schema::key_type(k.dtype)))
        .collect();
    let spine = read_spine(spine_path, &key_types)?;
    let features: Vec<ManifestFeature> = service
        .features
        .iter()
        .map(|r| ManifestFeature {
            reference: r.to_string(),
            column: r.column_name(),
            dtype: defs
                .feature_view(&r.view)
                .and_then(|v| v.feature(&r.feature))
                .map_or_else(String::new, |f| f.dtype.as_str().to_string()),
        })
        .collect();
    let spine_info = SpineInfo {
        path: std::fs::canonicalize(spine_path).unwrap_or_else(|_| spine_path.to_path_buf()).display().to_string(),
        sha256: sha256_hex(&spine_bytes),
        rows: spine.num_rows() as u64,
    };
    // The id: what determines the rows, and nothing else (not paths, not times).
    let identity = serde_json::json!({
        "project": repo.config.project,
        "registry_version": registry_version,
        "delta_versions": delta_versions,
        "spine_sha256": spine_info.sha256,
        "features": service.features.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "options": options,
    });
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
        },
        spine,
        defs: doc.definitions,
    })
}

/// What [`export`] or [`reproduce`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub manifest: Manifest,
    /// Shards that were in the folder but damaged (their bytes no longer matched the
    /// manifest) and were written again.
    pub repaired: Vec<String>,
    /// Shards joined in this run (the rest were already there, intact).
    pub joined: usize,
}

/// Runs the export into `out`. A folder holding this training set already (complete, or
/// an unfinished run) is completed: intact shards stay, damaged or missing ones are
/// joined again. A folder holding anything else is refused before anything is written.
/// With `expected` (a reproduction), every shard is joined again and must hash to the
/// expected shard's SHA-256 before it is written; a file already equal to it is left.
async fn run(
    repo: &Repo,
    plan: Plan,
    out: &Path,
    kernel: &dyn AsOfKernel,
    progress: &(dyn Fn(u64, u64) + Sync),
    expected: Option<&[Shard]>,
) -> Result<Exported> {
    let Plan { mut manifest, spine, defs } = plan;
    let manifest_path = out.join(MANIFEST);
    let progress_path = out.join(PROGRESS);
    let id = manifest.training_set_id.clone();
    // What the folder holds of this training set: shards it listed as finished.
    let listed: Vec<Shard> = if manifest_path.exists() {
        let existing: Manifest = serde_json::from_slice(&std::fs::read(&manifest_path).map_err(|e| Error::io(&manifest_path, e))?)
            .map_err(|e| out_err(&manifest_path, format!("unreadable manifest: {e}")))?;
        if existing.training_set_id != id {
            return Err(out_err(out, format!(
                "holds another training set ({}); export into an empty folder",
                existing.training_set_id
            )));
        }
        if expected.is_none() {
            manifest.schema = existing.schema.clone();
        }
        existing.shards
    } else {
        match std::fs::read(&progress_path) {
            Ok(bytes) => match serde_json::from_slice::<Progress>(&bytes) {
                Ok(p) if p.training_set_id == id => p.shards,
                Ok(p) => {
                    return Err(out_err(out, format!(
                        "holds an unfinished export of another training set ({}); export into an empty folder",
                        p.training_set_id
                    )));
                }
                Err(e) => return Err(out_err(&progress_path, format!("unreadable: {e}"))),
            },
            Err(_) => Vec::new(),
        }
    };
    check_folder(out, &listed)?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    // Finished shards whose files are still intact; the others are damaged.
    let intact = |s: &Shard| std::fs::read(out.join(&s.file)).is_ok_and(|b| sha256_hex(&b) == s.sha256);
    let mut done: Vec<Shard> = Vec::new();
    let mut damaged: Vec<String> = Vec::new();
    for s in listed {
        if intact(&s) {
            done.push(s);
        } else {
            damaged.push(s.file);
        }
    }

    let defs = &defs;
    let service = defs.feature_service(&manifest.options.service).expect("planned");
    let requests = resolve(defs, &service.features)?;
    let n = spine.num_rows() as u64;
    let per = manifest.options.shard_rows;
    let n_shards = n.div_ceil(per).max(1);
    let abort_after: Option<usize> = std::env::var("QUIVER_EXPORT_ABORT_AFTER_SHARDS").ok().and_then(|v| v.parse().ok());
    let mut written_now = 0usize;
    let mut joined_now = 0usize;
    let mut repaired = Vec::new();
    for k in 0..n_shards {
        let file = format!("part-{k:05}.{}", manifest.options.format.extension());
        if expected.is_none() && done.iter().any(|s| s.file == file) {
            progress(k + 1, n_shards);
            continue;
        }
        let start = k * per;
        let len = per.min(n - start.min(n));
        let slice = spine.slice(start as usize, len as usize);
        let joined = historical(
            &repo.config,
            defs,
            SpineRows { source: Path::new(&manifest.spine.path), rows: &slice },
            &requests,
            HistoricalOptions {
                created_cutoff: manifest.options.created_cutoff,
                versions: manifest.delta_versions.clone(),
                ..Default::default()
            },
            kernel,
            &|_, _| {},
        )
        .await?;
        joined_now += 1;
        if manifest.schema.is_empty() {
            manifest.schema = joined.schema().fields().iter().map(|f| (f.name().clone(), f.data_type().to_string())).collect();
        }
        let bytes = encode(&joined, manifest.options.format)?;
        let shard = Shard { file, rows: joined.num_rows() as u64, sha256: sha256_hex(&bytes) };
        if let Some(expected) = expected {
            let Some(want) = expected.iter().find(|s| s.file == shard.file) else {
                return Err(out_err(out, format!("cannot reproduce: {} is not in the manifest (a different number of shards)", shard.file)));
            };
            if *want != shard {
                return Err(out_err(&out.join(&shard.file), format!(
                    "does not reproduce {} (sha256 {} vs {}); nothing written",
                    want.file, shard.sha256, want.sha256
                )));
            }
            done.retain(|s| s.file != shard.file);
            if intact(&shard) {
                done.push(shard);
                progress(k + 1, n_shards);
                continue;
            }
        }
        write_atomic(&out.join(&shard.file), &bytes)?;
        if damaged.contains(&shard.file) {
            repaired.push(shard.file.clone());
        }
        done.push(shard);
        let record = Progress { training_set_id: id.clone(), shards: done.clone() };
        if !manifest_path.exists() {
            write_atomic(&progress_path, &serde_json::to_vec_pretty(&record).expect("progress serialises"))?;
        }
        progress(k + 1, n_shards);
        written_now += 1;
        if abort_after.is_some_and(|a| written_now >= a) {
            eprintln!("aborting after {written_now} shards (QUIVER_EXPORT_ABORT_AFTER_SHARDS)");
            std::process::abort();
        }
    }
    done.sort_by(|a, b| a.file.cmp(&b.file));
    if manifest.schema.is_empty() {
        // Every shard came from an earlier run: read the schema back from the first.
        if let Some(first) = done.first() {
            manifest.schema = shard_schema(&out.join(&first.file), manifest.options.format)?;
        }
    }
    manifest.rows = done.iter().map(|s| s.rows).sum();
    manifest.shards = done;
    write_atomic(&manifest_path, &serde_json::to_vec_pretty(&manifest).expect("manifest serialises"))?;
    let _ = std::fs::remove_file(&progress_path);
    Ok(Exported { manifest, repaired, joined: joined_now })
}

/// Refuses an output folder that holds anything but this training set: its manifest,
/// its progress file, the shards they list, and temp files of an interrupted write
/// (removed). A `part-*` file nothing lists would otherwise be overwritten.
fn check_folder(out: &Path, listed: &[Shard]) -> Result<()> {
    let entries = match std::fs::read_dir(out) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(out_err(out, "is a file, not a folder"));
        }
        Err(e) => return Err(Error::io(out, e)),
    };
    let mut foreign = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        if name == MANIFEST || name == PROGRESS || listed.iter().any(|s| s.file == name) {
            continue;
        }
        foreign.push(name);
    }
    if foreign.is_empty() {
        return Ok(());
    }
    foreign.sort();
    let more = if foreign.len() > 3 { format!(" and {} more", foreign.len() - 3) } else { String::new() };
    Err(out_err(out, format!(
        "is not empty and holds no export of this training set (found {}{more}); export into an empty folder, nothing written",
        foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
    )))
}

fn shard_schema(path: &Path, format: ShardFormat) -> Result<Vec<(String, String)>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let schema = match format {
        ShardFormat::Parquet => parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| Error::Parquet { path: path.to_path_buf(), source: e })?
            .schema()
            .clone(),
        ShardFormat::Arrow => arrow::ipc::reader::FileReader::try_new(file, None)?.schema(),
    };
    Ok(schema.fields().iter().map(|f| (f.name().clone(), f.data_type().to_string())).collect())
}

/// Exports the point-in-time join of `spine` with `options.service` into `out`.
///
/// # Errors
/// Unknown service, a view without a table, an unreadable spine, a folder holding
/// another training set, or a failing join or write; finished shards stay for a resume.
pub async fn export(
    repo: &Repo,
    spine: &Path,
    out: &Path,
    options: ExportOptions,
    kernel: &dyn AsOfKernel,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Exported> {
    let plan = plan(repo, spine, options, None).await?;
    run(repo, plan, out, kernel, progress, None).await
}

/// Rebuilds the training set of `manifest_path` into `out`: the same Delta versions,
/// spine (checked by hash) and options. Every shard is joined again and must match the
/// manifest's SHA-256 before it is written; into the original folder, intact shards
/// are left as they are and damaged ones are written again (reported as repaired).
///
/// # Errors
/// As [`export`], plus a spine that changed, a registry at another version, or a
/// shard that does not reproduce (nothing of it written).
pub async fn reproduce(
    repo: &Repo,
    manifest_path: &Path,
    out: &Path,
    kernel: &dyn AsOfKernel,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Exported> {
    let original: Manifest = serde_json::from_slice(&std::fs::read(manifest_path).map_err(|e| Error::io(manifest_path, e))?)
        .map_err(|e| out_err(manifest_path, format!("unreadable manifest: {e}")))?;
    let spine = PathBuf::from(&original.spine.path);
    let plan = plan(repo, &spine, original.options.clone(), Some(original.delta_versions.clone())).await?;
    if plan.manifest.spine.sha256 != original.spine.sha256 {
        return Err(out_err(&spine, "the spine changed since the export (its SHA-256 differs from the manifest's)"));
    }
    if plan.manifest.training_set_id != original.training_set_id {
        return Err(out_err(manifest_path, format!(
            "cannot reproduce: the registry is at version {}, the export read version {}",
            plan.manifest.registry_version, original.registry_version
        )));
    }
    let rebuilt = run(repo, plan, out, kernel, progress, Some(&original.shards)).await?;
    if original.shards != rebuilt.manifest.shards {
        return Err(out_err(out, format!(
            "{} shards rebuilt, the manifest lists {}",
            rebuilt.manifest.shards.len(),
            original.shards.len()
        )));
    }
    Ok(rebuilt)
}
