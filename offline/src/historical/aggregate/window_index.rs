//! The general sweep's index of what is visible: Fenwick trees of sums and extremes,
//! an ordered set of the latest positions.

use std::collections::BTreeSet;

use quiver_runtime::state::{Num, Partial, Sums, pick};
use quiver_sdk::{AggFunction, Aggregation};

/// What one general sweep keeps for one aggregation.
pub(super) enum WindowIndex {
    Sums(Fenwick<Sums>),
    Extreme(Fenwick<Option<Num>>),
    Latest(BTreeSet<u32>),
}

impl WindowIndex {
    pub(super) fn new(agg: &Aggregation, n: usize) -> WindowIndex {
        match agg.function {
            AggFunction::Count | AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev => WindowIndex::Sums(Fenwick::new(n)),
            AggFunction::Min | AggFunction::Max => WindowIndex::Extreme(Fenwick::new(n)),
            AggFunction::Last | AggFunction::LastK => WindowIndex::Latest(BTreeSet::new()),
        }
    }

    /// Makes run position `p`, a non-null value (`x` when the column is numeric),
    /// visible.
    pub(super) fn insert(&mut self, agg: &Aggregation, p: usize, x: Option<Num>) {
        match self {
            WindowIndex::Sums(tree) => {
                let mut one = Sums::default();
                match (agg.function, x) {
                    (AggFunction::Count, _) => one.n = 1,
                    (f, Some(x)) => one.add(f, x),
                    (_, None) => return,
                }
                tree.add(p, &one, |a, b| a.merge(b));
            }
            WindowIndex::Extreme(tree) => {
                if let Some(x) = x {
                    let function = agg.function;
                    tree.add(p, &Some(x), |a, b| *a = extreme(function, *a, *b));
                }
            }
            WindowIndex::Latest(set) => {
                set.insert(p as u32);
            }
        }
    }

    /// The partial of the visible events at run positions `tail..` (sums and extremes).
    pub(super) fn query(&self, agg: &Aggregation, tail: usize) -> Partial {
        let mut partial = Partial::default();
        match self {
            WindowIndex::Sums(tree) => partial.sums = tree.suffix(tail, |a, b| a.merge(b)),
            WindowIndex::Extreme(tree) => {
                let function = agg.function;
                partial.extreme = tree.suffix(tail, |a, b| *a = extreme(function, *a, *b));
            }
            WindowIndex::Latest(_) => unreachable!("latest answers by rows"),
        }
        partial
    }
}

fn extreme(function: AggFunction, a: Option<Num>, b: Option<Num>) -> Option<Num> {
    b.map_or(a, |x| Some(pick(function, a, x)))
}

/// A Fenwick tree answering for suffixes: position `p` is stored at `n - 1 - p`, so a
/// suffix `p..` is a prefix of the reversed positions. Insert-only (no inverse is
/// needed, so min and max work too).
pub(super) struct Fenwick<T> {
    tree: Vec<T>,
}

impl<T: Clone + Default> Fenwick<T> {
    fn new(n: usize) -> Self {
        Fenwick { tree: vec![T::default(); n] }
    }

    fn add(&mut self, p: usize, x: &T, merge: impl Fn(&mut T, &T)) {
        let n = self.tree.len();
        let mut i = n - 1 - p;
        while i < n {
            merge(&mut self.tree[i], x);
            i |= i + 1;
        }
    }

    fn suffix(&self, p: usize, merge: impl Fn(&mut T, &T)) -> T {
        let mut out = T::default();
        let n = self.tree.len();
        if p >= n {
            return out;
        }
        // Prefix of reversed positions 0..=n-1-p.
        let mut i = (n - 1 - p) as isize;
        while i >= 0 {
            merge(&mut out, &self.tree[i as usize]);
            i = (i & (i + 1)) - 1;
        }
        out
    }
}
