"""Dashboard benchmark: the stopped-runs and run-view data paths over a large store.

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_dashboard.py [--runs N] [--steps S] [--repeat R]

or through pytest with ``LOOPWATCH_BENCH`` set (``test_bench_dashboard_smoke``: 100,000
runs and the 10,000-step run, sanity checks only; skipped otherwise).

What is measured (issue 4, "Speed": each page renders in under 1 s after warm-up with
1,000,000 runs in the store; the data path with its limits, not the page):

- a fresh DuckDB file with the collector's schema (``apply_migrations``), filled straight
  with ``INSERT ... SELECT`` (not through the pipeline): ``--runs`` runs over the last 7
  days (8 agents, 24 tools, every stop reason, 1 % sampled with 10 stored steps, 0.1 %
  canary-flagged; ``run_tools``, ``stops`` and ``canary_flags`` rows to match), plus one
  run of ``--steps`` steps (a decision and a tool result each, ``repeated_action``);
- the stopped-runs data path: ``ApiSource.runs`` through a real ``loopwatch collector``
  subprocess opened on that file (``/api/v1/runs`` with its ``steps_since_progress``
  query), and ``DuckDBSource.runs`` on the file (after the collector has exited), for
  the page's default (last 24 h, 50 rows) and its filters;
- the run-view data path: ``run(run_id)`` of the long run plus what the run view page
  computes from it (steps, collapse, marks, the last 20 steps, the progress series and
  its chart spec);
- for information, the overview and tools aggregates over 24 h.

Each figure is the median of ``--repeat`` calls after one warm-up call (the page caches
answers for 15 s, so a warm page costs nothing: this is the uncached cost).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NS = 1_000_000_000
DAY_NS = 86_400 * NS
LONG_RUN = "bench-long-run"
TOOLS = 24
AGENTS = 8
BUDGET_SECONDS = 1.0
LOOP_REASONS = ("repeated_action", "action_cycle", "repeated_decision", "no_progress")
# Per 40 runs: 30 completed, one of each other reason (and a second repeated_action).
_REASON_SQL = (
    "CASE i % 40 WHEN 0 THEN 'repeated_action' WHEN 1 THEN 'budget_exhausted' "
    "WHEN 2 THEN 'no_progress' WHEN 3 THEN 'action_cycle' WHEN 4 THEN 'error' "
    "WHEN 5 THEN 'repeated_decision' WHEN 6 THEN 'deadline_exceeded' "
    "WHEN 7 THEN 'final_unverified' WHEN 8 THEN 'refused' WHEN 9 THEN 'cancelled' "
    "WHEN 10 THEN 'repeated_action' ELSE 'completed' END"
)
_LIMITS = (
    '{"repeat_limit":{"source":"call","value":10000},'
    '"max_model_turns":{"source":"default","value":20000},'
    '"max_cost_usd":{"source":"default","value":10.0}}'
)


# --------------------------------------------------------------------- the store


def build_store(path: Path, *, runs: int, long_steps: int, now_ns: int) -> None:
    """Write ``runs`` runs and the ``long_steps``-step run into a fresh file at ``path``."""
    import duckdb
    import pyarrow as pa
    from loopwatch.collector.store.schema import apply_migrations
    from loopwatch.collector.store.schema import run_key_of as _run_key

    ids = [f"bench-{i:08d}" for i in range(runs)]
    keys = pa.table(
        {
            "i": pa.array(range(runs), pa.int64()),
            "run_key": pa.array([_run_key(r) for r in ids], pa.uint64()),
            "run_id": pa.array(ids, pa.string()),
        }
    )
    con = duckdb.connect(str(path))
    try:
        apply_migrations(con)
        con.register("k", keys)
        span_ns = 7 * DAY_NS
        # Oldest first, as the collector appends them; i = 0 is the newest run.
        con.execute(
            f"""CREATE TEMP TABLE g AS SELECT i, run_key, run_id,
                printf('%032x', i) AS trace_id,
                ? - 2 * {NS} - i * ? AS t,
                'agent-' || (i % {AGENTS}) AS agent,
                'tool_' || (i % {TOOLS}) AS tool,
                {_REASON_SQL} AS reason,
                1 + i % 30 AS steps
            FROM k ORDER BY i DESC""",
            [now_ns, span_ns // runs],
        )
        con.execute(
            """INSERT INTO runs (run_key, run_id, trace_id, run_span_id, source, agent,
                policy_name, policy_version, detector_version, limits, mode,
                start_unix_nano, end_unix_nano, status_code, steps, decisions, tool_calls,
                tool_errors, tool_blocked, tokens, stop_reason, stop_origin, stop_inferred,
                stop_unix_nano, sample_tool, sampled, sample_rule, decided_unix_nano,
                first_seen_unix_nano, last_seen_unix_nano, duplicate_stops)
            SELECT run_key, run_id, trace_id, printf('%016x', i), 'loopwatch', agent,
                'default', 'builtin', '1', NULL, 'enforce',
                t - steps * 1000000000, t, 0, steps, steps, steps,
                CASE WHEN reason = 'error' THEN 1 ELSE 0 END,
                CASE WHEN reason = 'repeated_action' THEN 1 ELSE 0 END,
                steps * 150, reason, 'stop_span', false, t, tool,
                i % 100 = 0, CASE WHEN i % 100 = 0 THEN 'abnormal' ELSE 'over_cap' END,
                t + 1000, t + 1000, t + 1000, 0
            FROM g"""
        )
        con.execute(
            """INSERT INTO stop_reports (run_key, run_id, trace_id, span_id, source, origin,
                stop_inferred, reason, time_unix_nano, step, limit_value, observed, evidence,
                message, steps_since_progress, usage_model_turns, usage_tool_attempts,
                usage_tool_successes, usage_tokens, usage_cost_usd, usage_elapsed_seconds,
                received_unix_nano, counted)
            SELECT run_key, run_id, trace_id, printf('%016x', i + 1), 'loopwatch',
                'stop_span', false, reason, t, steps,
                CASE WHEN reason = 'completed' THEN NULL ELSE 3 END,
                CASE WHEN reason = 'completed' THEN NULL ELSE 3 END,
                CASE WHEN reason IN ('repeated_action', 'action_cycle', 'no_progress',
                    'repeated_decision')
                THEN '{"detector":"' || reason || '","tool":"' || tool || '","repetitions":3}'
                END,
                'Stopped: ' || reason, i % 12, steps, steps, steps, steps * 150, 0.001 * steps,
                steps * 1.5, t + 1000, true
            FROM g"""
        )
        con.execute(
            """INSERT INTO run_tools (run_key, tool, outcome, calls) SELECT run_key, tool, 'ok', steps FROM g
            UNION ALL SELECT run_key, tool, 'blocked', 1 FROM g
                WHERE reason = 'repeated_action'
            UNION ALL SELECT run_key, 'tool_' || ((i + 7) % 24), 'error', 1 FROM g
                WHERE reason = 'error'"""
        )
        con.execute(
            "INSERT INTO canary_flags SELECT run_id, t FROM g WHERE i % 1000 = 999 ORDER BY t"
        )
        _insert_steps(con, "FROM g, range(1, 11) s(step) WHERE g.i % 100 = 0")
        long_key = _run_key(LONG_RUN)
        con.execute(
            f"""CREATE TEMP TABLE long AS SELECT 0 AS i, ?::UBIGINT AS run_key,
                ? AS run_id, printf('%032x', 99999999999) AS trace_id,
                ? - {NS} AS t, 'agent-0' AS agent, 'get_details_by_id' AS tool,
                'repeated_action' AS reason, ?::BIGINT AS steps""",
            [long_key, LONG_RUN, now_ns, long_steps],
        )
        con.execute(
            """INSERT INTO runs (run_key, run_id, trace_id, run_span_id, source, agent,
                policy_name, policy_version, detector_version, limits, mode,
                start_unix_nano, end_unix_nano, status_code, steps, decisions, tool_calls,
                tool_errors, tool_blocked, tokens, stop_reason, stop_origin, stop_inferred,
                stop_unix_nano, sample_tool, sampled, sample_rule, decided_unix_nano,
                first_seen_unix_nano, last_seen_unix_nano, duplicate_stops)
            SELECT run_key, run_id, trace_id, 'aaaaaaaaaaaaaaaa', 'loopwatch', agent,
                'default', 'builtin', '1', ?, 'enforce', t - steps * 1000000, t, 0, steps,
                steps, steps, 0, 1, 0, reason, 'stop_span', false, t, tool, true,
                'abnormal', t + 1000, t - steps * 1000000, t + 1000, 0
            FROM long""",
            [_LIMITS],
        )
        con.execute(
            """INSERT INTO stop_reports (run_key, run_id, trace_id, span_id, source, origin,
                stop_inferred, reason, time_unix_nano, step, limit_value, observed, evidence,
                message, steps_since_progress, usage_model_turns, usage_tool_attempts,
                usage_tool_successes, usage_tokens, usage_cost_usd, usage_elapsed_seconds,
                received_unix_nano, counted)
            SELECT run_key, run_id, trace_id, 'bbbbbbbbbbbbbbbb', 'loopwatch', 'stop_span',
                false, reason, t, steps, steps, steps,
                '{"detector":"repeated_action","tool":"get_details_by_id","repetitions":'
                    || steps || ',"step_indices":[' || steps - 2 || ',' || steps - 1 || ','
                    || steps || ']}',
                'Stopped: the same action repeated with an unchanged result.', steps - 1,
                steps, steps, steps - 1, 0, 0.0, steps * 0.01, t + 1000, true
            FROM long"""
        )
        con.execute(
            """INSERT INTO run_tools (run_key, tool, outcome, calls) SELECT run_key, tool, 'ok', steps - 1 FROM long
            UNION ALL SELECT run_key, tool, 'blocked', 1 FROM long"""
        )
        _insert_steps(con, "FROM long g, range(1, g.steps + 1) s(step)")
        con.execute("CHECKPOINT")
    finally:
        con.close()


_DECISION_COLUMNS = {
    "decision_type": "'tool'",
    "tool": "NULL",
    "tool_call_id": "NULL",
    "outcome": "NULL",
    "risk": "NULL",
    "blocked_by": "NULL",
    "action_fingerprint": "NULL",
    "observation_digest": "NULL",
    "progress": "NULL",
    "tokens": "100, 20, 0.0001",
    "content": "NULL, NULL",
}
_TOOL_RESULT_COLUMNS = {
    "decision_type": "NULL",
    "tool": "g.tool",
    "tool_call_id": "'call_' || s.step",
    "outcome": "CASE WHEN s.step = g.steps THEN 'blocked' ELSE 'ok' END",
    "risk": "'read'",
    "blocked_by": "CASE WHEN s.step = g.steps THEN 'repeat_limit' END",
    "action_fingerprint": "'9dcfcd96c0cbe1efe6137c481f694f85'",
    "observation_digest": "'716efa652c44b28747be856cbb4ba465'",
    "progress": "s.step = 1",
    "tokens": "NULL, NULL, NULL",
    "content": """'{"id": 7}', '{"id": 7, "status": "unchanged"}'""",
}


def _insert_steps(con: Any, source: str) -> None:
    """A decision and a tool result per step of the runs selected by ``source``."""
    for offset, (kind, c) in enumerate(
        (("decision", _DECISION_COLUMNS), ("tool_result", _TOOL_RESULT_COLUMNS))
    ):
        con.execute(
            f"""INSERT INTO steps SELECT g.run_key, g.trace_id,
                printf('%08x%08x', g.i, s.step * 2 + {offset}), g.run_id, 'loopwatch',
                '{kind}', s.step, g.t - (g.steps - s.step) * 1000000,
                g.t - (g.steps - s.step) * 1000000 + 500, 0, {c["decision_type"]}, NULL,
                {c["tool"]}, {c["tool_call_id"]}, {c["outcome"]}, {c["risk"]}, NULL,
                {c["blocked_by"]}, NULL, {c["action_fingerprint"]}, {c["observation_digest"]},
                {c["progress"]}, s.step - 1, {c["tokens"]}, {c["content"]}, g.t + 1000,
                NULL, NULL, NULL
            {source}"""
        )


# ------------------------------------------------------------------- measuring


@dataclass
class Figure:
    path: str
    seconds: list[float]
    budget: bool

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def line(self) -> str:
        verdict = ""
        if self.budget:
            verdict = "under 1 s" if self.median < BUDGET_SECONDS else "OVER 1 s"
        return (
            f"{self.path:<58} {self.median * 1000:9.1f} {max(self.seconds) * 1000:9.1f}  {verdict}"
        )


def measure(path: str, fn: Callable[[], Any], *, repeat: int, budget: bool = True) -> Figure:
    """One warm-up call, then ``repeat`` timed calls."""
    fn()
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return Figure(path, seconds, budget)


def run_view_transform(detail: Any) -> dict[str, Any]:
    """What ``views/run_view.py`` computes from a run before rendering it."""
    from loopwatch.dashboard import charts, runview

    steps = runview.build_steps(detail.step_records())
    card = runview.stop_card(detail.stop, detail.evidence)
    stopped_at = (
        card.step if card is not None and card.step else (steps[-1].step if steps else None)
    )
    usage = runview.usage_counters(detail.stop, detail.run)
    notice = runview.sampling_notice(detail.run, len(detail.step_rows))
    ceased = runview.progress_ceased(steps, detail.evidence)
    groups = runview.mark_groups(runview.collapse(steps), ceased, stopped_at)
    shown = runview.last_steps(groups, runview.DEFAULT_LAST_STEPS, stop_step=stopped_at)
    table = runview.group_table(shown)
    series = runview.progress_series(steps)
    ceased_step = ceased.step if ceased is not None else None
    chart = charts.progress_chart(series, ceased_step=ceased_step, stop_step=stopped_at)
    spec = chart.to_dict()
    text = charts.progress_text(series, ceased_step=ceased_step, stop_step=stopped_at)
    return {
        "steps": steps,
        "card": card,
        "groups": groups,
        "shown": shown,
        "table": table,
        "usage": usage,
        "notice": notice,
        "spec": spec,
        "text": text,
    }


def _page_filters(now_ns: int) -> list[tuple[str, Any, int]]:
    from loopwatch.dashboard.data import RunFilter

    day = {"since_unix_nano": now_ns - DAY_NS, "until_unix_nano": now_ns}
    return [
        ("default: last 24 h, 50 rows", RunFilter(**day), 0),
        ("all time, 50 rows", RunFilter(), 0),
        ("24 h, stop_reason=repeated_action", RunFilter(stop_reason="repeated_action", **day), 0),
        ("24 h, agent=agent-3", RunFilter(agent="agent-3", **day), 0),
        ("24 h, tool=tool_5", RunFilter(tool="tool_5", **day), 0),
        ("24 h, canary=yes", RunFilter(canary=True, **day), 0),
        ("24 h, page 101 (offset 5,000)", RunFilter(**day), 5_000),
    ]


def measure_source(
    name: str, source: Any, now_ns: int, *, repeat: int, full: bool = True
) -> tuple[list[Figure], dict[str, Any]]:
    """Every data path of ``source``; returns the figures and results for sanity checks."""
    figures = []
    results: dict[str, Any] = {}
    filters = _page_filters(now_ns) if full else _page_filters(now_ns)[:1]
    for label, run_filter, offset in filters:
        figures.append(
            measure(
                f"{name} runs: {label}",
                lambda f=run_filter, o=offset: source.runs(f, limit=50, offset=o),
                repeat=repeat,
            )
        )
    results["page"] = source.runs(_page_filters(now_ns)[0][1], limit=50)

    def run_view() -> dict[str, Any]:
        return run_view_transform(source.run(LONG_RUN))

    figures.append(measure(f"{name} run view: run() + transform", run_view, repeat=repeat))
    figures.append(
        measure(
            f"{name}   of which run()", lambda: source.run(LONG_RUN), repeat=repeat, budget=False
        )
    )
    results["detail"] = source.run(LONG_RUN)
    results["view"] = run_view_transform(results["detail"])
    if full:
        window = {"since_unix_nano": now_ns - DAY_NS, "until_unix_nano": now_ns}
        figures.append(
            measure(
                f"{name} overview, 24 h (information)",
                lambda: source.overview(**window, bucket_seconds=1800),
                repeat=repeat,
                budget=False,
            )
        )
        figures.append(
            measure(
                f"{name} tools, 24 h (information)",
                lambda: source.tools(**window),
                repeat=repeat,
                budget=False,
            )
        )
    return figures, results


@contextmanager
def collector_on(db: Path, workdir: Path) -> Iterator[str]:
    """``loopwatch collector`` on ``db``; yields its read API URL."""
    from tests.integration.services import start_collector

    with start_collector(workdir, db_path=db, ready_timeout_seconds=180) as collector:
        yield collector.http_url


@dataclass
class Report:
    runs: int
    long_steps: int
    build_seconds: float
    figures: list[Figure]
    api: dict[str, Any]
    db: dict[str, Any]

    def print(self) -> None:
        print(
            f"\nstore: {self.runs:,} runs + one {self.long_steps:,}-step run, "
            f"built in {self.build_seconds:.1f} s"
        )
        print(f"{'data path':<58} {'median ms':>9} {'max ms':>9}")
        for figure in self.figures:
            print(figure.line())


def run_benchmark(
    *, runs: int, long_steps: int, repeat: int, workdir: Path, full: bool = True
) -> Report:
    from loopwatch.dashboard.api_source import ApiSource
    from loopwatch.dashboard.file_source import DuckDBSource

    db = workdir / "bench.duckdb"
    now_ns = time.time_ns()
    started = time.perf_counter()
    build_store(db, runs=runs, long_steps=long_steps, now_ns=now_ns)
    build_seconds = time.perf_counter() - started
    figures: list[Figure] = []
    with collector_on(db, workdir) as url:
        api = ApiSource(url, timeout_seconds=30)
        try:
            found, api_results = measure_source("API", api, now_ns, repeat=repeat, full=full)
            figures += found
        finally:
            api.close()
    source = DuckDBSource(db, timeout_seconds=30)
    try:
        found, db_results = measure_source("file", source, now_ns, repeat=repeat, full=full)
        figures += found
    finally:
        source.close()
    return Report(runs, long_steps, build_seconds, figures, api_results, db_results)


def check_sanity(report: Report) -> None:
    """The pages would show the right thing (not timing)."""
    for results in (report.api, report.db):
        page = results["page"].runs
        assert len(page) == 50 and page["time"].is_monotonic_decreasing
        assert page["run_id"].iloc[0] == LONG_RUN
        assert page["steps_since_progress"].notna().all()
        detail = results["detail"]
        assert detail.stop is not None and detail.stop["reason"] == "repeated_action"
        assert detail.limits is not None and "repeat_limit" in set(detail.limits["limit"])
        view = results["view"]
        # Two rows per step: the row cap keeps the last 10,000 rows (5,000 steps).
        assert detail.steps_truncated == (2 * report.long_steps > 10_000)
        assert len(view["steps"]) == min(report.long_steps, 5_000)
        last = view["groups"][-1]
        assert last.last_step == report.long_steps and last.collapsed
    assert report.api["page"].runs.equals(report.db["page"].runs)


def test_bench_dashboard_smoke(tmp_path: Path) -> None:
    if not os.environ.get("LOOPWATCH_BENCH"):
        pytest.skip("benchmarks run with LOOPWATCH_BENCH=smoke|full")
    full = os.environ.get("LOOPWATCH_BENCH") == "full"
    report = run_benchmark(
        runs=1_000_000 if full else 100_000,
        long_steps=10_000,
        repeat=3 if full else 1,
        workdir=tmp_path,
        full=full,
    )
    report.print()
    check_sanity(report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lw-bench-dash-") as tmp:
        report = run_benchmark(
            runs=args.runs, long_steps=args.steps, repeat=args.repeat, workdir=Path(tmp)
        )
        report.print()
        check_sanity(report)


if __name__ == "__main__":
    main()
