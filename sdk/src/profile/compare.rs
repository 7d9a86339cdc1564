//! Comparing profiles: PSI over the reference's deciles or categories, the KS distance.

use serde::{Deserialize, Serialize};

use super::{Categories, Numbers};

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
