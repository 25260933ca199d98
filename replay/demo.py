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
:data:`MAX_SLEEP_SECONDS`).

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
  a recorded stop that names a cut-off (step cap, error cap, halt, time limit:
  :data:`CUT_OFF_STOP`) ends it as ``cancelled`` (the framework ended it, not the
  agent); a recorded crash (own format) ends it as ``error``; anything else ends it with
  the last agent text as the answer.
* the goal check is the recorded outcome: ``success`` passes, ``failure`` fails
  (``final_unverified``), ``unknown`` has no goal check.

The shipped example runs (``replay/examples/*.json``) are in this module's own JSON
form, ``loopwatch.trajectory/1`` (:mod:`loopwatch.replay.importers.native`; also read by
``loopwatch replay``),
which carries everything the data model holds plus, per run, the policy it was
recorded under (``metadata.replay.policy``, a profile table of the policy file format)
and its expected stop. They were recorded from
:mod:`loopwatch.instrumentation.examples` (:func:`record_examples`): one run per stop
reason, covering the seven adversarial tool shapes.

Example::

    report = run_demo(["../shared/corpus/tau2-bench"], otlp_url=DEFAULT_OTLP_URL)
    print(report.summary())   # runs sent, stops by reason, spans exported
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import re
import secrets
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from loopwatch.instrumentation import (
    Decision,
    Outcome,
    Policy,
    PolicyError,
    Run,
    ToolFailure,
    builtin_profiles,
)
from loopwatch.instrumentation import ToolCall as GuardToolCall
from loopwatch.instrumentation.policy import policy_from_table
from loopwatch.instrumentation.testing import FakeClock, ScriptedModel

from .engine import DEFAULT_POLICY_FILE, classify_recorded_error, default_policy, load_policy_spec
from .importers import ImportResult, load_paths, read_file
from .importers.native import FORMAT, write_trajectories
from .importers.native import NAME as NATIVE_FORMAT_NAME
from .trajectory import (
    AGENT,
    FAILURE,
    SUCCESS,
    UNKNOWN,
    USER,
    ImportProblem,
    Step,
    ToolCall,
    Trajectory,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = [
    "CUT_OFF_STOP",
    "DEFAULT_OTLP_URL",
    "DEFAULT_POLICY_FILE",
    "EXAMPLES_DIR",
    "FORMAT",
    "MAX_SLEEP_SECONDS",
    "CollectorUnreachable",
    "DemoReport",
    "ReplayedRun",
    "check_collector",
    "default_corpus",
    "demo_run_id",
    "load_trajectories",
    "otlp_endpoint",
    "read_trajectories",
    "record_examples",
    "replay_trajectory",
    "resolve_policy",
    "run_demo",
    "write_trajectories",
]

"""The ``format`` value of this module's own trajectory files."""

EXAMPLES_DIR: Final = Path(__file__).resolve().parent / "examples"
"""The shipped example runs (package data)."""


DEFAULT_OTLP_URL: Final = "http://127.0.0.1:4318/v1/traces"
"""The collector's default OTLP/HTTP traces URL."""

MAX_SLEEP_SECONDS: Final = 5.0
"""With ``speed`` set, the longest real pause for one recorded gap (seconds)."""

CUT_OFF_STOP: Final = re.compile(
    r"max|limit|too_many|halt|timeout|time_out|cap\b|iteration|exceed|budget|cancel",
    re.IGNORECASE,
)
"""Recorded stop labels meaning the framework ended the run (tau2 ``max_steps`` and
``too_many_errors``, ReAct ``HALTED``, OpenHands max iterations, tau-bench's inferred
step cap): replayed as ``cancelled`` when the guard had not stopped the run first."""

_RUN_ID_CHARS = re.compile(r"[^A-Za-z0-9._=:+-]+")
_MAX_RUN_ID_PART = 120
_SERVICE_NAME = "loopwatch-demo"
_FLUSH_BACKLOG_SPANS = 4096
_OTLP_HINT = "loopwatch demo needs the OTLP exporter: pip install 'loopwatch[otlp]'"


class CollectorUnreachable(ConnectionError):
    """The OTLP endpoint did not answer (connection refused, DNS, timeout).

    The message is one line naming the URL and the cause.
    """


def demo_run_id(prefix: str, index: int, trajectory: Trajectory) -> str:
    """The ``loopwatch.run.id`` of the ``index``-th replayed run: ``PREFIX.NNNN.SOURCE_ID``.

    The source run id is kept readable (characters outside ``[A-Za-z0-9._=:+-]`` become
    ``-``, at most 120 of them); the prefix makes ids unique across demo sessions
    sharing one database (a run id seen twice would be one run with two stops).
    """
    part = _RUN_ID_CHARS.sub("-", trajectory.run_id).strip("-")[:_MAX_RUN_ID_PART]
    return f"{prefix}.{index:04d}.{part or 'run'}"


# ------------------------------------------------------------------ policies


def resolve_policy(spec: str | None = None) -> Policy:
    """The replay policy, chosen as ``loopwatch replay`` chooses it.

    Args:
        spec: a built-in profile name (``investigate-readonly``...), or ``FILE[:PROFILE]``
            as ``loopwatch replay --policy`` takes it (``default`` and ``seed`` name the
            shipped files; without ``:PROFILE`` the file's first profile). None: the
            first profile of :data:`~loopwatch.replay.engine.DEFAULT_POLICY_FILE`, or
            the guard's default profile when that file is absent.

    Raises:
        PolicyError: unreadable or invalid file, unknown profile.
    """
    if spec is None:
        return default_policy().policy if DEFAULT_POLICY_FILE.is_file() else Policy()
    builtin = builtin_profiles()
    if spec in builtin:
        return builtin[spec]
    return load_policy_spec(spec)[0].policy


def _policy_from_table(table: Mapping[str, Any], where: str) -> Policy:
    """A policy from a profile table of the policy file format (``name`` added), checked
    by the policy file's own rules (every limit and tool setting).

    Raises:
        ValueError: not a valid profile (the message names ``where``).
    """
    raw = dict(table)
    name = str(raw.pop("name", "recorded"))
    raw["version"] = str(raw.get("version", "recorded"))
    try:
        return policy_from_table(name, raw, source=where)
    except PolicyError as exc:
        first = exc.problems[0] if exc.problems else None
        why = f"{first.path}: {first.reason}" if first is not None else str(exc)
        raise ValueError(f"{where}: invalid policy: {why[:200]}") from None


def _policy_to_table(policy: Policy) -> dict[str, Any]:
    """The limits set in ``policy`` (not the defaults) as a profile table."""
    table: dict[str, Any] = {"name": policy.name, "version": policy.version}
    for key, entry in policy.limits().items():
        if entry["source"] != "default":
            table[key] = entry["value"]
    tools: dict[str, Any] = {}
    for name, tp in policy.tools.items():
        spec: dict[str, Any] = {"risk": tp.risk}
        if tp.volatile:
            spec["volatile"] = sorted(tp.volatile)
        if tp.progress:
            spec["progress"] = sorted(tp.progress)
        for key in ("repeat_limit", "idempotency_key", "timeout_seconds"):
            if getattr(tp, key) is not None:
                spec[key] = getattr(tp, key)
        tools[name] = spec
    if tools:
        table["tools"] = tools
    return table


# ------------------------------------------------------ own trajectory format


def read_trajectories(path: str | Path) -> ImportResult:
    """Read a ``loopwatch.trajectory/1`` file (see :mod:`loopwatch.replay.importers.native`)."""
    return read_file(path, format=NATIVE_FORMAT_NAME)


def load_trajectories(paths: Sequence[str | Path]) -> ImportResult:
    """Every run under ``paths`` (files or folders, any importer format), in order;
    problems (unknown format, malformed record) are collected, not raised."""
    return load_paths(paths)


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


# --------------------------------------------------------------------- replay


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


def _observation_value(text: str | None) -> Any:
    """The recorded observation as the tool's return value: parsed JSON when it is JSON
    (so progress fields such as ``next_cursor`` are seen), else the text."""
    if text is None:
        return None
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except (ValueError, RecursionError):
            return text
    return text


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    return {"arguments": value}


def _decision_of(step: Step, last: bool) -> Decision:
    usage: dict[str, Any] = {
        "input_tokens": step.input_tokens or 0,
        "output_tokens": step.output_tokens or 0,
        "cost_usd": step.cost_usd or 0.0,
    }
    if step.tool_calls:
        calls = [GuardToolCall(c.name, _arguments(c.arguments), c.call_id) for c in step.tool_calls]
        return Decision.tool(*calls, **usage)
    if last and step.decision == "final":
        return Decision.final(step.text, **usage)
    if last and step.decision == "refusal":
        return Decision.refusal(step.text, **usage)
    return Decision.message(step.text, **usage)


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


class _Timeline:
    """The guard's clock following the recorded timestamps (and optional real pauses)."""

    def __init__(self, steps: Sequence[Step], speed: float, sleep: Callable[[float], None]) -> None:
        self.t0 = _first_timestamp(steps)
        self.clock = FakeClock(start=0.0)
        self._speed = speed
        self._sleep = sleep

    def at(self, timestamp: float | None) -> None:
        """Move to ``timestamp`` (Unix seconds); earlier or unknown times do not move it."""
        if timestamp is None or self.t0 is None:
            return
        gap = (timestamp - self.t0) - self.clock()
        if gap <= 0:
            return
        self.clock.advance(gap)
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

    Raises:
        ValueError: the run's recorded policy is invalid.
    """
    settings = _replay_settings(trajectory)
    recorded_policy = settings.get("policy")
    if isinstance(recorded_policy, Mapping) and not policy_override:
        policy = _policy_from_table(recorded_policy, f"{trajectory.source}: {trajectory.run_id}")
    mode = "observe" if settings.get("mode") == "observe" else "enforce"
    goal: Callable[[Any], bool] | None = None
    if trajectory.recorded_outcome in (SUCCESS, FAILURE):
        passed = trajectory.recorded_outcome == SUCCESS
        goal = lambda _answer: passed  # noqa: E731 - the recorded verdict, whatever the answer

    timeline = _Timeline(trajectory.steps, speed, sleep)
    agent_steps = [s for s in trajectory.steps if s.actor == AGENT]

    def scripted(step: Step, decision: Decision) -> Callable[..., Decision]:
        def answer(_index: int, *_args: Any) -> Decision:
            timeline.at(step.timestamp)
            return decision

        return answer

    last = len(agent_steps) - 1
    model = ScriptedModel(
        [scripted(s, _decision_of(s, i == last)) for i, s in enumerate(agent_steps)]
    )
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
        _drive(run, trajectory, model, timeline, crash_exc)
    except BaseException as exc:
        if crash_exc is None or exc is not crash_exc:
            raise
    return run.outcome


def _drive(
    run: Run,
    trajectory: Trajectory,
    model: ScriptedModel,
    timeline: _Timeline,
    crash_exc: BaseException | None,
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
                        call.name, call.arguments, fn=_recorded_tool(recorded), call_id=call.call_id
                    )
                timeline.at(recorded.ended_at)
        else:
            if crash_exc is not None:
                raise crash_exc
            if trajectory.recorded_stop and CUT_OFF_STOP.search(trajectory.recorded_stop):
                run.cancel()
            else:
                run.finish(last_text)


def _recorded_tool(recorded: ToolCall) -> Callable[..., Any]:
    def tool(**_arguments: Any) -> Any:
        if recorded.error:
            raise ToolFailure(
                (recorded.observation or "recorded error")[:200],
                classify_recorded_error(recorded.observation),
            )
        return _observation_value(recorded.observation)

    return tool


# ----------------------------------------------------------------- exporting


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended = 0
        self.exported = 0
        self.failed = 0
        self.first_error: str | None = None


def _counting_exporter(inner: SpanExporter, counts: _Counts) -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            result = inner.export(spans)
            with counts.lock:
                if result == SpanExportResult.SUCCESS:
                    counts.exported += len(spans)
                else:
                    counts.failed += len(spans)
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return inner.force_flush(timeout_millis)

    return CountingExporter()


def _provider(
    otlp_url: str, counts: _Counts, token: str | None, timeout_seconds: float
) -> tuple[TracerProvider, SpanExporter]:
    """The demo's tracer provider and its OTLP exporter (shut the exporter down first to
    abandon queued spans: its retries stop and later exports fail at once)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(_OTLP_HINT) from exc

    class EndCounter(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            with counts.lock:
                counts.ended += 1

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # run_demo shuts the provider down itself; an atexit flush towards a collector that
    # is already gone would only delay the exit of ``loopwatch up``.
    provider = TracerProvider(
        resource=Resource.create({"service.name": _SERVICE_NAME}), shutdown_on_exit=False
    )
    provider.add_span_processor(EndCounter())
    exporter = OTLPSpanExporter(endpoint=otlp_url, headers=headers, timeout=timeout_seconds)
    provider.add_span_processor(
        BatchSpanProcessor(
            _counting_exporter(exporter, counts),
            max_queue_size=1 << 16,
            schedule_delay_millis=200,
            max_export_batch_size=512,
        )
    )
    return provider, exporter


def otlp_endpoint(url: str | None) -> str:
    """The traces URL: ``url``, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else the local default
    ``http://127.0.0.1:4318/v1/traces`` (the OpenTelemetry exporter variables, read as
    :func:`loopwatch.instrumentation.otlp.configure_otlp` reads them). A ``url`` with no
    path (``http://127.0.0.1:4318``) is a base endpoint and gets ``/v1/traces``, as
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` does (OTLP exporter specification)."""
    if url:
        if urllib.parse.urlsplit(url).path in ("", "/"):
            return url.rstrip("/") + "/v1/traces"
        return url
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return traces or (
        base.rstrip("/") + "/v1/traces" if base else "http://127.0.0.1:4318/v1/traces"
    )


def check_collector(
    otlp_url: str, *, token: str | None = None, timeout_seconds: float = 5.0
) -> None:
    """Send an empty OTLP/HTTP export request; any HTTP answer but 401/403 means reachable.

    Raises:
        CollectorUnreachable: no connection, or the collector refused the token (one-line
            message naming the URL).
    """
    request = urllib.request.Request(
        otlp_url,
        data=b"",
        method="POST",
        headers={
            "Content-Type": "application/x-protobuf",
            **({"Authorization": f"Bearer {token}"} if token else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise CollectorUnreachable(
                f"the collector at {otlp_url} refused the request ({exc.code}): pass --token-file"
            ) from None
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        text = getattr(reason, "strerror", None) or str(reason)
        raise CollectorUnreachable(
            f"cannot reach the collector at {otlp_url}: {text}"
            " (start one with `loopwatch collector` or `loopwatch up`)"
        ) from None


# ----------------------------------------------------------------------- demo


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
    capture_content: bool | None = None,
    token: str | None = None,
    run_prefix: str | None = None,
    limit: int | None = None,
    stop: threading.Event | None = None,
    on_problem: Callable[[str], None] | None = None,
    timeout_seconds: float = 10.0,
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
        capture_content: record tool arguments and results on spans.
        token: bearer token of a collector started with ``--token-file``.
        run_prefix: run-id prefix (default ``demo-`` + 6 random hex digits).
        limit: replay at most this many runs.
        stop: set it to stop after the current run (``loopwatch up`` on Ctrl-C); spans
            not exported yet are then dropped, as on KeyboardInterrupt.
        on_problem: called with one line per import problem or replay error.
        timeout_seconds: OTLP export timeout.

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
    loaded = load_trajectories(paths) if paths else ImportResult()
    report.problems = list(loaded.problems)
    trajectories = loaded.trajectories
    examples = False
    if not trajectories:
        if corpus:
            raise ValueError(
                f"no readable run in {', '.join(str(p) for p in corpus)}"
                + (f" (first problem: {loaded.problems[0]})" if loaded.problems else "")
            )
        shipped = load_trajectories([EXAMPLES_DIR])
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
    counts = _Counts()
    provider, exporter = _provider(url, counts, token, timeout_seconds)
    prefix = run_prefix or f"demo-{secrets.token_hex(3)}"
    abandon = False
    try:
        for index, trajectory in enumerate(trajectories):
            if stop is not None and stop.is_set():
                report.interrupted = True
                break
            run_id = demo_run_id(prefix, index, trajectory)
            try:
                outcome = replay_trajectory(
                    trajectory,
                    chosen,
                    run_id=run_id,
                    tracer_provider=provider,
                    speed=speed,
                    capture_content=capture_content,
                    policy_override=policy is not None,
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


# ------------------------------------------------------------------ examples


def record_examples(directory: str | Path = EXAMPLES_DIR) -> list[Path]:
    """Record :mod:`loopwatch.instrumentation.examples` as trajectory files (one per example).

    Each example's scripted model and adversarial tools run unguarded (``observe`` mode,
    fake clock), every decision, observation and error is recorded with its clock time,
    and the run is written with the example's policy and expected stop in
    ``metadata.replay``. A cancelled run and a crashing loop are added by hand. Returns
    the files written.
    """
    from loopwatch.instrumentation.examples import EXAMPLES

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for number, example in enumerate(EXAMPLES, start=1):
        trajectory = _record(example, number)
        slug = _RUN_ID_CHARS.sub("-", example.name.lower()).strip("-")[:28].rstrip("-")
        path = out / f"{number:02d}-{example.expected}-{slug}.json"
        write_trajectories(path, [trajectory])
        written.append(path)
    extra = _hand_made(len(EXAMPLES) + 1)
    for number, (expected, trajectory) in enumerate(extra, start=len(EXAMPLES) + 1):
        path = out / f"{number:02d}-{expected}.json"
        write_trajectories(path, [trajectory])
        written.append(path)
    return written


_EPOCH: Final = 1_764_460_800.0  # 2025-11-30T00:00:00Z: recorded times start here


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _record(example: Any, number: int) -> Trajectory:
    clock = FakeClock(start=0.0)
    script = example.script()
    model = ScriptedModel(script, tick=clock, seconds_per_call=example.clock_seconds_per_turn)
    tools = example.tools()
    # The task arrives at clock 0: the recorded timeline starts with the run.
    steps: list[Step] = [Step(0, USER, "message", example.name, (), _EPOCH)]
    policy = example.policy.with_env({})  # the example's stop, whatever the shell sets
    run = Run(example.agent, policy, mode="observe", tools=tools or None, clock=clock)
    with run:
        while model.calls < len(script):
            decision = run.decide(model)
            now = _EPOCH + clock()
            calls = []
            for call in decision.tool_calls:
                started = _EPOCH + clock()
                try:
                    result = run.call_tool(call.name, call.arguments, call_id=call.call_id)
                    observation, error = _json_text(result), False
                except (ToolFailure, TimeoutError) as exc:
                    observation, error = f"{type(exc).__name__}: {exc}", True
                calls.append(
                    ToolCall(
                        call.name,
                        dict(call.arguments),
                        observation,
                        error,
                        started_at=started,
                        ended_at=_EPOCH + clock(),
                    )
                )
            kind = decision.type.value
            text = decision.text if kind != "final" else str(decision.answer)
            steps.append(
                Step(
                    len(steps),
                    AGENT,
                    kind,
                    text,
                    tuple(calls),
                    now,
                    decision.input_tokens or None,
                    decision.output_tokens or None,
                    decision.cost_usd or None,
                )
            )
            if kind in ("final", "refusal"):
                break
    for tool in tools.values():
        release = getattr(tool, "release", None)
        if callable(release):
            release()
    ended_by_agent = steps and steps[-1].decision in ("final", "refusal")
    outcome: Literal["success", "failure", "unknown"] = UNKNOWN
    if example.goal is not None and steps and steps[-1].decision == "final":
        outcome = SUCCESS if example.goal(steps[-1].text) else FAILURE
    replay: dict[str, Any] = {
        "policy": _policy_to_table(example.policy),
        "expected_stop": example.expected,
        "example": example.name,
    }
    if example.mode == "observe":
        replay["mode"] = "observe"
    return Trajectory(
        source="",
        run_id=f"example-{number:02d}",
        format="loopwatch",
        steps=tuple(steps),
        recorded_outcome=outcome,
        recorded_stop=None if ended_by_agent else "max_steps",
        recorded_stop_kind="explicit",
        agent=example.agent,
        model="scripted",
        metadata={"replay": replay},
    )


def _hand_made(first: int) -> list[tuple[str, Trajectory]]:
    """The cancelled run and the crashing loop of ``run_examples`` as trajectories."""
    search = ToolCall(
        "search_orders",
        {"query": "x"},
        '{"items":["x-0","x-1","x-2"],"next_cursor":null}',
        started_at=_EPOCH + 1,
        ended_at=_EPOCH + 1.2,
    )
    step = Step(0, AGENT, "tool", None, (search,), _EPOCH + 1, 850, 40, 0.0012)
    default = {"name": "default", "version": "builtin"}
    cancelled = Trajectory(
        source="",
        run_id=f"example-{first:02d}",
        format="loopwatch",
        steps=(step,),
        recorded_stop="cancelled",
        recorded_stop_kind="explicit",
        agent="support",
        model="scripted",
        metadata={
            "replay": {
                "policy": default,
                "expected_stop": "cancelled",
                "example": "cancelled by the caller",
            }
        },
    )
    crashed = Trajectory(
        source="",
        run_id=f"example-{first + 1:02d}",
        format="loopwatch",
        steps=(Step(0, AGENT, "tool", None, (search,), _EPOCH + 1, 850, 40, 0.0012),),
        recorded_stop="error",
        recorded_stop_kind="explicit",
        agent="support",
        model="scripted",
        metadata={
            "replay": {
                "policy": default,
                "expected_stop": "error",
                "example": "the loop itself crashes",
                "crash": {
                    "type": "ConnectionResetError",
                    "message": "vector store connection lost",
                },
            }
        },
    )
    return [("cancelled", cancelled), ("error", crashed)]


def _examples_main(argv: Sequence[str]) -> int:
    """``python -m loopwatch.replay.demo record-examples [DIR]``: rewrite the example files."""
    if not argv or argv[0] != "record-examples":
        print("usage: python -m loopwatch.replay.demo record-examples [DIR]", file=sys.stderr)
        return 2
    for path in record_examples(argv[1] if len(argv) > 1 else EXAMPLES_DIR):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_examples_main(sys.argv[1:]))
