"""Reading a lake on a real PostgreSQL catalog: two real collectors' runs, one view.

Two ``loopwatch collector`` processes receive real guarded runs (the instrumentation and
the OTLP/HTTP exporter); once stopped, each one's file is copied into one DuckLake whose
catalog is a real PostgreSQL (``tests/integration/postgres.py``), as their shippers would
have written it (``lake_fill.copy_to_lake``, with each collector's id). Then:

- the dashboard's :class:`LakeSource` lists both collectors' runs, each with its
  ``collector_id``, filters by collector, and reads a run as the collector's own file does;
- ``loopwatch api --lake postgres:...`` serves them over real HTTP, with ``collector=``;
- ``loopwatch dashboard --lake`` starts on the lake (its health endpoint answers, and
  its page footer names the lake without the catalog's password).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from loopwatch.collector.lake.connect import LakeTarget, connect_lake
from loopwatch.dashboard import data
from loopwatch.dashboard.file_source import DuckDBSource
from loopwatch.dashboard.lake_source import LakeSource

from .lake_fill import copy_to_lake
from .postgres import PostgresProcess, start_postgres
from .services import (
    CollectorProcess,
    emit_loopwatch_runs,
    free_port,
    loopwatch_command,
    poll_until,
    start_collector,
)

SCENARIOS = ("completed", "repeated_action", "budget_exhausted")
PASSWORD = "pw-3b9c-not-shown"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LakeTarget, dict]]:
    """A PostgreSQL-cataloged lake holding two collectors' runs; yields the target (its
    catalog carries a password, which trust auth ignores) and ``{collector: {run: reason}}``."""
    tmp = tmp_path_factory.mktemp("fleet")
    expected: dict[str, dict[str, str]] = {}
    files: dict[str, Path] = {}
    for name in ("host-a", "host-b"):
        folder = tmp / name
        folder.mkdir()
        collector = start_collector(folder)
        try:
            runs, _ = emit_loopwatch_runs(
                collector.otlp_url, SCENARIOS, agent=f"agent-{name}", run_id_prefix=name
            )

            def stored(c: CollectorProcess = collector, r: dict[str, str] = runs) -> bool:
                found = {x["run_id"]: x["stop_reason"] for x in c.runs()}
                return all(found.get(k) == v for k, v in r.items())

            poll_until(stored, timeout_seconds=30, what=f"{name}'s runs stored")
        finally:
            collector.stop()
        expected[name], files[name] = runs, collector.db_path
    with start_postgres(tmp) as pg:
        pg.create_database("lake")
        target = LakeTarget(f"{pg.catalog('lake')} password={PASSWORD}", str(tmp / "data") + "/")
        con = connect_lake(target)
        try:
            for name, path in files.items():
                copy_to_lake(con, path, collector_sql=f"'{name}'")
        finally:
            con.close()
        yield target, {"pg": pg, "files": files, **expected}


def test_the_lake_source_reads_both_collectors(fleet: tuple[LakeTarget, dict]) -> None:
    target, facts = fleet
    source = LakeSource(target)
    try:
        assert PASSWORD not in source.description and "***" in source.description
        assert source.collectors() == ["host-a", "host-b"]
        page = source.runs(data.RunFilter(), limit=100)
        want = {**facts["host-a"], **facts["host-b"]}
        assert dict(zip(page.runs["run_id"], page.runs["stop_reason"], strict=True)) == want
        only_b = source.runs(data.RunFilter(collector="host-b"), limit=100)
        assert set(only_b.runs["run_id"]) == set(facts["host-b"])
        looped = next(r for r, reason in facts["host-a"].items() if reason == "repeated_action")
        in_lake = source.run(looped)
        with contextlib.closing(DuckDBSource(facts["files"]["host-a"])) as own:
            in_file = own.run(looped)
        assert in_lake is not None and in_file is not None
        assert in_lake.run["collector_id"] == "host-a"
        assert in_lake.steps.equals(in_file.steps) and in_lake.stop == in_file.stop
        assert in_lake.tools.equals(in_file.tools)
    finally:
        source.close()


@contextlib.contextmanager
def _process(args: list[str], log: Path, ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            return httpx.get(ready_url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll_until(up, timeout_seconds=60, what=ready_url)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_loopwatch_api_on_a_postgres_lake(fleet: tuple[LakeTarget, dict], tmp_path: Path) -> None:
    target, facts = fleet
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [*loopwatch_command(), "api", "--lake", target.catalog, "--lake-data"]
    args += [target.data_path, "--port", str(port)]
    with _process(args, tmp_path / "api.log", f"{base}/healthz"):
        runs = httpx.get(f"{base}/api/v1/runs", params={"collector": "host-a"}).json()["items"]
        assert {r["run_id"] for r in runs} == set(facts["host-a"])
        assert {r["collector_id"] for r in runs} == {"host-a"}
        assert httpx.get(f"{base}/api/v1/collectors").json()["items"] == ["host-a", "host-b"]
        health = httpx.get(f"{base}/healthz").json()
        assert PASSWORD not in str(health)
    assert PASSWORD not in (tmp_path / "api.log").read_text()


def test_loopwatch_dashboard_on_a_postgres_lake(
    fleet: tuple[LakeTarget, dict], tmp_path: Path
) -> None:
    target, _ = fleet
    port = free_port()
    args = [*loopwatch_command(), "dashboard", "--lake", target.catalog, "--lake-data"]
    args += [target.data_path, "--port", str(port)]
    with _process(args, tmp_path / "dash.log", f"http://127.0.0.1:{port}/_stcore/health"):
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
    assert PASSWORD not in (tmp_path / "dash.log").read_text()


def test_a_stopped_catalog_is_one_clear_line(fleet: tuple[LakeTarget, dict]) -> None:
    target, facts = fleet
    pg: PostgresProcess = facts["pg"]
    pg.stop()
    try:
        args = [*loopwatch_command(), "api", "--lake", target.catalog, "--lake-data"]
        done = subprocess.run(
            [*args, target.data_path, "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert PASSWORD not in done.stderr
        with pytest.raises(data.SourceUnavailable) as caught:
            LakeSource(target)
        assert PASSWORD not in caught.value.message
    finally:
        pg.start()
