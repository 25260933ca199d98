"""Nothing acknowledged is lost on ``kill -9`` (DESIGN section 5, "store").

A subprocess writes batches through :class:`Store` and prints the id of every batch whose
future resolved; the test kills it with SIGKILL mid-stream, reopens the file (DuckDB
replays its write-ahead log) and checks that every acknowledged span is stored.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from loopwatch.collector.store import Store

WRITER = r"""
import sys
import threading

from loopwatch.collector.rows import MappedBatch, RunRow, StepRow, StopRow
from loopwatch.collector.sample import SamplingConfig
from loopwatch.collector.store import Store, StoreConfig

SPANS = 256
store = Store(
    sys.argv[1],
    config=StoreConfig(sampling=SamplingConfig(max_full_runs_per_hour=10**9)),
)
slots = threading.Semaphore(8)
out = threading.Lock()


def acknowledge(future, index):
    future.result()
    with out:
        sys.stdout.write(f"ACK {index}\n")
        sys.stdout.flush()
    slots.release()


index = 0
while True:
    trace = f"{index + 1:032x}"
    run_id = f"run-{index}"
    batch = MappedBatch(runs=[RunRow(run_id, trace, f"{index + 1:08x}{0:08x}", "loopwatch")])
    for j in range(1, SPANS):
        batch.steps.append(
            StepRow(trace, f"{index + 1:08x}{j:08x}", run_id, "loopwatch", "tool_result",
                    j, j, j + 1, tool="search", outcome="ok", arguments="x" * 200)
        )
    if index % 3 == 0:
        batch.stops.append(
            StopRow(trace, f"{index + 1:08x}{SPANS:08x}", run_id, "loopwatch", "stop_span",
                    "repeated_action", 10**9)
        )
    batch.spans_in = SPANS + 1
    slots.acquire()
    store.submit(batch).add_done_callback(lambda f, i=index: acknowledge(f, i))
    index += 1
"""


def _read_acks(proc: subprocess.Popen[bytes], wanted: int, timeout_seconds: float) -> bytes:
    assert proc.stdout is not None
    data = b""
    deadline = time.monotonic() + timeout_seconds
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while data.count(b"ACK ") < wanted and time.monotonic() < deadline:
            if selector.select(timeout=0.5):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                data += chunk
    return data


def test_every_acknowledged_batch_survives_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "crash.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        data = _read_acks(proc, wanted=40, timeout_seconds=120)
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, errors = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, errors.decode(errors="replace")[-2000:]
    lines = (data + rest).split(b"\n")[:-1]
    acknowledged = sorted(int(line.split()[1]) for line in lines if line.startswith(b"ACK "))
    assert len(acknowledged) >= 40, errors.decode(errors="replace")[-2000:]

    with Store(path) as store:
        reader = store.reader()
        for index in acknowledged:
            detail = reader.get_run(f"run-{index}")
            assert detail is not None, index
            assert detail.run["tool_calls"] == 255, index
            assert len(detail.steps) == 255, index
            if index % 3 == 0:
                assert detail.stop is not None and detail.stop["reason"] == "repeated_action"
                assert detail.run["sampled"] is True
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute("SELECT count(*) FROM spans_seen").fetchone()
    finally:
        con.close()
    assert row is not None and row[0] >= 256 * len(acknowledged)


# ---------------------------------------------------------------- whole collector


SENDER = Path(__file__).resolve().parents[1] / "reliability" / "sdk_sender.py"
KILLS = 3
SEND_SECONDS = 12.0
RUNS_PER_SECOND = 100.0
FULL_SAMPLING = "[sampling]\nmax_runs_per_reason_tool_per_hour = 1000000000\n"


def _sender_log(
    path: Path,
) -> tuple[dict[tuple[str, str], tuple[str, str, str]], set[tuple[str, str]], str]:
    produced: dict[tuple[str, str], tuple[str, str, str]] = {}
    acknowledged: set[tuple[str, str]] = set()
    done = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if parts[0] == "P":
            produced[(parts[1], parts[2])] = (parts[3], parts[4], parts[5])
        elif parts[0] == "A":
            acknowledged.add((parts[1], parts[2]))
        elif parts[0] == "DONE":
            done = line
    return produced, acknowledged, done


def _acks_so_far(path: Path) -> int:
    try:
        return path.read_text(encoding="utf-8").count("\nA ")
    except OSError:
        return 0


@pytest.mark.timeout(150)
def test_collector_killed_three_times_under_sdk_load_keeps_every_ack(tmp_path: Path) -> None:
    """Proves "nothing acknowledged is lost on kill -9" for the whole collector process.

    A sender subprocess runs real guarded runs at 100 runs/s (800 spans/s) through the
    OpenTelemetry SDK (``BatchSpanProcessor`` + ``OTLPSpanExporter`` with its retries) and
    logs every span produced and every span whose export was answered 200. The collector
    is killed with SIGKILL three times while the load runs and restarted on the same
    ports and DuckDB file. Afterwards: every produced span was acknowledged (the
    exporter's retries bridged the outages: no export failed), every acknowledged span is
    in the store exactly once (``spans_seen``, and its row in ``runs``, ``steps`` or
    ``stops``), and the totals in the store equal the acknowledged spans. ``/metrics``
    counts from zero in each process, so the last one shows at most those totals."""
    from tests.reliability.support import collector_ports, launch_collector, store_key, store_query

    db = tmp_path / "crash.duckdb"
    ports = collector_ports()
    log = tmp_path / "sender.log"
    collector = launch_collector(tmp_path, db_path=db, ports=ports, config=FULL_SAMPLING)
    sender = subprocess.Popen(
        [
            sys.executable,
            str(SENDER),
            collector.otlp_url,
            str(log),
            "--seconds",
            str(SEND_SECONDS),
            "--runs-per-second",
            str(RUNS_PER_SECOND),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    acked_at_kill: list[int] = []
    try:
        for _ in range(KILLS):
            floor = _acks_so_far(log) + 1500
            deadline = time.monotonic() + 30
            while _acks_so_far(log) < floor and time.monotonic() < deadline:
                time.sleep(0.05)
            assert collector.kill() == -signal.SIGKILL
            acked_at_kill.append(_acks_so_far(log))
            time.sleep(0.5)  # the exporter meets refused connections and backs off
            collector = launch_collector(tmp_path, db_path=db, ports=ports, config=FULL_SAMPLING)
        _, sender_errors = sender.communicate(timeout=90)
        assert sender.returncode == 0, sender_errors.decode(errors="replace")[-3000:]
        produced, acknowledged, done = _sender_log(log)
        assert done, "the sender did not finish"
        assert acked_at_kill[0] > 0 and acked_at_kill[-1] < len(acknowledged)
        # Nothing silently dropped end to end: the retries bridged every outage.
        assert set(produced) == acknowledged, (done, len(produced), len(acknowledged))

        tools = {"ok": 0, "blocked": 0}
        stops = 0
        for kind, outcome, _run in (produced[key] for key in acknowledged):
            if kind == "tool_result":
                tools[outcome] += 1
            stops += kind == "stop"
        metrics = collector.metrics()
        for outcome, count in tools.items():
            assert (
                metrics.value(
                    "loopwatch_tool_calls_total",
                    agent="crash",
                    tool="lookup_order",
                    outcome=outcome,
                )
                <= count
            ), (outcome, count, collector.stderr_text())
        assert (
            metrics.value(
                "loopwatch_agent_stops_total", agent="crash", stop_reason="repeated_action"
            )
            <= stops
        )
        assert collector.stop() == 0, collector.stderr_text()
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait(timeout=10)
        if collector.running:
            collector.kill()

    seen = store_query(db, "SELECT span_key, trace_key FROM spans_seen")
    assert len(seen) == len(set(seen)), "a span was stored twice"
    seen_keys = {(int(a), int(b)) for a, b in seen}
    missing = [key for key in acknowledged if store_key(*key) not in seen_keys]
    assert not missing, f"{len(missing)} acknowledged spans not in spans_seen, e.g. {missing[:3]}"

    step_rows = store_query(db, "SELECT trace_id, span_id, kind, outcome FROM steps")
    assert len(step_rows) == len({(t, s) for t, s, _, _ in step_rows}), "a step stored twice"
    steps = {(t, s): (k, o) for t, s, k, o in step_rows}
    stop_ids = {(t, s) for t, s in store_query(db, "SELECT trace_id, span_id FROM stops")}
    run_ids = {(t, s) for t, s in store_query(db, "SELECT trace_id, run_span_id FROM runs")}
    for key in acknowledged:
        kind, outcome, _run = produced[key]
        if kind == "tool_result":
            assert steps.get(key) == ("tool_result", outcome), key
        elif kind == "decision":
            assert steps.get(key, ("",))[0] == "decision", key
        elif kind == "stop":
            assert key in stop_ids, key
        else:
            assert key in run_ids, key
    ((calls, blocked, n_stops),) = store_query(
        db,
        "SELECT sum(tool_calls), sum(tool_blocked), "
        "(SELECT count(*) FROM stops WHERE reason = 'repeated_action') FROM runs "
        "WHERE agent = 'crash'",
    )
    assert (calls, blocked, n_stops) == (tools["ok"] + tools["blocked"], tools["blocked"], stops)
    print(
        f"\ncrash: {len(produced)} spans produced, {len(acknowledged)} acknowledged and stored, "
        f"SIGKILL x{KILLS} after {acked_at_kill} acks; {done}"
    )
