"""Replay recorded agent runs through policies with the real guard, offline.

Each :class:`~loopwatch.replay.trajectory.Trajectory` is fed, step by step, to a fresh
:class:`~loopwatch.instrumentation.guard.Guard` per policy: no model call, no tool call,
no span (the guard is pure logic; it is used directly, without ``Run`` or a tracer). The
first stop the guard makes before the recorded run ended is the policy's verdict on that
run (:class:`ReplayResult`); :func:`summarize` and :func:`compare` aggregate them.

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

Definitions used by the results:

* *stop*: the first guard stop other than the agent's own end (``completed``,
  ``final_unverified``, ``refused``). ``stop_step`` is the guard's ``Stop.step``: the
  last agent step the guard let begin (a stop made before a model call reports the
  previous step).
* *identical consecutive agent actions*: agent tool calls with the same action
  fingerprint and the same observation digest with no other agent action between them
  (an agent step without tool calls breaks the run; user and environment turns do not,
  they are not agent actions).
* *recorded loop* (policy-independent, :attr:`ReplayResult.loop`): the earliest stretch
  of at least :data:`MIN_LOOP_REPEATS` identical consecutive agent actions, or of a
  cycle of period 2..4 (distinct members) repeated at least twice, fingerprinted with the
  default volatile fields only. Same action with a changed observation (polling that
  advances, pagination) is not a loop.
* *loop onset* (:attr:`ReplayResult.loop_onset_step`): for a ``repeated_action`` stop,
  the first step of the maximal run of identical consecutive agent actions (under the
  policy's fingerprints) that contains the refused call; for ``action_cycle``, the first
  step of the maximal stretch of consecutive actions repeating with the matched period
  that ends at the action completing the cycle (at least one whole period); for
  ``repeated_decision``, the first step in the evidence; for ``no_progress``, the step
  after the last progress. Otherwise (no stop, or a budget or deadline stop), the onset
  of the recorded loop, or ``None`` when the recording has none.
* *calls saved*: recorded agent tool calls the guard would have prevented: the refused
  call and every agent call after the stop point.
* *false stop*: a stop on a run whose recorded outcome is ``success``.

Example:
    >>> from loopwatch.replay.importers import load_paths
    >>> loaded = load_paths(["../shared/corpus/tau2-bench"])  # doctest: +SKIP
    >>> results = replay(loaded.trajectories, [default_policy()])  # doctest: +SKIP
    >>> summarize(results)[0].stops_by_reason  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from loopwatch.instrumentation.errors import PolicyError, PolicyProblem
from loopwatch.instrumentation.failures import FailureClass
from loopwatch.instrumentation.fingerprint import (
    action_fingerprint,
    canonical_json,
    digest,
    fields_lower,
    observation_digest,
)
from loopwatch.instrumentation.guard import Decision, Guard, Stop, StopReason
from loopwatch.instrumentation.guard import ToolCall as GuardCall
from loopwatch.instrumentation.policy import (
    DEFAULT_VOLATILE_FIELDS,
    Policy,
    builtin_profiles,
    load_policies,
)

from .importers._numbers import too_large
from .trajectory import AGENT, ENVIRONMENT, FAILURE, SUCCESS, UNKNOWN, Step, Trajectory
from .trajectory import ToolCall as RecordedCall

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_POLICY_FILE",
    "MIN_LOOP_REPEATS",
    "SHIPPED_POLICY_FILES",
    "Comparison",
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
    "trajectory_from_stored",
    "unique_labels",
]

DEFAULT_POLICY_FILE: Final = Path(__file__).resolve().parent / "policies" / "default.toml"
"""The shipped replay policy (``loopwatch replay`` without ``--policy``)."""

SHIPPED_POLICY_FILES: Final[Mapping[str, Path]] = {
    "default": DEFAULT_POLICY_FILE,
    "seed": Path(__file__).resolve().parents[1] / "instrumentation" / "profiles" / "seed.toml",
}
"""Policy files shipped with the package, by the short name ``--policy`` accepts."""

MIN_LOOP_REPEATS: Final = 3
"""Identical consecutive agent actions that make a recorded loop (the corpus READMEs'
"≥3 identical consecutive calls" criterion)."""

_CYCLE_PERIODS: Final = range(2, 5)
_CYCLE_REPETITIONS: Final = 2
_AGENT_END: Final = frozenset(
    {StopReason.COMPLETED, StopReason.FINAL_UNVERIFIED, StopReason.REFUSED}
)
_LOOP_DETECTOR_STOPS: Final = frozenset(
    {
        StopReason.REPEATED_ACTION,
        StopReason.ACTION_CYCLE,
        StopReason.REPEATED_DECISION,
        StopReason.NO_PROGRESS,
    }
)
_DEFAULT_KEEP: Final[frozenset[str]] = frozenset()


# ------------------------------------------------------------------ policies


@dataclass(frozen=True, slots=True)
class NamedPolicy:
    """A policy with the label results carry.

    Attributes:
        label: the ``policy`` value of each result (the profile name; ``FILE:PROFILE``
            when two chosen profiles share a name).
        policy: the profile.
        origin: the file it came from.
    """

    label: str
    policy: Policy
    origin: str


def _shipped(name: str) -> Path | None:
    return SHIPPED_POLICY_FILES.get(name)


def load_policy_spec(spec: str) -> list[NamedPolicy]:
    """Policies named by a ``FILE[:PROFILE]`` spec (the ``--policy`` option).

    ``FILE`` is a path, or ``default`` / ``seed`` for the shipped files (a file of that
    name in the working directory wins). Without ``:PROFILE`` every profile of the file
    is returned, in file order. A spec that is none of these but a built-in profile name
    (``investigate-readonly``, ...: the profiles of ``seed``) is that profile, as
    ``loopwatch demo --policy`` takes it. Environment overrides (``LOOPWATCH_POLICY_*``)
    are not applied: replay judges the file as written.

    Raises:
        PolicyError: the file is missing, unreadable or invalid, or has no such profile
            (the problems name the file and the key).
    """
    path_text, profile = spec, None
    if not Path(spec).is_file() and ":" in spec:
        head, _, tail = spec.rpartition(":")
        if head and tail:
            path_text, profile = head, tail
    path = Path(path_text)
    if not path.is_file():
        shipped = _shipped(path_text)
        if shipped is None and profile is None and not path.exists():
            builtin = builtin_profiles()
            if spec in builtin:
                return [NamedPolicy(spec, builtin[spec], str(SHIPPED_POLICY_FILES["seed"]))]
        if shipped is None:
            why = (
                "is a directory, not a policy file (give FILE or FILE:PROFILE)"
                if path.is_dir()
                else "no such policy file"
            )
            raise PolicyError([PolicyProblem("<file>", why, path_text)])
        path = shipped
    profiles = load_policies(path)
    if profile is None:
        return [NamedPolicy(name, p, str(path)) for name, p in profiles.items()]
    if profile not in profiles:
        raise PolicyError(
            [
                PolicyProblem(
                    f"profiles.{profile}",
                    f"no such profile (have: {', '.join(profiles)})",
                    str(path),
                )
            ]
        )
    return [NamedPolicy(profile, profiles[profile], str(path))]


def default_policy() -> NamedPolicy:
    """The first profile of :data:`DEFAULT_POLICY_FILE` (the shipped replay default)."""
    return load_policy_spec(str(DEFAULT_POLICY_FILE))[0]


def unique_labels(policies: Sequence[NamedPolicy]) -> list[NamedPolicy]:
    """``policies`` with labels made unique (``FILE-STEM:PROFILE``, then a counter)."""
    counts = Counter(p.label for p in policies)
    out: list[NamedPolicy] = []
    seen: set[str] = set()
    for p in policies:
        label = p.label if counts[p.label] == 1 else f"{Path(p.origin).stem}:{p.label}"
        base, n = label, 2
        while label in seen:
            label, n = f"{base}#{n}", n + 1
        seen.add(label)
        out.append(NamedPolicy(label, p.policy, p.origin))
    return out


# ---------------------------------------------------------- recorded errors


class RecordedToolError(Exception):
    """A tool call the recording marks failed; its text is the recorded observation."""


_ERROR_RULES: Final[tuple[tuple[re.Pattern[str], FailureClass], ...]] = (
    (
        re.compile(r"\b(401|403)\b|unauthori[sz]ed|forbidden|permission denied", re.I),
        FailureClass.UNAUTHORIZED,
    ),
    (re.compile(r"\b(408|504)\b|timed? ?out|timeout", re.I), FailureClass.TIMEOUT),
    (
        re.compile(
            r"\b(429|500|502|503)\b|rate.?limit|too many requests|temporar|unavailable|"
            r"try again|connection (reset|refused|error)",
            re.I,
        ),
        FailureClass.TRANSIENT,
    ),
    (
        re.compile(
            r"\b(400|404|422)\b|invalid|not found|does not exist|missing|required|"
            r"unknown|no such|cannot|can't|not available|not enough|mismatch",
            re.I,
        ),
        FailureClass.INVALID_ARGUMENTS,
    ),
)


def classify_recorded_error(text: str | None) -> FailureClass:
    """Failure class of a recorded failed call, from its observation text.

    The recording keeps the error text only, not the exception, so the classes of
    :mod:`loopwatch.instrumentation.failures` are derived from it, first match wins:
    HTTP 401/403 or "unauthorized"/"forbidden": ``unauthorized``; 408/504 or "timeout":
    ``timeout``; 429/5xx, "rate limit", "temporarily", "unavailable", "try again":
    ``transient``; 400/404/422, "invalid", "not found", "missing", "cannot"...:
    ``invalid_arguments``; anything else ``permanent`` (as the guard classifies an
    unknown exception). Only the first 500 characters are read.
    """
    head = (text or "")[:500]
    for pattern, failure in _ERROR_RULES:
        if pattern.search(head):
            return failure
    return FailureClass.PERMANENT


def _decoded(observation: str | None) -> Any:
    """The observation, JSON-decoded when it is a JSON object or array."""
    if observation is None:
        return None
    text = observation.strip()
    if text[:1] in ("{", "[") and text[-1:] in ("}", "]"):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return observation
    return observation


# ------------------------------------------------------------------- results


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
        """JSON-ready dict."""
        return {
            "kind": self.kind,
            "onset_step": self.onset_step,
            "actions": self.actions,
            "period": self.period,
            "tool": self.tool,
        }


CSV_COLUMNS: Final[tuple[str, ...]] = (
    "source",
    "run_id",
    "format",
    "recorded_outcome",
    "recorded_stop",
    "policy",
    "policy_version",
    "stop_reason",
    "stop_dimension",
    "stop_step",
    "steps_total",
    "loop_onset_step",
    "calls_total",
    "calls_saved",
    "model_calls_saved",
    "false_stop",
    "loop_kind",
    "loop_actions",
    "evidence",
)
"""Columns of the CSV output, in order (``evidence`` is JSON text)."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What one policy does to one recorded run.

    Attributes:
        source / run_id / format: the trajectory's.
        recorded_outcome: ``success``, ``failure`` or ``unknown`` (from the source).
        recorded_stop: the source's own stop label, if any.
        policy / policy_version: the policy's label and version.
        stop_reason: the guard's stop reason (a :class:`StopReason` value), or ``None``
            when the guard would not have stopped the run before its recorded end.
        stop_dimension: the budget of a ``budget_exhausted`` / ``deadline_exceeded`` stop.
        stop_step: ``Stop.step`` of that stop (1-based agent step), or ``None``.
        steps_total: agent steps in the recording.
        loop_onset_step: see the module docstring; ``None`` when there is no loop.
        evidence: the stop's evidence (``Evidence.to_dict()`` plus ``dimension``,
            ``limit``, ``observed``, ``basis`` when set), ``None`` without a stop.
        calls_total: agent tool calls in the recording.
        calls_saved: agent tool calls the stop would have prevented.
        model_calls_saved: agent model calls (steps) the stop would have prevented.
        false_stop: a stop on a run recorded as ``success``.
        loop: the recorded loop, or ``None``.
    """

    source: str
    run_id: str
    format: str
    recorded_outcome: str
    recorded_stop: str | None
    policy: str
    policy_version: str
    stop_reason: str | None
    stop_dimension: str | None
    stop_step: int | None
    steps_total: int
    loop_onset_step: int | None
    evidence: dict[str, Any] | None
    calls_total: int
    calls_saved: int
    model_calls_saved: int
    false_stop: bool
    loop: RecordedLoop | None

    @property
    def stopped(self) -> bool:
        """True when the guard stopped the run before its recorded end."""
        return self.stop_reason is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON object of ``loopwatch replay --format json`` (DESIGN section 7 fields
        first: ``source, run_id, recorded_outcome, policy, stop_reason, stop_step,
        steps_total, loop_onset_step, evidence``)."""
        return {
            "source": self.source,
            "run_id": self.run_id,
            "recorded_outcome": self.recorded_outcome,
            "policy": self.policy,
            "stop_reason": self.stop_reason,
            "stop_step": self.stop_step,
            "steps_total": self.steps_total,
            "loop_onset_step": self.loop_onset_step,
            "evidence": self.evidence,
            "format": self.format,
            "recorded_stop": self.recorded_stop,
            "policy_version": self.policy_version,
            "stop_dimension": self.stop_dimension,
            "calls_total": self.calls_total,
            "calls_saved": self.calls_saved,
            "model_calls_saved": self.model_calls_saved,
            "false_stop": self.false_stop,
            "loop": self.loop.to_dict() if self.loop is not None else None,
        }

    def csv_row(self) -> dict[str, Any]:
        """One CSV row keyed by :data:`CSV_COLUMNS` (``None`` as an empty cell; the
        ``false_stop`` flag as ``true``/``false``, as the JSON format writes it)."""
        return {
            "source": self.source,
            "run_id": self.run_id,
            "format": self.format,
            "recorded_outcome": self.recorded_outcome,
            "recorded_stop": self.recorded_stop,
            "policy": self.policy,
            "policy_version": self.policy_version,
            "stop_reason": self.stop_reason,
            "stop_dimension": self.stop_dimension,
            "stop_step": self.stop_step,
            "steps_total": self.steps_total,
            "loop_onset_step": self.loop_onset_step,
            "calls_total": self.calls_total,
            "calls_saved": self.calls_saved,
            "model_calls_saved": self.model_calls_saved,
            "false_stop": "true" if self.false_stop else "false",
            "loop_kind": self.loop.kind if self.loop is not None else None,
            "loop_actions": self.loop.actions if self.loop is not None else None,
            "evidence": (
                json.dumps(self.evidence, sort_keys=True, separators=(",", ":"))
                if self.evidence is not None
                else None
            ),
        }


# -------------------------------------------------------------- the action list


@dataclass(slots=True)
class _Act:
    """One agent action of the recording: a tool call, or a step without tool calls."""

    step: int
    call: int  # global index among agent tool calls; -1 for a step without calls
    tool: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    observation: Any = None
    observation_text: str | None = None
    error: bool = False
    failure_class: FailureClass | None = None
    call_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    key: str | None = None  # policy-independent (fingerprint, observation) key


def _obs_key(act: _Act, volatile: frozenset[str], keep: frozenset[str]) -> str:
    if act.error:
        key: str = digest(canonical_json({"error": (act.observation_text or "")[:200]}))
        return key
    key = observation_digest(act.observation, volatile, keep)
    return key


def _actions(steps: Sequence[Step]) -> list[_Act]:
    acts: list[_Act] = []
    call = 0
    for number, step in enumerate(steps, start=1):
        if not step.tool_calls:
            acts.append(_Act(step=number, call=-1))
            continue
        for tc in step.tool_calls:
            arguments = _arguments(tc.arguments)
            act = _Act(
                step=number,
                call=call,
                tool=tc.name,
                arguments=arguments,
                observation=None if tc.error else _decoded(tc.observation),
                observation_text=tc.observation,
                error=tc.error,
                failure_class=classify_recorded_error(tc.observation) if tc.error else None,
                call_id=tc.call_id,
                started_at=tc.started_at if tc.started_at is not None else step.timestamp,
                ended_at=tc.ended_at,
            )
            fp = action_fingerprint(tc.name, arguments, DEFAULT_VOLATILE_FIELDS)
            act.key = fp + _obs_key(act, DEFAULT_VOLATILE_FIELDS, _DEFAULT_KEEP)
            acts.append(act)
            call += 1
    return acts


def _runs_of(acts: Sequence[_Act], key: Callable[[_Act], str | None]) -> Iterator[tuple[int, int]]:
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
    acts: Sequence[_Act], end: int, period: int, key: Callable[[_Act], str | None]
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
    return _find_loop(_actions(trajectory.agent_steps))


def _find_loop(acts: Sequence[_Act]) -> RecordedLoop | None:
    def key(a: _Act) -> str | None:
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


# ----------------------------------------------------------------- the clock


_MAX_UNIX_SECONDS: Final = 253402300800.0
"""Year 10000 in Unix seconds: a larger recorded time is in another unit or corrupt."""


def _usable_time(timestamp: float | None) -> bool:
    """A recorded time the replay clock may use: finite Unix seconds in [0, year 10000).

    One wild value (``Infinity``, a millisecond timestamp among seconds, a corrupt
    ``1e15``) would otherwise jump the clock and stop the run ``deadline_exceeded``;
    such values are ignored, as a missing timestamp is.
    """
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


# ----------------------------------------------------------------- replaying


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
    usage: dict[str, Any] = {
        "input_tokens": int(_usage(step.input_tokens)),
        "output_tokens": int(_usage(step.output_tokens)),
        "cost_usd": float(_usage(step.cost_usd)),
    }
    if step.tool_calls:
        calls = tuple(GuardCall(tc.name, {}, tc.call_id) for tc in step.tool_calls)
        return Decision.tool(*calls, **usage)
    if last and step.decision == "final":
        return Decision.final(step.text, **usage)
    if last and step.decision == "refusal":
        return Decision.refusal(step.text, **usage)
    return Decision.message(step.text, **usage)


@dataclass(slots=True)
class _Prepared:
    """A recording turned, once, into what every policy's guard is fed.

    ``events`` holds, in order, ``None`` for a user or environment turn that brings
    nothing new, ``True`` for one that is new (progress evidence), and
    ``(timestamp, decision, actions)`` for each agent step.
    """

    origin: float | None
    events: list[bool | tuple[float | None, Decision, list[_Act]] | None]
    acts: list[_Act]
    total: int
    calls_total: int
    loop: RecordedLoop | None


def _prepare(trajectory: Trajectory) -> _Prepared:
    agent_steps = trajectory.agent_steps
    acts = _actions(agent_steps)
    by_step: dict[int, list[_Act]] = {}
    for act in acts:
        if act.call >= 0:
            by_step.setdefault(act.step, []).append(act)
    events: list[bool | tuple[float | None, Decision, list[_Act]] | None] = []
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
        loop=_find_loop(acts),
    )


@dataclass(slots=True)
class _Hit:
    stop: Stop
    saved_from_call: int  # first saved call index (global among agent calls)
    model_saved: int


def _drive(prep: _Prepared, policy: Policy, run_id: str) -> _Hit | None:
    """Feed a prepared recording to a fresh guard; the first stop that is not the agent's
    own end, or None."""
    clock = _RecordedClock(prep.origin)
    guard = Guard(policy, clock=clock, run_id=run_id)
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
        verdict = guard.before_model_call()
        if not verdict.allowed:
            return _Hit(_stop(verdict.stop), call, total - number + 1)
        verdict = guard.record_decision(decision)
        if not verdict.allowed:
            stop = _stop(verdict.stop)
            if stop.reason in _AGENT_END:
                return None
            return _Hit(stop, call, total - number)
        for act in calls:
            clock.at(act.started_at)
            ticket = guard.before_tool_call(act.tool, act.arguments, call_id=act.call_id)
            if ticket.stop is not None:
                return _Hit(ticket.stop, call, total - number)
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
                if not record.verdict.allowed:
                    return _Hit(_stop(record.verdict.stop), call + 1, total - number)
            call += 1
    return None


def _stop(stop: Stop | None) -> Stop:
    if stop is None:  # pragma: no cover - a refused verdict always carries its stop
        raise RuntimeError("the guard refused without a stop")
    return stop


def _arguments(arguments: Any) -> Mapping[str, Any]:
    if isinstance(arguments, Mapping):
        return arguments
    # Arguments recorded as raw text (not JSON) or a JSON scalar/list still fingerprint.
    return {"_raw": arguments}


def _policy_key(policy: Policy, *, observation: bool = True) -> Callable[[_Act], str | None]:
    """Per act, the action fingerprint under ``policy`` plus (``observation``) its
    observation digest; ``None`` for a step without tool calls."""
    cache: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    def key(act: _Act) -> str | None:
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


def _onset(stop: Stop, acts: Sequence[_Act], policy: Policy, hit: _Hit) -> int | None:
    ev = stop.evidence
    if stop.reason is StopReason.REPEATED_ACTION:
        index = _act_index(acts, hit.saved_from_call)
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
    if stop.reason is StopReason.ACTION_CYCLE and ev.matched_period:
        index = _act_index(acts, hit.saved_from_call - 1)
        if index is None:
            return None
        start = _cycle_start(acts, index, ev.matched_period, _policy_key(policy))
        if start <= index:
            return acts[start].step
        return int(ev.step_indices[0]) if ev.step_indices else None
    if stop.reason is StopReason.REPEATED_DECISION and ev.step_indices:
        return int(ev.step_indices[0])
    if stop.reason is StopReason.NO_PROGRESS:
        last = ev.detail.get("last_progress_step")
        return int(last) + 1 if isinstance(last, int) else None
    return None


def _act_index(acts: Sequence[_Act], call: int) -> int | None:
    for i, a in enumerate(acts):
        if a.call == call:
            return i
    return None


def _evidence(stop: Stop) -> dict[str, Any]:
    out: dict[str, Any] = stop.evidence.to_dict()
    if stop.dimension is not None:
        out["dimension"] = stop.dimension.value
    for name in ("limit", "observed", "basis"):
        value = getattr(stop, name)
        if value is not None:
            out[name] = value
    return out


def replay_run(trajectory: Trajectory, policy: NamedPolicy | Policy) -> ReplayResult:
    """Replay one recorded run through one policy.

    Args:
        trajectory: the recorded run.
        policy: the policy (a bare :class:`Policy` is labelled with its name).

    Returns:
        The :class:`ReplayResult`. Never raises for odd recordings: arguments that are
        not a JSON object are fingerprinted as ``{"_raw": value}``.
    """
    named = (
        policy
        if isinstance(policy, NamedPolicy)
        else NamedPolicy(policy.name, policy, policy.origin)
    )
    return _replay_one(trajectory, named, _prepare(trajectory))


def _replay_one(trajectory: Trajectory, named: NamedPolicy, prep: _Prepared) -> ReplayResult:
    hit = _drive(prep, named.policy, trajectory.run_id)
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
        onset = _onset(stop, acts, named.policy, hit)
        if onset is None and loop is not None and stop.reason not in _LOOP_DETECTOR_STOPS:
            onset = loop.onset_step
        evidence = _evidence(stop)
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
    named = unique_labels(
        [p if isinstance(p, NamedPolicy) else NamedPolicy(p.name, p, p.origin) for p in policies]
    )
    out: list[ReplayResult] = []
    for trajectory in trajectories:
        prep = _prepare(trajectory)
        for p in named:
            out.append(_replay_one(trajectory, p, prep))
        if on_run is not None:
            on_run(trajectory)
    return out


# ------------------------------------------------------------------ summaries


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy's figures over a set of replayed runs.

    Attributes:
        policy: the policy label.
        runs: runs replayed.
        stopped: runs the policy stopped before their recorded end.
        stops_by_reason: ``{stop reason: runs}`` for the stopped runs.
        loops: runs with a recorded loop (:class:`RecordedLoop`).
        loops_caught: of those, runs the policy stopped (any reason).
        successful_runs: runs recorded as ``success``.
        false_stops: of those, runs the policy stopped.
        false_stop_rate: ``false_stops / successful_runs`` (``None`` without successes).
        median_steps_onset_to_stop: median of ``stop_step - loop_onset_step`` over caught
            loops stopped at or after their onset (``None`` when there are none).
        calls_total / calls_saved: agent tool calls recorded / prevented by the stops.
        model_calls_saved: agent model calls prevented by the stops.
    """

    policy: str
    runs: int
    stopped: int
    stops_by_reason: dict[str, int]
    loops: int
    loops_caught: int
    successful_runs: int
    false_stops: int
    false_stop_rate: float | None
    median_steps_onset_to_stop: float | None
    calls_total: int
    calls_saved: int
    model_calls_saved: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "policy": self.policy,
            "runs": self.runs,
            "stopped": self.stopped,
            "stops_by_reason": dict(self.stops_by_reason),
            "loops": self.loops,
            "loops_caught": self.loops_caught,
            "successful_runs": self.successful_runs,
            "false_stops": self.false_stops,
            "false_stop_rate": self.false_stop_rate,
            "median_steps_onset_to_stop": self.median_steps_onset_to_stop,
            "calls_total": self.calls_total,
            "calls_saved": self.calls_saved,
            "model_calls_saved": self.model_calls_saved,
        }


def summarize(results: Iterable[ReplayResult]) -> list[PolicySummary]:
    """Per-policy figures, policies in first-seen order (see :class:`PolicySummary`)."""
    by_policy: dict[str, list[ReplayResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    out: list[PolicySummary] = []
    for label, rows in by_policy.items():
        stopped = [r for r in rows if r.stopped]
        reasons = Counter(r.stop_reason for r in stopped if r.stop_reason is not None)
        loops = [r for r in rows if r.loop is not None]
        caught = [r for r in loops if r.stopped]
        gaps = [
            r.stop_step - r.loop_onset_step
            for r in caught
            if r.stop_step is not None
            and r.loop_onset_step is not None
            and r.stop_step >= r.loop_onset_step
        ]
        successes = [r for r in rows if r.recorded_outcome == SUCCESS]
        false_stops = sum(1 for r in successes if r.stopped)
        out.append(
            PolicySummary(
                policy=label,
                runs=len(rows),
                stopped=len(stopped),
                stops_by_reason=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
                loops=len(loops),
                loops_caught=len(caught),
                successful_runs=len(successes),
                false_stops=false_stops,
                false_stop_rate=false_stops / len(successes) if successes else None,
                median_steps_onset_to_stop=float(statistics.median(gaps)) if gaps else None,
                calls_total=sum(r.calls_total for r in rows),
                calls_saved=sum(r.calls_saved for r in rows),
                model_calls_saved=sum(r.model_calls_saved for r in rows),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two policies over the same runs, run by run.

    Attributes:
        a / b: the policy labels.
        summary_a / summary_b: their :class:`PolicySummary`.
        both / only_a / only_b / neither: runs stopped by both, only one, or neither.
        same_stop: runs both stopped with the same reason at the same step.
        differing: the runs where the two verdicts differ, as
            ``(source, run_id, result_a, result_b)``.
    """

    a: str
    b: str
    summary_a: PolicySummary
    summary_b: PolicySummary
    both: int
    only_a: int
    only_b: int
    neither: int
    same_stop: int
    differing: list[tuple[str, str, ReplayResult, ReplayResult]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (differing runs as ``{source, run_id, a, b}`` with each side's
        ``stop_reason`` and ``stop_step``)."""
        return {
            "a": self.a,
            "b": self.b,
            "summary_a": self.summary_a.to_dict(),
            "summary_b": self.summary_b.to_dict(),
            "both": self.both,
            "only_a": self.only_a,
            "only_b": self.only_b,
            "neither": self.neither,
            "same_stop": self.same_stop,
            "differing": [
                {
                    "source": src,
                    "run_id": run,
                    "a": {"stop_reason": ra.stop_reason, "stop_step": ra.stop_step},
                    "b": {"stop_reason": rb.stop_reason, "stop_step": rb.stop_step},
                }
                for src, run, ra, rb in self.differing
            ],
        }


def compare(results: Iterable[ReplayResult], a: str, b: str) -> Comparison:
    """Compare policies ``a`` and ``b`` (labels) over the runs both replayed.

    Raises:
        ValueError: ``a`` or ``b`` has no results.
    """
    rows = list(results)
    side: dict[str, dict[tuple[str, str], ReplayResult]] = {a: {}, b: {}}
    for r in rows:
        if r.policy in side:
            side[r.policy][(r.source, r.run_id)] = r
    for label in (a, b):
        if not side[label]:
            raise ValueError(f"no results for policy {label!r}")
    keys = [k for k in side[a] if k in side[b]]
    both = only_a = only_b = neither = same = 0
    differing: list[tuple[str, str, ReplayResult, ReplayResult]] = []
    for key in keys:
        ra, rb = side[a][key], side[b][key]
        if ra.stopped and rb.stopped:
            both += 1
        elif ra.stopped:
            only_a += 1
        elif rb.stopped:
            only_b += 1
        else:
            neither += 1
        if (ra.stop_reason, ra.stop_step) == (rb.stop_reason, rb.stop_step):
            same += ra.stopped
        else:
            differing.append((key[0], key[1], ra, rb))
    common = set(keys)
    summaries = summarize(r for r in rows if r.policy in (a, b) and (r.source, r.run_id) in common)
    by_label = {s.policy: s for s in summaries}
    return Comparison(
        a, b, by_label[a], by_label[b], both, only_a, only_b, neither, same, differing
    )


# ------------------------------------------------------------ stored runs

_NS_PER_SECOND: Final = 1e9


def _present(value: Any) -> bool:
    """Not None and not a missing number (pandas gives NaN for missing numbers)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _seconds(value: Any) -> float | None:
    return float(value) / _NS_PER_SECOND if _present(value) else None


def _recorded_progress(decision: Mapping[str, Any]) -> bool:
    """Whether a stored decision row says the recording guard counted progress just
    before it (``steps_since_progress`` 0)."""
    value: Any = decision.get("steps_since_progress")
    return _present(value) and float(value) == 0


def trajectory_from_stored(
    run_id: str,
    steps: Sequence[Mapping[str, Any]],
    *,
    stop_reason: str | None = None,
    agent: str | None = None,
    source: str = "collector",
) -> Trajectory:
    """A :class:`Trajectory` from a run the collector stored (its ``steps`` rows).

    Args:
        run_id: the run's id.
        steps: the stored step rows, as the read API's ``/api/v1/runs/{id}`` or
            ``RunData.step_records()`` return them: ``kind`` (``decision`` or
            ``tool_result``), ``step``, ``decision_type``, ``decision_fingerprint``,
            ``tool``, ``tool_call_id``, ``outcome``, ``action_fingerprint``,
            ``observation_digest``, ``arguments`` and ``result`` (JSON text, present only
            when the agent captured content), ``start_unix_nano``, ``end_unix_nano``,
            ``input_tokens``, ``output_tokens``, ``cost_usd``.
        stop_reason: the stored stop reason: ``completed`` is recorded as ``success``,
            another reason as ``failure``, none as ``unknown``.
        agent: the agent name.
        source: what to name as the trajectory's source.

    Without captured content, a call's arguments become ``{"action_fingerprint": ...}``
    and its observation the stored observation digest, so identical actions and
    observations stay identical (per-tool ``volatile`` settings of the replayed policy
    cannot apply then). A non-tool decision's text is its stored fingerprint, so repeated
    decisions stay repeated. Calls the recording guard blocked are kept (the agent
    attempted them) without an observation. Where a decision row's
    ``steps_since_progress`` is 0 after the first step and no tool result of the step
    before was ``progress``, the recording guard counted explicit progress
    (``Run.progress``, in no other stored field); an environment turn is inserted there,
    so the replay counts it too.
    """
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for row in steps:
        value: Any = row.get("step")
        if not _present(value):
            continue
        by_step.setdefault(int(value), []).append(row)
    out: list[Step] = []
    tool_progress = False  # a tool result of the previous step was progress
    for number in sorted(by_step):
        rows = by_step[number]
        decision = next((r for r in rows if r.get("kind") == "decision"), None)
        calls: list[RecordedCall] = []
        for r in rows:
            if r.get("kind") != "tool_result":
                continue
            arguments: Any = None
            raw_args = r.get("arguments")
            if _present(raw_args) and raw_args != "":
                try:
                    arguments = json.loads(str(raw_args))
                except (ValueError, RecursionError):
                    arguments = str(raw_args)
            if arguments is None:
                arguments = {"action_fingerprint": r.get("action_fingerprint") or ""}
            outcome = r.get("outcome")
            result = r.get("result")
            observation: str | None
            if outcome == "blocked":
                observation = None
            elif _present(result) and result != "":
                observation = str(result)
            else:
                digest_value = r.get("observation_digest")
                observation = str(digest_value) if _present(digest_value) else None
            calls.append(
                RecordedCall(
                    name=str(r.get("tool") or ""),
                    arguments=arguments,
                    observation=observation,
                    error=outcome == "error",
                    call_id=str(r["tool_call_id"]) if _present(r.get("tool_call_id")) else None,
                    started_at=_seconds(r.get("start_unix_nano")),
                    ended_at=_seconds(r.get("end_unix_nano")),
                )
            )
        kind = str(decision.get("decision_type") or "") if decision is not None else ""
        if calls:
            kind = "tool"
        elif kind not in ("final", "refusal", "message"):
            kind = "message"
        first = decision if decision is not None else rows[0]
        text = first.get("decision_fingerprint") if decision is not None else None
        if out and decision is not None and _recorded_progress(decision) and not tool_progress:
            # The recording guard counted progress after the last step, and none of that
            # step's tool results brought it (those the replay sees, and they do not end
            # a run of identical actions): explicit progress from the environment
            # (Run.progress: a user reply), which no stored row holds otherwise.
            out.append(
                Step(
                    index=len(out),
                    actor=ENVIRONMENT,
                    decision="message",
                    text=f"progress recorded before step {number}",
                )
            )
        tool_progress = any(
            r.get("kind") == "tool_result" and _present(r.get("progress")) and bool(r["progress"])
            for r in rows
        )
        out.append(
            Step(
                index=len(out),
                actor=AGENT,
                decision=kind,  # type: ignore[arg-type]
                text=str(text) if _present(text) else None,
                tool_calls=tuple(calls),
                timestamp=_seconds(first.get("start_unix_nano")),
                input_tokens=int(first["input_tokens"])
                if decision is not None and _present(first.get("input_tokens"))
                else None,
                output_tokens=int(first["output_tokens"])
                if decision is not None and _present(first.get("output_tokens"))
                else None,
                cost_usd=float(first["cost_usd"])
                if decision is not None and _present(first.get("cost_usd"))
                else None,
            )
        )
    if stop_reason is None or stop_reason == "":
        outcome_value = UNKNOWN
    elif stop_reason == StopReason.COMPLETED.value:
        outcome_value = SUCCESS
    else:
        outcome_value = FAILURE
    return Trajectory(
        source=source,
        run_id=run_id,
        format="loopwatch",
        steps=tuple(out),
        recorded_outcome=outcome_value,  # type: ignore[arg-type]
        recorded_stop=stop_reason or None,
        recorded_stop_kind="explicit",
        agent=agent or "recorded-agent",
    )
