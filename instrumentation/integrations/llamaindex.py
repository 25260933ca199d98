"""loopwatch's guard inside LlamaIndex agents (llama-index-core 0.14): a ``FunctionAgent``,
``ReActAgent`` or multi-agent ``AgentWorkflow``, its LLM requests and tool calls, and the
way a stopped run ends.

Setup (one call; then run through the returned object)::

    from loopwatch.instrumentation.integrations.llamaindex import instrument

    guarded = instrument(agent_or_workflow, "investigate-readonly")
    result = await guarded.run(user_msg="...")  # LlamaIndex's own AgentOutput
    guarded.outcome                             # the loopwatch Outcome of that run

What :func:`instrument` changes, in place, on every agent it is given (the agent itself,
or each agent of an ``AgentWorkflow``):

- its ``llm`` is wrapped: each chat request is checked before it leaves (a refused turn
  never reaches the model) and recorded after, with the tokens the LLM reports
  (``ChatResponse.additional_kwargs`` or ``raw.usage``) and the cost from genai-prices.
  One record per request: the wrapper sits outside the LLM, so the nested
  ``achat_with_tools -> achat`` calls of one request count once;
- its ``tools`` are wrapped (``FunctionTool`` stays a ``FunctionTool``, so tools that take
  the workflow ``Context`` keep it; any other ``BaseTool`` is wrapped as an async tool):
  every call goes through the guard, sync and async.

How a stop ends the run, LlamaIndex's way: a refused tool call is answered with an error
``ToolOutput`` (LlamaIndex's own answer for a failed tool; nothing is raised into the
workflow's step task), and the next LLM request is refused with :class:`RunStopped`, an
ordinary exception: the workflow ends its run with it and awaiting the handler raises
it to the caller, with ``outcome`` attached. :meth:`GuardedLlamaIndex.run` also raises it
when the workflow ended by itself after the guard had stopped the run.

A call the policy's ladder nudges (``loop_response``) is not run: it is answered with a
``ToolOutput`` whose content is the nudge (``is_error`` false), which the agent gives the
model as the tool message, like any tool result.

LlamaIndex's own limits map onto the taxonomy: ``max_iterations`` (``WorkflowRuntimeError``
"Max iterations of N reached") is ``budget_exhausted`` (model_turns), the workflow
``timeout`` (``WorkflowTimeoutError``) is ``deadline_exceeded``; the exception itself is
passed on to the caller unchanged.

Concurrent runs of one guarded agent (``asyncio.gather``) each get their own loopwatch run.
A tool body is bounded by the policy's per-call timeout (an async tool is cancelled; a sync
one's thread finishes in the background, its result discarded). A call to a tool the
agent does not have never reaches a tool (LlamaIndex answers it), so only its model turn
is guarded: ``max_iterations`` or ``max_model_turns`` ends such a loop.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..errors import StopRun
from ..outcomes import Dimension, NudgeText, Outcome, Stop, StopReason
from ..policy import Policy
from ..runs import Mode, Run, resolve_policy
from ._common import Invocations, ended_outcome, import_framework, price_of, turn_decision

_llms = import_framework("llama_index.core.llms.function_calling", "llamaindex")
_pydantic = import_framework("llama_index.core.bridge.pydantic", "llamaindex")
_tools = import_framework("llama_index.core.tools", "llamaindex")
_tool_types = import_framework("llama_index.core.tools.types", "llamaindex")
_workflow_errors = import_framework("workflows.errors", "llamaindex")

__all__ = ["GuardedLlamaIndex", "RunStopped", "instrument"]

FRAMEWORK = "llamaindex"
_MAX_ITERATIONS = re.compile(r"Max iterations of (\d+) reached")
_FINAL = (StopReason.COMPLETED, StopReason.FINAL_UNVERIFIED)


class RunStopped(_workflow_errors.WorkflowRuntimeError):  # type: ignore[misc, name-defined]
    """loopwatch ended the run. Raised by the guarded LLM instead of making a refused
    request (the workflow ends with it), and by :meth:`GuardedLlamaIndex.run`. A
    ``WorkflowRuntimeError``, so code that handles LlamaIndex's own run failures handles
    it too.

    Attributes:
        stop: the guard's :class:`~loopwatch.instrumentation.Stop`.
        outcome: the run's :class:`~loopwatch.instrumentation.Outcome` (set once the run
            has ended; None inside the workflow).
    """

    def __init__(self, stop: Stop, outcome: Outcome | None = None) -> None:
        super().__init__(f"loopwatch stopped the run: {stop.reason}")
        self.stop = stop
        self.outcome = outcome


class _Session(Invocations):
    """The runs of the invocations in progress of one :class:`GuardedLlamaIndex` (its
    workflow's step tasks inherit the invocation's run)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("loopwatch_llamaindex_run")

    def live(self) -> Run | None:
        """The run to guard a call with: None outside a guarded invocation, and after a
        final answer ended it (a structured-output call that follows the answer is the
        framework's post-processing, passed through unrecorded)."""
        run = self.run
        if run is None or (run.stopped and run.guard.outcome().stop.reason in _FINAL):
            return None
        return run


def _usage(response: Any) -> tuple[int, int]:
    """Input and output tokens of one ``ChatResponse``: LlamaIndex's LLM integrations put
    them in ``additional_kwargs`` (OpenAI names or Anthropic names), else in
    ``raw.usage``."""
    sources: list[Any] = [getattr(response, "additional_kwargs", None)]
    raw = getattr(response, "raw", None)
    sources.append(raw.get("usage") if isinstance(raw, Mapping) else getattr(raw, "usage", None))
    for src in sources:
        if src is None:
            continue
        get = src.get if isinstance(src, Mapping) else lambda k, s=src: getattr(s, k, None)
        tin = get("prompt_tokens") or get("input_tokens")
        tout = get("completion_tokens") or get("output_tokens")
        if tin or tout:
            return int(tin or 0), int(tout or 0)
    return 0, 0


def _react_step(parser: Any, text: str) -> tuple[list[tuple[str, Any, str | None]], Any]:
    """A ReAct reply read with the agent's own output parser: ``([call], None)`` for an
    action, ``([], answer)`` for an answer, ``([], None)`` when it is neither (a thought
    the agent will retry): recorded as a message."""
    try:
        step = parser.parse(text, is_streaming=False)
    except Exception:  # the agent retries a reply its parser refuses; so do we
        return [], None
    action = getattr(step, "action", None)
    if isinstance(action, str):
        return [(action, dict(getattr(step, "action_input", None) or {}), None)], None
    response = getattr(step, "response", None)
    return [], response if isinstance(response, str) else None


class _GuardedLLM(_llms.FunctionCallingLLM):  # type: ignore[misc, name-defined]
    """A ``FunctionCallingLLM`` around the agent's LLM: chat requests are checked before
    and recorded after; everything else is the wrapped LLM's."""

    _lw_inner: Any = _pydantic.PrivateAttr(default=None)
    _lw_session: Any = _pydantic.PrivateAttr(default=None)
    _lw_parser: Any = _pydantic.PrivateAttr(default=None)

    def __init__(self, inner: Any, session: _Session, parser: Any = None) -> None:
        super().__init__(callback_manager=inner.callback_manager)
        self._lw_inner = inner
        self._lw_session = session
        # A ReActAgent's calls are in the text: its own parser reads them.
        self._lw_parser = parser

    @classmethod
    def class_name(cls) -> str:
        return "LoopwatchGuardedLLM"

    @property
    def metadata(self) -> Any:
        return self._lw_inner.metadata

    def _decision(self, response: Any, *, with_tools: bool) -> Any:
        inner = self._lw_inner
        calls: list[tuple[str, Any, str | None]] = []
        text = response.message.content
        final: Any = None
        if with_tools:
            for sel in inner.get_tool_calls_from_response(response, error_on_no_tool_call=False):
                calls.append((sel.tool_name, sel.tool_kwargs, sel.tool_id or None))
            # A response to a request with tools and no tool call ends a FunctionAgent
            # or AgentWorkflow run (a handoff is a tool call).
            final = text if not calls else None
        elif self._lw_parser is not None and text:
            calls, final = _react_step(self._lw_parser, text)
        tin, tout = _usage(response)
        model = getattr(inner.metadata, "model_name", None) or getattr(inner, "model", None)
        model = model if isinstance(model, str) else None
        price = price_of(model, tin, tout)
        return turn_decision(
            calls,
            final=final,
            text=text,
            input_tokens=tin,
            output_tokens=tout,
            cost_usd=price.cost_usd,
            model=model,
            price_source=price.source,
        )

    async def _aguard(self, request: Callable[[], Awaitable[Any]], with_tools: bool) -> Any:
        run = self._lw_session.live()
        if run is None:
            return await request()
        response = None
        try:
            with run.model_call() as call:
                response = await request()
                call.record(self._decision(response, with_tools=with_tools))
        except StopRun as stop:
            if response is None or stop.stop.reason not in _FINAL:
                raise RunStopped(stop.stop) from None
        return response

    def _guard(self, request: Callable[[], Any], with_tools: bool) -> Any:
        run = self._lw_session.live()
        if run is None:
            return request()
        response = None
        try:
            with run.model_call() as call:
                response = request()
                call.record(self._decision(response, with_tools=with_tools))
        except StopRun as stop:
            if response is None or stop.stop.reason not in _FINAL:
                raise RunStopped(stop.stop) from None
        return response

    async def _aguard_stream(self, request: Callable[[], Awaitable[Any]], with_tools: bool) -> Any:
        """Check before the request; return the stream, whose last chunk (LlamaIndex's
        chunks carry the whole response so far) is recorded once it is read to its end."""
        run = self._lw_session.live()
        if run is None:
            return await request()
        scope = run.model_call()
        try:
            scope.__enter__()
        except StopRun as stop:
            raise RunStopped(stop.stop) from None
        try:
            stream = await request()
        except BaseException as exc:
            scope.__exit__(type(exc), exc, exc.__traceback__)
            raise

        async def chunks() -> AsyncGenerator[Any, None]:
            last = None
            try:
                async for chunk in stream:
                    last = chunk
                    yield chunk
                if last is not None:
                    scope.record(self._decision(last, with_tools=with_tools))
            except BaseException as exc:
                scope.__exit__(type(exc), exc, exc.__traceback__)
                raise
            try:
                scope.__exit__(None, None, None)
            except StopRun as stop:
                if stop.stop.reason not in _FINAL:
                    raise RunStopped(stop.stop) from None

        return chunks()

    async def achat_with_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return await self._aguard(lambda: self._lw_inner.achat_with_tools(tools, **kwargs), True)

    def chat_with_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self._guard(lambda: self._lw_inner.chat_with_tools(tools, **kwargs), True)

    async def astream_chat_with_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return await self._aguard_stream(
            lambda: self._lw_inner.astream_chat_with_tools(tools, **kwargs), True
        )

    async def achat(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        return await self._aguard(lambda: self._lw_inner.achat(messages, **kwargs), False)

    def chat(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        return self._guard(lambda: self._lw_inner.chat(messages, **kwargs), False)

    async def astream_chat(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        return await self._aguard_stream(
            lambda: self._lw_inner.astream_chat(messages, **kwargs), False
        )

    def get_tool_calls_from_response(self, response: Any, **kwargs: Any) -> Any:
        return self._lw_inner.get_tool_calls_from_response(response, **kwargs)

    def _prepare_chat_with_tools(self, tools: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
        return dict(self._lw_inner._prepare_chat_with_tools(tools, **kwargs))

    # Completion endpoints are not agent turns in llama-index-core 0.14: passed through.
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        return self._lw_inner.complete(prompt, formatted=formatted, **kwargs)

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        return await self._lw_inner.acomplete(prompt, formatted=formatted, **kwargs)

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        return self._lw_inner.stream_complete(prompt, formatted=formatted, **kwargs)

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        return await self._lw_inner.astream_complete(prompt, formatted=formatted, **kwargs)

    def stream_chat(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        return self._lw_inner.stream_chat(messages, **kwargs)


class _ToolFailed(Exception):
    """The tool answered with an error ``ToolOutput`` (recorded as the tool's error)."""


def _stop_output(name: str, args: Mapping[str, Any], stop: Stop) -> Any:
    text = f"loopwatch stopped the run: {stop.reason}"
    return _tool_types.ToolOutput(
        content=text, tool_name=name, raw_input=dict(args), raw_output=text, is_error=True
    )


def _nudge_output(name: str, args: Mapping[str, Any], text: NudgeText) -> Any:
    """A nudged call's ``ToolOutput``: the nudge is its content, not an error (the body
    did not run; the model reads the nudge as the tool's result)."""
    return _tool_types.ToolOutput(
        content=str(text), tool_name=name, raw_input=dict(args), raw_output=str(text)
    )


class _Guarded:
    """What the two tool wrappers share: the guarded call around the tool's own."""

    _lw_session: _Session

    def _lw_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments as the guard fingerprints them: the keywords without the
        workflow ``Context``, and a positional ``input`` (a plain ``BaseTool`` takes one)."""
        ctx_param = getattr(self, "ctx_param_name", None)
        found = {k: v for k, v in kwargs.items() if k != ctx_param}
        if args:
            found["input"] = args[0] if len(args) == 1 else list(args)
        return found

    async def _lw_acall(
        self,
        name: str,
        call: tuple[tuple[Any, ...], dict[str, Any]],
        invoke: Callable[[], Awaitable[Any]],
    ) -> Any:
        run = self._lw_session.run
        if run is None:
            return await invoke()
        args = self._lw_args(*call)
        box: list[Any] = []

        async def body(**_: Any) -> str:
            out = await invoke()
            box.append(out)
            if getattr(out, "is_error", False):
                raise _ToolFailed(str(out.content))
            return str(out.content)

        try:
            result = await run.acall_tool(name, args, fn=body)
        except StopRun as stop:
            return box[-1] if box else _stop_output(name, args, stop.stop)
        except _ToolFailed:
            return box[-1]
        if isinstance(result, NudgeText):
            return _nudge_output(name, args, result)
        return box[-1]

    def _lw_call(
        self, name: str, call: tuple[tuple[Any, ...], dict[str, Any]], invoke: Callable[[], Any]
    ) -> Any:
        run = self._lw_session.run
        if run is None:
            return invoke()
        args = self._lw_args(*call)
        box: list[Any] = []

        def body(**_: Any) -> str:
            out = invoke()
            box.append(out)
            if getattr(out, "is_error", False):
                raise _ToolFailed(str(out.content))
            return str(out.content)

        try:
            result = run.call_tool(name, args, fn=body)
        except StopRun as stop:
            return box[-1] if box else _stop_output(name, args, stop.stop)
        except _ToolFailed:
            return box[-1]
        if isinstance(result, NudgeText):
            return _nudge_output(name, args, result)
        return box[-1]


class _GuardedFunctionTool(_Guarded, _tools.FunctionTool):  # type: ignore[misc, name-defined]
    """A copy of a ``FunctionTool`` whose calls go through the guard. Still a
    ``FunctionTool``: LlamaIndex hands the workflow ``Context`` only to those."""

    @classmethod
    def wrap(cls, tool: Any, session: _Session) -> _GuardedFunctionTool:
        new = cls.__new__(cls)
        new.__dict__.update(tool.__dict__)
        new._lw_session = session
        return new

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        name = self.metadata.get_name()
        own = _tools.FunctionTool.acall
        return await self._lw_acall(name, (args, kwargs), lambda: own(self, *args, **kwargs))

    def call(self, *args: Any, **kwargs: Any) -> Any:
        name = self.metadata.get_name()
        own = _tools.FunctionTool.call
        return self._lw_call(name, (args, kwargs), lambda: own(self, *args, **kwargs))


class _GuardedTool(_Guarded, _tool_types.AsyncBaseTool):  # type: ignore[misc, name-defined]
    """Any other ``BaseTool`` (a query-engine tool, a retriever tool...), guarded."""

    def __init__(self, tool: Any, session: _Session) -> None:
        self._lw_inner = _tool_types.adapt_to_async_tool(tool)
        self._lw_session = session

    @property
    def metadata(self) -> Any:
        return self._lw_inner.metadata

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        name = self.metadata.get_name()
        return await self._lw_acall(
            name, (args, kwargs), lambda: self._lw_inner.acall(*args, **kwargs)
        )

    def call(self, *args: Any, **kwargs: Any) -> Any:
        name = self.metadata.get_name()
        return self._lw_call(name, (args, kwargs), lambda: self._lw_inner.call(*args, **kwargs))


def _wrap_tool(tool: Any, session: _Session) -> Any:
    if isinstance(tool, _Guarded):
        return tool
    if isinstance(tool, _tools.FunctionTool):
        return _GuardedFunctionTool.wrap(tool, session)
    if isinstance(tool, _tool_types.BaseTool):
        return _GuardedTool(tool, session)
    return _GuardedFunctionTool.wrap(_tools.FunctionTool.from_defaults(tool), session)


class GuardedLlamaIndex:
    """A LlamaIndex agent or ``AgentWorkflow`` whose runs go through the guard (built by
    :func:`instrument`). One :meth:`run` is one loopwatch run; concurrent runs (``asyncio.gather``)
    each get their own run and budget.

    Attributes:
        target: the agent or workflow.
        name: the run's agent name (the agent's ``name``; for an ``AgentWorkflow``, its
            root agent's).
        handler: the ``WorkflowHandler`` of the run in progress or last run (its
            ``ctx``, or ``cancel_run()`` from another task).
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
        root = getattr(target, "root_agent", None)
        self.name = str(root if isinstance(root, str) else target.name)
        self._policy = policy
        self._mode: Mode = mode
        self._capture = capture_content
        self._provider = tracer_provider
        self._session = _Session()
        self._outcome: Outcome | None = None
        self.handler: Any = None

    @property
    def outcome(self) -> Outcome:
        """The loopwatch outcome of the last :meth:`run` to end (with concurrent runs, the
        :class:`RunStopped` a stopped one raises carries its own).

        Raises:
            RuntimeError: no run has ended yet.
        """
        if self._outcome is None:
            raise RuntimeError("no guarded LlamaIndex run has ended yet")
        return self._outcome

    def _wrap(self) -> None:
        agents = getattr(self.target, "agents", None)
        members = list(agents.values()) if isinstance(agents, Mapping) else [self.target]
        for agent in members:
            llm = getattr(agent, "llm", None)
            if llm is not None and not isinstance(llm, _GuardedLLM):
                parser = getattr(agent, "output_parser", None)
                agent.llm = _GuardedLLM(llm, self._session, parser)
            if agent.tools:
                agent.tools = [_wrap_tool(t, self._session) for t in agent.tools]

    async def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run the agent or workflow under a new loopwatch run: ``agent.run(*args,
        **kwargs)``, awaited.

        Returns:
            What awaiting LlamaIndex's handler returns (an ``AgentOutput``).

        Raises:
            RunStopped: loopwatch stopped the run; ``outcome`` is attached.
            WorkflowRuntimeError / WorkflowTimeoutError: LlamaIndex's own limits, passed
                on (the outcome says ``budget_exhausted`` / ``deadline_exceeded``).
            WorkflowCancelledByUser: ``handler.cancel_run()`` was called (``cancelled``).
            Exception: whatever else the workflow raised (the run ends ``error``).
        """
        run = Run(
            self.name,
            self._policy,
            mode=self._mode,
            capture_content=self._capture,
            tracer_provider=self._provider,
        )
        token = self._session.enter(run)
        try:
            with run:
                self.handler = self.target.run(*args, **kwargs)
                try:
                    result = await self.handler
                except RunStopped as exc:
                    exc.outcome = run.outcome
                    raise
                except _workflow_errors.WorkflowCancelledByUser:
                    run.cancel()  # handler.cancel_run(): the caller's own cancellation
                    raise
                except (
                    _workflow_errors.WorkflowRuntimeError,
                    _workflow_errors.WorkflowTimeoutError,
                ) as exc:
                    self._framework_limit(run, exc)
                    raise
                if run.stopped and run.guard.outcome().stop.reason not in _FINAL:
                    outcome = run.outcome
                    raise RunStopped(outcome.stop, outcome)
                run.finish(_answer(result))
                return result
        finally:
            self._session.leave(run, token)
            self._outcome = ended_outcome(run)

    def _framework_limit(self, run: Run, exc: Exception) -> None:
        """End the run as LlamaIndex's own limit did, when one stopped it."""
        if isinstance(exc, _workflow_errors.WorkflowTimeoutError):
            timeout = getattr(self.target, "_timeout", None)
            run.framework_stop(
                StopReason.DEADLINE_EXCEEDED,
                framework=FRAMEWORK,
                limit_name="timeout",
                dimension=Dimension.ELAPSED_SECONDS,
                limit=float(timeout) if isinstance(timeout, int | float) else None,
                observed=float(timeout) if isinstance(timeout, int | float) else None,
            )
            return
        found = _MAX_ITERATIONS.search(str(exc))
        if found is not None:
            limit = float(found.group(1))
            run.framework_stop(
                StopReason.BUDGET_EXHAUSTED,
                framework=FRAMEWORK,
                limit_name="max_iterations",
                dimension=Dimension.MODEL_TURNS,
                limit=limit,
                observed=limit,
            )


def _answer(result: Any) -> Any:
    response = getattr(result, "response", None)
    return getattr(response, "content", None) if response is not None else result


def instrument(
    target: Any,
    policy: Policy | str | os.PathLike[str] | None = None,
    *,
    mode: Mode = "enforce",
    capture_content: bool | None = None,
    tracer_provider: Any = None,
) -> GuardedLlamaIndex:
    """Guard a LlamaIndex agent (``FunctionAgent``, ``ReActAgent``) or ``AgentWorkflow``:
    each agent's ``llm`` and ``tools`` are wrapped in place.

    Args:
        target: the agent or the workflow.
        policy: a :class:`Policy`, a built-in profile name or ``FILE[:PROFILE]``.
        mode: ``enforce`` or ``observe``.
        capture_content / tracer_provider: as for :class:`~loopwatch.instrumentation.Run`.

    Returns:
        The :class:`GuardedLlamaIndex` to run it through.

    Raises:
        PolicyError: an invalid policy.
        ImportError: llama-index-core is not installed (names the extra).
    """
    guarded = GuardedLlamaIndex(
        target,
        resolve_policy(policy),
        mode=mode,
        capture_content=capture_content,
        tracer_provider=tracer_provider,
    )
    guarded._wrap()
    return guarded
