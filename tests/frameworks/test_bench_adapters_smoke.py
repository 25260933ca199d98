"""The adapter overhead benchmark (tests/bench/bench_adapters.py) in smoke mode, here so
that scripts/frameworks.sh, which runs tests/frameworks only and in the venv where
pydantic-ai is installed, runs it in CI. No timing is asserted here (a shared CI machine
makes per-step differences noisy); the benchmark's own test asserts a gross regression
when run with LOOPWATCH_BENCH=smoke."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic_ai")

from tests.bench import bench_adapters


def test_bench_adapters_runs_in_smoke_mode() -> None:
    figures = bench_adapters.measure(steps=5, rounds=3)
    print("\n" + bench_adapters.report(figures))
    assert figures["outcome"] == "completed"
    for name in ("work", "loop", "agent", "manual", "scope", "adapter"):
        assert figures[f"{name}_us"] > 0, name
    assert figures["ratio"] == figures["ratio"]  # a number, not NaN
