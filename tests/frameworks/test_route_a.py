"""Route A, live: each framework's usual tracer exports OTLP/HTTP to a real collector.

For every framework and tracer of ``tests/frameworks/_route_a.py``, a subprocess runs the
scripted ``runaway``, ``success`` and ``paginate`` agents (scripted models, no network)
with the tracer exporting to a ``loopwatch collector`` started on free loopback ports with
a temporary DuckDB file, and each test reads ``/api/v1/runs`` for one invocation and
checks the issue 25 "Done when" for route A:

- exactly one run per invocation (no phantom run from ``create_agent`` spans, graph
  nodes, workflow wrappers, nested agent spans);
- tool calls counted exactly (nested spans of one call merged; smolagents' own
  ``final_answer`` tool is the final answer, not a call);
- the runaway loop flagged (``observe_reason`` ``repeated_action`` or ``action_cycle``,
  ``loop_tool`` the tool), the succeeding and paginating agents not flagged;
- the agent's real name (``support_bot``, never a method name such as ``X.run``);
- ``loopwatch_agent_stops_total`` up by one per invocation (none for a run with no step).

Where a tracer sends no tool spans (CrewAI under both tracers, LlamaIndex under
OpenLLMetry) or no content (AutoGen's native spans), only what it can show is asserted:
the run still counts exactly once (see :data:`LIMITS`, and ``docs/frameworks.md``).

The framework venvs run this module (``scripts/frameworks.sh``): ``.venv-fw`` the six
frameworks there, ``.venv-crewai`` CrewAI; a framework not installed here is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks import _route_a


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


if not any(_installed(m) for m in _route_a.FRAMEWORK_MODULE.values()):
    pytest.skip("no agent framework installed here", allow_module_level=True)
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
services = pytest.importorskip("tests.integration.services")

ROOT = Path(__file__).resolve().parents[2]

NO_TOOL_SPANS = "no tool spans"
NO_CONTENT = "no tool arguments or results"
LIMITS: dict[tuple[str, str], str] = {
    # CrewAI 1.15: neither OpenInference nor OpenLLMetry emits a span per tool call
    # (agent, task and crew spans only), so route A sees no calls and cannot judge a loop.
    ("crewai", "openinference"): NO_TOOL_SPANS,
    ("crewai", "openllmetry"): NO_TOOL_SPANS,
    # OpenLLMetry for LlamaIndex: the tool call is a generic "FunctionTool.task" span
    # (traceloop.span.kind=task), with no agent or tool span kind and no agent name.
    ("llamaindex", "openllmetry"): NO_TOOL_SPANS,
    # AutoGen's own execute_tool spans carry the tool name and call id, never the
    # arguments or the result: calls are counted, loops cannot be judged.
    ("autogen", "native"): NO_CONTENT,
}
"""(framework, tracer) -> what the tracer does not send; absent: tool spans with content."""

TRACER_MODULE = {
    ("pydantic_ai", "native"): "pydantic_ai",
    ("pydantic_ai", "openinference"): "openinference.instrumentation.pydantic_ai",
    ("openai_agents", "openinference"): "openinference.instrumentation.openai_agents",
    ("openai_agents", "openllmetry"): "opentelemetry.instrumentation.openai_agents",
    ("langgraph", "openinference"): "openinference.instrumentation.langchain",
    ("langgraph", "openllmetry"): "opentelemetry.instrumentation.langchain",
    ("smolagents", "openinference"): "openinference.instrumentation.smolagents",
    ("llamaindex", "openinference"): "openinference.instrumentation.llama_index",
    ("llamaindex", "openllmetry"): "opentelemetry.instrumentation.llamaindex",
    ("autogen", "native"): "autogen_core",
    ("autogen", "openinference"): "openinference.instrumentation.autogen_agentchat",
    ("crewai", "openinference"): "openinference.instrumentation.crewai",
    ("crewai", "openllmetry"): "opentelemetry.instrumentation.crewai",
}
"""(framework, tracer) -> the module whose import says the tracer is installed here."""

LOOP_REASONS = ("repeated_action", "action_cycle")
CASES = [
    pytest.param(fw, tracer, scenario, id=f"{fw}-{tracer}-{scenario}")
    for fw, tracer in _route_a.combos()
    for scenario in _route_a.SCENARIOS
]


def _skip_unless_installed(framework: str, tracer: str) -> None:
    if not _installed(_route_a.FRAMEWORK_MODULE[framework]):
        pytest.skip(f"{framework} is not installed in this venv")
    if not _installed(TRACER_MODULE[framework, tracer]):
        pytest.skip(f"{tracer} for {framework} is not installed (scripts/frameworks.sh does)")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real ``loopwatch collector`` for the module (each invocation is its own trace,
    so runs are told apart by trace id)."""
    with services.start_collector(tmp_path_factory.mktemp("route-a")) as running:
        yield running


STOPS_METRIC = "loopwatch_agent_stops_total"
STOPS_COUNTED = "stops counted"
"""Key of the report that holds how much ``loopwatch_agent_stops_total`` rose while the
framework and tracer ran its three scenarios."""


@pytest.fixture(scope="module")
def invocations(
    collector: Any, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], dict[str, Any]]:
    """``(framework, tracer) -> {scenario: [trace ids], STOPS_COUNTED: float}``: runs the
    three scenarios once per framework and tracer, in a subprocess exporting to the
    collector (synchronously: its spans are committed and counted when it exits)."""
    done: dict[tuple[str, str], dict[str, Any]] = {}

    def get(framework: str, tracer: str) -> dict[str, Any]:
        if (framework, tracer) not in done:
            before = collector.metrics().total(STOPS_METRIC)
            report = tmp_path_factory.mktemp("report") / f"{framework}-{tracer}.json"
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tests.frameworks._route_a",
                    "--framework",
                    framework,
                    "--tracer",
                    tracer,
                    "--otlp",
                    collector.otlp_url,
                    "--report",
                    str(report),
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert proc.returncode == 0, f"scripted agents failed:\n{proc.stderr[-4000:]}"
            result = json.loads(report.read_text(encoding="utf-8"))
            result[STOPS_COUNTED] = collector.metrics().total(STOPS_METRIC) - before
            done[framework, tracer] = result
        return done[framework, tracer]

    return get


@pytest.mark.parametrize(("framework", "tracer", "scenario"), CASES)
def test_route_a(
    framework: str,
    tracer: str,
    scenario: str,
    collector: Any,
    invocations: Callable[[str, str], dict[str, Any]],
) -> None:
    """One invocation, as the collector lists it: one run, named, counted, judged."""
    _skip_unless_installed(framework, tracer)
    traces = set(invocations(framework, tracer)[scenario])
    assert traces, "the tracer emitted no span"
    runs = [r for r in collector.runs() if r["trace_id"] in traces]
    summary = [
        {k: r.get(k) for k in ("agent", "tool_calls", "stop_reason", "observe_reason")}
        for r in runs
    ]
    assert len(runs) == 1, f"one invocation must make one run, got {summary}"
    run = runs[0]
    limit = LIMITS.get((framework, tracer))
    if limit == NO_TOOL_SPANS:
        # What is missing: tool spans, so no call is counted and no loop judged; the
        # run still counts once.
        return
    assert run["agent"] == _route_a.AGENT_NAME, summary
    assert run["tool_calls"] == _route_a.TOOL_CALLS[scenario], summary
    assert run["stop_reason"] == "completed", summary
    if limit == NO_CONTENT:
        # What is missing: arguments and results, so every call looks new; no verdict.
        return
    if _route_a.LOOPING[scenario]:
        assert run.get("observe_reason") in LOOP_REASONS, summary
        assert run.get("loop_tool") == "lookup_order", summary
    else:
        assert run.get("observe_reason") is None, summary


@pytest.mark.parametrize(
    ("framework", "tracer"), [pytest.param(*c, id="-".join(c)) for c in _route_a.combos()]
)
def test_route_a_counts_one_stop_per_invocation(
    framework: str,
    tracer: str,
    invocations: Callable[[str, str], dict[str, Any]],
) -> None:
    """``loopwatch_agent_stops_total`` rises by one per invocation, never for a phantom
    run (what on-call alerts read); an invocation whose tracer sends neither a tool nor a
    model span (CrewAI) makes a run with no step, which never counts a stop."""
    _skip_unless_installed(framework, tracer)
    expected = 0 if framework == "crewai" else len(_route_a.SCENARIOS)
    assert invocations(framework, tracer)[STOPS_COUNTED] == expected


def test_fixture_versions_match_the_installed_releases() -> None:
    """The recorded fixtures (tests/testdata/frameworks/) were made with the releases
    installed here; when one moves, ``scripts/record_framework_spans.py`` records them
    again (the collector's unit tests read them)."""
    manifest = json.loads(
        (ROOT / "tests" / "testdata" / "frameworks" / "versions.json").read_text("utf-8")
    )
    from importlib import metadata

    moved = {}
    for key, recorded in manifest.items():
        framework = key.split("-", 1)[0]
        if not _installed(_route_a.FRAMEWORK_MODULE[framework]):
            continue
        for name, version in recorded.items():
            try:
                installed = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
            if installed != version:
                moved[f"{key}: {name}"] = f"recorded {version}, installed {installed}"
    assert not moved, f"record the fixtures again: {moved}"
