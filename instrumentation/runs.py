"""The run API: :class:`Run`, one execution of an agent loop (guard + spans + context).

:class:`Run` is an explicit context manager, for code that cannot be decorated; the
decorators (:mod:`.decorators`) use it too. The current run is found through
``contextvars`` (:func:`current_run`).

In ``enforce`` mode the guard ends the loop: a refused call raises :class:`StopRun`
inside the loop, which ``Run`` (and ``@agent``) catch, so the caller receives an
:class:`Outcome` (expected exits are data). In ``observe`` mode nothing is refused; the
stops the guard would have made are recorded on the spans and in the outcome. Once a run
has ended, in either mode (in ``observe`` mode: a final answer, a refusal, a cancelled
parent), a model or tool call it is asked for is not made: it raises :class:`StopRun`.

Example::

    with Run("support", policy, tools={"lookup": lookup}) as run:
        while True:
            d = run.decide(model, messages)  # checked before the call, recorded after
            if d.type == "final":
                break
            for call in d.tool_calls:
                messages.append(run.call_tool(call.name, call.arguments))
    run.outcome.stop.reason  # StopReason.COMPLETED, or why it was stopped
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, TracerProvider

from . import _content
from ._scopes import ModelCall, ToolCallScope
from ._tracing import RunTelemetry
from .errors import RunStateError, StopRun
from .failures import FailureClass, ToolFailure
from .guard import Guard
from .outcomes import Decision, Outcome, StopReason, ToolRecord, ToolTicket
from .policy import Policy, builtin_profiles, load_policy

__all__ = ["Run", "current_run"]

Mode = Literal["enforce", "observe"]

_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("loopwatch_run", default=None)
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
_open_runs = 0  # runs started and not yet ended, in this process
_open_runs_lock = threading.Lock()


def _count_open(delta: int) -> None:
    global _open_runs
    with _open_runs_lock:
        _open_runs += delta


def open_runs() -> int:
    """How many runs are started and not yet ended in this process."""
    return _open_runs


def current_run() -> Run | None:
    """The run of the current context (thread or asyncio task), or None."""
    return _current.get()


def _timed_out(name: str, ticket: ToolTicket) -> TimeoutError:
    """loopwatch's own ``TimeoutError`` for a call that passed its deadline."""
    return TimeoutError(f"tool {name[:80]!r} timed out after {ticket.timeout_seconds:.3g} s")


def _is_coroutine_callable(target: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(target) or (
        target is not None
        and not inspect.isroutine(target)
        and inspect.iscoroutinefunction(getattr(target, "__call__", None))  # noqa: B004
    )


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _not_awaitable(name: str, invoke: Callable[[], Any]) -> Any:
    """``invoke()`` in a worker thread for a sync call. An awaitable result is refused as
    the tool's error: recorded as a success, the tool's work (the coroutine's body) was
    never done, and would be done unguarded and untimed if the caller awaited it."""
    result = invoke()
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(
            f"tool {name[:80]!r} returned an awaitable to a sync call: call it with "
            "acall_tool (or @tool an async function) in an async agent"
        )
    return result


def _tool_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=32, thread_name_prefix="loopwatch-tool"
            )
        return _executor


def resolve_policy(policy: Policy | str | os.PathLike[str] | None) -> Policy:
    """The run's policy with ``LOOPWATCH_POLICY_<FIELD>`` applied whatever its origin
    (a file, a built-in profile, a :class:`Policy` built in code, the defaults); limits
    set in code keep their value (call > env > file > default), and a policy the
    environment was already applied to (``load_policy``, ``with_env``; ``environ={}``
    to opt out) is taken as it is.

    Raises:
        PolicyError: an invalid file, profile or environment value.
    """
    if policy is None:
        return Policy().with_env()
    if isinstance(policy, Policy):
        return policy if policy.env_applied else policy.with_env()
    text = os.fspath(policy)
    builtin = builtin_profiles()
    if text in builtin:
        return builtin[text].with_env()
    path, _, profile = (
        text.partition(":") if ":" in text and not os.path.exists(text) else (text, "", "")
    )
    return load_policy(path, profile or None)


class Run:
    """One execution of an agent loop: guard + spans + the current-run context.

    Args:
        agent: agent name (low cardinality; it appears in span names and metric labels).
        policy: a :class:`Policy`, a built-in profile name, or ``FILE[:PROFILE]``.
        mode: ``enforce`` (refuse and stop) or ``observe`` (record only).
        goal_check: ``answer -> bool`` run on the final answer.
        tools: ``{name: callable}`` the loop may call by name through :meth:`call_tool`;
            when given, any other name is an unknown tool.
        capture_content: record tool arguments and results on spans (truncated and
            scrubbed). None: follow ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
        clock: monotonic clock in seconds (inject a fake one in tests).
        run_id: the run id (random when omitted).
        tracer_provider: where spans go (the global provider when None).
        agent_id / conversation_id: optional GenAI attributes.
        guard: resume with an existing guard (see :meth:`resume`).

    Raises:
        PolicyError: an invalid policy file or profile (before any model or tool call).
    """

    guard: Guard
    _provider: TracerProvider | None

    def __init__(
        self,
        agent: str,
        policy: Policy | str | os.PathLike[str] | None = None,
        *,
        mode: Mode = "enforce",
        goal_check: Callable[[Any], bool] | None = None,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        capture_content: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        run_id: str | None = None,
        tracer_provider: TracerProvider | None = None,
        agent_id: str | None = None,
        conversation_id: str | None = None,
        guard: Guard | None = None,
        _parent: Run | None = None,
    ) -> None:
        resolved = guard.policy if guard is not None else resolve_policy(policy)
        self.agent = agent
        self.mode: Mode = mode
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.capture_content = _content.capture_enabled(capture_content)
        # A nudge may quote the previous result only as captured content would be.
        preview = _content.capture_json if self.capture_content else None
        if guard is None:
            if _parent is not None:
                guard = _parent.guard.child(
                    resolved if policy is not None else None,
                    run_id=run_id,
                    mode=mode,
                    goal_check=goal_check,
                    known_tools=self.tools or None,
                )
            else:
                guard = Guard(
                    resolved,
                    clock=clock,
                    mode=mode,
                    goal_check=goal_check,
                    run_id=run_id,
                    known_tools=self.tools or None,
                    scrub=_content.scrub_for_digest(),
                    result_preview=preview,
                )
        self.guard = guard
        self._telemetry = RunTelemetry(
            agent,
            guard,
            tracer_provider=tracer_provider or (_parent._provider if _parent else None),
            parent_run_id=_parent.run_id if _parent is not None else None,
            agent_id=agent_id,
            conversation_id=conversation_id,
        )
        self._provider = tracer_provider
        self._token: contextvars.Token[Run | None] | None = None
        self._managed = False  # entered with ``with``: it stops being current at the exit
        self._otel_token: object | None = None
        self._outcome: Outcome | None = None
        self._close_lock = threading.Lock()
        self._started = False
        self._counted = False  # counted in _open_runs

    # ----------------------------------------------------------------- basics

    @property
    def run_id(self) -> str:
        """The run's id (``loopwatch.run.id``)."""
        return self.guard.run_id

    @property
    def outcome(self) -> Outcome:
        """The outcome, once the run has ended.

        Raises:
            RunStateError: the run has not ended.
        """
        if self._outcome is None:
            raise RunStateError("the run has not ended yet")
        return self._outcome

    @property
    def stopped(self) -> bool:
        """True once the guard has ended the run."""
        return self.guard.stopped

    def start(self) -> Run:
        """Start the run span and make this the current run (``with`` does this)."""
        if not self._started:
            self._started = True
            if self._outcome is None:  # a run finished before it started is not open
                self._counted = True
                _count_open(1)
            self._telemetry.start_run(self.mode)
        self._token = _current.set(self)
        ctx = self._telemetry.run_context
        if ctx is not None:
            self._otel_token = otel_context.attach(ctx)
        return self

    def _detach(self) -> None:
        if self._otel_token is not None:
            try:
                otel_context.detach(self._otel_token)  # type: ignore[arg-type]
            except Exception:  # a context detached in another task is not the agent's problem
                self._otel_token = None
            self._otel_token = None
        if self._token is not None:
            try:
                _current.reset(self._token)
            except ValueError:
                _current.set(None)
            self._token = None

    def __enter__(self) -> Run:
        self._managed = True
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            if exc is None:
                self.finish()
                return False
            if isinstance(exc, StopRun):
                self._close(self.guard.outcome())
                return True
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                self._close(self.guard.cancel())
                return False
            self._close(self.guard.fail(exc))
            return False
        finally:
            self._detach()

    async def __aenter__(self) -> Run:
        self._managed = True
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)

    def _close(self, outcome: Outcome) -> Outcome:
        # Threads of one run may end it together: one outcome, one stop span.
        with self._close_lock:
            if self._outcome is None:
                self._outcome = outcome
                if self._counted:
                    self._counted = False
                    _count_open(-1)
                self._telemetry.stop(outcome)
            return self._outcome

    def finish(self, answer: Any = None) -> Outcome:
        """End the run (a return without a ``final`` decision: ``answer`` is final).

        A run started with :meth:`start` rather than ``with`` also stops being the current
        run here: an ``@agent`` called after it is a run of its own, not a child of an
        ended run (which ends as ``cancelled`` before it makes any call).
        """
        return self._ended(self._close(self.guard.finish(answer)))

    def _ended(self, outcome: Outcome) -> Outcome:
        if not self._managed and _current.get() is self:
            self._detach()
        return outcome

    def cancel(self) -> Outcome:
        """End the run as ``cancelled`` (a run started with :meth:`start` also stops
        being the current run, as with :meth:`finish`)."""
        return self._ended(self._close(self.guard.cancel()))

    def framework_stop(self, reason: StopReason, **facts: Any) -> Outcome:
        """End the run because the framework's own limit stopped it; ``facts`` as for
        :meth:`Guard.framework_stop` (``framework``, ``limit_name``, ``dimension``,
        ``limit``, ``observed``, ``tool``)."""
        return self._ended(self._close(self.guard.framework_stop(reason, **facts)))

    def _raise_if_stopped(self, verdict_stop: Any, *, refused: bool = False) -> None:
        """End the loop with :class:`StopRun` when the guard stopped the run: in
        ``enforce`` mode, and in ``observe`` mode too for a call ``refused`` because the
        run had ended (a final answer, a refusal, a cancelled parent): a model or tool call
        after the stop would run unguarded, its span after the stop span."""
        if verdict_stop is not None and (refused or self.mode == "enforce"):
            self._close(self.guard.outcome())
            raise StopRun(verdict_stop)

    def progress(self, note: str | None = None) -> None:
        """Record explicit progress evidence from the environment (never the model's): a
        user reply, a changed ticket. Resets the no-progress count and starts a new count of
        identical actions (see :meth:`Guard.progress`)."""
        self.guard.progress(note)

    def provided(self, *fields: str) -> None:
        """Note fields the user has provided (evidence for re-asks)."""
        self.guard.provided(*fields)

    # ---------------------------------------------------------------- children

    def child(
        self,
        agent: str,
        policy: Policy | str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> Run:
        """A child run drawing from this run's remaining budget (see :meth:`Guard.child`)."""
        return Run(agent, policy, mode=kwargs.pop("mode", self.mode), _parent=self, **kwargs)

    def _child_after_stop(
        self,
        agent: str,
        policy: Policy | None,
        goal_check: Callable[[Any], bool] | None,
        run_kwargs: Mapping[str, Any],
    ) -> Run:
        """The child run of a nested ``@agent`` call made after this run stopped: already
        ended as ``cancelled`` (evidence ``parent_stopped``), so it makes no call."""
        kwargs = dict(run_kwargs)
        mode = kwargs.pop("mode", self.mode)
        tools = kwargs.get("tools")
        guard = self.guard.child(
            policy,
            run_id=kwargs.pop("run_id", None),
            mode=mode,
            goal_check=goal_check,
            known_tools=list(tools) if tools else None,
            _after_stop=True,
        )
        return Run(agent, policy, mode=mode, guard=guard, _parent=self, **kwargs)

    def snapshot(self) -> dict[str, Any]:
        """Serialize the run's usage and detector state (see :meth:`Guard.snapshot`)."""
        return self.guard.snapshot()

    @classmethod
    def resume(
        cls,
        agent: str,
        policy: Policy | str | os.PathLike[str] | None,
        state: Mapping[str, Any],
        **kwargs: Any,
    ) -> Run:
        """Resume a run from :meth:`snapshot`: usage and windows carry over, no fresh budget.

        Raises:
            ValueError: not a snapshot, or the run had stopped.
        """
        resolved = resolve_policy(policy)
        tools = kwargs.get("tools")
        guard = Guard.restore(
            resolved,
            state,
            clock=kwargs.pop("clock", time.monotonic),
            mode=kwargs.get("mode", "enforce"),
            goal_check=kwargs.pop("goal_check", None),
            known_tools=list(tools) if tools else None,
            scrub=_content.scrub_for_digest(),
        )
        return cls(agent, resolved, guard=guard, **kwargs)

    # -------------------------------------------------------------- decisions

    def model_call(
        self, *, estimate_tokens: int | None = None, estimate_cost_usd: float | None = None
    ) -> ModelCall:
        """Guard one model call: checked and reserved before, recorded after.

        A context manager: use ``with run.model_call() as call:`` and ``call.record(decision)``
        inside the block. The ``decide`` span is current inside the block, so model-call
        spans of other instrumentations nest in it.

        Raises:
            StopRun: the guard refused the call (enforce mode), or the decision ended it.
        """
        return ModelCall(self, estimate_tokens, estimate_cost_usd)

    def decide(
        self,
        fn: Callable[..., Decision],
        *args: Any,
        estimate_tokens: int | None = None,
        estimate_cost_usd: float | None = None,
        **kwargs: Any,
    ) -> Decision:
        """Call the model function ``fn`` under the guard and record its :class:`Decision`.

        Raises:
            StopRun: refused before the call, or the decision ended the run.
            TypeError: ``fn`` did not return a Decision.
        """
        with self.model_call(
            estimate_tokens=estimate_tokens, estimate_cost_usd=estimate_cost_usd
        ) as call:
            decision = fn(*args, **kwargs)
            call.record(decision)
        return decision

    async def adecide(
        self,
        fn: Callable[..., Awaitable[Decision]],
        *args: Any,
        estimate_tokens: int | None = None,
        estimate_cost_usd: float | None = None,
        **kwargs: Any,
    ) -> Decision:
        """Async :meth:`decide`."""
        with self.model_call(
            estimate_tokens=estimate_tokens, estimate_cost_usd=estimate_cost_usd
        ) as call:
            decision = await fn(*args, **kwargs)
            call.record(decision)
        return decision

    # ------------------------------------------------------------------ tools

    def _record_result(self, ticket: ToolTicket, span: Span | None, result: Any) -> ToolRecord:
        """Record a tool's result and end its span."""
        record = self.guard.record_tool_result(ticket, result=result)
        result_json = _content.capture_json(result) if self.capture_content else None
        self._telemetry.end_tool(span, record, result_json=result_json)
        return record

    def _after_result(self, record: ToolRecord) -> None:
        """A result that completed a loop (a cycle) ends the run in enforce mode."""
        self._raise_if_stopped(record.verdict.stop)

    def _invoker(
        self, name: str, args: dict[str, Any], fn: Callable[..., Any] | None
    ) -> Callable[[], Any]:
        target = fn if fn is not None else self.tools.get(name)
        if target is None:
            if not self.tools:
                raise RunStateError(f"no callable for tool {name[:80]!r}: pass fn= or tools=")

            def unknown() -> Any:
                raise ToolFailure(f"unknown tool: {name[:80]}", FailureClass.UNKNOWN_TOOL)

            return unknown
        return functools.partial(target, **args)

    def _start_tool(
        self, name: str, arguments: Mapping[str, Any], call_id: str | None
    ) -> tuple[ToolTicket, Span | None]:
        """Check one tool call; returns the allowed ticket and the tool span, started when
        the check began (a call allowed before a stop made in another thread must not
        start after the stop span), or a nudged ticket (``ticket.nudge``) and no span:
        the call must not run."""
        if self._outcome is not None and self.mode == "enforce":
            raise StopRun(self._outcome.stop)
        started = time.time_ns()
        ticket = self.guard.before_tool_call(name, arguments, call_id=call_id)
        args_json = _content.capture_json(arguments) if self.capture_content else None
        if ticket.nudge is not None:  # not run: the caller gives the model the nudge
            result_json = _content.capture_json(ticket.nudge) if self.capture_content else None
            self._telemetry.nudged_tool(ticket, args_json, result_json, start_time=started)
            return ticket, None
        if not ticket.allowed:
            if ticket.blocked_by == "run_stopped":
                self._raise_if_stopped(ticket.stop, refused=True)
            self._telemetry.blocked_tool(ticket, args_json, start_time=started)
            self._raise_if_stopped(ticket.stop, refused=True)
            if ticket.blocked_by == "ceiling":
                raise ToolFailure(
                    f"tool {name[:80]!r} refused for now: every tool-success slot left is "
                    "held by calls in flight",
                    FailureClass.TRANSIENT,
                )
            raise ToolFailure(f"unknown tool: {name[:80]}", FailureClass.UNKNOWN_TOOL)
        return ticket, self._telemetry.start_tool(ticket, args_json, start_time=started)

    def tool_call(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None
    ) -> ToolCallScope:
        """Guard one tool call that the caller runs itself (no timeout enforcement).

        A context manager: ``with run.tool_call(name, args) as call:``; inside the block
        call ``call.set_result(value)``; an exception raised in the block is recorded as
        the tool's error and re-raised.

        A call the policy's ladder nudges (:mod:`.ladder`) raises :class:`ToolNudged` on
        entry, so the block's body never runs; its ``text`` is the call's result for the
        model::

            try:
                with run.tool_call("search", {"q": "x"}) as call:
                    call.set_result(search(q="x"))
                result = call.result
            except ToolNudged as nudged:
                result = nudged.text

        Raises:
            ToolNudged: the ladder nudged the call (the run goes on).
            StopRun: the guard refused the call and ended the run (enforce mode).
            ToolFailure: not dispatched: an unknown tool (class ``unknown_tool``), or every
                tool-success slot left is held by calls in flight (class ``transient``;
                the run goes on, try again once they return).
        """
        return ToolCallScope(self, name, arguments if arguments is not None else {}, call_id)

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        fn: Callable[..., Any] | None = None,
        call_id: str | None = None,
        _invoke: Callable[[], Any] | None = None,
    ) -> Any:
        """Dispatch a tool under the guard, with its per-call timeout.

        Args:
            name: tool name.
            arguments: keyword arguments for the tool.
            fn: the callable; defaults to ``tools[name]`` given to the run.
            call_id: the model's tool-call id.

        Returns:
            The tool's result, or the nudge text when the policy's ladder nudged the call
            (:mod:`.ladder`; the tool did not run, the model reads the nudge as its
            result; code that must tell the two apart uses :meth:`tool_call`, which
            raises :class:`ToolNudged`).

        Raises:
            StopRun / ToolFailure: refused, as for :meth:`tool_call`.
            TimeoutError: the call exceeded its timeout (the tool's own, capped by the
                run's remaining wall clock); a result arriving later is discarded.
            TypeError: the tool returned an awaitable (an async function): recorded as
                the tool's error, its body not run; use :meth:`acall_tool`.
            Exception: whatever the tool raised, after it was recorded.
        """
        args = dict(arguments or {})
        invoke = _invoke or self._invoker(name, args, fn)
        ticket, span = self._start_tool(name, args, call_id)
        if ticket.nudge is not None:
            return ticket.nudge
        ctx = contextvars.copy_context()
        if span is not None:
            ctx.run(otel_context.attach, trace.set_span_in_context(span))
        future = _tool_executor().submit(ctx.run, _not_awaitable, name, invoke)
        try:
            result = future.result(timeout=max(ticket.timeout_seconds, 0.0))
        except BaseException as exc:
            # concurrent.futures.TimeoutError is the built-in TimeoutError since Python
            # 3.11: it is our deadline unless the tool raised it itself (then it is the
            # tool's own error, passed on as is like any other).
            if isinstance(exc, TimeoutError) and not (
                future.done() and not future.cancelled() and future.exception() is exc
            ):
                future.cancel()
                err = _timed_out(name, ticket)
                self._end_failed_tool(ticket, span, err, FailureClass.TIMEOUT)
                raise err from None
            self._end_failed_tool(ticket, span, exc)
            raise
        self._after_result(self._record_result(ticket, span, result))
        return result

    def _end_failed_tool(
        self,
        ticket: ToolTicket,
        span: Span | None,
        error: BaseException,
        failure_class: FailureClass | None = None,
    ) -> None:
        """Record a dispatched call that raised (or timed out) and end its span."""
        record = self.guard.record_tool_result(ticket, error=error, failure_class=failure_class)
        self._telemetry.end_tool(span, record, error=error)

    async def acall_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        fn: Callable[..., Any] | None = None,
        call_id: str | None = None,
        _invoke: Callable[[], Any] | None = None,
        _is_async: bool | None = None,
    ) -> Any:
        """Async :meth:`call_tool`: a coroutine tool (an ``async def`` function or an
        object with an async ``__call__``) is awaited with ``asyncio.wait_for``
        (cancelled at its timeout); a sync tool runs in a worker thread, and an awaitable
        it returns is awaited within what is left of the timeout."""
        args = dict(arguments or {})
        target = fn if fn is not None else self.tools.get(name)
        invoke = _invoke or self._invoker(name, args, fn)
        is_async = _is_async if _is_async is not None else _is_coroutine_callable(target)
        ticket, span = self._start_tool(name, args, call_id)
        if ticket.nudge is not None:
            return ticket.nudge
        token = otel_context.attach(trace.set_span_in_context(span)) if span is not None else None
        began = time.monotonic()
        try:
            if is_async:
                result = await asyncio.wait_for(invoke(), timeout=ticket.timeout_seconds)
            else:
                loop = asyncio.get_running_loop()
                ctx = contextvars.copy_context()
                result = await asyncio.wait_for(
                    loop.run_in_executor(_tool_executor(), functools.partial(ctx.run, invoke)),
                    timeout=ticket.timeout_seconds,
                )
                if inspect.isawaitable(result):
                    # A callable that returns a coroutine (a lambda around an async
                    # function): the tool's work is still to do, within what is left of
                    # its timeout.
                    left = ticket.timeout_seconds - (time.monotonic() - began)
                    result = await asyncio.wait_for(_awaited(result), timeout=max(left, 0.0))
        except BaseException as exc:
            # asyncio.wait_for's own timeout comes from a cancellation at the deadline; a
            # TimeoutError the tool raised (or let through) is its own error, passed on.
            if (
                isinstance(exc, TimeoutError)
                and isinstance(exc.__cause__, asyncio.CancelledError)
                and time.monotonic() - began >= ticket.timeout_seconds
            ):
                err = _timed_out(name, ticket)
                self._end_failed_tool(ticket, span, err, FailureClass.TIMEOUT)
                raise err from None
            self._end_failed_tool(ticket, span, exc)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
        self._after_result(self._record_result(ticket, span, result))
        return result
