"""Issue 26 through smolagents: the guarded ``forward`` returns the nudge instead of
running the tool body, and the ToolCallingAgent gives it to the model as the call's
observation; a scripted ``smolagents.Model`` that reads its messages, no network."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("smolagents")

from loopwatch.instrumentation import Policy, StopReason, StopRun
from loopwatch.instrumentation.integrations.smolagents import instrument
from loopwatch.instrumentation.testing import assert_trace_invariants
from smolagents import ToolCallingAgent
from smolagents.models import ChatMessage
from smolagents.monitoring import LogLevel, TokenUsage

from .test_smolagents import (
    ScriptedModel,
    _tool_workers_started,  # noqa: F401  (the module fixture: loopwatch's tool workers)
    call,
    make_lookup,
)

POLICY = Policy(repeat_limit=3, max_model_turns=20, loop_response=("nudge", "stop"))
MARK = "loopwatch did not run this call"


class ReadingModel(ScriptedModel):
    """Turn n is ``respond(n, text)``, ``text`` all the messages it was sent; keeps them."""

    def __init__(self, respond: Any) -> None:
        super().__init__(lambda n: ChatMessage(role="assistant", content=""))
        self.respond = respond
        self.seen: list[str] = []

    def generate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatMessage:
        self.turns += 1
        self.seen.append(str(messages))
        message: ChatMessage = self.respond(self.turns, self.seen[-1])
        message.token_usage = TokenUsage(input_tokens=10, output_tokens=5)
        return message


def _agent(model: ReadingModel, bodies: list[str]) -> ToolCallingAgent:
    return ToolCallingAgent(
        tools=[make_lookup(bodies)],
        model=model,
        name="smol_support",
        verbosity_level=LogLevel.OFF,
        max_steps=10,
    )


def _obeying(n: int, text: str) -> ChatMessage:
    if MARK not in text:
        return call("lookup", n, q="order 7")
    if "order 8" not in text:
        return call("lookup", n, q="order 8")  # obeys: changes the call after the nudge
    return call("final_answer", n, answer="order 8 is pending")


def test_ignored_nudge_is_the_observation_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    bodies: list[str] = []
    model = ReadingModel(lambda n, _t: call("lookup", n, q="order 7"))
    agent = _agent(model, bodies)
    guard = instrument(agent, POLICY, tracer_provider=provider)
    began = time.monotonic()
    with pytest.raises(StopRun) as raised:
        agent.run("Where is order 7?")
    assert time.monotonic() - began < 5
    assert raised.value.stop.reason is StopReason.REPEATED_ACTION
    outcome = guard.outcome
    assert outcome is not None
    assert bodies == ["order 7", "order 7"]
    assert outcome.usage.model_turns == 4 and model.turns == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    assert MARK not in model.seen[2] and MARK in model.seen[3]  # read as the 3rd observation
    observations = [s for s in agent.memory.steps if getattr(s, "observations", None)]
    assert MARK in observations[2].observations and not observations[2].error
    assert_trace_invariants(exporter.get_finished_spans())


def test_obeyed_nudge_completes_with_one_recovered_nudge(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    bodies: list[str] = []
    agent = _agent(ReadingModel(_obeying), bodies)
    guard = instrument(agent, POLICY, tracer_provider=provider)
    assert agent.run("Where is order 7?") == "order 8 is pending"
    outcome = guard.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED
    assert bodies == ["order 7", "order 7", "order 8"]
    assert [n.result for n in outcome.nudges] == ["recovered"]
    assert_trace_invariants(exporter.get_finished_spans())
