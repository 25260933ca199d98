"""The store's writer: one thread, a bounded queue, group commit, maintenance.

The collector owns one DuckDB file (STYLE rule 8). :class:`Store` runs one writer thread
that owns the write connection and a bounded queue in front of it:

- :meth:`Store.submit` enqueues a :class:`~loopwatch.collector.rows.MappedBatch` and
  returns a :class:`~concurrent.futures.Future` resolved only after the batch's rows are
  committed (acknowledge the OTLP request then, never before). A full queue raises
  :class:`~loopwatch.collector.errors.QueueFull` at once (answer 429/503): backpressure,
  never a silent drop.
- Group commit: the writer drains what is queued (up to ``max_group_spans``), writes it
  all in one transaction through Arrow tables, commits, then resolves every future. If
  the group fails, each batch is retried alone so one bad batch fails only its own future.
- Crash safety: DuckDB's write-ahead log; a resolved future means the rows survive a
  ``kill -9`` of the process (``tests/integration/test_store_crash.py``). The writer
  checkpoints between groups, after the futures are resolved (see
  ``StoreConfig.checkpoint_wal_bytes``), not inside a group's ``COMMIT``. The file is
  attached with ``ROW_GROUP_SIZE`` (``StoreConfig.row_group_rows``): the vacuum that
  merges the small row groups checkpoints leave then rewrites at most three of that size
  at once (:func:`~loopwatch.collector.store.settings.default_row_group_rows`).
- Cost per group does not grow with the stored runs, and neither does memory: runs are
  keyed by a 64-bit hash of the run id (``run_key``) with no key index (schema 21: an ART
  index lives in DuckDB's memory, 45 bytes a run, and the soak's collector grew with it).
  Only keys that :class:`~loopwatch.collector.store.keys.RunKeyFilter` (a Bloom filter of
  every stored run key, refilled at open) may hold are read: a group of new runs costs
  no read at all. The others are read in tiers of ``last_seen_unix_nano`` (two minutes,
  half an hour, then the whole table: :meth:`~loopwatch.collector.store.apply.
  GroupWriter.fetch_stored`), which DuckDB's zone maps answer from the newest row
  groups, since every write of a run appends it with the writer's clock. The group's
  touched runs are read once, merged in Python, then deleted (bounded by the oldest row
  read) and re-inserted (DuckDB's ``ON CONFLICT DO UPDATE`` and join-based ``UPDATE`` cost
  10-80 ms per statement here); rows are appended from Arrow tables.
  Span keys are checked in memory and appended to an index-free table: a primary key
  over random 128-bit keys cost 5-12 us per key to insert and made every checkpoint
  rewrite the whole index (150 ms at 400k keys, 1 s at 2.5M, measured here).

Write semantics (each rule has a test in ``tests/unit/test_store.py``; run assembly in
:mod:`loopwatch.collector.runs`, the group's application in :mod:`.apply`):

- Idempotent by span: every row carries its span's ``(trace_id, span_id)``; spans already
  stored (client retries) or repeated within the group are skipped whole. The keys of
  the last ``dedup_retention_seconds`` (default one hour), at most ``dedup_max_keys`` of
  them, are held in memory and checked there; ``spans_seen`` records them in the same
  transaction as the rows and refills the memory at open, so deduplication survives a
  restart. A retry older than that window would be stored again.

Retention (``StoreConfig.retention_seconds``, off by default): the periodic maintenance
removes decided runs whose last span arrived longer ago than that, with every row that
names them, in transactions of ``prune_max_runs`` runs. A span of a removed run arriving
later starts a new run row (its stop is counted again). A canary flag goes with the last
run it names (a flag by trace id then no longer marks later runs of that trace).
Fleet mode (``keep_unshipped``, ``shipped_retention_seconds``): retention removes only
runs marked in ``shipped_runs``, and removes those once shipped longer ago than
``shipped_retention_seconds``. :meth:`Store.run_task` runs a short task (the shipper's
marks) on the writer thread between groups, in its own transaction.

``/metrics`` counters start from zero with the process (Prometheus' ``rate()`` and
``increase()`` handle the reset); the totals live in these tables, read by the API.

Reads (:class:`StoreReader`) run on their own cursors with a time limit and a row cap,
parameterized SQL only, so they never block or starve the writer.

Schema: :mod:`loopwatch.collector.store.schema`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import duckdb
import nanoarrow
import numpy as np

from ..errors import QueueFull, StoreClosed, StoreError, StoreUnavailable
from ..process_memory import trim_heap
from ..rows import MappedBatch, StepRow, StopRow
from ..runs import Group
from ..sample import Sampler, hour_bucket
from .apply import GroupWriter
from .keys import RecentKeys, RunKeyFilter
from .reader import StoreReader
from .schema import apply_migrations, key_list
from .settings import ALIAS, StoreConfig, memory_settings, open_file

__all__ = [
    "CHECKPOINT_HEADROOM",
    "CommitResult",
    "CommitStats",
    "Store",
    "StoreConfig",
    "memory_settings",
]

logger = logging.getLogger("loopwatch.collector.store")

_NS: Final = 1_000_000_000
_T = TypeVar("_T")

CHECKPOINT_HEADROOM: Final = 0.5
"""How much a checkpoint may use past ``memory_limit_bytes``, as a fraction of it (0.5: up
to 1.5 times the budget, 96 MiB for the default 64, for the checkpoint's length;
:meth:`Store._checkpoint_with_headroom`). The failure it prevents wanted one more 256 KiB
block; DuckDB may keep blocks cached up to the raised limit while the checkpoint runs, so
the headroom is a visible RSS spike, and is kept to half the budget."""

_ALLOCATOR_FLUSH_BYTES: Final = 16 << 20
"""Freed memory DuckDB's allocator may keep before handing it back to the system. DuckDB's
defaults (128 MiB, and 512 MiB after a bulk free) sit outside ``memory_limit``, so a
sidecar's resident memory could exceed its budget by that much."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a committed batch became; the value of :meth:`Store.submit`'s future.

    Attributes:
        spans: distinct span keys in the batch.
        new_span_keys: ``(trace_id, span_id)`` stored now; the rest were duplicates.
            Count metrics over these only, so retries do not count twice.
        counted_stops: the batch's stops to count as their run's stop, at most one per
            run: the strongest stop of the first request that brought the run a stop
            (module docstring, "Metrics count"). Count exactly these; the rest are
            duplicates, outranked, or replace a stop counted before.
        group_batches / group_spans: size of the group committed together.
        commit_seconds: wall time of the group's transaction.
    """

    spans: int
    new_span_keys: frozenset[tuple[str, str]]
    counted_stops: tuple[StopRow, ...]
    group_batches: int
    group_spans: int
    commit_seconds: float

    @property
    def duplicates(self) -> int:
        """Spans of the batch that were already stored."""
        return self.spans - len(self.new_span_keys)


@dataclass(frozen=True, slots=True)
class CommitStats:
    """Passed to the ``on_commit`` hook after each group (for self-metrics)."""

    batches: int
    spans: int
    new_spans: int
    commit_seconds: float
    queue_spans: int


@dataclass(slots=True)
class _Job:
    batch: MappedBatch
    future: Future[Any]
    spans: int


class Store:
    """The collector's DuckDB file: one writer thread, group commit, read helpers.

    Args:
        path: DuckDB file (created with the current schema, or migrated up).
        config: settings; validated here.
        clock: wall clock in epoch seconds (first/last seen, sampling hours, timeouts,
            dedup retention); injectable for tests.
        on_commit: called on the writer thread after each committed group; exceptions
            it raises are logged and ignored.

    Raises:
        ValueError: invalid config.
        SchemaTooNew: the file comes from a newer loopwatch.
        StoreUnavailable: the file cannot be opened (held by another process: DuckDB
            allows one writer; missing folder; not a DuckDB file) or migrated.

    Example:
        >>> with Store("loopwatch.duckdb") as store:  # doctest: +SKIP
        ...     result = store.submit(MapStage().process(batch)).result(timeout=10)
        ...     page = store.reader().list_runs(stop_reason="repeated_action")
    """

    def __init__(
        self,
        path: str | Path,
        *,
        config: StoreConfig | None = None,
        clock: Callable[[], float] = time.time,
        on_commit: Callable[[CommitStats], None] | None = None,
    ) -> None:
        self.config = config if config is not None else StoreConfig()
        self.config.validate()
        self.path = Path(path)
        self._clock = clock
        self._on_commit = on_commit
        try:
            self._con = open_file(self.path, self.config)
        except duckdb.Error as exc:
            raise StoreUnavailable(str(path), exc) from None
        self._wal_path = Path(f"{self.path}.wal")
        self._recent = RecentKeys(
            int(self.config.dedup_retention_seconds * _NS), self.config.dedup_max_keys
        )
        try:
            self._con.execute(
                f"SET checkpoint_threshold = '{8 * self.config.checkpoint_wal_bytes}B'"
            )
            self._memory_limit_bytes = -1
            self._fit_memory_limit()
            self._con.execute(f"SET allocator_flush_threshold = '{_ALLOCATOR_FLUSH_BYTES}B'")
            self._con.execute(
                f"SET allocator_bulk_deallocation_flush_threshold = '{_ALLOCATOR_FLUSH_BYTES}B'"
            )
            self.schema_version = apply_migrations(self._con)
            self._load_recent_keys()
            self._stored_runs = RunKeyFilter()
            self._load_run_keys()
            self.pending_at_open = [
                (StepRow(*json.loads(row)), parent)
                for row, parent in self._con.execute(
                    "SELECT row, parent_span_id FROM pending_steps ORDER BY received_unix_nano"
                ).fetchall()
            ]
            """The pending steps stored (``(step, parent span id)``), for
            :meth:`~loopwatch.collector.map.MapStage.restore`."""
            self._read_root = self._con.cursor()
        except duckdb.Error as exc:
            self._con.close()
            raise StoreUnavailable(str(path), exc) from None
        except BaseException:
            self._con.close()
            raise
        self._writer = GroupWriter(
            self._con,
            sampler=Sampler(self.config.sampling),
            recent=self._recent,
            stored_runs=self._stored_runs,
            clock=clock,
        )
        self._reader = StoreReader(
            self.read_cursor,
            timeout_seconds=self.config.read_timeout_seconds,
            max_rows=self.config.read_max_rows,
        )
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._queued_spans = 0
        self._closing = False
        self._closed = False
        self._maintenance_requests: list[Future[int]] = []
        self._tasks: list[tuple[Callable[[duckdb.DuckDBPyConnection], Any], Future[Any]]] = []
        self._last_maintenance = time.monotonic()
        self._prune_due = False
        self.pruned_runs = 0
        self._thread = threading.Thread(target=self._run, name="loopwatch-store", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queue_spans(self) -> int:
        """Spans waiting for the writer (the ``queue_depth`` gauge)."""
        return self._queued_spans

    @property
    def queue_batches(self) -> int:
        """Batches waiting for the writer."""
        return len(self._queue)

    def reader(self) -> StoreReader:
        """Read helpers on this store's file (thread-safe; never blocks the writer)."""
        return self._reader

    def submit(self, batch: MappedBatch) -> Future[CommitResult]:
        """Queue a batch for the next group commit; never blocks.

        Returns:
            A future resolved with :class:`CommitResult` after the batch is committed,
            or failed with :class:`StoreError`. Acknowledge the OTLP request only then.

        Raises:
            QueueFull: the queue holds ``max_queue_spans`` spans already.
            StoreClosed: :meth:`close` was called.
        """
        weight = max(1, batch.spans_in, len(batch.runs) + len(batch.steps) + len(batch.stops))
        future: Future[CommitResult] = Future()
        with self._cond:
            if self._closing:
                raise StoreClosed()
            limit = self.config.max_queue_spans
            if self._queued_spans and self._queued_spans + weight > limit:
                raise QueueFull(capacity=limit, retry_after_seconds=1)
            self._queue.append(_Job(batch, future, weight))
            self._queued_spans += weight
            self._cond.notify()
        return future

    def run_maintenance(self) -> Future[int]:
        """Ask the writer to decide timed-out runs and prune old keys now.

        Returns:
            A future with the number of runs decided by timeout.

        Raises:
            StoreClosed: :meth:`close` was called.
        """
        future: Future[int] = Future()
        with self._cond:
            if self._closing:
                raise StoreClosed()
            self._maintenance_requests.append(future)
            self._cond.notify()
        return future

    def run_task(self, task: Callable[[duckdb.DuckDBPyConnection], _T]) -> Future[_T]:
        """Run ``task(connection)`` on the writer thread, between groups, in its own
        transaction (the one writer of STYLE rule 8; fleet mode marks shipped runs so).

        Keep it short: groups wait while it runs. A task that raises is rolled back.

        Returns:
            A future with the task's value, set after the commit (or its exception).

        Raises:
            StoreClosed: :meth:`close` was called.
        """
        future: Future[_T] = Future()
        with self._cond:
            if self._closing:
                raise StoreClosed()
            self._tasks.append((task, future))
            self._cond.notify()
        return future

    def read_cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on the file for a background reader (its own MVCC snapshot per
        transaction; it never blocks the writer). The caller closes it."""
        cursor = self._read_root.cursor()
        try:
            # USE is per cursor: each is its own client context, whose default is memory.
            cursor.execute(f"USE {ALIAS}")
        except BaseException:
            cursor.close()
            raise
        return cursor

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Commit what is queued, stop the writer, checkpoint and close the file.

        Blocks up to ``timeout_seconds`` for the queue to drain (call it on SIGTERM; it
        also runs at interpreter exit if not called). Idempotent.
        """
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_seconds)
        if self._thread.is_alive():
            logger.error("store writer did not stop within %.1f s", timeout_seconds)
            return
        self._closed = True
        atexit.unregister(self.close)
        with contextlib.suppress(duckdb.Error):
            self._con.execute("CHECKPOINT")
        self._read_root.close()
        self._con.close()

    def _run(self) -> None:
        interval = self.config.maintenance_interval_seconds
        while True:
            with self._cond:
                while (
                    not self._queue
                    and not self._maintenance_requests
                    and not self._tasks
                    and not self._closing
                    and not self._prune_due
                ):
                    waited = time.monotonic() - self._last_maintenance
                    if waited >= interval:
                        break
                    self._cond.wait(interval - waited)
                jobs: list[_Job] = []
                spans = 0
                limit = self.config.max_group_spans
                while self._queue and (not jobs or spans + self._queue[0].spans <= limit):
                    job = self._queue.popleft()
                    spans += job.spans
                    jobs.append(job)
                self._queued_spans -= spans
                requests, self._maintenance_requests = self._maintenance_requests, []
                tasks, self._tasks = self._tasks, []
                stop = self._closing and not self._queue and not jobs
            live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if live:
                self._commit_group(live)
            for task, future in tasks:
                self._run_task(task, future)
            if requests or time.monotonic() - self._last_maintenance >= interval:
                self._maintain(requests)
            elif self._prune_due and not self._queue:
                self._prune()
            if stop:
                return
            self._checkpoint_if_due()

    def _checkpoint_if_due(self) -> None:
        """Checkpoint between groups: when idle past the threshold, or at four times it.

        Runs after the last group's futures are resolved, so no acknowledgement waits for
        it (DuckDB's automatic checkpoint would run inside that group's ``COMMIT``).
        """
        try:
            wal_bytes = self._wal_path.stat().st_size
        except OSError:
            return
        threshold = self.config.checkpoint_wal_bytes
        if wal_bytes < threshold or (self._queue and wal_bytes < 4 * threshold):
            return
        self._fit_memory_limit()
        started = time.perf_counter()
        try:
            self._checkpoint_with_headroom()
        except duckdb.Error:
            logger.exception("store checkpoint failed")
            return
        logger.debug(
            "store checkpoint: %.0f ms at a %d MiB log, %d batches waiting",
            (time.perf_counter() - started) * 1e3,
            wal_bytes >> 20,
            len(self._queue),
        )

    def _commit_group(self, jobs: list[_Job]) -> None:
        started = time.perf_counter()
        self._writer.after_commit.clear()
        try:
            self._con.execute("BEGIN TRANSACTION")
            outcomes = self._writer.write([job.batch for job in jobs])
            self._con.execute("COMMIT")
        except Exception as exc:
            self._writer.after_commit.clear()
            with contextlib.suppress(duckdb.Error):
                self._con.execute("ROLLBACK")
            if len(jobs) > 1:
                for job in jobs:
                    self._commit_group([job])
                return
            logger.exception("store write failed")
            jobs[0].future.set_exception(StoreError(type(exc).__name__))
            return
        self._committed()
        seconds = time.perf_counter() - started
        group_spans = sum(o[0] for o in outcomes)
        new_spans = sum(len(o[1]) for o in outcomes)
        for job, (spans, new, counted) in zip(jobs, outcomes, strict=True):
            job.future.set_result(
                CommitResult(spans, new, counted, len(jobs), group_spans, seconds)
            )
        if self._on_commit is not None:
            try:
                self._on_commit(
                    CommitStats(len(jobs), group_spans, new_spans, seconds, self._queued_spans)
                )
            except Exception:
                logger.exception("on_commit hook failed")

    def _run_task(
        self, task: Callable[[duckdb.DuckDBPyConnection], Any], future: Future[Any]
    ) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            self._con.execute("BEGIN TRANSACTION")
            value = task(self._con)
            self._con.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(duckdb.Error):
                self._con.execute("ROLLBACK")
            future.set_exception(exc)
            return
        future.set_result(value)

    def _committed(self) -> None:
        """Publish the in-memory state of the transaction just committed."""
        hooks, self._writer.after_commit = self._writer.after_commit, []
        for hook in hooks:
            hook()

    def _load_recent_keys(self) -> None:
        """Fill the dedup window from ``spans_seen`` (newest ``dedup_max_keys`` in retention)."""
        now_ns = int(self._clock() * _NS)
        since = now_ns - int(self.config.dedup_retention_seconds * _NS)
        rows = self._con.execute(
            "SELECT span_key, trace_key, seen_unix_nano FROM spans_seen "
            "WHERE seen_unix_nano >= ? ORDER BY seen_unix_nano DESC LIMIT ?",
            [since, self.config.dedup_max_keys],
        ).fetchall()
        slice_keys: set[int] = set()
        slice_ns: int | None = None
        for span_key, trace_key, seen_ns in reversed(rows):
            if slice_ns is not None and seen_ns != slice_ns:
                self._recent.add(slice_keys, slice_ns)
                slice_keys = set()
            slice_ns = seen_ns
            slice_keys.add((int(span_key) << 64) | int(trace_key))
        if slice_ns is not None:
            self._recent.add(slice_keys, slice_ns)

    def _load_run_keys(self) -> None:
        """Fill the run-key filter from ``runs``, a batch of keys at a time (DuckDB's
        Arrow batches: a million keys, 8 MiB, read as ``uint64`` without a copy)."""
        stream = nanoarrow.ArrayStream(self._con.sql("SELECT run_key FROM runs"))
        for batch in stream:
            keys = batch.child(0)  # run_key is NOT NULL: no validity to read
            data = np.frombuffer(keys.buffer(1), dtype=np.uint64)
            self._stored_runs.add_array(data[keys.offset : keys.offset + len(keys)])

    def _checkpoint_with_headroom(self) -> None:
        """``CHECKPOINT`` with DuckDB's limit raised by :data:`CHECKPOINT_HEADROOM` of the
        budget for its length, then set back.

        DuckDB invalidates the whole database when a checkpoint cannot allocate a block
        ("Checkpoint failed ... The database has been invalidated", DuckDB 1.5.5), and
        every later write fails. Readers on other cursors (the read API, the lake
        shipper) hold working memory in the same pool, so a checkpoint at the limit is a
        matter of timing: ``bench_lake_ship.py`` at capacity hit it once, with 64 MiB
        used of 64. The headroom is used only by a checkpoint that needs it; the limit
        is back before the next group commits.

        Raises:
            duckdb.Error: the checkpoint failed anyway.
        """
        base = self._memory_limit_bytes
        raised = base > 0
        if raised:
            self._con.execute(f"SET memory_limit = '{int(base * (1 + CHECKPOINT_HEADROOM))}B'")
        try:
            self._con.execute("CHECKPOINT")
        finally:
            if raised:
                try:
                    self._con.execute(f"SET memory_limit = '{base}B'")
                except duckdb.Error:
                    # DuckDB keeps the raised limit when it cannot evict down to the lower
                    # one (readers holding memory): the next fit sets it again.
                    logger.warning("store memory limit not set back after a checkpoint")
                    self._memory_limit_bytes = -1

    def _fit_memory_limit(self) -> None:
        """Set DuckDB's limit to the budget plus twice the memory of its key indexes.

        A key index is an in-memory ART index that DuckDB cannot evict, and a checkpoint
        needs about as much again to write it out. Under a fixed 64 MiB limit a file of
        a million runs failed its checkpoint with a FATAL error while ``runs`` had its
        key, which invalidates the connection (measured here, DuckDB 1.5). Since schema
        21 the only key left is ``canary_flags``' (one row per flagged run, a few), so
        the limit stays at ``memory_limit_bytes``; this keeps a file whose flags grow
        from failing the same way.
        """
        try:
            row = self._con.execute(
                "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() "
                "WHERE tag = 'ART_INDEX'"
            ).fetchone()
            limit = self.config.memory_limit_bytes + 2 * int(row[0] if row else 0)
            if self._memory_limit_bytes < 0 or abs(limit - self._memory_limit_bytes) >= 1 << 20:
                self._con.execute(f"SET memory_limit = '{limit}B'")
                self._memory_limit_bytes = limit
        except duckdb.Error:
            logger.exception("store memory limit not updated")

    def _log_memory(self) -> None:
        """One debug line: DuckDB's memory by tag, its limit and the dedup window's keys,
        to see which budget grows (``log.level = "debug"``; the soak test reads it)."""
        if not logger.isEnabledFor(logging.DEBUG):
            return
        try:
            rows = self._con.execute(
                "SELECT tag, memory_usage_bytes FROM duckdb_memory() "
                "WHERE memory_usage_bytes > 0 ORDER BY tag"
            ).fetchall()
        except duckdb.Error:
            return
        tags = " ".join(f"{tag}={int(used) >> 20}" for tag, used in rows)
        logger.debug(
            "store memory MiB: duckdb %s limit=%d; dedup_keys=%d; whole-table run reads=%d",
            tags or "none",
            self._memory_limit_bytes >> 20,
            len(self._recent),
            self._writer.whole_table_reads,
        )

    def _maintain(self, requests: list[Future[int]]) -> None:
        self._last_maintenance = time.monotonic()
        self._fit_memory_limit()
        trim_heap()
        self._log_memory()
        now_s = self._clock()
        now_ns = int(now_s * _NS)
        timeout_ns = int(self.config.sampling.undecided_timeout_seconds * _NS)
        retention_ns = int(self.config.dedup_retention_seconds * _NS)
        decided = 0
        self._writer.after_commit.clear()
        try:
            self._con.execute("BEGIN TRANSACTION")
            stale = self._writer.fetch_runs(
                "sampled IS NULL AND last_seen_unix_nano < ? "
                "ORDER BY last_seen_unix_nano LIMIT 10000",
                [now_ns - timeout_ns],
            )
            if stale:
                group = Group(now_ns, [], [], [], set())
                for row in stale:
                    self._writer.adopt(group, row)
                self._writer.decide(group, [(row["run_id"], None) for row in stale])
                self._writer.write_rows(group, [])
                decided = len(stale)
            self._con.execute(
                "DELETE FROM spans_seen WHERE seen_unix_nano < ?", [now_ns - retention_ns]
            )
            self._con.execute(
                "DELETE FROM sample_quota WHERE hour_unix < ?", [hour_bucket(now_s) - 7200]
            )
            self._con.execute("COMMIT")
        except Exception as exc:
            self._writer.after_commit.clear()
            with contextlib.suppress(duckdb.Error):
                self._con.execute("ROLLBACK")
            logger.exception("store maintenance failed")
            for future in requests:
                future.set_exception(StoreError(type(exc).__name__))
            return
        self._committed()
        self._recent.expire(now_ns)
        self._prune()
        for future in requests:
            future.set_result(decided)

    def _prune(self) -> None:
        """Remove up to ``prune_max_runs`` runs past ``retention_seconds``, in one transaction.

        Undecided runs are left to the timeout decision.
        A failure rolls the whole pass back and is logged; the next maintenance retries.
        """
        self._prune_due = False
        retention = self.config.retention_seconds
        shipped = self.config.shipped_retention_seconds
        if retention <= 0 and shipped <= 0:
            return
        now_ns = int(self._clock() * _NS)
        due = []  # only integers computed here are rendered into the SQL
        if retention > 0:
            age = f"last_seen_unix_nano < {now_ns - int(retention * _NS)}"
            if self.config.keep_unshipped:
                age += " AND run_key IN (SELECT run_key FROM shipped_runs)"
            due.append(age)
        if shipped > 0:
            due.append(
                "run_key IN (SELECT run_key FROM shipped_runs "
                f"WHERE shipped_unix_nano < {now_ns - int(shipped * _NS)})"
            )
        limit = self.config.prune_max_runs
        con = self._con
        try:
            con.execute("BEGIN TRANSACTION")
            rows = con.execute(
                f"SELECT run_key FROM runs WHERE sampled IS NOT NULL AND ({' OR '.join(due)}) "
                "ORDER BY last_seen_unix_nano LIMIT ?",
                [limit],
            ).fetchall()
            if rows:
                keys = key_list(key for (key,) in rows)
                for table in (
                    "steps",
                    "staged_steps",
                    "stop_reports",
                    "stop_duplicates",
                    "run_tools",
                    "shipped_runs",
                    "runs",
                ):
                    con.execute(f"DELETE FROM {table} WHERE run_key IN ({keys})")
                # A flag names a run id or a trace id (several runs can share a trace);
                # it goes with the last run it names, whenever it was stored.
                con.execute(
                    "DELETE FROM canary_flags WHERE run_id NOT IN (SELECT run_id FROM runs) "
                    "AND run_id NOT IN (SELECT trace_id FROM runs)"
                )
            con.execute("COMMIT")
        except Exception:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            logger.exception("store retention pass failed")
            return
        if rows:
            self.pruned_runs += len(rows)
            logger.info("retention: removed %d runs (expired, or shipped to the lake)", len(rows))
        self._prune_due = len(rows) == limit
