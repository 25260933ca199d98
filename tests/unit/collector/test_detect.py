"""Server-side detection for third-party GenAI/OpenInference spans (observe mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loopwatch.collector.decode import decode_json
from loopwatch.collector.detect import DetectStage
from loopwatch.collector.events import MapStage
from loopwatch.collector.records import SpanBatch, SpanRecord

TRACE = "5b8efff798038103d269b633813fc60c"


def span(
    span_id: str, name: str, attrs: dict, parent: str = "", start: int = 0, status: int = 0
) -> SpanRecord:
    return SpanRecord(TRACE, span_id, parent, name, 1, start, start + 10, attrs, status_code=status)


def genai_trace(
    results: list[dict], args: dict | None = None, openinference: bool = False
) -> list[SpanRecord]:
    root = "a" * 16
    spans = []
    for i, result in enumerate(results):
        sid = f"{i + 1:016x}"
        if openinference:
            attrs = {
                "openinference.span.kind": "TOOL",
                "tool.name": "lookup_order",
                "input.value": json.dumps(args or {"order_id": "A-1"}),
                "output.value": json.dumps(result),
            }
        else:
            attrs = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup_order",
                "gen_ai.tool.call.arguments": json.dumps(args or {"order_id": "A-1"}),
                "gen_ai.tool.call.result": json.dumps(result),
            }
        spans.append(
            span(sid, "execute_tool lookup_order", attrs, parent=root, start=(i + 1) * 100)
        )
    agent_attrs = (
        {"openinference.span.kind": "AGENT"}
        if openinference
        else {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"}
    )
    spans.append(span(root, "invoke_agent triage", agent_attrs, start=0))
    return spans


@pytest.mark.parametrize("openinference", [False, True])
def test_identical_third_party_calls_are_detected(openinference: bool) -> None:
    mapped = MapStage().process(
        SpanBatch(genai_trace([{"status": "pending"}] * 5, openinference=openinference))
    )
    stage = DetectStage()
    stage.process(mapped)
    tools = [s for s in mapped.steps if s.kind == "tool_result"]
    assert len(tools) == 5 and all(len(s.action_fingerprint or "") == 64 for s in tools)
    assert (
        len({s.action_fingerprint for s in tools}) == 1
        and len({s.observation_digest for s in tools}) == 1
    )
    assert [s.progress for s in tools] == [True, False, False, False, False]
    stop = next(s for s in mapped.stops if s.stop_inferred)
    assert stop.reason == "completed", "the agent was not stopped; the record says what happened"
    assert stop.observe_reason == "repeated_action" and stop.observe_step == 3
    assert json.loads(stop.observe_evidence or "{}")["tool"] == "lookup_order"
    assert [d.detector for d in stage.detections] == ["repeated_action"]


def test_changing_results_are_not_a_loop() -> None:
    mapped = MapStage().process(SpanBatch(genai_trace([{"page": i} for i in range(5)])))
    DetectStage().process(mapped)
    stop = next(s for s in mapped.stops if s.stop_inferred)
    assert stop.observe_reason is None


def test_steps_split_across_batches_stay_one_run() -> None:
    spans = genai_trace([{"v": 1}] * 4)
    mapper, stage = MapStage(), DetectStage()
    first = mapper.process(SpanBatch(spans[:2]))
    stage.process(first)
    second = mapper.process(SpanBatch(spans[2:]))
    stage.process(second)
    stop = next(s for s in second.stops if s.stop_inferred)
    assert stop.observe_reason == "repeated_action"


def test_detector_state_is_bounded() -> None:
    stage = DetectStage(max_open_runs=50)
    mapper = MapStage()
    for i in range(500):
        tid = f"{i:032x}"
        s = SpanRecord(
            tid,
            f"{i + 1:016x}",
            "",
            "execute_tool t",
            1,
            0,
            1,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "t",
                "gen_ai.tool.call.arguments": "{}",
            },
        )
        child = SpanRecord(
            tid,
            f"{i + 7:016x}",
            f"{i + 1:016x}",
            "execute_tool u",
            1,
            0,
            1,
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "u"},
        )
        stage.process(mapper.process(SpanBatch([child])))
        del s
    assert stage.open_runs <= 50


def test_corpus_interlingua_files_map_and_pass_detection(corpus_dir: Path) -> None:
    for path in sorted((corpus_dir / "otlp-genai-interlingua").glob("*.json")):
        batch = decode_json(path.read_bytes())
        mapped = DetectStage().process(MapStage().process(batch))
        assert mapped.runs, path.name
        assert any(s.kind == "decision" for s in mapped.steps), path.name
