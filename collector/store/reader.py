"""The store's reader: parameterized read queries with a time limit and a row cap.

:class:`StoreReader` runs each query on a fresh cursor (committed data only), interrupts
it after its time limit (:class:`~loopwatch.collector.errors.ReadTimeout`) and caps its
rows, so reads never block or starve the writer. The read API (:mod:`loopwatch.collector.
api`) serves its queries, and the dashboard's file and lake sources run the same ones, so
every source tells the same story from one copy of the SQL. The module-level functions
(:func:`run_extra`, :func:`attach_steps_since_progress`, :func:`attach_stop_summary`) take
a :class:`StoreReader` and run parameterized SQL through its ``_query``, with the reader's
time limit and row cap; the aggregates are in :mod:`loopwatch.collector.store.aggregates`.

One reader reads a collector's local file or, with ``lake=True`` (:meth:`StoreReader.
open_lake`), the lake of fleet mode (docs/lake.md): the same SQL over the lake's tables of
the same names, minus what only a local file holds (see :class:`StoreReader`).

Time windows are half-open ``[since, until)`` in ns since the Unix epoch. A run's time is
its stop time, else its end, start or first-seen time (as in ``StoreReader.list_runs``);
a stop's time is the stop's own.

Raises (from every function):
    ReadTimeout: a query ran past the reader's time limit.
    duckdb.Error: the database failed.
    ValueError: bad paging, or a ``collector`` filter on a local file.

Example:
    >>> reader = StoreReader.open_readonly("loopwatch.duckdb")  # doctest: +SKIP
    >>> page = reader.list_runs(stop_reason="repeated_action", limit=20)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb

from ..detect import LOOP_DETECTORS
from ..errors import ReadTimeout
from .schema import (
    RUN_LIST_COLUMNS,
    RUN_ORDERS,
    SQL_DETECTORS,
    STEP_FIELDS,
    STOP_FIELDS,
    STOP_NUDGE_FIELDS,
    run_key_of,
)

__all__ = [
    "LOOP_STOP_REASONS",
    "RUN_TIME",
    "SQL_LOOPS_BY_TOOL",
    "STOP_SUMMARY_FIELDS",
    "RunDetail",
    "RunsPage",
    "Stats",
    "StoreReader",
    "attach_steps_since_progress",
    "attach_stop_summary",
    "check_window",
    "run_extra",
]

_NS: Final = 1_000_000_000

SHIPPING_MARGIN_NS: Final = 3_600 * _NS
"""How much earlier than a run's time or first-seen time its lake rows may have been
shipped (``shipped_unix_nano``, the shipping collector's clock): one hour of clock
skew between an agent and its collector. Lake reads add ``shipped_unix_nano >= bound -
margin``, which DuckLake answers from its per-file statistics, skipping the Parquet files
of older shipments (issue 27's benchmark: 1.4 s to under 0.3 s at 1,000,000 runs)."""

LOOP_STOP_REASONS: Final = tuple(sorted(LOOP_DETECTORS))
"""Stop reasons counted as loops in :meth:`StoreReader.stats` (DESIGN section 7 detectors)."""


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
        stop_anomalies: duplicate stops and replaced stops (``kind``), in arrival order.
        tools: tool calls per (tool, outcome).
        stop_anomalies_truncated / tools_truncated: the row cap kept only the first
            anomalies (in arrival order) / tool rows (by tool, outcome).
        nudges: the run's nudges from its stop, in order: ``{detector, tool, rung, step,
            result}`` (issue 26); ``nudges_dropped``: nudges the run had but does not list.
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
    nudges: list[dict[str, Any]] = field(default_factory=list)
    nudges_dropped: int = 0


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


_RUNS_VIEW: Final = (
    "SELECT "
    + ", ".join(f"r.{c}" for c in RUN_LIST_COLUMNS)
    + "{collector}, (r.run_id IN (SELECT run_id FROM canary_flags) OR r.trace_id IN "
    "(SELECT run_id FROM canary_flags)) AS canary_detected, "
    "COALESCE(r.stop_unix_nano, r.end_unix_nano, r.start_unix_nano, r.first_seen_unix_nano) "
    "AS time_unix_nano, r.run_key FROM runs r"
)
"""A run row as listed; ``{collector}``: ``, r.collector_id`` over the lake, else empty."""


SQL_LOOPS_BY_TOOL: Final = (
    "SELECT COALESCE(loop_tool, '') AS tool, "
    "CASE WHEN reason IN (SELECT unnest($1)) THEN reason ELSE observe_reason END "
    "AS stop_reason, count(*) AS stops "
    "FROM stops WHERE (reason IN (SELECT unnest($1)) OR observe_reason IN (SELECT unnest($1))) "
    "AND time_unix_nano >= $2 AND time_unix_nano < $3{agent}{collector} "
    "GROUP BY ALL ORDER BY stops DESC, tool, stop_reason"
)
"""Loop detections per tool and detector in a time range, as
``loopwatch_loop_detections_total`` counts them (:func:`~loopwatch.collector.detect.
loop_detector`): a stop whose reason is a loop detector, else the detector observe mode
recorded on it (a third-party agent is not stopped: its stop stays ``completed``).
Parameters: the loop reasons, since, until (then the ``{agent}`` filter's, as ``$4``, and
``{collector}``'s, as ``$5``).
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
        lake: the cursors read a lake (``USE lake``: :mod:`loopwatch.collector.lake.schema`),
            not a local file. The lake's rows carry ``collector_id`` (listed, and the
            ``collector`` filter of the queries); it has no ``staged_steps`` (only
            decided runs are shipped) and no ``stop_anomalies`` (``stops`` holds each
            run's primary stop only), so a run read there lists neither.

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
        lake: bool = False,
    ) -> None:
        if not timeout_seconds > 0 or max_rows < 1:
            raise ValueError("timeout_seconds must be > 0 and max_rows >= 1")
        self._factory = cursor_factory
        self.lake = lake
        lake_columns = ", r.collector_id, r.shipped_unix_nano"
        self._runs_view = _RUNS_VIEW.format(collector=lake_columns if lake else "")
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

    @classmethod
    def open_lake(
        cls,
        connection: duckdb.DuckDBPyConnection,
        *,
        timeout_seconds: float = 5.0,
        max_rows: int = 10_000,
    ) -> StoreReader:
        """A reader of the lake attached to ``connection`` as ``lake``
        (:func:`~loopwatch.collector.lake.connect.connect_lake`); it closes the connection
        in :meth:`close`. Each query's cursor reads the lake's tables by their plain names.
        """

        def cursor() -> duckdb.DuckDBPyConnection:
            # USE is per cursor (each is its own client context); the SQL stays the same.
            cur = connection.cursor()
            cur.execute("USE lake")
            return cur

        return cls(
            cursor, timeout_seconds=timeout_seconds, max_rows=max_rows, owned=connection, lake=True
        )

    def collector_clause(self, collector: str | None, *, prefix: str = " AND ") -> str:
        """``prefix + "collector_id = ?"`` when ``collector`` is given, else ``""``.

        Raises:
            ValueError: a collector is given but this reader reads a local file, whose
                rows are all its own collector's (no ``collector_id``).
        """
        if collector is None:
            return ""
        if not self.lake:
            raise ValueError("the collector filter needs a lake (a local store has one collector)")
        return prefix + "collector_id = ?"

    def shipped_since(self, bound_unix_nano: int | None) -> tuple[str, list[Any]]:
        """``(" AND shipped_unix_nano >= ?", [bound - margin])`` over a lake, else
        ``("", [])``: prunes the lake's files shipped before a run (or a window) began
        (:data:`SHIPPING_MARGIN_NS`). ``bound_unix_nano``: the earliest first-seen time of
        the runs read, or the window's start; ``None``: no bound."""
        if not self.lake or bound_unix_nano is None:
            return "", []
        return " AND shipped_unix_nano >= ?", [int(bound_unix_nano) - SHIPPING_MARGIN_NS]

    def collectors(self) -> list[str]:
        """The collector ids of the lake's runs, sorted (``[]`` for a local file)."""
        if not self.lake:
            return []
        rows, _ = self._query(
            "SELECT DISTINCT collector_id FROM runs WHERE collector_id IS NOT NULL ORDER BY 1", []
        )
        return [str(r["collector_id"]) for r in rows]

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
        collector: str | None = None,
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
        run listed on an earlier page is removed (retention), which skips a run; ``after`` (the
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
            collector: shipped by this collector (a lake only, see :attr:`lake`).
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
                f"(reason IN ({SQL_DETECTORS}) OR observe_reason IN ({SQL_DETECTORS})))",
                loop_tool,
            ),
            ("time_unix_nano >= ?", since_unix_nano),
            ("time_unix_nano < ?", until_unix_nano),
            ("canary_detected = ?", canary),
            ("sampled = ?", sampled),
            ("first_seen_unix_nano < ?", seen_before),
            (self.collector_clause(collector, prefix=""), collector),
            # Over a lake, runs of the window were shipped after it began (less the margin).
            (
                "shipped_unix_nano >= ?",
                None
                if not self.lake or since_unix_nano is None
                else since_unix_nano - SHIPPING_MARGIN_NS,
            ),
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
        sql = f"SELECT *{bound} FROM ({self._runs_view}) v"
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
        shipped, bound = self.shipped_since(_earliest_first_seen(runs))
        rows, _ = self._query(
            "SELECT run_key, tool FROM (SELECT run_key, tool, sum(calls) AS calls "
            f"FROM run_tools WHERE run_key IN (SELECT unnest(?::UBIGINT[])){shipped} "
            "GROUP BY ALL HAVING sum(calls) > 0) "
            "QUALIFY row_number() OVER (PARTITION BY run_key ORDER BY calls DESC, tool) = 1",
            [[r["run_key"] for r in runs], *bound],
            max_rows=len(runs),
        )
        best = {row["run_key"]: row["tool"] for row in rows}
        for run in runs:
            run["top_tool"] = best.get(run.pop("run_key"))

    def get_run(self, run_id: str) -> RunDetail | None:
        """Return one run with its steps, stop, evidence and anomalies, or ``None``.

        After the run row, its other reads (top tool, steps, stop, anomalies, tools) run
        at once, each on its own cursor: over a lake each waits on the catalog and on
        its data files (issue 27: the run view of a 10,000-step run within 1 s).

        Raises:
            ReadTimeout: a read ran past :attr:`timeout_seconds`.
            duckdb.Error: a read failed.
        """
        key = run_key_of(run_id)
        runs, _ = self._query(f"SELECT * FROM ({self._runs_view}) v WHERE run_key = ?", [key])
        if not runs or runs[0]["run_id"] != run_id:
            return None
        shipped, bound = self.shipped_since(runs[0].get("first_seen_unix_nano"))
        columns = ", ".join(STEP_FIELDS)
        # The lake has no staged steps: a run is shipped once sampling decided it.
        staged = (
            ""
            if self.lake
            else (f" UNION ALL SELECT {columns}, true FROM staged_steps WHERE run_key = $1")
        )
        stop_columns = ", ".join(STOP_FIELDS)
        with ThreadPoolExecutor(max_workers=5, thread_name_prefix="loopwatch-read") as pool:
            top_tool = pool.submit(self._attach_top_tools, runs)
            steps_read = pool.submit(
                self._query,
                f"SELECT * FROM (SELECT {columns}, false AS staged FROM steps WHERE run_key = $1"
                f"{shipped.replace('?', '$3')}{staged}) "
                "ORDER BY step DESC NULLS FIRST, start_unix_nano DESC, kind DESC, span_id DESC "
                "LIMIT $2",
                [key, self.max_rows + 1, *bound],
            )
            stops_read = pool.submit(
                self._query,
                f"SELECT {stop_columns}, {', '.join(STOP_NUDGE_FIELDS)} FROM stops "
                f"WHERE run_key = ?{shipped}",
                [key, *bound],
            )
            # The lake ships each run's primary stop only: no anomalies there.
            anomalies_read = (
                None
                if self.lake
                else pool.submit(
                    self._query,
                    f"SELECT {stop_columns}, kind FROM stop_anomalies WHERE run_key = ? "
                    "ORDER BY received_unix_nano, span_id",
                    [key],
                )
            )
            tools_read = pool.submit(
                self._query,
                "SELECT tool, outcome, sum(calls) AS calls FROM run_tools "
                f"WHERE run_key = ?{shipped} GROUP BY ALL HAVING sum(calls) > 0 ORDER BY ALL",
                [key, *bound],
            )
            top_tool.result()
            steps, truncated = steps_read.result()
            stops, _ = stops_read.result()
            anomalies: list[dict[str, Any]] = []
            anomalies_truncated = False
            if anomalies_read is not None:
                anomalies, anomalies_truncated = anomalies_read.result()
            tools, tools_truncated = tools_read.result()
        steps.reverse()
        stop = stops[0] if stops else None
        nudges: list[dict[str, Any]] = []
        nudges_dropped = 0
        if stop is not None:
            nudges = _parse_nudges(stop.pop("nudges"))
            nudges_dropped = int(stop.pop("nudges_dropped") or 0)
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
            nudges,
            nudges_dropped,
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
            SQL_LOOPS_BY_TOOL.format(agent="", collector=""),
            [list(LOOP_STOP_REASONS), since_unix_nano, until_unix_nano],
        )
        return Stats(by_reason, loops, t1 or t2)


RUN_TIME: Final = "COALESCE(stop_unix_nano, end_unix_nano, start_unix_nano, first_seen_unix_nano)"
"""A run's time in SQL over ``runs`` (``time_unix_nano`` of ``StoreReader.list_runs``)."""

# The key is cast: a Python int past 2**63 binds as HUGEINT, which turns the comparison
# into a cast of every key instead of a filter pushed into the scan.
_SQL_RUN_EXTRA: Final = (
    "SELECT limits, detector_version FROM runs WHERE run_key = ?::UBIGINT AND run_id = ?"
)
# A bound key list unnested into IN is answered with a hash join on the key column
# (2 ms at 1M stops); list_contains() or a bound IN (?, ?...) list scans with a cast (100 ms).
_SQL_STEPS_SINCE_PROGRESS: Final = (
    "SELECT run_id, steps_since_progress FROM stops WHERE run_key IN (SELECT unnest(?::UBIGINT[]))"
)
_SQL_STOP_SUMMARY: Final = (
    "SELECT run_id, steps_since_progress, observe_reason, loop_tool FROM stops "
    "WHERE run_key IN (SELECT unnest(?::UBIGINT[]))"
)
STOP_SUMMARY_FIELDS: Final = ("steps_since_progress", "observe_reason", "loop_tool")
"""What :func:`attach_stop_summary` adds to each run row."""


def _parse_nudges(raw: Any) -> list[dict[str, Any]]:
    """The stored ``nudges`` JSON (validated by the map stage) as a list; ``[]`` for none."""
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # a file written by other code
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _earliest_first_seen(items: Sequence[Mapping[str, Any]]) -> int | None:
    """The earliest ``first_seen_unix_nano`` of run rows; None when one lacks it (no bound)."""
    seen = [i.get("first_seen_unix_nano") for i in items]
    known = [int(s) for s in seen if s is not None]
    return min(known) if known and len(known) == len(seen) else None


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


def run_extra(
    reader: StoreReader, run_id: str, *, first_seen_unix_nano: int | None = None
) -> dict[str, Any] | None:
    """``{"limits", "detector_version"}`` of a run, or ``None`` without such a run.

    ``limits`` is the run span's JSON parsed (``{field: {"value", "source"}}``), the raw
    text when it does not parse, or ``None`` when the agent sent none.
    ``first_seen_unix_nano``: the run's, when known (lets a lake read skip older files).
    """
    shipped, bound = reader.shipped_since(first_seen_unix_nano)
    rows, _ = reader._query(
        _SQL_RUN_EXTRA + shipped, [run_key_of(run_id), run_id, *bound], max_rows=1
    )
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

    One query for the whole page, keyed by the runs' keys.
    """
    if not items:
        return []
    keys = sorted({run_key_of(str(i["run_id"])) for i in items})
    shipped, bound = reader.shipped_since(_earliest_first_seen(items))
    rows, _ = reader._query(_SQL_STEPS_SINCE_PROGRESS + shipped, [keys, *bound], max_rows=len(keys))
    found = {r["run_id"]: r["steps_since_progress"] for r in rows}
    return [{**i, "steps_since_progress": found.get(i["run_id"])} for i in items]


def attach_stop_summary(
    reader: StoreReader, items: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``items`` (run rows with ``run_id``) with :data:`STOP_SUMMARY_FIELDS` of their stop
    (each ``None`` for a run without a stop):

    - ``steps_since_progress``: as :func:`attach_steps_since_progress`;
    - ``observe_reason``: the loop detector (or retry budget) the collector's observe
      mode, or a loopwatch agent in observe mode, recorded on the run
      (``stops.observe_reason``): why a run whose stop reads ``completed`` is still
      worth a look; ``None`` when nothing was detected;
    - ``loop_tool``: the tool its loop detection named (``stops.loop_tool``, the label
      ``loopwatch_loop_detections_total`` counted it under), whether the detection
      stopped the run or observe mode recorded it; ``None`` for no detection or one that
      names no tool (``no_progress``, ``repeated_decision``).

    One query for the whole page, keyed by the runs' keys.
    """
    if not items:
        return []
    keys = sorted({run_key_of(str(i["run_id"])) for i in items})
    shipped, bound = reader.shipped_since(_earliest_first_seen(items))
    rows, _ = reader._query(_SQL_STOP_SUMMARY + shipped, [keys, *bound], max_rows=len(keys))
    found = {r["run_id"]: r for r in rows}
    empty: dict[str, Any] = {}
    return [
        {**i, **{f: found.get(i["run_id"], empty).get(f) for f in STOP_SUMMARY_FIELDS}}
        for i in items
    ]
