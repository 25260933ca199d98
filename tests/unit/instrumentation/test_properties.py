"""Property tests (hypothesis, derandomized): any decision sequence ends within the caps
with every trace invariant holding; fingerprints are canonical."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopwatch.instrumentation import (
    Decision,
    FailureClass,
    Policy,
    Run,
    StopReason,
    ToolCall,
    ToolFailure,
)
from loopwatch.instrumentation.fingerprint import action_fingerprint, canonicalize
from loopwatch.instrumentation.testing import FakeClock, ScriptedModel, assert_trace_invariants
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TOOLS = ["search", "get", "update"]
RESULTS = [{"v": 1}, {"v": 2}, [], None, "ok", {"status": "pending"}]

tool_call = st.builds(
    lambda name, arg: ToolCall(name, {"id": arg}),
    st.sampled_from(TOOLS),
    st.integers(min_value=0, max_value=3),
)
decision_st = st.one_of(
    st.builds(
        lambda calls: Decision.tool(*calls, input_tokens=50, output_tokens=10),
        st.lists(tool_call, min_size=1, max_size=4),
    ),
    st.builds(Decision.message, st.sampled_from(["", "plan A", "plan B", "thinking"])),
    st.just(Decision.final("answer")),
    st.just(Decision.refusal("no")),
)
policy_st = st.builds(
    lambda turns, attempts, successes, repeat, patience, tokens: Policy.build(
        max_model_turns=turns,
        max_tool_attempts=attempts,
        max_tool_successes=successes,
        repeat_limit=repeat,
        no_progress_patience=patience,
        max_tokens=tokens,
        max_elapsed_seconds=50,
    ),
    st.integers(0, 12),
    st.integers(0, 15),
    st.integers(0, 15),
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(0, 2000),
)


@settings(
    max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    policy=policy_st,
    script=st.lists(decision_st, min_size=1, max_size=30),
    outcomes=st.lists(st.integers(0, 7), min_size=60, max_size=60),
)
def test_any_decision_sequence_ends_within_caps_with_invariants(
    policy: Policy, script: list[Decision], outcomes: list[int]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = FakeClock()
    counter = iter(outcomes * 10)

    def backend(**kwargs: Any) -> Any:
        k = next(counter)
        clock.advance(1)
        if k == 6:
            raise ToolFailure("503", FailureClass.TRANSIENT)
        if k == 7:
            raise ToolFailure("bad", FailureClass.INVALID_ARGUMENTS)
        return RESULTS[k]

    model = ScriptedModel(script + [Decision.final("fallback")] * 60)
    with Run("prop", policy, clock=clock, tracer_provider=provider) as run:
        while True:
            d = run.decide(model)
            if d.type == "final":
                break
            for c in d.tool_calls:
                with contextlib.suppress(ToolFailure):
                    run.call_tool(c.name, c.arguments, fn=backend)
    outcome = run.outcome
    u = outcome.usage
    assert u.model_turns <= policy.max_model_turns
    assert u.tool_attempts <= policy.max_tool_attempts
    assert u.tool_successes <= min(policy.max_tool_successes, u.tool_attempts)
    assert model.calls == u.model_turns
    if outcome.stop.reason is StopReason.COMPLETED:
        assert outcome.answer is not None
    else:
        assert outcome.status == "stopped"
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert list(runs) == [outcome.run_id]
    provider.shutdown()


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, derandomize=True)
@given(args=st.dictionaries(st.text(max_size=6), json_value, max_size=6))
def test_fingerprint_ignores_key_order_and_is_idempotent(args: dict[str, Any]) -> None:
    reordered = dict(reversed(list(args.items())))
    assert action_fingerprint("t", args) == action_fingerprint("t", reordered)
    once = canonicalize(args)
    assert canonicalize(once) == once
    assert len(action_fingerprint("t", args)) == 64
