"""The dashboard and ``/api/v1`` over the lake: the same reads as over a collector's file.

The lake is a real DuckLake (a local DuckDB catalog file and Parquet data; the PostgreSQL
catalog runs in tests/integration/test_lake_read.py), filled with the rows of the ``fed``
collector's file (real runs through the real instrumentation and collector), split over
two collector ids as two shippers would have written them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from loopwatch.collector.lake.connect import LakeTarget, connect_lake
from loopwatch.collector.store import aggregates
from loopwatch.dashboard import data, frames
from loopwatch.dashboard.config import SourceConfig, collectors_of, open_source
from loopwatch.dashboard.file_source import DuckDBSource
from loopwatch.dashboard.lake_source import LakeSource
from streamlit.testing.v1 import AppTest

from tests.integration.lake_fill import copy_to_lake
from tests.integration.services import free_port, poll_until

from .hostile import rendered
from .scenarios import LOOP_RUN, PAGES, Fed

HOST_B_RUNS = frozenset({LOOP_RUN, "dash-repeat", "dash-cycle"})
COLLECTOR_SQL = (
    "CASE WHEN run_id IN ("
    + ", ".join(f"'{r}'" for r in sorted(HOST_B_RUNS))
    + ") THEN 'host-b' ELSE 'host-a' END"
)
WINDOW = {"since_unix_nano": 0, "until_unix_nano": 2**62}
_API = (sys.executable, "-m", "loopwatch.cli", "api")


@pytest.fixture(scope="module")
def lake(fed: Fed, tmp_path_factory: pytest.TempPathFactory) -> LakeTarget:
    tmp = tmp_path_factory.mktemp("lake")
    for path in fed.db_copy.parent.glob("collector.duckdb*"):
        shutil.copy(path, tmp / path.name)
    target = LakeTarget(str(tmp / "catalog.ducklake"), str(tmp / "data") + "/")
    con = connect_lake(target)
    try:
        written = copy_to_lake(con, tmp / "collector.duckdb", collector_sql=COLLECTOR_SQL)
    finally:
        con.close()
    assert written["runs"] == len(fed.expected) and written["steps"] > 95
    return target


@pytest.fixture(scope="module")
def sources(lake: LakeTarget, fed: Fed) -> Iterator[tuple[LakeSource, DuckDBSource]]:
    from_lake = LakeSource(lake)
    from_file = DuckDBSource(fed.db_copy)
    yield from_lake, from_file
    from_lake.close()
    from_file.close()


@pytest.fixture
def use_lake(monkeypatch: pytest.MonkeyPatch, lake: LakeTarget) -> Callable[[], None]:
    def set_lake() -> None:
        for name in ("COLLECTOR", "DB", "TOKEN_FILE"):
            monkeypatch.delenv(f"LOOPWATCH_DASHBOARD_{name}", raising=False)
        monkeypatch.setenv("LOOPWATCH_DASHBOARD_LAKE", lake.catalog)
        monkeypatch.setenv("LOOPWATCH_DASHBOARD_LAKE_DATA", lake.data_path)

    return set_lake


def _by_run(page: data.RunsPage) -> dict[str, dict[str, object]]:
    columns = ["stop_reason", "agent", "steps", "tool_calls", "canary_detected", "sampled"]
    return page.runs.set_index("run_id")[columns].to_dict("index")


def test_the_lake_lists_what_the_file_lists(sources: tuple[LakeSource, DuckDBSource]) -> None:
    from_lake, from_file = sources
    lake_page = from_lake.runs(data.RunFilter(), limit=100)
    file_page = from_file.runs(data.RunFilter(), limit=100)
    assert _by_run(lake_page) == _by_run(file_page)
    assert list(lake_page.runs["run_id"]) == list(file_page.runs["run_id"])  # same order


def test_the_lake_run_view_matches_the_file(sources: tuple[LakeSource, DuckDBSource]) -> None:
    from_lake, from_file = sources
    in_lake, in_file = from_lake.run(LOOP_RUN), from_file.run(LOOP_RUN)
    assert in_lake is not None and in_file is not None
    assert in_lake.steps.equals(in_file.steps)  # NaN for NaN, column by column
    assert len(in_lake.steps) == 190  # a decision and a tool result per step
    assert in_lake.stop is not None and in_file.stop is not None
    assert in_lake.stop == in_file.stop and in_lake.evidence == in_file.evidence
    assert in_lake.run["collector_id"] == "host-b"
    assert in_lake.anomalies == []  # the lake keeps each run's primary stop only
    assert from_lake.run("no-such-run") is None


def test_the_lake_aggregates_match_the_file(sources: tuple[LakeSource, DuckDBSource]) -> None:
    from_lake, from_file = sources
    query = {**WINDOW, "bucket_seconds": 3600}
    lake_overview, file_overview = from_lake.overview(**query), from_file.overview(**query)
    assert lake_overview.total_stops == file_overview.total_stops == 12
    assert lake_overview.canary_runs == file_overview.canary_runs == 1
    assert from_lake.tools(**WINDOW).tools.equals(from_file.tools(**WINDOW).tools)


def test_the_collector_filter(sources: tuple[LakeSource, DuckDBSource], fed: Fed) -> None:
    from_lake, _ = sources
    assert from_lake.collectors() == ["host-a", "host-b"]
    assert collectors_of(from_lake) == ["host-a", "host-b"]
    page = from_lake.runs(data.RunFilter(collector="host-b"), limit=100)
    assert set(page.runs["run_id"]) == HOST_B_RUNS
    other = from_lake.runs(data.RunFilter(collector="host-a"), limit=100)
    assert set(other.runs["run_id"]) == set(fed.expected) - HOST_B_RUNS
    assert from_lake.runs(data.RunFilter(collector="nobody")).runs.empty
    reader = from_lake._reader
    by_b = aggregates.stats(reader, **WINDOW, collector="host-b")
    assert sum(r["stops"] for r in by_b.stops_by_reason) == len(HOST_B_RUNS)
    assert sum(r["runs"] for r in by_b.runs_by_agent) == len(HOST_B_RUNS)
    tools_b, _ = aggregates.tools(reader, **WINDOW, collector="host-b")
    tools_all, _ = aggregates.tools(reader, **WINDOW)
    assert 0 < sum(t["calls"] for t in tools_b) < sum(t["calls"] for t in tools_all)


def test_a_file_has_no_collector_filter(sources: tuple[LakeSource, DuckDBSource]) -> None:
    _, from_file = sources
    assert collectors_of(from_file) == []
    with pytest.raises(data.QueryFailed) as caught:
        from_file.runs(data.RunFilter(collector="host-a"))
    assert caught.value.code == "bad_parameter"


def test_a_missing_lake_is_one_clear_error(tmp_path: Path) -> None:
    target = LakeTarget(str(tmp_path / "none" / "catalog.ducklake"), str(tmp_path / "data/"))
    with pytest.raises(data.SourceUnavailable) as caught:
        LakeSource(target)
    assert caught.value.kind == "unreachable"
    assert "lake" in caught.value.message


def test_an_empty_lake_says_so(tmp_path: Path) -> None:
    target = LakeTarget(str(tmp_path / "catalog.ducklake"), str(tmp_path / "data") + "/")
    connect_lake(target).close()  # a DuckLake without loopwatch's tables
    with pytest.raises(data.SourceUnavailable) as caught:
        LakeSource(target)
    assert caught.value.kind == "not_loopwatch"


def test_source_config_names_the_lake_without_its_password() -> None:
    catalog = "postgres:dbname=lake host=127.0.0.1 password=hunter2-secret"
    config = SourceConfig.from_env(
        {"LOOPWATCH_DASHBOARD_LAKE": catalog, "LOOPWATCH_DASHBOARD_LAKE_DATA": "/d/"}
    )
    assert (config.lake, config.lake_data) == (catalog, "/d/")
    assert "hunter2" not in config.key and config.key.startswith("lake:")
    with pytest.raises(ValueError, match="both"):
        open_source(lake=catalog)
    with pytest.raises(ValueError, match="one of"):
        open_source(lake=catalog, lake_data="/d/", db="x.duckdb")


# ---------------------------------------------------------------------- pages


def _page(name: str, **query: str) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=60)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _as_shown(run_ids: set[str]) -> set[str]:
    """Run ids as the runs table shows them: by their distinguishing part."""
    cut = len(frames.id_prefix(sorted(run_ids)))
    return {run_id[cut:] for run_id in run_ids}


def test_stopped_runs_page_filters_by_collector(use_lake: Callable[[], None], fed: Fed) -> None:
    use_lake()
    at = _page("stopped_runs", range="all")
    _ok(at)
    assert set(at.dataframe[0].value["run_id"]) == _as_shown(set(fed.expected))
    select = at.selectbox(key="runs_collector")
    assert select.options == ["(any)", "host-a", "host-b"]
    select.set_value("host-b").run()
    _ok(at)
    assert set(at.dataframe[0].value["run_id"]) == _as_shown(HOST_B_RUNS)
    assert at.query_params["collector"] == "host-b"
    shared = _page("stopped_runs", range="all", collector="host-a")
    _ok(shared)
    assert set(shared.dataframe[0].value["run_id"]) == _as_shown(set(fed.expected) - HOST_B_RUNS)


def test_a_single_collector_source_shows_no_collector_filter(
    use_source: Callable[..., None], fed: Fed
) -> None:
    use_source(db=fed.db_copy)
    at = _page("stopped_runs", range="all")
    _ok(at)
    assert "runs_collector" not in {s.key for s in at.selectbox}


@pytest.mark.parametrize(
    ("name", "query"),
    [
        ("run_view", {"run_id": LOOP_RUN}),
        ("tools", {"range": "all"}),
        ("overview", {"range": "all"}),
        ("policy_replay", {"run_id": LOOP_RUN}),
    ],
)
def test_every_page_reads_the_lake(
    use_lake: Callable[[], None], name: str, query: dict[str, str]
) -> None:
    use_lake()
    at = _page(name, **query)
    _ok(at)
    if name == "run_view":
        facts = {rendered(m.label): rendered(m.value) for m in at.metric}
        assert facts["Stop reason"] == "repeated_action" and facts["Stopped at step"] == "95"
        assert "collector host-b" in rendered(at.caption[0].value).replace("`", "")
    if name == "tools":
        assert "get_details_by_id" in set(at.dataframe[0].value["tool"])


# ------------------------------------------------------------------ loopwatch api


@pytest.fixture(scope="module")
def lake_api(lake: LakeTarget) -> Iterator[str]:
    """``loopwatch api --lake`` as a real process; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [*_API, "--lake", lake.catalog, "--lake-data", lake.data_path, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read().decode() if proc.stdout else "exited")
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll_until(up, timeout_seconds=60, what="loopwatch api")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_loopwatch_api_serves_the_lake(lake_api: str, fed: Fed) -> None:
    runs = httpx.get(f"{lake_api}/api/v1/runs", params={"limit": 100}).json()["items"]
    assert {r["run_id"] for r in runs} == set(fed.expected)
    assert {r["collector_id"] for r in runs} == {"host-a", "host-b"}
    only_b = httpx.get(f"{lake_api}/api/v1/runs", params={"collector": "host-b"}).json()
    assert {r["run_id"] for r in only_b["items"]} == HOST_B_RUNS
    assert httpx.get(f"{lake_api}/api/v1/collectors").json() == {"items": ["host-a", "host-b"]}
    detail = httpx.get(f"{lake_api}/api/v1/runs/{LOOP_RUN}").json()
    assert len(detail["steps"]) == 190 and detail["stop_anomalies"] == []
    stats = httpx.get(f"{lake_api}/api/v1/stats", params={"since": 0, "collector": "host-b"}).json()
    assert sum(r["stops"] for r in stats["stops_by_reason"]) == len(HOST_B_RUNS)
    tools = httpx.get(f"{lake_api}/api/v1/tools", params={"since": 0, "collector": "host-a"})
    assert tools.status_code == 200 and tools.json()["items"]
    assert httpx.get(f"{lake_api}/metrics").status_code == 404  # each collector has its own


def test_a_collector_refuses_the_collector_filter(fed: Fed) -> None:
    answer = httpx.get(f"{fed.api_url}/api/v1/runs", params={"collector": "host-a"})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_parameter"
    assert httpx.get(f"{fed.api_url}/api/v1/collectors").json() == {"items": []}


def test_loopwatch_api_fails_fast(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_API, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )

    missing = run("--lake", str(tmp_path / "no" / "c.ducklake"), "--lake-data", str(tmp_path))
    assert missing.returncode == 2
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    exposed = run("--lake", "x.ducklake", "--lake-data", "/d/", "--host", "0.0.0.0")
    assert exposed.returncode == 2 and "--token-file" in exposed.stderr


def test_lake_reads_skip_older_shipments_within_the_margin(
    fed: Fed, tmp_path: Path, sources: tuple[LakeSource, DuckDBSource]
) -> None:
    """Reads bound ``shipped_unix_nano`` by the run's first-seen time less an hour: a run
    shipped by a collector whose clock was 30 min behind is still read whole."""
    from loopwatch.collector.store.reader import SHIPPING_MARGIN_NS

    for path in fed.db_copy.parent.glob("collector.duckdb*"):
        shutil.copy(path, tmp_path / path.name)
    _, from_file = sources
    file_runs = from_file.runs(data.RunFilter(), limit=100).runs
    earliest = int(
        from_file._reader._query("SELECT min(first_seen_unix_nano) AS s FROM runs", [])[0][0]["s"]
    )
    target = LakeTarget(str(tmp_path / "catalog.ducklake"), str(tmp_path / "data") + "/")
    con = connect_lake(target)
    try:
        copy_to_lake(con, tmp_path / "collector.duckdb", shipped_unix_nano=earliest - 1_800 * 10**9)
    finally:
        con.close()
    source = LakeSource(target)
    try:
        reader = source._reader
        assert reader.shipped_since(earliest) == (
            " AND shipped_unix_nano >= ?",
            [earliest - SHIPPING_MARGIN_NS],
        )
        since = int(file_runs["time"].min().value)  # the window starts at the oldest run
        page = source.runs(data.RunFilter(since_unix_nano=since), limit=100)
        assert set(page.runs["run_id"]) == set(file_runs["run_id"])
        in_lake, in_file = source.run(LOOP_RUN), from_file.run(LOOP_RUN)
        assert in_lake is not None and in_file is not None
        assert in_lake.steps.equals(in_file.steps) and in_lake.stop == in_file.stop
        assert in_lake.limits is not None and in_lake.limits.equals(in_file.limits)
    finally:
        source.close()


def test_lake_reads_are_time_limited_and_row_capped(lake: LakeTarget) -> None:
    from loopwatch.collector.errors import ReadTimeout

    capped = LakeSource(lake, max_rows=5, timeout_seconds=0.5)
    try:
        detail = capped.run(LOOP_RUN)
        assert detail is not None and detail.steps_truncated and len(detail.steps) == 5
        assert list(detail.steps["step"]) == [93, 94, 94, 95, 95]  # the last, up to the stop
        assert capped.runs(data.RunFilter(), limit=5).next_offset == 5
        with pytest.raises(ReadTimeout):  # a lake query past its limit is interrupted
            capped._reader._query("SELECT count(*) FROM runs, range(3000000000)", [])
    finally:
        capped.close()
