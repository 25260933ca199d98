"""Issue 26 through CrewAI: a nudged call is blocked by loopwatch's before hook (its body
never runs) and its after hook returns the nudge, which CrewAI gives the model as the
tool's result; a scripted ``BaseLLM`` (from test_crewai), no network."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

pytest.importorskip("crewai")

from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.integrations.crewai import LoopwatchStopped, guard
from loopwatch.instrumentation.testing import assert_trace_invariants
from pydantic import Field

from .test_crewai import (
    FINAL,
    ScriptedLLM,
    counting_tool,
    make_crew,
    native_call,
    react,
    warm_crewai,  # noqa: F401  (the module fixture: CrewAI's threads started first)
)

POLICY = Policy(repeat_limit=3, max_model_turns=20, loop_response=("nudge", "stop"))
MARK = "loopwatch did not run this call"
BLOCKED = "Tool execution blocked by hook"


class ReadingLLM(ScriptedLLM):
    """A scripted LLM whose n-th reply is ``respond(n, messages)``; keeps what it read."""

    respond: Any = None
    seen: list[Any] = Field(default_factory=list)

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.seen.append(copy.deepcopy(messages))
        self.script = [lambda n: self.respond(n, messages)]
        return super().call(messages, *args, **kwargs)


def _texts(messages: Any) -> list[str]:
    if isinstance(messages, str):
        return [messages]
    return [str(m.get("content")) for m in messages if isinstance(m, dict)]


def _tool_results(messages: Any) -> list[str]:
    return [
        str(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "tool"
    ]


def test_native_ignored_nudge_is_the_tool_message_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    lookup, seen = counting_tool("lookup", lambda a: "status: pending")
    llm = ReadingLLM(
        model="scripted",
        native=True,
        respond=lambda n, _m: native_call("lookup", {"query": "42"}, n),
    )
    guarded = guard(make_crew(llm, [lookup]), POLICY, tracer_provider=provider)
    began = time.monotonic()
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    assert time.monotonic() - began < 5
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(seen) == 2
    assert outcome.usage.model_turns == 4 and llm.calls == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    # The fourth turn read the nudge as the third call's tool message, not CrewAI's text.
    results = _tool_results(llm.seen[3])
    assert results[:2] == ["status: pending"] * 2
    assert results[2].startswith(MARK)
    assert not any(BLOCKED in t for t in _texts(llm.seen[3]))
    assert_trace_invariants(exporter.get_finished_spans())


def test_react_ignored_nudge_is_the_observation_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None
) -> None:
    """ReAct: CrewAI itself refuses an identical repeat of the previous call ("I tried
    reusing the same input"), so the body runs once, not twice; the guard counts that
    refusal as the same result, so the third call is still the nudged one."""
    provider, exporter = spans
    lookup, seen = counting_tool("lookup", lambda a: "status: pending")
    llm = ReadingLLM(model="scripted", respond=lambda n, _m: react("lookup", {"query": "42"}))
    guarded = guard(make_crew(llm, [lookup]), POLICY, tracer_provider=provider)
    began = time.monotonic()
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    assert time.monotonic() - began < 5
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(seen) == 1
    assert outcome.usage.model_turns == 4 and llm.calls == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    observations = [t for t in _texts(llm.seen[3]) if "Observation: " in t]
    assert observations[-1].rsplit("Observation: ", 1)[1].startswith(MARK)  # the 3rd call
    assert not any(BLOCKED in t for t in _texts(llm.seen[3]))
    assert_trace_invariants(exporter.get_finished_spans())


def _obeying(native: bool) -> Any:
    def respond(n: int, messages: Any) -> Any:
        texts = _texts(messages)
        if not any(MARK in t for t in texts):
            args = {"query": "42"}
        elif not any("43" in t for t in texts):
            args = {"query": "43"}  # obeys: changes the call after reading the nudge
        else:
            return "done" if native else FINAL
        return native_call("lookup", args, n) if native else react("lookup", args)

    return respond


@pytest.mark.parametrize("native", [True, False], ids=["native", "react"])
def test_obeyed_nudge_completes_with_one_recovered_nudge(
    native: bool, spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    lookup, seen = counting_tool("lookup", lambda a: f"status of {a['query']}: pending")
    llm = ReadingLLM(model="scripted", native=native, respond=_obeying(native))
    guarded = guard(make_crew(llm, [lookup]), POLICY, tracer_provider=provider)
    output = guarded.kickoff()
    assert output.raw == "done"
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.COMPLETED
    assert seen[-1]["query"] == "43"
    assert [n.result for n in outcome.nudges] == ["recovered"]
    assert not any(BLOCKED in t for m in llm.seen for t in _texts(m))
    assert_trace_invariants(exporter.get_finished_spans())
