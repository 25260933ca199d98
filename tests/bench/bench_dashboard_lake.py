"""Dashboard on the lake (issue 27, "Done when"): the stopped-runs list and the run view of
a 10,000-step run, each at most 1 s after warm-up, with 1,000,000 runs in the lake.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_dashboard_lake.py [--runs N] [--steps S] [--repeat R]
        [--batches B] [--no-postgres]

or through pytest with ``LOOPWATCH_BENCH`` set (``smoke``: 100,000 runs, the 10,000-step
run, one repeat; ``full``: 1,000,000 runs, 5 repeats; skipped otherwise).

What is measured:

- the store of ``tests/bench/bench_dashboard.py`` (``build_store``: runs over the last 7
  days, 8 agents, 24 tools, every stop reason, 1 % sampled with 10 steps, the long run),
  written by bulk SQL inside DuckDB, then copied into a DuckLake as shippers would have
  written it: ``--batches`` transactions, oldest runs first, three collector ids
  (``tests/integration/lake_fill.py``);
- twice: with a local DuckDB catalog file, and with a PostgreSQL catalog
  (``tests/integration/postgres.py``; skipped when PostgreSQL is not installed);
- through the dashboard's own :class:`~loopwatch.dashboard.lake_source.LakeSource` (the
  collector's ``StoreReader`` with its time limit and row cap): the stopped-runs page's
  default read (last 24 h, 50 rows), then the same for one collector; the run view's read
  of the long run plus what the page computes from it (``bench_dashboard.
  run_view_transform``); for information, the overview and tools aggregates.

Each figure is p50 and max of ``--repeat`` calls after one warm-up call (wall time), and
the p50 of the process's CPU time (all DuckDB threads) for the same calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.bench_dashboard import (  # noqa: E402
    DAY_NS,
    LONG_RUN,
    build_store,
    run_view_transform,
)

BUDGET_SECONDS = 1.0
COLLECTORS = 3
COLLECTOR_SQL = f"'collector-' || (hash(run_id) % {COLLECTORS})"


@dataclass
class Figure:
    label: str
    seconds: list[float]
    budget: bool = True
    cpu_seconds: list[float] | None = None

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)

    @property
    def ok(self) -> bool:
        return self.p50 <= BUDGET_SECONDS

    def line(self) -> str:
        verdict = ("under 1 s" if self.ok else "OVER 1 s") if self.budget else ""
        p50, worst = self.p50 * 1000, max(self.seconds) * 1000
        cpu = statistics.median(self.cpu_seconds or [0.0]) * 1000
        return f"{self.label:<62} {p50:9.1f} {worst:9.1f} {cpu:9.1f}  {verdict}"


def measure(label: str, fn: Callable[[], Any], *, repeat: int, budget: bool = True) -> Figure:
    """One warm-up call, then ``repeat`` timed calls (wall time, and the process's CPU
    time: on a shared machine the wall time includes waiting for a core)."""
    fn()
    seconds, cpu = [], []
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        fn()
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return Figure(label, seconds, budget, cpu)


def _batches(runs: int, batches: int, now_ns: int) -> list[tuple[str, int]]:
    """``(run_id condition, shipping time)`` of each shipping batch, oldest first
    (``bench-{i:08d}``: ``i = 0`` is the newest run, the long run the newest of all; a
    batch is shipped 5 s after its newest run's time, as ``build_store`` spaces them)."""
    size = -(-runs // batches)
    spacing = 7 * DAY_NS // runs
    found = []
    for b in reversed(range(batches)):
        low, high = f"bench-{b * size:08d}", f"bench-{min((b + 1) * size, runs):08d}"
        clause = f"(run_id >= '{low}' AND run_id < '{high}')"
        if b == 0:
            clause += f" OR run_id = '{LONG_RUN}'"
        newest = now_ns - 2 * 10**9 - b * size * spacing
        found.append((clause, newest + 5 * 10**9))
    return found


def fill_lake(target: Any, local: Path, *, runs: int, batches: int, now_ns: int) -> float:
    """Copy ``local`` into the lake at ``target`` in ``batches`` transactions; seconds."""
    from loopwatch.collector.lake.connect import connect_lake

    from tests.integration.lake_fill import copy_to_lake

    started = time.perf_counter()
    con = connect_lake(target)
    try:
        for where, shipped in _batches(runs, batches, now_ns):
            copy_to_lake(
                con,
                local,
                collector_sql=COLLECTOR_SQL,
                where=where,
                shipped_unix_nano=shipped,
                order_by={"runs": "run_id DESC", "steps": "run_id DESC, step, kind"},
            )
    finally:
        con.close()
    return time.perf_counter() - started


def measure_lake(
    name: str, target: Any, now_ns: int, *, repeat: int, long_steps: int
) -> list[Figure]:
    """The dashboard's reads of the lake at ``target``; checks what they return."""
    from loopwatch.dashboard.data import RunFilter
    from loopwatch.dashboard.lake_source import LakeSource

    source = LakeSource(target, timeout_seconds=30)
    try:
        day = {"since_unix_nano": now_ns - DAY_NS, "until_unix_nano": now_ns}
        default = RunFilter(**day)
        page = source.runs(default, limit=50)
        assert len(page.runs) == 50 and page.runs["run_id"].iloc[0] == LONG_RUN
        assert page.runs["time"].is_monotonic_decreasing
        assert page.runs["steps_since_progress"].notna().all()
        one = source.collectors()[0]
        detail = source.run(LONG_RUN)
        assert detail is not None and detail.stop is not None
        assert detail.stop["reason"] == "repeated_action"
        # Two rows per step: the row cap keeps the last 10,000 rows (5,000 steps).
        assert detail.steps_truncated == (2 * long_steps > 10_000)
        view = run_view_transform(detail)
        assert view["groups"][-1].last_step == long_steps
        figures = [
            measure(
                f"{name}: stopped runs, last 24 h, 50 rows",
                lambda: source.runs(default, limit=50),
                repeat=repeat,
            ),
            measure(
                f"{name}: stopped runs, 24 h, collector={one}",
                lambda: source.runs(RunFilter(**day, collector=one), limit=50),
                repeat=repeat,
            ),
            measure(
                f"{name}: run view ({long_steps:,} steps): run() + transform",
                lambda: run_view_transform(source.run(LONG_RUN)),
                repeat=repeat,
            ),
            measure(
                f"{name}:   of which run()",
                lambda: source.run(LONG_RUN),
                repeat=repeat,
                budget=False,
            ),
            measure(
                f"{name}: overview, 24 h (information)",
                lambda: source.overview(**day, bucket_seconds=1800),
                repeat=repeat,
                budget=False,
            ),
            measure(
                f"{name}: tools, 24 h (information)",
                lambda: source.tools(**day),
                repeat=repeat,
                budget=False,
            ),
        ]
    finally:
        source.close()
    return figures


def run_benchmark(
    *,
    runs: int,
    long_steps: int,
    repeat: int,
    batches: int,
    workdir: Path,
    postgres: bool = True,
) -> list[Figure]:
    from loopwatch.collector.lake.connect import LakeTarget

    now_ns = time.time_ns()
    local = workdir / "local.duckdb"
    started = time.perf_counter()
    build_store(local, runs=runs, long_steps=long_steps, now_ns=now_ns)
    print(
        f"\nlocal store: {runs:,} runs + one {long_steps:,}-step run, built in "
        f"{time.perf_counter() - started:.1f} s"
    )
    figures: list[Figure] = []
    target = LakeTarget(str(workdir / "catalog.ducklake"), str(workdir / "data-local") + "/")
    seconds = fill_lake(target, local, runs=runs, batches=batches, now_ns=now_ns)
    print(f"lake (DuckDB catalog): filled in {batches} transactions in {seconds:.1f} s")
    figures += measure_lake("duckdb catalog", target, now_ns, repeat=repeat, long_steps=long_steps)
    if postgres:
        from tests.integration.postgres import start_postgres

        with start_postgres(workdir) as pg:
            pg.create_database("lake")
            target = LakeTarget(pg.catalog("lake"), str(workdir / "data-pg") + "/")
            seconds = fill_lake(target, local, runs=runs, batches=batches, now_ns=now_ns)
            print(f"lake (PostgreSQL catalog): filled in {batches} transactions in {seconds:.1f} s")
            figures += measure_lake(
                "postgres catalog", target, now_ns, repeat=repeat, long_steps=long_steps
            )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average: {load} on {os.cpu_count()} cores")
    print(f"{'data path':<62} {'p50 ms':>9} {'max ms':>9} {'cpu ms':>9}")
    for figure in figures:
        print(figure.line())
    return figures


def test_bench_dashboard_lake_smoke(tmp_path: Path) -> None:
    if not os.environ.get("LOOPWATCH_BENCH"):
        pytest.skip("benchmarks run with LOOPWATCH_BENCH=smoke|full")
    full = os.environ.get("LOOPWATCH_BENCH") == "full"
    figures = run_benchmark(
        runs=1_000_000 if full else 100_000,
        long_steps=10_000,
        repeat=5 if full else 1,
        batches=10,
        workdir=tmp_path,
    )
    if full:  # the target; a smoke run on a shared machine only prints
        assert all(f.ok for f in figures if f.budget), [f.line() for f in figures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lw-bench-lake-") as tmp:
        run_benchmark(
            runs=args.runs,
            long_steps=args.steps,
            repeat=args.repeat,
            batches=args.batches,
            workdir=Path(tmp),
            postgres=not args.no_postgres,
        )


if __name__ == "__main__":
    main()
