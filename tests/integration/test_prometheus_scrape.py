"""A real Prometheus (Debian's ``prometheus``) scraping the collector's ``/metrics``.

Proves the exposition is accepted by Prometheus itself (not only by prometheus_client's
parser) and that the names the Grafana dashboards and alert rules query exist with the
documented labels, through Prometheus's HTTP API.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .services import (
    CollectorProcess,
    PrometheusProcess,
    emit_loopwatch_runs,
    start_collector,
    start_prometheus,
)

pytestmark = pytest.mark.timeout(60)

AGENT = "prom"


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    with start_collector(tmp_path) as process:
        yield process


@pytest.fixture
def prometheus(tmp_path: Path, collector: CollectorProcess) -> Iterator[PrometheusProcess]:
    with start_prometheus(tmp_path, collector.metrics_url, interval="1s") as process:
        yield process


def test_prometheus_counts_repeated_action_stops(
    collector: CollectorProcess, prometheus: PrometheusProcess
) -> None:
    """Proves two repeated_action runs sent over OTLP show up in Prometheus as
    ``loopwatch_agent_stops_total{stop_reason="repeated_action"} == 2`` with the agent label,
    and that the steps-since-progress quantile query of the dashboards evaluates."""
    emit_loopwatch_runs(collector.otlp_url, ["repeated_action", "repeated_action"], agent=AGENT)

    result = prometheus.wait_for(
        'loopwatch_agent_stops_total{stop_reason="repeated_action"}',
        lambda r: len(r) == 1 and float(r[0]["value"][1]) == 2.0,
        timeout_seconds=20,
    )
    labels = result[0]["metric"]
    assert labels["agent"] == AGENT and labels["job"] == "loopwatch", labels

    tools = prometheus.query(
        f'sum by (tool, outcome) (loopwatch_tool_calls_total{{agent="{AGENT}"}})'
    )
    counted = {(s["metric"]["tool"], s["metric"]["outcome"]): float(s["value"][1]) for s in tools}
    assert counted == {("lookup_order", "ok"): 4.0, ("lookup_order", "blocked"): 2.0}, counted

    quantile = prometheus.query_response(
        "histogram_quantile(0.5, sum by (le) "
        "(rate(loopwatch_agent_steps_since_progress_bucket[1m])))"
    )
    assert quantile["status"] == "success", quantile
    assert quantile["data"]["resultType"] == "vector"
    assert len(quantile["data"]["result"]) <= 1
