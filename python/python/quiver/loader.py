"""The PyTorch loader of an exported training set for data-parallel training
(docs/export.md#the-pytorch-loader): ``TrainingSet(DIR).to_torch(...)``.

An epoch's order is a pure function of the set's blocks (each shard's row groups), the
seed and the epoch, computed the same on every rank and data-loader worker:

1. the blocks in order, or (``shuffle=True``) permuted by ``numpy.random.default_rng
   ([seed, epoch])``;
2. the rows of that sequence cut into ``world_size`` contiguous ranges whose sizes differ
   by at most one row: rank ``r`` reads only its range;
3. every rank yields the same number of batches, ``ceil(ceil(N / world_size) /
   batch_size)``: batches of ``batch_size`` rows, the last one shorter (and where a rank
   has one row fewer than that count needs, its last full batch split in two);
4. a rank's batches go in windows of ``window_batches`` batches (about 256k rows): window
   ``j`` is read and (shuffled) permuted by ``default_rng([seed, epoch, rank, j])`` by
   data-loader worker ``j % num_workers``.

So the (rank, worker) parts are disjoint and together hold every row once; rows are
shuffled across shards (random blocks in each window) and within windows; the batches a
DataLoader hands out come in a fixed order, which is what ``state_dict()`` counts to
resume mid-epoch.
"""
from __future__ import annotations

import itertools
import math
import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._quiver import ValidationError

#: Rows per shuffle window (rounded up to whole batches).
WINDOW_ROWS = 262_144

#: Shard files a reader keeps open at once (a set of thousands of shards stays under the
#: open-file limit).
MAX_OPEN = 64


def is_text(t: pa.DataType) -> bool:
    """A string column in any of Arrow's layouts."""
    view = getattr(pa.types, "is_string_view", None)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or bool(view and view(t))


class Plan:
    """One rank's part of an epoch: its row segments (block, first row, end row) in
    order, and its batch sizes."""

    def __init__(self, blocks: Sequence[int], batch_size: int, rank: int, world_size: int, shuffle: bool,
                 seed: int, epoch: int, window_rows: int = WINDOW_ROWS):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValidationError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValidationError(f"rank {rank!r} is not in 0..{world_size!r} (world_size)")
        self.seed, self.epoch, self.rank, self.shuffle = seed, epoch, rank, shuffle
        order = np.arange(len(blocks))
        if shuffle and len(blocks) > 1:
            order = np.random.default_rng([seed, epoch]).permutation(len(blocks))
        sizes = np.asarray(blocks, dtype=np.int64)[order]
        ends = np.cumsum(sizes)
        total = int(ends[-1]) if len(ends) else 0
        start, end = rank * total // world_size, (rank + 1) * total // world_size
        # The blocks (in epoch order) that hold rows start..end of the sequence.
        self.segments: List[Tuple[int, int, int]] = []
        first = int(np.searchsorted(ends, start, side="right"))
        at = start
        for i in range(first, len(order)):
            if at >= end:
                break
            block_start = int(ends[i] - sizes[i])
            hi = min(end, int(ends[i]))
            self.segments.append((int(order[i]), at - block_start, hi - block_start))
            at = hi
        rows = end - start
        longest = -(-total // world_size)
        count = -(-longest // batch_size)
        sizes_ = [batch_size] * count
        if count:
            sizes_[-1] = rows - (count - 1) * batch_size
            if sizes_[-1] == 0 and count > 1 and batch_size > 1:
                sizes_[-2], sizes_[-1] = batch_size - 1, 1
        self.batch_sizes: List[int] = sizes_
        # Rows before each batch (and after the last), for windows' row ranges.
        self.offsets: List[int] = [0, *itertools.accumulate(sizes_)]
        self.rows = rows
        self.window_batches = max(1, -(-window_rows // batch_size))

    def windows(self) -> List[Tuple[int, int]]:
        """Each window's batches, as a range of batch indexes."""
        n, m = len(self.batch_sizes), self.window_batches
        return [(j, min(j + m, n)) for j in range(0, n, m)]

    def window_rows(self, j: int) -> Tuple[int, int]:
        """The rows (of this rank's range) window ``j`` holds."""
        lo = j * self.window_batches
        hi = min(lo + self.window_batches, len(self.batch_sizes))
        return self.offsets[lo], self.offsets[hi]


def handed_out(plan: Plan, num_workers: int, done: set, consumed: int) -> set:
    """The batches (indexes) a DataLoader with ``num_workers`` workers has handed out after
    ``consumed`` of them, its workers passing over ``done``: it takes one from each
    worker in turn, passing over a worker that has none left. Worker ``w`` yields the
    batches of windows ``w``, ``w + num_workers``, ... in order."""
    workers = max(num_workers, 1)
    queues: List[List[int]] = [[] for _ in range(workers)]
    for j, (lo, hi) in enumerate(plan.windows()):
        queues[j % workers].extend(b for b in range(lo, hi) if b not in done)
    taken: set = set()
    at = [0] * workers
    w = 0
    while consumed > 0 and any(a < len(q) for a, q in zip(at, queues)):
        if at[w] < len(queues[w]):
            taken.add(queues[w][at[w]])
            at[w] += 1
            consumed -= 1
        w = (w + 1) % workers
    return taken


def to_ranges(batches: set) -> List[List[int]]:
    """A set of batch indexes as sorted [first, last] runs (a compact state)."""
    out: List[List[int]] = []
    for b in sorted(batches):
        if out and out[-1][1] == b - 1:
            out[-1][1] = b
        else:
            out.append([b, b])
    return out


class Columns:
    """How each loaded column becomes a tensor, decided once from the schema, the
    manifest's vocabularies and (from metadata) whether the column holds nulls."""

    def __init__(self, schema: pa.Schema, vocabularies: Dict[str, List[str]], has_nulls: Dict[str, bool],
                 columns: Optional[Sequence[str]]):
        self.kinds: Dict[str, str] = {}
        self.vocab: Dict[str, pa.Array] = {}
        # A list column's length, fixed by the first block read (see ``fix_widths``).
        self.width: Dict[str, int] = {}
        self.tz: Dict[str, Optional[str]] = {}
        names = schema.names
        if columns is not None:
            if isinstance(columns, str):
                raise ValidationError("columns= takes a list of column names, not one string")
            unknown = [c for c in columns if c not in names]
            if unknown:
                raise ValidationError(f"unknown column `{unknown[0]}` (the training set has: {', '.join(names)})")
        for name in (columns if columns is not None else names):
            t = schema.field(name).type
            kind = None
            if pa.types.is_integer(t):
                kind = "float_nan" if has_nulls.get(name) else "int"
            elif pa.types.is_floating(t):
                kind = "float"
            elif pa.types.is_boolean(t):
                kind = "bool_nan" if has_nulls.get(name) else "bool"
            elif pa.types.is_timestamp(t):
                kind = "time_nan" if has_nulls.get(name) else "time"
                self.tz[name] = t.tz
            elif is_text(t):
                if name in vocabularies:
                    kind = "code"
                    self.vocab[name] = pa.array(vocabularies[name], pa.string())
                elif columns is not None:
                    raise ValidationError(f"column `{name}`: strings without a vocabulary in the manifest (more than "
                                          f"100,000 distinct values, or a set exported before vocabularies): encode "
                                          f"it before the export")
            elif (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and (
                    pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
                kind = "list"
            if kind is None:
                if columns is not None:
                    raise ValidationError(f"column `{name}` of type {t} has no tensor form")
                continue
            self.kinds[name] = kind
        self.names = list(self.kinds)

    def arrays(self, table: pa.Table) -> Dict[str, np.ndarray]:
        """The table's columns as numpy arrays (lists as 2-D), in the tensor dtypes."""
        out: Dict[str, np.ndarray] = {}
        for name, kind in self.kinds.items():
            col = table.column(name).combine_chunks()
            if kind in ("int", "float", "bool"):
                out[name] = col.to_numpy(zero_copy_only=False)
            elif kind == "float_nan":
                out[name] = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
            elif kind == "bool_nan":
                out[name] = col.cast(pa.float32()).to_numpy(zero_copy_only=False)
            elif kind == "time":
                out[name] = _micros(col, self.tz[name]).to_numpy(zero_copy_only=False)
            elif kind == "time_nan":
                out[name] = _micros(col, self.tz[name]).cast(pa.float64()).to_numpy(zero_copy_only=False)
            elif kind == "code":  # a value's place in the vocabulary; -1 for null or unknown
                codes = pc.index_in(col.cast(pa.string()), value_set=self.vocab[name]).fill_null(-1)
                out[name] = codes.to_numpy(zero_copy_only=False).astype(np.int64)
            else:  # list
                out[name] = _matrix(name, col, self.width.get(name))
        return out

    def fix_widths(self, first: Optional[pa.Table]) -> None:
        """Fixes each list column's length from ``first`` (the set's first block), so a
        block whose lists are of another length is refused by name, not batched at
        another width."""
        for name, kind in self.kinds.items():
            if kind == "list" and first is not None and first.num_rows:
                self.width[name] = _matrix(name, first.column(name).combine_chunks(), None).shape[1]


def _micros(col: pa.Array, tz: Optional[str]) -> pa.Array:
    """A timestamp column as int64 microseconds since the epoch, whatever its unit."""
    return pc.cast(col, pa.timestamp("us", tz), safe=False).cast(pa.int64())


def _matrix(name: str, col: pa.Array, width: Optional[int]) -> np.ndarray:
    """A list column of one length (``width`` where fixed) and no nulls as a 2-D array;
    anything else is refused, naming the column."""
    if len(col) == 0:
        return np.zeros((0, width or 0))
    if col.null_count:
        raise ValidationError(f"column `{name}`: null lists have no tensor form")
    lengths = pc.list_value_length(col)
    span = pc.min_max(lengths).as_py()
    if span["min"] != span["max"]:
        raise ValidationError(f"column `{name}`: ragged lists (lengths {span['min']} to {span['max']}) have no tensor "
                              f"form; pad them to one length before the export")
    if width is not None and span["max"] != width:
        raise ValidationError(f"column `{name}`: ragged lists (length {span['max']} here, {width} in the first block) "
                              f"have no tensor form; pad them to one length before the export")
    values = pc.list_flatten(col)
    if values.null_count:
        raise ValidationError(f"column `{name}`: lists with null elements have no tensor form")
    return values.to_numpy(zero_copy_only=False).reshape(len(col), span["max"])


class Reader:
    """Reads blocks (row groups) of a training set's shards, keeping files open."""

    def __init__(self, files: List[str], fmt: str, blocks: List[Tuple[int, int]], columns: List[str]):
        self.files, self.fmt, self.blocks, self.columns = files, fmt, blocks, columns
        self.open: "OrderedDict[int, Any]" = OrderedDict()
        # The last block read: a block that straddles two windows is read once.
        self.last: Optional[Tuple[int, pa.Table]] = None

    def block(self, b: int) -> pa.Table:
        if self.last is not None and self.last[0] == b:
            return self.last[1]
        table = self._read(b)
        self.last = (b, table)
        return table

    def _read(self, b: int) -> pa.Table:
        shard, group = self.blocks[b]
        handle = self.open.get(shard)
        if handle is None:
            if len(self.open) >= MAX_OPEN:  # the least recently used goes
                _, old = self.open.popitem(last=False)
                close = getattr(old, "close", None)
                if close is not None:
                    close()
            if self.fmt == "arrow":
                handle = pa.ipc.open_file(pa.memory_map(self.files[shard]))
            else:
                handle = pq.ParquetFile(self.files[shard])
            self.open[shard] = handle
        else:
            self.open.move_to_end(shard)
        if self.fmt == "arrow":
            batch = handle.get_batch(group)
            return pa.Table.from_batches([batch]).select(self.columns)
        return handle.read_row_group(group, columns=self.columns)


def window_arrays(plan: Plan, j: int, reader: Reader, columns: Columns) -> Dict[str, np.ndarray]:
    """Window ``j``'s rows as arrays, permuted when the plan shuffles."""
    lo, hi = plan.window_rows(j)
    parts: List[Dict[str, np.ndarray]] = []
    at = 0
    for block, first, end in plan.segments:
        n = end - first
        if at + n > lo and at < hi:
            a, b = max(lo - at, 0), min(hi - at, n)
            parts.append(columns.arrays(reader.block(block).slice(first + a, b - a)))
        at += n
        if at >= hi:
            break
    if not (plan.shuffle and hi - lo > 1):
        return {name: (np.concatenate([p[name] for p in parts]) if parts else np.zeros(0)) for name in columns.names}
    # out = rows[perm]: each column's parts joined, then gathered in the permuted order
    # (measured faster than scattering each part to its place: bench/RESULTS.md).
    perm = np.random.default_rng([plan.seed, plan.epoch, plan.rank, j]).permutation(hi - lo)
    return {name: np.concatenate([p[name] for p in parts])[perm] for name in columns.names}


def window_tensors(arrays: Dict[str, np.ndarray], torch: Any, packed: bool) -> Dict[str, Any]:
    """A window's arrays as tensors (batches are slices of them). ``packed`` (in a
    data-loader worker): the 1-D columns of one dtype as rows of one array, so every batch
    of the window crosses to the trainer as views of one shared-memory block, not a
    segment per column and batch."""
    if not packed:
        return {n: torch.from_numpy(a) for n, a in arrays.items()}
    out = {name: torch.from_numpy(arr) for name, arr in arrays.items() if arr.ndim != 1}
    out.update(pack_by_dtype({name: arr for name, arr in arrays.items() if arr.ndim == 1}, torch))
    return {n: out[n] for n in arrays}


def pack_by_dtype(flat: Dict[str, np.ndarray], torch: Any) -> Dict[str, Any]:
    """1-D arrays as tensors, those of one dtype rows of one shared array (a worker then
    hands them over as one shared-memory segment, not one per column)."""
    out: Dict[str, Any] = {}
    groups: Dict[Any, List[str]] = {}
    for name, arr in flat.items():
        groups.setdefault(arr.dtype, []).append(name)
    for dtype, names in groups.items():
        block = np.empty((len(names), len(flat[names[0]])), dtype=dtype)
        for i, name in enumerate(names):
            block[i] = flat[name]
        shared = torch.from_numpy(block)
        for i, name in enumerate(names):
            out[name] = shared[i]
    return out


def default_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """``rank`` and ``world_size`` as given, else ``torch.distributed``'s when it is
    initialised, else 0 and 1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else rank), (dist.get_world_size() if world_size is None else world_size)
    except ImportError:  # pragma: no cover - without PyTorch
        pass
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


def batches_total(n_rows: int, batch_size: int, world_size: int) -> int:
    """Batches each rank yields per epoch."""
    return math.ceil(math.ceil(n_rows / world_size) / batch_size) if n_rows else 0


def layout(files: List[str], fmt: str) -> Tuple[List[Tuple[int, int]], List[int], Dict[str, bool], pa.Schema]:
    """A set's blocks (shard, row group) and their rows, which columns hold nulls, and its
    schema, from the shards' metadata (Parquet footers and statistics; Arrow files'
    batches)."""
    blocks: List[Tuple[int, int]] = []
    rows: List[int] = []
    nulls: Dict[str, bool] = {}
    schema = None
    for k, path in enumerate(files):
        if fmt == "arrow":
            reader = pa.ipc.open_file(pa.memory_map(path))
            schema = schema or reader.schema
            for g in range(reader.num_record_batches):
                batch = reader.get_batch(g)
                blocks.append((k, g))
                rows.append(batch.num_rows)
                for name, col in zip(batch.schema.names, batch.columns):
                    nulls[name] = nulls.get(name, False) or col.null_count > 0
        else:
            meta = pq.ParquetFile(path)
            schema = schema or meta.schema_arrow
            top = sorted(meta.schema_arrow.names, key=len, reverse=True)
            md = meta.metadata
            for g in range(md.num_row_groups):
                group = md.row_group(g)
                blocks.append((k, g))
                rows.append(group.num_rows)
                for c in range(group.num_columns):
                    chunk = group.column(c)
                    # The top-level column this leaf belongs to (a name may hold dots).
                    leaf = chunk.path_in_schema
                    name = next((n for n in top if leaf == n or leaf.startswith(n + ".")), leaf)
                    stats = chunk.statistics
                    # No statistics: assume nulls (the float form holds every value).
                    has = True if stats is None or not stats.has_null_count else stats.null_count > 0
                    nulls[name] = nulls.get(name, False) or has
    return blocks, rows, nulls, schema if schema is not None else pa.schema([])


def torch_data(ts: Any, batch_size: int, columns: Optional[Sequence[str]], shuffle: bool, seed: int,
               rank: Optional[int], world_size: Optional[int], epoch: int, window_rows: int) -> Any:
    """``TrainingSet.to_torch``'s dataset (see there)."""
    try:
        import torch  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ValidationError("to_torch needs PyTorch (pip install torch)") from e
    rank, world_size = default_rank(rank, world_size)
    blocks, rows, nulls, schema = ts._layout()
    cols = Columns(schema, ts.manifest.get("vocabularies", {}), nulls, columns)
    if "list" in cols.kinds.values():
        first = next((b for b, n in enumerate(rows) if n), None)
        reader = Reader(ts.files, ts.format, blocks, [n for n, k in cols.kinds.items() if k == "list"])
        cols.fix_widths(None if first is None else reader.block(first))
    data = _torch_class()(ts.files, ts.format, blocks, rows, cols, batch_size, rank, world_size, shuffle, seed, epoch,
                          window_rows)
    plan = data.plan()  # refuses a bad batch size or rank now, not in a worker
    if 0 in plan.batch_sizes:
        warnings.warn(f"to_torch: rank {rank}'s last batch is empty ({sum(rows)} rows over {world_size} ranks in "
                      f"batches of {batch_size}); skip empty batches in the training step (a mean loss over none is "
                      f"NaN)", stacklevel=3)
    return data


def check_loader_options(kwargs: Dict[str, Any]) -> None:
    """Refuses the DataLoader options that would break ``state_dict()``."""
    if kwargs.get("persistent_workers"):
        raise ValidationError("loader(persistent_workers=True): persistent workers keep the epoch and state "
                              "they started with; make a loader() per epoch instead")
    if kwargs.get("in_order", True) is False:
        raise ValidationError("loader(in_order=False): the order batches come in is what state_dict() counts")


def counted_loader(data: Any, num_workers: int, **kwargs: Any) -> Any:
    """A ``DataLoader`` over ``data`` (``batch_size=None``) whose iteration counts the
    batches handed out into ``data.consumed`` (with workers; without, the dataset, iterated
    here, counts itself), for ``state_dict()``: one set's loader's and a mixture's."""
    from torch.utils.data import DataLoader
    check_loader_options(kwargs)
    dl = DataLoader(data, batch_size=None, num_workers=num_workers, **kwargs)

    class Counted:
        def __len__(self):
            return len(data)

        def __iter__(self):
            it = iter(dl)
            if num_workers == 0:
                yield from it
                return
            data._begin_workers(num_workers)
            for batch in it:
                data.consumed += 1
                yield batch

    return Counted()


_CLASS: Any = None


def _torch_class() -> Any:
    """The IterableDataset class, made once PyTorch is imported (and importable by name
    from this module, so spawned workers unpickle it)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    class TorchData(IterableDataset):  # type: ignore[misc]
        """A training set's batches for one rank, as dicts of tensors (docs/export.md)."""

        def __init__(self, files, fmt, blocks, rows, columns, batch_size, rank, world_size, shuffle, seed, epoch,
                     window_rows):
            self.files, self.fmt, self.blocks, self.block_rows, self.columns = files, fmt, blocks, rows, columns
            self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
            self.shuffle, self.seed, self.epoch, self.window_rows = shuffle, seed, epoch, window_rows
            # Batches handed out before this run (a loaded state), and in this run: how
            # many, by how many workers.
            self.done: set = set()
            self.consumed, self.workers = 0, 1
            # A state was loaded and nothing iterated since: set_epoch of its epoch keeps it.
            self.loaded = False

        def plan(self) -> Plan:
            return Plan(self.block_rows, self.batch_size, self.rank, self.world_size, self.shuffle, self.seed,
                        self.epoch, self.window_rows)

        def __len__(self) -> int:
            return batches_total(sum(self.block_rows), self.batch_size, self.world_size)

        def set_epoch(self, epoch: int) -> None:
            """Starts epoch ``epoch`` (its own order), from its first batch; right after
            ``load_state_dict`` of that epoch, from where the state was taken."""
            if self.loaded and epoch == self.epoch:
                self.loaded = False
                return
            self.epoch, self.done, self.consumed, self.workers, self.loaded = epoch, set(), 0, 1, False

        def _fingerprint(self) -> Dict[str, Any]:
            return {"seed": self.seed, "batch_size": self.batch_size, "rank": self.rank,
                    "world_size": self.world_size, "shuffle": self.shuffle, "window_rows": self.window_rows,
                    "rows": sum(self.block_rows), "blocks": len(self.block_rows)}

        def state_dict(self) -> Dict[str, Any]:
            """Where this rank is in the epoch: the batches handed out so far (counted
            when iterated directly or through ``loader()``)."""
            done = self.done | handed_out(self.plan(), self.workers, self.done, self.consumed)
            return {"epoch": self.epoch, **self._fingerprint(), "done": to_ranges(done)}

        def load_state_dict(self, state: Dict[str, Any]) -> None:
            """Resumes where ``state_dict()`` was taken: the next iteration yields the
            batches not yet handed out, whatever the number of workers now."""
            for key, value in self._fingerprint().items():
                if state.get(key) != value:
                    raise ValidationError(f"load_state_dict: the state is of a loader with {key}={state.get(key)!r}, "
                                          f"this one has {value!r}")
            self.epoch = state["epoch"]
            self.done = {b for first, last in state["done"] for b in range(first, last + 1)}
            self.consumed, self.workers, self.loaded = 0, 1, True

        def __iter__(self):
            info = get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            plan = self.plan()
            skip = self.done
            main = info is None
            if main:
                self.consumed, self.workers, self.loaded = 0, 1, False
            reader = Reader(self.files, self.fmt, self.blocks, list(self.columns.names))
            for j, (lo, hi) in enumerate(plan.windows()):
                if j % workers != worker or all(b in skip for b in range(lo, hi)):
                    continue
                tensors = window_tensors(window_arrays(plan, j, reader, self.columns), torch, packed=not main)
                offset = 0
                for b in range(lo, hi):
                    size = plan.batch_sizes[b]
                    if b not in skip:
                        batch = {n: t[offset:offset + size] for n, t in tensors.items()}
                        if main:
                            self.consumed += 1
                        yield batch
                    offset += size

        def _begin_workers(self, num_workers: int) -> None:
            """Iterating through a loader with ``num_workers`` workers: counted from 0."""
            self.consumed, self.workers, self.loaded = 0, num_workers, False

        def loader(self, num_workers: int = 0, **kwargs: Any):
            """A ``DataLoader`` over this dataset (``batch_size=None``) that counts the
            batches it hands out, for ``state_dict()``."""
            return counted_loader(self, num_workers, **kwargs)

    TorchData.__module__ = __name__
    TorchData.__qualname__ = "TorchData"
    globals()["TorchData"] = TorchData
    _CLASS = TorchData
    return TorchData


def __getattr__(name: str) -> Any:
    """``TorchData``, made on first use: a worker started by spawn or forkserver imports
    this module afresh and asks for the class by name to unpickle the dataset."""
    if name == "TorchData":
        return _torch_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
