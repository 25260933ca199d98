"""Store writer benchmark: CPU per group commit of real 512-span requests, in isolation.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_store.py [--groups N] [--batches-per-group B]

or through pytest with ``LOOPWATCH_BENCH`` set (``test_bench_store_smoke``: a short run
that checks sanity only; skipped otherwise).

The requests are the ones ``bench_ingest.py`` sends (real loopwatch spans recorded through
the instrumentation, fresh trace and run ids per request), decoded, redacted and mapped
once, outside the timing. Each is then committed through a :class:`Store` on a fresh
DuckDB file, one group at a time (``--batches-per-group`` requests submitted together):
the figure is the process CPU per group while the test thread waits on the result, that
is the writer thread's. The first tenth of the groups warms up and is not counted.

Baseline, same run, same requests: the store with its run-key filter answering "maybe" for
every key, so every group reads its runs' existing rows as it did before the filter
(``collector/store/keys.py``). The ratio printed is filter / baseline CPU per group.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loopwatch.collector.decode import decode_body
from loopwatch.collector.map import MapStage
from loopwatch.collector.redact import RedactStage
from loopwatch.collector.rows import MappedBatch
from loopwatch.collector.store import Store
from loopwatch.collector.store.keys import RunKeyFilter

from tests.bench import bench_ingest


class _AlwaysMaybe(RunKeyFilter):
    """The baseline: every key may be stored, so every run is looked up."""

    def may_contain(self, keys: Sequence[int]) -> list[bool]:
        return [True] * len(keys)


def mapped_requests(count: int, *, seed: int = 1) -> list[MappedBatch]:
    """``count`` mapped 512-span requests with fresh ids (decode, redact, map: untimed)."""
    templates = [bench_ingest.build_template(s, capture_fraction=0.25) for s in range(4)]
    rng = random.Random(seed)
    redact, mapper = RedactStage(canaries=()), MapStage()
    out = []
    for i in range(count):
        trace_low, run_prefix = bench_ingest._markers(rng)
        body = templates[i % len(templates)].render(trace_low, run_prefix)
        batch = decode_body(body, "identity", as_json=False, max_decompressed_bytes=1 << 30)
        out.append(mapper.process(redact.process(batch)))
    return out


def writer_cpu(requests: list[MappedBatch], per_group: int, *, baseline: bool) -> dict[str, float]:
    """CPU and wall time per group commit (ms, medians), spans committed."""
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.duckdb") as store:
        if baseline:
            store._stored_runs = _AlwaysMaybe()
        cpu: list[float] = []
        wall: list[float] = []
        spans = 0
        for start in range(0, len(requests) - per_group + 1, per_group):
            group = requests[start : start + per_group]
            c0, w0 = time.process_time(), time.perf_counter()
            results = [store.submit(m) for m in group]
            spans += sum(len(r.result(timeout=120).new_span_keys) for r in results)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        warm = len(cpu) // 10
        return {
            "cpu_ms": 1000 * statistics.median(cpu[warm:]),
            "wall_ms": 1000 * statistics.median(wall[warm:]),
            "spans": spans,
        }


def run(groups: int, per_group: int, repeat: int) -> list[dict[str, Any]]:
    requests = mapped_requests(groups * per_group)
    spans_per_group = sum(len(m.steps) + len(m.runs) + len(m.stops) for m in requests) / len(
        requests
    )
    rows = []
    for _ in range(repeat):  # interleaved: machine load drifts between phases
        for baseline in (True, False):
            figures = writer_cpu(requests, per_group, baseline=baseline)
            figures["baseline"] = baseline
            figures["us_per_span"] = 1000 * figures["cpu_ms"] / (spans_per_group * per_group)
            rows.append(figures)
    return rows


def report(rows: list[dict[str, Any]], per_group: int) -> str:
    lines = [f"store writer, {per_group} request(s) of 512 spans per group commit"]
    lines.append(f"{'store':30s} {'CPU ms/group':>13s} {'wall ms':>9s} {'CPU us/span':>12s}")
    for row in rows:
        name = "baseline (every run looked up)" if row["baseline"] else "run-key filter"
        lines.append(
            f"{name:30s} {row['cpu_ms']:13.2f} {row['wall_ms']:9.2f} {row['us_per_span']:12.1f}"
        )
    base = statistics.median(r["cpu_ms"] for r in rows if r["baseline"])
    new = statistics.median(r["cpu_ms"] for r in rows if not r["baseline"])
    lines.append(f"filter / baseline CPU per group: {new / base:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=300, help="group commits per phase")
    parser.add_argument("--batches-per-group", type=int, default=1, help="requests per group")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved pairs")
    args = parser.parse_args(argv)
    rows = run(args.groups, args.batches_per_group, args.repeat)
    print(report(rows, args.batches_per_group))


@pytest.mark.skipif(not os.environ.get("LOOPWATCH_BENCH"), reason="set LOOPWATCH_BENCH=1 to run")
def test_bench_store_smoke() -> None:
    rows = run(groups=30, per_group=1, repeat=1)
    print(report(rows, 1))
    spans = {row["spans"] for row in rows}
    assert len(spans) == 1 and spans.pop() > 0  # both stores committed every span
    assert all(row["cpu_ms"] > 0 for row in rows)


if __name__ == "__main__":
    main()
