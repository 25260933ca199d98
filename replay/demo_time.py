"""Span times of ``loopwatch demo``: its runs spread over a past window, by span times.

The demo replays hundreds of recorded runs in seconds. Sent with the times they were
replayed at, they all land in one minute and the dashboard's "stops over time" chart is
one bar. Instead each run gets a start time in the window (the last 24 hours by
default, evenly spaced in replay order, every run ending before now), and inside the
run the spans follow the recorded timeline: the guard's fake clock and the span times
advance together, so a model turn that took 40 recorded seconds is a 40 s decision span,
and a run stopped ``deadline_exceeded`` by the recorded clock also shows the elapsed time
in its spans (an exported run replays to the same deadline stop). Nothing sleeps.

How: spans are stamped with the real clock by the instrumentation (``time.time_ns``);
:class:`SpanTimeline` keeps the offset from real to demo time as it changes (a new run, a
recorded gap), and :func:`shifting_exporter` moves every span's start, end and event
times by the offset in force at that real time before the OTLP exporter sends it.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["DEFAULT_WINDOW_SECONDS", "SpanTimeline", "run_starts", "shifting_exporter"]

DEFAULT_WINDOW_SECONDS: Final = 86_400.0
"""The window the demo's runs are spread over: the last 24 hours (issue 28: the demo
looks like a day of production)."""

_NS: Final = 1_000_000_000
_END_MARGIN_SECONDS: Final = 60.0  # every run ends at least a minute before "now"
_USED_FRACTION: Final = 0.95
"""The share of the window the runs use: the oldest 5 % is left empty, so the first
runs are still inside a "last 24 hours" view opened an hour after the demo."""


def run_starts(
    durations: Sequence[float], *, now: float, window_seconds: float = DEFAULT_WINDOW_SECONDS
) -> list[float]:
    """The demo start time (Unix seconds) of each run, in replay order.

    Run ``i`` of ``n`` starts at ``now - used + (i + 0.5) * used / n`` where ``used`` is
    95 % of the window (the oldest 5 % stays empty, so a dashboard's "last 24 hours"
    opened an hour later still holds the first runs), moved earlier when its recorded
    duration would end it less than a minute before ``now`` (a span in the future would
    sit outside every dashboard window).

    Args:
        durations: each run's recorded duration in seconds (>= 0).
        now: the current Unix time.
        window_seconds: the window's width (> 0).

    Raises:
        ValueError: ``window_seconds`` is not > 0.
    """
    if not window_seconds > 0:
        raise ValueError(f"the demo window must be > 0 seconds, got {window_seconds}")
    n = len(durations)
    used = window_seconds * _USED_FRACTION
    starts = []
    for i, duration in enumerate(durations):
        start = now - used + (i + 0.5) * used / n
        starts.append(min(start, now - max(duration, 0.0) - _END_MARGIN_SECONDS))
    return starts


class SpanTimeline:
    """The offset from real span time to demo span time, as it changed (thread-safe).

    The replaying thread calls :meth:`start_run` and :meth:`advance`; the exporter
    thread calls :meth:`shift` with spans' real times, so every piece is kept (two
    integers per run and per recorded gap: a few megabytes for a large corpus).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: list[int] = []
        self._offsets: list[int] = []

    def _set(self, offset_ns: int) -> None:
        with self._lock:
            now = time.time_ns()
            if self._since and self._since[-1] >= now:
                now = self._since[-1] + 1  # keep the pieces ordered on a coarse clock
            self._since.append(now)
            self._offsets.append(offset_ns)

    def start_run(self, start_unix_seconds: float) -> None:
        """From now on, real time ``now`` is demo time ``start_unix_seconds``."""
        self._set(int(start_unix_seconds * _NS) - time.time_ns())

    def advance(self, seconds: float) -> None:
        """The recorded timeline moved ``seconds`` (> 0) ahead: so does demo time."""
        with self._lock:
            current = self._offsets[-1] if self._offsets else 0
        self._set(current + int(seconds * _NS))

    def shift(self, real_ns: int | None) -> int | None:
        """Demo time of real time ``real_ns`` (unchanged before the first piece)."""
        if real_ns is None:
            return None
        with self._lock:
            index = bisect.bisect_right(self._since, real_ns) - 1
            offset = self._offsets[index] if index >= 0 else 0
        return real_ns + offset


def _shifted(span: ReadableSpan, timeline: SpanTimeline) -> ReadableSpan:
    from opentelemetry.sdk.trace import Event, ReadableSpan

    events = [
        Event(e.name, e.attributes, timestamp=timeline.shift(e.timestamp)) for e in span.events
    ]
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=span.attributes,
        events=events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=timeline.shift(span.start_time),
        end_time=timeline.shift(span.end_time),
        instrumentation_scope=span.instrumentation_scope,
    )


def shifting_exporter(inner: SpanExporter, timeline: SpanTimeline) -> SpanExporter:
    """An exporter that sends ``inner`` each span with its times moved to demo time."""
    from opentelemetry.sdk.trace.export import SpanExporter

    class ShiftingExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return inner.export([_shifted(span, timeline) for span in spans])

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return inner.force_flush(timeout_millis)

    return ShiftingExporter()
