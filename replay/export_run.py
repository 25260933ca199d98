"""A stored run written back as an OTLP/JSON trace file: from incident to policy test.

The collector stores a run as rows (its run row, one row per decision and per tool
result, its stop). :func:`export_otlp_json` turns those rows back into the spans
loopwatch's instrumentation sent (DESIGN section 4: ``invoke_agent``, ``decide``,
``execute_tool`` and ``stop`` spans with their ``loopwatch.*`` and ``gen_ai.*``
attributes), as one ``ExportTraceServiceRequest`` in OTLP/JSON. ``loopwatch replay
FILE`` reads it back (:mod:`loopwatch.replay.importers.otlp_json`) and, under the
policy the run was stored with, stops it with the same reason at the same step: the
file is the incident as a regression test (``docs/policy.md``).

Input: the dict the collector's read API returns for ``GET /api/v1/runs/{id}`` (the
fields of :class:`loopwatch.collector.store.reader.RunDetail`: ``run``, ``steps``,
``stop``, ``evidence``), which is also what the dashboard's run view holds
(``RunData``: ``run``, ``steps`` as a DataFrame or a list of rows, ``stop``,
``evidence``). What was not stored is not invented: without captured content the
fingerprints and digests stand in for arguments and results (the importer compares
those); a run whose steps were not sampled exports its run and stop only (replay then
has nothing to feed the guard, and :class:`ExportError` says so unless
``allow_without_steps``).

Example::

    detail = httpx.get(f"{collector}/api/v1/runs/{run_id}").json()
    Path("incident.otlp.json").write_bytes(export_otlp_json(detail))
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from loopwatch.instrumentation import _semconv as sc

__all__ = ["EXPORT_SCOPE", "ExportError", "export_otlp_json", "export_spans"]

EXPORT_SCOPE: Final = "loopwatch.export"
"""Instrumentation scope name of the exported spans (says where the file came from)."""

_KIND_INTERNAL: Final = 1  # OTLP SpanKind SPAN_KIND_INTERNAL (DESIGN section 4)
_STATUS_ERROR: Final = 2


class ExportError(ValueError):
    """The run cannot be exported as a replayable file (message says why)."""


def _clean(value: Any) -> Any:
    """A stored value as a Python scalar: NaN / NaT / pandas NA are None."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and not isinstance(value, (str, bytes)):
        try:
            value = item()
        except (TypeError, ValueError):
            return None
        return _clean(value)
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    return value


def _rows(steps: Any) -> list[dict[str, Any]]:
    """Step rows as dicts, from a list of mappings or a DataFrame."""
    if steps is None:
        return []
    records = getattr(steps, "to_dict", None)
    if callable(records) and not isinstance(steps, Mapping):
        steps = records("records")
    return [{str(k): _clean(v) for k, v in dict(row).items()} for row in steps]


def _value(value: Any) -> dict[str, Any] | None:
    """An OTLP/JSON ``AnyValue`` (ints as decimal strings, as protobuf JSON writes int64)."""
    value = _clean(value)
    if value is None:
        return None
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (dict, list)):
        return {"stringValue": json.dumps(value, sort_keys=True, separators=(",", ":"))}
    return {"stringValue": str(value)}


def _attributes(pairs: Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for key, raw in pairs:
        value = _value(raw)
        if value is not None:
            out.append({"key": key, "value": value})
    return out


def _span_id(*parts: Any) -> str:
    """A stable 8-byte span id (hex) for a span the store kept no id of."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]


def _hex(value: Any, size: int) -> str | None:
    text = str(value or "").strip().lower()
    if len(text) == size and all(c in "0123456789abcdef" for c in text) and set(text) != {"0"}:
        return text
    return None


def _ns(*values: Any) -> int:
    for raw in values:
        value = _clean(raw)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return 0


def _span(
    ids: tuple[str, str, str | None],
    name: str,
    times: tuple[int, int],
    attributes: list[dict[str, Any]],
    *,
    error: bool = False,
) -> dict[str, Any]:
    """One OTLP/JSON span; ``ids`` = (trace id, span id, parent span id or None)."""
    trace_id, span_id, parent = ids
    start, end = times
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": _KIND_INTERNAL,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(max(end, start)),
        "attributes": attributes,
    }
    if parent:
        span["parentSpanId"] = parent
    if error:
        span["status"] = {"code": _STATUS_ERROR}
    return span


def export_spans(run: Mapping[str, Any], *, allow_without_steps: bool = False) -> dict[str, Any]:
    """The OTLP/JSON ``ExportTraceServiceRequest`` (a dict) of one stored run.

    Args:
        run: ``{"run": {...}, "steps": [...] or DataFrame, "stop": {...} or None,
            "evidence": {...}}`` as ``GET /api/v1/runs/{id}`` returns it (module
            docstring).
        allow_without_steps: export a run whose steps were not kept (not sampled):
            its run and stop spans only.

    Raises:
        ExportError: no ``run`` row, no ``run_id``, or no stored step (unless
            ``allow_without_steps``).
    """
    row = run.get("run")
    if not isinstance(row, Mapping) or not row.get("run_id"):
        raise ExportError("not a stored run: no 'run' row with a 'run_id'")
    row = {str(k): _clean(v) for k, v in row.items()}
    run_id = str(row["run_id"])
    steps = [s for s in _rows(run.get("steps")) if s.get("kind") in ("decision", "tool_result")]
    if not steps and not allow_without_steps:
        raise ExportError(
            f"run {run_id} has no stored steps (it was not sampled, or its steps were "
            "removed): the file would replay nothing"
        )
    stop = run.get("stop")
    stop = {str(k): _clean(v) for k, v in stop.items()} if isinstance(stop, Mapping) else None
    agent = str(row.get("agent") or "agent")
    trace_id = _hex(row.get("trace_id"), 32) or hashlib.sha256(run_id.encode()).hexdigest()[:32]
    root = _span_id("run", run_id)
    times = [_ns(s.get("start_unix_nano")) for s in steps] + [_ns(row.get("start_unix_nano"))]
    start = min((t for t in times if t), default=0)
    end = max(
        [_ns(row.get("end_unix_nano")), _ns((stop or {}).get("time_unix_nano"))]
        + [_ns(s.get("end_unix_nano")) for s in steps]
        + [start]
    )
    limits = row.get("limits")
    run_attrs: list[tuple[str, Any]] = [
        (sc.GEN_AI_OPERATION_NAME, sc.OP_INVOKE_AGENT),
        (sc.GEN_AI_AGENT_NAME, agent),
        (sc.GEN_AI_AGENT_ID, row.get("agent_id")),
        (sc.GEN_AI_CONVERSATION_ID, row.get("conversation_id")),
        (sc.LW_RUN_ID, run_id),
        (sc.LW_PARENT_RUN_ID, row.get("parent_run_id")),
        (sc.LW_POLICY_NAME, row.get("policy_name")),
        (sc.LW_POLICY_VERSION, row.get("policy_version")),
        (sc.LW_DETECTOR_VERSION, row.get("detector_version")),
        (sc.LW_MODE, row.get("mode")),
        (sc.LW_LIMITS, limits if isinstance(limits, Mapping) and limits else None),
    ]
    name = f"invoke_agent {agent}"
    spans = [_span((trace_id, root, None), name, (start, end), _attributes(run_attrs))]
    names = (trace_id, root, run_id, agent)
    for index, step in enumerate(steps):
        spans.append(_step_span(step, index, names))
    if stop is not None:
        spans.append(_stop_span(stop, run.get("evidence"), names, end))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes([("service.name", agent)])},
                "scopeSpans": [{"scope": {"name": EXPORT_SCOPE}, "spans": spans}],
            }
        ]
    }


def _step_span(
    step: Mapping[str, Any], index: int, names: tuple[str, str, str, str]
) -> dict[str, Any]:
    trace_id, root, run_id, agent = names
    span_id = _hex(step.get("span_id"), 16) or _span_id("step", run_id, index)
    start = _ns(step.get("start_unix_nano"))
    end = _ns(step.get("end_unix_nano"), start)
    common = [(sc.LW_RUN_ID, run_id), (sc.LW_STEP, step.get("step"))]
    if step.get("kind") == "decision":
        attrs = [
            (sc.LW_EVENT, sc.EVENT_DECISION),
            *common,
            (sc.LW_DECISION_TYPE, step.get("decision_type")),
            (sc.LW_DECISION_FINGERPRINT, step.get("decision_fingerprint")),
            (sc.GEN_AI_USAGE_INPUT_TOKENS, step.get("input_tokens")),
            (sc.GEN_AI_USAGE_OUTPUT_TOKENS, step.get("output_tokens")),
            (sc.LW_COST_USD, step.get("cost_usd")),
            (sc.LW_STEPS_SINCE_PROGRESS, step.get("steps_since_progress")),
        ]
        name = f"decide {agent}"
        return _span((trace_id, span_id, root), name, (start, end), _attributes(attrs))
    tool = str(step.get("tool") or "tool")
    progress = step.get("progress")
    attrs = [
        (sc.GEN_AI_OPERATION_NAME, sc.OP_EXECUTE_TOOL),
        (sc.GEN_AI_TOOL_NAME, tool),
        (sc.GEN_AI_TOOL_CALL_ID, step.get("tool_call_id")),
        (sc.LW_EVENT, sc.EVENT_TOOL_RESULT),
        *common,
        (sc.LW_ACTION_FINGERPRINT, step.get("action_fingerprint")),
        (sc.LW_OBSERVATION_DIGEST, step.get("observation_digest")),
        (sc.LW_TOOL_OUTCOME, step.get("outcome")),
        (sc.LW_TOOL_RISK, step.get("risk")),
        (sc.ERROR_TYPE, step.get("error_type")),
        (sc.LW_TOOL_BLOCKED_BY, step.get("blocked_by")),
        (sc.LW_TOOL_FAILURE_CLASS, step.get("failure_class")),
        (sc.LW_PROGRESS, bool(progress) if progress is not None else None),
        (sc.LW_STEPS_SINCE_PROGRESS, step.get("steps_since_progress")),
        (sc.LW_LOOP_RESPONSE, step.get("loop_response")),
        (sc.LW_LOOP_RUNG, step.get("loop_rung")),
        (sc.LW_LOOP_DETECTOR, step.get("loop_detector")),
        (sc.GEN_AI_TOOL_CALL_ARGUMENTS, step.get("arguments")),
        (sc.GEN_AI_TOOL_CALL_RESULT, step.get("result")),
    ]
    error = step.get("outcome") == "error"
    name = f"execute_tool {tool}"
    return _span((trace_id, span_id, root), name, (start, end), _attributes(attrs), error=error)


def _stop_span(
    stop: Mapping[str, Any], evidence: Any, names: tuple[str, str, str, str], end: int
) -> dict[str, Any]:
    trace_id, root, run_id, agent = names
    at = _ns(stop.get("time_unix_nano"), end)
    recorded = stop.get("evidence")
    if isinstance(evidence, Mapping) and evidence:
        recorded = evidence
    attrs = [
        (sc.LW_EVENT, sc.EVENT_STOP),
        (sc.LW_RUN_ID, run_id),
        (sc.LW_STEP, stop.get("step")),
        (sc.LW_STOP_REASON, stop.get("reason")),
        (sc.GEN_AI_AGENT_FINISH_REASON, stop.get("reason")),
        (sc.LW_STOP_DIMENSION, stop.get("dimension")),
        (sc.LW_STOP_LIMIT, stop.get("limit_value")),
        (sc.LW_STOP_OBSERVED, stop.get("observed")),
        (sc.LW_STOP_BASIS, stop.get("basis")),
        (sc.LW_STOP_EVIDENCE, recorded),
        (sc.LW_STOP_MESSAGE, stop.get("message")),
        (sc.LW_STEPS_SINCE_PROGRESS, stop.get("steps_since_progress")),
        (sc.LW_USAGE_MODEL_TURNS, stop.get("usage_model_turns")),
        (sc.LW_USAGE_TOOL_ATTEMPTS, stop.get("usage_tool_attempts")),
        (sc.LW_USAGE_TOOL_SUCCESSES, stop.get("usage_tool_successes")),
        (sc.LW_USAGE_TOKENS, stop.get("usage_tokens")),
        (sc.LW_USAGE_COST_USD, stop.get("usage_cost_usd")),
        (sc.LW_USAGE_ELAPSED_SECONDS, stop.get("usage_elapsed_seconds")),
        (sc.LW_OBSERVE_STOP_REASON, stop.get("observe_reason")),
        (sc.LW_OBSERVE_STOP_STEP, stop.get("observe_step")),
    ]
    span_id = _hex(stop.get("span_id"), 16) or _span_id("stop", run_id)
    return _span((trace_id, span_id, root), f"stop {agent}", (at, at), _attributes(attrs))


def export_otlp_json(run: Mapping[str, Any], *, allow_without_steps: bool = False) -> bytes:
    """The OTLP/JSON file (UTF-8 bytes, one JSON object) of one stored run.

    What the dashboard's "Export" button and ``loopwatch export`` write. ``loopwatch
    replay FILE`` reads it back with the same stop reason and step under the run's
    policy.

    Args:
        run: the stored run (see :func:`export_spans`).
        allow_without_steps: see :func:`export_spans`.

    Raises:
        ExportError: see :func:`export_spans`.
    """
    request = export_spans(run, allow_without_steps=allow_without_steps)
    return (json.dumps(request, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
