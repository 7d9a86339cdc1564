//! Quiver: a feature store. This facade wires the crates together — the definition layer
//! (`quiver-sdk`), the offline store (`quiver-offline`), the online store
//! (`quiver-online`), streaming (`quiver-streaming`) and the GPU join
//! (`quiver-gpu-join`) — and holds what needs more than one of them: opening a
//! repository, `init`, the demo repository, and [`ops`]: every operation on a
//! repository, once, as a builder on [`Repo`]. The `quiver` binary, the Python
//! extension and the examples are thin front ends over [`ops`].
//!
//! Nothing depends on this crate; it depends on all of them.

pub mod demo;
mod error;
mod export;
mod init;
mod insights;
pub mod lineage;
mod materialize;
mod monitor;
pub mod ops;
mod repo;
mod reports;
mod server;
mod serving_log;
mod spine;
mod verify;

pub use error::{Error, Result};
pub use export::{Exported, Manifest, ManifestFeature, Shard, ShardFormat, SpineInfo};
pub use init::{init, project_name};
pub use materialize::ViewReport;
pub use monitor::profile::{Profile, ProfileDoc};
pub use monitor::{Counts, FeatureDrift, Kind, MonitorReport, Rates, Statistic, Window};
pub use quiver_gpu_join as gpu_join;
pub use quiver_offline as offline;
pub use quiver_online as online;
pub use quiver_runtime as runtime;
pub use quiver_sdk as sdk;
pub use quiver_streaming as streaming;
pub use repo::{Applied, DEFINITIONS_FILE, Repo};
pub use verify::{FeatureReport, LogReport};
