"""Regression tests for defects found by adversarial review (each kind, kept as a test)."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping
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
    agent,
)
from loopwatch.instrumentation import fingerprint as fp
from loopwatch.instrumentation.errors import PolicyError, StopRun
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


# ------------------------------------- an agent developer's review, 2026-12-01 (one per kind)


def _traced() -> tuple[Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


class QueryTimeout(TimeoutError):
    def __init__(self, query_id: str) -> None:
        super().__init__(f"query {query_id} timed out")
        self.query_id = query_id


def test_a_tools_own_timeout_error_reaches_the_agent_unchanged() -> None:
    """concurrent.futures.TimeoutError is the built-in TimeoutError since Python 3.11,
    so a tool's own TimeoutError was taken for loopwatch's and replaced by it."""

    def query() -> None:
        raise QueryTimeout("abc123")

    with Run("db", Policy(), clock=FakeClock()) as run:
        run.decide(lambda: Decision.tool(ToolCall("query")))
        with pytest.raises(QueryTimeout) as caught:
            run.call_tool("query", {}, fn=query)
        assert caught.value.query_id == "abc123"


def test_an_async_tools_own_timeout_error_reaches_the_agent_unchanged() -> None:
    import asyncio

    async def query() -> None:
        raise QueryTimeout("abc123")

    async def slow() -> None:
        await asyncio.sleep(5)

    async def model() -> Decision:
        return Decision.tool(ToolCall("query"))

    policy = Policy.build(tools=(ToolPolicy("slow", timeout_seconds=0.05),))

    async def main() -> None:
        async with Run("db", policy) as run:
            await run.adecide(model)
            with pytest.raises(QueryTimeout):
                await run.acall_tool("query", {}, fn=query)
            # loopwatch's own timeout is still a plain TimeoutError with its message
            with pytest.raises(TimeoutError, match="timed out after") as caught:
                await run.acall_tool("slow", {}, fn=slow)
            assert type(caught.value) is TimeoutError

    asyncio.run(main())


def test_a_huge_int_result_or_a_hostile_key_does_not_break_the_call() -> None:
    """JSON of 3**10000 raised ValueError (the 4,300-digit int->str limit) in the guard,
    after the tool had run; the tool span was never ended."""

    class BadStr:
        def __str__(self) -> str:
            raise RuntimeError("no")

        def __hash__(self) -> int:
            return 1

    tp, exporter = _traced()
    with Run("calc", Policy(), tracer_provider=tp, clock=FakeClock()) as run:
        run.decide(lambda: Decision.tool(ToolCall("power")))
        assert run.call_tool("power", {"e": 10_000}, fn=lambda e: 3**e) == 3**10_000
        run.call_tool("odd", {}, fn=lambda: {BadStr(): 1})
        run.call_tool("big_arg", {"n": 7**9000}, fn=lambda n: n % 10)
        run.decide(lambda: Decision.final("ok"))
    assert run.outcome.stop.reason is StopReason.COMPLETED
    assert_trace_invariants(exporter.get_finished_spans())


@dataclass
class _Status:  # has its own repr: compared by fields already
    state: str


class _PlainStatus:  # default repr: "<...PlainStatus object at 0x7f...>"
    def __init__(self, state: str) -> None:
        self.state = state


class _Msg:  # default repr, like _PlainStatus
    def __init__(self, n: int) -> None:
        self.n = n
        self.text = f"new mail #{n}"


class _Inbox:
    def __init__(self, messages: list[_Msg]) -> None:
        self.messages = messages


class _Slotted:
    __slots__ = ("__secret", "public")

    def __init__(self, secret: str, public: int) -> None:
        self.__secret = secret
        self.public = public


def test_plain_objects_are_observed_by_their_fields_not_their_address() -> None:
    """A result object with the default repr digested as str(obj), which holds its
    address: the same unchanged result looked new on every call. Its fields are compared
    in depth: a first version compared nested objects by their address-free text, so a
    changing inbox of plain message objects looked unchanged (a false stop)."""
    g = Guard(Policy.build(no_progress_patience=50), clock=FakeClock())
    stops = [step_tool(g, "status", {"id": 1}, result=_PlainStatus("pending")) for _ in range(3)]
    assert stops[:2] == [None, None] and stops[2] is not None
    assert stops[2].reason is StopReason.REPEATED_ACTION
    g = Guard(Policy.build(no_progress_patience=50), clock=FakeClock())
    for i in range(5):  # a changing field is a new observation
        assert step_tool(g, "status", {"id": 1}, result=_PlainStatus(f"step {i}")) is None
    g = Guard(Policy.build(no_progress_patience=50), clock=FakeClock())
    for i in range(5):  # a new message object in a list field: new each time
        inbox = _Inbox([_Msg(j) for j in range(i + 1)])
        assert step_tool(g, "read_inbox", {}, result=inbox) is None
    digest = fp.observation_digest
    assert digest(_Slotted("a", 1)) != digest(_Slotted("b", 1))  # private slots count
    assert digest(_Slotted("a", 1)) == digest(_Slotted("a", 1))
    assert digest({2**20000: 1}) != digest({2**20001: 1})  # huge int keys stay apart


def test_plain_objects_in_arguments_count_by_identity() -> None:
    """An argument object (a client counting its requests) was fingerprinted by its
    fields once results were: each poll looked like a new action and no loop was caught.
    Arguments keep identity: the same client is the same action, another is another."""

    class Client:
        def __init__(self, name: str) -> None:
            self.name = name
            self.requests = 0

    prod, staging = Client("prod"), Client("staging")
    g = Guard(Policy.build(no_progress_patience=50), clock=FakeClock())
    stops = []
    for _ in range(3):
        prod.requests += 1
        stops.append(step_tool(g, "get_status", {"client": prod, "job": 7}, result={"s": 1}))
    assert stops[:2] == [None, None] and stops[2] is not None
    fingerprint = fp.action_fingerprint
    assert fingerprint("q", {"c": prod}) != fingerprint("q", {"c": staging})


def test_tool_methods_and_generators() -> None:
    """``self`` was part of a method tool's fingerprint (its counters changed every call,
    so no call repeated); a generator tool's body ran after the guarded call returned."""
    from loopwatch.instrumentation import tool

    class Client:
        def __init__(self) -> None:
            self.calls = 0

        @tool
        def lookup(self, order_id: int) -> dict[str, str]:
            self.calls += 1
            return {"status": "pending"}

    client = Client()
    with Run("m", Policy.build(no_progress_patience=50), clock=FakeClock()) as run:
        for _ in range(5):
            run.decide(lambda: Decision.tool(ToolCall("lookup", {"order_id": 4})))
            client.lookup(4)
    assert run.outcome.stop.reason is StopReason.REPEATED_ACTION and client.calls == 2

    with pytest.raises(TypeError, match="generator"):

        @tool
        def stream() -> Any:
            yield 1

    def gen() -> Any:
        yield 1

    @functools.wraps(gen)
    def wrapped() -> Any:
        return gen()

    with pytest.raises(TypeError, match="generator"):
        tool(wrapped)

    # Two instances are two actions; a plain function's first parameter named cls is an
    # argument like any other.
    a, b = Client(), Client()
    with Run("m2", Policy.build(no_progress_patience=50), clock=FakeClock()) as run:
        for client in (a, b, a):  # self dropped: 3 identical calls, a repeated_action
            run.decide(lambda: Decision.tool(ToolCall("lookup", {"order_id": 4})))
            client.lookup(4)
    assert run.outcome.stop.reason is StopReason.COMPLETED

    @tool
    def set_label(cls: str, item: int) -> str:
        return cls

    with Run("m3", Policy.build(no_progress_patience=50), clock=FakeClock()) as run:
        for label in ("spam", "spam", "ham"):
            run.decide(lambda: Decision.tool(ToolCall("set_label", {"item": 1})))
            set_label(label, 1)
    assert run.outcome.stop.reason is StopReason.COMPLETED


def test_a_tool_called_from_a_thread_pool_warns_and_copy_context_guards_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool thread does not inherit the run: the call ran unguarded and untraced with
    no word. It now logs a warning, once per tool; the README's copy_context pattern
    guards it. A log line, not a warnings.warn: under -W error that became an exception
    in server threads with no run of their own."""
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    from loopwatch.instrumentation import tool

    @tool
    def fetch_pool_page(url: str) -> str:
        return url

    def warned() -> int:
        return sum("outside any run" in r.getMessage() for r in caplog.records)

    caplog.set_level("WARNING", logger="loopwatch.instrumentation")
    with Run("pool", Policy(), clock=FakeClock()) as run:
        run.decide(lambda: Decision.tool(ToolCall("fetch_pool_page", {"url": "a"})))
        with ThreadPoolExecutor(2) as pool:
            assert [pool.submit(fetch_pool_page, u).result() for u in "aa"] == ["a", "a"]
        assert run.guard.usage().tool_attempts == 0 and warned() == 1
        with ThreadPoolExecutor(2) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, fetch_pool_page, u) for u in "bc"
            ]
            assert [f.result() for f in futures] == ["b", "c"]
        assert run.guard.usage().tool_attempts == 2 and warned() == 1


def test_a_run_finished_before_it_started_is_not_left_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """finish() then ``with run`` counted the run as open for good: every later call of
    a tool outside a run warned."""
    from loopwatch.instrumentation import tool

    @tool
    def lone_tool_after_finish() -> int:
        return 1

    caplog.set_level("WARNING", logger="loopwatch.instrumentation")
    run = Run("early", Policy(), clock=FakeClock())
    run.finish()
    with run:
        pass
    assert lone_tool_after_finish() == 1
    assert not any("outside any run" in r.getMessage() for r in caplog.records)


def test_usage_reported_as_none_counts_as_zero() -> None:
    g = Guard(Policy(), clock=FakeClock())
    g.before_model_call()
    g.record_decision(Decision.tool(input_tokens=812, output_tokens=None, cost_usd=None))  # type: ignore[arg-type]
    assert g.usage().tokens == 812 and g.usage().cost_usd == 0.0


def test_ten_cent_calls_reach_a_thirty_cent_budget_exactly() -> None:
    """0.1 + 0.1 + 0.1 is 0.30000000000000004 in floating point: the third call's tool
    was refused as over a $0.3 budget; the fourth model call is the one to refuse."""
    policy = Policy.build(max_cost_usd=0.3, no_progress_patience=50)
    executed = []
    with Run("cost", policy, clock=FakeClock()) as run:
        for i in range(5):
            run.decide(lambda i=i: Decision.tool(ToolCall("t", {"i": i}), cost_usd=0.1))
            executed.append(run.call_tool("t", {"i": i}, fn=lambda i: i))
    stop = run.outcome.stop
    assert executed == [0, 1, 2] and run.outcome.usage.cost_usd == 0.3
    assert (stop.reason, stop.basis, stop.observed, stop.limit) == (
        StopReason.BUDGET_EXHAUSTED,
        "projected",
        0.3,
        0.3,
    )
    assert "0.3 of 0.3" in stop.message


def test_limits_past_the_detector_window_still_fire() -> None:
    """The identical-action streak was kept in a window-sized list and the decision
    look-back was the window: limits past it switched the detectors off."""
    g = Guard(
        Policy.build(repeat_limit=10, detector_window=8, no_progress_patience=99), clock=FakeClock()
    )
    stops = [step_tool(g, "poll", {"id": 1}, result={"s": 1}) for _ in range(10)]
    assert stops[:9] == [None] * 9 and stops[9] is not None
    assert stops[9].reason is StopReason.REPEATED_ACTION and stops[9].evidence.repetitions == 10
    g = Guard(
        Policy.build(repeated_decision_limit=10, detector_window=8, no_progress_patience=99),
        clock=FakeClock(),
    )
    reasons = []
    for _ in range(10):
        g.before_model_call()
        reasons.append(g.record_decision(Decision.message("")).stop)
    assert reasons[-1] is not None and reasons[-1].reason is StopReason.REPEATED_DECISION
    policy = Policy.build(
        cycle_max_period=6, cycle_repetitions=2, detector_window=8, no_progress_patience=99
    )
    g = Guard(policy, clock=FakeClock())
    found = None
    for i in range(13):  # the 13th call would start a third round of a-b-c-d-e-f
        tool = "abcdef"[i % 6]
        found = found or step_tool(g, tool, {"k": 1}, result={"v": tool})
    assert found is not None and found.reason is StopReason.ACTION_CYCLE


def test_the_policy_environment_applies_to_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOOPWATCH_POLICY_<FIELD> was applied only by load_policy(): a run on a built-in
    profile, a Policy built in code or the defaults ignored it. Limits set in code win."""
    from loopwatch.instrumentation import builtin_profiles

    monkeypatch.setenv("LOOPWATCH_POLICY_MAX_MODEL_TURNS", "5")
    monkeypatch.setenv("LOOPWATCH_POLICY_MAX_TOOL_ATTEMPTS", "4")
    for policy in (None, "investigate-readonly", builtin_profiles()["investigate-readonly"]):
        run = Run("env", policy)
        effective = run.guard.policy
        assert (effective.max_model_turns, effective.sources["max_model_turns"]) == (5, "env")
    coded = Run("env", Policy.build(max_model_turns=9)).guard.policy
    assert (coded.max_model_turns, coded.sources["max_model_turns"]) == (9, "call")
    assert (coded.max_tool_attempts, coded.sources["max_tool_attempts"]) == (4, "env")
    monkeypatch.setenv("LOOPWATCH_POLICY_MAX_MODEL_TURNS", "five")
    with pytest.raises(PolicyError, match="LOOPWATCH_POLICY_MAX_MODEL_TURNS"):
        Run("env", None)


def test_a_snapshot_resumed_with_a_shorter_look_back_forgets_what_it_drops() -> None:
    """Decision counts were restored as saved while the shorter look-back dropped the
    decisions behind them: one more "plan A" was a false repeated_decision."""
    long = Policy.build(
        repeated_decision_limit=200, no_progress_patience=10**4, max_model_turns=10**4
    )
    g = Guard(long, clock=FakeClock())
    for i in range(102):
        g.before_model_call()
        text = "plan A" if i < 2 else f"note {i}"
        assert g.record_decision(Decision.message(text)).stop is None
    short = Policy.build(no_progress_patience=10**4, max_model_turns=10**4)
    resumed = Guard.restore(short, g.snapshot(), clock=FakeClock())
    resumed.before_model_call()
    assert resumed.record_decision(Decision.message("plan A")).stop is None


def test_cost_budgets_hold_for_estimates_children_and_tiny_costs() -> None:
    """Rounding each addition to 1e-9 lost sub-nanodollar costs, and estimates and a
    child's cap were compared unrounded (0.1 x 3 > 0.3; a cap of 0.19999999999999998)."""
    g = Guard(Policy.build(max_cost_usd=0.3, no_progress_patience=99), clock=FakeClock())
    allowed = 0
    for _ in range(5):
        if not g.before_model_call(estimate_cost_usd=0.1).allowed:
            break
        g.record_decision(Decision.tool(cost_usd=0.1))
        allowed += 1
    assert allowed == 3
    parent = Guard(Policy.build(max_cost_usd=0.3, no_progress_patience=99), clock=FakeClock())
    parent.before_model_call()
    parent.record_decision(Decision.tool(cost_usd=0.1))
    child = parent.child()
    assert child.policy.max_cost_usd == 0.2
    tiny_policy = Policy.build(max_cost_usd=1e-6, no_progress_patience=10**5, max_model_turns=10**5)
    tiny = Guard(tiny_policy, clock=FakeClock())
    calls = 0
    while tiny.before_model_call().allowed and calls < 5000:
        tiny.record_decision(Decision.tool(cost_usd=4e-10))
        calls += 1
    assert 2490 <= calls <= 2510 and tiny.stopped


def test_the_policy_environment_yields_to_code_and_to_an_opt_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from loopwatch.instrumentation import load_policy

    monkeypatch.setenv("LOOPWATCH_POLICY_MAX_MODEL_TURNS", "5")
    assert Run("e", Policy(max_model_turns=9)).guard.policy.max_model_turns == 9
    path = tmp_path / "p.toml"
    path.write_text('[profiles.p]\nversion = "1"\nmax_model_turns = 7\n')
    assert Run("e", load_policy(path, environ={})).guard.policy.max_model_turns == 7
    assert Run("e", load_policy(path)).guard.policy.max_model_turns == 5


def test_a_token_count_past_int64_is_capped_so_the_trace_keeps_its_usage() -> None:
    """A recording with prompt_tokens = 10**30 (it fits a float, so the importer took it)
    replayed through a Run: the OTLP encoder dropped gen_ai.usage.input_tokens and
    loopwatch.usage.tokens ("Value out of range") with a log line only (helper review of
    10d3833). Every reported count is capped at MAX_REPORTED_TOKENS."""
    from loopwatch.instrumentation.budgets import MAX_REPORTED_TOKENS
    from loopwatch.instrumentation.testing import ScriptedModel
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedModel([Decision.final("ok", input_tokens=10**30, output_tokens=2**70)])
    with Run("a", Policy.build(max_tokens=10**15), tracer_provider=provider) as run:
        run.decide(model)
    assert run.outcome.usage.tokens == 2 * MAX_REPORTED_TOKENS
    spans = exporter.get_finished_spans()
    decoded = {
        kv.key: kv.value
        for resource in encode_spans(spans).resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
        for kv in span.attributes
    }
    assert decoded["gen_ai.usage.input_tokens"].int_value == MAX_REPORTED_TOKENS
    assert decoded["gen_ai.usage.output_tokens"].int_value == MAX_REPORTED_TOKENS
    assert decoded["loopwatch.usage.tokens"].int_value == 2 * MAX_REPORTED_TOKENS


class _Raises:
    """Hostile subclasses of JSON-like types: each conversion the canonical form makes
    (iteration, ``str``, ``float``, ``int``, ``bytes``, item access, a field getter)
    raises."""

    class Map(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise RuntimeError("getitem")

        def __iter__(self) -> Any:
            raise RuntimeError("iter")

        def __len__(self) -> int:
            return 1

    class List(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise RuntimeError("iter")

    class Str(str):
        __slots__ = ()

        def __str__(self) -> str:
            raise RuntimeError("str")

    class Float(float):
        def __float__(self) -> float:
            raise RuntimeError("float")

    class Int(int):
        def __int__(self) -> int:
            raise RuntimeError("int")

    class Set(set):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise RuntimeError("iter")

    class Bytes(bytes):
        def __bytes__(self) -> bytes:
            raise RuntimeError("bytes")

    @dataclass
    class Field:
        x: int = 1

        def __getattribute__(self, name: str) -> Any:
            if name == "x":
                raise RuntimeError("field")
            return object.__getattribute__(self, name)

    class Eq:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("eq")

        __hash__ = object.__hash__

        def __repr__(self) -> str:
            return "Eq()"


_HOSTILE_VALUES = [
    _Raises.Map(),
    _Raises.List([1]),
    _Raises.Str("x"),
    _Raises.Float(1.5),
    _Raises.Int(3),
    _Raises.Set({1}),
    _Raises.Bytes(b"x"),
    _Raises.Field(),
    _Raises.Eq(),
]


@pytest.mark.parametrize("value", _HOSTILE_VALUES, ids=lambda v: type(v).__name__)
def test_hostile_values_in_arguments_or_results_never_break_the_agent(value: Any) -> None:
    """Canonicalizing such a value raised into the agent: from before_tool_call (in the
    arguments, or as a write's idempotency key, compared with ==), or from
    record_tool_result after the tool had run, leaving its span open; with capture on,
    from capturing them too. Each is now taken by identity."""
    tools = (ToolPolicy("send", risk="write", idempotency_key="key"),)
    tp, exporter = _traced()
    policy = Policy.build(tools=tools)
    with Run("h", policy, tracer_provider=tp, clock=FakeClock(), capture_content=True) as run:
        run.decide(lambda: Decision.tool(ToolCall("read")))
        assert run.call_tool("read", {"a": value}, fn=lambda a: {"r": a}) is not None
        run.call_tool("read2", {}, fn=lambda: value)
        run.call_tool("send", {"key": value, "to": "x"}, fn=lambda key, to: "sent")
        run.decide(lambda: Decision.final("ok"))
    assert run.outcome.stop.reason is StopReason.COMPLETED
    assert run.outcome.usage.tool_successes == 3
    assert_trace_invariants(exporter.get_finished_spans())
    g = Guard(Policy(), clock=FakeClock())
    g.before_model_call()
    ticket = g.before_tool_call("t", {"a": value})
    assert (
        ticket.allowed and ticket.fingerprint == g.before_tool_call("t", {"a": value}).fingerprint
    )


@pytest.mark.parametrize(
    ("usage", "tokens", "cost"),
    [
        ({"input_tokens": float("nan")}, 0, 0.0),
        ({"input_tokens": "many"}, 0, 0.0),
        ({"input_tokens": -5, "output_tokens": 2.7}, 2, 0.0),
        ({"output_tokens": "12"}, 12, 0.0),
        ({"cost_usd": "abc"}, 0, 0.0),
        ({"cost_usd": 1j}, 0, 0.0),
        ({"cost_usd": "0.5"}, 0, 0.5),
        ({"cost_usd": -1.0}, 0, 0.0),
    ],
)
def test_broken_usage_reports_count_as_the_guard_says_on_the_spans_too(
    usage: dict[str, Any], tokens: int, cost: float
) -> None:
    """NaN or unparseable token counts and non-numeric costs raised from record_decision
    (the run ended as error); a cost given as "0.5" was counted by the guard but made
    math.isfinite raise in the span code, so the decision span was never ended (model
    turns no longer equalled decision spans); a negative cost, counted as 0, was still
    exported as -1.0."""
    tp, exporter = _traced()
    with Run("u", Policy(), tracer_provider=tp, clock=FakeClock()) as run:
        run.decide(lambda: Decision.message("hi", **usage))
        run.decide(lambda: Decision.final("ok"))
    assert run.outcome.stop.reason is StopReason.COMPLETED
    assert (run.outcome.usage.tokens, run.outcome.usage.cost_usd) == (tokens, cost)
    spans = exporter.get_finished_spans()
    assert_trace_invariants(spans)
    first = next(s for s in spans if s.name == "decide u")
    assert (first.attributes or {}).get("loopwatch.cost.usd") == (cost or None)


def test_an_infinite_token_count_is_the_cap_and_crosses_the_budget() -> None:
    g = Guard(Policy.build(max_tokens=1000), clock=FakeClock())
    g.before_model_call()
    verdict = g.record_decision(Decision.message("x", input_tokens=float("inf")))
    assert verdict.stop is not None and verdict.stop.dimension == "tokens"


def test_a_decision_type_given_as_a_plain_string_keeps_its_span() -> None:
    """Decision("final", ...) was accepted by the guard, but the span code read
    decision.type.value: every decision span was dropped unended."""
    tp, exporter = _traced()
    with Run("s", Policy(), tracer_provider=tp, clock=FakeClock()) as run:
        run.decide(lambda: Decision("message", text="x"))  # type: ignore[arg-type]
        run.decide(lambda: Decision("final", answer="ok"))  # type: ignore[arg-type]
    spans = exporter.get_finished_spans()
    assert_trace_invariants(spans)
    types = [(s.attributes or {}).get("loopwatch.decision.type") for s in spans]
    assert [t for t in types if t] == ["message", "final"]


def test_an_observe_mode_run_that_ended_makes_no_further_call() -> None:
    """In observe mode, after a final answer (which ends the run in either mode), the next
    model call was made and its decide span came after the stop; the next tool call was
    refused with a span after the stop and the error "unknown tool"."""
    tp, exporter = _traced()
    made: list[str] = []
    with Run("o", Policy(), mode="observe", tracer_provider=tp, clock=FakeClock()) as run:
        run.decide(lambda: Decision.final("ok"))
        with pytest.raises(StopRun):
            run.decide(lambda: made.append("model") or Decision.message("more"))
        with pytest.raises(StopRun):
            run.call_tool("t", {}, fn=lambda: made.append("tool"))
    assert made == [] and run.outcome.stop.reason is StopReason.COMPLETED
    assert run.outcome.answer == "ok"
    spans = exporter.get_finished_spans()
    assert_trace_invariants(spans)
    assert [s.name for s in spans] == ["decide o", "stop o", "invoke_agent o"]


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_sub_agent_called_after_its_parent_stopped_makes_no_call(mode: str) -> None:
    """A nested @agent call inside a run that had stopped became a fresh root run with a
    budget of its own: model calls after the parent's stop, outside its budget."""
    from loopwatch.instrumentation import agent

    tp, exporter = _traced()
    made: list[str] = []

    @agent(name="sub", tracer_provider=tp)
    def sub() -> str:
        made.append("sub")
        return "s"

    with Run("p", Policy(), mode=mode, tracer_provider=tp, clock=FakeClock()) as run:  # type: ignore[arg-type]
        run.finish("done")
        outcome = sub()
    assert made == []
    assert outcome.stop.reason is StopReason.CANCELLED
    assert outcome.stop.evidence.detector == "parent_stopped"
    assert run.outcome.stop.reason is StopReason.COMPLETED
    spans = exporter.get_finished_spans()
    assert_trace_invariants(spans)
    sub_run = next(s for s in spans if s.name == "invoke_agent sub")
    assert (sub_run.attributes or {})["loopwatch.parent_run.id"] == run.run_id


def test_a_tool_that_returns_a_coroutine_is_run_or_refused_never_recorded_unrun() -> None:
    """An object with an async __call__, or a lambda around an async function, given to
    acall_tool ran in a worker thread and returned an unawaited coroutine; an async
    function given to the sync call_tool did the same. Each was recorded as a success
    (observed as "<coroutine object at 0x...>", new every time) while the tool's body
    never ran, or ran later, unguarded and untimed, if the caller awaited the result."""
    import asyncio

    ran: list[Any] = []

    async def body(x: int) -> dict[str, int]:
        ran.append(x)
        return {"x": x}

    class AsyncCallable:
        async def __call__(self, x: int) -> dict[str, int]:
            return await body(x)

    async def slow() -> None:
        await asyncio.sleep(5)

    def calls_body(x: int) -> Any:  # sync, returns a coroutine
        return body(x)

    def calls_slow() -> Any:
        return slow()

    async def main() -> None:
        async with Run("a", Policy(), clock=FakeClock()) as run:
            run.decide(lambda: Decision.tool(ToolCall("t")))
            assert await run.acall_tool("t", {"x": 1}, fn=AsyncCallable()) == {"x": 1}
            assert await run.acall_tool("u", {"x": 2}, fn=calls_body) == {"x": 2}
            tools = (ToolPolicy("s", timeout_seconds=0.05),)
            with Run("b", Policy.build(tools=tools)) as inner:
                with pytest.raises(TimeoutError, match="timed out after"):
                    await inner.acall_tool("s", {}, fn=calls_slow)
            run.decide(lambda: Decision.final("ok"))
        assert run.outcome.stop.reason is StopReason.COMPLETED

    asyncio.run(main())
    assert ran == [1, 2]
    with Run("s", Policy(), clock=FakeClock()) as run:
        run.decide(lambda: Decision.tool(ToolCall("t")))
        with pytest.raises(TypeError, match="returned an awaitable"):
            run.call_tool("t", {"x": 3}, fn=body)
    assert ran == [1, 2]
    usage = run.outcome.usage
    assert (usage.tool_successes, usage.tool_errors) == (0, 1)


def test_a_ticket_recorded_on_another_guard_is_refused() -> None:
    """A child's ticket recorded on its parent's guard was accepted: the parent's count of
    calls in flight went to -1 (one more success than max_tool_successes could be in
    flight), and the child held its slot for good (every later call refused "for now")."""
    parent = Guard(Policy.build(max_tool_successes=2), clock=FakeClock())
    child = parent.child()
    child.before_model_call()
    ticket = child.before_tool_call("t", {})
    assert ticket.allowed
    with pytest.raises(ValueError, match="another guard"):
        parent.record_tool_result(ticket, result=1)
    assert parent._budget.in_flight == 1 and child._budget.in_flight == 1
    assert child.record_tool_result(ticket, result=1).accepted
    assert parent._budget.in_flight == child._budget.in_flight == 0


def test_a_tool_call_the_caller_cancels_is_a_timeout_that_may_be_retried() -> None:
    """An async tool cancelled by the agent's own asyncio.wait_for was recorded as a
    permanent failure (never retried): the next identical call ended the run as
    budget_exhausted (action_retries, 1 of 0)."""
    import asyncio

    async def slow() -> None:
        await asyncio.sleep(10)

    async def quick() -> str:
        return "ok"

    async def main() -> None:
        async with Run("c", Policy.build(max_retries_per_action=2)) as run:
            run.decide(lambda: Decision.tool(ToolCall("t")))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(run.acall_tool("t", {}, fn=slow), 0.01)
            assert await run.acall_tool("t", {}, fn=quick) == "ok"
            run.decide(lambda: Decision.final("done"))
        assert run.outcome.stop.reason is StopReason.COMPLETED
        assert (run.outcome.usage.tool_errors, run.outcome.usage.retries) == (1, 1)

    asyncio.run(main())


class _SettableClock:
    """A clock that reads whatever the test last set, backwards and NaN included (what
    ``time.time`` stepped back by NTP, or a broken injected clock, gives)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _guard_on_settable_clock() -> tuple[_SettableClock, Guard]:
    """A guard with a 15 s deadline and 60 s tool timeouts, its first model call made at
    clock reading 100."""
    clock = _SettableClock(100.0)
    g = Guard(Policy.build(max_elapsed_seconds=15, tool_timeout_seconds=60), clock=clock)
    g.before_model_call()
    return clock, g


def test_a_clock_stepped_back_gives_no_time_back_to_the_budget() -> None:
    clock, g = _guard_on_settable_clock()
    clock.now = 110.0
    assert g.elapsed() == pytest.approx(10)
    clock.now = 95.0  # stepped back 15 s: was elapsed -5 s, five seconds of extra budget
    assert g.elapsed() == pytest.approx(10)
    assert g.before_tool_call("t", {}).timeout_seconds == pytest.approx(5)
    clock.now = 116.0
    ticket = g.before_tool_call("t", {})
    assert not ticket.allowed
    assert ticket.stop is not None and ticket.stop.reason is StopReason.DEADLINE_EXCEEDED


def test_a_nan_clock_keeps_the_deadline_and_the_tool_timeouts() -> None:
    clock, g = _guard_on_settable_clock()
    clock.now = 105.0
    assert g.elapsed() == pytest.approx(5)
    clock.now = float("nan")  # every comparison false: the deadline was off, timeouts 0
    ticket = g.before_tool_call("t", {})
    assert ticket.allowed and ticket.timeout_seconds == pytest.approx(10)
    g.record_tool_result(ticket, result={"n": 1})
    clock.now = 120.0
    assert not g.before_model_call().allowed
    assert g.stop_reason is StopReason.DEADLINE_EXCEEDED
    started_nan = Guard(Policy.build(max_elapsed_seconds=15), clock=_SettableClock(float("nan")))
    assert started_nan.elapsed() == 0.0 and started_nan.remaining_seconds() == 15.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("turns", -3),
        ("attempts", float("nan")),
        ("cost", -0.5),
        ("cost", float("inf")),
        ("input_tokens", "many"),
        ("elapsed_seconds", -60.0),
        ("elapsed_seconds", float("nan")),
    ],
)
def test_a_corrupted_snapshot_cannot_give_budget_back(field: str, value: Any) -> None:
    g = Guard(Policy.build(max_tool_attempts=5, max_elapsed_seconds=60), clock=FakeClock())
    g.before_model_call()
    g.record_tool_result(g.before_tool_call("t", {}), result={"n": 1})
    state = json.loads(json.dumps(g.snapshot()))
    assert Guard.restore(Policy.build(max_tool_attempts=5), state).usage().tool_attempts == 1
    if field == "elapsed_seconds":
        state[field] = value
    else:
        state["counters"][field] = value
    with pytest.raises(ValueError, match=field):
        Guard.restore(Policy.build(max_tool_attempts=5), state)


@pytest.mark.parametrize("end", ["finish", "cancel"])
def test_an_agent_called_after_a_started_run_ended_is_a_run_of_its_own(end: str) -> None:
    """A run started with start() (no ``with``) stayed the current run after it ended, so
    once a nested ``@agent`` after a stop became a cancelled child (fault 3 above), every
    later ``@agent`` call of the program ended ``cancelled`` without running."""
    first = Run("first", Policy.build(), clock=FakeClock())
    first.start()
    getattr(first, end)()

    @agent(name="later")
    def later() -> str:
        return "ok"

    outcome = later()
    assert outcome.stop.reason is StopReason.COMPLETED and outcome.answer == "ok"
    assert outcome.run_id != first.run_id
