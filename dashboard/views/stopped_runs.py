"""Stopped runs: a filterable, sortable table of runs, each linking to its run view.

Every filter is a URL query parameter, so a filtered view can be shared: ``range``,
``reason``, ``agent``, ``tool``, ``canary`` (``yes``/``no``), ``sampled`` (``yes``/``no``),
``sort``, ``size``, ``offset`` and, on a lake with several collectors, ``collector``.
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st
from loopwatch.dashboard import ui
from loopwatch.dashboard.config import collectors_of
from loopwatch.dashboard.data import STOP_REASONS

ANY = "(any)"
FLAGS = {ANY: None, "yes": True, "no": False}
SORTS: dict[str, str | None] = {
    "newest first": None,
    "most steps": "steps",
    "most steps since progress": "steps_since_progress",
    "most tool calls": "tool_calls",
    "most blocked calls": "tool_blocked",
}
SIZES = ("25", "50", "100", "200")
DEFAULTS = {"range": "24h", "sort": "newest first", "size": "50", "offset": "0"}


def _offset() -> int:
    raw = st.query_params.get("offset", "0")
    return int(raw) if raw.isdigit() else 0


def _reset_offset() -> None:
    if "offset" in st.query_params:
        del st.query_params["offset"]


def _move(delta: int) -> None:
    st.query_params["offset"] = str(max(0, _offset() + delta))


def _filter(label: str, options: Sequence[str], param: str) -> str:
    """A filter select, unset by default; changing it returns to the first page."""
    return str(
        ui.select_param(
            label, options, param=param, default=ANY, key=f"runs_{param}", on_change=_reset_offset
        )
    )


ui.setup_page("Stopped runs")
st.title("Stopped runs")
src, key = ui.source()

c1, c2, c3, c4 = st.columns(4)
with c1:
    window = ui.time_range(key="runs_range", on_change=_reset_offset)
    canary = _filter("Canary flagged", list(FLAGS), "canary")
with c2:
    reason = _filter("Stop reason", [ANY, *STOP_REASONS], "reason")
    sampled = _filter("Sampled", list(FLAGS), "sampled")
with c3:
    agent = ui.text_param("Agent", param="agent", key="runs_agent", on_change=_reset_offset)
    sort = ui.select_param(
        "Sort", list(SORTS), param="sort", default=DEFAULTS["sort"], key="runs_sort"
    )
with c4:
    tool = ui.text_param("Tool involved", param="tool", key="runs_tool", on_change=_reset_offset)
    size = ui.select_param(
        "Rows per page",
        SIZES,
        param="size",
        default=DEFAULTS["size"],
        key="runs_size",
        on_change=_reset_offset,
    )

# Only a source with several collectors (the lake) offers the filter.
collectors = ui.call(collectors_of, src)
collector = _filter("Collector", [ANY, *collectors], "collector") if len(collectors) > 1 else ANY
offset = _offset()
limit = int(size)
filters = (
    None if reason == ANY else reason,
    agent or None,
    tool or None,
    window.since_unix_nano,
    window.until_unix_nano,
    FLAGS[canary],
    FLAGS[sampled],
    None,  # detector
    None,  # loop_tool
    None if collector == ANY else collector,
)
ui.sync_query_params(
    {
        "range": window.key,
        "reason": None if reason == ANY else reason,
        "agent": agent,
        "tool": tool,
        "canary": None if canary == ANY else canary,
        "sampled": None if sampled == ANY else sampled,
        "collector": None if collector == ANY else collector,
        "sort": sort,
        "size": size,
        "offset": str(offset),
    },
    DEFAULTS,
)

page = ui.call(ui.cached_runs, key, src, filters, limit, offset)
if page.runs.empty:
    if offset > 0:
        st.info("No more runs on this page.")
        st.button("First page", on_click=_reset_offset)
    elif any(f is not None for f in (*filters[:3], *filters[5:])):
        st.info("No runs match these filters. Widen the time range or clear a filter.")
    else:
        ui.empty_state(f"No runs in the selected time range ({window.label.lower()}).")
    ui.footer(src)
    st.stop()

column = SORTS[sort]
runs = page.runs
if column is not None:
    runs = runs.sort_values(column, ascending=False, na_position="last", kind="stable")
st.caption(
    f"Runs {offset + 1:,}–{offset + len(page.runs):,}, {sort}"
    + ("" if column is None else " (within this page; pages follow time, newest first)")
    + ". Click a column header to sort, a run id to open its run view."
)
ui.runs_table(runs, key="runs")

prev_col, next_col, _ = st.columns([1, 1, 4])
with prev_col:
    st.button("Previous page", disabled=offset == 0, on_click=_move, args=(-limit,), key="prev")
with next_col:
    st.button(
        "Next page", disabled=page.next_offset is None, on_click=_move, args=(limit,), key="next"
    )

ui.footer(src)
