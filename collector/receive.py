"""What both OTLP receivers (HTTP and gRPC) share: the ``submit`` and ``decode``
contracts, rejection reasons and counters, the in-flight byte bound, the bearer-token
check, and submitting a decoded batch with its spans counted.

Nothing in this module logs or echoes span content or the bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from .errors import ConfigError, QueueFull, Unauthorized
from .records import SpanBatch

__all__ = [
    "REASON_DECODE_ERROR",
    "REASON_INVALID_SPAN",
    "REASON_PAYLOAD_TOO_LARGE",
    "REASON_PIPELINE",
    "REASON_QUEUE_FULL",
    "REASON_SUBMIT_FAILED",
    "REASON_UNAUTHORIZED",
    "REASON_UNSUPPORTED_MEDIA_TYPE",
    "REJECT_REASONS",
    "REQUEST_REJECT_REASONS",
    "Decode",
    "InMemoryReceiverCounters",
    "InflightLimit",
    "ReceiverCounters",
    "Reservation",
    "Submit",
    "check_bearer",
    "export_response",
    "require_positive_int",
    "submit_counted",
    "token_matches",
]

_logger = logging.getLogger("loopwatch.collector.receive")


def require_positive_int(name: str, value: int) -> None:
    """Raises ConfigError: ``value`` is not an integer > 0 (setting ``name``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(name, "must be an integer > 0")


REASON_INVALID_SPAN = "invalid_span"
REASON_PIPELINE = "pipeline"
REASON_QUEUE_FULL = "queue_full"
REASON_SUBMIT_FAILED = "submit_failed"
REASON_DECODE_ERROR = "decode_error"
REASON_PAYLOAD_TOO_LARGE = "payload_too_large"
REASON_UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
REASON_UNAUTHORIZED = "unauthorized"
REJECT_REASONS = (
    REASON_INVALID_SPAN,
    REASON_PIPELINE,
    REASON_QUEUE_FULL,
    REASON_SUBMIT_FAILED,
)
"""Every ``reason`` of refused spans (``loopwatch_collector_spans_rejected_total``; a
bounded metric label set). Whole requests refused before their spans are known count in
:data:`REQUEST_REJECT_REASONS` only, so no series is exported that nothing increments."""
REQUEST_REJECT_REASONS = (
    REASON_QUEUE_FULL,
    REASON_DECODE_ERROR,
    REASON_PAYLOAD_TOO_LARGE,
    REASON_UNSUPPORTED_MEDIA_TYPE,
    REASON_UNAUTHORIZED,
)
"""The reasons a whole request is refused for before its spans are known
(:meth:`ReceiverCounters.request_refused`; ``queue_full``: the in-flight bytes limit)."""

_MAX_PARTIAL_MESSAGE_CHARS = 1024


Submit = Callable[[SpanBatch], Awaitable[None]]
"""Runs the rest of the pipeline on one decoded batch (redact, map, store).

Contract: called on the event loop; returns an awaitable that resolves only once the
batch's events are committed (ack after commit). Raises :class:`QueueFull` (directly or
from the awaitable) when the batch cannot be queued; nothing of the batch may be stored
in that case. Spans that later stages refuse are recorded on the same batch with
``batch.reject(n, message)`` before the awaitable resolves; the response reports them.
"""


Decode = Callable[[bytes, str, bool], Awaitable[SpanBatch]]
"""Decodes a body off the event loop: ``decode(body, content_encoding, as_json) -> batch``.

Contract: the same result as :func:`~loopwatch.collector.decode.decode_body` (the same
:class:`DecodeError` / :class:`PayloadTooLarge` for bad input, answered 400 / 413). A
``retryable`` :class:`CollectorError` or any other exception means the body could not be
decoded for a reason of the collector's own (e.g. a decode worker process died); the
request is answered 503 with ``Retry-After``.
"""


class ReceiverCounters(Protocol):
    """Where the receiver counts what it sees (Prometheus stays out of this module).

    Called on the event-loop thread; must not block or raise. ``transport`` is a
    :class:`SpanBatch` transport label; ``reason`` is one of :data:`REJECT_REASONS`.
    """

    def spans_received(self, transport: str, count: int) -> None:
        """``count`` spans arrived in a decodable request (accepted or not)."""

    def spans_rejected(self, reason: str, count: int) -> None:
        """``count`` spans of a decodable request were refused for ``reason``."""

    def request_refused(self, reason: str) -> None:
        """A whole request was refused before its spans could be counted."""


@dataclass
class InMemoryReceiverCounters:
    """A :class:`ReceiverCounters` that keeps totals in dicts; thread-safe reads.

    Attributes:
        received: spans received, by transport.
        rejected: spans rejected, by reason.
        refused: requests refused whole, by reason.
    """

    received: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def spans_received(self, transport: str, count: int) -> None:
        """Add ``count`` to ``received[transport]``."""
        with self._lock:
            self.received[transport] = self.received.get(transport, 0) + count

    def spans_rejected(self, reason: str, count: int) -> None:
        """Add ``count`` to ``rejected[reason]``."""
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + count

    def request_refused(self, reason: str) -> None:
        """Add one to ``refused[reason]``."""
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1


class InflightLimit:
    """A bound on the request bytes the receivers hold between arrival and answer.

    The store's queue bounds what waits for the writer, but requests pile up before it
    (in the decode workers' queue and the pipeline) when decoding is the bottleneck.
    Every receiver (OTLP/HTTP, OTLP/gRPC) holds its
    request's body size here for the request's whole life; past the bound a request is
    refused at once as throttling (429/503 with ``Retry-After``, gRPC ``UNAVAILABLE``
    with ``RetryInfo``), before it is decoded. One request is always admitted when none
    is held, whatever its size. Used on the event loop only.

    Args:
        max_bytes: bytes of bodies (as received, compressed or not) held at most.
        retry_after_seconds: the delay suggested to refused clients.

    Attributes:
        held: bytes held now (the ``loopwatch_collector_inflight_bytes`` gauge).
    """

    def __init__(self, max_bytes: int, *, retry_after_seconds: int = 1) -> None:
        require_positive_int("max_inflight_bytes", max_bytes)
        self.max_bytes = max_bytes
        self.retry_after_seconds = retry_after_seconds
        self.held = 0

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        """Hold ``size`` bytes for the ``with`` block.

        Raises:
            QueueFull: other requests already hold too much to admit this one.
        """
        with self.reserve() as reservation:
            reservation.add(size)
            yield

    @contextlib.contextmanager
    def reserve(self) -> Iterator[Reservation]:
        """A hold that grows as a body arrives (:meth:`Reservation.add` per chunk),
        released when the ``with`` block ends. A body is held from its first chunk, not
        once it is whole, so many slow uploads cannot pile up in memory unrefused."""
        reservation = Reservation(self)
        try:
            yield reservation
        finally:
            self.held -= reservation.size


class Reservation:
    """The bytes one request holds in an :class:`InflightLimit` (``size``, bytes)."""

    __slots__ = ("_limit", "size")

    def __init__(self, limit: InflightLimit) -> None:
        self._limit = limit
        self.size = 0

    def add(self, size: int) -> None:
        """Hold ``size`` more bytes.

        Raises:
            QueueFull: other requests hold so much that these bytes would pass the bound
                (a request alone is always admitted, whatever its size).
        """
        limit = self._limit
        if limit.held > self.size and limit.held + size > limit.max_bytes:
            raise QueueFull(capacity=limit.max_bytes, retry_after_seconds=limit.retry_after_seconds)
        limit.held += size
        self.size += size


def token_matches(presented: bytes, token: bytes) -> bool:
    """Compare a presented bearer token with the configured one in constant time.

    Both sides are hashed (SHA-256) first, so :func:`hmac.compare_digest` always compares
    32 bytes and the time taken does not reveal the token's length either.
    """
    return hmac.compare_digest(hashlib.sha256(presented).digest(), hashlib.sha256(token).digest())


def check_bearer(header: str | None, token: bytes, encoding: str = "latin-1") -> None:
    """Raise :class:`Unauthorized` unless ``header`` is ``Bearer <token>``.

    ``encoding`` turns the header text back into the bytes sent: ``latin-1`` for HTTP
    (Starlette decodes header bytes so), ``utf-8`` for gRPC metadata. Text that has no
    such bytes cannot be the token.
    """
    if header is None:
        raise Unauthorized("missing")
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Unauthorized("missing")
    try:
        presented = credentials.strip().encode(encoding)
    except UnicodeEncodeError:
        raise Unauthorized("invalid") from None
    if not token_matches(presented, token):
        raise Unauthorized("invalid")


async def submit_counted(
    batch: SpanBatch, submit: Submit, counters: ReceiverCounters
) -> Exception | None:
    """Count a decoded batch's spans, run ``submit`` on its accepted ones, count the outcome.

    Shared by the OTLP/HTTP and OTLP/gRPC receivers so that ``received = stored +
    rejected`` holds on both. Spans the pipeline refuses after decoding (e.g. redaction
    failed) are counted whatever became of the rest.

    Returns:
        ``None`` once the batch is committed (acknowledge it), the :class:`QueueFull` to
        answer as throttling, or the unexpected exception ``submit`` raised (logged here
        by type only; answer "retry later").
    """
    decoded_rejections = batch.rejected_spans
    counters.spans_received(batch.transport, batch.accepted_spans() + decoded_rejections)
    if decoded_rejections:
        counters.spans_rejected(REASON_INVALID_SPAN, decoded_rejections)
    if not batch.accepted_spans():
        return None
    # Shielded: a client that cancels (a gRPC deadline, a disconnect) cancels its wait,
    # not the commit. Once the batch is accepted it is stored and counted in full, live
    # metrics included, as the store holds it; the client's retry is a duplicate.
    task = asyncio.ensure_future(submit(batch))
    try:
        with contextlib.suppress(Exception):  # the task's outcome is read by _submitted
            await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda done: _submitted(done, batch, counters, decoded_rejections))
        raise
    return _submitted(task, batch, counters, decoded_rejections)


def _submitted(
    task: asyncio.Future[None], batch: SpanBatch, counters: ReceiverCounters, decoded: int
) -> Exception | None:
    """Count the outcome of a finished ``submit`` task (see :func:`submit_counted`)."""
    failure = asyncio.CancelledError() if task.cancelled() else task.exception()
    if isinstance(failure, QueueFull):
        counters.spans_rejected(REASON_QUEUE_FULL, batch.accepted_spans())
    elif failure is not None:
        counters.spans_rejected(REASON_SUBMIT_FAILED, batch.accepted_spans())
        _logger.error("OTLP batch not committed: submit raised %s", type(failure).__name__)
    refused_later = batch.rejected_spans - decoded
    if refused_later > 0:
        counters.spans_rejected(REASON_PIPELINE, refused_later)
    if failure is None:
        _logger.debug(
            "OTLP request acknowledged: %d spans stored, %d rejected (%s)",
            batch.accepted_spans(),
            batch.rejected_spans,
            batch.transport,
        )
        return None
    return failure if isinstance(failure, Exception) else RuntimeError("submit cancelled")


def export_response(batch: SpanBatch) -> ExportTraceServiceResponse:
    """The ``ExportTraceServiceResponse`` of an acknowledged batch: ``partial_success``
    with the rejected count and their content-free messages when some were refused."""
    rejected = batch.rejected_spans
    if not rejected:
        return ExportTraceServiceResponse()
    total = rejected + batch.accepted_spans()
    message = f"{rejected} of {total} spans rejected: " + "; ".join(batch.rejection_messages)
    return ExportTraceServiceResponse(
        partial_success=ExportTracePartialSuccess(
            rejected_spans=rejected, error_message=message[:_MAX_PARTIAL_MESSAGE_CHARS]
        )
    )
