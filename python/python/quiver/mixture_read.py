"""How a mixture reads its sources (docs/mixing.md): each source's rows in a pass's order,
a window at a time (``SourceOrder``), and the windows data-loader workers read, kept
until the batches are past them (``_WindowStore``); the plan is ``mixture_plan.py``, the
batches ``mixture_batches.py``."""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .loader import Columns


# Pools may be shared (a mixture's, by each dataset made from it): one taker at a time.
_POOLS = threading.Lock()


def reused(pool: List[np.ndarray], shape: Tuple[int, ...], dtype: Any, keep: int) -> np.ndarray:
    """An array of ``shape`` and ``dtype``: one of ``pool``'s once nothing but the pool
    holds it (no batch or window of it is alive), or a new one, kept in the pool while it
    holds fewer than ``keep``. A new array's pages, touched for the first time, cost about
    as much as the copy into them."""
    with _POOLS:
        for arr in pool:
            # Held by the pool, this loop and getrefcount's argument: nobody else.
            if arr.shape == shape and arr.dtype == dtype and sys.getrefcount(arr) <= 3:
                return arr
        arr = np.empty(shape, dtype=dtype)
        if len(pool) < keep:
            pool.append(arr)
        return arr


class SourceOrder:
    """A source's rows in the order of a pass: its blocks (permuted), then its rows within
    windows of ``window_rows`` (permuted), read a window at a time."""

    def __init__(self, k: int, files: List[str], fmt: str, blocks: List[Tuple[int, int]], rows: List[int],
                 columns: Columns, seed: int, epoch: int, shuffle: bool, window_rows: int):
        self.k, self.files, self.fmt, self.blocks, self.block_rows = k, files, fmt, blocks, rows
        self.columns, self.seed, self.epoch, self.shuffle, self.window_rows = columns, seed, epoch, shuffle, window_rows
        self.open: "OrderedDict[int, Any]" = OrderedDict()
        self.last: Optional[Tuple[int, pa.Table]] = None
        # Each column's arrays of windows made before, reused once nothing holds them.
        self.spares: Dict[str, List[np.ndarray]] = {}

    def _blocks(self, p: int) -> Tuple[np.ndarray, np.ndarray]:
        order = np.arange(len(self.block_rows))
        if self.shuffle and len(order) > 1:
            order = np.random.default_rng([self.seed, self.epoch, self.k, p]).permutation(len(order))
        sizes = np.asarray(self.block_rows, dtype=np.int64)[order]
        return order, np.cumsum(sizes)

    def _read_block(self, b: int, first: int, end: int) -> pa.Table:
        """Rows ``first..end`` of block ``b`` (the last block read is kept: a block that
        straddles two windows is read once)."""
        if self.last is not None and self.last[0] == b:
            return self.last[1].slice(first, end - first)
        table = self._read_whole(b)
        self.last = (b, table)
        return table.slice(first, end - first)

    def _read_whole(self, b: int) -> pa.Table:
        shard, group = self.blocks[b]
        handle = self.open.get(shard)
        if handle is None:
            if len(self.open) >= 16:
                self.open.popitem(last=False)
            handle = pa.ipc.open_file(pa.memory_map(self.files[shard])) if self.fmt == "arrow" else pq.ParquetFile(self.files[shard])
            self.open[shard] = handle
        if self.fmt == "arrow":
            return pa.Table.from_batches([handle.get_batch(group)]).select(self.columns.names)
        return handle.read_row_group(group, columns=self.columns.names)

    def parts(self, p: int, j: int) -> Tuple[List[Dict[str, np.ndarray]], Optional[np.ndarray]]:
        """Window ``j`` of pass ``p``: its pieces in read order (blocks' rows as column
        arrays) and its order (row ``i`` is read row ``perm[i]``; ``None`` when not
        shuffling)."""
        order, ends = self._blocks(p)
        total = int(ends[-1]) if len(ends) else 0
        lo, hi = j * self.window_rows, min((j + 1) * self.window_rows, total)
        parts = []
        first = int(np.searchsorted(ends, lo, side="right"))
        at = lo
        for i in range(first, len(order)):
            if at >= hi:
                break
            start = int(ends[i]) - self.block_rows[int(order[i])]
            end = min(hi, int(ends[i]))
            parts.append(self.columns.arrays(self._read_block(int(order[i]), at - start, end - start)))
            at = end
        perm = None
        if self.shuffle and hi - lo > 1:
            perm = np.random.default_rng([self.seed, self.epoch, self.k, p, j]).permutation(hi - lo)
        return parts, perm

    def window(self, p: int, j: int) -> Dict[str, np.ndarray]:
        """Window ``j`` of pass ``p``: its rows in the pass's order, as C-contiguous arrays
        (for a data-loader worker, which hands the window to the training process)."""
        parts, perm = self.parts(p, j)
        return in_order(parts, perm, self.columns.names, self.spares)


def in_order(parts: List[Dict[str, np.ndarray]], perm: Optional[np.ndarray], names: List[str],
             spares: Optional[Dict[str, List[np.ndarray]]] = None) -> Dict[str, np.ndarray]:
    """A window's columns (``parts`` in read order, ``perm`` its order) in its order, as
    C-contiguous arrays: copies where joined or permuted (into ``spares``' arrays, by
    column, once nothing holds them), a window of one part as read its part's arrays."""
    # A column at a time, joined then permuted while its rows are still in the cache
    # (joining every column first and then permuting measured twice as slow).
    arrays = {}
    for n in names:
        if not parts:
            arrays[n] = np.zeros(0)
            continue
        joined = np.concatenate([q[n] for q in parts]) if len(parts) != 1 else parts[0][n]
        if perm is None:
            arrays[n] = np.ascontiguousarray(joined)
            continue
        out = reused(spares.setdefault(n, []), joined.shape, joined.dtype, 3) if spares is not None else None
        # mode="clip": with `out`, the default mode copies through a buffer (every index
        # of a permutation is in range).
        arrays[n] = np.take(joined, perm, axis=0, out=out, mode="clip")
    return arrays


class _WindowStore:
    """The windows an epoch reads, as they come (``(key, arrays)`` in the order the plan
    first needs them), kept until the plan is past them."""

    def __init__(self, windows: Any):
        self.windows = windows
        self.store: Dict[Tuple[int, int, int], Dict[str, np.ndarray]] = {}

    def window(self, k: int, p: int, j: int) -> Dict[str, np.ndarray]:
        key = (k, p, j)
        while key not in self.store:
            got, arrays = next(self.windows)
            self.store[got] = arrays
        # A source's windows are asked for in order: the earlier ones are done.
        for old in [x for x in self.store if x[0] == k and x[1:] < key[1:]]:
            del self.store[old]
        return self.store[key]
