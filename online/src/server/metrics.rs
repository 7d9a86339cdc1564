//! The server's counters and latency histogram, as Prometheus text.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quiver_sdk::metrics::{Buckets, Exposition, Histogram, Kind};

use super::limits::Limit;

/// Request counts and latencies, as Prometheus text.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (route, status) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Latency of /get-online-features.
    latency: Histogram<Latency>,
    pub(super) store_errors: AtomicU64,
    /// Refusals per [`Limit`], in [`Limit::ALL`] order.
    refusals: [AtomicU64; 6],
    connections: AtomicU64,
}

const BUCKETS: [f64; 10] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0];

#[derive(Debug)]
struct Latency;

impl Buckets for Latency {
    const BOUNDS: &'static [f64] = &BUCKETS;
}

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
        *self.requests.lock().expect("metrics lock").entry((route.to_string(), status)).or_default() += 1;
        if route == "/get-online-features" {
            self.latency.observe(elapsed.as_secs_f64());
        }
    }

    pub(super) fn render(&self, out: &mut Exposition) {
        out.family("quiver_requests_total", Kind::Counter, "Requests answered, by route and status.");
        for ((route, status), n) in self.requests.lock().expect("metrics lock").iter() {
            out.sample("quiver_requests_total", &[("route", route), ("status", status)], n);
        }
        let route: &dyn std::fmt::Display = &"/get-online-features";
        out.histogram("quiver_request_seconds", "Time to answer /get-online-features.", &[("route", route)], &self.latency);
        out.counter("quiver_store_errors_total", "Online store calls that failed.", &self.store_errors);
        out.family("quiver_limit_refusals_total", Kind::Counter, "Requests and connections refused by a limit (SPEC 13).");
        for (limit, n) in Limit::ALL.iter().zip(&self.refusals) {
            out.sample("quiver_limit_refusals_total", &[("limit", &limit.as_str())], n.load(Ordering::Relaxed));
        }
        out.gauge("quiver_connections_open", "Connections open now.", self.connections.load(Ordering::Relaxed));
    }
}
