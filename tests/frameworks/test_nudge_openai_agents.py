"""Issue 26 through the OpenAI Agents SDK: loopwatch's tool input guardrail rejects a
nudged call with the nudge as its ``function_call_output`` (the body never runs); the
SDK's own ScriptedModel drives the agent, no network."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, function_tool
from agents.testing import assistant_message, function_call
from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.integrations.openai_agents import (
    LoopwatchStopped,
    guarded_run,
    guarded_run_sync,
    outcome_of,
)
from loopwatch.instrumentation.testing import assert_trace_invariants

from .test_openai_agents import _model, _tool_outputs

POLICY = Policy(repeat_limit=3, max_model_turns=20, loop_response=("nudge", "stop"))
MARK = "loopwatch did not run this call"


def _agent(respond: Any, body: list[str], *, is_async: bool = False) -> Agent[Any]:
    def lookup(order: str) -> str:
        """Look an order up."""
        body.append(order)
        return "status: pending"

    async def alookup(order: str) -> str:
        return lookup(order)

    alookup.__doc__ = lookup.__doc__
    tool = function_tool(alookup, name_override="lookup") if is_async else function_tool(lookup)
    return Agent(name="support", model=_model(respond), tools=[tool])


def _obeying(call: Any, n: int) -> list[Any]:
    outputs = [str(o.get("output")) for o in _tool_outputs(call)]
    if outputs and outputs[-1].startswith(MARK):
        return [function_call("lookup", {"order": "A2"}, call_id=f"c{n}")]
    if any(MARK in o for o in outputs):
        return [assistant_message("A2 is pending")]
    return [function_call("lookup", {"order": "A1"}, call_id=f"c{n}")]


def test_ignored_nudge_is_the_tool_output_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    body: list[str] = []
    seen: list[list[str]] = []

    def ignoring(call: Any, n: int) -> list[Any]:
        seen.append([str(o.get("output")) for o in _tool_outputs(call)])
        return [function_call("lookup", {"order": "A1"}, call_id=f"c{n}")]

    began = time.monotonic()
    with pytest.raises(LoopwatchStopped) as raised:
        asyncio.run(
            guarded_run(_agent(ignoring, body), "where?", policy=POLICY, tracer_provider=provider)
        )
    assert time.monotonic() - began < 5
    outcome = raised.value.outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert body == ["A1", "A1"]
    assert outcome.usage.model_turns == 4 and len(seen) == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    # The fourth model call got the nudge as the third call's function_call_output.
    assert seen[3][:2] == ["status: pending"] * 2 and seen[3][2].startswith(MARK)
    assert_trace_invariants(exporter.get_finished_spans())


def test_obeyed_nudge_completes_with_one_recovered_nudge(spans: Any, no_leftovers: None) -> None:
    """The sync path (an async tool: Runner.run_sync keeps its loop's executor thread)."""
    provider, exporter = spans
    body: list[str] = []
    result = guarded_run_sync(
        _agent(_obeying, body, is_async=True), "where?", policy=POLICY, tracer_provider=provider
    )
    assert result.final_output == "A2 is pending"
    outcome = outcome_of(result)
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED
    assert body == ["A1", "A1", "A2"]
    assert [n.result for n in outcome.nudges] == ["recovered"]
    assert_trace_invariants(exporter.get_finished_spans())


def test_the_guardrail_is_inert_outside_a_guarded_run(no_leftovers: None) -> None:
    from agents import Runner

    body: list[str] = []
    agent = _agent(_obeying, body)
    asyncio.run(guarded_run(agent, "where?", policy=POLICY))  # attaches the guardrail
    body.clear()

    def three_then_answer(call: Any, n: int) -> list[Any]:
        if n <= 3:
            return [function_call("lookup", {"order": "A1"}, call_id=f"c{n}")]
        return [assistant_message("done")]

    agent.model = _model(three_then_answer)
    result = asyncio.run(Runner.run(agent, "where?"))
    assert result.final_output == "done" and body == ["A1"] * 3
