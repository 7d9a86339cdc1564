//! The sdk's errors. Messages are lowercase, one line, and name the file, definition or
//! field and what was expected.

use std::fmt;
use std::path::PathBuf;

/// A definition that fails validation, or a YAML document that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    #[error("{kind} `{name}`: bad name: {reason}")]
    BadName { kind: &'static str, name: String, reason: &'static str },
    #[error("duplicate {kind} `{name}`{scope}")]
    Duplicate {
        kind: &'static str,
        name: String,
        /// Empty, or ` in feature view `x`` and the like.
        scope: String,
    },
    #[error("entity `{entity}`: no join keys (expected at least one)")]
    NoJoinKeys { entity: String },
    #[error("feature view `{view}`: no {what} (expected at least one)")]
    EmptyView { view: String, what: &'static str },
    #[error("feature service `{service}`: no features (expected at least one `view:feature`)")]
    EmptyService { service: String },
    #[error("feature view `{view}`: unknown entity `{entity}` (known: {known})")]
    UnknownEntity { view: String, entity: String, known: String },
    #[error("feature service `{service}`: unknown feature view `{view}` (known: {known})")]
    UnknownView { service: String, view: String, known: String },
    /// A reference to a version of a view that is not live (docs/versions.md); `by`
    /// names the service or on-demand view.
    #[error("{by}: {reason}")]
    UnknownVersion { by: String, reason: String },
    #[error("feature service `{service}`: unknown feature `{reference}` (feature view `{view}` has: {known})")]
    UnknownFeature { service: String, reference: String, view: String, known: String },
    #[error("feature service `{service}`: {}", BadFeatureRef(got.clone()))]
    BadFeatureRef { service: String, got: String },
    #[error("feature view `{view}`, feature `{feature}`: unknown dtype `{got}` (expected one of {expected})")]
    BadDtype { view: String, feature: String, got: String, expected: &'static str },
    #[error("entity `{entity}`, join key `{key}`: unknown dtype `{got}` (expected int64 or string)")]
    BadKeyType { entity: String, key: String, got: String },
    #[error("feature view `{view}`: bad ttl `{got}`: {reason} (expected e.g. 30s, 15m, 2h, 7d, 1h30m, or 0 for unbounded)")]
    BadTtl { view: String, got: String, reason: String },
    #[error(
        "join key `{key}` is {first_type} in entity `{first_entity}` but {dtype} in entity `{entity}` (a join key has one type everywhere)"
    )]
    KeyTypeClash { key: String, first_entity: String, first_type: String, entity: String, dtype: String },
    #[error("feature view `{view}`: column `{column}` {reason}")]
    ColumnClash { view: String, column: String, reason: &'static str },
    #[error("feature view `{view}`: ttl does not apply to a view with aggregations (each window bounds what it counts); remove it")]
    EventLogTtl { view: String },
    #[error("feature view `{view}`, aggregation `{aggregation}`: {reason}")]
    BadAggregation { view: String, aggregation: String, reason: String },
    #[error("feature view `{view}`: stream topic is empty (expected a Kafka topic name)")]
    EmptyTopic { view: String },
    #[error("feature views `{first}` and `{second}` use the same table {table} (each view needs its own)")]
    SharedTable { first: String, second: String, table: String },
    #[error("feature view `{second}`'s table {table} is inside feature view `{first}`'s table (each view needs a folder of its own)")]
    NestedTable { first: String, second: String, table: String },
    #[error(
        "feature view `{view}` uses the serving log's table {table} (serving_log.path in quiver.yaml; name the view or its source.path otherwise)"
    )]
    ServingLogTable { view: String, table: String },
    #[error("on-demand view `{view}`: {reason}")]
    OnDemand { view: String, reason: String },
    #[error("on-demand view `{view}`, feature `{feature}`: `{expr}`: {reason}")]
    BadExpression { view: String, feature: String, expr: String, reason: String },
    #[error("feature view `{view}`: {reason}")]
    WriteTime { view: String, reason: String },
    /// A write-time expression refused; `what` is ``feature `x` `` or `source filter`.
    #[error("feature view `{view}`, {what}: `{expr}`: {reason}")]
    BadWriteExpression { view: String, what: String, expr: String, reason: String },
    /// Monitoring thresholds refused; `what` is ``feature view `x` `` and the like.
    #[error("{what}: {reason}")]
    Monitoring { what: String, reason: String },
    #[error("{0}")]
    Yaml(String),
    /// A definition given as JSON (from Python) whose shape is wrong, named by what it
    /// defines (`feature view \`rides\``), never by a position in the JSON text.
    #[error("{what}: {reason}")]
    Shape { what: String, reason: String },
    /// `apply --remove` (or Python's `objects_to_delete`) naming what it cannot remove.
    #[error("cannot remove `{name}`: {reason}")]
    BadRemoval { name: String, reason: String },
}

/// What kind of failure an error is: the one thing front ends map (an HTTP status, a
/// Python exception class), so that none of them reads messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Bad input or definitions: fix the request, file or config.
    Invalid,
    /// An unknown repository, view, feature or service.
    NotFound,
    /// A store or broker that cannot be reached or answered with an error.
    Unavailable,
    /// Someone else changed the thing first (a fenced writer, a lock held).
    Conflict,
    /// Everything else: a bug or a damaged file.
    Internal,
}

/// Everything that can go wrong in the sdk.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No `quiver.yaml` where a repository was expected.
    #[error("{file}: not found: not a quiver repository (run `quiver init DIR` or pass --repo DIR)", file = file.display())]
    NoRepository { file: PathBuf },
    /// A definition problem, located in a file (or in builder code when `file` is empty).
    #[error("{}{error}", location(file))]
    Definition {
        file: Option<PathBuf>,
        /// Boxed: the definition errors are large, and every `Result` of the sdk (and
        /// of the crates above it) would carry their size. Not a `source`: the message
        /// already says it, and an error chain would say it twice.
        error: Box<DefinitionError>,
    },
    /// A bad `quiver.yaml` setting.
    #[error("{file}: {message}", file = file.display())]
    Config { file: PathBuf, message: String },
    /// A registry file that exists but cannot be used.
    #[error("registry {file}: {message}", file = file.display())]
    Registry { file: PathBuf, message: String },
    /// Another `apply` holds the registry's lock.
    #[error("another `quiver apply` holds {lock} (waited {wait:?}); try again when it is done", lock = lock.display())]
    Locked { lock: PathBuf, wait: std::time::Duration },
    /// `apply` refused a breaking change to a view that holds data.
    #[error("refusing to apply: {0}; pass --force to apply it anyway")]
    Breaking(String),
    /// A store that an sdk operation consulted (through a trait such as
    /// [`crate::DataProbe`]) failed, with the kind of its failure (a store that cannot
    /// be reached, or settings it refuses).
    #[error("{1}")]
    Store(ErrorKind, String),
    /// A version of a view that does not exist or cannot be retired (docs/versions.md),
    /// with the kind of the refusal.
    #[error("{1}")]
    Version(ErrorKind, String),
    /// A file that could not be read or written.
    #[error("{path}: {error}", path = path.display())]
    Io {
        path: PathBuf,
        /// Not a `source`, for the same reason.
        error: std::io::Error,
    },
}

fn location(file: &Option<PathBuf>) -> String {
    match file {
        Some(f) => format!("{}: ", f.display()),
        None => String::new(),
    }
}

impl From<DefinitionError> for Error {
    fn from(source: DefinitionError) -> Self {
        Error::Definition { file: None, error: Box::new(source) }
    }
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NoRepository { .. } => ErrorKind::NotFound,
            Error::Definition { .. } | Error::Config { .. } | Error::Breaking(_) => ErrorKind::Invalid,
            Error::Registry { .. } => ErrorKind::Internal,
            Error::Locked { .. } => ErrorKind::Conflict,
            Error::Store(kind, _) | Error::Version(kind, _) => *kind,
            Error::Io { error, .. } => match error.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::NotFound,
                std::io::ErrorKind::WouldBlock => ErrorKind::Conflict,
                _ => ErrorKind::Internal,
            },
        }
    }

    /// Attaches a file to a definition error that has none.
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            Error::Definition { file: None, error } => Error::Definition { file: Some(path.into()), error },
            other => other,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), error: source }
    }
}

/// The sdk's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Error of parsing a feature reference: the text, which is not `view:feature`. Its
/// message is the one wording of a bad reference, whatever front end read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFeatureRef(pub String);

impl fmt::Display for BadFeatureRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.contains('@') {
            return write!(f, "bad feature reference `{}` (expected `view:feature` or `view@N:feature`, N a version from 1)", self.0);
        }
        write!(f, "bad feature reference `{}` (expected `view:feature`)", self.0)
    }
}

impl std::error::Error for BadFeatureRef {}

/// `n` things, said as a reader would: `count(1, "row")` is `1 row`, `count(2, "row")`
/// is `2 rows`. Every message that counts uses it, so none says "1 rows".
pub fn count<N: std::fmt::Display + PartialEq + From<u8>>(n: N, noun: &str) -> String {
    if n == N::from(1) {
        return format!("1 {noun}");
    }
    // A consonant and `y` (entity) take `ies`; a vowel and `y` (key) an `s`.
    match noun.strip_suffix('y') {
        Some(stem) if !stem.ends_with(['a', 'e', 'o', 'u']) => format!("{n} {stem}ies"),
        _ => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod count_tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::count(0, "row"), "0 rows");
        assert_eq!(super::count(1, "row"), "1 row");
        assert_eq!(super::count(2, "shard"), "2 shards");
        assert_eq!(super::count(3u64, "entity"), "3 entities");
        assert_eq!(super::count(0, "key"), "0 keys");
    }
}
