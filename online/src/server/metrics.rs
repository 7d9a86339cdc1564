//! The server's counters and latency histogram, as Prometheus text.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quiver_runtime::metrics::{Buckets, Exposition, Histogram, Kind};

use super::limits::Limit;

/// Request counts and latencies, as Prometheus text.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (route, status) -> count.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Latency of /get-online-features.
    latency: Histogram<Latency>,
    pub(super) store_errors: AtomicU64,
    /// On-demand values answered null because they could not be computed.
    uncomputed: AtomicU64,
    /// Pushed rows a view's source filter dropped, and values its write-time
    /// expressions could not compute (docs/transformations.md#write-time).
    push_dropped: AtomicU64,
    push_uncomputed: AtomicU64,
    /// Refusals per [`Limit`], in [`Limit::ALL`] order.
    refusals: [AtomicU64; 6],
    connections: AtomicU64,
    /// Per phase of /get-online-features, in [`PHASES`] order.
    phases: [Histogram<Phase>; 5],
}

/// The phases of a `/get-online-features` answer: the request parsed and checked, the
/// features resolved and the store keys built, the store's round trip, the stored rows
/// decoded (without a serving log: each value written as JSON as it is decoded), the
/// JSON answer put together. (What remains of
/// `quiver_request_seconds` is reading the body and the middleware; the socket write
/// comes after the handler and shows only in the client's latency.)
pub const PHASES: [&str; 5] = ["parse", "keys", "store", "decode", "encode"];

/// Finer bounds for phases: 5 µs to 10 ms.
#[derive(Debug)]
struct Phase;

impl Buckets for Phase {
    const BOUNDS: &'static [f64] = &[0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01];
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

    /// The phases of one answered `/get-online-features`.
    pub(super) fn phases(&self, parse: Duration, lookup: &crate::lookup::LookupPhases) {
        for (h, d) in self.phases.iter().zip([parse, lookup.keys, lookup.store, lookup.decode, lookup.encode]) {
            h.observe(d.as_secs_f64());
        }
        if lookup.uncomputed > 0 {
            self.uncomputed.fetch_add(lookup.uncomputed, Ordering::Relaxed);
        }
    }

    /// What one `/push`'s write-time expressions did.
    pub(super) fn pushed(&self, dropped: usize, uncomputed: u64) {
        self.push_dropped.fetch_add(dropped as u64, Ordering::Relaxed);
        self.push_uncomputed.fetch_add(uncomputed, Ordering::Relaxed);
    }

    pub(super) fn record(&self, route: &'static str, status: u16, elapsed: Duration) {
        *self.requests.lock().expect("metrics lock").entry((route, status)).or_default() += 1;
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
        for (i, (phase, h)) in PHASES.iter().zip(&self.phases).enumerate() {
            let labels: [(&str, &dyn std::fmt::Display); 1] = [("phase", phase)];
            if i == 0 {
                out.histogram(
                    "quiver_request_phase_seconds",
                    "Time per phase of /get-online-features (parse, keys, store, decode, encode).",
                    &labels,
                    h,
                );
            } else {
                out.histogram_samples("quiver_request_phase_seconds", &labels, h);
            }
        }
        out.counter("quiver_store_errors_total", "Online store calls that failed.", &self.store_errors);
        out.counter(
            "quiver_on_demand_uncomputed_total",
            "On-demand values answered null because they could not be computed (division by zero, overflow, an invalid cast).",
            &self.uncomputed,
        );
        out.counter(
            "quiver_push_rows_dropped_total",
            "Pushed rows not written because they fail their view's source filter.",
            &self.push_dropped,
        );
        out.counter(
            "quiver_push_uncomputed_total",
            "Pushed values stored null because a write-time expression could not compute them.",
            &self.push_uncomputed,
        );
        out.family("quiver_limit_refusals_total", Kind::Counter, "Requests and connections refused by a limit (docs/limits.md).");
        for (limit, n) in Limit::ALL.iter().zip(&self.refusals) {
            out.sample("quiver_limit_refusals_total", &[("limit", &limit.as_str())], n.load(Ordering::Relaxed));
        }
        out.gauge("quiver_connections_open", "Connections open now.", self.connections.load(Ordering::Relaxed));
    }
}
