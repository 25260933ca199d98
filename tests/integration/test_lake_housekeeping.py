"""Lake housekeeping on a real PostgreSQL catalog and a real data folder.

- two housekeepers asking at once: exactly one works, the other skips (the lease);
- a holder killed with ``kill -9`` is replaced once its lease expires;
- merging reduces the lake's file count and keeps every row;
- retention removes old runs from every lake table, and nothing newer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopwatch.collector.lake.connect import LakeTarget, connect_lake
from loopwatch.collector.lake.housekeeping import Housekeeper, LakeLease
from loopwatch.collector.lake.schema import LAKE_TABLES, ensure_lake_schema, lake_columns

from .postgres import PostgresProcess, start_postgres
from .services import poll_until

DAY_NS = 86_400 * 1_000_000_000


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresProcess]:
    with start_postgres(tmp_path_factory.mktemp("pg")) as server:
        yield server


@pytest.fixture
def target(pg: PostgresProcess, tmp_path: Path) -> LakeTarget:
    """A fresh lake: its own catalog database and data folder."""
    name = f"lake_{uuid.uuid4().hex[:12]}"
    pg.create_database(name)
    lake = LakeTarget(pg.catalog(name), str(tmp_path / "lake-data") + "/")
    con = connect_lake(lake)
    try:
        ensure_lake_schema(con)
    finally:
        con.close()
    return lake


def _insert_runs(target: LakeTarget, run_ids: list[str], last_seen_ns: int) -> None:
    """One row per run in every lake table (one transaction, so one file per table)."""
    con = connect_lake(target)
    try:
        con.execute("BEGIN TRANSACTION")
        for table in LAKE_TABLES:
            names = [name for name, _ in lake_columns(table)]
            values: list[list[Any]] = []
            for index, run_id in enumerate(run_ids):
                row: dict[str, Any] = {"run_id": run_id, "collector_id": "test"}
                if "run_key" in names:
                    row["run_key"] = abs(hash(run_id)) % 2**63
                if table == "runs":
                    row["last_seen_unix_nano"] = last_seen_ns + index
                if table == "canary_flags":
                    row["first_seen_unix_nano"] = last_seen_ns
                values.append([row.get(name) for name in names])
            # One statement per table: one file (row-by-row inserts would be inlined).
            marks = ", ".join(["(" + ", ".join("?" for _ in names) + ")"] * len(values))
            con.execute(
                f"INSERT INTO lake.{table} ({', '.join(names)}) VALUES {marks}",
                [v for row in values for v in row],
            )
        con.execute("COMMIT")
    finally:
        con.close()


def _run_ids(target: LakeTarget) -> dict[str, set[str]]:
    con = connect_lake(target, read_only=True)
    try:
        return {
            table: {str(r[0]) for r in con.execute(f"SELECT run_id FROM lake.{table}").fetchall()}
            for table in LAKE_TABLES
        }
    finally:
        con.close()


def _file_count(target: LakeTarget, table: str) -> int:
    con = connect_lake(target, read_only=True)
    try:
        row = con.execute(f"SELECT count(*) FROM ducklake_list_files('lake', '{table}')").fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0])


def test_two_housekeepers_at_once_only_one_works(target: LakeTarget) -> None:
    first = Housekeeper(target, "collector-a", interval_seconds=60, lease_seconds=30)
    second = Housekeeper(target, "collector-b", interval_seconds=60, lease_seconds=30)
    for _ in range(4):
        gate = threading.Barrier(2)
        reports: dict[str, Any] = {}

        def go(keeper: Housekeeper, gate: threading.Barrier, reports: dict[str, Any]) -> None:
            gate.wait()
            reports[keeper.holder] = keeper.run_once()

        threads = [threading.Thread(target=go, args=(k, gate, reports)) for k in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        worked = [holder for holder, report in reports.items() if report.worked]
        assert len(worked) == 1, reports
        assert all(not r.errors for r in reports.values()), reports
    # The holder keeps the lease from round to round; the other only ever skipped.
    counts = sorted((first.rounds_worked, second.rounds_worked))
    assert counts == [0, 4]
    assert first.rounds_skipped + second.rounds_skipped == 4
    assert first.lease is not None
    holder = first.lease.current_holder()
    assert holder in (first.holder, second.holder)


def test_background_threads_one_holder(target: LakeTarget) -> None:
    keepers = [
        Housekeeper(target, f"collector-{i}", interval_seconds=0.3, lease_seconds=30)
        for i in range(3)
    ]
    for keeper in keepers:
        keeper.start()
    try:
        poll_until(
            lambda: sum(k.rounds_worked + k.rounds_skipped for k in keepers) >= 12,
            timeout_seconds=60,
            what="housekeeping rounds",
        )
    finally:
        for keeper in keepers:
            keeper.stop()
    working = [k for k in keepers if k.rounds_worked]
    assert len(working) == 1, [(k.holder, k.rounds_worked, k.rounds_skipped) for k in keepers]
    # stop() gave the lease up: nobody holds it now.
    assert keepers[0].lease is not None and keepers[0].lease.current_holder() is None


_HOLDER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from loopwatch.collector.lake.connect import LakeTarget
    from loopwatch.collector.lake.housekeeping import Housekeeper
    keeper = Housekeeper(LakeTarget(sys.argv[1], sys.argv[2]), "doomed",
                         interval_seconds=60, lease_seconds=float(sys.argv[3]))
    report = keeper.run_once()
    print("worked" if report.worked else "skipped", keeper.holder, flush=True)
    time.sleep(600)
    """
)


def test_killed_holder_is_replaced_after_its_lease(target: LakeTarget, tmp_path: Path) -> None:
    lease_seconds = 4.0
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOLDER_SCRIPT,
            target.catalog,
            target.data_path,
            str(lease_seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "worked", line
        doomed = line[1]
        os.kill(proc.pid, 9)
        proc.wait(timeout=10)
        killed_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    heir = Housekeeper(target, "heir", interval_seconds=60, lease_seconds=30)
    assert heir.lease is not None
    assert heir.lease.current_holder() == doomed
    early = heir.run_once()
    assert not early.worked, "the lease of a fresh kill must still hold"
    poll_until(lambda: heir.run_once().worked, timeout_seconds=30, what="the lease to expire")
    assert time.monotonic() - killed_at >= lease_seconds - 1.0
    assert heir.lease.current_holder() == heir.holder


def test_lease_is_atomic_under_many_askers(target: LakeTarget) -> None:
    """Twelve holders ask at once, three times; exactly one gets it each time."""
    leases = [LakeLease(target.postgres_dsn, f"h{i}", lease_seconds=30) for i in range(12)]
    for _ in range(3):
        gate = threading.Barrier(len(leases))
        got: list[str] = []
        failed: list[BaseException] = []

        def ask(
            lease: LakeLease,
            gate: threading.Barrier,
            got: list[str],
            failed: list[BaseException],
        ) -> None:
            gate.wait()
            try:
                if lease.acquire():
                    got.append(lease.holder)
            except Exception as exc:  # reported below: a racing first CREATE TABLE
                failed.append(exc)

        threads = [
            threading.Thread(target=ask, args=(lease, gate, got, failed)) for lease in leases
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not failed, failed
        assert len(got) == 1, got
        for lease in leases:
            lease.release()


def test_merge_reduces_the_file_count_and_keeps_rows(target: LakeTarget) -> None:
    now = time.time_ns()
    expected: set[str] = set()
    for batch in range(6):
        ids = [f"run-{batch}-{i}" for i in range(40)]
        expected.update(ids)
        _insert_runs(target, ids, now)
    before = _file_count(target, "steps")
    assert before >= 6
    keeper = Housekeeper(
        target,
        "merger",
        interval_seconds=60,
        snapshot_retention_seconds=0,
        file_grace_seconds=0,
    )
    report = keeper.run_once()
    assert report.worked and not report.errors, report
    assert report.files_merged >= 6
    assert _file_count(target, "steps") < before
    assert _file_count(target, "steps") == 1
    assert report.snapshots_expired > 0
    assert report.files_deleted >= before, "the merged-away files leave the data folder"
    on_disk = list(Path(target.data_path).rglob("*.parquet"))
    assert len(on_disk) == len(LAKE_TABLES) + 1  # one per table, + lake_meta
    assert all(ids == expected for ids in _run_ids(target).values())


def test_inlined_rows_are_flushed_to_parquet(target: LakeTarget) -> None:
    _insert_runs(target, ["tiny-1", "tiny-2"], time.time_ns())  # under the inlining limit
    report = Housekeeper(target, "flusher", interval_seconds=60).run_once()
    assert report.worked and not report.errors, report
    assert report.rows_flushed >= 2
    assert _file_count(target, "runs") >= 1
    assert _run_ids(target)["runs"] == {"tiny-1", "tiny-2"}


def test_retention_removes_old_runs_from_every_table_and_nothing_newer(
    target: LakeTarget,
) -> None:
    now = time.time_ns()
    old = [f"old-{i}" for i in range(30)]
    young = [f"young-{i}" for i in range(30)]
    edge = ["edge-0"]  # last seen just inside the retention
    _insert_runs(target, old, now - 10 * DAY_NS)
    _insert_runs(target, young, now - 1 * DAY_NS)
    _insert_runs(target, edge, now - 5 * DAY_NS + 60 * 1_000_000_000)
    keeper = Housekeeper(
        target, "janitor", interval_seconds=60, retention_days=5, clock_ns=lambda: now
    )
    report = keeper.run_once()
    assert report.worked and not report.errors, report
    assert report.runs_deleted == len(old)
    left = _run_ids(target)
    assert set(left) == set(LAKE_TABLES)
    for table, ids in left.items():
        assert ids == set(young) | set(edge), table
    again = keeper.run_once()
    assert again.runs_deleted == 0 and not again.errors


def test_no_retention_keeps_everything(target: LakeTarget) -> None:
    now = time.time_ns()
    _insert_runs(target, ["ancient"], now - 3_000 * DAY_NS)
    report = Housekeeper(target, "keeper", interval_seconds=60).run_once()
    assert report.worked and report.runs_deleted == 0
    assert _run_ids(target)["runs"] == {"ancient"}


def test_catalog_down_is_a_skipped_round_not_an_error(
    target: LakeTarget, pg: PostgresProcess
) -> None:
    keeper = Housekeeper(target, "patient", interval_seconds=60)
    pg.stop()
    try:
        report = keeper.run_once()
    finally:
        pg.start()
    assert not report.worked
    assert report.errors and report.errors[0].startswith("lease:")
    assert keeper.run_once().worked


def test_housekeeping_settings_from_the_environment_and_their_checks() -> None:
    from loopwatch.collector.config import load_config
    from loopwatch.collector.errors import ConfigError
    from loopwatch.collector.lake.housekeeping import housekeeper_for

    env = {
        "LOOPWATCH_LAKE": "postgres:dbname=lake host=127.0.0.1 port=1",
        "LOOPWATCH_LAKE_DATA": "/tmp/lake/",
        "LOOPWATCH_LAKE_COLLECTOR_ID": "c-1",
        "LOOPWATCH_LAKE_HOUSEKEEPING_INTERVAL_SECONDS": "30",
        "LOOPWATCH_LAKE_HOUSEKEEPING_RETENTION_DAYS": "14",
    }
    config = load_config(environ=env)
    keeper = housekeeper_for(config)
    assert keeper is not None
    assert keeper.interval_seconds == 30 and keeper.retention_days == 14
    assert keeper.lease is not None and keeper.lease.lease_seconds == 60
    assert keeper.holder.startswith("c-1/")
    off = {**env, "LOOPWATCH_LAKE_HOUSEKEEPING_ENABLED": "false"}
    assert housekeeper_for(load_config(environ=off)) is None
    assert housekeeper_for(load_config(environ={})) is None
    local = {**env, "LOOPWATCH_LAKE": "/tmp/lake/catalog.ducklake"}
    assert housekeeper_for(load_config(environ=local)) is None
    for name, bad in (("INTERVAL_SECONDS", "0"), ("RETENTION_DAYS", "-1")):
        with pytest.raises(ConfigError, match="lake_housekeeping"):
            load_config(environ={**env, f"LOOPWATCH_LAKE_HOUSEKEEPING_{name}": bad})


def test_merge_waits_for_the_shippers_lock(
    target: LakeTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge rewrites files a shipper's fold may be rewriting (UPDATE, DELETE of a
    folded fragment): committed in between, it put the fragment back (docs/lake.md,
    "Housekeeping"). So while a shipper holds the lock, the merge does not run."""
    import psycopg
    from loopwatch.collector.lake import housekeeping
    from loopwatch.collector.lake.ship import SHIP_LOCK_KEY

    now = time.time_ns()
    for batch in range(3):
        _insert_runs(target, [f"held-{batch}-{i}" for i in range(40)], now)
    before = _file_count(target, "steps")
    monkeypatch.setattr(housekeeping, "_SHIP_LOCK_TIMEOUT", "1s")
    with psycopg.connect(target.postgres_dsn, autocommit=True) as shipper:
        shipper.execute("SELECT pg_advisory_lock(%s)", (SHIP_LOCK_KEY,))
        keeper = Housekeeper(target, "waiting", interval_seconds=60)
        report = keeper.run_once()
    assert any(error.startswith("merge:") for error in report.errors), report
    assert report.files_merged == 0
    assert _file_count(target, "steps") == before
    report = keeper.run_once()  # the lock released: the same holder's next round merges
    assert report.worked and not report.errors, report
    assert report.files_merged >= 3, report
