"""Identical tool calls issued in parallel within one model turn, through real frameworks.

Regression (issue 25, a hostile test of the adapters): the repeat detector saw a call only
once its result was recorded, so LangGraph's ToolNode ran the body of 6 identical calls
of one ``AIMessage`` 4 times and smolagents' ToolCallingAgent 5 times. Identical calls in
flight now count at dispatch: with ``repeat_limit=3`` the body runs at most 3 times (2 in
practice: the third occurrence is refused) and the run stops as ``repeated_action``.
Differing calls in parallel all run. Each tool body holds for a moment so the calls
overlap; the frameworks' own executors run them concurrently.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("smolagents")

from langchain_core.messages import AIMessage
from langchain_core.tools import tool as lc_tool
from langgraph.prebuilt import create_react_agent
from loopwatch.instrumentation import Policy, StopReason, StopRun
from loopwatch.instrumentation import runs as _runs
from loopwatch.instrumentation.integrations.langgraph import LoopwatchHandler
from loopwatch.instrumentation.integrations.smolagents import instrument
from smolagents import ToolCallingAgent
from smolagents import tool as smol_tool
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
)
from smolagents.monitoring import LogLevel

from .test_langgraph import ScriptedChatModel
from .test_smolagents import ScriptedModel

CALLS = 6
LIMIT = 3
HOLD_SECONDS = 0.2  # each body holds this long, so the parallel calls overlap


@pytest.fixture(autouse=True, scope="module")
def _tool_workers_started() -> None:
    """Start loopwatch's shared tool worker threads up front (as test_smolagents does): a
    pool worker idling after a run is the process's pool, not a leftover of the run."""
    release = threading.Event()
    pool = _runs._tool_executor()
    futures = [pool.submit(release.wait, 5) for _ in range(2 * CALLS)]
    release.set()
    for future in futures:
        future.result()


class Bodies:
    """Counts tool bodies run, and the most that ran at the same time."""

    def __init__(self) -> None:
        self.ran = 0
        self.now = 0
        self.most = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.ran += 1
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


# ----------------------------------------------------------------------- LangGraph


def langgraph_turn(n: int, orders: list[str]) -> AIMessage:
    if n > 1:
        return AIMessage(content="Order 7 is pending.")
    calls = [{"name": "lookup", "args": {"q": q}, "id": f"call_{i}"} for i, q in enumerate(orders)]
    return AIMessage(content="", tool_calls=calls)


def langgraph_agent(bodies: Bodies, orders: list[str], *, is_async: bool) -> Any:
    if is_async:

        @lc_tool
        async def lookup(q: str) -> str:
            """Look an order up."""
            bodies.enter()
            await asyncio.sleep(HOLD_SECONDS)
            bodies.leave()
            return f"{q}: pending"

        tools = [lookup]
    else:

        @lc_tool
        def lookup(q: str) -> str:
            """Look an order up."""
            bodies.enter()
            threading.Event().wait(HOLD_SECONDS)
            bodies.leave()
            return f"{q}: pending"

        tools = [lookup]
    model = ScriptedChatModel(script=lambda n, _m: langgraph_turn(n, orders))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's deprecation notice
        return create_react_agent(model, tools, name="parallel")


@pytest.mark.parametrize("is_async", [False, True], ids=["invoke", "ainvoke"])
def test_langgraph_toolnode_runs_identical_parallel_calls_at_most_repeat_limit_times(
    is_async: bool, no_leftovers: None
) -> None:
    bodies = Bodies()
    graph = langgraph_agent(bodies, ["order 7"] * CALLS, is_async=is_async)
    handler = LoopwatchHandler(Policy(repeat_limit=LIMIT))
    config = {"callbacks": [handler], "recursion_limit": 50}
    began = time.monotonic()
    with pytest.raises(StopRun) as raised:
        if is_async:
            asyncio.run(graph.ainvoke({"messages": [("user", "where is 7?")]}, config=config))
        else:
            graph.invoke({"messages": [("user", "where is 7?")]}, config=config)
    assert time.monotonic() - began < 5
    assert bodies.ran <= LIMIT
    assert raised.value.stop.reason is StopReason.REPEATED_ACTION
    outcome = handler.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.evidence.detail.get("in_flight", 0) >= 1
    assert outcome.usage.model_turns == 1


def test_langgraph_toolnode_runs_differing_parallel_calls(no_leftovers: None) -> None:
    bodies = Bodies()
    graph = langgraph_agent(bodies, [f"order {i}" for i in range(CALLS)], is_async=False)
    handler = LoopwatchHandler(Policy(repeat_limit=LIMIT))
    result = graph.invoke({"messages": [("user", "where are they?")]}, {"callbacks": [handler]})
    assert result["messages"][-1].content == "Order 7 is pending."
    assert bodies.ran == CALLS
    assert bodies.most > 1  # they did run in parallel
    outcome = handler.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED


# ---------------------------------------------------------------------- smolagents


def smolagents_turn(n: int, orders: list[str]) -> ChatMessage:
    if n > 1:
        calls = [("final_answer", {"answer": "pending"})]
    else:
        calls = [("lookup", {"q": q}) for q in orders]
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[
            ChatMessageToolCall(
                id=f"call_{n}_{i}",
                type="function",
                function=ChatMessageToolCallFunction(name=name, arguments=args),
            )
            for i, (name, args) in enumerate(calls)
        ],
    )


def smolagents_agent(bodies: Bodies, orders: list[str]) -> ToolCallingAgent:
    @smol_tool
    def lookup(q: str) -> str:
        """Look an order up.

        Args:
            q: the order to look up.
        """
        bodies.enter()
        threading.Event().wait(HOLD_SECONDS)
        bodies.leave()
        return f"{q}: pending"

    return ToolCallingAgent(
        tools=[lookup],
        model=ScriptedModel(lambda n: smolagents_turn(n, orders)),
        name="smol_parallel",
        verbosity_level=LogLevel.OFF,
        max_tool_threads=CALLS,
    )


def test_smolagents_runs_identical_parallel_calls_at_most_repeat_limit_times(
    no_leftovers: None,
) -> None:
    bodies = Bodies()
    agent = smolagents_agent(bodies, ["order 7"] * CALLS)
    guard = instrument(agent, Policy(repeat_limit=LIMIT))
    began = time.monotonic()
    with pytest.raises(StopRun) as raised:
        agent.run("Where is order 7?")
    assert time.monotonic() - began < 5
    assert bodies.ran <= LIMIT
    assert raised.value.stop.reason is StopReason.REPEATED_ACTION
    outcome = guard.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.evidence.detail.get("in_flight", 0) >= 1
    assert outcome.usage.model_turns == 1


def test_smolagents_runs_differing_parallel_calls(no_leftovers: None) -> None:
    bodies = Bodies()
    agent = smolagents_agent(bodies, [f"order {i}" for i in range(CALLS)])
    guard = instrument(agent, Policy(repeat_limit=LIMIT))
    assert agent.run("Where are they?") == "pending"
    assert bodies.ran == CALLS
    assert bodies.most > 1  # they did run in parallel
    outcome = guard.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED
