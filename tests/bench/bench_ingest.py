"""Ingest benchmark: a real collector subprocess against a bare HTTP sink, same load, same run.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_ingest.py [--seconds S] [--clients N] [--repeat R]

or through pytest with ``LOOPWATCH_BENCH`` set (``test_bench_ingest_smoke``: a short run
that checks sanity only; skipped otherwise).

What is measured (issue 3, "Benchmark"): protobuf ``ExportTraceServiceRequest`` bodies of
512 spans POSTed to ``/v1/traces``

- of ``loopwatch collector`` started as a subprocess on 127.0.0.1 with a fresh DuckDB
  file in a temporary directory: decode, redaction, map, detect, sampling, commit and
  metrics all on, the answer sent only after the commit;
- of a bare sink (Starlette on uvicorn, the collector's own HTTP stack) that reads the
  body and answers 200 with an empty ``ExportTraceServiceResponse``: the ceiling.

Each target gets a saturation phase (``--clients`` connections sending back to back; the
acknowledged spans/s) and a paced phase (open loop at half the collector's saturation
rate, or ``--rate``; time to acknowledge measured from each request's *scheduled* send
time, so a stalled server cannot hide its queue). The load runs in a separate process so
its CPU is not charged to the server process, but on a small machine the two still share
cores: the table shows both processes' CPU use (cores busy during the phase; the
server's includes its child processes, e.g. ``[pipeline] decode_workers``). The sink's
saturation figure is bounded by that one load process, so it is a lower bound of the
ceiling. The collector runs with its defaults plus ten registered canaries
(``--canaries``), and a quarter of the runs carry captured tool arguments and results
(``--capture-fraction``), so the redaction matcher sees real work. After the collector
is stopped with SIGTERM, every acknowledged span key is looked up in ``spans_seen`` and
the run rows are counted (the last table line).

Batches are real loopwatch spans: runs of several kinds (completed, repeated-action loops,
budget stops, failing tools, plans) played through :class:`loopwatch.instrumentation.Run`
into an SDK ``TracerProvider`` with an in-memory exporter, then encoded with the SDK's OTLP
encoder. A few such 512-span templates are recorded once; every request rewrites, in the
encoded bytes, the low 64 bits of each trace id and the first half of each run id (both
recorded with marker values), so no span or run is ever sent twice (the collector
deduplicates by trace and span id) and the encoding cost stays out of the load loop.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BATCH_SPANS = 512
TRACES_PATH = "/v1/traces"
_HEADERS = {"Content-Type": "application/x-protobuf"}
_AGENTS = (
    ("orders", "orders-agent", ("search_orders", "get_order", "list_refunds")),
    ("support", "support-agent", ("search_tickets", "get_customer", "send_reply")),
    ("research", "research-agent", ("web_search", "fetch_page", "summarize")),
    ("billing", "billing-agent", ("get_invoice", "list_payments", "fetch_invoice")),
)
_FILLER_MAX_SPANS = 45
CANARIES = tuple(f"lw-canary-{i:02d}-{random.Random(i).getrandbits(64):016x}" for i in range(10))


# ----------------------------------------------------------------- span templates


@dataclass(frozen=True)
class Template:
    """One encoded 512-span request with marker ids to rewrite per send.

    Attributes:
        body: serialized ``ExportTraceServiceRequest``.
        trace_marker: the low 8 bytes shared by every trace id of the template.
        run_marker: the first 16 hex chars shared by every run id of the template.
        span_ids: the span ids (64-bit ints), one per span.
        runs: runs in the template.
        stops: stop reasons of the runs, by reason.
    """

    body: bytes
    trace_marker: bytes
    run_marker: bytes
    span_ids: tuple[int, ...]
    runs: int
    stops: dict[str, int]

    def render(self, trace_low: int, run_prefix: str) -> bytes:
        """The body with ``trace_low`` as the trace ids' low 64 bits and a new run prefix."""
        return self.body.replace(self.trace_marker, trace_low.to_bytes(8, "big")).replace(
            self.run_marker, run_prefix.encode("ascii")
        )


def _markers(rng: random.Random) -> tuple[int, str]:
    return rng.getrandbits(64) | (1 << 63), f"{rng.getrandbits(64):016x}"


def build_template(seed: int, *, capture_fraction: float) -> Template:
    """Record runs through the real instrumentation until exactly 512 spans are finished.

    Args:
        seed: selects the agent, the run mix and every id.
        capture_fraction: share of runs recorded with content capture on (tool arguments
            and results on the spans, scrubbed client-side; the collector redacts again).
    """
    from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
    from loopwatch.instrumentation.testing import ErrorTool, FakeClock
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    rng = random.Random(seed)
    trace_marker, run_marker = _markers(rng)
    agent, service, tools = _AGENTS[seed % len(_AGENTS)]

    class MarkedIds(IdGenerator):
        traces = 0

        def generate_span_id(self) -> int:
            return rng.getrandbits(64) or 1

        def generate_trace_id(self) -> int:
            MarkedIds.traces += 1
            return (MarkedIds.traces << 64) | trace_marker

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {
                "service.name": service,
                "service.version": "1.4.2",
                "deployment.environment.name": "prod",
                "host.name": f"{service}-{seed:04x}",
            }
        ),
        id_generator=MarkedIds(),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def lookup(**kwargs: Any) -> dict[str, Any]:
        page = int(kwargs.get("page", 1))
        items = [{"id": f"{agent[:3]}-{page}-{i}", "status": "shipped"} for i in range(3)]
        return {"items": items, "page": page, "next_page": page + 1}

    spans: list[Any] = []
    stops: dict[str, int] = {}
    runs = 0
    while len(spans) < BATCH_SPANS:
        remaining = BATCH_SPANS - len(spans)
        kind = (
            "filler"
            if remaining <= _FILLER_MAX_SPANS
            else rng.choices(("paged", "loop", "budget", "errors", "plan"), (50, 15, 10, 10, 15))[0]
        )
        limits: dict[str, Any] = {"repeat_limit": 3}
        if kind == "budget":
            limits["max_model_turns"] = rng.randrange(6, 14)
        if kind == "filler":
            limits.update(max_model_turns=50, max_tool_attempts=50, max_tool_successes=50)
        policy = Policy.build("investigate-readonly", "2026-11-30", **limits)
        tool_name = rng.choice(tools)
        errors = ErrorTool(name=tool_name, fail_times=rng.randrange(1, 3))
        run_id = f"{run_marker:s}{rng.getrandbits(64):016x}"
        usage = {"input_tokens": rng.randrange(500, 4000), "output_tokens": rng.randrange(20, 400)}

        def step(
            run: Run, page: int, *, name: str = tool_name, fn: Any = lookup, usage: Any = usage
        ) -> None:
            args = {"query": "late deliveries", "page": page}
            run.decide(lambda: Decision.tool(ToolCall(name, args), **usage))
            with contextlib.suppress(Exception):
                run.call_tool(name, args, fn=fn)

        with Run(
            agent,
            policy,
            tracer_provider=provider,
            clock=FakeClock(),
            run_id=run_id,
            capture_content=rng.random() < capture_fraction,
        ) as run:
            if kind == "paged":
                for page in range(1, rng.randrange(4, 13)):
                    step(run, page)
            elif kind == "loop":
                for _ in range(10):
                    step(run, 1)
            elif kind == "budget":
                for page in range(1, 40):
                    step(run, page)
            elif kind == "errors":
                for _ in range(errors.fail_times + 1):
                    step(run, 7, fn=errors)
            elif kind == "plan":
                run.decide(lambda: Decision.message("plan: look up the order, then answer"))
                step(run, 1)
            else:
                pages, message = divmod(remaining - 3, 2)
                if message:
                    run.decide(lambda: Decision.message("plan: page through the results"))
                for page in range(1, pages + 1):
                    step(run, page)
            if not run.stopped:
                run.decide(lambda usage=usage: Decision.final("done", **usage))
        finished = exporter.get_finished_spans()
        exporter.clear()
        if kind == "filler" and len(finished) != remaining:
            raise AssertionError(f"filler run made {len(finished)} spans, not {remaining}")
        if len(finished) > remaining or (kind != "filler" and remaining - len(finished) < 3):
            continue
        spans.extend(finished)
        runs += 1
        reason = str(run.outcome.stop.reason.value)
        stops[reason] = stops.get(reason, 0) + 1
    provider.shutdown()
    if len(spans) != BATCH_SPANS:
        raise AssertionError(f"template {seed} has {len(spans)} spans, not {BATCH_SPANS}")
    body = encode_spans(spans).SerializeToString()
    marker = trace_marker.to_bytes(8, "big")
    if body.count(marker) != len(spans):
        raise AssertionError("trace marker is not unique to trace ids")
    return Template(
        body,
        marker,
        run_marker.encode("ascii"),
        tuple(s.context.span_id for s in spans),
        runs,
        stops,
    )


# ------------------------------------------------------------------ load generator


@dataclass
class _PhaseStats:
    latencies_ms: list[float] = field(default_factory=list)
    spans: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` and its live descendants (decode workers
    and their forkserver), or ``None`` once ``pid`` is gone."""
    own = _stat(pid)
    if own is None:
        return None
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {pid: own}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != pid:
            fields = _stat(int(entry.name))
            if fields is not None:
                stats[int(entry.name)] = fields
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += int(stats[current][11]) + int(stats[current][12])
        todo.extend(children.get(current, ()))
    return total / os.sysconf("SC_CLK_TCK")


class _Load:
    """Sends rendered templates to one target from many threads; records what is acked."""

    def __init__(self, host: str, port: int, templates: list[Template], seed: int) -> None:
        self.host, self.port = host, port
        self.templates = templates
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._next = 0
        self.acked: list[tuple[int, int]] = []

    def _batch(self) -> tuple[int, int, bytes]:
        with self._lock:
            index = self._next % len(self.templates)
            self._next += 1
            trace_low, run_prefix = _markers(self._rng)
        return index, trace_low, self.templates[index].render(trace_low, run_prefix)

    def _send(self, conn: http.client.HTTPConnection, body: bytes) -> str | None:
        try:
            conn.request("POST", TRACES_PATH, body=body, headers=_HEADERS)
            response = conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            return type(exc).__name__
        if response.status != 200:
            return f"HTTP {response.status}: {payload[:120]!r}"
        content_type = response.getheader("Content-Type") or ""
        if payload and content_type.startswith("application/x-protobuf"):
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                ExportTraceServiceResponse,
            )

            answer = ExportTraceServiceResponse.FromString(payload)
            if answer.partial_success.rejected_spans:
                return f"partial success: {answer.partial_success.error_message[:120]}"
        return None

    def _threads(self, count: int, work: Callable[[http.client.HTTPConnection], None]) -> None:
        def body() -> None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                work(conn)
            finally:
                conn.close()

        threads = [threading.Thread(target=body, daemon=True) for _ in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _record(self, stats: _PhaseStats, index: int, trace_low: int, error: str | None) -> None:
        with self._lock:
            if error is None:
                self.acked.append((index, trace_low))
                stats.spans += len(self.templates[index].span_ids)
            else:
                stats.errors += 1
                if len(stats.error_samples) < 5:
                    stats.error_samples.append(error)

    def saturate(self, clients: int, warmup_s: float, seconds: float) -> _PhaseStats:
        """Back-to-back requests on ``clients`` connections; counts the window after warm-up."""
        stats = _PhaseStats()
        start = time.perf_counter()
        window = (start + warmup_s, start + warmup_s + seconds)

        def work(conn: http.client.HTTPConnection) -> None:
            while time.perf_counter() < window[1]:
                index, trace_low, body = self._batch()
                sent = time.perf_counter()
                error = self._send(conn, body)
                done = time.perf_counter()
                if window[0] <= sent and done <= window[1]:
                    stats.latencies_ms.append((done - sent) * 1e3)
                    self._record(stats, index, trace_low, error)
                else:
                    self._record(_PhaseStats(), index, trace_low, error)

        self._threads(clients, work)
        return stats

    def pace(self, clients: int, spans_per_s: float, seconds: float) -> _PhaseStats:
        """Open loop: batch ``i`` is due at ``start + i * 512 / rate``; latency from that time."""
        stats = _PhaseStats()
        interval = BATCH_SPANS / spans_per_s
        due = iter(range(1 << 62))
        start = time.perf_counter() + 0.05
        end = start + seconds

        def work(conn: http.client.HTTPConnection) -> None:
            while True:
                with self._lock:
                    scheduled = start + next(due) * interval
                if scheduled >= end:
                    return
                index, trace_low, body = self._batch()
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                error = self._send(conn, body)
                stats.latencies_ms.append((time.perf_counter() - scheduled) * 1e3)
                self._record(stats, index, trace_low, error)

        self._threads(clients, work)
        return stats


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def _summary(stats: _PhaseStats, seconds: float, cpu: dict[str, float | None]) -> dict[str, Any]:
    return {
        "spans_per_s": stats.spans / seconds,
        "requests": len(stats.latencies_ms),
        "p50_ms": _percentile(stats.latencies_ms, 50),
        "p99_ms": _percentile(stats.latencies_ms, 99),
        "max_ms": max(stats.latencies_ms, default=float("nan")),
        "errors": stats.errors,
        "error_samples": stats.error_samples,
        "cpu": cpu,
    }


def _load_main(spec: dict[str, Any]) -> dict[str, Any]:
    """The load process: build templates, run the phases against one target, report."""
    templates = [
        build_template(spec["seed"] + i, capture_fraction=spec["capture_fraction"])
        for i in range(spec["templates"])
    ]
    load = _Load(spec["host"], spec["port"], templates, spec["seed"] * 7919 + spec["port"])
    server_pid = spec["server_pid"]
    results: dict[str, Any] = {}

    def cpu_of(phase: Callable[[], _PhaseStats]) -> tuple[_PhaseStats, dict[str, float | None]]:
        server_before, client_before = _cpu_seconds(server_pid), os.times()
        wall = time.perf_counter()
        stats = phase()
        wall = time.perf_counter() - wall
        server_after, client_after = _cpu_seconds(server_pid), os.times()
        server = None
        if server_before is not None and server_after is not None:
            server = (server_after - server_before) / wall
        client = (client_after.user + client_after.system) - (
            client_before.user + client_before.system
        )
        return stats, {"server_cores": server, "client_cores": client / wall}

    seconds = spec["seconds"]
    stats, cpu = cpu_of(lambda: load.saturate(spec["clients"], spec["warmup"], seconds))
    results["saturation"] = _summary(stats, seconds, cpu)
    rate = spec["rate"] or results["saturation"]["spans_per_s"] / 2
    if rate > 0:
        stats, cpu = cpu_of(lambda: load.pace(spec["paced_clients"], rate, seconds))
        results["paced"] = _summary(stats, seconds, cpu) | {"offered_spans_per_s": rate}
    results["acked"] = load.acked
    results["templates"] = [
        {"span_ids": list(t.span_ids), "runs": t.runs, "stops": t.stops} for t in templates
    ]
    return results


# ----------------------------------------------------------------- servers


def _sink_app() -> Any:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    empty = ExportTraceServiceResponse().SerializeToString()

    async def export(request: Request) -> Response:
        await request.body()
        return Response(empty, media_type="application/x-protobuf")

    return Starlette(routes=[Route(TRACES_PATH, export, methods=["POST"])])


def _serve_sink(hostport: str) -> None:
    import uvicorn

    host, _, port = hostport.rpartition(":")
    uvicorn.run(
        _sink_app(),
        host=host,
        port=int(port),
        loop="asyncio",
        http="h11",
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        date_header=False,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s:g} s")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def collector_command() -> list[str]:
    """The ``loopwatch`` entry point next to this interpreter (what a user runs)."""
    exe = Path(sys.executable).with_name("loopwatch")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "loopwatch.cli"]


@contextlib.contextmanager
def _collector(db: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    otlp, api = _free_port(), _free_port()
    canaries = db.with_name("canaries.txt")
    canaries.write_text("# bench canaries (never sent)\n" + "\n".join(CANARIES) + "\n")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *collector_command(),
                "collector",
                "--db",
                str(db),
                "--otlp-http",
                f"127.0.0.1:{otlp}",
                "--http",
                f"127.0.0.1:{api}",
                "--canaries",
                str(canaries),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_http(f"http://127.0.0.1:{api}/healthz", proc)
        yield proc, otlp, api
    finally:
        _stop(proc)


@contextlib.contextmanager
def _sink() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-sink", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        yield proc, port
    finally:
        _stop(proc)


def _run_load(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--load", json.dumps(spec)],
        capture_output=True,
        check=False,
        timeout=spec["warmup"] + 2 * spec["seconds"] + 600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# ------------------------------------------------------------------------ one run


@dataclass
class IngestResult:
    """Figures of one benchmark run (one fresh collector and one sink)."""

    collector: dict[str, Any]
    sink: dict[str, Any]
    acked_spans: int
    missing_spans: int
    runs_expected: int
    runs_stored: int
    spans_received_metric: float | None
    collector_exit: int


def _metric(text: str, name: str) -> float | None:
    total = None
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def _verify(db: Path, load: dict[str, Any]) -> tuple[int, int, int]:
    """Acknowledged span keys missing from ``spans_seen``; runs expected and stored."""
    import duckdb

    templates = load["templates"]
    span_keys: list[int] = []
    trace_keys: list[int] = []
    runs = 0
    for index, trace_low in load["acked"]:
        ids = templates[index]["span_ids"]
        span_keys += ids
        trace_keys += [trace_low] * len(ids)
        runs += templates[index]["runs"]
    missing = missing_span_keys(db, span_keys, trace_keys)
    con = duckdb.connect(str(db), read_only=True)
    try:
        stored = con.execute("SELECT count(*) FROM runs").fetchone()
    finally:
        con.close()
    assert stored is not None
    return missing, runs, int(stored[0])


def missing_span_keys(db: Path, span_keys: list[int], trace_keys: list[int]) -> int:
    """How many of the acknowledged ``(span_key, trace_key)`` pairs are not in the
    stopped collector's ``spans_seen`` table (0 when nothing acknowledged was lost)."""
    import duckdb
    import pyarrow as pa

    expected = pa.table(
        {
            "span_key": pa.array(span_keys, pa.uint64()),
            "trace_key": pa.array(trace_keys, pa.uint64()),
        }
    )
    con = duckdb.connect(str(db), read_only=True)
    try:
        con.register("expected", expected)
        row = con.execute(
            "SELECT count(*) FROM expected ANTI JOIN spans_seen USING (span_key, trace_key)"
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0])


def run_once(
    *,
    seconds: float,
    clients: int,
    paced_clients: int,
    rate: float | None = None,
    warmup: float = 1.0,
    templates: int = 8,
    capture_fraction: float = 0.25,
    seed: int = 1,
) -> IngestResult:
    """One collector (fresh DuckDB file) then one sink, the same phases against each."""
    spec: dict[str, Any] = {
        "seconds": seconds,
        "clients": clients,
        "paced_clients": paced_clients,
        "warmup": warmup,
        "templates": templates,
        "capture_fraction": capture_fraction,
        "seed": seed,
        "host": "127.0.0.1",
        "rate": rate,
    }
    with tempfile.TemporaryDirectory(prefix="lw-bench-ingest-") as tmp:
        db = Path(tmp) / "bench.duckdb"
        with _collector(db, Path(tmp) / "collector.log") as (proc, otlp, api):
            collector = _run_load(spec | {"port": otlp, "server_pid": proc.pid})
            with urllib.request.urlopen(f"http://127.0.0.1:{api}/metrics", timeout=10) as r:
                received = _metric(r.read().decode(), "loopwatch_collector_spans_received_total")
        exit_code = proc.returncode
        missing, runs_expected, runs_stored = _verify(db, collector)
    rate_for_sink = rate or collector["saturation"]["spans_per_s"] / 2
    with _sink() as (sink_proc, port):
        sink = _run_load(spec | {"port": port, "server_pid": sink_proc.pid, "rate": rate_for_sink})
    return IngestResult(
        collector={k: v for k, v in collector.items() if k not in ("acked", "templates")},
        sink={k: v for k, v in sink.items() if k not in ("acked", "templates")},
        acked_spans=len(collector["acked"]) * BATCH_SPANS,
        missing_spans=missing,
        runs_expected=runs_expected,
        runs_stored=runs_stored,
        spans_received_metric=received,
        collector_exit=exit_code,
    )


# --------------------------------------------------------------------------- report


def _server_us_per_span(figures: dict[str, Any]) -> float | None:
    """The server's CPU time per acknowledged span (us), the figure that moves least with
    machine load (throughput on shared cores moves +-15 %); ``None`` if not measured."""
    server = figures["cpu"].get("server_cores")
    if not server or not figures["spans_per_s"]:
        return None
    return float(server / figures["spans_per_s"] * 1e6)


def _fmt_cpu(figures: dict[str, Any]) -> str:
    """Cores busy (server, client) and the server's CPU time per acknowledged span."""
    server = figures["cpu"].get("server_cores")
    client = figures["cpu"].get("client_cores")
    server_text = "  n/a" if server is None else f"{server:5.2f}"
    per_span = _server_us_per_span(figures)
    per_span_text = "   n/a" if per_span is None else f"{per_span:6.1f}"
    return f"{server_text} / {client or 0.0:4.2f}   {per_span_text}"


def report(results: list[IngestResult]) -> str:
    """A table per run and, with several runs, the medians."""
    lines = [
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at report"
        " (shared machines skew figures: compare collector and sink of the same run)",
        f"{'run':>4} {'target':<9} {'phase':<10} {'spans/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'max ms':>8} {'errors':>6}  cores server/client  server CPU us/span",
    ]
    for number, result in enumerate(results, 1):
        for target, figures in (("collector", result.collector), ("sink", result.sink)):
            for phase in ("saturation", "paced"):
                f = figures.get(phase)
                if f is None:
                    continue
                rate = f["spans_per_s"]
                if phase == "paced":
                    rate = f["offered_spans_per_s"]
                lines.append(
                    f"{number:>4} {target:<9} {phase:<10} {rate:>9,.0f} {f['p50_ms']:>8.1f}"
                    f" {f['p99_ms']:>8.1f} {f['max_ms']:>8.1f} {f['errors']:>6}  " + _fmt_cpu(f)
                )
        ratio = (
            result.collector["saturation"]["spans_per_s"] / result.sink["saturation"]["spans_per_s"]
        )
        lines.append(
            f"     collector/sink throughput {ratio:.2f}; acked {result.acked_spans:,} spans,"
            f" missing from DuckDB {result.missing_spans}; runs {result.runs_stored:,}"
            f" stored / {result.runs_expected:,} sent; collector exit {result.collector_exit}"
        )
    if len(results) > 1:

        def median(target: str, phase: str, key: str) -> float:
            return statistics.median(
                getattr(r, target)[phase][key] for r in results if phase in getattr(r, target)
            )

        lines.append("median over runs:")
        for target in ("collector", "sink"):
            lines.append(
                f"     {target:<9} saturation {median(target, 'saturation', 'spans_per_s'):>9,.0f}"
                f" spans/s (p99 {median(target, 'saturation', 'p99_ms'):.0f} ms); paced at"
                f" {median(target, 'paced', 'offered_spans_per_s'):,.0f} spans/s:"
                f" p50 {median(target, 'paced', 'p50_ms'):.1f} ms,"
                f" p99 {median(target, 'paced', 'p99_ms'):.1f} ms"
            )
        ratios = [
            r.collector["saturation"]["spans_per_s"] / r.sink["saturation"]["spans_per_s"]
            for r in results
        ]
        lines.append(f"     collector/sink throughput {statistics.median(ratios):.2f}")
        per_span = [
            us
            for r in results
            if (us := _server_us_per_span(r.collector["saturation"])) is not None
        ]
        if per_span:
            lines.append(
                f"     collector CPU at saturation {statistics.median(per_span):.1f} us/span"
                " (median; server process and its decode workers)"
            )
    lines.append("target (issue 3): >= 50,000 spans/s; p99 <= 100 ms at half that rate")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--clients", type=int, default=8, help="connections when saturating")
    parser.add_argument(
        "--paced-clients", type=int, default=16, help="connections in the paced phase"
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="paced spans/s (default: half the collector's)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs; medians are printed")
    parser.add_argument(
        "--capture-fraction", type=float, default=0.25, help="runs recorded with content on"
    )
    parser.add_argument("--json", action="store_true", help="print raw figures as JSON too")
    parser.add_argument("--serve-sink", help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_sink:
        _serve_sink(args.serve_sink)
        return
    if args.load:
        json.dump(_load_main(json.loads(args.load)), sys.stdout)
        return
    results = []
    for number in range(args.repeat):
        results.append(
            run_once(
                seconds=args.seconds,
                clients=args.clients,
                paced_clients=args.paced_clients,
                rate=args.rate,
                capture_fraction=args.capture_fraction,
                seed=1 + number * 1000,
            )
        )
        if args.json:
            print(json.dumps(results[-1].__dict__), flush=True)
    print(report(results))


@pytest.mark.skipif(not os.environ.get("LOOPWATCH_BENCH"), reason="set LOOPWATCH_BENCH=1 to run")
def test_bench_ingest_smoke() -> None:
    result = run_once(seconds=2.0, clients=4, paced_clients=8, warmup=0.5, templates=4)
    print(report([result]))
    for figures in (result.collector, result.sink):
        for phase in ("saturation", "paced"):
            assert figures[phase]["spans_per_s"] > 0
            assert figures[phase]["p99_ms"] > 0
            assert figures[phase]["errors"] == 0, figures[phase]["error_samples"]
    assert result.collector_exit == 0
    assert result.acked_spans > 0
    assert result.missing_spans == 0
    assert result.runs_stored == result.runs_expected
    assert result.spans_received_metric == result.acked_spans


if __name__ == "__main__":
    main()
