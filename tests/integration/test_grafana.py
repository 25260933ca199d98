"""Every query of grafana/ against a real Prometheus scraping a real collector.

A ``loopwatch collector`` (with a canary file) receives real agent runs: ``loopwatch
demo`` replaying the recorded runs shipped in ``replay/examples`` (every stop reason,
through the instrumentation, the SDK and the OTLP/HTTP exporter), the integration
scenarios of ``services.emit_loopwatch_runs``, one span the collector must reject and
one span carrying a canary. Debian's Prometheus scrapes it
every second with ``grafana/alerts/loopwatch.rules.yml`` loaded. Runs are sent twice,
before and after Prometheus's first scrape, so ``rate()`` and ``increase()`` see the
counters grow (a series first seen at N has no increase yet).

Then every dashboard panel query, every template variable and every rule expression is
run through Prometheus's HTTP API (instant and, for panels, range queries) with the
template variables substituted as Grafana would: no query errors, every rule evaluates
with health ``ok``, the core panels return data, and the canary alert fires.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from .services import (
    CollectorProcess,
    PrometheusProcess,
    emit_loopwatch_runs,
    loopwatch_command,
    start_collector,
    start_prometheus,
)

pytestmark = pytest.mark.timeout(120)

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"
RULES = GRAFANA / "alerts" / "loopwatch.rules.yml"
DEMO_RUNS = GRAFANA.parent / "replay" / "examples"
AGENT = "grafana-e2e"
NUDGE_AGENT = "grafana-nudge"
CANARY = "lw-canary-5b1f0c9e27d4"
ALL_STOP_REASONS = {
    "completed",
    "final_unverified",
    "refused",
    "budget_exhausted",
    "deadline_exceeded",
    "repeated_action",
    "action_cycle",
    "repeated_decision",
    "no_progress",
    "cancelled",
    "error",
}


def _lint() -> ModuleType:
    spec = importlib.util.spec_from_file_location("loopwatch_grafana_lint", GRAFANA / "lint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


lint = _lint()


def _demo(otlp_url: str) -> str:
    """``loopwatch demo`` with the recorded runs shipped in ``replay/examples`` (every stop
    reason), through the real instrumentation and OTLP exporter; returns its stdout."""
    done = subprocess.run(
        [*loopwatch_command(), "demo", "--otlp", otlp_url, "--corpus", str(DEMO_RUNS)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _post_spans(otlp_url: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": spans}]}]}
    response = httpx.post(otlp_url, json=body, timeout=10.0)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _span(trace: int, name: str, attributes: dict[str, str]) -> dict[str, Any]:
    now = time.time_ns()
    return {
        "traceId": f"{trace:032x}",
        "spanId": f"{trace:016x}",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(now - 1_000_000),
        "endTimeUnixNano": str(now),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
    }


def _nudged_run(wave: int) -> list[dict[str, Any]]:
    """A loopwatch run whose response ladder warned one ``lookup_order`` call and nudged
    the next, with one nudge recovered and one stopped on its stop span, as NUDGE.md
    spells the attributes (issue 26; built by hand until the guard emits them)."""
    run_id, trace = f"nudge-wave{wave}", 0x9D6E00 + wave
    base = {"loopwatch.run.id": run_id, "gen_ai.agent.name": NUDGE_AGENT}
    rung = {"loopwatch.loop.rung": "1", "loopwatch.loop.detector": "repeated_action"}
    tool = {**base, "loopwatch.event": "tool_result", "gen_ai.tool.name": "lookup_order"}
    nudges = (
        '[{"detector":"repeated_action","tool":"lookup_order","rung":1,"step":2,'
        '"result":"recovered"},{"detector":"repeated_action","tool":"lookup_order",'
        '"rung":2,"step":3,"result":"stopped"}]'
    )
    attrs = [
        ("invoke_agent", {**base, "gen_ai.operation.name": "invoke_agent"}),
        (
            "execute_tool lookup_order",
            {
                **tool,
                **rung,
                "loopwatch.step": "2",
                "loopwatch.tool.outcome": "ok",
                "loopwatch.loop.response": "warn",
            },
        ),
        (
            "execute_tool lookup_order",
            {
                **tool,
                **rung,
                "loopwatch.step": "3",
                "loopwatch.tool.outcome": "nudged",
                "loopwatch.loop.response": "nudge",
            },
        ),
        (
            "stop",
            {
                **base,
                "loopwatch.event": "stop",
                "loopwatch.step": "4",
                "loopwatch.stop.reason": "completed",
                "loopwatch.nudges": nudges,
            },
        ),
    ]
    spans = []
    for index, (name, attributes) in enumerate(attrs):
        span = _span(trace, name, attributes)
        spans.append({**span, "spanId": f"{(trace << 4) + index:016x}"})
    return spans


def _feed(collector: CollectorProcess, wave: int) -> str:
    """One wave of traffic; returns the demo's report."""
    report = _demo(collector.otlp_url)
    _post_spans(collector.otlp_url, _nudged_run(wave))
    emit_loopwatch_runs(
        collector.otlp_url,
        ["repeated_action", "budget_exhausted", "completed"],
        agent=AGENT,
        run_id_prefix=f"wave{wave}",
    )
    rejected = _post_spans(
        collector.otlp_url, [{**_span(1, "bad", {}), "traceId": "not-a-trace-id"}]
    )
    assert rejected["partialSuccess"]["rejectedSpans"] == "1", rejected
    if wave == 2:
        _post_spans(
            collector.otlp_url,
            [_span(0xC0FFEE + wave, "chat", {"gen_ai.prompt": f"password is {CANARY}"})],
        )
    return report


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, str]]:
    tmp_path = tmp_path_factory.mktemp("grafana")
    canaries = tmp_path / "canaries.txt"
    canaries.write_text(f"# planted by the Grafana test\n{CANARY}\n", encoding="utf-8")
    with start_collector(tmp_path, "--canaries", str(canaries)) as collector:
        _feed(collector, 1)
        with start_prometheus(
            tmp_path, collector.metrics_url, interval="1s", rule_files=[RULES]
        ) as prometheus:
            report = _feed(collector, 2)
            stops = collector.metrics().total("loopwatch_agent_stops_total")
            prometheus.wait_for(
                "sum(loopwatch_agent_stops_total)",
                lambda r: len(r) == 1 and float(r[0]["value"][1]) == stops,
                timeout_seconds=20,
            )
            # Recording rules run every second; wait until they have seen the second wave.
            prometheus.wait_for(
                'tool:loopwatch_loop_detections_repeated_action:increase15m{tool="lookup_order"} > 0',
                lambda r: len(r) == 1,
                timeout_seconds=20,
            )
            yield collector, prometheus, report


def _query(prometheus: PrometheusProcess, promql: str) -> list[dict[str, Any]]:
    body = prometheus.query_response(promql)
    assert body.get("status") == "success", (promql, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _query_range(prometheus: PrometheusProcess, promql: str) -> list[dict[str, Any]]:
    end = time.time()
    response = httpx.get(
        f"{prometheus.url}/api/v1/query_range",
        params={"query": promql, "start": end - 60, "end": end, "step": "2"},
        timeout=10.0,
    )
    body = response.json()
    assert body.get("status") == "success", (promql, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(s["value"][1]) for s in result]


def test_demo_covers_every_stop_reason(stack: tuple[Any, Any, str]) -> None:
    """Proves the traffic is representative: the demo's runs end with all eleven reasons."""
    stops = next(line for line in stack[2].splitlines() if line.strip().startswith("stops:"))
    assert {item.split()[0] for item in stops.split(":", 1)[1].split(",")} == ALL_STOP_REASONS


def test_live_exposition_has_every_metric_and_label_the_folder_uses(
    stack: tuple[Any, Any, str],
) -> None:
    """Proves every metric and label named in the dashboards and rules exists in the
    collector's live ``/metrics`` (not only in its code)."""
    collector, _, _ = stack
    catalog = lint.Catalog.from_exposition(collector.metrics_text())
    assert lint.check_folder(catalog) == []


@pytest.mark.parametrize(
    "variables",
    [
        lint.DEFAULT_VARIABLES,
        {**lint.DEFAULT_VARIABLES, "agent": AGENT, "tool": "lookup_order"},
        {**lint.DEFAULT_VARIABLES, "agent": f"support|{AGENT}", "tool": "none|lookup_order"},
    ],
    ids=["all", "one-agent-one-tool", "multi-value"],
)
def test_every_query_runs_without_error(
    stack: tuple[Any, Any, str], variables: dict[str, str]
) -> None:
    """Proves each panel target (instant and range), each template variable
    (``label_values`` through the label values API) and each rule expression is accepted
    by Prometheus, for the All value, one agent/tool, and a multi-value selection."""
    _, prometheus, _ = stack
    queries = lint.folder_queries()
    assert len(queries) >= 40
    for query in queries:
        if query.kind == "variable":
            (label,) = query.labels_used
            response = httpx.get(
                f"{prometheus.url}/api/v1/label/{label}/values",
                params={"match[]": lint.substitute(query.expr, variables)},
                timeout=10.0,
            )
            body = response.json()
            assert body["status"] == "success", (query.source, body)
            assert body["data"], f"{query.source}: no {label} values"
            continue
        promql = lint.substitute(query.expr, variables) if query.kind == "panel" else query.expr
        _query(prometheus, promql)
        if query.kind == "panel" and not query.instant:
            _query_range(prometheus, promql)


def test_every_rule_evaluates_healthy(stack: tuple[Any, Any, str]) -> None:
    """Proves Prometheus loaded every rule of the file and evaluated each without error."""
    _, prometheus, _ = stack
    body = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10.0).json()
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    assert len(rules) == sum(1 for q in lint.folder_queries() if q.kind in ("record", "alert"))
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))


def test_core_panels_return_data(stack: tuple[Any, Any, str]) -> None:
    """Proves the core panels show the traffic: stops by reason (every reason), steps
    since progress (quantiles and heatmap buckets), per-tool loops, blocked calls, the
    recorded ratios, rejections by reason, and variable values."""
    _, prometheus, _ = stack
    panels = {q.source: q for q in lint.folder_queries() if q.kind == "panel"}

    def run(title: str, ref: str = "A", **variables: str) -> list[dict[str, Any]]:
        (query,) = [q for s, q in panels.items() if f"panel {title!r} target {ref}" in s]
        return _query(
            prometheus, lint.substitute(query.expr, {**lint.DEFAULT_VARIABLES, **variables})
        )

    by_reason = run("Stop rate by reason")
    assert {s["metric"]["stop_reason"] for s in by_reason} == ALL_STOP_REASONS
    assert all(v > 0 for v in _values(by_reason)), by_reason
    table = run("Stops by agent and reason in range", agent=AGENT)
    assert {s["metric"]["stop_reason"] for s in table} == {
        "repeated_action",
        "budget_exhausted",
        "completed",
    }

    for ref in ("A", "B", "C"):
        quantile = run("Steps since progress at stop (quantiles)", ref)
        assert len(quantile) == 1 and _values(quantile)[0] >= 0, quantile
    heatmap = run("Steps since progress at stop (heatmap)", __interval="1m")
    assert {s["metric"]["le"] for s in heatmap} >= {"0", "1", "+Inf"}
    assert max(_values(heatmap)) > 0
    steps = run("Steps per run by stop reason (p90)")
    assert {s["metric"]["stop_reason"] for s in steps} == ALL_STOP_REASONS

    loops = run("Loop detections by tool and detector")
    pairs = {(s["metric"]["tool"], s["metric"]["detector"]) for s in loops}
    assert ("lookup_order", "repeated_action") in pairs, pairs
    assert {d for _, d in pairs} == {
        "repeated_action",
        "action_cycle",
        "repeated_decision",
        "no_progress",
    }
    # no_progress names no tool: its series (tool none) are a value of the tool variable.
    (tool_variable,) = [q for q in lint.folder_queries() if q.source.endswith("variable tool")]
    tool_values = httpx.get(
        f"{prometheus.url}/api/v1/label/tool/values",
        params={"match[]": lint.substitute(tool_variable.expr, lint.DEFAULT_VARIABLES)},
        timeout=10.0,
    ).json()["data"]
    assert {"none", "lookup_order"} <= set(tool_values), tool_values
    no_tool = run("Loop detections by tool and detector", tool="none")
    assert ("none", "no_progress") in {
        (s["metric"]["tool"], s["metric"]["detector"]) for s in no_tool
    }, no_tool
    blocked = run("Blocked calls by tool", tool="lookup_order")
    assert len(blocked) == 1 and _values(blocked)[0] > 0, blocked
    error_rate = run("Error rate by tool")
    assert error_rate and all(0 <= v <= 1 for v in _values(error_rate)), error_rate

    ratio = run("Abnormal-stop ratio by agent", agent=AGENT)
    assert len(ratio) == 1 and 0 < _values(ratio)[0] < 1, ratio
    surge = run("Repeated-action detections per tool (15m)", tool="lookup_order")
    assert len(surge) == 1 and _values(surge)[0] > 0, surge
    rejections = run("Rejections by reason")
    # Every known reason is exported from start at 0; only the invalid span was refused.
    assert {s["metric"]["reason"] for s in rejections if max(_values([s])) > 0} == {"invalid_span"}
    assert {s["metric"]["reason"] for s in rejections} >= {"queue_full", "invalid_span"}
    refused = run("Requests refused by reason")
    assert {s["metric"]["reason"] for s in refused} >= {"decode_error", "unauthorized"}
    share = run("Rejected share (5m)")
    assert len(share) == 1 and 0 < _values(share)[0] < 1, share
    assert _values(run("Collector up")) == [1.0]
    recovery = run("Nudge recovery rate by detector (1h)", agent=NUDGE_AGENT)
    assert [s["metric"]["detector"] for s in recovery] == ["repeated_action"], recovery
    assert 0 < _values(recovery)[0] < 1, recovery
    for ref in ("A", "B"):
        ladder = run("Nudges and warnings by tool", ref, agent=NUDGE_AGENT, tool="lookup_order")
        assert len(ladder) == 1, (ref, ladder)
    canaries = run("Canary detections in range")
    assert len(canaries) == 1 and _values(canaries)[0] > 0, canaries


def test_canary_alert_fires_and_collector_down_does_not(
    stack: tuple[Any, Any, str],
) -> None:
    """Proves the alert rules act on live data: the planted canary makes
    LoopWatchCanaryDetected fire (critical, location attribute) while the collector is
    up, so LoopWatchCollectorDown stays silent."""
    _, prometheus, _ = stack
    firing = prometheus.wait_for(
        'ALERTS{alertname="LoopWatchCanaryDetected", alertstate="firing"}',
        lambda r: len(r) >= 1,
        timeout_seconds=20,
    )
    labels = firing[0]["metric"]
    assert labels["severity"] == "critical" and labels["location"] == "attribute", labels
    assert _query(prometheus, 'ALERTS{alertname="LoopWatchCollectorDown"}') == []


# ---------------------------------------------------------------- fleet mode

FLEET_AGENT = "grafana-fleet"
FLEET_CANARY = "lw-canary-8e3a71d2c0f6"


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[CollectorProcess], PrometheusProcess]]:
    """Two collectors (two sidecars), both scraped by one Prometheus as job loopwatch,
    both receiving runs of the same agent and the same canary."""
    tmp_path = tmp_path_factory.mktemp("grafana-fleet")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    canaries = tmp_path / "canaries.txt"
    canaries.write_text(f"{FLEET_CANARY}\n", encoding="utf-8")
    with (
        start_collector(tmp_path / "a", "--canaries", str(canaries)) as first,
        start_collector(tmp_path / "b", "--canaries", str(canaries)) as second,
        start_prometheus(
            tmp_path, first.metrics_url, interval="1s", rule_files=[RULES]
        ) as prometheus,
    ):
        # start_prometheus scrapes one target: add the second and reload (SIGHUP).
        config = prometheus.config_path.read_text(encoding="utf-8")
        one = f'"{urlsplit(first.metrics_url).netloc}"'
        assert config.count(one) == 1, config
        both = f'{one}, "{urlsplit(second.metrics_url).netloc}"'
        prometheus.config_path.write_text(config.replace(one, both), encoding="utf-8")
        prometheus.proc.send_signal(signal.SIGHUP)
        prometheus.wait_for('up{job="loopwatch"} == 1', lambda r: len(r) == 2, timeout_seconds=20)
        # Two waves: a series first seen at N has no rate yet, the second wave gives one.
        for wave in (1, 2):
            for index, collector in enumerate((first, second)):
                emit_loopwatch_runs(
                    collector.otlp_url,
                    ["repeated_action", "completed", "completed"][: index + 2],
                    agent=FLEET_AGENT,
                    run_id_prefix=f"fleet{wave}-{index}",
                )
                if wave == 2:
                    _post_spans(
                        collector.otlp_url,
                        [_span(0xF1EE7 + index, "chat", {"gen_ai.prompt": f"k {FLEET_CANARY}"})],
                    )
            stops = sum(
                c.metrics().total("loopwatch_agent_stops_total", agent=FLEET_AGENT)
                for c in (first, second)
            )
            assert stops == 5 * wave
            prometheus.wait_for(
                f'sum(loopwatch_agent_stops_total{{agent="{FLEET_AGENT}"}})',
                lambda r, n=stops: len(r) == 1 and float(r[0]["value"][1]) == n,
                timeout_seconds=20,
            )
        yield [first, second], prometheus


def test_fleet_dashboards_sum_over_instances_and_filter_by_one(
    fleet: tuple[list[CollectorProcess], PrometheusProcess],
) -> None:
    """Proves fleet mode on a real Prometheus scraping two collectors: the ``instance``
    variable lists both; with All, *Stop rate by reason* draws one series per reason
    (summed over the collectors, not one per collector); with one collector selected, only
    that collector's stops; the recording rules hold one series per (agent, reason)."""
    collectors, prometheus = fleet
    instances = sorted(urlsplit(c.metrics_url).netloc for c in collectors)
    (variable,) = [q for q in lint.folder_queries() if q.source.endswith("variable instance")][:1]
    values = httpx.get(
        f"{prometheus.url}/api/v1/label/instance/values",
        params={"match[]": lint.substitute(variable.expr)},
        timeout=10.0,
    ).json()["data"]
    assert sorted(values) == instances
    (stop_rate,) = [
        q
        for q in lint.folder_queries()
        if q.kind == "panel" and "panel 'Stop rate by reason' target A" in q.source
    ]
    all_collectors = _query(
        prometheus,
        lint.substitute(stop_rate.expr, {**lint.DEFAULT_VARIABLES, "agent": FLEET_AGENT}),
    )
    # Every reason of a seen agent is exported (at 0 before its first stop): once each.
    reasons = [s["metric"]["stop_reason"] for s in all_collectors]
    assert sorted(reasons) == sorted(ALL_STOP_REASONS), reasons
    assert {s["metric"]["stop_reason"] for s in all_collectors if _values([s])[0] > 0} == {
        "completed",
        "repeated_action",
    }
    assert all("instance" not in s["metric"] for s in all_collectors)
    only_first = _query(
        prometheus,
        lint.substitute(
            stop_rate.expr,
            {**lint.DEFAULT_VARIABLES, "agent": FLEET_AGENT, "instance": instances[0]},
        ),
    )
    assert len(only_first) == len(ALL_STOP_REASONS), only_first
    # One collector's rate is below the fleet's: the other's stops are left out (each
    # completed runs in every wave).
    fleet_rate = {s["metric"]["stop_reason"]: _values([s])[0] for s in all_collectors}
    first_rate = {s["metric"]["stop_reason"]: _values([s])[0] for s in only_first}
    assert 0 < first_rate["completed"] < fleet_rate["completed"], (first_rate, fleet_rate)
    recorded = prometheus.wait_for(
        f'agent_stop_reason:loopwatch_agent_stops:increase15m{{agent="{FLEET_AGENT}"}} > 0',
        lambda r: len(r) == 2,
        timeout_seconds=20,
    )
    assert {s["metric"]["stop_reason"] for s in recorded} == {"completed", "repeated_action"}
    assert all("instance" not in s["metric"] for s in recorded)


def test_fleet_canary_pages_once_naming_both_collectors(
    fleet: tuple[list[CollectorProcess], PrometheusProcess],
) -> None:
    """Proves a canary leaked to two collectors fires LoopWatchCanaryDetected once (one
    alert, not one per collector), with both collectors in its ``instances`` annotation."""
    collectors, prometheus = fleet
    names = [urlsplit(c.metrics_url).netloc for c in collectors]

    def canary_alerts() -> list[dict[str, Any]]:
        body = httpx.get(f"{prometheus.url}/api/v1/alerts", timeout=10.0).json()
        return [
            a
            for a in body["data"]["alerts"]
            if a["labels"]["alertname"] == "LoopWatchCanaryDetected" and a["state"] == "firing"
        ]

    # On a loaded machine scrapes and rule evaluations lag: poll until the alert fires
    # and its annotation has seen both collectors' counters.
    deadline = time.monotonic() + 60
    alerts = canary_alerts()
    while time.monotonic() < deadline and not (
        alerts and all(n in alerts[0]["annotations"].get("instances", "") for n in names)
    ):
        time.sleep(1.0)
        alerts = canary_alerts()
    assert len(alerts) == 1, alerts
    listed = alerts[0]["annotations"]["instances"]
    for name in names:
        assert name in listed, listed
