"""Issue 26 through LangGraph: ``handler.tool_node(tools)`` answers a nudged call with a
``ToolMessage`` (status success) holding the nudge, its body not run; a scripted chat
model drives ``create_react_agent``, no network."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from loopwatch.instrumentation import Policy, StopReason, StopRun
from loopwatch.instrumentation.integrations.langgraph import LoopwatchHandler
from loopwatch.instrumentation.testing import assert_trace_invariants

from .test_langgraph import call, inputs, react

POLICY = Policy(repeat_limit=3, max_model_turns=20, loop_response=("nudge", "stop"))
MARK = "loopwatch did not run this call"


def _tools(body: list[str]) -> list[Any]:
    @tool
    def lookup(q: str) -> str:
        """Look an order up."""
        body.append(q)
        return "order 7: pending"

    return [lookup]


def _obeying(n: int, messages: list[BaseMessage]) -> AIMessage:
    last = messages[-1]
    if isinstance(last, ToolMessage) and MARK in str(last.content):
        return call("lookup", n, q="order 8")
    if any(isinstance(m, ToolMessage) and MARK in str(m.content) for m in messages):
        return AIMessage(content="order 8 is pending")
    return call("lookup", n, q="order 7")


@pytest.mark.parametrize("handle_tool_errors", [False, True])
def test_ignored_nudge_is_a_tool_message_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None, handle_tool_errors: bool
) -> None:
    provider, exporter = spans
    body: list[str] = []
    seen: list[list[BaseMessage]] = []

    def ignoring(n: int, messages: list[BaseMessage]) -> AIMessage:
        seen.append(list(messages))
        return call("lookup", n, q="order 7")

    handler = LoopwatchHandler(POLICY, tracer_provider=provider)
    node = handler.tool_node(_tools(body), handle_tool_errors=handle_tool_errors)
    graph, model = react(ignoring, node)
    began = time.monotonic()
    with pytest.raises(StopRun) as raised:
        graph.invoke(inputs(), config={"callbacks": [handler], "recursion_limit": 50})
    assert time.monotonic() - began < 5
    assert raised.value.stop.reason is StopReason.REPEATED_ACTION
    outcome = handler.outcome
    assert outcome is not None
    assert len(body) == 2
    assert outcome.usage.model_turns == 4 and model.turns == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    # The fourth turn read the nudge as the third call's ToolMessage, not as an error.
    nudge = seen[3][-1]
    assert isinstance(nudge, ToolMessage) and nudge.status == "success"
    assert str(nudge.content).startswith(MARK) and nudge.tool_call_id == "call_3"
    assert_trace_invariants(exporter.get_finished_spans())


def test_obeyed_nudge_completes_with_one_recovered_nudge(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    body: list[str] = []
    handler = LoopwatchHandler(POLICY, tracer_provider=provider)
    graph, _ = react(_obeying, handler.tool_node(_tools(body)))
    result = graph.invoke(inputs(), config={"callbacks": [handler]})
    assert result["messages"][-1].content == "order 8 is pending"
    outcome = handler.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.COMPLETED
    assert body == ["order 7", "order 7", "order 8"]
    assert [n.result for n in outcome.nudges] == ["recovered"]
    assert_trace_invariants(exporter.get_finished_spans())


def test_async_graph_obeys_the_nudge(spans: Any, no_leftovers: None) -> None:
    provider, _ = spans
    body: list[str] = []

    @tool
    async def lookup(q: str) -> str:
        """Look an order up."""
        body.append(q)
        await asyncio.sleep(0)
        return "order 7: pending"

    handler = LoopwatchHandler(POLICY, tracer_provider=provider)
    graph, _ = react(_obeying, handler.tool_node([lookup]))
    result = asyncio.run(graph.ainvoke(inputs(), config={"callbacks": [handler]}))
    assert result["messages"][-1].content == "order 8 is pending"
    outcome = handler.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED
    assert body == ["order 7", "order 7", "order 8"]
    assert [n.result for n in outcome.nudges] == ["recovered"]
