"""Policy replay: stored runs through one or two policies, side by side, as
``loopwatch replay`` reports them (stops by reason, false stops, tool calls saved).

The runs are the collector's stored, sampled runs (their steps): each becomes a
trajectory (:func:`loopwatch.replay.engine.trajectory_from_stored`) and is replayed
offline with the real guard. A run recorded as ``completed`` counts as successful, so a
stop on it is a false stop.

Query parameters: ``range`` (as on the overview), ``reason`` (stored stop reason),
``a`` and ``b`` (shipped profiles, e.g. ``default:replay-default``; ``b=none`` for one
policy).
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
from loopwatch.dashboard import ui
from loopwatch.dashboard.data import STOP_REASONS, RunFilter
from loopwatch.instrumentation.errors import PolicyError
from loopwatch.replay.engine import (
    MIN_LOOP_REPEATS,
    SHIPPED_POLICY_FILES,
    NamedPolicy,
    ReplayResult,
    compare,
    load_policy_spec,
    replay,
    summarize,
    unique_labels,
)
from loopwatch.replay.importers.stored import trajectory_from_stored
from loopwatch.replay.trajectory import Trajectory

ANY = "(any)"
NONE = "none"
PATH = "file path…"
UPLOAD = "upload a file…"
MAX_RUNS = (25, 50, 100, 200, 500)


@st.cache_data(show_spinner=False)
def _shipped_specs() -> list[str]:
    specs: list[str] = []
    for short in SHIPPED_POLICY_FILES:
        specs += [f"{short}:{p.label}" for p in load_policy_spec(short)]
    return specs


def _load(spec: str) -> list[NamedPolicy]:
    try:
        loaded: list[NamedPolicy] = load_policy_spec(spec)
    except PolicyError as exc:
        st.error("The policy file does not load:\n\n" + "\n".join(f"- {p}" for p in exc.problems))
        st.stop()
    return loaded


def _choose(side: str, default: str, *, optional: bool) -> list[NamedPolicy]:
    shipped = _shipped_specs()
    options = [*([NONE] if optional else []), *shipped, PATH, UPLOAD]
    choice = ui.select_param(
        f"Policy {side.upper()}", options, param=side, default=default, key=f"replay_{side}"
    )
    if choice == NONE:
        return []
    if choice == PATH:
        spec = st.text_input(
            "FILE[:PROFILE]", key=f"replay_{side}_path", help="A policy TOML file on the server"
        ).strip()
        if not spec:
            st.caption("Enter a policy file path.")
            return []
        return _load(spec)
    if choice == UPLOAD:
        upload = st.file_uploader("Policy TOML", type=["toml"], key=f"replay_{side}_upload")
        profile = st.text_input("Profile (all when empty)", key=f"replay_{side}_profile").strip()
        if upload is None:
            st.caption("Upload a policy file.")
            return []
        content = upload.getvalue()
        # One folder per content: reruns reuse the file instead of writing a new one.
        folder = Path(tempfile.gettempdir()) / "loopwatch-policy-uploads"
        folder = folder / hashlib.sha256(content).hexdigest()[:16]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (Path(upload.name).name or "policy.toml")
        path.write_bytes(content)
        return _load(f"{path}:{profile}" if profile else str(path))
    return _load(choice)


def _trajectories(src: Any, key: str, runs: pd.DataFrame) -> tuple[list[Trajectory], list[str]]:
    found: list[Trajectory] = []
    empty: list[str] = []
    for row in runs.to_dict("records"):
        run_id = str(row["run_id"])
        data = ui.call(ui.cached_run, key, src, run_id)
        if data is None or data.steps.empty:
            empty.append(run_id)
            continue
        found.append(
            trajectory_from_stored(
                run_id,
                data.step_records(),
                stop_reason=row.get("stop_reason") or None,
                agent=row.get("agent") or None,
                source=src.description,
            )
        )
    return found, empty


def _summary_frame(results: list[ReplayResult]) -> pd.DataFrame:
    summaries = summarize(results)
    reasons = sorted({r for s in summaries for r in s.stops_by_reason})
    rows: list[dict[str, Any]] = []

    def add(name: str, values: list[Any]) -> None:
        rows.append(
            {"figure": name, **{s.policy: v for s, v in zip(summaries, values, strict=True)}}
        )

    add("runs replayed", [s.runs for s in summaries])
    add("stopped", [s.stopped for s in summaries])
    for reason in reasons:
        add(f"stopped as {reason}", [s.stops_by_reason.get(reason, 0) for s in summaries])
    add("recorded loops", [s.loops for s in summaries])
    add("loops caught", [s.loops_caught for s in summaries])
    add("successful (completed) runs", [s.successful_runs for s in summaries])
    add("false stops", [s.false_stops for s in summaries])
    add(
        "false-stop rate",
        ["" if s.false_stop_rate is None else f"{100 * s.false_stop_rate:.1f}%" for s in summaries],
    )
    add(
        "median steps onset → stop",
        [
            "" if s.median_steps_onset_to_stop is None else f"{s.median_steps_onset_to_stop:g}"
            for s in summaries
        ],
    )
    add("tool calls recorded", [s.calls_total for s in summaries])
    add("tool calls saved", [s.calls_saved for s in summaries])
    add("model calls saved", [s.model_calls_saved for s in summaries])
    frame = pd.DataFrame(rows)
    for label in [s.policy for s in summaries]:
        frame[label] = frame[label].astype(str)
    return frame


def _verdict(r: ReplayResult | None) -> str:
    if r is None or r.stop_reason is None:
        return ""
    return f"{r.stop_reason} @ {r.stop_step}" + (" (false stop)" if r.false_stop else "")


def _runs_frame(results: list[ReplayResult], labels: list[str]) -> pd.DataFrame:
    per: dict[str, dict[str, ReplayResult]] = {}
    for r in results:
        per.setdefault(r.run_id, {})[r.policy] = r
    rows = []
    for run_id, by_label in per.items():
        first = next(iter(by_label.values()))
        row: dict[str, Any] = {
            "run": ui.run_url(run_id),
            "run_id": run_id,
            "recorded stop": first.recorded_stop or "",
            "steps": first.steps_total,
            "loop onset": first.loop.onset_step if first.loop is not None else None,
        }
        for label in labels:
            found = by_label.get(label)
            row[label] = _verdict(found)
            row[f"calls saved ({label})"] = found.calls_saved if found is not None else 0
        rows.append(row)
    return pd.DataFrame(rows)


ui.setup_page("Policy replay")
st.title("Policy replay")
st.caption(
    "Stored runs replayed offline through one or two policies with the real guard: where "
    "each policy would have stopped them. Same figures as `loopwatch replay`."
)
src, key = ui.source()

left, right = st.columns(2)
with left:
    chosen_a = _choose("a", "default:replay-default", optional=False)
with right:
    chosen_b = _choose("b", "seed:investigate-readonly", optional=True)

c1, c2, c3 = st.columns(3)
with c1:
    window = ui.time_range(key="replay_range", default="7d")
with c2:
    reason = ui.select_param(
        "Stored stop reason", [ANY, *STOP_REASONS], param="reason", default=ANY, key="replay_reason"
    )
with c3:
    limit = st.selectbox("Runs (newest first)", MAX_RUNS, index=2, key="replay_limit")
ui.sync_query_params({"range": window.key, "reason": reason}, {"range": "7d", "reason": ANY})

policies = unique_labels([*chosen_a, *chosen_b])
if not policies:
    st.info("Choose a policy to replay the stored runs through.")
    ui.footer(src)
    st.stop()

filters = RunFilter(
    stop_reason=None if reason == ANY else reason,
    since_unix_nano=window.since_unix_nano,
    until_unix_nano=window.until_unix_nano,
    sampled=True,
)
page = ui.call(ui.cached_runs, key, src, astuple(filters), int(limit), 0)
if page.runs.empty:
    ui.empty_state(
        f"No sampled run in the selected time range ({window.label.lower()}): replay needs "
        "the stored steps of a run."
    )
    ui.footer(src)
    st.stop()

# Reading every run's steps and replaying them takes seconds for a hundred runs: say so.
with st.spinner(f"Reading the stored steps of {len(page.runs)} run(s) and replaying them..."):
    trajectories, without_steps = _trajectories(src, key, page.runs)
    results = replay(trajectories, policies) if trajectories else []
if not trajectories:
    st.info("None of these runs has stored steps to replay.")
    ui.footer(src)
    st.stop()
labels = [p.label for p in policies]

m = st.columns(4)
m[0].metric("Runs replayed", len(trajectories))
m[1].metric("Policies", len(labels))
if len(labels) >= 2:
    comparison = compare(results, labels[0], labels[1])
    m[2].metric(f"Stopped by {labels[0]} only", comparison.only_a)
    m[3].metric(f"Stopped by {labels[1]} only", comparison.only_b)
    st.caption(
        f"Both policies stopped {comparison.both} run(s), neither stopped {comparison.neither}; "
        f"{len(comparison.differing)} run(s) end differently under the two."
    )
if without_steps:
    st.caption(f"{len(without_steps)} run(s) skipped: no stored steps.")

st.subheader("Side by side")
ui.dataframe(_summary_frame(results), hide_index=True)
st.caption(
    f"Recorded loops: runs whose stored steps hold a loop whatever the policy (at least "
    f"{MIN_LOOP_REPEATS} identical consecutive tool calls with unchanged results, or a "
    "repeated cycle). A run the live guard already stopped for looping usually holds none: "
    "its repeat was blocked before it got that far. Loops caught and the onset-to-stop "
    "median count those runs; the false-stop rate counts runs whose recorded outcome is "
    "success, and stays empty without any."
)

st.subheader("Runs")
runs_table = _runs_frame(results, labels)
ui.dataframe(
    runs_table,
    hide_index=True,
    column_config={
        "run": ui.RUN_LINK_COLUMN,
        "run_id": st.column_config.TextColumn("run id", width="medium"),
        "loop onset": st.column_config.NumberColumn(
            "loop onset", help="First step of the recorded loop, if any"
        ),
    },
    placeholder="",
)
st.caption(
    "Cells read `stop reason @ step` (the last step the policy let begin); empty: the "
    "policy lets the run reach its recorded end."
)
ui.footer(src)
