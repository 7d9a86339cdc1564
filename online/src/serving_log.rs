//! What `/get-online-features` answered, handed to a [`ServingLog`] after the answer
//! is written, so logging costs the request a move into a queue. The serving log itself
//! (its table, rows, writer and reader) is `quiver::serving_log`, above this crate,
//! which knows no Delta.

use std::sync::Arc;

use quiver_sdk::FeatureRef;
use quiver_sdk::registry::Registered;

use crate::lookup::Column;

/// One answered request.
#[derive(Debug, Clone)]
pub struct Served {
    /// The time the lookup was answered at (UTC microseconds): the `now` its TTLs used.
    pub request_time: i64,
    /// The definitions it was answered from.
    pub defs: Arc<Registered>,
    /// The features asked for, in answer order.
    pub refs: Vec<FeatureRef>,
    /// The answer: `n_keys` join-key columns, then one column per ref.
    pub columns: Vec<Column>,
    pub n_keys: usize,
    /// The request fields of the on-demand features asked for, as given.
    pub fields: crate::lookup::RequestFields,
}

/// Where the server hands answered requests. `log` must not block: a sink that cannot
/// keep up drops the record and counts it.
pub trait ServingLog: Send + Sync {
    fn log(&self, served: Served);
    /// Its families for `/metrics`.
    fn render_metrics(&self, _out: &mut quiver_runtime::metrics::Exposition) {}
    /// Those families alone, as Prometheus text.
    fn metrics_text(&self) -> String {
        let mut out = quiver_runtime::metrics::Exposition::new();
        self.render_metrics(&mut out);
        out.finish()
    }
}
