"""The Grafana folder, checked without servers: dashboards, provisioning, rules, runbooks.

- the committed dashboard JSON is exactly what ``grafana/generate.py`` builds;
- fixed, unique uids; no numeric ids; every data source is the ``${datasource}`` variable;
  ``agent`` and ``tool`` variables where the issue asks for them;
- every PromQL expression parses (``promql-parser``) and names only metrics and labels the
  collector exports (the exposition of ``collector/metrics.py`` itself) or recording rules;
- ``promtool check rules`` and ``promtool test rules`` pass, and the tests kill mutants of
  each threshold (a rule test that cannot fail proves nothing);
- every alert has severity, summary, description, runbook_url, and the runbook section,
  dashboard and panel it points at exist.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from loopwatch.collector.metrics import METRIC_NAMES, LoopwatchMetrics
from prometheus_client import CollectorRegistry

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"
RULES = GRAFANA / "alerts" / "loopwatch.rules.yml"
RULE_TESTS = GRAFANA / "tests" / "loopwatch.rules.test.yml"
UIDS = {
    "loopwatch-overview.json": "loopwatch-overview",
    "loopwatch-tools.json": "loopwatch-tools",
    "loopwatch-collector.json": "loopwatch-collector",
}
REQUIRED_ALERTS = {
    "LoopWatchCanaryDetected",
    "LoopWatchAbnormalStopRatioHigh",
    "LoopWatchRepeatedActionSurge",
    "LoopWatchBudgetExhaustionSpike",
    "LoopWatchNoProgressStops",
    "LoopWatchCollectorRejectingSpans",
    "LoopWatchCollectorDown",
}


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"loopwatch_grafana_{name}", GRAFANA / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = _module("generate")
lint = _module("lint")


def _dashboards() -> dict[str, dict[str, Any]]:
    return {
        name: json.loads((GRAFANA / "dashboards" / name).read_text(encoding="utf-8"))
        for name in UIDS
    }


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")


def _panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", [])


def collector_catalog() -> Any:
    """The collector's own exposition, with one sample of every label set recorded."""
    metrics = LoopwatchMetrics(queue_depth=lambda: 3)
    metrics.record_stop("support", "repeated_action", steps=3, steps_since_progress=2)
    metrics.record_tool_call("support", "lookup_order", "blocked")
    metrics.record_detection("support", "lookup_order", "repeated_action")
    metrics.record_loop_response("support", "lookup_order", "repeated_action", "nudge")
    metrics.record_loop_response("support", "lookup_order", "repeated_action", "warn")
    metrics.record_nudge_results("support", [("repeated_action", "recovered")])
    metrics.record_canaries({"attribute": 1})
    metrics.record_redactions({"jwt": 1})
    metrics.spans_received("http_protobuf", 10)
    metrics.spans_rejected("invalid_span", 1)
    metrics.observe_commit(0.004)
    registry = CollectorRegistry()
    registry.register(metrics)
    catalog = lint.Catalog.from_exposition(metrics.exposition(registry).decode())
    for name in METRIC_NAMES:  # the catalog covers DESIGN section 7's list
        assert any(s == name or s.startswith(f"{name}_") for s in catalog.series), name
    return catalog


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not found; install Debian's prometheus (scripts/services.sh does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def _rules() -> dict[str, Any]:
    with open(RULES, encoding="utf-8") as handle:
        document: dict[str, Any] = yaml.safe_load(handle)
    return document


def _alerts() -> list[dict[str, Any]]:
    return [r for g in _rules()["groups"] for r in g["rules"] if "alert" in r]


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


# ------------------------------------------------------------------- dashboards


def test_committed_dashboards_are_what_the_generator_builds() -> None:
    """Proves the JSON in grafana/dashboards is the generator's output (no hand edits
    drifting from the code, no generator change left unrendered)."""
    built = generate.build_all()
    assert set(built) == set(UIDS)
    for name, text in built.items():
        committed = (GRAFANA / "dashboards" / name).read_text(encoding="utf-8")
        assert committed == text, f"{name} is stale: run .venv/bin/python grafana/generate.py"


def test_generator_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    """Proves ``generate.py --check`` exits 1 on drift and 0 once written."""
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    stale = tmp_path / "loopwatch-tools.json"
    stale.write_text(stale.read_text().replace("loopwatch / Tools", "Tools"), encoding="utf-8")
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1


def test_uids_fixed_unique_and_no_numeric_ids() -> None:
    """Proves each dashboard keeps its fixed uid, uids are unique, and no ``id`` (dashboard,
    panel, row, variable) is hard-coded."""
    dashboards = _dashboards()
    uids = [model["uid"] for model in dashboards.values()]
    assert len(set(uids)) == len(uids)
    for name, model in dashboards.items():
        assert model["uid"] == UIDS[name]
        assert len(model["uid"]) <= 40  # Grafana's uid limit
        # Override matchers and properties name Grafana plugins by a string ``id``.
        ids = [
            path
            for path, _ in _walk(model)
            if path.endswith(".id") and ".fieldConfig.overrides[" not in path
        ]
        assert ids == [], f"{name}: hard-coded ids at {ids}"


def test_every_datasource_is_the_datasource_variable() -> None:
    """Proves no data source uid is hard-coded: every ``datasource`` reference is
    ``{"type": "prometheus", "uid": "${datasource}"}`` and that variable is declared as a
    Prometheus data source variable."""
    for name, model in _dashboards().items():
        variables = {v["name"]: v for v in model["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        refs = [(p, v) for p, v in _walk(model) if p.endswith(".datasource")]
        assert refs, name
        for path, ref in refs:
            assert ref == {"type": "prometheus", "uid": "${datasource}"}, (name, path, ref)
        for panel in _panels(model):
            if panel["type"] == "row":
                continue
            assert panel["targets"], (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", (name, panel["title"])


def test_template_variables() -> None:
    """Proves every dashboard has ``instance`` (fleet mode: one per collector), the
    overview ``agent``, the tools dashboard ``agent`` and ``tool`` (from ``label_values``),
    each multi-valued with All as ``.*``."""
    dashboards = _dashboards()
    expected = {
        "loopwatch-overview.json": {"datasource", "instance", "agent"},
        "loopwatch-tools.json": {"datasource", "instance", "agent", "tool"},
        "loopwatch-collector.json": {"datasource", "instance"},
    }
    for name, names in expected.items():
        variables = {v["name"]: v for v in dashboards[name]["templating"]["list"]}
        assert set(variables) == names, name
        for var in names - {"datasource"}:
            v = variables[var]
            assert v["type"] == "query" and v["multi"] and v["includeAll"], (name, var)
            assert v["allValue"] == ".*"
            assert lint.label_values_query(v["query"]) is not None, v["query"]
            assert lint.label_values_query(v["query"])[1] == var
    for name, model in dashboards.items():
        instance = {v["name"]: v for v in model["templating"]["list"]}["instance"]
        selector, _ = lint.label_values_query(instance["query"])
        assert selector.startswith("loopwatch_"), (name, selector)
        # The other variables list the values of the selected collectors only.
        for variable in model["templating"]["list"]:
            if variable["name"] not in ("datasource", "instance"):
                assert '$instance"' in variable["query"], (name, variable["name"])
    tool = {v["name"]: v for v in dashboards["loopwatch-tools.json"]["templating"]["list"]}
    # The tool none (no_progress, repeated_decision detections) is only in the detections
    # metric: from tool calls alone, picking tools hid every no_progress detection.
    assert tool["tool"]["query"] == generate.TOOL_VALUES
    assert "loopwatch_loop_detections_total" in tool["tool"]["query"]


def test_tools_panels_follow_the_agent_and_tool_variables() -> None:
    """Proves every query of the tools dashboard filters by ``$agent`` and ``$tool`` (the
    repeated-action panel read a recording rule that has no agent label, so it ignored
    the agent variable)."""
    model = _dashboards()["loopwatch-tools.json"]
    for panel in _panels(model):
        for target in panel.get("targets", []):
            assert "$agent" in target["expr"], panel["title"]
            assert "$tool" in target["expr"], panel["title"]


def test_every_query_follows_the_instance_variable_and_sums_over_instances() -> None:
    """Proves fleet mode on every dashboard: each panel query selects
    ``instance=~"$instance"`` on every series it reads, and only the per-collector panels
    (queue depth) keep ``instance`` in an aggregation's ``by``."""
    per_collector = {"Queue depth"}
    for name, model in _dashboards().items():
        for panel in _panels(model):
            for target in panel.get("targets", []):
                expr = target["expr"]
                selectors = re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*\}", expr)
                assert selectors, (name, panel["title"], expr)
                for selector in selectors:
                    assert 'instance=~"$instance"' in selector, (name, panel["title"], selector)
                if panel["type"] != "row" and panel["title"] not in per_collector:
                    assert not re.search(r"by \([^)]*instance", expr), (name, panel["title"])


def _colour_overrides(panel: dict[str, Any]) -> dict[str, str]:
    out = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        (prop,) = [p for p in override["properties"] if p["id"] == "color"]
        assert override["matcher"]["id"] == "byName", override
        assert prop["value"]["mode"] == "fixed", override
        out[override["matcher"]["options"]] = prop["value"]["fixedColor"]
    return out


def test_stop_reason_series_use_the_dashboard_palette() -> None:
    """Proves every panel that draws series by stop reason (legend ``{{stop_reason}}``)
    colours each of the eleven reasons exactly as the Streamlit dashboard does
    (``dashboard/palette.py``), and no other panel carries colour overrides."""
    from loopwatch.dashboard.palette import REASON_COLORS
    from loopwatch.instrumentation.outcomes import StopReason

    assert set(REASON_COLORS) == {r.value for r in StopReason}
    by_reason = 0
    for name, model in _dashboards().items():
        for panel in _panels(model):
            legends = {t.get("legendFormat") for t in panel.get("targets", [])}
            if "{{stop_reason}}" in legends:
                by_reason += 1
                assert _colour_overrides(panel) == REASON_COLORS, (name, panel["title"])
            else:
                assert _colour_overrides(panel) == {}, (name, panel["title"])
    assert by_reason >= 2


def test_abnormal_ratio_names_the_reasons_it_counts() -> None:
    """Proves the abnormal-stop panels and grafana/README.md list every reason the ratio
    counts (all but completed), and the queries count exactly those."""
    from loopwatch.instrumentation.outcomes import StopReason

    counted = [r.value for r in StopReason if r is not StopReason.COMPLETED]
    assert list(generate.ABNORMAL_REASONS) == counted
    readme = (GRAFANA / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The abnormal-stop ratio", 1)[1].split("\n## ", 1)[0]
    panels = {p["title"]: p for p in _panels(_dashboards()["loopwatch-overview.json"])}
    for title in ("Abnormal-stop share in range", "Abnormal-stop ratio by agent"):
        panel = panels[title]
        for reason in counted:
            assert reason in panel["description"], (title, reason)
        assert 'stop_reason!="completed"' in panel["targets"][0]["expr"], title
    for reason in counted:
        assert f"`{reason}`" in section, reason
    assert "`completed`" in section


def test_required_panels_exist() -> None:
    """Proves the panels issue 6 lists are there, by title and type."""
    titles = {
        name: {p["title"]: p["type"] for p in _panels(model)}
        for name, model in _dashboards().items()
    }
    assert titles["loopwatch-overview.json"]["Stop rate by reason"] == "timeseries"
    assert titles["loopwatch-overview.json"]["Abnormal-stop ratio by agent"] == "timeseries"
    assert (
        titles["loopwatch-overview.json"]["Steps since progress at stop (quantiles)"]
        == "timeseries"
    )
    assert titles["loopwatch-overview.json"]["Steps since progress at stop (heatmap)"] == "heatmap"
    assert titles["loopwatch-overview.json"]["Steps per run by stop reason (p90)"] == "timeseries"
    for title in (
        "Loop detections by tool and detector",
        "Blocked calls by tool",
        "Error rate by tool",
    ):
        assert title in titles["loopwatch-tools.json"], title
    for title in (
        "Ingest rate by transport",
        "Rejections by reason",
        "Queue depth",
        "Commit latency",
        "Canary detections by location",
    ):
        assert title in titles["loopwatch-collector.json"], title


# ------------------------------------------------------------------- PromQL


def test_every_expression_parses_and_uses_only_exported_metrics_and_labels() -> None:
    """Proves every panel, variable and rule expression parses and names only series and
    labels the collector exports (or recording rules of the rules file)."""
    queries = lint.folder_queries()
    kinds = {q.kind for q in queries}
    assert kinds == {"panel", "variable", "record", "alert"}
    assert len(queries) >= 40
    assert lint.check_queries(queries, collector_catalog()) == []


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        (
            "sum(rate(loopwatch_agent_stop_total[5m]))",
            "unknown series 'loopwatch_agent_stop_total'",
        ),
        ('loopwatch_agent_stops_total{tool="x"}', "label 'tool' is not a label"),
        ("sum by (tool) (loopwatch_agent_stops_total)", "by/without 'tool'"),
        (
            "loopwatch_agent_stops_total / on (tool) loopwatch_tool_calls_total",
            "on 'tool'",
        ),
        (
            "loopwatch_agent_stops_total / ignoring (detector) loopwatch_agent_steps_count",
            "ignoring 'detector'",
        ),
        ('absent(loopwatch_agent_stops_total{tool!="x"})', "label 'tool' is not a label"),
        (
            "sum by (agent) (loopwatch_agent_stops_total) / on (agent) group_left (detector) "
            "sum by (agent) (loopwatch_loop_detections_total)",
            "group_left/right 'detector'",
        ),
        (
            "histogram_quantile(0.9, sum by (le, tool) (rate(loopwatch_agent_steps_bucket[5m])))",
            "by/without 'tool'",
        ),
        ("sum(rate(loopwatch_agent_stops_total[5m])", "unclosed"),
    ],
)
def test_lint_finds_wrong_names_and_labels(expr: str, problem: str) -> None:
    """Proves the metric/label check can fail: each wrong expression is reported."""
    query = lint.Query("test", expr, "panel")
    problems = lint.check_queries([query], collector_catalog())
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    ("expr", "labels"),
    [
        (
            "sum without (le) (rate(loopwatch_agent_steps_bucket[5m]))",
            {"agent", "stop_reason", "job", "instance"},
        ),
        (
            "histogram_quantile(0.5, sum by (le, agent) (rate(loopwatch_agent_steps_bucket[5m])))",
            {"agent"},
        ),
        (
            'label_replace(sum by (agent) (loopwatch_agent_stops_total), "who", "$1", "agent", "(.*)")',
            {"agent", "who"},
        ),
        (
            "sum by (agent) (loopwatch_agent_stops_total) / on (agent) group_right (tool) "
            "sum by (agent, tool) (loopwatch_tool_calls_total)",
            {"agent", "tool"},
        ),
        ("sum by (agent) (loopwatch_agent_stops_total) > 3", {"agent"}),
        ('count_values("n", loopwatch_collector_queue_depth)', {"n"}),
        ('absent(up{job="loopwatch", instance!="x"})', {"job"}),
        (
            "sum(loopwatch_agent_stops_total) or sum by (tool) (loopwatch_tool_calls_total)",
            {"tool"},
        ),
    ],
)
def test_output_labels(expr: str, labels: set[str]) -> None:
    """Proves the label inference the checks rely on follows PromQL's rules for
    aggregation, histogram_quantile, label_replace, vector matching, absent and or."""
    catalog = collector_catalog()
    tree = lint.parse(lint.Query("t", expr, "record"))
    assert lint.output_labels(tree, catalog.series) == labels


def test_dashboards_decode_with_the_sdk_models() -> None:
    """Proves each file decodes into grafana-foundation-sdk's dashboard model, with every
    target a Prometheus query (the schema Grafana's own builders follow)."""
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import prometheus as pm

    plugins.register_default_plugins()
    for name, model in _dashboards().items():
        decoded = dm.Dashboard.from_json(model)
        assert decoded.uid == UIDS[name]
        targets = [
            t
            for p in decoded.panels or []
            if not isinstance(p, dm.RowPanel)
            for t in p.targets or []
        ]
        assert targets and all(isinstance(t, pm.Dataquery) and t.expr for t in targets), name


def test_lint_checks_alert_template_labels() -> None:
    """Proves ``$labels.x`` in an alert's annotations must be a label of its result."""
    ok = lint.Query(
        "t",
        "sum by (agent) (loopwatch_agent_stops_total) > 1",
        "alert",
        labels_used=frozenset({"agent"}),
        name="A",
    )
    bad = lint.Query(
        "t",
        "sum(loopwatch_agent_stops_total) > 1",
        "alert",
        labels_used=frozenset({"agent"}),
        name="B",
    )
    catalog = collector_catalog()
    assert lint.check_queries([ok], catalog) == []
    assert any("label 'agent' is used" in p for p in lint.check_queries([bad], catalog))


def test_substitute_grafana_variables() -> None:
    """Proves every variable syntax Grafana accepts is substituted and an unknown one
    is an error rather than a silent pass."""
    text = 'rate(x{agent=~"$agent", tool=~"${tool}", a=~"[[agent]]"}[$__rate_interval])'
    assert lint.substitute(text) == 'rate(x{agent=~".*", tool=~".*", a=~".*"}[1m])'
    assert lint.substitute('x{agent=~"${agent:regex}"}', {"agent": "a|b"}) == 'x{agent=~"a|b"}'
    with pytest.raises(KeyError, match="nope"):
        lint.substitute("x[$nope]")


# ------------------------------------------------------------------- rules


def test_promtool_check_rules() -> None:
    """Proves Prometheus's own checker accepts the rules file."""
    done = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 19 rules found" in done.stdout


def test_promtool_test_rules() -> None:
    """Proves every alert fires and does not fire as the fixtures say (thresholds,
    minimum-volume guards, baselines, recording rule values)."""
    done = subprocess.run(
        [_promtool(), "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        cwd=RULE_TESTS.parent,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


MUTANTS = [
    ("ratio_rate15m > 0.5", "ratio_rate15m >= 0.5"),
    ("increase15m >= 20", "increase15m > 20"),
    ('"budget_exhausted"} > 0.25', '"budget_exhausted"} >= 0.25'),
    ('"no_progress"} >= 5', '"no_progress"} > 5'),
    ("ratio_rate5m) > 0.01", "ratio_rate5m) >= 0.01"),
    ("\n          ) > 0.05", "\n          ) > 0.2"),
    ("count without (instance) (up", "count by (instance) (up"),
    (
        "sum by (agent, stop_reason) (increase(",
        "sum by (instance, agent, stop_reason) (increase(",
    ),
    ("sum by (location) (increase(", "sum by (instance, location) (increase("),
    ("increase15m >= 10", "increase15m > 10"),
    ("> 2 * (", "> 0 * ("),
    (' or absent(up{job="loopwatch"})', ""),
    ("[10m])) > 0", "[10m])) > 1"),
    ("or agent:loopwatch_agent_stops:rate15m * 0", "or vector(0)"),
    ("for: 10m", "for: 0m"),
]


def _run_mutant(promtool: str, folder: Path, text: str, original: str, mutant: str) -> str:
    """``promtool test rules`` on a copy of the rules with one edit; "" when it failed
    (the mutant was killed), else a message."""
    (folder / "alerts").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "alerts" / RULES.name).write_text(text.replace(original, mutant), encoding="utf-8")
    shutil.copy(RULE_TESTS, folder / "tests" / RULE_TESTS.name)
    done = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        cwd=folder / "tests",
        check=False,
    )
    return "" if done.returncode != 0 else f"mutant {original!r} -> {mutant!r} survived"


def test_rule_tests_kill_threshold_mutants(tmp_path: Path) -> None:
    """Proves the promtool fixtures sit on each threshold's boundary: moving any one
    comparison, guard, baseline or ``for`` makes ``promtool test rules`` fail."""
    promtool = _promtool()
    text = RULES.read_text(encoding="utf-8")
    for original, _ in MUTANTS:
        assert original in text, original
    with ThreadPoolExecutor(max_workers=4) as pool:
        survivors = list(
            pool.map(
                lambda item: _run_mutant(promtool, tmp_path / str(item[0]), text, *item[1]),
                enumerate(MUTANTS),
            )
        )
    assert [s for s in survivors if s] == []


def test_every_alert_has_severity_annotations_and_a_runbook() -> None:
    """Proves each required alert exists with a severity, summary, templated description,
    a runbook_url whose README section exists (with the three parts), and a dashboard
    panel that exists."""
    alerts = {a["alert"]: a for a in _alerts()}
    assert set(alerts) >= REQUIRED_ALERTS
    assert alerts["LoopWatchCanaryDetected"]["labels"]["severity"] == "critical"
    readme = (GRAFANA / "README.md").read_text(encoding="utf-8")
    headings = {_slug(h): h for h in re.findall(r"^#{2,4} (.+)$", readme, re.MULTILINE)}
    dashboards = {m["uid"]: m for m in _dashboards().values()}
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        notes = alert["annotations"]
        assert notes["summary"] and "{{" in notes["description"], name
        path, _, anchor = notes["runbook_url"].partition("#")
        assert path == "grafana/README.md" and anchor == name.lower(), name
        assert anchor in headings, f"{name}: no README heading for #{anchor}"
        section = readme.split(f"### {headings[anchor]}", 1)[1].split("\n### ", 1)[0]
        for part in ("What it means", "First three checks", "Dashboard"):
            assert part in section, (name, part)
        assert len(re.findall(r"^\d\. ", section, re.MULTILINE)) >= 3, name
        board = dashboards[notes["dashboard_uid"]]
        assert notes["panel"] in {p["title"] for p in _panels(board)}, (name, notes["panel"])
        assert notes["panel"] in section and notes["dashboard_uid"] in section, name


def test_recording_rule_names_follow_the_convention() -> None:
    """Proves recording rules are named level:metric:operations and are used by an
    alert or a panel (a shared ratio, not dead code)."""
    records = [r["record"] for g in _rules()["groups"] for r in g["rules"] if "record" in r]
    used = " ".join(
        [str(a["expr"]) for a in _alerts()]
        + [q.expr for q in lint.folder_queries() if q.kind == "panel"]
        + [str(r["expr"]) for g in _rules()["groups"] for r in g["rules"] if "record" in r]
    )
    for name in records:
        assert re.fullmatch(r"[a-z_]+:loopwatch_[a-z_]+:[a-z0-9_]+", name), name
        assert name in used, f"recording rule {name} is used by no alert, rule or panel"
    # The per-collector share is read by a panel; the per-agent ratios have no instance
    # label, so the panels compute them from the counters for the selected collectors.
    shared = [q.expr for q in lint.folder_queries() if q.kind == "panel" and ":" in q.expr]
    assert any("ratio_rate5m" in e for e in shared)


# ---------------------------------------------------------------- provisioning


def test_provisioning_loads_this_folder() -> None:
    """Proves the provisioning files declare a Prometheus data source and a file provider
    whose path holds the dashboards, under one folder, with uids that match the
    dashboards' data source variable type."""
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "loopwatch.yml").read_text()
    )
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert source["url"].startswith("http")
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "loopwatch.yml").read_text()
    )
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["folder"] == "loopwatch"
    path = provider["options"]["path"]
    assert path.endswith("/grafana/dashboards") or path.endswith("/dashboards"), path
    assert provider["allowUiUpdates"] is False


# ------------------------------------------- alerts on the collector's own series


def _scrape_stops(m: LoopwatchMetrics) -> dict[str, float]:
    """``loopwatch_agent_stops_total`` and detection samples of one scrape, by series text."""
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    registry.register(m)
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(m.exposition(registry).decode()):
        for s in family.samples:
            if s.name in ("loopwatch_agent_stops_total", "loopwatch_loop_detections_total"):
                labels = ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


@pytest.mark.parametrize(
    ("burst", "alert", "labels"),
    [
        (
            lambda m: [
                m.record_stop("five", "no_progress", steps=9, steps_since_progress=6)
                for _ in range(5)
            ],
            "LoopWatchNoProgressStops",
            {"agent": "five", "stop_reason": "no_progress"},
        ),
        (
            lambda m: [m.record_detection("five", "lookup", "repeated_action") for _ in range(10)],
            "LoopWatchRepeatedActionSurge",
            {"tool": "lookup"},
        ),
    ],
)
def test_an_alert_fires_on_a_burst_in_the_series_the_collector_exports(
    tmp_path: Path, burst: Any, alert: str, labels: dict[str, str]
) -> None:
    """Proves the exporter gives ``increase()`` a 0 to rise from. An agent that only ever
    completed (its tool called ok), then hit 5 ``no_progress`` stops (or its tool 10
    ``repeated_action`` detections) between two 15 s scrapes: the series used to appear
    at 5, which ``increase()`` reads as no increase, and the alert never fired."""
    m = LoopwatchMetrics()
    m.record_tool_call("five", "lookup", "ok")
    m.record_stop("five", "completed", steps=2, steps_since_progress=0)
    before = _scrape_stops(m)
    burst(m)
    after = _scrape_stops(m)
    series = [
        {"series": name, "values": f"{_sample(before.get(name))}x120 {after[name]:g}x280"}
        for name in sorted(after)
    ]
    firing = {"alertname": alert, "alertstate": "firing", "severity": "warning", **labels}
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}',
                        "eval_time": "40m",
                        "exp_samples": [
                            {
                                "labels": _label_set("ALERTS", firing),
                                "value": 1,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "burst.test.yml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    done = subprocess.run(
        [_promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _sample(value: float | None) -> str:
    return "_" if value is None else f"{value:g}"


def _label_set(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
