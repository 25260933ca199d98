"""Tools: per tool, calls, errors, blocked and nudged calls, loop detections by detector,
repeated-action rate, nudge recovery rate, and the runs that looped on it.

Query parameters: ``range`` (as on the overview), ``tool`` (the tool whose looping runs
are listed).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st
from loopwatch.dashboard import charts, ui
from loopwatch.dashboard.data import LOOP_DETECTORS, LOOPED_RUNS_LIMIT, TOOL_OUTCOME_COLUMNS

# Short column labels for the detectors (the help says the full name).
DETECTOR_LABELS = {
    "repeated_action": "rep. action",
    "action_cycle": "cycle",
    "repeated_decision": "rep. decision",
    "no_progress": "no progress",
}

ui.setup_page("Tools")
st.title("Tools")
src, key = ui.source()

window = ui.time_range(key="tools_range")
data = ui.call(ui.cached_tools, key, src, window.since_unix_nano, window.until_unix_nano)
loops = charts.loops_table(data.loops)

if data.note:
    st.info(data.note)
if (data.tools is None or data.tools.empty) and loops.empty:
    ui.empty_state(f"No tool calls in the selected time range ({window.label.lower()}).")
    ui.footer(src)
    st.stop()

loop_counts = loops.assign(tool=loops["tool"].replace("(no tool)", ""))
if data.tools is not None and not data.tools.empty:
    table = data.tools.merge(loop_counts, on="tool", how="left")
    for column in (*LOOP_DETECTORS, "total"):
        table[column] = table[column].fillna(0).astype("int64")
    table = table.rename(columns={"total": "loop detections"})
    ui.dataframe(
        table,
        hide_index=True,
        height=ui.table_height(len(table)),
        column_order=(
            "tool",
            "calls",
            *TOOL_OUTCOME_COLUMNS,
            "runs",
            "loop detections",
            *LOOP_DETECTORS,
            "repeated_action_rate",
            "nudges",
            "nudge_recovery_rate",
        ),
        # Widths and short labels (full names in the help) that fit all 15 columns at
        # 1440 px: the right-hand ones were cut off (issue 28).
        column_config={
            "tool": st.column_config.TextColumn("tool", width=260),
            "calls": st.column_config.NumberColumn("calls", width=55),
            "ok": st.column_config.NumberColumn("ok", width=50),
            "errors": st.column_config.NumberColumn("errors", width=55),
            "blocked": st.column_config.NumberColumn("blocked", width=62),
            **{
                detector: st.column_config.NumberColumn(
                    DETECTOR_LABELS.get(detector, detector),
                    help=f"Loop detections by the {detector} detector",
                    width=92,
                )
                for detector in LOOP_DETECTORS
            },
            "runs": st.column_config.NumberColumn(
                "runs", help="Runs that called the tool", width=50
            ),
            "loop detections": st.column_config.NumberColumn(
                "loops",
                width=55,
                help="Runs a loop detector stopped, or flagged in observe mode, whose "
                "detection named this tool",
            ),
            "repeated_action_rate": st.column_config.NumberColumn(
                "rep. action rate",
                format="percent",
                width=110,
                help="Share of the runs calling this tool that the repeated-action "
                "detector stopped",
            ),
            "nudged": st.column_config.NumberColumn(
                "nudged", width=62, help="Calls the guard answered with a nudge instead of running"
            ),
            "nudges": st.column_config.NumberColumn(
                "nudges", width=62, help="Nudges on this tool the runs' stops report a result for"
            ),
            "nudge_recovery_rate": st.column_config.NumberColumn(
                "nudge recovery",
                format="percent",
                width=110,
                help="Share of those nudges after which the run recovered (progress or a "
                "completed stop before any further detection); blank with no nudge",
            ),
        },
    )
    calls_text = charts.tool_calls_text(data.tools, top=15)
    st.caption(
        "Loop detections count each run a loop detector stopped, or flagged in observe mode, "
        "under the tool its detection named (no tool for no_progress), as the "
        "loopwatch_loop_detections_total metric does. " + ui.escape_md(calls_text)
    )
    st.altair_chart(charts.tool_calls_chart(data.tools), width="stretch")
    tool_names = data.tools["tool"].astype(str).tolist()
else:
    ui.dataframe(loops, hide_index=True)
    tool_names = [t for t in loops["tool"].astype(str) if t != "(no tool)"]

loops_text = charts.loops_text(data.loops)
if not data.loops.empty:
    st.altair_chart(charts.loops_by_tool_chart(data.loops), width="stretch")
st.caption(ui.escape_md(loops_text))

st.subheader("Runs that looped on a tool")
looping = [t for t in loops["tool"].astype(str) if t != "(no tool)"]
options = looping + [t for t in tool_names if t not in looping]
if not options:
    st.caption("No tool was called in this range.")
else:
    tool = ui.select_param("Tool", options, param="tool", default=options[0], key="tools_tool")
    ui.sync_query_params({"range": window.key, "tool": str(tool)}, {"range": "24h"})
    runs: pd.DataFrame = ui.call(
        ui.cached_looped_runs, key, src, str(tool), window.since_unix_nano, window.until_unix_nano
    )
    if runs.empty:
        st.caption(
            f"No loop detection named {ui.escape_md(tool)} in this range (a run stopped "
            "by a loop detector, or flagged by one in observe mode)."
        )
    else:
        capped = len(runs) >= LOOPED_RUNS_LIMIT
        st.caption(
            (f"The {len(runs)} newest runs" if capped else f"{len(runs)} run(s)")
            + f" whose loop detection named {ui.escape_md(tool)}: stopped by a loop "
            "detector, or flagged by one in observe mode (their stop reason stays "
            "completed), newest first"
            + ("; the Stopped runs page lists them all." if capped else ".")
        )
        ui.runs_table(runs, key="looped")

ui.footer(src)
