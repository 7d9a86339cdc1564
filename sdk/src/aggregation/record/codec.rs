//! The byte layout of a record's parts: integers, floats and orders little-endian, and
//! one cell's partial with only what its aggregations read.

use super::super::state::{Dd, EventOrder, Num, Partial, Sums};
use super::CellKind;
use crate::encoding::{DecodeError, Reader, write_value};

pub(super) fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

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

/// Only what the cell's aggregations read: a count is 8 bytes, sums of a float
/// column 24, with squares 40. A latest list holds the values without their order:
/// every event of a tile comes before every pending one, and the list is in order.
pub(super) fn put_cell(out: &mut Vec<u8>, kind: &CellKind, p: &Partial) {
    match *kind {
        CellKind::Sums { numeric, integer, squares } => {
            put_i64(out, p.sums.n);
            if numeric {
                put_f64(out, p.sums.sum.hi);
                put_f64(out, p.sums.sum.lo);
            }
            if integer {
                put_i64(out, p.sums.int_sum);
            }
            if squares {
                put_f64(out, p.sums.squares.hi);
                put_f64(out, p.sums.squares.lo);
            }
        }
        CellKind::Extreme(_) => match p.extreme {
            None => out.push(0),
            Some(Num::I(x)) => {
                out.push(1);
                put_i64(out, x);
            }
            Some(Num::F(x)) => {
                out.push(2);
                put_f64(out, x);
            }
        },
        CellKind::Latest { .. } => {
            put_len(out, p.latest.len());
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
            let mut sums = Sums { n: get_i64(r)?, ..Sums::default() };
            if numeric {
                sums.sum = dd(r)?;
            }
            if integer {
                sums.int_sum = get_i64(r)?;
            }
            if squares {
                sums.squares = dd(r)?;
            }
            p.sums = sums;
        }
        CellKind::Extreme(_) => {
            p.extreme = match r.take(1)?[0] {
                0 => None,
                1 => Some(Num::I(get_i64(r)?)),
                2 => Some(Num::F(get_f64(r)?)),
                t => return Err(DecodeError(format!("unknown extreme tag {t}"))),
            }
        }
        CellKind::Latest { k } => {
            let n = r.len()?;
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

/// Moves past one cell of a tile (a latest list by its tag).
pub(super) fn skip_cell(r: &mut Reader<'_>, kind: &CellKind) -> Result<(), DecodeError> {
    // A latest list's tag is read here; an inline list follows it.
    if let CellKind::Latest { .. } = kind
        && r.take(1)?[0] == 1
    {
        r.take(4)?;
        return Ok(());
    }
    get_cell(r, kind).map(drop)
}
