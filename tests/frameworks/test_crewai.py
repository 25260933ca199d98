"""Live CrewAI tests of the route B adapter: real crews and agents, a scripted LLM (a
``crewai.llms.base_llm.BaseLLM`` subclass returning ReAct text or native tool calls), no
network. CrewAI's telemetry and tracing are switched off before it is imported."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import Field

# Before crewai is imported: no telemetry, no trace upload, no first-run prompt.
for _var, _value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_TESTING": "true",
}.items():
    os.environ.setdefault(_var, _value)

pytest.importorskip("crewai")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.events.event_bus import crewai_event_bus  # noqa: E402
from crewai.hooks import get_before_tool_call_hooks  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402
from crewai.tools.tool_failure import ToolExecutionFailedError  # noqa: E402
from loopwatch.instrumentation import Dimension, Policy, StopReason, ToolPolicy  # noqa: E402
from loopwatch.instrumentation.integrations.crewai import (  # noqa: E402
    LoopwatchStopped,
    guard,
)

Reply = str | list[dict[str, Any]]


class ScriptedLLM(BaseLLM):
    """Answers from a script, one reply per call (the last repeats); reports usage like
    a provider does. ``native=True``: replies may be OpenAI-style tool-call lists."""

    script: list[Any] = Field(default_factory=list)
    calls: int = 0
    native: bool = False

    def call(  # type: ignore[override]
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        reply = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        self._track_token_usage_internal(
            {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        )
        return reply(self.calls) if callable(reply) else reply

    async def acall(  # type: ignore[override]
        self, messages: Any, tools: Any = None, callbacks: Any = None, **kwargs: Any
    ) -> Any:
        return self.call(messages, tools, callbacks)

    def supports_function_calling(self) -> bool:
        return self.native

    def get_input_tokens_count(self, *args: Any, **kwargs: Any) -> int:
        return 100  # no approximate-count warning per call


def react(name: str, args: dict[str, Any]) -> str:
    return f"Thought: I should look.\nAction: {name}\nAction Input: {json.dumps(args)}"


def native_call(name: str, args: dict[str, Any], n: int) -> list[dict[str, Any]]:
    fn = {"name": name, "arguments": json.dumps(args)}
    return [{"id": f"call_{n}", "type": "function", "function": fn}]


FINAL = "Thought: I know it now.\nFinal Answer: done"


def make_crew(llm: ScriptedLLM, tools: list[Any], *, max_iter: int = 25) -> Crew:
    agent = Agent(
        role="Researcher",
        goal="find facts",
        backstory="careful",
        llm=llm,
        tools=tools,
        max_iter=max_iter,
        verbose=False,
        cache=False,
    )
    task = Task(
        description="Find the order status of order 42", expected_output="a status", agent=agent
    )
    return Crew(agents=[agent], tasks=[task], verbose=False)


@pytest.fixture(scope="module", autouse=True)
def warm_crewai() -> None:
    """CrewAI's event bus starts its threads on its first kickoff and its handler pool
    grows a worker at a time afterwards (process-wide, for good): start them all before
    the tests that check that a kickoff leaves no thread behind."""
    llm = ScriptedLLM(model="scripted", script=[FINAL])
    agent = Agent(role="warm", goal="g", backstory="b", llm=llm, verbose=False)
    task = Task(description="warm up", expected_output="x", agent=agent)
    Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    pool = crewai_event_bus._sync_executor
    barrier = threading.Barrier(pool._max_workers)
    for future in [pool.submit(barrier.wait, 10) for _ in range(pool._max_workers)]:
        future.result(timeout=15)


def counting_tool(name: str, answer: Callable[[dict[str, Any]], Any]) -> tuple[Any, list[Any]]:
    seen: list[Any] = []

    def body(**kwargs: Any) -> Any:
        seen.append(kwargs)
        return answer(kwargs)

    @tool(name)
    def lookup(query: str = "", page: int = 1) -> str:
        """Look up an order."""
        return body(query=query, page=page)

    return lookup, seen


@pytest.mark.parametrize("native", [False, True], ids=["react", "native"])
def test_runaway_same_call_stops_as_repeated_action(
    native: bool, spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    lookup, seen = counting_tool("lookup", lambda a: "status: pending")
    reply: Callable[[int], Reply] = (
        (lambda n: native_call("lookup", {"query": "42"}, n))
        if native
        else (lambda n: react("lookup", {"query": "42"}))
    )
    llm = ScriptedLLM(model="scripted", script=[reply], native=native)
    guarded = guard(make_crew(llm, [lookup]), Policy(repeat_limit=3), tracer_provider=provider)
    began = time.monotonic()
    with pytest.raises(LoopwatchStopped) as raised:
        guarded.kickoff()
    assert time.monotonic() - began < 5
    outcome = guarded.outcome
    assert raised.value.outcome == outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(seen) <= 3
    assert outcome.usage.model_turns > 0
    assert llm.calls == outcome.usage.model_turns  # no model call after the stop
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("invoke_agent Researcher") == 1  # one run per kickoff
    assert not any("order 42" in n for n in names)  # never the task text
    assert names.count("decide Researcher") == outcome.usage.model_turns
    tools = [s for s in exporter.get_finished_spans() if s.name == "execute_tool lookup"]
    outcomes = [s.attributes["loopwatch.tool.outcome"] for s in tools]
    assert outcomes[-1] == "blocked"  # the refused call is visible
    assert len(tools) == outcome.usage.tool_attempts + 1


def test_succeeding_agent_completes(no_leftovers: None) -> None:
    lookup, seen = counting_tool("lookup", lambda a: "status: shipped")
    llm = ScriptedLLM(model="scripted", script=[react("lookup", {"query": "42"}), FINAL])
    guarded = guard(make_crew(llm, [lookup]))
    output = guarded.kickoff()
    assert output.raw == "done"
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert guarded.outcome.answer == "done"
    assert len(seen) == 1
    assert guarded.outcome.usage.model_turns == 2
    assert guarded.outcome.usage.tokens == 240  # 2 turns x (100 + 20), from the LLM's usage


@pytest.mark.parametrize("native", [False, True], ids=["react", "native"])
def test_paginating_agent_is_not_stopped(native: bool, no_leftovers: None) -> None:
    lookup, seen = counting_tool("lookup", lambda a: f"orders page {a['page']}: {a['page'] * 10}")
    pages: list[Any] = [
        (lambda n, p=p: native_call("lookup", {"query": "all", "page": p}, n))
        if native
        else react("lookup", {"query": "all", "page": p})
        for p in (1, 2, 3, 4, 5)
    ]
    llm = ScriptedLLM(model="scripted", script=[*pages, "done" if native else FINAL], native=native)
    guarded = guard(make_crew(llm, [lookup]))
    output = guarded.kickoff()
    assert output.raw == "done"
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert [a["page"] for a in seen] == [1, 2, 3, 4, 5]


def test_duplicate_write_is_stopped_at_the_second_call(no_leftovers: None) -> None:
    ids = iter(range(100, 200))
    create, seen = counting_tool("create_ticket", lambda a: f"created ticket {next(ids)}")
    call = react("create_ticket", {"query": "refund order 42"})
    llm = ScriptedLLM(model="scripted", script=[call, call, FINAL])
    policy = Policy.build(tools=[ToolPolicy(name="create_ticket", risk="write")])
    guarded = guard(make_crew(llm, [create]), policy)
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    assert len(seen) == 1
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert guarded.outcome.usage.tool_attempts == 1


def test_tool_risks_declare_a_write(no_leftovers: None) -> None:
    ids = iter(range(100, 200))
    create, seen = counting_tool("File Refund", lambda a: f"refund {next(ids)}")
    call = react("file_refund", {"query": "order 42"})  # the name crewai shows the model
    llm = ScriptedLLM(model="scripted", script=[call, call, FINAL])
    guarded = guard(make_crew(llm, [create]), tool_risks={"File Refund": "write"})
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    assert len(seen) == 1


def test_max_iter_is_budget_exhausted_on_model_turns(no_leftovers: None) -> None:
    lookup, _ = counting_tool("lookup", lambda a: f"page {a['page']}")
    llm = ScriptedLLM(
        model="scripted", script=[lambda n: react("lookup", {"query": "all", "page": n})]
    )
    guarded = guard(make_crew(llm, [lookup], max_iter=3), Policy(max_model_turns=50))
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    stop = guarded.outcome.stop
    assert stop.reason is StopReason.BUDGET_EXHAUSTED
    assert stop.dimension is Dimension.MODEL_TURNS
    assert stop.limit == 3
    assert stop.evidence.detail == {"framework": "crewai", "limit": "max_iter"}
    assert llm.calls == 3  # crewai's forced final-answer turn was refused


def test_crewai_repeat_refusal_maps_to_repeated_action(no_leftovers: None) -> None:
    """loopwatch's repeat limit above CrewAI's: CrewAI's own stop ends the run, as a
    loop with CrewAI named in the evidence, not as an error."""
    lookup, seen = counting_tool("lookup", lambda a: "status: pending")
    llm = ScriptedLLM(model="scripted", script=[react("lookup", {"query": "42"})])
    policy = Policy(repeat_limit=20, max_model_turns=50, no_progress_patience=50)
    guarded = guard(make_crew(llm, [lookup]), policy)
    with pytest.raises(ToolExecutionFailedError):
        guarded.kickoff()
    stop = guarded.outcome.stop
    assert stop.reason is StopReason.REPEATED_ACTION
    assert stop.evidence.detail == {"framework": "crewai", "limit": "MAX_REPEATED_TOOL_CALLS"}
    assert stop.evidence.tool == "lookup"
    assert len(seen) == 1  # CrewAI refused every repeat before the tool ran


def test_refused_repeats_count_as_the_same_observation(no_leftovers: None) -> None:
    """CrewAI's ReAct path answers a repeat itself; loopwatch still sees the loop at its
    own limit, with the tool body run once."""
    lookup, seen = counting_tool("lookup", lambda a: "status: pending")
    llm = ScriptedLLM(model="scripted", script=[react("lookup", {"query": "42"})])
    guarded = guard(make_crew(llm, [lookup]), Policy(repeat_limit=4))
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.evidence.detail.get("framework") is None  # loopwatch's own stop
    assert len(seen) == 1
    assert outcome.usage.tool_attempts == 3  # the 4th identical call was blocked


@pytest.mark.parametrize("method", ["kickoff_async", "akickoff"])
@pytest.mark.parametrize("native", [False, True], ids=["react", "native"])
def test_async_kickoff_stops_the_runaway(method: str, native: bool, no_leftovers: None) -> None:
    lookup, seen = counting_tool("lookup", lambda a: "status: pending")
    reply: Callable[[int], Reply] = (
        (lambda n: native_call("lookup", {"query": "42"}, n))
        if native
        else (lambda n: react("lookup", {"query": "42"}))
    )
    llm = ScriptedLLM(model="scripted", script=[reply], native=native)
    guarded = guard(make_crew(llm, [lookup]), Policy(repeat_limit=3))

    async def main() -> None:
        began = time.monotonic()
        with pytest.raises(LoopwatchStopped):
            await asyncio.wait_for(getattr(guarded, method)(), timeout=5)
        assert time.monotonic() - began < 5

    asyncio.run(main())
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(seen) <= 3
    assert llm.calls == guarded.outcome.usage.model_turns > 0


@pytest.mark.parametrize("method", ["kickoff_async", "akickoff"])
def test_async_kickoff_completes(method: str, no_leftovers: None) -> None:
    lookup, seen = counting_tool("lookup", lambda a: "status: shipped")
    llm = ScriptedLLM(model="scripted", script=[react("lookup", {"query": "42"}), FINAL])
    guarded = guard(make_crew(llm, [lookup]))
    output = asyncio.run(getattr(guarded, method)())
    assert output.raw == "done"
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert guarded.outcome.usage.model_turns == 2
    assert len(seen) == 1


def test_agent_kickoff_is_one_run_named_after_the_role(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    lookup, seen = counting_tool("lookup", lambda a: "status: shipped")
    llm = ScriptedLLM(model="scripted", script=[react("lookup", {"query": "42"}), FINAL])
    agent = Agent(role="Support", goal="g", backstory="b", llm=llm, tools=[lookup], verbose=False)
    guarded = guard(agent, tracer_provider=provider)
    guarded.kickoff("What is the status of order 42?")
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    runs = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert [s.name for s in runs] == ["invoke_agent Support"]
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("policy", "dimension"),
    [
        (Policy(max_model_turns=2), Dimension.MODEL_TURNS),
        (Policy(max_cost_usd=0.001), Dimension.COST),  # gpt-4o at genai-prices' rates
        (Policy(max_tokens=250), Dimension.TOKENS),
    ],
    ids=["turns", "cost", "tokens"],
)
def test_loopwatch_budgets_see_every_turn(policy: Policy, dimension: Dimension) -> None:
    lookup, _ = counting_tool("lookup", lambda a: f"page {a['page']}")
    llm = ScriptedLLM(
        model="gpt-4o", script=[lambda n: react("lookup", {"query": "all", "page": n})]
    )
    guarded = guard(make_crew(llm, [lookup]), policy)
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    stop = guarded.outcome.stop
    assert stop.reason is StopReason.BUDGET_EXHAUSTED
    assert stop.dimension is dimension
    assert guarded.outcome.usage.cost_usd > 0  # priced from the LLM's reported usage


def test_observe_mode_records_and_crewai_stops_itself(no_leftovers: None) -> None:
    """Observe mode refuses nothing; CrewAI's native path runs the identical call until
    its own limit, and the run ends as the loop it was."""
    lookup, seen = counting_tool("lookup", lambda a: "status: pending")
    llm = ScriptedLLM(
        model="scripted", script=[lambda n: native_call("lookup", {"query": "42"}, n)], native=True
    )
    guarded = guard(make_crew(llm, [lookup]), Policy(repeat_limit=3), mode="observe")
    with pytest.raises(ToolExecutionFailedError):
        guarded.kickoff()
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.evidence.detail["framework"] == "crewai"
    assert outcome.observed_stops[0].reason is StopReason.REPEATED_ACTION  # loopwatch's, first
    assert len(seen) == 5  # crewai's MAX_REPEATED_TOOL_CALLS


@pytest.mark.parametrize("native", [False, True], ids=["react", "native"])
def test_a_failing_tool_is_recorded_as_an_error_and_not_retried_forever(
    native: bool, no_leftovers: None
) -> None:
    def broken(args: dict[str, Any]) -> Any:
        raise RuntimeError("backend down")

    lookup, seen = counting_tool("lookup", broken)
    reply: Callable[[int], Reply] = (
        (lambda n: native_call("lookup", {"query": "42"}, n))
        if native
        else (lambda n: react("lookup", {"query": "42"}))
    )
    llm = ScriptedLLM(model="scripted", script=[reply], native=native)
    guarded = guard(make_crew(llm, [lookup]))
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    outcome = guarded.outcome
    assert outcome.usage.tool_errors == 1
    assert outcome.usage.tool_blocked == 1  # the identical retry of a permanent failure
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension is Dimension.ACTION_RETRIES
    # CrewAI's ReAct path retries a raising tool inside one call (3 attempts, each trying
    # the filtered then the full arguments); the hooks see one call.
    assert len(seen) == (1 if native else 6)


def test_kickoff_leaves_the_crew_as_it_was(no_leftovers: None) -> None:
    """The LLM wrappers and tool hooks live for one kickoff: after a stop the same crew
    runs unguarded, and a second guarded kickoff is a fresh run."""
    lookup, _ = counting_tool("lookup", lambda a: "status: pending")
    runaway = react("lookup", {"query": "42"})
    llm = ScriptedLLM(model="scripted", script=[runaway, runaway, runaway, FINAL])
    crew = make_crew(llm, [lookup])
    guarded = guard(crew, Policy(repeat_limit=3))
    with pytest.raises(LoopwatchStopped):
        guarded.kickoff()
    first = guarded.outcome
    assert "call" not in llm.__dict__ and "acall" not in llm.__dict__
    assert get_before_tool_call_hooks() == []
    llm.calls = 3  # straight to the final answer
    assert crew.kickoff().raw == "done"  # unguarded again
    llm.calls = 3
    assert guarded.kickoff().raw == "done"
    assert guarded.outcome.run_id != first.run_id
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert guarded.outcome.usage.model_turns == 1


def test_a_crew_of_two_agents_is_one_run_named_after_the_crew(spans: Any) -> None:
    """Two agents, two tasks: the first agent's final answer does not end the run; the
    crew's result does."""
    provider, exporter = spans
    lookup, seen = counting_tool("lookup", lambda a: "status: shipped")
    llm = ScriptedLLM(model="scripted", script=[react("lookup", {"query": "42"}), FINAL, FINAL])
    agents = [
        Agent(role=role, goal="g", backstory="b", llm=llm, tools=[lookup], verbose=False)
        for role in ("Researcher", "Writer")
    ]
    tasks = [
        Task(description=f"step {i} for order 42", expected_output="x", agent=a)
        for i, a in enumerate(agents)
    ]
    crew = Crew(name="support", agents=agents, tasks=tasks, verbose=False)
    guarded = guard(crew, tracer_provider=provider)
    assert guarded.kickoff().raw == "done"
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert guarded.outcome.usage.model_turns == 3
    runs = [s.name for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert runs == ["invoke_agent support"]
    assert len(seen) == 1
