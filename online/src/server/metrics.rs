//! The server's counters and latency histogram, as Prometheus text.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::limits::Limit;

/// Request counts and latencies, as Prometheus text.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (route, status) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Latency histogram buckets (seconds) of /get-online-features.
    buckets: [AtomicU64; 10],
    latency_sum_us: AtomicU64,
    latency_count: AtomicU64,
    pub(super) store_errors: AtomicU64,
    /// Refusals per [`Limit`], in [`Limit::ALL`] order.
    refusals: [AtomicU64; 6],
    connections: AtomicU64,
}

const BUCKETS: [f64; 10] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0];

impl Metrics {
    /// One request or connection refused by `limit`.
    pub fn refused(&self, limit: Limit) {
        let i = Limit::ALL.iter().position(|l| *l == limit).expect("listed");
        self.refusals[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections open now.
    pub fn connections_open(&self, n: usize) {
        self.connections.store(n as u64, Ordering::Relaxed);
    }

    pub(super) fn record(&self, route: &str, status: u16, elapsed: Duration) {
        *self
            .requests
            .lock()
            .expect("metrics lock")
            .entry((route.to_string(), status))
            .or_default() += 1;
        if route == "/get-online-features" {
            let secs = elapsed.as_secs_f64();
            for (i, b) in BUCKETS.iter().enumerate() {
                if secs <= *b {
                    self.buckets[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            self.latency_sum_us.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
            self.latency_count.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn render(&self) -> String {
        let mut out = String::from("# TYPE quiver_requests_total counter\n");
        for ((route, status), n) in self.requests.lock().expect("metrics lock").iter() {
            out.push_str(&format!("quiver_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}\n"));
        }
        out.push_str("# TYPE quiver_request_seconds histogram\n");
        for (i, b) in BUCKETS.iter().enumerate() {
            out.push_str(&format!(
                "quiver_request_seconds_bucket{{route=\"/get-online-features\",le=\"{b}\"}} {}\n",
                self.buckets[i].load(Ordering::Relaxed)
            ));
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        out.push_str(&format!("quiver_request_seconds_bucket{{route=\"/get-online-features\",le=\"+Inf\"}} {count}\n"));
        out.push_str(&format!(
            "quiver_request_seconds_sum{{route=\"/get-online-features\"}} {}\n",
            self.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6
        ));
        out.push_str(&format!("quiver_request_seconds_count{{route=\"/get-online-features\"}} {count}\n"));
        out.push_str("# TYPE quiver_store_errors_total counter\n");
        out.push_str(&format!("quiver_store_errors_total {}\n", self.store_errors.load(Ordering::Relaxed)));
        out.push_str("# TYPE quiver_limit_refusals_total counter\n");
        for (limit, n) in Limit::ALL.iter().zip(&self.refusals) {
            out.push_str(&format!("quiver_limit_refusals_total{{limit=\"{}\"}} {}\n", limit.as_str(), n.load(Ordering::Relaxed)));
        }
        out.push_str("# TYPE quiver_connections_open gauge\n");
        out.push_str(&format!("quiver_connections_open {}\n", self.connections.load(Ordering::Relaxed)));
        out
    }
}

