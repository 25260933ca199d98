"""A second, non-Python client: the OpenTelemetry JS SDK's OTLP/HTTP JSON exporter from npm.

``node/send_spans.js`` exports one third-party agent run in the GenAI semantic conventions
(``invoke_agent support`` and five identical ``execute_tool lookup_order`` calls, no
loopwatch attributes). The collector must map it (source ``genai``), compute the
fingerprints and observation digests itself, see the repeated action with the guard's own
detector, and count the calls on ``/metrics``.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .services import CollectorProcess, MetricSamples, send_node_spans, start_collector

pytestmark = pytest.mark.timeout(60)

HEX64 = re.compile(r"^[0-9a-f]{64}$")
KNOWN_TRACE_ID = "5b8efff798038103d269b633813fc60c"
CALLS = 5


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    # Every completed run keeps its steps here, so the fingerprints can be read back.
    config = tmp_path / "collector.toml"
    config.write_text("[sampling]\ncompleted_fraction = 1.0\n", encoding="utf-8")
    with start_collector(tmp_path, "--config", str(config)) as process:
        yield process


def _check_genai_run(
    collector: CollectorProcess, sent: dict[str, Any], transport: str
) -> dict[str, Any]:
    items = collector.runs(agent="support")
    assert len(items) == 1, (items, collector.stderr_text())
    item = items[0]
    assert item["source"] == "genai"
    assert item["run_id"] == sent["run_span_id"]  # the agent span's id names the run
    assert item["trace_id"] == sent["trace_id"]
    assert item["tool_calls"] == CALLS
    assert item["stop_reason"] == "completed" and item["stop_inferred"] is True

    detail = collector.run(item["run_id"])
    tools = [s for s in detail["steps"] if s["kind"] == "tool_result"]
    assert len(tools) == CALLS, detail["steps"]
    assert all(s["tool"] == "lookup_order" and s["trace_id"] == sent["trace_id"] for s in tools)
    fingerprints = {s["action_fingerprint"] for s in tools}
    digests = {s["observation_digest"] for s in tools}
    assert len(fingerprints) == 1 and HEX64.match(fingerprints.pop() or ""), tools
    assert len(digests) == 1 and HEX64.match(digests.pop() or ""), tools
    assert detail["stop"]["observe_reason"] == "repeated_action", detail["stop"]
    observed = json.loads(detail["stop"]["observe_evidence"])
    assert observed["tool"] == "lookup_order", detail["stop"]

    metrics: MetricSamples = collector.metrics()
    assert (
        metrics.value(
            "loopwatch_tool_calls_total", agent="support", tool="lookup_order", outcome="ok"
        )
        == CALLS
    )
    assert (
        metrics.value(
            "loopwatch_loop_detections_total",
            agent="support",
            tool="lookup_order",
            detector="repeated_action",
        )
        == 1
    )
    assert (
        metrics.value("loopwatch_agent_stops_total", agent="support", stop_reason="completed") == 1
    )
    assert metrics.total("loopwatch_collector_spans_received_total", transport=transport) >= 6
    return detail


@pytest.mark.parametrize("gzip_body", [False, True], ids=["plain", "gzip"])
def test_node_sdk_json_export_gets_server_side_loop_analytics(
    collector: CollectorProcess, gzip_body: bool
) -> None:
    """Proves the npm exporter's OTLP/JSON (chunked, optionally gzip) is decoded and mapped:
    the run is listed with source ``genai`` under the agent span's id, its five tool steps
    carry 64-hex action fingerprints and observation digests computed by the collector
    (identical, since the calls are), the repeated action is detected server-side, and
    ``loopwatch_tool_calls_total`` counts the five calls."""
    sent = send_node_spans(collector.otlp_url, *(["--gzip"] if gzip_body else []))
    assert sent["tool_spans"] == CALLS
    _check_genai_run(collector, sent, "http_json")


def test_raw_chunked_json_keeps_known_hex_ids(collector: CollectorProcess) -> None:
    """Proves OTLP/JSON hex ids are decoded as hex (not as base64, which a generic protobuf
    JSON parser does): a hand-built request with a known trace id, written in three chunks
    by Node's ``http`` module, comes back with exactly that trace id and span id."""
    sent = send_node_spans(
        collector.otlp_url, "--mode", "raw-chunked", "--trace-id", KNOWN_TRACE_ID
    )
    assert sent["trace_id"] == KNOWN_TRACE_ID and sent["status"] == 200
    _check_genai_run(collector, sent, "http_json")


class _CaptureHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = b""
        chunks = 0
        if headers.get("transfer-encoding") == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
                chunks += 1
        else:
            body = self.rfile.read(int(headers.get("content-length", "0")))
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        type(self).requests.append({"headers": headers, "body": body, "chunks": chunks})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def capture_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _CaptureHandler.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CaptureHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", _CaptureHandler.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("args", [[], ["--gzip"], ["--mode", "raw-chunked"]], ids=str)
def test_node_client_sends_chunked_bodies_without_content_length(
    capture_server: tuple[str, list[dict[str, Any]]], args: list[str]
) -> None:
    """Proves the collector tests above really exercise chunked bodies: on the wire, the npm
    exporter (and the raw client) send ``Transfer-Encoding: chunked`` with no
    ``Content-Length``, as ``application/json``."""
    url, requests = capture_server
    send_node_spans(url, *args)
    assert len(requests) == 1
    headers = requests[0]["headers"]
    assert headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in headers
    assert headers["content-type"] == "application/json"
    assert requests[0]["body"].startswith(b'{"resourceSpans"')
