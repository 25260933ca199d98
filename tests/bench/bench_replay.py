"""Time of ``loopwatch replay`` over the recorded corpus through two policies.

Run: ``python -m tests.bench.bench_replay [--corpus PATH] [--repeat N]``. Prints the
import time, the replay time (two policies: the shipped default and the seed's
``investigate-readonly``), runs, agent steps and microseconds per (step, policy).

Target (issue 5): the whole corpus through two policies in under 10 s, import included.
``test_bench_replay_smoke`` runs it when LOOPWATCH_BENCH is set: the tau2 folder only
under ``smoke``, the whole corpus under ``full``, where the target is asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from loopwatch.replay.engine import default_policy, load_policy_spec, replay, summarize
from loopwatch.replay.importers import load_paths

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
TARGET_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Figures:
    runs: int
    agent_steps: int
    policies: int
    load_seconds: float
    replay_seconds: float

    @property
    def total_seconds(self) -> float:
        return self.load_seconds + self.replay_seconds

    def print(self) -> None:
        per = self.replay_seconds / max(self.agent_steps * self.policies, 1) * 1e6
        print(
            f"replay: {self.runs} runs, {self.agent_steps} agent steps, {self.policies} policies: "
            f"import {self.load_seconds:.2f} s, replay {self.replay_seconds:.2f} s, "
            f"total {self.total_seconds:.2f} s (target < {TARGET_SECONDS:.0f} s), "
            f"{per:.1f} us per step and policy"
        )


def measure(paths: list[Path], repeat: int = 1) -> Figures:
    """Best of ``repeat`` runs of import + replay through two policies."""
    policies = [default_policy(), *load_policy_spec("seed:investigate-readonly")]
    best: Figures | None = None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        loaded = load_paths(paths)
        t1 = time.perf_counter()
        results = replay(loaded.trajectories, policies)
        t2 = time.perf_counter()
        assert len(results) == 2 * len(loaded.trajectories)
        assert summarize(results)[0].runs == len(loaded.trajectories)
        steps = sum(len(t.agent_steps) for t in loaded.trajectories)
        figures = Figures(len(loaded.trajectories), steps, len(policies), t1 - t0, t2 - t1)
        if best is None or figures.total_seconds < best.total_seconds:
            best = figures
    assert best is not None
    return best


def test_bench_replay_smoke() -> None:
    mode = os.environ.get("LOOPWATCH_BENCH")
    if not mode:
        pytest.skip("benchmarks run with LOOPWATCH_BENCH=smoke|full")
    if not CORPUS.is_dir():
        pytest.skip(f"corpus folder absent: {CORPUS}")
    full = mode == "full"
    figures = measure([CORPUS] if full else [CORPUS / "tau2-bench"], repeat=3 if full else 1)
    figures.print()
    assert figures.runs > 0
    if full:
        assert figures.total_seconds < TARGET_SECONDS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    measure([args.corpus], repeat=args.repeat).print()


if __name__ == "__main__":
    main()
