"""Fill a lake straight from a collector's local file, as a shipper would have.

For the read side's tests and benchmark (the shipper is not needed to read a lake): each
lake table (:data:`~loopwatch.collector.lake.schema.LAKE_TABLES`) gets the rows of the
local table of its name (``stops``: the local ``stops`` view, the primary stop of each
run; ``run_tools``: with ``run_id`` joined from ``runs``), plus ``collector_id`` from a
SQL expression over ``run_id`` and one ``shipped_unix_nano``, in one lake transaction.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from loopwatch.collector.lake.schema import LAKE_TABLES, ensure_lake_schema

__all__ = ["copy_to_lake"]


def _source(table: str) -> str:
    if table == "run_tools":  # the local table has no run_id: the lake's joins on it
        return "(SELECT t.*, r.run_id FROM src.run_tools t JOIN src.runs r USING (run_key))"
    return f"src.{table}"


def copy_to_lake(
    con: Any,
    local_db: Path,
    *,
    collector_sql: str = "'collector-a'",
    order_by: dict[str, str] | None = None,
    where: str | None = None,
    shipped_unix_nano: int | None = None,
) -> dict[str, int]:
    """Copy every run of ``local_db`` into the lake attached to ``con`` as ``lake``.

    Args:
        con: a DuckDB connection with the lake attached read-write
            (:func:`~loopwatch.collector.lake.connect.connect_lake`).
        local_db: a collector's DuckDB file (closed, or a copy).
        collector_sql: the ``collector_id`` of a row, SQL over its ``run_id``.
        order_by: per lake table, an ``ORDER BY`` for the rows as written (their layout
            in the Parquet files).
        where: only the rows matching this SQL condition over ``run_id`` (one batch).
        shipped_unix_nano: the batch's shipping time; default now.

    Returns:
        rows written per table.
    """
    ensure_lake_schema(con)
    con.execute(f"ATTACH '{local_db}' AS src (READ_ONLY)")
    shipped = time.time_ns() if shipped_unix_nano is None else shipped_unix_nano
    written: dict[str, int] = {}
    try:
        con.execute("BEGIN TRANSACTION")
        for table, columns in LAKE_TABLES.items():
            names = ", ".join(name for name, _ in columns)
            order = (order_by or {}).get(table)
            sql = (
                f"INSERT INTO lake.{table} SELECT {names}, {collector_sql} AS collector_id, "
                f"{shipped}::BIGINT FROM {_source(table)}"
            )
            if where:
                sql += f" WHERE {where}"
            if order:
                sql += f" ORDER BY {order}"
            row = con.execute(sql).fetchone()
            written[table] = int(row[0]) if row else 0
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        con.execute("DETACH src")
    return written
