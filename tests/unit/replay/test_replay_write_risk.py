"""``loopwatch replay`` judges tool risk as the guard does (``Policy.tool``): a recorded run
whose tool's name marks it a write is stopped at the second identical write, whatever the
first returned (issue 25); a policy can turn the inference off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from loopwatch.instrumentation import Policy, ToolPolicy
from loopwatch.replay.engine import default_policy, load_policy_spec, replay_run
from loopwatch.replay.trajectory import SUCCESS, Step, ToolCall, Trajectory


def _run(first: dict[str, Any], second: dict[str, Any], tool: str = "create_ticket") -> Trajectory:
    steps = [
        {"actor": "user", "decision": "message", "text": "My printer is on fire."},
        {
            "actor": "agent",
            "decision": "tool",
            "tool_calls": (ToolCall(tool, first, '{"id": "T-1", "status": "open"}'),),
        },
        {"actor": "user", "decision": "message", "text": "Did it work?"},
        {
            "actor": "agent",
            "decision": "tool",
            "tool_calls": (ToolCall(tool, second, '{"id": "T-2", "status": "open"}'),),
        },
        {"actor": "agent", "decision": "final", "text": "Done: T-1 and T-2."},
    ]
    return Trajectory(
        source="mem.json",
        run_id="r1",
        format="synthetic",
        steps=tuple(Step(index=i, **s) for i, s in enumerate(steps)),
        recorded_outcome=SUCCESS,
    )


def test_a_recorded_second_identical_write_is_stopped() -> None:
    r = replay_run(_run({"title": "fire"}, {"title": "fire"}), default_policy())
    assert r.stop_reason == "repeated_action" and r.stop_step == 2
    assert r.evidence is not None and r.evidence["detector"] == "duplicate_intent"
    assert r.evidence["tool"] == "create_ticket" and r.evidence["step_indices"] == [1, 2]
    assert r.evidence["detail"]["risk_source"] == "inferred"
    assert r.calls_saved == 1 and r.false_stop  # recorded as a success: replay says so


def test_a_write_with_other_arguments_replays_to_its_end() -> None:
    r = replay_run(_run({"title": "fire"}, {"title": "smoke"}), default_policy())
    assert r.stop_reason is None


def test_a_declared_read_with_a_verb_like_name_is_not_stopped() -> None:
    declared = Policy.build(tools=(ToolPolicy("create_ticket", risk="read"),))
    assert replay_run(_run({"title": "fire"}, {"title": "fire"}), declared).stop_reason is None


def test_a_policy_file_can_turn_inference_off(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('[profiles.no-infer]\nversion = "1"\ninfer_write_risk = false\n')
    (named,) = load_policy_spec(str(f))
    assert named.policy.infer_write_risk is False
    assert replay_run(_run({"title": "fire"}, {"title": "fire"}), named).stop_reason is None


def test_the_cli_stops_a_duplicate_write_in_a_chat_log(tmp_path: Path) -> None:
    def call(call_id: str) -> list[dict[str, Any]]:
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "sendEmail", "arguments": '{"to": "a@x"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": "sendEmail",
                "content": json.dumps({"message_id": call_id}),
            },
        ]

    record = {
        "task_id": 1,
        "trial": 0,
        "reward": 1.0,
        "info": {},
        "traj": [
            {"role": "system", "content": "# Support Agent Policy"},
            {"role": "user", "content": "Email Ann."},
            *call("c1"),
            *call("c2"),
            {"role": "assistant", "content": "Sent."},
        ],
    }
    path = tmp_path / "handmade-gpt-4o-retail.json"
    path.write_text(json.dumps([record]))
    out = subprocess.run(
        [sys.executable, "-m", "loopwatch.cli", "replay", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (row,) = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert row["stop_reason"] == "repeated_action"
    assert row["evidence"]["detector"] == "duplicate_intent"
    assert row["evidence"]["detail"]["risk_source"] == "inferred"
