"""Every page through ``AppTest``, against the fed collector and against its copied file.

Pages run on their own (``AppTest.from_file(page)``) and through the router; the source
comes from the environment, as ``loopwatch dashboard`` passes it. No page may show a
traceback: failures are ``st.error`` messages, empty stores say what to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import streamlit as st
from loopwatch.dashboard import cli, data
from streamlit.testing.v1 import AppTest

from tests.docs_examples import OBSERVE_RUN_ID, observe_example
from tests.integration.services import free_port, poll_until, start_collector

from .hostile import rendered
from .scenarios import ALL_REASONS, DASHBOARD, LOOP_RUN, PAGES, Fed, empty_database, open_expanders

PAGE_NAMES = ("overview", "stopped_runs", "run_view", "tools")
TIMEOUT = 30


def page(name: str, **query: str) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def no_failure(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def texts(at: AppTest) -> str:
    """Every caption, markdown, info and warning text of the page as a reader sees it
    (stored text is escaped Markdown), joined."""
    parts: list[str] = []
    for kind in ("caption", "markdown", "info", "warning", "subheader", "title"):
        parts += [rendered(str(e.value)) for e in getattr(at, kind)]
    return "\n".join(parts)


def metrics(at: AppTest) -> dict[str, str]:
    return {rendered(m.label): rendered(m.value) for m in at.metric}


def frame(at: AppTest, index: int = 0) -> Any:
    """The table's frame; in a runs table ``run_id`` is back to the full id (the page
    shows each id without the prefix the listed ids share; the link holds it whole)."""
    value = at.dataframe[index].value
    if {"run", "run_id"} <= set(value.columns):
        value = value.assign(run_id=[unquote(u.split("run_id=", 1)[1]) for u in value["run"]])
    return value


@pytest.fixture(params=["api", "db"])
def fed_source(request: pytest.FixtureRequest, fed: Fed, use_source: Callable[..., None]) -> str:
    if request.param == "api":
        use_source(collector=fed.api_url)
    else:
        use_source(db=fed.db_copy)
    return str(request.param)


# ------------------------------------------------------------------- overview


def test_overview(fed_source: str) -> None:
    at = page("overview", range="all")
    no_failure(at)
    assert metrics(at) == {
        "Stops": "12",
        "Abnormal-stop ratio": "92%",
        "Loop detections": "5",
        "Canary-flagged runs": "1",
    }
    captions = texts(at)
    for reason in ALL_REASONS:
        assert reason in captions
    assert "2 agents: support 7 runs (6 abnormal), billing 5 runs (5 abnormal)." in captions
    assert len(at.get("vega_lite_chart")) == 3
    assert at.query_params == {"range": "all"}


def test_overview_agent_filter_is_shareable(fed_source: str) -> None:
    at = page("overview", agent="billing")
    no_failure(at)
    assert metrics(at)["Stops"] == "5"
    assert at.selectbox(key="overview_agent").value == "billing"
    at.selectbox(key="overview_agent").set_value("support").run()
    assert metrics(at)["Stops"] == "7"
    assert at.query_params["agent"] == "support"


# --------------------------------------------------------------- stopped runs


def test_stopped_runs_table(fed_source: str, fed: Fed) -> None:
    at = page("stopped_runs")
    no_failure(at)
    table = frame(at)
    assert set(table["run_id"]) == set(fed.expected)
    # Shown without the prefix all listed ids share ("dash-"): rows read apart.
    assert set(at.dataframe[0].value["run_id"]) == {r.removeprefix("dash-") for r in fed.expected}
    assert "Run ids shown without their shared prefix" in texts(at)
    assert set(table["stop_reason"]) == set(ALL_REASONS)
    assert table["run"].str.startswith("run?run_id=").all()
    by_id = table.set_index("run_id")
    assert by_id.loc[LOOP_RUN, "steps"] == 95 and by_id.loc[LOOP_RUN, "tool_blocked"] == 1
    assert bool(by_id.loc["dash-repeat", "canary_detected"]) is True
    assert bool(by_id.loc["dash-completed", "sampled"]) is False
    assert by_id.loc[LOOP_RUN, "steps_since_progress"] == 93
    link = at.markdown[0].value
    assert link.startswith("[Open run view](run?run_id=")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"reason": "repeated_action"}, {"dash-repeat", LOOP_RUN}),
        ({"agent": "billing", "reason": "action_cycle"}, {"dash-cycle"}),
        ({"tool": "toggle_state"}, {"dash-no-progress"}),
        ({"canary": "yes"}, {"dash-repeat"}),
        ({"sampled": "no"}, {"dash-completed"}),
    ],
    ids=["reason", "agent+reason", "tool", "canary", "sampled"],
)
def test_stopped_runs_filters_from_the_url(
    fed_source: str, query: dict[str, str], expected: set[str]
) -> None:
    at = page("stopped_runs", **query)
    no_failure(at)
    assert set(frame(at)["run_id"]) == expected
    assert at.query_params == query


def test_stopped_runs_widgets_write_the_url_and_page(fed_source: str) -> None:
    at = page("stopped_runs", size="25")
    at.selectbox(key="runs_reason").set_value("no_progress").run()
    no_failure(at)
    assert list(frame(at)["run_id"]) == ["dash-no-progress"]
    assert at.query_params == {"reason": "no_progress", "size": "25"}
    at.selectbox(key="runs_reason").set_value("(any)").run()
    at.selectbox(key="runs_sort").set_value("most steps").run()
    assert frame(at)["run_id"].iloc[0] == LOOP_RUN
    assert at.query_params["sort"] == "most steps"


def test_stopped_runs_pages(fed_source: str, fed: Fed) -> None:
    at = page("stopped_runs", size="25")
    assert len(frame(at)) == 12
    assert at.button(key="next").disabled
    first = page("stopped_runs", offset="10", size="25")
    no_failure(first)
    assert len(frame(first)) == 2
    assert "Runs 11–12" in texts(first)
    assert first.query_params == {"offset": "10", "size": "25"}
    first.button(key="prev").click().run()
    no_failure(first)
    assert len(frame(first)) == 12
    assert first.query_params == {"size": "25"}


def test_stopped_runs_no_match(fed_source: str) -> None:
    at = page("stopped_runs", agent="nobody")
    no_failure(at)
    assert "No runs match these filters" in texts(at)


# ------------------------------------------------------------------- run view


def test_run_view_of_the_95_step_loop(fed_source: str) -> None:
    at = page("run_view", run_id=LOOP_RUN)
    no_failure(at)
    facts = metrics(at)
    assert facts["Stop reason"] == "repeated_action"
    assert facts["Stopped at step"] == "95"
    assert facts["Limit vs observed"] == "observed 95 = limit 95"
    assert facts["model turns"] == "95" and facts["tool attempts"] == "94"
    attempts = next(m for m in at.metric if m.label == "tool attempts")
    assert "blocked are not attempts" in (attempts.help or "")
    card = at.markdown[0].value + "\n" + at.markdown[1].value
    assert "**repetitions**: `95`" in card
    assert "**step indices**: `1–95`" in card
    assert "**tool**: `get_details_by_id`" in card
    assert "**stop reason**" not in card  # shown once, as a metric
    labels = [rendered(e.label) for e in at.expander]
    assert labels == [
        "get_details_by_id ×95 · steps 1–95 · 1 blocked, 94 ok · progress ceased at step 2"
        " · stopped at step 95",
        "Chart",
    ]
    steps = frame(at)
    assert steps.to_dict("records")[0]["count"] == 95
    assert "Progress ceased at step 2" in texts(at)
    assert not at.get("vega_lite_chart")  # drawn once its expander is opened
    page_text = texts(at)
    assert "95 stored step(s) in 1 row(s)" in page_text
    # The loop card shows the repeated call; the row's own details are sent only once
    # the row is opened (a tracked expander: the browser draws no hidden code blocks).
    assert not at.code
    shown = texts(at)
    assert '{"id":7}' in shown and '{"id":7,"status":"unchanged"}' in shown
    open_expanders(at)
    no_failure(at)
    assert '{\n  "id": 7\n}' in [c.value for c in at.code]
    assert len(at.get("vega_lite_chart")) == 1
    assert "95 consecutive steps with the same action; each step below." in texts(at)


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_run_view_shows_every_stop_reason(fed_source: str, fed: Fed, reason: str) -> None:
    for run_id in [r for r, why in fed.expected.items() if why == reason]:
        at = page("run_view", run_id=run_id)
        no_failure(at)
        assert metrics(at)["Stop reason"] == reason
        assert f"Stop: {reason}" in texts(at)


def test_run_view_budget_and_cycle_evidence(fed_source: str) -> None:
    budget = page("run_view", run_id="dash-budget")
    assert metrics(budget)["Limit vs observed (projected)"] == "observed 3 > limit 2"
    assert "**dimension**: `model_turns`" in budget.markdown[0].value + budget.markdown[1].value
    cycle = page("run_view", run_id="dash-cycle")
    card = "\n".join(m.value for m in cycle.markdown)
    assert "**matched period**: `2`" in card and "**repetitions**: `2`" in card
    assert "**step indices**: `" in card


def test_run_view_of_an_unsampled_run(fed_source: str) -> None:
    at = page("run_view", run_id="dash-completed")
    no_failure(at)
    notice = [w.value for w in at.warning]
    assert len(notice) == 1 and "not sampled (rule: completed_fraction)" in notice[0]
    assert "2 steps, 1 tool calls (0 errors, 0 blocked)" in notice[0]
    assert metrics(at)["Stop reason"] == "completed"
    assert not at.expander


def test_run_view_limits_and_canary(fed_source: str) -> None:
    at = open_expanders(page("run_view", run_id="dash-repeat"))
    no_failure(at)
    assert "canary flagged" in at.caption[0].value
    assert "[REDACTED" in "\n".join(c.value for c in at.code)
    limits = [d.value for d in at.dataframe if "limit" in d.value.columns]
    assert limits and "repeat_limit" in set(limits[0]["limit"])


def test_run_view_window_from_the_url(fed_source: str) -> None:
    at = page("run_view", run_id="dash-no-progress", last="2")
    no_failure(at)
    shown = frame(at)
    assert list(shown["steps"]) == ["1–6"]
    assert at.number_input(key="run_view_last").value == 2
    assert at.query_params == {"run_id": "dash-no-progress", "last": "2"}


def test_run_view_without_or_with_an_unknown_id(fed_source: str) -> None:
    empty = page("run_view")
    no_failure(empty)
    assert "No run selected" in texts(empty)
    unknown = page("run_view", run_id="not-a-run")
    no_failure(unknown)
    assert "No run with id not-a-run in this source" in texts(unknown)


# ---------------------------------------------------------------------- tools


def test_tools(fed_source: str) -> None:
    at = page("tools", range="all", tool="get_details_by_id")
    no_failure(at)
    page_text = texts(at)
    # no_progress and repeated_decision name no tool: "(no tool) 2" (as the metric).
    assert "5 loop detections over 4 tools: (no tool) 2" in page_text
    looped = frame(at, -1)
    assert list(looped["run_id"]) == [LOOP_RUN]
    table = frame(at, 0).set_index("tool")
    row = table.loc["get_details_by_id"]
    assert (row["calls"], row["blocked"], row["repeated_action"]) == (95, 1, 1)
    assert row["repeated_action_rate"] == 1.0
    # dash-no-progress called toggle_state and was stopped by no_progress, which names no
    # tool: it did not loop on toggle_state, so it is not listed (as the metric counts).
    at.selectbox(key="tools_tool").set_value("toggle_state").run()
    assert "No loop detection named toggle_state in this range" in texts(at)
    assert at.query_params == {"range": "all", "tool": "toggle_state"}


def test_tools_says_when_the_looped_runs_list_is_cut(
    fed_source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The looped-runs list is capped; the caption said "50 run(s)" when there were 615
    (an on-call trial, 2026-12-01)."""
    at = page("tools", range="all", tool="get_details_by_id")
    assert "1 run(s) whose loop detection named get_details_by_id" in texts(at)
    monkeypatch.setattr(data, "LOOPED_RUNS_LIMIT", 1)
    at = page("tools", range="all", tool="get_details_by_id")
    assert "The 1 newest runs whose loop detection named get_details_by_id" in texts(at)
    assert "the Stopped runs page lists them all" in texts(at)


# --------------------------------------------------------------------- router


def test_router_reaches_every_page(fed_source: str) -> None:
    at = AppTest.from_file(str(DASHBOARD / "app.py"), default_timeout=TIMEOUT).run()
    no_failure(at)
    assert at.title[0].value == "Overview"
    at.switch_page("views/stopped_runs.py").run()
    no_failure(at)
    assert at.title[0].value == "Stopped runs"
    links = at.get("page_link")
    assert [(p.proto.label, p.proto.page) for p in links] == [("Open run view", "run")]
    assert links[0].proto.query_string.startswith("run_id=")
    at.query_params["run_id"] = LOOP_RUN
    at.switch_page("views/run_view.py").run()
    no_failure(at)
    assert metrics(at)["Stop reason"] == "repeated_action"
    at.switch_page("views/tools.py").run()
    no_failure(at)
    assert at.title[0].value == "Tools"


# ------------------------------------------------------ failures, empty states


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_collector_unreachable(use_source: Callable[..., None], name: str) -> None:
    use_source(collector=f"http://127.0.0.1:{free_port()}")
    at = page(name, run_id="x")
    assert not at.exception
    assert len(at.error) == 1 and "Cannot reach the collector" in at.error[0].value


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_database_missing_or_locked(
    use_source: Callable[..., None], fed: Fed, tmp_path: Path, name: str
) -> None:
    use_source(db=tmp_path / "missing.duckdb")
    at = page(name)
    assert not at.exception
    assert "No database file" in at.error[0].value
    use_source(db=fed.db_path)
    at = page(name)
    assert not at.exception
    assert "open for writing by another process" in at.error[0].value


@pytest.mark.parametrize("name", ["overview", "stopped_runs", "tools"])
def test_empty_store_says_what_to_do(
    use_source: Callable[..., None], tmp_path: Path, name: str
) -> None:
    use_source(db=empty_database(tmp_path / "empty.duckdb"))
    at = page(name)
    no_failure(at)
    # The page cannot know the collector's --otlp-http address: it names the default as
    # the default, not as where this collector listens.
    assert (
        "the collector's OTLP endpoint, /v1/traces on its --otlp-http address "
        "(http://127.0.0.1:4318/v1/traces by default" in texts(at)
    )


def test_a_filter_the_collector_refuses_says_to_change_the_filter(
    fed: Fed, use_source: Callable[..., None]
) -> None:
    """A filter value past the collector's length cap is a 400 bad_parameter: narrowing
    the time range or retrying sends the same value again."""
    use_source(collector=fed.api_url)
    at = page("stopped_runs", agent="a" * 5000)
    assert not at.exception
    assert len(at.error) == 1
    assert "agent is longer than" in at.error[0].value
    hint = " ".join(c.value for c in at.caption)
    assert "shorten or clear the filter" in hint
    assert "Narrow the time range or retry" not in hint


# ------------------------------------------------------------ the real server


def test_loopwatch_dashboard_serves_the_app(fed: Fed) -> None:
    port = free_port()
    proc = cli.start_dashboard(None, str(fed.db_copy), port=port)
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"streamlit exited with {proc.returncode}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).text == "ok"
            except httpx.HTTPError:
                return False

        started = time.monotonic()
        poll_until(healthy, timeout_seconds=15, what="streamlit /_stcore/health")
        assert time.monotonic() - started < 15
        assert httpx.get(f"http://127.0.0.1:{port}/runs", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_run_view_of_a_third_party_run(tmp_path: Path, use_source: Callable[..., None]) -> None:
    """A run judged by the collector (observe mode, no loopwatch code in the agent) says
    so instead of naming a policy, and explains why it has no limits; from the API and
    from the file."""

    def check() -> None:
        at = page("run_view", run_id=OBSERVE_RUN_ID)
        no_failure(at)
        assert metrics(at)["Stop reason"] == "completed"
        caption = at.caption[0].value
        assert "judged by the collector in observe mode" in caption
        assert "policy" not in caption
        shown = texts(at)
        assert "A third-party agent sends no limits" in shown
        assert "observe mode would have stopped as" in "\n".join(m.value for m in at.markdown)

    with start_collector(tmp_path) as collector:
        sent = httpx.post(collector.otlp_url, json=observe_example(5), timeout=10)
        assert sent.status_code == 200, sent.text
        poll_until(
            lambda: any(
                r["run_id"] == OBSERVE_RUN_ID and r["stop_reason"] for r in collector.runs()
            ),
            timeout_seconds=20,
            what="the observe-mode run stored with its stop",
        )
        use_source(collector=collector.http_url)
        check()
    st.cache_data.clear()
    use_source(db=collector.db_path)
    check()
