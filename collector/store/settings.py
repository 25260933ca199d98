"""The store's settings and how the writer opens its file.

- :class:`StoreConfig`: the writer's settings (queue, group commit, deduplication,
  memory budgets, retention, row group size), and :func:`memory_settings`, which maps
  the collector's ``[store]`` section onto it.
- :func:`open_file`: the DuckDB session on the file, attached with ``ROW_GROUP_SIZE``
  (:func:`default_row_group_rows`), as :class:`~loopwatch.collector.store.writer.Store`
  and the benchmarks open it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb

from ..sample import SamplingConfig
from .keys import DEDUP_BYTES_PER_KEY

__all__ = [
    "ALIAS",
    "DUCKDB_ROW_GROUP_ROWS",
    "SMALL_ROW_GROUP_ROWS",
    "VECTOR_ROWS",
    "StoreConfig",
    "default_row_group_rows",
    "memory_settings",
    "open_file",
]

ALIAS: Final = "store"
"""The file's name in the writer's DuckDB session (``ATTACH ... AS store``; every cursor
runs ``USE store``, so the SQL names tables plainly)."""

VECTOR_ROWS: Final = 2048
"""DuckDB's vector size: a row group holds a whole number of vectors."""

DUCKDB_ROW_GROUP_ROWS: Final = 122_880
"""DuckDB's own row group size (60 vectors), the largest the store accepts."""

SMALL_ROW_GROUP_ROWS: Final = 16_384
"""The store's row group size where DuckDB holds it (:func:`default_row_group_rows`)."""


def default_row_group_rows(version: str | None = None) -> int:
    """The store's default row group size for a DuckDB version (default: the one loaded).

    Each checkpoint leaves what was appended since the last one as a new, small row
    group, and DuckDB's vacuum merges adjacent row groups that fit in fewer, up to three
    at once: on the wide ``runs`` and ``stop_reports`` tables a merge of up to
    3 x 122,880 rows held the writer 1.5-6 s every few minutes in the 30-minute soak.
    16,384-row groups bound that merge (``tests/bench/bench_checkpoint.py``: longest
    checkpoint 323 vs 1,804 ms). DuckDB 1.5.5 keeps a 256 KiB block it cannot evict for
    each row group filled by appends alone, which at that size filled its memory limit
    within minutes ("failed to pin block", which invalidates the connection); 1.5.6 does
    not. So: 16,384 from 1.5.6 on, DuckDB's 122,880 before (``docs/collector.md``,
    "Memory").

    Args:
        version: a DuckDB version such as ``"1.5.6"``.

    Returns:
        Rows per row group: :data:`SMALL_ROW_GROUP_ROWS` or :data:`DUCKDB_ROW_GROUP_ROWS`.
    """
    text = duckdb.__version__ if version is None else version
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)", text)
    if match is None:
        return DUCKDB_ROW_GROUP_ROWS
    release = tuple(int(part or 0) for part in match.groups()[:3])
    # "1.5.6rc1" and "1.5.6.dev3" come before 1.5.6; "1.5.6.post1" after.
    prerelease = re.match(r"\.?(a|b|rc|dev)", match.group(4)) is not None
    if release > (1, 5, 6) or (release == (1, 5, 6) and not prerelease):
        return SMALL_ROW_GROUP_ROWS
    return DUCKDB_ROW_GROUP_ROWS


def open_file(path: Path, config: StoreConfig) -> duckdb.DuckDBPyConnection:
    """A DuckDB session on the store's file as the writer opens it: the file attached as
    ``store`` with ``ROW_GROUP_SIZE`` ``config.row_group_rows`` and made the default
    (``USE store``), ``config.duckdb_threads`` threads, spilling to ``<path>.tmp``.

    Attached rather than opened, for ``ROW_GROUP_SIZE``: DuckDB keeps no row group size
    in the file, the option applies to what this session writes. The spill folder is an
    opened file's default, given at launch: DuckDB drops blocks whose eviction failed
    before a late ``SET temp_directory`` from its eviction queue for good
    (duckdb/duckdb#25959).

    Raises:
        duckdb.Error: the file cannot be opened (held by another process, missing folder,
            not a DuckDB file).
    """
    con = duckdb.connect(
        ":memory:",
        config={"threads": str(config.duckdb_threads), "temp_directory": f"{path}.tmp"},
    )
    try:
        quoted = str(path).replace("'", "''")
        con.execute(f"ATTACH '{quoted}' AS {ALIAS} (ROW_GROUP_SIZE {config.row_group_rows})")
        con.execute(f"USE {ALIAS}")
    except BaseException:
        con.close()
        raise
    return con


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Store settings.

    Attributes:
        max_queue_spans: spans waiting for the writer before :meth:`Store.submit` raises
            ``QueueFull`` (a single batch larger than this is accepted when the queue is
            empty).
        max_group_spans: spans written in one transaction (group commit bound).
        dedup_retention_seconds: how long span keys are kept for retry deduplication
            (OTLP exporters retry for seconds to minutes).
        maintenance_interval_seconds: how often the writer decides timed-out runs and
            prunes old keys (wall time, checked between groups).
        read_timeout_seconds: time limit of each read query.
        read_max_rows: row cap of each read query.
        duckdb_threads: DuckDB worker threads for the file (reads included). One thread
            measured best on 2 cores: 109k vs 81k spans/s and half the commit latency,
            because small group writes gain nothing from parallel scans.
        sampling: the sampling rule.
        dedup_max_keys: span keys held in memory for deduplication (about
            ``DEDUP_BYTES_PER_KEY`` = 24 bytes each: the default, 1.4 million keys, takes
            32 MiB). Past
            this, the oldest keys are dropped before their retention ends, so a retry
            older than the newest ``dedup_max_keys`` spans would be stored again (logged;
            its steps are written twice, while its run row is merged by run key and its
            stop is not counted again). The default covers about 40 minutes at 550 spans/s,
            three minutes at 8,000.
        checkpoint_wal_bytes: write-ahead log size at which the writer checkpoints, once
            the queue is empty and after the group's futures are resolved; at four times
            this size it checkpoints even with batches waiting. DuckDB's own automatic
            checkpoint (which runs inside ``COMMIT``, delaying that group's
            acknowledgement) is pushed to eight times this size. A checkpoint blocks the
            writer for a time that grows with the ``runs`` and ``stops`` tables, not with
            the log (200-500 ms at 30-40k runs after 4 MiB and after 64 MiB alike), so
            fewer, larger ones stall less; but rows not yet checkpointed stay in DuckDB's
            memory, and a larger log takes longer to replay at open. The default, 16 MiB,
            kept the soak's resident memory flat where 64 MiB let it climb
            (``docs/collector.md``, "Memory").
        memory_limit_bytes: DuckDB's buffer pool limit for the file (``SET
            memory_limit``). DuckDB's own default is 80 % of the machine's memory, and it
            keeps every block it has read or written cached up to that limit, so a
            long-running collector's resident memory grew with its file (measured in the
            soak test: about 2 MB/s at 4,000 spans/s). Past the limit DuckDB evicts
            cached blocks and spills large reads to ``<db>.tmp``. The default, 64 MiB
            (with the 16 MiB checkpoint), is the least measured safe under load; the
            30-minute soak at half capacity still exceeded the 300 MiB goal
            (``docs/collector.md``, "Memory").
        retention_seconds: how long a decided run is kept after its last span arrived
            (wall time of arrival, not the span's own clock, which a client sets);
            ``0`` keeps runs forever. Past it, the maintenance removes the run with its
            steps, stops, tool counts and canary flags. Compare Langfuse's and Phoenix's
            per-project trace retention.
        prune_max_runs: runs removed per transaction. When more are due, the writer
            goes on with the next ones between groups, once the queue is empty. A pass
            holds the writer for a time that grows with the ``steps`` table (scanned by
            each ``DELETE``): 2,000 runs took 0.17 s of 200,000 runs with 2 million
            steps, 20,000 runs 0.87 s (measured here), so the default keeps the pause
            short; that still removes about 17,000 runs/s.
        row_group_rows: rows per DuckDB row group in what the writer appends (a
            multiple of 2,048 up to 122,880); default :func:`default_row_group_rows`.
    """

    max_queue_spans: int = 100_000
    max_group_spans: int = 20_000
    dedup_retention_seconds: float = 3_600.0
    maintenance_interval_seconds: float = 60.0
    read_timeout_seconds: float = 5.0
    read_max_rows: int = 10_000
    duckdb_threads: int = 1
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    dedup_max_keys: int = (16 << 20) // DEDUP_BYTES_PER_KEY
    checkpoint_wal_bytes: int = 16 * 1024 * 1024
    memory_limit_bytes: int = 64 * 1024 * 1024
    retention_seconds: float = 0.0
    prune_max_runs: int = 2_000
    shipped_retention_seconds: float = 0.0
    keep_unshipped: bool = False
    row_group_rows: int = field(default_factory=default_row_group_rows)

    def validate(self) -> None:
        """Check every field.

        Raises:
            ValueError: a field is out of range.
        """
        for name in (
            "max_queue_spans",
            "max_group_spans",
            "read_max_rows",
            "duckdb_threads",
            "dedup_max_keys",
            "checkpoint_wal_bytes",
            "memory_limit_bytes",
            "prune_max_runs",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1")
        if not 0 <= self.shipped_retention_seconds < float("inf"):
            raise ValueError("shipped_retention_seconds must be a finite number >= 0")
        for name in (
            "dedup_retention_seconds",
            "maintenance_interval_seconds",
            "read_timeout_seconds",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a finite number > 0")
        rows = self.row_group_rows
        if (
            isinstance(rows, bool)
            or not isinstance(rows, int)
            or not VECTOR_ROWS <= rows <= DUCKDB_ROW_GROUP_ROWS
            or rows % VECTOR_ROWS
        ):
            raise ValueError(
                f"row_group_rows must be a multiple of {VECTOR_ROWS} "
                f"in {VECTOR_ROWS}..{DUCKDB_ROW_GROUP_ROWS}"
            )
        retention = self.retention_seconds
        if isinstance(retention, bool) or not (
            isinstance(retention, int | float) and 0 <= retention < float("inf")
        ):
            raise ValueError("retention_seconds must be a finite number >= 0 (0: keep forever)")
        self.sampling.validate()


def memory_settings(store: Any) -> dict[str, int]:
    """The writer's memory budgets from the collector's ``[store]`` section.

    Args:
        store: a :class:`loopwatch.collector.config.StoreConfig` (``memory_limit_mib``,
            ``checkpoint_wal_mib``, ``duckdb_threads``, ``dedup_window_mib``).

    Returns:
        ``memory_limit_bytes``, ``checkpoint_wal_bytes``, ``duckdb_threads`` and
        ``dedup_max_keys`` (the window's MiB divided by
        :data:`~loopwatch.collector.store.keys.DEDUP_BYTES_PER_KEY`), as
        :class:`StoreConfig` keyword arguments; ``row_group_rows`` too when
        ``store.row_group_rows`` is set (0 leaves :func:`default_row_group_rows`).
    """
    return {
        "memory_limit_bytes": int(store.memory_limit_mib) << 20,
        "checkpoint_wal_bytes": int(store.checkpoint_wal_mib) << 20,
        "duckdb_threads": int(store.duckdb_threads),
        "dedup_max_keys": max((int(store.dedup_window_mib) << 20) // DEDUP_BYTES_PER_KEY, 1),
        **({"row_group_rows": int(rows)} if (rows := getattr(store, "row_group_rows", 0)) else {}),
    }
