"""Pairing recorded tool results with the calls they answer, by tool-call id.

Recorders reuse ids: tau-bench and tau2-bench runs restart ``call_1`` after each turn,
and a poll repeated three times may carry one id three times. A lookup keyed by id alone
gives every call with that id the *last* result, so a poll whose status advanced reads
as the same result three times: a false ``repeated_action``. :class:`OpenCalls` pairs
each result with a call made with its id that has no result yet: of the latest turn that
has one, the first such call. So a result follows the turn it answers (a call of an
earlier turn left without a result does not take it), and the parallel calls of one
turn that share an id are answered in the order they were made, as their results follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..trajectory import Actor, DecisionKindName, Step, ToolCall

__all__ = ["CallDraft", "OpenCalls", "StepDraft"]

T = TypeVar("T")


@dataclass
class CallDraft:
    """A recorded tool call while its file is read: the result and its times come later."""

    name: str
    arguments: Any
    call_id: str | None
    observation: str | None = None
    error: bool = False
    answered: bool = False
    started_at: float | None = None
    ended_at: float | None = None

    def recorded(self) -> ToolCall:
        """The call as the data model holds it."""
        return ToolCall(
            self.name,
            self.arguments,
            self.observation,
            self.error,
            self.call_id,
            self.started_at,
            self.ended_at,
        )


@dataclass
class StepDraft:
    """A recorded step while its file is read: its calls' results come later."""

    actor: Actor
    decision: DecisionKindName
    text: str | None
    calls: list[CallDraft] = field(default_factory=list)
    timestamp: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def recorded(self, index: int) -> Step:
        """The step as the data model holds it, at ``index``."""
        return Step(
            index,
            self.actor,
            self.decision,
            self.text,
            tuple(call.recorded() for call in self.calls),
            self.timestamp,
            self.input_tokens,
            self.output_tokens,
        )


class OpenCalls(Generic[T]):
    """Tool calls waiting for their result, by id; each is answered at most once.

    ``T`` is whatever the importer needs back (its mutable call draft, or a position).
    Calls without an id are not held: the importer pairs those by order or name. Call
    :meth:`begin_turn` before adding the calls of each model turn (one assistant message,
    one model span).

    Example::

        open_calls: OpenCalls[Draft] = OpenCalls()
        open_calls.begin_turn()
        open_calls.add("call_1", first)
        open_calls.add("call_1", parallel)
        open_calls.answer("call_1")   # first
        open_calls.answer("call_1")   # parallel
        open_calls.begin_turn()
        open_calls.add("call_1", later)
        open_calls.answer("call_1")   # later
        open_calls.answer("call_1")   # None: no open call has that id
    """

    __slots__ = ("_open", "_turn")

    def __init__(self) -> None:
        self._open: dict[str, list[tuple[int, T]]] = {}
        self._turn = 0

    def begin_turn(self) -> None:
        """Start a new model turn: calls added from now on belong to it."""
        self._turn += 1

    def add(self, call_id: str | None, call: T) -> None:
        """Hold ``call``, of the current turn, until a result with ``call_id`` answers it."""
        if call_id:
            self._open.setdefault(call_id, []).append((self._turn, call))

    def answer(self, call_id: str | None) -> T | None:
        """The call ``call_id``'s result answers, now answered: of the latest turn with an
        open call of that id, the first one made; ``None`` when there is none (an unknown
        id, or its calls were answered already)."""
        if not call_id:
            return None
        pending = self._open.get(call_id)
        if not pending:
            return None
        latest = pending[-1][0]
        at = len(pending) - 1
        while at > 0 and pending[at - 1][0] == latest:
            at -= 1
        _, call = pending.pop(at)
        if not pending:
            del self._open[call_id]
        return call
