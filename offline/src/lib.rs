//! The offline store: one Delta Lake table per feature view, ingestion with schema
//! checks, DataFusion scans and the CPU point-in-time join (docs/offline.md).
//!
//! - [`delta`]: locating, opening and creating the views' tables; [`DeltaProbe`] tells
//!   `apply` which views hold data.
//! - [`schema`]: a view's table schema (keys, times, features, the ingestion-order
//!   column).
//! - [`input`]: reading Parquet/CSV/JSON lines and conforming columns to a view.
//! - [`ingest`]: one file, one Delta commit, all or nothing.
//! - [`backfill`]: a view version's rows derived from an earlier version's.
//! - [`keys`]: dense entity ids for the as-of kernel.
//! - [`historical`]: scans, the kernel (`quiver-gpu-join`'s [`AsOfKernel`] trait),
//!   the gather, Parquet output.
//!
//! [`AsOfKernel`]: quiver_gpu_join::AsOfKernel

pub mod append_table;
pub mod backfill;
pub mod delta;
pub mod error;
pub mod historical;
pub mod ingest;
pub mod input;
pub mod keys;
pub mod schema;

pub use delta::DeltaProbe;
pub use error::{Error, Result};
