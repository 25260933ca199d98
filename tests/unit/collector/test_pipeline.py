"""The collector pipeline in process: real spans -> redact -> map -> detect -> DuckDB -> metrics -> API."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from loopwatch.collector.config import load_config
from loopwatch.collector.errors import QueueFull
from loopwatch.collector.records import SpanBatch, SpanRecord
from loopwatch.collector.service import Collector
from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
from loopwatch.instrumentation.testing import ConstantTool, FakeClock, ScriptedModel
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from tests.unit.test_store import Gate, tool_call_totals

from .spans import completed_run, looping_run, record, scripted_run, to_batch

CANARY = "lw-canary-7f3a9c2e51d4"


def canary_collector(tmp_path: Path) -> Collector:
    """A collector on a fresh file in ``tmp_path`` with :data:`CANARY` in its canary file."""
    canaries = tmp_path / "canaries.txt"
    canaries.write_text(f"# planted\n{CANARY}\n")
    cfg = load_config(
        environ={},
        overrides={
            "store": {"db": str(tmp_path / "lw.duckdb")},
            "redaction": {"canaries_file": str(canaries)},
        },
    )
    return Collector(cfg)


@pytest.fixture
def collector(tmp_path: Path) -> Any:
    c = canary_collector(tmp_path)
    yield c
    c.close()


def submit(c: Collector, batch: SpanBatch) -> None:
    asyncio.run(c.submit(batch))


def samples(c: Collector) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(c.exposition().decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(c: Collector, name: str, **labels: str) -> float:
    return sum(
        v for lbl, v in samples(c).get(name, []) if all(lbl.get(k) == x for k, x in labels.items())
    )


def test_loopwatch_run_is_stored_counted_and_served(collector: Collector) -> None:
    spans = record(looping_run())
    submit(collector, to_batch(spans))
    assert (
        value(
            collector, "loopwatch_agent_stops_total", agent="support", stop_reason="repeated_action"
        )
        == 1
    )
    assert value(collector, "loopwatch_tool_calls_total", agent="support", outcome="ok") == 2
    assert value(collector, "loopwatch_tool_calls_total", agent="support", outcome="blocked") == 1
    assert (
        value(
            collector,
            "loopwatch_loop_detections_total",
            detector="repeated_action",
            tool="get_details_by_id",
        )
        == 1
    )
    assert (
        value(
            collector, "loopwatch_agent_steps_since_progress_count", stop_reason="repeated_action"
        )
        == 1
    )
    client = TestClient(collector.api_app())
    runs = client.get("/api/v1/runs", params={"stop_reason": "repeated_action"}).json()["items"]
    assert len(runs) == 1 and runs[0]["agent"] == "support" and runs[0]["sampled"] is True
    detail = client.get(f"/api/v1/runs/{runs[0]['run_id']}").json()
    assert detail["stop"]["reason"] == "repeated_action"
    assert detail["evidence"]["repetitions"] == 3 and detail["evidence"]["step_indices"] == [
        1,
        2,
        3,
    ]
    assert [s["outcome"] for s in detail["steps"] if s["kind"] == "tool_result"] == [
        "ok",
        "ok",
        "blocked",
    ]


def test_client_retries_are_idempotent(collector: Collector) -> None:
    spans = record(looping_run())
    submit(collector, to_batch(spans))
    submit(collector, to_batch(spans))
    assert value(collector, "loopwatch_agent_stops_total") == 1
    assert value(collector, "loopwatch_tool_calls_total") == 3


def test_stop_span_arriving_before_the_run_span(collector: Collector) -> None:
    spans = record(looping_run())
    run_span = [s for s in spans if s.name.startswith("invoke_agent")]
    others = [s for s in spans if not s.name.startswith("invoke_agent")]
    submit(collector, to_batch(others))
    submit(collector, to_batch(run_span))
    assert value(collector, "loopwatch_agent_stops_total", agent="support") == 1
    client = TestClient(collector.api_app())
    assert client.get("/api/v1/runs").json()["items"][0]["policy_name"] == "default"


def test_a_run_known_only_by_its_stop_is_filed_under_the_stops_agent(
    collector: Collector,
) -> None:
    """A stop span whose run span had not come (or never comes) was counted under its
    agent on ``loopwatch_agent_stops_total`` but stored with ``agent`` null, so
    ``/api/v1/runs?agent=`` missed it and ``/api/v1/stats`` filed it under ``""`` (an
    adversarial review, 2026-12-02). The run now takes its stop's agent until its run
    span says otherwise."""
    spans = record(looping_run())
    stop_only = [s for s in spans if s.name.startswith("stop")]
    assert stop_only
    submit(collector, to_batch(stop_only))
    client = TestClient(collector.api_app())
    assert value(collector, "loopwatch_agent_stops_total", agent="support") == 1
    listed = client.get("/api/v1/runs", params={"agent": "support"}).json()["items"]
    assert [r["agent"] for r in listed] == ["support"]
    stats = client.get("/api/v1/stats", params={"since": 0}).json()
    assert [(r["agent"], r["runs"]) for r in stats["runs_by_agent"]] == [("support", 1)]
    run_span = [s for s in spans if s.name.startswith("invoke_agent")]
    renamed = copy.deepcopy(run_span[0])
    renamed._attributes = {**renamed.attributes, "gen_ai.agent.name": "support-v2"}
    submit(collector, to_batch([renamed]))
    listed = client.get("/api/v1/runs").json()["items"]
    assert [r["agent"] for r in listed] == ["support-v2"]  # the run span's agent wins


def _loops_on(agent: str, first: str, looped: str) -> Any:
    """A run that calls ``first`` once, then ``looped`` with the same arguments until the
    guard stops it (``repeated_action`` naming ``looped``)."""
    return scripted_run(
        agent,
        [Decision.tool(ToolCall(first, {"q": 0}))]
        + [Decision.tool(ToolCall(looped, {"id": 7}))] * 6
        + [Decision.final("ok")],
        {first: ConstantTool(), looped: ConstantTool()},
        Policy.build(repeat_limit=3),
    )


def test_runs_filter_by_the_tool_their_loop_detection_named(collector: Collector) -> None:
    """The Tools page listed, under "Runs that looped on a tool", a run that called the
    tool but looped on another (a new user's trial, 2026-12-02): the list used the
    ``tool`` (called it) and ``detector`` filters. ``loop_tool`` filters by the tool the
    detection named, as ``loopwatch_loop_detections_total`` counts it."""
    submit(collector, to_batch(record(_loops_on("a-then-b", "search", "fetch"))))
    submit(collector, to_batch(record(_loops_on("b-then-a", "fetch", "search"))))
    client = TestClient(collector.api_app())

    def agents(**params: str) -> list[str]:
        items = client.get("/api/v1/runs", params=params).json()["items"]
        return sorted(r["agent"] for r in items)

    assert agents(tool="search", detector="repeated_action") == ["a-then-b", "b-then-a"]
    assert agents(loop_tool="search") == ["b-then-a"]
    assert agents(loop_tool="fetch") == ["a-then-b"]
    assert agents(loop_tool="nothing") == []
    assert value(collector, "loopwatch_loop_detections_total", tool="search") == 1


def test_loop_tool_lists_loop_detections_only(collector: Collector) -> None:
    """An observe-mode retry budget's evidence names a tool as well; ``stops.loop_tool``
    took it, so ``?loop_tool=`` listed a run with no loop detection, which neither the
    metric nor ``/stats`` counts (a review of the filter, 2026-12-02)."""
    batch = to_batch(record(completed_run("support")))
    evidence = json.dumps({"detector": "retry_rule", "tool": "lookup"})
    for span in batch.spans:
        if "loopwatch.stop.reason" in span.attributes:
            span.attributes = {
                **span.attributes,
                "loopwatch.observe.stop_reason": "budget_exhausted",
                "loopwatch.observe.stop_evidence": evidence,
            }
    submit(collector, batch)
    client = TestClient(collector.api_app())
    [run] = client.get("/api/v1/runs").json()["items"]
    assert client.get(f"/api/v1/runs/{run['run_id']}").json()["stop"]["observe_reason"] == (
        "budget_exhausted"
    )
    assert client.get("/api/v1/runs", params={"loop_tool": "lookup"}).json()["items"] == []
    assert value(collector, "loopwatch_loop_detections_total", tool="lookup") == 0


def test_a_duplicate_stop_does_not_name_the_runs_agent(collector: Collector) -> None:
    """The agent fill took the first stop of a group that named an agent, not the counted
    one: a run whose counted stop named none (``unknown``) was filed under a duplicate
    stop's agent, which the stop counter never counted (a review, 2026-12-02)."""
    spans = record(looping_run())
    [stop] = [s for s in to_batch(spans).spans if s.attributes.get("loopwatch.event") == "stop"]
    anonymous = copy.deepcopy(stop)
    anonymous.attributes = {
        k: v for k, v in anonymous.attributes.items() if k != "gen_ai.agent.name"
    }
    named = copy.deepcopy(stop)
    named.span_id = "00000000000000ff"
    named.attributes = {**named.attributes, "gen_ai.agent.name": "billing"}
    submit(collector, SpanBatch(spans=[anonymous, named]))
    client = TestClient(collector.api_app())
    assert value(collector, "loopwatch_agent_stops_total", agent="unknown") == 1
    assert value(collector, "loopwatch_agent_stops_total", agent="billing") == 0
    assert client.get("/api/v1/runs", params={"agent": "billing"}).json()["items"] == []
    [run] = client.get("/api/v1/runs").json()["items"]
    assert run["agent"] is None


def _metric_series(c: Collector) -> dict[str, list[str]]:
    keep = ("loopwatch_agent", "loopwatch_tool", "loopwatch_loop")
    return {k: sorted(map(str, v)) for k, v in samples(c).items() if k.startswith(keep)}


def tools_run(agent: str, tools: list[str]) -> Any:
    """A completed run calling ``tools`` in order, each with new arguments."""

    def go(provider: Any) -> Any:
        with Run(agent, Policy(), tracer_provider=provider, clock=FakeClock()) as run:
            for i, tool in enumerate(tools):
                run.decide(lambda t=tool, i=i: Decision.tool(ToolCall(t, {"i": i})))
                run.call_tool(tool, {"i": i}, fn=lambda i: {"r": i})
            run.decide(lambda: Decision.final("done"))
        return run.outcome

    return go


def test_label_bounds_admit_first_come_first_served(tmp_path: Path) -> None:
    """Past the top-N bounds, values are admitted first come, first served: the busier
    names that came later are counted under ``_other``."""
    cfg = load_config(
        environ={"LOOPWATCH_METRICS_TOP_N_TOOLS": "2", "LOOPWATCH_METRICS_TOP_N_AGENTS": "1"},
        overrides={"store": {"db": str(tmp_path / "lw.duckdb")}},
    )
    first = Collector(cfg)
    submit(first, to_batch(record(tools_run("early", ["a", "b"]))))
    for _ in range(2):
        submit(first, to_batch(record(tools_run("busy", ["c"] * 5))))
    live = _metric_series(first)
    assert value(first, "loopwatch_tool_calls_total", tool="_other") == 10
    assert value(first, "loopwatch_agent_stops_total", agent="_other") == 2
    assert value(first, "loopwatch_tool_calls_total", tool="a") == 1
    first.close()
    assert live


def test_real_names_that_read_as_reserved_labels_keep_their_own_series(tmp_path: Path) -> None:
    """An agent named ``_other`` shared the overflow's series, and a tool named ``none``
    the label of detections that name no tool (carried in notes since 2026-12-01). They
    are written with a ``~`` appended (``_other~``, ``none~``, ``none~~`` for a real
    ``none~``), apart from the collector's own labels."""
    cfg = load_config(
        environ={"LOOPWATCH_METRICS_TOP_N_AGENTS": "2"},
        overrides={"store": {"db": str(tmp_path / "lw.duckdb")}},
    )
    first = Collector(cfg)
    submit(first, to_batch(record(tools_run("_other", ["none", "none~"]))))
    submit(first, to_batch(record(_loops_on("support", "search", "none"))))
    submit(first, to_batch(record(tools_run("third", ["x"]))))  # past the bound: _other
    assert value(first, "loopwatch_agent_stops_total", agent="_other~") == 1
    assert value(first, "loopwatch_agent_stops_total", agent="_other") == 1  # "third"
    assert value(first, "loopwatch_tool_calls_total", tool="none~") == 1 + 3
    assert value(first, "loopwatch_tool_calls_total", tool="none~~") == 1
    assert value(first, "loopwatch_tool_calls_total", tool="none") == 0
    detections = {
        (labels["tool"], labels["detector"])
        for labels, v in samples(first)["loopwatch_loop_detections_total"]
        if v
    }
    assert detections == {("none~", "repeated_action")}
    first.close()


def test_observe_mode_detection_is_counted_by_tool(collector: Collector) -> None:
    """A loopwatch agent in observe mode completes; the would-be stop's evidence (from
    ``loopwatch.observe.stop_evidence``) becomes the stored evidence, so the detection
    is counted under its tool, not ``none``."""
    submit(collector, to_batch(record(looping_run("obs", calls=5, mode="observe"))))
    assert (
        value(
            collector,
            "loopwatch_loop_detections_total",
            agent="obs",
            tool="get_details_by_id",
            detector="repeated_action",
        )
        == 1
    )
    assert value(collector, "loopwatch_loop_detections_total", tool="none") == 0
    client = TestClient(collector.api_app())
    run = client.get("/api/v1/runs", params={"agent": "obs"}).json()["items"][0]
    stop = client.get(f"/api/v1/runs/{run['run_id']}").json()["stop"]
    assert (stop["reason"], stop["observe_reason"]) == ("completed", "repeated_action")
    assert json.loads(stop["observe_evidence"])["tool"] == "get_details_by_id", stop
    assert json.loads(stop["evidence"]) == {"scope": "run"}  # the real stop's, kept


def test_observe_mode_detection_of_a_run_that_then_failed_keeps_its_tool(
    collector: Collector,
) -> None:
    """Observe mode saw a loop, then the run ended with an error: the detection is
    still counted under the tool (from ``observe_evidence``), the stop stays ``error``."""

    def go(provider: Any) -> None:
        tools = {"get_details_by_id": ConstantTool()}
        policy = Policy.build(repeat_limit=3)
        with (
            contextlib.suppress(RuntimeError),
            Run(
                "obs",
                policy,
                tracer_provider=provider,
                clock=FakeClock(),
                tools=tools,
                mode="observe",
            ) as run,
        ):
            for _ in range(5):
                decision = run.decide(
                    lambda: Decision.tool(ToolCall("get_details_by_id", {"id": 42}))
                )
                for c in decision.tool_calls:
                    run.call_tool(c.name, c.arguments)
            raise RuntimeError("model API down")

    submit(collector, to_batch(record(go)))
    labels = {"agent": "obs", "tool": "get_details_by_id", "detector": "repeated_action"}
    assert value(collector, "loopwatch_loop_detections_total", **labels) == 1
    assert value(collector, "loopwatch_agent_stops_total", agent="obs", stop_reason="error") == 1


def test_canary_is_redacted_counted_and_flagged(collector: Collector) -> None:
    batch = to_batch(record(completed_run()))
    target: SpanRecord = next(s for s in batch.spans if s.name.startswith("execute_tool"))
    target.attributes["gen_ai.tool.call.result"] = json.dumps({"note": f"token {CANARY}"})
    target.name = f"execute_tool {CANARY}"
    submit(collector, batch)
    assert value(collector, "loopwatch_canary_detections_total", location="attribute") == 1
    assert value(collector, "loopwatch_canary_detections_total", location="name") == 1
    client = TestClient(collector.api_app())
    items = client.get("/api/v1/runs", params={"canary": "true"}).json()["items"]
    assert len(items) == 1
    detail = client.get(f"/api/v1/runs/{items[0]['run_id']}").text
    assert CANARY not in detail and CANARY not in collector.exposition().decode()
    collector.close()
    raw = (Path(collector.config.store.db)).read_bytes()
    wal = Path(collector.config.store.db + ".wal")
    assert CANARY.encode() not in raw and (
        not wal.exists() or CANARY.encode() not in wal.read_bytes()
    )


def test_the_env_canaries_are_registered_beside_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LOOPWATCH_REDACTION_CANARIES`` was read only when no canary file was configured,
    so with both, the variable's canary (the one the agent side knows) was stored and
    exported in clear (a docs audit, 2026-12-01)."""
    env_canary = "lw-canary-envonly-9911c0ffee"
    env_file = tmp_path / "env-canaries.txt"
    env_file.write_text(env_canary + "\n")
    monkeypatch.setenv("LOOPWATCH_REDACTION_CANARIES", str(env_file))
    c = canary_collector(tmp_path)
    try:
        batch = to_batch(record(completed_run()))
        target: SpanRecord = next(s for s in batch.spans if s.name.startswith("execute_tool"))
        target.name = f"execute_tool {env_canary}"
        target.attributes["gen_ai.tool.call.result"] = json.dumps({"a": CANARY})
        submit(c, batch)
        assert value(c, "loopwatch_canary_detections_total", location="name") == 1
        assert value(c, "loopwatch_canary_detections_total", location="attribute") == 1
        exported = c.exposition().decode()
        assert env_canary not in exported and CANARY not in exported
    finally:
        c.close()


def test_api_error_envelope_is_one_shape(collector: Collector) -> None:
    client = TestClient(collector.api_app())
    cases = [
        client.get("/api/v1/runs/does-not-exist"),
        client.get("/api/v1/runs", params={"limit": "many"}),
        client.get("/api/v1/runs", params={"canary": "maybe"}),
        client.get("/nope"),
        client.post("/api/v1/runs"),
        client.get("/api/v1/stats", params={"since": "10", "until": "5"}),
    ]
    for response in cases:
        body = response.json()
        assert set(body) == {"error"} and set(body["error"]) == {"status", "code", "message"}
        assert body["error"]["status"] == response.status_code >= 400


def test_api_token_is_required_when_configured(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken-abc\n")
    cfg = load_config(
        environ={},
        overrides={
            "store": {"db": str(tmp_path / "x.duckdb")},
            "server": {"token_file": str(token)},
        },
    )
    c = Collector(cfg)
    try:
        client = TestClient(c.api_app())
        assert client.get("/api/v1/runs").status_code == 401
        assert client.get("/metrics").status_code == 401
        assert (
            client.get("/api/v1/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        )
        assert (
            client.get("/api/v1/runs", headers={"Authorization": "Bearer t0ken-abc"}).status_code
            == 200
        )
        assert client.get("/healthz").status_code == 200
        otlp = TestClient(c.otlp_app())
        assert (
            otlp.post(
                "/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"}
            ).status_code
            == 401
        )
    finally:
        c.close()


def test_stats_endpoint(collector: Collector) -> None:
    submit(collector, to_batch(record(looping_run())))
    client = TestClient(collector.api_app())
    stats = client.get(
        "/api/v1/stats", params={"since": 0, "until": 2**62, "bucket_seconds": 86400}
    ).json()
    assert sum(r["stops"] for r in stats["stops_by_reason"]) == 1
    assert stats["loops_by_tool"][0]["tool"] == "get_details_by_id"


def _genai(tool_agent: str | None, agent_span: bool) -> tuple[Any, ...]:
    def go(provider: Any) -> None:
        tracer = provider.get_tracer("third-party")

        def tool() -> None:
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
            if tool_agent:
                attrs["gen_ai.agent.name"] = tool_agent
            with tracer.start_as_current_span("execute_tool lookup", attributes=attrs):
                pass

        if agent_span:
            agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"}
            with tracer.start_as_current_span("invoke_agent triage", attributes=agent):
                tool()
        else:
            with tracer.start_as_current_span("root"):
                tool()

    return record(go)


def _split(spans: tuple[Any, ...], last: str) -> list[SpanBatch]:
    """Two requests: every span but those named ``last ...``, then those."""
    tail = [s for s in spans if s.name.startswith(last)]
    head = [s for s in spans if not s.name.startswith(last)]
    return [to_batch(head), to_batch(tail)]


def _lw_empty_agent(*, run_span_later: bool = False) -> list[SpanBatch]:
    """A looping loopwatch run whose tool and stop spans carry an empty agent name."""
    spans = record(looping_run("support"))
    batches = _split(spans, "invoke_agent") if run_span_later else [to_batch(spans)]
    for batch in batches:
        for span in batch.spans:
            if span.attributes.get("loopwatch.event") in ("tool_result", "stop"):
                span.attributes["gen_ai.agent.name"] = ""
    return batches


def _third_party_in_loopwatch_trace_first() -> list[SpanBatch]:
    """A third-party tool span inside a loopwatch run, sent before the loopwatch spans:
    first filed under a provisional run, then dropped from it (reassigned to None)."""

    def go(provider: Any) -> None:
        tracer = provider.get_tracer("third-party")
        model = ScriptedModel(
            [Decision.tool(ToolCall("get_details_by_id", {"id": 1})), Decision.final("ok")]
        )
        tools = {"get_details_by_id": ConstantTool()}
        policy = Policy.build(repeat_limit=3)
        with Run(
            "support", policy, tracer_provider=provider, clock=FakeClock(), tools=tools
        ) as run:
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
            with tracer.start_as_current_span("execute_tool lookup", attributes=attrs):
                pass
            while (decision := run.decide(model)).type != "final":
                for call in decision.tool_calls:
                    run.call_tool(call.name, call.arguments)

    spans = record(go)
    first = [s for s in spans if s.name == "execute_tool lookup"]
    return [to_batch(first), to_batch([s for s in spans if s not in first])]


def _span_twice_in_one_request() -> list[SpanBatch]:
    batch = to_batch(record(looping_run("support")))
    tool = next(s for s in batch.spans if s.attributes.get("loopwatch.event") == "tool_result")
    batch.spans.append(copy.deepcopy(tool))
    return [batch]


def _lw_stop_on_run_span_only() -> list[SpanBatch]:
    """A loopwatch run whose stop span never arrives: only the run span's stop attributes."""
    batch = to_batch(record(looping_run("support")))
    batch.spans = [s for s in batch.spans if s.attributes.get("loopwatch.event") != "stop"]
    return [batch]


def _lw_evidence(evidence: str) -> list[SpanBatch]:
    """A loopwatch loop stop whose evidence (client text) is ``evidence``, on the stop span
    and the run span alike."""
    batch = to_batch(record(looping_run("support")))
    for span in batch.spans:
        if "loopwatch.stop.evidence" in span.attributes:
            span.attributes = {**span.attributes, "loopwatch.stop.evidence": evidence}
    return [batch]


def _lw_stop_without_progress_count() -> list[SpanBatch]:
    """A looping loopwatch run whose stop (on the stop span and the run span) does not
    carry ``loopwatch.steps_since_progress``."""
    batch = to_batch(record(looping_run("support")))
    for span in batch.spans:
        if span.attributes.get("loopwatch.event") == "stop" or span.name.startswith("invoke_agent"):
            span.attributes = {
                k: v for k, v in span.attributes.items() if k != "loopwatch.steps_since_progress"
            }
    return [batch]


def test_a_stop_without_steps_since_progress_is_not_observed_as_zero(
    collector: Collector,
) -> None:
    """Counted as a stop, left out of the steps-since-progress histogram: observing 0
    would read as progress just made (the run looped: it made none)."""
    for batch in _lw_stop_without_progress_count():
        submit(collector, batch)
    labels = {"agent": "support", "stop_reason": "repeated_action"}
    assert value(collector, "loopwatch_agent_stops_total", **labels) == 1
    assert value(collector, "loopwatch_agent_steps_count", **labels) == 1
    assert value(collector, "loopwatch_agent_steps_since_progress_count", **labels) == 0
    # The series is still exported (a zero histogram), like the stops counter's.
    assert any(
        lbl.get("stop_reason") == "repeated_action"
        for lbl, _ in samples(collector)["loopwatch_agent_steps_since_progress_count"]
    )


_STOP_ATTRS = ("loopwatch.stop.", "gen_ai.agent.finish_reason")


def _lw_bare_run_span_first(*, then_run_span: bool = False) -> list[SpanBatch]:
    """A loopwatch run span without stop attributes (its stop is inferred) sent first; its
    stop span later. With ``then_run_span``, a second run span carrying the stop attributes
    comes between them (a hostile client): three stops of rising precedence."""
    spans = record(looping_run("support"))
    run_span = next(s for s in spans if s.name.startswith("invoke_agent"))
    stop_span = [s for s in spans if dict(s.attributes).get("loopwatch.event") == "stop"]
    rest = [s for s in spans if s is not run_span and s not in stop_span]
    bare = to_batch([run_span])
    for span in bare.spans:
        span.attributes = {
            k: v for k, v in span.attributes.items() if not k.startswith(_STOP_ATTRS)
        }
    batches = [to_batch(rest), bare]
    if then_run_span:
        again = to_batch([run_span])
        again.spans[0].span_id = "f" * 16
        batches.append(again)
    return [*batches, to_batch(stop_span)]


def _stop_span_twice_in_one_request() -> list[SpanBatch]:
    batch = to_batch(record(looping_run("support")))
    stop = next(s for s in batch.spans if s.attributes.get("loopwatch.event") == "stop")
    batch.spans.append(copy.deepcopy(stop))
    return [batch]


COUNT_CASES = {
    "third-party tool agent, no agent span": lambda: [to_batch(_genai("helper", False))],
    "third-party tool agent under another agent": lambda: [to_batch(_genai("sub", True))],
    "third-party calls reassigned across requests": lambda: _split(
        _genai(None, True), "invoke_agent"
    ),
    "third-party calls with their own agent reassigned": lambda: _split(
        _genai("helper", True), "invoke_agent"
    ),
    "third-party span in a loopwatch trace, sent first": _third_party_in_loopwatch_trace_first,
    "a span sent twice in one request": _span_twice_in_one_request,
    "a stop span sent twice in one request": _stop_span_twice_in_one_request,
    "a request sent twice": lambda: [to_batch(spans) for spans in [record(looping_run())] * 2],
    "loopwatch run span with its stop, no stop span": _lw_stop_on_run_span_only,
    "loopwatch run span without stop attributes, stop span later": _lw_bare_run_span_first,
    "inferred, then run-span, then stop-span stops": lambda: _lw_bare_run_span_first(
        then_run_span=True
    ),
    "loopwatch run span after its tool spans": lambda: _split(
        record(looping_run("support")), "invoke_agent"
    ),
    "loop stop evidence that is not JSON": lambda: _lw_evidence("search_tickets x3 {"),
    "loopwatch stop without steps since progress": _lw_stop_without_progress_count,
    "loop stop evidence naming a tool that is not a string": lambda: _lw_evidence(
        '{"detector": "repeated_action", "tool": ["search_tickets"]}'
    ),
    "loopwatch tool spans with an empty agent name": _lw_empty_agent,
    # Counted live as "unknown" (no agent of their own, the run's not seen yet): the
    # label is stored with the calls, not re-derived from the run row that came later.
    "loopwatch tool spans without agent, run span later": lambda: _lw_empty_agent(
        run_span_later=True
    ),
}


COUNTERS = (
    "loopwatch_tool_calls_total",
    "loopwatch_agent_stops_total",
    "loopwatch_loop_detections_total",
    "loopwatch_agent_steps_since_progress_count",
)


@pytest.mark.parametrize("case", list(COUNT_CASES), ids=list(COUNT_CASES))
def test_counters_start_from_zero_after_a_restart(tmp_path: Path, case: str) -> None:
    """Tool calls, stops and loop detections are counted live, and a restarted
    collector starts them from zero (Prometheus reads it as a counter reset; the totals
    stay in the store)."""
    cfg = load_config(environ={}, overrides={"store": {"db": str(tmp_path / "lw.duckdb")}})

    def counted(c: Collector) -> dict[str, list[str]]:
        found = samples(c)
        return {name: sorted(str(s) for s in found.get(name, []) if s[1]) for name in COUNTERS}

    live_collector = Collector(cfg)
    for batch in COUNT_CASES[case]():
        submit(live_collector, batch)
    live = counted(live_collector)
    live_collector.close()
    restored_collector = Collector(cfg)
    restored = counted(restored_collector)
    restored_collector.close()
    assert live["loopwatch_tool_calls_total"], live
    assert restored == {name: [] for name in COUNTERS}


def _tool_spans(trace_id: str, parent: str, n: int, tool: str, *, same: bool) -> list[SpanRecord]:
    """``n`` third-party tool spans under ``parent`` (identical calls when ``same``)."""
    spans = []
    for i in range(n):
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.arguments": json.dumps({"id": 1 if same else i}),
            "gen_ai.tool.call.result": json.dumps({"status": "pending" if same else i}),
        }
        start = 1_000 + i * 10
        spans.append(
            SpanRecord(
                trace_id,
                f"{i + 1:016x}",
                parent,
                f"execute_tool {tool}",
                1,
                start,
                start + 5,
                attrs,
            )
        )
    return spans


def test_a_request_refused_by_a_full_queue_after_mapping_keeps_its_verdict(tmp_path: Path) -> None:
    """The store's queue bound is checked again when the mapped request is queued: a
    request that passed the first check while others were being mapped is refused
    (503) after the map and detect stages took it in. Its retry was then mapped as a
    resend: the observe-mode verdict of its five identical calls was gone and no loop
    was counted (a review of acknowledgement and data loss, 2026-12-02). Made certain
    rather than raced: the writer is held after a first commit, a 300-span request waits
    in the queue (bound 512 spans), and the 306-span target passes the collector's check
    (300 < 512) and is refused by the store's (300 + 306 > 512)."""
    cfg = load_config(
        environ={},
        overrides={
            "store": {"db": str(tmp_path / "lw.duckdb"), "queue_max_batches": 1},
            "sampling": {"completed_fraction": 0.0},
        },
    )
    c = Collector(cfg)
    gate = Gate()
    counted = c.store._on_commit  # the collector's own hook, still called first

    def hold_after_commit(stats: Any) -> None:
        if counted is not None:
            counted(stats)
        gate(stats)

    c.store._on_commit = hold_after_commit
    try:
        agent_id, trace_id = "a" * 16, "5b8efff798038103d269b633813fc60c"
        agent = SpanRecord(
            trace_id,
            agent_id,
            "",
            "invoke_agent triage",
            1,
            0,
            10_000,
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"},
        )
        first = _tool_spans("1" * 32, "b" * 16, 10, "fill", same=False)
        queued = _tool_spans("2" * 32, "c" * 16, 300, "fill", same=False)
        padding = _tool_spans("3" * 32, "d" * 16, 300, "fill", same=False)
        target = [*_tool_spans(trace_id, agent_id, 5, "lookup_order", same=True), agent, *padding]

        async def attempt(spans: list[SpanRecord]) -> int:
            try:
                await c.submit(SpanBatch(copy.deepcopy(spans)))
            except QueueFull:
                return 503
            return 200

        async def scenario() -> list[int]:
            loop = asyncio.get_running_loop()
            gate.armed = True
            held = await attempt(first)  # committed; the writer then waits in the hook
            assert await loop.run_in_executor(None, gate.holding.wait, 10)
            waiting = asyncio.ensure_future(attempt(queued))
            while c.store.queue_spans < len(queued):
                await asyncio.sleep(0.01)
            refused = await attempt(target)
            gate.release.set()
            return [held, await waiting, refused]

        assert asyncio.run(scenario()) == [200, 200, 503]  # the target refused once mapped
        submit(c, SpanBatch(copy.deepcopy(target)))  # the client's retry
        client = TestClient(c.api_app())
        detail = client.get(f"/api/v1/runs/{agent_id}").json()
        assert detail["stop"]["observe_reason"] == "repeated_action"
        assert detail["run"]["tool_calls"] == 5 and detail["run"]["sampled"] is True
        assert value(c, "loopwatch_loop_detections_total", agent="triage", tool="lookup_order") == 1
    finally:
        c.close()


def test_a_pending_call_is_counted_once_when_its_agent_span_releases_it(tmp_path: Path) -> None:
    """A third-party tool span that arrives before its agent span is counted when it
    arrives (pending); its release to the agent run in a later request counts nothing."""

    def agent_with_one_call(provider: Any) -> None:
        tracer = provider.get_tracer("third-party")
        agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"}
        tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
        with tracer.start_as_current_span("invoke_agent triage", attributes=agent):
            with tracer.start_as_current_span("execute_tool lookup", attributes=tool):
                pass

    spans = record(agent_with_one_call)
    c = Collector(load_config(environ={}, overrides={"store": {"db": str(tmp_path / "lw.duckdb")}}))
    try:
        asyncio.run(c.submit(to_batch([s for s in spans if s.name.startswith("execute_tool")])))
        assert value(c, "loopwatch_tool_calls_total") == 1
        asyncio.run(c.submit(to_batch([s for s in spans if s.name.startswith("invoke_agent")])))
        assert value(c, "loopwatch_tool_calls_total") == 1
        assert sum(tool_call_totals(c.store).values()) == 1
    finally:
        c.close()
