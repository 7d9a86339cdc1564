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

import atexit
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa

from . import _quiver
from ._arguments import _entity_value, _made_spine, _refs, _table, _utc
from ._quiver import NotFoundError, QuiverError, StoreUnavailableError, ValidationError
from .definitions import (
    Aggregation,
    Array,
    Bool,
    Bytes,
    DeltaSource,
    Entity,
    FeatureService,
    FeatureView,
    Field,
    Float32,
    Float64,
    Int32,
    Int64,
    KafkaSource,
    OnDemandFeatureView,
    String,
    UnixTimestamp,
    _expect,
)
from .mixture import Mixture
from .results import OnlineResponse, RetrievalJob
from .training import TrainingSet, shard_plan, to_tensors

# Lineage events an HTTP endpoint has not taken yet go before the interpreter exits
# (docs/lineage.md#transports).
atexit.register(_quiver.flush_lineage)

# Definitions or data that do not fit are also a ValueError, as Python code catches them.
# (The extension declares the class; a heap type's bases can be widened like this.)
if not issubclass(ValidationError, ValueError):
    ValidationError.__bases__ = (QuiverError, ValueError)

__all__ = [
    "Aggregation", "Array", "Bool", "Bytes", "DeltaSource", "DuplicateIngestWarning", "Entity", "FeatureService", "FeatureStore", "FeatureView",
    "Field", "Float32", "Float64", "Int32", "Int64", "KafkaSource", "Mixture", "NotFoundError", "OnDemandFeatureView", "OnlineResponse",
    "QuiverError", "RetrievalJob", "StoreUnavailableError", "String", "TrainingSet", "UnixTimestamp",
    "ValidationError", "shard_plan", "to_tensors",
]


class DuplicateIngestWarning(UserWarning):
    """``FeatureStore.ingest`` found the table already holding the same content and
    appended nothing (pass ``allow_duplicate=True`` to append it again)."""


_KINDS = {Entity: "entities", FeatureView: "feature_views", FeatureService: "feature_services",
          OnDemandFeatureView: "on_demand_views"}
_SINGULAR = {"entities": "entity", "feature_views": "feature_view", "feature_services": "feature_service",
             "on_demand_views": "on_demand_view"}


# ---------------------------------------------------------------------------------------
# The store


class FeatureStore:
    """A Quiver repository (a folder with ``quiver.yaml``), as Feast's FeatureStore.

    Raises
    ------
    NotFoundError
        ``repo_path`` is not a repository.
    """

    def __init__(self, repo_path: str = "."):
        self.repo_path = str(repo_path)
        _quiver.registry_json(self.repo_path)  # fails early outside a repository

    def __repr__(self) -> str:
        return f"FeatureStore({self.repo_path!r})"

    # --- definitions ---

    def _definitions(self, objects: Iterable[Entity | FeatureView | FeatureService],
                     objects_to_delete: Iterable[Entity | FeatureView | FeatureService] | None) -> tuple[str, list[str]]:
        """The registry's definitions with ``objects`` added or replaced and those to
        delete removed, as JSON, and the names removed."""
        current = json.loads(_quiver.registry_json(self.repo_path))["definitions"]
        merged = {k: {d["name"]: d for d in current.get(k, [])} for k in _KINDS.values()}
        for obj in objects:
            kind = _KINDS.get(type(obj))
            if kind is None:
                raise TypeError(f"apply takes Entity, FeatureView, OnDemandFeatureView and FeatureService objects, got {type(obj).__name__}")
            merged[kind][obj.name] = obj._json()
        remove = []
        for obj in objects_to_delete or []:
            kind = _KINDS.get(type(obj))
            if kind is None:
                raise TypeError(f"objects_to_delete takes Entity, FeatureView, OnDemandFeatureView and FeatureService objects, got {type(obj).__name__}")
            merged[kind].pop(obj.name, None)
            remove.append(f"{_SINGULAR[kind]}/{obj.name}")
        return json.dumps({k: list(v.values()) for k, v in merged.items()}), remove

    def apply(self, objects: Iterable[Entity | FeatureView | FeatureService], *,
              objects_to_delete: Iterable[Entity | FeatureView | FeatureService] | None = None, force: bool = False) -> int:
        """Records the definitions as the registry's next version, as defined from Python.

        The same validation and breaking-change checks as ``quiver apply``. Objects
        already registered and not given are kept; those in ``objects_to_delete`` are
        removed, whoever defined them.

        Parameters
        ----------
        objects
            Entities, feature views and feature services to add or replace.
        objects_to_delete
            Registered objects to remove.
        force
            Apply a breaking change to a view whose table holds data.

        Returns
        -------
        int
            The registry's version after the apply.

        Raises
        ------
        TypeError
            An object that is not a definition.
        ValidationError
            Definitions that do not validate, or a refused breaking change.
        """
        defs, remove = self._definitions(objects, objects_to_delete)
        return _quiver.apply(self.repo_path, defs, force, remove)

    def plan(self, objects: Iterable[Entity | FeatureView | FeatureService], *,
             objects_to_delete: Iterable[Entity | FeatureView | FeatureService] | None = None) -> str:
        """What ``apply`` with these arguments would change, without writing: the plan
        as ``quiver plan`` prints it (empty when nothing would change).

        Raises
        ------
        ValidationError
            Definitions that do not validate.
        """
        defs, remove = self._definitions(objects, objects_to_delete)
        text, counts = _quiver.plan(self.repo_path, defs, remove)
        return text if any(counts) else ""

    def _registered_one(self, cls: Any, kind: str, name: str) -> Any:
        return cls._from_json(json.loads(_quiver.definition(self.repo_path, kind, name)))

    def _registered(self, kind: str) -> list[dict]:
        return json.loads(_quiver.registry_json(self.repo_path))["definitions"].get(kind, [])

    def list_entities(self) -> list[Entity]:
        """The registered entities."""
        return [Entity._from_json(d) for d in self._registered("entities")]

    def list_feature_views(self) -> list[FeatureView]:
        """The registered feature views (``[v.name for v in ...]`` for their names)."""
        return [FeatureView._from_json(d) for d in self._registered("feature_views")]

    def list_feature_services(self) -> list[FeatureService]:
        """The registered feature services."""
        return [FeatureService._from_json(d) for d in self._registered("feature_services")]

    def list_on_demand_feature_views(self) -> list[OnDemandFeatureView]:
        """The registered on-demand views."""
        return [OnDemandFeatureView._from_json(d) for d in self._registered("on_demand_views")]

    def list_versions(self, name: str) -> list[dict]:
        """Every live version of the feature view or on-demand view ``name``, oldest
        first (docs/versions.md), as ``quiver versions NAME --json`` gives them: each
        with ``version``, ``latest``, ``created``, ``registry_version``, ``changes``
        (from the previous version), ``table``, ``rows_offline``, ``keys_online`` and
        ``read_by``.

        Raises
        ------
        NotFoundError
            No such view (the message names the known ones).
        """
        return json.loads(_quiver.versions(self.repo_path, name))

    def get_on_demand_feature_view(self, name: str) -> OnDemandFeatureView:
        """The registered on-demand view ``name``.

        Raises
        ------
        NotFoundError
            No such view (the message names the known ones).
        """
        return self._registered_one(OnDemandFeatureView, "on_demand_view", name)

    def get_entity(self, name: str) -> Entity:
        """The registered entity ``name``.

        Raises
        ------
        NotFoundError
            No such entity (the message names the known ones).
        """
        return self._registered_one(Entity, "entity", name)

    def get_feature_view(self, name: str) -> FeatureView:
        """The registered feature view ``name``.

        Raises
        ------
        NotFoundError
            No such view (the message names the known ones).
        """
        return self._registered_one(FeatureView, "feature_view", name)

    def get_feature_service(self, name: str) -> FeatureService:
        """The registered feature service ``name``.

        Raises
        ------
        NotFoundError
            No such service (the message names the known ones).
        """
        return self._registered_one(FeatureService, "feature_service", name)

    # --- offline ---

    def ingest(self, view: str, table: Any, *, allow_duplicate: bool = False) -> int | None:
        """Appends rows to the view's Delta table in one commit, checked as ``quiver
        ingest`` checks a file.

        Idempotent by content: a table whose content the view's table already holds (a
        retried call) is not appended again; a ``DuplicateIngestWarning`` says so and the
        version holding it is returned.

        Parameters
        ----------
        view
            The feature view.
        table
            pyarrow, pandas, polars: anything with ``__arrow_c_stream__``.
        allow_duplicate
            Append content the table already holds.

        Returns
        -------
        int or None
            The table version holding the rows; ``None`` when the view's source filter
            dropped every row (nothing appended, not an error).

        Raises
        ------
        TypeError
            ``table`` is not a table.
        NotFoundError
            No such view.
        ValidationError
            Rows that do not fit the view (the message names the row and column).
        """
        _expect(view, str, "view")
        _, version, duplicate = _quiver.ingest(self.repo_path, view, _table(table, "table"), allow_duplicate)
        if duplicate:
            warnings.warn(f"already ingested into {view} (table version {version} holds the same content): nothing appended; "
                          "allow_duplicate=True appends it again", DuplicateIngestWarning, stacklevel=2)
        return version

    def get_historical_features(self, entity_df: Any = None, features: Sequence[str] | FeatureService | None = None, *,
                                feature_service: str | FeatureService | None = None,
                                created_cutoff: bool = False, engine: str = "auto", cluster: str | None = None,
                                entities_at: datetime | str | None = None, rows_of: str | None = None,
                                between: tuple[datetime | str, datetime | str] | None = None,
                                sample: float | None = None, seed: int = 0) -> RetrievalJob:
        """The point-in-time join (docs/offline.md) of ``entity_df`` with the features.

        Parameters
        ----------
        entity_df
            The spine: join keys and ``event_timestamp``, plus anything else (kept).
            Or no spine (docs/export.md#without-a-spine), one of:
        entities_at
            Every entity with a row at or before this time (an aware ``datetime`` or RFC
            3339 text) in the joined views, which must share one entity.
        rows_of
            Every row of this view (labels, events), its columns kept; with ``between=(T1,
            T2)`` only event times from T1 up to T2, with ``sample=R`` (0 < R <= 1) each
            row kept with probability R, the same rows for the same ``seed``.
        features
            ``view:feature`` references, or a ``FeatureService`` (used as given).
        feature_service
            A registered service's name (or a ``FeatureService``), instead of ``features``.
        created_cutoff
            Only rows created by each spine time are candidates.
        engine
            "auto" (the GPU for large spines when one is usable), "cpu" or "gpu".
        cluster
            ``"df://HOST:PORT"`` of a ``quiver cluster scheduler`` to join on; same answer.

        Returns
        -------
        RetrievalJob
            The spine's rows in order, a column ``view__feature`` per feature.

        Raises
        ------
        ValidationError
            Neither or both of ``features`` and ``feature_service``, a spine without a
            needed key, an engine that cannot run.
        NotFoundError
            An unknown view, feature or service.
        """
        if isinstance(feature_service, FeatureService):
            if features is not None:
                raise ValidationError("give exactly one of features=[...] and feature_service=...")
            features, feature_service = feature_service, None
        if isinstance(features, FeatureService):
            features = features.features
        if feature_service is not None:
            _expect(feature_service, str, "feature_service")
        refs = _refs(features) if features is not None else None
        if (refs is None) == (feature_service is None):
            raise ValidationError("give exactly one of features=[...] and feature_service=...")
        made = _made_spine(entities_at, rows_of, between, sample, seed)
        if (entity_df is None) == (made is None):
            raise ValidationError("give exactly one of entity_df, entities_at= and rows_of=")
        spine = _table(entity_df, "entity_df") if entity_df is not None else None
        stream = _quiver.get_historical_features(self.repo_path, spine, refs if refs is not None else feature_service,
                                                 created_cutoff, engine, cluster, made)
        return RetrievalJob(pa.RecordBatchReader.from_stream(stream).read_all())

    def export(self, feature_service: str, spine: str | None = None, out: str | None = None, *,
               shard_rows: int | None = None, created_cutoff: bool = False,
               entities_at: datetime | str | None = None, rows_of: str | None = None,
               between: tuple[datetime | str, datetime | str] | None = None,
               sample: float | None = None, seed: int = 0) -> dict[str, Any]:
        """Writes ``feature_service``'s training set for the spine file (or the spine
        ``entities_at=`` / ``rows_of=`` make, as in ``get_historical_features``) into
        ``out`` as ``quiver export`` does (one join at pinned Delta versions, shards and
        ``manifest.json``; a rerun resumes). Read it with ``quiver.TrainingSet(out)``.

        Returns
        -------
        dict
            The manifest (``training_set_id``, ``rows``, ``shards``, ...).
        """
        _expect(feature_service, str, "feature_service")
        if out is None:
            raise ValidationError("export needs out=, the folder for the shards")
        made = _made_spine(entities_at, rows_of, between, sample, seed)
        if (spine is None) == (made is None):
            raise ValidationError("give exactly one of spine, entities_at= and rows_of=")
        return json.loads(_quiver.export(self.repo_path, feature_service, None if spine is None else str(spine), str(out),
                                         shard_rows, created_cutoff, made))

    # --- online ---

    def materialize(self, start_date: datetime, end_date: datetime, feature_views: Sequence[str] | None = None) -> list[tuple]:
        """Loads each online view's latest row per entity in [start_date, end_date] into
        the online store.

        Parameters
        ----------
        start_date, end_date
            Zoned datetimes.
        feature_views
            Only these views (names); default every online view.

        Returns
        -------
        list of tuple
            ``(view, entities, written, expired)`` per view.
        """
        views = _refs(feature_views, "feature_views") if feature_views is not None else []
        return _quiver.materialize(self.repo_path, _utc(start_date, "start_date"), _utc(end_date, "end_date"), views)

    def materialize_incremental(self, end_date: datetime) -> list[tuple]:
        """Loads what arrived since the last incremental run, up to ``end_date``;
        ``(view, entities, written, expired)`` per view."""
        return _quiver.materialize_incremental(self.repo_path, _utc(end_date, "end_date"))

    def get_online_features(self, features: Sequence[str] | FeatureService, entity_rows: Sequence[Mapping[str, Any]], *,
                            full_feature_names: bool = False) -> OnlineResponse:
        """The latest values for each entity row.

        Parameters
        ----------
        features
            ``view:feature`` references, or a ``FeatureService`` (used as given; see
            ``get_feature_service`` for a registered one).
        entity_rows
            ``[{"rider_id": 1}, ...]``: each row the same join keys (ints, numpy ints or
            strings), and the request fields the on-demand features asked for read
            (``{"rider_id": 1, "amount": 12.5}``; ``None`` is a null). Any other name is
            a ``ValidationError`` naming the names allowed.
        full_feature_names
            Name features ``view__feature`` instead of ``feature``.

        Raises
        ------
        TypeError
            ``features`` or ``entity_rows`` of the wrong type.
        ValidationError, NotFoundError
            The refusals every front end shares (docs/online.md, "What a lookup refuses").
        """
        if isinstance(features, FeatureService):
            features = features.features
        refs = _refs(features)
        if isinstance(entity_rows, Mapping) or isinstance(entity_rows, str):
            raise TypeError(f"entity_rows must be a list of mappings ([{{\"key\": value}}, ...]), got {type(entity_rows).__name__}")
        rows = list(entity_rows)
        if not rows:
            raise ValidationError("entity_rows is empty")
        for i, row in enumerate(rows):
            _expect(row, Mapping, f"entity_rows[{i}]")
        names = list(rows[0].keys())
        for row in rows:
            if list(row.keys()) != names:
                raise ValidationError(f"every entity row needs the same keys {names}, got {list(row.keys())}")
        columns = [[name, [_entity_value(row[name], f"entity_rows[{i}][{name!r}]") for i, row in enumerate(rows)]] for name in names]
        out = _quiver.get_online_features(self.repo_path, json.dumps(columns), refs, None, full_feature_names)
        return OnlineResponse(*out)

    def push(self, view: str, table: Any, *, to: str | None = None) -> dict[str, Any]:
        """Writes rows through the streaming write path: offline first, then the guarded
        online write.

        Parameters
        ----------
        view
            The feature view.
        table
            The rows (anything with ``__arrow_c_stream__``).
        to
            "online", "offline" or "online_and_offline"; default both for an online
            view, offline for a view with ``online=False`` (which takes no online writes).

        Returns
        -------
        dict
            ``rows`` (written), ``online_written`` and ``offline_version`` (``None`` for a
            store not written), ``dropped`` (rows the view's source filter dropped) and
            ``uncomputed`` (values its write-time expressions could not compute, stored
            null; docs/transformations.md#write-time).
        """
        _expect(view, str, "view")
        rows, written, version, dropped, uncomputed = _quiver.push(self.repo_path, view, _table(table, "table"), to)
        return {"rows": rows, "online_written": written, "offline_version": version, "dropped": dropped, "uncomputed": uncomputed}

    # --- consistency ---

    def verify(self, sample: int = 1000) -> list[dict[str, Any]]:
        """``quiver verify --sample``: the online answer of ``sample`` entities per online
        view against the offline answer at the same time, per feature.

        Returns
        -------
        list of dict
            ``feature``, ``compared``, ``matches``, ``mismatches``, ``missing_online``
            and ``examples`` (a few disagreements, described) per feature.
        """
        _expect(sample, int, "sample")
        keys = ("feature", "compared", "matches", "mismatches", "missing_online", "examples")
        return [dict(zip(keys, r)) for r in _quiver.verify_sample(self.repo_path, sample)]

    # --- monitoring ---

    def monitor(self, reference: str, current: str, *, features: Sequence[str] | FeatureService | None = None,
                feature_service: str | None = None) -> dict[str, Any]:
        """``quiver monitor``: is ``current`` drifting from ``reference``, feature by
        feature (docs/monitoring.md)? The report is also stored under ``.quiver/monitor/``.

        Parameters
        ----------
        reference
            ``"training:DIR"`` (an exported training set's profile) or ``"offline:T1..T2"``
            (views' rows by event time).
        current
            ``"serving:T1..T2"`` (the serving log by request time) or ``"offline:T1..T2"``.
            Times: RFC 3339, a date, ``now``, or a duration before now (``2h``).
        features, feature_service
            Exactly one: ``view:feature`` references (or a ``FeatureService``), or a
            registered service's name (whose thresholds then apply).

        Returns
        -------
        dict
            ``reference``, ``current``, ``created_at`` and ``features``: per feature its
            ``psi``, ``ks``, ``null_rate`` (``reference``/``current``), ``not_found_rate``,
            ``limits``, ``bins`` or ``categories`` and ``breaches`` (empty when within
            every threshold).
        """
        _expect(reference, str, "reference")
        _expect(current, str, "current")
        if isinstance(features, FeatureService):
            features = features.features
        if feature_service is not None:
            _expect(feature_service, str, "feature_service")
        refs = _refs(features) if features is not None else []
        if (features is None) == (feature_service is None):
            raise ValidationError("give exactly one of features=[...] and feature_service=...")
        return json.loads(_quiver.monitor(self.repo_path, reference, current, refs, feature_service))
