"""Exceptions raised by ``loopwatch.instrumentation``.

Expected exits of an agent loop are data (an :class:`~loopwatch.instrumentation.Outcome`),
not exceptions. The tree below covers misuse and control flow only::

    BaseException
    └── StopRun                 control flow: the guard ended the run; caught by the
                                 ``@agent`` decorator and the ``Run`` context manager.
                                 A BaseException so that an agent's ``except Exception``
                                 cannot swallow the stop (like ``asyncio.CancelledError``).
    Exception
    └── LoopwatchError
        ├── PolicyError (also ValueError)   invalid policy; ``problems`` lists every one
        ├── RunStateError                   the run is closed, or no run is current
        └── ScriptExhaustedError            a ``ScriptedModel`` was asked for more turns
                                             than it was given (testing kit)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .outcomes import Stop

__all__ = [
    "LoopwatchError",
    "PolicyError",
    "PolicyProblem",
    "RunStateError",
    "ScriptExhaustedError",
    "StopRun",
]


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One problem found while validating a policy.

    Attributes:
        path: dotted location, e.g. ``profiles.investigate-readonly.max_tokens``.
        reason: what is wrong, e.g. ``must be a finite number >= 0, got -1``.
        source: the file the value came from, or ``"<code>"``/``"<env>"``.
    """

    path: str
    reason: str
    source: str = "<code>"

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.reason}"


class LoopwatchError(Exception):
    """Base class of every loopwatch exception raised for misuse."""


class PolicyError(LoopwatchError, ValueError):
    """A policy (file, profile, override) is invalid.

    Attributes:
        problems: every problem found, not just the first.
    """

    def __init__(self, problems: Sequence[PolicyProblem]) -> None:
        self.problems: tuple[PolicyProblem, ...] = tuple(problems)
        first = str(self.problems[0]) if self.problems else "invalid policy"
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        super().__init__(first + more)


class RunStateError(LoopwatchError):
    """An operation needs an open run: none is current, or the run has stopped."""


class ScriptExhaustedError(LoopwatchError):
    """A strict scripted model was called after its script ran out."""


class StopRun(BaseException):
    """Raised inside an agent loop when the guard has ended the run.

    The ``@agent`` decorator and the ``Run`` context manager catch it and turn it into
    the run's :class:`Outcome`; agent code normally never sees it.

    Attributes:
        stop: the :class:`Stop` that ended the run.
    """

    def __init__(self, stop: Stop) -> None:
        self.stop = stop
        super().__init__(stop.message)
