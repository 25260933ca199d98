"""The decorators around an agent loop: ``@agent``, ``@decision``, ``@tool``.

Each finds the current :class:`~.runs.Run` through ``contextvars`` and delegates to it:
``@agent`` makes one run per call (a child run when called inside another), ``@decision``
guards a model call, ``@tool`` guards a tool call. Sync and async alike. In ``enforce``
mode a refused call raises :class:`~.errors.StopRun`, which ``@agent`` catches, so the
caller receives an :class:`~.outcomes.Outcome` (expected exits are data).

Example::

    @tool
    def search_orders(query: str, cursor: str | None = None) -> dict: ...

    @decision
    def decide(messages: list[dict]) -> Decision: ...

    @agent(name="support", policy=builtin_profiles()["investigate-readonly"])
    def support(task: str) -> str:
        messages = [{"role": "user", "content": task}]
        while True:
            d = decide(messages)
            if d.type == "final":
                return d.answer
            for call in d.tool_calls:
                messages.append(run_tool(call))

    outcome = support("Where is order 42?")
    outcome.stop.reason  # StopReason.COMPLETED, or why it was stopped
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from .errors import RunStateError
from .fingerprint import object_token
from .outcomes import Decision, Outcome
from .policy import Policy
from .runs import Mode, Run, current_run, open_runs, resolve_policy

__all__ = ["agent", "decision", "tool"]

P = ParamSpec("P")
R = TypeVar("R")
_logger = logging.getLogger("loopwatch.instrumentation")
_warned_tools: set[str] = set()
_MAX_WARNED_TOOLS = 1024


def _warn_outside_run(tool_name: str) -> None:
    """A ``@tool`` called with no current run while runs are open: most likely a thread
    (a ``ThreadPoolExecutor`` for parallel tool calls), which does not inherit the run's
    context, so the call is neither guarded nor traced. Logged once per tool (a log line,
    not a ``warnings`` warning: under ``-W error`` that would turn a legitimate call, in
    a server thread with no run of its own, into an exception)."""
    if open_runs() > 0 and tool_name not in _warned_tools:
        if len(_warned_tools) < _MAX_WARNED_TOOLS:
            _warned_tools.add(tool_name)
        _logger.warning(
            "tool %r called outside any run while a run is open in this process; it runs "
            "unguarded and untraced. A thread does not inherit the run: submit the call "
            "with contextvars.copy_context().run (see the README, 'Parallel tool calls').",
            tool_name[:80],
        )


def _require_run(what: str) -> Run:
    run = current_run()
    if run is None:
        raise RunStateError(
            f"{what} called outside a run: decorate the loop with @agent or use Run"
        )
    return run


@overload
def agent(fn: Callable[P, R], /) -> Callable[P, Outcome]: ...


@overload
def agent(
    *,
    name: str | None = None,
    policy: Policy | str | os.PathLike[str] | None = None,
    mode: Mode = "enforce",
    goal_check: Callable[[Any], bool] | None = None,
    **run_kwargs: Any,
) -> Callable[[Callable[P, R]], Callable[P, Outcome]]: ...


def agent(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    policy: Policy | str | os.PathLike[str] | None = None,
    mode: Mode = "enforce",
    goal_check: Callable[[Any], bool] | None = None,
    **run_kwargs: Any,
) -> Any:
    """Decorate an agent loop function (sync or async); each call is one run.

    The decorated function returns an :class:`Outcome` instead of the loop's value; the
    loop's return value is the final answer unless a ``final`` decision was recorded.
    A call made inside another run becomes a child run (it draws from the parent's
    budget); made after that run stopped, the child ends as ``cancelled`` (evidence
    ``parent_stopped``) without calling the function. The policy is resolved at
    decoration time, so an invalid policy fails before any model or tool call.

    Args:
        name: agent name (default: the function's name).
        policy / mode / goal_check / run_kwargs: as for :class:`Run`.

    Raises:
        PolicyError: invalid policy (at decoration time).
        Exception: an unexpected exception of the loop, after the run was stopped as
            ``error`` (the exception type is the evidence).
    """

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        agent_name = name or func.__name__
        resolved = resolve_policy(policy)

        def make_run() -> Run:
            parent = current_run()
            if parent is None:
                return Run(agent_name, resolved, mode=mode, goal_check=goal_check, **run_kwargs)
            if parent.stopped:
                # Not a fresh root run: one would escape the stopped parent's budget and
                # make calls after its stop. A child that ends as cancelled makes none.
                return parent._child_after_stop(
                    agent_name, resolved if policy is not None else None, goal_check, run_kwargs
                )
            return parent.child(
                agent_name,
                resolved if policy is not None else None,
                goal_check=goal_check,
                **run_kwargs,
            )

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Outcome:
                run = make_run()
                async with run:
                    if not run.stopped:
                        answer = await func(*args, **kwargs)
                        run.finish(answer)
                return run.outcome

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Outcome:
            run = make_run()
            with run:
                if not run.stopped:
                    answer = func(*args, **kwargs)
                    run.finish(answer)
            return run.outcome

        return wrapper

    return wrap(fn) if fn is not None else wrap


def decision(
    fn: Callable[P, R] | None = None,
    /,
    *,
    estimate_tokens: Callable[..., int] | None = None,
) -> Any:
    """Decorate the function that asks the model; it must return a :class:`Decision`.

    The guard checks and reserves the model turn before the function runs, and records
    the decision after (``decide {agent}`` span). Sync and async.

    Args:
        estimate_tokens: optional ``(*args, **kwargs) -> int`` giving the projected
            tokens of the call (checked against ``max_tokens`` before the call).

    Raises:
        StopRun: the guard refused the call or the decision ended the run (caught by
            ``@agent``).
        RunStateError: called outside a run.
    """

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Decision:
                run = _require_run("a @decision function")
                est = estimate_tokens(*args, **kwargs) if estimate_tokens else None
                return await run.adecide(func, *args, estimate_tokens=est, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Decision:
            run = _require_run("a @decision function")
            est = estimate_tokens(*args, **kwargs) if estimate_tokens else None
            return run.decide(func, *args, estimate_tokens=est, **kwargs)

        return wrapper

    return wrap(fn) if fn is not None else wrap


def tool(fn: Callable[P, R] | None = None, /, *, name: str | None = None) -> Any:
    """Decorate a tool (sync or async). Inside a run, each call is guarded and traced.

    The call's arguments are bound to the signature (defaults applied) and fingerprinted
    by name; a method's ``self`` or ``cls`` counts by identity (the same instance, not
    its changing fields). The per-call timeout applies: a sync tool runs in a loopwatch
    worker thread (so objects bound to the calling thread, such as a ``sqlite3``
    connection, do not work in it); an async tool is cancelled at its timeout.

    Outside a run the tool runs unguarded. Called so while a run is open in the process
    (from a thread of a pool, which does not inherit the run), it logs a warning once
    per tool (logger ``loopwatch.instrumentation``): submit such calls with
    ``contextvars.copy_context().run``.

    When the policy's ladder nudges a call (:mod:`.ladder`), the function does not run
    and the call returns the nudge text instead: the model reads it as the tool's result.

    Args:
        name: tool name (default: the function's name).

    Raises:
        TypeError: at decoration, ``fn`` is a generator function (its body would run
            after the guarded call returned).
        StopRun: refused and the run ended (caught by ``@agent``).
        ToolFailure: unknown tool (``strict_tools`` policy or a ``tools`` registry).
        TimeoutError: the call timed out.
    """

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        tool_name = name or func.__name__
        unwrapped = inspect.unwrap(func)
        if inspect.isgeneratorfunction(unwrapped) or inspect.isasyncgenfunction(unwrapped):
            # Calling one only builds the generator: the guard would record a success
            # before the body ran, and the body would run unguarded, untimed, unrecorded.
            raise TypeError(
                f"@tool {tool_name!r} is a generator function: a guarded call must return "
                "its result (return a list, or decorate a function that consumes it)"
            )
        sig = inspect.signature(func)
        params = list(sig.parameters)
        # A method's receiver is part of the action by identity only: its fields
        # (counters, caches) change on every call and would make identical calls look
        # new, while two instances (prod and staging clients) are two actions. A plain
        # function whose first parameter happens to be called self or cls is left as is.
        owner, _, _ = func.__qualname__.rpartition(".")
        in_class = bool(owner) and not owner.endswith("<locals>")
        receiver = params[0] if in_class and params and params[0] in ("self", "cls") else None

        def arguments(bound: inspect.BoundArguments) -> dict[str, Any]:
            out = dict(bound.arguments)
            if receiver is not None and receiver in out:
                out[receiver] = object_token(out[receiver])
            return out

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                run = current_run()
                if run is None:
                    _warn_outside_run(tool_name)
                    return await func(*args, **kwargs)
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                return await run.acall_tool(
                    tool_name,
                    arguments(bound),
                    _invoke=functools.partial(func, *bound.args, **bound.kwargs),
                    _is_async=True,
                )

            async_wrapper.__loopwatch_tool__ = tool_name  # type: ignore[attr-defined]
            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            run = current_run()
            if run is None:
                _warn_outside_run(tool_name)
                return func(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            return run.call_tool(
                tool_name,
                arguments(bound),
                _invoke=functools.partial(func, *bound.args, **bound.kwargs),
            )

        wrapper.__loopwatch_tool__ = tool_name  # type: ignore[attr-defined]
        return wrapper

    return wrap(fn) if fn is not None else wrap
