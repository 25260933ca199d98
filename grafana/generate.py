"""Build the loopwatch Grafana dashboards (``grafana/dashboards/*.json``) from code.

The dashboards are written with Grafana's own builder library, ``grafana-foundation-sdk``
(pinned in the ``dev`` extra; the 10.1 schema build, so the JSON loads in Grafana 10.1
and later). The generated JSON is committed, so loading the dashboards needs no Python;
``tests/unit/test_grafana_static.py`` regenerates it and fails on any drift.

Contracts the tests check:

- every dashboard has a fixed ``uid`` (``loopwatch-overview``, ``loopwatch-tools``,
  ``loopwatch-collector``) and no numeric ``id``;
- the Prometheus data source is the ``${datasource}`` variable (type ``datasource``,
  plugin ``prometheus``); no data source uid is written anywhere;
- queries use only the metric names and labels of DESIGN section 7 (the collector's
  ``collector/metrics.py``) and the recording rules of ``grafana/alerts/loopwatch.rules.yml``;
- fleet mode (DESIGN section 5): every collector serves its own ``/metrics``, so every
  dashboard has an ``instance`` variable, every query selects ``instance=~"$instance"``,
  and panels that aggregate sum over instances (no ``instance`` in their ``by``);
- series by stop reason get the colours of :data:`loopwatch.dashboard.palette.REASON_COLORS`
  as field overrides, so Streamlit and Grafana colour each reason alike.

The building blocks (data source, variables, colour overrides, panel and dashboard
defaults) are in ``grafana/dashboard_blocks.py``; this file holds the dashboards' panels.

Usage::

    .venv/bin/python grafana/generate.py           # rewrite grafana/dashboards/*.json
    .venv/bin/python grafana/generate.py --check   # exit 1 if a file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

# dashboard_blocks.py sits beside this script, which runs as a file (not a package).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dashboard_blocks import (
    ABNORMAL_REASONS,
    ABNORMAL_TEXT,
    AGENT,
    AGENT_TOOL,
    DATASOURCE,
    INSTANCE,
    INSTANCE_VALUES,
    TOOL_VALUES,
    agent_variable,
    datasource_variable,
    instance_variable,
    label_variable,
    new_dashboard,
    query,
    reason_overrides,
    stat_panel,
    table_panel,
    timeseries_panel,
)

__all__ = [
    "ABNORMAL_REASONS",
    "DASHBOARDS",
    "DATASOURCE",
    "INSTANCE_VALUES",
    "TOOL_VALUES",
    "build_all",
    "main",
    "reason_overrides",
    "render",
]

DASHBOARDS_DIR = Path(__file__).resolve().parent / "dashboards"


# ------------------------------------------------------------------- dashboards


def overview() -> db.Dashboard:
    """``loopwatch-overview``: why runs stop, per agent."""
    stops = f"loopwatch_agent_stops_total{{{AGENT}}}"
    ssp = f"loopwatch_agent_steps_since_progress_bucket{{{AGENT}}}"
    steps = f"loopwatch_agent_steps_bucket{{{AGENT}}}"
    return (
        new_dashboard(
            "loopwatch-overview",
            "loopwatch / Overview",
            "Why agent runs stop: stop reasons, abnormal-stop ratio, steps since progress.",
        )
        .with_variable(datasource_variable())
        .with_variable(instance_variable())
        .with_variable(agent_variable("loopwatch_agent_stops_total"))
        .with_row(db.Row("Stops"))
        .with_panel(
            stat_panel(
                "Stops in range",
                "Runs that stopped in the selected time range (every stop reason).",
                query(f"sum(increase({stops}[$__range]))", instant=True),
            )
        )
        .with_panel(
            stat_panel(
                "Abnormal-stop share in range",
                "Share of stops in the selected range whose reason is not completed. "
                + ABNORMAL_TEXT,
                query(
                    f'sum(increase(loopwatch_agent_stops_total{{{AGENT}, stop_reason!="completed"}}'
                    f"[$__range])) / sum(increase({stops}[$__range]))",
                    instant=True,
                ),
                unit="percentunit",
            )
        )
        .with_panel(
            stat_panel(
                "Loop detections in range",
                "Loop detections (all detectors, all tools) in the selected range.",
                query(
                    f"sum(increase(loopwatch_loop_detections_total{{{AGENT}}}[$__range]))",
                    instant=True,
                ),
            )
        )
        .with_panel(
            stat_panel(
                "Median steps since progress at stop",
                "Half of the runs stopped within this many steps of their last progress.",
                query(
                    f"histogram_quantile(0.5, sum by (le) (increase({ssp}[$__range])))",
                    instant=True,
                ),
            )
        )
        .with_panel(
            reason_overrides(
                timeseries_panel(
                    "Stop rate by reason",
                    "Stops per second by stop reason (DESIGN section 2). A rise of one reason "
                    "is the first thing to look at when an alert fires.",
                    [
                        query(
                            f"sum by (stop_reason) (rate({stops}[$__rate_interval]))",
                            "{{stop_reason}}",
                        )
                    ],
                    unit="suffix: stops/s",
                    stacked=True,
                )
            )
        )
        .with_panel(
            timeseries_panel(
                "Abnormal-stop ratio by agent",
                "Share of stops other than completed over 15 minutes, summed over the "
                "selected collectors. " + ABNORMAL_TEXT + " With every collector selected "
                "this is the recording rule agent:loopwatch_agent_stops_abnormal:"
                "ratio_rate15m, the input of LoopWatchAbnormalStopRatioHigh.",
                [
                    query(
                        "(sum by (agent) (rate(loopwatch_agent_stops_total"
                        f'{{{AGENT}, stop_reason!="completed"}}[15m])) '
                        f"or sum by (agent) (rate({stops}[15m])) * 0) "
                        f"/ sum by (agent) (rate({stops}[15m]))",
                        "{{agent}}",
                    )
                ],
                unit="percentunit",
                max_value=1,
            )
        )
        .with_row(db.Row("Steps since progress"))
        .with_panel(
            timeseries_panel(
                "Steps since progress at stop (quantiles)",
                "How many steps a run went on after its last progress evidence, at the "
                "stop. High values mean runs spin before a limit ends them.",
                [
                    query(
                        f"histogram_quantile({q}, sum by (le) (rate({ssp}[$__rate_interval])))",
                        f"p{int(q * 100)}",
                        ref,
                    )
                    for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
                ],
            )
        )
        .with_panel(
            heatmap.Panel()
            .title("Steps since progress at stop (heatmap)")
            .description("Stops per steps-since-progress bucket over time.")
            .datasource(DATASOURCE)
            .span(12)
            .height(8)
            .calculate(False)
            .with_target(
                query(f"sum by (le) (increase({ssp}[$__interval]))", "{{le}}").format(
                    pm.PromQueryFormat.HEATMAP
                )
            )
            .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE))
            .color(
                heatmap.HeatmapColorOptions()
                .mode(hm.HeatmapColorMode.SCHEME)
                .scheme("Oranges")
                .fill("dark-orange")
                .scale(hm.HeatmapColorScale.EXPONENTIAL)
                .exponent(0.5)
                .steps(64)
            )
            .y_axis(heatmap.YAxisConfig().unit("short"))
            .show_tooltip()
        )
        .with_row(db.Row("Steps per run"))
        .with_panel(
            reason_overrides(
                timeseries_panel(
                    "Steps per run by stop reason (p90)",
                    "90th percentile of steps per run, by stop reason.",
                    [
                        query(
                            "histogram_quantile(0.9, sum by (le, stop_reason) "
                            f"(rate({steps}[$__rate_interval])))",
                            "{{stop_reason}}",
                        )
                    ],
                )
            )
        )
        .with_panel(
            timeseries_panel(
                "Mean steps per run",
                "Average steps per stopped run.",
                [
                    query(
                        f"sum(rate(loopwatch_agent_steps_sum{{{AGENT}}}[$__rate_interval])) / "
                        f"sum(rate(loopwatch_agent_steps_count{{{AGENT}}}[$__rate_interval]))",
                        "mean",
                    )
                ],
            )
        )
        .with_panel(
            table_panel(
                "Stops by agent and reason in range",
                "Stop counts per (agent, stop reason) over the selected range (pairs with "
                "stops in it; every reason of a seen agent is exported, at 0 before its first).",
                query(
                    f"sum by (agent, stop_reason) (increase({stops}[$__range])) > 0",
                    instant=True,
                ).format(pm.PromQueryFormat.TABLE),
                width=24,
            )
        )
        .with_row(db.Row("Nudges"))
        .with_panel(
            timeseries_panel(
                "Nudge recovery rate by detector (1h)",
                "Share of nudges followed by a recovery (progress, or a completed stop, "
                "before any further detection) over 1 hour, by detector, for the selected "
                "agents (LoopWatchNudgeRecoveryLow reads the same per agent: "
                "agent_detector:loopwatch_nudge_results_recovered:ratio_increase1h). A "
                "result is counted with its run's stop; per tool: the Streamlit Tools page.",
                [
                    query(
                        "sum by (detector) (increase(loopwatch_nudge_results_total"
                        f'{{{AGENT}, result="recovered"}}[1h])) / sum by (detector) '
                        f"(increase(loopwatch_nudge_results_total{{{AGENT}}}[1h]))",
                        "{{detector}}",
                    )
                ],
                unit="percentunit",
                max_value=1,
            )
        )
    )


def tools() -> db.Dashboard:
    """``loopwatch-tools``: which tools loop, are blocked or fail."""
    calls = f"loopwatch_tool_calls_total{{{AGENT_TOOL}}}"
    detections = f"loopwatch_loop_detections_total{{{AGENT_TOOL}}}"
    return (
        new_dashboard(
            "loopwatch-tools",
            "loopwatch / Tools",
            "Per-tool loop detections by detector, blocked calls and error rate.",
        )
        .with_variable(datasource_variable())
        .with_variable(instance_variable())
        .with_variable(agent_variable("loopwatch_tool_calls_total"))
        .with_variable(
            label_variable(
                "tool",
                "Tool",
                TOOL_VALUES,
                "Tool names (past the collector's top-N, tools are counted as _other). "
                "none: loop detections that name no tool (no_progress, repeated_decision); "
                "pick it with the tools to keep them in the loop panels.",
            )
        )
        .with_row(db.Row("Loops"))
        .with_panel(
            timeseries_panel(
                "Loop detections by tool and detector",
                "Loop detections per second by (tool, detector): repeated_action, "
                "action_cycle, repeated_decision, no_progress. no_progress and "
                "repeated_decision name no tool: their series have tool none (selected "
                "with All, or with none in the tool variable).",
                [
                    query(
                        f"sum by (tool, detector) (rate({detections}[$__rate_interval]))",
                        "{{tool}} / {{detector}}",
                    )
                ],
                unit="suffix: detections/s",
                stacked=True,
            )
        )
        .with_panel(
            table_panel(
                "Loop detections by tool in range",
                "Loop detections per (tool, detector) over the selected range (tool none: "
                "no_progress and repeated_decision, which name no tool); pairs with "
                "detections in it (the series are exported at 0 before the first).",
                query(
                    f"sum by (tool, detector) (increase({detections}[$__range])) > 0",
                    instant=True,
                ).format(pm.PromQueryFormat.TABLE),
            )
        )
        .with_panel(
            timeseries_panel(
                "Repeated-action detections per tool (15m)",
                "repeated_action detections per tool over 15 minutes, for the selected "
                "agents: with all agents, the recording rule "
                "tool:loopwatch_loop_detections_repeated_action:increase15m, the input of "
                "LoopWatchRepeatedActionSurge (which counts every agent).",
                [
                    query(
                        "sum by (tool) (increase(loopwatch_loop_detections_total"
                        f'{{{AGENT_TOOL}, detector="repeated_action"}}[15m]))',
                        "{{tool}}",
                    )
                ],
                width=24,
            )
        )
        .with_row(db.Row("Nudges"))
        .with_panel(
            timeseries_panel(
                "Nudges and warnings by tool",
                "Tool calls the response ladder answered per second: nudged (not run; "
                "the model got a nudge as the result) and warned (run, detection recorded).",
                [
                    query(
                        "sum by (tool) (rate(loopwatch_nudges_total"
                        f"{{{AGENT_TOOL}}}[$__rate_interval]))",
                        "{{tool}} nudged",
                    ),
                    query(
                        "sum by (tool) (rate(loopwatch_loop_warnings_total"
                        f"{{{AGENT_TOOL}}}[$__rate_interval]))",
                        "{{tool}} warned",
                        "B",
                    ),
                ],
                unit="suffix: calls/s",
            )
        )
        .with_row(db.Row("Calls"))
        .with_panel(
            timeseries_panel(
                "Blocked calls by tool",
                "Tool calls the guard refused (outcome blocked) per second: each one is a "
                "call that never left the process.",
                [
                    query(
                        f"sum by (tool) (rate(loopwatch_tool_calls_total{{{AGENT_TOOL}, "
                        'outcome="blocked"}[$__rate_interval]))',
                        "{{tool}}",
                    )
                ],
                unit="suffix: calls/s",
            )
        )
        .with_panel(
            timeseries_panel(
                "Error rate by tool",
                "Share of a tool's calls that ended with outcome error (0 when none did).",
                [
                    # A tool without errors has no error series: `or ... * 0` shows it at
                    # 0 rather than leaving the panel on "No data".
                    query(
                        f"(sum by (tool) (rate(loopwatch_tool_calls_total{{{AGENT_TOOL}, "
                        'outcome="error"}[$__rate_interval])) '
                        f"or sum by (tool) (rate({calls}[$__rate_interval])) * 0) / "
                        f"sum by (tool) (rate({calls}[$__rate_interval]))",
                        "{{tool}}",
                    )
                ],
                unit="percentunit",
                max_value=1,
            )
        )
        .with_panel(
            timeseries_panel(
                "Tool calls by outcome",
                "Tool calls per second by outcome (ok, error, blocked, nudged).",
                [
                    query(
                        f"sum by (outcome) (rate({calls}[$__rate_interval]))",
                        "{{outcome}}",
                    )
                ],
                unit="suffix: calls/s",
                stacked=True,
            )
        )
        .with_panel(
            table_panel(
                "Tool calls by tool and outcome in range",
                "Calls per (tool, outcome) over the selected range.",
                query(f"sum by (tool, outcome) (increase({calls}[$__range]))", instant=True).format(
                    pm.PromQueryFormat.TABLE
                ),
            )
        )
    )


def collector() -> db.Dashboard:
    """``loopwatch-collector``: the collector's own health."""
    return (
        new_dashboard(
            "loopwatch-collector",
            "loopwatch / Collector",
            "Collector health: ingest, rejections, queue, commit latency, canary detections.",
        )
        .with_variable(datasource_variable())
        .with_variable(instance_variable())
        .with_row(db.Row("Health"))
        .with_panel(
            stat_panel(
                "Collector up",
                "1 when Prometheus scraped every selected loopwatch target (job loopwatch).",
                query(f'min(up{{job="loopwatch", {INSTANCE}}})', instant=True),
            )
        )
        .with_panel(
            stat_panel(
                "Canary detections in range",
                "Planted canary secrets found in received telemetry. Any value above 0 "
                "is a leak: see LoopWatchCanaryDetected.",
                query(
                    f"sum(increase(loopwatch_canary_detections_total{{{INSTANCE}}}[$__range]))",
                    instant=True,
                ),
            )
        )
        .with_panel(
            stat_panel(
                "Queue depth",
                "Spans waiting for the store writer now (summed over collectors).",
                query(f"sum(loopwatch_collector_queue_depth{{{INSTANCE}}})", instant=True),
            )
        )
        .with_panel(
            stat_panel(
                "Rejected share (5m)",
                "The worst selected collector's share (recording rule "
                "instance:loopwatch_collector_spans_rejected:ratio_rate5m, the input of "
                "LoopWatchCollectorRejectingSpans).",
                query(
                    f"max(instance:loopwatch_collector_spans_rejected:ratio_rate5m{{{INSTANCE}}})",
                    instant=True,
                ),
                unit="percentunit",
            )
        )
        .with_row(db.Row("Ingest"))
        .with_panel(
            timeseries_panel(
                "Ingest rate by transport",
                "Spans received per second, by transport.",
                [
                    query(
                        "sum by (transport) "
                        f"(rate(loopwatch_collector_spans_received_total{{{INSTANCE}}}[$__rate_interval]))",
                        "{{transport}}",
                    )
                ],
                unit="suffix: spans/s",
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "Rejections by reason",
                "Spans refused per second, by reason (invalid_span, queue_full, "
                "submit_failed, pipeline).",
                [
                    query(
                        "sum by (reason) "
                        f"(rate(loopwatch_collector_spans_rejected_total{{{INSTANCE}}}[$__rate_interval]))",
                        "{{reason}}",
                    )
                ],
                unit="suffix: spans/s",
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "Requests refused by reason",
                "Whole OTLP requests refused before their spans could be counted, per "
                "second, by reason. queue_full (the in-flight bytes limit, answered 429/503 "
                "with Retry-After): senders retry, nothing is lost while their retries "
                "last. decode_error, payload_too_large, unsupported_media_type, "
                "unauthorized: the sender loses what it sent.",
                [
                    query(
                        "sum by (reason) "
                        f"(rate(loopwatch_collector_requests_rejected_total{{{INSTANCE}}}[$__rate_interval]))",
                        "{{reason}}",
                    )
                ],
                unit="suffix: req/s",
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "Queue depth",
                "Spans waiting for the store writer, per collector.",
                [
                    query(
                        f"sum by (instance) (loopwatch_collector_queue_depth{{{INSTANCE}}})",
                        "{{instance}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "Commit latency",
                "DuckDB group-commit duration quantiles.",
                [
                    query(
                        f"histogram_quantile({q}, sum by (le) (rate("
                        "loopwatch_collector_commit_duration_seconds_bucket"
                        f"{{{INSTANCE}}}[$__rate_interval])))",
                        f"p{int(q * 100)}",
                        ref,
                    )
                    for q, ref in ((0.5, "A"), (0.99, "B"))
                ],
                unit="s",
            )
        )
        .with_row(db.Row("Redaction"))
        .with_panel(
            timeseries_panel(
                "Canary detections by location",
                "Canary hits by where they were found (attribute, event, name, status, "
                "resource). The value is never stored, logged or labelled.",
                [
                    query(
                        "sum by (location) "
                        f"(increase(loopwatch_canary_detections_total{{{INSTANCE}}}[$__rate_interval]))",
                        "{{location}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "Redactions by rule",
                "Values redacted per second, by redaction rule.",
                [
                    query(
                        "sum by (rule) (rate(loopwatch_redactions_total"
                        f"{{{INSTANCE}}}[$__rate_interval]))",
                        "{{rule}}",
                    )
                ],
                unit="suffix: values/s",
            )
        )
    )


DASHBOARDS: dict[str, Callable[[], db.Dashboard]] = {
    "loopwatch-overview.json": overview,
    "loopwatch-tools.json": tools,
    "loopwatch-collector.json": collector,
}
"""File name -> builder of each shipped dashboard."""


def _prune(value: Any) -> Any:
    """Drop ``null`` members: Grafana fills in its defaults for absent keys."""
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def render(builder: db.Dashboard) -> str:
    """The dashboard as stable, pretty JSON text (sorted keys, trailing newline).

    Numeric and placeholder ids the builder writes are removed (the dashboard's ``id``,
    panel and row ids, variable ids): Grafana assigns them when it loads the file, and
    a dashboard copied between instances must not carry another instance's ids.
    """
    model = _prune(json.loads(json.dumps(builder.build(), cls=JSONEncoder)))
    model.pop("id", None)
    model["annotations"] = {"list": []}
    for panel in model.get("panels", []):
        panel.pop("id", None)
        for inner in panel.get("panels", []):
            inner.pop("id", None)
    for variable in model.get("templating", {}).get("list", []):
        variable.pop("id", None)
        if variable.get("type") != "interval":
            for key in ("auto", "auto_count", "auto_min"):
                variable.pop(key, None)
        if variable.get("type") == "query":
            variable["definition"] = variable["query"]
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def build_all() -> dict[str, str]:
    """``{file name: JSON text}`` of every dashboard."""
    return {name: render(make()) for name, make in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    """Write the dashboards, or with ``--check`` report (exit 1) the files that differ."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--out", type=Path, default=DASHBOARDS_DIR, help="output folder")
    args = parser.parse_args(argv)
    stale = []
    for name, text in build_all().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} is stale: run python grafana/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
