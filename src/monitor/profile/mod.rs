//! Feature profiles, the ground of monitoring (SPEC-level contract in the guide's
//! monitoring page, to come with `quiver monitor`): per feature and window, counts, the
//! null rate, online `NOT_FOUND` / `OUTSIDE_MAX_AGE` shares, for numbers min, max, mean,
//! standard deviation and a KLL quantile sketch, for strings and bools their most
//! frequent values, for lists their lengths. Profiles merge, so a long window is the
//! merge of short ones and is never recomputed from rows. NaN and the infinities are
//! values, not nulls (the server answers them as `"NaN"`, `"Infinity"`, `"-Infinity"`):
//! counted on their own, out of the sketch, the moments and PSI's bins. A current
//! window's profile may also count its values exactly into a reference's bins
//! ([`Profile::counting`]).
//!
//! The sketches are Apache DataSketches' (`datasketches`, pure Rust, no dependencies):
//! KLL at k = 200 (normalized rank error about 0.83%, under the 1% asked for) and the
//! frequent items sketch; exact while fewer values than they retain were seen.

use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use datasketches::common::SearchCriteria;
use datasketches::frequencies::{ErrorType, FrequentItemsSketch};
use datasketches::kll::{KllFloat, KllSketch};

use quiver_sdk::types::DType;

mod compare;
mod doc;
#[cfg(test)]
mod tests;

pub use compare::{Binning, Bins, CategoryShares, bin, category_bins, decile_edges, ks, psi, shares, sketch_shares};
pub use doc::ProfileDoc;

/// The KLL sketch's size: normalized rank error about 1.65 / k.
const KLL_K: u16 = 200;
/// The frequent items sketch's map: it tracks the most frequent values exactly until
/// more distinct values than about 3/4 of this were seen.
const FREQUENT_MAP: usize = 512;
/// Categories a profile reports by name; the rest count as "other".
pub const TOP_CATEGORIES: usize = 100;

/// One feature's profile over a window.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// Values seen (nulls included).
    pub count: u64,
    pub nulls: u64,
    /// Online only: lookups that found no row, or an expired one.
    pub not_found: u64,
    pub outside_max_age: u64,
    pub numbers: Option<Numbers>,
    pub categories: Option<Categories>,
    /// Of a list feature: its lengths.
    pub lengths: Option<Numbers>,
    /// The values counted exactly into a reference's bins, when asked for
    /// ([`Profile::counting`]); never written with the profile.
    pub counted: Option<Counted>,
}

/// A window's values counted into a reference's bins: numbers (or list lengths) by the
/// bin their value falls in ([`bin`]), strings and bools by category; nulls, NaN and
/// the infinities in none.
#[derive(Debug, Clone)]
pub struct Counted {
    pub binning: Arc<Binning>,
    /// Values per bin.
    pub counts: Vec<u64>,
}

/// Statistics of numbers: exact moments (Chan's parallel merge) and a quantile sketch.
#[derive(Debug, Clone)]
pub struct Numbers {
    pub n: u64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// The sum of squared deviations from the mean.
    m2: f64,
    /// NaN values, not in the sketch (no order holds them) nor the moments.
    pub nan: u64,
    /// Infinite values (either sign), not in the sketch nor the moments (one would
    /// make the mean infinite, the next NaN).
    pub infinite: u64,
    sketch: KllSketch<KllFloat<f64>>,
}

/// The most frequent values of a string or bool feature.
#[derive(Debug, Clone)]
pub struct Categories {
    sketch: FrequentItemsSketch<String>,
}

impl Default for Numbers {
    fn default() -> Self {
        Numbers {
            n: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            mean: 0.0,
            m2: 0.0,
            nan: 0,
            infinite: 0,
            sketch: KllSketch::new(KLL_K).expect("a valid k"),
        }
    }
}

impl Numbers {
    /// Adds `x`: a finite number to the moments and the sketch, a NaN or an infinity
    /// to its count.
    pub fn add(&mut self, x: f64) {
        if !x.is_finite() {
            if x.is_nan() {
                self.nan += 1;
            } else {
                self.infinite += 1;
            }
            return;
        }
        let Ok(value) = KllFloat::<f64>::new(x) else {
            self.nan += 1;
            return;
        };
        self.sketch.update(value);
        self.n += 1;
        self.min = self.min.min(x);
        self.max = self.max.max(x);
        let delta = x - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// This and `other` as one.
    pub fn merge(&mut self, other: &Numbers) {
        if other.n > 0 {
            let n = self.n + other.n;
            let delta = other.mean - self.mean;
            self.mean += delta * other.n as f64 / n as f64;
            self.m2 += other.m2 + delta * delta * self.n as f64 * other.n as f64 / n as f64;
            self.n = n;
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
            self.sketch.merge(&other.sketch).expect("sketches of one kind");
        }
        self.nan += other.nan;
        self.infinite += other.infinite;
    }

    /// NaN and infinite values.
    pub fn non_finite(&self) -> u64 {
        self.nan + self.infinite
    }

    /// How far a share of values between two points read off the sketch may be from
    /// the exact share: its two-sided (PMF) normalized rank error at 99% confidence, 0
    /// while it holds every value.
    pub fn share_error(&self) -> f64 {
        if self.sketch.is_estimation_mode() { self.sketch.normalized_pmf_error() } else { 0.0 }
    }

    /// The sample standard deviation (n - 1); `None` under two values.
    pub fn stddev(&self) -> Option<f64> {
        (self.n >= 2).then(|| (self.m2 / (self.n - 1) as f64).sqrt())
    }

    /// The share of values at or below `x` (NaN excluded); `None` when empty.
    pub fn cdf(&self, x: f64) -> Option<f64> {
        self.sketch.rank(&KllFloat::<f64>::new(x).ok()?, SearchCriteria::Inclusive)
    }

    /// The value at share `q` of the values; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.sketch.quantile(q.clamp(0.0, 1.0), SearchCriteria::Inclusive).ok().flatten().map(KllFloat::into_inner)
    }

    /// Values at every quarter of a percent of the distribution, ascending, each once:
    /// every value held while the sketch is exact (it holds fewer than 400).
    pub fn points(&self) -> Vec<f64> {
        let ranks: Vec<f64> = (0..=400).map(|i| f64::from(i) / 400.0).collect();
        let mut out: Vec<f64> = self
            .sketch
            .quantiles(&ranks, SearchCriteria::Inclusive)
            .ok()
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .map(KllFloat::into_inner)
            .collect();
        out.dedup();
        out
    }
}

impl Default for Categories {
    fn default() -> Self {
        Categories { sketch: FrequentItemsSketch::new(FREQUENT_MAP).expect("a valid map size") }
    }
}

impl Categories {
    pub fn add(&mut self, value: &str) {
        self.sketch.update_ref(value);
    }

    pub fn merge(&mut self, other: &Categories) {
        self.sketch.merge(&other.sketch);
    }

    /// Values counted.
    pub fn total(&self) -> u64 {
        self.sketch.total_weight()
    }

    /// The (estimated) count of `value`.
    pub fn count(&self, value: &str) -> u64 {
        self.sketch.estimate(value)
    }

    /// How far a value's share read off the sketch may be from the exact share: its
    /// largest count error over the values counted (0 while it tracks every distinct
    /// value).
    pub fn share_error(&self) -> f64 {
        self.sketch.maximum_error() as f64 / self.total().max(1) as f64
    }

    /// The most frequent values, at most [`TOP_CATEGORIES`], most frequent first (ties
    /// by value), with their (estimated) counts.
    pub fn top(&self) -> Vec<(String, u64)> {
        let mut rows: Vec<(String, u64)> =
            self.sketch.frequent_items(ErrorType::NoFalseNegatives).into_iter().map(|r| (r.item().clone(), r.estimate())).collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rows.truncate(TOP_CATEGORIES);
        rows
    }
}

impl Profile {
    /// An empty profile that also counts its values exactly into `binning`'s bins
    /// ([`Counted`]): a current window's, against a reference.
    pub fn counting(binning: Arc<Binning>) -> Profile {
        Profile { counted: Some(Counted { counts: vec![0; binning.bins()], binning }), ..Profile::default() }
    }

    /// This and `other` (of the same feature) as one.
    pub fn merge(&mut self, other: &Profile) {
        self.count += other.count;
        self.nulls += other.nulls;
        self.not_found += other.not_found;
        self.outside_max_age += other.outside_max_age;
        merge_into(&mut self.numbers, &other.numbers, Numbers::merge);
        merge_into(&mut self.categories, &other.categories, Categories::merge);
        merge_into(&mut self.lengths, &other.lengths, Numbers::merge);
        match (&mut self.counted, &other.counted) {
            (Some(into), Some(from)) => into.counts.iter_mut().zip(&from.counts).for_each(|(a, b)| *a += b),
            (None, Some(from)) => self.counted = Some(from.clone()),
            _ => {}
        }
    }

    /// The share of null values; `None` when nothing was seen. NaN and the infinities
    /// are values, not nulls.
    pub fn null_rate(&self) -> Option<f64> {
        (self.count > 0).then(|| self.nulls as f64 / self.count as f64)
    }

    /// Of a number feature: the share of its values (nulls included in the count) that
    /// are NaN or infinite; `None` when nothing was seen or it holds no numbers.
    pub fn non_finite_rate(&self) -> Option<f64> {
        let numbers = self.numbers.as_ref()?;
        (self.count > 0).then(|| numbers.non_finite() as f64 / self.count as f64)
    }

    /// Adds a number: to [`Numbers`], and to its bin when counting into a reference's.
    fn number(&mut self, x: f64) {
        if let Some(Counted { binning, counts }) = &mut self.counted
            && let Binning::Numbers(edges) = &**binning
            && x.is_finite()
        {
            counts[bin(edges, x)] += 1;
        }
        self.numbers.get_or_insert_with(Numbers::default).add(x);
    }

    /// Adds a list's length.
    fn length(&mut self, n: usize) {
        let x = n as f64;
        if let Some(Counted { binning, counts }) = &mut self.counted
            && let Binning::Lengths(edges) = &**binning
        {
            counts[bin(edges, x)] += 1;
        }
        self.lengths.get_or_insert_with(Numbers::default).add(x);
    }

    /// Adds a string or a bool (as `"true"`, `"false"`).
    fn category(&mut self, value: &str) {
        if let Some(Counted { binning, counts }) = &mut self.counted
            && let Binning::Categories { values, index } = &**binning
        {
            counts[index.get(value).copied().unwrap_or(values.len())] += 1;
        }
        self.categories.get_or_insert_with(Categories::default).add(value);
    }

    /// Adds a column of a feature of `dtype` (its Arrow type, [`DType::arrow_type`]):
    /// numbers and timestamps (UTC microseconds) to [`Numbers`], strings and bools to
    /// [`Categories`], lists' lengths to `lengths`; bytes are only counted.
    pub fn add_array(&mut self, array: &dyn Array, dtype: DType) {
        let n = array.len();
        self.count += n as u64;
        self.nulls += array.null_count() as u64;
        let valid = |r: usize| array.is_valid(r);
        match dtype {
            DType::Int32 => {
                let a = array.as_primitive::<Int32Type>();
                (0..n).filter(|&r| valid(r)).for_each(|r| self.number(f64::from(a.value(r))));
            }
            DType::Int64 | DType::Timestamp => {
                let values: &[i64] = if dtype == DType::Int64 {
                    array.as_primitive::<Int64Type>().values()
                } else {
                    array.as_primitive::<TimestampMicrosecondType>().values()
                };
                (0..n).filter(|&r| valid(r)).for_each(|r| self.number(values[r] as f64));
            }
            // NaN and the infinities are values, counted apart ([`Numbers::add`]).
            DType::Float32 => {
                let a = array.as_primitive::<Float32Type>();
                (0..n).filter(|&r| valid(r)).for_each(|r| self.number(f64::from(a.value(r))));
            }
            DType::Float64 => {
                let a = array.as_primitive::<Float64Type>();
                (0..n).filter(|&r| valid(r)).for_each(|r| self.number(a.value(r)));
            }
            DType::Bool => {
                let a = array.as_boolean();
                (0..n).filter(|&r| valid(r)).for_each(|r| self.category(if a.value(r) { "true" } else { "false" }));
            }
            DType::String => {
                let a = array.as_string::<i32>();
                (0..n).filter(|&r| valid(r)).for_each(|r| self.category(a.value(r)));
            }
            DType::List(_) => {
                let a = array.as_list::<i32>();
                (0..n).filter(|&r| valid(r)).for_each(|r| self.length(a.value_length(r) as usize));
            }
            DType::Bytes => {}
        }
    }
}

impl Profile {
    /// Adds one value (as the online store serves it): what [`Profile::add_array`] does
    /// for a row of a column, so a served value and the same value in a training set
    /// profile alike.
    pub fn add_value(&mut self, value: &quiver_runtime::encoding::Value) {
        use quiver_runtime::encoding::Value as V;
        self.count += 1;
        match value {
            V::Null => self.nulls += 1,
            V::Int32(x) => self.number(f64::from(*x)),
            V::Int64(x) | V::Timestamp(x) => self.number(*x as f64),
            // NaN and the infinities too: values, as the server answers them.
            V::Float32(x) => self.number(f64::from(*x)),
            V::Float64(x) => self.number(*x),
            V::Bool(x) => self.category(if *x { "true" } else { "false" }),
            V::String(x) => self.category(x),
            V::Bytes(_) => {}
            V::ListInt64(x) => self.length(x.len()),
            V::ListFloat32(x) => self.length(x.len()),
            V::ListFloat64(x) => self.length(x.len()),
            V::ListString(x) => self.length(x.len()),
        }
    }

    /// Adds one value of a feature of `dtype` as the server wrote it in JSON (the
    /// serving log's form: numbers, `"NaN"`, `"Infinity"` and `"-Infinity"` for floats
    /// JSON numbers cannot hold, RFC 3339 text for times, arrays for lists and bytes).
    ///
    /// # Errors
    /// A value that is not of the form `dtype` is written in.
    pub fn add_json(&mut self, value: &serde_json::Value, dtype: DType) -> Result<(), String> {
        use serde_json::Value as J;
        let wrong = || format!("`{value}` is not of type {dtype}");
        match (value, dtype) {
            (J::Null, _) => self.nulls += 1,
            (J::Number(n), DType::Int32 | DType::Int64 | DType::Float32 | DType::Float64) => self.number(n.as_f64().ok_or_else(wrong)?),
            (J::String(t), DType::Float32 | DType::Float64) => self.number(non_finite(t).ok_or_else(wrong)?),
            (J::String(t), DType::Timestamp) => self.number(quiver_sdk::types::parse_instant(t).map_err(|_| wrong())? as f64),
            (J::Bool(b), DType::Bool) => self.category(if *b { "true" } else { "false" }),
            (J::String(t), DType::String) => self.category(t),
            (J::Array(_), DType::Bytes) => {}
            (J::Array(items), DType::List(_)) => self.length(items.len()),
            _ => return Err(wrong()),
        }
        self.count += 1;
        Ok(())
    }
}

/// A float JSON numbers cannot hold, as the server writes it (protobuf's JSON mapping:
/// docs/online.md): `"NaN"`, `"Infinity"`, `"-Infinity"`.
fn non_finite(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

fn merge_into<T: Clone + Default>(into: &mut Option<T>, from: &Option<T>, merge: fn(&mut T, &T)) {
    if let Some(from) = from {
        merge(into.get_or_insert_with(T::default), from);
    }
}
