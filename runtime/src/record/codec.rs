//! The byte layout of a record's parts: integers, floats and orders little-endian, a
//! tile's own sums with only what its aggregations read, extremes.

use crate::encoding::{DecodeError, Reader};
use crate::state::{Dd, EventOrder, Num, Sums};

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
    let first = r.byte()?;
    if first < 0x80 {
        return Ok(u64::from(first));
    }
    let second = r.byte()?;
    if second < 0x80 {
        return Ok(u64::from(first & 0x7f) | (u64::from(second) << 7));
    }
    get_var_long(r, u64::from(first & 0x7f) | (u64::from(second & 0x7f) << 7))
}

#[cold]
fn get_var_long(r: &mut Reader<'_>, low: u64) -> Result<u64, DecodeError> {
    let mut v = low;
    for shift in (14..64).step_by(7) {
        let b = r.byte()?;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(DecodeError("a varint longer than 10 bytes".into()))
}

/// A varint that must fit a usize (a count, size or position).
#[inline]
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

/// A float sum's high part as a short decimal, `m / 10^scale` exactly (so the division
/// gives back the very same double), where one exists with `scale <= 4`: money,
/// minutes and counts then take two or three bytes instead of eight.
fn decimal(x: f64) -> Option<(u8, i64)> {
    if x == 0.0 && x.is_sign_negative() {
        return None;
    }
    for scale in 0..=4u8 {
        let p = DECIMAL[usize::from(scale)];
        let m = (x * p).round();
        if m.abs() < 9.0e15 && m / p == x {
            return Some((scale, m as i64));
        }
    }
    None
}

const DECIMAL: [f64; 5] = [1.0, 10.0, 100.0, 1000.0, 10000.0];

/// The sums of a tile and every newer one (a window's sums, when the tile is its oldest).
/// A head varint: the count, then bit 4 set when the sum's low part follows, bit 3 when
/// the squares are those of the sum alone (one value: implied, not written), bits 0-2
/// how the sum's high part is written: 0 zero, 1-5 a decimal of scale 0-4 (a zigzag
/// varint), 6 a float64, 7 everything raw (sums and squares as double-doubles: an
/// overflowed sum). Then an integer column's exact sum (zigzag), the sum (rounded once;
/// as a double-double, exactly, where the record has pending events, which a lookup
/// may add to it and cancel its high part: `exact`), and
/// with stddev over two values or more the spread (the sum of squared deviations from
/// the mean, computed in double-double, rounded once: a lookup reads one suffix and
/// never subtracts two, so one rounding stays well inside the 1e-9 the answer owes).
pub(super) fn put_sums(out: &mut Vec<u8>, s: &Sums, numeric: bool, integer: bool, squares: bool, exact: bool) {
    let n = s.n.max(0) as u64;
    let sum = if exact { s.sum.hi } else { s.sum.to_f64() };
    let implied = squares && s.n == 1 && Dd::from_f64(sum).squared() == s.squares;
    let spread = if squares && s.n > 1 { s.squares.minus(s.sum.squared().div_f64(s.n as f64)).to_f64() } else { 0.0 };
    let raw = numeric && !(sum.is_finite() && s.sum.lo.is_finite() && spread.is_finite() && (implied || s.n != 1 || !squares));
    let (mode, digits) = if !numeric || raw {
        (if raw { 7 } else { 0 }, None)
    } else if sum.to_bits() == 0 {
        (0, None)
    } else {
        match decimal(sum) {
            Some((scale, m)) => (1 + scale, Some(m)),
            None => (6, None),
        }
    };
    let lo = exact && numeric && !raw && s.sum.lo.to_bits() != 0;
    put_var(out, (n << 5) | (u64::from(lo) << 4) | (u64::from(implied) << 3) | u64::from(mode));
    if integer {
        put_zig(out, s.int_sum);
    }
    if raw {
        for dd in [s.sum, s.squares] {
            put_f64(out, dd.hi);
            put_f64(out, dd.lo);
        }
        return;
    }
    match (mode, digits) {
        (_, Some(m)) => put_zig(out, m),
        (6, None) => put_f64(out, sum),
        _ => {}
    }
    if lo {
        put_f64(out, s.sum.lo);
    }
    if squares && s.n > 1 {
        put_f64(out, spread);
    }
}

pub(super) fn get_sums(r: &mut Reader<'_>, numeric: bool, integer: bool, squares: bool) -> Result<Sums, DecodeError> {
    let head = get_var(r)?;
    let n = i64::try_from(head >> 5).map_err(|_| DecodeError("a count past int64".into()))?;
    let mut s = Sums { n, ..Sums::default() };
    if integer {
        s.int_sum = get_zig(r)?;
    }
    let mode = head & 7;
    if mode == 7 {
        s.sum = Dd { hi: get_f64(r)?, lo: get_f64(r)? };
        s.squares = Dd { hi: get_f64(r)?, lo: get_f64(r)? };
        return Ok(s);
    }
    if !numeric && mode != 0 {
        return Err(DecodeError(format!("a sum of a non-numeric column (mode {mode})")));
    }
    s.sum.hi = match mode {
        0 => 0.0,
        6 => get_f64(r)?,
        scale => get_zig(r)? as f64 / DECIMAL[(scale - 1) as usize],
    };
    if head & 16 != 0 {
        s.sum.lo = get_f64(r)?;
    }
    if squares {
        if head & 8 != 0 {
            s.squares = s.sum.squared();
        } else if n > 1 {
            // Back to a sum of squares the merge and finish of every partial use: the
            // spread plus sum^2 / n, which finish takes away again.
            s.squares = Dd::from_f64(get_f64(r)?).plus(s.sum.squared().div_f64(n as f64));
        }
    }
    Ok(s)
}

/// Moves past one [`put_sums`] without building it.
pub(super) fn skip_sums(r: &mut Reader<'_>, integer: bool, squares: bool) -> Result<(), DecodeError> {
    let head = get_var(r)?;
    if integer {
        get_var(r)?;
    }
    let floats = match head & 7 {
        7 => return r.take(32).map(drop),
        0 => 0,
        6 => 8,
        _ => {
            get_var(r)?;
            0
        }
    };
    let lo = if head & 16 != 0 { 8 } else { 0 };
    r.take(floats + lo + if squares && head >> 5 > 1 { 8 } else { 0 }).map(drop)
}

/// A min or max: a tag (0 none, 1 an integer as a zigzag varint, 2 a float64), then it.
pub(super) fn put_extreme(out: &mut Vec<u8>, x: Option<Num>) {
    match x {
        None => out.push(0),
        Some(Num::I(x)) => {
            out.push(1);
            put_zig(out, x);
        }
        Some(Num::F(x)) => {
            out.push(2);
            put_f64(out, x);
        }
    }
}

pub(super) fn get_extreme(r: &mut Reader<'_>) -> Result<Option<Num>, DecodeError> {
    Ok(match r.byte()? {
        0 => None,
        1 => Some(Num::I(get_zig(r)?)),
        2 => Some(Num::F(get_f64(r)?)),
        t => return Err(DecodeError(format!("unknown extreme tag {t}"))),
    })
}

/// The order given to a stored latest value: before any real event's.
pub(super) const STORED: EventOrder = (i64::MIN, i64::MIN, i64::MIN);
