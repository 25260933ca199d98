"""Read queries beyond :class:`~loopwatch.collector.store.StoreReader`'s own, for the dashboard.

The read API (:mod:`loopwatch.collector.api`) serves them and the dashboard's
``DuckDBSource`` runs the same functions on a file it opened read-only, so both tell the
same story from one copy of the SQL. Each function takes a :class:`StoreReader` and runs
parameterized SQL through its ``_query``, with the reader's time limit and row cap.

- :func:`run_extra`: a run's effective ``limits`` (parsed JSON) and ``detector_version``.
- :func:`attach_steps_since_progress`: ``steps_since_progress`` of the primary stop, added
  to run rows (``None`` for a run without a stop).
- :func:`tools`: per tool, calls by outcome, runs that called it, runs among those stopped
  by ``repeated_action``.
- :func:`loops_by_tool`: loop stops per tool (the tool the detection named) and reason.
- :func:`stats`: stops by reason per time bucket, loop stops per tool, runs per agent and
  stop reason, canary-flagged runs, optionally for one agent.

Time windows are half-open ``[since, until)`` in ns since the Unix epoch. A run's time is
its stop time, else its end, start or first-seen time (as in ``StoreReader.list_runs``);
a stop's time is the stop's own.

Raises (from every function):
    ReadTimeout: a query ran past the reader's time limit.
    duckdb.Error: the database failed.
    ValueError: an empty window or ``bucket_seconds`` < 1.

Example:
    >>> reader = StoreReader.open_readonly("loopwatch.duckdb")  # doctest: +SKIP
    >>> rows, truncated = tools(reader, since_unix_nano=0, until_unix_nano=2**62)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .store import LOOP_STOP_REASONS, SQL_LOOPS_BY_TOOL, StoreReader, _run_key

__all__ = [
    "RUN_TIME",
    "SQL_TOOLS",
    "Aggregates",
    "attach_steps_since_progress",
    "check_window",
    "loops_by_tool",
    "run_extra",
    "stats",
    "tools",
]

_NS: Final = 1_000_000_000

_REPEATED_ACTION: Final = "repeated_action"

RUN_TIME: Final = "COALESCE(stop_unix_nano, end_unix_nano, start_unix_nano, first_seen_unix_nano)"
"""A run's time in SQL over ``runs`` (``time_unix_nano`` of ``StoreReader.list_runs``)."""

# The key is cast: a Python int past 2**63 binds as HUGEINT, which turns the primary-key
# lookup into a scan (0.2 ms vs 4 ms at 1M runs, measured here).
_SQL_RUN_EXTRA: Final = (
    "SELECT limits, detector_version FROM runs WHERE run_key = ?::UBIGINT AND run_id = ?"
)
# A bound key list unnested into IN is answered with a hash join on the key column
# (2 ms at 1M stops); list_contains() or a bound IN (?, ?...) list scans with a cast (100 ms).
_SQL_STEPS_SINCE_PROGRESS: Final = (
    "SELECT run_id, steps_since_progress FROM stops WHERE run_key IN (SELECT unnest(?::UBIGINT[]))"
)
SQL_TOOLS: Final = (
    f"WITH r AS (SELECT run_key, stop_reason = $3 OR run_key IN "
    "(SELECT run_key FROM stops WHERE observe_reason = $3) AS looped "
    f"FROM runs WHERE {RUN_TIME} >= $1 AND {RUN_TIME} < $2), "
    "c AS (SELECT t.run_key, t.tool, t.outcome, sum(t.calls) AS calls, "
    "any_value(r.looped) AS looped FROM run_tools t JOIN r USING (run_key) "
    "GROUP BY t.run_key, t.tool, t.outcome) "
    "SELECT tool, sum(calls) AS calls, "
    "COALESCE(sum(calls) FILTER (WHERE outcome = 'ok'), 0) AS ok, "
    "COALESCE(sum(calls) FILTER (WHERE outcome = 'error'), 0) AS errors, "
    "COALESCE(sum(calls) FILTER (WHERE outcome = 'blocked'), 0) AS blocked, "
    "count(DISTINCT run_key) FILTER (WHERE calls > 0) AS runs, "
    "count(DISTINCT run_key) FILTER (WHERE calls > 0 AND looped) AS repeated_action_runs "
    "FROM c GROUP BY tool HAVING sum(calls) > 0 ORDER BY calls DESC, tool"
)
"""Parameters: since, until, the ``repeated_action`` reason. A run counts as a
``repeated_action`` run when it was stopped for it or observe mode detected it (a
third-party agent is not stopped: its stop stays ``completed``)."""

_AGENT_OF_STOP: Final = " AND run_key IN (SELECT run_key FROM runs WHERE agent = ?)"
_AGENT_OF_LOOP_STOP: Final = " AND run_key IN (SELECT run_key FROM runs WHERE agent = $4)"
_AGENT_OF_RUN: Final = " AND agent = ?"

_SQL_STOPS: Final = (
    "SELECT (time_unix_nano // ?) * ? AS bucket_unix_nano, reason AS stop_reason, "
    "count(*) AS stops FROM stops WHERE time_unix_nano >= ? AND time_unix_nano < ?{agent} "
    "GROUP BY ALL ORDER BY ALL"
)
_SQL_BY_AGENT: Final = (
    "SELECT COALESCE(agent, '') AS agent, COALESCE(stop_reason, '') AS stop_reason, "
    f"count(*) AS runs FROM runs WHERE {RUN_TIME} >= ? AND {RUN_TIME} < ?{{agent}} "
    "GROUP BY ALL ORDER BY runs DESC, agent, stop_reason"
)
"""Runs per agent and stop reason (``""`` for none); ``{agent}``: the optional filter."""
_SQL_CANARY_RUNS: Final = (
    f"SELECT count(*) AS runs FROM runs WHERE {RUN_TIME} >= ? AND {RUN_TIME} < ?{{agent}} "
    "AND (run_id IN (SELECT run_id FROM canary_flags) "
    "OR trace_id IN (SELECT run_id FROM canary_flags))"
)
"""Runs flagged by a canary hit (by run id or trace id); ``{agent}``: the optional filter."""


@dataclass(frozen=True, slots=True)
class Aggregates:
    """What :func:`stats` returns (the ``/api/v1/stats`` body).

    Attributes:
        stops_by_reason: ``{bucket_unix_nano, stop_reason, stops}`` by bucket, by stop time.
        loops_by_tool: ``{tool, stop_reason, stops}`` for loop stop reasons, most first;
            the tool is the one the detection named (``""``: none, as for
            ``no_progress``), the ``tool`` label of ``loopwatch_loop_detections_total``.
        runs_by_agent: ``{agent, stop_reason, runs}`` by run time (``""``: no agent name,
            or no stop yet), most first.
        canary_runs: runs in the window flagged by a canary hit.
        truncated: a list hit the row cap.
    """

    stops_by_reason: list[dict[str, Any]]
    loops_by_tool: list[dict[str, Any]]
    runs_by_agent: list[dict[str, Any]]
    canary_runs: int
    truncated: bool


def check_window(since_unix_nano: int, until_unix_nano: int) -> None:
    """Raise ``ValueError`` (a 400 on the API) unless ``since < until``."""
    if until_unix_nano <= since_unix_nano:
        raise ValueError("since must be before until")


def _parse_limits(raw: Any) -> Any:
    if not isinstance(raw, str) or not raw:
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw


def run_extra(reader: StoreReader, run_id: str) -> dict[str, Any] | None:
    """``{"limits", "detector_version"}`` of a run, or ``None`` without such a run.

    ``limits`` is the run span's JSON parsed (``{field: {"value", "source"}}``), the raw
    text when it does not parse, or ``None`` when the agent sent none.
    """
    rows, _ = reader._query(_SQL_RUN_EXTRA, [_run_key(run_id), run_id], max_rows=1)
    if not rows:
        return None
    return {
        "limits": _parse_limits(rows[0]["limits"]),
        "detector_version": rows[0]["detector_version"],
    }


def attach_steps_since_progress(
    reader: StoreReader, items: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``items`` (run rows with ``run_id``) with ``steps_since_progress`` of their stop.

    One query for the whole page, keyed by the runs' primary keys.
    """
    if not items:
        return []
    keys = sorted({_run_key(str(i["run_id"])) for i in items})
    rows, _ = reader._query(_SQL_STEPS_SINCE_PROGRESS, [keys], max_rows=len(keys))
    found = {r["run_id"]: r["steps_since_progress"] for r in rows}
    return [{**i, "steps_since_progress": found.get(i["run_id"])} for i in items]


def tools(
    reader: StoreReader, *, since_unix_nano: int, until_unix_nano: int
) -> tuple[list[dict[str, Any]], bool]:
    """Per-tool figures for runs in ``[since, until)``; returns ``(rows, truncated)``.

    Rows ``{tool, calls, ok, errors, blocked, runs, repeated_action_runs}``, most calls
    first; ``runs`` counts runs that called the tool, ``repeated_action_runs`` those of
    them stopped by ``repeated_action``.
    """
    check_window(since_unix_nano, until_unix_nano)
    rows, truncated = reader._query(SQL_TOOLS, [since_unix_nano, until_unix_nano, _REPEATED_ACTION])
    return [{k: (int(v) if k != "tool" else v) for k, v in r.items()} for r in rows], truncated


def loops_by_tool(
    reader: StoreReader,
    *,
    since_unix_nano: int,
    until_unix_nano: int,
    agent: str | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Loop stops in ``[since, until)`` per tool and reason; returns ``(rows, truncated)``.

    Rows ``{tool, stop_reason, stops}``, most first (see :attr:`Aggregates.loops_by_tool`).
    """
    check_window(since_unix_nano, until_unix_nano)
    params: list[Any] = [list(LOOP_STOP_REASONS), since_unix_nano, until_unix_nano]
    if agent is not None:
        params.append(agent)
    rows, truncated = reader._query(
        SQL_LOOPS_BY_TOOL.format(agent="" if agent is None else _AGENT_OF_LOOP_STOP), params
    )
    return [{**r, "stops": int(r["stops"])} for r in rows], truncated


def stats(
    reader: StoreReader,
    *,
    since_unix_nano: int,
    until_unix_nano: int,
    bucket_seconds: int = 3600,
    agent: str | None = None,
) -> Aggregates:
    """Overview aggregates for ``[since, until)``, for every agent or only ``agent``.

    Four queries, each with the reader's time limit and row cap.
    """
    if bucket_seconds < 1:
        raise ValueError("bucket_seconds must be >= 1")
    check_window(since_unix_nano, until_unix_nano)
    window = [since_unix_nano, until_unix_nano]
    by_agent: list[Any] = [] if agent is None else [agent]
    stop_filter = "" if agent is None else _AGENT_OF_STOP
    run_filter = "" if agent is None else _AGENT_OF_RUN
    bucket = bucket_seconds * _NS
    stops, t1 = reader._query(
        _SQL_STOPS.format(agent=stop_filter), [bucket, bucket, *window, *by_agent]
    )
    loops, t2 = loops_by_tool(
        reader, since_unix_nano=since_unix_nano, until_unix_nano=until_unix_nano, agent=agent
    )
    runs, t3 = reader._query(_SQL_BY_AGENT.format(agent=run_filter), [*window, *by_agent])
    canary, _ = reader._query(
        _SQL_CANARY_RUNS.format(agent=run_filter), [*window, *by_agent], max_rows=1
    )
    return Aggregates(
        stops_by_reason=[{**r, "stops": int(r["stops"])} for r in stops],
        loops_by_tool=loops,
        runs_by_agent=[{**r, "runs": int(r["runs"])} for r in runs],
        canary_runs=int(canary[0]["runs"]) if canary else 0,
        truncated=t1 or t2 or t3,
    )
