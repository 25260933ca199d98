"""Replay engine on synthetic trajectories built from the data model (no corpus needed)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from typing import Any

import pytest
from loopwatch.instrumentation import Policy
from loopwatch.instrumentation.errors import PolicyError
from loopwatch.instrumentation.failures import FailureClass
from loopwatch.replay.engine import (
    CSV_COLUMNS,
    DEFAULT_POLICY_FILE,
    NamedPolicy,
    ReplayResult,
    classify_recorded_error,
    compare,
    default_policy,
    find_recorded_loop,
    load_policy_spec,
    replay,
    replay_run,
    summarize,
)
from loopwatch.replay.importers.stored import trajectory_from_stored
from loopwatch.replay.trajectory import FAILURE, SUCCESS, Step, ToolCall, Trajectory

# Every limit out of the way except the ones a test sets.
_OPEN: dict[str, Any] = {
    "max_model_turns": 10_000,
    "max_tool_attempts": 10_000,
    "max_tool_successes": 10_000,
    "max_elapsed_seconds": 1e6,
    "no_progress_patience": 10_000,
    "repeated_decision_limit": 10_000,
    "cycle_repetitions": 10_000,
    "repeat_limit": 10_000,
}


def policy(name: str = "p", **limits: Any) -> Policy:
    return Policy.build(name, **{**_OPEN, **limits})


def call(name: str, args: Any = None, obs: str | None = "ok", *, error: bool = False) -> ToolCall:
    return ToolCall(name, {} if args is None else args, obs, error)


def agent(
    *calls: ToolCall, text: str | None = None, decision: str | None = None, ts: float | None = None
) -> dict[str, Any]:
    kind = decision or ("tool" if calls else "message")
    return {
        "actor": "agent",
        "decision": kind,
        "tool_calls": tuple(calls),
        "text": text,
        "timestamp": ts,
    }


def user(text: str, *calls: ToolCall) -> dict[str, Any]:
    return {"actor": "user", "decision": "message", "tool_calls": tuple(calls), "text": text}


def run(
    *steps: dict[str, Any], outcome: str = FAILURE, run_id: str = "r1", source: str = "mem.json"
) -> Trajectory:
    return Trajectory(
        source=source,
        run_id=run_id,
        format="synthetic",
        steps=tuple(Step(index=i, **s) for i, s in enumerate(steps)),
        recorded_outcome=outcome,  # type: ignore[arg-type]
    )


def lookup(n: int) -> list[dict[str, Any]]:
    return [
        agent(call("get_details", {"id": "L1"}, '{"line": "L1", "status": "Active"}'))
        for _ in range(n)
    ]


def finish() -> dict[str, Any]:
    return agent(text="done", decision="final")


# ------------------------------------------------------------------- stops


@pytest.mark.parametrize("limit", [2, 3, 5])
def test_ten_identical_calls_stop_at_the_repeat_limit(limit: int) -> None:
    r = replay_run(run(*lookup(10)), policy(repeat_limit=limit))
    assert r.stop_reason == "repeated_action"
    assert r.stop_step == limit
    assert r.loop_onset_step == 1
    assert r.steps_total == 10
    assert r.calls_total == 10
    # The refused call and every later one are saved.
    assert r.calls_saved == 10 - limit + 1
    assert r.model_calls_saved == 10 - limit
    assert r.evidence is not None
    assert r.evidence["detector"] == "repeated_action"
    assert r.evidence["step_indices"] == list(range(1, limit + 1))
    assert r.loop is not None and (r.loop.kind, r.loop.onset_step, r.loop.actions) == (
        "repeat",
        1,
        10,
    )


def test_onset_is_the_first_step_of_the_identical_run() -> None:
    steps = [
        agent(call("search", {"q": "a"}, "x")),
        agent(text="let me look again"),
        agent(call("search", {"q": "b"}, "y")),
        *lookup(6),
    ]
    r = replay_run(run(*steps), policy(repeat_limit=4))
    assert (r.stop_reason, r.stop_step, r.loop_onset_step) == ("repeated_action", 7, 4)
    assert r.loop is not None and r.loop.onset_step == 4
    assert r.stop_step - r.loop_onset_step < 4


def test_an_agent_message_breaks_the_recorded_run_but_not_the_guard_streak() -> None:
    # L1, message, L1, L1: the guard's streak spans the message (it judges actions);
    # the onset is the first step of the strictly consecutive run that holds the stop.
    steps = [*lookup(1), agent(text="checking"), *lookup(2)]
    r = replay_run(run(*steps), policy(repeat_limit=3))
    assert (r.stop_reason, r.stop_step) == ("repeated_action", 4)
    assert r.evidence is not None and r.evidence["step_indices"] == [1, 3, 4]
    assert r.loop_onset_step == 3
    assert r.loop is None  # two strictly consecutive calls are not a recorded loop


def test_a_changed_observation_is_not_a_repeat() -> None:
    steps = [
        agent(call("poll", {"job": 7}, json.dumps({"state": "running", "pct": i})))
        for i in range(10)
    ]
    steps.append(finish())
    r = replay_run(run(*steps, outcome=SUCCESS), policy(repeat_limit=3, no_progress_patience=3))
    assert r.stop_reason is None
    assert r.loop is None
    assert not r.false_stop


def test_pagination_is_not_stopped() -> None:
    pol = Policy.build(
        "pages",
        **{**_OPEN, "repeat_limit": 2, "no_progress_patience": 2, "cycle_repetitions": 2},
    )
    steps = [
        agent(
            call(
                "list_orders", {"cursor": f"c{i}"}, json.dumps({"items": [i], "next": f"c{i + 1}"})
            )
        )
        for i in range(12)
    ]
    steps.append(finish())
    r = replay_run(run(*steps, outcome=SUCCESS), pol)
    assert r.stop_reason is None and r.stop_step is None
    assert r.loop is None and r.loop_onset_step is None
    assert r.calls_saved == 0


def test_volatile_fields_in_json_observations_are_ignored() -> None:
    steps = [
        agent(call("status", {"id": 1}, json.dumps({"state": "down", "timestamp": 1000 + i})))
        for i in range(5)
    ]
    r = replay_run(run(*steps), policy(repeat_limit=3))
    assert (r.stop_reason, r.stop_step) == ("repeated_action", 3)


def test_a_b_a_b_cycle() -> None:
    a = call("search", {"q": "The Shallows"}, "Could not find")
    b = call("search", {"q": "The Shallows (film)"}, "Could not find")
    steps = [agent(call("start", {}, "ok")), *[agent(x) for x in (a, b, a, b, a, b)]]
    r = replay_run(run(*steps), policy(cycle_repetitions=2, cycle_max_period=4))
    assert r.stop_reason == "action_cycle"
    assert r.stop_step == 5  # the cycle completes with the 4th call of a-b-a-b
    assert r.loop_onset_step == 2
    assert r.evidence is not None and r.evidence["matched_period"] == 2
    assert r.calls_saved == 2  # the 5th and 6th calls of the cycle
    assert r.loop is not None and (r.loop.kind, r.loop.period, r.loop.onset_step) == ("cycle", 2, 2)
    assert r.loop.actions == 6


def test_period_three_cycle_onset() -> None:
    a, b, c = (call(n, {}, "same") for n in ("a", "b", "c"))
    steps = [agent(x) for x in (a, b, c, a, b, c, a)]
    r = replay_run(run(*steps), policy(cycle_repetitions=2, cycle_max_period=3))
    assert (r.stop_reason, r.stop_step, r.loop_onset_step) == ("action_cycle", 6, 1)


def test_no_progress_onset_is_the_step_after_the_last_progress() -> None:
    steps = [agent(call("read", {"i": 1}, "first"))] + [
        agent(call("read", {"i": i}, "first")) for i in range(2, 8)
    ]
    r = replay_run(run(*steps), policy(no_progress_patience=3))
    assert r.stop_reason == "no_progress"
    assert r.stop_step == 4
    assert r.loop_onset_step == 2


def test_new_user_turns_are_progress_and_repeated_ones_are_not() -> None:
    chat = []
    for i in range(6):
        chat += [agent(text=f"question {i}"), user(f"answer {i}")]
    fresh = replay_run(run(*chat, finish()), policy(no_progress_patience=2))
    assert fresh.stop_reason is None
    stale = []
    for i in range(6):
        stale += [agent(text=f"question {i}"), user("I don't know")]
    r = replay_run(run(*stale, finish()), policy(no_progress_patience=2))
    assert (r.stop_reason, r.stop_step) == ("no_progress", 3)


def test_user_tool_calls_do_not_spend_the_agent_budget() -> None:
    steps = [user("hi", call("toggle_airplane_mode", {}, "OFF"), call("check", {}, "ok"))]
    steps += [agent(call("lookup", {"id": i}, f"r{i}")) for i in range(3)]
    steps.append(finish())
    r = replay_run(run(*steps, outcome=SUCCESS), policy(max_tool_attempts=3))
    assert r.stop_reason is None
    assert r.calls_total == 3


def test_repeated_decision() -> None:
    steps = [agent(text="Let me think about this.") for _ in range(5)]
    r = replay_run(run(*steps), policy(repeated_decision_limit=3))
    assert (r.stop_reason, r.stop_step, r.loop_onset_step) == ("repeated_decision", 3, 1)


def test_model_turn_ceiling_stops_before_the_next_model_call() -> None:
    steps = [agent(call("lookup", {"id": i}, f"r{i}")) for i in range(8)]
    r = replay_run(run(*steps), policy(max_model_turns=5))
    assert (r.stop_reason, r.stop_dimension, r.stop_step) == ("budget_exhausted", "model_turns", 5)
    assert r.calls_saved == 3
    assert r.model_calls_saved == 3
    assert r.evidence is not None and r.evidence["limit"] == 5


def test_deadline_uses_recorded_timestamps() -> None:
    steps = [
        agent(call("lookup", {"id": i}, f"r{i}"), ts=1_700_000_000.0 + 10 * i) for i in range(6)
    ]
    r = replay_run(run(*steps), policy(max_elapsed_seconds=30))
    assert (r.stop_reason, r.stop_step) == ("deadline_exceeded", 3)
    untimed = [agent(call("lookup", {"id": i}, f"r{i}")) for i in range(6)]
    assert replay_run(run(*untimed), policy(max_elapsed_seconds=30)).stop_reason is None


def test_recorded_errors_feed_the_retry_rule() -> None:
    failing = call("book", {"flight": "HAT030"}, "Error: flight HAT030 not available", error=True)
    r = replay_run(run(agent(failing), agent(failing)), policy())
    assert (r.stop_reason, r.stop_dimension, r.stop_step) == (
        "budget_exhausted",
        "action_retries",
        2,
    )
    assert r.evidence is not None and r.evidence["failure_class"] == "invalid_arguments"
    transient = call("fetch", {"u": 1}, "503 Service Unavailable", error=True)
    r = replay_run(
        run(agent(transient), agent(transient), agent(call("fetch", {"u": 1}, "ok"))), policy()
    )
    assert r.stop_reason is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("HTTP 401 Unauthorized", FailureClass.UNAUTHORIZED),
        ("request timed out", FailureClass.TIMEOUT),
        ('{"error": "Rate limit exceeded"}', FailureClass.TRANSIENT),
        ("Error: flight not found", FailureClass.INVALID_ARGUMENTS),
        ("Segmentation fault", FailureClass.PERMANENT),
        (None, FailureClass.PERMANENT),
    ],
)
def test_classify_recorded_error(text: str | None, expected: FailureClass) -> None:
    assert classify_recorded_error(text) is expected


def test_final_mid_run_is_a_message_and_the_last_one_ends_the_run() -> None:
    steps = [
        agent(text="Here you go", decision="final"),
        user("one more thing"),
        *lookup(2),
        finish(),
    ]
    r = replay_run(run(*steps, outcome=SUCCESS), policy(repeat_limit=3))
    assert r.stop_reason is None and r.steps_total == 4


def test_raw_string_arguments_fingerprint() -> None:
    steps = [agent(ToolCall("shell", "ls -la", "same")) for _ in range(4)]
    r = replay_run(run(*steps), policy(repeat_limit=3))
    assert (r.stop_reason, r.stop_step) == ("repeated_action", 3)


def test_empty_trajectory() -> None:
    r = replay_run(run(user("hello")), policy())
    assert (r.stop_reason, r.steps_total, r.calls_total, r.loop) == (None, 0, 0, None)


# --------------------------------------------------------- false stops, summary


def corpus() -> list[Trajectory]:
    looping = run(*lookup(10), run_id="loop")
    near_miss = run(*lookup(3), finish(), outcome=SUCCESS, run_id="near-miss")
    clean = run(
        agent(call("a", {}, "1")),
        agent(call("b", {}, "2")),
        finish(),
        outcome=SUCCESS,
        run_id="clean",
    )
    long_ok = run(
        *[agent(call("page", {"cursor": i}, f"p{i}")) for i in range(7)],
        finish(),
        outcome=SUCCESS,
        run_id="long",
    )
    return [looping, near_miss, clean, long_ok]


def test_false_stop_accounting() -> None:
    results = replay(corpus(), [policy("strict", repeat_limit=3, max_tool_attempts=5)])
    by_run = {r.run_id: r for r in results}
    assert by_run["loop"].stopped and not by_run["loop"].false_stop
    assert by_run["near-miss"].false_stop and by_run["near-miss"].stop_reason == "repeated_action"
    assert not by_run["clean"].stopped and not by_run["clean"].false_stop
    assert by_run["long"].false_stop and by_run["long"].stop_dimension == "tool_attempts"
    (s,) = summarize(results)
    assert (s.runs, s.stopped, s.successful_runs, s.false_stops) == (4, 3, 3, 2)
    assert s.false_stop_rate == pytest.approx(2 / 3)
    assert s.stops_by_reason == {"repeated_action": 2, "budget_exhausted": 1}
    assert (s.loops, s.loops_caught) == (2, 2)  # loop and near-miss: 3 identical calls
    assert s.median_steps_onset_to_stop == 2.0
    assert s.calls_total == 10 + 3 + 2 + 7
    assert s.calls_saved == 8 + 1 + 2


def test_two_policy_comparison() -> None:
    strict = policy("strict", repeat_limit=3)
    lenient = policy("lenient", repeat_limit=8)
    results = replay(corpus(), [strict, lenient])
    assert [r.policy for r in results[:2]] == ["strict", "lenient"]
    c = compare(results, "strict", "lenient")
    assert (c.both, c.only_a, c.only_b, c.neither) == (1, 1, 0, 2)
    assert c.summary_a.false_stops == 1 and c.summary_b.false_stops == 0
    assert {run_id for _, run_id, _, _ in c.differing} == {"loop", "near-miss"}
    loop_a, loop_b = next((a, b) for _, rid, a, b in c.differing if rid == "loop")
    assert (loop_a.stop_step, loop_b.stop_step) == (3, 8)
    assert c.to_dict()["only_a"] == 1
    with pytest.raises(ValueError, match="no results"):
        compare(results, "strict", "missing")


def test_duplicate_profile_names_get_unique_labels() -> None:
    results = replay(corpus()[:1], [policy("same", repeat_limit=3), policy("same", repeat_limit=5)])
    assert len({r.policy for r in results}) == 2


def test_json_and_csv_shapes() -> None:
    (r,) = replay(corpus()[:1], [policy(repeat_limit=3)])
    d = r.to_dict()
    assert list(d)[:9] == [
        "source",
        "run_id",
        "recorded_outcome",
        "policy",
        "stop_reason",
        "stop_step",
        "steps_total",
        "loop_onset_step",
        "evidence",
    ]
    json.dumps(d)
    assert set(r.csv_row()) == set(CSV_COLUMNS)


def test_find_recorded_loop_is_policy_independent() -> None:
    loop = find_recorded_loop(run(*lookup(4)))
    assert loop is not None and loop.to_dict() == {
        "kind": "repeat",
        "onset_step": 1,
        "actions": 4,
        "period": 1,
        "tool": "get_details",
    }


# ------------------------------------------------------------------ policies


def test_shipped_default_policy_loads() -> None:
    named = default_policy()
    assert named.label == "replay-default"
    assert named.origin == str(DEFAULT_POLICY_FILE)
    assert named.policy.repeat_limit == 3


@pytest.mark.parametrize(
    ("spec", "labels"),
    [
        ("default", ["replay-default"]),
        ("seed:investigate-readonly", ["investigate-readonly"]),
        ("seed", ["summarize-local", "investigate-readonly", "change-small", "external-write"]),
    ],
)
def test_policy_specs(spec: str, labels: Sequence[str]) -> None:
    assert [p.label for p in load_policy_spec(spec)] == list(labels)


def test_policy_spec_errors_name_the_file(tmp_path: Any) -> None:
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy_spec(str(tmp_path / "missing.toml"))
    with pytest.raises(PolicyError, match=r"profiles\.nope"):
        load_policy_spec("seed:nope")
    bad = tmp_path / "bad.toml"
    bad.write_text('[profiles.x]\nversion = "1"\nrepeat_limit = -1\n', encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        load_policy_spec(f"{bad}:x")
    assert str(bad) in str(info.value) and "profiles.x.repeat_limit" in str(info.value)


def test_replay_needs_a_policy() -> None:
    with pytest.raises(ValueError):
        replay(corpus(), [])
    assert isinstance(replay(corpus(), [NamedPolicy("n", policy(), "<code>")])[0].policy, str)


# ------------------------------------------------------------- stored runs


def stored_call(
    step: int, *, args: str | None, result: str | None, outcome: str = "ok"
) -> dict[str, Any]:
    return {
        "kind": "tool_result",
        "step": step,
        "tool": "lookup",
        "tool_call_id": f"c{step}",
        "outcome": outcome,
        "action_fingerprint": "fp-same",
        "observation_digest": "obs-same",
        "arguments": args,
        "result": result,
        "start_unix_nano": 1_000_000_000_000 + step * 1_000_000_000,
        "end_unix_nano": float("nan"),
    }


def stored_decision(
    step: int, kind: str = "tool", fingerprint: str | None = None
) -> dict[str, Any]:
    return {
        "kind": "decision",
        "step": step,
        "decision_type": kind,
        "decision_fingerprint": fingerprint,
        "input_tokens": 10.0,
        "output_tokens": float("nan"),
        "cost_usd": None,
        "start_unix_nano": 1_000_000_000_000 + step * 1_000_000_000,
    }


def test_trajectory_from_stored_without_content() -> None:
    rows: list[dict[str, Any]] = []
    for step in range(1, 6):
        rows += [stored_decision(step), stored_call(step, args=None, result=None)]
    rows.append({"kind": "decision", "step": float("nan")})  # a row without a step is ignored
    t = trajectory_from_stored("run-1", rows, stop_reason="repeated_action", agent="support")
    assert (t.run_id, t.format, t.recorded_outcome, t.recorded_stop) == (
        "run-1",
        "loopwatch",
        FAILURE,
        "repeated_action",
    )
    assert len(t.steps) == 5 and t.agent == "support"
    first = t.steps[0]
    assert first.tool_calls[0].arguments == {"action_fingerprint": "fp-same"}
    assert first.tool_calls[0].observation == "obs-same"
    assert first.input_tokens == 10 and first.output_tokens is None and first.cost_usd is None
    assert first.timestamp == pytest.approx(1001.0)
    r = replay_run(t, policy(repeat_limit=3))
    assert (r.stop_reason, r.stop_step, r.loop_onset_step) == ("repeated_action", 3, 1)


def test_trajectory_from_stored_arguments_too_deep_for_the_parser() -> None:
    """Stored arguments are client text: nesting past ``json.loads``'s recursion limit
    raised RecursionError (the Policy replay page failed); they are kept as text."""
    deep = "[" * 100_000 + "]" * 100_000
    rows = [stored_decision(1), stored_call(1, args=deep, result=None)]
    t = trajectory_from_stored("run-1", rows)
    assert t.steps[0].tool_calls[0].arguments == deep


def test_trajectory_from_stored_with_content_and_blocked_call() -> None:
    rows = [
        stored_decision(1),
        stored_call(1, args='{"id": 7}', result='{"status": "ok"}'),
        stored_decision(2),
        stored_call(2, args="not json", result=None, outcome="error"),
        stored_decision(3),
        stored_call(3, args='{"id": 7}', result=None, outcome="blocked"),
        stored_decision(4, "message", fingerprint="fp-plan"),
        stored_decision(5, "final"),
    ]
    t = trajectory_from_stored("run-2", rows, stop_reason="completed")
    assert t.recorded_outcome == SUCCESS
    calls = [s.tool_calls[0] for s in t.steps[:3]]
    assert calls[0].arguments == {"id": 7} and calls[0].observation == '{"status": "ok"}'
    assert calls[1].arguments == "not json" and calls[1].error
    assert calls[2].observation is None and not calls[2].error
    assert [s.decision for s in t.steps] == ["tool", "tool", "tool", "message", "final"]
    assert t.steps[3].text == "fp-plan"
    assert trajectory_from_stored("run-3", [], stop_reason=None).recorded_outcome == "unknown"


@pytest.mark.parametrize(
    "name",
    [
        "engine",
        "loops",
        "results",
        "policy_choice",
        "recorded",
        "demo",
        "export",
        "shipped_examples",
        "importers._fields",
        "importers._calls",
        "importers.stored",
    ],
)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(f"loopwatch.replay.{name}")
    assert all(hasattr(module, n) for n in module.__all__)
    public = {n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))}
    defined_here = {
        n for n in public if getattr(getattr(module, n), "__module__", "") == module.__name__
    }
    assert defined_here <= set(module.__all__)


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        ("ababccc", ("cycle", 1, 4, 2)),
        ("cccabab", ("repeat", 1, 3, 1)),
        ("xabcabcab", ("cycle", 2, 8, 3)),
        ("abcd", None),
        ("aab", None),
    ],
)
def test_recorded_loop_is_the_earliest(sequence: str, expected: tuple[Any, ...] | None) -> None:
    loop = find_recorded_loop(run(*[agent(call(c, {}, "same")) for c in sequence]))
    got = None if loop is None else (loop.kind, loop.onset_step, loop.actions, loop.period)
    assert got == expected


def test_progress_the_recording_guard_counted_is_replayed() -> None:
    """A stored run holds no row for explicit progress (``Run.progress``: a user reply),
    but each decision row holds the recording guard's ``steps_since_progress``. Where it
    is 0, the replay counts progress too, so Policy replay of stored runs agrees with the
    live guard: re-reads after each user reply are not a repeat (a review, 2026-12-01)."""

    def run(counts: list[int]) -> ReplayResult:
        rows: list[dict[str, Any]] = []
        for step, count in enumerate(counts, start=1):
            rows += [
                {**stored_decision(step), "steps_since_progress": count},
                # The first read's observation was new: progress the replay sees itself.
                {**stored_call(step, args=None, result=None), "progress": step == 1},
            ]
        return replay_run(trajectory_from_stored("r", rows), policy(repeat_limit=3))

    live_progress = run([0, 0, 0, 0])
    assert live_progress.stop_reason is None
    # Progress after step 1 came from its tool result: no explicit progress to replay,
    # and the repeat count still starts at step 1.
    none = run([0, 0, 1, 2])
    assert (none.stop_reason, none.stop_step) == ("repeated_action", 3)
    # Three times the limit in a row stays a loop, progress or not.
    many = run([0] * 12)
    assert (many.stop_reason, many.stop_step) == ("repeated_action", 9)
