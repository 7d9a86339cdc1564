//! The root package's integration tests, one binary of modules (one link of DataFusion,
//! deltalake and Ballista instead of one per file). `common` holds the fixtures every
//! module uses: the command runner that clears `QUIVER_*`, the demo repository, the
//! services `./run test` starts, Parquet writers.
//!
//! Run one module with `cargo test --test it cli::`, one test by its path.

mod abuse;
mod aggregations;
mod cli;
mod cluster;
mod common;
mod export;
mod feast_sdk;
mod lineage;
mod made_spines;
mod materialize_incremental;
mod monitor;
mod non_finite;
mod object_store;
mod on_demand;
mod online_consistency;
mod online_requests;
mod push;
mod redis_cluster;
mod stream;
mod ui;
mod verify;
mod versions;
mod write_time;
