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
from loopwatch.collector.store import Store

WRITER = r"""
import sys
import threading

from loopwatch.collector.events import MappedBatch, RunRow, StepRow, StopRow
from loopwatch.collector.sampling import SamplingConfig
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
