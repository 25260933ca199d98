"""Every stop in one sentence, built from its evidence; and the loop's repeated call.

Pure functions of a stop row, its parsed evidence and the run's steps (no Streamlit): the
run view shows :func:`stop_sentence` under the stop's heading and
:func:`loop_evidence` next to the steps, so an on-call reader learns *which* rule, limit
or canceller ended the run, and *which* arguments repeated, without decoding hashes.

The words follow DESIGN section 2 (stop reasons, evidence fields) and the policy file's
keys (``repeat_limit``, ``cycle_max_period``, ``no_progress_patience``, ...), so a reader
can find the rule in the policy that fired.

Example:
    >>> stop_sentence({"reason": "refused", "step": 2}, {})
    'Stopped at step 2: the model refused the task.'
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .runview import StepView, ToolCallView, fold

__all__ = [
    "ABNORMAL_HELP",
    "CAPTURE_HINT",
    "LoopEvidence",
    "loop_evidence",
    "stop_sentence",
]

CAPTURE_HINT: Final = (
    "Content was not captured for this run, so only fingerprints are stored. Turn capture "
    "on in the agent: `Run(..., capture_content=True)`, or set "
    "`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` (`loopwatch demo "
    "--capture-content`); the collector redacts secrets and canaries before storing it."
)
"""What the run view says when a loop's arguments and results were not stored."""

ABNORMAL_HELP: Final = (
    "Stops whose reason is not `completed`, over all stops in the range. Counted: "
    "`final_unverified`, `refused`, `budget_exhausted`, `deadline_exceeded`, "
    "`repeated_action`, `action_cycle`, `repeated_decision`, `no_progress`, `cancelled` "
    "and `error`. Not counted: `completed`, and runs without a stop yet."
)
"""The abnormal-stop ratio's tooltip: the reasons it counts (issue 28, item 5)."""

_BUDGET_KEYS: Final = {
    "model_turns": "max_model_turns",
    "tool_attempts": "max_tool_attempts",
    "tool_successes": "max_tool_successes",
    "action_retries": "max_retries_per_action",
    "tokens": "max_tokens",
    "cost": "max_cost_usd",
}
"""Budget dimension -> the policy file's key (DESIGN section 3, policy file)."""


def _int(value: Any) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and abs(number) < 2**63 else None


def _num(value: Any) -> str | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number):
        return None
    return str(int(number)) if number.is_integer() else f"{number:.4g}"


def _text(value: Any, limit: int = 80) -> str | None:
    if value is None or value == "":
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return fold(text, limit).short


def _crossing(stop: Mapping[str, Any]) -> str:
    observed, limit = _num(stop.get("observed")), _num(stop.get("limit_value"))
    if observed is None or limit is None:
        return ""
    return f"observed {observed} > limit {limit}" if observed != limit else f"limit {limit}"


def _at(step: int | None) -> str:
    return "Stopped" if step is None else f"Stopped at step {step}"


def stop_sentence(stop: Mapping[str, Any] | None, evidence: Mapping[str, Any] | None) -> str:
    """One sentence saying why the run stopped, from the stop row and its evidence.

    Args:
        stop: the stop row (``reason``, ``step``, ``dimension``, ``limit_value``,
            ``observed``, ``message``...), or ``None`` when the run has no stop.
        evidence: the stop's parsed evidence (``detector``, ``tool``, ``repetitions``,
            ``matched_period``, ``detail``, ``error_type``, ``cancelled_by``...).

    Returns:
        A sentence ending with a full stop. Names, tools and messages come from the
        client: the caller escapes them for Markdown.
    """
    if not stop:
        return "No stop recorded yet: the run is still running, or its stop span was lost."
    ev = dict(evidence or {})
    raw_detail = ev.get("detail")
    detail: Mapping[str, Any] = raw_detail if isinstance(raw_detail, Mapping) else {}
    reason = str(stop.get("reason") or "unknown")
    step = _int(stop.get("step"))
    at = _at(step)
    tool = _text(ev.get("tool"), 60)
    reps = _int(ev.get("repetitions")) or _int(stop.get("observed"))
    limit = _num(stop.get("limit_value"))
    message = _text(stop.get("message"), 160)
    if reason == "completed":
        return "Completed: the run gave a final answer" + (
            " and passed its goal check." if ev.get("detector") == "goal_check" else "."
        )
    if reason == "final_unverified":
        return "Finished unverified: the run gave a final answer that failed its goal check."
    if reason == "refused":
        return f"{at}: the model refused the task."
    if reason == "budget_exhausted":
        dimension = str(stop.get("dimension") or ev.get("dimension") or "a")
        key = _BUDGET_KEYS.get(dimension)
        facts = [f for f in (_crossing(stop), key and f"policy key {key}") if f]
        extra = ""
        if dimension == "action_retries" and tool:
            kind = _text(ev.get("failure_class"), 30)
            extra = f" retrying {tool}" + (f" after a {kind} failure" if kind else "")
        cap = _text(detail.get("recorded_cap") or detail.get("cap"), 40)
        if cap:
            facts.append(f"the recording's own cap {cap}")
        return f"{at}: the {dimension} budget ran out{extra}" + (
            f" ({', '.join(facts)})." if facts else "."
        )
    if reason == "deadline_exceeded":
        crossing = _crossing(stop)
        return f"{at}: the wall-clock deadline passed" + (
            f" ({crossing} s, policy key max_elapsed_seconds)." if crossing else "."
        )
    if reason == "repeated_action":
        times = f"{reps} times in a row" if reps else "repeatedly"
        rule = f"repeat_limit = {limit}" if limit else "repeat_limit"
        return (
            f"{at}: {tool or 'a tool'} was called {times} with the same arguments and an "
            f"unchanged result (rule {rule})."
        )
    if reason == "action_cycle":
        tools = detail.get("tools")
        period = _int(ev.get("matched_period"))
        cycle = (
            " → ".join(str(t) for t in tools[: period or len(tools)])
            if isinstance(tools, list) and tools
            else (tool or "a cycle of calls")
        )
        times = f" {reps} times" if reps else ""
        return (
            f"{at}: the cycle {_text(cycle, 120)} repeated{times} with unchanged results "
            f"(rule cycle_max_period / cycle_repetitions"
            + (f", period {period}" if period else "")
            + ")."
        )
    if reason == "repeated_decision":
        times = f"{reps} times in a row" if reps else "repeatedly"
        return (
            f"{at}: the model made the same non-tool decision {times} (an empty message, "
            f"the same plan or clarification; rule repeated_decision_limit"
            + (f" = {limit}" if limit else "")
            + ")."
        )
    if reason == "no_progress":
        last = _int(detail.get("last_progress_step"))
        since = f" since step {last}" if last else ""
        steps = f"{reps} steps" if reps else "too many steps"
        return (
            f"{at}: no progress for {steps}{since} (no new cursor, resource version or "
            "observation; rule no_progress_patience" + (f" = {limit}" if limit else "") + ")."
        )
    if reason == "cancelled":
        who = _text(
            ev.get("cancelled_by")
            or ev.get("by")
            or detail.get("cancelled_by")
            or detail.get("by"),
            60,
        )
        why = _text(ev.get("reason") or detail.get("reason") or ev.get("cause"), 120)
        sentence = f"Cancelled{'' if step is None else f' at step {step}'}"
        sentence += (
            f" by {who}" if who else " by the agent's own code (Run.cancel() or its framework)"
        )
        return sentence + (
            f": {why}." if why else "; the stop names no reason (its evidence has none)."
        )
    if reason == "error":
        kind = _text(ev.get("error_type") or detail.get("error_type") or ev.get("type"), 60)
        return f"{at}: an unexpected {kind or 'infrastructure'} error ended the run" + (
            f" ({message})." if message else "."
        )
    return f"{at} as {reason}" + (f": {message}" if message else "") + "."


@dataclass(frozen=True, slots=True)
class LoopEvidence:
    """The repeated call behind a loop stop, as the run view shows it.

    Attributes:
        tool: the repeated tool (``None`` when the steps hold no call of it).
        steps: the steps whose call is shown (the evidence's ``step_indices``).
        arguments / result: the last repeated call's stored content (redacted by the
            collector, folded to :data:`LIMIT` characters), or ``None`` when not captured.
        captured: content was stored for at least one repeated call.
        unchanged: every repeated call had the same observation digest.
    """

    tool: str | None
    steps: tuple[int, ...]
    arguments: str | None
    result: str | None
    captured: bool
    unchanged: bool

    LIMIT = 600


def _calls_of(steps: Sequence[StepView], indices: set[int], tool: str | None) -> list[ToolCallView]:
    calls: list[ToolCallView] = []
    for view in steps:
        if indices and view.step not in indices:
            continue
        calls += [c for c in view.calls if tool is None or c.tool == tool]
    return calls


def loop_evidence(
    stop: Mapping[str, Any] | None,
    evidence: Mapping[str, Any] | None,
    steps: Sequence[StepView],
) -> LoopEvidence | None:
    """The repeated call of a loop stop (``repeated_action``, ``action_cycle``,
    ``no_progress``...), or ``None`` when the stop names no repeated call and no steps.

    The calls are the steps named by the evidence's ``step_indices`` (else the last
    ``repetitions`` steps) on its ``tool``; blocked calls (never run) are skipped for the
    result, since the guard answered them itself.
    """
    if not stop or not steps:
        return None
    ev = dict(evidence or {})
    tool = _text(ev.get("tool"), 200)
    raw = ev.get("step_indices")
    indices = (
        {i for i in (_int(v) for v in raw) if i is not None} if isinstance(raw, list) else set()
    )
    if not indices and not tool:
        return None
    calls = _calls_of(steps, indices, tool)
    if not calls and indices:
        calls = _calls_of(steps, set(), tool)[-(len(indices) or 1) :]
    if not calls:
        return None
    ran = [c for c in calls if c.outcome != "blocked"] or calls
    shown = next((c for c in reversed(ran) if c.arguments or c.result), ran[-1])
    digests = {c.observation_digest for c in ran if c.observation_digest}
    limit = LoopEvidence.LIMIT

    def content(value: str | None) -> str | None:
        return fold(value, limit).short if value else None

    return LoopEvidence(
        tool=shown.tool,
        steps=tuple(sorted(indices)),
        arguments=content(shown.arguments),
        result=content(shown.result),
        captured=any(c.arguments is not None or c.result is not None for c in calls),
        unchanged=len(digests) <= 1,
    )
