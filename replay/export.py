"""Where ``loopwatch demo`` sends its spans: the OTLP/HTTP endpoint, a reachability
check, and a tracer provider whose exporter counts the spans it delivered and lost.

Needs the ``otlp`` extra (the OpenTelemetry SDK and OTLP/HTTP exporter) for
:func:`counting_provider` only; the rest is stdlib.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from .demo_time import SpanTimeline

__all__ = [
    "DEFAULT_OTLP_URL",
    "CollectorUnreachable",
    "SpanCounts",
    "check_collector",
    "counting_provider",
    "otlp_endpoint",
]

DEFAULT_OTLP_URL: Final = "http://127.0.0.1:4318/v1/traces"
"""The collector's default OTLP/HTTP traces URL."""

_SERVICE_NAME: Final = "loopwatch-demo"
_OTLP_HINT: Final = "loopwatch demo needs the OTLP exporter: pip install 'loopwatch[otlp]'"


class CollectorUnreachable(ConnectionError):
    """The OTLP endpoint did not answer (connection refused, DNS, timeout).

    The message is one line naming the URL and the cause.
    """


class SpanCounts:
    """Spans ended by the runs, and exported or lost by the exporter (under ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended = 0
        self.exported = 0
        self.failed = 0


def _counting_exporter(inner: SpanExporter, counts: SpanCounts) -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            result = inner.export(spans)
            with counts.lock:
                if result == SpanExportResult.SUCCESS:
                    counts.exported += len(spans)
                else:
                    counts.failed += len(spans)
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return inner.force_flush(timeout_millis)

    return CountingExporter()


def counting_provider(
    otlp_url: str,
    counts: SpanCounts,
    token: str | None,
    timeout_seconds: float,
    timeline: SpanTimeline | None = None,
) -> tuple[TracerProvider, SpanExporter]:
    """The demo's tracer provider and its OTLP/HTTP exporter.

    Args:
        otlp_url: the traces URL.
        counts: updated as spans end and as batches are exported or lost.
        token: bearer token of a collector started with ``--token-file``.
        timeout_seconds: timeout of one export request.
        timeline: when given, span times are moved to the demo's timeline before export
            (:mod:`loopwatch.replay.demo_time`).

    Shut the exporter down before the provider to abandon queued spans: its retries stop
    and later exports fail at once.

    Raises:
        ImportError: the ``otlp`` extra is missing (the message says how to install it).
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(_OTLP_HINT) from exc

    class EndCounter(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            with counts.lock:
                counts.ended += 1

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # run_demo shuts the provider down itself; an atexit flush towards a collector that
    # is already gone would only delay the exit of ``loopwatch up``.
    provider = TracerProvider(
        resource=Resource.create({"service.name": _SERVICE_NAME}), shutdown_on_exit=False
    )
    provider.add_span_processor(EndCounter())
    exporter = OTLPSpanExporter(endpoint=otlp_url, headers=headers, timeout=timeout_seconds)
    sending: SpanExporter = exporter
    if timeline is not None:
        from .demo_time import shifting_exporter

        sending = shifting_exporter(exporter, timeline)
    provider.add_span_processor(
        BatchSpanProcessor(
            _counting_exporter(sending, counts),
            max_queue_size=1 << 16,
            schedule_delay_millis=200,
            max_export_batch_size=512,
        )
    )
    return provider, exporter


def otlp_endpoint(url: str | None) -> str:
    """The traces URL: ``url``, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else the local default
    ``http://127.0.0.1:4318/v1/traces`` (the OpenTelemetry exporter variables, read as
    :func:`loopwatch.instrumentation.otlp.configure_otlp` reads them). A ``url`` with no
    path (``http://127.0.0.1:4318``) is a base endpoint and gets ``/v1/traces``, as
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` does (OTLP exporter specification)."""
    if url:
        if urllib.parse.urlsplit(url).path in ("", "/"):
            return url.rstrip("/") + "/v1/traces"
        return url
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return traces or (base.rstrip("/") + "/v1/traces" if base else DEFAULT_OTLP_URL)


def check_collector(
    otlp_url: str, *, token: str | None = None, timeout_seconds: float = 5.0
) -> None:
    """Send an empty OTLP/HTTP export request; any HTTP answer but 401/403 means reachable.

    Raises:
        CollectorUnreachable: no connection, or the collector refused the token (one-line
            message naming the URL).
    """
    request = urllib.request.Request(
        otlp_url,
        data=b"",
        method="POST",
        headers={
            "Content-Type": "application/x-protobuf",
            **({"Authorization": f"Bearer {token}"} if token else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise CollectorUnreachable(
                f"the collector at {otlp_url} refused the request ({exc.code}): pass --token-file"
            ) from None
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        text = getattr(reason, "strerror", None) or str(reason)
        raise CollectorUnreachable(
            f"cannot reach the collector at {otlp_url}: {text}"
            " (start one with `loopwatch collector` or `loopwatch up`)"
        ) from None
