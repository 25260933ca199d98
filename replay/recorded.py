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
from typing import Any, Final

from loopwatch.instrumentation import Decision, FailureClass, ToolCall

from .trajectory import Step

__all__ = [
    "RecordedToolError",
    "classify_recorded_error",
    "decoded_observation",
    "recorded_decision",
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
