"""OTLP/JSON trace files: loopwatch's own spans, GenAI semconv and OpenInference.

Input: an ``ExportTraceServiceRequest`` in OTLP/JSON (``{"resourceSpans": [...]}``), or
JSON Lines with one such request per line (what the OpenTelemetry Collector ``file``
exporter writes). Each request is read by the collector's own reader,
:func:`loopwatch.collector.decode.decode_json`, and its spans are understood by
:mod:`loopwatch.collector.genai` (span roles, tool names, call ids, arguments, results,
tokens, agent names) and mapped by its map stage, so a file replays what the collector
would have stored: what the collector refuses is a problem here, and what it accepts is
read into the same runs and steps (issue 24: there is no second reader). This module
builds trajectories from the collector's rows; it parses no OTLP itself.

Runs:

* A trace holding loopwatch spans (``loopwatch.run.id``, DESIGN section 4) gives one
  :class:`Trajectory` per loopwatch run id (a child run is its own run). Each
  ``decide`` span (``loopwatch.event=decision``) is an agent step with its
  ``loopwatch.decision.type`` and usage; the ``execute_tool`` spans with the same
  ``loopwatch.step`` are its tool calls (``loopwatch.tool.outcome=error`` is the error
  flag; ``blocked`` calls are kept, with no observation: the model did ask for them).
  ``loopwatch.stop.reason`` of the ``stop`` span (or of the run span) is the recorded
  stop, ``explicit``. Other spans of such a trace (model calls of other
  instrumentations nested in decisions) only supply the model name. Content is
  opt-in in loopwatch, so when ``gen_ai.tool.call.arguments`` / ``.result`` were not
  captured the recorded ``loopwatch.action.fingerprint`` stands in for the arguments
  (``{"loopwatch.action.fingerprint": <sha256>}``) and ``loopwatch.observation.digest``
  for the observation (``"loopwatch.observation.digest=<sha256>"``): equal calls and
  equal results stay equal, which is all replay's detectors compare. A failed call's
  ``loopwatch.tool.failure_class`` is kept. Message fingerprints and progress seen only
  by its effect: :mod:`._loopwatch_spans`.
* Any other trace is read by the collector's own map stage
  (:class:`~loopwatch.collector.map.MapStage`, fed one request at a time as the
  collector is; steps still pending at the end of the file are released to their
  trace-level run, as the collector does after ``max_idle_seconds``): its runs are the
  trajectories (one per agent invocation: graph-node and ``create_agent`` spans and
  workflow wrappers are no runs), its step rows the steps (nested spans of one tool call
  are one call, nested model spans one turn, LangChain/OpenLLMetry content envelopes
  unwrapped), its run's agent name the trajectory's. ``run_id`` is the trace id when the
  trace holds one run, else ``<trace id>/run=<run id>``. What the rows do not carry is
  read from the spans: a model turn's text and the calls it asked for, from
  ``gen_ai.output.messages`` (GenAI semconv 1.38 JSON parts ``{type: "tool_call", id,
  name, arguments}``), from OpenInference's flattened
  ``llm.output_messages.<i>.message.tool_calls.<j>.tool_call.{id, function.name,
  function.arguments}``, or else from an OpenAI response in ``output.value``. Each tool
  row answers the call it matches by tool-call id, else the turn's oldest unanswered
  call of the same name, else is a call of its own; a requested call no tool span
  answered stays, with no observation. What the tracer did not record is a stand-in
  unlike any other (:data:`UNRECORDED`): the arguments of a call recorded with neither
  arguments nor result, the text of a turn recorded with neither text nor calls. The
  last model step without tool calls is
  ``final`` unless a span other than a tool span has status ``ERROR`` (a failed tool call
  is an observation, a failed model or agent span is a failed run); other text-only
  steps are ``message``. A run whose tracer reports no call (CrewAI) is a trajectory with
  no step. Third-party traces record no stop unless a span carries
  ``gen_ai.agent.finish_reason`` (the collector's inferred ``completed`` is not one).
* Recorded outcome: stop ``completed`` is ``success``, any other stop ``failure`` (the
  run did not reach a verified answer), no stop ``unknown``.
* Agent name: the collector's run's; for a trace-level run whose root names no agent
  by attribute, OpenLLMetry's ``traceloop.workflow.name`` on the root, or the resource's
  ``service.name`` when the root is a bare model or tool call (the collector keeps the
  root's span name there); ``otlp`` when nothing names one.

Problems: a request the collector refuses whole (not JSON, ``resourceSpans`` not an
array of objects...) is one :class:`ImportProblem` naming the file or ``line N``; a span
it refuses names the span's place (``resourceSpans[0].scopeSpans[1].spans[4]``,
prefixed ``line N:`` in JSON Lines) with the collector's message, and its trace is still
read from its other spans. A loopwatch span no row could be made of
(:func:`~loopwatch.collector.map.unmappable_reason`) is a problem naming
``span <span id>``. A trace the map stage makes no run of gives a problem naming the
trace, unless it only builds agents (``create_agent`` spans).

The collector's decoder module imports protobuf: without the collector extra, an
OTLP/JSON file is one problem saying ``pip install 'loopwatch[collector]'`` (the other
formats need no extra).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Final, cast

from loopwatch.collector import genai
from loopwatch.collector.errors import DecodeError
from loopwatch.collector.frameworks import is_final_answer, named_agent
from loopwatch.collector.map import MapStage, unmappable_reason
from loopwatch.collector.records import STATUS_ERROR, Attributes, SpanBatch, SpanRecord
from loopwatch.collector.rows import KIND_DECISION, KIND_TOOL_RESULT, MappedBatch, RunRow, StepRow
from loopwatch.instrumentation import DecisionType
from loopwatch.instrumentation import _semconv as sc
from loopwatch.replay.importers import Document
from loopwatch.replay.importers._calls import CallDraft, OpenCalls
from loopwatch.replay.importers._fields import json_or_text
from loopwatch.replay.importers._loopwatch_spans import (
    message_text,
    progress_turn,
    tool_progress,
)
from loopwatch.replay.trajectory import (
    AGENT,
    FAILURE,
    SUCCESS,
    UNKNOWN,
    DecisionKindName,
    ImportProblem,
    Outcome,
    Step,
    ToolCall,
    Trajectory,
)

__all__ = ["IMPORTER", "MSG_NO_STEPS", "UNRECORDED", "OtlpJsonImporter"]

COMPLETED: Final = "completed"
"""The loopwatch stop reason of a run that ended with a verified final answer."""

_DECISIONS: Final = frozenset(DecisionType)
_UNKNOWN_TOOL: Final = "unknown_tool"
_CREATE_AGENT: Final = "create_agent"
"""GenAI semconv ``gen_ai.operation.name`` of a span that builds an agent (no run)."""
MSG_NO_STEPS: Final = "no model-call, tool or agent step spans"
UNRECORDED: Final = "loopwatch.replay.unrecorded"
"""Stand-in key of what a tracer did not record: a tool call's arguments
``{UNRECORDED: <span id>}`` when neither its arguments nor its result were recorded, a
model turn's text ``"<UNRECORDED>=<span id>"`` when neither its text nor its calls were:
each is unlike every other, so replay's detectors judge no loop on what nobody saw."""
_MODEL_KEYS: Final = (
    sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_RESPONSE_MODEL,
    sc.OPENINFERENCE_LLM_MODEL_NAME,
)
_OI_OUTPUT: Final = re.compile(
    re.escape(sc.OPENINFERENCE_LLM_OUTPUT_MESSAGES)
    + r"\.(\d+)\.message\.(?:tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)"
    r"|(content))$"
)


class OtlpJsonImporter:
    """Reads OTLP/JSON trace exports (see the module docstring for the mapping).

    Example::

        doc = Document(path=Path("traces.json"), text=Path("traces.json").read_text())
        runs = [t for t in IMPORTER.read(doc) if isinstance(t, Trajectory)]
    """

    name = "otlp_json"

    def matches(self, doc: Document) -> bool:
        """A JSON object with a ``resourceSpans`` list, or JSON Lines of such objects."""
        data = doc.json
        if data is None:
            return _is_request(doc.first_json_line)
        return _is_request(data)

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]:
        """Yield one trajectory per run and one problem per refused request, span or trace.

        Raises:
            ValueError: the file is neither an OTLP/JSON request nor JSON Lines of them,
                or the collector extra (its protobuf decoder) is not installed.
        """
        source = str(doc.path)
        traces: dict[str, list[SpanRecord]] = {}
        requests: list[list[SpanRecord]] = []
        for record, text, refused in _requests(doc):
            if text is None:
                yield ImportProblem(source, record, refused)
                continue
            prefix = "" if record == "file" else f"{record}: "
            try:
                batch, rejected = _decode(text)
            except DecodeError as exc:
                yield ImportProblem(source, record, str(exc))
                continue
            for where, message in rejected:
                yield ImportProblem(source, prefix + where, message)
            kept: list[SpanRecord] = []
            for span in batch.spans:
                reason = unmappable_reason(span.attributes) if _is_loopwatch(span) else None
                if reason is not None:
                    yield ImportProblem(source, f"{prefix}span {span.span_id}", reason)
                else:
                    traces.setdefault(span.trace_id, []).append(span)
                    kept.append(span)
            requests.append(kept)
        loopwatch = {s.trace_id for spans in traces.values() for s in spans if _is_loopwatch(s)}
        # Third-party traces go through the collector's own map stage, request by
        # request: the runs, steps and agent names are the ones the collector stores.
        mapper = _Mapper()
        for kept in requests:
            mapper.feed([s for s in kept if s.trace_id not in loopwatch])
        by_run = mapper.end().by_run()
        seen: set[str] = set()
        for trace_id, spans in traces.items():
            if trace_id in loopwatch:
                found_runs = _loopwatch_runs(source, trace_id, spans)
            else:
                found_runs = _third_party_runs(source, trace_id, spans, by_run.get(trace_id, {}))
            for found in found_runs:
                yield _unique(found, seen, trace_id) if isinstance(found, Trajectory) else found


def _unique(found: Trajectory, seen: set[str], trace_id: str) -> Trajectory:
    if found.run_id in seen:  # one loopwatch run id in two traces
        found = replace(found, run_id=f"{found.run_id}/trace={trace_id}")
    seen.add(found.run_id)
    return found


def _decode(text: str) -> tuple[SpanBatch, list[tuple[str, str]]]:
    """One request through the collector's OTLP/JSON decoder: the batch, and each
    refusal as ``(where, message)``.

    Raises:
        DecodeError: the collector refuses the whole request.
        ValueError: the collector extra is not installed (the decoder's module imports
            protobuf).
    """
    try:
        from loopwatch.collector.decode import decode_json
    except ModuleNotFoundError as exc:
        raise ValueError(
            "reading OTLP/JSON needs the collector extra: "
            f"pip install 'loopwatch[collector]' ({exc.name})"
        ) from None
    rejected: list[tuple[str, str]] = []
    batch: SpanBatch = decode_json(text.encode("utf-8", "replace"), rejected_at=rejected)
    return batch, rejected


def _is_request(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("resourceSpans"), list)


def _requests(doc: Document) -> Iterator[tuple[str, str | None, str]]:
    """``(record, request text, "")`` per request, or ``(record, None, why)`` for a
    JSON Lines line that is not one; ``record`` is ``file`` or ``line N``."""
    data = doc.json
    if data is not None:
        if not _is_request(data):
            raise ValueError("not an OTLP/JSON ExportTraceServiceRequest (no resourceSpans)")
        yield "file", doc.text, ""
        return
    lines = doc.json_lines
    if not lines:
        raise ValueError("not JSON or JSON Lines")
    texts = doc.text.split("\n")
    for number, value in lines:
        record = f"line {number}"
        if _is_request(value):
            yield record, texts[number - 1], ""
        else:
            error = getattr(value, "message", None)  # a line that did not parse
            why = f"not valid JSON: {error}" if isinstance(error, str) else None
            yield record, None, why or "not an object with 'resourceSpans'"


def _seconds(unix_nano: int) -> float | None:
    return unix_nano / 1e9 if unix_nano > 0 else None


def _is_loopwatch(span: SpanRecord) -> bool:
    return sc.LW_EVENT in span.attributes or sc.LW_RUN_ID in span.attributes


def _loopwatch_runs(
    source: str, trace_id: str, spans: list[SpanRecord]
) -> Iterator[Trajectory | ImportProblem]:
    """One trajectory per loopwatch run id of a trace holding loopwatch spans; its other
    spans (model calls of other instrumentations nested in decisions) give the model."""
    spans.sort(key=lambda s: s.start_unix_nano)  # stable: request order breaks ties
    runs: dict[str, list[SpanRecord]] = {}
    for span in spans:
        run_id = genai.attr_str(span.attributes, sc.LW_RUN_ID)
        if run_id and _is_loopwatch(span):
            runs.setdefault(run_id, []).append(span)
    model = _model(spans)
    for run_id, run_spans in runs.items():
        yield _loopwatch_run(source, trace_id, run_id, run_spans, model)


# --- loopwatch's own spans -------------------------------------------------------------


def _loopwatch_run(
    source: str, trace_id: str, run_id: str, spans: list[SpanRecord], model: str | None
) -> Trajectory:
    run_span: SpanRecord | None = None
    stop_span: SpanRecord | None = None
    steps: dict[int, tuple[list[SpanRecord], list[SpanRecord]]] = {}
    current = 0
    for span in spans:
        attrs = span.attributes
        event = attrs.get(sc.LW_EVENT)
        if event == sc.EVENT_STOP:
            stop_span = span
        elif event in (sc.EVENT_DECISION, sc.EVENT_TOOL_RESULT):
            step = genai.attr_int(attrs, sc.LW_STEP)
            if step is None:
                step = current + 1 if event == sc.EVENT_DECISION or current == 0 else current
            current = max(current, step)
            decisions, tools = steps.setdefault(step, ([], []))
            (decisions if event == sc.EVENT_DECISION else tools).append(span)
        elif event is None and attrs.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_INVOKE_AGENT:
            run_span = span
    out: list[Step] = []
    explained = True  # progress before the first step tells nothing
    for number in sorted(steps):
        decisions, tools = steps[number]
        decision_span = decisions[0] if decisions else None
        if decision_span is not None and not explained:
            at = _seconds(decision_span.start_unix_nano)
            turn = progress_turn(len(out), number, decision_span.attributes, at)
            out.extend([turn] if turn is not None else [])
        explained = tool_progress(tools)
        calls = tuple(_loopwatch_call(span) for span in tools)
        attrs = decision_span.attributes if decision_span else {}
        recorded = genai.attr_str(attrs, sc.LW_DECISION_TYPE)
        decision: DecisionKindName
        if recorded in _DECISIONS:
            decision = cast("DecisionKindName", recorded)
        else:
            decision = "tool" if calls else "message"
        first = decision_span or (tools[0] if tools else None)
        out.append(
            Step(
                index=len(out),
                actor=AGENT,
                decision=decision,
                text=message_text(attrs) if decision == "message" else None,
                tool_calls=calls,
                timestamp=_seconds(first.start_unix_nano) if first else None,
                input_tokens=genai.tokens(attrs, sc.GEN_AI_USAGE_INPUT_TOKENS),
                output_tokens=genai.tokens(attrs, sc.GEN_AI_USAGE_OUTPUT_TOKENS),
                cost_usd=genai.attr_float(attrs, sc.LW_COST_USD),
            )
        )
    stop = None
    for holder in (stop_span, run_span):
        if holder is not None and stop is None:
            stop = genai.attr_str(holder.attributes, sc.LW_STOP_REASON) or genai.attr_str(
                holder.attributes, sc.GEN_AI_AGENT_FINISH_REASON
            )
    agent = _first((run_span, *spans), sc.GEN_AI_AGENT_NAME)
    if not agent and run_span is not None:
        agent = genai.agent_name(run_span)
    metadata: dict[str, Any] = {"trace_id": trace_id}
    if run_span is not None:
        for key in (sc.LW_POLICY_NAME, sc.LW_POLICY_VERSION, sc.LW_MODE, sc.LW_PARENT_RUN_ID):
            value = genai.attr_str(run_span.attributes, key)
            if value:
                metadata[key] = value
    if stop_span is not None:
        observed = genai.attr_str(stop_span.attributes, sc.LW_OBSERVE_STOP_REASON)
        if observed:
            metadata[sc.LW_OBSERVE_STOP_REASON] = observed
    agent = agent or _service_name(spans)
    return _trajectory(source, run_id, out, stop, agent=agent, model=model, metadata=metadata)


def _loopwatch_call(span: SpanRecord) -> ToolCall:
    attrs = span.attributes
    arguments: Any = json_or_text(genai.attr_text(attrs, sc.GEN_AI_TOOL_CALL_ARGUMENTS))
    if arguments is None:
        fingerprint = genai.attr_str(attrs, sc.LW_ACTION_FINGERPRINT)
        arguments = {sc.LW_ACTION_FINGERPRINT: fingerprint} if fingerprint else {}
    outcome = genai.attr_str(attrs, sc.LW_TOOL_OUTCOME)
    observation = genai.attr_text(attrs, sc.GEN_AI_TOOL_CALL_RESULT)
    if observation is None and outcome != sc.OUTCOME_BLOCKED:
        digest = genai.attr_str(attrs, sc.LW_OBSERVATION_DIGEST)
        observation = f"{sc.LW_OBSERVATION_DIGEST}={digest}" if digest else None
    return ToolCall(
        name=genai.tool_name(span) or _UNKNOWN_TOOL,
        arguments=arguments,
        observation=observation,
        error=outcome == sc.OUTCOME_ERROR or (outcome is None and span.status_code == STATUS_ERROR),
        call_id=genai.tool_call_id(attrs),
        started_at=_seconds(span.start_unix_nano),
        ended_at=_seconds(span.end_unix_nano),
        failure_class=genai.attr_str(attrs, sc.LW_TOOL_FAILURE_CLASS),
    )


# --- GenAI semconv / OpenInference / OpenLLMetry ---------------------------------------


@dataclass
class _Draft:
    model_call: bool
    text: str | None
    timestamp: float | None
    input_tokens: int | None = None
    output_tokens: int | None = None
    calls: list[CallDraft] = field(default_factory=list)


@dataclass
class _Rows:
    """What the collector's map stage made of a file's third-party spans: run rows by
    run id, and each step's final row by span key (a released pending row replaces it)."""

    runs: dict[str, RunRow] = field(default_factory=dict)
    steps: dict[tuple[str, str], StepRow] = field(default_factory=dict)

    def by_run(self) -> dict[str, dict[str, tuple[RunRow | None, list[StepRow]]]]:
        """Trace id -> run id -> (its run row, if the stage made one; its step rows), in
        the order the stage made the runs, then the order of steps with no run row."""
        out: dict[str, dict[str, tuple[RunRow | None, list[StepRow]]]] = {}
        for run in self.runs.values():
            out.setdefault(run.trace_id, {})[run.run_id] = (run, [])
        for row in self.steps.values():
            trace = out.setdefault(row.trace_id, {})
            trace.setdefault(row.run_id, (None, []))[1].append(row)
        return out

    def add(self, mapped: MappedBatch) -> None:
        for run in mapped.runs:
            self.runs.setdefault(run.run_id, run)
        for step in mapped.steps:
            self.steps[(step.trace_id, step.span_id)] = step
        for step, _parent in mapped.pending:
            self.steps.setdefault((step.trace_id, step.span_id), step)


class _Mapper:
    """The collector's :class:`~loopwatch.collector.map.MapStage`, fed one request at a
    time as the collector is, then told the file is over: every step still pending (its
    agent span never came) is released to its trace-level run, as the collector does
    after ``max_idle_seconds``."""

    def __init__(self) -> None:
        self._now = 0.0
        self._stage = MapStage(clock=lambda: self._now)
        self.rows = _Rows()

    def feed(self, spans: list[SpanRecord]) -> None:
        if spans:
            self.rows.add(self._stage.process(SpanBatch(spans=spans)))

    def end(self) -> _Rows:
        self._now = math.inf
        self.rows.add(self._stage.process(SpanBatch(spans=[])))
        return self.rows


def _third_party_runs(
    source: str,
    trace_id: str,
    spans: list[SpanRecord],
    runs: dict[str, tuple[RunRow | None, list[StepRow]]],
) -> Iterator[Trajectory | ImportProblem]:
    """One trajectory per run the map stage made of a trace (``run_id`` the trace id when
    it made one, else ``<trace id>/run=<run id>``); a problem for a trace that made none,
    unless it only built agents (``create_agent``: AutoGen's and LangGraph's)."""
    if not runs:
        if not all(s.attributes.get(sc.GEN_AI_OPERATION_NAME) == _CREATE_AGENT for s in spans):
            yield ImportProblem(source, f"trace {trace_id}", MSG_NO_STEPS)
        return
    context = _TraceContext(spans)
    for run_id, (run, rows) in runs.items():
        name = trace_id if len(runs) == 1 else f"{trace_id}/run={run_id}"
        yield from _third_party_run(
            source, name, trace_id=trace_id, run=run, rows=rows, context=context
        )


class _TraceContext:
    """The spans of one third-party trace, for what the map stage's rows do not carry:
    the model's text and the calls it asked for, the recorded stop, the model name."""

    def __init__(self, spans: list[SpanRecord]) -> None:
        spans.sort(key=lambda s: s.start_unix_nano)  # stable: request order breaks ties
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}
        self.children: dict[str, list[SpanRecord]] = {}
        for span in spans:
            self.children.setdefault(span.parent_span_id, []).append(span)
        self.stop: str | None = _first(spans, sc.GEN_AI_AGENT_FINISH_REASON)
        # A failed tool call is an observation; a failed model or agent span a failed run.
        self.failed = any(
            s.status_code == STATUS_ERROR and _role(s) != genai.ROLE_TOOL for s in spans
        )
        self.model = _model(spans)
        # smolagents answers through a tool: the model asks for ``final_answer``; that is
        # the run's answer, not a call (the map stage drops its tool span the same way).
        self.answer_tools = {
            str(s.attributes.get(sc.OPENINFERENCE_TOOL_NAME))
            for s in spans
            if is_final_answer(s.name, s.attributes)
        }

    def model_output(self, span_id: str) -> tuple[_Draft | None, str | None]:
        """The output of the model turn whose row is ``span_id``: that span's, else the
        first model span nested under it that has one (the map stage keeps the outer
        span of a turn seen through several)."""
        todo = [span_id]
        visited: set[str] = set()  # a file may link spans in a cycle
        first: tuple[_Draft | None, str | None] = (None, None)
        while todo:
            current = todo.pop()
            span = self.by_id.get(current)
            if span is None or current in visited:
                continue
            visited.add(current)
            if _role(span) == genai.ROLE_MODEL:
                draft, problem = _model_step(span)
                if draft.calls or draft.text is not None or problem:
                    return draft, problem
                first = first if first[0] is not None else (draft, problem)
            todo.extend(reversed([c.span_id for c in self.children.get(span.span_id, [])]))
        return first


def _third_party_run(
    source: str,
    run_id: str,
    *,
    trace_id: str,
    run: RunRow | None,
    rows: list[StepRow],
    context: _TraceContext,
) -> Iterator[Trajectory | ImportProblem]:
    numbered: dict[int, list[StepRow]] = {}
    for row in sorted(rows, key=lambda r: (r.step or 0, r.start_unix_nano)):
        numbered.setdefault(row.step or 0, []).append(row)
    drafts: list[_Draft] = []
    for step_rows in numbered.values():
        decisions = [r for r in step_rows if r.kind == KIND_DECISION]
        draft = _Draft(model_call=bool(decisions), text=None, timestamp=None)
        if decisions:
            output, problem = context.model_output(decisions[0].span_id)
            if problem:
                yield ImportProblem(source, f"span {decisions[0].span_id}", problem)
            if output is not None:
                draft.text = output.text
                draft.calls = [c for c in output.calls if c.name not in context.answer_tools]
            draft.input_tokens = decisions[0].input_tokens
            draft.output_tokens = decisions[0].output_tokens
        by_id: OpenCalls[CallDraft] = OpenCalls()
        by_id.begin_turn()
        for call in draft.calls:
            by_id.add(call.call_id, call)
        for row in step_rows:
            if row.kind == KIND_TOOL_RESULT:
                _tool_result(row, draft, by_id)
        if decisions and draft.text is None and not draft.calls:
            # The tracer recorded no output of the turn (OpenLLMetry's LlamaIndex spans):
            # equal unknowns are no repeated decision.
            draft.text = f"{UNRECORDED}={decisions[0].span_id}"
        draft.timestamp = _seconds(min(r.start_unix_nano for r in step_rows))
        drafts.append(draft)
    last = drafts[-1] if drafts else None
    steps = [
        Step(
            index=i,
            actor=AGENT,
            decision=_third_party_decision(d, is_last=d is last and not context.failed),
            text=d.text,
            tool_calls=tuple(c.recorded() for c in d.calls),
            timestamp=d.timestamp,
            input_tokens=d.input_tokens,
            output_tokens=d.output_tokens,
        )
        for i, d in enumerate(drafts)
    ]
    agent = _run_agent(run, context)
    metadata: dict[str, Any] = {"trace_id": trace_id}
    if run is not None and run.parent_run_id:
        metadata["parent_run_id"] = run.parent_run_id
    yield _trajectory(
        source, run_id, steps, context.stop, agent=agent, model=context.model, metadata=metadata
    )


def _role(span: SpanRecord) -> int:
    return genai.span_role(span.attributes, span.name)


def _run_agent(run: RunRow | None, context: _TraceContext) -> str:
    """The collector's name for the run; for a trace-level run (no agent span) whose root
    names no agent by attribute, OpenLLMetry's workflow name when the root carries one
    (the collector keeps the span name, ``support_triage.workflow``), and the service
    when the root is a bare model or tool call (the collector keeps its span name, e.g.
    ``ChatCompletion``, which names no agent)."""
    if run is None or not run.agent:
        return _fallback_agent(context.spans)
    root = context.by_id.get(run.span_id)
    if run.run_id != run.trace_id or root is None or named_agent(root.attributes):
        return run.agent
    workflow = genai.attr_str(root.attributes, sc.OPENLLMETRY_WORKFLOW_NAME)
    if workflow:
        return workflow
    if _role(root) in (genai.ROLE_MODEL, genai.ROLE_TOOL):
        return _service_name(context.spans)
    return run.agent


def _fallback_agent(spans: list[SpanRecord]) -> str:
    """The name of a run the map stage made no run row for (its steps were released to
    the trace at the end of the file): OpenLLMetry's workflow name, else the service."""
    return _first(spans, sc.OPENLLMETRY_WORKFLOW_NAME) or _service_name(spans)


def _third_party_decision(draft: _Draft, *, is_last: bool) -> DecisionKindName:
    if draft.calls:
        return "tool"
    return "final" if is_last and draft.model_call else "message"


def _model_step(span: SpanRecord) -> tuple[_Draft, str | None]:
    attrs = span.attributes
    draft = _Draft(
        model_call=True,
        text=None,
        timestamp=_seconds(span.start_unix_nano),
        input_tokens=genai.input_tokens(attrs),
        output_tokens=genai.output_tokens(attrs),
    )
    problem: str | None = None
    if sc.GEN_AI_OUTPUT_MESSAGES in attrs:
        messages = json_or_text(genai.attr_text(attrs, sc.GEN_AI_OUTPUT_MESSAGES))
        if isinstance(messages, list):
            _genai_output(messages, draft)
        else:
            problem = f"{sc.GEN_AI_OUTPUT_MESSAGES} is not a JSON list; read as no tool calls"
    else:
        _openinference_output(attrs, draft)
        if not draft.calls and draft.text is None:
            _openai_response(genai.attr_text(attrs, sc.OPENINFERENCE_OUTPUT_VALUE), draft)
    return draft, problem


def _genai_output(messages: list[Any], draft: _Draft) -> None:
    texts: list[str] = []
    for message in messages:
        parts = message.get("parts") if isinstance(message, dict) else None
        if not isinstance(parts, list):
            continue
        for part in parts:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "tool_call":
                name = part.get("name")
                if isinstance(name, str) and name:
                    call_id = _id(part.get("id"))
                    draft.calls.append(CallDraft(name, _arguments(part.get("arguments")), call_id))
            elif kind == "text" and isinstance(part.get("content"), str):
                texts.append(part["content"])
    draft.text = "\n".join(texts) if texts else None


def _openinference_output(attrs: Attributes, draft: _Draft) -> None:
    calls: dict[tuple[int, int], dict[str, Any]] = {}
    texts: dict[int, str] = {}
    for key, value in attrs.items():
        if not key.startswith(sc.OPENINFERENCE_LLM_OUTPUT_MESSAGES):
            continue
        match = _OI_OUTPUT.match(key)
        if match is None:
            continue
        message = int(match[1])
        if match[4]:
            text = genai.attr_str(attrs, key)
            if text is not None:
                texts[message] = text
        else:
            # Arguments stay as recorded (JSON text or a map); names and ids read as text.
            kept = value if match[3] == "function.arguments" else genai.attr_str(attrs, key)
            calls.setdefault((message, int(match[2])), {})[match[3]] = kept
    for position in sorted(calls):
        fields = calls[position]
        name = fields.get("function.name")
        if name:
            arguments = _arguments(fields.get("function.arguments"))
            draft.calls.append(CallDraft(name, arguments, fields.get("id") or None))
    if texts:
        draft.text = "\n".join(texts[i] for i in sorted(texts))


def _openai_response(raw: str | None, draft: _Draft) -> None:
    """Tool calls from an OpenAI Chat Completions response body in ``output.value``."""
    body = json_or_text(raw)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return
    content = message.get("content")
    draft.text = content if isinstance(content, str) else None
    tool_calls = message.get("tool_calls")
    for item in tool_calls if isinstance(tool_calls, list) else []:
        function = item.get("function") if isinstance(item, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(function, dict) and isinstance(name, str) and name:
            arguments = _arguments(function.get("arguments"))
            draft.calls.append(CallDraft(name, arguments, _id(item.get("id"))))


def _tool_result(row: StepRow, draft: _Draft, by_id: OpenCalls[CallDraft]) -> None:
    """The map stage's row of one tool call (nested spans of the call already merged,
    content envelopes unwrapped) answers the call the model asked for: by tool-call id,
    else the oldest unanswered call of the same name in its turn; else it is a call of
    its own (a tracer that records no model output, or no model span)."""
    name = row.tool or _UNKNOWN_TOOL
    call = by_id.answer(row.tool_call_id)
    if call is not None and call.answered:
        call = None
    if call is None:
        call = next((c for c in draft.calls if not c.answered and c.name == name), None)
    if call is None:
        arguments = json_or_text(row.arguments)
        if arguments is None and row.result is None:
            # Nothing of the call was recorded (AutoGen's own spans): not comparable with
            # another call, as the collector judges no call without content.
            arguments = {UNRECORDED: row.span_id}
        call = CallDraft(name, {} if arguments is None else arguments, row.tool_call_id)
        draft.calls.append(call)
    call.answered = True
    call.observation = row.result
    call.error = row.outcome == sc.OUTCOME_ERROR
    call.started_at = _seconds(row.start_unix_nano)
    call.ended_at = _seconds(row.end_unix_nano)


# --- small readers ---------------------------------------------------------------------


def _model(spans: list[SpanRecord]) -> str | None:
    for key in _MODEL_KEYS:
        found = _first(spans, key)
        if found:
            return found
    return None


def _first(spans: tuple[SpanRecord | None, ...] | list[SpanRecord], key: str) -> str | None:
    """The first non-empty text value of ``key`` over ``spans`` (``None`` entries skipped)."""
    for span in spans:
        value: str | None = genai.attr_str(span.attributes, key) if span is not None else None
        if value:
            return value
    return None


def _service_name(spans: list[SpanRecord]) -> str:
    for span in spans:
        value: str | None = genai.attr_str(span.resource.attributes, sc.SERVICE_NAME)
        if value:
            return value
    return "otlp"


def _trajectory(
    source: str,
    run_id: str,
    steps: list[Step],
    stop: str | None,
    *,
    agent: str,
    model: str | None,
    metadata: dict[str, Any],
) -> Trajectory:
    """A run with its recorded stop: ``completed`` is a success, any other stop a failure
    (no verified answer), no stop unknown (and the stop kind inferred)."""
    outcome: Outcome = UNKNOWN if stop is None else SUCCESS if stop == COMPLETED else FAILURE
    return Trajectory(
        source=source,
        run_id=run_id,
        format=IMPORTER.name,
        steps=tuple(steps),
        recorded_outcome=outcome,
        recorded_stop=stop,
        recorded_stop_kind="explicit" if stop else "inferred",
        agent=agent,
        model=model,
        metadata=metadata,
    )


def _id(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _arguments(raw: Any) -> Any:
    if raw is None:
        return {}
    decoded = json_or_text(raw)
    return {} if decoded is None else decoded


IMPORTER: Final = OtlpJsonImporter()
