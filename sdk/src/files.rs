//! The repository's small files: replaced atomically and durably, and the lock that
//! serialises `apply`.
//!
//! Every small state file Quiver writes (the registry, `.quiver/materialized.json`, an
//! export's `manifest.json`, `_progress.json` and shards, `historical --out`) goes
//! through [`write_atomic`] or [`write_atomic_with`], so a reader or a crash sees the
//! old content or the new, never a part of one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Writes `bytes` to `path` atomically and durably: a temp file in the same folder,
/// fsync, rename over the old file, fsync of the folder (so the rename survives a
/// crash). On error the old file is untouched and the temp file removed.
///
/// # Errors
/// The I/O error of whichever step failed.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("state.json");
/// quiver_sdk::files::write_atomic(&path, b"{}").unwrap();
/// assert_eq!(std::fs::read(&path).unwrap(), b"{}");
/// ```
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// As [`write_atomic`], the content written by `write` into the temp file (a Parquet
/// writer streaming a large batch, say).
///
/// # Errors
/// The I/O error of whichever step failed, `write`'s included.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "file".to_string());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let steps = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        write(&mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    };
    steps().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// An exclusive lock on a file beside the thing it guards (`registry.json.lock`),
/// released when dropped (or when the process dies: it is an OS file lock).
#[derive(Debug)]
pub struct FileLock {
    _file: std::fs::File,
}

impl FileLock {
    /// Takes the lock at `path`, waiting up to `wait` for another holder to let go.
    ///
    /// # Errors
    /// [`std::io::ErrorKind::WouldBlock`] when another process still holds it after
    /// `wait`; other I/O errors when the lock file cannot be opened.
    pub fn acquire(path: &Path, wait: Duration) -> std::io::Result<FileLock> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        let deadline = Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(FileLock { _file: file }),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(std::io::Error::new(std::io::ErrorKind::WouldBlock, "held by another process"));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits_then_gives_up_and_gets_it_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let first = FileLock::acquire(&path, Duration::ZERO).unwrap();
        let err = FileLock::acquire(&path, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
        drop(first);
        FileLock::acquire(&path, Duration::ZERO).unwrap();
    }

    #[test]
    fn replaced_files_leave_no_temp_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(write_atomic(&dir.path().join("missing/s.json"), b"x").is_err());
    }
}
