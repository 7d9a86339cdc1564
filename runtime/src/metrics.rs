//! Prometheus text exposition (format 0.0.4), the one renderer of the server's, the
//! serving log's and the stream's `/metrics`, and the latency histogram they share.

use std::fmt::{Display, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// A metrics page, written one family at a time.
#[derive(Debug, Default)]
pub struct Exposition(String);

/// A family's kind, for its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts the family `name`: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {}", kind.as_str());
        self
    }

    /// One sample line: `name{label="value",...} value` (no braces without labels).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &dyn Display)], value: impl Display) -> &mut Self {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (label, v)) in labels.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let _ = write!(self.0, "{sep}{label}=\"{v}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
        self
    }

    /// A family of one unlabelled counter.
    pub fn counter(&mut self, name: &str, help: &str, value: &AtomicU64) -> &mut Self {
        self.family(name, Kind::Counter, help).sample(name, &[], value.load(Ordering::Relaxed))
    }

    /// A family of one unlabelled gauge.
    pub fn gauge(&mut self, name: &str, help: &str, value: impl Display) -> &mut Self {
        self.family(name, Kind::Gauge, help).sample(name, &[], value)
    }

    /// A histogram family: cumulative buckets, `+Inf`, sum and count, each sample with
    /// `labels` besides `le`.
    pub fn histogram<B: Buckets>(&mut self, name: &str, help: &str, labels: &[(&str, &dyn Display)], h: &Histogram<B>) -> &mut Self {
        self.family(name, Kind::Histogram, help);
        self.histogram_samples(name, labels, h)
    }

    /// The samples of one more label set of the histogram family `name` (after
    /// [`Exposition::histogram`] started it).
    pub fn histogram_samples<B: Buckets>(&mut self, name: &str, labels: &[(&str, &dyn Display)], h: &Histogram<B>) -> &mut Self {
        let bucket = format!("{name}_bucket");
        for (bound, n) in B::BOUNDS.iter().zip(&h.buckets) {
            let mut with_le = labels.to_vec();
            with_le.push(("le", bound));
            self.sample(&bucket, &with_le, n.load(Ordering::Relaxed));
        }
        let count = h.count.load(Ordering::Relaxed);
        let mut with_le = labels.to_vec();
        with_le.push(("le", &"+Inf"));
        self.sample(&bucket, &with_le, count);
        self.sample(&format!("{name}_sum"), labels, h.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        self.sample(&format!("{name}_count"), labels, count)
    }

    pub fn finish(self) -> String {
        self.0
    }
}

/// A histogram's bucket bounds (seconds, ascending), as a type, so a histogram is
/// `Default` and a struct of counters can derive it.
pub trait Buckets {
    const BOUNDS: &'static [f64];
}

/// A latency histogram in seconds with the bounds of `B`, updated without locks.
#[derive(Debug)]
pub struct Histogram<B> {
    buckets: Vec<AtomicU64>,
    sum_us: AtomicU64,
    count: AtomicU64,
    bounds: std::marker::PhantomData<B>,
}

impl<B: Buckets> Default for Histogram<B> {
    fn default() -> Self {
        Histogram {
            buckets: B::BOUNDS.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
            bounds: std::marker::PhantomData,
        }
    }
}

impl<B: Buckets> Histogram<B> {
    /// One observation of `seconds` (negative counts as 0).
    pub fn observe(&self, seconds: f64) {
        let seconds = seconds.max(0.0);
        for (bound, n) in B::BOUNDS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_us.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_text_format() {
        let requests = AtomicU64::new(3);
        struct Two;
        impl Buckets for Two {
            const BOUNDS: &'static [f64] = &[0.001, 0.01];
        }
        let h = Histogram::<Two>::default();
        h.observe(0.0005);
        h.observe(0.005);
        h.observe(2.0);
        let mut out = Exposition::new();
        out.counter("a_total", "As.", &requests).gauge("b", "B now.", 7);
        out.family("c_total", Kind::Counter, "Cs.").sample("c_total", &[("route", &"/x"), ("status", &200)], 4);
        out.histogram("d_seconds", "Ds.", &[("route", &"/x")], &h);
        assert_eq!(
            out.finish(),
            "# HELP a_total As.\n# TYPE a_total counter\na_total 3\n\
             # HELP b B now.\n# TYPE b gauge\nb 7\n\
             # HELP c_total Cs.\n# TYPE c_total counter\nc_total{route=\"/x\",status=\"200\"} 4\n\
             # HELP d_seconds Ds.\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{route=\"/x\",le=\"0.001\"} 1\nd_seconds_bucket{route=\"/x\",le=\"0.01\"} 2\n\
             d_seconds_bucket{route=\"/x\",le=\"+Inf\"} 3\nd_seconds_sum{route=\"/x\"} 2.0055\nd_seconds_count{route=\"/x\"} 3\n"
        );
    }
}

/// The process's lineage events (docs/lineage.md): delivered, failed (refused by the
/// endpoint, or unanswered after the retries), and dropped (the queue full, or still
/// queued when the process ended). One set per process, whatever its jobs.
#[derive(Debug, Default)]
pub struct LineageEvents {
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub dropped: AtomicU64,
}

/// Every lineage transport counts here; `/metrics` pages render it.
pub static LINEAGE_EVENTS: LineageEvents = LineageEvents { sent: AtomicU64::new(0), failed: AtomicU64::new(0), dropped: AtomicU64::new(0) };

impl LineageEvents {
    /// `quiver_lineage_events_total{outcome=...}`.
    pub fn render(&self, out: &mut Exposition) {
        out.family(
            "quiver_lineage_events_total",
            Kind::Counter,
            "OpenLineage events, by outcome: sent, failed (refused or unanswered after retries), dropped (queue full or left at exit).",
        );
        for (outcome, n) in [("sent", &self.sent), ("failed", &self.failed), ("dropped", &self.dropped)] {
            out.sample("quiver_lineage_events_total", &[("outcome", &outcome)], n.load(Ordering::Relaxed));
        }
    }
}
