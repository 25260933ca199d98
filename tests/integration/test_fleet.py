"""A fleet on one machine: real collector processes shipping to one lake on a real
PostgreSQL catalog.

- **Three collectors under load, one lake**: sender threads post loopwatch runs over
  OTLP/HTTP to three collectors at once; every run of a request answered 200 (each
  sender's log) is in the lake exactly once, with its stop, shipped by the collector
  that acknowledged it; lake housekeeping runs meanwhile, on one collector only.
- **Routing**: one third-party trace whose spans reach two collectors, in both orders:
  the lake holds one run with one stop (docs/lake.md, "Routing third-party spans",
  states the rules and their limit).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopwatch.collector.lake.connect import LakeTarget, connect_lake

from .postgres import PostgresProcess, start_postgres
from .services import CollectorProcess, poll_until, start_collector

FRAMEWORKS = Path(__file__).resolve().parents[1] / "testdata" / "frameworks"
REASONS = ("repeated_action", "budget_exhausted", "completed", "no_progress")


def fleet_env(**extra: str) -> dict[str, str]:
    """Ship and keep house quickly, so the test waits seconds, not minutes."""
    return {
        "LOOPWATCH_LAKE_SHIP_GRACE_SECONDS": "0.5",
        "LOOPWATCH_LAKE_SHIP_INTERVAL_SECONDS": "0.5",
        "LOOPWATCH_LAKE_SHIP_RETRY_MAX_SECONDS": "2",
        "LOOPWATCH_LAKE_HOUSEKEEPING_INTERVAL_SECONDS": "2",
        "LOOPWATCH_LAKE_HOUSEKEEPING_LEASE_SECONDS": "30",
        "LOOPWATCH_SAMPLING_COMPLETED_FRACTION": "1",
        "LOOPWATCH_LOG_LEVEL": "info",  # each housekeeping round that worked is logged
        **extra,
    }


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresProcess]:
    with start_postgres(tmp_path_factory.mktemp("pg")) as server:
        yield server


def new_lake(pg: PostgresProcess, tmp_path: Path, name: str) -> LakeTarget:
    pg.create_database(name)
    return LakeTarget(pg.catalog(name), str(tmp_path / f"{name}-data") + "/")


def start_member(
    tmp_path: Path, target: LakeTarget, name: str, env: dict[str, str]
) -> CollectorProcess:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return start_collector(
        folder,
        "--lake",
        target.catalog,
        "--lake-data",
        target.data_path,
        "--collector-id",
        name,
        env=env,
        ready_timeout_seconds=90,
    )


def lake_rows(target: LakeTarget, sql: str) -> list[tuple[Any, ...]]:
    con = connect_lake(target, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# --------------------------------------------------------------- under load


def _attrs(values: dict[str, str | int]) -> list[dict[str, Any]]:
    return [
        {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
        for k, v in values.items()
    ]


def loopwatch_run(run_id: str, trace: int, reason: str, agent: str) -> list[dict[str, Any]]:
    """The spans of one loopwatch run, as the guard emits them: the run, two tool calls
    and the stop (OTLP/JSON; DESIGN 4's wire format)."""
    now = time.time_ns()
    trace_id = f"{trace:032x}"
    root = f"{trace & 0xFFFFFFFFFFFF:012x}0000"
    base = {"loopwatch.run.id": run_id, "gen_ai.agent.name": agent}

    def span(index: int, name: str, attributes: dict[str, str | int]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": root if index == 0 else f"{root[:12]}{index:04x}",
            "name": name,
            "kind": 1,
            "startTimeUnixNano": str(now - 10_000_000 + index * 1_000_000),
            "endTimeUnixNano": str(now - 9_000_000 + index * 1_000_000),
            "attributes": _attrs(attributes),
        }
        if index:
            out["parentSpanId"] = root
        return out

    tool = {
        **base,
        "gen_ai.operation.name": "execute_tool",
        "loopwatch.event": "tool_result",
        "gen_ai.tool.name": "lookup_order",
        "loopwatch.tool.outcome": "ok",
        "loopwatch.tool.risk": "read",
        "loopwatch.action.fingerprint": "f" * 64,
        "loopwatch.observation.digest": "d" * 64,
    }
    return [
        span(0, f"invoke_agent {agent}", {**base, "gen_ai.operation.name": "invoke_agent"}),
        span(1, "execute_tool lookup_order", {**tool, "loopwatch.step": 1}),
        span(2, "execute_tool lookup_order", {**tool, "loopwatch.step": 2}),
        span(
            3,
            f"stop {agent}",
            {
                **base,
                "loopwatch.event": "stop",
                "loopwatch.step": 3,
                "loopwatch.stop.reason": reason,
                "gen_ai.agent.finish_reason": reason,
            },
        ),
    ]


class Sender(threading.Thread):
    """Posts ``requests`` OTLP/JSON requests of ``runs_per_request`` runs each to one
    collector; logs the run ids of every request answered 200 (``acknowledged``), and of
    the others (``refused``: backpressure or an error; not acknowledged, may or may not be
    stored)."""

    def __init__(
        self, collector: CollectorProcess, name: str, requests: int, runs_per_request: int
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.collector = collector
        self.requests = requests
        self.runs_per_request = runs_per_request
        self.acknowledged: dict[str, str] = {}
        self.refused: set[str] = set()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=30.0) as client:
                for request in range(self.requests):
                    spans: list[dict[str, Any]] = []
                    sent: dict[str, str] = {}
                    for index in range(self.runs_per_request):
                        run_id = f"{self.name}-{request}-{index}"
                        trace = hash((self.name, request, index)) % 2**96 + 1
                        reason = REASONS[(request + index) % len(REASONS)]
                        spans += loopwatch_run(run_id, trace, reason, "fleet")
                        sent[run_id] = reason
                    body = {
                        "resourceSpans": [
                            {"resource": {}, "scopeSpans": [{"scope": {}, "spans": spans}]}
                        ]
                    }
                    try:
                        answer = client.post(self.collector.otlp_url, json=body)
                    except httpx.HTTPError:
                        self.refused.update(sent)
                        continue
                    if answer.status_code == 200:
                        self.acknowledged.update(sent)
                    else:
                        self.refused.update(sent)
        except BaseException as exc:  # reported by the test
            self.failure = exc


def test_three_collectors_under_load_one_lake(pg: PostgresProcess, tmp_path: Path) -> None:
    target = new_lake(pg, tmp_path, "load")
    names = ("c1", "c2", "c3")
    collectors = [start_member(tmp_path, target, name, fleet_env()) for name in names]
    try:
        senders = [
            Sender(collector, f"{collector_name}-s{i}", requests=12, runs_per_request=10)
            for collector, collector_name in zip(collectors, names, strict=True)
            for i in range(3)
        ]
        started = time.monotonic()
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(300)
        sending_seconds = time.monotonic() - started
        assert all(s.failure is None for s in senders), [s.failure for s in senders]
        acknowledged = {
            run_id: (sender.name.split("-")[0], reason)
            for sender in senders
            for run_id, reason in sender.acknowledged.items()
        }
        refused = set().union(*(s.refused for s in senders))
        assert len(acknowledged) >= 0.9 * 9 * 12 * 10, (len(acknowledged), len(refused))

        def in_lake() -> Counter[str]:
            return Counter(str(r) for (r,) in lake_rows(target, "SELECT run_id FROM lake.runs"))

        poll_until(
            lambda: set(acknowledged) <= set(in_lake()),
            timeout_seconds=180,
            what="every acknowledged run in the lake",
        )
        time.sleep(3)  # a late duplicate would have shipped by now
        counts = in_lake()
        assert max(counts.values()) == 1, [r for r, n in counts.items() if n > 1]
        assert set(counts) <= set(acknowledged) | refused, set(counts) - set(acknowledged)
        shipped_by = dict(
            (str(r), str(c))
            for r, c in lake_rows(target, "SELECT run_id, collector_id FROM lake.runs")
        )
        stops = lake_rows(target, "SELECT run_id, reason FROM lake.stops")
        stop_counts = Counter(str(r) for r, _ in stops)
        assert max(stop_counts.values()) == 1
        reasons = {str(r): str(s) for r, s in stops}
        for run_id, (collector_name, reason) in acknowledged.items():
            assert shipped_by[run_id] == collector_name, run_id
            assert reasons[run_id] == reason, run_id
        steps = lake_rows(target, "SELECT count(*), count(DISTINCT run_id) FROM lake.steps")[0]
        assert steps[1] == len(counts)
        for collector in collectors:
            assert collector.running, collector.stderr_text()
        # Housekeeping ran meanwhile (every 2 s): one collector holds the lease.
        import psycopg

        with psycopg.connect(target.postgres_dsn) as con:
            holders = con.execute("SELECT holder FROM loopwatch_lease").fetchall()
        assert len(holders) == 1 and str(holders[0][0]).split("/")[0] in names, holders
        worked = [
            name
            for name, collector in zip(names, collectors, strict=True)
            if "lake housekeeping: RoundReport(worked=True"
            in collector.stderr_path.read_text(errors="replace")
        ]
        assert worked == [str(holders[0][0]).split("/")[0]], worked
        print(
            f"\nfleet load: {len(acknowledged)} runs acknowledged by 3 collectors in "
            f"{sending_seconds:.1f} s ({len(refused)} refused), each in the lake once"
        )
    finally:
        for collector in collectors:
            collector.stop(timeout_seconds=60)


# ------------------------------------------------------------------ routing


def split_trace(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fixture's spans in two OTLP/JSON requests: the first half, and the rest (which
    holds the agent's root span, recorded last)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    resource = doc["resourceSpans"][0]
    spans = [s for scope in resource["scopeSpans"] for s in scope["spans"]]
    scope = resource["scopeSpans"][0]["scope"]
    half = len(spans) // 2

    def body(part: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "resourceSpans": [
                {"resource": resource["resource"], "scopeSpans": [{"scope": scope, "spans": part}]}
            ]
        }

    return body(spans[:half]), body(spans[half:])


def _trace_runs(target: LakeTarget, trace_id: str) -> list[tuple[Any, ...]]:
    return lake_rows(
        target,
        "SELECT run_id, collector_id, stop_reason FROM lake.runs "
        f"WHERE trace_id = '{trace_id}' ORDER BY collector_id",
    )


def _release_held_trace(collector: CollectorProcess) -> None:
    """A collector holds a trace's spans waiting for its agent span; after the idle
    timeout, any later request lets the trace go, to its trace-level run."""
    time.sleep(3)
    later = loopwatch_run(f"later-{time.time_ns()}", 0xABC, "completed", "fleet")
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": later}]}]}
    assert httpx.post(collector.otlp_url, json=body, timeout=30).status_code == 200


def _handled(collector: CollectorProcess, runs: int) -> bool:
    metrics = collector.metrics()
    done = metrics.total("loopwatch_lake_runs_shipped_total") + metrics.total(
        "loopwatch_lake_runs_skipped_total"
    )
    return done >= runs and metrics.value("loopwatch_lake_backlog_runs") == 0


@pytest.mark.parametrize(
    ("fixture", "order"),
    [
        # No agent span of its own: the run id is the trace id on both collectors.
        ("langgraph-openinference-runaway", "run_first"),
        # An invoke_agent root: the half without it becomes a stopless trace-level
        # fragment, folded into the agent's run whichever ships first.
        ("pydantic_ai-native-runaway", "run_first"),
        ("pydantic_ai-native-runaway", "fragment_first"),
    ],
)
def test_a_trace_split_over_two_collectors(
    pg: PostgresProcess, tmp_path: Path, fixture: str, order: str
) -> None:
    """What the lake holds when one trace's spans reach two collectors (no trace-ID
    routing): ONE run, with one stop, whichever half ships first: the lake keeps the
    first copy of a run key only, and a trace-level fragment is folded into its trace's
    run (docs/lake.md, "Routing third-party spans")."""
    name = f"routing_{fixture.split('-', maxsplit=1)[0]}_{order}"
    target = new_lake(pg, tmp_path, name)
    env = fleet_env(LOOPWATCH_SAMPLING_STOP_TIMEOUT_SECONDS="2")
    left, right = (start_member(tmp_path, target, name, env) for name in ("left", "right"))
    try:
        head, tail = split_trace(FRAMEWORKS / f"{fixture}.json")
        trace_id = head["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
        spans = {
            s["spanId"]
            for body in (head, tail)
            for scope in body["resourceSpans"][0]["scopeSpans"]
            for s in scope["spans"]
        }
        halves = ((right, tail), (left, head))
        for collector, body in halves if order == "run_first" else halves[::-1]:
            answer = httpx.post(collector.otlp_url, json=body, timeout=30)
            assert answer.status_code == 200, answer.text
            if collector is right:
                # The right half holds the root span: its run ends and ships.
                poll_until(
                    lambda: any(c == "right" for _, c, _ in _trace_runs(target, trace_id)),
                    timeout_seconds=90,
                    what="the right collector's run in the lake",
                )
            else:
                _release_held_trace(left)
                poll_until(lambda: _handled(left, 2), timeout_seconds=90, what="left's half")
                if order == "fragment_first":
                    assert _trace_runs(target, trace_id) == [(trace_id, "left", None)]
        poll_until(lambda: _handled(right, 1), timeout_seconds=90, what="right's run handled")
        runs = _trace_runs(target, trace_id)
        stops = lake_rows(
            target,
            "SELECT s.run_id, s.collector_id FROM lake.stops s JOIN lake.runs r "
            f"USING (run_id) WHERE r.trace_id = '{trace_id}'",
        )
        steps = lake_rows(
            target,
            "SELECT count(*), count(DISTINCT span_id), count(DISTINCT run_id), "
            f"list(DISTINCT collector_id ORDER BY collector_id) FROM lake.steps "
            f"WHERE trace_id = '{trace_id}'",
        )[0]
        print(f"\n{fixture} {order}: lake runs {runs}; stops {stops}; steps {steps}")
        # One run for the trace, with its stop, shipped by the collector that saw the root.
        assert len(runs) == 1, runs
        assert [c for _, c in stops] == ["right"], stops
        assert (runs[0][0], runs[0][1]) == (stops[0][0], "right")
        assert runs[0][2] is not None
        # Every step of the trace is in the lake once, under that run.
        assert steps[0] == steps[1] and steps[2] == 1, steps
        assert set(steps[3]) <= {"left", "right"} and steps[1] <= len(spans), steps
        if fixture.startswith("langgraph"):
            assert left.metrics().total("loopwatch_lake_runs_skipped_total") == 1
        else:
            # The fragment's half is kept: its steps (left's) joined the run's (right's).
            assert steps[3] == ["left", "right"], steps
            assert left.metrics().total("loopwatch_lake_runs_skipped_total") == (
                1 if order == "run_first" else 0
            )
        # Lake-wide: one stop row per run at most, and as many stops as stopped runs.
        per_run = lake_rows(
            target, "SELECT max(n) FROM (SELECT count(*) n FROM lake.stops GROUP BY run_id)"
        )
        assert per_run[0][0] == 1
        total = lake_rows(
            target,
            "SELECT (SELECT count(*) FROM lake.stops), "
            "(SELECT count(DISTINCT run_id) FROM lake.runs WHERE stop_reason IS NOT NULL)",
        )[0]
        assert total[0] == total[1], total
        orphans = lake_rows(
            target,
            "SELECT count(*) FROM lake.steps WHERE run_key NOT IN (SELECT run_key FROM lake.runs)",
        )
        assert orphans == [(0,)]
    finally:
        left.stop(timeout_seconds=60)
        right.stop(timeout_seconds=60)


# ------------------------------------------------------------- housekeeping


def _lease_holder(target: LakeTarget) -> str | None:
    import psycopg

    with psycopg.connect(target.postgres_dsn) as con:
        try:
            row = con.execute(
                "SELECT holder FROM loopwatch_lease WHERE expires_at >= now()"
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    return None if row is None else str(row[0]).split("/")[0]


def test_a_killed_housekeeping_collector_is_replaced(pg: PostgresProcess, tmp_path: Path) -> None:
    """Two collectors keep house at once: one holds the lease; ``kill -9`` it, and the
    other takes over once the lease expires, while shipping goes on."""
    target = new_lake(pg, tmp_path, "takeover")
    env = fleet_env(
        LOOPWATCH_LAKE_HOUSEKEEPING_INTERVAL_SECONDS="1",
        LOOPWATCH_LAKE_HOUSEKEEPING_LEASE_SECONDS="6",
    )
    members = {name: start_member(tmp_path, target, name, env) for name in ("h1", "h2")}
    try:
        poll_until(
            lambda: _lease_holder(target) is not None, timeout_seconds=60, what="a lease holder"
        )
        holder = _lease_holder(target)
        assert holder in members
        heir = next(name for name in members if name != holder)
        members[holder].kill()
        killed = time.monotonic()
        poll_until(
            lambda: _lease_holder(target) == heir,
            timeout_seconds=60,
            what="the heir to take over",
        )
        assert time.monotonic() - killed >= 2.0, "a live lease must not move at once"
        body = {
            "resourceSpans": [
                {
                    "resource": {},
                    "scopeSpans": [
                        {"scope": {}, "spans": loopwatch_run("after", 0xAF7E2, "completed", "f")}
                    ],
                }
            ]
        }
        answer = httpx.post(members[heir].otlp_url, json=body, timeout=30)
        assert answer.status_code == 200
        poll_until(
            lambda: (
                lake_rows(target, "SELECT count(*) FROM lake.runs WHERE run_id = 'after'")[0][0]
                == 1
            ),
            timeout_seconds=60,
            what="the heir's run in the lake",
        )
        # The round's report is logged when the round ends, which may be after the run
        # reached the lake: wait for it rather than read the log once.
        poll_until(
            lambda: (
                f"RoundReport(worked=True, holder='{heir}/"
                in members[heir].stderr_path.read_text(errors="replace")
            ),
            timeout_seconds=60,
            what="the heir's housekeeping round in its log",
        )
    finally:
        for member in members.values():
            if member.running:
                member.stop(timeout_seconds=60)


def test_lake_retention_while_collectors_ship(pg: PostgresProcess, tmp_path: Path) -> None:
    """Retention deletes old runs from every lake table while two collectors ship new
    ones: the old go, every acknowledged run stays exactly once, and no shipment meets a
    DuckLake write conflict (retention holds the shippers' lock)."""
    target = new_lake(pg, tmp_path, "retention")
    env = fleet_env(
        LOOPWATCH_LAKE_HOUSEKEEPING_INTERVAL_SECONDS="1",
        LOOPWATCH_LAKE_HOUSEKEEPING_RETENTION_DAYS="1",
    )
    members = [start_member(tmp_path, target, name, env) for name in ("r1", "r2")]
    try:
        # Runs shipped long ago: last seen three days back, a row in every table.
        old = [f"old-{i}" for i in range(20)]
        con = connect_lake(target)
        try:
            ago = time.time_ns() - 3 * 86_400 * 10**9
            for table in ("runs", "stops", "steps", "run_tools", "canary_flags"):
                column = {"runs": "last_seen_unix_nano", "canary_flags": "first_seen_unix_nano"}
                extra = column.get(table)
                names = "run_id, collector_id" + (f", {extra}" if extra else "")
                values = ", ".join(
                    f"('{r}', 'ancient'" + (f", {ago}" if extra else "") + ")" for r in old
                )
                con.execute(f"INSERT INTO lake.{table} ({names}) VALUES {values}")
        finally:
            con.close()
        senders = [Sender(m, f"{m.otlp_address}-s{i}", 15, 6) for m in members for i in range(2)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(300)
        acknowledged = set().union(*(s.acknowledged for s in senders))
        assert len(acknowledged) == 4 * 15 * 6

        def settled() -> bool:
            ids = Counter(str(r) for (r,) in lake_rows(target, "SELECT run_id FROM lake.runs"))
            return acknowledged <= set(ids) and not set(old) & set(ids)

        poll_until(settled, timeout_seconds=120, what="old runs gone, new runs shipped")
        for table in ("runs", "stops", "steps", "run_tools", "canary_flags"):
            left = lake_rows(target, f"SELECT count(*) FROM lake.{table} WHERE run_id LIKE 'old-%'")
            assert left[0][0] == 0, table
        counts = Counter(str(r) for (r,) in lake_rows(target, "SELECT run_id FROM lake.runs"))
        assert set(counts) == acknowledged and max(counts.values()) == 1
        for member in members:
            metrics = member.metrics()
            assert metrics.total("loopwatch_lake_ship_failures_total") == 0, member.stderr_text()
    finally:
        for member in members:
            member.stop(timeout_seconds=60)
