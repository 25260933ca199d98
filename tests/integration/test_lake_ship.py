"""Shipping to the lake: real collector processes, a real PostgreSQL catalog, real runs.

Each test sends real guarded runs (:func:`emit_loopwatch_runs`) to ``loopwatch
collector --lake ...`` processes and reads the lake back with a DuckDB of its own, by
``run_id``: every acknowledged run must be there exactly once, whatever happened in
between (``kill -9`` in the window between the lake commit and the local mark, a
PostgreSQL restart, an unwritable data path).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from loopwatch.collector.lake.connect import LakeTarget, connect_lake
from loopwatch.collector.lake.ship import LakeBatch, LakeSession

from .postgres import PostgresProcess, start_postgres
from .services import (
    CollectorProcess,
    emit_loopwatch_runs,
    poll_until,
    run_collector_cli,
    start_collector,
)

SCENARIOS = ("repeated_action", "budget_exhausted", "completed")


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[PostgresProcess]:
    with start_postgres(tmp_path) as server:
        server.create_database("lake")
        yield server


def lake_target(pg: PostgresProcess, tmp_path: Path) -> LakeTarget:
    return LakeTarget(pg.catalog("lake"), str(tmp_path / "lake-data") + "/")


def fast_env(**extra: str) -> dict[str, str]:
    """Ship quickly: a short grace and interval, so a test waits seconds, not minutes."""
    return {
        "LOOPWATCH_LAKE_SHIP_GRACE_SECONDS": "0.5",
        "LOOPWATCH_LAKE_SHIP_INTERVAL_SECONDS": "0.3",
        "LOOPWATCH_LAKE_SHIP_RETRY_MAX_SECONDS": "2",
        "LOOPWATCH_SAMPLING_COMPLETED_FRACTION": "1",
        **extra,
    }


def start_shipping(
    tmp_path: Path, target: LakeTarget, name: str, *, env: dict[str, str] | None = None,
    db_path: Path | None = None,
) -> CollectorProcess:  # fmt: skip
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return start_collector(
        folder,
        "--lake",
        target.catalog,
        "--lake-data",
        target.data_path,
        "--collector-id",
        name,
        db_path=db_path,
        env=env if env is not None else fast_env(),
        ready_timeout_seconds=60,
    )


def lake_rows(target: LakeTarget, sql: str) -> list[tuple[object, ...]]:
    con = connect_lake(target, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def lake_run_ids(target: LakeTarget) -> Counter[str]:
    return Counter(str(r) for (r,) in lake_rows(target, "SELECT run_id FROM lake.runs"))


def wait_shipped(target: LakeTarget, expected: set[str], timeout_seconds: float = 90) -> None:
    poll_until(
        lambda: expected <= set(lake_run_ids(target)),
        timeout_seconds=timeout_seconds,
        what="the runs to reach the lake",
    )


def send(collector: CollectorProcess, n: int, prefix: str) -> dict[str, str]:
    expected, _ = emit_loopwatch_runs(
        collector.otlp_url, [SCENARIOS[i % 3] for i in range(n)], run_id_prefix=prefix
    )
    return expected


def assert_exactly_once(target: LakeTarget, expected: dict[str, str]) -> None:
    """Each sent run is in the lake once, with its stop; nothing else is there."""
    ids = lake_run_ids(target)
    assert set(ids) == set(expected), (set(expected) - set(ids), set(ids) - set(expected))
    assert max(ids.values()) == 1, [r for r, n in ids.items() if n > 1]
    stops = dict(
        (str(r), str(s)) for r, s in lake_rows(target, "SELECT run_id, reason FROM lake.stops")
    )
    assert stops == expected
    per_run = lake_rows(
        target, "SELECT run_id, count(*) FROM lake.stops GROUP BY run_id HAVING count(*) > 1"
    )
    assert per_run == []


def test_acknowledged_runs_reach_the_lake_once(pg: PostgresProcess, tmp_path: Path) -> None:
    target = lake_target(pg, tmp_path)
    with start_shipping(tmp_path, target, "c1") as collector:
        expected = send(collector, 30, "ack")
        wait_shipped(target, set(expected))
        # The lake shows the runs when its transaction commits; the local marks and the
        # backlog gauge follow at the end of that pass.
        poll_until(
            lambda: collector.metrics().value("loopwatch_lake_backlog_runs") == 0,
            timeout_seconds=30,
            what="the backlog gauge at 0",
        )
        metrics = collector.metrics()
        assert metrics.total("loopwatch_lake_runs_shipped_total") == 30
        assert metrics.total("loopwatch_lake_runs_skipped_total") == 0
        # The lake's copy matches the local one, row for row.
        local = {r["run_id"]: r for r in collector.runs()}
        steps = lake_rows(
            target, "SELECT run_id, count(*) FROM lake.steps GROUP BY run_id ORDER BY run_id"
        )
        for run_id, n in steps:
            assert local[str(run_id)]["steps"] >= 1 and n >= 1
        tools = lake_rows(
            target,
            "SELECT sum(calls) FROM lake.run_tools WHERE run_id IN "
            "(SELECT run_id FROM lake.runs WHERE stop_reason = 'repeated_action')",
        )
        assert tools[0][0] == 10 * 3  # two ok calls and the blocked third, per loop
        collector_ids = lake_rows(target, "SELECT DISTINCT collector_id FROM lake.runs")
        assert collector_ids == [("c1",)]
        # The shipper moves rows DuckDB to DuckDB through Arrow capsules: pyarrow (26
        # MiB of a sidecar's memory) is not loaded in a shipping collector either.
        maps = Path(f"/proc/{collector.proc.pid}/maps")
        if maps.exists():
            assert "/pyarrow/" not in maps.read_text(), "the shipping collector loaded pyarrow"
    assert_exactly_once(target, expected)


def test_kill_between_lake_commit_and_local_mark(pg: PostgresProcess, tmp_path: Path) -> None:
    """``kill -9`` after the lake commit, before the local mark: the restart re-ships the
    batch, finds its own rows and only marks them."""
    target = lake_target(pg, tmp_path)
    db = tmp_path / "c1" / "collector.duckdb"
    hooked = fast_env(LOOPWATCH_TEST_SHIP_PAUSE_SECONDS="30")
    collector = start_shipping(tmp_path, target, "c1", env=hooked, db_path=db)
    expected = send(collector, 12, "kill")
    poll_until(
        lambda: "lake commit done" in collector.stderr_text(),
        timeout_seconds=60,
        what="the hooked lake commit",
    )
    assert collector.kill() == -9
    # The kill landed in the window: the batch is in the lake, and not marked locally.
    in_lake = set(lake_run_ids(target))
    assert in_lake and in_lake <= set(expected)
    local = duckdb.connect(str(db), read_only=True)
    try:
        assert local.execute("SELECT count(*) FROM shipped_runs").fetchone() == (0,)
    finally:
        local.close()
    with start_shipping(tmp_path, target, "c1", db_path=db) as restarted:
        more = send(restarted, 6, "after")
        wait_shipped(target, set(expected) | set(more))
        time.sleep(2)  # a pass or two more: nothing may be shipped twice
        metrics = restarted.metrics()
    assert_exactly_once(target, expected | more)
    # The killed batch was not re-inserted: the restart inserted only what was missing.
    assert metrics.total("loopwatch_lake_runs_skipped_total") == 0


def test_postgres_restart_during_shipping(pg: PostgresProcess, tmp_path: Path) -> None:
    target = lake_target(pg, tmp_path)
    with start_shipping(tmp_path, target, "c1") as collector:
        first = send(collector, 9, "before")
        wait_shipped(target, set(first))
        pg.stop()
        during = send(collector, 9, "during")  # acknowledged while the catalog is down
        poll_until(
            lambda: collector.metrics().total("loopwatch_lake_ship_failures_total") > 0,
            timeout_seconds=30,
            what="a failed ship while PostgreSQL is down",
        )
        pg.start()
        after = send(collector, 9, "after")
        wait_shipped(target, set(first) | set(during) | set(after))
        failures = collector.metrics().series("loopwatch_lake_ship_failures_total")
    assert_exactly_once(target, first | during | after)
    assert sum(failures.values()) > 0


def test_unwritable_data_path_at_runtime(pg: PostgresProcess, tmp_path: Path) -> None:
    """The data folder replaced by a file (root ignores permission bits): ships fail and
    are retried; nothing is marked, nothing lost."""
    target = lake_target(pg, tmp_path)
    data = Path(target.data_path)
    with start_shipping(tmp_path, target, "c1") as collector:
        first = send(collector, 6, "before")
        wait_shipped(target, set(first))
        shutil.move(data, tmp_path / "lake-data-aside")
        data.write_text("not a folder")
        during = send(collector, 6, "during")
        poll_until(
            lambda: (
                (
                    collector.metrics().value(
                        "loopwatch_lake_ship_failures_total", reason="data_path"
                    )
                    or 0
                )
                > 0
            ),
            timeout_seconds=30,
            what="a data_path failure",
        )
        assert collector.metrics().value("loopwatch_lake_backlog_runs") == len(during)
        data.unlink()
        shutil.move(tmp_path / "lake-data-aside", data)
        wait_shipped(target, set(first) | set(during))
    assert_exactly_once(target, first | during)


def test_two_collectors_same_runs_one_copy(pg: PostgresProcess, tmp_path: Path) -> None:
    """The same runs sent to two collectors (a trace split across sidecars, at its
    worst): the lake holds one copy of each; the other collector counts it skipped."""
    target = lake_target(pg, tmp_path)
    with (
        start_shipping(tmp_path, target, "c1") as one,
        start_shipping(tmp_path, target, "c2") as two,
    ):
        expected = send(one, 30, "both")
        assert send(two, 30, "both") == expected
        wait_shipped(target, set(expected))
        poll_until(
            lambda: all(c.metrics().value("loopwatch_lake_backlog_runs") == 0 for c in (one, two)),
            timeout_seconds=60,
            what="both backlogs to drain",
        )
        shipped = [c.metrics().total("loopwatch_lake_runs_shipped_total") for c in (one, two)]
        skipped = [c.metrics().total("loopwatch_lake_runs_skipped_total") for c in (one, two)]
    assert_exactly_once(target, expected)
    assert sum(shipped) == 30 and sum(skipped) == 30, (shipped, skipped)
    owners = lake_rows(target, "SELECT collector_id, count(*) FROM lake.runs GROUP BY ALL")
    assert sum(n for _, n in owners) == 30  # type: ignore[misc]


@pytest.mark.parametrize("case", ["unreachable", "bad_dsn", "unwritable_data", "other_version"])
def test_bad_lake_config_exits_2_with_one_line(
    pg: PostgresProcess, tmp_path: Path, case: str
) -> None:
    data = str(tmp_path / "lake-data") + "/"
    catalog = pg.catalog("lake") + " password=hunter2"
    expect = "catalog"
    if case == "unreachable":
        pg.stop()
    elif case == "bad_dsn":
        catalog = "postgres:dbname=lake host=127.0.0.1 port=notaport password=hunter2"
    elif case == "unwritable_data":
        (tmp_path / "a-file").write_text("x")
        data = str(tmp_path / "a-file" / "lake") + "/"
        expect = "data path"
    else:
        connect_lake(LakeTarget(pg.catalog("lake"), data)).close()
        import psycopg

        with psycopg.connect(pg.dsn("lake"), autocommit=True) as con:
            con.execute("UPDATE ducklake_metadata SET value = '0.1' WHERE key = 'version'")
        expect = "version"
    result = run_collector_cli(
        "--db",
        str(tmp_path / "c.duckdb"),
        "--otlp-http",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--lake",
        catalog,
        "--lake-data",
        data,
        cwd=tmp_path,
        timeout_seconds=60,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("loopwatch collector: cannot start:"), lines
    assert expect in lines[0].lower(), lines
    assert "hunter2" not in result.stderr + result.stdout
    # Checked before the store opened: the collector never took a span.
    assert not (tmp_path / "c.duckdb").exists()


def _publish(
    session: LakeSession, index: int, batch: LakeBatch, barrier: threading.Barrier,
    outcomes: list[object],
) -> None:  # fmt: skip
    barrier.wait()
    outcomes[index] = session.publish(batch, f"c{index}")


def test_concurrent_publishers_insert_one_copy(pg: PostgresProcess, tmp_path: Path) -> None:
    """Two shippers publish the same batch at the same instant, five times over: the
    advisory lock serializes check and insert, so each run is inserted by exactly one."""
    from loopwatch.collector.lake.ship import open_lake, select_finished
    from loopwatch.collector.sample import SamplingConfig
    from loopwatch.collector.store import Store, StoreConfig

    from tests.unit.test_store import NS, Clock, commit, full_run

    target = lake_target(pg, tmp_path)
    sessions = [open_lake(target), open_lake(target)]
    clock = Clock()
    config = StoreConfig(sampling=SamplingConfig(completed_fraction=1.0))
    with Store(tmp_path / "local.duckdb", config=config, clock=clock) as store:
        for round_ in range(5):
            for i in range(40):
                commit(store, full_run(f"same-{round_}-{i}", "completed"))
            clock.now += 10
            cursor = store.read_cursor()
            done = select_finished(cursor, now_ns=int(clock() * NS), grace_ns=0, limit=40)
            # One batch (Arrow arrays), published by both sessions at once.
            batch = sessions[0].stage(cursor, done)
            cursor.close()
            barrier = threading.Barrier(2)
            outcomes: list[object] = [None, None]
            threads = [
                threading.Thread(target=_publish, args=(sessions[i], i, batch, barrier, outcomes))
                for i in range(2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            inserted = [set(o.inserted) for o in outcomes]  # type: ignore[attr-defined]
            skipped = [set(o.skipped) for o in outcomes]  # type: ignore[attr-defined]
            assert not inserted[0] & inserted[1]
            assert inserted[0] | inserted[1] == set(batch.run_keys)
            assert skipped[0] | skipped[1] == set(batch.run_keys)
            # Record this round's runs as shipped so the next round reads only new ones.
            store.run_task(
                lambda con: con.execute(
                    "INSERT INTO shipped_runs SELECT run_key, 0, false FROM runs "
                    "WHERE run_key NOT IN (SELECT run_key FROM shipped_runs)"
                )
            ).result(10)
    for session in sessions:
        session.close()
    counts = lake_rows(target, "SELECT count(*), count(DISTINCT run_key) FROM lake.runs")
    assert counts == [(200, 200)]
    assert lake_rows(target, "SELECT count(DISTINCT run_key), count(*) FROM lake.stops") == [
        (200, 200)
    ]


def test_three_collectors_start_at_once_on_a_fresh_catalog(
    pg: PostgresProcess, tmp_path: Path
) -> None:
    """Three collectors started at the same instant on a new catalog: the first ATTACH
    creates DuckLake's metadata tables, which races in PostgreSQL (``duplicate key value
    violates unique constraint "pg_type_typname_nsp_index"``) without the attach lock.
    All three start, and all three ship."""
    target = lake_target(pg, tmp_path)
    barrier = threading.Barrier(3)
    started: list[CollectorProcess | BaseException | None] = [None, None, None]

    def start(index: int) -> None:
        barrier.wait()
        try:
            started[index] = start_shipping(tmp_path, target, f"c{index}")
        except BaseException as exc:  # reported below, with the collector's stderr
            started[index] = exc

    threads = [threading.Thread(target=start, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    collectors = [c for c in started if isinstance(c, CollectorProcess)]
    try:
        assert len(collectors) == 3, [str(c)[:2000] for c in started]
        expected: dict[str, str] = {}
        for index, collector in enumerate(collectors):
            expected |= send(collector, 6, f"fresh{index}")
        wait_shipped(target, set(expected))
    finally:
        for collector in collectors:
            collector.stop()
    assert_exactly_once(target, expected)
