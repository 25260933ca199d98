"""The OTLP/HTTP receive stage: ``POST /v1/traces`` as a Starlette app, served by uvicorn.

:func:`create_otlp_app` builds the ASGI app; :class:`OtlpServer` runs it (foreground, in an
event loop, or in a background thread for tests). The app decodes each request once
(:mod:`loopwatch.collector.decode`) and hands the batch to an injected ``submit``
coroutine that runs the rest of the pipeline; it answers ``200`` only after ``submit``
has resolved, i.e. after the batch's events are committed (ack after commit).

Responses follow the OTLP specification, section "OTLP/HTTP Response"
(https://opentelemetry.io/docs/specs/otlp/#otlphttp-response):

========================================  ======  ==============================================
case                                      status  body (same Content-Type as the request)
========================================  ======  ==============================================
all spans accepted ("Full Success")       200     ``ExportTraceServiceResponse``, no partial_success
some refused ("Partial Success")          200     ``partial_success{rejected_spans, error_message}``
undecodable body ("Bad Data")             400     ``google.rpc.Status``
bearer token missing or wrong             401     ``Status`` and ``WWW-Authenticate: Bearer``
body or inflated body over its cap        413     ``Status`` ("OTLP/HTTP Request": limit
                                                  applies "including after decompression")
other Content-Type or Content-Encoding     415     ``Status`` (as JSON when the type is unknown)
queue full ("OTLP/HTTP Throttling")       429|503 ``Status`` and ``Retry-After`` in seconds
``submit`` failed unexpectedly            503     ``Status`` and ``Retry-After`` (retryable)
injected ``decode`` failed unexpectedly   503     ``Status`` and ``Retry-After`` (retryable)
========================================  ======  ==============================================

Failure bodies are ``google.rpc.Status`` messages (``code`` is the equivalent gRPC code,
``message`` a content-free reason), binary for ``application/x-protobuf`` requests and
OTLP/JSON (``{"code": 3, "message": "..."}``) otherwise, as "Failures" requires. The
``Status`` message is encoded here by hand (two fields) because it is not part of
``opentelemetry-proto``.

Nothing in this module logs or echoes span content or the bearer token.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Final

import anyio.to_thread
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from .decode import SUPPORTED_CONTENT_ENCODINGS, decode_body
from .errors import (
    CollectorError,
    ConfigError,
    DecodeError,
    PayloadTooLarge,
    QueueFull,
    Unauthorized,
    UnsupportedMediaType,
)
from .receive import (
    REASON_DECODE_ERROR,
    REASON_PAYLOAD_TOO_LARGE,
    REASON_QUEUE_FULL,
    REASON_UNAUTHORIZED,
    REASON_UNSUPPORTED_MEDIA_TYPE,
    Decode,
    InflightLimit,
    InMemoryReceiverCounters,
    ReceiverCounters,
    Reservation,
    Submit,
    check_bearer,
    export_response,
    require_positive_int,
    submit_counted,
)
from .records import SpanBatch

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_PORT",
    "MEDIA_TYPE_JSON",
    "MEDIA_TYPE_PROTOBUF",
    "TRACES_PATH",
    "OtlpServer",
    "create_otlp_app",
    "serve",
]

_logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4318
TRACES_PATH = "/v1/traces"
DEFAULT_MAX_BODY_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 20 * 1024 * 1024
MEDIA_TYPE_PROTOBUF = "application/x-protobuf"
MEDIA_TYPE_JSON = "application/json"
_SUPPORTED_MEDIA_TYPES = (MEDIA_TYPE_PROTOBUF, MEDIA_TYPE_JSON)
_ACCEPTED_ENCODINGS = frozenset(("", "x-gzip", *SUPPORTED_CONTENT_ENCODINGS))

_GRPC_INVALID_ARGUMENT = 3
_GRPC_RESOURCE_EXHAUSTED = 8
_GRPC_UNAVAILABLE = 14
_GRPC_UNAUTHENTICATED = 16
_OFFLOAD_DECODE_BYTES = 256 * 1024


def create_otlp_app(
    submit: Submit,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    token: str | None = None,
    counters: ReceiverCounters | None = None,
    path: str = TRACES_PATH,
    backpressure_status_code: int = 503,
    retry_after_seconds: int = 1,
    decode: Decode | None = None,
    inflight: InflightLimit | None = None,
) -> Starlette:
    """Build the OTLP/HTTP trace receiver as a Starlette ASGI app.

    Args:
        submit: the rest of the pipeline (see :data:`Submit`); awaited before answering 200.
        max_body_bytes: cap on the body as received (compressed), in bytes. A larger
            ``Content-Length`` is refused before reading; a chunked body is read only up
            to the cap. The OTLP spec recommends 20 MiB.
        max_decompressed_bytes: cap on the body after ``Content-Encoding`` is undone, bytes.
        token: if set, every request needs ``Authorization: Bearer <token>`` (compared in
            constant time). Never logged.
        counters: receives span and request counts; defaults to totals kept in memory.
        path: URL path of the endpoint (OTLP default ``/v1/traces``).
        backpressure_status_code: ``429`` or ``503``, answered when ``submit`` raises
            :class:`QueueFull` (both are retryable per "OTLP/HTTP Throttling").
        retry_after_seconds: default ``Retry-After`` when the :class:`QueueFull` does not
            carry one, and after an unexpected ``submit`` or ``decode`` failure; whole
            seconds ``>= 1``.
        decode: decodes bodies elsewhere (see :data:`Decode`), e.g. in worker processes;
            default: in this process, on the event loop for small identity-coded bodies
            and on a thread otherwise.
        inflight: the bound on bodies held at once, shared with the other receivers;
            a request past it is answered like a full queue (``backpressure_status_code``
            with ``Retry-After``) before it is decoded. Default: no bound.

    Returns:
        The ASGI app; ``POST {path}`` only.

    Raises:
        ConfigError: an option is out of range.

    Example:
        >>> async def submit(batch):
        ...     pass
        >>> app = create_otlp_app(submit, max_body_bytes=4 << 20, max_decompressed_bytes=16 << 20)
    """
    require_positive_int("max_body_bytes", max_body_bytes)
    require_positive_int("max_decompressed_bytes", max_decompressed_bytes)
    require_positive_int("retry_after_seconds", retry_after_seconds)
    if backpressure_status_code not in (429, 503):
        raise ConfigError("backpressure_status_code", "must be 429 or 503")
    if token is not None and (not token or token != token.strip() or not token.isprintable()):
        raise ConfigError("token", "must be non-empty printable text without surrounding spaces")
    if not path.startswith("/"):
        raise ConfigError("path", "must start with '/'")
    receiver = _Receiver(
        submit=submit,
        max_body_bytes=max_body_bytes,
        max_decompressed_bytes=max_decompressed_bytes,
        token=None if token is None else token.encode("utf-8"),
        counters=counters if counters is not None else InMemoryReceiverCounters(),
        backpressure_status_code=backpressure_status_code,
        retry_after_seconds=retry_after_seconds,
        decode=decode,
        inflight=inflight,
    )

    async def not_found(request: Request, exc: Exception) -> Response:
        as_json = "json" in request.headers.get("content-type", "")
        return _status_response(
            404, _GRPC_NOT_FOUND, f"no such endpoint; send traces to {path}", as_json
        )

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        as_json = "json" in request.headers.get("content-type", "")
        return _status_response(
            405, _GRPC_UNIMPLEMENTED, f"use POST {path}", as_json, headers={"Allow": "POST"}
        )

    return Starlette(
        routes=[Route(path, receiver.export, methods=["POST"])],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )


_REFUSAL_REASONS: dict[type[CollectorError], str] = {
    DecodeError: REASON_DECODE_ERROR,
    PayloadTooLarge: REASON_PAYLOAD_TOO_LARGE,
    UnsupportedMediaType: REASON_UNSUPPORTED_MEDIA_TYPE,
    Unauthorized: REASON_UNAUTHORIZED,
}


@dataclass(frozen=True, slots=True)
class _Receiver:
    submit: Submit
    max_body_bytes: int
    max_decompressed_bytes: int
    token: bytes | None
    counters: ReceiverCounters
    backpressure_status_code: int
    retry_after_seconds: int
    decode: Decode | None
    inflight: InflightLimit | None

    async def export(self, request: Request) -> Response:
        try:
            return await self._export(request)
        except QueueFull as exc:  # the in-flight bound: refused before decoding
            self.counters.request_refused(REASON_QUEUE_FULL)
            as_json = "json" in request.headers.get("content-type", "")
            return self._throttled(exc, as_json)

    def _throttled(self, exc: QueueFull, as_json: bool) -> Response:
        return _status_response(
            self.backpressure_status_code,
            _GRPC_UNAVAILABLE,
            str(exc),
            as_json,
            {"Retry-After": str(exc.retry_after_seconds)},
        )

    async def _export(self, request: Request) -> Response:
        headers = request.headers
        content_type = headers.get("content-type", "")
        media_type = content_type.partition(";")[0].strip().lower()
        as_json = media_type != MEDIA_TYPE_PROTOBUF
        try:
            if self.token is not None:
                check_bearer(headers.get("authorization"), self.token)
            if media_type not in _SUPPORTED_MEDIA_TYPES:
                raise UnsupportedMediaType(
                    header="content-type", value=content_type, supported=_SUPPORTED_MEDIA_TYPES
                )
            encoding = headers.get("content-encoding", "").strip().lower()
            if encoding not in _ACCEPTED_ENCODINGS:
                raise UnsupportedMediaType(
                    header="content-encoding",
                    value=encoding,
                    supported=SUPPORTED_CONTENT_ENCODINGS,
                )
        except CollectorError as exc:
            return self._refused(exc, as_json)
        with self.inflight.reserve() if self.inflight else contextlib.nullcontext() as held:
            try:
                body = await _read_body(request, self.max_body_bytes, held)
            except QueueFull:
                raise  # the in-flight bound, mid-body: throttled (export answers it)
            except CollectorError as exc:
                return self._refused(exc, as_json)
            except ClientDisconnect:
                return Response(status_code=400)
            return await self._answer(body, encoding, as_json)

    async def _answer(self, body: bytes, encoding: str, as_json: bool) -> Response:
        try:
            if self.decode is not None:
                try:
                    batch = await self.decode(body, encoding, as_json)
                except CollectorError as exc:
                    if not exc.retryable:
                        raise
                    _logger.error("OTLP body not decoded: %s", exc)
                    return self._retry_later("batch not decoded; retry later", as_json)
                except Exception as exc:
                    _logger.error("OTLP body not decoded: decode raised %s", type(exc).__name__)
                    return self._retry_later("batch not decoded; retry later", as_json)
            elif encoding or len(body) > _OFFLOAD_DECODE_BYTES:
                batch = await anyio.to_thread.run_sync(self._decode, body, encoding, as_json)
            else:
                batch = self._decode(body, encoding, as_json)
        except CollectorError as exc:
            return self._refused(exc, as_json)

        failure = await submit_counted(batch, self.submit, self.counters)
        if isinstance(failure, QueueFull):
            return self._throttled(failure, as_json)
        if failure is not None:
            return self._retry_later("batch not committed; retry later", as_json)
        return _export_response(batch, as_json)

    def _refused(self, exc: CollectorError, as_json: bool) -> Response:
        reason = _REFUSAL_REASONS.get(type(exc), REASON_DECODE_ERROR)
        self.counters.request_refused(reason)
        _logger.debug("OTLP request refused (%s): %s", reason, exc)
        return _failure_response(exc, as_json)

    def _decode(self, body: bytes, encoding: str, as_json: bool) -> SpanBatch:
        return decode_body(
            body, encoding, as_json=as_json, max_decompressed_bytes=self.max_decompressed_bytes
        )

    def _retry_later(self, message: str, as_json: bool) -> Response:
        return _status_response(
            503,
            _GRPC_UNAVAILABLE,
            message,
            as_json,
            {"Retry-After": str(self.retry_after_seconds)},
        )


async def _read_body(request: Request, limit_bytes: int, held: Reservation | None = None) -> bytes:
    """The whole body, at most ``limit_bytes``; each chunk is added to ``held`` as it
    arrives (raises :class:`QueueFull` from there, :class:`PayloadTooLarge` past the
    limit)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise PayloadTooLarge(limit_bytes=limit_bytes, stage="body", observed_bytes=int(declared))
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > limit_bytes:
                raise PayloadTooLarge(limit_bytes=limit_bytes, stage="body", observed_bytes=size)
            if held is not None:
                held.add(len(chunk))
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _export_response(batch: SpanBatch, as_json: bool) -> Response:
    response = export_response(batch)
    if not as_json:
        return Response(response.SerializeToString(), 200, media_type=MEDIA_TYPE_PROTOBUF)
    if not response.HasField("partial_success"):
        return Response(b"{}", 200, media_type=MEDIA_TYPE_JSON)
    partial = {
        "rejectedSpans": str(response.partial_success.rejected_spans),
        "errorMessage": response.partial_success.error_message,
    }
    return Response(json.dumps({"partialSuccess": partial}), 200, media_type=MEDIA_TYPE_JSON)


def _failure_response(exc: CollectorError, as_json: bool) -> Response:
    if isinstance(exc, Unauthorized):
        return _status_response(
            401, _GRPC_UNAUTHENTICATED, str(exc), as_json, {"WWW-Authenticate": "Bearer"}
        )
    if isinstance(exc, PayloadTooLarge):
        return _status_response(413, _GRPC_RESOURCE_EXHAUSTED, str(exc), as_json)
    if isinstance(exc, UnsupportedMediaType):
        extra = (
            {"Accept-Encoding": ", ".join(SUPPORTED_CONTENT_ENCODINGS)}
            if exc.header == "content-encoding"
            else {}
        )
        return _status_response(415, _GRPC_INVALID_ARGUMENT, str(exc), as_json, extra)
    return _status_response(400, _GRPC_INVALID_ARGUMENT, str(exc), as_json)


_GRPC_NOT_FOUND: Final = 5
_GRPC_UNIMPLEMENTED: Final = 12


def _status_response(
    status_code: int,
    grpc_code: int,
    message: str,
    as_json: bool,
    headers: dict[str, str] | None = None,
) -> Response:
    if as_json:
        body = json.dumps({"code": grpc_code, "message": message}).encode("utf-8")
        return Response(body, status_code, headers=headers, media_type=MEDIA_TYPE_JSON)
    return Response(
        _encode_rpc_status(grpc_code, message),
        status_code,
        headers=headers,
        media_type=MEDIA_TYPE_PROTOBUF,
    )


def _encode_rpc_status(code: int, message: str) -> bytes:
    """Serialize ``google.rpc.Status{code = 1 (int32), message = 2 (string)}``."""
    text = message.encode("utf-8")
    out = bytearray()
    if code:
        out += b"\x08" + _varint(code)
    if text:
        out += b"\x12" + _varint(len(text)) + text
    return bytes(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


class OtlpServer:
    """Serve an ASGI app with uvicorn on one TCP socket that this object binds.

    Binding happens in :meth:`start`, :meth:`run` or :meth:`serve`, so ``port=0`` works and
    :attr:`port` then reports the port the OS chose. One instance serves once.

    Shutdown is graceful: the listening socket closes, then requests in flight (waiting
    for ``submit`` to commit) get up to ``graceful_shutdown_seconds`` to finish. Stop
    the server before the pipeline it submits to.

    Args:
        app: the ASGI app, typically from :func:`create_otlp_app`.
        host: address to bind; loopback unless told otherwise.
        port: TCP port; ``0`` picks a free one.
        graceful_shutdown_seconds: how long in-flight requests may take at shutdown.

    Raises:
        ConfigError: ``port`` out of range or a negative grace period.

    Example:
        >>> with OtlpServer(app, port=0) as server:  # doctest: +SKIP
        ...     httpx.post(f"{server.url}/v1/traces", ...)
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        graceful_shutdown_seconds: float = 10.0,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError("port", "must be an integer in 0..65535")
        if not math.isfinite(graceful_shutdown_seconds) or graceful_shutdown_seconds < 0:
            raise ConfigError("graceful_shutdown_seconds", "must be a finite number >= 0")
        self._host = host
        self._requested_port = port
        # Parser and loop named, not "auto", as in the collector's own servers (service.py):
        # hostile input must be parsed the same whatever else is installed.
        self._config = uvicorn.Config(
            app,
            host=host,
            port=port,
            loop="asyncio",
            http="h11",
            lifespan="off",
            log_config=None,
            log_level=None,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=math.ceil(graceful_shutdown_seconds),
        )
        self._server = uvicorn.Server(self._config)
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        """The bound (or configured) host."""
        return self._host

    @property
    def port(self) -> int:
        """The bound TCP port.

        Raises:
            RuntimeError: the server has not bound its socket yet.
        """
        if self._socket is None:
            raise RuntimeError("OtlpServer is not bound; call start(), run() or serve()")
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:4318`` (append :data:`TRACES_PATH`)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    def _bind(self) -> socket.socket:
        if self._socket is not None:
            raise RuntimeError("OtlpServer serves once; create a new instance")
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        self._socket = socket.create_server(
            (self._host, self._requested_port), family=family, backlog=self._config.backlog
        )
        return self._socket

    def run(self) -> None:
        """Bind and serve in the calling thread until SIGINT/SIGTERM (main thread) or stop.

        Raises:
            OSError: the address cannot be bound.
        """
        self._server.run(sockets=[self._bind()])

    async def serve(self) -> None:
        """Bind and serve inside the running event loop until :meth:`stop` is called.

        Raises:
            OSError: the address cannot be bound.
        """
        await self._server.serve(sockets=[self._bind()])

    def start(self, *, timeout_seconds: float = 10.0) -> OtlpServer:
        """Bind, then serve from a daemon thread; return once the server accepts requests.

        Args:
            timeout_seconds: how long to wait for the server to start.

        Returns:
            ``self``, so ``server = OtlpServer(app, port=0).start()`` reads well.

        Raises:
            OSError: the address cannot be bound.
            RuntimeError: the server did not start within ``timeout_seconds``.
        """
        sockets = [self._bind()]
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": sockets},
            name=f"loopwatch-otlp-http-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_seconds
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop(timeout_seconds=1.0)
                raise RuntimeError("OTLP/HTTP server did not start")
            time.sleep(0.005)
        return self

    def stop(self, *, timeout_seconds: float = 15.0) -> None:
        """Ask the server to exit and wait for its thread (if :meth:`start` was used).

        Args:
            timeout_seconds: how long to wait for the serving thread to finish.
        """
        self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_seconds)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> OtlpServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(app: ASGIApp, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve ``app`` in the foreground until SIGINT/SIGTERM (see :class:`OtlpServer`).

    Raises:
        ConfigError: ``port`` out of range.
        OSError: the address cannot be bound.
    """
    OtlpServer(app, host=host, port=port).run()
