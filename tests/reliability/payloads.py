"""OTLP request builders for the reliability tests (protobuf via opentelemetry-proto, JSON).

Each builder returns the serialized body and the ``(trace_id, span_id)`` hex pairs of the
spans it holds, so a test can check exactly what was stored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def new_trace_id() -> str:
    """32 random hex chars (never all zero)."""
    return (os.urandom(15) + b"\x01").hex()


def new_span_id() -> str:
    """16 random hex chars (never all zero)."""
    return (os.urandom(7) + b"\x01").hex()


def any_value(value: Any) -> AnyValue:
    """An ``AnyValue`` for a str, bool, int, float, bytes, list or dict."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        out = AnyValue()
        out.array_value.values.extend(any_value(v) for v in value)
        return out
    if isinstance(value, dict):
        out = AnyValue()
        out.kvlist_value.values.extend(key_values(value))
        return out
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    """``KeyValue`` list of a mapping."""
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


@dataclass
class PbSpan:
    """One span to put in a protobuf request (ids are hex; ``raw_*`` overrides bytes)."""

    name: str = "execute_tool lookup"
    trace_id: str = field(default_factory=new_trace_id)
    span_id: str = field(default_factory=new_span_id)
    parent_span_id: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    start: int = 1_700_000_000_000_000_000
    end: int = 1_700_000_000_100_000_000
    status_message: str = ""
    events: Sequence[tuple[str, Mapping[str, Any]]] = ()
    raw_trace_id: bytes | None = None
    raw_span_id: bytes | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.trace_id, self.span_id)

    def message(self) -> Span:
        span = Span(
            trace_id=self.raw_trace_id
            if self.raw_trace_id is not None
            else bytes.fromhex(self.trace_id),
            span_id=self.raw_span_id
            if self.raw_span_id is not None
            else bytes.fromhex(self.span_id),
            parent_span_id=bytes.fromhex(self.parent_span_id) if self.parent_span_id else b"",
            name=self.name,
            kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=self.start,
            end_time_unix_nano=self.end,
            status=Status(message=self.status_message),
        )
        span.attributes.extend(key_values(self.attributes))
        for name, attrs in self.events:
            event = span.events.add(name=name, time_unix_nano=self.start)
            event.attributes.extend(key_values(attrs))
        return span


def protobuf_request(spans: Iterable[PbSpan], resource: Mapping[str, Any] | None = None) -> bytes:
    """A serialized ``ExportTraceServiceRequest`` with one resource and one scope."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(key_values(resource or {"service.name": "reliability"}))
    ss = rs.scope_spans.add()
    ss.scope.name = "loopwatch.tests.reliability"
    ss.spans.extend(span.message() for span in spans)
    return request.SerializeToString()


def tool_spans(n: int, *, agent_trace: str | None = None, tool: str = "lookup") -> list[PbSpan]:
    """``n`` GenAI ``execute_tool`` spans under one trace (one third-party run)."""
    trace = agent_trace or new_trace_id()
    return [
        PbSpan(
            name=f"execute_tool {tool}",
            trace_id=trace,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": f"call-{i}",
            },
            start=1_700_000_000_000_000_000 + i * 1000,
            end=1_700_000_000_000_000_500 + i * 1000,
        )
        for i in range(n)
    ]


def json_request(spans: Sequence[Mapping[str, Any]]) -> bytes:
    """An OTLP/JSON body with the given span objects under one resource and scope."""
    doc = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "rel"}}]
                },
                "scopeSpans": [{"scope": {"name": "rel"}, "spans": list(spans)}],
            }
        ]
    }
    return json.dumps(doc).encode()


def json_span(
    trace_id: str | None = None, span_id: str | None = None, **fields: Any
) -> dict[str, Any]:
    """One OTLP/JSON span object (``traceId``/``spanId`` random unless given)."""
    span: dict[str, Any] = {
        "traceId": trace_id if trace_id is not None else new_trace_id(),
        "spanId": span_id if span_id is not None else new_span_id(),
        "name": "execute_tool lookup",
        "kind": 1,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000100000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
        ],
    }
    span.update(fields)
    return span
