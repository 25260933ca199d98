"""Benchmark of the collector's redact stage: spans/s for realistic 512-span batches.

Run as a script (``python tests/bench/bench_redaction.py [--seconds S]``) to print the
figures, or through pytest with ``LOOPWATCH_BENCH`` set (a short smoke run; skipped
otherwise).

Each batch is shaped like loopwatch traffic: runs of decision, tool and stop spans under
one shared resource, ids and fingerprints unique per span. Scenarios: content capture
off (structural attributes only) or on (tool arguments/results as JSON, plus a chat span
with prompt and completion text every fourth step), each without and with 10 canaries
registered; "planted" also hides canaries in a few spans in several encodings. Every
timed batch is freshly built (the stage redacts in place); building is not timed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import time
import urllib.parse
import uuid
from collections.abc import Callable

import pytest
from loopwatch.collector.records import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_INTERNAL,
    Attributes,
    ResourceRecord,
    ScopeRecord,
    SpanBatch,
    SpanEventRecord,
    SpanRecord,
)
from loopwatch.collector.redact import RedactStage

BATCH_SPANS = 512
CANARIES = tuple(f"lw-canary-{i:02d}-{uuid.UUID(int=i * 7919).hex[:16]}" for i in range(10))
_WORDS = (
    *("order", "customer", "status", "shipped", "pending", "refund", "invoice", "search"),
    *("result", "page", "cursor", "the", "a", "of", "to", "and", "with", "from", "for"),
    *("quickly", "item", "total", "amount", "currency", "region", "warehouse", "delivery"),
    *("address", "note", "summary", "tool", "call", "returned", "error", "retry", "limit"),
)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _hex(rng: random.Random, chars: int) -> str:
    return f"{rng.getrandbits(chars * 4):0{chars}x}"


def _plant(rng: random.Random, canary: str) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return f"token leaked: {canary}"
    if kind == 1:
        return json.dumps({"env": {"KEY": canary}})
    if kind == 2:
        return "https://x.test/?q=" + urllib.parse.quote(canary, safe="")
    return base64.b64encode(b"hdr:" + canary.encode()).decode()


def build_batch(seed: int, *, content: bool, planted: bool = False) -> SpanBatch:
    """Build one 512-span batch; ``seed`` makes ids and text unique per batch."""
    rng = random.Random(seed)
    resource = ResourceRecord(
        attributes={
            "service.name": "orders-agent",
            "service.version": "1.4.2",
            "deployment.environment.name": "prod",
            "host.name": "agent-7c9f",
            "process.pid": 4242,
            "telemetry.sdk.name": "opentelemetry",
            "telemetry.sdk.language": "python",
            "telemetry.sdk.version": "1.38.0",
        }
    )
    scope = ScopeRecord(name="loopwatch.instrumentation", version="0.1.0")
    chat_scope = ScopeRecord(name="openinference.instrumentation.openai", version="0.1.30")
    spans: list[SpanRecord] = []
    t0 = 1_760_000_000_000_000_000

    def span(name: str, attributes: Attributes, trace_id: str, parent: str) -> SpanRecord:
        record = SpanRecord(
            trace_id=trace_id,
            span_id=_hex(rng, 16),
            parent_span_id=parent,
            name=name,
            kind=SPAN_KIND_INTERNAL,
            start_unix_nano=t0 + len(spans) * 1000,
            end_unix_nano=t0 + len(spans) * 1000 + 900,
            attributes=attributes,
            resource=resource,
            scope=scope,
        )
        spans.append(record)
        return record

    while len(spans) < BATCH_SPANS:
        trace_id, run_id = _hex(rng, 32), str(uuid.UUID(int=rng.getrandbits(128)))
        run = span(
            "invoke_agent orders",
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "orders",
                "loopwatch.run.id": run_id,
                "loopwatch.policy.name": "investigate-readonly",
                "loopwatch.policy.version": "2026-11-30",
                "loopwatch.detector.version": "1",
            },
            trace_id,
            "",
        )
        for step in range(1, 21):
            if len(spans) >= BATCH_SPANS - 1:
                break
            span(
                "decide orders",
                {
                    "loopwatch.event": "decision",
                    "loopwatch.run.id": run_id,
                    "loopwatch.step": step,
                    "loopwatch.decision.type": "tool",
                    "gen_ai.usage.input_tokens": rng.randrange(500, 4000),
                    "gen_ai.usage.output_tokens": rng.randrange(20, 400),
                    "loopwatch.cost.usd": rng.random() / 100,
                },
                trace_id,
                run.span_id,
            )
            tool = rng.choice(("search_orders", "get_order", "list_refunds"))
            attributes: Attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": "call_" + base64.b32encode(rng.randbytes(15)).decode(),
                "loopwatch.event": "tool_result",
                "loopwatch.run.id": run_id,
                "loopwatch.step": step,
                "loopwatch.action.fingerprint": _hex(rng, 64),
                "loopwatch.observation.digest": _hex(rng, 64),
                "loopwatch.tool.outcome": "ok",
                "loopwatch.tool.risk": "read",
                "loopwatch.progress": rng.random() < 0.7,
                "loopwatch.steps_since_progress": rng.randrange(0, 4),
            }
            if content:
                attributes["gen_ai.tool.call.arguments"] = json.dumps(
                    {"query": _text(rng, 6), "cursor": _hex(rng, 12), "page": step}
                )
                attributes["gen_ai.tool.call.result"] = json.dumps(
                    {
                        "items": [
                            {
                                "id": _hex(rng, 8),
                                "status": rng.choice(_WORDS),
                                "note": _text(rng, 8),
                            }
                            for _ in range(5)
                        ],
                        "next_cursor": _hex(rng, 12),
                    }
                )
            tool_span = span(f"execute_tool {tool}", attributes, trace_id, run.span_id)
            if rng.random() < 0.05:
                tool_span.events.append(
                    SpanEventRecord(
                        "exception",
                        t0,
                        {
                            "exception.type": "TimeoutError",
                            "exception.message": "upstream timed out after 30 s",
                            "exception.stacktrace": "Traceback (most recent call last):\n"
                            + '  File "agent.py", line 42, in call\n' * 6,
                        },
                    )
                )
            if content and step % 4 == 0 and len(spans) < BATCH_SPANS - 1:
                chat = span(
                    "chat gpt-4o",
                    {
                        "openinference.span.kind": "LLM",
                        "llm.model_name": "gpt-4o",
                        "input.value": _text(rng, 160),
                        "output.value": _text(rng, 60),
                    },
                    trace_id,
                    run.span_id,
                )
                chat.kind, chat.scope = SPAN_KIND_CLIENT, chat_scope
        span(
            "stop orders",
            {
                "loopwatch.event": "stop",
                "loopwatch.run.id": run_id,
                "loopwatch.stop.reason": "completed",
                "loopwatch.stop.evidence": json.dumps({"dimension": None, "steps": 20}),
                "loopwatch.usage.model_turns": 20,
            },
            trace_id,
            run.span_id,
        )
    if planted:
        for index in rng.sample(range(len(spans)), 4):
            spans[index].attributes["note"] = _plant(rng, rng.choice(CANARIES))
    return SpanBatch(spans=spans[:BATCH_SPANS])


def measure(
    stage: RedactStage, make: Callable[[int], SpanBatch], *, seconds: float, batches: int = 12
) -> float:
    """Return spans/s of ``stage.process`` over fresh batches for about ``seconds``."""
    pool = [make(seed) for seed in range(batches)]
    stage.process(make(10_000))
    spent, spans, seed = 0.0, 0, 0
    while spent < seconds:
        if not pool:
            pool = [make(batches + seed + i) for i in range(batches)]
            seed += batches
        batch = pool.pop()
        start = time.perf_counter()
        stage.process(batch)
        spent += time.perf_counter() - start
        spans += len(batch.spans)
    return spans / spent


def run(seconds: float) -> dict[str, float]:
    """Measure every scenario; return spans/s by scenario name."""
    results: dict[str, float] = {}
    for content in (False, True):
        for canaries, planted in (((), False), (CANARIES, False), (CANARIES, True)):
            name = (
                f"content={'on' if content else 'off'} canaries={len(canaries)}"
                f"{' planted' if planted else ''}"
            )
            stage = RedactStage(canaries=canaries)

            def make(seed: int, content: bool = content, planted: bool = planted) -> SpanBatch:
                return build_batch(seed, content=content, planted=planted)

            results[name] = measure(stage, make, seconds=seconds)
    return results


def main(argv: list[str] | None = None) -> None:
    """Print spans/s per scenario for 512-span batches."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per scenario")
    args = parser.parse_args(argv)
    print(f"redact stage, {BATCH_SPANS}-span batches, {args.seconds:g} s per scenario")
    for name, rate in run(args.seconds).items():
        print(f"  {name:<34} {rate:>10,.0f} spans/s  ({BATCH_SPANS / rate * 1e3:6.2f} ms/batch)")


@pytest.mark.skipif(not os.environ.get("LOOPWATCH_BENCH"), reason="set LOOPWATCH_BENCH=1 to run")
def test_bench_redaction_smoke() -> None:
    results = run(seconds=0.2)
    for name, rate in results.items():
        print(f"{name}: {rate:,.0f} spans/s")
        assert rate > 1_000, name


if __name__ == "__main__":
    main()
