"""The react, toolbench and openhands importers: corpus counts, fixtures, fuzzing.

Corpus tests read ``../shared/corpus`` (skipped when absent) and check the figures the
corpus READMEs state. Interpretations of the README counts, where a count could be
read more than one way:

* ReAct "Actions" are ``Action i`` lines: one tool call per line (packed actions are
  one call, as the environment executed them) plus the ``Finish`` decisions. "Finish"
  and "Halted" are the CORRECT+INCORRECT and HALTED sections (two HALTED runs of the
  base log still end with a ``Finish`` step). The README's "q100 and q102 (halted;
  ``Search["The Guest (2014 American film)"]`` x5)" holds for q100; q102 repeats
  ``Search[The Prince & Me (2004 film)]`` 3 times.
* ToolBench "path-steps" are ``Action`` nodes per root-to-leaf path (tool calls plus
  the ``Finish`` pseudo-call); "identical calls" compare tool name and canonical JSON
  arguments.
* OpenHands "agent actions" are the agent's tool calls plus ``finish``; the agent's
  chat ``message`` actions (three in the runtime trajs) and ``system`` are not counted.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopwatch.replay.importers import (
    Document,
    Importer,
    detect,
    iter_files,
    load_paths,
    read_file,
)
from loopwatch.replay.importers.openhands import IMPORTER as OPENHANDS
from loopwatch.replay.importers.react import IMPORTER as REACT
from loopwatch.replay.importers.react import parse_action
from loopwatch.replay.importers.toolbench import IMPORTER as TOOLBENCH
from loopwatch.replay.trajectory import (
    AGENT,
    ENVIRONMENT,
    FAILURE,
    SUCCESS,
    UNKNOWN,
    USER,
    ImportProblem,
    ToolCall,
    Trajectory,
)

from ...conftest import TESTDATA

FIXTURES = TESTDATA / "trajectories"
MINE: tuple[Importer, ...] = (REACT, TOOLBENCH, OPENHANDS)
OWNER = {"reflexion-hotpotqa-react": "react", "toolbench": "toolbench", "openhands": "openhands"}
REACT_BASE = "ReAct_base__base_react_thought_log.txt"
REACT_REFLEXION = "ReAct_reflexion__100_questions_5_trials.txt"
MULTI_SWE = "evaluation__benchmarks__multi_swe_bench__examples__output.jsonl"
RESOLVER = "tests__unit__resolver__mock_output__output.jsonl"


def _doc(path: Path) -> Document:
    return Document(path=path, text=path.read_bytes().decode("utf-8", errors="replace"))


def _read(paths: Iterable[Path], fmt: str) -> tuple[list[Trajectory], list[ImportProblem]]:
    runs: list[Trajectory] = []
    problems: list[ImportProblem] = []
    for path in paths:
        result = read_file(path, format=fmt)
        runs += result.trajectories
        problems += result.problems
    return runs, problems


def _calls(run: Trajectory) -> list[ToolCall]:
    return [c for s in run.agent_steps for c in s.tool_calls]


def _actions(run: Trajectory) -> int:
    """Agent tool calls plus Finish-type decisions (final or give-up refusal)."""
    return run.agent_tool_calls + sum(
        1 for s in run.agent_steps if s.decision in ("final", "refusal")
    )


def _streaks(items: list[Any]) -> list[tuple[Any, int]]:
    """Maximal runs of equal consecutive items: ``[(item, length), ...]``."""
    out: list[tuple[Any, int]] = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1] = (item, out[-1][1] + 1)
        else:
            out.append((item, 1))
    return out


def _keys(run: Trajectory) -> list[tuple[str, str]]:
    return [(c.name, c.arguments_json()) for c in _calls(run)]


def _longest_repeat(run: Trajectory) -> int:
    return max((n for _, n in _streaks(_keys(run))), default=0)


def _has_abab(run: Trajectory) -> bool:
    keys = _keys(run)
    return any(
        keys[i] == keys[i + 2] and keys[i + 1] == keys[i + 3] and keys[i] != keys[i + 1]
        for i in range(len(keys) - 3)
    )


# ---------------------------------------------------------------- ReAct corpus


@pytest.mark.parametrize(
    ("name", "runs", "actions", "halted", "finish"),
    [(REACT_BASE, 102, 369, 12, 90), (REACT_REFLEXION, 498, 1896, 66, 432)],
)
def test_react_corpus_counts_match_the_readme(
    corpus_dir: Path, name: str, runs: int, actions: int, halted: int, finish: int
) -> None:
    path = corpus_dir / "reflexion-hotpotqa-react" / name
    got, problems = _read([path], "react")
    assert problems == []
    assert len(got) == runs
    assert sum(_actions(r) for r in got) == actions
    stops = Counter((r.recorded_stop, r.recorded_stop_kind) for r in got)
    assert stops == {("halted", "explicit"): halted, ("finish", "explicit"): finish}
    assert len({r.run_id for r in got}) == runs
    for run in got:
        expected = {"CORRECT": SUCCESS, "INCORRECT": FAILURE, "HALTED": FAILURE}
        assert run.recorded_outcome == expected[run.metadata["section"]]
        assert run.steps[0].actor == USER


def test_react_per_trial_counts_match_the_trial_summaries(corpus_dir: Path) -> None:
    path = corpus_dir / "reflexion-hotpotqa-react" / REACT_REFLEXION
    got, _ = _read([path], "react")
    per_trial = Counter(r.metadata["trial"] for r in got)
    assert per_trial == {1: 100, 2: 99, 3: 100, 4: 100, 5: 99}
    summaries = re.findall(
        r"^BEGIN TRIAL (\d+)\nTrial summary: Correct: (\d+), Incorrect: (\d+), Halted: (\d+)",
        path.read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    assert len(summaries) == 5
    by_section = Counter((r.metadata["trial"], r.metadata["section"]) for r in got)
    for trial, correct, incorrect, halted in summaries:
        t = int(trial)
        assert by_section[(t, "CORRECT")] == int(correct)
        assert by_section[(t, "INCORRECT")] == int(incorrect)
        assert by_section[(t, "HALTED")] == int(halted)


def test_react_corpus_loop_runs_are_the_readme_ones(corpus_dir: Path) -> None:
    got, _ = _read(sorted((corpus_dir / "reflexion-hotpotqa-react").glob("*.txt")), "react")
    repeats = {(Path(r.source).name, r.run_id) for r in got if _longest_repeat(r) >= 3}
    assert repeats == {
        (REACT_BASE, "trial1|incorrect|q081"),
        (REACT_BASE, "trial1|halted|q100"),
        (REACT_BASE, "trial1|halted|q102"),
        *(
            (REACT_REFLEXION, run_id)
            for run_id in (
                "trial1|halted|q092",
                "trial1|halted|q095",
                "trial1|halted|q096",
                "trial2|halted|q186",
                "trial4|halted|q393",
                "trial4|halted|q397",
                "trial5|halted|q491",
                "trial5|halted|q496",
                "trial5|incorrect|q480",
            )
        ),
    }
    cycles = {(Path(r.source).name, r.run_id) for r in got if _has_abab(r)}
    assert cycles == {
        (REACT_REFLEXION, run_id)
        for run_id in (
            "trial2|incorrect|q179",
            "trial2|halted|q190",
            "trial3|halted|q295",
            "trial3|halted|q298",
            "trial4|halted|q389",
            "trial5|halted|q487",
        )
    }
    # The README's "(halted; Search["The Guest (2014 American film)"] x5)" describes q100;
    # q102 (also halted) repeats Search[The Prince & Me (2004 film)] 3 times.
    base = {r.run_id: r for r in got if Path(r.source).name == REACT_BASE}
    guest = ("Search", '{"entity":"\\"The Guest (2014 American film)\\""}')
    assert (guest, 5) in _streaks(_keys(base["trial1|halted|q100"]))
    prince = ("Search", '{"entity":"The Prince & Me (2004 film)"}')
    assert (prince, 3) in _streaks(_keys(base["trial1|halted|q102"]))
    assert sum(1 for r in got if r.recorded_stop == "halted") == 78


def test_react_corpus_packed_actions_are_one_call(corpus_dir: Path) -> None:
    got, _ = _read(sorted((corpus_dir / "reflexion-hotpotqa-react").glob("*.txt")), "react")
    packed = [c for r in got for c in _calls(r) if "], Search[" in c.arguments_json()]
    assert packed
    assert all(c.name == "Search" and c.error for c in packed)
    compare = [c for r in got for c in _calls(r) if c.name == "Compare"]
    assert len(compare) == 1 and compare[0].observation is not None
    assert compare[0].observation.startswith("Invalid Action")
    wrapped = [c for r in got for c in _calls(r) if c.observation and "\n" in c.observation]
    assert wrapped


# ---------------------------------------------------------------- ToolBench corpus


def _raw_action_nodes(paths: Iterable[Path]) -> int:
    total = 0
    for path in paths:
        stack = [json.loads(path.read_text(encoding="utf-8"))["tree"]["tree"]]
        while stack:
            node = stack.pop()
            total += node["node_type"] == "Action"
            stack.extend(node["children"])
    return total


def test_toolbench_corpus_counts_match_the_readme(corpus_dir: Path) -> None:
    files = sorted((corpus_dir / "toolbench").glob("*.json"))
    got, problems = _read(files, "toolbench")
    assert problems == []
    assert len({r.source for r in got}) == 13
    assert _raw_action_nodes(files) == 275
    assert len(got) == 130
    assert sum(_actions(r) for r in got) == 626
    assert len({r.run_id for r in got}) == 130
    per_file = {r.source: r.metadata for r in got}
    assert Counter(m["finish_type"] for m in per_file.values()) == {"give_answer": 11, "give_up": 2}
    assert Counter(m["win"] for m in per_file.values()) == {True: 9, False: 4}
    stops = Counter((r.recorded_stop, r.recorded_stop_kind, r.recorded_outcome) for r in got)
    assert stops == {
        ("give_answer", "explicit", SUCCESS): 9,
        ("give_up_and_restart", "explicit", FAILURE): 7,
        ("single_chain_max_step", "inferred", FAILURE): 114,
    }


def test_toolbench_corpus_loop_paths_are_the_readme_ones(corpus_dir: Path) -> None:
    got, _ = _read(sorted((corpus_dir / "toolbench").glob("*.json")), "toolbench")
    loops = [r for r in got if _longest_repeat(r) >= 3]
    assert len(loops) == 14
    by_file = Counter(r.run_id.split("_ChatGPT")[0] for r in loops)
    assert by_file == {"G3_answer__13": 7, "G3_answer__8": 4, "G3_answer__15": 2, "G3_answer__3": 1}
    longest: dict[tuple[str, str], int] = {}
    for run in loops:
        for (name, args), n in _streaks(_keys(run)):
            key = (run.run_id.split("_ChatGPT")[0], name)
            longest[key] = max(longest.get(key, 0), n)
            if run.run_id.startswith("G3_answer__15") and n >= 3:
                assert json.loads(args) == {"query": "specific actor"}
            if run.run_id.startswith("G3_answer__3_") and n >= 3:
                assert json.loads(args) == {}
    streaming = "search_basic_free_for_streaming_availability"
    assert longest[("G3_answer__13", streaming)] == 4
    assert longest[("G3_answer__8", streaming)] == 5
    assert longest[("G3_answer__8", "search_shows_q_query_for_tvmaze")] == 4
    assert longest[("G3_answer__15", "search_people_q_query_for_tvmaze")] == 4
    assert longest[("G3_answer__3", "list_of_cocktails_for_the_cocktail_db")] == 3
    thriller = [
        r for r in loops if r.run_id.startswith("G3_answer__13") and r.run_id.endswith("/path-1")
    ]
    assert thriller and any(c.arguments.get("keyword") == "thriller" for c in _calls(thriller[0]))
    assert not any(_has_abab(r) for r in got)
    same_observations = [
        r
        for r in got
        if max((n for _, n in _streaks([c.observation for c in _calls(r)])), default=0) >= 3
    ]
    assert len(same_observations) == 42


# ---------------------------------------------------------------- OpenHands corpus


def test_openhands_corpus_counts_match_the_readme(corpus_dir: Path) -> None:
    folder = corpus_dir / "openhands"
    got, problems = _read(list(iter_files([folder])), "openhands")
    assert problems == []
    assert len(got) == 9
    assert sum(_actions(r) for r in got) == 142
    split = Counter()
    for run in got:
        name = Path(run.source).name
        split[name if name.endswith(".jsonl") else "runtime trajs"] += _actions(run)
    assert split == {MULTI_SWE: 105, RESOLVER: 26, "runtime trajs": 11}
    stops = Counter((r.recorded_stop, r.recorded_stop_kind) for r in got)
    assert stops == {
        ("finish", "explicit"): 7,
        ("max_iterations", "explicit"): 1,
        ("awaiting_user_input", "inferred"): 1,
    }
    by_id = {r.run_id: r for r in got}
    assert by_id["ponylang__ponyc-4588"].recorded_stop == "max_iterations"
    assert by_id["tests__runtime__trajs__basic_gui_mode"].recorded_stop == "awaiting_user_input"
    assert by_id["ponylang__ponyc-4588"].model == "openai/openrouter-llama-4-maverick"
    assert by_id["ponylang__ponyc-4588"].agent == "CodeActAgent"
    outcomes = Counter(r.recorded_outcome for r in got)
    assert outcomes == {UNKNOWN: 7, SUCCESS: 2}  # the resolver's own verdicts


def test_openhands_corpus_max_iteration_run_is_tool_thrash(corpus_dir: Path) -> None:
    got, _ = _read([corpus_dir / "openhands" / MULTI_SWE], "openhands")
    run = next(r for r in got if r.run_id == "ponylang__ponyc-4588")
    calls = _calls(run)
    names = _streaks([c.name for c in calls])
    assert max(n for _, n in names) == 19
    assert ("str_replace_editor", 19) in names
    assert _longest_repeat(run) < 3
    assert not _has_abab(run)
    spiral = [
        calls[i : i + 3]
        for i in range(len(calls) - 2)
        if len({c.observation for c in calls[i : i + 3]}) == 1
        and len({c.arguments_json() for c in calls[i : i + 3]}) == 3
        and all(c.error and c.name == "execute_bash" for c in calls[i : i + 3])
    ]
    assert len(spiral) == 1
    assert all("make" in c.arguments["command"] for c in spiral[0])
    assert "can't cd to" in (spiral[0][0].observation or "")
    assert calls[-1].error  # apt-get install exits 100 at the cap


def test_detection_claims_each_corpus_file_for_the_right_importer(corpus_dir: Path) -> None:
    checked = Counter()
    for path in iter_files([corpus_dir]):
        doc = _doc(path)
        owner = OWNER.get(path.parent.name)
        claimed = [i.name for i in MINE if i.matches(doc)]
        if owner is None:
            assert claimed == [], path
            continue
        assert claimed == [owner], path
        assert detect(doc).name == owner, path
        checked[owner] += 1
    assert checked == {"react": 2, "toolbench": 13, "openhands": 6}


def test_reading_the_three_corpus_folders_is_fast(corpus_dir: Path) -> None:
    load_paths([FIXTURES])  # import every importer module first
    started = time.perf_counter()
    result = load_paths([corpus_dir / name for name in OWNER])
    elapsed = time.perf_counter() - started
    assert len(result.trajectories) == 600 + 130 + 9
    assert result.problems == []
    assert elapsed < 5.0, f"{elapsed:.2f} s"  # about 0.15-0.3 s measured on 2 cores


# ---------------------------------------------------------------- fixtures


def test_react_fixture_mapping() -> None:
    path = FIXTURES / "react" / "small.txt"
    result = read_file(path)
    assert result.problems == []
    runs = {r.run_id: r for r in result.trajectories}
    assert list(runs) == ["trial1|correct|q001", "trial1|incorrect|q002", "trial1|halted|q003"]
    assert {r.format for r in runs.values()} == {"react"}

    correct = runs["trial1|correct|q001"]
    assert (correct.recorded_outcome, correct.recorded_stop) == (SUCCESS, "finish")
    assert [s.decision for s in correct.steps] == ["message", "tool", "tool", "final"]
    packed, wrapped = _calls(correct)
    assert packed.arguments == {"entity": "Alpha], Search[Beta"} and packed.error
    assert wrapped.observation == (
        "Alpha is a band with four members.\nIt was formed in 1990.\n- It toured widely."
    )
    assert not wrapped.error
    assert correct.steps[-1].text == "Alpha has four members, more than Beta."
    assert correct.metadata["final_answer"] == "Alpha"
    assert correct.metadata["gold_answer"] == "Alpha"

    incorrect = runs["trial1|incorrect|q002"]
    assert (incorrect.recorded_outcome, incorrect.recorded_stop) == (FAILURE, "finish")
    compare, lookup = _calls(incorrect)
    assert (compare.name, compare.arguments, compare.error) == (
        "Compare",
        {"argument": "Gamma and Delta"},
        True,
    )
    assert (lookup.name, lookup.arguments, lookup.error) == ("Lookup", {"keyword": "river"}, True)

    halted = runs["trial1|halted|q003"]
    assert (halted.recorded_outcome, halted.recorded_stop, halted.recorded_stop_kind) == (
        FAILURE,
        "halted",
        "explicit",
    )
    assert halted.metadata["reflections"] == (
        "I searched the same title over and over.",
        "Next time I should try the similar results.",
    )
    assert _longest_repeat(halted) == 3
    assert halted.steps[-1].decision == "message"
    assert halted.steps[-1].text == "I still cannot find it."
    assert all(c.error for c in _calls(halted))


def test_react_malformed_fixture_names_lines_and_keeps_other_runs() -> None:
    path = FIXTURES / "react" / "malformed.txt"
    result = read_file(path)
    assert [(p.record, p.source) for p in result.problems] == [
        ("line 1", str(path)),
        ("line 6", str(path)),
    ]
    assert "trial1|correct|q001" in result.problems[1].message
    assert "Tool[argument]" in result.problems[1].message
    assert [r.run_id for r in result.trajectories] == ["trial1|correct|q002"]
    assert result.trajectories[0].metadata["final_answer"] == "Rome"


def test_toolbench_fixture_mapping() -> None:
    result = read_file(FIXTURES / "toolbench" / "small.json")
    assert result.problems == []
    gave_up, answered = result.trajectories
    assert (gave_up.run_id, answered.run_id) == ("small/path-1", "small/path-2")
    assert gave_up.steps[0] == gave_up.steps[0].__class__(
        index=0, actor=USER, decision="message", text="What is the weather in Paris?"
    )
    assert [s.decision for s in gave_up.steps] == ["message", "tool", "tool", "refusal"]
    assert (gave_up.recorded_stop, gave_up.recorded_outcome) == ("give_up_and_restart", FAILURE)
    assert gave_up.steps[1].text == "I should look up the weather."
    assert gave_up.steps[3].text == "Same result again; I give up on this branch."
    assert [c.arguments for c in _calls(gave_up)] == [{"city": "Paris"}, {"city": "Paris"}]
    assert [s.decision for s in answered.steps] == ["message", "tool", "tool", "final"]
    assert (answered.recorded_stop, answered.recorded_outcome) == ("give_answer", SUCCESS)
    assert answered.steps[-1].text == "It is sunny in Paris."
    assert _calls(answered)[1].arguments == {"city": "Paris", "days": 1}
    assert not any(c.error for c in _calls(answered))


def test_toolbench_malformed_fixture_names_tree_paths() -> None:
    path = FIXTURES / "toolbench" / "malformed.json"
    result = read_file(path)
    assert [(p.source, p.record) for p in result.problems] == [
        (str(path), "tree.tree.children[0]"),
        (str(path), "tree.tree.children[1]"),
    ]
    assert "Observation" in result.problems[1].message
    (run,) = result.trajectories
    assert (run.recorded_stop, run.recorded_stop_kind, run.recorded_outcome) == (
        "single_chain_max_step",
        "inferred",
        FAILURE,
    )
    (call,) = _calls(run)
    assert call.error  # the cut observation's "error" field is read by prefix


def test_openhands_event_list_fixture_mapping() -> None:
    result = read_file(FIXTURES / "openhands" / "events.json")
    assert result.problems == []
    (run,) = result.trajectories
    assert run.run_id == "events"
    assert (run.agent, run.model) == ("CodeActAgent", "test-model")
    assert (run.recorded_stop, run.recorded_stop_kind, run.recorded_outcome) == (
        "finish",
        "explicit",
        UNKNOWN,
    )
    assert [(s.actor, s.decision) for s in run.steps] == [
        (USER, "message"),
        (AGENT, "tool"),
        (ENVIRONMENT, "message"),
        (AGENT, "tool"),
        (AGENT, "final"),
    ]
    both = run.steps[1]
    assert [c.name for c in both.tool_calls] == ["execute_bash", "str_replace_editor"]
    bash, view = both.tool_calls
    assert bash.arguments == {"command": "make", "is_input": False}
    assert (bash.error, bash.call_id) == (True, "call_1")
    assert bash.observation == "make: *** No rule to make target. Stop."
    assert (view.error, view.observation) == (False, "all:\n\tcc main.c")
    assert (both.input_tokens, both.output_tokens, both.text) == (100, 10, "Let me build.")
    assert both.timestamp == pytest.approx(1735689602.0)
    assert run.steps[2].text == "Parameter 'command' is expected to be one of ['view']"
    assert run.steps[3].tool_calls[0].error  # "ERROR:" content of the editor
    assert run.steps[4].text == "The build is fixed."


def test_openhands_jsonl_fixture_runs_and_problems() -> None:
    path = FIXTURES / "openhands" / "runs.jsonl"
    result = read_file(path)
    assert [(p.source, p.record) for p in result.problems] == [
        (str(path), "line 3"),
        (str(path), "line 4"),
        (str(path), "line 5"),
    ]
    assert "invalid JSON" in result.problems[0].message
    assert "history" in result.problems[1].message
    assert "history[1]" in result.problems[2].message
    capped, flat = result.trajectories
    assert capped.run_id == "demo__repo-1"
    assert (capped.recorded_stop, capped.recorded_outcome) == ("max_iterations", FAILURE)
    assert capped.metadata["max_iterations"] == 3
    assert _longest_repeat(capped) == 3
    assert all(c.error for c in _calls(capped))
    assert flat.run_id == "acme/widgets#7"
    assert (flat.recorded_stop, flat.recorded_outcome) == ("finish", FAILURE)
    assert [(s.actor, s.decision) for s in flat.steps] == [
        (USER, "message"),
        (AGENT, "tool"),
        (AGENT, "tool"),
        (AGENT, "message"),
        (AGENT, "final"),
    ]
    run_call, ipython = _calls(flat)
    assert (run_call.name, run_call.arguments, run_call.error) == (
        "run",
        {"command": "touch LICENSE"},
        False,
    )
    assert (ipython.name, ipython.arguments) == (
        "run_ipython",
        {"code": "print(open('LICENSE').read())"},
    )
    assert ipython.observation == "Traceback: FileNotFoundError"


def test_openhands_one_run_object_file_is_one_run(tmp_path: Path) -> None:
    first = (FIXTURES / "openhands" / "runs.jsonl").read_text(encoding="utf-8").splitlines()[0]
    record = json.loads(first)
    path = tmp_path / "one_run.json"
    path.write_text(json.dumps(record, indent=2), encoding="utf-8")
    result = read_file(path)
    assert result.problems == []
    assert [(r.format, r.run_id, r.recorded_stop) for r in result.trajectories] == [
        ("openhands", "demo__repo-1", "max_iterations")
    ]
    del record["instance_id"]
    record["history"] = [42]
    path.write_text(json.dumps(record, indent=2), encoding="utf-8")
    problems = read_file(path, format="openhands").problems
    assert [(p.source, p.record) for p in problems] == [(str(path), "file")]


@pytest.mark.parametrize(
    ("relative", "owner"),
    [
        ("react/small.txt", "react"),
        ("react/malformed.txt", "react"),
        ("toolbench/small.json", "toolbench"),
        ("toolbench/malformed.json", "toolbench"),
        ("openhands/events.json", "openhands"),
        ("openhands/runs.jsonl", "openhands"),
    ],
)
def test_fixtures_are_detected_by_their_importer(relative: str, owner: str) -> None:
    doc = _doc(FIXTURES / relative)
    assert detect(doc).name == owner
    assert [i.name for i in MINE if i.matches(doc)] == [owner]


def test_other_formats_fixtures_are_not_claimed() -> None:
    for path in iter_files([FIXTURES]):
        if path.parent.name in OWNER.values():
            continue
        doc = _doc(path)
        assert [i.name for i in MINE if i.matches(doc)] == [], path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Search[Alpha]", ("Search", "Alpha")),
        ("Search[A], Search[B]", ("Search", "A], Search[B")),
        ("Search[A] and Search[B]", ("Search", "A] and Search[B")),
        ("  Finish[yes]  ", ("Finish", "yes")),
        ("Lookup[]", ("Lookup", "")),
        ("Finish[x]\nmore", None),
        ("I will search", None),
        ("Search [Alpha]", None),
    ],
)
def test_parse_action_follows_the_react_environment(
    text: str, expected: tuple[str, str] | None
) -> None:
    assert parse_action(text) == expected


# ---------------------------------------------------------------- fuzzing

_FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=25,
)
_VOCAB = st.sampled_from(
    [
        "action", "observation", "source", "id", "cause", "args", "extras", "content",
        "tool_call_metadata", "history", "node_type", "children", "description", "tree",
        "error", "timestamp", "function_name", "model_response", "exit_code", "metadata",
    ]
)  # fmt: skip
_VALUE = st.sampled_from(
    [
        "run", "finish", "message", "user", "agent", "environment", "error", "Action",
        "Action Input", "Thought", "Finish", "agent_state_changed", "2025-01-01T00:00:00",
        '{"error": "x"', '{"return_type": "give_answer"}', 1, 0, -1, 10**400, None,
    ]
)  # fmt: skip
_SHAPED = st.recursive(
    _VALUE,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_VOCAB, inner, max_size=6),
    max_leaves=40,
)
_REACT_LINES = [
    "Question: q?", "Thought 1: t", "Action 1: Search[x]", "Action 2: Finish[y]",
    "Action 3: nonsense", "Observation 1: Could not find [x].", "Reflections:",
    "- reflection", "Correct answer: z", "BEGIN TRIAL 2", "#####", "",
    "------------- BEGIN HALTED AGENTS -------------", "Trial summary: Correct: 1",
]  # fmt: skip
_REACT_LINE = st.sampled_from(_REACT_LINES) | st.text(max_size=20)


def _exercise(doc: Document) -> None:
    for importer in MINE:
        started = time.perf_counter()
        assert isinstance(importer.matches(doc), bool)
        try:
            items = list(importer.read(doc))
        except ValueError:
            items = []
        for item in items:
            assert isinstance(item, Trajectory | ImportProblem)
            if isinstance(item, Trajectory):
                assert [s.index for s in item.steps] == list(range(len(item.steps)))
                for call in _calls(item):
                    call.arguments_json()
        assert time.perf_counter() - started < 2.0


@_FUZZ
@given(value=_JSON | _SHAPED, as_lines=st.booleans())
def test_random_json_never_raises(value: Any, as_lines: bool) -> None:
    if as_lines and isinstance(value, list):
        text = "\n".join(json.dumps(v) for v in value)
    else:
        text = json.dumps(value)
    _exercise(Document(path=Path("fuzz.json"), text=text))


@_FUZZ
@given(history=st.lists(_SHAPED, max_size=12), wrap=st.booleans())
def test_random_event_streams_never_raise(history: list[Any], wrap: bool) -> None:
    value: Any = {"instance_id": "x", "history": history} if wrap else history
    _exercise(Document(path=Path("fuzz.json"), text=json.dumps(value)))


@_FUZZ
@given(root=_SHAPED, win=_VALUE)
def test_random_trees_never_raise(root: Any, win: Any) -> None:
    value = {"win": win, "tree": {"tree": root}, "forward_args": {"single_chain_max_step": win}}
    _exercise(Document(path=Path("fuzz.json"), text=json.dumps(value)))


@_FUZZ
@given(lines=st.lists(_REACT_LINE, max_size=40))
def test_random_react_logs_never_raise(lines: list[str]) -> None:
    _exercise(Document(path=Path("fuzz.txt"), text="\n".join(lines)))


@_FUZZ
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_raises(text: str) -> None:
    _exercise(Document(path=Path("fuzz.txt"), text=text))
