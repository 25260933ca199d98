"""OTLP/JSON trace files: loopwatch's own spans, GenAI semconv and OpenInference.

Input: an ``ExportTraceServiceRequest`` in OTLP/JSON (``{"resourceSpans": [...]}``), or
JSON Lines with one such request per line (what the OpenTelemetry Collector ``file``
exporter writes). Each request is read by the collector's own reader,
:func:`loopwatch.collector.decode.decode_json`, and its spans are understood by
:mod:`loopwatch.collector.genai` (span roles, tool names, call ids, arguments, results,
tokens, agent names), so a file replays what the collector would have stored: what the
collector refuses is a problem here, and what it accepts is read. This module builds
trajectories from the decoded spans; it parses no OTLP itself.

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
  equal results stay equal, which is all replay's detectors compare.
* Any other trace is one run (``run_id`` is the trace id). Model-call spans are agent
  steps; their tool calls come from ``gen_ai.output.messages`` (GenAI semconv 1.38 JSON
  parts ``{type: "tool_call", id, name, arguments}``), from OpenInference's flattened
  ``llm.output_messages.<i>.message.tool_calls.<j>.tool_call.{id, function.name,
  function.arguments}``, or else from an OpenAI response in ``output.value``. Tool
  spans are the observations: matched to the model's call by tool-call id, else to the
  latest step's oldest unanswered call of the same name, else a step of their own. The
  last model step without tool calls is ``final`` unless a span other than a tool span
  has status ``ERROR`` (a failed tool call is an observation, a failed model or agent
  span is a failed run); other text-only steps are ``message``. Third-party traces
  record no stop unless a span carries ``gen_ai.agent.finish_reason``.
* Recorded outcome: stop ``completed`` is ``success``, any other stop ``failure`` (the
  run did not reach a verified answer), no stop ``unknown``.
* Agent name: the first agent span's (:func:`~loopwatch.collector.genai.agent_name`),
  else OpenLLMetry's ``traceloop.workflow.name``, else the resource's ``service.name``,
  else ``otlp``.

Problems: a request the collector refuses whole (not JSON, ``resourceSpans`` not an
array of objects...) is one :class:`ImportProblem` naming the file or ``line N``; a span
it refuses names the span's place (``resourceSpans[0].scopeSpans[1].spans[4]``,
prefixed ``line N:`` in JSON Lines) with the collector's message, and its trace is still
read from its other spans. A loopwatch span no row could be made of
(:func:`~loopwatch.collector.map.unmappable_reason`) is a problem naming
``span <span id>``. A trace with no model, tool or agent step span gives a problem naming
the trace.

The collector's decoder module imports protobuf: without the collector extra, an
OTLP/JSON file is one problem saying ``pip install 'loopwatch[collector]'`` (the other
formats need no extra).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Final, cast

from loopwatch.collector import genai
from loopwatch.collector.errors import DecodeError
from loopwatch.collector.map import unmappable_reason
from loopwatch.collector.records import STATUS_ERROR, Attributes, SpanBatch, SpanRecord
from loopwatch.instrumentation import DecisionType
from loopwatch.instrumentation import _semconv as sc
from loopwatch.replay.importers import Document
from loopwatch.replay.importers._calls import CallDraft, OpenCalls
from loopwatch.replay.importers._fields import json_or_text
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

__all__ = ["IMPORTER", "OtlpJsonImporter"]

COMPLETED: Final = "completed"
"""The loopwatch stop reason of a run that ended with a verified final answer."""

_DECISIONS: Final = frozenset(DecisionType)
_UNKNOWN_TOOL: Final = "unknown_tool"
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
            for span in batch.spans:
                reason = unmappable_reason(span.attributes) if _is_loopwatch(span) else None
                if reason is not None:
                    yield ImportProblem(source, f"{prefix}span {span.span_id}", reason)
                else:
                    traces.setdefault(span.trace_id, []).append(span)
        seen: set[str] = set()
        for trace_id, spans in traces.items():
            for found in _trace_runs(source, trace_id, spans):
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


def _trace_runs(
    source: str, trace_id: str, spans: list[SpanRecord]
) -> Iterator[Trajectory | ImportProblem]:
    spans.sort(key=lambda s: s.start_unix_nano)  # stable: request order breaks ties
    loopwatch: dict[str, list[SpanRecord]] = {}
    for span in spans:
        run_id = genai.attr_str(span.attributes, sc.LW_RUN_ID)
        if run_id and _is_loopwatch(span):
            loopwatch.setdefault(run_id, []).append(span)
    if loopwatch:
        model = _model(spans)
        for run_id, run_spans in loopwatch.items():
            yield _loopwatch_run(source, trace_id, run_id, run_spans, model)
        return
    yield from _third_party_run(source, trace_id, spans)


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
    for number in sorted(steps):
        decisions, tools = steps[number]
        decision_span = decisions[0] if decisions else None
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


def _third_party_run(
    source: str, trace_id: str, spans: list[SpanRecord]
) -> Iterator[Trajectory | ImportProblem]:
    drafts: list[_Draft] = []
    by_id: OpenCalls[CallDraft] = OpenCalls()
    agent: str | None = None
    stop: str | None = None
    failed = False
    for span in spans:
        role = genai.span_role(span.attributes)
        stop = stop or genai.attr_str(span.attributes, sc.GEN_AI_AGENT_FINISH_REASON)
        failed = failed or (span.status_code == STATUS_ERROR and role != genai.ROLE_TOOL)
        if role == genai.ROLE_AGENT and agent is None:
            agent = genai.agent_name(span)
        elif role == genai.ROLE_MODEL:
            draft, problem = _model_step(span)
            if problem:
                yield ImportProblem(source, f"span {span.span_id}", problem)
            by_id.begin_turn()
            for call in draft.calls:
                by_id.add(call.call_id, call)
            drafts.append(draft)
        elif role == genai.ROLE_TOOL:
            _tool_result(span, drafts, by_id)
    if not drafts:
        yield ImportProblem(source, f"trace {trace_id}", "no model-call, tool or agent step spans")
        return
    last = drafts[-1]
    steps = [
        Step(
            index=i,
            actor=AGENT,
            decision=_third_party_decision(d, is_last=d is last and not failed),
            text=d.text,
            tool_calls=tuple(c.recorded() for c in d.calls),
            timestamp=d.timestamp,
            input_tokens=d.input_tokens,
            output_tokens=d.output_tokens,
        )
        for i, d in enumerate(drafts)
    ]
    agent = agent or _first(spans, sc.OPENLLMETRY_WORKFLOW_NAME) or _service_name(spans)
    metadata = {"trace_id": trace_id}
    yield _trajectory(
        source, trace_id, steps, stop, agent=agent, model=_model(spans), metadata=metadata
    )


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


def _tool_result(span: SpanRecord, drafts: list[_Draft], by_id: OpenCalls[CallDraft]) -> None:
    attrs = span.attributes
    name = genai.tool_name(span) or _UNKNOWN_TOOL
    call_id = genai.tool_call_id(attrs)
    call = by_id.answer(call_id)
    if call is not None and call.answered:
        call = None
    if call is None and drafts and drafts[-1].model_call:
        call = next((c for c in drafts[-1].calls if not c.answered and c.name == name), None)
    if call is None:
        arguments = json_or_text(genai.tool_arguments(attrs))
        call = CallDraft(name, {} if arguments is None else arguments, call_id)
        start = _seconds(span.start_unix_nano)
        drafts.append(_Draft(model_call=False, text=None, timestamp=start, calls=[call]))
    call.answered = True
    call.observation = genai.tool_result(attrs)
    call.error = genai.tool_failed(span)
    call.started_at = _seconds(span.start_unix_nano)
    call.ended_at = _seconds(span.end_unix_nano)


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
