"""Runs that did not stop for a loop: an observe-mode detection and a run with no stop.

- A third-party agent is judged in observe mode: the collector records the loop detector
  on a run whose stop stays ``completed``. The Tools page listed no run for its tool (it
  asked for stop reason = detector) while its loop counts named the tool, and the
  Overview showed "Loop stops 1" beside "0 of 2 stops were abnormal".
- A run whose agent process was killed has steps and no stop: the run view said
  "Stopped at step 3" in the chart caption and the steps table.

Both through the collector's API and through a copy of its file.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import streamlit as st

from tests.docs_examples import OBSERVE_RUN_ID, observe_example
from tests.integration.services import poll_until, start_collector

from .test_pages import frame, metrics, no_failure, page, texts

OPEN_RUN = "dash-open-killed"
OBSERVED_TOOL = "get_weather"


# The agent runs in a child process that kills itself once its spans are flushed: the run
# span never ends, as when an agent process dies. Opening the run in this process instead
# left it as the current run of the test session, so every later @agent became its child
# and inherited its tool registry ("unknown tool" in the instrumentation tests).
_KILLED_AGENT = """
import os, signal, sys
from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
from loopwatch.instrumentation.otlp import configure_otlp
from loopwatch.instrumentation.testing import CursorTool

provider = configure_otlp(endpoint=sys.argv[1], set_global=False, schedule_delay_millis=50)
run = Run(
    "killed-agent", Policy.build(), tools={"page": CursorTool()}, run_id=sys.argv[2],
    tracer_provider=provider,
)
run.__enter__()
for i in range(3):
    decision = run.decide(lambda i=i: Decision.tool(ToolCall("page", {"cursor": str(i)})))
    for call in decision.tool_calls:
        run.call_tool(call.name, call.arguments)
provider.force_flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def _open_run(otlp_url: str) -> None:
    """Three steps of a run whose process is killed before its stop: the run span never
    ends."""
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_AGENT, otlp_url, OPEN_RUN],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.fixture(scope="module")
def unstopped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("unstopped")
    with start_collector(tmp) as collector:
        sent = httpx.post(collector.otlp_url, json=observe_example(5), timeout=10)
        assert sent.status_code == 200, sent.text
        _open_run(collector.otlp_url)

        def stored() -> bool:
            runs = {r["run_id"]: r for r in collector.runs()}
            return (
                bool(runs.get(OBSERVE_RUN_ID, {}).get("stop_reason"))
                and runs.get(OPEN_RUN, {}).get("steps") == 3
            )

        poll_until(stored, timeout_seconds=20, what="the observed and the open run stored")
        copy = tmp / "copy"
        copy.mkdir()
        for path in tmp.glob("collector.duckdb*"):
            shutil.copy(path, copy / path.name)
        yield collector.http_url, copy / "collector.duckdb"


@pytest.fixture(params=["api", "db"])
def source(
    request: pytest.FixtureRequest,
    unstopped: tuple[str, Path],
    use_source: Callable[..., None],
) -> str:
    api, db = unstopped
    if request.param == "api":
        use_source(collector=api)
    else:
        use_source(db=db)
    st.cache_data.clear()
    return str(request.param)


def test_tools_lists_the_runs_observe_mode_flagged(source: str) -> None:
    at = page("tools", range="all", tool=OBSERVED_TOOL)
    no_failure(at)
    assert list(frame(at, -1)["run_id"]) == [OBSERVE_RUN_ID]
    assert (
        f"1 run(s) whose loop detection named {OBSERVED_TOOL}: stopped by a loop "
        "detector, or flagged by one in observe mode" in texts(at)
    )


def test_overview_counts_observe_detections_apart_from_stops(source: str) -> None:
    at = page("overview", range="all")
    no_failure(at)
    shown = metrics(at)
    assert shown["Loop detections"] == "1"
    assert "Loop stops" not in shown
    help_text = next(m.help for m in at.metric if m.label == "Loop detections") or ""
    assert "observe mode flagged without stopping them" in help_text
    assert (
        "0 of 1 stops were abnormal; 1 loop detection(s): 0 stopped the run, 1 recorded in "
        "observe mode on runs it did not stop" in texts(at)
    )


def test_run_view_of_a_run_without_a_stop_names_its_last_stored_step(source: str) -> None:
    at = page("run_view", run_id=OPEN_RUN)
    no_failure(at)
    shown = texts(at)
    assert "No stop recorded" in shown
    assert "Stopped at step" not in shown and "stopped at step" not in shown
    assert "Steps before the stop" not in shown
    assert "Last stored steps" in [s.value for s in at.subheader]
    assert "No stop step recorded: step 3 is the last stored step." in shown
    marks = "; ".join(frame(at)["marks"])
    assert "last stored step 3" in marks and "stopped" not in marks
    assert at.number_input(key="run_view_last").label == "Last stored steps"
