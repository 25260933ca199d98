"""The writer's group application: one group's rows into DuckDB, inside its transaction.

:class:`GroupWriter` runs on the store's writer thread (:class:`~loopwatch.collector.
store.writer.Store` owns the transaction and the futures). For a group of requests it
claims the span keys not stored yet (the rest of a request are client retries and
are skipped whole), reads the rows of the runs the group touches (only keys the run-key
Bloom filter may hold), merges the group into them (:mod:`loopwatch.collector.runs`),
and writes every table through Arrow (:mod:`.arrow`, nanoarrow). Rules applied here:

- Steps of a run are staged (``staged_steps``, bounded by the undecided runs) until the
  run's sampling decision, then handed to ``steps`` (sampled) or dropped (not sampled);
  when the decision falls in the same group they go straight to their table. Steps
  arriving after the decision go to ``steps`` or are dropped; they always count.
- Pending steps (:attr:`~loopwatch.collector.rows.MappedBatch.pending`) are appended to
  ``pending_steps``, not counted. A released step is stored as a new step of its run,
  counted once, in the transaction that deletes its pending row; one whose pending row
  is gone (released before, or its request never committed) is skipped.
- Sampling (:mod:`loopwatch.collector.sample`) is decided once, when a run's first
  primary stop is committed, or by the periodic maintenance for runs with no stop and no
  new span for ``undecided_timeout_seconds``. A stop replacing another later does not
  re-decide (dropped steps cannot come back). The hourly cap's tool is the run's most
  called tool among the calls known at that request (earlier groups' and this group's
  up to it), so grouping does not change it.

State across groups: the sampling quota of the current hour (published after commit
through :attr:`GroupWriter.after_commit`). Raises whatever DuckDB raises; the caller rolls
the transaction back.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import duckdb

from ..detect import loop_tool
from ..rows import KIND_TOOL_RESULT, MappedBatch, StepRow, StopRow
from ..runs import Group, merge_rows, merge_stops
from ..sample import NO_STOP_REASON, Sampler, hour_bucket
from .arrow import BOOL, FLOAT64, INT64, STRING, UINT64, ArrowColumns, column
from .keys import RecentKeys, RunKeyFilter, span_key
from .schema import (
    AFTER_RECEIVED,
    ANOMALY_COLUMNS,
    ANOMALY_DUPLICATE,
    BOOL_FIELDS,
    FLOAT_FIELDS,
    INT_FIELDS,
    RUN_COLUMNS,
    STEP_COLUMNS,
    STEP_FIELDS,
    STEP_LATE,
    STOP_COLUMNS,
    STOP_FIELDS,
    STOP_LATE,
    UINT_FIELDS,
    key_list,
    run_key_of,
)

__all__ = ["FETCH_TIERS_SECONDS", "GroupWriter"]

FETCH_TIERS_SECONDS: Final = (120.0, 1800.0)
"""How far back, in seconds of ``last_seen_unix_nano``, each bounded tier of
:meth:`GroupWriter.fetch_stored` looks before the unbounded one. Two minutes holds the
previous span of a run in progress (agent steps are seconds apart; the OpenTelemetry
SDK's batch processor exports every 5 s); half an hour holds a run decided by the
stop timeout (``sampling.stop_timeout_seconds``, 900 s by default) and its late spans."""

_NS: Final = 1_000_000_000
_MASK64: Final = 2**64 - 1

_STEP_VALUES: Final = operator.attrgetter(*(f.name for f in dataclasses.fields(StepRow)))
_STEP_GETTERS: Final = tuple((name, operator.attrgetter(name)) for name in STEP_FIELDS[:-STEP_LATE])
_STEP_LATE_GETTERS: Final = tuple(
    (name, operator.attrgetter(name)) for name in STEP_FIELDS[-STEP_LATE:]
)
_get_stop: Final = operator.attrgetter(*[f for f in STOP_FIELDS if f != "stop_inferred"])
_STOP_INFERRED_AT: Final = STOP_FIELDS.index("stop_inferred")


def _arrow_type(name: str) -> Any:
    if name in INT_FIELDS:
        return INT64
    if name in FLOAT_FIELDS:
        return FLOAT64
    if name in BOOL_FIELDS:
        return BOOL
    if name in UINT_FIELDS:
        return UINT64
    return STRING


def _column(name: str, values: Sequence[Any]) -> Any:
    return column(values, _arrow_type(name))


def _table(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> ArrowColumns:
    return ArrowColumns(
        names,
        [_column(name, [row[i] for row in rows]) for i, name in enumerate(names)],
        len(rows),
    )


def _step_table(steps: list[StepRow], runs: dict[str, dict[str, Any]], now_ns: int) -> ArrowColumns:
    keys = {run_id: row["run_key"] for run_id, row in runs.items()}
    arrays = [_column("run_key", [keys[s.run_id] for s in steps])]
    arrays += [_column(name, list(map(get, steps))) for name, get in _STEP_GETTERS]
    arrays.append(column([now_ns] * len(steps), INT64))
    arrays += [_column(name, list(map(get, steps))) for name, get in _STEP_LATE_GETTERS]
    return ArrowColumns(STEP_COLUMNS, arrays, len(steps))


def _stop_tuple(run_key: int, stop_row: StopRow, now_ns: int, counted: bool) -> tuple[Any, ...]:
    values = _get_stop(stop_row)
    return (
        run_key,
        *values[:_STOP_INFERRED_AT],
        stop_row.stop_inferred,
        *values[_STOP_INFERRED_AT:-STOP_LATE],
        now_ns,
        *values[-STOP_LATE:],
        counted,
        loop_tool(stop_row),
        stop_row.nudges,
        stop_row.nudges_dropped,
    )


def _anomaly_tuple(run_key: int, stop_row: StopRow, now_ns: int) -> tuple[Any, ...]:
    values = _stop_tuple(run_key, stop_row, now_ns, False)
    return (*values[:-AFTER_RECEIVED], ANOMALY_DUPLICATE, *values[-AFTER_RECEIVED:])


class GroupWriter:
    """Applies groups of mapped batches to the write connection (writer thread only).

    Args:
        con: the store's write connection; the caller opens and commits transactions.
        sampler: the sampling rule.
        recent: the dedup window (shared with the store, which fills and expires it).
        stored_runs: the run-key filter (shared with the store, which fills it at open).
        clock: wall clock in epoch seconds.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        *,
        sampler: Sampler,
        recent: RecentKeys,
        stored_runs: RunKeyFilter,
        clock: Callable[[], float],
    ) -> None:
        self._con = con
        self._sampler = sampler
        self._recent = recent
        self._stored_runs = stored_runs
        self.whole_table_reads = 0  # fetch_stored's unbounded tier, for the debug log
        self._clock = clock
        # In-memory state to publish once the open transaction commits.
        self.after_commit: list[Callable[[], None]] = []
        self._quota_hour: int | None = None
        self._quota: dict[tuple[str, str], int] = {}
        self._now_ns = 0

    def write(
        self, batches: list[MappedBatch]
    ) -> list[tuple[int, frozenset[tuple[str, str]], tuple[StopRow, ...]]]:
        """Apply ``batches`` (one group, in request order) inside the open transaction.

        Returns:
            Per batch: its distinct span keys, the keys stored now (the rest were
            duplicates), and the stops to count (at most one per run).
        """
        now_ns = self._now_ns = int(self._clock() * _NS)
        owner: dict[tuple[str, str], int] = {}
        job_keys: list[set[tuple[str, str]]] = []
        repeated_steps = False
        total = 0
        own_steps = [
            [s for s in b.steps if (s.trace_id, s.span_id) not in b.released]
            if b.released
            else b.steps
            for b in batches
        ]
        for index, (batch, steps) in enumerate(zip(batches, own_steps, strict=True)):
            keys = {(s.trace_id, s.span_id) for s in steps}
            keys.update((s.trace_id, s.span_id) for s, _ in batch.pending)
            repeated_steps = repeated_steps or len(keys) != len(steps) + len(batch.pending)
            keys.update((r.trace_id, r.span_id) for r in batch.runs)
            keys.update((s.trace_id, s.span_id) for s in batch.stops)
            job_keys.append(keys)
            total += len(keys)
            if len(batches) == 1:
                owner = dict.fromkeys(keys, 0)
            else:
                for key in keys:
                    owner.setdefault(key, index)
        new_keys = self._claim_keys(owner, now_ns)
        group = Group(now_ns, [], [], [], set())
        handed_off = self._hand_off(batches, new_keys, owner)
        everything_new = len(new_keys) == len(owner) == total and not repeated_steps
        step_keys: set[tuple[str, str]] = set()
        stop_keys: set[tuple[str, str, str]] = set()
        for index, (batch, steps) in enumerate(zip(batches, own_steps, strict=True)):
            if everything_new:
                group.runs += batch.runs
                group.steps += steps
                group.step_jobs += [index] * len(steps)
            else:
                for run in batch.runs:
                    key = (run.trace_id, run.span_id)
                    if key in new_keys and owner[key] == index:
                        group.runs.append(run)
                for step in steps:
                    key = (step.trace_id, step.span_id)
                    if key in new_keys and owner[key] == index and key not in step_keys:
                        step_keys.add(key)
                        group.steps.append(step)
                        group.step_jobs.append(index)
            for step in batch.steps:
                key = (step.trace_id, step.span_id)
                if key in batch.released and handed_off.get(key) == index:
                    del handed_off[key]
                    group.steps.append(step)
                    group.step_jobs.append(index)
            for stop_row in batch.stops:
                key = (stop_row.trace_id, stop_row.span_id)
                skey = (*key, stop_row.run_id)
                if key in new_keys and owner[key] == index and skey not in stop_keys:
                    stop_keys.add(skey)
                    group.stops.append(stop_row)
                    group.stop_jobs.append(index)
            group.canaries.update(batch.canary_run_ids)

        self._load_runs(group)
        anomalies, deciding = merge_stops(group)
        stop_job = {run_id: job for run_id, _, job in deciding}
        self.decide(group, [(run_id, reason) for run_id, reason, _ in deciding], stop_job)
        merge_rows(group)
        self.write_rows(group, anomalies)

        outcomes = []
        for index, keys in enumerate(job_keys):
            if everything_new:
                mine = frozenset(keys)
            else:
                mine = frozenset(k for k in keys if k in new_keys and owner[k] == index)
            outcomes.append((len(keys), mine, tuple(group.counted_by_job.get(index, ()))))
        return outcomes

    def _hand_off(
        self, batches: list[MappedBatch], new_keys: set[tuple[str, str]], owner: Mapping[Any, int]
    ) -> dict[tuple[str, str], int]:
        """Store the group's new pending steps, and take out those released or discarded
        (earlier groups' from ``pending_steps``, in this transaction).

        Returns:
            Span key of each released step whose pending row this group takes out -> the
            index of the request that released it (a step released twice is stored once).
        """
        held: dict[tuple[str, str], tuple[StepRow, str]] = {}
        released: dict[tuple[str, str], int] = {}
        gone: set[tuple[str, str]] = set()
        for index, batch in enumerate(batches):
            for row, parent in batch.pending:
                key = (row.trace_id, row.span_id)
                if key in new_keys and owner[key] == index:
                    held[key] = (row, parent)
            for key in [*batch.released, *((s.trace_id, s.span_id) for s in batch.discarded)]:
                if held.pop(key, None) is not None:
                    if key in batch.released:
                        released.setdefault(key, index)
                elif key not in released:
                    gone.add(key)
                    if key in batch.released:
                        released[key] = index
        if gone:
            found = self._insert(
                "pending_gone",
                ("trace_id", "span_id"),
                sorted(gone),
                "DELETE FROM pending_steps p USING {t} k WHERE p.trace_id = k.trace_id "
                "AND p.span_id = k.span_id RETURNING p.trace_id, p.span_id",
            )
            stored = {(t, s) for t, s in found}
            released = {k: i for k, i in released.items() if k not in gone or k in stored}
        if held:
            self._insert(
                "pending",
                ("trace_id", "span_id", "parent_span_id", "row", "received_unix_nano"),
                [
                    (*key, parent, json.dumps(_STEP_VALUES(row)), self._now_ns)
                    for key, (row, parent) in held.items()
                ],
                "INSERT INTO pending_steps SELECT * FROM {t}",
            )
        return released

    def _insert(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], sql: str
    ) -> list[tuple[Any, ...]]:
        view = f"_lw_{name}"
        # A capsule is scanned once: each ``sql`` here reads the view once.
        self._con.register(view, _table(columns, rows).__arrow_c_stream__())
        try:
            return self._con.execute(sql.format(t=view)).fetchall()
        finally:
            self._con.unregister(view)

    def _append(self, table: str, data: ArrowColumns) -> None:
        """Append ``data`` (columns in the table's order) to ``table``.

        Through a relation (``from_arrow(...).insert_into``): about 1 ms less CPU per
        statement than registering a view, executing SQL over it and unregistering it
        (measured here, DuckDB 1.5; a group writes five to seven such tables). DuckDB
        is handed the stream's capsule, not ``data`` (:class:`~.arrow.ArrowColumns`).
        """
        self._con.from_arrow(data.__arrow_c_stream__()).insert_into(table)

    def _claim_keys(self, owner: dict[tuple[str, str], int], now_ns: int) -> set[tuple[str, str]]:
        by_int: dict[int, tuple[str, str]] = {}
        for key in owner:
            span, trace = span_key(*key)
            by_int.setdefault((span << 64) | trace, key)
        fresh = self._recent.unseen(by_int)
        if not fresh:
            return set()
        self._append(
            "spans_seen",
            ArrowColumns(
                ("span_key", "trace_key", "seen_unix_nano"),
                [
                    column([k >> 64 for k in fresh], UINT64),
                    column([k & _MASK64 for k in fresh], UINT64),
                    column([now_ns] * len(fresh), INT64),
                ],
                len(fresh),
            ),
        )
        self.after_commit.append(lambda: self._recent.add(fresh, now_ns))
        return {by_int[k] for k in fresh}

    def fetch_runs(self, where: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        rows = self._con.execute(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE {where}", list(params)
        ).fetchall()
        return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in rows]

    def _load_runs(self, group: Group) -> None:
        run_ids = {r.run_id for r in group.runs}
        run_ids.update(s.run_id for s in group.steps)
        run_ids.update(s.run_id for s in group.stops)
        if not run_ids:
            return
        keys = sorted({run_key_of(r) for r in run_ids})
        maybe_stored = self._stored_runs.may_contain(keys)
        keys = [k for k, maybe in zip(keys, maybe_stored, strict=True) if maybe]
        for row in self.fetch_stored(keys, group.now_ns):
            self.adopt(group, row)

    def fetch_stored(self, keys: Sequence[int], now_ns: int) -> list[dict[str, Any]]:
        """The stored rows of the run keys ``keys`` (one each: the writer's rule), read in tiers.

        ``runs`` has no key index (schema 21: an ART index grows in memory with every
        stored run). Rows are appended in write order and every write of a run sets
        ``last_seen_unix_nano`` to the writer's clock, so a run written a moment ago sits
        in the newest row groups. Each tier of :data:`FETCH_TIERS_SECONDS` asks only for the
        keys not found yet, bounded below by ``now_ns`` minus the tier, and DuckDB's zone
        maps skip the older row groups; the last tier has no bound, so every stored row is
        found whatever the clock did. Keys the Bloom filter lets through are mostly runs
        still in progress, found by the first tier; a key reaches the unbounded scan only
        when its run was last written over half an hour ago, or when it is one of the
        filter's false positives.
        """
        rows: list[dict[str, Any]] = []
        remaining = set(keys)
        for tier in (*FETCH_TIERS_SECONDS, None):
            if not remaining:
                break
            where = f"run_key IN ({key_list(sorted(remaining))})"
            params: list[Any] = []
            if tier is not None:
                where = f"last_seen_unix_nano >= ? AND {where}"
                params.append(now_ns - int(tier * _NS))
            else:
                self.whole_table_reads += 1
            found = self.fetch_runs(where, params)
            rows.extend(found)
            remaining.difference_update(row["run_key"] for row in found)
        return rows

    @staticmethod
    def adopt(group: Group, row: dict[str, Any]) -> None:
        run_id = row["run_id"]
        group.merged[run_id] = row
        group.existing.add(run_id)
        seen = row["last_seen_unix_nano"]
        if group.stored_since is None or seen < group.stored_since:
            group.stored_since = seen
        if row["sampled"] is None:
            group.staged_in_db.add(run_id)

    def decide(
        self,
        group: Group,
        runs: Sequence[tuple[str, str | None]],
        stop_job: Mapping[str, int] | None = None,
    ) -> None:
        """Decide sampling for ``runs`` (``(run_id, stop reason)``; ``None``: timed out).

        The cap's tool is the run's most called tool among the calls stored before its
        decision: earlier groups' (``staged_steps``), and
        this group's from the requests up to the one that carried the run's stop
        (``stop_job``; all of them when the run is not in it), so a group decides as its
        requests would one by one. The quota counts the group's earlier decisions
        (:meth:`_write_rows` stores it).
        """
        if not runs:
            return
        ids = [r for r, _ in runs]
        tallies: dict[str, dict[str, int]] = {r: {} for r in ids}
        for step, job in zip(group.steps, group.step_jobs, strict=True):
            if step.kind != KIND_TOOL_RESULT:
                continue
            tally = tallies.get(step.run_id)
            if tally is None:
                continue
            last = stop_job.get(step.run_id) if stop_job is not None else None
            if last is None or job <= last:
                name = step.tool or ""
                tally[name] = tally.get(name, 0) + 1
        staged_keys = {run_key_of(r): r for r in ids if r in group.staged_in_db}
        if staged_keys:
            rows = self._con.execute(
                "SELECT run_key, COALESCE(tool, ''), count(*) FROM staged_steps "
                f"WHERE run_key IN ({key_list(staged_keys)}) AND kind = ? GROUP BY ALL",
                [KIND_TOOL_RESULT],
            ).fetchall()
            for key, tool, calls in rows:
                tally = tallies[staged_keys[int(key)]]
                tally[tool] = tally.get(tool, 0) + int(calls)
        if group.quota is None:
            hour = hour_bucket(group.now_ns / _NS)
            if hour != self._quota_hour:
                self._quota_hour = None
                self._quota = {
                    (reason, tool): kept
                    for reason, tool, kept in self._con.execute(
                        "SELECT stop_reason, tool, max(kept) FROM sample_quota "
                        "WHERE hour_unix = ? GROUP BY ALL",
                        [hour],
                    ).fetchall()
                }
                self._quota_hour = hour
            group.quota = dict(self._quota)
        quota = group.quota
        for run_id, reason in runs:
            tally = tallies[run_id]
            tool = min(tally, key=lambda t: (-tally[t], t)) if tally else ""
            quota_reason = reason if reason is not None else NO_STOP_REASON
            decision = self._sampler.decide(
                run_id=run_id, stop_reason=reason, kept_this_hour=quota.get((quota_reason, tool), 0)
            )
            if decision.sampled:
                quota[(quota_reason, tool)] = quota.get((quota_reason, tool), 0) + 1
                group.quota_changed.add((quota_reason, tool))
            group.merged[run_id].update(
                sampled=decision.sampled,
                sample_rule=decision.rule,
                sample_tool=tool,
                decided_unix_nano=group.now_ns,
            )
            group.settle.add(run_id)

    def _publish_quota(self, hour: int, quota: dict[tuple[str, str], int]) -> None:
        if self._quota_hour == hour:
            self._quota = quota

    def write_rows(self, group: Group, anomalies: list[StopRow]) -> None:
        now_ns = group.now_ns
        quota = group.quota
        if quota is not None and group.quota_changed:
            hour = hour_bucket(now_ns / _NS)
            # A few rows: bound parameters cost half of an Arrow view here.
            totals = [(hour, r, t, quota[(r, t)]) for r, t in sorted(group.quota_changed)]
            self._con.execute(
                "INSERT INTO sample_quota VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(totals)),
                [value for row in totals for value in row],
            )
            self.after_commit.append(lambda: self._publish_quota(hour, quota))
        if group.existing:
            # Bounded by the rows as read (adopt), so zone maps skip older row groups.
            keys = key_list(group.merged[r]["run_key"] for r in group.existing)
            self._con.execute(
                f"DELETE FROM runs WHERE last_seen_unix_nano >= ? AND run_key IN ({keys})",
                [group.stored_since],
            )
        runs = [[row[c] for c in RUN_COLUMNS] for row in group.merged.values()]
        if runs:
            self._append("runs", _table(RUN_COLUMNS, runs))
            # Before the commit: a key of a group that then rolls back is only a false
            # positive, while a key missing from the filter would duplicate its run.
            # Rows read back from the table are in the filter already.
            self._stored_runs.add(
                row["run_key"]
                for run_id, row in group.merged.items()
                if run_id not in group.existing
            )
        staged: list[StepRow] = []
        kept: list[StepRow] = []
        for step in group.steps:
            sampled = group.merged[step.run_id]["sampled"]
            if sampled is None:
                staged.append(step)
            elif sampled:
                kept.append(step)
        for table, rows in (("staged_steps", staged), ("steps", kept)):
            if rows:
                self._append(table, _step_table(rows, group.merged, now_ns))
        settle = [
            group.merged[r]
            for r in group.settle
            if r in group.staged_in_db and group.merged[r]["sampled"] is not None
        ]
        if settle:
            sampled = key_list(row["run_key"] for row in settle if row["sampled"])
            decided = key_list(row["run_key"] for row in settle)
            self._con.execute(
                f"INSERT INTO steps SELECT * FROM staged_steps WHERE run_key IN ({sampled})"
            )
            self._con.execute(f"DELETE FROM staged_steps WHERE run_key IN ({decided})")
        # Every stop that was its run's primary is kept (``stop_reports``); the views
        # ``stops`` and ``stop_anomalies`` choose the primary by precedence when read.
        reports = [*(s for s, _ in group.replaced), *group.primary]
        if reports:
            self._append(
                "stop_reports",
                _table(
                    STOP_COLUMNS,
                    [
                        _stop_tuple(
                            run_key_of(s.run_id), s, now_ns, group.counted.get(s.run_id) is s
                        )
                        for s in reports
                    ],
                ),
            )
        if anomalies:
            self._append(
                "stop_duplicates",
                _table(
                    ANOMALY_COLUMNS,
                    [_anomaly_tuple(run_key_of(s.run_id), s, now_ns) for s in anomalies],
                ),
            )
        deltas = [
            (key, tool, outcome, n, agent)
            for (key, tool, outcome, agent), n in group.tool_deltas.items()
            if n
        ]
        if deltas:
            self._append(
                "run_tools", _table(("run_key", "tool", "outcome", "calls", "agent"), deltas)
            )
        if group.canaries:
            self._insert(
                "canaries",
                ("run_id", "first_seen_unix_nano"),
                [(c, now_ns) for c in sorted(group.canaries)],
                "INSERT OR IGNORE INTO canary_flags SELECT * FROM {t}",
            )
