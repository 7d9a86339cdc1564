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
pub mod error;
pub mod export;
pub mod init;
pub mod insights;
pub mod materialize;
pub mod ops;
pub mod repo;
pub mod server;
pub mod serving_log;
pub mod verify;

pub use error::{Error, Result};
pub use quiver_gpu_join as gpu_join;
pub use quiver_offline as offline;
pub use quiver_online as online;
pub use quiver_sdk as sdk;
pub use quiver_streaming as streaming;
pub use repo::Repo;
