"""Failure classes decide retries, centrally, not the model (issue 2, "Failure classes").

=====================  ==============================================================
class                  retry rule (``retry_allowance``)
=====================  ==============================================================
``invalid_arguments``  never retried as-is (0)
``unauthorized``       never retried as-is (0)
``unknown_tool``       never retried as-is (0); the call is never dispatched
``timeout``            read: within ``max_retries_per_action``; write: only when the
                       call carries an idempotency key (completion is unknown, a blind
                       retry could act twice), else 0. A call cancelled before it
                       returned (``asyncio.CancelledError``: the caller's own
                       ``wait_for`` ran out) is a timeout too
``transient``          read: within ``max_retries_per_action`` (and the deadline);
                       write: as ``timeout``
``permanent``          0: the same call will fail the same way
=====================  ==============================================================

An empty but valid result is not a failure and not a reason to retry: repeating the
call is an ordinary repeat (same action, same observation) for the repeat detector.

Tools state their class by raising :class:`ToolFailure`; other exceptions are classified
by type and by an HTTP-like ``status_code``/``status`` attribute (400/404/409/422: invalid
arguments, 401/403: unauthorized, 408/425/429/5xx: transient).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from enum import StrEnum
from typing import Any, Final

__all__ = [
    "FailureClass",
    "ToolFailure",
    "ToolNudged",
    "classify_exception",
    "retry_allowance",
]


class FailureClass(StrEnum):
    """Why a tool call failed; decides whether it may be retried."""

    INVALID_ARGUMENTS = "invalid_arguments"
    UNAUTHORIZED = "unauthorized"
    UNKNOWN_TOOL = "unknown_tool"
    TIMEOUT = "timeout"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class ToolFailure(Exception):
    """Raise from a tool to state the failure class explicitly.

    Args:
        message: a short, safe description (it becomes part of the observation).
        failure_class: a :class:`FailureClass` or its string value.

    Raises:
        ValueError: an unknown failure class.
    """

    def __init__(
        self, message: str, failure_class: FailureClass | str = FailureClass.PERMANENT
    ) -> None:
        super().__init__(message)
        self.failure_class = FailureClass(failure_class)


class ToolNudged(ToolFailure):
    """Raised by ``with run.tool_call(...)`` on entry when the policy's ladder nudged the
    call (:mod:`.ladder`): the block's body does not run; give the model ``text`` as the
    call's result. ``str(exc)`` is the text too, so code that reports a
    :class:`ToolFailure` to the model as the tool's error shows it the nudge.

    Attributes:
        text: the nudge, built from the policy's template and the guard's facts.
        ticket: the guard's :class:`~.outcomes.ToolTicket` (``rung``, ``detector``).
    """

    def __init__(self, text: str, ticket: Any = None) -> None:
        super().__init__(text, FailureClass.PERMANENT)
        self.text = text
        self.ticket = ticket


_TRANSIENT_TYPES: Final = (ConnectionError, BrokenPipeError, InterruptedError)
_TIMEOUT_TYPES: Final = (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)


def _status_class(status: int) -> FailureClass | None:
    if status in (401, 403, 407):
        return FailureClass.UNAUTHORIZED
    if status in (408, 504):
        return FailureClass.TIMEOUT
    if status in (425, 429) or 500 <= status <= 599:
        return FailureClass.TRANSIENT
    if status in (400, 404, 405, 409, 410, 413, 414, 415, 422):
        return FailureClass.INVALID_ARGUMENTS
    return None


def classify_exception(exc: BaseException) -> FailureClass:
    """Map an exception raised by a tool to a :class:`FailureClass`.

    Order: an explicit :class:`ToolFailure` class, an HTTP-like status attribute
    (``status_code``, ``status``, or ``response.status_code``), then the exception type
    (timeouts and ``asyncio.CancelledError``: timeout; connection errors: transient;
    ``PermissionError``: unauthorized; ``TypeError``/``ValueError``/``KeyError``: invalid
    arguments); anything else is ``permanent``.
    """
    if isinstance(exc, ToolFailure):
        return exc.failure_class
    for holder in (exc, getattr(exc, "response", None)):
        for attr in ("status_code", "status"):
            status = getattr(holder, attr, None)
            if isinstance(status, int) and not isinstance(status, bool):
                cls = _status_class(status)
                if cls is not None:
                    return cls
    if isinstance(exc, (*_TIMEOUT_TYPES, asyncio.CancelledError)):
        # Cancelled: its completion is unknown, as after a timeout. As ``permanent`` (never
        # retried), the caller's own timeout would make the next identical call end the run.
        return FailureClass.TIMEOUT
    if isinstance(exc, PermissionError):
        return FailureClass.UNAUTHORIZED
    if isinstance(exc, _TRANSIENT_TYPES):
        return FailureClass.TRANSIENT
    if isinstance(exc, TypeError | ValueError | KeyError):
        return FailureClass.INVALID_ARGUMENTS
    return FailureClass.PERMANENT


def retry_allowance(
    failure: FailureClass, *, write: bool, has_idempotency_key: bool, max_retries: int
) -> int:
    """How many retries of the same action the failure class permits (see the table)."""
    if failure in (FailureClass.TIMEOUT, FailureClass.TRANSIENT):
        if write and not has_idempotency_key:
            return 0
        return max_retries
    return 0
