//! Stored reports: one JSON file per run of `verify` or `monitor`, under the repository's
//! `.quiver/verify/` and `.quiver/monitor/`, named so that listing order is run order.
//! The commands store them, the web UI lists them (docs/ui.md); one typed store and
//! one typed list for both.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// A report kept one file per run.
pub(crate) trait Report: Serialize + DeserializeOwned {
    /// Its folder, relative to the repository.
    const DIR: &'static str;
    /// Its file's name in [`Report::DIR`]: it starts with the run's time, so names sort
    /// in run order.
    fn file_name(&self) -> String;
}

/// Writes `report` into its folder, atomically; returns the path.
///
/// # Errors
/// When the folder or the file cannot be written.
pub(crate) fn store<R: Report>(repo_dir: &Path, report: &R) -> Result<PathBuf> {
    let dir = repo_dir.join(R::DIR);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let path = dir.join(report.file_name());
    crate::export::write_atomic(&path, &serde_json::to_vec_pretty(report).expect("a report serialises"))?;
    Ok(path)
}

/// The stored reports, oldest first; a file that cannot be read as one is skipped,
/// never the list's failure. Empty when the folder does not exist.
///
/// # Errors
/// When the folder exists and cannot be listed.
pub(crate) fn list<R: Report>(repo_dir: &Path) -> Result<Vec<R>> {
    let dir = repo_dir.join(R::DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&dir, e)),
    };
    let mut paths: Vec<PathBuf> =
        entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    paths.sort();
    Ok(paths.iter().filter_map(|p| serde_json::from_slice(&std::fs::read(p).ok()?).ok()).collect())
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::{Report, list, store};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Run {
        at: u32,
    }

    impl Report for Run {
        const DIR: &'static str = ".quiver/runs";
        fn file_name(&self) -> String {
            format!("{:04}.json", self.at)
        }
    }

    #[test]
    fn reports_list_in_run_order_and_unreadable_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        assert!(list::<Run>(dir.path()).unwrap().is_empty(), "no folder: no reports");
        for at in [20, 3, 100] {
            store(dir.path(), &Run { at }).unwrap();
        }
        std::fs::write(dir.path().join(".quiver/runs/0050.json"), "{not json").unwrap();
        std::fs::write(dir.path().join(".quiver/runs/notes.txt"), "x").unwrap();
        assert_eq!(list::<Run>(dir.path()).unwrap(), [Run { at: 3 }, Run { at: 20 }, Run { at: 100 }]);
    }
}
