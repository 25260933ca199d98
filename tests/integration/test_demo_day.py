"""``loopwatch demo`` looks like a day of production (issue 28, item 4), in a real collector.

- the runs' span times spread over the last 24 hours: the dashboard overview's
  "stops over time" chart, read the way the overview page reads it (the dashboard's own
  data source over ``/api/v1``, the page's "Last 24 hours" window of 30-minute buckets),
  has at least 12 non-empty buckets; every stop lies in the window;
- content is captured (arguments and results on the stored steps, redacted);
- the planted canary flags a few runs in a collector whose canary file holds it;
- no run stops ``cancelled`` without a reason; with the corpus, the runs the recording's
  step cap cut off stop ``budget_exhausted`` (``model_turns``) naming the cap, and the
  hourly sampling cap still keeps the steps of runs of every stop reason.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from loopwatch.dashboard.api_source import ApiSource
from loopwatch.replay.demo import DEMO_CANARY, EXAMPLES_DIR, run_demo

from tests.conftest import CORPUS
from tests.integration.services import CollectorProcess, poll_until, start_collector

_DAY_NS = 86_400 * 1_000_000_000
_BUCKET_SECONDS = 1_800  # the overview's "Last 24 hours" buckets (dashboard/ui.py)


def _collector(tmp_path: Path) -> CollectorProcess:
    canaries = tmp_path / "canaries.txt"
    canaries.write_text(f"# the demo's planted canary\n{DEMO_CANARY}\n", encoding="utf-8")
    return start_collector(tmp_path, "--canaries", str(canaries))


def _all_runs(collector: CollectorProcess, expected: int) -> list[dict[str, Any]]:
    def stored() -> list[dict[str, Any]] | None:
        runs = collector.runs(since=0)
        return runs if len(runs) >= expected and all(r["stop_reason"] for r in runs) else None

    return poll_until(stored, timeout_seconds=60, what=f"{expected} stopped runs")


def _buckets(collector: CollectorProcess) -> tuple[int, int]:
    now = time.time_ns()
    overview = ApiSource(collector.http_url).overview(
        since_unix_nano=now - _DAY_NS, until_unix_nano=now, bucket_seconds=_BUCKET_SECONDS
    )
    stops = overview.stops
    return int(stops[stops["stops"] > 0]["bucket"].nunique()), overview.canary_runs


def _no_silent_cancel(collector: CollectorProcess, runs: list[dict[str, Any]]) -> None:
    for run in runs:
        if run["stop_reason"] == "cancelled":
            evidence = collector.run(run["run_id"])["evidence"]
            assert evidence.get("detail"), (run["run_id"], evidence)


def test_the_shipped_examples_spread_over_a_day_with_content_and_a_canary(
    tmp_path: Path,
) -> None:
    with _collector(tmp_path) as collector:
        before = time.time_ns()
        report = run_demo([EXAMPLES_DIR], otlp_url=collector.otlp_url, run_prefix="day")
        assert report.ok and len(report.runs) == 16
        runs = _all_runs(collector, 16)
        times = [r["time_unix_nano"] for r in runs]
        assert min(times) >= before - _DAY_NS and max(times) <= time.time_ns()
        assert max(times) - min(times) > 20 * 3600 * 1_000_000_000
        buckets, canary_runs = _buckets(collector)
        assert buckets >= 12, buckets
        assert canary_runs >= 2, canary_runs
        looped = next(r for r in runs if r["run_id"].endswith("example-04"))
        steps = collector.run(looped["run_id"])["steps"]
        tools = [s for s in steps if s["kind"] == "tool_result"]
        assert tools and all(s["arguments"] == '{"service":"billing"}' for s in tools)
        assert all(s["result"] for s in tools if s["outcome"] != "blocked")
        _no_silent_cancel(collector, runs)
        # The deadline example's spans carry its recorded hang: the run lasts > 600 s.
        hang = next(r for r in runs if r["run_id"].endswith("example-11"))
        assert hang["end_unix_nano"] - hang["start_unix_nano"] > 600 * 1_000_000_000


@pytest.mark.skipif(not CORPUS.is_dir(), reason="no ../shared/corpus")
def test_the_corpus_demo_has_no_silent_cancel_and_names_the_recorded_caps(
    tmp_path: Path,
) -> None:
    with _collector(tmp_path) as collector:
        report = run_demo([CORPUS], otlp_url=collector.otlp_url, run_prefix="corpus")
        assert report.ok and not report.replay_errors
        runs = _all_runs(collector, len(report.runs))
        by_reason = Counter(r["stop_reason"] for r in runs)
        _no_silent_cancel(collector, runs)
        capped = [r for r in runs if r["stop_reason"] == "budget_exhausted"]
        named: Counter[str] = Counter()
        for run in capped[:: max(len(capped) // 25, 1)]:
            stop = collector.run(run["run_id"])
            if stop["evidence"].get("detector") != "framework_limit":
                continue  # a policy budget, not the recording's cap
            assert stop["stop"]["dimension"] == "model_turns"
            named[stop["evidence"]["detail"]["limit"].split("=")[0]] += 1
        assert {"single_chain_max_step", "halted"} <= set(named), named
        buckets, _ = _buckets(collector)
        assert buckets >= 12, buckets
        sampled = Counter(r["stop_reason"] for r in runs if r["sampled"])
        print(
            f"\ncorpus demo: stops {dict(by_reason)}; steps kept {dict(sampled)}; {buckets} buckets"
        )
        # The hourly cap (per stop reason and tool, collector clock) still keeps steps of
        # every abnormal stop reason the demo produced.
        for reason in by_reason:
            if reason not in ("completed", "final_unverified"):
                assert sampled[reason] > 0, (reason, sampled)
