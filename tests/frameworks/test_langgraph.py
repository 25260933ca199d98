"""Live tests of the LangGraph / LangChain adapter (route B): a ReAct graph from
``create_react_agent`` driven by a scripted chat model (a ``BaseChatModel`` subclass), no
network. Each test builds its own handler, policy and tracer provider."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool, tool
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from loopwatch.instrumentation import Policy, Run, StopReason, StopRun, ToolPolicy
from loopwatch.instrumentation.integrations.langgraph import (
    LoopwatchHandler,
    tool_risks,
)

Script = Callable[[int, list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose n-th turn (1-based) is ``script(n, messages)``; it reports 10
    input and 5 output tokens per turn, as a provider's usage would."""

    script: Any
    turns: int = 0
    model_name: str = "scripted"  # what LangChain reports as ls_model_name

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.turns += 1
        message = self.script(self.turns, messages)
        message.usage_metadata = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
        return ChatResult(generations=[ChatGeneration(message=message)])


def call(name: str, n: int, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{n}"}])


def react(script: Script, tools: list[Any], name: str = "support") -> tuple[Any, ScriptedChatModel]:
    model = ScriptedChatModel(script=script)
    with warnings.catch_warnings():
        # create_react_agent is deprecated for langchain's create_agent (not installed
        # here); it is still LangGraph 1.x's prebuilt ReAct graph.
        warnings.simplefilter("ignore")
        return create_react_agent(model, tools, name=name), model


def inputs(text: str = "help") -> dict[str, Any]:
    return {"messages": [("user", text)]}


def run_spans(exporter: Any) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]


def test_runaway_graph_stops_as_repeated_action(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    bodies: list[str] = []

    @tool
    def lookup(q: str) -> str:
        """Look an order up."""
        bodies.append(q)
        return "order 7: pending"

    graph, _ = react(lambda n, _m: call("lookup", n, q="order 7"), [lookup])
    handler = LoopwatchHandler(Policy(repeat_limit=3), tracer_provider=provider)
    began = time.monotonic()
    with pytest.raises(StopRun) as raised:
        graph.invoke(inputs(), config={"callbacks": [handler], "recursion_limit": 200})
    assert time.monotonic() - began < 5
    outcome = handler.outcome
    assert outcome is not None
    assert raised.value.stop.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.reason in (StopReason.REPEATED_ACTION, StopReason.ACTION_CYCLE)
    assert len(bodies) <= 3
    assert outcome.usage.model_turns >= 3
    assert outcome.usage.tokens == 15 * outcome.usage.model_turns
    assert len(set(outcome.stop.evidence.step_indices)) > 1  # steps advance per turn
    (run_span,) = run_spans(exporter)  # one run per invocation, named after the graph
    assert run_span.name == "invoke_agent support"


def test_succeeding_graph_completes(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans

    @tool
    def lookup(q: str) -> str:
        """Look an order up."""
        return "order 7: shipped"

    def script(n: int, _m: Any) -> AIMessage:
        return call("lookup", n, q="order 7") if n == 1 else AIMessage(content="It shipped.")

    graph, _ = react(script, [lookup])
    handler = LoopwatchHandler(tracer_provider=provider)
    result = graph.invoke(inputs(), config={"callbacks": [handler]})
    assert result["messages"][-1].content == "It shipped."
    outcome = handler.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.COMPLETED
    assert outcome.answer == "It shipped."
    assert (outcome.usage.model_turns, outcome.usage.tool_successes) == (2, 1)
    assert len(run_spans(exporter)) == 1


def test_paginating_graph_is_not_stopped(no_leftovers: None) -> None:
    @tool
    def list_orders(page: int) -> str:
        """List one page of orders."""
        return f"orders {page * 10}..{page * 10 + 9}"

    def script(n: int, _m: Any) -> AIMessage:
        return call("list_orders", n, page=n) if n <= 6 else AIMessage(content="60 orders.")

    graph, _ = react(script, [list_orders])
    handler = LoopwatchHandler(Policy(repeat_limit=3))
    result = graph.invoke(inputs(), config={"callbacks": [handler]})
    assert result["messages"][-1].content == "60 orders."
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.COMPLETED
    assert handler.outcome.usage.tool_successes == 6


def test_duplicate_write_is_stopped_at_the_second_call(no_leftovers: None) -> None:
    created: list[str] = []

    @tool
    def create_ticket(title: str) -> str:
        """Open a support ticket."""
        created.append(title)
        return f"ticket #{len(created)} created"  # a new id each call: still a duplicate

    graph, _ = react(lambda n, _m: call("create_ticket", n, title="refund"), [create_ticket])
    policy = Policy(tools={"create_ticket": ToolPolicy(name="create_ticket", risk="write")})
    handler = LoopwatchHandler(policy)
    with pytest.raises(StopRun):
        graph.invoke(inputs(), config={"callbacks": [handler]})
    assert created == ["refund"]
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert (handler.outcome.usage.tool_attempts, handler.outcome.usage.tool_blocked) == (1, 1)


def test_react_step_limit_is_budget_exhausted_on_model_turns(no_leftovers: None) -> None:
    # create_react_agent counts the recursion limit down (remaining_steps) and answers
    # "Sorry, need more steps" instead of a turn's tool calls when no round fits.
    @tool
    def list_orders(page: int) -> str:
        """List one page of orders."""
        return f"orders page {page}"

    graph, _ = react(lambda n, _m: call("list_orders", n, page=n), [list_orders])
    handler = LoopwatchHandler(Policy(repeat_limit=3))
    result = graph.invoke(inputs(), config={"callbacks": [handler], "recursion_limit": 6})
    assert result["messages"][-1].content.startswith("Sorry, need more steps")
    outcome = handler.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension == "model_turns"
    assert outcome.stop.evidence.detail == {"framework": "langgraph", "limit": "remaining_steps"}
    assert outcome.usage.model_turns == 3


class LoopState(TypedDict):
    pages: int


def test_graph_recursion_error_is_budget_exhausted_on_model_turns(no_leftovers: None) -> None:
    model = ScriptedChatModel(script=lambda n, _m: AIMessage(content=f"page {n}"))

    def think(state: LoopState) -> LoopState:
        model.invoke("next page?")
        return {"pages": state["pages"] + 1}

    builder = StateGraph(LoopState)
    builder.add_node("think", think)
    builder.add_edge(START, "think")
    builder.add_edge("think", "think")  # never ends: only the recursion limit stops it
    graph = builder.compile(name="pager")
    handler = LoopwatchHandler(Policy(max_model_turns=50))
    with pytest.raises(GraphRecursionError):  # the framework's own exception, as usual
        graph.invoke({"pages": 0}, config={"callbacks": [handler], "recursion_limit": 5})
    outcome = handler.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension == "model_turns"
    assert (outcome.stop.limit, outcome.stop.observed) == (5, 5)
    assert outcome.stop.evidence.detail == {"framework": "langgraph", "limit": "recursion_limit"}
    assert outcome.usage.model_turns == 5


def test_async_graph_with_async_tool_stops(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    bodies: list[str] = []

    async def fetch(q: str) -> str:
        bodies.append(q)
        await asyncio.sleep(0)
        return "order 7: pending"

    fetch_tool = StructuredTool.from_function(
        coroutine=fetch, name="fetch", description="Fetch an order."
    )
    graph, _ = react(lambda n, _m: call("fetch", n, q="order 7"), [fetch_tool])
    handler = LoopwatchHandler(Policy(repeat_limit=3), tracer_provider=provider)

    async def main() -> list[asyncio.Task[Any]]:
        with pytest.raises(StopRun):
            await graph.ainvoke(inputs(), config={"callbacks": [handler]})
        current = asyncio.current_task()
        return [t for t in asyncio.all_tasks() if t is not current and not t.done()]

    began = time.monotonic()
    assert asyncio.run(main()) == []  # no task of the graph left pending
    assert time.monotonic() - began < 5
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(bodies) <= 3
    assert handler.outcome.usage.model_turns > 0
    assert len(run_spans(exporter)) == 1


def test_model_turn_refused_before_the_request(no_leftovers: None) -> None:
    @tool
    def list_orders(page: int) -> str:
        """List one page of orders."""
        return f"orders page {page}"

    graph, model = react(lambda n, _m: call("list_orders", n, page=n), [list_orders])
    handler = LoopwatchHandler(Policy(max_model_turns=2))
    with pytest.raises(StopRun):
        graph.invoke(inputs(), config={"callbacks": [handler]})
    assert model.turns == 2  # the third turn never reached the model
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert handler.outcome.stop.dimension == "model_turns"


def test_plain_langchain_loop_inside_a_run_is_one_run(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans

    @tool
    def lookup(q: str) -> str:
        """Look an order up."""
        return "order 7: pending"

    model = ScriptedChatModel(script=lambda n, _m: call("lookup", n, q="order 7"))
    handler = LoopwatchHandler()
    config: Any = {"callbacks": [handler]}
    with Run("hand-written", Policy(repeat_limit=2), tracer_provider=provider) as run:
        for _ in range(10):
            message = model.invoke("help", config=config)
            for c in message.tool_calls:
                lookup.invoke(c, config=config)
    assert run.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert run.outcome.usage.model_turns == 2
    assert [s.name for s in run_spans(exporter)] == ["invoke_agent hand-written"]
    assert handler.outcome is None  # the handler started no run of its own


def test_mcp_annotations_declare_tool_risk() -> None:
    @tool
    def delete_order(order_id: str) -> str:
        """Delete an order."""
        return "deleted"

    @tool
    def get_order(order_id: str) -> str:
        """Get an order."""
        return "order"

    delete_order.metadata = {"annotations": {"destructiveHint": True}}
    get_order.metadata = {"readOnlyHint": True, "destructiveHint": False}
    assert tool_risks([delete_order, get_order]) == {"delete_order": "write", "get_order": "read"}
    handler = LoopwatchHandler(tools=[delete_order, get_order])
    assert handler.policy.tool("delete_order").risk == "write"


def test_cost_comes_from_the_price_table(no_leftovers: None) -> None:
    @tool
    def lookup(q: str) -> str:
        """Look an order up."""
        return "order 7: shipped"

    def script(n: int, _m: Any) -> AIMessage:
        return call("lookup", n, q="order 7") if n == 1 else AIMessage(content="Shipped.")

    graph, model = react(script, [lookup])
    model.model_name = "gpt-4o"
    handler = LoopwatchHandler()
    graph.invoke(inputs(), config={"callbacks": [handler]})
    assert handler.outcome is not None
    # genai-prices: gpt-4o at $2.50 / $10 per million input / output tokens
    assert handler.outcome.usage.cost_usd == pytest.approx(2 * (10 * 2.5 + 5 * 10) / 1e6)


def test_nested_graph_is_part_of_its_parents_run(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans

    @tool
    def lookup(q: str) -> str:
        """Look an order up."""
        return "order 7: shipped"

    def script(n: int, _m: Any) -> AIMessage:
        return call("lookup", n, q="order 7") if n == 1 else AIMessage(content="Shipped.")

    inner, _ = react(script, [lookup], name="researcher")

    def research(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": inner.invoke(state)["messages"][-1:]}

    builder = StateGraph(MessagesState)
    builder.add_node("research", research)
    builder.add_edge(START, "research")
    outer = builder.compile(name="desk")
    handler = LoopwatchHandler(tracer_provider=provider)
    outer.invoke(inputs(), config={"callbacks": [handler]})
    assert handler.outcome is not None
    assert handler.outcome.stop.reason is StopReason.COMPLETED
    assert handler.outcome.usage.model_turns == 2  # the inner agent's turns, counted once
    assert [s.name for s in run_spans(exporter)] == ["invoke_agent desk"]
