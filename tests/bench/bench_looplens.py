"""Side-by-side ingest: the same OTLP load to loopwatch, to looplens and to a bare sink.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_looplens.py [--seconds S] [--clients 4,8,32] [--repeat R]

or through pytest with ``LOOPWATCH_BENCH`` set (``smoke``: 8 connections, two seconds per
target, sanity checks only; ``full``: the default connection counts, ten seconds each,
and the target asserted). Skipped, with the reason, when looplens is not
installed (``pip install 'looplens[server]'``, in the ``dev`` extra).

The load (issue 7, "Side-by-side ingest benchmark"): real spans from ``loopwatch demo``.
The shipped example runs (:data:`loopwatch.replay.demo.EXAMPLES_DIR`, 16 runs, one per
stop reason, content capture on) are replayed once through the instrumentation and the
OpenTelemetry SDK's OTLP/HTTP exporter into a recording server, which keeps the
protobuf request bodies as the exporter sent them (one 131-span request per demo
session). Each body is then rewritten once so that every trace id ends in the same
8-byte marker and every run id carries a 16-hex-digit marker; every request sent
replaces both with fresh values (:meth:`tests.bench.bench_ingest.Template.render`), so
no span or run is ever sent twice and neither server can deduplicate its way ahead.

Targets, each a subprocess on 127.0.0.1 started in turn within one run, with the same
load client (:class:`tests.bench.bench_ingest._Load`: N connections sending back to
back; a request counts when it is answered 200), once per connection count in
``--clients``, each time on a fresh server and store:

- loopwatch: ``loopwatch collector`` on a fresh DuckDB file with ten canaries; answers
  after the group commit;
- looplens: ``python -m looplens.server`` (uvicorn, its FastAPI app) on a fresh SQLite
  file (``LOOPLENS_DB_PATH``); its ``/v1/traces`` answers after its own commit
  (``with db.connect()``), with a JSON ``{}`` body even to protobuf requests;
- sink: Starlette on uvicorn reading the body and answering an empty
  ``ExportTraceServiceResponse``: the ceiling of this client on this machine.

After each server stops, its stored rows are counted (loopwatch: ``spans_seen``;
looplens: ``events``) so an acknowledgement without storage would show.

Why several connection counts: a server's spans/s at one count is not its capacity.
loopwatch answers after its group commit, so with few connections it is bound by that
latency (Little's law: spans/s = connections x spans per request / ack time) and leaves
CPU idle; with more, groups grow and both cores work. looplens, one process, is at its
best with few connections and slows with many. The headline ratio compares each
server's capacity (its best count); the ratio at each count is printed beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_ingest import (
    Template,
    _collector,
    _cpu_seconds,
    _free_port,
    _Load,
    _sink,
    _stop,
    _wait_http,
)

TARGET_RATIO = 5.0
_TRACE_MARKER_BYTES = 8


def looplens_missing() -> str | None:
    """Why looplens cannot run here, or None when it can."""
    for module in ("looplens", "fastapi", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'looplens[server]')"
    return None


# ----------------------------------------------------------------- recording


class _Recorder(BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if body:
            self.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


def record_demo(sessions: int = 1) -> list[Template]:
    """Replay the shipped example runs ``sessions`` times; one template per request body.

    Raises:
        AssertionError: the demo exported nothing, or a marker is not unique.
    """
    from loopwatch.replay.demo import EXAMPLES_DIR, run_demo
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    handler = type("Recorder", (_Recorder,), {"bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/v1/traces"
    templates: list[Template] = []
    try:
        for _ in range(sessions):
            run_marker = secrets.token_hex(8)
            trace_marker = secrets.token_bytes(_TRACE_MARKER_BYTES)
            handler.bodies.clear()
            report = run_demo(
                [EXAMPLES_DIR], otlp_url=url, run_prefix=f"lwb{run_marker}", capture_content=True
            )
            assert report.spans_exported > 0, "the demo exported no spans"
            for raw in handler.bodies:
                request = ExportTraceServiceRequest.FromString(raw)
                span_ids: list[int] = []
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            span.trace_id = span.trace_id[:_TRACE_MARKER_BYTES] + trace_marker
                            for link in span.links:
                                link.trace_id = link.trace_id[:_TRACE_MARKER_BYTES] + trace_marker
                            span_ids.append(int.from_bytes(span.span_id, "big"))
                body = request.SerializeToString()
                if body.count(trace_marker) < len(span_ids):
                    raise AssertionError("trace marker is not unique to trace ids")
                templates.append(
                    Template(
                        body,
                        trace_marker,
                        run_marker.encode("ascii"),
                        tuple(span_ids),
                        len(report.runs),
                        dict(report.stops),
                    )
                )
    finally:
        server.shutdown()
        server.server_close()
    return templates


# -------------------------------------------------------------------- looplens


@contextlib.contextmanager
def _looplens(folder: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    env = {
        **os.environ,
        "LOOPLENS_HOST": "127.0.0.1",
        "LOOPLENS_PORT": str(port),
        "LOOPLENS_DB_PATH": str(folder / "looplens.db"),
    }
    with (folder / "looplens.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "looplens.server"],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/health", proc)
        yield proc, port
    finally:
        _stop(proc)


def _count(db: Path, sql: str) -> int:
    if db.suffix == ".duckdb":
        import duckdb

        con = duckdb.connect(str(db), read_only=True)
        try:
            row = con.execute(sql).fetchone()
        finally:
            con.close()
    else:
        import sqlite3

        with contextlib.closing(sqlite3.connect(db)) as lite:
            row = lite.execute(sql).fetchone()
    return int(row[0]) if row else 0


# ----------------------------------------------------------------------- run

TARGETS: tuple[str, ...] = ("loopwatch", "looplens", "sink")
DEFAULT_CLIENTS: tuple[int, ...] = (4, 8, 32)


@dataclass
class Level:
    """One target at one number of connections: a fresh server, ``seconds`` of load."""

    spans_per_s: float
    p99_ms: float
    errors: int
    error_samples: list[str]
    server_cores: float | None
    acked_spans: int
    stored: int | None


@dataclass
class SideBySide:
    """Figures of one run: every target at every number of connections.

    A server's *capacity* is its best acknowledged spans/s over the connection counts
    tried: a server that acknowledges only after its commit is latency-bound at few
    connections and uses more cores with more, while a single-threaded one can get
    slower with more (looplens does). Comparing capacity with capacity, each at its own
    best, is what the headline ratio does; the ratio at each count is printed too.
    """

    levels: dict[tuple[str, int], Level]
    clients: tuple[int, ...]
    spans_per_request: int

    def capacity(self, target: str) -> tuple[float, int]:
        """``(best spans/s, connections it was reached with)`` of ``target``."""
        return max((self.levels[(target, c)].spans_per_s, c) for c in self.clients)

    def ratio_at(self, clients: int) -> float:
        """loopwatch spans/s over looplens spans/s at ``clients`` connections."""
        return self.levels[("loopwatch", clients)].spans_per_s / max(
            self.levels[("looplens", clients)].spans_per_s, 1e-9
        )

    @property
    def ratio(self) -> float:
        """loopwatch's capacity over looplens's capacity."""
        return self.capacity("loopwatch")[0] / max(self.capacity("looplens")[0], 1e-9)


def _saturate(
    port: int, pid: int, templates: list[Template], clients: int, seconds: float, seed: int
) -> Level:
    load = _Load("127.0.0.1", port, templates, seed)
    before = _cpu_seconds(pid)
    stats = load.saturate(clients, 1.0, seconds)
    after = _cpu_seconds(pid)
    cores = None if before is None or after is None else (after - before) / (seconds + 1.0)
    ordered = sorted(stats.latencies_ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")
    return Level(
        spans_per_s=stats.spans / seconds,
        p99_ms=p99,
        errors=stats.errors,
        error_samples=stats.error_samples,
        server_cores=cores,
        acked_spans=sum(len(templates[i].span_ids) for i, _ in load.acked),
        stored=None,
    )


def _level(
    target: str, folder: Path, templates: list[Template], clients: int, seconds: float, seed: int
) -> Level:
    """Start ``target`` fresh in ``folder``, load it, stop it, count what it stored."""
    if target == "loopwatch":
        db = folder / "loopwatch.duckdb"
        with _collector(db, folder / "collector.log") as (proc, otlp, _api):
            level = _saturate(otlp, proc.pid, templates, clients, seconds, seed)
        level.stored = _count(db, "SELECT count(*) FROM spans_seen")
    elif target == "looplens":
        with _looplens(folder) as (proc, port):
            level = _saturate(port, proc.pid, templates, clients, seconds, seed)
        level.stored = _count(folder / "looplens.db", "SELECT count(*) FROM events")
    else:
        with _sink() as (proc, port):
            level = _saturate(port, proc.pid, templates, clients, seconds, seed)
    return level


def run_once(
    templates: list[Template], *, seconds: float, clients: tuple[int, ...], seed: int
) -> SideBySide:
    """Each target at each number of connections in turn, each on a fresh server and
    store, the same load (the same request bodies, fresh ids) against each."""
    levels: dict[tuple[str, int], Level] = {}
    for n, count in enumerate(clients):
        for t, target in enumerate(TARGETS):
            with tempfile.TemporaryDirectory(prefix="lw-bench-looplens-") as tmp:
                levels[(target, count)] = _level(
                    target, Path(tmp), templates, count, seconds, seed + 10 * n + t
                )
    return SideBySide(
        levels=levels,
        clients=clients,
        spans_per_request=round(statistics.fmean(len(t.span_ids) for t in templates)),
    )


def report(results: list[SideBySide], seconds: float) -> str:
    """A table per run (every target at every connection count, the ratio at each, each
    target's capacity and the capacity ratio) and, with several runs, the medians."""
    first = results[0]
    lines = [
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at report;"
        f" load: loopwatch demo spans, {first.spans_per_request} spans per protobuf request,"
        f" connections back to back, {seconds:g} s per target and connection count,"
        " a fresh server each time",
        f"{'run':>4} {'conns':>5} {'target':<10} {'spans/s':>9} {'p99 ms':>8} {'errors':>6}"
        f" {'server cores':>12} {'acked':>9} {'stored':>9}",
    ]
    for number, result in enumerate(results, 1):
        for count in result.clients:
            for target in TARGETS:
                level = result.levels[(target, count)]
                cores = level.server_cores
                stored = "-" if level.stored is None else str(level.stored)
                lines.append(
                    f"{number:>4} {count:>5} {target:<10} {level.spans_per_s:>9,.0f}"
                    f" {level.p99_ms:>8.1f} {level.errors:>6}"
                    f" {'n/a' if cores is None else f'{cores:.2f}':>12}"
                    f" {level.acked_spans:>9,} {stored:>9}"
                )
            lines.append(
                f"{'':>11}loopwatch/looplens at {count} connections {result.ratio_at(count):.1f}x"
            )
        best = {target: result.capacity(target) for target in TARGETS}
        lines.append(
            f"{'':>11}capacity (best over connections): "
            + ", ".join(f"{t} {best[t][0]:,.0f} at {best[t][1]}" for t in TARGETS)
        )
        lines.append(
            f"{'':>11}loopwatch/looplens capacity {result.ratio:.1f}x;"
            f" loopwatch/sink {best['loopwatch'][0] / best['sink'][0]:.2f}"
        )
    if len(results) > 1:
        for target in TARGETS:
            lines.append(
                f"median capacity {target:<10} "
                f"{statistics.median(r.capacity(target)[0] for r in results):>9,.0f} spans/s"
            )
        for count in first.clients:
            lines.append(
                f"median loopwatch/looplens at {count} connections "
                f"{statistics.median(r.ratio_at(count) for r in results):.1f}x"
            )
        lines.append(
            f"median loopwatch/looplens capacity {statistics.median(r.ratio for r in results):.1f}x"
        )
    lines.append(f"target (issue 7): loopwatch >= {TARGET_RATIO:g}x looplens")
    return "\n".join(lines)


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of counts: {text!r}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("connection counts must be >= 1")
    return counts


def main(argv: list[str] | None = None) -> None:
    """Record the demo load, run the three targets at each connection count, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="seconds per target and connection count"
    )
    parser.add_argument(
        "--clients",
        type=_counts,
        default=DEFAULT_CLIENTS,
        help="connection counts, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs; medians are printed")
    parser.add_argument("--sessions", type=int, default=4, help="demo sessions recorded")
    args = parser.parse_args(argv)
    missing = looplens_missing()
    if missing:
        raise SystemExit(f"bench_looplens: {missing}")
    templates = record_demo(args.sessions)
    results = [
        run_once(templates, seconds=args.seconds, clients=args.clients, seed=1 + 1000 * n)
        for n in range(args.repeat)
    ]
    print(report(results, args.seconds))


@pytest.mark.skipif(not os.environ.get("LOOPWATCH_BENCH"), reason="set LOOPWATCH_BENCH=1 to run")
@pytest.mark.timeout(900)
def test_bench_looplens_side_by_side() -> None:
    missing = looplens_missing()
    if missing:
        pytest.skip(missing)
    full = os.environ.get("LOOPWATCH_BENCH") == "full"
    seconds = 10.0 if full else 2.0
    clients = DEFAULT_CLIENTS if full else (8,)
    result = run_once(record_demo(4 if full else 2), seconds=seconds, clients=clients, seed=1)
    print(report([result], seconds))
    for (target, count), level in result.levels.items():
        assert level.errors == 0, (target, count, level.error_samples)
        assert level.spans_per_s > 0, (target, count)
        if target == "loopwatch":
            assert level.stored is not None and level.stored >= level.acked_spans, count
        if target == "looplens":
            assert level.stored, count
    if full:
        assert result.ratio >= TARGET_RATIO, report([result], seconds)


if __name__ == "__main__":
    main()
