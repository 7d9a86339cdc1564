//! The offline store's errors; each names the table, file, row or field it is about.

use std::path::PathBuf;

/// Everything that can go wrong in the offline store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The causes are fields, not `source`s: the message already says them, and the
    // printed error chain (`{:#}`) would say them twice.
    #[error("delta table {table}: {error}")]
    Delta {
        table: String,
        /// Boxed, as is a query's: the two are most of the enum's size otherwise.
        error: Box<deltalake::DeltaTableError>,
    },
    #[error("delta table {table}: bad location: {message}")]
    Location { table: String, message: String },
    /// Bad user input: a file (or a table, a request) that cannot be read or does not fit
    /// the view; `what` names it.
    #[error("{what}: {message}")]
    Input { what: String, message: String },
    /// A request that does not fit the registry (a spine without a needed key, a
    /// feature asked for twice).
    #[error("{0}")]
    Request(String),
    /// An unknown feature view, feature or service.
    #[error("{0}")]
    NotFound(String),
    #[error("query of {table}: {error}")]
    Query { table: String, error: Box<datafusion::error::DataFusionError> },
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("writing {file}: {message}", file = file.display())]
    Output { file: PathBuf, message: String },
    #[error(transparent)]
    Kernel(#[from] quiver_gpu_join::KernelError),
    /// Another writer recorded progress in the table since this one read it: the
    /// append was refused and nothing written.
    #[error("delta table {table}: `{app}` is at version {recorded:?}, expected {expected:?}: another writer took over; nothing appended")]
    Fenced { table: String, app: String, expected: Option<i64>, recorded: Option<i64> },
    /// A join on a Ballista cluster that could not be run, or whose answer did not add
    /// up (never returned as a result).
    #[error("cluster {cluster}: {message}")]
    Cluster { cluster: String, message: String },
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> quiver_sdk::ErrorKind {
        use quiver_sdk::ErrorKind as K;
        match self {
            Error::Input { .. } | Error::Request(_) => K::Invalid,
            Error::NotFound(_) => K::NotFound,
            Error::Delta { error, .. } if matches!(**error, deltalake::DeltaTableError::InvalidTableLocation(_)) => K::Invalid,
            Error::Delta { .. } | Error::Location { .. } | Error::Cluster { .. } => K::Unavailable,
            Error::Fenced { .. } => K::Conflict,
            Error::Kernel(quiver_gpu_join::KernelError::BadInput(_)) => K::Invalid,
            // A device that ran out of memory or a driver that failed: try the CPU or later.
            Error::Kernel(quiver_gpu_join::KernelError::Engine { .. }) => K::Unavailable,
            Error::Query { .. } | Error::Arrow(_) | Error::Output { .. } => K::Internal,
        }
    }

    /// Input that does not fit, named by `what` (a file's `path.display()`, or a label).
    pub(crate) fn input(what: impl std::fmt::Display, message: impl Into<String>) -> Self {
        Error::Input { what: what.to_string(), message: message.into() }
    }

    pub(crate) fn delta(table: impl std::fmt::Display, source: deltalake::DeltaTableError) -> Self {
        Error::Delta { table: table.to_string(), error: Box::new(source) }
    }

    pub fn query(table: impl std::fmt::Display, source: datafusion::error::DataFusionError) -> Self {
        Error::Query { table: table.to_string(), error: Box::new(source) }
    }
}

/// The offline store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
