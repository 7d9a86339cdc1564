"""Reading an exported training set (``quiver export``): ``TrainingSet(DIR)``.

    ts = qv.TrainingSet("train_v1")
    ts.to_arrow_dataset(); ts.to_pandas()
    data = ts.to_torch(batch_size=1024, shuffle=True, seed=7)   # rank, world size from torch.distributed

The shards listed in ``manifest.json`` are checked against their SHA-256 on request
(``verify()``). ``to_torch`` is the loader for data-parallel training (``loader.py``):
each (rank, data-loader worker) reads a disjoint part, every row once per epoch, the same
number of batches on every rank, rows shuffled, resumable mid-epoch.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.dataset as ds

from ._quiver import NotFoundError, ValidationError
from .loader import WINDOW_ROWS, layout, pack_by_dtype, torch_data


def shard_plan(n_shards: int, seed: int, shuffle: bool, rank: int, world_size: int,
               worker: int = 0, num_workers: int = 1) -> List[int]:
    """The shard indexes one (rank, worker) reads, in order. The order is the same for a
    seed on every rank; shards go round robin to rank x worker slots, so the slots
    together read each shard exactly once."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValidationError(f"rank {rank} is not in 0..{world_size}")
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValidationError(f"worker {worker} is not in 0..{num_workers}")
    order = list(range(n_shards))
    if shuffle:
        random.Random(seed).shuffle(order)
    slot, slots = rank * num_workers + worker, world_size * num_workers
    return order[slot::slots]


class TrainingSet:
    """An exported training set: shards plus ``manifest.json``."""

    def __init__(self, path: str):
        self.path = str(path)
        manifest = os.path.join(self.path, "manifest.json")
        if not os.path.exists(manifest):
            raise NotFoundError(f"{manifest}: not found (is {self.path} a finished `quiver export`?)")
        with open(manifest) as fh:
            self.manifest: Dict[str, Any] = json.load(fh)
        self.id: str = self.manifest["training_set_id"]
        self.format: str = self.manifest["options"]["format"]
        self.files: List[str] = [os.path.join(self.path, s["file"]) for s in self.manifest["shards"]]

    @property
    def num_rows(self) -> int:
        return int(self.manifest["rows"])

    def verify(self) -> None:
        """Checks every shard's SHA-256 against the manifest."""
        for shard, path in zip(self.manifest["shards"], self.files):
            with open(path, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            if digest != shard["sha256"]:
                raise ValidationError(f"{path}: SHA-256 {digest} differs from the manifest's {shard['sha256']}")

    def to_arrow_dataset(self) -> ds.Dataset:
        return ds.dataset(self.files, format="ipc" if self.format == "arrow" else "parquet")

    def to_arrow(self) -> pa.Table:
        return self.to_arrow_dataset().to_table()

    def to_pandas(self):
        return self.to_arrow().to_pandas()

    def to_polars(self):
        import polars as pl

        return pl.from_arrow(self.to_arrow())

    def iter_batches(self, batch_size: int, columns: Optional[Sequence[str]] = None, shuffle_shards: bool = False,
                     seed: int = 0, rank: int = 0, world_size: int = 1, worker: int = 0,
                     num_workers: int = 1) -> Iterator[pa.RecordBatch]:
        """The record batches of this (rank, worker)'s shards, in the seeded order."""
        fmt = "ipc" if self.format == "arrow" else "parquet"
        for k in shard_plan(len(self.files), seed, shuffle_shards, rank, world_size, worker, num_workers):
            shard = ds.dataset(self.files[k], format=fmt)
            yield from shard.to_batches(columns=list(columns) if columns else None, batch_size=batch_size)

    def to_torch(self, batch_size: int = 1024, columns: Optional[Sequence[str]] = None, shuffle: bool = False,
                 seed: int = 0, rank: Optional[int] = None, world_size: Optional[int] = None, epoch: int = 0, *,
                 shuffle_shards: Optional[bool] = None, window_rows: int = WINDOW_ROWS):
        """A ``torch.utils.data.IterableDataset`` of dicts of tensors for one rank of a
        data-parallel job (docs/export.md#the-pytorch-loader); iterate it directly or with
        ``.loader(num_workers=...)`` (a ``DataLoader(ds, batch_size=None)`` that counts
        for ``state_dict()``).

        Every (rank, worker) reads a disjoint part and together they read every row once
        per epoch; every rank yields ``len(ds)`` batches; ``shuffle`` shuffles rows (the
        set's blocks in a seeded order, then rows within windows of ``window_rows``),
        differently for each ``epoch`` (``set_epoch``), the same for a seed;
        ``state_dict()`` / ``load_state_dict()`` resume mid-epoch. ``rank`` and
        ``world_size`` default to ``torch.distributed``'s when it is initialised.
        ``columns`` asked for by name are returned or refused: numbers as they are (an
        integer or bool column with nulls as floats with NaN), timestamps as int64
        microseconds, strings as int64 codes into the manifest's ``vocabularies`` (-1:
        null), lists of one length as 2-D. ``shuffle_shards`` is the older name of
        ``shuffle``. Needs PyTorch."""
        if shuffle_shards is not None:
            shuffle = shuffle or shuffle_shards
        return torch_data(self, batch_size, columns, shuffle, seed, rank, world_size, epoch, window_rows)

    def log_to_mlflow(self, context: str = "training", run_id: Optional[str] = None,
                      name: Optional[str] = None) -> None:
        """Logs this training set as an input dataset of an MLflow run, as
        ``mlflow.log_input`` does (docs/lineage.md#mlflow): its digest is the training
        set's id, its source the manifest's location, its schema the shards' columns, and
        its tags the service, the registry version, the views and Delta versions read, and
        the feature repository's code version. The active run (MLflow starts one when
        none is), or the run ``run_id``. Needs ``mlflow`` or ``mlflow-skinny``."""
        try:
            import mlflow
            from mlflow.data.dataset_source_registry import resolve_dataset_source
            from mlflow.data.meta_dataset import MetaDataset
        except ImportError as e:
            raise ValidationError("log_to_mlflow needs MLflow: pip install mlflow-skinny (or mlflow)") from e
        manifest = self.manifest
        import warnings
        with warnings.catch_warnings():
            # A local path matches MLflow's local source twice; it says so, and takes it.
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(os.path.abspath(os.path.join(self.path, "manifest.json")))
        schema = self._mlflow_schema()
        dataset = MetaDataset(source=source, name=name or os.path.basename(os.path.abspath(self.path)),
                              digest=self.id, schema=schema)
        code = manifest.get("code_version")
        tags = {
            "quiver.training_set_id": self.id,
            "quiver.service": manifest["options"]["service"],
            "quiver.registry_version": str(manifest["registry_version"]),
            "quiver.delta_versions": json.dumps(manifest["delta_versions"], sort_keys=True),
            "quiver.rows": str(manifest["rows"]),
            "quiver.code_version": code["commit"] + ("-dirty" if code["dirty"] else "") if code else "unknown",
        }
        if run_id is None:
            mlflow.log_input(dataset, context=context, tags=tags)
            return
        from mlflow.entities import DatasetInput, InputTag
        entity_tags = [InputTag(key="mlflow.data.context", value=context)] + [InputTag(key=k, value=v) for k, v in tags.items()]
        mlflow.MlflowClient().log_inputs(run_id, [DatasetInput(dataset=dataset._to_mlflow_entity(), tags=entity_tags)])

    def _mlflow_schema(self):
        """The shards' columns as an MLflow schema (a column of a type MLflow has no name
        for is left out); ``None`` without shards."""
        from mlflow.types import ColSpec, Schema
        from mlflow.types.schema import Array

        def spec(t):
            if pa.types.is_boolean(t):
                return "boolean"
            if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t) or pa.types.is_uint8(t) or pa.types.is_uint16(t):
                return "integer"
            if pa.types.is_integer(t):
                return "long"
            if pa.types.is_float16(t) or pa.types.is_float32(t):
                return "float"
            if pa.types.is_float64(t):
                return "double"
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                return "string"
            if pa.types.is_binary(t) or pa.types.is_large_binary(t):
                return "binary"
            if pa.types.is_timestamp(t) or pa.types.is_date(t):
                return "datetime"
            if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
                inner = spec(t.value_type)
                return Array(inner) if inner is not None else None
            return None

        if not self.files:
            return None
        columns = [(f.name, spec(f.type)) for f in self.to_arrow_dataset().schema]
        return Schema([ColSpec(t, n) for n, t in columns if t is not None])

    def _layout(self):
        """The blocks, their rows, the columns with nulls and the schema (loader.layout),
        read once."""
        if getattr(self, "_cached_layout", None) is None:
            self._cached_layout = layout(self.files, self.format)
        return self._cached_layout


def to_tensors(table: Any, torch: Any, device: str = "cpu", pack: bool = False) -> Dict[str, Any]:
    """The columns of an Arrow table or batch that a model can take, as tensors: integers
    and floats as they are (an integer column with nulls becomes float64 with NaN),
    booleans as ``torch.bool`` (with nulls: float32 1/0/NaN), lists of numbers of one
    length without nulls (embeddings) as a 2-D tensor. Strings, timestamps and ragged
    lists are left out: encode them first, or choose ``columns``.

    With ``pack``, columns of one dtype share one buffer (each tensor a contiguous row of
    it), so a DataLoader worker hands a batch over in a few shared-memory segments, not
    one per column (the tensors then keep each other's memory alive)."""

    flat: Dict[str, Any] = {}  # name -> 1-D numpy array
    out: Dict[str, Any] = {}
    for name, col in zip(table.schema.names, table.columns):
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        t = col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            flat[name] = col.to_numpy(zero_copy_only=False)
        elif pa.types.is_boolean(t):
            flat[name] = (col.cast(pa.float32()) if col.null_count else col).to_numpy(zero_copy_only=False)
        elif (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and (
                pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
            if col.null_count or len(col) == 0:
                continue
            span = pa.compute.min_max(pa.compute.list_value_length(col)).as_py()
            if span["min"] != span["max"] or span["max"] == 0:
                continue
            values = pa.compute.list_flatten(col)
            if values.null_count:
                continue
            out[name] = torch.from_numpy(values.to_numpy(zero_copy_only=False, writable=True)).reshape(len(col), -1)
    if not pack:
        for name, arr in flat.items():
            out[name] = torch.from_numpy(arr.copy() if not arr.flags.writeable else arr)
        flat = {}
    out.update(pack_by_dtype(flat, torch))
    out = {name: out[name] for name in table.schema.names if name in out}
    if str(device) != "cpu":
        out = {k: v.to(device) for k, v in out.items()}
    return out
