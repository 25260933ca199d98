"""OTLP/gRPC trace receiver: ``TraceService/Export`` on ``grpc.aio``, off by default.

Many OpenTelemetry SDKs and auto-instrumentations export over gRPC to port 4317 unless
told otherwise; ``server.otlp_grpc`` (``--otlp-grpc HOST:PORT``) turns this receiver on
beside OTLP/HTTP. It runs on the collector's own event loop and feeds the same pipeline:
the same decode (in the decode workers when there are some), redaction, store and
metrics, with ``transport="grpc"``, and answers only after the commit.

The method is registered with no request deserializer, so the body reaches the same
protobuf decoder as OTLP/HTTP (``decode_body``) rather than a second parse by gRPC.

Answers follow the OTLP specification, "OTLP/gRPC Response" and "Failures"
(https://opentelemetry.io/docs/specs/otlp/#otlpgrpc-response):

====================================  =======================================================
case                                  answer
====================================  =======================================================
all spans accepted                    ``OK``, ``ExportTraceServiceResponse``
some refused ("Partial Success")      ``OK``, ``partial_success{rejected_spans, error_message}``
not an ``ExportTraceServiceRequest``  ``INVALID_ARGUMENT`` (not retryable)
message over the size cap             ``RESOURCE_EXHAUSTED``, from gRPC itself (no
                                      ``RetryInfo``, so exporters do not retry it)
bearer token missing or wrong         ``UNAUTHENTICATED``
queue full ("OTLP/gRPC Throttling")   ``UNAVAILABLE`` with ``google.rpc.RetryInfo``
                                      (``retry_delay`` = the queue's ``Retry-After``)
decode or ``submit`` failed           ``UNAVAILABLE`` with ``RetryInfo`` (retryable)
unexpectedly
====================================  =======================================================

The size cap (``grpc.max_receive_message_length``) is ``limits.max_decompressed_bytes``:
gRPC applies it to the message after decompression, so a gzip bomb is refused, not
inflated. ``SO_REUSEPORT`` is turned off, so a second collector on the same port fails to
start instead of silently sharing the traffic. Nothing here logs span content or the
token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final, NoReturn

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2

from .decode import TRANSPORT_GRPC, decode_body
from .errors import (
    CollectorError,
    ConfigError,
    DecodeError,
    PayloadTooLarge,
    QueueFull,
    Unauthorized,
)
from .receive import (
    REASON_DECODE_ERROR,
    REASON_PAYLOAD_TOO_LARGE,
    REASON_QUEUE_FULL,
    REASON_UNAUTHORIZED,
    Decode,
    InflightLimit,
    ReceiverCounters,
    Submit,
    export_response,
    submit_counted,
)
from .receive import check_bearer as _check_bearer
from .records import SpanBatch

__all__ = ["DEFAULT_GRPC_PORT", "EXPORT_METHOD", "SERVICE_NAME", "OtlpGrpcServer"]

_logger = logging.getLogger(__name__)

DEFAULT_GRPC_PORT: Final = 4317
SERVICE_NAME: Final = "opentelemetry.proto.collector.trace.v1.TraceService"
EXPORT_METHOD: Final = f"/{SERVICE_NAME}/Export"
_STATUS_DETAILS_KEY: Final = "grpc-status-details-bin"


class OtlpGrpcServer:
    """The OTLP/gRPC receiver: build it, then ``await start()`` and ``await stop()`` on the
    event loop that runs ``submit`` and ``decode``.

    Args:
        address: ``HOST:PORT`` to listen on (port ``0``: any free port, see :attr:`port`).
        submit: the rest of the pipeline (:data:`~loopwatch.collector.receive.Submit`).
        decode: decodes bodies elsewhere (:data:`~loopwatch.collector.receive.Decode`);
            default: :func:`~loopwatch.collector.decode.decode_body` on a thread.
        counters: span and request counts (the same as OTLP/HTTP's).
        token: if set, every call needs ``authorization: Bearer <token>`` metadata.
        max_message_bytes: cap on a request message after decompression, in bytes.
        retry_after_seconds: the ``RetryInfo`` delay after an unexpected failure.
        inflight: the bound on request bytes held at once, shared with OTLP/HTTP; a call
            past it is ``UNAVAILABLE`` with ``RetryInfo`` before it is decoded.

    Raises:
        ConfigError: a limit out of range.
    """

    def __init__(
        self,
        address: str,
        *,
        submit: Submit,
        counters: ReceiverCounters,
        decode: Decode | None = None,
        token: str | None = None,
        max_message_bytes: int,
        retry_after_seconds: int = 1,
        inflight: InflightLimit | None = None,
    ) -> None:
        if max_message_bytes <= 0 or retry_after_seconds <= 0:
            raise ConfigError("server.otlp_grpc", "limits must be > 0")
        self.address = address
        self._submit = submit
        self._decode = decode
        self._counters = counters
        self._token = None if token is None else token.encode("utf-8")
        self._max_message_bytes = max_message_bytes
        self._retry_after_seconds = retry_after_seconds
        self._inflight = inflight
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        """Bind and start serving.

        Raises:
            OSError: the address cannot be bound (in use, not local).
        """
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.so_reuseport", 0),
            ]
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export, request_deserializer=None, response_serializer=None
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {self.address} (server.otlp_grpc): {exc}") from None
        if not port:
            raise OSError(f"cannot listen on {self.address} (server.otlp_grpc)")
        self.port = port
        await server.start()
        self._server = server

    async def stop(self, grace_seconds: float = 10.0) -> None:
        """Stop accepting calls; calls in flight get ``grace_seconds`` to finish."""
        if self._server is not None:
            await self._server.stop(grace_seconds)
            self._server = None

    async def _export(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            with self._inflight.hold(len(body)) if self._inflight else contextlib.nullcontext():
                return await self._answer(body, context)
        except QueueFull as exc:  # the in-flight bound: refused before decoding
            self._counters.request_refused(REASON_QUEUE_FULL)
            await self._abort_retryable(context, str(exc), exc.retry_after_seconds)

    async def _answer(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            if self._token is not None:
                metadata = dict(context.invocation_metadata() or ())
                header = metadata.get("authorization")
                _check_bearer(header if isinstance(header, str) else None, self._token, "utf-8")
            batch = await self._decoded(body)
        except Unauthorized as exc:
            self._counters.request_refused(REASON_UNAUTHORIZED)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except (DecodeError, PayloadTooLarge) as exc:
            too_large = isinstance(exc, PayloadTooLarge)
            self._counters.request_refused(
                REASON_PAYLOAD_TOO_LARGE if too_large else REASON_DECODE_ERROR
            )
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED
                if too_large
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            await context.abort(code, str(exc))
        except Exception as exc:  # e.g. a decode worker lost: the collector's fault
            # A CollectorError's message is content-free; of anything else, only the type.
            why = exc if isinstance(exc, CollectorError) else type(exc).__name__
            _logger.error("OTLP/gRPC body not decoded: %s", why)
            await self._abort_retryable(context, "batch not decoded; retry later", None)
        batch.transport = TRANSPORT_GRPC
        failure = await submit_counted(batch, self._submit, self._counters)
        if failure is not None:
            delay = getattr(failure, "retry_after_seconds", None)
            message = str(failure) if delay is not None else "batch not committed; retry later"
            await self._abort_retryable(context, message, delay)
        return export_response(batch).SerializeToString()  # type: ignore[no-any-return]

    async def _decoded(self, body: bytes) -> SpanBatch:
        if self._decode is not None:
            return await self._decode(body, "", False)
        return await asyncio.to_thread(
            decode_body,
            body,
            "",
            as_json=False,
            max_decompressed_bytes=self._max_message_bytes,
        )

    async def _abort_retryable(
        self, context: grpc.aio.ServicerContext, message: str, delay: int | None
    ) -> NoReturn:
        """``UNAVAILABLE`` with ``RetryInfo``: the OTLP exporter retries after the delay."""
        seconds = delay if delay is not None else self._retry_after_seconds
        info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=seconds))
        status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message)
        status.details.add().Pack(info)
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            message,
            trailing_metadata=((_STATUS_DETAILS_KEY, status.SerializeToString()),),
        )
        raise AssertionError("grpc.aio abort() returned")  # it raises AbortError
