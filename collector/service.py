"""The collector process: wires the stages of :mod:`.pipeline` and serves them.

:class:`Collector` builds the stages (each a small object with one ``process`` method,
the in-process ones held in order by a :class:`~loopwatch.collector.pipeline.Pipeline`)
and serves two HTTP apps on one event loop: the OTLP/HTTP receiver and the ``/metrics``,
``/healthz`` and read API app.

Acknowledgement contract: an OTLP request is answered 200 only after its events are
committed to DuckDB (the store resolves the batch's future after the group commit).
Stages after decode run on one pipeline thread in arrival order (the map and detect
stages keep per-trace state); the store's writer thread commits in groups.

Decode workers (``[pipeline] decode_workers`` > 0): :class:`DecodePool` decompresses,
decodes and redacts each body in a worker process (its own :class:`RedactStage`, built
from the same rules, canaries and HMAC key) and maps its loopwatch spans to rows
(:func:`~loopwatch.collector.map.premap`, which needs no state from earlier
batches), so the stages that cost the most CPU per span leave the serving process's
GIL. The rows, the third-party spans (mapped here, as they need the run structure of
earlier batches) and the worker's redaction counts come back pickled; only the rest of
map, detect, store and metrics run here. Nothing unredacted ever reaches the serving
process's later stages, and a worker that dies fails only the request it held (503,
retryable; it was not acknowledged) and is started again (:mod:`.workers`). Metrics are
counted after the commit, over newly stored spans only, so a client retry never counts
twice.

Fleet mode (``[lake]``): the lake is checked before anything else starts
(:func:`~loopwatch.collector.lake.ship.open_lake`), then a
:class:`~loopwatch.collector.lake.ship.Shipper` thread publishes finished runs from the
local file; acknowledgement still waits only for the local commit.

Shutdown (SIGTERM, SIGINT): stop accepting, let in-flight requests finish, commit what is
queued, stop the shipper after its batch, checkpoint DuckDB, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loopwatch.instrumentation.redaction import canaries_from_env, load_canaries
from prometheus_client import CollectorRegistry

from .api import create_api_app, http_server
from .config import CollectorConfig, parse_hostport
from .detect import DetectStage, loop_detector, loop_tool
from .errors import ConfigError, QueueFull
from .map import MapStage
from .metrics import LoopwatchMetrics, RecentAgents
from .nudges import nudge_results
from .pipeline import Pipeline
from .process_memory import tune_allocators
from .receive import InflightLimit
from .receive_http import create_otlp_app
from .records import SpanBatch
from .redact import REDACTION_FAILED, RedactStage
from .rows import (
    UNKNOWN_AGENT,
    MappedBatch,
)
from .sample import SamplingConfig
from .store.writer import CommitResult, CommitStats, Store, memory_settings
from .store.writer import StoreConfig as StoreSettings
from .workers import DecodePool, RedactedBatch, counts_delta, tune_gc

__all__ = ["Collector", "serve_forever"]

if TYPE_CHECKING:  # grpcio is imported only when server.otlp_grpc is set
    from .lake.ship import LakeSession, Shipper
    from .receive_grpc import OtlpGrpcServer

_log = logging.getLogger("loopwatch.collector")


@dataclass(frozen=True)
class _Processed:
    mapped: MappedBatch
    canaries: dict[str, int]
    redactions: dict[str, int]


class Collector:
    """The sidecar: stages, store, metrics and the two HTTP apps.

    Args:
        config: a validated :class:`CollectorConfig`.

    Raises:
        ConfigError: unreadable token, canary or key file.
        StoreUnavailable: the database file cannot be opened.
        LakeUnavailable: ``[lake]`` is set and the lake cannot be used (checked first;
            :func:`~loopwatch.collector.lake.ship.open_lake`).
    """

    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        # Both sources: the agent side reads the variable, so a canary named only there
        # must be redacted here too when a config file also names a canary file.
        canaries = canaries_from_env()
        if config.redaction.canaries_file:
            canaries = tuple(
                dict.fromkeys(load_canaries(config.redaction.canaries_file) + canaries)
            )
        self.token = config.token()
        hmac_key = config.hmac_key()
        # Fleet mode: reach the lake before anything else starts, so a bad catalog or
        # data path is one line and exit 2 before a span is accepted (docs/lake.md).
        self._lake_session = _open_lake(config)
        try:
            self._build(config, canaries, hmac_key)
        except BaseException:
            if self._lake_session is not None:
                self._lake_session.close()
            raise

    def _build(
        self, config: CollectorConfig, canaries: tuple[str, ...], hmac_key: bytes | None
    ) -> None:
        self.redact = RedactStage(canaries=canaries, hmac_key=hmac_key)
        self.decode_pool: DecodePool | None = None
        if config.pipeline.decode_workers:
            self.decode_pool = DecodePool(
                config.pipeline.decode_workers,
                canaries=canaries,
                hmac_key=hmac_key,
                max_decompressed_bytes=config.limits.max_decompressed_bytes,
            )
        self.map = MapStage(max_idle_seconds=config.sampling.stop_timeout_seconds)
        self.detect = DetectStage()
        self.pipeline = Pipeline((self.redact, self.map, self.detect))
        settings = StoreSettings(
            read_timeout_seconds=config.store.query_timeout_seconds,
            read_max_rows=config.store.max_rows,
            max_queue_spans=max(config.store.queue_max_batches * 512, 1),
            # A run whose stop never comes is decided within 1.5x stop_timeout_seconds.
            maintenance_interval_seconds=min(60.0, config.sampling.stop_timeout_seconds / 2),
            sampling=SamplingConfig(
                completed_fraction=config.sampling.completed_fraction,
                max_full_runs_per_hour=config.sampling.max_runs_per_reason_tool_per_hour,
                undecided_timeout_seconds=config.sampling.stop_timeout_seconds,
            ),
            retention_seconds=config.store.retention_days * 86_400,
            shipped_retention_seconds=config.lake.local_retention_seconds
            if config.lake.enabled
            else 0.0,
            keep_unshipped=config.lake.enabled,
            **memory_settings(config.store),
        )
        self.store: Store
        self.inflight = InflightLimit(
            config.limits.max_inflight_bytes,
            retry_after_seconds=config.server.retry_after_seconds,
        )
        self.metrics = LoopwatchMetrics(
            top_n_agents=config.metrics.top_n_agents,
            top_n_tools=config.metrics.top_n_tools,
            queue_depth=lambda: self.store.queue_spans,
            inflight_bytes=lambda: self.inflight.held,
            redaction_rules=self.redact.redactor.rule_names,
        )
        self.store = Store(config.store.db, config=settings, on_commit=self._on_commit)
        released = self.map.restore(self.store.pending_at_open)
        self.store.pending_at_open = []
        if released.steps:
            self.store.submit(released)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self.metrics)
        self.agents = RecentAgents()
        self._pipeline = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopwatch-pipeline")
        self._started = time.time()
        self.shipper: Shipper | None = None
        if self._lake_session is not None:
            self.shipper = self._start_shipper(config, self._lake_session)
        # Lake housekeeping: every collector takes part; the lease holder works.
        from .lake.housekeeping import housekeeper_for

        self.housekeeper = housekeeper_for(config)
        if self.housekeeper is not None:
            self.housekeeper.start()

    def _start_shipper(self, config: CollectorConfig, session: LakeSession) -> Shipper:
        from .lake.ship import FAILURE_REASONS, PAUSE_ENV, Shipper, ShipSettings
        from .metrics import LakeShipMetrics

        lake_metrics = LakeShipMetrics(FAILURE_REASONS)
        self.registry.register(lake_metrics)
        lake = config.lake
        shipper = Shipper(
            session,
            read_cursor=self.store.read_cursor,
            run_task=self.store.run_task,
            settings=ShipSettings(
                collector_id=lake.collector_id,
                interval_seconds=lake.ship_interval_seconds,
                grace_seconds=lake.ship_grace_seconds,
                batch_runs=lake.ship_batch_runs,
                retry_max_seconds=lake.ship_retry_max_seconds,
                pause_after_commit_seconds=float(os.environ.get(PAUSE_ENV) or 0),
            ),
            on_shipped=lake_metrics.record_shipped,
            on_failure=lake_metrics.record_failure,
            on_backlog=lake_metrics.set_backlog,
            on_cpu=lake_metrics.add_cpu_seconds,
        )
        shipper.start()
        return shipper

    # ------------------------------------------------------------- pipeline

    def process(self, batch: SpanBatch) -> tuple[_Processed, Any]:
        """Run the in-process stages (:attr:`pipeline`) and queue the result for commit
        (pipeline thread).

        Returns:
            What the batch produced, and the store's future for its commit.

        Raises:
            QueueFull: the store's queue is full (nothing was queued).
        """
        if isinstance(batch, RedactedBatch) and batch.partial is not None:
            # A decode worker redacted and premapped it.
            canaries, redactions = batch.canary_hits, batch.redactions
            if batch.redaction_failures:
                batch.reject(batch.redaction_failures, REDACTION_FAILED)
                batch.redaction_failures = 0
            mapped = self.pipeline.process(self.map.finish(batch.partial), after="map")
        else:
            before = self.redact.counts()
            mapped = self.pipeline.process(batch)
            after = self.redact.counts()
            canaries = counts_delta(dict(after.canary_by_location), dict(before.canary_by_location))
            redactions = counts_delta(
                dict(after.redactions_by_rule), dict(before.redactions_by_rule)
            )
        self.agents.label(mapped)
        try:
            future = self.store.submit(mapped)
        except Exception:
            self._undo(mapped)
            raise
        return _Processed(mapped, canaries, redactions), future

    async def submit(self, batch: SpanBatch) -> None:
        """The OTLP receiver's ``submit``: returns once the batch is committed.

        Raises:
            QueueFull: backpressure (the receiver answers 429/503 with Retry-After).
        """
        if self.store.queue_spans >= self.store.config.max_queue_spans:
            raise QueueFull(
                capacity=self.store.config.max_queue_spans,
                retry_after_seconds=self.config.server.retry_after_seconds,
            )
        loop = asyncio.get_running_loop()
        processed, future = await loop.run_in_executor(self._pipeline, self.process, batch)
        try:
            result: CommitResult = await asyncio.wrap_future(future)
        except Exception:
            self._undo(processed.mapped)
            raise
        self._count(processed, result)

    def _undo(self, mapped: MappedBatch) -> None:
        """Take back what the map and detect stages did for ``mapped``, refused before
        its commit (429/503), so that its retry is mapped as the first attempt was."""
        self.map.undo(mapped)
        self.detect.undo(mapped)

    def _count(self, processed: _Processed, result: CommitResult) -> None:
        mapped = processed.mapped
        new = result.new_span_keys
        if new:
            self.metrics.record_canaries(processed.canaries)
            self.metrics.record_redactions(processed.redactions)
        # Runs on the event loop: count per label set, then one metric update each. The
        # agent labels were fixed by _label_counts before the rows were stored.
        everything_new = len(new) == result.spans
        by_labels: dict[tuple[str, str, str], int] = {}
        responses: dict[tuple[str, str, str | None, str], int] = {}
        counted: set[tuple[str, str]] = set()
        released = mapped.released  # counted when they arrived, as pending steps
        for step in [*mapped.steps, *(row for row, _ in mapped.pending)]:
            if step.kind != "tool_result":
                continue
            key = (step.trace_id, step.span_id)
            if (not everything_new and key not in new) or key in counted or key in released:
                continue  # a retry's span, one sent twice, or a pending call counted already
            counted.add(key)
            labels = (
                step.agent or UNKNOWN_AGENT,
                step.tool or "unknown",
                step.outcome or "error",
            )
            by_labels[labels] = by_labels.get(labels, 0) + 1
            if step.loop_response is not None:
                rung = (labels[0], labels[1], step.loop_detector, step.loop_response)
                responses[rung] = responses.get(rung, 0) + 1
        for (agent, tool, outcome), n in by_labels.items():
            self.metrics.record_tool_call(agent, tool, outcome, n)
        for (agent, tool, detector, response), n in responses.items():
            self.metrics.record_loop_response(agent, tool, detector, response, n)
        for stop in result.counted_stops:  # the store's choice: one per run, at most
            agent = stop.agent or UNKNOWN_AGENT
            self.metrics.record_stop(
                agent,
                stop.reason,
                steps=stop.step or 0,
                steps_since_progress=stop.steps_since_progress,
            )
            detector = loop_detector(stop)
            if detector is not None:
                self.metrics.record_detection(agent, loop_tool(stop), detector)
            if stop.nudges:
                self.metrics.record_nudge_results(agent, nudge_results(stop.nudges))

    def _on_commit(self, stats: CommitStats) -> None:
        self.metrics.observe_commit(stats.commit_seconds)

    # ----------------------------------------------------------------- HTTP

    def health(self) -> dict[str, Any]:
        """The ``/healthz`` document."""
        return {
            "status": "ok",
            "schema_version": self.store.schema_version,
            "queue_spans": self.store.queue_spans,
            "uptime_seconds": round(time.time() - self._started, 3),
        }

    def exposition(self) -> bytes:
        """``/metrics`` text."""
        return self.metrics.exposition(self.registry)

    def otlp_app(self) -> Any:
        """The OTLP/HTTP receiver app."""
        return create_otlp_app(
            self.submit,
            max_body_bytes=self.config.limits.max_body_bytes,
            max_decompressed_bytes=self.config.limits.max_decompressed_bytes,
            token=self.token,
            counters=self.metrics,
            backpressure_status_code=self.config.server.backpressure_status_code,
            retry_after_seconds=self.config.server.retry_after_seconds,
            decode=None if self.decode_pool is None else self.decode_pool.decode,
            inflight=self.inflight,
        )

    async def start_grpc(self) -> OtlpGrpcServer | None:
        """Start the OTLP/gRPC receiver on this event loop when ``server.otlp_grpc`` is
        set; return it, else ``None`` (``grpcio`` is imported only then).

        Raises:
            OSError: the address cannot be bound.
            ConfigError: ``grpcio`` is not installed.
        """
        address = self.config.server.otlp_grpc
        if not address:
            return None
        try:
            from .receive_grpc import OtlpGrpcServer
        except ImportError:
            raise ConfigError(
                "server.otlp_grpc", "needs grpcio: pip install 'loopwatch[collector]'"
            ) from None
        server = OtlpGrpcServer(
            address,
            submit=self.submit,
            counters=self.metrics,
            decode=None if self.decode_pool is None else self.decode_pool.decode,
            token=self.token,
            max_message_bytes=self.config.limits.max_decompressed_bytes,
            retry_after_seconds=self.config.server.retry_after_seconds,
            inflight=self.inflight,
        )
        await server.start()
        return server

    def api_app(self) -> Any:
        """The ``/metrics``, ``/healthz`` and read API app."""
        return create_api_app(
            self.store.reader(),
            metrics=self.exposition,
            health=self.health,
            token=self.token,
            max_rows=self.config.store.max_rows,
        )

    def close(self) -> None:
        """Drain the pipeline, commit what is queued, close the store. Idempotent."""
        if self.decode_pool is not None:
            self.decode_pool.close()
        self._pipeline.shutdown(wait=True)
        if self.housekeeper is not None:
            self.housekeeper.stop()
        if self.shipper is not None:
            # Before the store closes: a batch in progress finishes its local mark.
            self.shipper.stop()
        self.store.close()


def _open_lake(config: CollectorConfig) -> LakeSession | None:
    """The checked lake session of a collector with ``[lake]`` set, else None.

    Raises:
        LakeUnavailable: see :func:`~loopwatch.collector.lake.ship.open_lake`.
    """
    if not config.lake.enabled:
        return None
    from .lake.connect import target_of
    from .lake.ship import open_lake

    lake = config.lake
    target = target_of(config)
    session = open_lake(target)
    _log.info("lake: shipping to %s as %s", target.describe(), lake.collector_id)
    return session


def _bind(hostport: str, what: str) -> socket.socket:
    """Bind a listening socket before anything starts, so "address in use" is one clear
    error (uvicorn would log a traceback and exit on its own)."""
    host, port = parse_hostport(hostport, what=what)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.set_inheritable(True)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {hostport} ({what}): {exc.strerror}") from None
    return sock


def _hostport(host: str, port: int) -> str:
    """``host:port``, ``[host]:port`` for an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _serve(
    collector: Collector,
    sockets: list[socket.socket],
    ready: threading.Event | None,
    announce: bool,
    pending: list[int] | None = None,
) -> None:
    servers = [http_server(collector.otlp_app()), http_server(collector.api_app())]
    grpc_server = await collector.start_grpc()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    if pending:  # a signal came before these handlers: serve, then stop at once
        stop.set()
    for server in servers:
        # uvicorn's own handlers would re-raise the signal after serving, killing the
        # process before the store drains; this loop handles SIGTERM/SIGINT itself.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    tasks = [
        asyncio.create_task(s.serve(sockets=[sock]))
        for s, sock in zip(servers, sockets, strict=True)
    ]
    while not all(s.started for s in servers):
        if any(t.done() for t in tasks):
            raise OSError("a listener failed to start")
        await asyncio.sleep(0.02)
    if announce:
        # The bound addresses, not the configured ones: with port 0 the kernel chose.
        otlp, http = (_hostport(*sock.getsockname()[:2]) for sock in sockets)
        grpc_text = ""
        if grpc_server is not None:
            host, _ = parse_hostport(grpc_server.address, what="server.otlp_grpc")
            grpc_text = f"OTLP/gRPC {_hostport(host, grpc_server.port)}, "
        print(
            f"loopwatch collector: OTLP/HTTP http://{otlp}/v1/traces, {grpc_text}"
            f"metrics http://{http}/metrics, API http://{http}/api/v1/runs",
            flush=True,
        )
    if ready is not None:
        ready.set()
    stop_task = asyncio.create_task(stop.wait())
    await asyncio.wait([stop_task, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for server in servers:
        server.should_exit = True
    if grpc_server is not None:
        await grpc_server.stop(10)
    await asyncio.gather(*tasks, return_exceptions=True)
    stop_task.cancel()


def serve_forever(
    config: CollectorConfig, *, ready: threading.Event | None = None, announce: bool = True
) -> None:
    """Run the collector until SIGTERM/SIGINT, then drain and close.

    Raises:
        ConfigError: unreadable token, canary or key file.
        OSError: a listen address is in use or not available.
        StoreUnavailable: the database file cannot be opened (missing folder, held by
            another process, not a DuckDB file).
        LakeUnavailable: ``[lake]`` is set and the catalog, the data path, the
            extensions or the lake's version are not usable.
    """
    # Before any thread of the collector allocates: see HEAP_ARENAS and
    # HEAP_MMAP_THRESHOLD_BYTES.
    tune_allocators()
    logging.basicConfig(
        level=config.log.level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # A SIGINT/SIGTERM that lands while the store opens (DuckDB checks for signals inside
    # its own calls and swallows the KeyboardInterrupt) or before the event loop installs
    # its handlers must not be lost: remember it, and stop as soon as serving begins.
    pending: list[int] = []
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: leave handlers alone
            previous[sig] = signal.signal(sig, lambda signum, _frame: pending.append(signum))
    try:
        if config.server.otlp_grpc:
            # gRPC binds its own socket when serving starts; an address in use is one
            # clear line here rather than gRPC core's log line and a late failure.
            _bind(config.server.otlp_grpc, "server.otlp_grpc").close()
        sockets = [
            _bind(config.server.otlp_http, "server.otlp_http"),
            _bind(config.server.http, "server.http"),
        ]
        try:
            collector = Collector(config)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        tune_gc()
        if collector.decode_pool is not None:
            collector.decode_pool.start()
        try:
            asyncio.run(_serve(collector, sockets, ready, announce, pending))
        finally:
            collector.close()
            for sock in sockets:
                sock.close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
