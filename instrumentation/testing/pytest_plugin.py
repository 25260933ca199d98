"""pytest plugin: loopwatch testing fixtures (registered through the ``pytest11`` entry point).

Fixtures:
    fake_clock: a fresh :class:`FakeClock`.
    span_exporter: an SDK ``InMemorySpanExporter`` (skips the test when the SDK is absent).
    tracer_provider: an SDK ``TracerProvider`` exporting synchronously to ``span_exporter``
        (pass it as ``tracer_provider=`` to ``Run``/``@agent``; never installed globally).
    assert_invariants: ``() -> dict[run_id, RunTrace]`` checking every finished span.
    ignoring_model / obeying_model / relapsing_model: factories
        ``(tool, arguments=None, **kw) -> NudgedModel`` of scripted models that meet a
        nudge and ignore it, obey it, or obey once and relapse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from . import FakeClock, NudgedModel, RunTrace, assert_trace_invariants
from . import ignoring_model as _ignoring
from . import obeying_model as _obeying
from . import relapsing_model as _relapsing

NudgedModelFactory = Callable[..., NudgedModel]


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


@pytest.fixture
def ignoring_model() -> NudgedModelFactory:
    """A factory of scripted models that ignore every nudge."""
    return _ignoring


@pytest.fixture
def obeying_model() -> NudgedModelFactory:
    """A factory of scripted models that obey a nudge: change the call, then answer."""
    return _obeying


@pytest.fixture
def relapsing_model() -> NudgedModelFactory:
    """A factory of scripted models that obey the first nudge once, then relapse."""
    return _relapsing
