"""Run assembly rules, pure (no DuckDB): merge a group's rows into their runs' rows.

The store's writer loads the rows of the runs a group commit touches into a
:class:`Group` (``merged``: run id -> run row as a dict of :data:`~loopwatch.collector.
store.schema.RUN_COLUMNS`), and :func:`merge_stops` and :func:`merge_rows` apply these
rules to them (each has a test in ``tests/unit/collector/test_runs.py`` and
``tests/unit/test_store.py``):

- Runs are merged: any span of a run may arrive first. The run span's fields win, times
  widen, counts (steps = highest step index, decisions, tool calls, errors, blocked,
  tokens) add up over new spans only.
- Stops: one primary stop per run. Precedence ``stop_span`` > ``run_span`` >
  ``inferred`` (:data:`~loopwatch.collector.rows.STOP_ORIGINS`). A stronger stop
  replaces a weaker one and a weaker one is ignored, in either arrival order (a loopwatch
  run span repeats its stop span's reason; an inferred stop is a fallback), so the result
  does not depend on export order. A second stop of the same strength is a
  duplicate-stop anomaly: kept in ``stop_anomalies`` (``kind='duplicate_stop'``), counted
  in ``runs.duplicate_stops``, and never overwrites the first: the first report is what
  any alert already fired on, and "exactly one stop per run" stays checkable.
- Metrics count a run's stop once: the first request that brings the run a stop counts
  its strongest one, whatever its origin (a loopwatch run span whose stop span was lost
  still counts; a run span and its stop span in one request count the stop span). A
  stronger stop in a later request replaces the primary but not the count: it is stored
  beside the replaced one (``Group.primary`` and ``Group.replaced`` both go to
  ``stop_reports``, at most one row per run and origin, each with its ``counted`` flag;
  the new one has ``counted = false``), and the store's views apply this precedence when
  read: ``stops`` shows the strongest, ``stop_anomalies`` the others as
  ``kind='replaced_stop'``. Requests committed in one
  group are applied in order, each as a unit, so grouping never changes what is counted
  or kept. ``CommitResult.counted_stops`` says what to count.

State across requests, and its durable buffers (the store never moves a committed row
to fix an assembly decision; it appends rows, and deletes a buffered row only in the
transaction that stores its final row):

- Third-party steps whose agent run is not known yet are held by the map stage
  (:class:`~loopwatch.collector.map.MapStage`, which owns the traces' ancestry; bounded
  by ``max_open_traces`` x ``max_spans_per_trace``, released to the trace-level run
  after ``max_idle_seconds`` idle, on eviction, or when the root span ends) and are
  durable in ``pending_steps`` from the commit of the request that brought them; the
  map stage reads them back at start (:meth:`~loopwatch.collector.map.MapStage.
  restore`). They are counted once, in their final run, when released.
- Steps of a run whose sampling decision is not made yet are durable in
  ``staged_steps``; the decision (this module's first stop, or the undecided timeout)
  hands them to ``steps`` or drops them. Counts are final when first written: a step
  is counted in its run once, whatever sampling keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from loopwatch.instrumentation import _semconv as sc

from .rows import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    STOP_COMPLETED,
    STOP_ORIGINS,
    UNKNOWN_AGENT,
    RunRow,
    StepRow,
    StopRow,
)
from .store.schema import RUN_ATTR_FIELDS, RUN_COLUMNS, run_key_of

__all__ = ["Group", "merge_rows", "merge_stops", "new_run", "widen"]

_INT64_MAX: Final = 2**63 - 1


def new_run(run_id: str, trace_id: str, source: str, now_ns: int) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(RUN_COLUMNS)
    row.update(
        run_key=run_key_of(run_id),
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


def widen(row: dict[str, Any], start: int | None, end: int | None, prefix: str = "") -> None:
    """Widen ``row``'s ``{prefix}start_unix_nano`` / ``{prefix}end_unix_nano`` to cover
    ``start`` / ``end`` (``None``: unknown, changes nothing)."""
    first, last = f"{prefix}start_unix_nano", f"{prefix}end_unix_nano"
    if start is not None and (row[first] is None or start < row[first]):
        row[first] = start
    if end is not None and (row[last] is None or end > row[last]):
        row[last] = end


@dataclass(slots=True)
class Group:
    """The rows of one group commit that survived deduplication, and their run state."""

    now_ns: int
    runs: list[RunRow]
    steps: list[StepRow]
    stops: list[StopRow]
    canaries: set[str]
    merged: dict[str, dict[str, Any]] = field(default_factory=dict)
    existing: set[str] = field(default_factory=set)
    # The least last_seen_unix_nano among the stored rows of ``existing`` as read: the
    # bound that lets their DELETE skip older row groups (runs has no key index).
    stored_since: int | None = None
    tool_deltas: dict[tuple[int, str, str, str | None], int] = field(default_factory=dict)
    step_jobs: list[int] = field(default_factory=list)  # job index of each of ``steps``
    settle: set[str] = field(default_factory=set)
    staged_in_db: set[str] = field(default_factory=set)
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
            row = self.merged[run_id] = new_run(run_id, trace_id, source, self.now_ns)
        row["last_seen_unix_nano"] = self.now_ns
        return row

    def tool(
        self, run_key: int, tool: str, outcome: str, calls: int, agent: str | None = None
    ) -> None:
        key = (run_key, tool, outcome, agent)
        self.tool_deltas[key] = self.tool_deltas.get(key, 0) + calls


def merge_rows(group: Group) -> None:
    """Merge the group's run rows, steps and stops into their runs' rows (``group.merged``):
    the run span's fields win, times widen, counts add up over new spans only."""
    for run in group.runs:
        row = group.run(run.run_id, run.trace_id, run.source)
        if run.is_run_span:
            row["run_span_id"] = run.span_id
            row["source"] = run.source
            row["status_code"] = run.status_code
            for name in RUN_ATTR_FIELDS:
                value = getattr(run, name)
                if value is not None:
                    row[name] = value
        for prefix in ("", "span_"):
            widen(row, run.start_unix_nano, run.end_unix_nano, prefix)
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


def merge_stops(group: Group) -> tuple[list[StopRow], list[tuple[str, str | None, int]]]:
    """Apply the group's stops request by request (module docstring, "Stops"
    and "Metrics count"); return the duplicate-stop anomalies and the runs their
    first stop decides, ``(run_id, stop reason for sampling, job index)`` in request order.
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
            s.observe_reason if s.observe_reason and s.reason == STOP_COMPLETED else s.reason,
            stop_job[run_id],
        )
        for run_id, s in group.counted.items()
        if group.merged[run_id]["sampled"] is None
    ]
    group.primary = list(winners.values())
    return anomalies, deciding
