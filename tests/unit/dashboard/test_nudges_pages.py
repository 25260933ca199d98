"""The run view marks nudged and warned steps and lists the run's nudges; the Tools page
shows the nudge recovery rate per tool (issue 26). The store is a real collector's file,
fed with loopwatch spans that carry the response ladder's attributes (NUDGE.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from loopwatch.collector.config import load_config
from loopwatch.collector.service import Collector

from tests.unit.collector.test_nudges import _nudge, _nudged_run

from .test_pages import frame, no_failure, page, texts


@pytest.fixture
def nudged_db(tmp_path: Path, use_source: Callable[..., None]) -> str:
    path = tmp_path / "lw.duckdb"
    collector = Collector(load_config(environ={}, overrides={"store": {"db": str(path)}}))
    try:
        recovered = _nudge("recovered", tool="get_details_by_id")
        stopped = _nudge("stopped", tool="get_details_by_id")
        asyncio.run(collector.submit(_nudged_run("a", nudges=[recovered, stopped], dropped=1)))
        asyncio.run(collector.submit(_nudged_run("b", response="warn", nudges=[recovered])))
        runs = collector.store.reader().list_runs(limit=10).items
        nudged = next(r["run_id"] for r in runs if r["agent"] == "a")
    finally:
        collector.close()
    use_source(db=path)
    return str(nudged)


def test_run_view_marks_nudged_steps_and_lists_the_nudges(nudged_db: str) -> None:
    at = page("run_view", run_id=nudged_db)
    no_failure(at)
    text = texts(at)
    assert "Nudges" in text and "1 more not listed" in text
    marks = " ".join(str(m) for m in frame(at, 0)["marks"])
    assert "nudged (repeated_action, rung 1) at step 3" in marks
    nudges = next(
        at.dataframe[i].value
        for i in range(len(at.dataframe))
        if "result" in at.dataframe[i].value.columns
    )
    assert list(nudges["result"]) == ["recovered", "stopped"]


def test_tools_page_shows_the_nudge_recovery_rate(nudged_db: str) -> None:
    at = page("tools", range="all")
    no_failure(at)
    table = frame(at, 0)
    row = table[table["tool"] == "get_details_by_id"].iloc[0]
    assert (int(row["nudges"]), int(row["nudged"])) == (3, 1)
    assert row["nudge_recovery_rate"] == pytest.approx(2 / 3)
