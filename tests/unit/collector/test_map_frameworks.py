"""The map stage's run and step rules for framework spans (issue 25, point 2), as tables
of span shapes: one run per agent invocation, one step per call and per model turn,
late spans, and a trace the in-process guard (route B) reports as well."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from loopwatch.collector.map import MapStage
from loopwatch.collector.records import SpanBatch, SpanRecord
from loopwatch.collector.rows import KIND_DECISION, KIND_TOOL_RESULT, MappedBatch
from loopwatch.instrumentation import _semconv as sc

TRACE = "ab" * 16
INVOKE = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "support_bot"}
CHAT = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}
OI_LLM = {sc.OPENINFERENCE_SPAN_KIND: "LLM"}
_ids = (f"{i:016x}" for i in itertools.count(1))


def span(parent: str, name: str, start: int, end: int, attrs: dict[str, object]) -> SpanRecord:
    return SpanRecord(TRACE, next(_ids), parent, name, 1, start, end, dict(attrs))  # type: ignore[arg-type]


def native_tool(parent: str, start: int, call_id: str = "call_1") -> SpanRecord:
    """AutoGen's own tool span: the call, without its content."""
    attrs = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: "lookup_order",
        sc.GEN_AI_TOOL_CALL_ID: call_id,
    }
    return span(parent, "execute_tool lookup_order", start, start + 5, attrs)


def oi_tool(parent: str, start: int, end: int) -> SpanRecord:
    """OpenInference's TOOL span: the content, no call id."""
    attrs = {
        sc.OPENINFERENCE_SPAN_KIND: "TOOL",
        sc.OPENINFERENCE_TOOL_NAME: "lookup_order",
        sc.OPENINFERENCE_INPUT_VALUE: '{"order_id": "A-1"}',
        sc.OPENINFERENCE_OUTPUT_VALUE: '{"status": "shipped"}',
    }
    return span(parent, "support_bot.lookup_order", start, end, attrs)


def mapped(requests: Sequence[Sequence[SpanRecord]]) -> MappedBatch:
    """Map ``requests`` with one stage; all rows, pending ones released later once."""
    stage, total = MapStage(), MappedBatch()
    for request in requests:
        out = stage.process(SpanBatch(spans=list(request)))
        total.runs += out.runs
        total.stops += out.stops
        total.steps += out.steps
        total.pending += out.pending
        total.released |= out.released
        total.discarded += out.discarded
    return total


def orders(spans: list[SpanRecord]) -> list[list[list[SpanRecord]]]:
    """One request; one request per span in end order (a batching exporter's)."""
    by_end = sorted(spans, key=lambda s: s.end_unix_nano)
    return [[spans], [[s] for s in by_end]]


def test_a_tool_span_around_the_frameworks_own_tool_span_is_one_call() -> None:
    root = span("", "invoke_agent support_bot", 0, 100, INVOKE)
    outer = oi_tool(root.span_id, 10, 30)
    inner = native_tool(outer.span_id, 12)
    for requests in orders([root, outer, inner]):
        out = mapped(requests)
        (step,) = [s for s in out.steps if s.kind == KIND_TOOL_RESULT]
        assert (step.tool, step.tool_call_id) == ("lookup_order", "call_1")
        assert (step.arguments, step.result) == ('{"order_id": "A-1"}', '{"status": "shipped"}')
        assert (step.start_unix_nano, step.end_unix_nano) == (10, 30)
        assert len(out.runs) == len(out.stops) == 1


@pytest.mark.parametrize(("start", "calls"), [(11, 1), (40, 2)], ids=["nested", "apart"])
def test_tool_spans_of_one_call_id_merge_only_when_one_holds_the_other(
    start: int, calls: int
) -> None:
    """Two tracers on one call share its id; a scripted model that reuses an id for its
    next call makes a new call (their times do not nest)."""
    root = span("", "invoke_agent support_bot", 0, 100, INVOKE)
    chain = span(root.span_id, "tools", 9, 60, {})
    first = native_tool(chain.span_id, 10)
    first.end_unix_nano = 20
    second = native_tool(root.span_id, start)
    second.end_unix_nano = start + 5
    out = mapped([[first, second, chain, root]])
    assert len([s for s in out.steps if s.kind == KIND_TOOL_RESULT]) == calls


def test_nested_model_spans_are_one_turn() -> None:
    """The outermost model span of a nest is the turn; tokens come from whichever span
    reports them."""
    root = span("", "invoke_agent support_bot", 0, 100, INVOKE)
    outer = span(root.span_id, "OpenAI.achat", 10, 40, OI_LLM)
    wrapper = span(outer.span_id, "dispatch", 11, 39, {})
    inner = span(wrapper.span_id, "chat gpt", 12, 38, {**CHAT, sc.GEN_AI_USAGE_INPUT_TOKENS: 7})
    innermost = span(inner.span_id, "chat gpt", 13, 37, CHAT)
    tool = native_tool(root.span_id, 50)
    for requests in orders([root, outer, wrapper, inner, innermost, tool]):
        out = mapped(requests)
        (turn,) = [s for s in out.steps if s.kind == KIND_DECISION]
        assert (turn.step, turn.input_tokens) == (1, 7)
        assert [s.step for s in out.steps if s.kind == KIND_TOOL_RESULT] == [1]


def test_a_nested_invoke_agent_chain_is_one_run() -> None:
    """OpenLLMetry's LangGraph shape: ``invoke_agent <graph>`` around a workflow span that
    is ``invoke_agent`` too, around the calls; OpenAI Agents' OpenInference root
    "Agent workflow" AGENT span around the agent."""
    for outer_attrs in (INVOKE, {sc.OPENINFERENCE_SPAN_KIND: "AGENT"}):
        root = span("", "Agent workflow", 0, 100, outer_attrs)
        agent = span(root.span_id, "LangGraph.workflow", 1, 99, INVOKE)
        turn = span(agent.span_id, "ChatOpenAI.chat", 2, 3, CHAT)
        tool = native_tool(agent.span_id, 4)
        for requests in orders([root, agent, turn, tool]):
            out = mapped(requests)
            assert [r.run_id for r in out.runs] == [agent.span_id]
            assert [(s.run_id, s.reason) for s in out.stops] == [(agent.span_id, "completed")]
            assert {s.run_id for s in out.steps} == {agent.span_id}


def test_create_agent_and_wrappers_without_calls_make_no_stop() -> None:
    """AutoGen's ``create_agent`` span is a trace of its own: no run. An agent span
    under which the tracer reports no call (CrewAI) is one run, and no stop."""
    create = span("", "create_agent support_bot", 0, 1, {sc.GEN_AI_OPERATION_NAME: "create_agent"})
    out = mapped([[create]])
    assert (out.runs, out.stops, out.steps) == ([], [], [])
    crew = span("", "crewai.workflow", 0, 10, {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT})
    task = span(
        crew.span_id,
        "Where is order A-1?.task",
        1,
        9,
        {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT},
    )
    agent = span(
        task.span_id,
        "support_bot.agent",
        2,
        8,
        {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.CREWAI_AGENT_ROLE: "support_bot"},
    )
    for requests in orders([crew, task, agent]):
        out = mapped(requests)
        assert [(r.run_id, r.agent) for r in out.runs] == [(crew.span_id, "support_bot")]
        assert out.stops == []


def test_calls_whose_parents_end_after_the_root_are_the_root_agents() -> None:
    """AutoGen's message stream span ends after the root agent span, and a batching
    exporter sends the root first: the calls in the stream are the root's."""
    root = span("", "invoke_agent support_bot", 0, 50, INVOKE)
    stream_attrs = {sc.OPENINFERENCE_SPAN_KIND: "AGENT", sc.OPENINFERENCE_GRAPH_NODE_ID: "sb"}
    stream = span(root.span_id, "support_bot.on_messages_stream", 1, 60, stream_attrs)
    first = native_tool(stream.span_id, 5)
    second = native_tool(stream.span_id, 20, call_id="call_2")
    out = mapped([[first], [second], [root], [stream]])
    assert [r.run_id for r in out.runs] == [root.span_id]
    assert [s.run_id for s in out.stops] == [root.span_id]
    assert [(s.run_id, s.step) for s in out.steps] == [(root.span_id, 1), (root.span_id, 2)]


def test_a_late_call_no_agent_takes_joins_the_ended_traces_run() -> None:
    """A call whose parent ends after the trace's root, and whose agent never comes, is
    released (idle) to the trace's run, numbered on."""
    now = [0.0]
    stage = MapStage(max_idle_seconds=10, clock=lambda: now[0])
    root = span("", "invoke_agent support_bot", 0, 50, INVOKE)
    early = native_tool(root.span_id, 5)
    late = native_tool("00000000000000ff", 60, call_id="call_2")
    outs = [stage.process(SpanBatch(spans=s)) for s in ([early, root], [late])]
    now[0] = 11.0
    outs.append(stage.process(SpanBatch(spans=[])))
    steps = [s for o in outs for s in o.steps]
    assert [(s.run_id, s.step) for s in steps] == [(root.span_id, 1), (root.span_id, 2)]
    assert stage.open_traces == 0


def loopwatch_spans() -> list[SpanRecord]:
    """The in-process guard's spans in the same trace (route B): a run, a decision, a
    tool result and a stop."""
    run_attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.LW_RUN_ID: "lw-1"}
    run = span("", "invoke_agent support_bot", 0, 100, run_attrs)
    common = {sc.LW_RUN_ID: "lw-1", sc.LW_STEP: 1}
    decision = span(run.span_id, "decide", 1, 2, {**common, sc.LW_EVENT: sc.EVENT_DECISION})
    result = {**common, sc.LW_EVENT: sc.EVENT_TOOL_RESULT, sc.GEN_AI_TOOL_NAME: "lookup_order"}
    tool = span(run.span_id, "execute_tool lookup_order", 3, 4, result)
    stop = span(run.span_id, "stop", 98, 99, {**common, sc.LW_EVENT: sc.EVENT_STOP})
    return [run, decision, tool, stop]


@pytest.mark.parametrize("framework_first", [True, False])
def test_the_frameworks_spans_beside_the_guards_count_nothing_twice(
    framework_first: bool,
) -> None:
    """Route B with the framework's tracer on: the trace holds loopwatch's spans and
    the framework's agent, model and tool spans; only loopwatch's make rows, whichever
    request comes first (the framework's calls held pending are discarded)."""
    guard = loopwatch_spans()
    agent = span(guard[0].span_id, "agent run", 1, 97, INVOKE)
    framework = [
        span(agent.span_id, "chat gpt", 1, 2, CHAT),
        native_tool(agent.span_id, 3),
    ]
    requests = [framework, [*guard, agent]] if framework_first else [[*guard, agent], framework]
    out = mapped(requests)
    assert {r.run_id for r in out.runs} == {"lw-1"}
    assert {s.run_id for s in out.stops} == {"lw-1"}
    assert {s.run_id for s in out.steps} == {"lw-1"} and len(out.steps) == 2
    assert len(out.discarded) == (2 if framework_first else 0)
