"""loopwatch's guard inside pydantic-ai, as one of its capabilities.

Setup (one line)::

    from loopwatch.instrumentation.integrations.pydantic_ai import Loopwatch, outcome_of

    agent = Agent(model, name="support", capabilities=[Loopwatch("investigate-readonly")])
    try:
        result = await agent.run("...")            # or run_sync, iter, run_stream
        outcome_of(result).stop.reason             # StopReason.COMPLETED
    except RunCancelled as exc:                    # the guard stopped the run
        outcome_of(exc).stop.reason                # StopReason.REPEATED_ACTION, ...

What it hooks (pydantic-ai 2.68 capabilities, ``pydantic_ai.capabilities.AbstractCapability``):

- ``for_run``: a fresh copy per agent run, so one agent serves concurrent runs; one loopwatch
  :class:`~loopwatch.instrumentation.Run` per invocation, named after ``Agent.name``.
- ``wrap_model_request``: each model request is checked before it is sent and recorded
  after it (tokens from ``ModelResponse.usage``; cost from ``usage.cost`` when pydantic-ai
  priced it, else genai-prices). A turn with tool calls is a ``tool`` decision; a turn
  without (text or an output tool) is a ``message``: pydantic-ai may still reject it in
  output validation, so the run is finished with the validated output when the run ends.
- ``wrap_tool_execute``: every function tool call (plain functions, ``Tool`` objects,
  toolsets, MCP servers; sync tools run in pydantic-ai's threads, async ones awaited) runs
  inside :meth:`Run.tool_call`, after validation, so a refused call never runs its body.
  Output and deferred tools are not guarded (they end or pause the run). A call the
  policy's ladder nudges is not run: the nudge text is the tool's return (a
  ``ToolReturnPart`` the model reads), not a retry prompt.
- ``wrap_run``: ends the loopwatch run with the run's result or error. pydantic-ai's
  ``UsageLimitExceeded`` becomes ``budget_exhausted`` (``request_limit`` -> model_turns,
  ``tool_calls_limit`` -> tool_attempts, token limits -> tokens, ``cost_limit`` -> cost).

A stop ends the run pydantic-ai's own way: ``RunContext.cancel()``, so the caller gets
``RunCancelled`` with the messages and usage so far (resumable). The loopwatch ``Outcome``
is :func:`outcome_of` the result or the exception.

Tool risk: MCP tool annotations reach pydantic-ai as ``ToolDefinition.metadata
["annotations"]``; ``readOnlyHint`` true is ``read``, ``readOnlyHint`` false or
``destructiveHint`` true is ``write`` (via :meth:`Policy.with_tool_risks`, the policy file
wins). A function tool can declare the same with ``metadata={"annotations": {...}}``. The
tools are read at the run's first model request, so the run span starts there.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal, NoReturn

from opentelemetry import context as otel_context
from opentelemetry.trace import TracerProvider

from ..errors import StopRun
from ..failures import ToolNudged
from ..outcomes import Dimension, Outcome, StopReason
from ..policy import Policy
from ..runs import Run, resolve_policy
from ._common import import_framework, mcp_risk, price_of, turn_decision

import_framework("pydantic_ai", "pydantic-ai")

from pydantic_ai import UsageLimitExceeded  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402

__all__ = ["Loopwatch", "LoopwatchStopped", "outcome_of", "tool_risks"]

FRAMEWORK = "pydantic-ai"
_OUTCOME_ATTR = "loopwatch_outcome"
_REMEMBERED_RUNS = 1024  # outcomes kept (process-wide) for outcome_of(RunCancelled)
_CANCEL_GRACE_SECONDS = 5.0
_LIMIT = re.compile(r"(\w+_limit)`? of ([0-9.]+)")
# pydantic-ai's limit names (pydantic_ai.usage.UsageLimits fields) -> loopwatch dimension.
_DIMENSIONS = {
    "request_limit": Dimension.MODEL_TURNS,
    "tool_calls_limit": Dimension.TOOL_ATTEMPTS,
    "input_tokens_limit": Dimension.TOKENS,
    "output_tokens_limit": Dimension.TOKENS,
    "total_tokens_limit": Dimension.TOKENS,
    "per_request_input_tokens_limit": Dimension.TOKENS,
    "cost_limit": Dimension.COST,
}


class LoopwatchStopped(RuntimeError):
    """Raised instead of ``RunCancelled`` when pydantic-ai cannot cancel the run (a run
    context with no live run, as across a durable-execution boundary).

    Attributes:
        outcome: the loopwatch :class:`Outcome`.
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.message)
        self.outcome = outcome


def outcome_of(result_or_error: object) -> Outcome | None:
    """The loopwatch :class:`Outcome` of a pydantic-ai run.

    Args:
        result_or_error: the ``AgentRunResult`` the run returned, or the exception it
            raised (``RunCancelled`` when loopwatch stopped it, ``UsageLimitExceeded``, or
            any other error).

    Returns:
        The outcome, or None when no :class:`Loopwatch` capability ran that run.
    """
    found = getattr(result_or_error, _OUTCOME_ATTR, None)
    if isinstance(found, Outcome):
        return found
    run_id = getattr(result_or_error, "run_id", None)
    return _Registry.outcomes.get(run_id) if isinstance(run_id, str) else None


class _Registry:
    """Outcomes by pydantic-ai run id: ``RunCancelled`` is built after the capability's
    hooks have returned, so the outcome cannot be attached to it; it carries the run id."""

    outcomes: ClassVar[OrderedDict[str, Outcome]] = OrderedDict()

    @classmethod
    def remember(cls, run_id: str | None, outcome: Outcome) -> None:
        if run_id is None:
            return
        cls.outcomes[run_id] = outcome
        while len(cls.outcomes) > _REMEMBERED_RUNS:
            cls.outcomes.popitem(last=False)


def tool_risks(tool_defs: Iterable[Any]) -> dict[str, Literal["read", "write"]]:
    """The risks pydantic-ai's tool definitions declare (MCP annotations).

    Args:
        tool_defs: ``ToolDefinition`` objects; ``metadata["annotations"]`` is read.

    Returns:
        ``{tool name: "read" | "write"}`` for the tools that declare one.
    """
    risks: dict[str, Literal["read", "write"]] = {}
    for tool_def in tool_defs:
        metadata = getattr(tool_def, "metadata", None)
        annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
        risk = mcp_risk(annotations) if isinstance(annotations, Mapping) else None
        if risk is not None:
            risks[tool_def.name] = risk
    return risks


class Loopwatch(AbstractCapability):  # type: ignore[misc]  # pydantic-ai is untyped in .venv
    """The pydantic-ai capability that guards every run of the agent it is given to.

    Args:
        policy: a :class:`Policy`, a built-in profile name, or ``FILE[:PROFILE]``.
        mode: ``enforce`` (stop the run) or ``observe`` (record only).
        agent_name: the loopwatch agent name; default ``Agent.name`` (``"agent"`` if unset).
        capture_content: record tool arguments and results on spans (see :class:`Run`).
        tracer_provider: where spans go (the global provider when None).

    Raises:
        PolicyError: an invalid policy (at construction, before any run).
    """

    def __init__(
        self,
        policy: Policy | str | os.PathLike[str] | None = None,
        *,
        mode: Literal["enforce", "observe"] = "enforce",
        agent_name: str | None = None,
        capture_content: bool | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.policy = resolve_policy(policy)
        self.mode: Literal["enforce", "observe"] = mode
        self.agent_name = agent_name
        self.capture_content = capture_content
        self.tracer_provider = tracer_provider

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a tracer provider and a policy object: not for agent specs

    async def for_run(self, ctx: Any) -> _GuardedRun:
        return _GuardedRun(self)


class _GuardedRun(Loopwatch):
    """The per-run copy :meth:`Loopwatch.for_run` returns: one loopwatch run."""

    def __init__(self, settings: Loopwatch) -> None:
        self.policy = settings.policy
        self.mode = settings.mode
        self.agent_name = settings.agent_name
        self.capture_content = settings.capture_content
        self.tracer_provider = settings.tracer_provider
        self.run: Run | None = None
        self._parent: otel_context.Context | None = None

    async def for_run(self, ctx: Any) -> _GuardedRun:
        return self

    def _ensure_run(self, ctx: Any, tool_defs: Iterable[Any] = ()) -> Run:
        if self.run is None:
            agent = getattr(ctx, "agent", None)
            name = self.agent_name or getattr(agent, "name", None) or "agent"
            run = Run(
                name,
                self.policy.with_tool_risks(tool_risks(tool_defs)),
                mode=self.mode,
                capture_content=self.capture_content,
                tracer_provider=self.tracer_provider,
                conversation_id=getattr(ctx, "conversation_id", None),
            )
            self.run = contextvars.copy_context().run(self._start, run)
        return self.run

    def _start(self, run: Run) -> Run:
        """Start ``run`` under what was current when the agent run began (with pydantic-ai's
        own instrumentation on: its agent run span), not under the model request's span.
        Called in a copy of the context: the run is made current nowhere, so no task of
        pydantic-ai's holds a context token only another task could detach."""
        if self._parent is not None:
            otel_context.attach(self._parent)
        return run.start()

    async def _halt(self, ctx: Any) -> NoReturn:
        """End the framework's run after the guard stopped it: pydantic-ai delivers the
        cancellation at this task's next ``await`` (or cancels it from the task driving the
        run, for a tool task), and the caller gets ``RunCancelled``."""
        run = self.run
        assert run is not None
        outcome = run.outcome  # the stop closed the run before StopRun was raised
        _Registry.remember(getattr(ctx, "run_id", None), outcome)
        try:
            ctx.cancel()
        except Exception:  # pydantic-ai's UserError: no live run to cancel
            raise LoopwatchStopped(outcome) from None
        await asyncio.sleep(_CANCEL_GRACE_SECONDS)
        # Never hang: a cancellation that did not land (a task that swallowed it) still ends
        # the run, with an error the caller can read the outcome from.
        raise LoopwatchStopped(outcome)

    async def wrap_model_request(
        self,
        ctx: Any,
        *,
        request_context: Any,
        handler: Callable[[Any], Awaitable[Any]],
    ) -> Any:
        params = request_context.model_request_parameters
        run = self._ensure_run(ctx, params.function_tools)
        try:
            with run.model_call() as call:
                response = await handler(request_context)
                call.record(_decision(response, {t.name for t in params.output_tools}))
        except StopRun:
            await self._halt(ctx)
        return response

    async def wrap_tool_execute(
        self,
        ctx: Any,
        *,
        call: Any,
        tool_def: Any,
        args: Any,
        handler: Callable[[Any], Awaitable[Any]],
    ) -> Any:
        if getattr(tool_def, "kind", "function") != "function":
            return await handler(args)
        run = self._ensure_run(ctx)
        try:
            with run.tool_call(
                call.tool_name, call.args_as_dict(), call_id=call.tool_call_id
            ) as scope:
                result = await handler(args)
                scope.set_result(result)
        except ToolNudged as nudged:
            # The tool's return, not an error: an error would be a RetryPromptPart that
            # pydantic-ai counts against the tool's retries.
            return nudged.text
        except StopRun:
            await self._halt(ctx)
        return result

    async def wrap_run(self, ctx: Any, *, handler: Callable[[], Awaitable[Any]]) -> Any:
        self._parent = otel_context.get_current()
        try:
            result = await handler()
        except BaseException as exc:
            outcome = self._end_with_error(ctx, exc)
            _Registry.remember(getattr(ctx, "run_id", None), outcome)
            if not isinstance(exc, asyncio.CancelledError):
                _attach(exc, outcome)
            raise
        outcome = self._ensure_run(ctx).finish(getattr(result, "output", None))
        _Registry.remember(getattr(ctx, "run_id", None), outcome)
        _attach(result, outcome)
        return result

    def _end_with_error(self, ctx: Any, exc: BaseException) -> Outcome:
        run = self._ensure_run(ctx)
        if run.stopped:
            return run.finish()
        if isinstance(exc, UsageLimitExceeded):
            return _usage_limit_stop(run, exc, getattr(ctx, "usage", None))
        if isinstance(exc, asyncio.CancelledError):
            return run.cancel()
        run.guard.fail(exc)
        return run.finish()


def _attach(target: object, outcome: Outcome) -> None:
    # A frozen or slotted result keeps none: outcome_of finds it by run id.
    with contextlib.suppress(AttributeError, TypeError):
        setattr(target, _OUTCOME_ATTR, outcome)


def _usage_limit_stop(run: Run, exc: BaseException, usage: Any) -> Outcome:
    """``budget_exhausted`` for pydantic-ai's ``UsageLimitExceeded``; the limit name and
    value are read from its message (the exception carries no fields)."""
    text = str(exc)
    match = _LIMIT.search(text)
    name = match.group(1) if match else "usage_limit"
    limit = float(match.group(2).rstrip(".")) if match else None
    dimension = _DIMENSIONS.get(name)
    observed: float | None = None
    if usage is not None and dimension is not None:
        ahead = 1 if "next" in text else 0  # "The next request would exceed ..."
        if dimension is Dimension.MODEL_TURNS:
            observed = float(usage.requests + ahead)
        elif dimension is Dimension.TOOL_ATTEMPTS:
            tool_calls = re.search(r"tool_calls=(\d+)", text)
            observed = float(tool_calls.group(1)) if tool_calls else float(usage.tool_calls)
        elif dimension is Dimension.TOKENS:
            observed = float(usage.total_tokens)
        elif usage.cost is not None:
            observed = float(usage.cost)
    return run.framework_stop(
        StopReason.BUDGET_EXHAUSTED,
        framework=FRAMEWORK,
        limit_name=f"UsageLimitExceeded:{name}",
        dimension=dimension,
        limit=limit,
        observed=observed,
    )


def _decision(response: Any, output_tools: set[str]) -> Any:
    """The :class:`Decision` of one ``ModelResponse``."""
    calls: list[tuple[str, Any, str | None]] = []
    texts: list[str] = []
    for part in response.parts:
        kind = getattr(part, "part_kind", "")
        if kind == "tool-call":
            if part.tool_name in output_tools:
                texts.append(part.args_as_json_str())
            else:
                calls.append((part.tool_name, part.args_as_dict(), part.tool_call_id))
        elif kind == "text":
            texts.append(part.content)
    usage = response.usage
    input_tokens = int(usage.input_tokens or 0)
    output_tokens = int(usage.output_tokens or 0)
    reported = getattr(usage, "cost", None)
    price = price_of(
        response.model_name,
        input_tokens,
        output_tokens,
        provider=response.provider_name,
        reported_cost_usd=float(reported) if reported is not None else None,
    )
    return turn_decision(
        calls,
        text="\n".join(texts) or None,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=price.cost_usd,
        model=response.model_name,
        price_source=price.source,
    )
