//! The stream's counters and histograms, as Prometheus text.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use quiver_runtime::metrics::{Buckets, Exposition, Histogram, Kind};

/// Upper bounds (seconds) of the event-to-online latency histogram.
const BUCKETS: [f64; 19] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 30.0, 300.0];

/// What `quiver stream` has done since it started.
#[derive(Debug, Default)]
pub struct Metrics {
    pub consumed: AtomicU64,
    pub written_online: AtomicU64,
    pub appended_offline: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Messages at offsets the Delta table already held (a replay after a crash).
    pub skipped_replayed: AtomicU64,
    /// Failed store or broker calls (each retried).
    pub retries: AtomicU64,
    pub batches: AtomicU64,
    /// Batches (per view) refused by Delta because another consumer had appended past
    /// this one's progress (it lost its partitions while holding the batch).
    pub fenced: AtomicU64,
    /// Batches dropped unwritten because the partitions were lost before the flush.
    pub lost_batches: AtomicU64,
    /// Dead letters the dead-letter topic refused whole, sent with the payload cut short.
    pub dead_letters_truncated: AtomicU64,
    /// Registry changes picked up while running.
    pub registry_reloads: AtomicU64,
    /// Registry changes that could not be read (the last good definitions stay).
    pub registry_errors: AtomicU64,
    /// Rows a view's source filter dropped (docs/transformations.md#write-time).
    pub filtered: AtomicU64,
    /// Values a view's write-time expressions could not compute (stored null).
    pub uncomputed: AtomicU64,
    /// (topic, partition) -> messages behind the high watermark.
    pub lag: Mutex<BTreeMap<(String, i32), i64>>,
    freshness: Histogram<Freshness>,
}

/// The event-to-online latency histogram's bounds.
#[derive(Debug)]
struct Freshness;

impl Buckets for Freshness {
    const BOUNDS: &'static [f64] = &BUCKETS;
}

impl Metrics {
    /// One row reached the online store `seconds` after its event time.
    pub fn observe_freshness(&self, seconds: f64) {
        self.freshness.observe(seconds);
    }

    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        for (name, help, v) in [
            ("quiver_stream_consumed_total", "Messages read from Kafka.", &self.consumed),
            ("quiver_stream_written_online_total", "Rows the online store took.", &self.written_online),
            ("quiver_stream_appended_offline_total", "Rows appended to Delta tables.", &self.appended_offline),
            ("quiver_stream_dead_lettered_total", "Messages sent to a dead-letter topic.", &self.dead_lettered),
            ("quiver_stream_skipped_replayed_total", "Replayed messages the Delta table already held.", &self.skipped_replayed),
            ("quiver_stream_retries_total", "Store or broker calls that failed and were retried.", &self.retries),
            ("quiver_stream_batches_total", "Micro-batches committed.", &self.batches),
            (
                "quiver_stream_fenced_total",
                "View batches refused by Delta: another consumer appended these partitions first.",
                &self.fenced,
            ),
            (
                "quiver_stream_lost_batches_total",
                "Batches dropped unwritten: their partitions were lost before the flush.",
                &self.lost_batches,
            ),
            (
                "quiver_stream_dead_letters_truncated_total",
                "Dead letters refused whole by the dead-letter topic, sent with the payload cut short.",
                &self.dead_letters_truncated,
            ),
            ("quiver_stream_registry_reloads_total", "Registry changes picked up while running.", &self.registry_reloads),
            (
                "quiver_stream_registry_errors_total",
                "Registry changes that could not be read (the last good definitions stay).",
                &self.registry_errors,
            ),
            ("quiver_stream_filtered_total", "Rows not written because they fail their view's source filter.", &self.filtered),
            (
                "quiver_stream_uncomputed_total",
                "Values stored null because a write-time expression could not compute them.",
                &self.uncomputed,
            ),
        ] {
            out.counter(name, help, v);
        }
        out.family("quiver_stream_lag", Kind::Gauge, "Messages behind the high watermark, per partition.");
        for ((topic, partition), lag) in self.lag.lock().expect("metrics lock").iter() {
            out.sample("quiver_stream_lag", &[("topic", topic), ("partition", partition)], lag);
        }
        out.histogram("quiver_stream_event_to_online_seconds", "Event time to online write.", &[], &self.freshness);
        quiver_runtime::metrics::LINEAGE_EVENTS.render(&mut out);
        out.finish()
    }
}
