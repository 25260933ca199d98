"""The read API's additions for the dashboard, on a real collector fed with real spans.

``/api/v1/runs/{id}`` with ``limits`` and ``detector_version``; ``steps_since_progress`` on
``/api/v1/runs`` items; ``/api/v1/tools``; ``/api/v1/stats`` with ``agent``,
``runs_by_agent`` and ``canary_runs``. Each figure is checked against the DuckDB file.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopwatch.collector.config import load_config
from loopwatch.collector.records import SpanBatch, SpanRecord
from loopwatch.collector.service import Collector
from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
from loopwatch.instrumentation.testing import FakeClock
from starlette.testclient import TestClient

from tests.docs_examples import OBSERVE_RUN_ID, observe_example

from .spans import completed_run, looping_run, record, to_batch

CANARY = "lw-canary-5b1d0e9a7c3f"
WINDOW = {"since": 0, "until": 2**62}


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    canaries = tmp_path / "canaries.txt"
    canaries.write_text(f"{CANARY}\n")
    cfg = load_config(
        environ={},
        overrides={
            "store": {"db": str(tmp_path / "lw.duckdb")},
            "redaction": {"canaries_file": str(canaries)},
        },
    )
    c = Collector(cfg)
    yield c
    c.close()


def submit(c: Collector, fn: Any, *, canary: bool = False) -> str:
    """Record ``fn``'s run, optionally plant the canary in a tool result; return the run id."""
    batch = to_batch(record(fn))
    if canary:
        target = next(s for s in batch.spans if s.name.startswith("execute_tool"))
        target.attributes["gen_ai.tool.call.result"] = json.dumps({"note": CANARY})
    asyncio.run(c.submit(batch))
    run_ids = {s.attributes.get("loopwatch.run.id") for s in batch.spans} - {None}
    assert len(run_ids) == 1
    return str(run_ids.pop())


@pytest.fixture
def fed(collector: Collector) -> dict[str, str]:
    """Three runs: two agents, one loop, one canary-flagged."""
    return {
        "loop": submit(collector, looping_run("support", policy=Policy.build(repeat_limit=3))),
        "done": submit(collector, completed_run("support"), canary=True),
        "billing": submit(collector, completed_run("billing")),
    }


def api(collector: Collector) -> TestClient:
    return TestClient(collector.api_app())


def sql(collector: Collector, query: str, *params: Any) -> list[tuple[Any, ...]]:
    reader = collector.store.reader()
    rows, _ = reader._query(query, list(params))
    return [tuple(r.values()) for r in rows]


def test_run_detail_has_limits_and_detector_version(
    collector: Collector, fed: dict[str, str]
) -> None:
    run = api(collector).get(f"/api/v1/runs/{fed['loop']}").json()["run"]
    ((raw_limits, version),) = sql(
        collector, "SELECT limits, detector_version FROM runs WHERE run_id = ?", fed["loop"]
    )
    assert run["limits"] == json.loads(raw_limits)
    assert run["limits"]["repeat_limit"] == {"value": 3, "source": "call"}
    assert run["detector_version"] == version and version


def test_runs_have_steps_since_progress(collector: Collector, fed: dict[str, str]) -> None:
    items = api(collector).get("/api/v1/runs").json()["items"]
    got = {i["run_id"]: i["steps_since_progress"] for i in items}
    stored = dict(sql(collector, "SELECT run_id, steps_since_progress FROM stops"))
    assert got == stored and set(got) == set(fed.values())
    assert isinstance(got[fed["loop"]], int)


def test_tools(collector: Collector, fed: dict[str, str]) -> None:
    body = api(collector).get("/api/v1/tools", params=WINDOW).json()
    assert body == {
        "items": [
            {
                "tool": "get_details_by_id",
                "calls": 3,
                "ok": 2,
                "errors": 0,
                "blocked": 1,
                "runs": 1,
                "repeated_action_runs": 1,
                "nudged": 0,
                "nudges": 0,
                "nudges_recovered": 0,
                "nudge_recovery_rate": None,
            },
            {
                "tool": "lookup",
                "calls": 2,
                "ok": 2,
                "errors": 0,
                "blocked": 0,
                "runs": 2,
                "repeated_action_runs": 0,
                "nudged": 0,
                "nudges": 0,
                "nudges_recovered": 0,
                "nudge_recovery_rate": None,
            },
        ],
        "truncated": False,
    }


def test_tools_default_window_is_the_last_day(collector: Collector, fed: dict[str, str]) -> None:
    client = api(collector)
    assert len(client.get("/api/v1/tools").json()["items"]) == 2
    assert client.get("/api/v1/tools", params={"since": 0, "until": 1}).json()["items"] == []


@pytest.mark.parametrize(
    ("agent", "by_agent", "canary_runs", "stops", "loops"),
    [
        (
            None,
            {
                ("support", "repeated_action"): 1,
                ("support", "completed"): 1,
                ("billing", "completed"): 1,
            },
            1,
            {"repeated_action": 1, "completed": 2},
            {("get_details_by_id", "repeated_action"): 1},
        ),
        (
            "support",
            {("support", "repeated_action"): 1, ("support", "completed"): 1},
            1,
            {"repeated_action": 1, "completed": 1},
            {("get_details_by_id", "repeated_action"): 1},
        ),
        ("billing", {("billing", "completed"): 1}, 0, {"completed": 1}, {}),
        ("nobody", {}, 0, {}, {}),
    ],
)
def test_stats_by_agent(
    collector: Collector,
    fed: dict[str, str],
    agent: str | None,
    by_agent: dict[tuple[str, str], int],
    canary_runs: int,
    stops: dict[str, int],
    loops: dict[tuple[str, str], int],
) -> None:
    params: dict[str, Any] = {**WINDOW, "bucket_seconds": 86_400}
    if agent is not None:
        params["agent"] = agent
    body = api(collector).get("/api/v1/stats", params=params).json()
    assert set(body) == {
        "stops_by_reason",
        "loops_by_tool",
        "runs_by_agent",
        "canary_runs",
        "truncated",
    }
    assert {(r["agent"], r["stop_reason"]): r["runs"] for r in body["runs_by_agent"]} == by_agent
    assert body["canary_runs"] == canary_runs
    totals: dict[str, int] = {}
    for row in body["stops_by_reason"]:
        totals[row["stop_reason"]] = totals.get(row["stop_reason"], 0) + row["stops"]
    assert totals == stops
    assert {(r["tool"], r["stop_reason"]): r["stops"] for r in body["loops_by_tool"]} == loops
    assert body["truncated"] is False


def test_stats_without_agent_matches_the_store_reader(
    collector: Collector, fed: dict[str, str]
) -> None:
    body = api(collector).get("/api/v1/stats", params={**WINDOW, "bucket_seconds": 3600}).json()
    reference = collector.store.reader().stats(
        since_unix_nano=WINDOW["since"], until_unix_nano=WINDOW["until"], bucket_seconds=3600
    )
    assert body["stops_by_reason"] == reference.stops_by_reason
    assert body["loops_by_tool"] == reference.loops_by_tool


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        ("/api/v1/tools", {"since": "10", "until": "5"}, 400),
        ("/api/v1/tools", {"since": "soon"}, 400),
        ("/api/v1/stats", {"agent": "a" * 4097}, 400),
        ("/api/v1/stats", {"since": "10", "until": "5"}, 400),
        # Was 200 with no runs while /stats and /tools refused it (a review, 2026-12-02).
        ("/api/v1/runs", {"since": "10", "until": "5"}, 400),
        ("/api/v1/runs/" + "r" * 4100, {}, 400),
        ("/api/v1/runs", {"offset": str(10**20)}, 400),
        ("/api/v1/runs", {"since": str(-(2**63) - 1)}, 400),
        ("/api/v1/stats", {"until": str(2**63)}, 400),
        ("/api/v1/runs", {"detector": "completed"}, 400),
        ("/api/v1/tools/extra", {}, 404),
    ],
)
def test_new_endpoints_use_the_error_envelope(
    collector: Collector, path: str, params: dict[str, str], status: int
) -> None:
    response = api(collector).get(path, params=params)
    body = response.json()
    assert response.status_code == status
    assert set(body) == {"error"} and set(body["error"]) == {"status", "code", "message"}
    assert body["error"]["status"] == status


def test_tools_needs_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken-xyz\n")
    cfg = load_config(
        environ={},
        overrides={
            "store": {"db": str(tmp_path / "x.duckdb")},
            "server": {"token_file": str(token)},
        },
    )
    c = Collector(cfg)
    try:
        client = api(c)
        assert client.get("/api/v1/tools").status_code == 401
        ok = client.get("/api/v1/tools", headers={"Authorization": "Bearer t0ken-xyz"})
        assert ok.status_code == 200 and ok.json() == {"items": [], "truncated": False}
    finally:
        c.close()


def test_queries_public_names() -> None:
    from loopwatch.collector.store import reader as queries

    defined = {
        name
        for name, value in vars(queries).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == queries.__name__
    }
    assert defined <= set(queries.__all__)
    assert all(hasattr(queries, name) for name in queries.__all__)


def test_docs_list_every_read_endpoint(collector: Collector) -> None:
    docs = (Path(__file__).resolve().parents[3] / "docs" / "collector.md").read_text()
    section = docs.split("## Read API", 1)[1].split("\n## ", 1)[0]
    # The docs name path parameters without their Starlette converter.
    paths = [re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path) for r in collector.api_app().routes]
    assert paths and all(f"`GET {p}`" in section for p in paths if p != "/metrics")


def third_party_loop(trace_id: str, calls: int) -> SpanBatch:
    """An OpenTelemetry GenAI agent (no loopwatch code) calling one tool ``calls`` times
    with the same arguments and result, then its agent span."""
    agent = "a" * 16
    now = 1_700_000_000_000_000_000
    spans = [
        SpanRecord(
            trace_id,
            f"{i + 1:016x}",
            agent,
            "execute_tool poll_status",
            1,
            now + i * 1000,
            now + i * 1000 + 10,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "poll_status",
                "gen_ai.tool.call.arguments": '{"job": 7}',
                "gen_ai.tool.call.result": '{"state": "running"}',
            },
        )
        for i in range(calls)
    ]
    agent_attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "watcher"}
    spans.append(
        SpanRecord(
            trace_id, agent, "", "invoke_agent watcher", 1, now - 1, now + 10**6, agent_attrs
        )
    )
    return SpanBatch(spans)


def test_observe_mode_detections_are_in_the_api_as_in_the_metric(
    collector: Collector, fed: dict[str, str]
) -> None:
    """A third-party agent is not stopped (its stop stays ``completed``), so the API once
    showed none of the loops ``loopwatch_loop_detections_total`` counted for it (a review
    of observe mode, 2026-12-01): stats, tools and the runs filter now count them too."""
    asyncio.run(collector.submit(third_party_loop("7" * 32, 5)))
    client = api(collector)
    run = client.get("/api/v1/runs/" + "a" * 16).json()
    assert run["stop"]["reason"] == "completed"
    assert run["stop"]["observe_reason"] == "repeated_action"
    metric: dict[tuple[str, str], float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("loopwatch_loop_detections_total{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            key = (labels["tool"].strip('"'), labels["detector"].strip('"'))
            metric[key] = metric.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    loops = client.get("/api/v1/stats", params=WINDOW).json()["loops_by_tool"]
    assert {(r["tool"] or "none", r["stop_reason"]): float(r["stops"]) for r in loops} == {
        k: v for k, v in metric.items() if v
    }
    assert ("poll_status", "repeated_action") in metric
    tools = {t["tool"]: t for t in client.get("/api/v1/tools", params=WINDOW).json()["items"]}
    assert tools["poll_status"]["repeated_action_runs"] == 1
    listed = client.get("/api/v1/runs", params={"detector": "repeated_action"}).json()["items"]
    assert {r["run_id"] for r in listed} == {fed["loop"], "a" * 16}
    assert client.get("/api/v1/runs", params={"stop_reason": "repeated_action"}).json()[
        "items"
    ] == [r for r in listed if r["run_id"] == fed["loop"]]


def test_the_observe_mode_example_in_the_docs_is_detected(collector: Collector) -> None:
    """docs/collector.md's minimal OTLP/JSON request, with its tool span five times, as
    the text says: stored, completed, and repeated_action at step 3 on the API and
    /metrics."""
    body = observe_example(5)
    otlp = TestClient(collector.otlp_app())
    sent = otlp.post(
        "/v1/traces", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert sent.status_code == 200, sent.content
    client = api(collector)
    run = client.get(f"/api/v1/runs/{OBSERVE_RUN_ID}").json()
    assert (run["stop"]["reason"], run["stop"]["observe_reason"]) == (
        "completed",
        "repeated_action",
    )
    assert run["stop"]["observe_step"] == 3
    listed = client.get("/api/v1/runs", params={"detector": "repeated_action"}).json()["items"]
    assert [r["agent"] for r in listed] == ["weather_bot"]
    metrics = client.get("/metrics").text
    assert (
        'loopwatch_loop_detections_total{agent="weather_bot",detector="repeated_action",'
        'tool="get_weather"} 1.0' in metrics
    )


@pytest.mark.parametrize("run_id", ["tenant-a/ticket-42", "a/../b", "x/", "100%/done?#"])
def test_a_run_id_with_slashes_opens(collector: Collector, run_id: str) -> None:
    """``Run(run_id=...)`` takes any string; the detail route matched one path segment,
    so such a run was listed but answered 404 "no such endpoint", encoded or not."""
    from urllib.parse import quote

    assert submit(collector, looping_run("support", run_id=run_id)) == run_id
    client = api(collector)
    listed = [r["run_id"] for r in client.get("/api/v1/runs").json()["items"]]
    assert listed == [run_id]
    body = client.get(f"/api/v1/runs/{quote(run_id, safe='')}").json()
    assert body["run"]["run_id"] == run_id and body["stop"]["reason"] == "repeated_action"
    missing = client.get("/api/v1/runs/" + quote(run_id + "/more", safe=""))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_first_seen_order_pages_each_run_once_while_stops_arrive(collector: Collector) -> None:
    """Offset pages by the run's time skip or repeat a run whose stop arrives between two
    reads (its time moves), and ``until`` did not help, though the docs said so
    (helper-43). ``order=first_seen`` with the first page's ``seen_before`` lists every
    run once, leaving out runs first seen later."""
    heads = {}
    for i in range(6):
        spans = record(looping_run("pg", calls=1, run_id=f"pg-{i}"))
        heads[f"pg-{i}"] = [s for s in spans if s.name.startswith(("stop ", "invoke_agent "))]
        rest = [s for s in spans if s not in heads[f"pg-{i}"]]
        asyncio.run(collector.submit(to_batch(rest)))
    client = api(collector)

    def page(offset: int, bound: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": 2, "offset": offset, "order": "first_seen"}
        if bound is not None:
            params["seen_before"] = bound
        body: dict[str, Any] = client.get("/api/v1/runs", params=params).json()
        return body

    first = page(0)
    bound = first["seen_before"]
    listed = [r["run_id"] for r in first["items"]]
    assert listed == ["pg-5", "pg-4"]
    asyncio.run(collector.submit(to_batch(heads["pg-1"])))  # its stop: its time moves
    asyncio.run(collector.submit(to_batch(record(looping_run("pg", calls=1, run_id="pg-6")))))
    offset = first["next_offset"]
    while offset is not None:
        body = page(offset, bound)
        listed += [r["run_id"] for r in body["items"]]
        offset = body["next_offset"]
    assert listed == [f"pg-{i}" for i in (5, 4, 3, 2, 1, 0)]
    # The same by cursor: pg-6, first seen after the first page, is left out by itself.
    body = client.get("/api/v1/runs", params={"limit": 2, "order": "first_seen"}).json()
    by_cursor = [r["run_id"] for r in body["items"]]
    assert by_cursor == ["pg-6", "pg-5"]
    asyncio.run(collector.submit(to_batch(record(looping_run("pg", calls=1, run_id="pg-7")))))
    while body["next_cursor"] is not None:
        params = {"limit": 2, "order": "first_seen", "cursor": body["next_cursor"]}
        body = client.get("/api/v1/runs", params=params).json()
        by_cursor += [r["run_id"] for r in body["items"]]
    assert by_cursor == [f"pg-{i}" for i in (6, 5, 4, 3, 2, 1, 0)]
    assert "seen_before" not in client.get("/api/v1/runs").json()
    assert "next_cursor" not in client.get("/api/v1/runs").json()
    bad = client.get("/api/v1/runs", params={"order": "stop"})
    assert bad.status_code == 400 and "order must be one of" in bad.json()["error"]["message"]


def test_a_cursor_pages_past_a_run_removed_from_an_earlier_page(collector: Collector) -> None:
    """A third-party tool span ends (and is exported) before its agent span: it waits,
    pending, with no run of its own; a run stored after a page was read (the agent run)
    does not shift the later pages of a first_seen cursor."""
    from .test_pipeline import _genai, _split

    for run_id in ("A-oldest", "B-middle"):
        submit(collector, looping_run("pg", calls=1, run_id=run_id))
        time.sleep(0.002)  # distinct first-seen times, so the order below is fixed
    tool_only, agent_span = _split(_genai(None, True), "invoke_agent")
    asyncio.run(collector.submit(tool_only))
    client = api(collector)
    params: dict[str, Any] = {"limit": 1, "order": "first_seen"}
    body = client.get("/api/v1/runs", params=params).json()
    listed = [r["run_id"] for r in body["items"]]
    assert listed == ["B-middle"]  # the tool span is pending: no run of its own
    asyncio.run(collector.submit(agent_span))  # ... now stored in its agent run
    while body["next_cursor"] is not None:
        params["cursor"] = body["next_cursor"]
        body = client.get("/api/v1/runs", params=params).json()
        listed += [r["run_id"] for r in body["items"]]
    assert listed == ["B-middle", "A-oldest"]
    for bad in ({"cursor": "12.x", "order": "first_seen"}, {"cursor": f"1.{2**64}"}):
        refused = client.get("/api/v1/runs", params={"order": "first_seen", **bad})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_parameter"
    timed = client.get("/api/v1/runs", params={"cursor": "12.34"})
    assert timed.status_code == 400 and "order=first_seen only" in timed.text
    both = client.get("/api/v1/runs", params={**params, "offset": 1})
    assert both.status_code == 400 and "not both" in both.text


def test_long_names_can_be_filtered_and_opened(collector: Collector) -> None:
    """Names are stored whole; a 3,000-character agent name and run id were listed but
    refused as filters (a 512-character cap), so the dashboard's own selects failed."""
    agent, run_id = "A" * 3000, "r" * 3000
    assert submit(collector, looping_run(agent, run_id=run_id)) == run_id
    client = api(collector)
    items = client.get("/api/v1/runs", params={"agent": agent}).json()["items"]
    assert [r["run_id"] for r in items] == [run_id]
    assert client.get(f"/api/v1/runs/{run_id}").json()["run"]["agent"] == agent
    stats = client.get("/api/v1/stats", params={**WINDOW, "agent": agent}).json()
    assert stats["runs_by_agent"][0]["agent"] == agent
    refused = client.get("/api/v1/runs", params={"agent": "A" * 4097})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "agent is longer than 4096 characters"


def _tools_run(agent: str, tools: list[str]) -> Any:
    """A completed run calling each of ``tools`` once (the last one twice)."""

    def go(provider: Any) -> Any:
        with Run(agent, Policy(), tracer_provider=provider, clock=FakeClock()) as run:
            for i, name in enumerate([*tools, tools[-1]]):
                run.decide(lambda name=name, i=i: Decision.tool(ToolCall(name, {"q": i})))
                run.call_tool(name, {"q": i}, fn=lambda q: {"r": q})
            run.decide(lambda: Decision.final("done"))
        return run.outcome

    return go


def test_top_tool_is_set_on_a_full_page_of_runs_with_many_tools(tmp_path: Path) -> None:
    """A page's (run, tool) rows were read under the row cap, which counts runs, not
    calls: with ``store.max_rows = 4``, a page of 4 runs calling 3 tools each (12 rows)
    listed the newest runs with a ``top_tool`` of ``None``."""
    cfg = load_config(
        environ={}, overrides={"store": {"db": str(tmp_path / "lw.duckdb"), "max_rows": 4}}
    )
    c = Collector(cfg)
    try:
        for i in range(4):
            submit(c, _tools_run(f"agent-{i}", ["a", "b", f"top-{i}"]))
        items = api(c).get("/api/v1/runs", params={"limit": 4}).json()["items"]
        assert sorted(str(r["top_tool"]) for r in items) == [f"top-{i}" for i in range(4)]
        found = c.store.reader().get_run(items[0]["run_id"])
        assert found is not None and found.run["top_tool"] == items[0]["top_tool"]
    finally:
        c.close()


def test_a_runs_tool_counts_past_the_row_cap_say_they_are_cut(tmp_path: Path) -> None:
    """A run's tool counts were read under the row cap and cut without a word: with
    ``store.max_rows = 4``, a run calling 6 tools showed 4 in the run view and the API."""
    cfg = load_config(
        environ={}, overrides={"store": {"db": str(tmp_path / "lw.duckdb"), "max_rows": 4}}
    )
    c = Collector(cfg)
    try:
        run_id = submit(c, _tools_run("many", [f"t{i}" for i in range(6)]))
        body = api(c).get(f"/api/v1/runs/{run_id}").json()
        assert len(body["tools"]) == 4 and body["tools_truncated"] is True
        small = submit(c, _tools_run("few", ["a", "b"]))
        assert api(c).get(f"/api/v1/runs/{small}").json()["tools_truncated"] is False
    finally:
        c.close()


def test_runs_say_why_they_are_worth_a_look(collector: Collector, fed: dict[str, str]) -> None:
    """``observe_reason`` and ``loop_tool`` on each list item are its stop's, as stored."""
    items = api(collector).get("/api/v1/runs").json()["items"]
    got = {i["run_id"]: (i["observe_reason"], i["loop_tool"]) for i in items}
    stored = sql(collector, "SELECT run_id, observe_reason, loop_tool FROM stops")
    assert got == {run_id: (reason, tool) for run_id, reason, tool in stored}
    assert got[fed["loop"]] == (None, "get_details_by_id")
    assert got[fed["done"]] == (None, None)
