"""What retrieval answers: a historical job's table (and its tensors) and an online
response in Feast's shape."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ._quiver import ValidationError
from .training import to_tensors


class RetrievalJob:
    """The result of ``get_historical_features``: one table, in spine order."""

    def __init__(self, table: pa.Table):
        self._table = table

    def __repr__(self) -> str:
        return f"RetrievalJob({self._table.num_rows} rows: {', '.join(self._table.column_names)})"

    def to_arrow(self) -> pa.Table:
        """The table, as pyarrow."""
        return self._table

    def to_df(self) -> Any:
        """The table as a pandas DataFrame (Feast's name; ``to_pandas`` is the same)."""
        return self._table.to_pandas()

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame."""
        return self._table.to_pandas()

    def to_polars(self) -> Any:
        """The table as a polars DataFrame."""
        import polars as pl

        return pl.from_arrow(self._table)

    def to_torch(self, device: str = "cpu", batch_size: int | None = None,
                 columns: Sequence[str] | None = None) -> Any:
        """The result as PyTorch tensors on ``device``, with no files in between.

        Without ``batch_size``: one dict of the columns a model can take (see
        ``quiver.training.to_tensors``: numbers, booleans, fixed-length numeric lists).
        With ``batch_size``: an iterator of dicts of ``batch_size`` rows in result order,
        columns converted as ``TrainingSet.to_torch`` converts them (``columns`` asked
        for by name returned or refused; strings as codes into the result's sorted
        distinct values, timestamps as int64 microseconds). The join's result is held
        in memory; the join runs on the host, so ``cuda`` copies each batch once.

        Raises
        ------
        ValidationError
            Without PyTorch, for ``cuda`` without a usable GPU, for a bad batch size or
            a column that has no tensor form.
        """
        try:
            import torch
        except ImportError as e:
            raise ValidationError(f"to_torch(device={device!r}) needs PyTorch (pip install torch)") from e
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ValidationError(f"to_torch(device={device!r}): PyTorch sees no CUDA device on this machine")
        if batch_size is None:
            if columns is not None:
                raise ValidationError("to_torch: columns= goes with batch_size=")
            return to_tensors(self._table, torch, device)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValidationError(f"batch_size must be a positive integer, got {batch_size!r}")
        from .loader import Columns, is_text
        table = self._table
        vocabularies = {f.name: sorted(pc.unique(table.column(f.name)).drop_null().to_pylist())
                        for f in table.schema if is_text(f.type)}
        nulls = {name: table.column(name).null_count > 0 for name in table.column_names}
        cols = Columns(table.schema, vocabularies, nulls, columns)
        arrays = cols.arrays(table)

        def batches():
            for start in range(0, table.num_rows, batch_size):
                yield {n: torch.from_numpy(a[start:start + batch_size]).to(device) for n, a in arrays.items()}

        return batches()


# NaN and the infinities as the server answers them: the strings of protobuf's JSON
# mapping, as Feast's server writes them (docs/online.md).
_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _float(value: Any) -> Any:
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value


def _read_floats(values: list[Any], dtype: Any) -> list[Any]:
    """``values`` of a column of ``dtype`` with ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"`` read as floats where the column holds floats or lists of floats;
    other columns as they are (a string feature's ``"NaN"`` stays a string)."""
    if dtype is None:
        return values
    if pa.types.is_floating(dtype):
        return [_float(v) for v in values]
    lists = pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype)
    if lists and pa.types.is_floating(dtype.value_type):
        return [[_float(x) for x in v] if isinstance(v, list) else v for v in values]
    return values


class OnlineResponse:
    """Online features in Feast's shape: ``to_dict()`` maps each column (join keys
    first) to one value per entity row; ``statuses`` holds Feast's status names."""

    def __init__(self, columns: list[tuple], table: Any):
        self._names = [c[0] for c in columns]
        self._table = pa.table(table)
        # Each column's values as the server answers them (JSON), a float's NaN and
        # infinities read back from their strings by the column's type.
        types = self._table.schema.types
        self._values = {c[0]: _read_floats(json.loads(c[1]), types[i] if i < len(types) else None)
                        for i, c in enumerate(columns)}
        self.statuses = {c[0]: list(c[2]) for c in columns}

    def __repr__(self) -> str:
        return f"OnlineResponse({self.to_dict()!r})"

    def to_dict(self) -> dict[str, list[Any]]:
        """Each column's values, one per entity row."""
        return {n: list(self._values[n]) for n in self._names}

    def to_df(self) -> Any:
        """The answer as a pandas DataFrame (Feast's name)."""
        return self._table.to_pandas()

    def to_arrow(self) -> pa.Table:
        """The answer as a table, each column typed by its definition (a feature whose
        every value is missing keeps its type)."""
        return self._table
