""":class:`DecodePool` on its own: real forkserver workers, real sockets, real kills.

What a worker's death or a stuck worker costs: only the request it held, never a hang,
never a request that waited for a free worker. The worker answering half a message (the
case that hung ``ProcessPoolExecutor`` for good) is played by a thread on a real socket
pair, since a kill cannot be timed to land mid-write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from loopwatch.collector import workers
from loopwatch.collector.errors import DecodeError, DecodeWorkerLost, UnsupportedMediaType
from loopwatch.collector.workers import DecodePool, RedactedBatch
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from .spans import completed_run, looping_run, record

CANARY = "lw-canary-0b9d41e27f6c"
_T = TypeVar("_T")


def wait_dead(pid: int, timeout_s: float = 10.0) -> None:
    """Until ``pid`` is a zombie or gone (its sockets are closed by then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still alive after {timeout_s} s")


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def pool() -> Iterator[DecodePool]:
    p = DecodePool(1, canaries=(CANARY,), hmac_key=None, max_decompressed_bytes=1 << 22)
    p.start()
    # Ready and at work: a worker that dies before it is ready has begun nothing, so its
    # requests go to the next one rather than fail.
    assert isinstance(_run(p.decode(_body("warm"), "identity", False)), RedactedBatch)
    yield p
    for pid in p.pids():  # a test may leave its worker stopped
        os.kill(pid, signal.SIGCONT)
    p.close()


def _body(agent: str) -> bytes:
    return encode_spans(record(looping_run(agent))).SerializeToString()


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _gather(pool: DecodePool, *bodies: bytes) -> list[RedactedBatch | BaseException]:
    return await asyncio.gather(
        *(pool.decode(b, "identity", False) for b in bodies), return_exceptions=True
    )


def test_answers_and_refusals_come_back(pool: DecodePool) -> None:
    batch = _run(pool.decode(_body("a"), "identity", False))
    assert isinstance(batch, RedactedBatch) and batch.partial is not None
    assert batch.partial.mapped.spans_in > 0
    with pytest.raises(DecodeError):
        _run(pool.decode(b"\xff\xff\xff", "identity", False))
    # A canary is redacted in the worker and counted.
    request = encode_spans(record(completed_run()))
    request.resource_spans[0].scope_spans[0].spans[0].name = f"x {CANARY}"
    batch = _run(pool.decode(request.SerializeToString(), "identity", False))
    assert isinstance(batch, RedactedBatch) and batch.canary_hits == {"name": 1}
    assert pool.replaced == 0


def test_a_worker_killed_holding_a_request_fails_that_request_only(pool: DecodePool) -> None:
    """The held request gets a retryable error; the requests waiting behind it are
    decoded by the replacement, and nothing hangs. (``ProcessPoolExecutor`` failed every
    queued request with the held one.)"""
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGSTOP)

    async def scenario() -> list[RedactedBatch | BaseException]:
        first = asyncio.ensure_future(pool.decode(_body("held"), "identity", False))
        await asyncio.to_thread(_wait, lambda: pool.held() == 1, "the worker to hold it")
        rest = [asyncio.ensure_future(pool.decode(_body(a), "identity", False)) for a in "bc"]
        # The worker holds the next one in its socket too; the third waits here.
        await asyncio.to_thread(
            _wait, lambda: pool.held() == 2 and pool.queued() == 1, "two held, one queued"
        )
        os.kill(pid, signal.SIGKILL)
        return await asyncio.gather(first, *rest, return_exceptions=True)

    started = time.monotonic()
    held, *queued = _run(scenario())
    assert time.monotonic() - started < 20
    assert isinstance(held, DecodeWorkerLost) and held.retryable
    assert all(isinstance(b, RedactedBatch) for b in queued), queued
    assert pool.replaced == 1 and pool.pids() and pid not in pool.pids()
    assert isinstance(_run(pool.decode(_body("held"), "identity", False)), RedactedBatch)


def _stop_the_worker(
    pool: DecodePool, monkeypatch: pytest.MonkeyPatch, limit: str, seconds: float
) -> int:
    """SIGSTOP the pool's one worker with the stuck limit ``limit`` set to ``seconds``."""
    monkeypatch.setattr(workers, limit, seconds)
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGSTOP)
    return pid


def test_a_stuck_worker_is_killed_and_replaced(
    pool: DecodePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = _stop_the_worker(pool, monkeypatch, "DECODE_TIMEOUT_SECONDS", 0.5)
    with pytest.raises(DecodeWorkerLost, match="stuck"):
        _run(pool.decode(_body("a"), "identity", False))
    wait_dead(pid)
    assert pool.replaced == 1
    # The replacement's start-up (0.4-0.6 s here) must not count against a 0.5 s limit.
    monkeypatch.setattr(workers, "DECODE_TIMEOUT_SECONDS", 120.0)
    assert isinstance(_run(pool.decode(_body("a"), "identity", False)), RedactedBatch)


class _Scripted:
    """Plays a worker on a real socket pair: reads one request, then writes ``answer``
    and closes (or closes at once after ``read`` bytes of the request)."""

    def __init__(self, answer: bytes | None, read: int | None = None) -> None:
        self.mine, self.theirs = socket.socketpair()
        self.thread = threading.Thread(target=self._play, args=(answer, read), daemon=True)
        self.thread.start()

    def _play(self, answer: bytes | None, read: int | None) -> None:
        with self.theirs:
            self.theirs.sendall(workers._ANSWER.pack(0))  # ready, as a real worker says
            if read is not None:
                self.theirs.recv(read, socket.MSG_WAITALL)
                return
            length, name_length, _ = workers._REQUEST.unpack(
                self.theirs.recv(workers._REQUEST.size, socket.MSG_WAITALL)
            )
            self.theirs.recv(name_length + length, socket.MSG_WAITALL)
            if answer:
                self.theirs.sendall(answer)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Callable[[_Scripted], DecodePool]:
    """A one-worker pool whose first worker is ``peer``; later ones are real."""
    real = DecodePool._spawn
    made: list[DecodePool] = []

    def make(peer: _Scripted) -> DecodePool:
        def spawn(self: DecodePool, worker: workers._Worker) -> None:
            if self.replaced:
                real(self, worker)
                return
            peer.mine.setblocking(False)
            worker.process, worker.sock = None, peer.mine

        monkeypatch.setattr(DecodePool, "_spawn", spawn)
        pool = DecodePool(1, canaries=(), hmac_key=None, max_decompressed_bytes=1 << 22)
        made.append(pool)
        pool.start()
        return pool

    yield make  # type: ignore[misc]
    for pool in made:
        pool.close()


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"", id="no-answer"),
        pytest.param(workers._ANSWER.pack(911_417), id="header-only"),
        pytest.param(workers._ANSWER.pack(911_417) + b"\x80" * 65_536, id="mid-answer"),
        pytest.param(workers._ANSWER.pack(4)[:5], id="half-header"),
    ],
)
def test_a_worker_that_dies_mid_answer_fails_its_request_at_once(
    scripted: Callable[[_Scripted], DecodePool], answer: bytes
) -> None:
    pool = scripted(_Scripted(answer))
    started = time.monotonic()
    with pytest.raises(DecodeWorkerLost):
        _run(pool.decode(_body("a"), "identity", False))
    assert time.monotonic() - started < 10
    assert pool.replaced == 1
    assert isinstance(_run(pool.decode(_body("a"), "identity", False)), RedactedBatch)


def test_a_worker_that_dies_reading_a_request_has_it_sent_to_its_replacement(
    scripted: Callable[[_Scripted], DecodePool],
) -> None:
    """The dead worker never had the whole body, so the body goes once to the new worker.
    A body well past the socket buffer, so the scripted worker leaves mid-body."""
    pool = scripted(_Scripted(None, read=1000))
    request = encode_spans(record(looping_run("big")))
    attr = request.resource_spans[0].resource.attributes.add()
    attr.key, attr.value.string_value = "pad", "x" * 2_000_000
    batch = _run(pool.decode(request.SerializeToString(), "identity", False))
    assert isinstance(batch, RedactedBatch)
    assert pool.replaced == 1


def test_close_finishes_queued_requests_then_refuses(pool: DecodePool) -> None:
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGSTOP)
    results: list[object] = []

    def client() -> None:
        results.extend(asyncio.run(_gather(pool, _body("a"), _body("b"), _body("c"))))

    thread = threading.Thread(target=client)
    thread.start()
    _wait(lambda: pool.held() == 2 and pool.queued() == 1, "two held, one queued")
    closer = threading.Thread(target=pool.close)
    closer.start()
    os.kill(pid, signal.SIGCONT)
    closer.join(30)
    thread.join(30)
    assert not closer.is_alive() and not thread.is_alive()
    assert len(results) == 3 and all(isinstance(r, RedactedBatch) for r in results), results
    assert pool.pids() == []
    wait_dead(pid)
    with pytest.raises(DecodeWorkerLost, match="stopped"):
        _run(pool.decode(_body("late"), "identity", False))


@pytest.mark.parametrize(
    "encoding", ["br", "gzip, gzip", "g\u00e9zip", "\udcff", "x" * 70_000, "\u00e9" * 3000]
)
def test_any_encoding_name_is_refused_by_name_and_the_worker_lives(
    pool: DecodePool, encoding: str
) -> None:
    (pid,) = pool.pids()
    with pytest.raises(UnsupportedMediaType):
        _run(pool.decode(_body("a"), encoding, False))
    assert pool.pids() == [pid] and pool.replaced == 0


def _big_body(agent: str, pad_bytes: int = 2_000_000) -> bytes:
    """A body well past a Unix socket's buffer: a stopped worker takes only part of it."""
    request = encode_spans(record(looping_run(agent)))
    attr = request.resource_spans[0].resource.attributes.add()
    attr.key, attr.value.string_value = "pad", "x" * pad_bytes
    return request.SerializeToString()


def test_a_stopped_worker_is_replaced_before_it_took_the_whole_body(
    pool: DecodePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stuck clock ran only once a body's last byte was written, so a worker that
    stopped reading mid-body was never killed and its request hung. It had not begun the
    body, so the body goes to the replacement."""
    assert isinstance(_run(pool.decode(_body("warm"), "identity", False)), RedactedBatch)
    monkeypatch.setattr(workers, "DECODE_TIMEOUT_SECONDS", 1.5)
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGSTOP)
    batch = asyncio.run(asyncio.wait_for(pool.decode(_big_body("big"), "identity", False), 5))
    assert isinstance(batch, RedactedBatch)
    assert pool.replaced == 1
    wait_dead(pid)


SLOW_SECONDS = 1.0


def _slow_worker_main(sock: socket.socket, *args: Any) -> None:
    """A real decode worker (forkserver child) that takes :data:`SLOW_SECONDS` more on
    each body."""
    decode = workers._decode_in_worker

    def slow(*body: Any) -> tuple[Any, ...]:
        time.sleep(SLOW_SECONDS)
        return decode(*body)

    workers._decode_in_worker = slow
    workers._worker_main(sock, *args)


def test_the_request_behind_a_slow_one_gets_the_whole_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second request a worker holds waits in its socket while the first decodes; its
    clock ran from that moment, so a worker that took 1 s on each of two bodies was
    killed as stuck after 1.5 s, on the second, with a 1.5 s limit."""
    monkeypatch.setattr(workers, "_worker_main", _slow_worker_main)
    pool = DecodePool(1, canaries=(), hmac_key=None, max_decompressed_bytes=1 << 22)
    try:
        assert isinstance(_run(pool.decode(_body("warm"), "identity", False)), RedactedBatch)
        monkeypatch.setattr(workers, "DECODE_TIMEOUT_SECONDS", 1.5 * SLOW_SECONDS)
        results = _run(_gather(pool, _body("a"), _body("b")))
        assert all(isinstance(r, RedactedBatch) for r in results), results
        assert pool.replaced == 0
    finally:
        pool.close()


def test_a_stuck_worker_is_killed_after_the_forkserver_died(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the forkserver is gone, starting any process makes multiprocessing poll every
    child it knows through the forkserver's pipe, and it takes the live workers for dead
    (exit code 255): ``Process.kill`` then sends nothing. A stuck worker was never killed
    and its request hung."""
    from multiprocessing import forkserver

    pool = DecodePool(2, canaries=(), hmac_key=None, max_decompressed_bytes=1 << 22)
    try:
        pool.start()
        bodies = [_body(a) for a in "abcd"]
        assert all(isinstance(r, RedactedBatch) for r in _run(_gather(pool, *bodies)))
        server = forkserver._forkserver._forkserver_pid
        assert server is not None
        os.kill(server, signal.SIGKILL)
        wait_dead(server)
        first, second = (w.process.pid for w in pool._pool if w.process is not None)
        os.kill(second, signal.SIGKILL)  # its replacement comes from a new forkserver
        _wait(lambda: pool.replaced == 1 and len(pool.pids()) == 2, "a replacement")
        monkeypatch.setattr(workers, "DECODE_TIMEOUT_SECONDS", 0.5)
        os.kill(first, signal.SIGSTOP)
        with pytest.raises(DecodeWorkerLost, match="stuck"):
            asyncio.run(asyncio.wait_for(pool.decode(_body("a"), "identity", False), 5))
        wait_dead(first)
    finally:
        for pid in pool.pids():
            os.kill(pid, signal.SIGCONT)
        pool.close()


def test_a_worker_that_cannot_start_again_leaves_the_work_to_the_others() -> None:
    """A worker whose replacement cannot start (here: no file descriptor left for its
    socket pair) has the fewest requests, so each request went to it and failed with
    "cannot start" while the other worker sat idle."""
    import resource

    pool = DecodePool(2, canaries=(), hmac_key=None, max_decompressed_bytes=1 << 22)
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []

    async def scenario() -> list[RedactedBatch | BaseException]:
        # Every descriptor below the limit is taken, so once the dead worker's socket is
        # closed one is free and a socket pair (two) cannot be made.
        top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, limits[1]))
        with contextlib.suppress(OSError):
            while True:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
        dead = pool._pool[0].process
        assert dead is not None and dead.pid is not None
        os.kill(dead.pid, signal.SIGKILL)
        await asyncio.to_thread(
            _wait, lambda: pool.replaced == 1 and len(pool.pids()) == 1, "a failed restart"
        )
        return await _gather(pool, *(_body(a) for a in "abc"))

    try:
        pool.start()
        assert all(isinstance(r, RedactedBatch) for r in _run(_gather(pool, _body("a"))))
        results = _run(scenario())
        assert all(isinstance(r, RedactedBatch) for r in results), results
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        pool.close()


def _dying_worker_main(sock: socket.socket, canaries: tuple[str, ...], *args: Any) -> None:
    """A worker that dies before it is ready while the file named by its first canary
    exists (a broken install), and a real one after."""
    if Path(canaries[0]).exists():
        os._exit(3)
    workers._worker_main(sock, canaries, *args)


def test_a_worker_that_cannot_start_is_restarted_with_a_backoff_and_fails_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the backoff it was started again flat out, a fork and an import each time,
    for as long as the install stayed broken. Requests meanwhile get a retryable error at
    once, and once the worker can start it serves again."""
    broken = tmp_path / "broken"
    broken.touch()
    monkeypatch.setattr(workers, "_worker_main", _dying_worker_main)
    pool = DecodePool(1, canaries=(str(broken),), hmac_key=None, max_decompressed_bytes=1 << 22)
    try:
        started = time.monotonic()
        answers = []
        while time.monotonic() - started < 4.0:
            asked = time.monotonic()
            with pytest.raises(DecodeWorkerLost):
                _run(pool.decode(_body("a"), "identity", False))
            answers.append(time.monotonic() - asked)
            time.sleep(0.05)
        # 3 deaths, then waits of 0.25, 0.5, 1 and 2 s, each request failing at once in
        # them: 5 starts and 27 answers in 4 s here. Flat out, a start every 0.5 s (a fork
        # and an import each) and each request waiting for that start to die: 8 and 8.
        assert 3 <= pool.replaced <= 6, pool.replaced
        assert len(answers) >= 15 and max(answers) < 2.0, answers
        broken.unlink()
        deadline = time.monotonic() + 15
        while True:
            try:
                batch = _run(pool.decode(_body("a"), "identity", False))
                break
            except DecodeWorkerLost:
                assert time.monotonic() < deadline, "never started again"
                time.sleep(0.1)
        assert isinstance(batch, RedactedBatch)
    finally:
        pool.close()


def test_a_worker_killed_before_it_is_ready_has_its_requests_sent_to_the_next() -> None:
    """It had begun nothing (it was still importing), so neither request fails."""
    pool = DecodePool(1, canaries=(), hmac_key=None, max_decompressed_bytes=1 << 22)
    try:
        pool.start()
        (pid,) = pool.pids()
        os.kill(pid, signal.SIGSTOP)

        async def scenario() -> list[RedactedBatch | BaseException]:
            asked = [asyncio.ensure_future(pool.decode(_body(a), "identity", False)) for a in "ab"]
            await asyncio.to_thread(_wait, lambda: pool.held() == 2, "both held")
            os.kill(pid, signal.SIGKILL)
            return await asyncio.gather(*asked, return_exceptions=True)

        results = _run(scenario())
        assert all(isinstance(r, RedactedBatch) for r in results), results
        assert pool.replaced == 1
    finally:
        pool.close()


def test_close_with_a_stopped_worker_takes_seconds_not_the_stuck_limit(
    pool: DecodePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM with a stopped worker held the shutdown for DECODE_TIMEOUT_SECONDS (120)."""
    pid = _stop_the_worker(pool, monkeypatch, "CLOSE_TIMEOUT_SECONDS", 0.5)
    results: list[RedactedBatch | BaseException] = []
    client = threading.Thread(target=lambda: results.extend(_run(_gather(pool, _body("a")))))
    client.start()
    _wait(lambda: pool.held() == 1, "the worker to hold it")
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 5
    client.join(10)
    assert len(results) == 1 and isinstance(results[0], DecodeWorkerLost), results
    wait_dead(pid)
