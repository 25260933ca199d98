"""Live framework tests: each module imports its framework with pytest.importorskip, so
the main environment skips them and scripts/frameworks.sh runs them in .venv-fw and
.venv-crewai, where the pinned releases are installed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider whose finished spans are kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """Fails the test when it leaves a non-daemon thread or a pending asyncio task behind
    (a stop must end the framework's run, never strand a worker)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    for _ in range(50):
        left = [
            t
            for t in threading.enumerate()
            if t.ident not in before and t.is_alive() and not t.daemon
        ]
        if not left:
            break
        threading.Event().wait(0.1)
    assert not left, f"threads left running: {[t.name for t in left]}"
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    assert not pending, f"tasks left pending: {pending}"
