"""Route A on the spans seven agent frameworks really emit (issue 25, point 2).

The fixtures under ``tests/testdata/frameworks/`` are what each framework's usual tracer
(native, OpenInference, OpenLLMetry) exported for three scripted agents
(``scripts/record_framework_spans.py``): ``runaway`` calls ``lookup_order`` with the same
arguments 6 times, ``success`` calls it once, ``paginate`` calls ``list_orders`` with
pages 0..3; each agent is named ``support_bot``. Every fixture is mapped and judged by
the collector's map and detect stages, in one request and in one request per span (the
order spans end in, as a batching exporter sends them), and must give:

- exactly one run per invocation, named ``support_bot`` (never ``X.run``, a task text
  or a workflow wrapper), and one stop, except where the tracer reports no call at all
  (CrewAI): one run and no stop (a run with no step never counts a stop);
- the tool calls counted exactly, and one model turn per turn;
- the loop flagged by observe mode (``observe_reason``) on the runaway, and only there,
  for every tracer that sends tool arguments and results.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from loopwatch.collector.decode import decode_json
from loopwatch.collector.detect import DetectStage
from loopwatch.collector.map import MapStage
from loopwatch.collector.records import SpanBatch
from loopwatch.collector.rows import KIND_DECISION, KIND_TOOL_RESULT, MappedBatch
from starlette.testclient import TestClient

from .test_pipeline import canary_collector, submit, value

FIXTURES = Path(__file__).resolve().parents[2] / "testdata" / "frameworks"
AGENT = "support_bot"
TOOLS = {
    "runaway": {"lookup_order": 6},
    "success": {"lookup_order": 1},
    "paginate": {"list_orders": 4},
}
TURNS = {"runaway": 7, "success": 2, "paginate": 5}


@dataclass(frozen=True)
class Tracer:
    """What one framework's tracer lets route A see."""

    tool_spans: bool = True  # it sends tool spans
    content: bool = True  # with arguments and results
    model_spans: bool = True  # it sends model-call spans
    extra_tools: tuple[str, ...] = ()  # calls the framework makes as tools itself


TRACERS = {
    "pydantic_ai-native": Tracer(),
    "pydantic_ai-openinference": Tracer(),
    "openai_agents-openinference": Tracer(),
    "openai_agents-openllmetry": Tracer(),
    "langgraph-openinference": Tracer(),
    "langgraph-openllmetry": Tracer(),
    # smolagents' final_answer tool span is the answer, not a call.
    "smolagents-openinference": Tracer(),
    "llamaindex-openinference": Tracer(),
    # OpenLLMetry's LlamaIndex instrumentation sends tool calls as untyped task spans.
    "llamaindex-openllmetry": Tracer(tool_spans=False, content=False),
    # AutoGen's own execute_tool spans carry no arguments or results, and no model span.
    "autogen-native": Tracer(content=False, model_spans=False),
    "autogen-openinference": Tracer(model_spans=False),
    # Neither CrewAI tracer sends a model or tool span.
    "crewai-openinference": Tracer(tool_spans=False, content=False, model_spans=False),
    "crewai-openllmetry": Tracer(tool_spans=False, content=False, model_spans=False),
}
CASES = [(tracer, agent) for tracer in TRACERS for agent in TOOLS]


def load(name: str) -> SpanBatch:
    return decode_json((FIXTURES / f"{name}.json").read_bytes())


def one_by_one(batch: SpanBatch) -> list[SpanBatch]:
    """One request per span, in the order the spans ended (a batching exporter's)."""
    spans = sorted(batch.spans, key=lambda s: (s.end_unix_nano, s.span_id))
    return [SpanBatch(spans=[s]) for s in spans]


def route_a(requests: list[SpanBatch]) -> MappedBatch:
    """Map and judge ``requests`` with one map and one detect stage; all rows, merged
    (pending rows that were released later count once, as their final steps)."""
    stage, detect = MapStage(), DetectStage()
    total = MappedBatch()
    for request in requests:
        mapped = detect.process(stage.process(request))
        total.runs += mapped.runs
        total.steps += mapped.steps
        total.stops += mapped.stops
        total.pending += mapped.pending
        total.released |= mapped.released
    return total


def summary(mapped: MappedBatch) -> dict[str, object]:
    """What the collector makes of a trace, by run (the run id is the span the run was
    decided on, which depends on the order spans arrive in: left out)."""
    runs = {r.run_id: r.agent for r in mapped.runs}
    steps = {(s.trace_id, s.span_id): s for s in mapped.steps}
    return {
        "runs": [runs[run_id] for run_id in sorted(runs)],
        "stops": sorted({(runs.get(s.run_id), s.reason, s.observe_reason) for s in mapped.stops}),
        "tools": Counter(s.tool for s in steps.values() if s.kind == KIND_TOOL_RESULT),
        "turns": sum(1 for s in steps.values() if s.kind == KIND_DECISION),
        "step_runs": sorted({str(runs.get(s.run_id)) for s in steps.values()}),
        "held": {(r.trace_id, r.span_id) for r, _ in mapped.pending} - mapped.released,
    }


def test_every_recorded_fixture_is_in_the_table() -> None:
    recorded = {p.stem for p in FIXTURES.glob("*-*-*.json")}
    assert recorded == {f"{tracer}-{agent}" for tracer, agent in CASES}


@pytest.mark.parametrize(("tracer", "agent"), CASES, ids=[f"{t}-{a}" for t, a in CASES])
def test_one_run_exact_counts_and_the_loop_flagged(tracer: str, agent: str) -> None:
    seen = TRACERS[tracer]
    batch = load(f"{tracer}-{agent}")
    got = summary(route_a([batch]))
    assert got == summary(route_a(one_by_one(load(f"{tracer}-{agent}"))))
    assert got["runs"] == [AGENT]
    assert got["held"] == set()
    expected_tools: dict[str, int] = dict(TOOLS[agent]) if seen.tool_spans else {}
    for extra in seen.extra_tools:
        expected_tools[extra] = 1
    assert got["tools"] == Counter(expected_tools)
    assert got["turns"] == (TURNS[agent] if seen.model_spans else 0)
    if not (seen.tool_spans or seen.model_spans):
        assert got["stops"] == [] and got["step_runs"] == []
        return
    assert got["step_runs"] == [AGENT]  # every step in the one run
    looped = "repeated_action" if agent == "runaway" and seen.content else None
    assert got["stops"] == [(AGENT, "completed", looped)]


def test_a_runaway_under_openinference_langgraph_is_one_run_with_its_loop_tool() -> None:
    """The issue's worst case: LangGraph's model node "agent" is an OpenInference AGENT
    span per turn (7 here); they are graph nodes, not runs."""
    batch = load("langgraph-openinference-runaway")
    nodes = [s for s in batch.spans if s.attributes.get("openinference.span.kind") == "AGENT"]
    assert len(nodes) == 7
    mapped = route_a([batch])
    (stop,) = mapped.stops
    assert stop.observe_evidence is not None
    assert json.loads(stop.observe_evidence)["tool"] == "lookup_order"


def test_the_collector_counts_one_stop_and_the_list_says_why(tmp_path: Path) -> None:
    """Through the whole pipeline (redact, map, detect, store, metrics, API): LangGraph
    under OpenInference, the runaway then the success, in one request per span, count
    one ``completed`` stop each; CrewAI's run without a step counts none. The runs list
    says which run looped and on which tool."""
    collector = canary_collector(tmp_path)
    try:
        for name in ("langgraph-openinference-runaway", "langgraph-openinference-success"):
            for request in one_by_one(load(name)):
                submit(collector, request)
        submit(collector, load("crewai-openllmetry-runaway"))
        assert value(collector, "loopwatch_agent_stops_total") == 2
        assert (
            value(collector, "loopwatch_agent_stops_total", agent=AGENT, stop_reason="completed")
            == 2
        )
        assert value(collector, "loopwatch_tool_calls_total", tool="lookup_order") == 7
        detections = "loopwatch_loop_detections_total"
        assert value(collector, detections, tool="lookup_order", detector="repeated_action") == 1
        items = TestClient(collector.api_app()).get("/api/v1/runs").json()["items"]
        got = sorted(
            (
                (i["agent"], i["stop_reason"], i["tool_calls"], i["observe_reason"], i["loop_tool"])
                for i in items
            ),
            key=repr,
        )
        assert got == sorted(
            [
                (AGENT, "completed", 6, "repeated_action", "lookup_order"),
                (AGENT, "completed", 1, None, None),
                (AGENT, None, 0, None, None),
            ],
            key=repr,
        )
    finally:
        collector.close()
