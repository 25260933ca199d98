"""Decode OTLP trace export requests into typed records (the ``decode`` stage).

OTLP/HTTP bodies are decoded once into :class:`~loopwatch.collector.records.SpanBatch`
(STYLE rule 6); no later stage touches protobuf or OTLP/JSON.

Entry points:

- :func:`decompress` undoes ``Content-Encoding: gzip`` (or ``deflate``) with a hard cap on
  the inflated size: a gzip bomb raises :class:`PayloadTooLarge` after inflating at most
  ``max_bytes + 1`` bytes.
- :func:`decode_protobuf` parses a binary ``ExportTraceServiceRequest`` with
  ``opentelemetry-proto``; :func:`decode_request` walks an already parsed message (gRPC).
- :func:`decode_json` reads OTLP/JSON over :func:`json.loads`, by hand, because OTLP/JSON
  deviates from the generic protobuf JSON mapping (OTLP specification, "JSON Protobuf
  Encoding"): ``traceId``/``spanId`` are case-insensitive hex strings, not base64, so a
  generic parse silently corrupts them. Keys are lowerCamelCase only (original
  snake_case field names are unknown fields and ignored, as the spec requires); 64-bit
  integers are accepted as numbers or decimal strings; ``null`` means "default".
  Enums are accepted as integers (the spec) and as ``SPAN_KIND_*``/``STATUS_CODE_*``
  names, which real exporters send anyway. A lone surrogate written as a JSON escape
  (``"\\ud800"``: valid JSON, not valid Unicode text) becomes U+FFFD, as a UTF-8 decoder
  treats invalid bytes; stored as is, it failed the whole batch in DuckDB with a
  retryable 503 (a poison batch).

What is refused, and how:

- The whole request (:class:`DecodeError`, answered ``400``): a body that is not a
  protobuf ``ExportTraceServiceRequest`` or not JSON; in JSON, a top-level value that is
  not an object or ``resourceSpans``/``scopeSpans``/``spans`` that are not arrays of
  objects; attribute values nested deeper than :data:`MAX_VALUE_DEPTH`.
- One span (``batch.reject(1, message)``, reported in ``partial_success``): a trace id
  that is not 16 bytes (32 hex chars) or is all zero, a span id that is not 8 bytes
  (16 hex chars) or is all zero, a parent span id that is neither empty nor 8 bytes,
  a link with such ids, a start, end or event time past the largest signed 64-bit
  nanosecond count (year 2262: the store keeps times as ``BIGINT``, and one such span
  would fail its whole batch), and, in JSON, a field of
  the wrong type. An all-zero parent span id means "no parent", as in the OpenTelemetry
  Collector's ``pdata``.
  Malformed resource or scope attributes reject every span under them.
  :func:`decode_body` then refuses the loopwatch spans no row could be made of
  (:func:`~loopwatch.collector.map.refuse_unmappable`: no or an over-long
  ``loopwatch.run.id``, an unknown ``loopwatch.event``), which would otherwise be
  acknowledged and never stored.

Rejection messages are fixed strings: they never echo span content.

Cost: per-span work is constant (no state across spans; resource and scope records are
built once per ``ResourceSpans``/``ScopeSpans`` and shared). All functions are pure and
thread-safe; they block for the duration of the decode (about ``len(spans) * 5-15 us``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf.message import DecodeError as _ProtobufDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from .errors import DecodeError, PayloadTooLarge, UnsupportedMediaType
from .map import refuse_unmappable
from .records import (
    Attributes,
    AttrValue,
    LinkRecord,
    ResourceRecord,
    ScopeRecord,
    SpanBatch,
    SpanEventRecord,
    SpanRecord,
)

__all__ = [
    "MAX_VALUE_DEPTH",
    "MSG_LINK_ID",
    "MSG_MALFORMED_ATTRIBUTES",
    "MSG_MALFORMED_RESOURCE",
    "MSG_MALFORMED_SPAN",
    "MSG_PARENT_SPAN_ID",
    "MSG_SPAN_ID",
    "MSG_TIME",
    "MSG_TRACE_ID",
    "SUPPORTED_CONTENT_ENCODINGS",
    "TRANSPORT_GRPC",
    "TRANSPORT_HTTP_JSON",
    "TRANSPORT_HTTP_PROTOBUF",
    "decode_body",
    "decode_json",
    "decode_protobuf",
    "decode_request",
    "decompress",
]

TRANSPORT_HTTP_PROTOBUF = "http_protobuf"
TRANSPORT_HTTP_JSON = "http_json"
TRANSPORT_GRPC = "grpc"

SUPPORTED_CONTENT_ENCODINGS = ("identity", "gzip", "deflate")

MAX_VALUE_DEPTH = 32
"""Deepest accepted nesting of ``arrayValue``/``kvlistValue`` in one attribute value.

The protobuf parser's own recursion limit (100 messages) allows about 45 levels.
"""

MSG_TRACE_ID = "invalid trace id (need 16 bytes / 32 hex chars, not all zero)"
MSG_SPAN_ID = "invalid span id (need 8 bytes / 16 hex chars, not all zero)"
MSG_PARENT_SPAN_ID = "invalid parent span id (need empty or 8 bytes / 16 hex chars)"
MSG_LINK_ID = "invalid link trace or span id"
MSG_TIME = "invalid time (need 0..2^63-1 ns since the Unix epoch)"
MSG_MALFORMED_SPAN = "malformed span field"
MSG_MALFORMED_ATTRIBUTES = "malformed attributes"
MSG_MALFORMED_RESOURCE = "malformed resource or scope"

_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)
_ZERO_TRACE_HEX = "0" * 32
_ZERO_SPAN_HEX = "0" * 16
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1

_HEX32 = re.compile(r"[0-9a-fA-F]{32}").fullmatch
_HEX16 = re.compile(r"[0-9a-fA-F]{16}").fullmatch
_INT_STR = re.compile(r"-?[0-9]{1,20}").fullmatch
_FLOAT_STR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?").fullmatch
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]").search

_SPAN_KIND_NAMES = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_CODE_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def decompress(body: bytes, encoding: str, *, max_bytes: int) -> bytes:
    """Undo an HTTP ``Content-Encoding`` with a hard cap on the output size.

    Inflation runs through :func:`zlib.decompressobj` with ``max_length``, so at most
    ``max_bytes + 1`` bytes are ever produced, whatever the compression ratio. The OTLP
    specification ("OTLP/HTTP Request") requires the limit "including after decompression".

    Args:
        body: the request body as received.
        encoding: the ``Content-Encoding`` header value (case-insensitive): ``""`` or
            ``"identity"`` (no coding), ``"gzip"``/``"x-gzip"`` (RFC 1952, several members
            allowed) or ``"deflate"`` (RFC 1950 zlib; raw RFC 1951 deflate also accepted).
        max_bytes: largest accepted decoded size, in bytes; ``> 0``.

    Returns:
        The decoded body.

    Raises:
        PayloadTooLarge: the decoded body would exceed ``max_bytes``.
        DecodeError: the compressed stream is corrupt or truncated.
        UnsupportedMediaType: any other content coding.
    """
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        if len(body) > max_bytes:
            raise PayloadTooLarge(
                limit_bytes=max_bytes, stage="decompressed", observed_bytes=len(body)
            )
        return body
    if coding in ("gzip", "x-gzip"):
        wbits, name = _GZIP_WBITS, "gzip"
    elif coding == "deflate":
        is_zlib = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
        wbits, name = (zlib.MAX_WBITS if is_zlib else -zlib.MAX_WBITS), "deflate"
    else:
        raise UnsupportedMediaType(
            header="content-encoding", value=encoding, supported=SUPPORTED_CONTENT_ENCODINGS
        )
    parts: list[bytes] = []
    produced = 0
    data = body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            chunk = inflater.decompress(data, max_bytes - produced + 1)
        except zlib.error as exc:
            raise DecodeError(name, "corrupt compressed data") from exc
        produced += len(chunk)
        if produced > max_bytes:
            raise PayloadTooLarge(
                limit_bytes=max_bytes, stage="decompressed", observed_bytes=produced
            )
        parts.append(chunk)
        if not inflater.eof:
            raise DecodeError(name, "truncated compressed data", offset=len(body))
        data = inflater.unused_data
        if not data or wbits != _GZIP_WBITS:
            break
    if data:
        raise DecodeError(name, "trailing data after the compressed stream")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def decode_body(
    body: bytes, encoding: str, *, as_json: bool, max_decompressed_bytes: int
) -> SpanBatch:
    """Undo ``Content-Encoding`` and decode an OTLP/HTTP request body into a batch.

    What the receiver does with every body, in process or in a decode worker.

    Args:
        body: the body as received.
        encoding: ``Content-Encoding`` lowercased; ``""`` or ``"identity"`` for none.
        as_json: OTLP/JSON (``True``) or protobuf (``False``).
        max_decompressed_bytes: cap on the body after decompression (an uncompressed
            body over it is refused too), in bytes.

    Returns:
        The decoded batch (see :func:`decode_protobuf` and :func:`decode_json`), the
        loopwatch spans no row could be made of refused on it
        (:func:`~loopwatch.collector.map.refuse_unmappable`).

    Raises:
        DecodeError: the body is not valid OTLP in that encoding.
        PayloadTooLarge: the (decompressed) body exceeds ``max_decompressed_bytes``.
        UnsupportedMediaType: an unknown ``encoding``.
    """
    if encoding:
        body = decompress(body, encoding, max_bytes=max_decompressed_bytes)
    elif len(body) > max_decompressed_bytes:
        raise PayloadTooLarge(
            limit_bytes=max_decompressed_bytes, stage="decompressed", observed_bytes=len(body)
        )
    batch = decode_json(body) if as_json else decode_protobuf(body)
    refuse_unmappable(batch)
    return batch


class _Rejected(Exception):
    """Internal: one span (or one resource/scope subtree) cannot be accepted."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def decode_protobuf(body: bytes, *, transport: str = TRANSPORT_HTTP_PROTOBUF) -> SpanBatch:
    """Decode a binary protobuf ``ExportTraceServiceRequest``.

    Args:
        body: the serialized request (already decompressed).
        transport: the batch's transport label (``"http_protobuf"`` or ``"grpc"``).

    Returns:
        A batch of the accepted spans; refused spans are counted in
        ``batch.rejected_spans`` with content-free messages.

    Raises:
        DecodeError: ``body`` is not a valid serialized ``ExportTraceServiceRequest``
            (truncated, wrong wire types, invalid UTF-8 in a string, nesting too deep).

    Example:
        >>> decode_protobuf(b"").spans
        []
    """
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except _ProtobufDecodeError as exc:
        raise DecodeError("protobuf", "not a valid ExportTraceServiceRequest") from exc
    return decode_request(request, transport=transport)


def decode_request(
    request: ExportTraceServiceRequest, *, transport: str = TRANSPORT_HTTP_PROTOBUF
) -> SpanBatch:
    """Walk a parsed ``ExportTraceServiceRequest`` into records (see :func:`decode_protobuf`).

    Args:
        request: the parsed message (e.g. what a gRPC servicer receives).
        transport: the batch's transport label.

    Returns:
        The decoded batch.
    """
    batch = SpanBatch(spans=[], transport=transport)
    append = batch.spans.append
    for resource_spans in request.resource_spans:
        resource_pb = resource_spans.resource
        resource = ResourceRecord(_pb_attributes(resource_pb.attributes), resource_spans.schema_url)
        for scope_spans in resource_spans.scope_spans:
            scope_pb = scope_spans.scope
            scope = ScopeRecord(
                scope_pb.name, scope_pb.version, _pb_attributes(scope_pb.attributes)
            )
            for span in scope_spans.spans:
                trace_id = span.trace_id
                if len(trace_id) != 16 or trace_id == _ZERO_TRACE_ID:
                    batch.reject(1, MSG_TRACE_ID)
                    continue
                span_id = span.span_id
                if len(span_id) != 8 or span_id == _ZERO_SPAN_ID:
                    batch.reject(1, MSG_SPAN_ID)
                    continue
                parent = span.parent_span_id
                if parent and len(parent) != 8:
                    batch.reject(1, MSG_PARENT_SPAN_ID)
                    continue
                if (
                    span.start_time_unix_nano > _INT64_MAX
                    or span.end_time_unix_nano > _INT64_MAX
                    or any(e.time_unix_nano > _INT64_MAX for e in span.events)
                ):
                    batch.reject(1, MSG_TIME)
                    continue
                links: list[LinkRecord] = []
                if span.links:
                    try:
                        links = [_pb_link(link) for link in span.links]
                    except _Rejected as exc:
                        batch.reject(1, exc.message)
                        continue
                status = span.status
                append(
                    SpanRecord(
                        trace_id.hex(),
                        span_id.hex(),
                        "" if not parent or parent == _ZERO_SPAN_ID else parent.hex(),
                        span.name,
                        span.kind,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        _pb_attributes(span.attributes),
                        status.code,
                        status.message,
                        [
                            SpanEventRecord(e.name, e.time_unix_nano, _pb_attributes(e.attributes))
                            for e in span.events
                        ]
                        if span.events
                        else [],
                        links,
                        resource,
                        scope,
                        span.flags,
                        span.trace_state,
                    )
                )
    return batch


def _pb_link(link: Any) -> LinkRecord:
    trace_id = link.trace_id
    span_id = link.span_id
    if (
        len(trace_id) != 16
        or len(span_id) != 8
        or trace_id == _ZERO_TRACE_ID
        or span_id == _ZERO_SPAN_ID
    ):
        raise _Rejected(MSG_LINK_ID)
    return LinkRecord(
        trace_id.hex(), span_id.hex(), _pb_attributes(link.attributes), link.trace_state
    )


def _pb_attributes(key_values: Iterable[KeyValue]) -> Attributes:
    # Hot path (about 12 attributes per span): scalar values inline, one ``WhichOneof``
    # per value, no call per attribute; nested values go through ``_pb_value``.
    out: Attributes = {}
    for kv in key_values:
        value = kv.value
        which = value.WhichOneof("value")
        if which == "string_value":
            out[kv.key] = value.string_value
        elif which == "int_value":
            out[kv.key] = value.int_value
        elif which == "bool_value":
            out[kv.key] = value.bool_value
        elif which == "double_value":
            out[kv.key] = value.double_value
        else:
            out[kv.key] = _pb_value(value, which)
    return out


def _pb_value(value: AnyValue, which: str | None = None) -> AttrValue:
    if which is None:
        which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "int_value":
        return value.int_value
    if which == "bool_value":
        return value.bool_value
    if which == "double_value":
        return value.double_value
    if which == "array_value":
        return [_pb_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value
    return None


def decode_json(
    body: bytes,
    *,
    transport: str = TRANSPORT_HTTP_JSON,
    rejected_at: list[tuple[str, str]] | None = None,
) -> SpanBatch:
    """Decode an OTLP/JSON ``ExportTraceServiceRequest``.

    Follows the OTLP specification, "JSON Protobuf Encoding": hex ids (any case, stored
    lowercase), lowerCamelCase keys only, unknown fields ignored, 64-bit integers as
    numbers or decimal strings. Enum names are tolerated besides the integers the spec
    mandates.

    Args:
        body: the JSON document (UTF-8, -16 or -32; already decompressed).
        transport: the batch's transport label.
        rejected_at: when given, each refusal is appended as ``(where, message)``, where
            is ``resourceSpans[i]``, ``resourceSpans[i].scopeSpans[j]`` or
            ``resourceSpans[i].scopeSpans[j].spans[k]`` (``loopwatch replay`` names it).

    Returns:
        A batch of the accepted spans; refused spans are counted in
        ``batch.rejected_spans`` with content-free messages.

    Raises:
        DecodeError: not JSON, or the structure above the span level is not an
            ``ExportTraceServiceRequest`` (see the module docstring).

    Example:
        >>> body = (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":'
        ...         b'"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174",'
        ...         b'"name":"x","kind":1}]}]}]}')
        >>> decode_json(body).spans[0].trace_id
        '5b8efff798038103d269b633813fc60c'
    """
    try:
        document = json.loads(body)
    except json.JSONDecodeError as exc:
        raise DecodeError("json", "not valid JSON", offset=exc.pos) from exc
    except (ValueError, RecursionError) as exc:
        raise DecodeError("json", "not valid JSON text") from exc
    if type(document) is not dict:
        raise DecodeError("json", "top-level value is not an object")
    if _SURROGATE_ESCAPE(body) is not None or json.detect_encoding(body) not in (
        "utf-8",
        "utf-8-sig",
    ):
        document = _without_lone_surrogates(document)
    batch = SpanBatch(spans=[], transport=transport)
    located = [] if rejected_at is None else rejected_at
    resources = _json_objects(document.get("resourceSpans"), "resourceSpans")
    for i, resource_spans in enumerate(resources):
        scope_list = [
            (scope_spans, _json_objects(scope_spans.get("spans"), "spans"))
            for scope_spans in _json_objects(resource_spans.get("scopeSpans"), "scopeSpans")
        ]
        try:
            resource = _json_resource(resource_spans)
        except _Rejected:
            batch.reject(sum(len(spans) for _, spans in scope_list), MSG_MALFORMED_RESOURCE)
            located.append((f"resourceSpans[{i}]", MSG_MALFORMED_RESOURCE))
            continue
        for j, (scope_spans, spans) in enumerate(scope_list):
            try:
                scope = _json_scope(scope_spans.get("scope"))
            except _Rejected:
                batch.reject(len(spans), MSG_MALFORMED_RESOURCE)
                located.append((f"resourceSpans[{i}].scopeSpans[{j}]", MSG_MALFORMED_RESOURCE))
                continue
            for k, span in enumerate(spans):
                try:
                    batch.spans.append(_json_span(span, resource, scope))
                except _Rejected as exc:
                    batch.reject(1, exc.message)
                    where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                    located.append((where, exc.message))
    return batch


def _without_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD."""
    kind = type(value)
    if kind is str:
        if value.isascii():
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if kind is list:
        return [_without_lone_surrogates(item) for item in value]
    if kind is dict:
        return {
            _without_lone_surrogates(key): _without_lone_surrogates(item)
            for key, item in value.items()
        }
    return value


def _json_objects(value: Any, field: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if type(value) is not list or any(type(item) is not dict for item in value):
        raise DecodeError("json", f"{field} is not an array of objects")
    return value


def _json_resource(resource_spans: dict[str, Any]) -> ResourceRecord:
    resource = resource_spans.get("resource")
    if resource is None:
        resource = {}
    elif type(resource) is not dict:
        raise _Rejected(MSG_MALFORMED_RESOURCE)
    return ResourceRecord(
        _json_attributes(resource.get("attributes")),
        _json_str(resource_spans.get("schemaUrl")),
    )


def _json_scope(scope: Any) -> ScopeRecord:
    if scope is None:
        return ScopeRecord()
    if type(scope) is not dict:
        raise _Rejected(MSG_MALFORMED_RESOURCE)
    return ScopeRecord(
        _json_str(scope.get("name")),
        _json_str(scope.get("version")),
        _json_attributes(scope.get("attributes")),
    )


def _json_id(value: Any, pattern: Callable[[str], object], zero: str, message: str) -> str:
    """A hex id, lowercased; anything else, or all zeros, rejects the span with ``message``."""
    if type(value) is not str or pattern(value) is None or value.lower() == zero:
        raise _Rejected(message)
    return value.lower()


def _json_span(span: dict[str, Any], resource: ResourceRecord, scope: ScopeRecord) -> SpanRecord:
    trace_id = _json_id(span.get("traceId"), _HEX32, _ZERO_TRACE_HEX, MSG_TRACE_ID)
    span_id = _json_id(span.get("spanId"), _HEX16, _ZERO_SPAN_HEX, MSG_SPAN_ID)
    parent = span.get("parentSpanId")
    if parent is None or parent == "":
        parent = ""
    elif type(parent) is not str or _HEX16(parent) is None:
        raise _Rejected(MSG_PARENT_SPAN_ID)
    else:
        parent = parent.lower()
        if parent == _ZERO_SPAN_HEX:
            parent = ""
    status = span.get("status")
    if status is None:
        status_code, status_message = 0, ""
    elif type(status) is dict:
        status_code = _json_enum(status.get("code"), _STATUS_CODE_NAMES)
        status_message = _json_str(status.get("message"))
    else:
        raise _Rejected(MSG_MALFORMED_SPAN)
    events = span.get("events")
    links = span.get("links")
    return SpanRecord(
        trace_id,
        span_id,
        parent,
        _json_str(span.get("name")),
        _json_enum(span.get("kind"), _SPAN_KIND_NAMES),
        _json_time(span.get("startTimeUnixNano")),
        _json_time(span.get("endTimeUnixNano")),
        _json_attributes(span.get("attributes")),
        status_code,
        status_message,
        [_json_event(event) for event in _json_list(events)] if events else [],
        [_json_link(link) for link in _json_list(links)] if links else [],
        resource,
        scope,
        _json_uint(span.get("flags"), _UINT32_MAX),
        _json_str(span.get("traceState")),
    )


def _json_event(event: Any) -> SpanEventRecord:
    if type(event) is not dict:
        raise _Rejected(MSG_MALFORMED_SPAN)
    return SpanEventRecord(
        _json_str(event.get("name")),
        _json_time(event.get("timeUnixNano")),
        _json_attributes(event.get("attributes")),
    )


def _json_link(link: Any) -> LinkRecord:
    if type(link) is not dict:
        raise _Rejected(MSG_MALFORMED_SPAN)
    return LinkRecord(
        _json_id(link.get("traceId"), _HEX32, _ZERO_TRACE_HEX, MSG_LINK_ID),
        _json_id(link.get("spanId"), _HEX16, _ZERO_SPAN_HEX, MSG_LINK_ID),
        _json_attributes(link.get("attributes")),
        _json_str(link.get("traceState")),
    )


def _json_list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise _Rejected(MSG_MALFORMED_SPAN)
    return value


def _json_str(value: Any) -> str:
    if value is None:
        return ""
    if type(value) is not str:
        raise _Rejected(MSG_MALFORMED_SPAN)
    return value


def _json_uint(value: Any, maximum: int, message: str = MSG_MALFORMED_SPAN) -> int:
    if value is None:
        return 0
    number = _json_integer(value)
    if number < 0 or number > maximum:
        raise _Rejected(message)
    return number


def _json_time(value: Any) -> int:
    return _json_uint(value, _INT64_MAX, MSG_TIME)


def _json_integer(value: Any) -> int:
    kind = type(value)
    if kind is int:
        return value  # type: ignore[no-any-return]
    if kind is str and _INT_STR(value) is not None:
        return int(value)
    if kind is float and value.is_integer():
        return int(value)
    raise _Rejected(MSG_MALFORMED_SPAN)


def _json_enum(value: Any, names: dict[str, int]) -> int:
    if value is None:
        return 0
    if type(value) is int and 0 <= value <= _INT32_MAX:
        return value
    if type(value) is str:
        number = names.get(value)
        if number is not None:
            return number
    raise _Rejected(MSG_MALFORMED_SPAN)


def _json_attributes(value: Any) -> Attributes:
    if value is None:
        return {}
    if type(value) is not list:
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
    return _json_key_values(value, 0)


def _json_key_values(items: list[Any], depth: int) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for item in items:
        if type(item) is not dict:
            raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
        key = item.get("key")
        if type(key) is not str:
            raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
        out[key] = _json_value(item.get("value"), depth)
    return out


def _json_value(value: Any, depth: int) -> AttrValue:
    if value is None:
        return None
    if type(value) is not dict:
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
    for key, raw in value.items():
        convert = _JSON_VALUE_CONVERTERS.get(key)
        if convert is not None and raw is not None:
            return convert(raw, depth)
    return None


def _json_exact(kind: type[str | bool]) -> Callable[[Any, int], AttrValue]:
    """The converter of a value that must already be of type ``kind`` (no coercion)."""

    def convert(raw: Any, depth: int) -> AttrValue:
        if type(raw) is not kind:
            raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
        return raw

    return convert


def _json_int_value(raw: Any, depth: int) -> AttrValue:
    try:
        number = _json_integer(raw)
    except _Rejected:
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES) from None
    if number < _INT64_MIN or number > _INT64_MAX:
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
    return number


def _json_double_value(raw: Any, depth: int) -> AttrValue:
    kind = type(raw)
    if kind is float:
        return raw  # type: ignore[no-any-return]
    if kind is int:
        try:
            return float(raw)
        except OverflowError:  # past the largest double: JSON allows any digits
            raise _Rejected(MSG_MALFORMED_ATTRIBUTES) from None
    if kind is str:
        special = _SPECIAL_FLOATS.get(raw)
        if special is not None:
            return special
        if _FLOAT_STR(raw) is not None:
            return float(raw)
    raise _Rejected(MSG_MALFORMED_ATTRIBUTES)


def _json_bytes_value(raw: Any, depth: int) -> AttrValue:
    if type(raw) is not str:
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
    text = raw.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES) from None


def _json_array_value(raw: Any, depth: int) -> AttrValue:
    values = _json_nested_values(raw, depth)
    return [_json_value(item, depth + 1) for item in values]


def _json_kvlist_value(raw: Any, depth: int) -> AttrValue:
    return _json_key_values(_json_nested_values(raw, depth), depth + 1)


def _json_nested_values(raw: Any, depth: int) -> list[Any]:
    if depth >= MAX_VALUE_DEPTH:
        raise DecodeError("json", f"attribute value nested deeper than {MAX_VALUE_DEPTH}")
    if type(raw) is not dict:
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
    values = raw.get("values")
    if values is None:
        return []
    if type(values) is not list:
        raise _Rejected(MSG_MALFORMED_ATTRIBUTES)
    return values


_JSON_VALUE_CONVERTERS: dict[str, Callable[[Any, int], AttrValue]] = {
    "stringValue": _json_exact(str),
    "intValue": _json_int_value,
    "boolValue": _json_exact(bool),
    "doubleValue": _json_double_value,
    "arrayValue": _json_array_value,
    "kvlistValue": _json_kvlist_value,
    "bytesValue": _json_bytes_value,
}
