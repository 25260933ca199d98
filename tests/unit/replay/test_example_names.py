"""The shipped examples' file names agree with ``loopwatch replay replay/examples``
under the default policy (issue 28), and a job poll whose status advances is no repeat."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from loopwatch.replay.engine import default_policy, replay_run
from loopwatch.replay.shipped_examples import EXAMPLES_DIR
from loopwatch.replay.trajectory import AGENT, Step, ToolCall, Trajectory

_REASON = re.compile(
    r"^\d\d-(completed|final_unverified|refused|budget_exhausted|deadline_exceeded|"
    r"repeated_action|action_cycle|repeated_decision|no_progress|cancelled|error)\b"
)


def test_every_example_ends_as_its_name_says_under_the_readme_replay_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loopwatch.cli", "replay", str(EXAMPLES_DIR), "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    results = [json.loads(line) for line in out.stdout.splitlines()]
    files = sorted(p.name for p in EXAMPLES_DIR.glob("*.json"))
    assert len(results) == len(files) == 16
    seen = {}
    for result in results:
        name = Path(result["source"]).name
        match = _REASON.match(name)
        assert match, name
        seen[name] = result["end_reason"]
        assert result["end_reason"] == match.group(1), (name, result)
        if result["stop_reason"] is not None:  # a policy stop is the name's reason too
            assert result["stop_reason"] == match.group(1)
    assert sorted(seen) == files
    # every stop reason has its example
    assert {_REASON.match(n).group(1) for n in files} == {  # type: ignore[union-attr]
        "completed",
        "final_unverified",
        "refused",
        "budget_exhausted",
        "deadline_exceeded",
        "repeated_action",
        "action_cycle",
        "repeated_decision",
        "no_progress",
        "cancelled",
        "error",
    }


def _polls(statuses: list[str]) -> Trajectory:
    steps = []
    for i, status in enumerate(statuses, start=1):
        observation = json.dumps({"status": status, "checked_at": i})
        call = ToolCall("poll_job", {"job": "j-17"}, observation, started_at=100.0 + i)
        steps.append(Step(i, AGENT, "tool", None, (call,), 100.0 + i))
    steps.append(Step(len(steps) + 1, AGENT, "final", "done", (), 100.0 + len(steps) + 1))
    return Trajectory(source="t", run_id="poll", format="loopwatch", steps=tuple(steps))


def test_a_poll_whose_status_advances_is_not_a_repeat_and_an_unchanged_one_is() -> None:
    advancing = replay_run(_polls(["queued", "running", "done"]), default_policy())
    assert advancing.stop_reason is None and advancing.end_reason == "completed"
    # Only the volatile checked_at changes: the third identical poll is the repeat.
    stuck = replay_run(_polls(["pending", "pending", "done"]), default_policy())
    assert (stuck.stop_reason, stuck.stop_step) == ("repeated_action", 3)
