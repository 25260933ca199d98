"""OTLP/gRPC end to end: ``loopwatch collector --otlp-grpc`` in a subprocess, real clients.

The Python SDK's own OTLP/gRPC exporter sends guarded runs; raw gRPC calls (the method
registered with no serializer, as an exporter's bytes) check each answer of the OTLP
specification, "OTLP/gRPC Response", including ``RetryInfo`` on throttling.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from loopwatch.collector.errors import QueueFull
from loopwatch.collector.receive import InflightLimit, InMemoryReceiverCounters, Submit
from loopwatch.collector.receive_grpc import EXPORT_METHOD, OtlpGrpcServer
from loopwatch.collector.records import SpanBatch
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .services import (
    STOP_SCENARIOS,
    CollectorProcess,
    emit_loopwatch_runs,
    free_port,
    run_collector_cli,
    start_collector,
)

pytestmark = pytest.mark.timeout(60)

AGENT = "grpc-e2e"


def _grpc_args() -> tuple[str, str]:
    return "--otlp-grpc", f"127.0.0.1:{free_port()}"


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[CollectorProcess, str]]:
    flag, address = _grpc_args()
    with start_collector(tmp_path, flag, address) as process:
        yield process, address


def _export(address: str, body: bytes, **kwargs: object) -> tuple[bytes, grpc.Call]:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(EXPORT_METHOD)
        return call.with_call(body, timeout=20, **kwargs)  # type: ignore[no-any-return]


def _request(*trace_ids: bytes) -> bytes:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for index, trace_id in enumerate(trace_ids, start=1):
        span = spans.add(trace_id=trace_id, span_id=index.to_bytes(8, "big"), name="x")
        span.start_time_unix_nano = span.end_time_unix_nano = 1_700_000_000_000_000_000
    return request.SerializeToString()


@contextlib.asynccontextmanager
async def _serving(
    submit: Submit, **options: Any
) -> AsyncIterator[tuple[OtlpGrpcServer, grpc.aio.UnaryUnaryMultiCallable]]:
    """An in-process receiver on a free port with ``submit``, and a raw ``Export`` call."""
    options.setdefault("counters", InMemoryReceiverCounters())
    server = OtlpGrpcServer("127.0.0.1:0", submit=submit, max_message_bytes=1 << 20, **options)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, channel.unary_unary(EXPORT_METHOD)
    finally:
        await server.stop(1)


def _retry_delay(exc: grpc.aio.AioRpcError) -> int:
    """The ``RetryInfo`` delay, in seconds, of a refused call."""
    details = dict(exc.trailing_metadata() or ())["grpc-status-details-bin"]
    info = error_details_pb2.RetryInfo()
    assert status_pb2.Status.FromString(details).details[0].Unpack(info)
    return int(info.retry_delay.seconds)


def test_sdk_grpc_exporter_runs_reach_the_api_and_metrics(
    collector: tuple[CollectorProcess, str],
) -> None:
    """Proves the gRPC path for loopwatch spans: the SDK's OTLP/gRPC exporter, every run
    listed with its stop reason, counted on ``/metrics`` under ``transport="grpc"``."""
    process, address = collector
    expected, spans = emit_loopwatch_runs(address, STOP_SCENARIOS, agent=AGENT, protocol="grpc")
    listed = {i["run_id"]: i["stop_reason"] for i in process.runs(agent=AGENT)}
    assert listed == expected, process.stderr_text()
    metrics = process.metrics()
    assert metrics.value("loopwatch_collector_spans_received_total", transport="grpc") == len(spans)
    for reason in set(expected.values()):
        count = sum(1 for r in expected.values() if r == reason)
        assert (
            metrics.value("loopwatch_agent_stops_total", agent=AGENT, stop_reason=reason) == count
        )


def test_grpc_answers_as_the_otlp_spec_says(collector: tuple[CollectorProcess, str]) -> None:
    """Partial success in the response, ``INVALID_ARGUMENT`` for a body that is not a
    request (not retried), and the process keeps serving."""
    process, address = collector
    good, bad = bytes(range(1, 17)), b"\x01" * 15
    raw, call = _export(address, _request(good, bad))
    assert call.code() == grpc.StatusCode.OK
    answer = ExportTraceServiceResponse.FromString(raw)
    assert answer.partial_success.rejected_spans == 1
    assert "invalid trace id" in answer.partial_success.error_message

    with pytest.raises(grpc.RpcError) as info:
        _export(address, b"\xff" * 64)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid ExportTraceServiceRequest" in (info.value.details() or "")
    assert process.running
    metrics = process.metrics()
    assert metrics.value("loopwatch_collector_spans_received_total", transport="grpc") == 2
    assert metrics.total("loopwatch_collector_requests_rejected_total") == 1


def test_grpc_size_cap_applies_after_decompression(tmp_path: Path) -> None:
    """A gzip-compressed message that inflates past ``limits.max_decompressed_bytes`` is
    ``RESOURCE_EXHAUSTED`` (not retried by exporters), and smaller ones still pass."""
    config = tmp_path / "small.toml"
    config.write_text("[limits]\nmax_decompressed_bytes = 1048576\n")
    flag, address = _grpc_args()
    with start_collector(tmp_path, flag, address, "--config", str(config)) as process:
        bomb = b"\x00" * (8 << 20)
        assert len(gzip.compress(bomb)) < 64 << 10
        with pytest.raises(grpc.RpcError) as info:
            _export(address, bomb, compression=grpc.Compression.Gzip)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        _, call = _export(address, _request(bytes(range(1, 17))), compression=grpc.Compression.Gzip)
        assert call.code() == grpc.StatusCode.OK
        assert process.running


def test_grpc_token_is_required(tmp_path: Path) -> None:
    flag, address = _grpc_args()
    with start_collector(tmp_path, flag, address, token="s3cret-grpc") as process:
        body = _request(bytes(range(1, 17)))
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as info:
                _export(address, body, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        _, call = _export(address, body, metadata=(("authorization", "Bearer s3cret-grpc"),))
        assert call.code() == grpc.StatusCode.OK
        assert "s3cret-grpc" not in process.stderr_text()


def test_grpc_port_in_use_exits_2_with_one_line(tmp_path: Path) -> None:
    flag, address = _grpc_args()
    with start_collector(tmp_path, flag, address):
        done = run_collector_cli(
            "--db",
            str(tmp_path / "second.duckdb"),
            "--otlp-http",
            f"127.0.0.1:{free_port()}",
            "--http",
            f"127.0.0.1:{free_port()}",
            flag,
            address,
            cwd=tmp_path,
        )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and "server.otlp_grpc" in lines[0], done.stderr[-2000:]


def test_queue_full_is_unavailable_with_retry_info() -> None:
    """Throttling ("OTLP/gRPC Throttling"): ``UNAVAILABLE`` with ``google.rpc.RetryInfo``
    carrying the queue's delay, so the SDK exporter waits that long and retries."""
    counters = InMemoryReceiverCounters()

    async def full(batch: SpanBatch) -> None:
        raise QueueFull(capacity=1, retry_after_seconds=3)

    async def scenario() -> grpc.aio.AioRpcError:
        async with _serving(full, counters=counters) as (_, call):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(_request(bytes(range(1, 17))), timeout=10)
        return info.value

    refused = asyncio.run(scenario())
    assert (refused.code(), _retry_delay(refused)) == (grpc.StatusCode.UNAVAILABLE, 3)
    assert counters.received == {"grpc": 1} and counters.rejected == {"queue_full": 1}


def test_a_call_the_client_abandons_is_still_committed_and_counted() -> None:
    """A client deadline cancels the wait, not the commit: the batch is stored and
    counted once the store has it (received = stored + rejected holds, and the live
    metrics match the store); the client's retry is a duplicate."""
    committed: list[SpanBatch] = []
    counters = InMemoryReceiverCounters()

    async def slow(batch: SpanBatch) -> None:
        await asyncio.sleep(0.5)
        committed.append(batch)

    async def scenario() -> grpc.StatusCode:
        async with _serving(slow, counters=counters) as (_, call):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(_request(bytes(range(1, 17))), timeout=0.1)
            await asyncio.sleep(1.0)
        return info.value.code()

    assert asyncio.run(scenario()) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(committed) == 1
    assert counters.received == {"grpc": 1} and counters.rejected == {}


@pytest.mark.parametrize("encoding", ["latin-1", "utf-8"])
def test_a_token_that_is_not_latin1_is_unauthorized_not_an_error(encoding: str) -> None:
    """Found by a review: a non-Latin-1 bearer token over gRPC raised UnicodeEncodeError,
    answered 'retry later', so a misconfigured exporter retried forever."""
    from loopwatch.collector.errors import Unauthorized
    from loopwatch.collector.receive import check_bearer as _check_bearer

    for header in ("Bearer токен", "Bearer 令牌\udcff"):
        with pytest.raises(Unauthorized):
            _check_bearer(header, b"s3cret", encoding)
    _check_bearer("Bearer s3cret", b"s3cret", encoding)


def test_a_call_past_the_inflight_bound_is_unavailable_with_retry_info() -> None:
    """The in-flight bound is shared with OTLP/HTTP: while one call holds it, another is
    refused before decoding, as throttling an exporter retries."""
    counters = InMemoryReceiverCounters()
    limit = InflightLimit(16, retry_after_seconds=2)
    release = asyncio.Event()

    async def held(batch: SpanBatch) -> None:
        await release.wait()

    async def scenario() -> grpc.aio.AioRpcError:
        async with _serving(held, counters=counters, inflight=limit) as (_, call):
            first = asyncio.ensure_future(call(_request(bytes(range(1, 17))), timeout=10))
            while limit.held == 0:
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(_request(bytes(range(2, 18))), timeout=10)
            release.set()
            await first
        return info.value

    refused = asyncio.run(scenario())
    assert (refused.code(), _retry_delay(refused)) == (grpc.StatusCode.UNAVAILABLE, 2)
    assert limit.held == 0
    assert counters.refused == {"queue_full": 1} and counters.received == {"grpc": 1}


def test_a_lost_decode_worker_is_unavailable_with_retry_info() -> None:
    """A failure of the collector's own (a decode worker killed) is retryable: the call is
    ``UNAVAILABLE`` with ``RetryInfo``, nothing is counted as received, and the log names
    the cause without request content."""
    from loopwatch.collector.errors import DecodeWorkerLost

    counters = InMemoryReceiverCounters()

    async def lost(body: bytes, encoding: str, as_json: bool) -> SpanBatch:
        raise DecodeWorkerLost()

    async def never(batch: SpanBatch) -> None:
        raise AssertionError("a batch that was not decoded was submitted")

    async def scenario() -> grpc.aio.AioRpcError:
        async with _serving(never, counters=counters, decode=lost, retry_after_seconds=4) as (
            _,
            call,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(_request(bytes(range(1, 17))), timeout=10)
        return info.value

    refused = asyncio.run(scenario())
    assert (refused.code(), _retry_delay(refused)) == (grpc.StatusCode.UNAVAILABLE, 4)
    assert counters.received == {} and counters.refused == {}
