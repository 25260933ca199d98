"""Hostile input for ``loopwatch replay``, second review: each test keeps, in small
hand-made form, an input that gave a wrong result, a crash or a runaway in review.

Inputs are built here (a few lines of JSON each) rather than kept as data files, so
each test shows the shape that broke and nothing resembles a corpus file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopwatch.replay.engine import default_policy, replay
from loopwatch.replay.importers import read_file


def _tau2(*simulations: dict[str, Any]) -> str:
    return json.dumps({"info": {}, "tasks": [], "simulations": list(simulations)})


def _simulation(messages: list[dict[str, Any]], task: str = "t") -> dict[str, Any]:
    return {
        "id": f"sim-{task}",
        "task_id": task,
        "trial": 0,
        "termination_reason": "user_stop",
        "reward_info": {"reward": 1.0},
        "messages": messages,
    }


def _poll(results: list[str], ids: list[str]) -> list[dict[str, Any]]:
    """A user asks; the agent polls ``job_status`` once per result; then answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "wait for the job"}]
    for call_id, result in zip(ids, results, strict=True):
        call = {"id": call_id, "name": "job_status", "arguments": {"job": "J1"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "id": call_id, "content": result, "error": False})
    messages.append({"role": "assistant", "content": "The job is done."})
    return messages


# --------------------------------------------------------------- tool-call ids


def test_tau2_reused_call_ids_pair_each_call_with_the_result_that_follows(
    tmp_path: Path,
) -> None:
    # Was: results keyed by id only, so every `call_1` got the last result ("done"):
    # a poll that advanced read as one unchanged result, a false repeated_action.
    results = ['{"state": "running", "pct": 0}', '{"state": "running", "pct": 50}', "done"]
    path = tmp_path / "poll.json"
    path.write_text(_tau2(_simulation(_poll(results, ["call_1"] * 3))), encoding="utf-8")
    loaded = read_file(path)
    assert not loaded.problems
    [run] = loaded.trajectories
    assert [c.observation for s in run.agent_steps for c in s.tool_calls] == results
    [result] = replay([run], [default_policy()])
    assert result.stop_reason is None


def test_tau2_second_result_for_one_call_is_a_problem(tmp_path: Path) -> None:
    messages = _poll(["a"], ["c1"])
    messages.insert(3, {"role": "tool", "id": "c1", "content": "again", "error": False})
    path = tmp_path / "twice.json"
    path.write_text(
        _tau2(_simulation(messages), _simulation(_poll(["x"], ["c1"]), "ok")), encoding="utf-8"
    )
    loaded = read_file(path)
    assert [t.run_id for t in loaded.trajectories] == ["task=ok/trial=0"]
    [problem] = loaded.problems
    assert (problem.record, problem.message) == (
        "simulations[0]",
        "messages[3]: tool result id 'c1' matches no earlier call awaiting a result",
    )
