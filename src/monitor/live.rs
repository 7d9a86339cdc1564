//! Continuous monitoring in `quiver serve`: the serving log's writer hands every answer
//! it logs to [`Live::add`], which counts the values into the current time bucket (a
//! twelfth of `monitoring.window`); `/metrics` adds up the buckets of the last window
//! and compares them with the reference profiled at start ([`Live::render`]). No second
//! pass over the log, and nothing on the request's path: the writer's task counts after
//! the answer has gone.
//!
//! The server knows its reference, so it keeps no sketch of its own: per feature and
//! bucket it counts values exactly into the reference's bins — for numbers (and list
//! lengths) the reference's values at every quarter percent and its deciles, for
//! strings and bools its top categories and "other". PSI over the reference's deciles is
//! then exact for the served values, and KS is taken at the reference's 401 points
//! (within a quarter percent of rank, plus the reference sketch's error). A bin count is
//! a cell's lookup, a search of its few points and an add, several times cheaper than a
//! sketch update, which is what keeps the cost to serving low (docs/monitoring.md,
//! bench/RESULTS.md).
//!
//! PSI is `quiver monitor`'s computation: the reference's bins and shares from
//! `crate::monitor::profile` ([`decile_edges`], [`sketch_shares`], [`category_bins`]), the
//! served values' decile counts turned into shares by [`shares`] and compared by
//! [`psi`], so the gauge and the report over the same served rows are one number. NaN
//! and the infinities are values, in no bin, counted apart.

use std::collections::VecDeque;

// hashbrown's default hasher (foldhash): the slot of every feature of every answer is
// looked up, and SipHash on the names was most of the writer's added work.
use hashbrown::HashMap;
use std::sync::Mutex;

use crate::monitor::profile::{Numbers, Profile, category_bins, decile_edges, psi, shares, sketch_shares};
use quiver_online::lookup::Status;
use quiver_online::serving_log::Served;
use quiver_runtime::encoding::Value;
use quiver_runtime::metrics::{Exposition, Kind};
use quiver_sdk::monitoring::Limits;

use super::{Window, sources};
use crate::error::{Error, Result};
use crate::repo::Repo;

/// Buckets per window: the window slides by a twelfth.
const BUCKETS: i64 = 12;

/// The serving window's counts against a reference.
#[derive(Debug)]
pub struct Live {
    /// As in the gauges' `reference` label.
    reference_name: String,
    window_us: i64,
    bucket_us: i64,
    /// Feature slots by view, then feature.
    slots: HashMap<String, HashMap<String, usize>>,
    features: Vec<Slot>,
    /// (bucket start, a tally per slot), oldest first.
    buckets: Mutex<VecDeque<(i64, Vec<Tally>)>>,
}

/// One gauged feature: its name, the reference's bins and shares, its limits.
#[derive(Debug)]
struct Slot {
    view: String,
    /// The version of the view the reference read: answers reading another version are
    /// not counted against it (docs/versions.md).
    version: u32,
    feature: String,
    limits: Limits,
    reference_null_rate: Option<f64>,
    grid: Grid,
}

/// The reference's bins of one feature.
#[derive(Debug)]
enum Grid {
    /// Bin `k` holds values above `points[k - 1]` up to `points[k]`; the last, those
    /// above every point. `lengths`: of a list feature, its lengths are counted.
    Numbers {
        points: Vec<f64>,
        /// Where to start looking for a value's bin.
        cells: Cells,
        lengths: bool,
        /// The reference's share at or below each point.
        reference_cdf: Vec<f64>,
        /// The deciles' positions in `points`, and the reference's share in each decile bin.
        deciles: Vec<usize>,
        reference_shares: Vec<f64>,
    },
    /// The reference's top categories (their bins, in order) and "other" (the last bin),
    /// with the reference's shares.
    Categories { index: HashMap<String, usize>, reference_shares: Vec<f64> },
    /// Nothing to bin (bytes, or a reference without values): counts only.
    None,
}

/// The decile counts of the counts per point bin (`points` bins): decile bin `k` adds up
/// the point bins after the previous decile's position, up to its own (`deciles`).
fn decile_counts(point_bins: &[u64], deciles: &[usize]) -> Vec<u64> {
    let mut out = Vec::with_capacity(deciles.len() + 1);
    let mut start = 0;
    for &d in deciles {
        out.push(point_bins[start..=d].iter().sum());
        start = d + 1;
    }
    out.push(point_bins[start..].iter().sum());
    out
}

impl Grid {
    fn of(reference: &Profile) -> Grid {
        let numbers = |n: &Numbers, lengths: bool| -> Grid {
            let Some(edges) = decile_edges(n) else {
                return Grid::None;
            };
            let mut points = n.points();
            points.extend_from_slice(&edges);
            points.sort_by(f64::total_cmp);
            points.dedup();
            let reference_cdf: Vec<f64> = points.iter().map(|p| n.cdf(*p).unwrap_or(0.0)).collect();
            let deciles: Vec<usize> = edges.iter().map(|e| points.partition_point(|p| p < e)).collect();
            let cells = Cells::of(&points);
            // As `quiver monitor`'s (`Bins::counted`).
            let Some(reference_shares) = sketch_shares(n, &edges) else {
                return Grid::None;
            };
            Grid::Numbers { points, cells, lengths, reference_cdf, deciles, reference_shares }
        };
        match (&reference.numbers, &reference.categories, &reference.lengths) {
            (Some(n), _, _) => numbers(n, false),
            (None, None, Some(n)) => numbers(n, true),
            (None, Some(c), _) if c.total() > 0 => {
                let (values, reference_shares) = category_bins(c);
                let index = values.into_iter().enumerate().map(|(i, v)| (v, i)).collect();
                Grid::Categories { index, reference_shares }
            }
            _ => Grid::None,
        }
    }

    fn bins(&self) -> usize {
        match self {
            Grid::Numbers { points, .. } => points.len() + 1,
            Grid::Categories { index, .. } => index.len() + 1,
            Grid::None => 0,
        }
    }

    /// The bin of `value`, if it has one (nulls, NaN, the infinities and other kinds
    /// have none).
    fn bin(&self, value: &Value) -> Option<usize> {
        match self {
            Grid::Numbers { points, cells, lengths, .. } => {
                let x = match (value, lengths) {
                    (Value::Int32(x), false) => f64::from(*x),
                    (Value::Int64(x) | Value::Timestamp(x), false) => *x as f64,
                    (Value::Float32(x), false) => f64::from(*x),
                    (Value::Float64(x), false) => *x,
                    (Value::ListInt64(l), true) => l.len() as f64,
                    (Value::ListFloat32(l), true) => l.len() as f64,
                    (Value::ListFloat64(l), true) => l.len() as f64,
                    (Value::ListString(l), true) => l.len() as f64,
                    _ => return None,
                };
                // NaN and the infinities: values, in no bin (counted apart).
                x.is_finite().then(|| cells.bin(points, x))
            }
            Grid::Categories { index, .. } => {
                let key = match value {
                    Value::String(s) => s.as_str(),
                    Value::Bool(b) => {
                        if *b {
                            "true"
                        } else {
                            "false"
                        }
                    }
                    _ => return None,
                };
                Some(index.get(key).copied().unwrap_or(index.len()))
            }
            Grid::None => None,
        }
    }
}

/// Equal-width cells over the points' range, each knowing the bins a value in it can
/// fall in: a value's bin is a multiply, a load and a search of a few points at most (a
/// binary search over 410 points for every served value was most of the cost).
#[derive(Debug)]
struct Cells {
    lo: f64,
    scale: f64,
    /// The last cell's number.
    top: f64,
    /// Per cell: the bins of its values, and of its neighbours' (a value rounded into
    /// the next cell still finds its bin), lie in `first..=last`.
    ranges: Vec<(u32, u32)>,
}

impl Cells {
    const N: usize = 2048;

    fn of(points: &[f64]) -> Cells {
        let len = u32::try_from(points.len()).unwrap_or(u32::MAX);
        let (lo, hi) = (points.first().copied().unwrap_or(0.0), points.last().copied().unwrap_or(0.0));
        let scale = Self::N as f64 / (hi - lo);
        // Cells far wider than a float's rounding there, or none: one cell of every bin.
        let coarse = (hi - lo) / Self::N as f64 > 1e6 * f64::EPSILON * lo.abs().max(hi.abs());
        if points.len() < 2 || !scale.is_finite() || !coarse {
            return Cells { lo, scale: 0.0, top: 0.0, ranges: vec![(0, len)] };
        }
        let bin = |x: f64| u32::try_from(points.partition_point(|p| *p < x)).unwrap_or(u32::MAX);
        let edges: Vec<u32> = (0..=Self::N).map(|c| bin(lo + c as f64 / scale)).collect();
        let ranges = (0..Self::N)
            .map(|c| {
                let first = if c == 0 { 0 } else { edges[c - 1] };
                let last = if c + 1 == Self::N { len } else { edges[c + 2] };
                (first, last)
            })
            .collect();
        Cells { lo, scale, top: (Self::N - 1) as f64, ranges }
    }

    /// The bin of `x` (finite): the number of points below it, as
    /// `crate::monitor::profile::bin` finds it (`quiver monitor`'s count).
    fn bin(&self, points: &[f64], x: f64) -> usize {
        let at = (x - self.lo) * self.scale;
        // Clamped by comparisons (a NaN, from an overflowed difference times a scale of
        // 0, takes the first cell), so the conversion needs no saturating: `as usize`'s
        // was a fifth of the instructions per value.
        let at = if at > 0.0 { if at < self.top { at } else { self.top } } else { 0.0 };
        // SAFETY: `at` is finite and in 0..=top, and top < Self::N fits a u32.
        let cell = unsafe { at.to_int_unchecked::<u32>() } as usize;
        let (first, last) = (self.ranges[cell].0 as usize, self.ranges[cell].1 as usize);
        first + points[first..last].partition_point(|p| *p < x)
    }
}

/// A number's value that is neither a float64 nor an int64 (NaN for a non-number).
#[inline(never)]
fn other_number(value: &Value) -> f64 {
    match value {
        Value::Float64(x) => *x,
        Value::Int64(x) | Value::Timestamp(x) => *x as f64,
        Value::Float32(x) => f64::from(*x),
        Value::Int32(x) => f64::from(*x),
        _ => f64::NAN,
    }
}

/// Whether `value` is a NaN or an infinity: a value (the server answers `"NaN"`,
/// `"Infinity"`, `"-Infinity"`), not a null, and in no bin.
fn is_non_finite(value: &Value) -> bool {
    match value {
        Value::Float32(x) => !x.is_finite(),
        Value::Float64(x) => !x.is_finite(),
        _ => false,
    }
}

/// One feature's values served in a bucket: counted, and counted per bin.
#[derive(Debug, Clone, Default)]
struct Tally {
    count: u64,
    nulls: u64,
    not_found: u64,
    /// NaN and infinite values.
    non_finite: u64,
    bins: Vec<u64>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.count += other.count;
        self.nulls += other.nulls;
        self.not_found += other.not_found;
        self.non_finite += other.non_finite;
        if self.bins.len() < other.bins.len() {
            self.bins.resize(other.bins.len(), 0);
        }
        for (a, b) in self.bins.iter_mut().zip(&other.bins) {
            *a += b;
        }
    }
}

/// A feature's statistics over the window.
struct Stats {
    psi: Option<f64>,
    ks: Option<f64>,
    null_rate: f64,
    not_found_rate: f64,
    /// Of plain numbers: the share of NaN and infinite values.
    non_finite_rate: Option<f64>,
    breach: bool,
}

impl Slot {
    fn stats(&self, t: &Tally) -> Stats {
        let binned: u64 = t.bins.iter().sum();
        let (mut psi_value, mut ks) = (None, None);
        if binned > 0 {
            let share = |k: u64| k as f64 / binned as f64;
            match &self.grid {
                Grid::Numbers { reference_cdf, deciles, reference_shares, .. } => {
                    let mut cdf = Vec::with_capacity(reference_cdf.len());
                    let mut below = 0u64;
                    for b in &t.bins[..reference_cdf.len()] {
                        below += b;
                        cdf.push(share(below));
                    }
                    // The decile bins' counts, as `quiver monitor` counts them.
                    psi_value = shares(&decile_counts(&t.bins, deciles)).map(|current| psi(reference_shares, &current));
                    ks = Some(reference_cdf.iter().zip(&cdf).map(|(r, c)| (r - c).abs()).fold(0.0, f64::max));
                }
                Grid::Categories { reference_shares, .. } => {
                    psi_value = shares(&t.bins).map(|current| psi(reference_shares, &current));
                }
                Grid::None => {}
            }
        }
        let rate = |k: u64| k as f64 / t.count as f64;
        let (null_rate, not_found_rate) = (rate(t.nulls), rate(t.not_found));
        let non_finite_rate = matches!(self.grid, Grid::Numbers { lengths: false, .. }).then(|| rate(t.non_finite));
        let rates = super::Rates { reference: self.reference_null_rate, current: Some(null_rate) };
        let breach = !super::breaches(psi_value, ks, rates, Some(not_found_rate), self.limits).is_empty();
        Stats { psi: psi_value, ks, null_rate, not_found_rate, non_finite_rate, breach }
    }
}

impl Live {
    /// The live monitor `quiver.yaml`'s `monitoring:` asks for, its reference profiled
    /// now; `None` when no reference is set.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the setting: a bad reference or service, a reference
    /// that cannot be profiled.
    pub async fn start(repo: &Repo) -> Result<Option<Live>> {
        let config = &repo.config.monitoring;
        let Some(text) = &config.reference else {
            return Ok(None);
        };
        let bad = |e: Error| Error::Invalid(format!("quiver.yaml: monitoring.reference `{text}`: {e}"));
        let mut window = Window::parse("monitoring.reference", text, quiver_sdk::Timestamp::now())?;
        if let Window::Training(dir) = &window
            && dir.is_relative()
        {
            window = Window::Training(repo.config.repo.join(dir));
        }
        let defs = repo.defs()?;
        let service = match &config.service {
            Some(name) => Some(defs.find_service(name).map_err(|e| Error::Invalid(format!("quiver.yaml: monitoring.service: {}", e.0)))?),
            None => None,
        };
        let refs = match (service, &window) {
            (Some(s), _) => s.features.clone(),
            (None, Window::Training(dir)) => training_features(dir).map_err(bad)?,
            (None, _) => {
                return Err(Error::Invalid(format!(
                    "quiver.yaml: monitoring.reference `{text}` names no features: set monitoring.service to the service to gauge"
                )));
            }
        };
        let mut reference = sources::profiles(repo, &defs, &window, &refs).await.map_err(bad)?;
        // A training set's references name the version they read as its manifest does
        // (none: version 1); a service's, as the registry pins them (none: the latest).
        let training = service.is_none();
        let version = |r: &quiver_sdk::FeatureRef| match r.version {
            Some(v) => v,
            None if training => quiver_sdk::definitions::FIRST_VERSION,
            None => defs.version_read(r),
        };
        let mut slots: HashMap<String, HashMap<String, usize>> = HashMap::new();
        let mut features = Vec::new();
        for r in &refs {
            let profile = reference.remove(&r.to_string()).unwrap_or_default();
            slots.entry(r.view.clone()).or_default().insert(r.feature.clone(), features.len());
            features.push(Slot {
                view: r.view.clone(),
                version: version(r),
                feature: r.feature.clone(),
                limits: defs.limits(service, r),
                reference_null_rate: profile.null_rate(),
                grid: Grid::of(&profile),
            });
        }
        let window_us = i64::try_from(config.window.as_micros()).unwrap_or(i64::MAX);
        Ok(Some(Live {
            reference_name: text.replace(['"', '\\', '\n'], "_"),
            window_us,
            bucket_us: (window_us / BUCKETS).max(1),
            slots,
            features,
            buckets: Mutex::new(VecDeque::new()),
        }))
    }

    /// Counts an answer's values into the current bucket.
    pub fn add(&self, served: &Served) {
        let at = served.request_time - served.request_time.rem_euclid(self.bucket_us);
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Buckets past the window go; answers come in time order, give or take a bucket.
        while buckets.front().is_some_and(|(start, _)| *start + self.bucket_us <= served.request_time - self.window_us) {
            buckets.pop_front();
        }
        let tallies = match buckets.iter_mut().rposition(|(start, _)| *start == at) {
            Some(i) => &mut buckets[i].1,
            None => {
                let fresh = self.features.iter().map(|s| Tally { bins: vec![0; s.grid.bins()], ..Tally::default() }).collect();
                buckets.push_back((at, fresh));
                &mut buckets.back_mut().expect("just pushed").1
            }
        };
        for (i, r) in served.refs.iter().enumerate() {
            let (Some(&slot), Some(column)) =
                (self.slots.get(&r.view).and_then(|v| v.get(&r.feature)), served.columns.get(served.n_keys + i))
            else {
                continue;
            };
            if served.defs.version_read(r) != self.features[slot].version {
                continue; // another version than the reference's: not comparable
            }
            let (grid, tally) = (&self.features[slot].grid, &mut tallies[slot]);
            tally.count += column.values.len() as u64;
            // A NOT_FOUND value is null (on-demand values are never NOT_FOUND), so the
            // statuses are read in the values' pass, for nulls alone.
            let not_found = |j: usize| u64::from(matches!(column.statuses.get(j), Some(Status::NotFound)));
            match grid {
                // Plain numbers, the common case, in a loop of their own.
                Grid::Numbers { points, cells, lengths: false, .. } => {
                    for (j, value) in column.values.iter().enumerate() {
                        // The two common kinds by a test each, not a jump table's dispatch.
                        let x = match value {
                            Value::Float64(x) => *x,
                            Value::Int64(x) => *x as f64,
                            other => other_number(other),
                        };
                        if x.is_finite() {
                            tally.bins[cells.bin(points, x)] += 1;
                        } else if matches!(value, Value::Null) {
                            tally.nulls += 1;
                            tally.not_found += not_found(j);
                        } else if is_non_finite(value) {
                            tally.non_finite += 1;
                        }
                    }
                }
                _ => {
                    for (j, value) in column.values.iter().enumerate() {
                        match grid.bin(value) {
                            Some(b) => tally.bins[b] += 1,
                            None if matches!(value, Value::Null) => {
                                tally.nulls += 1;
                                tally.not_found += not_found(j);
                            }
                            None if is_non_finite(value) => tally.non_finite += 1,
                            None => {}
                        }
                    }
                }
            }
        }
    }

    /// The gauges of each feature served in the window ending `now` (UTC microseconds).
    pub fn render(&self, out: &mut Exposition, now: i64) {
        let mut current: Vec<Tally> = self.features.iter().map(|_| Tally::default()).collect();
        {
            let buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (_, tallies) in buckets.iter().filter(|(start, _)| *start + self.bucket_us > now - self.window_us) {
                for (c, t) in current.iter_mut().zip(tallies) {
                    c.add(t);
                }
            }
        }
        let stats: Vec<(&Slot, Stats)> =
            self.features.iter().zip(&current).filter(|(_, t)| t.count > 0).map(|(s, t)| (s, s.stats(t))).collect();
        type Stat = fn(&Stats) -> Option<f64>;
        let families: [(&str, &str, Stat); 6] = [
            ("quiver_feature_psi", "population stability index of the serving window against the reference", |s| s.psi),
            ("quiver_feature_ks", "Kolmogorov-Smirnov distance of the serving window from the reference", |s| s.ks),
            ("quiver_feature_null_rate", "share of null values served in the window", |s| Some(s.null_rate)),
            ("quiver_feature_not_found_rate", "share of lookups in the window that found no row", |s| Some(s.not_found_rate)),
            ("quiver_feature_non_finite_rate", "share of NaN or infinite values served in the window", |s| s.non_finite_rate),
            ("quiver_feature_breach", "1 when a statistic crosses its threshold, else 0", |s| Some(f64::from(u8::from(s.breach)))),
        ];
        for (name, help, stat) in families {
            out.family(name, Kind::Gauge, help);
            for (slot, s) in &stats {
                if let Some(v) = stat(s) {
                    let labels: [(&str, &dyn std::fmt::Display); 4] =
                        [("view", &slot.view), ("version", &slot.version), ("feature", &slot.feature), ("reference", &self.reference_name)];
                    out.sample(name, &labels, v);
                }
            }
        }
    }
}

/// The features a training set's manifest profiles.
fn training_features(dir: &std::path::Path) -> Result<Vec<quiver_sdk::FeatureRef>> {
    let (_, manifest) = sources::read_manifest(dir)?;
    manifest
        .features
        .iter()
        .map(|f| f.reference.parse().map_err(|e: quiver_sdk::definitions::BadFeatureRef| Error::Invalid(e.to_string())))
        .collect()
}

impl crate::serving_log::Observer for Live {
    fn served(&self, served: &Served) {
        self.add(served);
    }

    fn render(&self, out: &mut Exposition, now: i64) {
        Live::render(self, out, now);
    }
}

#[cfg(test)]
mod tests;
