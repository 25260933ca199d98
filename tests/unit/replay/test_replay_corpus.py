"""The shipped default replay policy over the recorded corpus (``../shared/corpus``).

Targets (issue 5): every run with 10 or more identical consecutive agent calls is stopped
as ``repeated_action`` within the repeat limit of its onset; at most 2 % false stops on
successful runs; the loops the corpus READMEs name are stopped. Skipped without the
corpus.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from loopwatch.replay.engine import (
    NamedPolicy,
    ReplayResult,
    default_policy,
    load_policy_spec,
    replay,
    summarize,
)
from loopwatch.replay.importers import load_paths
from loopwatch.replay.trajectory import Trajectory

pytestmark = pytest.mark.corpus

# Stops that end a loop of identical calls: the repeat detector, or, when the repeated
# call failed, the guard's retry rule (a failed call repeated as-is is refused before the
# repeat detector is asked).
_REPEAT_STOPS = {("repeated_action", None), ("budget_exhausted", "action_retries")}


@pytest.fixture(scope="module")
def default() -> NamedPolicy:
    return default_policy()


@pytest.fixture(scope="module")
def trajectories(corpus_dir: Path) -> list[Trajectory]:
    loaded = load_paths([corpus_dir])
    assert loaded.trajectories
    return loaded.trajectories


@pytest.fixture(scope="module")
def results(trajectories: list[Trajectory], default: NamedPolicy) -> list[ReplayResult]:
    return replay(trajectories, [default])


def identical_call_runs(t: Trajectory, at_least: int) -> list[int]:
    """Onset steps of runs of ``at_least`` or more identical consecutive agent calls
    (same tool, same canonical arguments, whatever came back; an agent step without
    tool calls breaks a run)."""
    onsets: list[int] = []
    previous: tuple[str, str] | None = None
    length = onset = 0
    for number, step in enumerate(t.agent_steps, start=1):
        calls = [(c.name, c.arguments_json()) for c in step.tool_calls] or [None]
        for c in calls:
            if c is not None and c == previous:
                length += 1
            else:
                if length >= at_least:
                    onsets.append(onset)
                previous, length, onset = c, (1 if c is not None else 0), number
    if length >= at_least:
        onsets.append(onset)
    return onsets


def by_id(results: list[ReplayResult], source_part: str) -> dict[str, ReplayResult]:
    return {r.run_id: r for r in results if source_part in r.source}


def test_long_identical_loops_stop_as_repeated_action_within_the_limit(
    results: list[ReplayResult], default: NamedPolicy
) -> None:
    limit = default.policy.repeat_limit
    long_loops = [
        r
        for r in results
        if r.loop is not None and r.loop.kind == "repeat" and r.loop.actions >= 10
    ]
    # tau2 README: three max_steps runs repeating get_details_by_id 95, 67 and 74 times.
    assert len(long_loops) == 3
    for r in long_loops:
        assert r.loop is not None
        assert r.stop_reason == "repeated_action", r.run_id
        assert r.stop_step is not None and r.loop_onset_step == r.loop.onset_step
        assert 0 <= r.stop_step - r.loop.onset_step <= limit, r.run_id
        assert r.recorded_stop == "max_steps"
        assert r.calls_saved >= r.loop.actions - limit


def test_every_run_with_ten_identical_calls_is_stopped_within_the_limit(
    trajectories: list[Trajectory], results: list[ReplayResult], default: NamedPolicy
) -> None:
    """The target, judged on call identity alone (observations not compared)."""
    by_key = {(r.source, r.run_id): r for r in results}
    checked = 0
    for t in trajectories:
        onsets = identical_call_runs(t, 10)
        if not onsets:
            continue
        checked += 1
        r = by_key[(t.source, t.run_id)]
        assert r.stop_reason == "repeated_action", t.run_id
        assert r.stop_step is not None
        assert r.stop_step - onsets[0] <= default.policy.repeat_limit, t.run_id
    assert checked == 3


def test_tau2_max_steps_runs_are_the_loops(results: list[ReplayResult]) -> None:
    tau2 = [r for r in results if r.format == "tau2" and r.recorded_stop == "max_steps"]
    assert len(tau2) == 3
    assert {r.stop_reason for r in tau2} == {"repeated_action"}
    assert all(r.evidence and r.evidence["tool"] == "get_details_by_id" for r in tau2)


@pytest.mark.parametrize("question", ["q100", "q102"])
def test_react_search_loops_are_stopped(
    results: list[ReplayResult], default: NamedPolicy, question: str
) -> None:
    runs = by_id(results, "base_react_thought_log")
    r = runs[f"trial1|halted|{question}"]
    assert r.loop is not None and r.loop.tool == "Search"
    assert (r.stop_reason, r.stop_dimension) in _REPEAT_STOPS
    assert r.stop_step is not None
    assert r.loop.onset_step <= r.stop_step <= r.loop.onset_step + default.policy.repeat_limit


def test_toolbench_g3_13_looping_paths_are_stopped(
    results: list[ReplayResult], default: NamedPolicy
) -> None:
    paths = [r for r in results if "G3_answer__13" in r.source]
    looping = [r for r in paths if r.loop is not None]
    # README: 7 paths call the streaming search with identical arguments up to 4 times.
    assert len(looping) == 7
    for r in looping:
        assert r.loop is not None
        assert (r.stop_reason, r.stop_dimension) in _REPEAT_STOPS, r.run_id
        assert r.stop_step is not None
        assert r.stop_step - r.loop.onset_step <= default.policy.repeat_limit
    assert sum(r.stop_reason == "repeated_action" for r in looping) >= 6


def test_false_stops_at_most_two_percent(results: list[ReplayResult]) -> None:
    (summary,) = summarize(results)
    assert summary.successful_runs >= 400
    assert summary.false_stop_rate is not None and summary.false_stop_rate <= 0.02
    # The near misses the tau2 README names (3-7 identical lookups, reward 1) re-read the
    # line after each user turn: a new count each time, so no stop. One ToolBench path
    # (the cocktail list 3 times in a row) is the only repeat false stop.
    repeat_false = [r for r in results if r.false_stop and r.stop_reason == "repeated_action"]
    assert {r.format for r in repeat_false} <= {"toolbench"}
    assert len(repeat_false) <= 1


def test_every_recorded_loop_is_caught(results: list[ReplayResult]) -> None:
    (summary,) = summarize(results)
    assert summary.loops >= 30
    assert summary.loops_caught == summary.loops


def test_two_policies_side_by_side(corpus_dir: Path, default: NamedPolicy) -> None:
    loaded = load_paths([corpus_dir / "tau2-bench"])
    seed = load_policy_spec("seed:investigate-readonly")
    results = replay(loaded.trajectories, [default, *seed])
    a, b = summarize(results)
    assert (a.policy, b.policy) == ("replay-default", "investigate-readonly")
    # The seed profile's 8-turn ceiling stops most tau2 conversations: many false stops.
    assert b.false_stops > a.false_stops
    assert a.runs == b.runs == len(loaded.trajectories)
