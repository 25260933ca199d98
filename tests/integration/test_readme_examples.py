"""The README's Python examples, run as written against a real collector.

Each ```python block of README.md is run in a fresh interpreter of this environment, with
only the collector's address changed (the README uses the defaults, 127.0.0.1:4318 and
127.0.0.1:4317; the test takes free ports). What the README says each prints is checked,
and the runs are checked in the collector's API.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.services import _child_env, free_port, poll_until, start_collector

README = Path(__file__).resolve().parents[2] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def _run(code: str, cwd: Path) -> str:
    return _run_both(code, cwd)[0]


def _run_both(code: str, cwd: Path) -> tuple[str, str]:
    """Run ``code`` in a child Python; return its stdout and stderr."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_child_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, done.stderr


def test_readme_has_the_examples_this_test_runs() -> None:
    blocks = _blocks()
    assert len(blocks) == 4, "update this test with the README's examples"
    assert "@agent(" in blocks[0] and "with Run(" in blocks[1]
    assert "copy_context" in blocks[2] and "4317" in blocks[3]


def test_parallel_tool_calls_example_guards_both_calls(tmp_path: Path) -> None:
    """The README's thread-pool pattern: both calls guarded, and no "outside any run"
    warning (it would mean the calls ran unguarded); without copy_context, the warning,
    once, and no call guarded."""
    parallel = _blocks()[2]
    log = "import logging\nlogging.basicConfig(format='LOG %(message)s')\n"
    expected = re.search(r"# (\d+): both calls", parallel)
    assert expected is not None and expected.group(1) == "2"
    out, err = _run_both(log + parallel, tmp_path)
    assert out.strip() == "2" and "outside any run" not in err
    bare = parallel.replace("contextvars.copy_context().run, fetch", "fetch")
    assert bare != parallel
    out, err = _run_both(log + bare, tmp_path)
    assert out.strip() == "0" and err.count("LOG tool 'fetch' called outside any run") == 1


def test_guard_examples_print_what_the_readme_says(tmp_path: Path) -> None:
    decorated, with_run, *_ = _blocks()
    with start_collector(tmp_path) as collector:
        code = decorated.replace("http://127.0.0.1:4318/v1/traces", collector.otlp_url)
        assert code != decorated
        out = _run(code, tmp_path)
        assert out.startswith("repeated_action {"), out
        assert "'step_indices'" in out
        run = poll_until(
            lambda: next((r for r in collector.runs() if r["agent"] == "support"), None),
            timeout_seconds=20,
            what="the README agent's run in the API",
        )
        assert run["stop_reason"] == "repeated_action"
    out = _run(with_run, tmp_path)
    expected = re.search(r"# (repeated_action \(1, 2, 3\))", with_run)
    assert expected is not None and out.strip() == expected.group(1)


@pytest.mark.timeout(120)
def test_grpc_exporter_snippet_reaches_a_grpc_collector(tmp_path: Path) -> None:
    *_, snippet = _blocks()
    address = f"127.0.0.1:{free_port()}"
    with start_collector(tmp_path, "--otlp-grpc", address) as collector:
        code = snippet.replace("127.0.0.1:4317", address) + textwrap.dedent(
            """
            from loopwatch.instrumentation import Decision, Run, ToolCall, builtin_profiles

            policy = builtin_profiles()["investigate-readonly"]
            with Run("grpc-readme", policy, tools={"t": lambda: 1}, tracer_provider=provider) as run:
                while True:
                    run.decide(lambda: Decision.tool(ToolCall("t", {})))
                    run.call_tool("t", {})
            provider.shutdown()
            print(run.outcome.stop.reason)
            """
        )
        assert _run(code, tmp_path).strip() == "repeated_action"
        run = poll_until(
            lambda: next((r for r in collector.runs() if r["agent"] == "grpc-readme"), None),
            timeout_seconds=20,
            what="the gRPC run in the API",
        )
        assert run["stop_reason"] == "repeated_action"
