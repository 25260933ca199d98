"""Hostile route B tests for the LangGraph adapter: streams the caller stops reading,
concurrent invocations sharing one handler, an A-B-A-B cycle over two tools, observe
mode. A scripted chat model (see test_langgraph), no network."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.errors import NodeTimeoutError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from loopwatch.instrumentation import Policy, StopReason, StopRun
from loopwatch.instrumentation.integrations.langgraph import LoopwatchHandler

from .test_langgraph import ScriptedChatModel, call, inputs, react, run_spans


def make_lookup(bodies: list[str]) -> Any:
    @tool
    def lookup(q: str) -> str:
        """Look an order up."""
        bodies.append(q)
        return "order 7: pending"

    return lookup


def test_a_stream_closed_by_its_reader_is_cancelled_not_an_error(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    graph, _ = react(lambda n, _m: call("lookup", n, q=f"order {n}"), [make_lookup([])])
    handler = LoopwatchHandler(tracer_provider=provider)
    stream = graph.stream(inputs(), config={"callbacks": [handler], "recursion_limit": 200})
    next(stream)
    next(stream)
    stream.close()
    assert handler.outcome is not None
    # an `error` stop here would be a phantom infrastructure failure in the metrics
    assert handler.outcome.stop.reason is StopReason.CANCELLED
    assert len(run_spans(exporter)) == 1


def test_an_async_stream_closed_by_its_reader_is_cancelled(no_leftovers: None) -> None:
    graph, _ = react(lambda n, _m: call("lookup", n, q=f"order {n}"), [make_lookup([])])
    handler = LoopwatchHandler()

    async def read_two() -> None:
        stream = graph.astream(inputs(), config={"callbacks": [handler], "recursion_limit": 200})
        await stream.__anext__()
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(read_two())
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.CANCELLED


def test_a_runaway_stream_stops_as_repeated_action(no_leftovers: None) -> None:
    bodies: list[str] = []
    graph, _ = react(lambda n, _m: call("lookup", n, q="order 7"), [make_lookup(bodies)])
    handler = LoopwatchHandler(Policy(repeat_limit=3))
    began = time.monotonic()
    with pytest.raises(StopRun):
        for _ in graph.stream(inputs(), config={"callbacks": [handler], "recursion_limit": 200}):
            pass
    assert time.monotonic() - began < 5
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(bodies) <= 3


def test_concurrent_invocations_sharing_one_handler_get_their_own_runs(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    bodies: list[str] = []

    @tool
    async def lookup(q: str) -> str:
        """Look an order up."""
        bodies.append(q)
        await asyncio.sleep(0.01)  # lets the two invocations interleave
        return "order 7: pending"

    graph, _ = react(lambda n, _m: call("lookup", n, q="order 7"), [lookup])
    handler = LoopwatchHandler(Policy(repeat_limit=3), tracer_provider=provider)
    config: Any = {"callbacks": [handler], "recursion_limit": 200}

    async def both() -> list[Any]:
        return await asyncio.gather(
            graph.ainvoke(inputs(), config=config),
            graph.ainvoke(inputs(), config=config),
            return_exceptions=True,
        )

    results = asyncio.run(both())
    assert all(isinstance(r, StopRun) for r in results), results
    assert [r.stop.reason for r in results] == [StopReason.REPEATED_ACTION] * 2
    assert len(bodies) == 4  # two per run: each run's third identical call is blocked
    assert len(run_spans(exporter)) == 2


def test_concurrent_threads_sharing_one_handler_get_their_own_runs(no_leftovers: None) -> None:
    bodies: list[str] = []
    graph, _ = react(lambda n, _m: call("lookup", n, q="order 7"), [make_lookup(bodies)])
    handler = LoopwatchHandler(Policy(repeat_limit=3))
    reasons: list[Any] = []

    def invoke() -> None:
        try:
            graph.invoke(inputs(), config={"callbacks": [handler], "recursion_limit": 200})
        except StopRun as stop:
            reasons.append(stop.stop.reason)

    threads = [threading.Thread(target=invoke) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert reasons == [StopReason.REPEATED_ACTION] * 2
    assert len(bodies) == 4


def test_an_a_b_a_b_cycle_over_two_tools_stops_as_action_cycle(no_leftovers: None) -> None:
    bodies: list[str] = []

    @tool
    def status(q: str) -> str:
        """The order's status."""
        bodies.append("status")
        return "pending"

    graph, _ = react(
        lambda n, _m: call("lookup" if n % 2 else "status", n, q="order 7"),
        [make_lookup(bodies), status],
    )
    handler = LoopwatchHandler(Policy(repeat_limit=3))
    with pytest.raises(StopRun) as raised:
        graph.invoke(inputs(), config={"callbacks": [handler], "recursion_limit": 200})
    assert raised.value.stop.reason is StopReason.ACTION_CYCLE
    assert len(bodies) <= 6


def test_observe_mode_refuses_nothing_and_records_the_would_stop(no_leftovers: None) -> None:
    bodies: list[str] = []
    graph, _ = react(
        lambda n, _m: call("lookup", n, q="order 7") if n <= 5 else AIMessage(content="done"),
        [make_lookup(bodies)],
    )
    handler = LoopwatchHandler(Policy(repeat_limit=3), mode="observe")
    graph.invoke(inputs(), config={"callbacks": [handler]})
    assert len(bodies) == 5
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.COMPLETED
    assert handler.outcome.observed_stops[0].reason is StopReason.REPEATED_ACTION


def test_a_hanging_tool_under_a_node_timeout_is_deadline_exceeded(no_leftovers: None) -> None:
    # The handler cannot bound a tool body (LangChain runs it); LangGraph's own node
    # timeout can, for async nodes. Its end maps onto the taxonomy.
    @tool
    async def lookup(q: str) -> str:
        """Look an order up."""
        await asyncio.sleep(30)
        return "order 7: pending"

    model = ScriptedChatModel(
        script=lambda n, _m: call("lookup", n, q="7") if n == 1 else AIMessage(content="done")
    )

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup]), timeout=0.3)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(name="support")
    handler = LoopwatchHandler()
    began = time.monotonic()
    with pytest.raises(NodeTimeoutError):
        asyncio.run(graph.ainvoke(inputs(), config={"callbacks": [handler]}))
    assert time.monotonic() - began < 5
    outcome = handler.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.DEADLINE_EXCEEDED
    assert outcome.stop.dimension == "elapsed_seconds"
    assert outcome.stop.limit == pytest.approx(0.3)
    assert outcome.stop.evidence.detail == {"framework": "langgraph", "limit": "node_timeout"}
    assert outcome.usage.tool_errors == 1
