"""The data sources against a collector fed with real runs, and against its copied file.

Both sources must tell the same story about the same data; each failure mode gives a
typed error with a message for the page.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd
import pytest
from loopwatch.dashboard import cli, data, runview
from loopwatch.dashboard.api_source import ApiSource
from loopwatch.dashboard.config import SourceConfig, open_source
from loopwatch.dashboard.data import DataSource, QueryFailed, RunFilter, SourceUnavailable
from loopwatch.dashboard.file_source import DuckDBSource

from tests.integration.services import MetricSamples, free_port

from .scenarios import ALL_REASONS, LOOP_RUN, Fed, empty_database, serve_api

NS = 1_000_000_000
WINDOW = {"since_unix_nano": 0, "until_unix_nano": 2**62}


@pytest.fixture(params=["api", "db"])
def source(request: pytest.FixtureRequest, fed: Fed) -> Iterator[DataSource]:
    src: DataSource = (
        ApiSource(fed.api_url) if request.param == "api" else DuckDBSource(fed.db_copy)
    )
    yield src
    src.close()


def ids(src: DataSource, **filters: object) -> set[str]:
    page = src.runs(RunFilter(**filters), limit=100)
    return set(page.runs["run_id"])


def test_every_stop_reason_is_listed(source: DataSource, fed: Fed) -> None:
    page = source.runs(RunFilter(), limit=100)
    assert page.next_offset is None
    assert list(page.runs.columns) == list(data.RUN_COLUMNS)
    got = dict(zip(page.runs["run_id"], page.runs["stop_reason"], strict=True))
    assert got == fed.expected
    assert set(got.values()) == set(ALL_REASONS)
    assert page.runs["time"].is_monotonic_decreasing
    assert str(page.runs["time"].dt.tz) == "UTC"


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"stop_reason": "repeated_action"}, {"dash-repeat", LOOP_RUN}),
        (
            {"agent": "billing"},
            {"dash-budget", "dash-deadline", "dash-cycle", "dash-no-progress", "dash-error"},
        ),
        ({"tool": "get_details_by_id"}, {LOOP_RUN}),
        ({"canary": True}, {"dash-repeat"}),
        ({"sampled": False}, {"dash-completed"}),
        ({"stop_reason": "repeated_action", "agent": "billing"}, set()),
        ({"until_unix_nano": 1}, set()),
        ({"detector": "action_cycle"}, {"dash-cycle"}),
        ({"detector": "no_progress", "tool": "toggle_state"}, {"dash-no-progress"}),
    ],
    ids=[
        "reason",
        "agent",
        "tool",
        "canary",
        "not sampled",
        "no match",
        "time range",
        "detector",
        "detector+tool",
    ],
)
def test_filters(source: DataSource, filters: dict[str, object], expected: set[str]) -> None:
    assert ids(source, **filters) == expected


def test_paging(source: DataSource, fed: Fed) -> None:
    first = source.runs(RunFilter(), limit=5)
    assert len(first.runs) == 5 and first.next_offset == 5
    seen = list(first.runs["run_id"])
    offset = first.next_offset
    while offset is not None:
        page = source.runs(RunFilter(), limit=5, offset=offset)
        seen += list(page.runs["run_id"])
        offset = page.next_offset
    assert sorted(seen) == sorted(fed.expected)


def test_the_95_step_loop(source: DataSource) -> None:
    run = source.run(LOOP_RUN)
    assert run is not None
    assert run.stop is not None and run.stop["reason"] == "repeated_action"
    assert run.evidence["repetitions"] == 95 and run.evidence["tool"] == "get_details_by_id"
    assert len(run.steps) == 190 and not run.steps_truncated
    assert run.tools.to_dict("records") == [
        {"tool": "get_details_by_id", "outcome": "blocked", "calls": 1},
        {"tool": "get_details_by_id", "outcome": "ok", "calls": 94},
    ]
    assert run.run["sampled"] is True and run.run["agent"] == "support"


def test_unsampled_run_keeps_its_stop_and_counts(source: DataSource) -> None:
    run = source.run("dash-completed")
    assert run is not None
    assert run.steps.empty
    assert run.run["sampled"] is False and run.run["sample_rule"] == "completed_fraction"
    assert run.stop is not None and run.stop["reason"] == "completed"
    assert run.run["steps"] == 2 and run.run["tool_calls"] == 1


def test_unknown_run(source: DataSource) -> None:
    assert source.run("no-such-run") is None
    assert source.run("a/b?c=d") is None


def test_limits_come_with_their_source(fed: Fed) -> None:
    db = DuckDBSource(fed.db_copy)
    try:
        run = db.run(LOOP_RUN)
        assert run is not None and run.limits is not None
        limits = run.limits.set_index("limit").to_dict("index")
        assert limits["repeat_limit"] == {"value": "95", "source": "call"}
        assert limits["max_cost_usd"] == {"value": "10.0", "source": "default"}
        assert run.run["detector_version"]
    finally:
        db.close()
    api = ApiSource(fed.api_url)
    try:
        run = api.run(LOOP_RUN)
        assert run is not None and run.limits is not None
        assert run.limits.set_index("limit").to_dict("index") == limits
        assert run.run["detector_version"]
    finally:
        api.close()


def test_overview_agrees_between_sources(fed: Fed) -> None:
    api = ApiSource(fed.api_url)
    db = DuckDBSource(fed.db_copy)
    try:
        views = [s.overview(**WINDOW, bucket_seconds=86_400) for s in (api, db)]
        for view in views:
            assert view.total_stops == 12 and view.abnormal_stops == 11
            assert view.abnormal_ratio == pytest.approx(11 / 12)
            assert view.canary_runs == 1
            assert set(view.stops["stop_reason"]) == set(ALL_REASONS)
            assert view.note is None
        for frame in ("stops", "runs_by_agent", "loops_by_tool"):
            left, right = (getattr(v, frame) for v in views)
            key = [c for c in left.columns if c not in ("stops", "runs")]
            assert (
                left.sort_values(key)
                .reset_index(drop=True)
                .equals(right.sort_values(key).reset_index(drop=True))
            ), frame
        loops = views[1].loops_by_tool.set_index(["tool", "detector"])["stops"].to_dict()
        # By the tool the detection named (the metric's label): a cycle names one of its
        # two tools; no_progress and repeated_decision name none.
        cycle = [t for (t, d) in loops if d == "action_cycle"]
        assert len(cycle) == 1 and cycle[0] in ("open_ticket", "close_ticket")
        assert {k: v for k, v in loops.items() if k[1] != "action_cycle"} == {
            ("get_details_by_id", "repeated_action"): 1,
            ("lookup_order", "repeated_action"): 1,
            ("", "no_progress"): 1,
            ("", "repeated_decision"): 1,
        }
        billing = [s.overview(**WINDOW, bucket_seconds=3600, agent="billing") for s in (api, db)]
        for view in billing:
            assert view.total_stops == 5 and set(view.runs_by_agent["agent"]) == {"billing"}
        assert views[0].agents == views[1].agents == ["billing", "support"]
    finally:
        api.close()
        db.close()


def test_tools(source: DataSource) -> None:
    result = source.tools(**WINDOW)
    assert result.tools is not None and result.note is None
    rows = result.tools.set_index("tool").to_dict("index")
    # No nudge is no recovery rate (NaN), not 0 %.
    assert pd.isna(rows["get_details_by_id"].pop("nudge_recovery_rate"))
    assert rows["get_details_by_id"] == {
        "calls": 95,
        "ok": 94,
        "errors": 0,
        "blocked": 1,
        "nudged": 0,
        "runs": 1,
        "repeated_action_runs": 1,
        "nudges": 0,
        "nudges_recovered": 0,
        "repeated_action_rate": 1.0,
    }
    assert rows["lookup_order"]["runs"] == 4
    assert rows["lookup_order"]["repeated_action_runs"] == 1
    assert rows["lookup_order"]["repeated_action_rate"] == pytest.approx(0.25)
    assert int(result.loops["stops"].sum()) == 5
    assert list(data.looped_runs(source, "lookup_order", **WINDOW)["run_id"]) == ["dash-repeat"]
    looped = data.looped_runs(source, "get_details_by_id", **WINDOW)
    assert list(looped["run_id"]) == [LOOP_RUN]


def test_tools_agree_between_sources(fed: Fed) -> None:
    api = ApiSource(fed.api_url)
    db = DuckDBSource(fed.db_copy)
    try:
        left, right = (s.tools(**WINDOW) for s in (api, db))
        assert left.tools is not None and right.tools is not None
        assert left.tools.equals(right.tools)
        assert left.loops.equals(right.loops)
    finally:
        api.close()
        db.close()


def test_collector_without_the_tools_endpoint(fed: Fed) -> None:
    """An older collector (no ``/api/v1/tools``): loops still shown, the rest explained."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/tools":
            return httpx.Response(
                404, json={"error": {"status": 404, "code": "not_found", "message": "x"}}
            )
        return httpx.Response(
            200, json={"stops_by_reason": [], "loops_by_tool": [], "truncated": False}
        )

    src = ApiSource("http://collector.test", transport=httpx.MockTransport(answer))
    result = src.tools(**WINDOW)
    assert result.tools is None and result.note and "/api/v1/tools" in result.note


# ------------------------------------------------------------------ failures


def test_collector_unreachable() -> None:
    src = ApiSource(f"http://127.0.0.1:{free_port()}", timeout_seconds=2)
    with pytest.raises(SourceUnavailable) as caught:
        src.check()
    assert caught.value.kind == "unreachable"
    assert "Cannot reach the collector" in caught.value.message
    assert "loopwatch collector" in caught.value.message


def test_collector_wants_a_token(fed: Fed, tmp_path: Path) -> None:
    with serve_api(fed.db_copy, token="s3cret-token") as url:
        with pytest.raises(SourceUnavailable) as caught:
            ApiSource(url).check()
        assert caught.value.kind == "unauthorized"
        assert "s3cret" not in caught.value.message
        token_file = tmp_path / "token"
        token_file.write_text("s3cret-token\n")
        src = open_source(collector_url=url, token_file=str(token_file))
        assert len(src.runs(RunFilter(), limit=100).runs) == len(fed.expected)
        src.close()


def test_bad_parameter_is_a_query_error(fed: Fed) -> None:
    src = ApiSource(fed.api_url)
    with pytest.raises(QueryFailed) as caught:
        src.runs(RunFilter(), limit=0)
    assert caught.value.code == "bad_parameter" and caught.value.status == 400
    db = DuckDBSource(fed.db_copy)
    with pytest.raises(QueryFailed):
        db.runs(RunFilter(), limit=0)
    db.close()


def test_database_missing(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable) as caught:
        DuckDBSource(tmp_path / "nope.duckdb")
    assert caught.value.kind == "missing"
    assert "No database file" in caught.value.message


def test_database_locked_by_the_collector(fed: Fed) -> None:
    with pytest.raises(SourceUnavailable) as caught:
        DuckDBSource(fed.db_path)
    assert caught.value.kind == "locked"
    assert "--collector URL" in caught.value.message


def test_not_a_loopwatch_database(tmp_path: Path) -> None:
    import duckdb

    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    with pytest.raises(SourceUnavailable) as caught:
        DuckDBSource(other)
    assert caught.value.kind == "not_loopwatch"
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    with pytest.raises(SourceUnavailable) as caught:
        DuckDBSource(text)
    assert caught.value.kind == "unreadable"


def test_empty_database(tmp_path: Path) -> None:
    src = DuckDBSource(empty_database(tmp_path / "empty.duckdb"))
    try:
        assert src.runs(RunFilter(), limit=10).runs.empty
        view = src.overview(**WINDOW, bucket_seconds=3600)
        assert view.total_stops == 0 and view.abnormal_ratio is None
        assert src.tools(**WINDOW).tools is not None
    finally:
        src.close()


# ------------------------------------------------------------ configuration


def test_source_config_from_the_environment() -> None:
    config = SourceConfig.from_env(
        {"LOOPWATCH_DASHBOARD_DB": "/x.duckdb", "LOOPWATCH_DASHBOARD_TOKEN_FILE": ""}
    )
    assert config == SourceConfig(db="/x.duckdb")
    assert config.key == "db:/x.duckdb"
    assert SourceConfig.from_env({}).key == f"api:{data.DEFAULT_COLLECTOR_URL}:"
    with pytest.raises(ValueError):
        open_source(collector_url="http://x", db="/x.duckdb")
    with pytest.raises(ValueError):
        ApiSource("127.0.0.1:9464")
    with pytest.raises(SourceUnavailable):
        open_source(token_file="/nonexistent/token")


def test_run_dashboard_command_and_environment(tmp_path: Path) -> None:
    command = cli.build_command(host="127.0.0.1", port=8600)
    assert command[1:5] == ["-m", "streamlit", "run", str(cli.APP_PATH)]
    assert "--server.headless=true" in command and "--server.port=8600" in command
    env = cli.build_env(None, "rel.duckdb", base={"LOOPWATCH_DASHBOARD_COLLECTOR": "x", "A": "1"})
    assert env == {"A": "1", "LOOPWATCH_DASHBOARD_DB": str(Path("rel.duckdb").resolve())}
    assert (
        cli.build_env("http://c:1", None, base={})["LOOPWATCH_DASHBOARD_COLLECTOR"] == "http://c:1"
    )
    with pytest.raises(ValueError):
        cli.run_dashboard("http://c:1", "x.duckdb")
    with pytest.raises(ValueError):
        cli.run_dashboard("c:1", None)
    with pytest.raises(ValueError):
        cli.run_dashboard(None, None, port=0)


def test_api_source_uses_the_aggregates_the_lead_adds() -> None:
    """The contract asked of the collector: ``/api/v1/stats`` with ``agent``,
    ``runs_by_agent`` and ``canary_runs``; ``/api/v1/tools``. Served here by canned JSON."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/api/v1/stats":
            return httpx.Response(
                200,
                json={
                    "stops_by_reason": [
                        {"bucket_unix_nano": 0, "stop_reason": "no_progress", "stops": 4}
                    ],
                    "loops_by_tool": [{"tool": "t", "stop_reason": "no_progress", "stops": 4}],
                    "runs_by_agent": [{"agent": "a", "stop_reason": "no_progress", "runs": 4}],
                    "canary_runs": 2,
                    "truncated": False,
                },
            )
        if request.url.path == "/api/v1/tools":
            return httpx.Response(
                200,
                json={
                    "items": [
                        {
                            "tool": "t",
                            "calls": 10,
                            "ok": 6,
                            "errors": 2,
                            "blocked": 2,
                            "runs": 4,
                            "repeated_action_runs": 1,
                        }
                    ],
                    "truncated": False,
                },
            )
        return httpx.Response(
            404, json={"error": {"status": 404, "code": "not_found", "message": "x"}}
        )

    src = ApiSource("http://collector.test", transport=httpx.MockTransport(answer))
    view = src.overview(**WINDOW, bucket_seconds=60, agent="a")
    assert (view.total_stops, view.canary_runs, view.agents, view.note) == (4, 2, ["a"], None)
    assert seen[-1].url.params["agent"] == "a"
    assert all(r.url.path == "/api/v1/stats" for r in seen)
    tools = src.tools(**WINDOW)
    assert tools.tools is not None and tools.note is None
    assert tools.tools.iloc[0]["repeated_action_rate"] == 0.25


def test_loop_stops_by_tool_equal_the_loop_detection_metric(fed: Fed) -> None:
    """The Tools and Overview pages count loop stops under the same tool as
    ``loopwatch_loop_detections_total`` (the tool the detection named, ``none`` when it
    named none), so Grafana and the dashboard agree. They once counted under the run's
    most called tool (a new user's trial, 2026-12-01: no_progress was ``toggle_state``
    on the page and ``none`` on the metric)."""
    metric: dict[tuple[str, str], float] = {}
    samples = MetricSamples.parse(httpx.get(f"{fed.api_url}/metrics", timeout=10).text)
    for labels, value in samples.series("loopwatch_loop_detections_total").items():
        named = dict(labels)
        key = (named["tool"], named["detector"])
        metric[key] = metric.get(key, 0) + value
    api = ApiSource(fed.api_url)
    try:
        loops = api.overview(**WINDOW, bucket_seconds=3600).loops_by_tool
    finally:
        api.close()
    page = {
        (tool or "none", detector): float(stops)
        for tool, detector, stops in loops[["tool", "detector", "stops"]].itertuples(index=False)
    }
    assert page == {k: v for k, v in metric.items() if v}
    assert ("none", "no_progress") in page


def test_the_progress_curve_ends_on_the_stop_cards_figure(source: DataSource, fed: Fed) -> None:
    """The steps-since-progress chart's last point is the stop card's figure, for every
    stored run stopped at its last stored step (the chart took the step's largest row,
    1 where the card said 0)."""
    checked = 0
    for run_id in fed.expected:
        detail = source.run(run_id)
        assert detail is not None
        card = runview.stop_card(detail.stop, detail.evidence)
        series = runview.progress_series(runview.build_steps(detail.step_records()), card)
        if card is None or series.empty or int(series["step"].iloc[-1]) != card.step:
            continue
        assert int(series["steps_since_progress"].iloc[-1]) == card.steps_since_progress, run_id
        checked += 1
    assert checked >= 5


def test_the_run_view_knows_when_the_row_cap_cut_its_tool_counts(fed: Fed) -> None:
    """The loop run's two (tool, outcome) rows under a cap of 1: one row, said so."""
    src = DuckDBSource(fed.db_copy, max_rows=1)
    try:
        run = src.run(LOOP_RUN)
        assert run is not None and len(run.tools) == 1 and run.tools_truncated
        assert not run.anomalies_truncated
    finally:
        src.close()
    whole = DuckDBSource(fed.db_copy)
    try:
        run = whole.run(LOOP_RUN)
        assert run is not None and not run.tools_truncated
    finally:
        whole.close()


def test_only_the_file_source_imports_duckdb_and_the_collector() -> None:
    code = (
        "import sys\n"
        "from loopwatch.dashboard import api_source, config, data, frames\n"
        "loaded = [m for m in sys.modules if m == 'duckdb' or m.startswith('loopwatch.collector')]\n"
        "assert not loaded, loaded\n"
        "from loopwatch.dashboard import file_source\n"
        "assert 'duckdb' in sys.modules and 'loopwatch.collector' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
