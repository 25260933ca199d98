"""Loop labelling: where a recording loops, independent of (or under) a policy.

The recording is read as a list of agent actions (:class:`Act`: one per agent tool call,
and one per agent step without tool calls, which breaks any run of actions).

* *identical consecutive agent actions*: agent tool calls with the same action
  fingerprint and the same observation digest with no other agent action between them
  (an agent step without tool calls breaks the run; user and environment turns do not,
  they are not agent actions).
* *recorded loop* (policy-independent, :func:`find_recorded_loop`): the earliest stretch
  of at least :data:`MIN_LOOP_REPEATS` identical consecutive agent actions, or of a
  cycle of period 2..4 (distinct members) repeated at least twice, fingerprinted with the
  default volatile fields only. Same action with a changed observation (polling that
  advances, pagination) is not a loop.
* *loop onset* of a guard stop (:func:`loop_onset`): for a ``repeated_action`` stop, the
  first step of the maximal run of identical consecutive agent actions (under the
  policy's fingerprints) that contains the refused call; for ``action_cycle``, the first
  step of the maximal stretch of consecutive actions repeating with the matched period
  that ends at the action completing the cycle (at least one whole period); for
  ``repeated_decision``, the first step in the evidence; for ``no_progress``, the step
  after the last progress; for any other stop (budget, deadline), the recorded loop's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from loopwatch.instrumentation import FailureClass, Policy, Stop, StopReason
from loopwatch.instrumentation.fingerprint import (
    action_fingerprint,
    canonical_json,
    digest,
    fields_lower,
    observation_digest,
)
from loopwatch.instrumentation.policy import DEFAULT_VOLATILE_FIELDS

from .recorded import decoded_observation, recorded_failure_class
from .trajectory import Step, Trajectory

__all__ = [
    "MIN_LOOP_REPEATS",
    "Act",
    "RecordedLoop",
    "actions_of",
    "find_loop",
    "find_recorded_loop",
    "loop_onset",
]

MIN_LOOP_REPEATS: Final = 3
"""Identical consecutive agent actions that make a recorded loop (the corpus READMEs'
"≥3 identical consecutive calls" criterion)."""

_CYCLE_PERIODS: Final = range(2, 5)
_CYCLE_REPETITIONS: Final = 2
_DEFAULT_KEEP: Final[frozenset[str]] = frozenset()


@dataclass(frozen=True, slots=True)
class RecordedLoop:
    """The earliest loop in a recording (policy-independent; see the module docstring).

    Attributes:
        kind: ``repeat`` (identical consecutive actions) or ``cycle``.
        onset_step: agent step (1-based) of its first action.
        actions: how many consecutive actions it spans.
        period: 1 for a repeat, 2..4 for a cycle.
        tool: the (first) tool involved.
    """

    kind: str
    onset_step: int
    actions: int
    period: int
    tool: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every attribute, in the order above."""
        return asdict(self)


@dataclass(slots=True)
class Act:
    """One agent action of the recording: a tool call, or a step without tool calls.

    Attributes:
        step: 1-based agent step.
        call: index among the recording's agent tool calls; -1 for a step without calls.
        key: the policy-independent ``fingerprint + observation digest`` of a call.
    """

    step: int
    call: int
    tool: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    observation: Any = None
    observation_text: str | None = None
    error: bool = False
    failure_class: FailureClass | None = None
    call_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    key: str | None = None


def _arguments(arguments: Any) -> Mapping[str, Any]:
    if isinstance(arguments, Mapping):
        return arguments
    # Arguments recorded as raw text (not JSON) or a JSON scalar/list still fingerprint.
    return {"_raw": arguments}


def _obs_key(act: Act, volatile: frozenset[str], keep: frozenset[str]) -> str:
    if act.error:
        key: str = digest(canonical_json({"error": (act.observation_text or "")[:200]}))
        return key
    key = observation_digest(act.observation, volatile, keep)
    return key


def actions_of(steps: Sequence[Step]) -> list[Act]:
    """The agent actions of ``steps`` (agent steps only), in order, each call keyed."""
    acts: list[Act] = []
    call = 0
    for number, step in enumerate(steps, start=1):
        if not step.tool_calls:
            acts.append(Act(step=number, call=-1))
            continue
        for tc in step.tool_calls:
            arguments = _arguments(tc.arguments)
            act = Act(
                step=number,
                call=call,
                tool=tc.name,
                arguments=arguments,
                observation=None if tc.error else decoded_observation(tc.observation),
                observation_text=tc.observation,
                error=tc.error,
                failure_class=recorded_failure_class(tc) if tc.error else None,
                call_id=tc.call_id,
                started_at=tc.started_at if tc.started_at is not None else step.timestamp,
                ended_at=tc.ended_at,
            )
            fp = action_fingerprint(tc.name, arguments, DEFAULT_VOLATILE_FIELDS)
            act.key = fp + _obs_key(act, DEFAULT_VOLATILE_FIELDS, _DEFAULT_KEEP)
            acts.append(act)
            call += 1
    return acts


def _runs_of(acts: Sequence[Act], key: Callable[[Act], str | None]) -> Iterator[tuple[int, int]]:
    """Maximal runs ``(first, last)`` (indices into ``acts``) of equal, non-None keys."""
    i, n = 0, len(acts)
    while i < n:
        k = key(acts[i])
        if k is None:
            i += 1
            continue
        j = i
        while j + 1 < n and key(acts[j + 1]) == k:
            j += 1
        yield i, j
        i = j + 1


def _cycle_start(
    acts: Sequence[Act], end: int, period: int, key: Callable[[Act], str | None]
) -> int:
    """First index of the maximal stretch ending at ``end`` that repeats with ``period``
    (no break inside); ``end + 1`` when not even one whole period fits."""
    start = end
    while start - 1 >= 0:
        k = key(acts[start - 1])
        if k is None:
            break
        partner = start - 1 + period
        if partner <= end and key(acts[partner]) != k:
            break
        start -= 1
    return start if end - start + 1 >= period else end + 1


def find_recorded_loop(trajectory: Trajectory) -> RecordedLoop | None:
    """The earliest recorded loop of ``trajectory`` (see the module docstring)."""
    return find_loop(actions_of(trajectory.agent_steps))


def find_loop(acts: Sequence[Act]) -> RecordedLoop | None:
    """The earliest recorded loop among ``acts`` (:func:`actions_of`), or ``None``."""

    def key(a: Act) -> str | None:
        return a.key

    # (first action index, loop); the earliest start wins, a repeat before a cycle.
    found: list[tuple[int, int, RecordedLoop]] = []
    for first, last in _runs_of(acts, key):
        if last - first + 1 >= MIN_LOOP_REPEATS:
            a = acts[first]
            found.append((first, 0, RecordedLoop("repeat", a.step, last - first + 1, 1, a.tool)))
            break
    n = len(acts)
    for period in _CYCLE_PERIODS:
        length = period * _CYCLE_REPETITIONS
        for begin in range(n - length + 1):
            if found and begin >= found[0][0]:
                break
            window = acts[begin : begin + length]
            if any(a.key is None for a in window):
                continue
            if len({a.key for a in window[:period]}) < 2:
                continue
            if all(window[i].key == window[i - period].key for i in range(period, length)):
                # Extend forward to the whole periodic stretch (for its length).
                stop = begin + length - 1
                while (
                    stop + 1 < n
                    and acts[stop + 1].key is not None
                    and acts[stop + 1].key == acts[stop + 1 - period].key
                ):
                    stop += 1
                a = acts[begin]
                found.append(
                    (begin, period, RecordedLoop("cycle", a.step, stop - begin + 1, period, a.tool))
                )
                break
        found.sort(key=lambda item: (item[0], item[1]))
    return found[0][2] if found else None


def _policy_key(policy: Policy, *, observation: bool = True) -> Callable[[Act], str | None]:
    """Per act, the action fingerprint under ``policy`` plus (``observation``) its
    observation digest; ``None`` for a step without tool calls."""
    cache: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    def key(act: Act) -> str | None:
        if act.call < 0:
            return None
        settings = cache.get(act.tool)
        if settings is None:
            tp = policy.tool(act.tool)
            settings = (
                DEFAULT_VOLATILE_FIELDS | fields_lower(tp.volatile),
                fields_lower(tp.progress),
            )
            cache[act.tool] = settings
        volatile, keep = settings
        fp: str = action_fingerprint(act.tool, _arguments(act.arguments), volatile, keep)
        return fp + _obs_key(act, volatile, keep) if observation else fp

    return key


def loop_onset(
    stop: Stop,
    acts: Sequence[Act],
    policy: Policy,
    saved_from_call: int,
    recorded: RecordedLoop | None,
) -> int | None:
    """The loop onset of a stop (see the module docstring), or ``None``.

    Args:
        stop: the guard's stop.
        acts: the recording's actions (:func:`actions_of`).
        policy: the policy that stopped it (its fingerprint settings).
        saved_from_call: the first agent call the stop prevented (index among calls).
        recorded: the recording's own loop, the onset of a stop no loop detector made.
    """
    ev = stop.evidence
    if stop.reason is StopReason.REPEATED_ACTION:
        index = _act_index(acts, saved_from_call)
        if index is None:
            return None
        # The refused call was never made, so the guard never saw its recorded result:
        # it joins the identical run before it by its action alone.
        first = index
        action = _policy_key(policy, observation=False)
        if index > 0 and action(acts[index - 1]) == action(acts[index]):
            key = _policy_key(policy)
            k = key(acts[index - 1])
            first = index - 1
            while first - 1 >= 0 and key(acts[first - 1]) == k:
                first -= 1
        onset = acts[first].step
        return max(onset, min(ev.step_indices)) if ev.step_indices else onset
    if stop.reason is StopReason.ACTION_CYCLE:
        index = _act_index(acts, saved_from_call - 1)
        if index is None or not ev.matched_period:
            return None
        start = _cycle_start(acts, index, ev.matched_period, _policy_key(policy))
        if start <= index:
            return acts[start].step
        return int(ev.step_indices[0]) if ev.step_indices else None
    if stop.reason is StopReason.REPEATED_DECISION:
        return int(ev.step_indices[0]) if ev.step_indices else None
    if stop.reason is StopReason.NO_PROGRESS:
        last = ev.detail.get("last_progress_step")
        return int(last) + 1 if isinstance(last, int) else None
    return recorded.onset_step if recorded is not None else None


def _act_index(acts: Sequence[Act], call: int) -> int | None:
    for i, a in enumerate(acts):
        if a.call == call:
            return i
    return None
