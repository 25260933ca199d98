"""Wire the OpenTelemetry SDK and the OTLP/HTTP exporter (extra ``otlp``).

Library code never configures a tracer provider; *applications* call this once at
start-up (or configure the SDK themselves)::

    from loopwatch.instrumentation.otlp import configure_otlp
    provider = configure_otlp(service_name="support-bot")  # 127.0.0.1:4318 by default
    ...
    provider.shutdown()   # flushes pending spans
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["DEFAULT_ENDPOINT", "configure_otlp"]

DEFAULT_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
_HINT = "the OTLP helper needs the SDK and exporter: pip install 'loopwatch[otlp]'"


def configure_otlp(
    *,
    endpoint: str | None = None,
    service_name: str = "loopwatch-agent",
    headers: dict[str, str] | None = None,
    token: str | None = None,
    timeout_seconds: float = 10.0,
    schedule_delay_millis: int = 500,
    max_export_batch_size: int = 512,
    set_global: bool = True,
    resource_attributes: dict[str, Any] | None = None,
) -> TracerProvider:
    """Create an SDK ``TracerProvider`` exporting over OTLP/HTTP (protobuf).

    Args:
        endpoint: full traces URL of the collector. When None:
            ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` +
            ``/v1/traces`` (the OpenTelemetry exporter variables), else
            ``http://127.0.0.1:4318/v1/traces``.
        service_name: ``service.name`` resource attribute.
        headers: extra HTTP headers.
        token: bearer token for a collector started with ``--token-file``.
        timeout_seconds: export timeout.
        schedule_delay_millis / max_export_batch_size: ``BatchSpanProcessor`` settings.
        set_global: also install it as the global tracer provider.
        resource_attributes: extra resource attributes.

    Returns:
        The provider; call ``shutdown()`` at exit to flush.

    Raises:
        ImportError: the ``otlp`` extra is not installed (the message says what to install).
    """
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # pragma: no cover - exercised in the base-install test
        raise ImportError(_HINT) from exc
    if endpoint is None:
        traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        endpoint = traces or (base.rstrip("/") + "/v1/traces" if base else DEFAULT_ENDPOINT)
    all_headers = dict(headers or {})
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    resource = Resource.create({"service.name": service_name, **(resource_attributes or {})})
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=endpoint, headers=all_headers, timeout=timeout_seconds)
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            schedule_delay_millis=schedule_delay_millis,
            max_export_batch_size=max_export_batch_size,
        )
    )
    if set_global:
        trace.set_tracer_provider(provider)
    return provider
