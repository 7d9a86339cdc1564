//! How a cluster's processes reach the offline store: a Parquet scan in a cluster plan
//! names its files under `quiver://<place>`, where the host is the table's location
//! (folder, or object-store URI with the repository's storage options) as hex-encoded
//! JSON. [`QuiverStores`], the object-store registry of `quiver cluster` processes,
//! opens that location as the local join does ([`crate::delta::object_store`]), so
//! executors need no settings of their own. The storage options travel inside the plan:
//! keep the cluster on a trusted network, or give credentials to every process by its
//! environment (`AWS_*`, …, which the stores read) instead of `quiver.yaml`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::ObjectStore;
use quiver_sdk::StoreLocation;
use quiver_sdk::config::StorageOptions;
use serde::{Deserialize, Serialize};
use url::Url;

const SCHEME: &str = "quiver";

/// A table's location as it travels in a plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Place {
    Local(std::path::PathBuf),
    Uri { uri: String, options: BTreeMap<String, String> },
}

/// The object-store URL a cluster plan reads `location`'s files under (paths relative
/// to the location).
pub(super) fn store_url(location: &StoreLocation) -> String {
    let place = match location {
        StoreLocation::Local(path) => Place::Local(std::path::absolute(path).unwrap_or_else(|_| path.clone())),
        StoreLocation::Uri(uri, options) => {
            Place::Uri { uri: uri.clone(), options: options.iter().map(|(k, v)| (k.clone(), v.clone())).collect() }
        }
    };
    let json = serde_json::to_vec(&place).expect("a place serializes");
    let hex: String = json.iter().map(|b| format!("{b:02x}")).collect();
    format!("{SCHEME}://{hex}")
}

fn location_of(url: &Url) -> DfResult<StoreLocation> {
    let bad = || DataFusionError::Execution(format!("not a Quiver store URL: {}…", &url.as_str()[..url.as_str().len().min(40)]));
    let hex = url.host_str().ok_or_else(bad)?.as_bytes();
    if hex.len() % 2 != 0 {
        return Err(bad());
    }
    let json: Vec<u8> = hex
        .chunks(2)
        .map(|pair| std::str::from_utf8(pair).ok().and_then(|p| u8::from_str_radix(p, 16).ok()))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    Ok(match serde_json::from_slice(&json).map_err(|_| bad())? {
        Place::Local(path) => StoreLocation::Local(path),
        Place::Uri { uri, options } => StoreLocation::Uri(uri, StorageOptions::new(options)),
    })
}

/// DataFusion's object-store registry, plus the `quiver://` locations of cluster plans
/// (each opened once per process).
#[derive(Debug, Default)]
pub struct QuiverStores {
    others: DefaultObjectStoreRegistry,
    opened: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl ObjectStoreRegistry for QuiverStores {
    fn register_store(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        self.others.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        self.others.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        if url.scheme() != SCHEME {
            return self.others.get_store(url);
        }
        let key = url.host_str().unwrap_or_default().to_string();
        let mut opened = self.opened.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(store) = opened.get(&key) {
            return Ok(store.clone());
        }
        let location = location_of(url)?;
        let store = crate::delta::object_store(&location).map_err(|e| DataFusionError::Execution(e.to_string()))?;
        opened.insert(key, store.clone());
        Ok(store)
    }
}
