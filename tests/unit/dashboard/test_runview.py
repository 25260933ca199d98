"""The run view's pure logic and the charts, on literal rows shaped as the store returns them."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import pytest
from loopwatch.dashboard import charts, data, frames, runview
from loopwatch.instrumentation import StopReason

FP = "3b82185aa542d5d9d0432ef0fa91689916ea1195d38ae948ca197e2cd0276f73"
OBS = "27048b450be1315f60c027a6f9322971d4fe6ef367880b02b3970ed9bf7b7e6e"


def decision(
    step: int, kind: str = "tool", fingerprint: str | None = None, ssp: int = 0
) -> dict[str, Any]:
    return {
        "kind": "decision",
        "step": step,
        "decision_type": kind,
        "decision_fingerprint": fingerprint,
        "steps_since_progress": ssp,
        "input_tokens": 100,
        "output_tokens": 20,
    }


def tool(
    step: int,
    name: str = "get_details_by_id",
    *,
    fp: str = FP,
    outcome: str = "ok",
    progress: bool = False,
    ssp: int = 0,
    arguments: str | None = '{"id":7}',
    result: str | None = '{"id":7,"status":"unchanged"}',
    blocked_by: str | None = None,
) -> dict[str, Any]:
    return {
        "kind": "tool_result",
        "step": step,
        "tool": name,
        "outcome": outcome,
        "action_fingerprint": fp,
        "observation_digest": None if outcome == "blocked" else OBS,
        "progress": progress,
        "steps_since_progress": ssp,
        "arguments": arguments,
        "result": None if outcome == "blocked" else result,
        "blocked_by": blocked_by,
        "error_type": None,
        "failure_class": None,
    }


def loop_rows(n: int = 95) -> list[dict[str, Any]]:
    """The stored rows of an n-step identical-call loop stopped by repeated_action."""
    rows: list[dict[str, Any]] = []
    for step in range(1, n + 1):
        ssp = max(0, step - 2)
        rows.append(decision(step, ssp=ssp))
        if step < n:
            rows.append(tool(step, progress=step == 1, ssp=ssp))
        else:
            rows.append(tool(step, outcome="blocked", blocked_by="repeated_action", ssp=ssp))
    return rows


LOOP_STOP = {
    "reason": "repeated_action",
    "step": 95,
    "origin": "stop_span",
    "dimension": None,
    "limit_value": 95.0,
    "observed": 95.0,
    "basis": None,
    "message": "Stopped: the same action repeated with an unchanged result.",
    "steps_since_progress": 93,
    "usage_model_turns": 95,
    "usage_tool_attempts": 94,
    "usage_tool_successes": 94,
    "usage_tokens": 11400,
    "usage_cost_usd": 0.0,
    "usage_elapsed_seconds": 0.108,
}
LOOP_EVIDENCE = {
    "detector": "repeated_action",
    "tool": "get_details_by_id",
    "repetitions": 95,
    "step_indices": list(range(1, 96)),
    "fingerprint_previews": ["get_details_by_id#3b82185aa542"],
    "scope": "run",
    "detail": {"observation": "27048b450be1"},
}


def test_95_identical_calls_collapse_into_one_row_with_a_count() -> None:
    steps = runview.build_steps(loop_rows())
    assert [s.step for s in steps] == list(range(1, 96))
    groups = runview.collapse(steps)
    assert len(groups) == 1
    group = groups[0]
    assert group.collapsed and group.count == 95
    assert group.outcomes == {"blocked": 1, "ok": 94}
    assert group.title == "get_details_by_id ×95 · steps 1–95 · 1 blocked, 94 ok"
    table = runview.group_table(groups)
    assert table.to_dict("records") == [
        {
            "steps": "1–95",
            "action": "get_details_by_id",
            "count": 95,
            "outcomes": "1 blocked, 94 ok",
            "progress": 1,
            "marks": "",
        }
    ]


def test_the_last_n_steps_keep_a_long_repeat_whole() -> None:
    rows = [decision(1), tool(1, "search", fp="a" * 64, progress=True)]
    rows += [r for r in loop_rows(40) if r["step"] > 1]
    groups = runview.collapse(runview.build_steps(rows))
    assert [(g.label, g.count) for g in groups] == [("search", 1), ("get_details_by_id", 39)]
    window = runview.last_steps(groups, 5, stop_step=40)
    assert [(g.first_step, g.last_step) for g in window] == [(2, 40)]
    assert runview.last_steps(groups, 40, stop_step=40) == groups
    with pytest.raises(ValueError):
        runview.last_steps(groups, 0)


def test_distinct_actions_are_not_collapsed_and_the_window_counts_steps() -> None:
    rows = []
    for step in range(1, 31):
        rows += [decision(step), tool(step, "page", fp=f"{step:064x}", progress=True)]
    groups = runview.collapse(runview.build_steps(rows))
    assert len(groups) == 30 and not any(g.collapsed for g in groups)
    window = runview.last_steps(groups, runview.DEFAULT_LAST_STEPS)
    assert [g.first_step for g in window] == list(range(11, 31))


def test_non_tool_decisions_collapse_by_their_fingerprint() -> None:
    rows = [decision(i, "message", "e402") for i in (1, 2, 3)] + [decision(4, "message", "ffff")]
    groups = runview.collapse(runview.build_steps(rows))
    assert [(g.label, g.count) for g in groups] == [("(message)", 3), ("(message)", 1)]


@pytest.mark.parametrize(
    ("rows", "evidence", "expected"),
    [
        (loop_rows(), LOOP_EVIDENCE, (2, 1, "steps")),
        (loop_rows(), {"detail": {"last_progress_step": 2}}, (3, 2, "evidence")),
        (
            [decision(1, "message", "x"), decision(2, "message", "x", ssp=1)],
            {},
            (1, 0, "steps"),
        ),
        ([decision(1), tool(1, progress=True), decision(2), tool(2, progress=True)], {}, None),
        ([], {}, None),
        # A tau2 run (demo): tool progress last at step 14, but the guard's count says a
        # decision at step 20 was progress (0 steps since progress before step 21).
        (
            [decision(14, ssp=0), tool(14, progress=True, ssp=0)]
            + [decision(step, "message", "m", ssp=0) for step in range(15, 19)]
            + [decision(19, ssp=0), tool(19, progress=False, ssp=0)]
            + [decision(20, "message", "m", ssp=1)]
            + [decision(21, ssp=0), tool(21, outcome="blocked", ssp=0)],
            {},
            (21, 20, "steps"),
        ),
    ],
    ids=[
        "loop",
        "evidence wins",
        "never progressed",
        "still progressing",
        "no steps",
        "guard's count",
    ],
)
def test_progress_ceased(
    rows: list[dict[str, Any]],
    evidence: dict[str, Any],
    expected: tuple[int, int, str] | None,
) -> None:
    mark = runview.progress_ceased(runview.build_steps(rows), evidence)
    if expected is None:
        assert mark is None
    else:
        assert mark is not None
        assert (mark.step, mark.last_progress_step, mark.basis) == expected
        assert f"step {expected[0]}" in mark.text


def test_marks_name_the_ceased_and_stop_steps() -> None:
    steps = runview.build_steps(loop_rows())
    ceased = runview.progress_ceased(steps, LOOP_EVIDENCE)
    groups = runview.mark_groups(runview.collapse(steps), ceased, 95)
    assert groups[0].marks == ("progress ceased at step 2", "stopped at step 95")


def test_stop_card_of_a_repeat_stop() -> None:
    card = runview.stop_card(LOOP_STOP, LOOP_EVIDENCE)
    assert card is not None
    facts = dict(card.facts())
    assert facts["stop reason"] == "repeated_action"
    assert facts["repetitions"] == "95"
    assert facts["step indices"] == "1–95"
    assert facts["limit vs observed"] == "observed 95 = limit 95"
    assert facts["fingerprints"] == "get_details_by_id#3b82185aa542"
    assert facts["detail: observation"] == "27048b450be1"
    assert "scope" not in facts
    # Below the four metrics, the list leaves them out rather than repeat them.
    listed = dict(card.facts(headline=False))
    assert set(facts) - set(listed) == set(runview.HEADLINE_FACTS)
    assert listed["repetitions"] == "95"


def test_stop_card_of_a_budget_stop_and_a_cycle() -> None:
    budget = runview.stop_card(
        {
            "reason": "budget_exhausted",
            "step": 2,
            "dimension": "model_turns",
            "limit_value": 2.0,
            "observed": 3.0,
            "basis": "projected",
        },
        {"detector": "ceiling", "scope": "run"},
    )
    assert budget is not None
    assert budget.dimension == "model_turns"
    assert budget.limit_vs_observed == "observed 3 > limit 2 (projected)"
    assert (budget.crossing, budget.basis) == ("observed 3 > limit 2", "projected")
    cycle = runview.stop_card(
        {"reason": "action_cycle", "step": 4},
        {"matched_period": 2, "repetitions": 2, "step_indices": [1, 2, 3, 4], "scope": "parent"},
    )
    assert cycle is not None
    assert dict(cycle.facts())["matched period"] == "2"
    assert dict(cycle.facts())["scope"] == "parent"
    assert runview.stop_card(None, None) is None


@pytest.mark.parametrize(
    ("indices", "text"),
    [([], ""), ([3], "3"), ([1, 2, 3], "1–3"), ([5, 1, 2, 3, 7, 8], "1–3, 5, 7–8"), ([2, 2], "2")],
)
def test_compress_indices(indices: list[int], text: str) -> None:
    assert runview.compress_indices(indices) == text


def test_fold_keeps_the_whole_value() -> None:
    short = runview.fold('{"id":7}')
    assert (short.short, short.folded) == ('{"id":7}', False)
    assert short.full == '{\n  "id": 7\n}'
    long_value = '{"items": [' + ", ".join(f'"order-{i}"' for i in range(100)) + "]}"
    folded = runview.fold(long_value, 40)
    assert folded.folded and len(folded.short) == 40 and folded.short.endswith("…")
    assert '"order-99"' in folded.full
    assert runview.fold(None) == runview.Folded("", "", False)
    assert runview.fold("[REDACTED:canary] not json").full == "[REDACTED:canary] not json"
    with pytest.raises(ValueError):
        runview.fold("x", 1)


def test_sampling_notice_and_usage() -> None:
    run = {
        "sampled": False,
        "sample_rule": "completed_fraction",
        "steps": 2,
        "tool_calls": 1,
        "tool_errors": 0,
        "tool_blocked": 0,
        "tokens": 120,
    }
    notice = runview.sampling_notice(run, 0)
    assert notice is not None
    assert "not sampled (rule: completed_fraction)" in notice
    assert "2 steps, 1 tool calls (0 errors, 0 blocked), 120 tokens" in notice
    assert runview.sampling_notice({**run, "sampled": True}, 4) is None
    assert "not decided" in (runview.sampling_notice({**run, "sampled": None}, 0) or "")
    usage = dict(runview.usage_counters(LOOP_STOP, {}))
    assert usage == {
        "model turns": "95",
        "tool attempts": "94",
        "tool successes": "94",
        "tokens": "11400",
        "cost (USD)": "0.0000",
        "elapsed (s)": "0.108",
    }
    assert dict(runview.usage_counters(None, {"decisions": 3, "tokens": 10})) == {
        "model turns": "3",
        "tokens": "10",
    }


def test_progress_series_and_its_chart() -> None:
    steps = runview.build_steps(loop_rows())
    series = runview.progress_series(steps)
    assert series["step"].tolist() == list(range(1, 96))
    assert series["steps_since_progress"].iloc[-1] == 93
    chart = charts.progress_chart(series, ceased_step=2, stop_step=95)
    assert isinstance(chart, alt.LayerChart)
    spec = chart.to_dict()
    assert spec["description"] == charts.progress_text(series, ceased_step=2, stop_step=95)
    assert "Progress ceased at step 2" in spec["description"]
    assert charts.progress_text(series.iloc[0:0]).startswith("No steps-since-progress")


def test_a_steps_value_is_its_last_rows_and_the_curve_ends_on_the_stop() -> None:
    """A step's decision reports the count before its tool results, each result the count
    after it: progress at step 2 resets 1 to 0, and the chart showed the max (1) where
    the stop card said 0. A stop decided after its step (deadline) counts that step."""
    rows = [
        decision(1, ssp=0),
        tool(1, ssp=0),
        decision(2, ssp=1),
        tool(2, progress=True, ssp=0, fp="f" * 64),
    ]
    steps = runview.build_steps(rows)
    assert [s.steps_since_progress for s in steps] == [0, 0]
    card = runview.stop_card({"reason": "completed", "step": 2, "steps_since_progress": 0}, {})
    series = runview.progress_series(steps, card)
    assert series["steps_since_progress"].tolist() == [0, 0]
    assert runview.progress_series(steps)["steps_since_progress"].iloc[-1] == 0

    thinking = [decision(i, "message", f"fp{i}", ssp=i - 1) for i in (1, 2, 3)]
    stop = {"reason": "deadline_exceeded", "step": 3, "steps_since_progress": 3}
    series = runview.progress_series(runview.build_steps(thinking), runview.stop_card(stop, {}))
    assert series.to_dict("list") == {"step": [1, 2, 3], "steps_since_progress": [0, 1, 3]}
    assert runview.progress_series([], runview.stop_card(stop, {})).empty


def test_rows_from_a_dataframe_with_missing_values() -> None:
    frame = pd.DataFrame(loop_rows(3))
    steps = runview.build_steps(frame.to_dict("records"))
    assert [len(s.calls) for s in steps] == [1, 1, 1]
    assert steps[-1].calls[0].observation_digest is None
    assert steps[-1].calls[0].blocked_by == "repeated_action"


STOPS = pd.DataFrame(
    {
        "bucket": pd.to_datetime([0, 0, 3600 * 10**9], unit="ns", utc=True),
        "stop_reason": ["completed", "repeated_action", "repeated_action"],
        "stops": [1, 2, 3],
    }
)
LOOPS = pd.DataFrame(
    {
        "tool": ["lookup_order", "lookup_order", ""],
        "detector": ["repeated_action", "no_progress", "repeated_decision"],
        "stops": [2, 1, 1],
    }
)
BY_AGENT = pd.DataFrame(
    {
        "agent": ["support", "support", "billing"],
        "stop_reason": ["completed", "error", ""],
        "runs": [3, 2, 1],
    }
)


def test_closed_sets_come_from_the_stop_reasons() -> None:
    assert set(charts.REASON_COLORS) == set(StopReason) == set(data.STOP_REASONS)
    assert set(data.LOOP_DETECTORS) <= set(StopReason)
    assert len(set(charts.REASON_COLORS.values())) == len(StopReason)


def test_overview_charts_carry_their_text_equivalent() -> None:
    assert charts.stops_text(STOPS) == "6 stops: repeated_action 5, completed 1."
    table = charts.stops_table(STOPS)
    assert table["stop_reason"].tolist() == ["repeated_action", "completed"]
    assert table["share"].round(3).tolist() == [0.833, 0.167]
    spec = charts.stops_over_time_chart(STOPS, bucket_seconds=3600).to_dict()
    assert spec["description"] == charts.stops_text(STOPS)
    assert spec["encoding"]["color"]["scale"]["range"][0] == charts.REASON_COLORS["completed"]
    assert charts.loops_text(LOOPS) == (
        "4 loop detections over 2 tools: lookup_order 3 (repeated_action 2, no_progress 1); "
        "(no tool) 1 (repeated_decision 1)."
    )
    assert charts.loops_table(LOOPS)["total"].tolist() == [3, 1]
    assert charts.loops_by_tool_chart(LOOPS).to_dict()["description"] == charts.loops_text(LOOPS)
    assert charts.runs_by_agent_text(BY_AGENT) == (
        "2 agents: support 5 runs (2 abnormal), billing 1 run (0 abnormal)."
    )
    assert charts.runs_by_agent_chart(BY_AGENT).to_dict()["description"].startswith("2 agents")
    empty = STOPS.iloc[0:0]
    assert charts.stops_text(empty) == "No stops in this time range."
    assert charts.loops_text(LOOPS.iloc[0:0]) == "No loop detections in this time range."


def test_tool_calls_chart() -> None:
    tools = pd.DataFrame(
        {"tool": ["a", "b"], "calls": [10, 2], "ok": [8, 2], "errors": [1, 0], "blocked": [1, 0]}
    )
    text = charts.tool_calls_text(tools)
    assert (
        text
        == "2 tools, 12 calls: a 10 (8 ok, 1 errors, 1 blocked), b 2 (2 ok, 0 errors, 0 blocked)."
    )
    assert charts.tool_calls_chart(tools).to_dict()["description"] == text
    assert charts.tool_calls_text(tools, top=1) == (
        "2 tools, 12 calls: a 10 (8 ok, 1 errors, 1 blocked); 1 more tool, 2 calls."
    )
    many = pd.DataFrame({"tool": list("abcd"), "calls": [5, 4, 3, 1], "ok": [5, 4, 3, 1]}).assign(
        errors=0, blocked=0
    )
    assert charts.tool_calls_text(many, top=2).endswith("; 2 more tools, 4 calls.")
    # The chart's description names what it plots: the top bars, the rest summed up.
    assert charts.tool_calls_chart(many, top=2).to_dict()["description"] == (
        charts.tool_calls_text(many, top=2)
    )
    spec = charts.tool_calls_chart(many).to_dict()
    assert spec["height"] == {"step": 24}, "a band per bar, so no bar loses its label"


def test_stop_card_of_a_completed_run_observe_mode_would_have_stopped() -> None:
    """The would-be stop is shown with its step and tool; the real stop's evidence (a
    completed run has none to speak of) still drives the card and the progress mark."""
    stop = {
        "reason": "completed",
        "step": 6,
        "evidence": '{"scope":"run"}',
        "observe_reason": "repeated_action",
        "observe_step": 3,
        "observe_evidence": '{"detector":"repeated_action","tool":"lookup_order"}',
    }
    card = runview.stop_card(stop, {"scope": "run"})
    assert card is not None
    assert card.observe_reason == "repeated_action at step 3 on lookup_order"
    assert card.tool is None and card.detector is None
    rows = dict(card.facts())
    assert rows["observe mode would have stopped as"] == "repeated_action at step 3 on lookup_order"
    broken = runview.stop_card({**stop, "observe_evidence": "{not json", "observe_step": None}, {})
    assert broken is not None and broken.observe_reason == "repeated_action"


def test_anomaly_summary_names_both_kinds() -> None:
    dup, rep = {"kind": "duplicate_stop"}, {"kind": "replaced_stop"}
    assert runview.anomaly_summary([dup, dup]) == (
        "2 duplicate stop(s) arrived for this run; the first one is shown."
    )
    assert runview.anomaly_summary([rep]) == (
        "1 earlier stop report(s) were replaced by a stronger one; "
        "/metrics counted this run under the first."
    )
    both = runview.anomaly_summary([rep, dup])
    assert both.startswith("1 duplicate stop(s)") and "1 earlier stop report(s)" in both
    assert runview.anomaly_summary([{"kind": "future_kind"}]) == (
        "1 other stop report(s) arrived for this run."
    )


def test_table_height_fits_the_rows_up_to_a_cap() -> None:
    from loopwatch.dashboard import ui

    assert ui.table_height(0) == ui.table_height(1) == 35 * 2 + 3
    assert ui.table_height(10) == 35 * 11 + 3
    assert ui.table_height(500) == ui.table_height(25) == 35 * 26 + 3


def test_client_json_too_deep_for_the_parser_is_shown_as_text() -> None:
    """Evidence, observe evidence and arguments are client text; ``json.loads`` raises
    RecursionError (not ValueError) past about 1,000 levels, which failed the run view."""
    deep = "[" * 100_000 + "]" * 100_000
    folded = runview.fold(deep)
    assert folded.full == deep and folded.folded
    card = runview.stop_card(
        {"reason": "completed", "observe_reason": "repeated_action", "observe_evidence": deep},
        None,
    )
    assert card is not None and card.observe_reason == "repeated_action"
    assert frames.parse_evidence(deep) == {"raw": deep}
    assert frames.limits_frame(deep) is None


@pytest.mark.parametrize(
    ("slow_ends_last", "expected"), [(True, 0), (False, 1)], ids=["slow-last", "fast-last"]
)
def test_a_steps_figure_is_the_one_of_the_result_that_ended_last(
    slow_ends_last: bool, expected: int
) -> None:
    """Parallel calls: ``slow`` starts first and makes progress, ``fast`` starts second
    and makes none. Rows are stored in start order, but the guard counts each result as
    its call ends: the step's figure is that of the result that ended last (helper
    review of 2cfc793: the curve showed 1 where the guard's count was 0)."""
    slow = {
        **tool(3, "slow", progress=True, ssp=0),
        "end_unix_nano": 900 if slow_ends_last else 300,
    }
    fast = {**tool(3, "fast", ssp=1), "end_unix_nano": 500}
    [step] = [s for s in runview.build_steps([decision(3, ssp=1), slow, fast]) if s.step == 3]
    assert [c.tool for c in step.calls] == ["slow", "fast"]  # shown in start order
    assert step.steps_since_progress == expected


@pytest.mark.parametrize(
    "stored", ['{"path": "/data/report-\\udcff.csv"}', '{"q": "\\ud800 x"}', "raw \udcff text"]
)
def test_a_lone_surrogate_in_a_captured_value_is_shown_as_a_replacement(stored: str) -> None:
    """``json.dumps`` of a file name that ``os.fsdecode`` decoded from bad bytes escapes a
    lone surrogate; the JSON round trip made it a real one again, and ``st.code`` raised
    ``UnicodeEncodeError``, cutting the rest of the run view (helper review of ba3814e)."""
    folded = runview.fold(stored)
    for text in (folded.full, folded.short):
        text.encode("utf-8")  # no lone surrogate left
    assert "\ufffd" in folded.full
    from streamlit.testing.v1 import AppTest

    def page(value: str) -> None:
        import streamlit as st
        from loopwatch.dashboard import runview

        st.code(runview.fold(value).full, language="json")
        st.write("after the code block")

    at = AppTest.from_function(page, args=(stored,)).run(timeout=30)
    assert not at.exception
    assert [m.value for m in at.markdown] == ["after the code block"]


def test_a_long_curve_is_charted_from_at_most_a_thousand_points() -> None:
    """A 10,000-step run's curve is bucketed (issue 28, Speed): no peak hidden, the last
    point kept, the description still about every step; a short one is unchanged."""
    values = [i % 37 for i in range(10_000)]
    values[4_321] = 500  # a lone peak inside a bucket
    series = pd.DataFrame({"step": range(1, 10_001), "steps_since_progress": values})
    points = charts.chart_points(series)
    assert len(points) <= charts.PROGRESS_CHART_POINTS + 1
    assert points["steps_since_progress"].max() == 500
    assert points.iloc[-1].tolist() == [10_000, values[-1]]
    assert points["step"].is_monotonic_increasing
    spec = charts.progress_chart(series, stop_step=10_000).to_dict()
    assert spec["description"] == charts.progress_text(series, stop_step=10_000)
    assert "peak 500" in spec["description"]
    short = series.iloc[:50]
    assert charts.chart_points(short) is short
