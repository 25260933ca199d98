"""Hostile input for ``loopwatch replay``, second review: each test keeps, in small
hand-made form, an input that gave a wrong result, a crash or a runaway in review.

Inputs are built here (a few lines of JSON each) rather than kept as data files, so
each test shows the shape that broke and nothing resembles a corpus file.
"""

from __future__ import annotations

import codecs
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from loopwatch.cli._replay import replay as replay_command
from loopwatch.collector.decode import MSG_MALFORMED_ATTRIBUTES
from loopwatch.replay.engine import default_policy, replay
from loopwatch.replay.importers import read_file
from loopwatch.replay.trajectory import AGENT, Step, ToolCall, Trajectory


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


def test_tau2_parallel_calls_sharing_an_id_take_their_results_in_order(tmp_path: Path) -> None:
    # Was (helper review, 2026-12-01): the second call with id c1 replaced the first in
    # the pending set, so the first result took it and the second matched nothing: the
    # whole simulation was refused.
    calls = [
        {"id": "c1", "name": "check_status", "arguments": {"job": 1}},
        {"id": "c1", "name": "check_status", "arguments": {"job": 2}},
    ]
    messages = [
        {"role": "user", "content": "check both jobs"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "id": "c1", "content": "running", "error": False},
        {"role": "tool", "id": "c1", "content": "done", "error": False},
        {"role": "assistant", "content": "Both checked."},
    ]
    path = tmp_path / "parallel.json"
    path.write_text(_tau2(_simulation(messages)), encoding="utf-8")
    loaded = read_file(path)
    assert not loaded.problems
    [run] = loaded.trajectories
    pairs = [(c.arguments, c.observation) for s in run.agent_steps for c in s.tool_calls]
    assert pairs == [({"job": 1}, "running"), ({"job": 2}, "done")]


@pytest.mark.parametrize(
    ("turns", "answers", "expected"),
    [
        # one turn, parallel calls with one id: first made, first answered
        ([["a", "b"]], 3, ["a", "b", None]),
        # a call left unanswered in an earlier turn does not take the later turn's result
        ([["old"], ["new"]], 1, ["new"]),
        # ... and is answered once the later turn's calls are
        ([["old"], ["new"]], 3, ["new", "old", None]),
        # the latest turn first, then its parallel calls in order
        ([["x"], ["y", "z"]], 4, ["y", "z", "x", None]),
    ],
)
def test_open_calls_pairing_rule(
    turns: list[list[str]], answers: int, expected: list[str | None]
) -> None:
    from loopwatch.replay.importers._calls import OpenCalls

    open_calls: OpenCalls[str] = OpenCalls()
    for turn in turns:
        open_calls.begin_turn()
        for call in turn:
            open_calls.add("c1", call)
    assert [open_calls.answer("c1") for _ in range(answers)] == expected
    assert open_calls.answer("other") is None and open_calls.answer(None) is None


def test_malformed_toolbench_leaves_count_against_the_caps(tmp_path: Path) -> None:
    # Was (helper review of 5c8d852): only good leaves counted, so 20,000 malformed
    # leaves under a 400-node chain made 20,000 problems, each locating its leaf with the
    # whole chain: an 88 kB file held 96 MB of problem text.
    tree = json.loads(_comb(400, 20_000))
    chain = tree["tree"]["tree"]
    while chain["children"] and isinstance(chain["children"][0], dict):
        last, chain = chain, chain["children"][0]
    last["children"] = [1] * 20_000  # each "child" is not a node
    path = tmp_path / "G1_answer__1_bad.json"
    path.write_text(json.dumps(tree), encoding="utf-8")
    loaded = read_file(path)
    assert not loaded.trajectories
    assert len(loaded.problems) <= 1_001
    assert sum(len(p.record) for p in loaded.problems) < 20_000_000
    summary = loaded.problems[-1]
    assert summary.record == "tree.tree"
    assert "read the first 0 paths and " in summary.message
    assert "malformed nodes, dropped the rest" in summary.message


# ------------------------------------------------- integers too large for a float

HUGE = 10**400  # parses as a Python int; float() and math.isfinite raise OverflowError
DATA = Path(__file__).resolve().parents[2] / "testdata" / "trajectories"


def _tau2_huge(key: str) -> str:
    bad = _simulation(_poll(["a"], ["c1"]), "bad")
    if key == "reward":
        bad["reward_info"] = {"reward": HUGE}
    elif key == "cost":
        bad["messages"][1]["cost"] = HUGE
    else:
        bad["messages"][1]["usage"] = {key: HUGE}
    return _tau2(bad, _simulation(_poll(["x"], ["c1"]), "ok"))


def _chat_huge() -> str:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    return json.dumps(
        [{"id": "bad", "reward": HUGE, "messages": messages}, {"id": "ok", "messages": messages}]
    )


def _native_huge(key: str) -> str:
    bad = {"run_id": "bad", "steps": [{"actor": "agent", "decision": "final", key: HUGE}]}
    ok = {"run_id": "ok", "steps": [{"actor": "agent", "decision": "final"}]}
    return json.dumps({"format": "loopwatch.trajectory/1", "runs": [bad, ok]})


def _openhands_huge() -> str:
    lines = (DATA / "openhands" / "runs.jsonl").read_text(encoding="utf-8").splitlines()
    return "\n".join(
        [lines[0].replace('"prompt_tokens": 100', f'"prompt_tokens": {HUGE}', 1), lines[1]]
    )


def _otlp_huge(value: dict[str, Any]) -> str:
    text = (DATA / "otlp_json" / "genai_agent.json").read_text(encoding="utf-8")
    data = json.loads(text)
    span = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"].append({"key": "loopwatch.cost.usd", "value": value})
    return json.dumps(data)


NUMBER_CASES = [
    # (file name, content, problem record, field named in the message)
    ("t.json", _tau2_huge("prompt_tokens"), "simulations[0]", "messages[1].usage.prompt_tokens"),
    ("t.json", _tau2_huge("completion_tokens"), "simulations[0]", "usage.completion_tokens"),
    ("t.json", _tau2_huge("cost"), "simulations[0]", "messages[1].cost"),
    ("t.json", _tau2_huge("reward"), "simulations[0]", "reward_info.reward"),
    ("c.json", _chat_huge(), "[0]", "reward"),
    ("n.json", _native_huge("input_tokens"), "runs[0].steps[0].input_tokens", ""),
    ("n.json", _native_huge("cost_usd"), "runs[0].steps[0].cost_usd", ""),
    ("n.json", _native_huge("timestamp"), "runs[0].steps[0].timestamp", ""),
    ("o.jsonl", _openhands_huge(), "line 1", "usage.prompt_tokens"),
]


@pytest.mark.parametrize(
    ("name", "content", "record", "field"),
    NUMBER_CASES,
    ids=[f"{c[0]}:{c[3] or c[2]}" for c in NUMBER_CASES],
)
def test_an_integer_too_large_for_a_float_is_a_problem_naming_the_record(
    name: str, content: str, record: str, field: str, tmp_path: Path
) -> None:
    # Was: OverflowError. In tau2, chat and native it aborted the importer (later valid
    # runs of the file lost); in OpenHands and OTLP it reached the replay engine and
    # killed the whole multi-file replay with a traceback.
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    loaded = read_file(path)
    problems = [p for p in loaded.problems if p.record == record]
    assert len(problems) == 1, loaded.problems
    assert field in problems[0].message
    assert "got a 401-digit integer" in problems[0].message
    assert loaded.trajectories, "the file's other runs are still read"
    assert replay(loaded.trajectories, [default_policy()])


@pytest.mark.parametrize("value", [{"doubleValue": HUGE}, {"intValue": str(HUGE)}])
def test_an_otlp_number_too_large_refuses_its_span_as_the_collector_does(
    value: dict[str, Any], tmp_path: Path
) -> None:
    # OTLP/JSON is read by the collector's decoder: the span is refused with its
    # content-free message, named by its place; the file's other spans are still read.
    path = tmp_path / "g.json"
    path.write_text(_otlp_huge(value), encoding="utf-8")
    loaded = read_file(path)
    problems = [p for p in loaded.problems if p.record == "resourceSpans[0].scopeSpans[0].spans[0]"]
    assert [p.message for p in problems] == [MSG_MALFORMED_ATTRIBUTES], loaded.problems
    assert loaded.trajectories, "the file's other runs are still read"
    assert replay(loaded.trajectories, [default_policy()])


def test_engine_counts_an_integer_too_large_for_a_float_as_zero() -> None:
    # Trajectories built in code skip the importers' checks; the replay must not die.
    call = ToolCall("lookup", {"q": 1}, observation="x")
    steps = (
        Step(0, AGENT, "tool", tool_calls=(call,), input_tokens=HUGE, timestamp=HUGE),
        Step(1, AGENT, "final", "done", cost_usd=HUGE),  # type: ignore[arg-type]
    )
    [result] = replay([Trajectory("mem", "r", "tau2", steps)], [default_policy()])
    assert result.stop_reason is None


# ------------------------------------------------------------- JSON Lines


def _lines_file(kind: str) -> list[str]:
    """Three valid records of ``kind`` (one per line), from the hand-made fixtures."""
    if kind == "openhands":
        return (DATA / "openhands" / "runs.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    if kind == "otlp_json":
        one = json.loads((DATA / "otlp_json" / "genai_agent.json").read_text(encoding="utf-8"))
        return [json.dumps(one)]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    return [json.dumps({"id": f"r{i}", "messages": messages}) for i in range(2)]


@pytest.mark.parametrize("kind", ["openhands", "chat", "otlp_json"])
@pytest.mark.parametrize("bad", ['{"id": "cut', '{"id": "a\x01b"}', "not json"])
def test_json_lines_with_a_bad_first_line_reads_the_other_lines(
    kind: str, bad: str, tmp_path: Path
) -> None:
    # Was: a bad *first* line made the whole file refused ("invalid JSON", no run),
    # while the same line second was one problem and the rest imported.
    good = _lines_file(kind)
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join([bad, *good]) + "\n", encoding="utf-8")
    second = tmp_path / "second.jsonl"
    second.write_text("\n".join([good[0], bad, *good[1:]]) + "\n", encoding="utf-8")
    got_first, got_second = read_file(first), read_file(second)
    assert {t.format for t in got_first.trajectories} == {kind}
    assert len(got_first.trajectories) == len(got_second.trajectories) == len(good)
    line_one = [p for p in got_first.problems if p.record.startswith("line 1")]
    assert len(line_one) == 1 and "JSON" in line_one[0].message, got_first.problems


def test_a_pretty_printed_document_is_still_one_document(tmp_path: Path) -> None:
    # The first line is also how JSON Lines is sniffed: a document whose one-line inner
    # objects parse must not turn into "records", valid or cut short.
    runs = [{"run_id": f"r{i}", "steps": []} for i in range(2)]
    text = json.dumps({"format": "loopwatch.trajectory/1", "runs": runs}, indent=1)
    text = text.replace(
        '{\n   "run_id": "r1",\n   "steps": []\n  }', '{"run_id": "r1", "steps": []}'
    )
    whole = tmp_path / "runs.json"
    whole.write_text(text, encoding="utf-8")
    assert [t.run_id for t in read_file(whole).trajectories] == ["r0", "r1"]
    cut = tmp_path / "cut.json"
    assert '\n  {"run_id": "r1", "steps": []}\n' in text
    cut.write_text(text[:-2], encoding="utf-8")  # the closing bracket lost
    loaded = read_file(cut)
    assert not loaded.trajectories
    [problem] = loaded.problems
    assert (problem.record, problem.message.split(":")[0]) == ("file", "invalid JSON")


def _sims() -> list[dict[str, Any]]:
    return [_simulation(_poll(["done"], ["c1"]), f"t{i}") for i in range(3)]


def _one_per_line(values: list[dict[str, Any]]) -> str:
    return ",\n".join(json.dumps(v) for v in values)


# A document over many lines, by its first line. In the last two, each tau2 simulation
# sits on one line: the chat importer would read it as a JSON Lines record.
_DOCUMENTS = {
    "[": lambda: json.dumps(
        [{"id": f"r{i}", "messages": _poll([], [])} for i in range(3)], indent=2
    ),
    "{": lambda: json.dumps({"info": {}, "tasks": [], "simulations": _sims()}, indent=2),
    '{"simulations": [': lambda: (
        '{"simulations": [\n' + _one_per_line(_sims()) + '\n], "info": {}, "tasks": []}\n'
    ),
    '{"info": {': lambda: (
        '{"info": {\n  "num_trials": 1\n}, "tasks": [], "simulations": [\n'
        + _one_per_line(_sims())
        + "\n]}\n"
    ),
}
# Where the file was cut: (the text kept, the offset the decoder stops at).
_CUTS = {
    "before the last ]": lambda t: (t[: t.rindex("]")], len(t[: t.rindex("]")])),
    "inside a string": lambda t: (t[: t.rindex('"user"') + 3], t.rindex('"user"')),
}
# How editors and shells write the file: (text put before it, text to bytes).
_WRAPPINGS: dict[str, tuple[str, Any]] = {
    "plain": ("", str.encode),
    "utf8-bom": ("", lambda t: codecs.BOM_UTF8 + t.encode()),
    "leading blank lines": ("\n\n \t\n  ", str.encode),
    "crlf": ("", lambda t: t.encode().replace(b"\n", b"\r\n")),
}


def _write(path: Path, text: str, wrapping: str) -> str:
    """``text`` written to ``path`` as ``wrapping`` says; the text as the importers see it."""
    prefix, encode = _WRAPPINGS[wrapping]
    path.write_bytes(encode(prefix + text))
    return prefix + text


@pytest.mark.parametrize("wrapping", sorted(_WRAPPINGS))
@pytest.mark.parametrize("first_line", sorted(_DOCUMENTS))
def test_a_multi_line_document_reads_whole(first_line: str, wrapping: str, tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    _write(path, _DOCUMENTS[first_line](), wrapping)
    loaded = read_file(path)
    assert not loaded.problems
    assert len(loaded.trajectories) == 3


@pytest.mark.parametrize("wrapping", sorted(_WRAPPINGS))
@pytest.mark.parametrize("cut", sorted(_CUTS))
@pytest.mark.parametrize("first_line", sorted(_DOCUMENTS))
def test_a_multi_line_document_cut_short_is_one_problem_saying_where(
    first_line: str, cut: str, wrapping: str, tmp_path: Path
) -> None:
    # Was: unless its first line was a lone `{` or `[`, a cut document was sniffed as
    # JSON Lines: its last one-line inner object read as a run and the other lines as
    # "not valid JSON" records, or the file was "not a recognised trajectory format".
    kept, stop = _CUTS[cut](_DOCUMENTS[first_line]())
    path = tmp_path / "cut.json"
    text = _write(path, kept, wrapping)
    stop += len(text) - len(kept)
    loaded = read_file(path)
    assert not loaded.trajectories
    [problem] = loaded.problems
    line = text.count("\n", 0, stop) + 1
    column = stop - text.rfind("\n", 0, stop)
    assert (problem.source, problem.record) == (str(path), "file")
    assert problem.message.startswith("invalid JSON: "), problem.message
    assert f": line {line} column {column} (char " in problem.message, problem.message
    assert problem.message.endswith(": the file ends before the document does")


@pytest.mark.parametrize(
    "format", ["loopwatch", "tau2", "toolbench", "openhands", "otlp_json", "chat"]
)
def test_a_forced_format_on_a_cut_document_names_the_json_error(
    format: str, tmp_path: Path
) -> None:
    # Was: "not JSON or JSON Lines", "not a tau2-bench results object"...: no position.
    text, _ = _CUTS["before the last ]"](_DOCUMENTS['{"info": {']())
    path = tmp_path / "cut.json"
    path.write_text(text, encoding="utf-8")
    [problem] = read_file(path, format=format).problems
    assert problem.record == "file"
    assert problem.message.startswith("invalid JSON: Expecting ',' delimiter: line 7 column 1 ")
    assert read_file(path).problems == [problem]


@pytest.mark.parametrize(
    "last",
    ['{"id": "r9", "mess', '{"id": "r9", "messages": [', "{", '{"id": "r9"'],
)
@pytest.mark.parametrize("wrapping", sorted(_WRAPPINGS))
def test_json_lines_cut_in_the_last_line_keep_the_whole_lines(
    last: str, wrapping: str, tmp_path: Path
) -> None:
    good = _lines_file("chat") + _lines_file("chat")[:1]
    good[2] = good[2].replace('"r0"', '"r2"')
    path = tmp_path / "runs.jsonl"
    text = _write(path, "\n".join([*good, last]), wrapping)
    loaded = read_file(path)
    assert [t.run_id for t in loaded.trajectories] == ["r0", "r1", "r2"]
    [problem] = loaded.problems
    assert problem.record == f"line {text.count(chr(10)) + 1}"
    assert problem.message.startswith("not valid JSON: "), problem.message


def test_json_lines_with_a_first_line_cut_between_tokens_reads_the_other_lines(
    tmp_path: Path,
) -> None:
    # The decoder reads such a line on into the next ones, as it does a document; two
    # adjacent whole lines cannot occur in one JSON document, so the file is JSON Lines.
    path = tmp_path / "runs.jsonl"
    path.write_text('{"id": "r9", "messages": [\n' + "\n".join(_lines_file("chat")), "utf-8")
    loaded = read_file(path)
    assert [t.run_id for t in loaded.trajectories] == ["r0", "r1"]
    [problem] = loaded.problems
    assert problem.record == "line 1"


def test_a_long_cut_document_is_not_parsed_line_by_line(tmp_path: Path) -> None:
    """A coarse ceiling (about 0.3 s measured; parsing each of the 500,000 lines took
    about 4 s) so that telling a document from JSON Lines stays one pass or two."""
    path = tmp_path / "cut.json"
    path.write_text("{\n" + '"k": [1, "x"],\n' * 500_000, encoding="utf-8")
    started = time.perf_counter()
    [problem] = read_file(path).problems
    assert time.perf_counter() - started < 2.0
    assert problem.message.startswith("invalid JSON: ")
    assert ": line 500002 column 1 " in problem.message


_TOO_LONG = "1" * 5000  # past int's 4,300-digit limit: ValueError without a position
_TOO_DEEP = "[" * 5000 + "]" * 5000  # RecursionError


@pytest.mark.parametrize(
    ("first", "runs", "problem"),
    [
        (f'{{"id": {_TOO_LONG}, "messages": []}}', ["r0"], "line 1"),
        (f'{{"id": {_TOO_DEEP}, "messages": []}}', ["r0"], "line 1"),
        (f'{{"id": "x", "messages": [{_TOO_LONG},', [], "file"),
        # Too deep to tell where it ends: taken for a bad record, as a line that deep is.
        (f'{{"id": "x", "messages": [{_TOO_DEEP},', ["r0"], "line 1"),
    ],
    ids=["long int record", "deep record", "long int document", "deep document"],
)
def test_json_lines_sniff_without_a_decoder_position(
    first: str, runs: list[str], problem: str, tmp_path: Path
) -> None:
    # Was, while the sniff was written: a ValueError out of read_file. Only the decoder
    # says where the first value ends, and these two raise without saying it.
    path = tmp_path / "runs.jsonl"
    path.write_text(first + "\n" + _lines_file("chat")[0], encoding="utf-8")
    loaded = read_file(path)
    assert [t.run_id for t in loaded.trajectories] == runs
    assert [p.record for p in loaded.problems] == [problem], loaded.problems


# ------------------------------------------------- files that hold no run


def test_forced_openhands_on_a_list_that_is_not_events_is_a_file_problem(
    tmp_path: Path,
) -> None:
    # Was: `--input-format openhands` on a tau-bench list gave one empty run, exit 0.
    path = tmp_path / "tau.json"
    path.write_text(_chat_huge().replace(str(HUGE), "1.0"), encoding="utf-8")
    result = CliRunner().invoke(
        replay_command, [str(path), "--input-format", "openhands", "--format", "json"]
    )
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert f"{path}: file: not an OpenHands event list" in result.stderr


@pytest.mark.parametrize(
    ("content", "fmt", "message"),
    [
        ('{"info": {}, "simulations": []}', None, "no runs in this tau2 file"),
        ("[]", "chat", "no runs in this chat file"),
        ("[]", "openhands", "not an OpenHands event list"),
    ],
)
def test_a_file_with_no_run_is_named(
    content: str, fmt: str | None, message: str, tmp_path: Path
) -> None:
    # Was: "no run could be read from 1 file(s)" and no word on which file, or why.
    path = tmp_path / "empty.json"
    path.write_text(content, encoding="utf-8")
    loaded = read_file(path, format=fmt)
    assert not loaded.trajectories
    assert [(p.source, p.record) for p in loaded.problems] == [(str(path), "file")]
    assert loaded.problems[0].message.startswith(message)


# ------------------------------------------------------------------ loop onset


def _polls(*observations: str | None) -> Trajectory:
    steps = tuple(
        Step(i, AGENT, "tool", tool_calls=(ToolCall("get_order", {"id": 42}, observation=obs),))
        for i, obs in enumerate(observations)
    )
    return Trajectory("mem", "r", "tau2", (*steps, Step(len(steps), AGENT, "final", "ok")))


@pytest.mark.parametrize(
    "refused",
    ['{"status": "shipped"}', None, '{"status": "pending"}'],
    ids=["changed", "missing (a blocked call recorded live)", "unchanged"],
)
def test_repeated_action_onset_is_the_first_step_of_the_evidence(refused: str | None) -> None:
    # Was: onset compared the refused call's *recorded* observation, which the guard
    # never saw (the call was refused before it ran): onset 3, evidence steps [1, 2, 3].
    pending = '{"status": "pending"}'
    [result] = replay([_polls(pending, pending, refused)], [default_policy()])
    assert (result.stop_reason, result.stop_step) == ("repeated_action", 3)
    assert result.evidence is not None and result.evidence["step_indices"] == [1, 2, 3]
    assert result.loop_onset_step == 1


# ------------------------------------------------------------ ToolBench trees


def _comb(spine: int, leaves: int) -> str:
    """A ToolBench tree: a chain of ``spine`` nodes ending in ``leaves`` leaves; every
    leaf's path repeats the whole chain (the review's 1.3 MB file had 400 and 20,000)."""
    leaf = {"node_type": "Thought", "description": "t", "children": []}
    node: dict[str, Any] = {
        "node_type": "Action Input",
        "description": "{}",
        "observation": '{"error": "", "response": "x"}',
        "children": [leaf] * leaves,
    }
    for i in range(spine):
        node = {
            "node_type": "Action" if i % 2 else "Action Input",
            "description": f"tool{i}" if i % 2 else json.dumps({"a": i}),
            "observation": json.dumps({"error": "", "response": str(i)}),
            "children": [node],
        }
    return json.dumps({"win": False, "tree": {"tree": node}, "answer_generation": {"query": "q"}})


@pytest.mark.parametrize(
    ("spine", "leaves", "runs", "message"),
    [
        (2, 1_500, 1_000, "more than 1,000 root-to-leaf paths: read the first 1000 paths"),
        (
            400,
            5_000,
            248,
            "root-to-leaf paths of more than 100,000 nodes in all: read the first 248",
        ),
    ],
)
def test_a_toolbench_tree_expands_into_a_bounded_number_of_runs(
    spine: int, leaves: int, runs: int, message: str, tmp_path: Path
) -> None:
    # Was: every root-to-leaf path became a run, whatever their number: 1.3 MB of JSON
    # (a 400-node chain ending in 20,000 leaves) took 4 minutes and 2 GB to replay.
    path = tmp_path / "G1_answer__1_comb.json"
    path.write_text(_comb(spine, leaves), encoding="utf-8")
    loaded = read_file(path)
    assert len(loaded.trajectories) == runs
    assert sum(len(t.steps) for t in loaded.trajectories) <= 100_000
    [problem] = loaded.problems
    assert problem.record == "tree.tree"
    assert problem.message.startswith(message)
