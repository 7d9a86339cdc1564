//! The mixture's one-pass gather (docs/mixing.md): a batch's columns assembled from its
//! sources' windows, `out[c][i] = sources[which[i]][c][at[i]]`, one pass per column over
//! the rows — numpy would take two (a gather per source, then a scatter into place).

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// For each column `c`: `outs[c][i] = sources[which[i]][c][at[i]]` for every row `i`,
/// elements of `itemsizes[c]` bytes. `outs` and the sources' columns are C-contiguous
/// byte buffers (numpy arrays viewed as `uint8`); `which` and `at` int64 arrays with one
/// entry per row. Every index is checked before anything is written: one out of range
/// is a `ValueError` naming the row.
#[pyfunction]
pub fn gather_rows(
    outs: Vec<Bound<'_, PyAny>>,
    sources: Vec<Vec<Bound<'_, PyAny>>>,
    which: &Bound<'_, PyAny>,
    at: &Bound<'_, PyAny>,
    itemsizes: Vec<usize>,
) -> PyResult<()> {
    let py = which.py();
    let bad = |m: String| PyValueError::new_err(format!("gather_rows: {m}"));
    let which = PyBuffer::<i64>::get(which)?;
    let at = PyBuffer::<i64>::get(at)?;
    let which = which.as_slice(py).ok_or_else(|| bad("`which` is not C-contiguous".into()))?;
    let at = at.as_slice(py).ok_or_else(|| bad("`at` is not C-contiguous".into()))?;
    let n = which.len();
    if at.len() != n || outs.len() != itemsizes.len() || itemsizes.contains(&0) {
        return Err(bad(format!("{n} sources named, {} places, {} columns out, item sizes {itemsizes:?}", at.len(), outs.len())));
    }
    let outs: Vec<PyBuffer<u8>> = outs.iter().map(PyBuffer::<u8>::get).collect::<PyResult<_>>()?;
    let sources: Vec<Vec<PyBuffer<u8>>> =
        sources.iter().map(|cols| cols.iter().map(PyBuffer::<u8>::get).collect::<PyResult<_>>()).collect::<PyResult<_>>()?;
    // Each source's rows: the same in every column.
    let mut rows = Vec::with_capacity(sources.len());
    for (k, cols) in sources.iter().enumerate() {
        if cols.len() != itemsizes.len() {
            return Err(bad(format!("source {k} has {} columns, not {}", cols.len(), itemsizes.len())));
        }
        let counts: Vec<usize> = cols.iter().zip(&itemsizes).map(|(b, s)| b.len_bytes() / s).collect();
        if counts.windows(2).any(|w| w[0] != w[1]) {
            return Err(bad(format!("source {k}'s columns hold different numbers of rows: {counts:?}")));
        }
        rows.push(counts.first().copied().unwrap_or(0));
    }
    for i in 0..n {
        let (k, j) = (which[i].get(), at[i].get());
        let Some(&limit) = usize::try_from(k).ok().and_then(|k| rows.get(k)) else {
            return Err(bad(format!("row {i} names source {k} of {}", rows.len())));
        };
        if !usize::try_from(j).is_ok_and(|j| j < limit) {
            return Err(bad(format!("row {i} reads row {j} of source {k}, which has {limit}")));
        }
    }
    for (c, (out, &size)) in outs.iter().zip(&itemsizes).enumerate() {
        let dst = out.as_mut_slice(py).ok_or_else(|| bad(format!("column {c} out is not a writable C-contiguous buffer")))?;
        if dst.len() != n * size {
            return Err(bad(format!("column {c} out holds {} bytes, not {}", dst.len(), n * size)));
        }
        let bases: Vec<*const u8> = sources
            .iter()
            .map(|cols| cols[c].as_slice(py).map(|s| s.as_ptr().cast::<u8>()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("a source's column {c} is not C-contiguous")))?;
        let to = dst.as_ptr().cast::<u8>().cast_mut();
        let places = Places { which, at, bases: &bases, to };
        match size {
            8 => places.copy::<8>(),
            4 => places.copy::<4>(),
            2 => places.copy::<2>(),
            1 => places.copy::<1>(),
            size => places.copy_sized(size),
        }
    }
    Ok(())
}

/// Where each row's element comes from and goes, every index checked.
struct Places<'a> {
    which: &'a [pyo3::buffer::ReadOnlyCell<i64>],
    at: &'a [pyo3::buffer::ReadOnlyCell<i64>],
    bases: &'a [*const u8],
    to: *mut u8,
}

impl Places<'_> {
    fn copy<const N: usize>(&self) {
        for (i, (k, j)) in self.which.iter().zip(self.at).enumerate() {
            // SAFETY: `gather_rows` checked that source `k` exists and has a row `j` in
            // this column (each row `N` bytes), and that `to` holds `which.len() * N`
            // bytes; the output is an array of its own, so nothing overlaps.
            unsafe {
                let from = self.bases[k.get() as usize].add(j.get() as usize * N);
                std::ptr::copy_nonoverlapping(from, self.to.add(i * N), N);
            }
        }
    }

    fn copy_sized(&self, size: usize) {
        for (i, (k, j)) in self.which.iter().zip(self.at).enumerate() {
            // SAFETY: as in `copy`, with rows of `size` bytes.
            unsafe {
                let from = self.bases[k.get() as usize].add(j.get() as usize * size);
                std::ptr::copy_nonoverlapping(from, self.to.add(i * size), size);
            }
        }
    }
}
