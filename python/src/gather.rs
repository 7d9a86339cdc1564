//! The mixture's assembly of batches (docs/mixing.md): a window's rows written straight
//! to their places in the batches of the chunks ahead — its parts joined a column at a
//! time and each run of its rows read through the window's permutation and put where the
//! step's layout says, so a row is copied once from the window's read order into its
//! batch (as one set's loader copies it once into its permuted window).

use std::cell::RefCell;

use pyo3::buffer::{PyBuffer, ReadOnlyCell};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

thread_local! {
    /// The column a window's parts are joined into, kept from call to call: a fresh one's
    /// pages, touched for the first time, cost about as much as the join.
    static JOINED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes a window's rows into the chunks' columns. `parts` are the window's pieces in
/// read order (one C-contiguous byte buffer per column each, `itemsizes[c]` bytes a row);
/// `perm` (int64, or `None` for the identity) is the window's order: its row `i` is read
/// row `perm[i]`. `runs` is an int64 `(m, 5)` array of `(slot, first, len, base, at)`:
/// the window's rows `first .. first + len` go to rows `base + places[at + i]` of chunk
/// `outs[slot]` (one byte buffer per column, `rows[slot]` rows). Everything is checked
/// before anything is written: a run outside the window or a chunk, a `perm` that is not
/// a list of the window's rows, or a chunk sharing memory with what is read, is a
/// `ValueError` naming it.
#[pyfunction]
#[pyo3(signature = (outs, rows, parts, perm, runs, places, itemsizes))]
pub fn place_rows(
    outs: Vec<Vec<Bound<'_, PyAny>>>,
    rows: Vec<usize>,
    parts: Vec<Vec<Bound<'_, PyAny>>>,
    perm: Option<Bound<'_, PyAny>>,
    runs: &Bound<'_, PyAny>,
    places: &Bound<'_, PyAny>,
    itemsizes: Vec<usize>,
) -> PyResult<()> {
    let py = runs.py();
    let bad = |m: String| PyValueError::new_err(format!("place_rows: {m}"));
    let runs = PyBuffer::<i64>::get(runs)?;
    let runs = runs.as_slice(py).ok_or_else(|| bad("`runs` is not C-contiguous".into()))?;
    let places_buf = PyBuffer::<i64>::get(places)?;
    let places = places_buf.as_slice(py).ok_or_else(|| bad("`places` is not C-contiguous".into()))?;
    let perm_buf = perm.map(|p| PyBuffer::<i64>::get(&p)).transpose()?;
    let perm = match &perm_buf {
        Some(p) => Some(p.as_slice(py).ok_or_else(|| bad("`perm` is not C-contiguous".into()))?),
        None => None,
    };
    let columns = itemsizes.len();
    if runs.len() % 5 != 0 || itemsizes.contains(&0) || outs.len() != rows.len() {
        return Err(bad(format!(
            "{} run fields (5 a run), item sizes {itemsizes:?}, {} chunks with {} row counts",
            runs.len(),
            outs.len(),
            rows.len()
        )));
    }
    let parts: Vec<Vec<PyBuffer<u8>>> =
        parts.iter().map(|cols| cols.iter().map(PyBuffer::<u8>::get).collect::<PyResult<_>>()).collect::<PyResult<_>>()?;
    let outs: Vec<Vec<PyBuffer<u8>>> =
        outs.iter().map(|cols| cols.iter().map(PyBuffer::<u8>::get).collect::<PyResult<_>>()).collect::<PyResult<_>>()?;
    // The window's rows: each part's, the same in every column.
    let mut held = 0usize;
    for (i, cols) in parts.iter().enumerate() {
        if cols.len() != columns {
            return Err(bad(format!("part {i} has {} columns, not {columns}", cols.len())));
        }
        if let Some(c) = cols.iter().position(|b| !b.is_c_contiguous()) {
            return Err(bad(format!("part {i}'s column {c} is not C-contiguous")));
        }
        if let Some(c) = cols.iter().zip(&itemsizes).position(|(b, size)| b.len_bytes() % size != 0) {
            return Err(bad(format!("part {i}'s column {c} is not whole rows of {} bytes", itemsizes[c])));
        }
        let counts: Vec<usize> = cols.iter().zip(&itemsizes).map(|(b, size)| b.len_bytes() / size).collect();
        if counts.windows(2).any(|w| w[0] != w[1]) {
            return Err(bad(format!("part {i}'s columns hold different numbers of rows: {counts:?}")));
        }
        held += counts.first().copied().unwrap_or(0);
    }
    if let Some(perm) = perm {
        if perm.len() != held {
            return Err(bad(format!("`perm` orders {} rows; the window has {held}", perm.len())));
        }
        if let Some(i) = perm.iter().position(|r| !usize::try_from(r.get()).is_ok_and(|r| r < held)) {
            return Err(bad(format!("`perm[{i}]` is {}, not a row of the window's {held}", perm[i].get())));
        }
    }
    for (s, cols) in outs.iter().enumerate() {
        if cols.len() != columns {
            return Err(bad(format!("chunk {s} has {} columns, not {columns}", cols.len())));
        }
        for (c, (out, size)) in cols.iter().zip(&itemsizes).enumerate() {
            if out.readonly() || !out.is_c_contiguous() || rows[s].checked_mul(*size) != Some(out.len_bytes()) {
                return Err(bad(format!("chunk {s}'s column {c} is not a writable C-contiguous buffer of {} rows", rows[s])));
            }
        }
    }
    // What is read while the chunks are written must not be written: refuse a chunk's
    // column that shares memory with a part, `perm` or `places`.
    let mut read: Vec<(String, std::ops::Range<usize>)> = vec![("`places`".into(), span(&places_buf))];
    read.extend(perm_buf.as_ref().map(|b| ("`perm`".to_string(), span(b))));
    for (i, cols) in parts.iter().enumerate() {
        read.extend(cols.iter().enumerate().map(|(c, b)| (format!("part {i}'s column {c}"), span(b))));
    }
    for (s, cols) in outs.iter().enumerate() {
        for (c, out) in cols.iter().enumerate() {
            let out = span(out);
            // (Empty ranges share nothing, wherever they point.)
            if let Some((what, _)) = read.iter().find(|(_, r)| !r.is_empty() && !out.is_empty() && r.start < out.end && out.start < r.end) {
                return Err(bad(format!("chunk {s}'s column {c} shares memory with {what}")));
            }
        }
    }
    let mut checked = Vec::with_capacity(runs.len() / 5);
    for (r, run) in runs.chunks_exact(5).enumerate() {
        let fields: [i64; 5] = std::array::from_fn(|i| run[i].get());
        let [Ok(slot), Ok(first), Ok(len), Ok(base), Ok(at)] = fields.map(usize::try_from) else {
            return Err(bad(format!("run {r} has a negative field: {fields:?}")));
        };
        let Some(&out_rows) = rows.get(slot) else {
            return Err(bad(format!("run {r} writes chunk {slot} of {}", rows.len())));
        };
        if first.checked_add(len).is_none_or(|end| end > held) {
            return Err(bad(format!("run {r} reads rows {first}..{} of the window's {held}", first.saturating_add(len))));
        }
        let Some(to) = at.checked_add(len).and_then(|end| places.get(at..end)) else {
            return Err(bad(format!("run {r} takes places {at}..{} of {}", at.saturating_add(len), places.len())));
        };
        if let Some(p) =
            to.iter().map(|p| p.get()).find(|&p| !usize::try_from(p).is_ok_and(|p| base.checked_add(p).is_some_and(|i| i < out_rows)))
        {
            return Err(bad(format!("run {r} puts a row at {base} + {p}, outside chunk {slot}'s {out_rows} rows")));
        }
        checked.push(Run { slot, first, base, to });
    }
    JOINED.with_borrow_mut(|joined| {
        for (c, &size) in itemsizes.iter().enumerate() {
            // The column in read order: the one part itself, or the parts joined.
            let from: *const u8 = if let [one] = parts.as_slice() {
                one[c].buf_ptr().cast::<u8>()
            } else {
                let total: usize = parts.iter().map(|cols| cols[c].len_bytes()).sum();
                joined.clear();
                joined.reserve(total);
                let mut at = 0;
                for cols in &parts {
                    let n = cols[c].len_bytes();
                    // SAFETY: the part's column is a C-contiguous buffer of `n` bytes (checked
                    // above) and `joined` has room for every part's.
                    unsafe { std::ptr::copy_nonoverlapping(cols[c].buf_ptr().cast::<u8>(), joined.as_mut_ptr().add(at), n) };
                    at += n;
                }
                // SAFETY: the first `total` bytes were written just now.
                unsafe { joined.set_len(total) };
                joined.as_ptr()
            };
            let to: Vec<*mut u8> = outs.iter().map(|cols| cols[c].buf_ptr().cast::<u8>()).collect();
            let order = perm.map(|p| p.as_ptr().cast::<i64>());
            for run in &checked {
                let to = to[run.slot];
                // SAFETY (the closures): `perm` was checked to hold the window's rows, and
                // every run's rows `first .. first + len` to lie inside it.
                match (size, order) {
                    (8, Some(o)) => run.place::<8>(from, to, |i| unsafe { *o.add(i) } as usize),
                    (8, None) => run.place::<8>(from, to, |i| i),
                    (4, Some(o)) => run.place::<4>(from, to, |i| unsafe { *o.add(i) } as usize),
                    (4, None) => run.place::<4>(from, to, |i| i),
                    (_, Some(o)) => run.place_sized(size, from, to, |i| unsafe { *o.add(i) } as usize),
                    (_, None) => run.place_sized(size, from, to, |i| i),
                }
            }
        }
    });
    Ok(())
}

/// The bytes a buffer spans.
fn span<T: pyo3::buffer::Element>(b: &PyBuffer<T>) -> std::ops::Range<usize> {
    let at = b.buf_ptr() as usize;
    at..at + b.len_bytes()
}

/// A run, checked: the window's rows `first .. first + to.len()` exist, and `base + p` is
/// a row of chunk `slot` for each of its places `p`.
struct Run<'a> {
    slot: usize,
    first: usize,
    base: usize,
    to: &'a [ReadOnlyCell<i64>],
}

impl Run<'_> {
    /// `row(i)`: the read-order row of the window's row `i` (below the window's rows,
    /// as `place_rows` checked).
    #[inline]
    fn place<const N: usize>(&self, from: *const u8, to: *mut u8, row: impl Fn(usize) -> usize) {
        let places = self.to.as_ptr().cast::<i64>();
        for i in 0..self.to.len() {
            // SAFETY: `place_rows` checked that the window's rows `first .. first + len`
            // exist, that `perm` maps each to a row of the window's `N`-byte rows, and
            // that `base + p` is a row of the chunk for each of the run's `len` places,
            // and that no chunk's column shares memory with a part, `perm` or `places`.
            unsafe {
                let p = *places.add(i) as usize;
                std::ptr::copy_nonoverlapping(from.add(row(self.first + i) * N), to.add((self.base + p) * N), N);
            }
        }
    }

    fn place_sized(&self, size: usize, from: *const u8, to: *mut u8, row: impl Fn(usize) -> usize) {
        for (i, p) in self.to.iter().enumerate() {
            // SAFETY: as in `place`, with rows of `size` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(from.add(row(self.first + i) * size), to.add((self.base + p.get() as usize) * size), size);
            }
        }
    }
}
