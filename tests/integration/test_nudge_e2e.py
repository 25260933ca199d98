"""Issue 26 end to end: guarded runs with a nudge ladder, exported over OTLP/HTTP to a
real collector process, come out as the same nudges in its API, DuckDB file and
``/metrics`` (metrics equal events)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from loopwatch.instrumentation import NudgeText, Policy, Run
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation.testing import ConstantTool, drive, ignoring_model, obeying_model

from .services import _exporting, start_collector, tool_outcomes

pytestmark = pytest.mark.timeout(90)

AGENT = "nudge-e2e"
LADDER = Policy.build(repeat_limit=3, loop_response=["nudge", "stop"])


def _run(provider: object, run_id: str, model: object) -> Run:
    lookup = ConstantTool(name="lookup_order")
    with Run(
        AGENT, LADDER, tools={"lookup_order": lookup}, run_id=run_id, tracer_provider=provider
    ) as run:  # type: ignore[arg-type]
        drive(run, model)  # type: ignore[arg-type]
    return run


def test_nudges_reach_the_api_the_store_and_metrics_as_sent(tmp_path: Path) -> None:
    with start_collector(tmp_path) as collector:
        with _exporting(collector.otlp_url, None, "http/protobuf") as (provider, memory):
            ignored = ignoring_model("lookup_order", {"order_id": "A-1"})
            stopped = _run(provider, "ignored", ignored)
            obeyed = obeying_model("lookup_order", {"order_id": "A-1"})
            recovered = _run(provider, "obeyed", obeyed)
        spans = memory.get_finished_spans()

        # In process: the ignoring model was nudged once, then stopped; the obeying one
        # changed its call after the nudge and completed.
        assert stopped.outcome.stop.reason == "repeated_action"
        assert [n.result for n in stopped.outcome.nudges] == ["stopped"]
        assert isinstance(ignored.nudges[0], NudgeText)
        assert recovered.outcome.stop.reason == "completed"
        assert [n.result for n in recovered.outcome.nudges] == ["recovered"]
        nudged_spans = tool_outcomes(spans).get(("lookup_order", sc.OUTCOME_NUDGED), 0)
        assert nudged_spans == 2

        # The API lists each run's nudges as the stop span carried them.
        for run_id, result in (("ignored", "stopped"), ("obeyed", "recovered")):
            detail = collector.run(run_id)
            assert [(n["detector"], n["tool"], n["result"]) for n in detail["nudges"]] == [
                ("repeated_action", "lookup_order", result)
            ], detail

        # Metrics equal events.
        metrics = collector.metrics()
        assert (
            metrics.value(
                "loopwatch_nudges_total",
                agent=AGENT,
                tool="lookup_order",
                detector="repeated_action",
            )
            == nudged_spans
        )
        for result in ("stopped", "recovered"):
            assert (
                metrics.value(
                    "loopwatch_nudge_results_total",
                    agent=AGENT,
                    detector="repeated_action",
                    result=result,
                )
                == 1
            ), result
        assert (
            metrics.value(
                "loopwatch_tool_calls_total", agent=AGENT, tool="lookup_order", outcome="nudged"
            )
            == nudged_spans
        )
        assert collector.stop() == 0, collector.stderr_text()

    # The stopped run keeps its steps (every abnormal stop does), its nudged call marked; a
    # completed run keeps them only when sampled.
    with duckdb.connect(str(collector.db_path), read_only=True) as con:
        stored = con.execute(
            "SELECT run_id, loop_rung, loop_detector FROM steps WHERE loop_response = 'nudge'"
        ).fetchall()
    assert ("ignored", 1, "repeated_action") in stored
    assert len(stored) <= nudged_spans
