//! Opening the views' Delta tables, local or at an object-store URI.

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
        StoreLocation::Uri(uri) => Url::parse(uri).map_err(|e| bad(e.to_string())),
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
    let url = table_url(location)?;
    match deltalake::open_table(url).await {
        Ok(table) => Ok(Some(table)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(source) => Err(Error::delta(location, source)),
    }
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
            .map_err(|e| quiver_sdk::Error::Store(format!("cannot tell whether feature view `{}` holds data: {e}", view.name)))
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
        .and_then(|b| b.build())
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
