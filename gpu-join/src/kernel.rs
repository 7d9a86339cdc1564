//! The kernel contract: its input, its output and the trait engines implement.

/// Marks a spine row whose key is null or unknown, or a feature row whose entity is not
/// in the spine.
pub const NO_ENTITY: u32 = u32::MAX;

/// Marks a spine row with no winning feature row: its features are null.
pub const NO_ROW: u32 = u32::MAX;

/// One view's as-of join, reduced to plain arrays.
///
/// Feature rows are indexed `0..feature_entity.len()` (the offline store's order of
/// the scanned rows); entity ids are dense, `0..n_entities`, shared by spine and
/// feature rows.
#[derive(Debug, Clone, Copy)]
pub struct AsOfInput<'a> {
    /// Entity of each spine row, or [`NO_ENTITY`].
    pub spine_entity: &'a [u32],
    /// Spine time, microseconds since the epoch (UTC).
    pub spine_ts: &'a [i64],
    /// Entity of each feature row, or [`NO_ENTITY`] (such rows never win).
    pub feature_entity: &'a [u32],
    /// Event time of each feature row, microseconds.
    pub feature_ts: &'a [i64],
    /// Created time of each feature row (the first tie-break), if the view has one.
    pub feature_created: Option<&'a [i64]>,
    /// Ingestion order of each feature row (the last tie-break): greater = later.
    pub feature_seq: &'a [i64],
    pub n_entities: u32,
    /// The view's TTL in microseconds; `None` = unbounded.
    pub ttl_us: Option<i64>,
    /// Only rows with `created <= spine time` are candidates.
    pub created_cutoff: bool,
}

impl AsOfInput<'_> {
    /// Checks that the arrays agree in length and the ids are in range.
    ///
    /// # Errors
    /// [`KernelError::BadInput`] naming the first problem.
    pub fn validate(&self) -> Result<(), KernelError> {
        let bad = |m: String| Err(KernelError::BadInput(m));
        if self.spine_entity.len() != self.spine_ts.len() {
            return bad(format!("spine has {} entity ids but {} times", self.spine_entity.len(), self.spine_ts.len()));
        }
        let n = self.feature_entity.len();
        if self.feature_ts.len() != n || self.feature_seq.len() != n || self.feature_created.is_some_and(|c| c.len() != n) {
            return bad(format!("feature arrays differ in length (entity ids: {n})"));
        }
        if n >= NO_ROW as usize {
            return bad(format!("{n} feature rows: more than the kernel indexes"));
        }
        if self.ttl_us.is_some_and(|t| t < 0) {
            return bad("negative ttl".to_string());
        }
        let out_of_range = |ids: &[u32]| ids.iter().any(|&e| e != NO_ENTITY && e >= self.n_entities);
        if out_of_range(self.spine_entity) || out_of_range(self.feature_entity) {
            return bad(format!("entity id out of range (n_entities = {})", self.n_entities));
        }
        Ok(())
    }
}

/// Why a kernel failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("as-of kernel input: {0}")]
    BadInput(String),
    #[error("{engine} engine: {message}")]
    Engine { engine: &'static str, message: String },
}

/// An engine for the as-of join.
///
/// For spine row `i` with entity `e` and time `t`, the result holds the feature row
/// that wins among rows of entity `e` with `t - ttl <= ts <= t` (and `created <= t`
/// under the cutoff): greatest `ts`, then greatest `created`, then greatest `seq`; or
/// [`NO_ROW`] when there is none.
pub trait AsOfKernel: Send + Sync + std::fmt::Debug {
    /// A short name for messages (`cpu`, `cuda`).
    fn name(&self) -> &'static str;

    /// One winner (or [`NO_ROW`]) per spine row, in spine order.
    ///
    /// # Errors
    /// Bad input, or an engine failure (device memory, driver).
    fn join(&self, input: &AsOfInput<'_>) -> Result<Vec<u32>, KernelError>;

    /// Gathers fixed-width feature columns by the winners `index` on the engine's own
    /// device: `out[i] = values[index[i]]`, invalid where `index[i]` is [`NO_ROW`] or the
    /// source row is invalid. `None` (the default): the engine has no device of its own,
    /// and the caller gathers on the host. Results must equal the host gather.
    fn gather(&self, _columns: &[FixedColumn<'_>], _index: &[u32]) -> Option<Result<Vec<Gathered>, KernelError>> {
        None
    }
}

/// A fixed-width column for [`AsOfKernel::gather`]: the raw bits of 8-byte values
/// (int64, float64, timestamps) or 4-byte values (int32, float32), and one validity
/// byte per row (1 = valid; `None` = all valid).
#[derive(Debug, Clone, Copy)]
pub enum FixedColumn<'a> {
    U64 { values: &'a [u64], valid: Option<&'a [u8]> },
    U32 { values: &'a [u32], valid: Option<&'a [u8]> },
}

/// A gathered column: values and one validity byte per output row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gathered {
    U64(Vec<u64>, Vec<u8>),
    U32(Vec<u32>, Vec<u8>),
}

/// The gather's meaning, on the host: what every engine's device gather must return.
pub fn gather_on_host(column: &FixedColumn<'_>, index: &[u32]) -> Gathered {
    fn pick<T: Copy + Default>(values: &[T], valid: Option<&[u8]>, index: &[u32]) -> (Vec<T>, Vec<u8>) {
        index
            .iter()
            .map(|&r| if r == NO_ROW { (T::default(), 0) } else { (values[r as usize], valid.map_or(1, |v| v[r as usize])) })
            .unzip()
    }
    match column {
        FixedColumn::U64 { values, valid } => {
            let (v, ok) = pick(values, *valid, index);
            Gathered::U64(v, ok)
        }
        FixedColumn::U32 { values, valid } => {
            let (v, ok) = pick(values, *valid, index);
            Gathered::U32(v, ok)
        }
    }
}
