"""Metrics: DESIGN section 7 names and labels, bounded label values."""

from __future__ import annotations

import pytest
from loopwatch.collector.metrics import (
    DETECTORS,
    METRIC_NAMES,
    NO_TOOL,
    OTHER,
    LoopwatchMetrics,
    RecentAgents,
)
from loopwatch.collector.rows import (
    KIND_TOOL_RESULT,
    SOURCE_GENAI,
    STOP_ORIGIN_INFERRED,
    UNKNOWN_AGENT,
    MappedBatch,
    RunRow,
    StepRow,
    StopRow,
)
from loopwatch.instrumentation import StopReason
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families


def scrape(m: LoopwatchMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(m)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(m.exposition(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_every_design_metric_is_exported_with_its_labels() -> None:
    m = LoopwatchMetrics(queue_depth=lambda: 7)
    m.record_stop("support", "repeated_action", steps=3, steps_since_progress=2)
    m.record_tool_call("support", "lookup", "blocked")
    m.record_detection("support", "lookup", "repeated_action")
    m.record_loop_response("support", "lookup", "repeated_action", "nudge")
    m.record_loop_response("support", "lookup", "repeated_action", "warn")
    m.record_nudge_results("support", [("repeated_action", "recovered")])
    m.record_canaries({"attribute": 2})
    m.record_redactions({"jwt": 1})
    m.spans_received("http_protobuf", 10)
    m.spans_rejected("invalid_id", 1)
    m.observe_commit(0.004)
    samples = scrape(m)
    names = set(samples)
    for metric in METRIC_NAMES:
        assert any(n == metric or n.startswith(metric + "_") for n in names), metric
    stops = {labels["stop_reason"]: v for labels, v in samples["loopwatch_agent_stops_total"]}
    # Every reason of a seen agent is exported, at 0 until its first stop (increase() of a
    # series that appears at 5 is 0: a burst would raise no alert).
    assert stops == {reason.value: 0.0 for reason in StopReason} | {"repeated_action": 1.0}
    detections = {
        (labels["tool"], labels["detector"]): v
        for labels, v in samples["loopwatch_loop_detections_total"]
    }
    assert detections == {
        ("lookup", "repeated_action"): 1.0,
        ("lookup", "action_cycle"): 0.0,
        ("none", "repeated_decision"): 0.0,
        ("none", "no_progress"): 0.0,
    }
    assert ({"agent": "support", "tool": "lookup", "outcome": "blocked"}, 1.0) in samples[
        "loopwatch_tool_calls_total"
    ]
    assert samples["loopwatch_collector_queue_depth"] == [({}, 7.0)]
    buckets = {s[0]["le"]: s[1] for s in samples["loopwatch_agent_steps_since_progress_bucket"]}
    assert buckets["1"] == 0 and buckets["2"] == 1 and buckets["+Inf"] == 1
    canaries = {s[0]["location"]: s[1] for s in samples["loopwatch_canary_detections_total"]}
    assert canaries == {"attribute": 2, "event": 0, "name": 0, "resource": 0, "status": 0}


def test_label_values_are_bounded() -> None:
    m = LoopwatchMetrics(top_n_agents=3, top_n_tools=5)
    for i in range(10_000):
        m.record_tool_call(f"agent-{i}-" + "é" * 300, f"tool-{i}", "ok")
    samples = scrape(m)["loopwatch_tool_calls_total"]
    agents = {labels["agent"] for labels, _ in samples}
    tools = {labels["tool"] for labels, _ in samples}
    assert len(agents) == 4 and OTHER in agents and len(tools) == 6
    assert all(len(a) <= 128 for a in agents)
    assert sum(v for _, v in samples) == 10_000


def test_a_detection_naming_no_tool_keeps_the_none_label_past_the_top_n() -> None:
    # "none" is outside the tool top-N: once top_n_tools names are admitted a
    # no_progress detection still has the series the dashboards and runbooks read.
    m = LoopwatchMetrics(top_n_agents=5, top_n_tools=2)
    for tool in ("search", "fetch", "third"):
        m.record_tool_call("a", tool, "ok")
    m.record_detection("a", None, "no_progress")
    m.record_detection("a", "", "repeated_decision")
    m.record_detection("a", "", "no_progress", 2)
    samples = {
        (labels["tool"], labels["detector"]): v
        for labels, v in scrape(m)["loopwatch_loop_detections_total"]
        if v
    }
    assert samples == {(NO_TOOL, "no_progress"): 3, (NO_TOOL, "repeated_decision"): 1}
    assert m.tools("another") == OTHER  # the bound is still full of real tool names


def test_unknown_closed_set_values_do_not_create_series() -> None:
    m = LoopwatchMetrics()
    m.record_stop("a", "made_up_reason", steps=1, steps_since_progress=0)
    m.record_detection("a", "t", "not_a_detector")
    m.record_tool_call("a", "t", "weird")
    samples = scrape(m)
    stops = {s[0]["stop_reason"]: s[1] for s in samples["loopwatch_agent_stops_total"]}
    assert set(stops) == {r.value for r in StopReason} and stops["error"] == 1
    detectors = {s[0]["detector"] for s in samples["loopwatch_loop_detections_total"]}
    assert detectors == set(DETECTORS)  # the zero series only
    assert sum(s[1] for s in samples["loopwatch_loop_detections_total"]) == 0
    assert samples["loopwatch_tool_calls_total"][0][0]["outcome"] == "error"


def test_ladder_metrics_have_bounded_labels_and_results_start_at_zero() -> None:
    m = LoopwatchMetrics(top_n_agents=1, top_n_tools=1)
    m.record_loop_response("a", "t", "repeated_action", "nudge")
    m.record_loop_response("b", "u", "made-up", "nudge")
    m.record_loop_response("a", "t", "action_cycle", "warn", 2)
    m.record_loop_response("a", "t", "action_cycle", "stop")  # not a tool-span rung
    m.record_nudge_results("a", [("repeated_action", "stopped"), ("x", "??"), ("x", "ended")])
    samples = scrape(m)

    def by_tool(name: str) -> dict[tuple[str, str, str], float]:
        return {(x["agent"], x["tool"], x["detector"]): v for x, v in samples[name]}

    nudges = by_tool("loopwatch_nudges_total")
    assert nudges == {("a", "t", "repeated_action"): 1, (OTHER, OTHER, OTHER): 1}
    warnings = by_tool("loopwatch_loop_warnings_total")
    assert warnings == {("a", "t", "action_cycle"): 2}
    results = {
        (lbl["detector"], lbl["result"]): v for lbl, v in samples["loopwatch_nudge_results_total"]
    }
    assert results == {
        ("repeated_action", "recovered"): 0,
        ("repeated_action", "stopped"): 1,
        ("repeated_action", "ended"): 0,
        (OTHER, "recovered"): 0,
        (OTHER, "stopped"): 0,
        (OTHER, "ended"): 1,
    }


# ---------------------------------------------------------------- RecentAgents


def _run(run_id: str, agent: str | None) -> RunRow:
    return RunRow(run_id, "ab" * 16, "cd" * 8, SOURCE_GENAI, True, agent=agent)


def _tool(run_id: str, agent: str | None = None) -> StepRow:
    return StepRow(
        trace_id="ab" * 16,
        span_id="ef" * 8,
        run_id=run_id,
        source=SOURCE_GENAI,
        kind=KIND_TOOL_RESULT,
        step=1,
        start_unix_nano=1,
        end_unix_nano=2,
        agent=agent,
    )


def test_rows_without_an_agent_take_their_runs_last_agent() -> None:
    agents = RecentAgents()
    earlier = MappedBatch()
    earlier.runs += [_run("r1", "planner"), _run("r2", None)]
    agents.label(earlier)
    batch = MappedBatch()
    batch.runs.append(_run("r3", "coder"))
    batch.runs.append(_run("r1", "replanner"))  # the last agent seen wins
    batch.steps += [_tool("r1"), _tool("r2"), _tool("r3"), _tool("r1", "own")]
    batch.pending.append((_tool("r3"), "parent"))
    batch.stops.append(
        StopRow(
            trace_id="ab" * 16,
            span_id="12" * 8,
            run_id="r2",
            source=SOURCE_GENAI,
            origin=STOP_ORIGIN_INFERRED,
            reason="completed",
            time_unix_nano=1,
        )
    )
    agents.label(batch)
    assert [s.agent for s in batch.steps] == ["replanner", UNKNOWN_AGENT, "coder", "own"]
    assert batch.pending[0][0].agent == "coder"
    assert batch.stops[0].agent == UNKNOWN_AGENT


@pytest.mark.parametrize("generation", [1, 3, 7])
def test_the_last_generation_of_runs_is_always_known_and_at_most_two_held(
    generation: int,
) -> None:
    agents = RecentAgents(generation)
    for n in range(1, 5 * generation + 2):
        agents.remember([_run(f"run-{n}", f"agent-{n % 4}")])
        assert len(agents) <= 2 * generation
        for back in range(min(n, generation)):
            assert agents.get(f"run-{n - back}") == f"agent-{(n - back) % 4}"
    assert agents.get("run-1") == UNKNOWN_AGENT  # long rotated out


def test_agent_names_are_held_once() -> None:
    agents = RecentAgents()
    # Two equal names built at run time are two objects, as two unpickled batches bring.
    names = ["".join(["plan", "ner"]) for _ in range(2)]
    assert names[0] is not names[1]
    agents.remember([_run("a", names[0]), _run("b", names[1])])
    assert agents.get("a") is agents.get("b")


def test_a_generation_holds_at_least_one_run() -> None:
    with pytest.raises(ValueError, match="generation must be >= 1"):
        RecentAgents(0)
