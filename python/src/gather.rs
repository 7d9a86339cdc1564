//! The mixture's assembly of batches (docs/mixing.md): a chunk's columns written row by
//! row from its sources' windows, each source read straight on through runs of
//! consecutive rows — one pass per column, reading sequentially, where a gather by row
//! index would read an index per element and numpy would take two passes (a gather per
//! source, then a scatter into place).

use pyo3::buffer::{PyBuffer, ReadOnlyCell};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Fills `outs` (one C-contiguous byte buffer per column, `itemsizes[c]` bytes a row):
/// row `i` is the next unread row of source `source[i]`. A source's rows are read in the
/// order of its `runs`, rows `(k, slot, start, len)` of an int64 `(m, 4)` array: `len`
/// rows of window `slots[slot]` (its columns as C-contiguous byte buffers) from row
/// `start`, for source `k`. Everything is checked before anything is written: a run
/// outside its window, or a source with more or fewer rows in its runs than `source`
/// asks of it, is a `ValueError` naming it.
#[pyfunction]
pub fn interleave_rows(
    outs: Vec<Bound<'_, PyAny>>,
    slots: Vec<Vec<Bound<'_, PyAny>>>,
    source: &Bound<'_, PyAny>,
    runs: &Bound<'_, PyAny>,
    itemsizes: Vec<usize>,
) -> PyResult<()> {
    let py = source.py();
    let bad = |m: String| PyValueError::new_err(format!("interleave_rows: {m}"));
    let source = PyBuffer::<i64>::get(source)?;
    let source = source.as_slice(py).ok_or_else(|| bad("`source` is not C-contiguous".into()))?;
    let runs = PyBuffer::<i64>::get(runs)?;
    let runs = runs.as_slice(py).ok_or_else(|| bad("`runs` is not C-contiguous".into()))?;
    if runs.len() % 4 != 0 || outs.len() != itemsizes.len() || itemsizes.contains(&0) {
        return Err(bad(format!("{} run fields (4 a run), {} columns out, item sizes {itemsizes:?}", runs.len(), outs.len())));
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
    // The runs, checked, as each source's queue.
    let mut queues: Vec<Vec<Run>> = Vec::new();
    for (r, run) in runs.chunks_exact(4).enumerate() {
        let [k, slot, start, len] = [run[0].get(), run[1].get(), run[2].get(), run[3].get()];
        let (Ok(k), Ok(slot), Ok(start), Ok(len)) =
            (usize::try_from(k), usize::try_from(slot), usize::try_from(start), usize::try_from(len))
        else {
            return Err(bad(format!("run {r} has a negative field: {:?}", [k, slot, start, len])));
        };
        let Some(&rows) = held.get(slot) else {
            return Err(bad(format!("run {r} reads window {slot} of {}", held.len())));
        };
        if start.checked_add(len).is_none_or(|end| end > rows) {
            return Err(bad(format!("run {r} reads rows {start}..{} of window {slot}, which has {rows}", start.saturating_add(len))));
        }
        if len == 0 {
            continue;
        }
        if queues.len() <= k {
            queues.resize_with(k + 1, Vec::new);
        }
        queues[k].push(Run { slot, start, len });
    }
    let mut asked = vec![0usize; queues.len()];
    for (i, k) in source.iter().enumerate() {
        let k = k.get();
        match usize::try_from(k).ok().filter(|&k| k < asked.len()) {
            Some(k) => asked[k] += 1,
            None => return Err(bad(format!("row {i} is of source {k}, which has no runs"))),
        }
    }
    for (k, (queue, &asked)) in queues.iter().zip(&asked).enumerate() {
        let given: usize = queue.iter().map(|r| r.len).sum();
        if given != asked {
            return Err(bad(format!("source {k}'s runs hold {given} rows, the rows ask for {asked}")));
        }
    }
    let n = source.len();
    for (c, (out, &size)) in outs.iter().zip(&itemsizes).enumerate() {
        let dst = out.as_mut_slice(py).ok_or_else(|| bad(format!("column {c} out is not a writable C-contiguous buffer")))?;
        if dst.len() != n * size {
            return Err(bad(format!("column {c} out holds {} bytes, not {}", dst.len(), n * size)));
        }
        let bases: Vec<*const u8> = slots
            .iter()
            .map(|cols| cols[c].as_slice(py).map(|s| s.as_ptr().cast::<u8>()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("a window's column {c} is not C-contiguous")))?;
        let column = Column { source, queues: &queues, bases: &bases, to: dst.as_ptr().cast::<u8>().cast_mut() };
        match size {
            8 => column.fill::<8>(),
            4 => column.fill::<4>(),
            2 => column.fill::<2>(),
            1 => column.fill::<1>(),
            size => column.fill_sized(size),
        }
    }
    Ok(())
}

/// `len` consecutive rows of a window from row `start`.
struct Run {
    slot: usize,
    start: usize,
    len: usize,
}

/// One column's writing: every row's source checked to have exactly as many rows in its
/// runs as the rows ask of it, every run inside its window.
struct Column<'a> {
    source: &'a [ReadOnlyCell<i64>],
    queues: &'a [Vec<Run>],
    bases: &'a [*const u8],
    to: *mut u8,
}

/// Where a source is in its runs.
#[derive(Clone, Copy)]
struct Cursor {
    next: usize,
    from: *const u8,
    left: usize,
}

impl Column<'_> {
    fn fill<const N: usize>(&self) {
        self.fill_by(N, |from, to| {
            // SAFETY: `from` is inside a window's column and `to` inside the output (see
            // `fill_by`); `N` bytes each, and the output is an array of its own.
            unsafe { std::ptr::copy_nonoverlapping(from, to, N) }
        });
    }

    fn fill_sized(&self, size: usize) {
        self.fill_by(size, |from, to| {
            // SAFETY: as in `fill`, with rows of `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(from, to, size) }
        });
    }

    #[inline(always)]
    fn fill_by(&self, size: usize, copy: impl Fn(*const u8, *mut u8)) {
        let mut at = vec![Cursor { next: 0, from: std::ptr::null(), left: 0 }; self.queues.len()];
        for (i, k) in self.source.iter().enumerate() {
            let cur = &mut at[k.get() as usize];
            while cur.left == 0 {
                // `interleave_rows` checked that source `k`'s runs hold exactly the rows
                // asked of it, so a row asked finds its run.
                let run = &self.queues[k.get() as usize][cur.next];
                cur.next += 1;
                // SAFETY: the run lies inside its window (checked), each row `size` bytes.
                cur.from = unsafe { self.bases[run.slot].add(run.start * size) };
                cur.left = run.len;
            }
            // SAFETY: `cur.from` is a row inside the current run; `to` holds `source.len()`
            // rows of `size` bytes (checked).
            copy(cur.from, unsafe { self.to.add(i * size) });
            cur.from = cur.from.wrapping_add(size);
            cur.left -= 1;
        }
    }
}
