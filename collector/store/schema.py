"""The store's schema: numbered migrations, and every table's columns, spelled once.

Free of pyarrow and of a runtime DuckDB import, so the dashboard (duckdb and pandas only)
and the pure ``runs`` stage can import the column names.

Schema (``SCHEMA_VERSION`` = 21; numbered migrations in :data:`MIGRATIONS` are applied in
order at open; times are integers in ns since the Unix epoch unless named ``_unix``):

- ``runs``: one row per run (``run_key``; one row per key is the writer's rule, with no key
  index since schema 21: an ART index stays in DuckDB's memory and grew with every stored
  run), kept until retention removes it: counts,
  the primary stop denormalized, the sampling decision (``sampled``, ``sample_rule``,
  ``sample_tool``); ``span_start_unix_nano`` / ``span_end_unix_nano``: the times of its
  run span rows alone.
- ``staged_steps`` / ``steps``: decision and tool_result rows (same columns):
  ``staged_steps`` holds the steps of runs not decided yet by sampling (the runs stage's
  durable buffer, :mod:`loopwatch.collector.runs`).
- ``pending_steps``: third-party steps whose agent run is not known yet (the map stage's
  durable buffer): the step as JSON (``row``, the :class:`~loopwatch.collector.rows.
  StepRow` field values in order) and its span's parent id; append-only, a row leaves
  in the transaction that stores its final step.
- ``stop_reports``: every stop that was its run's primary when stored, at most one per
  (``run_key``, ``origin``) (by the runs stage's rule; no key index since schema 20: an
  ART index stays in DuckDB's memory), append-only (``counted``: whether ``/metrics`` counted it;
  ``loop_tool``: the tool label its loop detection was counted under,
  :func:`~loopwatch.collector.detect.loop_tool`); ``stop_duplicates``: duplicate stops.
  Readers read two views: ``stops`` (one per run, the strongest report by the runs
  stage's precedence) and ``stop_anomalies`` (``kind``: ``duplicate_stop``, or
  ``replaced_stop`` for a report a stronger one outranks, with its own ``counted``).
  Schema 18: steps keep the response ladder's rung of a warned or nudged call
  (``loop_response``, ``loop_rung``, ``loop_detector``), stops the run's nudges
  (``nudges``: validated compact JSON, :mod:`loopwatch.collector.nudges`) and
  ``nudges_dropped``.
- ``run_tools``: tool-call count deltas per (run, tool, outcome, agent), append-only;
  sum them.
- ``canary_flags``: run ids or trace ids the redact stage flagged.
- ``spans_seen``: 64-bit span id and low 64 bits of the trace id of each stored span,
  and when it was stored (no index: append-only, pruned by time).
- ``sample_quota``: runs kept per (hour, stop_reason, tool), append-only: each group that
  keeps runs appends the new totals and the largest ``kept`` of a key is its count.
- ``shipped_runs`` (schema 19, fleet mode): one row per run the shipper published to the
  lake (:mod:`loopwatch.collector.lake.ship`), appended after the lake's commit;
  ``skipped``: the lake already held the run from another collector. Retention removes a
  shipped run (and its mark) after ``lake.local_retention_seconds``.
- ``schema_version``: applied migrations.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..detect import LOOP_DETECTORS
from ..errors import SchemaTooNew
from ..rows import STOP_ORIGINS

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "ANOMALY_COLUMNS",
    "ANOMALY_DUPLICATE",
    "ANOMALY_REPLACED",
    "MIGRATIONS",
    "RUN_ATTR_FIELDS",
    "RUN_COLUMNS",
    "RUN_LIST_COLUMNS",
    "SCHEMA_VERSION",
    "SQL_DETECTORS",
    "STEP_COLUMNS",
    "STEP_FIELDS",
    "STOP_COLUMNS",
    "STOP_FIELDS",
    "STOP_NUDGE_FIELDS",
    "STOP_ORDER",
    "Migration",
    "apply_migrations",
    "key_list",
    "run_key_of",
]

ANOMALY_DUPLICATE: Final = "duplicate_stop"
ANOMALY_REPLACED: Final = "replaced_stop"


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

SQL_DETECTORS: Final = ", ".join(f"'{d}'" for d in sorted(LOOP_DETECTORS))
_SQL_LOOP_EVIDENCE: Final = (
    f"CASE WHEN reason IN ({SQL_DETECTORS}) THEN evidence "
    f"WHEN observe_reason IN ({SQL_DETECTORS}) THEN observe_evidence END"
)
_SQL_LOOP_TOOL: Final = (
    f"CASE WHEN json_valid({_SQL_LOOP_EVIDENCE}) THEN CASE WHEN "
    f"json_type({_SQL_LOOP_EVIDENCE}, '$.tool') = 'VARCHAR' THEN "
    f"json_extract_string({_SQL_LOOP_EVIDENCE}, '$.tool') END END"
)

# A run's stops ranked as the runs stage ranks them (rows.STOP_ORIGINS, runs.merge_stops):
# the strongest origin first; stop_reports holds at most one row per (run, origin).
_SQL_STOP_ORDER: Final = (
    "row_number() OVER (PARTITION BY run_key ORDER BY CASE origin "
    + " ".join(f"WHEN '{origin}' THEN {rank}" for origin, rank in STOP_ORIGINS.items())
    + " ELSE 0 END DESC, received_unix_nano)"
)

STOP_ORDER: Final = _SQL_STOP_ORDER
"""The ``stops`` view's ranking (a window expression over ``stop_reports``; ``= 1`` is
the primary stop), for readers that rank a subset (the lake shipper)."""

_STOP_VIEWS: Final = (
    f"CREATE VIEW stops AS SELECT * FROM stop_reports QUALIFY {_SQL_STOP_ORDER} = 1",
    "CREATE VIEW stop_anomalies AS SELECT * FROM stop_duplicates UNION ALL BY NAME "
    f"SELECT * FROM (SELECT *, '{ANOMALY_REPLACED}' AS kind FROM stop_reports "
    f"QUALIFY {_SQL_STOP_ORDER} > 1)",
)
_STEP_LATE_DDL: Final = (
    ("loop_response", "VARCHAR"),
    ("loop_rung", "BIGINT"),
    ("loop_detector", "VARCHAR"),
)

# The runs columns that schema 20 declares NOT NULL, and those with DEFAULT 0 (migration
# 21 restores both after its CREATE TABLE AS).
_RUN_COUNTS_V20: Final = (
    "steps",
    "decisions",
    "tool_calls",
    "tool_errors",
    "tool_blocked",
    "tokens",
)
_RUN_NOT_NULL_V20: Final = (
    "run_key",
    "run_id",
    "trace_id",
    "source",
    *_RUN_COUNTS_V20,
    "first_seen_unix_nano",
    "last_seen_unix_nano",
)
_RUN_ZERO_DEFAULT_V20: Final = (*_RUN_COUNTS_V20, "duplicate_stops")

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
    # 3, 12 and 14 created or changed tables that restored /metrics totals at start
    # (canary_hits, metric_labels, pruned_*); 15 drops what older files hold of them.
    Migration(3, "canary hits by location (superseded: dropped by 15)", ()),
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
        "stops.loop_tool (the detection's tool label, counted live)",
        tuple(
            statement
            for table in ("stops", "stop_anomalies")
            for statement in (
                f"ALTER TABLE {table} ADD COLUMN loop_tool VARCHAR",
                # Rows stored before: the live rule (detect.loop_tool) in SQL, and
                # evidence that is not JSON names no tool instead of failing.
                f"UPDATE {table} SET loop_tool = {_SQL_LOOP_TOOL}",
            )
        ),
    ),
    Migration(12, "metric_labels (superseded: dropped by 15)", ()),
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
    Migration(14, "pruned_stops.steps_since_progress nullable (superseded: dropped by 15)", ()),
    Migration(
        15,
        "drop the tables that restored /metrics totals at start (counters start from zero)",
        tuple(
            f"DROP TABLE IF EXISTS {table}"
            for table in ("metric_labels", "canary_hits", "pruned_stops", "pruned_tool_calls")
        ),
    ),
    Migration(
        16,
        "pending_steps: third-party steps held until their agent run is known",
        (
            "CREATE TABLE pending_steps (trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL, "
            "parent_span_id VARCHAR NOT NULL, row VARCHAR NOT NULL, "
            "received_unix_nano BIGINT NOT NULL)",
        ),
    ),
    Migration(
        17,
        "stop_reports keeps every stop that was its run's primary, one per origin; the "
        "views stops and stop_anomalies choose the primary by precedence when read",
        (
            "CREATE TABLE stop_reports (" + _STOP_COLUMNS_DDL + ", observe_evidence VARCHAR, "
            "agent VARCHAR, counted BOOLEAN NOT NULL, loop_tool VARCHAR, "
            "PRIMARY KEY (run_key, origin))",
            "INSERT INTO stop_reports SELECT * FROM stops",
            "DROP TABLE stops",
            "ALTER TABLE stop_anomalies RENAME TO stop_duplicates",
            *_STOP_VIEWS,
        ),
    ),
    Migration(
        18,
        "the response ladder: a step's loop_response, loop_rung, loop_detector; a stop's "
        "nudges (validated JSON) and nudges_dropped",
        (
            *(
                f"ALTER TABLE {table} ADD COLUMN {column} {kind}"
                for table in ("staged_steps", "steps")
                for column, kind in _STEP_LATE_DDL
            ),
            *(
                f"ALTER TABLE {table} ADD COLUMN {column} {kind}"
                for table in ("stop_reports", "stop_duplicates")
                for column, kind in (("nudges", "VARCHAR"), ("nudges_dropped", "BIGINT"))
            ),
            # The views were bound to the columns of their time: bind them again.
            "DROP VIEW stop_anomalies",
            "DROP VIEW stops",
            *_STOP_VIEWS,
        ),
    ),
    Migration(
        19,
        "fleet mode: shipped_runs, the runs published to the lake (append-only marks)",
        (
            # No key: appended once per run by the shipper after its lake commit, read by
            # anti-join; retention deletes a run's mark with the run.
            "CREATE TABLE shipped_runs (run_key UBIGINT NOT NULL, "
            "shipped_unix_nano BIGINT NOT NULL, skipped BOOLEAN NOT NULL)",
        ),
    ),
    Migration(
        20,
        "stop_reports without its (run_key, origin) key index: DuckDB keeps a key's ART "
        "index in memory, and this one grew a collector's memory with every stored stop",
        (
            # Index-free, like spans_seen: the runs stage appends at most one report per
            # (run, origin) (its primary-stop rule, collector/runs.py), and readers scan
            # through the views. The composite key's index took about twice the memory of
            # the runs key's (measured in the soak, tests/reliability/test_soak.py).
            "DROP VIEW stop_anomalies",
            "DROP VIEW stops",
            "CREATE TABLE stop_reports_v20 AS SELECT * FROM stop_reports",
            "DROP TABLE stop_reports",
            "ALTER TABLE stop_reports_v20 RENAME TO stop_reports",
            # CREATE TABLE AS copies columns, not constraints: the NOT NULLs of schema 17.
            *(
                f"ALTER TABLE stop_reports ALTER COLUMN {column} SET NOT NULL"
                for column in (
                    "run_key",
                    "run_id",
                    "trace_id",
                    "span_id",
                    "source",
                    "origin",
                    "stop_inferred",
                    "reason",
                    "time_unix_nano",
                    "received_unix_nano",
                    "counted",
                )
            ),
            *_STOP_VIEWS,
        ),
    ),
    Migration(
        21,
        "runs without its run_key primary key: its ART index lived in DuckDB's memory and "
        "grew with every stored run (45 bytes a run, and twice that again at a checkpoint)",
        (
            # The writer finds a run by its key in time tiers of last_seen_unix_nano (zone
            # maps skip old row groups; collector/store/apply.py, GroupWriter.fetch_stored)
            # and deletes it with the same bound; the Bloom filter of run keys and one row
            # per key are the writer's rules, tested in tests/unit/test_store.py. Rows are
            # copied in last_seen order so the tiers skip from the first checkpoint on.
            "CREATE TABLE runs_v21 AS SELECT * FROM runs ORDER BY last_seen_unix_nano",
            "DROP TABLE runs",
            "ALTER TABLE runs_v21 RENAME TO runs",
            # CREATE TABLE AS copies columns, not constraints or defaults.
            *(
                f"ALTER TABLE runs ALTER COLUMN {column} SET NOT NULL"
                for column in _RUN_NOT_NULL_V20
            ),
            *(
                f"ALTER TABLE runs ALTER COLUMN {column} SET DEFAULT 0"
                for column in _RUN_ZERO_DEFAULT_V20
            ),
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


STEP_FIELDS: Final = (
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
    "loop_response",  # schema 18, after received_unix_nano in the tables
    "loop_rung",
    "loop_detector",
)
STEP_LATE: Final = len(_STEP_LATE_DDL)
STEP_COLUMNS: Final = (
    "run_key",
    *STEP_FIELDS[:-STEP_LATE],
    "received_unix_nano",
    *STEP_FIELDS[-STEP_LATE:],
)
STOP_FIELDS: Final = (
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
STOP_NUDGE_FIELDS: Final = ("nudges", "nudges_dropped")
"""StopRow fields of schema 18, read beside :data:`STOP_FIELDS`."""
# Table order: columns added by a migration come after ``received_unix_nano`` (and after
# ``kind`` in stop_anomalies), in migration order.
STOP_LATE: Final = 2  # observe_evidence (schema 7), agent (schema 8)
STOP_COLUMNS: Final = (
    "run_key",
    *STOP_FIELDS[:-STOP_LATE],
    "received_unix_nano",
    *STOP_FIELDS[-STOP_LATE:],
    "counted",  # schema 9; not a StopRow field
    "loop_tool",  # schema 11; detect.loop_tool of the row
    *STOP_NUDGE_FIELDS,  # schema 18
)
AFTER_RECEIVED: Final = STOP_LATE + 2 + len(STOP_NUDGE_FIELDS)
ANOMALY_COLUMNS: Final = (
    *STOP_COLUMNS[:-AFTER_RECEIVED],
    "kind",
    *STOP_COLUMNS[-AFTER_RECEIVED:],
)

RUN_ATTR_FIELDS: Final = (
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
RUN_COLUMNS: Final = (
    "run_key",
    "run_id",
    "trace_id",
    "run_span_id",
    "source",
    *RUN_ATTR_FIELDS,
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
COUNT_COLUMNS: Final = ("decisions", "tool_calls", "tool_errors", "tool_blocked", "tokens")
INT_FIELDS: Final = frozenset(
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
        *COUNT_COLUMNS,
        "stop_unix_nano",
        "first_seen_unix_nano",
        "last_seen_unix_nano",
        "calls",
        "seen_unix_nano",
        "decided_unix_nano",
        "kept",
        "hour_unix",
        "duplicate_stops",
        "span_start_unix_nano",
        "span_end_unix_nano",
        "loop_rung",
        "nudges_dropped",
    }
)
FLOAT_FIELDS: Final = frozenset(
    {"cost_usd", "limit_value", "observed", "usage_cost_usd", "usage_elapsed_seconds"}
)
BOOL_FIELDS: Final = frozenset({"progress", "stop_inferred", "sampled"})
UINT_FIELDS: Final = frozenset({"span_key", "trace_key", "run_key"})

_NOT_LISTED: Final = frozenset(
    {"run_key", "run_span_id", "detector_version", "limits", "decided_unix_nano"}
    | {"last_seen_unix_nano", "span_start_unix_nano", "span_end_unix_nano"}
)
RUN_LIST_COLUMNS: Final = tuple(c for c in RUN_COLUMNS if c not in _NOT_LISTED)
"""The columns of ``runs`` a run list returns (``StoreReader.list_runs``, ``/api/v1/runs``)."""

RUN_ORDERS: Final = ("time", "first_seen")
"""Orders of :meth:`StoreReader.list_runs` (and ``order`` of ``/api/v1/runs``)."""


def run_key_of(run_id: str) -> int:
    """64-bit key of a run id (blake2b): ``run_key`` of every table that names a run."""
    digest = hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def key_list(keys: Iterable[int]) -> str:
    """Render run keys as a literal SQL list.

    DuckDB pushes a literal integer ``IN (...)`` list into the table scan as a zone-map
    filter, which a bound list parameter or a join is not. Only ints computed here are
    rendered, never client text.
    """
    return ",".join(str(int(k)) for k in keys) or "NULL"
