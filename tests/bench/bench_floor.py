"""Cost floor of ingest on this stack: what any collector built from the same parts pays.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_floor.py [--requests N] [--repeat R]

or through pytest with ``LOOPWATCH_BENCH`` set (``test_bench_floor_smoke``: a short run
that checks the replay wrote every row; skipped otherwise).

Issue 3's target, 50,000 spans/s on 2 cores, leaves 2 x 10^6 / 50,000 = 40 us of CPU per
span for everything: HTTP, decode, redaction, mapping, the hand-off between processes,
the DuckDB commit and the metrics. This benchmark measures, on the requests
``bench_ingest.py`` sends (real loopwatch spans, 512 per request), the parts no design
with these libraries can skip, each with all of loopwatch's own logic taken out:

- **read**: ``ExportTraceServiceRequest.ParseFromString`` (opentelemetry-proto, upb), then
  one read of every span field and of every attribute key and value, event and link. A
  collector that redacts every field (issue 3, "Redact") must hand each string to a
  matcher at least once, so it reads at least this much; loopwatch's own decode
  (``decode_body``, printed beside it) builds records from the same reads.
- **store**: the Arrow tables loopwatch's store appends for the same requests (recorded
  from a real :class:`~loopwatch.collector.store.Store` run), appended again to a fresh
  file with the same schema and the store's connection settings (one DuckDB thread, its
  checkpoint threshold and memory limit), one ``BEGIN`` ... ``COMMIT`` per group of G
  requests: the DuckDB part of the commit alone, with no dedup, merging or sampling logic and none of
  the store's ``DELETE`` or ``INSERT ... SELECT`` statements (a lower bound).

Both are CPU seconds of this process per span (``time.process_time``). The sum is a lower
bound of the CPU per span before any HTTP, mapping, redaction matching or hand-off cost;
it is printed against the 40 us budget.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loopwatch.collector.decode import decode_body
from loopwatch.collector.map import MapStage
from loopwatch.collector.redact import RedactStage
from loopwatch.collector.rows import MappedBatch
from loopwatch.collector.store import Store, StoreConfig
from loopwatch.collector.store.settings import open_file
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.bench import bench_ingest

BUDGET_US_PER_SPAN = 2 * 1_000_000 / 50_000
"""Issue 3's target on 2 cores: 50,000 spans/s is 40 us of CPU per span, in all."""

GROUP_SIZES = (1, 4, 16)
HALF_RATE_REQUESTS_PER_S = 25_000 / 512
"""Requests per second at half the target rate (the p99 <= 100 ms condition)."""


def request_bodies(count: int, *, seed: int = 7) -> list[bytes]:
    """``count`` encoded 512-span requests with fresh ids, as ``bench_ingest`` sends them."""
    templates = [bench_ingest.build_template(s, capture_fraction=0.25) for s in range(4)]
    rng = random.Random(seed)
    bodies = []
    for i in range(count):
        trace_low, run_prefix = bench_ingest._markers(rng)
        bodies.append(templates[i % len(templates)].render(trace_low, run_prefix))
    return bodies


def _read_values(values: Any) -> int:
    """Read every key and value of an attribute list once; returns the values read."""
    n = 0
    for kv in values:
        _ = kv.key
        value = kv.value
        which = value.WhichOneof("value")
        if which == "array_value":
            for item in value.array_value.values:
                getattr(item, item.WhichOneof("value") or "string_value")
        elif which == "kvlist_value":
            n += _read_values(value.kvlist_value.values)
        elif which is not None:
            getattr(value, which)
        n += 1
    return n


def read_everything(body: bytes) -> int:
    """Parse ``body`` and read every field a per-field redactor must see; returns the
    attribute values read."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    n = 0
    for resource_spans in request.resource_spans:
        n += _read_values(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            _ = scope.name, scope.version
            n += _read_values(scope.attributes)
            for span in scope_spans.spans:
                _ = span.trace_id, span.span_id, span.parent_span_id, span.name, span.kind
                _ = span.start_time_unix_nano, span.end_time_unix_nano, span.flags
                _ = span.trace_state, span.status.code, span.status.message
                n += _read_values(span.attributes)
                for event in span.events:
                    _ = event.name, event.time_unix_nano
                    n += _read_values(event.attributes)
                for link in span.links:
                    _ = link.trace_id, link.span_id, link.trace_state
                    n += _read_values(link.attributes)
    return n


def _cpu_us_per_span(work: Any, items: list[Any], spans: int) -> float:
    started = time.process_time()
    for item in items:
        work(item)
    return (time.process_time() - started) * 1e6 / spans


def decode_floor(bodies: list[bytes]) -> dict[str, float]:
    """CPU us per span: parse only, parse and read everything, loopwatch's decode."""
    spans = bench_ingest.BATCH_SPANS * len(bodies)

    def parse(body: bytes) -> None:
        ExportTraceServiceRequest().ParseFromString(body)

    def ours(body: bytes) -> None:
        decode_body(body, "identity", as_json=False, max_decompressed_bytes=1 << 30)

    return {
        "parse": _cpu_us_per_span(parse, bodies, spans),
        "read": _cpu_us_per_span(read_everything, bodies, spans),
        "decode_body": _cpu_us_per_span(ours, bodies, spans),
    }


class _RecordingStore(Store):
    """A real store that also keeps every Arrow table it appends, per request."""

    appended: list[list[tuple[str, pa.Table]]]

    def _append(self, table: str, data: pa.Table) -> None:
        self.appended[-1].append((table, data))
        super()._append(table, data)


def recorded_appends(bodies: list[bytes], folder: Path) -> list[list[tuple[str, pa.Table]]]:
    """The tables a real store appends for each request, one request per group commit."""
    redact, mapper = RedactStage(canaries=bench_ingest.CANARIES), MapStage()
    mapped: list[MappedBatch] = []
    for body in bodies:
        batch = decode_body(body, "identity", as_json=False, max_decompressed_bytes=1 << 30)
        mapped.append(mapper.process(redact.process(batch)))
    store = _RecordingStore(folder / "recorded.duckdb")
    store.appended = []
    try:
        for batch in mapped:
            store.appended.append([])
            store.submit(batch).result(timeout=120)
    finally:
        store.close()
    return store.appended


def store_floor(
    appends: list[list[tuple[str, pa.Table]]], group: int, path: Path
) -> dict[str, float]:
    """Append the recorded tables to a fresh file at ``path``, ``group`` requests per
    transaction.

    Returns:
        ``us_per_span`` (CPU per span, median over groups after a tenth of warm-up) and
        ``rows`` (rows written, to check against the recording).
    """
    Store(path).close()  # the real schema, then nothing of the store's logic
    # The store's own connection settings: DuckDB's defaults (a thread per core, all
    # counted by process_time, and a 16 MiB automatic checkpoint inside COMMIT) cost
    # 1.6-2.3x more CPU for the same appends, which is no lower bound of the store.
    settings = StoreConfig()
    con = open_file(path, settings)
    con.execute(f"SET checkpoint_threshold = '{8 * settings.checkpoint_wal_bytes}B'")
    con.execute(f"SET memory_limit = '{settings.memory_limit_bytes}B'")
    cpu: list[float] = []
    rows = 0
    try:
        for start in range(0, len(appends) - group + 1, group):
            by_table: dict[str, list[pa.Table]] = defaultdict(list)
            for request in appends[start : start + group]:
                for table, data in request:
                    by_table[table].append(data)
            started = time.process_time()
            con.execute("BEGIN TRANSACTION")
            for table, parts in by_table.items():
                data = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
                con.from_arrow(data.__arrow_c_stream__()).insert_into(table)
                rows += data.num_rows
            con.execute("COMMIT")
            cpu.append(time.process_time() - started)
    finally:
        con.close()
    warm = len(cpu) // 10
    per_group = statistics.median(cpu[warm:])
    return {"us_per_span": per_group * 1e6 / (group * bench_ingest.BATCH_SPANS), "rows": rows}


def run(requests: int, repeat: int) -> dict[str, Any]:
    bodies = request_bodies(requests)
    decode = [decode_floor(bodies) for _ in range(repeat)]
    with tempfile.TemporaryDirectory(prefix="lw-bench-floor-") as tmp:
        appends = recorded_appends(bodies, Path(tmp))
        recorded_rows = sum(data.num_rows for request in appends for _, data in request)
        stores = {
            g: [store_floor(appends, g, Path(tmp) / f"floor-{g}-{r}.duckdb") for r in range(repeat)]
            for g in GROUP_SIZES
            if g <= len(appends)
        }
    return {
        "decode": {k: statistics.median(d[k] for d in decode) for k in decode[0]},
        "store": {g: statistics.median(s["us_per_span"] for s in v) for g, v in stores.items()},
        "store_rows": {g: [s["rows"] for s in v] for g, v in stores.items()},
        "recorded_rows": recorded_rows,
        "requests": requests,
    }


def report(figures: dict[str, Any]) -> str:
    d = figures["decode"]
    lines = [
        f"cost floor, {figures['requests']} requests of 512 real loopwatch spans "
        "(CPU us per span, medians)",
        f"  upb parse only                       {d['parse']:7.1f}",
        f"  parse + read every field once        {d['read']:7.1f}   (the read floor)",
        f"  loopwatch decode_body, for reference {d['decode_body']:7.1f}",
    ]
    for group, us in figures["store"].items():
        lines.append(f"  DuckDB appends + commit, {group:2d} req/group {us:7.1f}")
    for group, us in figures["store"].items():
        floor = d["read"] + us
        lines.append(
            f"floor with {group:2d} req/group = {floor:5.1f} us/span: "
            f"{floor / BUDGET_US_PER_SPAN:4.0%} of the {BUDGET_US_PER_SPAN:.0f} us budget "
            "(50,000 spans/s on 2 cores) before HTTP, redaction matching, mapping, "
            "hand-off and metrics"
        )
    lines.append(
        f"(at half the target rate, {HALF_RATE_REQUESTS_PER_S:.1f} requests/s, a p99 of 100 ms "
        f"leaves room to gather at most {HALF_RATE_REQUESTS_PER_S * 0.1:.1f} requests per commit)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=160, help="512-span requests")
    parser.add_argument("--repeat", type=int, default=3, help="runs; medians are printed")
    args = parser.parse_args(argv)
    print(report(run(args.requests, args.repeat)))


@pytest.mark.skipif(not os.environ.get("LOOPWATCH_BENCH"), reason="set LOOPWATCH_BENCH=1 to run")
def test_bench_floor_smoke() -> None:
    figures = run(requests=16, repeat=1)
    print(report(figures))
    assert all(us > 0 for us in figures["decode"].values())
    assert all(us > 0 for us in figures["store"].values())
    # Every recorded row was appended again, whatever the grouping (16 is a multiple of
    # every group size).
    for rows in figures["store_rows"].values():
        assert rows == [figures["recorded_rows"]]


if __name__ == "__main__":
    main()
