"""The keys the writer checks in memory: the dedup window of span keys and a Bloom filter
of stored run keys.

:class:`RecentKeys` holds the span keys committed within the dedup retention, so a client
retry is recognised without reading DuckDB. :class:`RunKeyFilter`:

Which run keys may already be in the ``runs`` table: a Bloom filter for the writer.

Every group commit merges its spans into their run rows, so the writer must read the
rows that already exist. For most groups none do (an agent's spans usually reach the
collector in the same export batch as their run), yet the read still costs a DuckDB
statement: about 2.7 ms of CPU per group at saturation, a tenth of the writer's
(``tests/bench/bench_ingest.py``, measured here). :class:`RunKeyFilter` answers "certainly
not stored" for such keys, so the writer asks DuckDB only about the others.

A Bloom filter has no false negatives (Bloom, "Space/time trade-offs in hash coding with
allowable errors", CACM 13(7), 1970): a key added is always reported as maybe present,
which is the one property the writer relies on. A false positive costs only the lookup
that would have run anyway. Keys are never removed (a deleted run's key stays a false
positive). The ``k`` bit positions come from the key's two 32-bit halves by double
hashing, ``h1 + i * h2`` (Kirsch and Mitzenmacher, "Less hashing, same performance:
building a better Bloom filter", ESA 2006); run keys are already uniform 64-bit hashes
(blake2b of the run id), so no further hashing is needed.

Size: ``2**bits_log2`` bits (default 2**26 bits = 8 MiB) and ``hashes`` positions per
key (default 7) give a false-positive rate of about 1 % at 7 million runs, 16 % at 14
million; past that the writer simply looks up more keys, as it did without the filter.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEDUP_BYTES_PER_KEY",
    "DEFAULT_BITS_LOG2",
    "DEFAULT_HASHES",
    "RecentKeys",
    "RunKeyFilter",
    "span_key",
]

logger = logging.getLogger("loopwatch.collector.store")

DEFAULT_BITS_LOG2: Final = 26
DEFAULT_HASHES: Final = 7
_CHUNK_KEYS: Final = 1 << 18  # keys per vectorised step when adding many (bounds memory)
_LOW32: Final = 0xFFFFFFFF
_MASK64: Final = 2**64 - 1


class RunKeyFilter:
    """A Bloom filter over 64-bit run keys (writer thread only; not thread-safe).

    Args:
        bits_log2: log2 of the number of bits (memory is ``2**bits_log2 / 8`` bytes).
        hashes: bit positions per key.

    Raises:
        ValueError: ``bits_log2`` outside 3..40 or ``hashes`` outside 1..32.

    Example:
        >>> f = RunKeyFilter(bits_log2=16)
        >>> f.add([12345678901234567890])
        >>> f.may_contain([12345678901234567890, 42])[0]
        True
    """

    def __init__(self, bits_log2: int = DEFAULT_BITS_LOG2, hashes: int = DEFAULT_HASHES) -> None:
        if not 3 <= bits_log2 <= 40:
            raise ValueError(f"bits_log2 must be in 3..40, got {bits_log2}")
        if not 1 <= hashes <= 32:
            raise ValueError(f"hashes must be in 1..32, got {hashes}")
        self.bits = 1 << bits_log2
        self._mask = np.uint64(self.bits - 1)
        self._array = np.zeros(self.bits >> 3, dtype=np.uint8)
        self._steps = np.arange(hashes, dtype=np.uint64)[:, np.newaxis]
        self.added = 0  # keys added, duplicates included

    def _positions(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        # Shape (hashes, len(keys)); uint64 arithmetic wraps, and only the low
        # bits_log2 bits are kept. An odd step keeps the positions of one key distinct.
        low = keys & np.uint64(_LOW32)
        high = (keys >> np.uint64(32)) | np.uint64(1)
        positions: npt.NDArray[np.uint64] = (low + self._steps * high) & self._mask
        return positions

    def add(self, keys: Iterable[int]) -> None:
        """Add run keys (ints in ``0 .. 2**64 - 1``)."""
        self.add_array(np.fromiter(keys, dtype=np.uint64))

    def add_array(self, keys: npt.NDArray[np.uint64]) -> None:
        """Add a ``uint64`` array of run keys, a bounded chunk at a time."""
        for start in range(0, len(keys), _CHUNK_KEYS):
            positions = self._positions(keys[start : start + _CHUNK_KEYS]).ravel()
            masks = np.left_shift(1, positions & np.uint64(7)).astype(np.uint8)
            np.bitwise_or.at(self._array, positions >> np.uint64(3), masks)
        self.added += len(keys)

    def may_contain(self, keys: Sequence[int]) -> list[bool]:
        """For each key: ``False`` if it was certainly never added, else ``True``."""
        if not keys:
            return []
        positions = self._positions(np.fromiter(keys, dtype=np.uint64, count=len(keys)))
        bits = (self._array[positions >> np.uint64(3)] >> (positions & np.uint64(7))) & 1
        found: list[bool] = bits.all(axis=0).tolist()
        return found


def span_key(trace_id: str, span_id: str) -> tuple[int, int]:
    try:
        return int(span_id, 16) & _MASK64, int(trace_id[-16:], 16) & _MASK64
    except ValueError:
        digest = hashlib.blake2b(f"{trace_id}/{span_id}".encode(), digest_size=16).digest()
        return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")


DEDUP_BYTES_PER_KEY: Final = 24
"""Memory per key of :class:`RecentKeys`, for sizing it from a budget in bytes: 16 bytes
in a sealed slice (two ``uint64``), plus the open slice's share (at most 1/16 of the keys,
as Python ints in a set, about 100 bytes each). Measured: ``tests/unit/test_store_keys.py``."""


class RecentKeys:
    """Span keys committed within the dedup window, in slices (writer thread only).

    Keys are ``span_key << 64 | trace_key``. A slice holds the keys of at most 1/16 of
    the retention and 1/16 of ``max_keys``; it is forgotten at the first maintenance
    after its newest key's retention ended, so a key is kept at least ``retention``.
    Past ``max_keys``, slices are dropped oldest first (logged at most once a minute).

    Memory: the open slice is a Python set (fast to add to); a full or past slice is
    sealed into two sorted ``uint64`` arrays, 16 bytes a key instead of about 100, and
    looked up with a vectorised binary search. About :data:`DEDUP_BYTES_PER_KEY` bytes a
    key overall (2 million keys: 48 MiB).
    """

    def __init__(self, retention_ns: int, max_keys: int) -> None:
        self._retention_ns = retention_ns
        self._slice_ns = max(retention_ns // 16, 1)
        self._slice_keys = max(max_keys // 16, 1)
        self._max_keys = max_keys
        self._sealed: deque[_Sealed] = deque()
        self._open: set[int] = set()
        self._open_index = -1
        self._open_newest = -1
        self._size = 0
        self._warned = -math.inf
        self.dropped_early = 0

    def __len__(self) -> int:
        return self._size

    def unseen(self, keys: Iterable[int]) -> set[int]:
        """The keys not in the window."""
        fresh = set(keys).difference(self._open)
        if not fresh or not self._sealed:
            return fresh
        ordered = list(fresh)
        spans = np.fromiter((k >> 64 for k in ordered), dtype=np.uint64, count=len(ordered))
        traces = np.fromiter((k & _MASK64 for k in ordered), dtype=np.uint64, count=len(ordered))
        seen = np.zeros(len(ordered), dtype=bool)
        for sealed in reversed(self._sealed):
            seen |= sealed.contains(spans, traces)
        return {k for k, old in zip(ordered, seen.tolist(), strict=True) if not old}

    def add(self, keys: set[int], now_ns: int) -> None:
        """Remember ``keys`` as seen at ``now_ns`` (disjoint from the window)."""
        index = now_ns // self._slice_ns
        if self._open and (index > self._open_index or len(self._open) >= self._slice_keys):
            self._seal()
        if not self._open:
            self._open_index = max(index, self._open_index)
        self._open_newest = max(self._open_newest, now_ns)
        self._open.update(keys)
        self._size += len(keys)
        dropped = 0
        while self._size > self._max_keys and self._sealed:
            oldest = self._sealed.popleft()
            self._size -= len(oldest)
            dropped += len(oldest)
        if dropped:
            self.dropped_early += dropped
            if time.monotonic() - self._warned >= 60:
                self._warned = time.monotonic()
                logger.warning(
                    "dedup window full (dedup_max_keys=%d): %d span keys forgotten before "
                    "their retention so far; a retry of those spans would be stored again",
                    self._max_keys,
                    self.dropped_early,
                )

    def expire(self, now_ns: int) -> None:
        """Forget the slices whose newest key was seen ``retention`` before ``now_ns``."""
        cutoff = now_ns - self._retention_ns
        while self._sealed and self._sealed[0].newest_ns < cutoff:
            self._size -= len(self._sealed.popleft())
        if self._open and not self._sealed and self._open_newest < cutoff:
            self._size -= len(self._open)
            self._open = set()

    def _seal(self) -> None:
        self._sealed.append(_Sealed(self._open, self._open_newest))
        self._open = set()


class _Sealed:
    """One past slice of the window: its keys as two ``uint64`` arrays sorted by
    ``(mixed, trace)``, where ``mixed = span * odd ^ trace``.

    Sorting by the span key alone would not do: senders reuse span ids across traces (the
    benchmark's templates do), which makes long runs of equal span keys. Multiplying by an
    odd constant is a bijection of 64-bit words, so ``(mixed, trace)`` still identifies
    ``(span, trace)`` exactly, and ``mixed`` is spread even when span ids repeat.
    """

    __slots__ = ("_mixed", "_traces", "newest_ns")

    def __init__(self, keys: set[int], newest_ns: int) -> None:
        count = len(keys)
        spans = np.fromiter((k >> 64 for k in keys), dtype=np.uint64, count=count)
        traces = np.fromiter((k & _MASK64 for k in keys), dtype=np.uint64, count=count)
        mixed = _mix(spans, traces)
        order = np.lexsort((traces, mixed))
        self._mixed = mixed[order]
        self._traces = traces[order]
        self.newest_ns = newest_ns

    def __len__(self) -> int:
        return len(self._mixed)

    def contains(
        self, spans: npt.NDArray[np.uint64], traces: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.bool_]:
        """For each ``(span, trace)``: is it in this slice."""
        mixed = _mix(spans, traces)
        left = np.searchsorted(self._mixed, mixed, side="left")
        right = np.searchsorted(self._mixed, mixed, side="right")
        found = np.zeros(len(spans), dtype=bool)
        single = (right - left) == 1
        hit = left[single]
        found[single] = self._traces[hit] == traces[single]
        # Equal ``mixed`` values for distinct keys (chance about n / 2**64 a lookup).
        for i in np.flatnonzero((right - left) > 1).tolist():
            found[i] = bool((self._traces[left[i] : right[i]] == traces[i]).any())
        return found


_MIX: Final = np.uint64(0x9E3779B97F4A7C15)  # odd: 2**64 / golden ratio (Fibonacci hashing)


def _mix(spans: npt.NDArray[np.uint64], traces: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    mixed: npt.NDArray[np.uint64] = (spans * _MIX) ^ traces
    return mixed
