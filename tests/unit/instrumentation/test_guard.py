"""Guard rules of DESIGN section 3 exercised on the pure Guard API (no spans)."""

from __future__ import annotations

import threading
import tracemalloc
from typing import Any

import pytest
from loopwatch.instrumentation import (
    Decision,
    Dimension,
    FailureClass,
    Guard,
    Policy,
    RunStateError,
    StopReason,
    ToolCall,
    ToolFailure,
    ToolPolicy,
)
from loopwatch.instrumentation.detectors import (
    MAX_LOOKBACK,
    REPEAT_ACROSS_PROGRESS_FACTOR,
    RepeatLimits,
)
from loopwatch.instrumentation.testing import FakeClock


def guard(**limits: Any) -> Guard:
    tools = limits.pop("tools", ())
    return Guard(Policy.build(tools=tools, **limits), clock=FakeClock())


def step_tool(
    g: Guard,
    tool: str,
    args: dict[str, Any],
    result: Any = None,
    error: BaseException | None = None,
):
    v = g.before_model_call()
    if not v.allowed:
        return v.stop
    g.record_decision(Decision.tool(ToolCall(tool, args)))
    t = g.before_tool_call(tool, args)
    if not t.allowed:
        return t.stop
    g.record_tool_result(t, result=result, error=error)
    return None


# ---------------------------------------------------------------- ceilings


@pytest.mark.parametrize("limit", [0, 1, 5])
def test_model_turn_limit_permits_exactly_limit(limit: int) -> None:
    g = guard(max_model_turns=limit, repeated_decision_limit=100, no_progress_patience=100)
    allowed = 0
    for i in range(limit + 3):
        if not g.before_model_call().allowed:
            break
        allowed += 1
        g.record_decision(Decision.message(f"m{i}"))
    assert allowed == limit
    stop = g.outcome().stop
    assert stop.reason is StopReason.BUDGET_EXHAUSTED and stop.dimension is Dimension.MODEL_TURNS
    assert (stop.limit, stop.observed, stop.basis) == (limit, limit + 1, "projected")


def test_limit_plus_one_through_corrupted_state_is_refused() -> None:
    g = guard(max_model_turns=3, max_tool_attempts=3)
    g._budget.turns = 4  # corrupted: already past the limit
    assert not g.before_model_call().allowed
    g2 = guard(max_tool_attempts=3)
    g2._budget.attempts = 7
    ticket = g2.before_tool_call("t", {})
    assert not ticket.allowed and ticket.stop is not None
    assert ticket.stop.dimension is Dimension.TOOL_ATTEMPTS and ticket.stop.observed == 8


def test_zero_tool_attempts_is_legal_and_refuses_the_first_call() -> None:
    g = guard(max_tool_attempts=0)
    g.before_model_call()
    ticket = g.before_tool_call("t", {})
    assert (
        not ticket.allowed
        and ticket.stop is not None
        and ticket.stop.dimension is Dimension.TOOL_ATTEMPTS
    )


def test_counters_are_kept_separately() -> None:
    g = guard(max_retries_per_action=3)
    step_tool(g, "a", {"x": 1}, result={"ok": 1})
    step_tool(g, "b", {"x": 1}, error=ToolFailure("503", FailureClass.TRANSIENT))
    step_tool(g, "b", {"x": 1}, error=ToolFailure("503", FailureClass.TRANSIENT))
    g.record_decision(Decision.message("", input_tokens=10, output_tokens=5, cost_usd=0.01))
    u = g.usage()
    assert (u.model_turns, u.tool_attempts, u.tool_successes, u.tool_errors) == (3, 3, 1, 2)
    assert u.retries == 1, "the first attempt of an action is not a retry"
    assert (u.input_tokens, u.output_tokens, u.tokens) == (10, 5, 15)
    assert u.cost_usd == pytest.approx(0.01)


def test_tokens_projected_before_the_call() -> None:
    g = guard(max_tokens=1000)
    assert g.before_model_call(estimate_tokens=600).allowed
    g.record_decision(Decision.message("a", input_tokens=500, output_tokens=100))
    v = g.before_model_call(estimate_tokens=500)
    assert not v.allowed and v.stop is not None
    assert (v.stop.dimension, v.stop.basis, v.stop.observed) == (
        Dimension.TOKENS,
        "projected",
        1100,
    )


def test_tokens_observed_after_the_call() -> None:
    g = guard(max_tokens=1000)
    assert g.before_model_call().allowed
    v = g.record_decision(Decision.message("a", input_tokens=900, output_tokens=200))
    assert not v.allowed and v.stop is not None
    assert (v.stop.dimension, v.stop.basis, v.stop.observed) == (Dimension.TOKENS, "observed", 1100)


def test_tokens_exactly_at_the_limit_allow_that_call_but_no_next() -> None:
    g = guard(max_tokens=1000)
    g.before_model_call()
    assert g.record_decision(Decision.message("a", input_tokens=1000)).allowed
    v = g.before_model_call()
    assert not v.allowed and v.stop is not None and v.stop.dimension is Dimension.TOKENS


def test_cost_projected_and_observed() -> None:
    g = guard(max_cost_usd=1.0)
    assert not g.before_model_call(estimate_cost_usd=1.5).allowed
    g2 = guard(max_cost_usd=1.0)
    g2.before_model_call()
    v = g2.record_decision(Decision.message("x", cost_usd=1.25))
    assert v.stop is not None and (v.stop.dimension, v.stop.basis) == (Dimension.COST, "observed")


# ------------------------------------------------------------ evaluation order


def test_goal_check_comes_before_ceilings() -> None:
    g = Guard(Policy.build(max_tokens=10), clock=FakeClock(), goal_check=lambda a: a == 42)
    g.before_model_call()
    v = g.record_decision(Decision.final(42, input_tokens=50))
    assert v.stop is not None and v.stop.reason is StopReason.COMPLETED


def test_ceilings_come_before_no_progress() -> None:
    g = guard(max_tokens=10, no_progress_patience=1)
    g.before_model_call()
    v = g.record_decision(Decision.message("x", input_tokens=50))
    assert v.stop is not None and v.stop.reason is StopReason.BUDGET_EXHAUSTED


def test_no_progress_is_evaluated_at_the_end_of_the_step() -> None:
    g = guard(no_progress_patience=2, repeated_decision_limit=10)
    g.before_model_call()
    g.record_decision(Decision.message("a"))
    g.before_model_call()
    g.record_decision(Decision.message("b"))
    v = g.end_step()
    assert v.stop is not None and v.stop.reason is StopReason.NO_PROGRESS
    assert v.stop.evidence.step_indices == (1, 2)


def test_goal_check_exception_counts_as_failure() -> None:
    def broken(_: Any) -> bool:
        raise RuntimeError("boom")

    g = Guard(Policy(), clock=FakeClock(), goal_check=broken)
    g.before_model_call()
    v = g.record_decision(Decision.final("x"))
    assert v.stop is not None and v.stop.reason is StopReason.FINAL_UNVERIFIED
    assert v.stop.evidence.detail["goal_check_error"] == "RuntimeError"


# ------------------------------------------------------------ canonicalization


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"q": "x", "page": 1}, {"page": 1, "q": "x"}, True),
        ({"q": " x "}, {"q": "x"}, True),
        ({"q": "x", "request_id": "r1"}, {"q": "x", "request_id": "r2"}, True),
        ({"q": "x", "client_timestamp": 1}, {"q": "x", "client_timestamp": 2}, True),
        ({"q": "x", "cursor": "a"}, {"q": "x", "cursor": "b"}, False),
        (
            {"q": "x", "nested": {"timestamp": 1, "v": 1}},
            {"q": "x", "nested": {"timestamp": 9, "v": 1}},
            True,
        ),
        ({"q": "x"}, {"q": "y"}, False),
    ],
)
def test_canonical_fingerprints(a: dict[str, Any], b: dict[str, Any], same: bool) -> None:
    tools = (
        ToolPolicy(
            "search",
            volatile=frozenset({"client_timestamp"}),
            progress=frozenset({"cursor", "page"}),
        ),
    )
    g = guard(tools=tools)
    g.before_model_call()
    fa = g.before_tool_call("search", a).fingerprint
    fb = g.before_tool_call("search", b).fingerprint
    assert (fa == fb) is same


def test_progress_fields_win_over_volatile() -> None:
    tools = (ToolPolicy("s", volatile=frozenset({"cursor"}), progress=frozenset({"cursor"})),)
    g = guard(tools=tools)
    g.before_model_call()
    assert (
        g.before_tool_call("s", {"cursor": "a"}).fingerprint
        != g.before_tool_call("s", {"cursor": "b"}).fingerprint
    )


def test_same_action_changed_observation_is_allowed() -> None:
    g = guard(repeat_limit=3)
    for i in range(6):
        assert step_tool(g, "get", {"id": 1}, result={"status": f"s{i}"}) is None


def test_same_action_after_a_503_then_success_is_allowed() -> None:
    g = guard(repeat_limit=3)
    assert step_tool(g, "get", {"id": 1}, error=ToolFailure("503", FailureClass.TRANSIENT)) is None
    assert step_tool(g, "get", {"id": 1}, result={"v": 1}) is None


def test_test_edit_test_with_changed_file_digest_is_not_a_cycle() -> None:
    g = guard(cycle_max_period=4, cycle_repetitions=2)
    for i in range(5):
        assert step_tool(g, "run_tests", {}, result={"failed": 5 - i}) is None
        assert (
            step_tool(g, "edit_file", {"path": "a.py", "patch": f"p{i}"}, result={"ok": True})
            is None
        )


# ------------------------------------------------------------------ writes


def write_tools(**kw: Any) -> tuple[ToolPolicy, ...]:
    return (ToolPolicy("send_email", risk="write", idempotency_key="idempotency_key", **kw),)


def test_write_duplicate_intent_with_a_fresh_key_is_refused() -> None:
    g = guard(tools=write_tools(repeat_limit=1))
    assert (
        step_tool(g, "send_email", {"to": "a@x", "idempotency_key": "k1"}, result={"id": 1}) is None
    )
    stop = step_tool(g, "send_email", {"to": "a@x", "idempotency_key": "k2"}, result={"id": 2})
    assert stop is not None and stop.reason is StopReason.REPEATED_ACTION
    assert stop.evidence.detector == "duplicate_intent"


def test_write_duplicate_intent_not_only_in_a_row() -> None:
    g = guard(tools=write_tools())
    assert (
        step_tool(g, "send_email", {"to": "a@x", "idempotency_key": "k1"}, result={"id": 1}) is None
    )
    assert step_tool(g, "lookup", {"q": 1}, result={"r": 1}) is None
    stop = step_tool(g, "send_email", {"to": "a@x", "idempotency_key": "k9"}, result={"id": 2})
    assert stop is not None and stop.evidence.detector == "duplicate_intent"


def test_write_same_key_is_stable_completion() -> None:
    g = guard(tools=write_tools(repeat_limit=1))
    assert (
        step_tool(g, "send_email", {"to": "a@x", "idempotency_key": "k1"}, result={"id": 1}) is None
    )
    assert (
        step_tool(
            g,
            "send_email",
            {"to": "a@x", "idempotency_key": "k1"},
            result={"id": 1, "replayed": True},
        )
        is None
    )


def test_write_default_repeat_limit_is_stricter_than_reads() -> None:
    p = Policy.build(repeat_limit=5, tools=(ToolPolicy("w", risk="write"),))
    assert RepeatLimits.of(p, p.tool("w")).in_a_row == 2
    assert RepeatLimits.of(p, p.tool("r")).in_a_row == 5


def test_write_timeout_retried_only_with_an_idempotency_key() -> None:
    g = guard(tools=(ToolPolicy("pay", risk="write"),), max_retries_per_action=3)
    assert step_tool(g, "pay", {"amount": 5}, error=TimeoutError()) is None
    stop = step_tool(g, "pay", {"amount": 5}, result={"ok": 1})
    assert stop is not None and stop.dimension is Dimension.ACTION_RETRIES and stop.limit == 0
    g2 = guard(tools=write_tools(), max_retries_per_action=3)
    assert (
        step_tool(g2, "send_email", {"to": "a", "idempotency_key": "k"}, error=TimeoutError())
        is None
    )
    assert (
        step_tool(g2, "send_email", {"to": "a", "idempotency_key": "k"}, result={"id": 1}) is None
    )


@pytest.mark.parametrize(
    "fc", [FailureClass.INVALID_ARGUMENTS, FailureClass.UNAUTHORIZED, FailureClass.PERMANENT]
)
def test_non_retryable_failures_are_never_retried_as_is(fc: FailureClass) -> None:
    g = guard(max_retries_per_action=5)
    assert step_tool(g, "t", {"a": 1}, error=ToolFailure("no", fc)) is None
    stop = step_tool(g, "t", {"a": 1}, result=1)
    assert stop is not None and stop.evidence.failure_class == fc.value
    g2 = guard(max_retries_per_action=5)
    step_tool(g2, "t", {"a": 1}, error=ToolFailure("no", fc))
    assert step_tool(g2, "t", {"a": 2}, result=1) is None, "changed arguments are a new action"


def test_empty_valid_result_is_not_a_failure_but_repeats_are_loops() -> None:
    g = guard(repeat_limit=3)
    assert step_tool(g, "find", {"q": "x"}, result=[]) is None
    assert step_tool(g, "find", {"q": "x"}, result=[]) is None
    stop = step_tool(g, "find", {"q": "x"}, result=[])
    assert stop is not None and stop.reason is StopReason.REPEATED_ACTION


@pytest.mark.parametrize("between", ["nothing", "a chat turn", "progress"])
def test_a_re_read_after_new_information_is_not_a_repeat(between: str) -> None:
    """``repeated_action`` is the same action with an unchanged result, in a row, with
    nothing learned in between. A re-read after explicit progress (a new user turn: the
    user changed something on their side) starts a new count; chat alone does not. Four
    successful tau2 telecom runs re-read the same line after each user turn and were
    stopped at the third read (replay corpus, 2026-12-01)."""
    g = guard(repeat_limit=3, no_progress_patience=100, repeated_decision_limit=100)
    stops = []
    for i in range(12):
        stops.append(step_tool(g, "get_details_by_id", {"id": "L1"}, result={"status": "on"}))
        if stops[-1] is not None:
            break
        g.before_model_call()
        g.record_decision(Decision.message(f"please try step {i}"))
        if between == "progress":
            g.progress("the user changed a setting")
        g.end_step()
    if between == "progress":
        # A new count after each progress, but twice the limit in a row is a loop all
        # the same: an environment reporting something new every turn (REPEAT_ACROSS_
        # PROGRESS_FACTOR) cannot switch the detector off.
        cap = 3 * REPEAT_ACROSS_PROGRESS_FACTOR
        assert stops[: cap - 1] == [None] * (cap - 1)
        stop = stops[cap - 1]
        assert stop is not None and stop.reason is StopReason.REPEATED_ACTION
        assert stop.evidence is not None and stop.evidence.repetitions == cap
        assert stop.evidence.detail["across_progress"] is True and stop.limit == cap
    else:
        assert stops[:2] == [None, None]
        assert stops[2] is not None and stops[2].reason is StopReason.REPEATED_ACTION
        assert stops[2].evidence is not None and stops[2].evidence.repetitions == 3


# ---------------------------------------------------------------- deadline


def test_deadline_checked_before_tool_dispatch_at_equality() -> None:
    clock = FakeClock()
    g = Guard(Policy.build(max_elapsed_seconds=5), clock=clock)
    g.before_model_call()
    clock.advance(5)
    ticket = g.before_tool_call("t", {})
    assert (
        not ticket.allowed
        and ticket.stop is not None
        and ticket.stop.reason is StopReason.DEADLINE_EXCEEDED
    )


def test_tool_timeout_is_capped_by_the_remaining_deadline() -> None:
    clock = FakeClock()
    g = Guard(Policy.build(max_elapsed_seconds=10, tool_timeout_seconds=60), clock=clock)
    g.before_model_call()
    clock.advance(7)
    assert g.before_tool_call("t", {}).timeout_seconds == pytest.approx(3)


def test_late_result_cannot_append_to_a_stopped_run() -> None:
    g = guard()
    g.before_model_call()
    ticket = g.before_tool_call("t", {})
    g.cancel()
    record = g.record_tool_result(ticket, result={"late": True})
    assert not record.accepted
    assert g.usage().tool_successes == 0


def test_nothing_after_the_stop() -> None:
    g = guard(max_model_turns=1)
    g.before_model_call()
    g.record_decision(Decision.final("x"))
    assert not g.before_model_call().allowed
    assert not g.before_tool_call("t", {}).allowed
    assert g.record_decision(Decision.message("late")).stop is not None
    assert g.outcome().stop.reason is StopReason.COMPLETED


def test_exactly_one_stop_even_when_several_rules_fire() -> None:
    g = guard(max_model_turns=1)
    g.before_model_call()
    g.record_decision(Decision.message("a"))
    first = g.before_model_call().stop
    g.cancel()
    g.fail(RuntimeError())
    assert g.outcome().stop is first


# ------------------------------------------------------------ observe mode


def test_observe_mode_records_but_does_not_stop() -> None:
    g = Guard(Policy.build(repeat_limit=3), clock=FakeClock(), mode="observe")
    for _ in range(5):
        assert step_tool(g, "get", {"id": 1}, result={"v": 1}) is None
    outcome = g.finish("answer")
    assert outcome.stop.reason is StopReason.COMPLETED
    assert outcome.observed_stops and outcome.observed_stops[0].reason is StopReason.REPEATED_ACTION
    assert outcome.observed_stops[0].step == 3


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        Guard(Policy(), mode="panic")  # type: ignore[arg-type]


# ---------------------------------------------------------- children, resume


def test_children_cannot_create_capacity() -> None:
    parent = Guard(
        Policy.build(max_model_turns=10, repeated_decision_limit=100, no_progress_patience=100),
        clock=FakeClock(),
    )
    parent.before_model_call()
    total_child_turns = 0
    for i in range(10):
        try:
            child = parent.child(
                Policy.build(
                    max_model_turns=10, repeated_decision_limit=100, no_progress_patience=100
                )
            )
        except RunStateError:
            break
        while child.before_model_call().allowed:
            child.record_decision(Decision.message(f"c{i}-{total_child_turns}"))
            total_child_turns += 1
    assert total_child_turns == 9
    assert parent.usage().model_turns == 10
    assert not parent.before_model_call().allowed


def test_child_limits_record_the_parent_as_source() -> None:
    parent = Guard(Policy.build(max_tool_attempts=5), clock=FakeClock())
    parent.before_model_call()
    t = parent.before_tool_call("a", {})
    parent.record_tool_result(t, result=1)
    child = parent.child(Policy.build(max_tool_attempts=10))
    assert (
        child.policy.max_tool_attempts == 4
        and child.policy.sources["max_tool_attempts"] == "parent"
    )


def test_child_stop_by_parent_budget_names_the_parent_scope() -> None:
    parent = Guard(Policy.build(max_tool_attempts=2), clock=FakeClock())
    child = parent.child(Policy.build(max_tool_attempts=10))
    other = parent.child(Policy.build(max_tool_attempts=10))
    for i in range(2):
        child.before_model_call()
        assert child.before_tool_call("t", {"i": i}).allowed
    other.before_model_call()
    ticket = other.before_tool_call("t", {"i": 9})
    assert ticket.stop is not None and ticket.stop.evidence.scope == "parent"


def test_resume_keeps_usage_and_fingerprint_window() -> None:
    policy = Policy.build(max_model_turns=5, repeat_limit=4)
    g = Guard(policy, clock=FakeClock())
    for _ in range(3):
        assert step_tool(g, "get", {"id": 1}, result={"v": 1}) is None
    state = g.snapshot()
    import json

    state = json.loads(json.dumps(state))
    resumed = Guard.restore(policy, state, clock=FakeClock())
    assert resumed.usage().model_turns == 3 and resumed.run_id == g.run_id
    stop = step_tool(resumed, "get", {"id": 1}, result={"v": 1})
    assert stop is not None and stop.reason is StopReason.REPEATED_ACTION, (
        "window survived the resume"
    )
    fresh = Guard.restore(policy, json.loads(json.dumps(g.snapshot())), clock=FakeClock())
    assert step_tool(fresh, "other", {}, result=1) is None
    assert step_tool(fresh, "other2", {}, result=2) is None
    assert not fresh.before_model_call().allowed, "no fresh budget on resume"


def test_resume_of_a_stopped_run_is_refused() -> None:
    g = guard()
    g.cancel()
    with pytest.raises(ValueError, match="stopped"):
        Guard.restore(Policy(), g.snapshot())


def test_resume_keeps_elapsed_time() -> None:
    clock = FakeClock()
    g = Guard(Policy.build(max_elapsed_seconds=10), clock=clock)
    clock.advance(8)
    resumed = Guard.restore(
        Policy.build(max_elapsed_seconds=10), g.snapshot(), clock=FakeClock(5000)
    )
    assert resumed.remaining_seconds() == pytest.approx(2)


# ------------------------------------------------------------ concurrency


def test_parallel_tool_calls_cannot_both_take_the_last_slot() -> None:
    for _ in range(20):
        g = guard(max_tool_attempts=10, max_tool_successes=100)
        g.before_model_call()
        allowed: list[bool] = []
        barrier = threading.Barrier(16)

        def worker(
            i: int,
            g: Guard = g,
            barrier: threading.Barrier = barrier,
            allowed: list[bool] = allowed,
        ) -> None:
            barrier.wait()
            allowed.append(g.before_tool_call("t", {"i": i}).allowed)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(allowed) == 10


# ------------------------------------------------------------ bounded state


def test_detector_memory_is_bounded_over_100k_steps() -> None:
    policy = Policy.build(
        max_model_turns=10**7,
        max_tool_attempts=10**7,
        max_tool_successes=10**7,
        max_elapsed_seconds=10**9,
        detector_window=64,
        no_progress_patience=10**6,
        repeated_decision_limit=10**6,
    )
    g = Guard(policy, clock=FakeClock())

    def run(n: int, offset: int) -> None:
        for i in range(offset, offset + n):
            g.before_model_call()
            g.record_decision(Decision.message(f"plan {i % 7}") if i % 5 == 0 else Decision.tool())
            t = g.before_tool_call("t", {"i": i})
            assert t.allowed
            g.record_tool_result(
                t,
                result={"i": i},
                error=ToolFailure("x", FailureClass.TRANSIENT) if i % 11 == 0 else None,
            )

    # Warm up past the longest look-back: a limit of 10**6 (switched off) sizes the
    # decision look-back at MAX_LOOKBACK, filled by every 5th step (the messages).
    warm = 5 * MAX_LOOKBACK + 1_000
    tracemalloc.start()  # before the windows fill: what they drop later is traced too
    run(warm, 0)
    run(1_000, warm)
    before = tracemalloc.take_snapshot()
    run(3_000, warm + 1_000)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(
        s.size_diff
        for s in after.compare_to(before, "filename")
        if "instrumentation" in str(s.traceback)
    )
    assert grown < 16 * 1024, (
        f"guard state grew by {grown} bytes over 3k steps once its windows were full"
    )
    run(100_000, warm + 4_000)
    d = g._detectors
    assert len(d.actions) <= 64 and len(d.seen) <= 256 and len(d.decisions) <= MAX_LOOKBACK
    assert len(d.last_failure) <= 64 and len(d.retries) <= 64 and len(d.writes) <= 64
    assert len(d.progress_values) <= 64 and len(d.decision_counts) <= 64
    assert len(d.streak_steps) <= 64
