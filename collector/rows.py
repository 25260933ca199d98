"""The rows the ``map`` stage produces and every later stage reads: runs, steps, stops.

The map stage reads :class:`~loopwatch.collector.records.SpanBatch` (already decoded and
redacted) and returns a :class:`MappedBatch` of rows for the store:

- :class:`RunRow`: one per run span (loopwatch run span, agent span, or the root span of
  a trace-level run). The store creates a run from whichever of its rows arrives first
  and merges the rest (the run span's fields win; times widen over steps and stops).
- :class:`StepRow`: a ``decision`` (model call) or a ``tool_result`` (tool call).
- :class:`StopRow`: how a run ended, with the :data:`STOP_ORIGINS` precedence below.
- pending steps: third-party steps whose agent run is not known yet, held by the map
  stage and kept durably by the store until they are released as final steps
  (:attr:`MappedBatch.pending`, :attr:`MappedBatch.released`).

Every row carries the ``(trace_id, span_id)`` of the span it came from: that pair is the
idempotency key the store deduplicates client retries with.

Rows are plain slotted dataclasses, not frozen ones: a frozen dataclass sets each of a
step's 29 fields through ``object.__setattr__`` (5 us per row, a third of the map stage,
measured on 512-span batches). They are still treated as values: a stage that changes
one builds a new row with :func:`dataclasses.replace` and swaps it in
(:meth:`MappedBatch.replace_step`), never assigns to a field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from loopwatch.instrumentation import StopReason
from loopwatch.instrumentation import _semconv as sc

from .records import pickled_as_tuple

__all__ = [
    "KIND_DECISION",
    "KIND_TOOL_RESULT",
    "SOURCES",
    "SOURCE_GENAI",
    "SOURCE_LOOPWATCH",
    "SOURCE_OPENINFERENCE",
    "STOP_COMPLETED",
    "STOP_ERROR",
    "STOP_ORIGINS",
    "STOP_ORIGIN_INFERRED",
    "STOP_ORIGIN_RUN_SPAN",
    "STOP_ORIGIN_STOP_SPAN",
    "UNKNOWN_AGENT",
    "MappedBatch",
    "RunRow",
    "StepRow",
    "StopRow",
]

SOURCE_LOOPWATCH: Final = "loopwatch"
SOURCE_GENAI: Final = "genai"
SOURCE_OPENINFERENCE: Final = "openinference"
SOURCES: Final = (SOURCE_LOOPWATCH, SOURCE_GENAI, SOURCE_OPENINFERENCE)

UNKNOWN_AGENT: Final = "unknown"
"""The agent label of a tool call or stop whose span, and its run, named no agent (set by
the collector before storing; a metric label and ``stops.agent``)."""
KIND_DECISION: Final = sc.EVENT_DECISION
KIND_TOOL_RESULT: Final = sc.EVENT_TOOL_RESULT

STOP_COMPLETED: Final = StopReason.COMPLETED.value
STOP_ERROR: Final = StopReason.ERROR.value

STOP_ORIGIN_INFERRED: Final = "inferred"
STOP_ORIGIN_RUN_SPAN: Final = "run_span"
STOP_ORIGIN_STOP_SPAN: Final = "stop_span"
STOP_ORIGINS: Final = {STOP_ORIGIN_INFERRED: 0, STOP_ORIGIN_RUN_SPAN: 1, STOP_ORIGIN_STOP_SPAN: 2}
"""Stop origins and their precedence (higher wins): a ``stop`` span, then the stop
attributes on a loopwatch run span, then a stop inferred from a run or root span's end."""


@pickled_as_tuple
@dataclass(slots=True)
class RunRow:
    """What a run span tells about its run; the store merges it into the run row.

    Attributes:
        run_id: ``loopwatch.run.id``; for third-party runs the agent span id or trace id.
        trace_id / span_id: the source span (32 / 16 lowercase hex chars).
        source: ``loopwatch``, ``genai`` or ``openinference``.
        is_run_span: the row comes from the run span itself (always, from the map stage);
            its fields are authoritative. A row with ``False`` only widens times.
        agent ... mode: run attributes; ``None`` when this span does not carry them.
        start_unix_nano / end_unix_nano: the source span's times (ns since the epoch);
            the store keeps the earliest start and latest end over the run's spans.
        status_code: the run span's OTLP status code; ``None`` for partial rows.
    """

    run_id: str
    trace_id: str
    span_id: str
    source: str
    is_run_span: bool = False
    agent: str | None = None
    agent_id: str | None = None
    conversation_id: str | None = None
    parent_run_id: str | None = None
    policy_name: str | None = None
    policy_version: str | None = None
    detector_version: str | None = None
    limits: str | None = None
    mode: str | None = None
    start_unix_nano: int | None = None
    end_unix_nano: int | None = None
    status_code: int | None = None


@pickled_as_tuple
@dataclass(slots=True)
class StepRow:
    """One decision or tool call of a run.

    Attributes:
        trace_id / span_id: the source span; ``run_id``: its run.
        source: ``loopwatch``, ``genai`` or ``openinference``.
        kind: ``decision`` or ``tool_result``.
        step: 1-based step index (``loopwatch.step``, or numbered by the map stage for
            third-party runs); ``None`` when a loopwatch span omits it.
        start_unix_nano / end_unix_nano: span times, ns since the epoch.
        status_code: OTLP status code of the span.
        decision_type: ``tool``, ``final``, ``refusal``, ``message``; ``None`` if unknown.
        decision_fingerprint / action_fingerprint / observation_digest: sha256 hex from
            the guard; ``None`` for third-party spans until a detect stage fills them.
        tool, tool_call_id, outcome (``ok``/``error``/``blocked``/``nudged``), risk, error_type,
            blocked_by, failure_class: tool-call attributes.
        progress / steps_since_progress: progress evidence reported with the step.
        input_tokens / output_tokens / cost_usd: model usage of a decision.
        arguments / result: captured, redacted tool arguments and result (JSON text as
            received), only when the agent opted in to content capture.
        loop_response / loop_rung / loop_detector: the response ladder's rung a warned
            or nudged call triggered (``warn`` or ``nudge``, its 1-based index in the
            ladder, the detector; :mod:`loopwatch.collector.nudges`); ``None`` otherwise.
    """

    trace_id: str
    span_id: str
    run_id: str
    source: str
    kind: str
    step: int | None
    start_unix_nano: int
    end_unix_nano: int
    status_code: int = 0
    decision_type: str | None = None
    decision_fingerprint: str | None = None
    tool: str | None = None
    tool_call_id: str | None = None
    outcome: str | None = None
    risk: str | None = None
    error_type: str | None = None
    blocked_by: str | None = None
    failure_class: str | None = None
    action_fingerprint: str | None = None
    observation_digest: str | None = None
    progress: bool | None = None
    steps_since_progress: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    arguments: str | None = None
    result: str | None = None
    agent: str | None = None
    loop_response: str | None = None
    loop_rung: int | None = None
    loop_detector: str | None = None


@pickled_as_tuple
@dataclass(slots=True)
class StopRow:
    """How a run ended.

    Attributes:
        trace_id / span_id: the source span; ``run_id``: the run.
        source: ``loopwatch``, ``genai`` or ``openinference``.
        origin: ``stop_span``, ``run_span`` or ``inferred`` (precedence in
            :data:`STOP_ORIGINS`).
        reason: stop reason (DESIGN section 2 closed set, as received).
        time_unix_nano: when the run stopped (the source span's end), ns since the epoch.
        step: ``loopwatch.step`` of the stop, or the last step number for inferred stops.
        dimension, limit_value, observed, basis: budget-stop details.
        evidence: ``loopwatch.stop.evidence`` JSON text; ``message``: stop message.
        steps_since_progress and the ``usage_*`` fields: the guard's counters at the stop
            (``usage_elapsed_seconds`` in seconds, ``usage_cost_usd`` in US dollars).
        observe_reason / observe_step / observe_evidence: what ``observe`` mode would
            have stopped with, where, and its evidence (JSON); ``evidence`` stays the
            real stop's.
        nudges: the run's nudges (``loopwatch.nudges``), validated, as compact JSON;
            ``nudges_dropped``: entries not listed (the client's cap plus invalid ones).
    """

    trace_id: str
    span_id: str
    run_id: str
    source: str
    origin: str
    reason: str
    time_unix_nano: int
    step: int | None = None
    dimension: str | None = None
    limit_value: float | None = None
    observed: float | None = None
    basis: str | None = None
    evidence: str | None = None
    message: str | None = None
    steps_since_progress: int | None = None
    usage_model_turns: int | None = None
    usage_tool_attempts: int | None = None
    usage_tool_successes: int | None = None
    usage_tokens: int | None = None
    usage_cost_usd: float | None = None
    usage_elapsed_seconds: float | None = None
    observe_reason: str | None = None
    observe_step: int | None = None
    observe_evidence: str | None = None
    agent: str | None = None
    nudges: str | None = None
    nudges_dropped: int | None = None

    @property
    def stop_inferred(self) -> bool:
        """Whether the stop was inferred from a span's end rather than reported."""
        return self.origin == STOP_ORIGIN_INFERRED


@pickled_as_tuple
@dataclass(slots=True)
class MappedBatch:
    """The rows mapped from one :class:`SpanBatch`; what the store commits as one unit.

    Attributes:
        runs / steps / stops: mapped rows, in span order.
        pending: third-party steps whose agent run is not known yet (``run_id`` is the
            trace id), with their span's parent id. Stored as pending, not counted: the
            map stage releases each later as a final step.
        released: span keys of ``steps`` that are pending steps of earlier requests,
            released now as final steps; ``discarded``: pending steps released to no
            run (their trace turned out to be a loopwatch trace).
        canary_run_ids: run ids (or trace ids) the redact stage flagged.
        spans_in: spans in the input batch; ``spans_unmapped``: those yielding no row.
        transport: the receiving transport (metric label).
    """

    runs: list[RunRow] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    stops: list[StopRow] = field(default_factory=list)
    pending: list[tuple[StepRow, str]] = field(default_factory=list)
    released: set[tuple[str, str]] = field(default_factory=set)
    discarded: list[StepRow] = field(default_factory=list)
    canary_run_ids: frozenset[str] = frozenset()
    spans_in: int = 0
    spans_unmapped: int = 0
    transport: str = ""
    _step_positions: dict[tuple[str, str], int] = field(
        default_factory=dict, repr=False, compare=False
    )

    def replace_step(self, old: StepRow, new: StepRow) -> None:
        """Replace the step with ``old``'s span key by ``new`` (same span key required).

        Amortised constant time (a position index is built on first use).

        Raises:
            ValueError: ``new`` has another span key, or ``old`` is not in the batch.
        """
        key = (old.trace_id, old.span_id)
        if (new.trace_id, new.span_id) != key:
            raise ValueError("replacement step must keep the span key")
        at = self._step_positions.get(key)
        if at is None or at >= len(self.steps) or self.steps[at] is not old:
            self._step_positions = {(s.trace_id, s.span_id): i for i, s in enumerate(self.steps)}
            at = self._step_positions.get(key)
            if at is None:
                raise ValueError("step not in batch")
        self.steps[at] = new

    def replace_stop(self, old: StopRow, new: StopRow) -> None:
        """Replace stop ``old`` (found by span key and run id) by ``new``.

        A detect stage uses this to turn an inferred ``completed`` into the detected
        reason before the store decides sampling.

        Raises:
            ValueError: ``new`` has another span key or run id, or ``old`` is not found.
        """
        key = (old.trace_id, old.span_id, old.run_id)
        if (new.trace_id, new.span_id, new.run_id) != key:
            raise ValueError("replacement stop must keep the span key and run id")
        for i, s in enumerate(self.stops):
            if (s.trace_id, s.span_id, s.run_id) == key:
                self.stops[i] = new
                return
        raise ValueError("stop not in batch")
