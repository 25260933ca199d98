"""What the dashboard's pages read: the data source protocol, its results and errors.

No Streamlit here (STYLE rule 15): pages call a :class:`DataSource` and render what it
returns; caching happens at the page edge (:mod:`loopwatch.dashboard.ui`). The closed sets
come from :class:`~loopwatch.instrumentation.StopReason`; the frames' columns are defined
here once. :func:`loopwatch.dashboard.config.open_source` opens one of the two
implementations: :mod:`~loopwatch.dashboard.api_source` (the collector's read API, the
normal mode: the collector owns the DuckDB file) or :mod:`~loopwatch.dashboard.file_source`
(a DuckDB file opened read-only when no collector runs).

Exceptions::

    SourceError                 base of everything raised here
     ├── SourceUnavailable      collector unreachable, refused the token or is not a
     │                          loopwatch collector; database file missing, locked by a
     │                          writer, or not a loopwatch database
     └── QueryFailed            the source answered with an error (bad parameter, query
                                time limit)

Every message is a sentence meant for the page, naming what to do next.

Times are integers in nanoseconds since the Unix epoch (``*_unix_nano``); DataFrames carry
them as timezone-aware UTC ``datetime64`` columns named ``time`` or ``bucket``.

Example:
    >>> source = open_source(collector_url="http://127.0.0.1:9464")  # doctest: +SKIP
    >>> page = source.runs(RunFilter(stop_reason="repeated_action"), limit=50)
    >>> detail = source.run(page.runs["run_id"][0])
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Final, NotRequired, Protocol, TypedDict, Unpack, runtime_checkable

import pandas as pd
from loopwatch.instrumentation import LoopDetector, StopReason

__all__ = [
    "DEFAULT_COLLECTOR_URL",
    "DEFAULT_OTLP_URL",
    "LOOPED_RUNS_LIMIT",
    "LOOP_DETECTORS",
    "RUN_COLUMNS",
    "RUN_TABLE_COLUMNS",
    "STOP_REASONS",
    "TOOLS_COLUMNS",
    "TOOL_OUTCOME_COLUMNS",
    "DataSource",
    "Overview",
    "OverviewQuery",
    "QueryFailed",
    "RunData",
    "RunFilter",
    "RunsPage",
    "SourceError",
    "SourceUnavailable",
    "ToolsData",
    "looped_runs",
    "steps_of_runs",
]

DEFAULT_COLLECTOR_URL: Final = "http://127.0.0.1:9464"
"""The collector's read API default (``loopwatch collector --http``)."""

DEFAULT_OTLP_URL: Final = "http://127.0.0.1:4318/v1/traces"
"""Where agents send spans by default (for empty-state hints)."""

STOP_REASONS: Final[tuple[str, ...]] = tuple(r.value for r in StopReason)
"""The closed set of stop reasons (DESIGN section 2)."""

LOOP_DETECTORS: Final[tuple[str, ...]] = tuple(d.value for d in LoopDetector)
"""Loop stop reasons, one per detector (the ``detector`` label of the loop metric)."""

RUN_TABLE_COLUMNS: Final[tuple[str, ...]] = (
    "run_id",
    "time",
    "agent",
    "stop_reason",
    "top_tool",
    "steps",
    "steps_since_progress",
    "tool_calls",
    "tool_errors",
    "tool_blocked",
    "canary_detected",
    "sampled",
)
"""The runs tables' columns, in display order."""

RUN_COLUMNS: Final = (
    *RUN_TABLE_COLUMNS,
    "tokens",
    "sample_rule",
    "policy_name",
    "source",
    "observe_reason",
    "loop_tool",
)
"""Columns of :attr:`RunsPage.runs`: :data:`RUN_TABLE_COLUMNS`, then the hidden ones."""

TOOL_OUTCOME_COLUMNS: Final = ("ok", "errors", "blocked", "nudged")
"""Calls per tool by outcome, in display order."""

TOOLS_COLUMNS: Final = (
    "tool",
    "calls",
    *TOOL_OUTCOME_COLUMNS,
    "runs",
    "repeated_action_runs",
    "nudges",
    "nudges_recovered",
)
"""Columns of a tools row as the sources give it (:attr:`ToolsData.tools` adds the rate)."""


class SourceError(Exception):
    """Base of the dashboard's data errors; ``message`` is safe to show on a page."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SourceUnavailable(SourceError):
    """The source cannot be read at all (see the module docstring for the cases).

    Attributes:
        kind: ``unreachable``, ``timeout``, ``unauthorized``, ``not_loopwatch``,
            ``missing``, ``locked`` or ``unreadable``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class QueryFailed(SourceError):
    """The source answered one request with an error.

    Attributes:
        code: the API error code (``bad_parameter``, ``query_timeout``...) or
            ``query_timeout`` / ``database_error`` for a file.
        status: the HTTP status (0 for a file).
    """

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Filters of the runs list (``None``: not filtered).

    Attributes:
        stop_reason / agent: exact match. tool: the run called this tool.
        since_unix_nano / until_unix_nano: half-open range ``[since, until)`` of the run's
            time (its stop, else end, start or first-seen time).
        canary: only runs flagged (``True``) or not flagged (``False``) by a canary hit.
        sampled: only runs whose steps were kept (``True``) or dropped (``False``).
        detector: a loop detector (:data:`LOOP_DETECTORS`) that stopped the run, or that
            observe mode recorded on it (a third-party run's stop stays ``completed``).
        loop_tool: the tool that run's loop detection named (the tool its detection is
            counted under on ``loopwatch_loop_detections_total``).
        collector: shipped by this collector (``collector_id``; a lake source only: the
            others refuse it with :class:`QueryFailed`).
    """

    stop_reason: str | None = None
    agent: str | None = None
    tool: str | None = None
    since_unix_nano: int | None = None
    until_unix_nano: int | None = None
    canary: bool | None = None
    sampled: bool | None = None
    detector: str | None = None
    loop_tool: str | None = None
    collector: str | None = None

    def given(self) -> dict[str, Any]:
        """The filters that are set (neither ``None`` nor ``""``), by field name."""
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of runs, newest first.

    Attributes:
        runs: one row per run, columns :data:`RUN_COLUMNS` (``time`` is UTC).
        offset: rows skipped before this page.
        next_offset: offset of the next page, ``None`` on the last page.
    """

    runs: pd.DataFrame
    offset: int
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class RunData:
    """One run with everything stored about it (for the run view).

    Attributes:
        run: the run row (``runs`` list fields).
        step_rows: one row (a dict of the stored step fields, ``None`` for NULL) per
            stored decision or tool result, in step order (empty when the run was not
            sampled); :attr:`steps` is the same as a DataFrame.
        steps_truncated: only the last steps were returned (the row cap).
        stop: the primary stop row, or ``None`` (run still open or stop lost).
        evidence: the stop's parsed evidence (``{}`` when none).
        anomalies: other stop reports of the run (``kind``: ``duplicate_stop``, or
            ``replaced_stop`` for one a stronger report replaced), in arrival order.
        tools: tool calls per ``tool``, ``outcome`` (``calls`` column).
        limits: ``limit``, ``value``, ``source`` rows (each effective limit and where it
            came from), or ``None`` when the source does not provide them.
        anomalies_truncated / tools_truncated: the row cap cut :attr:`anomalies` /
            :attr:`tools`.
        nudges: the run's nudges in order (``detector``, ``tool``, ``rung``, ``step``,
            ``result``); ``nudges_dropped``: nudges the run had but does not list.
    """

    run: dict[str, Any]
    step_rows: tuple[dict[str, Any], ...]
    steps_truncated: bool
    stop: dict[str, Any] | None
    evidence: dict[str, Any]
    anomalies: list[dict[str, Any]]
    tools: pd.DataFrame
    limits: pd.DataFrame | None
    anomalies_truncated: bool = False
    tools_truncated: bool = False
    nudges: tuple[dict[str, Any], ...] = ()
    nudges_dropped: int = 0

    @property
    def steps(self) -> pd.DataFrame:
        """:attr:`step_rows` as a DataFrame (built on each access: the run view reads the
        rows; a 10,000-row frame took 100 ms to build and 60 ms to read back)."""
        return pd.DataFrame(list(self.step_rows))

    @property
    def has_steps(self) -> bool:
        """Some step of the run was stored."""
        return bool(self.step_rows)

    def step_records(self) -> list[dict[str, Any]]:
        """:attr:`step_rows` as a list (missing values ``None``)."""
        return list(self.step_rows)


@dataclass(frozen=True, slots=True)
class Overview:
    """Aggregates for the overview page over one time range (and agent, if filtered).

    Attributes:
        stops: ``bucket`` (UTC), ``stop_reason``, ``stops``.
        runs_by_agent: ``agent``, ``stop_reason``, ``runs`` (``stop_reason`` empty for
            runs without a stop yet).
        loops_by_tool: ``tool``, ``detector``, ``stops``: loop detections (a loop stop, or
            observe mode's detection on a run it let go on) by the tool their
            detection named (``""``: none, as for ``no_progress``), the ``tool`` label of
            ``loopwatch_loop_detections_total``.
        canary_runs: runs flagged by a canary hit.
        note: set when the figures are partial (which part, and why).
    """

    stops: pd.DataFrame
    runs_by_agent: pd.DataFrame
    loops_by_tool: pd.DataFrame
    canary_runs: int
    note: str | None = None

    @property
    def total_stops(self) -> int:
        """Stops in the range."""
        return int(self.stops["stops"].sum()) if not self.stops.empty else 0

    @property
    def abnormal_stops(self) -> int:
        """Stops with a reason other than ``completed``."""
        if self.stops.empty:
            return 0
        abnormal = self.stops["stop_reason"] != StopReason.COMPLETED.value
        return int(self.stops.loc[abnormal, "stops"].sum())

    @property
    def agents(self) -> list[str]:
        """Named agents in :attr:`runs_by_agent`, sorted."""
        return sorted({str(a) for a in self.runs_by_agent["agent"] if a})

    @property
    def abnormal_ratio(self) -> float | None:
        """``abnormal_stops / total_stops``, ``None`` without stops."""
        total = self.total_stops
        return self.abnormal_stops / total if total else None


@dataclass(frozen=True, slots=True)
class ToolsData:
    """Per-tool figures over one time range.

    Attributes:
        tools: ``tool``, ``calls``, ``ok``, ``errors``, ``blocked``, ``runs`` (runs that
            called it), ``repeated_action_runs`` and ``repeated_action_rate``
            (``repeated_action_runs / runs``), ``nudged`` (calls answered with a nudge),
            ``nudges`` / ``nudges_recovered`` (nudges with a result, and those
            ``recovered``) and ``nudge_recovery_rate`` (their ratio; NaN with no nudge);
            ``None`` when the source cannot give them.
        loops: ``tool``, ``detector``, ``stops`` (as :attr:`Overview.loops_by_tool`).
        note: set when a part is missing (which, and what provides it).
    """

    tools: pd.DataFrame | None
    loops: pd.DataFrame
    note: str | None = None


class OverviewQuery(TypedDict):
    """Keyword arguments of :meth:`DataSource.overview`.

    Attributes:
        since_unix_nano / until_unix_nano: the range ``[since, until)``.
        bucket_seconds: width of the stops' time buckets (> 0).
        agent: only this agent's runs; absent or ``None``: every agent.
    """

    since_unix_nano: int
    until_unix_nano: int
    bucket_seconds: int
    agent: NotRequired[str | None]


@runtime_checkable
class DataSource(Protocol):
    """What the pages read. Implementations are thread-safe (one per app process).

    Every method raises :class:`SourceUnavailable` or :class:`QueryFailed`.
    """

    @property
    def description(self) -> str:
        """Where the data comes from, for the page footer (no secrets)."""
        ...

    def check(self) -> None:
        """Raise :class:`SourceUnavailable` when the source cannot be read."""
        ...

    def runs(self, filters: RunFilter, *, limit: int = 50, offset: int = 0) -> RunsPage:
        """One page of runs matching ``filters``, newest first."""
        ...

    def run(self, run_id: str) -> RunData | None:
        """One run, or ``None`` when there is no run with that id."""
        ...

    def overview(self, **query: Unpack[OverviewQuery]) -> Overview:
        """Aggregates for ``[since, until)``, stops bucketed by ``bucket_seconds``."""
        ...

    def tools(self, *, since_unix_nano: int, until_unix_nano: int) -> ToolsData:
        """Per-tool figures for ``[since, until)``."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


LOOPED_RUNS_LIMIT: Final = 50
"""Most runs :func:`looped_runs` returns (the Tools page's table of looped runs)."""


def looped_runs(
    source: DataSource,
    tool: str,
    *,
    since_unix_nano: int,
    until_unix_nano: int,
    limit: int = LOOPED_RUNS_LIMIT,
) -> pd.DataFrame:
    """Runs whose loop detection named ``tool``, newest first: a loop detector stopped
    them, or observe mode flagged them (a third-party run is judged in observe mode: its
    stop stays ``completed``), and the detection's evidence names this tool, as
    ``loopwatch_loop_detections_total`` counts it (the runs list's ``loop_tool``
    filter). A run that called ``tool`` but looped on another is not listed.
    """
    page = source.runs(
        RunFilter(loop_tool=tool, since_unix_nano=since_unix_nano, until_unix_nano=until_unix_nano),
        limit=limit,
    )
    return page.runs


STEPS_FALLBACK_THREADS: Final = 8
"""Parallel reads of :func:`steps_of_runs` on a source without a one-read method."""


def steps_of_runs(source: DataSource, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The stored steps of ``run_ids`` as ``{run_id: rows in step order}`` (a run without
    stored steps is absent), for replaying many runs at once.

    A source with a ``steps_of_runs`` method answers in one read
    (:meth:`~loopwatch.dashboard.file_source.DuckDBSource.steps_of_runs`); any other
    (the read API has no many-runs endpoint) is read one run at a time,
    :data:`STEPS_FALLBACK_THREADS` at once.

    Raises:
        SourceUnavailable / QueryFailed: as the source's reads.
    """
    one_read = getattr(source, "steps_of_runs", None)
    if callable(one_read):
        found: dict[str, list[dict[str, Any]]] = one_read(list(run_ids))
        return found

    def read(run_id: str) -> tuple[str, list[dict[str, Any]]]:
        detail = source.run(run_id)
        if detail is None or not detail.has_steps:
            return run_id, []
        return run_id, detail.step_records()

    ids = list(dict.fromkeys(run_ids))
    with ThreadPoolExecutor(max_workers=STEPS_FALLBACK_THREADS) as pool:
        pairs = list(pool.map(read, ids))
    return {run_id: rows for run_id, rows in pairs if rows}
