"""Server-side loop detection for agents with no loopwatch code (``observe`` mode).

Third-party GenAI and OpenInference tool spans carry arguments and results but no
fingerprints. This stage replays them, per run and in step order, through the same
:class:`~loopwatch.instrumentation.Guard` the agent side uses, in ``observe`` mode: it
fills each step's action fingerprint, observation digest, progress flag and steps since
progress, and records what the guard would have stopped (``observe_reason``) on the
run's inferred stop. The inferred stop reason itself stays what happened (``completed``
or ``error``): the agent was not stopped, and the record says so.

State is bounded: at most ``max_open_runs`` runs are tracked (least recently seen runs
are forgotten first), and each run's guard keeps its own fixed detector window.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Final

from loopwatch.instrumentation import Decision, FailureClass, Guard, Policy, Stop, ToolFailure

from .events import STOP_ORIGIN_INFERRED, MappedBatch, StepRow, StopRow

__all__ = [
    "LOOP_DETECTORS",
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
    """The server-side observe policy: the default detector settings, no budgets.

    Budgets are the agent's business (the collector cannot know them); loops are
    detected with the documented defaults of :class:`Policy`.
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


@dataclass
class _RunState:
    guard: Guard
    last_step: int | None = None
    seen: dict[str, StepRow] = field(default_factory=dict)
    detected: set[str] = field(default_factory=set)


def _detector_of(stop: Stop) -> str | None:
    reason = stop.reason.value
    return reason if reason in LOOP_DETECTORS else None


def _parse(text: str | None) -> Any:
    if text is None:
        return None
    if len(text) > _MAX_ARG_CHARS:
        return text[:_MAX_ARG_CHARS]
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


class DetectStage:
    """Fill fingerprints and detections for third-party runs.

    Args:
        policy: the observe policy (:func:`collector_policy` when None).
        max_open_runs: runs tracked at once (bounded memory).

    Thread-safety: ``process`` takes a lock; batches are processed one at a time.
    """

    def __init__(self, policy: Policy | None = None, *, max_open_runs: int = 10_000) -> None:
        self.policy = policy or collector_policy()
        self._max_runs = max_open_runs
        self._runs: OrderedDict[str, _RunState] = OrderedDict()
        self._lock = threading.Lock()
        self.detections: list[Detection] = []

    @property
    def open_runs(self) -> int:
        """Runs currently tracked."""
        return len(self._runs)

    def _state(self, trace_id: str) -> _RunState:
        state = self._runs.get(trace_id)
        if state is None:
            guard = Guard(self.policy, clock=lambda: 0.0, mode="observe", run_id=trace_id)
            state = _RunState(guard)
            self._runs[trace_id] = state
            while len(self._runs) > self._max_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(trace_id)
        return state

    def process(self, batch: MappedBatch) -> MappedBatch:
        """Annotate third-party tool steps and inferred stops in place.

        Returns:
            The same batch. :attr:`detections` holds the loop detections of the last
            call (each detector once per run), for tests and logs.
        """
        detections: list[Detection] = []
        with self._lock:
            for steps in batch.third_party_tool_steps().values():
                for row in steps:
                    # Keyed by trace: steps filed under the trace id before the agent span
                    # arrived belong to the same run as the later ones.
                    state = self._state(row.trace_id)
                    batch.replace_step(row, self._step(state, row, detections))
            for stop in list(batch.stops):
                if stop.origin != STOP_ORIGIN_INFERRED:
                    continue
                ended = self._runs.pop(stop.trace_id, None)
                if ended is None:
                    continue
                outcome = ended.guard.finish(stop.reason)
                for observed in outcome.observed_stops:
                    self._note(ended, stop.run_id, observed, detections)
                if not outcome.observed_stops:
                    continue
                first = outcome.observed_stops[0]
                batch.replace_stop(
                    stop,
                    replace(
                        stop,
                        observe_reason=first.reason.value,
                        observe_step=first.step,
                        observe_evidence=json.dumps(
                            first.evidence.to_dict(), separators=(",", ":"), sort_keys=True
                        ),
                        steps_since_progress=outcome.usage.steps_since_progress,
                        usage_tool_attempts=outcome.usage.tool_attempts,
                        usage_tool_successes=outcome.usage.tool_successes,
                    ),
                )
        self.detections = detections
        return batch

    def _note(self, state: _RunState, run_id: str, stop: Stop, out: list[Detection]) -> None:
        detector = _detector_of(stop)
        if detector is None or detector in state.detected:
            return
        state.detected.add(detector)
        out.append(Detection(run_id, stop.evidence.tool, detector, stop.step))

    def _step(self, state: _RunState, row: StepRow, detections: list[Detection]) -> StepRow:
        previous = state.seen.get(row.span_id)
        if previous is not None:
            return previous
        guard = state.guard
        if row.step != state.last_step or state.last_step is None:
            verdict = guard.before_model_call()
            if verdict.would_stop is not None:
                self._note(state, row.run_id, verdict.would_stop, detections)
            guard.record_decision(Decision.tool())
            state.last_step = row.step
        tool = row.tool or "unknown"
        args = _parse(row.arguments)
        arguments = args if isinstance(args, dict) else ({} if args is None else {"input": args})
        ticket = guard.before_tool_call(tool, arguments, call_id=row.tool_call_id)
        if ticket.would_stop is not None:
            self._note(state, row.run_id, ticket.would_stop, detections)
        if row.outcome == "error":
            failure = ToolFailure(row.error_type or "error", FailureClass.TRANSIENT)
            record = guard.record_tool_result(ticket, error=failure)
        else:
            record = guard.record_tool_result(ticket, result=_parse(row.result))
        annotated = replace(
            row,
            action_fingerprint=ticket.fingerprint,
            observation_digest=record.observation_digest or None,
            progress=record.progress,
            steps_since_progress=record.steps_since_progress,
        )
        if len(state.seen) < 4096:
            state.seen[row.span_id] = annotated
        return annotated
