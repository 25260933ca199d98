"""OTLP/HTTP receiver on a real uvicorn server (collector/receive_http.py).

Clients: the OpenTelemetry Python SDK's ``OTLPSpanExporter`` (http/protobuf) and raw httpx
requests. ``submit`` is a real in-memory commit queue: a bounded count of uncommitted
batches, drained by a consumer thread that "commits" (appends) and then resolves the
request's future, so every 200 below is an ack after commit.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import queue
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from google.rpc.status_pb2 import Status as RpcStatus
from loopwatch.collector.errors import QueueFull
from loopwatch.collector.receive import InMemoryReceiverCounters
from loopwatch.collector.receive_http import OtlpServer, create_otlp_app
from loopwatch.collector.records import SpanBatch, SpanRecord
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette

TRACE_ID = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b174"
TOKEN = "lw-test-token-5e1f"
PROTOBUF = "application/x-protobuf"


class InMemoryCommitQueue:
    """``submit`` for tests: at most ``capacity`` uncommitted batches, one committer thread.

    ``pause()`` holds commits (the queue fills up); ``resume()`` lets them through. Spans
    named in ``refuse_names`` are refused by "a later stage" via ``batch.reject``.
    """

    def __init__(self, capacity: int = 8, refuse_names: frozenset[str] = frozenset()) -> None:
        self.capacity = capacity
        self.refuse_names = refuse_names
        self.committed: list[SpanRecord] = []
        self._pending = 0
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._commit_loop, daemon=True)
        self._thread.start()

    async def submit(self, batch: SpanBatch) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._pending >= self.capacity:
                raise QueueFull(capacity=self.capacity, retry_after_seconds=1)
            self._pending += 1
        refused = [s for s in batch.spans if s.name in self.refuse_names]
        if refused:
            batch.spans = [s for s in batch.spans if s.name not in self.refuse_names]
            batch.reject(len(refused), "span refused by policy")
        self._work.put((batch, loop, done))
        await done

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.set()
        self._work.put(None)
        self._thread.join(5)

    def _commit_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            self._open.wait()
            batch, loop, done = item
            with self._lock:
                self.committed.extend(batch.spans)
                self._pending -= 1
            loop.call_soon_threadsafe(_resolve, done)

    def committed_ids(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(s.trace_id, s.span_id) for s in self.committed]


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


@contextmanager
def running(app: Starlette) -> Iterator[OtlpServer]:
    server = OtlpServer(app, port=0).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def commits() -> Iterator[InMemoryCommitQueue]:
    pipeline = InMemoryCommitQueue()
    yield pipeline
    pipeline.close()


@pytest.fixture
def counters() -> InMemoryReceiverCounters:
    return InMemoryReceiverCounters()


@pytest.fixture
def server(
    commits: InMemoryCommitQueue, counters: InMemoryReceiverCounters
) -> Iterator[OtlpServer]:
    app = create_otlp_app(
        commits.submit,
        max_body_bytes=64 * 1024,
        max_decompressed_bytes=256 * 1024,
        counters=counters,
    )
    with running(app) as srv:
        yield srv


def _sdk_spans(count: int = 3) -> tuple[ReadableSpan, ...]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("loopwatch.test")
    with tracer.start_as_current_span("invoke_agent support"):
        for step in range(1, count):
            with tracer.start_as_current_span(
                "execute_tool search_orders",
                attributes={"gen_ai.tool.name": "search_orders", "loopwatch.step": step},
            ):
                pass
    provider.shutdown()
    return exporter.get_finished_spans()


def _ids(spans: tuple[ReadableSpan, ...]) -> list[tuple[str, str]]:
    return [(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")) for s in spans]


def _json_body(*span_ids: str, trace_id: str = TRACE_ID, name: str = "span") -> bytes:
    spans = [{"traceId": trace_id, "spanId": sid, "name": name, "kind": 1} for sid in span_ids]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


def _post(server: OtlpServer, body: Any, **headers: str) -> httpx.Response:
    merged = {"Content-Type": "application/json", **headers}
    return httpx.post(f"{server.url}/v1/traces", content=body, headers=merged, timeout=10)


def _rpc_status(response: httpx.Response) -> RpcStatus:
    assert response.headers["content-type"] == PROTOBUF
    return RpcStatus.FromString(response.content)


def test_server_binds_loopback_and_reports_port_zero_choice(server: OtlpServer) -> None:
    assert server.host == "127.0.0.1"
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_sdk_otlp_exporter_round_trip(
    server: OtlpServer,
    commits: InMemoryCommitQueue,
    counters: InMemoryReceiverCounters,
    compression: Compression,
) -> None:
    spans = _sdk_spans(4)
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", compression=compression)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert sorted(commits.committed_ids()) == sorted(_ids(spans))
    tool = next(s for s in commits.committed if s.name == "execute_tool search_orders")
    assert tool.attributes["gen_ai.tool.name"] == "search_orders"
    assert counters.received == {"http_protobuf": 4}
    assert counters.rejected == {}


def test_sdk_exporter_with_bearer_token(commits: InMemoryCommitQueue) -> None:
    app = create_otlp_app(commits.submit, token=TOKEN)
    spans = _sdk_spans(2)
    with running(app) as srv:
        good = OTLPSpanExporter(
            endpoint=f"{srv.url}/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        bad = OTLPSpanExporter(endpoint=f"{srv.url}/v1/traces")
        try:
            assert bad.export(spans) == SpanExportResult.FAILURE
            assert commits.committed == []
            assert good.export(spans) == SpanExportResult.SUCCESS
        finally:
            good.shutdown()
            bad.shutdown()
    assert sorted(commits.committed_ids()) == sorted(_ids(spans))


def test_json_with_known_hex_ids_and_charset(
    server: OtlpServer, commits: InMemoryCommitQueue, counters: InMemoryReceiverCounters
) -> None:
    response = _post(
        server,
        _json_body(SPAN_ID, trace_id=TRACE_ID.upper()),
        **{"Content-Type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {}
    assert commits.committed_ids() == [(TRACE_ID, SPAN_ID)]
    assert counters.received == {"http_json": 1}


@pytest.mark.parametrize("media_type", ["application/json", PROTOBUF])
def test_gzip_request_bodies(
    server: OtlpServer, commits: InMemoryCommitQueue, media_type: str
) -> None:
    if media_type == PROTOBUF:
        spans = _sdk_spans(3)
        body = encode_spans(spans).SerializeToString()
        expected = _ids(spans)
    else:
        body = _json_body(SPAN_ID)
        expected = [(TRACE_ID, SPAN_ID)]
    response = _post(
        server,
        gzip.compress(body),
        **{"Content-Type": media_type, "Content-Encoding": "gzip"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == media_type
    assert sorted(commits.committed_ids()) == sorted(expected)


def test_chunked_body_without_content_length(
    server: OtlpServer, commits: InMemoryCommitQueue
) -> None:
    body = _json_body(SPAN_ID, "0000000000000002")
    sent_headers: list[httpx.Headers] = []

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    with httpx.Client(event_hooks={"request": [lambda r: sent_headers.append(r.headers)]}) as c:
        response = c.post(
            f"{server.url}/v1/traces",
            content=chunks(),
            headers={"Content-Type": "application/json"},
        )
    assert "content-length" not in sent_headers[0]
    assert sent_headers[0]["transfer-encoding"] == "chunked"
    assert response.status_code == 200
    assert len(commits.committed) == 2


def test_413_for_declared_streamed_and_inflated_oversize(
    server: OtlpServer, commits: InMemoryCommitQueue, counters: InMemoryReceiverCounters
) -> None:
    declared = _post(server, b"x" * (64 * 1024 + 1), **{"Content-Type": PROTOBUF})
    assert declared.status_code == 413
    assert "65536" in _rpc_status(declared).message

    def endless() -> Iterator[bytes]:
        for _ in range(1024):
            yield b"x" * 4096

    streamed = _post(server, endless())
    assert streamed.status_code == 413
    assert streamed.json()["message"] == "body size exceeds the limit of 65536 bytes"

    bomb = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    payload = bomb.compress(bytes(64 << 20)) + bomb.flush()
    assert len(payload) < 64 * 1024
    inflated = _post(server, payload, **{"Content-Encoding": "gzip"})
    assert inflated.status_code == 413
    assert "decompressed" in inflated.json()["message"]

    assert commits.committed == []
    assert counters.refused == {"payload_too_large": 3}


def test_415_for_other_media_types_and_codings(server: OtlpServer) -> None:
    response = _post(server, b"{}", **{"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert response.headers["content-type"] == "application/json"
    assert "text/plain" in response.json()["message"]

    missing = httpx.post(f"{server.url}/v1/traces", content=b"{}", timeout=10)
    assert missing.status_code == 415

    coding = _post(server, b"{}", **{"Content-Encoding": "br"})
    assert coding.status_code == 415
    assert "gzip" in coding.headers["accept-encoding"]


def test_400_status_body_in_the_request_encoding(
    server: OtlpServer, commits: InMemoryCommitQueue, counters: InMemoryReceiverCounters
) -> None:
    protobuf = _post(server, b"\x0a\xff\xff\xff", **{"Content-Type": PROTOBUF})
    assert protobuf.status_code == 400
    status = _rpc_status(protobuf)
    assert status.code == 3
    assert "protobuf" in status.message

    as_json = _post(server, b'{"resourceSpans": [')
    assert as_json.status_code == 400
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json()["code"] == 3

    corrupt_gzip = _post(server, b"\x1f\x8b garbage", **{"Content-Encoding": "gzip"})
    assert corrupt_gzip.status_code == 400

    assert commits.committed == []
    assert counters.refused == {"decode_error": 3}


def test_401_without_the_right_bearer_token(commits: InMemoryCommitQueue) -> None:
    counters = InMemoryReceiverCounters()
    app = create_otlp_app(commits.submit, token=TOKEN, counters=counters)
    body = _json_body(SPAN_ID)
    with running(app) as srv:
        refused = [
            _post(srv, body),
            _post(srv, body, Authorization="Bearer wrong-token"),
            _post(srv, body, Authorization=f"Basic {TOKEN}"),
            _post(srv, body, Authorization=f"Bearer {TOKEN}x"),
            _post(srv, body, Authorization="Bearer"),
        ]
        accepted = _post(srv, body, Authorization=f"bearer {TOKEN}")
    for response in refused:
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in response.text
    assert accepted.status_code == 200
    assert commits.committed_ids() == [(TRACE_ID, SPAN_ID)]
    assert counters.refused == {"unauthorized": 5}


@pytest.mark.parametrize("status_code", [429, 503])
def test_queue_full_answers_retry_after_and_ack_waits_for_commit(status_code: int) -> None:
    pipeline = InMemoryCommitQueue(capacity=1)
    counters = InMemoryReceiverCounters()
    app = create_otlp_app(pipeline.submit, counters=counters, backpressure_status_code=status_code)
    try:
        with running(app) as srv, ThreadPoolExecutor(1) as pool:
            pipeline.pause()
            first: Future[httpx.Response] = pool.submit(_post, srv, _json_body(SPAN_ID))
            _wait_for(lambda: pipeline.pending == 1)
            with pytest.raises(TimeoutError):
                first.result(timeout=0.3)

            second = _post(srv, _json_body("0000000000000002", "0000000000000003"))
            assert second.status_code == status_code
            assert second.headers["retry-after"] == "1"
            assert second.json()["code"] == 14

            pipeline.resume()
            assert first.result(timeout=10).status_code == 200
            assert pipeline.committed_ids() == [(TRACE_ID, SPAN_ID)]
    finally:
        pipeline.close()
    assert counters.rejected == {"queue_full": 2}
    assert counters.received == {"http_json": 3}


def test_sdk_exporter_retries_after_backpressure() -> None:
    pipeline = InMemoryCommitQueue(capacity=1)
    counters = InMemoryReceiverCounters()
    app = create_otlp_app(pipeline.submit, counters=counters)
    spans = _sdk_spans(2)
    try:
        with running(app) as srv, ThreadPoolExecutor(2) as pool:
            pipeline.pause()
            blocker = pool.submit(_post, srv, _json_body(SPAN_ID))
            _wait_for(lambda: pipeline.pending == 1)
            exporter = OTLPSpanExporter(endpoint=f"{srv.url}/v1/traces", timeout=10)
            export = pool.submit(exporter.export, spans)
            _wait_for(lambda: counters.rejected.get("queue_full") == len(spans))
            pipeline.resume()
            assert export.result(timeout=15) == SpanExportResult.SUCCESS
            assert blocker.result(timeout=5).status_code == 200
            exporter.shutdown()
    finally:
        pipeline.close()
    assert set(_ids(spans)) <= set(pipeline.committed_ids())
    assert counters.received == {"http_json": 1, "http_protobuf": 2 * len(spans)}


@pytest.mark.parametrize("media_type", ["application/json", PROTOBUF])
def test_partial_success_reports_decode_and_pipeline_refusals(media_type: str) -> None:
    pipeline = InMemoryCommitQueue(refuse_names=frozenset({"refused"}))
    counters = InMemoryReceiverCounters()
    app = create_otlp_app(pipeline.submit, counters=counters)
    spans = [
        {"traceId": TRACE_ID, "spanId": SPAN_ID, "name": "kept"},
        {"traceId": TRACE_ID, "spanId": "0000000000000002", "name": "refused"},
        {"traceId": "0" * 32, "spanId": "0000000000000003", "name": "bad id"},
    ]
    document = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    if media_type == PROTOBUF:
        request = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    scope_spans=[
                        ScopeSpans(
                            spans=[
                                Span(
                                    trace_id=bytes.fromhex(span["traceId"]),
                                    span_id=bytes.fromhex(span["spanId"]),
                                    name=span["name"],
                                )
                                for span in spans
                            ]
                        )
                    ]
                )
            ]
        )
        body = request.SerializeToString()
    else:
        body = json.dumps(document).encode()
    try:
        with running(app) as srv:
            response = _post(srv, body, **{"Content-Type": media_type})
    finally:
        pipeline.close()
    assert response.status_code == 200
    assert response.headers["content-type"] == media_type
    if media_type == PROTOBUF:
        partial = ExportTraceServiceResponse.FromString(response.content).partial_success
        rejected, message = partial.rejected_spans, partial.error_message
    else:
        payload = response.json()["partialSuccess"]
        rejected, message = int(payload["rejectedSpans"]), payload["errorMessage"]
    assert rejected == 2
    assert message.startswith("2 of 3 spans rejected")
    assert "invalid trace id" in message and "refused by policy" in message
    assert pipeline.committed_ids() == [(TRACE_ID, SPAN_ID)]
    assert counters.rejected == {"invalid_span": 1, "pipeline": 1}


def test_empty_request_is_full_success_without_submit(
    server: OtlpServer, commits: InMemoryCommitQueue
) -> None:
    response = _post(server, b"", **{"Content-Type": PROTOBUF})
    assert response.status_code == 200
    assert response.content == b""
    assert (
        ExportTraceServiceResponse.FromString(response.content).HasField("partial_success") is False
    )
    assert commits.committed == []


def test_unexpected_submit_failure_is_retryable_503() -> None:
    async def broken(batch: SpanBatch) -> None:
        raise RuntimeError("disk full")

    app = create_otlp_app(broken)
    with running(app) as srv:
        response = _post(srv, _json_body(SPAN_ID))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert "disk full" not in response.text


def _wait_for(condition: Any, timeout_seconds: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
