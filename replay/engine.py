"""Replay recorded agent runs through policies with the real guard, offline: the drive.

Each :class:`~loopwatch.replay.trajectory.Trajectory` is fed, step by step, to a fresh
:class:`~loopwatch.instrumentation.Guard` per policy: no model call, no tool call,
no span (the guard is pure logic; it is used directly, without ``Run`` or a tracer). The
first stop the guard makes before the recorded run ended is the policy's verdict on that
run (:class:`~loopwatch.replay.results.ReplayResult`). This module is also the replay
API: it re-exports the policy choice (:mod:`~loopwatch.replay.policy_choice`), the loop
labelling (:mod:`~loopwatch.replay.loops`) and the results
(:mod:`~loopwatch.replay.results`: :func:`summarize`, :func:`compare`).

How a recording drives the guard (one guard step per recorded *agent* step, so step
numbers in results and evidence are 1-based agent-step numbers):

* agent step: ``before_model_call`` (with the step's recorded tokens and cost), then
  ``record_decision``; for each tool call, ``before_tool_call`` then
  ``record_tool_result`` with the recorded observation (JSON text is decoded first, so
  per-tool ``volatile`` and ``progress`` fields apply) or, for a call the source marks
  failed, an error whose failure class :func:`classify_recorded_error` derives from the
  text. A ``final`` or ``refusal`` step that is not the last agent step (a chat reply
  after which the agent acts again) is fed as a ``message`` decision: only the run's
  last agent step can end it.
* user and environment turns are not agent decisions: they are never fed as decisions
  or tool calls (a tau2 user's device tools do not spend the agent's budget nor enter
  its fingerprints). A turn whose content (text, and its tool calls with their
  observations) was not seen before in the run is new information from the environment,
  so it is recorded as progress evidence (``Guard.progress``) for the agent's current
  step. Without it, every chat turn that asks the user for something would count as a
  step without progress and ``no_progress`` would fire on ordinary conversations; an
  identical user message repeated is not progress. The repeat detector counts identical
  actions since the last progress, so re-reading after the user changed something is
  not a repeat (up to three times its limit in a row); the cycle detector is unaffected.
* clock: a fake monotonic clock set from the recorded timestamps (the step's
  ``timestamp``, a call's ``started_at`` / ``ended_at``), relative to the first
  timestamp of the run and never going back; a value that is not finite Unix seconds
  before the year 10000 (``Infinity``, milliseconds, corrupt) is ignored.
  ``max_elapsed_seconds`` therefore means recorded wall-clock time, user think time
  included. A run without timestamps stays at 0 s and never stops as
  ``deadline_exceeded``.
* end: the recording stops after its last agent step; the guard is not asked to end that
  step, because no further model call exists to refuse. A run whose last decision is
  ``final`` ends ``completed`` (or ``refused``): the agent's own end, reported as
  ``stop_reason = None``.
* loop onset: :func:`~loopwatch.replay.loops.loop_onset` of the stop; without a stop, the
  onset of the recorded loop, or ``None`` when the recording has none.
* ladder: under a policy with a loop-response ladder (more than ``["stop"]``) the guard
  runs in ``observe`` mode, so a warned or nudged call is fed its recorded result, as it
  ran in the recording; the first stop it sees is the verdict, and the rungs reached are
  the result's ``responses`` (why and what it means: :mod:`~loopwatch.replay.results`).
  A ``["stop"]`` policy is driven in ``enforce`` mode, exactly as before ladders existed.

Example:
    >>> from loopwatch.replay.importers import load_paths
    >>> loaded = load_paths(["../shared/corpus/tau2-bench"])  # doctest: +SKIP
    >>> results = replay(loaded.trajectories, [default_policy()])  # doctest: +SKIP
    >>> summarize(results)[0].stops_by_reason  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from loopwatch.instrumentation import Decision, Guard, Policy, Stop, StopReason, ToolTicket, Verdict
from loopwatch.instrumentation._policy_checks import LADDER_DETECTORS
from loopwatch.instrumentation.ladder import Ladder

from .importers._numbers import too_large
from .loops import (
    MIN_LOOP_REPEATS,
    Act,
    RecordedLoop,
    actions_of,
    find_loop,
    find_recorded_loop,
    loop_onset,
)
from .policy_choice import (
    DEFAULT_POLICY_FILE,
    SHIPPED_POLICY_FILES,
    NamedPolicy,
    default_policy,
    load_policy_spec,
    unique_labels,
)
from .recorded import RecordedToolError, classify_recorded_error, recorded_decision, recorded_end
from .results import (
    CSV_COLUMNS,
    Comparison,
    LadderResponse,
    PolicySummary,
    ReplayResult,
    compare,
    summarize,
)
from .trajectory import AGENT, SUCCESS, Step, Trajectory

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_POLICY_FILE",
    "MIN_LOOP_REPEATS",
    "SHIPPED_POLICY_FILES",
    "Comparison",
    "LadderResponse",
    "NamedPolicy",
    "PolicySummary",
    "RecordedLoop",
    "RecordedToolError",
    "ReplayResult",
    "classify_recorded_error",
    "compare",
    "default_policy",
    "find_recorded_loop",
    "load_policy_spec",
    "replay",
    "replay_run",
    "summarize",
    "unique_labels",
]

_AGENT_END: Final = frozenset(
    {StopReason.COMPLETED, StopReason.FINAL_UNVERIFIED, StopReason.REFUSED}
)


_MAX_UNIX_SECONDS: Final = 253402300800.0
"""Year 10000 in Unix seconds: a larger recorded time is in another unit or corrupt."""


def _usable_time(timestamp: float | None) -> bool:
    """A recorded time the replay clock may use: finite Unix seconds in [0, year 10000).

    One wild value (``Infinity``, a millisecond timestamp among seconds, a corrupt
    ``1e15``) would otherwise jump the clock and stop the run ``deadline_exceeded``;
    such values are ignored, as a missing timestamp is.
    """
    if type(timestamp) is float:  # the common case, checked per event per policy
        return math.isfinite(timestamp) and 0 <= timestamp < _MAX_UNIX_SECONDS
    return (
        timestamp is not None
        and not too_large(timestamp)
        and math.isfinite(timestamp)
        and 0 <= timestamp < _MAX_UNIX_SECONDS
    )


class _RecordedClock:
    """A monotonic clock driven by recorded timestamps (seconds since the run's first
    usable one; see :func:`_usable_time`)."""

    __slots__ = ("_now", "_origin")

    def __init__(self, origin: float | None) -> None:
        self._origin = origin
        self._now = 0.0

    def __call__(self) -> float:
        return self._now

    def at(self, timestamp: float | None) -> None:
        if timestamp is None or self._origin is None or not _usable_time(timestamp):
            return
        t = timestamp - self._origin
        self._now = max(self._now, t)


def _first_timestamp(trajectory: Trajectory) -> float | None:
    for step in trajectory.steps:
        if _usable_time(step.timestamp):
            return step.timestamp
        for tc in step.tool_calls:
            if _usable_time(tc.started_at):
                return tc.started_at
    return None


def _turn_key(step: Step) -> tuple[Any, ...]:
    """What a user or environment turn said and did, verbatim (novelty check)."""
    calls = tuple(
        (tc.name, tc.arguments_json(), tc.observation, tc.error) for tc in step.tool_calls
    )
    return ((step.text or "").strip(), calls)


def _usage(value: float | None) -> float:
    """A recorded token count or cost the guard may add up: a missing, negative or
    non-finite value counts 0 (one NaN would make the run's total NaN, and no budget
    comparison with NaN ever stops; Infinity would stop at once). So does an integer too
    large for a float: the importers report one as a problem, and a trajectory built in
    code must not end the whole replay with ``OverflowError``."""
    if value is None or too_large(value) or not math.isfinite(value) or value < 0:
        return 0
    return value


def _decision(step: Step, last: bool) -> Decision:
    usage = {
        "input_tokens": int(_usage(step.input_tokens)),
        "output_tokens": int(_usage(step.output_tokens)),
        "cost_usd": float(_usage(step.cost_usd)),
    }
    # The guard reads a tool decision's calls at ``before_tool_call``; their arguments
    # are not needed here.
    return recorded_decision(step, last=last, usage=usage, arguments=lambda _recorded: {})


@dataclass(slots=True)
class _Prepared:
    """A recording turned, once, into what every policy's guard is fed.

    ``events`` holds, in order, ``None`` for a user or environment turn that brings
    nothing new, ``True`` for one that is new (progress evidence), and
    ``(timestamp, decision, actions)`` for each agent step.
    """

    origin: float | None
    events: list[bool | tuple[float | None, Decision, list[Act]] | None]
    acts: list[Act]
    total: int
    calls_total: int
    loop: RecordedLoop | None


def _prepare(trajectory: Trajectory) -> _Prepared:
    agent_steps = trajectory.agent_steps
    acts = actions_of(agent_steps)
    by_step: dict[int, list[Act]] = {}
    for act in acts:
        if act.call >= 0:
            by_step.setdefault(act.step, []).append(act)
    events: list[bool | tuple[float | None, Decision, list[Act]] | None] = []
    seen: set[tuple[Any, ...]] = set()
    number = 0
    total = len(agent_steps)
    for step in trajectory.steps:
        if step.actor != AGENT:
            key = _turn_key(step)
            events.append(None if key in seen else True)
            seen.add(key)
            continue
        number += 1
        decision = _decision(step, number == total)
        events.append((step.timestamp, decision, by_step.get(number, [])))
    return _Prepared(
        origin=_first_timestamp(trajectory),
        events=events,
        acts=acts,
        total=total,
        calls_total=sum(1 for a in acts if a.call >= 0),
        loop=find_loop(acts),
    )


@dataclass(slots=True)
class _Hit:
    stop: Stop
    saved_from_call: int  # first saved call index (global among agent calls)
    model_saved: int


def _has_ladder(policy: Policy) -> bool:
    """True when some loop detector answers with more than ``["stop"]``."""
    return Ladder.of(policy, "enforce") is not None


def _stop_of(verdict: Verdict) -> Stop | None:
    """The stop a verdict makes: refused (enforce), or the first one observe mode saw."""
    return _stop(verdict.stop) if not verdict.allowed else verdict.would_stop


class _Rungs:
    """The ladder rungs one policy reaches on one recording (:class:`LadderResponse`)."""

    __slots__ = ("_counts", "_policy", "seen")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._counts: dict[str, int] = {}
        self.seen: list[LadderResponse] = []

    def ticket(self, ticket: ToolTicket) -> None:
        """Note the warn or nudge rung ``ticket`` met, if any."""
        response = ticket.response or ticket.observed_response
        if response is None or ticket.detector is None:
            return
        self._counts[ticket.detector] = self._counts.get(ticket.detector, 0) + 1
        self.seen.append(
            LadderResponse(ticket.step, ticket.tool, ticket.detector, ticket.rung, response)
        )

    def stop(self, ticket: ToolTicket, stop: Stop) -> Stop:
        """Note a stop rung (a loop detection at ``ticket``); returns ``stop`` with
        ``detail.after_nudges`` as the live guard's stop would carry it."""
        key = stop.reason.value
        if key not in LADDER_DETECTORS:
            return stop
        ladder = self._policy.loop_response_by_detector.get(key, self._policy.loop_response)
        rung = min(self._counts.get(key, 0) + 1, len(ladder))
        self.seen.append(LadderResponse(ticket.step, ticket.tool, key, rung, "stop"))
        nudges = sum(1 for r in self.seen if r.response == "nudge")
        if not nudges:
            return stop
        detail = {**stop.evidence.detail, "after_nudges": nudges}
        return dataclasses.replace(stop, evidence=dataclasses.replace(stop.evidence, detail=detail))


def _drive(prep: _Prepared, policy: Policy, run_id: str, rungs: _Rungs | None) -> _Hit | None:
    """Feed a prepared recording to a fresh guard; the first stop that is not the agent's
    own end, or None.

    With a ladder (``rungs`` given) the guard runs in ``observe`` mode, so a nudged call
    is fed its recorded result, as it ran in the recording (see
    :mod:`~loopwatch.replay.results`); the first stop observe mode sees is the stop.
    Before that first stop an observe guard decides exactly as an enforce guard does
    (replay feeds one call at a time: no call is ever in flight).
    """
    clock = _RecordedClock(prep.origin)
    mode: Literal["enforce", "observe"] = "enforce" if rungs is None else "observe"
    guard = Guard(policy, clock=clock, run_id=run_id, mode=mode)
    total = prep.total
    number = 0
    call = 0
    for event in prep.events:
        if not isinstance(event, tuple):
            if event:
                guard.progress()
            continue
        timestamp, decision, calls = event
        number += 1
        clock.at(timestamp)
        stop = _stop_of(guard.before_model_call())
        if stop is not None:
            return _Hit(stop, call, total - number + 1)
        stop = _stop_of(guard.record_decision(decision))
        if stop is not None:
            if stop.reason in _AGENT_END:
                return None
            return _Hit(stop, call, total - number)
        for act in calls:
            clock.at(act.started_at)
            observed = len(guard._observed)
            ticket = guard.before_tool_call(act.tool, act.arguments, call_id=act.call_id)
            stop = ticket.stop or ticket.would_stop
            if stop is None and len(guard._observed) > observed:
                # An unknown tool called again: observe mode records the retry-rule
                # stop without putting it on the ticket.
                stop = guard._observed[-1]
            if stop is not None:
                if rungs is not None:
                    stop = rungs.stop(ticket, stop)
                return _Hit(stop, call, total - number)
            if rungs is not None:
                rungs.ticket(ticket)
            if ticket.allowed:
                clock.at(act.ended_at)
                if act.error:
                    record = guard.record_tool_result(
                        ticket,
                        error=RecordedToolError((act.observation_text or "")[:200]),
                        failure_class=act.failure_class,
                    )
                else:
                    record = guard.record_tool_result(ticket, result=act.observation)
                stop = _stop_of(record.verdict)
                if stop is not None:
                    return _Hit(stop, call + 1, total - number)
            call += 1
    return None


def _stop(stop: Stop | None) -> Stop:
    if stop is None:  # pragma: no cover - a refused verdict always carries its stop
        raise RuntimeError("the guard refused without a stop")
    return stop


def replay_run(trajectory: Trajectory, policy: NamedPolicy | Policy) -> ReplayResult:
    """Replay one recorded run through one policy.

    Args:
        trajectory: the recorded run.
        policy: the policy (a bare :class:`Policy` is labelled with its name).

    Returns:
        The :class:`ReplayResult`. Never raises for odd recordings: arguments that are
        not a JSON object are fingerprinted as ``{"_raw": value}``.
    """
    return _replay_one(trajectory, NamedPolicy.of(policy), _prepare(trajectory))


def _replay_one(trajectory: Trajectory, named: NamedPolicy, prep: _Prepared) -> ReplayResult:
    rungs = _Rungs(named.policy) if _has_ladder(named.policy) else None
    hit = _drive(prep, named.policy, trajectory.run_id, rungs)
    acts, loop, total, calls_total = prep.acts, prep.loop, prep.total, prep.calls_total
    if hit is None:
        stop_reason = stop_dimension = None
        stop_step = None
        onset = loop.onset_step if loop is not None else None
        evidence = None
        saved = model_saved = 0
    else:
        stop = hit.stop
        stop_reason = stop.reason.value
        stop_dimension = stop.dimension.value if stop.dimension is not None else None
        stop_step = stop.step
        onset = loop_onset(stop, acts, named.policy, hit.saved_from_call, loop)
        evidence = {**stop.evidence.to_dict(), **stop.measures()}
        saved = max(calls_total - hit.saved_from_call, 0)
        model_saved = hit.model_saved
    return ReplayResult(
        source=trajectory.source,
        run_id=trajectory.run_id,
        format=trajectory.format,
        recorded_outcome=trajectory.recorded_outcome,
        recorded_stop=trajectory.recorded_stop,
        policy=named.label,
        policy_version=named.policy.version,
        stop_reason=stop_reason,
        stop_dimension=stop_dimension,
        stop_step=stop_step,
        steps_total=total,
        loop_onset_step=onset,
        evidence=evidence,
        calls_total=calls_total,
        calls_saved=saved,
        model_calls_saved=model_saved,
        false_stop=stop_reason is not None and trajectory.recorded_outcome == SUCCESS,
        loop=loop,
        responses=tuple(rungs.seen) if rungs is not None else None,
        end_reason=stop_reason if stop_reason is not None else recorded_end(trajectory),
        end_step=stop_step if stop_step is not None else total,
    )


def replay(
    trajectories: Iterable[Trajectory],
    policies: Sequence[NamedPolicy | Policy],
    *,
    on_run: Callable[[Trajectory], None] | None = None,
) -> list[ReplayResult]:
    """Replay every run through every policy.

    Args:
        trajectories: the recorded runs.
        policies: one or more policies; labels are made unique.
        on_run: called after each run is done (progress bars).

    Returns:
        Results run-major: for each run, one result per policy in the given order.

    Raises:
        ValueError: no policy given.
    """
    if not policies:
        raise ValueError("give at least one policy")
    named = unique_labels([NamedPolicy.of(p) for p in policies])
    out: list[ReplayResult] = []
    for trajectory in trajectories:
        prep = _prepare(trajectory)
        for p in named:
            out.append(_replay_one(trajectory, p, prep))
        if on_run is not None:
            on_run(trajectory)
    return out
