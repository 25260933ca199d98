"""A load client for the crash tests: real guarded runs exported by the OpenTelemetry SDK.

Run as a script::

    python sdk_sender.py OTLP_URL LOG_FILE --seconds S --runs-per-second R --agent NAME

Each run is a real :class:`loopwatch.instrumentation.Run` that the guard stops with
``repeated_action`` (two ``ok`` calls of ``lookup_order``, the third ``blocked``): a run
span, three decision spans, three tool spans and one stop span. Spans go through the
SDK's ``BatchSpanProcessor`` to ``OTLPSpanExporter`` (its own retries on connection errors
and 429/502/503/504, honouring ``Retry-After``, within a 60 s export timeout).

``LOG_FILE`` gets one line per event, flushed as written:

- ``P trace_id span_id kind outcome run_id``: a span ended (produced), ``kind`` one of
  ``run``, ``decision``, ``tool_result``, ``stop``; ``outcome`` ``-`` except for tools;
- ``A trace_id span_id``: the collector acknowledged the export holding that span (200);
- ``F count``: an export failed after the exporter's retries (those spans are lost);
- ``DONE produced acknowledged failed`` at the end.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from typing import IO

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class _Log:
    def __init__(self, handle: IO[str]) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self.counts = {"P": 0, "A": 0, "F": 0}

    def write(self, kind: str, lines: Sequence[str], count: int) -> None:
        with self._lock:
            self._handle.write("".join(lines))
            self._handle.flush()
            self.counts[kind] += count


def _ids(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x} {ctx.span_id:016x}"


class _Recording(SpanExporter):
    """Wraps the OTLP exporter; logs which spans the collector acknowledged."""

    def __init__(self, inner: SpanExporter, log: _Log) -> None:
        self._inner = inner
        self._log = log

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self._inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self._log.write("A", [f"A {_ids(s)}\n" for s in spans], len(spans))
        else:
            self._log.write("F", [f"F {len(spans)}\n"], len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()


class _Produced(SpanProcessor):
    """Logs every span that ends (the ground truth of what should reach the store)."""

    def __init__(self, log: _Log) -> None:
        self._log = log

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        event = attrs.get("loopwatch.event")
        kind = str(event) if event else "run"
        outcome = str(attrs.get("loopwatch.tool.outcome", "-"))
        run_id = str(attrs.get("loopwatch.run.id", "-"))
        self._log.write("P", [f"P {_ids(span)} {kind} {outcome} {run_id}\n"], 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("log")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs-per-second", type=float, default=50.0)
    parser.add_argument("--agent", default="crash")
    parser.add_argument("--prefix", default="crash")
    args = parser.parse_args()

    from loopwatch.instrumentation import Policy, Run
    from loopwatch.instrumentation.testing import ConstantTool, drive, tool_loop

    with open(args.log, "w", encoding="utf-8") as handle:
        log = _Log(handle)
        provider = TracerProvider(resource=Resource.create({"service.name": "crash-sender"}))
        provider.add_span_processor(_Produced(log))
        exporter = OTLPSpanExporter(endpoint=args.url, timeout=60)
        provider.add_span_processor(
            BatchSpanProcessor(
                _Recording(exporter, log),
                max_queue_size=1_000_000,
                schedule_delay_millis=50,
                max_export_batch_size=512,
                export_timeout_millis=120_000,
            )
        )
        policy = Policy.build(repeat_limit=3)
        interval = 1.0 / args.runs_per_second
        start = time.monotonic()
        index = 0
        while time.monotonic() - start < args.seconds:
            due = start + index * interval
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            model = tool_loop("lookup_order", {"order_id": f"A-{index}"}, times=6, final="x")
            tools = {"lookup_order": ConstantTool(name="lookup_order")}
            run_id = f"{args.prefix}-{index}"
            with Run(
                args.agent, policy, tools=tools, run_id=run_id, tracer_provider=provider
            ) as run:
                drive(run, model)
            index += 1
        provider.shutdown()
        counts = log.counts
        handle.write(f"DONE {counts['P']} {counts['A']} {counts['F']}\n")


if __name__ == "__main__":
    main()
