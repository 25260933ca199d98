"""Recorded numbers that do not fit a float.

JSON integers are unbounded in Python: a token count or cost of 400 digits parses, then
``float()`` and ``math.isfinite`` raise ``OverflowError`` wherever the number is used,
which is not the ``ValueError`` an importer reports per record. Importers check each
number they turn into a float or hand to the guard with :func:`check_fits`, and report
the record (naming the field) instead.
"""

from __future__ import annotations

from typing import Any

# One wording for a huge integer, in policy problems and import problems alike.
from loopwatch.instrumentation._policy_checks import describe_int as _describe_int

__all__ = ["check_fits", "too_large"]


def too_large(value: Any) -> bool:
    """``value`` is an integer (not a bool) too large in size for a float (past about
    1.8e308)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return True
    return False


def check_fits(value: Any, where: str, *, error: type[ValueError] = ValueError) -> None:
    """Raise ``error("<where>: too large for a number, got a N-digit integer")`` when
    :func:`too_large` holds for ``value``; otherwise do nothing.

    Args:
        value: the recorded value, any type (only integers can be too large).
        where: the field's place in the file (``messages[3].usage.prompt_tokens``).
        error: the importer's per-record error class (a ``ValueError``).

    Example::

        check_fits(usage.get("prompt_tokens"), "messages[3].usage.prompt_tokens")
    """
    if too_large(value):
        raise error(f"{where}: too large for a number, got {_describe_int(value)}")
