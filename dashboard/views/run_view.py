"""Run view (incident review): the last steps before the stop, and why it stopped.

A run without a stop (still running, its agent killed, its stop span lost) shows its last
stored steps, named as such: nothing on the page says it stopped there.

Query parameters: ``run_id`` (required to show a run), ``last`` (steps before the stop,
or last steps without one; default 20), ``all`` (``1``: every stored step).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime

import pandas as pd
import streamlit as st
from loopwatch.dashboard import charts, explain, runview, ui


def _when(ns: object) -> str:
    if not isinstance(ns, int | float) or pd.isna(ns):
        return "unknown time"
    return datetime.fromtimestamp(float(ns) / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


MAX_EXPANDERS = 100
# The steps table grows with its rows up to this many (the default window is 20 steps).
MAX_TABLE_ROWS = 60
# Rows a little shorter than Streamlit's 35 px: 20 steps and the header fit under the
# stop card's top at 1440x900.
STEP_ROW_PX = 28
STEP_COLUMNS = {
    "steps": st.column_config.TextColumn("steps", width=60),
    "action": st.column_config.TextColumn("action", width=190),
    "count": st.column_config.NumberColumn("count", width=55),
    "outcomes": st.column_config.TextColumn("outcomes", width=140),
    "progress": st.column_config.NumberColumn(
        "progress", width=70, help="Steps of the row with progress evidence"
    ),
    "marks": st.column_config.TextColumn(
        "marks", width=240, help="Where progress ceased, the stop, nudges and warnings"
    ),
}
DEFAULT_LAST = runview.DEFAULT_LAST_STEPS

ui.setup_page("Run view")
# Title and run id on one line: at 900 px high the last steps must fit under them.
title_col, id_col = st.columns([1, 3], vertical_alignment="bottom")
title_col.title("Run view")
src, key = ui.source()

# The export button sits beside the run id: the header stays one line high.
input_col, export_col = id_col.columns([5, 1], vertical_alignment="bottom")
with input_col:
    run_id = ui.text_param(
        "Run id",
        param="run_id",
        key="run_view_run_id",
        help="Paste a run id, or open one from the Stopped runs page.",
    )
if not run_id:
    ui.sync_query_params({"run_id": None, "last": None, "all": None}, {})
    st.info(
        "No run selected. Open a run from the Stopped runs page (its run id links here), "
        "or paste a run id above."
    )
    ui.footer(src)
    st.stop()

detail = ui.call(ui.cached_run, key, src, run_id)
if detail is None:
    ui.sync_query_params({"run_id": run_id}, {})
    st.warning(
        f"No run with id {ui.code_md(run_id)} in this source. Check the id, or the source below."
    )
    ui.footer(src)
    st.stop()

run = detail.run
stop = detail.stop
steps = runview.build_steps(detail.step_records())
card = runview.stop_card(stop, detail.evidence)
# The stop's own step (0: before the first step), or None: no stop, or one naming no step.
stopped_at = card.step if card is not None else None
last_stored = steps[-1].step if steps else None
# The steps shown end at the stop, else at the last stored step.
window_end = stopped_at if stopped_at else last_stored


# A third-party agent (no loopwatch code) sends no policy: the collector judged its calls.
third_party = run.get("source") not in (None, "", "loopwatch")
policy_text = (
    "judged by the collector in observe mode"
    if third_party
    else f"policy {ui.code_md(run.get('policy_name'))} version "
    f"{ui.code_md(run.get('policy_version'))} · mode {ui.code_md(run.get('mode'))}"
)
st.caption(
    f"Agent **{ui.escape_md(run.get('agent') or '(unnamed)')}** · {policy_text} · "
    f"{_when(run.get('time_unix_nano'))} · source {ui.code_md(run.get('source'))}"
    + (" · canary flagged" if run.get("canary_detected") else "")
    + (f" · collector {ui.code_md(run['collector_id'])}" if run.get("collector_id") else "")
)


export_body: dict[str, object] = {
    "run": run,
    "steps": detail.step_rows,
    "stop": stop,
    "evidence": detail.evidence,
}


def _export(body: dict[str, object] = export_body) -> bytes:
    """The run as OTLP/JSON that ``loopwatch replay`` reads back to the same stop (built
    on click, on Streamlit's download thread)."""
    from loopwatch.replay.export_run import ExportError, export_otlp_json

    try:
        return export_otlp_json(body)
    except ExportError as exc:  # no steps kept: a file that says why, not a broken one
        return json.dumps({"error": str(exc), "run_id": run_id}).encode()


with export_col:
    st.download_button(
        "Export",
        data=_export,
        file_name=f"{re.sub(r'[^A-Za-z0-9._-]+', '_', run_id)[:120]}.otlp.json",
        mime="application/json",
        on_click="ignore",
        disabled=not detail.has_steps,
        help="The stored run as an OTLP/JSON file: attach it to the ticket, then "
        "`loopwatch replay FILE` gives the same stop under the same policy "
        "(docs/policy.md, From incident to test)."
        + (" No steps were kept for this run: nothing to replay." if not detail.has_steps else ""),
    )

# ------------------------------------------------------------ stop card | steps
# Side by side at 1280 px and up: the page opens on why it stopped *and* the loop (the
# last steps before the stop), with no scrolling (issue 28: the loop rows sat below the
# fold under the card).
card_col, steps_col = st.columns([5, 7], gap="medium")
with card_col, st.container(border=True):
    if card is None:
        st.subheader("No stop recorded")
        st.write(
            "The collector has no stop for this run yet (still running, or its stop span "
            "was lost). Counts below are what arrived so far."
        )
    else:
        st.subheader(f"Stop: {ui.escape_md(card.reason)}")
        st.markdown(ui.escape_md(explain.stop_sentence(stop, detail.evidence)))
        # Two rows of two, the wider column for the longer values ("observed 95 = limit
        # 95"): four in a row, or two equal ones, cut them.
        s1, s2 = st.columns([3, 2])
        s3, s4 = st.columns([3, 2])
        s1.metric("Stop reason", ui.escape_md(card.reason))
        s2.metric("Stopped at step", "–" if card.step is None else str(card.step))
        # The basis goes in the label: the value cuts "observed 1 > limit 0 (projected)" short.
        basis = f" ({ui.escape_md(card.basis)})" if card.basis and card.crossing else ""
        s3.metric(f"Limit vs observed{basis}", ui.escape_md(card.crossing) or "–")
        s4.metric(
            "Steps since progress",
            "–" if card.steps_since_progress is None else str(card.steps_since_progress),
        )
        more = card.facts(headline=False)
        if more:
            st.markdown(
                "\n".join(
                    f"- **{ui.escape_md(label)}**: {ui.code_md(value)}" for label, value in more
                )
            )
    if detail.anomalies:
        st.warning(runview.anomaly_summary(detail.anomalies))
        ui.dataframe(pd.DataFrame(detail.anomalies), hide_index=True)
        if detail.anomalies_truncated:
            st.caption("Only the first stop reports were returned (the row cap).")

ceased = runview.progress_ceased(steps, detail.evidence) if steps else None
shown: list[runview.StepGroup] = []
with steps_col:
    if steps:
        groups = runview.mark_groups(
            runview.collapse(steps),
            ceased,
            stopped_at,
            last_stored=last_stored if stopped_at is None else None,
        )
        steps_label = "Steps before the stop" if stopped_at is not None else "Last stored steps"
        st.subheader(steps_label)
        # The controls sit under the table; their state (or the URL, on a first visit)
        # decides what the table shows.
        raw_last = st.query_params.get("last", "")
        last_n = int(
            st.session_state.get(
                "run_view_last",
                int(raw_last) if raw_last.isdigit() and int(raw_last) > 0 else DEFAULT_LAST,
            )
        )
        show_all = bool(st.session_state.get("run_view_all", st.query_params.get("all") == "1"))
        shown = groups if show_all else runview.last_steps(groups, last_n, stop_step=window_end)
        hidden = len(groups) - len(shown)
        # As tall as its rows (up to MAX_TABLE_ROWS): the last steps are read without
        # scrolling inside the table.
        ui.dataframe(
            runview.group_table(shown),
            hide_index=True,
            height=ui.table_height(len(shown), max_rows=MAX_TABLE_ROWS, row_px=STEP_ROW_PX),
            row_height=STEP_ROW_PX,
            column_config=STEP_COLUMNS,
        )
        st.caption(
            f"{len(steps):,} stored step(s) in {len(groups):,} row(s) (identical consecutive "
            f"actions collapsed); showing {len(shown):,} row(s), steps {shown[0].first_step}–"
            f"{shown[-1].last_step}" + (f"; {hidden:,} earlier row(s) hidden." if hidden else ".")
        )
        if ceased is not None:
            st.info(ceased.text[0].upper() + ceased.text[1:] + ".")
        if detail.steps_truncated:
            st.caption("Only the last steps of this long run were returned (the row cap).")
        left, right = st.columns([3, 2], vertical_alignment="bottom")
        with left:
            picked = st.number_input(
                steps_label,
                min_value=1,
                max_value=1_000_000,
                value=last_n,
                step=5,
                key="run_view_last",
            )
        with right:
            picked_all = st.checkbox("Show every stored step", value=show_all, key="run_view_all")
        ui.sync_query_params(
            {"run_id": run_id, "last": str(picked), "all": "1" if picked_all else None},
            {"last": str(DEFAULT_LAST)},
        )

loop = explain.loop_evidence(stop, detail.evidence, steps)
if loop is not None:
    with card_col, st.container(border=True):
        what = "unchanged result" if loop.unchanged else "last result"
        st.markdown(
            f"**The repeated call: {ui.escape_md(loop.tool)}**"
            + (f" (steps {runview.compress_indices(loop.steps)})" if loop.steps else "")
        )
        if loop.arguments is None and loop.result is None:
            st.caption(explain.CAPTURE_HINT)
        else:
            st.caption("arguments (redacted by the collector, truncated)")
            st.markdown(ui.code_md(loop.arguments or "(not captured)"))
            st.caption(f"{what} (redacted, truncated)")
            st.markdown(ui.code_md(loop.result or "(not captured)"))

# ---------------------------------------------------------------------- usage
usage = runview.usage_counters(stop, run)
if usage:
    st.subheader("Usage")
    for column, (label, value) in zip(st.columns(len(usage)), usage, strict=True):
        column.metric(label, value, help=runview.USAGE_HELP.get(label))

notice = runview.sampling_notice(run, len(detail.step_rows))
if notice:
    st.warning(notice)


# ------------------------------------------------------------------ step details
def _step_details(group: runview.StepGroup) -> None:
    """One row's details: its steps (collapsed rows), decision, and each call with its
    arguments and result."""
    first = group.steps[0]
    if group.collapsed:
        st.write(f"{group.count} consecutive steps with the same action; each step below.")
        ui.dataframe(
            pd.DataFrame(
                [
                    {
                        "step": s.step,
                        "outcomes": ", ".join(c.outcome or "?" for c in s.calls),
                        "progress": s.progress,
                        "steps since progress": s.steps_since_progress,
                        "blocked by": ", ".join(c.blocked_by for c in s.calls if c.blocked_by),
                        "observation": ", ".join(
                            (c.observation_digest or "")[:12] for c in s.calls
                        ),
                    }
                    for s in group.steps
                ]
            ),
            hide_index=True,
        )
    st.markdown(
        f"Decision: {ui.code_md(first.decision_type or 'unknown')}"
        + (f", {first.tokens:,} tokens" if first.tokens else "")
    )
    for call in first.calls:
        facts = [f"outcome {ui.code_md(call.outcome)}"]
        if call.blocked_by:
            facts.append(f"blocked by {ui.code_md(call.blocked_by)}")
        if call.ladder_mark:
            facts.append(ui.escape_md(call.ladder_mark))
        if call.error_type:
            facts.append(f"error {ui.code_md(call.error_type)}")
        if call.failure_class:
            facts.append(f"failure class {ui.code_md(call.failure_class)}")
        facts.append("progress" if call.progress else "no progress")
        st.markdown(f"**{ui.escape_md(call.tool)}**: " + ", ".join(facts))
        for label, content in (("arguments", call.arguments), ("result", call.result)):
            folded = runview.fold(content)
            if not folded.full:
                st.caption(f"{label}: not captured")
                continue
            short = f" (folded): {ui.escape_md(folded.short)}" if folded.folded else ":"
            st.caption(f"{label}{short}")
            st.code(folded.full, language="json")


if steps:
    if len(shown) > MAX_EXPANDERS:
        st.caption(f"Details below for the last {MAX_EXPANDERS} rows.")
    run_tag = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    for group in shown[-MAX_EXPANDERS:]:
        title = ui.escape_md(group.title + "".join(f" · {m}" for m in group.marks))
        # Closed, and tracked (opening one reruns the page from the cached read): a
        # closed row's details are not sent at all. Sent, the highlighted arguments and
        # results took the browser 0.4 s per opened run (issue 28: opening a run within
        # 1 s); the marks are in the steps table and the titles.
        box = st.expander(
            title,
            key=f"run_view_step_{run_tag}_{group.first_step}",
            on_change="rerun",
        )
        if box.open:
            with box:
                _step_details(group)

    series = runview.progress_series(steps, card)
    if not series.empty:
        ceased_step = ceased.step if ceased is not None else None
        st.markdown("**Steps since progress**")
        st.caption(charts.progress_text(series, ceased_step=ceased_step, stop_step=stopped_at))
        # The chart on demand: drawing it took the browser 0.25 s per opened run, and
        # the sentence above and the table's progress column say what it shows.
        chart_box = st.expander("Chart", key=f"run_view_chart_{run_tag}", on_change="rerun")
        if chart_box.open:
            with chart_box:
                st.altair_chart(
                    charts.progress_chart(series, ceased_step=ceased_step, stop_step=stopped_at),
                    width="stretch",
                )

# --------------------------------------------------------------- tools, limits
tools_col, limits_col = st.columns(2)
with tools_col:
    if detail.nudges or detail.nudges_dropped:
        st.subheader("Nudges")
        st.caption(
            "Calls the guard answered with a nudge instead of running them, and what "
            "followed: recovered (progress, or a completed stop, before any further "
            "detection), stopped (a later rung stopped the run) or ended."
            + (f" {detail.nudges_dropped:,} more not listed." if detail.nudges_dropped else "")
        )
        ui.dataframe(pd.DataFrame(list(detail.nudges)), hide_index=True)

    st.subheader("Tool calls")
    if detail.tools.empty:
        st.caption("This run called no tool.")
    else:
        ui.dataframe(detail.tools, hide_index=True)
        if detail.tools_truncated:
            st.caption("Only the first tools (by name) were returned (the row cap).")
with limits_col:
    st.subheader("Effective limits")
    if detail.limits is None and third_party:
        st.caption(
            "A third-party agent sends no limits. The collector replayed its tool calls "
            "through the guard in observe mode: default detector settings, no usage "
            "budgets (docs/collector.md, server-side detection)."
        )
    elif detail.limits is None:
        st.caption(
            "This source does not return the run's effective limits (a collector older "
            "than this dashboard, or a run whose agent sent none); open the database file "
            "with --db to see them."
        )
    else:
        st.caption("Each limit the guard enforced, and where it came from.")
        ui.dataframe(detail.limits, hide_index=True)

ui.footer(src)
