//! The byte layout of a record's parts: integers, floats and orders little-endian, and
//! one cell's partial with only what its aggregations read.

use super::super::state::{Dd, EventOrder, Num, Partial, Sums};
use super::CellKind;
use crate::encoding::{DecodeError, Reader, write_value};

pub(super) fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn put_order(out: &mut Vec<u8>, (ts, created, seq): EventOrder) {
    put_i64(out, ts);
    put_i64(out, created);
    put_i64(out, seq);
}

pub(super) fn get_i64(r: &mut Reader<'_>) -> Result<i64, DecodeError> {
    Ok(i64::from_le_bytes(r.array()?))
}

pub(super) fn get_f64(r: &mut Reader<'_>) -> Result<f64, DecodeError> {
    Ok(f64::from_le_bytes(r.array()?))
}

pub(super) fn get_order(r: &mut Reader<'_>) -> Result<EventOrder, DecodeError> {
    Ok((get_i64(r)?, get_i64(r)?, get_i64(r)?))
}

/// An unsigned LEB128 varint: 7 bits a byte, low first.
pub(super) fn put_var(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
pub(super) fn get_var(r: &mut Reader<'_>) -> Result<u64, DecodeError> {
    let first = r.take(1)?[0];
    if first < 0x80 {
        return Ok(u64::from(first));
    }
    get_var_long(r, first)
}

#[cold]
fn get_var_long(r: &mut Reader<'_>, first: u8) -> Result<u64, DecodeError> {
    let mut v = u64::from(first & 0x7f);
    for shift in (7..64).step_by(7) {
        let b = r.take(1)?[0];
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(DecodeError("a varint longer than 10 bytes".into()))
}

/// A varint that must fit a usize (a count, size or position).
pub(super) fn get_size(r: &mut Reader<'_>) -> Result<usize, DecodeError> {
    usize::try_from(get_var(r)?).map_err(|_| DecodeError("a size past the address space".into()))
}

/// A signed integer as a zigzag varint (small magnitudes short, either sign).
pub(super) fn put_zig(out: &mut Vec<u8>, v: i64) {
    put_var(out, ((v << 1) ^ (v >> 63)) as u64);
}

pub(super) fn get_zig(r: &mut Reader<'_>) -> Result<i64, DecodeError> {
    let v = get_var(r)?;
    Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
}

/// Only what the cell's aggregations read. Sums: the count as a varint, then for a
/// numeric column the sum as one float64 and, with stddev, the sum of squared
/// deviations from the mean (computed in double-double when written): a lookup reads one
/// suffix partial and never subtracts two, so one rounding each keeps well inside the
/// 1e-9 the online answer owes, at 17 bytes instead of 40. Sums that overflowed (or an
/// undefined spread) keep both double-doubles; the count's low bit says which. An
/// integer sum is a zigzag varint, an integer extreme too. A latest list holds the
/// values without their order: every event of a tile comes before every pending one,
/// and the list is in order.
pub(super) fn put_cell(out: &mut Vec<u8>, kind: &CellKind, p: &Partial) {
    match *kind {
        CellKind::Sums { numeric, integer, squares } => {
            let s = &p.sums;
            let n = s.n.max(0) as u64;
            let sum = s.sum.to_f64();
            let spread = if squares && s.n > 0 { s.squares.minus(s.sum.squared().div_f64(s.n as f64)).to_f64() } else { 0.0 };
            let full = !(sum.is_finite() && spread.is_finite());
            put_var(out, (n << 1) | u64::from(full));
            if integer {
                put_zig(out, s.int_sum);
            }
            if full {
                for dd in [s.sum, s.squares] {
                    put_f64(out, dd.hi);
                    put_f64(out, dd.lo);
                }
                return;
            }
            if numeric {
                put_f64(out, sum);
            }
            if squares {
                put_f64(out, spread);
            }
        }
        CellKind::Extreme(_) => match p.extreme {
            None => out.push(0),
            Some(Num::I(x)) => {
                out.push(1);
                put_zig(out, x);
            }
            Some(Num::F(x)) => {
                out.push(2);
                put_f64(out, x);
            }
        },
        CellKind::Latest { .. } => {
            put_var(out, p.latest.len() as u64);
            for (_, value) in &p.latest {
                write_value(out, value);
            }
        }
    }
}

/// The order given to a stored latest value: before any real event's.
const STORED: EventOrder = (i64::MIN, i64::MIN, i64::MIN);

pub(super) fn get_cell(r: &mut Reader<'_>, kind: &CellKind) -> Result<Partial, DecodeError> {
    let mut p = Partial::default();
    let dd = |r: &mut Reader<'_>| -> Result<Dd, DecodeError> { Ok(Dd { hi: get_f64(r)?, lo: get_f64(r)? }) };
    match *kind {
        CellKind::Sums { numeric, integer, squares } => {
            let head = get_var(r)?;
            let n = i64::try_from(head >> 1).map_err(|_| DecodeError("a count past int64".into()))?;
            let mut sums = Sums { n, ..Sums::default() };
            if integer {
                sums.int_sum = get_zig(r)?;
            }
            if head & 1 == 1 {
                sums.sum = dd(r)?;
                sums.squares = dd(r)?;
            } else {
                if numeric {
                    sums.sum = Dd::from_f64(get_f64(r)?);
                }
                if squares {
                    let spread = Dd::from_f64(get_f64(r)?);
                    // Back to a sum of squares the merge and finish of every partial use:
                    // the spread plus sum^2 / n, which finish takes away again.
                    sums.squares = if n > 0 { spread.plus(sums.sum.squared().div_f64(n as f64)) } else { spread };
                }
            }
            p.sums = sums;
        }
        CellKind::Extreme(_) => {
            p.extreme = match r.take(1)?[0] {
                0 => None,
                1 => Some(Num::I(get_zig(r)?)),
                2 => Some(Num::F(get_f64(r)?)),
                t => return Err(DecodeError(format!("unknown extreme tag {t}"))),
            }
        }
        CellKind::Latest { k } => {
            let n = get_size(r)?;
            if n > k {
                return Err(DecodeError(format!("{n} latest values where at most {k} are kept")));
            }
            for _ in 0..n {
                p.latest.push((STORED, r.value()?));
            }
        }
    }
    Ok(p)
}

/// Moves past one cell of a tile (a latest list by its tag) without building it.
pub(super) fn skip_cell(r: &mut Reader<'_>, kind: &CellKind) -> Result<(), DecodeError> {
    match *kind {
        CellKind::Sums { .. } | CellKind::Extreme(_) => get_cell(r, kind).map(drop),
        CellKind::Latest { .. } => {
            // A latest list's tag: 1 a reference (a varint), 0 the list inline.
            if r.take(1)?[0] == 1 {
                return get_var(r).map(drop);
            }
            for _ in 0..get_size(r)? {
                r.skip_value()?;
            }
            Ok(())
        }
    }
}
