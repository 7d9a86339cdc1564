//! The facade's error: the crates' errors, plus the few of its own.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Sdk(#[from] quiver_sdk::Error),
    #[error(transparent)]
    Offline(#[from] quiver_offline::Error),
    #[error(transparent)]
    Online(#[from] quiver_online::Error),
    #[error(transparent)]
    Streaming(#[from] quiver_streaming::Error),
    /// Bad input to an operation (a time argument, a reference, a setting).
    #[error("{0}")]
    Invalid(String),
    /// An unknown view, feature or service.
    #[error("{0}")]
    NotFound(String),
    /// A join engine that cannot run here (`--engine gpu` without a GPU).
    #[error("{0}")]
    Engine(String),
    /// The feature server could not bind, failed for good, or its serving log could not
    /// be written.
    #[error("{0}")]
    Serving(String),
    #[error("{path}: {message}", path = path.display())]
    Init { path: PathBuf, message: String },
    // The causes below are fields, not `source`s: the message already says them, and
    // the printed error chain (`{:#}`) would say them twice.
    #[error("{path}: {error}", path = path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("writing {path}: {error}", path = path.display())]
    Parquet { path: PathBuf, error: parquet::errors::ParquetError },
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

impl Error {
    /// What kind of failure this is, looking through the crates' errors: the one thing
    /// the CLI, the server and Python map.
    pub fn kind(&self) -> quiver_sdk::ErrorKind {
        use quiver_sdk::ErrorKind as K;
        match self {
            Error::Sdk(e) => e.kind(),
            Error::Offline(e) => e.kind(),
            Error::Online(e) => e.kind(),
            Error::Streaming(e) => e.kind(),
            Error::Invalid(_) | Error::Engine(_) | Error::Init { .. } => K::Invalid,
            Error::NotFound(_) => K::NotFound,
            Error::Serving(_) => K::Unavailable,
            Error::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound => K::NotFound,
            Error::Io { .. } | Error::Parquet { .. } | Error::Arrow(_) => K::Internal,
        }
    }

    /// The kind of `cause` when it is one of Quiver's errors (this crate's or a lower
    /// crate's); front ends walk an error's chain with it to pick what they answer (the
    /// CLI's exit code, Python's exception class).
    pub fn kind_of(cause: &(dyn std::error::Error + 'static)) -> Option<quiver_sdk::ErrorKind> {
        if let Some(e) = cause.downcast_ref::<Error>() {
            Some(e.kind())
        } else if let Some(e) = cause.downcast_ref::<quiver_sdk::Error>() {
            Some(e.kind())
        } else if let Some(e) = cause.downcast_ref::<quiver_offline::Error>() {
            Some(e.kind())
        } else if let Some(e) = cause.downcast_ref::<quiver_online::Error>() {
            Some(e.kind())
        } else {
            cause.downcast_ref::<quiver_streaming::Error>().map(quiver_streaming::Error::kind)
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), error: source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
