"""How a mixture's batches are assembled (docs/mixing.md): a rank's part of each step
(``_split``), the plan run ahead of the batches handed out, and each window written
straight into the batches ahead of it (``Assembler``); the plan is ``mixture_plan.py``,
the sources' orders ``mixture_read.py``."""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ._quiver import ValidationError, place_rows
from .mixture_read import in_order, reused

# How far the plan runs ahead of the chunk of batches being handed out, in windows'
# worth of steps (``window_rows // batch_size``): a source's window is written into the
# batches in one go once the plan has passed its last row, which it has when the
# source's share of a rank's rows is at least 1 / AHEAD; a window of a source with less
# is permuted once, kept, and written as the plan reaches its rows.
AHEAD = 4

Key = Tuple[int, int, int]


def _split(data: Any, counts: Tuple[int, ...]) -> Tuple[np.ndarray, List[int], List[int], np.ndarray, List[int]]:
    """This rank's part of a step that takes ``counts`` rows from the sources: the source
    of each of its rows, in batch order; per source the first of the step's rows of that
    source it takes (its place among them) and how many; and where in the batch each
    source's rows go (``places``, source ``k``'s from ``places_at[k]``). The step's rows
    are laid out with every source spread evenly (source ``k``'s ``i``-th row at ``(i +
    0.5) / counts[k]``, ties to the first source) and cut into ``world_size`` contiguous
    parts, rank ``r`` taking part ``r``: every rank's batch holds about each source's
    share, and a source's rows on one rank are consecutive rows of its order."""
    hit = data._splits.get(counts)
    if hit is not None:
        return hit
    c = np.asarray(counts, dtype=np.int64)
    g = int(c.sum())
    ks = np.repeat(np.arange(len(c), dtype=np.int64), c)
    offs = np.arange(g, dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
    keys = (2 * offs + 1) / (2.0 * np.repeat(np.maximum(c, 1), c))
    order = np.lexsort((ks, keys))
    lo, hi = data.rank * g // data.world_size, (data.rank + 1) * g // data.world_size
    mine = order[lo:hi]
    pattern = np.ascontiguousarray(ks[mine])
    first = np.full(len(c), g, dtype=np.int64)
    np.minimum.at(first, pattern, offs[mine])
    many = np.bincount(pattern, minlength=len(c))
    # A source's rows on this rank, in its order, go where it stands in the pattern.
    places = np.argsort(pattern, kind="stable").astype(np.int64)
    places_at = (np.cumsum(many) - many).tolist()
    data._splits[counts] = (pattern, first.tolist(), many.tolist(), places, places_at)
    return data._splits[counts]


def _pieces(seq: int, m: int, rows: int, w: int) -> Iterator[Tuple[int, int, int, int]]:
    """Rows ``seq .. seq + m`` of a source's sequence of passes (``rows`` rows a pass,
    windows of ``w``) as ``(pass, window, first row in it, rows)``, cut where a window or
    a pass ends."""
    while m:
        p, inpass = divmod(seq, rows)
        j, off = divmod(inpass, w)
        take = min(m, w - off, rows - inpass)
        yield p, j, off, take
        seq += take
        m -= take


class _Chunk:
    """Consecutive steps of this (rank, worker), their rows in arrays of their own: the
    sources of the rows (filled as the steps are planned), the columns (written as the
    windows come), and the windows its rows come from, in the order first needed."""

    __slots__ = ("src", "rows", "sizes", "needs", "arrays", "last")

    def __init__(self, src: np.ndarray):
        self.src, self.rows, self.last = src, 0, 0
        self.sizes: List[int] = []
        self.needs: Dict[Key, None] = {}
        self.arrays: Optional[List[np.ndarray]] = None


class _Window:
    """A source's window as the plan takes rows from it: where it ends in the source's
    sequence of passes, the runs of its rows still to write (``(chunk, first, rows, row in
    the chunk, layout, place in it)``), and its rows in order once kept."""

    __slots__ = ("end", "runs", "kept")

    def __init__(self, end: int):
        self.end = end
        self.runs: List[Tuple[_Chunk, int, int, int, Tuple[int, ...], int]] = []
        self.kept: Optional[Dict[str, np.ndarray]] = None


class Assembler:
    """This (rank, worker)'s batches: ``next()`` gives a chunk's columns and its batches'
    sizes, ``None`` at the epoch's end. ``source(k, pass, j)`` gives source ``k``'s window
    ``j`` of a pass as ``(parts, perm)``: its pieces in read order (dicts of column
    arrays) and its order (``None``: as read)."""

    def __init__(self, data: Any, planner: Any, worker: int, workers: int,
                 source: Callable[[int, int, int], Tuple[List[Dict[str, np.ndarray]], Optional[np.ndarray]]]):
        self.data, self.planner, self.worker, self.workers, self.source = data, planner, worker, workers, source
        self.names: List[str] = list(data.names)
        self.total = data.batch_size * data.world_size
        steps = max(1, data.window_rows // data.batch_size)
        self.chunk_steps = max(1, steps // workers)
        self.cap = self.chunk_steps * -(-self.total // data.world_size)
        self.ahead = AHEAD * steps
        self.keep = AHEAD + 3
        self.step = 0
        self.ended = False
        # The plan's last step: (counts, each source's first row of it in its passes).
        self.last: Tuple[Tuple[int, ...], List[int]] = ((0,) * len(planner.rows), [0] * len(planner.rows))
        self.chunks: Deque[_Chunk] = deque()
        self.windows: Dict[Key, _Window] = {}
        self.kinds: Optional[List[Tuple[np.dtype, Tuple[int, ...]]]] = None

    def next(self) -> Optional[Tuple[Dict[str, np.ndarray], List[int]]]:
        while not self.ended and not (self.chunks and len(self.chunks[0].sizes) == self.chunk_steps
                                      and self.step > self.chunks[0].last + self.ahead):
            self._plan()
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        for key in chunk.needs:
            self._place(key)
        out = dict(zip(self.names, (a[:chunk.rows] for a in self._arrays(chunk))))
        out["source"] = chunk.src[:chunk.rows]
        return out, chunk.sizes

    def _plan(self) -> None:
        """The plan's next step: this (rank, worker)'s rows of it, if the step is its,
        added to the last chunk as runs of the windows they come from."""
        got = self.planner.advance(self.total)
        if got is None:
            self.ended = True
            return
        self.last = got
        index, self.step = self.step, self.step + 1
        if index % self.workers != self.worker:
            return
        counts, starts = got
        chunks = self.chunks
        if not chunks or len(chunks[-1].sizes) == self.chunk_steps:
            chunks.append(_Chunk(reused(self.data.mixture._buffers.setdefault(None, []), (self.cap,), np.int64, self.keep)))
        chunk = chunks[-1]
        pattern, first, many, _, places_at = _split(self.data, counts)
        row = chunk.rows
        size = len(pattern)
        chunk.src[row:row + size] = pattern
        chunk.sizes.append(size)
        chunk.rows = row + size
        chunk.last = index
        rows, w, windows, needs = self.planner.rows, self.data.window_rows, self.windows, chunk.needs
        for k, m in enumerate(many):
            at = places_at[k]
            for p, j, off, take in _pieces(starts[k] + first[k], m, rows[k], w):
                key = (k, p, j)
                win = windows.get(key)
                if win is None:
                    win = windows[key] = _Window(p * rows[k] + min((j + 1) * w, rows[k]))
                win.runs.append((chunk, off, take, row, counts, at))
                needs[key] = None
                at += take

    def _place(self, key: Key) -> None:
        """Writes the runs of window ``key`` planned so far. A window the plan is past is
        written from its parts through its order and let go; another is put in order
        once, kept, and written from as the plan reaches its rows (a window let go had
        every run written)."""
        win = self.windows.get(key)
        if win is None:
            return
        k, p, j = key
        done = self.ended or self.last[1][k] + self.last[0][k] >= win.end
        if win.runs:
            if win.kept is None:
                parts, perm = self.source(k, p, j)
                self._check(parts)
                if done:
                    self._write(win.runs, parts, perm)
                    del self.windows[key]
                    return
                win.kept = in_order(parts, perm, self.names)
            self._write(win.runs, [win.kept], None)
            win.runs = []
        if done:
            del self.windows[key]

    def _write(self, runs: List[Tuple[_Chunk, int, int, int, Tuple[int, ...], int]], parts: List[Dict[str, np.ndarray]],
               perm: Optional[np.ndarray]) -> None:
        slots: Dict[int, int] = {}
        outs: List[List[np.ndarray]] = []
        layouts: Dict[Tuple[int, ...], int] = {}
        places: List[np.ndarray] = []
        at_places = 0
        table = []
        for chunk, off, take, row, counts, at in runs:
            slot = slots.get(id(chunk))
            if slot is None:
                slot = slots[id(chunk)] = len(outs)
                outs.append([_bytes(a) for a in self._arrays(chunk)])
            base = layouts.get(counts)
            if base is None:
                base = layouts[counts] = at_places
                places.append(_split(self.data, counts)[3])
                at_places += len(places[-1])
            table.append((slot, off, take, row, base + at))
        place_rows(outs, [self.cap] * len(outs), [[_bytes(q[n]) for n in self.names] for q in parts], perm,
                   np.asarray(table, dtype=np.int64).reshape(-1, 5), np.concatenate(places), self._itemsizes())

    def _check(self, parts: List[Dict[str, np.ndarray]]) -> None:
        """Every source's columns of one dtype and shape (the first window read fixes
        them)."""
        for q in parts:
            kinds = [(q[n].dtype, q[n].shape[1:]) for n in self.names]
            if self.kinds is None:
                self.kinds = kinds
            for n, mine, first in zip(self.names, kinds, self.kinds):
                if mine != first:
                    raise ValidationError(f"column `{n}`: the sets give it different shapes or types "
                                          f"({sorted({(str(d), s) for d, s in (mine, first)})}): lists must be of one "
                                          f"length in every set (pad them before the export)")

    def _itemsizes(self) -> List[int]:
        assert self.kinds is not None
        return [d.itemsize * int(np.prod(s, dtype=np.int64)) for d, s in self.kinds]

    def _arrays(self, chunk: _Chunk) -> List[np.ndarray]:
        """The chunk's columns, made when first written (or handed out: a chunk of no
        rows before any window was read holds float64 columns)."""
        if chunk.arrays is None:
            kinds = self.kinds or [(np.dtype(np.float64), ())] * len(self.names)
            chunk.arrays = [reused(self.data.mixture._buffers.setdefault(n, []), (self.cap,) + shape, dtype, self.keep)
                            for n, (dtype, shape) in zip(self.names, kinds)]
        return chunk.arrays


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
