"""The lake of fleet mode, read-only, as a :class:`~loopwatch.dashboard.data.DataSource`.

Every collector ships its finished runs to one DuckLake (docs/lake.md); this source reads
that lake through the collector's own :class:`StoreReader` (``lake=True``: the same
queries, time limit and row cap as ``/api/v1`` and the file source), so a team sees every
collector's runs in one dashboard. Its runs carry ``collector_id``, and the runs list
takes a ``collector`` filter (:attr:`~loopwatch.dashboard.data.RunFilter.collector`).

Imported only when a lake is configured (:func:`loopwatch.dashboard.config.open_source`):
with :mod:`~loopwatch.dashboard.file_source`, the dashboard's only DuckDB importers.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from loopwatch.collector.errors import LakeUnavailable
from loopwatch.collector.lake.connect import LakeTarget, connect_lake
from loopwatch.collector.store.reader import StoreReader

from . import data
from .file_source import ReaderSource

__all__ = ["LakeSource"]

COLLECTORS_TTL_SECONDS: Final = 60.0
"""How long the list of collector ids is reused: it changes when a collector is added,
and reading it scans the lake's ``runs``."""


class LakeSource(ReaderSource):
    """The lake, attached read-only (DuckLake over a PostgreSQL or local catalog).

    Args:
        target: the lake's catalog and data path (never written).
        timeout_seconds: time limit per query.
        max_rows: row cap per query.
        memory_limit: DuckDB ``memory_limit`` of the reading connection (None: DuckDB's).

    Raises:
        SourceUnavailable: the extensions do not load, the catalog does not answer
            (``unreachable``), or it holds no loopwatch lake (``not_loopwatch``). Messages
            mask the catalog's password.
    """

    def __init__(
        self,
        target: LakeTarget,
        *,
        timeout_seconds: float = 5.0,
        max_rows: int = 10_000,
        memory_limit: str | None = None,
    ) -> None:
        self.target = target
        self.timeout_seconds = timeout_seconds
        self.max_rows = max_rows
        try:
            connection = connect_lake(target, read_only=True, memory_limit=memory_limit)
        except LakeUnavailable as exc:
            raise data.SourceUnavailable("unreachable", f"Cannot read the lake: {exc}") from None
        self._reader = StoreReader.open_lake(
            connection, timeout_seconds=timeout_seconds, max_rows=max_rows
        )
        self._collectors_lock = threading.Lock()
        self._collectors: tuple[float, list[str]] | None = None
        try:
            self.check()  # the reader's own list query: it fails without the lake's tables
        except data.QueryFailed as exc:
            self.close()
            raise data.SourceUnavailable(
                "not_loopwatch",
                f"The lake {target.describe()} holds no loopwatch tables yet (start a "
                f"collector with --lake to create them): {exc.message}",
            ) from None

    @property
    def description(self) -> str:
        return f"lake {self.target.describe()} (read-only)"

    def collectors(self) -> list[str]:
        """The collector ids of the lake's runs, sorted; reused for
        :data:`COLLECTORS_TTL_SECONDS`."""
        now = time.monotonic()
        with self._collectors_lock:
            cached = self._collectors
        if cached is not None and now - cached[0] < COLLECTORS_TTL_SECONDS:
            return list(cached[1])
        found = super().collectors()
        with self._collectors_lock:
            self._collectors = (now, found)
        return list(found)
