//! Streaming ingestion (docs/streaming.md): fresh rows into both stores through one write path.
//!
//! - [`write`]: the shared write path — typed rows or files to the online store
//!   (guarded write) and to the view's Delta table (the `ingest` append, optionally with
//!   Delta `txn` actions); `quiver push`, the server's `/push` and materialization use it.
//! - [`consumer`]: `quiver stream`, Kafka topics into both stores in micro-batches,
//!   exactly once into Delta, dead letters to `<topic>.dlq`.
//! - [`metrics`]: the stream's counters and histograms as Prometheus text.
//!
//! Messages and pushed rows are read by [`quiver_runtime::rows`], the same strict reader
//! JSON-lines ingest uses.

pub mod consumer;
mod error;
pub mod metrics;
pub mod write;

pub use consumer::{Event, Hooks, StreamOptions, StreamReport, run};
pub use error::{Error, Result};
pub use metrics::Metrics;
pub use write::{PushReport, Target};
