"""Route B live tests for LlamaIndex: a scripted model (a small subclass of
llama-index-core's own MockFunctionCallingLLM), real FunctionAgents, FunctionTools and
an AgentWorkflow."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import ChatResponse, ToolCallBlock
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool, ToolMetadata
from llama_index.core.tools.types import AsyncBaseTool, ToolOutput
from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.errors import StopRun
from loopwatch.instrumentation.integrations.llamaindex import (
    RunStopped,
    instrument,
)
from loopwatch.instrumentation.policy import ToolPolicy
from loopwatch.instrumentation.testing import assert_trace_invariants
from workflows.errors import WorkflowCancelledByUser, WorkflowRuntimeError, WorkflowTimeoutError

POLICY = Policy(max_model_turns=30, max_tool_attempts=30, repeat_limit=3)
Turn = list[tuple[str, dict[str, Any]]] | str


class ScriptedLLM(MockFunctionCallingLLM):
    """Answers each chat with the next scripted turn (tool calls or text) and reports
    token usage the way LlamaIndex's OpenAI integration does (``additional_kwargs``)."""

    def __init__(self, turns: list[Turn], delay: float = 0.0) -> None:
        script = list(turns)
        count = [0]

        async def gen_async(messages: Any, **kw: Any) -> Any:
            await asyncio.sleep(delay)
            yield reply(messages, **kw)

        def reply(messages: Any, **kw: Any) -> ChatMessage:
            i = count[0]
            count[0] += 1
            turn = script[min(i, len(script) - 1)]
            if isinstance(turn, str):
                return ChatMessage(role="assistant", content=turn)
            blocks = [
                ToolCallBlock(tool_call_id=f"call_{i}_{j}", tool_name=n, tool_kwargs=a)
                for j, (n, a) in enumerate(turn)
            ]
            return ChatMessage(role="assistant", blocks=blocks)

        super().__init__(response_generator=reply)
        self._count = count

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        response = super().chat(messages, **kwargs)
        response.additional_kwargs = {"prompt_tokens": 12, "completion_tokens": 4}
        return response

    @property
    def turns(self) -> int:
        return self._count[0]


def _agent(tools: list[Any], turns: list[Turn], **kw: Any) -> FunctionAgent:
    kw.setdefault("streaming", False)
    return FunctionAgent(name="support_bot", llm=ScriptedLLM(turns), tools=tools, **kw)


def _timed(coro: Callable[[], Coroutine[Any, Any, Any]]) -> tuple[Any, float]:
    """Run ``coro()`` in a fresh loop; returns its result or the exception it raised,
    and fails when a task of the loop is left pending."""

    async def main() -> Any:
        try:
            result: Any = await asyncio.wait_for(coro(), timeout=10)
        except Exception as exc:  # the framework's own stop, inspected by the test
            result = exc
        await asyncio.sleep(0.05)  # let the workflow's finished tasks settle
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        assert not left, f"tasks left pending: {left}"
        return result

    began = time.monotonic()
    result = asyncio.run(main())
    return result, time.monotonic() - began


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream"])
def test_runaway_agent_stops_as_repeated_action(
    no_leftovers: None, spans: Any, streaming: bool
) -> None:
    provider, exporter = spans
    ran = [0]

    def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    agent = _agent([lookup], [[("lookup", {"order_id": "A1"})]], streaming=streaming)
    guarded = instrument(agent, POLICY, tracer_provider=provider)
    raised, elapsed = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
    assert elapsed < 5
    assert isinstance(raised, RunStopped), raised
    out = guarded.outcome
    assert raised.outcome == out
    assert out.stop.reason in (StopReason.REPEATED_ACTION, StopReason.ACTION_CYCLE)
    assert ran[0] <= 3
    assert out.usage.model_turns > 0
    assert out.stop.evidence is not None and out.stop.evidence.step_indices == (1, 2, 3)
    assert guarded.name == "support_bot"
    # one run, one stop, each model turn and tool call once, nothing after the stop
    (trace,) = assert_trace_invariants(exporter.get_finished_spans()).values()
    assert trace.run.name == "invoke_agent support_bot"
    assert len(trace.decisions) == out.usage.model_turns
    assert out.usage.tool_successes == ran[0]


class OrderTool(AsyncBaseTool):
    """A tool object of LlamaIndex's own kind (not a FunctionTool), sync and async."""

    def __init__(self) -> None:
        self.ran = 0

    @property
    def metadata(self) -> ToolMetadata:
        return ToolMetadata(name="lookup", description="Look an order up.")

    def call(self, input: Any = None, **kwargs: Any) -> ToolOutput:
        self.ran += 1
        return ToolOutput(
            content="status: pending", tool_name="lookup", raw_input=kwargs, raw_output=""
        )

    async def acall(self, input: Any = None, **kwargs: Any) -> ToolOutput:
        return self.call(input, **kwargs)


def test_runaway_with_a_base_tool_object(no_leftovers: None) -> None:
    tool = OrderTool()
    agent = _agent([tool], [[("lookup", {"order_id": "A1"})]])
    guarded = instrument(agent, POLICY)
    raised, elapsed = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
    assert elapsed < 5
    assert isinstance(raised, RunStopped), raised
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert tool.ran <= 3


def test_stop_run_raised_in_a_tool_body_ends_the_run(no_leftovers: None) -> None:
    """A StopRun (a BaseException) raised inside the workflow's tool step is answered as
    a stopped call; the caller gets RunStopped, never a hang."""
    holder: dict[str, Any] = {}

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        outcome = holder["g"]._session.run.cancel()
        raise StopRun(outcome.stop)

    agent = _agent([FunctionTool.from_defaults(lookup)], [[("lookup", {"order_id": "A1"})]])
    holder["g"] = guarded = instrument(agent, POLICY)
    raised, elapsed = _timed(lambda: guarded.run(user_msg="where is A1?"))
    assert elapsed < 5
    assert isinstance(raised, RunStopped), raised
    assert guarded.outcome.stop.reason is StopReason.CANCELLED


def test_succeeding_agent_completes(no_leftovers: None, spans: Any) -> None:
    provider, exporter = spans
    seen: list[str] = []

    def lookup(order_id: str) -> str:
        """Look an order up."""
        seen.append(order_id)
        return "status: shipped"

    agent = _agent([lookup], [[("lookup", {"order_id": "A1"})], "A1 has shipped."])
    guarded = instrument(agent, POLICY, tracer_provider=provider)
    result, _ = _timed(lambda: guarded.run(user_msg="where is A1?"))
    out = guarded.outcome
    assert out.stop.reason is StopReason.COMPLETED, out.stop
    assert str(result.response.content) == "A1 has shipped."
    assert out.answer == "A1 has shipped."
    assert seen == ["A1"]
    assert (out.usage.model_turns, out.usage.tool_successes) == (2, 1)
    assert (out.usage.input_tokens, out.usage.output_tokens) == (24, 8)
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("execute_tool lookup") == 1
    assert names.count("decide support_bot") == 2
    assert "invoke_agent support_bot" in names


def test_paginating_agent_is_not_stopped(no_leftovers: None) -> None:
    async def search(query: str, page: int) -> str:
        """Search orders, one page at a time."""
        return json.dumps({"page": page, "items": [f"order-{page}-{i}" for i in range(2)]})

    turns: list[Turn] = [[("search", {"query": "late", "page": p})] for p in range(1, 7)]
    agent = _agent([search], [*turns, "six pages read"])
    guarded = instrument(agent, POLICY)
    result, _ = _timed(lambda: guarded.run(user_msg="list late orders"))
    assert not isinstance(result, Exception), result
    assert guarded.outcome.stop.reason is StopReason.COMPLETED, guarded.outcome.stop
    assert guarded.outcome.usage.tool_successes == 6


def test_duplicate_write_stops_at_the_second_call(no_leftovers: None) -> None:
    made: list[str] = []

    def create_ticket(title: str) -> str:
        """Open a support ticket."""
        made.append(title)
        return f"ticket T-{len(made)}"

    policy = Policy(
        max_model_turns=30,
        max_tool_attempts=30,
        tools={"create_ticket": ToolPolicy(name="create_ticket", risk="write")},
    )
    agent = _agent([create_ticket], [[("create_ticket", {"title": "refund A1"})]])
    guarded = instrument(agent, policy)
    raised, _ = _timed(lambda: guarded.run(user_msg="refund A1"))
    assert isinstance(raised, RunStopped), raised
    out = guarded.outcome
    assert made == ["refund A1"]
    assert out.stop.reason is StopReason.REPEATED_ACTION, out.stop
    assert (out.usage.tool_successes, out.usage.tool_blocked, out.usage.model_turns) == (1, 1, 2)


def test_max_iterations_is_budget_exhausted(no_leftovers: None) -> None:
    async def search(query: str, page: int) -> str:
        """Search orders."""
        return f"page {page}"

    turns: list[Turn] = [[("search", {"query": "late", "page": p})] for p in range(1, 20)]
    agent = _agent([search], turns)
    guarded = instrument(agent, POLICY)
    raised, _ = _timed(lambda: guarded.run(user_msg="list", max_iterations=4))
    assert type(raised) is WorkflowRuntimeError, raised
    stop = guarded.outcome.stop
    assert stop.reason is StopReason.BUDGET_EXHAUSTED, stop
    assert (stop.dimension, stop.limit) == ("model_turns", 4)
    assert stop.evidence is not None and stop.evidence.detail["limit"] == "max_iterations"


def test_workflow_timeout_is_deadline_exceeded(no_leftovers: None) -> None:
    async def slow(query: str) -> str:
        """A slow search."""
        await asyncio.sleep(0.3)
        return "nothing yet"

    agent = _agent([slow], [[("slow", {"query": "late"})]], timeout=0.5)
    guarded = instrument(agent, POLICY)
    raised, elapsed = _timed(lambda: guarded.run(user_msg="list"))
    assert elapsed < 5
    assert isinstance(raised, WorkflowTimeoutError), raised
    stop = guarded.outcome.stop
    assert stop.reason is StopReason.DEADLINE_EXCEEDED, stop
    assert stop.limit == 0.5


def test_cancel_run_from_another_task_ends_the_run_as_cancelled(no_leftovers: None) -> None:
    async def slow(query: str) -> str:
        """A slow search."""
        await asyncio.sleep(3)
        return "nothing yet"

    agent = _agent([slow], [[("slow", {"query": "late"})]])
    guarded = instrument(agent, POLICY)

    async def cancel_soon() -> Any:
        async def cancel() -> None:
            await asyncio.sleep(0.3)
            await guarded.handler.cancel_run()

        canceller = asyncio.create_task(cancel())
        try:
            return await guarded.run(user_msg="list")
        finally:
            await canceller

    raised, elapsed = _timed(cancel_soon)
    assert elapsed < 3
    assert isinstance(raised, WorkflowCancelledByUser), raised
    assert guarded.outcome.stop.reason is StopReason.CANCELLED


def test_agent_workflow_guards_each_agent_under_the_root_agents_name(
    no_leftovers: None,
) -> None:
    ran = [0]

    def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    triage = FunctionAgent(
        name="triage",
        description="Triage",
        llm=ScriptedLLM([[("lookup", {"order_id": "A1"})]]),
        tools=[lookup],
        streaming=False,
    )
    workflow = AgentWorkflow(agents=[triage], root_agent="triage")
    guarded = instrument(workflow, POLICY)
    raised, elapsed = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
    assert elapsed < 5
    assert isinstance(raised, RunStopped), raised
    assert guarded.name == "triage"
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert ran[0] <= 3


REACT_LOOKUP = 'Thought: I need the order.\nAction: lookup\nAction Input: {"order_id": "A1"}'


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream"])
def test_react_agent_calls_are_read_from_its_text(no_leftovers: None, streaming: bool) -> None:
    """A ReActAgent's tool calls are in its text: read with its own parser, they are tool
    decisions, so the loop is a repeated action (not a repeated message)."""
    ran = [0]

    def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    agent = ReActAgent(
        name="react_bot", llm=ScriptedLLM([REACT_LOOKUP]), tools=[lookup], streaming=streaming
    )
    guarded = instrument(agent, POLICY)
    raised, elapsed = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
    assert elapsed < 5
    assert isinstance(raised, RunStopped), raised
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION, guarded.outcome.stop
    assert ran[0] <= 3


def test_react_agent_answer_completes(no_leftovers: None) -> None:
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return "status: shipped"

    answer = "Thought: I can answer now.\nAnswer: A1 has shipped."
    agent = ReActAgent(
        name="react_bot", llm=ScriptedLLM([REACT_LOOKUP, answer]), tools=[lookup], streaming=False
    )
    guarded = instrument(agent, POLICY)
    result, _ = _timed(lambda: guarded.run(user_msg="where is A1?"))
    assert not isinstance(result, Exception), result
    out = guarded.outcome
    assert out.stop.reason is StopReason.COMPLETED, out.stop
    assert out.answer == "A1 has shipped."
    assert (out.usage.model_turns, out.usage.tool_successes) == (2, 1)
