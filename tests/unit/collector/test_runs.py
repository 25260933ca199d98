"""The run-assembly rules of ``collector/runs.py``, without DuckDB: one table of cases
through one function each (stop precedence, duplicate and replaced stops, the counted
stop, counts and times)."""

from __future__ import annotations

from typing import Any

import pytest
from loopwatch.collector.rows import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    STOP_ORIGIN_INFERRED,
    STOP_ORIGIN_RUN_SPAN,
    STOP_ORIGIN_STOP_SPAN,
    RunRow,
    StepRow,
    StopRow,
)
from loopwatch.collector.runs import Group, merge_rows, merge_stops, new_run
from loopwatch.collector.store.schema import COUNT_COLUMNS

TRACE = "0" * 31 + "1"
_O = {"S": STOP_ORIGIN_STOP_SPAN, "R": STOP_ORIGIN_RUN_SPAN, "I": STOP_ORIGIN_INFERRED}


def _stop(code: str, n: int) -> StopRow:
    """``code`` is origin letter + reason initial, e.g. ``Sr`` (stop span, repeated_action)."""
    reason = {"r": "repeated_action", "c": "completed", "e": "error", "n": "no_progress"}
    return StopRow(
        trace_id=TRACE,
        span_id=f"{n:016x}",
        run_id="r1",
        source="loopwatch",
        origin=_O[code[0]],
        reason=reason[code[1]],
        time_unix_nano=100 + n,
    )


# (stored stop origin or None, requests: each a list of stop codes,
#  expected: (final stop, counted stop or None, duplicates, replaced codes))
STOP_CASES: dict[
    str, tuple[str | None, list[list[str]], tuple[str, str | None, int, list[str]]]
] = {
    "one stop span": (None, [["Sr"]], ("Sr", "Sr", 0, [])),
    "stop span beats run span in one request": (None, [["Rc", "Sr"]], ("Sr", "Sr", 0, [])),
    "run span after its stop span in one request": (None, [["Sr", "Rc"]], ("Sr", "Sr", 0, [])),
    "a second stop span is a duplicate": (None, [["Sr", "Sn"]], ("Sr", "Sr", 1, [])),
    "a later request's stronger stop replaces, the first stays counted": (
        None,
        [["Ic"], ["Sr"]],
        ("Sr", "Ic", 0, ["Ic"]),
    ),
    "a later weaker stop is ignored": (None, [["Sr"], ["Ic"]], ("Sr", "Sr", 0, [])),
    "a later equal stop is a duplicate": (None, [["Rc"], ["Re"]], ("Rc", "Rc", 1, [])),
    "stored inferred stop, stop span arrives": ("I", [["Sr"]], ("Sr", None, 0, [])),
    "stored stop span, duplicate arrives": ("S", [["Sn"]], ("S", None, 1, [])),
}


@pytest.mark.parametrize("case", list(STOP_CASES), ids=list(STOP_CASES))
def test_stop_rules(case: str) -> None:
    stored, requests, (final, counted, duplicates, replaced) = STOP_CASES[case]
    group = Group(now_ns=1, runs=[], steps=[], stops=[], canaries=set())
    row = new_run("r1", TRACE, "loopwatch", 0)
    if stored is not None:
        row.update(stop_origin=_O[stored], stop_reason="x", sampled=True)
        group.existing.add("r1")
    group.merged["r1"] = row
    stops: dict[str, StopRow] = {}
    n = 0
    for job, codes in enumerate(requests):
        for code in codes:
            n += 1
            stops[code] = _stop(code, n)
            group.stops.append(stops[code])
            group.stop_jobs.append(job)
    anomalies, deciding = merge_stops(group)
    if final == stored:
        assert group.primary == [] and row["stop_origin"] == _O[stored]
    else:
        assert group.primary == [stops[final]]
        assert (row["stop_origin"], row["stop_reason"]) == (
            stops[final].origin,
            stops[final].reason,
        )
    assert group.counted.get("r1") is (None if counted is None else stops[counted])
    assert len(anomalies) == duplicates == row["duplicate_stops"]
    assert [s for s, _ in group.replaced] == [stops[c] for c in replaced]
    # Sampling is decided by the counted stop, once.
    assert [d[0] for d in deciding] == ([] if counted is None else ["r1"])


def _step(n: int, kind: str, **fields: Any) -> StepRow:
    return StepRow(
        trace_id=TRACE,
        span_id=f"{n:016x}",
        run_id="r1",
        source="loopwatch",
        kind=kind,
        step=fields.pop("step", n),
        start_unix_nano=10 * n,
        end_unix_nano=10 * n + 5,
        **fields,
    )


# (earlier counts, new steps) -> expected (steps, COUNT_COLUMNS..., start, end)
COUNT_CASES: dict[str, tuple[dict[str, int], list[StepRow], tuple[int, ...]]] = {
    "decisions and tool calls by outcome": (
        {},
        [
            _step(1, KIND_DECISION, input_tokens=3, output_tokens=4),
            _step(2, KIND_TOOL_RESULT, tool="a", outcome="ok"),
            _step(3, KIND_TOOL_RESULT, tool="a", outcome="error"),
            _step(4, KIND_TOOL_RESULT, tool="b", outcome="blocked"),
        ],
        (4, 1, 3, 1, 1, 7, 10, 45),
    ),
    "counts add to what the run had; the highest step wins": (
        {"steps": 9, "decisions": 2, "tool_calls": 5, "tokens": 10},
        [_step(3, KIND_TOOL_RESULT, tool="a", outcome="ok")],
        (9, 2, 6, 0, 0, 10, 30, 35),
    ),
    "tokens saturate at BIGINT": (
        {"tokens": 2**63 - 2},
        [_step(1, KIND_DECISION, input_tokens=5)],
        (1, 1, 0, 0, 0, 2**63 - 1, 10, 15),
    ),
}


@pytest.mark.parametrize("case", list(COUNT_CASES), ids=list(COUNT_CASES))
def test_count_rules(case: str) -> None:
    earlier, steps, expected = COUNT_CASES[case]
    group = Group(now_ns=1, runs=[], steps=steps, stops=[], canaries=set())
    row = new_run("r1", TRACE, "loopwatch", 0)
    row.update(earlier)
    group.merged["r1"] = row
    merge_rows(group)
    got = (
        row["steps"],
        *(row[c] for c in COUNT_COLUMNS),
        row["start_unix_nano"],
        row["end_unix_nano"],
    )
    assert got == expected
    assert sum(group.tool_deltas.values()) == expected[2] - earlier.get("tool_calls", 0)


def test_the_run_span_wins_and_times_widen() -> None:
    group = Group(now_ns=1, runs=[], steps=[], stops=[], canaries=set())
    group.runs = [
        RunRow("r1", TRACE, "a" * 16, "genai", start_unix_nano=50, end_unix_nano=60),
        RunRow(
            "r1",
            TRACE,
            "b" * 16,
            "loopwatch",
            is_run_span=True,
            agent="support",
            start_unix_nano=20,
            end_unix_nano=40,
            status_code=1,
        ),
    ]
    merge_rows(group)
    row = group.merged["r1"]
    assert (row["run_span_id"], row["source"], row["agent"]) == ("b" * 16, "loopwatch", "support")
    assert (row["start_unix_nano"], row["end_unix_nano"]) == (20, 60)
    assert (row["span_start_unix_nano"], row["span_end_unix_nano"]) == (20, 60)
