//! The stream's counters and histograms, as Prometheus text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (seconds) of the event-to-online latency histogram.
const BUCKETS: [f64; 19] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 30.0, 300.0,
];

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
    /// (topic, partition) -> messages behind the high watermark.
    pub lag: Mutex<BTreeMap<(String, i32), i64>>,
    buckets: [AtomicU64; 19],
    latency_sum_us: AtomicU64,
    latency_count: AtomicU64,
}

impl Metrics {
    /// One row reached the online store `seconds` after its event time.
    pub fn observe_freshness(&self, seconds: f64) {
        let seconds = seconds.max(0.0);
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_sum_us.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        };
        counter(&mut out, "quiver_stream_consumed_total", "Messages read from Kafka.", &self.consumed);
        counter(&mut out, "quiver_stream_written_online_total", "Rows the online store took.", &self.written_online);
        counter(&mut out, "quiver_stream_appended_offline_total", "Rows appended to Delta tables.", &self.appended_offline);
        counter(&mut out, "quiver_stream_dead_lettered_total", "Messages sent to a dead-letter topic.", &self.dead_lettered);
        counter(&mut out, "quiver_stream_skipped_replayed_total", "Replayed messages the Delta table already held.", &self.skipped_replayed);
        counter(&mut out, "quiver_stream_retries_total", "Store or broker calls that failed and were retried.", &self.retries);
        counter(&mut out, "quiver_stream_batches_total", "Micro-batches committed.", &self.batches);
        counter(&mut out, "quiver_stream_fenced_total", "View batches refused by Delta: another consumer appended these partitions first.", &self.fenced);
        counter(&mut out, "quiver_stream_lost_batches_total", "Batches dropped unwritten: their partitions were lost before the flush.", &self.lost_batches);
        counter(&mut out, "quiver_stream_dead_letters_truncated_total", "Dead letters refused whole by the dead-letter topic, sent with the payload cut short.", &self.dead_letters_truncated);
        counter(&mut out, "quiver_stream_registry_reloads_total", "Registry changes picked up while running.", &self.registry_reloads);
        counter(&mut out, "quiver_stream_registry_errors_total", "Registry changes that could not be read (the last good definitions stay).", &self.registry_errors);
        let _ = writeln!(out, "# HELP quiver_stream_lag Messages behind the high watermark, per partition.\n# TYPE quiver_stream_lag gauge");
        for ((topic, partition), lag) in self.lag.lock().expect("metrics lock").iter() {
            let _ = writeln!(out, "quiver_stream_lag{{topic=\"{topic}\",partition=\"{partition}\"}} {lag}");
        }
        let name = "quiver_stream_event_to_online_seconds";
        let _ = writeln!(out, "# HELP {name} Event time to online write.\n# TYPE {name} histogram");
        for (i, bound) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", self.buckets[i].load(Ordering::Relaxed));
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}
