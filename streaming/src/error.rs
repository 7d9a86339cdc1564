//! Streaming's errors.

/// Everything that can go wrong writing fresh rows.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Offline(#[from] quiver_offline::Error),
    #[error(transparent)]
    Online(#[from] quiver_online::Error),
    /// The broker refused or could not be reached.
    #[error("kafka {brokers}: {message}")]
    Kafka { brokers: String, message: String },
    /// Definitions or settings that cannot stream (no stream source, no store).
    #[error("{0}")]
    Config(String),
    /// A push committed its rows offline, then its online write failed.
    #[error(
        "{source}; the rows are in the offline table at version {version}, not online: `quiver materialize-incremental` \
         loads them (pushing them again would append them twice)"
    )]
    OnlineAfterOffline { version: u64, source: Box<Error> },
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> quiver_sdk::ErrorKind {
        match self {
            Error::Offline(e) => e.kind(),
            Error::Online(e) => e.kind(),
            Error::Kafka { .. } => quiver_sdk::ErrorKind::Unavailable,
            Error::Config(_) => quiver_sdk::ErrorKind::Invalid,
            Error::OnlineAfterOffline { source, .. } => source.kind(),
        }
    }
}

/// Streaming's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
