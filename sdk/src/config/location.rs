//! Where Delta tables live: a local folder, or an object-store URI with the options
//! (`offline_store.storage_options`) that reach it.

use std::path::{Path, PathBuf};

/// Where the offline Delta tables live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A local folder (absolute; relative paths are taken from the repository).
    Local(PathBuf),
    /// An object-store URI such as `s3://bucket/prefix`, with the options that reach it.
    Uri(String, StorageOptions),
}

/// `offline_store.storage_options`: settings for the object store of every `s3://`
/// (`gs://`, `az://`, ...) table, passed to deltalake and object_store unchanged
/// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...). Shown by key only: values
/// may be secrets.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StorageOptions(std::sync::Arc<std::collections::BTreeMap<String, String>>);

impl StorageOptions {
    pub fn new(options: impl IntoIterator<Item = (String, String)>) -> StorageOptions {
        StorageOptions(std::sync::Arc::new(options.into_iter().collect()))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter()
    }

    pub fn to_map(&self) -> std::collections::HashMap<String, String> {
        self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl std::fmt::Debug for StorageOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl StoreLocation {
    /// The location of `name` under this root.
    pub fn join(&self, name: &str) -> StoreLocation {
        match self {
            StoreLocation::Local(p) => StoreLocation::Local(p.join(name)),
            StoreLocation::Uri(u, o) => StoreLocation::Uri(format!("{}/{name}", u.trim_end_matches('/')), o.clone()),
        }
    }

    /// The sibling location whose last part has `suffix` appended (`t` -> `t.v2`).
    pub fn suffixed(&self, suffix: &str) -> StoreLocation {
        match self {
            StoreLocation::Local(p) => {
                let mut text = p.as_os_str().to_os_string();
                if text.to_string_lossy().ends_with('/') {
                    text = p.components().as_path().as_os_str().to_os_string();
                }
                text.push(suffix);
                StoreLocation::Local(PathBuf::from(text))
            }
            StoreLocation::Uri(u, o) => StoreLocation::Uri(format!("{}{suffix}", u.trim_end_matches('/')), o.clone()),
        }
    }

    /// A folder (relative ones taken from `repo`) or, with a `scheme://`, an object-store
    /// URI reached with `options`.
    pub fn parse(repo: &Path, text: &str, options: &StorageOptions) -> StoreLocation {
        if text.contains("://") { StoreLocation::Uri(text.to_string(), options.clone()) } else { StoreLocation::Local(repo.join(text)) }
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::Local(p) => write!(f, "{}", p.display()),
            StoreLocation::Uri(u, _) => f.write_str(u),
        }
    }
}
