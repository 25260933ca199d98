"""Overview: stops by reason over time, abnormal-stop ratio, runs by agent, looping tools.

Query parameters: ``range`` (``1h``, ``6h``, ``24h``, ``7d``, ``30d``, ``all``), ``agent``.
"""

from __future__ import annotations

import streamlit as st
from loopwatch.dashboard import charts, explain, ui
from loopwatch.dashboard.data import LOOP_DETECTORS, Overview

ALL_AGENTS = "(all agents)"

ui.setup_page("Overview")
st.title("Overview")
src, key = ui.source()

left, right = st.columns(2)
with left:
    window = ui.time_range(key="overview_range")


def _overview(agent: str | None) -> Overview:
    return ui.call(
        ui.cached_overview,
        key,
        src,
        window.since_unix_nano,
        window.until_unix_nano,
        window.bucket_seconds,
        agent,
    )


everyone = _overview(None)
agents = everyone.agents
wanted = st.query_params.get("agent", "")
options = [ALL_AGENTS, *agents, *([wanted] if wanted and wanted not in agents else [])]
with right:
    choice = ui.select_param(
        "Agent", options, param="agent", default=ALL_AGENTS, key="overview_agent"
    )
agent = None if choice == ALL_AGENTS else choice
ui.sync_query_params({"range": window.key, "agent": agent}, {"range": "24h"})

overview = everyone if agent is None else _overview(agent)
if overview.runs_by_agent.empty and overview.total_stops == 0:
    scope = f" for agent {ui.escape_md(agent)}" if agent else ""
    ui.empty_state(f"No runs in the selected time range ({window.label.lower()}){scope}.")
    ui.footer(src)
    st.stop()

ratio = overview.abnormal_ratio
detections = int(overview.loops_by_tool["stops"].sum()) if not overview.loops_by_tool.empty else 0
loop_stops = (
    int(overview.stops.loc[overview.stops["stop_reason"].isin(LOOP_DETECTORS), "stops"].sum())
    if not overview.stops.empty
    else 0
)
# Observe mode records a detection on a run it lets go on: its stop stays completed.
observed = max(detections - loop_stops, 0)
m1, m2, m3, m4 = st.columns(4)
m1.metric("Stops", f"{overview.total_stops:,}")
m2.metric(
    "Abnormal-stop ratio",
    "–" if ratio is None else f"{ratio:.0%}",
    help=explain.ABNORMAL_HELP,
)
m3.metric(
    "Loop detections",
    f"{detections:,}",
    help="Runs a loop detector (repeated_action, action_cycle, repeated_decision, "
    "no_progress) stopped, plus runs observe mode flagged without stopping them (their "
    "stop stays completed, so they are not abnormal stops). Counted as "
    "loopwatch_loop_detections_total counts them.",
)
m4.metric(
    "Canary-flagged runs",
    f"{overview.canary_runs:,}",
    help="Runs in which the collector found a registered canary value (redacted).",
)
st.caption(
    f"{overview.abnormal_stops:,} of {overview.total_stops:,} stops were abnormal; "
    f"{detections:,} loop detection(s): {loop_stops:,} stopped the run, {observed:,} "
    f"recorded in observe mode on runs it did not stop; {overview.canary_runs:,} run(s) "
    "flagged by a canary."
)
if overview.note:
    st.warning(overview.note)

stops_text = charts.stops_text(overview.stops)
st.altair_chart(
    charts.stops_over_time_chart(overview.stops, bucket_seconds=window.bucket_seconds),
    width="stretch",
)
st.caption(ui.escape_md(stops_text))
with st.expander("Stops by reason (table)"):
    ui.dataframe(
        charts.stops_table(overview.stops),
        hide_index=True,
        column_config={"share": st.column_config.NumberColumn("share", format="percent")},
    )

by_agent, by_tool = st.columns(2)
with by_agent:
    agent_text = charts.runs_by_agent_text(overview.runs_by_agent)
    st.altair_chart(charts.runs_by_agent_chart(overview.runs_by_agent), width="stretch")
    st.caption(ui.escape_md(agent_text))
    with st.expander("Runs by agent (table)"):
        ui.dataframe(charts.runs_by_agent_table(overview.runs_by_agent), hide_index=True)
with by_tool:
    loops_text = charts.loops_text(overview.loops_by_tool)
    if overview.loops_by_tool.empty:
        st.subheader("Top tools by loop detections")
        st.caption(ui.escape_md(loops_text))
    else:
        st.altair_chart(charts.loops_by_tool_chart(overview.loops_by_tool), width="stretch")
        st.caption(ui.escape_md(loops_text))
        with st.expander("Loop detections by tool (table)"):
            ui.dataframe(charts.loops_table(overview.loops_by_tool), hide_index=True)

ui.footer(src)
