"""The ``with``-block handles of :meth:`Run.model_call` and :meth:`Run.tool_call`.

Each handle makes its span current for the block's body (so a client instrumented with
OpenTelemetry nests its spans under it), asks the run's guard on entry, and records the
block's end on exit. A handle belongs to one run and one call; it is not reusable.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from .errors import StopRun
from .failures import ToolNudged
from .outcomes import Decision, ToolRecord, ToolTicket

if TYPE_CHECKING:
    from ._tracing import RunTelemetry
    from .guard import Guard

__all__ = ["ModelCall", "ToolCallScope"]


class _ScopedRun(Protocol):
    """What a handle uses of its run (:class:`~loopwatch.instrumentation.runs.Run`
    implements it), so this module does not name the module that imports it."""

    guard: Guard
    _telemetry: RunTelemetry

    def _raise_if_stopped(self, verdict_stop: Any, *, refused: bool = False) -> None: ...

    def _start_tool(
        self, name: str, arguments: Mapping[str, Any], call_id: str | None
    ) -> tuple[ToolTicket, Span | None]: ...

    def _record_result(self, ticket: ToolTicket, span: Span | None, result: Any) -> ToolRecord: ...

    def _after_result(self, record: ToolRecord) -> None: ...


class _SpanScope:
    """The span of a ``with`` block made current for its body (so a tool or model client
    instrumented with OpenTelemetry nests its own spans under it), and restored after."""

    __slots__ = ("_span", "_token")

    def __init__(self) -> None:
        self._span: Span | None = None
        self._token: object | None = None

    def _enter_span(self, span: Span | None) -> None:
        self._span = span
        if span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(span))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token = self._token
        if token is not None:
            self._token = None
            otel_context.detach(token)  # type: ignore[arg-type]
        self._exit(exc)

    def _exit(self, exc: BaseException | None) -> None:
        """Record the block's end (``exc``: what it raised, if anything)."""


class ModelCall(_SpanScope):
    """Context manager returned by :meth:`Run.model_call`; ``with`` yields it as the
    handle (a class, not a generator: this runs once per model call)."""

    __slots__ = ("_cost", "_run", "_tokens", "decision", "stop")

    def __init__(
        self, run: _ScopedRun, tokens: int | None = None, cost: float | None = None
    ) -> None:
        super().__init__()
        self._run = run
        self._tokens = tokens
        self._cost = cost
        self.decision: Decision | None = None
        self.stop: Any = None

    def __enter__(self) -> ModelCall:
        run = self._run
        # The span starts when the check began: a call allowed before a stop made in
        # another thread must not start after the stop span.
        started = time.time_ns()
        verdict = run.guard.before_model_call(
            estimate_tokens=self._tokens, estimate_cost_usd=self._cost
        )
        run._raise_if_stopped(verdict.stop, refused=True)
        self._enter_span(run._telemetry.start_decision(start_time=started))
        return self

    def _exit(self, exc: BaseException | None) -> None:
        run = self._run
        if exc is not None:
            run._telemetry.end_decision(
                self._span, self.decision, error=None if isinstance(exc, StopRun) else exc
            )
            return
        run._telemetry.end_decision(self._span, self.decision)
        run._raise_if_stopped(self.stop)

    def record(self, decision: Decision) -> None:
        """Record the model's decision.

        Raises:
            TypeError: ``decision`` is not a :class:`Decision`.
        """
        if not isinstance(decision, Decision):
            raise TypeError(
                f"a loopwatch decision function must return loopwatch.instrumentation.Decision, "
                f"got {type(decision).__name__}"
            )
        self.decision = decision
        verdict = self._run.guard.record_decision(decision)
        if not verdict.allowed:
            self.stop = verdict.stop


class ToolCallScope(_SpanScope):
    """Context manager returned by :meth:`Run.tool_call`; ``with`` yields it as the handle
    (``ticket`` once entered, ``set_result``, and ``record`` after a normal exit).
    Entering raises :class:`~.failures.ToolNudged` when the ladder nudged the call."""

    __slots__ = ("_args", "_call_id", "_name", "_run", "record", "result", "ticket")

    def __init__(
        self, run: _ScopedRun, name: str, arguments: Mapping[str, Any], call_id: str | None
    ) -> None:
        super().__init__()
        self._run = run
        self._name = name
        self._args = arguments
        self._call_id = call_id
        self.ticket: ToolTicket | None = None
        self.result: Any = None
        self.record: ToolRecord | None = None

    def __enter__(self) -> ToolCallScope:
        run = self._run
        self.ticket, span = run._start_tool(self._name, self._args, self._call_id)
        if self.ticket.nudge is not None:
            # Raised on entry, the block's body cannot run: a nudged call is not made.
            raise ToolNudged(self.ticket.nudge, self.ticket)
        self._enter_span(span)
        return self

    def _exit(self, exc: BaseException | None) -> None:
        run = self._run
        ticket = self.ticket
        assert ticket is not None  # __exit__ runs only after a successful __enter__
        if exc is not None:
            if isinstance(exc, StopRun):
                record = run.guard.record_tool_result(ticket, error=RuntimeError("stopped"))
                run._telemetry.end_tool(self._span, record)
            else:
                record = run.guard.record_tool_result(ticket, error=exc)
                run._telemetry.end_tool(self._span, record, error=exc)
            return
        self.record = run._record_result(ticket, self._span, self.result)
        run._after_result(self.record)

    def set_result(self, value: Any) -> None:
        """The tool's result (recorded when the block exits)."""
        self.result = value
