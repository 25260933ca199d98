"""The response ladder's telemetry in the collector (issue 26): read, stored, served, counted.

Spans are the real instrumentation's, recorded and decoded as OTLP, with the ladder's
attributes set by hand as NUDGE.md spells them (the guard that emits them lands apart).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from loopwatch.collector.nudges import MAX_NUDGES, MAX_NUDGES_CHARS, loop_response, parse_nudges
from loopwatch.collector.records import SpanBatch, SpanEventRecord, SpanRecord
from loopwatch.collector.service import Collector
from loopwatch.collector.store.schema import SCHEMA_VERSION, apply_migrations, run_key_of
from loopwatch.collector.store.writer import Store
from starlette.testclient import TestClient

from .spans import looping_run, record, to_batch
from .test_pipeline import collector, submit, value  # noqa: F401 (fixture)

_ENTRY = {"detector": "repeated_action", "tool": "lookup", "rung": 1, "step": 3}


def _nudge(result: str, **kw: Any) -> dict[str, Any]:
    return {**_ENTRY, "result": result, **kw}


def _nudged_run(
    agent: str = "support",
    *,
    nudges: Any = None,
    dropped: Any = None,
    response: str = "nudge",
) -> SpanBatch:
    """A looping run whose blocked call is reported as the ladder's ``response`` rung, and
    whose stop span carries ``nudges`` (``loopwatch.nudges``, JSON text as given)."""
    batch = to_batch(record(looping_run(agent)))
    for span in batch.spans:
        a = span.attributes
        if a.get("loopwatch.tool.outcome") == "blocked":
            span.attributes = {
                **a,
                "loopwatch.tool.outcome": "nudged" if response == "nudge" else "ok",
                "loopwatch.loop.response": response,
                "loopwatch.loop.rung": 1,
                "loopwatch.loop.detector": "repeated_action",
            }
        if a.get("loopwatch.event") == "stop":
            extra: dict[str, Any] = {}
            if nudges is not None:
                extra["loopwatch.nudges"] = (
                    nudges if isinstance(nudges, str) else json.dumps(nudges)
                )
            if dropped is not None:
                extra["loopwatch.nudges.dropped"] = dropped
            span.attributes = {**a, **extra}
    return batch


def _span(attrs: dict[str, Any], events: list[SpanEventRecord] | None = None) -> SpanRecord:
    return SpanRecord("0" * 32, "1" * 16, "", "execute_tool x", 1, 1, 2, attrs, events=events or [])


@pytest.mark.parametrize(
    ("attrs", "events", "expected"),
    [
        (
            {
                "loopwatch.loop.response": "nudge",
                "loopwatch.loop.rung": 2,
                "loopwatch.loop.detector": "action_cycle",
            },
            [],
            ("nudge", 2, "action_cycle"),
        ),
        ({}, [], (None, None, None)),
        ({"loopwatch.loop.response": "stop"}, [], (None, None, None)),
        ({"loopwatch.loop.response": ["nudge"]}, [], (None, None, None)),
        (
            {
                "loopwatch.loop.response": "warn",
                "loopwatch.loop.rung": True,
                "loopwatch.loop.detector": "x" * 300,
            },
            [],
            ("warn", None, None),
        ),
        (
            {"loopwatch.loop.response": "warn", "loopwatch.loop.rung": 10**6},
            [],
            ("warn", None, None),
        ),
        (
            {},
            [
                SpanEventRecord(
                    "loopwatch.loop_response",
                    1,
                    {
                        "loopwatch.loop.response": "warn",
                        "loopwatch.loop.rung": "1",
                        "loopwatch.loop.detector": "repeated_action",
                    },
                )
            ],
            ("warn", 1, "repeated_action"),
        ),
    ],
)
def test_loop_response_reads_the_rung_or_nothing(
    attrs: dict[str, Any], events: list[SpanEventRecord], expected: tuple[Any, ...]
) -> None:
    assert loop_response(_span(attrs, events)) == expected


_MANY = [_nudge("recovered", step=i) for i in range(MAX_NUDGES + 5)]


@pytest.mark.parametrize(
    ("attrs", "kept", "dropped"),
    [
        ({}, 0, None),
        ({"loopwatch.nudges.dropped": 4}, 0, 4),
        ({"loopwatch.nudges": json.dumps([_nudge("recovered")])}, 1, 0),
        (
            {"loopwatch.nudges": json.dumps([_nudge("recovered")]), "loopwatch.nudges.dropped": 7},
            1,
            7,
        ),
        ({"loopwatch.nudges": "not json"}, 0, 1),
        ({"loopwatch.nudges": "[" * 100_000}, 0, 1),
        ({"loopwatch.nudges": "[" * 50_000 + "]" * 50_000}, 0, 1),
        ({"loopwatch.nudges": " " * (MAX_NUDGES_CHARS + 1) + "[]"}, 0, 1),
        ({"loopwatch.nudges": json.dumps({"detector": "x"})}, 0, 1),
        ({"loopwatch.nudges": json.dumps(_MANY)}, MAX_NUDGES, 5),
        (
            {
                "loopwatch.nudges": json.dumps(
                    [
                        _nudge("recovered"),
                        _nudge("maybe"),
                        _nudge("ended", rung=0),
                        _nudge("ended", step=-1),
                        _nudge("ended", tool=""),
                        _nudge("ended", detector=7),
                        _nudge("ended", rung=True),
                        _nudge("stopped", tool="t" * 257),
                        {"more": 3},
                        "x",
                        None,
                        _nudge("stopped"),
                    ]
                ),
                "loopwatch.nudges.dropped": -3,
            },
            2,
            10,
        ),
        ({"loopwatch.nudges": [_nudge("ended")]}, 1, 0),
    ],
)
def test_hostile_nudges_are_bounded_and_bad_entries_dropped_and_counted(
    attrs: dict[str, Any], kept: int, dropped: int | None
) -> None:
    text, n = parse_nudges(attrs)
    assert n == dropped
    entries = json.loads(text) if text is not None else []
    assert len(entries) == kept
    for entry in entries:
        assert set(entry) == {"detector", "tool", "rung", "step", "result"}


def test_nudges_are_stored_and_served_and_tools_give_the_recovery_rate(
    collector: Collector,  # noqa: F811
) -> None:
    submit(
        collector,
        _nudged_run(nudges=[_nudge("stopped"), _nudge("recovered", tool="get_details_by_id")]),
    )
    submit(
        collector, _nudged_run(nudges=[_nudge("recovered", tool="get_details_by_id")], dropped=2)
    )
    client = TestClient(collector.api_app())
    runs = client.get("/api/v1/runs").json()["items"]
    assert len(runs) == 2
    details = [client.get(f"/api/v1/runs/{r['run_id']}").json() for r in runs]
    assert sorted(len(d["nudges"]) for d in details) == [1, 2]
    assert sorted(d["nudges_dropped"] for d in details) == [0, 2]
    for detail in details:
        tool_steps = [s for s in detail["steps"] if s["kind"] == "tool_result"]
        assert [s["outcome"] for s in tool_steps] == ["ok", "ok", "nudged"]
        assert tool_steps[-1]["loop_response"] == "nudge"
        assert (tool_steps[-1]["loop_rung"], tool_steps[-1]["loop_detector"]) == (
            1,
            "repeated_action",
        )
        assert "nudges" not in detail["stop"]
    tools = {
        t["tool"]: t
        for t in client.get("/api/v1/tools", params={"since": 0, "until": 2**62}).json()["items"]
    }
    row = tools["get_details_by_id"]
    assert (row["nudged"], row["nudges"], row["nudges_recovered"]) == (2, 2, 2)
    assert row["nudge_recovery_rate"] == 1.0


def test_a_hostile_nudges_attribute_does_not_fail_the_batch(collector: Collector) -> None:  # noqa: F811
    submit(collector, _nudged_run(nudges="[" * 200_000, dropped="many"))
    client = TestClient(collector.api_app())
    (run,) = client.get("/api/v1/runs").json()["items"]
    detail = client.get(f"/api/v1/runs/{run['run_id']}").json()
    assert (detail["nudges"], detail["nudges_dropped"]) == ([], 1)
    assert detail["stop"]["reason"] == "repeated_action"


def _store_counts(c: Collector) -> dict[str, dict[tuple[str, ...], int]]:
    reader = c.store.reader()
    steps, _ = reader._query(
        "SELECT r.agent, s.tool, s.loop_detector, s.loop_response, count(*) AS n FROM "
        "(SELECT * FROM steps UNION ALL SELECT * FROM staged_steps) s JOIN runs r "
        "USING (run_key) WHERE s.loop_response IS NOT NULL GROUP BY ALL",
        [],
    )
    results, _ = reader._query(
        "SELECT s.agent, u.detector, u.result, count(*) AS n FROM (SELECT agent, "
        'unnest(from_json(nudges, \'[{"detector":"VARCHAR","result":"VARCHAR"}]\')) AS u '
        "FROM stops WHERE nudges IS NOT NULL) s GROUP BY ALL",
        [],
    )
    out: dict[str, dict[tuple[str, ...], int]] = {"nudge": {}, "warn": {}, "result": {}}
    for r in steps:
        out[r["loop_response"]][(r["agent"], r["tool"], r["loop_detector"])] = int(r["n"])
    for r in results:
        out["result"][(r["agent"], r["detector"], r["result"])] = int(r["n"])
    return out


def _metric_counts(c: Collector, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], int]:
    from .test_pipeline import samples

    return {tuple(lbl[k] for k in labels): int(v) for lbl, v in samples(c).get(name, []) if v}


def test_metrics_equal_events_and_a_retry_counts_nothing_twice(
    collector: Collector,  # noqa: F811
) -> None:
    batches = [
        _nudged_run("a", nudges=[_nudge("stopped", tool="get_details_by_id")]),
        _nudged_run("a", nudges=[_nudge("recovered", tool="get_details_by_id"), _nudge("ended")]),
        _nudged_run("b", response="warn"),
    ]
    for b in batches:
        submit(collector, b)
    submit(collector, batches[0])  # a client retry
    submit(collector, batches[1])
    stored = _store_counts(collector)
    assert (
        stored["nudge"]
        == _metric_counts(collector, "loopwatch_nudges_total", ("agent", "tool", "detector"))
        == {("a", "get_details_by_id", "repeated_action"): 2}
    )
    assert (
        stored["warn"]
        == _metric_counts(collector, "loopwatch_loop_warnings_total", ("agent", "tool", "detector"))
        == {("b", "get_details_by_id", "repeated_action"): 1}
    )
    assert (
        stored["result"]
        == _metric_counts(
            collector, "loopwatch_nudge_results_total", ("agent", "detector", "result")
        )
        == {
            ("a", "repeated_action", "stopped"): 1,
            ("a", "repeated_action", "recovered"): 1,
            ("a", "repeated_action", "ended"): 1,
        }
    )
    assert value(collector, "loopwatch_tool_calls_total", outcome="nudged") == 2


def test_schema_18_adds_the_ladder_columns_to_a_schema_17_file(tmp_path: Path) -> None:
    path = tmp_path / "v17.duckdb"
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target=17) == 17
    key = run_key_of("old")
    con.execute(
        "INSERT INTO runs (run_key, run_id, trace_id, source, first_seen_unix_nano, "
        "last_seen_unix_nano, stop_reason, sampled) "
        "VALUES (?, 'old', ?, 'loopwatch', 1, 1, 'completed', true)",
        [key, "ab" * 16],
    )
    con.execute(
        "INSERT INTO stop_reports (run_key, run_id, trace_id, span_id, source, origin, "
        "stop_inferred, reason, time_unix_nano, received_unix_nano, counted) "
        "VALUES (?, 'old', ?, 's1', 'loopwatch', 'stop_span', false, 'completed', 1, 1, true)",
        [key, "ab" * 16],
    )
    con.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 21
        # A stop stored before reads through the rebuilt views, with no nudges.
        detail = store.reader().get_run("old")
        assert detail is not None and detail.stop is not None
        assert (detail.stop["span_id"], detail.nudges, detail.nudges_dropped) == ("s1", [], 0)
    con = duckdb.connect(str(path), read_only=True)
    for table in ("steps", "staged_steps"):
        names = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
        assert names[-4:] == ["received_unix_nano", "loop_response", "loop_rung", "loop_detector"]
    for view in ("stops", "stop_anomalies"):
        names = [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()]
        assert {"nudges", "nudges_dropped"} <= set(names)
    con.close()
