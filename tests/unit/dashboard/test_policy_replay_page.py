"""The Policy replay page through ``AppTest``, over the fed collector and its copied file.

The fed runs (:mod:`.scenarios`) went through the real instrumentation with their own
policies; the page replays their stored steps through the shipped replay default and a
seed profile and must show what ``loopwatch replay`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from loopwatch.dashboard.config import open_source
from loopwatch.dashboard.data import RunFilter
from loopwatch.replay.engine import (
    default_policy,
    load_policy_spec,
    replay,
    summarize,
)
from loopwatch.replay.importers.stored import trajectory_from_stored
from streamlit.testing.v1 import AppTest

from tests.integration.services import free_port

from .scenarios import DASHBOARD, LOOP_RUN, PAGES, Fed, empty_database

TIMEOUT = 60


def page(**query: str) -> AppTest:
    at = AppTest.from_file(str(PAGES / "policy_replay.py"), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def no_failure(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def summary(at: AppTest) -> dict[str, dict[str, str]]:
    """The side-by-side table as ``{figure: {policy: value}}``."""
    frame = at.dataframe[0].value
    return {row.pop("figure"): row for row in frame.to_dict("records")}


def runs(at: AppTest) -> Any:
    """The runs table by full run id (the page shows ids without their shared prefix)."""
    value = at.dataframe[1].value
    full = [unquote(u.split("run_id=", 1)[1]) for u in value["run"]]
    return value.assign(run_id=full).set_index("run_id")


@pytest.fixture(params=["api", "db"])
def fed_source(request: pytest.FixtureRequest, fed: Fed, use_source: Callable[..., None]) -> str:
    if request.param == "api":
        use_source(collector=fed.api_url)
    else:
        use_source(db=fed.db_copy)
    return str(request.param)


def test_two_policies_side_by_side(fed_source: str, fed: Fed) -> None:
    at = page(range="all")
    no_failure(at)
    table = summary(at)
    assert set(table["runs replayed"]) == {"replay-default", "investigate-readonly"}
    replayed = int(table["runs replayed"]["replay-default"])
    # Every run but the unsampled completed one has stored steps.
    assert replayed == len(fed.expected) - 1
    shown = runs(at)
    assert shown.loc[LOOP_RUN, "replay-default"] == "repeated_action @ 3"
    assert shown.loc["dash-repeat", "replay-default"] == "repeated_action @ 3"
    assert shown.loc["dash-cycle", "replay-default"].startswith("action_cycle @ ")
    # 95 stored calls (94 executed, the 95th blocked by the recording policy): all but
    # the first two are saved.
    assert shown.loc[LOOP_RUN, "calls saved (replay-default)"] == 95 - 2
    assert shown.loc[LOOP_RUN, "run"] == f"run?run_id={LOOP_RUN}"
    # investigate-readonly's 8-turn ceiling meets the 95-step loop as well.
    assert shown.loc[LOOP_RUN, "investigate-readonly"].startswith("repeated_action @ 3")
    metric_labels = {m.label for m in at.metric}
    assert "Stopped by replay-default only" in metric_labels
    # The figures that need a recorded loop or a successful run say so.
    assert any(c.value.startswith("Recorded loops: ") for c in at.caption)


def test_page_figures_equal_the_engine(fed_source: str, fed: Fed) -> None:
    """The page shows exactly what the engine reports for the same stored runs."""
    import os

    config_db = os.environ.get("LOOPWATCH_DASHBOARD_DB")
    src = open_source(
        collector_url=None if config_db else os.environ["LOOPWATCH_DASHBOARD_COLLECTOR"],
        db=config_db,
    )
    try:
        page_ = src.runs(RunFilter(sampled=True), limit=100)
        trajectories = []
        for row in page_.runs.to_dict("records"):
            data = src.run(str(row["run_id"]))
            assert data is not None
            trajectories.append(
                trajectory_from_stored(
                    str(row["run_id"]), data.step_records(), stop_reason=row["stop_reason"]
                )
            )
    finally:
        src.close()
    results = replay(trajectories, [default_policy(), *load_policy_spec("seed:change-small")])
    expected = {s.policy: s for s in summarize(results)}
    at = page(range="all", b="seed:change-small")
    no_failure(at)
    table = summary(at)
    for label, s in expected.items():
        assert table["stopped"][label] == str(s.stopped)
        assert table["tool calls saved"][label] == str(s.calls_saved)
        assert table["false stops"][label] == str(s.false_stops)
        for reason, count in s.stops_by_reason.items():
            assert table[f"stopped as {reason}"][label] == str(count)


def test_one_policy_and_a_stored_reason_filter(fed_source: str) -> None:
    at = page(range="all", b="none", reason="repeated_action")
    no_failure(at)
    assert list(summary(at)["runs replayed"]) == ["replay-default"]
    assert set(runs(at).index) == {"dash-repeat", LOOP_RUN}
    assert at.query_params["reason"] == "repeated_action"


def test_policy_from_a_path_and_a_bad_file(fed_source: str, tmp_path: Path) -> None:
    good = tmp_path / "mine.toml"
    good.write_text(
        '[profiles.lenient]\nversion = "1"\nrepeat_limit = 50\nmax_model_turns = 500\n'
        "max_tool_attempts = 500\nmax_tool_successes = 500\nno_progress_patience = 500\n",
        encoding="utf-8",
    )
    at = page(range="all", b="file path…")
    at.text_input(key="replay_b_path").set_value(str(good)).run()
    no_failure(at)
    shown = runs(at)
    assert shown.loc[LOOP_RUN, "lenient"] == "repeated_action @ 50"
    bad = tmp_path / "bad.toml"
    bad.write_text('[profiles.x]\nversion = "1"\nrepeat_limit = -2\n', encoding="utf-8")
    at.text_input(key="replay_b_path").set_value(str(bad)).run()
    assert not at.exception
    assert len(at.error) == 1
    message = at.error[0].value
    assert str(bad) in message and "profiles.x.repeat_limit" in message


def test_empty_store_and_unreachable_collector(
    use_source: Callable[..., None], tmp_path: Path
) -> None:
    use_source(db=empty_database(tmp_path / "empty.duckdb"))
    at = page(range="all")
    no_failure(at)
    assert any("replay needs the stored steps" in i.value for i in at.info)
    use_source(collector=f"http://127.0.0.1:{free_port()}")
    at = page()
    assert not at.exception
    assert len(at.error) == 1 and "Cannot reach the collector" in at.error[0].value


def test_router_lists_the_page(fed_source: str) -> None:
    at = AppTest.from_file(str(DASHBOARD / "app.py"), default_timeout=TIMEOUT).run()
    at.switch_page("views/policy_replay.py").run()
    no_failure(at)
    assert at.title[0].value == "Policy replay"


@pytest.mark.parametrize("kind", ["api", "db"])
def test_steps_of_many_runs_equal_each_runs_steps(fed: Fed, kind: str) -> None:
    """One read (the file) or parallel reads (the API) give each run's stored steps."""
    from loopwatch.dashboard.data import steps_of_runs

    src = open_source(
        collector_url=fed.api_url if kind == "api" else None,
        db=fed.db_copy if kind == "db" else None,
    )
    try:
        ids = src.runs(RunFilter(), limit=100).runs["run_id"].astype(str).tolist()
        found = steps_of_runs(src, [*ids, "no-such-run"])
        assert "no-such-run" not in found and LOOP_RUN in found
        for run_id in ids:
            detail = src.run(run_id)
            assert detail is not None
            expected = [] if detail.steps.empty else detail.step_records()
            got = found.get(run_id, [])
            assert [(r["step"], r["span_id"]) for r in got] == [
                (r["step"], r["span_id"]) for r in expected
            ], run_id
    finally:
        src.close()


def test_default_selection_is_stopped_runs_by_agent(fed_source: str, fed: Fed) -> None:
    at = page(range="all", b="none")
    no_failure(at)
    replayed = runs(at)
    assert "completed" not in set(replayed["recorded stop"])
    caption = "\n".join(c.value for c in at.caption)
    assert "run(s) selected, by agent:" in caption
    assert at.query_params.get("runs") is None  # the default, left out of the URL
