"""The ``map`` stage: decoded spans become runs, steps and stops (:mod:`.rows`).

loopwatch spans (DESIGN section 4) are recognised by ``loopwatch.event`` (decision,
tool_result, stop) and, for the run span, ``gen_ai.operation.name=invoke_agent`` with
``loopwatch.run.id``. Other spans in a trace that holds loopwatch spans (model-call spans
of other instrumentations nest inside decisions) are not mapped again. A span that
carries ``loopwatch.event`` or ``loopwatch.run.id`` but is none of those (no run id, a
run id over :data:`MAX_RUN_ID_CHARS` characters, an unknown ``loopwatch.event``) is
refused at decode by :func:`refuse_unmappable`, so the client learns of it in
``partial_success`` instead of an acknowledgement for a span never stored.

Third-party runs (``source`` ``genai`` or ``openinference``):

- Recognised spans: GenAI ``execute_tool`` and OpenInference ``TOOL`` spans become
  ``tool_result`` steps (``gen_ai.tool.call.arguments``/``.result`` or ``input.value``/
  ``output.value``); model calls (``gen_ai.operation.name`` ``chat``, ``text_completion``,
  ``generate_content``; OpenLLMetry ``llm.request.type`` ``chat``/``completion``;
  OpenInference ``LLM``) become ``decision`` steps; ``invoke_agent`` and OpenInference
  ``AGENT`` spans may be runs (not graph nodes nor ``create_agent``:
  :func:`~loopwatch.collector.genai.span_role`). Other spans (``CHAIN``, workflow
  spans) only link ancestry. Nested spans of one call or one model turn are one step
  (:mod:`loopwatch.collector.traces`).
- One run per agent invocation: an agent span is a run once a step is its own (it is
  the step's nearest agent span); an agent span around another one (a workflow wrapper,
  a nested ``invoke_agent`` chain) gets none and is no run. An agent span that came
  before its steps waits for them. At the root span: a root agent span takes the steps
  whose ancestry is still unknown; a trace-level run is made only for steps no agent
  took; a trace with agent spans but no step is one run with no stop (a run with no
  step never counts a stop). Spans that come after the root join the trace's run.
- Run id: the nearest ancestor agent span's id; the trace id when the trace has none.
  Spans export when they end, so children arrive before their agent span, often in an
  earlier request. Such a step is *pending* (:attr:`MappedBatch.pending`): held here,
  stored by the store as pending (durable, not counted), and released as a final step
  (:attr:`MappedBatch.released`) once its run is known: to its agent run when the agent
  span arrives; to the trace-level run (run id = trace id) when the trace's root span
  ends, when the trace is evicted, or after ``max_idle_seconds`` without a span of the
  trace (checked whenever a request is mapped); to no run when the trace turns out to be
  a loopwatch trace (:attr:`MappedBatch.discarded`).
- Steps are numbered per trace in span start-time order within a request and in arrival
  order across requests: each model call opens a step and the tool calls after it share
  that step; with no model-call span in the trace, each tool call is its own step. A
  resent span keeps its number. (The detect stage judges calls in start-time order.)
- The stop is inferred when the run's agent span (or, for trace-level runs, the root
  span) ends:
  ``stop_inferred=True``, reason ``completed``, or ``error`` when the span's status is
  ERROR. A later ``detect`` stage may replace it (:meth:`MappedBatch.replace_stop`).
- loopwatch tool spans keep the response ladder's rung (``loopwatch.loop.response``,
  ``.rung``, ``.detector``) and stop spans the run's nudges (``loopwatch.nudges``),
  both read and bounded by :mod:`loopwatch.collector.nudges`.
- Fingerprints, observation digests and loop detections are not computed here:
  the ``detect`` stage computes them on the third-party ``tool_result`` steps of a batch
  and writes them back with :meth:`MappedBatch.replace_step`. A step reaches the detect
  stage once, with its final run id (pending steps do not).

State and bounds: third-party numbering and ancestry need memory across requests, kept
per trace in an LRU of ``max_open_traces`` traces, each remembering at most
``max_spans_per_trace`` span parents and step numbers; a trace's state is dropped when its
root span ends. An evicted trace restarts its numbering. After a restart,
:meth:`MapStage.restore` takes back the pending steps the store holds. Per-span work is
constant (plus one pass over the trace's pending steps); :meth:`MapStage.process` is
thread-safe (one lock per call).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Final

from loopwatch.instrumentation import _semconv as sc

from .frameworks import name_hint, named_agent
from .genai import ROLE_AGENT as _AGENT
from .genai import ROLE_MODEL as _MODEL
from .genai import ROLE_OTHER as _OTHER
from .genai import ROLE_TOOL as _TOOL
from .genai import attr_bool as _bool
from .genai import attr_float as _float
from .genai import attr_int as _int
from .genai import attr_str as _str
from .genai import attr_text as _text
from .genai import span_role as _third_party_kind
from .genai import (
    span_subject,
    tool_call_id,
)
from .genai import tokens as _tokens
from .nudges import loop_response, parse_nudges
from .records import STATUS_ERROR, Attributes, SpanBatch, SpanRecord, pickled_as_tuple
from .rows import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    SOURCE_LOOPWATCH,
    STOP_COMPLETED,
    STOP_ERROR,
    STOP_ORIGIN_RUN_SPAN,
    STOP_ORIGIN_STOP_SPAN,
    MappedBatch,
    RunRow,
    StepRow,
    StopRow,
)
from .traces import (
    StepBuffer,
    TraceState,
    agent_run_row,
    inferred_stop,
    merge_rows,
    nest_of,
    resolve,
    source_of,
    step_row,
    stepless_run,
)

__all__ = [
    "MAX_RUN_ID_CHARS",
    "MSG_LONG_RUN_ID",
    "MSG_NO_RUN_ID",
    "MSG_UNKNOWN_EVENT",
    "MapStage",
    "PartialMap",
    "premap",
    "refuse_unmappable",
    "unmappable_reason",
]

MAX_RUN_ID_CHARS: Final = 4096
"""Longest ``loopwatch.run.id`` accepted, in characters: the longest run id the API's run
view takes (``GET /api/v1/runs/{run_id}``, bound by the HTTP request line)."""
MSG_NO_RUN_ID: Final = "loopwatch span without a loopwatch.run.id (need a non-empty value)"
MSG_LONG_RUN_ID: Final = f"loopwatch.run.id longer than {MAX_RUN_ID_CHARS} characters"
MSG_UNKNOWN_EVENT: Final = (
    "loopwatch span of no known kind (loopwatch.event decision, tool_result or stop, "
    "or a run span with gen_ai.operation.name invoke_agent)"
)
_LW_EVENTS: Final = frozenset({sc.EVENT_DECISION, sc.EVENT_TOOL_RESULT, sc.EVENT_STOP})


_RUN_NAME_PREFIX: Final = sc.SPAN_RUN.split("{", 1)[0]


@pickled_as_tuple
@dataclass(slots=True)
class PartialMap:
    """What :func:`premap` produces: the stateless half of mapping one batch.

    Attributes:
        mapped: rows of the batch's loopwatch spans (``spans_in`` counts every span).
        third_party: the other spans, by trace id, in request order (mapped by
            :meth:`MapStage.finish`, which holds the cross-batch run structure).
        loopwatch_traces: trace ids of the batch's loopwatch spans.
    """

    mapped: MappedBatch
    third_party: dict[str, list[SpanRecord]]
    loopwatch_traces: set[str]


def premap(batch: SpanBatch) -> PartialMap:
    """Map the spans that need no state from earlier batches (loopwatch spans, DESIGN 4).

    A pure function of ``batch``, so decode workers run it beside decoding and hand the
    serving process rows instead of spans; :meth:`MapStage.finish` does the rest.
    Never raises for odd attribute values (they map to ``None``).
    """
    out = MappedBatch(
        canary_run_ids=frozenset(batch.canary_run_ids),
        spans_in=len(batch.spans),
        transport=batch.transport,
    )
    third_party: dict[str, list[SpanRecord]] = {}
    lw_traces: set[str] = set()
    for span in batch.spans:
        attrs = span.attributes
        if sc.LW_EVENT in attrs or sc.LW_RUN_ID in attrs:
            lw_traces.add(span.trace_id)
            if not _map_loopwatch(span, out):
                out.spans_unmapped += 1
        else:
            third_party.setdefault(span.trace_id, []).append(span)
    return PartialMap(out, third_party, lw_traces)


class MapStage:
    """The ``map`` stage: ``process(SpanBatch) -> MappedBatch``.

    Args:
        max_open_traces: third-party traces whose ancestry and step numbering are
            remembered across requests (LRU); also bounds the loopwatch-trace memory.
        max_spans_per_trace: span parents, step numbers and pending steps remembered per
            open trace (a step past it is not held: it goes to the trace-level run).
        max_idle_seconds: a trace with no span for this long is forgotten, its pending
            steps released to the trace-level run.
        clock: monotonic clock in seconds.

    Raises:
        ValueError: a bound is not a positive integer.

    Example:
        >>> mapped = MapStage().process(SpanBatch(spans=[]))
        >>> mapped.runs, mapped.steps, mapped.stops
        ([], [], [])
    """

    name = "map"

    def __init__(
        self,
        *,
        max_open_traces: int = 10_000,
        max_spans_per_trace: int = 10_000,
        max_idle_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_open_traces < 1:
            raise ValueError("max_open_traces must be >= 1")
        if max_spans_per_trace < 1:
            raise ValueError("max_spans_per_trace must be >= 1")
        self._max_traces = max_open_traces
        self._max_spans = max_spans_per_trace
        self._traces: OrderedDict[str, TraceState] = OrderedDict()
        self._loopwatch_traces: OrderedDict[str, None] = OrderedDict()
        # Traces whose root span ended: the run their late calls that no agent span takes
        # join, its last step, and whether it numbered model calls.
        self._ended: OrderedDict[str, tuple[str, int, bool, str]] = OrderedDict()
        self._max_idle = max_idle_seconds
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def open_traces(self) -> int:
        """Third-party traces currently remembered."""
        return len(self._traces)

    def process(self, batch: SpanBatch) -> MappedBatch:
        """Map a batch; never raises for odd attribute values (they map to ``None``).

        Blocks for the duration of the mapping (constant work per span) and holds the
        stage's lock, so concurrent calls are serialised. The same as
        ``finish(premap(batch))``.
        """
        return self.finish(premap(batch))

    def finish(self, partial: PartialMap) -> MappedBatch:
        """Complete a :func:`premap` result with this stage's cross-batch state.

        Loopwatch traces are remembered (a third-party span of one is not mapped twice,
        and its pending steps are discarded); third-party spans are mapped, as they need
        the run structure seen in earlier batches; pending steps are released.

        Returns:
            ``partial.mapped``, completed in place.
        """
        out = partial.mapped
        with self._lock:
            now = self._clock()
            for trace_id in partial.loopwatch_traces:
                _remember(self._loopwatch_traces, trace_id, self._max_traces)
                state = self._traces.pop(trace_id, None)
                if state is not None:
                    out.discarded += state.held.values()
            for trace_id, spans in partial.third_party.items():
                if trace_id in partial.loopwatch_traces or trace_id in self._loopwatch_traces:
                    out.spans_unmapped += len(spans)
                    continue
                out.spans_unmapped += self._map_third_party(trace_id, spans, out, now)
            while self._traces:
                trace_id, state = next(iter(self._traces.items()))
                if now - state.seen < self._max_idle:
                    break
                self._forget(trace_id, out)
        # A step held and released by the same request is an ordinary step of it.
        same = {(r.trace_id, r.span_id) for r, _ in out.pending} & out.released
        if same:
            out.pending = [p for p in out.pending if (p[0].trace_id, p[0].span_id) not in same]
            out.released -= same
        return out

    def restore(self, pending: Iterable[tuple[StepRow, str]]) -> MappedBatch:
        """Hold again the pending steps the store kept (``(step, parent span id)``, in
        the order they were stored), after a restart.

        Returns:
            The steps released at once (their trace evicted by the bounds), to submit.
        """
        out = MappedBatch()
        with self._lock:
            now = self._clock()
            for row, parent in pending:
                state = self._state(row.trace_id, out, now)
                if parent:
                    state.parents.setdefault(row.span_id, parent)
                state.numbered.setdefault(row.span_id, row.step or 0)
                state.kinds.setdefault(row.span_id, _MODEL if row.kind == KIND_DECISION else _TOOL)
                state.step = max(state.step, row.step or 0)
                if len(state.held) < self._max_spans:
                    state.held[row.span_id] = row
                else:
                    out.steps.append(row)
                    out.released.add((row.trace_id, row.span_id))
        return out

    def undo(self, mapped: MappedBatch) -> None:
        """Hold again the pending steps ``mapped`` released or discarded: it was refused
        before its commit, so their pending rows are still stored, and its retry must
        release them again (to the run they were released to, unless its ancestry now
        names another). A trace evicted by the bounds meanwhile leaves them stored,
        held again after the next restart."""
        rows = [s for s in mapped.steps if (s.trace_id, s.span_id) in mapped.released]
        with self._lock:
            for stop in mapped.stops:  # its retry maps the trace's end again
                self._ended.pop(stop.trace_id, None)
            now, scratch = self._clock(), MappedBatch()
            for row in [*rows, *mapped.discarded]:
                self._state(row.trace_id, scratch, now).held[row.span_id] = row

    def _release(self, state: TraceState, span_id: str, run_id: str, out: MappedBatch) -> None:
        row = state.held.pop(span_id)
        out.steps.append(row if row.run_id == run_id else replace(row, run_id=run_id))
        out.released.add((row.trace_id, span_id))

    def _forget(self, trace_id: str, out: MappedBatch) -> None:
        """Drop a trace's state, releasing its pending steps to its trace-level run (or,
        for late steps of a trace whose root span ended, to that trace's run)."""
        state = self._traces.pop(trace_id)
        ended = self._ended.get(trace_id)
        run_id = trace_id if ended is None else ended[0]
        for span_id in list(state.held):
            self._release(state, span_id, run_id, out)

    def _state(self, trace_id: str, out: MappedBatch, now: float) -> TraceState:
        state = self._traces.get(trace_id)
        if state is None:
            state = self._traces[trace_id] = TraceState()
            ended = self._ended.get(trace_id)
            if ended is not None:  # late spans: numbered on from the trace's last step
                run_id, state.step, state.saw_model_call, root = ended
                # Under the ended root span, a late call no agent span takes is its run's.
                state.agents.add(root)
                state.run_of[root] = run_id
            while len(self._traces) > self._max_traces:
                self._forget(next(iter(self._traces)), out)
        else:
            self._traces.move_to_end(trace_id)
        state.seen = now
        return state

    def _map_third_party(
        self, trace_id: str, spans: list[SpanRecord], out: MappedBatch, now: float
    ) -> int:
        state = self._state(trace_id, out, now)
        spans.sort(key=lambda s: (s.start_unix_nano, s.span_id))
        kinds = [_third_party_kind(s.attributes, s.name) for s in spans]
        arrived: list[SpanRecord] = []  # agent spans new to the trace, run or not yet
        for span, kind in zip(spans, kinds, strict=True):
            if span.parent_span_id and (
                span.span_id in state.parents or len(state.parents) < self._max_spans
            ):
                state.parents[span.span_id] = span.parent_span_id
            if kind == _AGENT and span.span_id not in state.agents:
                state.agents.add(span.span_id)
                arrived.append(span)
            if state.name_hint is None:
                state.name_hint = name_hint(span.name, span.attributes)
        batch = StepBuffer(out)
        for span_id, row in list(state.held.items()):
            # A row taken back by undo() keeps the run it was released to.
            run_id = resolve(state, state.parents.get(span_id, "")) or (
                None if row.run_id == trace_id else row.run_id
            )
            if run_id is not None:
                batch.release(state, span_id, run_id)
        unmapped = 0
        root: tuple[SpanRecord, int] | None = None
        for span, kind in zip(spans, kinds, strict=True):
            if not span.parent_span_id:
                root = (span, kind)
            if kind in (_MODEL, _TOOL):
                if not self._map_step(state, trace_id, span, kind, batch):
                    unmapped += 1
            elif kind == _OTHER and span.parent_span_id:
                unmapped += 1
                # A model span nested in a model span through this one (LlamaIndex's
                # wrappers) is found from the outer one when it comes later.
                inner = state.children.get((_MODEL, span.span_id))
                if inner is not None and len(state.children) < self._max_spans:
                    state.children.setdefault((_MODEL, span.parent_span_id), inner)
        batch.flush()
        # An agent span is a run once a step is its own (it is the step's nearest agent
        # ancestor). Children end before their parent, so an enclosing agent span (a
        # workflow wrapper, the outer span of a nested invoke_agent chain) gets no step,
        # and is no run: it never counts a stop. An agent span that came before its
        # calls (clock skew, out-of-order export) waits, and becomes a run with them.
        ended_runs: list[tuple[SpanRecord, str, str]] = []
        for span in arrived:
            if span.span_id not in batch.owners:
                if len(state.waiting) < self._max_spans:
                    state.waiting[span.span_id] = span
                else:
                    state.agents.discard(span.span_id)
                unmapped += 1
        resent = [
            s for s, k in zip(spans, kinds, strict=True) if k == _AGENT and s.span_id in state.runs
        ]
        promoted = [state.waiting.pop(r) for r in sorted(batch.owners & state.waiting.keys())]
        # A resent agent span (a client retry) repeats its run and stop: the store drops
        # them as duplicates if the first request committed.
        for span in [*resent, *promoted, *(s for s in arrived if s.span_id in batch.owners)]:
            state.runs.add(span.span_id)
            source = source_of(span.attributes)
            parent_run = resolve(state, span.parent_span_id)
            out.runs.append(agent_run_row(span, span.span_id, source, parent_run))
            ended_runs.append((span, span.span_id, source))
        if root is not None:
            span, kind = root
            if kind == _AGENT and span.span_id not in state.runs and state.held:
                # A root agent span holds its whole trace: calls whose ancestry is not
                # known yet (their parents end after the root: AutoGen's message
                # stream, async workflow steps) are its own.
                for span_id in list(state.held):
                    batch.release(state, span_id, span.span_id)
                batch.flush()
                state.waiting.pop(span.span_id, None)
                state.runs.add(span.span_id)
                source = source_of(span.attributes)
                out.runs.append(agent_run_row(span, span.span_id, source, None))
                ended_runs.append((span, span.span_id, source))
            # A trace-level run only for steps no agent run took: a root span with no
            # call under it (AutoGen's create_agent, a workflow wrapper) is no run.
            if span.span_id not in state.runs and (state.held or state.trace_steps):
                source = source_of(span.attributes)
                agent = named_agent(span.attributes) or state.name_hint
                out.runs.append(agent_run_row(span, trace_id, source, None, agent))
                ended_runs.append((span, trace_id, source))
            elif not state.runs and state.waiting:
                out.runs.append(stepless_run(state))
            elif not state.runs and trace_id in out.canary_run_ids:
                # A planted canary in a trace that made no run (a lone span) is still
                # stored and counted: a run with no step and no stop carries its flag.
                agent = named_agent(span.attributes) or state.name_hint
                out.runs.append(
                    agent_run_row(span, trace_id, source_of(span.attributes), None, agent)
                )
            # Late calls of the trace (children that end after the root) that no agent
            # span takes join its run: the root's, the trace-level run, or the only
            # agent run; numbered on from its last step.
            late = None
            if span.span_id in state.runs:
                late = span.span_id
            elif state.held or state.trace_steps:
                late = trace_id
            elif len(state.runs) == 1:
                late = next(iter(state.runs))
            if late is not None:
                self._ended[trace_id] = (late, state.step, state.saw_model_call, span.span_id)
                while len(self._ended) > self._max_traces:
                    self._ended.popitem(last=False)
            self._forget(trace_id, out)
        for span, run_id, source in ended_runs:
            out.stops.append(inferred_stop(span, run_id, source, state.step))
        return unmapped

    def _map_step(
        self, state: TraceState, trace_id: str, span: SpanRecord, kind: int, batch: StepBuffer
    ) -> bool:
        """Map one model or tool span; ``False`` when it adds no row (merged into the
        row of the call or turn it is nested in)."""
        source = source_of(span.attributes)
        # A resent span (a client retry) keeps its number: the store drops it as a
        # duplicate, and a new number would leave a gap in the run's steps.
        step = state.numbered.get(span.span_id)
        nest = state.nests.get(span.span_id)
        if nest is None and step is None:
            nest = nest_of(state, span, kind, batch)
        if nest is not None:
            held = batch.row(state, nest)
            if held is not None:
                new = step_row(span, held.run_id, source, held.step or 0, kind)
                batch.update(state, nest, merge_rows(held, new))
            if len(state.nests) < self._max_spans:
                state.nests[span.span_id] = nest
                if span.parent_span_id:
                    state.children.setdefault((kind, span.parent_span_id), nest)
            return False
        found = resolve(state, span.parent_span_id)
        run_id = trace_id if found is None else found
        if kind == _MODEL:
            state.saw_model_call = True
            if step is None:
                state.step += 1
                step = state.step
        elif step is None:
            if not state.saw_model_call or state.step == 0:
                state.step += 1
            step = state.step
        row = step_row(span, run_id, source, step, kind)
        if found is None and len(state.held) < self._max_spans:
            batch.hold(state, row, span.parent_span_id)
        else:
            batch.emit(row)
            if found is None:
                state.trace_steps += 1
        if len(state.numbered) < self._max_spans:
            state.numbered[span.span_id] = step
            state.kinds[span.span_id] = kind
            if span.parent_span_id:
                state.children.setdefault((kind, span.parent_span_id), span.span_id)
            call_id = tool_call_id(span.attributes) if kind == _TOOL else None
            if call_id:
                state.call_ids.setdefault(call_id, span.span_id)
        return True


def _remember(seen: OrderedDict[str, None], trace_id: str, bound: int) -> None:
    seen[trace_id] = None
    seen.move_to_end(trace_id)
    while len(seen) > bound:
        seen.popitem(last=False)


def unmappable_reason(attrs: Attributes) -> str | None:
    """Why a loopwatch span (it carries ``loopwatch.event`` or ``loopwatch.run.id``) can
    not become a row, or ``None``; what :func:`_map_loopwatch` would drop."""
    run_id = _str(attrs, sc.LW_RUN_ID)
    if not run_id:
        return MSG_NO_RUN_ID
    if len(run_id) > MAX_RUN_ID_CHARS:
        return MSG_LONG_RUN_ID
    event = attrs.get(sc.LW_EVENT)
    if isinstance(event, str) and event in _LW_EVENTS:  # a list or a map is no event
        return None
    if event is None and attrs.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_INVOKE_AGENT:
        return None
    return MSG_UNKNOWN_EVENT


def refuse_unmappable(batch: SpanBatch) -> None:
    """Refuse, on ``batch``, the loopwatch spans that no row could be made of.

    A span that carries ``loopwatch.event`` or ``loopwatch.run.id`` is a loopwatch span
    (DESIGN section 4); one with an empty or missing run id, a run id over
    :data:`MAX_RUN_ID_CHARS` characters, or an event that is not ``decision``,
    ``tool_result`` or ``stop`` (nor a run span: ``invoke_agent``) would be acknowledged
    and never stored. Each is removed from ``batch.spans`` and counted with
    ``batch.reject(1, message)`` (messages :data:`MSG_NO_RUN_ID`,
    :data:`MSG_LONG_RUN_ID`, :data:`MSG_UNKNOWN_EVENT`: fixed, content-free), so it is
    reported in ``partial_success`` and as ``invalid_span`` on
    ``loopwatch_collector_spans_rejected_total``. Third-party spans are left alone.

    Called by :func:`~loopwatch.collector.decode.decode_body` on every request, in
    process and in decode workers. Constant work per span; no allocation unless a span
    is refused.
    """
    spans = batch.spans
    refused: set[int] = set()
    for index, span in enumerate(spans):
        attrs = span.attributes
        if sc.LW_EVENT in attrs or sc.LW_RUN_ID in attrs:
            problem = unmappable_reason(attrs)
            if problem is not None:
                refused.add(index)
                batch.reject(1, problem)
    if refused:
        batch.spans = [span for index, span in enumerate(spans) if index not in refused]


def _map_loopwatch(span: SpanRecord, out: MappedBatch) -> bool:
    attrs = span.attributes
    run_id = _str(attrs, sc.LW_RUN_ID)
    if not run_id:
        return False
    event = attrs.get(sc.LW_EVENT)
    if event == sc.EVENT_DECISION:
        out.steps.append(_lw_step(span, run_id, KIND_DECISION))
    elif event == sc.EVENT_TOOL_RESULT:
        out.steps.append(_lw_step(span, run_id, KIND_TOOL_RESULT))
    elif event == sc.EVENT_STOP:
        out.stops.append(_lw_stop(span, run_id, STOP_ORIGIN_STOP_SPAN))
    elif event is None and attrs.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_INVOKE_AGENT:
        out.runs.append(_lw_run(span, run_id))
        if sc.LW_STOP_REASON in attrs or sc.GEN_AI_AGENT_FINISH_REASON in attrs:
            out.stops.append(_lw_stop(span, run_id, STOP_ORIGIN_RUN_SPAN))
        else:
            out.stops.append(inferred_stop(span, run_id, SOURCE_LOOPWATCH, 0))
    else:
        return False
    return True


def _lw_run(span: SpanRecord, run_id: str) -> RunRow:
    attrs = span.attributes
    return RunRow(
        run_id=run_id,
        trace_id=span.trace_id,
        span_id=span.span_id,
        source=SOURCE_LOOPWATCH,
        is_run_span=True,
        agent=_str(attrs, sc.GEN_AI_AGENT_NAME) or span_subject(span.name, _RUN_NAME_PREFIX),
        agent_id=_str(attrs, sc.GEN_AI_AGENT_ID),
        conversation_id=_str(attrs, sc.GEN_AI_CONVERSATION_ID),
        parent_run_id=_str(attrs, sc.LW_PARENT_RUN_ID),
        policy_name=_str(attrs, sc.LW_POLICY_NAME),
        policy_version=_str(attrs, sc.LW_POLICY_VERSION),
        detector_version=_str(attrs, sc.LW_DETECTOR_VERSION),
        limits=_text(attrs, sc.LW_LIMITS),
        mode=_str(attrs, sc.LW_MODE),
        start_unix_nano=span.start_unix_nano,
        end_unix_nano=span.end_unix_nano,
        status_code=span.status_code,
    )


def _lw_step(span: SpanRecord, run_id: str, kind: str) -> StepRow:
    attrs = span.attributes
    outcome = _str(attrs, sc.LW_TOOL_OUTCOME)
    if kind == KIND_TOOL_RESULT and outcome is None:
        outcome = sc.OUTCOME_ERROR if span.status_code == STATUS_ERROR else sc.OUTCOME_OK
    response, rung, detector = (
        loop_response(span) if kind == KIND_TOOL_RESULT else (None, None, None)
    )
    return StepRow(
        trace_id=span.trace_id,
        span_id=span.span_id,
        run_id=run_id,
        source=SOURCE_LOOPWATCH,
        kind=kind,
        step=_int(attrs, sc.LW_STEP),
        start_unix_nano=span.start_unix_nano,
        end_unix_nano=span.end_unix_nano,
        status_code=span.status_code,
        decision_type=_str(attrs, sc.LW_DECISION_TYPE),
        decision_fingerprint=_str(attrs, sc.LW_DECISION_FINGERPRINT),
        tool=_str(attrs, sc.GEN_AI_TOOL_NAME),
        tool_call_id=_str(attrs, sc.GEN_AI_TOOL_CALL_ID),
        outcome=outcome,
        risk=_str(attrs, sc.LW_TOOL_RISK),
        error_type=_str(attrs, sc.ERROR_TYPE),
        blocked_by=_str(attrs, sc.LW_TOOL_BLOCKED_BY),
        failure_class=_str(attrs, sc.LW_TOOL_FAILURE_CLASS),
        action_fingerprint=_str(attrs, sc.LW_ACTION_FINGERPRINT),
        observation_digest=_str(attrs, sc.LW_OBSERVATION_DIGEST),
        progress=_bool(attrs, sc.LW_PROGRESS),
        steps_since_progress=_int(attrs, sc.LW_STEPS_SINCE_PROGRESS),
        input_tokens=_tokens(attrs, sc.GEN_AI_USAGE_INPUT_TOKENS),
        output_tokens=_tokens(attrs, sc.GEN_AI_USAGE_OUTPUT_TOKENS),
        cost_usd=_float(attrs, sc.LW_COST_USD),
        arguments=_text(attrs, sc.GEN_AI_TOOL_CALL_ARGUMENTS),
        result=_text(attrs, sc.GEN_AI_TOOL_CALL_RESULT),
        agent=_str(attrs, sc.GEN_AI_AGENT_NAME),
        loop_response=response,
        loop_rung=rung,
        loop_detector=detector,
    )


def _lw_stop(span: SpanRecord, run_id: str, origin: str) -> StopRow:
    attrs = span.attributes
    reason = _str(attrs, sc.LW_STOP_REASON) or _str(attrs, sc.GEN_AI_AGENT_FINISH_REASON)
    if not reason:
        reason = STOP_ERROR if span.status_code == STATUS_ERROR else STOP_COMPLETED
    nudges, dropped = parse_nudges(attrs)
    return StopRow(
        trace_id=span.trace_id,
        span_id=span.span_id,
        run_id=run_id,
        source=SOURCE_LOOPWATCH,
        origin=origin,
        reason=reason,
        time_unix_nano=span.end_unix_nano,
        step=_int(attrs, sc.LW_STEP),
        dimension=_str(attrs, sc.LW_STOP_DIMENSION),
        limit_value=_float(attrs, sc.LW_STOP_LIMIT),
        observed=_float(attrs, sc.LW_STOP_OBSERVED),
        basis=_str(attrs, sc.LW_STOP_BASIS),
        evidence=_text(attrs, sc.LW_STOP_EVIDENCE),
        message=_str(attrs, sc.LW_STOP_MESSAGE),
        steps_since_progress=_int(attrs, sc.LW_STEPS_SINCE_PROGRESS),
        usage_model_turns=_int(attrs, sc.LW_USAGE_MODEL_TURNS),
        usage_tool_attempts=_int(attrs, sc.LW_USAGE_TOOL_ATTEMPTS),
        usage_tool_successes=_int(attrs, sc.LW_USAGE_TOOL_SUCCESSES),
        usage_tokens=_int(attrs, sc.LW_USAGE_TOKENS),
        usage_cost_usd=_float(attrs, sc.LW_USAGE_COST_USD),
        usage_elapsed_seconds=_float(attrs, sc.LW_USAGE_ELAPSED_SECONDS),
        observe_reason=_str(attrs, sc.LW_OBSERVE_STOP_REASON),
        observe_step=_int(attrs, sc.LW_OBSERVE_STOP_STEP),
        observe_evidence=_text(attrs, sc.LW_OBSERVE_STOP_EVIDENCE),
        agent=_str(attrs, sc.GEN_AI_AGENT_NAME),
        nudges=nudges,
        nudges_dropped=dropped,
    )
