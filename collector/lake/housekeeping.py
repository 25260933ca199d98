"""Lake housekeeping: one collector of a fleet at a time keeps the lake small and bounded.

Every shipped batch is a DuckLake snapshot and one small Parquet file per table (or rows
inlined in the catalog, for batches under DuckLake's inlining limit). Left alone, a fleet
of collectors shipping every few seconds makes millions of tiny files and snapshots,
which slows every read. A :class:`Housekeeper` runs in every collector with a lake; in
each round (every ``interval_seconds``) the one that holds the lease:

1. applies lake retention: the runs whose last span arrived more than
   ``retention_days`` ago are deleted, with their rows in every other lake table
   (``steps``, ``stops``, ``run_tools``, ``canary_flags``), children first, the run row
   last, so a round cut short leaves the run to be found again by the next one;
2. flushes rows inlined in the catalog to Parquet (``ducklake_flush_inlined_data``);
3. merges small adjacent files (``ducklake_merge_adjacent_files``) and rewrites files
   that are mostly deleted rows (``ducklake_rewrite_data_files``);
4. expires snapshots older than ``snapshot_retention_seconds``
   (``ducklake_expire_snapshots``), which ends time travel before that age;
5. deletes the files no snapshot references any more, and files no commit ever
   referenced (``ducklake_cleanup_old_files``, ``ducklake_delete_orphaned_files``; a
   collector killed mid-ship leaves the latter), once they are ``file_grace_seconds`` old,
   so a read that began on an expired snapshot still finds its files.

The lease is a row of ``loopwatch_lease(name PRIMARY KEY, holder, expires_at)`` in the
catalog's PostgreSQL database, taken and renewed by one atomic ``INSERT ... ON CONFLICT
DO UPDATE ... WHERE holder = me OR expires_at < now()``: PostgreSQL locks the row, so of
two collectors asking at once exactly one gets it (the other's statement updates nothing
and returns no row). Expiry uses the server's clock, so collectors' clocks may disagree.
A holder killed with ``kill -9`` is replaced once its lease expires (``lease_seconds``).
A row lease, rather than a session advisory lock (``pg_try_advisory_lock``), because:

- it survives connection poolers (PgBouncer in transaction mode drops session locks);
- it needs no connection held open by every collector between rounds;
- an operator sees who holds it (``SELECT * FROM loopwatch_lease``);
- a holder cut off from PostgreSQL loses it after ``lease_seconds`` instead of whenever
  TCP notices.

The lease is renewed between the steps of a round; a holder that finds it lost stops the
round. Should two rounds still overlap (a holder stalled past its lease), nothing breaks:
every step is a DuckLake transaction, and conflicting ones fail and are retried next
round. A lake whose catalog is a local ``.ducklake`` file (one machine) needs no lease:
a :class:`Housekeeper` there always works; but the collector's shipper holds that file
open, and DuckDB lets one process attach it once, so a collector does not keep house on
such a lake (:func:`housekeeper_for` returns None).

Failures never reach the collector: a round that fails is logged (catalog masked) and
tried again at the next interval. Only :meth:`Housekeeper.start`/:meth:`~Housekeeper.stop`
touch threads; :meth:`Housekeeper.run_once` is the round itself, for tests and tools.

Example::

    keeper = Housekeeper(target, "host-a", interval_seconds=300, retention_days=30)
    keeper.start()
    ...
    keeper.stop()
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from .connect import ALIAS, LakeTarget, connect_lake, mask_catalog, target_of
from .schema import LAKE_TABLES
from .ship import SHIP_LOCK_KEY

if TYPE_CHECKING:
    import duckdb
    import psycopg

    from ..config import CollectorConfig

__all__ = ["LEASE_TABLE", "Housekeeper", "LakeLease", "RoundReport", "housekeeper_for"]

logger = logging.getLogger("loopwatch.collector.lake.housekeeping")

LEASE_TABLE: Final = "loopwatch_lease"
"""The lease table in the catalog's PostgreSQL database (next to DuckLake's own tables)."""
LEASE_NAME: Final = "lake_housekeeping"
_NS_PER_DAY: Final = 86_400 * 1_000_000_000
_CONFLICT_ATTEMPTS: Final = 5
"""Tries of one retention DELETE. DuckLake refuses a delete that commits after another
transaction inserted into the same table (checked with duckdb 1.5.5): a busy fleet's
shippers insert every few seconds, and a retry a moment later usually wins."""
_WITH_SHIPPERS_HELD: Final = frozenset({"retention", "flush", "merge"})
_SHIP_LOCK_TIMEOUT: Final = "30s"
_CHILD_TABLES: Final = tuple(table for table in LAKE_TABLES if table != "runs")


class LakeLease:
    """The housekeeping lease: one row of :data:`LEASE_TABLE` in the catalog database.

    Args:
        dsn: libpq connection string of the catalog database (``LakeTarget.postgres_dsn``).
        holder: this process's name in the lease (unique per process).
        lease_seconds: how long a taken or renewed lease lasts without renewal.
        connect_timeout_seconds: libpq ``connect_timeout`` of each attempt.

    Each call opens its own short connection (psycopg, autocommit), so nothing is held
    between rounds. Calls block for at most the connect timeout plus one statement.
    """

    def __init__(
        self,
        dsn: str,
        holder: str,
        *,
        lease_seconds: float,
        connect_timeout_seconds: float = 5.0,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self.dsn = dsn
        self.holder = holder
        self.lease_seconds = float(lease_seconds)
        self._connect_timeout = max(1, round(connect_timeout_seconds))
        self._table_ready = False

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=self._connect_timeout)

    def _ensure_table(self, con: psycopg.Connection[tuple[object, ...]]) -> None:
        import psycopg

        if self._table_ready:
            return
        # Two first-ever CREATE TABLE IF NOT EXISTS racing: PostgreSQL lets one win and
        # fails the others on its catalog's unique indexes; the table is there either way.
        with contextlib.suppress(
            psycopg.errors.UniqueViolation,
            psycopg.errors.DuplicateTable,
            psycopg.errors.DuplicateObject,
        ):
            con.execute(
                f"CREATE TABLE IF NOT EXISTS {LEASE_TABLE} (name text PRIMARY KEY, "
                "holder text NOT NULL, expires_at timestamptz NOT NULL)"
            )
        self._table_ready = True

    def acquire(self) -> bool:
        """Take the lease, or renew it when this holder has it; True when held now.

        Raises:
            psycopg.Error: the catalog database did not answer.
        """
        with self._connect() as con:
            self._ensure_table(con)
            row = con.execute(
                f"INSERT INTO {LEASE_TABLE} AS lease (name, holder, expires_at) "
                "VALUES (%s, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
                "expires_at = excluded.expires_at "
                "WHERE lease.holder = excluded.holder OR lease.expires_at < now() "
                "RETURNING holder",
                (LEASE_NAME, self.holder, self.lease_seconds),
            ).fetchone()
        return row is not None

    def release(self) -> None:
        """Give the lease up now if this holder has it (a clean stop); never raises."""
        import psycopg

        try:
            with self._connect() as con:
                self._ensure_table(con)
                con.execute(
                    f"DELETE FROM {LEASE_TABLE} WHERE name = %s AND holder = %s",
                    (LEASE_NAME, self.holder),
                )
        except psycopg.Error as exc:
            logger.warning("lake housekeeping: could not release the lease (%s)", _first(exc))

    def current_holder(self) -> str | None:
        """Who holds an unexpired lease now, or None.

        Raises:
            psycopg.Error: the catalog database did not answer.
        """
        with self._connect() as con:
            self._ensure_table(con)
            row = con.execute(
                f"SELECT holder FROM {LEASE_TABLE} WHERE name = %s AND expires_at >= now()",
                (LEASE_NAME,),
            ).fetchone()
        return None if row is None else str(row[0])


@dataclass
class RoundReport:
    """What one round did.

    Attributes:
        worked: the lease was held and the round ran (False: another holder has it, or
            the catalog did not answer; see ``error``).
        holder: this housekeeper's lease name.
        runs_deleted: runs removed by retention (their rows in the other tables too).
        rows_flushed: inlined rows written to Parquet.
        files_merged: small files merged (``files_processed`` of the merge).
        files_rewritten: files rewritten to drop deleted rows.
        snapshots_expired: snapshots expired.
        files_deleted: files removed from the data path (old and orphaned).
        errors: ``step: first line`` of each step that failed (catalog masked).
        seconds: wall time of the round.
    """

    worked: bool
    holder: str
    runs_deleted: int = 0
    rows_flushed: int = 0
    files_merged: int = 0
    files_rewritten: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


class LeaseLost(Exception):
    """The lease expired or went to another holder during a round."""


class Housekeeper:
    """Lake housekeeping for one collector: a daemon thread running a round per interval.

    Args:
        target: the lake.
        collector_id: this collector's id (``--collector-id``); the lease holder is
            ``collector_id/pid/random``, unique even when two collectors share an id.
        interval_seconds: time between rounds (> 0).
        retention_days: lake retention by a run's last span (``runs.last_seen_unix_nano``);
            0 keeps every run.
        lease_seconds: lease duration; default ``max(2 * interval_seconds, 60)``, so a
            holder keeps it from one round to the next and a killed one is replaced
            within two intervals.
        snapshot_retention_seconds: snapshots older than this are expired.
        file_grace_seconds: files are deleted once unreferenced (or orphaned) this long.
        clock_ns: the clock of retention's cutoff (nanoseconds since the epoch).

    Raises:
        ValueError: a non-positive interval, lease or negative retention.
    """

    def __init__(
        self,
        target: LakeTarget,
        collector_id: str,
        *,
        interval_seconds: float = 300.0,
        retention_days: float = 0.0,
        lease_seconds: float | None = None,
        snapshot_retention_seconds: float = 3_600.0,
        file_grace_seconds: float = 600.0,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds!r}")
        for name, value in (
            ("retention_days", retention_days),
            ("snapshot_retention_seconds", snapshot_retention_seconds),
            ("file_grace_seconds", file_grace_seconds),
        ):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self.target = target
        self.holder = f"{collector_id}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self.interval_seconds = float(interval_seconds)
        self.retention_days = float(retention_days)
        self.snapshot_retention_seconds = float(snapshot_retention_seconds)
        self.file_grace_seconds = float(file_grace_seconds)
        self._clock_ns = clock_ns
        seconds = max(2 * self.interval_seconds, 60.0) if lease_seconds is None else lease_seconds
        self.lease: LakeLease | None = (
            LakeLease(target.postgres_dsn, self.holder, lease_seconds=seconds)
            if target.is_postgres
            else None
        )
        self.rounds_worked = 0
        self.rounds_skipped = 0
        self.last_report: RoundReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        """Start the rounds in a daemon thread (the first after a random part of one
        interval, so a fleet started together does not ask for the lease at once)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, name="loopwatch-lake-housekeeping", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """End the thread after its current step and give the lease up.

        Blocks up to ``timeout_seconds`` for a round in progress.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_seconds)
        if self.lease is not None:
            self.lease.release()

    def _loop(self) -> None:
        delay = random.uniform(0.1, 1.0) * self.interval_seconds  # jitter, not security
        while not self._stop.wait(delay):
            self.run_once()
            delay = self.interval_seconds

    # ------------------------------------------------------------------- round

    def run_once(self) -> RoundReport:
        """One round: take the lease, then each step in order; never raises.

        Returns:
            What the round did; ``worked`` is False when the lease is held elsewhere or
            the catalog did not answer.
        """
        started = time.monotonic()
        report = RoundReport(worked=False, holder=self.holder)
        try:
            held = self._renew()
        except Exception as exc:  # psycopg.Error: the catalog is down; try next round
            report.errors.append(f"lease: {_first(exc)}")
            logger.warning("lake housekeeping: cannot reach the catalog (%s)", _first(exc))
            held = False
        if not held:
            self.rounds_skipped += 1
            self.last_report = report
            return report
        report.worked = True
        self.rounds_worked += 1
        try:
            con = connect_lake(self.target, threads=1)
        except Exception as exc:  # LakeUnavailable
            report.errors.append(f"attach: {_first(exc)}")
            logger.warning("lake housekeeping: %s", _first(exc))
        else:
            try:
                self._steps(con, report)
            except LeaseLost:
                report.errors.append("lease: lost during the round")
                logger.warning("lake housekeeping: lease lost mid-round; another holder goes on")
            finally:
                con.close()
        report.seconds = time.monotonic() - started
        self.last_report = report
        if report.errors:
            logger.warning("lake housekeeping: round ended with %s", "; ".join(report.errors))
        else:
            logger.info("lake housekeeping: %s", report)
        return report

    def _renew(self) -> bool:
        return True if self.lease is None else self.lease.acquire()

    def _steps(self, con: duckdb.DuckDBPyConnection, report: RoundReport) -> None:
        steps: tuple[tuple[str, Callable[[duckdb.DuckDBPyConnection, RoundReport], None]], ...] = (
            ("retention", self._retention),
            ("flush", self._flush),
            ("merge", self._merge),
            ("expire", self._expire),
            ("cleanup", self._cleanup),
        )
        for name, step in steps:
            if self._stop.is_set():
                return
            if not self._renew():
                raise LeaseLost
            try:
                if name in _WITH_SHIPPERS_HELD:
                    with self._shippers_held():
                        step(con, report)
                else:
                    step(con, report)
            except Exception as exc:  # duckdb.Error, psycopg.Error; the next round retries
                report.errors.append(f"{name}: {_first(exc)}")

    @contextlib.contextmanager
    def _shippers_held(self) -> Iterator[None]:
        """Hold the shippers' advisory lock (:data:`~.ship.SHIP_LOCK_KEY`) for a step.

        A DuckLake DELETE refuses to commit after a concurrent INSERT into its table, and
        makes a concurrent INSERT fail (checked with duckdb 1.5.5); every shipper takes
        this lock around its lake transaction, so under it retention, the flush of
        inlined rows and the merge meet no shipper. The merge needs it because a shipper
        also rewrites lake rows (a fragment folded into its trace's run: UPDATE, DELETE,
        :mod:`.fold`): a merge that committed during a fold put the folded fragment's
        run row back and its steps twice (seen in ``tests/integration/test_fleet.py``,
        2026-12-04). Expiry and cleanup touch no live row and run without it.

        Raises:
            psycopg.Error: the catalog did not answer, or the lock did not come within
                ``lock_timeout`` (the step is skipped this round).
        """
        if not self.target.is_postgres:
            yield
            return
        import psycopg

        with psycopg.connect(
            self.target.postgres_dsn, autocommit=True, connect_timeout=5
        ) as lock_con:
            lock_con.execute(f"SET lock_timeout = '{_SHIP_LOCK_TIMEOUT}'")
            lock_con.execute("SELECT pg_advisory_lock(%s)", (SHIP_LOCK_KEY,))
            try:
                yield
            finally:
                with contextlib.suppress(psycopg.Error):  # closing the session releases it
                    lock_con.execute("SELECT pg_advisory_unlock(%s)", (SHIP_LOCK_KEY,))

    def _retention(self, con: duckdb.DuckDBPyConnection, report: RoundReport) -> None:
        if self.retention_days <= 0:
            return
        cutoff = self._clock_ns() - round(self.retention_days * _NS_PER_DAY)
        old = f"SELECT run_id FROM {ALIAS}.runs WHERE last_seen_unix_nano < ?"
        # Even a DELETE that matches nothing makes a concurrent shipper's INSERT into that
        # table fail its commit (and retry): look before deleting.
        if not _scalar(con, f"SELECT count(*) FROM ({old})", [cutoff]):
            return
        for table in _CHILD_TABLES:
            _retry_conflicts(con, f"DELETE FROM {ALIAS}.{table} WHERE run_id IN ({old})", [cutoff])
        report.runs_deleted = _retry_conflicts(
            con, f"DELETE FROM {ALIAS}.runs WHERE last_seen_unix_nano < ?", [cutoff]
        )

    def _flush(self, con: duckdb.DuckDBPyConnection, report: RoundReport) -> None:
        report.rows_flushed = _scalar(
            con,
            f"SELECT coalesce(sum(rows_flushed), 0)::BIGINT "
            f"FROM ducklake_flush_inlined_data('{ALIAS}')",
        )

    def _merge(self, con: duckdb.DuckDBPyConnection, report: RoundReport) -> None:
        report.files_merged = _scalar(
            con,
            f"SELECT coalesce(sum(files_processed), 0)::BIGINT "
            f"FROM ducklake_merge_adjacent_files('{ALIAS}')",
        )
        report.files_rewritten = _scalar(
            con, f"SELECT count(*) FROM ducklake_rewrite_data_files('{ALIAS}')"
        )

    def _expire(self, con: duckdb.DuckDBPyConnection, report: RoundReport) -> None:
        # count(*) rather than the rows: fetching their TIMESTAMP WITH TIME ZONE column
        # into Python needs pytz.
        report.snapshots_expired = _scalar(
            con,
            f"SELECT count(*) FROM ducklake_expire_snapshots('{ALIAS}', "
            "older_than => now() - to_seconds(?))",
            [self.snapshot_retention_seconds],
        )

    def _cleanup(self, con: duckdb.DuckDBPyConnection, report: RoundReport) -> None:
        deleted = 0
        for function in ("ducklake_cleanup_old_files", "ducklake_delete_orphaned_files"):
            deleted += _scalar(
                con,
                f"SELECT count(*) FROM {function}('{ALIAS}', older_than => now() - to_seconds(?))",
                [self.file_grace_seconds],
            )
        report.files_deleted = deleted


def housekeeper_for(config: CollectorConfig) -> Housekeeper | None:
    """The housekeeper a collector runs, from ``[lake]`` and ``[lake_housekeeping]``.

    Returns:
        None when no lake is configured, ``lake_housekeeping.enabled`` is off, or the
        catalog is a local file (the shipper holds it; see the module docstring); else a
        :class:`Housekeeper`, not started (the caller owns :meth:`~Housekeeper.start` and
        :meth:`~Housekeeper.stop`).
    """
    lake, settings = config.lake, config.lake_housekeeping
    if not lake.enabled or not settings.enabled:
        return None
    target = target_of(config)
    if not target.is_postgres:
        return None
    return Housekeeper(
        target,
        lake.collector_id,
        interval_seconds=settings.interval_seconds,
        retention_days=settings.retention_days,
        lease_seconds=settings.lease_seconds or None,
        snapshot_retention_seconds=settings.snapshot_retention_seconds,
    )


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None) -> int:
    """The one integer ``sql`` answers.

    The whole result is fetched: a DuckLake function whose result is left partly read
    (``fetchone``) does not commit its transaction before the next statement (checked
    with duckdb 1.5.5: a merge read that way was never visible).
    """
    rows = con.execute(sql, params or []).fetchall()
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def _retry_conflicts(con: duckdb.DuckDBPyConnection, sql: str, params: list[object]) -> int:
    """Run one DELETE in its own transaction, again after a write conflict; rows deleted.

    Raises:
        duckdb.TransactionException: still conflicting after the last try.
        duckdb.Error: any other failure.
    """
    import duckdb

    for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
        try:
            return _scalar(con, sql, params)
        except duckdb.TransactionException:
            if attempt == _CONFLICT_ATTEMPTS:
                raise
            time.sleep(random.uniform(0.05, 0.3) * attempt)  # jitter, not security
    return 0


def _first(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return mask_catalog(text)[:300]
