"""Exceptions raised by ``loopwatch.collector``.

One tree for the whole collector (STYLE rule 11). Every exception carries structured
context as attributes; no message ever echoes span content, attribute values or
credentials, so any of them can be logged or returned to a client as is::

    Exception
    └── CollectorError                      base of every collector exception
        ├── ConfigError (also ValueError)    invalid configuration, raised at construction
        ├── DecodeError (also ValueError)    body is not a decodable OTLP request  -> 400
        ├── PayloadTooLarge                  body or decompressed body over its cap -> 413
        ├── UnsupportedMediaType             Content-Type or Content-Encoding refused -> 415
        ├── Unauthorized                     bearer token missing or wrong          -> 401
        ├── QueueFull                        the pipeline cannot take the batch now -> 429/503
        ├── DecodeWorkerLost                 a decode worker died holding the request -> 503
        ├── ApiError                         a read API request refused (its own status)
        ├── ReadTimeout                      a read query ran past its time limit   -> 503
        ├── StoreUnavailable                 the DuckDB file cannot be opened at start
        ├── SchemaTooNew                     the file was written by a newer loopwatch
        ├── StoreClosed                      the store is closing; batch not taken  -> 503
        ├── StoreError                       a batch's commit failed                -> 503
        └── LakeUnavailable                  the lake (DuckLake catalog, data path) cannot
                                             be reached, loaded or written

The HTTP statuses are those the OTLP/HTTP receiver answers with (OTLP specification,
"OTLP/HTTP Response"); :attr:`CollectorError.retryable` says whether the OTLP spec lets the
client retry the same data ("Retryable Response Codes").
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ApiError",
    "CollectorError",
    "ConfigError",
    "DecodeError",
    "DecodeWorkerLost",
    "LakeUnavailable",
    "PayloadTooLarge",
    "QueueFull",
    "ReadTimeout",
    "SchemaTooNew",
    "StoreClosed",
    "StoreError",
    "StoreUnavailable",
    "Unauthorized",
    "UnsupportedMediaType",
]

_MAX_ECHO_CHARS = 64


def _clip(value: str) -> str:
    """Shorten a client-supplied header value before it goes into a message."""
    value = value.encode("ascii", "backslashreplace").decode("ascii")
    return value if len(value) <= _MAX_ECHO_CHARS else value[:_MAX_ECHO_CHARS] + "..."


class CollectorError(Exception):
    """Base class of every exception raised by the collector.

    Attributes:
        retryable: whether a client may send the same data again (OTLP/HTTP
            "Retryable Response Codes"); ``False`` unless a subclass says otherwise.
    """

    retryable: bool = False


class ConfigError(CollectorError, ValueError):
    """Invalid collector configuration; raised at construction, never while serving.

    Attributes:
        field: the offending setting, e.g. ``max_body_bytes``.
        reason: what is wrong with it. Never contains a secret's value.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class DecodeError(CollectorError, ValueError):
    """The request body is not a decodable OTLP ``ExportTraceServiceRequest``.

    Not retryable: OTLP/HTTP "Bad Data" says the server answers ``400 Bad Request`` and the
    client must not retry.

    Attributes:
        encoding: ``"protobuf"``, ``"json"``, ``"gzip"`` or ``"deflate"``: the layer that failed.
        reason: short, content-free description (e.g. ``"not valid JSON"``).
        offset: byte or character offset of the failure when known, else ``None``.
    """

    def __init__(self, encoding: str, reason: str, *, offset: int | None = None) -> None:
        self.encoding = encoding
        self.reason = reason
        self.offset = offset
        where = "" if offset is None else f" at offset {offset}"
        super().__init__(f"cannot decode {encoding} body: {reason}{where}")


class PayloadTooLarge(CollectorError):
    """A body exceeded its size cap; reading or inflating stopped at the cap.

    Not retryable: OTLP/HTTP "OTLP/HTTP Request" says the server answers
    ``413 Content Too Large`` and the client must not retry.

    Attributes:
        limit_bytes: the cap that was exceeded.
        stage: ``"body"`` (bytes on the wire) or ``"decompressed"`` (after inflating).
        observed_bytes: bytes seen when reading stopped (a lower bound of the real size),
            or the declared ``Content-Length``.
    """

    def __init__(self, *, limit_bytes: int, stage: str, observed_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.stage = stage
        self.observed_bytes = observed_bytes
        super().__init__(f"{stage} size exceeds the limit of {limit_bytes} bytes")


class UnsupportedMediaType(CollectorError):
    """The request's ``Content-Type`` or ``Content-Encoding`` is not accepted.

    Attributes:
        header: ``"content-type"`` or ``"content-encoding"``.
        value: the received value, clipped to 64 ASCII characters.
        supported: the values that would have been accepted.
    """

    def __init__(self, *, header: str, value: str, supported: Sequence[str]) -> None:
        self.header = header
        self.value = _clip(value)
        self.supported = tuple(supported)
        super().__init__(
            f"unsupported {header} {self.value!r}; supported: {', '.join(self.supported)}"
        )


class Unauthorized(CollectorError):
    """The bearer token is missing or wrong. The token itself is never stored here.

    Attributes:
        reason: ``"missing"`` (no ``Authorization: Bearer`` header) or ``"invalid"``.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"bearer token {reason}")


class QueueFull(CollectorError):
    """The pipeline's queue is full: the batch was not accepted, nothing was stored.

    Retryable: the receiver answers ``429``/``503`` with ``Retry-After`` (OTLP/HTTP
    "OTLP/HTTP Throttling").

    Attributes:
        capacity: queue bound (in batches or spans, as the queue counts), if known.
        retry_after_seconds: suggested wait before retrying, whole seconds, ``>= 1``.
    """

    retryable = True

    def __init__(self, *, capacity: int | None = None, retry_after_seconds: int = 1) -> None:
        self.capacity = capacity
        self.retry_after_seconds = max(1, int(retry_after_seconds))
        super().__init__("ingest queue is full; retry later")


class DecodeWorkerLost(CollectorError):
    """A decode worker process died (killed, out of memory) or was stuck while it held
    the request; nothing of the request was stored. Retryable: the receiver answers 503
    with ``Retry-After`` and the worker is started again."""

    retryable = True

    def __init__(self, reason: str = "decode worker lost") -> None:
        super().__init__(f"{reason}; retry later")


class ApiError(CollectorError):
    """A read API request refused; answered with the JSON error envelope.

    Attributes:
        status: HTTP status. code: a stable machine-readable code. message: safe text.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class StoreUnavailable(CollectorError):
    """The DuckDB file cannot be opened: missing folder, held by another process (DuckDB
    allows one writer), or not a DuckDB file. The message names the file and the cause."""

    def __init__(self, path: str, exc: BaseException) -> None:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "lock" in text.lower():
            text = "the file is in use by another process (one collector owns a DuckDB file)"
        super().__init__(f"cannot open {path}: {text[:200]}")


class StoreError(CollectorError):
    """A batch could not be committed; its future carries this. Not retryable as is.

    Attributes:
        reason: short, content-free description (the DuckDB error class name).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"store write failed: {reason}")


class StoreClosed(CollectorError):
    """The store is closing or closed; the batch was not accepted."""

    retryable = True

    def __init__(self) -> None:
        super().__init__("store is closed")


class SchemaTooNew(CollectorError):
    """The file was written by a newer loopwatch (its schema version is unknown here).

    Attributes:
        found / supported: schema versions of the file and of this code.
    """

    def __init__(self, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(f"database schema version {found} is newer than {supported}")


class ReadTimeout(CollectorError):
    """A read query ran past its time limit and was interrupted.

    Attributes:
        timeout_seconds: the limit.
    """

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        super().__init__(f"read query exceeded {timeout_seconds:g} s")


class LakeUnavailable(CollectorError):
    """The lake cannot be used: an extension does not load, the catalog does not answer or
    is of another DuckLake version, or the data path cannot be written.

    The message is one line naming what failed and what to do; it never echoes a password
    from the catalog string (see :func:`loopwatch.collector.lake.connect.mask_catalog`).

    Attributes:
        what: which part failed: ``extension``, ``catalog``, ``data_path`` or ``version``.
    """

    retryable = True

    def __init__(self, what: str, message: str) -> None:
        self.what = what
        super().__init__(message)
