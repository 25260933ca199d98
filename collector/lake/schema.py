"""The lake's tables: the documented contract of docs/lake.md, spelled once.

Each lake table holds the columns of the collector's local table of the same name
(``collector/store/schema.py``; for ``stops``, the primary stop the local ``stops`` view
chooses), plus where and when the row was shipped:

- ``collector_id``: the shipping collector (``--collector-id``, default the host name);
- ``shipped_unix_nano``: when its lake transaction began.

``run_tools`` also carries ``run_id``, so every table joins on ``run_id``. Times are
nanoseconds since the Unix epoch, as everywhere in loopwatch. ``lake_meta`` holds the
contract version; a lake written by a newer contract is refused, never rewritten.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from ..errors import LakeUnavailable
from .connect import ALIAS

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "BATCH_TABLES",
    "LAKE_TABLES",
    "LAKE_VERSION",
    "ensure_lake_schema",
    "lake_columns",
    "views",
]

LAKE_VERSION: Final = 1
"""The contract version of docs/lake.md. Raise it (with a migration) when a column changes."""

_SHIPPED: Final = (("collector_id", "VARCHAR"), ("shipped_unix_nano", "BIGINT"))

LAKE_TABLES: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "runs": (
        ("run_key", "UBIGINT"), ("run_id", "VARCHAR"), ("trace_id", "VARCHAR"),
        ("run_span_id", "VARCHAR"), ("source", "VARCHAR"), ("agent", "VARCHAR"),
        ("agent_id", "VARCHAR"), ("conversation_id", "VARCHAR"),
        ("parent_run_id", "VARCHAR"), ("policy_name", "VARCHAR"),
        ("policy_version", "VARCHAR"), ("detector_version", "VARCHAR"),
        ("limits", "VARCHAR"), ("mode", "VARCHAR"), ("start_unix_nano", "BIGINT"),
        ("end_unix_nano", "BIGINT"), ("status_code", "SMALLINT"), ("steps", "BIGINT"),
        ("decisions", "BIGINT"), ("tool_calls", "BIGINT"), ("tool_errors", "BIGINT"),
        ("tool_blocked", "BIGINT"), ("tokens", "BIGINT"), ("stop_reason", "VARCHAR"),
        ("stop_origin", "VARCHAR"), ("stop_inferred", "BOOLEAN"),
        ("stop_unix_nano", "BIGINT"), ("sample_tool", "VARCHAR"), ("sampled", "BOOLEAN"),
        ("sample_rule", "VARCHAR"), ("decided_unix_nano", "BIGINT"),
        ("first_seen_unix_nano", "BIGINT"), ("last_seen_unix_nano", "BIGINT"),
        ("duplicate_stops", "BIGINT"), ("span_start_unix_nano", "BIGINT"),
        ("span_end_unix_nano", "BIGINT"),
    ),
    "stops": (
        ("run_key", "UBIGINT"), ("run_id", "VARCHAR"), ("trace_id", "VARCHAR"),
        ("span_id", "VARCHAR"), ("source", "VARCHAR"), ("origin", "VARCHAR"),
        ("stop_inferred", "BOOLEAN"), ("reason", "VARCHAR"), ("time_unix_nano", "BIGINT"),
        ("step", "BIGINT"), ("dimension", "VARCHAR"), ("limit_value", "DOUBLE"),
        ("observed", "DOUBLE"), ("basis", "VARCHAR"), ("evidence", "VARCHAR"),
        ("message", "VARCHAR"), ("steps_since_progress", "BIGINT"),
        ("usage_model_turns", "BIGINT"), ("usage_tool_attempts", "BIGINT"),
        ("usage_tool_successes", "BIGINT"), ("usage_tokens", "BIGINT"),
        ("usage_cost_usd", "DOUBLE"), ("usage_elapsed_seconds", "DOUBLE"),
        ("observe_reason", "VARCHAR"), ("observe_step", "BIGINT"),
        ("received_unix_nano", "BIGINT"), ("observe_evidence", "VARCHAR"),
        ("agent", "VARCHAR"), ("counted", "BOOLEAN"), ("loop_tool", "VARCHAR"),
        ("nudges", "VARCHAR"), ("nudges_dropped", "BIGINT"),
    ),
    "steps": (
        ("run_key", "UBIGINT"), ("trace_id", "VARCHAR"), ("span_id", "VARCHAR"),
        ("run_id", "VARCHAR"), ("source", "VARCHAR"), ("kind", "VARCHAR"),
        ("step", "BIGINT"), ("start_unix_nano", "BIGINT"), ("end_unix_nano", "BIGINT"),
        ("status_code", "SMALLINT"), ("decision_type", "VARCHAR"),
        ("decision_fingerprint", "VARCHAR"), ("tool", "VARCHAR"),
        ("tool_call_id", "VARCHAR"), ("outcome", "VARCHAR"), ("risk", "VARCHAR"),
        ("error_type", "VARCHAR"), ("blocked_by", "VARCHAR"), ("failure_class", "VARCHAR"),
        ("action_fingerprint", "VARCHAR"), ("observation_digest", "VARCHAR"),
        ("progress", "BOOLEAN"), ("steps_since_progress", "BIGINT"),
        ("input_tokens", "BIGINT"), ("output_tokens", "BIGINT"), ("cost_usd", "DOUBLE"),
        ("arguments", "VARCHAR"), ("result", "VARCHAR"), ("received_unix_nano", "BIGINT"),
        ("loop_response", "VARCHAR"), ("loop_rung", "BIGINT"), ("loop_detector", "VARCHAR"),
    ),
    "run_tools": (
        ("run_key", "UBIGINT"), ("run_id", "VARCHAR"), ("tool", "VARCHAR"),
        ("outcome", "VARCHAR"), ("calls", "BIGINT"), ("agent", "VARCHAR"),
    ),
    "canary_flags": (("run_id", "VARCHAR"), ("first_seen_unix_nano", "BIGINT")),
}  # fmt: skip
"""Each lake table's own columns, in order; :func:`lake_columns` adds the shipped pair."""

BATCH_TABLES: Final = {table: f"loopwatch_batch_{table}" for table in LAKE_TABLES}
"""The names under which the shipper shows DuckDB the batch being shipped, one per lake
table, with that table's own columns (:data:`LAKE_TABLES`): Arrow views
(:func:`views`), or temporary tables where a statement reads one twice (``fold.py``)."""


@contextlib.contextmanager
def views(con: duckdb.DuckDBPyConnection, tables: dict[str, Any]) -> Iterator[None]:
    """Register each array of ``tables`` under its :data:`~loopwatch.collector.lake.schema.
    BATCH_TABLES` name for ONE statement: DuckDB scans an Arrow C stream capsule once,
    and is handed capsules only (given another object, its client imports pyarrow to ask
    whether it is a pyarrow table; ``collector/store/arrow.py``).

    Args:
        con: the connection the statement runs on.
        tables: ``{lake table: array}``, each read at most once by the statement.
    """
    for table, array in tables.items():
        con.register(BATCH_TABLES[table], array.__arrow_c_stream__())
    try:
        yield
    finally:
        for table in tables:
            con.unregister(BATCH_TABLES[table])


def lake_columns(table: str) -> tuple[tuple[str, str], ...]:
    """All columns of a lake table, ``(name, DuckDB type)`` in order, shipped pair last.

    Raises:
        KeyError: ``table`` is not a lake table.
    """
    return LAKE_TABLES[table] + _SHIPPED


def ensure_lake_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the lake's tables if missing, and check the lake's contract version.

    Safe to run from several collectors at once: ``CREATE TABLE IF NOT EXISTS`` commits
    that lose DuckLake's conflict check are retried by the caller's retry loop.

    Raises:
        LakeUnavailable: the lake was written by a newer contract (``what="version"``).
        duckdb.Error: the catalog failed mid-way (retryable).
    """
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(
            f"CREATE TABLE IF NOT EXISTS {ALIAS}.lake_meta "
            "(contract_version INTEGER, created_unix_nano BIGINT)"
        )
        for table in LAKE_TABLES:
            columns = ", ".join(f"{name} {kind}" for name, kind in lake_columns(table))
            con.execute(f"CREATE TABLE IF NOT EXISTS {ALIAS}.{table} ({columns})")
        row = con.execute(f"SELECT max(contract_version) FROM {ALIAS}.lake_meta").fetchone()
        found = None if row is None else row[0]
        if found is None:
            con.execute(
                f"INSERT INTO {ALIAS}.lake_meta VALUES (?, ?)", [LAKE_VERSION, time.time_ns()]
            )
        elif int(found) > LAKE_VERSION:
            raise LakeUnavailable(
                "version",
                f"the lake's contract version {found} is newer than this loopwatch's "
                f"{LAKE_VERSION}: upgrade loopwatch",
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
