"""The read API's aggregate queries: per-tool figures, loop detections, overview stats.

Split from :mod:`loopwatch.collector.store.reader` (which holds :class:`StoreReader` and the
list and run queries): the read API (``/api/v1/stats``, ``/api/v1/tools``) and the
dashboard's file and lake sources run these same functions, so every source tells the
same story from one copy of the SQL. Each function takes a :class:`StoreReader` and runs
parameterized SQL through it, with its time limit and row cap; over a lake
(:attr:`StoreReader.lake`) each also takes a ``collector`` filter.

Time windows are half-open ``[since, until)`` in ns since the Unix epoch; a run's time is
:data:`~loopwatch.collector.store.reader.RUN_TIME`, a stop's time is the stop's own.

Raises (from every function):
    ReadTimeout: a query ran past the reader's time limit.
    duckdb.Error: the database failed.
    ValueError: an empty window, ``bucket_seconds`` < 1, or a ``collector`` filter on a
        local file.

Example:
    >>> reader = StoreReader.open_readonly("loopwatch.duckdb")  # doctest: +SKIP
    >>> rows, truncated = tools(reader, since_unix_nano=0, until_unix_nano=2**62)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from loopwatch.instrumentation import StopReason

from .reader import (
    LOOP_STOP_REASONS,
    RUN_TIME,
    SQL_LOOPS_BY_TOOL,
    StoreReader,
    check_window,
)

__all__ = ["SQL_TOOLS", "Aggregates", "loops_by_tool", "stats", "tools"]

_NS: Final = 1_000_000_000
_REPEATED_ACTION: Final = StopReason.REPEATED_ACTION.value

SQL_TOOLS: Final = (
    f"WITH r AS (SELECT run_key, stop_reason = $3 OR run_key IN "
    "(SELECT run_key FROM stops WHERE observe_reason = $3) AS looped "
    f"FROM runs WHERE {RUN_TIME} >= $1 AND {RUN_TIME} < $2{{collector}}), "
    "c AS (SELECT t.run_key, t.tool, t.outcome, sum(t.calls) AS calls, "
    "any_value(r.looped) AS looped FROM run_tools t JOIN r USING (run_key) "
    "GROUP BY t.run_key, t.tool, t.outcome), "
    "t AS (SELECT tool, sum(calls) AS calls, "
    "COALESCE(sum(calls) FILTER (WHERE outcome = 'ok'), 0) AS ok, "
    "COALESCE(sum(calls) FILTER (WHERE outcome = 'error'), 0) AS errors, "
    "COALESCE(sum(calls) FILTER (WHERE outcome = 'blocked'), 0) AS blocked, "
    "count(DISTINCT run_key) FILTER (WHERE calls > 0) AS runs, "
    "count(DISTINCT run_key) FILTER (WHERE calls > 0 AND looped) AS repeated_action_runs, "
    "COALESCE(sum(calls) FILTER (WHERE outcome = 'nudged'), 0) AS nudged "
    "FROM c GROUP BY tool HAVING sum(calls) > 0), "
    "n AS (SELECT u.tool AS tool, count(*) AS nudges, "
    "count(*) FILTER (WHERE u.result = 'recovered') AS nudges_recovered FROM ("
    'SELECT unnest(from_json(s.nudges, \'[{{"tool":"VARCHAR","result":"VARCHAR"}}]\')) '
    "AS u FROM stops s JOIN r USING (run_key) WHERE s.nudges IS NOT NULL) "
    "WHERE u.result IS NOT NULL GROUP BY u.tool) "
    "SELECT t.*, COALESCE(n.nudges, 0) AS nudges, "
    "COALESCE(n.nudges_recovered, 0) AS nudges_recovered "
    "FROM t LEFT JOIN n USING (tool) ORDER BY calls DESC, tool"
)
"""Parameters: since, until, the ``repeated_action`` reason (and ``{collector}``'s,
as ``$4``). A run counts as a
``repeated_action`` run when it was stopped for it or observe mode detected it (a
third-party agent is not stopped: its stop stays ``completed``). ``nudged``: the tool's
calls answered with a nudge; ``nudges`` / ``nudges_recovered``: the nudges the stops of
the window's runs list for the tool (each with a result), and those ``recovered``."""

_AGENT_OF_STOP: Final = " AND run_key IN (SELECT run_key FROM runs WHERE agent = ?)"
_AGENT_OF_LOOP_STOP: Final = " AND run_key IN (SELECT run_key FROM runs WHERE agent = $4)"
_AGENT_OF_RUN: Final = " AND agent = ?"

_SQL_STOPS: Final = (
    "SELECT (time_unix_nano // ?) * ? AS bucket_unix_nano, reason AS stop_reason, "
    "count(*) AS stops FROM stops WHERE time_unix_nano >= ? AND time_unix_nano < ?{agent}"
    "{collector} GROUP BY ALL ORDER BY ALL"
)
_SQL_BY_AGENT: Final = (
    "SELECT COALESCE(agent, '') AS agent, COALESCE(stop_reason, '') AS stop_reason, "
    f"count(*) AS runs FROM runs WHERE {RUN_TIME} >= ? AND {RUN_TIME} < ?{{agent}}{{collector}} "
    "GROUP BY ALL ORDER BY runs DESC, agent, stop_reason"
)
"""Runs per agent and stop reason (``""`` for none); ``{agent}``: the optional filter."""
_SQL_CANARY_RUNS: Final = (
    f"SELECT count(*) AS runs FROM runs WHERE {RUN_TIME} >= ? AND {RUN_TIME} < ?{{agent}}"
    "{collector} AND (run_id IN (SELECT run_id FROM canary_flags) "
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


def tools(
    reader: StoreReader,
    *,
    since_unix_nano: int,
    until_unix_nano: int,
    collector: str | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Per-tool figures for runs in ``[since, until)``; returns ``(rows, truncated)``.

    Rows ``{tool, calls, ok, errors, blocked, runs, repeated_action_runs, nudged, nudges,
    nudges_recovered, nudge_recovery_rate}``, most calls first; ``runs`` counts runs that
    called the tool, ``repeated_action_runs`` those of them stopped by
    ``repeated_action``; ``nudged`` the calls answered with a nudge; ``nudges`` the
    nudges with a result the runs' stops list for the tool, ``nudges_recovered`` those
    ``recovered``, and ``nudge_recovery_rate`` their ratio (``None`` with no nudge).
    ``collector``: only the runs that collector shipped (a lake only).
    """
    check_window(since_unix_nano, until_unix_nano)
    sql = SQL_TOOLS.format(collector=reader.collector_clause(collector).replace("?", "$4"))
    params: list[Any] = [since_unix_nano, until_unix_nano, _REPEATED_ACTION]
    rows, truncated = reader._query(sql, params if collector is None else [*params, collector])
    out = [{k: (int(v) if k != "tool" else v) for k, v in r.items()} for r in rows]
    for row in out:
        row["nudge_recovery_rate"] = (
            row["nudges_recovered"] / row["nudges"] if row["nudges"] else None
        )
    return out, truncated


def loops_by_tool(
    reader: StoreReader,
    *,
    since_unix_nano: int,
    until_unix_nano: int,
    agent: str | None = None,
    collector: str | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Loop stops in ``[since, until)`` per tool and reason; returns ``(rows, truncated)``.

    Rows ``{tool, stop_reason, stops}``, most first (see :attr:`Aggregates.loops_by_tool`).
    ``collector``: only the stops that collector shipped (a lake only).
    """
    check_window(since_unix_nano, until_unix_nano)
    params: list[Any] = [list(LOOP_STOP_REASONS), since_unix_nano, until_unix_nano]
    if agent is not None:
        params.append(agent)
    by_collector = reader.collector_clause(collector)
    if collector is not None:
        params.append(collector)
        by_collector = by_collector.replace("?", f"${len(params)}")
    sql = SQL_LOOPS_BY_TOOL.format(
        agent="" if agent is None else _AGENT_OF_LOOP_STOP, collector=by_collector
    )
    rows, truncated = reader._query(sql, params)
    return [{**r, "stops": int(r["stops"])} for r in rows], truncated


def stats(
    reader: StoreReader,
    *,
    since_unix_nano: int,
    until_unix_nano: int,
    bucket_seconds: int = 3600,
    agent: str | None = None,
    collector: str | None = None,
) -> Aggregates:
    """Overview aggregates for ``[since, until)``, for every agent or only ``agent``:
    stops by reason per time bucket, loop stops per tool, runs per agent and stop reason,
    canary-flagged runs. Four queries, each with the reader's time limit and row cap.
    ``collector``: only what that collector shipped (a lake only).
    """
    if bucket_seconds < 1:
        raise ValueError("bucket_seconds must be >= 1")
    check_window(since_unix_nano, until_unix_nano)
    window = [since_unix_nano, until_unix_nano]
    by_agent: list[Any] = [] if agent is None else [agent]
    by_agent += [] if collector is None else [collector]
    # Every lake table carries collector_id, so stops and runs filter on their own column.
    filters = {
        "agent": "" if agent is None else _AGENT_OF_STOP,
        "collector": reader.collector_clause(collector),
    }
    run_filters = {**filters, "agent": "" if agent is None else _AGENT_OF_RUN}
    bucket = bucket_seconds * _NS
    stops, t1 = reader._query(_SQL_STOPS.format(**filters), [bucket, bucket, *window, *by_agent])
    loops, t2 = loops_by_tool(
        reader,
        since_unix_nano=since_unix_nano,
        until_unix_nano=until_unix_nano,
        agent=agent,
        collector=collector,
    )
    runs, t3 = reader._query(_SQL_BY_AGENT.format(**run_filters), [*window, *by_agent])
    canary, _ = reader._query(
        _SQL_CANARY_RUNS.format(**run_filters), [*window, *by_agent], max_rows=1
    )
    return Aggregates(
        stops_by_reason=[{**r, "stops": int(r["stops"])} for r in stops],
        loops_by_tool=loops,
        runs_by_agent=[{**r, "runs": int(r["runs"])} for r in runs],
        canary_runs=int(canary[0]["runs"]) if canary else 0,
        truncated=t1 or t2 or t3,
    )
