"""Process-wide memory settings for the collector's own process.

A sidecar must stay small beside the agent it watches (issue 27, "A sidecar is light";
``docs/collector.md``, "Memory"). What the store budgets (DuckDB's limit, the dedup
window, the checkpoint) cannot reach is settled here, once per process:

- :func:`tune_allocators`: glibc's arena cap and a fixed mmap threshold, and pyarrow's
  system allocator (called by :func:`~loopwatch.collector.service.serve_forever`, before
  the collector's threads allocate);
- :func:`keep_pandas_unloaded`: ``import pandas`` fails, so DuckDB and pyarrow never load
  it (called by ``loopwatch collector`` and ``loopwatch up``);
- :func:`trim_heap`: hands the C heap's free pages back (the store's maintenance, once a
  minute).

Each is a no-op where the platform lacks the call (musl, macOS). None of them belongs in a
process that embeds :class:`~loopwatch.collector.store.writer.Store` beside its own work.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.abc
import os
import sys
from typing import Any, Final

__all__ = [
    "HEAP_ARENAS",
    "HEAP_MMAP_THRESHOLD_BYTES",
    "PANDAS_RSS_MIB",
    "keep_pandas_unloaded",
    "limit_heap_arenas",
    "trim_heap",
    "tune_allocators",
]


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``).

    Python frees request buffers, Arrow tables and decoded batches every group, but
    glibc keeps freed pages of its per-thread arenas resident; trimming once a
    maintenance (a minute) keeps the collector's RSS to what it holds. A no-op where
    the C library has no ``malloc_trim`` (musl, macOS).
    """
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def _load_libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC: Final = _load_libc()

_M_ARENA_MAX: Final = -8
"""glibc's ``mallopt`` parameter number for the arena cap (``malloc.h``)."""

HEAP_ARENAS: Final = 2
"""C heap arenas the collector process may use. glibc gives each thread that allocates
its own arena, up to eight per core; the event loop, the writer, DuckDB's and gRPC's
threads then each keep their own freed, fragmented pages, which ``malloc_trim`` returns
only in part. Two keep contention low on the writer's path."""


_M_MMAP_THRESHOLD: Final = -3
"""glibc's ``mallopt`` parameter number for the mmap threshold (``malloc.h``)."""

HEAP_MMAP_THRESHOLD_BYTES: Final = 128 * 1024
"""Allocations at least this large get their own ``mmap``, returned to the system when
freed. 128 KiB is glibc's starting value, but glibc raises it (up to 32 MiB) each time a
large block is freed, after which request buffers, decoded batches and Arrow columns
come from the arenas and stay resident as fragments. Setting it fixes it there. In a
5-minute soak at half capacity, this with the Arrow system pool, DuckDB at 64 MiB and a
16 MiB checkpoint kept the collector at 300 MiB where the earlier defaults reached 334 MiB;
over 30 minutes it still reached 370-418 MiB as the stored runs' key index grew, until
schema 21 dropped that index (docs/collector.md, "Memory")."""


def limit_heap_arenas(arenas: int = HEAP_ARENAS) -> None:
    """Cap the C heap's arenas (glibc ``mallopt(M_ARENA_MAX)``), before threads start.

    Args:
        arenas: the cap, >= 1. A no-op where the C library has no ``mallopt``.
    """
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, max(int(arenas), 1))


def tune_allocators(
    arenas: int = HEAP_ARENAS, mmap_threshold_bytes: int = HEAP_MMAP_THRESHOLD_BYTES
) -> None:
    """Keep the collector's freed memory from staying resident; call before threads start.

    Three settings, each measured in the soak (docs/collector.md, "Memory"):
    the C heap's arena cap (:func:`limit_heap_arenas`), a fixed mmap threshold
    (glibc ``mallopt(M_MMAP_THRESHOLD)``, :data:`HEAP_MMAP_THRESHOLD_BYTES`), and
    pyarrow's system allocator instead of its bundled jemalloc or mimalloc pool, which
    keeps freed pages for reuse outside the C heap that :func:`trim_heap` trims. The
    collector itself never imports pyarrow (the writer builds Arrow batches with
    nanoarrow, :mod:`loopwatch.collector.store.arrow`, and the lake shipper moves rows
    DuckDB to DuckDB as Arrow C streams); a process that embeds it may. So pyarrow is
    not imported here: ``ARROW_DEFAULT_MEMORY_POOL
    =system`` (Arrow C++'s documented variable, read when its default pool is first
    made) covers a later import, and an imported pyarrow is switched at once.

    Args:
        arenas: the arena cap, >= 1.
        mmap_threshold_bytes: the mmap threshold in bytes, >= 4096.

    A no-op for each part the platform lacks (no ``mallopt``). An
    ``ARROW_DEFAULT_MEMORY_POOL`` already set by the operator is kept.
    """
    limit_heap_arenas(arenas)
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, max(int(mmap_threshold_bytes), 4096))
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    pa = sys.modules.get("pyarrow")
    if pa is not None and os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system":
        pa.set_memory_pool(pa.system_memory_pool())


PANDAS_RSS_MIB: Final = 53
"""Resident memory pandas adds when DuckDB imports it (measured: 141 -> 194 MiB in a
process holding duckdb, pyarrow and numpy, DuckDB 1.5.5)."""


class _PandasKeptOut(importlib.abc.MetaPathFinder):
    """An import finder that answers "not installed" for pandas."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError(
                "pandas is kept out of the collector's process (keep_pandas_unloaded)",
                name=fullname,
            )


def keep_pandas_unloaded() -> bool:
    """Make ``import pandas`` fail in this process, so DuckDB and pyarrow never load it.

    DuckDB 1.5's Python client imports pandas the first time it binds a Python parameter
    (``con.execute(sql, [value])``) once numpy is loaded, and pyarrow's ``pa.array``
    imports it to ask whether its input is a pandas object: :data:`PANDAS_RSS_MIB` of a
    sidecar's memory for a library the collector never uses. Both take an
    ``ImportError`` as "pandas is not installed". A finder at the head of
    ``sys.meta_path`` raises it (``sys.modules["pandas"] = None`` is not enough: Cython's
    import in pyarrow returns that ``None``). DuckDB then cannot bind numpy scalars as
    parameters; the collector passes Python values only.

    Only for a process that is the collector's own (``loopwatch collector`` and
    ``loopwatch up``): code embedding :class:`Store` beside pandas must not call it.

    Returns:
        True if pandas is now kept out; False if it was already imported or kept out
        (then nothing changes).
    """
    if "pandas" in sys.modules or any(isinstance(f, _PandasKeptOut) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _PandasKeptOut())
    return True
