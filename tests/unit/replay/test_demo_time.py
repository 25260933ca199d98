"""The demo's span timeline, its run schedule, and how a cut-off recording ends."""

from __future__ import annotations

import time
from typing import Any

import pytest
from click.testing import CliRunner
from loopwatch.cli._commands import cli
from loopwatch.instrumentation import Dimension, StopReason
from loopwatch.replay import demo
from loopwatch.replay.demo_time import SpanTimeline, run_starts
from loopwatch.replay.recorded import recorded_cap, recorded_end
from loopwatch.replay.trajectory import AGENT, Step, ToolCall, Trajectory


def test_runs_are_spread_over_the_window_and_end_before_now() -> None:
    now = 1_800_000_000.0
    starts = run_starts([10.0, 10.0, 10.0, 50_000.0], now=now, window_seconds=86_400)
    assert starts[0] == pytest.approx(now - 0.95 * 86_400 + 0.95 * 10_800)
    assert starts[:3] == sorted(starts[:3])
    assert all(s >= now - 0.95 * 86_400 for s in starts)  # an hour later, still in "24 h"
    assert starts[3] + 50_000 <= now - 60  # a long run is moved earlier, never past now
    with pytest.raises(ValueError, match="must be > 0"):
        run_starts([1.0], now=now, window_seconds=0)


def test_span_times_follow_each_run_start_and_the_recorded_gaps() -> None:
    timeline = SpanTimeline()
    assert timeline.shift(123) == 123 and timeline.shift(None) is None
    timeline.start_run(1_000.0)
    at_start = time.time_ns()
    assert abs(timeline.shift(at_start) - 1_000 * 10**9) < 5 * 10**8
    timeline.advance(40.0)
    later = time.time_ns()
    assert abs(timeline.shift(later) - 1_040 * 10**9) < 5 * 10**8
    # A span that started before the gap keeps its earlier time: the gap is its duration.
    assert timeline.shift(at_start) < 1_001 * 10**9


def _cut(fmt: str, stop: str, turns: int, **metadata: Any) -> Trajectory:
    steps = tuple(
        Step(i, AGENT, "tool", None, (ToolCall("search", {"q": i}, f"page {i}"),), 1.0 + i)
        for i in range(turns)
    )
    return Trajectory(
        source="t", run_id="r", format=fmt, steps=steps, recorded_stop=stop, metadata=metadata
    )


def test_a_recordings_step_cap_is_named_and_ends_the_run_budget_exhausted() -> None:
    cap = recorded_cap(_cut("openhands", "max_iterations", 3, max_iterations=50))
    assert cap is not None and cap.name == "max_iterations=50" and cap.limit == 50
    tau2 = recorded_cap(_cut("tau2", "max_steps", 3))
    assert tau2 is not None and tau2.name == "max_steps" and tau2.unit == "messages"
    assert recorded_cap(_cut("tau2", "too_many_errors", 3)) is None
    assert recorded_end(_cut("react", "halted", 6)) == "budget_exhausted"
    assert recorded_end(_cut("tau2", "too_many_errors", 3)) == "cancelled"

    trajectory = _cut("react", "halted", 6)
    outcome = demo.replay_trajectory(
        trajectory, demo.resolve_policy("default"), run_id="cap", canary=None
    )
    stop = outcome.stop
    assert (stop.reason, stop.dimension) == (StopReason.BUDGET_EXHAUSTED, Dimension.MODEL_TURNS)
    assert stop.evidence.detail == {"framework": "react", "limit": "halted=6"}
    assert (stop.limit, stop.observed) == (6, 6)

    cancelled = demo.replay_trajectory(
        _cut("tau2", "too_many_errors", 2), demo.resolve_policy("default"), run_id="c"
    )
    assert cancelled.stop.reason == StopReason.CANCELLED
    assert cancelled.stop.evidence.detail == {"framework": "tau2", "limit": "too_many_errors"}


def test_the_canary_leaves_equal_results_equal() -> None:
    planted = [demo._with_canary(v, "lw-canary-x1234567") for v in ({"a": 1}, {"a": 1}, "t")]
    assert planted[0] == planted[1] and "lw-canary-x1234567" in planted[2]
    assert demo._with_canary({"a": 1}, None) == {"a": 1}


def test_the_demo_help_names_the_planted_canary() -> None:
    out = CliRunner().invoke(cli, ["demo", "--help"])
    assert demo.DEMO_CANARY in out.output.replace("\n", " ").replace("  ", " ")
    assert "--window-hours" in out.output
