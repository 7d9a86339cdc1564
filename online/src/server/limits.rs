//! The bounds the server enforces, and the names `/metrics` counts their refusals by.

use std::time::Duration;

/// The bounds the server enforces (docs/limits.md; `server:` and `max_future_skew` in
/// `quiver.yaml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Entity rows x features above which `/get-online-features` answers 413.
    pub max_cells: usize,
    /// Headers, and then the body, must arrive within this.
    pub request_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// How far after the server's clock a pushed event time may be, microseconds.
    pub max_future_skew_us: i64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::of(
            &quiver_sdk::config::ServerConfig::new("127.0.0.1", 0),
            Duration::from_secs(quiver_sdk::config::DEFAULT_MAX_FUTURE_SKEW_SECS),
        )
    }
}

impl Limits {
    /// The limits of a server config, with the project's `max_future_skew`.
    pub fn of(server: &quiver_sdk::config::ServerConfig, max_future_skew: Duration) -> Limits {
        Limits {
            max_cells: server.max_cells,
            request_timeout: server.request_timeout,
            max_connections: server.max_connections,
            max_future_skew_us: i64::try_from(max_future_skew.as_micros()).unwrap_or(i64::MAX),
        }
    }
}

/// The limits whose refusals `/metrics` counts (`quiver_limit_refusals_total{limit}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    MaxCells,
    MaxEntityRows,
    MaxBody,
    RequestTimeout,
    MaxConnections,
    MaxFutureSkew,
}

impl Limit {
    pub(super) const ALL: [Limit; 6] =
        [Limit::MaxCells, Limit::MaxEntityRows, Limit::MaxBody, Limit::RequestTimeout, Limit::MaxConnections, Limit::MaxFutureSkew];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Limit::MaxCells => "max_cells",
            Limit::MaxEntityRows => "max_entity_rows",
            Limit::MaxBody => "max_body_bytes",
            Limit::RequestTimeout => "request_timeout",
            Limit::MaxConnections => "max_connections",
            Limit::MaxFutureSkew => "max_future_skew",
        }
    }
}
