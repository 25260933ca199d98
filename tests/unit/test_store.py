"""DuckDB store: group commit, idempotency, late spans, stops, sampling, migrations, reads."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loopwatch.collector.errors import QueueFull
from loopwatch.collector.map import MapStage
from loopwatch.collector.records import SpanBatch, SpanRecord
from loopwatch.collector.rows import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    SOURCE_LOOPWATCH,
    STOP_ORIGIN_INFERRED,
    STOP_ORIGIN_RUN_SPAN,
    STOP_ORIGIN_STOP_SPAN,
    STOP_ORIGINS,
    MappedBatch,
    RunRow,
    StepRow,
    StopRow,
)
from loopwatch.collector.sample import (
    RULE_ABNORMAL,
    RULE_COMPLETED_FRACTION,
    RULE_HOURLY_CAP,
    Sampler,
    SamplingConfig,
    run_fraction,
)
from loopwatch.collector.store import (
    SCHEMA_VERSION,
    CommitResult,
    CommitStats,
    ReadTimeout,
    SchemaTooNew,
    Store,
    StoreClosed,
    StoreConfig,
    StoreError,
    StoreReader,
    apply_migrations,
)
from loopwatch.collector.store.schema import run_key_of as _run_key
from loopwatch.collector.store.settings import default_row_group_rows
from loopwatch.instrumentation import _semconv as sc

T0 = 1_800_000_000.0
NS = 1_000_000_000
_span_ids = itertools.count(1)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Gate:
    """An ``on_commit`` hook that can hold the writer thread after a commit."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()
        self.armed = False
        self.stats: list[CommitStats] = []

    def __call__(self, stats: CommitStats) -> None:
        self.stats.append(stats)
        if self.armed:
            self.armed = False
            self.holding.set()
            self.release.wait(10)


def trace_of(run_id: str) -> str:
    return hashlib.md5(run_id.encode()).hexdigest()


def sid() -> str:
    return f"{next(_span_ids):016x}"


def run_row(run_id: str, *, agent: str = "triage", start: int = 0, end: int = 100) -> RunRow:
    return RunRow(
        run_id,
        trace_of(run_id),
        sid(),
        SOURCE_LOOPWATCH,
        is_run_span=True,
        agent=agent,
        policy_name="investigate-readonly",
        start_unix_nano=start,
        end_unix_nano=end,
        status_code=0,
    )


def step_row(
    run_id: str,
    step: int,
    *,
    kind: str = KIND_TOOL_RESULT,
    tool: str | None = "search",
    outcome: str | None = sc.OUTCOME_OK,
    start: int | None = None,
    span_id: str | None = None,
) -> StepRow:
    tool_fields: dict[str, Any] = (
        {"tool": tool, "outcome": outcome}
        if kind == KIND_TOOL_RESULT
        else {"decision_type": "tool", "input_tokens": 10, "output_tokens": 5}
    )
    return StepRow(
        trace_id=trace_of(run_id),
        span_id=span_id or sid(),
        run_id=run_id,
        source=SOURCE_LOOPWATCH,
        kind=kind,
        step=step,
        start_unix_nano=step * 10 if start is None else start,
        end_unix_nano=(step * 10 if start is None else start) + 1,
        **tool_fields,
    )


def stop_row(
    run_id: str,
    reason: str,
    *,
    origin: str = STOP_ORIGIN_STOP_SPAN,
    time_ns: int = 90,
    step: int | None = 3,
    evidence: str = '{"repetitions": 3}',
) -> StopRow:
    return StopRow(
        trace_id=trace_of(run_id),
        span_id=sid(),
        run_id=run_id,
        source=SOURCE_LOOPWATCH,
        origin=origin,
        reason=reason,
        time_unix_nano=time_ns,
        step=step,
        evidence=evidence,
    )


def batch(*rows: RunRow | StepRow | StopRow, canaries: frozenset[str] = frozenset()) -> MappedBatch:
    out = MappedBatch(canary_run_ids=canaries)
    for row in rows:
        if isinstance(row, RunRow):
            out.runs.append(row)
        elif isinstance(row, StepRow):
            out.steps.append(row)
        else:
            out.stops.append(row)
    # one span per distinct span key, as the map stage would have read them
    keys = {(r.trace_id, r.span_id) for r in (*out.runs, *out.steps, *out.stops)}
    out.spans_in = len(keys)
    return out


def full_run(
    run_id: str,
    reason: str | None,
    *,
    tools: tuple[str, ...] = ("search", "search", "fetch"),
    agent: str = "triage",
    stop_ns: int = 90,
) -> MappedBatch:
    rows: list[RunRow | StepRow | StopRow] = [run_row(run_id, agent=agent)]
    for i, tool in enumerate(tools, start=1):
        rows.append(step_row(run_id, i, kind=KIND_DECISION))
        rows.append(step_row(run_id, i, tool=tool))
    if reason is not None:
        # A repeat names its tool, as the guard's evidence does; no_progress names none.
        repeated = max(tools, key=tools.count) if tools else None
        named = {"tool": repeated} if reason == "repeated_action" and repeated else {}
        evidence = {"repetitions": 3, **named}
        rows.append(
            stop_row(
                run_id, reason, time_ns=stop_ns, step=len(tools), evidence=json.dumps(evidence)
            )
        )
    return batch(*rows)


def commit(store: Store, mapped: MappedBatch) -> CommitResult:
    return store.submit(mapped).result(timeout=30)


_SQL_COUNTED_STOPS = (
    "SELECT COALESCE(s.agent, r.agent, '') AS agent, s.reason, count(*) AS n FROM "
    "(SELECT run_key, agent, reason FROM stops WHERE counted UNION ALL "
    "SELECT run_key, agent, reason FROM stop_anomalies WHERE counted) s "
    "LEFT JOIN runs r USING (run_key) GROUP BY ALL"
)
_SQL_TOOL_CALLS = (
    "SELECT COALESCE(t.agent, r.agent, '') AS agent, t.tool, t.outcome, sum(t.calls) AS n "
    "FROM run_tools t LEFT JOIN runs r USING (run_key) "
    "WHERE t.agent IS NULL OR t.agent <> '' GROUP BY ALL HAVING sum(t.calls) <> 0"
)


def stop_totals(store: Store) -> dict[tuple[str, str], int]:
    """The stops stored as counted (``counted``), by ``(agent, stop_reason)`` (agent
    ``""`` when unknown): one per run, the one ``/metrics`` counted."""
    rows, _ = store.reader()._query(_SQL_COUNTED_STOPS, [], max_rows=1_000_000)
    return {(r["agent"], r["reason"]): int(r["n"]) for r in rows}


def tool_call_totals(store: Store) -> dict[tuple[str, str, str], int]:
    """Stored tool calls by ``(agent, tool, outcome)``, under the agent label each call
    was counted under (``run_tools.agent``)."""
    rows, _ = store.reader()._query(_SQL_TOOL_CALLS, [], max_rows=1_000_000)
    return {(r["agent"], r["tool"], r["outcome"]): int(r["n"]) for r in rows}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def make_store(tmp_path: Path, clock: Clock, gate: Gate) -> Iterator[Any]:
    stores: list[Store] = []

    def make(**config: Any) -> Store:
        sampling = config.pop("sampling", SamplingConfig(completed_fraction=1.0))
        store = Store(
            tmp_path / f"db{len(stores)}.duckdb",
            config=StoreConfig(sampling=sampling, **config),
            clock=clock,
            on_commit=gate,
        )
        stores.append(store)
        return store

    yield make
    gate.release.set()
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store: Any) -> Store:
    result: Store = make_store()
    return result


def hold_writer(store: Store, gate: Gate) -> None:
    gate.armed = True
    commit_future = store.submit(batch(run_row("plug")))
    assert gate.holding.wait(10)
    assert not commit_future.done() or commit_future.result()


def test_future_resolves_after_commit_and_rows_are_readable(store: Store) -> None:
    result = commit(store, full_run("r1", "repeated_action"))
    assert result.spans == 8 and len(result.new_span_keys) == 8 and result.duplicates == 0
    detail = store.reader().get_run("r1")
    assert detail is not None
    run = detail.run
    assert (run["agent"], run["stop_reason"], run["steps"]) == ("triage", "repeated_action", 3)
    assert (run["decisions"], run["tool_calls"], run["tokens"]) == (3, 3, 45)
    assert (run["sampled"], run["sample_rule"], run["top_tool"]) == (True, RULE_ABNORMAL, "search")
    assert [(s["step"], s["kind"]) for s in detail.steps] == [
        (1, KIND_DECISION),
        (1, KIND_TOOL_RESULT),
        (2, KIND_DECISION),
        (2, KIND_TOOL_RESULT),
        (3, KIND_DECISION),
        (3, KIND_TOOL_RESULT),
    ]
    assert detail.evidence == {"repetitions": 3, "tool": "search"}
    assert detail.tools == [
        {"tool": "fetch", "outcome": "ok", "calls": 1},
        {"tool": "search", "outcome": "ok", "calls": 2},
    ]


def test_group_commit_writes_queued_batches_in_one_transaction(store: Store, gate: Gate) -> None:
    hold_writer(store, gate)
    futures = [store.submit(full_run(f"g{i}", "no_progress")) for i in range(5)]
    assert store.queue_batches == 5 and store.queue_spans == 40
    gate.release.set()
    results = [f.result(timeout=30) for f in futures]
    assert {(r.group_batches, r.group_spans) for r in results} == {(5, 40)}
    assert len({r.commit_seconds for r in results}) == 1
    assert gate.stats[-1].batches == 5 and gate.stats[-1].new_spans == 40
    assert store.queue_spans == 0


def test_queue_full_raises_at_once_and_drops_nothing(make_store: Any, gate: Gate) -> None:
    store = make_store(max_queue_spans=10)
    hold_writer(store, gate)
    accepted = [store.submit(full_run(f"q{i}", None, tools=("a",))) for i in range(3)]
    with pytest.raises(QueueFull) as info:
        store.submit(full_run("q-over", None, tools=("a",)))
    assert info.value.capacity == 10 and info.value.retryable
    assert store.queue_spans == 9
    gate.release.set()
    assert all(len(f.result(timeout=30).new_span_keys) == 3 for f in accepted)
    assert store.reader().get_run("q-over") is None


def test_resubmitted_batch_is_idempotent(store: Store, gate: Gate) -> None:
    mapped = full_run("d1", None)
    commit(store, mapped)
    again = commit(store, mapped)
    assert again.duplicates == again.spans == 7 and not again.new_span_keys
    hold_writer(store, gate)
    twin = full_run("d2", None)
    first, second = store.submit(twin), store.submit(twin)
    gate.release.set()
    assert len(first.result(timeout=30).new_span_keys) == 7
    assert second.result(timeout=30).duplicates == 7
    for run_id in ("d1", "d2"):
        detail = store.reader().get_run(run_id)
        assert detail is not None
        assert (detail.run["tool_calls"], len(detail.steps)) == (3, 6)
        assert all(s["staged"] for s in detail.steps)


def test_late_tool_span_after_the_stop(make_store: Any) -> None:
    store = make_store(sampling=SamplingConfig(completed_fraction=0.0))
    commit(store, full_run("kept", "repeated_action"))
    commit(store, full_run("dropped", "completed"))
    for run_id in ("kept", "dropped"):
        commit(store, batch(step_row(run_id, 4, tool="late", outcome=sc.OUTCOME_ERROR)))
    kept, dropped = store.reader().get_run("kept"), store.reader().get_run("dropped")
    assert kept is not None and dropped is not None
    assert (kept.run["tool_calls"], kept.run["tool_errors"], kept.run["steps"]) == (4, 1, 4)
    assert [s["tool"] for s in kept.steps][-1] == "late" and not kept.steps[-1]["staged"]
    assert (dropped.run["tool_calls"], dropped.run["tool_errors"]) == (4, 1)
    assert dropped.run["sampled"] is False and dropped.steps == []
    assert {"tool": "late", "outcome": "error", "calls": 1} in dropped.tools


def _comparable(store: Store, run_id: str) -> dict[str, Any]:
    detail = store.reader().get_run(run_id)
    assert detail is not None
    skip = {"received_unix_nano", "span_id"}
    return {
        "run": detail.run,
        "steps": [{k: v for k, v in s.items() if k not in skip} for s in detail.steps],
        "stop": {k: v for k, v in (detail.stop or {}).items() if k not in skip},
        "tools": detail.tools,
    }


def test_run_span_first_or_last_gives_the_same_rows(make_store: Any) -> None:
    mapped = full_run("o1", "budget_exhausted")
    run_span, steps, stop = mapped.runs, mapped.steps, mapped.stops
    first, last = make_store(), make_store()
    commit(first, batch(*run_span))
    commit(first, batch(*steps))
    commit(first, batch(*stop))
    commit(last, batch(*stop))
    commit(last, batch(*reversed(steps)))
    commit(last, batch(*run_span))
    a, b = _comparable(first, "o1"), _comparable(last, "o1")
    assert (a["run"].pop("sample_tool"), b["run"].pop("sample_tool")) == ("search", "")
    assert a == b
    assert a["run"]["top_tool"] == "search"
    assert a["run"]["agent"] == "triage" and a["run"]["start_unix_nano"] == 0
    assert a["run"]["sampled"] is True and len(a["steps"]) == 6


def test_second_stop_is_kept_as_duplicate_anomaly(store: Store) -> None:
    first = full_run("s1", "repeated_action")
    assert commit(store, first).counted_stops == tuple(first.stops)
    second = stop_row("s1", "no_progress", time_ns=95)
    result = commit(store, batch(second))
    assert result.counted_stops == ()
    detail = store.reader().get_run("s1")
    assert detail is not None and detail.stop is not None
    assert detail.stop["reason"] == "repeated_action"
    assert detail.run["stop_reason"] == "repeated_action"
    assert detail.run["duplicate_stops"] == 1
    assert [(a["reason"], a["kind"]) for a in detail.stop_anomalies] == [
        ("no_progress", "duplicate_stop")
    ]
    assert stop_totals(store) == {("triage", "repeated_action"): 1}


@pytest.mark.parametrize(
    "origins",
    [
        (STOP_ORIGIN_INFERRED, STOP_ORIGIN_STOP_SPAN, STOP_ORIGIN_RUN_SPAN),
        (STOP_ORIGIN_RUN_SPAN, STOP_ORIGIN_INFERRED, STOP_ORIGIN_STOP_SPAN),
        (STOP_ORIGIN_STOP_SPAN, STOP_ORIGIN_RUN_SPAN, STOP_ORIGIN_INFERRED),
    ],
)
@pytest.mark.parametrize("grouped", [False, True], ids=["one by one", "one group"])
def test_stronger_stop_wins_in_any_order(
    store: Store, gate: Gate, origins: tuple[str, ...], grouped: bool
) -> None:
    """Requests committed in one group give what they give committed one by one: the
    same primary stop, the same replaced rows, the same counted stop."""
    reasons = {
        STOP_ORIGIN_INFERRED: "completed",
        STOP_ORIGIN_RUN_SPAN: "action_cycle",
        STOP_ORIGIN_STOP_SPAN: "action_cycle",
    }
    stops = [stop_row("p1", reasons[origin], origin=origin) for origin in origins]
    if grouped:
        hold_writer(store, gate)
        futures = [store.submit(batch(s)) for s in stops]
        gate.release.set()
        results = [f.result(timeout=30) for f in futures]
        assert {r.group_batches for r in results} == {len(stops)}
    else:
        results = [commit(store, batch(s)) for s in stops]
    assert [r.counted_stops for r in results] == [(stops[0],), (), ()]
    detail = store.reader().get_run("p1")
    assert detail is not None and detail.stop is not None
    assert (detail.stop["origin"], detail.stop["reason"]) == (STOP_ORIGIN_STOP_SPAN, "action_cycle")
    assert detail.run["stop_inferred"] is False and detail.run["duplicate_stops"] == 0
    # Each primary stop a stronger one replaced is kept; the first one committed stays the
    # counted one (the live counter cannot move a count), before and after a restart.
    primaries: list[str] = []
    for origin in origins:
        if not primaries or STOP_ORIGINS[origin] > STOP_ORIGINS[primaries[-1]]:
            primaries.append(origin)
    assert [(a["origin"], a["kind"]) for a in detail.stop_anomalies] == [
        (o, "replaced_stop") for o in primaries[:-1]
    ]
    counts = stop_totals(store)
    assert [(reason, n) for (_, reason), n in counts.items()] == [(reasons[origins[0]], 1)]


@pytest.mark.parametrize("stop_span_first", [True, False])
def test_run_span_and_stop_span_in_one_request_count_the_stop_span(
    store: Store, stop_span_first: bool
) -> None:
    """One request is one report: its strongest stop is the run's, counted, and nothing is
    kept as replaced, in either span order."""
    stop_span = stop_row("o1", "repeated_action", origin=STOP_ORIGIN_STOP_SPAN)
    run_span = stop_row("o1", "repeated_action", origin=STOP_ORIGIN_RUN_SPAN)
    pair = [stop_span, run_span] if stop_span_first else [run_span, stop_span]
    result = commit(store, batch(*pair))
    assert result.counted_stops == (stop_span,)
    detail = store.reader().get_run("o1")
    assert detail is not None and detail.stop is not None
    assert detail.stop["origin"] == STOP_ORIGIN_STOP_SPAN and detail.stop_anomalies == []
    assert stop_totals(store) == {("", "repeated_action"): 1}


_STOP_OFFER = st.tuples(
    st.sampled_from(("a", "b")),
    st.sampled_from((STOP_ORIGIN_INFERRED, STOP_ORIGIN_RUN_SPAN, STOP_ORIGIN_STOP_SPAN)),
    st.sampled_from(("completed", "repeated_action", "no_progress")),
    st.booleans(),  # the same span sent twice in the request
)


def _stop_state(path: Path) -> dict[str, Any]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {
            "stops": con.execute(
                "SELECT run_id, span_id, counted FROM stops ORDER BY ALL"
            ).fetchall(),
            "anomalies": con.execute(
                "SELECT run_id, span_id, kind, counted FROM stop_anomalies ORDER BY ALL"
            ).fetchall(),
            "runs": con.execute(
                "SELECT run_id, stop_reason, stop_origin, duplicate_stops, sampled, sample_rule "
                "FROM runs WHERE run_id <> 'plug' ORDER BY ALL"
            ).fetchall(),
        }
    finally:
        con.close()


@settings(max_examples=30, deadline=None)
@given(requests=st.lists(st.lists(_STOP_OFFER, max_size=4), min_size=1, max_size=5))
def test_stops_grouped_or_one_by_one_are_counted_alike(
    requests: list[list[tuple[str, str, str, bool]]],
) -> None:
    """Any stops of two runs, in any requests: committing the requests in one group gives
    the rows, the counted stops and the restored totals of committing them one by one,
    and each run with a stop is counted once, by the strongest stop of the first request
    that brought it one (the rule in the module docstring, computed here independently)."""
    rank = {STOP_ORIGIN_INFERRED: 0, STOP_ORIGIN_RUN_SPAN: 1, STOP_ORIGIN_STOP_SPAN: 2}
    batches = []
    for offers in requests:
        rows: list[StopRow] = []
        for run_id, origin, reason, twice in offers:
            rows.append(stop_row(run_id, reason, origin=origin))
            if twice:
                rows.append(rows[-1])
        batches.append(rows)
    expected: dict[str, str] = {}
    for rows in batches:
        first: dict[str, StopRow] = {}
        for row in rows:
            held = first.get(row.run_id)
            if held is None or rank[row.origin] > rank[held.origin]:
                first[row.run_id] = row
        for run_id, row in first.items():
            expected.setdefault(run_id, row.span_id)

    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for grouped in (False, True):
            gate = Gate()
            config = StoreConfig(sampling=SamplingConfig(completed_fraction=0.5))
            path = Path(tmp) / f"{grouped}.duckdb"
            with Store(path, config=config, clock=Clock(), on_commit=gate) as store:
                if grouped:
                    hold_writer(store, gate)
                    futures = [store.submit(batch(*rows)) for rows in batches]
                    gate.release.set()
                    results = [f.result(timeout=30) for f in futures]
                    assert {r.group_batches for r in results} == {len(batches)}
                else:
                    results = [commit(store, batch(*rows)) for rows in batches]
                counted = [sorted(s.span_id for s in r.counted_stops) for r in results]
                totals = stop_totals(store)
            outcomes.append((counted, totals, _stop_state(path)))
    assert outcomes[0] == outcomes[1]
    counted, totals, state = outcomes[0]
    assert sorted(s for ids in counted for s in ids) == sorted(expected.values())
    assert sum(totals.values()) == len(expected)
    counted_rows = [(r, s) for r, s, c in state["stops"] if c]
    counted_rows += [(r, s) for r, s, _, c in state["anomalies"] if c]
    assert sorted(counted_rows) == sorted(expected.items())


def test_completed_fraction_is_deterministic_by_run_id(make_store: Any) -> None:
    store = make_store(sampling=SamplingConfig(completed_fraction=0.3))
    run_ids = [f"c{i}" for i in range(60)]
    for run_id in run_ids:
        commit(store, full_run(run_id, "completed"))
    page = store.reader().list_runs(limit=100)
    sampled = {r["run_id"] for r in page.items if r["sampled"]}
    assert sampled == {r for r in run_ids if run_fraction(r) < 0.3}
    assert 0 < len(sampled) < 60
    for row in page.items:
        assert row["tool_calls"] == 3
        if not row["sampled"]:
            assert row["sample_rule"] == RULE_COMPLETED_FRACTION
    unsampled = next(r for r in run_ids if r not in sampled)
    detail = store.reader().get_run(unsampled)
    assert detail is not None and detail.steps == [] and detail.stop is not None


def test_hourly_cap_per_reason_and_most_frequent_tool(make_store: Any, clock: Clock) -> None:
    store = make_store(sampling=SamplingConfig(max_full_runs_per_hour=2))
    for i in range(4):
        commit(store, full_run(f"h{i}", "repeated_action", tools=("search", "search", "fetch")))
    commit(store, full_run("h-fetch", "repeated_action", tools=("fetch", "fetch", "search")))
    commit(store, full_run("h-other-reason", "no_progress"))
    clock.now += 3600
    commit(store, full_run("h-next-hour", "repeated_action"))
    rows = {r["run_id"]: r for r in store.reader().list_runs(limit=100).items}
    assert [rows[f"h{i}"]["sampled"] for i in range(4)] == [True, True, False, False]
    assert rows["h2"]["sample_rule"] == RULE_HOURLY_CAP
    assert (rows["h-fetch"]["top_tool"], rows["h-fetch"]["sampled"]) == ("fetch", True)
    assert rows["h-other-reason"]["sampled"] is True
    assert rows["h-next-hour"]["sampled"] is True
    capped = store.reader().get_run("h3")
    assert (
        capped is not None
        and capped.steps == []
        and capped.evidence
        == {
            "repetitions": 3,
            "tool": "search",
        }
    )


def test_run_whose_stop_never_comes_is_decided_after_the_timeout(
    make_store: Any, clock: Clock
) -> None:
    store = make_store(sampling=SamplingConfig(undecided_timeout_seconds=600))
    commit(store, full_run("silent", None))
    clock.now += 300
    commit(store, full_run("active", None))
    assert store.run_maintenance().result(timeout=30) == 0
    clock.now += 301
    assert store.run_maintenance().result(timeout=30) == 1
    silent, active = store.reader().get_run("silent"), store.reader().get_run("active")
    assert silent is not None and active is not None
    assert (silent.run["sampled"], silent.run["sample_rule"]) == (True, RULE_ABNORMAL)
    assert len(silent.steps) == 6 and not any(s["staged"] for s in silent.steps)
    assert active.run["sampled"] is None and all(s["staged"] for s in active.steps)


def _span(
    trace: str, name: str, attrs: dict[str, Any], parent: str = "", start: int = 0
) -> SpanRecord:
    return SpanRecord(trace, sid(), parent, name, 1, start, start + 1, attrs)


def test_third_party_steps_go_to_the_agent_run(store: Store) -> None:
    stage = MapStage()
    trace = "ab" * 16
    agent = _span(trace, "invoke_agent bot", {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT})
    tool_attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "lookup"}
    tools = [
        _span(trace, "execute_tool lookup", tool_attrs, agent.span_id, 5 + i) for i in range(3)
    ]
    commit(store, stage.process(SpanBatch(spans=tools[:2])))
    assert store.reader().get_run(trace) is None  # pending: no run known yet
    result = commit(store, stage.process(SpanBatch(spans=[tools[2], agent])))
    assert len(result.new_span_keys) == 2
    assert store.reader().get_run(trace) is None
    detail = store.reader().get_run(agent.span_id)
    assert detail is not None
    assert (detail.run["agent"], detail.run["tool_calls"], detail.run["source"]) == (
        "bot",
        3,
        "genai",
    )
    assert (detail.run["stop_reason"], detail.run["stop_inferred"]) == ("completed", True)
    assert [s["step"] for s in detail.steps] == [1, 2, 3]
    assert detail.tools == [{"tool": "lookup", "outcome": "ok", "calls": 3}]


def test_reassignment_within_one_group_leaves_no_trace_level_run(store: Store, gate: Gate) -> None:
    stage = MapStage()
    trace = "cd" * 16
    agent = _span(trace, "invoke_agent bot", {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT})
    tool_attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "lookup"}
    tools = [
        _span(trace, "execute_tool lookup", tool_attrs, agent.span_id, 5 + i) for i in range(2)
    ]
    hold_writer(store, gate)
    first = store.submit(stage.process(SpanBatch(spans=tools)))
    second = store.submit(stage.process(SpanBatch(spans=[agent])))
    gate.release.set()
    assert second.result(timeout=30).group_batches == 2 and first.result(timeout=30)
    assert store.reader().get_run(trace) is None
    detail = store.reader().get_run(agent.span_id)
    assert detail is not None and detail.run["tool_calls"] == 2 and len(detail.steps) == 2
    assert {r["run_id"] for r in store.reader().list_runs().items} == {agent.span_id, "plug"}


def test_steps_dropped_when_the_trace_turns_out_to_be_loopwatch(store: Store) -> None:
    stage = MapStage()
    trace = trace_of("lw")
    chat = _span(trace, "chat", {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}, "00000000000000aa")
    commit(store, stage.process(SpanBatch(spans=[chat])))
    decision = _span(
        trace,
        "decide a",
        {sc.LW_EVENT: sc.EVENT_DECISION, sc.LW_RUN_ID: "lw", sc.LW_STEP: 1},
    )
    commit(store, stage.process(SpanBatch(spans=[decision])))
    assert store.reader().get_run(trace) is None
    detail = store.reader().get_run("lw")
    assert detail is not None and detail.run["decisions"] == 1


def _submit_requests(
    store: Store, gate: Gate, requests: list[MappedBatch], *, grouped: bool
) -> list[CommitResult]:
    """Commit ``requests`` one by one, or all in one group (the writer held meanwhile)."""
    if not grouped:
        return [commit(store, r) for r in requests]
    hold_writer(store, gate)
    futures = [store.submit(r) for r in requests]
    gate.release.set()
    results = [f.result(timeout=30) for f in futures]
    assert {r.group_batches for r in results} == {len(requests)}
    return results


def _counted_live(requests: list[MappedBatch], results: list[CommitResult]) -> int:
    """Tool calls the collector counts live: tool steps whose span key was new."""
    return sum(
        1
        for mapped, result in zip(requests, results, strict=True)
        for s in [*mapped.steps, *(row for row, _ in mapped.pending)]
        if s.kind == KIND_TOOL_RESULT and (s.trace_id, s.span_id) in result.new_span_keys
    )


_ONE_BY_ONE_OR_GROUPED = pytest.mark.parametrize(
    "grouped", [False, True], ids=["one by one", "one group"]
)


@_ONE_BY_ONE_OR_GROUPED
def test_a_third_party_call_dropped_from_a_loopwatch_trace_stays_counted(
    store: Store, gate: Gate, grouped: bool
) -> None:
    """A third-party tool span of a trace whose loopwatch spans come in a later request
    is counted live once, then dropped as a step, grouped or not."""
    stage = MapStage()
    trace = trace_of("lw-ext")
    ext = _span(
        trace,
        "execute_tool ext_tool",
        {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "ext_tool"},
        "00000000000000aa",
    )
    decision = _span(
        trace, "decide a", {sc.LW_EVENT: sc.EVENT_DECISION, sc.LW_RUN_ID: "lw-ext", sc.LW_STEP: 1}
    )
    requests = [stage.process(SpanBatch(spans=[ext])), stage.process(SpanBatch(spans=[decision]))]
    results = _submit_requests(store, gate, requests, grouped=grouped)
    assert _counted_live(requests, results) == 1
    assert store.reader().get_run(trace) is None


@_ONE_BY_ONE_OR_GROUPED
def test_the_cap_counts_the_tools_known_when_the_stop_came(
    make_store: Any, gate: Gate, grouped: bool
) -> None:
    """A run's stop, then its tool steps in a later request: decided with the steps
    known at its stop (none: the cap's tool is ""), also when both requests share a
    group commit (then the later request's steps were tallied, its cap key was the full
    ("repeated_action", "search") quota, and its steps were dropped)."""
    store = make_store(sampling=SamplingConfig(max_full_runs_per_hour=1))
    commit(store, full_run("fill", "repeated_action"))
    late = [step_row("late", i) for i in (1, 2)]
    requests = [batch(run_row("late"), stop_row("late", "repeated_action")), batch(*late)]
    _submit_requests(store, gate, requests, grouped=grouped)
    detail = store.reader().get_run("late")
    assert detail is not None
    assert (detail.run["sampled"], detail.run["sample_rule"], detail.run["sample_tool"]) == (
        True,
        RULE_ABNORMAL,
        "",
    )
    assert len(detail.steps) == 2


def test_calls_moved_to_the_agent_run_are_tallied_once(store: Store) -> None:
    """Two tool_a calls stored under the trace, then the agent span with three tool_b
    calls: the cap's tool is tool_b. The moved calls were tallied twice (from the move
    and again from the staged rows), so tool_a won with 4."""
    stage = MapStage()
    trace = "ef" * 16
    agent = _span(trace, "invoke_agent bot", {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT})

    def call(tool: str, start: int) -> SpanRecord:
        attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: tool}
        return _span(trace, f"execute_tool {tool}", attrs, agent.span_id, start)

    commit(store, stage.process(SpanBatch(spans=[call("tool_a", 5), call("tool_a", 6)])))
    second = [call("tool_b", 7 + i) for i in range(3)] + [agent]
    commit(store, stage.process(SpanBatch(spans=second)))
    detail = store.reader().get_run(agent.span_id)
    assert detail is not None
    assert (detail.run["tool_calls"], detail.run["top_tool"]) == (5, "tool_b")
    assert detail.run["sample_tool"] == "tool_b"


def test_canary_flag_by_run_or_trace_id(store: Store) -> None:
    commit(store, full_run("flag-run", "completed"))
    commit(store, full_run("flag-trace", "completed"))
    commit(store, full_run("clean", "completed"))
    commit(store, batch(canaries=frozenset({"flag-run", trace_of("flag-trace")})))
    flagged = store.reader().list_runs(canary=True).items
    assert {r["run_id"] for r in flagged} == {"flag-run", "flag-trace"}
    assert [r["run_id"] for r in store.reader().list_runs(canary=False).items] == ["clean"]


def test_failing_batch_fails_alone(store: Store, gate: Gate) -> None:
    hold_writer(store, gate)
    good = store.submit(full_run("ok1", None))
    bad_step = dataclasses.replace(step_row("bad", 1), kind=None)  # type: ignore[arg-type]
    bad = store.submit(batch(bad_step))
    also_good = store.submit(full_run("ok2", None))
    gate.release.set()
    assert len(good.result(timeout=30).new_span_keys) == 7
    assert len(also_good.result(timeout=30).new_span_keys) == 7
    with pytest.raises(StoreError):
        bad.result(timeout=30)
    assert store.reader().get_run("bad") is None


def test_close_drains_the_queue_and_refuses_new_batches(make_store: Any) -> None:
    store = make_store()
    futures = [store.submit(full_run(f"c{i}", "cancelled")) for i in range(20)]
    store.close()
    assert all(f.result(timeout=0).spans == 8 for f in futures)
    with pytest.raises(StoreClosed):
        store.submit(full_run("late", None))
    reader = StoreReader.open_readonly(store.path)
    try:
        assert len(reader.list_runs(limit=50).items) == 20
    finally:
        reader.close()


def test_older_schema_is_migrated_at_open(tmp_path: Path) -> None:
    path = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target=1) == 1
    con.execute(
        "INSERT INTO runs (run_key, run_id, trace_id, source, agent, first_seen_unix_nano, "
        "last_seen_unix_nano) VALUES (?, 'old', ?, 'loopwatch', 'legacy', 1, 1)",
        [_run_key("old"), trace_of("old")],
    )
    con.execute("INSERT INTO run_tools VALUES (?, 'search', 'ok', 2)", [_run_key("old")])
    con.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 21
        # A v1 count row has no agent of its own: it is restored under the run's.
        assert tool_call_totals(store) == {("legacy", "search", "ok"): 2}
        commit(store, batch(stop_row("old", "completed"), stop_row("old", "error")))
        detail = store.reader().get_run("old")
        assert detail is not None
        assert (detail.run["agent"], detail.run["duplicate_stops"]) == ("legacy", 1)
    con = duckdb.connect(str(path), read_only=True)
    versions = con.execute("SELECT version FROM schema_version ORDER BY 1").fetchall()
    con.close()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def _run_rows(store: Store, *run_ids: str) -> dict[str, int]:
    rows, _ = store.reader()._query(
        "SELECT run_id, count(*) AS n FROM runs WHERE run_id IN (SELECT unnest(?)) GROUP BY 1",
        [list(run_ids)],
    )
    return {r["run_id"]: int(r["n"]) for r in rows}


@pytest.mark.parametrize(
    "elapsed_s",
    [1, 119, 121, 1799, 1801, 7 * 86400, -3600],
    ids=["1s", "119s", "121s", "1799s", "1801s", "7d", "clock_back_1h"],
)
def test_a_later_span_finds_its_run_in_any_tier_and_leaves_one_row(
    make_store: Any, clock: Clock, elapsed_s: int
) -> None:
    """``runs`` has no key index (schema 21): the writer looks a run up in tiers of
    ``last_seen_unix_nano`` (two minutes, half an hour, then everything) and deletes it
    bounded by the oldest row it read. Whichever tier holds the run, and when the clock
    went back, the later span merges into the one row: no duplicate, counts add up. The
    group also holds a run written just now, so its delete bound is the older row's."""
    store = make_store()
    commit(store, batch(run_row("old"), step_row("old", 1)))
    clock.now += elapsed_s
    commit(store, batch(run_row("new"), step_row("new", 1)))
    commit(store, batch(step_row("old", 2), step_row("new", 2), stop_row("old", "completed")))
    assert _run_rows(store, "old", "new") == {"old": 1, "new": 1}
    old, new = store.reader().get_run("old"), store.reader().get_run("new")
    assert old is not None and new is not None
    assert (old.run["tool_calls"], old.run["stop_reason"]) == (2, "completed")
    assert new.run["tool_calls"] == 2
    seen, _ = store.reader()._query(
        "SELECT last_seen_unix_nano AS t FROM runs WHERE run_id = 'old'", []
    )
    assert seen == [{"t": int(clock.now * NS)}]


def test_schema_21_drops_the_runs_key_and_keeps_rows_defaults_and_not_nulls(
    tmp_path: Path,
) -> None:
    """Migration 21 rebuilds ``runs`` without its primary key (the ART index grew with
    every stored run): rows, NOT NULL columns and zero defaults stay; the writer then
    updates a migrated run in place."""
    path = tmp_path / "v20.duckdb"
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target=20) == 20
    con.execute(
        "INSERT INTO runs (run_key, run_id, trace_id, source, first_seen_unix_nano, "
        "last_seen_unix_nano) VALUES (?, 'a', ?, 'loopwatch', 1, 1)",
        [_run_key("a"), trace_of("a")],
    )
    con.close()
    with Store(path, config=StoreConfig(sampling=SamplingConfig(completed_fraction=1.0))) as store:
        assert store.schema_version == 21
        commit(store, batch(step_row("a", 1), stop_row("a", "completed")))
        assert _run_rows(store, "a") == {"a": 1}
        detail = store.reader().get_run("a")
        assert detail is not None
        assert (detail.run["tool_calls"], detail.run["stop_reason"]) == (1, "completed")
    con = duckdb.connect(str(path))
    keys = con.execute(
        "SELECT constraint_type FROM duckdb_constraints() WHERE table_name = 'runs' "
        "AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')"
    ).fetchall()
    assert keys == []
    with pytest.raises(duckdb.ConstraintException):
        con.execute(
            "INSERT INTO runs (run_key, run_id, trace_id, source) VALUES (1, 'b', 't', 's')"
        )
    con.execute(
        "INSERT INTO runs (run_key, run_id, trace_id, source, first_seen_unix_nano, "
        "last_seen_unix_nano) VALUES (1, 'b', 't', 's', 1, 1)"
    )
    defaults = con.execute(
        "SELECT steps, decisions, tool_calls, tool_errors, tool_blocked, tokens, "
        "duplicate_stops FROM runs WHERE run_id = 'b'"
    ).fetchall()
    con.close()
    assert defaults == [(0, 0, 0, 0, 0, 0, 0)]


@pytest.mark.parametrize(
    ("version", "rows"),
    [
        ("1.5.5", 122_880),
        ("1.5.6rc1", 122_880),
        ("1.5.6.dev3", 122_880),
        ("1.5", 122_880),
        ("dev", 122_880),
        ("1.5.6", 16_384),
        ("1.5.6.post1", 16_384),
        ("1.6.0.dev12", 16_384),
        ("1.10.0", 16_384),
        ("2.0.1", 16_384),
    ],
)
def test_the_row_group_size_is_small_only_where_duckdb_holds_it(version: str, rows: int) -> None:
    """16,384-row groups bound what one vacuum merge rewrites; DuckDB 1.5.5 kept an
    unevictable block per row group filled by appends, so it keeps its own 122,880."""
    assert default_row_group_rows(version) == rows


@pytest.mark.parametrize("rows", [0, 1000, 2049, 122_880 + 2048, True, 4096.0])
def test_a_row_group_size_off_duckdbs_vectors_is_refused(rows: Any) -> None:
    with pytest.raises(ValueError, match="row_group_rows"):
        StoreConfig(row_group_rows=rows).validate()


def test_the_writer_appends_row_groups_of_its_size_and_spills_beside_the_file(
    tmp_path: Path,
) -> None:
    """The file is attached with ``ROW_GROUP_SIZE``: after a checkpoint, no row group
    holds more than ``row_group_rows`` rows (the file keeps no size of its own: reopened
    with DuckDB's default, it reads the same rows). Every cursor reads the file's tables
    by their plain names, and DuckDB spills to ``<db>.tmp``, an opened file's default."""
    path = tmp_path / "lw.duckdb"
    config = StoreConfig(row_group_rows=2048)
    with Store(path, config=config) as store:
        for start in range(0, 5000, 1000):
            commit(store, batch(*(run_row(f"run-{i}") for i in range(start, start + 1000))))
        cursor = store.read_cursor()
        try:
            assert cursor.execute("SELECT count(*) FROM runs").fetchone() == (5000,)
            assert cursor.execute("SELECT current_setting('temp_directory')").fetchone() == (
                f"{path}.tmp",
            )
        finally:
            cursor.close()
    con = duckdb.connect(str(path), read_only=True)
    try:
        groups = con.execute(
            "SELECT row_group_id, sum(count) FROM pragma_storage_info('runs') "
            "WHERE column_path = '[0]' GROUP BY ALL"
        ).fetchall()
        assert sum(int(n) for _, n in groups) == 5000
        assert len(groups) >= 3 and max(int(n) for _, n in groups) <= 2048
    finally:
        con.close()


def test_tool_counts_keep_their_agent_when_the_run_span_comes_later(tmp_path: Path) -> None:
    """Restored tool-call totals use the label the live counter used: the tool span's own
    agent, even when the run span (the run row's agent) arrives after a restart."""
    first, second = step_row("r1", 1), step_row("r1", 2, outcome=sc.OUTCOME_ERROR)
    first.agent = second.agent = "orders"
    path = tmp_path / "lw.duckdb"
    with Store(path) as store:
        commit(store, batch(first, second))
        counts = tool_call_totals(store)
        assert counts == {("orders", "search", "ok"): 1, ("orders", "search", "error"): 1}
    with Store(path) as store:  # a restart; then the run span, under another name
        commit(store, batch(run_row("r1", agent="renamed"), step_row("r1", 3)))
        counts = tool_call_totals(store)
    assert counts == {
        ("orders", "search", "ok"): 1,
        ("orders", "search", "error"): 1,
        ("renamed", "search", "ok"): 1,  # a step without an agent of its own: the run's
    }


def test_pending_steps_survive_a_restart_and_go_to_their_agent_run(tmp_path: Path) -> None:
    """Third-party steps acknowledged before their agent span are pending: stored (not
    counted), taken back by the map stage after a restart, released to the agent run."""
    path = tmp_path / "pending.duckdb"
    trace = "ee" * 16
    agent = _span(trace, "invoke_agent bot", {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT})
    tool_attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "lookup"}
    tools = [
        _span(trace, "execute_tool lookup", tool_attrs, agent.span_id, 5 + i) for i in range(2)
    ]
    with Store(path) as store:
        first = MapStage().process(SpanBatch(spans=tools))
        assert len(first.pending) == 2 and not first.steps
        assert len(commit(store, first).new_span_keys) == 2
        assert store.reader().get_run(trace) is None
    with Store(path) as store:
        stage = MapStage()
        assert not stage.restore(store.pending_at_open).steps
        commit(store, stage.process(SpanBatch(spans=[agent])))
        detail = store.reader().get_run(agent.span_id)
        assert detail is not None and detail.run["tool_calls"] == 2
        assert detail.run["steps"] == 2
        assert store.reader().get_run(trace) is None
    con = duckdb.connect(str(path))
    assert con.execute("SELECT count(*) FROM pending_steps").fetchall() == [(0,)]
    con.close()


def test_schema_7_moves_observe_evidence_out_of_a_completed_stop(tmp_path: Path) -> None:
    """Schema 6 stored observe mode's would-be evidence as a completed run's evidence;
    migration 7 moves it to ``observe_evidence`` and leaves other stops alone."""
    path = tmp_path / "v6.duckdb"
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target=6) == 6
    would_be = '{"detector":"repeated_action","scope":"run","tool":"lookup_order"}'
    rows = [
        ("obs", "completed", "repeated_action", would_be),  # written by schema-6 code
        ("loop", "repeated_action", None, would_be),  # a real loop stop keeps its own
        ("budget", "budget_exhausted", "repeated_action", '{"scope":"run"}'),
        # Evidence is client text: not JSON, or a tool that is not a string.
        ("garbled", "completed", "repeated_action", "not json {"),
        ("bad_loop", "repeated_action", None, "search x3"),
        ("number", "action_cycle", None, '{"tool": 5}'),
    ]
    for run_id, reason, observed, evidence in rows:
        con.execute(
            "INSERT INTO stops (run_key, run_id, trace_id, span_id, source, origin, "
            "stop_inferred, reason, time_unix_nano, evidence, observe_reason, "
            "received_unix_nano) VALUES (?, ?, ?, ?, 'loopwatch', 'stop_span', false, ?, 1, "
            "?, ?, 1)",
            [_run_key(run_id), run_id, trace_of(run_id), sid(), reason, evidence, observed],
        )
    con.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
    con = duckdb.connect(str(path), read_only=True)
    got = {
        run_id: (evidence, observed, tool)
        for run_id, evidence, observed, tool in con.execute(
            "SELECT run_id, evidence, observe_evidence, loop_tool FROM stops"
        ).fetchall()
    }
    con.close()
    assert got == {
        "obs": (None, would_be, "lookup_order"),
        "loop": (would_be, None, "lookup_order"),
        "budget": ('{"scope":"run"}', None, None),
        "garbled": ("not json {", None, None),
        "bad_loop": ("search x3", None, None),
        "number": ('{"tool": 5}', None, None),
    }


def test_schema_9_keeps_the_stop_totals_restored_before(tmp_path: Path) -> None:
    """Schema 8 restored every primary stop and no anomaly; after migration 9 the same
    rows are the counted ones, and a stronger stop arriving later changes the stop shown,
    not the totals."""
    path = tmp_path / "v8.duckdb"
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target=8) == 8
    stop_sql = (
        "INSERT INTO {table} (run_key, run_id, trace_id, span_id, source, origin, "
        "stop_inferred, reason, time_unix_nano, received_unix_nano, agent{kind}) "
        "VALUES (?, ?, ?, ?, 'loopwatch', ?, ?, ?, 1, 1, 'legacy'{value})"
    )
    for run_id, origin, reason in (
        ("a", "run_span", "repeated_action"),
        ("b", "inferred", "completed"),
    ):
        con.execute(
            "INSERT INTO runs (run_key, run_id, trace_id, source, agent, first_seen_unix_nano, "
            "last_seen_unix_nano, stop_reason, stop_origin, stop_inferred, stop_unix_nano, "
            "sampled) VALUES (?, ?, ?, 'loopwatch', 'legacy', 1, 1, ?, ?, ?, 1, true)",
            [_run_key(run_id), run_id, trace_of(run_id), reason, origin, origin == "inferred"],
        )
        con.execute(
            stop_sql.format(table="stops", kind="", value=""),
            [
                _run_key(run_id),
                run_id,
                trace_of(run_id),
                sid(),
                origin,
                origin == "inferred",
                reason,
            ],
        )
    con.execute(
        stop_sql.format(table="stop_anomalies", kind=", kind", value=", 'duplicate_stop'"),
        [_run_key("a"), "a", trace_of("a"), sid(), "run_span", False, "no_progress"],
    )
    con.close()
    with Store(path) as store:
        before = stop_totals(store)
        assert before == {("legacy", "repeated_action"): 1, ("legacy", "completed"): 1}
        late = stop_row("b", "action_cycle", origin=STOP_ORIGIN_STOP_SPAN)
        result = commit(store, batch(late))
        assert result.counted_stops == ()
        assert stop_totals(store) == before
        detail = store.reader().get_run("b")
        assert detail is not None and detail.stop is not None
        assert detail.stop["reason"] == "action_cycle"
        assert [(a["reason"], a["kind"]) for a in detail.stop_anomalies] == [
            ("completed", "replaced_stop")
        ]
    con = duckdb.connect(str(path), read_only=True)
    nullable = con.execute(
        "SELECT table_name, is_nullable FROM information_schema.columns "
        "WHERE column_name = 'counted' AND table_name IN (SELECT table_name FROM "
        "information_schema.tables WHERE table_type = 'BASE TABLE') ORDER BY 1"
    ).fetchall()
    con.close()
    assert nullable == [("stop_duplicates", "NO"), ("stop_reports", "NO")]


def test_schema_17_keeps_every_stop_and_chooses_the_primary_when_read(tmp_path: Path) -> None:
    """Migration 17 keeps schema 16's stops and anomalies as they read; a stronger stop
    arriving later is added beside the stored one (no committed row moves or goes), and
    the views show it as the run's stop and the stored one as replaced."""
    path = tmp_path / "v16.duckdb"
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target=16) == 16
    key = _run_key("a")
    con.execute(
        "INSERT INTO runs (run_key, run_id, trace_id, source, first_seen_unix_nano, "
        "last_seen_unix_nano, stop_reason, stop_origin, stop_inferred, stop_unix_nano, "
        "sampled) VALUES (?, 'a', ?, 'loopwatch', 1, 1, 'completed', 'inferred', true, 1, true)",
        [key, trace_of("a")],
    )
    stop_sql = (
        "INSERT INTO {table} (run_key, run_id, trace_id, span_id, source, origin, "
        "stop_inferred, reason, time_unix_nano, received_unix_nano, counted{kind}) "
        "VALUES (?, 'a', ?, ?, 'loopwatch', 'inferred', true, ?, 1, ?, {counted}{value})"
    )
    con.execute(
        stop_sql.format(table="stops", kind="", value="", counted="true"),
        [key, trace_of("a"), "s1", "completed", 2],
    )
    con.execute(
        stop_sql.format(
            table="stop_anomalies", kind=", kind", value=", 'duplicate_stop'", counted="false"
        ),
        [key, trace_of("a"), "s2", "error", 3],
    )
    con.close()
    with Store(path) as store:
        detail = store.reader().get_run("a")
        assert detail is not None and detail.stop is not None
        assert detail.stop["span_id"] == "s1"
        assert [a["kind"] for a in detail.stop_anomalies] == ["duplicate_stop"]
        late = stop_row("a", "action_cycle", origin=STOP_ORIGIN_STOP_SPAN)
        assert commit(store, batch(late)).counted_stops == ()
        detail = store.reader().get_run("a")
        assert detail is not None and detail.stop is not None
        assert detail.stop["span_id"] == late.span_id
        assert [(a["span_id"], a["kind"]) for a in detail.stop_anomalies] == [
            ("s1", "replaced_stop"),
            ("s2", "duplicate_stop"),
        ]
    con = duckdb.connect(str(path), read_only=True)
    reports = con.execute(
        "SELECT span_id, counted FROM stop_reports ORDER BY received_unix_nano"
    ).fetchall()
    con.close()
    assert reports == [("s1", True), (late.span_id, False)]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.duckdb"
    con = duckdb.connect(str(path))
    apply_migrations(con)
    con.execute("INSERT INTO schema_version VALUES (99, 'from the future', 0)")
    con.close()
    with pytest.raises(SchemaTooNew) as info:
        Store(path)
    assert (info.value.found, info.value.supported) == (99, SCHEMA_VERSION)


@pytest.fixture
def browse_store(make_store: Any) -> Store:
    store: Store = make_store(sampling=SamplingConfig(completed_fraction=0.0))
    runs = [
        ("b1", "repeated_action", "alpha", ("search", "search"), 1 * NS),
        ("b2", "completed", "alpha", ("fetch",), 2 * NS),
        ("b3", "repeated_action", "beta", ("fetch", "fetch"), 3 * NS),
        ("b4", "budget_exhausted", "beta", ("search",), 3601 * NS),
        ("b5", "no_progress", "alpha", ("search", "fetch", "fetch"), 3602 * NS),
    ]
    for run_id, reason, agent, tools, stop_ns in runs:
        commit(store, full_run(run_id, reason, tools=tools, agent=agent, stop_ns=stop_ns))
    commit(store, batch(canaries=frozenset({"b3"})))
    return store


FILTER_CASES: list[tuple[dict[str, Any], list[str]]] = [
    ({}, ["b5", "b4", "b3", "b2", "b1"]),
    ({"stop_reason": "repeated_action"}, ["b3", "b1"]),
    ({"agent": "beta"}, ["b4", "b3"]),
    ({"tool": "fetch"}, ["b5", "b3", "b2"]),
    ({"since_unix_nano": 2 * NS, "until_unix_nano": 3601 * NS}, ["b3", "b2"]),
    ({"canary": True}, ["b3"]),
    ({"sampled": False}, ["b2"]),
    ({"agent": "alpha", "tool": "search", "sampled": True}, ["b5", "b1"]),
    ({"stop_reason": "refused"}, []),
]


@pytest.mark.parametrize(("filters", "expected"), FILTER_CASES)
def test_list_runs_filters(
    browse_store: Store, filters: dict[str, Any], expected: list[str]
) -> None:
    page = browse_store.reader().list_runs(**filters)
    assert [r["run_id"] for r in page.items] == expected
    assert page.next_offset is None


def test_list_runs_paging(browse_store: Store) -> None:
    reader = browse_store.reader()
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = reader.list_runs(limit=2, offset=offset)
        seen += [r["run_id"] for r in page.items]
        offset = page.next_offset
    assert seen == ["b5", "b4", "b3", "b2", "b1"]
    with pytest.raises(ValueError):
        reader.list_runs(limit=0)
    with pytest.raises(ValueError):
        reader.list_runs(offset=-1)


def test_stats_and_stored_totals(browse_store: Store) -> None:
    stats = browse_store.reader().stats(
        since_unix_nano=0, until_unix_nano=7200 * NS, bucket_seconds=3600
    )
    assert stats.stops_by_reason == [
        {"bucket_unix_nano": 0, "stop_reason": "completed", "stops": 1},
        {"bucket_unix_nano": 0, "stop_reason": "repeated_action", "stops": 2},
        {"bucket_unix_nano": 3600 * NS, "stop_reason": "budget_exhausted", "stops": 1},
        {"bucket_unix_nano": 3600 * NS, "stop_reason": "no_progress", "stops": 1},
    ]
    # By the tool the detection named (the loopwatch_loop_detections_total label).
    assert stats.loops_by_tool == [
        {"tool": "", "stop_reason": "no_progress", "stops": 1},
        {"tool": "fetch", "stop_reason": "repeated_action", "stops": 1},
        {"tool": "search", "stop_reason": "repeated_action", "stops": 1},
    ]
    assert not stats.truncated
    assert stop_totals(browse_store) == {
        ("alpha", "repeated_action"): 1,
        ("alpha", "completed"): 1,
        ("alpha", "no_progress"): 1,
        ("beta", "repeated_action"): 1,
        ("beta", "budget_exhausted"): 1,
    }
    assert tool_call_totals(browse_store) == {
        ("alpha", "search", "ok"): 3,
        ("alpha", "fetch", "ok"): 3,
        ("beta", "fetch", "ok"): 2,
        ("beta", "search", "ok"): 1,
    }
    with pytest.raises(ValueError):
        browse_store.reader().stats(since_unix_nano=5, until_unix_nano=5)


def test_row_cap_keeps_the_last_steps(make_store: Any) -> None:
    store = make_store(read_max_rows=3)
    commit(store, full_run("long", "repeated_action"))
    detail = store.reader().get_run("long")
    assert detail is not None and detail.steps_truncated
    assert [(s["step"], s["kind"]) for s in detail.steps] == [
        (2, KIND_TOOL_RESULT),
        (3, KIND_DECISION),
        (3, KIND_TOOL_RESULT),
    ]


def test_read_time_limit_interrupts_the_query(store: Store) -> None:
    reader = StoreReader(store.reader()._factory, timeout_seconds=0.2, max_rows=10)
    with pytest.raises(ReadTimeout) as info:
        reader._query(
            "SELECT count(*) FROM range(100000000) a, range(1000) b WHERE a.range + b.range = ?",
            [-1],
        )
    assert info.value.timeout_seconds == 0.2
    assert reader.list_runs(limit=5).items == []


@pytest.mark.parametrize(
    "config",
    [
        StoreConfig(max_queue_spans=0),
        StoreConfig(read_timeout_seconds=0),
        StoreConfig(dedup_retention_seconds=float("inf")),
        StoreConfig(sampling=SamplingConfig(completed_fraction=1.5)),
        StoreConfig(sampling=SamplingConfig(max_full_runs_per_hour=0)),
        StoreConfig(sampling=SamplingConfig(undecided_timeout_seconds=0)),
        StoreConfig(retention_seconds=-1),
        StoreConfig(retention_seconds=float("nan")),
        StoreConfig(retention_seconds=True),
        StoreConfig(prune_max_runs=0),
    ],
)
def test_invalid_config_fails_at_construction(tmp_path: Path, config: StoreConfig) -> None:
    with pytest.raises(ValueError):
        Store(tmp_path / "x.duckdb", config=config)


def test_dedup_keys_expire_after_retention(make_store: Any, clock: Clock) -> None:
    store = make_store(dedup_retention_seconds=60)
    mapped = batch(step_row("exp", 1))
    commit(store, mapped)
    clock.now += 61
    store.run_maintenance().result(timeout=30)
    assert len(commit(store, mapped).new_span_keys) == 1


def test_dedup_survives_a_restart_and_the_v3_migration(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "v3.duckdb"
    con = duckdb.connect(str(path))
    apply_migrations(con, target=3)
    old = step_row("v3", 1)
    span_key, trace_key = int(old.span_id, 16), int(old.trace_id[-16:], 16)
    con.execute("INSERT INTO spans_seen VALUES (?, ?, ?)", [span_key, trace_key, int(T0 * NS)])
    con.close()
    mapped = full_run("r1", None)
    with Store(path, clock=clock) as store:
        assert commit(store, batch(old)).duplicates == 1
        assert len(commit(store, mapped).new_span_keys) == 7
    with Store(path, clock=clock) as store:
        assert commit(store, mapped).duplicates == 7
        clock.now += 3_601
        store.run_maintenance().result(timeout=30)
        assert len(commit(store, mapped).new_span_keys) == 7


def test_dedup_window_past_its_key_cap_forgets_the_oldest(make_store: Any, clock: Clock) -> None:
    store = make_store(dedup_max_keys=8, dedup_retention_seconds=160)
    first = full_run("c1", None)
    commit(store, first)
    clock.now += 20
    commit(store, full_run("c2", None))
    assert len(commit(store, first).new_span_keys) == 7


def test_keys_of_a_failed_batch_are_not_remembered(store: Store) -> None:
    good = step_row("f1", 1)
    bad = dataclasses.replace(step_row("f1", 2), kind=None)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        store.submit(batch(good, bad)).result(timeout=30)
    assert len(commit(store, batch(good)).new_span_keys) == 1


def test_writer_checkpoints_between_groups_past_the_log_threshold(make_store: Any) -> None:
    store = make_store(checkpoint_wal_bytes=1)
    wal = Path(f"{store.path}.wal")
    commit(store, full_run("w1", None))
    deadline = time.monotonic() + 30
    while wal.exists() and wal.stat().st_size > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not wal.exists() or wal.stat().st_size == 0
    detail = store.reader().get_run("w1")
    assert detail is not None and detail.run["tool_calls"] == 3


def test_future_type(store: Store) -> None:
    future = store.submit(batch())
    assert isinstance(future, Future)
    assert future.result(timeout=30).spans == 0


SAMPLER_CASES = [
    ("repeated_action", 0.0, 0, (True, RULE_ABNORMAL)),
    ("repeated_action", 0.0, 2, (False, RULE_HOURLY_CAP)),
    (None, 0.0, 0, (True, RULE_ABNORMAL)),
    ("completed", 1.0, 0, (True, "completed_sampled")),
    ("completed", 1.0, 2, (False, RULE_HOURLY_CAP)),
    ("completed", 0.0, 0, (False, RULE_COMPLETED_FRACTION)),
]


@pytest.mark.parametrize(("reason", "fraction", "kept", "expected"), SAMPLER_CASES)
def test_sampler_rule(
    reason: str | None, fraction: float, kept: int, expected: tuple[bool, str]
) -> None:
    sampler = Sampler(SamplingConfig(completed_fraction=fraction, max_full_runs_per_hour=2))
    decision = sampler.decide(run_id="r", stop_reason=reason, kept_this_hour=kept)
    assert (decision.sampled, decision.rule) == expected
    assert decision.quota_reason == (reason or "no_stop")


def test_staged_steps_are_deleted_when_the_run_is_not_sampled(make_store: Any) -> None:
    store = make_store(sampling=SamplingConfig(completed_fraction=0.0))
    commit(store, full_run("gone", None))
    commit(store, batch(stop_row("gone", "completed")))
    detail = store.reader().get_run("gone")
    assert detail is not None and detail.steps == []
    assert (detail.run["sampled"], detail.run["tool_calls"]) == (False, 3)
    assert detail.run["sample_tool"] == "search"


def test_stop_and_stop_anomaly_rows_keep_every_field(tmp_path: Path) -> None:
    """Every StopRow field lands in its own column, in ``stops`` and, for a duplicate
    stop, in ``stop_anomalies`` (columns added by migrations sit after
    ``received_unix_nano`` and ``kind``)."""
    full = dataclasses.replace(
        stop_row("r1", "repeated_action"),
        dimension="tool_attempts",
        limit_value=3.0,
        observed=4.0,
        basis="observed",
        message="same call",
        steps_since_progress=2,
        usage_model_turns=5,
        usage_tool_attempts=4,
        usage_tool_successes=3,
        usage_tokens=900,
        usage_cost_usd=0.25,
        usage_elapsed_seconds=1.5,
        observe_reason="no_progress",
        observe_step=2,
        observe_evidence='{"detector":"no_progress"}',
        agent="orders",
    )
    twin = dataclasses.replace(full, span_id=sid(), message="again", agent="orders-2")
    with Store(tmp_path / "lw.duckdb") as store:
        commit(store, batch(run_row("r1"), full, twin))
        detail = store.reader().get_run("r1")
    assert detail is not None and detail.stop is not None
    fields = [f.name for f in dataclasses.fields(StopRow)]
    for stored, row in ((detail.stop, full), (detail.stop_anomalies[0], twin)):
        for name in fields:
            if name in stored:
                assert stored[name] == getattr(row, name), name
        assert stored["stop_inferred"] is False
    assert detail.stop_anomalies[0]["kind"] == "duplicate_stop"
    assert {"agent", "observe_evidence", "usage_cost_usd"} <= set(detail.stop)


def test_run_lookups_are_skipped_only_for_runs_never_stored(tmp_path: Path) -> None:
    """The writer reads existing run rows only for keys its run-key filter may hold:
    a new run costs no lookup, and a run stored earlier (before a restart too) is still
    found and merged into its one row."""
    path = tmp_path / "lw.duckdb"
    with Store(path) as store:
        commit(store, batch(run_row("early"), step_row("early", 1)))
    with Store(path) as store:  # the filter is refilled from the file
        lookups: list[str] = []
        fetch = store._writer.fetch_runs

        def counted(where: str, params: Any = ()) -> list[dict[str, Any]]:
            lookups.append(where)
            return fetch(where, params)

        store._writer.fetch_runs = counted  # type: ignore[method-assign]
        commit(store, full_run("fresh", "completed"))
        assert lookups == []
        commit(store, batch(step_row("early", 2), step_row("fresh", 9)))
        assert len(lookups) == 1
        assert str(_run_key("early")) in lookups[0] and str(_run_key("fresh")) in lookups[0]
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute("SELECT run_id, count(*) FROM runs GROUP BY run_id").fetchall()
    assert sorted(rows) == [("early", 1), ("fresh", 1)]
    with Store(path) as store:
        early = store.reader().get_run("early")
        assert early is not None and early.run["tool_calls"] == 2


# ----------------------------------------------------------------------------- retention

_RUN_TABLES = ("runs", "steps", "staged_steps", "stops", "stop_anomalies", "run_tools")


def _rows_naming(path: Path, run_ids: list[str]) -> dict[str, int]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        keys = [_run_key(r) for r in run_ids]
        names = run_ids + [trace_of(r) for r in run_ids]
        out = {
            table: con.execute(
                f"SELECT count(*) FROM {table} WHERE list_contains(?, run_key)", [keys]
            ).fetchone()[0]
            for table in _RUN_TABLES
        }
        out["canary_flags"] = con.execute(
            "SELECT count(*) FROM canary_flags WHERE list_contains(?, run_id)", [names]
        ).fetchone()[0]
        return out
    finally:
        con.close()


def test_retention_removes_old_runs_with_every_row_naming_them(
    tmp_path: Path, clock: Clock
) -> None:
    """Runs last seen before the retention go with every row naming them, through more
    passes and a restart; newer runs stay whole."""
    path = tmp_path / "lw.duckdb"
    day = 86_400
    config = StoreConfig(
        sampling=SamplingConfig(completed_fraction=1.0, undecided_timeout_seconds=600),
        retention_seconds=day,
    )
    old = ["loop", "done", "replaced", "undecided", "canary", "garbled"]
    with Store(path, config=config, clock=clock) as store:
        commit(store, full_run("loop", "repeated_action", agent="alpha"))
        done = full_run("done", "completed", agent="beta", tools=("fetch",))
        commit(store, done)
        # Evidence is client text: a stop whose evidence is not JSON is removed too.
        garbled = stop_row("garbled", "repeated_action")
        garbled.evidence = "search x3"
        commit(store, batch(run_row("garbled"), garbled))
        # Counted as inferred "completed"; the stop span replaces it, the count stays.
        commit(
            store,
            batch(
                run_row("replaced"), stop_row("replaced", "completed", origin=STOP_ORIGIN_INFERRED)
            ),
        )
        commit(store, batch(stop_row("replaced", "action_cycle")))
        commit(store, batch(run_row("undecided"), step_row("undecided", 1)))
        flagged = full_run("canary", "no_progress", agent="alpha")
        flagged.canary_run_ids = frozenset({trace_of("canary")})
        commit(store, flagged)
        clock.now += day / 2
        # A retry of "done", all duplicates, flagged this time: a flag newer than its run.
        done.canary_run_ids = frozenset({"done"})
        assert commit(store, done).duplicates == done.spans_in
        fresh = full_run("fresh", "repeated_action", agent="alpha")
        fresh.canary_run_ids = frozenset({"fresh"})
        commit(store, fresh)
        assert sum(stop_totals(store).values()) == 6  # "undecided" has no stop

        clock.now += day / 2 + 1
        store.run_maintenance().result(timeout=30)
        assert store.pruned_runs == len(old)
        assert sum(stop_totals(store).values()) == 1  # "fresh"
        assert store.reader().get_run("loop") is None
        kept = store.reader().get_run("fresh")
        assert kept is not None and len(kept.steps) == 6 and kept.stop is not None
        flagged_now = store.reader().list_runs(canary=True).items
        assert [r["run_id"] for r in flagged_now] == ["fresh"]

        store.run_maintenance().result(timeout=30)  # nothing more is due
        assert store.pruned_runs == len(old)
    rows = _rows_naming(path, old)
    assert {t: rows[t] for t in (*_RUN_TABLES, "canary_flags")} == dict.fromkeys(
        (*_RUN_TABLES, "canary_flags"), 0
    )
    assert _rows_naming(path, ["fresh"])["runs"] == 1

    with Store(path, config=config, clock=clock) as store:
        clock.now += day + 1  # now "fresh" goes too
        store.run_maintenance().result(timeout=30)
        assert store.pruned_runs == 1 and stop_totals(store) == {}
        # A late span of a removed run starts a new run row (counted as new).
        commit(store, batch(step_row("loop", 9)))
        late = store.reader().get_run("loop")
        assert late is not None and late.run["tool_calls"] == 1


def test_retention_removes_a_backlog_in_bounded_passes(make_store: Any, clock: Clock) -> None:
    store = make_store(retention_seconds=60, prune_max_runs=2)
    for i in range(5):
        commit(store, full_run(f"r{i}", "completed"))
    clock.now += 61
    store.run_maintenance().result(timeout=30)
    deadline = time.monotonic() + 20
    while store.pruned_runs < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.pruned_runs == 5
    assert store.reader().list_runs().items == []


def test_retention_off_keeps_everything(make_store: Any, clock: Clock) -> None:
    store = make_store()
    commit(store, full_run("r1", "completed"))
    clock.now += 10 * 365 * 86_400
    store.run_maintenance().result(timeout=30)
    assert store.pruned_runs == 0 and store.reader().get_run("r1") is not None


@pytest.mark.parametrize("mode", ["one by one", "one group", "last two grouped"])
def test_a_move_after_the_stop_does_not_change_the_cap_tool(
    make_store: Any, gate: Gate, mode: str
) -> None:
    """One third-party trace: two alpha calls under a span not yet known (filed under the
    trace), then agent A with a beta call (A's stop is inferred: decided on {beta: 1}),
    then the missing span, which moves the alpha calls to A, after A's stop. In a group
    the moved calls were tallied for A's decision ({alpha: 2, beta: 1}): with the
    (completed, alpha) quota full, A was refused by the hourly cap and its steps dropped
    (helper review of d5b095e). A group now decides as its requests one by one."""
    store = make_store(sampling=SamplingConfig(completed_fraction=1.0, max_full_runs_per_hour=1))
    commit(store, full_run("fill", "completed", tools=("alpha", "alpha")))
    stage = MapStage()
    trace = "ab" * 16
    tool = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL}
    agent = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}
    root = _span(trace, "workflow", {}, "", 0)
    a = _span(trace, "invoke_agent A", agent, root.span_id, 1)
    x = _span(trace, "chain X", {}, a.span_id, 2)
    alpha = [
        _span(trace, "execute_tool alpha", {**tool, sc.GEN_AI_TOOL_NAME: "alpha"}, x.span_id, t)
        for t in (3, 4)
    ]
    beta = _span(trace, "execute_tool beta", {**tool, sc.GEN_AI_TOOL_NAME: "beta"}, a.span_id, 5)
    b = _span(trace, "invoke_agent B", agent, root.span_id, 6)
    requests = [stage.process(SpanBatch(spans=s)) for s in (alpha, [a, beta], [x, b])]
    assert [len(r.released) for r in requests] == [0, 0, 2]
    if mode == "last two grouped":
        commit(store, requests[0])
        requests = requests[1:]
    _submit_requests(store, gate, requests, grouped=mode != "one by one")
    detail = store.reader().get_run(a.span_id)
    assert detail is not None
    run = detail.run
    assert (run["sampled"], run["sample_tool"], run["tool_calls"]) == (True, "beta", 3)
    assert sorted(s["tool"] for s in detail.steps) == ["alpha", "alpha", "beta"]


@pytest.mark.parametrize("takeover", [False, True], ids=["agent span", "loopwatch span"])
@pytest.mark.parametrize("mode", ["one by one", "last two grouped"])
def test_a_step_after_the_trace_level_run_was_declined_goes_to_its_agent(
    make_store: Any, gate: Gate, mode: str, takeover: bool
) -> None:
    """The trace-level run is decided (not sampled) at its root span; a tool span whose
    agent is not known yet is pending; then the agent span releases it to the agent run
    (declined: counted, not kept), or a loopwatch span discards it, in any grouping. The
    trace-level run has a model call of its own (a run with no step is no run)."""
    store = make_store(sampling=SamplingConfig(completed_fraction=0.0, max_full_runs_per_hour=1))
    stage = MapStage()
    trace = "ab" * 16
    root = _span(trace, "workflow", {}, "", 1)
    model = _span(trace, "chat m", {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}, root.span_id, 2)
    a = _span(
        trace, "invoke_agent A", {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}, root.span_id, 3
    )
    tool = _span(
        trace,
        "execute_tool alpha",
        {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "alpha"},
        a.span_id,
        5,
    )
    lw = _span(
        trace, "decide", {sc.LW_EVENT: sc.EVENT_DECISION, sc.LW_RUN_ID: "lw", sc.LW_STEP: 1}, "", 7
    )
    requests = [
        stage.process(SpanBatch(spans=s)) for s in ([model, root], [tool], [lw if takeover else a])
    ]
    assert len(requests[2].released) + len(requests[2].discarded) == 1
    commit(store, requests[0])
    assert store.reader().get_run(trace).run["sampled"] is False  # type: ignore[union-attr]
    _submit_requests(store, gate, requests[1:], grouped=mode != "one by one")
    declined = store.reader().get_run(trace)
    assert declined is not None
    assert (declined.run["tool_calls"], declined.steps) == (0, [])
    stored = tool_call_totals(store)
    alpha = sum(n for (_, t, _), n in stored.items() if t == "alpha")
    assert alpha == (0 if takeover else 1)  # counted once, or discarded with its trace
    if not takeover:
        agent = store.reader().get_run(a.span_id)
        assert agent is not None
        assert (agent.run["tool_calls"], agent.steps) == (1, [])
