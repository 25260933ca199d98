"""Issue 26 through pydantic-ai: a nudged call is answered with the nudge as the tool's
return (a ``ToolReturnPart``), its body not run; scripted FunctionModel, no network."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.integrations.pydantic_ai import Loopwatch, outcome_of
from loopwatch.instrumentation.testing import assert_trace_invariants
from pydantic_ai import Agent, ModelResponse, RunCancelled, TextPart, ToolCallPart
from pydantic_ai.messages import RetryPromptPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

POLICY = Policy(repeat_limit=3, max_model_turns=20, loop_response=("nudge", "stop"))
MARK = "loopwatch did not run this call"


def _returns(messages: list[Any]) -> list[str]:
    return [
        str(p.content)
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart)
    ]


def _call(args: dict[str, Any], n: int) -> ModelResponse:
    return ModelResponse(
        parts=[ToolCallPart("lookup", args, tool_call_id=f"c{n}")],
        usage=RequestUsage(input_tokens=12, output_tokens=4),
    )


def _agent(model_fn: Any, provider: Any, body: dict[str, int]) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model_fn),
        name="support",
        capabilities=[Loopwatch(POLICY, tracer_provider=provider)],
    )

    @agent.tool_plain
    def lookup(order: str) -> str:
        body["runs"] += 1
        return "status: pending"

    return agent


def test_ignored_nudge_is_the_tool_return_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    body = {"runs": 0}
    turns = {"n": 0}

    def ignoring(messages: list[Any], info: AgentInfo) -> ModelResponse:
        turns["n"] += 1
        return _call({"order": "A1"}, turns["n"])

    agent = _agent(ignoring, provider, body)
    began = time.monotonic()
    with pytest.raises(RunCancelled) as raised:
        agent.run_sync("where is my order?")
    assert time.monotonic() - began < 5
    outcome = outcome_of(raised.value)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert body["runs"] == 2
    assert outcome.usage.model_turns == 4 and turns["n"] == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    messages = raised.value.all_messages()
    returns = _returns(messages)
    assert returns[:2] == ["status: pending"] * 2
    assert MARK in returns[2]  # the model read the nudge as the tool's return
    assert not any(
        isinstance(p, RetryPromptPart) for m in messages for p in getattr(m, "parts", ())
    )
    assert_trace_invariants(exporter.get_finished_spans())


def test_obeyed_nudge_completes_with_one_recovered_nudge(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    body = {"runs": 0}

    def obeying(messages: list[Any], info: AgentInfo) -> ModelResponse:
        returns = _returns(messages)
        if any(MARK in r for r in returns):
            if returns[-1].startswith(MARK):
                return _call({"order": "A2"}, len(returns) + 1)
            return ModelResponse(parts=[TextPart("A2 is pending")])
        return _call({"order": "A1"}, len(returns) + 1)

    result = _agent(obeying, provider, body).run_sync("where is my order?")
    assert result.output == "A2 is pending"
    outcome = outcome_of(result)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.COMPLETED
    assert body["runs"] == 3  # twice A1, once A2
    assert [n.result for n in outcome.nudges] == ["recovered"]
    assert_trace_invariants(exporter.get_finished_spans())
