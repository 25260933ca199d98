"""The tau2, chat and otlp_json importers: corpus counts, hand-made fixtures, fuzzing."""

from __future__ import annotations

import atexit
import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopwatch.collector.decode import MSG_MALFORMED_ATTRIBUTES, MSG_TRACE_ID
from loopwatch.collector.map import MSG_NO_RUN_ID
from loopwatch.replay.importers import Document, Importer, detect, iter_files, read_file
from loopwatch.replay.importers.chat import IMPORTER as CHAT
from loopwatch.replay.importers.otlp_json import IMPORTER as OTLP
from loopwatch.replay.importers.tau2 import IMPORTER as TAU2
from loopwatch.replay.trajectory import AGENT, USER, ImportProblem, ToolCall, Trajectory

from ...conftest import TESTDATA
from . import handmade

FIXTURES = TESTDATA / "trajectories"
# The hand-written tau-bench-style chat file is built by the tests (see handmade.py).
HANDMADE = "chat/" + handmade.NAME
_HANDMADE_DIR = Path(tempfile.mkdtemp(prefix="lw-handmade-"))
atexit.register(shutil.rmtree, _HANDMADE_DIR, True)
handmade.write_handmade_chat(_HANDMADE_DIR)


def _fixture(name: str) -> Path:
    """A fixture file by its name under tests/testdata/trajectories (or the built one)."""
    return _HANDMADE_DIR / handmade.NAME if name == HANDMADE else FIXTURES / name


MINE: tuple[Importer, ...] = (TAU2, CHAT, OTLP)
OWNER = {"tau2-bench": "tau2", "tau-bench": "chat", "otlp-genai-interlingua": "otlp_json"}
FT_TELECOM = (
    "ft_gpt-4.1-2025-04-14_sierra_tau2-full-sft_BzrYdMNm_telecom_default_gpt-4.1_1trials.json"
)


def _doc(path: Path) -> Document:
    return Document(path=path, text=path.read_text(encoding="utf-8", errors="replace"))


def _calls(run: Trajectory, actor: str = AGENT) -> list[ToolCall]:
    return [c for s in run.steps if s.actor == actor for c in s.tool_calls]


def _longest_identical_streak(calls: list[ToolCall]) -> tuple[int, ToolCall | None]:
    best, best_call, streak = 0, None, 0
    for i, call in enumerate(calls):
        prev = calls[i - 1] if i else None
        same = prev is not None and (prev.name, prev.arguments_json()) == (
            call.name,
            call.arguments_json(),
        )
        streak = streak + 1 if same else 1
        if streak > best:
            best, best_call = streak, call
    return best, best_call


def _read_folder(folder: Path, fmt: str) -> tuple[list[Trajectory], list[ImportProblem]]:
    runs: list[Trajectory] = []
    problems: list[ImportProblem] = []
    for path in iter_files([folder]):
        result = read_file(path, format=fmt)
        runs += result.trajectories
        problems += result.problems
    return runs, problems


# --- corpus ------------------------------------------------------------------------------


def test_tau2_corpus_counts_match_the_readme(corpus_dir: Path) -> None:
    runs, problems = _read_folder(corpus_dir / "tau2-bench", "tau2")
    assert problems == []
    assert len(runs) == 178
    assert Counter(r.recorded_stop for r in runs) == {
        "user_stop": 134,
        "agent_stop": 40,
        "max_steps": 3,
        "too_many_errors": 1,
    }
    assert {r.recorded_stop_kind for r in runs} == {"explicit"}
    assert sum(len(_calls(r)) for r in runs) == 1767
    assert sum(len(_calls(r, USER)) for r in runs) == 886
    # 7,616 messages: every non-tool message is a step, every tool message an observation.
    steps = sum(len(r.steps) for r in runs)
    observed = sum(
        1 for r in runs for s in r.steps for c in s.tool_calls if c.observation is not None
    )
    assert observed == 1767 + 886
    assert steps + observed == 7616
    assert Counter(r.recorded_outcome for r in runs).keys() <= {"success", "failure"}
    assert all(r.format == "tau2" and r.agent.startswith("tau2-") for r in runs)
    for source in {r.source for r in runs}:
        ids = [r.run_id for r in runs if r.source == source]
        assert len(ids) == len(set(ids))


def test_tau2_corpus_loop_runs_repeat_the_same_lookup(corpus_dir: Path) -> None:
    result = read_file(corpus_dir / "tau2-bench" / FT_TELECOM, format="tau2")
    capped = [r for r in result.trajectories if r.recorded_stop == "max_steps"]
    streaks = sorted(_longest_identical_streak(_calls(r))[0] for r in capped)
    assert streaks == [67, 74, 95]

    (run,) = [
        r
        for r in capped
        if str(r.metadata["task_id"]).startswith(
            "[mms_issue]break_apn_mms_setting|user_abroad_roaming_enabled_off"
        )
    ]
    length, call = _longest_identical_streak(_calls(run))
    assert length == 95
    assert call is not None
    assert (call.name, call.arguments) == ("get_details_by_id", {"id": "L1002"})
    calls = _calls(run)
    start = next(
        i
        for i in range(len(calls))
        if all(c.arguments == {"id": "L1002"} for c in calls[i : i + 95])
    )
    assert len({c.observation for c in calls[start : start + 95]}) == 1
    assert not any(c.error for c in calls[start : start + 95])

    (errors_run,) = [r for r in result.trajectories if r.recorded_stop == "too_many_errors"]
    assert sum(c.error for c in _calls(errors_run)) == 10


def test_tau_bench_corpus_counts_match_the_readme(corpus_dir: Path) -> None:
    runs, problems = _read_folder(corpus_dir / "tau-bench", "chat")
    assert problems == []
    assert len(runs) == 198
    assert sum(len(_calls(r)) for r in runs) == 1123
    assert Counter(r.recorded_outcome for r in runs) == {"success": 84, "failure": 114}
    assert Counter(r.recorded_stop for r in runs) == {
        "user_stop": 147,
        "transfer_to_human_agents": 48,
        "max_num_steps": 3,
    }
    assert {r.recorded_stop_kind for r in runs} == {"inferred"}
    # 5,184 messages = steps + tool results + one system prompt per run.
    assert sum(len(r.steps) for r in runs) + 1123 + 198 == 5184
    assert all(c.observation is not None for r in runs for c in _calls(r))
    assert {r.agent for r in runs} == {"tau-bench-airline"}
    assert len({r.run_id for r in runs}) == 198
    # "final" exactly once per run that the user ended, never elsewhere.
    finals = Counter(r.recorded_stop for r in runs for s in r.steps if s.decision == "final")
    assert finals == {"user_stop": 147}


def test_tau_bench_corpus_known_runs(corpus_dir: Path) -> None:
    runs = {
        r.run_id: r
        for r in read_file(corpus_dir / "tau-bench" / "gpt-4o-airline.json").trajectories
    }
    abab = [c for c in _calls(runs["task=23/trial=3"]) if c.name == "search_direct_flight"]
    keys = [c.arguments_json() for c in abab]
    assert len(set(keys)) == 2
    assert keys[:4] == [keys[0], keys[1], keys[0], keys[1]]
    calls = _calls(runs["task=23/trial=3"])
    updates = [c for c in calls if c.name == "update_reservation_flights"]
    assert len(updates) == 4 and all(c.error for c in updates)
    assert calls[-1].name == "transfer_to_human_agents"
    stall = runs["task=9/trial=3"]
    assert stall.recorded_stop == "max_num_steps"
    assert len(_calls(stall)) == 1


def test_otlp_corpus_counts_match_the_readme(corpus_dir: Path) -> None:
    runs, problems = _read_folder(corpus_dir / "otlp-genai-interlingua", "otlp_json")
    assert problems == []
    assert len(runs) == 2
    assert {r.run_id for r in runs} == {
        "9ed94f9bdc36b397e11c51f77d49e01a",
        "77d66be22a4ffc8149309684b3a319f7",
    }
    for run in runs:
        (step,) = run.steps
        assert step.decision == "tool"
        (call,) = step.tool_calls
        assert (call.name, call.arguments) == ("lookup_order", {"order_id": "A-1187"})
        assert call.call_id == "call_9RtYbK2mXqLp"
        assert call.observation is None
        assert (step.input_tokens, step.output_tokens) == (412, 27)
        assert run.recorded_stop is None and run.recorded_outcome == "unknown"
    assert {r.agent for r in runs} == {"capture", "support_triage"}


def test_detection_claims_only_each_importers_own_corpus_files(corpus_dir: Path) -> None:
    checked = 0
    for path in iter_files([corpus_dir]):
        doc = _doc(path)
        owner = OWNER.get(path.parent.name)
        claimed = {imp.name for imp in MINE if imp.matches(doc)}
        assert claimed == ({owner} if owner else set()), path
        if owner:
            assert detect(doc).name == owner, path
        checked += 1
    assert checked >= 20


# --- hand-made fixtures ------------------------------------------------------------------

FIXTURE_CASES = [
    # (file, format, run ids, [(record, message fragment)])
    (
        "tau2/telecom_small.json",
        "tau2",
        ["task=[mms]fix_apn/trial=0", "task=[mms]fix_apn/trial=1"],
        [],
    ),
    (
        "tau2/malformed.json",
        "tau2",
        ["task=[mms]fix_apn/trial=0/sim=sim-a", "task=[mms]fix_apn/trial=0/sim=sim-c"],
        [
            ("simulations[1]", "messages[3]: tool_calls[0] has no name"),
            ("simulations[2]", "must be an object"),
            ("simulations[3]", "messages[1]: tool result id 'k2' matches no earlier call"),
            ("simulations[5]", "messages[0]: unknown role 'narrator'"),
            ("simulations[6]", "'messages' is missing"),
        ],
    ),
    (
        HANDMADE,
        "chat",
        ["task=3/trial=0", "task=3/trial=1", "task=9/trial=3"],
        [
            ("[2]", "traj[3]: tool_calls[0] has no name"),
            ("[4]", "traj[2]: tool result 'nope' answers no earlier call"),
        ],
    ),
    ("chat/messages.json", "chat", ["messages"], []),
    ("chat/wrapped.json", "chat", ["conv-7"], []),
    (
        "chat/records.jsonl",
        "chat",
        ["r1", "line=5"],
        [
            ("line 2", "not valid JSON"),
            ("line 3", "messages[1]: tool result 'q' answers no earlier call"),
        ],
    ),
    (
        "otlp_json/genai_agent.json",
        "otlp_json",
        ["5b8efff798038103d269b633813fc60c"],
        [
            # The collector's decoder refuses these spans, with its messages.
            ("resourceSpans[0].scopeSpans[0].spans[8]", "invalid trace id"),
            ("resourceSpans[0].scopeSpans[0].spans[9]", "malformed attributes"),
            ("trace 0af7651916cd43dd8448eb211c80319c", "no model-call, tool or agent step"),
        ],
    ),
    (
        "otlp_json/openinference.jsonl",
        "otlp_json",
        ["a1b2c3d4e5f60718293a4b5c6d7e8f90"],
        [("line 2", "not valid JSON"), ("line 4", "resourceSpans")],
    ),
    ("otlp_json/loopwatch_repeat.json", "otlp_json", ["run-repeat-1"], []),
]


@pytest.mark.parametrize(("name", "fmt", "run_ids", "problems"), FIXTURE_CASES)
def test_fixture_runs_and_problems(
    name: str, fmt: str, run_ids: list[str], problems: list[tuple[str, str]]
) -> None:
    path = _fixture(name)
    assert detect(_doc(path)).name == fmt
    result = read_file(path)
    assert [r.run_id for r in result.trajectories] == run_ids
    assert {r.format for r in result.trajectories} <= {fmt}
    assert [p.record for p in result.problems] == [record for record, _ in problems]
    for problem, (_, fragment) in zip(result.problems, problems, strict=True):
        assert problem.source == str(path)
        assert fragment in problem.message
        assert str(problem).startswith(f"{path}: {problem.record}: ")


def _runs(name: str) -> dict[str, Trajectory]:
    return {r.run_id: r for r in read_file(_fixture(name)).trajectories}


def test_tau2_fixture_mapping() -> None:
    runs = _runs("tau2/telecom_small.json")
    ok, capped = runs["task=[mms]fix_apn/trial=0"], runs["task=[mms]fix_apn/trial=1"]
    assert (ok.recorded_stop, ok.recorded_outcome) == ("user_stop", "success")
    assert (capped.recorded_stop, capped.recorded_outcome) == ("max_steps", "failure")
    assert (ok.agent, ok.model) == ("tau2-telecom", "gpt-4.1")
    assert ok.metadata["simulation_id"] == "sim-a" and ok.metadata["reward"] == 1.0
    assert [(s.actor, s.decision) for s in ok.steps] == [
        ("agent", "message"),
        ("user", "message"),
        ("agent", "tool"),
        ("agent", "tool"),
        ("agent", "message"),
        ("user", "message"),
        ("user", "message"),
        ("agent", "final"),
        ("user", "message"),
    ]
    lookup, missing = _calls(ok)
    assert lookup.observation == '{"line_id": "L1002"}' and not lookup.error
    assert missing.error and missing.observation == "Error: line L9999 not found"
    assert lookup.started_at == pytest.approx(1754060402.0)
    assert lookup.ended_at == pytest.approx(1754060403.0)
    (toggle,) = _calls(ok, USER)
    assert (toggle.name, toggle.observation) == (
        "toggle_airplane_mode",
        "Airplane mode is now OFF.",
    )
    assert ok.agent_tool_calls == 2
    step = ok.steps[2]
    assert (step.input_tokens, step.output_tokens, step.cost_usd) == (100, 10, 0.001)
    # A run cut off by max_steps has no final answer; string arguments are decoded.
    assert capped.steps[-1].decision == "message"
    assert capped.steps[-1].timestamp is None
    assert [c.arguments for c in _calls(capped)] == [{"id": "L1002"}, {"id": "L1002"}]


def test_chat_fixture_mapping() -> None:
    tau = _runs(HANDMADE)
    stopped = tau["task=3/trial=0"]
    assert (stopped.agent, stopped.model) == ("tau-bench-airline", "handmade-gpt-4o")
    assert (stopped.recorded_stop, stopped.recorded_stop_kind) == ("user_stop", "inferred")
    details, cancel = _calls(stopped)
    assert details.arguments == {"reservation_id": "ABC123"} and not details.error
    assert cancel.arguments == '{"reservation_id": "ABC123"'  # invalid JSON kept raw
    assert cancel.error and cancel.observation is not None
    assert [s.decision for s in stopped.agent_steps] == ["tool", "tool", "final"]
    transfer = tau["task=3/trial=1"]
    assert transfer.recorded_stop == "transfer_to_human_agents"
    assert [s.decision for s in transfer.agent_steps] == ["message", "tool"]
    assert tau["task=9/trial=3"].recorded_stop == "max_num_steps"
    assert {s.decision for s in tau["task=9/trial=3"].agent_steps} == {"message"}

    (bare,) = _runs("chat/messages.json").values()
    assert bare.recorded_stop is None and bare.recorded_outcome == "unknown"
    assert bare.steps[0].text == "What's the weather in Paris?"
    legacy, lyon, time_call = _calls(bare)
    assert (legacy.name, legacy.arguments, legacy.observation) == (
        "get_weather",
        {"city": "Paris"},
        '{"temp_c": 18}',
    )
    assert (lyon.observation, time_call.observation) == ('{"temp_c": 21}', "12:00")
    assert time_call.arguments == "not json at all"
    assert [s.decision for s in bare.agent_steps] == ["tool", "tool", "final"]

    (wrapped,) = _runs("chat/wrapped.json").values()
    assert (wrapped.agent, wrapped.model) == ("weather-bot", "gpt-4o-mini")
    assert wrapped.steps[-1].decision == "refusal"

    lines = _runs("chat/records.jsonl")
    assert lines["r1"].steps[-1].decision == "final"
    # The conversation ends with the user: the agent's last step stays a tool step.
    assert [s.decision for s in lines["line=5"].agent_steps] == ["tool"]


def test_otlp_fixture_mapping() -> None:
    (genai,) = _runs("otlp_json/genai_agent.json").values()
    assert (genai.agent, genai.model) == ("triage", "gpt-4o-mini")
    assert [s.decision for s in genai.steps] == ["tool", "tool", "tool", "final"]
    calls = _calls(genai)
    assert [c.call_id for c in calls] == ["call_0", "call_1", "call_2"]
    assert {c.arguments_json() for c in calls} == {'{"order_id":"A-1187"}'}
    assert [c.error for c in calls] == [False, False, True]
    assert all(c.observation == '{"status": "pending"}' for c in calls)
    assert calls[0].started_at is not None and calls[0].ended_at is not None
    assert genai.steps[-1].text == "Order A-1187 is pending."
    assert (genai.steps[0].input_tokens, genai.steps[0].output_tokens) == (400, 20)

    (oi,) = _runs("otlp_json/openinference.jsonl").values()
    assert (oi.agent, oi.model) == ("oi-agent", "gpt-4o")
    first, last = oi.steps
    assert [(c.name, c.arguments, c.observation) for c in first.tool_calls] == [
        ("search", {"q": "loop"}, "3 hits"),
        ("search", {"q": "cycle"}, "0 hits"),
    ]
    assert (last.decision, last.text) == ("final", "Found 3 hits for loop.")


def test_otlp_loopwatch_fixture_mapping() -> None:
    # Spans of the instrumentation's "same lookup 95 times" example (content capture off).
    (run,) = _runs("otlp_json/loopwatch_repeat.json").values()
    assert (run.agent, run.recorded_stop, run.recorded_stop_kind) == (
        "support",
        "repeated_action",
        "explicit",
    )
    assert run.recorded_outcome == "failure"
    assert run.metadata["loopwatch.policy.name"] == "investigate-readonly"
    assert [s.decision for s in run.steps] == ["tool", "tool", "tool"]
    assert (run.steps[0].input_tokens, run.steps[0].cost_usd) == (850, 0.0012)
    first, second, blocked = _calls(run)
    # Fingerprint and digest stand in for the uncaptured arguments and result.
    assert first.arguments == second.arguments == blocked.arguments
    assert set(first.arguments) == {"loopwatch.action.fingerprint"}
    assert first.observation == second.observation
    assert first.observation is not None
    assert first.observation.startswith("loopwatch.observation.digest=")
    assert blocked.observation is None and not blocked.error


# --- loopwatch's own spans, round-tripped through the real SDK and OTLP encoder ----------


def _hex_ids(value: Any) -> Any:
    """Generic protobuf JSON has base64 ids; OTLP/JSON has hex ones (OTLP spec)."""
    if isinstance(value, dict):
        return {
            k: base64.b64decode(v).hex()
            if k in ("traceId", "spanId", "parentSpanId")
            else _hex_ids(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_hex_ids(v) for v in value]
    return value


def test_loopwatch_spans_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    encoder = pytest.importorskip("opentelemetry.exporter.otlp.proto.common.trace_encoder")
    json_format = pytest.importorskip("google.protobuf.json_format")
    from loopwatch.instrumentation.examples import run_examples
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    outcomes = run_examples(tracer_provider=provider)
    request = json_format.MessageToDict(encoder.encode_spans(exporter.get_finished_spans()))
    half = len(request["resourceSpans"][0]["scopeSpans"][0]["spans"]) // 2
    path = tmp_path / "loopwatch.jsonl"
    # Two requests as JSON Lines, with one run's spans split across them.
    spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    first = {"resourceSpans": [{"scopeSpans": [{"spans": spans[:half]}]}]}
    second = {"resourceSpans": [{"scopeSpans": [{"spans": spans[half:]}]}]}
    path.write_text(json.dumps(_hex_ids(first)) + "\n" + json.dumps(_hex_ids(second)) + "\n")

    result = read_file(path)
    assert result.problems == []
    runs = {r.run_id: r for r in result.trajectories}
    assert set(runs) == {o.run_id for o in outcomes.values()}
    for name, outcome in outcomes.items():
        run = runs[outcome.run_id]
        assert run.format == "otlp_json"
        assert run.recorded_stop == outcome.stop.reason.value, name
        assert run.recorded_stop_kind == "explicit"
        expected = "success" if outcome.stop.reason.value == "completed" else "failure"
        assert run.recorded_outcome == expected
        assert len(_calls(run)) == outcome.usage.tool_attempts + outcome.usage.tool_blocked, name
        assert [s.index for s in run.steps] == list(range(len(run.steps)))
    repeat = next(
        runs[o.run_id] for n, o in outcomes.items() if n.startswith("same lookup 95 times")
    )
    calls = _calls(repeat)
    assert len({c.arguments_json() for c in calls}) == 1
    assert calls[0].observation is not None
    assert calls[0].observation == calls[1].observation


def test_otlp_json_is_read_as_the_collector_reads_it(tmp_path: Path) -> None:
    # One reader: a request the collector refuses whole (400) is one problem, and a
    # loopwatch span no row could be made of is refused, named by its span id.
    good = json.loads(_fixture("otlp_json/genai_agent.json").read_text(encoding="utf-8"))
    refused = {"resourceSpans": [*good["resourceSpans"], "not a resourceSpans object"]}
    orphan_span = {
        "traceId": "1" * 32,
        "spanId": "2" * 16,
        "name": "decide x",
        "attributes": [{"key": "loopwatch.event", "value": {"stringValue": "decision"}}],
    }
    orphan = {"resourceSpans": [{"scopeSpans": [{"spans": [orphan_span]}]}]}
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (refused, good, orphan)), encoding="utf-8")
    result = read_file(path)
    assert [r.run_id for r in result.trajectories] == ["5b8efff798038103d269b633813fc60c"]
    assert [(p.record, p.message) for p in result.problems] == [
        ("line 1", "cannot decode json body: resourceSpans is not an array of objects"),
        ("line 2: resourceSpans[0].scopeSpans[0].spans[8]", MSG_TRACE_ID),
        ("line 2: resourceSpans[0].scopeSpans[0].spans[9]", MSG_MALFORMED_ATTRIBUTES),
        ("line 3: span 2222222222222222", MSG_NO_RUN_ID),
        ("trace 0af7651916cd43dd8448eb211c80319c", "no model-call, tool or agent step spans"),
    ]


def test_otlp_json_without_the_collector_extra_names_it() -> None:
    # The collector's decoder needs protobuf (the collector extra); other formats do not.
    script = (
        "import sys\n"
        "sys.modules['google.protobuf'] = sys.modules['opentelemetry.proto'] = None\n"
        "from loopwatch.replay.importers import read_file\n"
        f"otlp = read_file({str(_fixture('otlp_json/genai_agent.json'))!r})\n"
        "print([(p.record, p.message) for p in otlp.problems], otlp.trajectories)\n"
        f"chat = read_file({str(_fixture('chat/messages.json'))!r})\n"
        "print([r.run_id for r in chat.trajectories])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    otlp, chat = run.stdout.splitlines()
    assert otlp.startswith("[('file', \"reading OTLP/JSON needs the collector extra: ")
    assert "pip install 'loopwatch[collector]'" in otlp and otlp.endswith("] []")
    assert chat == "['messages']"


# --- fuzzing: random and mutated documents never raise ------------------------------------

_KEYS = [
    "simulations",
    "info",
    "tasks",
    "messages",
    "traj",
    "role",
    "content",
    "tool_calls",
    "id",
    "name",
    "arguments",
    "requestor",
    "error",
    "timestamp",
    "usage",
    "cost",
    "reward",
    "reward_info",
    "termination_reason",
    "task_id",
    "trial",
    "function",
    "function_call",
    "tool_call_id",
    "refusal",
    "resourceSpans",
    "scopeSpans",
    "spans",
    "traceId",
    "spanId",
    "attributes",
    "key",
    "value",
    "stringValue",
    "intValue",
    "doubleValue",
    "boolValue",
    "arrayValue",
    "kvlistValue",
    "values",
    "status",
    "code",
    "startTimeUnixNano",
    "loopwatch.run.id",
    "loopwatch.event",
    "loopwatch.step",
    "gen_ai.operation.name",
    "gen_ai.output.messages",
    "openinference.span.kind",
    "parts",
    "type",
]
_WORDS = [
    "assistant",
    "user",
    "tool",
    "function",
    "system",
    "LLM",
    "TOOL",
    "chat",
    "execute_tool",
    "invoke_agent",
    "decision",
    "tool_result",
    "stop",
    "tool_call",
    "text",
    "###STOP###",
    "Error",
    "transfer_to_human_agents",
    "{}",
    "[]",
    '{"a":1}',
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name",
    "2025-08-01T15:00:00",
    "STATUS_CODE_ERROR",
    "5b8efff798038103d269b633813fc60c",
]
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.sampled_from(_WORDS)
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=4), children, max_size=5)
    ),
    max_leaves=25,
)


def _drain(importer: Importer, doc: Document) -> list[Trajectory | ImportProblem]:
    """What :func:`read_file` does with one importer: ValueError is a whole-file problem."""
    assert isinstance(importer.matches(doc), bool)
    try:
        items = list(importer.read(doc))
    except ValueError:
        return []
    assert all(isinstance(i, Trajectory | ImportProblem) for i in items)
    ids = [i.run_id for i in items if isinstance(i, Trajectory)]
    assert len(ids) == len(set(ids)), "run ids must be unique within a file"
    return items


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


_SEEDS = [
    "tau2/telecom_small.json",
    HANDMADE,
    "chat/messages.json",
    "otlp_json/genai_agent.json",
    "otlp_json/loopwatch_repeat.json",
]
_SEED_DATA = {name: json.loads(_fixture(name).read_text()) for name in _SEEDS}
_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(value=_JSON, as_lines=st.booleans())
def test_random_json_never_raises(value: Any, as_lines: bool) -> None:
    if as_lines and isinstance(value, list):
        text = "\n".join(json.dumps(v) for v in value)
    else:
        text = json.dumps(value)
    doc = Document(path=Path("fuzz.json"), text=text)
    for importer in MINE:
        _drain(importer, doc)


@_FUZZ
@given(data=st.data(), seed=st.sampled_from(_SEEDS), new=_JSON)
def test_mutated_fixtures_never_raise(data: st.DataObject, seed: str, new: Any) -> None:
    original = _SEED_DATA[seed]
    paths = list(_paths(original))
    mutated = original
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        path = data.draw(st.sampled_from(paths))
        mutated = _replace(mutated, path, new)
        paths = list(_paths(mutated))
    doc = Document(path=Path(seed), text=json.dumps(mutated))
    for importer in MINE:
        _drain(importer, doc)


@_FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_arbitrary_text_never_raises(text: str) -> None:
    doc = Document(path=Path("fuzz.txt"), text=text)
    for importer in MINE:
        _drain(importer, doc)


def _reflow(value: Any, depth: int, head: int) -> str:
    """``value`` as JSON over many lines, as writers lay it out: pretty-printed, with its
    first ``head`` line breaks and whatever is nested deeper than ``depth`` joined onto one
    line (first lines like ``{"info": {`` or ``{"simulations": [``, one-line records)."""
    out: list[str] = []
    for number, line in enumerate(json.dumps(value, indent=1).split("\n")):
        indent = len(line) - len(line.lstrip(" "))
        # A container opened at ``depth`` closes there: its bracket joins its content.
        nested = indent > depth or (indent == depth and line.lstrip()[:1] in ("]", "}"))
        if out and (nested or number <= head):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out)


@_FUZZ
@given(
    data=st.data(),
    seed=st.sampled_from(_SEEDS),
    depth=st.integers(min_value=1, max_value=4),
    head=st.integers(min_value=0, max_value=4),
)
def test_a_document_cut_anywhere_is_one_problem_naming_its_last_line(
    data: st.DataObject, seed: str, depth: int, head: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    text = _reflow(_SEED_DATA[seed], depth, head)
    # A line, then a place in it: cuts at line ends, where a one-line record ends, are
    # then as likely as any.
    lines = text.split("\n")
    line = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    at = sum(len(x) + 1 for x in lines[:line]) + data.draw(
        st.integers(min_value=0, max_value=len(lines[line]))
    )
    cut = text[: min(max(at, 1), len(text) - 1)]
    path = tmp_path_factory.getbasetemp() / "cut.json"
    path.write_text(cut, encoding="utf-8")
    loaded = read_file(path)
    assert not loaded.trajectories
    [problem] = loaded.problems
    assert problem.record == "file"
    assert problem.message.startswith("invalid JSON: "), problem.message
    assert f": line {cut.count(chr(10)) + 1} column " in problem.message, problem.message
    assert problem.message.endswith(": the file ends before the document does"), problem.message


_LINE_SEEDS = ["chat/records.jsonl", "otlp_json/openinference.jsonl"]


@_FUZZ
@given(data=st.data(), seed=st.sampled_from(_LINE_SEEDS))
def test_json_lines_cut_in_the_last_line_read_like_the_lines_before(
    data: st.DataObject, seed: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    *lines, last = _fixture(seed).read_text(encoding="utf-8").splitlines()
    keep = data.draw(st.integers(min_value=1, max_value=len(last) - 1))
    path = tmp_path_factory.getbasetemp() / "runs.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    before = read_file(path)
    path.write_text("\n".join([*lines, last[:keep]]), encoding="utf-8")
    cut = read_file(path)
    assert cut.trajectories == before.trajectories
    extra = Counter(cut.problems) - Counter(before.problems)
    assert not Counter(before.problems) - Counter(cut.problems)
    [problem] = extra.elements()
    assert problem.record == f"line {len(lines) + 1}"
    assert "JSON" in problem.message, problem.message


def test_deeply_nested_documents_are_problems_not_crashes() -> None:
    deep = "[" * 5000 + '"x"' + "]" * 5000
    texts = ('{"info": {}, "simulations": [' + deep + "]}", "[" * 100_000, deep)
    for text in texts:
        doc = Document(path=Path("deep.json"), text=text)
        for importer in MINE:
            _drain(importer, doc)


def test_reading_the_three_corpus_folders_is_fast(corpus_dir: Path) -> None:
    """A coarse ceiling (well above the ~0.5 s measured) so a quadratic slip shows up."""
    started = time.perf_counter()
    for folder, fmt in OWNER.items():
        _read_folder(corpus_dir / folder, fmt)
    assert time.perf_counter() - started < 5.0
