//! The offline crate's integration tests, one binary of modules: the differential tests
//! of the point-in-time join and of the windowed aggregations against row-by-row
//! oracles, and a table kept open across other writers' commits. `common` holds the
//! helpers they share.

mod agg_oracle;
mod common;
mod open_table;
mod pit_oracle;
