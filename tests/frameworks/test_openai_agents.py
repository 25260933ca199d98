"""Route B, OpenAI Agents SDK: guarded_run on real agents driven by the SDK's own
ScriptedModel (agents.testing; scripted responses, no network)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, MaxTurnsExceeded, function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from loopwatch.instrumentation import Policy, StopReason, ToolPolicy
from loopwatch.instrumentation.integrations.openai_agents import (
    LoopwatchStopped,
    guarded_run,
    guarded_run_sync,
    outcome_of,
    tool_risks,
)
from loopwatch.instrumentation.testing import assert_trace_invariants

POLICY = Policy(repeat_limit=3, max_model_turns=30)


def _usage() -> Usage:
    return Usage(requests=1, input_tokens=12, output_tokens=4, total_tokens=16)


def _tool_outputs(call: Any) -> list[Any]:
    items = call.input if isinstance(call.input, list) else []
    return [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]


def _model(respond: Any) -> ScriptedModel:
    """A scripted model answering every call with ``respond(call, n)`` (n counts calls)."""
    count = {"n": 0}

    def step(call: Any) -> ModelStep:
        count["n"] += 1
        return ModelStep(output=respond(call, count["n"]), usage=_usage())

    return ScriptedModel([ModelStep.respond(step) for _ in range(100)])


def _runaway(call: Any, n: int) -> list[Any]:
    return [function_call("lookup", {"order": "A1"}, call_id=f"c{n}")]


def test_runaway_loop_is_stopped_as_repeated_action(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    calls = {"lookup": 0}

    @function_tool
    def lookup(order: str) -> str:
        """Look an order up."""
        calls["lookup"] += 1
        return "status: pending"

    agent = Agent(name="support", model=_model(_runaway), tools=[lookup])
    began = time.monotonic()
    with pytest.raises(LoopwatchStopped) as raised:
        asyncio.run(
            guarded_run(agent, "where is my order?", policy=POLICY, tracer_provider=provider)
        )
    assert time.monotonic() - began < 5
    outcome = raised.value.outcome
    assert outcome_of(raised.value) is outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert calls["lookup"] <= POLICY.repeat_limit
    assert outcome.usage.model_turns >= 3
    assert outcome.usage.tokens > 0
    assert raised.value.run_data is not None  # the SDK's own failed-run record
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("invoke_agent support") == 1
    assert names.count("stop support") == 1
    assert_trace_invariants(exporter.get_finished_spans())


def test_succeeding_agent_completes(no_leftovers: None) -> None:
    """Also the sync path (Runner.run_sync keeps its event loop open on purpose, so the
    tool is async here: a sync tool would leave that loop's executor thread behind)."""

    @function_tool
    async def lookup(order: str) -> str:  # an async tool
        """Look an order up."""
        return f"{order}: shipped"

    def script(call: Any, n: int) -> list[Any]:
        if not _tool_outputs(call):
            return [function_call("lookup", {"order": "A1"}, call_id="c1")]
        return [assistant_message("Your order A1 ships today.")]

    agent = Agent(name="support", model=_model(script), tools=[lookup])
    result = guarded_run_sync(agent, "where is my order?", policy=POLICY)
    assert result.final_output == "Your order A1 ships today."
    outcome = outcome_of(result)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.COMPLETED
    assert outcome.answer == result.final_output
    assert outcome.usage.model_turns == 2
    assert outcome.usage.tool_successes == 1


def test_paginating_agent_is_not_stopped(no_leftovers: None) -> None:
    seen: list[int] = []

    @function_tool
    def search_orders(query: str, page: int) -> str:
        """Search orders, one page at a time."""
        seen.append(page)
        return json.dumps({"page": page, "orders": [f"O{page}{i}" for i in range(3)]})

    def script(call: Any, n: int) -> list[Any]:
        done = len(_tool_outputs(call))
        if done < 6:
            args = {"query": "late", "page": done + 1}
            return [function_call("search_orders", args, call_id=f"c{n}")]
        return [assistant_message("Six pages of late orders.")]

    agent = Agent(name="support", model=_model(script), tools=[search_orders])
    result = asyncio.run(guarded_run(agent, "list late orders", policy=POLICY, max_turns=20))
    outcome = outcome_of(result)
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED
    assert seen == [1, 2, 3, 4, 5, 6]


def test_duplicate_write_is_stopped_at_the_second_call(no_leftovers: None) -> None:
    created: list[str] = []

    @function_tool
    def create_ticket(title: str) -> str:
        """Open a ticket."""
        created.append(title)
        return f"ticket T{len(created)} created"  # a new id each time: still no progress

    def script(call: Any, n: int) -> list[Any]:
        return [function_call("create_ticket", {"title": "refund A1"}, call_id=f"c{n}")]

    policy = Policy(tools={"create_ticket": ToolPolicy(name="create_ticket", risk="write")})
    agent = Agent(name="support", model=_model(script), tools=[create_ticket])
    with pytest.raises(LoopwatchStopped) as raised:
        asyncio.run(guarded_run(agent, "open a refund ticket", policy=policy))
    assert raised.value.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert created == ["refund A1"]


def test_tool_risks_reads_mcp_annotations() -> None:
    class Tool:
        def __init__(self, name: str, annotations: Any) -> None:
            self.name = name
            self.mcp_annotations = annotations

    class Annotations:  # attribute access, as mcp.types.ToolAnnotations
        readOnlyHint = None
        destructiveHint = True

    tools = [
        Tool("get", {"readOnlyHint": True}),
        Tool("add", {"readOnlyHint": False, "destructiveHint": False}),
        Tool("drop", Annotations()),
        Tool("plain", None),
    ]
    assert tool_risks(tools) == {"get": "read", "add": "write", "drop": "write"}


def test_max_turns_is_budget_exhausted(no_leftovers: None) -> None:
    @function_tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"{order}: pending"

    def script(call: Any, n: int) -> list[Any]:
        return [function_call("lookup", {"order": f"A{n}"}, call_id=f"c{n}")]  # never a repeat

    agent = Agent(name="support", model=_model(script), tools=[lookup])
    with pytest.raises(MaxTurnsExceeded) as raised:
        asyncio.run(guarded_run(agent, "check", policy=POLICY, max_turns=3))
    outcome = outcome_of(raised.value)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension == "model_turns"
    assert outcome.stop.limit == 3.0
    assert outcome.usage.model_turns == 3


def test_async_path_with_parallel_calls_and_user_hooks(spans: Any, no_leftovers: None) -> None:
    """The async path: two identical calls per turn run as concurrent tool tasks; the stop
    raised in one of them ends the run and the sibling; the user's hooks still run."""
    from agents import RunHooks

    calls = {"lookup": 0, "hook": 0}

    class Mine(RunHooks[Any]):
        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            calls["hook"] += 1

    @function_tool
    async def lookup(order: str) -> str:
        """Look an order up."""
        calls["lookup"] += 1
        await asyncio.sleep(0.01)
        return "status: pending"

    def script(call: Any, n: int) -> list[Any]:
        return [
            function_call("lookup", {"order": "A1"}, call_id=f"c{n}a"),
            function_call("lookup", {"order": "A1"}, call_id=f"c{n}b"),
        ]

    agent = Agent(name="support", model=_model(script), tools=[lookup])

    async def main() -> None:
        began = time.monotonic()
        with pytest.raises(LoopwatchStopped) as raised:
            await guarded_run(
                agent, "check twice", policy=POLICY, hooks=Mine(), tracer_provider=spans[0]
            )
        assert time.monotonic() - began < 5
        assert raised.value.outcome.stop.reason is StopReason.REPEATED_ACTION

    asyncio.run(main())
    assert calls["lookup"] <= POLICY.repeat_limit
    assert calls["hook"] == calls["lookup"]
    assert_trace_invariants(spans[1].get_finished_spans())


def test_a_refused_turn_never_reaches_the_model(no_leftovers: None) -> None:
    """loopwatch's own turn budget: the third model call is refused before it is sent."""

    @function_tool
    async def lookup(order: str) -> str:
        """Look an order up."""
        return f"{order}: pending"

    def script(call: Any, n: int) -> list[Any]:
        return [function_call("lookup", {"order": f"A{n}"}, call_id=f"c{n}")]

    model = _model(script)
    agent = Agent(name="support", model=model, tools=[lookup])
    with pytest.raises(LoopwatchStopped) as raised:
        asyncio.run(guarded_run(agent, "check", policy=Policy(max_model_turns=2)))
    assert raised.value.outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert raised.value.outcome.stop.dimension == "model_turns"
    assert len(model.calls) == 2


def test_observe_mode_records_the_loop_and_lets_the_sdk_limit_end_it(no_leftovers: None) -> None:
    @function_tool
    async def lookup(order: str) -> str:
        """Look an order up."""
        return "status: pending"

    agent = Agent(name="support", model=_model(_runaway), tools=[lookup])
    with pytest.raises(MaxTurnsExceeded) as raised:
        asyncio.run(guarded_run(agent, "check", policy=POLICY, mode="observe", max_turns=5))
    outcome = outcome_of(raised.value)
    assert outcome is not None and outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert StopReason.REPEATED_ACTION in {s.reason for s in outcome.observed_stops}
