"""Spans exactly as DESIGN section 4; content opt-in; telemetry never raises into the agent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from loopwatch.instrumentation import (
    Decision,
    Policy,
    Run,
    StopReason,
    ToolCall,
    ToolFailure,
    agent,
    decision,
    tool,
)
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation._tracing import telemetry_drops
from loopwatch.instrumentation.testing import (
    ConstantTool,
    FakeClock,
    HangingTool,
    ScriptedModel,
    assert_trace_invariants,
    collect_runs,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


def support_agent(provider: TracerProvider, model: ScriptedModel, policy: Policy, **kw: Any):
    backend = ConstantTool(name="lookup_order")

    @tool
    def lookup_order(order_id: str, request_id: str = "") -> dict[str, Any]:
        return backend(order_id=order_id)

    @decision
    def decide(messages: list[str]) -> Decision:
        return model(messages)

    @agent(name="support", policy=policy, tracer_provider=provider, clock=FakeClock(), **kw)
    def loop(task: str) -> Any:
        messages = [task]
        while True:
            d = decide(messages)
            if d.type == "final":
                return d.answer
            for c in d.tool_calls:
                messages.append(str(lookup_order(**c.arguments)))

    return loop


def test_span_names_kinds_and_attributes(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel(
        [
            Decision.tool(
                ToolCall("lookup_order", {"order_id": "A-1"}),
                input_tokens=100,
                output_tokens=20,
                cost_usd=0.002,
            ),
            Decision.final("shipped", input_tokens=120, output_tokens=10),
        ]
    )
    outcome = support_agent(provider, model, Policy.build(max_model_turns=5))("where is A-1?")
    assert outcome.stop.reason is StopReason.COMPLETED and outcome.answer == "shipped"
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert names == [
        "decide support",
        "execute_tool lookup_order",
        "decide support",
        "stop support",
        "invoke_agent support",
    ]
    assert all(s.kind is SpanKind.INTERNAL for s in spans)
    run_span = spans[-1]
    assert run_span.parent is None
    for s in spans[:-1]:
        assert s.parent is not None and s.parent.span_id == run_span.context.span_id
        assert s.context.trace_id == run_span.context.trace_id

    ra = run_span.attributes
    assert ra[sc.GEN_AI_OPERATION_NAME] == "invoke_agent" and ra[sc.GEN_AI_AGENT_NAME] == "support"
    assert ra[sc.LW_RUN_ID] == outcome.run_id and ra[sc.LW_POLICY_NAME] == "default"
    limits = json.loads(ra[sc.LW_LIMITS])
    assert limits["max_model_turns"] == {"value": 5, "source": "call"}
    assert limits["max_tokens"]["source"] == "default"
    assert ra[sc.LW_STOP_REASON] == "completed" and ra[sc.GEN_AI_AGENT_FINISH_REASON] == "completed"

    d1 = spans[0].attributes
    assert (d1[sc.LW_EVENT], d1[sc.LW_STEP], d1[sc.LW_DECISION_TYPE]) == ("decision", 1, "tool")
    assert d1[sc.GEN_AI_USAGE_INPUT_TOKENS] == 100 and d1[sc.LW_COST_USD] == pytest.approx(0.002)
    assert sc.LW_DECISION_FINGERPRINT not in d1
    assert len(spans[2].attributes[sc.LW_DECISION_FINGERPRINT]) == 64

    t = spans[1].attributes
    assert (
        t[sc.GEN_AI_OPERATION_NAME] == "execute_tool" and t[sc.GEN_AI_TOOL_NAME] == "lookup_order"
    )
    assert t[sc.LW_EVENT] == "tool_result" and t[sc.LW_STEP] == 1 and t[sc.GEN_AI_TOOL_CALL_ID]
    assert len(t[sc.LW_ACTION_FINGERPRINT]) == 64 and len(t[sc.LW_OBSERVATION_DIGEST]) == 64
    assert (
        t[sc.LW_TOOL_OUTCOME],
        t[sc.LW_TOOL_RISK],
        t[sc.LW_PROGRESS],
        t[sc.LW_STEPS_SINCE_PROGRESS],
    ) == ("ok", "read", True, 0)
    assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in t and sc.GEN_AI_TOOL_CALL_RESULT not in t, (
        "content is opt-in"
    )

    s = spans[3].attributes
    assert s[sc.LW_EVENT] == "stop" and s[sc.LW_STOP_REASON] == "completed" and s[sc.LW_STEP] == 2
    assert (
        s[sc.LW_USAGE_MODEL_TURNS] == 2
        and s[sc.LW_USAGE_TOOL_ATTEMPTS] == 1
        and s[sc.LW_USAGE_TOKENS] == 250
    )
    assert_trace_invariants(spans)


def test_budget_stop_attributes_and_evidence(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel([Decision.tool(ToolCall("lookup_order", {"order_id": "A-1"}))] * 5)
    outcome = support_agent(provider, model, Policy.build(max_model_turns=2))("x")
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    stop = next(s for s in exporter.get_finished_spans() if s.name == "stop support").attributes
    assert (
        stop[sc.LW_STOP_DIMENSION],
        stop[sc.LW_STOP_LIMIT],
        stop[sc.LW_STOP_OBSERVED],
        stop[sc.LW_STOP_BASIS],
    ) == ("model_turns", 2.0, 3.0, "projected")
    assert json.loads(stop[sc.LW_STOP_EVIDENCE])["detector"] == "ceiling"


def test_volatile_request_id_does_not_evade_repeat(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    script = [
        Decision.tool(ToolCall("lookup_order", {"order_id": "A-1", "request_id": f"r{i}"}))
        for i in range(9)
    ]
    outcome = support_agent(provider, ScriptedModel(script), Policy.build(repeat_limit=3))("x")
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    fps = {
        s.attributes[sc.LW_ACTION_FINGERPRINT]
        for s in exporter.get_finished_spans()
        if s.name.startswith("execute_tool")
    }
    assert len(fps) == 1


def test_content_capture_is_opt_in_truncated_and_scrubbed(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    secret = "sk-proj-" + "A1b2C3d4" * 6
    big = "x" * 100_000
    model = ScriptedModel(
        [
            Decision.tool(
                ToolCall("echo", {"text": big, "api_key": secret, "note": f"key {secret}"})
            ),
            Decision.final("ok"),
        ]
    )
    with Run(
        "cap", Policy(), tracer_provider=provider, capture_content=True, clock=FakeClock()
    ) as run:
        d = run.decide(model)
        for c in d.tool_calls:
            run.call_tool(
                c.name, c.arguments, fn=lambda **kw: {"echo": kw["note"], "items": list(range(500))}
            )
        run.decide(model)
    tool_span = next(s for s in exporter.get_finished_spans() if s.name == "execute_tool echo")
    args = tool_span.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]
    result = tool_span.attributes[sc.GEN_AI_TOOL_CALL_RESULT]
    assert secret not in args and secret not in result
    assert len(args) <= 16_384 and len(result) <= 16_384
    parsed = json.loads(args)
    assert set(parsed) == {"text", "api_key", "note"} and "REDACTED" in parsed["api_key"]
    assert "chars]" in parsed["text"]
    assert json.loads(result)["items"][-1].startswith("…")


def test_capture_follows_the_genai_env_switch(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    monkeypatch.setenv(sc.ENV_CAPTURE_CONTENT, "true")
    with Run("cap", Policy(), tracer_provider=provider, clock=FakeClock()) as run:
        run.decide(lambda: Decision.tool(ToolCall("t", {"a": 1})))
        run.call_tool("t", {"a": 1}, fn=lambda a: a + 1)
    span = next(s for s in exporter.get_finished_spans() if s.name == "execute_tool t")
    assert (
        span.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] == '{"a":1}'
        and span.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "2"
    )


class ExplodingExporter(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        raise RuntimeError("collector down")

    def shutdown(self) -> None:
        pass


class ExplodingProvider:
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken provider")


@pytest.mark.parametrize("kind", ["exporter", "provider"])
def test_telemetry_failure_never_raises_into_the_agent(kind: str) -> None:
    if kind == "exporter":
        tp: Any = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(ExplodingExporter()))
    else:
        tp = ExplodingProvider()
    before = telemetry_drops()
    model = ScriptedModel(
        [Decision.tool(ToolCall("lookup_order", {"order_id": "A"})), Decision.final("ok")]
    )
    outcome = support_agent(tp, model, Policy())("x")
    assert outcome.stop.reason is StopReason.COMPLETED
    if kind == "provider":
        assert telemetry_drops() > before


def test_no_tracer_provider_configured_still_guards() -> None:
    model = ScriptedModel([Decision.tool(ToolCall("lookup_order", {"order_id": "A"}))] * 9)
    outcome = support_agent(None, model, Policy.build(repeat_limit=3))("x")  # type: ignore[arg-type]
    assert outcome.stop.reason is StopReason.REPEATED_ACTION


def test_unexpected_exception_is_an_error_stop_and_reraised(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    @agent(name="crashy", tracer_provider=provider, clock=FakeClock())
    def loop() -> None:
        raise KeyError("secret-ish detail")

    with pytest.raises(KeyError):
        loop()
    stop = next(s for s in exporter.get_finished_spans() if s.name == "stop crashy").attributes
    assert stop[sc.LW_STOP_REASON] == "error"
    assert json.loads(stop[sc.LW_STOP_EVIDENCE])["detail"] == {"exception_type": "KeyError"}
    assert "secret-ish" not in json.dumps(dict(stop))


def test_sync_tool_timeout_and_late_result(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    hanging = HangingTool(max_seconds=5)
    policy = Policy.build(tool_timeout_seconds=0.2)
    with Run("slow", policy, tracer_provider=provider, tools={"slow_export": hanging}) as run:
        run.decide(lambda: Decision.tool(ToolCall("slow_export", {})))
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            run.call_tool("slow_export", {})
        assert time.monotonic() - t0 < 2
        run.decide(lambda: Decision.final("gave up"))
    hanging.release()
    time.sleep(0.05)
    spans = exporter.get_finished_spans()
    tool_span = next(s for s in spans if s.name == "execute_tool slow_export")
    assert (
        tool_span.attributes[sc.LW_TOOL_OUTCOME] == "error"
        and tool_span.attributes[sc.LW_TOOL_FAILURE_CLASS] == "timeout"
    )
    assert run.outcome.usage.tool_successes == 0, "the late result was not appended"
    assert_trace_invariants(spans)


def test_async_agent_tools_and_timeout(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel(
        [
            Decision.tool(ToolCall("fetch", {"x": 1})),
            Decision.tool(ToolCall("stuck", {})),
            Decision.final("done"),
        ]
    )

    @tool
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    @tool
    async def stuck() -> None:
        await asyncio.sleep(30)

    @decision
    async def decide() -> Decision:
        return model()

    @agent(
        name="async_agent", policy=Policy.build(tool_timeout_seconds=0.1), tracer_provider=provider
    )
    async def loop() -> Any:
        while True:
            d = await decide()
            if d.type == "final":
                return d.answer
            for c in d.tool_calls:
                with contextlib.suppress(TimeoutError):
                    await (fetch if c.name == "fetch" else stuck)(**c.arguments)

    outcome = asyncio.run(loop())
    assert outcome.stop.reason is StopReason.COMPLETED
    runs = assert_trace_invariants(exporter.get_finished_spans())
    tools = runs[outcome.run_id].tools
    assert [t.attributes[sc.LW_TOOL_OUTCOME] for t in tools] == ["ok", "error"]


def test_nested_agent_is_a_child_run(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    @agent(
        name="researcher",
        tracer_provider=provider,
        policy=Policy.build(
            max_model_turns=10, repeated_decision_limit=50, no_progress_patience=50
        ),
    )
    def child_loop() -> str:
        run_model = ScriptedModel([Decision.message(f"m{i}") for i in range(20)])
        while True:
            decision_fn(run_model)

    @decision
    def decision_fn(m: ScriptedModel) -> Decision:
        return m()

    @agent(
        name="lead",
        tracer_provider=provider,
        policy=Policy.build(max_model_turns=4, repeated_decision_limit=50, no_progress_patience=50),
    )
    def parent_loop() -> Any:
        decision_fn(ScriptedModel([Decision.message("plan")]))
        inner = child_loop()
        return inner

    outcome = parent_loop()
    inner = outcome.answer
    assert inner.stop.reason is StopReason.BUDGET_EXHAUSTED and inner.usage.model_turns == 3
    runs = collect_runs(exporter.get_finished_spans())
    child_run = runs[inner.run_id].run
    assert child_run.attributes[sc.LW_PARENT_RUN_ID] == outcome.run_id
    assert json.loads(child_run.attributes[sc.LW_LIMITS])["max_model_turns"] == {
        "value": 3,
        "source": "parent",
    }


def test_unknown_tool_with_a_registry_is_an_error_not_a_dispatch(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with Run("r", Policy(), tracer_provider=provider, tools={"known": lambda: 1}) as run:
        run.decide(lambda: Decision.tool(ToolCall("ghost", {})))
        with pytest.raises(ToolFailure) as info:
            run.call_tool("ghost", {})
        assert info.value.failure_class.value == "unknown_tool"
        run.decide(lambda: Decision.final("x"))
    span = next(s for s in exporter.get_finished_spans() if s.name == "execute_tool ghost")
    assert (
        span.attributes[sc.ERROR_TYPE] == "unknown_tool"
        and span.attributes[sc.LW_TOOL_OUTCOME] == "error"
    )


def test_decision_function_must_return_a_decision(provider: TracerProvider) -> None:
    with (
        pytest.raises(TypeError, match="Decision"),
        Run("r", Policy(), tracer_provider=provider) as run,
    ):
        run.decide(lambda: "final answer")


def test_observe_mode_spans(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    model = ScriptedModel(
        [Decision.tool(ToolCall("lookup_order", {"order_id": "A"}))] * 4 + [Decision.final("ok")]
    )
    outcome = support_agent(provider, model, Policy.build(repeat_limit=3), mode="observe")("x")
    assert outcome.stop.reason is StopReason.COMPLETED
    spans = exporter.get_finished_spans()
    stop = next(s for s in spans if s.name == "stop support").attributes
    assert (
        stop[sc.LW_OBSERVE_STOP_REASON] == "repeated_action" and stop[sc.LW_OBSERVE_STOP_STEP] == 3
    )
    evidence = json.loads(stop[sc.LW_OBSERVE_STOP_EVIDENCE])
    assert evidence["detector"] == "repeated_action" and evidence["tool"] == "lookup_order"
    assert json.loads(stop[sc.LW_STOP_EVIDENCE]) == {"scope": "run"}  # the real stop's
    outcomes = [
        s.attributes[sc.LW_TOOL_OUTCOME] for s in spans if s.name.startswith("execute_tool")
    ]
    assert outcomes == ["ok"] * 4
    assert_trace_invariants(spans)


def test_current_run_outside_a_run_is_an_error() -> None:
    from loopwatch.instrumentation import RunStateError

    @decision
    def decide() -> Decision:
        return Decision.final(1)

    with pytest.raises(RunStateError):
        decide()

    @tool
    def add(a: int, b: int) -> int:
        return a + b

    assert add(1, 2) == 3, "a tool outside a run runs unguarded"
