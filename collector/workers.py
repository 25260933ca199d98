"""Decode worker processes and the hand-off to them (``[pipeline] decode_workers``).

Each worker is one process started from a ``forkserver`` context, joined to the serving
process by a Unix socket pair, and served by one thread of the serving process that
sends it one body at a time and reads its answer back. Frames on the socket:

- serving process -> worker: ``!QH?`` (body length in bytes, encoding name length,
  ``as_json``), the encoding name (ASCII), the body;
- worker -> serving process: ``!Q`` (length in bytes), then a pickle of
  :func:`_decode_in_worker`'s tuple.

Why our own hand-off and not :class:`concurrent.futures.ProcessPoolExecutor`: when a
worker of an executor dies while it writes a result, the executor's manager thread
waits forever for the rest of the message (seen on 2026-12-02 with 911,417 bytes to
go), so every request on the pool hangs and the process cannot exit; and a worker
that dies breaks the pool as a whole, failing every request queued for it. Here a
worker's death is an end of file on its own socket: it costs only the request that
worker held (a retryable :class:`DecodeWorkerLost`), the worker is started again, and
the queued requests go on to it. It also spends less CPU per request in the serving
process (no feeder thread, no pickled arguments).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import pickle
import queue
import select
import signal
import socket
import struct
import threading
import traceback
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.process import BaseProcess
from typing import Any, Final

from .decode import decode_body
from .errors import CollectorError
from .events import PartialMap, premap
from .records import SpanBatch
from .redact import RedactStage

__all__ = [
    "DECODE_TIMEOUT_SECONDS",
    "DecodePool",
    "DecodeWorkerLost",
    "RedactedBatch",
    "counts_delta",
    "tune_gc",
]

_log = logging.getLogger("loopwatch.collector")

#: A worker that has not begun to answer this long after it was sent a body is taken
#: for stuck (a body is at most ``limits.max_decompressed_bytes`` after decompression,
#: 20 MiB by default, which decodes in a few seconds) and is killed and started again.
DECODE_TIMEOUT_SECONDS: Final = 120.0

_GC_GEN0_THRESHOLD: Final = 20_000
_REQUEST: Final = struct.Struct("!QH?")
_ANSWER: Final = struct.Struct("!Q")
_STOP: Final = object()


def counts_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """``after - before`` per key, keeping only keys that changed."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def tune_gc() -> None:
    """Run the cyclic garbage collector less often in this process.

    Each request allocates some 10^5 short-lived, acyclic objects (freed by reference
    counting), which triggered a generation-0 pass every ~700 allocations: 6 us per span
    and 35-45 ms full passes that hold the GIL, measured with 512-span batches. Objects
    alive after start-up (modules, compiled rules, restored metrics) are frozen out of
    every pass.
    """
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(_GC_GEN0_THRESHOLD, gen1, gen2)


@dataclass(slots=True)
class RedactedBatch(SpanBatch):
    """A :class:`SpanBatch` a decode worker has already redacted and premapped.

    ``spans`` is empty: the accepted spans are in ``partial`` (rows of the loopwatch
    spans, the third-party spans still to map). ``rejected_spans`` and
    ``rejection_messages`` hold what decoding refused only, as the receiver counts those
    as invalid spans; spans whose redaction failed were removed before mapping and are
    refused on the batch by :meth:`~loopwatch.collector.service.Collector.process`, as
    in process.

    Attributes:
        partial: the worker's :func:`~loopwatch.collector.events.premap` of the batch.
        canary_hits: canary occurrences redacted in this batch, by location.
        redactions: placeholders written in this batch, by rule.
        redaction_failures: spans removed because their redaction raised, not yet
            refused on the batch.
    """

    partial: PartialMap | None = None
    canary_hits: dict[str, int] = field(default_factory=dict)
    redactions: dict[str, int] = field(default_factory=dict)
    redaction_failures: int = 0

    def accepted_spans(self) -> int:
        """Spans accepted so far, as for a batch redacted in process: the decoded spans
        until :meth:`~loopwatch.collector.service.Collector.process` refuses those whose
        redaction failed (it moves ``redaction_failures`` into ``rejected_spans``), then
        the mapped ones."""
        if self.partial is None:
            return len(self.spans)
        return self.partial.mapped.spans_in + self.redaction_failures


class DecodeWorkerLost(CollectorError):
    """A decode worker process died (killed, out of memory) or was stuck while it held
    the request; nothing of the request was stored. Retryable: the receiver answers 503
    with ``Retry-After`` and the worker is started again."""

    retryable = True

    def __init__(self, reason: str = "decode worker lost") -> None:
        super().__init__(f"{reason}; retry later")


class _Closed(Exception):
    """The other end of a worker socket is gone (end of file or a broken pipe)."""


# One per worker process, set by _worker_main from the collector's redaction settings.
_WORKER_REDACT: RedactStage | None = None
_WORKER_MAX_DECOMPRESSED_BYTES = 0


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock`` (blocking), or :class:`_Closed` at end of file."""
    if n == 0:
        return b""
    data = sock.recv(n, socket.MSG_WAITALL)
    if len(data) == n:
        return data
    parts, got = [data], len(data)
    while got < n:
        more = sock.recv(n - got, socket.MSG_WAITALL)
        if not more:
            raise _Closed(f"end of file with {n - got} of {n} bytes to go")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _send_all(sock: socket.socket, head: bytes, body: bytes) -> None:
    """``head`` then ``body`` on ``sock`` (blocking; one system call when they fit)."""
    try:
        sent = sock.sendmsg([head, body])
        if sent < len(head):
            sock.sendall(head[sent:])
            sent = len(head)
        if sent - len(head) < len(body):
            sock.sendall(memoryview(body)[sent - len(head) :])
    except OSError as exc:  # EPIPE, ECONNRESET: the worker is gone
        raise _Closed(str(exc)) from None


def _worker_main(
    sock: socket.socket, canaries: tuple[str, ...], hmac_key: bytes | None, max_bytes: int
) -> None:
    """A worker's life: answer bodies from ``sock`` until the serving process closes its
    end or dies (end of file, or a broken pipe on the answer)."""
    global _WORKER_REDACT, _WORKER_MAX_DECOMPRESSED_BYTES
    # Ctrl-C reaches the whole process group: the serving process drains and stops the
    # workers itself, so they must not die mid-batch with a traceback of their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_REDACT = RedactStage(canaries=canaries, hmac_key=hmac_key)
    _WORKER_MAX_DECOMPRESSED_BYTES = max_bytes
    tune_gc()
    with sock:
        try:
            while True:
                length, name_length, as_json = _REQUEST.unpack(_recv_exactly(sock, _REQUEST.size))
                encoding = _recv_exactly(sock, name_length).decode("ascii")
                body = _recv_exactly(sock, length)
                try:
                    result: tuple[Any, ...] = _decode_in_worker(body, encoding, as_json)
                except Exception:  # a fault of ours: the serving process logs it, 500
                    result = ("crash", traceback.format_exc(limit=20))
                del body
                answer = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
                del result
                _send_all(sock, _ANSWER.pack(len(answer)), answer)
        except _Closed:
            return


def _decode_in_worker(body: bytes, encoding: str, as_json: bool) -> tuple[Any, ...]:
    """Worker side: decode, redact and premap; ``("ok", partial map, decode rejections,
    decode messages, redaction failures, canaries, redactions)`` or
    ``("error", exception class, message, attributes)`` for a refused body (collector
    errors take keyword arguments, so they do not survive pickling as exceptions)."""
    stage = _WORKER_REDACT
    if stage is None:  # _worker_main always sets it first; fail loudly if it did not
        raise RuntimeError("decode worker not initialised")
    try:
        batch = decode_body(
            body, encoding, as_json=as_json, max_decompressed_bytes=_WORKER_MAX_DECOMPRESSED_BYTES
        )
    except CollectorError as exc:
        return ("error", type(exc), str(exc), dict(vars(exc)))
    rejected, messages = batch.rejected_spans, list(batch.rejection_messages)
    before = stage.counts()
    stage.process(batch)
    after = stage.counts()
    return (
        "ok",
        premap(batch),
        rejected,
        messages,
        batch.rejected_spans - rejected,
        counts_delta(dict(after.canary_by_location), dict(before.canary_by_location)),
        counts_delta(dict(after.redactions_by_rule), dict(before.redactions_by_rule)),
    )


def _from_worker(result: tuple[Any, ...]) -> RedactedBatch:
    """The serving process's side of :func:`_decode_in_worker`: its batch, or its error
    raised again."""
    if result[0] == "error":
        raise _rebuild_error(result[1], result[2], result[3])
    if result[0] == "crash":
        _log.error("a decode worker failed on a request:\n%s", result[1])
        raise RuntimeError("decode worker failed; see the collector log")
    _, partial, rejected, messages, failures, canaries, redactions = result
    return RedactedBatch(
        spans=[],
        transport=partial.mapped.transport,
        rejected_spans=rejected,
        rejection_messages=messages,
        canary_run_ids=set(partial.mapped.canary_run_ids),
        partial=partial,
        canary_hits=canaries,
        redactions=redactions,
        redaction_failures=failures,
    )


def _rebuild_error(cls: type[CollectorError], message: str, attrs: dict[str, Any]) -> Exception:
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    vars(exc).update(attrs)
    return exc


@dataclass(slots=True)
class _Job:
    future: Future[RedactedBatch]
    body: bytes
    encoding: str
    as_json: bool


class _Worker:
    """One worker process, its socket, and the serving-process thread that feeds it."""

    def __init__(self, pool: DecodePool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.process: BaseProcess | None = None
        self.sock: socket.socket | None = None
        self.holding = False  # a request has been sent to the process, no answer yet
        self.thread = threading.Thread(
            target=self._serve, name=f"loopwatch-decode-{index}", daemon=True
        )

    def spawn(self) -> None:
        """Start a worker process (it imports the collector and builds its redactor in
        the background; the first body waits in the socket meanwhile)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        process = self.pool._context.Process(
            target=_worker_main,
            args=(theirs, *self.pool._initargs),
            name=f"loopwatch-decode-{self.index}",
            daemon=True,
        )
        try:
            process.start()
        finally:
            theirs.close()  # the worker holds the only other copy: its death is our EOF
        self.process, self.sock = process, mine

    def reap(self, *, kill: bool = False) -> None:
        """Close the socket and make sure the process is gone (SIGKILL at once with
        ``kill``, else if it lingers 5 s after its socket closed)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        process, self.process = self.process, None
        if process is not None:
            if kill:
                process.kill()
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
            process.close()

    def _respawn(self, why: str, *, kill: bool = False) -> None:
        self.reap(kill=kill)
        self.pool._count_replaced()
        _log.error("decode worker %d %s; started it again", self.index, why)
        self.spawn()

    def _serve(self) -> None:
        jobs = self.pool._jobs
        while True:
            job = jobs.get()
            if job is _STOP:
                self.reap()
                return
            assert isinstance(job, _Job)
            if not job.future.set_running_or_notify_cancel():
                continue  # the client went away while it waited
            try:
                outcome = self._run(job)
            except BaseException as exc:  # the future carries it to the request
                job.future.set_exception(exc)
            else:
                job.future.set_result(outcome)
            finally:
                self.holding = False

    def _run(self, job: _Job) -> RedactedBatch:
        name = job.encoding.encode("ascii", "replace")
        head = _REQUEST.pack(len(job.body), len(name), job.as_json) + name
        if self.sock is None:
            self.spawn()
        assert self.sock is not None
        self.holding = True
        try:
            _send_all(self.sock, head, job.body)
        except _Closed:
            # It died idle (nothing of this body reached a live worker): send it once to
            # the replacement rather than fail a request that did not cause it.
            self._respawn("was gone when a request came")
            assert self.sock is not None
            try:
                _send_all(self.sock, head, job.body)
            except _Closed:
                self._respawn("died at start")
                raise DecodeWorkerLost() from None
        sock = self.sock
        try:
            poll = select.poll()  # not select(): a busy collector has fds past 1024
            poll.register(sock, select.POLLIN)
            if not poll.poll(DECODE_TIMEOUT_SECONDS * 1000):
                self._respawn(
                    f"gave no answer in {DECODE_TIMEOUT_SECONDS:.0f} s and was killed", kill=True
                )
                raise DecodeWorkerLost("decode worker stuck")
            (length,) = _ANSWER.unpack(_recv_exactly(sock, _ANSWER.size))
            answer = _recv_exactly(sock, length)
        except (_Closed, OSError) as exc:
            self._respawn(f"died while it held a request ({exc})")
            raise DecodeWorkerLost() from None
        return _from_worker(pickle.loads(answer))


class DecodePool:
    """Worker processes that decode and redact OTLP bodies (``[pipeline] decode_workers``).

    Workers start from a ``forkserver`` context (the serving process has DuckDB and
    writer threads, which ``fork`` would copy mid-flight) and each builds its own
    :class:`RedactStage` from ``canaries`` and ``hmac_key``, so a batch is redacted exactly
    as in process. :meth:`decode` is the receiver's :data:`~loopwatch.collector.http.Decode`
    and may be awaited from any event loop or thread.

    A worker that dies (or gives no answer for :data:`DECODE_TIMEOUT_SECONDS`, and is
    then killed) fails only the request it held, with :class:`DecodeWorkerLost`, and is
    started again; requests waiting for a worker are not affected. A worker exits when
    the serving process closes its socket or dies, even by SIGKILL.

    Args:
        workers: number of processes, ``>= 1``.
        canaries: exact canary values (every encoded form is matched, as in process).
        hmac_key: HMAC placeholder key, or ``None``.
        max_decompressed_bytes: cap on a body after ``Content-Encoding`` is undone, bytes.

    Raises:
        ValueError: ``workers < 1``.
    """

    def __init__(
        self,
        workers: int,
        *,
        canaries: Iterable[str],
        hmac_key: bytes | None,
        max_decompressed_bytes: int,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self._initargs = (tuple(canaries), hmac_key, max_decompressed_bytes)
        self._context = get_context("forkserver")
        self._jobs: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pool: list[_Worker] = []
        self._closed = False
        self.replaced = 0

    def _count_replaced(self) -> None:
        with self._lock:
            self.replaced += 1

    def start(self) -> None:
        """Start the workers now rather than on the first request (returns once they are
        forked; each imports the collector and builds its redactor in the background)."""
        with self._lock:
            if self._pool or self._closed:
                return
            self._pool = [_Worker(self, i) for i in range(self.workers)]
            for worker in self._pool:
                worker.spawn()
                worker.thread.start()

    def pids(self) -> list[int]:
        """Process ids of the live workers (they start on :meth:`start` or the first
        request)."""
        return [
            p.pid
            for p in (w.process for w in list(self._pool))
            if p is not None and p.pid is not None
        ]

    def held(self) -> int:
        """Requests the workers hold now (sent to a worker, not yet answered)."""
        return sum(w.holding for w in list(self._pool))

    def queued(self) -> int:
        """Requests waiting for a free worker."""
        return self._jobs.qsize()

    async def decode(self, body: bytes, encoding: str, as_json: bool) -> RedactedBatch:
        """Decode and redact ``body`` in a worker.

        Returns:
            The redacted batch with its canary and redaction counts.

        Raises:
            DecodeError, PayloadTooLarge, UnsupportedMediaType: as
                :func:`~loopwatch.collector.decode.decode_body` (the client's fault).
            DecodeWorkerLost: the worker holding it died or was stuck, or the pool is
                closed; the client retries.
        """
        if not self._pool:
            self.start()
        future: Future[RedactedBatch] = Future()
        with self._lock:  # close() counts on no job arriving after its stop markers
            if self._closed:
                raise DecodeWorkerLost("decode workers stopped")
            self._jobs.put(_Job(future, body, encoding, as_json))
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Finish the requests already queued, then stop the workers. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool = list(self._pool)
        for _ in pool:
            self._jobs.put(_STOP)
        for worker in pool:
            worker.thread.join()
