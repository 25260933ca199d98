"""Recorded values read as guard input, the same way by ``loopwatch replay`` and the demo.

A recording keeps text where a live loop has objects: a failed call's error text instead
of its exception, an observation as JSON text instead of the tool's return value, and a
chat reply marked ``final`` although the agent acted again after it. This module turns
each into what the guard would have seen live.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from loopwatch.instrumentation import Decision, FailureClass, ToolCall

from .trajectory import Step, Trajectory

__all__ = [
    "STEP_CAPS",
    "RecordedCap",
    "RecordedToolError",
    "classify_recorded_error",
    "decoded_observation",
    "recorded_cap",
    "recorded_decision",
    "recorded_end",
    "recorded_failure_class",
]


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


def recorded_failure_class(call: Any) -> FailureClass:
    """A failed recorded call's failure class: the one the source recorded (a known
    :class:`FailureClass` value in ``call.failure_class``), else
    :func:`classify_recorded_error` of its observation text."""
    recorded = getattr(call, "failure_class", None)
    if recorded:
        try:
            return FailureClass(recorded)
        except ValueError:
            pass
    return classify_recorded_error(getattr(call, "observation", None))


def decoded_observation(observation: str | None) -> Any:
    """The observation as the tool returned it: JSON-decoded when it is a JSON object or
    array (so per-tool ``volatile`` and ``progress`` fields such as ``next_cursor``
    apply), else the text as recorded."""
    if observation is None:
        return None
    text = observation.strip()
    if text[:1] in ("{", "[") and text[-1:] in ("}", "]"):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return observation
    return observation


def recorded_decision(
    step: Step,
    *,
    last: bool,
    usage: Mapping[str, Any],
    arguments: Callable[[Any], dict[str, Any]],
) -> Decision:
    """The guard decision of a recorded agent step.

    Only the run's last agent step can be ``final`` or ``refusal``: an earlier one (a
    chat reply after which the agent acted again) is a ``message``.

    Args:
        step: the agent step.
        last: whether it is the run's last agent step.
        usage: ``input_tokens``, ``output_tokens`` and ``cost_usd`` to record.
        arguments: the guard's arguments of a recorded call from its recorded ones.
    """
    if step.tool_calls:
        calls = (ToolCall(c.name, arguments(c.arguments), c.call_id) for c in step.tool_calls)
        return Decision.tool(*calls, **usage)
    if last and step.decision == "final":
        return Decision.final(step.text, **usage)
    if last and step.decision == "refusal":
        return Decision.refusal(step.text, **usage)
    return Decision.message(step.text, **usage)


@dataclass(frozen=True)
class RecordedCap:
    """The recording framework's own step cap that cut a recorded run off.

    Attributes:
        framework: the recording's format (``tau2``, ``toolbench``...).
        label: the framework's name of the cap as the recording states it
            (``max_steps``, ``single_chain_max_step``...).
        limit: the cap's value when it counts agent turns (the guard's ``model_turns``),
            else None (tau2 counts messages of both sides).
        unit: what the cap counts (``agent turns``, ``messages``).
    """

    framework: str
    label: str
    limit: int | None
    unit: str

    @property
    def name(self) -> str:
        """``label=limit`` (``max_iterations=50``), or the label when the value is unknown."""
        return f"{self.label}={self.limit}" if self.limit is not None else self.label


STEP_CAPS: Final[dict[tuple[str, str], tuple[int | None, str]]] = {
    # (format, recorded stop) -> (cap, unit); the values are the corpus READMEs'
    # (/work/shared/corpus/*/README.md): tau2 ``info.max_steps`` counts messages of
    # both sides (200, or 100 in solo mode), so it is not a count of agent turns;
    # tau-bench's default ``max_num_steps=30`` (inferred: 62 messages, no stop token);
    # OpenHands ``max_iterations`` (50 in the corpus, read from the run's metadata when
    # present); Reflexion's ReAct agent halts when ``step_n > max_steps`` (6); ToolBench's
    # ``single_chain_max_step=12`` counts tree nodes, not agent turns.
    ("tau2", "max_steps"): (None, "messages"),
    ("chat", "max_num_steps"): (30, "agent turns"),
    ("openhands", "max_iterations"): (50, "agent turns"),
    ("react", "halted"): (6, "agent turns"),
    ("toolbench", "single_chain_max_step"): (None, "tree nodes"),
}
"""Recorded stops that are the recording framework's step cap, by (format, stop label)."""


def recorded_cap(trajectory: Trajectory) -> RecordedCap | None:
    """The step cap that cut ``trajectory`` off, or None when its recorded stop is no
    step cap (:data:`STEP_CAPS`).

    A run cut off by its recording's step cap did not end by itself, nor was it
    cancelled: the framework's turn budget ran out, so the demo ends it as
    ``budget_exhausted`` (``model_turns``) with this cap as the evidence. A cap value in
    the run's metadata (OpenHands ``max_iterations``) wins over the README's.
    """
    stop = (trajectory.recorded_stop or "").strip().lower()
    known = STEP_CAPS.get((trajectory.format, stop))
    if known is None:
        return None
    limit, unit = known
    recorded = trajectory.metadata.get(stop) if trajectory.metadata else None
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        limit = recorded if limit is not None else None
    return RecordedCap(trajectory.format, stop, limit, unit)


_STOP_REASONS: Final = frozenset(
    {
        "completed",
        "final_unverified",
        "refused",
        "budget_exhausted",
        "deadline_exceeded",
        "repeated_action",
        "action_cycle",
        "repeated_decision",
        "no_progress",
        "cancelled",
        "error",
    }
)
_CUT_OFF: Final = re.compile(
    r"max|limit|too_many|halt|timeout|time_out|cap\b|iteration|exceed|budget|cancel",
    re.IGNORECASE,
)


def recorded_end(trajectory: Trajectory) -> str:
    """How a recording ends when no policy stops it first (the demo's end rules, so
    ``loopwatch replay`` and ``loopwatch demo`` name the same end).

    In order: a recorded loopwatch stop reason from loopwatch's own spans (an exported
    run: its stop is the recorded one); a crash the record replays (own format) is
    ``error``; a last agent decision ``refusal`` is ``refused``; ``final`` is
    ``completed``, or ``final_unverified`` when the recorded outcome is ``failure``; a
    step cap (:func:`recorded_cap`) is ``budget_exhausted``; another cut-off label
    (error cap, time limit, cancellation) is ``cancelled``; anything else ends with the
    last agent text as the answer (``completed`` / ``final_unverified``).
    """
    stop = (trajectory.recorded_stop or "").strip()
    if trajectory.format == "otlp_json" and stop in _STOP_REASONS:
        return stop
    settings = trajectory.metadata.get("replay") if trajectory.metadata else None
    if isinstance(settings, Mapping) and isinstance(settings.get("crash"), Mapping):
        return "error"
    agent = trajectory.agent_steps
    last = agent[-1].decision if agent else None
    if last == "refusal":
        return "refused"
    if last != "final":
        if recorded_cap(trajectory) is not None:
            return "budget_exhausted"
        if stop and _CUT_OFF.search(stop):
            return "cancelled"
    return "final_unverified" if trajectory.recorded_outcome == "failure" else "completed"
