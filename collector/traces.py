"""Third-party spans of one trace, tied into runs: the per-trace state and the rows.

The map stage (:mod:`loopwatch.collector.map`) decides, span by span, which run a
third-party span belongs to; this module holds what it remembers per trace
(:class:`TraceState`), the steps of one request while it is mapped (:class:`StepBuffer`),
the rule that one call or one model turn seen through several nested spans is one step
(:func:`nest_of`, :func:`merge_rows`), and the rows made of GenAI, OpenInference and
OpenLLMetry spans (:func:`agent_run_row`, :func:`step_row`, :func:`inferred_stop`).

One call through two spans: a tool span directly inside a tool span (OpenInference's
``TOOL`` span around AutoGen's own ``execute_tool``), two tool spans with the same
``gen_ai.tool.call.id`` where one's time holds the other's, and a model span inside a
model span (directly, or through up to :data:`MAX_NEST_DEPTH` non-agent spans) are one
step: the row of the span mapped first, each field taken from whichever span has it.
Spans end children first, so the inner span usually comes first; either order works
while its row can still change (held pending, or mapped in the same request). A nested
span that comes after its call's row was stored adds nothing (its content is lost, the
call is not counted twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

from loopwatch.instrumentation import _semconv as sc

from .frameworks import named_agent
from .genai import ROLE_MODEL as _MODEL
from .genai import (
    agent_name,
    input_tokens,
    output_tokens,
    tool_arguments,
    tool_call_id,
    tool_failed,
    tool_name,
    tool_result,
)
from .genai import attr_str as _str
from .records import STATUS_ERROR, Attributes, SpanRecord
from .rows import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    SOURCE_GENAI,
    SOURCE_OPENINFERENCE,
    STOP_COMPLETED,
    STOP_ERROR,
    STOP_ORIGIN_INFERRED,
    MappedBatch,
    RunRow,
    StepRow,
    StopRow,
)

__all__ = [
    "MAX_ANCESTRY_DEPTH",
    "MAX_NEST_DEPTH",
    "StepBuffer",
    "TraceState",
    "agent_run_row",
    "inferred_stop",
    "merge_rows",
    "nest_of",
    "resolve",
    "source_of",
    "step_row",
    "stepless_run",
]

MAX_ANCESTRY_DEPTH: Final = 256
"""Parent links followed to find a span's agent (a cycle or a deep chain ends there)."""
MAX_NEST_DEPTH: Final = 8
"""Non-agent spans followed up from a model span to find the model span it is part of."""


@dataclass(slots=True)
class TraceState:
    """What the map stage remembers of one open third-party trace (each map bounded by
    ``max_spans_per_trace``: :class:`~loopwatch.collector.map.MapStage`)."""

    parents: dict[str, str] = field(default_factory=dict)
    agents: set[str] = field(default_factory=set)  # agent spans that are (or may be) runs
    runs: set[str] = field(default_factory=set)  # agent spans that are runs
    waiting: dict[str, SpanRecord] = field(default_factory=dict)  # ended with no step yet
    run_of: dict[str, str] = field(default_factory=dict)  # ended root span -> its run
    name_hint: str | None = None  # the agent's name, written on a span not its own
    trace_steps: int = 0  # steps mapped straight to the trace-level run
    kinds: dict[str, int] = field(default_factory=dict)  # role of each step span mapped
    children: dict[tuple[int, str], str] = field(default_factory=dict)  # (role, parent)
    nests: dict[str, str] = field(default_factory=dict)  # span merged -> span of its row
    call_ids: dict[str, str] = field(default_factory=dict)  # tool call id -> span
    held: dict[str, StepRow] = field(default_factory=dict)  # pending steps by span id
    step: int = 0
    saw_model_call: bool = False
    numbered: dict[str, int] = field(default_factory=dict)  # step of each span mapped
    seen: float = 0.0  # clock() when a span of the trace was last mapped


class StepBuffer:
    """The steps one request maps, written to the :class:`MappedBatch` at the end so a
    later span of the request can still merge into a row (:meth:`update`)."""

    __slots__ = ("emitted", "out", "owners", "pending")

    def __init__(self, out: MappedBatch) -> None:
        self.out = out
        self.emitted: dict[str, StepRow] = {}  # final steps, by span id
        self.pending: dict[str, tuple[StepRow, str]] = {}  # held now, with the parent
        self.owners: set[str] = set()  # run ids that got a step in this request

    def release(self, state: TraceState, span_id: str, run_id: str) -> None:
        """Release held ``span_id`` as a final step of ``run_id``."""
        row = state.held.pop(span_id)
        self.emit(row if row.run_id == run_id else replace(row, run_id=run_id))
        self.out.released.add((row.trace_id, span_id))

    def emit(self, row: StepRow) -> None:
        """Add a final step."""
        self.emitted[row.span_id] = row
        self.owners.add(row.run_id)

    def hold(self, state: TraceState, row: StepRow, parent: str) -> None:
        """Hold a step as pending (its run is not known yet)."""
        state.held[row.span_id] = row
        self.pending[row.span_id] = (row, parent)

    def row(self, state: TraceState, span_id: str) -> StepRow | None:
        """The row of ``span_id`` if it can still change (held, or mapped now)."""
        return state.held.get(span_id) or self.emitted.get(span_id)

    def update(self, state: TraceState, span_id: str, row: StepRow) -> None:
        """Replace the row of ``span_id`` (held or mapped in this request)."""
        if span_id in state.held:
            state.held[span_id] = row
            if span_id in self.pending:
                self.pending[span_id] = (row, self.pending[span_id][1])
        elif span_id in self.emitted:
            self.emitted[span_id] = row

    def flush(self) -> None:
        """Write the request's steps to its :class:`MappedBatch`."""
        self.out.steps.extend(self.emitted.values())
        self.out.pending.extend(self.pending.values())


def nest_of(state: TraceState, span: SpanRecord, kind: int, batch: StepBuffer) -> str | None:
    """The span whose row ``span`` joins: the same call or turn seen through another
    span (a tool span directly in a tool span, or a model span in a model span, in
    either arrival order; a tool span with the call id of a tool span whose time holds
    it, or the other way); ``None`` for a new call or turn."""
    parent = span.parent_span_id
    if parent and state.kinds.get(parent) == kind:
        return state.nests.get(parent, parent)
    child = state.children.get((kind, span.span_id))
    if child is not None:
        return state.nests.get(child, child)
    if kind == _MODEL:
        # LlamaIndex nests a turn's model spans through its own wrapper spans.
        current = state.parents.get(parent, "") if parent else ""
        for _ in range(MAX_NEST_DEPTH):
            if not current or current in state.agents:
                break
            if state.kinds.get(current) == _MODEL:
                return state.nests.get(current, current)
            current = state.parents.get(current, "")
        return None
    call_id = tool_call_id(span.attributes)
    other = state.call_ids.get(call_id) if call_id else None
    if other is None:
        return None
    other = state.nests.get(other, other)
    row = batch.row(state, other)
    if row is None:
        return None
    inside = row.start_unix_nano <= span.start_unix_nano and span.end_unix_nano <= row.end_unix_nano
    around = span.start_unix_nano <= row.start_unix_nano and row.end_unix_nano <= span.end_unix_nano
    return other if inside or around else None


def merge_rows(kept: StepRow, other: StepRow) -> StepRow:
    """One call seen through two spans: ``kept``'s span key, run and step; each field
    from whichever span has it (``kept`` first); the wider time; an error if either
    failed."""
    failed = sc.OUTCOME_ERROR in (kept.outcome, other.outcome)
    return replace(
        kept,
        start_unix_nano=min(kept.start_unix_nano, other.start_unix_nano),
        end_unix_nano=max(kept.end_unix_nano, other.end_unix_nano),
        status_code=max(kept.status_code, other.status_code),
        tool=kept.tool or other.tool,
        tool_call_id=kept.tool_call_id or other.tool_call_id,
        outcome=sc.OUTCOME_ERROR if failed else kept.outcome,
        error_type=kept.error_type or other.error_type,
        agent=kept.agent or other.agent,
        arguments=kept.arguments if kept.arguments is not None else other.arguments,
        result=kept.result if kept.result is not None else other.result,
        input_tokens=kept.input_tokens if kept.input_tokens is not None else other.input_tokens,
        output_tokens=(
            kept.output_tokens if kept.output_tokens is not None else other.output_tokens
        ),
    )


def source_of(attrs: Attributes) -> str:
    """``openinference`` for a span with ``openinference.span.kind``, else ``genai``."""
    return SOURCE_OPENINFERENCE if sc.OPENINFERENCE_SPAN_KIND in attrs else SOURCE_GENAI


def resolve(state: TraceState, parent_span_id: str) -> str | None:
    """The run of the nearest agent span among ``parent_span_id`` and its known
    ancestors; ``None`` when no agent is known yet, or past :data:`MAX_ANCESTRY_DEPTH`."""
    current = parent_span_id
    for _ in range(MAX_ANCESTRY_DEPTH):
        if not current:
            return None
        if current in state.agents:
            return state.run_of.get(current, current)
        current = state.parents.get(current, "")
    return None


def stepless_run(state: TraceState) -> RunRow:
    """The one run of a trace whose agent spans made no call the tracer reports (CrewAI's
    tracers send no model or tool span): its outermost agent span, named by the first
    agent span an attribute names. No stop: a run with no step never counts one."""
    waiting = sorted(state.waiting.values(), key=lambda s: (s.start_unix_nano, s.span_id))
    named = (named_agent(s.attributes) for s in waiting)
    agent = next((n for n in named if n), None) or state.name_hint
    outer = waiting[0]
    source = source_of(outer.attributes)
    return agent_run_row(outer, outer.span_id, source, None, agent)


def agent_run_row(
    span: SpanRecord,
    run_id: str,
    source: str,
    parent_run_id: str | None,
    agent: str | None = None,
) -> RunRow:
    """The run row of an agent (or trace-level) run: ``agent`` given, else the span's agent name."""
    attrs = span.attributes
    return RunRow(
        run_id=run_id,
        trace_id=span.trace_id,
        span_id=span.span_id,
        source=source,
        is_run_span=True,
        agent=agent or agent_name(span),
        agent_id=_str(attrs, sc.GEN_AI_AGENT_ID),
        conversation_id=_str(attrs, sc.GEN_AI_CONVERSATION_ID),
        parent_run_id=parent_run_id,
        start_unix_nano=span.start_unix_nano,
        end_unix_nano=span.end_unix_nano,
        status_code=span.status_code,
    )


def inferred_stop(span: SpanRecord, run_id: str, source: str, step: int) -> StopRow:
    """The stop inferred from a run span's end: ``error`` when its status is ERROR, else
    ``completed``; ``step``: the trace's last step number."""
    return StopRow(
        trace_id=span.trace_id,
        span_id=span.span_id,
        run_id=run_id,
        source=source,
        origin=STOP_ORIGIN_INFERRED,
        reason=STOP_ERROR if span.status_code == STATUS_ERROR else STOP_COMPLETED,
        time_unix_nano=span.end_unix_nano,
        step=step or None,
        message=span.status_message or None,
    )


def step_row(span: SpanRecord, run_id: str, source: str, step: int, kind: int) -> StepRow:
    """The step row of a model span (``decision``) or a tool span (``tool_result``)."""
    attrs = span.attributes
    common: dict[str, Any] = {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "run_id": run_id,
        "source": source,
        "step": step,
        "start_unix_nano": span.start_unix_nano,
        "end_unix_nano": span.end_unix_nano,
        "status_code": span.status_code,
        "error_type": _str(attrs, sc.ERROR_TYPE),
    }
    if kind == _MODEL:
        return StepRow(
            kind=KIND_DECISION,
            input_tokens=input_tokens(attrs),
            output_tokens=output_tokens(attrs),
            **common,
        )
    return StepRow(
        kind=KIND_TOOL_RESULT,
        tool=tool_name(span),
        tool_call_id=tool_call_id(attrs),
        outcome=sc.OUTCOME_ERROR if tool_failed(span) else sc.OUTCOME_OK,
        agent=_str(attrs, sc.GEN_AI_AGENT_NAME),
        arguments=tool_arguments(attrs),
        result=tool_result(attrs),
        **common,
    )
