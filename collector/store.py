"""DuckDB storage: one writer thread, group commit, sampling, and the read helpers.

The collector owns one DuckDB file (STYLE rule 8). :class:`Store` runs one writer thread
that owns the write connection and a bounded queue in front of it:

- :meth:`Store.submit` enqueues a :class:`~loopwatch.collector.events.MappedBatch` and
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
  ``StoreConfig.checkpoint_wal_bytes``), not inside a group's ``COMMIT``.
- Cost per group stays flat as tables grow: runs and stops are keyed by a 64-bit hash of
  the run id (``run_key``) and touched through literal key lists, which DuckDB answers with
  primary-key index lookups; rows are appended from Arrow tables; the group's touched runs
  are read once, merged in Python, then deleted and re-inserted (DuckDB's
  ``ON CONFLICT DO UPDATE`` and join-based ``UPDATE`` cost 10-80 ms per statement here).
  Only keys that :class:`~loopwatch.collector.runkeys.RunKeyFilter` (a Bloom filter of
  every stored run key, refilled at open) may hold are read: a group of new runs costs
  no read at all.
  Span keys are checked in memory and appended to an index-free table: a primary key
  over random 128-bit keys cost 5-12 us per key to insert and made every checkpoint
  rewrite the whole index (150 ms at 400k keys, 1 s at 2.5M, measured here).

Write semantics (each rule has a test in ``tests/unit/test_store.py``):

- Idempotent by span: every row carries its span's ``(trace_id, span_id)``; spans already
  stored (client retries) or repeated within the group are skipped whole. The keys of
  the last ``dedup_retention_seconds`` (default one hour), at most ``dedup_max_keys`` of
  them, are held in memory and checked there; ``spans_seen`` records them in the same
  transaction as the rows and refills the memory at open, so deduplication survives a
  restart. A retry older than that window would be stored again.
- Runs are merged: any span of a run may arrive first. The run span's fields win, times
  widen, counts (steps = highest step index, decisions, tool calls, errors, blocked,
  tokens) add up over new spans only.
- Steps of a run are staged (``staged_steps``, bounded by the undecided runs) until the
  run's sampling decision, then moved to ``steps`` (sampled) or deleted (not sampled);
  when the decision falls in the same group they go straight to their table. Steps
  arriving after the decision go to ``steps`` or are dropped; they always count.
- Third-party steps first filed under their trace id move to the agent run when the map
  stage says so (:class:`~loopwatch.collector.events.RunReassignment`), with their counts,
  highest step and times: the trace-level run's are those of what it keeps (its run
  span, stops and remaining steps), as if the steps had never been filed under it; the
  emptied trace-level run row is deleted.
- Stops: one primary stop per run in ``stops``. Precedence ``stop_span`` > ``run_span`` >
  ``inferred`` (:data:`~loopwatch.collector.events.STOP_ORIGINS`). A stronger stop
  replaces a weaker one and a weaker one is ignored, in either arrival order (a loopwatch
  run span repeats its stop span's reason; an inferred stop is a fallback), so the result
  does not depend on export order. A second stop of the same strength is a
  duplicate-stop anomaly: kept in ``stop_anomalies`` (``kind='duplicate_stop'``), counted
  in ``runs.duplicate_stops``, and never overwrites the first: the first report is what
  any alert already fired on, and "exactly one stop per run" stays checkable.
- Metrics count a run's stop once: the first request that brings the run a stop counts
  its strongest one, whatever its origin (a loopwatch run span whose stop span was lost
  still counts; a run span and its stop span in one request count the stop span). A
  stronger stop in a later request replaces the row in ``stops`` but not the count: the
  replaced row moves to ``stop_anomalies`` (``kind='replaced_stop'``) with its
  ``counted`` flag, and the new row has ``counted = false``. Requests committed in one
  group are applied in order, each as a unit, so grouping never changes what is counted
  or kept. :attr:`CommitResult.counted_stops` says what to count.
- Sampling (:mod:`loopwatch.collector.sampling`) is decided once, when a run's first
  primary stop is committed, or by the periodic maintenance for runs with no stop and no
  new span for ``undecided_timeout_seconds``. A stop replacing another later does not
  re-decide (deleted steps cannot come back). The hourly cap's tool is the run's most
  called tool among the calls known at that request (earlier groups' and this group's
  up to it), so grouping does not change it either. In a group, moves and decisions
  are applied in request order too: a move in a later request than a run's stop finds
  that run decided (a declined run's steps are gone by then, and stay counted there).

Retention (``StoreConfig.retention_seconds``, off by default): the periodic maintenance
removes decided runs whose last span arrived longer ago than that, with every row that
names them, in transactions of ``prune_max_runs`` runs. A span of a removed run arriving
later starts a new run row (its stop is counted again). A canary flag goes with the last
run it names (a flag by trace id then no longer marks later runs of that trace).

``/metrics`` counters start from zero with the process (Prometheus' ``rate()`` and
``increase()`` handle the reset); the totals live in these tables, read by the API.

Reads (:class:`StoreReader`) run on their own cursors with a time limit and a row cap,
parameterized SQL only, so they never block or starve the writer.

Schema (``SCHEMA_VERSION`` = 15; numbered migrations in :data:`MIGRATIONS` are applied in
order at open; times are integers in ns since the Unix epoch unless named ``_unix``):

- ``runs``: one row per run (key ``run_key``), kept until retention removes it: counts,
  the primary stop denormalized, the sampling decision (``sampled``, ``sample_rule``,
  ``sample_tool``); ``span_start_unix_nano`` / ``span_end_unix_nano``: the times of its
  run span rows alone, so a move out of the run narrows its times to what is left.
- ``staged_steps`` / ``steps``: decision and tool_result rows (same columns).
- ``stops`` (primary, one per run, key ``run_key``; ``counted``: whether ``/metrics``
  counted it; ``loop_tool``: the tool label its loop detection was counted under,
  :func:`~loopwatch.collector.detect.loop_tool`) and ``stop_anomalies`` (``kind``:
  ``duplicate_stop``, or ``replaced_stop`` for a primary stop a stronger one replaced,
  with its own ``counted``).
- ``run_tools``: tool-call count deltas per (run, tool, outcome, agent), append-only;
  sum them.
- ``canary_flags``: run ids or trace ids the redact stage flagged.
- ``spans_seen``: 64-bit span id and low 64 bits of the trace id of each stored span,
  and when it was stored (no index: append-only, pruned by time).
- ``sample_quota``: runs kept per (hour, stop_reason, tool), append-only: each group that
  keeps runs appends the new totals and the largest ``kept`` of a key is its count.
- ``schema_version``: applied migrations.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa
from loopwatch.instrumentation import _semconv as sc

from .detect import LOOP_DETECTORS, loop_tool
from .errors import CollectorError, QueueFull
from .events import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    STOP_ORIGINS,
    UNKNOWN_AGENT,
    MappedBatch,
    RunReassignment,
    RunRow,
    StepRow,
    StopRow,
)
from .runkeys import RunKeyFilter
from .sampling import NO_STOP_REASON, Sampler, SamplingConfig, hour_bucket

__all__ = [
    "LOOP_STOP_REASONS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQL_LOOPS_BY_TOOL",
    "CommitResult",
    "CommitStats",
    "Migration",
    "QueueFull",
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

logger = logging.getLogger(__name__)

LOOP_STOP_REASONS: Final = tuple(sorted(LOOP_DETECTORS))
"""Stop reasons counted as loops in :meth:`StoreReader.stats` (DESIGN section 7 detectors)."""

_NS: Final = 1_000_000_000
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_MASK64: Final = 2**64 - 1
_ANOMALY_DUPLICATE: Final = "duplicate_stop"
_ANOMALY_REPLACED: Final = "replaced_stop"


class StoreError(CollectorError):
    """A batch could not be committed; its future carries this. Not retryable as is.

    Attributes:
        reason: short, content-free description (the DuckDB error class name).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"store write failed: {reason}")


class StoreClosed(CollectorError):
    """The store is closing or closed; the batch was not accepted."""

    retryable = True

    def __init__(self) -> None:
        super().__init__("store is closed")


class SchemaTooNew(CollectorError):
    """The file was written by a newer loopwatch (its schema version is unknown here).

    Attributes:
        found / supported: schema versions of the file and of this code.
    """

    def __init__(self, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(f"database schema version {found} is newer than {supported}")


class ReadTimeout(CollectorError):
    """A read query ran past its time limit and was interrupted.

    Attributes:
        timeout_seconds: the limit.
    """

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        super().__init__(f"read query exceeded {timeout_seconds:g} s")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered schema change, applied in its own transaction."""

    version: int
    description: str
    statements: tuple[str, ...]


_STEP_TABLE_COLUMNS: Final = """(
    run_key UBIGINT NOT NULL,
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    step BIGINT,
    start_unix_nano BIGINT NOT NULL,
    end_unix_nano BIGINT NOT NULL,
    status_code SMALLINT,
    decision_type VARCHAR,
    decision_fingerprint VARCHAR,
    tool VARCHAR,
    tool_call_id VARCHAR,
    outcome VARCHAR,
    risk VARCHAR,
    error_type VARCHAR,
    blocked_by VARCHAR,
    failure_class VARCHAR,
    action_fingerprint VARCHAR,
    observation_digest VARCHAR,
    progress BOOLEAN,
    steps_since_progress BIGINT,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cost_usd DOUBLE,
    arguments VARCHAR,
    result VARCHAR,
    received_unix_nano BIGINT NOT NULL
)"""

_STOP_COLUMNS_DDL: Final = """
    run_key UBIGINT NOT NULL,
    run_id VARCHAR NOT NULL,
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    origin VARCHAR NOT NULL,
    stop_inferred BOOLEAN NOT NULL,
    reason VARCHAR NOT NULL,
    time_unix_nano BIGINT NOT NULL,
    step BIGINT,
    dimension VARCHAR,
    limit_value DOUBLE,
    observed DOUBLE,
    basis VARCHAR,
    evidence VARCHAR,
    message VARCHAR,
    steps_since_progress BIGINT,
    usage_model_turns BIGINT,
    usage_tool_attempts BIGINT,
    usage_tool_successes BIGINT,
    usage_tokens BIGINT,
    usage_cost_usd DOUBLE,
    usage_elapsed_seconds DOUBLE,
    observe_reason VARCHAR,
    observe_step BIGINT,
    received_unix_nano BIGINT NOT NULL"""

_SQL_DETECTORS: Final = ", ".join(f"'{d}'" for d in sorted(LOOP_DETECTORS))
_SQL_LOOP_EVIDENCE: Final = (
    f"CASE WHEN reason IN ({_SQL_DETECTORS}) THEN evidence "
    f"WHEN observe_reason IN ({_SQL_DETECTORS}) THEN observe_evidence END"
)
_SQL_LOOP_TOOL: Final = (
    f"CASE WHEN json_valid({_SQL_LOOP_EVIDENCE}) THEN CASE WHEN "
    f"json_type({_SQL_LOOP_EVIDENCE}, '$.tool') = 'VARCHAR' THEN "
    f"json_extract_string({_SQL_LOOP_EVIDENCE}, '$.tool') END END"
)

MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "runs, steps, stops, run_tools, canary flags, dedup keys, sampling quota",
        (
            """CREATE TABLE runs (
                run_key UBIGINT PRIMARY KEY,
                run_id VARCHAR NOT NULL,
                trace_id VARCHAR NOT NULL,
                run_span_id VARCHAR,
                source VARCHAR NOT NULL,
                agent VARCHAR,
                agent_id VARCHAR,
                conversation_id VARCHAR,
                parent_run_id VARCHAR,
                policy_name VARCHAR,
                policy_version VARCHAR,
                detector_version VARCHAR,
                limits VARCHAR,
                mode VARCHAR,
                start_unix_nano BIGINT,
                end_unix_nano BIGINT,
                status_code SMALLINT,
                steps BIGINT NOT NULL DEFAULT 0,
                decisions BIGINT NOT NULL DEFAULT 0,
                tool_calls BIGINT NOT NULL DEFAULT 0,
                tool_errors BIGINT NOT NULL DEFAULT 0,
                tool_blocked BIGINT NOT NULL DEFAULT 0,
                tokens BIGINT NOT NULL DEFAULT 0,
                stop_reason VARCHAR,
                stop_origin VARCHAR,
                stop_inferred BOOLEAN,
                stop_unix_nano BIGINT,
                sample_tool VARCHAR,
                sampled BOOLEAN,
                sample_rule VARCHAR,
                decided_unix_nano BIGINT,
                first_seen_unix_nano BIGINT NOT NULL,
                last_seen_unix_nano BIGINT NOT NULL
            )""",
            "CREATE TABLE staged_steps " + _STEP_TABLE_COLUMNS,
            "CREATE TABLE steps " + _STEP_TABLE_COLUMNS,
            "CREATE TABLE stops (" + _STOP_COLUMNS_DDL + ", PRIMARY KEY (run_key))",
            """CREATE TABLE run_tools (
                run_key UBIGINT NOT NULL,
                tool VARCHAR NOT NULL,
                outcome VARCHAR NOT NULL,
                calls BIGINT NOT NULL
            )""",
            """CREATE TABLE canary_flags (
                run_id VARCHAR PRIMARY KEY,
                first_seen_unix_nano BIGINT NOT NULL
            )""",
            """CREATE TABLE spans_seen (
                span_key UBIGINT NOT NULL,
                trace_key UBIGINT NOT NULL,
                seen_unix_nano BIGINT NOT NULL,
                PRIMARY KEY (span_key, trace_key)
            )""",
            """CREATE TABLE sample_quota (
                hour_unix BIGINT NOT NULL,
                stop_reason VARCHAR NOT NULL,
                tool VARCHAR NOT NULL,
                kept BIGINT NOT NULL,
                PRIMARY KEY (hour_unix, stop_reason, tool)
            )""",
        ),
    ),
    Migration(
        2,
        "stop anomalies (duplicate stops of one run)",
        (
            "CREATE TABLE stop_anomalies (" + _STOP_COLUMNS_DDL + ", kind VARCHAR NOT NULL)",
            "ALTER TABLE runs ADD COLUMN duplicate_stops BIGINT DEFAULT 0",
        ),
    ),
    Migration(
        3,
        "canary hits by location (restores loopwatch_canary_detections_total)",
        (
            """CREATE TABLE canary_hits (
                location VARCHAR NOT NULL,
                hits BIGINT NOT NULL,
                received_unix_nano BIGINT NOT NULL
            )""",
        ),
    ),
    Migration(
        4,
        "spans_seen without its primary key (dedup checks moved to memory)",
        (
            """CREATE TABLE spans_seen_v4 (
                span_key UBIGINT NOT NULL,
                trace_key UBIGINT NOT NULL,
                seen_unix_nano BIGINT NOT NULL
            )""",
            "INSERT INTO spans_seen_v4 SELECT span_key, trace_key, seen_unix_nano "
            "FROM spans_seen ORDER BY seen_unix_nano",
            "DROP TABLE spans_seen",
            "ALTER TABLE spans_seen_v4 RENAME TO spans_seen",
        ),
    ),
    Migration(
        5,
        "sample_quota append-only (the primary-key upsert cost 10-20 ms per group commit)",
        (
            """CREATE TABLE sample_quota_v5 (
                hour_unix BIGINT NOT NULL,
                stop_reason VARCHAR NOT NULL,
                tool VARCHAR NOT NULL,
                kept BIGINT NOT NULL
            )""",
            "INSERT INTO sample_quota_v5 SELECT hour_unix, stop_reason, tool, kept "
            "FROM sample_quota",
            "DROP TABLE sample_quota",
            "ALTER TABLE sample_quota_v5 RENAME TO sample_quota",
        ),
    ),
    Migration(
        6,
        "run_tools.agent: the agent a tool call was counted under when it was stored",
        ("ALTER TABLE run_tools ADD COLUMN agent VARCHAR",),
    ),
    Migration(
        7,
        "observe_evidence: what observe mode would have stopped, beside the real stop's",
        (
            "ALTER TABLE stops ADD COLUMN observe_evidence VARCHAR",
            "ALTER TABLE stop_anomalies ADD COLUMN observe_evidence VARCHAR",
            # Schema 6 stored it in place of a completed run's evidence: move it back.
            *(
                f"UPDATE {table} SET observe_evidence = evidence, evidence = NULL "
                "WHERE reason = 'completed' AND observe_reason IS NOT NULL "
                "AND CASE WHEN json_valid(evidence) THEN "
                "json_extract_string(evidence, '$.detector') END = observe_reason"
                for table in ("stops", "stop_anomalies")
            ),
        ),
    ),
    Migration(
        8,
        "stops.agent: the agent a stop was counted under when it was stored",
        (
            "ALTER TABLE stops ADD COLUMN agent VARCHAR",
            "ALTER TABLE stop_anomalies ADD COLUMN agent VARCHAR",
        ),
    ),
    Migration(
        9,
        "stops.counted: whether /metrics counted the stop; replaced stops kept as anomalies",
        (
            "ALTER TABLE stops ADD COLUMN counted BOOLEAN",
            "ALTER TABLE stop_anomalies ADD COLUMN counted BOOLEAN",
            # Schema 8 restored every primary stop and no anomaly: keep those totals.
            "UPDATE stops SET counted = true",
            "UPDATE stop_anomalies SET counted = false",
        ),
    ),
    Migration(
        10,
        "stops.counted NOT NULL: a NULL would drop a stop from the restored totals unseen",
        # Its own transaction: DuckDB 1.5 refuses SET NOT NULL on a table with an index
        # while the UPDATE that filled the column is uncommitted.
        (
            "ALTER TABLE stops ALTER COLUMN counted SET NOT NULL",
            "ALTER TABLE stop_anomalies ALTER COLUMN counted SET NOT NULL",
        ),
    ),
    Migration(
        11,
        "stops.loop_tool (the detection's tool label, counted live); pruned_stops and "
        "pruned_tool_calls: totals of runs removed by retention",
        (
            *(
                statement
                for table in ("stops", "stop_anomalies")
                for statement in (
                    f"ALTER TABLE {table} ADD COLUMN loop_tool VARCHAR",
                    # Rows stored before: the live rule (detect.loop_tool) in SQL, and
                    # evidence that is not JSON names no tool instead of failing.
                    f"UPDATE {table} SET loop_tool = {_SQL_LOOP_TOOL}",
                )
            ),
            """CREATE TABLE pruned_stops (
                agent VARCHAR NOT NULL,
                reason VARCHAR NOT NULL,
                step BIGINT NOT NULL,
                steps_since_progress BIGINT NOT NULL,
                observe_reason VARCHAR,
                loop_tool VARCHAR,
                stops BIGINT NOT NULL,
                pruned_unix_nano BIGINT NOT NULL
            )""",
            """CREATE TABLE pruned_tool_calls (
                agent VARCHAR NOT NULL,
                tool VARCHAR NOT NULL,
                outcome VARCHAR NOT NULL,
                calls BIGINT NOT NULL,
                pruned_unix_nano BIGINT NOT NULL
            )""",
        ),
    ),
    Migration(
        12,
        "metric_labels: the agent and tool label values /metrics admitted, in order",
        (
            """CREATE TABLE metric_labels (
                kind VARCHAR NOT NULL,
                label VARCHAR NOT NULL,
                admitted BIGINT NOT NULL,
                PRIMARY KEY (kind, label)
            )""",
        ),
    ),
    Migration(
        13,
        "runs.span_start_unix_nano / span_end_unix_nano: the times of the run spans alone",
        (
            "ALTER TABLE runs ADD COLUMN span_start_unix_nano BIGINT",
            "ALTER TABLE runs ADD COLUMN span_end_unix_nano BIGINT",
            # Rows stored before: their times so far stand in for their spans', so a
            # later move never narrows them (as before this schema).
            "UPDATE runs SET span_start_unix_nano = start_unix_nano, "
            "span_end_unix_nano = end_unix_nano",
        ),
    ),
    Migration(
        14,
        "pruned_stops.steps_since_progress nullable: a stop that does not say it is not "
        "observed as 0 steps since progress",
        ("ALTER TABLE pruned_stops ALTER COLUMN steps_since_progress DROP NOT NULL",),
    ),
    Migration(
        15,
        "drop the tables that restored /metrics totals at start (counters start from zero)",
        tuple(
            f"DROP TABLE {table}"
            for table in ("metric_labels", "canary_hits", "pruned_stops", "pruned_tool_calls")
        ),
    ),
)

SCHEMA_VERSION: Final = MIGRATIONS[-1].version


def apply_migrations(con: duckdb.DuckDBPyConnection, *, target: int | None = None) -> int:
    """Bring a database to ``target`` (default: :data:`SCHEMA_VERSION`); return its version.

    Each migration runs in its own transaction with its ``schema_version`` row, so a
    crash mid-upgrade leaves the file at the previous version.

    Raises:
        SchemaTooNew: the file's version is above what this code knows.
        duckdb.Error: a migration failed (the transaction is rolled back).
    """
    goal = SCHEMA_VERSION if target is None else target
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version ("
        "version INTEGER PRIMARY KEY, description VARCHAR NOT NULL, "
        "applied_unix_nano BIGINT NOT NULL)"
    )
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    current = int(row[0]) if row is not None and row[0] is not None else 0
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(current, SCHEMA_VERSION)
    for migration in MIGRATIONS:
        if migration.version <= current or migration.version > goal:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            for statement in migration.statements:
                con.execute(statement)
            con.execute(
                "INSERT INTO schema_version VALUES (?, ?, ?)",
                [migration.version, migration.description, time.time_ns()],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        current = migration.version
    return current


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
        dedup_max_keys: span keys held in memory for deduplication (about 80 bytes
            each). Past this, the oldest keys are dropped before their retention ends, so
            a retry older than the newest ``dedup_max_keys`` spans would be stored again
            (logged). The default covers an hour at 550 spans/s, four minutes at 8,000.
        checkpoint_wal_bytes: write-ahead log size at which the writer checkpoints, once
            the queue is empty and after the group's futures are resolved; at four times
            this size it checkpoints even with batches waiting. DuckDB's own automatic
            checkpoint (which runs inside ``COMMIT``, delaying that group's
            acknowledgement) is pushed to eight times this size. A checkpoint blocks the
            writer for a time that grows with the ``runs`` and ``stops`` tables, not with
            the log (200-500 ms at 30-40k runs after 4 MiB and after 64 MiB alike), so
            fewer, larger ones stall less; a larger log takes longer to replay at open.
        memory_limit_bytes: DuckDB's buffer pool limit for the file (``SET
            memory_limit``). DuckDB's own default is 80 % of the machine's memory, and it
            keeps every block it has read or written cached up to that limit, so a
            long-running collector's resident memory grew with its file (measured in the
            soak test: about 2 MB/s at 4,000 spans/s). Past the limit DuckDB evicts
            cached blocks and spills large reads to ``<db>.tmp``.
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
    """

    max_queue_spans: int = 100_000
    max_group_spans: int = 20_000
    dedup_retention_seconds: float = 3_600.0
    maintenance_interval_seconds: float = 60.0
    read_timeout_seconds: float = 5.0
    read_max_rows: int = 10_000
    duckdb_threads: int = 1
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    dedup_max_keys: int = 2_000_000
    checkpoint_wal_bytes: int = 64 * 1024 * 1024
    memory_limit_bytes: int = 512 * 1024 * 1024
    retention_seconds: float = 0.0
    prune_max_runs: int = 2_000

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
        for name in (
            "dedup_retention_seconds",
            "maintenance_interval_seconds",
            "read_timeout_seconds",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a finite number > 0")
        retention = self.retention_seconds
        if isinstance(retention, bool) or not (
            isinstance(retention, int | float) and 0 <= retention < float("inf")
        ):
            raise ValueError("retention_seconds must be a finite number >= 0 (0: keep forever)")
        self.sampling.validate()


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


_STEP_FIELDS: Final = (
    "trace_id",
    "span_id",
    "run_id",
    "source",
    "kind",
    "step",
    "start_unix_nano",
    "end_unix_nano",
    "status_code",
    "decision_type",
    "decision_fingerprint",
    "tool",
    "tool_call_id",
    "outcome",
    "risk",
    "error_type",
    "blocked_by",
    "failure_class",
    "action_fingerprint",
    "observation_digest",
    "progress",
    "steps_since_progress",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "arguments",
    "result",
)
_STEP_COLUMNS: Final = ("run_key", *_STEP_FIELDS, "received_unix_nano")
_STOP_FIELDS: Final = (
    "run_id",
    "trace_id",
    "span_id",
    "source",
    "origin",
    "stop_inferred",
    "reason",
    "time_unix_nano",
    "step",
    "dimension",
    "limit_value",
    "observed",
    "basis",
    "evidence",
    "message",
    "steps_since_progress",
    "usage_model_turns",
    "usage_tool_attempts",
    "usage_tool_successes",
    "usage_tokens",
    "usage_cost_usd",
    "usage_elapsed_seconds",
    "observe_reason",
    "observe_step",
    "observe_evidence",
    "agent",
)
# Table order: columns added by a migration come after ``received_unix_nano`` (and after
# ``kind`` in stop_anomalies), in migration order.
_STOP_LATE: Final = 2  # observe_evidence (schema 7), agent (schema 8)
_STOP_COLUMNS: Final = (
    "run_key",
    *_STOP_FIELDS[:-_STOP_LATE],
    "received_unix_nano",
    *_STOP_FIELDS[-_STOP_LATE:],
    "counted",  # schema 9; not a StopRow field
    "loop_tool",  # schema 11; detect.loop_tool of the row
)
_AFTER_RECEIVED: Final = _STOP_LATE + 2
_ANOMALY_COLUMNS: Final = (
    *_STOP_COLUMNS[:-_AFTER_RECEIVED],
    "kind",
    *_STOP_COLUMNS[-_AFTER_RECEIVED:],
)

_RUN_ATTR_FIELDS: Final = (
    "agent",
    "agent_id",
    "conversation_id",
    "parent_run_id",
    "policy_name",
    "policy_version",
    "detector_version",
    "limits",
    "mode",
)
_RUN_COLUMNS: Final = (
    "run_key",
    "run_id",
    "trace_id",
    "run_span_id",
    "source",
    *_RUN_ATTR_FIELDS,
    "start_unix_nano",
    "end_unix_nano",
    "status_code",
    "steps",
    "decisions",
    "tool_calls",
    "tool_errors",
    "tool_blocked",
    "tokens",
    "stop_reason",
    "stop_origin",
    "stop_inferred",
    "stop_unix_nano",
    "sample_tool",
    "sampled",
    "sample_rule",
    "decided_unix_nano",
    "first_seen_unix_nano",
    "last_seen_unix_nano",
    "duplicate_stops",
    "span_start_unix_nano",  # schema 13
    "span_end_unix_nano",
)
_COUNT_COLUMNS: Final = ("decisions", "tool_calls", "tool_errors", "tool_blocked", "tokens")
_INT_FIELDS: Final = frozenset(
    {
        "step",
        "start_unix_nano",
        "end_unix_nano",
        "status_code",
        "steps_since_progress",
        "input_tokens",
        "output_tokens",
        "time_unix_nano",
        "usage_model_turns",
        "usage_tool_attempts",
        "usage_tool_successes",
        "usage_tokens",
        "observe_step",
        "received_unix_nano",
        "steps",
        *_COUNT_COLUMNS,
        "stop_unix_nano",
        "first_seen_unix_nano",
        "last_seen_unix_nano",
        "calls",
        "seen_unix_nano",
        "decided_unix_nano",
        "kept",
        "hour_unix",
        "duplicate_stops",
        "hits",
        "span_start_unix_nano",
        "span_end_unix_nano",
    }
)
_FLOAT_FIELDS: Final = frozenset(
    {"cost_usd", "limit_value", "observed", "usage_cost_usd", "usage_elapsed_seconds"}
)
_BOOL_FIELDS: Final = frozenset({"progress", "stop_inferred", "sampled"})
_UINT_FIELDS: Final = frozenset({"span_key", "trace_key", "run_key"})

_STEP_GETTERS: Final = tuple((name, operator.attrgetter(name)) for name in _STEP_FIELDS)
_get_stop: Final = operator.attrgetter(*[f for f in _STOP_FIELDS if f != "stop_inferred"])
_STOP_INFERRED_AT: Final = _STOP_FIELDS.index("stop_inferred")


def _arrow_type(name: str) -> pa.DataType:
    if name in _INT_FIELDS:
        return pa.int64()
    if name in _FLOAT_FIELDS:
        return pa.float64()
    if name in _BOOL_FIELDS:
        return pa.bool_()
    if name in _UINT_FIELDS:
        return pa.uint64()
    return pa.string()


def _column(name: str, values: Sequence[Any]) -> pa.Array:
    typ = _arrow_type(name)
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowException, OverflowError, UnicodeError, TypeError, ValueError):
        return pa.array([_clean(v, typ) for v in values], type=typ)


def _clean(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_string(typ):
        text = value if isinstance(value, str) else str(value)
        return text.encode("utf-8", "replace").decode("utf-8")
    if pa.types.is_integer(typ):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return value if ok and _INT64_MIN <= value <= _INT64_MAX else None
    if pa.types.is_floating(typ):
        return float(value) if isinstance(value, int | float) else None
    return value if isinstance(value, bool) else None


def _table(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> pa.Table:
    return pa.Table.from_arrays(
        [_column(name, [row[i] for row in rows]) for i, name in enumerate(names)],
        names=list(names),
    )


def _step_table(steps: list[StepRow], runs: dict[str, dict[str, Any]], now_ns: int) -> pa.Table:
    keys = {run_id: row["run_key"] for run_id, row in runs.items()}
    arrays = [_column("run_key", [keys[s.run_id] for s in steps])]
    arrays += [_column(name, list(map(get, steps))) for name, get in _STEP_GETTERS]
    arrays.append(pa.array([now_ns] * len(steps), type=pa.int64()))
    return pa.Table.from_arrays(arrays, names=list(_STEP_COLUMNS))


def _span_key(trace_id: str, span_id: str) -> tuple[int, int]:
    try:
        return int(span_id, 16) & _MASK64, int(trace_id[-16:], 16) & _MASK64
    except ValueError:
        digest = hashlib.blake2b(f"{trace_id}/{span_id}".encode(), digest_size=16).digest()
        return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")


def _run_key(run_id: str) -> int:
    """64-bit key of a run id (blake2b); the runs and stops primary key."""
    digest = hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _key_list(keys: Iterable[int]) -> str:
    """Render run keys as a literal SQL list.

    DuckDB answers a literal integer ``IN (...)`` list with primary-key index lookups,
    while a bound list parameter or a join scans the table: this keeps per-commit cost
    flat as tables grow. Only ints computed here are rendered, never client text.
    """
    return ",".join(str(int(k)) for k in keys) or "NULL"


def _new_run(run_id: str, trace_id: str, source: str, now_ns: int) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(_RUN_COLUMNS)
    row.update(
        run_key=_run_key(run_id),
        run_id=run_id,
        trace_id=trace_id,
        source=source,
        steps=0,
        decisions=0,
        tool_calls=0,
        tool_errors=0,
        tool_blocked=0,
        tokens=0,
        first_seen_unix_nano=now_ns,
        last_seen_unix_nano=now_ns,
        duplicate_stops=0,
    )
    return row


def _count_step(
    row: dict[str, Any], kind: str, step: int | None, outcome: str | None, tokens: int, *, sign: int
) -> None:
    if sign > 0 and step is not None and step > row["steps"]:
        row["steps"] = step
    if kind == KIND_DECISION:
        row["decisions"] += sign
    elif kind == KIND_TOOL_RESULT:
        row["tool_calls"] += sign
        if outcome == sc.OUTCOME_ERROR:
            row["tool_errors"] += sign
        elif outcome == sc.OUTCOME_BLOCKED:
            row["tool_blocked"] += sign
    row["tokens"] = min(row["tokens"] + sign * tokens, _INT64_MAX)  # BIGINT: saturate


def _widen(row: dict[str, Any], start: int | None, end: int | None, prefix: str = "") -> None:
    """Widen ``row``'s ``{prefix}start_unix_nano`` / ``{prefix}end_unix_nano`` to cover
    ``start`` / ``end`` (``None``: unknown, changes nothing)."""
    first, last = f"{prefix}start_unix_nano", f"{prefix}end_unix_nano"
    if start is not None and (row[first] is None or start < row[first]):
        row[first] = start
    if end is not None and (row[last] is None or end > row[last]):
        row[last] = end


def _stop_tuple(run_key: int, stop_row: StopRow, now_ns: int, counted: bool) -> tuple[Any, ...]:
    values = _get_stop(stop_row)
    return (
        run_key,
        *values[:_STOP_INFERRED_AT],
        stop_row.stop_inferred,
        *values[_STOP_INFERRED_AT:-_STOP_LATE],
        now_ns,
        *values[-_STOP_LATE:],
        counted,
        loop_tool(stop_row),
    )


def _anomaly_tuple(
    run_key: int, stop_row: StopRow, now_ns: int, kind: str, counted: bool = False
) -> tuple[Any, ...]:
    values = _stop_tuple(run_key, stop_row, now_ns, counted)
    return (*values[:-_AFTER_RECEIVED], kind, *values[-_AFTER_RECEIVED:])


_SQL_KEPT_BOUNDS: Final = (
    "SELECT count(step_row), max(step), min(start_ns), max(end_ns) FROM ("
    "SELECT 1 AS step_row, step, start_unix_nano AS start_ns, end_unix_nano AS end_ns "
    "FROM staged_steps WHERE run_key = {key} UNION ALL "
    "SELECT 1, step, start_unix_nano, end_unix_nano FROM steps WHERE run_key = {key} "
    "UNION ALL SELECT NULL, step, NULL, time_unix_nano FROM stops WHERE run_key = {key} "
    "UNION ALL SELECT NULL, step, NULL, time_unix_nano FROM stop_anomalies "
    "WHERE run_key = {key})"
)
"""Step rows, highest step, earliest start and latest end of a run's stored rows and
stops (``key``: its run key, an int rendered here)."""

_MOVED: Final = ""  # run_tools.agent of the -1/+1 rows of a moved call


@dataclass(slots=True)
class _Group:
    """The rows of one group commit that survived deduplication, and their run state."""

    now_ns: int
    runs: list[RunRow]
    steps: list[StepRow]
    stops: list[StopRow]
    moves: list[RunReassignment]
    canaries: set[str]
    merged: dict[str, dict[str, Any]] = field(default_factory=dict)
    existing: set[str] = field(default_factory=set)
    tool_deltas: dict[tuple[int, str, str, str | None], int] = field(default_factory=dict)
    move_jobs: list[int] = field(default_factory=list)  # job index of each of ``moves``
    step_jobs: list[int] = field(default_factory=list)  # job index of each of ``steps``
    settle: set[str] = field(default_factory=set)
    staged_in_db: set[str] = field(default_factory=set)
    stopped_before: set[str] = field(default_factory=set)
    emptied: set[str] = field(default_factory=set)
    stop_jobs: list[int] = field(default_factory=list)  # job index of each of ``stops``
    primary: list[StopRow] = field(default_factory=list)  # the stops that win, to store
    counted: dict[str, StopRow] = field(default_factory=dict)  # run id -> stop counted now
    counted_by_job: dict[int, list[StopRow]] = field(default_factory=dict)
    replaced: list[tuple[StopRow, bool]] = field(default_factory=list)  # (stop, counted)
    quota: dict[tuple[str, str], int] | None = None  # runs kept this hour, with the group's
    quota_changed: set[tuple[str, str]] = field(default_factory=set)

    def run(self, run_id: str, trace_id: str, source: str) -> dict[str, Any]:
        row = self.merged.get(run_id)
        if row is None:
            row = self.merged[run_id] = _new_run(run_id, trace_id, source, self.now_ns)
        row["last_seen_unix_nano"] = self.now_ns
        return row

    def tool(
        self, run_key: int, tool: str, outcome: str, calls: int, agent: str | None = None
    ) -> None:
        key = (run_key, tool, outcome, agent)
        self.tool_deltas[key] = self.tool_deltas.get(key, 0) + calls


class _RecentKeys:
    """Span keys committed within the dedup window, in slices (writer thread only).

    Keys are ``span_key << 64 | trace_key``. A slice holds the keys of at most 1/16 of
    the retention and 1/16 of ``max_keys``; it is forgotten at the first maintenance
    after its newest key's retention ended, so a key is kept at least ``retention``.
    Past ``max_keys``, slices are dropped oldest first (logged at most once a minute).
    """

    def __init__(self, retention_ns: int, max_keys: int) -> None:
        self._retention_ns = retention_ns
        self._slice_ns = max(retention_ns // 16, 1)
        self._slice_keys = max(max_keys // 16, 1)
        self._max_keys = max_keys
        # (slice index, [newest seen_ns], keys)
        self._slices: deque[tuple[int, list[int], set[int]]] = deque()
        self._size = 0
        self._warned = -math.inf
        self.dropped_early = 0

    def __len__(self) -> int:
        return self._size

    def unseen(self, keys: Iterable[int]) -> set[int]:
        """The keys not in the window."""
        fresh = set(keys)
        for _, _, members in reversed(self._slices):
            if not fresh:
                break
            fresh = fresh.difference(members)
        return fresh

    def add(self, keys: set[int], now_ns: int) -> None:
        """Remember ``keys`` as seen at ``now_ns`` (disjoint from the window)."""
        index = now_ns // self._slice_ns
        last = self._slices[-1] if self._slices else None
        if last is not None and last[0] >= index and len(last[2]) < self._slice_keys:
            last[1][0] = max(last[1][0], now_ns)
            last[2].update(keys)
        else:
            self._slices.append((max(index, last[0]) if last else index, [now_ns], set(keys)))
        self._size += len(keys)
        dropped = 0
        while self._size > self._max_keys and len(self._slices) > 1:
            _, _, members = self._slices.popleft()
            self._size -= len(members)
            dropped += len(members)
        if dropped:
            self.dropped_early += dropped
            if time.monotonic() - self._warned >= 60:
                self._warned = time.monotonic()
                logger.warning(
                    "dedup window full (dedup_max_keys=%d): %d span keys forgotten before "
                    "their retention so far; a retry of those spans would be stored again",
                    self._max_keys,
                    self.dropped_early,
                )

    def expire(self, now_ns: int) -> None:
        """Forget the slices whose newest key was seen ``retention`` before ``now_ns``."""
        cutoff = now_ns - self._retention_ns
        while self._slices and self._slices[0][1][0] < cutoff:
            _, _, members = self._slices.popleft()
            self._size -= len(members)


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
        duckdb.IOException: the file is locked by another process (one writer only).

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
        self._sampler = Sampler(self.config.sampling)
        self._con = duckdb.connect(
            str(self.path), config={"threads": str(self.config.duckdb_threads)}
        )
        self._wal_path = Path(f"{self.path}.wal")
        self._recent = _RecentKeys(
            int(self.config.dedup_retention_seconds * _NS), self.config.dedup_max_keys
        )
        self._after_commit: list[Callable[[], None]] = []
        self._quota_hour: int | None = None
        self._quota: dict[tuple[str, str], int] = {}
        try:
            self._con.execute(
                f"SET checkpoint_threshold = '{8 * self.config.checkpoint_wal_bytes}B'"
            )
            self._con.execute(f"SET memory_limit = '{self.config.memory_limit_bytes}B'")
            self.schema_version = apply_migrations(self._con)
            self._load_recent_keys()
            self._stored_runs = RunKeyFilter()
            self._load_run_keys()
            self._read_root = self._con.cursor()
        except BaseException:
            self._con.close()
            raise
        self._reader = StoreReader(
            self._read_root.cursor,
            timeout_seconds=self.config.read_timeout_seconds,
            max_rows=self.config.read_max_rows,
        )
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._queued_spans = 0
        self._closing = False
        self._closed = False
        self._maintenance_requests: list[Future[int]] = []
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
                stop = self._closing and not self._queue and not jobs
            live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if live:
                self._commit_group(live)
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
        try:
            self._con.execute("CHECKPOINT")
        except duckdb.Error:
            logger.exception("store checkpoint failed")

    def _commit_group(self, jobs: list[_Job]) -> None:
        started = time.perf_counter()
        self._after_commit.clear()
        try:
            self._con.execute("BEGIN TRANSACTION")
            outcomes = self._write(jobs)
            self._con.execute("COMMIT")
        except Exception as exc:
            self._after_commit.clear()
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

    def _write(
        self, jobs: list[_Job]
    ) -> list[tuple[int, frozenset[tuple[str, str]], tuple[StopRow, ...]]]:
        now_ns = int(self._clock() * _NS)
        owner: dict[tuple[str, str], int] = {}
        job_keys: list[set[tuple[str, str]]] = []
        repeated_steps = False
        total = 0
        for index, job in enumerate(jobs):
            batch = job.batch
            keys = {(s.trace_id, s.span_id) for s in batch.steps}
            repeated_steps = repeated_steps or len(keys) != len(batch.steps)
            keys.update((r.trace_id, r.span_id) for r in batch.runs)
            keys.update((s.trace_id, s.span_id) for s in batch.stops)
            job_keys.append(keys)
            total += len(keys)
            if len(jobs) == 1:
                owner = dict.fromkeys(keys, 0)
            else:
                for key in keys:
                    owner.setdefault(key, index)
        new_keys = self._claim_keys(owner, now_ns)
        group = _Group(now_ns, [], [], [], [], set())
        everything_new = len(new_keys) == len(owner) == total and not repeated_steps
        step_keys: set[tuple[str, str]] = set()
        stop_keys: set[tuple[str, str, str]] = set()
        for index, job in enumerate(jobs):
            batch = job.batch
            if everything_new:
                group.runs += batch.runs
                group.steps += batch.steps
                group.step_jobs += [index] * len(batch.steps)
            else:
                for run in batch.runs:
                    key = (run.trace_id, run.span_id)
                    if key in new_keys and owner[key] == index:
                        group.runs.append(run)
                for step in batch.steps:
                    key = (step.trace_id, step.span_id)
                    if key in new_keys and owner[key] == index and key not in step_keys:
                        step_keys.add(key)
                        group.steps.append(step)
                        group.step_jobs.append(index)
            for stop_row in batch.stops:
                key = (stop_row.trace_id, stop_row.span_id)
                skey = (*key, stop_row.run_id)
                if key in new_keys and owner[key] == index and skey not in stop_keys:
                    stop_keys.add(skey)
                    group.stops.append(stop_row)
                    group.stop_jobs.append(index)
            group.moves.extend(batch.reassignments)
            group.move_jobs += [index] * len(batch.reassignments)
            group.canaries.update(batch.canary_run_ids)

        self._load_runs(group)
        anomalies, deciding = self._merge_stops(group)
        # One by one, a run is decided when its stop's request is committed, before any
        # later request's move carries steps into or out of it: apply them in that order.
        stop_job = {run_id: job for run_id, _, job in deciding}
        pending = deque(deciding)
        for move, move_job in zip(group.moves, group.move_jobs, strict=True):
            due: list[tuple[str, str | None]] = []
            while pending and pending[0][2] < move_job:
                run_id, reason, _ = pending.popleft()
                due.append((run_id, reason))
            self._decide(group, due, stop_job)
            self._reassign(group, move, move_job)
        self._decide(group, [(run_id, reason) for run_id, reason, _ in pending], stop_job)
        self._merge_rows(group)
        self._write_rows(group, anomalies)

        outcomes = []
        for index, keys in enumerate(job_keys):
            if everything_new:
                mine = frozenset(keys)
            else:
                mine = frozenset(k for k in keys if k in new_keys and owner[k] == index)
            outcomes.append((len(keys), mine, tuple(group.counted_by_job.get(index, ()))))
        return outcomes

    def _insert(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], sql: str
    ) -> list[tuple[Any, ...]]:
        view = f"_lw_{name}"
        self._con.register(view, _table(columns, rows))
        try:
            return self._con.execute(sql.format(t=view)).fetchall()
        finally:
            self._con.unregister(view)

    def _append(self, table: str, data: pa.Table) -> None:
        """Append ``data`` (columns in the table's order) to ``table``.

        Through a relation (``from_arrow(...).insert_into``): about 1 ms less CPU per
        statement than registering a view, executing SQL over it and unregistering it
        (measured here, DuckDB 1.5; a group writes five to seven such tables). The
        relation is built from the table's Arrow C stream (``__arrow_c_stream__``, the
        Arrow PyCapsule interface) rather than the ``pyarrow.Table`` itself, which DuckDB
        scans through a ``pyarrow.dataset`` scanner: 0.48 ms against 0.84 ms of CPU for a
        50-row, 3-column append (measured here, DuckDB 1.5.6, pyarrow 26).
        """
        self._con.from_arrow(data.__arrow_c_stream__()).insert_into(table)

    def _committed(self) -> None:
        """Publish the in-memory state of the transaction just committed."""
        hooks, self._after_commit = self._after_commit, []
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
        """Fill the run-key filter from ``runs`` (a bounded batch of keys at a time)."""
        reader = self._con.execute("SELECT run_key FROM runs").to_arrow_reader(1 << 18)
        for batch in reader:
            self._stored_runs.add_array(batch.column(0).to_numpy(zero_copy_only=False))

    def _claim_keys(self, owner: dict[tuple[str, str], int], now_ns: int) -> set[tuple[str, str]]:
        by_int: dict[int, tuple[str, str]] = {}
        for key in owner:
            span_key, trace_key = _span_key(*key)
            by_int.setdefault((span_key << 64) | trace_key, key)
        fresh = self._recent.unseen(by_int)
        if not fresh:
            return set()
        self._append(
            "spans_seen",
            pa.Table.from_arrays(
                [
                    pa.array([k >> 64 for k in fresh], pa.uint64()),
                    pa.array([k & _MASK64 for k in fresh], pa.uint64()),
                    pa.array([now_ns] * len(fresh), pa.int64()),
                ],
                names=["span_key", "trace_key", "seen_unix_nano"],
            ),
        )
        self._after_commit.append(lambda: self._recent.add(fresh, now_ns))
        return {by_int[k] for k in fresh}

    def _fetch_runs(self, where: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        rows = self._con.execute(
            f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE {where}", list(params)
        ).fetchall()
        return [dict(zip(_RUN_COLUMNS, r, strict=True)) for r in rows]

    def _load_runs(self, group: _Group) -> None:
        run_ids = {r.run_id for r in group.runs}
        run_ids.update(s.run_id for s in group.steps)
        run_ids.update(s.run_id for s in group.stops)
        for move in group.moves:
            run_ids.add(move.from_run_id)
            if move.to_run_id is not None:
                run_ids.add(move.to_run_id)
        if not run_ids:
            return
        keys = sorted({_run_key(r) for r in run_ids})
        maybe_stored = self._stored_runs.may_contain(keys)
        keys = [k for k, maybe in zip(keys, maybe_stored, strict=True) if maybe]
        if not keys:
            return
        for row in self._fetch_runs(f"run_key IN ({_key_list(keys)})"):
            self._adopt(group, row)

    @staticmethod
    def _adopt(group: _Group, row: dict[str, Any]) -> None:
        run_id = row["run_id"]
        group.merged[run_id] = row
        group.existing.add(run_id)
        if row["sampled"] is None:
            group.staged_in_db.add(run_id)
        if row["stop_origin"] is not None:
            group.stopped_before.add(run_id)

    def _reassign(self, group: _Group, move: RunReassignment, move_job: int) -> None:
        """Apply ``move``, carried by the group's request ``move_job``, after the decisions
        of the group's earlier requests: a moved row counts for its new run's sampling
        from that request on (``step_jobs``; a moved stored row is staged)."""
        if move.to_run_id == move.from_run_id or not move.span_ids:
            return
        source = group.merged.get(move.from_run_id)
        if source is not None and source["sampled"] is False:
            # A declined run drops its steps (counted, not kept) on arrival, and its
            # decision deleted the staged ones: one by one, a later move finds nothing.
            return
        span_ids = set(move.span_ids)
        kept: list[StepRow] = []
        jobs: list[int] = []
        for step, job in zip(group.steps, group.step_jobs, strict=True):
            if (
                step.run_id == move.from_run_id
                and step.trace_id == move.trace_id
                and step.span_id in span_ids
            ):
                if move.to_run_id is not None:
                    kept.append(dataclasses.replace(step, run_id=move.to_run_id))
                    jobs.append(max(job, move_job))
                continue
            kept.append(step)
            jobs.append(job)
        group.steps, group.step_jobs = kept, jobs
        runs: list[RunRow] = []
        for run in group.runs:
            if (
                run.run_id == move.from_run_id
                and run.trace_id == move.trace_id
                and run.span_id in span_ids
            ):
                if move.to_run_id is not None:
                    runs.append(dataclasses.replace(run, run_id=move.to_run_id))
                continue
            runs.append(run)
        group.runs = runs
        if source is None or move.from_run_id not in group.existing:
            return
        from_key = _run_key(move.from_run_id)
        tables = ["staged_steps"] + (["steps"] if source["sampled"] else [])
        moved: list[tuple[Any, ...]] = []  # (kind, step, outcome, tool, tokens, start, end)
        where = f"run_key = {from_key} AND trace_id = ? AND list_contains(?, span_id)"
        returning = (
            "RETURNING kind, step, outcome, COALESCE(tool, ''), "
            "COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0), "
            "start_unix_nano, end_unix_nano"
        )
        to_run_id = move.to_run_id
        to_key = None if to_run_id is None else _run_key(to_run_id)
        to_sampled = None if to_run_id is None else group.merged.get(to_run_id, {}).get("sampled")
        for table in tables:
            params: list[Any] = [move.trace_id, sorted(span_ids)]
            if to_run_id is None:
                sql = f"DELETE FROM {table} WHERE {where} {returning}"
            elif table == "staged_steps" or to_sampled:
                # Staged rows follow the run's decision when its group settles.
                sql = f"UPDATE {table} SET run_key = ?, run_id = ? WHERE {where} {returning}"
                params = [to_key, to_run_id, *params]
            elif to_sampled is None:
                # A kept row of a sampled run, moved to a run not decided yet, waits for
                # that run's decision like its own rows: one by one it would otherwise
                # stay kept whatever the decision, while in a group it follows it.
                self._con.execute(
                    "INSERT INTO staged_steps SELECT * REPLACE (?::UBIGINT AS run_key, "
                    f"?::VARCHAR AS run_id) FROM steps WHERE {where}",
                    [to_key, to_run_id, *params],
                )
                sql = f"DELETE FROM steps WHERE {where} {returning}"
            else:
                # A declined run keeps no steps: the row is counted there, not kept.
                sql = f"DELETE FROM steps WHERE {where} {returning}"
            moved += self._con.execute(sql, params).fetchall()
        if not moved:
            return
        target = None
        if move.to_run_id is not None:
            target = group.run(move.to_run_id, move.trace_id, source["source"])
            group.settle.add(move.to_run_id)
            group.staged_in_db.add(move.to_run_id)
        # A moved call keeps the agent label it was counted under (its first row): the
        # move's -1/+1 pair carries one label, "", so per-label totals are unchanged.
        for kind, step, outcome, tool, tokens, start, end in moved:
            _count_step(source, kind, step, outcome, tokens, sign=-1)
            if kind == KIND_TOOL_RESULT:
                group.tool(from_key, tool, outcome or "", -1, _MOVED)
            if target is not None:
                _count_step(target, kind, step, outcome, tokens, sign=1)
                _widen(target, start, end)
                if kind == KIND_TOOL_RESULT:
                    group.tool(target["run_key"], tool, outcome or "", 1, _MOVED)
        # The highest step and the times are not sums: they are taken again over what
        # the run keeps (earlier groups' rows; _merge_rows adds this group's).
        found = self._con.execute(_SQL_KEPT_BOUNDS.format(key=from_key)).fetchone()
        remaining, highest, start, end = found if found is not None else (0, None, None, None)
        source["steps"] = max(0, highest or 0)
        source["start_unix_nano"] = source["span_start_unix_nano"]
        source["end_unix_nano"] = source["span_end_unix_nano"]
        _widen(source, start, end)
        if source["run_span_id"] is None and source["stop_origin"] is None and not remaining:
            group.emptied.add(move.from_run_id)

    def _merge_rows(self, group: _Group) -> None:
        for run in group.runs:
            row = group.run(run.run_id, run.trace_id, run.source)
            if run.is_run_span:
                row["run_span_id"] = run.span_id
                row["source"] = run.source
                row["status_code"] = run.status_code
                for name in _RUN_ATTR_FIELDS:
                    value = getattr(run, name)
                    if value is not None:
                        row[name] = value
            for prefix in ("", "span_"):
                _widen(row, run.start_unix_nano, run.end_unix_nano, prefix)
        by_run: dict[str, list[StepRow]] = {}
        for step in group.steps:
            rows = by_run.get(step.run_id)
            if rows is None:
                by_run[step.run_id] = [step]
            else:
                rows.append(step)
        for run_id, run_steps in by_run.items():
            first = run_steps[0]
            row = group.run(run_id, first.trace_id, first.source)
            highest = row["steps"]
            decisions = tokens = 0
            earliest = min(s.start_unix_nano for s in run_steps)
            latest = max(s.end_unix_nano for s in run_steps)
            if row["start_unix_nano"] is None or earliest < row["start_unix_nano"]:
                row["start_unix_nano"] = earliest
            if row["end_unix_nano"] is None or latest > row["end_unix_nano"]:
                row["end_unix_nano"] = latest
            calls: dict[tuple[str, str, str | None], int] = {}
            for step in run_steps:
                if step.step is not None and step.step > highest:
                    highest = step.step
                if step.input_tokens is not None:
                    tokens += step.input_tokens
                if step.output_tokens is not None:
                    tokens += step.output_tokens
                if step.kind == KIND_TOOL_RESULT:
                    # The agent label the call was counted under (the collector sets it
                    # before submitting), even when the run's agent span came later or never.
                    call = (step.tool or "", step.outcome or "", step.agent or None)
                    calls[call] = calls.get(call, 0) + 1
                elif step.kind == KIND_DECISION:
                    decisions += 1
            row["steps"] = highest
            row["decisions"] += decisions
            row["tokens"] = min(row["tokens"] + tokens, _INT64_MAX)  # BIGINT: saturate
            for (tool, outcome, agent), n in calls.items():
                group.tool(row["run_key"], tool, outcome, n, agent)
                row["tool_calls"] += n
                if outcome == sc.OUTCOME_ERROR:
                    row["tool_errors"] += n
                elif outcome == sc.OUTCOME_BLOCKED:
                    row["tool_blocked"] += n
        for stop_row in group.stops:
            row = group.run(stop_row.run_id, stop_row.trace_id, stop_row.source)
            # A run known only by its stop (its run span came later or never) is filed
            # under the agent its counted stop is counted under, so the API's agent
            # filter and stats agree with loopwatch_agent_stops_total; a duplicate stop
            # names none, and a run span's agent wins.
            counted = group.counted.get(stop_row.run_id)
            if (
                row["agent"] is None
                and counted is stop_row
                and stop_row.agent
                and stop_row.agent != UNKNOWN_AGENT
            ):
                row["agent"] = stop_row.agent
            if stop_row.step is not None and stop_row.step > row["steps"]:
                row["steps"] = stop_row.step
            if row["end_unix_nano"] is None or stop_row.time_unix_nano > row["end_unix_nano"]:
                row["end_unix_nano"] = stop_row.time_unix_nano
        touched = {s.run_id for s in group.steps} | {s.run_id for s in group.stops}
        group.emptied = {
            run_id
            for run_id in group.emptied
            if run_id not in touched
            and group.merged[run_id]["run_span_id"] is None
            and group.merged[run_id]["stop_origin"] is None
        }

    def _merge_stops(
        self, group: _Group
    ) -> tuple[list[StopRow], list[tuple[str, str | None, int]]]:
        """Apply the group's stops request by request (module docstring, "Stops" and
        "Metrics count"); return the duplicate-stop anomalies and the runs their first
        stop decides, ``(run_id, stop reason for sampling, job index)`` in request order.
        """
        winners: dict[str, StopRow] = {}
        anomalies: list[StopRow] = []
        for stop_row in group.stops:
            group.run(stop_row.run_id, stop_row.trace_id, stop_row.source)

        def duplicate(stop_row: StopRow) -> None:
            anomalies.append(stop_row)
            row = group.merged[stop_row.run_id]
            row["duplicate_stops"] = (row["duplicate_stops"] or 0) + 1

        # Each request's strongest stop per run (the first of equal strength; a later one
        # of that strength is a duplicate), in request order.
        offered: list[tuple[StopRow, int]] = []
        best: dict[str, int] = {}
        job = -1
        for stop_row, index in zip(group.stops, group.stop_jobs, strict=True):
            if index != job:
                job, best = index, {}
            at = best.get(stop_row.run_id)
            if at is None:
                best[stop_row.run_id] = len(offered)
                offered.append((stop_row, index))
                continue
            rank = STOP_ORIGINS.get(stop_row.origin, 0)
            held_rank = STOP_ORIGINS.get(offered[at][0].origin, 0)
            if rank > held_rank:
                offered[at] = (stop_row, index)
            elif rank == held_rank:
                duplicate(stop_row)
        for stop_row, index in offered:
            run_id = stop_row.run_id
            row = group.merged[run_id]
            current = row["stop_origin"]
            if current is not None:
                rank = STOP_ORIGINS.get(stop_row.origin, 0)
                current_rank = STOP_ORIGINS.get(current, 0)
                if rank == current_rank:
                    duplicate(stop_row)
                if rank <= current_rank:
                    continue  # a duplicate, or outranked: the stronger stop stays
            if current is None:
                group.counted[run_id] = stop_row
                group.counted_by_job.setdefault(index, []).append(stop_row)
            elif run_id in winners:  # replaces this group's own earlier stop
                held = winners[run_id]
                group.replaced.append((held, group.counted.get(run_id) is held))
            winners[run_id] = stop_row
            row.update(
                stop_reason=stop_row.reason,
                stop_origin=stop_row.origin,
                stop_inferred=stop_row.stop_inferred,
                stop_unix_nano=stop_row.time_unix_nano,
            )
        # Decided by the run's first stop, as when its requests are committed one by one.
        # A run that ended "completed" but looped while observed is abnormal for
        # sampling: its steps are the evidence an incident reviewer wants.
        stop_job = {s.run_id: job for job, stops in group.counted_by_job.items() for s in stops}
        deciding: list[tuple[str, str | None, int]] = [
            (
                run_id,
                s.observe_reason if s.observe_reason and s.reason == "completed" else s.reason,
                stop_job[run_id],
            )
            for run_id, s in group.counted.items()
            if group.merged[run_id]["sampled"] is None
        ]
        group.primary = list(winners.values())
        return anomalies, deciding

    def _decide(
        self,
        group: _Group,
        runs: Sequence[tuple[str, str | None]],
        stop_job: Mapping[str, int] | None = None,
    ) -> None:
        """Decide sampling for ``runs`` (``(run_id, stop reason)``; ``None``: timed out).

        The cap's tool is the run's most called tool among the calls stored before its
        decision: earlier groups' (``staged_steps``, with the moves applied so far), and
        this group's from the requests up to the one that carried the run's stop
        (``stop_job``; all of them when the run is not in it), so a group decides as its
        requests would one by one. The quota counts the group's earlier decisions
        (:meth:`_write_rows` stores it).
        """
        if not runs:
            return
        ids = [r for r, _ in runs]
        tallies: dict[str, dict[str, int]] = {r: {} for r in ids}
        for step, job in zip(group.steps, group.step_jobs, strict=True):
            if step.kind != KIND_TOOL_RESULT:
                continue
            tally = tallies.get(step.run_id)
            if tally is None:
                continue
            last = stop_job.get(step.run_id) if stop_job is not None else None
            if last is None or job <= last:
                name = step.tool or ""
                tally[name] = tally.get(name, 0) + 1
        staged_keys = {_run_key(r): r for r in ids if r in group.staged_in_db}
        if staged_keys:
            rows = self._con.execute(
                "SELECT run_key, COALESCE(tool, ''), count(*) FROM staged_steps "
                f"WHERE run_key IN ({_key_list(staged_keys)}) AND kind = ? GROUP BY ALL",
                [KIND_TOOL_RESULT],
            ).fetchall()
            for key, tool, calls in rows:
                tally = tallies[staged_keys[int(key)]]
                tally[tool] = tally.get(tool, 0) + int(calls)
        if group.quota is None:
            hour = hour_bucket(group.now_ns / _NS)
            if hour != self._quota_hour:
                self._quota_hour = None
                self._quota = {
                    (reason, tool): kept
                    for reason, tool, kept in self._con.execute(
                        "SELECT stop_reason, tool, max(kept) FROM sample_quota "
                        "WHERE hour_unix = ? GROUP BY ALL",
                        [hour],
                    ).fetchall()
                }
                self._quota_hour = hour
            group.quota = dict(self._quota)
        quota = group.quota
        for run_id, reason in runs:
            tally = tallies[run_id]
            tool = min(tally, key=lambda t: (-tally[t], t)) if tally else ""
            quota_reason = reason if reason is not None else NO_STOP_REASON
            decision = self._sampler.decide(
                run_id=run_id, stop_reason=reason, kept_this_hour=quota.get((quota_reason, tool), 0)
            )
            if decision.sampled:
                quota[(quota_reason, tool)] = quota.get((quota_reason, tool), 0) + 1
                group.quota_changed.add((quota_reason, tool))
            group.merged[run_id].update(
                sampled=decision.sampled,
                sample_rule=decision.rule,
                sample_tool=tool,
                decided_unix_nano=group.now_ns,
            )
            group.settle.add(run_id)

    def _publish_quota(self, hour: int, quota: dict[tuple[str, str], int]) -> None:
        if self._quota_hour == hour:
            self._quota = quota

    def _write_rows(self, group: _Group, anomalies: list[StopRow]) -> None:
        now_ns = group.now_ns
        quota = group.quota
        if quota is not None and group.quota_changed:
            hour = hour_bucket(now_ns / _NS)
            # A few rows: bound parameters cost half of an Arrow view here.
            totals = [(hour, r, t, quota[(r, t)]) for r, t in sorted(group.quota_changed)]
            self._con.execute(
                "INSERT INTO sample_quota VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(totals)),
                [value for row in totals for value in row],
            )
            self._after_commit.append(lambda: self._publish_quota(hour, quota))
        if group.existing:
            keys = _key_list(group.merged[r]["run_key"] for r in group.existing)
            self._con.execute(f"DELETE FROM runs WHERE run_key IN ({keys})")
        runs = [
            [row[c] for c in _RUN_COLUMNS]
            for run_id, row in group.merged.items()
            if run_id not in group.emptied
        ]
        if runs:
            self._append("runs", _table(_RUN_COLUMNS, runs))
            # Before the commit: a key of a group that then rolls back is only a false
            # positive, while a key missing from the filter would duplicate its run.
            # Rows read back from the table are in the filter already.
            self._stored_runs.add(
                row["run_key"]
                for run_id, row in group.merged.items()
                if run_id not in group.existing and run_id not in group.emptied
            )
        staged: list[StepRow] = []
        kept: list[StepRow] = []
        for step in group.steps:
            sampled = group.merged[step.run_id]["sampled"]
            if sampled is None:
                staged.append(step)
            elif sampled:
                kept.append(step)
        for table, rows in (("staged_steps", staged), ("steps", kept)):
            if rows:
                self._append(table, _step_table(rows, group.merged, now_ns))
        settle = [
            group.merged[r]
            for r in group.settle
            if r in group.staged_in_db and group.merged[r]["sampled"] is not None
        ]
        if settle:
            sampled = _key_list(row["run_key"] for row in settle if row["sampled"])
            decided = _key_list(row["run_key"] for row in settle)
            self._con.execute(
                f"INSERT INTO steps SELECT * FROM staged_steps WHERE run_key IN ({sampled})"
            )
            self._con.execute(f"DELETE FROM staged_steps WHERE run_key IN ({decided})")
        if group.primary:
            replaced = [s.run_id for s in group.primary if s.run_id in group.stopped_before]
            if replaced:
                keys = _key_list(_run_key(r) for r in replaced)
                self._con.execute(
                    "INSERT INTO stop_anomalies BY NAME SELECT *, "
                    f"'{_ANOMALY_REPLACED}' AS kind FROM stops WHERE run_key IN ({keys})"
                )
                self._con.execute(f"DELETE FROM stops WHERE run_key IN ({keys})")
            self._append(
                "stops",
                _table(
                    _STOP_COLUMNS,
                    [
                        _stop_tuple(_run_key(s.run_id), s, now_ns, group.counted.get(s.run_id) is s)
                        for s in group.primary
                    ],
                ),
            )
        if anomalies or group.replaced:
            self._append(
                "stop_anomalies",
                _table(
                    _ANOMALY_COLUMNS,
                    [
                        _anomaly_tuple(_run_key(s.run_id), s, now_ns, _ANOMALY_REPLACED, counted)
                        for s, counted in group.replaced
                    ]
                    + [
                        _anomaly_tuple(_run_key(s.run_id), s, now_ns, _ANOMALY_DUPLICATE)
                        for s in anomalies
                    ],
                ),
            )
        deltas = [
            (key, tool, outcome, n, agent)
            for (key, tool, outcome, agent), n in group.tool_deltas.items()
            if n
        ]
        if deltas:
            self._append(
                "run_tools", _table(("run_key", "tool", "outcome", "calls", "agent"), deltas)
            )
        if group.canaries:
            self._insert(
                "canaries",
                ("run_id", "first_seen_unix_nano"),
                [(c, now_ns) for c in sorted(group.canaries)],
                "INSERT OR IGNORE INTO canary_flags SELECT * FROM {t}",
            )

    def _maintain(self, requests: list[Future[int]]) -> None:
        self._last_maintenance = time.monotonic()
        now_s = self._clock()
        now_ns = int(now_s * _NS)
        timeout_ns = int(self.config.sampling.undecided_timeout_seconds * _NS)
        retention_ns = int(self.config.dedup_retention_seconds * _NS)
        decided = 0
        self._after_commit.clear()
        try:
            self._con.execute("BEGIN TRANSACTION")
            stale = self._fetch_runs(
                "sampled IS NULL AND last_seen_unix_nano < ? "
                "ORDER BY last_seen_unix_nano LIMIT 10000",
                [now_ns - timeout_ns],
            )
            if stale:
                group = _Group(now_ns, [], [], [], [], set())
                for row in stale:
                    self._adopt(group, row)
                self._decide(group, [(row["run_id"], None) for row in stale])
                self._write_rows(group, [])
                decided = len(stale)
            self._con.execute(
                "DELETE FROM spans_seen WHERE seen_unix_nano < ?", [now_ns - retention_ns]
            )
            self._con.execute(
                "DELETE FROM sample_quota WHERE hour_unix < ?", [hour_bucket(now_s) - 7200]
            )
            self._con.execute("COMMIT")
        except Exception as exc:
            self._after_commit.clear()
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
        if retention <= 0:
            return
        now_ns = int(self._clock() * _NS)
        cutoff = now_ns - int(retention * _NS)
        limit = self.config.prune_max_runs
        con = self._con
        try:
            con.execute("BEGIN TRANSACTION")
            rows = con.execute(
                "SELECT run_key FROM runs WHERE sampled IS NOT NULL "
                "AND last_seen_unix_nano < ? ORDER BY last_seen_unix_nano LIMIT ?",
                [cutoff, limit],
            ).fetchall()
            if rows:
                keys = _key_list(key for (key,) in rows)
                for table in (
                    "steps",
                    "staged_steps",
                    "stops",
                    "stop_anomalies",
                    "run_tools",
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
            logger.info(
                "retention: removed %d runs last seen over %g days ago",
                len(rows),
                retention / 86_400,
            )
        self._prune_due = len(rows) == limit


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of :meth:`StoreReader.list_runs`.

    Attributes:
        items: run rows as dicts: the columns of :data:`RUN_LIST_COLUMNS`, plus
            ``canary_detected``, ``time_unix_nano`` (stop, else end, start or first-seen
            time) and ``top_tool`` (most frequent tool now; ``sample_tool`` is the one the
            hourly cap counted at decision time).
        next_offset: offset of the next page, or ``None`` on the last page.
        seen_before: with ``order="first_seen"``, the bound to pass back with the next
            offsets (runs first seen from then on are left out); ``None`` otherwise.
        next_cursor: with ``order="first_seen"``, the ``after`` of the next page (the
            last row's position), or ``None`` on the last page and for ``order="time"``.
    """

    items: list[dict[str, Any]]
    next_offset: int | None
    seen_before: int | None = None
    next_cursor: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class RunDetail:
    """One run with everything stored about it.

    Attributes:
        run: the run row (as in :class:`RunsPage`).
        steps: steps in order ``(step, start_unix_nano, kind, span_id)``; staged (undecided)
            steps included, marked ``staged=True``.
        steps_truncated: the row cap kept only the last steps (those before the stop).
        stop: the primary stop, or ``None``; ``evidence``: its parsed evidence JSON.
        stop_anomalies: duplicate stops, in arrival order.
        tools: tool calls per (tool, outcome).
        stop_anomalies_truncated / tools_truncated: the row cap kept only the first
            anomalies (in arrival order) / tool rows (by tool, outcome).
    """

    run: dict[str, Any]
    steps: list[dict[str, Any]]
    steps_truncated: bool
    stop: dict[str, Any] | None
    evidence: Any
    stop_anomalies: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stop_anomalies_truncated: bool = False
    tools_truncated: bool = False


@dataclass(frozen=True, slots=True)
class Stats:
    """Aggregates for the overview.

    Attributes:
        stops_by_reason: ``{bucket_unix_nano, stop_reason, stops}`` rows, by bucket.
        loops_by_tool: ``{tool, stop_reason, stops}`` for loop stop reasons, most first.
        truncated: a list hit the row cap.
    """

    stops_by_reason: list[dict[str, Any]]
    loops_by_tool: list[dict[str, Any]]
    truncated: bool


RUN_LIST_COLUMNS: Final = (
    "run_id",
    "trace_id",
    "source",
    "agent",
    "agent_id",
    "conversation_id",
    "parent_run_id",
    "policy_name",
    "policy_version",
    "mode",
    "start_unix_nano",
    "end_unix_nano",
    "status_code",
    "steps",
    "decisions",
    "tool_calls",
    "tool_errors",
    "tool_blocked",
    "tokens",
    "stop_reason",
    "stop_origin",
    "stop_inferred",
    "stop_unix_nano",
    "sample_tool",
    "sampled",
    "sample_rule",
    "duplicate_stops",
    "first_seen_unix_nano",
)

RUN_ORDERS: Final = ("time", "first_seen")
"""Orders of :meth:`StoreReader.list_runs` (and ``order`` of ``/api/v1/runs``)."""

_RUNS_VIEW: Final = (
    "SELECT "
    + ", ".join(f"r.{c}" for c in RUN_LIST_COLUMNS)
    + ", (r.run_id IN (SELECT run_id FROM canary_flags) OR r.trace_id IN "
    "(SELECT run_id FROM canary_flags)) AS canary_detected, "
    "COALESCE(r.stop_unix_nano, r.end_unix_nano, r.start_unix_nano, r.first_seen_unix_nano) "
    "AS time_unix_nano, r.run_key FROM runs r"
)


SQL_LOOPS_BY_TOOL: Final = (
    "SELECT COALESCE(loop_tool, '') AS tool, "
    "CASE WHEN reason IN (SELECT unnest($1)) THEN reason ELSE observe_reason END "
    "AS stop_reason, count(*) AS stops "
    "FROM stops WHERE (reason IN (SELECT unnest($1)) OR observe_reason IN (SELECT unnest($1))) "
    "AND time_unix_nano >= $2 AND time_unix_nano < $3{agent} "
    "GROUP BY ALL ORDER BY stops DESC, tool, stop_reason"
)
"""Loop detections per tool and detector in a time range, as
``loopwatch_loop_detections_total`` counts them (:func:`~loopwatch.collector.detect.
loop_detector`): a stop whose reason is a loop detector, else the detector observe mode
recorded on it (a third-party agent is not stopped: its stop stays ``completed``).
Parameters: the loop reasons, since, until (then the ``{agent}`` filter's, as ``$4``).
The tool is the one the detection's evidence named (``stops.loop_tool``: the ``tool``
label the metric counted the stop under), ``""`` for none (``no_progress``)."""


class StoreReader:
    """Read helpers: parameterized queries with a time limit and a row cap.

    Each query runs on a fresh cursor (its own DuckDB connection to the same database,
    seeing committed data only) and is interrupted after ``timeout_seconds``. Thread-safe.

    Args:
        cursor_factory: returns a new DuckDB connection/cursor for one query.
        timeout_seconds: time limit per query.
        max_rows: row cap per query.
        owned: a connection this reader closes in :meth:`close`.

    Raises (from every query method):
        ReadTimeout: the query ran past its time limit.
        duckdb.Error: the database failed.

    Example:
        >>> reader = StoreReader.open_readonly("loopwatch.duckdb")  # doctest: +SKIP
        >>> page = reader.list_runs(stop_reason="repeated_action", sampled=True, limit=20)
        >>> detail = reader.get_run(page.items[0]["run_id"])  # steps, stop, evidence
    """

    def __init__(
        self,
        cursor_factory: Callable[[], duckdb.DuckDBPyConnection],
        *,
        timeout_seconds: float = 5.0,
        max_rows: int = 10_000,
        owned: duckdb.DuckDBPyConnection | None = None,
    ) -> None:
        if not timeout_seconds > 0 or max_rows < 1:
            raise ValueError("timeout_seconds must be > 0 and max_rows >= 1")
        self._factory = cursor_factory
        self._lock = threading.Lock()
        self.timeout_seconds = timeout_seconds
        self.max_rows = max_rows
        self._owned = owned

    @classmethod
    def open_readonly(
        cls, path: str | Path, *, timeout_seconds: float = 5.0, max_rows: int = 10_000
    ) -> StoreReader:
        """Open a file read-only (when no collector owns it); close with :meth:`close`.

        Raises:
            duckdb.IOException: the file is missing or held by a writer process.
        """
        con = duckdb.connect(str(path), read_only=True)
        return cls(con.cursor, timeout_seconds=timeout_seconds, max_rows=max_rows, owned=con)

    def close(self) -> None:
        """Close a connection opened by :meth:`open_readonly` (no-op otherwise)."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def _query(
        self,
        sql: str,
        params: Sequence[Any],
        *,
        max_rows: int | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        cap = self.max_rows if max_rows is None else max_rows
        with self._lock:
            cursor = self._factory()
        timer = threading.Timer(self.timeout_seconds, cursor.interrupt)
        timer.daemon = True
        timer.start()
        try:
            cursor.execute(sql, list(params))
            names = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchmany(cap + 1)
        except duckdb.InterruptException as exc:
            raise ReadTimeout(self.timeout_seconds) from exc
        finally:
            timer.cancel()
            cursor.close()
        truncated = len(rows) > cap
        return [dict(zip(names, r, strict=True)) for r in rows[:cap]], truncated

    def list_runs(
        self,
        *,
        stop_reason: str | None = None,
        agent: str | None = None,
        tool: str | None = None,
        since_unix_nano: int | None = None,
        until_unix_nano: int | None = None,
        canary: bool | None = None,
        sampled: bool | None = None,
        detector: str | None = None,
        loop_tool: str | None = None,
        limit: int = 50,
        offset: int = 0,
        order: str = "time",
        seen_before: int | None = None,
        after: tuple[int, int] | None = None,
    ) -> RunsPage:
        """List runs, newest first (by stop time, else end, start or first-seen time).

        Ordering and paging: ``order="time"`` sorts by the run's time, which changes when
        its stop (or a later span) arrives, so offset pages read while data arrives can
        skip or repeat such a run. ``order="first_seen"`` sorts by when the collector
        stored the run's first span, which never changes; with ``seen_before`` (the
        first page's :attr:`RunsPage.seen_before`, computed in the same snapshot as that
        page) later pages leave out runs first seen since. Offsets still shift when a
        run listed on an earlier page is removed (a third-party trace's provisional run
        merged into its agent run, retention), which skips a run; ``after`` (the
        previous page's :attr:`RunsPage.next_cursor`: keyset paging on
        ``(first_seen_unix_nano, run_key)``) does not, and leaves out runs first seen
        later by itself: each run that matches the filters throughout is listed exactly
        once.

        Args:
            stop_reason / agent: exact match. tool: the run called this tool.
            detector: the run was stopped by this loop detector, or observe mode
                detected it (a third-party run's stop stays ``completed``; see
                :func:`~loopwatch.collector.detect.loop_detector`).
            loop_tool: the run's loop detection (its stop's, else observe mode's) named
                this tool (``stops.loop_tool``: what ``loopwatch_loop_detections_total``
                counts it under); detections that name no tool (``no_progress``) match
                no tool.
            since_unix_nano / until_unix_nano: half-open time range ``[since, until)``.
            canary: only flagged (``True``) or unflagged (``False``) runs.
            sampled: ``True``/``False`` for decided runs; undecided runs match neither.
            limit: page size, 1..``max_rows``. offset: rows to skip, >= 0.
            order: ``"time"`` or ``"first_seen"``. seen_before: only runs first seen
                before this collector time (ns), for ``order="first_seen"`` paging.
            after: ``(first_seen_unix_nano, run_key)`` of the last run already read;
                only runs after it in ``order="first_seen"`` order.

        Raises:
            ValueError: ``limit``, ``offset`` or ``order`` out of range, or ``after``
                with ``order="time"``.
        """
        if not 1 <= limit <= self.max_rows or offset < 0:
            raise ValueError(f"limit must be in 1..{self.max_rows} and offset >= 0")
        if order not in RUN_ORDERS:
            raise ValueError("order must be one of " + ", ".join(RUN_ORDERS))
        if after is not None and order != "first_seen":
            raise ValueError("a cursor pages order=first_seen only")
        where: list[str] = []
        params: list[Any] = []
        for clause, value in (
            ("stop_reason = ?", stop_reason),
            ("agent = ?", agent),
            (
                "run_key IN (SELECT run_key FROM run_tools WHERE tool = ? "
                "GROUP BY run_key HAVING sum(calls) > 0)",
                tool,
            ),
            (
                # A loop detection only (SQL_LOOPS_BY_TOOL's rule): rows stored before
                # loop_tool kept to loop detections hold a retry budget's tool too.
                "run_key IN (SELECT run_key FROM stops WHERE loop_tool = ? AND "
                f"(reason IN ({_SQL_DETECTORS}) OR observe_reason IN ({_SQL_DETECTORS})))",
                loop_tool,
            ),
            ("time_unix_nano >= ?", since_unix_nano),
            ("time_unix_nano < ?", until_unix_nano),
            ("canary_detected = ?", canary),
            ("sampled = ?", sampled),
            ("first_seen_unix_nano < ?", seen_before),
        ):
            if value is not None:
                where.append(clause)
                params.append(value)
        if detector is not None:
            where.append(
                "(stop_reason = ? OR run_key IN "
                "(SELECT run_key FROM stops WHERE observe_reason = ?))"
            )
            params += [detector, detector]
        if after is not None:
            where.append("(first_seen_unix_nano < ? OR (first_seen_unix_nano = ? AND run_key > ?))")
            params += [after[0], after[0], after[1]]
        snapshot = order == "first_seen" and seen_before is None and after is None
        # The bound is read in the page's own snapshot: the writer stamps each group
        # with its clock when it starts, so a run not yet committed is first seen later.
        bound = (
            ", (SELECT max(first_seen_unix_nano) + 1 FROM runs) AS _lw_bound" if snapshot else ""
        )
        sql = f"SELECT *{bound} FROM ({_RUNS_VIEW}) v"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if order == "time":
            sql += " ORDER BY time_unix_nano DESC, run_id LIMIT ? OFFSET ?"
        else:  # run_key: unique, so a cursor names one position
            sql += " ORDER BY first_seen_unix_nano DESC, run_key LIMIT ? OFFSET ?"
        rows, _ = self._query(sql, [*params, limit + 1, offset], max_rows=limit + 1)
        more = len(rows) > limit
        page = rows[:limit]
        cursor = None
        if order == "first_seen" and more:
            cursor = (int(page[-1]["first_seen_unix_nano"]), int(page[-1]["run_key"]))
        if snapshot:
            for row in rows:
                seen_before = row.pop("_lw_bound")
            if seen_before is None:  # an empty page: bound it by the store as it is now
                found, _ = self._query("SELECT max(first_seen_unix_nano) + 1 AS b FROM runs", [])
                seen_before = found[0]["b"] if found else None
        self._attach_top_tools(page)
        return RunsPage(
            page,
            offset + limit if more else None,
            seen_before if order == "first_seen" else None,
            cursor,
        )

    def _attach_top_tools(self, runs: list[dict[str, Any]]) -> None:
        """Set ``top_tool`` (most frequent tool now; ties: first by name); drop ``run_key``."""
        if not runs:
            return
        # One row per run, picked in SQL: the page's (run, tool) rows can outnumber the
        # row cap (it counts runs), which left the newest runs of a full page with None.
        rows, _ = self._query(
            "SELECT run_key, tool FROM (SELECT run_key, tool, sum(calls) AS calls "
            "FROM run_tools WHERE run_key IN (SELECT unnest(?::UBIGINT[])) "
            "GROUP BY ALL HAVING sum(calls) > 0) "
            "QUALIFY row_number() OVER (PARTITION BY run_key ORDER BY calls DESC, tool) = 1",
            [[r["run_key"] for r in runs]],
            max_rows=len(runs),
        )
        best = {row["run_key"]: row["tool"] for row in rows}
        for run in runs:
            run["top_tool"] = best.get(run.pop("run_key"))

    def get_run(self, run_id: str) -> RunDetail | None:
        """Return one run with its steps, stop, evidence and anomalies, or ``None``."""
        key = _run_key(run_id)
        runs, _ = self._query(f"SELECT * FROM ({_RUNS_VIEW}) v WHERE run_key = ?", [key])
        if not runs or runs[0]["run_id"] != run_id:
            return None
        self._attach_top_tools(runs)
        columns = ", ".join(_STEP_FIELDS)
        steps, truncated = self._query(
            f"SELECT * FROM (SELECT {columns}, false AS staged FROM steps WHERE run_key = ? "
            f"UNION ALL SELECT {columns}, true FROM staged_steps WHERE run_key = ?) "
            "ORDER BY step DESC NULLS FIRST, start_unix_nano DESC, kind DESC, span_id DESC "
            "LIMIT ?",
            [key, key, self.max_rows + 1],
        )
        steps.reverse()
        stop_columns = ", ".join(_STOP_FIELDS)
        stops, _ = self._query(f"SELECT {stop_columns} FROM stops WHERE run_key = ?", [key])
        anomalies, anomalies_truncated = self._query(
            f"SELECT {stop_columns}, kind FROM stop_anomalies WHERE run_key = ? "
            "ORDER BY received_unix_nano, span_id",
            [key],
        )
        tools, tools_truncated = self._query(
            "SELECT tool, outcome, sum(calls) AS calls FROM run_tools WHERE run_key = ? "
            "GROUP BY ALL HAVING sum(calls) > 0 ORDER BY ALL",
            [key],
        )
        stop = stops[0] if stops else None
        evidence: Any = None
        if stop is not None and stop.get("evidence"):
            try:
                evidence = json.loads(stop["evidence"])
            except (ValueError, RecursionError):  # client text; nesting past the parser
                evidence = stop["evidence"]
        return RunDetail(
            runs[0],
            steps,
            truncated,
            stop,
            evidence,
            anomalies,
            tools,
            anomalies_truncated,
            tools_truncated,
        )

    def stats(
        self, *, since_unix_nano: int, until_unix_nano: int, bucket_seconds: int = 3600
    ) -> Stats:
        """Stops by reason per time bucket and loop stops per tool in ``[since, until)``.

        Raises:
            ValueError: ``bucket_seconds`` < 1 or an empty range.
        """
        if bucket_seconds < 1 or until_unix_nano <= since_unix_nano:
            raise ValueError("bucket_seconds must be >= 1 and since < until")
        bucket = bucket_seconds * _NS
        by_reason, t1 = self._query(
            "SELECT (time_unix_nano // ?) * ? AS bucket_unix_nano, reason AS stop_reason, "
            "count(*) AS stops FROM stops WHERE time_unix_nano >= ? AND time_unix_nano < ? "
            "GROUP BY ALL ORDER BY ALL",
            [bucket, bucket, since_unix_nano, until_unix_nano],
        )
        loops, t2 = self._query(
            SQL_LOOPS_BY_TOOL.format(agent=""),
            [list(LOOP_STOP_REASONS), since_unix_nano, until_unix_nano],
        )
        return Stats(by_reason, loops, t1 or t2)
