"""A request the store fails to commit, then retried: the retry stores what the first
attempt would have, through the real HTTP server and a real DuckDB file.

The fault is a real write error, as on a full disk: the collector's file size limit
(``RLIMIT_FSIZE``, set from outside with ``prlimit``) is lowered to the size of its
write-ahead log, so the next ``COMMIT`` fails (``Could not write file ...wal: File too
large``) and the request is answered 503 with ``Retry-After``; the limit is then put
back and the retry commits. Found by a review of acknowledgement and data loss,
2026-12-02.
"""

from __future__ import annotations

import contextlib
import json
import resource
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.services import CollectorProcess

from .payloads import PROTOBUF, PbSpan, new_trace_id, protobuf_request
from .support import launch_collector, store_query

pytestmark = pytest.mark.timeout(60)

CONFIG = """
[sampling]
completed_fraction = 0.0
"""
AGENT_SPAN = "a" * 16
T0 = 1_700_000_000_000_000_000


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    process = launch_collector(tmp_path, db_path=tmp_path / "faults.duckdb", config=CONFIG)
    try:
        yield process
    finally:
        if process.running:
            process.stop()


def _calls(trace_id: str, n: int) -> list[PbSpan]:
    """``n`` identical third-party tool calls under the agent span (a loop in observe mode)."""
    return [
        PbSpan(
            name="execute_tool lookup_order",
            trace_id=trace_id,
            span_id=f"{i + 1:016x}",
            parent_span_id=AGENT_SPAN,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup_order",
                "gen_ai.tool.call.arguments": json.dumps({"order_id": "A-1"}),
                "gen_ai.tool.call.result": json.dumps({"status": "pending"}),
            },
            start=T0 + (i + 1) * 1000,
            end=T0 + (i + 1) * 1000 + 500,
        )
        for i in range(n)
    ]


def _agent(trace_id: str) -> PbSpan:
    return PbSpan(
        name="invoke_agent triage",
        trace_id=trace_id,
        span_id=AGENT_SPAN,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"},
        start=T0,
        end=T0 + 100_000,
    )


@contextlib.contextmanager
def disk_full(collector: CollectorProcess) -> Iterator[None]:
    """Within the block, the collector cannot grow any file (its log stays writable up
    to its current size): DuckDB's next write to its write-ahead log fails."""
    wal = Path(f"{collector.db_path}.wal")
    pid = collector.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (wal.stat().st_size, before[1]))
    try:
        yield
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, before)


def _post(collector: CollectorProcess, spans: list[PbSpan]) -> httpx.Response:
    return httpx.post(
        collector.otlp_url,
        content=protobuf_request(spans),
        headers={"content-type": PROTOBUF},
        timeout=30,
    )


@pytest.mark.parametrize("split", [False, True], ids=["one_request", "agent_span_later"])
def test_a_request_whose_commit_failed_is_stored_whole_by_its_retry(
    collector: CollectorProcess, split: bool
) -> None:
    """Five identical calls and their agent span; the request with the agent span fails
    to commit once (503), its retry gets 200. Before, the map and detect stages had taken
    the failed attempt in: the retry was mapped as a resend, so the run's observe-mode
    verdict (``repeated_action``) was lost, the loop was never counted, and the run,
    declined by sampling, lost its steps; with the calls sent first, they also stayed
    on the trace-level run instead of moving to the agent's."""
    trace_id = new_trace_id()
    calls, agent = _calls(trace_id, 5), _agent(trace_id)
    failing = [agent] if split else [*calls, agent]
    if split:
        assert _post(collector, calls).status_code == 200
    with disk_full(collector):
        refused = _post(collector, failing)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    retried = _post(collector, failing)
    assert retried.status_code == 200, retried.text

    detail = collector.run(AGENT_SPAN)
    assert detail["stop"]["observe_reason"] == "repeated_action"
    assert detail["run"]["tool_calls"] == 5 and detail["run"]["sampled"] is True
    assert [s["step"] for s in detail["steps"] if s["kind"] == "tool_result"] == [1, 2, 3, 4, 5]
    metrics = collector.metrics()
    assert (
        metrics.total("loopwatch_loop_detections_total", agent="triage", detector="repeated_action")
        == 1
    )
    assert metrics.total("loopwatch_agent_stops_total", agent="triage") == 1
    collector.stop()
    runs = store_query(collector.db_path, "SELECT run_id, tool_calls FROM runs ORDER BY run_id")
    assert runs == [(AGENT_SPAN, 5)]  # no trace-level run left holding the calls
