"""Cardinality: 10,000 distinct agent and tool names keep ``/metrics`` within its bound.

Real collector, ``metrics.top_n_agents = 25`` and ``metrics.top_n_tools = 40``. 10,000
loopwatch-shaped runs are sent, each with its own agent name and tool name: random
Unicode (several scripts, emoji, right-to-left, zero-width and control characters,
quotes, backslashes, newlines) and very long names (every 50th: 1,000 to 20,000 characters). Every run
stops with ``repeated_action`` and evidence naming its tool, so each name reaches
``loopwatch_agent_stops_total``, the two histograms, ``loopwatch_tool_calls_total`` and
``loopwatch_loop_detections_total``. The exposition must parse, hold at most top-N + 1
(``_other``) agent and tool label values, label values of at most 128 characters; a
restart on that file must be ready within 10 s, its counters starting from zero.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.services import CollectorProcess, MetricSamples

from .payloads import PROTOBUF, PbSpan, new_trace_id, protobuf_request
from .support import launch_collector

pytestmark = pytest.mark.timeout(150)

TOP_AGENTS = 25
TOP_TOOLS = 40
RUNS = 10_000
RUNS_PER_REQUEST = 500
CONFIG = f"""
[metrics]
top_n_agents = {TOP_AGENTS}
top_n_tools = {TOP_TOOLS}
"""
ALPHABETS = (
    "abcdefghijklmnopqrstuvwxyz0123456789_-.",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "абвгдежзийклмнопрстуфхцчшщ",
    "日本語中文한국어漢字かなカナ",
    "עברית العربية",
    "😀🤖🔁🛑💥🧪",
    '"\\\n\t\r{}[]=,\u200b\u200d\u202e\x00\x7f',
)


def random_name(rng: random.Random, index: int) -> str:
    """Random text from 1-3 alphabets; every 50th name is 1,000-20,000 characters long."""
    pool = "".join(rng.sample(ALPHABETS, k=rng.randint(1, 3)))
    text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 60)))
    if index % 50 == 0:
        text = (text * (rng.choice((1_000, 5_000, 20_000)) // len(text) + 1))[:20_000]
    return f"{index}:{text}"


def names(seed: int) -> Iterator[tuple[str, str]]:
    rng = random.Random(seed)
    for index in range(RUNS):
        yield random_name(rng, index), random_name(rng, index)


def run_spans(index: int, agent: str, tool: str) -> list[PbSpan]:
    run_id = f"card-{index}"
    trace = new_trace_id()
    common = {"loopwatch.run.id": run_id, "gen_ai.agent.name": agent}
    return [
        PbSpan(
            name=f"execute_tool {tool}",
            trace_id=trace,
            attributes={
                **common,
                "loopwatch.event": "tool_result",
                "loopwatch.step": 1,
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "loopwatch.tool.outcome": "ok",
            },
        ),
        PbSpan(
            name=f"stop {agent}",
            trace_id=trace,
            attributes={
                **common,
                "loopwatch.event": "stop",
                "loopwatch.step": 2,
                "loopwatch.stop.reason": "repeated_action",
                "loopwatch.steps_since_progress": 2,
                "loopwatch.stop.evidence": json.dumps({"tool": tool, "repetitions": 3}),
            },
        ),
        PbSpan(
            name=f"invoke_agent {agent}",
            trace_id=trace,
            attributes={
                **common,
                "gen_ai.operation.name": "invoke_agent",
                "loopwatch.stop.reason": "repeated_action",
            },
        ),
    ]


def check_bounded(metrics: MetricSamples) -> tuple[int, int]:
    agents: set[str] = set()
    tools: set[str] = set()
    for name, labels in metrics.samples:
        values = dict(labels)
        if name.startswith("loopwatch_"):
            assert all(len(v) <= 128 for v in values.values()), (name, values)
        if "agent" in values:
            agents.add(values["agent"])
        if "tool" in values and name in (
            "loopwatch_tool_calls_total",
            "loopwatch_loop_detections_total",
        ):
            tools.add(values["tool"])
    assert len(agents) <= TOP_AGENTS + 1, len(agents)
    assert len(tools) <= TOP_TOOLS + 2, len(tools)  # + _other + "none" (no evidence tool)
    assert "_other" in agents and "_other" in tools
    return len(agents), len(tools)


def _send_all(collector: CollectorProcess) -> None:
    with httpx.Client(timeout=60) as http:
        batch: list[PbSpan] = []
        for index, (agent, tool) in enumerate(names(seed=20261130)):
            batch += run_spans(index, agent, tool)
            if len(batch) >= 3 * RUNS_PER_REQUEST:
                response = http.post(
                    collector.otlp_url,
                    content=protobuf_request(batch),
                    headers={"Content-Type": PROTOBUF},
                )
                assert response.status_code == 200, response.text[:300]
                batch = []
        assert not batch


def test_ten_thousand_names_stay_within_the_label_bound(tmp_path: Path) -> None:
    db = tmp_path / "card.duckdb"
    collector = launch_collector(tmp_path, db_path=db, config=CONFIG)
    try:
        _send_all(collector)
        text = collector.metrics_text()
        metrics = MetricSamples.parse(text)
        agents, tools = check_bounded(metrics)
        assert metrics.total("loopwatch_agent_stops_total") == RUNS
        assert metrics.total("loopwatch_tool_calls_total") == RUNS
        assert metrics.total("loopwatch_loop_detections_total") == RUNS
        series = len(metrics.samples)
        assert len(text.encode()) < 2_000_000, len(text)
        assert collector.stop() == 0, collector.stderr_text()

        collector = launch_collector(tmp_path, db_path=db, config=CONFIG, ready_timeout_seconds=10)
        again = MetricSamples.parse(collector.metrics_text())
        assert again.total("loopwatch_agent_stops_total") == 0
        assert again.total("loopwatch_tool_calls_total") == 0
        assert collector.stop() == 0, collector.stderr_text()
    finally:
        if collector.running:
            collector.kill()
    print(
        f"\ncardinality: {agents} agent values, {tools} tool values, {series} samples, {len(text)} bytes"
    )
