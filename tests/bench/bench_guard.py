"""Per-step cost of the guard, of guard + spans, and of the bare OTel SDK spans they match.

Run: ``python -m tests.bench.bench_guard [--steps N]``. Prints microseconds per step (one
decision and one tool call) and the ratios the targets are stated in (issue 2):

- guard alone adds at most 20 us per step;
- loopwatch's spans cost at most 1.25x the bare SDK spans they correspond to, i.e.
  (guard + spans - guard) / bare spans <= 1.25.

All three are measured in the same process, same run, with a BatchSpanProcessor over an
exporter that drops everything (so export cost is not measured). Figures, not a timed
test: ``test_bench_guard_smoke`` runs a short version when LOOPWATCH_BENCH is set.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from loopwatch.instrumentation import Decision, Guard, Policy, Run, ToolCall
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation._content import scrub_for_digest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


POLICY = Policy.build(
    max_model_turns=10**8,
    max_tool_attempts=10**8,
    max_tool_successes=10**8,
    max_elapsed_seconds=10**6,
    no_progress_patience=10**6,
    repeated_decision_limit=10**6,
    max_tokens=10**12,
    max_cost_usd=10**9,
)
DECISION = Decision.tool(
    ToolCall("search_orders", {"query": "late"}), input_tokens=900, output_tokens=40
)


def args_for(i: int) -> dict[str, Any]:
    return {"query": "late orders", "customer_id": i, "page": 1}


def result_for(i: int) -> dict[str, Any]:
    return {"items": [{"id": i, "status": "shipped", "eta": "2026-12-01"}], "next_cursor": None}


def provider() -> TracerProvider:
    tp = TracerProvider()
    tp.add_span_processor(
        BatchSpanProcessor(DropExporter(), max_queue_size=1 << 16, schedule_delay_millis=200)
    )
    return tp


def guard_only(steps: int) -> float:
    g = Guard(POLICY, scrub=scrub_for_digest())
    t0 = time.perf_counter()
    for i in range(steps):
        g.before_model_call()
        g.record_decision(DECISION)
        ticket = g.before_tool_call("search_orders", args_for(i))
        g.record_tool_result(ticket, result=result_for(i))
    return time.perf_counter() - t0


def guard_and_spans(steps: int, tp: TracerProvider) -> float:
    run = Run("bench", POLICY, tracer_provider=tp)
    with run:
        t0 = time.perf_counter()
        for i in range(steps):
            with run.model_call() as call:
                call.record(DECISION)
            with run.tool_call("search_orders", args_for(i)) as tc:
                tc.set_result(result_for(i))
        elapsed = time.perf_counter() - t0
        run.finish("done")
    return elapsed


def bare_spans(steps: int, tp: TracerProvider) -> float:
    """The spans loopwatch emits per step, with the same names and attribute counts."""
    tracer = tp.get_tracer("bench")
    from opentelemetry import context, trace

    root = tracer.start_span("invoke_agent bench")
    ctx = trace.set_span_in_context(root)
    fp = "f" * 64
    t0 = time.perf_counter()
    for i in range(steps):
        d = tracer.start_span(
            "decide bench",
            context=ctx,
            kind=SpanKind.INTERNAL,
            attributes={sc.LW_EVENT: "decision", sc.LW_RUN_ID: "r", sc.LW_STEP: i},
        )
        token = context.attach(trace.set_span_in_context(d))
        context.detach(token)
        d.set_attributes(
            {
                sc.LW_STEPS_SINCE_PROGRESS: 0,
                sc.LW_DECISION_TYPE: "tool",
                sc.GEN_AI_USAGE_INPUT_TOKENS: 900,
                sc.GEN_AI_USAGE_OUTPUT_TOKENS: 40,
            }
        )
        d.end()
        t = tracer.start_span(
            "execute_tool search_orders",
            context=ctx,
            kind=SpanKind.INTERNAL,
            attributes={
                sc.GEN_AI_OPERATION_NAME: "execute_tool",
                sc.GEN_AI_TOOL_NAME: "search_orders",
                sc.GEN_AI_TOOL_CALL_ID: f"call_{i}",
                sc.LW_EVENT: "tool_result",
                sc.LW_RUN_ID: "r",
                sc.LW_STEP: i,
                sc.LW_ACTION_FINGERPRINT: fp,
                sc.LW_TOOL_RISK: "read",
            },
        )
        token = context.attach(trace.set_span_in_context(t))
        context.detach(token)
        t.set_attributes(
            {
                sc.LW_TOOL_OUTCOME: "ok",
                sc.LW_PROGRESS: True,
                sc.LW_STEPS_SINCE_PROGRESS: 0,
                sc.LW_OBSERVATION_DIGEST: fp,
            }
        )
        t.end()
    elapsed = time.perf_counter() - t0
    root.end()
    return elapsed


def median_us(fn: Callable[[int], float], steps: int, repeats: int) -> float:
    fn(min(steps, 500))
    samples = []
    for _ in range(repeats):
        gc.collect()
        samples.append(fn(steps) / steps * 1e6)
    return statistics.median(samples)


def measure(steps: int = 5000, repeats: int = 5) -> dict[str, float]:
    tp = provider()
    bare = median_us(lambda n: bare_spans(n, tp), steps, repeats)
    guard = median_us(guard_only, steps, repeats)
    both = median_us(lambda n: guard_and_spans(n, tp), steps, repeats)
    tp.shutdown()
    spans_only = max(both - guard, 0.0)
    return {
        "steps": steps,
        "bare_sdk_spans_us_per_step": bare,
        "guard_us_per_step": guard,
        "guard_and_spans_us_per_step": both,
        "loopwatch_spans_us_per_step": spans_only,
        "spans_ratio_vs_bare": spans_only / bare if bare else float("nan"),
    }


def report(figures: dict[str, float]) -> str:
    lines = [
        f"steps per sample:                  {figures['steps']:.0f}",
        f"bare OTel SDK spans (2 per step):  {figures['bare_sdk_spans_us_per_step']:8.1f} us/step",
        f"guard alone:                       {figures['guard_us_per_step']:8.1f} us/step   (target <= 20)",
        f"guard + loopwatch spans:           {figures['guard_and_spans_us_per_step']:8.1f} us/step",
        f"loopwatch spans (difference):      {figures['loopwatch_spans_us_per_step']:8.1f} us/step",
        f"loopwatch spans / bare spans:      {figures['spans_ratio_vs_bare']:8.2f} x      (target <= 1.25)",
    ]
    return "\n".join(lines)


def test_bench_guard_smoke() -> None:
    import pytest

    if not os.environ.get("LOOPWATCH_BENCH"):
        pytest.skip("benchmarks run with LOOPWATCH_BENCH=smoke|full")
    full = os.environ.get("LOOPWATCH_BENCH") == "full"
    figures = measure(steps=20000 if full else 2000, repeats=5 if full else 3)
    print("\n" + report(figures))
    assert figures["guard_us_per_step"] > 0 and figures["bare_sdk_spans_us_per_step"] > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args()
    print(report(measure(ns.steps, ns.repeats)))


if __name__ == "__main__":
    main()
