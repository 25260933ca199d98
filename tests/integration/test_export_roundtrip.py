"""From incident to test (issue 28, item 6): a stored run exported as OTLP/JSON replays
with the same stop reason and stop step under the same policy.

Real parts: the shipped examples (one per stop reason) replayed by ``loopwatch demo``
into a real collector that keeps every run's steps; each run exported from the
collector's read API (the dict ``GET /api/v1/runs/{id}`` returns), from the dashboard's
run view data (``RunData`` of the DuckDB file source, steps as a DataFrame) and by the
``loopwatch export`` CLI (``--collector`` and ``--db``); each file read back by
``loopwatch replay``'s importer and replayed under the run's own policy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from loopwatch.dashboard.file_source import DuckDBSource
from loopwatch.instrumentation import StopReason
from loopwatch.replay.demo import EXAMPLES_DIR, run_demo
from loopwatch.replay.engine import default_policy, replay_run
from loopwatch.replay.export_run import ExportError, export_otlp_json
from loopwatch.replay.importers import load_paths
from loopwatch.replay.policy_choice import recorded_policy

from tests.conftest import CORPUS
from tests.integration.services import (
    CollectorProcess,
    poll_until,
    run_loopwatch,
    start_collector,
)

_EXAMPLES = {t.run_id: t for t in load_paths([EXAMPLES_DIR]).trajectories}


def _replayed(path: Path, source_run_id: str) -> tuple[str | None, int | None]:
    loaded = load_paths([path])
    assert not loaded.problems, loaded.problems
    (trajectory,) = loaded.trajectories
    policy = recorded_policy(_EXAMPLES[source_run_id].metadata["replay"]["policy"], "example")
    result = replay_run(trajectory, policy)
    return result.end_reason, result.end_step


def _expected(detail: dict[str, Any]) -> tuple[str, int]:
    stop = detail["stop"]
    if detail["run"]["mode"] == "observe":
        # Observe mode never stops for a loop; replay judges the policy enforced, so the
        # exported run stops where the live guard recorded it would have.
        return stop["observe_reason"], stop["observe_step"]
    return stop["reason"], stop["step"]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("export")
    config = tmp / "keep-every-run.toml"
    config.write_text("[sampling]\ncompleted_fraction = 1.0\n", encoding="utf-8")
    collector = start_collector(tmp, "--config", str(config))
    try:
        report = run_demo([EXAMPLES_DIR], otlp_url=collector.otlp_url, run_prefix="incident")
        assert report.ok and len(report.runs) == len(_EXAMPLES)

        def all_stopped() -> list[dict[str, Any]] | None:
            runs = collector.runs(since=0)
            done = len(runs) == len(_EXAMPLES) and all(r["stop_reason"] for r in runs)
            return runs if done else None

        poll_until(all_stopped, timeout_seconds=60, what="every example stored")
        yield collector, tmp, report
    finally:
        collector.stop()


def test_every_stop_reasons_example_replays_the_same_from_the_api_export(
    stored: tuple[CollectorProcess, Path, Any],
) -> None:
    collector, tmp, report = stored
    reasons = set()
    for run in report.runs:
        detail = collector.run(run.run_id)
        path = tmp / f"{run.source_run_id}.otlp.json"
        path.write_bytes(export_otlp_json(detail))
        assert _replayed(path, run.source_run_id) == _expected(detail), run.source_run_id
        reasons.add(detail["stop"]["reason"])
    assert reasons == {r.value for r in StopReason}


def test_the_cli_exports_from_the_collector_and_from_the_file_and_replay_reads_it(
    stored: tuple[CollectorProcess, Path, Any],
) -> None:
    collector, tmp, report = stored
    looped = next(r for r in report.runs if r.source_run_id == "example-04")
    out = tmp / "cli-collector.otlp.json"
    done = run_loopwatch(
        "export", looped.run_id, "--collector", collector.http_url, "--out", str(out), cwd=tmp
    )
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout
    assert _replayed(out, "example-04") == ("repeated_action", 3)
    # The README's reviewer command on the file: the default replay policy agrees.
    replayed = run_loopwatch("replay", str(out), "--format", "json", cwd=tmp)
    assert replayed.returncode == 0, replayed.stderr
    (line,) = replayed.stdout.splitlines()
    row = json.loads(line)
    assert (row["stop_reason"], row["stop_step"]) == ("repeated_action", 3)

    missing = run_loopwatch(
        "export", "no-such-run", "--collector", collector.http_url, "--out", str(out), cwd=tmp
    )
    assert missing.returncode == 1 and "no run with id 'no-such-run'" in missing.stderr
    both = run_loopwatch(
        "export", "x", "--collector", collector.http_url, "--db", "x.duckdb", "--out", "o", cwd=tmp
    )
    assert both.returncode == 2


def test_the_dashboard_run_data_and_the_db_cli_export_the_same_verdicts(
    stored: tuple[CollectorProcess, Path, Any],
) -> None:
    collector, tmp, report = stored
    collector.stop()  # --db and the file source read the file a collector no longer holds
    deadline = next(r for r in report.runs if r.source_run_id == "example-11")
    out = tmp / "cli-db.otlp.json"
    done = run_loopwatch(
        "export", deadline.run_id, "--db", str(collector.db_path), "--out", str(out), cwd=tmp
    )
    assert done.returncode == 0, done.stderr
    assert _replayed(out, "example-11") == ("deadline_exceeded", 1)
    source = DuckDBSource(collector.db_path)
    try:
        for run in report.runs:
            data = source.run(run.run_id)
            assert data is not None
            view = {"run": data.run, "steps": data.steps, "stop": data.stop}
            view["evidence"] = data.evidence
            path = tmp / f"view-{run.source_run_id}.otlp.json"
            path.write_bytes(export_otlp_json(view))
            detail = {"run": data.run, "stop": data.stop}
            assert _replayed(path, run.source_run_id) == _expected(detail), run.source_run_id
    finally:
        source.close()


def test_a_run_without_stored_steps_is_refused_with_a_reason() -> None:
    detail = {"run": {"run_id": "r-1", "agent": "a"}, "steps": [], "stop": None}
    with pytest.raises(ExportError, match="no stored steps"):
        export_otlp_json(detail)
    assert export_otlp_json(detail, allow_without_steps=True).startswith(b'{"resourceSpans"')
    with pytest.raises(ExportError, match="not a stored run"):
        export_otlp_json({"steps": []})


@pytest.mark.skipif(not CORPUS.is_dir(), reason="no ../shared/corpus")
def test_recorded_corpus_runs_replay_the_same_after_export(tmp_path: Path) -> None:
    """tau2 chats (progress from user turns, seen in spans only by its effect) and
    OpenHands runs (one cut off by its 50-iteration cap: budget_exhausted), stored under
    the default replay policy, exported, replayed under it: same end, same step. (The
    whole corpus, 818 runs whose steps were kept, agreed when this was written.)"""
    config = tmp_path / "keep-every-run.toml"
    config.write_text("[sampling]\ncompleted_fraction = 1.0\n", encoding="utf-8")
    policy = default_policy()
    with start_collector(tmp_path, "--config", str(config)) as collector:
        runs = []
        for folder, limit in (("tau2-bench", 40), ("openhands", None)):
            report = run_demo(
                [CORPUS / folder], otlp_url=collector.otlp_url, run_prefix=folder, limit=limit
            )
            assert report.ok
            runs.extend(report.runs)

        def stored() -> bool | None:
            items = collector.runs(since=0)
            return (len(items) >= len(runs) and all(r["stop_reason"] for r in items)) or None

        poll_until(stored, timeout_seconds=60, what="every run stored")
        ends = set()
        for run in runs:
            detail = collector.run(run.run_id)
            path = tmp_path / "run.otlp.json"
            path.write_bytes(export_otlp_json(detail))
            (trajectory,) = load_paths([path]).trajectories
            result = replay_run(trajectory, policy)
            expected = (detail["stop"]["reason"], detail["stop"]["step"])
            assert (result.end_reason, result.end_step) == expected, run.source_run_id
            ends.add(expected[0])
        assert "budget_exhausted" in ends and "completed" in ends
