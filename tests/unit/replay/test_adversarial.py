"""Messy real-world input for the offline side: each test keeps an input that broke
``loopwatch replay`` / ``loopwatch demo`` / ``loopwatch up`` in an adversarial review.

Files come from tests/testdata/trajectories re-encoded or cut the way editors, shells and
crashes produce them; servers are real HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import codecs
import csv
import http.server
import io
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from loopwatch.cli import _run
from loopwatch.cli._replay import _width, render_table
from loopwatch.cli._replay import replay as replay_command
from loopwatch.replay import demo
from loopwatch.replay import importers as importers_module
from loopwatch.replay.engine import default_policy, replay, summarize
from loopwatch.replay.importers import decode_text, load_paths, read_file
from loopwatch.replay.importers.native import FORMAT
from loopwatch.replay.trajectory import AGENT, SUCCESS, Step, ToolCall, Trajectory

DATA = Path(__file__).resolve().parents[2] / "testdata" / "trajectories"

# One clean file per line-oriented or whole-document shape.
CLEAN = [
    DATA / "chat" / "messages.json",
    DATA / "react" / "small.txt",
    DATA / "toolbench" / "small.json",
    DATA / "tau2" / "telecom_small.json",
    DATA / "otlp_json" / "genai_agent.json",
]


def _shape(path: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """Runs (id, steps) and problems (record: message) read from ``path``."""
    result = read_file(path)
    problems = [f"{p.record}: {p.message}" for p in result.problems]
    return [(t.run_id, len(t.steps)) for t in result.trajectories], problems


ENCODINGS = {
    "utf8-bom": lambda raw: codecs.BOM_UTF8 + raw,
    # A BOM read as text by a tool that then wrote one of its own.
    "utf8-bom-twice": lambda raw: codecs.BOM_UTF8 * 2 + raw,
    "utf16-bom": lambda raw: raw.decode("utf-8").encode("utf-16"),
    "utf16be-bom": lambda raw: codecs.BOM_UTF16_BE + raw.decode("utf-8").encode("utf-16-be"),
    "utf16le-no-bom": lambda raw: raw.decode("utf-8").encode("utf-16-le"),
    "utf32-bom": lambda raw: raw.decode("utf-8").encode("utf-32"),
    "crlf": lambda raw: raw.replace(b"\n", b"\r\n"),
    "cr-only": lambda raw: raw.replace(b"\n", b"\r"),
    "nul-padding": lambda raw: raw + b"\x00" * 4096,
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("clean", CLEAN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_encodings_and_line_ends_read_like_the_clean_file(
    clean: Path, encoding: str, tmp_path: Path
) -> None:
    # Was: every BOM or UTF-16 file "not a recognised trajectory format" (PowerShell's
    # `>` writes UTF-16), the BOM a stray line in ReAct logs, NUL padding and lone CR
    # line ends the same.
    hostile = tmp_path / clean.name
    hostile.write_bytes(ENCODINGS[encoding](clean.read_bytes()))
    runs, problems = _shape(clean)
    assert runs
    assert _shape(hostile) == (runs, problems)


def test_decode_text_keeps_plain_utf8_and_replaces_bad_bytes() -> None:
    assert decode_text("héllo\n".encode()) == "héllo\n"
    assert decode_text(b"ok \xff\n") == "ok \ufffd\n"
    assert decode_text(b"") == ""
    assert decode_text(b"\x00\x00\x00\x00") == ""


def test_json_lines_with_a_raw_line_separator_inside_a_string(tmp_path: Path) -> None:
    # JSON allows U+2028, U+2029 and U+0085 unescaped in strings (json.dumps with
    # ensure_ascii=False writes them); splitting lines on them broke the record in two.
    messages = [
        {"role": "user", "content": "first\u2028second\u2029third\x85fourth\x0cfifth"},
        {"role": "assistant", "content": "done"},
    ]
    path = tmp_path / "records.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "messages": messages}, ensure_ascii=False) + "\n"
            for i in (1, 2)
        ),
        encoding="utf-8",
    )
    result = read_file(path)
    assert not result.problems, [str(p) for p in result.problems]
    assert [t.run_id for t in result.trajectories] == ["r1", "r2"]
    assert result.trajectories[0].steps[0].text == messages[0]["content"]


@pytest.mark.parametrize("clean", CLEAN[2:], ids=lambda p: p.parent.name)
def test_truncated_json_names_the_json_error_not_an_unknown_format(
    clean: Path, tmp_path: Path
) -> None:
    cut = tmp_path / clean.name
    raw = clean.read_bytes()
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    [problem] = read_file(cut).problems
    assert problem.source == str(cut)
    assert problem.message.startswith("invalid JSON: ")
    assert "line " in problem.message and "column " in problem.message
    assert problem.message.endswith(": the file ends before the document does")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty file"),
        (b"  \r\n\t\n", "empty file"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid JSON: JSON nested too deeply"),
    ],
)
def test_empty_and_pathological_files(content: bytes, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    [problem] = read_file(path).problems
    assert problem.message == expected


def test_devices_are_refused_and_pipes_are_read(tmp_path: Path) -> None:
    # A device would be read forever (/dev/zero) or block; process substitution
    # (`loopwatch replay <(zcat runs.json.gz)`) is a pipe and must work.
    [problem] = read_file("/dev/null").problems
    assert problem.message == "not a regular file"
    fifo = tmp_path / "runs.json"
    os.mkfifo(fifo)
    content = (DATA / "chat" / "messages.json").read_bytes()

    def feed() -> None:
        with fifo.open("wb") as writer:
            writer.write(content)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    result = read_file(fifo)
    writer.join(timeout=5)
    assert [t.run_id for t in result.trajectories] == ["runs"]


def test_folder_walk_skips_dangling_links_fifos_and_directories_named_like_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "run.json").mkdir()
    (tmp_path / "dangling.json").symlink_to(tmp_path / "missing.json")
    os.mkfifo(tmp_path / "pipe.json")  # never opened: reading it would block
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "loop").symlink_to(tmp_path)  # a symlink loop
    (tmp_path / "sub" / "ok.json").write_bytes((DATA / "chat" / "messages.json").read_bytes())
    loaded = load_paths([tmp_path])
    assert [t.run_id for t in loaded.trajectories] == ["ok"]
    assert not loaded.problems


def _native(runs: list[dict[str, Any]]) -> str:
    return json.dumps({"format": FORMAT, "runs": runs})


def _loop_run(run_id: str, outcome: str, repeats: int) -> dict[str, Any]:
    call = {"name": "lookup", "arguments": {"id": 1}, "observation": "same"}
    steps: list[dict[str, Any]] = [
        {"actor": "agent", "decision": "tool", "tool_calls": [call]} for _ in range(repeats)
    ]
    steps.append({"actor": "agent", "decision": "final", "text": "ok"})
    return {"run_id": run_id, "recorded_outcome": outcome, "steps": steps}


def test_importer_failure_keeps_earlier_runs_and_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tmp_path / "a.json"
    good.write_text(_native([_loop_run("x", "failure", 1)]), encoding="utf-8")
    bad = tmp_path / "b.json"
    bad.write_text(_native([_loop_run("y", "failure", 1)]), encoding="utf-8")
    native = importers_module.importers()[0]
    real_read = native.read

    def flaky(doc: importers_module.Document) -> Iterator[Any]:
        yield from real_read(doc)
        if doc.path == bad:
            raise KeyError("surprise")

    monkeypatch.setattr(native, "read", flaky)
    loaded = load_paths([tmp_path])
    assert [t.run_id for t in loaded.trajectories] == ["x", "y"]
    [problem] = loaded.problems
    assert problem.source == str(bad)
    assert problem.message == "loopwatch importer failed: KeyError: 'surprise'"


def test_native_tool_calls_not_a_list_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    # Was: TypeError "'float' object is not iterable" out of read_file, ending the CLI.
    run = _loop_run("r", "failure", 2)
    run["steps"][0]["tool_calls"] = float("inf")
    ok = _loop_run("ok", "failure", 1)
    path = tmp_path / "runs.json"
    path.write_text(_native([run, ok]), encoding="utf-8")
    result = read_file(path)
    assert [t.run_id for t in result.trajectories] == ["ok"]
    [problem] = result.problems
    assert (problem.record, problem.message) == ("runs[0].steps[0].tool_calls", "must be a list")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("timestamp", 1.7e12, "1700000000000.0 is not Unix seconds (milliseconds or nanoseconds?)"),
        ("timestamp", -5, "-5 is not Unix seconds"),
        ("output_tokens", -3, "must not be negative, got -3"),
        ("cost_usd", -0.5, "must not be negative, got -0.5"),
    ],
)
def test_native_numbers_out_of_range(key: str, value: float, message: str, tmp_path: Path) -> None:
    run = _loop_run("r", "success", 1)
    run["steps"][0][key] = value
    path = tmp_path / "runs.json"
    path.write_text(_native([run]), encoding="utf-8")
    [problem] = read_file(path).problems
    assert (problem.record, problem.message) == (f"runs[0].steps[0].{key}", message)


def test_native_format_key_after_a_long_runs_list_is_detected(tmp_path: Path) -> None:
    runs = [_loop_run(f"r{i}", "failure", 3) for i in range(40)]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs, "format": FORMAT}), encoding="utf-8")
    result = read_file(path)
    assert not result.problems
    assert len(result.trajectories) == 40


def test_duplicate_run_ids_in_one_file_stay_separate_runs(tmp_path: Path) -> None:
    # Was: results keyed by (source, run_id) merged the two, and the table's "stopped
    # runs" section vanished because the second (unstopped) run overwrote the first.
    path = tmp_path / "dup.json"
    path.write_text(
        _native([_loop_run("same", "failure", 30), _loop_run("same", SUCCESS, 1)]),
        encoding="utf-8",
    )
    result = read_file(path)
    assert [t.run_id for t in result.trajectories] == ["same", "same#2"]
    [problem] = result.problems
    assert problem.message == "duplicate run id, renamed 'same#2'"
    results = replay(result.trajectories, [default_policy()])
    table = render_table(results, summarize(results))
    assert "Runs stopped by a policy (1;" in table


def test_the_table_shows_each_policys_loop_onset_as_the_json_does() -> None:
    """The table's "loop onset" column was the recorded loop's onset (the same for every
    policy, blank where the recording has none) while JSON's ``loop_onset_step`` is the
    policy's: example-06 read 1 against 3, example-02 blank against 1 (a new user's
    trial, 2026-12-02). Each policy's cell now carries its own onset, and the shared
    column is named for what it is."""
    loaded = load_paths([demo.EXAMPLES_DIR])
    results = replay(loaded.trajectories, [default_policy()])
    table = render_table(results, summarize(results))
    header = next(line for line in table.splitlines() if line.startswith("file "))
    assert "recorded loop" in header and "loop onset" not in header
    rows = {line.split()[1]: line for line in table.splitlines() if " example-" in line}
    by_run = {r.run_id: r for r in results if r.stopped}
    assert by_run, "the shipped examples stop under the default policy"
    for run_id, result in by_run.items():
        cell = f"{result.stop_reason}"
        assert cell in rows[run_id]
        if result.loop_onset_step is None:  # a budget or deadline stop: no loop, no onset
            assert rows[run_id].endswith(f"@{result.stop_step}"), rows[run_id]
        else:
            expected = f"@{result.stop_step} onset {result.loop_onset_step}"
            assert expected in rows[run_id], rows[run_id]
    assert by_run["example-06"].loop_onset_step == 3


def test_many_duplicate_run_ids_stay_linear(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    runs = [{"run_id": "same", "steps": []} for _ in range(20_000)]
    path.write_text(_native(runs), encoding="utf-8")
    started = time.monotonic()
    result = read_file(path)
    assert time.monotonic() - started < 5
    assert len({t.run_id for t in result.trajectories}) == 20_000


def _timed_run(times: list[float], outcome: str = SUCCESS) -> Trajectory:
    steps = [
        Step(
            index=i,
            actor=AGENT,
            decision="tool",
            tool_calls=(ToolCall("lookup", {"page": i}, observation=f"page {i}"),),
            timestamp=t,
        )
        for i, t in enumerate(times)
    ]
    steps.append(Step(index=len(steps), actor=AGENT, decision="final", text="ok"))
    return Trajectory("mem", "r", "openhands", tuple(steps), recorded_outcome=outcome)


@pytest.mark.parametrize(
    "wild",
    [float("inf"), float("nan"), 1e15, 1.7e12, -1.0],
    ids=["inf", "nan", "1e15", "milliseconds", "negative"],
)
def test_one_wild_timestamp_does_not_make_a_deadline_stop(wild: float) -> None:
    # Importers other than the native one pass numeric timestamps through (OpenHands);
    # one corrupt value jumped the replay clock: a false deadline_exceeded stop.
    for times in ([1.7e9, 1.7e9 + 1, wild, 1.7e9 + 2], [wild, 1.7e9, 1.7e9 + 1]):
        [result] = replay([_timed_run(times)], [default_policy()])
        assert result.stop_reason is None, (times, result.evidence)
    # Real elapsed time still counts.
    [late] = replay([_timed_run([1.7e9, 1.7e9 + 10_000])], [default_policy()])
    assert late.stop_reason == "deadline_exceeded"


# ------------------------------------------------------------------------ output


HOSTILE_IDS = [
    '=HYPERLINK("http://example.invalid")',
    "+cmd",
    "-2+3",
    "@SUM(A1)",
    "日本語のランID" * 10,
    "e\u0301" * 40,
    "line1\nline2\tTAB\x1b[31mRED",
    "\u202eevil",
    "🙂" * 70,
]


@pytest.fixture
def hostile_file(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.json"
    path.write_text(
        _native([_loop_run(rid, "failure", 5) for rid in HOSTILE_IDS]), encoding="utf-8"
    )
    return path


def test_csv_cells_that_start_a_formula_are_quoted_as_text(hostile_file: Path) -> None:
    result = CliRunner().invoke(replay_command, [str(hostile_file), "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    ids = [row["run_id"] for row in rows]
    assert ids[:4] == ["'" + rid for rid in HOSTILE_IDS[:4]]
    assert ids[4:] == HOSTILE_IDS[4:]
    assert all(int(row["steps_total"]) == 6 for row in rows)  # numbers untouched


def test_table_rows_stay_one_line_and_aligned(hostile_file: Path) -> None:
    result = CliRunner().invoke(replay_command, [str(hostile_file)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("file "))
    rows = lines[start + 2 : start + 2 + len(HOSTILE_IDS)]
    assert all(row.startswith("hostile.json") for row in rows), rows
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout
    assert "line1\\nline2\\tTAB\\x1b[31mRED" in result.stdout
    # The verdict column starts at the same terminal column on every row.
    columns = {_width(row[: row.index("repeated_action")]) for row in rows}
    assert len(columns) == 1, rows


def test_usage_errors_fail_before_reading(tmp_path: Path) -> None:
    runner = CliRunner()
    messages = str(DATA / "chat" / "messages.json")
    bogus = runner.invoke(replay_command, [messages, "--input-format", "bogus"])
    assert bogus.exit_code == 2
    assert "'bogus' is not one of loopwatch, tau2" in bogus.output
    missing = tmp_path / "no" / "such" / "dir" / "out.csv"
    out = runner.invoke(replay_command, [messages, "--out", str(missing)])
    assert out.exit_code == 2
    assert f"no directory {missing.parent}" in out.stderr
    assert not missing.parent.exists()


# -------------------------------------------------------------------------- demo


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A collector that answers every request 429 Too Many Requests."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(429)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def refusing_collector() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def test_demo_interrupted_against_a_refusing_collector_returns_at_once(
    refusing_collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: Ctrl-C waited for every queued batch to be retried up to the export timeout
    # (46 s for the corpus against a 429 collector) before the terminal came back.
    real = demo.replay_trajectory
    calls = {"n": 0}

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(demo, "replay_trajectory", interrupted)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo([demo.EXAMPLES_DIR], otlp_url=refusing_collector, timeout_seconds=8.0)
    assert time.monotonic() - started < 4.0


def test_demo_stop_event_drops_the_queue(
    refusing_collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `loopwatch up` sets the event on Ctrl-C, when its collector is going away.
    stop = threading.Event()
    real = demo.replay_trajectory

    def stopping(*args: Any, **kwargs: Any) -> Any:
        outcome = real(*args, **kwargs)
        stop.set()
        return outcome

    monkeypatch.setattr(demo, "replay_trajectory", stopping)
    started = time.monotonic()
    report = demo.run_demo(
        [demo.EXAMPLES_DIR], otlp_url=refusing_collector, stop=stop, timeout_seconds=8.0
    )
    assert report.interrupted and len(report.runs) == 1
    assert time.monotonic() - started < 4.0


# ---------------------------------------------------------------------------- up


def test_up_holds_a_signal_that_comes_while_the_collector_starts() -> None:
    # Was: a SIGINT while the collector opened DuckDB was lost and the collector then
    # served forever. `up` now keeps it and repeats it once the collector handles it.
    received: list[int] = []
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        early = _run._hold_stop_signals_until_serving()
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: only remembered
        deadline = time.monotonic() + 2
        while not early.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert early.is_set()
        # The collector's loop now owns the signals (stand-in: record them).
        signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
        ready = threading.Event()
        ready.set()
        _run._companion(
            ready=ready,
            closing=threading.Event(),
            dashboard=None,
            dashboard_url="http://127.0.0.1:1",
            collector_url="http://127.0.0.1:1",
            otlp_url="http://127.0.0.1:1/v1/traces",
            dashboard_port=1,
            token_file=None,
            token=None,
            demo_options=None,
            early=early,
        )
        deadline = time.monotonic() + 2
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
        assert received == [signal.SIGTERM]
        # A second signal during a start that hangs interrupts as usual.
        early2 = _run._hold_stop_signals_until_serving()
        early2.set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    # Was: `loopwatch replay corpus corpus/tau2-bench` counted the tau2 runs twice.
    sub = tmp_path / "sub"
    sub.mkdir()
    runs = sub / "runs.json"
    runs.write_text(_native([_loop_run("r", "failure", 1)]), encoding="utf-8")
    (tmp_path / "alias.json").symlink_to(runs)
    loaded = load_paths([tmp_path, sub, runs, str(runs)])
    assert [t.source for t in loaded.trajectories] == [str(tmp_path / "alias.json")]


@pytest.mark.parametrize("wild", [float("nan"), float("inf"), -5.0], ids=["nan", "inf", "negative"])
def test_one_wild_cost_neither_disables_nor_trips_the_budget(wild: float) -> None:
    # Was: a NaN cost made the run's total NaN, so the cost ceiling never stopped it; a
    # negative one was a credit; Infinity stopped at once. Now each counts 0.
    costs = [wild, 0.6, 0.6, 0.6]
    steps = tuple(
        Step(
            index=i,
            actor=AGENT,
            decision="tool",
            tool_calls=(ToolCall("lookup", {"page": i}, observation=f"page {i}"),),
            cost_usd=cost,
        )
        for i, cost in enumerate(costs)
    )
    [result] = replay([Trajectory("mem", "r", "tau2", steps)], [default_policy()])
    assert (result.stop_reason, result.stop_dimension, result.stop_step) == (
        "budget_exhausted",
        "cost",
        3,
    )
    assert json.loads(json.dumps(result.to_dict(), allow_nan=False))


@pytest.mark.parametrize("fmt", ["csv", "table", "json"])
def test_a_file_name_that_is_not_utf8_is_written_escaped(fmt: str, tmp_path: Path) -> None:
    # Was: UnicodeEncodeError ("surrogates not allowed") on --out after the replay.
    folder = tmp_path / "in"
    folder.mkdir()
    name = os.fsdecode(b"good\xfe.json")
    (folder / name).write_text(_native([_loop_run("r", "failure", 5)]), encoding="utf-8")
    out = tmp_path / f"report.{fmt}"
    result = CliRunner().invoke(
        replay_command,
        [str(folder), "--format", fmt, "--out", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert "good\\udcfe" in text
