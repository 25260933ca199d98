"""The map stage: each span shape becomes the right run, step and stop rows."""

from __future__ import annotations

import dataclasses
import itertools
import pickle
from pathlib import Path
from typing import Any

import pytest
from loopwatch.collector.map import MapStage, premap
from loopwatch.collector.records import (
    STATUS_ERROR,
    STATUS_OK,
    AttrValue,
    LinkRecord,
    SpanBatch,
    SpanEventRecord,
    SpanRecord,
    pickled_as_tuple,
)
from loopwatch.collector.rows import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    SOURCE_GENAI,
    SOURCE_LOOPWATCH,
    SOURCE_OPENINFERENCE,
    STOP_ORIGIN_INFERRED,
    STOP_ORIGIN_RUN_SPAN,
    STOP_ORIGIN_STOP_SPAN,
    MappedBatch,
    StepRow,
)
from loopwatch.instrumentation import _semconv as sc

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
_ids = itertools.count(1)


def make_span(
    name: str,
    attrs: dict[str, AttrValue],
    *,
    trace_id: str = TRACE,
    span_id: str | None = None,
    parent: str = "",
    start: int = 0,
    end: int | None = None,
    status: int = 0,
) -> SpanRecord:
    return SpanRecord(
        trace_id=trace_id,
        span_id=span_id or f"{next(_ids):016x}",
        parent_span_id=parent,
        name=name,
        kind=1,
        start_unix_nano=start,
        end_unix_nano=start + 1 if end is None else end,
        attributes=attrs,
        status_code=status,
    )


def mapped(*spans: SpanRecord, stage: MapStage | None = None) -> MappedBatch:
    return (stage or MapStage()).process(SpanBatch(spans=list(spans)))


def only(rows: list[Any]) -> Any:
    assert len(rows) == 1, rows
    return rows[0]


LW_DECISION = {
    sc.LW_EVENT: sc.EVENT_DECISION,
    sc.LW_RUN_ID: "run-1",
    sc.LW_STEP: 2,
    sc.LW_DECISION_TYPE: "tool",
    sc.GEN_AI_USAGE_INPUT_TOKENS: 100,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 7,
    sc.LW_COST_USD: 0.002,
}
LW_TOOL = {
    sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
    sc.GEN_AI_TOOL_NAME: "search_orders",
    sc.GEN_AI_TOOL_CALL_ID: "call_1",
    sc.LW_EVENT: sc.EVENT_TOOL_RESULT,
    sc.LW_RUN_ID: "run-1",
    sc.LW_STEP: 2,
    sc.LW_ACTION_FINGERPRINT: "a" * 64,
    sc.LW_OBSERVATION_DIGEST: "b" * 64,
    sc.LW_TOOL_OUTCOME: sc.OUTCOME_BLOCKED,
    sc.LW_TOOL_RISK: "read",
    sc.LW_TOOL_BLOCKED_BY: "repeated_action",
    sc.LW_PROGRESS: False,
    sc.LW_STEPS_SINCE_PROGRESS: 3,
    sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"q":"A-1"}',
    sc.GEN_AI_TOOL_CALL_RESULT: {"rows": [1, 2]},
}
LW_STOP = {
    sc.LW_EVENT: sc.EVENT_STOP,
    sc.LW_RUN_ID: "run-1",
    sc.LW_STEP: 4,
    sc.LW_STOP_REASON: "budget_exhausted",
    sc.GEN_AI_AGENT_FINISH_REASON: "budget_exhausted",
    sc.LW_STOP_DIMENSION: "tool_attempts",
    sc.LW_STOP_LIMIT: 12,
    sc.LW_STOP_OBSERVED: 12,
    sc.LW_STOP_EVIDENCE: '{"dimension":"tool_attempts"}',
    sc.LW_STEPS_SINCE_PROGRESS: 3,
    sc.LW_USAGE_MODEL_TURNS: 4,
    sc.LW_USAGE_TOOL_ATTEMPTS: 12,
    sc.LW_USAGE_TOOL_SUCCESSES: 11,
    sc.LW_USAGE_TOKENS: 5000,
    sc.LW_USAGE_COST_USD: 0.5,
    sc.LW_USAGE_ELAPSED_SECONDS: 12.5,
}
LW_RUN = {
    sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
    sc.GEN_AI_AGENT_NAME: "triage",
    sc.LW_RUN_ID: "run-1",
    sc.LW_PARENT_RUN_ID: "run-0",
    sc.LW_POLICY_NAME: "investigate-readonly",
    sc.LW_POLICY_VERSION: "2026-11-30",
    sc.LW_LIMITS: {"max_model_turns": {"value": 8, "source": "file"}},
    sc.LW_MODE: "enforce",
}

LOOPWATCH_CASES: list[tuple[str, SpanRecord, dict[str, Any]]] = [
    (
        "decision",
        make_span("decide triage", LW_DECISION),
        {
            "steps": [
                {
                    "kind": KIND_DECISION,
                    "run_id": "run-1",
                    "step": 2,
                    "decision_type": "tool",
                    "input_tokens": 100,
                    "output_tokens": 7,
                    "cost_usd": 0.002,
                    "source": SOURCE_LOOPWATCH,
                }
            ],
            "runs": [],
            "stops": [],
        },
    ),
    (
        "tool blocked, content captured",
        make_span("execute_tool search_orders", LW_TOOL),
        {
            "steps": [
                {
                    "kind": KIND_TOOL_RESULT,
                    "tool": "search_orders",
                    "tool_call_id": "call_1",
                    "outcome": sc.OUTCOME_BLOCKED,
                    "blocked_by": "repeated_action",
                    "risk": "read",
                    "progress": False,
                    "steps_since_progress": 3,
                    "action_fingerprint": "a" * 64,
                    "observation_digest": "b" * 64,
                    "arguments": '{"q":"A-1"}',
                    "result": '{"rows":[1,2]}',
                }
            ],
            "stops": [],
        },
    ),
    (
        "tool without outcome, error status",
        make_span(
            "execute_tool x",
            {k: v for k, v in LW_TOOL.items() if k != sc.LW_TOOL_OUTCOME},
            status=STATUS_ERROR,
        ),
        {"steps": [{"outcome": sc.OUTCOME_ERROR, "status_code": STATUS_ERROR}]},
    ),
    (
        "stop span",
        make_span("stop triage", LW_STOP, end=500),
        {
            "stops": [
                {
                    "origin": STOP_ORIGIN_STOP_SPAN,
                    "stop_inferred": False,
                    "reason": "budget_exhausted",
                    "dimension": "tool_attempts",
                    "limit_value": 12.0,
                    "observed": 12.0,
                    "evidence": '{"dimension":"tool_attempts"}',
                    "step": 4,
                    "steps_since_progress": 3,
                    "usage_model_turns": 4,
                    "usage_tool_attempts": 12,
                    "usage_tool_successes": 11,
                    "usage_tokens": 5000,
                    "usage_cost_usd": 0.5,
                    "usage_elapsed_seconds": 12.5,
                    "time_unix_nano": 500,
                }
            ],
            "steps": [],
            "runs": [],
        },
    ),
    (
        "run span with stop attributes",
        make_span(
            "invoke_agent triage",
            {**LW_RUN, sc.LW_STOP_REASON: "repeated_action"},
            start=10,
            end=900,
            status=STATUS_OK,
        ),
        {
            "runs": [
                {
                    "is_run_span": True,
                    "agent": "triage",
                    "parent_run_id": "run-0",
                    "policy_name": "investigate-readonly",
                    "policy_version": "2026-11-30",
                    "limits": '{"max_model_turns":{"source":"file","value":8}}',
                    "mode": "enforce",
                    "start_unix_nano": 10,
                    "end_unix_nano": 900,
                    "status_code": STATUS_OK,
                    "source": SOURCE_LOOPWATCH,
                }
            ],
            "stops": [{"origin": STOP_ORIGIN_RUN_SPAN, "reason": "repeated_action"}],
            "steps": [],
        },
    ),
    (
        "run span without stop attributes, error status",
        make_span(
            "invoke_agent triage",
            {k: v for k, v in LW_RUN.items() if k != sc.GEN_AI_AGENT_NAME},
            status=STATUS_ERROR,
        ),
        {
            "runs": [{"agent": "triage"}],
            "stops": [{"origin": STOP_ORIGIN_INFERRED, "stop_inferred": True, "reason": "error"}],
        },
    ),
    (
        "odd attribute types map to None",
        make_span(
            "decide triage",
            {
                **LW_DECISION,
                sc.LW_STEP: True,
                sc.GEN_AI_USAGE_INPUT_TOKENS: "12",
                sc.LW_COST_USD: "x",
            },
        ),
        {"steps": [{"step": None, "input_tokens": 12, "cost_usd": None}]},
    ),
    (
        "loopwatch event without run id is not mapped",
        make_span("decide triage", {sc.LW_EVENT: sc.EVENT_DECISION}),
        {"runs": [], "steps": [], "stops": [], "spans_unmapped": 1},
    ),
]


@pytest.mark.parametrize(
    ("span", "expected"), [c[1:] for c in LOOPWATCH_CASES], ids=[c[0] for c in LOOPWATCH_CASES]
)
def test_loopwatch_span_shapes(span: SpanRecord, expected: dict[str, Any]) -> None:
    out = mapped(span)
    for table, want in expected.items():
        if table == "spans_unmapped":
            assert out.spans_unmapped == want
            continue
        rows = getattr(out, table)
        assert len(rows) == len(want), (table, rows)
        for row, fields in zip(rows, want, strict=True):
            assert row.trace_id == TRACE and row.span_id == span.span_id
            for name, value in fields.items():
                assert getattr(row, name) == value, (table, name)


def genai_trace(trace_id: str = TRACE, *, tool_status: int = 0) -> list[SpanRecord]:
    agent = make_span(
        "invoke_agent support",
        {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "support"},
        trace_id=trace_id,
        start=0,
        end=100,
    )
    chat1 = make_span(
        "chat gpt",
        {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_USAGE_INPUT_TOKENS: 10},
        trace_id=trace_id,
        parent=agent.span_id,
        start=10,
    )
    tool1 = make_span(
        "execute_tool lookup_order",
        {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: "lookup_order",
            sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"order_id":"A-1"}',
            sc.GEN_AI_TOOL_CALL_RESULT: '{"status":"shipped"}',
        },
        trace_id=trace_id,
        parent=agent.span_id,
        start=20,
        status=tool_status,
    )
    tool2 = make_span(
        "execute_tool notify",
        {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL},
        trace_id=trace_id,
        parent=agent.span_id,
        start=21,
    )
    chat2 = make_span(
        "chat gpt",
        {sc.GEN_AI_OPERATION_NAME: "text_completion"},
        trace_id=trace_id,
        parent=agent.span_id,
        start=30,
    )
    return [agent, chat1, tool1, tool2, chat2]


def test_genai_run_in_one_batch() -> None:
    agent, chat1, tool1, tool2, chat2 = genai_trace(tool_status=STATUS_ERROR)
    out = mapped(chat2, tool2, tool1, agent, chat1)
    assert {r.run_id for r in out.runs} == {agent.span_id}
    run = only([r for r in out.runs if r.is_run_span])
    assert (run.agent, run.source, run.span_id) == ("support", SOURCE_GENAI, agent.span_id)
    assert [(s.span_id, s.kind, s.step) for s in out.steps] == [
        (chat1.span_id, KIND_DECISION, 1),
        (tool1.span_id, KIND_TOOL_RESULT, 1),
        (tool2.span_id, KIND_TOOL_RESULT, 1),
        (chat2.span_id, KIND_DECISION, 2),
    ]
    first_tool = out.steps[1]
    assert (first_tool.tool, first_tool.outcome) == ("lookup_order", sc.OUTCOME_ERROR)
    assert first_tool.arguments == '{"order_id":"A-1"}'
    assert first_tool.result == '{"status":"shipped"}'
    assert out.steps[2].tool == "notify"
    assert out.steps[0].input_tokens == 10
    stop = only(out.stops)
    assert (stop.run_id, stop.origin, stop.reason, stop.step) == (
        agent.span_id,
        STOP_ORIGIN_INFERRED,
        "completed",
        2,
    )
    assert stop.stop_inferred and stop.time_unix_nano == agent.end_unix_nano
    assert not out.pending and not out.released


def test_agent_error_status_infers_error_stop() -> None:
    agent = make_span(
        "invoke_agent a",
        {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT},
        status=STATUS_ERROR,
        start=0,
        end=50,
    )
    model = make_span(
        "chat m", {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}, parent=agent.span_id, start=5
    )
    assert only(mapped(model, agent).stops).reason == "error"


def test_an_agent_span_with_no_step_counts_no_stop_even_when_it_failed() -> None:
    # Issue 25: a run with no step never counts as a stop (a framework's wrapper or a
    # create_agent span must not feed loopwatch_agent_stops_total).
    agent = make_span(
        "invoke_agent a", {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}, status=STATUS_ERROR
    )
    assert mapped(agent).stops == []


def test_openinference_spans() -> None:
    agent = make_span("agent", {sc.OPENINFERENCE_SPAN_KIND: "AGENT"}, start=0, end=50)
    chain = make_span("chain", {sc.OPENINFERENCE_SPAN_KIND: "CHAIN"}, parent=agent.span_id)
    llm = make_span("llm", {sc.OPENINFERENCE_SPAN_KIND: "LLM"}, parent=chain.span_id, start=5)
    tool = make_span(
        "tool",
        {
            sc.OPENINFERENCE_SPAN_KIND: "TOOL",
            sc.OPENINFERENCE_TOOL_NAME: "get_weather",
            sc.OPENINFERENCE_INPUT_VALUE: '{"city":"Oslo"}',
            sc.OPENINFERENCE_OUTPUT_VALUE: "rain",
        },
        parent=chain.span_id,
        start=6,
    )
    out = mapped(agent, chain, llm, tool)
    assert {s.run_id for s in out.steps} == {agent.span_id}
    assert {r.source for r in out.runs} == {SOURCE_OPENINFERENCE}
    step = out.steps[1]
    assert (step.kind, step.tool, step.arguments, step.result, step.outcome) == (
        KIND_TOOL_RESULT,
        "get_weather",
        '{"city":"Oslo"}',
        "rain",
        sc.OUTCOME_OK,
    )
    assert only(out.stops).run_id == agent.span_id
    assert out.spans_unmapped == 1


def test_openllmetry_request_type_is_a_model_call() -> None:
    root = make_span("workflow", {}, start=0, end=9)
    llm = make_span(
        "openai.chat", {sc.OPENLLMETRY_REQUEST_TYPE: "chat"}, parent=root.span_id, start=1
    )
    embed = make_span(
        "openai.embeddings", {sc.OPENLLMETRY_REQUEST_TYPE: "embedding"}, parent=root.span_id
    )
    out = mapped(root, llm, embed)
    assert [s.kind for s in out.steps] == [KIND_DECISION]
    assert {r.run_id for r in out.runs} == {TRACE}
    run = only([r for r in out.runs if r.is_run_span])
    assert run.agent == "workflow"


def test_trace_without_agent_span_is_one_run_stopped_at_root_end() -> None:
    root = make_span("handler", {}, start=0, end=99, status=STATUS_ERROR)
    tools = [
        make_span(
            f"execute_tool t{i}",
            {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL},
            parent=root.span_id,
            start=10 + i,
        )
        for i in range(3)
    ]
    out = mapped(*tools, root)
    assert [s.step for s in out.steps] == [1, 2, 3]
    stop = only(out.stops)
    assert (stop.run_id, stop.reason, stop.step, stop.origin) == (
        TRACE,
        "error",
        3,
        STOP_ORIGIN_INFERRED,
    )


def test_agent_span_in_a_later_request_releases_the_pending_steps() -> None:
    stage = MapStage()
    agent, chat1, tool1, tool2, chat2 = genai_trace()
    first = mapped(chat1, tool1, stage=stage)
    assert not first.steps and not first.stops
    assert {(s.run_id, parent) for s, parent in first.pending} == {(TRACE, agent.span_id)}
    second = mapped(tool2, chat2, stage=stage)
    assert [s.step for s, _ in second.pending] == [1, 2]
    third = mapped(agent, stage=stage)
    spans = {chat1.span_id, tool1.span_id, tool2.span_id, chat2.span_id}
    assert {s.span_id for s in third.steps} == spans
    assert {s.run_id for s in third.steps} == {agent.span_id}
    assert third.released == {(TRACE, span_id) for span_id in spans}
    stop = only(third.stops)
    assert (stop.run_id, stop.step) == (agent.span_id, 2)
    assert stage.open_traces == 0


def test_reassignment_follows_chains_and_keeps_other_agents_apart() -> None:
    stage = MapStage()
    root = make_span("workflow", {}, start=0, end=100)
    agents = [
        make_span("a", {sc.OPENINFERENCE_SPAN_KIND: "AGENT"}, parent=root.span_id, start=i)
        for i in (1, 2)
    ]
    chains = [
        make_span("c", {sc.OPENINFERENCE_SPAN_KIND: "CHAIN"}, parent=a.span_id) for a in agents
    ]
    tools = [
        make_span("t", {sc.OPENINFERENCE_SPAN_KIND: "TOOL"}, parent=c.span_id, start=5)
        for c in chains
    ]
    mapped(*tools, stage=stage)
    out = mapped(chains[0], agents[0], stage=stage)
    assert out.released == {(TRACE, tools[0].span_id)}
    out = mapped(chains[1], agents[1], root, stage=stage)
    assert [(s.span_id, s.run_id) for s in out.steps] == [(tools[1].span_id, agents[1].span_id)]
    assert out.released == {(TRACE, tools[1].span_id)}
    assert {s.run_id for s in out.stops} == {agents[1].span_id}


def test_third_party_spans_inside_a_loopwatch_trace_are_not_mapped_twice() -> None:
    stage = MapStage()
    chat = make_span("chat", {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}, parent="00000000000000aa")
    early = mapped(chat, stage=stage)
    assert len(early.pending) == 1
    decision = make_span("decide triage", LW_DECISION)
    later_chat = make_span("chat", {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}, start=50)
    out = mapped(decision, later_chat, stage=stage)
    assert [s.source for s in out.steps] == [SOURCE_LOOPWATCH]
    assert [s.span_id for s in out.discarded] == [chat.span_id]
    assert (
        mapped(make_span("chat", {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}), stage=stage).steps == []
    )


def _third_party_tool_steps(out: MappedBatch) -> dict[str, list[StepRow]]:
    """Third-party ``tool_result`` steps per run id, in step order (what detect judges)."""
    steps: dict[str, list[StepRow]] = {}
    for s in out.steps:
        if s.kind == KIND_TOOL_RESULT and s.source != SOURCE_LOOPWATCH:
            steps.setdefault(s.run_id, []).append(s)
    for rows in steps.values():
        rows.sort(key=lambda s: (s.step or 0, s.start_unix_nano, s.span_id))
    return steps


def test_third_party_tool_steps_seam() -> None:
    agent, chat1, tool1, tool2, chat2 = genai_trace()
    lw_tool = make_span("execute_tool x", LW_TOOL, trace_id="f" * 32)
    out = mapped(tool2, agent, chat1, tool1, chat2, lw_tool)
    steps = _third_party_tool_steps(out)
    assert list(steps) == [agent.span_id]
    assert [s.span_id for s in steps[agent.span_id]] == [tool1.span_id, tool2.span_id]
    first = steps[agent.span_id][0]
    out.replace_step(first, dataclasses.replace(first, action_fingerprint="f" * 64))
    assert _third_party_tool_steps(out)[agent.span_id][0].action_fingerprint == "f" * 64
    stop = out.stops[0]
    out.replace_stop(stop, dataclasses.replace(stop, reason="repeated_action"))
    assert out.stops[0].reason == "repeated_action"
    with pytest.raises(ValueError):
        out.replace_step(first, dataclasses.replace(first, span_id="0" * 16))
    with pytest.raises(ValueError):
        out.replace_stop(stop, dataclasses.replace(stop, run_id="other"))


def test_span_keys_and_counts() -> None:
    spans = genai_trace()
    out = mapped(*spans)
    rows = (*out.runs, *out.steps, *out.stops, *(step for step, _ in out.pending))
    assert not out.released
    assert {(r.trace_id, r.span_id) for r in rows} == {(s.trace_id, s.span_id) for s in spans}
    assert out.spans_in == 5 and out.spans_unmapped == 0


def test_open_trace_memory_is_bounded() -> None:
    stage = MapStage(max_open_traces=2)
    for i in range(5):
        tool = make_span(
            "t",
            {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL},
            trace_id=f"{i + 1:032x}",
            parent="00000000000000aa",
        )
        mapped(tool, stage=stage)
    assert stage.open_traces == 2


@pytest.mark.parametrize("kwargs", [{"max_open_traces": 0}, {"max_spans_per_trace": 0}])
def test_invalid_bounds_fail_at_construction(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        MapStage(**kwargs)


CORPUS_CASES = [
    ("testdata__openinference__in.json", SOURCE_OPENINFERENCE, "ChatCompletion", 412),
    ("testdata__openllmetry__in.json", SOURCE_GENAI, "support_triage.workflow", 412),
]


@pytest.mark.corpus
@pytest.mark.parametrize(("name", "source", "agent", "input_tokens"), CORPUS_CASES)
def test_corpus_files_map_to_one_run(
    name: str, source: str, agent: str, input_tokens: int | None
) -> None:
    path = CORPUS / "otlp-genai-interlingua" / name
    if not path.is_file():
        pytest.skip(f"corpus file not present: {path}")
    from loopwatch.collector.decode import decode_json

    batch = decode_json(path.read_bytes())
    assert batch.rejected_spans == 0
    out = MapStage().process(batch)
    trace_id = batch.spans[0].trace_id
    assert {r.run_id for r in out.runs} == {trace_id}
    run = only([r for r in out.runs if r.is_run_span])
    assert (run.source, run.agent) == (source, agent)
    step = only(out.steps)
    assert (step.kind, step.step, step.run_id, step.input_tokens) == (
        KIND_DECISION,
        1,
        trace_id,
        input_tokens,
    )
    stop = only(out.stops)
    assert (stop.reason, stop.stop_inferred, stop.step) == ("completed", True, 1)
    assert out.spans_unmapped == 0


def test_premap_is_pure_and_finish_completes_it() -> None:
    """A decode worker runs ``premap`` and pickles the result; the serving process runs
    ``finish``. The rows must equal ``process`` in one place, batch after batch."""
    agent, chat1, tool1, tool2, chat2 = genai_trace("0af7651916cd43dd8448eb211c80319c")
    lw = [case[1] for case in LOOPWATCH_CASES]
    batches = [[*lw[:3], chat1, tool1], [tool2, chat2, *lw[3:]], [agent]]
    whole, split = MapStage(), MapStage()
    for spans in batches:
        expected = whole.process(SpanBatch(spans=list(spans)))
        partial = premap(SpanBatch(spans=list(spans)))
        assert all(s.source == SOURCE_LOOPWATCH for s in partial.mapped.steps)
        third_party = [s for s in spans if not ({sc.LW_RUN_ID, sc.LW_EVENT} & s.attributes.keys())]
        assert [s for group in partial.third_party.values() for s in group] == third_party
        assert partial.mapped.spans_in == len(spans)
        got = split.finish(pickle.loads(pickle.dumps(partial)))
        assert got == expected
    assert [len(m.steps) for m in (expected,)] == [4]  # the pending steps, released
    assert {s.run_id for s in got.steps} == {agent.span_id} and got.released
    assert split.open_traces == whole.open_traces == 0


def test_rows_and_records_pickle_as_tuples() -> None:
    span = genai_trace()[2]
    span.events = [SpanEventRecord("exception", 5, {"exception.message": "boom"})]
    span.links = [LinkRecord(TRACE, "1" * 16, {"k": [1, "v"]}, "ts")]
    out = mapped(*genai_trace(), LOOPWATCH_CASES[0][1])
    out.discarded.append(out.steps[0])
    for value in (
        span,
        span.resource,
        span.scope,
        *span.events,
        *span.links,
        out,
        *out.runs,
        *out.steps,
        *out.stops,
    ):
        reduced = value.__reduce__()
        assert reduced[0] is type(value) and type(reduced[1]) is tuple
        assert pickle.loads(pickle.dumps(value)) == value


def test_pickled_as_tuple_refuses_classes_it_cannot_rebuild() -> None:
    @dataclasses.dataclass
    class Derived:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    with pytest.raises(TypeError, match="__init__"):
        pickled_as_tuple(Derived)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


_TOOL = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "lookup"}
_AGENT = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}


@pytest.mark.parametrize(
    ("then", "run"),
    [
        ("agent span", "agent"),
        ("root span ends", TRACE),
        ("idle timeout", TRACE),
        ("evicted", TRACE),
        ("loopwatch span", None),
    ],
)
def test_where_a_pending_step_goes(then: str, run: str | None) -> None:
    """A step whose agent span is not known yet is pending, and leaves once, final: to the
    run its ancestry names, else to the trace-level run, or to no run in a loopwatch trace."""
    clock = _Clock()
    stage = MapStage(max_open_traces=1, max_idle_seconds=60, clock=clock)
    root = make_span("workflow", {}, start=0, end=100)
    agent = make_span("invoke_agent a", _AGENT, parent=root.span_id, start=1, end=50)
    tool = make_span("execute_tool lookup", _TOOL, parent=agent.span_id, start=2, end=3)
    first = mapped(tool, stage=stage)
    assert [s.span_id for s, _ in first.pending] == [tool.span_id] and not first.steps
    clock.now = 61 if then == "idle timeout" else 10
    later = {
        "agent span": [agent],
        "root span ends": [root],
        "idle timeout": [make_span("t", _TOOL, trace_id="a" * 32)],
        "evicted": [make_span("t", _TOOL, trace_id="a" * 32)],
        "loopwatch span": [make_span("decide", LW_DECISION)],
    }[then]
    out = mapped(*later, stage=stage)
    key = (TRACE, tool.span_id)
    if run is None:
        assert [s.span_id for s in out.discarded] == [tool.span_id] and not out.released
        return
    step = next(s for s in out.steps if s.span_id == tool.span_id)
    assert step.run_id == (agent.span_id if run == "agent" else run)
    assert key in out.released and key not in {(s.trace_id, s.span_id) for s, _ in out.pending}
    assert not mapped(agent, root, stage=stage).released  # released once


def test_undo_holds_the_released_steps_again_for_the_retry() -> None:
    stage = MapStage()
    agent = make_span("invoke_agent a", _AGENT, start=1, end=50)
    tool = make_span("execute_tool lookup", _TOOL, parent=agent.span_id, start=2, end=3)
    mapped(tool, stage=stage)
    refused = mapped(agent, stage=stage)
    assert refused.released == {(TRACE, tool.span_id)}
    stage.undo(refused)
    retry = mapped(agent, stage=stage)
    assert retry.released == refused.released
    assert [(s.span_id, s.run_id) for s in retry.steps] == [(tool.span_id, agent.span_id)]


def test_restore_holds_the_stored_pending_steps() -> None:
    agent = make_span("invoke_agent a", _AGENT, start=1, end=50)
    tool = make_span("execute_tool lookup", _TOOL, parent=agent.span_id, start=2, end=3)
    stored = mapped(tool).pending
    stage = MapStage()
    assert not stage.restore(stored).steps
    out = mapped(agent, stage=stage)
    assert [(s.span_id, s.run_id, s.step) for s in out.steps] == [(tool.span_id, agent.span_id, 1)]
