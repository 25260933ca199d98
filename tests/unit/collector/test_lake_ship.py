"""The shipper's parts on real DuckDB files: which runs are finished, what a batch holds,
the anti-join by run key, the local marks and shipped-aware retention, failure reasons.

The lake here is a local ``.ducklake`` catalog (the same DuckLake code as PostgreSQL's;
the PostgreSQL paths run in ``tests/integration/test_lake_ship.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from loopwatch.collector.errors import LakeUnavailable
from loopwatch.collector.lake.connect import LakeTarget, connect_lake
from loopwatch.collector.lake.schema import BATCH_TABLES, LAKE_TABLES, views
from loopwatch.collector.lake.ship import (
    LakeBatch,
    LakeSession,
    Shipper,
    ShipSettings,
    classify_failure,
    count_backlog,
    mark_shipped,
    open_lake,
    probe_data_path,
    read_batch,
    select_finished,
    split_existing,
)
from loopwatch.collector.metrics import LAKE_METRIC_NAMES, LakeShipMetrics
from loopwatch.collector.rows import KIND_DECISION
from loopwatch.collector.sample import SamplingConfig
from loopwatch.collector.store import Store, StoreConfig
from loopwatch.collector.store.schema import run_key_of
from prometheus_client import CollectorRegistry, generate_latest

from tests.unit.test_store import NS, Clock, commit, full_run, run_row, step_row, stop_row
from tests.unit.test_store import batch as batch_of

GRACE_NS = 5 * NS


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    with Store(
        tmp_path / "local.duckdb",
        config=StoreConfig(sampling=SamplingConfig(completed_fraction=1.0)),
        clock=clock,
    ) as s:
        yield s


def query(batch: LakeBatch, table: str, sql: str) -> list[tuple[object, ...]]:
    """Run ``sql`` (``{}`` is the table) over one table of a batch, in a fresh DuckDB."""
    con = duckdb.connect(":memory:")
    try:
        with views(con, {table: batch.tables[table]}):
            return con.execute(sql.format(BATCH_TABLES[table])).fetchall()
    finally:
        con.close()


def finished(store: Store, clock: Clock, limit: int = 100) -> list[tuple[int, int]]:
    cursor = store.read_cursor()
    try:
        return select_finished(cursor, now_ns=int(clock() * NS), grace_ns=GRACE_NS, limit=limit)
    finally:
        cursor.close()


def test_finished_means_decided_quiet_and_unshipped(store: Store, clock: Clock) -> None:
    commit(store, full_run("stopped", "repeated_action"))
    commit(store, full_run("completed", "completed"))
    commit(store, full_run("open", None))  # no stop yet: undecided
    assert finished(store, clock) == []  # within the grace period
    clock.now += 6
    keys = {key for key, _ in finished(store, clock)}
    assert keys == {run_key_of("stopped"), run_key_of("completed")}
    store.run_task(lambda con: mark_shipped(con, [run_key_of("stopped")], [], 1)).result(10)
    assert {key for key, _ in finished(store, clock)} == {run_key_of("completed")}
    cursor = store.read_cursor()
    assert count_backlog(cursor)[0] == 1
    cursor.close()
    # A late span of a decided run restarts its grace period.
    commit(store, full_run("completed", "completed", tools=("late",)))
    assert finished(store, clock) == []
    # A run whose stop never comes is decided by the store's timeout, then ships.
    clock.now += 3600
    store.run_maintenance().result(10)
    assert {key for key, _ in finished(store, clock)} == {
        run_key_of("completed"),
        run_key_of("open"),
    }


def test_finished_is_oldest_first_and_capped(store: Store, clock: Clock) -> None:
    for i in range(5):
        commit(store, full_run(f"r{i}", "completed"))
        clock.now += 1
    clock.now += 10
    got = finished(store, clock, limit=3)
    assert [key for key, _ in got] == [run_key_of(f"r{i}") for i in range(3)]
    assert [seen for _, seen in got] == sorted(seen for _, seen in got)


def test_batch_holds_the_lake_rows(store: Store, clock: Clock) -> None:
    commit(store, full_run("loop", "repeated_action", tools=("search", "search", "search")))
    canary = full_run("leak", "completed")
    canary.canary_run_ids = frozenset({"leak"})
    commit(store, canary)
    clock.now += 10
    cursor = store.read_cursor()
    lake = duckdb.connect(":memory:")
    batch = read_batch(cursor, finished(store, clock), lake)
    cursor.close()
    assert set(batch.run_keys) == {run_key_of("loop"), run_key_of("leak")}
    assert batch.rows("runs") == 2 and batch.rows("stops") == 2
    assert batch.rows("steps") == 12  # three decisions and three tool results each
    tools = set(query(batch, "run_tools", "SELECT run_id, tool, calls FROM {}"))
    assert ("loop", "search", 3) in tools
    flags = query(batch, "canary_flags", "SELECT run_id FROM {}")
    assert flags == [("leak",)]
    # The batch tables have the lake tables' own columns, in order.
    for table, columns in LAKE_TABLES.items():
        described = query(batch, table, "DESCRIBE {}")
        assert [(name, kind) for name, kind, *_ in described] == list(columns), table


def test_batch_reads_rows_stored_long_before_the_run_finished(store: Store, clock: Clock) -> None:
    """Each local read is bounded by time (the pass floor for runs, the batch's earliest
    first span for stops and steps); a run whose first steps were stored an hour before
    its stop still ships whole."""
    commit(store, full_run("long", None, tools=("early",)))
    clock.now += 3600
    commit(
        store,
        batch_of(
            step_row("long", 2, kind=KIND_DECISION),
            step_row("long", 2, tool="late"),
            stop_row("long", "no_progress", step=2),
        ),
    )
    commit(store, full_run("short", "completed"))
    clock.now += 10
    cursor = store.read_cursor()
    lake = duckdb.connect(":memory:")
    batch = read_batch(cursor, finished(store, clock), lake)
    cursor.close()
    assert set(batch.run_keys) == {run_key_of("long"), run_key_of("short")}
    tools = query(
        batch,
        "steps",
        "SELECT tool FROM {} WHERE run_id = 'long' AND tool IS NOT NULL ORDER BY step",
    )
    assert tools == [("early",), ("late",)]
    stops = query(batch, "stops", "SELECT run_id, reason FROM {} ORDER BY run_id")
    assert stops == [("long", "no_progress"), ("short", "completed")]


def test_a_clock_set_back_between_two_groups_of_a_run_loses_none_of_its_rows(
    store: Store, clock: Clock
) -> None:
    """The writer takes each group's time from the wall clock and sets the run's
    ``last_seen`` to it, so after the clock is set back a run's earlier rows were
    received after its ``last_seen``: the batch reads stops and steps by key, not by a
    time window, and ships them all."""
    commit(store, full_run("jump", None, tools=("before",)))
    clock.now -= 3600  # NTP steps the clock back an hour
    commit(
        store,
        batch_of(
            step_row("jump", 2, kind=KIND_DECISION),
            step_row("jump", 2, tool="after"),
            stop_row("jump", "no_progress", step=2),
        ),
    )
    clock.now += 10
    cursor = store.read_cursor()
    lake = duckdb.connect(":memory:")
    batch = read_batch(cursor, finished(store, clock), lake)
    cursor.close()
    assert batch.run_keys == [run_key_of("jump")]
    tools = query(batch, "steps", "SELECT tool FROM {} WHERE tool IS NOT NULL ORDER BY step")
    assert tools == [("before",), ("after",)]
    assert query(batch, "stops", "SELECT reason FROM {}") == [("no_progress",)]


def test_a_run_touched_after_selection_leaves_the_batch_whole(store: Store, clock: Clock) -> None:
    """A span that arrives between the selection and the read makes the run not quiet:
    it leaves this batch with all its rows (none staged without their run), and ships
    in a later pass."""
    commit(store, full_run("busy", "repeated_action"))
    commit(store, full_run("quiet", "completed"))
    clock.now += 10
    selected = finished(store, clock)
    assert {key for key, _ in selected} == {run_key_of("busy"), run_key_of("quiet")}
    commit(store, batch_of(step_row("busy", 4, tool="late")))
    cursor = store.read_cursor()
    lake = duckdb.connect(":memory:")
    staged = read_batch(cursor, selected, lake)
    cursor.close()
    assert staged.run_keys == [run_key_of("quiet")]
    for table in ("runs", "stops", "steps", "run_tools"):
        assert query(staged, table, "SELECT DISTINCT run_id FROM {}") == [("quiet",)], table
    assert staged.rows("steps") == 6 and staged.rows("stops") == 1


def test_split_existing() -> None:
    new, mine, skipped = split_existing([1, 2, 3, 4], [(2, "me"), (3, "other")], "me")
    assert (new, mine, skipped) == ([1, 4], [2], [3])


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (duckdb.TransactionException("Transaction conflict: cannot commit"), "conflict"),
        (OSError(28, "No space left on device"), "data_path"),
        (duckdb.IOException('Cannot open file "/x/y.parquet": Not a directory'), "data_path"),
        (duckdb.IOException("Failed to execute query: server closed the connection"),
         "catalog"),
        (LakeUnavailable("catalog", "cannot reach"), "catalog"),
        (ValueError("something else"), "other"),
    ],
)  # fmt: skip
def test_failure_reasons(exc: BaseException, reason: str) -> None:
    assert classify_failure(exc) == reason


def test_probe_refuses_an_unwritable_data_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(LakeUnavailable) as info:
        probe_data_path(str(tmp_path / "file" / "lake") + "/")
    assert info.value.what == "data_path"
    probe_data_path(str(tmp_path / "ok") + "/")
    assert list((tmp_path / "ok").iterdir()) == []  # the probe file is gone


def lake_ids(target: LakeTarget, session: LakeSession) -> list[str]:
    assert session.con is not None
    return sorted(r for (r,) in session.con.execute("SELECT run_id FROM lake.runs").fetchall())


def test_ship_once_publishes_then_marks(store: Store, clock: Clock, tmp_path: Path) -> None:
    target = LakeTarget(str(tmp_path / "cat.ducklake"), str(tmp_path / "data") + "/")
    session = open_lake(target)
    metrics = LakeShipMetrics(("other",))
    shipper = Shipper(
        session,
        read_cursor=store.read_cursor,
        run_task=store.run_task,
        settings=ShipSettings(collector_id="c1", grace_seconds=5, batch_runs=2),
        on_shipped=metrics.record_shipped,
        on_backlog=metrics.set_backlog,
        clock=clock,
    )
    for name in ("a", "b", "c"):
        commit(store, full_run(name, "completed"))
    clock.now += 10
    assert shipper.ship_once() is True  # a full batch: more may wait
    assert shipper.ship_once() is False
    assert shipper.ship_once() is False  # nothing left, nothing twice
    assert lake_ids(target, session) == ["a", "b", "c"]
    # A crash after the lake commit, before the mark: the same run is found as "mine".
    commit(store, full_run("d", "completed"))
    clock.now += 10
    cursor = store.read_cursor()
    batch = session.stage(cursor, finished(store, clock))
    cursor.close()
    assert session.publish(batch, "c1").inserted == [run_key_of("d")]
    assert shipper.ship_once() is False
    assert lake_ids(target, session) == ["a", "b", "c", "d"]
    # Another collector's copy of a run already in the lake is skipped, never inserted.
    other = Store(tmp_path / "other.duckdb", clock=clock)
    try:
        commit(other, full_run("a", "completed"))
        clock.now += 10
        cursor = other.read_cursor()
        outcome = session.publish(session.stage(cursor, finished(other, clock)), "c2")
        cursor.close()
        assert (outcome.inserted, outcome.mine, outcome.skipped) == ([], [], [run_key_of("a")])
    finally:
        other.close()
    assert lake_ids(target, session) == ["a", "b", "c", "d"]
    # The pass floor never hides a run decided late: one whose stop never came is
    # decided by the store's timeout, long after its last span, and still ships.
    commit(store, full_run("late", None))
    clock.now += 7200
    store.run_maintenance().result(10)
    assert shipper.floor_ns is not None
    assert shipper.ship_once() is False
    assert "late" in lake_ids(target, session)
    cursor = store.read_cursor()
    marks = cursor.execute("SELECT count(*), bool_or(skipped) FROM shipped_runs").fetchone()
    cursor.close()
    assert marks == (5, False)
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    for name in LAKE_METRIC_NAMES:
        assert name in text, name
    assert "loopwatch_lake_runs_shipped_total 4.0" in text  # d was inserted by publish()
    shipper.stop()


def local_ids(store: Store) -> set[str]:
    cursor = store.read_cursor()
    try:
        return {r for (r,) in cursor.execute("SELECT run_id FROM runs").fetchall()}
    finally:
        cursor.close()


def test_local_retention_removes_only_shipped_runs(tmp_path: Path, clock: Clock) -> None:
    config = StoreConfig(
        sampling=SamplingConfig(completed_fraction=1.0),
        retention_seconds=3600,
        shipped_retention_seconds=600,
        keep_unshipped=True,
    )
    with Store(tmp_path / "local.duckdb", config=config, clock=clock) as store:
        for name in ("shipped", "unshipped"):
            commit(store, full_run(name, "completed"))
        commit(store, batch_run_only("undecided"))
        now_ns = int(clock() * NS)
        store.run_task(lambda con: mark_shipped(con, [run_key_of("shipped")], [], now_ns)).result(
            10
        )
        clock.now += 300  # not past the shipped retention yet
        store.run_maintenance().result(10)
        assert local_ids(store) == {"shipped", "unshipped", "undecided"}
        clock.now += 400  # past it: the shipped run goes with its mark
        store.run_maintenance().result(10)
        assert local_ids(store) == {"unshipped", "undecided"}
        clock.now += 7200  # past retention_seconds: an unshipped run still stays
        store.run_maintenance().result(10)
        assert "unshipped" in local_ids(store)
        cursor = store.read_cursor()
        assert cursor.execute("SELECT count(*) FROM shipped_runs").fetchone() == (0,)
        cursor.close()


def batch_run_only(run_id: str):  # type: ignore[no-untyped-def]
    from tests.unit.test_store import batch

    return batch(run_row(run_id))


def test_connect_lake_is_used_read_only_by_readers(tmp_path: Path) -> None:
    target = LakeTarget(str(tmp_path / "cat.ducklake"), str(tmp_path / "data") + "/")
    open_lake(target).close()
    con = connect_lake(target, read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM lake.runs").fetchone() == (0,)
    finally:
        con.close()
