"""The shipped example runs end as named, cover every stop reason, keep the invariants."""

from __future__ import annotations

from loopwatch.instrumentation import StopReason
from loopwatch.instrumentation.examples import EXAMPLES, run_examples
from loopwatch.instrumentation.testing import assert_trace_invariants
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def test_examples_cover_every_stop_reason_with_invariants() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    outcomes = run_examples(tracer_provider=provider)
    provider.shutdown()
    expected = {e.name: e.expected for e in EXAMPLES}
    expected |= {"cancelled by the caller": "cancelled", "the loop itself crashes": "error"}
    assert {name: o.stop.reason.value for name, o in outcomes.items()} == expected
    assert {o.stop.reason for o in outcomes.values()} == set(StopReason)
    runs = assert_trace_invariants(exporter.get_finished_spans())
    assert len(runs) == len(outcomes)
    tools = {
        s.attributes["gen_ai.tool.name"]
        for s in exporter.get_finished_spans()
        if s.name.startswith("execute_tool")
    }
    shapes = {
        "get_details_by_id",
        "toggle_state",
        "check_status",
        "poll_job",
        "search_orders",
        "slow_export",
        "fetch_invoice",
    }
    assert shapes <= tools, "the seven adversarial tool shapes"
