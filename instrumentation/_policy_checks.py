"""Validation of policy values: the limits' table and the rules every value must meet.

One place for the checks a policy file, :meth:`~.policy.Policy.build`, an override and a
:class:`~.policy.ToolPolicy` built in code all apply (DESIGN section 3: a policy is
validated at load): each returns every problem with its path, never raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from .errors import PolicyProblem

__all__ = [
    "FLOAT",
    "INT",
    "LIMIT_SPEC",
    "MAX_DETECTOR_WINDOW",
    "MAX_INT",
    "describe_int",
    "out_of_range",
    "tool_problems",
    "validate_values",
]

INT = "int"
FLOAT = "float"
# field -> (kind, default, minimum, strict minimum?)
LIMIT_SPEC: Final[dict[str, tuple[str, float, float, bool]]] = {
    "max_model_turns": (INT, 20, 0, False),
    "max_tool_attempts": (INT, 40, 0, False),
    "max_tool_successes": (INT, 40, 0, False),
    "max_retries_per_action": (INT, 2, 0, False),
    "max_elapsed_seconds": (FLOAT, 300.0, 0, True),
    "max_tokens": (INT, 1_000_000, 0, False),
    "max_cost_usd": (FLOAT, 10.0, 0, False),
    "tool_timeout_seconds": (FLOAT, 60.0, 0, True),
    "repeat_limit": (INT, 3, 1, False),
    "cycle_max_period": (INT, 4, 2, False),
    "cycle_repetitions": (INT, 2, 2, False),
    "no_progress_patience": (INT, 8, 1, False),
    "repeated_decision_limit": (INT, 3, 1, False),
    "detector_window": (INT, 64, 8, False),
}
MAX_DETECTOR_WINDOW: Final = 4096
"""Largest ``detector_window`` (steps of history a guard keeps)."""
MAX_INT: Final = 2**63 - 1
"""Largest whole-number limit: what an OTLP ``intValue`` (signed 64-bit) carries."""


def validate_values(values: Mapping[str, Any], prefix: str, source: str) -> list[PolicyProblem]:
    """The problems of the limits in ``values`` (keys not in :data:`LIMIT_SPEC` are
    skipped), each with its path ``prefix.KEY`` and ``source``."""
    problems: list[PolicyProblem] = []
    for key, value in values.items():
        spec = LIMIT_SPEC.get(key)
        reason = None if spec is None else _limit_problem(key, value, spec)
        if reason is not None:
            problems.append(PolicyProblem(f"{prefix}.{key}", reason, source))
    return problems


def _limit_problem(key: str, value: Any, spec: tuple[str, float, float, bool]) -> str | None:
    """What is wrong with limit ``key`` = ``value`` (its :data:`LIMIT_SPEC` row), or ``None``."""
    kind, _default, minimum, strict = spec
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {type(value).__name__}"
    floor = f"{'>' if strict else '>='} {minimum:g}"
    too_large = out_of_range(value, kind, floor)
    if too_large is not None:
        return too_large
    if not math.isfinite(value):
        return f"must be finite, got {value!r} (omit it for the default)"
    if kind == INT and not isinstance(value, int) and not value.is_integer():
        return f"must be a whole number, got {value!r}"
    if kind == INT and isinstance(value, float) and not -MAX_INT <= value <= MAX_INT:
        # A whole float becomes an int (Policy.__post_init__): bound it as an int is.
        bound = f"must be {floor}" if value < 0 else f"must be <= {MAX_INT}"
        return f"{bound}, got {value!r}"
    if (strict and value <= minimum) or value < minimum:
        return f"must be {floor}, got {value!r}"
    if key == "detector_window" and value > MAX_DETECTOR_WINDOW:
        return f"must be <= {MAX_DETECTOR_WINDOW}, got {value!r}"
    return None


def out_of_range(value: int | float, kind: str, floor: str) -> str | None:
    """Why an integer ``value`` is too large in size for a limit of ``kind``, or ``None``.

    TOML integers have no bound in Python. A whole-number limit must fit the 64-bit
    integer that span attributes (OTLP ``intValue``) carry; a limit in seconds or USD
    must fit a float (past about 1.8e308, ``float()`` and ``math.isfinite`` raise
    ``OverflowError`` instead of failing validation). ``floor`` is the lower-bound rule
    (``">= 0"``) named for a hugely negative value.
    """
    if not isinstance(value, int):
        return None
    if kind == INT:
        if -MAX_INT <= value <= MAX_INT:
            return None
    else:
        try:
            float(value)
        except OverflowError:
            pass
        else:
            return None
    if value < 0:
        return f"must be {floor}, got {describe_int(value)}"
    ceiling = f"must be <= {MAX_INT}" if kind == INT else "too large for a number"
    return f"{ceiling}, got {describe_int(value)}"


def describe_int(value: int) -> str:
    """A huge integer by its size: printed whole it is unreadable (and past 4,300 digits
    ``str()`` itself raises)."""
    try:
        digits = len(str(abs(value)))
    except ValueError:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return f"a {digits}-digit integer"


def tool_problems(
    path: str, source: str, *, risk: Any, repeat_limit: Any, key: Any, timeout: Any
) -> list[PolicyProblem]:
    """The problems of one tool's settings, for a file's tool table and a
    :class:`ToolPolicy` built in code alike (``path``: the tool's path)."""
    problems: list[PolicyProblem] = []

    def bad(field: str, message: str) -> None:
        problems.append(PolicyProblem(f"{path}.{field}", message, source))

    if risk not in ("read", "write"):
        bad("risk", f"must be 'read' or 'write', got {risk!r}")
    if repeat_limit is not None:
        whole = (
            not isinstance(repeat_limit, bool)
            and isinstance(repeat_limit, int | float)
            and (isinstance(repeat_limit, int) or repeat_limit.is_integer())
        )
        if not whole or repeat_limit < 1:
            bad("repeat_limit", f"must be a whole number >= 1, got {repeat_limit!r}")
        elif too_large := out_of_range(int(repeat_limit), INT, ">= 1"):
            bad("repeat_limit", too_large)
    if key is not None and (not isinstance(key, str) or not key):
        bad("idempotency_key", "must be a non-empty string")
    elif key is not None and risk != "write":
        bad("idempotency_key", "only write tools take an idempotency key")
    too_large = (
        out_of_range(timeout, FLOAT, "> 0")
        if isinstance(timeout, int) and not isinstance(timeout, bool)
        else None
    )
    if too_large is not None:
        bad("timeout_seconds", too_large)
    elif timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        bad("timeout_seconds", f"must be a finite number > 0, got {timeout!r}")
    return problems
