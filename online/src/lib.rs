//! The online store: the `OnlineStore` trait, the Redis and embedded stores,
//! materialization from the offline store, and the HTTP feature server (SPEC §4, §6).
//!
//! Nothing is implemented here yet; until it is, the CLI verbs that need it
//! (`materialize`, `online`, `serve`) refuse with a "not available yet" error.
