"""Real spans for collector tests: the real instrumentation, encoded as OTLP protobuf."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from loopwatch.collector.decode import decode_protobuf
from loopwatch.collector.records import SpanBatch
from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
from loopwatch.instrumentation.testing import ConstantTool, FakeClock, ScriptedModel
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def record(fn: Callable[[TracerProvider], Any]) -> tuple[ReadableSpan, ...]:
    """Run ``fn(provider)`` and return the finished spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fn(provider)
    provider.shutdown()
    return exporter.get_finished_spans()


def to_batch(spans: Sequence[ReadableSpan]) -> SpanBatch:
    """Encode with the SDK's OTLP encoder and decode with the collector's decoder."""
    return decode_protobuf(encode_spans(spans).SerializeToString())


def scripted_run(
    agent: str,
    decisions: Sequence[Decision],
    tools: dict[str, Any],
    policy: Policy,
    **kw: Any,
) -> Callable[[TracerProvider], Any]:
    """A run whose model makes ``decisions`` in turn, each tool call dispatched, until a
    final decision or the guard's stop."""

    def go(provider: TracerProvider) -> Any:
        model = ScriptedModel(list(decisions))
        with Run(
            agent, policy, tracer_provider=provider, clock=FakeClock(), tools=tools, **kw
        ) as run:
            while True:
                d = run.decide(model)
                if d.type == "final":
                    break
                for c in d.tool_calls:
                    run.call_tool(c.name, c.arguments)
        return run.outcome

    return go


def looping_run(
    agent: str = "support", *, calls: int = 10, policy: Policy | None = None, **kw: Any
) -> Callable[[TracerProvider], Any]:
    """A run calling the same tool with the same arguments until the guard stops it."""
    return scripted_run(
        agent,
        [Decision.tool(ToolCall("get_details_by_id", {"id": 42}))] * calls + [Decision.final("ok")],
        {"get_details_by_id": ConstantTool()},
        policy or Policy.build(repeat_limit=3),
        **kw,
    )


def completed_run(agent: str = "support") -> Callable[[TracerProvider], Any]:
    def go(provider: TracerProvider) -> Any:
        with Run(agent, Policy(), tracer_provider=provider, clock=FakeClock()) as run:
            run.decide(lambda: Decision.tool(ToolCall("lookup", {"q": 1})))
            run.call_tool("lookup", {"q": 1}, fn=lambda q: {"r": q})
            run.decide(lambda: Decision.final("done"))
        return run.outcome

    return go
