//! `quiver.yaml`: read raw, overlaid with `QUIVER_<SECTION>_<KEY>` environment variables,
//! then validated into a [`Config`].
//!
//! Precedence, highest first: command-line flag > environment > file > default. Flags
//! are applied by the caller on the validated [`Config`] (e.g. `serve --port`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::{Mapping, Value};

use crate::error::{Error, Result};

mod lineage;
mod location;
pub use lineage::{LineageConfig, LineageTransport};
pub use location::{StorageOptions, StoreLocation};

/// The name of the project config file in a repository.
pub const CONFIG_FILE: &str = "quiver.yaml";

/// Sections and their keys, as they may be overridden from the environment. Top-level
/// keys (`project`, `registry`) are their own section: `QUIVER_PROJECT`.
const SECTIONS: &[(&str, &[&str])] = &[
    ("offline_store", &["path"]),
    ("online_store", &["type", "path", "url", "replica_acks"]),
    ("kafka", &["brokers"]),
    ("server", &["host", "port", "auth_token", "max_cells", "request_timeout", "max_connections", "stream_metrics"]),
    ("serving_log", &["enabled", "path", "sample_rate", "batch_rows", "batch_ms"]),
    ("monitoring", &["reference", "service", "window"]),
    ("lineage", lineage::KEYS),
];
const TOP_LEVEL: &[&str] = &["project", "registry", "max_future_skew"];

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    project: Option<String>,
    registry: Option<String>,
    max_future_skew: Option<Value>,
    #[serde(default)]
    offline_store: RawOffline,
    #[serde(default)]
    online_store: RawOnline,
    #[serde(default)]
    kafka: RawKafka,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    serving_log: RawServingLog,
    #[serde(default)]
    monitoring: RawMonitoring,
    #[serde(default)]
    lineage: lineage::RawLineage,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMonitoring {
    reference: Option<String>,
    service: Option<String>,
    window: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServingLog {
    enabled: Option<Value>,
    path: Option<String>,
    sample_rate: Option<Value>,
    batch_rows: Option<Value>,
    batch_ms: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawOffline {
    path: Option<String>,
    storage_options: Option<Mapping>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawOnline {
    #[serde(rename = "type")]
    kind: Option<String>,
    path: Option<String>,
    url: Option<String>,
    urls: Option<Vec<String>>,
    replica_acks: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawKafka {
    brokers: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    host: Option<String>,
    port: Option<Value>,
    auth_token: Option<String>,
    max_cells: Option<Value>,
    request_timeout: Option<Value>,
    max_connections: Option<Value>,
    stream_metrics: Option<Value>,
}

/// The online store to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnlineStoreConfig {
    /// The embedded store in a local file (default).
    Embedded { path: PathBuf },
    /// Redis at a `redis://` URL.
    Redis { url: String },
    /// A Redis Cluster reached through its seed nodes' `redis://` URLs.
    RedisCluster {
        urls: Vec<String>,
        /// How many replicas must hold a write before it is acknowledged (Redis `WAIT`);
        /// 0 (default): the master's answer. With 1, a failover loses no acknowledged write.
        replica_acks: u32,
    },
}

/// The HTTP server's settings, with the bounds of docs/limits.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// When set, requests need `Authorization: Bearer <token>`.
    pub auth_token: Option<String>,
    /// Whether the token is written in `quiver.yaml` itself (rather than coming from
    /// `QUIVER_SERVER_AUTH_TOKEN`): a secret in a file that is easily committed.
    pub auth_token_in_file: bool,
    /// Entity rows x features above which `/get-online-features` answers 413 before
    /// any work (default 1,000,000).
    pub max_cells: usize,
    /// A connection that has not sent a complete request (headers and body) this long
    /// after it opened or after its last answer is closed (default 10 s).
    pub request_timeout: std::time::Duration,
    /// Connections served at once (default 1,024); beyond them a connection gets one
    /// short answer (`/health` still answers, the rest 503) and is closed.
    pub max_connections: usize,
    /// The `/metrics` URLs of the `quiver stream` processes (`--metrics-port`), whose
    /// lag the web UI's freshness page shows (a list, or comma separated).
    pub stream_metrics: Vec<String>,
}

impl ServerConfig {
    /// The defaults, on `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> ServerConfig {
        ServerConfig {
            host: host.into(),
            port,
            auth_token: None,
            auth_token_in_file: false,
            max_cells: DEFAULT_MAX_CELLS,
            request_timeout: std::time::Duration::from_secs(DEFAULT_REQUEST_TIMEOUT_SECS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            stream_metrics: Vec::new(),
        }
    }
}

/// The serving log (`serving_log:` in `quiver.yaml`): what the server answered, appended
/// to a Delta table in batches off the request path, for `quiver verify --since`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServingLogConfig {
    /// Off unless set (`enabled: true`).
    pub enabled: bool,
    /// The log's Delta table; default `<offline root>/_serving_log`.
    pub location: StoreLocation,
    /// The share of requests logged, in (0, 1]; default 1.
    pub sample_rate: f64,
    /// A batch is written when it holds this many rows (default 100,000) ...
    pub batch_rows: usize,
    /// ... or this many milliseconds after its first row (default 1,000).
    pub batch_ms: u64,
}

/// Continuous monitoring (`monitoring:` in `quiver.yaml`, docs/monitoring.md): with a
/// reference and the serving log on, `quiver serve` profiles what it serves and exports
/// each feature's drift from the reference on `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MonitoringConfig {
    /// `training:DIR` or `offline:T1..T2` (parsed by the server); `None`: off.
    pub reference: Option<String>,
    /// The features gauged (and their thresholds): this service's; default the training
    /// set's features.
    pub service: Option<String>,
    /// The serving window the gauges cover, ending now (default 1h).
    pub window: std::time::Duration,
}

/// The validated project configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The repository folder.
    pub repo: PathBuf,
    pub project: String,
    /// Absolute path of the registry file.
    pub registry_path: PathBuf,
    pub offline_root: StoreLocation,
    /// `offline_store.storage_options`, for every object-store location (the root, a
    /// view's own `source.path`, the serving log's).
    pub storage_options: StorageOptions,
    pub online_store: OnlineStoreConfig,
    pub kafka_brokers: String,
    pub server: ServerConfig,
    pub serving_log: ServingLogConfig,
    pub monitoring: MonitoringConfig,
    /// Where the jobs' OpenLineage events go (docs/lineage.md).
    pub lineage: LineageConfig,
    /// How far after the wall clock an event time may be (`max_future_skew`, default
    /// 5m): ingest, push, `/push` and the stream refuse later rows, and the guarded
    /// online write lets any write replace a stored row dated later than that.
    pub max_future_skew: std::time::Duration,
}

/// The serving log's table under the offline root when no path is given.
pub const DEFAULT_SERVING_LOG_TABLE: &str = "_serving_log";
pub const DEFAULT_REGISTRY: &str = "registry.json";
pub const DEFAULT_OFFLINE_PATH: &str = "data";
pub const DEFAULT_ONLINE_PATH: &str = "online.db";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/0";
pub const DEFAULT_KAFKA_BROKERS: &str = "127.0.0.1:9092";
pub const DEFAULT_HOST: &str = "127.0.0.1";
pub const DEFAULT_PORT: u16 = 6566;
pub const DEFAULT_MAX_CELLS: usize = 1_000_000;
pub const DEFAULT_REQUEST_TIMEOUT_SECS: u64 = 10;
pub const DEFAULT_MAX_CONNECTIONS: usize = 1_024;
pub const DEFAULT_MAX_FUTURE_SKEW_SECS: u64 = 300;

impl Config {
    /// Loads `<repo>/quiver.yaml` with the process environment's overrides.
    ///
    /// # Errors
    /// [`Error::Io`] when the file is missing or unreadable, [`Error::Config`] naming the
    /// file (or environment variable) and the setting for a bad value.
    pub fn load(repo: &Path) -> Result<Config> {
        Config::load_with_env(repo, std::env::vars())
    }

    /// As [`Config::load`], with the environment given (for tests).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn load_with_env(repo: &Path, env: impl IntoIterator<Item = (String, String)>) -> Result<Config> {
        let file = repo.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&file).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound { Error::NoRepository { file: file.clone() } } else { Error::io(&file, e) }
        })?;
        Config::parse(repo, &file, &text, env)
    }

    /// Parses config text; `file` is only used in error messages.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn parse(repo: &Path, file: &Path, text: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Config> {
        let bad = |message: String| Error::Config { file: file.to_path_buf(), message };
        let mut value: Value = if text.trim().is_empty() {
            Value::Mapping(Mapping::new())
        } else {
            serde_yaml::from_str(text).map_err(|e| bad(crate::yaml::yaml_message(&e)))?
        };
        if !value.is_mapping() {
            return Err(bad("expected a mapping of settings".to_string()));
        }
        let token_in_file =
            value.get("server").and_then(|s| s.get("auth_token")).is_some_and(|t| t.as_str().is_some_and(|t| !t.is_empty()));
        let mut env: Vec<(String, String)> = env.into_iter().collect();
        env.sort();
        for (var, val) in &env {
            overlay(&mut value, var, val)?;
        }
        let raw: RawConfig = serde_yaml::from_value(value).map_err(|e| bad(crate::yaml::yaml_message(&e)))?;
        let mut config = validate(repo, raw).map_err(bad)?;
        // The environment's token replaces the file's: only then is the file's not used.
        config.server.auth_token_in_file =
            token_in_file && !env.iter().any(|(k, v)| k.eq_ignore_ascii_case("QUIVER_SERVER_AUTH_TOKEN") && !v.is_empty());
        Ok(config)
    }

    /// The latest event time accepted at wall-clock time `now` (UTC microseconds).
    pub fn event_horizon(&self, now: i64) -> i64 {
        now.saturating_add(i64::try_from(self.max_future_skew.as_micros()).unwrap_or(i64::MAX))
    }

    /// The Delta table location of a view: its source path if set (relative paths are
    /// taken from the repository), else `<offline root>/<view>`.
    pub fn view_table(&self, view: &crate::FeatureView) -> StoreLocation {
        let table = match &view.source.path {
            Some(p) => StoreLocation::parse(&self.repo, p, &self.storage_options),
            None => self.offline_root.join(&view.name),
        };
        // Version N of a view has its own table beside version 1's (docs/versions.md#storage).
        if view.version == crate::definitions::FIRST_VERSION { table } else { table.suffixed(&format!(".v{}", view.version)) }
    }
}

/// Applies one `QUIVER_...` variable to the raw document, if it names a setting.
/// `server.stream_metrics`: `http://HOST:PORT/...` URLs, as a list or comma separated.
fn stream_metrics(v: Option<&Value>) -> std::result::Result<Vec<String>, String> {
    let items: Vec<String> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(list)) => list.iter().map(scalar_text).collect(),
        Some(other) => scalar_text(other).split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
    };
    for url in &items {
        let rest = url.strip_prefix("http://").unwrap_or("");
        let authority = rest.split('/').next().unwrap_or("");
        if authority.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()) {
            return Err(format!("server.stream_metrics `{url}`: expected http://HOST:PORT/metrics (quiver stream --metrics-port)"));
        }
    }
    Ok(items)
}

fn overlay(doc: &mut Value, var: &str, val: &str) -> Result<()> {
    let Some(rest) = var.strip_prefix("QUIVER_") else {
        return Ok(());
    };
    let env_error = |message: String| Error::Config { file: PathBuf::from(format!("environment variable {var}")), message };
    // Always text: `QUIVER_PROJECT=2024` is the project `2024`, not a number; settings
    // that are numbers (the port) accept text.
    let scalar = || Value::String(val.to_string());
    let map = doc.as_mapping_mut().expect("checked to be a mapping");
    for key in TOP_LEVEL {
        if rest.eq_ignore_ascii_case(key) {
            map.insert(Value::from(*key), scalar());
            return Ok(());
        }
    }
    for (section, keys) in SECTIONS {
        let prefix = format!("{}_", section.to_ascii_uppercase());
        let Some(key) = rest.strip_prefix(&prefix) else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        if !keys.contains(&key.as_str()) {
            return Err(env_error(format!("unknown setting `{section}.{key}` (known: {})", keys.join(", "))));
        }
        let entry = map.entry(Value::from(*section)).or_insert_with(|| Value::Mapping(Mapping::new()));
        if entry.is_null() {
            *entry = Value::Mapping(Mapping::new());
        }
        let Some(section_map) = entry.as_mapping_mut() else {
            return Err(env_error(format!("`{section}` in quiver.yaml is not a mapping")));
        };
        section_map.insert(Value::from(key), scalar());
        return Ok(());
    }
    // Other QUIVER_ variables (QUIVER_REPO, QUIVER_REQUIRE_GPU, ...) are not settings.
    Ok(())
}

fn validate(repo: &Path, raw: RawConfig) -> std::result::Result<Config, String> {
    let project = raw.project.ok_or("missing `project` (expected e.g. `project: demo`)")?;
    if project.is_empty() || !project.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("project `{project}`: expected letters, digits, `_` or `-` (it is part of every online key)"));
    }
    let registry_path = repo.join(raw.registry.as_deref().unwrap_or(DEFAULT_REGISTRY));
    let mut storage_options = Vec::new();
    for (key, value) in raw.offline_store.storage_options.iter().flatten() {
        let Some(key) = key.as_str().filter(|k| !k.trim().is_empty()) else {
            return Err(format!("offline_store.storage_options: key {key:?}: expected a setting name such as AWS_REGION"));
        };
        if !matches!(value, Value::String(_) | Value::Bool(_) | Value::Number(_)) {
            return Err(format!("offline_store.storage_options.{key}: expected a string"));
        }
        storage_options.push((key.to_string(), scalar_text(value)));
    }
    let storage_options = StorageOptions::new(storage_options);
    let offline_root = StoreLocation::parse(repo, raw.offline_store.path.as_deref().unwrap_or(DEFAULT_OFFLINE_PATH), &storage_options);
    let online = raw.online_store;
    let online_store = match online.kind.as_deref().unwrap_or("embedded") {
        "embedded" => OnlineStoreConfig::Embedded { path: repo.join(online.path.as_deref().unwrap_or(DEFAULT_ONLINE_PATH)) },
        "redis" if online.urls.is_some() => {
            return Err("online_store.urls: a setting of type redis_cluster (type redis takes one `url`)".to_string());
        }
        "redis_cluster" if online.url.is_some() => {
            return Err("online_store.url: type redis_cluster takes `urls`, the list of its seed nodes".to_string());
        }
        "redis" => {
            let url = online.url.unwrap_or_else(|| DEFAULT_REDIS_URL.to_string());
            if !["redis://", "rediss://", "unix://", "redis+unix://"].iter().any(|s| url.starts_with(s)) {
                return Err(format!("online_store.url `{url}`: expected a redis:// or rediss:// URL"));
            }
            OnlineStoreConfig::Redis { url }
        }
        "redis_cluster" => {
            let urls = online.urls.unwrap_or_default();
            if urls.is_empty() {
                return Err("online_store.urls: missing (expected the cluster's seed nodes, e.g. [redis://10.0.0.1:6379])".to_string());
            }
            if let Some(url) = urls.iter().find(|u| !u.starts_with("redis://") && !u.starts_with("rediss://")) {
                return Err(format!("online_store.urls: `{url}`: expected a redis:// or rediss:// URL"));
            }
            let replica_acks = match online.replica_acks.as_ref().map(scalar_text) {
                None => 0,
                Some(t) => t
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n <= 16)
                    .ok_or_else(|| format!("online_store.replica_acks `{t}`: expected a number of replicas from 0 to 16"))?,
            };
            OnlineStoreConfig::RedisCluster { urls, replica_acks }
        }
        other => {
            return Err(format!("online_store.type `{other}`: unknown (expected embedded, redis or redis_cluster)"));
        }
    };
    let kafka_brokers = raw.kafka.brokers.unwrap_or_else(|| DEFAULT_KAFKA_BROKERS.to_string());
    if kafka_brokers.trim().is_empty() {
        return Err("kafka.brokers: empty (expected host:port[,host:port])".to_string());
    }
    let host = raw.server.host.unwrap_or_else(|| DEFAULT_HOST.to_string());
    if host.trim().is_empty() {
        return Err("server.host: empty (expected an address such as 127.0.0.1)".to_string());
    }
    let port = match raw.server.port {
        None => DEFAULT_PORT,
        Some(v) => {
            let text = match &v {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.clone(),
                _ => String::new(),
            };
            text.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| format!("server.port `{text}`: expected a port number 1-65535"))?
        }
    };
    let serving_log = serving_log(repo, &offline_root, &storage_options, raw.serving_log)?;
    let duration = |name: &str, v: Option<&Value>, default: u64, allow_zero: bool| -> std::result::Result<std::time::Duration, String> {
        let Some(text) = v.map(scalar_text) else {
            return Ok(std::time::Duration::from_secs(default));
        };
        match crate::Ttl::parse(&text) {
            Ok(d) if allow_zero || !d.is_unbounded() => Ok(std::time::Duration::from_secs(d.secs())),
            _ => Err(format!("{name} `{text}`: expected a duration such as 30s, 5m or 1h{}", if allow_zero { "" } else { " above 0" })),
        }
    };
    let count = |name: &str, v: Option<&Value>, default: usize| -> std::result::Result<usize, String> {
        let Some(text) = v.map(scalar_text) else { return Ok(default) };
        text.replace('_', "")
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{name} `{text}`: expected a whole number above 0"))
    };
    let max_future_skew = duration("max_future_skew", raw.max_future_skew.as_ref(), DEFAULT_MAX_FUTURE_SKEW_SECS, true)?;
    let non_empty = |name: &str, v: Option<String>| -> std::result::Result<Option<String>, String> {
        match v {
            Some(t) if t.trim().is_empty() => Err(format!("{name}: empty")),
            other => Ok(other),
        }
    };
    let monitoring = MonitoringConfig {
        reference: non_empty("monitoring.reference", raw.monitoring.reference)?,
        service: non_empty("monitoring.service", raw.monitoring.service)?,
        window: duration("monitoring.window", raw.monitoring.window.as_ref(), 3600, false)?,
    };
    let server = ServerConfig {
        host,
        port,
        auth_token: raw.server.auth_token.filter(|t| !t.is_empty()),
        auth_token_in_file: false,
        max_cells: count("server.max_cells", raw.server.max_cells.as_ref(), DEFAULT_MAX_CELLS)?,
        request_timeout: duration("server.request_timeout", raw.server.request_timeout.as_ref(), DEFAULT_REQUEST_TIMEOUT_SECS, false)?,
        max_connections: count("server.max_connections", raw.server.max_connections.as_ref(), DEFAULT_MAX_CONNECTIONS)?,
        stream_metrics: stream_metrics(raw.server.stream_metrics.as_ref())?,
    };
    let lineage = lineage::lineage(repo, &project, raw.lineage)?;
    Ok(Config {
        repo: repo.to_path_buf(),
        project,
        registry_path,
        offline_root,
        storage_options,
        online_store,
        kafka_brokers,
        server,
        serving_log,
        monitoring,
        lineage,
        max_future_skew,
    })
}

/// The text of a scalar setting (numbers and booleans may come as text from the
/// environment).
fn scalar_text(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

fn serving_log(
    repo: &Path,
    offline_root: &StoreLocation,
    options: &StorageOptions,
    raw: RawServingLog,
) -> std::result::Result<ServingLogConfig, String> {
    let enabled = match raw.enabled.as_ref().map(scalar_text) {
        None => false,
        Some(t) => match t.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => return Err(format!("serving_log.enabled `{t}`: expected true or false")),
        },
    };
    let location = match raw.path {
        Some(p) if !p.trim().is_empty() => StoreLocation::parse(repo, &p, options),
        Some(_) => return Err("serving_log.path: empty (expected a folder or object-store URI)".to_string()),
        None => offline_root.join(DEFAULT_SERVING_LOG_TABLE),
    };
    let sample_rate = match raw.sample_rate.as_ref().map(scalar_text) {
        None => 1.0,
        Some(t) => t
            .parse::<f64>()
            .ok()
            .filter(|r| *r > 0.0 && *r <= 1.0)
            .ok_or_else(|| format!("serving_log.sample_rate `{t}`: expected a number in (0, 1]"))?,
    };
    let positive = |name: &str, v: Option<Value>, default: u64| -> std::result::Result<u64, String> {
        match v.as_ref().map(scalar_text) {
            None => Ok(default),
            Some(t) => {
                t.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| format!("serving_log.{name} `{t}`: expected a whole number above 0"))
            }
        }
    };
    Ok(ServingLogConfig {
        enabled,
        location,
        sample_rate,
        batch_rows: usize::try_from(positive("batch_rows", raw.batch_rows, 100_000)?).unwrap_or(usize::MAX),
        batch_ms: positive("batch_ms", raw.batch_ms, 1_000)?,
    })
}

#[cfg(test)]
mod tests;
