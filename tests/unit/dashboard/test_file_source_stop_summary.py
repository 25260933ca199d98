"""The DuckDB file source lists what the read API lists: each run's stop summary.

A collector fed LangGraph's runaway and success under OpenInference (route A, the
recorded fixtures) stores one run that observe mode flagged as ``repeated_action`` on
``lookup_order`` and one clean run; read straight from the DuckDB file, the runs page
carries ``observe_reason`` and ``loop_tool`` as the API's ``/api/v1/runs`` items do.
"""

from __future__ import annotations

from pathlib import Path

from loopwatch.dashboard import data
from loopwatch.dashboard.file_source import DuckDBSource

from tests.unit.collector.test_pipeline import canary_collector, submit
from tests.unit.collector.test_route_a import load


def test_the_file_source_lists_observe_reason_and_loop_tool(tmp_path: Path) -> None:
    collector = canary_collector(tmp_path)
    try:
        for name in ("langgraph-openinference-runaway", "langgraph-openinference-success"):
            submit(collector, load(name))
    finally:
        collector.close()
    source = DuckDBSource(tmp_path / "lw.duckdb")
    try:
        source.check()
        frame = source.runs(data.RunFilter()).runs
        frame = frame.astype(object).where(frame.notna(), None)  # pandas reads None as NaN
        got = sorted(
            zip(frame["tool_calls"], frame["observe_reason"], frame["loop_tool"], strict=True),
            key=repr,
        )
        assert got == sorted([(6, "repeated_action", "lookup_order"), (1, None, None)], key=repr)
        looped = source.runs(data.RunFilter(loop_tool="lookup_order")).runs
        assert list(looped["observe_reason"]) == ["repeated_action"]
    finally:
        source.close()
