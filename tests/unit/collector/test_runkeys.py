"""The writer's run-key Bloom filter: no false negatives, the false-positive rate of the
formula, bounded-chunk loading, and bad sizes refused."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from loopwatch.collector.store import keys as runkeys
from loopwatch.collector.store.keys import RunKeyFilter

KEYS = st.integers(min_value=0, max_value=2**64 - 1)


@given(st.lists(KEYS, max_size=300), st.integers(min_value=3, max_value=12))
def test_every_added_key_may_be_contained(keys: list[int], bits_log2: int) -> None:
    """The law the writer relies on: a key added is never reported absent, even in a
    filter far too small for its keys."""
    f = RunKeyFilter(bits_log2=bits_log2)
    f.add(keys)
    assert f.may_contain(keys) == [True] * len(keys)
    assert f.added == len(keys)


def test_false_positive_rate_matches_the_formula() -> None:
    # Bloom (1970): p = (1 - exp(-k n / m)) ** k; here about 6.1e-4.
    rng = random.Random(7)
    bits_log2, hashes, n = 16, 7, 4000
    f = RunKeyFilter(bits_log2=bits_log2, hashes=hashes)
    f.add(rng.getrandbits(64) for _ in range(n))
    others = [rng.getrandbits(64) for _ in range(200_000)]
    rate = sum(f.may_contain(others)) / len(others)
    expected = (1 - math.exp(-hashes * n / 2**bits_log2)) ** hashes
    assert expected / 2 < rate < expected * 2


def test_an_empty_filter_contains_nothing() -> None:
    f = RunKeyFilter(bits_log2=10)
    assert f.may_contain([0, 1, 2**64 - 1]) == [False, False, False]
    assert f.may_contain([]) == []


def test_arrays_longer_than_one_chunk_are_added_whole() -> None:
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**64 - 1, size=runkeys._CHUNK_KEYS + 17, dtype=np.uint64)
    f = RunKeyFilter(bits_log2=24)
    f.add_array(keys)
    assert all(f.may_contain([int(k) for k in keys[-100:]]))
    assert all(f.may_contain([int(k) for k in keys[:100]]))
    assert f.added == len(keys)


@pytest.mark.parametrize(("bits_log2", "hashes"), [(2, 7), (41, 7), (16, 0), (16, 33)])
def test_bad_sizes_are_refused(bits_log2: int, hashes: int) -> None:
    with pytest.raises(ValueError, match="must be in"):
        RunKeyFilter(bits_log2=bits_log2, hashes=hashes)
