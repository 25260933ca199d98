"""Issue 26 through AutoGen AgentChat: the guarded workbench answers a nudged call with a
``ToolResult`` holding the nudge (not an error; the body never runs), which AutoGen gives
the model as the call's ``FunctionExecutionResult``; a reading subclass of autogen-ext's
ReplayChatCompletionClient, real AssistantAgents and FunctionTools, no network."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.replay")

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import CreateResult, FunctionExecutionResultMessage
from autogen_core.tools import FunctionTool
from autogen_ext.models.replay import ReplayChatCompletionClient
from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.integrations.autogen import instrument
from loopwatch.instrumentation.testing import assert_trace_invariants

from .test_autogen import INFO, _calls, _text, _timed

POLICY = Policy(repeat_limit=3, max_model_turns=20, loop_response=("nudge", "stop"))
MARK = "loopwatch did not run this call"


class ReadingClient(ReplayChatCompletionClient):  # type: ignore[misc]
    """Answers request n with ``respond(n, messages)``; keeps what each request read."""

    def __init__(self, respond: Callable[[int, list[Any]], CreateResult]) -> None:
        super().__init__([], model_info=INFO)
        self._respond = respond
        self.seen: list[list[Any]] = []

    async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
        self.seen.append(list(messages))
        return self._respond(len(self.seen), list(messages))


def _results(messages: list[Any]) -> list[tuple[str, bool]]:
    return [
        (str(r.content), bool(r.is_error))
        for m in messages
        if isinstance(m, FunctionExecutionResultMessage)
        for r in m.content
    ]


def _obeying(n: int, messages: list[Any]) -> CreateResult:
    results = [text for text, _ in _results(messages)]
    if not any(MARK in t for t in results):
        return _calls(("lookup", {"order_id": "A1"}))
    if results[-1].startswith(MARK):
        return _calls(("lookup", {"order_id": "A2"}))
    return _text("A2 is pending")


def _guarded(respond: Any, body: list[str], provider: Any) -> tuple[Any, ReadingClient]:
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        body.append(order_id)
        return "status: pending"

    client = ReadingClient(respond)
    agent = AssistantAgent(
        "support_bot",
        model_client=client,
        tools=[FunctionTool(lookup, description="Look an order up.")],
        max_tool_iterations=12,
    )
    return instrument(agent, POLICY, tracer_provider=provider), client


def test_ignored_nudge_is_the_tool_result_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    body: list[str] = []
    guarded, client = _guarded(lambda n, m: _calls(("lookup", {"order_id": "A1"})), body, provider)
    result, elapsed = _timed(lambda: guarded.run(task="where is A1?"))
    assert elapsed < 5
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert result.stop_reason == "loopwatch: repeated_action"
    assert body == ["A1", "A1"]
    assert outcome.usage.model_turns == 4 and len(client.seen) == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    results = _results(client.seen[3])
    assert results[:2] == [("status: pending", False)] * 2
    assert results[2][0].startswith(MARK) and results[2][1] is False  # a result, not an error
    assert_trace_invariants(exporter.get_finished_spans())


def test_obeyed_nudge_completes_with_one_recovered_nudge(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    body: list[str] = []
    guarded, _ = _guarded(_obeying, body, provider)
    result, elapsed = _timed(lambda: guarded.run(task="where is A1?"))
    assert elapsed < 5
    assert result.messages[-1].content == "A2 is pending"
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.COMPLETED
    assert body == ["A1", "A1", "A2"]
    assert [n.result for n in outcome.nudges] == ["recovered"]
    assert_trace_invariants(exporter.get_finished_spans())
