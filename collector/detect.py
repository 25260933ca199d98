"""Server-side loop detection for agents with no loopwatch code (``observe`` mode).

Third-party GenAI and OpenInference tool spans carry arguments and results but no
fingerprints. This stage replays them through the same
:class:`~loopwatch.instrumentation.Guard` the agent side uses, in ``observe`` mode: it
fills each step's action fingerprint, observation digest, progress flag and steps since
progress, and records what the guard would have stopped (``observe_reason``) on the
run's inferred stop. The inferred stop reason itself stays what happened (``completed``
or ``error``): the agent was not stopped, and the record says so.

Rules (each one a fault found by a review of observe mode, 2026-12-01):

- One guard per *run*, not per trace: a trace may hold several agents (nested or side by
  side), and each agent's calls are judged alone. A call filed under its trace before
  its agent span arrived (spans export when they end, children first) moves to the agent
  run with the map stage's :class:`~loopwatch.collector.events.RunReassignment`.
- Calls are replayed in span start-time order, not arrival order: a request retried
  after a later one succeeded must not turn A-B-A-B into A-A-B-B.
- The verdict is taken when the run's stop is inferred, over all of its calls seen by
  then. A run's guard is fed incrementally while calls arrive in order, and rebuilt
  from its calls when one arrives out of order or moves away.
- Evidence step indices and ``observe_step`` are the steps as stored (numbered per
  trace by the map stage), so they point at the rows the run view shows.

State is bounded: at most ``max_open_runs`` runs are tracked (least recently seen runs
are forgotten first), each keeping at most :data:`MAX_CALLS_PER_RUN` calls, and each
run's guard keeps its own fixed detector window. Kept in memory only: a collector
restarted in the middle of a run judges the calls it sees after the restart.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Final

from loopwatch.instrumentation import Decision, FailureClass, Guard, Policy, Stop, ToolFailure

from .events import (
    KIND_TOOL_RESULT,
    SOURCE_LOOPWATCH,
    STOP_ORIGIN_INFERRED,
    MappedBatch,
    StepRow,
    StopRow,
)

__all__ = [
    "LOOP_DETECTORS",
    "MAX_CALLS_PER_RUN",
    "DetectStage",
    "Detection",
    "collector_policy",
    "loop_detector",
    "loop_tool",
]

LOOP_DETECTORS: Final = frozenset(
    {"repeated_action", "action_cycle", "repeated_decision", "no_progress"}
)
_MAX_ARG_CHARS: Final = 1_000_000
MAX_CALLS_PER_RUN: Final = 4096
"""Tool calls kept per run for the replay; later calls of a longer run are stored without
fingerprints and left out of its verdict."""


def loop_detector(stop: StopRow) -> str | None:
    """The loop detector a stop counts for (``loopwatch_loop_detections_total``): its
    reason, else what observe mode saw, else ``None``."""
    if stop.reason in LOOP_DETECTORS:
        return stop.reason
    if stop.observe_reason in LOOP_DETECTORS:
        return stop.observe_reason
    return None


def loop_tool(stop: StopRow) -> str | None:
    """The tool named by the evidence of the stop's loop detection (see
    :func:`loop_detector`): the stop's own evidence, else observe mode's.

    Evidence is client text: anything but a JSON object with a string ``tool`` gives
    ``None`` (never an error). The store keeps this value with the stop
    (``stops.loop_tool``), so counts restored at start use the label counted live
    rather than parsing the evidence again in SQL.
    """
    evidence = stop.evidence if stop.reason in LOOP_DETECTORS else stop.observe_evidence
    if not evidence:
        return None
    try:
        parsed = json.loads(evidence)
    except (ValueError, RecursionError):
        return None
    tool = parsed.get("tool") if isinstance(parsed, dict) else None
    return tool if isinstance(tool, str) else None


def collector_policy() -> Policy:
    """The server-side observe policy: the default detector settings, no usage budgets.

    Usage budgets (turns, calls, tokens, cost, time) are the agent's business (the
    collector cannot know them); loops are detected with the documented defaults of
    :class:`Policy`, and so are retries: the same failing call retried past
    ``max_retries_per_action`` is recorded as ``budget_exhausted`` (``retry_rule``).
    """
    big = 10**12
    return Policy.build(
        name="collector-observe",
        version="1",
        max_model_turns=big,
        max_tool_attempts=big,
        max_tool_successes=big,
        max_tokens=big,
        max_cost_usd=float(big),
        max_elapsed_seconds=float(big),
    )


@dataclass(frozen=True, slots=True)
class Detection:
    """One loop detection: the run, the tool involved (or None) and the detector."""

    run_id: str
    tool: str | None
    detector: str
    step: int


@dataclass(frozen=True, slots=True)
class _Call:
    """A third-party tool call as the replay needs it (what it was, not how it arrived)."""

    order: tuple[int, str]  # (start_unix_nano, span_id): replay order
    step: int | None
    tool: str
    arguments: str | None
    result: str | None
    failed: bool
    error_type: str | None
    call_id: str | None

    @classmethod
    def of(cls, row: StepRow) -> _Call:
        return cls(
            (row.start_unix_nano, row.span_id),
            row.step,
            row.tool or "unknown",
            row.arguments,
            row.result,
            row.outcome == "error",
            row.error_type,
            row.tool_call_id,
        )


@dataclass(frozen=True, slots=True)
class _Annotation:
    action_fingerprint: str
    observation_digest: str | None
    progress: bool
    steps_since_progress: int


class _RunReplay:
    """One run's calls and the guard fed with them in start-time order."""

    __slots__ = (
        "annotations",
        "calls",
        "fed",
        "guard",
        "last_step",
        "policy",
        "run_id",
        "turn_steps",
    )

    def __init__(self, policy: Policy, run_id: str) -> None:
        self.policy = policy
        self.run_id = run_id
        self.calls: dict[str, _Call] = {}
        self.guard: Guard | None = None
        self.fed: tuple[int, str] | None = None  # order of the last call fed
        self.last_step: int | None = None
        self.turn_steps: list[int | None] = []  # stored step of each guard model turn
        self.annotations: dict[str, _Annotation] = {}

    def add(self, call: _Call) -> None:
        if call.order[1] in self.calls or len(self.calls) >= MAX_CALLS_PER_RUN:
            return
        self.calls[call.order[1]] = call
        if self.fed is not None and call.order < self.fed:
            self.guard = None  # out of order: replay from the start

    def remove(self, span_id: str) -> _Call | None:
        call = self.calls.pop(span_id, None)
        if call is not None:
            self.guard = None
            self.annotations.pop(span_id, None)
        return call

    def bring_up_to_date(self) -> Guard:
        """Feed the calls not yet fed (all of them after a reset); return the guard."""
        guard = self.guard
        if guard is None:
            guard = self.guard = Guard(
                self.policy, clock=lambda: 0.0, mode="observe", run_id=self.run_id
            )
            self.fed, self.last_step, self.turn_steps = None, None, []
            self.annotations = {}
        pending = sorted(
            (c for c in self.calls.values() if self.fed is None or c.order > self.fed),
            key=lambda c: c.order,
        )
        for call in pending:
            self._feed(guard, call)
            self.fed = call.order
        return guard

    def _feed(self, guard: Guard, call: _Call) -> None:
        if self.last_step is None or call.step != self.last_step:
            guard.before_model_call()
            guard.record_decision(Decision.tool())
            self.turn_steps.append(call.step)
            self.last_step = call.step
        args = _parse(call.arguments)
        arguments = args if isinstance(args, dict) else ({} if args is None else {"input": args})
        ticket = guard.before_tool_call(call.tool, arguments, call_id=call.call_id)
        if call.failed:
            failure = ToolFailure(call.error_type or "error", FailureClass.TRANSIENT)
            record = guard.record_tool_result(ticket, error=failure)
        else:
            record = guard.record_tool_result(ticket, result=_parse(call.result))
        self.annotations[call.order[1]] = _Annotation(
            ticket.fingerprint,
            record.observation_digest or None,
            record.progress,
            record.steps_since_progress,
        )

    def stored_step(self, guard_step: int) -> int:
        """The stored step of the guard's (1-based) model turn ``guard_step``."""
        if 1 <= guard_step <= len(self.turn_steps):
            stored = self.turn_steps[guard_step - 1]
            if stored is not None:
                return stored
        return guard_step


def _parse(text: str | None) -> Any:
    if text is None:
        return None
    if len(text) > _MAX_ARG_CHARS:
        return text[:_MAX_ARG_CHARS]
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _is_third_party_call(row: StepRow) -> bool:
    return row.kind == KIND_TOOL_RESULT and row.source != SOURCE_LOOPWATCH


class DetectStage:
    """Fill fingerprints and detections for third-party runs (see the module rules).

    Args:
        policy: the observe policy (:func:`collector_policy` when None).
        max_open_runs: runs tracked at once (bounded memory; least recently seen first
            out).

    Thread-safety: ``process`` takes a lock; batches are processed one at a time.
    """

    def __init__(self, policy: Policy | None = None, *, max_open_runs: int = 10_000) -> None:
        self.policy = policy or collector_policy()
        self._max_runs = max_open_runs
        self._runs: OrderedDict[tuple[str, str], _RunReplay] = OrderedDict()
        self._lock = threading.Lock()
        self.detections: list[Detection] = []

    @property
    def open_runs(self) -> int:
        """Runs currently tracked."""
        return len(self._runs)

    def _replay(self, trace_id: str, run_id: str) -> _RunReplay:
        key = (trace_id, run_id)
        replay = self._runs.get(key)
        if replay is None:
            replay = self._runs[key] = _RunReplay(self.policy, run_id)
            while len(self._runs) > self._max_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(key)
        return replay

    def process(self, batch: MappedBatch) -> MappedBatch:
        """Annotate third-party tool steps and inferred stops in place.

        Order within a batch: the map stage's reassignments move earlier calls to their
        agent run; the batch's calls join their runs; each touched run's guard is
        brought up to date and the batch's calls get its annotations; each inferred stop
        takes its run's verdict and ends the run's state.

        Returns:
            The same batch. :attr:`detections` holds the loop detections of the last
            call (each detector once per run), for tests and logs.
        """
        detections: list[Detection] = []
        with self._lock:
            for move in batch.reassignments:
                source = self._runs.get((move.trace_id, move.from_run_id))
                if source is None:
                    continue
                target = None
                if move.to_run_id is not None:
                    target = self._replay(move.trace_id, move.to_run_id)
                for span_id in move.span_ids:
                    call = source.remove(span_id)
                    if call is not None and target is not None:
                        target.add(call)
                if not source.calls:
                    self._runs.pop((move.trace_id, move.from_run_id), None)
            touched: dict[tuple[str, str], _RunReplay] = {}
            calls = [row for row in batch.steps if _is_third_party_call(row)]
            for row in calls:
                replay = self._replay(row.trace_id, row.run_id)
                replay.add(_Call.of(row))
                touched[(row.trace_id, row.run_id)] = replay
            for replay in touched.values():
                replay.bring_up_to_date()
            for row in calls:
                note = touched[(row.trace_id, row.run_id)].annotations.get(row.span_id)
                if note is not None:
                    batch.replace_step(
                        row,
                        replace(
                            row,
                            action_fingerprint=note.action_fingerprint,
                            observation_digest=note.observation_digest,
                            progress=note.progress,
                            steps_since_progress=note.steps_since_progress,
                        ),
                    )
            for stop in list(batch.stops):
                if stop.origin == STOP_ORIGIN_INFERRED:
                    self._judge(batch, stop, detections)
        self.detections = detections
        return batch

    def _judge(self, batch: MappedBatch, stop: StopRow, detections: list[Detection]) -> None:
        replay = self._runs.pop((stop.trace_id, stop.run_id), None)
        if replay is None or not replay.calls:
            return
        outcome = replay.bring_up_to_date().finish(stop.reason)
        seen: set[str] = set()
        for observed in outcome.observed_stops:
            detector = _detector_of(observed)
            if detector is not None and detector not in seen:
                seen.add(detector)
                step = replay.stored_step(observed.step)
                detections.append(Detection(stop.run_id, observed.evidence.tool, detector, step))
        if not outcome.observed_stops:
            return
        first = outcome.observed_stops[0]
        evidence = first.evidence.to_dict()
        if "step_indices" in evidence:
            evidence["step_indices"] = [replay.stored_step(i) for i in evidence["step_indices"]]
        batch.replace_stop(
            stop,
            replace(
                stop,
                observe_reason=first.reason.value,
                observe_step=replay.stored_step(first.step),
                observe_evidence=json.dumps(evidence, separators=(",", ":"), sort_keys=True),
                steps_since_progress=outcome.usage.steps_since_progress,
                usage_tool_attempts=outcome.usage.tool_attempts,
                usage_tool_successes=outcome.usage.tool_successes,
            ),
        )


def _detector_of(stop: Stop) -> str | None:
    reason = stop.reason.value
    return reason if reason in LOOP_DETECTORS else None
