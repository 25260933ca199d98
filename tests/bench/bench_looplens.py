"""Side-by-side ingest: the same OTLP load to loopwatch, to looplens and to a bare sink.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_looplens.py [--seconds S] [--clients N] [--repeat R]

or through pytest with ``LOOPWATCH_BENCH`` set (``smoke``: two seconds per target, sanity
checks only; ``full``: ten seconds). Skipped, with the reason, when looplens is not
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
load client (:class:`tests.bench.bench_ingest._Load`: ``--clients`` connections sending
back to back; a request counts when it is answered 200):

- loopwatch: ``loopwatch collector`` on a fresh DuckDB file with ten canaries; answers
  after the group commit;
- looplens: ``python -m looplens.server`` (uvicorn, its FastAPI app) on a fresh SQLite
  file (``LOOPLENS_DB_PATH``); its ``/v1/traces`` answers after its own commit
  (``with db.connect()``), with a JSON ``{}`` body even to protobuf requests;
- sink: Starlette on uvicorn reading the body and answering an empty
  ``ExportTraceServiceResponse``: the ceiling of this client on this machine.

After each server stops, its stored rows are counted (loopwatch: ``spans_seen``;
looplens: ``events``) so an acknowledgement without storage would show.
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


@dataclass
class SideBySide:
    """Figures of one run: acknowledged spans/s per target, and what was stored."""

    spans_per_s: dict[str, float]
    p99_ms: dict[str, float]
    errors: dict[str, int]
    error_samples: dict[str, list[str]]
    server_cores: dict[str, float | None]
    acked_spans: dict[str, int]
    stored: dict[str, int]
    spans_per_request: int

    @property
    def ratio(self) -> float:
        """loopwatch spans/s over looplens spans/s."""
        return self.spans_per_s["loopwatch"] / max(self.spans_per_s["looplens"], 1e-9)


def _saturate(
    port: int, pid: int, templates: list[Template], clients: int, seconds: float, seed: int
) -> tuple[dict[str, Any], int]:
    load = _Load("127.0.0.1", port, templates, seed)
    before = _cpu_seconds(pid)
    stats = load.saturate(clients, 1.0, seconds)
    after = _cpu_seconds(pid)
    cores = None if before is None or after is None else (after - before) / (seconds + 1.0)
    ordered = sorted(stats.latencies_ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")
    acked = sum(len(templates[i].span_ids) for i, _ in load.acked)
    return {
        "spans_per_s": stats.spans / seconds,
        "p99_ms": p99,
        "errors": stats.errors,
        "error_samples": stats.error_samples,
        "cores": cores,
    }, acked


def run_once(templates: list[Template], *, seconds: float, clients: int, seed: int) -> SideBySide:
    """loopwatch, looplens and the sink in turn, each fresh, the same load against each."""
    figures: dict[str, dict[str, Any]] = {}
    acked: dict[str, int] = {}
    stored: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="lw-bench-looplens-") as tmp:
        folder = Path(tmp)
        db = folder / "loopwatch.duckdb"
        with _collector(db, folder / "collector.log") as (proc, otlp, _api):
            figures["loopwatch"], acked["loopwatch"] = _saturate(
                otlp, proc.pid, templates, clients, seconds, seed
            )
        stored["loopwatch"] = _count(db, "SELECT count(*) FROM spans_seen")
        with _looplens(folder) as (proc, port):
            figures["looplens"], acked["looplens"] = _saturate(
                port, proc.pid, templates, clients, seconds, seed + 1
            )
        stored["looplens"] = _count(folder / "looplens.db", "SELECT count(*) FROM events")
        with _sink() as (proc, port):
            figures["sink"], acked["sink"] = _saturate(
                port, proc.pid, templates, clients, seconds, seed + 2
            )
    return SideBySide(
        spans_per_s={k: v["spans_per_s"] for k, v in figures.items()},
        p99_ms={k: v["p99_ms"] for k, v in figures.items()},
        errors={k: v["errors"] for k, v in figures.items()},
        error_samples={k: v["error_samples"] for k, v in figures.items()},
        server_cores={k: v["cores"] for k, v in figures.items()},
        acked_spans=acked,
        stored=stored,
        spans_per_request=round(statistics.fmean(len(t.span_ids) for t in templates)),
    )


def report(results: list[SideBySide], seconds: float, clients: int) -> str:
    """A table per run and, with several runs, the medians."""
    first = results[0]
    lines = [
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at report;"
        f" load: loopwatch demo spans, {first.spans_per_request} spans per protobuf request,"
        f" {clients} connections back to back, {seconds:g} s per target",
        f"{'run':>4} {'target':<10} {'spans/s':>9} {'p99 ms':>8} {'errors':>6}"
        f" {'server cores':>12} {'acked':>9} {'stored':>9}",
    ]
    for number, result in enumerate(results, 1):
        for target in ("loopwatch", "looplens", "sink"):
            cores = result.server_cores[target]
            stored = str(result.stored[target]) if target in result.stored else "-"
            lines.append(
                f"{number:>4} {target:<10} {result.spans_per_s[target]:>9,.0f}"
                f" {result.p99_ms[target]:>8.1f} {result.errors[target]:>6}"
                f" {'n/a' if cores is None else f'{cores:.2f}':>12}"
                f" {result.acked_spans[target]:>9,} {stored:>9}"
            )
        lines.append(
            f"     loopwatch/looplens {result.ratio:.1f}x;"
            f" loopwatch/sink {result.spans_per_s['loopwatch'] / result.spans_per_s['sink']:.2f}"
        )
    if len(results) > 1:
        for target in ("loopwatch", "looplens", "sink"):
            lines.append(
                f"median {target:<10} "
                f"{statistics.median(r.spans_per_s[target] for r in results):>9,.0f} spans/s"
            )
        lines.append(
            f"median loopwatch/looplens {statistics.median(r.ratio for r in results):.1f}x"
        )
    lines.append(f"target (issue 7): loopwatch >= {TARGET_RATIO:g}x looplens")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Record the demo load, run the three targets, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per target")
    parser.add_argument("--clients", type=int, default=8, help="connections")
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
    print(report(results, args.seconds, args.clients))


@pytest.mark.skipif(not os.environ.get("LOOPWATCH_BENCH"), reason="set LOOPWATCH_BENCH=1 to run")
@pytest.mark.timeout(600)
def test_bench_looplens_side_by_side() -> None:
    missing = looplens_missing()
    if missing:
        pytest.skip(missing)
    full = os.environ.get("LOOPWATCH_BENCH") == "full"
    seconds = 10.0 if full else 2.0
    result = run_once(record_demo(4 if full else 2), seconds=seconds, clients=8, seed=1)
    print(report([result], seconds, 8))
    for target in ("loopwatch", "looplens", "sink"):
        assert result.errors[target] == 0, (target, result.error_samples[target])
        assert result.spans_per_s[target] > 0, target
    assert result.stored["loopwatch"] >= result.acked_spans["loopwatch"]
    assert result.stored["looplens"] > 0
    if full:
        assert result.ratio >= TARGET_RATIO, report([result], seconds, 8)


if __name__ == "__main__":
    main()
