"""Quiver: a feature store with a Feast-shaped Python API over the Rust core.

    import quiver as qv
    store = qv.FeatureStore("repo")
    store.apply([rider, trips, svc])
    job = store.get_historical_features(entity_df=spine, features=["trips:fare"])
    job.to_pandas()

Definitions built here become the same Rust structures that ``features.yaml`` gives and
go through the same validation and registry. Tables (pyarrow, pandas or polars) cross
into Rust through the Arrow PyCapsule stream interface; results come back as pyarrow tables
without a copy on the Rust side. Long calls release the GIL, and Ctrl-C cancels them.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field as _field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import pyarrow as pa

from . import _quiver
from ._quiver import NotFoundError, QuiverError, StoreUnavailableError, ValidationError
from .training import TrainingSet, shard_plan, to_tensors

__all__ = [
    "Aggregation", "Array", "Bool", "Bytes", "DeltaSource", "DuplicateIngestWarning", "Entity", "FeatureService", "FeatureStore", "FeatureView",
    "Field", "Float32", "Float64", "Int32", "Int64", "KafkaSource", "NotFoundError", "OnlineResponse",
    "QuiverError", "RetrievalJob", "StoreUnavailableError", "String", "TrainingSet", "UnixTimestamp",
    "ValidationError", "shard_plan", "to_tensors",
]


class DuplicateIngestWarning(UserWarning):
    """``FeatureStore.ingest`` found the table already holding the same content and
    appended nothing (pass ``allow_duplicate=True`` to append it again)."""


# ---------------------------------------------------------------------------------------
# Types


@dataclass(frozen=True)
class _Type:
    dtype: str

    def __repr__(self) -> str:
        return f"qv.{self.dtype}"


Int32 = _Type("int32")
Int64 = _Type("int64")
Float32 = _Type("float32")
Float64 = _Type("float64")
Bool = _Type("bool")
String = _Type("string")
Bytes = _Type("bytes")
UnixTimestamp = _Type("timestamp")


def Array(element: _Type) -> _Type:  # noqa: N802 (Feast's spelling)
    """A list type: ``Array(Float32)`` is an embedding (``list<float32>``)."""
    if element.dtype not in ("int64", "float32", "float64", "string"):
        raise ValidationError(f"Array({element!r}): lists hold int64, float32, float64 or string")
    return _Type(f"list<{element.dtype}>")


# ---------------------------------------------------------------------------------------
# Definitions


@dataclass
class Field:
    """A named, typed column: a feature or a join key."""

    name: str
    dtype: _Type

    def _json(self) -> dict:
        if not isinstance(self.dtype, _Type):
            raise ValidationError(f"field `{self.name}`: dtype must be a quiver type such as qv.Float64, got {self.dtype!r}")
        return {"name": self.name, "dtype": self.dtype.dtype}


class Entity:
    """An entity with one or more join keys, typed ``int64`` or ``string``.

    ``Entity(name="rider", join_keys=[Field("rider_id", Int64)])``, or Feast's style
    ``Entity(name="rider", join_keys=["rider_id"], value_type=Int64)``.
    """

    def __init__(self, name: str, join_keys: Sequence[Union[Field, str]], value_type: Optional[_Type] = None,
                 description: str = "", tags: Optional[Mapping[str, str]] = None):
        keys: List[Field] = []
        for k in join_keys:
            if isinstance(k, Field):
                keys.append(k)
            elif isinstance(k, str):
                if value_type is None:
                    raise ValidationError(f"entity `{name}`: join key `{k}` given by name needs value_type=qv.Int64 or qv.String")
                keys.append(Field(k, value_type))
            else:
                raise ValidationError(f"entity `{name}`: join keys are qv.Field or names, got {k!r}")
        self.name = name
        self.join_keys = keys
        self.description = description
        self.tags = dict(tags or {})

    def _json(self) -> dict:
        out: Dict[str, Any] = {"name": self.name, "join_keys": [k._json() for k in self.join_keys]}
        if self.description:
            out["description"] = self.description
        if self.tags:
            out["tags"] = self.tags
        return out


@dataclass
class KafkaSource:
    """A Kafka topic whose JSON messages land in the view's Delta table."""

    topic: str
    format: str = "json"


@dataclass
class DeltaSource:
    """A view's Delta table (default ``<offline root>/<view>``) and its time columns."""

    timestamp_field: str = "event_timestamp"
    created_timestamp_field: Optional[str] = None
    path: Optional[str] = None
    stream: Optional[KafkaSource] = None

    def _json(self) -> dict:
        out: Dict[str, Any] = {"timestamp_field": self.timestamp_field}
        if self.created_timestamp_field:
            out["created_timestamp_field"] = self.created_timestamp_field
        if self.path:
            out["path"] = self.path
        if self.stream:
            out["stream"] = {"topic": self.stream.topic, "format": self.stream.format}
        return out


def _ttl(ttl: Optional[timedelta], what: str = "ttl") -> str:
    if ttl is None:
        return "0"
    if not isinstance(ttl, timedelta):
        raise ValidationError(f"{what} must be a datetime.timedelta, got {ttl!r}")
    if ttl.microseconds:
        raise ValidationError(f"{what} {ttl} has a fraction of a second; quiver durations are whole seconds")
    seconds = int(ttl.total_seconds())
    if seconds < 0:
        raise ValidationError(f"{what} {ttl} is negative")
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class Aggregation:
    """A windowed aggregation of one event column (docs/aggregations.md): ``function`` is count, sum,
    avg, stddev, min, max, last or last_k (with ``k``); ``window`` (Feast: ``time_window``)
    and ``hop`` are timedeltas. A view with aggregations is an event log, and serves them."""

    def __init__(self, name: str, function: str, column: str, window: Optional[timedelta] = None,
                 hop: Optional[timedelta] = None, k: Optional[int] = None, time_window: Optional[timedelta] = None,
                 description: str = ""):
        if window is not None and time_window is not None:
            raise ValidationError(f"aggregation `{name}`: give window or time_window, not both")
        window = window if window is not None else time_window
        if window is None:
            raise ValidationError(f"aggregation `{name}`: no window (window=timedelta(hours=1), say)")
        self.name = name
        self.function = function
        self.column = column
        self.window = window
        self.hop = hop
        self.k = k
        self.description = description

    def _json(self) -> dict:
        out: Dict[str, Any] = {"name": self.name, "function": self.function, "column": self.column,
                               "window": _ttl(self.window, f"aggregation `{self.name}`: window")}
        if self.hop is not None:
            out["hop"] = _ttl(self.hop, f"aggregation `{self.name}`: hop")
        if self.k is not None:
            out["k"] = self.k
        if self.description:
            out["description"] = self.description
        return out


class FeatureView:
    """Features of some entities, with a ttl, a Delta source and an optional stream; with
    ``aggregations``, an event log whose served features are those aggregations."""

    def __init__(self, name: str, entities: Sequence[Union[Entity, str]], schema: Sequence[Field],
                 ttl: Optional[timedelta] = None, online: bool = True, source: Optional[DeltaSource] = None,
                 tags: Optional[Mapping[str, str]] = None, description: str = "",
                 aggregations: Sequence[Aggregation] = ()):
        self.aggregations = list(aggregations)
        self.name = name
        self.entities = list(entities)
        self.schema = list(schema)
        self.ttl = ttl
        self.online = online
        self.source = source or DeltaSource()
        self.tags = dict(tags or {})
        self.description = description

    def _json(self) -> dict:
        out: Dict[str, Any] = {
            "name": self.name,
            "entities": [e.name if isinstance(e, Entity) else e for e in self.entities],
            "features": [f._json() for f in self.schema],
            "ttl": _ttl(self.ttl),
            "source": self.source._json(),
        }
        if not self.online:
            out["online"] = False
        if self.tags:
            out["tags"] = self.tags
        if self.description:
            out["description"] = self.description
        if self.aggregations:
            out["aggregations"] = [a._json() for a in self.aggregations]
        return out


class FeatureService:
    """A named list of feature references (``view:feature``) for one model."""

    def __init__(self, name: str, features: Sequence[str], description: str = "",
                 tags: Optional[Mapping[str, str]] = None):
        self.name = name
        self.features = list(features)
        self.description = description
        self.tags = dict(tags or {})

    def _json(self) -> dict:
        out: Dict[str, Any] = {"name": self.name, "features": self.features}
        if self.description:
            out["description"] = self.description
        if self.tags:
            out["tags"] = self.tags
        return out


# ---------------------------------------------------------------------------------------
# Tables in and out


def _to_arrow(table: Any, what: str) -> pa.Table:
    """A pyarrow Table from a pyarrow Table/RecordBatch, a pandas or a polars DataFrame."""
    if isinstance(table, pa.Table):
        return table
    if isinstance(table, pa.RecordBatch):
        return pa.Table.from_batches([table])
    module = type(table).__module__.split(".")[0]
    if module == "pandas":
        return pa.Table.from_pandas(table, preserve_index=False)
    if module == "polars":
        return table.to_arrow()
    raise ValidationError(f"{what} must be a pyarrow Table, a pandas DataFrame or a polars DataFrame, got {type(table).__name__}")


class RetrievalJob:
    """The result of ``get_historical_features``: one table, in spine order."""

    def __init__(self, table: pa.Table):
        self._table = table

    def to_arrow(self) -> pa.Table:
        return self._table

    def to_pandas(self):
        return self._table.to_pandas()

    def to_polars(self):
        import polars as pl

        return pl.from_arrow(self._table)

    def to_torch(self, device: str = "cpu") -> Dict[str, Any]:
        """The columns a model can take as PyTorch tensors on `device` (see
        ``quiver.training.to_tensors``: numbers, booleans, fixed-length numeric lists). The
        join runs on the host (or returns to it), so `cuda` copies once to the device; a
        zero-copy DLPack hand-over from the GPU join is not there yet. Raises
        ValidationError without PyTorch, or for `cuda` without a usable GPU."""
        try:
            import torch
        except ImportError as e:
            raise ValidationError(f"to_torch(device={device!r}) needs PyTorch (pip install torch)") from e
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ValidationError(f"to_torch(device={device!r}): PyTorch sees no CUDA device on this machine")
        return to_tensors(self._table, torch, device)


class OnlineResponse:
    """Online features in Feast's shape: ``to_dict()`` maps each column (join keys
    first) to one value per entity row; ``statuses`` holds Feast's status names."""

    def __init__(self, columns: List[tuple], table: Any):
        self._names = [c[0] for c in columns]
        self._values = {c[0]: json.loads(c[1]) for c in columns}
        self.statuses = {c[0]: list(c[2]) for c in columns}
        self._table = pa.table(table)

    def to_dict(self) -> Dict[str, List[Any]]:
        return {n: list(self._values[n]) for n in self._names}

    def to_arrow(self) -> pa.Table:
        """The answer as a table, each column typed by its definition (a feature whose
        every value is missing keeps its type)."""
        return self._table


def _utc(t: datetime, what: str) -> datetime:
    if not isinstance(t, datetime):
        raise ValidationError(f"{what} must be a datetime, got {t!r}")
    if t.tzinfo is None:
        raise ValidationError(f"{what} {t} has no time zone; quiver never guesses one (use datetime(..., tzinfo=timezone.utc))")
    return t.astimezone(timezone.utc)


# ---------------------------------------------------------------------------------------
# The store


class FeatureStore:
    """A Quiver repository (a folder with ``quiver.yaml``), as Feast's FeatureStore."""

    def __init__(self, repo_path: str = "."):
        self.repo_path = str(repo_path)
        _quiver.registry_json(self.repo_path)  # fails early outside a repository

    def apply(self, objects: Iterable[Union[Entity, FeatureView, FeatureService]], force: bool = False,
              objects_to_delete: Optional[Iterable[Union[Entity, FeatureView, FeatureService]]] = None) -> int:
        """Records the definitions as the registry's next version (the same validation
        and breaking-change checks as ``quiver apply``), as defined from Python; returns
        that version. Objects already registered and not given are kept; those in
        ``objects_to_delete`` are removed, whoever defined them."""
        kinds = {Entity: "entities", FeatureView: "feature_views", FeatureService: "feature_services"}
        singular = {"entities": "entity", "feature_views": "feature_view", "feature_services": "feature_service"}
        current = json.loads(_quiver.registry_json(self.repo_path))["definitions"]
        merged = {k: {d["name"]: d for d in current.get(k, [])} for k in kinds.values()}
        for obj in objects:
            kind = kinds.get(type(obj))
            if kind is None:
                raise ValidationError(f"apply takes Entity, FeatureView and FeatureService objects, got {type(obj).__name__}")
            merged[kind][obj.name] = obj._json()
        remove = []
        for obj in objects_to_delete or []:
            kind = kinds.get(type(obj))
            if kind is None:
                raise ValidationError(f"objects_to_delete takes Entity, FeatureView and FeatureService objects, got {type(obj).__name__}")
            merged[kind].pop(obj.name, None)
            remove.append(f"{singular[kind]}/{obj.name}")
        defs = {k: list(v.values()) for k, v in merged.items()}
        return _quiver.apply(self.repo_path, json.dumps(defs), force, remove)

    def list_feature_views(self) -> List[str]:
        return [v["name"] for v in json.loads(_quiver.registry_json(self.repo_path))["definitions"].get("feature_views", [])]

    def ingest(self, view: str, table: Any, allow_duplicate: bool = False) -> int:
        """Appends rows (pyarrow/pandas/polars) to the view's Delta table in one commit,
        checked as ``quiver ingest`` checks a file. Returns the table version.

        Idempotent by content: a table whose content the view's table already holds
        (a retried call) is not appended again; a ``DuplicateIngestWarning`` says so and
        the version holding it is returned. ``allow_duplicate=True`` appends it anyway."""
        _, version, duplicate = _quiver.ingest(self.repo_path, view, _to_arrow(table, "table"), allow_duplicate)
        if duplicate:
            warnings.warn(f"already ingested into {view} (table version {version} holds the same content): nothing appended; "
                          "allow_duplicate=True appends it again", DuplicateIngestWarning, stacklevel=2)
        return version

    def get_historical_features(self, entity_df: Any, features: Optional[Sequence[str]] = None,
                                feature_service: Optional[Union[str, FeatureService]] = None,
                                created_cutoff: bool = False, engine: str = "auto",
                                cluster: Optional[str] = None) -> RetrievalJob:
        """The point-in-time join (docs/offline.md) of ``entity_df`` (join keys and
        ``event_timestamp``, plus anything else) with ``features`` or a service.
        ``engine``: "auto" (the GPU for large spines when one is usable), "cpu" or
        "gpu" (an error without a usable GPU). ``cluster``: ``"df://HOST:PORT"`` of a
        ``quiver cluster scheduler`` to join on (docs/settings.md); the answer is the same."""
        if isinstance(features, FeatureService):
            feature_service, features = features, None
        service = feature_service.name if isinstance(feature_service, FeatureService) else feature_service
        if (features is None) == (service is None):
            raise ValidationError("give exactly one of features=[...] and feature_service=...")
        stream = _quiver.get_historical_features(self.repo_path, _to_arrow(entity_df, "entity_df"),
                                                 list(features) if features is not None else None, service, created_cutoff,
                                                 engine, cluster)
        return RetrievalJob(pa.RecordBatchReader.from_stream(stream).read_all())

    def materialize(self, start_date: datetime, end_date: datetime) -> List[tuple]:
        return _quiver.materialize(self.repo_path, _utc(start_date, "start_date"), _utc(end_date, "end_date"))

    def materialize_incremental(self, end_date: datetime) -> List[tuple]:
        return _quiver.materialize_incremental(self.repo_path, _utc(end_date, "end_date"))

    def get_online_features(self, features: Union[Sequence[str], FeatureService],
                            entity_rows: Sequence[Mapping[str, Any]], full_feature_names: bool = False) -> OnlineResponse:
        """The latest values for each entity row (``[{"rider_id": 1}, ...]``)."""
        if not entity_rows:
            raise ValidationError("entity_rows is empty")
        names = list(entity_rows[0].keys())
        for row in entity_rows:
            if list(row.keys()) != names:
                raise ValidationError(f"every entity row needs the same keys {names}, got {list(row.keys())}")
        columns = [[name, [row[name] for row in entity_rows]] for name in names]
        if isinstance(features, FeatureService):
            out = _quiver.get_online_features(self.repo_path, json.dumps(columns), None, features.name, full_feature_names)
        else:
            out = _quiver.get_online_features(self.repo_path, json.dumps(columns), list(features), None, full_feature_names)
        return OnlineResponse(*out)

    def push(self, view: str, table: Any, to: Optional[str] = None) -> Dict[str, Any]:
        """Writes rows through the streaming write path (offline first, then the
        guarded online write). `to`: "online", "offline" or "online_and_offline";
        default both for an online view, offline for a view with `online=False`
        (which takes no online writes)."""
        rows, written, version = _quiver.push(self.repo_path, view, _to_arrow(table, "table"), to)
        return {"rows": rows, "online_written": written, "offline_version": version}
