"""Reading one field of a recorded record, the same way in every importer.

Recorded files are loose: arguments arrive as JSON text or as objects, numbers as
strings, text as structured content. These readers never raise on such values; they
return the value as recorded or ``None``. A record that cannot be read at all raises
:class:`Malformed`, which the importer reports as one problem for that record.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from ..trajectory import FAILURE, SUCCESS, UNKNOWN, Outcome

__all__ = [
    "Malformed",
    "finite_float",
    "int_or_none",
    "iso_seconds",
    "json_or_text",
    "outcome_of",
    "recorded_arguments",
    "reward_outcome",
    "text_of",
]


class Malformed(ValueError):
    """One record (a simulation, message list, event, span) cannot be read; the message
    says where inside it."""


def json_or_text(value: Any) -> Any:
    """A JSON string decoded (the raw string when it is not JSON); other values as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def recorded_arguments(raw: Any) -> Any:
    """Tool-call arguments as recorded: an object stays an object, JSON text is decoded
    (kept as the raw string when it is not JSON), a missing value is ``{}``."""
    return {} if raw is None else json_or_text(raw)


def text_of(value: Any) -> str | None:
    """Text as recorded: a string or ``None`` as is, anything else as sorted JSON."""
    if value is None or isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (ValueError, RecursionError):
        return f"<unprintable {type(value).__name__}>"


def finite_float(value: Any) -> float | None:
    """A finite number (not a bool) as a float, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def int_or_none(value: Any) -> int | None:
    """An integer, or a string holding one (``" 12 "``); ``None`` for anything else
    (bools included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def outcome_of(passed: bool | None) -> Outcome:
    """The recorded outcome of a source's verdict: ``success`` when it passed,
    ``failure`` when it did not, ``unknown`` without a verdict."""
    if passed is None:
        return UNKNOWN
    return SUCCESS if passed else FAILURE


def reward_outcome(reward: float | None, metadata: dict[str, Any]) -> Outcome:
    """The recorded outcome of a tau-bench or tau2-bench reward (1.0 passed, any other
    value failed, none unknown); a reward is also kept in ``metadata["reward"]``."""
    if reward is not None:
        metadata["reward"] = reward
    return outcome_of(None if reward is None else reward == 1.0)


def iso_seconds(value: Any) -> float | None:
    """Unix seconds of an ISO 8601 string (no zone means UTC); ``None`` if unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()
