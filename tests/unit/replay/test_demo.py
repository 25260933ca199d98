"""The demo's replay loop, its own trajectory format and the shipped example runs.

No server here (tests/integration/test_demo_up.py runs the demo against a real
collector); spans go to the SDK's in-memory exporter.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from loopwatch.instrumentation import Policy, PolicyError, StopReason
from loopwatch.instrumentation.examples import EXAMPLES, run_example
from loopwatch.instrumentation.testing import assert_trace_invariants, collect_runs
from loopwatch.replay import demo
from loopwatch.replay.engine import default_policy, replay_run
from loopwatch.replay.importers import load_paths, read_file
from loopwatch.replay.trajectory import AGENT, USER, Step, ToolCall, Trajectory

from tests.conftest import CORPUS

TELECOM_FT = (
    CORPUS
    / "tau2-bench"
    / "ft_gpt-4.1-2025-04-14_sierra_tau2-full-sft_BzrYdMNm_telecom_default_gpt-4.1_1trials.json"
)
SHAPES = {
    "search_orders": "cursor",
    "poll_job": "eventual",
    "get_details_by_id": "constant",
    "check_status": "false progress",
    "toggle_state": "oscillating",
    "fetch_invoice": "error",
    "slow_export": "hanging",
}


def _examples() -> list[Trajectory]:
    loaded = load_paths([demo.EXAMPLES_DIR])
    assert loaded.problems == []
    return loaded.trajectories


def _replay(t: Trajectory, provider: Any = None, **kwargs: Any) -> Any:
    return demo.replay_trajectory(
        t, Policy(), run_id=t.run_id, tracer_provider=provider, policy_override=False, **kwargs
    )


def test_shipped_examples_cover_every_stop_reason_and_tool_shape() -> None:
    runs = _examples()
    expected = {t.metadata["replay"]["expected_stop"] for t in runs}
    assert expected == {r.value for r in StopReason}
    tools = {c.name for t in runs for s in t.steps for c in s.tool_calls}
    assert set(SHAPES) <= tools


def test_each_example_replays_to_its_stop_with_valid_traces(
    tracer_provider: Any, span_exporter: Any
) -> None:
    for t in _examples():
        outcome = _replay(t, tracer_provider)
        assert outcome.stop.reason.value == t.metadata["replay"]["expected_stop"], t.run_id
    traces = assert_trace_invariants(span_exporter.get_finished_spans())
    assert len(traces) == len(_examples())


def test_examples_replay_as_the_live_examples_ran() -> None:
    """Replaying the recording stops where the live example (real tools) stopped."""
    by_name = {t.metadata["replay"]["example"]: t for t in _examples()}
    for example in EXAMPLES:
        live = run_example(example)
        replayed = _replay(by_name[example.name])
        if "hanging tool" in example.name:
            # The recording keeps the hang (900 s on the recorded clock, past the default
            # deadline too); the live example's fake clock does not move while its tool
            # hangs, so it meets its 4 s deadline turns later. Same stop, earlier step.
            assert replayed.stop.reason == live.stop.reason == StopReason.DEADLINE_EXCEEDED
            assert replayed.stop.step <= live.stop.step
            continue
        assert (replayed.stop.reason, replayed.stop.step, replayed.usage.model_turns) == (
            live.stop.reason,
            live.stop.step,
            live.usage.model_turns,
        ), example.name


def test_shipped_example_files_are_current(tmp_path: Path) -> None:
    written = demo.record_examples(tmp_path)
    shipped = sorted(p.name for p in demo.EXAMPLES_DIR.glob("*.json"))
    assert sorted(p.name for p in written) == shipped
    for path in written:
        assert path.read_text() == (demo.EXAMPLES_DIR / path.name).read_text(), (
            f"{path.name} differs: run `python -m loopwatch.replay.shipped_examples record-examples`"
        )


def test_own_format_round_trips(tmp_path: Path) -> None:
    runs = _examples()
    path = tmp_path / "all.json"
    demo.write_trajectories(path, runs)
    again = read_file(path, format="loopwatch")
    assert again.problems == []
    assert [(t.run_id, t.steps, t.metadata) for t in again.trajectories] == [
        (t.run_id, t.steps, t.metadata) for t in runs
    ]


BAD_RUNS = [
    ({"steps": []}, "runs[0].run_id", "non-empty string"),
    ({"run_id": "r", "steps": {}}, "runs[0].steps", "must be a list"),
    ({"run_id": "r", "steps": [{"actor": "robot"}]}, "runs[0].steps[0].actor", "one of"),
    (
        {"run_id": "r", "steps": [{"actor": "agent", "decision": "dance"}]},
        "runs[0].steps[0].decision",
        "one of",
    ),
    (
        {"run_id": "r", "steps": [{"actor": "agent", "tool_calls": [{"name": ""}]}]},
        "runs[0].steps[0].tool_calls[0]",
        "non-empty name",
    ),
    (
        {"run_id": "r", "steps": [{"actor": "agent", "timestamp": "noon"}]},
        "runs[0].steps[0].timestamp",
        "finite number",
    ),
    ({"run_id": "r", "steps": [], "recorded_outcome": "great"}, "runs[0].recorded_outcome", ""),
]


@pytest.mark.parametrize(("bad", "record", "message"), BAD_RUNS)
def test_a_bad_run_is_a_problem_naming_file_and_record(
    tmp_path: Path, bad: dict[str, Any], record: str, message: str
) -> None:
    good = {"run_id": "ok", "steps": [{"actor": "agent", "decision": "final", "text": "x"}]}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"format": demo.FORMAT, "runs": [bad, good]}))
    result = load_paths([path])
    assert [t.run_id for t in result.trajectories] == ["ok"]
    (problem,) = result.problems
    assert (problem.source, problem.record) == (str(path), record)
    assert message in problem.message


def test_an_unreadable_or_foreign_file_is_one_problem(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "loopwatch.trajectory/1", "runs": [')
    result = read_file(broken, format="loopwatch")
    assert result.trajectories == [] and result.problems[0].record == "file"


def _run(*steps: Step, **kwargs: Any) -> Trajectory:
    return Trajectory(source="t", run_id="r", format="test", steps=steps, **kwargs)


def _tool_step(i: int, obs: str, *, error: bool = False, ts: float | None = None) -> Step:
    call = ToolCall("lookup", {"id": 1}, obs, error)
    return Step(i, AGENT, "tool", None, (call,), ts)


END_CASES = [
    ("final answer", (Step(0, AGENT, "final", "done"),), {}, "completed"),
    (
        "failed goal",
        (Step(0, AGENT, "final", "x"),),
        {"recorded_outcome": "failure"},
        "final_unverified",
    ),
    (
        "passed goal",
        (Step(0, AGENT, "message", "bye"),),
        {"recorded_outcome": "success"},
        "completed",
    ),
    ("step cap", (_tool_step(0, "a"),), {"recorded_stop": "max_steps"}, "cancelled"),
    ("error cap", (_tool_step(0, "a"),), {"recorded_stop": "too_many_errors"}, "cancelled"),
    ("user stop", (_tool_step(0, "a"),), {"recorded_stop": "user_stop"}, "completed"),
    ("refusal", (Step(0, AGENT, "refusal", "no"),), {}, "refused"),
    (
        "repeat",
        tuple(_tool_step(i, '{"v": 1}') for i in range(5)),
        {"recorded_stop": "max_steps"},
        "repeated_action",
    ),
    (
        "mid-run final is a message",
        (Step(0, AGENT, "final", "hi"), _tool_step(1, "a"), Step(2, AGENT, "final", "ok")),
        {},
        "completed",
    ),
]


@pytest.mark.parametrize(
    ("name", "steps", "kwargs", "reason"), END_CASES, ids=[c[0] for c in END_CASES]
)
def test_how_a_record_ends(
    name: str, steps: tuple[Step, ...], kwargs: dict[str, Any], reason: str
) -> None:
    outcome = demo.replay_trajectory(_run(*steps, **kwargs), Policy(), run_id="r")
    assert outcome.stop.reason.value == reason


def test_recorded_errors_are_tool_failures_with_a_class(
    tracer_provider: Any, span_exporter: Any
) -> None:
    steps = [_tool_step(i, "HTTP 400: invalid id", error=True) for i in range(4)]
    outcome = demo.replay_trajectory(
        _run(*steps), Policy(), run_id="r", tracer_provider=tracer_provider
    )
    assert outcome.stop.reason == StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.evidence.to_dict()["detector"] == "retry_rule"
    (trace,) = collect_runs(span_exporter.get_finished_spans()).values()
    assert [t.attributes["loopwatch.tool.outcome"] for t in trace.tools] == ["error", "blocked"]


def test_new_user_turns_are_progress_repeated_ones_are_not() -> None:
    chat = [Step(0, USER, "message", "hello")]
    for i in range(1, 20, 2):
        chat.append(Step(i, AGENT, "message", f"question {i}"))
        chat.append(Step(i + 1, USER, "message", f"answer {i}"))
    new = demo.replay_trajectory(_run(*chat, recorded_outcome="success"), Policy(), run_id="a")
    assert new.stop.reason == StopReason.COMPLETED
    same = [Step(0, USER, "message", "hello")]
    for i in range(1, 20, 2):
        same.append(Step(i, AGENT, "message", f"question {i}"))
        same.append(Step(i + 1, USER, "message", "I don't know"))
    stuck = demo.replay_trajectory(_run(*same), Policy(), run_id="b")
    assert stuck.stop.reason == StopReason.NO_PROGRESS


def test_time_follows_the_record_and_speed_pauses_are_capped() -> None:
    steps = [
        Step(0, AGENT, "message", "a", (), 1000.0),
        Step(1, AGENT, "message", "b", (), 1400.0),
        Step(2, AGENT, "message", "c", (), 1401.0),
    ]
    pauses: list[float] = []
    policy = Policy.build(max_elapsed_seconds=300)
    outcome = demo.replay_trajectory(
        _run(*steps), policy, run_id="r", speed=10.0, sleep=pauses.append
    )
    assert outcome.stop.reason == StopReason.DEADLINE_EXCEEDED
    assert pauses == [demo.MAX_SLEEP_SECONDS]
    pauses.clear()
    again = demo.replay_trajectory(_run(*steps), policy, run_id="r", sleep=pauses.append)
    assert again.stop.reason == StopReason.DEADLINE_EXCEEDED
    assert pauses == []


def test_demo_and_replay_agree_on_the_telecom_runs() -> None:
    """``loopwatch demo`` and ``loopwatch replay`` judge every run the same way."""
    if not TELECOM_FT.is_file():
        pytest.skip(f"corpus file absent: {TELECOM_FT}")
    loaded = load_paths([TELECOM_FT])
    if not loaded.trajectories:
        pytest.skip("the tau2 importer is not built yet")
    named = default_policy()
    reasons = set()
    for t in loaded.trajectories:
        offline = replay_run(t, named)
        live = demo.replay_trajectory(t, named.policy, run_id="x")
        if offline.stop_reason is None:
            assert live.stop.reason.value in (
                "completed",
                "final_unverified",
                "refused",
                "cancelled",
            )
        else:
            assert (live.stop.reason.value, live.stop.step) == (
                offline.stop_reason,
                offline.stop_step,
            ), t.run_id
        reasons.add(live.stop.reason.value)
    assert "repeated_action" in reasons


@pytest.mark.parametrize(
    ("label", "stopped"),
    [
        ("max_steps", True),
        ("too_many_errors", True),
        ("HALTED", True),
        ("user_stop", False),
        ("agent_stop", False),
        ("give_answer", False),
        ("finish", False),
    ],
)
def test_cut_off_labels(label: str, stopped: bool) -> None:
    assert bool(demo.CUT_OFF_STOP.search(label)) is stopped


def test_run_ids_are_readable_unique_and_path_safe() -> None:
    t = _run(Step(0, AGENT, "final", "x"))
    t = Trajectory("s", "task=[mms]a|b [x]/trial=0", "tau2", t.steps)
    assert demo.demo_run_id("demo-1a2b3c", 7, t) == "demo-1a2b3c.0007.task=-mms-a-b-x-trial=0"


def test_policy_resolution() -> None:
    assert demo.resolve_policy(None) == default_policy().policy
    assert demo.resolve_policy("investigate-readonly").name == "investigate-readonly"
    assert demo.resolve_policy("seed:change-small").name == "change-small"
    with pytest.raises(PolicyError):
        demo.resolve_policy("no-such-file.toml")


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"max_cost_usd": 10**400}, "profiles.p.max_cost_usd: too large for a number"),
        ({"max_model_turns": 10**400}, "profiles.p.max_model_turns: must be <="),
        (
            {"tools": {"t": {"timeout_seconds": 10**400}}},
            "profiles.p.tools.t.timeout_seconds: too large",
        ),
        (
            {"tools": {"t": {"risk": "sometimes"}}},
            "profiles.p.tools.t.risk: must be 'read' or 'write'",
        ),
    ],
)
def test_a_recorded_policy_is_checked_like_a_policy_file(
    table: dict[str, Any], fragment: str
) -> None:
    # Was: OverflowError out of replay_trajectory for a huge limit (only PolicyError,
    # TypeError and ValueError were caught), and tool settings not checked at all.
    t = _run(Step(0, AGENT, "final", "x"), metadata={"replay": {"policy": {"name": "p", **table}}})
    with pytest.raises(ValueError, match=f"t: r: invalid policy: {re.escape(fragment)}"):
        demo.replay_trajectory(t, Policy(), run_id="r", policy_override=False)


def test_default_corpus_is_found_next_to_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "shared" / "corpus").mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    assert demo.default_corpus(tmp_path / "repo") == tmp_path / "shared" / "corpus"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/v1/traces", "http://127.0.0.1:4318/v1/traces"),
        ("http://collector:9000/custom/path", "http://collector:9000/custom/path"),
    ],
)
def test_otlp_url_without_a_path_is_a_base_endpoint(given: str, expected: str) -> None:
    assert demo.otlp_endpoint(given) == expected
