"""``loopwatch replay`` through click's ``CliRunner``: formats, ``--out``, exit codes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from loopwatch.cli._commands import cli
from loopwatch.replay.engine import CSV_COLUMNS


def _call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _run(
    run_id: str, calls: list[tuple[str, dict[str, Any], str]], reward: float
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "help me"}]
    for i, (name, args, result) in enumerate(calls):
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [_call(i, name, args)]}
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
    messages.append({"role": "assistant", "content": "All done."})
    return {"id": run_id, "reward": reward, "messages": messages}


@pytest.fixture
def recordings(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    looping = _run("looping", [("get_details", {"id": "L1"}, '{"status": "Active"}')] * 10, 0.0)
    clean = _run("clean", [("search", {"q": str(i)}, f"result {i}") for i in range(3)], 1.0)
    broken = {
        "id": "broken",
        "reward": 1.0,
        "messages": [{"role": "tool", "tool_call_id": "nope", "content": "orphan"}],
    }
    lines = [json.dumps(r) for r in (looping, clean, broken)]
    (folder / "chat.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "notes.bin").write_bytes(b"\x00\x01 not a trajectory")
    return folder


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["replay", *args], catch_exceptions=False)


def test_table_with_the_default_policy(recordings: Path) -> None:
    result = invoke(str(recordings))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "replay-default" in out
    assert "repeated_action@3" in out
    assert "looping" in out and "clean" not in out.split("Runs stopped")[1]
    assert "false stops" in out
    # Import problems name the file and the record, on stderr only.
    errors = result.stderr
    assert "chat.jsonl" in errors and "line 3" in errors
    assert "notes.bin: file: not a recognised trajectory format" in errors
    assert "notes.bin" not in out


def test_json_lines_one_object_per_run_and_policy(recordings: Path) -> None:
    result = invoke(
        str(recordings / "chat.jsonl"),
        "--policy",
        "default",
        "--policy",
        "seed:investigate-readonly",
        "--format",
        "json",
    )
    assert result.exit_code == 0
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 4
    assert [r["policy"] for r in rows] == ["replay-default", "investigate-readonly"] * 2
    loop = rows[0]
    assert loop["run_id"] == "looping"
    assert (loop["stop_reason"], loop["stop_step"], loop["loop_onset_step"]) == (
        "repeated_action",
        3,
        1,
    )
    assert loop["steps_total"] == 11 and loop["calls_saved"] == 8
    assert loop["evidence"]["detector"] == "repeated_action"
    assert loop["recorded_outcome"] == "failure" and loop["false_stop"] is False
    clean = rows[2]
    assert clean["recorded_outcome"] == "success" and clean["stop_reason"] is None


def test_csv_to_a_file(recordings: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.csv"
    result = invoke(str(recordings), "--format", "csv", "--out", str(out))
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "-> " + str(out) in result.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert [r["run_id"] for r in rows] == ["looping", "clean"]
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert rows[0]["stop_reason"] == "repeated_action" and rows[1]["stop_reason"] == ""
    assert json.loads(rows[0]["evidence"])["repetitions"] == 3
    # Was Python's True/False; the cells now read as the JSON format's flag does.
    assert [r["false_stop"] for r in rows] == ["false", "false"]
    as_json = [
        json.loads(line) for line in invoke(str(recordings), "--format", "json").stdout.splitlines()
    ]
    assert [r["false_stop"] for r in rows] == [json.dumps(d["false_stop"]) for d in as_json]


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_out_writes_each_format(recordings: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"report.{fmt}"
    result = invoke(str(recordings), "--format", fmt, "--out", str(out))
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "looping" in out.read_text(encoding="utf-8")


def test_nothing_readable_exits_1(tmp_path: Path) -> None:
    junk = tmp_path / "junk.txt"
    junk.write_text("hello", encoding="utf-8")
    result = invoke(str(junk))
    assert result.exit_code == 1
    assert "junk.txt" in result.stderr and "no run could be read" in result.stderr


def test_bad_policy_exits_2_naming_file_and_key(recordings: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[profiles.x]\nversion = "1"\nrepeat_limit = "three"\n', encoding="utf-8")
    result = invoke(str(recordings), "--policy", str(bad))
    assert result.exit_code == 2
    assert f"{bad}: profiles.x.repeat_limit: must be a number" in result.stderr
    missing = invoke(str(recordings), "--policy", "seed:nope")
    assert missing.exit_code == 2 and "profiles.nope" in missing.stderr


def test_a_policy_directory_is_named_a_directory(recordings: Path, tmp_path: Path) -> None:
    # Was: "no such policy file" for a directory that exists.
    result = invoke(str(recordings), "--policy", str(tmp_path))
    assert result.exit_code == 2
    assert f"{tmp_path}: <file>: is a directory, not a policy file" in result.stderr


def test_a_built_in_profile_name_is_a_policy_as_in_demo(recordings: Path) -> None:
    # Was (new-user trial): `demo --policy investigate-readonly` worked, `replay --policy
    # investigate-readonly` said "no such policy file".
    by_name = invoke(str(recordings), "--policy", "investigate-readonly", "--format", "json")
    by_file = invoke(str(recordings), "--policy", "seed:investigate-readonly", "--format", "json")
    assert by_name.exit_code == 0, by_name.stderr
    assert by_name.stdout == by_file.stdout
    assert {json.loads(line)["policy"] for line in by_name.stdout.splitlines()} == {
        "investigate-readonly"
    }
    unknown = invoke(str(recordings), "--policy", "investigate-readonly-typo")
    assert unknown.exit_code == 2 and "no such policy file" in unknown.stderr


def test_input_format_help_lists_every_importer() -> None:
    # Was: `loopwatch` (the native format) missing from the list.
    from loopwatch.replay.importers import importers

    text = " ".join(CliRunner().invoke(cli, ["replay", "--help"]).output.split())
    listed = text.split("Force one importer (", 1)[1].split(")", 1)[0]
    assert listed.split(", ") == [i.name for i in importers()]


def test_policy_integer_past_a_float_exits_2_with_one_line(
    recordings: Path, tmp_path: Path
) -> None:
    # Was: an OverflowError traceback, exit 1 (math.isfinite on a 400-digit integer).
    huge = tmp_path / "huge.toml"
    huge.write_text(f'[profiles.x]\nversion = "1"\nmax_cost_usd = {"9" * 400}\n')
    result = invoke(str(recordings), "--policy", str(huge))
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"loopwatch replay: {huge}: profiles.x.max_cost_usd: too large for a number,"
        " got a 400-digit integer"
    ]


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke(str(tmp_path / "absent"))
    assert result.exit_code == 2


def test_replay_reads_the_shipped_example_runs() -> None:
    """The demo's own ``loopwatch.trajectory/1`` examples are a replay input too, so a
    user without the corpus has runs to try ``loopwatch replay`` on."""
    from loopwatch.replay.demo import EXAMPLES_DIR

    result = CliRunner().invoke(cli, ["replay", str(EXAMPLES_DIR), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == len(list(Path(EXAMPLES_DIR).glob("*.json"))) == 16
    by_id = {row["run_id"]: row for row in rows}
    assert by_id["example-03"]["stop_reason"] == "repeated_action"
    assert by_id["example-05"]["stop_reason"] == "action_cycle"


def test_table_names_the_budget_dimension(tmp_path: Path) -> None:
    """A failing call retried unchanged is a budget stop on ``action_retries``: the table
    says which budget, per run and in the summary."""
    failing = _run("retrying", [("book", {"seat": "1A"}, "Error: invalid seat")] * 4, 0.0)
    path = tmp_path / "retry.json"
    path.write_text(json.dumps(failing), encoding="utf-8")
    result = CliRunner().invoke(cli, ["replay", str(path)])
    assert result.exit_code == 0, result.output
    assert "budget_exhausted(action_retries)@" in result.stdout
    assert "    action_retries" in result.stdout


def test_empty_folder_says_no_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", str(tmp_path)])
    assert result.exit_code == 1
    assert "no files found" in result.stderr
