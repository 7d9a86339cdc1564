//! Comparing profiles: PSI over the reference's deciles or categories, the KS distance.
//!
//! One computation for `quiver monitor` and the server's gauges (docs/monitoring.md):
//! the reference's bins ([`decile_edges`], [`category_bins`]) and its shares in them
//! read off its sketches ([`sketch_shares`]); the current window's values counted
//! exactly into those bins ([`bin`], [`super::Counted`]), their shares [`shares`], and
//! [`psi`] over the two.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Categories, Counted, Numbers, Profile};

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
    /// How the current shares were found. Absent: the current window's values were
    /// counted into the bins, exactly. A number: they were read off its quantile sketch
    /// (a training set's profile holds no values), each share within this of the exact
    /// one (the sketch's two-sided rank error at 99% confidence; 0 while it holds every
    /// value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_error: Option<f64>,
}

impl Bins {
    /// `current`'s and `reference`'s shares over `reference`'s deciles (equal edges
    /// merged), both read off their sketches; `None` when either has no numbers.
    pub fn deciles(reference: &Numbers, current: &Numbers) -> Option<Bins> {
        let edges = decile_edges(reference)?;
        Some(Bins {
            reference: sketch_shares(reference, &edges)?,
            current: sketch_shares(current, &edges)?,
            edges,
            current_error: Some(current.share_error()),
        })
    }

    /// The reference's shares over the edges `counted` was counted into (its deciles,
    /// [`Binning::of`]), and the current window's shares counted exactly; `None` when
    /// nothing was counted (or the bins are a category's).
    pub fn counted(reference: &Numbers, counted: &Counted) -> Option<Bins> {
        let (Binning::Numbers(edges) | Binning::Lengths(edges)) = &*counted.binning else {
            return None;
        };
        Some(Bins {
            reference: sketch_shares(reference, edges)?,
            current: shares(&counted.counts)?,
            edges: edges.clone(),
            current_error: None,
        })
    }

    pub fn psi(&self) -> f64 {
        psi(&self.reference, &self.current)
    }
}

/// The bins a reference gives for counting another window's values exactly: its decile
/// edges (numbers, or a list feature's lengths), or its top categories with "other".
#[derive(Debug, Clone, PartialEq)]
pub enum Binning {
    /// Bin `k` holds the values above `edges[k - 1]` up to `edges[k]` ([`bin`]).
    Numbers(Vec<f64>),
    /// As `Numbers`, for a list feature's lengths.
    Lengths(Vec<f64>),
    /// The reference's top categories, one bin each in order; any other value falls in
    /// the last bin, "other".
    Categories { values: Vec<String>, index: HashMap<String, usize> },
}

impl Binning {
    /// The bins PSI compares `reference` over; `None` when it has no values to bin.
    pub fn of(reference: &Profile) -> Option<Binning> {
        match (&reference.numbers, &reference.categories, &reference.lengths) {
            (Some(n), _, _) => decile_edges(n).map(Binning::Numbers),
            (None, None, Some(n)) => decile_edges(n).map(Binning::Lengths),
            (None, Some(c), _) if c.total() > 0 => {
                let (values, _) = category_bins(c);
                let index = values.iter().enumerate().map(|(i, v)| (v.clone(), i)).collect();
                Some(Binning::Categories { values, index })
            }
            _ => None,
        }
    }

    /// How many bins there are.
    pub fn bins(&self) -> usize {
        match self {
            Binning::Numbers(edges) | Binning::Lengths(edges) => edges.len() + 1,
            Binning::Categories { values, .. } => values.len() + 1,
        }
    }
}

/// The bin of the number `x` among ascending `edges`: the count of edges below it, so
/// bin `k` holds the values above `edges[k - 1]` up to `edges[k]`, and the last those
/// above every edge. The server's gauges find the same bin faster (`src/monitor/live.rs`).
pub fn bin(edges: &[f64], x: f64) -> usize {
    edges.partition_point(|e| *e < x)
}

/// Each bin's share of the values counted; `None` when none were.
pub fn shares(counts: &[u64]) -> Option<Vec<f64>> {
    let total: u64 = counts.iter().sum();
    (total > 0).then(|| counts.iter().map(|&k| k as f64 / total as f64).collect())
}

/// `profile`'s shares in the bins `edges` make, read off its quantile sketch (ranks at
/// the edges, within its rank error); `None` when it has no numbers.
pub fn sketch_shares(profile: &Numbers, edges: &[f64]) -> Option<Vec<f64>> {
    let mut out = Vec::with_capacity(edges.len() + 1);
    let mut below = 0.0;
    for e in edges {
        let at = profile.cdf(*e)?;
        out.push(at - below);
        below = at;
    }
    out.push(1.0 - below);
    Some(out)
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

/// The reference's categories PSI compares over (its top values, at most
/// [`super::TOP_CATEGORIES`], most frequent first) and its share in each, with "other"'s
/// share last (one more share than values).
pub fn category_bins(reference: &Categories) -> (Vec<String>, Vec<f64>) {
    let top = reference.top();
    let total = reference.total().max(1) as f64;
    let mut shares: Vec<f64> = top.iter().map(|(_, n)| *n as f64 / total).collect();
    shares.push((1.0 - shares.iter().sum::<f64>()).max(0.0));
    (top.into_iter().map(|(v, _)| v).collect(), shares)
}

/// `current`'s shares of `values` and "other", read off its frequent items sketch
/// (exact while it tracks every distinct value; within [`Categories::share_error`]).
pub fn sketch_category_shares(values: &[String], current: &Categories) -> Vec<f64> {
    let total = current.total().max(1) as f64;
    let mut shares: Vec<f64> = values.iter().map(|v| current.count(v) as f64 / total).collect();
    shares.push((1.0 - shares.iter().sum::<f64>()).max(0.0));
    shares
}

/// The categories PSI compares over (the reference's top values and "other") and each
/// side's shares in them; `None` when either side counted nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryShares {
    /// The reference's top values, most frequent first, then `(other)`.
    pub values: Vec<String>,
    pub reference: Vec<f64>,
    pub current: Vec<f64>,
    /// As [`Bins::current_error`]: absent when the current values were counted, else
    /// how far each named value's share read off the frequent items sketch may be off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_error: Option<f64>,
}

impl CategoryShares {
    /// `current`'s shares over `reference`'s categories: its values counted into them
    /// when it counted them ([`Profile::counting`]), else read off its sketch (with the
    /// sketch's error bound); `None` when either side counted nothing.
    pub fn of(reference: &Categories, current: &Profile) -> Option<CategoryShares> {
        if reference.total() == 0 {
            return None;
        }
        let (mut values, rs) = category_bins(reference);
        let (cs, current_error) = match current.counted.as_ref() {
            Some(Counted { binning, counts }) if matches!(**binning, super::Binning::Categories { .. }) => (shares(counts)?, None),
            Some(_) => return None,
            None => {
                let c = current.categories.as_ref().filter(|c| c.total() > 0)?;
                (sketch_category_shares(&values, c), Some(c.share_error()))
            }
        };
        values.push("(other)".into());
        Some(CategoryShares { values, reference: rs, current: cs, current_error })
    }

    pub fn psi(&self) -> f64 {
        psi(&self.reference, &self.current)
    }
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
