//! Feature profiles, the ground of monitoring (SPEC-level contract in the guide's
//! monitoring page, to come with `quiver monitor`): per feature and window, counts, the
//! null rate, online `NOT_FOUND` / `OUTSIDE_MAX_AGE` shares, for numbers min, max, mean,
//! standard deviation and a KLL quantile sketch, for strings and bools their most
//! frequent values, for lists their lengths. Profiles merge, so a long window is the
//! merge of short ones and is never recomputed from rows.
//!
//! The sketches are Apache DataSketches' (`datasketches`, pure Rust, no dependencies):
//! KLL at k = 200 (normalized rank error about 0.83%, under the 1% asked for) and the
//! frequent items sketch; exact while fewer values than they retain were seen.

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use datasketches::common::SearchCriteria;
use datasketches::frequencies::{ErrorType, FrequentItemsSketch};
use datasketches::kll::{KllFloat, KllSketch};

use crate::types::DType;

mod compare;
mod doc;
#[cfg(test)]
mod tests;

pub use compare::{Bins, PSI_FLOOR, decile_edges, ks, psi, psi_categories, psi_numbers};
pub use doc::{CategoriesDoc, NumbersDoc, ProfileDoc};

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
    /// NaN values, not in the sketch (no order holds them).
    pub nan: u64,
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
            sketch: KllSketch::new(KLL_K).expect("a valid k"),
        }
    }
}

impl Numbers {
    pub fn add(&mut self, x: f64) {
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
    /// This and `other` (of the same feature) as one.
    pub fn merge(&mut self, other: &Profile) {
        self.count += other.count;
        self.nulls += other.nulls;
        self.not_found += other.not_found;
        self.outside_max_age += other.outside_max_age;
        merge_into(&mut self.numbers, &other.numbers, Numbers::merge);
        merge_into(&mut self.categories, &other.categories, Categories::merge);
        merge_into(&mut self.lengths, &other.lengths, Numbers::merge);
    }

    /// The share of null values; `None` when nothing was seen.
    pub fn null_rate(&self) -> Option<f64> {
        (self.count > 0).then(|| self.nulls as f64 / self.count as f64)
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
                let numbers = self.numbers.get_or_insert_with(Numbers::default);
                (0..n).filter(|&r| valid(r)).for_each(|r| numbers.add(f64::from(a.value(r))));
            }
            DType::Int64 | DType::Timestamp => {
                let numbers = self.numbers.get_or_insert_with(Numbers::default);
                let values: &[i64] = if dtype == DType::Int64 {
                    array.as_primitive::<Int64Type>().values()
                } else {
                    array.as_primitive::<TimestampMicrosecondType>().values()
                };
                (0..n).filter(|&r| valid(r)).for_each(|r| numbers.add(values[r] as f64));
            }
            // NaN and infinities count as nulls: the server answers them as null.
            DType::Float32 => {
                let a = array.as_primitive::<Float32Type>();
                let numbers = self.numbers.get_or_insert_with(Numbers::default);
                let mut non_finite = 0;
                (0..n).filter(|&r| valid(r)).for_each(|r| {
                    let x = f64::from(a.value(r));
                    if x.is_finite() { numbers.add(x) } else { non_finite += 1 }
                });
                self.nulls += non_finite;
            }
            DType::Float64 => {
                let a = array.as_primitive::<Float64Type>();
                let numbers = self.numbers.get_or_insert_with(Numbers::default);
                let mut non_finite = 0;
                (0..n).filter(|&r| valid(r)).for_each(|r| {
                    let x = a.value(r);
                    if x.is_finite() { numbers.add(x) } else { non_finite += 1 }
                });
                self.nulls += non_finite;
            }
            DType::Bool => {
                let a = array.as_boolean();
                let categories = self.categories.get_or_insert_with(Categories::default);
                (0..n).filter(|&r| valid(r)).for_each(|r| categories.add(if a.value(r) { "true" } else { "false" }));
            }
            DType::String => {
                let a = array.as_string::<i32>();
                let categories = self.categories.get_or_insert_with(Categories::default);
                (0..n).filter(|&r| valid(r)).for_each(|r| categories.add(a.value(r)));
            }
            DType::List(_) => {
                let a = array.as_list::<i32>();
                let lengths = self.lengths.get_or_insert_with(Numbers::default);
                (0..n).filter(|&r| valid(r)).for_each(|r| lengths.add(a.value_length(r) as f64));
            }
            DType::Bytes => {}
        }
    }
}

impl Profile {
    /// Adds one value (as the online store serves it): what [`Profile::add_array`] does
    /// for a row of a column, so a served value and the same value in a training set
    /// profile alike.
    pub fn add_value(&mut self, value: &crate::encoding::Value) {
        use crate::encoding::Value as V;
        self.count += 1;
        let numbers = |p: &mut Profile, x: f64| p.numbers.get_or_insert_with(Numbers::default).add(x);
        let categories = |p: &mut Profile, x: &str| p.categories.get_or_insert_with(Categories::default).add(x);
        let lengths = |p: &mut Profile, n: usize| p.lengths.get_or_insert_with(Numbers::default).add(n as f64);
        match value {
            V::Null => self.nulls += 1,
            V::Int32(x) => numbers(self, f64::from(*x)),
            V::Int64(x) | V::Timestamp(x) => numbers(self, *x as f64),
            // As the server answers them: null.
            V::Float32(x) if !x.is_finite() => self.nulls += 1,
            V::Float64(x) if !x.is_finite() => self.nulls += 1,
            V::Float32(x) => numbers(self, f64::from(*x)),
            V::Float64(x) => numbers(self, *x),
            V::Bool(x) => categories(self, if *x { "true" } else { "false" }),
            V::String(x) => categories(self, x),
            V::Bytes(_) => {}
            V::ListInt64(x) => lengths(self, x.len()),
            V::ListFloat32(x) => lengths(self, x.len()),
            V::ListFloat64(x) => lengths(self, x.len()),
            V::ListString(x) => lengths(self, x.len()),
        }
    }

    /// Adds one value of a feature of `dtype` as the server wrote it in JSON (the
    /// serving log's form: numbers, RFC 3339 text for times, arrays for lists and bytes).
    ///
    /// # Errors
    /// A value that is not of the form `dtype` is written in.
    pub fn add_json(&mut self, value: &serde_json::Value, dtype: DType) -> Result<(), String> {
        use serde_json::Value as J;
        let wrong = || format!("`{value}` is not a {dtype} value");
        self.count += 1;
        match (value, dtype) {
            (J::Null, _) => self.nulls += 1,
            (J::Number(n), DType::Int32 | DType::Int64 | DType::Float32 | DType::Float64) => {
                self.numbers.get_or_insert_with(Numbers::default).add(n.as_f64().ok_or_else(wrong)?);
            }
            (J::String(t), DType::Timestamp) => {
                let us = crate::rows::parse_instant(t).map_err(|_| wrong())?;
                self.numbers.get_or_insert_with(Numbers::default).add(us as f64);
            }
            (J::Bool(b), DType::Bool) => self.categories.get_or_insert_with(Categories::default).add(if *b { "true" } else { "false" }),
            (J::String(t), DType::String) => self.categories.get_or_insert_with(Categories::default).add(t),
            (J::Array(_), DType::Bytes) => {}
            (J::Array(items), DType::List(_)) => self.lengths.get_or_insert_with(Numbers::default).add(items.len() as f64),
            _ => {
                self.count -= 1;
                return Err(wrong());
            }
        }
        Ok(())
    }
}

fn merge_into<T: Clone + Default>(into: &mut Option<T>, from: &Option<T>, merge: fn(&mut T, &T)) {
    if let Some(from) = from {
        merge(into.get_or_insert_with(T::default), from);
    }
}
