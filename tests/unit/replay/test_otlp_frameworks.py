"""Replay reads the seven frameworks' recorded spans as the collector maps them (issue 24,
point 3: one OTLP mapping, no second reader).

Every fixture of ``tests/testdata/frameworks/`` (``<framework>-<tracer>-<agent>.json``,
the truth table of :mod:`tests.unit.collector.test_route_a`) is imported by
``loopwatch replay``'s OTLP/JSON importer and must give what the collector's map stage
gives on the same spans: one trajectory per invocation, named ``support_bot``; the same
tool calls (per tool, with the same arguments and results, content envelopes unwrapped);
one step per model turn (per tool call when the tracer sends no model span); and, under
``loopwatch replay``'s default policy, a ``repeated_action`` stop on each runaway whose
tracer sends tool content, and no stop on any success or paginate run.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from loopwatch.cli._commands import cli
from loopwatch.collector.rows import KIND_TOOL_RESULT
from loopwatch.replay.importers import read_file
from loopwatch.replay.importers._fields import json_or_text
from loopwatch.replay.importers.otlp_json import UNRECORDED
from loopwatch.replay.trajectory import ToolCall, Trajectory

from tests.unit.collector.test_route_a import (
    AGENT,
    CASES,
    FIXTURES,
    TOOLS,
    TRACERS,
    TURNS,
    load,
    route_a,
    summary,
)

IDS = [f"{t}-{a}" for t, a in CASES]


def _one(name: str) -> Trajectory:
    result = read_file(FIXTURES / f"{name}.json", format="otlp_json")
    assert result.problems == []
    (run,) = result.trajectories
    return run


def _calls(run: Trajectory) -> list[ToolCall]:
    return [c for s in run.steps for c in s.tool_calls]


def _content(value: Any) -> str:
    """A call's arguments as canonical JSON (a recorded text stays text)."""
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


@pytest.mark.parametrize(("tracer", "agent"), CASES, ids=IDS)
def test_replay_reads_each_fixture_as_the_collector_maps_it(tracer: str, agent: str) -> None:
    seen = TRACERS[tracer]
    run = _one(f"{tracer}-{agent}")
    mapped = route_a([load(f"{tracer}-{agent}")])
    collector = summary(mapped)
    assert run.agent == AGENT == collector["runs"][0]  # type: ignore[index]
    calls = _calls(run)
    assert Counter(c.name for c in calls) == collector["tools"]
    expected_tools = dict(TOOLS[agent]) if seen.tool_spans else {}
    expected_tools.update(dict.fromkeys(seen.extra_tools, 1))
    assert Counter(c.name for c in calls) == Counter(expected_tools)
    # One step per model turn; with no model span, one per tool call (the collector
    # numbers each call a step of its own).
    steps = TURNS[agent] if seen.model_spans else sum(expected_tools.values())
    assert len(run.steps) == steps
    assert sum(1 for s in run.steps if s.input_tokens is not None) in (0, collector["turns"])
    # The same calls in the same order, with the collector's (unwrapped) results; the
    # arguments the model asked for where its output was recorded, else the collector's.
    rows = [s for s in mapped.steps if s.kind == KIND_TOOL_RESULT]
    rows.sort(key=lambda r: (r.step or 0, r.start_unix_nano))
    assert [(c.name, c.observation) for c in calls] == [(r.tool, r.result) for r in rows]
    for call, row in zip(calls, rows, strict=True):
        theirs = json_or_text(row.arguments)
        if theirs is None and row.result is None:
            assert call.arguments == {UNRECORDED: row.span_id}
        else:
            assert call.arguments in (theirs, *_envelope(theirs)), (call.arguments, theirs)
    if seen.content:
        for call in calls:
            if call.name in TOOLS[agent]:
                assert isinstance(call.arguments, dict)
                assert set(call.arguments) <= {"order_id", "cursor"}, call.arguments
                assert call.observation


def _envelope(theirs: Any) -> tuple[Any, ...]:
    """What the collector keeps of a framework's call envelope and replay reads from the
    model's request instead: smolagents' ``{"args", "kwargs", ...}``, LlamaIndex's
    ``{"kwargs"}``, LangGraph's bare single argument (``"A-1"``)."""
    if isinstance(theirs, dict) and isinstance(theirs.get("kwargs"), dict):
        return (theirs["kwargs"],)
    if isinstance(theirs, str | int):
        return ({"order_id": theirs}, {"cursor": theirs})
    return ()


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """``loopwatch replay --format json`` (default policy) over every fixture, by name."""
    folder = tmp_path_factory.mktemp("frameworks")
    for tracer, agent in CASES:
        shutil.copy(FIXTURES / f"{tracer}-{agent}.json", folder)
    result = CliRunner().invoke(
        cli, ["replay", str(folder), "--format", "json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    by_name = {Path(r["source"]).stem: r for r in rows}
    assert len(by_name) == len(rows) == len(CASES)
    return by_name


@pytest.mark.parametrize(("tracer", "agent"), CASES, ids=IDS)
def test_default_policy_stops_only_the_runaways_it_can_see(
    replayed: dict[str, dict[str, Any]], tracer: str, agent: str
) -> None:
    row = replayed[f"{tracer}-{agent}"]
    assert row["policy"] == "replay-default"
    # A tracer that records no content gives replay nothing to compare (stand-ins,
    # ``UNRECORDED``), as the collector's observe mode flags no loop there either.
    if agent == "runaway" and TRACERS[tracer].content:
        assert row["stop_reason"] == "repeated_action"
        assert row["evidence"]["tool"] == "lookup_order"
        assert row["calls_saved"] > 0
    elif agent == "runaway" and TRACERS[tracer].model_spans:
        # OpenLLMetry's LlamaIndex runaway: seven model turns with nothing recorded, so
        # no loop is matched; no_progress may still end it (it is a real runaway).
        assert row["stop_reason"] in (None, "no_progress"), row
    else:
        assert row["stop_reason"] is None, row


def test_spans_linked_in_a_cycle_are_read_once(tmp_path: Path) -> None:
    """A hostile file whose model spans are each other's parent: read, no endless walk."""

    def span(span_id: str, parent: str) -> dict[str, Any]:
        return {
            "traceId": "ab" * 16,
            "spanId": span_id,
            "parentSpanId": parent,
            "name": "chat m",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
        }

    spans = [span("1" * 16, "2" * 16), span("2" * 16, "1" * 16)]
    path = tmp_path / "cycle.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    result = read_file(path, format="otlp_json")
    assert result.problems == []
    (run,) = result.trajectories
    assert run.steps and all(s.text and s.text.startswith(UNRECORDED) for s in run.steps)
