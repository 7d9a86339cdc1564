//! The partial aggregate both paths build and the one function that turns it into a
//! served value.
//!
//! Float sums are kept as double-doubles (about 32 significant digits), so the order in
//! which events are added — row by row, tile by tile, node by node of an index — moves
//! the result by far less than the 1e-9 relative docs/aggregations.md allows; integer sums wrap
//! modulo 2^64 (exact, whatever the order, as long as the true sum fits an int64).

use std::cmp::Ordering;

use crate::encoding::Value;
use quiver_sdk::aggregation::{AggFunction, Aggregation};
use quiver_sdk::types::{DType, ListElement};

/// A double-double number: `hi + lo` with `|lo| <= ulp(hi) / 2`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Dd {
    pub hi: f64,
    pub lo: f64,
}

fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// `a * b - p` exactly, for `p = a * b` rounded: with a fused multiply-add where the
/// target has one, else by Dekker's product of Veltkamp halves — the same exact error
/// term, without a call into libm's software `fma` (several times slower) on every
/// product. Near overflow or underflow, where the halves would not be exact, `fma`.
#[inline]
fn product_error(a: f64, b: f64, p: f64) -> f64 {
    #[cfg(target_feature = "fma")]
    {
        a.mul_add(b, -p)
    }
    #[cfg(not(target_feature = "fma"))]
    {
        const LARGE: f64 = 1e290;
        const SMALL: f64 = 1e-250;
        if !(a.abs() < LARGE && b.abs() < LARGE && p.abs() < LARGE && p.abs() > SMALL) {
            return a.mul_add(b, -p);
        }
        let split = |x: f64| {
            let c = 134_217_729.0 * x; // 2^27 + 1
            let h = c - (c - x);
            (h, x - h)
        };
        let ((ah, al), (bh, bl)) = (split(a), split(b));
        ((ah * bh - p) + ah * bl + al * bh) + al * bl
    }
}

fn quick_two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    Dd { hi: s, lo: b - (s - a) }
}

impl Dd {
    pub fn from_f64(x: f64) -> Dd {
        Dd { hi: x, lo: 0.0 }
    }

    /// An int64, exactly.
    pub fn from_i64(x: i64) -> Dd {
        if x.unsigned_abs() <= 1 << 53 {
            // Exact in one double (and without the software i128 conversions below).
            return Dd { hi: x as f64, lo: 0.0 };
        }
        let hi = x as f64;
        Dd { hi, lo: (i128::from(x) - hi as i128) as f64 }
    }

    /// `x * x`, exactly.
    pub fn square(x: f64) -> Dd {
        let p = x * x;
        if !p.is_finite() {
            return Dd::from_f64(p);
        }
        Dd { hi: p, lo: product_error(x, x, p) }
    }

    /// The square of a double-double (to about 32 digits).
    pub fn squared(self) -> Dd {
        self.times(self)
    }

    #[must_use]
    pub fn plus(self, o: Dd) -> Dd {
        let (s, e) = two_sum(self.hi, o.hi);
        if !s.is_finite() {
            return Dd::from_f64(s);
        }
        quick_two_sum(s, e + self.lo + o.lo)
    }

    #[must_use]
    pub fn minus(self, o: Dd) -> Dd {
        self.plus(Dd { hi: -o.hi, lo: -o.lo })
    }

    #[must_use]
    pub fn times(self, o: Dd) -> Dd {
        let p = self.hi * o.hi;
        if !p.is_finite() {
            return Dd::from_f64(p);
        }
        let e = product_error(self.hi, o.hi, p) + (self.hi * o.lo + self.lo * o.hi);
        quick_two_sum(p, e)
    }

    #[must_use]
    pub fn div_f64(self, d: f64) -> Dd {
        let q1 = self.hi / d;
        if !q1.is_finite() {
            return Dd::from_f64(q1);
        }
        let p = q1 * d;
        let pe = product_error(q1, d, p);
        let q2 = (((self.hi - p) - pe) + self.lo) / d;
        quick_two_sum(q1, q2)
    }

    pub fn to_f64(self) -> f64 {
        if self.hi.is_finite() { self.hi + self.lo } else { self.hi }
    }
}

/// A numeric column value: integers as int64, floats as float64 (float32 widened,
/// exactly). Floats order by IEEE total order, so NaN sorts above +inf.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    I(i64),
    F(f64),
}

impl Num {
    /// A numeric value; `None` for null and non-numeric values.
    pub fn of(v: &Value) -> Option<Num> {
        Some(match v {
            Value::Int32(x) => Num::I(i64::from(*x)),
            Value::Int64(x) => Num::I(*x),
            Value::Float32(x) => Num::F(f64::from(*x)),
            Value::Float64(x) => Num::F(*x),
            _ => return None,
        })
    }

    /// Integers by value, floats by IEEE total order.
    pub fn order(&self, o: &Num) -> Ordering {
        match (self, o) {
            (Num::I(a), Num::I(b)) => a.cmp(b),
            (Num::F(a), Num::F(b)) => a.total_cmp(b),
            (Num::I(_), Num::F(_)) => Ordering::Less,
            (Num::F(_), Num::I(_)) => Ordering::Greater,
        }
    }

    fn dd(&self) -> Dd {
        match self {
            Num::I(x) => Dd::from_i64(*x),
            Num::F(x) => Dd::from_f64(*x),
        }
    }

    fn square(&self) -> Dd {
        match self {
            Num::I(x) => Dd::from_i64(*x).squared(),
            Num::F(x) => Dd::square(*x),
        }
    }

    /// As a value of the column's type.
    pub fn value(&self, column: DType) -> Value {
        match (self, column) {
            (Num::I(x), DType::Int32) => Value::Int32(*x as i32),
            (Num::I(x), _) => Value::Int64(*x),
            (Num::F(x), DType::Float32) => Value::Float32(*x as f32),
            (Num::F(x), _) => Value::Float64(*x),
        }
    }
}

/// The order of events for `last`/`last_k`: event time, created time (0 when the view
/// has none), ingestion order.
pub type EventOrder = (i64, i64, i64);

/// The sums a numeric function needs: non-null count, the wrapping integer sum, the
/// sum and the sum of squares.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sums {
    pub n: i64,
    pub int_sum: i64,
    pub sum: Dd,
    pub squares: Dd,
}

impl Sums {
    /// Adds a value to what `function` reads: the integer sum for sum, the squares for
    /// stddev (so a partial holds only what its tile encodes).
    pub fn add(&mut self, function: AggFunction, x: Num) {
        self.n += 1;
        if let (AggFunction::Sum, Num::I(i)) = (function, x) {
            self.int_sum = self.int_sum.wrapping_add(i);
        }
        self.sum = self.sum.plus(x.dd());
        if function == AggFunction::Stddev {
            self.squares = self.squares.plus(x.square());
        }
    }

    /// Adds a value to every sum one column's aggregations read at once (the integer
    /// sum of an integer, the sum, the squares when `squares`): the prefix sums the
    /// offline sweep shares between the aggregations of a column.
    pub fn add_all(&mut self, x: Num, squares: bool) {
        self.n += 1;
        if let Num::I(i) = x {
            self.int_sum = self.int_sum.wrapping_add(i);
        }
        self.sum = self.sum.plus(x.dd());
        if squares {
            self.squares = self.squares.plus(x.square());
        }
    }

    /// The sums of the values in `self` but not in `before` (a prefix of `self`'s).
    pub fn since(&self, before: &Sums) -> Sums {
        Sums {
            n: self.n - before.n,
            int_sum: self.int_sum.wrapping_sub(before.int_sum),
            sum: self.sum.minus(before.sum),
            squares: self.squares.minus(before.squares),
        }
    }

    pub fn merge(&mut self, o: &Sums) {
        self.n += o.n;
        self.int_sum = self.int_sum.wrapping_add(o.int_sum);
        self.sum = self.sum.plus(o.sum);
        self.squares = self.squares.plus(o.squares);
    }
}

/// A partial aggregate of some events for one aggregation; partials of disjoint sets
/// of events merge into the partial of their union.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Partial {
    /// Count, sum, avg, stddev.
    pub sums: Sums,
    /// Min or max (of the non-null values).
    pub extreme: Option<Num>,
    /// Last and last_k: the latest non-null values, newest first, at most `keep`.
    pub latest: Vec<(EventOrder, Value)>,
}

impl Partial {
    /// Adds one event's value (null values are skipped by every function).
    pub fn push(&mut self, agg: &Aggregation, order: EventOrder, value: &Value) {
        if matches!(value, Value::Null) {
            return;
        }
        match agg.function {
            AggFunction::Count => self.sums.n += 1,
            AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev => {
                if let Some(x) = Num::of(value) {
                    self.sums.add(agg.function, x);
                }
            }
            AggFunction::Min | AggFunction::Max => {
                if let Some(x) = Num::of(value) {
                    self.extreme = Some(pick(agg.function, self.extreme, x));
                }
            }
            AggFunction::Last | AggFunction::LastK => self.push_latest(order, value, agg.keep()),
        }
    }

    /// Keeps `value` among the latest `keep` non-null values, newest first.
    pub fn push_latest(&mut self, order: EventOrder, value: &Value, keep: usize) {
        let at = self.latest.partition_point(|(o, _)| *o > order);
        if at < keep {
            self.latest.insert(at, (order, value.clone()));
            self.latest.truncate(keep);
        }
    }

    /// Adds the events of another partial of the same aggregation.
    pub fn merge(&mut self, agg: &Aggregation, o: &Partial) {
        match agg.function {
            AggFunction::Count | AggFunction::Sum | AggFunction::Avg | AggFunction::Stddev => self.sums.merge(&o.sums),
            AggFunction::Min | AggFunction::Max => {
                if let Some(x) = o.extreme {
                    self.extreme = Some(pick(agg.function, self.extreme, x));
                }
            }
            AggFunction::Last | AggFunction::LastK => {
                for (order, value) in &o.latest {
                    // Values arrive as `o` keeps them (non-null), so `push` keeps them.
                    self.push(agg, *order, value);
                }
            }
        }
    }

    /// The served value (docs/aggregations.md) of `agg` over a column of type `column`: on no
    /// values, count 0, last_k `[]`, the others null.
    pub fn finish(&self, agg: &Aggregation, column: DType) -> Value {
        let s = &self.sums;
        let integer = matches!(column, DType::Int32 | DType::Int64);
        match agg.function {
            AggFunction::Count => Value::Int64(s.n),
            _ if agg.function.is_numeric() && s.n == 0 && self.extreme.is_none() => Value::Null,
            AggFunction::Sum if integer => Value::Int64(s.int_sum),
            AggFunction::Sum => Value::Float64(s.sum.to_f64()),
            AggFunction::Avg => Value::Float64(s.sum.div_f64(s.n as f64).to_f64()),
            AggFunction::Stddev if s.n < 2 => Value::Null,
            AggFunction::Stddev => {
                let n = s.n as f64;
                let var = s.squares.minus(s.sum.squared().div_f64(n)).div_f64(n - 1.0).to_f64();
                Value::Float64(if var < 0.0 { 0.0 } else { var.sqrt() })
            }
            AggFunction::Min | AggFunction::Max => self.extreme.map_or(Value::Null, |x| x.value(column)),
            AggFunction::Last => self.latest.first().map_or(Value::Null, |(_, v)| v.clone()),
            AggFunction::LastK => last_k_list(column, self.latest.iter().map(|(_, v)| v)),
        }
    }
}

/// The better of `current` and `x` for min or max (IEEE total order for floats; a tie
/// keeps `current`).
pub fn pick(function: AggFunction, current: Option<Num>, x: Num) -> Num {
    match current {
        None => x,
        Some(c) => {
            let better = match function {
                AggFunction::Min => x.order(&c) == Ordering::Less,
                _ => x.order(&c) == Ordering::Greater,
            };
            if better { x } else { c }
        }
    }
}

/// The values of `last_k`, newest first, as the list type of the column
/// ([`quiver_sdk::aggregation::list_element`]).
pub fn last_k_list<'a>(column: DType, values: impl Iterator<Item = &'a Value>) -> Value {
    match quiver_sdk::aggregation::list_element(column) {
        Some(ListElement::Int64) => {
            Value::ListInt64(values.filter_map(|v| if let Some(Num::I(i)) = Num::of(v) { Some(i) } else { None }).collect())
        }
        Some(ListElement::Float32) => {
            Value::ListFloat32(values.filter_map(|v| if let Value::Float32(x) = v { Some(*x) } else { None }).collect())
        }
        Some(ListElement::Float64) => {
            Value::ListFloat64(values.filter_map(|v| if let Value::Float64(x) = v { Some(*x) } else { None }).collect())
        }
        Some(ListElement::String) => {
            Value::ListString(values.filter_map(|v| if let Value::String(s) = v { Some(s.clone()) } else { None }).collect())
        }
        None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_sdk::Ttl;

    fn agg(f: AggFunction) -> Aggregation {
        Aggregation::new("a", f, "c", Ttl::from_secs(3600)).with_k(2)
    }

    #[test]
    fn the_product_error_is_fmas_bit_for_bit() {
        // An xorshift's bits as floats of every magnitude and sign, and decimals.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for k in 0..200_000 {
            let (a, b) = if k % 2 == 0 {
                (f64::from_bits(next()), f64::from_bits(next()))
            } else {
                ((next() % 1_000_000) as f64 / 100.0, (next() % 10_000) as f64 / 1000.0 - 5.0)
            };
            let p = a * b;
            let (got, want) = (product_error(a, b, p), a.mul_add(b, -p));
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{a:e} * {b:e}: {got:e} vs {want:e}");
        }
    }

    #[test]
    fn double_doubles_keep_what_plain_floats_lose() {
        let mut s = Dd::default();
        for x in [1e16, 1.0, -1e16, 1.0] {
            s = s.plus(Dd::from_f64(x));
        }
        assert_eq!(s.to_f64(), 2.0);
        assert_eq!(Dd::from_i64(i64::MAX).plus(Dd::from_i64(-1)).minus(Dd::from_i64(i64::MAX - 1)).to_f64(), 0.0);
        assert_eq!(Dd::from_f64(1.0).div_f64(3.0).to_f64(), 1.0 / 3.0);
        assert!(Dd::from_f64(f64::INFINITY).plus(Dd::from_f64(1.0)).to_f64().is_infinite());
    }

    #[test]
    fn stddev_survives_a_large_mean() {
        let mut p = Partial::default();
        let a = agg(AggFunction::Stddev);
        for (i, x) in [1e9 + 1.0, 1e9 + 2.0, 1e9 + 3.0].iter().enumerate() {
            p.push(&a, (i as i64, 0, 0), &Value::Float64(*x));
        }
        assert_eq!(p.finish(&a, DType::Float64), Value::Float64(1.0));
    }

    #[test]
    fn merging_partials_equals_pushing_all() {
        let values: Vec<Value> = (0..20).map(|i| if i % 5 == 0 { Value::Null } else { Value::Int64(i * 7 % 11 - 5) }).collect();
        for f in [
            AggFunction::Count,
            AggFunction::Sum,
            AggFunction::Avg,
            AggFunction::Stddev,
            AggFunction::Min,
            AggFunction::Max,
            AggFunction::Last,
            AggFunction::LastK,
        ] {
            let a = agg(f);
            let (mut all, mut left, mut right) = (Partial::default(), Partial::default(), Partial::default());
            for (i, v) in values.iter().enumerate() {
                let order = (i as i64 / 3, 0, i as i64);
                all.push(&a, order, v);
                if i % 2 == 0 { left.push(&a, order, v) } else { right.push(&a, order, v) }
            }
            left.merge(&a, &right);
            assert_eq!(left.finish(&a, DType::Int64), all.finish(&a, DType::Int64), "{f}");
        }
    }

    #[test]
    fn empty_windows() {
        let p = Partial::default();
        assert_eq!(p.finish(&agg(AggFunction::Count), DType::String), Value::Int64(0));
        assert_eq!(p.finish(&agg(AggFunction::LastK), DType::String), Value::ListString(vec![]));
        for f in [AggFunction::Sum, AggFunction::Avg, AggFunction::Stddev, AggFunction::Min, AggFunction::Max, AggFunction::Last] {
            assert_eq!(p.finish(&agg(f), DType::Float64), Value::Null, "{f}");
        }
    }
}
