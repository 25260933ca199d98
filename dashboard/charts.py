"""Charts as pure functions of DataFrames (STYLE rule 15), each with a text equivalent.

Every ``*_chart`` function returns an Altair chart (no Streamlit import); its companion
``*_text`` / ``*_table`` function returns the same figures as a sentence or a table for
screen readers and for the page's caption. Colours of stop reasons come from
:mod:`loopwatch.dashboard.palette` (colour-blind safe, the same in Grafana), so a reason
keeps its colour across charts, pages and Grafana.

Names in a chart (agents, tools, reasons: client text) are drawn with their bidi
controls made visible (:mod:`loopwatch.dashboard.bidi`): a U+202E in a tool name would
reverse its axis label. The ``*_text`` and ``*_table`` functions return stored text as it is; the
pages escape it (``ui.escape_md``, ``ui.dataframe``).

Example:
    >>> chart = stops_over_time_chart(overview.stops)  # doctest: +SKIP
    >>> caption = stops_text(overview.stops)
"""

from __future__ import annotations

from typing import Final

import altair as alt
import pandas as pd
from loopwatch.instrumentation import StopReason

from .bidi import neutralise, neutralise_frame
from .data import LOOP_DETECTORS, STOP_REASONS, TOOL_OUTCOME_COLUMNS
from .palette import OTHER_COLOR, REASON_COLORS

__all__ = [
    "DETECTOR_COLORS",
    "REASON_COLORS",
    "loops_by_tool_chart",
    "loops_table",
    "loops_text",
    "progress_chart",
    "progress_text",
    "runs_by_agent_chart",
    "runs_by_agent_table",
    "runs_by_agent_text",
    "stops_over_time_chart",
    "stops_table",
    "stops_text",
    "tool_calls_chart",
    "tool_calls_text",
]

DETECTOR_COLORS: Final[dict[str, str]] = {d: REASON_COLORS[d] for d in LOOP_DETECTORS}
"""Loop detectors use their stop reason's colour."""

_HEIGHT: Final = 260
_WHOLE: Final = alt.Axis(tickMinStep=1, format="d")
"""Axis of a count or a step number: no fractional ticks (1.0, 1.2, ... read as steps)."""

_NAMES: Final = alt.Axis(labelLimit=0)
"""Axis of names (tools, agents): whole labels, never cut with an ellipsis (Vega-Lite
cuts at 180 px by default, so ``search_basic_free_for_streaming_availability`` lost its
end); the chart widens its label column instead."""

_BAR_STEP: Final = alt.Step(24)
"""Height of each bar's band in the horizontal bar charts, whatever the bar count: the
page sizes charts to their content, so a fixed height would shrink to the legend's and
Vega-Lite would hide every other bar label as overlapping."""


def _reason_scale(present: pd.Series) -> alt.Scale:
    extra = sorted({str(v) for v in present} - set(STOP_REASONS))
    domain = [*STOP_REASONS, *extra]
    return alt.Scale(domain=domain, range=[REASON_COLORS.get(r, OTHER_COLOR) for r in domain])


def _detector_scale() -> alt.Scale:
    return alt.Scale(domain=list(LOOP_DETECTORS), range=list(DETECTOR_COLORS.values()))


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# -------------------------------------------------------------- stops over time


def stops_over_time_chart(stops: pd.DataFrame, *, bucket_seconds: int = 3600) -> alt.Chart:
    """Stacked bars: stops per time bucket, coloured by stop reason.

    Args:
        stops: ``bucket`` (datetime), ``stop_reason``, ``stops``.
        bucket_seconds: bucket width, for the tooltip.
    """
    width_text = (
        f"{bucket_seconds // 60} min" if bucket_seconds < 3600 else (f"{bucket_seconds // 3600} h")
    )
    shown = neutralise_frame(stops)
    chart: alt.Chart = (
        alt.Chart(shown, title="Stops by reason over time")
        .mark_bar()
        .encode(
            x=alt.X(
                "bucket:T",
                title=f"time (UTC, {width_text} buckets)",
                axis=alt.Axis(format="%m-%d %H:%M"),
            ),
            y=alt.Y("sum(stops):Q", title="stops", stack="zero", axis=_WHOLE),
            # Two columns: eleven reasons in one column run past the plot, and the page
            # clips the last ones.
            color=alt.Color(
                "stop_reason:N",
                title="stop reason",
                scale=_reason_scale(shown["stop_reason"]),
                legend=alt.Legend(columns=2),
            ),
            order=alt.Order("stop_reason:N"),
            tooltip=[
                alt.Tooltip("bucket:T", title="bucket", format="%Y-%m-%d %H:%M"),
                alt.Tooltip("stop_reason:N", title="stop reason"),
                alt.Tooltip("stops:Q", title="stops"),
            ],
        )
        .properties(height=_HEIGHT, description=neutralise(stops_text(stops)))
    )
    return chart


def stops_table(stops: pd.DataFrame) -> pd.DataFrame:
    """Stops per reason over the range: ``stop_reason``, ``stops``, ``share`` (most first)."""
    if stops.empty:
        return pd.DataFrame(columns=["stop_reason", "stops", "share"])
    totals = stops.groupby("stop_reason", as_index=False)["stops"].sum()
    totals["share"] = totals["stops"] / totals["stops"].sum()
    return totals.sort_values(["stops", "stop_reason"], ascending=[False, True]).reset_index(
        drop=True
    )


def stops_text(stops: pd.DataFrame) -> str:
    """``"12 stops: repeated_action 5, completed 4, ..."``."""
    table = stops_table(stops)
    if table.empty:
        return "No stops in this time range."
    parts = ", ".join(f"{r.stop_reason} {int(r.stops):,}" for r in table.itertuples())
    return f"{_plural(int(table['stops'].sum()), 'stop')}: {parts}."


# ------------------------------------------------------------------ by agent


def runs_by_agent_chart(by_agent: pd.DataFrame) -> alt.Chart:
    """Horizontal stacked bars: runs per agent, coloured by stop reason."""
    frame = neutralise_frame(
        by_agent.assign(
            agent=by_agent["agent"].replace("", "(unnamed)"),
            stop_reason=by_agent["stop_reason"].replace("", "(no stop yet)"),
        )
    )
    chart: alt.Chart = (
        alt.Chart(frame, title="Runs by agent")
        .mark_bar()
        .encode(
            y=alt.Y("agent:N", title="agent", sort="-x", axis=_NAMES),
            x=alt.X("sum(runs):Q", title="runs", axis=_WHOLE),
            color=alt.Color(
                "stop_reason:N", title="stop reason", scale=_reason_scale(frame["stop_reason"])
            ),
            tooltip=["agent:N", "stop_reason:N", "runs:Q"],
        )
        .properties(height=_BAR_STEP, description=neutralise(runs_by_agent_text(by_agent)))
    )
    return chart


def runs_by_agent_table(by_agent: pd.DataFrame) -> pd.DataFrame:
    """``agent``, ``runs``, ``abnormal`` (stops other than completed), most runs first."""
    if by_agent.empty:
        return pd.DataFrame(columns=["agent", "runs", "abnormal"])
    frame = by_agent.assign(
        abnormal=by_agent["runs"].where(
            ~by_agent["stop_reason"].isin([StopReason.COMPLETED.value, ""]), 0
        )
    )
    table = frame.groupby("agent", as_index=False)[["runs", "abnormal"]].sum()
    return table.sort_values(["runs", "agent"], ascending=[False, True]).reset_index(drop=True)


def runs_by_agent_text(by_agent: pd.DataFrame) -> str:
    """``"3 agents: support 7 runs (6 abnormal), ..."``."""
    table = runs_by_agent_table(by_agent)
    if table.empty:
        return "No runs in this time range."
    parts = ", ".join(
        f"{r.agent or '(unnamed)'} {_plural(int(r.runs), 'run')} ({int(r.abnormal):,} abnormal)"
        for r in table.itertuples()
    )
    return f"{_plural(len(table), 'agent')}: {parts}."


# --------------------------------------------------------------------- loops


def loops_table(loops: pd.DataFrame) -> pd.DataFrame:
    """Tool x detector: ``tool``, one column per detector, ``total`` (most first)."""
    columns = ["tool", *LOOP_DETECTORS, "total"]
    if loops.empty:
        return pd.DataFrame(columns=columns)
    pivot = loops.pivot_table(
        index="tool", columns="detector", values="stops", aggfunc="sum", fill_value=0
    )
    for detector in LOOP_DETECTORS:
        if detector not in pivot.columns:
            pivot[detector] = 0
    pivot = pivot[list(LOOP_DETECTORS)].astype("int64")
    pivot["total"] = pivot.sum(axis=1)
    table = pivot.reset_index()
    table["tool"] = table["tool"].replace("", "(no tool)")
    table.columns.name = None
    return table.sort_values(["total", "tool"], ascending=[False, True]).reset_index(drop=True)[
        columns
    ]


def loops_by_tool_chart(loops: pd.DataFrame, *, top: int = 10) -> alt.Chart:
    """Horizontal stacked bars: loop detections per tool (top ``top``), by detector."""
    keep = loops_table(loops)["tool"].head(top).tolist()
    frame = loops.assign(tool=loops["tool"].replace("", "(no tool)"))
    frame = neutralise_frame(frame[frame["tool"].isin(keep)])
    chart: alt.Chart = (
        alt.Chart(frame, title=f"Top tools by loop detections (top {top})")
        .mark_bar()
        .encode(
            y=alt.Y("tool:N", title="tool", sort="-x", axis=_NAMES),
            x=alt.X("sum(stops):Q", title="loop detections", axis=_WHOLE),
            color=alt.Color("detector:N", title="detector", scale=_detector_scale()),
            tooltip=["tool:N", "detector:N", "stops:Q"],
        )
        .properties(height=_BAR_STEP, description=neutralise(loops_text(loops)))
    )
    return chart


def loops_text(loops: pd.DataFrame) -> str:
    """``"5 loop detections over 4 tools: lookup_order 2 (repeated_action 2), ..."``.

    Loop detections: runs a loop detector stopped, or that observe mode flagged.
    """
    table = loops_table(loops)
    if table.empty:
        return "No loop detections in this time range."
    parts = []
    for row in table.itertuples(index=False):
        values = row._asdict()
        by = ", ".join(f"{d} {values[d]}" for d in LOOP_DETECTORS if values[d])
        parts.append(f"{values['tool']} {values['total']} ({by})")
    total = int(table["total"].sum())
    return (
        f"{_plural(total, 'loop detection')} over {_plural(len(table), 'tool')}: "
        f"{'; '.join(parts)}."
    )


# ------------------------------------------------------------------ run view


PROGRESS_CHART_POINTS: Final = 1_000
"""Most points the steps-since-progress curve carries: about one per pixel of a wide
chart. A 10,000-step run's spec with every step took longer to serialise and draw than
the rest of the run view (issue 28, Speed)."""


def chart_points(series: pd.DataFrame, limit: int = PROGRESS_CHART_POINTS) -> pd.DataFrame:
    """``series`` (``step``, ``steps_since_progress``, in step order) with at most about
    ``limit`` rows: consecutive rows in equal buckets, each drawn at its first step with
    its highest value (a peak is never hidden), and the last row kept as it is (the curve
    ends on the stop's figure). Unchanged when it already fits."""
    if len(series) <= limit:
        return series
    width = -(-len(series) // limit)  # ceil
    bucket = pd.RangeIndex(len(series)) // width
    points = series.groupby(bucket, sort=True).agg(
        step=("step", "first"), steps_since_progress=("steps_since_progress", "max")
    )
    last = series.iloc[[-1]]
    if int(points["step"].iloc[-1]) == int(last["step"].iloc[0]):
        points = points.iloc[:-1]
    return pd.concat([points, last], ignore_index=True)


def progress_chart(
    series: pd.DataFrame, *, ceased_step: int | None = None, stop_step: int | None = None
) -> alt.LayerChart:
    """Steps since progress per step, with rules at the ceased and stop steps.

    Args:
        series: ``step``, ``steps_since_progress``; past :data:`PROGRESS_CHART_POINTS`
            rows the curve is drawn from :func:`chart_points` (its description still
            speaks of every row).
        ceased_step: where progress ceased (dashed rule).
        stop_step: where the run stopped (solid rule).
    """
    points = chart_points(series)
    line = (
        alt.Chart(points)
        .mark_line(point=len(points) <= 60, interpolate="step-after")
        .encode(
            x=alt.X("step:Q", title="step", axis=_WHOLE),
            y=alt.Y("steps_since_progress:Q", title="steps since progress", axis=_WHOLE),
            tooltip=["step:Q", "steps_since_progress:Q"],
        )
    )
    marks = pd.DataFrame(
        [
            {"step": s, "mark": label}
            for s, label in ((ceased_step, "progress ceased"), (stop_step, "stop"))
            if s is not None
        ],
        columns=["step", "mark"],
    )
    rules = (
        alt.Chart(marks)
        .mark_rule(strokeDash=[4, 3])
        .encode(
            x="step:Q",
            color=alt.Color(
                "mark:N",
                title="",
                scale=alt.Scale(domain=["progress ceased", "stop"], range=["#EE7733", "#CC3311"]),
            ),
            tooltip=["mark:N", "step:Q"],
        )
    )
    # No Vega title: Streamlit sizes a layered chart without it, and would draw the title
    # over the element above. The page writes the heading.
    layered: alt.LayerChart = alt.LayerChart(layer=[line, rules]).properties(
        height=200,
        description=progress_text(series, ceased_step=ceased_step, stop_step=stop_step),
    )
    return layered


def progress_text(
    series: pd.DataFrame, *, ceased_step: int | None = None, stop_step: int | None = None
) -> str:
    """The curve in words: range, peak, the ceased and stop steps.

    Without ``stop_step`` (no stop recorded, or one naming no step) the curve's end is
    called the last stored step, never a stop.
    """
    if series.empty:
        return "No steps-since-progress values were stored for this run."
    first, last = int(series["step"].min()), int(series["step"].max())
    peak = int(series["steps_since_progress"].max())
    final = int(series["steps_since_progress"].iloc[-1])
    text = f"Steps since progress over steps {first}–{last}: peak {peak}, {final} at step {last}."
    if ceased_step is not None:
        text += f" Progress ceased at step {ceased_step}."
    if stop_step is not None:
        text += f" Stopped at step {stop_step}."
    else:
        text += f" No stop step recorded: step {last} is the last stored step."
    return text


# --------------------------------------------------------------------- tools


def tool_calls_chart(tools: pd.DataFrame, *, top: int = 15) -> alt.Chart:
    """Horizontal stacked bars: calls per tool by outcome (``ok``, ``errors``, ``blocked``,
    ``nudged``; an outcome column the frame lacks is left out)."""
    head = neutralise_frame(tools.head(top))
    outcomes = [c for c in TOOL_OUTCOME_COLUMNS if c in head.columns]
    long = head.melt(id_vars=["tool"], value_vars=outcomes, var_name="outcome", value_name="n")
    chart: alt.Chart = (
        alt.Chart(long, title=f"Tool calls by outcome (top {top} by calls)")
        .mark_bar()
        .encode(
            y=alt.Y("tool:N", sort=head["tool"].tolist(), title="tool", axis=_NAMES),
            x=alt.X("sum(n):Q", title="calls", axis=_WHOLE),
            color=alt.Color(
                "outcome:N",
                scale=alt.Scale(
                    domain=list(TOOL_OUTCOME_COLUMNS),
                    range=["#117733", "#EE7733", "#CC3311", "#0077BB"],
                ),
            ),
            tooltip=["tool:N", "outcome:N", "n:Q"],
        )
        .properties(height=_BAR_STEP, description=neutralise(tool_calls_text(tools, top=top)))
    )
    return chart


def tool_calls_text(tools: pd.DataFrame, *, top: int | None = None) -> str:
    """``"2 tools, 99 calls: lookup_order 5 (4 ok, 0 errors, 1 blocked), ..."``.

    Args:
        tools: one row per tool (``tool``, ``calls``, ``ok``, ``errors``, ``blocked``), in
            the order to list them.
        top: name only the first ``top`` tools and sum up the rest (``"; 3 more tools,
            7 calls"``); ``None`` names all.
    """
    if tools.empty:
        return "No tool calls in this time range."
    head = tools if top is None else tools.head(top)
    parts = ", ".join(
        f"{r.tool} {int(r.calls):,} ({int(r.ok):,} ok, {int(r.errors):,} errors, "
        f"{int(r.blocked):,} blocked)"
        for r in head.itertuples()
    )
    rest = len(tools) - len(head)
    if rest:
        rest_calls = int(tools["calls"].sum()) - int(head["calls"].sum())
        parts += (
            f"; {rest:,} more {'tool' if rest == 1 else 'tools'}, {_plural(rest_calls, 'call')}"
        )
    return f"{_plural(len(tools), 'tool')}, {_plural(int(tools['calls'].sum()), 'call')}: {parts}."
