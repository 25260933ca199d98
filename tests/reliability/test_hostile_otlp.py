"""Hostile OTLP through the real HTTP server: each input gets a clear 4xx or a documented
handling, the process survives, and a good request sent at the same time is stored.

One ``loopwatch collector`` subprocess serves every case (``sampling.stop_timeout_seconds
= 2`` so the "stop never comes" case is decided quickly). For each case a thread sends the
hostile request while the test sends a good one (a fresh trace); the good one must be
answered 200 and be readable at ``/api/v1/runs/{trace_id}`` (acknowledged after commit).
The collector's peak resident memory is checked after the decompression bombs.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.integration.services import CollectorProcess, poll_until

from .payloads import (
    JSON,
    PROTOBUF,
    PbSpan,
    json_request,
    json_span,
    new_span_id,
    new_trace_id,
    protobuf_request,
    tool_spans,
)
from .support import launch_collector, peak_rss_bytes, rss_bytes

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[sampling]
stop_timeout_seconds = 2
completed_fraction = 1.0
"""
INT64_MAX = 2**63 - 1
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorProcess]:
    tmp = tmp_path_factory.mktemp("hostile")
    process = launch_collector(tmp, db_path=tmp / "hostile.duckdb", config=CONFIG)
    try:
        yield process
        assert process.running, process.stderr_text()
        assert process.get("/healthz").json()["status"] == "ok"
        assert "Traceback" not in process.stderr_text(), process.stderr_text()
    finally:
        if process.running:
            process.stop()


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def partial(self) -> tuple[int, str]:
        """``(rejected_spans, error_message)`` of a protobuf 200 answer."""
        response = ExportTraceServiceResponse()
        response.ParseFromString(self.body)
        return response.partial_success.rejected_spans, response.partial_success.error_message


def _post(url: str, body: bytes, content_type: str, **headers: str) -> Answer:
    with httpx.Client(timeout=60) as http:
        response = http.post(url, content=body, headers={"Content-Type": content_type, **headers})
        return Answer(response.status_code, response.headers, response.content)


def alongside(collector: CollectorProcess, hostile: Callable[[], Answer]) -> Answer:
    """Send ``hostile()`` and, while it is in flight, a good request; check the good one."""
    good = tool_spans(3)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(hostile)
        answer = _post(collector.otlp_url, protobuf_request(good), PROTOBUF)
        result = pending.result(timeout=90)
    assert answer.status == 200, answer.body[:300]
    detail = collector.get(f"/api/v1/runs/{good[0].trace_id}")
    assert detail.status_code == 200, detail.text[:300]
    assert detail.json()["run"]["tool_calls"] == 3
    assert collector.running, collector.stderr_text()
    return result


def _bomb(encoding: str, inflated: int) -> bytes:
    """A stream that inflates to ``inflated`` zero bytes, built in milliseconds.

    After ``Z_FULL_FLUSH`` the compressor forgets its history, so compressing the same
    1 MiB block again yields the same bytes: the block is compressed twice and the second
    output repeated. The trailing checksum is wrong, but the cap trips long before it.
    """
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(MiB)
    first = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    again = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    return first + again * (inflated // MiB - 1) + compressor.flush()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decompression_bomb_is_413_without_inflating(
    collector: CollectorProcess, encoding: str
) -> None:
    """A 1 GiB body of zeros compressed to about 1 MB: 413 from the 64 MiB inflate cap
    (``limits.max_decompressed_bytes``), and the collector's peak memory grows by less than
    the cap plus slack, not by the gigabyte."""
    body = _bomb(encoding, 1024 * MiB)
    assert len(body) < 2 * MiB
    before = peak_rss_bytes(collector.proc.pid)
    answer = alongside(
        collector,
        lambda: _post(collector.otlp_url, body, PROTOBUF, **{"Content-Encoding": encoding}),
    )
    assert answer.status == 413
    assert b"decompressed size exceeds the limit" in answer.body
    assert peak_rss_bytes(collector.proc.pid) - before < 160 * MiB


def test_truncated_and_garbage_protobuf_are_400(collector: CollectorProcess) -> None:
    body = protobuf_request(tool_spans(20))
    for hostile in (body[: len(body) // 2], body[:-3], b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f"):
        answer = alongside(collector, lambda h=hostile: _post(collector.otlp_url, h, PROTOBUF))
        assert answer.status == 400, hostile[:20]
        assert b"not a valid ExportTraceServiceRequest" in answer.body


def test_wrong_ids_are_rejected_per_span_and_the_rest_stored(collector: CollectorProcess) -> None:
    """Odd-length, non-hex and all-zero ids (JSON), and 15-byte and all-zero ids (protobuf):
    200 with ``partial_success`` counting exactly those spans; the valid span of the same
    request is stored."""
    trace = new_trace_id()
    json_spans = [
        json_span(trace_id=trace[:31]),
        json_span(trace_id="g" * 32),
        json_span(trace_id="0" * 32),
        json_span(span_id="0" * 16),
        json_span(span_id="abc"),
        json_span(span_id="x" * 16),
        json_span(parentSpanId="123"),
        json_span(links=[{"traceId": "0" * 32, "spanId": new_span_id()}]),
        json_span(trace_id=trace),
    ]
    answer = alongside(collector, lambda: _post(collector.otlp_url, json_request(json_spans), JSON))
    assert answer.status == 200
    assert answer.json()["partialSuccess"]["rejectedSpans"] == "8"
    assert collector.get(f"/api/v1/runs/{trace}").status_code == 200

    good = PbSpan(attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"})
    bad = [
        PbSpan(raw_trace_id=b"\x01" * 15),
        PbSpan(raw_trace_id=bytes(16)),
        PbSpan(raw_span_id=bytes(8)),
        PbSpan(raw_span_id=b"\x01" * 7),
    ]
    answer = alongside(
        collector, lambda: _post(collector.otlp_url, protobuf_request([*bad, good]), PROTOBUF)
    )
    assert answer.status == 200
    rejected, message = answer.partial()
    assert rejected == len(bad)
    assert "invalid trace id" in message and "invalid span id" in message
    assert collector.get(f"/api/v1/runs/{good.trace_id}").status_code == 200


def test_ten_megabyte_attribute_is_stored_as_sent(collector: CollectorProcess) -> None:
    """Documented handling: a 10 MB string (tool arguments, and an unmapped attribute) is
    accepted and scanned; the body cap (``limits.max_body_bytes``, 20 MiB) bounds it."""
    big = "a" * (10 * 1000 * 1000)
    span = PbSpan(
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "bulk",
            "gen_ai.tool.call.arguments": big,
            "unmapped.blob": big[:1000],
        }
    )
    answer = alongside(
        collector, lambda: _post(collector.otlp_url, protobuf_request([span]), PROTOBUF)
    )
    assert answer.status == 200 and answer.partial() == (0, "")
    detail = collector.get(f"/api/v1/runs/{span.trace_id}").json()
    assert detail["run"]["tool_calls"] == 1


def test_over_the_body_cap_is_413(collector: CollectorProcess) -> None:
    span = PbSpan(attributes={"blob": "b" * (21 * MiB)})
    answer = alongside(
        collector, lambda: _post(collector.otlp_url, protobuf_request([span]), PROTOBUF)
    )
    assert answer.status == 413


def test_hundred_thousand_attributes(collector: CollectorProcess) -> None:
    """Documented handling: accepted (no attribute-count limit; cost is linear)."""
    attrs: dict[str, Any] = {f"k{i}": f"v{i}" for i in range(100_000)}
    attrs.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "wide"})
    span = PbSpan(attributes=attrs)
    answer = alongside(
        collector, lambda: _post(collector.otlp_url, protobuf_request([span]), PROTOBUF)
    )
    assert answer.status == 200 and answer.partial() == (0, "")
    assert collector.get(f"/api/v1/runs/{span.trace_id}").json()["run"]["tool_calls"] == 1


def test_deeply_nested_json_in_a_string_attribute(collector: CollectorProcess) -> None:
    """JSON nested 100,000 deep inside tool arguments and results: accepted; the redactor
    and the fingerprinting treat it as opaque text past their depth limits (no
    RecursionError, no crash). Nested OTLP values past 32 levels are a 400."""
    deep_array = "[" * 100_000 + "]" * 100_000
    deep_object = '{"a":' * 50_000 + "1" + "}" * 50_000
    span = PbSpan(
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "deep",
            "gen_ai.tool.call.arguments": deep_array,
            "gen_ai.tool.call.result": deep_object,
            "input.value": deep_object,
        }
    )
    answer = alongside(
        collector, lambda: _post(collector.otlp_url, protobuf_request([span]), PROTOBUF)
    )
    assert answer.status == 200 and answer.partial() == (0, "")
    assert collector.get(f"/api/v1/runs/{span.trace_id}").status_code == 200

    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(40):
        value = {"arrayValue": {"values": [value]}}
    nested = json_request([json_span(attributes=[{"key": "deep", "value": value}])])
    answer = alongside(collector, lambda: _post(collector.otlp_url, nested, JSON))
    assert answer.status == 400 and "nested deeper" in answer.json()["message"]
    brackets = b'{"resourceSpans":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    answer = alongside(collector, lambda: _post(collector.otlp_url, brackets, JSON))
    assert answer.status == 400


def test_invalid_utf8(collector: CollectorProcess) -> None:
    """Invalid UTF-8 in a protobuf string or a JSON body: 400. Lone surrogates written as
    JSON escapes (valid JSON, not valid Unicode text): accepted, and every API answer
    about the run stays valid JSON."""
    marker = "ZZZZZZZZ"
    pb = protobuf_request([PbSpan(name=marker)]).replace(marker.encode(), b"\xff\xfe\xc3\x28abcd")
    answer = alongside(collector, lambda: _post(collector.otlp_url, pb, PROTOBUF))
    assert answer.status == 400
    js = json_request([json_span(name=marker)]).replace(marker.encode(), b"\xff\xfe\xc3\x28abcd")
    answer = alongside(collector, lambda: _post(collector.otlp_url, js, JSON))
    assert answer.status == 400

    trace = new_trace_id()
    lone = json_span(
        trace_id=trace,
        name="execute_tool lone\ud800",
        attributes=[
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "tool\udc00"}},
            {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": '{"q": "\ud83d"}'}},
            {"key": "key\ud800", "value": {"stringValue": "v\udfff"}},
        ],
    )
    answer = alongside(collector, lambda: _post(collector.otlp_url, json_request([lone]), JSON))
    assert answer.status == 200, answer.body
    assert "partialSuccess" not in answer.json()
    for path in (f"/api/v1/runs/{trace}", "/api/v1/runs", "/api/v1/tools", "/api/v1/stats"):
        response = collector.get(path, since=0)
        assert response.status_code == 200, (path, response.text[:300])
        json.loads(response.text)
    assert collector.get("/metrics").status_code == 200


def test_negative_and_far_future_timestamps(collector: CollectorProcess) -> None:
    """Times past 2^63-1 ns (protobuf ``fixed64``) and negative times (JSON) are refused per
    span with ``partial_success``; 0 and 2^63-1 are accepted. Regression: a span with
    ``start_time_unix_nano = 2^64-1`` failed its whole batch with a retryable 503, so the
    exporter retried it forever (a poison batch) and its good neighbours never landed."""
    ok_zero, ok_max = tool_spans(1)[0], tool_spans(1)[0]
    ok_zero.start = ok_zero.end = 0
    ok_max.start = ok_max.end = INT64_MAX
    far = [PbSpan(start=2**64 - 1, end=2**64 - 1), PbSpan(start=1, end=2**63)]
    event = PbSpan(events=[("exception", {"exception.message": "x"})])
    message = event.message()
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    scope.spans.extend([s.message() for s in (*far, ok_zero, ok_max)])
    message.events[0].time_unix_nano = 2**64 - 1
    scope.spans.append(message)
    body = request.SerializeToString()
    answer = alongside(collector, lambda: _post(collector.otlp_url, body, PROTOBUF))
    assert answer.status == 200
    rejected, text = answer.partial()
    assert rejected == 3 and "invalid time" in text
    for span in (ok_zero, ok_max):
        assert collector.get(f"/api/v1/runs/{span.trace_id}").status_code == 200

    spans = [
        json_span(startTimeUnixNano="-1"),
        json_span(endTimeUnixNano=-5),
        json_span(startTimeUnixNano=str(2**64 - 1)),
        json_span(events=[{"name": "e", "timeUnixNano": str(2**63)}]),
        json_span(),
    ]
    answer = alongside(collector, lambda: _post(collector.otlp_url, json_request(spans), JSON))
    assert answer.status == 200
    assert answer.json()["partialSuccess"]["rejectedSpans"] == "4"


def _loopwatch_span(run_id: str, event: str, step: int, **extra: Any) -> PbSpan:
    attrs: dict[str, Any] = {
        "loopwatch.event": event,
        "loopwatch.run.id": run_id,
        "loopwatch.step": step,
    }
    attrs.update(extra)
    names = {
        "tool_result": "execute_tool lookup",
        "stop": "stop hostile",
        "decision": "decide hostile",
    }
    return PbSpan(name=names[event], attributes=attrs)


def _run_span(agent: str, run_id: str, **extra: Any) -> PbSpan:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "loopwatch.run.id": run_id,
    }
    attrs.update(extra)
    return PbSpan(name=f"invoke_agent {agent}", attributes=attrs)


def _tool(run_id: str, step: int) -> PbSpan:
    return _loopwatch_span(
        run_id,
        "tool_result",
        step,
        **{
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "lookup",
            "loopwatch.tool.outcome": "ok",
        },
    )


def test_run_whose_stop_never_comes_is_decided_after_the_timeout(
    collector: CollectorProcess,
) -> None:
    """Documented handling: steps of a run with no stop are held, then the run is decided
    (sampled or not) once no span came for ``sampling.stop_timeout_seconds``; it is
    listed with no stop reason, and no stop is counted."""
    run_id = f"never-{new_span_id()}"
    spans = [_loopwatch_span(run_id, "decision", 1), _tool(run_id, 1), _tool(run_id, 2)]
    answer = alongside(
        collector, lambda: _post(collector.otlp_url, protobuf_request(spans), PROTOBUF)
    )
    assert answer.status == 200
    first = collector.get(f"/api/v1/runs/{run_id}").json()
    assert first["run"]["sampled"] is None and first["stop"] is None

    def decided() -> dict[str, Any] | None:
        detail: dict[str, Any] = collector.get(f"/api/v1/runs/{run_id}").json()
        return detail if detail["run"]["sampled"] is not None else None

    detail = poll_until(decided, timeout_seconds=20, what="the run decided by timeout")
    assert detail["stop"] is None and detail["run"]["stop_reason"] is None
    assert detail["run"]["tool_calls"] == 2


def test_second_stop_for_the_same_run_is_an_anomaly_counted_once(
    collector: CollectorProcess,
) -> None:
    """Documented handling: the first stop stays the run's stop; a later one of the same
    strength is kept in ``stop_anomalies`` and counted in ``duplicate_stops``; the stop is
    counted once on ``/metrics``."""
    run_id = f"twice-{new_span_id()}"
    agent = f"hostile-{run_id[-6:]}"
    first = _loopwatch_span(
        run_id,
        "stop",
        2,
        **{"loopwatch.stop.reason": "budget_exhausted", "gen_ai.agent.name": agent},
    )
    second = _loopwatch_span(
        run_id,
        "stop",
        3,
        **{"loopwatch.stop.reason": "repeated_action", "gen_ai.agent.name": agent},
    )
    run_span = _run_span(agent, run_id)
    body = protobuf_request([run_span, _tool(run_id, 1), first])
    assert _post(collector.otlp_url, body, PROTOBUF).status == 200
    answer = alongside(
        collector, lambda: _post(collector.otlp_url, protobuf_request([second]), PROTOBUF)
    )
    assert answer.status == 200 and answer.partial() == (0, "")
    detail = collector.get(f"/api/v1/runs/{run_id}").json()
    assert detail["stop"]["reason"] == "budget_exhausted"
    assert [a["reason"] for a in detail["stop_anomalies"]] == ["repeated_action"]
    metrics = collector.metrics()
    assert metrics.total("loopwatch_agent_stops_total", agent=agent) == 1


def test_json_client_text_that_is_not_json_or_too_deep(collector: CollectorProcess) -> None:
    """Stop evidence, observe evidence and limits are JSON by convention but client text:
    evidence nested past the parser's recursion limit (``json.loads`` raises
    ``RecursionError``, not ``ValueError``) or not JSON at all is stored as sent, the run
    detail answers 200 with the raw text, and the loop stop is counted under tool
    ``none``. The deep case answered 500 on the run detail before."""
    deep = "[" * 100_000 + "]" * 100_000
    for label, evidence in (("deep", deep), ("text", "lookup x3 {")):
        run_id = f"evidence-{label}-{new_span_id()}"
        agent = f"hostile-{run_id[-6:]}"
        stop = _loopwatch_span(
            run_id,
            "stop",
            2,
            **{
                "loopwatch.stop.reason": "repeated_action",
                "loopwatch.stop.evidence": evidence,
                "loopwatch.observe.stop_evidence": evidence,
                "gen_ai.agent.name": agent,
            },
        )
        run_span = _run_span(agent, run_id, **{"loopwatch.limits": evidence})
        body = protobuf_request([run_span, _tool(run_id, 1), stop])
        answer = alongside(collector, lambda b=body: _post(collector.otlp_url, b, PROTOBUF))
        assert answer.status == 200 and answer.partial() == (0, ""), label
        response = collector.get(f"/api/v1/runs/{run_id}")
        assert response.status_code == 200, (label, response.text[:300])
        detail = response.json()
        assert detail["evidence"] == evidence and detail["run"]["limits"] == evidence
        metrics = collector.metrics()
        assert (
            metrics.value(
                "loopwatch_loop_detections_total",
                agent=agent,
                tool="none",
                detector="repeated_action",
            )
            == 1
        ), label


def test_memory_after_the_catalogue(collector: CollectorProcess) -> None:
    """The process is still up and its resident memory is bounded after every case above."""
    assert collector.running
    assert rss_bytes(collector.proc.pid) < 1024 * MiB
    assert collector.get("/healthz").json()["status"] == "ok"
