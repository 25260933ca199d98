"""The guard: pure stop logic for one agent run (no OpenTelemetry here).

The guard is checked *before* each costly call and returns a typed verdict; expected exits
are data (a :class:`Stop` inside an :class:`Outcome`), never exceptions. It implements
DESIGN section 3:

- ``before_model_call`` / ``before_tool_call`` check and reserve the budget before the
  call leaves the process: a limit of N permits exactly N calls.
- Pre-dispatch checks, in order: deadline, ceilings (tool attempts, tool successes, the
  parent's remaining budget, then success slots held by calls in flight: refused without
  a stop), retries per action (keyed by a loose fingerprint and the
  previous failure class; :mod:`.failures` decides the allowance), repeated action
  (same fingerprint and unchanged observation, in a row, with no progress evidence from
  the environment in between, or :data:`REPEAT_ACROSS_PROGRESS_FACTOR` times as many in
  a row whatever came between; for writes, the same *intent* anywhere in the window),
  action cycle (periods ``2..cycle_max_period`` repeated ``cycle_repetitions`` times
  with unchanged observations).
- After each step, in order: goal check, ceilings (tokens and cost as observed), then
  no progress (``no_progress_patience`` steps without progress evidence).
- Progress evidence comes from the environment only: a tool observation not seen before
  in the window, a changed progress-bearing field (``cursor``, ``page``), or an explicit
  :meth:`Guard.progress` call; never the model's say-so.
- Detector state is bounded by ``detector_window`` whatever the run's length.

Thread-safety: every public method takes the guard's lock, so parallel tool calls cannot
both take the last slot. A run tree shares one lock (a child uses its root's), so a
child's check and its charge to every ancestor are one atomic step. A dispatched call
holds a tool-success slot (here and in every ancestor) until its result or error is
recorded, so calls in flight together cannot all succeed past ``max_tool_successes``: a
call that finds every slot left held is refused without ending the run.

Modes: ``enforce`` ends the run at the first stop; ``observe`` records what it would have
stopped (``Outcome.observed_stops``) and lets the run go on to its natural end.

Example::

    guard = Guard(Policy.build(max_model_turns=3))
    while True:
        verdict = guard.before_model_call()
        if not verdict.allowed:
            break
        decision = model(...)
        if not guard.record_decision(decision).allowed:
            break
        for call in decision.tool_calls:
            ticket = guard.before_tool_call(call.name, call.arguments)
            if not ticket.allowed:
                break
            guard.record_tool_result(ticket, result=tools[call.name](**call.arguments))
    outcome = guard.finish()
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from enum import StrEnum
from typing import Any, Final, Literal

from .failures import FailureClass, classify_exception, retry_allowance
from .fingerprint import (
    canonical_json,
    canonicalize,
    digest,
    fields_lower,
    fingerprint_with,
    key_text,
    observation_digest_with,
    preview,
    text_fingerprint,
    tool_suffix,
)
from .policy import DEFAULT_VOLATILE_FIELDS, Policy

__all__ = [
    "MAX_LOOKBACK",
    "MAX_REPORTED_TOKENS",
    "REPEAT_ACROSS_PROGRESS_FACTOR",
    "Decision",
    "DecisionType",
    "Dimension",
    "Evidence",
    "Guard",
    "Outcome",
    "Stop",
    "StopReason",
    "ToolCall",
    "ToolRecord",
    "ToolTicket",
    "Usage",
    "Verdict",
]

Mode = Literal["enforce", "observe"]
Basis = Literal["projected", "observed"]
_SNAPSHOT_FORMAT: Final = "loopwatch.guard/1"
MAX_LOOKBACK: Final = 4096
"""The longest look-back a limit can ask for (the largest ``detector_window``); a
``repeated_decision_limit`` or a cycle span (period x repetitions) beyond it can never
fire, which is how a policy switches those detectors off."""


def _lookback(window: int, needed: int) -> int:
    return max(window, min(needed, MAX_LOOKBACK))


_MAX_OBSERVED_STOPS: Final = 32
_ERROR_MESSAGE_CHARS: Final = 200
REPEAT_ACROSS_PROGRESS_FACTOR: Final = 3
"""Progress from the environment (:meth:`Guard.progress`) starts a new count of
identical actions; this many times the repeat limit in a row is refused all the same
(``repeated_action`` with ``detail.across_progress``), so an environment that reports
something new every turn cannot switch the detector off. 3: the successful tau2 runs of
the corpus re-read a line up to 6 times in a row, each after a user turn (2 stopped one
of them); with 3, replaying the corpus stops the same runs as with no cap at all."""


class StopReason(StrEnum):
    """Why a run ended (DESIGN section 2: a closed set, used as a metric label)."""

    COMPLETED = "completed"
    FINAL_UNVERIFIED = "final_unverified"
    REFUSED = "refused"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    REPEATED_ACTION = "repeated_action"
    ACTION_CYCLE = "action_cycle"
    REPEATED_DECISION = "repeated_decision"
    NO_PROGRESS = "no_progress"
    CANCELLED = "cancelled"
    ERROR = "error"


class Dimension(StrEnum):
    """The budget a ``budget_exhausted`` (or ``deadline_exceeded``) stop ran out of."""

    MODEL_TURNS = "model_turns"
    TOOL_ATTEMPTS = "tool_attempts"
    TOOL_SUCCESSES = "tool_successes"
    ACTION_RETRIES = "action_retries"
    TOKENS = "tokens"
    COST = "cost"
    ELAPSED_SECONDS = "elapsed_seconds"


class DecisionType(StrEnum):
    """What the model chose in one step."""

    TOOL = "tool"
    FINAL = "final"
    REFUSAL = "refusal"
    MESSAGE = "message"


_RETRYABLE: Final = frozenset(
    {StopReason.DEADLINE_EXCEEDED, StopReason.BUDGET_EXHAUSTED, StopReason.ERROR}
)
_TERMINAL_EVEN_IN_OBSERVE: Final = frozenset(
    {
        StopReason.COMPLETED,
        StopReason.FINAL_UNVERIFIED,
        StopReason.REFUSED,
        StopReason.CANCELLED,
        StopReason.ERROR,
    }
)
_MESSAGES: Final[dict[StopReason, str]] = {
    StopReason.COMPLETED: "The run completed with a final answer.",
    StopReason.FINAL_UNVERIFIED: "The run gave a final answer that failed the goal check.",
    StopReason.REFUSED: "The model refused the task.",
    StopReason.BUDGET_EXHAUSTED: (
        "Stopped: the {dimension} budget is exhausted ({observed} of {limit})."
    ),
    StopReason.DEADLINE_EXCEEDED: "Stopped: the wall-clock deadline of {limit} s was reached.",
    StopReason.REPEATED_ACTION: "Stopped: the same action repeated with an unchanged result.",
    StopReason.ACTION_CYCLE: "Stopped: a cycle of actions repeated with unchanged results.",
    StopReason.REPEATED_DECISION: "Stopped: the model repeated the same non-tool decision.",
    StopReason.NO_PROGRESS: "Stopped: no progress for {observed} steps.",
    StopReason.CANCELLED: "The run was cancelled.",
    StopReason.ERROR: "The run failed with an unexpected error.",
}


COST_DECIMALS: Final = 9
"""Costs are compared with budgets (and reported) rounded to 1e-9 US dollars, so that
ten calls of $0.1 make exactly the $1.0 a budget names: in binary floating point the sum
is 0.9999999999999999, and three of $0.1 are 0.30000000000000004, which crossed a $0.3
budget after the third call instead of refusing the fourth. The running total itself is
kept exact (rounding each addition lost costs under half a nanodollar)."""


def _dollars(amount: float) -> float:
    return round(amount, COST_DECIMALS)


_NEAR: Final = 10.0**-COST_DECIMALS  # closer to a budget than this, compare rounded


MAX_REPORTED_TOKENS: Final = 2**40
"""The most tokens one reported count stands for (about 1.1e12, far past any model's).

A larger count (a corrupt recording, a unit mix-up) counts as this: OTLP carries
integers as signed 64-bit, and an exporter drops an attribute past that range without
raising, so the decision's usage and the run's totals would silently vanish from the
trace. Capped per report, a run's totals stay within range for 2**23 reports.
"""


_SNAPSHOT_COUNTERS: Final = (
    "turns",
    "attempts",
    "successes",
    "errors",
    "blocked",
    "retries_total",
    "input_tokens",
    "output_tokens",
    "cost",
    "step",
    "steps_since_progress",
)


def _check_snapshot_number(name: str, value: Any) -> None:
    """Refuse a snapshot value that is negative or not a finite number (``ValueError``)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"snapshot field {name!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"snapshot field {name!r} must be a finite number >= 0")


def _blank(value: Any) -> bool:
    """An idempotency key value that is no key: None or the empty string."""
    return value is None or (isinstance(value, str) and str.__len__(value) == 0)


def _usage_tokens(value: Any) -> int:
    """A reported token count as an int in ``0..MAX_REPORTED_TOKENS``; ``None`` (providers
    that report no usage, streaming responses) counts as 0, and so does anything that is
    not a number (NaN, ``"many"``): it raised from :meth:`Guard.record_decision` and
    ended the run as ``error``. An infinite count is a larger count: the cap."""
    if type(value) is int:
        return min(max(value, 0), MAX_REPORTED_TOKENS)
    if value is None:
        return 0
    try:
        number = float(value) if isinstance(value, float | str) else int(value)
    except Exception:  # a number from a broken report is no number
        return 0
    if isinstance(number, float):
        if math.isnan(number):
            return 0
        if math.isinf(number):
            return MAX_REPORTED_TOKENS if number > 0 else 0
        number = int(number)
    return min(max(number, 0), MAX_REPORTED_TOKENS)


def _usage_cost(value: Any) -> float:
    """A reported cost in US dollars as a finite or infinite float >= 0; ``None``, NaN,
    negative values and anything that is not a number (a complex, ``"abc"``: they raised
    from :meth:`Guard.record_decision`) count as 0."""
    if value is None:
        return 0.0
    try:
        cost = float(value)
    except Exception:  # a number from a broken report is no number
        return 0.0
    return cost if cost > 0 else 0.0  # NaN and negative costs count as nothing


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call chosen by the model.

    Attributes:
        name: tool name (``gen_ai.tool.name``).
        arguments: JSON-like arguments.
        call_id: the model's tool-call id (``gen_ai.tool.call.id``), if any.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the model chose in one step.

    Attributes:
        type: ``tool``, ``final``, ``refusal`` or ``message``.
        tool_calls: the calls of a ``tool`` decision.
        text: message, plan, clarification or refusal text (fingerprinted, never stored
            by the guard).
        answer: the final answer of a ``final`` decision.
        asks_for: fields a clarification asks for; a re-ask of the same fields is the same
            decision however it is worded.
        input_tokens / output_tokens: usage reported by the model call (``None``
            counts as 0, as providers send when they report none; so do NaN, negative
            counts and values that are not numbers; counts past
            :data:`MAX_REPORTED_TOKENS`, infinity included, count as that).
        cost_usd: cost of the model call in US dollars (``None``, NaN, negative
            values and values that are not numbers count as 0).
    """

    type: DecisionType
    tool_calls: tuple[ToolCall, ...] = ()
    text: str | None = None
    answer: Any = None
    asks_for: tuple[str, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    @classmethod
    def tool(cls, *calls: ToolCall, **usage: Any) -> Decision:
        """A ``tool`` decision with one or more calls."""
        return cls(DecisionType.TOOL, tool_calls=tuple(calls), **usage)

    @classmethod
    def final(cls, answer: Any, **usage: Any) -> Decision:
        """A ``final`` decision carrying the answer."""
        return cls(DecisionType.FINAL, answer=answer, **usage)

    @classmethod
    def message(
        cls, text: str | None = None, *, asks_for: Sequence[str] = (), **usage: Any
    ) -> Decision:
        """A ``message`` decision (plan, clarification, empty message)."""
        return cls(DecisionType.MESSAGE, text=text, asks_for=tuple(asks_for), **usage)

    @classmethod
    def refusal(cls, text: str | None = None, **usage: Any) -> Decision:
        """A ``refusal`` decision."""
        return cls(DecisionType.REFUSAL, text=text, **usage)

    def fingerprint(self) -> str:
        """Fingerprint of a non-tool decision (asked fields win over wording)."""
        if self.asks_for:
            fields = sorted({f.strip().casefold() for f in self.asks_for})
            return digest(canonical_json({"asks_for": fields}))
        return text_fingerprint(self.text)


@dataclass(frozen=True, slots=True)
class Evidence:
    """Structured proof attached to a stop.

    Attributes:
        detector: ``repeated_action``, ``duplicate_intent``, ``action_cycle``,
            ``repeated_decision``, ``no_progress``, ``ceiling``, ``retry_rule``,
            ``deadline``, ``goal_check``, ``exception``.
        tool: the tool involved, if any.
        matched_period: the cycle period (``action_cycle``).
        repetitions: how many identical occurrences or cycle repetitions were seen,
            counting the refused one.
        step_indices: the steps involved (1-based), oldest first.
        fingerprint_previews: redacted previews (``tool#fingerprint-prefix``).
        failure_class: the failure class behind a retry stop.
        scope: ``run`` or ``parent`` (a parent's budget ran out).
        detail: a few more safe, structured facts.
    """

    detector: str | None = None
    tool: str | None = None
    matched_period: int | None = None
    repetitions: int | None = None
    step_indices: tuple[int, ...] = ()
    fingerprint_previews: tuple[str, ...] = ()
    failure_class: str | None = None
    scope: str = "run"
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict without empty fields."""
        out: dict[str, Any] = {"scope": self.scope}
        for key in ("detector", "tool", "matched_period", "repetitions", "failure_class"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.step_indices:
            out["step_indices"] = list(self.step_indices)
        if self.fingerprint_previews:
            out["fingerprint_previews"] = list(self.fingerprint_previews)
        if self.detail:
            out["detail"] = dict(self.detail)
        return out


@dataclass(frozen=True, slots=True)
class Stop:
    """Why and where a run ended.

    Attributes:
        reason: the :class:`StopReason`.
        step: the step (1-based) at which it stopped; 0 before any step.
        dimension: the budget that ran out (budget and deadline stops).
        limit / observed: the limit, and the value that crossed it (for a refused call:
            what the total would have been).
        basis: ``projected`` (refused before the call crossed the limit) or
            ``observed`` (the limit was crossed by a reported usage).
        evidence: structured proof.
        message: a safe one-line explanation.
        retryable: whether running the same task again could succeed (budget, deadline,
            infrastructure error) as opposed to a loop or a refusal.
    """

    reason: StopReason
    step: int
    dimension: Dimension | None = None
    limit: float | None = None
    observed: float | None = None
    basis: Basis | None = None
    evidence: Evidence = field(default_factory=Evidence)
    message: str = ""
    retryable: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the stop span attributes carry the same facts)."""
        out: dict[str, Any] = {
            "reason": self.reason.value,
            "step": self.step,
            "message": self.message,
            "retryable": self.retryable,
            "evidence": self.evidence.to_dict(),
        }
        if self.dimension is not None:
            out["dimension"] = self.dimension.value
        for key in ("limit", "observed", "basis"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class Usage:
    """Consumption counters of one run (a snapshot).

    Attributes:
        model_turns / tool_attempts / tool_successes / tool_errors / tool_blocked: counts.
        retries: retries made, all actions together.
        input_tokens / output_tokens / tokens: token counts (tokens = input + output).
        cost_usd: US dollars. elapsed_seconds: wall clock on the guard's clock.
        steps: steps begun. steps_since_progress: steps since the last progress evidence.
    """

    model_turns: int = 0
    tool_attempts: int = 0
    tool_successes: int = 0
    tool_errors: int = 0
    tool_blocked: int = 0
    retries: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    elapsed_seconds: float = 0.0
    steps: int = 0
    steps_since_progress: int = 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Result of a check.

    Attributes:
        allowed: whether the call may proceed.
        stop: the stop that ended the run (``allowed`` is False), if any.
        would_stop: in ``observe`` mode, the stop the guard would have made.
    """

    allowed: bool
    stop: Stop | None = None
    would_stop: Stop | None = None


_ALLOWED: Final = Verdict(True)


@dataclass(slots=True)
class ToolTicket:
    """The guard's answer to :meth:`Guard.before_tool_call`; pass it back with the result.

    Attributes:
        allowed: dispatch the call only when True.
        stop: the stop made by this check (the call was refused and the run ended).
        blocked_by: the rule that refused the call (``unknown_tool``, a detector, a
            ceiling), or None.
        tool / call_id / step / risk: what was asked.
        fingerprint: action fingerprint (64 hex). intent: intent fingerprint (writes).
        retry_key: the loose fingerprint used for retries. is_retry: this attempt retries
            a failed one. idempotency_key: the write's key value, if any.
        timeout_seconds: how long the call may run (tool timeout, capped by the deadline).
        would_stop: ``observe`` mode: the stop this call would have caused.
        guard: the guard that issued the ticket (only it records the result).
    """

    allowed: bool
    tool: str
    call_id: str | None
    step: int
    risk: str
    fingerprint: str
    intent: str
    retry_key: str
    is_retry: bool = False
    idempotency_key: str | None = None
    stop: Stop | None = None
    blocked_by: str | None = None
    timeout_seconds: float = 0.0
    would_stop: Stop | None = None
    done: bool = False
    arguments: Mapping[str, Any] | None = None
    guard: Guard | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """What the guard recorded of a tool result.

    Attributes:
        accepted: False when the result came after the run stopped (a late result
            cannot append to a closed run) or the ticket was already used.
        outcome: ``ok`` or ``error``.
        observation_digest: 64 hex chars.
        failure_class: for errors.
        error_type: the exception's type name, for errors.
        progress: whether this result is progress evidence.
        steps_since_progress: after this result.
        verdict: the run's state after recording (a stop made here, if any).
    """

    accepted: bool
    outcome: str = "ok"
    observation_digest: str = ""
    failure_class: FailureClass | None = None
    error_type: str | None = None
    progress: bool = False
    steps_since_progress: int = 0
    verdict: Verdict = _ALLOWED


def _record_maker() -> Callable[..., ToolRecord]:
    # A frozen dataclass's __init__ sets each field through object.__setattr__; the
    # slot descriptors set them directly (same object, same immutability afterwards).
    slots = ToolRecord.__dict__
    names = [f.name for f in dataclass_fields(ToolRecord)]
    # A field added to ToolRecord must be added here too (unpacking fails at import).
    s0, s1, s2, s3, s4, s5, s6, s7 = (slots[n].__set__ for n in names)
    new = object.__new__

    def make(  # noqa: PLR0917 - positional on purpose: this is the hot path
        accepted: bool,
        outcome: str,
        obs: str,
        fc: FailureClass | None,
        error_type: str | None,
        progress: bool,
        since: int,
        verdict: Verdict,
    ) -> ToolRecord:
        record = new(ToolRecord)
        s0(record, accepted)
        s1(record, outcome)
        s2(record, obs)
        s3(record, fc)
        s4(record, error_type)
        s5(record, progress)
        s6(record, since)
        s7(record, verdict)
        return record

    return make


_new_record: Final = _record_maker()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: the envelope returned by the ``@agent`` decorator and ``Run``.

    Attributes:
        run_id: the run's id.
        status: ``completed`` (stop reason ``completed``) or ``stopped`` (any other).
        stop: the :class:`Stop` (exactly one per run).
        usage: final counters.
        answer: the final answer (``completed`` and ``final_unverified``).
        partial_answer: the last non-final text of a stopped run, or None. It is *not* a
            completed answer; ``status`` says so.
        message: the stop's safe one-line message.
        retryable: see :class:`Stop`.
        observed_stops: ``observe`` mode: the stops the guard would have made, first
            first (at most 32).
        policy_name / policy_version: the policy the run used.
    """

    run_id: str
    status: Literal["completed", "stopped"]
    stop: Stop
    usage: Usage
    answer: Any = None
    partial_answer: str | None = None
    message: str = ""
    retryable: bool = False
    observed_stops: tuple[Stop, ...] = ()
    policy_name: str = ""
    policy_version: str = ""

    @property
    def reason(self) -> StopReason:
        """Shortcut for ``outcome.stop.reason``."""
        return self.stop.reason


@dataclass(slots=True)
class _Action:
    fingerprint: str
    observation: str
    tool: str
    step: int
    progress: bool = False


class _ToolSettings:
    """Everything the hot path needs about one tool, derived once per guard (the policy
    and the known-tool set are immutable)."""

    __slots__ = (
        "drop",
        "intent_drop",
        "keep",
        "key_field",
        "repeat_limit",
        "risk",
        "suffix",
        "timeout",
        "tp",
        "unknown",
        "write",
    )

    def __init__(self, policy: Policy, tool: str, known_tools: frozenset[str] | None) -> None:
        tp = policy.tool(tool)
        keep = fields_lower(tp.progress)
        volatile = DEFAULT_VOLATILE_FIELDS | fields_lower(tp.volatile)
        intent_volatile = (
            volatile | {tp.idempotency_key.lower()} if tp.idempotency_key else volatile
        )
        self.tp = tp
        self.keep = keep
        self.drop = volatile - keep if keep else volatile
        self.intent_drop = intent_volatile - keep if keep else intent_volatile
        self.suffix = tool_suffix(tool)
        self.key_field = tp.idempotency_key.lower() if tp.idempotency_key else None
        self.risk = tp.risk
        self.write = tp.risk == "write"
        self.repeat_limit = policy.repeat_limit_for(tp)
        self.timeout = policy.timeout_for(tp)
        self.unknown = (known_tools is not None and tool not in known_tools) or (
            known_tools is None and policy.strict_tools and tool not in policy.tools
        )


_TOOL_CACHE_ENTRIES: Final = 256


class _LRU:
    """A bounded mapping: inserting past ``capacity`` evicts the oldest key.

    ``on_evict`` (optional) is called with each evicted key.
    """

    __slots__ = ("_capacity", "_data", "_on_evict")

    def __init__(self, capacity: int, on_evict: Callable[[Any], None] | None = None) -> None:
        self._capacity = capacity
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._on_evict = on_evict

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __contains__(self, key: Any) -> bool:
        return key in self._data

    def pop(self, key: Any) -> None:
        self._data.pop(key, None)

    def set(self, key: Any, value: Any) -> None:
        data = self._data
        data[key] = value
        data.move_to_end(key)
        while len(data) > self._capacity:
            old, _ = data.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old)

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._data.items())

    def __len__(self) -> int:
        return len(self._data)


class Guard:
    """Stop logic of one run. See the module docstring for the rules.

    Args:
        policy: the run's :class:`Policy`.
        clock: monotonic clock in seconds (inject a fake one in tests). A reading
            below the last one (``time.time`` stepped back by NTP) or NaN counts as the
            last reading: time never runs backwards for the budget, and a broken clock
            cannot give a run extra time or switch its deadline off.
        mode: ``enforce`` or ``observe``.
        goal_check: ``answer -> bool``; a final answer that fails it stops as
            ``final_unverified`` (an exception in the check counts as a failure).
        run_id: the run id (a random UUID4 hex when omitted).
        known_tools: the tool names the agent registered; others are unknown tools. When
            None, ``policy.strict_tools`` decides (the tools the policy lists).
        scrub: redaction applied to results before digesting (see
            :func:`~.fingerprint.observation_digest`).
        parent: the parent run's guard (use :meth:`child`).

    Raises:
        ValueError: an unknown mode.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        clock: Callable[[], float] = time.monotonic,
        mode: Mode = "enforce",
        goal_check: Callable[[Any], bool] | None = None,
        run_id: str | None = None,
        known_tools: Collection[str] | None = None,
        scrub: Callable[[Any], Any] | None = None,
        parent: Guard | None = None,
    ) -> None:
        if mode not in ("enforce", "observe"):
            raise ValueError(f"mode must be 'enforce' or 'observe', got {mode!r}")
        self.policy = policy
        self.mode: Mode = mode
        self.run_id = run_id or uuid.uuid4().hex
        self.parent = parent
        self._goal_check = goal_check
        self._known_tools = frozenset(known_tools) if known_tools is not None else None
        self._scrub = scrub
        # One lock per run tree: a child's check and its charge to every ancestor happen
        # atomically, so siblings cannot both take the parent's last slot.
        self._lock: threading.RLock = parent._lock if parent is not None else threading.RLock()
        self._start_clock(clock)
        self._elapsed_offset = 0.0
        window = policy.detector_window
        self._window = window
        self._cycle_reps = policy.cycle_repetitions
        self._cycle_periods = range(2, policy.cycle_max_period + 1)
        self._turns = 0
        self._attempts = 0
        self._successes = 0
        # Dispatched calls whose result is not recorded yet (this run's and its
        # children's): each holds a tool-success slot, so parallel calls cannot all
        # succeed past max_tool_successes. Not serialized: a ticket does not survive resume.
        self._in_flight = 0
        self._errors = 0
        self._blocked = 0
        self._retries_total = 0
        self._input_tokens = 0
        self._output_tokens = 0
        self._cost = 0.0
        self._step = 0
        self._step_open = False
        self._step_progress = False
        self._steps_since_progress = 0
        self._stop: Stop | None = None
        self._observed: list[Stop] = []
        self._answer: Any = None
        self._has_answer = False
        self._partial: str | None = None
        self._provided: set[str] = set()
        # The look-back of the cycle and repeated-decision detectors is at least what
        # their limits need (up to MAX_LOOKBACK): a limit past the window once switched
        # its detector off without a word (a review, 2026-12-01: repeated_decision_limit
        # 10 with a window of 8 let 50 identical messages through).
        cycle_span = policy.cycle_max_period * policy.cycle_repetitions
        self._actions: deque[_Action] = deque(maxlen=_lookback(window, cycle_span))
        self._streak: _Action | None = None
        # Steps of the current run of identical actions (same fingerprint, same
        # observation): since the last progress, and in all (progress does not end it).
        # Identical actions in a row: counted without bound (a repeat limit may exceed the
        # window), their steps kept for evidence within the window.
        self._streak_steps: deque[int] = deque(maxlen=window)
        self._streak_all: deque[int] = deque(maxlen=window)
        self._streak_count = 0  # since the last progress
        self._streak_all_count = 0  # whatever progress came in between
        self._last_failure = _LRU(window)
        self._retries = _LRU(window)
        self._writes = _LRU(window)
        self._seen = _LRU(window * 4)
        # How many (tool, field) slots of each pair _progress_values holds, so "was this
        # field seen before" is one lookup instead of a scan of the window.
        self._progress_fields: Counter[tuple[Any, ...]] = Counter()
        self._progress_values = _LRU(window, self._forget_progress_value)
        self._decisions: deque[tuple[str, int]] = deque(
            maxlen=_lookback(window, policy.repeated_decision_limit)
        )
        self._decision_counts: Counter[str] = Counter()
        self._call_ids = itertools.count(1)
        self._tool_cache: dict[str, _ToolSettings] = {}

    # ------------------------------------------------------------------ state

    @property
    def stopped(self) -> bool:
        """True once the run has ended (enforce mode) or reached a natural end."""
        return self._stop is not None

    @property
    def stop_reason(self) -> StopReason | None:
        """The stop reason, once stopped."""
        return self._stop.reason if self._stop is not None else None

    @property
    def step(self) -> int:
        """The current step (1-based; 0 before the first)."""
        return self._step

    @property
    def steps_since_progress(self) -> int:
        """Steps since the last progress evidence (the current step included once ended)."""
        return self._steps_since_progress

    def elapsed(self) -> float:
        """Seconds since the run started on the guard's clock (resume included)."""
        return self._elapsed_offset + (self._reading() - self._started)

    def _start_clock(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        first = clock()
        self._started = first if math.isfinite(first) else 0.0
        self._last_reading = self._started

    def _reading(self) -> float:
        """The clock, never below its last reading (a reading that is lower, or NaN or
        infinite, is the last one again): a clock stepped back gave the run a negative
        elapsed time, extra budget; a NaN one made every deadline check false and every
        tool timeout 0 (a review, 2026-12-02)."""
        reading = self._clock()
        last = self._last_reading
        if reading > last and math.isfinite(reading):
            self._last_reading = reading
            return reading
        return last

    def remaining_seconds(self) -> float:
        """Seconds left before the deadline (this run's and every ancestor's)."""
        return self._remaining(self.elapsed())

    def _remaining(self, elapsed: float) -> float:
        left = self.policy.max_elapsed_seconds - elapsed
        if self.parent is not None:
            left = min(left, self.parent.remaining_seconds())
        return max(left, 0.0)

    def usage(self) -> Usage:
        """A snapshot of the counters."""
        with self._lock:
            return Usage(
                model_turns=self._turns,
                tool_attempts=self._attempts,
                tool_successes=self._successes,
                tool_errors=self._errors,
                tool_blocked=self._blocked,
                retries=self._retries_total,
                input_tokens=self._input_tokens,
                output_tokens=self._output_tokens,
                tokens=self._input_tokens + self._output_tokens,
                cost_usd=_dollars(self._cost),
                elapsed_seconds=self.elapsed(),
                steps=self._step,
                steps_since_progress=self._steps_since_progress,
            )

    # ------------------------------------------------------------------ stops

    def _make_stop(
        self,
        reason: StopReason,
        *,
        dimension: Dimension | None = None,
        limit: float | None = None,
        observed: float | None = None,
        basis: Basis | None = None,
        evidence: Evidence | None = None,
    ) -> Stop:
        template = _MESSAGES[reason]
        message = template.format(
            dimension=dimension.value if dimension else "",
            limit=_fmt(limit),
            observed=_fmt(observed),
        )
        return Stop(
            reason=reason,
            step=self._step,
            dimension=dimension,
            limit=limit,
            observed=observed,
            basis=basis,
            evidence=evidence or Evidence(),
            message=message,
            retryable=reason in _RETRYABLE,
        )

    def _decide(self, stop: Stop) -> Verdict:
        """End the run with ``stop`` (enforce) or record it (observe)."""
        if self.mode == "observe" and stop.reason not in _TERMINAL_EVEN_IN_OBSERVE:
            if len(self._observed) < _MAX_OBSERVED_STOPS:
                self._observed.append(stop)
            return Verdict(True, would_stop=stop)
        if self._stop is None:
            self._stop = stop
        return Verdict(False, stop=self._stop)

    def _closed(self) -> Verdict | None:
        if self._stop is not None:
            return Verdict(False, stop=self._stop)
        return None

    def _check_deadline(self, elapsed: float | None = None) -> Stop | None:
        """The deadline stop, if due; ``elapsed`` is this call's one clock reading."""
        if elapsed is None:
            elapsed = self.elapsed()
        if elapsed >= self.policy.max_elapsed_seconds:
            return self._make_stop(
                StopReason.DEADLINE_EXCEEDED,
                dimension=Dimension.ELAPSED_SECONDS,
                limit=self.policy.max_elapsed_seconds,
                observed=elapsed,
                basis="observed",
                evidence=Evidence(detector="deadline"),
            )
        if self.parent is not None and self.parent.remaining_seconds() <= 0:
            return self._make_stop(
                StopReason.DEADLINE_EXCEEDED,
                dimension=Dimension.ELAPSED_SECONDS,
                limit=self.parent.policy.max_elapsed_seconds,
                observed=self.parent.elapsed(),
                basis="observed",
                evidence=Evidence(detector="deadline", scope="parent"),
            )
        return None

    def _ceiling(
        self, dimension: Dimension, limit: float, would_be: float, tool: str | None = None
    ) -> Stop:
        return self._make_stop(
            StopReason.BUDGET_EXHAUSTED,
            dimension=dimension,
            limit=limit,
            observed=would_be,
            basis="projected",
            evidence=Evidence(detector="ceiling", tool=tool),
        )

    # --------------------------------------------------------------- parents

    def _parent_block(self, needs: Mapping[Dimension, float]) -> Stop | None:
        """A stop if some ancestor cannot afford ``needs`` (checked, not reserved)."""
        node = self.parent
        while node is not None:
            with node._lock:
                if node._stop is not None:
                    return self._make_stop(
                        StopReason.CANCELLED,
                        evidence=Evidence(
                            detector="parent_stopped",
                            scope="parent",
                            detail={"parent_stop_reason": node._stop.reason.value},
                        ),
                    )
                for dim, amount in needs.items():
                    used, limit = node._used_and_limit(dim)
                    # Amount 0 means "unknown size": there must be some capacity left.
                    if used + amount > limit or (amount == 0 and used >= limit):
                        stop = self._make_stop(
                            StopReason.BUDGET_EXHAUSTED,
                            dimension=dim,
                            limit=limit,
                            observed=used + amount,
                            basis="projected",
                            evidence=Evidence(detector="ceiling", scope="parent"),
                        )
                        return stop
            node = node.parent
        return None

    def _ancestor_stopped(self) -> bool:
        """An ancestor run has stopped: this run's use can no longer be charged to it (a
        late result or decision in a child would change a stopped run's counters)."""
        node = self.parent
        while node is not None:
            if node._stop is not None:
                return True
            node = node.parent
        return False

    def _success_slots_held(self) -> bool:
        """Every tool-success slot left (here or in an ancestor) is held by a call in
        flight: this call must wait, though the run has not used its budget yet."""
        node: Guard | None = self
        while node is not None:
            if node._successes + node._in_flight >= node.policy.max_tool_successes:
                return True
            node = node.parent
        return False

    def _used_and_limit(self, dim: Dimension) -> tuple[float, float]:
        p = self.policy
        if dim is Dimension.MODEL_TURNS:
            return self._turns, p.max_model_turns
        if dim is Dimension.TOOL_ATTEMPTS:
            return self._attempts, p.max_tool_attempts
        if dim is Dimension.TOOL_SUCCESSES:
            return self._successes, p.max_tool_successes
        if dim is Dimension.TOKENS:
            return self._input_tokens + self._output_tokens, p.max_tokens
        if dim is Dimension.COST:
            return _dollars(self._cost), p.max_cost_usd
        raise ValueError(f"not a shared budget: {dim}")

    def _charge_parents(self, **amounts: float) -> None:
        node = self.parent
        while node is not None:
            with node._lock:
                node._turns += int(amounts.get("turns", 0))
                node._attempts += int(amounts.get("attempts", 0))
                node._successes += int(amounts.get("successes", 0))
                node._input_tokens += int(amounts.get("input_tokens", 0))
                node._output_tokens += int(amounts.get("output_tokens", 0))
                node._cost += float(amounts.get("cost", 0.0))
                node._in_flight += int(amounts.get("in_flight", 0))
            node = node.parent

    def child(
        self,
        policy: Policy | None = None,
        *,
        run_id: str | None = None,
        mode: Mode | None = None,
        goal_check: Callable[[Any], bool] | None = None,
        known_tools: Collection[str] | None = None,
        _already_used: Mapping[str, float] | None = None,
        _after_stop: bool = False,
    ) -> Guard:
        """A child run's guard that draws from this run's remaining budget.

        Each budget of the child is capped at what this run has left when the child is
        created (the cap records source ``parent``), and every use in the child is also
        charged here, so children can never create capacity (10 children of 10 turns do
        not make 100 turns). The child's deadline is capped by this run's.

        Raises:
            RunStateError: this run has stopped.
        """
        from .errors import RunStateError

        with self._lock:
            if self._stop is not None and not _after_stop:
                raise RunStateError("cannot start a child run: the parent run has stopped")
            base = policy or self.policy
            caps: dict[str, Any] = {}
            remaining = {
                "max_model_turns": self.policy.max_model_turns - self._turns,
                "max_tool_attempts": self.policy.max_tool_attempts - self._attempts,
                "max_tool_successes": self.policy.max_tool_successes - self._successes,
                "max_tokens": self.policy.max_tokens - self._input_tokens - self._output_tokens,
                "max_cost_usd": _dollars(self.policy.max_cost_usd - self._cost),
            }
            used = _already_used or {}
            for name, left in remaining.items():
                allowed = max(left, 0) + used.get(name, 0)
                if getattr(base, name) > allowed:
                    caps[name] = type(getattr(base, name))(allowed)
            seconds_left = self.remaining_seconds()
            if base.max_elapsed_seconds > seconds_left > 0:
                caps["max_elapsed_seconds"] = seconds_left
            child_policy = base.with_overrides("parent", **caps) if caps else base
            child = Guard(
                child_policy,
                clock=self._clock,
                mode=mode or self.mode,
                goal_check=goal_check,
                run_id=run_id,
                known_tools=known_tools if known_tools is not None else self._known_tools,
                scrub=self._scrub,
                parent=self,
            )
            if self._stop is not None:
                # A sub-agent asked for after the stop (``_after_stop``): it is recorded,
                # and ended before it makes any call.
                child._stop = child._parent_block({})
            return child

    # ----------------------------------------------------------- model calls

    def before_model_call(
        self, *, estimate_tokens: int | None = None, estimate_cost_usd: float | None = None
    ) -> Verdict:
        """Check and reserve one model turn; begins a new step.

        Ends the previous step first (ceilings, then no progress). With an estimate, the
        token and cost budgets are checked on the projected totals.

        Args:
            estimate_tokens: expected input + output tokens of this call.
            estimate_cost_usd: expected cost of this call in US dollars.

        Returns:
            ``Verdict(allowed=True)`` when the call may be made; otherwise the stop.
        """
        with self._lock:
            if self._stop is not None:
                return Verdict(False, stop=self._stop)
            # One clock reading per call: ending the previous step and this check see the
            # same time.
            elapsed = self._elapsed_offset + (self._reading() - self._started)
            observed: Stop | None = None
            if self._step_open:
                ended = self._end_step(elapsed)
                if not ended.allowed:
                    return ended
                observed = ended.would_stop
            p = self.policy
            stop = (
                None
                if self.parent is None and elapsed < p.max_elapsed_seconds
                else self._check_deadline(elapsed)
            )
            tokens = self._input_tokens + self._output_tokens
            if stop is None and self._turns >= p.max_model_turns:
                stop = self._ceiling(Dimension.MODEL_TURNS, p.max_model_turns, self._turns + 1)
            if stop is None:
                projected = tokens + (estimate_tokens or 0)
                if (
                    estimate_tokens is not None and projected > p.max_tokens
                ) or tokens >= p.max_tokens:
                    stop = self._ceiling(Dimension.TOKENS, p.max_tokens, max(projected, tokens))
            # Rounded only near the budget (a round() per call is not free).
            if stop is None and (
                estimate_cost_usd is not None or self._cost > p.max_cost_usd - _NEAR
            ):
                cost = _dollars(self._cost)
                projected_cost = _dollars(self._cost + (estimate_cost_usd or 0.0))
                if (
                    estimate_cost_usd is not None and projected_cost > p.max_cost_usd
                ) or cost >= p.max_cost_usd:
                    stop = self._ceiling(Dimension.COST, p.max_cost_usd, max(projected_cost, cost))
            if stop is None and self.parent is not None:
                needs: dict[Dimension, float] = {
                    Dimension.MODEL_TURNS: 1,
                    Dimension.TOKENS: estimate_tokens or 0,
                    Dimension.COST: estimate_cost_usd or 0.0,
                }
                stop = self._parent_block(needs)
            if stop is not None:
                verdict = self._decide(stop)
                if not verdict.allowed:
                    return verdict
                observed = observed or verdict.would_stop
            self._turns += 1
            if self.parent is not None:
                self._charge_parents(turns=1)
            self._step += 1
            self._step_open = True
            self._step_progress = False
            return _ALLOWED if observed is None else Verdict(True, would_stop=observed)

    def record_decision(self, decision: Decision) -> Verdict:
        """Record the model's decision for the current step.

        Order: usage is reconciled; a ``final`` decision runs the goal check and ends
        the run (``completed`` or ``final_unverified``); a ``refusal`` ends it
        (``refused``); a non-tool decision feeds the repeated-decision detector; then the
        token and cost ceilings are checked on the observed totals.

        Returns:
            The run's verdict after the decision (a late decision after the stop is not
            recorded and returns the existing stop).
        """
        with self._lock:
            if self._stop is not None:
                return Verdict(False, stop=self._stop)
            if self.parent is not None and self._ancestor_stopped():
                parent_stop = self._parent_block({})
                if parent_stop is not None:
                    verdict = self._decide(parent_stop)
                    if not verdict.allowed:
                        return verdict
            if not self._step_open:
                self._step += 1
                self._step_open = True
                self._step_progress = False
            input_tokens = _usage_tokens(decision.input_tokens)
            output_tokens = _usage_tokens(decision.output_tokens)
            cost = _usage_cost(decision.cost_usd)
            self._input_tokens += input_tokens
            self._output_tokens += output_tokens
            self._cost += cost
            if self.parent is not None:
                self._charge_parents(
                    input_tokens=input_tokens, output_tokens=output_tokens, cost=cost
                )
            dtype = decision.type
            if dtype.__class__ is not DecisionType:
                dtype = DecisionType(dtype)
            if dtype is DecisionType.FINAL:
                return self._finalize(decision.answer)
            if dtype is DecisionType.REFUSAL:
                self._partial = decision.text
                return self._decide(self._make_stop(StopReason.REFUSED))
            would: Stop | None = None
            if dtype is DecisionType.MESSAGE:
                if decision.text:
                    self._partial = decision.text
                verdict = self._repeated_decision(decision)
                if not verdict.allowed:
                    return verdict
                would = verdict.would_stop
            if self._past_observed_ceiling():
                verdict = self._observed_ceilings()
                if not verdict.allowed:
                    return verdict
                would = would or verdict.would_stop
            return _ALLOWED if would is None else Verdict(True, would_stop=would)

    def provided(self, *fields: str) -> None:
        """Note fields the user or environment has provided (shown in re-ask evidence)."""
        with self._lock:
            self._provided.update(f.strip().casefold() for f in fields)

    def _repeated_decision(self, decision: Decision) -> Verdict:
        fp = decision.fingerprint()
        if len(self._decisions) == self._decisions.maxlen:
            old, _ = self._decisions[0]
            self._decision_counts[old] -= 1
            if self._decision_counts[old] <= 0:
                del self._decision_counts[old]
        self._decisions.append((fp, self._step))
        self._decision_counts[fp] += 1
        count = self._decision_counts[fp]
        if count < self.policy.repeated_decision_limit:
            return _ALLOWED
        steps = tuple(s for f, s in self._decisions if f == fp)
        detail: dict[str, Any] = {
            "kind": "ask"
            if decision.asks_for
            else ("empty" if not (decision.text or "").strip() else "text")
        }
        if decision.asks_for:
            asked = sorted({f.strip().casefold() for f in decision.asks_for})
            detail["asks_for"] = asked
            already = sorted(set(asked) & self._provided)
            if already:
                detail["already_provided"] = already
        return self._decide(
            self._make_stop(
                StopReason.REPEATED_DECISION,
                limit=self.policy.repeated_decision_limit,
                observed=count,
                evidence=Evidence(
                    detector="repeated_decision",
                    repetitions=count,
                    step_indices=steps,
                    fingerprint_previews=(f"decision#{fp[:12]}",),
                    detail=detail,
                ),
            )
        )

    def _past_observed_ceiling(self) -> bool:
        """Whether tokens or cost crossed their ceiling, or a parent's may have: the
        cheap test in front of :meth:`_observed_ceilings` on the per-step path."""
        p = self.policy
        return (
            self.parent is not None
            or self._input_tokens + self._output_tokens > p.max_tokens
            or (self._cost > p.max_cost_usd - _NEAR and _dollars(self._cost) > p.max_cost_usd)
        )

    def _observed_ceilings(self) -> Verdict:
        p = self.policy
        tokens = self._input_tokens + self._output_tokens
        stop: Stop | None = None
        if tokens > p.max_tokens:
            stop = self._make_stop(
                StopReason.BUDGET_EXHAUSTED,
                dimension=Dimension.TOKENS,
                limit=p.max_tokens,
                observed=tokens,
                basis="observed",
                evidence=Evidence(detector="ceiling"),
            )
        elif _dollars(self._cost) > p.max_cost_usd:
            stop = self._make_stop(
                StopReason.BUDGET_EXHAUSTED,
                dimension=Dimension.COST,
                limit=p.max_cost_usd,
                observed=_dollars(self._cost),
                basis="observed",
                evidence=Evidence(detector="ceiling"),
            )
        node = self.parent
        while stop is None and node is not None:
            for dim in (Dimension.TOKENS, Dimension.COST):
                used, limit = node._used_and_limit(dim)
                if used > limit:
                    stop = self._make_stop(
                        StopReason.BUDGET_EXHAUSTED,
                        dimension=dim,
                        limit=limit,
                        observed=round(used, 6),
                        basis="observed",
                        evidence=Evidence(detector="ceiling", scope="parent"),
                    )
                    break
            node = node.parent
        return self._decide(stop) if stop is not None else _ALLOWED

    def _finalize(self, answer: Any) -> Verdict:
        self._answer = answer
        self._has_answer = True
        ok = True
        detail: dict[str, Any] = {}
        if self._goal_check is not None:
            try:
                ok = bool(self._goal_check(answer))
            except Exception as exc:  # a failing check is a failed check, not a crash
                ok = False
                detail["goal_check_error"] = type(exc).__name__
        if ok:
            return self._decide(
                self._make_stop(
                    StopReason.COMPLETED,
                    evidence=Evidence(detector="goal_check") if self._goal_check else None,
                )
            )
        return self._decide(
            self._make_stop(
                StopReason.FINAL_UNVERIFIED, evidence=Evidence(detector="goal_check", detail=detail)
            )
        )

    # ------------------------------------------------------------ tool calls

    def before_tool_call(
        self, tool: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None
    ) -> ToolTicket:
        """Check and reserve one tool dispatch.

        Args:
            tool: tool name.
            arguments: the call's arguments.
            call_id: the model's tool-call id (one is generated when omitted).

        Returns:
            A :class:`ToolTicket`; dispatch only when ``ticket.allowed``. An allowed ticket
            holds a tool-success slot until :meth:`record_tool_result` is called with it
            (result or error), so always record it. In ``enforce`` mode, a call that would
            need a slot held by a call in flight is refused without ending the run
            (``blocked_by="ceiling"``, no ``stop``); try it again once calls return. A
            refused call
            that ends the run carries ``ticket.stop``; an unknown tool is refused with
            ``blocked_by="unknown_tool"`` without ending the run (its result is an
            ``unknown_tool`` error the model can see; retrying it as-is ends the run).
        """
        args: Mapping[str, Any] = arguments if arguments is not None else {}
        with self._lock:
            ts = self._tool_cache.get(tool) or self._tool_settings(tool)
            fp = fingerprint_with(ts.suffix, args, ts.drop)
            key_field = ts.key_field
            idem_value = None
            intent = fp
            if key_field is not None:
                for k, v in args.items():
                    # No == on the value: a hostile __eq__ (or an array) must not raise.
                    if key_text(k).lower() == key_field and not _blank(v):
                        idem_value = canonical_json(canonicalize(v))
            if ts.write:
                # Duplicate intent ignores the key and cosmetic case/space changes: a side
                # effect must not run twice because the model re-typed the recipient.
                intent = fingerprint_with(ts.suffix, args, ts.intent_drop, loose=True)
            # The loose retry key only matters once some action has failed (for a write it
            # is the intent fingerprint: same drop set, same loose form).
            retry_key = ""
            if self._last_failure._data:
                retry_key = (
                    intent
                    if ts.write
                    else fingerprint_with(ts.suffix, args, ts.intent_drop, loose=True)
                )
            ticket = ToolTicket(
                False,
                tool,
                call_id or f"call_{next(self._call_ids)}",
                self._step if self._step > 1 else 1,
                ts.risk,
                fp,
                intent,
                retry_key,
                False,
                idem_value,
                None,
                None,
                0.0,
                None,
                False,
                args,
                self,
            )
            if self._stop is not None:
                ticket.stop = self._stop
                ticket.blocked_by = "run_stopped"
                return ticket
            if not self._step_open and self._step == 0:
                # A tool called before the first model call (retrieval first) is step 1.
                self._step = 1
                self._step_open = True
                self._step_progress = False
                ticket.step = 1
            if ts.unknown:
                ticket.done = True
                if self._last_failure.get(retry_key) is FailureClass.UNKNOWN_TOOL:
                    verdict = self._decide(
                        self._retry_stop(ticket, FailureClass.UNKNOWN_TOOL, 0, 0)
                    )
                    if not verdict.allowed:
                        self._blocked += 1
                        ticket.stop = verdict.stop
                        ticket.blocked_by = "retry_rule"
                        return ticket
                ticket.blocked_by = "unknown_tool"
                self._errors += 1
                self._remember_failure(ticket, FailureClass.UNKNOWN_TOOL)
                return ticket
            elapsed = self._elapsed_offset + (self._reading() - self._started)
            stop, blocked_by, is_retry = self._pre_dispatch(ticket, ts, elapsed)
            if stop is None and blocked_by is not None:
                # Refused, the run goes on: the slots come back as the calls in flight
                # return (a failure frees its slot; a success uses it, and the next call
                # then meets the ceiling itself).
                self._blocked += 1
                ticket.blocked_by = blocked_by
                ticket.done = True
                return ticket
            if stop is not None:
                verdict = self._decide(stop)
                if not verdict.allowed:
                    self._blocked += 1
                    ticket.stop = verdict.stop
                    ticket.blocked_by = blocked_by
                    ticket.done = True
                    return ticket
                ticket.would_stop = verdict.would_stop
            ticket.allowed = True
            ticket.is_retry = is_retry
            self._attempts += 1
            self._in_flight += 1
            if self.parent is not None:
                self._charge_parents(attempts=1, in_flight=1)
            if is_retry:
                self._retries.set(retry_key, self._retries.get(retry_key, 0) + 1)
                self._retries_total += 1
            if self.parent is None:
                left = self.policy.max_elapsed_seconds - elapsed
                ticket.timeout_seconds = min(ts.timeout, left if left > 0.0 else 0.0)
            else:
                ticket.timeout_seconds = min(ts.timeout, self._remaining(elapsed))
            return ticket

    def _pre_dispatch(
        self, ticket: ToolTicket, ts: _ToolSettings, elapsed: float
    ) -> tuple[Stop | None, str | None, bool]:
        p = self.policy
        stop = (
            None
            if self.parent is None and elapsed < p.max_elapsed_seconds
            else self._check_deadline(elapsed)
        )
        if stop is not None:
            return stop, "deadline", False
        if self._attempts >= p.max_tool_attempts:
            return (
                self._ceiling(
                    Dimension.TOOL_ATTEMPTS, p.max_tool_attempts, self._attempts + 1, ticket.tool
                ),
                "ceiling",
                False,
            )
        if self._successes >= p.max_tool_successes:
            return (
                self._ceiling(
                    Dimension.TOOL_SUCCESSES, p.max_tool_successes, self._successes + 1, ticket.tool
                ),
                "ceiling",
                False,
            )
        if self.parent is not None:
            stop = self._parent_block({Dimension.TOOL_ATTEMPTS: 1, Dimension.TOOL_SUCCESSES: 1})
        if stop is not None:
            return stop, "parent", False
        if (
            (self._in_flight or self.parent is not None)
            and self.mode == "enforce"
            and self._success_slots_held()
        ):
            return None, "ceiling", False
        failure: FailureClass | None = (
            self._last_failure.get(ticket.retry_key) if ticket.retry_key else None
        )
        if failure is not None:
            allowance = retry_allowance(
                failure,
                write=ts.write,
                has_idempotency_key=ticket.idempotency_key is not None,
                max_retries=p.max_retries_per_action,
            )
            used = self._retries.get(ticket.retry_key, 0)
            if used >= allowance:
                return self._retry_stop(ticket, failure, allowance, used), "retry_rule", False
            return None, None, True
        stop = self._repeat(ticket, ts)
        if stop is not None:
            return stop, stop.evidence.detector, False
        return None, None, False

    def _retry_stop(
        self, ticket: ToolTicket, failure: FailureClass, allowance: int, used: int
    ) -> Stop:
        return self._make_stop(
            StopReason.BUDGET_EXHAUSTED,
            dimension=Dimension.ACTION_RETRIES,
            limit=allowance,
            observed=used + 1,
            basis="projected",
            evidence=Evidence(
                detector="retry_rule",
                tool=ticket.tool,
                failure_class=failure.value,
                step_indices=(ticket.step,),
                fingerprint_previews=(preview(ticket.tool, ticket.fingerprint),),
            ),
        )

    def _repeat(self, ticket: ToolTicket, ts: _ToolSettings) -> Stop | None:
        limit = ts.repeat_limit
        streak = self._streak
        if ts.write:
            prior: list[tuple[str | None, int]] = self._writes.get(ticket.intent) or []
            replay = ticket.idempotency_key is not None and any(
                k == ticket.idempotency_key for k, _ in prior
            )
            duplicates = [(k, s) for k, s in prior if k is None or k != ticket.idempotency_key]
            if not replay and len(duplicates) + 1 >= limit and duplicates:
                steps = (*(s for _, s in duplicates), ticket.step)
                return self._make_stop(
                    StopReason.REPEATED_ACTION,
                    limit=limit,
                    observed=len(duplicates) + 1,
                    evidence=Evidence(
                        detector="duplicate_intent",
                        tool=ticket.tool,
                        repetitions=len(duplicates) + 1,
                        step_indices=steps[-self._window :],
                        fingerprint_previews=(preview(ticket.tool, ticket.intent),),
                        detail={
                            "risk": "write",
                            "idempotency_key_changed": ticket.idempotency_key is not None,
                        },
                    ),
                )
        if ts.write and ticket.idempotency_key is not None:
            # An idempotent replay acts once whatever the count; only a runaway of
            # replays is a loop, judged by the profile's (read) repeat limit.
            limit = max(limit, self.policy.repeat_limit, 2)
        if streak is not None and streak.fingerprint == ticket.fingerprint:
            # The N-th in a row since the last progress, or the (cap x N)-th in a row
            # whatever progress came in between (an environment that reports something
            # new every turn must not switch the detector off).
            since = self._streak_count
            cap = limit * REPEAT_ACROSS_PROGRESS_FACTOR
            across = since + 1 < limit and self._streak_all_count + 1 >= cap
            if since + 1 >= limit or across:
                repeats = self._streak_all if across else self._streak_steps
                count = (self._streak_all_count if across else since) + 1
                detail: dict[str, Any] = {"observation": streak.observation[:12]}
                if across:
                    detail["across_progress"] = True
                return self._make_stop(
                    StopReason.REPEATED_ACTION,
                    limit=cap if across else limit,
                    observed=count,
                    evidence=Evidence(
                        detector="repeated_action",
                        tool=ticket.tool,
                        repetitions=count,
                        step_indices=(*repeats, ticket.step),
                        fingerprint_previews=(preview(ticket.tool, ticket.fingerprint),),
                        detail=detail,
                    ),
                )
        return None

    def _cycle(self, ticket: ToolTicket) -> Stop | None:
        """A cycle of period 2..k completed by the action just recorded.

        Checked once the newest result is known: every member's observation must equal
        its counterpart one period earlier. (Checked before dispatch, the last member's
        result would be unknown, and polling where that member advances, such as reading
        new log lines between status checks, would be stopped wrongly.)
        """
        reps = self._cycle_reps
        actions = self._actions
        n = len(actions)
        if n < 2 * reps:
            return None
        last = actions[n - 1]
        newest, newest_obs = last.fingerprint, last.observation
        # Cost: O(1) per period that cannot match (polling with new results), and the
        # history copied once, not per period (it was quadratic in the period: 85 ms per
        # step at cycle_max_period 2048, found by a review, 2026-12-01).
        history: list[_Action] | None = None
        same_tail = 0  # trailing actions identical to the newest one
        for period in self._cycle_periods:
            length = period * reps
            if n < length:
                break
            before = actions[n - 1 - period]
            if before.fingerprint != newest or before.observation != newest_obs:
                continue
            if history is None:
                history = list(actions)
                while same_tail < n and history[n - 1 - same_tail].fingerprint == newest:
                    same_tail += 1
            if same_tail >= period:
                continue  # the last period is one action repeated: not a cycle of it
            seq = history[n - length :]
            if len({a.fingerprint for a in seq[:period]}) < 2:
                continue
            if any(
                seq[i].fingerprint != seq[i - period].fingerprint
                or seq[i].observation != seq[i - period].observation
                for i in range(period, length)
            ):
                continue
            tools = [a.tool for a in seq[:period]]
            previews = tuple(preview(a.tool, a.fingerprint) for a in seq[:period])
            return self._make_stop(
                StopReason.ACTION_CYCLE,
                limit=reps,
                observed=reps,
                evidence=Evidence(
                    detector="action_cycle",
                    tool=ticket.tool,
                    matched_period=period,
                    repetitions=reps,
                    step_indices=tuple(a.step for a in seq),
                    fingerprint_previews=previews,
                    detail={"tools": tools},
                ),
            )
        return None

    def _tool_settings(self, tool: str) -> _ToolSettings:
        cached = self._tool_cache.get(tool)
        if cached is None:
            cached = _ToolSettings(self.policy, tool, self._known_tools)
            if len(self._tool_cache) >= _TOOL_CACHE_ENTRIES:
                # Bounded: a model inventing tool names must not grow the guard.
                self._tool_cache.clear()
            self._tool_cache[tool] = cached
        return cached

    def _retry_key(self, tool: str, args: Mapping[str, Any]) -> str:
        ts = self._tool_settings(tool)
        return fingerprint_with(ts.suffix, args, ts.intent_drop, loose=True)

    def _remember_failure(self, ticket: ToolTicket, failure: FailureClass | None) -> None:
        if failure is None:
            if ticket.retry_key:
                # A success ends the failure episode: later isolated errors start afresh.
                self._last_failure.pop(ticket.retry_key)
                self._retries.pop(ticket.retry_key)
            return
        if not ticket.retry_key:
            ticket.retry_key = self._retry_key(ticket.tool, ticket.arguments or {})
        self._last_failure.set(ticket.retry_key, failure)

    def record_tool_result(
        self,
        ticket: ToolTicket,
        *,
        result: Any = None,
        error: BaseException | None = None,
        failure_class: FailureClass | str | None = None,
    ) -> ToolRecord:
        """Record what a dispatched call returned (``result``) or raised (``error``).

        A result that arrives after the run stopped, or for a refused or already used
        ticket, is not recorded (``accepted=False``): a late result cannot append to a
        closed run (nor, in a child run, to a stopped ancestor's counters).

        Args:
            ticket: from :meth:`before_tool_call`.
            result: the tool's return value.
            error: the exception the tool raised (or a timeout).
            failure_class: override the classification of ``error``.

        Returns:
            A :class:`ToolRecord`.

        Raises:
            ValueError: the ticket was issued by another guard (a parent's or a child's):
                recorded here, it freed a slot this run never held and left the issuing
                run holding one for good.
        """
        if ticket.guard is not self:
            raise ValueError("the ticket was issued by another guard: record it there")
        with self._lock:
            if ticket.allowed and not ticket.done:
                self._in_flight -= 1
                if self.parent is not None:
                    self._charge_parents(in_flight=-1)
            if (
                ticket.done
                or not ticket.allowed
                or self._stop is not None
                or (self.parent is not None and self._ancestor_stopped())
            ):
                ticket.done = True
                return ToolRecord(accepted=False, steps_since_progress=self._steps_since_progress)
            ticket.done = True
            ts = self._tool_cache.get(ticket.tool) or self._tool_settings(ticket.tool)
            progress = False
            fc: FailureClass | None = None
            error_type: str | None = None
            if error is not None:
                fc = (
                    FailureClass(failure_class)
                    if failure_class is not None
                    else classify_exception(error)
                )
                error_type = type(error).__name__
                obs = digest(
                    canonical_json(
                        {
                            "error": fc.value,
                            "type": error_type,
                            "message": str(error)[:_ERROR_MESSAGE_CHARS],
                        }
                    )
                )
                self._errors += 1
            else:
                obs = observation_digest_with(result, ts.drop, self._scrub)
                self._successes += 1
                if self.parent is not None:
                    self._charge_parents(successes=1)
                if obs not in self._seen:
                    progress = True
                if ts.keep and self._progress_changed(ticket, result, ts.keep):
                    progress = True
                if ts.write:
                    prior = list(self._writes.get(ticket.intent) or [])
                    if ticket.idempotency_key is None or all(
                        k != ticket.idempotency_key for k, _ in prior
                    ):
                        prior.append((ticket.idempotency_key, ticket.step))
                    self._writes.set(ticket.intent, prior[-self._window :])
            self._seen.set(obs, None)
            if fc is not None or ticket.retry_key:
                self._remember_failure(ticket, fc)
            action = _Action(ticket.fingerprint, obs, ticket.tool, ticket.step, progress)
            self._actions.append(action)
            streak = self._streak
            if (
                streak is not None
                and streak.fingerprint == action.fingerprint
                and streak.observation == obs
            ):
                self._streak_steps.append(ticket.step)
                self._streak_all.append(ticket.step)
                self._streak_count += 1
                self._streak_all_count += 1
            else:
                self._streak = action
                self._streak_steps.clear()
                self._streak_steps.append(ticket.step)
                self._streak_all.clear()
                self._streak_all.append(ticket.step)
                self._streak_count = self._streak_all_count = 1
            if progress:
                self._step_progress = True
                self._steps_since_progress = 0
            verdict = _ALLOWED
            cycle = self._cycle(ticket)
            if cycle is not None:
                verdict = self._decide(cycle)
            return _new_record(
                True,
                "ok" if error is None else "error",
                obs,
                fc,
                error_type,
                progress,
                self._steps_since_progress,
                verdict,
            )

    def _progress_changed(self, ticket: ToolTicket, result: Any, keep: frozenset[str]) -> bool:
        """A progress field moved to a value not seen before for this tool (a flapping
        cursor that returns to an earlier value is not progress)."""
        if not isinstance(result, Mapping):
            return False
        changed = False
        for k, v in result.items():
            lowered = key_text(k).lower()
            if lowered not in keep:
                continue
            slot = (ticket.tool, lowered, canonical_json(canonicalize(v)))
            if slot not in self._progress_values:
                pair = slot[:2]
                changed = changed or self._progress_fields[pair] > 0
                self._progress_fields[pair] += 1
                self._progress_values.set(slot, None)
        return changed

    def _forget_progress_value(self, slot: tuple[Any, ...]) -> None:
        pair = slot[:2]
        left = self._progress_fields[pair] - 1
        if left > 0:
            self._progress_fields[pair] = left
        else:
            del self._progress_fields[pair]

    def progress(self, note: str | None = None) -> None:
        """Record explicit progress evidence from the environment for the current step.

        Use it for evidence the guard cannot see (a file written, a ticket state changed,
        a new user turn). Never call it on the model's say-so. It also starts a new count
        of identical actions: re-reading after something changed is not a repeat, up to
        :data:`REPEAT_ACROSS_PROGRESS_FACTOR` times the repeat limit in a row.
        """
        with self._lock:
            if self._stop is None:
                self._step_progress = True
                self._steps_since_progress = 0
                self._streak_steps.clear()
                self._streak_count = 0

    # ---------------------------------------------------------------- steps

    def end_step(self) -> Verdict:
        """End the current step: ceilings, then no progress. Idempotent per step."""
        with self._lock:
            closed = self._closed()
            if closed is not None:
                return closed
            if not self._step_open:
                return _ALLOWED
            return self._end_step(self.elapsed())

    def _end_step(self, elapsed: float) -> Verdict:
        self._step_open = False
        if not self._step_progress:
            self._steps_since_progress += 1
        p = self.policy
        if self.parent is not None or elapsed >= p.max_elapsed_seconds:
            stop = self._check_deadline(elapsed)
            if stop is not None:
                return self._decide(stop)
        would: Stop | None = None
        if self._past_observed_ceiling():
            verdict = self._observed_ceilings()
            if not verdict.allowed:
                return verdict
            would = verdict.would_stop
        patience = p.no_progress_patience
        if self._steps_since_progress >= patience:
            first = self._step - self._steps_since_progress + 1
            v = self._decide(
                self._make_stop(
                    StopReason.NO_PROGRESS,
                    limit=patience,
                    observed=self._steps_since_progress,
                    evidence=Evidence(
                        detector="no_progress",
                        repetitions=self._steps_since_progress,
                        step_indices=tuple(range(max(first, 1), self._step + 1))[-self._window :],
                        detail={"last_progress_step": max(first - 1, 0)},
                    ),
                )
            )
            if not v.allowed:
                return v
            would = would or v.would_stop
        return _ALLOWED if would is None else Verdict(True, would_stop=would)

    # ------------------------------------------------------------------ end

    def finish(self, answer: Any = None) -> Outcome:
        """End the run (if not already ended) and return its :class:`Outcome`.

        A loop that returns without a recorded ``final`` decision ends with its return
        value as the final answer (goal check applies). Idempotent: later calls return
        the same stop.
        """
        with self._lock:
            if self._stop is None:
                if self._has_answer:
                    answer = self._answer
                self._finalize(answer)
            return self.outcome()

    def cancel(self) -> Outcome:
        """End the run as ``cancelled`` (if not already ended)."""
        with self._lock:
            if self._stop is None:
                self._stop = self._make_stop(StopReason.CANCELLED)
            return self.outcome()

    def fail(self, exc: BaseException) -> Outcome:
        """End the run as ``error``; the exception's type is the evidence (never its text)."""
        with self._lock:
            if self._stop is None:
                self._stop = self._make_stop(
                    StopReason.ERROR,
                    evidence=Evidence(
                        detector="exception", detail={"exception_type": type(exc).__name__}
                    ),
                )
            return self.outcome()

    def outcome(self) -> Outcome:
        """The run's :class:`Outcome`.

        Raises:
            RunStateError: the run has not stopped yet.
        """
        from .errors import RunStateError

        with self._lock:
            if self._stop is None:
                raise RunStateError("the run has not stopped yet")
            stop = self._stop
            completed = stop.reason is StopReason.COMPLETED
            answered = stop.reason in (StopReason.COMPLETED, StopReason.FINAL_UNVERIFIED)
            return Outcome(
                run_id=self.run_id,
                status="completed" if completed else "stopped",
                stop=stop,
                usage=self.usage(),
                answer=self._answer if answered else None,
                partial_answer=None if completed else self._partial,
                message=stop.message,
                retryable=stop.retryable,
                observed_stops=tuple(self._observed),
                policy_name=self.policy.name,
                policy_version=self.policy.version,
            )

    # --------------------------------------------------------------- resume

    def snapshot(self) -> dict[str, Any]:
        """Serialize usage and detector state (JSON-ready) so the run can be resumed.

        Resuming never grants a fresh budget: :meth:`restore` reloads every counter and
        the fingerprint window.
        """
        with self._lock:
            return {
                "format": _SNAPSHOT_FORMAT,
                "run_id": self.run_id,
                "policy": {"name": self.policy.name, "version": self.policy.version},
                "elapsed_seconds": self.elapsed(),
                "counters": {
                    "turns": self._turns,
                    "attempts": self._attempts,
                    "successes": self._successes,
                    "errors": self._errors,
                    "blocked": self._blocked,
                    "retries_total": self._retries_total,
                    "input_tokens": self._input_tokens,
                    "output_tokens": self._output_tokens,
                    "cost": self._cost,
                    "step": self._step,
                    "steps_since_progress": self._steps_since_progress,
                    "step_open": self._step_open,
                    "step_progress": self._step_progress,
                },
                "stop": self._stop.to_dict() if self._stop is not None else None,
                "actions": [
                    [a.fingerprint, a.observation, a.tool, a.step, a.progress]
                    for a in self._actions
                ],
                "streak_steps": list(self._streak_steps),
                "streak_all": list(self._streak_all),
                "streak_count": self._streak_count,
                "streak_all_count": self._streak_all_count,
                "last_failure": [
                    [k, v.value if v else None] for k, v in self._last_failure.items()
                ],
                "retries": [[k, v] for k, v in self._retries.items()],
                "writes": [[k, [list(x) for x in v]] for k, v in self._writes.items()],
                "seen": [k for k, _ in self._seen.items()],
                "progress_values": [[list(k), v] for k, v in self._progress_values.items()],
                "decisions": [list(d) for d in self._decisions],
                "provided": sorted(self._provided),
                "partial": self._partial,
            }

    @classmethod
    def restore(
        cls,
        policy: Policy,
        state: Mapping[str, Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        mode: Mode = "enforce",
        goal_check: Callable[[Any], bool] | None = None,
        known_tools: Collection[str] | None = None,
        scrub: Callable[[Any], Any] | None = None,
        parent: Guard | None = None,
    ) -> Guard:
        """Resume a run from :meth:`snapshot`: usage, elapsed time and detector windows.

        An open step stays open (its no-progress accounting continues), so checkpointing
        after every step cannot defeat the no-progress check. A child run is resumed
        under its parent (``parent=``): its limits are capped again by what the parent has
        left, and its use is charged to the parent from then on.

        Raises:
            ValueError: the state is not a loopwatch guard snapshot, the run had
                already stopped (a stopped run cannot be resumed), or a usage counter or
                the elapsed time is negative or not a finite number (a corrupted
                snapshot would give the resumed run budget back).
        """
        if state.get("format") != _SNAPSHOT_FORMAT:
            raise ValueError("not a loopwatch guard snapshot")
        if state.get("stop"):
            raise ValueError("the run had already stopped; start a new run instead")
        c = state["counters"]
        for name, value in (
            *((k, c[k]) for k in _SNAPSHOT_COUNTERS),
            ("elapsed_seconds", state["elapsed_seconds"]),
        ):
            _check_snapshot_number(name, value)
        if parent is not None:
            g = parent.child(
                policy,
                run_id=str(state["run_id"]),
                mode=mode,
                goal_check=goal_check,
                known_tools=known_tools,
                _already_used={
                    "max_model_turns": int(c["turns"]),
                    "max_tool_attempts": int(c["attempts"]),
                    "max_tool_successes": int(c["successes"]),
                    "max_tokens": int(c["input_tokens"]) + int(c["output_tokens"]),
                    "max_cost_usd": float(c["cost"]),
                },
            )
            g._start_clock(clock)
        else:
            g = cls(
                policy,
                clock=clock,
                mode=mode,
                goal_check=goal_check,
                run_id=str(state["run_id"]),
                known_tools=known_tools,
                scrub=scrub,
            )
        g._elapsed_offset = float(state["elapsed_seconds"])
        g._turns = int(c["turns"])
        g._attempts = int(c["attempts"])
        g._successes = int(c["successes"])
        g._errors = int(c["errors"])
        g._blocked = int(c["blocked"])
        g._retries_total = int(c["retries_total"])
        g._input_tokens = int(c["input_tokens"])
        g._output_tokens = int(c["output_tokens"])
        g._cost = float(c["cost"])
        g._step = int(c["step"])
        g._steps_since_progress = int(c["steps_since_progress"])
        g._step_open = bool(c.get("step_open", False))
        g._step_progress = bool(c.get("step_progress", False))
        for fp, obs, tool, step, *rest in state["actions"]:
            g._actions.append(_Action(fp, obs, tool, int(step), bool(rest[0]) if rest else False))
        if g._actions:
            g._streak = g._actions[-1]
        g._streak_steps.extend(int(s) for s in state["streak_steps"])
        # Snapshots before the count across progress: the same steps.
        g._streak_all.extend(int(s) for s in state.get("streak_all", state["streak_steps"]))
        # Snapshots before the unbounded counts: the steps kept were the whole streak.
        g._streak_count = int(state.get("streak_count", len(g._streak_steps)))
        g._streak_all_count = int(state.get("streak_all_count", len(g._streak_all)))
        for k, v in state["last_failure"]:
            g._last_failure.set(k, FailureClass(v) if v else None)
        for k, n in state["retries"]:
            g._retries.set(k, int(n))
        for k, v in state["writes"]:
            g._writes.set(k, [(x[0], int(x[1])) for x in v])
        for k in state["seen"]:
            g._seen.set(k, None)
        for k, v in state["progress_values"]:
            slot = tuple(k)
            if slot not in g._progress_values:
                g._progress_fields[slot[:2]] += 1
            g._progress_values.set(slot, v)
        for fp, step in state["decisions"]:
            g._decisions.append((fp, int(step)))
        # Counted from what the look-back kept: a snapshot taken with a longer look-back
        # (a larger limit then) must not leave counts of decisions it no longer holds.
        g._decision_counts.update(fp for fp, _ in g._decisions)
        g._provided.update(state.get("provided", []))
        g._partial = state.get("partial")
        return g


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return str(int(value))
