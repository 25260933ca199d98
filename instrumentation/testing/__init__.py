"""Testing kit for agents guarded by loopwatch: ``loopwatch.instrumentation.testing``.

- :class:`ScriptedModel`: a strict scripted model (fails loudly when the script runs out).
- :class:`FakeClock`: an injectable monotonic clock you advance by hand (no sleeps).
- The seven adversarial tools: :class:`ConstantTool`, :class:`OscillatingTool`,
  :class:`FalseProgressTool`, :class:`EventualTool`, :class:`CursorTool`,
  :class:`HangingTool`, :class:`ErrorTool`.
- :class:`NudgedModel`: a scripted model that meets a nudge (issue 26) and ignores it,
  obeys it (changes the call, then answers) or obeys once and relapses; built by
  :func:`ignoring_model`, :func:`obeying_model`, :func:`relapsing_model`.
- :func:`assert_trace_invariants`: each tool success has an earlier start, nothing after
  the stop, exactly one stop, successes <= attempts, counters equal events, a nudged
  call is a tool span naming its rung.

The pytest plugin (:mod:`.pytest_plugin`, registered automatically) exposes these as
fixtures: ``fake_clock``, ``span_exporter`` and ``tracer_provider`` (need the SDK),
``assert_invariants``, and the nudge-model factories ``ignoring_model``, ``obeying_model``
and ``relapsing_model``.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .. import _semconv as sc
from ..errors import ScriptExhaustedError
from ..failures import FailureClass, ToolFailure
from ..outcomes import Decision, NudgeText, ToolCall

if TYPE_CHECKING:
    from ..runs import Run

__all__ = [
    "ConstantTool",
    "CursorTool",
    "ErrorTool",
    "EventualTool",
    "FakeClock",
    "FalseProgressTool",
    "HangingTool",
    "InvariantViolation",
    "NudgedModel",
    "OscillatingTool",
    "RunTrace",
    "ScriptedModel",
    "assert_trace_invariants",
    "collect_runs",
    "drive",
    "ignoring_model",
    "obeying_model",
    "relapsing_model",
    "tool_loop",
]


class FakeClock:
    """A monotonic clock for tests: ``clock()`` returns seconds; ``advance(s)`` moves it.

    Thread-safe. Pass it as ``clock=`` to :class:`Run` or :class:`Guard`.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0).

        Raises:
            ValueError: negative ``seconds`` (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        with self._lock:
            self._now += seconds


class ScriptedModel:
    """A strict scripted model: returns the scripted decisions in order.

    Args:
        script: decisions (or callables ``(call_index, *args) -> Decision`` for decisions
            that depend on the input).
        tick: a :class:`FakeClock` advanced by ``seconds_per_call`` on every call.
        seconds_per_call: simulated model latency.

    Raises:
        ScriptExhaustedError: on a call past the end of the script (strict: a test that
            asks for more turns than it scripted is wrong, and says so).
    """

    def __init__(
        self,
        script: Iterable[Decision | Callable[..., Decision]],
        *,
        tick: FakeClock | None = None,
        seconds_per_call: float = 0.0,
    ) -> None:
        self.script = list(script)
        self.calls = 0
        self._tick = tick
        self._seconds = seconds_per_call
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Decision:
        with self._lock:
            index = self.calls
            if index >= len(self.script):
                raise ScriptExhaustedError(
                    f"scripted model called {index + 1} times but scripted for {len(self.script)}"
                )
            self.calls += 1
        if self._tick is not None and self._seconds:
            self._tick.advance(self._seconds)
        item = self.script[index]
        return (
            item(index, *args, **kwargs)
            if callable(item) and not isinstance(item, Decision)
            else item
        )


def tool_loop(
    name: str, arguments: dict[str, Any] | None = None, *, times: int, final: Any = None
) -> ScriptedModel:
    """A script calling tool ``name`` with the same arguments ``times`` times, then final."""
    call = Decision.tool(ToolCall(name, dict(arguments or {})))
    return ScriptedModel([call] * times + ([Decision.final(final)] if final is not None else []))


def drive(run: Run, model: Callable[[], Decision]) -> None:
    """Play ``model`` through ``run`` until its final decision: each step ``run.decide``,
    each tool call ``run.call_tool`` (with its call id), then ``run.finish(answer)``. A
    model with a ``see(result)`` method (:class:`NudgedModel`) is shown each result.

    Raises:
        StopRun: the guard stopped the run (the ``with Run(...)`` block turns it into the
            run's outcome); whatever a tool raises, unchanged.
    """
    while True:
        decision = run.decide(model)
        if decision.type == "final":
            run.finish(decision.answer)
            return
        see = getattr(model, "see", None)
        for call in decision.tool_calls:
            result = run.call_tool(call.name, call.arguments, call_id=call.call_id)
            if see is not None:
                see(result)


Reaction = Literal["ignore", "obey", "relapse"]


class NudgedModel:
    """A scripted model that calls one tool with the same arguments until it is nudged,
    then reacts (the nudge is a :class:`~loopwatch.instrumentation.NudgeText` result,
    shown to it by :func:`drive` through :meth:`see`).

    Reactions:
        ``ignore``: makes the same call again, every turn.
        ``obey``: makes the ``changed`` call once, then answers ``answer``.
        ``relapse``: makes the ``changed`` call once, then the original call again,
            every turn, whatever further nudges say.

    Args:
        tool / arguments: the repeated call.
        reaction: see above.
        changed: the arguments of the changed call (default: ``arguments`` plus
            ``{"changed": True}``).
        answer: the final answer of an obeying model.
        max_turns: strict bound: a call past it raises :class:`ScriptExhaustedError`.

    Attributes:
        calls: model turns taken. nudges: nudges seen, in order.
    """

    def __init__(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        reaction: Reaction = "ignore",
        changed: dict[str, Any] | None = None,
        answer: Any = "done",
        max_turns: int = 50,
    ) -> None:
        if reaction not in ("ignore", "obey", "relapse"):
            raise ValueError(f"reaction must be ignore, obey or relapse, got {reaction!r}")
        self.tool = tool
        self.arguments = dict(arguments or {})
        self.changed = dict(changed) if changed is not None else {**self.arguments, "changed": True}
        self.reaction: Reaction = reaction
        self.answer = answer
        self.max_turns = max_turns
        self.calls = 0
        self.nudges: list[NudgeText] = []
        self._changed_made = False
        self._lock = threading.Lock()

    def see(self, result: Any) -> None:
        """Show the model a tool result (a nudge is a ``NudgeText``)."""
        if isinstance(result, NudgeText):
            with self._lock:
                self.nudges.append(result)

    def __call__(self, *args: Any, **kwargs: Any) -> Decision:
        with self._lock:
            if self.calls >= self.max_turns:
                raise ScriptExhaustedError(f"nudged model called past {self.max_turns} turns")
            self.calls += 1
            if not self.nudges or self.reaction == "ignore":
                return Decision.tool(ToolCall(self.tool, dict(self.arguments)))
            if not self._changed_made:
                self._changed_made = True
                return Decision.tool(ToolCall(self.tool, dict(self.changed)))
            if self.reaction == "obey":
                return Decision.final(self.answer)
            return Decision.tool(ToolCall(self.tool, dict(self.arguments)))


def ignoring_model(tool: str, arguments: dict[str, Any] | None = None, **kw: Any) -> NudgedModel:
    """A :class:`NudgedModel` that ignores every nudge."""
    return NudgedModel(tool, arguments, reaction="ignore", **kw)


def obeying_model(tool: str, arguments: dict[str, Any] | None = None, **kw: Any) -> NudgedModel:
    """A :class:`NudgedModel` that obeys a nudge: changes the call, then answers."""
    return NudgedModel(tool, arguments, reaction="obey", **kw)


def relapsing_model(tool: str, arguments: dict[str, Any] | None = None, **kw: Any) -> NudgedModel:
    """A :class:`NudgedModel` that obeys the first nudge once, then repeats the call."""
    return NudgedModel(tool, arguments, reaction="relapse", **kw)


@dataclass
class _ToolBase:
    name: str = "tool"
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _count(self) -> int:
        with self._lock:
            self.calls += 1
            return self.calls


@dataclass
class ConstantTool(_ToolBase):
    """Always returns the same result (the classic repeated-action loop)."""

    name: str = "get_details_by_id"
    result: Any = field(default_factory=lambda: {"id": 42, "status": "unchanged"})

    def __call__(self, **kwargs: Any) -> Any:
        self._count()
        return self.result


@dataclass
class OscillatingTool(_ToolBase):
    """Alternates between two results: no single repeat, no progress either."""

    name: str = "toggle_state"
    results: tuple[Any, Any] = ({"state": "A"}, {"state": "B"})

    def __call__(self, **kwargs: Any) -> Any:
        n = self._count()
        return self.results[(n - 1) % 2]


@dataclass
class FalseProgressTool(_ToolBase):
    """Only a timestamp changes between calls (volatile, so not progress)."""

    name: str = "check_status"
    start: float = 1_700_000_000.0

    def __call__(self, **kwargs: Any) -> Any:
        n = self._count()
        return {"status": "working", "timestamp": self.start + n}


@dataclass
class EventualTool(_ToolBase):
    """``pending`` for the first ``pending_calls`` calls, then ``done`` (legit polling)."""

    name: str = "poll_job"
    pending_calls: int = 2

    def __call__(self, **kwargs: Any) -> Any:
        n = self._count()
        if n <= self.pending_calls:
            return {"status": "pending", "checked_at": n}
        return {"status": "done", "result": "ok"}


@dataclass
class CursorTool(_ToolBase):
    """Pages through ``pages`` pages (``cursor`` argument, ``next_cursor`` in results)."""

    name: str = "search_orders"
    pages: int = 5
    page_size: int = 3

    def __call__(self, query: str = "", cursor: str | None = None, **kwargs: Any) -> Any:
        self._count()
        page = int(cursor or 0)
        if page >= self.pages:
            return {"items": [], "next_cursor": None}
        items = [f"{query}-{page * self.page_size + i}" for i in range(self.page_size)]
        nxt = str(page + 1) if page + 1 < self.pages else None
        return {"items": items, "next_cursor": nxt}


@dataclass
class HangingTool(_ToolBase):
    """Blocks until :meth:`release` (or ``max_seconds`` of real time, a safety net)."""

    name: str = "slow_export"
    max_seconds: float = 30.0
    _event: threading.Event = field(default_factory=threading.Event, repr=False)

    def __call__(self, **kwargs: Any) -> Any:
        self._count()
        self._event.wait(self.max_seconds)
        return {"status": "finally"}

    def release(self) -> None:
        """Let every blocked call return."""
        self._event.set()


@dataclass
class ErrorTool(_ToolBase):
    """Fails: ``retryable`` (transient) or not (invalid arguments); may recover.

    Attributes:
        fail_times: calls that fail before the tool starts succeeding (None: always).
    """

    name: str = "fetch_invoice"
    retryable: bool = True
    fail_times: int | None = None

    def __call__(self, **kwargs: Any) -> Any:
        n = self._count()
        if self.fail_times is not None and n > self.fail_times:
            return {"invoice": "INV-1", "total": 10}
        if self.retryable:
            raise ToolFailure("upstream 503", FailureClass.TRANSIENT)
        raise ToolFailure("invalid invoice id", FailureClass.INVALID_ARGUMENTS)


# ------------------------------------------------------------------ invariants


class InvariantViolation(AssertionError):
    """A trace invariant does not hold; the message names the run and the rule."""


@dataclass
class RunTrace:
    """The spans of one run, by kind (SDK ``ReadableSpan``-like objects)."""

    run_id: str
    run: Any = None
    decisions: list[Any] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)
    stops: list[Any] = field(default_factory=list)


def collect_runs(spans: Iterable[Any]) -> dict[str, RunTrace]:
    """Group finished spans by ``loopwatch.run.id``.

    Args:
        spans: objects with ``name``, ``attributes``, ``start_time`` and ``end_time``
            (nanoseconds), such as the SDK's ``InMemorySpanExporter.get_finished_spans()``.
    """
    runs: dict[str, RunTrace] = {}
    for span in spans:
        attrs = span.attributes or {}
        run_id = attrs.get(sc.LW_RUN_ID)
        if not run_id:
            continue
        trace_ = runs.setdefault(run_id, RunTrace(run_id))
        event = attrs.get(sc.LW_EVENT)
        if event == sc.EVENT_DECISION:
            trace_.decisions.append(span)
        elif event == sc.EVENT_TOOL_RESULT:
            trace_.tools.append(span)
        elif event == sc.EVENT_STOP:
            trace_.stops.append(span)
        elif attrs.get(sc.GEN_AI_OPERATION_NAME) == sc.OP_INVOKE_AGENT:
            trace_.run = span
    return runs


def _fail(run_id: str, rule: str, detail: str) -> InvariantViolation:
    return InvariantViolation(f"run {run_id}: {rule}: {detail}")


def _check_nudged(run_id: str, span: Any) -> None:
    attrs = span.attributes
    if (
        attrs.get(sc.LW_LOOP_RESPONSE) != sc.RESPONSE_NUDGE
        or int(attrs.get(sc.LW_LOOP_RUNG, 0)) < 1
    ):
        raise _fail(run_id, "a nudged call names its rung", f"{span.name} has none")
    if sc.LW_OBSERVATION_DIGEST in attrs:
        raise _fail(run_id, "a nudged call is not run", f"{span.name} has an observation")


def assert_trace_invariants(spans: Iterable[Any]) -> dict[str, RunTrace]:
    """Check the trace invariants of every run in ``spans``; return the runs.

    Rules (DESIGN section 3):

    1. exactly one stop span per run, and the run span carries the same reason;
    2. nothing after the stop: no decision or tool span starts after the stop span;
    3. every tool success has an earlier start: its span starts before it ends and no
       earlier than the run (a tool may run before the first model call: retrieval
       first);
    4. tool successes <= tool attempts;
    5. counters equal events: the stop's usage counts equal the decision spans, the
       dispatched tool spans (``ok`` + ``error``, not ``unknown_tool``) and the ``ok``
       tool spans, of the run and of its child runs (``loopwatch.parent_run.id`` on
       their run spans), whose use is charged to it;
    6. a nudged call is a tool span (outcome ``nudged``, not dispatched: no observation
       digest) naming its response ``nudge`` and rung, and the stop's
       ``loopwatch.nudges`` lists as many nudges as there are nudged spans (plus
       ``loopwatch.nudges.dropped``).

    Raises:
        InvariantViolation: the first rule that does not hold, naming the run.
    """
    runs = collect_runs(spans)
    own: dict[str, tuple[int, int, int]] = {}
    for run_id, tr in runs.items():
        if len(tr.stops) != 1:
            raise _fail(run_id, "exactly one stop", f"found {len(tr.stops)}")
        stop = tr.stops[0]
        sattrs = stop.attributes
        if tr.run is not None and tr.run.attributes.get(sc.LW_STOP_REASON) != sattrs.get(
            sc.LW_STOP_REASON
        ):
            raise _fail(run_id, "run span carries the stop", "reasons differ")
        for span in itertools.chain(tr.decisions, tr.tools):
            if span.start_time > stop.start_time:
                raise _fail(run_id, "nothing after the stop", f"{span.name} started after the stop")
        ok = attempted = nudged = 0
        for t in tr.tools:
            outcome = t.attributes.get(sc.LW_TOOL_OUTCOME)
            if outcome == sc.OUTCOME_NUDGED:
                nudged += 1
                _check_nudged(run_id, t)
            if outcome == sc.OUTCOME_OK:
                ok += 1
                if t.start_time > t.end_time:
                    raise _fail(
                        run_id, "success has an earlier start", f"{t.name} ends before it starts"
                    )
                if tr.run is not None and t.start_time < tr.run.start_time:
                    raise _fail(
                        run_id, "success has an earlier start", f"{t.name} starts before the run"
                    )
            if (
                outcome in (sc.OUTCOME_OK, sc.OUTCOME_ERROR)
                and t.attributes.get(sc.ERROR_TYPE) != "unknown_tool"
            ):
                attempted += 1
        if ok > attempted:
            raise _fail(run_id, "successes <= attempts", f"{ok} > {attempted}")
        listed = len(json.loads(sattrs.get(sc.LW_NUDGES, "[]")))
        listed += int(sattrs.get(sc.LW_NUDGES_DROPPED, 0))
        if listed != nudged:
            raise _fail(run_id, "nudges equal events", f"{listed} listed, {nudged} nudged spans")
        own[run_id] = (len(tr.decisions), attempted, ok)
    children: dict[str, list[str]] = defaultdict(list)
    for run_id, tr in runs.items():
        parent = tr.run.attributes.get(sc.LW_PARENT_RUN_ID) if tr.run is not None else None
        if parent:
            children[str(parent)].append(run_id)

    def with_children(run_id: str, seen: frozenset[str] = frozenset()) -> tuple[int, int, int]:
        turns, attempted, ok = own.get(run_id, (0, 0, 0))
        for child in children.get(run_id, ()):
            if child not in seen:
                t, a, o = with_children(child, seen | {run_id})
                turns, attempted, ok = turns + t, attempted + a, ok + o
        return turns, attempted, ok

    for run_id, tr in runs.items():
        sattrs = tr.stops[0].attributes
        turns, attempted, ok = with_children(run_id)
        expected = {
            sc.LW_USAGE_MODEL_TURNS: turns,
            sc.LW_USAGE_TOOL_ATTEMPTS: attempted,
            sc.LW_USAGE_TOOL_SUCCESSES: ok,
        }
        if sattrs.get(sc.LW_USAGE_TOOL_SUCCESSES, 0) > sattrs.get(sc.LW_USAGE_TOOL_ATTEMPTS, 0):
            raise _fail(run_id, "successes <= attempts", "stop usage counts")
        for key, count in expected.items():
            if int(sattrs.get(key, -1)) != count:
                raise _fail(
                    run_id, "counters equal events", f"{key}={sattrs.get(key)} but {count} spans"
                )
    return runs
