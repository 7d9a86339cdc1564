//! The export's folder: its shards, manifest and progress record on disk.

use std::path::Path;

use arrow::array::RecordBatch;

use super::{MANIFEST, Manifest, PROGRESS, Shard, ShardFormat, Unfinished, out_err, sha256_hex, write_atomic};
use crate::error::{Error, Result};

/// A written shard's rows.
pub(super) fn read_shard(path: &Path, format: ShardFormat) -> Result<Vec<RecordBatch>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    match format {
        ShardFormat::Parquet => parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| Error::Parquet { path: path.to_path_buf(), error: e })?
            .map(|b| b.map_err(Error::from))
            .collect(),
        ShardFormat::Arrow => arrow::ipc::reader::FileReader::try_new(file, None)?.map(|b| b.map_err(Error::from)).collect(),
    }
}

/// Whether the shard's file in `out` is there with the content it records.
pub(super) fn intact(out: &Path, shard: &Shard) -> bool {
    std::fs::read(out.join(&shard.file)).is_ok_and(|b| sha256_hex(&b) == shard.sha256)
}

/// The shards `out` lists as finished for this training set: its manifest's, or an
/// unfinished run's progress record's. A folder of another training set is refused.
/// An export (not a reproduction) takes the schema of a manifest already there.
pub(super) fn listed_shards(out: &Path, manifest: &mut Manifest, reproducing: bool) -> Result<Vec<Shard>> {
    let (manifest_path, progress_path) = (out.join(MANIFEST), out.join(PROGRESS));
    let id = &manifest.training_set_id;
    if manifest_path.exists() {
        let existing: Manifest = serde_json::from_slice(&std::fs::read(&manifest_path).map_err(|e| Error::io(&manifest_path, e))?)
            .map_err(|e| out_err(&manifest_path, format!("unreadable manifest: {e}")))?;
        if existing.training_set_id != *id {
            return Err(out_err(out, format!("holds another training set ({}); export into an empty folder", existing.training_set_id)));
        }
        if !reproducing {
            manifest.schema = existing.schema.clone();
            manifest.profile = existing.profile;
            manifest.vocabularies = existing.vocabularies;
        }
        return Ok(existing.shards);
    }
    match std::fs::read(&progress_path) {
        Ok(bytes) => match serde_json::from_slice::<Unfinished>(&bytes) {
            Ok(p) if p.training_set_id == *id => Ok(p.shards),
            Ok(p) => Err(out_err(
                out,
                format!("holds an unfinished export of another training set ({}); export into an empty folder", p.training_set_id),
            )),
            Err(e) => Err(out_err(&progress_path, format!("unreadable: {e}"))),
        },
        Err(_) => Ok(Vec::new()),
    }
}

/// A reproduction's shard must be the manifest's, byte for byte (by SHA-256).
pub(super) fn check_reproduces(out: &Path, expected: &[Shard], shard: &Shard) -> Result<()> {
    let Some(want) = expected.iter().find(|s| s.file == shard.file) else {
        return Err(out_err(out, format!("cannot reproduce: {} is not in the manifest (a different number of shards)", shard.file)));
    };
    if want != shard {
        return Err(out_err(
            &out.join(&shard.file),
            format!("does not reproduce {} (sha256 {} vs {}); nothing written", want.file, shard.sha256, want.sha256),
        ));
    }
    Ok(())
}

/// Writes the manifest of the finished shards (and drops the progress record).
pub(super) fn finish(out: &Path, mut manifest: Manifest, mut done: Vec<Shard>) -> Result<Manifest> {
    done.sort_by(|a, b| a.file.cmp(&b.file));
    if manifest.schema.is_empty() {
        // Every shard came from an earlier run: read the schema back from the first.
        if let Some(first) = done.first() {
            manifest.schema = shard_schema(&out.join(&first.file), manifest.options.format)?;
        }
    }
    manifest.rows = done.iter().map(|s| s.rows).sum();
    manifest.shards = done;
    write_atomic(&out.join(MANIFEST), &serde_json::to_vec_pretty(&manifest).expect("manifest serialises"))?;
    let _ = std::fs::remove_file(out.join(PROGRESS));
    Ok(manifest)
}

pub(super) fn check_folder(out: &Path, listed: &[Shard]) -> Result<()> {
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
    Err(out_err(
        out,
        format!(
            "is not empty and holds no export of this training set (found {}{more}); export into an empty folder, nothing written",
            foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ),
    ))
}

pub(super) fn shard_schema(path: &Path, format: ShardFormat) -> Result<Vec<(String, String)>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let schema = match format {
        ShardFormat::Parquet => parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| Error::Parquet { path: path.to_path_buf(), error: e })?
            .schema()
            .clone(),
        ShardFormat::Arrow => arrow::ipc::reader::FileReader::try_new(file, None)?.schema(),
    };
    Ok(schema.fields().iter().map(|f| (f.name().clone(), f.data_type().to_string())).collect())
}
