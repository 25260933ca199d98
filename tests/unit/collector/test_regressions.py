"""Collector regressions from adversarial review: each failing input kept as a test."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopwatch.collector.config import load_config
from loopwatch.collector.service import Collector
from loopwatch.instrumentation.redaction import Redactor
from starlette.testclient import TestClient

from .spans import completed_run, record, to_batch


def test_redaction_is_not_quadratic_on_many_placeholders() -> None:
    text = "[REDACTED:jwt] sk-proj-" + "A1b2C3d4" * 6 + " "
    hostile = text * 4000
    start = time.monotonic()
    out, hits = Redactor().redact_text(hostile)
    assert time.monotonic() - start < 5
    assert "sk-proj-A1b2" not in out and hits.get("openai_key", 0) == 4000


def test_out_of_range_numbers_do_not_poison_a_request(tmp_path: Path) -> None:
    cfg = load_config(environ={}, overrides={"store": {"db": str(tmp_path / "x.duckdb")}})
    c = Collector(cfg)
    try:
        batch = to_batch(record(completed_run()))
        for span in batch.spans:
            span.attributes["loopwatch.step"] = 1e19
            span.attributes["loopwatch.cost.usd"] = float("nan")
            span.attributes["loopwatch.stop.observed"] = float("inf")
        asyncio.run(c.submit(batch))
        client = TestClient(c.api_app())
        items = client.get("/api/v1/runs").json()["items"]
        assert len(items) == 1
        assert client.get(f"/api/v1/runs/{items[0]['run_id']}").status_code == 200
    finally:
        c.close()


def test_otlp_port_errors_use_the_status_body(tmp_path: Path) -> None:
    cfg = load_config(environ={}, overrides={"store": {"db": str(tmp_path / "x.duckdb")}})
    c = Collector(cfg)
    try:
        client = TestClient(c.otlp_app())
        r = client.get("/v1/traces", headers={"content-type": "application/json"})
        assert r.status_code == 405 and r.json()["message"].startswith("use POST")
        r = client.post("/elsewhere", headers={"content-type": "application/json"}, content=b"{}")
        assert r.status_code == 404 and "code" in r.json()
    finally:
        c.close()


def test_unknown_stop_reason_filter_is_a_clear_400(tmp_path: Path) -> None:
    cfg = load_config(environ={}, overrides={"store": {"db": str(tmp_path / "x.duckdb")}})
    c = Collector(cfg)
    try:
        r = TestClient(c.api_app()).get("/api/v1/runs", params={"stop_reason": "bogus"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_parameter"
    finally:
        c.close()


def test_whole_refused_requests_are_counted_and_reasons_start_at_zero(tmp_path: Path) -> None:
    """A sender whose every request is refused (garbage body, wrong media type) used to be
    invisible on /metrics: request_refused counted nothing, and the rejection series did
    not exist until a first span was rejected, so alerts saw "no data"."""
    cfg = load_config(environ={}, overrides={"store": {"db": str(tmp_path / "x.duckdb")}})
    c = Collector(cfg)
    try:
        api = TestClient(c.api_app())
        before = api.get("/metrics").text
        assert 'loopwatch_collector_spans_rejected_total{reason="invalid_span"} 0.0' in before
        assert 'loopwatch_collector_requests_rejected_total{reason="decode_error"} 0.0' in before
        otlp = TestClient(c.otlp_app())
        bad = otlp.post(
            "/v1/traces",
            headers={"content-type": "application/x-protobuf"},
            content=b"\xff\xff\xff not protobuf",
        )
        assert bad.status_code == 400
        wrong = otlp.post("/v1/traces", headers={"content-type": "text/plain"}, content=b"x")
        assert wrong.status_code == 415
        after = api.get("/metrics").text
        assert 'loopwatch_collector_requests_rejected_total{reason="decode_error"} 1.0' in after
        assert (
            'loopwatch_collector_requests_rejected_total{reason="unsupported_media_type"} 1.0'
            in after
        )
        # Reasons of whole requests are not exported on the span counter, where nothing
        # would ever count them (they were: four series stuck at 0 on a dashboard panel).
        span_reasons = {
            line.split('reason="')[1].split('"')[0]
            for line in after.splitlines()
            if line.startswith("loopwatch_collector_spans_rejected_total{")
        }
        assert span_reasons == {"invalid_span", "pipeline", "queue_full", "submit_failed"}
    finally:
        c.close()


_EARLY_SIGNAL_SCRIPT = """
import os, signal, sys, threading, time
from loopwatch.collector import service
from loopwatch.collector.config import load_config
cfg = load_config(environ={}, overrides={
    "server": {"otlp_http": "127.0.0.1:0", "http": "127.0.0.1:0"},
    "store": {"db": sys.argv[1]},
})
delay = float(sys.argv[2])
def send():
    # Counted from serve_forever's entry (its handlers in place): a SIGINT before that is
    # Python's own KeyboardInterrupt in this script, which a loaded machine once raised
    # inside Thread.start() here (delay 0).
    while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        time.sleep(0.0005)
    time.sleep(delay)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=send, daemon=True).start()
service.serve_forever(cfg, announce=False)
print("stopped", flush=True)
"""


@pytest.mark.parametrize("delay_seconds", [0.0, 0.05, 0.1, 0.2, 0.4])
def test_a_signal_while_the_store_opens_is_not_lost(tmp_path: Path, delay_seconds: float) -> None:
    """SIGINT 0.05-0.2 s into serve_forever (while DuckDB opens the store, which swallows
    the KeyboardInterrupt) used to be lost: the collector served on. Now it stops. The
    delay counts from the moment serve_forever's handlers are in place."""
    db = tmp_path / "x.duckdb"
    done = subprocess.run(
        [sys.executable, "-c", _EARLY_SIGNAL_SCRIPT, str(db), str(delay_seconds)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stopped"


def test_every_redaction_rule_is_exported_from_start(tmp_path: Path) -> None:
    """``loopwatch_redactions_total`` had no series until the first redaction, so the
    Grafana lint (and the Redactions by rule panel) found nothing on a fresh collector."""
    cfg = load_config(environ={}, overrides={"store": {"db": str(tmp_path / "x.duckdb")}})
    c = Collector(cfg)
    try:
        text = TestClient(c.api_app()).get("/metrics").text
        rules = {
            line.split('rule="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("loopwatch_redactions_total{")
        }
        assert rules == set(c.redact.redactor.rule_names) and {"canary", "aws_access_key"} <= rules
    finally:
        c.close()


def test_token_counts_past_int64_sums_are_capped_not_a_poison_batch(tmp_path: Path) -> None:
    """Two int64-max token counts on one model span summed past runs.tokens (BIGINT): the
    commit failed and the request got 503 on every retry (helper review, 2026-12-01).
    Counts are capped as the guard caps them, and run totals saturate."""
    from loopwatch.collector.map import MapStage
    from loopwatch.collector.records import SpanBatch, SpanRecord
    from loopwatch.collector.store import Store
    from loopwatch.instrumentation import _semconv as sc
    from loopwatch.instrumentation.budgets import MAX_REPORTED_TOKENS

    trace, big = "cd" * 16, 2**63 - 1
    mapper = MapStage(max_idle_seconds=0)  # no wait for an agent span: trace-level run
    with Store(tmp_path / "t.duckdb") as store:
        for n in range(3):  # the run's total grows over three requests
            usage = {sc.GEN_AI_USAGE_INPUT_TOKENS: big, sc.GEN_AI_USAGE_OUTPUT_TOKENS: big}
            chat = SpanRecord(
                trace,
                f"{n + 1:016x}",
                "00000000000000a0",
                "chat m",
                1,
                10 + n,
                11 + n,
                {sc.GEN_AI_OPERATION_NAME: "chat", **usage},
            )
            result = store.submit(mapper.process(SpanBatch(spans=[chat]))).result(timeout=30)
            assert len(result.new_span_keys) == 1
        detail = store.reader().get_run(trace)
    assert detail is not None
    assert detail.run["tokens"] == 6 * MAX_REPORTED_TOKENS
    assert {(s["input_tokens"], s["output_tokens"]) for s in detail.steps} == {
        (MAX_REPORTED_TOKENS, MAX_REPORTED_TOKENS)
    }
