"""Pairing recorded tool results with the calls they answer, by tool-call id.

Recorders reuse ids: tau-bench and tau2-bench runs restart ``call_1`` after each turn,
and a poll repeated three times may carry one id three times. A lookup keyed by id alone
gives every call with that id the *last* result, so a poll whose status advanced reads
as the same result three times: a false ``repeated_action``. :class:`OpenCalls` pairs
each result with the latest call made with its id that has no result yet, which is the
call it follows in the recording.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["OpenCalls"]

T = TypeVar("T")


class OpenCalls(Generic[T]):
    """Tool calls waiting for their result, by id; each is answered at most once.

    ``T`` is whatever the importer needs back (its mutable call draft, or a position).
    Calls without an id are not held: the importer pairs those by order or name.

    Example::

        open_calls: OpenCalls[Draft] = OpenCalls()
        open_calls.add("call_1", first)
        open_calls.answer("call_1")   # first
        open_calls.add("call_1", second)
        open_calls.answer("call_1")   # second, not first again
        open_calls.answer("call_1")   # None: no open call has that id
    """

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: dict[str, T] = {}

    def add(self, call_id: str | None, call: T) -> None:
        """Hold ``call`` as the one a later result with ``call_id`` answers (replacing an
        earlier unanswered call with the same id)."""
        if call_id:
            self._open[call_id] = call

    def answer(self, call_id: str | None) -> T | None:
        """The latest call made with ``call_id`` not answered before, now answered; ``None``
        when there is none (an unknown id, or its call was answered already)."""
        if not call_id:
            return None
        return self._open.pop(call_id, None)
