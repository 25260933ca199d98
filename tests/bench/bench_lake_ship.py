"""Lake shipping benchmark: lake lag at half capacity, shipping CPU at capacity.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_lake_ship.py [--seconds S] [--clients N]

or through pytest with ``LOOPWATCH_BENCH`` set (``test_bench_lake_ship_smoke``: a short
run that still prints the figures and checks that the lake holds each run once).

What is measured (issue 27, "Lake lag" and "A sidecar is light"), with the request
bodies, load process and CPU accounting of ``bench_ingest.py`` (512-span requests of real
loopwatch runs, each send with new trace and run ids; server CPU read from ``/proc``,
child processes included), against real ``loopwatch collector`` processes and a real
PostgreSQL catalog (``scripts/postgres.sh``) with a local data folder:

1. **Capacity without a lake**: a fresh collector, ``--clients`` connections back to back
   for ``--seconds``; acknowledged spans/s and the server's CPU seconds per acknowledged
   span over the whole load.
2. **Capacity with a lake**: the same against a fresh collector with ``--lake``; its CPU
   is counted from the start of the load until the shipper's backlog is empty (the
   shipping of what was acknowledged is part of its cost). Overhead = CPU per span with
   a lake / without - 1 (target <= 10 %).
3. **Lake lag at half capacity**: the same lake collector paced (open loop) at half the
   capacity of step 1 for ``--seconds``, while a poller reads ``lake.runs`` every
   ``--poll-seconds`` with a DuckDB of its own. Lag of a run = when the poller first saw
   it minus its ``last_seen_unix_nano`` (the local commit of its last span). Runs are
   shipped ``lake.ship_grace_seconds`` (default 5 s) after their last span, checked
   every ``lake.ship_interval_seconds`` (3 s): the floor of the lag is the grace.
   Target: p99 <= 15 s. The collector's own ``loopwatch_lake_ship_lag_seconds``
   (local commit to lake commit) is printed beside it.

The machine's other tenants share its cores: CPU figures move between runs; compare
the two capacity rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench import bench_ingest as ingest  # noqa: E402


def _load_main(spec: dict[str, Any]) -> dict[str, Any]:
    """The load process: one phase (``saturate`` or ``pace``) against one collector."""
    templates = [
        ingest.build_template(spec["seed"] + i, capture_fraction=0.25)
        for i in range(spec["templates"])
    ]
    load = ingest._Load("127.0.0.1", spec["port"], templates, spec["seed"] * 7919)
    started = time.time()
    if spec["phase"] == "saturate":
        stats = load.saturate(spec["clients"], 0.5, spec["seconds"])
    else:
        stats = load.pace(spec["clients"], spec["rate"], spec["seconds"])
    return {
        "phase_spans_per_s": stats.spans / spec["seconds"],
        "errors": stats.errors,
        "error_samples": stats.error_samples,
        "acked_spans": sum(len(templates[i].span_ids) for i, _ in load.acked),
        "acked_runs": sum(templates[i].runs for i, _ in load.acked),
        "load_started": started,
    }


def _run_load(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--load", json.dumps(spec)],
        capture_output=True,
        check=False,
        timeout=spec["seconds"] * 3 + 600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@contextlib.contextmanager
def _collector(folder: Path, *lake_args: str) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    otlp, api = ingest._free_port(), ingest._free_port()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "collector.log").open("wb") as out:
        proc = subprocess.Popen(
            [
                *ingest.collector_command(),
                "collector",
                "--db",
                str(folder / "bench.duckdb"),
                "--otlp-http",
                f"127.0.0.1:{otlp}",
                "--http",
                f"127.0.0.1:{api}",
                *lake_args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")},
        )
    try:
        ingest._wait_http(f"http://127.0.0.1:{api}/healthz", proc)
        yield proc, otlp, api
    finally:
        ingest._stop(proc)


def _metrics(api: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{api}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def _drain(api: int, timeout_s: float = 300.0) -> float:
    """Wait until the backlog is empty and the shipped count stops moving; returns the
    shipped total."""
    deadline = time.monotonic() + timeout_s
    last = -1.0
    while time.monotonic() < deadline:
        text = _metrics(api)
        backlog = ingest._metric(text, "loopwatch_lake_backlog_runs") or 0.0
        shipped = ingest._metric(text, "loopwatch_lake_runs_shipped_total") or 0.0
        if backlog == 0 and shipped == last:
            return shipped
        last = shipped
        time.sleep(2.5)
    raise RuntimeError("the shipper did not drain its backlog in time")


def _histogram_p99(text: str, name: str) -> float | None:
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit()[-1])))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    for upper, count in sorted(buckets):
        if count >= 0.99 * total:
            return upper
    return None


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class _Rss:
    """Samples the collector's resident memory (``VmRSS``) every ``interval`` seconds
    while in a ``with`` block; ``max_mib`` and ``last_mib`` after it."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            rss = _rss_mib(self.pid)
            if rss is not None:
                self.samples.append(rss)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> _Rss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def figures(self) -> dict[str, float]:
        samples = self.samples or [float("nan")]
        return {"rss_max_mib": max(samples), "rss_last_mib": samples[-1]}


class _Poller:
    """Reads ``lake.runs`` every ``interval`` seconds; records when each run first shows."""

    def __init__(self, catalog: str, data_path: str, interval: float) -> None:
        from loopwatch.collector.lake.connect import LakeTarget

        self.target = LakeTarget(catalog, data_path)
        self.interval = interval
        self.first_seen: dict[int, tuple[int, int]] = {}  # run_key -> (seen_ns, last_seen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._con: Any = None

    def _snapshot(self) -> list[tuple[int, int]]:
        # One connection for the whole run: each query is a new transaction, which reads
        # the lake's latest snapshot (connecting per poll would cost the machine a second
        # of CPU each time, and delay the reading by as much).
        if self._con is None:
            from loopwatch.collector.lake.connect import connect_lake

            self._con = connect_lake(self.target, read_only=True, threads=1)
        rows = self._con.execute("SELECT run_key, last_seen_unix_nano FROM lake.runs").fetchall()
        return [(int(k), int(s)) for k, s in rows]

    def baseline(self) -> None:
        self.first_seen = {k: (0, s) for k, s in self._snapshot()}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            # A row visible to a snapshot taken at `before` was committed before it:
            # `before - last_seen` bounds the lag from above.
            before = time.time_ns()
            for key, last_seen in self._snapshot():
                self.first_seen.setdefault(key, (before, last_seen))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._con is not None:
            self._con.close()

    def lags(self) -> list[float]:
        return [(seen - last) / 1e9 for seen, last in self.first_seen.values() if seen]


def run_once(
    *, seconds: float, clients: int, paced_clients: int, poll_seconds: float, templates: int
) -> dict[str, Any]:
    """Steps 1-3 of the module docstring; returns the figures."""
    from tests.integration.postgres import start_postgres

    figures: dict[str, Any] = {}
    spec = {"seconds": seconds, "clients": clients, "templates": templates, "seed": 1}
    with tempfile.TemporaryDirectory(prefix="lw-bench-lake-") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)
        with _collector(tmp / "plain") as (proc, otlp, _api):
            before = ingest._cpu_seconds(proc.pid) or 0.0
            with _Rss(proc.pid) as rss:
                plain = _run_load(spec | {"phase": "saturate", "port": otlp})
            cpu = (ingest._cpu_seconds(proc.pid) or 0.0) - before
        figures["plain"] = (
            plain | rss.figures() | {"us_per_span": cpu / max(plain["acked_spans"], 1) * 1e6}
        )
        with start_postgres(tmp) as pg:
            pg.create_database("lake")
            catalog, data = pg.catalog("lake"), str(tmp / "lake-data") + "/"
            lake_args = ("--lake", catalog, "--lake-data", data, "--collector-id", "bench")
            with _collector(tmp / "lake", *lake_args) as (proc, otlp, api):
                before = ingest._cpu_seconds(proc.pid) or 0.0
                with _Rss(proc.pid) as rss:
                    lake = _run_load(spec | {"phase": "saturate", "port": otlp, "seed": 2})
                    shipped = _drain(api)
                cpu = (ingest._cpu_seconds(proc.pid) or 0.0) - before
                ship_cpu = ingest._metric(_metrics(api), "loopwatch_lake_ship_cpu_seconds_total")
                figures["lake"] = (
                    lake
                    | rss.figures()
                    | {
                        "us_per_span": cpu / max(lake["acked_spans"], 1) * 1e6,
                        "ship_thread_us_per_span": (ship_cpu or 0.0)
                        / max(lake["acked_spans"], 1)
                        * 1e6,
                        "shipped_runs": shipped,
                    }
                )
                rate = plain["phase_spans_per_s"] / 2
                poller = _Poller(catalog, data, poll_seconds)
                poller.baseline()
                poller.start()
                with _Rss(proc.pid) as rss:
                    paced = _run_load(
                        spec
                        | {"phase": "pace", "port": otlp, "seed": 3, "rate": rate,
                           "clients": paced_clients}
                    )  # fmt: skip
                    _drain(api)
                time.sleep(poll_seconds * 2)
                poller.stop()
                text = _metrics(api)
                lags = poller.lags()
                figures["paced"] = (
                    paced
                    | rss.figures()
                    | {
                        "offered_spans_per_s": rate,
                        "runs_seen": len(lags),
                        "lag_p50_s": ingest._percentile(lags, 50),
                        "lag_p99_s": ingest._percentile(lags, 99),
                        "lag_max_s": max(lags, default=float("nan")),
                        "histogram_p99_le_s": _histogram_p99(
                            text, "loopwatch_lake_ship_lag_seconds"
                        ),
                        "failures": ingest._metric(text, "loopwatch_lake_ship_failures_total"),
                        "skipped": ingest._metric(text, "loopwatch_lake_runs_skipped_total"),
                    }
                )
            from loopwatch.collector.lake.connect import LakeTarget, connect_lake

            con = connect_lake(LakeTarget(catalog, data), read_only=True)
            try:
                row = con.execute(
                    "SELECT count(*), count(DISTINCT run_id) FROM lake.runs"
                ).fetchone()
            finally:
                con.close()
            figures["lake_runs"], figures["lake_distinct_runs"] = row if row else (0, 0)
    figures["cpu_overhead"] = figures["lake"]["us_per_span"] / figures["plain"]["us_per_span"] - 1
    # The shipping thread's own CPU against the rest of the same process: free of the
    # run-to-run spread of the machine, but blind to costs the shipper causes elsewhere.
    ship = figures["lake"]["ship_thread_us_per_span"]
    figures["ship_thread_overhead"] = ship / max(figures["lake"]["us_per_span"] - ship, 1e-9)
    return figures


def report(f: dict[str, Any]) -> str:
    """The figures as a small table."""
    p, lk, pc = f["plain"], f["lake"], f["paced"]
    return "\n".join(
        [
            "lake shipping (bench_lake_ship.py)",
            f"  capacity, no lake : {p['phase_spans_per_s']:9.0f} spans/s "
            f"{p['us_per_span']:7.1f} us CPU/span",
            f"  capacity, lake    : {lk['phase_spans_per_s']:9.0f} spans/s "
            f"{lk['us_per_span']:7.1f} us CPU/span (until the backlog drained; "
            f"{lk['shipped_runs']:.0f} runs shipped)",
            f"  CPU added by shipping at capacity: {f['cpu_overhead'] * 100:+.1f} % "
            "(whole process, lake / no lake - 1; target <= 10 %); the "
            f"shipping thread alone: {lk['ship_thread_us_per_span']:.1f} us/span, "
            f"{f['ship_thread_overhead'] * 100:.1f} % of the rest",
            f"  half capacity     : {pc['offered_spans_per_s']:9.0f} spans/s offered, "
            f"{pc['phase_spans_per_s']:.0f} acked, {pc['runs_seen']} runs seen in the lake",
            f"  lake lag          : p50 {pc['lag_p50_s']:.1f} s, p99 {pc['lag_p99_s']:.1f} s, "
            f"max {pc['lag_max_s']:.1f} s (target p99 <= 15 s; collector histogram p99 <= "
            f"{pc['histogram_p99_le_s']} s)",
            f"  collector RSS MiB : max {p['rss_max_mib']:.0f} at capacity without the lake; "
            f"with it, max {lk['rss_max_mib']:.0f} at capacity, {pc['rss_max_mib']:.0f} at half "
            f"capacity (last {pc['rss_last_mib']:.0f}; target <= 300)",
            f"  lake runs         : {f['lake_runs']} rows, {f['lake_distinct_runs']} distinct; "
            f"failures {pc['failures']:.0f}, skipped {pc['skipped']:.0f}",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds per phase")
    parser.add_argument("--clients", type=int, default=8, help="connections when saturating")
    # Few connections: at half capacity each must send more often than the server's 5 s
    # keep-alive timeout, or sends meet closed connections.
    parser.add_argument("--paced-clients", type=int, default=4, help="connections when paced")
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="lake poll interval")
    parser.add_argument("--templates", type=int, default=8, help="request templates")
    parser.add_argument("--json", action="store_true", help="print raw figures as JSON too")
    parser.add_argument("--load", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load:
        json.dump(_load_main(json.loads(args.load)), sys.stdout)
        return
    figures = run_once(
        seconds=args.seconds,
        clients=args.clients,
        paced_clients=args.paced_clients,
        poll_seconds=args.poll_seconds,
        templates=args.templates,
    )
    if args.json:
        print(json.dumps(figures, default=str))
    print(report(figures))


@pytest.mark.skipif(not os.environ.get("LOOPWATCH_BENCH"), reason="set LOOPWATCH_BENCH=1 to run")
def test_bench_lake_ship_smoke() -> None:
    figures = run_once(seconds=3.0, clients=4, paced_clients=2, poll_seconds=0.5, templates=4)
    print(report(figures))
    assert figures["plain"]["errors"] == figures["lake"]["errors"] == 0
    assert figures["paced"]["runs_seen"] > 0
    assert figures["lake_runs"] == figures["lake_distinct_runs"] > 0


if __name__ == "__main__":
    main()
