//! What the web UI reports of the offline side (`quiver_online::server::Insights`):
//! per view the table's freshness and the last materialization per online store, a
//! view's statistics (cached by table version), and the stored `verify` reports.

use std::collections::HashMap;
use std::sync::Mutex;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type};
use quiver_offline::historical::{TableSummary, read_view, table_summary, table_versions};
use quiver_sdk::types::format_instant;
use quiver_sdk::{Config, Definitions, FeatureView};
use serde_json::{Value, json};

use crate::materialize::{STATE_FILE, load_state};

/// Bins of a statistics histogram.
const BINS: usize = 20;

/// The UI's view of a repository's offline side.
#[derive(Debug)]
pub struct RepoInsights {
    config: Config,
    /// (view, table version) -> its summary (rows, newest event): one aggregate query
    /// per version, not per page load.
    summaries: Mutex<HashMap<(String, u64), TableSummary>>,
    /// (view, table version) -> statistics.
    statistics: Mutex<HashMap<(String, u64), Value>>,
}

impl RepoInsights {
    pub fn new(config: Config) -> RepoInsights {
        RepoInsights { config, summaries: Mutex::new(HashMap::new()), statistics: Mutex::new(HashMap::new()) }
    }

    /// The version of `view`'s table (`None`: no table yet), from its log.
    async fn version(&self, view: &FeatureView) -> Result<Option<u64>, String> {
        Ok(table_versions(&self.config, &[view]).await.map_err(|e| e.to_string())?.remove(&view.versioned_name()).flatten())
    }

    /// The summary of `view`'s table at its current version, cached by version.
    async fn summary(&self, view: &FeatureView) -> Result<Option<TableSummary>, String> {
        let Some(version) = self.version(view).await? else {
            return Ok(None);
        };
        if let Some(cached) = self.summaries.lock().expect("summaries lock").get(&(view.name.clone(), version)) {
            return Ok(Some(*cached));
        }
        let summary = table_summary(&self.config, view).await.map_err(|e| e.to_string())?;
        if let Some(s) = summary {
            self.summaries.lock().expect("summaries lock").insert((view.name.clone(), s.version), s);
        }
        Ok(summary)
    }
}

#[async_trait::async_trait]
impl quiver_online::server::Insights for RepoInsights {
    async fn freshness(&self, defs: &Definitions, now: i64) -> Result<Value, String> {
        // An unreadable state file shows as never materialized, not as a failed page.
        let state = load_state(&self.config.repo.join(STATE_FILE)).unwrap_or_default();
        let (lags, stream_errors) = stream_lags(&self.config.server.stream_metrics, self.config.server.auth_token.as_deref()).await;
        let mut views = Vec::new();
        for view in &defs.feature_views {
            let summary = self.summary(view).await?;
            let ttl_s = view.ttl_us().map(|t| t / 1_000_000);
            let newest = summary.and_then(|s| s.newest_event);
            let age_s = newest.map(|t| (now - t) / 1_000_000);
            let stale = match (age_s, ttl_s) {
                (Some(age), Some(ttl)) => age > ttl,
                (None, _) => true,
                _ => false,
            };
            let materialized: Vec<Value> = state
                .iter()
                .filter_map(|(store, views)| {
                    views.get(&view.name).map(|p| json!({"store": store, "until": format_instant(p.end), "table_version": p.version}))
                })
                .collect();
            views.push(json!({
                "view": view.name,
                "online": view.online,
                "ttl_seconds": ttl_s,
                "table_version": summary.map(|s| s.version),
                "rows": summary.map_or(0, |s| s.rows),
                "newest_event": newest.map(format_instant),
                "age_seconds": age_s,
                "stale": stale,
                "materialized": materialized,
                "stream": view.source.stream.as_ref().map(|st| json!({
                    "topic": st.topic,
                    // Messages behind the high watermark, summed over the partitions the
                    // stream processes report (null: none of them reports the topic).
                    "lag": lags.get(&st.topic),
                })),
            }));
        }
        Ok(json!({ "now": format_instant(now), "views": views, "stream_errors": stream_errors }))
    }

    async fn statistics(&self, defs: &Definitions, name: &str) -> Result<Value, String> {
        let view = defs.find_view(name).map_err(|e| e.0)?;
        let version = self.version(view).await?;
        let key = (view.name.clone(), version.unwrap_or(0));
        if let Some(cached) = self.statistics.lock().expect("statistics lock").get(&key) {
            return Ok(cached.clone());
        }
        let batches = read_view(&self.config, defs, view).await.map_err(|e| e.to_string())?;
        let stats = view_statistics(view, &batches, version);
        self.statistics.lock().expect("statistics lock").insert(key, stats.clone());
        Ok(stats)
    }

    async fn verify_reports(&self) -> Result<Value, String> {
        let reports: Vec<crate::verify::VerifyReport> = crate::reports::list(&self.config.repo).unwrap_or_default();
        Ok(json!({ "reports": reports }))
    }

    async fn monitor_reports(&self) -> Result<Value, String> {
        let reports: Vec<crate::monitor::MonitorReport> = crate::reports::list(&self.config.repo).map_err(|e| e.to_string())?;
        Ok(json!({ "reports": reports }))
    }

    async fn lineage(&self, defs: &Definitions) -> Result<Value, String> {
        let (config, defs) = (self.config.clone(), defs.clone());
        let graph = tokio::task::spawn_blocking(move || {
            let sets = crate::lineage::graph::find_training_sets(std::slice::from_ref(&config.repo));
            crate::lineage::graph::Graph::build(&config, &defs, &sets)
        })
        .await
        .map_err(|e| e.to_string())?;
        serde_json::to_value(graph).map_err(|e| e.to_string())
    }
}

/// Rows, and per feature its type, null count and rate, and for numbers the range and a
/// histogram of [`BINS`] equal bins.
fn view_statistics(view: &FeatureView, batches: &[RecordBatch], version: Option<u64>) -> Value {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let mut features = Vec::new();
    for feature in &view.features {
        let columns: Vec<&dyn Array> = batches.iter().filter_map(|b| b.column_by_name(&feature.name)).map(|c| c.as_ref()).collect();
        let present: usize = columns.iter().map(|c| c.len()).sum();
        // Rows written before the feature existed count as null.
        let nulls = columns.iter().map(|c| c.null_count()).sum::<usize>() + (rows - present);
        let mut entry = json!({
            "name": feature.name,
            "dtype": feature.dtype.to_string(),
            "nulls": nulls,
            "null_rate": if rows == 0 { 0.0 } else { nulls as f64 / rows as f64 },
        });
        let numeric = matches!(
            columns.first().map(|c| c.data_type()),
            Some(DataType::Int32 | DataType::Int64 | DataType::Float32 | DataType::Float64)
        );
        if numeric {
            let values: Vec<f64> = columns
                .iter()
                .filter_map(|c| arrow::compute::cast(*c, &DataType::Float64).ok())
                .flat_map(|c| c.as_primitive::<Float64Type>().iter().flatten().filter(|v| v.is_finite()).collect::<Vec<_>>())
                .collect();
            if let (Some(lo), Some(hi)) = (values.iter().copied().reduce(f64::min), values.iter().copied().reduce(f64::max)) {
                let width = (hi - lo) / BINS as f64;
                let mut counts = vec![0u64; BINS];
                for v in &values {
                    let bin = if width > 0.0 { (((v - lo) / width) as usize).min(BINS - 1) } else { 0 };
                    counts[bin] += 1;
                }
                entry["min"] = json!(lo);
                entry["max"] = json!(hi);
                entry["histogram"] = json!({ "lo": lo, "hi": hi, "counts": counts });
            }
        }
        features.push(entry);
    }
    json!({ "view": view.name, "table_version": version, "rows": rows, "features": features })
}

/// `quiver_stream_lag` summed per topic over the `/metrics` of every stream process at
/// `urls`, and one line per process that could not be read.
async fn stream_lags(urls: &[String], token: Option<&str>) -> (std::collections::BTreeMap<String, i64>, Vec<String>) {
    let mut lags = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    for url in urls {
        match fetch(url, token).await {
            Ok(text) => {
                for (topic, lag) in parse_lags(&text) {
                    *lags.entry(topic).or_insert(0) += lag;
                }
            }
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    (lags, errors)
}

/// A plain HTTP/1.1 GET (the stream's metrics endpoint is on a trusted network, no TLS),
/// within two seconds; the body of a 200.
async fn fetch(url: &str, token: Option<&str>) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").ok_or("not an http:// URL")?;
    let (authority, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let work = async {
        let mut socket = tokio::net::TcpStream::connect(authority).await.map_err(|e| e.to_string())?;
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n{auth}Connection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut bytes = Vec::new();
        socket.take(16 << 20).read_to_end(&mut bytes).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").ok_or("not an HTTP answer")?;
        let status = head.lines().next().unwrap_or_default();
        if !status.contains(" 200 ") {
            return Err(format!("answered {status}"));
        }
        Ok(body.to_string())
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), work).await.map_err(|_| "no answer within 2 s".to_string())?
}

/// The `quiver_stream_lag{topic="T",partition="P"} N` samples of a Prometheus text.
fn parse_lags(text: &str) -> Vec<(String, i64)> {
    text.lines()
        .filter_map(|line| {
            let labels = line.strip_prefix("quiver_stream_lag{")?;
            let (labels, value) = labels.split_once("} ")?;
            let topic = labels.split(',').find_map(|l| l.strip_prefix("topic=\""))?.strip_suffix('"')?;
            Some((topic.to_string(), value.trim().parse::<f64>().ok()? as i64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn lags_are_read_per_topic() {
        let text = "# TYPE quiver_stream_lag gauge\nquiver_stream_lag{topic=\"a\",partition=\"0\"} 3\n\
                    quiver_stream_lag{topic=\"a\",partition=\"1\"} 4\nquiver_stream_lag{topic=\"b\",partition=\"0\"} 0\n\
                    quiver_stream_consumed_total 9\n";
        assert_eq!(super::parse_lags(text), vec![("a".into(), 3), ("a".into(), 4), ("b".into(), 0)]);
    }
}
