"""Group commit law: requests committed in any grouping leave the database they leave
committed one by one (``loopwatch.collector.store``, "Requests committed in one group are
applied in order, each as a unit"), for every table.

A fixed-seed generator of third-party traces (agents, chains, tool and model calls whose
parents arrive later, roots that arrive first, last or never, loopwatch spans taking a
trace over, client retries) cut into requests by the real :class:`MapStage`, committed
to real stores on DuckDB files one by one and in random groups, and the files compared.
Then one small case per difference the generator found, each with the outcome the
design asks for.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from loopwatch.collector.map import MapStage
from loopwatch.collector.records import SpanBatch, SpanRecord
from loopwatch.collector.rows import (
    KIND_DECISION,
    KIND_TOOL_RESULT,
    SOURCE_LOOPWATCH,
    STOP_ORIGIN_STOP_SPAN,
    MappedBatch,
    RunRow,
    StepRow,
    StopRow,
)
from loopwatch.collector.sample import SamplingConfig
from loopwatch.collector.store import Store, StoreConfig
from loopwatch.instrumentation import _semconv as sc

from tests.unit.test_store import Clock, Gate

T0 = 1_800_000_000.0
HOUR = 3600.0
TOOLS = ("alpha", "beta", "gamma")
AGENT = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}
CHAT = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}
_PLUG = "plug"  # run id of the batch that holds the writer while a group is queued


@dataclass
class Case:
    """Requests of one or more traces, how they are grouped, and the sampling they meet."""

    requests: list[MappedBatch]
    groups: list[int]
    fraction: float = 1.0
    cap: int = 1
    fill: tuple[str, ...] | None = None  # tools of a completed run kept first (the cap)
    seed: int = -1


# ------------------------------------------------------------------ generation


def tool_span(trace: str, span_id: str, parent: str, tool: str, start: int) -> SpanRecord:
    attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: tool}
    return SpanRecord(trace, span_id, parent, f"execute_tool {tool}", 1, start, start + 1, attrs)


def _trace(
    rng: random.Random, prefix: str, movey: bool
) -> tuple[list[SpanRecord], list[SpanRecord]]:
    """Third-party spans of one trace, and loopwatch spans that take the trace over."""
    trace = f"{rng.getrandbits(128):032x}"
    ids = iter(f"{prefix}{i:08x}" for i in range(1, 1000))
    clock = [0]

    def span(name: str, attrs: dict[str, Any], parent: str, status: int = 1) -> SpanRecord:
        clock[0] += 1
        start = clock[0]
        return SpanRecord(trace, next(ids), parent, name, 1, start, start + 1, attrs, status)

    spans: list[SpanRecord] = []
    containers: list[str] = []
    shape = rng.random()
    if shape < 0.6:
        spans.append(span("workflow", {}, ""))
        containers.append(spans[-1].span_id)
    elif shape < 0.8:
        spans.append(span("invoke_agent R", AGENT, ""))
        containers.append(spans[-1].span_id)
    else:
        containers.append(f"{prefix}ffffffff")  # a root that never arrives
    for i in range(rng.randint(2, 4) if movey else rng.randint(1, 3)):
        spans.append(span(f"invoke_agent A{i}", AGENT, rng.choice(containers)))
        containers.append(spans[-1].span_id)
        if rng.random() < (0.8 if movey else 0.5):
            spans.append(span(f"chain X{i}", {}, rng.choice(containers)))
            containers.append(spans[-1].span_id)
    for _ in range(rng.randint(1, 6)):
        parent = rng.choice(containers)
        if rng.random() < 0.15:
            spans.append(span("chat", {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}, parent))
        else:
            tool = rng.choice(TOOLS)
            attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: tool}
            status = 2 if rng.random() < 0.1 else 1
            spans.append(span(f"execute_tool {tool}", attrs, parent, status))
    takeover: list[SpanRecord] = []
    if rng.random() < 0.25:
        attrs = {sc.LW_EVENT: sc.EVENT_DECISION, sc.LW_RUN_ID: f"lw-{prefix}", sc.LW_STEP: 1}
        takeover.append(span("decide lw", attrs, ""))
    return spans, takeover


def map_requests(chunks: Sequence[Sequence[SpanRecord]]) -> list[MappedBatch]:
    """Map span chunks with one :class:`MapStage`, labelling agents as the service does."""
    stage = MapStage()
    agents: dict[str, str] = {}
    requests = []
    for chunk in chunks:
        mapped = stage.process(SpanBatch(spans=list(chunk)))
        for run in mapped.runs:
            if run.agent:
                agents[run.run_id] = run.agent
        for step in mapped.steps:
            if step.kind == KIND_TOOL_RESULT and not step.agent:
                step.agent = agents.get(step.run_id, "unknown")
        for stop in mapped.stops:
            if not stop.agent:
                stop.agent = agents.get(stop.run_id, "unknown")
        requests.append(mapped)
    return requests


def generate(seed: int, *, root_last: bool = False, movey: bool = False) -> Case:
    """One case; ``root_last`` sends roots after the rest, ``movey`` children first."""
    rng = random.Random(seed)
    items: list[SpanRecord] = []
    takeovers: list[SpanRecord] = []
    for tno in range(rng.choice((1, 1, 2, 3))):
        spans, lw = _trace(rng, f"{seed % 0xFFFF:04x}{tno:04x}", movey)
        items += spans
        takeovers += lw
    rng.shuffle(items)
    if movey:

        def rank(s: SpanRecord) -> float:
            if s.name.startswith(("execute_tool", "chat")):
                base = 0
            else:
                base = 1 if s.name.startswith("invoke_agent") else 2
            return base + rng.random() * 1.5

        items.sort(key=rank)
    if root_last:
        items = [s for s in items if s.parent_span_id] + [s for s in items if not s.parent_span_id]
    for s in takeovers:
        items.insert(rng.randint(0, len(items)), s)
    if items and rng.random() < 0.2:
        items.insert(rng.randint(0, len(items)), rng.choice(items))  # a client retry
    n_requests = rng.randint(2, min(8, max(2, len(items))))
    cuts = sorted(rng.sample(range(1, len(items)), min(n_requests - 1, len(items) - 1)))
    chunks = [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)]
    groups: list[int] = []
    left = len(chunks)
    while left:
        groups.append(rng.randint(1, left))
        left -= groups[-1]
    fill = None
    if rng.random() < 0.6:
        fill = rng.choice(((), ("alpha",), ("beta",), ("alpha", "alpha"), ("gamma",)))
    return Case(
        map_requests(chunks),
        groups,
        fraction=rng.choice((1.0, 0.5)),
        cap=rng.choice((1, 2)),
        fill=fill,
        seed=seed,
    )


# ------------------------------------------------------------------ committing


def fill_run(run_id: str, tools: tuple[str, ...]) -> MappedBatch:
    """A completed loopwatch run calling ``tools``: kept first, it fills the hourly cap."""
    trace = hashlib.md5(run_id.encode()).hexdigest()
    ids = iter(f"f{i:015x}" for i in range(1, 100))
    common = {"trace_id": trace, "run_id": run_id, "source": SOURCE_LOOPWATCH}
    out = MappedBatch()
    out.runs.append(RunRow(span_id=next(ids), is_run_span=True, agent="fill", **common))
    for step, tool in enumerate(tools, start=1):
        for kind in (KIND_DECISION, KIND_TOOL_RESULT):
            tool_fields = {"tool": tool, "outcome": sc.OUTCOME_OK, "agent": "fill"}
            out.steps.append(
                StepRow(
                    span_id=next(ids),
                    kind=kind,
                    step=step,
                    start_unix_nano=step,
                    end_unix_nano=step + 1,
                    **common,
                    **(tool_fields if kind == KIND_TOOL_RESULT else {}),
                )
            )
    out.stops.append(
        StopRow(
            span_id=next(ids),
            origin=STOP_ORIGIN_STOP_SPAN,
            reason="completed",
            time_unix_nano=90,
            agent="fill",
            **common,
        )
    )
    return out


_plugs = iter(range(1, 1 << 62))


def _plug() -> MappedBatch:
    out = MappedBatch()
    out.runs.append(RunRow(_PLUG, "00" * 16, f"{next(_plugs):016x}", SOURCE_LOOPWATCH, True))
    return out


def commit_case(store: Store, gate: Gate, case: Case, *, grouped: bool) -> None:
    """Commit the case's requests one by one, or in its groups (the writer held while a
    group is queued, so the group is committed as one)."""
    if case.fill is not None:
        store.submit(fill_run(f"fill-{case.seed}", case.fill)).result(timeout=30)
    requests = copy.deepcopy(case.requests)
    sizes = case.groups if grouped else [1] * len(requests)
    at = 0
    for size in sizes:
        part, at = requests[at : at + size], at + size
        if size == 1:
            store.submit(part[0]).result(timeout=30)
            continue
        gate.holding.clear()
        gate.release.clear()
        gate.armed = True
        held = store.submit(_plug())
        assert gate.holding.wait(10)
        futures = [store.submit(r) for r in part]
        gate.release.set()
        held.result(timeout=30)
        assert {f.result(timeout=30).group_batches for f in futures} == {size}


def snapshot(path: Path) -> dict[str, Any]:
    """Every table that states the store's result, in a form grouping may not change.

    Append-only tables are compared by what they mean: ``run_tools`` by its sums per run,
    ``sample_quota`` by its largest ``kept``.
    """
    con = duckdb.connect(str(path), read_only=True)
    try:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return sorted(con.execute(sql).fetchall(), key=repr)

        columns = [r[0] for r in con.execute("DESCRIBE runs").fetchall()]
        runs = {
            (row[1], column): value
            for row in con.execute(f"SELECT * FROM runs WHERE run_id <> '{_PLUG}'").fetchall()
            for column, value in zip(columns, row, strict=True)
        }
        return {
            "runs": sorted(runs.items(), key=repr),
            "steps": rows("SELECT * FROM steps"),
            "staged_steps": rows("SELECT * FROM staged_steps"),
            "pending_steps": rows("SELECT * FROM pending_steps"),
            "stops": rows("SELECT * FROM stops"),
            "stop_anomalies": rows("SELECT * FROM stop_anomalies"),
            "run_tools": rows(
                "SELECT run_key, tool, outcome, sum(calls) FROM run_tools "
                "GROUP BY ALL HAVING sum(calls) <> 0"
            ),
            "sample_quota": rows(
                "SELECT hour_unix, stop_reason, tool, max(kept) FROM sample_quota GROUP BY ALL"
            ),
        }
    finally:
        con.close()


def _commit_cases(
    path: Path, cases: Sequence[Case], sampling: SamplingConfig, grouped: bool
) -> None:
    clock, gate = Clock(), Gate()
    store = Store(path, config=StoreConfig(sampling=sampling), clock=clock, on_commit=gate)
    try:
        for case in cases:
            clock.now += HOUR
            commit_case(store, gate, case, grouped=grouped)
    finally:
        gate.release.set()
        store.close()


def run_cases(
    root: Path, cases: Sequence[Case], *, fraction: float, cap: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Commit ``cases`` one after the other into two stores, one by one and grouped (each
    case in an hour of its own; the two stores side by side), and return both files'
    snapshots."""
    sampling = SamplingConfig(completed_fraction=fraction, max_full_runs_per_hour=cap)
    paths = [root / f"{mode}-{fraction}-{cap}.duckdb" for mode in ("one-by-one", "grouped")]
    with ThreadPoolExecutor(2) as pool:
        done = [
            pool.submit(_commit_cases, path, cases, sampling, grouped)
            for path, grouped in zip(paths, (False, True), strict=True)
        ]
        for future in done:
            future.result()
    return snapshot(paths[0]), snapshot(paths[1])


def differences(one: dict[str, Any], grouped: dict[str, Any]) -> list[str]:
    lines = []
    runs_one, runs_grouped = dict(one["runs"]), dict(grouped["runs"])
    for key in sorted(runs_one.keys() | runs_grouped.keys()):
        a, b = runs_one.get(key, "absent"), runs_grouped.get(key, "absent")
        if a != b:
            lines.append(f"run {key[0]} {key[1]}: one by one {a!r}, grouped {b!r}")
    for table, rows in one.items():
        a, b = set(rows), set(grouped[table])
        if table != "runs" and a != b:
            lines.append(
                f"{table}: one by one only {sorted(a - b, key=repr)}; "
                f"grouped only {sorted(b - a, key=repr)}"
            )
    return lines


def assert_same(root: Path, case: Case) -> tuple[dict[str, Any], dict[str, Any]]:
    one, grouped = run_cases(root, [case], fraction=case.fraction, cap=case.cap)
    assert differences(one, grouped) == []
    return one, grouped


# ------------------------------------------------------------------ the law

# This generator is a port of a review's fuzzer. One case at a time, before the fixes the
# named tests below keep, it found differences in 63 of the first 200 seeds of the three
# shapes (times and highest steps after a move, mostly); with those fixed, 8 of 1,000
# seeds (0-399, 1000-1299, 2000-2299), all in the first shape: 6 moves out of order with
# decisions (64, 128, 168, 169, 200, 398) and 2 kept steps moved to a declined run (297,
# 308). The first seeds of each shape and those run here, stores shared per sampling
# setting (a failure names the seeds of its setting; run one alone with run_cases).
SHAPES: dict[str, tuple[dict[str, bool], list[int]]] = {
    "roots anywhere": ({}, [*range(0, 120), 128, 168, 169, 200, 297, 308, 398]),
    "roots last": ({"root_last": True}, list(range(1000, 1050))),
    "children first": ({"root_last": True, "movey": True}, list(range(2000, 2050))),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_any_grouping_leaves_the_database_of_one_by_one(tmp_path: Path, shape: str) -> None:
    options, seeds = SHAPES[shape]
    cases = [generate(seed, **options) for seed in seeds]
    by_setting: dict[tuple[float, int], list[Case]] = {}
    for case in cases:
        by_setting.setdefault((case.fraction, case.cap), []).append(case)
    for (fraction, cap), some in sorted(by_setting.items()):
        one, grouped = run_cases(tmp_path, some, fraction=fraction, cap=cap)
        found = differences(one, grouped)
        assert not found, (
            f"seeds {[c.seed for c in some]} (fraction {fraction}, cap {cap}):\n" + "\n".join(found)
        )


# ------------------------------------------------------------------ the differences found


def _runs(snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (run_id, column), value in snap["runs"]:
        out.setdefault(run_id, {})[column] = value
    return out


def _kept(snap: dict[str, Any], table: str = "steps") -> list[tuple[str, str]]:
    """``(run_id, span_id)`` of the rows in ``table``."""
    return sorted((row[3], row[2]) for row in snap[table])


@pytest.mark.parametrize("groups", [[1, 1], [2]], ids=str)
def test_a_released_step_takes_its_step_and_times_to_its_run(
    tmp_path: Path, groups: list[int]
) -> None:
    """Two tool spans pending (their parents are not known yet); then the agent span of
    one of them releases that one to its run, with its step and times; the other stays
    pending, so there is no trace-level run yet."""
    trace = "ef" * 16
    a = SpanRecord(trace, "00000000000000c1", "00000000000000ff", "invoke_agent A", 1, 1, 2, AGENT)
    t1 = tool_span(trace, "00000000000000c2", "00000000000000fe", "alpha", 3)
    t2 = dataclasses.replace(
        tool_span(trace, "00000000000000c3", a.span_id, "alpha", 5), end_unix_nano=9
    )
    case = Case(map_requests([[t1, t2], [a]]), groups)
    assert [len(r.released) for r in case.requests] == [0, 1]
    one, _ = assert_same(tmp_path, case)
    runs = _runs(one)
    bounds = ("steps", "start_unix_nano", "end_unix_nano", "tool_calls")
    assert trace not in runs and [row[1] for row in one["pending_steps"]] == [t1.span_id]
    assert [runs[a.span_id][k] for k in bounds] == [2, 1, 9, 1]


@pytest.mark.parametrize("groups", [[1, 1, 1], [1, 2], [3]], ids=str)
def test_a_released_step_leaves_the_times_of_the_run_span_and_stop(
    tmp_path: Path, groups: list[int]
) -> None:
    """The root span (the trace-level run's run span and stop, with a model call of its
    own) arrives first; a tool span that started earlier (clock skew) and ended later is
    pending, then released to its agent: the trace-level run's times are its root span's."""
    trace = "ad" * 16
    root = SpanRecord(trace, "00000000000000d1", "", "workflow", 1, 10, 20, {})
    turn = SpanRecord(trace, "00000000000000d4", root.span_id, "chat", 1, 13, 14, CHAT)
    a = SpanRecord(trace, "00000000000000d2", root.span_id, "invoke_agent A", 1, 11, 12, AGENT)
    tool = dataclasses.replace(
        tool_span(trace, "00000000000000d3", a.span_id, "alpha", 5), end_unix_nano=30
    )
    case = Case(map_requests([[turn, root], [tool], [a]]), groups)
    assert [len(r.released) for r in case.requests] == [0, 0, 1]
    one, _ = assert_same(tmp_path, case)
    runs = _runs(one)
    bounds = ("steps", "start_unix_nano", "end_unix_nano", "tool_calls")
    assert [runs[trace][k] for k in bounds] == [1, 10, 20, 0]
    assert [runs[a.span_id][k] for k in bounds] == [1, 5, 30, 1]


def _kept_step_moved_to_a_declined_run(declined_first: bool) -> tuple[Case, str, str]:
    # The trace-level run and A each make a model call of their own (a run needs a step).
    trace = "cd" * 16
    root = SpanRecord(trace, "00000000000000b1", "", "workflow", 1, 1, 2, {})
    turn = SpanRecord(trace, "00000000000000b6", root.span_id, "chat", 1, 1, 2, CHAT)
    a = SpanRecord(trace, "00000000000000b2", root.span_id, "invoke_agent A", 1, 3, 4, AGENT)
    if not declined_first:  # A is decided (on the moved call) in the move's request
        tool = tool_span(trace, "00000000000000b4", a.span_id, "alpha", 7)
        chunks = [[turn, root], [tool], [a]]
        return Case(map_requests(chunks), [], cap=1, fill=("alpha",)), trace, a.span_id
    # A is declined first (the cap); a call under a chain span not known yet; the chain
    # span comes with a new agent B, and the call moves to A, decided before.
    turn_a = SpanRecord(trace, "00000000000000b7", a.span_id, "chat", 1, 3, 4, CHAT)
    x = SpanRecord(trace, "00000000000000b3", a.span_id, "chain X", 1, 5, 6, {})
    tool = tool_span(trace, "00000000000000b4", x.span_id, "alpha", 7)
    b = SpanRecord(trace, "00000000000000b5", root.span_id, "invoke_agent B", 1, 9, 10, AGENT)
    chunks = [[turn, root], [turn_a, a], [tool], [x, b]]
    return Case(map_requests(chunks), [], cap=2, fill=()), trace, a.span_id


@pytest.mark.parametrize(
    ("declined_first", "groups"),
    [
        (False, [1, 1, 1]),
        (False, [1, 2]),
        (False, [3]),
        (True, [1, 1, 1, 1]),
        (True, [1, 1, 2]),
        (True, [1, 3]),
    ],
)
def test_a_kept_step_moved_to_a_declined_run_is_not_kept(
    tmp_path: Path, declined_first: bool, groups: list[int]
) -> None:
    """The trace-level run is sampled at its root span; a tool span whose agent is not
    known yet is filed under it (kept in ``steps``); a later span moves it to its agent
    run, which is declined by the hourly cap (before, or on this call). One by one the
    move updated the kept row to the declined run, which then showed it; in a group it
    was dropped, as the design says for every step of a declined run (counted, not
    kept)."""
    case, trace, agent_run = _kept_step_moved_to_a_declined_run(declined_first)
    case.groups = groups
    assert len(case.requests[-1].released) == 1
    one, _ = assert_same(tmp_path, case)
    runs = _runs(one)
    assert (runs[trace]["sampled"], runs[trace]["tool_calls"]) == (True, 0)
    agent = runs[agent_run]
    assert (agent["sampled"], agent["sample_rule"], agent["tool_calls"]) == (
        False,
        "hourly_cap",
        1,
    )
    assert agent["sample_tool"] == ("" if declined_first else "alpha")
    assert case.fill is not None
    kept = [run for run, _ in _kept(one) if run != trace]  # the trace-level run's own call
    assert kept == [f"fill-{case.seed}"] * 2 * len(case.fill)
    assert _kept(one, "staged_steps") == []


@pytest.mark.parametrize("takeover", [False, True], ids=["agent span", "loopwatch span"])
@pytest.mark.parametrize("groups", [[1, 1, 1], [3], [2, 1], [1, 2]], ids=str)
def test_a_step_after_the_trace_level_run_was_declined_goes_to_its_agent(
    tmp_path: Path, groups: list[int], takeover: bool
) -> None:
    """The trace-level run (one model call of its own) is declined at its root span; a
    tool span whose agent is not known yet is pending; then the agent span releases it to
    the agent run (declined: counted, not kept), or a loopwatch span discards it (counted
    nowhere in the store), in any grouping."""
    trace = "ab" * 16
    root = SpanRecord(trace, "00000000000000a1", "", "workflow", 1, 1, 2, {})
    turn = SpanRecord(trace, "00000000000000a5", root.span_id, "chat", 1, 1, 2, CHAT)
    a = SpanRecord(trace, "00000000000000a2", root.span_id, "invoke_agent A", 1, 3, 4, AGENT)
    tool = tool_span(trace, "00000000000000a3", a.span_id, "alpha", 5)
    attrs = {sc.LW_EVENT: sc.EVENT_DECISION, sc.LW_RUN_ID: "lw", sc.LW_STEP: 1}
    lw = SpanRecord(trace, "00000000000000a4", "", "decide", 1, 7, 8, attrs)
    case = Case(map_requests([[turn, root], [tool], [lw if takeover else a]]), groups, fraction=0.0)
    assert [len(r.released) + len(r.discarded) for r in case.requests] == [0, 0, 1]
    one, _ = assert_same(tmp_path, case)
    runs = _runs(one)
    declined = runs[trace]
    assert (declined["sampled"], declined["tool_calls"], declined["steps"]) == (False, 0, 1)
    assert (declined["start_unix_nano"], declined["end_unix_nano"]) == (1, 2)
    if not takeover:
        assert (runs[a.span_id]["tool_calls"], runs[a.span_id]["sampled"]) == (1, False)
    rows = _kept(one) + _kept(one, "staged_steps")
    assert [run for run, _ in rows if run in (trace, a.span_id)] == []
    alpha = sum(r[3] for r in one["run_tools"] if r[1] == "alpha")
    assert alpha == (0 if takeover else 1)  # counted once, or discarded with its trace
    assert one["pending_steps"] == []
