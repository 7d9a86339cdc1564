//! `quiver init DIR [--demo]`: a new feature repository.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::demo;
use crate::error::{Error, Result};
use crate::repo::DEFINITIONS_FILE;

/// The skeleton `features.yaml` of a new, non-demo repository: valid and empty.
pub const SKELETON_FEATURES: &str = r#"# Feature definitions. `quiver plan` shows what `quiver apply` would change.
#
# entities:
#   - name: driver
#     join_keys: [{name: driver_id, dtype: int64}]      # int64 or string
# feature_views:
#   - name: driver_hourly
#     entities: [driver]
#     ttl: 2h                                           # s, m, h, d; omit or 0 = unbounded
#     online: true
#     source:                                           # default table: <offline root>/<view>
#       timestamp_field: event_timestamp
#       created_timestamp_field: created_timestamp
#     features:
#       - {name: conv_rate, dtype: float64}             # int32 int64 float32 float64 bool
#       - {name: trips, dtype: int64}                   # string bytes timestamp list<float32> ...
# feature_services:
#   - name: ranker_v1
#     features: ["driver_hourly:conv_rate", "driver_hourly:trips"]
entities: []
feature_views: []
feature_services: []
"#;

const GITIGNORE: &[&str] = &["data/", "online.db", "registry.json", "*.lock", "lineage.jsonl", ".quiver/", "*.tmp"];

fn config_yaml(project: &str) -> String {
    format!(
        r#"# Quiver project settings. Every setting can be overridden by an environment variable
# QUIVER_<SECTION>_<KEY>, e.g. QUIVER_ONLINE_STORE_URL; precedence: flag > env > file > default.
project: {project}
registry: registry.json                # relative to this folder
offline_store:
  path: data                           # root of the Delta tables: a folder or an object-store URI
online_store:
  type: embedded                       # embedded | redis | redis_cluster
  path: online.db                      # embedded
  # url: redis://127.0.0.1:6379/0      # redis
  # urls: [redis://10.0.0.1:7000, redis://10.0.0.2:7000]   # redis_cluster: any nodes (seeds)
kafka:
  brokers: 127.0.0.1:9092
server:
  host: 127.0.0.1
  port: 6566
  # auth_token: set QUIVER_SERVER_AUTH_TOKEN instead: this file is meant to be committed
  # max_cells: 1000000                 # entity rows x features per lookup (413 beyond)
  # request_timeout: 10s               # a request's headers, then its body, within this
  # max_connections: 1024
  # stream_metrics: [http://127.0.0.1:9100/metrics]   # quiver stream --metrics-port, for the UI's lag
# max_future_skew: 5m                  # event times later than now + this are refused
"#
    )
}

/// The project name for a folder: its name with anything but letters, digits, `_` and
/// `-` replaced by `_`.
pub fn project_name(dir: &Path) -> String {
    let base = std::path::absolute(dir).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).unwrap_or_default();
    let name: String = base.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    if name.trim_matches('_').is_empty() { "quiver_repo".to_string() } else { name }
}

/// Creates a repository in `dir`: `quiver.yaml`, `features.yaml` and `.gitignore`, and
/// with `demo` the demo definitions and their sample data (timed to end at `now`).
///
/// A new folder is built under a temporary name and renamed into place, so a failure
/// leaves nothing behind. An existing folder is used if it holds no repository yet.
/// Returns the files written.
///
/// # Errors
/// [`Error::Init`] when `dir` already holds `quiver.yaml` or `features.yaml`; I/O errors.
pub fn init(dir: &Path, demo: bool, now: DateTime<Utc>) -> Result<Vec<PathBuf>> {
    let project = project_name(dir);
    if dir.exists() {
        if !dir.is_dir() {
            return Err(Error::Init { path: dir.to_path_buf(), message: "exists and is not a folder".to_string() });
        }
        for name in [crate::sdk::config::CONFIG_FILE, DEFINITIONS_FILE] {
            if dir.join(name).exists() {
                return Err(Error::Init { path: dir.to_path_buf(), message: format!("already holds a repository ({name} exists)") });
            }
        }
        return write_repo(dir, &project, demo, now);
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
    let tmp = parent.join(format!(".{project}.init-{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = write_repo(&tmp, &project, demo, now).and_then(|_| std::fs::rename(&tmp, dir).map_err(|e| Error::io(dir, e)));
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Report the files under their final names.
    let mut files = Vec::new();
    collect_files(dir, &mut files).map_err(|e| Error::io(dir, e))?;
    files.sort();
    Ok(files)
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

fn write_repo(dir: &Path, project: &str, demo: bool, now: DateTime<Utc>) -> Result<Vec<PathBuf>> {
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        Ok(path)
    };
    let mut files = vec![
        write(crate::sdk::config::CONFIG_FILE, &config_yaml(project))?,
        write(DEFINITIONS_FILE, if demo { demo::FEATURES_YAML } else { SKELETON_FEATURES })?,
    ];
    // Keep an existing .gitignore, adding only the lines it lacks.
    let gitignore = dir.join(".gitignore");
    let existing = std::fs::read_to_string(&gitignore).unwrap_or_default();
    let mut text = existing.clone();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    for line in GITIGNORE {
        if !existing.lines().any(|l| l.trim() == *line) {
            text.push_str(line);
            text.push('\n');
        }
    }
    if text != existing {
        std::fs::write(&gitignore, text).map_err(|e| Error::io(&gitignore, e))?;
        files.push(gitignore);
    }
    if demo {
        files.extend(demo::write_sample_data(&dir.join(demo::SAMPLE_DIR), now)?);
    }
    Ok(files)
}
