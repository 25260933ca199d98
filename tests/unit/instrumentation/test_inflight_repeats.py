"""Identical tool calls in flight together count towards the repeat limit at dispatch.

Regression (a hostile test of the framework adapters, issue 25): the repeat detector saw
a call only once its result was recorded, so identical calls running in parallel within
one model turn all ran (LangGraph's ToolNode ran the body 4 times, smolagents 5, and
``Run.call_tool`` from 6 threads 6 times, the run ending ``completed``). The rule
(:class:`~loopwatch.instrumentation.detectors.RepeatLimits`): a call is the (streak + in
flight + 1)-th identical occurrence, refused when that reaches the limit; a write whose
intent is in flight is a duplicate intent at once. Sequential behaviour is unchanged.

Threads meet at a barrier and every tool body waits until all six callers have arrived
(refused or inside the body), so the calls really overlap, with no sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from loopwatch.instrumentation import (
    Decision,
    Guard,
    Policy,
    Run,
    StopReason,
    StopRun,
    ToolCall,
    ToolPolicy,
)

CALLERS = 6
LIMIT = 3
WAIT_SECONDS = 5.0


def guard(**limits: Any) -> Guard:
    base: dict[str, Any] = {"repeat_limit": LIMIT, "no_progress_patience": 100}
    base.update(limits)
    return Guard(Policy.build(**base))


# ------------------------------------------------------------------ the guard alone


CASES: list[tuple[str, Policy, list[tuple[str, dict[str, Any]]], int, str | None]] = [
    # (case, policy, calls dispatched in order none recorded, allowed count, detector)
    (
        "identical reads: the third in flight is refused",
        Policy.build(repeat_limit=LIMIT),
        [("get_order", {"id": 7})] * CALLERS,
        LIMIT - 1,
        "repeated_action",
    ),
    (
        "a volatile field does not make calls differ",
        Policy.build(repeat_limit=LIMIT),
        [("get_order", {"id": 7, "request_id": f"r{i}"}) for i in range(CALLERS)],
        LIMIT - 1,
        "repeated_action",
    ),
    (
        "differing arguments in parallel are not repeats",
        Policy.build(repeat_limit=LIMIT),
        [("get_order", {"id": i}) for i in range(CALLERS)],
        CALLERS,
        None,
    ),
    (
        "an identical write in flight is a duplicate intent",
        Policy.build(repeat_limit=LIMIT, tools=(ToolPolicy("create_ticket", risk="write"),)),
        [("create_ticket", {"title": "disk full"})] * CALLERS,
        1,
        "duplicate_intent",
    ),
    (
        "a write re-keyed while the first is in flight is a duplicate intent",
        Policy.build(
            repeat_limit=LIMIT,
            tools=(ToolPolicy("create_ticket", risk="write", idempotency_key="key"),),
        ),
        [("create_ticket", {"title": "disk full", "key": f"k{i}"}) for i in range(CALLERS)],
        1,
        "duplicate_intent",
    ),
    (
        "a write replayed with its key in flight: bounded by the keyed limit",
        Policy.build(
            repeat_limit=LIMIT,
            tools=(ToolPolicy("create_ticket", risk="write", idempotency_key="key"),),
        ),
        [("create_ticket", {"title": "disk full", "key": "k1"})] * CALLERS,
        LIMIT - 1,
        "repeated_action",
    ),
]


@pytest.mark.parametrize(
    ("policy", "calls", "allowed", "detector"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_calls_in_flight_count_at_dispatch(
    policy: Policy, calls: list[tuple[str, dict[str, Any]]], allowed: int, detector: str | None
) -> None:
    g = Guard(policy)
    tickets = [g.before_tool_call(name, args) for name, args in calls]
    assert [t.allowed for t in tickets] == [True] * allowed + [False] * (len(calls) - allowed)
    if detector is None:
        assert not g.stopped
        return
    stop = tickets[allowed].stop
    assert stop is not None and stop.reason is StopReason.REPEATED_ACTION
    assert stop.evidence.detector == detector
    assert stop.evidence.detail["in_flight"] == allowed
    assert stop.observed == allowed + 1
    assert all(t.blocked_by == "run_stopped" for t in tickets[allowed + 1 :])


def test_in_flight_and_recorded_streak_add_up() -> None:
    """One identical result recorded and one call in flight: the next is the third."""
    g = guard()
    first = g.before_tool_call("get_order", {"id": 7})
    g.record_tool_result(first, result={"status": "open"})
    second = g.before_tool_call("get_order", {"id": 7})
    assert second.allowed
    third = g.before_tool_call("get_order", {"id": 7})
    assert third.stop is not None and third.stop.reason is StopReason.REPEATED_ACTION
    assert third.stop.evidence.detail["in_flight"] == 1
    assert "observation" in third.stop.evidence.detail
    assert third.stop.evidence.repetitions == 3


def test_a_call_that_errors_gives_its_in_flight_slot_back() -> None:
    """A leaked slot would make the third call below the (1 + 2 + 1)-th occurrence."""
    g = guard(max_retries_per_action=3)
    first = g.before_tool_call("get_order", {"id": 7})
    g.record_tool_result(first, error=ConnectionResetError("flaky"))
    retry = g.before_tool_call("get_order", {"id": 7})
    assert retry.allowed and retry.is_retry
    g.record_tool_result(retry, result={"status": "open"})
    again = g.before_tool_call("get_order", {"id": 7})
    assert again.allowed and again.stop is None


def test_a_refused_call_releases_nothing_it_did_not_reserve() -> None:
    # Looks at the detector's in-flight table: no public call shows it before a stop.
    g = guard(max_tool_successes=1)
    held = g.before_tool_call("get_order", {"id": 7})
    refused = g.before_tool_call("get_order", {"id": 7})
    assert held.allowed
    assert not refused.allowed and refused.stop is None and refused.blocked_by == "ceiling"
    assert not g.record_tool_result(refused, result={"status": "open"}).accepted
    assert g._detectors.in_flight == {held.fingerprint: [held.step]}
    g.record_tool_result(held, result={"status": "open"})
    g.record_tool_result(held, result={"status": "open"})  # a second record is a no-op
    assert g._detectors.in_flight == {}


def test_observe_mode_records_the_parallel_repeat_and_runs_every_call() -> None:
    g = Guard(Policy.build(repeat_limit=LIMIT), mode="observe")
    tickets = [g.before_tool_call("get_order", {"id": 7}) for _ in range(CALLERS)]
    assert all(t.allowed for t in tickets)
    would = tickets[LIMIT - 1].would_stop
    assert would is not None and would.evidence.detail["in_flight"] == LIMIT - 1
    for t in tickets:
        g.record_tool_result(t, result={"status": "open"})
    assert g._detectors.in_flight == {}


SEQUENTIAL: list[tuple[str, list[Any], int | None]] = [
    # (case, results of one identical call in sequence, index of the refused call)
    ("an unchanged result: the third is refused", [{"s": "open"}] * 5, LIMIT - 1),
    ("a changing result is progress-like", [{"s": i} for i in range(8)], None),
    ("a change restarts the count", [{"s": 1}, {"s": 2}, {"s": 2}, {"s": 2}], 3),
]


@pytest.mark.parametrize(
    ("results", "refused_at"), [c[1:] for c in SEQUENTIAL], ids=[c[0] for c in SEQUENTIAL]
)
def test_sequential_calls_keep_their_rule(results: list[Any], refused_at: int | None) -> None:
    g = guard()
    for i, result in enumerate(results):
        ticket = g.before_tool_call("get_order", {"id": 7})
        if i == refused_at:
            assert ticket.stop is not None and ticket.stop.reason is StopReason.REPEATED_ACTION
            assert "in_flight" not in ticket.stop.evidence.detail
            return
        assert ticket.allowed
        g.record_tool_result(ticket, result=result)
    assert refused_at is None and not g.stopped


# ------------------------------------------------------------------- runs: threads


class Arrivals:
    """Counts callers that are inside the tool body or were refused; bodies wait for all
    ``expected`` of them, so every allowed call is still in flight when the others ask."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.bodies = 0
        self.cond = threading.Condition()

    def arrive(self, *, body: bool) -> None:
        with self.cond:
            self.count += 1
            self.bodies += body
            self.cond.notify_all()

    def wait_all(self) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.count >= self.expected, WAIT_SECONDS)


def run_in_threads(run: Run, calls: list[dict[str, Any]]) -> tuple[Arrivals, list[Any]]:
    arrivals = Arrivals(len(calls))
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def get_order(id: int) -> dict[str, Any]:
        arrivals.arrive(body=True)
        arrivals.wait_all()
        return {"id": id, "status": "open"}

    def caller(index: int) -> None:
        barrier.wait()
        try:
            results[index] = run.call_tool("get_order", calls[index], fn=get_order)
        except StopRun as exc:
            results[index] = exc
            arrivals.arrive(body=False)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT_SECONDS * 2)
        assert not t.is_alive(), "a caller hung"
    return arrivals, results


def one_turn(run: Run, calls: list[dict[str, Any]]) -> None:
    with run.model_call() as call:
        call.record(Decision.tool(*(ToolCall("get_order", a) for a in calls)))


def test_identical_calls_from_six_threads_run_the_body_at_most_repeat_limit_times() -> None:
    calls = [{"id": 7}] * CALLERS
    run = Run("parallel", Policy.build(repeat_limit=LIMIT))
    with run:
        one_turn(run, calls)
        arrivals, results = run_in_threads(run, calls)
    assert arrivals.bodies == LIMIT - 1
    assert sum(isinstance(r, StopRun) for r in results) == CALLERS - (LIMIT - 1)
    outcome = run.outcome
    assert outcome.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.evidence.detail["in_flight"] == LIMIT - 1
    assert outcome.usage.tool_attempts == LIMIT - 1


def test_differing_calls_from_six_threads_all_run() -> None:
    calls = [{"id": i} for i in range(CALLERS)]
    run = Run("parallel", Policy.build(repeat_limit=LIMIT))
    with run:
        one_turn(run, calls)
        arrivals, results = run_in_threads(run, calls)
        run.finish("done")
    assert arrivals.bodies == CALLERS
    assert [r["id"] for r in results] == list(range(CALLERS))
    assert run.outcome.reason is StopReason.COMPLETED


# ------------------------------------------------------------------- runs: asyncio


async def gather_calls(run: Run, calls: list[dict[str, Any]]) -> tuple[int, list[Any]]:
    arrived = 0
    bodies = 0
    everyone = asyncio.Event()

    def arrive(*, body: bool) -> None:
        nonlocal arrived, bodies
        arrived += 1
        bodies += body
        if arrived == len(calls):
            everyone.set()

    async def get_order(id: int) -> dict[str, Any]:
        arrive(body=True)
        await asyncio.wait_for(everyone.wait(), WAIT_SECONDS)
        return {"id": id, "status": "open"}

    async def caller(args: dict[str, Any]) -> Any:
        try:
            return await run.acall_tool("get_order", args, fn=get_order)
        except StopRun:
            arrive(body=False)
            raise

    results = await asyncio.gather(*(caller(a) for a in calls), return_exceptions=True)
    return bodies, list(results)


@pytest.mark.parametrize(
    ("calls", "bodies", "reason"),
    [
        ([{"id": 7}] * CALLERS, LIMIT - 1, StopReason.REPEATED_ACTION),
        ([{"id": i} for i in range(CALLERS)], CALLERS, StopReason.COMPLETED),
    ],
    ids=["identical", "differing"],
)
def test_asyncio_gather_of_tool_calls(
    calls: list[dict[str, Any]], bodies: int, reason: StopReason
) -> None:
    run = Run("parallel", Policy.build(repeat_limit=LIMIT))

    async def main() -> tuple[int, list[Any]]:
        async with run:
            one_turn(run, calls)
            ran, results = await gather_calls(run, calls)
            if not run.stopped:
                run.finish("done")
            return ran, results

    ran, results = asyncio.run(main())
    assert ran == bodies
    assert run.outcome.reason is reason
    if reason is StopReason.REPEATED_ACTION:
        assert run.outcome.stop.evidence.detail["in_flight"] == LIMIT - 1
        assert sum(isinstance(r, StopRun) for r in results) == CALLERS - bodies
    else:
        assert all(isinstance(r, dict) for r in results)


def test_a_parallel_transient_failure_is_no_repeat() -> None:
    """Two identical calls in flight that both fail: their slots come back, and the retry
    rule (not the repeat detector) decides the next attempt."""
    g = guard(max_retries_per_action=2)
    a = g.before_tool_call("get_order", {"id": 7})
    b = g.before_tool_call("get_order", {"id": 7})
    g.record_tool_result(a, error=ConnectionResetError("flaky"))
    g.record_tool_result(b, error=ConnectionResetError("flaky"))
    retry = g.before_tool_call("get_order", {"id": 7})
    assert retry.allowed and retry.is_retry
    assert g.record_tool_result(retry, result={"status": "open"}).accepted
    assert g.before_tool_call("get_order", {"id": 7}).allowed
