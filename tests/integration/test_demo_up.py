"""``loopwatch demo`` and ``loopwatch up`` as a user runs them: real processes, real ports.

- with no corpus at hand the demo replays the example runs shipped in the package into
  a real collector: every stop reason in DuckDB, ``/api/v1/runs`` and ``/metrics``;
- ``loopwatch demo`` with no collector listening: one line, exit 1;
- ``loopwatch up`` (collector + dashboard) fed with the fine-tuned tau2 telecom file by
  ``loopwatch demo``: the run that called ``get_details_by_id`` 95 times in a row is a
  ``repeated_action`` stop in the API, on ``/metrics`` and in DuckDB (skipped without
  the corpus or the tau2 importer);
- Ctrl-C (SIGINT to the process group, as a terminal sends it) ends ``loopwatch up`` with
  exit 0 within seconds, the dashboard child gone, the demo runs committed.

:class:`UpProcess` and :func:`start_up` are shared with ``tests/e2e/test_demo_browser.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from loopwatch.instrumentation import StopReason

from tests.conftest import CORPUS
from tests.integration.services import (
    MetricSamples,
    ServiceError,
    _child_env,
    free_port,
    loopwatch_command,
    poll_until,
    run_loopwatch,
    start_collector,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "replay" / "examples"
TELECOM_FT = (
    CORPUS
    / "tau2-bench"
    / "ft_gpt-4.1-2025-04-14_sierra_tau2-full-sft_BzrYdMNm_telecom_default_gpt-4.1_1trials.json"
)
ALL_REASONS = {r.value for r in StopReason}


def run_demo_cli(
    *args: str, cwd: Path, timeout_seconds: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``loopwatch demo *args`` to completion (output captured)."""
    return run_loopwatch("demo", *args, cwd=cwd, timeout_seconds=timeout_seconds)


def _children(pid: int) -> set[int]:
    """Direct child processes of ``pid`` (from ``/proc``)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                found.update(int(p) for p in text.split())
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class UpProcess:
    """A running ``loopwatch up`` (its own process group)."""

    proc: subprocess.Popen[bytes]
    db_path: Path
    otlp_address: str
    http_address: str
    dashboard_port: int
    stdout_path: Path
    stderr_path: Path
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._client = httpx.Client(base_url=self.http_url, timeout=10.0)

    @property
    def otlp_url(self) -> str:
        return f"http://{self.otlp_address}/v1/traces"

    @property
    def http_url(self) -> str:
        return f"http://{self.http_address}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") + self.stderr_path.read_text(
            errors="replace"
        )

    def get_json(self, path: str, **params: Any) -> Any:
        response = self._client.get(path, params=params)
        if response.status_code != 200:
            raise ServiceError(f"GET {path} -> {response.status_code}: {response.text[:300]}")
        return response.json()

    def runs(self, **filters: Any) -> list[dict[str, Any]]:
        """Every item of ``/api/v1/runs`` (follows ``next_offset``)."""
        items: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = self.get_json("/api/v1/runs", offset=offset, **filters)
            items.extend(page["items"])
            offset = page.get("next_offset")
        return items

    def metrics(self) -> MetricSamples:
        return MetricSamples.parse(self._client.get("/metrics").text)

    def dashboard_pids(self) -> set[int]:
        # The collector's decode workers (a forkserver and its resource tracker) are
        # children too; they are not the dashboard.
        return {
            p
            for p in _children(self.proc.pid)
            if _alive(p) and b"multiprocessing" not in _cmdline(p)
        }

    def interrupt(self, timeout_seconds: float) -> tuple[int, float]:
        """SIGINT to the whole process group (a terminal's Ctrl-C); returns (code, seconds)."""
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=timeout_seconds)
        return code, time.monotonic() - started

    def close(self) -> None:
        self._client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def start_up(tmp_path: Path, *extra: str, dashboard: bool = True) -> Iterator[UpProcess]:
    """``loopwatch up`` on free ports and a temporary DuckDB file, until the block ends.

    Waits for ``/healthz``, and with ``dashboard`` for the printed ``Dashboard:`` URL
    line (printed once Streamlit answers and any ``--demo`` has been sent).
    """
    otlp, http, dash = free_port(), free_port(), free_port()
    db = tmp_path / "up.duckdb"
    out, err = tmp_path / "up.stdout", tmp_path / "up.stderr"
    args = [
        "up",
        "--db",
        str(db),
        "--otlp-http",
        f"127.0.0.1:{otlp}",
        "--http",
        f"127.0.0.1:{http}",
        "--dashboard-port",
        str(dash),
        *(() if dashboard else ("--no-dashboard",)),
        *extra,
    ]
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [*loopwatch_command(), *args],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=_child_env(),
            start_new_session=True,
        )
    up = UpProcess(proc, db, f"127.0.0.1:{otlp}", f"127.0.0.1:{http}", dash, out, err)

    def ready() -> bool:
        if proc.poll() is not None:
            raise ServiceError(f"loopwatch up exited with {proc.returncode}:\n{up.output()}")
        if dashboard:
            return f"Dashboard:     {up.dashboard_url}" in out.read_text(errors="replace")
        try:
            return httpx.get(f"{up.http_url}/healthz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll_until(ready, timeout_seconds=90, what="loopwatch up to print its URLs")
        yield up
    finally:
        up.close()


def _stored_reasons(db: Path) -> dict[str, str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT run_id, reason FROM stops").fetchall()
    finally:
        con.close()
    return {str(r[0]): str(r[1]) for r in rows}


def _longest_repeat(trajectory: Any, tool: str) -> int:
    """Most consecutive identical agent calls of ``tool`` (other turns in between allowed)."""
    best = run = 0
    last: str | None = None
    for step in trajectory.agent_steps:
        for call in step.tool_calls:
            key = call.arguments_json() if call.name == tool else None
            run = run + 1 if key is not None and key == last else (1 if key else 0)
            last = key
            best = max(best, run)
    return best


def loop95_run_id(prefix: str) -> str:
    """The demo run id of the 95-call ``get_details_by_id`` run in the telecom file.

    Skips when the corpus or the tau2 importer is absent.
    """
    if not TELECOM_FT.is_file():
        pytest.skip(f"corpus file absent: {TELECOM_FT}")
    from loopwatch.replay.demo import demo_run_id
    from loopwatch.replay.importers import importers, load_paths

    if "tau2" not in {i.name for i in importers()}:
        pytest.skip("the tau2 importer is not built yet")
    loaded = load_paths([TELECOM_FT])
    matches = [
        demo_run_id(prefix, index, t)
        for index, t in enumerate(loaded.trajectories)
        if _longest_repeat(t, "get_details_by_id") == 95
    ]
    assert len(matches) == 1, f"expected one 95-call run, found {matches}"
    return matches[0]


@pytest.mark.timeout(90)
def test_shipped_examples_give_every_stop_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No corpus at hand: the demo falls back to the example runs shipped in the package."""
    from loopwatch.replay import demo

    monkeypatch.setattr(demo, "default_corpus", lambda cwd=None: None)
    collector = start_collector(tmp_path)
    with collector:
        report = demo.run_demo(otlp_url=collector.otlp_url, run_prefix="ex")
        assert report.sources == ["<shipped examples>"]
        assert len(report.runs) == 16 and set(report.stops) == ALL_REASONS
        assert report.ok and report.spans_exported > 100, report.summary()

        def all_stopped() -> dict[str, str] | None:
            runs = {r["run_id"]: r["stop_reason"] for r in collector.runs()}
            return runs if len(runs) == 16 and None not in runs.values() else None

        api = poll_until(all_stopped, timeout_seconds=20, what="16 runs with their stops")
        assert api == {r.run_id: r.stop_reason for r in report.runs}
        stops = collector.metrics().series("loopwatch_agent_stops_total")
        assert {dict(labels)["stop_reason"] for labels in stops} == ALL_REASONS
        assert collector.stop() == 0, collector.stderr_text()
    stored = _stored_reasons(collector.db_path)
    assert stored == api
    # The 95-call example is stopped at its third identical call, with the evidence.
    con = duckdb.connect(str(collector.db_path), read_only=True)
    try:
        evidence = con.execute(
            "SELECT json_extract_string(evidence, '$.tool'), step FROM stops "
            "WHERE run_id = 'ex.0002.example-03'"
        ).fetchone()
    finally:
        con.close()
    assert evidence == ("get_details_by_id", 3)


def test_demo_without_a_collector_is_one_clear_line(tmp_path: Path) -> None:
    port = free_port()
    done = run_demo_cli(
        "--corpus", str(EXAMPLES), "--otlp", f"http://127.0.0.1:{port}/v1/traces", cwd=tmp_path
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"loopwatch demo: cannot reach the collector at http://127.0.0.1:{port}"
    )


@pytest.mark.timeout(120)
def test_up_then_demo_of_the_telecom_loop_is_a_repeated_action_stop(tmp_path: Path) -> None:
    loop_run = loop95_run_id("tau2")
    with start_up(tmp_path, dashboard=False) as up:
        done = run_demo_cli(
            "--corpus",
            str(TELECOM_FT),
            "--otlp",
            up.otlp_url,
            "--run-prefix",
            "tau2",
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "replayed 38 runs" in done.stdout

        def stored() -> dict[str, Any] | None:
            found = [r for r in up.runs(stop_reason="repeated_action") if r["run_id"] == loop_run]
            return found[0] if found else None

        run = poll_until(stored, timeout_seconds=20, what=f"{loop_run} in /api/v1/runs")
        assert run["stop_reason"] == "repeated_action"
        detail = up.get_json(f"/api/v1/runs/{loop_run}")
        assert "get_details_by_id" in str(detail)
        stops = up.metrics().value(
            "loopwatch_agent_stops_total", agent=run["agent"], stop_reason="repeated_action"
        )
        assert stops is not None and stops >= 1
        assert up.metrics().total("loopwatch_loop_detections_total", tool="get_details_by_id") >= 1
        code, _ = up.interrupt(timeout_seconds=20)
        assert code == 0, up.output()
    assert _stored_reasons(up.db_path)[loop_run] == "repeated_action"


@pytest.mark.timeout(120)
def test_ctrl_c_stops_up_and_its_dashboard(tmp_path: Path) -> None:
    with start_up(tmp_path, "--demo", "--corpus", str(EXAMPLES)) as up:
        out = up.output()
        assert "replayed 16 runs" in out, out
        stdout = up.stdout_path.read_text().rstrip().splitlines()
        assert stdout[-1] == f"Dashboard:     {up.dashboard_url}", out
        dashboards = up.dashboard_pids()
        assert len(dashboards) == 1, dashboards
        assert httpx.get(f"{up.dashboard_url}/_stcore/health", timeout=5).text.strip() == "ok"
        poll_until(
            lambda: len(up.runs()) == 16 or None, timeout_seconds=20, what="16 demo runs stored"
        )
        # up --demo flags the canary the demo plants in a few runs (the canary panel).
        assert up.runs(canary="true"), "no demo run was flagged for its planted canary"
        code, seconds = up.interrupt(timeout_seconds=20)
        assert code == 0, up.output()
        assert seconds < 10, f"took {seconds:.1f} s to stop"
        assert not any(_alive(p) for p in dashboards), "the dashboard outlived loopwatch up"
    assert set(_stored_reasons(up.db_path).values()) == ALL_REASONS


def test_up_refuses_a_busy_dashboard_port_before_starting(tmp_path: Path) -> None:
    """A taken dashboard port is one clear line and exit 2, not a collector left running
    alone behind a banner that promises a dashboard."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                *loopwatch_command(),
                "up",
                "--db",
                str(tmp_path / "lw.duckdb"),
                "--otlp-http",
                f"127.0.0.1:{free_port()}",
                "--http",
                f"127.0.0.1:{free_port()}",
                "--dashboard-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"127.0.0.1:{port} is in use" in done.stderr
    assert "--dashboard-port" in done.stderr
    assert not (tmp_path / "lw.duckdb").exists(), "the collector started anyway"


def test_up_takes_the_collector_flags(tmp_path: Path) -> None:
    """``up`` runs the same collector as ``loopwatch collector`` and takes the same flags:
    a gRPC receiver, a canary file and a retention (here 30 days, so nothing is removed)
    set on ``up`` all reach it. A span sent over gRPC with a canary in its name is stored
    redacted and counted."""
    import grpc
    from loopwatch.collector.receive_grpc import EXPORT_METHOD
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    canary = "lw-canary-up-5d21f0c9e7"
    canaries = tmp_path / "canaries.txt"
    canaries.write_text(f"{canary}\n", encoding="utf-8")
    grpc_address = f"127.0.0.1:{free_port()}"
    flags = ("--otlp-grpc", grpc_address, "--canaries", str(canaries), "--retention-days", "30")
    with start_up(tmp_path, *flags, dashboard=False) as up:
        poll_until(
            lambda: f"OTLP/gRPC:     {grpc_address}" in up.output(),
            timeout_seconds=20,
            what="the gRPC address in the banner",
        )
        request = ExportTraceServiceRequest()
        span = (
            request.resource_spans.add()
            .scope_spans.add()
            .spans.add(trace_id=bytes.fromhex("5d" * 16), span_id=bytes.fromhex("c9" * 8))
        )
        span.name = f"lookup {canary}"
        span.start_time_unix_nano = span.end_time_unix_nano = 1_700_000_000_000_000_000
        with grpc.insecure_channel(grpc_address) as channel:
            channel.unary_unary(EXPORT_METHOD)(request.SerializeToString(), timeout=20)
        assert up.metrics().total("loopwatch_canary_detections_total") == 1
        code, _ = up.interrupt(timeout_seconds=20)
        assert code == 0, up.output()
    with duckdb.connect(str(up.db_path), read_only=True) as con:
        stored = con.execute("SELECT count(*) FROM runs").fetchone()
    assert stored is not None and stored[0] == 1
    assert canary.encode() not in up.db_path.read_bytes()


def test_up_refuses_a_bad_collector_flag_with_one_line(tmp_path: Path) -> None:
    done = run_loopwatch(
        "up", "--db", str(tmp_path / "never.duckdb"), "--retention-days", "forever", cwd=tmp_path
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1 and "store.retention_days" in lines[0], done.stderr
    assert not (tmp_path / "never.duckdb").exists()
