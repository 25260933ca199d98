"""Fuzzing the OTLP decoders (``collector/decode.py``) and the pipeline behind them.

Hypothesis (fixed seed, bounded examples) drives three properties:

1. Any bytes, as protobuf or as JSON: the decoder returns a batch or raises
   :class:`DecodeError`, never anything else.
2. Structured OTLP/JSON and protobuf requests with hostile field values (ids of every
   length and case, all-zero ids, times over the whole ``uint64`` range and negative,
   strings with lone surrogates, wrong types): every span is either accepted or counted in
   ``rejected_spans``, and every accepted span satisfies what the store relies on
   (lowercase hex ids of the right length, not all zero; times in ``0..2^63-1``; text
   that encodes to UTF-8).
3. Those accepted batches go through the real pipeline (redact, map, detect, store in a
   real DuckDB file): ``Collector.submit`` never raises, so no input can become a poison
   batch that is refused with a retryable 503 forever.

Atheris (coverage-guided, libFuzzer) runs the same decoder contract for a bounded number
of inputs in a subprocess when it is installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from loopwatch.collector.config import load_config
from loopwatch.collector.decode import decode_json, decode_protobuf
from loopwatch.collector.errors import DecodeError
from loopwatch.collector.records import SpanBatch
from loopwatch.collector.service import Collector
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import slow_enabled

INT64_MAX = 2**63 - 1
EXAMPLES = 2000 if slow_enabled() else 150
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HERE = Path(__file__).resolve().parent
ACCEPTED: list[int] = []
"""Spans accepted per checked batch (the structured tests assert they accept some)."""


def check_batch(batch: SpanBatch, total: int | None = None) -> None:
    """What the later stages rely on, for every accepted span."""
    ACCEPTED.append(len(batch.spans))
    for span in batch.spans:
        assert len(span.trace_id) == 32 and span.trace_id == span.trace_id.lower()
        int(span.trace_id, 16)
        assert span.trace_id != "0" * 32
        assert len(span.span_id) == 16 and span.span_id != "0" * 16
        int(span.span_id, 16)
        assert span.parent_span_id == "" or len(span.parent_span_id) == 16
        assert 0 <= span.start_unix_nano <= INT64_MAX
        assert 0 <= span.end_unix_nano <= INT64_MAX
        for event in span.events:
            assert 0 <= event.time_unix_nano <= INT64_MAX
        for text in (span.name, span.status_message, span.trace_state, *span.attributes):
            text.encode("utf-8")
        json.dumps(span.attributes, default=repr).encode("utf-8")
    if total is not None:
        assert len(batch.spans) + batch.rejected_spans == total


@FUZZ_SETTINGS
@seed(7)
@given(st.binary(max_size=2048))
def test_any_bytes_as_protobuf(body: bytes) -> None:
    try:
        batch = decode_protobuf(body)
    except DecodeError:
        return
    check_batch(batch)


@FUZZ_SETTINGS
@seed(7)
@given(
    st.binary(max_size=2048)
    | st.text(max_size=512).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_as_json(body: bytes) -> None:
    try:
        batch = decode_json(body)
    except DecodeError:
        return
    check_batch(batch)


# ------------------------------------------------------------------ structured

hostile_ids = st.one_of(
    st.text("0123456789abcdefABCDEF", min_size=0, max_size=34),
    st.sampled_from(["0" * 32, "0" * 16, "g" * 32, "-" * 16, ""]),
    st.integers(),
    st.none(),
)


def _hex(size: int) -> st.SearchStrategy[str]:
    valid = st.binary(min_size=size, max_size=size).map(bytes.hex)
    return st.one_of(valid, valid.map(str.upper), valid, hostile_ids)


trace_ids = _hex(16)  # three in four valid, in either case
span_ids = _hex(8)
parent_ids = st.one_of(st.just(""), st.none(), span_ids)
SEMCONV_KEYS = [
    "gen_ai.operation.name",
    "gen_ai.tool.name",
    "gen_ai.agent.name",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "loopwatch.event",
    "loopwatch.run.id",
    "loopwatch.step",
    "loopwatch.stop.reason",
    "loopwatch.stop.evidence",
    "loopwatch.tool.outcome",
    "loopwatch.usage.tokens",
    "loopwatch.cost.usd",
    "loopwatch.limits",
    "input.value",
    "openinference.span.kind",
]
hostile_text = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=40),
    st.text(
        st.sampled_from(["\ud800", "\udfff", "a", "\x00", "\u202e", "\U0001f600", '"', "\\"]),
        max_size=6,
    ),
)  # lone surrogates, NUL, bidi override, astral, quotes
times = st.one_of(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**63 - 1).map(str),
    st.integers(min_value=-(2**64), max_value=2**65),
    st.integers(min_value=0, max_value=2**64 - 1).map(str),
    st.sampled_from(["-1", "1e3", "abc", "18446744073709551615", "9223372036854775808"]),
    st.floats(allow_nan=True),
    st.none(),
)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), hostile_text)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """OTLP/JSON ``arrayValue`` and ``kvlistValue`` holding ``inner`` values."""
    return st.one_of(
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(inner, max_size=3)),
        st.builds(
            lambda kvs: {"kvlistValue": {"values": kvs}},
            st.lists(st.fixed_dictionaries({"key": hostile_text, "value": inner}), max_size=3),
        ),
    )


any_value = st.recursive(
    st.one_of(
        st.builds(lambda v: {"stringValue": v}, hostile_text | json_scalar),
        st.builds(lambda v: {"intValue": v}, st.integers() | st.text(max_size=22) | json_scalar),
        st.builds(
            lambda v: {"doubleValue": v}, st.floats() | st.sampled_from(["NaN", "-Infinity", "x"])
        ),
        st.builds(lambda v: {"boolValue": v}, json_scalar),
        st.builds(lambda v: {"bytesValue": v}, st.text(max_size=20)),
        json_scalar,
    ),
    _containers,
    max_leaves=8,
)
attributes = st.one_of(
    st.lists(
        st.fixed_dictionaries({"key": hostile_text | json_scalar, "value": any_value}), max_size=4
    ),
    json_scalar,
)
semconv_attributes = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(SEMCONV_KEYS),
            "value": any_value,
        }
    ),
    max_size=6,
)
json_spans = st.fixed_dictionaries(
    {"traceId": trace_ids, "spanId": span_ids},
    optional={
        "parentSpanId": parent_ids,
        "name": hostile_text | json_scalar,
        "kind": st.one_of(st.integers(-3, 2**32), st.sampled_from(["SPAN_KIND_SERVER", "NOPE"])),
        "startTimeUnixNano": times,
        "endTimeUnixNano": times,
        "attributes": semconv_attributes | attributes,
        "status": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"code": st.integers(-1, 5), "message": hostile_text}
            ),
            json_scalar,
        ),
        "events": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "name": hostile_text,
                        "timeUnixNano": times,
                        "attributes": attributes,
                    },
                ),
                max_size=2,
            ),
            json_scalar,
        ),
        "links": st.lists(
            st.fixed_dictionaries(
                {"traceId": trace_ids, "spanId": span_ids}, optional={"attributes": attributes}
            ),
            max_size=2,
        ),
        "flags": times,
        "traceState": hostile_text | json_scalar,
    },
)
# Well-typed spans whose values are still hostile (lone surrogates, control characters,
# boundary and special numbers, deep nesting up to the limit, semconv keys with odd values).
valid_time = st.one_of(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**63 - 1).map(str),
    st.sampled_from([0, 2**63 - 1, "9223372036854775807"]),
)
typed_value = st.recursive(
    st.one_of(
        st.builds(lambda v: {"stringValue": v}, hostile_text),
        st.builds(lambda v: {"intValue": v}, st.integers(-(2**63), 2**63 - 1)),
        st.builds(lambda v: {"intValue": str(v)}, st.integers(-(2**63), 2**63 - 1)),
        st.builds(
            lambda v: {"doubleValue": v},
            st.floats() | st.sampled_from(["NaN", "Infinity", "-Infinity"]),
        ),
        st.builds(lambda v: {"boolValue": v}, st.booleans()),
        st.builds(
            lambda v: {"bytesValue": __import__("base64").b64encode(v).decode()},
            st.binary(max_size=20),
        ),
    ),
    _containers,
    max_leaves=8,
)
typed_attributes = st.lists(
    st.fixed_dictionaries(
        {"key": st.sampled_from(SEMCONV_KEYS) | hostile_text, "value": typed_value}
    ),
    max_size=6,
)


def _nonzero(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] | 1])


def _attr(key: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return values.map(lambda v: {"key": key, "value": v})


def _strings(*choices: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.sampled_from(choices), hostile_text).map(lambda v: {"stringValue": v})


# Attributes the map stage acts on, with the values that make it act, and hostile text
# where a name or id goes (so hostile values reach the store's keys and labels).
semantic_attributes = st.lists(
    st.one_of(
        _attr("gen_ai.operation.name", _strings("execute_tool", "invoke_agent", "chat")),
        _attr("gen_ai.tool.name", _strings("lookup")),
        _attr("gen_ai.agent.name", _strings("agent")),
        _attr("gen_ai.tool.call.arguments", _strings('{"q": 1}', "[[[[", '{"a": "\\ud800"}')),
        _attr("gen_ai.tool.call.result", _strings('{"ok": true}')),
        _attr("loopwatch.event", _strings("decision", "tool_result", "stop")),
        _attr("loopwatch.run.id", _strings("run-1", "run-2")),
        _attr("loopwatch.step", st.integers(-(2**63), 2**63 - 1).map(lambda v: {"intValue": v})),
        _attr("loopwatch.stop.reason", _strings("completed", "repeated_action", "bogus")),
        _attr("loopwatch.stop.evidence", _strings('{"tool": "lookup"}', "{")),
        _attr("loopwatch.tool.outcome", _strings("ok", "error", "blocked")),
        _attr("loopwatch.decision.type", _strings("tool", "final", "message")),
        _attr("loopwatch.usage.tokens", typed_value),
        _attr("loopwatch.cost.usd", typed_value),
        _attr("loopwatch.limits", _strings('{"max_model_turns": {"value": 3}}')),
        _attr("openinference.span.kind", _strings("TOOL", "AGENT", "LLM")),
        _attr("input.value", _strings("{}")),
    ),
    max_size=10,
)
genai_tool_attributes = st.builds(
    lambda tool, agent, extra: [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": tool}},
        {"key": "gen_ai.agent.name", "value": {"stringValue": agent}},
        *extra,
    ],
    hostile_text,
    hostile_text,
    semantic_attributes,
)
loopwatch_attributes = st.builds(
    lambda event, run_id, extra: [
        {"key": "loopwatch.event", "value": {"stringValue": event}},
        {"key": "loopwatch.run.id", "value": {"stringValue": run_id}},
        *extra,
    ],
    st.sampled_from(["decision", "tool_result", "stop"]),
    hostile_text,
    semantic_attributes,
)
valid_ids = st.binary(min_size=16, max_size=16).map(_nonzero).map(bytes.hex)
valid_span_ids = st.binary(min_size=8, max_size=8).map(_nonzero).map(bytes.hex)
typed_spans = st.fixed_dictionaries(
    {"traceId": valid_ids, "spanId": valid_span_ids},
    optional={
        "parentSpanId": st.one_of(st.just(""), valid_span_ids),
        "name": hostile_text,
        "kind": st.integers(0, 5),
        "startTimeUnixNano": valid_time,
        "endTimeUnixNano": valid_time,
        "attributes": st.one_of(
            genai_tool_attributes, loopwatch_attributes, semantic_attributes, typed_attributes
        ),
        "status": st.fixed_dictionaries(
            {}, optional={"code": st.integers(0, 2), "message": hostile_text}
        ),
        "events": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": hostile_text,
                    "timeUnixNano": valid_time,
                    "attributes": typed_attributes,
                },
            ),
            max_size=2,
        ),
        "links": st.lists(
            st.fixed_dictionaries(
                {"traceId": valid_ids, "spanId": valid_span_ids},
                optional={"attributes": typed_attributes},
            ),
            max_size=2,
        ),
        "traceState": hostile_text,
    },
)
json_documents = st.builds(
    lambda spans, resource: {
        "resourceSpans": [
            {
                "resource": {"attributes": resource},
                "scopeSpans": [{"scope": {"name": "fuzz"}, "spans": spans}],
            }
        ]
    },
    st.lists(st.one_of(typed_spans, typed_spans, json_spans), min_size=1, max_size=6),
    st.one_of(typed_attributes, typed_attributes, typed_attributes, attributes),
)


def _dump(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=True, allow_nan=True).encode("ascii")


@FUZZ_SETTINGS
@seed(7)
@given(json_documents)
def _fuzz_structured_json(document: dict[str, Any]) -> None:
    try:
        batch = decode_json(_dump(document))
    except DecodeError:
        return
    check_batch(batch, total=len(document["resourceSpans"][0]["scopeSpans"][0]["spans"]))


hostile_bytes = st.one_of(
    st.binary(min_size=0, max_size=17), st.sampled_from([bytes(16), bytes(8)])
)
trace_bytes = st.one_of(
    st.binary(min_size=16, max_size=16).map(_nonzero),
    st.binary(min_size=16, max_size=16).map(_nonzero),
    hostile_bytes,
)
span_bytes = st.one_of(
    st.binary(min_size=8, max_size=8).map(_nonzero),
    st.binary(min_size=8, max_size=8).map(_nonzero),
    hostile_bytes,
)
parent_bytes = st.one_of(st.just(b""), span_bytes)
uint64 = st.integers(min_value=0, max_value=2**64 - 1)
span_times = st.one_of(*[st.integers(0, 2**63 - 1)] * 3, uint64)


@st.composite
def protobuf_requests(draw: st.DrawFn) -> tuple[bytes, int]:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    n = draw(st.integers(1, 6))
    for _ in range(n):
        span = scope.spans.add()
        span.trace_id = draw(trace_bytes)
        span.span_id = draw(span_bytes)
        span.parent_span_id = draw(parent_bytes)
        span.name = draw(st.text(max_size=30))
        span.start_time_unix_nano = draw(span_times)
        span.end_time_unix_nano = draw(span_times)
        for key in draw(
            st.lists(
                st.sampled_from(
                    [
                        "gen_ai.operation.name",
                        "gen_ai.tool.name",
                        "loopwatch.event",
                        "loopwatch.run.id",
                        "loopwatch.step",
                        "loopwatch.stop.reason",
                        "x",
                    ]
                ),
                max_size=4,
            )
        ):
            kv = span.attributes.add(key=key)
            choice = draw(st.integers(0, 3))
            if choice == 0:
                kv.value.string_value = draw(
                    st.sampled_from(
                        ["execute_tool", "invoke_agent", "stop", "tool_result", "r1", ""]
                    )
                    | st.text(max_size=10)
                )
            elif choice == 1:
                kv.value.int_value = draw(st.integers(-(2**63), 2**63 - 1))
            elif choice == 2:
                kv.value.double_value = draw(st.floats())
            else:
                kv.value.bytes_value = draw(st.binary(max_size=10))
        for _ in range(draw(st.integers(0, 2))):
            span.events.add(name=draw(st.text(max_size=8)), time_unix_nano=draw(span_times))
        for _ in range(draw(st.integers(0, 1))):
            span.links.add(trace_id=draw(trace_bytes), span_id=draw(span_bytes))
    return request.SerializeToString(), n


@FUZZ_SETTINGS
@seed(7)
@given(protobuf_requests())
def _fuzz_structured_protobuf(request: tuple[bytes, int]) -> None:
    body, total = request
    check_batch(decode_protobuf(body), total=total)


def test_structured_json_requests() -> None:
    ACCEPTED.clear()
    _fuzz_structured_json()
    assert sum(ACCEPTED) > EXAMPLES / 2, "the strategy hardly produces acceptable spans"


def test_structured_protobuf_requests() -> None:
    ACCEPTED.clear()
    _fuzz_structured_protobuf()
    assert sum(ACCEPTED) > EXAMPLES / 2, "the strategy hardly produces acceptable spans"


# --------------------------------------------------------------- whole pipeline


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    db = tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb"
    # Every completed run kept: the sampling quota write is where hostile tool names landed.
    config = load_config(
        environ={},
        overrides={"store": {"db": str(db)}, "sampling": {"completed_fraction": 1.0}},
    )
    instance = Collector(config)
    try:
        yield instance
    finally:
        instance.close()


PIPELINE_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@PIPELINE_SETTINGS
@seed(11)
@given(json_documents)
def test_pipeline_never_fails_a_decoded_json_batch(
    collector: Collector, document: dict[str, Any]
) -> None:
    """Regression kind: lone surrogates (``\\ud800`` escapes) and times past 2^63-1 ns failed
    the DuckDB write and were answered 503 forever."""
    try:
        batch = decode_json(_dump(document))
    except DecodeError:
        return
    if batch.spans:
        asyncio.run(collector.submit(batch))


@PIPELINE_SETTINGS
@seed(11)
@given(protobuf_requests())
def test_pipeline_never_fails_a_decoded_protobuf_batch(
    collector: Collector, request: tuple[bytes, int]
) -> None:
    batch = decode_protobuf(request[0])
    if batch.spans:
        asyncio.run(collector.submit(batch))


def test_regression_inputs_through_the_pipeline(collector: Collector) -> None:
    """The inputs that failed, kept: each is accepted and committed."""
    lone = json.dumps(
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": "1" * 32,
                                    "spanId": "2" * 16,
                                    "name": "execute_tool x\ud800",
                                    "attributes": [
                                        {
                                            "key": "gen_ai.operation.name",
                                            "value": {"stringValue": "execute_tool"},
                                        },
                                        {
                                            "key": "gen_ai.tool.name",
                                            "value": {"stringValue": "t\udc00"},
                                        },
                                    ],
                                }
                            ]
                        }
                    ]
                }
            ]
        }
    ).encode()
    batch = decode_json(lone)
    assert batch.spans[0].name == "execute_tool x\ufffd"
    asyncio.run(collector.submit(batch))
    # Found by the fuzz above: a map or list where the map stage expects a string
    # (``gen_ai.operation.name``, ``llm.request.type``) raised TypeError (unhashable).
    for key in ("gen_ai.operation.name", "llm.request.type", "openinference.span.kind"):
        for value in ({"kvlistValue": {"values": []}}, {"arrayValue": {"values": []}}):
            body = _dump(
                {
                    "resourceSpans": [
                        {
                            "scopeSpans": [
                                {
                                    "spans": [
                                        {
                                            "traceId": "5" * 32,
                                            "spanId": "6" * 16,
                                            "attributes": [{"key": key, "value": value}],
                                        }
                                    ]
                                }
                            ]
                        }
                    ]
                }
            )
            asyncio.run(collector.submit(decode_json(body)))
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id = b"\x03" * 16, b"\x04" * 8
    span.start_time_unix_nano = span.end_time_unix_nano = 2**64 - 1
    batch = decode_protobuf(request.SerializeToString())
    assert not batch.spans and batch.rejected_spans == 1


# ------------------------------------------------------------------------ atheris


def test_atheris_decoder_contract() -> None:
    """libFuzzer-guided inputs (atheris) against both decoders: only ``DecodeError``."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        pytest.skip("atheris is not installed (pip install atheris; x86_64 wheels on PyPI)")
    runs = 200_000 if slow_enabled() else 6_000
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "atheris_decode.py"),
            f"-runs={runs}",
            "-seed=7",
            "-max_len=4096",
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONPATH": str(HERE.parents[1])},
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "Done" in done.stderr, done.stderr[-2000:]
