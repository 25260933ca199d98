"""Decode worker processes and the hand-off to them (``[pipeline] decode_workers``).

Each worker is one process started from a ``forkserver`` context and joined to the
serving process by a Unix socket pair; one I/O thread of the serving process drives all
the sockets without blocking (see :class:`DecodePool`). Frames on a socket:

- serving process -> worker: ``!QH?`` (body length in bytes, encoding name length,
  ``as_json``), the encoding name (UTF-8, at most 4,096 bytes), the body;
- worker -> serving process: ``!Q`` (length in bytes), then a pickle of
  :func:`_decode_in_worker`'s tuple; first of all, once, a frame of length 0 (ready).

Why our own hand-off and not :class:`concurrent.futures.ProcessPoolExecutor`: when a
worker of an executor dies while it writes a result, the executor's manager thread
waits forever for the rest of the message, so every request on the pool hangs and the
process cannot exit; and a worker that dies breaks the pool as a whole, failing every
request queued for it. Here a worker's death is an end of file on its own socket: it
costs only the request that worker was decoding (a retryable :class:`DecodeWorkerLost`),
the worker is started again, and the queued requests go on to it. It also spends less
CPU per request in the serving process (no feeder thread, no pickled arguments; figures
in ``docs/reliability.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pickle
import selectors
import signal
import socket
import struct
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.process import BaseProcess
from typing import Any, Final

from .decode import decode_body
from .errors import CollectorError, DecodeWorkerLost
from .map import PartialMap, premap
from .records import SpanBatch
from .redact import RedactStage

__all__ = [
    "CLOSE_TIMEOUT_SECONDS",
    "DECODE_TIMEOUT_SECONDS",
    "DecodePool",
    "DecodeWorkerLost",
    "RedactedBatch",
    "counts_delta",
    "tune_gc",
]

_log = logging.getLogger("loopwatch.collector")

#: A worker that has not answered a request this long after it became the oldest one the
#: worker holds (its bytes may still be on the way) is taken for stuck (a body is at most
#: ``limits.max_decompressed_bytes`` after decompression, 20 MiB by default, which
#: decodes in a few seconds) and is killed and started again.
DECODE_TIMEOUT_SECONDS: Final = 120.0

#: The same limit once :meth:`DecodePool.close` has begun, so that a stopped or stuck
#: worker holds a shutdown (SIGTERM) for seconds, not for DECODE_TIMEOUT_SECONDS.
CLOSE_TIMEOUT_SECONDS: Final = 10.0

_GC_GEN0_THRESHOLD: Final = 20_000
_REQUEST: Final = struct.Struct("!QH?")
_MAX_ENCODING_NAME_BYTES: Final = 4096
_ANSWER: Final = struct.Struct("!Q")
#: A worker that dies this many times in a row before it is ready (it cannot import, say,
#: after the package changed on disk), or cannot be started, is started again only after
#: 0.25 s, doubling up to _MAX_BACKOFF_SECONDS; meanwhile requests go to other workers, or
#: get a retryable 503 at once when none is alive.
_DEATHS_BEFORE_BACKOFF: Final = 3
_MAX_BACKOFF_SECONDS: Final = 10.0

#: Requests a worker holds at once: the one it decodes and the next, already in its
#: socket, so that it never waits for the serving process's GIL between two.
_DEPTH: Final = 2


def counts_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """``after - before`` per key, keeping only keys that changed."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def tune_gc() -> None:
    """Run the cyclic garbage collector less often in this process.

    Each request allocates some 10^5 short-lived, acyclic objects (freed by reference
    counting), which triggered a generation-0 pass every ~700 allocations: 6 us per span
    and 35-45 ms full passes that hold the GIL, measured with 512-span batches. Objects
    alive after start-up (modules, compiled rules) are frozen out of
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
        partial: the worker's :func:`~loopwatch.collector.map.premap` of the batch.
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


def _sigkill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


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
    # Ctrl-C, and the SIGTERM of systemd's default stop or of `timeout`, reach the whole
    # process group: the serving process drains and stops the workers itself (they exit
    # on the end of file of their socket), so they must not die mid-batch, with a
    # traceback of their own or as a lost worker the pool starts again.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _WORKER_REDACT = RedactStage(canaries=canaries, hmac_key=hmac_key)
    _WORKER_MAX_DECOMPRESSED_BYTES = max_bytes
    tune_gc()
    with sock:
        try:
            _send_all(sock, _ANSWER.pack(0), b"")  # ready: imported and built its redactor
            while True:
                length, name_length, as_json = _REQUEST.unpack(_recv_exactly(sock, _REQUEST.size))
                encoding = _recv_exactly(sock, name_length).decode("utf-8", "replace")
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


@dataclass(slots=True, eq=False)
class _Job:
    future: Future[RedactedBatch]
    head: bytes
    body: bytes
    sent: int = 0  # bytes of head + body written to the worker's socket so far
    # Monotonic time it became the oldest request its worker holds, seconds: the worker
    # works on it from then on (one behind it waits in the socket, one partly written
    # waits for the worker to read it), so the stuck clock runs from then.
    current_since: float = 0.0
    resent: bool = False

    @property
    def size(self) -> int:
        return len(self.head) + len(self.body)


class _Worker:
    """One worker process, the serving process's end of its socket, and what is on the
    way to it and back. Touched by the pool's I/O thread only."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: BaseProcess | None = None
        self.sock: socket.socket | None = None
        self.out: deque[_Job] = deque()  # sent or being sent, oldest first; no answer yet
        self.head = bytearray(_ANSWER.size)
        self.answer: bytearray | None = None
        self.got = 0  # bytes of the current header, then of the answer
        self.stuck = False
        self.ready = False  # its first frame came: it imported and built its redactor
        self.deaths = 0  # times in a row it died, or failed to start, before it was ready
        self.not_before = 0.0  # monotonic time before which it is not started again

    def writing(self) -> _Job | None:
        """The job whose bytes are not all written yet (only the newest can be)."""
        return self.out[-1] if self.out and self.out[-1].sent < self.out[-1].size else None


class DecodePool:
    """Worker processes that decode and redact OTLP bodies (``[pipeline] decode_workers``).

    Workers start from a ``forkserver`` context (the serving process has DuckDB and
    writer threads, which ``fork`` would copy mid-flight) and each builds its own
    :class:`RedactStage` from ``canaries`` and ``hmac_key``, so a batch is redacted exactly
    as in process. :meth:`decode` is the receiver's :data:`~loopwatch.collector.receive.Decode`
    and may be awaited from any event loop or thread.

    One I/O thread of the serving process drives every worker's socket without blocking:
    each worker holds at most :data:`_DEPTH` requests (the one it decodes and the next,
    already in its socket, so it never waits for this process's GIL between two), and the
    rest wait in one queue for the first worker with room. Results are unpickled on that
    thread and handed to the awaiting request.

    A worker that dies (or gives no answer for :data:`DECODE_TIMEOUT_SECONDS`, and is
    then killed) fails only the request it was decoding, with :class:`DecodeWorkerLost`;
    the one behind it, which it had not begun, goes to the front of the queue, once. The
    worker is started again at once. A worker exits when the serving process closes its
    socket or dies, even by SIGKILL.

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
        self._lock = threading.Lock()
        self._incoming: deque[_Job] = deque()  # from decode(), for the I/O thread
        self._waiting: deque[_Job] = deque()  # the I/O thread's queue for a free worker
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._pool: list[_Worker] = []
        self._thread: threading.Thread | None = None
        self._closing = False
        self._asleep = False  # the I/O thread waits in select() with nothing incoming
        self.replaced = 0

    def start(self) -> None:
        """Start the workers now rather than on the first request (returns once they are
        forked; each imports the collector and builds its redactor in the background)."""
        with self._lock:
            if self._thread is not None or self._closing:
                return
            pool = [_Worker(i) for i in range(self.workers)]
            try:
                for worker in pool:
                    self._spawn(worker)
            except BaseException:
                for worker in pool:
                    self._reap(worker, kill=True)
                raise
            self._pool = pool
            self._thread = threading.Thread(target=self._serve, name="loopwatch-decode-io")
            self._thread.daemon = True
            self._thread.start()

    def pids(self) -> list[int]:
        """Process ids of the live workers (they start on :meth:`start` or the first
        request)."""
        out = []
        for worker in list(self._pool):
            process = worker.process
            with contextlib.suppress(ValueError):  # closed by the I/O thread meanwhile
                if process is not None and process.pid is not None:
                    out.append(process.pid)
        return out

    def held(self) -> int:
        """Requests the workers hold now (sent or being sent, not yet answered)."""
        return sum(len(w.out) for w in list(self._pool))

    def queued(self) -> int:
        """Requests waiting for a worker with room."""
        return len(self._incoming) + len(self._waiting)

    async def decode(self, body: bytes, encoding: str, as_json: bool) -> RedactedBatch:
        """Decode and redact ``body`` in a worker.

        Returns:
            The redacted batch with its canary and redaction counts.

        Raises:
            DecodeError, PayloadTooLarge, UnsupportedMediaType: as
                :func:`~loopwatch.collector.decode.decode_body` (the client's fault).
            DecodeWorkerLost: the worker decoding it died or was stuck, or the pool is
                closed; the client retries.
        """
        if self._thread is None:
            self.start()
        # Any text the client sent as its encoding reaches the worker intact (it is refused
        # there by name, as in process); no header is near the 65,535-byte frame field.
        name = encoding.encode("utf-8", "surrogatepass")[:_MAX_ENCODING_NAME_BYTES]
        job = _Job(Future(), _REQUEST.pack(len(body), len(name), as_json) + name, body)
        with self._lock:  # the I/O thread stops only once nothing can come in
            if self._closing:
                raise DecodeWorkerLost("decode workers stopped")
            self._incoming.append(job)
            # One wake-up per sleep: a busy I/O thread takes the job on its next turn.
            wake, self._asleep = self._asleep, False
        if wake:
            self._wake()
        return await asyncio.wrap_future(job.future)

    def close(self) -> None:
        """Finish the requests already queued, then stop the workers. Idempotent.

        A worker that gives no answer for :data:`CLOSE_TIMEOUT_SECONDS` from here on is
        killed, and its request fails with :class:`DecodeWorkerLost`.
        """
        with self._lock:
            if self._closing and self._thread is None:
                return
            self._closing = True
            thread = self._thread
        if thread is None:  # never started
            self._wake_r.close()
            self._wake_w.close()
            return
        self._wake()
        thread.join()

    def _wake(self) -> None:
        # Full: a wake-up is pending anyway. Closed: the I/O thread has stopped.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # The rest runs on the I/O thread (and _spawn also under start()'s lock).

    def _spawn(self, worker: _Worker) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        process = self._context.Process(
            target=_worker_main,
            args=(theirs, *self._initargs),
            name=f"loopwatch-decode-{worker.index}",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()  # the worker holds the only other copy: its death is our EOF
        mine.setblocking(False)
        worker.process, worker.sock = process, mine
        worker.got, worker.answer, worker.stuck, worker.ready = 0, None, False, False

    def _respawn(self, worker: _Worker) -> bool:
        """Start ``worker`` again; ``False`` if that fails (logged; e.g. the forkserver is
        gone) or it is backing off after dying again and again: a later request tries."""
        if time.monotonic() < worker.not_before:
            return False
        try:
            self._spawn(worker)
        except Exception:
            _log.exception("decode worker %d cannot start", worker.index)
            self._back_off(worker)
            return False
        return True

    def _back_off(self, worker: _Worker) -> None:
        worker.deaths += 1
        if worker.deaths >= _DEATHS_BEFORE_BACKOFF:
            delay = min(_MAX_BACKOFF_SECONDS, 0.25 * 2 ** (worker.deaths - _DEATHS_BEFORE_BACKOFF))
            worker.not_before = time.monotonic() + delay

    def _reap(self, worker: _Worker, *, kill: bool) -> None:
        """Close ``worker``'s socket (it exits on that end of file) and see its process
        gone: SIGKILL at once with ``kill``, or if it lives 5 s on."""
        if worker.sock is not None:
            worker.sock.close()
            worker.sock = None
        process, worker.process = worker.process, None
        if process is None:
            return
        pid = process.pid
        if kill and pid is not None:
            _sigkill(pid)
        process.join(5)
        # Once the forkserver is gone, multiprocessing reads every worker as exited (code
        # 255) and Process.kill() sends nothing, so the kernel is asked instead.
        if pid is not None and _alive(pid):
            _sigkill(pid)
        with contextlib.suppress(ValueError):  # still running: nothing more to do here
            process.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        registered: dict[int, int] = {}  # worker index -> events registered
        try:
            while True:
                self._take_incoming()
                self._dispatch()
                if self._closing and not self._waiting and not any(w.out for w in self._pool):
                    with self._lock:
                        if not self._incoming:
                            return
                    continue
                for worker in self._pool:
                    self._register(selector, registered, worker)
                with self._lock:
                    timeout = 0.0 if self._incoming else self._next_timeout()
                    self._asleep = timeout != 0.0
                ready = selector.select(timeout)
                self._asleep = False
                for key, events in ready:
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            self._wake_r.recv(4096)
                        continue
                    worker = key.data
                    try:
                        if events & selectors.EVENT_WRITE:
                            self._write(worker)
                        if events & selectors.EVENT_READ:
                            self._read(worker)
                    except _Closed as exc:
                        self._lost(selector, registered, worker, str(exc))
                self._kill_stuck()
        except BaseException:
            _log.exception("the decode workers' I/O thread failed; decode requests get 503")
            raise
        finally:
            with self._lock:
                self._closing = True  # nothing serves the queue any more
            selector.close()
            for worker in self._pool:
                self._reap(worker, kill=False)
            self._fail_all(DecodeWorkerLost("decode workers stopped"))
            self._wake_r.close()
            self._wake_w.close()

    def _take_incoming(self) -> None:
        with self._lock:
            while self._incoming:
                self._waiting.append(self._incoming.popleft())

    def _dispatch(self) -> None:
        while self._waiting:
            worker = self._free_worker()
            if worker is None:
                return  # every live worker is full, or every worker is backing off
            job = self._waiting.popleft()
            if not job.resent and not job.future.set_running_or_notify_cancel():
                continue  # the client went away while it waited
            if worker.sock is None:  # none is alive, and starting one just failed
                job.future.set_exception(DecodeWorkerLost("decode worker cannot start"))
                continue
            if not worker.out:
                job.current_since = time.monotonic()
            worker.out.append(job)
            with contextlib.suppress(_Closed):  # its end of file is read next, and handled
                self._write(worker)

    def _free_worker(self) -> _Worker | None:
        """The least busy live worker with room, after starting dead ones again; ``None``
        to wait (all full); a dead worker when none is alive or can be started now (its
        start failed, or it is backing off), so that the request fails at once (503)
        rather than waits on a broken install."""
        dead = [w for w in self._pool if w.sock is None]
        for w in dead:
            self._respawn(w)
        live = [w for w in self._pool if w.sock is not None]
        if not live:
            return dead[0]
        room = [w for w in live if len(w.out) < _DEPTH and w.writing() is None]
        return min(room, key=lambda w: len(w.out)) if room else None

    def _register(
        self, selector: selectors.BaseSelector, registered: dict[int, int], worker: _Worker
    ) -> None:
        if worker.sock is None:
            return
        events = selectors.EVENT_READ | (
            selectors.EVENT_WRITE if worker.writing() is not None else 0
        )
        if registered.get(worker.index) != events:
            if worker.index in registered:
                selector.modify(worker.sock, events, worker)
            else:
                selector.register(worker.sock, events, worker)
            registered[worker.index] = events

    def _next_timeout(self) -> float | None:
        limit = self._limit()
        due = [w.out[0].current_since + limit for w in self._pool if w.out]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def _write(self, worker: _Worker) -> None:
        job = worker.writing()
        assert worker.sock is not None
        while job is not None:
            head = len(job.head)
            parts: list[bytes | memoryview] = (
                [memoryview(job.head)[job.sent :], job.body]
                if job.sent < head
                else [memoryview(job.body)[job.sent - head :]]
            )
            try:
                job.sent += worker.sock.sendmsg(parts)
            except BlockingIOError:
                return
            except OSError as exc:  # EPIPE, ECONNRESET: the worker is gone
                raise _Closed(str(exc)) from None
            if job.sent == job.size:
                job = None

    def _read(self, worker: _Worker) -> None:
        sock = worker.sock
        assert sock is not None
        while True:
            if worker.answer is None:
                view = memoryview(worker.head)[worker.got :]
            else:
                view = memoryview(worker.answer)[worker.got :]
            try:
                n = sock.recv_into(view)
            except BlockingIOError:
                return
            except OSError as exc:
                raise _Closed(str(exc)) from None
            if n == 0:
                raise _Closed("end of file")
            worker.got += n
            if worker.answer is None:
                if worker.got < _ANSWER.size:
                    continue
                (length,) = _ANSWER.unpack(worker.head)
                worker.got = 0
                if not length:  # the worker is up (its first frame)
                    worker.ready, worker.deaths = True, 0
                    continue
                worker.answer = bytearray(length)
            if worker.got < len(worker.answer):
                continue
            answer, worker.answer, worker.got = worker.answer, None, 0
            if not worker.out:
                raise _Closed("an answer to no request")
            job = worker.out.popleft()
            if worker.out:
                worker.out[0].current_since = time.monotonic()
            try:
                job.future.set_result(_from_worker(pickle.loads(answer)))
            except BaseException as exc:  # a refused body, or a fault of ours: 500
                job.future.set_exception(exc)
            self._dispatch()

    def _limit(self) -> float:
        """Seconds a worker may take on its oldest request before it is killed."""
        limit = DECODE_TIMEOUT_SECONDS
        return min(limit, CLOSE_TIMEOUT_SECONDS) if self._closing else limit

    def _kill_stuck(self) -> None:
        now = time.monotonic()
        for worker in self._pool:
            first = worker.out[0] if worker.out else None
            if (
                first is not None
                and not worker.stuck
                and now - first.current_since >= self._limit()
                and worker.process is not None
                and worker.process.pid is not None
            ):
                worker.stuck = True
                # Not Process.kill(): once the forkserver is gone, multiprocessing takes
                # live workers for dead and sends them nothing. Its socket is still open,
                # so the worker is alive or has just died (and its end of file follows,
                # handled in _lost).
                _sigkill(worker.process.pid)

    def _lost(
        self,
        selector: selectors.BaseSelector,
        registered: dict[int, int],
        worker: _Worker,
        why: str,
    ) -> None:
        stuck = worker.stuck
        if worker.sock is not None:
            selector.unregister(worker.sock)
        registered.pop(worker.index, None)
        held = list(worker.out)
        worker.out.clear()
        ready = worker.ready
        self._reap(worker, kill=True)
        if not ready:  # a worker that cannot start (broken install) is not restarted flat out
            self._back_off(worker)
        with self._lock:
            self.replaced += 1
        reason = f"gave no answer in {self._limit():g} s and was killed" if stuck else why
        _log.error("decode worker %d lost (%s); starting it again", worker.index, reason)
        # The worker had begun the first only if it was ready and all of its bytes reached
        # it; the rest it had not begun, so they go once more to the front of the queue.
        if held and ready and held[0].sent == held[0].size and not held[0].resent:
            first = held.pop(0)
            first.future.set_exception(
                DecodeWorkerLost("decode worker stuck" if stuck else "decode worker lost")
            )
        for job in reversed(held):
            if job.resent:
                job.future.set_exception(DecodeWorkerLost())
            else:
                job.sent, job.current_since, job.resent = 0, 0.0, True
                self._waiting.appendleft(job)
        self._respawn(worker)

    def _fail_all(self, exc: DecodeWorkerLost) -> None:
        self._take_incoming()
        for worker in self._pool:
            self._waiting.extend(worker.out)
            worker.out.clear()
        while self._waiting:
            job = self._waiting.popleft()
            if not job.future.done():
                job.future.set_exception(exc)
