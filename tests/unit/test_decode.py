"""Decode stage: OTLP protobuf and OTLP/JSON into typed records (collector/decode.py)."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from loopwatch.collector.decode import (
    MAX_VALUE_DEPTH,
    MSG_LINK_ID,
    MSG_MALFORMED_ATTRIBUTES,
    MSG_MALFORMED_RESOURCE,
    MSG_PARENT_SPAN_ID,
    MSG_SPAN_ID,
    MSG_TRACE_ID,
    decode_json,
    decode_protobuf,
    decompress,
)
from loopwatch.collector.errors import DecodeError, PayloadTooLarge, UnsupportedMediaType
from loopwatch.collector.records import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_INTERNAL,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    STATUS_OK,
    SpanBatch,
)
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
INTERLINGUA = CORPUS / "otlp-genai-interlingua"

TRACE_ID = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b174"
PARENT_ID = "aaa24d5a6cca68bf"
SECRET_NAME = "lw-canary-7f3a-do-not-echo"


def _sdk_spans() -> tuple[ReadableSpan, ...]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("loopwatch.test", "1.2.3")
    with tracer.start_as_current_span("invoke_agent support") as run:
        run.set_attribute("gen_ai.agent.name", "support")
        with tracer.start_as_current_span(
            "execute_tool search_orders",
            kind=SpanKind.CLIENT,
            links=[Link(run.get_span_context(), {"link.kind": "run"})],
            attributes={
                "gen_ai.tool.name": "search_orders",
                "loopwatch.step": 3,
                "loopwatch.cost.usd": 0.25,
                "loopwatch.progress": False,
                "tags": ["a", "b"],
                "steps": [1, 2, 3],
            },
        ) as tool:
            tool.add_event("exception", {"exception.message": "boom", "exception.type": "E"})
            tool.set_status(Status(StatusCode.ERROR, "tool failed"))
        with tracer.start_as_current_span("stop support", kind=SpanKind.SERVER) as stop:
            stop.set_status(Status(StatusCode.OK))
    provider.shutdown()
    return exporter.get_finished_spans()


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def test_protobuf_round_trip_from_the_sdk_exporter_encoder() -> None:
    sdk_spans = _sdk_spans()
    body = encode_spans(sdk_spans).SerializeToString()

    batch = decode_protobuf(body)

    assert batch.transport == "http_protobuf"
    assert batch.rejected_spans == 0
    by_name = {span.name: span for span in batch.spans}
    assert len(by_name) == 3
    for sdk in sdk_spans:
        record = by_name[sdk.name]
        assert record.trace_id == _hex(sdk.context.trace_id, 32)
        assert record.span_id == _hex(sdk.context.span_id, 16)
        assert record.parent_span_id == (_hex(sdk.parent.span_id, 16) if sdk.parent else "")
        assert record.start_unix_nano == sdk.start_time
        assert record.end_unix_nano == sdk.end_time
        assert record.resource.attributes["service.name"] == "agent-svc"
        assert (record.scope.name, record.scope.version) == ("loopwatch.test", "1.2.3")
    tool = by_name["execute_tool search_orders"]
    assert tool.kind == SPAN_KIND_CLIENT
    assert tool.attributes == {
        "gen_ai.tool.name": "search_orders",
        "loopwatch.step": 3,
        "loopwatch.cost.usd": 0.25,
        "loopwatch.progress": False,
        "tags": ["a", "b"],
        "steps": [1, 2, 3],
    }
    assert (tool.status_code, tool.status_message) == (STATUS_ERROR, "tool failed")
    assert [(e.name, e.attributes) for e in tool.events] == [
        ("exception", {"exception.message": "boom", "exception.type": "E"})
    ]
    run = by_name["invoke_agent support"]
    assert len(tool.links) == 1
    assert (tool.links[0].trace_id, tool.links[0].span_id) == (run.trace_id, run.span_id)
    assert tool.links[0].attributes == {"link.kind": "run"}
    assert run.kind == SPAN_KIND_INTERNAL
    assert by_name["stop support"].kind == SPAN_KIND_SERVER
    assert by_name["stop support"].status_code == STATUS_OK


def _kv(key: str, **value: Any) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def _pb_request(*spans: Span, resource_attrs: list[KeyValue] | None = None) -> bytes:
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=PbResource(attributes=resource_attrs or []),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name="s"), spans=list(spans))],
            )
        ]
    )
    body: bytes = request.SerializeToString()
    return body


def _pb_span(
    trace_id: str = TRACE_ID, span_id: str = SPAN_ID, parent: str = "", **fields: Any
) -> Span:
    return Span(
        trace_id=bytes.fromhex(trace_id) if trace_id else b"",
        span_id=bytes.fromhex(span_id) if span_id else b"",
        parent_span_id=bytes.fromhex(parent),
        name=fields.pop("name", "span"),
        **fields,
    )


def test_protobuf_every_any_value_kind() -> None:
    nested = AnyValue(
        kvlist_value=KeyValueList(
            values=[_kv("inner", array_value=ArrayValue(values=[AnyValue(int_value=-5)]))]
        )
    )
    span = _pb_span(
        attributes=[
            _kv("s", string_value="text"),
            _kv("b", bool_value=True),
            _kv("i", int_value=-(2**63)),
            _kv("d", double_value=1.5),
            _kv("raw", bytes_value=b"\x00\xff"),
            KeyValue(key="kv", value=nested),
            KeyValue(key="empty"),
            _kv("strindex", string_value_strindex=7),
        ]
    )
    [record] = decode_protobuf(_pb_request(span)).spans
    assert record.attributes == {
        "s": "text",
        "b": True,
        "i": -(2**63),
        "d": 1.5,
        "raw": b"\x00\xff",
        "kv": {"inner": [-5]},
        "empty": None,
        "strindex": None,
    }


def test_resource_and_scope_records_are_shared_not_copied_per_span() -> None:
    body = _pb_request(
        _pb_span(span_id="0000000000000001"),
        _pb_span(span_id="0000000000000002"),
        resource_attrs=[_kv("service.name", string_value="svc")],
    )
    first, second = decode_protobuf(body).spans
    assert first.resource is second.resource
    assert first.scope is second.scope


BAD_IDS = [
    ("trace id too short", {"trace_id": "5b8efff7"}, MSG_TRACE_ID),
    ("trace id empty", {"trace_id": ""}, MSG_TRACE_ID),
    ("trace id all zero", {"trace_id": "0" * 32}, MSG_TRACE_ID),
    ("span id too long", {"span_id": SPAN_ID + "00"}, MSG_SPAN_ID),
    ("span id empty", {"span_id": ""}, MSG_SPAN_ID),
    ("span id all zero", {"span_id": "0" * 16}, MSG_SPAN_ID),
    ("parent id wrong length", {"parent": "aaaa"}, MSG_PARENT_SPAN_ID),
]


@pytest.mark.parametrize(("case", "ids", "message"), BAD_IDS, ids=[c[0] for c in BAD_IDS])
def test_protobuf_bad_ids_reject_only_that_span(
    case: str, ids: dict[str, str], message: str
) -> None:
    body = _pb_request(_pb_span(name=SECRET_NAME, **ids), _pb_span(span_id=PARENT_ID))
    batch = decode_protobuf(body)
    assert [s.span_id for s in batch.spans] == [PARENT_ID]
    assert batch.rejected_spans == 1
    assert batch.rejection_messages == [message]
    assert SECRET_NAME not in " ".join(batch.rejection_messages)


def test_protobuf_bad_link_id_rejects_the_span() -> None:
    span = _pb_span(links=[Span.Link(trace_id=b"\x01" * 16, span_id=b"\x00" * 8)])
    batch = decode_protobuf(_pb_request(span))
    assert (batch.spans, batch.rejected_spans, batch.rejection_messages) == ([], 1, [MSG_LINK_ID])


def test_all_zero_parent_means_root() -> None:
    [record] = decode_protobuf(_pb_request(_pb_span(parent="0" * 16))).spans
    assert record.parent_span_id == ""


def test_truncated_protobuf_raises_decode_error() -> None:
    body = encode_spans(_sdk_spans()).SerializeToString()
    for cut in range(1, len(body), max(1, len(body) // 97)):
        with pytest.raises(DecodeError) as info:
            decode_protobuf(body[:cut])
        assert info.value.encoding == "protobuf"


def test_empty_protobuf_body_is_an_empty_request() -> None:
    assert decode_protobuf(b"") == SpanBatch(spans=[], transport="http_protobuf")


def _json_request(*spans: Any, resource: Any = None, scope: Any = None) -> bytes:
    resource_spans: dict[str, Any] = {"scopeSpans": [{"spans": list(spans)}]}
    if resource is not None:
        resource_spans["resource"] = resource
    if scope is not None:
        resource_spans["scopeSpans"][0]["scope"] = scope
    return json.dumps({"resourceSpans": [resource_spans]}).encode()


def _json_span(**fields: Any) -> dict[str, Any]:
    return {"traceId": TRACE_ID, "spanId": SPAN_ID, "name": "span", **fields}


def test_json_hex_ids_decode_to_exactly_those_ids() -> None:
    body = _json_request(_json_span(parentSpanId=PARENT_ID))
    [record] = decode_json(body).spans
    assert (record.trace_id, record.span_id, record.parent_span_id) == (
        TRACE_ID,
        SPAN_ID,
        PARENT_ID,
    )


def test_json_hex_ids_are_case_insensitive_and_stored_lowercase() -> None:
    body = _json_request(_json_span(traceId=TRACE_ID.upper(), spanId=SPAN_ID.upper()))
    [record] = decode_json(body).spans
    assert (record.trace_id, record.span_id) == (TRACE_ID, SPAN_ID)


def test_generic_protobuf_json_parse_would_corrupt_the_ids() -> None:
    document = json.loads(_json_request(_json_span()))
    document["resourceSpans"][0]["scopeSpans"][0]["spans"][0].pop("name")
    generic = json_format.ParseDict(document, ExportTraceServiceRequest())
    corrupted = generic.resource_spans[0].scope_spans[0].spans[0].trace_id
    assert corrupted.hex() != TRACE_ID
    assert decode_json(json.dumps(document).encode()).spans[0].trace_id == TRACE_ID


def test_json_field_encodings() -> None:
    span = _json_span(
        kind="SPAN_KIND_SERVER",
        startTimeUnixNano="1788787518970589000",
        endTimeUnixNano=1788787518993675000,
        flags=256,
        traceState="k=v",
        status={"code": "STATUS_CODE_ERROR", "message": "failed"},
        attributes=[
            {"key": "int_as_string", "value": {"intValue": "-9223372036854775808"}},
            {"key": "int_as_number", "value": {"intValue": 42}},
            {"key": "double", "value": {"doubleValue": 0.7}},
            {"key": "double_from_int", "value": {"doubleValue": 2}},
            {"key": "double_nan_string", "value": {"doubleValue": "Infinity"}},
            {"key": "bool", "value": {"boolValue": False}},
            {"key": "bytes", "value": {"bytesValue": base64.b64encode(b"\x00\xfe").decode()}},
            {"key": "array", "value": {"arrayValue": {"values": [{"stringValue": "tool_call"}]}}},
            {
                "key": "kvlist",
                "value": {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}]}},
            },
            {"key": "empty", "value": {}},
            {"key": "null", "value": None},
        ],
        events=[{"name": "e", "timeUnixNano": "5", "attributes": []}],
        links=[{"traceId": TRACE_ID, "spanId": PARENT_ID, "traceState": ""}],
        droppedAttributesCount=3,
    )
    [record] = decode_json(_json_request(span, scope={"name": "sc", "version": "1"})).spans
    assert record.kind == SPAN_KIND_SERVER
    assert (record.start_unix_nano, record.end_unix_nano) == (
        1788787518970589000,
        1788787518993675000,
    )
    assert (record.flags, record.trace_state) == (256, "k=v")
    assert (record.status_code, record.status_message) == (STATUS_ERROR, "failed")
    assert record.attributes == {
        "int_as_string": -(2**63),
        "int_as_number": 42,
        "double": 0.7,
        "double_from_int": 2.0,
        "double_nan_string": float("inf"),
        "bool": False,
        "bytes": b"\x00\xfe",
        "array": ["tool_call"],
        "kvlist": {"a": 1},
        "empty": None,
        "null": None,
    }
    assert [(e.name, e.time_unix_nano) for e in record.events] == [("e", 5)]
    assert (record.links[0].trace_id, record.links[0].span_id) == (TRACE_ID, PARENT_ID)
    assert (record.scope.name, record.scope.version) == ("sc", "1")


def test_json_integer_enums_as_the_spec_mandates() -> None:
    [record] = decode_json(_json_request(_json_span(kind=3, status={"code": 1}))).spans
    assert (record.kind, record.status_code) == (SPAN_KIND_CLIENT, STATUS_OK)


def test_json_snake_case_keys_are_unknown_fields() -> None:
    span = {"trace_id": TRACE_ID, "span_id": SPAN_ID, "name": "x"}
    batch = decode_json(_json_request(span))
    assert (batch.spans, batch.rejected_spans) == ([], 1)
    [record] = decode_json(
        _json_request(_json_span(attributes=[{"key": "k", "value": {"string_value": "v"}}]))
    ).spans
    assert record.attributes == {"k": None}


JSON_BAD_SPANS = [
    ("trace id not hex", {"traceId": "zz" * 16}, MSG_TRACE_ID),
    ("trace id base64", {"traceId": "W47/95gDgQPSabYzgT/GDA=="}, MSG_TRACE_ID),
    ("trace id all zero", {"traceId": "0" * 32}, MSG_TRACE_ID),
    ("trace id with spaces", {"traceId": " " + TRACE_ID[1:]}, MSG_TRACE_ID),
    ("trace id missing", {"traceId": None}, MSG_TRACE_ID),
    ("trace id number", {"traceId": 5}, MSG_TRACE_ID),
    ("span id short", {"spanId": SPAN_ID[:-1]}, MSG_SPAN_ID),
    ("span id all zero", {"spanId": "0" * 16}, MSG_SPAN_ID),
    ("parent id short", {"parentSpanId": "abc"}, MSG_PARENT_SPAN_ID),
    ("link id bad", {"links": [{"traceId": TRACE_ID, "spanId": "xyz"}]}, MSG_LINK_ID),
    ("kind unknown name", {"kind": "SPAN_KIND_SIDEWAYS"}, None),
    ("time not a number", {"startTimeUnixNano": "soon"}, None),
    ("time negative", {"endTimeUnixNano": -1}, None),
    ("time over uint64", {"endTimeUnixNano": str(2**64)}, None),
    ("huge digit string", {"startTimeUnixNano": "9" * 5000}, None),
    ("name not a string", {"name": 7}, None),
    ("int value over int64", {"attributes": [{"key": "k", "value": {"intValue": 2**63}}]}, None),
    (
        "double value past the largest float",
        {"attributes": [{"key": "k", "value": {"doubleValue": 10**400}}]},
        MSG_MALFORMED_ATTRIBUTES,
    ),
    ("bool value as string", {"attributes": [{"key": "k", "value": {"boolValue": "true"}}]}, None),
    ("bytes not base64", {"attributes": [{"key": "k", "value": {"bytesValue": "%%%"}}]}, None),
    ("attributes not a list", {"attributes": {"k": "v"}}, None),
    ("attribute key missing", {"attributes": [{"value": {"stringValue": "v"}}]}, None),
    ("status not an object", {"status": "OK"}, None),
    ("events not a list", {"events": "e"}, None),
]


@pytest.mark.parametrize(
    ("case", "fields", "message"), JSON_BAD_SPANS, ids=[c[0] for c in JSON_BAD_SPANS]
)
def test_json_bad_span_is_rejected_alone(
    case: str, fields: dict[str, Any], message: str | None
) -> None:
    bad = _json_span(**{"name": SECRET_NAME, **fields})
    good = _json_span(spanId=PARENT_ID)
    batch = decode_json(_json_request(bad, good))
    assert [s.span_id for s in batch.spans] == [PARENT_ID]
    assert batch.rejected_spans == 1
    if message is not None:
        assert batch.rejection_messages == [message]
    assert SECRET_NAME not in " ".join(batch.rejection_messages)


def test_json_malformed_resource_rejects_its_spans() -> None:
    body = _json_request(
        _json_span(), _json_span(spanId=PARENT_ID), resource={"attributes": [{"key": 1}]}
    )
    batch = decode_json(body)
    assert (batch.spans, batch.rejected_spans) == ([], 2)


def test_json_refusals_can_be_located() -> None:
    # What ``loopwatch replay`` names in its problems: the refused subtree's place.
    bad_resource = {"resource": {"attributes": [{"key": 1}]}, "scopeSpans": [{"spans": []}]}
    good = {"scopeSpans": [{"spans": [_json_span(traceId="x"), _json_span()]}]}
    bad_scope = {"scopeSpans": [{"scope": "x", "spans": [_json_span()]}]}
    body = json.dumps({"resourceSpans": [bad_resource, good, bad_scope]}).encode()
    located: list[tuple[str, str]] = []
    batch = decode_json(body, rejected_at=located)
    assert [s.span_id for s in batch.spans] == [SPAN_ID]
    assert located == [
        ("resourceSpans[0]", MSG_MALFORMED_RESOURCE),
        ("resourceSpans[1].scopeSpans[0].spans[0]", MSG_TRACE_ID),
        ("resourceSpans[2].scopeSpans[0]", MSG_MALFORMED_RESOURCE),
    ]


JSON_UNDECODABLE = [
    ("not json", b"{nope"),
    ("not utf", b"\xff\xfe\xfa"),
    ("top-level array", b"[]"),
    ("resourceSpans object", b'{"resourceSpans": {}}'),
    ("resourceSpans of strings", b'{"resourceSpans": ["x"]}'),
    ("spans not a list", b'{"resourceSpans": [{"scopeSpans": [{"spans": 1}]}]}'),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000),
    ("huge number", b'{"a": ' + b"9" * 5000 + b"}"),
]


@pytest.mark.parametrize(("case", "body"), JSON_UNDECODABLE, ids=[c[0] for c in JSON_UNDECODABLE])
def test_json_undecodable_body_raises_decode_error(case: str, body: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode_json(body)
    assert info.value.encoding == "json"


def test_json_attribute_nesting_limit() -> None:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(MAX_VALUE_DEPTH + 1):
        value = {"arrayValue": {"values": [value]}}
    with pytest.raises(DecodeError):
        decode_json(_json_request(_json_span(attributes=[{"key": "k", "value": value}])))


def test_json_empty_and_null_requests_are_empty_batches() -> None:
    for body in (b"{}", b'{"resourceSpans": null}', b'{"resourceSpans": []}'):
        assert decode_json(body) == SpanBatch(spans=[], transport="http_json")


def _corpus_file(name: str) -> Path:
    path = INTERLINGUA / name
    if not path.is_file():
        pytest.skip(f"corpus file absent: {path}")
    return path


@pytest.mark.corpus
def test_corpus_openinference_export() -> None:
    batch = decode_json(_corpus_file("testdata__openinference__in.json").read_bytes())
    assert batch.rejected_spans == 0
    [span] = batch.spans
    assert (span.trace_id, span.span_id, span.parent_span_id) == (
        "9ed94f9bdc36b397e11c51f77d49e01a",
        "e9856d6fe698c4f2",
        "",
    )
    assert (span.name, span.kind, span.status_code, span.flags) == (
        "ChatCompletion",
        SPAN_KIND_INTERNAL,
        STATUS_OK,
        256,
    )
    assert span.start_unix_nano == 1788787518970589000
    assert span.attributes["openinference.span.kind"] == "LLM"
    assert span.attributes["llm.token_count.total"] == 439
    assert span.attributes["llm.token_count.prompt"] == 412
    key = "llm.output_messages.0.message.tool_calls.0.tool_call.function"
    assert span.attributes[f"{key}.name"] == "lookup_order"
    assert span.attributes[f"{key}.arguments"] == '{"order_id": "A-1187"}'
    assert span.resource.attributes["telemetry.sdk.version"] == "1.44.0"
    assert (span.scope.name, span.scope.version) == (
        "openinference.instrumentation.openai",
        "0.1.58",
    )


@pytest.mark.corpus
def test_corpus_openllmetry_export() -> None:
    batch = decode_json(_corpus_file("testdata__openllmetry__in.json").read_bytes())
    assert batch.rejected_spans == 0
    chat, workflow = batch.spans
    assert chat.trace_id == workflow.trace_id == "77d66be22a4ffc8149309684b3a319f7"
    assert (chat.span_id, chat.parent_span_id) == ("76a26812b532f640", "aaa24d5a6cca68bf")
    assert (workflow.span_id, workflow.parent_span_id) == ("aaa24d5a6cca68bf", "")
    assert (chat.name, chat.kind) == ("openai.chat", SPAN_KIND_CLIENT)
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.temperature"] == 0.7
    assert chat.attributes["gen_ai.is_streaming"] is False
    assert chat.attributes["gen_ai.usage.input_tokens"] == 412
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["tool_call"]
    parts = json.loads(str(chat.attributes["gen_ai.output.messages"]))[0]["parts"]
    assert parts[0]["name"] == "lookup_order"
    assert workflow.attributes["traceloop.span.kind"] == "workflow"


def _zeros_gzip(size: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    parts = [compressor.compress(block) for _ in range(size >> 20)]
    parts.append(compressor.flush())
    return b"".join(parts)


def test_gzip_bomb_is_refused_without_inflating_past_the_cap() -> None:
    bomb = _zeros_gzip(256 << 20)
    cap = 1 << 20
    assert len(bomb) < cap
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge) as info:
            decompress(bomb, "gzip", max_bytes=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * cap
    assert (info.value.stage, info.value.limit_bytes) == ("decompressed", cap)
    assert info.value.observed_bytes == cap + 1


DECOMPRESS_OK = [
    ("identity", lambda b: b, "identity"),
    ("none", lambda b: b, ""),
    ("gzip", gzip.compress, "gzip"),
    ("gzip upper case", gzip.compress, " GZIP "),
    ("two gzip members", lambda b: gzip.compress(b[:5]) + gzip.compress(b[5:]), "gzip"),
    ("deflate zlib", zlib.compress, "deflate"),
    ("deflate raw", lambda b: zlib.compress(b)[2:-4], "deflate"),
]


@pytest.mark.parametrize(
    ("case", "encode", "coding"), DECOMPRESS_OK, ids=[c[0] for c in DECOMPRESS_OK]
)
def test_decompress_codings(case: str, encode: Any, coding: str) -> None:
    payload = b"otlp payload " * 100
    assert decompress(encode(payload), coding, max_bytes=len(payload)) == payload
    with pytest.raises(PayloadTooLarge):
        decompress(encode(payload), coding, max_bytes=len(payload) - 1)


def test_decompress_refusals() -> None:
    good = gzip.compress(b"x" * 1000)
    with pytest.raises(DecodeError):
        decompress(good[:-8], "gzip", max_bytes=10_000)
    with pytest.raises(DecodeError):
        decompress(b"not gzip at all", "gzip", max_bytes=10_000)
    with pytest.raises(DecodeError):
        decompress(zlib.compress(b"x") + b"junk", "deflate", max_bytes=10_000)
    with pytest.raises(UnsupportedMediaType) as info:
        decompress(good, "br", max_bytes=10_000)
    assert info.value.header == "content-encoding"


_OTLP_KEYS = st.sampled_from(
    [
        "resourceSpans",
        "resource",
        "scopeSpans",
        "scope",
        "spans",
        "traceId",
        "spanId",
        "parentSpanId",
        "name",
        "kind",
        "status",
        "code",
        "message",
        "attributes",
        "key",
        "value",
        "values",
        "stringValue",
        "intValue",
        "doubleValue",
        "boolValue",
        "bytesValue",
        "arrayValue",
        "kvlistValue",
        "events",
        "links",
        "startTimeUnixNano",
        "timeUnixNano",
        "flags",
        "traceState",
    ]
)
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=24)
    | st.sampled_from(
        [TRACE_ID, SPAN_ID, "0" * 32, "SPAN_KIND_SERVER", "STATUS_CODE_OK", "NaN", "-1", "AA=="]
    )
)
_JSON_TREES = st.recursive(
    _LEAVES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(_OTLP_KEYS, children, max_size=6)
    ),
    max_leaves=60,
)


def _wrapped_span(tree: Any) -> Any:
    return {"resourceSpans": [{"scopeSpans": [{"spans": [tree, _json_span()]}]}]}


_FUZZ = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _only_batch_or_decode_error(decode: Any, body: bytes) -> None:
    try:
        batch = decode(body)
    except (DecodeError, PayloadTooLarge):
        return
    assert isinstance(batch, SpanBatch)
    for span in batch.spans:
        assert len(span.trace_id) == 32 and len(span.span_id) == 16
        assert span.parent_span_id == "" or len(span.parent_span_id) == 16


@seed(20261130)
@_FUZZ
@given(tree=st.one_of(_JSON_TREES, _JSON_TREES.map(_wrapped_span)))
def test_fuzz_json_decoder(tree: Any) -> None:
    _only_batch_or_decode_error(decode_json, json.dumps(tree).encode())


@seed(20261130)
@_FUZZ
@given(body=st.binary(max_size=512))
def test_fuzz_decoders_on_random_bytes(body: bytes) -> None:
    _only_batch_or_decode_error(decode_json, body)
    _only_batch_or_decode_error(decode_protobuf, body)
    with contextlib.suppress(DecodeError, PayloadTooLarge):
        decompress(body, "gzip", max_bytes=4096)


_VALID_PROTOBUF = encode_spans(_sdk_spans()).SerializeToString()


@seed(20261130)
@_FUZZ
@given(data=st.data())
def test_fuzz_protobuf_decoder_on_mutated_requests(data: st.DataObject) -> None:
    body = bytearray(_VALID_PROTOBUF)
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(body) - 1))
        body[position] = data.draw(st.integers(0, 255))
    _only_batch_or_decode_error(decode_protobuf, bytes(body))
