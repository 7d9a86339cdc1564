"""Type stubs of the Rust extension `quiver._quiver` (see src/lib.rs)."""
from datetime import datetime
from typing import Any, List, Optional, Tuple, final

import pyarrow as pa

__all__ = [
    "ArrowStream",
    "NotFoundError",
    "QuiverError",
    "StoreUnavailableError",
    "ValidationError",
    "_sleep",
    "apply",
    "definition",
    "export",
    "flush_lineage",
    "get_historical_features",
    "get_online_features",
    "ingest",
    "materialize",
    "materialize_incremental",
    "monitor",
    "parse_time",
    "place_rows",
    "plan",
    "push",
    "registry_json",
    "verify_sample",
    "versions",
]

class QuiverError(Exception): ...
class ValidationError(QuiverError, ValueError): ...
class NotFoundError(QuiverError): ...
class StoreUnavailableError(QuiverError): ...

@final
class ArrowStream:
    """A result table, read once through the Arrow PyCapsule stream interface."""
    def __arrow_c_stream__(self, requested_schema: Optional[Any] = None) -> Any: ...

def apply(repo: str, definitions_json: str, force: bool = False, remove: List[str] = ...) -> int: ...
def registry_json(repo: str) -> str: ...
def versions(repo: str, view: str) -> str: ...
def ingest(repo: str, view: str, table: pa.Table, allow_duplicate: bool = False) -> Tuple[int, Optional[int], bool]: ...
def get_historical_features(
    repo: str,
    entity_df: Optional[pa.Table],
    asked: List[str] | str,
    created_cutoff: bool = False,
    engine: str = "auto",
    cluster: Optional[str] = None,
    made: Optional[str] = None,
) -> ArrowStream: ...
def materialize(repo: str, start: datetime, end: datetime, views: List[str] = ...) -> List[Tuple[str, int, int, int]]: ...
def materialize_incremental(repo: str, end: datetime) -> List[Tuple[str, int, int, int]]: ...
def get_online_features(
    repo: str,
    entities_json: str,
    features: Optional[List[str]] = None,
    feature_service: Optional[str] = None,
    full_feature_names: bool = False,
) -> Tuple[List[Tuple[str, str, List[str]]], ArrowStream]: ...
def push(repo: str, view: str, table: pa.Table, to: Optional[str] = None) -> Tuple[int, Optional[int], Optional[int], int, int]: ...
def definition(repo: str, kind: str, name: str) -> str: ...
def plan(repo: str, definitions_json: str, remove: List[str] = ...) -> Tuple[str, Tuple[int, int, int]]: ...
def export(
    repo: str,
    service: str,
    spine: Optional[str],
    out: str,
    shard_rows: Optional[int] = None,
    created_cutoff: bool = False,
    made: Optional[str] = None,
) -> str: ...
def verify_sample(repo: str, n: int) -> List[Tuple[str, int, int, int, int, List[str]]]: ...
def monitor(repo: str, reference: str, current: str, features: List[str] = ..., service: Optional[str] = None) -> str: ...
def parse_time(what: str, text: str) -> str: ...
def flush_lineage() -> None: ...
def place_rows(outs: List[List[Any]], rows: List[int], parts: List[List[Any]], perm: Optional[Any], runs: Any, places: Any,
               itemsizes: List[int]) -> None: ...
def _sleep(seconds: float) -> None: ...
