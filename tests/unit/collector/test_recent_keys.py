"""The dedup window (:class:`RecentKeys`): exact membership, retention, the key cap, and
the memory a key costs (the figure :data:`DEDUP_BYTES_PER_KEY` sizes the window by)."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from loopwatch.collector.store.keys import DEDUP_BYTES_PER_KEY, RecentKeys

NS = 1_000_000_000
U64 = st.integers(min_value=0, max_value=2**64 - 1)


def _key(span: int, trace: int) -> int:
    return (span << 64) | trace


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.sets(st.tuples(U64, U64), max_size=40), min_size=1, max_size=12),
    probes=st.sets(st.tuples(U64, U64), max_size=40),
)
def test_window_answers_like_a_set(
    batches: list[set[tuple[int, int]]], probes: set[tuple[int, int]]
) -> None:
    """Proves the window (open and sealed slices alike) reports exactly the keys added,
    whatever the keys, while nothing is expired or dropped."""
    window = RecentKeys(retention_ns=3_600 * NS, max_keys=10_000)
    added: set[int] = set()
    for i, pairs in enumerate(batches):
        keys = {_key(s, t) for s, t in pairs}
        fresh = window.unseen(keys)
        assert fresh == keys - added
        window.add(fresh, i * 300 * NS)  # a new slice every batch: most are sealed
        added |= fresh
    queried = {_key(s, t) for s, t in probes} | set(list(added)[:20])
    assert window.unseen(queried) == queried - added
    assert len(window) == len(added)


def test_span_ids_repeated_across_traces_are_told_apart() -> None:
    """Proves keys that share a span id (senders reuse span ids across traces; the bench
    templates do) or a trace id are still exact in a sealed slice."""
    window = RecentKeys(retention_ns=3_600 * NS, max_keys=1_000_000)
    stored = {_key(span, trace) for span in range(1, 65) for trace in range(1, 200, 2)}
    window.add(stored, 0)
    window.add({_key(7, 7)}, 3_600 * NS // 16 + 1)  # seals the first slice
    other = {_key(span, trace) for span in range(1, 65) for trace in range(2, 200, 2)}
    assert window.unseen(stored | other) == other


def test_expire_forgets_slices_after_retention_and_the_open_slice_last() -> None:
    window = RecentKeys(retention_ns=160 * NS, max_keys=1_000)
    window.add({_key(1, 1)}, 0)
    window.add({_key(2, 2)}, 20 * NS)
    window.expire(170 * NS)
    assert window.unseen({_key(1, 1), _key(2, 2)}) == {_key(1, 1)}
    window.expire(181 * NS)
    assert window.unseen({_key(2, 2)}) == {_key(2, 2)}
    assert len(window) == 0


def test_key_cap_drops_the_oldest_sealed_slices() -> None:
    window = RecentKeys(retention_ns=3_600 * NS, max_keys=32)
    for i in range(8):
        window.add({_key(i, t) for t in range(8)}, i * 300 * NS)
    assert len(window) <= 32 + 8  # the open slice is never dropped
    assert window.dropped_early > 0
    assert window.unseen({_key(7, 0)}) == set()
    assert window.unseen({_key(0, 0)}) == {_key(0, 0)}


def test_memory_per_key_is_within_the_documented_figure() -> None:
    """Proves a full window costs at most :data:`DEDUP_BYTES_PER_KEY` bytes a key
    (measured with tracemalloc over 400,000 random keys in 16 slices)."""
    rng = random.Random(3)
    keys_total = 400_000
    window = RecentKeys(retention_ns=3_600 * NS, max_keys=keys_total)
    per_slice = keys_total // 16
    batches = [
        {_key(rng.getrandbits(64), rng.getrandbits(64)) for _ in range(per_slice)}
        for _ in range(16)
    ]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, keys in enumerate(batches):
            window.add(keys, i * 225 * NS)
        del keys
        batches.clear()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_key = used / len(window)
    assert len(window) == keys_total
    assert per_key <= DEDUP_BYTES_PER_KEY, per_key
    assert np.isfinite(per_key)
