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
use serde::{Deserialize, Serialize};

use crate::types::DType;

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

/// A profile as JSON (a manifest's, a stored report's): the counts, the numbers'
/// moments, the most frequent values, and each sketch as hex of its DataSketches bytes,
/// so a profile read back merges and compares as the one written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileDoc {
    pub count: u64,
    pub nulls: u64,
    #[serde(default)]
    pub not_found: u64,
    #[serde(default)]
    pub outside_max_age: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numbers: Option<NumbersDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<CategoriesDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths: Option<NumbersDoc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumbersDoc {
    pub n: u64,
    /// Absent when no number was seen.
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Null when it overflowed (values near f64's limits); read back as NaN.
    #[serde(deserialize_with = "nan_if_null")]
    pub mean: f64,
    pub stddev: Option<f64>,
    #[serde(deserialize_with = "nan_if_null")]
    pub m2: f64,
    pub nan: u64,
    pub kll: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoriesDoc {
    pub total: u64,
    /// The most frequent values and their (estimated) counts, most frequent first.
    pub top: Vec<(String, u64)>,
    pub sketch: String,
}

impl From<&Profile> for ProfileDoc {
    fn from(p: &Profile) -> ProfileDoc {
        let numbers = |n: &Numbers| NumbersDoc {
            n: n.n,
            min: (n.n > 0).then_some(n.min),
            max: (n.n > 0).then_some(n.max),
            mean: n.mean,
            stddev: n.stddev(),
            m2: n.m2,
            nan: n.nan,
            kll: hex(&n.sketch.serialize()),
        };
        ProfileDoc {
            count: p.count,
            nulls: p.nulls,
            not_found: p.not_found,
            outside_max_age: p.outside_max_age,
            numbers: p.numbers.as_ref().map(numbers),
            categories: p.categories.as_ref().map(|c| CategoriesDoc { total: c.total(), top: c.top(), sketch: hex(&c.sketch.serialize()) }),
            lengths: p.lengths.as_ref().map(numbers),
        }
    }
}

impl TryFrom<&ProfileDoc> for Profile {
    type Error = String;

    /// # Errors
    /// A sketch whose hex or bytes do not read back.
    fn try_from(d: &ProfileDoc) -> Result<Profile, String> {
        let numbers = |n: &NumbersDoc| -> Result<Numbers, String> {
            let sketch = KllSketch::deserialize(&unhex(&n.kll)?).map_err(|e| format!("a quantile sketch: {e}"))?;
            Ok(Numbers {
                n: n.n,
                min: n.min.unwrap_or(f64::INFINITY),
                max: n.max.unwrap_or(f64::NEG_INFINITY),
                mean: n.mean,
                m2: n.m2,
                nan: n.nan,
                sketch,
            })
        };
        let categories = |c: &CategoriesDoc| -> Result<Categories, String> {
            let sketch = FrequentItemsSketch::deserialize(&unhex(&c.sketch)?).map_err(|e| format!("a frequent values sketch: {e}"))?;
            Ok(Categories { sketch })
        };
        Ok(Profile {
            count: d.count,
            nulls: d.nulls,
            not_found: d.not_found,
            outside_max_age: d.outside_max_age,
            numbers: d.numbers.as_ref().map(numbers).transpose()?,
            categories: d.categories.as_ref().map(categories).transpose()?,
            lengths: d.lengths.as_ref().map(numbers).transpose()?,
        })
    }
}

/// A float JSON wrote as `null` (it was not finite) reads back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err("a sketch's hex has an odd length".into());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            let pair = &text.as_bytes()[i..i + 2];
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("a sketch's hex has `{}`", String::from_utf8_lossy(pair)))
        })
        .collect()
}

fn merge_into<T: Clone + Default>(into: &mut Option<T>, from: &Option<T>, merge: fn(&mut T, &T)) {
    if let Some(from) = from {
        merge(into.get_or_insert_with(T::default), from);
    }
}

/// The proportion floor in PSI: an empty bin counts as this share (else PSI is infinite).
pub const PSI_FLOOR: f64 = 1e-4;

/// The reference's decile bins and each distribution's share of values in them: bin
/// `i` holds the values above `edges[i - 1]` (none for the first) up to `edges[i]`
/// inclusive; the last holds those above the last edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bins {
    pub edges: Vec<f64>,
    pub reference: Vec<f64>,
    pub current: Vec<f64>,
}

impl Bins {
    /// `current`'s and `reference`'s shares over `reference`'s deciles (equal edges
    /// merged); `None` when either has no numbers.
    pub fn deciles(reference: &Numbers, current: &Numbers) -> Option<Bins> {
        let edges = decile_edges(reference)?;
        let shares = |p: &Numbers| -> Option<Vec<f64>> {
            let mut out = Vec::with_capacity(edges.len() + 1);
            let mut below = 0.0;
            for e in &edges {
                let at = p.cdf(*e)?;
                out.push(at - below);
                below = at;
            }
            out.push(1.0 - below);
            Some(out)
        };
        Some(Bins { reference: shares(reference)?, current: shares(current)?, edges })
    }

    pub fn psi(&self) -> f64 {
        psi(&self.reference, &self.current)
    }
}

/// The population stability index of `current` against `reference` over the
/// reference's decile bins (equal edges merged); `None` when either has no numbers.
pub fn psi_numbers(reference: &Numbers, current: &Numbers) -> Option<f64> {
    Bins::deciles(reference, current).map(|b| b.psi())
}

/// The edges of `profile`'s decile bins: its values at 10%, ..., 90%, each once.
pub fn decile_edges(profile: &Numbers) -> Option<Vec<f64>> {
    let mut edges = Vec::with_capacity(9);
    for d in 1..10 {
        edges.push(profile.quantile(f64::from(d) / 10.0)?);
    }
    edges.dedup();
    Some(edges)
}

/// PSI of `current` against `reference` over the reference's categories (at most
/// [`TOP_CATEGORIES`]) and "other"; `None` when either counted nothing.
pub fn psi_categories(reference: &Categories, current: &Categories) -> Option<f64> {
    let (rt, ct) = (reference.total(), current.total());
    if rt == 0 || ct == 0 {
        return None;
    }
    let top = reference.top();
    let mut r: Vec<f64> = top.iter().map(|(_, n)| *n as f64 / rt as f64).collect();
    let mut c: Vec<f64> = top.iter().map(|(v, _)| current.count(v) as f64 / ct as f64).collect();
    r.push((1.0 - r.iter().sum::<f64>()).max(0.0));
    c.push((1.0 - c.iter().sum::<f64>()).max(0.0));
    Some(psi(&r, &c))
}

/// Σ (c - r) · ln(c / r) over the bins, each share floored at [`PSI_FLOOR`].
pub fn psi(reference: &[f64], current: &[f64]) -> f64 {
    reference
        .iter()
        .zip(current)
        .map(|(&r, &c)| {
            let (r, c) = (r.max(PSI_FLOOR), c.max(PSI_FLOOR));
            (c - r) * (c / r).ln()
        })
        .sum()
}

/// The Kolmogorov–Smirnov distance of the two distributions: the largest difference
/// of their cumulative shares at any value either sketch holds; `None` when either is
/// empty. Within the sketches' rank errors of the exact distance.
pub fn ks(reference: &Numbers, current: &Numbers) -> Option<f64> {
    if reference.n == 0 || current.n == 0 {
        return None;
    }
    let mut distance: f64 = 0.0;
    for x in reference.points().into_iter().chain(current.points()) {
        distance = distance.max((reference.cdf(x)? - current.cdf(x)?).abs());
    }
    Some(distance)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(values: impl IntoIterator<Item = f64>) -> Numbers {
        let mut n = Numbers::default();
        values.into_iter().for_each(|x| n.add(x));
        n
    }

    /// Exact shares of `values` in the bins `edges` make (value <= edge: that bin).
    fn direct_shares(values: &[f64], edges: &[f64]) -> Vec<f64> {
        let mut counts = vec![0usize; edges.len() + 1];
        for v in values {
            counts[edges.iter().position(|e| v <= e).unwrap_or(edges.len())] += 1;
        }
        counts.iter().map(|&c| c as f64 / values.len() as f64).collect()
    }

    #[test]
    fn moments_merge_as_if_computed_at_once() {
        let all: Vec<f64> = (0..150).map(|i| ((i * 37) % 101) as f64 * 0.25 - 3.0).collect();
        let whole = numbers(all.clone());
        let mut parts = numbers(all[..40].iter().copied());
        parts.merge(&numbers(all[40..].iter().copied()));
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let var = all.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (all.len() - 1) as f64;
        for p in [&whole, &parts] {
            assert_eq!((p.n, p.min, p.max), (150, -3.0, 22.0));
            assert!((p.mean - mean).abs() < 1e-12);
            assert!((p.stddev().unwrap() - var.sqrt()).abs() < 1e-12);
        }
        assert_eq!(numbers([f64::NAN, 1.0]).nan, 1);
    }

    /// Below the sketch's capacity the ranks are exact: PSI from profiles equals PSI
    /// computed directly from the rows over the same bins, to 1e-12.
    #[test]
    fn psi_from_profiles_equals_the_direct_computation_given_the_bins() {
        let reference: Vec<f64> = (0..150).map(|i| (i as f64 * 0.7).sin() * 10.0).collect();
        let current: Vec<f64> = (0..150).map(|i| (i as f64 * 0.7).sin() * 10.0 + 1.5).collect();
        let (r, c) = (numbers(reference.clone()), numbers(current.clone()));
        let edges = decile_edges(&r).unwrap();
        let direct = psi(&direct_shares(&reference, &edges), &direct_shares(&current, &edges));
        let got = psi_numbers(&r, &c).unwrap();
        assert!((got - direct).abs() < 1e-12, "{got} vs {direct}");
        assert!(got > 0.2, "a shift of 1.5 on a spread of 20 drifts: {got}");
        assert!(psi_numbers(&r, &r).unwrap().abs() < 1e-12);
        // Exact KS: the largest gap of the empirical distributions.
        let ks_direct = reference
            .iter()
            .chain(&current)
            .map(|x| {
                let f = |v: &[f64]| v.iter().filter(|y| *y <= x).count() as f64 / v.len() as f64;
                (f(&reference) - f(&current)).abs()
            })
            .fold(0.0, f64::max);
        assert!((ks(&r, &c).unwrap() - ks_direct).abs() < 1e-12);
    }

    /// Past its capacity the sketch answers ranks within its error on adversarial
    /// orders: sorted, reversed, many duplicates, heavy tails.
    #[test]
    fn the_sketchs_rank_error_stays_under_one_percent() {
        let n = 200_000usize;
        let inputs: Vec<(&str, Vec<f64>)> = vec![
            ("sorted", (0..n).map(|i| i as f64).collect()),
            ("reversed", (0..n).rev().map(|i| i as f64).collect()),
            ("duplicates", (0..n).map(|i| (i % 7) as f64).collect()),
            ("heavy tail", (1..=n).map(|i| 1.0 / ((i * 7919 % n) as f64 / n as f64 + 1e-6).powi(2)).collect()),
        ];
        for (name, values) in inputs {
            let p = numbers(values.clone());
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let mut worst: f64 = 0.0;
            for q in 1..100 {
                let x = sorted[q * n / 100];
                let exact = sorted.partition_point(|v| *v <= x) as f64 / n as f64;
                worst = worst.max((p.cdf(x).unwrap() - exact).abs());
            }
            assert!(worst <= 0.01, "{name}: rank error {worst}");
        }
    }

    /// A profile of Arrow columns of every kind, merged from two halves, written as JSON
    /// and read back, answers as the one profile of the whole column.
    #[test]
    fn profiles_of_columns_merge_and_read_back() {
        use arrow::array::{BooleanArray, Float64Array, ListArray, StringArray};
        let floats = Float64Array::from((0..1000).map(|i| (i % 9 != 0).then_some(i as f64 / 3.0)).collect::<Vec<_>>());
        let strings = StringArray::from((0..1000).map(|i| (i % 5 != 0).then(|| ["x", "y", "z"][i % 3])).collect::<Vec<_>>());
        let bools = BooleanArray::from((0..1000).map(|i| Some(i % 4 == 0)).collect::<Vec<_>>());
        let lists = ListArray::from_iter_primitive::<Float32Type, _, _>((0..1000).map(|i| Some(vec![Some(1.0f32); i % 6])));
        let columns: [(&dyn Array, DType); 4] = [
            (&floats, DType::Float64),
            (&strings, DType::String),
            (&bools, DType::Bool),
            (&lists, DType::List(crate::types::ListElement::Float32)),
        ];
        for (array, dtype) in columns {
            let mut whole = Profile::default();
            whole.add_array(array, dtype);
            let (mut left, mut right) = (Profile::default(), Profile::default());
            left.add_array(&array.slice(0, 300), dtype);
            right.add_array(&array.slice(300, 700), dtype);
            left.merge(&right);
            let doc = ProfileDoc::from(&left);
            let text = serde_json::to_string(&doc).unwrap();
            let back = Profile::try_from(&serde_json::from_str::<ProfileDoc>(&text).unwrap()).unwrap();
            assert_eq!(ProfileDoc::from(&back), doc, "{dtype}: reads back as written");
            assert_eq!((back.count, back.nulls), (whole.count, whole.nulls), "{dtype}");
            let plain = |p: &Profile| {
                let d = ProfileDoc::from(p);
                let moments = |n: &Option<NumbersDoc>| n.as_ref().map(|n| (n.n, n.min, n.max, (n.mean * 1e9).round()));
                (moments(&d.numbers), d.categories.map(|c| (c.total, c.top)), moments(&d.lengths))
            };
            assert_eq!(plain(&back), plain(&whole), "{dtype}");
        }
        assert_eq!(
            Profile::try_from(&ProfileDoc {
                numbers: Some(NumbersDoc { n: 1, min: None, max: None, mean: 0.0, stddev: None, m2: 0.0, nan: 0, kll: "0g".into() }),
                ..ProfileDoc::from(&Profile::default())
            })
            .unwrap_err(),
            "a sketch's hex has `0g`"
        );
    }

    #[test]
    fn categories_count_their_most_frequent_values_and_psi_sees_a_mix_change() {
        let mut r = Categories::default();
        let mut c = Categories::default();
        for i in 0..1000 {
            r.add(["a", "b", "c", "d"][i % 4]);
            c.add(if i % 10 < 7 { "a" } else { ["b", "c", "d"][i % 3] });
        }
        assert_eq!(r.top()[..2], [("a".to_string(), 250), ("b".to_string(), 250)]);
        let direct = psi(&[0.25, 0.25, 0.25, 0.25, 0.0], &[0.7, 0.1, 0.1, 0.1, 0.0]);
        let got = psi_categories(&r, &c).unwrap();
        assert!((got - direct).abs() < 1e-2, "{got} vs {direct}");
        assert!(got > 0.2);
        assert!(psi_categories(&r, &r).unwrap().abs() < 1e-12);
        let mut merged = r.clone();
        merged.merge(&c);
        assert_eq!(merged.total(), 2000);
    }

    #[test]
    fn nan_and_infinities_count_as_nulls_as_the_server_serves_them_and_the_json_reads_back() {
        let column = arrow::array::Float64Array::from(vec![Some(1.0), Some(f64::NAN), Some(f64::INFINITY), None, Some(3.0)]);
        let mut p = Profile::default();
        p.add_array(&column, DType::Float64);
        assert_eq!((p.count, p.nulls), (5, 3));
        let n = p.numbers.as_ref().unwrap();
        assert_eq!((n.n, n.min, n.max, n.mean), (2, 1.0, 3.0, 2.0));
        let mut served = Profile::default();
        for v in [1.0, f64::NAN, f64::INFINITY, 3.0] {
            served.add_value(&crate::encoding::Value::Float64(v));
        }
        served.add_value(&crate::encoding::Value::Null);
        assert_eq!((served.count, served.nulls), (5, 3));
        // Moments that overflowed are written as null and read back.
        let mut huge = Profile::default();
        huge.add_value(&crate::encoding::Value::Float64(1e300));
        huge.add_value(&crate::encoding::Value::Float64(-1e300));
        let text = serde_json::to_string(&ProfileDoc::from(&huge)).unwrap();
        let back: ProfileDoc = serde_json::from_str(&text).unwrap();
        assert_eq!(Profile::try_from(&back).unwrap().count, 2);
        // A damaged sketch is an error, never a panic (even split inside a character).
        let mut bad = back.clone();
        bad.numbers.as_mut().unwrap().kll = "a\u{e9}0".into();
        assert!(Profile::try_from(&bad).is_err());
    }
}
