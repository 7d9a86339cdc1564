"""What the store's methods take, checked and turned into what the extension takes:
tables through the Arrow PyCapsule interface, aware times, made spines, entity values
and feature references. Errors name the argument."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from . import _quiver
from ._quiver import ValidationError
from .definitions import _expect


def _table(table: Any, what: str) -> Any:
    """A table for the extension: anything with the Arrow PyCapsule stream interface
    (``__arrow_c_stream__``: pyarrow, pandas 2.2+, polars, DuckDB results, ...)."""
    if isinstance(table, pa.RecordBatch):
        return pa.Table.from_batches([table])
    if not hasattr(table, "__arrow_c_stream__"):
        raise TypeError(f"{what} must be a table with the Arrow PyCapsule interface (pyarrow, pandas, polars), "
                        f"got {type(table).__name__}")
    if isinstance(table, pa.Table):
        return table
    out = pa.table(table)
    # pandas hands over a non-default index as `__index_level_N__` columns: not the data.
    index = [c for c in out.column_names if c.startswith("__index_level_")]
    return out.drop_columns(index) if index else out


def _utc(t: datetime, what: str) -> datetime:
    _expect(t, datetime, what)
    if t.tzinfo is None:
        raise ValidationError(f"{what} {t} has no time zone; quiver never guesses one (use datetime(..., tzinfo=timezone.utc))")
    return t.astimezone(timezone.utc)


def _instant(value: datetime | str, where: str) -> str:
    """An aware datetime, or text as the CLI takes it (RFC 3339, a date, ``now``, a
    duration before now such as ``7d``), as RFC 3339 text; errors name ``where``."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValidationError(f"{where}: a datetime needs a time zone, got {value!r}")
        return value.isoformat()
    if isinstance(value, str):
        return _quiver.parse_time(where, value)
    raise ValidationError(f"{where}: expected an aware datetime or a time as text, got {type(value).__name__}")


def _made_spine(entities_at: datetime | str | None, rows_of: str | None, between: Any, sample: float | None,
                seed: int) -> str | None:
    """The spine ``entities_at=`` or ``rows_of=`` ask for, as the manifest records it
    (JSON), or None when neither is given."""
    if entities_at is not None and rows_of is not None:
        raise ValidationError("give one of entities_at= and rows_of=, not both")
    if rows_of is None and (between is not None or sample is not None):
        raise ValidationError("between= and sample= go with rows_of=")
    if entities_at is not None:
        return json.dumps({"kind": "entities_at", "at": _instant(entities_at, "entities_at")})
    if rows_of is None:
        return None
    _expect(rows_of, str, "rows_of")
    made: dict[str, Any] = {"kind": "rows_of", "view": rows_of, "seed": seed}
    if between is not None:
        if not isinstance(between, (tuple, list)) or len(between) != 2:
            raise ValidationError("between= takes two times: (start, end)")
        made["between"] = [_instant(between[0], "between"), _instant(between[1], "between")]
    if sample is not None:
        if isinstance(sample, bool) or not isinstance(sample, (int, float)):
            raise ValidationError(f"sample= takes a rate above 0 and at most 1, got {sample!r}")
        made["sample"] = float(sample)
    return json.dumps(made)


def _entity_value(value: Any, where: str) -> Any:
    """A value of an entity row as JSON takes it: a join key (an int or a string) or a
    request field's value (numbers, bools, strings, None, lists of them, aware
    datetimes); numpy scalars and arrays as their Python values. Quiver checks each
    against the type the definitions give it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError(f"{where}: a datetime needs a time zone, got {value!r}")
        return value.isoformat()
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if tolist is not None:
        return _entity_value(tolist(), where)
    if isinstance(value, (list, tuple)):
        return [_entity_value(v, where) for v in value]
    raise TypeError(f"{where}: an entity value is a join key or a request field's value, got {type(value).__name__} {value!r}")


def _refs(features: Any, what: str = "features") -> list[str]:
    if isinstance(features, str):
        raise TypeError(f"{what} must be a list of \"view:feature\" references, got the string {features!r}")
    refs = list(features)
    for f in refs:
        _expect(f, str, f"{what}: a reference")
    return refs
