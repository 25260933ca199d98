"""Recorded trajectories through the real instrumentation into a running collector.

``loopwatch demo`` replays each recorded run as a live agent loop would run it: a
:class:`~loopwatch.instrumentation.Run` (the guard, the spans), a
:class:`~loopwatch.instrumentation.testing.ScriptedModel` that returns the recorded
decisions, and tools that return the recorded observations (or raise where the record
says the call failed). The spans go through the OpenTelemetry SDK and the OTLP/HTTP
exporter to a collector, so stop reasons, loop detections and steps since progress
appear in its DuckDB file, on ``/metrics`` and in the dashboard.

Time is compressed: the guard's clock follows the recorded timestamps (so a recorded
run that took 20 minutes meets a 300 s deadline), but nothing sleeps unless ``speed``
is given (``speed=60``: one recorded minute per real second, each gap capped at
:data:`MAX_SLEEP_SECONDS`). The span times follow the same timeline, and the runs are
spread over the last 24 hours (``window_seconds``; :mod:`loopwatch.replay.demo_time`),
so the dashboard shows a day of production, not one minute.

Content is captured (tool arguments and results on the spans, redacted by the
collector) unless ``capture_content=False``, so a reviewer sees which arguments
repeated. A few runs carry the same planted canary (:data:`DEMO_CANARY`) in every tool
result, so a collector started with it in its canary file (``--canaries``) flags them;
the same text on every result of a run leaves equal results equal, and the stop
unchanged.

Replay rules (one place, so ``loopwatch demo`` is predictable):

* agent steps become decisions (``tool``, ``final``, ``refusal``, ``message``) with the
  recorded token counts and cost; the agent's tool calls are dispatched in order. As in
  ``loopwatch replay`` (:mod:`loopwatch.replay.engine`), only the last agent step can
  be ``final`` or ``refusal``: an earlier one (a chat reply after which the agent acts
  again) is a ``message``.
* a recorded error becomes a :class:`~loopwatch.instrumentation.ToolFailure` whose
  class comes from the observation text, as ``loopwatch replay`` classifies it
  (:func:`loopwatch.replay.engine.classify_recorded_error`); the loop feeds it back and
  continues, as agents do.
* user and environment turns are not decisions; a turn whose text or tool observation
  was not seen before in the run is progress evidence (``run.progress``): new input from
  the environment, never the model's say-so (DESIGN section 2).
* the end of the record: a ``final`` decision ends the run through the guard; otherwise
  the recording's step cap (:func:`~loopwatch.replay.recorded.recorded_cap`: tau2
  ``max_steps``, ToolBench ``single_chain_max_step``, OpenHands ``max_iterations``...)
  ends it as ``budget_exhausted`` (``model_turns``), with the cap as the evidence
  (``framework_limit``: the format and ``label=value``); another recorded stop that names
  a cut-off (error cap, time limit, cancellation: :data:`CUT_OFF_STOP`) ends it as
  ``cancelled`` with that label as the evidence (the framework ended it, not the agent);
  a recorded crash (own format) ends it as ``error``; anything else ends it with the last
  agent text as the answer.
* the goal check is the recorded outcome: ``success`` passes, ``failure`` fails
  (``final_unverified``), ``unknown`` has no goal check.

The shipped example runs (:data:`EXAMPLES_DIR`, written by
:mod:`loopwatch.replay.examples`) are in loopwatch's own JSON form,
``loopwatch.trajectory/1`` (:mod:`loopwatch.replay.importers.native`; also read by
``loopwatch replay``): one run per stop reason, covering the seven adversarial tool
shapes, each with the policy it was recorded under (``metadata.replay.policy``).
Sending the spans is :mod:`loopwatch.replay.export`.

Example::

    report = run_demo(["../shared/corpus/tau2-bench"], otlp_url=DEFAULT_OTLP_URL)
    print(report.summary())   # runs sent, stops by reason, spans exported
"""

from __future__ import annotations

import builtins
import contextlib
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from loopwatch.instrumentation import (
    Decision,
    Dimension,
    Outcome,
    Policy,
    Run,
    StopReason,
    ToolFailure,
)
from loopwatch.instrumentation.testing import FakeClock, ScriptedModel

from .demo_time import DEFAULT_WINDOW_SECONDS, SpanTimeline, run_starts
from .export import (
    DEFAULT_OTLP_URL,
    CollectorUnreachable,
    SpanCounts,
    check_collector,
    counting_provider,
    otlp_endpoint,
)
from .importers import ImportResult, load_paths
from .importers.native import FORMAT, write_trajectories
from .policy_choice import DEFAULT_POLICY_FILE, recorded_policy, resolve_policy
from .recorded import (
    decoded_observation,
    recorded_cap,
    recorded_decision,
    recorded_failure_class,
)
from .shipped_examples import EXAMPLES_DIR, record_examples
from .trajectory import AGENT, FAILURE, SUCCESS, ImportProblem, Step, ToolCall, Trajectory

__all__ = [
    "CUT_OFF_STOP",
    "DEFAULT_OTLP_URL",
    "DEFAULT_POLICY_FILE",
    "DEFAULT_WINDOW_SECONDS",
    "DEMO_CANARY",
    "EXAMPLES_DIR",
    "FORMAT",
    "MAX_SLEEP_SECONDS",
    "CollectorUnreachable",
    "DemoReport",
    "ReplayedRun",
    "check_collector",
    "default_corpus",
    "demo_run_id",
    "otlp_endpoint",
    "record_examples",
    "recorded_duration",
    "replay_trajectory",
    "resolve_policy",
    "run_demo",
    "write_trajectories",
]

MAX_SLEEP_SECONDS: Final = 5.0
"""With ``speed`` set, the longest real pause for one recorded gap (seconds)."""

CUT_OFF_STOP: Final = re.compile(
    r"max|limit|too_many|halt|timeout|time_out|cap\b|iteration|exceed|budget|cancel",
    re.IGNORECASE,
)
"""Recorded stop labels meaning the framework ended the run (tau2 ``max_steps`` and
``too_many_errors``, ReAct ``HALTED``, OpenHands max iterations, tau-bench's inferred
step cap): replayed as ``budget_exhausted`` when :func:`recorded_cap` knows the label as a
step cap, else as ``cancelled`` with the label as evidence, when the guard had not stopped
the run first."""

DEMO_CANARY: Final = "lw-canary-demo-6b3e91f4"
"""The canary the demo plants in a few runs (put it in the collector's ``--canaries``
file to see them flagged)."""

_CANARY_RUNS: Final = 4  # about this many runs carry the canary

_RUN_ID_CHARS: Final = re.compile(r"[^A-Za-z0-9._=:+-]+")
_MAX_RUN_ID_PART: Final = 120
_FLUSH_BACKLOG_SPANS: Final = 4096


def demo_run_id(prefix: str, index: int, trajectory: Trajectory) -> str:
    """The ``loopwatch.run.id`` of the ``index``-th replayed run: ``PREFIX.NNNN.SOURCE_ID``.

    The source run id is kept readable (characters outside ``[A-Za-z0-9._=:+-]`` become
    ``-``, at most 120 of them); the prefix makes ids unique across demo sessions
    sharing one database (a run id seen twice would be one run with two stops).
    """
    part = _RUN_ID_CHARS.sub("-", trajectory.run_id).strip("-")[:_MAX_RUN_ID_PART]
    return f"{prefix}.{index:04d}.{part or 'run'}"


def default_corpus(cwd: Path | None = None) -> Path | None:
    """``../shared/corpus`` relative to ``cwd`` (default: the current directory), else
    relative to the source checkout this package runs from; None when neither exists."""
    here = Path.cwd() if cwd is None else cwd
    candidates = [here.parent / "shared" / "corpus"]
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file():
        candidates.append(checkout.parent / "shared" / "corpus")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return None


@dataclass(frozen=True)
class ReplayedRun:
    """One replayed run: its new run id, the source run, and the guard's outcome."""

    run_id: str
    source: str
    source_run_id: str
    outcome: Outcome

    @property
    def stop_reason(self) -> str:
        """The stop reason value (``repeated_action``...)."""
        return str(self.outcome.stop.reason.value)


def _crash_exception(spec: Mapping[str, Any]) -> BaseException:
    """The recorded exception: a built-in exception type by name, else a RuntimeError."""
    name = str(spec.get("type", "RuntimeError"))
    message = str(spec.get("message", "recorded crash"))[:200]
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, Exception):
        return found(message)
    return RuntimeError(f"{name}: {message}")


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    return {"arguments": value}


def _decision(step: Step, last: bool) -> Decision:
    usage = {
        "input_tokens": step.input_tokens or 0,
        "output_tokens": step.output_tokens or 0,
        "cost_usd": step.cost_usd or 0.0,
    }
    return recorded_decision(step, last=last, usage=usage, arguments=_arguments)


def _replay_settings(trajectory: Trajectory) -> Mapping[str, Any]:
    settings = trajectory.metadata.get("replay") if trajectory.metadata else None
    return settings if isinstance(settings, Mapping) else {}


def _first_timestamp(steps: Sequence[Step]) -> float | None:
    for step in steps:
        if step.timestamp is not None:
            return step.timestamp
        for call in step.tool_calls:
            if call.started_at is not None:
                return call.started_at
    return None


def _last_timestamp(steps: Sequence[Step]) -> float | None:
    times = [
        t
        for s in steps
        for t in (
            s.timestamp,
            *(c.ended_at for c in s.tool_calls),
            *(c.started_at for c in s.tool_calls),
        )
        if t is not None
    ]
    return max(times) if times else None


def recorded_duration(trajectory: Trajectory) -> float:
    """Seconds from the run's first recorded timestamp to its last (0 without any)."""
    first, last = _first_timestamp(trajectory.steps), _last_timestamp(trajectory.steps)
    return max(last - first, 0.0) if first is not None and last is not None else 0.0


class _Timeline:
    """The guard's clock following the recorded timestamps (and optional real pauses);
    the span times follow it when ``spans`` is given."""

    def __init__(
        self,
        steps: Sequence[Step],
        speed: float,
        sleep: Callable[[float], None],
        spans: SpanTimeline | None = None,
    ) -> None:
        self.t0 = _first_timestamp(steps)
        self.clock = FakeClock(start=0.0)
        self._speed = speed
        self._sleep = sleep
        self._spans = spans

    def at(self, timestamp: float | None) -> None:
        """Move to ``timestamp`` (Unix seconds); earlier or unknown times do not move it."""
        if timestamp is None or self.t0 is None:
            return
        gap = (timestamp - self.t0) - self.clock()
        if gap <= 0:
            return
        self.clock.advance(gap)
        if self._spans is not None:
            self._spans.advance(gap)
        if self._speed > 0:
            self._sleep(min(gap / self._speed, MAX_SLEEP_SECONDS))


def replay_trajectory(
    trajectory: Trajectory,
    policy: Policy,
    *,
    run_id: str,
    tracer_provider: Any = None,
    speed: float = 0.0,
    capture_content: bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
    policy_override: bool = True,
    span_timeline: SpanTimeline | None = None,
    canary: str | None = None,
) -> Outcome:
    """Replay one recorded run through a guarded :class:`Run` (the rules in the module
    docstring) and return the guard's outcome.

    Args:
        trajectory: the recorded run.
        policy: the replay policy.
        run_id: the new run's ``loopwatch.run.id``.
        tracer_provider: where the spans go (the global provider when None).
        speed: 0 replays as fast as possible; ``k > 0`` pauses ``gap / k`` real seconds
            for each recorded gap (at most :data:`MAX_SLEEP_SECONDS` each).
        capture_content: record tool arguments and results on spans (None: follow
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``).
        sleep: the pause function (tests pass a recorder).
        policy_override: True: ``policy`` wins over a policy recorded in the run's
            ``metadata.replay.policy`` (own format); False: the recorded one wins.
        span_timeline: moves with the recorded clock (span times follow the recording).
        canary: planted in every tool result of the run (module docstring).

    Raises:
        ValueError: the run's recorded policy is invalid.
    """
    settings = _replay_settings(trajectory)
    recorded = settings.get("policy")
    if isinstance(recorded, Mapping) and not policy_override:
        policy = recorded_policy(recorded, f"{trajectory.source}: {trajectory.run_id}")
    mode: Literal["enforce", "observe"] = (
        "observe" if settings.get("mode") == "observe" else "enforce"
    )
    goal: Callable[[Any], bool] | None = None
    if trajectory.recorded_outcome in (SUCCESS, FAILURE):
        passed = trajectory.recorded_outcome == SUCCESS
        goal = lambda _answer: passed  # noqa: E731 - the recorded verdict, whatever the answer

    timeline = _Timeline(trajectory.steps, speed, sleep, span_timeline)
    agent_steps = [s for s in trajectory.steps if s.actor == AGENT]

    def scripted(step: Step, decision: Decision) -> Callable[..., Decision]:
        def answer(_index: int, *_args: Any) -> Decision:
            timeline.at(step.timestamp)
            return decision

        return answer

    last = len(agent_steps) - 1
    model = ScriptedModel([scripted(s, _decision(s, i == last)) for i, s in enumerate(agent_steps)])
    run = Run(
        trajectory.agent,
        policy.with_env({}),  # recorded runs replay as recorded, whatever the shell sets
        mode=mode,
        goal_check=goal,
        capture_content=capture_content,
        clock=timeline.clock,
        run_id=run_id,
        tracer_provider=tracer_provider,
        conversation_id=trajectory.run_id[:256],
    )
    crash = settings.get("crash")
    crash_exc = _crash_exception(crash) if isinstance(crash, Mapping) else None
    try:
        _play(run, trajectory, model, timeline, crash_exc, canary=canary)
    except BaseException as exc:
        if crash_exc is None or exc is not crash_exc:
            raise
    return run.outcome


def _play(
    run: Run,
    trajectory: Trajectory,
    model: ScriptedModel,
    timeline: _Timeline,
    crash_exc: BaseException | None,
    *,
    canary: str | None = None,
) -> None:
    seen_inputs: set[str] = set()
    last_text: str | None = None
    with run:
        for step in trajectory.steps:
            if step.actor != AGENT:
                timeline.at(step.timestamp)
                fresh = [step.text or ""] + [c.observation or "" for c in step.tool_calls]
                new = [t for t in fresh if t.strip() and t not in seen_inputs]
                seen_inputs.update(new)
                if new:
                    run.progress("new input from the environment")
                continue
            decision = run.decide(model)
            if step.text:
                last_text = step.text
            if decision.type.value == "final":
                run.finish(decision.answer)
                break
            for call, recorded in zip(decision.tool_calls, step.tool_calls, strict=True):
                timeline.at(recorded.started_at)
                with contextlib.suppress(ToolFailure, TimeoutError):
                    run.call_tool(
                        call.name,
                        call.arguments,
                        fn=_recorded_tool(recorded, canary),
                        call_id=call.call_id,
                    )
                timeline.at(recorded.ended_at)
        else:
            if crash_exc is not None:
                raise crash_exc
            _end_unfinished(run, trajectory, last_text)


def _end_unfinished(run: Run, trajectory: Trajectory, last_text: str | None) -> None:
    """End a run whose record stops without a final answer (module docstring)."""
    cap = recorded_cap(trajectory)
    if cap is not None:
        turns = sum(1 for s in trajectory.steps if s.actor == AGENT)
        run.framework_stop(
            StopReason.BUDGET_EXHAUSTED,
            framework=cap.framework,
            limit_name=cap.name,
            dimension=Dimension.MODEL_TURNS,
            limit=cap.limit,
            observed=turns if cap.limit is not None else None,
        )
    elif trajectory.recorded_stop and CUT_OFF_STOP.search(trajectory.recorded_stop):
        # Who cancelled and why: the recording's format and its stop label (an own-format
        # run's example text says it in words: "cancelled by the caller").
        example = _replay_settings(trajectory).get("example")
        why = example if isinstance(example, str) and example else trajectory.recorded_stop
        run.framework_stop(
            StopReason.CANCELLED,
            framework=trajectory.format or "recording",
            limit_name=why[:120],
        )
    else:
        run.finish(last_text)


def _with_canary(value: Any, canary: str | None) -> Any:
    """``value`` with ``canary`` added the same way to every result (dict: one more key;
    anything else: text after it), so equal results stay equal."""
    if canary is None:
        return value
    if isinstance(value, Mapping):
        return {**value, "note": f"copied from the support log: {canary}"}
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    return f"{text}\n(debug_token={canary})"


def _recorded_tool(recorded: ToolCall, canary: str | None = None) -> Callable[..., Any]:
    def tool(**_arguments: Any) -> Any:
        if recorded.error:
            raise ToolFailure(
                (recorded.observation or "recorded error")[:200],
                recorded_failure_class(recorded),
            )
        return _with_canary(decoded_observation(recorded.observation), canary)

    return tool


@dataclass
class DemoReport:
    """What a demo sent.

    Attributes:
        runs: every replayed run, in order.
        sources: the corpus paths read, or ``["<shipped examples>"]``.
        problems: import problems (not fatal).
        spans_ended / spans_exported / spans_failed: spans finished by the runs, accepted
            by the collector, and refused or lost (connection, 4xx/5xx after retries).
        replay_errors: runs that could not be replayed (``source: run: message``).
        interrupted: the demo stopped early (``stop`` event set).
    """

    runs: list[ReplayedRun] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    problems: list[ImportProblem] = field(default_factory=list)
    spans_ended: int = 0
    spans_exported: int = 0
    spans_failed: int = 0
    replay_errors: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def stops(self) -> Counter[str]:
        """Runs by stop reason."""
        return Counter(r.stop_reason for r in self.runs)

    @property
    def ok(self) -> bool:
        """Every finished span was accepted by the collector."""
        return self.spans_failed == 0 and self.spans_exported == self.spans_ended

    def summary(self) -> str:
        """A few lines: runs sent, stops by reason, spans exported."""
        stops = ", ".join(f"{reason} {n}" for reason, n in sorted(self.stops.items()))
        lines = [
            f"loopwatch demo: replayed {len(self.runs)} runs from {', '.join(self.sources)}",
            f"  stops: {stops or 'none'}",
            f"  spans exported: {self.spans_exported} of {self.spans_ended}"
            + (f" ({self.spans_failed} failed)" if self.spans_failed else ""),
        ]
        if self.problems:
            lines.append(f"  import problems: {len(self.problems)} (records skipped)")
        if self.replay_errors:
            lines.append(f"  runs not replayed: {len(self.replay_errors)}")
        if self.interrupted:
            lines.append("  interrupted before the end")
        return "\n".join(lines)


def run_demo(
    corpus: Sequence[str | Path] | None = None,
    *,
    otlp_url: str | None = None,
    policy: str | None = None,
    speed: float = 0.0,
    capture_content: bool | None = True,
    token: str | None = None,
    run_prefix: str | None = None,
    limit: int | None = None,
    stop: threading.Event | None = None,
    on_problem: Callable[[str], None] | None = None,
    timeout_seconds: float = 10.0,
    window_seconds: float = DEFAULT_WINDOW_SECONDS,
    canary: str | None = DEMO_CANARY,
) -> DemoReport:
    """Replay recorded runs into the collector at ``otlp_url``; flushes before returning.

    Args:
        corpus: files or folders in any importer format or ``loopwatch.trajectory/1``.
            None: :func:`default_corpus`, else the shipped examples (:data:`EXAMPLES_DIR`).
        otlp_url: the collector's OTLP/HTTP traces URL (see :func:`otlp_endpoint`).
        policy: replay policy spec (see :func:`resolve_policy`). Without one, a run that
            records its policy (``metadata.replay.policy``: the shipped examples) runs
            under it, every other run under the default replay policy.
        speed: see :func:`replay_trajectory`.
        capture_content: record tool arguments and results on spans (default True;
            None follows ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``).
        token: bearer token of a collector started with ``--token-file``.
        run_prefix: run-id prefix (default ``demo-`` + 6 random hex digits).
        limit: replay at most this many runs.
        stop: set it to stop after the current run (``loopwatch up`` on Ctrl-C); spans
            not exported yet are then dropped, as on KeyboardInterrupt.
        on_problem: called with one line per import problem or replay error.
        timeout_seconds: OTLP export timeout.
        window_seconds: spread the runs' span times over the last this many seconds
            (default 24 h); 0 sends them at the time they are replayed.
        canary: planted in about four runs' tool results (None: none).

    Returns:
        A :class:`DemoReport` (the exporter has been flushed and shut down).

    Raises:
        CollectorUnreachable: nothing answers at ``otlp_url``.
        PolicyError: invalid ``policy``.
        ValueError: ``corpus`` holds no readable run.
        ImportError: the ``otlp`` extra is missing.
    """
    url = otlp_endpoint(otlp_url)
    chosen = resolve_policy(policy)
    report = DemoReport()
    paths: list[str | Path]
    if corpus:
        paths = list(corpus)
    else:
        found = default_corpus()
        paths = [found] if found is not None else []
    loaded = load_paths(paths) if paths else ImportResult()
    report.problems = list(loaded.problems)
    trajectories = loaded.trajectories
    examples = False
    if not trajectories:
        if corpus:
            raise ValueError(
                f"no readable run in {', '.join(str(p) for p in corpus)}"
                + (f" (first problem: {loaded.problems[0]})" if loaded.problems else "")
            )
        shipped = load_paths([EXAMPLES_DIR])
        report.problems.extend(shipped.problems)
        trajectories = shipped.trajectories
        examples = True
    report.sources = ["<shipped examples>"] if examples else [str(p) for p in paths]
    if on_problem is not None:
        for problem in report.problems:
            on_problem(str(problem))
    if limit is not None:
        trajectories = trajectories[: max(limit, 0)]
    check_collector(url, token=token, timeout_seconds=min(timeout_seconds, 5.0))
    counts = SpanCounts()
    spans = SpanTimeline() if window_seconds > 0 else None
    starts = (
        run_starts(
            [recorded_duration(t) for t in trajectories],
            now=time.time(),
            window_seconds=window_seconds,
        )
        if spans is not None and trajectories
        else []
    )
    every = max(len(trajectories) // _CANARY_RUNS, 1)
    provider, exporter = counting_provider(url, counts, token, timeout_seconds, spans)
    prefix = run_prefix or f"demo-{secrets.token_hex(3)}"
    abandon = False
    try:
        for index, trajectory in enumerate(trajectories):
            if stop is not None and stop.is_set():
                report.interrupted = True
                break
            run_id = demo_run_id(prefix, index, trajectory)
            if spans is not None:
                spans.start_run(starts[index])
            try:
                outcome = replay_trajectory(
                    trajectory,
                    chosen,
                    run_id=run_id,
                    tracer_provider=provider,
                    speed=speed,
                    capture_content=capture_content,
                    policy_override=policy is not None,
                    span_timeline=spans,
                    canary=canary if index % every == every // 2 else None,
                )
            except (ValueError, TypeError) as exc:
                message = f"{trajectory.source}: {trajectory.run_id}: {exc}"
                report.replay_errors.append(message)
                if on_problem is not None:
                    on_problem(message)
                continue
            report.runs.append(ReplayedRun(run_id, trajectory.source, trajectory.run_id, outcome))
            with counts.lock:
                backlog = counts.ended - counts.exported - counts.failed
            if backlog > _FLUSH_BACKLOG_SPANS:
                provider.force_flush(int(timeout_seconds * 1000))
    except BaseException:
        # Ctrl-C (or a bug): do not spend the export timeout per queued batch (minutes
        # against a collector answering 429/5xx) before giving the terminal back.
        abandon = True
        raise
    finally:
        if abandon or report.interrupted:
            exporter.shutdown()
        else:
            provider.force_flush(int(timeout_seconds * 3000))
        provider.shutdown()
    with counts.lock:
        report.spans_ended = counts.ended
        report.spans_exported = counts.exported
        report.spans_failed = counts.failed
    return report
