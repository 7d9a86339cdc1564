"""Definitions: types, fields, entities, sources, aggregations, feature views, services
and on-demand views. Each becomes, through ``_json``, the serde form of the Rust
structure ``features.yaml`` gives, so both go through one validation and one registry;
``_from_json`` reads a registry's definitions back."""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ._quiver import ValidationError


def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> None:
    """TypeError unless ``value`` is a ``kind``, naming the argument and what it got."""
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(f"{what} must be {names}, got {type(value).__name__} {value!r}")


_THRESHOLDS = ("psi", "ks", "null_rate", "not_found_rate")


def _thresholds(value: Any, what: str) -> dict[str, float] | None:
    """Monitoring thresholds as the registry holds them, checked for their keys and types
    (their ranges are the one validation's, in Rust)."""
    if value is None:
        return None
    _expect(value, Mapping, what)
    out = {}
    for k, v in value.items():
        if k not in _THRESHOLDS:
            raise ValidationError(f"{what}: unknown threshold `{k}` (expected {', '.join(_THRESHOLDS)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{what}: {k} must be a number, got {type(v).__name__} {v!r}")
        out[k] = float(v)
    # No thresholds is none at all: `{}` reads back from the registry as None.
    return out or None


def _monitoring_json(own: dict[str, float] | None, named: Iterable[tuple[str, dict[str, float] | None]]) -> dict | None:
    """A view's ``monitoring`` as the registry holds it: its own thresholds, then its
    features' by name."""
    out: dict[str, Any] = dict(own or {})
    features = {n: t for n, t in named if t is not None}
    if features:
        out["features"] = features
    return out or None


def _field(d: dict, monitoring: dict | None = None) -> Field:
    """A field from its registry form, with its thresholds from the view's."""
    return Field(d["name"], _type_of(d["dtype"]), d.get("expr"), (monitoring or {}).get("features", {}).get(d["name"]))


# ---------------------------------------------------------------------------------------
# Types


@dataclass(frozen=True)
class _Type:
    dtype: str

    def __repr__(self) -> str:
        if self.dtype.startswith("list<"):
            return f"qv.Array({_Type(self.dtype[5:-1])!r})"
        return f"qv.{_TYPE_NAMES.get(self.dtype, self.dtype)}"


Int32 = _Type("int32")
Int64 = _Type("int64")
Float32 = _Type("float32")
Float64 = _Type("float64")
Bool = _Type("bool")
String = _Type("string")
Bytes = _Type("bytes")
UnixTimestamp = _Type("timestamp")
_TYPE_NAMES = {"int32": "Int32", "int64": "Int64", "float32": "Float32", "float64": "Float64", "bool": "Bool",
               "string": "String", "bytes": "Bytes", "timestamp": "UnixTimestamp"}


def Array(element: _Type) -> _Type:  # noqa: N802 (Feast's spelling)
    """A list type: ``Array(Float32)`` is an embedding (``list<float32>``).

    Raises
    ------
    TypeError
        ``element`` is not a quiver type.
    """
    _expect(element, _Type, "Array's element")
    return _Type(f"list<{element.dtype}>")


def _type_of(dtype: str) -> _Type:
    return _Type(dtype)


# ---------------------------------------------------------------------------------------
# Definitions


class _Definition:
    """Equality and ``repr`` by the definition's attributes, as the registry records them."""

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if v not in (None, "", {}, []))
        return f"{type(self).__name__}({fields})"


@dataclass
class Field:
    """A named, typed column: a feature, a join key or a request field.

    Parameters
    ----------
    name
        The column's name.
    dtype
        A quiver type: ``qv.Int64``, ``qv.Float32``, ``qv.Array(qv.Float32)``, ...
    expr
        The SQL expression that computes it: of an on-demand view's feature, at request
        time; of a feature view's feature, at write time from the raw row
        (docs/transformations.md).
    monitoring
        Of a feature: its drift and skew thresholds, ``{"psi": 0.2, "ks": 0.1,
        "null_rate": 0.05, "not_found_rate": 0.1}``, any of them (docs/monitoring.md).
    """

    name: str
    dtype: _Type
    expr: str | None = None
    monitoring: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        _expect(self.name, str, "Field's name")
        if not isinstance(self.dtype, _Type):
            raise TypeError(f"field `{self.name}`: dtype must be a quiver type such as qv.Float64, got {self.dtype!r}")
        if self.expr is not None:
            _expect(self.expr, str, f"field `{self.name}`: expr")
        self.monitoring = _thresholds(self.monitoring, f"field `{self.name}`: monitoring")

    def __repr__(self) -> str:
        expr = f", expr={self.expr!r}" if self.expr is not None else ""
        monitoring = f", monitoring={self.monitoring!r}" if self.monitoring is not None else ""
        return f"Field(name={self.name!r}, dtype={self.dtype!r}{expr}{monitoring})"

    def _json(self) -> dict:
        out = {"name": self.name, "dtype": self.dtype.dtype}
        if self.expr is not None:
            out["expr"] = self.expr
        return out


class Entity(_Definition):
    """An entity with one or more join keys, typed ``int64`` or ``string``.

    ``Entity(name="rider", join_keys=[Field("rider_id", Int64)])``, or Feast's style
    ``Entity(name="rider", join_keys=["rider_id"], value_type=Int64)``.

    Raises
    ------
    TypeError
        A join key that is neither a ``Field`` nor a name, or a name without ``value_type``.
    """

    def __init__(self, *, name: str, join_keys: Sequence[Field | str], value_type: _Type | None = None,
                 description: str = "", tags: Mapping[str, str] | None = None):
        _expect(name, str, "Entity's name")
        keys: list[Field] = []
        for k in join_keys:
            if isinstance(k, Field):
                if k.monitoring is not None:
                    raise ValidationError(f"entity `{name}`, join key `{k.name}`: has monitoring (monitor features, not keys)")
                keys.append(k)
            elif isinstance(k, str):
                if value_type is None:
                    raise TypeError(f"entity `{name}`: join key `{k}` given by name needs value_type=qv.Int64 or qv.String")
                keys.append(Field(k, value_type))
            else:
                raise TypeError(f"entity `{name}`: join keys are qv.Field or names, got {k!r}")
        self.name = name
        self.join_keys = keys
        self.description = description
        self.tags = dict(tags or {})

    def _json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "join_keys": [k._json() for k in self.join_keys]}
        if self.description:
            out["description"] = self.description
        if self.tags:
            out["tags"] = self.tags
        return out

    @classmethod
    def _from_json(cls, d: dict) -> Entity:
        return cls(name=d["name"], join_keys=[Field(k["name"], _type_of(k["dtype"])) for k in d["join_keys"]],
                   description=d.get("description", ""), tags=d.get("tags"))


@dataclass
class KafkaSource:
    """A Kafka topic whose JSON messages land in the view's Delta table."""

    topic: str
    format: str = "json"


@dataclass
class DeltaSource:
    """A view's Delta table (default ``<offline root>/<view>``) and its time columns.

    ``filter`` (a SQL boolean expression) and ``raw`` (``Field``s: input columns that are
    not features) are its write-time expressions' (docs/transformations.md#write-time):
    every writer drops the rows for which ``filter`` is not true, and computes the
    view's features given ``Field(name, dtype, expr="...")`` from the raw row.
    """

    timestamp_field: str = "event_timestamp"
    created_timestamp_field: str | None = None
    path: str | None = None
    stream: KafkaSource | None = None
    filter: str | None = None
    raw: Sequence[Field] = ()

    def __post_init__(self) -> None:
        if self.filter is not None:
            _expect(self.filter, str, "source filter")
        self.raw = list(self.raw)
        for f in self.raw:
            _expect(f, Field, "a raw column of a source")
            if f.monitoring is not None:
                raise ValidationError(f"raw column `{f.name}`: has monitoring (a raw column is not stored; monitor the features computed from it)")

    def _json(self) -> dict:
        out: dict[str, Any] = {"timestamp_field": self.timestamp_field}
        if self.created_timestamp_field:
            out["created_timestamp_field"] = self.created_timestamp_field
        if self.path:
            out["path"] = self.path
        if self.stream:
            out["stream"] = {"topic": self.stream.topic, "format": self.stream.format}
        if self.filter is not None:
            out["filter"] = self.filter
        if self.raw:
            out["raw"] = [f._json() for f in self.raw]
        return out

    @classmethod
    def _from_json(cls, d: dict) -> DeltaSource:
        stream = d.get("stream")
        return cls(timestamp_field=d.get("timestamp_field", "event_timestamp"),
                   created_timestamp_field=d.get("created_timestamp_field"), path=d.get("path"),
                   stream=KafkaSource(stream["topic"], stream.get("format", "json")) if stream else None,
                   filter=d.get("filter"), raw=[Field(f["name"], _type_of(f["dtype"]), f.get("expr")) for f in d.get("raw", [])])


def _duration(ttl: timedelta | None, what: str = "ttl") -> str:
    """A timedelta as the duration text definitions use (``90m``, ``7d``); ``None`` is 0.
    Whole seconds only; the rules of durations (negative, too long) are the validation's."""
    if ttl is None:
        return "0"
    _expect(ttl, timedelta, what)
    if ttl.microseconds:
        raise ValidationError(f"{what} {ttl} has a fraction of a second; quiver durations are whole seconds")
    seconds = int(ttl.total_seconds())
    if seconds < 0:
        return f"-{-seconds}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _timedelta(text: str | None) -> timedelta | None:
    """The duration text of a definition as a timedelta; ``0`` (no ttl) is ``None``."""
    if text is None or text in ("0", ""):
        return None
    if text.isdigit():
        return timedelta(seconds=int(text))
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return timedelta(seconds=sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhdw])", text)))


class Aggregation(_Definition):
    """A windowed aggregation of one event column (docs/aggregations.md).

    Parameters
    ----------
    name
        The served feature's name.
    function
        count, sum, avg, stddev, min, max, last or last_k (with ``k``).
    column
        The event column aggregated.
    window, time_window
        The window, a timedelta (``time_window`` is Feast's name; give one).
    hop
        The hop the window moves by (default: from the window).
    k
        How many values ``last_k`` keeps.
    monitoring
        Its drift and skew thresholds (docs/monitoring.md).

    A view with aggregations is an event log, and serves them.
    """

    def __init__(self, *, name: str, function: str, column: str, window: timedelta | None = None,
                 hop: timedelta | None = None, k: int | None = None, time_window: timedelta | None = None,
                 description: str = "", monitoring: Mapping[str, float] | None = None):
        _expect(name, str, "Aggregation's name")
        if window is not None and time_window is not None:
            raise ValidationError(f"aggregation `{name}`: give window or time_window, not both")
        window = window if window is not None else time_window
        if window is None:
            raise ValidationError(f"aggregation `{name}`: no window (window=timedelta(hours=1), say)")
        _expect(window, timedelta, f"aggregation `{name}`: window")
        if hop is not None:
            _expect(hop, timedelta, f"aggregation `{name}`: hop")
        if k is not None:
            _expect(k, int, f"aggregation `{name}`: k")
        self.name = name
        self.function = function
        self.column = column
        self.window = window
        self.hop = hop
        self.k = k
        self.description = description
        self.monitoring = _thresholds(monitoring, f"aggregation `{name}`: monitoring")

    def _json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "function": self.function, "column": self.column,
                               "window": _duration(self.window, f"aggregation `{self.name}`: window")}
        if self.hop is not None:
            out["hop"] = _duration(self.hop, f"aggregation `{self.name}`: hop")
        if self.k is not None:
            out["k"] = self.k
        if self.description:
            out["description"] = self.description
        return out

    @classmethod
    def _from_json(cls, d: dict, monitoring: dict | None = None) -> Aggregation:
        return cls(name=d["name"], function=d["function"], column=d["column"], window=_timedelta(d["window"]),
                   hop=_timedelta(d.get("hop")), k=d.get("k"), description=d.get("description", ""),
                   monitoring=(monitoring or {}).get("features", {}).get(d["name"]))


class FeatureView(_Definition):
    """Features of some entities, with a ttl, a Delta source and an optional stream.

    Parameters
    ----------
    name
        The view's name (``view:feature`` references start with it).
    entities
        Its entities, as ``Entity`` objects or names.
    schema
        Its features (``Field``s); for an event log, its event columns.
    ttl
        How long a row stays a candidate; ``None`` for no limit.
    online
        Whether it is served online (``False``: offline only, no online writes).
    source
        Its Delta table and time columns.
    aggregations
        Windowed aggregations: the view is then an event log serving them.
    monitoring
        The drift and skew thresholds of its features (a feature's own, given on its
        ``Field`` or ``Aggregation``, come first; docs/monitoring.md).
    """

    def __init__(self, *, name: str, entities: Sequence[Entity | str], schema: Sequence[Field],
                 ttl: timedelta | None = None, online: bool = True, source: DeltaSource | None = None,
                 tags: Mapping[str, str] | None = None, description: str = "",
                 aggregations: Sequence[Aggregation] = (), monitoring: Mapping[str, float] | None = None):
        _expect(name, str, "FeatureView's name")
        entities, schema, aggregations = list(entities), list(schema), list(aggregations)
        for e in entities:
            _expect(e, (Entity, str), f"feature view `{name}`: an entity")
        for f in schema:
            _expect(f, Field, f"feature view `{name}`: a schema entry")
        for a in aggregations:
            _expect(a, Aggregation, f"feature view `{name}`: an aggregation")
        if ttl is not None:
            _expect(ttl, timedelta, f"feature view `{name}`: ttl")
        _expect(online, bool, f"feature view `{name}`: online")
        if source is not None:
            _expect(source, DeltaSource, f"feature view `{name}`: source")
        self.name = name
        self.entities = [e.name if isinstance(e, Entity) else e for e in entities]
        self.schema = list(schema)
        self.ttl = ttl
        self.online = online
        self.source = source or DeltaSource()
        self.tags = dict(tags or {})
        self.description = description
        self.aggregations = list(aggregations)
        self.monitoring = _thresholds(monitoring, f"feature view `{name}`: monitoring")

    def _json(self) -> dict:
        out: dict[str, Any] = {
            "name": self.name,
            "entities": list(self.entities),
            "features": [f._json() for f in self.schema],
            "ttl": _duration(self.ttl),
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
        named = [(f.name, f.monitoring) for f in self.schema] + [(a.name, a.monitoring) for a in self.aggregations]
        monitoring = _monitoring_json(self.monitoring, named)
        if monitoring:
            out["monitoring"] = monitoring
        return out

    @classmethod
    def _from_json(cls, d: dict) -> FeatureView:
        m = d.get("monitoring")
        return cls(name=d["name"], entities=d["entities"], schema=[_field(f, m) for f in d["features"]],
                   ttl=_timedelta(d.get("ttl")), online=d.get("online", True), source=DeltaSource._from_json(d.get("source", {})),
                   tags=d.get("tags"), description=d.get("description", ""),
                   aggregations=[Aggregation._from_json(a, m) for a in d.get("aggregations", [])],
                   monitoring={k: v for k, v in (m or {}).items() if k != "features"} or None)


class FeatureService(_Definition):
    """A named list of feature references (``view:feature``) for one model.

    Passed to ``get_online_features`` or ``get_historical_features``, it is used as
    given: its own ``features``, not those of a registered service of the same name
    (``FeatureStore.get_feature_service(name)`` gives the registered one).

    A reference reads the view's latest version unless it names one
    (``"driver_hourly@1:conv_rate"``) or ``versions`` pins the view
    (``versions={"driver_hourly": 1}`` makes every ``driver_hourly:...`` of the service
    read version 1); moving a service to a new version is changing that number
    (docs/versions.md). A registered service that a breaking change pinned keeps its
    pins when applied again with unpinned references.
    """

    def __init__(self, *, name: str, features: Sequence[str], description: str = "",
                 tags: Mapping[str, str] | None = None, monitoring: Mapping[str, float] | None = None,
                 versions: Mapping[str, int] | None = None):
        _expect(name, str, "FeatureService's name")
        _expect(features, (list, tuple), f"feature service `{name}`: features")
        for f in features:
            _expect(f, str, f"feature service `{name}`: a feature reference")
        self.name = name
        self.versions = _versions(versions, f"feature service `{name}`: versions")
        self.features = [_pin(f, self.versions, name) for f in features]
        self.description = description
        self.tags = dict(tags or {})
        self.monitoring = _thresholds(monitoring, f"feature service `{name}`: monitoring")

    def _json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "features": self.features}
        if self.description:
            out["description"] = self.description
        if self.tags:
            out["tags"] = self.tags
        if self.monitoring:
            out["monitoring"] = self.monitoring
        return out

    @classmethod
    def _from_json(cls, d: dict) -> FeatureService:
        return cls(name=d["name"], features=d["features"], description=d.get("description", ""), tags=d.get("tags"),
                   monitoring=d.get("monitoring"))


def _versions(value: Any, what: str) -> dict[str, int]:
    """A service's ``versions``: view names to versions (whole numbers from 1)."""
    if value is None:
        return {}
    _expect(value, Mapping, what)
    for view, version in value.items():
        _expect(view, str, f"{what}: a view's name")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"{what}: version of `{view}` must be a whole number from 1, got {version!r}")
    return dict(value)


def _pin(reference: str, versions: Mapping[str, int], service: str) -> str:
    """``reference`` with the version ``versions`` pins its view to; one that names
    another version is refused naming both."""
    view, sep, feature = reference.partition(":")
    name, at, written = view.partition("@")
    if not sep or name not in versions:
        return reference
    pinned = versions[name]
    if at and written != str(pinned):
        raise ValueError(f"feature service `{service}`: `{reference}` names version {written} of `{name}`, "
                         f"and versions pins it to {pinned}")
    return f"{name}@{pinned}:{feature}"


class OnDemandFeatureView(_Definition):
    """Features computed at request time by SQL expressions over other views' features
    and values the request carries (docs/transformations.md), by one engine online and
    offline.

    Parameters
    ----------
    name
        The view's name; its features are referenced as ``name:feature``.
    inputs
        The views its expressions read (objects or names): feature views, or on-demand
        views defined before it.
    request
        The values each request carries, as ``Field(name, dtype)``.
    features
        ``Field(name, dtype, expr="...")``, each with its expression.
    """

    def __init__(self, *, name: str, inputs: Sequence[FeatureView | OnDemandFeatureView | str],
                 features: Sequence[Field], request: Sequence[Field] = (), description: str = "",
                 tags: Mapping[str, str] | None = None, monitoring: Mapping[str, float] | None = None):
        _expect(name, str, "OnDemandFeatureView's name")
        _expect(inputs, (list, tuple), f"on-demand view `{name}`: inputs")
        _expect(features, (list, tuple), f"on-demand view `{name}`: features")
        _expect(request, (list, tuple), f"on-demand view `{name}`: request")
        names = []
        for i in inputs:
            _expect(i, (FeatureView, OnDemandFeatureView, str), f"on-demand view `{name}`: an input")
            names.append(i if isinstance(i, str) else i.name)
        for f in list(features) + list(request):
            _expect(f, Field, f"on-demand view `{name}`: a field")
        for f in features:
            if f.expr is None:
                raise ValidationError(f"on-demand view `{name}`, feature `{f.name}`: no expr (Field(name, dtype, expr=\"...\"))")
        for f in request:
            if f.expr is not None:
                raise ValidationError(f"on-demand view `{name}`, request field `{f.name}`: a request field has no expr")
            if f.monitoring is not None:
                raise ValidationError(f"on-demand view `{name}`, request field `{f.name}`: has monitoring (monitor the features computed from it)")
        self.name = name
        self.inputs = names
        self.request = list(request)
        self.features = list(features)
        self.description = description
        self.tags = dict(tags or {})
        self.monitoring = _thresholds(monitoring, f"on-demand view `{name}`: monitoring")

    def _json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "inputs": self.inputs, "features": [f._json() for f in self.features]}
        if self.request:
            out["request"] = [f._json() for f in self.request]
        if self.description:
            out["description"] = self.description
        if self.tags:
            out["tags"] = self.tags
        monitoring = _monitoring_json(self.monitoring, [(f.name, f.monitoring) for f in self.features])
        if monitoring:
            out["monitoring"] = monitoring
        return out

    @classmethod
    def _from_json(cls, d: dict) -> OnDemandFeatureView:
        m = d.get("monitoring")
        return cls(name=d["name"], inputs=d.get("inputs", []), features=[_field(f, m) for f in d["features"]],
                   request=[_field(f) for f in d.get("request", [])], description=d.get("description", ""), tags=d.get("tags"),
                   monitoring={k: v for k, v in (m or {}).items() if k != "features"} or None)
