"""OTLP/JSON trace files: loopwatch's own spans, GenAI semconv and OpenInference.

Input: an ``ExportTraceServiceRequest`` in OTLP/JSON (``{"resourceSpans": [...]}``, the
OTLP specification's "JSON Protobuf Encoding": hex ``traceId``/``spanId``, 64-bit
integers as strings, ``SPAN_KIND_*``/``STATUS_CODE_*`` names or numbers), or JSON Lines
with one such request per line (what the OpenTelemetry Collector ``file`` exporter
writes). Attribute values (``stringValue``, ``intValue``, ``doubleValue``,
``boolValue``, ``arrayValue``, ``kvlistValue``, ``bytesValue``) become Python values.

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
* Any other trace is one run (``run_id`` is the trace id). Model-call spans
  (``gen_ai.operation.name`` ``chat`` / ``text_completion`` / ``generate_content``,
  OpenLLMetry ``llm.request.type``, ``openinference.span.kind=LLM``) are agent steps;
  their tool calls come from ``gen_ai.output.messages`` (GenAI semconv 1.38 JSON parts
  ``{type: "tool_call", id, name, arguments}``), from OpenInference's flattened
  ``llm.output_messages.<i>.message.tool_calls.<j>.tool_call.{id, function.name,
  function.arguments}``, or else from an OpenAI response in ``output.value``. Tool
  spans (``execute_tool``, ``openinference.span.kind=TOOL``) are the observations:
  matched to the model's call by ``gen_ai.tool.call.id`` (or ``tool_call.id``), else
  to the latest step's oldest unanswered call of the same name, else a step of their
  own; arguments and result from ``gen_ai.tool.call.arguments`` / ``.result`` or
  ``input.value`` / ``output.value``; a span status ``ERROR`` or an ``error.type`` is
  the error flag. The last model step without tool calls is ``final`` unless a span
  other than a tool span has status ``ERROR`` (a failed tool call is an observation,
  a failed model or agent span is a failed run); other text-only steps are ``message``. Third-party
  traces record no stop unless a span carries ``gen_ai.agent.finish_reason``.
* Recorded outcome: stop ``completed`` is ``success``, any other stop ``failure`` (the
  run did not reach a verified answer), no stop ``unknown``.
* Agent name: ``gen_ai.agent.name``, else OpenLLMetry's ``traceloop.workflow.name``,
  else the resource's ``service.name``, else ``otlp``.

A span of the wrong shape (not an object, no ``traceId``, attributes that are not
``{key, value}`` pairs) gives one :class:`ImportProblem` naming it
(``resourceSpans[0].scopeSpans[1].spans[4]``, prefixed ``line N:`` in JSON Lines) and
is left out; its trace is still read from its other spans. A trace with no model, tool
or loopwatch span gives a problem naming the trace.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from loopwatch.instrumentation import StopReason
from loopwatch.instrumentation import _semconv as sc
from loopwatch.replay.importers import Document
from loopwatch.replay.importers._calls import CallDraft, OpenCalls
from loopwatch.replay.importers._fields import (
    Malformed,
    finite_float,
    json_or_text,
    outcome_of,
    text_of,
)
from loopwatch.replay.importers._numbers import check_fits, describe_int
from loopwatch.replay.trajectory import (
    AGENT,
    DecisionKindName,
    ImportProblem,
    Outcome,
    Step,
    ToolCall,
    Trajectory,
)

__all__ = ["IMPORTER", "OtlpJsonImporter"]

_DECISIONS: Final = frozenset({"tool", "final", "refusal", "message"})
_MODEL_OPERATIONS: Final = frozenset({sc.OP_CHAT, "text_completion", "generate_content"})
_OPENLLMETRY_MODEL_TYPES: Final = frozenset({"chat", "completion"})
_OI_LLM: Final = "LLM"
_OI_TOOL: Final = "TOOL"
_STATUS_ERROR: Final = frozenset({2, "STATUS_CODE_ERROR"})
_TOOL_PREFIX: Final = sc.SPAN_TOOL.split("{", 1)[0]
_RUN_PREFIX: Final = sc.SPAN_RUN.split("{", 1)[0]
_MAX_VALUE_DEPTH: Final = 32
_MIN_INT64: Final = -(2**63)
_MAX_INT64: Final = 2**63 - 1
_OI_OUTPUT: Final = re.compile(
    re.escape(sc.OPENINFERENCE_LLM_OUTPUT_MESSAGES)
    + r"\.(\d+)\.message\.(?:tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)"
    r"|(content))$"
)

_AGENT_SPAN: Final = 1
_MODEL_SPAN: Final = 2
_TOOL_SPAN: Final = 3
_OTHER_SPAN: Final = 0


@dataclass(slots=True)
class _Span:
    where: str
    order: int
    trace_id: str
    span_id: str
    name: str
    start_ns: int | None
    end_ns: int | None
    error: bool
    attrs: dict[str, Any]
    resource: dict[str, Any]

    @property
    def start(self) -> float | None:
        return self.start_ns / 1e9 if self.start_ns is not None else None

    @property
    def end(self) -> float | None:
        return self.end_ns / 1e9 if self.end_ns is not None else None


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
        """Yield one trajectory per run and one problem per unreadable span or trace.

        Raises:
            ValueError: the file is neither an OTLP/JSON request nor JSON Lines of them.
        """
        source = str(doc.path)
        data = doc.json
        requests: list[tuple[str, Any]]
        if data is not None:
            if not _is_request(data):
                raise ValueError("not an OTLP/JSON ExportTraceServiceRequest (no resourceSpans)")
            requests = [("", data)]
        else:
            lines = doc.json_lines
            if not lines:
                raise ValueError("not JSON or JSON Lines")
            requests = [(f"line {n}: ", value) for n, value in lines]
        traces: dict[str, list[_Span]] = {}
        for prefix, request in requests:
            for item in _spans(request, prefix):
                if isinstance(item, _Span):
                    traces.setdefault(item.trace_id, []).append(item)
                else:
                    yield ImportProblem(source, item[0], item[1])
        seen: set[str] = set()
        for trace_id, spans in traces.items():
            for found in _trace_runs(source, trace_id, spans):
                out = found
                if isinstance(found, Trajectory):
                    if found.run_id in seen:  # one loopwatch run id in two traces
                        out = replace(found, run_id=f"{found.run_id}/trace={trace_id}")
                    seen.add(out.run_id)
                yield out


def _is_request(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("resourceSpans"), list)


def _spans(request: Any, prefix: str) -> Iterator[_Span | tuple[str, str]]:
    """Decoded spans of one request, or ``(record, message)`` for each bad one."""
    if not _is_request(request):
        error = getattr(request, "message", None)  # a JSON Lines line that did not parse
        message = f"not valid JSON: {error}" if isinstance(error, str) else None
        yield (prefix.rstrip(": ") or "file", message or "not an object with 'resourceSpans'")
        return
    order = 0
    for i, resource_spans in enumerate(request["resourceSpans"]):
        where_rs = f"{prefix}resourceSpans[{i}]"
        try:
            if not isinstance(resource_spans, dict):
                raise Malformed("not an object")
            resource = resource_spans.get("resource") or {}
            if not isinstance(resource, dict):
                raise Malformed("'resource' is not an object")
            resource_attrs = _attributes(resource.get("attributes"))
            scope_spans = _list(resource_spans.get("scopeSpans"), "scopeSpans")
        except Malformed as exc:
            yield (where_rs, str(exc))
            continue
        for j, scope in enumerate(scope_spans):
            where_ss = f"{where_rs}.scopeSpans[{j}]"
            if not isinstance(scope, dict):
                yield (where_ss, "not an object")
                continue
            try:
                spans = _list(scope.get("spans"), "spans")
            except Malformed as exc:
                yield (where_ss, str(exc))
                continue
            for k, raw in enumerate(spans):
                where = f"{where_ss}.spans[{k}]"
                try:
                    yield _span(raw, where, order, resource_attrs)
                except Malformed as exc:
                    yield (where, str(exc))
                order += 1


def _list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Malformed(f"'{name}' is not a list")
    return value


def _span(raw: Any, where: str, order: int, resource: dict[str, Any]) -> _Span:
    if not isinstance(raw, dict):
        raise Malformed("not an object")
    trace_id = raw.get("traceId")
    if not isinstance(trace_id, str) or not trace_id:
        raise Malformed("no traceId")
    span_id = raw.get("spanId")
    name = raw.get("name")
    status = raw.get("status")
    code = status.get("code") if isinstance(status, dict) else None
    return _Span(
        where=where,
        order=order,
        trace_id=trace_id.lower(),
        span_id=span_id.lower() if isinstance(span_id, str) else "",
        name=name if isinstance(name, str) else "",
        start_ns=_nanos(raw.get("startTimeUnixNano")),
        end_ns=_nanos(raw.get("endTimeUnixNano")),
        error=isinstance(code, int | str) and code in _STATUS_ERROR,
        attrs=_attributes(raw.get("attributes")),
        resource=resource,
    )


def _nanos(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, float) and math.isfinite(value):
        value = int(value)
    return value if isinstance(value, int) and 0 < value < 2**64 else None


def _attributes(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise Malformed("'attributes' is not a list")
    attrs: dict[str, Any] = {}
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise Malformed(f"attributes[{index}] is not a {{key, value}} pair")
        try:
            attrs[item["key"]] = _value(item.get("value"), 0)
        except Malformed as exc:
            raise Malformed(f"attributes[{index}] ({item['key']}): {exc}") from None
    return attrs


def _value(raw: Any, depth: int) -> Any:
    """One OTLP ``AnyValue``; unknown or too deeply nested values are ``None``."""
    if not isinstance(raw, dict) or depth > _MAX_VALUE_DEPTH:
        return None
    if "stringValue" in raw:
        value = raw["stringValue"]
        return value if isinstance(value, str) else None
    if "boolValue" in raw:
        value = raw["boolValue"]
        return value if isinstance(value, bool) else None
    if "intValue" in raw:
        value = raw["intValue"]
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                return None
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        if not _MIN_INT64 <= value <= _MAX_INT64:
            raise Malformed(f"intValue outside the 64-bit range, got {describe_int(value)}")
        return value
    if "doubleValue" in raw:
        value = raw["doubleValue"]
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            check_fits(value, "doubleValue", error=Malformed)
            return float(value)
        return float(value) if value in ("NaN", "Infinity", "-Infinity") else None
    if "arrayValue" in raw:
        array = raw["arrayValue"]
        values = array.get("values") if isinstance(array, dict) else None
        return [_value(v, depth + 1) for v in values] if isinstance(values, list) else []
    if "kvlistValue" in raw:
        kvlist = raw["kvlistValue"]
        values = kvlist.get("values") if isinstance(kvlist, dict) else None
        if not isinstance(values, list):
            return {}
        return {
            kv["key"]: _value(kv.get("value"), depth + 1)
            for kv in values
            if isinstance(kv, dict) and isinstance(kv.get("key"), str)
        }
    if "bytesValue" in raw:
        value = raw["bytesValue"]
        if not isinstance(value, str):
            return None
        try:
            return base64.b64decode(value, validate=True).hex()
        except (binascii.Error, ValueError):
            return None
    return None


def _trace_runs(
    source: str, trace_id: str, spans: list[_Span]
) -> Iterator[Trajectory | ImportProblem]:
    spans.sort(key=lambda s: (s.start_ns if s.start_ns is not None else 0, s.order))
    loopwatch: dict[str, list[_Span]] = {}
    for span in spans:
        run_id = span.attrs.get(sc.LW_RUN_ID)
        if isinstance(run_id, str) and run_id:
            loopwatch.setdefault(run_id, []).append(span)
    if loopwatch:
        model = _model(spans)
        for run_id, run_spans in loopwatch.items():
            yield _loopwatch_run(source, trace_id, run_id, run_spans, model)
        return
    yield from _third_party_run(source, trace_id, spans)


# --- loopwatch's own spans -------------------------------------------------------------


def _loopwatch_run(
    source: str, trace_id: str, run_id: str, spans: list[_Span], model: str | None
) -> Trajectory:
    run_span: _Span | None = None
    stop_span: _Span | None = None
    steps: dict[int, tuple[list[_Span], list[_Span]]] = {}
    current = 0
    for span in spans:
        event = span.attrs.get(sc.LW_EVENT)
        if event == sc.EVENT_STOP:
            stop_span = span
        elif event in (sc.EVENT_DECISION, sc.EVENT_TOOL_RESULT):
            step = _int(span.attrs.get(sc.LW_STEP))
            if step is None:
                step = current + 1 if event == sc.EVENT_DECISION or current == 0 else current
            current = max(current, step)
            decisions, tools = steps.setdefault(step, ([], []))
            (decisions if event == sc.EVENT_DECISION else tools).append(span)
        elif event is None and span.attrs.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_INVOKE_AGENT:
            run_span = span
    out: list[Step] = []
    for number in sorted(steps):
        decisions, tools = steps[number]
        decision_span = decisions[0] if decisions else None
        calls = tuple(_loopwatch_call(span) for span in tools)
        recorded = decision_span.attrs.get(sc.LW_DECISION_TYPE) if decision_span else None
        decision: DecisionKindName
        if isinstance(recorded, str) and recorded in _DECISIONS:
            decision = recorded
        else:
            decision = "tool" if calls else "message"
        first = decision_span or (tools[0] if tools else None)
        attrs = decision_span.attrs if decision_span else {}
        out.append(
            Step(
                index=len(out),
                actor=AGENT,
                decision=decision,
                tool_calls=calls,
                timestamp=first.start if first else None,
                input_tokens=_int(attrs.get(sc.GEN_AI_USAGE_INPUT_TOKENS)),
                output_tokens=_int(attrs.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)),
                cost_usd=finite_float(attrs.get(sc.LW_COST_USD)),
            )
        )
    stop = None
    for holder in (stop_span, run_span):
        if holder is not None and stop is None:
            stop = _str(holder.attrs.get(sc.LW_STOP_REASON)) or _str(
                holder.attrs.get(sc.GEN_AI_AGENT_FINISH_REASON)
            )
    agent = None
    for candidate in (run_span, *spans):
        if candidate is not None:
            agent = _str(candidate.attrs.get(sc.GEN_AI_AGENT_NAME))
            if agent:
                break
    if not agent and run_span is not None:
        agent = run_span.name.removeprefix(_RUN_PREFIX).strip() or None
    metadata: dict[str, Any] = {"trace_id": trace_id}
    if run_span is not None:
        for key in (sc.LW_POLICY_NAME, sc.LW_POLICY_VERSION, sc.LW_MODE, sc.LW_PARENT_RUN_ID):
            value = _str(run_span.attrs.get(key))
            if value:
                metadata[key] = value
    if stop_span is not None:
        observed = _str(stop_span.attrs.get(sc.LW_OBSERVE_STOP_REASON))
        if observed:
            metadata[sc.LW_OBSERVE_STOP_REASON] = observed
    return Trajectory(
        source=source,
        run_id=run_id,
        format=IMPORTER.name,
        steps=tuple(out),
        recorded_outcome=_outcome(stop),
        recorded_stop=stop,
        recorded_stop_kind="explicit" if stop else "inferred",
        agent=agent or _service_name(spans),
        model=model,
        metadata=metadata,
    )


def _loopwatch_call(span: _Span) -> ToolCall:
    attrs = span.attrs
    arguments: Any = json_or_text(attrs.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS))
    if arguments is None:
        fingerprint = _str(attrs.get(sc.LW_ACTION_FINGERPRINT))
        arguments = {sc.LW_ACTION_FINGERPRINT: fingerprint} if fingerprint else {}
    outcome = attrs.get(sc.LW_TOOL_OUTCOME)
    observation = text_of(attrs.get(sc.GEN_AI_TOOL_CALL_RESULT))
    if observation is None and outcome != sc.OUTCOME_BLOCKED:
        digest = _str(attrs.get(sc.LW_OBSERVATION_DIGEST))
        observation = f"{sc.LW_OBSERVATION_DIGEST}={digest}" if digest else None
    return ToolCall(
        name=_tool_name(span),
        arguments=arguments,
        observation=observation,
        error=outcome == sc.OUTCOME_ERROR or (outcome is None and span.error),
        call_id=_str(attrs.get(sc.GEN_AI_TOOL_CALL_ID)) or None,
        started_at=span.start,
        ended_at=span.end,
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
    source: str, trace_id: str, spans: list[_Span]
) -> Iterator[Trajectory | ImportProblem]:
    drafts: list[_Draft] = []
    by_id: OpenCalls[CallDraft] = OpenCalls()
    agent: str | None = None
    stop: str | None = None
    for span in spans:
        kind = _kind(span.attrs)
        stop = stop or _str(span.attrs.get(sc.GEN_AI_AGENT_FINISH_REASON))
        if kind == _AGENT_SPAN and agent is None:
            agent = _str(span.attrs.get(sc.GEN_AI_AGENT_NAME))
        elif kind == _MODEL_SPAN:
            draft, problem = _model_step(span)
            if problem:
                yield ImportProblem(source, span.where, problem)
            by_id.begin_turn()
            for call in draft.calls:
                by_id.add(call.call_id, call)
            drafts.append(draft)
        elif kind == _TOOL_SPAN:
            _tool_result(span, drafts, by_id)
    if not drafts:
        yield ImportProblem(source, f"trace {trace_id}", "no model-call, tool or agent step spans")
        return
    failed = any(span.error and _kind(span.attrs) != _TOOL_SPAN for span in spans)
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
    yield Trajectory(
        source=source,
        run_id=trace_id,
        format=IMPORTER.name,
        steps=tuple(steps),
        recorded_outcome=_outcome(stop),
        recorded_stop=stop,
        recorded_stop_kind="explicit" if stop else "inferred",
        agent=agent,
        model=_model(spans),
        metadata={"trace_id": trace_id},
    )


def _third_party_decision(draft: _Draft, *, is_last: bool) -> DecisionKindName:
    if draft.calls:
        return "tool"
    return "final" if is_last and draft.model_call else "message"


def _kind(attrs: Mapping[str, Any]) -> int:
    op = attrs.get(sc.GEN_AI_OPERATION_NAME)
    if op == sc.OP_INVOKE_AGENT:
        return _AGENT_SPAN
    if op == sc.OP_EXECUTE_TOOL:
        return _TOOL_SPAN
    if isinstance(op, str) and op in _MODEL_OPERATIONS:
        return _MODEL_SPAN
    oi = attrs.get(sc.OPENINFERENCE_SPAN_KIND)
    if isinstance(oi, str):
        oi = oi.upper()
        if oi == _OI_LLM:
            return _MODEL_SPAN
        if oi == _OI_TOOL:
            return _TOOL_SPAN
    request_type = attrs.get(sc.OPENLLMETRY_REQUEST_TYPE)
    if isinstance(request_type, str) and request_type in _OPENLLMETRY_MODEL_TYPES:
        return _MODEL_SPAN
    return _OTHER_SPAN


def _model_step(span: _Span) -> tuple[_Draft, str | None]:
    attrs = span.attrs
    draft = _Draft(
        model_call=True,
        text=None,
        timestamp=span.start,
        input_tokens=_int(attrs.get(sc.GEN_AI_USAGE_INPUT_TOKENS))
        or _int(attrs.get(sc.OPENINFERENCE_LLM_TOKEN_COUNT_PROMPT)),
        output_tokens=_int(attrs.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS))
        or _int(attrs.get(sc.OPENINFERENCE_LLM_TOKEN_COUNT_COMPLETION)),
    )
    problem: str | None = None
    if sc.GEN_AI_OUTPUT_MESSAGES in attrs:
        messages = json_or_text(attrs[sc.GEN_AI_OUTPUT_MESSAGES])
        if isinstance(messages, list):
            _genai_output(messages, draft)
        else:
            problem = f"{sc.GEN_AI_OUTPUT_MESSAGES} is not a JSON list; read as no tool calls"
    else:
        _openinference_output(attrs, draft)
        if not draft.calls and draft.text is None:
            _openai_response(attrs.get(sc.OPENINFERENCE_OUTPUT_VALUE), draft)
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
                    draft.calls.append(
                        CallDraft(
                            name, _arguments(part.get("arguments")), _str(part.get("id")) or None
                        )
                    )
            elif kind == "text" and isinstance(part.get("content"), str):
                texts.append(part["content"])
    draft.text = "\n".join(texts) if texts else None


def _openinference_output(attrs: Mapping[str, Any], draft: _Draft) -> None:
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
            if isinstance(value, str):
                texts[message] = value
        else:
            calls.setdefault((message, int(match[2])), {})[match[3]] = value
    for position in sorted(calls):
        fields = calls[position]
        name = fields.get("function.name")
        if isinstance(name, str) and name:
            call_id = _str(fields.get("id")) or None
            draft.calls.append(
                CallDraft(name, _arguments(fields.get("function.arguments")), call_id)
            )
    if texts:
        draft.text = "\n".join(texts[i] for i in sorted(texts))


def _openai_response(raw: Any, draft: _Draft) -> None:
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
            call_id = _str(item.get("id")) or None
            draft.calls.append(CallDraft(name, _arguments(function.get("arguments")), call_id))


def _tool_result(span: _Span, drafts: list[_Draft], by_id: OpenCalls[CallDraft]) -> None:
    attrs = span.attrs
    name = _tool_name(span)
    call_id = _str(attrs.get(sc.GEN_AI_TOOL_CALL_ID)) or _str(
        attrs.get(sc.OPENINFERENCE_TOOL_CALL_ID)
    )
    call = by_id.answer(call_id)
    if call is not None and call.answered:
        call = None
    if call is None and drafts and drafts[-1].model_call:
        call = next((c for c in drafts[-1].calls if not c.answered and c.name == name), None)
    if call is None:
        arguments = json_or_text(attrs.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS))
        if arguments is None:
            arguments = json_or_text(attrs.get(sc.OPENINFERENCE_INPUT_VALUE))
        call = CallDraft(name, {} if arguments is None else arguments, call_id or None)
        drafts.append(_Draft(model_call=False, text=None, timestamp=span.start, calls=[call]))
    result = text_of(attrs.get(sc.GEN_AI_TOOL_CALL_RESULT))
    if result is None:
        result = text_of(attrs.get(sc.OPENINFERENCE_OUTPUT_VALUE))
    call.answered = True
    call.observation = result
    call.error = span.error or attrs.get(sc.ERROR_TYPE) is not None
    call.started_at = span.start
    call.ended_at = span.end


# --- small readers ---------------------------------------------------------------------


def _tool_name(span: _Span) -> str:
    name = _str(span.attrs.get(sc.GEN_AI_TOOL_NAME)) or _str(
        span.attrs.get(sc.OPENINFERENCE_TOOL_NAME)
    )
    if name:
        return name
    stripped = span.name.removeprefix(_TOOL_PREFIX).strip()
    return stripped or "unknown_tool"


def _model(spans: list[_Span]) -> str | None:
    for key in (sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_RESPONSE_MODEL, sc.OPENINFERENCE_LLM_MODEL_NAME):
        found = _first(spans, key)
        if found:
            return found
    return None


def _first(spans: list[_Span], key: str) -> str | None:
    for span in spans:
        value = _str(span.attrs.get(key))
        if value:
            return value
    return None


def _service_name(spans: list[_Span]) -> str:
    for span in spans:
        value = _str(span.resource.get(sc.SERVICE_NAME))
        if value:
            return value
    return "otlp"


def _outcome(stop: str | None) -> Outcome:
    return outcome_of(None if stop is None else stop == StopReason.COMPLETED)


def _arguments(raw: Any) -> Any:
    if raw is None:
        return {}
    decoded = json_or_text(raw)
    return {} if decoded is None else decoded


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


IMPORTER: Final = OtlpJsonImporter()
