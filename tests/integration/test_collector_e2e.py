"""The collector end to end, as a user runs it: ``loopwatch collector`` in a subprocess.

Spans come from the real agent side: guarded runs (``Run``, a scripted model, the testing
kit's tools) exported by the Python OTel SDK's OTLP/HTTP exporter (``configure_otlp``).
The same spans are kept in memory and are the ground truth every check compares with:
the read API (``/api/v1/runs``), ``/metrics`` (parsed with prometheus_client), and the
DuckDB file itself, opened read-only once the collector has stopped.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation.testing import RunTrace, collect_runs

from .services import (
    STOP_SCENARIOS,
    CollectorProcess,
    MetricSamples,
    _child_env,
    emit_loopwatch_runs,
    loopwatch_command,
    poll_until,
    run_collector_cli,
    start_collector,
    tool_outcomes,
)

pytestmark = pytest.mark.timeout(60)

AGENT = "e2e"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
COUNTERS = (
    "loopwatch_agent_stops_total",
    "loopwatch_tool_calls_total",
    "loopwatch_loop_detections_total",
)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    with start_collector(tmp_path) as process:
        yield process


def _span_hex(span: Any) -> str:
    return format(span.context.span_id, "016x")


def _steps_of(trace: RunTrace) -> int:
    return len(trace.decisions) + len(trace.tools)


def _check_metrics(
    metrics: MetricSamples, spans: tuple[Any, ...], runs: dict[str, RunTrace]
) -> None:
    for trace in runs.values():
        stop = trace.stops[0].attributes
        reason = stop[sc.LW_STOP_REASON]
        labels = {"agent": AGENT, "stop_reason": reason}
        assert metrics.value("loopwatch_agent_stops_total", **labels) == 1, reason
        assert metrics.value("loopwatch_agent_steps_since_progress_count", **labels) == 1
        assert metrics.value("loopwatch_agent_steps_since_progress_sum", **labels) == stop.get(
            sc.LW_STEPS_SINCE_PROGRESS, 0
        )
        assert metrics.value("loopwatch_agent_steps_count", **labels) == 1
    for (tool, outcome), count in tool_outcomes(spans).items():
        assert (
            metrics.value("loopwatch_tool_calls_total", agent=AGENT, tool=tool, outcome=outcome)
            == count
        ), (tool, outcome)
    assert metrics.total("loopwatch_tool_calls_total", agent=AGENT) == sum(
        tool_outcomes(spans).values()
    )
    assert (
        metrics.value(
            "loopwatch_loop_detections_total",
            agent=AGENT,
            tool="lookup_order",
            detector="repeated_action",
        )
        == 1
    )
    received = metrics.total("loopwatch_collector_spans_received_total", transport="http_protobuf")
    assert received >= len(spans)
    assert metrics.total("loopwatch_collector_spans_rejected_total") == 0


def test_python_sdk_runs_reach_the_api_metrics_and_duckdb(collector: CollectorProcess) -> None:
    """Proves the whole path for loopwatch spans: OTLP/HTTP protobuf in, one run per guarded
    loop listed with its stop reason and counts, steps with the agent's own fingerprints,
    counters and histograms on ``/metrics`` equal to what was sent, a clean exit on SIGTERM,
    and the same rows in the DuckDB file (runs, stops, steps)."""
    expected, spans = emit_loopwatch_runs(collector.otlp_url, STOP_SCENARIOS, agent=AGENT)
    runs = collect_runs(spans)
    assert set(runs) == set(expected)

    # provider.shutdown() has returned: the collector acknowledged after committing, so
    # everything is readable at once, with no polling.
    items = {item["run_id"]: item for item in collector.runs(agent=AGENT)}
    assert set(items) == set(expected), collector.stderr_text()
    for run_id, reason in expected.items():
        item, trace = items[run_id], runs[run_id]
        assert item["source"] == "loopwatch"
        assert item["agent"] == AGENT
        assert item["stop_reason"] == reason
        assert item["trace_id"] == format(trace.run.context.trace_id, "032x")
        assert item["tool_calls"] == len(trace.tools)
        blocked = [t for t in trace.tools if t.attributes[sc.LW_TOOL_OUTCOME] == "blocked"]
        assert item["tool_blocked"] == len(blocked)
        assert item["decisions"] == len(trace.decisions)
        if reason != "completed":
            assert item["sampled"] is True, item  # every abnormal stop keeps its steps
        assert item["sampled"] in (True, False), item  # decided when the stop arrived

    for run_id, reason in expected.items():
        detail = collector.run(run_id)
        trace = runs[run_id]
        assert detail["run"]["run_id"] == run_id
        assert detail["stop"]["reason"] == reason
        if reason == "repeated_action":
            evidence = detail["evidence"]
            sent = json.loads(trace.stops[0].attributes[sc.LW_STOP_EVIDENCE])
            assert evidence["tool"] == sent["tool"] == "lookup_order"
            assert evidence["detector"] == sent["detector"]
        if detail["run"]["sampled"]:
            assert len(detail["steps"]) == _steps_of(trace)
            fingerprints = {
                s["span_id"]: s["action_fingerprint"]
                for s in detail["steps"]
                if s["kind"] == sc.EVENT_TOOL_RESULT
            }
            assert fingerprints == {
                _span_hex(t): t.attributes[sc.LW_ACTION_FINGERPRINT] for t in trace.tools
            }

    _check_metrics(collector.metrics(), spans, runs)

    # All of the above bound parameters in DuckDB, which imports pandas on the first one
    # (53 MiB of a sidecar's memory) unless the command marked it absent
    # (keep_pandas_unloaded): no pandas library is mapped in the collector's process.
    # Nor pyarrow (26 MiB): the writer builds its Arrow batches with nanoarrow.
    maps = Path(f"/proc/{collector.proc.pid}/maps")
    if maps.exists():
        mapped = maps.read_text()
        assert "/pandas/" not in mapped, "the collector process loaded pandas"
        assert "/pyarrow/" not in mapped, "the collector process loaded pyarrow"

    assert collector.stop() == 0, collector.stderr_text()

    con = duckdb.connect(str(collector.db_path), read_only=True)
    try:
        rows = con.execute(
            "SELECT run_id, source, agent, stop_reason, tool_calls, sampled FROM runs"
        ).fetchall()
        stops = con.execute("SELECT run_id, reason, origin, evidence FROM stops").fetchall()
        steps = con.execute(
            "SELECT run_id, span_id, kind, action_fingerprint FROM steps"
        ).fetchall()
        seen = con.execute("SELECT count(*) FROM spans_seen").fetchone()
    finally:
        con.close()
    by_run = {r[0]: r for r in rows}
    assert set(by_run) == set(expected)
    for run_id, reason in expected.items():
        _, source, agent, stop_reason, tool_calls, _ = by_run[run_id]
        assert (source, agent, stop_reason) == ("loopwatch", AGENT, reason)
        assert tool_calls == len(runs[run_id].tools)
    assert {(s[0], s[1], s[2]) for s in stops} == {
        (run_id, reason, "stop_span") for run_id, reason in expected.items()
    }
    evidence = {s[0]: json.loads(s[3]) for s in stops if s[3]}
    assert (
        evidence[next(r for r, why in expected.items() if why == "repeated_action")]["tool"]
        == "lookup_order"
    )
    for run_id, trace in runs.items():
        stored = [s for s in steps if s[0] == run_id]
        assert len(stored) == (_steps_of(trace) if by_run[run_id][5] else 0), run_id
        for _, span_id, kind, fingerprint in stored:
            if kind == sc.EVENT_TOOL_RESULT:
                assert fingerprint is not None and HEX64.match(fingerprint), span_id
    assert seen is not None and seen[0] >= len(spans)


def _counter_values(metrics: MetricSamples) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (name, labels): value
        for name in COUNTERS
        for labels, value in metrics.series(name).items()
        if ("agent", AGENT) in labels
    }


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_restart_keeps_runs_and_counters_start_from_zero(tmp_path: Path, how: str) -> None:
    """Proves a restart on the same DuckDB file loses nothing that was acknowledged, after a
    clean SIGTERM and after ``kill -9`` alike: the runs are still listed with their stop
    reasons (the totals live in the store), while the agent counters on ``/metrics`` start
    from zero with the new process (Prometheus reads a counter reset) and count new runs."""
    db = tmp_path / "restart.duckdb"
    with start_collector(tmp_path, db_path=db) as first:
        expected, _ = emit_loopwatch_runs(first.otlp_url, STOP_SCENARIOS, agent=AGENT)
        before = _counter_values(first.metrics())
        listed = {i["run_id"]: i["stop_reason"] for i in first.runs(agent=AGENT)}
        if how == "sigterm":
            assert first.stop() == 0, first.stderr_text()
        else:
            assert first.kill() == -9
    assert listed == expected
    assert before, "no agent counters before the restart"

    with start_collector(tmp_path, db_path=db) as second:
        after = _counter_values(second.metrics())
        assert not any(after.values()), second.stderr_text()
        assert {i["run_id"]: i["stop_reason"] for i in second.runs(agent=AGENT)} == expected

        more, _ = emit_loopwatch_runs(
            second.otlp_url, ["repeated_action"], agent=AGENT, run_id_prefix="again"
        )
        metrics = second.metrics()
        stops = metrics.value(
            "loopwatch_agent_stops_total", agent=AGENT, stop_reason="repeated_action"
        )
        assert stops == 1
        assert {i["run_id"] for i in second.runs(agent=AGENT)} == set(expected) | set(more)
        assert second.stop() == 0, second.stderr_text()


def _agent_samples(metrics: MetricSamples) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the agent counters and histograms (``_bucket``, ``_count``, ``_sum``)."""
    return {
        (name, labels): value
        for (name, labels), value in metrics.samples.items()
        if name.startswith(("loopwatch_agent_", "loopwatch_tool_calls", "loopwatch_loop_"))
        and ("agent", AGENT) in labels
    }


def test_retention_removes_runs_and_never_lowers_a_live_counter(tmp_path: Path) -> None:
    """Proves ``store.retention_days``: runs past it leave the API and the file, while every
    agent counter and histogram on ``/metrics`` keeps its value for the life of the process
    (a counter that went down would read as a reset in Prometheus)."""
    config = tmp_path / "retention.toml"
    # 0.00003 days is 2.6 s; a 2 s stop timeout runs the store maintenance every second.
    config.write_text("[store]\nretention_days = 0.00003\n[sampling]\nstop_timeout_seconds = 2\n")
    db = tmp_path / "retention.duckdb"
    with start_collector(tmp_path, "--config", str(config), db_path=db) as first:
        expected, _ = emit_loopwatch_runs(first.otlp_url, STOP_SCENARIOS, agent=AGENT)
        before = _agent_samples(first.metrics())
        assert len(first.runs(agent=AGENT)) == len(expected)
        poll_until(lambda: not first.runs(agent=AGENT), timeout_seconds=30, what="retention")
        assert _agent_samples(first.metrics()) == before
        assert first.stop() == 0, first.stderr_text()
    assert any(name.endswith("_bucket") for name, _ in before)
    with duckdb.connect(str(db), read_only=True) as con:
        for table in ("runs", "steps", "stops", "run_tools"):
            assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table


def test_token_guards_otlp_and_the_api_but_not_healthz(tmp_path: Path) -> None:
    """Proves ``--token-file``: the exporter with the bearer token is accepted, a request
    without it gets 401 in the JSON error envelope on OTLP and the API, and ``/healthz``
    stays open for probes."""
    token = "lw-e2e-token-7c41"
    with start_collector(tmp_path, token=token) as collector:
        expected, _ = emit_loopwatch_runs(
            collector.otlp_url, ["repeated_action"], agent=AGENT, token=token
        )
        assert {i["run_id"] for i in collector.runs(agent=AGENT)} == set(expected)

        anonymous_api = httpx.get(f"{collector.http_url}/api/v1/runs", timeout=5)
        assert anonymous_api.status_code == 401
        assert anonymous_api.json()["error"]["status"] == 401
        assert token not in anonymous_api.text
        anonymous_otlp = httpx.post(
            collector.otlp_url,
            content=b"{}",
            headers={"Content-Type": "application/json"},
            timeout=5,
        )
        assert anonymous_otlp.status_code == 401
        assert httpx.get(f"{collector.http_url}/healthz", timeout=5).status_code == 200


BAD_CONFIG = [
    ("otlp_not_hostport", ["--otlp-http", "nonsense"], None),
    ("http_port_out_of_range", ["--http", "127.0.0.1:99999"], None),
    ("non_loopback_bind", ["--otlp-http", "0.0.0.0:4318"], None),
    ("missing_config_file", ["--config", "{tmp}/absent.toml"], None),
    ("unknown_setting", ["--config", "{tmp}/bad.toml"], "[server]\nlisten = 1\n"),
    ("not_toml", ["--config", "{tmp}/bad.toml"], "[server\n"),
    (
        "fraction_out_of_range",
        ["--config", "{tmp}/bad.toml"],
        "[sampling]\ncompleted_fraction = 2.0\n",
    ),
    ("missing_token_file", ["--token-file", "{tmp}/absent.token"], None),
    ("negative_retention", ["--retention-days", "-1"], None),
    ("retention_not_a_number", ["--retention-days", "forever"], None),
]


@pytest.mark.parametrize(("case", "args", "toml"), BAD_CONFIG, ids=[c[0] for c in BAD_CONFIG])
def test_bad_config_exits_2_with_one_line(
    tmp_path: Path, case: str, args: list[str], toml: str | None
) -> None:
    """Proves a bad setting (flag or file) stops the collector before it serves anything:
    exit code 2 and exactly one line on stderr (no traceback), naming the problem."""
    if toml is not None:
        (tmp_path / "bad.toml").write_text(toml, encoding="utf-8")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = run_collector_cli("--db", str(tmp_path / "never.duckdb"), *argv, cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (case, done.returncode, done.stderr[-2000:])
    assert len(lines) == 1, (case, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "never.duckdb").exists(), "a bad config must not create the db"


def test_the_banner_names_the_ports_bound_when_port_0_is_asked(tmp_path: Path) -> None:
    """With ``--otlp-http 127.0.0.1:0 --http 127.0.0.1:0`` the banner printed ``:0``, so a
    caller could not tell where the collector listened (an adversarial review,
    2026-12-02). It prints the ports the kernel chose, and both answer there."""
    proc = subprocess.Popen(
        [
            *loopwatch_command(),
            "collector",
            "--db",
            str(tmp_path / "c.duckdb"),
            "--otlp-http",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env=_child_env(),
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline().decode()
        found = re.search(
            r"OTLP/HTTP http://127\.0\.0\.1:(\d+)/v1/traces, metrics http://127\.0\.0\.1:(\d+)/",
            banner,
        )
        assert found is not None, banner
        otlp, api = (int(port) for port in found.groups())
        assert 0 not in (otlp, api) and otlp != api
        assert httpx.get(f"http://127.0.0.1:{api}/healthz", timeout=10).status_code == 200
        answer = httpx.post(
            f"http://127.0.0.1:{otlp}/v1/traces",
            content=b"",
            headers={"content-type": "application/x-protobuf"},
            timeout=10,
        )
        assert answer.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
