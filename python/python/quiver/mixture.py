"""Mixing training sets by weights that may change with the step (docs/mixing.md); the
plan itself is `mixture_plan.py`:
``quiver.Mixture({"web": ts_a, "code": ts_b}, weights={"web": 0.7, "code": 0.3})``.

The plan of an epoch is a pure function of the sets' row counts, the weights or schedule,
the policies, the seed, the epoch and the *global* batch (``batch_size * world_size``
rows a step), computed the same on every rank and data-loader worker:

1. each source's rows in a seeded order per pass: its blocks (shards' row groups)
   permuted by ``default_rng([seed, epoch, k, pass])``, then its rows within windows of
   ``window_rows`` permuted (``shuffle=False``: the export's order);
2. step ``s`` takes ``c[s][k]`` rows from source ``k``, the next ones in its order: the
   largest-remainder split of the global batch by the step's weights, carried — each
   count is ``floor`` or ``ceil`` of ``G * w[k]`` (within one row of its share), the one
   extra rows going to the sources furthest behind their exact running total, so the
   totals stay within about a row of exact over the epoch (:func:`step_counts`);
3. a step's rows are laid out with each source spread evenly and cut into ``world_size``
   contiguous parts (``mixture_batches._split``): rank ``r`` yields part ``r`` as its batch for that
   step, about each source's share;
4. a source that runs out: ``repeat`` starts its next pass (its own order), ``stop`` ends
   the epoch with that step (the step holds what the source had left: the epoch's last
   global batch is short), ``drop`` gives what it had left, the others fill the step, and
   the weights are renormalised without it from the next step on. The epoch also ends
   when every source is done, or after ``steps`` steps when given.

So every rank yields the same number of batches (the epoch's steps), the ranks' rows are
disjoint, and the state of the plan after any number of steps — each source's pass and
position, the carried remainders, the dropped sources, the rows read per source — is what
``state_dict()`` records: a mixture resumes from it at the same or another world size
(the rest of the epoch then reads exactly the rows not yet read, in the mix the schedule
says for the steps that follow).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._quiver import ValidationError
from .loader import WINDOW_ROWS, Columns, check_loader_options, counted_loader, default_rank, window_tensors
from .mixture_plan import POLICIES, Planner, Schedule, step_counts  # noqa: F401  (step_counts: re-exported)
from .mixture_batches import Assembler, _pieces
from .mixture_read import SourceOrder, _WindowStore

class Mixture:
    """Several training sets blended by weights (docs/mixing.md).

    ``sets``: ``{name: TrainingSet or its folder}``. ``weights``: ``{name: weight}`` for
    the whole run, or ``schedule``: ``[(step, {name: weight}), ...]`` — each point a phase
    from its step, or ``(step, weights, "linear")`` reached by a ramp from the point
    before (a source a point does not name weighs 0 there). ``on_exhausted``: what a
    source does when it runs out — ``"repeat"`` (its next pass, re-shuffled), ``"stop"``
    (the epoch ends), ``"drop"`` (the others share its weight) — one for all, or
    ``{name: policy}`` (default ``"stop"``). ``steps``: global steps per epoch at most
    (needed when no source stops the epoch)."""

    def __init__(self, sets: Mapping[str, Any], weights: Optional[Mapping[str, Any]] = None, *,
                 schedule: Optional[Sequence[Any]] = None, on_exhausted: Union[str, Mapping[str, str]] = "stop",
                 steps: Optional[int] = None):
        from .training import TrainingSet
        if not isinstance(sets, Mapping) or not sets:
            raise ValidationError("a mixture takes a non-empty mapping of name to training set")
        self.names: List[str] = [str(n) for n in sets]
        self.sets: List[Any] = []
        for name, ts in sets.items():
            if isinstance(ts, (str, os.PathLike)):
                ts = TrainingSet(os.fspath(ts))
            if not isinstance(ts, TrainingSet):
                raise ValidationError(f"source `{name}`: expected a TrainingSet or its folder, got {type(ts).__name__}")
            self.sets.append(ts)
        self.schedule = Schedule(self.names, weights, schedule)
        if isinstance(on_exhausted, str):
            policies = {n: on_exhausted for n in self.names}
        elif isinstance(on_exhausted, Mapping):
            unknown = [k for k in on_exhausted if k not in self.names]
            if unknown:
                raise ValidationError(f"on_exhausted names `{unknown[0]}`, which is not a source of the mixture "
                                      f"(sources: {', '.join(self.names)})")
            policies = {n: on_exhausted.get(n, "stop") for n in self.names}
        else:
            raise ValidationError("on_exhausted takes a policy (repeat, stop or drop) or a mapping of source to policy")
        for n, p in policies.items():
            if p not in POLICIES:
                raise ValidationError(f"on_exhausted of `{n}`: `{p}` is not a policy (repeat, stop or drop)")
        self.policies = [policies[n] for n in self.names]
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValidationError(f"steps must be a whole number of steps >= 1, got {steps!r}")
        self.steps = steps
        if steps is None and "repeat" in self.policies and "stop" not in self.policies:
            raise ValidationError("no source stops the epoch and one repeats, so an epoch would never end: give steps= "
                                  "(global steps per epoch) or make a source `stop`")
        for name, ts in zip(self.names, self.sets):
            _check_files(name, ts)
        # The arrays of chunks its datasets hand out, reused by the next chunk or dataset
        # in this process (by column; None: the rows' sources): an epoch's first chunks
        # then write to pages already touched.
        self._buffers: Dict[Optional[str], List[np.ndarray]] = {}

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_buffers"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._buffers = {}

    def describe(self) -> Dict[str, Any]:
        """What the mixture is made of: each set's id, folder and what its manifest says
        it read (service, feature references, registry and Delta versions), the schedule,
        the policies."""
        sets = {}
        for name, ts, policy in zip(self.names, self.sets, self.policies):
            m = ts.manifest
            sets[name] = {"path": os.path.abspath(ts.path), "training_set_id": ts.id, "rows": ts.num_rows,
                          "service": m["options"]["service"], "features": [f["reference"] for f in m["features"]],
                          "registry_version": m["registry_version"], "delta_versions": m["delta_versions"],
                          "code_version": m.get("code_version"), "on_exhausted": policy}
        return {"sets": sets, "schedule": self.schedule.describe(), "steps": self.steps}

    def to_torch(self, batch_size: int = 1024, columns: Optional[Sequence[str]] = None, shuffle: bool = False,
                 seed: int = 0, rank: Optional[int] = None, world_size: Optional[int] = None, epoch: int = 0, *,
                 window_rows: int = WINDOW_ROWS):
        """A ``torch.utils.data.IterableDataset`` of this rank's batches (dicts of tensors,
        ``"source"`` the source id of every row, an index into ``names``), with the
        arguments and guarantees of ``TrainingSet.to_torch`` (docs/mixing.md): every
        rank yields ``len(ds)`` batches, one per global step; ``state_dict()`` /
        ``load_state_dict()`` resume mid-epoch, also at another world size; ``.loader(
        num_workers=...)``; ``rows_read()`` and ``describe()``."""
        try:
            import torch  # noqa: F401
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ValidationError("to_torch needs PyTorch (pip install torch)") from e
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValidationError(f"batch_size must be a positive integer, got {batch_size!r}")
        rank, world_size = default_rank(rank, world_size)
        if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValidationError(f"rank {rank!r} is not in 0..{world_size!r} (world_size)")
        layouts = [ts._layout() for ts in self.sets]
        cols, vocabularies = _columns(self.names, self.sets, layouts, columns)
        return _torch_class()(self, layouts, cols, vocabularies, batch_size, rank, world_size, shuffle, seed, epoch,
                              window_rows)


def _check_files(name: str, ts: Any) -> None:
    """A set's shards are there and hold the rows its manifest says (a set changed since
    its export is refused by name; ``TrainingSet.verify()`` checks every byte)."""
    for shard, path in zip(ts.manifest["shards"], ts.files):
        if not os.path.exists(path):
            raise ValidationError(f"source `{name}`: {path} is missing (the training set changed since its export)")
        if ts.format == "arrow":
            reader = pa.ipc.open_file(pa.memory_map(path))
            rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        else:
            rows = pq.ParquetFile(path).metadata.num_rows
        if rows != shard["rows"]:
            raise ValidationError(f"source `{name}`: {path} holds {rows} rows, its manifest says {shard['rows']} "
                                  f"(the training set changed since its export)")


def _columns(names: List[str], sets: List[Any], layouts: List[Any], columns: Optional[Sequence[str]]):
    """One ``Columns`` per set over the same columns of the same types: those named, or
    every column when the sets' columns are the same; strings coded into one vocabulary,
    the sorted union of the sets'."""
    schemas = [lay[3] for lay in layouts]
    if columns is not None:
        if isinstance(columns, str):
            raise ValidationError("columns= takes a list of column names, not one string")
        wanted = list(columns)
        for name, schema in zip(names, schemas):
            missing = [c for c in wanted if c not in schema.names]
            if missing:
                raise ValidationError(f"column `{missing[0]}` is not in training set `{name}` (it has: "
                                      f"{', '.join(schema.names)})")
    else:
        wanted = list(schemas[0].names)
        for name, schema in zip(names[1:], schemas[1:]):
            if set(schema.names) != set(wanted):
                extra = sorted(set(schema.names) ^ set(wanted))
                raise ValidationError(f"training sets `{names[0]}` and `{name}` have different columns (`{extra[0]}` is in "
                                      f"one only): name the columns they share with columns=")
    for c in wanted:
        types = [s.field(c).type for s in schemas]
        for name, t in zip(names[1:], types[1:]):
            if t != types[0]:
                raise ValidationError(f"column `{c}` is {types[0]} in `{names[0]}` and {t} in `{name}`: the sets must "
                                      f"agree on its type")
    if "source" in wanted:
        raise ValidationError("column `source` would hide the batch's source ids: leave it out with columns=")
    nulls: Dict[str, bool] = {}
    for lay in layouts:
        for c, has in lay[2].items():
            nulls[c] = nulls.get(c, False) or has
    vocabularies: Dict[str, List[str]] = {}
    for c in wanted:
        if not _is_text(schemas[0].field(c).type):
            continue
        merged: set = set()
        for name, ts in zip(names, sets):
            vocab = ts.manifest.get("vocabularies", {}).get(c)
            if vocab is None:
                if columns is not None:
                    raise ValidationError(f"column `{c}` of `{name}`: strings without a vocabulary in the manifest "
                                          f"(more than 100,000 distinct values): encode it before the export")
                merged = set()
                break
            merged.update(vocab)
        if merged:
            vocabularies[c] = sorted(merged)
    cols = [Columns(schema, vocabularies, nulls, columns) for schema in schemas]
    return cols, vocabularies


def _is_text(t: pa.DataType) -> bool:
    from .loader import is_text
    return is_text(t)


def _fingerprint(data: Any) -> Dict[str, Any]:
    m = data.mixture
    return {"sets": {n: ts.id for n, ts in zip(m.names, m.sets)}, "schedule": m.schedule.describe(),
            "on_exhausted": dict(zip(m.names, m.policies)), "steps": m.steps, "batch_size": data.batch_size,
            "seed": data.seed, "shuffle": data.shuffle, "window_rows": data.window_rows,
            "columns": list(data.columns[0].names), "vocabularies": data.vocabularies}


_CLASS: Any = None


def _torch_class() -> Any:
    """The IterableDataset class, made once PyTorch is imported (importable by name from
    this module, so spawned workers unpickle it)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    class MixtureData(IterableDataset):  # type: ignore[misc]
        """A mixture's batches for one rank (docs/mixing.md)."""

        def __init__(self, mixture, layouts, columns, vocabularies, batch_size, rank, world_size, shuffle, seed,
                     epoch, window_rows):
            self.mixture, self.layouts, self.columns, self.vocabularies = mixture, layouts, columns, vocabularies
            self.names = list(columns[0].names)
            self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
            self.shuffle, self.seed, self.epoch, self.window_rows = shuffle, seed, epoch, window_rows
            self.rows = [sum(lay[1]) for lay in layouts]
            for name, n in zip(mixture.names, self.rows):
                if n == 0:
                    raise ValidationError(f"training set `{name}` has no rows")
            # Where iterating starts (the epoch's start, or a loaded state), and the
            # steps handed out since, by how many workers.
            self.start: Dict[str, Any] = self._planner().state()
            self.consumed, self.loaded = 0, False
            self.epochs: Dict[str, Dict[str, int]] = {}
            self._orders()

        def _orders(self) -> None:
            self._splits: Dict[Tuple[int, ...], Any] = {}
            self.orders = [SourceOrder(k, ts.files, ts.format, lay[0], lay[1], cols, self.seed, self.epoch, self.shuffle,
                                       self.window_rows)
                           for k, (ts, lay, cols) in enumerate(zip(self.mixture.sets, self.layouts, self.columns))]

        def __getstate__(self):
            state = dict(self.__dict__)
            state.pop("orders", None)
            return state

        def __setstate__(self, state):
            self.__dict__.update(state)
            self._orders()

        def _planner(self, state: Optional[Mapping[str, Any]] = None) -> Planner:
            p = Planner(self.rows, self.mixture.schedule, self.mixture.policies, self.mixture.steps)
            if state is not None:
                p.load(state)
            return p

        def _at(self, steps: int) -> Planner:
            """The plan after ``steps`` more steps from where iterating starts."""
            p = self._planner(self.start)
            total = self.batch_size * self.world_size
            for _ in range(steps):
                if p.advance(total) is None:
                    break
            return p

        def __len__(self) -> int:
            """Batches this rank yields from where iterating starts (the epoch's steps)."""
            p = self._planner(self.start)
            total = self.batch_size * self.world_size
            n = 0
            while p.advance(total) is not None:
                n += 1
            return n

        def set_epoch(self, epoch: int) -> None:
            """Starts epoch ``epoch`` from its first step; right after ``load_state_dict``
            of that epoch, from where the state was taken."""
            if self.loaded and epoch == self.epoch:
                self.loaded = False
                return
            if epoch != self.epoch:
                # The epoch left behind: its rows read, kept for rows_read() and the state.
                self.epochs[str(self.epoch)] = self.rows_read()["total"]
            self.epoch, self.consumed, self.loaded = epoch, 0, False
            self._orders()
            self.start = self._planner().state()

        def state_dict(self) -> Dict[str, Any]:
            """The plan after the steps handed out so far: each source's pass and
            position, the carried remainders, the rows read; loadable at another world
            size."""
            return {"epoch": self.epoch, **_fingerprint(self), "world_size": self.world_size,
                    "plan": self._at(self.consumed).state(), "epochs": dict(self.epochs)}

        def load_state_dict(self, state: Mapping[str, Any]) -> None:
            """Resumes where ``state_dict()`` was taken, at this world size and number of
            workers (which may differ from the saving run's)."""
            mine = _fingerprint(self)
            for key, value in mine.items():
                if state.get(key) != value:
                    theirs = state.get(key)
                    shown = (lambda v: json.dumps(v)[:200])
                    raise ValidationError(f"load_state_dict: the state is of another mixture: its {key} is "
                                          f"{shown(theirs)}, this one's {shown(value)}")
            self.epoch = int(state["epoch"])
            self._orders()
            self.start = dict(state["plan"])
            self.epochs = {str(k): dict(v) for k, v in state.get("epochs", {}).items()}
            self.consumed, self.loaded = 0, True

        def rows_read(self) -> Dict[str, Any]:
            """Rows read so far this epoch (every rank's, the steps handed out), per source
            and per phase of the schedule; and per source in each earlier epoch this
            dataset (or the state it resumed from) went through (``by_epoch``)."""
            p = self._at(self.consumed)
            names = self.mixture.names
            return {"epoch": self.epoch, "steps": p.step, "total": dict(zip(names, p.read)),
                    "by_phase": {str(ph): dict(zip(names, v)) for ph, v in sorted(p.read_by_phase.items())},
                    "by_epoch": dict(self.epochs)}

        def describe(self) -> Dict[str, Any]:
            """The mixture (sets, versions, schedule, policies), how it is read (seed,
            batch size, world size, shuffle, columns) and the rows read so far: what an
            ablation report needs, as JSON (``write_description``)."""
            return {**self.mixture.describe(), "seed": self.seed, "shuffle": self.shuffle,
                    "batch_size": self.batch_size, "world_size": self.world_size, "epoch": self.epoch,
                    "columns": self.names, "sources": list(self.mixture.names), "rows_read": self.rows_read()}

        def write_description(self, path: str) -> None:
            """``describe()`` as JSON at ``path`` (beside a checkpoint), written whole."""
            tmp = f"{path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(self.describe(), fh, indent=2)
            os.replace(tmp, path)

        def __iter__(self):
            info = get_worker_info()
            source = (lambda k, p, j: self.orders[k].parts(p, j))  # noqa: E731
            if info is None:
                yield from self._iterate(source)
                return
            # A worker of a plain DataLoader: steps w, w + n, ... (each worker reads every
            # window; `loader()` shares the reading out instead).
            yield from self._steps(info.id, info.num_workers, source, False)

        def _iterate(self, source):
            """This rank's batches, here (not in a worker), counted for ``state_dict()``;
            ``source(k, pass, j)`` gives a source's window (``Assembler``)."""
            self.consumed, self.loaded = 0, False
            for batch in self._steps(0, 1, source, True):
                self.consumed += 1
                yield batch

        def _steps(self, worker, workers, source, main):
            assembler = Assembler(self, self._planner(self.start), worker, workers, source)
            while True:
                got = assembler.next()
                if got is None:
                    return
                arrays, sizes = got
                tensors = window_tensors(arrays, torch, packed=not main)
                offset = 0
                for size in sizes:
                    yield {n: t[offset:offset + size] for n, t in tensors.items()}
                    offset += size

        def windows(self) -> List[Tuple[int, int, int]]:
            """The windows ``(source, pass, window)`` the epoch reads from where iterating
            starts, in the order the plan first needs them (every rank's rows)."""
            p = self._planner(self.start)
            total = self.batch_size * self.world_size
            w = self.window_rows
            seen: set = set()
            out: List[Tuple[int, int, int]] = []
            while True:
                got = p.advance(total)
                if got is None:
                    return out
                for k, (c, a) in enumerate(zip(*got)):
                    for ps, j, _, _ in _pieces(a, c, p.rows[k], w):
                        if (k, ps, j) not in seen:
                            seen.add((k, ps, j))
                            out.append((k, ps, j))

        def loader(self, num_workers: int = 0, **kwargs: Any):
            """An iterable of this rank's batches that counts them for ``state_dict()``.
            With ``num_workers``, a ``DataLoader`` of that many workers reads the epoch's
            windows — each once, worker ``w`` of ``n`` windows ``w``, ``w + n``, ... in
            the order the plan needs them — and the batches are cut from them here, in step
            order (``kwargs`` go to that DataLoader)."""
            if num_workers == 0:
                return counted_loader(self, 0, **kwargs)
            check_loader_options(kwargs)
            return _Fed(self, num_workers, kwargs)

    class WindowFeed(IterableDataset):  # type: ignore[misc]
        """The windows a mixture's epoch reads, for a DataLoader's workers: ``(key,
        arrays)`` of windows ``w``, ``w + n``, ... of the list in worker ``w`` of ``n``."""

        def __init__(self, data, needed):
            self.data, self.needed = data, needed

        def __iter__(self):
            info = get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            for i in range(worker, len(self.needed), workers):
                k, p, j = self.needed[i]
                yield (k, p, j), window_tensors(self.data.orders[k].window(p, j), torch, packed=info is not None)

    class _Fed:
        """``MixtureData.loader(num_workers=n)``: windows from n workers, batches here."""

        def __init__(self, data, num_workers, kwargs):
            self.data, self.num_workers, self.kwargs = data, num_workers, kwargs

        def __len__(self):
            return len(self.data)

        def __iter__(self):
            from torch.utils.data import DataLoader
            feed = WindowFeed(self.data, self.data.windows())
            it = iter(DataLoader(feed, batch_size=None, num_workers=self.num_workers, **self.kwargs))
            windows = ((tuple(int(x) for x in key), {n: t.numpy() for n, t in tensors.items()}) for key, tensors in it)
            store = _WindowStore(windows)
            yield from self.data._iterate(lambda k, p, j: ([store.window(k, p, j)], None))

    for cls in (MixtureData, WindowFeed):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
        globals()[cls.__name__] = cls
    _CLASS = MixtureData
    return MixtureData


def __getattr__(name: str) -> Any:
    """``MixtureData`` and ``WindowFeed``, made on first use (a spawned worker asks for
    them by name)."""
    if name in ("MixtureData", "WindowFeed"):
        _torch_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
