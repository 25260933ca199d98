"""Server-side loop detection for agents with no loopwatch code (``observe`` mode).

Third-party GenAI and OpenInference tool spans carry arguments and results but no
fingerprints. This stage replays them through the same
:class:`~loopwatch.instrumentation.Guard` the agent side uses, in ``observe`` mode: it
fills each step's action fingerprint, observation digest, progress flag and steps since
progress, and records what the guard would have stopped (``observe_reason``) on the
run's inferred stop. The inferred stop reason itself stays what happened (``completed``
or ``error``): the agent was not stopped, and the record says so.

Rules:

- One guard per *run*, not per trace: a trace may hold several agents (nested or side by
  side), and each agent's calls are judged alone. A call that arrived before its agent
  span (spans export when they end, children first) is held by the map stage and
  reaches this stage once, released with its agent run's id.
- Calls are replayed in span start-time order, not arrival order: a request retried
  after a later one succeeded must not turn A-B-A-B into A-A-B-B.
- The verdict is taken when the run's stop is inferred, over all of its calls seen by
  then. Each run has a guard fed as calls arrive (one call's cost); the verdict uses it
  when every call arrived in start order, else one replay of the run's calls in start
  order (once per run, so the cost stays linear in the run's calls when parallel calls
  end out of order).
- Content is opt-in: a call without its arguments (``gen_ai.tool.call.arguments``,
  ``input.value``) is a new action, one without its result a new observation, so
  calls sent without content never make a loop.
- Evidence step indices, ``observe_step`` and ``detail.last_progress_step`` are the steps
  as stored (numbered per trace by the map stage), so they point at the rows the run
  view shows.
- Per-step annotations (fingerprint, digest, progress, steps since progress) are the
  arrival guard's: for a call that arrived out of order, ``progress`` and
  ``steps_since_progress`` are its view then (stored rows are not rewritten); the
  verdict is not affected.

State is bounded: at most ``max_open_runs`` runs, ``max_held_calls`` calls and
``max_held_bytes`` of their argument and result text are held (least recently seen
runs are forgotten first: their verdict is lost), each run keeping its latest
:data:`MAX_CALLS_PER_RUN` calls; a judged run's late calls are not held. Kept in memory
only: a collector restarted in the middle of a run judges the calls it sees after the
restart. A request refused before its commit is taken back (:meth:`DetectStage.undo`):
its retry is annotated and judged as the first attempt was.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

from loopwatch.instrumentation import (
    Decision,
    FailureClass,
    Guard,
    Policy,
    Stop,
    StopReason,
    ToolFailure,
)

from .rows import (
    KIND_TOOL_RESULT,
    SOURCE_LOOPWATCH,
    STOP_ORIGIN_INFERRED,
    MappedBatch,
    StepRow,
    StopRow,
)

__all__ = [
    "DECISION_DETECTORS",
    "LOOP_DETECTORS",
    "MAX_CALLS_PER_RUN",
    "TOOL_DETECTORS",
    "DetectStage",
    "Detection",
    "collector_policy",
    "loop_detector",
    "loop_tool",
]

TOOL_DETECTORS: Final = (StopReason.REPEATED_ACTION.value, StopReason.ACTION_CYCLE.value)
"""Loop detectors over tool calls (their evidence names the tool)."""
DECISION_DETECTORS: Final = (StopReason.REPEATED_DECISION.value, StopReason.NO_PROGRESS.value)
"""Loop detectors over decisions and progress (they name no tool)."""
LOOP_DETECTORS: Final = frozenset((*TOOL_DETECTORS, *DECISION_DETECTORS))
"""The guard's loop detectors: the stop reasons that are loops (DESIGN section 7)."""
_MAX_ARG_CHARS: Final = 1_000_000
MAX_CALLS_PER_RUN: Final = 4096
"""Tool calls kept per run (the latest) for a replay in start order; the guard fed on
arrival has seen them all."""
_JUDGED_MEMORY: Final = 10_000
_UNDO_MEMORY: Final = 64  # judged runs whose calls are kept for undo()
_NOT_CAPTURED: Final = "loopwatch.not_captured"


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
    :func:`loop_detector`): the stop's own evidence, else observe mode's; ``None`` for a
    stop with no loop detection (a retry budget's evidence names a tool as well).

    Evidence is client text: anything but a JSON object with a string ``tool`` gives
    ``None`` (never an error). The store keeps this value with the stop
    (``stops.loop_tool``): the API filters and groups loops by the label counted live
    rather than parsing the evidence again in SQL.
    """
    if loop_detector(stop) is None:
        return None
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


class _Feeder:
    """A guard and the bookkeeping of feeding it calls (one model turn per stored step)."""

    __slots__ = ("guard", "last_step", "turn_steps")

    def __init__(self, policy: Policy, run_id: str) -> None:
        self.guard = Guard(policy, clock=lambda: 0.0, mode="observe", run_id=run_id)
        self.last_step: int | None = None
        self.turn_steps: list[int | None] = []  # stored step of each guard model turn

    def feed(self, call: _Call) -> _Annotation:
        guard = self.guard
        if self.last_step is None or call.step != self.last_step:
            guard.before_model_call()
            guard.record_decision(Decision.tool())
            self.turn_steps.append(call.step)
            self.last_step = call.step
        # Content is opt-in in the GenAI conventions: a call sent without its arguments
        # is a new action and one without its result a new observation, so it never
        # makes a loop (no verdict rather than a false one: three weather lookups for
        # three cities, sent without arguments, were once a repeated_action).
        unknown = {_NOT_CAPTURED: call.order[1]}
        if call.arguments is None:
            arguments: dict[str, Any] = unknown
        else:
            args = _parse(call.arguments)
            arguments = args if isinstance(args, dict) else {"input": args}
        ticket = guard.before_tool_call(call.tool, arguments, call_id=call.call_id)
        if call.failed:
            failure = ToolFailure(call.error_type or "error", FailureClass.TRANSIENT)
            record = guard.record_tool_result(ticket, error=failure)
        else:
            result = unknown if call.result is None else _parse(call.result)
            record = guard.record_tool_result(ticket, result=result)
        return _Annotation(
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


def _text_bytes(call: _Call) -> int:
    return len(call.arguments or "") + len(call.result or "")


class _RunReplay:
    """One run's calls (latest first out when over the cap) and its arrival guard."""

    __slots__ = ("arrival", "calls", "fed", "in_order", "notes", "policy", "run_id")

    def __init__(self, policy: Policy, run_id: str) -> None:
        self.policy = policy
        self.run_id = run_id
        self.calls: OrderedDict[str, _Call] = OrderedDict()  # in arrival order
        self.notes: dict[str, _Annotation] = {}  # by span id, for a resent call
        self.arrival = _Feeder(policy, run_id)
        self.fed: tuple[int, str] | None = None  # latest start order fed
        self.in_order = True  # every call arrived after the ones before it, none left

    def add(self, call: _Call) -> tuple[_Annotation | None, list[_Call]]:
        """Hold and feed ``call``; return its annotation (None for a resent call) and the
        calls dropped to stay within :data:`MAX_CALLS_PER_RUN`."""
        span_id = call.order[1]
        if span_id in self.calls:
            return None, []
        self.calls[span_id] = call
        if self.fed is not None and call.order < self.fed:
            self.in_order = False
        if self.fed is None or call.order > self.fed:
            self.fed = call.order
        dropped: list[_Call] = []
        while len(self.calls) > MAX_CALLS_PER_RUN:
            dropped.append(self.calls.popitem(last=False)[1])
            self.in_order = False  # a replay could not see what the arrival guard saw
        return self.arrival.feed(call), dropped

    def verdict_feeder(self) -> _Feeder:
        """The arrival guard when it saw exactly this run's calls in start order, else a
        guard fed once with them in start order."""
        if self.in_order:
            return self.arrival
        feeder = _Feeder(self.policy, self.run_id)
        for call in sorted(self.calls.values(), key=lambda c: c.order):
            feeder.feed(call)
        return feeder


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
        max_open_runs: runs held at once.
        max_held_calls / max_held_bytes: calls, and bytes of their argument and result
            text, held across all runs. Past any bound the least recently seen runs are
            forgotten (their verdict is lost).

    Thread-safety: ``process`` takes a lock; batches are processed one at a time.
    """

    name = "detect"

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        max_open_runs: int = 10_000,
        max_held_calls: int = 200_000,
        max_held_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.policy = policy or collector_policy()
        self._max_runs = max_open_runs
        self._max_calls = max_held_calls
        self._max_bytes = max_held_bytes
        self._runs: OrderedDict[tuple[str, str], _RunReplay] = OrderedDict()
        self._judged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._undo: OrderedDict[tuple[str, str], _RunReplay] = OrderedDict()
        self._held_calls = 0
        self._held_bytes = 0
        self._lock = threading.Lock()
        self.detections: list[Detection] = []

    @property
    def open_runs(self) -> int:
        """Runs currently held."""
        return len(self._runs)

    @property
    def held(self) -> tuple[int, int]:
        """``(calls, bytes of argument and result text)`` held across all runs."""
        return self._held_calls, self._held_bytes

    def _replay(self, trace_id: str, run_id: str) -> _RunReplay:
        key = (trace_id, run_id)
        replay = self._runs.get(key)
        if replay is None:
            replay = self._runs[key] = _RunReplay(self.policy, run_id)
        else:
            self._runs.move_to_end(key)
        return replay

    def _release(self, calls: Iterable[_Call]) -> None:
        for call in calls:
            self._held_calls -= 1
            self._held_bytes -= _text_bytes(call)

    def _add(self, replay: _RunReplay, call: _Call) -> _Annotation | None:
        span_id = call.order[1]
        if span_id in replay.notes:
            return replay.notes[span_id]  # resent (a retry): the first annotation
        note, dropped = replay.add(call)
        if note is not None:
            replay.notes[span_id] = note
            self._held_calls += 1
            self._held_bytes += _text_bytes(call)
        for old in dropped:
            replay.notes.pop(old.order[1], None)
        self._release(dropped)
        return note

    def undo(self, batch: MappedBatch) -> None:
        """Take back the verdicts ``batch`` took: it was refused before its commit, and
        its retry must be judged again (over the same calls, annotated as before). Only
        the :data:`_UNDO_MEMORY` latest judged runs can be taken back."""
        with self._lock:
            for stop in batch.stops:
                key = (stop.trace_id, stop.run_id)
                replay = self._undo.pop(key, None)
                if replay is not None and stop.origin == STOP_ORIGIN_INFERRED:
                    self._judged.pop(key, None)
                    self._runs[key] = replay
                    self._held_calls += len(replay.calls)
                    self._held_bytes += sum(map(_text_bytes, replay.calls.values()))

    def _evict(self, keep: set[tuple[str, str]]) -> None:
        """Forget the least recently seen runs (but those of the batch at hand) while any
        bound is exceeded."""

        def over() -> bool:
            return (
                len(self._runs) > self._max_runs
                or self._held_calls > self._max_calls
                or self._held_bytes > self._max_bytes
            )

        if not over():
            return
        for key in list(self._runs):  # least recently seen first
            if key not in keep:
                self._release(self._runs.pop(key).calls.values())
                if not over():
                    return

    def process(self, batch: MappedBatch) -> MappedBatch:
        """Annotate third-party tool steps and inferred stops in place.

        Order within a batch: the batch's calls join their runs and get their arrival
        guard's annotations; each inferred stop takes its run's verdict and ends the
        run's state.

        Returns:
            The same batch. :attr:`detections` holds the loop detections of the last
            call (each detector once per run), for tests and logs.
        """
        detections: list[Detection] = []
        with self._lock:
            touched: set[tuple[str, str]] = set()
            for row in [row for row in batch.steps if _is_third_party_call(row)]:
                key = (row.trace_id, row.run_id)
                if key in self._judged:
                    continue  # a late call of a judged run: it cannot change the verdict
                touched.add(key)
                note = self._add(self._replay(*key), _Call.of(row))
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
            self._evict(touched)
        self.detections = detections
        return batch

    def _judge(self, batch: MappedBatch, stop: StopRow, detections: list[Detection]) -> None:
        key = (stop.trace_id, stop.run_id)
        replay = self._runs.pop(key, None)
        if replay is None:
            return
        self._judged[key] = None
        while len(self._judged) > _JUDGED_MEMORY:
            self._judged.popitem(last=False)
        self._undo[key] = replay
        while len(self._undo) > _UNDO_MEMORY:
            self._undo.popitem(last=False)
        self._release(replay.calls.values())
        if not replay.calls:
            return
        feeder = replay.verdict_feeder()
        outcome = feeder.guard.finish(stop.reason)
        seen: set[str] = set()
        for observed in outcome.observed_stops:
            detector = _detector_of(observed)
            if detector is not None and detector not in seen:
                seen.add(detector)
                step = feeder.stored_step(observed.step)
                detections.append(Detection(stop.run_id, observed.evidence.tool, detector, step))
        if not outcome.observed_stops:
            return
        first = outcome.observed_stops[0]
        evidence = first.evidence.to_dict()
        if "step_indices" in evidence:
            evidence["step_indices"] = [feeder.stored_step(i) for i in evidence["step_indices"]]
        detail = evidence.get("detail")
        if isinstance(detail, dict) and isinstance(detail.get("last_progress_step"), int):
            detail["last_progress_step"] = feeder.stored_step(detail["last_progress_step"])
        batch.replace_stop(
            stop,
            replace(
                stop,
                observe_reason=first.reason.value,
                observe_step=feeder.stored_step(first.step),
                observe_evidence=json.dumps(evidence, separators=(",", ":"), sort_keys=True),
                steps_since_progress=outcome.usage.steps_since_progress,
                usage_tool_attempts=outcome.usage.tool_attempts,
                usage_tool_successes=outcome.usage.tool_successes,
            ),
        )


def _detector_of(stop: Stop) -> str | None:
    reason = stop.reason.value
    return reason if reason in LOOP_DETECTORS else None
