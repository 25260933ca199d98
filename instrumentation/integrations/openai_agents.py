"""loopwatch's guard inside the OpenAI Agents SDK, through its run hooks.

Setup (one line: :func:`guarded_run` is ``Runner.run`` with the guard's hooks)::

    from loopwatch.instrumentation.integrations.openai_agents import guarded_run, outcome_of

    try:
        result = await guarded_run(agent, "...", policy="investigate-readonly", max_turns=10)
        outcome_of(result).stop.reason      # StopReason.COMPLETED
    except LoopwatchStopped as exc:         # an agents.AgentsException, with run_data
        exc.outcome.stop.reason             # StopReason.REPEATED_ACTION, ...
    except MaxTurnsExceeded as exc:
        outcome_of(exc).stop.dimension      # "model_turns"

:func:`guarded_run_sync` wraps ``Runner.run_sync``. For ``Runner.run_streamed``, pass
``hooks=LoopwatchHooks(agent, policy)`` yourself and call ``hooks.finish(result_or_error)``
when the stream ends.

What it hooks (``agents.RunHooks``, openai-agents 0.24):

- ``on_llm_start`` / ``on_llm_end``: each model call is checked before it is sent and
  recorded after it: tokens from ``ModelResponse.usage``, cost from genai-prices (the SDK
  reports no cost) for the agent's model name; the decision is ``tool`` when the response
  asks for function calls, else ``message`` (the run is finished with
  ``result.final_output``).
- ``on_tool_start`` / ``on_tool_end``: every local tool call (``@function_tool`` functions
  sync and async, ``FunctionTool`` objects, MCP tools, agents as tools; computer and shell
  tools by name) is checked before its body runs and recorded after. A tool error the
  SDK turns into text for the model (``failure_error_function``) is recorded as that text.
- ``MaxTurnsExceeded`` becomes ``budget_exhausted`` (dimension ``model_turns``).

Nudges (the policy's ``loop_response`` ladder): a run hook cannot replace a tool's output,
so the guard's check runs earlier, in a tool input guardrail (``loopwatch_tool_guard``)
that :class:`LoopwatchHooks` appends to each ``FunctionTool`` of the starting agent and of
the agents it hands off to (agents as tools included; inert outside a guarded run). A
nudged call is answered ``ToolGuardrailFunctionOutput.reject_content(nudge)``: the SDK does
not run the tool and sends the nudge to the model as the call's ``function_call_output``.
Tools without the guardrail (MCP tools, listed anew every turn; computer, shell and other
hosted-side tools) are checked in ``on_tool_start``, which cannot skip a body: there a
nudge rung is recorded but the call runs (declare a ``["stop"]`` ladder for them with
``loop_response_by_detector``, or give the run the tools as ``FunctionTool`` objects).

A stop raises :class:`LoopwatchStopped` from the hook, an ``AgentsException``: the SDK ends
the run the way it ends any failed run (sibling tool tasks cancelled, ``run_data`` attached)
and re-raises it to the caller. The loopwatch ``Outcome`` is :func:`outcome_of` the result
or the exception (``exc.outcome`` too).

Tool risk: MCP tools carry their annotations (``FunctionTool.mcp_annotations``):
``readOnlyHint`` true is ``read``; ``readOnlyHint`` false or ``destructiveHint`` true is
``write`` (:meth:`Policy.with_tool_risks`; the policy file wins). They are read from the
starting agent's tools (its MCP servers listed once, before the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import re
import time
from collections.abc import Iterable
from typing import Any, Literal

from opentelemetry.trace import Span, TracerProvider

from ..errors import StopRun
from ..outcomes import Decision, Dimension, Outcome, StopReason, ToolTicket
from ..policy import Policy
from ..runs import Run, resolve_policy
from ._common import import_framework, mcp_risk, price_of, turn_decision

import_framework("agents", "openai-agents")

from agents import AgentsException, MaxTurnsExceeded, RunContextWrapper, Runner  # noqa: E402
from agents.lifecycle import RunHooksBase  # noqa: E402
from agents.tool_guardrails import (  # noqa: E402
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
)

__all__ = [
    "LoopwatchHooks",
    "LoopwatchStopped",
    "guarded_run",
    "guarded_run_sync",
    "outcome_of",
    "tool_risks",
]

FRAMEWORK = "openai-agents"
_OUTCOME_ATTR = "loopwatch_outcome"
_log = logging.getLogger("loopwatch.instrumentation")
_MAX_TURNS = re.compile(r"Max turns \((\d+)\)")
# The hooks of the guarded run the current task belongs to: the SDK runs each tool call in
# a task created inside Runner.run, which copies this context.
_ACTIVE: contextvars.ContextVar[LoopwatchHooks | None] = contextvars.ContextVar(
    "loopwatch_openai_agents_hooks", default=None
)


class LoopwatchStopped(AgentsException):  # type: ignore[misc]  # untyped in .venv
    """The guard stopped the run (raised from a run hook; the SDK attaches ``run_data``).

    Attributes:
        outcome: the loopwatch :class:`Outcome`.
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.message)
        self.outcome = outcome


def outcome_of(result_or_error: object) -> Outcome | None:
    """The loopwatch :class:`Outcome` of a guarded run.

    Args:
        result_or_error: the ``RunResult`` :func:`guarded_run` returned, or the exception
            it raised.

    Returns:
        The outcome, or None when the object did not come from a guarded run.
    """
    found = getattr(result_or_error, _OUTCOME_ATTR, None)
    return found if isinstance(found, Outcome) else None


def tool_risks(tools: Iterable[Any]) -> dict[str, Literal["read", "write"]]:
    """The risks the SDK's tool objects declare (MCP annotations).

    Args:
        tools: ``Tool`` objects; ``FunctionTool.mcp_annotations`` is read.

    Returns:
        ``{tool name: "read" | "write"}`` for the tools that declare one.
    """
    risks: dict[str, Literal["read", "write"]] = {}
    for tool in tools:
        risk = mcp_risk(getattr(tool, "mcp_annotations", None))
        if risk is not None:
            risks[tool.name] = risk
    return risks


def _model_name(agent: Any) -> str | None:
    model = getattr(agent, "model", None)
    if isinstance(model, str):
        return model
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else None


def _decision(response: Any, model: str | None) -> Decision:
    """The :class:`Decision` of one ``agents.ModelResponse``."""
    calls: list[tuple[str, Any, str | None]] = []
    texts: list[str] = []
    for item in response.output:
        kind = getattr(item, "type", None)
        if kind == "function_call":
            try:
                args = json.loads(item.arguments or "{}")
            except ValueError:
                args = {"input": item.arguments}
            calls.append((item.name, args, item.call_id))
        elif kind == "message":
            texts.extend(getattr(c, "text", "") or "" for c in item.content)
    usage = response.usage
    input_tokens = int(usage.input_tokens or 0)
    output_tokens = int(usage.output_tokens or 0)
    price = price_of(model, input_tokens, output_tokens)
    return turn_decision(
        calls,
        text="".join(texts) or None,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=price.cost_usd,
        model=model,
        price_source=price.source,
    )


class LoopwatchHooks(RunHooksBase):  # type: ignore[misc]  # untyped in .venv
    """``agents.RunHooks`` that guard one run (make one per ``Runner`` call).

    Args:
        agent: the starting agent; its ``name`` is the loopwatch agent name.
        policy: a :class:`Policy`, a built-in profile name, or ``FILE[:PROFILE]``.
        mode: ``enforce`` or ``observe``.
        tools: the tools whose MCP annotations declare risks (default ``agent.tools``).
        hooks: your own ``RunHooks``, called after loopwatch's.
        capture_content / tracer_provider: as for :class:`Run`.

    Attributes:
        run: the loopwatch :class:`Run` (started at construction).
    """

    def __init__(
        self,
        agent: Any,
        policy: Policy | str | os.PathLike[str] | None = None,
        *,
        mode: Literal["enforce", "observe"] = "enforce",
        tools: Iterable[Any] | None = None,
        hooks: Any = None,
        capture_content: bool | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        risks = tool_risks(tools if tools is not None else getattr(agent, "tools", ()))
        self.run = Run(
            getattr(agent, "name", None) or "agent",
            resolve_policy(policy).with_tool_risks(risks),
            mode=mode,
            capture_content=capture_content,
            tracer_provider=tracer_provider,
        ).start()
        self._inner = hooks
        self._turn: Span | None = None
        # Tool calls in flight, by their ToolContext: on_tool_start and on_tool_end get the
        # same one, in different tasks.
        self._tools: dict[int, tuple[ToolTicket, Span | None]] = {}
        _guard_tools(agent)
        self._token: contextvars.Token[LoopwatchHooks | None] | None = _ACTIVE.set(self)

    def _stopped(self, stop: StopRun) -> LoopwatchStopped:
        # The run was closed before StopRun was raised. Not run.finish(): this hook runs in
        # a task of the SDK's, and the run stops being current in the caller's context.
        return LoopwatchStopped(self.run.outcome)

    async def on_llm_start(self, context: Any, agent: Any, *args: Any) -> None:
        run = self.run
        started = time.time_ns()
        verdict = run.guard.before_model_call()
        try:
            run._raise_if_stopped(verdict.stop, refused=True)
        except StopRun as stop:
            raise self._stopped(stop) from None
        self._turn = run._telemetry.start_decision(start_time=started)
        if self._inner is not None:
            await self._inner.on_llm_start(context, agent, *args)

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        run = self.run
        decision = _decision(response, _model_name(agent))
        verdict = run.guard.record_decision(decision)
        run._telemetry.end_decision(self._turn, decision)
        self._turn = None
        try:
            run._raise_if_stopped(None if verdict.allowed else verdict.stop)
        except StopRun as stop:
            raise self._stopped(stop) from None
        if self._inner is not None:
            await self._inner.on_llm_end(context, agent, response)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        name = getattr(context, "tool_name", None) or tool.name
        args = _arguments(getattr(context, "tool_arguments", None))
        if id(context) not in self._tools:  # not checked by the tool's guardrail
            try:
                started = self.run._start_tool(name, args, getattr(context, "tool_call_id", None))
            except StopRun as stop:
                raise self._stopped(stop) from None
            if started[0].nudge is None:
                self._tools[id(context)] = started
        if self._inner is not None:
            await self._inner.on_tool_start(context, agent, tool)

    def _check_tool(self, context: Any) -> ToolGuardrailFunctionOutput:
        """The guard's check of one function tool call, from its input guardrail: a
        nudged call is rejected with the nudge as its output (the body never runs)."""
        name = getattr(context, "tool_name", None) or "tool"
        args = _arguments(getattr(context, "tool_arguments", None))
        try:
            ticket, span = self.run._start_tool(name, args, getattr(context, "tool_call_id", None))
        except StopRun as stop:
            raise self._stopped(stop) from None
        if ticket.nudge is not None:
            return ToolGuardrailFunctionOutput.reject_content(str(ticket.nudge))
        self._tools[id(context)] = (ticket, span)
        return ToolGuardrailFunctionOutput.allow()

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        started = self._tools.pop(id(context), None)
        if started is not None:
            try:
                self.run._after_result(self.run._record_result(*started, result))
            except StopRun as stop:
                raise self._stopped(stop) from None
        if self._inner is not None:
            await self._inner.on_tool_end(context, agent, tool, result)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        if self._inner is not None:
            await self._inner.on_agent_start(context, agent)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        if self._inner is not None:
            await self._inner.on_agent_end(context, agent, output)

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        if self._inner is not None:
            await self._inner.on_handoff(context, from_agent, to_agent)

    def finish(self, result_or_error: object) -> Outcome:
        """End the loopwatch run with the SDK's result or exception, and attach the
        :class:`Outcome` to it (read it with :func:`outcome_of`).

        ``MaxTurnsExceeded`` ends it as ``budget_exhausted`` (``model_turns``); any other
        exception as ``error`` (``cancelled`` for a cancellation), unless the guard had
        already stopped the run.
        """
        run = self.run
        if self._token is not None:
            with contextlib.suppress(ValueError):  # finished in another context
                _ACTIVE.reset(self._token)
            self._token = None
        for ticket, span in self._tools.values():  # calls the SDK cancelled mid-flight
            run._end_failed_tool(ticket, span, RuntimeError("tool call did not finish"))
        self._tools.clear()
        if isinstance(result_or_error, BaseException):
            outcome = self._end_with_error(result_or_error)
        else:
            outcome = run.finish(getattr(result_or_error, "final_output", None))
        # A slotted object keeps none: LoopwatchStopped.outcome, or the hooks' run.outcome.
        with contextlib.suppress(AttributeError, TypeError):
            setattr(result_or_error, _OUTCOME_ATTR, outcome)
        return outcome

    def _end_with_error(self, exc: BaseException) -> Outcome:
        run = self.run
        if run.stopped:
            return run.finish()
        if isinstance(exc, MaxTurnsExceeded):
            match = _MAX_TURNS.search(str(exc))
            limit = float(match.group(1)) if match else None
            return run.framework_stop(
                StopReason.BUDGET_EXHAUSTED,
                framework=FRAMEWORK,
                limit_name="MaxTurnsExceeded",
                dimension=Dimension.MODEL_TURNS,
                limit=limit,
                observed=limit + 1 if limit is not None else None,
            )
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            return run.cancel()
        run.guard.fail(exc)
        return run.finish()


def _arguments(raw: Any) -> dict[str, Any]:
    """A tool call's JSON arguments as a dict (``{"input": raw}`` when not an object)."""
    try:
        args = json.loads(raw) if raw else {}
    except ValueError:
        return {"input": raw}
    return args if isinstance(args, dict) else {"input": args}


async def _loopwatch_tool_guard(data: Any) -> ToolGuardrailFunctionOutput:
    """The input guardrail loopwatch gives function tools: the active run's check."""
    hooks = _ACTIVE.get()
    if hooks is None:  # a tool of a guarded agent, run outside a guarded run
        return ToolGuardrailFunctionOutput.allow()
    return hooks._check_tool(data.context)


_GUARDRAIL = ToolInputGuardrail(
    guardrail_function=_loopwatch_tool_guard, name="loopwatch_tool_guard"
)


def _guard_tools(agent: Any, seen: set[int] | None = None) -> None:
    """Append loopwatch's input guardrail (once) to the function tools of ``agent`` and
    of the agents it hands off to."""
    seen = set() if seen is None else seen
    if id(agent) in seen:
        return
    seen.add(id(agent))
    for tool in getattr(agent, "tools", None) or ():
        if not hasattr(tool, "tool_input_guardrails"):  # not a FunctionTool
            continue
        guardrails: list[Any] = list(tool.tool_input_guardrails or ())
        if not any(g is _GUARDRAIL for g in guardrails):
            with contextlib.suppress(AttributeError, TypeError):
                tool.tool_input_guardrails = [*guardrails, _GUARDRAIL]
    for handoff in getattr(agent, "handoffs", None) or ():
        target = getattr(handoff, "agent", handoff)  # a Handoff wraps its agent lazily
        if hasattr(target, "tools"):
            _guard_tools(target, seen)


async def _starting_tools(agent: Any, context: Any) -> list[Any]:
    """The starting agent's tools, with its MCP servers' tools (listed once) when it has
    any; the SDK's own listing errors are left for the run to raise."""
    tools = list(getattr(agent, "tools", ()) or ())
    if getattr(agent, "mcp_servers", None):
        try:
            tools += await agent.get_mcp_tools(RunContextWrapper(context=context))
        except Exception:  # the run itself reports an unreachable server, to the caller
            _log.debug("MCP tools not listed for their risks", exc_info=True)
    return tools


async def guarded_run(
    agent: Any,
    input: Any,
    *,
    policy: Policy | str | os.PathLike[str] | None = None,
    mode: Literal["enforce", "observe"] = "enforce",
    capture_content: bool | None = None,
    tracer_provider: TracerProvider | None = None,
    **runner_kwargs: Any,
) -> Any:
    """``agents.Runner.run`` under the guard: one loopwatch run per call.

    Args:
        agent / input: as for ``Runner.run``.
        policy / mode / capture_content / tracer_provider: as for :class:`Run`.
        runner_kwargs: passed on to ``Runner.run`` (``max_turns``, ``context``,
            ``run_config``, ``hooks``: yours are called after loopwatch's).

    Returns:
        The SDK's ``RunResult``; :func:`outcome_of` it for the loopwatch outcome.

    Raises:
        LoopwatchStopped: the guard stopped the run.
        Exception: whatever ``Runner.run`` raised (``MaxTurnsExceeded`` ...), with the
            outcome attached.
    """
    hooks = LoopwatchHooks(
        agent,
        policy,
        mode=mode,
        tools=await _starting_tools(agent, runner_kwargs.get("context")),
        hooks=runner_kwargs.pop("hooks", None),
        capture_content=capture_content,
        tracer_provider=tracer_provider,
    )
    try:
        result = await Runner.run(agent, input, hooks=hooks, **runner_kwargs)
    except BaseException as exc:
        hooks.finish(exc)
        raise
    hooks.finish(result)
    return result


def guarded_run_sync(
    agent: Any,
    input: Any,
    *,
    policy: Policy | str | os.PathLike[str] | None = None,
    mode: Literal["enforce", "observe"] = "enforce",
    capture_content: bool | None = None,
    tracer_provider: TracerProvider | None = None,
    **runner_kwargs: Any,
) -> Any:
    """``agents.Runner.run_sync`` under the guard (see :func:`guarded_run`). MCP servers
    are not listed here (no event loop yet): declare their risks in the policy, or use
    :func:`guarded_run`."""
    hooks = LoopwatchHooks(
        agent,
        policy,
        mode=mode,
        hooks=runner_kwargs.pop("hooks", None),
        capture_content=capture_content,
        tracer_provider=tracer_provider,
    )
    try:
        result = Runner.run_sync(agent, input, hooks=hooks, **runner_kwargs)
    except BaseException as exc:
        hooks.finish(exc)
        raise
    hooks.finish(result)
    return result
