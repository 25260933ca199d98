"""Guard under concurrency (issue 7): threads and asyncio tasks on one run, and on child
runs, never exceed a limit, never stop twice, and the trace invariants hold.

Stress tests use a fixed seed: each worker draws its pauses and its mix of model and tool
calls from ``random.Random(SEED + worker)``, so a failure replays the same schedule of
choices (the OS schedule still varies; the assertions hold for every interleaving). The
whole module runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from loopwatch.instrumentation import (
    Decision,
    Dimension,
    FailureClass,
    Guard,
    Policy,
    Run,
    StopReason,
    StopRun,
    ToolCall,
    ToolFailure,
    agent,
    tool,
)
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation.testing import assert_trace_invariants
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SEED = 20261130
THREADS = 8


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    yield tp
    tp.shutdown()


def hammer(workers: int, body: Callable[[int, random.Random], None]) -> None:
    """Run ``body(index, rng)`` in ``workers`` threads released together; re-raise the
    first error of any worker."""
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def main(index: int) -> None:
        rng = random.Random(SEED + index)
        try:
            barrier.wait()
            body(index, rng)
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a worker hung"
    if errors:
        raise errors[0]


def pause(rng: random.Random) -> None:
    """Give the scheduler a chance to interleave (a switch, or a sub-millisecond sleep)."""
    if rng.random() < 0.3:
        time.sleep(rng.random() / 5000)
    else:
        time.sleep(0)


def policy(**limits: Any) -> Policy:
    base: dict[str, Any] = {
        "max_model_turns": 10_000,
        "max_tool_attempts": 10_000,
        "max_tool_successes": 10_000,
        "no_progress_patience": 10_000,
        "repeat_limit": 10_000,
        "max_elapsed_seconds": 600,
    }
    base.update(limits)
    return Policy.build(**base)


def tool_spans(exporter: InMemorySpanExporter, run_id: str) -> list[Any]:
    """The run's dispatched tool calls (outcome ``ok`` or ``error``, not refused)."""
    return [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get(sc.LW_RUN_ID) == run_id
        and s.attributes.get(sc.LW_EVENT) == sc.EVENT_TOOL_RESULT
        and s.attributes.get(sc.LW_TOOL_OUTCOME) in (sc.OUTCOME_OK, sc.OUTCOME_ERROR)
    ]


# ----------------------------------------------------------------- the guard alone


@pytest.mark.parametrize("limit", [0, 1, 5, 37])
def test_threads_take_exactly_the_tool_attempt_budget(limit: int) -> None:
    g = Guard(policy(max_tool_attempts=limit))
    allowed: list[int] = []
    accepted: list[int] = []
    stops: list[Any] = []

    def body(index: int, rng: random.Random) -> None:
        for k in range(20):
            ticket = g.before_tool_call("get", {"id": f"{index}-{k}"})
            if ticket.allowed:
                allowed.append(1)
                pause(rng)
                if g.record_tool_result(ticket, result={"id": f"{index}-{k}"}).accepted:
                    accepted.append(1)
            elif ticket.stop is not None:
                stops.append(ticket.stop)

    hammer(THREADS, body)
    assert len(allowed) == limit
    usage = g.usage()
    assert usage.tool_attempts == limit
    # A result that comes back after the stop is late and not recorded.
    assert usage.tool_successes == len(accepted) <= limit
    assert g.stop_reason is StopReason.BUDGET_EXHAUSTED
    assert {id(s) for s in stops} == {id(g.outcome().stop)}  # one stop, seen by everyone
    assert g.outcome().stop.dimension is Dimension.TOOL_ATTEMPTS


@pytest.mark.parametrize("limit", [1, 3, 10])
def test_threads_never_exceed_the_tool_success_budget(limit: int) -> None:
    """Calls in flight hold a success slot: N parallel calls cannot all succeed past N."""
    g = Guard(policy(max_tool_successes=limit))
    held: list[int] = []

    def body(index: int, rng: random.Random) -> None:
        for k in range(400):
            ticket = g.before_tool_call("get", {"id": f"{index}-{k}"})
            if ticket.stop is not None:
                return
            if not ticket.allowed:
                # Every slot left is held by a call in flight: refused, the run goes on.
                assert ticket.blocked_by == "ceiling" and not g.stopped
                held.append(1)
                pause(rng)
                continue
            pause(rng)
            if rng.random() < 0.25:
                g.record_tool_result(ticket, error=ConnectionResetError("flaky"))
            else:
                g.record_tool_result(ticket, result={"id": f"{index}-{k}"})

    hammer(THREADS, body)
    usage = g.usage()
    assert usage.tool_successes == limit
    assert g.stop_reason is StopReason.BUDGET_EXHAUSTED
    assert g.outcome().stop.dimension is Dimension.TOOL_SUCCESSES
    assert usage.tool_blocked == len(held) + 1  # the held calls and the stopping one


def test_model_turns_from_many_threads_are_exact() -> None:
    g = Guard(policy(max_model_turns=23))
    granted: list[int] = []

    def body(index: int, rng: random.Random) -> None:
        for _ in range(10):
            if g.before_model_call().allowed:
                granted.append(1)
                pause(rng)
                g.record_decision(Decision.tool(ToolCall("get", {"id": index})))

    hammer(THREADS, body)
    assert len(granted) == 23 == g.usage().model_turns
    assert g.outcome().stop.dimension is Dimension.MODEL_TURNS


def test_children_in_threads_share_the_parents_budget_exactly() -> None:
    parent = Guard(policy(max_tool_attempts=30, max_tool_successes=25))
    children = [parent.child(policy()) for _ in range(THREADS)]
    per_child = [0] * THREADS

    def body(index: int, rng: random.Random) -> None:
        g = children[index]
        for k in range(200):
            ticket = g.before_tool_call("get", {"id": f"{index}-{k}"})
            if ticket.stop is not None:
                return
            if not ticket.allowed:
                pause(rng)  # held by a sibling's call in flight
                continue
            per_child[index] += 1
            pause(rng)
            g.record_tool_result(ticket, result={"id": f"{index}-{k}"})

    hammer(THREADS, body)
    usage = parent.usage()
    assert sum(per_child) == usage.tool_attempts <= 30
    assert usage.tool_successes <= 25
    assert sum(c.usage().tool_successes for c in children) == usage.tool_successes
    for child in children:
        if child.stopped:
            assert child.outcome().stop.reason is StopReason.BUDGET_EXHAUSTED


def test_parallel_calls_cannot_both_take_the_last_success_slot() -> None:
    """Regression (found by the child-run stress test below): the success ceiling counted
    only recorded successes, so calls dispatched before any returned all succeeded past
    ``max_tool_successes``. A call in flight now holds a slot; a call finding every slot
    held is refused without ending the run, and the first call's result still counts."""
    g = Guard(policy(max_tool_successes=1))
    first = g.before_tool_call("get", {"id": 1})
    second = g.before_tool_call("get", {"id": 2})
    assert first.allowed
    assert not second.allowed and second.stop is None and second.blocked_by == "ceiling"
    assert not g.stopped
    assert g.record_tool_result(first, result={"id": 1}).accepted
    assert g.usage().tool_successes == 1
    third = g.before_tool_call("get", {"id": 3})
    assert third.stop is not None and third.stop.dimension is Dimension.TOOL_SUCCESSES
    assert third.stop.observed == 2


def test_a_failed_call_in_flight_gives_its_success_slot_back() -> None:
    g = Guard(policy(max_tool_successes=1, max_retries_per_action=3))
    first = g.before_tool_call("get", {"id": 1})
    assert not g.before_tool_call("get", {"id": 2}).allowed  # held by the first
    g.record_tool_result(first, error=ConnectionResetError("flaky"))
    retry = g.before_tool_call("get", {"id": 1})
    assert retry.allowed and retry.is_retry
    g.record_tool_result(retry, result={"id": 1})
    assert g.usage().tool_successes == 1
    assert not g.before_tool_call("get", {"id": 2}).allowed


def test_a_child_call_in_flight_holds_the_parents_last_success_slot() -> None:
    parent = Guard(policy(max_tool_successes=1))
    a, b = parent.child(), parent.child()
    ticket = a.before_tool_call("get", {"id": 1})
    assert ticket.allowed
    refused = b.before_tool_call("get", {"id": 2})
    assert not refused.allowed and refused.stop is None and refused.blocked_by == "ceiling"
    assert a.record_tool_result(ticket, result={"id": 1}).accepted
    assert parent.usage().tool_successes == 1
    late = b.before_tool_call("get", {"id": 3})
    assert late.stop is not None and late.stop.dimension is Dimension.TOOL_SUCCESSES
    assert late.stop.evidence.scope == "parent"


def test_observe_mode_never_holds_a_call() -> None:
    g = Guard(policy(max_tool_successes=1), mode="observe")
    first = g.before_tool_call("get", {"id": 1})
    second = g.before_tool_call("get", {"id": 2})
    assert first.allowed and second.allowed


# ------------------------------------------------------------------ runs with spans


def test_threads_on_one_run_keep_the_trace_invariants(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    run = Run(
        "swarm",
        policy(max_model_turns=40, max_tool_attempts=60, max_tool_successes=50),
        tracer_provider=provider,
        tools={"get": lambda id: {"id": id}},
    )
    run.start()
    stops: list[Any] = []

    def body(index: int, rng: random.Random) -> None:
        for k in range(40):
            try:
                if rng.random() < 0.3:
                    run.decide(Decision.tool, ToolCall("get", {"id": k}))
                elif rng.random() < 0.5:
                    run.call_tool("get", {"id": f"{index}-{k}"})
                else:
                    with run.tool_call("get", {"id": f"{index}-{k}"}) as call:
                        pause(rng)
                        call.set_result({"id": f"{index}-{k}"})
            except StopRun as stop:
                stops.append(stop.stop)
                return
            except ToolFailure as refused:
                assert refused.failure_class is FailureClass.TRANSIENT  # slots held

    try:
        hammer(THREADS, body)
    finally:
        run._detach()
    outcome = run.finish()
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert list(runs) == [run.run_id]
    assert len(runs[run.run_id].stops) == 1
    usage = outcome.usage
    assert usage.model_turns <= 40
    assert usage.tool_attempts <= 60
    assert usage.tool_successes <= 50
    assert outcome.reason is StopReason.BUDGET_EXHAUSTED
    assert {s.reason for s in stops} == {StopReason.BUDGET_EXHAUSTED}
    assert all(s == outcome.stop for s in stops)


def test_racing_ends_emit_exactly_one_stop(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    for attempt in range(20):
        run = Run(
            "race",
            policy(),
            tracer_provider=provider,
            tools={"get": lambda id: {"id": id}},
        )
        run.start()
        seen: list[Any] = []

        def body(
            index: int,
            rng: random.Random,
            run: Run = run,
            seen: list[Any] = seen,
            attempt: int = attempt,
        ) -> None:
            choice = (index + attempt) % 4
            try:
                if choice == 0:
                    seen.append(run.cancel().stop)
                elif choice == 1:
                    seen.append(run.finish("answer").stop)
                elif choice == 2:
                    seen.append(run._close(run.guard.fail(RuntimeError("boom"))).stop)
                else:
                    for k in range(5):
                        run.call_tool("get", {"id": f"{index}-{k}"})
            except StopRun as stop:
                seen.append(stop.stop)

        try:
            hammer(THREADS, body)
        finally:
            run._detach()
        assert len({id(s) for s in seen}) == 1, "every thread sees the one stop"
        assert run.outcome.stop is seen[0]
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert len(runs) == 20


def test_a_decision_allowed_before_a_stop_in_another_thread_starts_before_it(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """Regression: a model call allowed by the guard, then a stop made and emitted by
    another thread before the ``decide`` span started, put that span after the stop span
    ("nothing after the stop" failed). A span now starts when its guard check began."""
    run = Run("late", policy(), tracer_provider=provider)
    run.start()
    check = run.guard.before_model_call

    def allowed_then_cancelled_elsewhere(**kwargs: Any) -> Any:
        verdict = check(**kwargs)
        other = threading.Thread(target=run.cancel)
        other.start()
        other.join()
        time.sleep(0.002)  # the stop span is now clearly in the past
        return verdict

    run.guard.before_model_call = allowed_then_cancelled_elsewhere  # type: ignore[method-assign]
    with pytest.raises(StopRun):
        with run.model_call() as call:
            call.record(Decision.tool(ToolCall("get", {"id": 1})))
    run._detach()
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert runs[run.run_id].stops[0].attributes[sc.LW_STOP_REASON] == "cancelled"


def test_a_tool_allowed_before_a_stop_in_another_thread_starts_before_it(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    run = Run("late", policy(), tracer_provider=provider, tools={"get": lambda id: {"id": id}})
    run.start()
    check = run.guard.before_tool_call

    def allowed_then_cancelled_elsewhere(*args: Any, **kwargs: Any) -> Any:
        ticket = check(*args, **kwargs)
        other = threading.Thread(target=run.cancel)
        other.start()
        other.join()
        time.sleep(0.002)
        return ticket

    run.guard.before_tool_call = allowed_then_cancelled_elsewhere  # type: ignore[method-assign]
    run.call_tool("get", {"id": 1})  # dispatched before the stop: its late result is refused
    run._detach()
    runs = assert_trace_invariants(exporter.get_finished_spans())
    (span,) = tool_spans(exporter, run.run_id)
    assert span.attributes[sc.ERROR_TYPE] == "late_result"
    assert runs[run.run_id].stops[0].attributes[sc.LW_STOP_REASON] == "cancelled"


def test_child_runs_in_threads_share_the_parents_budget(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    parent = Run(
        "lead",
        policy(max_tool_attempts=30, max_tool_successes=24),
        tracer_provider=provider,
        tools={"get": lambda id: {"id": id}},
    )
    parent.start()
    children = [
        parent.child("worker", tools={"get": lambda id: {"id": id}}) for _ in range(THREADS)
    ]

    def body(index: int, rng: random.Random) -> None:
        with children[index] as child:
            for k in range(200):
                try:
                    with child.tool_call("get", {"id": f"{index}-{k}"}) as call:
                        pause(rng)
                        call.set_result({"id": f"{index}-{k}"})
                except ToolFailure:
                    pause(rng)  # every slot left is held by a sibling's call in flight

    try:
        hammer(THREADS, body)
    finally:
        parent._detach()
    parent.finish()
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert len(runs) == THREADS + 1
    usage = parent.outcome.usage
    assert usage.tool_successes == 24  # every call succeeds: the success ceiling binds
    assert usage.tool_attempts <= 30
    assert usage.tool_attempts == sum(c.outcome.usage.tool_attempts for c in children)
    assert usage.tool_successes == sum(c.outcome.usage.tool_successes for c in children)


def test_parent_counters_include_child_runs_in_the_invariants(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """Regression (found here): "counters equal events" compared a parent's usage, which
    its children are charged to, with the parent's own spans only, so any parent whose
    child called a tool failed the check."""
    parent = Run("lead", policy(), tracer_provider=provider, tools={"get": lambda id: id})
    with parent:
        with parent.child("worker", tools={"get": lambda id: id}) as child:
            child.decide(Decision.tool, ToolCall("get", {"id": 1}))
            child.call_tool("get", {"id": 1})
    runs = assert_trace_invariants(exporter.get_finished_spans())
    stop = runs[parent.run_id].stops[0].attributes
    assert stop[sc.LW_USAGE_TOOL_ATTEMPTS] == stop[sc.LW_USAGE_MODEL_TURNS] == 1


def test_a_childs_late_result_cannot_change_a_stopped_parent() -> None:
    """Regression (found here): a child's call dispatched before its parent stopped was
    still recorded, charging a success to the stopped parent after its stop."""
    parent = Guard(policy())
    child = parent.child()
    ticket = child.before_tool_call("get", {"id": 1})
    assert ticket.allowed
    parent.cancel()
    before = parent.usage()
    record = child.record_tool_result(ticket, result={"id": 1})
    assert not record.accepted
    assert parent.usage().tool_successes == before.tool_successes == 0
    late = child.record_decision(Decision.tool(ToolCall("get", {"id": 2}), input_tokens=50))
    assert not late.allowed and late.stop is not None
    assert late.stop.reason is StopReason.CANCELLED
    assert parent.usage().tokens == 0


# ------------------------------------------------------------------------ asyncio


def test_asyncio_tasks_on_one_run_never_exceed_the_budget(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    rng = random.Random(SEED)
    delays = [rng.random() / 1000 for _ in range(60)]

    @tool
    async def fetch(id: int) -> dict[str, Any]:
        await asyncio.sleep(delays[id])
        return {"id": id}

    @agent(
        name="fanout",
        policy=policy(max_tool_attempts=17),
        tracer_provider=provider,
    )
    async def fanout() -> str:
        results = await asyncio.gather(*(fetch(i) for i in range(60)), return_exceptions=True)
        return f"{sum(1 for r in results if isinstance(r, dict))} fetched"

    outcome = asyncio.run(fanout())
    assert outcome.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension is Dimension.TOOL_ATTEMPTS
    assert outcome.usage.tool_attempts == 17
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert len(runs) == 1


def test_asyncio_tasks_hold_success_slots_without_ending_the_run(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """60 concurrent fetches against 15 success slots: 15 run, the rest are refused with a
    transient failure while the slots are held, and the run ends on its own answer."""

    @tool
    async def fetch(id: int) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        return {"id": id}

    @agent(name="fanout", policy=policy(max_tool_successes=15), tracer_provider=provider)
    async def fanout() -> str:
        results = await asyncio.gather(*(fetch(i) for i in range(60)), return_exceptions=True)
        refused = [r for r in results if isinstance(r, ToolFailure)]
        assert all(r.failure_class is FailureClass.TRANSIENT for r in refused)
        return f"{sum(1 for r in results if isinstance(r, dict))} fetched"

    outcome = asyncio.run(fanout())
    assert outcome.reason is StopReason.COMPLETED
    assert outcome.answer == "15 fetched"
    assert outcome.usage.tool_successes == outcome.usage.tool_attempts == 15
    assert outcome.usage.tool_blocked == 45
    runs = assert_trace_invariants(exporter.get_finished_spans())
    (trace,) = runs.values()
    blocked = [t for t in trace.tools if t.attributes[sc.LW_TOOL_OUTCOME] == sc.OUTCOME_BLOCKED]
    assert len(blocked) == 45
    assert {t.attributes[sc.LW_TOOL_BLOCKED_BY] for t in blocked} == {"ceiling"}


def test_asyncio_tasks_in_child_runs_share_the_parent_budget(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    rng = random.Random(SEED + 1)

    @tool
    async def fetch(id: str) -> dict[str, Any]:
        await asyncio.sleep(rng.random() / 2000)
        return {"id": id}

    @agent(name="worker")
    async def worker(n: int) -> str:
        for k in range(12):
            await fetch(f"{n}-{k}")
        return "done"

    @agent(name="lead", policy=policy(max_tool_attempts=25), tracer_provider=provider)
    async def lead() -> str:
        outcomes = await asyncio.gather(*(worker(n) for n in range(5)))
        return ",".join(o.stop.reason.value for o in outcomes)

    outcome = asyncio.run(lead())
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert len(runs) == 6
    child_ids = [rid for rid in runs if rid != outcome.run_id]
    assert outcome.usage.tool_attempts == 25
    attempts = sum(len(tool_spans(exporter, rid)) for rid in child_ids)
    assert attempts == outcome.usage.tool_attempts
