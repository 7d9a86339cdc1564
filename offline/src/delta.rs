//! Opening the views' Delta tables, local or at an object-store URI.

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::{DeltaTable, DeltaTableError};
use quiver_sdk::config::{Config, StoreLocation};
use quiver_sdk::{DataProbe, FeatureView};
use url::Url;

use crate::error::{Error, Result};

/// The URL deltalake opens for a location; local folders become absolute `file://` URLs.
///
/// # Errors
/// [`Error::Location`] for a path or URI that is not a valid URL.
pub fn table_url(location: &StoreLocation) -> Result<Url> {
    let bad = |message: String| Error::Location { table: location.to_string(), message };
    match location {
        StoreLocation::Local(path) => {
            let abs = std::path::absolute(path).map_err(|e| bad(e.to_string()))?;
            Url::from_directory_path(&abs).map_err(|()| bad("not an absolute path".to_string()))
        }
        StoreLocation::Uri(uri, _) => Url::parse(uri).map_err(|e| bad(e.to_string())),
    }
}

/// The storage options deltalake opens a location with (none for a local folder).
fn options(location: &StoreLocation) -> HashMap<String, String> {
    match location {
        StoreLocation::Local(_) => HashMap::new(),
        StoreLocation::Uri(_, options) => options.to_map(),
    }
}

/// The URL schemes of the object stores compiled in (object_store's `aws`, `gcp` and
/// `azure`), beside deltalake's own `file://` and `memory://`.
const CLOUD_SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss"];

/// Registers the object stores with deltalake, once per process: deltalake without its
/// `s3`/`gcs`/`azure` features knows only local files. Commits go through deltalake's
/// default log store, which writes each log entry with a conditional put
/// (`If-None-Match: *` on S3): of two writers racing for a version one wins, the other
/// gets "version already exists" and its append starts over on the new snapshot
/// (`ingest`'s commit loop). No DynamoDB lock table is needed on stores that honour
/// conditional puts (S3 since 2024, MinIO, moto, GCS, Azure).
fn register_object_stores() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let stores = deltalake::logstore::object_store_factories();
        let logs = deltalake::logstore::logstore_factories();
        for scheme in CLOUD_SCHEMES {
            let url = Url::parse(&format!("{scheme}://")).expect("a scheme URL");
            stores.insert(url.clone(), Arc::new(CloudStores));
            logs.insert(url, Arc::new(CloudStores));
        }
    });
}

/// object_store's S3, GCS and Azure clients for deltalake.
struct CloudStores;

impl deltalake::logstore::ObjectStoreFactory for CloudStores {
    fn parse_url_opts(
        &self,
        url: &Url,
        config: &deltalake::logstore::StorageConfig,
    ) -> deltalake::DeltaResult<(deltalake::logstore::ObjectStoreRef, object_store::path::Path)> {
        // Options deltalake took for itself (retries, limits, its IO runtime) are not the
        // client's; every other one must be, or it is a typo worth an error.
        let ours = |key: &str| !config.unknown_properties.contains_key(key);
        // Settings, not a store that failed: the kind the offline error reports (Invalid).
        let unknown = |key: &str| {
            DeltaTableError::InvalidTableLocation(format!(
                "offline_store.storage_options: `{key}` is not a setting of the {} object store",
                url.scheme()
            ))
        };
        let mut options: Vec<(&String, &String)> = config.raw.iter().collect();
        options.sort();
        // Each option goes to the client that knows it, or is deltalake's, or is refused.
        fn configure<B, K: std::str::FromStr>(
            mut builder: B,
            options: &[(&String, &String)],
            ours: impl Fn(&str) -> bool,
            unknown: impl Fn(&str) -> DeltaTableError,
            set: impl Fn(B, K, &String) -> B,
        ) -> deltalake::DeltaResult<B> {
            for (k, v) in options {
                match k.to_ascii_lowercase().parse::<K>() {
                    Ok(key) => builder = set(builder, key, v),
                    Err(_) if ours(k) => {}
                    Err(_) => return Err(unknown(k)),
                }
            }
            Ok(builder)
        }
        let store: deltalake::logstore::ObjectStoreRef = match url.scheme() {
            "s3" | "s3a" => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
                let b = AmazonS3Builder::from_env().with_url(url.as_str());
                Arc::new(configure(b, &options, ours, unknown, |b, k: AmazonS3ConfigKey, v| b.with_config(k, v))?.build()?)
            }
            "gs" => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
                let b = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
                Arc::new(configure(b, &options, ours, unknown, |b, k: GoogleConfigKey, v| b.with_config(k, v))?.build()?)
            }
            _ => {
                use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
                let b = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
                Arc::new(configure(b, &options, ours, unknown, |b, k: AzureConfigKey, v| b.with_config(k, v))?.build()?)
            }
        };
        let path = object_store::path::Path::from_url_path(url.path())?;
        Ok((store, path))
    }
}

impl deltalake::logstore::LogStoreFactory for CloudStores {
    fn with_options(
        &self,
        prefixed_store: deltalake::logstore::ObjectStoreRef,
        root_store: deltalake::logstore::ObjectStoreRef,
        location: &Url,
        options: &deltalake::logstore::StorageConfig,
    ) -> deltalake::DeltaResult<Arc<dyn deltalake::logstore::LogStore>> {
        Ok(deltalake::logstore::default_logstore(prefixed_store, root_store, location, options))
    }
}

/// The table at `location`, loaded at its latest version, or `None` when no Delta table
/// is there yet.
///
/// # Errors
/// [`Error::Delta`] when a table is there but cannot be read.
pub async fn open_table(location: &StoreLocation) -> Result<Option<DeltaTable>> {
    if let StoreLocation::Local(path) = location
        && !path.join("_delta_log").is_dir()
    {
        return Ok(None);
    }
    register_object_stores();
    let url = table_url(location)?;
    match deltalake::open_table_with_storage_options(url, options(location)).await {
        Ok(table) => Ok(Some(table)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(source) => Err(Error::delta(location, source)),
    }
}

/// The object store a table location lives in, as deltalake reaches it (prefixed to
/// the location): what the table's files and log entries are read and written through.
///
/// # Errors
/// [`Error::Location`] for a location that is not a valid URL, [`Error::Delta`] for one
/// no compiled-in store serves or options it refuses.
pub fn object_store(location: &StoreLocation) -> Result<Arc<dyn object_store::ObjectStore>> {
    register_object_stores();
    let url = table_url(location)?;
    deltalake::logstore::store_for(&url, options(location)).map_err(|e| Error::delta(location, e))
}

/// Deletes the table at `location`, every file of it (`quiver retire --delete-data`);
/// a table that is not there is no error. Returns how many files went (a local folder
/// counts as one).
///
/// # Errors
/// [`Error::Location`] when a file cannot be listed or deleted.
pub async fn delete_table(location: &StoreLocation) -> Result<u64> {
    let failed = |message: String| Error::Location { table: location.to_string(), message };
    if let StoreLocation::Local(path) = location {
        return match std::fs::remove_dir_all(path) {
            Ok(()) => Ok(1),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(failed(format!("cannot delete {}: {e}", path.display()))),
        };
    }
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    let store = object_store(location)?;
    let files: Vec<object_store::path::Path> =
        store.list(None).map_ok(|m| m.location).try_collect().await.map_err(|e| failed(format!("cannot list the table's files: {e}")))?;
    for file in &files {
        store.delete(file).await.map_err(|e| failed(format!("cannot delete {file}: {e}")))?;
    }
    Ok(files.len() as u64)
}

/// When each version of the table at `location` was committed: its log entry's
/// last-modified time (UTC microseconds), the moment the version became readable — what
/// `verify --since --as-arrived` counts a row's arrival from (docs/consistency.md). Empty
/// when there is no table.
///
/// # Errors
/// [`Error::Location`] when the log cannot be listed.
pub async fn commit_times(location: &StoreLocation) -> Result<HashMap<u64, i64>> {
    use futures::TryStreamExt;
    let store = object_store(location)?;
    let log = object_store::path::Path::from("_delta_log");
    let entries: Vec<object_store::ObjectMeta> = match store.list(Some(&log)).try_collect().await {
        Ok(entries) => entries,
        Err(object_store::Error::NotFound { .. }) => return Ok(HashMap::new()),
        Err(e) => return Err(Error::Location { table: location.to_string(), message: format!("cannot list the table's log: {e}") }),
    };
    Ok(entries
        .into_iter()
        .filter_map(|m| {
            let name = m.location.filename()?;
            let version = name.strip_suffix(".json").filter(|v| v.len() == 20)?.parse::<u64>().ok()?;
            Some((version, m.last_modified.timestamp_micros()))
        })
        .collect())
}

/// The log entry of `version` of the table at `location`, as stored (`None`: not there,
/// or no longer).
///
/// # Errors
/// [`Error::Location`] when it cannot be read.
pub async fn log_entry(location: &StoreLocation, version: u64) -> Result<Option<Vec<u8>>> {
    use object_store::ObjectStoreExt;
    let store = object_store(location)?;
    let path = object_store::path::Path::from(format!("_delta_log/{version:020}.json"));
    let bytes = match store.get(&path).await {
        Ok(got) => got.bytes().await,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => Err(e),
    };
    let bytes =
        bytes.map_err(|e| Error::Location { table: location.to_string(), message: format!("cannot read log entry {version}: {e}") })?;
    Ok(Some(bytes.to_vec()))
}

/// The `txn` application id of a push's commit whose rows the pushing server writes
/// online next: a server killed in between leaves them owed, and the next server to
/// start writes them (docs/online.md#push-when-the-online-store-fails).
pub const OWES_ONLINE: &str = "quiver-push-owes-online";

/// Whether a log entry is a push's commit whose rows were owed to the online store
/// ([`OWES_ONLINE`]).
pub fn owes_online(entry: &[u8]) -> bool {
    entry.split(|&b| b == b'\n').any(|line| {
        serde_json::from_slice::<serde_json::Value>(line)
            .is_ok_and(|action| action.get("txn").and_then(|t| t.get("appId")).and_then(|a| a.as_str()) == Some(OWES_ONLINE))
    })
}

/// Whether a log entry removes a file: its commit was not only appends (a rewrite, a
/// delete, an overwrite).
pub fn removes_files(entry: &[u8]) -> bool {
    entry
        .split(|&b| b == b'\n')
        .any(|line| serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|action| action.get("remove").is_some()))
}

/// The data files a log entry adds (paths relative to the table, as the log writes
/// them); `None` when one carries a deletion vector (its rows are not the file's).
pub fn added_files(entry: &[u8]) -> Option<Vec<String>> {
    let mut files = Vec::new();
    for line in entry.split(|&b| b == b'\n') {
        let Ok(action) = serde_json::from_slice::<serde_json::Value>(line) else { continue };
        let Some(add) = action.get("add") else { continue };
        if add.get("deletionVector").is_some_and(|dv| !dv.is_null()) {
            return None;
        }
        files.push(add.get("path")?.as_str()?.to_string());
    }
    Some(files)
}

/// Whether the table at `location` exists and holds at least one data file.
///
/// # Errors
/// As [`open_table`].
pub async fn holds_data(location: &StoreLocation) -> Result<bool> {
    let Some(table) = open_table(location).await? else {
        return Ok(false);
    };
    let snapshot = table.snapshot().map_err(|source| Error::delta(location, source))?;
    Ok(snapshot.log_data().num_files() > 0)
}

/// Tells `apply` which views hold data, by looking at their Delta tables.
#[derive(Debug)]
pub struct DeltaProbe<'a> {
    config: &'a Config,
    runtime: tokio::runtime::Handle,
}

impl<'a> DeltaProbe<'a> {
    /// A probe that runs its reads on `runtime`; call it from outside that runtime.
    pub fn new(config: &'a Config, runtime: tokio::runtime::Handle) -> Self {
        DeltaProbe { config, runtime }
    }
}

impl DataProbe for DeltaProbe<'_> {
    fn holds_data(&self, view: &FeatureView) -> quiver_sdk::Result<bool> {
        let location = self.config.view_table(view);
        self.runtime
            .block_on(holds_data(&location))
            .map_err(|e| quiver_sdk::Error::Store(e.kind(), format!("cannot tell whether feature view `{}` holds data: {e}", view.name)))
    }
}

/// Creates the table at `location` with `schema` if no table is there yet. Returns
/// whether it created one.
///
/// # Errors
/// [`Error::Delta`] when the table cannot be created.
pub async fn ensure_table(location: &StoreLocation, schema: &arrow::datatypes::SchemaRef, name: &str) -> Result<bool> {
    use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
    if open_table(location).await?.is_some() {
        return Ok(false);
    }
    if let StoreLocation::Local(path) = location {
        std::fs::create_dir_all(path).map_err(|e| Error::Location { table: location.to_string(), message: e.to_string() })?;
    }
    let delta_schema: deltalake::kernel::StructType =
        schema.as_ref().try_into_kernel().map_err(|e: arrow::error::ArrowError| Error::delta(location, e.into()))?;
    let url = table_url(location)?;
    // Build without loading: there is no log yet, and loading would only log an error.
    deltalake::DeltaTableBuilder::from_url(url)
        .and_then(|b| b.with_storage_options(options(location)).build())
        .map_err(|e| Error::delta(location, e))?
        .create()
        .with_table_name(name)
        .with_columns(delta_schema.fields().cloned())
        .await
        .map_err(|e| Error::delta(location, e))?;
    Ok(true)
}

/// The versions the table's last commits recorded for `app_ids` (Delta `txn` actions),
/// from a fresh read of the log; `None` for an app that never committed, and for every
/// app when the table does not exist yet.
///
/// # Errors
/// [`Error::Delta`] when the table cannot be read.
pub async fn txn_versions(location: &StoreLocation, app_ids: &[String]) -> Result<Vec<Option<i64>>> {
    let Some(table) = open_table(location).await? else {
        return Ok(vec![None; app_ids.len()]);
    };
    let state = table.snapshot().map_err(|e| Error::delta(location, e))?;
    let mut out = Vec::with_capacity(app_ids.len());
    for app in app_ids {
        out.push(state.transaction_version(table.log_store().as_ref(), app).await.map_err(|e| Error::delta(location, e))?);
    }
    Ok(out)
}
