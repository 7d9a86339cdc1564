//! The offline store: one Delta Lake table per feature view, ingestion with schema
//! checks, DataFusion scans and the CPU point-in-time join (SPEC §3).
//!
//! Nothing is implemented here yet; the offline store arrives with its own issue, and
//! until then the CLI verbs that need it (`ingest`, `historical`, `export`) refuse with a
//! "not available yet" error instead of pretending.
