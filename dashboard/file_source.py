"""A loopwatch DuckDB file, opened read-only, as a :class:`~loopwatch.dashboard.data.DataSource`.

For when no collector runs (a file copied from an incident opens too). The file is read
through the collector's own :class:`StoreReader` and :mod:`loopwatch.collector.store.reader`,
the functions the read API serves, with the same time limit and row cap, so both sources
tell the same story.

:class:`ReaderSource` is what a file and the lake (:mod:`loopwatch.dashboard.lake_source`)
share: the pages' reads through one :class:`StoreReader`. This module and the lake source
are the dashboard's only modules that import DuckDB or the collector; they are imported
when a file or a lake is opened (:func:`loopwatch.dashboard.config.open_source`), so the
API mode needs neither.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Unpack

import duckdb
from loopwatch.collector.errors import ReadTimeout

# The collector's read side, named here only: the one place to repoint when it moves.
from loopwatch.collector.store import aggregates
from loopwatch.collector.store import reader as queries
from loopwatch.collector.store.reader import StoreReader
from loopwatch.collector.store.schema import STEP_FIELDS, key_list, run_key_of

from . import data, frames

__all__ = ["DuckDBSource", "ReaderSource"]


class ReaderSource:
    """The pages' reads through a :class:`StoreReader` (a file's or the lake's).

    Subclasses open the reader and set :attr:`description`; errors of every read are
    :class:`~loopwatch.dashboard.data.QueryFailed`.
    """

    _reader: StoreReader

    @property
    def description(self) -> str:
        raise NotImplementedError

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a reader method, mapping its errors to :class:`QueryFailed`."""
        try:
            return fn(*args, **kwargs)
        except ReadTimeout as exc:
            raise data.QueryFailed("query_timeout", str(exc)) from None
        except duckdb.Error as exc:
            raise data.QueryFailed("database_error", f"The database failed: {exc}") from None
        except ValueError as exc:
            raise data.QueryFailed("bad_parameter", str(exc)) from None

    def check(self) -> None:
        """Read one run through the reader's public list query.

        Raises:
            QueryFailed: the source has no loopwatch tables, or the query failed.
        """
        self._call(self._reader.list_runs, limit=1)

    def collectors(self) -> list[str]:
        """The collector ids whose runs the source holds (``[]`` for a local file)."""
        return list(self._call(self._reader.collectors))

    def runs(self, filters: data.RunFilter, *, limit: int = 50, offset: int = 0) -> data.RunsPage:
        page = self._call(self._reader.list_runs, **filters.given(), limit=limit, offset=offset)
        # The same stop summary the read API's list attaches (steps_since_progress,
        # observe_reason, loop_tool), so both sources list the same columns.
        items = self._call(queries.attach_stop_summary, self._reader, page.items)
        return data.RunsPage(frames.runs_frame(items), offset, page.next_offset)

    def run(self, run_id: str) -> data.RunData | None:
        detail = self._call(self._reader.get_run, run_id)
        if detail is None:
            return None
        seen = detail.run.get("first_seen_unix_nano")
        extra = self._call(queries.run_extra, self._reader, run_id, first_seen_unix_nano=seen)
        if extra is not None:
            detail.run.update(extra)
        # The reader's detail has the fields of the read API's body (a shallow copy: the
        # steps list can hold 10,000 rows).
        body = {f.name: getattr(detail, f.name) for f in fields(detail)}
        return frames.run_data(body, detail.run.get("limits"))

    def overview(self, **query: Unpack[data.OverviewQuery]) -> data.Overview:
        # The collector's aggregates are the read API's /api/v1/stats body, field by field.
        stats = self._call(aggregates.stats, self._reader, **query)
        return frames.overview_from_stats(asdict(stats))

    def tools(self, *, since_unix_nano: int, until_unix_nano: int) -> data.ToolsData:
        window = {"since_unix_nano": since_unix_nano, "until_unix_nano": until_unix_nano}
        rows, truncated = self._call(aggregates.tools, self._reader, **window)
        loops, loops_truncated = self._call(aggregates.loops_by_tool, self._reader, **window)
        return data.ToolsData(
            frames.tools_frame(rows),
            frames.loops_frame(loops),
            frames.TRUNCATED_NOTE if truncated or loops_truncated else None,
        )

    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Every stored step of ``run_ids`` in ONE query (Policy replay reads 500 runs;
        one :meth:`run` each took 40 s), as ``{run_id: rows in step order}``.

        Rows have the fields of :meth:`run`'s steps; at most
        ``max_rows`` x :data:`STEPS_OF_RUNS_CAP_FACTOR` rows in all: a run the cap cuts
        is left out whole. A run without stored steps is absent.

        Raises:
            QueryFailed: the query failed or ran past its time limit.
        """
        found: dict[str, list[dict[str, Any]]] = self._call(
            read_steps_of_runs, self._reader, list(run_ids)
        )
        return found

    def close(self) -> None:
        self._reader.close()


class DuckDBSource(ReaderSource):
    """A loopwatch DuckDB file opened read-only (no collector running).

    The file is opened once, read-only, through :class:`StoreReader` (the collector's own
    read helpers: same queries, time limit and row cap as the read API), with the read
    API's other queries from :mod:`loopwatch.collector.store.reader`.

    Args:
        path: the DuckDB file.
        timeout_seconds: time limit per query.
        max_rows: row cap per query.

    Raises:
        SourceUnavailable: the file is missing, held by a writer (a running collector), or
            not a loopwatch database.
    """

    def __init__(
        self, path: str | Path, *, timeout_seconds: float = 5.0, max_rows: int = 10_000
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise data.SourceUnavailable(
                "missing",
                f"No database file at {self.path}. Pass the collector's --db file, or read "
                "through a running collector with --collector URL.",
            )
        try:
            connection = duckdb.connect(str(self.path), read_only=True)
        except duckdb.Error as exc:
            raise _open_error(self.path, exc) from None
        self._connection: duckdb.DuckDBPyConnection | None = connection
        self._lock = threading.Lock()
        self.timeout_seconds = timeout_seconds
        self.max_rows = max_rows
        # Same as StoreReader.open_readonly, keeping the connection for the queries below.
        self._reader = StoreReader(
            self._cursor, timeout_seconds=timeout_seconds, max_rows=max_rows, owned=connection
        )
        try:
            # The reader's own list query: it fails on a file without loopwatch's tables.
            self.check()
        except data.QueryFailed:
            self.close()
            raise data.SourceUnavailable(
                "not_loopwatch",
                f"{self.path} is a DuckDB file but not a loopwatch database "
                "(no loopwatch runs table).",
            ) from None

    @property
    def description(self) -> str:
        return f"database file {self.path} (read-only)"

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._connection is None:
                raise data.SourceUnavailable("unreadable", f"{self.path} was closed.")
            return self._connection.cursor()

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


STEPS_OF_RUNS_CAP_FACTOR = 20
"""Row cap of :func:`read_steps_of_runs`, in units of the per-query cap (10,000 rows by
default: 200,000 steps, 500 runs of 400 steps)."""


def read_steps_of_runs(
    reader: StoreReader, run_ids: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """:meth:`DuckDBSource.steps_of_runs` over a reader (committed and staged steps, as
    the reader's ``get_run`` reads them), in the style of the reader's module functions.

    Keys are rendered as a literal list (:func:`~loopwatch.collector.store.schema.
    key_list`: index lookups); only ints computed here are rendered, never client text.
    """
    wanted = {run_key_of(r): r for r in dict.fromkeys(run_ids)}
    if not wanted:
        return {}
    keys = key_list(wanted)
    columns = ", ".join(STEP_FIELDS)
    # The lake holds kept steps only (no staging table there).
    staged = (
        ""
        if reader.lake
        else f" UNION ALL SELECT run_key, {columns} FROM staged_steps WHERE run_key IN ({keys})"
    )
    rows, truncated = reader._query(
        f"SELECT run_key, {columns} FROM (SELECT run_key, {columns} FROM steps "
        f"WHERE run_key IN ({keys}){staged}) "
        # get_run's order, ascending (its DESC NULLS FIRST, reversed).
        "ORDER BY run_key, step NULLS LAST, start_unix_nano, kind, span_id",
        [],
        max_rows=reader.max_rows * STEPS_OF_RUNS_CAP_FACTOR,
    )
    found: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        run_id = wanted.get(row.pop("run_key"))
        # A key collision between two ids (64-bit blake2b) is checked, not assumed away.
        if run_id is not None and row.get("run_id") == run_id:
            found.setdefault(run_id, []).append(row)
    if truncated and found:
        # The cap cut the last run's steps: a partial run would replay wrongly.
        del found[next(reversed(found))]
    return found


def _open_error(path: Path, exc: Exception) -> data.SourceUnavailable:
    text = str(exc)
    if "lock" in text.lower():
        return data.SourceUnavailable(
            "locked",
            f"{path} is open for writing by another process (a running collector?). "
            "Read through that collector with --collector URL, or open a copy of the file.",
        )
    return data.SourceUnavailable(
        "unreadable", f"Cannot open {path} as a DuckDB database: {text.splitlines()[0][:200]}"
    )
