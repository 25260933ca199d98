"""Regression tests for defects found by adversarial review (each kind, kept as a test)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from loopwatch.instrumentation import (
    Decision,
    FailureClass,
    Guard,
    Policy,
    Run,
    StopReason,
    ToolCall,
    ToolFailure,
    ToolPolicy,
)
from loopwatch.instrumentation.testing import FakeClock, assert_trace_invariants

from .test_guard import step_tool


def test_polling_that_reads_new_log_lines_is_not_a_cycle() -> None:
    g = Guard(Policy.build(no_progress_patience=50), clock=FakeClock())
    for i in range(8):
        g.before_model_call()
        g.record_decision(Decision.tool())
        t = g.before_tool_call("job_status", {"job": 7})
        assert t.allowed, t.stop
        g.record_tool_result(t, result={"status": "running"})
        t = g.before_tool_call("tail_log", {"job": 7})
        assert t.allowed, t.stop
        g.record_tool_result(t, result={"lines": [f"line {i}"]})
    assert not g.stopped


def test_a_b_a_b_with_unchanged_results_stops_once_the_cycle_completes() -> None:
    g = Guard(Policy.build(), clock=FakeClock())
    records = []
    for tool in ("a", "b", "a", "b"):
        g.before_model_call()
        t = g.before_tool_call(tool, {})
        assert t.allowed
        records.append(g.record_tool_result(t, result={tool: 1}))
    stop = records[-1].verdict.stop
    assert stop is not None and stop.reason is StopReason.ACTION_CYCLE
    assert not g.before_model_call().allowed


def test_parallel_children_cannot_overspend_parent_tokens_and_cost() -> None:
    parent = Guard(Policy.build(max_tokens=1000, max_cost_usd=1.0), clock=FakeClock())
    children = [parent.child(Policy.build(max_tokens=1000, max_cost_usd=1.0)) for _ in range(5)]
    for _ in range(3):
        for child in children:
            if child.before_model_call().allowed:
                child.record_decision(Decision.message("x", input_tokens=300, cost_usd=0.3))
    usage = parent.usage()
    assert usage.tokens <= 1000 + 300, "at most one call crosses the limit, as observed usage"
    assert usage.cost_usd <= 1.0 + 0.3 + 1e-9


def test_sibling_children_never_exceed_the_parent_attempt_limit() -> None:
    for _ in range(10):
        parent = Guard(
            Policy.build(max_tool_attempts=50, max_tool_successes=1000), clock=FakeClock()
        )
        children = [
            parent.child(Policy.build(max_tool_attempts=50, max_tool_successes=1000))
            for _ in range(8)
        ]
        allowed: list[bool] = []
        barrier = threading.Barrier(8)

        def work(
            c: Guard, barrier: threading.Barrier = barrier, allowed: list[bool] = allowed
        ) -> None:
            c.before_model_call()
            barrier.wait()
            for i in range(20):
                allowed.append(c.before_tool_call("t", {"i": i, "c": id(c)}).allowed)

        threads = [threading.Thread(target=work, args=(c,)) for c in children]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(allowed) == 50 and parent.usage().tool_attempts == 50


@dataclass
class HoldsALock:
    lock: Any
    value: int = 1


class BadStr:
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    "result", [HoldsALock(threading.Lock()), BadStr(), {"x": BadStr()}, {"deep": [[[[[[1]]]]]] * 3}]
)
def test_hostile_results_never_break_the_agent(result: Any) -> None:
    g = Guard(Policy(), clock=FakeClock())
    g.before_model_call()
    t = g.before_tool_call("t", {"arg": BadStr()})
    record = g.record_tool_result(t, result=result)
    assert record.accepted and len(record.observation_digest) == 64
    assert g.usage().tool_successes == 1


def test_flapping_progress_field_is_not_progress() -> None:
    tools = (ToolPolicy("poll", progress=frozenset({"cursor"})),)
    g = Guard(
        Policy.build(no_progress_patience=4, repeat_limit=100, tools=tools), clock=FakeClock()
    )
    stopped = None
    for i in range(60):
        stopped = step_tool(g, "poll", {"q": 1}, result={"cursor": "A" if i % 2 else "B"})
        if stopped is not None or g.stopped:
            break
    assert g.stopped and g.stop_reason is StopReason.NO_PROGRESS


def test_retries_count_per_action_across_failure_classes() -> None:
    g = Guard(Policy.build(max_retries_per_action=2), clock=FakeClock())
    errors = [
        TimeoutError(),
        ToolFailure("503", FailureClass.TRANSIENT),
        TimeoutError(),
        ToolFailure("503", FailureClass.TRANSIENT),
    ]
    executed = 0
    for err in errors:
        stop = step_tool(g, "fetch", {"id": 1}, error=err)
        if stop is not None:
            break
        executed += 1
    assert executed == 3, "one attempt and two retries"


def test_isolated_errors_that_recover_do_not_accumulate_retries() -> None:
    g = Guard(
        Policy.build(
            max_retries_per_action=1,
            repeat_limit=100,
            no_progress_patience=100,
            max_model_turns=100,
        ),
        clock=FakeClock(),
    )
    for i in range(12):
        assert (
            step_tool(g, "poll", {"id": 1}, error=ToolFailure("503", FailureClass.TRANSIENT))
            is None
        )
        assert step_tool(g, "poll", {"id": 1}, result={"n": i}) is None


def test_checkpoint_every_step_keeps_no_progress() -> None:
    policy = Policy.build(no_progress_patience=3, repeated_decision_limit=100)
    g = Guard(policy, clock=FakeClock())
    for i in range(20):
        if not g.before_model_call().allowed:
            break
        g.record_decision(Decision.message(f"thinking {i}"))
        g = Guard.restore(policy, json.loads(json.dumps(g.snapshot())), clock=FakeClock())
    assert g.stopped or g.usage().steps <= 4


def test_resumed_child_stays_capped_and_charged() -> None:
    parent = Guard(Policy.build(max_tool_attempts=5), clock=FakeClock())
    child = parent.child(Policy.build(max_tool_attempts=10))
    for i in range(2):
        assert step_tool(child, "t", {"i": i}, result=i) is None
    state = json.loads(json.dumps(child.snapshot()))
    resumed = Guard.restore(
        Policy.build(max_tool_attempts=10), state, clock=FakeClock(), parent=parent
    )
    assert resumed.policy.max_tool_attempts == 5
    allowed = 0
    for i in range(10):
        if step_tool(resumed, "t", {"i": 10 + i}, result=i) is not None:
            break
        allowed += 1
    assert allowed == 3 and parent.usage().tool_attempts == 5


def test_tool_before_the_first_model_call_is_step_one() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    with Run("rag", Policy(), tracer_provider=tp, clock=FakeClock()) as run:
        run.call_tool("retrieve", {"q": "x"}, fn=lambda q: ["doc"])
        run.decide(lambda: Decision.final("answer"))
    assert run.outcome.stop.reason is StopReason.COMPLETED
    assert run.outcome.usage.model_turns == 1
    assert_trace_invariants(exporter.get_finished_spans())


def test_write_intent_ignores_cosmetic_case_changes() -> None:
    tools = (ToolPolicy("send_email", risk="write", idempotency_key="key"),)
    g = Guard(Policy.build(tools=tools), clock=FakeClock())
    assert (
        step_tool(g, "send_email", {"to": "Bob@x.org", "body": "Hi", "key": "1"}, result={"id": 1})
        is None
    )
    stop = step_tool(
        g, "send_email", {"to": "bob@x.org ", "body": "hi", "key": "2"}, result={"id": 2}
    )
    assert stop is not None and stop.evidence.detector == "duplicate_intent"


def test_nan_cost_is_not_exported() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    with Run("r", Policy(), tracer_provider=tp, clock=FakeClock()) as run:
        run.decide(lambda: Decision.tool(ToolCall("t", {}), cost_usd=float("nan")))
        run.decide(lambda: Decision.final("x"))
    assert all("loopwatch.cost.usd" not in s.attributes for s in exporter.get_finished_spans())
    assert run.outcome.usage.cost_usd == 0.0
