"""Hostile route B tests for the LlamaIndex adapter: concurrent invocations of one
instrumented agent, runs repeated, observe mode, failing and hanging tools. A scripted
model (llama-index-core's MockFunctionCallingLLM, see test_llamaindex), no network."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.integrations.llamaindex import RunStopped, instrument

from .test_llamaindex import POLICY, _agent, _timed


def test_concurrent_invocations_each_get_their_own_run(no_leftovers: None, spans: Any) -> None:
    provider, exporter = spans
    ran = [0]

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        await asyncio.sleep(0.01)  # lets the two invocations interleave
        return "status: pending"

    agent = _agent([lookup], [[("lookup", {"order_id": "A1"})]])
    guarded = instrument(agent, POLICY, tracer_provider=provider)

    async def both() -> Any:
        return await asyncio.gather(
            guarded.run(user_msg="where is A1?", max_iterations=25),
            guarded.run(user_msg="where is A1, again?", max_iterations=25),
            return_exceptions=True,
        )

    results, elapsed = _timed(both)
    assert elapsed < 5
    assert all(isinstance(r, RunStopped) for r in results), results
    first, second = (r.outcome for r in results)
    assert first.run_id != second.run_id
    for outcome in (first, second):
        # each invocation is charged its own calls (a shared run charged both to one)
        assert outcome.stop.reason is StopReason.REPEATED_ACTION
        assert outcome.usage.model_turns > 0
        assert 0 < outcome.usage.tool_attempts <= 3
    assert ran[0] <= 6
    runs = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert len(runs) == 2


def test_the_same_agent_run_again_gets_a_fresh_budget(no_leftovers: None) -> None:
    ran = [0]

    def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    guarded = instrument(_agent([lookup], [[("lookup", {"order_id": "A1"})]]), POLICY)
    ids = set()
    for expected in (2, 4):
        raised, _ = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
        assert isinstance(raised, RunStopped)
        assert guarded.outcome.stop.reason is StopReason.REPEATED_ACTION
        assert guarded.outcome.usage.tool_attempts == 2  # the 3rd identical call is blocked
        assert ran[0] == expected
        ids.add(guarded.outcome.run_id)
    assert len(ids) == 2


def test_observe_mode_refuses_nothing_and_records_the_would_stop(no_leftovers: None) -> None:
    ran = [0]

    def lookup(order_id: str) -> str:
        """Look an order up."""
        ran[0] += 1
        return "status: pending"

    turns: list[Any] = [[("lookup", {"order_id": "A1"})]] * 5 + ["done"]
    guarded = instrument(_agent([lookup], turns), POLICY, mode="observe")
    result, _ = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
    assert not isinstance(result, Exception), result
    assert ran[0] == 5
    out = guarded.outcome
    assert out.stop.reason is StopReason.COMPLETED
    assert out.observed_stops[0].reason is StopReason.REPEATED_ACTION


def test_a_hanging_tool_is_cut_at_the_policy_timeout(no_leftovers: None) -> None:
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        await asyncio.sleep(30)
        return "status: pending"

    agent = _agent([lookup], [[("lookup", {"order_id": "A1"})], "done"])
    guarded = instrument(agent, Policy(tool_timeout_seconds=0.3))
    began = time.monotonic()
    result, _ = _timed(lambda: guarded.run(user_msg="where is A1?"))
    assert time.monotonic() - began < 5
    assert not isinstance(result, Exception), result
    assert "timed out" in str(result.tool_calls[0].tool_output.content)
    assert guarded.outcome.stop.reason is StopReason.COMPLETED
    assert guarded.outcome.usage.tool_errors == 1
