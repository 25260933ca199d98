"""Policy replay: stored runs through one or two policies, side by side, as
``loopwatch replay`` reports them (stops by reason, false stops, tool calls saved).

The runs are the collector's stored, sampled runs (their steps): each becomes a
trajectory (:func:`loopwatch.replay.engine.trajectory_from_stored`) and is replayed
offline with the real guard. A run recorded as ``completed`` counts as successful, so a
stop on it is a false stop.

By default the runs are stopped runs (any reason but ``completed``) spread over the
agents, the count of each shown; their steps are read in one query and replayed with a
progress bar.

Query parameters: ``range`` (as on the overview), ``reason`` (stored stop reason,
``(any)``, or the default), ``runs`` (how many, 25 to 500), ``a`` and ``b`` (shipped
profiles, e.g. ``default:replay-default``; ``b=none`` for one policy).
"""

from __future__ import annotations

import hashlib
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
from loopwatch.dashboard import ui
from loopwatch.dashboard.data import STOP_REASONS, RunFilter, steps_of_runs
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
STOPPED = "(stopped: any reason but completed)"
ABNORMAL = tuple(r for r in STOP_REASONS if r != "completed")
REPLAY_CHUNK = 50
NONE = "none"
PATH = "file path…"
UPLOAD = "upload a file…"
MAX_RUNS = (25, 50, 100, 200, 500)
DEFAULT_RUNS = 100


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


def _trajectories(
    src: Any, runs: pd.DataFrame, progress: Any
) -> tuple[list[Trajectory], list[str]]:
    # ONE read for every run's steps (data.steps_of_runs), not one per run: 500 runs
    # took 40 s one by one.
    progress.progress(0.0, text=f"Reading the stored steps of {len(runs):,} run(s)...")
    stored = ui.call(steps_of_runs, src, runs["run_id"].astype(str).tolist())
    found: list[Trajectory] = []
    empty: list[str] = []
    for row in runs.to_dict("records"):
        run_id = str(row["run_id"])
        rows = stored.get(run_id)
        if not rows:
            empty.append(run_id)
            continue
        found.append(
            trajectory_from_stored(
                run_id,
                rows,
                stop_reason=row.get("stop_reason") or None,
                agent=row.get("agent") or None,
                source=src.description,
            )
        )
    return found, empty


def _replay(
    trajectories: list[Trajectory], policies: list[NamedPolicy], progress: Any
) -> list[ReplayResult]:
    # In chunks, so the bar moves: each run is replayed on its own, so chunks change
    # nothing in the results.
    results: list[ReplayResult] = []
    total = len(trajectories)
    for start in range(0, total, REPLAY_CHUNK):
        done = min(start + REPLAY_CHUNK, total)
        results += replay(trajectories[start:done], policies)
        progress.progress(
            0.1 + 0.9 * done / total, text=f"Replayed {done:,} of {total:,} run(s)..."
        )
    return results


@st.cache_data(ttl=ui.TTL_SECONDS, show_spinner=False, max_entries=32)
def _stopped_runs(
    key: str, _src: Any, reasons: tuple[str, ...], since: int, until: int, limit: int
) -> pd.DataFrame:
    """The newest sampled runs of each abnormal stop reason, spread over the agents."""
    del key

    def newest(reason: str) -> pd.DataFrame:
        filters = RunFilter(
            stop_reason=reason, since_unix_nano=since, until_unix_nano=until, sampled=True
        )
        return _src.runs(filters, limit=limit).runs

    # One list query per reason that has stops (a filter holds one reason), at once.
    with ThreadPoolExecutor(max_workers=4) as pool:
        frames = [f for f in pool.map(newest, reasons) if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["run_id", "agent", "stop_reason", "time"])
    pool_frame = pd.concat(frames, ignore_index=True).drop_duplicates("run_id")
    pool_frame = pool_frame.sort_values("time", ascending=False, kind="stable")
    # Round robin over the agents, newest first within each: one agent's burst of runs
    # does not fill the selection (the 100 newest runs were all one agent's, issue 28).
    pool_frame["_rank"] = pool_frame.groupby(pool_frame["agent"].fillna(""), sort=False).cumcount()
    chosen = pool_frame.sort_values(["_rank", "time"], ascending=[True, False], kind="stable")
    return chosen.head(limit).drop(columns="_rank").reset_index(drop=True)


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
        "Stored stop reason",
        [STOPPED, ANY, *STOP_REASONS],
        param="reason",
        default=STOPPED,
        key="replay_reason",
    )
with c3:
    limit = int(
        ui.select_param(
            "Runs (newest first)",
            [str(n) for n in MAX_RUNS],
            param="runs",
            default=str(DEFAULT_RUNS),
            key="replay_limit",
        )
    )
ui.sync_query_params(
    {"range": window.key, "reason": reason, "runs": str(limit)},
    {"range": "7d", "reason": STOPPED, "runs": str(DEFAULT_RUNS)},
)

policies = unique_labels([*chosen_a, *chosen_b])
if not policies:
    st.info("Choose a policy to replay the stored runs through.")
    ui.footer(src)
    st.stop()

if reason == STOPPED:
    # The default: stopped runs of every agent (round robin), so the first view has
    # something to compare; "(any)" lists the newest runs, whoever sent them.
    runs = ui.call(
        _stopped_runs,
        key,
        src,
        ABNORMAL,
        window.since_unix_nano,
        window.until_unix_nano,
        int(limit),
    )
else:
    filters = RunFilter(
        stop_reason=None if reason == ANY else reason,
        since_unix_nano=window.since_unix_nano,
        until_unix_nano=window.until_unix_nano,
        sampled=True,
    )
    runs = ui.call(ui.cached_runs, key, src, astuple(filters), int(limit), 0).runs
if runs.empty:
    ui.empty_state(
        f"No sampled run in the selected time range ({window.label.lower()}): replay needs "
        "the stored steps of a run."
    )
    ui.footer(src)
    st.stop()

by_agent = runs["agent"].fillna("").replace("", "(unnamed)").value_counts()
st.caption(
    f"{len(runs):,} run(s) selected, by agent: "
    + ", ".join(f"{ui.escape_md(agent)} {count:,}" for agent, count in by_agent.items())
    + "."
)

bar = st.progress(0.0, text="Reading the stored steps...")
trajectories, without_steps = _trajectories(src, runs, bar)
results = _replay(trajectories, policies, bar) if trajectories else []
bar.empty()
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
id_prefix, id_parts = ui.short_run_ids(runs_table["run_id"].astype(str).tolist())
runs_table["run_id"] = id_parts
ui.dataframe(
    runs_table,
    hide_index=True,
    column_config={
        "run": ui.RUN_LINK_COLUMN,
        "run_id": ui.run_id_column(id_prefix),
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
