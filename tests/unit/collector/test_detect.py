"""Server-side detection for third-party GenAI/OpenInference spans (observe mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loopwatch.collector.decode import decode_json
from loopwatch.collector.detect import DetectStage
from loopwatch.collector.map import MapStage
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


# --------------------------------------------- several agents, arrival order (review 2026-12-01)


def tool_span(
    span_id: str, parent: str, start: int, tool: str, args: dict, result: dict
) -> SpanRecord:
    attrs = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.arguments": json.dumps(args),
        "gen_ai.tool.call.result": json.dumps(result),
    }
    return span(span_id, f"execute_tool {tool}", attrs, parent=parent, start=start)


def agent_span(span_id: str, name: str, parent: str = "", start: int = 0) -> SpanRecord:
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
    return span(span_id, f"invoke_agent {name}", attrs, parent=parent, start=start)


def run_batches(*batches: list[SpanRecord]) -> tuple[dict[str, object], list[object]]:
    """Map and detect each request in turn; return the inferred stops by run id and all
    stored steps."""
    mapper, stage = MapStage(), DetectStage()
    stops: dict[str, object] = {}
    steps: list[object] = []
    for spans in batches:
        mapped = stage.process(mapper.process(SpanBatch(list(spans))))
        stops.update({s.run_id: s for s in mapped.stops if s.stop_inferred})
        steps += mapped.steps
    return stops, steps


@pytest.mark.parametrize("one_request", [False, True])
def test_a_nested_agents_loop_is_its_own_not_its_parents(one_request: bool) -> None:
    """One guard per trace once filed the child's five identical calls under the parent,
    which never called that tool (the child got no detection)."""
    parent, child = "p" * 16, "c" * 16
    loop = [
        tool_span(f"{i + 1:016x}", child, 100 + i, "lookup_order", {"id": 1}, {"s": "pending"})
        for i in range(5)
    ]
    other = tool_span("e" * 16, parent, 50, "plan", {"q": "x"}, {"plan": "ok"})
    batches = [loop, [agent_span(child, "loopy_child", parent, 90), other]]
    batches.append([agent_span(parent, "clean")])
    stops, _ = run_batches(*([[s for b in batches for s in b]] if one_request else batches))
    assert stops[child].observe_reason == "repeated_action"
    assert json.loads(stops[child].observe_evidence)["tool"] == "lookup_order"
    assert stops[parent].observe_reason is None


def test_sibling_agents_are_judged_apart() -> None:
    """Two agents side by side, each calling the same tool twice (under the limit of 3):
    no loop. Their four calls together once made one of them a repeated_action."""
    root, x, y = "r" * 16, "a" * 16, "b" * 16
    calls = [
        tool_span(f"{i + 1:016x}", (x, y)[i % 2], 100 + i, "get", {"id": 7}, {"v": 1})
        for i in range(4)
    ]
    root_span = span(root, "workflow", {}, start=0)
    stops, _ = run_batches(
        [*calls, agent_span(x, "sib_x", root, 10), agent_span(y, "sib_y", root, 20), root_span]
    )
    assert stops[x].observe_reason is None and stops[y].observe_reason is None


def test_calls_are_judged_in_start_order_not_arrival_order() -> None:
    """A-B-A-B-A-B whose B calls arrive first (a retried request) is a cycle, not a
    repeated B then a repeated A."""
    agent = "g" * 16
    calls = [
        tool_span(f"{i + 1:016x}", agent, 100 + i, "ab"[i % 2], {"k": 1}, {"v": "same"})
        for i in range(6)
    ]
    stops, _ = run_batches(calls[1::2], calls[0::2], [agent_span(agent, "pingpong")])
    assert stops[agent].observe_reason == "action_cycle"


def test_evidence_points_at_the_steps_as_stored() -> None:
    """The second agent of a trace has steps numbered after the first's; its evidence
    names those stored steps, not the guard's own count from 1."""
    root, x, y = "r" * 16, "a" * 16, "b" * 16
    first = [tool_span(f"{i + 1:016x}", x, 100 + i, "read", {"n": i}, {"v": i}) for i in range(2)]
    second = [
        tool_span(f"{i + 11:016x}", y, 200 + i, "poll", {"id": 3}, {"state": "wait"})
        for i in range(3)
    ]
    stops, steps = run_batches(
        [*first, agent_span(x, "reader", root, 90)],
        [*second, agent_span(y, "poller", root, 190), span(root, "workflow", {}, start=0)],
    )
    stored = sorted(s.step for s in steps if s.run_id == y)
    evidence = json.loads(stops[y].observe_evidence)
    assert stops[y].observe_reason == "repeated_action"
    assert evidence["step_indices"] == stored and stops[y].observe_step == stored[-1]
    assert stored[0] > 1


def test_a_resent_request_keeps_the_step_numbers() -> None:
    """A client retry of a tool-only request mid-run once took new step numbers (stored
    steps 1, 2, 5, 6 for four calls): the resent spans now keep theirs."""
    agent = "g" * 16
    calls = [
        tool_span(f"{i + 1:016x}", agent, 100 + i, "read", {"n": i}, {"v": i}) for i in range(4)
    ]
    mapper = MapStage()
    numbers = []
    for spans in (calls[:2], calls[:2], calls[2:], [agent_span(agent, "reader")]):
        mapped = mapper.process(SpanBatch(list(spans)))
        new = [s for s in mapped.steps if (s.trace_id, s.span_id) not in mapped.released]
        numbers.append([s.step for s in new + [row for row, _ in mapped.pending]])
    assert numbers == [[1, 2], [1, 2], [3, 4], []]


def test_openinference_model_calls_carry_their_token_counts(corpus_dir: Path) -> None:
    """``llm.token_count.prompt``/``.completion`` are OpenInference's token counts; the
    run once showed 0 tokens for the corpus's OpenInference trace."""
    path = corpus_dir / "otlp-genai-interlingua" / "testdata__openinference__in.json"
    raw = json.loads(path.read_text())
    expected = {}
    for rs in raw["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                attrs = {a["key"]: a["value"] for a in sp.get("attributes", [])}
                if "llm.token_count.prompt" in attrs:
                    expected[sp["spanId"].lower()] = (
                        int(attrs["llm.token_count.prompt"]["intValue"]),
                        int(attrs["llm.token_count.completion"]["intValue"]),
                    )
    mapped = MapStage().process(decode_json(path.read_bytes()))
    got = {
        s.span_id: (s.input_tokens, s.output_tokens) for s in mapped.steps if s.span_id in expected
    }
    assert expected and got == expected and all(sum(v) > 0 for v in got.values())


def test_calls_out_of_order_cost_one_replay_not_one_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A late call once reset the run's guard, and the next request replayed every call:
    a 4,000-call run whose parallel calls ended pairwise out of order took 198 s. Now the
    guard is fed once per call on arrival and, when order was broken, once more in full
    at the verdict."""
    from loopwatch.collector import detect

    fed = 0
    feed = detect._Feeder.feed

    def counting(self: object, call: object) -> object:
        nonlocal fed
        fed += 1
        return feed(self, call)  # type: ignore[arg-type]

    monkeypatch.setattr(detect._Feeder, "feed", counting)
    agent = "g" * 16
    calls = [
        tool_span(f"{i + 1:016x}", agent, 100 + i, "poll", {"n": i}, {"v": i}) for i in range(400)
    ]
    swapped = [calls[i ^ 1] for i in range(len(calls))]  # pairs end out of order
    stops, _ = run_batches(*([c] for c in swapped), [agent_span(agent, "poller")])
    assert stops[agent].observe_reason is None
    assert fed == 2 * len(calls)


def test_a_childs_loop_is_seen_behind_a_long_parent() -> None:
    """Calls wait under the trace until their agent span comes; at the per-run cap the
    newest ones were refused, so a child's loop after 4,096 parent calls went unseen.
    The oldest are let go instead."""
    from loopwatch.collector.detect import MAX_CALLS_PER_RUN

    parent, child = "p" * 16, "c" * 16
    mine = [
        tool_span(f"{i + 1:016x}", parent, 100 + i, "read", {"n": i}, {"v": i})
        for i in range(MAX_CALLS_PER_RUN)
    ]
    loop = [
        tool_span(f"{i + 1:08x}" + "c" * 8, child, 10**6 + i, "poll", {"id": 1}, {"s": "wait"})
        for i in range(5)
    ]
    stops, _ = run_batches(
        mine, loop, [agent_span(child, "child", parent, 10**6 - 1)], [agent_span(parent, "p")]
    )
    assert stops[child].observe_reason == "repeated_action"


def test_no_progress_evidence_names_stored_steps() -> None:
    """``detail.last_progress_step`` was left in the guard's own count (3) while the
    step indices beside it were stored steps (9..16) of the trace's second agent."""
    root, x, y = "r" * 16, "a" * 16, "b" * 16
    first = [tool_span(f"{i + 1:016x}", x, 100 + i, "read", {"n": i}, {"v": i}) for i in range(5)]
    second = [
        tool_span(f"{i + 101:016x}", y, 1000 + i, "scan", {"page": i}, {"rows": []})
        for i in range(12)
    ]
    stops, steps = run_batches(
        [*first, agent_span(x, "reader", root, 90)],
        [*second, agent_span(y, "scanner", root, 990), span(root, "workflow", {}, start=0)],
    )
    evidence = json.loads(stops[y].observe_evidence)
    stored = sorted(s.step for s in steps if s.run_id == y)
    assert stops[y].observe_reason == "no_progress"
    assert evidence["detail"]["last_progress_step"] in stored
    assert set(evidence["step_indices"]) <= set(stored)


def test_held_calls_and_bytes_are_bounded() -> None:
    stage = DetectStage(max_held_calls=50, max_held_bytes=20_000)
    mapper = MapStage()
    for t in range(40):
        trace = f"{t + 1:032x}"
        spans = [
            SpanRecord(
                trace,
                f"{i + 1:016x}",
                "a" * 16,
                "execute_tool t",
                1,
                i,
                i + 1,
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "t",
                    "gen_ai.tool.call.arguments": json.dumps({"pad": "x" * 300, "i": i}),
                },
            )
            for i in range(10)
        ]
        stage.process(mapper.process(SpanBatch(spans)))  # agent spans never come
        calls, held = stage.held
        assert calls <= 50 + 10 and held <= 20_000 + 10 * 400


@pytest.mark.parametrize("captured", ["neither", "arguments only", "result only", "both"])
def test_calls_sent_without_content_never_make_a_loop(captured: str) -> None:
    """Tool call content is opt-in in the GenAI conventions, and off by default in most
    tracers. Without arguments every call of a tool looked the same: three weather
    lookups for three cities were a repeated_action (a new user's trial, 2026-12-01)."""
    agent = "w" * 16
    calls = []
    for i in range(5):
        attrs: dict[str, object] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "get_weather",
        }
        if captured in ("arguments only", "both"):
            attrs["gen_ai.tool.call.arguments"] = json.dumps({"city": "Oslo"})
        if captured in ("result only", "both"):
            attrs["gen_ai.tool.call.result"] = json.dumps({"temp": 3})
        calls.append(span(f"{i + 1:016x}", "execute_tool get_weather", attrs, agent, 100 + i))
    stops, steps = run_batches([*calls, agent_span(agent, "weather_bot")])
    expected = "repeated_action" if captured == "both" else None
    assert stops[agent].observe_reason == expected
    fingerprints = {s.action_fingerprint for s in steps if s.kind == "tool_result"}
    assert len(fingerprints) == (5 if captured in ("neither", "result only") else 1)


def test_a_refused_request_taken_back_is_judged_again_on_its_retry() -> None:
    """A request refused before its commit (429/503) is undone: its retry, mapped as a
    resend, gets the same annotations and the same verdict."""
    spans = genai_trace([{"status": "pending"}] * 5)
    mapper, stage = MapStage(), DetectStage()
    first = stage.process(mapper.process(SpanBatch(list(spans))))
    mapper.undo(first)
    stage.undo(first)
    retry = stage.process(mapper.process(SpanBatch(list(spans))))
    for batch in (first, retry):
        stop = next(s for s in batch.stops if s.stop_inferred)
        assert (stop.observe_reason, stop.observe_step) == ("repeated_action", 3)
    assert [s.action_fingerprint for s in retry.steps] == [
        s.action_fingerprint for s in first.steps
    ]
    assert all(s.action_fingerprint for s in retry.steps if s.kind == "tool_result")
