"""Runs the collector stored, read back as trajectories (the dashboard's policy replay).

Not a file format: the input is the step rows the collector's read API returns for one
run, so this reader is called directly and is not among the detected importers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from loopwatch.instrumentation import StopReason
from loopwatch.instrumentation import _semconv as sc

from ..trajectory import AGENT, ENVIRONMENT, DecisionKindName, Step, ToolCall, Trajectory
from ._fields import json_or_text, outcome_of

__all__ = ["trajectory_from_stored"]

_NS_PER_SECOND: Final = 1e9
_T = TypeVar("_T")


def _present(value: Any) -> bool:
    """Not None and not a missing number (pandas gives NaN for missing numbers)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _opt(row: Mapping[str, Any] | None, key: str, kind: Callable[[Any], _T]) -> _T | None:
    """``kind(row[key])``, or ``None`` when the row or the value is missing."""
    value = row.get(key) if row is not None else None
    return kind(value) if _present(value) else None


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
        number = _opt(row, "step", int)
        if number is not None:
            by_step.setdefault(number, []).append(row)
    out: list[Step] = []
    tool_progress = False  # a tool result of the previous step was progress
    for number in sorted(by_step):
        rows = by_step[number]
        decision = next((r for r in rows if r.get("kind") == sc.EVENT_DECISION), None)
        results = [r for r in rows if r.get("kind") == sc.EVENT_TOOL_RESULT]
        if out and decision is not None and _recorded_progress(decision) and not tool_progress:
            # The recording guard counted progress after the last step, and none of that
            # step's tool results brought it (those the replay sees, and they do not end
            # a run of identical actions): explicit progress from the environment
            # (Run.progress: a user reply), which no stored row holds otherwise.
            text = f"progress recorded before step {number}"
            out.append(Step(index=len(out), actor=ENVIRONMENT, decision="message", text=text))
        tool_progress = any(_opt(r, "progress", bool) for r in results)
        kind: DecisionKindName = "tool" if results else "message"
        if not results and _opt(decision, "decision_type", str) in ("final", "refusal"):
            kind = "final" if _opt(decision, "decision_type", str) == "final" else "refusal"
        out.append(
            Step(
                index=len(out),
                actor=AGENT,
                decision=kind,
                text=_opt(decision, "decision_fingerprint", str),
                tool_calls=tuple(_call(r) for r in results),
                timestamp=_seconds(
                    (rows[0] if decision is None else decision).get("start_unix_nano")
                ),
                input_tokens=_opt(decision, "input_tokens", int),
                output_tokens=_opt(decision, "output_tokens", int),
                cost_usd=_opt(decision, "cost_usd", float),
            )
        )
    return Trajectory(
        source=source,
        run_id=run_id,
        format="loopwatch",
        steps=tuple(out),
        recorded_outcome=outcome_of(stop_reason == StopReason.COMPLETED if stop_reason else None),
        recorded_stop=stop_reason or None,
        recorded_stop_kind="explicit",
        agent=agent or "recorded-agent",
    )


def _call(row: Mapping[str, Any]) -> ToolCall:
    """One stored tool result as a recorded call (see :func:`trajectory_from_stored`)."""
    raw_arguments = _opt(row, "arguments", str)
    arguments = json_or_text(raw_arguments) if raw_arguments else None
    if arguments is None:
        arguments = {"action_fingerprint": row.get("action_fingerprint") or ""}
    outcome = row.get("outcome")
    observation = None
    if outcome != sc.OUTCOME_BLOCKED:
        observation = _opt(row, "result", str) or _opt(row, "observation_digest", str)
    return ToolCall(
        name=str(row.get("tool") or ""),
        arguments=arguments,
        observation=observation,
        error=outcome == sc.OUTCOME_ERROR,
        call_id=_opt(row, "tool_call_id", str),
        started_at=_seconds(row.get("start_unix_nano")),
        ended_at=_seconds(row.get("end_unix_nano")),
    )
