"""Route B live tests for AutoGen AgentChat: a scripted model (autogen-ext's
ReplayChatCompletionClient), real AssistantAgents, FunctionTools and teams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.replay")

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import CreateResult, ModelFamily, ModelInfo, RequestUsage
from autogen_core.tools import FunctionTool
from autogen_ext.models.replay import ReplayChatCompletionClient
from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.errors import StopRun
from loopwatch.instrumentation.integrations.autogen import instrument
from loopwatch.instrumentation.policy import ToolPolicy
from loopwatch.instrumentation.testing import assert_trace_invariants

INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)
POLICY = Policy(max_model_turns=20, max_tool_attempts=30, repeat_limit=3)


def _calls(*calls: tuple[str, dict[str, Any]]) -> CreateResult:
    return CreateResult(
        finish_reason="function_calls",
        content=[
            FunctionCall(id=f"call_{i}_{name}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(calls)
        ],
        usage=RequestUsage(prompt_tokens=10, completion_tokens=5),
        cached=False,
    )


def _text(text: str) -> CreateResult:
    return CreateResult(
        finish_reason="stop",
        content=text,
        usage=RequestUsage(prompt_tokens=10, completion_tokens=5),
        cached=False,
    )


def _model(*turns: CreateResult) -> Any:
    return ReplayChatCompletionClient(list(turns), model_info=INFO)


def _agent(tools: list[Any], *turns: CreateResult, **kw: Any) -> AssistantAgent:
    return AssistantAgent("support_bot", model_client=_model(*turns), tools=tools, **kw)


def _timed(coro: Callable[[], Coroutine[Any, Any, Any]]) -> tuple[Any, float]:
    """Run ``coro()`` in a fresh loop; fails when a task of the loop is left pending."""

    async def main() -> Any:
        result = await asyncio.wait_for(coro(), timeout=10)
        await asyncio.sleep(0)  # let finished tasks settle
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        assert not left, f"tasks left pending: {left}"
        return result

    began = time.monotonic()
    result = asyncio.run(main())
    return result, time.monotonic() - began


class Counter:
    def __init__(self) -> None:
        self.calls = 0


def test_runaway_agent_stops_inside_the_unawaited_tool_task(no_leftovers: None, spans: Any) -> None:
    provider, exporter = spans
    runs = Counter()

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        runs.calls += 1
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(("lookup", {"order_id": "A1"}))] * 12,
        max_tool_iterations=12,
    )
    guarded = instrument(agent, POLICY, tracer_provider=provider)
    result, elapsed = _timed(lambda: guarded.run(task="where is A1?"))
    assert elapsed < 5
    out = guarded.outcome
    assert out.stop.reason in (StopReason.REPEATED_ACTION, StopReason.ACTION_CYCLE)
    assert runs.calls <= 3
    assert out.usage.model_turns > 0
    assert result.stop_reason == f"loopwatch: {out.stop.reason}"
    assert guarded.name == "support_bot"
    # one run, one stop, each tool call once (counters equal spans), nothing after the stop
    (trace,) = assert_trace_invariants(exporter.get_finished_spans()).values()
    assert trace.run.name == "invoke_agent support_bot"
    assert out.usage.tool_successes == runs.calls


def test_stop_run_raised_in_a_tool_body_never_hangs(no_leftovers: None) -> None:
    """The issue's hang: a BaseException raised in AutoGen's tool task, which AutoGen never
    awaits before it waits on its queue."""
    holder: dict[str, Any] = {}

    def lookup(order_id: str) -> str:
        """Look an order up."""
        outcome = holder["g"]._session.run.cancel()
        raise StopRun(outcome.stop)

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(("lookup", {"order_id": "A1"}))] * 5,
        max_tool_iterations=5,
    )
    holder["g"] = guarded = instrument(agent, POLICY)
    result, elapsed = _timed(lambda: guarded.run(task="where is A1?"))
    assert elapsed < 5
    assert guarded.outcome.stop.reason is StopReason.CANCELLED
    assert result.stop_reason == "loopwatch: cancelled"


def test_caller_cancelling_its_token_mid_tool_never_hangs(no_leftovers: None) -> None:
    """Plain AutoGen 0.7.5 hangs here: the token cancels the tool's future, the
    CancelledError ends the tool task, and the agent waits on its queue forever."""

    async def slow_lookup(order_id: str) -> str:
        """Look an order up, slowly."""
        await asyncio.sleep(2)
        return "status: pending"

    agent = _agent(
        [slow_lookup], *[_calls(("slow_lookup", {"order_id": "A1"}))] * 3, max_tool_iterations=3
    )
    guarded = instrument(agent, POLICY)

    async def cancel_soon() -> Any:
        token = CancellationToken()
        asyncio.get_running_loop().call_later(0.2, token.cancel)
        return await guarded.run(task="where is A1?", cancellation_token=token)

    result, elapsed = _timed(cancel_soon)
    assert elapsed < 2
    assert guarded.outcome.stop.reason is StopReason.CANCELLED
    assert result.stop_reason == "loopwatch: cancelled"


def test_succeeding_agent_completes(no_leftovers: None, spans: Any) -> None:
    provider, exporter = spans
    seen: list[str] = []

    def lookup(order_id: str) -> str:
        """Look an order up."""
        seen.append(order_id)
        return "status: shipped"

    agent = _agent(
        [lookup],
        _calls(("lookup", {"order_id": "A1"})),
        _text("A1 has shipped."),
        max_tool_iterations=5,
    )
    guarded = instrument(agent, POLICY, tracer_provider=provider)
    result, _ = _timed(lambda: guarded.run(task="where is A1?"))
    out = guarded.outcome
    assert out.stop.reason is StopReason.COMPLETED, out.stop
    assert out.answer == "A1 has shipped."
    assert seen == ["A1"]
    assert out.usage.model_turns == 2
    assert out.usage.tool_successes == 1
    assert result.messages[-1].content == "A1 has shipped."
    assert result.stop_reason is None  # AutoGen's own result, untouched
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("execute_tool lookup") == 1
    assert "invoke_agent support_bot" in names
    # the agent's saved config names its own client and tools, not loopwatch's wrappers
    config = agent.dump_component().config
    assert config["model_client"]["provider"].endswith("ReplayChatCompletionClient")
    assert "lookup" in json.dumps(config["workbench"])


def test_paginating_agent_is_not_stopped(no_leftovers: None) -> None:
    def search(query: str, page: int) -> str:
        """Search orders, one page at a time."""
        return json.dumps({"page": page, "items": [f"order-{page}-{i}" for i in range(2)]})

    turns = [_calls(("search", {"query": "late", "page": p})) for p in range(1, 7)]
    agent = _agent([search], *turns, _text("done"), max_tool_iterations=10)
    guarded = instrument(agent, POLICY)
    _timed(lambda: guarded.run(task="list late orders"))
    assert guarded.outcome.stop.reason is StopReason.COMPLETED, guarded.outcome.stop
    assert guarded.outcome.usage.tool_successes == 6


def test_duplicate_write_stops_at_the_second_call(no_leftovers: None) -> None:
    made: list[str] = []

    def create_ticket(title: str) -> str:
        """Open a support ticket."""
        made.append(title)
        return f"ticket T-{len(made)}"

    policy = Policy(
        max_model_turns=20,
        max_tool_attempts=30,
        tools={"create_ticket": ToolPolicy(name="create_ticket", risk="write")},
    )
    agent = _agent(
        [create_ticket],
        *[_calls(("create_ticket", {"title": "refund A1"}))] * 4,
        max_tool_iterations=4,
    )
    guarded = instrument(agent, policy)
    _timed(lambda: guarded.run(task="refund A1"))
    assert made == ["refund A1"]
    out = guarded.outcome
    assert out.status == "stopped"
    assert out.stop.reason is StopReason.REPEATED_ACTION, out.stop
    # the second create_ticket is refused at dispatch: blocked, never run, no third turn
    assert (out.usage.tool_successes, out.usage.tool_blocked, out.usage.model_turns) == (1, 1, 2)


def test_max_tool_iterations_is_budget_exhausted(no_leftovers: None) -> None:
    def search(query: str, page: int) -> str:
        """Search orders."""
        return f"page {page}"

    turns = [_calls(("search", {"query": "late", "page": p})) for p in range(1, 4)]
    agent = _agent([search], *turns, max_tool_iterations=3)
    guarded = instrument(agent, POLICY)
    _timed(lambda: guarded.run(task="list"))
    stop = guarded.outcome.stop
    assert stop.reason is StopReason.BUDGET_EXHAUSTED
    assert stop.dimension == "model_turns"
    assert stop.limit == 3


def test_team_max_turns_is_budget_exhausted(no_leftovers: None) -> None:
    def search(query: str, page: int) -> str:
        """Search orders."""
        return f"page {page}"

    turns = [_calls(("search", {"query": "late", "page": p})) for p in range(1, 5)]
    team = RoundRobinGroupChat([_agent([search], *turns)], max_turns=3, name="triage")
    guarded = instrument(team, POLICY)
    result, _ = _timed(lambda: guarded.run(task="list"))
    stop = guarded.outcome.stop
    assert guarded.name == "triage"
    assert stop.reason is StopReason.BUDGET_EXHAUSTED, stop
    assert stop.dimension == "model_turns"
    assert stop.limit == 3
    assert result.stop_reason.startswith("Maximum number of turns")


@pytest.mark.parametrize("iterations", [1, 12], ids=["between-turns", "inside-a-turn"])
def test_runaway_team_stops(no_leftovers: None, iterations: int) -> None:
    """In a team the agent runs in a handler task of AutoGen's runtime that the caller does
    not await: the stop must still come back to the caller, and the runtime go idle. With
    one tool call per turn the termination condition ends the team between turns; with
    many, the refused model request ends the agent's turn with RunStopped inside the
    handler, which the team reports as its error."""
    runs = Counter()

    def lookup(order_id: str) -> str:
        """Look an order up."""
        runs.calls += 1
        return "status: pending"

    agent = _agent(
        [lookup], *[_calls(("lookup", {"order_id": "A1"}))] * 12, max_tool_iterations=iterations
    )
    team = RoundRobinGroupChat(
        [agent], termination_condition=MaxMessageTermination(40), name="triage"
    )
    guarded = instrument(team, POLICY)
    result, elapsed = _timed(lambda: guarded.run(task="where is A1?"))
    assert elapsed < 5
    assert guarded.outcome.stop.reason in (StopReason.REPEATED_ACTION, StopReason.ACTION_CYCLE)
    assert runs.calls <= 3
    assert guarded.outcome.usage.model_turns > 0
    assert result.stop_reason.startswith("loopwatch: ")


def test_streaming_model_client_path(no_leftovers: None) -> None:
    runs = Counter()

    def lookup(order_id: str) -> str:
        """Look an order up."""
        runs.calls += 1
        return "status: pending"

    agent = _agent(
        [lookup],
        *[_calls(("lookup", {"order_id": "A1"}))] * 8,
        max_tool_iterations=8,
        model_client_stream=True,
    )
    guarded = instrument(agent, POLICY)
    _, elapsed = _timed(lambda: guarded.run(task="where is A1?"))
    assert elapsed < 5
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert runs.calls <= 3
