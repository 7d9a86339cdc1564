//! The online store's errors.

/// Everything that can go wrong in the online store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store cannot be reached or answered with an error (HTTP 503 material).
    #[error("online store {store}: {message}")]
    Unavailable { store: String, message: String },
    /// A request that does not fit the registry (HTTP 400 material).
    #[error("{0}")]
    Request(String),
    /// An unknown feature view or feature.
    #[error("{0}")]
    NotFound(String),
    /// A request over one of the bounds every lookup is held to (`bound`: the setting
    /// or constant, as the server's refusal metric names it).
    #[error("{message}")]
    TooLarge { bound: &'static str, message: String },
    /// The store is set up in a way that would break the guarded write (Redis evicting
    /// keys without expiry).
    #[error("online store {store}: {message}")]
    Misconfigured { store: String, message: String },
    /// The store's file or data is unusable.
    #[error("online store {store}: {message}")]
    Corrupt { store: String, message: String },
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> quiver_sdk::ErrorKind {
        use quiver_sdk::ErrorKind as K;
        match self {
            Error::Unavailable { .. } => K::Unavailable,
            Error::Request(_) | Error::TooLarge { .. } | Error::Misconfigured { .. } => K::Invalid,
            Error::NotFound(_) => K::NotFound,
            Error::Corrupt { .. } => K::Internal,
        }
    }
}

/// The online store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
