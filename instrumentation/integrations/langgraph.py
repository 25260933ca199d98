"""LangGraph and LangChain adapter (route B): one LangChain callback handler puts every
model turn and every tool call of a graph (or chain) invocation under the loopwatch guard.

Setup, one line (the handler is LangChain's own extension point, so it reaches every
node, subgraph, chat model and tool the invocation runs)::

    from loopwatch.instrumentation.integrations.langgraph import LoopwatchHandler

    handler = LoopwatchHandler(policy="investigate-readonly")
    result = graph.invoke(inputs, config={"callbacks": [handler]})
    handler.outcome  # why the run ended (an Outcome), also after a stop

How it maps:

- one loopwatch run per root invocation (the outermost chain or graph the handler sees),
  named after the graph (``create_react_agent(..., name="support")`` gives ``support``);
  nested graphs, nodes and subgraphs are part of that run, never runs of their own. Inside
  a ``with Run(...)`` (or ``@agent``) block, every event joins that run instead, which is
  how a hand-written LangChain loop of ``model.invoke`` calls becomes one run;
- ``on_chat_model_start`` / ``on_llm_start`` check the turn before the request (a refused
  turn never reaches the model); ``on_llm_end`` records it as a decision with the tokens
  of the message's ``usage_metadata`` and the cost from genai-prices (LangChain reports no
  cost). A turn without tool calls is a ``message``: the run ends ``completed`` when the
  root invocation returns, since a graph may go on after such a turn;
- ``on_tool_start`` checks every tool call, whatever runs it (``ToolNode``, a custom node,
  an agent executor), sync or async; a refused call raises before the tool body runs.
  The observation is the ``ToolMessage``'s content, not the message (its call id changes
  every call and would read as progress). MCP annotations in a tool's ``metadata``
  (``readOnlyHint``, ``destructiveHint``) become tool risks when the tools are passed as
  ``tools=``;
- LangGraph's ``GraphRecursionError`` ends the run as ``budget_exhausted`` with dimension
  ``model_turns``: the recursion limit is the graph's cap on agent iterations (a ReAct
  agent takes two supersteps, model then tools, per turn). Limit and observed are given in
  LangGraph's unit, supersteps.
- a node's own ``timeout=`` (``add_node(..., timeout=...)``, LangGraph's
  ``NodeTimeoutError``) ends the run as ``deadline_exceeded`` (dimension
  ``elapsed_seconds``, limit the node's timeout, observed its elapsed seconds).

Nudges (the policy's ``loop_response`` ladder): a nudged call is not run, and the model
must read the nudge as the call's ``ToolMessage``. A callback cannot replace a tool's
result, so ``on_tool_start`` raises :class:`~loopwatch.instrumentation.ToolNudged` and
ToolNode's own interceptor turns it into the result: build the tools node with
``handler.tool_node(tools)`` (``ToolNode(tools, wrap_tool_call=handler.wrap_tool_call,
awrap_tool_call=handler.awrap_tool_call)``) and pass it as the agent's tools::

    graph = create_react_agent(model, handler.tool_node(tools), name="support")

The nudge is then a ``ToolMessage`` with ``status="success"`` and the nudge as its content
(whatever ``handle_tool_errors`` says). Without the interceptor, ``ToolNudged`` is a tool
error: ``ToolNode(handle_tool_errors=True)`` shows it to the model as an error message;
the default re-raises it out of ``invoke``.

A stop raises loopwatch's :class:`~loopwatch.instrumentation.StopRun` out of ``invoke`` /
``ainvoke`` (its ``stop`` says why). It is a ``BaseException``, like the guard's own stop,
so ``ToolNode``'s ``handle_tool_errors`` and ``except Exception`` in a node cannot turn it
into one more tool message the model answers; LangGraph ends the graph and propagates it.
Inside ``with Run(...)`` the block catches it as usual. A ``stream``/``astream`` the
caller stops reading (closed or dropped) ends its run as ``cancelled``.

Honest limits: a tool call is not given the guard's per-call timeout
(``tool_timeout_seconds``): LangChain runs the tool body itself and a callback cannot
interrupt it, so a tool that never returns hangs ``invoke`` forever. LangGraph's own
bounds are the remedy: give the tools node ``timeout=`` (async nodes only; LangGraph
refuses it on a sync node), or set the compiled graph's ``step_timeout`` (it raises
``TimeoutError``, an ``error`` stop; a sync tool's thread still runs to its end before
``invoke`` returns). ``outcome`` holds the last run that ended (concurrent invocations each
get their own run). The run this handler starts is not the current run inside the graph
(LangChain may end it from another asyncio task than the one it started in), so a model
client's own spans nest under the graph's, not under the ``decide`` span, and a tool
function also decorated with loopwatch's ``@tool`` runs unguarded there: drop the
decorator. A graph paused by ``interrupt()`` ends its run when ``invoke`` returns, as
``completed``; its resume is a new run with a fresh budget. A call to a tool the graph
does not have never reaches a tool (``ToolNode`` answers it with an error message), so
only its model turn is guarded: ``recursion_limit`` or ``max_model_turns`` ends such a
loop, as ``budget_exhausted``, never as ``repeated_action``.
"""

from __future__ import annotations

import contextvars
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from uuid import UUID

from .._scopes import ModelCall, ToolCallScope
from ..failures import ToolNudged
from ..outcomes import Decision, Dimension, Outcome, StopReason
from ..policy import Policy
from ..runs import Mode, Run, current_run, resolve_policy
from ._common import import_framework, mcp_risk, price_of, turn_decision

__all__ = ["LoopwatchHandler", "tool_risks"]

_BaseCallbackHandler: Any = import_framework(
    "langchain_core.callbacks", "langgraph"
).BaseCallbackHandler

_RECURSION_LIMIT = re.compile(r"Recursion limit of (\d+)")
_FRAMEWORK = "langgraph"
# What create_react_agent answers instead of a turn's tool calls when its remaining_steps
# (the recursion limit, counted down) cannot fit another model-and-tools round.
_OUT_OF_STEPS = "Sorry, need more steps to process this request."
_PENDING_NUDGES = 1024  # nudges kept for ToolNode's interceptor (a bound, not a budget)


def _node_timeout_error() -> type[BaseException] | None:
    """LangGraph's ``NodeTimeoutError`` (a node's ``timeout=``), or None without it."""
    try:
        from langgraph.errors import NodeTimeoutError
    except ImportError:
        return None
    return NodeTimeoutError  # type: ignore[no-any-return]


def _recursion_error() -> type[BaseException] | None:
    """LangGraph's ``GraphRecursionError``, or None for plain LangChain."""
    try:
        from langgraph.errors import GraphRecursionError
    except ImportError:
        return None
    return GraphRecursionError  # type: ignore[no-any-return]


def tool_risks(tools: Iterable[Any]) -> dict[str, str]:
    """The risk each tool declares through MCP annotations in its ``metadata``.

    langchain-mcp-adapters copies an MCP tool's annotations into the LangChain tool's
    ``metadata`` (at the top level or under ``"annotations"``), read by
    :func:`~._common.mcp_risk`.

    Args:
        tools: LangChain ``BaseTool`` objects (anything with ``name`` and ``metadata``).

    Returns:
        ``{tool name: "read" | "write"}`` for the tools that declare either.
    """
    risks: dict[str, str] = {}
    for tool in tools:
        meta = getattr(tool, "metadata", None) or {}
        if not isinstance(meta, Mapping):
            continue
        nested = meta.get("annotations")
        risk = mcp_risk(nested if isinstance(nested, Mapping) else meta)
        if risk is not None:
            risks[str(tool.name)] = risk
    return risks


def _answer(outputs: Any) -> Any:
    """The final answer of a root invocation: the last message's text for a graph state
    with ``messages`` (the ReAct agent's answer), else the outputs themselves."""
    if isinstance(outputs, Mapping):
        messages = outputs.get("messages")
        if isinstance(messages, list) and messages:
            return getattr(messages[-1], "content", messages[-1])
    return outputs


def _out_of_steps(outputs: Any, tool_turn: Any) -> bool:
    """True when the ReAct agent replaced the turn ``tool_turn`` (a message id) that
    asked for tools with its out-of-steps answer: the graph's step budget ended the run."""
    if not isinstance(outputs, Mapping):
        return False
    messages = outputs.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    return (
        getattr(last, "id", None) == tool_turn and getattr(last, "content", None) == _OUT_OF_STEPS
    )


def _observation(output: Any) -> Any:
    """What the tool returned, without LangChain's envelope: a ``ToolMessage``'s
    content (its call id and run metadata change every call)."""
    content = getattr(output, "content", None)
    return output if content is None else content


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class LoopwatchHandler(_BaseCallbackHandler):  # type: ignore[misc]
    """A LangChain callback handler that guards one invocation of a graph or chain.

    Pass it in ``config={"callbacks": [handler]}``. It runs inline (``run_inline``) and
    its refusals propagate (``raise_error``): a refused model turn or tool call never
    runs.

    Args:
        policy: a :class:`Policy`, a built-in profile name, or ``FILE[:PROFILE]``.
        agent: the run's agent name; default: the root graph's or chain's name.
        mode: ``enforce`` (refuse and stop) or ``observe`` (record only).
        tools: the graph's tools, to read MCP risk annotations from (:func:`tool_risks`);
            the policy file wins over them.
        capture_content / tracer_provider: as for :class:`~loopwatch.instrumentation.Run`.

    Attributes:
        outcome: the :class:`Outcome` of the last run this handler started and ended, or
            None before that.

    Raises:
        PolicyError: an invalid policy (at construction, before any call).
    """

    raise_error = True
    run_inline = True

    def __init__(
        self,
        policy: Policy | str | None = None,
        *,
        agent: str | None = None,
        mode: Mode = "enforce",
        tools: Iterable[Any] | None = None,
        capture_content: bool | None = None,
        tracer_provider: Any = None,
    ) -> None:
        super().__init__()
        resolved = resolve_policy(policy)
        risks = tool_risks(tools or ())
        self.policy: Policy = resolved.with_tool_risks(risks) if risks else resolved  # type: ignore[arg-type]
        self.agent = agent
        self.mode: Mode = mode
        self._capture = capture_content
        self._provider = tracer_provider
        self._lock = threading.Lock()
        self._members: dict[UUID, Run] = {}  # every LangChain run id seen -> its loopwatch run
        # root run id -> the loopwatch run we started for it, and the context it lives in
        self._owned: dict[UUID, tuple[Run, contextvars.Context]] = {}
        self._models: dict[
            UUID, tuple[ModelCall, contextvars.Context, Run, str | None, str | None]
        ] = {}
        self._tools: dict[UUID, ToolCallScope] = {}
        self._tool_turns: dict[int, Any] = {}  # id(run) -> id of its last turn asking for tools
        self._steps: dict[int, int] = {}  # id(run) of a run we own -> its last superstep seen
        # tool call id -> the nudge answering it, for the ToolNode interceptor to return
        # (ToolNode's handle_tool_errors may have turned ToolNudged into an error message).
        self._nudges: OrderedDict[str, str] = OrderedDict()
        self.outcome: Outcome | None = None

    # ------------------------------------------------------------- membership

    def _join(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str | None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Run:
        """The loopwatch run of a starting LangChain run: its parent's, else the current
        loopwatch run, else a new run started here (this event is the root)."""
        step = (metadata or {}).get("langgraph_step")
        step = step if isinstance(step, int) else None
        with self._lock:
            run = self._members.get(parent_run_id) if parent_run_id is not None else None
            if run is None:
                run = current_run()
            if run is None:
                run = Run(
                    self.agent or name or "langchain",
                    self.policy,
                    mode=self.mode,
                    capture_content=self._capture,
                    tracer_provider=self._provider,
                )
                # Started, and later ended, in a context of its own: LangChain's async
                # path may report the root's end from another task than its start, and
                # the caller's context must not be left holding the run's span.
                ctx = contextvars.copy_context()
                ctx.run(run.start)
                self._owned[run_id] = (run, ctx)
                self._steps[id(run)] = 0
            self._members[run_id] = run
            if step is not None and id(run) in self._steps:
                self._steps[id(run)] = max(step, self._steps.get(id(run), 0))
            return run

    def _leave(
        self, run_id: UUID, *, outputs: Any = None, error: BaseException | None = None
    ) -> None:
        """Forget an ended LangChain run; the root's end ends the loopwatch run."""
        with self._lock:
            self._members.pop(run_id, None)
            owned = self._owned.pop(run_id, None)
            if owned is None:
                return
            run, ctx = owned
            tool_turn = self._tool_turns.pop(id(run), None)
            steps = self._steps.pop(id(run), None)
        ctx.run(self._end, run, outputs, error, tool_turn, steps)

    def _end(
        self,
        run: Run,
        outputs: Any,
        error: BaseException | None,
        tool_turn: Any,
        steps: int | None,
    ) -> None:
        """End a run we started: finished, stopped by a framework limit, or failed."""
        if error is None:
            if tool_turn is not None and _out_of_steps(outputs, tool_turn):
                run.framework_stop(
                    StopReason.BUDGET_EXHAUSTED,
                    framework=_FRAMEWORK,
                    limit_name="remaining_steps",
                    dimension=Dimension.MODEL_TURNS,
                    observed=float(steps) if steps is not None else None,
                )
            self.outcome = run.finish(_answer(outputs))
            return
        if isinstance(error, GeneratorExit):
            # The caller stopped reading ``stream``/``astream`` (closed it, or dropped
            # it): the caller's own cancellation, not an infrastructure failure.
            self.outcome = run.cancel()
            return
        timeout_error = _node_timeout_error()
        if timeout_error is not None and isinstance(error, timeout_error):
            # A node's own ``timeout=`` (async nodes only): LangGraph's bound on a hanging
            # tool, which loopwatch's callbacks cannot give (see the module docstring).
            timeout = getattr(error, "timeout", None)
            elapsed = getattr(error, "elapsed", None)
            run.framework_stop(
                StopReason.DEADLINE_EXCEEDED,
                framework=_FRAMEWORK,
                limit_name="node_timeout",
                dimension=Dimension.ELAPSED_SECONDS,
                limit=float(timeout) if isinstance(timeout, int | float) else None,
                observed=float(elapsed) if isinstance(elapsed, int | float) else None,
            )
        limit_error = _recursion_error()
        if limit_error is not None and isinstance(error, limit_error):
            found = _RECURSION_LIMIT.search(str(error))
            limit = float(found.group(1)) if found else None
            run.framework_stop(
                StopReason.BUDGET_EXHAUSTED,
                framework=_FRAMEWORK,
                limit_name="recursion_limit",
                dimension=Dimension.MODEL_TURNS,
                limit=limit,
                observed=limit,
            )
        run.__exit__(type(error), error, error.__traceback__)
        self.outcome = run.outcome

    # ----------------------------------------------------------------- chains

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """Join the chain (a graph, node or runnable) to its run; a root starts one."""
        name = kwargs.get("name") or (serialized or {}).get("name")
        self._join(run_id, parent_run_id, name, kwargs.get("metadata"))

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A root chain's end finishes the run with its answer."""
        self._leave(run_id, outputs=outputs)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A root chain's error ends the run: the guard's stop, a framework limit, or
        ``error``."""
        self._leave(run_id, error=error)

    def on_retriever_start(
        self,
        serialized: Any,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """A retriever belongs to its parent's run (no run of its own)."""
        self._join(run_id, parent_run_id, None)

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the retriever."""
        self._leave(run_id, outputs=documents)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the retriever."""
        self._leave(run_id, error=error)

    # ----------------------------------------------------------------- models

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Check the model turn before the request; raises StopRun when refused."""
        self._model_start(run_id, parent_run_id, metadata, kwargs)

    def on_llm_start(
        self,
        serialized: Any,
        prompts: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Check a completion model's turn, as :meth:`on_chat_model_start`."""
        self._model_start(run_id, parent_run_id, metadata, kwargs)

    def _model_start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: Mapping[str, Any] | None,
        kwargs: Mapping[str, Any],
    ) -> None:
        run = self._join(run_id, parent_run_id, kwargs.get("name"), metadata)
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        model = meta.get("ls_model_name") or params.get("model") or params.get("model_name")
        scope = run.model_call()
        # The turn's span is made current in a context of its own, entered again to end
        # it: LangChain's async path reports on_llm_end from another asyncio task (a
        # gather) than on_chat_model_start, where the caller's context cannot be restored.
        ctx = contextvars.copy_context()
        try:
            ctx.run(scope.__enter__)
        except BaseException as exc:
            self._leave(run_id, error=exc)
            raise
        with self._lock:
            self._models[run_id] = (scope, ctx, run, model, meta.get("ls_provider"))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Record the turn: tool calls, tokens, cost; raises StopRun when it ends the run
        (a token or cost ceiling)."""
        with self._lock:
            entry = self._models.pop(run_id, None)
        if entry is None:
            return
        scope, ctx, run, model, provider = entry
        decision, message_id = self._decision(response, model, provider)
        with self._lock:
            if decision.tool_calls and id(run) in self._steps:
                self._tool_turns[id(run)] = message_id
            else:
                self._tool_turns.pop(id(run), None)
        try:
            scope.record(decision)
            ctx.run(scope.__exit__, None, None, None)
        finally:
            self._leave(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the failed turn."""
        with self._lock:
            entry = self._models.pop(run_id, None)
        try:
            if entry is not None:
                entry[1].run(entry[0].__exit__, type(error), error, error.__traceback__)
        finally:
            self._leave(run_id, error=error)

    @staticmethod
    def _decision(response: Any, model: str | None, provider: str | None) -> tuple[Decision, Any]:
        """The turn's :class:`Decision` and the id of the model's message."""
        generations = getattr(response, "generations", None) or [[]]
        first = generations[0][0] if generations[0] else None
        message = getattr(first, "message", None)
        calls = [
            (str(c.get("name", "")), c.get("args") or {}, c.get("id"))
            for c in (getattr(message, "tool_calls", None) or [])
        ]
        usage = getattr(message, "usage_metadata", None) or {}
        input_tokens, output_tokens = (
            _int(usage.get("input_tokens")),
            _int(usage.get("output_tokens")),
        )
        if not usage:
            legacy = (getattr(response, "llm_output", None) or {}).get("token_usage") or {}
            input_tokens = _int(legacy.get("prompt_tokens"))
            output_tokens = _int(legacy.get("completion_tokens"))
        meta = getattr(message, "response_metadata", None) or {}
        model = meta.get("model_name") or meta.get("model") or model
        price = price_of(model, input_tokens, output_tokens, provider=provider)
        text = getattr(first, "text", None)
        decision = turn_decision(
            calls,
            text=text if isinstance(text, str) and text else None,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=price.cost_usd,
            model=model,
            price_source=price.source,
        )
        return decision, getattr(message, "id", None)

    # ------------------------------------------------------------------ tools

    def on_tool_start(
        self,
        serialized: Any,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Check the tool call before the tool body runs; raises StopRun when refused."""
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        run = self._join(run_id, parent_run_id, name)
        args = dict(inputs) if isinstance(inputs, Mapping) else {"input": input_str}
        call_id = kwargs.get("tool_call_id")
        scope = run.tool_call(str(name), args, call_id=call_id)
        try:
            scope.__enter__()
        except BaseException as exc:
            if isinstance(exc, ToolNudged) and isinstance(call_id, str):
                with self._lock:
                    self._nudges[call_id] = str(exc.text)
                    while len(self._nudges) > _PENDING_NUDGES:
                        self._nudges.popitem(last=False)
            self._leave(run_id, error=exc)
            raise
        with self._lock:
            self._tools[run_id] = scope

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Record the tool's result; raises StopRun when it completes a loop."""
        with self._lock:
            scope = self._tools.pop(run_id, None)
        try:
            if scope is not None:
                scope.set_result(_observation(output))
                scope.__exit__(None, None, None)
        finally:
            self._leave(run_id, outputs=output)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Record the tool's error."""
        with self._lock:
            scope = self._tools.pop(run_id, None)
        try:
            if scope is not None:
                scope.__exit__(type(error), error, error.__traceback__)
        finally:
            self._leave(run_id, error=error)

    # ------------------------------------------------- ToolNode's interceptor

    def _nudge_message(self, request: Any, result: Any, text: str | None = None) -> Any:
        """The nudge as the call's ``ToolMessage`` (status ``success``: the nudge is the
        call's result, not an error for the model to fix), or ``result`` when the call
        was not nudged."""
        call = request.tool_call
        with self._lock:
            pending = self._nudges.pop(str(call.get("id")), None)
        text = text if text is not None else pending
        if text is None:
            return result
        from langchain_core.messages import ToolMessage

        return ToolMessage(
            content=text, name=call.get("name"), tool_call_id=call.get("id"), status="success"
        )

    def wrap_tool_call(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        """ToolNode's ``wrap_tool_call`` interceptor: a nudged call's result is the nudge.

        Args:
            request: LangGraph's ``ToolCallRequest`` (``tool_call`` with name, args, id).
            execute: runs the call (``on_tool_start`` guards it there).

        Returns:
            The tool's ``ToolMessage`` or ``Command``, or a ``ToolMessage`` with the nudge
            when the ladder nudged the call (its body did not run).
        """
        try:
            result = execute(request)
        except ToolNudged as nudged:
            return self._nudge_message(request, None, str(nudged.text))
        return self._nudge_message(request, result)

    async def awrap_tool_call(self, request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
        """ToolNode's ``awrap_tool_call`` interceptor, as :meth:`wrap_tool_call`."""
        try:
            result = await execute(request)
        except ToolNudged as nudged:
            return self._nudge_message(request, None, str(nudged.text))
        return self._nudge_message(request, result)

    def tool_node(self, tools: Iterable[Any], **kwargs: Any) -> Any:
        """A LangGraph ``ToolNode`` for ``tools`` with this handler's interceptors, so a
        nudged call answers the model with the nudge (see the module docstring).

        Args:
            tools: the graph's tools (LangChain tools or functions).
            **kwargs: passed to ``ToolNode`` (``handle_tool_errors``, ``name`` ...).

        Returns:
            The ``ToolNode``; pass it as ``create_react_agent``'s ``tools`` or add it as
            a node.

        Raises:
            ImportError: LangGraph is not installed (plain LangChain).
        """
        from langgraph.prebuilt import ToolNode

        return ToolNode(
            list(tools),
            wrap_tool_call=self.wrap_tool_call,
            awrap_tool_call=self.awrap_tool_call,
            **kwargs,
        )
