"""The store: the collector's DuckDB file.

Three parts:

- :mod:`.schema`: numbered migrations and every table's columns, spelled once (no
  pyarrow, no runtime DuckDB import: the dashboard imports the column names);
- :mod:`.writer` (with :mod:`.apply` and :mod:`.keys`): one writer thread that applies
  mapped batches with group commit and resolves each batch's future after its commit;
- :mod:`.reader`: read queries with a time limit and a row cap.

Names are re-exported lazily (PEP 562), so importing the reader or the schema does not
import pyarrow: ``from loopwatch.collector.store import StoreReader`` loads only the reader.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "CommitResult",
    "CommitStats",
    "Migration",
    "ReadTimeout",
    "RunDetail",
    "RunsPage",
    "SchemaTooNew",
    "Stats",
    "Store",
    "StoreClosed",
    "StoreConfig",
    "StoreError",
    "StoreReader",
    "apply_migrations",
]

_WHERE = {
    **dict.fromkeys(("MIGRATIONS", "SCHEMA_VERSION", "Migration", "apply_migrations"), ".schema"),
    **dict.fromkeys(("CommitResult", "CommitStats", "Store", "StoreConfig"), ".writer"),
    **dict.fromkeys(("RunDetail", "RunsPage", "Stats", "StoreReader"), ".reader"),
    **dict.fromkeys(("ReadTimeout", "SchemaTooNew", "StoreClosed", "StoreError"), "..errors"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)
