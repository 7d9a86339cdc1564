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
    #[error("{path}: {message}", path = path.display())]
    Init { path: PathBuf, message: String },
    #[error("{path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}: {source}", path = path.display())]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
