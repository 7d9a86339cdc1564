//! Quiver's definition model: the types every other crate speaks, and nothing else.
//!
//! - [`definitions`]: entities, sources, feature views and services (docs/concepts.md), and the
//!   Rust builder API; [`on_demand`] and [`write_time`] expressions and [`aggregation`]s as
//!   data, [`monitoring`] thresholds as data.
//! - [`yaml`]: `features.yaml` in, validated [`Definitions`] out.
//! - [`validate`](Definitions::validate): one validation for every way of writing
//!   definitions.
//! - [`registry`]: the versioned registry document, the plan/apply diff and its atomic
//!   file store.
//! - [`config`]: `quiver.yaml` with environment overrides.
//! - [`files`]: atomic, durable small-file writes and the apply lock.
//!
//! Invariant: the sdk never talks to a store or the network, and evaluates nothing: it
//! compiles expressions only to type-check them. Its only I/O is reading and writing the
//! repository's own small files (`quiver.yaml`, `features.yaml`, the registry). What the
//! readers and writers share at run time (row and record formats, expression
//! evaluation) is `quiver_runtime`.
//!
//! ```
//! use quiver_sdk::{DType, Definitions, Entity, FeatureService, FeatureView, KeyType, Ttl};
//! let defs = Definitions::default()
//!     .with_entity(Entity::new("driver").with_join_key("driver_id", KeyType::Int64))
//!     .with_feature_view(
//!         FeatureView::new("driver_hourly")
//!             .with_entity("driver")
//!             .with_ttl(Ttl::parse("2h").unwrap())
//!             .with_feature("conv_rate", DType::Float64),
//!     )
//!     .with_feature_service(FeatureService::new("ranker").with_feature("driver_hourly", "conv_rate"));
//! defs.validate().unwrap();
//! ```

pub mod aggregation;
pub mod config;
pub mod definitions;
pub mod error;
pub mod files;
pub mod monitoring;
pub mod on_demand;
pub mod registry;
pub mod types;
mod validate;
pub mod write_time;
pub mod yaml;

pub use aggregation::{AggFunction, Aggregation};
pub use config::{Config, OnlineStoreConfig, StorageOptions, StoreLocation};
pub use definitions::{
    Definitions, Entity, Feature, FeatureRef, FeatureService, FeatureView, Found, JoinKey, NotFound, OnDemandFeature, OnDemandView, Source,
    StreamFormat, StreamSource, known,
};
pub use error::{DefinitionError, Error, ErrorKind, Result};
pub use registry::{DataProbe, FileRegistry, Plan, RegistryDoc};
pub use types::{DType, KeyType, ListElement, Timestamp, Ttl, timestamp_arrow_type};
