"""The testing kit itself: each invariant fails on a trace that breaks it; tools behave as named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from loopwatch.instrumentation import FailureClass, ToolFailure
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation.errors import ScriptExhaustedError
from loopwatch.instrumentation.testing import (
    ConstantTool,
    CursorTool,
    ErrorTool,
    EventualTool,
    FakeClock,
    FalseProgressTool,
    InvariantViolation,
    OscillatingTool,
    ScriptedModel,
    assert_trace_invariants,
)


@dataclass
class FakeSpan:
    name: str
    start_time: int
    end_time: int
    attributes: dict[str, Any] = field(default_factory=dict)


def good_trace() -> list[FakeSpan]:
    run = {sc.LW_RUN_ID: "r1"}
    return [
        FakeSpan(
            "invoke_agent a",
            0,
            100,
            {**run, sc.GEN_AI_OPERATION_NAME: "invoke_agent", sc.LW_STOP_REASON: "completed"},
        ),
        FakeSpan("decide a", 10, 20, {**run, sc.LW_EVENT: "decision", sc.LW_STEP: 1}),
        FakeSpan(
            "execute_tool t",
            21,
            30,
            {**run, sc.LW_EVENT: "tool_result", sc.LW_STEP: 1, sc.LW_TOOL_OUTCOME: "ok"},
        ),
        FakeSpan("decide a", 31, 40, {**run, sc.LW_EVENT: "decision", sc.LW_STEP: 2}),
        FakeSpan(
            "stop a",
            50,
            50,
            {
                **run,
                sc.LW_EVENT: "stop",
                sc.LW_STOP_REASON: "completed",
                sc.LW_USAGE_MODEL_TURNS: 2,
                sc.LW_USAGE_TOOL_ATTEMPTS: 1,
                sc.LW_USAGE_TOOL_SUCCESSES: 1,
            },
        ),
    ]


def test_a_good_trace_passes() -> None:
    assert list(assert_trace_invariants(good_trace())) == ["r1"]


def broken(kind: str) -> list[FakeSpan]:
    spans = good_trace()
    if kind == "two stops":
        spans.append(FakeSpan("stop a", 60, 60, dict(spans[-1].attributes)))
    elif kind == "no stop":
        spans.pop()
    elif kind == "after the stop":
        spans.append(
            FakeSpan(
                "execute_tool t",
                70,
                80,
                {
                    sc.LW_RUN_ID: "r1",
                    sc.LW_EVENT: "tool_result",
                    sc.LW_STEP: 2,
                    sc.LW_TOOL_OUTCOME: "ok",
                },
            )
        )
    elif kind == "success without earlier start":
        spans[2].start_time, spans[2].end_time = 30, 21
    elif kind == "tool before the run":
        spans[0].start_time = 25
    elif kind == "counters differ":
        spans[-1].attributes[sc.LW_USAGE_MODEL_TURNS] = 3
    elif kind == "successes > attempts":
        spans[-1].attributes[sc.LW_USAGE_TOOL_SUCCESSES] = 2
    elif kind == "run span disagrees":
        spans[0].attributes[sc.LW_STOP_REASON] = "no_progress"
    return spans


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        ("two stops", "exactly one stop"),
        ("no stop", "exactly one stop"),
        ("after the stop", "nothing after the stop"),
        ("success without earlier start", "earlier start"),
        ("tool before the run", "earlier start"),
        ("counters differ", "counters equal events"),
        ("successes > attempts", "successes <= attempts"),
        ("run span disagrees", "run span carries the stop"),
    ],
)
def test_each_broken_invariant_is_reported(kind: str, rule: str) -> None:
    with pytest.raises(InvariantViolation, match=rule):
        assert_trace_invariants(broken(kind))


def test_scripted_model_is_strict() -> None:
    model = ScriptedModel([])
    with pytest.raises(ScriptExhaustedError, match="scripted for 0"):
        model()


def test_fake_clock_never_goes_back() -> None:
    clock = FakeClock(5)
    clock.advance(2.5)
    assert clock() == 7.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_adversarial_tools_behave_as_named() -> None:
    c = ConstantTool()
    assert c(id=1) == c(id=2)
    o = OscillatingTool()
    assert [o()["state"] for _ in range(4)] == ["A", "B", "A", "B"]
    f = FalseProgressTool()
    a, b = f(), f()
    assert a["status"] == b["status"] and a["timestamp"] != b["timestamp"]
    e = EventualTool(pending_calls=2)
    assert [e()["status"] for _ in range(3)] == ["pending", "pending", "done"]
    cur = CursorTool(pages=2)
    first = cur(query="q")
    second = cur(query="q", cursor=first["next_cursor"])
    assert first["next_cursor"] == "1" and second["next_cursor"] is None
    with pytest.raises(ToolFailure) as info:
        ErrorTool(retryable=True)()
    assert info.value.failure_class is FailureClass.TRANSIENT
    with pytest.raises(ToolFailure) as info:
        ErrorTool(retryable=False)()
    assert info.value.failure_class is FailureClass.INVALID_ARGUMENTS


def test_pytest_plugin_fixtures(
    fake_clock: FakeClock, tracer_provider: Any, span_exporter: Any, assert_invariants: Any
) -> None:
    from loopwatch.instrumentation import Decision, Policy, Run

    with Run("fx", Policy(), clock=fake_clock, tracer_provider=tracer_provider) as run:
        run.decide(lambda: Decision.final("ok"))
    runs = assert_invariants()
    assert run.run_id in runs and len(span_exporter.get_finished_spans()) == 3
