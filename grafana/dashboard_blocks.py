"""The building blocks of the loopwatch Grafana dashboards: the data source, label
filters and variables, stop-reason colours, and panel and dashboard defaults.

``grafana/generate.py`` builds the three dashboards from these (the panels and their
queries live there); both are scripts beside each other, run from the repository with
``.venv/bin/python grafana/generate.py``. Builders: ``grafana-foundation-sdk`` (the 10.1
schema build).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from loopwatch.dashboard.palette import REASON_COLORS
from loopwatch.instrumentation.outcomes import StopReason

__all__ = [
    "ABNORMAL_REASONS",
    "ABNORMAL_TEXT",
    "AGENT",
    "AGENT_TOOL",
    "DATASOURCE",
    "INSTANCE",
    "INSTANCE_VALUES",
    "TAGS",
    "TOOL_VALUES",
    "agent_variable",
    "datasource_variable",
    "instance_variable",
    "label_variable",
    "new_dashboard",
    "query",
    "reason_overrides",
    "stat_panel",
    "table_panel",
    "timeseries_panel",
]

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
"""Every panel, query and variable points at the ``datasource`` template variable."""

TAGS = ["loopwatch"]
INSTANCE = 'instance=~"$instance"'
AGENT = f'{INSTANCE}, agent=~"$agent"'
AGENT_TOOL = f'{AGENT}, tool=~"$tool"'
INSTANCE_VALUES = "label_values(loopwatch_collector_queue_depth, instance)"
"""The ``instance`` variable's values: every scraped collector (the queue-depth gauge is
exported from start, so a collector that has received nothing yet is listed too)."""
TOOL_VALUES = (
    'label_values({__name__=~"loopwatch_tool_calls_total|loopwatch_loop_detections_total", '
    f"{AGENT}}}, tool)"
)
"""The ``tool`` variable's values: tools called, and the ``none`` of detections that name
no tool (no_progress, repeated_decision), which picking tools would otherwise hide."""
ABNORMAL_REASONS = tuple(r.value for r in StopReason if r is not StopReason.COMPLETED)
"""The stop reasons the abnormal-stop ratio counts: every reason but ``completed``
(``stop_reason!="completed"`` in the rules and panels; the dashboard's overview metric
"abnormal-stop ratio" counts the same, ``dashboard/data.py``)."""
ABNORMAL_TEXT = (
    "Abnormal = every stop reason but completed: " + ", ".join(ABNORMAL_REASONS) + ". "
    "final_unverified counts (a final answer whose goal check failed), so does cancelled."
)


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> Any:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def datasource_variable() -> db.DatasourceVariable:
    return (
        db.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes the loopwatch collector (job loopwatch).")
    )


def label_variable(name: str, label: str, query: str, description: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
    )


def instance_variable() -> db.QueryVariable:
    return label_variable(
        "instance",
        "Collector",
        INSTANCE_VALUES,
        "Collectors (Prometheus targets of job loopwatch, one per sidecar). Panels sum "
        "over the selected collectors; All: the whole fleet.",
    )


def agent_variable(metric: str) -> db.QueryVariable:
    return label_variable(
        "agent",
        "Agent",
        f"label_values({metric}{{{INSTANCE}}}, agent)",
        "Agent names (past the collector's top-N, agents are counted as _other).",
    )


def reason_overrides(panel: Any) -> Any:
    """Give each stop reason's series (legend ``{{stop_reason}}``) its fixed colour.

    One ``byName`` override per reason of :data:`REASON_COLORS`, the table the Streamlit
    charts use (``dashboard/palette.py``), so both show one colour per reason.
    """
    for reason, colour in REASON_COLORS.items():
        panel = panel.override_by_name(
            reason,
            [dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": colour})],
        )
    return panel


def timeseries_panel(
    title: str,
    description: str,
    targets: Sequence[Any],
    *,
    unit: str = "short",
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
    max_value: float | None = None,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .min(0)
        .fill_opacity(10)
        .line_width(1)
        .show_points(cm.VisibilityMode.NEVER)
    )
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    if max_value is not None:
        panel = panel.max(max_value)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def stat_panel(
    title: str, description: str, target: Any, *, unit: str = "short", width: int = 6
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .with_target(target)
    )


def table_panel(title: str, description: str, target: Any, *, width: int = 12) -> table.Panel:
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .with_target(target)
    )


def new_dashboard(uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .link(
            db.DashboardLink("loopwatch")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(TAGS)
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
