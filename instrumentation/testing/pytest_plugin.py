"""pytest plugin: loopwatch testing fixtures (registered through the ``pytest11`` entry point).

Fixtures:
    fake_clock: a fresh :class:`FakeClock`.
    span_exporter: an SDK ``InMemorySpanExporter`` (skips the test when the SDK is absent).
    tracer_provider: an SDK ``TracerProvider`` exporting synchronously to ``span_exporter``
        (pass it as ``tracer_provider=`` to ``Run``/``@agent``; never installed globally).
    assert_invariants: ``() -> dict[run_id, RunTrace]`` checking every finished span.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from . import FakeClock, RunTrace, assert_trace_invariants


@pytest.fixture
def fake_clock() -> FakeClock:
    """A fake monotonic clock starting at 1000.0 s."""
    return FakeClock()


@pytest.fixture
def span_exporter() -> Any:
    """An in-memory span exporter (OpenTelemetry SDK)."""
    exporters = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    return exporters.InMemorySpanExporter()


@pytest.fixture
def tracer_provider(span_exporter: Any) -> Iterator[Any]:
    """A tracer provider with a synchronous processor into ``span_exporter``."""
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(span_exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def assert_invariants(span_exporter: Any) -> Callable[[], dict[str, RunTrace]]:
    """Check the trace invariants over everything exported so far."""

    def check() -> dict[str, RunTrace]:
        return assert_trace_invariants(span_exporter.get_finished_spans())

    return check
