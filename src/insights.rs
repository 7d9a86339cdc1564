//! What the web UI reports of the offline side (`quiver_online::server::Insights`):
//! per view the table's freshness and the last materialization per online store, a
//! view's statistics (cached by table version), and the stored `verify` reports.

use std::collections::HashMap;
use std::sync::Mutex;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type};
use quiver_offline::historical::{read_view, table_summary};
use quiver_sdk::{Config, Definitions, FeatureView};
use serde_json::{Value, json};

use crate::materialize::{STATE_FILE, State};

/// Bins of a statistics histogram.
const BINS: usize = 20;

/// The UI's view of a repository's offline side.
#[derive(Debug)]
pub struct RepoInsights {
    config: Config,
    /// (view, table version) -> statistics.
    statistics: Mutex<HashMap<(String, u64), Value>>,
}

impl RepoInsights {
    pub fn new(config: Config) -> RepoInsights {
        RepoInsights { config, statistics: Mutex::new(HashMap::new()) }
    }
}

fn rfc3339(us: i64) -> String {
    quiver_sdk::rows::format_instant(us)
}

#[async_trait::async_trait]
impl quiver_online::server::Insights for RepoInsights {
    async fn freshness(&self, defs: &Definitions, now: i64) -> Result<Value, String> {
        let state: State = match std::fs::read_to_string(self.config.repo.join(STATE_FILE)) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_default(),
            Err(_) => State::new(),
        };
        let mut views = Vec::new();
        for view in &defs.feature_views {
            let summary = table_summary(&self.config, view).await.map_err(|e| e.to_string())?;
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
                    views.get(&view.name).map(|p| json!({"store": store, "until": rfc3339(p.end), "table_version": p.version}))
                })
                .collect();
            views.push(json!({
                "view": view.name,
                "online": view.online,
                "ttl_seconds": ttl_s,
                "table_version": summary.map(|s| s.version),
                "rows": summary.map_or(0, |s| s.rows),
                "newest_event": newest.map(rfc3339),
                "age_seconds": age_s,
                "stale": stale,
                "materialized": materialized,
            }));
        }
        Ok(json!({ "now": rfc3339(now), "views": views }))
    }

    async fn statistics(&self, defs: &Definitions, name: &str) -> Result<Value, String> {
        let view = defs.find_view(name).map_err(|e| e.0)?;
        let summary = table_summary(&self.config, view).await.map_err(|e| e.to_string())?;
        let version = summary.map_or(0, |s| s.version);
        let key = (view.name.clone(), version);
        if let Some(cached) = self.statistics.lock().expect("statistics lock").get(&key) {
            return Ok(cached.clone());
        }
        let batches = read_view(&self.config, defs, view).await.map_err(|e| e.to_string())?;
        let stats = view_statistics(view, &batches, summary.map(|s| s.version));
        self.statistics.lock().expect("statistics lock").insert(key, stats.clone());
        Ok(stats)
    }

    async fn verify_reports(&self) -> Result<Value, String> {
        let dir = self.config.repo.join(crate::verify::REPORTS_DIR);
        let mut files: Vec<std::path::PathBuf> = match std::fs::read_dir(&dir) {
            Ok(entries) => {
                entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
            }
            Err(_) => Vec::new(),
        };
        files.sort();
        let mut reports = Vec::new();
        for file in files {
            // A report that cannot be read is skipped, never the page's failure.
            if let Some(report) = std::fs::read(&file).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()) {
                reports.push(report);
            }
        }
        Ok(json!({ "reports": reports }))
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
