"""A scenario runner: a real Run, a scripted model, real tools, spans in memory."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from loopwatch.instrumentation import Outcome, Policy, Run, ToolFailure
from loopwatch.instrumentation.testing import FakeClock, ScriptedModel, assert_trace_invariants
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@dataclass
class Result:
    outcome: Outcome
    spans: tuple[ReadableSpan, ...]
    model: ScriptedModel
    tool_errors: list[BaseException]

    def tool_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name.startswith("execute_tool")]

    def executed(self) -> int:
        return sum(
            1
            for s in self.tool_spans()
            if s.attributes.get("loopwatch.tool.outcome") in ("ok", "error")
            and s.attributes.get("error.type") != "unknown_tool"
        )


def run_scenario(
    policy: Policy,
    model: ScriptedModel,
    tools: Mapping[str, Callable[..., Any]],
    *,
    clock: FakeClock | None = None,
    tool_seconds: float = 0.0,
    check_invariants: bool = True,
    **run_kwargs: Any,
) -> Result:
    """Drive a standard agent loop: ask the model, run every tool call, feed errors back."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = clock or FakeClock()
    errors: list[BaseException] = []
    with Run(
        "scenario", policy, tools=dict(tools), clock=clock, tracer_provider=provider, **run_kwargs
    ) as run:
        while True:
            decision = run.decide(model)
            if decision.type == "final":
                run.finish(decision.answer)
                break
            for call in decision.tool_calls:
                try:
                    run.call_tool(call.name, call.arguments, call_id=call.call_id)
                except (ToolFailure, TimeoutError) as exc:
                    errors.append(exc)
                if tool_seconds:
                    clock.advance(tool_seconds)
    spans = exporter.get_finished_spans()
    if check_invariants:
        assert_trace_invariants(spans)
    provider.shutdown()
    return Result(run.outcome, spans, model, errors)
