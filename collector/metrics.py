"""Prometheus metrics of the collector (DESIGN section 7), on its own registry.

One custom collector (``prometheus_client``'s extension point ``collect()``) holds every
series in plain dictionaries; the hot path is a dictionary increment under a lock.
Counters start from zero with the process: Prometheus' ``rate()`` and ``increase()``
read a restart as a counter reset, and the totals live in the store (read by the API).
Within a process's life each stored span and each run's stop is counted once.

Label values are bounded (STYLE rule 9): agent and tool names past the configured top-N
become ``_other``; run ids never appear. The bound is decided by first sight. Once an
agent (or an agent's tool) is seen, the series the alerts read are exported at 0 (its
stops for every reason; the tool's ``repeated_action`` and ``action_cycle`` detections;
``none``'s ``repeated_decision`` and ``no_progress``): a counter series that first
appears at 5 is no increase to Prometheus. Every other label has a closed value set:

==============================  ==========================================================
label                           values
==============================  ==========================================================
``stop_reason``                 the eleven stop reasons of DESIGN section 2
``outcome``                     ``ok``, ``error``, ``blocked``, ``nudged``
``detector``                    ``repeated_action``, ``action_cycle``, ``repeated_decision``,
                                ``no_progress`` (nudges and warnings: also ``_other`` for
                                a detector name outside that set)
``result``                      ``recovered``, ``stopped``, ``ended``
``location``                    ``attribute``, ``event``, ``name``, ``status``, ``resource``
``rule``                        the redaction rule names (a fixed set in the rules module)
``transport``                   ``http_protobuf``, ``http_json``, ``grpc``
``reason`` (rejected)           the receiver's and pipeline's fixed rejection reasons
                                (``REJECT_REASONS``; whole requests:
                                ``REQUEST_REJECT_REASONS``), all exported from start at 0
==============================  ==========================================================
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from loopwatch.instrumentation import StopReason
from loopwatch.instrumentation import _semconv as sc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .detect import DECISION_DETECTORS, LOOP_DETECTORS, TOOL_DETECTORS
from .nudges import NUDGE_RESULTS, RESPONSE_NUDGE, RESPONSE_WARN
from .receive import REJECT_REASONS, REQUEST_REJECT_REASONS
from .rows import KIND_TOOL_RESULT, UNKNOWN_AGENT, MappedBatch, RunRow

__all__ = [
    "COMMIT_BUCKETS_SECONDS",
    "LAKE_LAG_BUCKETS_SECONDS",
    "LAKE_METRIC_NAMES",
    "METRIC_NAMES",
    "NO_TOOL",
    "OTHER",
    "STEPS_BUCKETS",
    "STEPS_SINCE_PROGRESS_BUCKETS",
    "LabelBound",
    "LakeShipMetrics",
    "LoopwatchMetrics",
    "RecentAgents",
]

OTHER: Final = "_other"
NO_TOOL: Final = "none"
"""The ``tool`` label of a loop detection that names no tool (decision-level detectors)."""
STOP_REASONS: Final = frozenset(reason.value for reason in StopReason)
OUTCOMES: Final = frozenset(
    {sc.OUTCOME_OK, sc.OUTCOME_ERROR, sc.OUTCOME_BLOCKED, sc.OUTCOME_NUDGED}
)
DETECTORS: Final = LOOP_DETECTORS
CANARY_LOCATIONS: Final = frozenset({"attribute", "event", "name", "status", "resource"})
STEPS_SINCE_PROGRESS_BUCKETS: Final = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0)
STEPS_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
COMMIT_BUCKETS_SECONDS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_MAX_LABEL_CHARS: Final = 128

METRIC_NAMES: Final = (
    "loopwatch_agent_stops_total",
    "loopwatch_agent_steps_since_progress",
    "loopwatch_agent_steps",
    "loopwatch_tool_calls_total",
    "loopwatch_loop_detections_total",
    "loopwatch_nudges_total",
    "loopwatch_loop_warnings_total",
    "loopwatch_nudge_results_total",
    "loopwatch_canary_detections_total",
    "loopwatch_redactions_total",
    "loopwatch_collector_spans_received_total",
    "loopwatch_collector_spans_rejected_total",
    "loopwatch_collector_requests_rejected_total",
    "loopwatch_collector_queue_depth",
    "loopwatch_collector_inflight_bytes",
    "loopwatch_collector_commit_duration_seconds",
)


class LabelBound:
    """Keeps at most ``top_n`` distinct values of one label; the rest map to ``_other``.

    A real value that reads as one of the ``reserved`` labels (``_other``, and ``none``
    for tools: the label of detections that name no tool) gets a ``~`` appended, as does
    one that already ends in ``~`` after such a label (``_other~`` -> ``_other~~``), so
    an agent named ``_other`` keeps a series apart from the overflow and the mapping
    stays one to one.

    Values are admitted first come, first served, and a value once admitted keeps its
    own series for the life of the process.

    Thread-safe. Values longer than 128 characters are cut (a label is not a payload).

    Args:
        top_n: how many distinct values are kept (>= 1).
        reserved: labels that only the collector writes (``_other`` always).

    Raises:
        ValueError: ``top_n`` < 1.
    """

    def __init__(self, top_n: int, *, reserved: Iterable[str] = ()) -> None:
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {top_n}")
        self.top_n = top_n
        self._reserved = frozenset({OTHER, *reserved})
        self._kept: dict[str, int] = {}  # label -> admission order
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        label = (value or "unknown")[:_MAX_LABEL_CHARS]
        if label.rstrip("~") in self._reserved:
            label += "~"
        if label in self._kept:
            return label
        with self._lock:
            if label in self._kept:
                return label
            if len(self._kept) < self.top_n:
                order = len(self._kept)
                self._kept[label] = order
                return label
        return OTHER


class RecentAgents:
    """The agent last seen for each recent run: the label of a row that names none.

    The counters (tool calls, stops, loop detections) label a row with its span's own
    agent, else the last agent seen for its run, else ``unknown``. The store keeps that
    label with the row (``run_tools.agent``, ``stops.agent``), so the API files a run
    known only by its stop under the agent it was counted under.

    Memory (DESIGN 8, a sidecar is light): two generations of plain dicts keyed by the
    run id's ``hash``. Writes go to the young generation; once it holds ``generation``
    runs it becomes the old one and the previous old one is dropped. So the runs written
    last, at least ``generation`` of them, are always known, and at most
    ``2 * generation`` are held, about 100 bytes each (an int key, a dict slot and a
    shared, interned agent name). The ``OrderedDict`` of run-id strings it replaced held
    about 230 bytes a run: 23 MiB of a soaking collector's heap at 100,000 runs
    (tracemalloc), since each batch unpickled from a decode worker brings its own copy
    of every string. Two of the held runs share a key with probability about
    ``n**2 / 2**65`` (1e-9 at 200,000); that only labels a counter with the other run's
    agent.

    Thread-safe.

    Args:
        generation: runs per generation (>= 1).

    Raises:
        ValueError: ``generation`` < 1.
    """

    def __init__(self, generation: int = 50_000) -> None:
        if generation < 1:
            raise ValueError(f"generation must be >= 1, got {generation}")
        self.generation = generation
        self._young: dict[int, str] = {}
        self._old: dict[int, str] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._young) + len(self._old)

    def remember(self, runs: Iterable[RunRow]) -> None:
        """Note the agent of each run row that names one (later rows win)."""
        with self._lock:
            self._remember(runs)

    def get(self, run_id: str) -> str:
        """The agent last remembered for ``run_id``, else ``unknown``."""
        with self._lock:
            return self._get(run_id)

    def label(self, mapped: MappedBatch) -> None:
        """Remember ``mapped``'s runs, then fill the agent of each of its tool results
        (steps and pending steps) and stops that names none, in place (one lock a batch)."""
        with self._lock:
            self._remember(mapped.runs)
            for step in [*mapped.steps, *(row for row, _ in mapped.pending)]:
                if step.kind == KIND_TOOL_RESULT and not step.agent:
                    step.agent = self._get(step.run_id)
            for stop in mapped.stops:
                if not stop.agent:
                    stop.agent = self._get(stop.run_id)

    def _remember(self, runs: Iterable[RunRow]) -> None:
        for run in runs:
            if not run.agent:
                continue
            self._young[hash(run.run_id)] = sys.intern(run.agent)
            if len(self._young) >= self.generation:
                self._old, self._young = self._young, {}

    def _get(self, run_id: str) -> str:
        key = hash(run_id)
        agent = self._young.get(key)
        return agent if agent is not None else self._old.get(key, UNKNOWN_AGENT)


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)

    def observe(self, value: float, n: int = 1) -> None:
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += n
                break
        self.total += value * n
        self.count += n

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for upper, c in zip(self.buckets, self.counts, strict=True):
            running += c
            out.append((_le(upper), running))
        out.append(("+Inf", self.count))
        return out


def _counter(
    name: str, doc: str, labels: tuple[str, ...], counts: Mapping[Any, float]
) -> CounterMetricFamily:
    """A counter family with one sample per ``counts`` item, in key order (a key is the
    label values, or the one value of a one-label family)."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in sorted(counts.items()):
        family.add_metric(key if isinstance(key, tuple) else (key,), n)
    return family


def _le(upper: float) -> str:
    return str(int(upper)) if float(upper).is_integer() else repr(upper)


class LoopwatchMetrics(Collector):
    """Every collector metric; register on a ``CollectorRegistry`` of your own.

    Args:
        top_n_agents / top_n_tools: label bounds (names past them become ``_other``).
        queue_depth: a callable returning the current store queue depth.
        inflight_bytes: a callable returning the request bytes the receivers hold
            (:class:`~loopwatch.collector.receive.InflightLimit`).
        redaction_rules: rule names exported on ``loopwatch_redactions_total`` from
            the start, at 0.

    Thread-safety: every ``record_*`` method may be called from any thread.

    Example::

        metrics = LoopwatchMetrics(top_n_agents=50, top_n_tools=200)
        registry = CollectorRegistry()
        registry.register(metrics)
        metrics.record_stop("support", "repeated_action", steps=3, steps_since_progress=2)
        text = metrics.exposition(registry)
    """

    def __init__(
        self,
        *,
        top_n_agents: int = 50,
        top_n_tools: int = 200,
        queue_depth: object = None,
        inflight_bytes: object = None,
        redaction_rules: Iterable[str] = (),
    ) -> None:
        self.agents = LabelBound(top_n_agents)
        self.tools = LabelBound(top_n_tools, reserved=(NO_TOOL,))
        self._queue_depth = queue_depth
        self._inflight_bytes = inflight_bytes
        self._lock = threading.Lock()
        self._stops: dict[tuple[str, str], int] = defaultdict(int)
        self._ssp: dict[tuple[str, str], _Histogram] = {}
        self._steps: dict[tuple[str, str], _Histogram] = {}
        self._tool_calls: dict[tuple[str, str, str], int] = defaultdict(int)
        self._detections: dict[tuple[str, str, str], int] = defaultdict(int)
        self._nudges: dict[tuple[str, str, str], int] = defaultdict(int)
        self._warnings: dict[tuple[str, str, str], int] = defaultdict(int)
        self._nudge_results: dict[tuple[str, str, str], int] = defaultdict(int)
        self._canaries: dict[str, int] = defaultdict(int)
        # Every rule exported from start (at 0): a panel or a lint query on a fresh
        # collector otherwise finds no series until the first redaction.
        self._redactions: dict[str, int] = defaultdict(int)
        for rule in redaction_rules:
            self._redactions[rule[:_MAX_LABEL_CHARS]] += 0
        self._received: dict[str, int] = defaultdict(int)
        self._rejected: dict[str, int] = defaultdict(int)
        self._refused: dict[str, int] = defaultdict(int)
        self._commit = _Histogram(COMMIT_BUCKETS_SECONDS)

    # ----------------------------------------------------------- recording

    def _seen_agent(self, agent: str) -> None:
        """Export an agent's stop and decision-level detection series at 0 (lock held).

        A counter series that first appears at 3 reads as no increase to ``increase()``
        and ``rate()``: an agent that always completed, then stopped five times for
        ``no_progress`` within one scrape interval, never raised LoopWatchNoProgressStops.
        With every series in place from the agent's first sight, the first stops count.
        """
        if (agent, StopReason.COMPLETED.value) in self._stops:
            return
        for reason in STOP_REASONS:
            self._stops[(agent, reason)] += 0
        for detector in DECISION_DETECTORS:
            self._detections[(agent, NO_TOOL, detector)] += 0

    def record_stop(
        self,
        agent: str,
        stop_reason: str,
        *,
        steps: int,
        steps_since_progress: int | None,
        n: int = 1,
    ) -> None:
        """Count a stop and observe its steps and steps since progress.

        A stop that does not carry its steps since progress (``None``: a third-party
        run's, or one sent without ``loopwatch.steps_since_progress``) is counted and
        its steps observed, but it is left out of the steps-since-progress histogram
        rather than observed as 0, which would read as progress just made; so that
        histogram's ``_count`` can be below the stops counter's.
        """
        reason = stop_reason if stop_reason in STOP_REASONS else "error"
        key = (self.agents(agent), reason)
        with self._lock:
            self._seen_agent(key[0])
            self._stops[key] += n
            ssp = self._ssp.setdefault(key, _Histogram(STEPS_SINCE_PROGRESS_BUCKETS))
            if steps_since_progress is not None:
                ssp.observe(max(steps_since_progress, 0), n)
            self._steps.setdefault(key, _Histogram(STEPS_BUCKETS)).observe(max(steps, 0), n)

    def record_tool_call(self, agent: str, tool: str, outcome: str, n: int = 1) -> None:
        """Count tool calls by outcome (``ok``, ``error``, ``blocked``)."""
        key = (self.agents(agent), self.tools(tool), outcome if outcome in OUTCOMES else "error")
        with self._lock:
            self._seen_agent(key[0])
            if key[1] != NO_TOOL:
                # The tool's loop series at 0 before its first detection (see _seen_agent).
                for detector in TOOL_DETECTORS:
                    self._detections[(key[0], key[1], detector)] += 0
            self._tool_calls[key] += n

    def record_detection(self, agent: str, tool: str | None, detector: str, n: int = 1) -> None:
        """Count a loop detection; ``tool`` ``None`` or ``""`` for one that names no tool
        (decision-level detectors), counted under the label ``none``.

        ``none`` is a fixed label, outside the tool top-N: admitted like a tool name, it
        became ``_other`` once ``top_n_tools`` names were in, and the series the
        dashboards and runbooks read for ``no_progress`` never appeared.
        """
        if detector not in DETECTORS:
            return
        label = NO_TOOL if not tool else self.tools(tool)  # a real "none" is "none~"
        key = (self.agents(agent), label, detector)
        with self._lock:
            self._seen_agent(key[0])
            self._detections[key] += n

    def record_loop_response(
        self, agent: str, tool: str | None, detector: str | None, response: str, n: int = 1
    ) -> None:
        """Count a warned (``response`` ``warn``) or nudged (``nudge``) tool call under
        ``loopwatch_loop_warnings_total`` / ``loopwatch_nudges_total``; another response
        is ignored. A detector outside :data:`DETECTORS` is counted as ``_other``."""
        table = {RESPONSE_WARN: self._warnings, RESPONSE_NUDGE: self._nudges}.get(response)
        if table is None:
            return
        label = detector if detector in DETECTORS else OTHER
        key = (self.agents(agent), self.tools(tool), label)
        with self._lock:
            self._seen_agent(key[0])
            table[key] += n

    def record_nudge_results(self, agent: str, results: Iterable[tuple[str, str]]) -> None:
        """Count one run's nudge results, ``(detector, result)`` pairs from its counted
        stop (``loopwatch_nudge_results_total``). Once an ``(agent, detector)`` is seen,
        its three results are exported (at 0 until they happen), so the recovery-rate
        alert's ratio has a denominator from the first nudge on."""
        label = self.agents(agent)
        with self._lock:
            for detector, result in results:
                if result not in NUDGE_RESULTS:
                    continue
                det = detector if detector in DETECTORS else OTHER
                for each in NUDGE_RESULTS:
                    self._nudge_results[(label, det, each)] += 0
                self._nudge_results[(label, det, result)] += 1

    def record_canaries(self, by_location: Mapping[str, int]) -> None:
        """Count canary hits by location (never the value)."""
        with self._lock:
            for location, n in by_location.items():
                if n:
                    self._canaries[location if location in CANARY_LOCATIONS else "attribute"] += n

    def record_redactions(self, by_rule: Mapping[str, int]) -> None:
        """Count redactions by rule name (a fixed set)."""
        with self._lock:
            for rule, n in by_rule.items():
                if n:
                    self._redactions[rule[:_MAX_LABEL_CHARS]] += n

    def spans_received(self, transport: str, n: int) -> None:
        """Receiver callback: spans received over ``transport``."""
        with self._lock:
            self._received[transport] += n

    def spans_rejected(self, reason: str, n: int) -> None:
        """Receiver callback: spans refused for ``reason``."""
        with self._lock:
            self._rejected[reason] += n

    def request_refused(self, reason: str) -> None:
        """Receiver callback: a whole request refused before its spans could be counted
        (undecodable body, too large, wrong media type, bad token)."""
        with self._lock:
            self._refused[reason] += 1

    def observe_commit(self, seconds: float) -> None:
        """Observe one group commit's duration in seconds."""
        with self._lock:
            self._commit.observe(seconds)

    # ------------------------------------------------------------ exposition

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family (called by the registry on each scrape)."""
        with self._lock:
            yield _counter(
                "loopwatch_agent_stops",
                "Agent runs stopped, by agent and stop reason.",
                ("agent", "stop_reason"),
                self._stops,
            )
            for name, doc, store in (
                (
                    "loopwatch_agent_steps_since_progress",
                    "Steps since the last progress evidence, observed at each stop.",
                    self._ssp,
                ),
                ("loopwatch_agent_steps", "Steps per run, observed at each stop.", self._steps),
            ):
                hist = HistogramMetricFamily(name, doc, labels=("agent", "stop_reason"))
                for (agent, reason), h in sorted(store.items()):
                    hist.add_metric((agent, reason), h.cumulative(), sum_value=h.total)
                yield hist
            yield _counter(
                "loopwatch_tool_calls",
                "Tool calls by agent, tool and outcome (ok, error, blocked, nudged).",
                ("agent", "tool", "outcome"),
                self._tool_calls,
            )
            yield _counter(
                "loopwatch_loop_detections",
                "Loop detections by agent, tool and detector.",
                ("agent", "tool", "detector"),
                self._detections,
            )
            yield _counter(
                "loopwatch_nudges",
                "Tool calls answered with a nudge (not run), by agent, tool and detector.",
                ("agent", "tool", "detector"),
                self._nudges,
            )
            yield _counter(
                "loopwatch_loop_warnings",
                "Loop detections answered with a warning (the call ran), by agent, tool "
                "and detector.",
                ("agent", "tool", "detector"),
                self._warnings,
            )
            yield _counter(
                "loopwatch_nudge_results",
                "Nudges by what followed (recovered, stopped, ended), counted with the "
                "run's stop, by agent and detector.",
                ("agent", "detector", "result"),
                self._nudge_results,
            )
            yield _counter(
                "loopwatch_canary_detections",
                "Planted canary secrets found in received telemetry, by location.",
                ("location",),
                {location: self._canaries.get(location, 0) for location in CANARY_LOCATIONS},
            )
            yield _counter(
                "loopwatch_redactions", "Values redacted, by rule.", ("rule",), self._redactions
            )
            yield _counter(
                "loopwatch_collector_spans_received",
                "Spans received, by transport.",
                ("transport",),
                self._received,
            )
            # Every known reason is exported from the start (at 0), so rate() and alerts
            # see the series before the first rejection instead of "no data".
            yield _counter(
                "loopwatch_collector_spans_rejected",
                "Spans refused, by reason.",
                ("reason",),
                {r: self._rejected.get(r, 0) for r in {*REJECT_REASONS, *self._rejected}},
            )
            yield _counter(
                "loopwatch_collector_requests_rejected",
                "Whole OTLP requests refused before their spans could be counted, by reason.",
                ("reason",),
                {r: self._refused.get(r, 0) for r in {*REQUEST_REJECT_REASONS, *self._refused}},
            )
            commit = HistogramMetricFamily(
                "loopwatch_collector_commit_duration_seconds",
                "Duration of one DuckDB group commit.",
            )
            commit.add_metric((), self._commit.cumulative(), sum_value=self._commit.total)
            yield commit
        depth = GaugeMetricFamily(
            "loopwatch_collector_queue_depth",
            "Spans accepted and waiting for the store writer to commit them.",
        )
        getter = self._queue_depth
        depth.add_metric((), float(getter()) if callable(getter) else 0.0)
        yield depth
        inflight = GaugeMetricFamily(
            "loopwatch_collector_inflight_bytes",
            "Request bytes received and not yet answered (bounded by limits.max_inflight_bytes).",
        )
        getter = self._inflight_bytes
        inflight.add_metric((), float(getter()) if callable(getter) else 0.0)
        yield inflight

    def exposition(self, registry: CollectorRegistry) -> bytes:
        """The Prometheus text exposition of ``registry``."""
        return generate_latest(registry)


LAKE_LAG_BUCKETS_SECONDS: Final = (1.0, 2.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LAKE_METRIC_NAMES: Final = (
    "loopwatch_lake_runs_shipped_total",
    "loopwatch_lake_runs_skipped_total",
    "loopwatch_lake_ship_failures_total",
    "loopwatch_lake_ship_lag_seconds",
    "loopwatch_lake_backlog_runs",
    "loopwatch_lake_ship_cpu_seconds_total",
)
"""The shipper's metrics (fleet mode only: registered when a lake is configured)."""


class LakeShipMetrics(Collector):
    """The lake shipper's metrics (:mod:`loopwatch.collector.lake.ship`).

    Args:
        failure_reasons: the closed set of the ``reason`` label, exported from start at 0
            (:data:`loopwatch.collector.lake.ship.FAILURE_REASONS`).

    Thread-safety: the ``record_*`` methods may be called from any thread.
    """

    def __init__(self, failure_reasons: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._shipped = 0
        self._skipped = 0
        self._failures: dict[str, int] = dict.fromkeys(failure_reasons, 0)
        self._lag = _Histogram(LAKE_LAG_BUCKETS_SECONDS)
        self._backlog = 0
        self._cpu_seconds = 0.0

    def record_shipped(self, inserted: int, skipped: int, lags_seconds: Iterable[float]) -> None:
        """Count a batch: runs inserted, runs skipped (another collector's copy won), and
        each inserted run's lag from its last local commit to the lake commit."""
        with self._lock:
            self._shipped += inserted
            self._skipped += skipped
            for lag in lags_seconds:
                self._lag.observe(max(lag, 0.0))

    def record_failure(self, reason: str) -> None:
        """Count a failed ship attempt (``reason`` from the closed set, else ``other``)."""
        with self._lock:
            key = reason if reason in self._failures else "other"
            self._failures[key] = self._failures.get(key, 0) + 1

    def set_backlog(self, runs: int) -> None:
        """Decided runs not yet shipped, at the last pass."""
        self._backlog = runs

    def add_cpu_seconds(self, seconds: float) -> None:
        """CPU time the shipping thread spent in a pass (its own share of the cost)."""
        with self._lock:
            self._cpu_seconds += max(seconds, 0.0)

    def collect(self) -> Iterator[Metric]:
        """Yield the shipper's metric families."""
        with self._lock:
            yield _counter(
                "loopwatch_lake_runs_shipped",
                "Runs this collector inserted into the lake.",
                (),
                {(): self._shipped},
            )
            yield _counter(
                "loopwatch_lake_runs_skipped",
                "Runs not inserted because the lake already held them from another "
                "collector (first committed copy wins).",
                (),
                {(): self._skipped},
            )
            yield _counter(
                "loopwatch_lake_ship_failures",
                "Failed lake ship attempts (retried), by reason.",
                ("reason",),
                self._failures,
            )
            yield _counter(
                "loopwatch_lake_ship_cpu_seconds",
                "CPU seconds of the shipping thread (reading the local file, writing the "
                "lake; the catalog's own work runs in PostgreSQL).",
                (),
                {(): self._cpu_seconds},
            )
            lag = HistogramMetricFamily(
                "loopwatch_lake_ship_lag_seconds",
                "Seconds from a run's last local commit to its lake commit.",
            )
            lag.add_metric((), self._lag.cumulative(), sum_value=self._lag.total)
            yield lag
        backlog = GaugeMetricFamily(
            "loopwatch_lake_backlog_runs", "Decided runs not yet shipped to the lake."
        )
        backlog.add_metric((), float(self._backlog))
        yield backlog
