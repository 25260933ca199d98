"""loopwatch's guard inside AutoGen AgentChat (autogen-agentchat 0.7): an agent's or a
team's model requests and tool calls, and the way a stopped run ends.

Setup (one call; then run through the returned object)::

    from loopwatch.instrumentation.integrations.autogen import instrument

    guarded = instrument(agent_or_team, "investigate-readonly")
    result = await guarded.run(task="...")  # AutoGen's own TaskResult
    guarded.outcome                         # the loopwatch Outcome of that run
    await Console(guarded.run_stream(task="..."))  # or streamed, as AutoGen's run_stream

What :func:`instrument` changes, in place, on every ``AssistantAgent`` it is given (the
agent itself, or each participant of a team):

- its model client is wrapped: each request is checked before it leaves (a refused turn
  never reaches the model) and recorded after, with the tokens of AutoGen's
  ``RequestUsage`` and the cost from genai-prices;
- each workbench is wrapped (the static one holding its ``FunctionTool``/``BaseTool``
  objects, MCP workbenches too): every call goes through the guard, so the tool body
  runs at most ``repeat_limit`` times in a runaway loop;
- a team gets a termination condition that ends it once the guard has stopped the run.

How a stop ends the run, AutoGen's way: AutoGen runs tool calls in a task it does not
await (it waits on a queue the task feeds), so an exception escaping a tool would leave
the agent waiting forever; a ``BaseException`` such as loopwatch's ``StopRun`` does
exactly that. The guarded workbench therefore never lets one out: a refused call is
answered with an error ``ToolResult``. The next model request is then refused with
:class:`RunStopped`, an ordinary exception AutoGen propagates to the caller (a team
turns it into its own error), and a team's termination condition ends it between turns.
:meth:`GuardedAutoGen.run` turns that end into AutoGen's normal ``TaskResult`` whose
``stop_reason`` starts with ``"loopwatch: "``; the guard's ``Outcome`` is
``guarded.outcome``. loopwatch never cancels AutoGen's ``CancellationToken``: that
cancels the tool futures AutoGen links to it, and AutoGen 0.7.5 then hangs in the same
way. When the caller cancels it, the adapter ends the run as ``cancelled`` the same
clean way (an answered call, then a refused request), so that hang is gone too.

A call the policy's ladder nudges (``loop_response``) is not run: the guarded workbench
answers it with a ``ToolResult`` whose text is the nudge (``is_error`` false), which
AutoGen gives the model as the call's ``FunctionExecutionResult``.

AutoGen's own limits map onto the taxonomy: a team's ``max_turns`` and
``MaxMessageTermination`` are ``budget_exhausted`` (model_turns), ``TokenUsageTermination``
is ``budget_exhausted`` (tokens), ``TimeoutTermination`` is ``deadline_exceeded``, and an
agent that ran out of ``max_tool_iterations`` (set above 1) is ``budget_exhausted``
(model_turns).

Concurrent runs each get their own loopwatch run. A tool body is bounded by the policy's
per-call timeout, and the exception a tool raised (not AutoGen's error text) decides
whether the same call may be retried. Cancelling the task that awaits :meth:`run` (rather
than the ``CancellationToken``) ends the run as ``cancelled`` but leaves AutoGen's own
tool tasks pending, as it does without loopwatch: cancel through the token. A call to a
tool the agent does not have never reaches the workbench, so only its model turn is
guarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from ..errors import StopRun
from ..outcomes import Dimension, NudgeText, Outcome, Stop, StopReason
from ..policy import Policy, Risk
from ..runs import Mode, Run, resolve_policy
from ._common import Invocations, ended_outcome, import_framework, mcp_risk, price_of, turn_decision

_base = import_framework("autogen_agentchat.base", "autogen")
_messages = import_framework("autogen_agentchat.messages", "autogen")
_core_models = import_framework("autogen_core.models", "autogen")
_core_tools = import_framework("autogen_core.tools", "autogen")

__all__ = ["GuardedAutoGen", "RunStopped", "instrument"]

FRAMEWORK = "autogen"
STOP_PREFIX = "loopwatch: "
_FINAL = (StopReason.COMPLETED, StopReason.FINAL_UNVERIFIED)


class RunStopped(RuntimeError):
    """loopwatch ended the run: raised by the guarded model client instead of making a
    refused request. An ordinary exception, so AutoGen passes it to whoever awaits the
    agent (a team reports it as its own error); :meth:`GuardedAutoGen.run` turns it into
    a ``TaskResult``.

    Attributes:
        stop: the guard's :class:`~loopwatch.instrumentation.Stop`.
    """

    def __init__(self, stop: Stop) -> None:
        super().__init__(f"loopwatch stopped the run: {stop.reason}")
        self.stop = stop


class _Session(Invocations):
    """The runs of the invocations in progress of one :class:`GuardedAutoGen` (AutoGen's
    handler tasks, started inside its ``run``, inherit the invocation's run)."""

    __slots__ = ("text_is_final",)

    def __init__(self, text_is_final: bool) -> None:
        super().__init__("loopwatch_autogen_run")
        # A single agent's text reply is its final answer; in a team it is one turn.
        self.text_is_final = text_is_final


def _token_cancelled(token: Any) -> bool:
    """The AutoGen ``CancellationToken`` was cancelled while the current task itself is
    not being cancelled (a cancellation aimed at the task must propagate as it is)."""
    task = asyncio.current_task()
    return (
        token is not None
        and bool(token.is_cancelled())
        and (task is None or task.cancelling() == 0)
    )


def _stop_text(stop: Stop) -> str:
    return f"loopwatch stopped the run: {stop.reason}"


class _GuardedModelClient(_core_models.ChatCompletionClient):  # type: ignore[misc, name-defined]
    """A ``ChatCompletionClient`` that asks the guard before each request and records the
    turn after it; every other method is the wrapped client's."""

    def __init__(self, inner: Any, session: _Session) -> None:
        self._inner = inner
        self._session = session

    def _model_name(self) -> str | None:
        create_args = getattr(self._inner, "_create_args", None)
        if isinstance(create_args, Mapping) and isinstance(create_args.get("model"), str):
            return str(create_args["model"])
        name = getattr(self._inner, "model", None)
        return name if isinstance(name, str) else None

    def _record(self, call: Any, result: Any) -> None:
        usage = getattr(result, "usage", None)
        tin = int(getattr(usage, "prompt_tokens", 0) or 0)
        tout = int(getattr(usage, "completion_tokens", 0) or 0)
        model = self._model_name()
        price = price_of(model, tin, tout)
        content = result.content
        calls: list[tuple[str, Any, str | None]] = []
        text: str | None = None
        if isinstance(content, str):
            text = content
        else:
            for fc in content:
                try:
                    args = json.loads(fc.arguments) if fc.arguments else {}
                except json.JSONDecodeError:
                    args = {"input": fc.arguments}
                calls.append((fc.name, args, fc.id))
        final = text if self._session.text_is_final and not calls else None
        call.record(
            turn_decision(
                calls,
                final=final,
                text=text,
                input_tokens=tin,
                output_tokens=tout,
                cost_usd=price.cost_usd,
                model=model,
                price_source=price.source,
            )
        )

    @staticmethod
    def _answered(stop: StopRun) -> bool:
        """The turn was made and ended the run with its final answer: hand it back."""
        return stop.stop.reason in _FINAL

    async def create(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        run = self._session.run
        if run is None:
            return await self._inner.create(messages, **kwargs)
        if _token_cancelled(kwargs.get("cancellation_token")):
            raise RunStopped(run.cancel().stop)
        result = None
        try:
            with run.model_call() as call:
                result = await self._inner.create(messages, **kwargs)
                self._record(call, result)
        except StopRun as stop:
            if result is not None and self._answered(stop):
                return result
            raise RunStopped(stop.stop) from None
        return result

    async def create_stream(
        self, messages: Sequence[Any], **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        run = self._session.run
        if run is None:
            async for chunk in self._inner.create_stream(messages, **kwargs):
                yield chunk
            return
        if _token_cancelled(kwargs.get("cancellation_token")):
            raise RunStopped(run.cancel().stop)
        final = None
        try:
            with run.model_call() as call:
                async for chunk in self._inner.create_stream(messages, **kwargs):
                    if isinstance(chunk, _core_models.CreateResult):
                        final = chunk
                        self._record(call, chunk)
                    else:
                        yield chunk
        except StopRun as stop:
            if final is None or not self._answered(stop):
                raise RunStopped(stop.stop) from None
        if final is not None:
            yield final

    async def close(self) -> None:
        await self._inner.close()

    def actual_usage(self) -> Any:
        return self._inner.actual_usage()

    def total_usage(self) -> Any:
        return self._inner.total_usage()

    def count_tokens(self, messages: Sequence[Any], **kwargs: Any) -> int:
        return int(self._inner.count_tokens(messages, **kwargs))

    def remaining_tokens(self, messages: Sequence[Any], **kwargs: Any) -> int:
        return int(self._inner.remaining_tokens(messages, **kwargs))

    @property
    def capabilities(self) -> Any:
        return self._inner.capabilities

    @property
    def model_info(self) -> Any:
        return self._inner.model_info

    def dump_component(self) -> Any:
        # An agent's saved config names the real client, not the guard around it.
        return self._inner.dump_component()


class _ToolFailed(Exception):
    """The wrapped workbench answered with an error result (recorded as the tool's error)."""


# The exceptions a tool body raised during the guarded call in progress. AutoGen's
# StaticWorkbench turns them into error text, and the text alone would be classed
# ``permanent`` (never retried): a 503 or a ConnectionError would end the run at its
# first retry. The list is shared with the tool's task (a context copy holds the same list).
_TOOL_ERRORS: contextvars.ContextVar[list[Exception] | None] = contextvars.ContextVar(
    "loopwatch_autogen_tool_errors", default=None
)


def _keep_errors(tool: Any) -> None:
    """Make ``tool.run_json`` (on this instance, once) note the exception it raises for
    the guarded call in progress, so the guard classifies the real failure."""
    original = getattr(tool, "run_json", None)
    if original is None or getattr(original, "__loopwatch_wrapped__", False):
        return

    async def run_json(*args: Any, **kwargs: Any) -> Any:
        try:
            return await original(*args, **kwargs)
        except Exception as exc:
            errors = _TOOL_ERRORS.get()
            if errors is not None:
                errors.append(exc)
            raise

    run_json.__loopwatch_wrapped__ = True  # type: ignore[attr-defined]
    # A tool that refuses new attributes keeps AutoGen's text (classed permanent).
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        tool.run_json = run_json


class _GuardedWorkbench(_core_tools.Workbench):  # type: ignore[misc, name-defined]
    """A ``Workbench`` whose every call goes through the guard. It never raises into
    AutoGen's tool task: a refused call, or a ``StopRun`` from the tool's own body, comes
    back as an error ``ToolResult`` (see the module docstring)."""

    def __init__(self, inner: Any, session: _Session) -> None:
        self._inner = inner
        self._session = session
        for tool in getattr(inner, "_tools", ()):
            _keep_errors(tool)

    async def list_tools(self) -> list[Any]:
        return list(await self._inner.list_tools())

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: Any = None,
        call_id: str | None = None,
    ) -> Any:
        run = self._session.run
        if run is None:
            return await self._inner.call_tool(name, arguments, cancellation_token, call_id)
        args = dict(arguments or {})
        box: list[Any] = []

        async def body(**kw: Any) -> str:
            errors: list[Exception] = []
            token = _TOOL_ERRORS.set(errors)
            try:
                result = await self._inner.call_tool(name, kw, cancellation_token, call_id)
            finally:
                _TOOL_ERRORS.reset(token)
            box.append(result)
            text = str(result.to_text())
            if result.is_error:
                raise errors[-1] if errors else _ToolFailed(text)
            return text

        try:
            answer = await run.acall_tool(name, args, fn=body, call_id=call_id)
        except StopRun as stop:
            return self._stopped(name, stop.stop, box)
        except asyncio.CancelledError:
            if not _token_cancelled(cancellation_token):
                raise
            # The caller's token cancelled the tool's future: AutoGen 0.7 lets that
            # CancelledError end its tool task and then waits on the queue forever.
            # End the run as cancelled and answer the call instead.
            return self._stopped(name, run.cancel().stop, box)
        except Exception as exc:
            if box:
                return box[-1]
            return _core_tools.ToolResult(
                name=name,
                result=[_core_tools.TextResultContent(content=f"Error: {exc}")],
                is_error=True,
            )
        if isinstance(answer, NudgeText):
            # Not run: the nudge is the call's result (not an error), as the model reads it.
            return _core_tools.ToolResult(
                name=name, result=[_core_tools.TextResultContent(content=str(answer))]
            )
        return box[-1]

    @staticmethod
    def _stopped(name: str, stop: Stop, box: list[Any]) -> Any:
        """The call's answer once the run has stopped: its own result when it ran (a result
        that completed a cycle), else the stop as an error result."""
        if box:
            return box[-1]
        return _core_tools.ToolResult(
            name=name,
            result=[_core_tools.TextResultContent(content=_stop_text(stop))],
            is_error=True,
        )

    async def start(self) -> None:
        await self._inner.start()

    async def stop(self) -> None:
        await self._inner.stop()

    async def reset(self) -> None:
        await self._inner.reset()

    async def save_state(self) -> Mapping[str, Any]:
        return dict(await self._inner.save_state())

    async def load_state(self, state: Mapping[str, Any]) -> None:
        await self._inner.load_state(state)

    def dump_component(self) -> Any:
        return self._inner.dump_component()


class _GuardStopped(_base.TerminationCondition):  # type: ignore[misc, name-defined]
    """Ends a team between turns once the guard has stopped its run."""

    def __init__(self, session: _Session) -> None:
        self._session = session
        self._terminated = False

    @property
    def terminated(self) -> bool:
        return self._terminated

    async def __call__(self, messages: Sequence[Any]) -> Any:
        run = self._session.run
        if run is not None and run.stopped and not self._terminated:
            self._terminated = True
            stop = run.guard.outcome().stop
            return _messages.StopMessage(content=STOP_PREFIX + str(stop.reason), source="loopwatch")
        return None

    async def reset(self) -> None:
        self._terminated = False


def _tool_risk(tool: Any) -> Risk | None:
    """The risk an MCP tool's annotations declare, or None. autogen-ext's MCP adapters keep
    the MCP ``Tool`` as ``_tool``."""
    return mcp_risk(getattr(getattr(tool, "_tool", None), "annotations", None))


def _assistants(target: Any) -> list[Any]:
    members = getattr(target, "_participants", None)
    if members is None:
        return [target]
    return [a for m in members for a in _assistants(m)]


class GuardedAutoGen:
    """An AutoGen agent or team whose runs go through the guard (built by
    :func:`instrument`). One :meth:`run` is one loopwatch run; run it again for another.
    Concurrent runs each get their own loopwatch run and budget (AutoGen itself shares
    one agent's model context between them, and refuses a second run of a running team).

    Attributes:
        target: the agent or team.
        name: the run's agent name (the agent's or the team's ``name``).
    """

    def __init__(
        self,
        target: Any,
        policy: Policy,
        *,
        mode: Mode,
        capture_content: bool | None,
        tracer_provider: Any,
    ) -> None:
        self.target = target
        self.name = str(target.name)
        self._policy = policy
        self._mode: Mode = mode
        self._capture = capture_content
        self._provider = tracer_provider
        self._session = _Session(text_is_final=not hasattr(target, "_participants"))
        self._outcome: Outcome | None = None

    @property
    def outcome(self) -> Outcome:
        """The loopwatch outcome of the last :meth:`run` to end.

        Raises:
            RuntimeError: no run has ended yet.
        """
        if self._outcome is None:
            raise RuntimeError("no guarded AutoGen run has ended yet")
        return self._outcome

    async def run(self, *, task: Any = None, cancellation_token: Any = None) -> Any:
        """Run the agent or team under a new loopwatch run.

        Args:
            task / cancellation_token: as for AutoGen's ``run``.

        Returns:
            AutoGen's ``TaskResult``. When loopwatch stopped the run, its ``stop_reason``
            is ``"loopwatch: <stop reason>"`` and its messages are those produced before
            the stop; :attr:`outcome` says why, with the evidence.

        Raises:
            Exception: whatever AutoGen raised for another reason (the run ends ``error``;
                ``asyncio.CancelledError`` from the caller's token ends it ``cancelled``).
        """
        result: Any = None
        async with contextlib.aclosing(
            self.run_stream(task=task, cancellation_token=cancellation_token)
        ) as stream:
            async for item in stream:
                result = item
        return result

    async def run_stream(
        self, *, task: Any = None, cancellation_token: Any = None
    ) -> AsyncGenerator[Any, None]:
        """:meth:`run`, streamed as AutoGen's ``run_stream`` is (``Console(guarded.
        run_stream(task=...))`` works): AutoGen's messages and events, then the
        ``TaskResult`` of :meth:`run` as the last item. A stream its reader closes
        (``aclose``, or ``break`` inside ``async with aclosing(...)``) closes AutoGen's
        and ends the run as ``cancelled``.

        Raises:
            Exception: as for :meth:`run`.
        """
        run = Run(
            self.name,
            self._policy,
            mode=self._mode,
            capture_content=self._capture,
            tracer_provider=self._provider,
        )
        token = self._session.enter(run)
        messages: list[Any] = []
        result: Any = None
        try:
            with run:
                try:
                    async with contextlib.aclosing(
                        self.target.run_stream(task=task, cancellation_token=cancellation_token)
                    ) as inner:
                        async for item in inner:
                            if isinstance(item, _base.TaskResult):
                                result = item  # handed out last, once the run has ended
                                continue
                            if not isinstance(item, _messages.ModelClientStreamingChunkEvent):
                                messages.append(item)
                            yield item
                except GeneratorExit:
                    run.cancel()  # the reader stopped reading: its own cancellation
                    raise
                except Exception:
                    # RunStopped itself (a single agent), or the team's RuntimeError
                    # wrapping it: the guard's stop is the run's end.
                    if not run.stopped:
                        raise
                if not run.stopped:
                    self._framework_limits(run, result)
                    if not run.stopped:
                        run.finish(_answer(result))
                else:
                    stop = run.guard.outcome().stop
                    answered = stop.reason in _FINAL and result is not None
                    if not answered and not str(
                        getattr(result, "stop_reason", None) or ""
                    ).startswith(STOP_PREFIX):
                        result = _base.TaskResult(
                            messages=messages, stop_reason=STOP_PREFIX + str(stop.reason)
                        )
        finally:
            self._session.leave(run, token)
            self._outcome = ended_outcome(run)
        yield result

    def _wrap(self) -> None:
        """Wrap every assistant's model client and workbenches (once), declare the risks
        MCP annotations give, and add the stop condition to a team."""
        session = self._session
        risks: dict[str, Risk] = {}
        for agent in _assistants(self.target):
            client = getattr(agent, "_model_client", None)
            if client is not None and not isinstance(client, _GuardedModelClient):
                agent._model_client = _GuardedModelClient(client, session)
            benches = getattr(agent, "_workbench", None)
            if benches is None:
                continue
            for bench in benches:
                for tool in getattr(bench, "_tools", ()):
                    risk = _tool_risk(tool)
                    if risk is not None:
                        risks[str(tool.name)] = risk
            agent._workbench = [
                b if isinstance(b, _GuardedWorkbench) else _GuardedWorkbench(b, session)
                for b in benches
            ]
        if risks:
            self._policy = self._policy.with_tool_risks(risks)
        if hasattr(self.target, "_participants"):
            condition = _GuardStopped(session)
            existing = getattr(self.target, "_termination_condition", None)
            self.target._termination_condition = (
                condition if existing is None else existing | condition
            )

    def _framework_limits(self, run: Run, result: Any) -> None:
        """End the run as AutoGen's own limit did, when one stopped it."""
        target = self.target
        reason = str(getattr(result, "stop_reason", None) or "")
        max_turns = getattr(target, "_max_turns", None)
        if max_turns is not None and reason.startswith("Maximum number of turns"):
            run.framework_stop(
                StopReason.BUDGET_EXHAUSTED,
                framework=FRAMEWORK,
                limit_name="max_turns",
                dimension=Dimension.MODEL_TURNS,
                limit=float(max_turns),
                observed=float(max_turns),
            )
            return
        for cond in _fired(getattr(target, "_termination_condition", None)):
            mapped = _CONDITIONS.get(type(cond).__name__)
            if mapped is not None:
                stop_reason, dimension, attr = mapped
                limit = getattr(cond, attr, None)
                run.framework_stop(
                    stop_reason,
                    framework=FRAMEWORK,
                    limit_name=type(cond).__name__,
                    dimension=dimension,
                    limit=float(limit) if isinstance(limit, int | float) else None,
                    observed=float(limit) if isinstance(limit, int | float) else None,
                )
                return
        iterations = getattr(target, "_max_tool_iterations", 1)
        inner = [
            m for m in getattr(result, "messages", ()) if type(m).__name__ == "ToolCallRequestEvent"
        ]
        last = result.messages[-1] if getattr(result, "messages", None) else None
        if (
            iterations > 1
            and len(inner) >= iterations
            and type(last).__name__ == "ToolCallSummaryMessage"
        ):
            run.framework_stop(
                StopReason.BUDGET_EXHAUSTED,
                framework=FRAMEWORK,
                limit_name="max_tool_iterations",
                dimension=Dimension.MODEL_TURNS,
                limit=float(iterations),
                observed=float(len(inner)),
            )


# Termination conditions that are limits: name -> (stop reason, dimension, limit attribute).
_CONDITIONS: dict[str, tuple[StopReason, Dimension, str]] = {
    "MaxMessageTermination": (
        StopReason.BUDGET_EXHAUSTED,
        Dimension.MODEL_TURNS,
        "_max_messages",
    ),
    "TokenUsageTermination": (StopReason.BUDGET_EXHAUSTED, Dimension.TOKENS, "_max_total_token"),
    "TimeoutTermination": (
        StopReason.DEADLINE_EXCEEDED,
        Dimension.ELAPSED_SECONDS,
        "_timeout_seconds",
    ),
}


def _fired(cond: Any) -> list[Any]:
    """The leaf termination conditions that fired (``And``/``Or`` walked)."""
    if cond is None:
        return []
    children = getattr(cond, "_conditions", None)
    if children is not None:
        return [c for child in children for c in _fired(child)]
    return [cond] if getattr(cond, "terminated", False) else []


def _answer(result: Any) -> Any:
    msgs = getattr(result, "messages", None)
    if not msgs:
        return None
    return getattr(msgs[-1], "content", None)


def instrument(
    target: Any,
    policy: Policy | str | os.PathLike[str] | None = None,
    *,
    mode: Mode = "enforce",
    capture_content: bool | None = None,
    tracer_provider: Any = None,
) -> GuardedAutoGen:
    """Guard an AutoGen ``AssistantAgent`` or team (``RoundRobinGroupChat``,
    ``SelectorGroupChat``, ``Swarm``...): its members' model clients and workbenches are
    wrapped in place. Call it before the first run (a team fixes its termination
    condition when it first runs).

    Args:
        target: the agent or the team.
        policy: a :class:`Policy`, a built-in profile name or ``FILE[:PROFILE]``.
        mode: ``enforce`` or ``observe``.
        capture_content / tracer_provider: as for :class:`~loopwatch.instrumentation.Run`.

    Returns:
        The :class:`GuardedAutoGen` to run it through.

    Raises:
        PolicyError: an invalid policy.
        ImportError: autogen-agentchat is not installed (names the extra).
    """
    guarded = GuardedAutoGen(
        target,
        resolve_policy(policy),
        mode=mode,
        capture_content=capture_content,
        tracer_provider=tracer_provider,
    )
    guarded._wrap()
    return guarded
