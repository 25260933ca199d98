"""Hostile route B tests for the AutoGen adapter: concurrent invocations of one
instrumented agent, a transient tool failure retried, observe mode, a hanging tool, and
AutoGen's own OpenTelemetry tracing switched on alongside. A scripted model (autogen-ext's
ReplayChatCompletionClient, see test_autogen), no network."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.replay")

from autogen_core.tools import FunctionTool
from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.integrations.autogen import instrument
from opentelemetry import trace

from .test_autogen import POLICY, _agent, _calls, _text, _timed

LOOKUP = ("lookup", {"order_id": "A1"})


def test_concurrent_invocations_each_get_their_own_run(no_leftovers: None, spans: Any) -> None:
    provider, exporter = spans
    ran = [0]

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        await asyncio.sleep(0.01)  # lets the two invocations interleave
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(LOOKUP)] * 24,
        max_tool_iterations=12,
    )
    guarded = instrument(agent, POLICY, tracer_provider=provider)
    outcomes: list[Any] = []

    async def one(task: str) -> Any:
        result = await guarded.run(task=task)
        outcomes.append(guarded.outcome)
        return result

    async def both() -> Any:
        return await asyncio.gather(one("where is A1?"), one("where is A1, again?"))

    results, elapsed = _timed(both)
    assert elapsed < 5
    # both end AutoGen's normal way (a shared run raised RunStopped out of one of them)
    assert [r.stop_reason for r in results] == ["loopwatch: repeated_action"] * 2
    assert len({o.run_id for o in outcomes}) == 2
    for outcome in outcomes:
        assert outcome.stop.reason is StopReason.REPEATED_ACTION
        assert 0 < outcome.usage.tool_attempts <= 3
    assert ran[0] <= 6  # a shared run let the tool body run 12 times
    runs = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert len(runs) == 2


def test_a_transient_tool_failure_may_be_retried(no_leftovers: None) -> None:
    calls = [0]

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        calls[0] += 1
        if calls[0] == 1:
            raise ConnectionError("upstream reset the connection")
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        _calls(LOOKUP),
        _calls(LOOKUP),
        _text("A1 is pending"),
        max_tool_iterations=5,
    )
    guarded = instrument(agent, POLICY)
    result, _ = _timed(lambda: guarded.run(task="where is A1?"))
    # AutoGen turns the error into text; the guard still sees a ConnectionError
    # (transient, retried), not an unknown error that is never retried
    assert calls[0] == 2
    assert guarded.outcome.stop.reason is StopReason.COMPLETED, guarded.outcome.stop
    assert (guarded.outcome.usage.tool_errors, guarded.outcome.usage.tool_successes) == (1, 1)
    assert result.messages[-1].content == "A1 is pending"


def test_a_permanent_tool_failure_is_not_retried(no_leftovers: None) -> None:
    calls = [0]

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        calls[0] += 1
        raise RuntimeError("no such order")

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(LOOKUP)] * 4,
        max_tool_iterations=5,
    )
    guarded = instrument(agent, POLICY)
    result, _ = _timed(lambda: guarded.run(task="where is A1?"))
    assert calls[0] == 1
    assert guarded.outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert guarded.outcome.stop.dimension == "action_retries"
    assert result.stop_reason == "loopwatch: budget_exhausted"


def test_observe_mode_refuses_nothing_and_records_the_would_stop(no_leftovers: None) -> None:
    ran = [0]

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(LOOKUP)] * 5,
        _text("A1 is pending"),
        max_tool_iterations=12,
    )
    guarded = instrument(agent, POLICY, mode="observe")
    _timed(lambda: guarded.run(task="where is A1?"))
    assert ran[0] == 5
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert guarded.outcome.observed_stops[0].reason is StopReason.REPEATED_ACTION


def test_a_hanging_tool_is_cut_at_the_policy_timeout(no_leftovers: None) -> None:
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        await asyncio.sleep(30)
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        _calls(LOOKUP),
        _text("could not tell"),
        max_tool_iterations=3,
    )
    guarded = instrument(agent, Policy(tool_timeout_seconds=0.3))
    began = time.monotonic()
    result, _ = _timed(lambda: guarded.run(task="where is A1?"))
    assert time.monotonic() - began < 5
    assert "timed out" in str(result.messages[2].content)
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert guarded.outcome.usage.tool_errors == 1


def test_autogen_native_tracing_on_makes_no_second_loopwatch_run(
    no_leftovers: None, spans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = spans
    # AutoGen's own GenAI spans go to the global tracer provider: the same exporter
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    ran = [0]

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(LOOKUP)] * 12,
        max_tool_iterations=12,
    )
    guarded = instrument(agent, POLICY, tracer_provider=provider)
    _timed(lambda: guarded.run(task="where is A1?"))
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
    finished = exporter.get_finished_spans()
    native = [s for s in finished if s.instrumentation_scope.name == "autogen-core"]
    assert native, "AutoGen's own tracing emitted nothing: the test proves nothing"
    ours = [s for s in finished if (s.attributes or {}).get("loopwatch.run.id")]
    run_ids = {s.attributes["loopwatch.run.id"] for s in ours}
    assert run_ids == {guarded.outcome.run_id}
    loopwatch_runs = [s for s in ours if s.name.startswith("invoke_agent")]
    assert len(loopwatch_runs) == 1


def test_runaway_run_stream_ends_with_the_loopwatch_task_result(no_leftovers: None) -> None:
    ran = [0]

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(LOOKUP)] * 12,
        max_tool_iterations=12,
    )
    guarded = instrument(agent, POLICY)

    async def read_all() -> list[Any]:
        return [item async for item in guarded.run_stream(task="where is A1?")]

    items, elapsed = _timed(read_all)
    assert elapsed < 5
    assert len(items) > 1  # AutoGen's messages and events, streamed as they come
    assert items[-1].stop_reason == "loopwatch: repeated_action"
    assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert ran[0] <= 3
    assert guarded.outcome.usage.model_turns > 0


def test_a_run_stream_closed_by_its_reader_is_cancelled(no_leftovers: None) -> None:
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "status: pending"

    agent = _agent(
        [FunctionTool(lookup, description="Look an order up.")],
        *[_calls(("lookup", {"order_id": f"A{n}"})) for n in range(12)],
        max_tool_iterations=12,
    )
    guarded = instrument(agent, POLICY)

    async def read_one() -> Any:
        stream = guarded.run_stream(task="where is A1?")
        first = await stream.__anext__()
        await stream.aclose()
        return first

    first, elapsed = _timed(read_one)
    assert elapsed < 5
    assert first is not None
    assert guarded.outcome.stop.reason is StopReason.CANCELLED
