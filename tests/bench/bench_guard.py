"""Per-step cost of the guard, of guard + spans, and of the bare OTel SDK spans they match.

Run: ``LOOPWATCH_BENCH=full .venv/bin/pytest tests/bench/bench_guard.py -s`` (or
``python -m tests.bench.bench_guard [--steps N] [--rounds R]``). A step is one decision
and one tool call. Issue 2 states the targets against a bare SDK span (about 30 us on the
machine it was written on, so they are relative):

- the guard adds at most 20 us per step, i.e. at most 0.67 of one bare SDK span;
- loopwatch's spans cost at most 1.25x the bare SDK spans they correspond to:
  (guard + spans - guard) / bare spans <= 1.25.

Workloads, all measured in the same process over the same inputs (built before timing):

- ``floor``: a bare Python loop doing the dict work any fingerprinting guard must do per
  step (sorted JSON and sha256 of the same arguments and result, counter updates);
- ``guard``: :class:`Guard` alone (``before_model_call``, ``record_decision``,
  ``before_tool_call``, ``record_tool_result``), with the run's default result scrubbing;
- ``bare``: the two SDK spans loopwatch emits per step, same names, attribute counts and
  context attach/detach, written directly against the SDK;
- ``both``: :class:`Run` with spans on (``run.model_call()`` / ``run.tool_call()``);
- ``mixed``: ``guard`` and ``bare`` step by step in one loop. On a small VM, code run in
  alternation is slower than the sum of the same code in two tight loops (caches and
  branch predictors are shared), so ``(both - guard) / bare`` over-states what the spans
  add; ``(both - guard) / (mixed - guard)`` compares loopwatch's spans with bare spans
  measured in the same kind of loop. Both ratios are printed.

Method (see :func:`measure`): many short rounds; each round runs every workload once, in
an order rotated each round, so a burst of load from other processes lands on a whole
round rather than on one workload. Spans go through a ``BatchSpanProcessor`` over an
exporter that drops everything (export cost is not measured), flushed between rounds. The
garbage collector runs between rounds and is disabled during them. Times are CPU time of
this process (``time.process_time``: the processor's worker thread included, time other
processes take excluded), with wall time (``perf_counter``) for reference. Figures are
medians over rounds; ratios are medians of the per-round ratios (paired samples), printed
with their 10th-90th percentile spread.

Modes: ``LOOPWATCH_BENCH=smoke`` runs a short version and asserts only gross regressions
(margins several times the targets: never a flaky timing assert in CI);
``LOOPWATCH_BENCH=full`` runs the long version and prints the figures reported against the
issue's targets. Without ``LOOPWATCH_BENCH`` the test is skipped.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loopwatch.instrumentation import Decision, Guard, Policy, Run, ToolCall
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation._content import scrub_for_digest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

TARGET_GUARD_US = 20.0
TARGET_GUARD_PER_BARE_SPAN = 20.0 / 30.0  # issue 2: 20 us against a ~30 us bare span
TARGET_SPANS_RATIO = 1.25
# Smoke mode fails only on regressions this gross (several times the targets).
SMOKE_MAX_GUARD_PER_BARE_SPAN = 3.0
SMOKE_MAX_SPANS_RATIO = 4.0


class DropExporter(SpanExporter):
    """An exporter that accepts and drops every batch (export cost is not measured)."""

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
    """Arguments of step ``i`` (distinct per step, like a paging or id-walking agent)."""
    return {"query": "late orders", "customer_id": i, "page": 1}


def result_for(i: int) -> dict[str, Any]:
    """Result of step ``i``."""
    return {"items": [{"id": i, "status": "shipped", "eta": "2026-12-01"}], "next_cursor": None}


def inputs(steps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Arguments and results for ``steps`` steps, built outside the timed loops."""
    return [args_for(i) for i in range(steps)], [result_for(i) for i in range(steps)]


def provider() -> TracerProvider:
    """An SDK provider with a BatchSpanProcessor over :class:`DropExporter`."""
    tp = TracerProvider()
    tp.add_span_processor(
        BatchSpanProcessor(DropExporter(), max_queue_size=1 << 16, schedule_delay_millis=200)
    )
    return tp


Workload = Callable[[int, int], None]
"""``workload(start, stop)`` runs steps ``start..stop-1`` of the shared inputs."""


@dataclass
class Bench:
    """The four workloads over one set of inputs; state persists across samples (one
    guard, one run, one root span), so no sample pays a setup cost the others do not."""

    args: list[dict[str, Any]]
    results: list[dict[str, Any]]
    tp: TracerProvider

    def __post_init__(self) -> None:
        self.guard = Guard(POLICY, scrub=scrub_for_digest())
        self.run = Run("bench", POLICY, tracer_provider=self.tp)
        self.run.__enter__()
        self.tracer = self.tp.get_tracer("bench")
        self.root = self.tracer.start_span("invoke_agent bench")
        self.root_ctx = trace.set_span_in_context(self.root)
        self.counters = {"turns": 0, "attempts": 0, "successes": 0, "tokens": 0}
        self.seen: dict[str, int] = {}

    def close(self) -> None:
        """End the run and the root span, then flush the processor."""
        self.run.finish("done")
        self.run.__exit__(None, None, None)
        self.root.end()
        self.tp.force_flush()

    def workloads(self) -> dict[str, Workload]:
        """``floor``, ``guard``, ``bare`` and ``both`` (see the module docstring)."""
        return {
            "floor": self.floor,
            "guard": self.guard_only,
            "bare": self.bare_spans,
            "both": self.guard_and_spans,
            "mixed": self.guard_and_bare_spans,
        }

    def floor(self, start: int, stop: int) -> None:
        """The irreducible dict work of a fingerprinting guard, as a bare loop."""
        dumps = json.dumps
        sha = hashlib.sha256
        counters, seen = self.counters, self.seen
        for i in range(start, stop):
            counters["turns"] += 1
            counters["tokens"] += 940
            call = {"tool": "search_orders", "arguments": self.args[i]}
            fp = sha(dumps(call, sort_keys=True).encode()).hexdigest()
            counters["attempts"] += 1
            obs = sha(dumps(self.results[i], sort_keys=True).encode()).hexdigest()
            counters["successes"] += 1
            seen[obs] = len(fp)

    def guard_only(self, start: int, stop: int) -> None:
        """The guard alone, as :class:`Run` configures it (result scrubbing on)."""
        g = self.guard
        for i in range(start, stop):
            g.before_model_call()
            g.record_decision(DECISION)
            ticket = g.before_tool_call("search_orders", self.args[i])
            g.record_tool_result(ticket, result=self.results[i])

    def guard_and_spans(self, start: int, stop: int) -> None:
        """Guard + loopwatch spans through the explicit :class:`Run` API."""
        run = self.run
        for i in range(start, stop):
            with run.model_call() as call:
                call.record(DECISION)
            with run.tool_call("search_orders", self.args[i]) as tc:
                tc.set_result(self.results[i])

    def guard_and_bare_spans(self, start: int, stop: int) -> None:
        """The guard and the bare spans, step by step: what ``both`` would cost if
        loopwatch's spans cost exactly the bare ones."""
        for i in range(start, stop):
            self.guard_only(i, i + 1)
            self.bare_spans(i, i + 1)

    def bare_spans(self, start: int, stop: int) -> None:
        """The spans loopwatch emits per step, written directly against the SDK."""
        tracer, ctx = self.tracer, self.root_ctx
        fp = "f" * 64
        for i in range(start, stop):
            d = tracer.start_span(
                "decide bench",
                context=ctx,
                kind=SpanKind.INTERNAL,
                attributes={
                    sc.LW_EVENT: "decision",
                    sc.LW_RUN_ID: "r",
                    sc.GEN_AI_AGENT_NAME: "bench",
                    sc.LW_STEP: i,
                },
            )
            token = otel_context.attach(trace.set_span_in_context(d))
            otel_context.detach(token)
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
                    sc.GEN_AI_AGENT_NAME: "bench",
                    sc.LW_STEP: i,
                    sc.LW_ACTION_FINGERPRINT: fp,
                    sc.LW_TOOL_RISK: "read",
                },
            )
            token = otel_context.attach(trace.set_span_in_context(t))
            otel_context.detach(token)
            t.set_attributes(
                {
                    sc.LW_TOOL_OUTCOME: "ok",
                    sc.LW_PROGRESS: True,
                    sc.LW_STEPS_SINCE_PROGRESS: 0,
                    sc.LW_OBSERVATION_DIGEST: fp,
                }
            )
            t.end()


@dataclass(frozen=True)
class Sample:
    """One timed run of one workload: microseconds per step, CPU and wall."""

    cpu_us: float
    wall_us: float


def sample(fn: Workload, start: int, stop: int) -> Sample:
    """Time ``fn`` over steps ``start..stop-1`` (the caller has disabled the collector)."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn(start, stop)
    c1, w1 = time.process_time(), time.perf_counter()
    steps = stop - start
    return Sample((c1 - c0) / steps * 1e6, (w1 - w0) / steps * 1e6)


def measure(steps: int = 200, rounds: int = 40) -> dict[str, Any]:
    """Run every workload once per round, ``rounds`` times, ``steps`` steps each.

    Many short rounds rather than a few long ones: on a shared machine load comes in
    bursts, and a burst then lands on a round (all four workloads, in a rotated order)
    instead of on one workload's only sample. Between rounds, outside the timed region,
    the span processor is flushed and the garbage collector run; during a round it is
    disabled.

    Returns:
        ``{"steps", "rounds", "<workload>_us" (median CPU us per step),
        "<workload>_wall_us", "bare_span_us" (one bare span), "spans_us" (both - guard),
        "guard_per_bare_span", "spans_ratio", "spans_ratio_in_loop", "guard_per_floor"
        (medians of the per-round ratios), "<ratio>_p10" / "<ratio>_p90" (their spread
        over rounds)}``.
    """
    tp = provider()
    warm = min(steps, 100)
    args, results = inputs(warm + steps * rounds)
    bench = Bench(args, results, tp)
    workloads = bench.workloads()
    names = list(workloads)
    for fn in workloads.values():
        fn(0, warm)
    per_round: list[dict[str, Sample]] = []
    enabled = gc.isenabled()
    try:
        for r in range(rounds):
            tp.force_flush()
            gc.collect()
            gc.disable()
            start = warm + r * steps
            order = names[r % len(names) :] + names[: r % len(names)]
            per_round.append({n: sample(workloads[n], start, start + steps) for n in order})
            if enabled:
                gc.enable()
    finally:
        if enabled:
            gc.enable()
        bench.close()
        tp.shutdown()

    def med(name: str, wall: bool = False) -> float:
        return statistics.median(s[name].wall_us if wall else s[name].cpu_us for s in per_round)

    figures: dict[str, Any] = {"steps": steps, "rounds": rounds}
    for name in names:
        figures[f"{name}_us"] = med(name)
        figures[f"{name}_wall_us"] = med(name, wall=True)
    figures["bare_span_us"] = figures["bare_us"] / 2
    figures["spans_us"] = figures["both_us"] - figures["guard_us"]
    ratios: dict[str, Callable[[dict[str, float]], float]] = {
        "guard_per_bare_span": lambda s: s["guard"] / (s["bare"] / 2),
        "spans_ratio": lambda s: (s["both"] - s["guard"]) / s["bare"],
        "spans_ratio_in_loop": lambda s: (s["both"] - s["guard"]) / (s["mixed"] - s["guard"]),
        "guard_per_floor": lambda s: s["guard"] / s["floor"],
    }
    for key, fn in ratios.items():
        values = sorted(fn({k: v.cpu_us for k, v in s.items()}) for s in per_round)
        figures[key] = statistics.median(values)
        figures[f"{key}_p10"] = values[len(values) // 10]
        figures[f"{key}_p90"] = values[min(len(values) - 1, (len(values) * 9) // 10)]
    return figures


def _mark(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def report(f: dict[str, Any]) -> str:
    """Human-readable figures (CPU us per step; wall in brackets) against the targets."""
    g, ratio, spans = f["guard_us"], f["guard_per_bare_span"], f["spans_ratio"]
    in_loop = f["spans_ratio_in_loop"]

    def spread(key: str) -> str:
        return f"(rounds p10-p90 {f[key + '_p10']:.2f}-{f[key + '_p90']:.2f})"

    lines = [
        f"{f['rounds']} rounds of {f['steps']} steps per workload; "
        "medians, CPU us per step, wall in []",
        f"floor (bare dict + json + sha256 loop): {f['floor_us']:7.1f} [{f['floor_wall_us']:.1f}]",
        f"bare OTel SDK spans (2 per step):       {f['bare_us']:7.1f} [{f['bare_wall_us']:.1f}]"
        f"   one bare span {f['bare_span_us']:.1f}",
        f"guard alone:                            {g:7.1f} [{f['guard_wall_us']:.1f}]"
        f"   target <= {TARGET_GUARD_US:.0f} us: {_mark(g <= TARGET_GUARD_US)}",
        f"guard / one bare span:                  {ratio:7.2f} x"
        f"   target <= {TARGET_GUARD_PER_BARE_SPAN:.2f}: "
        f"{_mark(ratio <= TARGET_GUARD_PER_BARE_SPAN)} {spread('guard_per_bare_span')}",
        f"guard / floor:                          {f['guard_per_floor']:7.2f} x"
        f"   {spread('guard_per_floor')}",
        f"guard + loopwatch spans:                {f['both_us']:7.1f} [{f['both_wall_us']:.1f}]",
        f"loopwatch spans (difference):           {f['spans_us']:7.1f}",
        f"loopwatch spans / bare spans:           {spans:7.2f} x"
        f"   target <= {TARGET_SPANS_RATIO:.2f}: {_mark(spans <= TARGET_SPANS_RATIO)}"
        f" {spread('spans_ratio')}",
        f"guard + bare spans, step by step:       {f['mixed_us']:7.1f} [{f['mixed_wall_us']:.1f}]",
        "  same ratio, bare spans measured in the guarded loop (both - guard) / (mixed - guard):",
        f"                                        {in_loop:7.2f} x"
        f"   target <= {TARGET_SPANS_RATIO:.2f}: {_mark(in_loop <= TARGET_SPANS_RATIO)}"
        f" {spread('spans_ratio_in_loop')}",
    ]
    return "\n".join(lines)


def test_bench_guard() -> None:
    """Smoke: short, gross-regression asserts only. Full: the figures for issue 2."""
    import pytest

    mode = os.environ.get("LOOPWATCH_BENCH")
    if not mode:
        pytest.skip("benchmarks run with LOOPWATCH_BENCH=smoke|full")
    full = mode == "full"
    figures = measure(steps=200, rounds=60) if full else measure(steps=100, rounds=6)
    print("\n" + report(figures))
    assert figures["guard_us"] > 0 and figures["bare_us"] > 0 and figures["floor_us"] > 0
    assert figures["guard_per_bare_span"] < SMOKE_MAX_GUARD_PER_BARE_SPAN, report(figures)
    assert figures["spans_ratio"] < SMOKE_MAX_SPANS_RATIO, report(figures)


def main() -> None:
    """Command line: print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per sample")
    parser.add_argument("--rounds", type=int, default=60)
    ns = parser.parse_args()
    print(report(measure(ns.steps, ns.rounds)))


if __name__ == "__main__":
    main()
