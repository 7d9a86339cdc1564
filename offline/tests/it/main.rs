//! The offline crate's integration tests, one binary of modules: the differential tests
//! of the point-in-time join and of the windowed aggregations against row-by-row
//! oracles, a table kept open across other writers' commits, two writers of one
//! append-only table, and the event cache
//! against fresh reads of the table. `common` holds the
//! helpers they share.

mod agg_oracle;
mod append_table;
mod common;
mod event_cache;
mod open_table;
mod pit_oracle;
