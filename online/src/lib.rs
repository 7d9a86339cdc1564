//! The online store: each entity's latest feature row per view (docs/online.md), behind the
//! [`OnlineStore`] trait, with implementations that behave identically — Redis
//! ([`RedisStore`]), Redis Cluster ([`RedisClusterStore`]) and an embedded single-file
//! store ([`EmbeddedStore`]) — proven by one shared test suite run against each.
//!
//! Stores hold packed rows ([`quiver_runtime::encoding`]) under store keys, and apply the
//! guarded write: a row replaces the stored one unless the stored one has a greater
//! (event_ts, created_ts). Materialization, streaming and `/push` all write through it,
//! so replays are idempotent.
//!
//! [`lookup`] answers online requests with docs/online.md statuses; [`server`] serves them over
//! HTTP in Feast's wire shape (only this crate knows HTTP and JSON shapes).

mod embedded;
mod error;
pub mod listen;
pub mod lookup;
mod redis_cluster;
mod redis_store;
pub mod server;
pub mod serving_log;
mod store;

pub use embedded::EmbeddedStore;
pub use error::{Error, Result};
pub use redis_cluster::RedisClusterStore;
pub use redis_store::RedisStore;
pub use store::{OnlineStore, WriteRow, open_store, view_prefix};
