"""Replay under a loop-response ladder (issue 26, point 4): the rungs reached on recorded
actions, per run and policy, in the results, the JSON output and the table summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from loopwatch.cli._commands import cli
from loopwatch.cli._replay import LADDER_CAVEAT
from loopwatch.instrumentation import Policy, ToolPolicy
from loopwatch.replay.engine import replay, replay_run, summarize

from .test_engine import agent, call, finish, lookup, policy, run

RUNAWAY = run(*lookup(6))  # six identical calls with the same result, never ending


def ladder(rungs: list[str], **limits: Any) -> Policy:
    return policy("ladder", repeat_limit=3, loop_response=rungs, **limits)


def rungs_of(result: Any) -> list[tuple[str, int, str, str, int]]:
    return [(x.response, x.step, x.tool, x.detector, x.rung) for x in result.responses]


def test_nudge_stop_nudges_the_third_identical_call_and_stops_the_fourth() -> None:
    r = replay_run(RUNAWAY, ladder(["nudge", "stop"]))
    assert rungs_of(r) == [
        ("nudge", 3, "get_details", "repeated_action", 1),
        ("stop", 4, "get_details", "repeated_action", 2),
    ]
    assert (r.stop_reason, r.stop_step) == ("repeated_action", 4)
    # The nudged call ran in the recording: its result was fed, so the stop counts four.
    assert r.evidence is not None
    assert r.evidence["repetitions"] == 4
    assert r.evidence["detail"]["after_nudges"] == 1
    assert r.calls_saved == 3  # calls 4, 5 and 6


def test_warn_stop_warns_then_stops() -> None:
    r = replay_run(RUNAWAY, ladder(["warn", "stop"]))
    assert rungs_of(r) == [
        ("warn", 3, "get_details", "repeated_action", 1),
        ("stop", 4, "get_details", "repeated_action", 2),
    ]
    assert (r.stop_reason, r.stop_step) == ("repeated_action", 4)
    assert "after_nudges" not in (r.evidence or {}).get("detail", {})


def test_the_last_rung_repeats_and_a_nudge_only_ladder_never_stops_a_loop() -> None:
    r = replay_run(RUNAWAY, ladder(["nudge"]))
    assert [(x.response, x.step, x.rung) for x in r.responses or ()] == [
        ("nudge", 3, 1),
        ("nudge", 4, 1),
        ("nudge", 5, 1),
        ("nudge", 6, 1),
    ]
    assert r.stop_reason is None


def test_a_changed_result_after_a_nudge_restarts_the_count() -> None:
    """The recorded result of the nudged call is fed: a new one is progress, so the
    next identical call is no repeat (the recorded model saw that result, not a nudge)."""
    same = '{"status": "pending"}'
    steps = [agent(call("poll", {"id": 1}, same)) for _ in range(3)]
    steps += [agent(call("poll", {"id": 1}, '{"status": "done"}')), finish()]
    steps.insert(3, agent(call("poll", {"id": 1}, same)))
    r = replay_run(run(*steps), ladder(["nudge", "stop"]))
    assert [(x.response, x.step) for x in r.responses or ()] == [("nudge", 3), ("stop", 4)]
    changed = [agent(call("poll", {"id": 1}, same)) for _ in range(2)]
    changed += [agent(call("poll", {"id": 1}, '{"status": "running"}'))]
    changed += [agent(call("poll", {"id": 1}, '{"status": "done"}')), finish()]
    r = replay_run(run(*changed), ladder(["nudge", "stop"]))
    assert [(x.response, x.step) for x in r.responses or ()] == [("nudge", 3)]
    assert r.stop_reason is None


def test_the_default_ladder_reports_no_rungs_and_the_same_stop() -> None:
    plain = replay_run(RUNAWAY, policy(repeat_limit=3))
    explicit = replay_run(RUNAWAY, policy(repeat_limit=3, loop_response=["stop"]))
    for r in (plain, explicit):
        assert r.responses is None
        assert "ladder_responses" not in r.to_dict()
        assert (r.stop_reason, r.stop_step, r.calls_saved) == ("repeated_action", 3, 4)
    assert plain.to_dict() == explicit.to_dict()
    summary = summarize([plain])[0]
    assert not summary.ladder and "nudges" not in summary.to_dict()


def test_totals_per_policy() -> None:
    runs = [RUNAWAY, run(*lookup(2), finish(), run_id="ok", outcome="success")]
    results = replay(runs, [ladder(["warn", "nudge", "stop"]), policy("plain", repeat_limit=3)])
    by = {s.policy: s for s in summarize(results)}
    s = by["ladder"]
    assert (s.ladder, s.warns, s.nudges, s.ladder_stops, s.stopped) == (True, 1, 1, 1, 1)
    assert s.to_dict()["nudges"] == 1
    assert not by["plain"].ladder


# ------------------------------------------------------------------------ CLI


def _chat_file(tmp_path: Path) -> Path:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "status?"}]
    for i in range(6):
        fn = {"name": "get_details", "arguments": json.dumps({"id": "L1"})}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{i}", "type": "function", "function": fn}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "Active"})
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps({"id": "looping", "reward": 0.0, "messages": messages}) + "\n")
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    policy_file = tmp_path / "ladder.toml"
    policy_file.write_text(
        "[profiles.nudging]\n"
        'version = "1"\n'
        "repeat_limit = 3\n"
        'loop_response = ["nudge", "stop"]\n'
        "[profiles.stopping]\n"
        'version = "1"\n'
        "repeat_limit = 3\n",
        encoding="utf-8",
    )
    return _chat_file(tmp_path), policy_file


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["replay", *args], catch_exceptions=False)


def test_cli_json_carries_the_rungs(files: tuple[Path, Path]) -> None:
    runs, policy_file = files
    result = invoke(str(runs), "--policy", str(policy_file), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {row["policy"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["nudging"]["ladder_responses"] == [
        {"step": 3, "tool": "get_details", "detector": "repeated_action", "rung": 1,
         "response": "nudge"},
        {"step": 4, "tool": "get_details", "detector": "repeated_action", "rung": 2,
         "response": "stop"},
    ]  # fmt: skip
    assert (rows["nudging"]["stop_reason"], rows["nudging"]["stop_step"]) == (
        "repeated_action",
        4,
    )
    assert "ladder_responses" not in rows["stopping"]
    assert rows["stopping"]["stop_step"] == 3


def test_cli_table_carries_the_rungs_totals_and_the_caveat(files: tuple[Path, Path]) -> None:
    runs, policy_file = files
    result = invoke(str(runs), "--policy", str(policy_file))
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert LADDER_CAVEAT in text
    assert "Recorded runs cannot show how a model would react" in text
    lines = text.splitlines()
    assert lines[0].split() == ["policy", "nudging", "stopping"]
    assert next(ln for ln in lines if ln.startswith("ladder nudges")).split() == [
        "ladder",
        "nudges",
        "1",
    ]
    assert next(ln for ln in lines if ln.startswith("ladder stops")).split()[2] == "1"
    assert (
        "nudge@3 get_details repeated_action rung 1, stop@4 get_details repeated_action rung 2"
        in text
    )


def test_cli_table_without_a_ladder_has_no_ladder_section(files: tuple[Path, Path]) -> None:
    runs, policy_file = files
    result = invoke(str(runs), "--policy", f"{policy_file}:stopping")
    assert result.exit_code == 0, result.output
    assert "ladder" not in result.stdout.lower()
    assert LADDER_CAVEAT not in result.stdout


@pytest.mark.parametrize("rungs", [["stop"], ["nudge", "stop"], ["warn", "stop"]])
def test_stops_outside_the_ladder_are_the_same_under_any_ladder(rungs: list[str]) -> None:
    """A ladder changes loop detections only: the retry rule on an unknown tool called
    again, a budget and a cycle stop where a ["stop"] policy stops them."""
    known = [ToolPolicy("get_details")]
    unknown = run(*[agent(call("nope", {"x": 1}, "Error: no such tool", error=True))] * 3)
    r = replay_run(unknown, ladder(rungs, strict_tools=True, tools=known))
    assert (r.stop_reason, r.stop_dimension, r.stop_step) == (
        "budget_exhausted",
        "action_retries",
        2,
    )
    assert r.evidence is not None and r.evidence["detector"] == "retry_rule"
    turns = replay_run(run(*lookup(2), *lookup(2)), ladder(rungs, max_model_turns=2))
    assert (turns.stop_reason, turns.stop_step) == ("budget_exhausted", 2)
    a = call("get_a", {"id": 1}, "A")
    b = call("get_b", {"id": 1}, "B")
    cycle = replay_run(run(*[agent(a), agent(b)] * 4), ladder(rungs, cycle_repetitions=2))
    plain = replay_run(run(*[agent(a), agent(b)] * 4), policy(cycle_repetitions=2))
    assert (cycle.stop_reason, cycle.stop_step) == (plain.stop_reason, plain.stop_step)
    assert cycle.stop_reason == "action_cycle"
