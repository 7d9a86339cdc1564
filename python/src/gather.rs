//! The mixture's assembly of batches (docs/mixing.md): a chunk's columns written from
//! runs of consecutive rows of its sources' windows, each run's rows put at the places a
//! step's layout gives them — one pass per column, reading each run straight on and
//! writing within one batch, where a gather by row index would read an index per element
//! and numpy would take two passes (a gather per source, then a scatter into place).

use pyo3::buffer::{PyBuffer, ReadOnlyCell};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Fills `outs` (one C-contiguous byte buffer per column, `itemsizes[c]` bytes a row,
/// `rows` rows) from `runs`, rows `(slot, start, len, base, at)` of an int64 `(m, 5)`
/// array: rows `start .. start + len` of window `slots[slot]` (its columns as
/// C-contiguous byte buffers) go to output rows `base + places[at + i]`, `places` an
/// int64 array. Every run and place is checked before anything is written: one outside
/// its window or the output is a `ValueError` naming the run.
#[pyfunction]
pub fn place_runs(
    outs: Vec<Bound<'_, PyAny>>,
    rows: usize,
    slots: Vec<Vec<Bound<'_, PyAny>>>,
    runs: &Bound<'_, PyAny>,
    places: &Bound<'_, PyAny>,
    itemsizes: Vec<usize>,
) -> PyResult<()> {
    let py = runs.py();
    let bad = |m: String| PyValueError::new_err(format!("place_runs: {m}"));
    let runs = PyBuffer::<i64>::get(runs)?;
    let runs = runs.as_slice(py).ok_or_else(|| bad("`runs` is not C-contiguous".into()))?;
    let places = PyBuffer::<i64>::get(places)?;
    let places = places.as_slice(py).ok_or_else(|| bad("`places` is not C-contiguous".into()))?;
    if runs.len() % 5 != 0 || outs.len() != itemsizes.len() || itemsizes.contains(&0) {
        return Err(bad(format!("{} run fields (5 a run), {} columns out, item sizes {itemsizes:?}", runs.len(), outs.len())));
    }
    let outs: Vec<PyBuffer<u8>> = outs.iter().map(PyBuffer::<u8>::get).collect::<PyResult<_>>()?;
    let slots: Vec<Vec<PyBuffer<u8>>> =
        slots.iter().map(|cols| cols.iter().map(PyBuffer::<u8>::get).collect::<PyResult<_>>()).collect::<PyResult<_>>()?;
    // Each window's rows: the same in every column.
    let mut held = Vec::with_capacity(slots.len());
    for (s, cols) in slots.iter().enumerate() {
        if cols.len() != itemsizes.len() {
            return Err(bad(format!("window {s} has {} columns, not {}", cols.len(), itemsizes.len())));
        }
        let counts: Vec<usize> = cols.iter().zip(&itemsizes).map(|(b, size)| b.len_bytes() / size).collect();
        if counts.windows(2).any(|w| w[0] != w[1]) {
            return Err(bad(format!("window {s}'s columns hold different numbers of rows: {counts:?}")));
        }
        held.push(counts.first().copied().unwrap_or(0));
    }
    let mut checked = Vec::with_capacity(runs.len() / 5);
    for (r, run) in runs.chunks_exact(5).enumerate() {
        let fields: [i64; 5] = std::array::from_fn(|i| run[i].get());
        let [Ok(slot), Ok(start), Ok(len), Ok(base), Ok(at)] = fields.map(usize::try_from) else {
            return Err(bad(format!("run {r} has a negative field: {fields:?}")));
        };
        let Some(&held) = held.get(slot) else {
            return Err(bad(format!("run {r} reads window {slot} of {}", held.len())));
        };
        if start.checked_add(len).is_none_or(|end| end > held) {
            return Err(bad(format!("run {r} reads rows {start}..{} of window {slot}, which has {held}", start.saturating_add(len))));
        }
        let Some(to) = at.checked_add(len).and_then(|end| places.get(at..end)) else {
            return Err(bad(format!("run {r} takes places {at}..{} of {}", at.saturating_add(len), places.len())));
        };
        if let Some(p) =
            to.iter().map(|p| p.get()).find(|&p| !usize::try_from(p).is_ok_and(|p| base.checked_add(p).is_some_and(|i| i < rows)))
        {
            return Err(bad(format!("run {r} puts a row at {base} + {p}, outside the {rows} rows out")));
        }
        checked.push(Run { slot, start, base, to });
    }
    for (c, (out, &size)) in outs.iter().zip(&itemsizes).enumerate() {
        let dst = out.as_mut_slice(py).ok_or_else(|| bad(format!("column {c} out is not a writable C-contiguous buffer")))?;
        if dst.len() != rows * size {
            return Err(bad(format!("column {c} out holds {} bytes, not {}", dst.len(), rows * size)));
        }
        let bases: Vec<*const u8> = slots
            .iter()
            .map(|cols| cols[c].as_slice(py).map(|s| s.as_ptr().cast::<u8>()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("a window's column {c} is not C-contiguous")))?;
        let to = dst.as_ptr().cast::<u8>().cast_mut();
        for run in &checked {
            let from = bases[run.slot];
            match size {
                8 => run.place::<8>(from, to),
                4 => run.place::<4>(from, to),
                2 => run.place::<2>(from, to),
                1 => run.place::<1>(from, to),
                size => run.place_sized(size, from, to),
            }
        }
    }
    Ok(())
}

/// A run, checked: its rows lie inside window `slot` from row `start`, and `base + p` is
/// an output row for each of its places `p`.
struct Run<'a> {
    slot: usize,
    start: usize,
    base: usize,
    to: &'a [ReadOnlyCell<i64>],
}

impl Run<'_> {
    fn place<const N: usize>(&self, from: *const u8, to: *mut u8) {
        for (i, p) in self.to.iter().enumerate() {
            // SAFETY: `place_runs` checked that rows `start .. start + len` lie inside the
            // window's column and that `base + p` is below the output's rows, rows `N`
            // bytes each; the output is an array of its own, so nothing overlaps.
            unsafe {
                std::ptr::copy_nonoverlapping(from.add((self.start + i) * N), to.add((self.base + p.get() as usize) * N), N);
            }
        }
    }

    fn place_sized(&self, size: usize, from: *const u8, to: *mut u8) {
        for (i, p) in self.to.iter().enumerate() {
            // SAFETY: as in `place`, with rows of `size` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(from.add((self.start + i) * size), to.add((self.base + p.get() as usize) * size), size);
            }
        }
    }
}
