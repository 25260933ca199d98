"""Fold a trace-level fragment into its trace's run, so a trace split over two collectors
is one run in the lake (docs/lake.md, "Routing third-party spans").

Called by the shipper (:mod:`loopwatch.collector.lake.ship`) inside its locked lake
transaction, before a batch is inserted. It rewrites lake rows (UPDATE, DELETE), which
DuckLake conflicts with a concurrent INSERT into the same table, and which a concurrent
file merge undoes: every lake writer, housekeeping's merge included, holds the ship lock.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Final

from .connect import ALIAS
from .schema import BATCH_TABLES, LAKE_TABLES, lake_columns, views

if TYPE_CHECKING:
    import duckdb

__all__ = ["fold_fragments"]

_log = logging.getLogger("loopwatch.collector.lake")
_NS: Final = 1_000_000_000


def _own(table: str) -> str:
    return ", ".join(name for name, _ in LAKE_TABLES[table])


_FRAGMENT: Final = (
    "{t}.run_id = {t}.trace_id AND {t}.source <> 'loopwatch' AND {t}.stop_reason IS NULL "
    "AND {t}.run_span_id IS NULL"
)
"""A trace-level fragment: the run a collector makes (run id = trace id) from a
third-party trace's spans whose agent span it never saw, with no stop and no run span
(docs/lake.md, "Routing third-party spans")."""

_FOLD_WINDOW_NS: Final = 86_400 * _NS
"""A fragment and its trace's run are looked for among lake runs starting within a day
of each other: DuckLake prunes data files by their ``start_unix_nano`` range, so the
look-up does not scan the whole lake. A trace longer than that is not folded."""


def _fragment(alias: str) -> str:
    return _FRAGMENT.format(t=alias)


_SOURCE: Final = "loopwatch_fold_source"
_RUNS: Final = BATCH_TABLES["runs"]
_STEPS: Final = BATCH_TABLES["steps"]
_TOOLS: Final = BATCH_TABLES["run_tools"]
_FLAGS: Final = BATCH_TABLES["canary_flags"]


def fold_fragments(
    con: duckdb.DuckDBPyConnection, tables: dict[str, Any], collector_id: str, shipped_ns: int
) -> list[int]:
    """Make a trace split over two collectors ONE run in the lake (inside the caller's
    locked lake transaction, before the batch is inserted).

    The rule: a trace-level fragment (:data:`_FRAGMENT`) is folded into the run of the
    same trace that has its own run id (the root-most: no parent run, then the
    earliest), whichever ships first:

    - a fragment in the lake, and a run of its trace arrives: the fragment's steps,
      tool counts and canary flag are re-keyed to the arriving run and its run row is
      deleted;
    - a fragment arrives, and a run of its trace is in the lake (or in this batch):
      its steps (those not in the lake yet, by ``(trace_id, span_id)``), tool counts
      and canary flag are inserted under that run's key and id; its run row is not.

    Spans reach one collector each, so the folded steps and tool counts add to the
    run's without counting any span twice; a fragment has no stop, so the run's stop
    stays the only one. Re-shipping after a crash folds nothing twice: a fragment
    whose steps are in the lake already was folded by the committed attempt.

    Args:
        con: the lake connection, inside the locked lake transaction.
        tables: the batch's rows to insert (:class:`~loopwatch.collector.lake.ship.
            LakeBatch` arrays).
        collector_id: written with folded rows.
        shipped_ns: written with folded rows.

    Returns:
        The batch's fragment run keys that were folded (not to be inserted).
    """
    with views(con, {"runs": tables["runs"]}):
        has = con.execute(
            f"SELECT count(*) FILTER ({_fragment('r')}), "
            "count(*) FILTER (source <> 'loopwatch' AND run_id <> trace_id), "
            f"min(start_unix_nano), max(start_unix_nano) FROM {_RUNS} r"
        ).fetchone()
    assert has is not None
    fragments, agent_runs, low, high = has
    if not fragments and not agent_runs:
        return []
    window = (
        f"l.start_unix_nano BETWEEN {int(low or 0) - _FOLD_WINDOW_NS} "
        f"AND {int(high or 0) + _FOLD_WINDOW_NS}"
    )
    if not fragments:
        with views(con, {"runs": tables["runs"]}):
            _replace_lake_fragments(con, window)
        return []
    # A fragment in the batch (rare: a trace split over collectors): its statements read
    # the batch's tables more than once, so they become temporary tables for the fold.
    used = ("runs", "steps", "run_tools", "canary_flags")
    for table in used:
        con.register(_SOURCE, tables[table].__arrow_c_stream__())
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {BATCH_TABLES[table]} AS FROM {_SOURCE}")
        finally:
            con.unregister(_SOURCE)
    try:
        if agent_runs:
            _replace_lake_fragments(con, window)
        return _fold_batch_fragments(con, window, collector_id, shipped_ns)
    finally:
        # After a failed statement the transaction is aborted and the drop fails too;
        # the caller's rollback removes the tables, and the first error is the one raised.
        for table in used:
            with contextlib.suppress(Exception):
                con.execute(f"DROP TABLE IF EXISTS {BATCH_TABLES[table]}")


def _replace_lake_fragments(con: duckdb.DuckDBPyConnection, window: str) -> None:
    """Fragments already in the lake, whose trace's run arrives in this batch."""
    pairs = con.execute(
        f"SELECT l.run_key, l.run_id, a.run_key, a.run_id FROM {ALIAS}.runs l "
        f"JOIN (SELECT trace_id, run_key, run_id FROM {_RUNS} r "
        f"WHERE source <> 'loopwatch' AND NOT ({_fragment('r')}) "
        "QUALIFY row_number() OVER (PARTITION BY trace_id "
        "ORDER BY parent_run_id IS NOT NULL, start_unix_nano, run_key) = 1) a "
        f"USING (trace_id) WHERE {window} AND {_fragment('l')}"
    ).fetchall()
    for old_key, old_id, new_key, new_id in pairs:
        for table in ("steps", "run_tools"):
            con.execute(
                f"UPDATE {ALIAS}.{table} SET run_key = {int(new_key)}, run_id = ? "
                f"WHERE run_key = {int(old_key)}",
                [new_id],
            )
        con.execute(
            f"UPDATE {ALIAS}.canary_flags SET run_id = ? WHERE run_id = ?", [new_id, old_id]
        )
        con.execute(f"DELETE FROM {ALIAS}.runs WHERE run_key = {int(old_key)}")
        _log.info("lake: trace-level fragment %s folded into run %s", old_id, new_id)


def _fold_batch_fragments(
    con: duckdb.DuckDBPyConnection, window: str, collector_id: str, shipped_ns: int
) -> list[int]:
    """This batch's fragments whose trace's run is in the lake or in this batch."""
    pairs = con.execute(
        f"SELECT f.run_key, f.run_id, t.run_key, t.run_id FROM {_RUNS} f JOIN ("
        f"SELECT trace_id, run_key, run_id FROM (SELECT trace_id, run_key, run_id, "
        f"parent_run_id, start_unix_nano FROM {ALIAS}.runs l WHERE {window} "
        f"AND NOT ({_fragment('l')}) AND trace_id IN (SELECT trace_id FROM {_RUNS} r "
        f"WHERE {_fragment('r')}) UNION ALL SELECT trace_id, run_key, run_id, "
        f"parent_run_id, start_unix_nano FROM {_RUNS} r WHERE NOT ({_fragment('r')})) "
        "QUALIFY row_number() OVER (PARTITION BY trace_id "
        "ORDER BY parent_run_id IS NOT NULL, start_unix_nano, run_key) = 1) t "
        f"USING (trace_id) WHERE {_fragment('f')}"
    ).fetchall()
    if not pairs:
        return []
    steps_cols = ", ".join(name for name, _ in lake_columns("steps"))
    tools_cols = ", ".join(name for name, _ in lake_columns("run_tools"))
    for _, old_id, new_key, new_id in pairs:
        new = int(new_key)
        # Witness of an earlier committed fold (a crash before the local mark): the
        # fragment's spans are in the lake already.
        seen = con.execute(
            f"SELECT count(*) FROM {ALIAS}.steps l WHERE l.trace_id = ? AND {window} "
            f"AND l.span_id IN (SELECT span_id FROM {_STEPS} WHERE run_id = ?)",
            [old_id, old_id],
        ).fetchone()
        if seen is not None and int(seen[0]) > 0:
            continue
        con.execute(
            f"INSERT INTO {ALIAS}.steps ({steps_cols}) SELECT * REPLACE "
            f"({new}::UBIGINT AS run_key, ? AS run_id), ?, ? FROM (SELECT {_own('steps')} "
            f"FROM {_STEPS} WHERE run_id = ?)",
            [new_id, collector_id, shipped_ns, old_id],
        )
        con.execute(
            f"INSERT INTO {ALIAS}.run_tools ({tools_cols}) SELECT * REPLACE "
            f"({new}::UBIGINT AS run_key, ? AS run_id), ?, ? FROM (SELECT "
            f"{_own('run_tools')} FROM {_TOOLS} WHERE run_id = ?)",
            [new_id, collector_id, shipped_ns, old_id],
        )
        con.execute(
            f"INSERT INTO {ALIAS}.canary_flags SELECT ?, first_seen_unix_nano, ?, ? "
            f"FROM {_FLAGS} WHERE run_id = ? AND NOT EXISTS (SELECT 1 FROM "
            f"{ALIAS}.canary_flags WHERE run_id = ?)",
            [new_id, collector_id, shipped_ns, old_id, new_id],
        )
        _log.info("lake: trace-level fragment %s folded into run %s", old_id, new_id)
    return [int(old_key) for old_key, *_ in pairs]
