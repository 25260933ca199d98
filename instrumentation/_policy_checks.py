"""Validation of policy values: the limits' table and the rules every value must meet.

One place for the checks a policy file, :meth:`~.policy.Policy.build`, an override and a
:class:`~.policy.ToolPolicy` built in code all apply (DESIGN section 3: a policy is
validated at load): each returns every problem with its path, never raises.
"""

from __future__ import annotations

import difflib
import math
import string
from collections.abc import Mapping
from typing import Any, Final

from .errors import PolicyProblem

__all__ = [
    "DEFAULT_LOOP_RESPONSE",
    "DEFAULT_NUDGE_TEMPLATE",
    "FLOAT",
    "INT",
    "LADDER_DETECTORS",
    "LIMIT_SPEC",
    "MAX_DETECTOR_WINDOW",
    "MAX_INT",
    "MAX_NUDGE_TEMPLATE_BYTES",
    "NUDGE_PLACEHOLDERS",
    "RUNGS",
    "STOP_ONLY_DETECTORS",
    "describe_int",
    "ladder_problems",
    "out_of_range",
    "tool_problems",
    "unknown_key",
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


RUNGS: Final[tuple[str, ...]] = ("warn", "nudge", "stop")
"""The rungs of a loop-response ladder (``loop_response``)."""
DEFAULT_LOOP_RESPONSE: Final[tuple[str, ...]] = ("stop",)
"""The default ladder: stop at the first detection, as before ladders existed."""
LADDER_DETECTORS: Final[tuple[str, ...]] = ("repeated_action",)
"""Detectors a ladder acts on (judged when a tool call is asked for, before it runs)."""
STOP_ONLY_DETECTORS: Final[tuple[str, ...]] = (
    "action_cycle",
    "repeated_decision",
    "no_progress",
    "budget_exhausted",
    "deadline_exceeded",
    "retry_rule",
)
"""Keys ``loop_response_by_detector`` accepts with ``["stop"]`` only: budgets, the
deadline and the retry rule only stop (a nudge cannot give a budget back), and the other
loop detectors judge a call after it ran or a whole step, where no tool result is left
to answer with."""
_BUDGET_LIKE: Final = frozenset({"budget_exhausted", "deadline_exceeded", "retry_rule"})
NUDGE_PLACEHOLDERS: Final[tuple[str, ...]] = ("tool", "count", "unchanged", "advice")
"""The placeholders a ``nudge_template`` may use."""
MAX_NUDGE_TEMPLATE_BYTES: Final = 2048
"""Largest ``nudge_template``, in UTF-8 bytes (2 KiB)."""
DEFAULT_NUDGE_TEMPLATE: Final = (
    "loopwatch did not run this call: {tool} was called {count} times with the same "
    "arguments and its result did not change ({unchanged}). {advice}"
)
"""The nudge the model reads when a profile sets none."""


def _ladder_problems(
    value: Any, path: str, source: str, *, stop_only: bool = False, detector: str = ""
) -> list[PolicyProblem]:
    """The problems of one ladder (each one line)."""
    if not isinstance(value, list | tuple) or not all(isinstance(r, str) for r in value):
        return [PolicyProblem(path, "must be a list of rungs (warn, nudge, stop)", source)]
    if not value:
        return [PolicyProblem(path, 'empty ladder: give at least one rung, e.g. ["stop"]', source)]
    problems = [
        PolicyProblem(path, f"unknown rung {r[:40]!r} (use warn, nudge or stop)", source)
        for r in value
        if r not in RUNGS
    ]
    if problems:
        return problems
    if "stop" in value[:-1]:
        problems.append(
            PolicyProblem(path, "stop must be the last rung: the rungs after it never come", source)
        )
    if stop_only and tuple(value) != DEFAULT_LOOP_RESPONSE:
        rung = "nudge" if "nudge" in value else "warn"
        why = (
            "budgets, deadlines and the retry rule only stop"
            if detector in _BUDGET_LIKE
            else "only repeated_action takes warn or nudge"
        )
        problems.append(
            PolicyProblem(
                path, f"a {rung} rung makes no sense for {detector}: {why}; use ['stop']", source
            )
        )
    return problems


def _template_problems(value: Any, path: str, source: str) -> list[PolicyProblem]:
    if not isinstance(value, str) or not value.strip():
        return [PolicyProblem(path, "must be a non-empty string", source)]
    size = len(value.encode("utf-8"))
    if size > MAX_NUDGE_TEMPLATE_BYTES:
        return [
            PolicyProblem(
                path, f"{size} bytes, over the {MAX_NUDGE_TEMPLATE_BYTES}-byte limit", source
            )
        ]
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(value)]
    except ValueError as exc:
        return [PolicyProblem(path, f"not a valid template: {exc}", source)]
    for name, spec, conv in fields:
        if name is None:
            continue
        if name not in NUDGE_PLACEHOLDERS or spec or conv:
            shown = "{" + name[:40] + "}"
            return [
                PolicyProblem(
                    path,
                    f"unknown placeholder {shown} (use {{tool}}, {{count}}, {{unchanged}}, "
                    "{advice}; write {{ and }} for a literal brace)",
                    source,
                )
            ]
    return []


def ladder_problems(values: Mapping[str, Any], prefix: str, source: str) -> list[PolicyProblem]:
    """The problems of ``loop_response``, ``loop_response_by_detector`` and
    ``nudge_template`` in ``values`` (absent keys are skipped), each one line with its
    path ``prefix.KEY``."""
    problems: list[PolicyProblem] = []
    if "loop_response" in values:
        problems += _ladder_problems(values["loop_response"], f"{prefix}.loop_response", source)
    if "loop_response_by_detector" in values:
        by = values["loop_response_by_detector"]
        path = f"{prefix}.loop_response_by_detector"
        if not isinstance(by, Mapping):
            problems.append(PolicyProblem(path, "must be a table of detector = [rungs]", source))
        else:
            for name, ladder in by.items():
                if name not in LADDER_DETECTORS and name not in STOP_ONLY_DETECTORS:
                    known = ", ".join((*LADDER_DETECTORS, *STOP_ONLY_DETECTORS))
                    problems.append(
                        PolicyProblem(
                            f"{path}.{str(name)[:40]}", f"unknown detector (use {known})", source
                        )
                    )
                    continue
                problems += _ladder_problems(
                    ladder,
                    f"{path}.{name}",
                    source,
                    stop_only=name in STOP_ONLY_DETECTORS,
                    detector=name,
                )
    if "nudge_template" in values:
        problems += _template_problems(values["nudge_template"], f"{prefix}.nudge_template", source)
    return problems


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


def unknown_key(key: str, known: frozenset[str] | set[str]) -> str:
    """The problem text of an unknown key: ``unknown key``, with a suggestion when one of
    the ``known`` keys at that path is close (``unknown key (did you mean
    'max_model_turns'?)``).

    Closeness is :func:`difflib.get_close_matches` with its default cutoff (0.6 similarity
    ratio), the same rule Python's own "did you mean" hints use for names; at most one
    suggestion (the closest), so the line stays short.
    """
    close = difflib.get_close_matches(str(key), sorted(known), n=1)
    return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"
