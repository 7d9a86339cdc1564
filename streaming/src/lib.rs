//! Streaming ingestion: Kafka consumption into both stores, push ingestion, dead-letter
//! handling and exactly-once Delta writes (SPEC §7).
//!
//! Nothing is implemented here yet; until it is, `stream` and `push` refuse with a
//! "not available yet" error.
