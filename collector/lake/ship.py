"""Ship finished runs from the collector's local DuckDB file to the lake, exactly once.

The local file stays the durable buffer: the collector acknowledges a request after its
local commit, as without a lake, and a :class:`Shipper` thread publishes finished runs
to the lake afterwards, in batches:

1. **Finished** (:func:`select_finished`): the run's stop and sampling are decided
   (``runs.sampled IS NOT NULL``; the store decides a run whose stop never comes after
   ``sampling.stop_timeout_seconds``, so timed-out runs are decided too), no span of it
   arrived for ``grace`` seconds (``last_seen_unix_nano``), and it is not in
   ``shipped_runs`` yet.
2. **Read** (:func:`read_batch`): the run row, its primary stop (the local ``stops``
   view), its kept steps (``steps``), its tool counts (``run_tools`` summed, with
   ``run_id``) and its canary flag (a flag naming the run id or its trace id), read on a
   cursor of the store (:meth:`~loopwatch.collector.store.writer.Store.read_cursor`) in
   one read transaction: a consistent MVCC snapshot that never blocks the writer's group
   commit, as the read API's cursors do. The runs are also bounded by the batch's
   ``last_seen`` range, so that read skips most of the table. The rows leave
   the store's DuckDB as Arrow arrays (its own export, held by nanoarrow), which the
   lake connection reads as Arrow C stream capsules
   (:func:`~loopwatch.collector.lake.schema.views`): no Python object per row, and no
   pyarrow in the process.
3. **Publish** (:meth:`LakeSession.publish`): in ONE lake transaction, insert the rows of
   the batch's runs whose ``run_key`` is not in ``lake.runs`` yet; commit. The lake
   connection's memory is capped by ``lake.memory_limit_mib`` (it spills past it).
4. **Mark** (:func:`mark_shipped`): append the batch's keys to the local ``shipped_runs``
   through :meth:`~loopwatch.collector.store.writer.Store.run_task`: the writer thread
   runs it between groups, in its own transaction, so the file keeps one writer.

Exactly once, by run key. The lake holds the first committed copy of a ``run_key``; a
later copy is never inserted. A crash between 3 and 4 re-ships the batch at the next
start: the anti-join of step 3 finds the keys (with this ``collector_id``) and step 4
marks them. A copy of a run that another collector already committed (a trace whose
spans reached two collectors) is skipped, marked ``skipped`` locally, and counted in
``loopwatch_lake_runs_skipped_total``. A trace-level fragment of a trace split over two
collectors (run id = trace id, no stop, no run span) is folded into its trace's run,
whichever ships first (:func:`fold_fragments`): the lake holds one run per trace. DuckLake
does not conflict on concurrent inserts
into one table (both commit), so the check and the insert of concurrent shippers are
serialized by a PostgreSQL advisory lock (:data:`SHIP_LOCK_KEY`) held on a session
connection to the catalog database for the length of the lake transaction. A local
``.ducklake`` catalog file has one writing process anyway.

Failures (a DuckLake commit conflict, PostgreSQL down or restarting, the data path full
or unwritable, the local mark refused) roll the lake transaction back (or leave a
committed one to be found again), mark nothing, and retry the batch with a doubling
backoff; the collector keeps ingesting and answering. Each failure is counted in
``loopwatch_lake_ship_failures_total{reason}`` (:data:`FAILURE_REASONS`).

Start (:func:`open_lake`): the data path is written (a probe file), the catalog
database is reached, the lake is attached and its contract version checked, before the
collector accepts a span; any failure there is a :class:`~loopwatch.collector.errors.
LakeUnavailable` (one line, password masked), which the CLI prints before exiting 2.

Test hook (tests only, documented in docs/lake.md): ``LOOPWATCH_TEST_SHIP_PAUSE_SECONDS``
makes the shipper log ``lake commit done`` and sleep that long between the lake commit
and the local mark, so a test can ``kill -9`` the collector in the window that matters.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import nanoarrow as na

from ..errors import LakeUnavailable
from ..store.arrow import BOOL, INT64, UINT64, ArrowColumns, column
from ..store.schema import STOP_ORDER
from .connect import ALIAS, LakeTarget, connect_lake, mask_catalog
from .fold import fold_fragments
from .schema import BATCH_TABLES, LAKE_TABLES, ensure_lake_schema, lake_columns, views

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "ATTACH_LOCK_KEY",
    "FAILURE_REASONS",
    "PAUSE_ENV",
    "SHIP_LOCK_KEY",
    "LakeBatch",
    "LakeSession",
    "ShipOutcome",
    "ShipSettings",
    "Shipper",
    "classify_failure",
    "fold_fragments",
    "mark_shipped",
    "only",
    "open_lake",
    "read_batch",
    "select_finished",
    "split_existing",
    "views",
]

_log = logging.getLogger("loopwatch.collector.lake")
_NS: Final = 1_000_000_000

SHIP_LOCK_KEY: Final = int.from_bytes(
    hashlib.blake2b(b"loopwatch.lake.ship", digest_size=8).digest(), "big", signed=True
)
"""The PostgreSQL advisory lock (``pg_advisory_lock(bigint)``) every shipper of a lake
holds around its check-insert-commit."""

ATTACH_LOCK_KEY: Final = int.from_bytes(
    hashlib.blake2b(b"loopwatch.lake.attach", digest_size=8).digest(), "big", signed=True
)
"""The PostgreSQL advisory lock held around attaching the lake and creating its tables:
the first ATTACH of a fresh catalog makes DuckLake's metadata tables, and two processes
doing that at once collide in PostgreSQL's own catalog (``duplicate key value violates
unique constraint "pg_type_typname_nsp_index"``: ``CREATE TABLE IF NOT EXISTS`` is not
atomic against a concurrent creator)."""

FAILURE_REASONS: Final = ("conflict", "catalog", "data_path", "local", "other")
"""Values of the ``reason`` label of ``loopwatch_lake_ship_failures_total``:
``conflict`` (a DuckLake commit lost to another writer), ``catalog`` (PostgreSQL
unreachable, restarting, or the advisory lock timed out), ``data_path`` (a Parquet file
could not be written), ``local`` (the local file refused the read or the mark),
``other``."""

PAUSE_ENV: Final = "LOOPWATCH_TEST_SHIP_PAUSE_SECONDS"
"""Test hook: seconds to sleep between the lake commit and the local mark."""

_CONNECT_TIMEOUT_SECONDS: Final = 10
_LOCK_TIMEOUT: Final = "60s"
_SCHEMA_ATTEMPTS: Final = 5
_FLOOR_MARGIN_NS: Final = 300 * _NS


@dataclass(frozen=True, slots=True)
class ShipSettings:
    """How the shipper works (from the ``[lake]`` configuration).

    Attributes:
        collector_id: the ``collector_id`` written with every row.
        interval_seconds: pause between passes when the backlog is empty.
        grace_seconds: a decided run ships once no span of it arrived for this long.
        batch_runs: runs per lake transaction.
        retry_max_seconds: the longest pause between retries (backoff doubles from
            ``interval_seconds``).
        pause_after_commit_seconds: test hook (:data:`PAUSE_ENV`); 0 in production.
    """

    collector_id: str
    interval_seconds: float = 3.0
    grace_seconds: float = 5.0
    batch_runs: int = 10_000
    retry_max_seconds: float = 60.0
    pause_after_commit_seconds: float = 0.0


# ----------------------------------------------------------------- local side


def _since(floor_ns: int | None) -> tuple[str, str]:
    """The bounds that keep each pass's scans to recent rows (see :class:`Shipper`)."""
    if floor_ns is None:
        return "", ""
    floor = int(floor_ns)
    return (
        f" AND decided_unix_nano >= {floor}",
        f" WHERE shipped_unix_nano >= {floor}",
    )


def select_finished(
    con: duckdb.DuckDBPyConnection,
    *,
    now_ns: int,
    grace_ns: int,
    limit: int,
    floor_ns: int | None = None,
) -> list[tuple[int, int]]:
    """The finished, unshipped runs, oldest last span first.

    Args:
        con: a cursor of the local file.
        now_ns: wall clock, ns since the epoch.
        grace_ns: how long a decided run must have had no new span.
        limit: at most this many.
        floor_ns: look only at runs decided since then (None: every run).

    Returns:
        ``[(run_key, last_seen_unix_nano), ...]``.
    """
    decided, shipped = _since(floor_ns)
    return [
        (int(key), int(seen))
        for key, seen in con.execute(
            "SELECT run_key, last_seen_unix_nano FROM runs WHERE sampled IS NOT NULL "
            f"AND last_seen_unix_nano < ?{decided} "
            f"AND run_key NOT IN (SELECT run_key FROM shipped_runs{shipped}) "
            "ORDER BY last_seen_unix_nano LIMIT ?",
            [now_ns - grace_ns, limit],
        ).fetchall()
    ]


def count_backlog(
    con: duckdb.DuckDBPyConnection, floor_ns: int | None = None
) -> tuple[int, int | None]:
    """Decided runs not yet marked shipped (the ``loopwatch_lake_backlog_runs`` gauge),
    and the earliest ``decided_unix_nano`` among them (None when there is none)."""
    decided, shipped = _since(floor_ns)
    row = con.execute(
        "SELECT count(*), min(decided_unix_nano) FROM runs WHERE sampled IS NOT NULL"
        f"{decided} AND run_key NOT IN (SELECT run_key FROM shipped_runs{shipped})"
    ).fetchone()
    if row is None:
        return 0, None
    return int(row[0]), None if row[1] is None else int(row[1])


def _own(table: str) -> str:
    return ", ".join(name for name, _ in LAKE_TABLES[table])


@dataclass(frozen=True, slots=True)
class LakeBatch:
    """One batch's rows, read from the local file as Arrow arrays (lake column order,
    without ``collector_id`` and ``shipped_unix_nano``), held by nanoarrow.

    Arrays, not DuckDB temporary tables: an in-memory table takes at least one 256 KiB
    block per column, about 35 MiB for the five tables' 140 columns whatever the batch
    holds (27 MiB for 2,500 runs, measured); the arrays take what the rows take.

    Attributes:
        last_seen: ``{run_key: last_seen_unix_nano}`` of the batch's runs (for the lag).
        tables: ``{lake table: nanoarrow.Array}``; :func:`views` hands them to DuckDB.
    """

    last_seen: dict[int, int]
    tables: dict[str, Any]

    @property
    def run_keys(self) -> list[int]:
        """The batch's run keys."""
        return list(self.last_seen)

    def rows(self, table: str) -> int:
        """Rows of ``table`` in the batch."""
        return len(self.tables[table])


_KEYS: Final = "loopwatch_ship_keys"
_SOURCE: Final = "loopwatch_ship_source"


def _fetch(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """The rows of ``sql`` as one nanoarrow array (DuckDB's Arrow export, no copy)."""
    return na.Array(con.sql(sql))


def read_batch(
    con: duckdb.DuckDBPyConnection,
    finished: Sequence[tuple[int, int]],
    lake: duckdb.DuckDBPyConnection,
) -> LakeBatch:
    """Read the lake rows of ``finished`` runs from the local file, in one snapshot.

    Each local read selects by run key. ``runs`` is also bounded by the batch's
    ``last_seen_unix_nano`` range, as :func:`select_finished` saw it: DuckDB skips the
    row groups outside it (a run's row is appended again each time it is touched), and a
    run that got a span since then falls outside and leaves the batch whole: it is no
    longer quiet, and ships in a later pass. ``stop_reports`` and ``steps`` are read by
    key only: a window on ``received_unix_nano`` (between the runs' first and last span)
    would lose rows for good when the store's clock is set back between two groups of a
    run, since the writer takes each group's time from the wall clock and sets a run's
    ``last_seen`` to it; the run would ship without them and be marked shipped.

    Ranking the stop reports and summing the tool counts happen on ``lake``, so their
    working memory comes out of the lake connection's budget, not the store's, which
    the writer's checkpoints need.

    Args:
        con: a cursor of the local file (a temporary key table and a read transaction
            are opened and closed here).
        finished: ``[(run_key, last_seen_unix_nano), ...]`` from :func:`select_finished`.
        lake: a connection for the ranking and summing (:class:`LakeSession`'s).

    Returns:
        The batch: the runs of ``finished`` still there and still quiet.
    """
    keys = [key for key, _ in finished]
    source = ArrowColumns(["run_key"], [column(keys, UINT64)], len(keys))
    con.register(_SOURCE, source.__arrow_c_stream__())
    try:
        # A temporary table of the cursor's own connection, read by the five queries:
        # cheaper to plan than a long literal list, and a capsule is scanned once.
        con.execute(f"CREATE OR REPLACE TEMP TABLE {_KEYS} AS FROM {_SOURCE}")
    finally:
        con.unregister(_SOURCE)
    in_batch = f"run_key IN (SELECT run_key FROM {_KEYS})"
    seen = [last for _, last in finished]
    window = f"BETWEEN {min(seen, default=0)} AND {max(seen, default=0)}"
    con.execute("BEGIN TRANSACTION")
    try:
        runs = _fetch(
            con,
            f"SELECT {_own('runs')} FROM runs WHERE {in_batch} AND last_seen_unix_nano {window}",
        )
        reports = _fetch(con, f"SELECT {_own('stops')} FROM stop_reports WHERE {in_batch}")
        steps = _fetch(con, f"SELECT {_own('steps')} FROM steps WHERE {in_batch}")
        tool_rows = _fetch(
            con, f"SELECT run_key, tool, outcome, calls, agent FROM run_tools WHERE {in_batch}"
        )
        # A flag names a run id or a trace id; in the lake it names each run it marks.
        flags = _fetch(
            con,
            "SELECT r.run_id, min(c.first_seen_unix_nano) AS first_seen_unix_nano "
            "FROM runs r JOIN canary_flags c ON c.run_id = r.run_id OR c.run_id = r.trace_id "
            f"WHERE r.{in_batch} AND r.last_seen_unix_nano {window} GROUP BY r.run_id",
        )
    finally:
        con.execute("ROLLBACK")
        con.execute(f"DROP TABLE IF EXISTS {_KEYS}")
    # The stops view's rule over this batch's reports (the view would rank every stored
    # report), and the tool counts summed per run, tool, outcome and agent, with run_id.
    with views(lake, {"stops": reports}):
        stops = _fetch(lake, f"FROM {BATCH_TABLES['stops']} QUALIFY {STOP_ORDER} = 1")
    with views(lake, {"run_tools": tool_rows, "runs": runs}):
        tools = _fetch(
            lake,
            "SELECT t.run_key, r.run_id, t.tool, t.outcome, CAST(sum(t.calls) AS BIGINT) "
            f"AS calls, t.agent FROM {BATCH_TABLES['run_tools']} t "
            f"JOIN {BATCH_TABLES['runs']} r ON r.run_key = t.run_key "
            "GROUP BY t.run_key, r.run_id, t.tool, t.outcome, t.agent",
        )
    tables = {"runs": runs, "stops": stops, "steps": steps, "run_tools": tools,
              "canary_flags": flags}  # fmt: skip
    with views(lake, {"runs": runs}):
        found = {
            int(k)
            for (k,) in lake.execute(f"SELECT run_key FROM {BATCH_TABLES['runs']}").fetchall()
        }
    if len(found) < len(finished):
        # Runs that left the batch (a late span; retention): their other rows leave too.
        tables = only(lake, tables, sorted(found))
    return LakeBatch({k: last for k, last in finished if k in found}, tables)


def only(
    con: duckdb.DuckDBPyConnection, tables: dict[str, Any], keys: Sequence[int]
) -> dict[str, Any]:
    """The rows of ``tables`` that belong to the runs ``keys`` (new arrays).

    The keys are joined from an Arrow column: a literal list of 2,000 UBIGINTs costs
    DuckDB tens of milliseconds to plan.
    """
    keep = ArrowColumns(["run_key"], [column(list(keys), UINT64)], len(keys))
    out: dict[str, Any] = {}
    for table, array in tables.items():
        if table == "canary_flags":
            continue
        con.register(_SOURCE, keep.__arrow_c_stream__())
        try:
            with views(con, {table: array}):
                out[table] = _fetch(
                    con,
                    f"FROM {BATCH_TABLES[table]} WHERE run_key IN (SELECT run_key FROM {_SOURCE})",
                )
        finally:
            con.unregister(_SOURCE)
    with views(con, {"canary_flags": tables["canary_flags"], "runs": out["runs"]}):
        out["canary_flags"] = _fetch(
            con,
            f"FROM {BATCH_TABLES['canary_flags']} WHERE run_id IN "
            f"(SELECT run_id FROM {BATCH_TABLES['runs']})",
        )
    return {table: out[table] for table in tables}


def mark_shipped(
    con: duckdb.DuckDBPyConnection, keys: Sequence[int], skipped: Sequence[int], now_ns: int
) -> None:
    """Append the shipped marks (run on the writer thread, inside its transaction).

    Args:
        con: the store's write connection.
        keys: run keys now in the lake from this collector (this or an earlier attempt).
        skipped: run keys whose lake copy came from another collector.
        now_ns: the mark's time.
    """
    all_keys = [*keys, *skipped]
    if not all_keys:
        return
    # Appended as Arrow columns: a literal list of 2,000 UBIGINTs cost DuckDB 31-35 ms to
    # plan, on the writer thread that every acknowledgement waits for; the columns take
    # 1.4-2.2 ms (measured on a 144,000-run file, DuckDB 1.5.5).
    marks = ArrowColumns(
        ["run_key", "shipped_unix_nano", "skipped"],
        [
            column(all_keys, UINT64),
            column([now_ns] * len(all_keys), INT64),
            column([False] * len(keys) + [True] * len(skipped), BOOL),
        ],
        len(all_keys),
    )
    con.from_arrow(marks.__arrow_c_stream__()).insert_into("shipped_runs")


# ----------------------------------------------------------------- lake side


def split_existing(
    keys: Iterable[int], existing: Iterable[tuple[int, str]], collector_id: str
) -> tuple[list[int], list[int], list[int]]:
    """Which of a batch's runs to insert.

    Args:
        keys: the batch's run keys.
        existing: ``(run_key, collector_id)`` of those already in ``lake.runs``.
        collector_id: this collector's id.

    Returns:
        ``(new, mine, skipped)``: to insert; already there from this collector (an
        earlier attempt committed before a crash); already there from another collector
        (first committed copy wins).
    """
    found = dict(existing)
    new, mine, skipped = [], [], []
    for key in keys:
        owner = found.get(key)
        if owner is None:
            new.append(key)
        elif owner == collector_id:
            mine.append(key)
        else:
            skipped.append(key)
    return new, mine, skipped


def classify_failure(exc: BaseException) -> str:
    """The ``reason`` label (:data:`FAILURE_REASONS`) of a failed ship."""
    name = type(exc).__name__
    text = str(exc).lower()
    if isinstance(exc, LakeUnavailable):
        return "data_path" if exc.what == "data_path" else "catalog"
    if "conflict" in text or name == "TransactionException":
        return "conflict"
    if isinstance(exc, OSError) or any(
        word in text
        for word in ("no space", "permission denied", "not a directory", "could not write",
                     "failed to create directory", "cannot open file", "read-only file")
    ):  # fmt: skip
        return "data_path"
    if (
        type(exc).__module__.startswith("psycopg")
        or "postgres" in text
        or "connection" in text
        or "server closed" in text
    ):
        return "catalog"
    return "other"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return mask_catalog(text[0] if text else type(exc).__name__)[:300]


def probe_data_path(data_path: str) -> None:
    """Write and remove a probe file in a local data path (object stores: skipped, their
    first write is the check).

    Raises:
        LakeUnavailable: ``what="data_path"``, the folder cannot be made or written.
    """
    if "://" in data_path:
        return
    folder = Path(data_path)
    probe = folder / f".loopwatch-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"loopwatch")
        probe.unlink()
    except OSError as exc:
        raise LakeUnavailable(
            "data_path",
            f"cannot write the lake data path {data_path}: {exc.strerror or exc}",
        ) from None


@dataclass(frozen=True, slots=True)
class ShipOutcome:
    """What one published batch became.

    Attributes:
        inserted: run keys this transaction inserted.
        mine: keys already in the lake from this collector (an earlier attempt).
        skipped: keys already in the lake from another collector.
        commit_ns: wall time of the lake commit.
    """

    inserted: list[int]
    mine: list[int]
    skipped: list[int]
    commit_ns: int


@dataclass
class LakeSession:
    """A connection to the lake (DuckDB with the lake attached) and, for a PostgreSQL
    catalog, a psycopg session connection for the advisory lock.

    Build it with :func:`open_lake`. Not thread-safe: one shipper thread uses it.
    """

    target: LakeTarget
    con: duckdb.DuckDBPyConnection | None = None
    lock_con: Any = None

    def connect(self) -> None:
        """(Re)connect what is closed.

        Raises:
            LakeUnavailable: the catalog cannot be reached or attached.
        """
        if self.target.is_postgres and self.lock_con is None:
            self.lock_con = _pg_connect(self.target)
        if self.con is None:
            with self._locked(ATTACH_LOCK_KEY):
                self.con = connect_lake(self.target, threads=1)

    def close(self) -> None:
        """Close both connections (idempotent); the next :meth:`connect` opens new ones."""
        if self.con is not None:
            with contextlib.suppress(Exception):
                self.con.close()
            self.con = None
        if self.lock_con is not None:
            with contextlib.suppress(Exception):
                self.lock_con.close()
            self.lock_con = None

    @contextlib.contextmanager
    def _locked(self, key: int = SHIP_LOCK_KEY) -> Any:
        if self.lock_con is None:
            yield
            return
        self.lock_con.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a dead session released it already
                self.lock_con.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def stage(
        self, cursor: duckdb.DuckDBPyConnection, finished: Sequence[tuple[int, int]]
    ) -> LakeBatch:
        """Read a batch from the local file (:func:`read_batch`, ranking and summing on
        this session's connection, which is opened first if needed); :meth:`publish`
        ships it, on this session or another.

        Raises:
            LakeUnavailable: the lake cannot be reached.
            duckdb.Error: the local read failed.
        """
        self.connect()
        assert self.con is not None
        return read_batch(cursor, finished, self.con)

    def publish(self, batch: LakeBatch, collector_id: str) -> ShipOutcome:
        """Insert the batch's runs not yet in the lake, in one lake transaction.

        Raises:
            duckdb.Error, psycopg.Error, LakeUnavailable: nothing of the batch was
            committed by this call (or the commit's answer was lost: the next attempt
            finds the rows as ``mine``); retry.
        """
        self.connect()
        con = self.con
        assert con is not None
        keys = batch.run_keys
        with self._locked():
            shipped_ns = time.time_ns()
            con.execute("BEGIN TRANSACTION")
            try:
                existing = _existing(con, batch)
                new, mine, skipped = split_existing(keys, existing, collector_id)
                folded: list[int] = []
                if new:
                    # Usually every run is new: filter only when some are not.
                    tables = batch.tables if len(new) == len(keys) else only(con, batch.tables, new)
                    folded = fold_fragments(con, tables, collector_id, shipped_ns)
                    if folded:
                        gone = set(folded)
                        new = [k for k in new if k not in gone]
                        tables = only(con, tables, new)
                    if new:
                        _insert(con, tables, collector_id, shipped_ns)
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    con.execute("ROLLBACK")
                raise
            commit_ns = time.time_ns()
        return ShipOutcome(new, mine, [*skipped, *folded], commit_ns)


_CHECK_WINDOW_NS: Final = 86_400 * _NS
"""How far before a batch's earliest ``first_seen_unix_nano`` the exactly-once check looks
for copies already in the lake (by ``shipped_unix_nano``)."""


def _existing(con: duckdb.DuckDBPyConnection, batch: LakeBatch) -> list[tuple[int, str]]:
    """``(run_key, collector_id)`` of the batch's runs already in ``lake.runs``.

    Two costs kept off the check, which runs on every pass: the keys are joined from the
    batch's Arrow array (a literal ``IN`` list of 2,000 UBIGINTs cost more to plan than
    the whole insert), and only lake rows shipped at most a day before the batch's
    earliest first span are read: DuckLake skips the data files whose
    ``shipped_unix_nano`` range ends earlier, so the check no longer grows with the
    lake. A copy is shipped after its run's first span reached its collector, so it is
    in the window unless the same run's spans reached two collectors more than a day
    apart (docs/lake.md, "Exactly once").
    """
    runs = BATCH_TABLES["runs"]
    with views(con, {"runs": batch.tables["runs"]}):
        row = con.execute(f"SELECT min(first_seen_unix_nano) FROM {runs}").fetchone()
    earliest = None if row is None else row[0]
    now_ns = time.time_ns()
    # shipped_unix_nano is this host's wall clock; first_seen the store's (a test's may
    # run ahead): the earlier of the two.
    floor = min(now_ns, int(earliest) if earliest is not None else now_ns) - _CHECK_WINDOW_NS
    with views(con, {"runs": batch.tables["runs"]}):
        return [
            (int(key), str(owner))
            for key, owner in con.execute(
                f"SELECT l.run_key, l.collector_id FROM {ALIAS}.runs l "
                f"SEMI JOIN {runs} b ON l.run_key = b.run_key "
                f"WHERE l.shipped_unix_nano >= {floor}"
            ).fetchall()
        ]


def _insert(
    con: duckdb.DuckDBPyConnection, tables: dict[str, Any], collector_id: str, shipped_ns: int
) -> None:
    for table, name in BATCH_TABLES.items():
        if not len(tables[table]):
            continue
        columns = ", ".join(column_name for column_name, _ in lake_columns(table))
        # One flag row per run: a folded fragment may have brought the run's flag.
        only_new = (
            f" WHERE run_id NOT IN (SELECT run_id FROM {ALIAS}.canary_flags)"
            if table == "canary_flags"
            else ""
        )
        with views(con, {table: tables[table]}):
            con.execute(
                f"INSERT INTO {ALIAS}.{table} ({columns}) SELECT {_own(table)}, ?, ? "
                f"FROM {name}{only_new}",
                [collector_id, shipped_ns],
            )


def _pg_connect(target: LakeTarget) -> Any:
    try:
        import psycopg
    except ImportError:
        raise LakeUnavailable(
            "extension", "a PostgreSQL catalog needs psycopg: pip install 'loopwatch[lake]'"
        ) from None
    try:
        con = psycopg.connect(
            target.postgres_dsn, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_SECONDS
        )
        con.execute(f"SET lock_timeout = '{_LOCK_TIMEOUT}'")
    except psycopg.Error as exc:
        raise LakeUnavailable(
            "catalog",
            f"cannot reach the lake catalog {target.describe()}: {_first_line(exc)}",
        ) from None
    return con


def open_lake(target: LakeTarget) -> LakeSession:
    """Check everything the shipper needs, at start, and return the open session.

    In order: the data path takes a file; the catalog database answers (PostgreSQL); the
    extensions load and the lake attaches (a catalog of another DuckLake version fails
    here); the lake's tables exist and its contract version is not newer than this
    loopwatch's (:func:`~loopwatch.collector.lake.schema.ensure_lake_schema`, retried
    when several collectors create them at once).

    Raises:
        LakeUnavailable: one line naming what failed (password masked).
    """
    probe_data_path(target.data_path)
    session = LakeSession(target)
    try:
        session.connect()
        assert session.con is not None
        for attempt in range(_SCHEMA_ATTEMPTS):
            try:
                # Under the attach lock: one collector creates the tables, the others
                # then find them (DuckLake conflicts on concurrent CREATE TABLE).
                with session._locked(ATTACH_LOCK_KEY):
                    ensure_lake_schema(session.con)
                break
            except LakeUnavailable:
                raise
            except Exception as exc:
                if attempt == _SCHEMA_ATTEMPTS - 1:
                    raise LakeUnavailable(
                        classify_failure(exc) if classify_failure(exc) != "other" else "catalog",
                        f"cannot create the lake's tables in {target.describe()}: "
                        f"{_first_line(exc)}",
                    ) from None
                # Jitter: collectors that failed together retry apart (a local catalog
                # file, or a catalog some other tool is creating, has no lock here).
                time.sleep((0.2 + random.random() * 0.3) * (attempt + 1))
    except BaseException:
        session.close()
        raise
    return session


# ----------------------------------------------------------------- the thread


class Shipper:
    """The shipping thread of one collector.

    Args:
        session: an open :class:`LakeSession` (from :func:`open_lake`); the shipper owns
            and closes it.
        read_cursor: returns a new cursor of the local file (``Store.read_cursor``).
        run_task: runs a function on the store's writer thread (``Store.run_task``).
        settings: intervals and sizes.
        on_shipped: ``(inserted, skipped, lags_seconds)`` after each batch's local mark.
        on_failure: ``(reason)`` after each failed attempt.
        on_backlog: ``(runs)`` after each pass.
        on_cpu: ``(seconds)``: the thread's CPU time of each pass.
        clock: wall clock in epoch seconds (the store's clock, for ``last_seen``).
    """

    def __init__(
        self,
        session: LakeSession,
        *,
        read_cursor: Callable[[], duckdb.DuckDBPyConnection],
        run_task: Callable[[Callable[[duckdb.DuckDBPyConnection], None]], Future[None]],
        settings: ShipSettings,
        on_shipped: Callable[[int, int, list[float]], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        on_backlog: Callable[[int], None] | None = None,
        on_cpu: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.session = session
        self.settings = settings
        self._read_cursor = read_cursor
        self._run_task = run_task
        self._on_shipped = on_shipped
        self._on_failure = on_failure
        self._on_backlog = on_backlog
        self._on_cpu = on_cpu
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loopwatch-lake-ship", daemon=True)
        self.failures_in_a_row = 0
        self.floor_ns: int | None = None
        self._memory_logged = -math.inf

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """Stop after the batch in progress (its lake commit and local mark), close the
        lake session. Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)
        self.session.close()

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            started = time.thread_time()
            try:
                full = self.ship_once()
            except Exception as exc:
                self._count_cpu(started)
                reason = classify_failure(exc)
                self.failures_in_a_row += 1
                delay = min(
                    self.settings.interval_seconds * 2 ** min(self.failures_in_a_row, 16),
                    self.settings.retry_max_seconds,
                )
                _log.warning(
                    "lake ship failed (%s), retrying in %.1f s: %s",
                    reason,
                    delay,
                    _first_line(exc),
                )
                self.session.close()
                if self._on_failure is not None:
                    self._on_failure(reason)
                continue
            self._count_cpu(started)
            self.failures_in_a_row = 0
            delay = 0.0 if full else self.settings.interval_seconds
            self._log_memory()

    def _log_memory(self) -> None:
        """Once a minute at debug level: the lake connection's DuckDB memory by tag, to
        see what its budget (``lake.memory_limit_mib``) holds."""
        now = time.monotonic()
        if not _log.isEnabledFor(logging.DEBUG) or now - self._memory_logged < 60:
            return
        self._memory_logged = now
        con = self.session.con
        if con is None:
            return
        try:
            rows = con.execute(
                "SELECT tag, memory_usage_bytes FROM duckdb_memory() "
                "WHERE memory_usage_bytes > 0 ORDER BY tag"
            ).fetchall()
        except Exception:  # duckdb.Error: the next pass reconnects
            return
        tags = " ".join(f"{tag}={int(used) >> 20}" for tag, used in rows)
        _log.debug("lake connection memory MiB: duckdb %s", tags or "none")

    def _count_cpu(self, started: float) -> None:
        if self._on_cpu is not None:
            self._on_cpu(time.thread_time() - started)

    def ship_once(self) -> bool:
        """One pass: ship up to one batch of finished runs.

        Returns:
            True when the batch was full (more may be waiting).

        Raises:
            Exception: the pass failed; nothing new was marked (retry).
        """
        settings = self.settings
        now_ns = int(self._clock() * _NS)
        cursor = self._read_cursor()
        try:
            backlog, earliest = count_backlog(cursor, self.floor_ns)
            if self._on_backlog is not None:
                self._on_backlog(backlog)
            # Every unshipped run was decided at or after the floor, so later passes scan
            # only recent rows (runs are re-appended when touched, so DuckDB's zone maps
            # on decided_unix_nano skip the rest). The margin covers a group that took
            # its decision time before this pass and commits after it.
            floor = now_ns - _FLOOR_MARGIN_NS
            self.floor_ns = floor if earliest is None else min(earliest, floor)
            finished = select_finished(
                cursor,
                now_ns=now_ns,
                grace_ns=int(settings.grace_seconds * _NS),
                limit=settings.batch_runs,
                floor_ns=self.floor_ns,
            )
            if not finished:
                return False
            batch = self.session.stage(cursor, finished)
        finally:
            cursor.close()
        outcome = (
            self.session.publish(batch, settings.collector_id)
            if batch.last_seen
            else ShipOutcome([], [], [], time.time_ns())
        )
        if settings.pause_after_commit_seconds > 0:
            _log.warning(
                "lake commit done (%d runs); test hook: pausing %.1f s before the local mark",
                len(outcome.inserted),
                settings.pause_after_commit_seconds,
            )
            time.sleep(settings.pause_after_commit_seconds)
        shipped = [*outcome.inserted, *outcome.mine]
        # The mark's time is the store's clock, as decided_unix_nano (the floor's rule).
        mark_ns = max(int(self._clock() * _NS), now_ns)
        self._run_task(lambda con: mark_shipped(con, shipped, outcome.skipped, mark_ns)).result(
            timeout=120
        )
        if outcome.skipped:
            _log.info(
                "lake: %d runs already shipped by another collector, skipped",
                len(outcome.skipped),
            )
        if self._on_shipped is not None:
            lags = [(outcome.commit_ns - batch.last_seen[k]) / _NS for k in outcome.inserted]
            self._on_shipped(len(outcome.inserted), len(outcome.skipped), lags)
        return len(finished) >= settings.batch_runs
