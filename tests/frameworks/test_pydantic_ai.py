"""Route B, pydantic-ai: the Loopwatch capability on real agents driven by FunctionModel
(scripted responses, no network)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from loopwatch.instrumentation import Policy, StopReason, ToolPolicy
from loopwatch.instrumentation.integrations.pydantic_ai import (
    Loopwatch,
    outcome_of,
    tool_risks,
)
from loopwatch.instrumentation.testing import assert_trace_invariants
from pydantic_ai import (
    Agent,
    ModelResponse,
    RunCancelled,
    TextPart,
    ToolCallPart,
    UsageLimitExceeded,
)
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits

POLICY = Policy(repeat_limit=3, max_model_turns=20)


def _usage() -> RequestUsage:
    return RequestUsage(input_tokens=12, output_tokens=4)


def _call(tool: str, args: dict[str, Any], n: int) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=f"c{n}")], usage=_usage())


def _final(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)], usage=_usage())


def _returns(messages: list[Any]) -> list[Any]:
    return [
        p.content
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart)
    ]


def _agent(model_fn: Any, capability: Loopwatch, name: str = "support") -> Agent[None, str]:
    return Agent(FunctionModel(model_fn), name=name, capabilities=[capability])


def test_runaway_loop_is_cancelled_as_repeated_action(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    calls = {"lookup": 0}

    def runaway(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return _call("lookup", {"order": "A1"}, len(messages))

    agent = _agent(runaway, Loopwatch(POLICY, tracer_provider=provider))

    @agent.tool_plain
    def lookup(order: str) -> str:
        calls["lookup"] += 1
        return "status: pending"

    began = time.monotonic()
    with pytest.raises(RunCancelled) as raised:
        agent.run_sync("where is my order?")
    assert time.monotonic() - began < 5
    outcome = outcome_of(raised.value)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert calls["lookup"] <= POLICY.repeat_limit
    assert outcome.usage.model_turns >= 3
    assert outcome.usage.tokens > 0
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("invoke_agent support") == 1
    assert names.count("stop support") == 1
    assert_trace_invariants(exporter.get_finished_spans())
    assert raised.value.all_messages()  # pydantic-ai kept the history so far (resumable)


def test_succeeding_agent_completes(spans: Any, no_leftovers: None) -> None:
    provider, _ = spans

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if not _returns(messages):
            return _call("lookup", {"order": "A1"}, 1)
        return _final("Your order A1 ships today.")

    agent = _agent(script, Loopwatch(POLICY, tracer_provider=provider))

    @agent.tool_plain
    async def lookup(order: str) -> str:  # an async tool
        return f"{order}: shipped"

    result = agent.run_sync("where is my order?")
    assert result.output == "Your order A1 ships today."
    outcome = outcome_of(result)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.COMPLETED
    assert outcome.answer == result.output
    assert outcome.usage.model_turns == 2
    assert outcome.usage.tool_successes == 1


def test_paginating_agent_is_not_stopped(no_leftovers: None) -> None:
    pages = {"seen": 0}

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen = len(_returns(messages))
        if seen < 6:
            return _call("search_orders", {"query": "late", "page": seen + 1}, seen)
        return _final("Found 6 pages of late orders.")

    agent = _agent(script, Loopwatch(POLICY))

    @agent.tool_plain
    def search_orders(query: str, page: int) -> dict[str, Any]:
        pages["seen"] += 1
        return {"page": page, "orders": [f"O{page}{i}" for i in range(3)]}

    result = agent.run_sync("list late orders")
    outcome = outcome_of(result)
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED
    assert pages["seen"] == 6


def test_duplicate_write_is_stopped_at_the_second_call(no_leftovers: None) -> None:
    created: list[str] = []
    policy = Policy(tools={"create_ticket": ToolPolicy(name="create_ticket", risk="write")})

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return _call("create_ticket", {"title": "refund A1"}, len(messages))

    agent = _agent(script, Loopwatch(policy))

    @agent.tool_plain
    def create_ticket(title: str) -> str:
        created.append(title)
        return f"ticket T{len(created)} created"  # a new id each time: still no progress

    with pytest.raises(RunCancelled) as raised:
        agent.run_sync("open a refund ticket")
    outcome = outcome_of(raised.value)
    assert outcome is not None and outcome.stop.reason is StopReason.REPEATED_ACTION
    assert created == ["refund A1"]


def test_mcp_annotations_declare_the_write() -> None:
    """A destructive tool (MCP annotations, as pydantic-ai's MCP toolsets set them) is a
    write without any policy entry."""
    created: list[str] = []

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return _call("file_claim", {"order": "A1"}, len(messages))

    agent = _agent(script, Loopwatch(Policy()))

    @agent.tool_plain(metadata={"annotations": {"destructiveHint": True}})
    def file_claim(order: str) -> str:
        created.append(order)
        return f"claim {len(created)} filed"

    with pytest.raises(RunCancelled) as raised:
        agent.run_sync("file a claim")
    outcome = outcome_of(raised.value)
    assert outcome is not None and outcome.stop.reason is StopReason.REPEATED_ACTION
    assert created == ["A1"]


def test_tool_risks_reads_mcp_annotations() -> None:
    class Def:
        def __init__(self, name: str, annotations: Any) -> None:
            self.name = name
            self.metadata = {"annotations": annotations}

    defs = [
        Def("get", {"readOnlyHint": True, "destructiveHint": True}),
        Def("add", {"readOnlyHint": False, "destructiveHint": False}),
        Def("drop", {"destructiveHint": True}),
        Def("plain", None),
    ]
    assert tool_risks(defs) == {"get": "read", "add": "write", "drop": "write"}


@pytest.mark.parametrize(
    ("limits", "dimension", "limit"),
    [
        (UsageLimits(request_limit=2), "model_turns", 2.0),
        (UsageLimits(tool_calls_limit=1), "tool_attempts", 1.0),
    ],
)
def test_usage_limit_is_budget_exhausted(
    limits: UsageLimits, dimension: str, limit: float, no_leftovers: None
) -> None:
    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        n = len(messages)
        return _call("lookup", {"order": f"A{n}"}, n)  # new args: never a repeat

    agent = _agent(script, Loopwatch(POLICY))

    @agent.tool_plain
    def lookup(order: str) -> str:
        return f"{order}: pending"

    with pytest.raises(UsageLimitExceeded) as raised:
        agent.run_sync("check", usage_limits=limits)
    outcome = outcome_of(raised.value)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension == dimension
    assert outcome.stop.limit == limit


def test_async_runs_share_one_agent(no_leftovers: None) -> None:
    """The async path: concurrent runs of one agent get one loopwatch run each."""
    calls = {"lookup": 0}

    def runaway(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return _call("lookup", {"order": "A1"}, len(messages))

    agent = _agent(runaway, Loopwatch(POLICY))

    @agent.tool_plain
    async def lookup(order: str) -> str:
        calls["lookup"] += 1
        await asyncio.sleep(0)
        return "status: pending"

    async def main() -> list[BaseException | Any]:
        return await asyncio.gather(agent.run("a"), agent.run("b"), return_exceptions=True)

    began = time.monotonic()
    results = asyncio.run(main())
    assert time.monotonic() - began < 5
    assert all(isinstance(r, RunCancelled) for r in results)
    outcomes = [outcome_of(r) for r in results]
    assert [o.stop.reason for o in outcomes if o] == [StopReason.REPEATED_ACTION] * 2
    assert outcomes[0] is not None and outcomes[1] is not None
    assert outcomes[0].run_id != outcomes[1].run_id
    assert calls["lookup"] <= 2 * POLICY.repeat_limit


def test_a_refused_turn_never_reaches_the_model(no_leftovers: None) -> None:
    """loopwatch's own turn budget: the third request is refused before it is sent."""
    sent = {"n": 0}

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        sent["n"] += 1
        return _call("lookup", {"order": f"A{sent['n']}"}, sent["n"])

    agent = _agent(script, Loopwatch(Policy(max_model_turns=2)))

    @agent.tool_plain
    def lookup(order: str) -> str:
        return f"{order}: pending"

    with pytest.raises(RunCancelled) as raised:
        agent.run_sync("check")
    outcome = outcome_of(raised.value)
    assert outcome is not None
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension == "model_turns"
    assert sent["n"] == 2


def test_parallel_identical_calls_in_one_turn(spans: Any, no_leftovers: None) -> None:
    """Two identical calls per turn run as concurrent pydantic-ai tool tasks; the stop in
    one of them cancels the run and its sibling, nothing is left pending."""
    ran = {"n": 0}

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        n = len(messages)
        parts = [ToolCallPart("lookup", {"order": "A1"}, tool_call_id=f"c{n}{x}") for x in "ab"]
        return ModelResponse(parts=parts, usage=_usage())

    provider, exporter = spans
    agent = _agent(script, Loopwatch(POLICY, tracer_provider=provider))

    @agent.tool_plain
    async def lookup(order: str) -> str:
        ran["n"] += 1
        await asyncio.sleep(0.01)
        return "status: pending"

    async def main() -> None:
        began = time.monotonic()
        with pytest.raises(RunCancelled) as raised:
            await agent.run("check twice")
        assert time.monotonic() - began < 5
        outcome = outcome_of(raised.value)
        assert outcome is not None and outcome.stop.reason is StopReason.REPEATED_ACTION

    asyncio.run(main())
    assert ran["n"] <= POLICY.repeat_limit
    assert_trace_invariants(exporter.get_finished_spans())


def test_with_pydantic_ai_tracing_on_there_is_one_loopwatch_run(spans: Any) -> None:
    """pydantic-ai's own OpenTelemetry spans go to the same provider: still one loopwatch
    run, and its span sits under pydantic-ai's agent run span, not under a model request."""
    from pydantic_ai.agent import InstrumentationSettings

    provider, exporter = spans

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if not _returns(messages):
            return _call("lookup", {"order": "A1"}, 1)
        return _final("shipped")

    agent = _agent(script, Loopwatch(POLICY, tracer_provider=provider))
    agent.instrument = InstrumentationSettings(tracer_provider=provider)

    @agent.tool_plain
    def lookup(order: str) -> str:
        return "shipped"

    result = agent.run_sync("where is my order?")
    outcome = outcome_of(result)
    assert outcome is not None and outcome.stop.reason is StopReason.COMPLETED
    finished = exporter.get_finished_spans()
    ours = [s for s in finished if (s.attributes or {}).get("loopwatch.run.id")]
    runs = {s.attributes["loopwatch.run.id"] for s in ours if s.name == "invoke_agent support"}
    assert len(runs) == 1
    assert sum(s.name == "stop support" for s in ours) == 1
    by_id = {s.context.span_id: s for s in finished}
    run_span = next(s for s in ours if s.name == "invoke_agent support")
    assert run_span.parent is not None
    parent = by_id[run_span.parent.span_id]
    assert parent.name == "invoke_agent support" and parent is not run_span


def test_observe_mode_records_the_loop_and_lets_the_usage_limit_end_it(
    no_leftovers: None,
) -> None:
    def runaway(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return _call("lookup", {"order": "A1"}, len(messages))

    agent = _agent(runaway, Loopwatch(POLICY, mode="observe"))

    @agent.tool_plain
    def lookup(order: str) -> str:
        return "status: pending"

    with pytest.raises(UsageLimitExceeded) as raised:
        agent.run_sync("check", usage_limits=UsageLimits(request_limit=5))
    outcome = outcome_of(raised.value)
    assert outcome is not None and outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert StopReason.REPEATED_ACTION in {s.reason for s in outcome.observed_stops}
