"""Checkpoint benchmark: how long a DuckDB checkpoint holds the store's writer.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_checkpoint.py [--checkpoints N] [--rows R]

or through pytest with ``LOOPWATCH_BENCH`` set (``test_bench_checkpoint_smoke``: a few
checkpoints per variant, sanity checks only; skipped otherwise).

Why (issue 27, item 7; ``docs/collector.md``, "Memory"): the collector checkpoints every
16 MiB of write-ahead log, and a checkpoint blocks the writer, so every acknowledgement
queued behind it waits. Each checkpoint leaves the rows appended since the last one as
a new, small row group; DuckDB 1.5's vacuum then merges adjacent row groups that fit in
fewer (up to three merged at once, ``RowGroupCollection::ScheduleVacuumTasks``), on any
table without an index. On the wide ``runs`` (36 columns) and ``stop_reports`` (32)
tables that rewrite comes in lumps: mostly 60-200 ms, and every few hundred thousand
runs a merge of up to 3 x 122,880 rows that holds the writer for seconds.

What is measured: a fresh file with the collector's schema (``apply_migrations``); per
round, ``--rows`` generated runs with their stop reports appended in one transaction
(about what the soak's collector appends between two checkpoints at 1,700 runs/s), then
``CHECKPOINT``, timed. Three variants, in the same run:

- ``122,880-row groups``: DuckDB's own size, vacuum on (the collector with DuckDB 1.5.5);
- ``no vacuum``: the same with ``SET max_vacuum_tasks = 0``;
- ``16,384-row groups``: the file attached with ``ROW_GROUP_SIZE 16384``, vacuum on (the
  collector with DuckDB 1.5.6 and later:
  :func:`~loopwatch.collector.store.settings.default_row_group_rows`).

Printed per variant: the longest checkpoint, the 99th and 50th percentiles and the sum,
and the longest as a ratio of the first variant's. Rows are generated from the columns' types
(ids and hashes random, names from small vocabularies), not recorded ones, so the
absolute times are indicative; the ratios are the point.

Vacuum off is not an option (row groups with deleted rows would never be compacted, and 1.5.5
failed "failed to pin block" within ten minutes of the soak). 16,384-row groups are the
collector's default from DuckDB 1.5.6 on; 1.5.5 keeps an unevictable 256 KiB block for
each row group filled by appends alone, which at that size filled the 64 MiB limit
within two minutes of the soak (``docs/collector.md``, "Memory").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

VARIANTS = ("122,880-row groups", "no vacuum", "16,384-row groups")
TABLES = ("runs", "stop_reports")


@dataclass(frozen=True)
class Figure:
    """One variant's checkpoint times in milliseconds, and the row groups of ``runs``
    at the end (rows in each)."""

    variant: str
    times_ms: tuple[float, ...]
    row_groups: tuple[int, ...]

    @property
    def longest(self) -> float:
        return max(self.times_ms)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.times_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _value_sql(name: str, data_type: str) -> str:
    """A generated value for one column, from its type; ``i`` is the row number."""
    if name.endswith("_unix_nano"):
        return "1700000000000000000 + i * 1000000"
    if name in ("run_key",):
        return "hash(i)"
    if data_type == "VARCHAR":
        if name.endswith("_id"):
            return f"md5(i::VARCHAR || '{name}')"
        return f"'{name}-' || (hash(i, '{name}') % 12)"
    if data_type == "BOOLEAN":
        return f"hash(i, '{name}') % 7 = 0"
    if data_type in ("DOUBLE", "FLOAT"):
        return f"(hash(i, '{name}') % 1000) / 10.0"
    if data_type in ("BIGINT", "INTEGER", "UBIGINT", "HUGEINT", "SMALLINT", "TINYINT"):
        return f"(hash(i, '{name}') % 100)::{data_type}"
    return "NULL"


def _insert_sql(con: Any, table: str) -> str:
    columns = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() "
        "WHERE table_name = ? AND database_name = current_database() ORDER BY column_index",
        [table],
    ).fetchall()
    values = ", ".join(_value_sql(name, data_type) for name, data_type in columns)
    return f"INSERT INTO {table} SELECT {values} FROM range(?, ?) g(i)"


def run_variant(workdir: Path, variant: str, *, checkpoints: int, rows: int) -> Figure:
    """Append ``rows`` runs and stops, checkpoint, ``checkpoints`` times; the times."""
    from loopwatch.collector.store.schema import apply_migrations
    from loopwatch.collector.store.settings import StoreConfig, open_file

    path = workdir / f"{variant.replace(' ', '_').replace(',', '')}.duckdb"
    row_group = 16_384 if variant == "16,384-row groups" else 122_880
    con = open_file(path, StoreConfig(row_group_rows=row_group))
    if variant == "no vacuum":
        con.execute("SET max_vacuum_tasks = 0")
    try:
        apply_migrations(con)
        inserts = [_insert_sql(con, table) for table in TABLES]
        times: list[float] = []
        for round_ in range(checkpoints):
            con.execute("BEGIN TRANSACTION")
            for sql in inserts:
                con.execute(sql, [round_ * rows, (round_ + 1) * rows])
            con.execute("COMMIT")
            started = time.perf_counter()
            con.execute("CHECKPOINT")
            times.append((time.perf_counter() - started) * 1e3)
        groups = con.execute(
            "SELECT row_group_id, sum(count) "
            "FROM pragma_storage_info('runs') WHERE column_path = '[0]' GROUP BY ALL ORDER BY 1"
        ).fetchall()
    finally:
        con.close()
    return Figure(variant, tuple(times), tuple(int(rows) for _, rows in groups))


def report(figures: list[Figure], rows: int) -> str:
    base = figures[0].longest
    lines = [
        f"checkpoint after each {rows:,} runs + stops, {len(figures[0].times_ms)} checkpoints"
        f" ({len(figures[0].times_ms) * rows:,} runs)",
        f"{'variant':<18} {'longest ms':>10} {'p99 ms':>8} {'p50 ms':>8} {'sum s':>7}"
        f" {'longest vs first':>17} {'row groups of runs':>19}",
    ]
    for figure in figures:
        lines.append(
            f"{figure.variant:<18} {figure.longest:>10.0f} {figure.percentile(0.99):>8.0f}"
            f" {statistics.median(figure.times_ms):>8.0f} {sum(figure.times_ms) / 1e3:>7.1f}"
            f" {figure.longest / base:>16.2f}x {len(figure.row_groups):>19}"
        )
    return "\n".join(lines)


def test_bench_checkpoint_smoke(tmp_path: Path) -> None:
    if not os.environ.get("LOOPWATCH_BENCH"):
        pytest.skip("set LOOPWATCH_BENCH=1 to run the checkpoint benchmark smoke test")
    figures = [run_variant(tmp_path, v, checkpoints=12, rows=11_000) for v in VARIANTS]
    print("\n" + report(figures, 11_000))
    large, no_vacuum, small = figures
    for figure in figures:
        assert len(figure.times_ms) == 12 and all(t > 0 for t in figure.times_ms)
        assert sum(figure.row_groups) == 12 * 11_000
    # The mechanism, not the times: without vacuum each checkpoint left its own row
    # group; the vacuum merged the 122,880-row ones into fewer, larger ones; 16k groups stay
    # at most 16,384 rows, which bounds what one merge rewrites.
    assert len(no_vacuum.row_groups) == 12
    assert len(large.row_groups) < 12 and max(large.row_groups) > 3 * 16_384
    assert max(small.row_groups) <= 16_384


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--checkpoints", type=int, default=60)
    parser.add_argument("--rows", type=int, default=11_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopwatch-bench-checkpoint-") as workdir:
        figures = [
            run_variant(Path(workdir), v, checkpoints=args.checkpoints, rows=args.rows)
            for v in VARIANTS
        ]
    print(report(figures, args.rows))


if __name__ == "__main__":
    main()
