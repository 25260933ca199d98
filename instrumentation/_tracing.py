"""Span emission for a run: the wire format of DESIGN section 4.

Uses the OpenTelemetry *API* only; with no SDK installed every call is a cheap no-op. No
call here raises into the agent: a failure is logged once at debug level and counted
(:func:`telemetry_drops`), because telemetry failure is not a stop (STYLE rule 2).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from . import _semconv as sc
from .budgets import usage_cost, usage_tokens
from .guard import Guard
from .ladder import MAX_NUDGES
from .outcomes import Decision, DecisionType, Outcome, Stop, ToolRecord, ToolTicket

__all__ = ["RunTelemetry", "telemetry_drops"]

_log = logging.getLogger("loopwatch.instrumentation")
_drops = 0
_drops_lock = threading.Lock()
_VERSION = "0.1.0"
_TOOL_SPAN_NAMES = 256


def telemetry_drops() -> int:
    """How many span operations failed and were dropped in this process."""
    return _drops


def _dropped(exc: BaseException) -> None:
    global _drops
    with _drops_lock:
        _drops += 1
        first = _drops == 1
    if first:
        _log.debug(
            "loopwatch: span emission failed (%s); counting further drops", type(exc).__name__
        )


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def _end(span: Span) -> None:
    try:
        span.end()
    except Exception as exc:
        _dropped(exc)


def _decision_attributes(decision: Decision) -> dict[str, Any]:
    """The decision span's type, fingerprint and usage, as the guard counted them (the
    same normalization: a usage the guard counted as 0 is not on the span)."""
    attrs: dict[str, Any] = {}
    try:
        dtype = DecisionType(decision.type)  # a plain "final" as well as the enum member
    except ValueError:
        dtype = None
    if dtype is not None:
        attrs[sc.LW_DECISION_TYPE] = dtype.value
        if dtype is not DecisionType.TOOL:
            attrs[sc.LW_DECISION_FINGERPRINT] = decision.fingerprint()
    input_tokens = usage_tokens(decision.input_tokens)
    if input_tokens:
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    output_tokens = usage_tokens(decision.output_tokens)
    if output_tokens:
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
    cost = usage_cost(decision.cost_usd)
    if cost and math.isfinite(cost):
        attrs[sc.LW_COST_USD] = cost
    return attrs


def _loop_response(ticket: ToolTicket) -> dict[str, Any]:
    """The rung a call met: tool span attributes and its event's attributes."""
    return {
        sc.LW_LOOP_RESPONSE: ticket.response or "",
        sc.LW_LOOP_RUNG: ticket.rung,
        sc.LW_LOOP_DETECTOR: ticket.detector or "",
    }


def _nudges_attributes(outcome: Outcome) -> dict[str, Any]:
    """``loopwatch.nudges`` (compact JSON, first :data:`MAX_NUDGES`) and the count
    dropped; empty when the run had no nudge."""
    if not outcome.nudges and not outcome.nudges_dropped:
        return {}
    kept = outcome.nudges[:MAX_NUDGES]
    attrs: dict[str, Any] = {
        sc.LW_NUDGES: json.dumps([n.to_dict() for n in kept], separators=(",", ":"))
    }
    dropped = outcome.nudges_dropped + len(outcome.nudges) - len(kept)
    if dropped:
        attrs[sc.LW_NUDGES_DROPPED] = dropped
    return attrs


def stop_attributes(stop: Stop, guard: Guard) -> dict[str, Any]:
    """Attributes describing ``stop`` (stop span and, at its end, run span)."""
    usage = guard.usage()
    attrs: dict[str, Any] = {
        sc.LW_STOP_REASON: stop.reason.value,
        sc.GEN_AI_AGENT_FINISH_REASON: stop.reason.value,
        sc.LW_STOP_EVIDENCE: _json(stop.evidence.to_dict()),
        sc.LW_STOP_MESSAGE: stop.message,
        sc.LW_STEPS_SINCE_PROGRESS: usage.steps_since_progress,
        sc.LW_USAGE_MODEL_TURNS: usage.model_turns,
        sc.LW_USAGE_TOOL_ATTEMPTS: usage.tool_attempts,
        sc.LW_USAGE_TOOL_SUCCESSES: usage.tool_successes,
        sc.LW_USAGE_TOKENS: usage.tokens,
        sc.LW_USAGE_COST_USD: float(usage.cost_usd),
        sc.LW_USAGE_ELAPSED_SECONDS: float(usage.elapsed_seconds),
    }
    if stop.dimension is not None:
        attrs[sc.LW_STOP_DIMENSION] = stop.dimension.value
    if stop.limit is not None:
        attrs[sc.LW_STOP_LIMIT] = float(stop.limit)
    if stop.observed is not None:
        attrs[sc.LW_STOP_OBSERVED] = float(stop.observed)
    if stop.basis is not None:
        attrs[sc.LW_STOP_BASIS] = stop.basis
    return attrs


class RunTelemetry:
    """Emits the run, decision, tool and stop spans of one run.

    Args:
        agent: the agent name (low cardinality: it goes into span names).
        guard: the run's guard (read for ids, step and usage).
        tracer_provider: where spans go; the global provider when None.
        parent_run_id: the parent run's id for a child run.
        agent_id / conversation_id: optional GenAI attributes.

    Thread-safety: methods may be called from several threads of one run.
    """

    def __init__(
        self,
        agent: str,
        guard: Guard,
        *,
        tracer_provider: TracerProvider | None = None,
        parent_run_id: str | None = None,
        agent_id: str | None = None,
        conversation_id: str | None = None,
    ) -> None:
        self.agent = agent
        self.guard = guard
        self._parent_run_id = parent_run_id
        self._agent_id = agent_id
        self._conversation_id = conversation_id
        self._tracer: Tracer | None = None
        self._provider = tracer_provider
        self._run_span: Span | None = None
        self._run_ctx: otel_context.Context | None = None
        self._stop_emitted = False
        self._lock = threading.Lock()
        self._decision_name = sc.SPAN_DECISION.format(agent=agent)
        self._stop_name = sc.SPAN_STOP.format(agent=agent)
        self._tool_span_names: dict[str, str] = {}

    @property
    def run_context(self) -> otel_context.Context | None:
        """The OpenTelemetry context holding the run span (children attach to it)."""
        return self._run_ctx

    def _get_tracer(self) -> Tracer:
        if self._tracer is None:
            self._tracer = trace.get_tracer(
                sc.INSTRUMENTATION_NAME, _VERSION, tracer_provider=self._provider
            )
        return self._tracer

    def _tool_span_name(self, tool: str) -> str:
        name = self._tool_span_names.get(tool)
        if name is None:
            name = sc.SPAN_TOOL.format(tool=tool)
            if len(self._tool_span_names) >= _TOOL_SPAN_NAMES:
                self._tool_span_names.clear()  # bounded: tool names come from the model
            self._tool_span_names[tool] = name
        return name

    def start_run(self, mode: str) -> None:
        """Start the ``invoke_agent {agent}`` span."""
        try:
            g = self.guard
            attrs: dict[str, Any] = {
                sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
                sc.GEN_AI_AGENT_NAME: self.agent,
                sc.LW_RUN_ID: g.run_id,
                sc.LW_POLICY_NAME: g.policy.name,
                sc.LW_POLICY_VERSION: g.policy.version,
                sc.LW_DETECTOR_VERSION: sc.DETECTOR_VERSION,
                sc.LW_LIMITS: g.policy.limits_json(),
                sc.LW_MODE: mode,
            }
            if self._parent_run_id:
                attrs[sc.LW_PARENT_RUN_ID] = self._parent_run_id
            if self._agent_id:
                attrs[sc.GEN_AI_AGENT_ID] = self._agent_id
            if self._conversation_id:
                attrs[sc.GEN_AI_CONVERSATION_ID] = self._conversation_id
            span = self._get_tracer().start_span(
                sc.SPAN_RUN.format(agent=self.agent), kind=SpanKind.INTERNAL, attributes=attrs
            )
            self._run_span = span
            self._run_ctx = trace.set_span_in_context(span)
        except Exception as exc:
            _dropped(exc)

    def start_decision(self, *, start_time: int | None = None) -> Span | None:
        """Start a ``decide {agent}`` span (child of the run span).

        Args:
            start_time: span start in ns since the epoch (``time.time_ns()``); now when None.
        """
        try:
            return self._get_tracer().start_span(
                self._decision_name,
                context=self._run_ctx,
                kind=SpanKind.INTERNAL,
                attributes={
                    sc.LW_EVENT: sc.EVENT_DECISION,
                    sc.LW_RUN_ID: self.guard.run_id,
                    sc.GEN_AI_AGENT_NAME: self.agent,
                    sc.LW_STEP: self.guard.step,
                },
                start_time=start_time,
            )
        except Exception as exc:
            _dropped(exc)
            return None

    def end_decision(
        self, span: Span | None, decision: Decision | None, *, error: BaseException | None = None
    ) -> None:
        """Finish a decision span with the decision's type, fingerprint and usage."""
        if span is None:
            return
        # The span is ended whatever its attributes do: an unended decision span is a
        # model turn missing from the trace (the counters no longer equal the events).
        try:
            attrs: dict[str, Any] = {sc.LW_STEPS_SINCE_PROGRESS: self.guard.steps_since_progress}
            if error is not None:
                attrs[sc.ERROR_TYPE] = type(error).__name__
            if decision is not None:
                attrs.update(_decision_attributes(decision))
            span.set_attributes(attrs)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR))
        except Exception as exc:
            _dropped(exc)
        finally:
            _end(span)

    def _tool_attributes(self, ticket: ToolTicket) -> dict[str, Any]:
        """The attributes every tool span starts with."""
        return {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: ticket.tool,
            sc.GEN_AI_TOOL_CALL_ID: ticket.call_id or "",
            sc.LW_EVENT: sc.EVENT_TOOL_RESULT,
            sc.LW_RUN_ID: self.guard.run_id,
            sc.GEN_AI_AGENT_NAME: self.agent,
            sc.LW_STEP: ticket.step,
            sc.LW_ACTION_FINGERPRINT: ticket.fingerprint,
            sc.LW_TOOL_RISK: ticket.risk,
        }

    def start_tool(
        self, ticket: ToolTicket, arguments_json: str | None, *, start_time: int | None = None
    ) -> Span | None:
        """Start an ``execute_tool {tool}`` span for an allowed call.

        Args:
            start_time: span start in ns since the epoch (``time.time_ns()``); now when None.
        """
        try:
            attrs = self._tool_attributes(ticket)
            if arguments_json is not None:
                attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments_json
            if ticket.would_stop is not None:
                attrs[sc.LW_OBSERVE_STOP_REASON] = ticket.would_stop.reason.value
            if ticket.observed_response is not None:
                attrs[sc.LW_OBSERVE_LOOP_RESPONSE] = ticket.observed_response
            response = _loop_response(ticket) if ticket.response is not None else None
            if response is not None:
                attrs.update(response)
            span = self._get_tracer().start_span(
                self._tool_span_name(ticket.tool),
                context=self._run_ctx,
                kind=SpanKind.INTERNAL,
                attributes=attrs,
                start_time=start_time,
            )
            if response is not None:
                span.add_event(sc.EVENT_LOOP_RESPONSE, response, timestamp=start_time)
            return span
        except Exception as exc:
            _dropped(exc)
            return None

    def end_tool(
        self,
        span: Span | None,
        record: ToolRecord,
        *,
        result_json: str | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Finish a tool span with outcome, observation digest and progress."""
        if span is None:
            return
        try:
            attrs: dict[str, Any] = {
                sc.LW_TOOL_OUTCOME: record.outcome if record.accepted else sc.OUTCOME_ERROR,
                sc.LW_PROGRESS: record.progress,
                sc.LW_STEPS_SINCE_PROGRESS: record.steps_since_progress,
            }
            if record.observation_digest:
                attrs[sc.LW_OBSERVATION_DIGEST] = record.observation_digest
            if result_json is not None:
                attrs[sc.GEN_AI_TOOL_CALL_RESULT] = result_json
            if error is not None or record.outcome == sc.OUTCOME_ERROR:
                attrs[sc.ERROR_TYPE] = record.error_type or (
                    type(error).__name__ if error else "error"
                )
                if record.failure_class is not None:
                    attrs[sc.LW_TOOL_FAILURE_CLASS] = record.failure_class.value
                span.set_status(Status(StatusCode.ERROR))
            if not record.accepted:
                attrs[sc.ERROR_TYPE] = "late_result"
            span.set_attributes(attrs)
        except Exception as exc:
            _dropped(exc)
        finally:
            _end(span)

    def blocked_tool(
        self, ticket: ToolTicket, arguments_json: str | None, *, start_time: int | None = None
    ) -> None:
        """Emit a tool span with outcome ``blocked`` (or the unknown-tool error), from
        ``start_time`` (ns since the epoch; now when None) to now."""
        try:
            unknown = ticket.blocked_by == "unknown_tool"
            attrs = self._tool_attributes(ticket)
            attrs |= {
                sc.LW_TOOL_OUTCOME: sc.OUTCOME_ERROR if unknown else sc.OUTCOME_BLOCKED,
                sc.LW_PROGRESS: False,
                sc.LW_STEPS_SINCE_PROGRESS: self.guard.steps_since_progress,
                sc.LW_TOOL_BLOCKED_BY: ticket.blocked_by or "guard",
            }
            if unknown:
                attrs[sc.ERROR_TYPE] = "unknown_tool"
                attrs[sc.LW_TOOL_FAILURE_CLASS] = "unknown_tool"
            if arguments_json is not None:
                attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments_json
            span = self._get_tracer().start_span(
                self._tool_span_name(ticket.tool),
                context=self._run_ctx,
                kind=SpanKind.INTERNAL,
                attributes=attrs,
                start_time=start_time,
            )
            if unknown:
                span.set_status(Status(StatusCode.ERROR))
            span.end()
        except Exception as exc:
            _dropped(exc)

    def nudged_tool(
        self,
        ticket: ToolTicket,
        arguments_json: str | None,
        result_json: str | None,
        *,
        start_time: int | None = None,
    ) -> None:
        """Emit the tool span of a nudged call (outcome ``nudged``: not run, the nudge is
        its result), from ``start_time`` (ns since the epoch; now when None) to now."""
        try:
            response = _loop_response(ticket)
            attrs = self._tool_attributes(ticket)
            attrs |= response
            attrs |= {
                sc.LW_TOOL_OUTCOME: sc.OUTCOME_NUDGED,
                sc.LW_PROGRESS: False,
                sc.LW_STEPS_SINCE_PROGRESS: self.guard.steps_since_progress,
            }
            if arguments_json is not None:
                attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments_json
            if result_json is not None:
                attrs[sc.GEN_AI_TOOL_CALL_RESULT] = result_json
            span = self._get_tracer().start_span(
                self._tool_span_name(ticket.tool),
                context=self._run_ctx,
                kind=SpanKind.INTERNAL,
                attributes=attrs,
                start_time=start_time,
            )
            span.add_event(sc.EVENT_LOOP_RESPONSE, response, timestamp=start_time)
            span.end()
        except Exception as exc:
            _dropped(exc)

    def stop(self, outcome: Outcome) -> None:
        """Emit the one ``stop {agent}`` span and end the run span. Idempotent."""
        with self._lock:
            if self._stop_emitted:
                return
            self._stop_emitted = True
        try:
            attrs = stop_attributes(outcome.stop, self.guard)
            attrs[sc.LW_EVENT] = sc.EVENT_STOP
            attrs[sc.LW_RUN_ID] = self.guard.run_id
            attrs[sc.GEN_AI_AGENT_NAME] = self.agent
            attrs[sc.LW_STEP] = outcome.stop.step
            if outcome.observed_stops:
                first = outcome.observed_stops[0]
                attrs[sc.LW_OBSERVE_STOP_REASON] = first.reason.value
                attrs[sc.LW_OBSERVE_STOP_STEP] = first.step
                attrs[sc.LW_OBSERVE_STOP_EVIDENCE] = _json(first.evidence.to_dict())
            attrs |= _nudges_attributes(outcome)
            span = self._get_tracer().start_span(
                self._stop_name, context=self._run_ctx, kind=SpanKind.INTERNAL, attributes=attrs
            )
            span.end()
            run_span = self._run_span
            if run_span is not None:
                run_attrs = dict(attrs)
                del run_attrs[sc.LW_EVENT]
                run_span.set_attributes(run_attrs)
                if outcome.stop.reason.value == "error":
                    run_span.set_status(Status(StatusCode.ERROR))
                    error_type = outcome.stop.evidence.detail.get("exception_type")
                    if isinstance(error_type, str):
                        run_span.set_attribute(sc.ERROR_TYPE, error_type)
                run_span.end()
        except Exception as exc:
            _dropped(exc)
