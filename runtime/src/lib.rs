//! What Quiver's readers and writers share at run time, below `offline`, `online` and
//! `streaming`, above the definition model (`quiver_sdk`):
//!
//! - [`encoding`]: the online row format (a packed row per entity) and store keys.
//! - [`state`] and [`record`]: windowed aggregations' mergeable partials, the one place
//!   a value is finished from them, and an entity's online record of tiles and events
//!   (docs/aggregations.md). The offline join builds partials from its index over each
//!   entity's events; a lookup merges a record's tiles; both finish through [`state`].
//! - [`rows`]: JSON rows (`/push`, JSON lines, Kafka messages) read as a view's typed rows.
//! - [`arrays`]: values and Arrow arrays, both ways.
//! - [`on_demand`]: an on-demand computation evaluated over the inputs the join and the
//!   lookup supply alike; [`write_time`]: a view's filter and computed features applied
//!   to raw rows by every writer.
//! - [`metrics`]: Prometheus text.
//!
//! Invariant: nothing here talks to a store or the network.

pub mod arrays;
pub mod encoding;
pub mod metrics;
pub mod on_demand;
pub mod record;
pub mod rows;
pub mod state;
pub mod write_time;
