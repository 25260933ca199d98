"""The typed results of the guard: closed sets, decisions, stops, verdicts, outcomes.

Everything here is data (frozen dataclasses and string enums); no rule is decided here.
The closed sets are defined once, in this module, and imported everywhere else
(collector, dashboard, replay): :class:`StopReason` (DESIGN section 2),
:class:`LoopDetector`, :class:`ToolOutcome` and :class:`DecisionType` (DESIGN section 4,
``loopwatch.tool.outcome`` and ``loopwatch.decision.type``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from enum import StrEnum
from typing import Any, Final, Literal

from . import _semconv as sc
from .failures import FailureClass
from .fingerprint import canonical_json, digest, text_fingerprint

__all__ = [
    "ALLOWED",
    "Decision",
    "DecisionType",
    "Dimension",
    "Evidence",
    "LoopDetector",
    "Nudge",
    "NudgeText",
    "Outcome",
    "Stop",
    "StopReason",
    "ToolCall",
    "ToolOutcome",
    "ToolRecord",
    "ToolTicket",
    "Usage",
    "Verdict",
    "make_stop",
    "new_record",
]

Basis = Literal["projected", "observed"]


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


class LoopDetector(StrEnum):
    """A loop detector (the ``detector`` label of the loop-detection metric).

    Each value is also the :class:`StopReason` its detector stops with.
    ``repeated_action`` and ``action_cycle`` judge tool calls; ``repeated_decision`` and
    ``no_progress`` judge steps.
    """

    REPEATED_ACTION = "repeated_action"
    ACTION_CYCLE = "action_cycle"
    REPEATED_DECISION = "repeated_decision"
    NO_PROGRESS = "no_progress"


class ToolOutcome(StrEnum):
    """How one tool call ended (``loopwatch.tool.outcome``, spelled in :mod:`._semconv`)."""

    OK = sc.OUTCOME_OK
    ERROR = sc.OUTCOME_ERROR
    BLOCKED = sc.OUTCOME_BLOCKED
    NUDGED = sc.OUTCOME_NUDGED


_RETRYABLE: Final = frozenset(
    {StopReason.DEADLINE_EXCEEDED, StopReason.BUDGET_EXHAUSTED, StopReason.ERROR}
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
            :data:`~.budgets.MAX_REPORTED_TOKENS`, infinity included, count as that).
        cost_usd: cost of the model call in US dollars (``None``, NaN, negative
            values and values that are not numbers count as 0).
        model: the model that answered, when known (``gpt-4o``).
        price_source: where ``cost_usd`` came from (``genai-prices 0.2.3:
            openai/gpt-4o``, ``framework``); a cost stop names it in its evidence.
    """

    type: DecisionType
    tool_calls: tuple[ToolCall, ...] = ()
    text: str | None = None
    answer: Any = None
    asks_for: tuple[str, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    model: str | None = None
    price_source: str | None = None

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
            ``deadline``, ``goal_check``, ``exception``, ``framework_limit`` (a
            framework's own limit ended the run).
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
        out.update(self.measures())
        return out

    def measures(self) -> dict[str, Any]:
        """``dimension``, ``limit``, ``observed`` and ``basis``, those that are set."""
        out: dict[str, Any] = {}
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


ALLOWED: Final = Verdict(True)
"""The verdict of every check that finds nothing to stop (shared: verdicts are frozen)."""


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
        response / rung / detector: the loop-response rung this call met (``warn`` or
            ``nudge``), its 1-based index in the ladder and the detector
            (:mod:`.ladder`); None, 0, None when it met none.
        nudge: the nudge text to give the model as this call's result: the call is
            refused (``allowed`` False, ``blocked_by="nudge"``) and must not run.
        observed_response: ``observe`` mode: the rung this call would have met
            (``nudge``); the call runs.
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
    guard: object = field(default=None, repr=False, compare=False)
    response: str | None = None
    rung: int = 0
    detector: str | None = None
    nudge: str | None = None
    observed_response: str | None = None


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
    verdict: Verdict = ALLOWED


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
        """A :class:`ToolRecord` from its fields in order, built fast (the hot path)."""
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


new_record: Final = _record_maker()


class NudgeText(str):
    """The text of a nudge: a ``str`` (the model reads it as the tool's result) that says
    it is one. :meth:`Run.call_tool`, ``acall_tool`` and ``@tool`` return it for a nudged
    call, so ``isinstance(result, NudgeText)`` tells a nudge from a tool's own result.

    Attributes:
        tool / detector / rung: the nudged tool, the detector and the 1-based rung.
    """

    tool: str
    detector: str
    rung: int

    @classmethod
    def of(cls, text: str, *, tool: str, detector: str, rung: int) -> NudgeText:
        """``text`` marked as the nudge of ``tool`` at ``rung`` of ``detector``'s ladder."""
        out = cls(text)
        out.tool, out.detector, out.rung = tool, detector, rung
        return out


@dataclass(frozen=True, slots=True)
class Nudge:
    """One nudge of a run and what came of it (:mod:`.ladder`).

    Attributes:
        detector: the detector whose detection was answered (``repeated_action``).
        tool: the nudged tool.
        rung: 1-based index of the nudge rung in the ladder used.
        step: the step of the nudged call.
        result: ``recovered`` (progress, or a completed run, after the nudge and before
            any further detection), ``stopped`` (a later rung stopped the run) or
            ``ended`` (the run ended otherwise); None while the run goes on.
    """

    detector: str
    tool: str
    rung: int
    step: int
    result: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``loopwatch.nudges`` entry: ``{detector, tool, rung, step, result}``."""
        return {
            "detector": self.detector,
            "tool": self.tool,
            "rung": self.rung,
            "step": self.step,
            "result": self.result,
        }


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
        nudges: the run's nudges in order, each with its result (at most 64 kept).
        nudges_dropped: nudges past the 64 kept.
        observed_nudges: ``observe`` mode: the nudges the ladder would have given (the
            calls ran), each with result None.
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
    nudges: tuple[Nudge, ...] = ()
    nudges_dropped: int = 0
    observed_nudges: tuple[Nudge, ...] = ()

    @property
    def reason(self) -> StopReason:
        """Shortcut for ``outcome.stop.reason``."""
        return self.stop.reason


def make_stop(
    reason: StopReason,
    step: int,
    *,
    dimension: Dimension | None = None,
    limit: float | None = None,
    observed: float | None = None,
    basis: Basis | None = None,
    evidence: Evidence | None = None,
) -> Stop:
    """A :class:`Stop` with its safe one-line message and ``retryable`` filled in."""
    return Stop(
        reason=reason,
        step=step,
        dimension=dimension,
        limit=limit,
        observed=observed,
        basis=basis,
        evidence=evidence or Evidence(),
        message=_MESSAGES[reason].format(
            dimension=dimension.value if dimension else "",
            limit=_fmt(limit),
            observed=_fmt(observed),
        ),
        retryable=reason in _RETRYABLE,
    )


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return str(int(value))
