//! `lineage:` in `quiver.yaml` (docs/lineage.md): where the OpenLineage events of the
//! jobs go — nowhere (the default), a file of JSON lines, or an HTTP endpoint.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_yaml::Value;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLineage {
    transport: Option<String>,
    namespace: Option<String>,
    path: Option<String>,
    url: Option<String>,
    token: Option<String>,
    timeout: Option<Value>,
    retries: Option<Value>,
    queue: Option<Value>,
    interval: Option<Value>,
}

/// The keys of `lineage:`, as the environment may override them (`QUIVER_LINEAGE_URL`).
pub(super) const KEYS: &[&str] = &["transport", "namespace", "path", "url", "token", "timeout", "retries", "queue", "interval"];

/// Where the events go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LineageTransport {
    /// Not emitted (the default).
    #[default]
    None,
    /// Appended to a file, one event a line (concurrent processes append whole lines).
    File { path: PathBuf },
    /// POSTed to a Marquez-compatible endpoint (`.../api/v1/lineage`), off the job's
    /// path: a bounded queue, a timeout per request, bounded retries.
    Http { url: String, token: Option<String>, timeout: Duration, retries: u32, queue: usize },
}

/// The validated `lineage:` section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LineageConfig {
    pub transport: LineageTransport,
    /// The jobs' namespace; default the project's name.
    pub namespace: String,
    /// How often a long-running job (the stream, the server's pushes) reports what it
    /// wrote since its last event: a RUNNING event per interval with writes (60s).
    pub interval: Duration,
}

impl LineageConfig {
    pub fn enabled(&self) -> bool {
        self.transport != LineageTransport::None
    }
}

/// The text of a scalar (numbers may come as text from the environment).
fn text(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

pub(super) fn lineage(repo: &Path, project: &str, raw: RawLineage) -> Result<LineageConfig, String> {
    let namespace = match raw.namespace {
        Some(n) if n.trim().is_empty() => return Err("lineage.namespace: empty".to_string()),
        Some(n) => n,
        None => project.to_string(),
    };
    let whole = |name: &str, v: Option<&Value>, default: u64, zero: bool| -> Result<u64, String> {
        let Some(t) = v.map(text) else { return Ok(default) };
        t.parse::<u64>()
            .ok()
            .filter(|n| zero || *n > 0)
            .ok_or_else(|| format!("lineage.{name} `{t}`: expected a whole number{}", if zero { "" } else { " above 0" }))
    };
    let transport = match raw.transport.as_deref().map(str::trim) {
        None | Some("none") => LineageTransport::None,
        Some("file") => {
            let path = match raw.path {
                Some(p) if !p.trim().is_empty() => repo.join(p),
                Some(_) => return Err("lineage.path: empty (expected a file, e.g. lineage.jsonl)".to_string()),
                None => repo.join("lineage.jsonl"),
            };
            LineageTransport::File { path }
        }
        Some("http") => {
            let url = raw.url.ok_or("lineage.url: missing (expected the endpoint, e.g. http://marquez:5000/api/v1/lineage)")?;
            let parsed = url::Url::parse(&url).map_err(|e| format!("lineage.url `{url}`: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(format!("lineage.url `{url}`: expected an http:// or https:// URL with a host"));
            }
            let timeout = duration("timeout", raw.timeout.as_ref(), 5)?;
            LineageTransport::Http {
                url,
                token: raw.token.filter(|t| !t.is_empty()),
                timeout,
                retries: u32::try_from(whole("retries", raw.retries.as_ref(), 3, true)?).unwrap_or(u32::MAX),
                queue: usize::try_from(whole("queue", raw.queue.as_ref(), 10_000, false)?).unwrap_or(usize::MAX),
            }
        }
        Some(other) => return Err(format!("lineage.transport `{other}`: unknown (expected none, file or http)")),
    };
    let interval = duration("interval", raw.interval.as_ref(), 60)?;
    Ok(LineageConfig { transport, namespace, interval })
}

/// `lineage.<name>` as a duration above 0 (`5s`, `2m`); `default` seconds when absent.
fn duration(name: &str, v: Option<&Value>, default: u64) -> Result<Duration, String> {
    let Some(t) = v.map(text) else { return Ok(Duration::from_secs(default)) };
    match crate::Ttl::parse(&t) {
        Ok(d) if !d.is_unbounded() && d.secs() > 0 => Ok(Duration::from_secs(d.secs())),
        _ => Err(format!("lineage.{name} `{t}`: expected a duration such as 5s above 0")),
    }
}
