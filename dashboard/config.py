"""Where the dashboard reads from, and opening that source.

The Streamlit process learns its source from its environment (set by
:func:`loopwatch.dashboard.cli.run_dashboard`); :func:`open_source` opens the
:class:`~loopwatch.dashboard.file_source.DuckDBSource` only when a file is given and the
:class:`~loopwatch.dashboard.lake_source.LakeSource` only when a lake is, so the API mode
imports neither DuckDB nor the collector.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .api_source import ApiSource
from .data import DEFAULT_COLLECTOR_URL, DataSource, SourceUnavailable

__all__ = ["SourceConfig", "collectors_of", "open_source"]


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """Where the dashboard reads from (environment of the Streamlit process).

    Attributes:
        collector_url: the collector's read API (default when no database is given).
        db: a DuckDB file to open read-only instead.
        token_file: file holding the collector's bearer token.
        lake / lake_data: a DuckLake catalog and its data path (fleet mode, docs/lake.md)
            to read instead; both or neither.
    """

    collector_url: str | None = None
    db: str | None = None
    token_file: str | None = None
    lake: str | None = None
    lake_data: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SourceConfig:
        """Read ``LOOPWATCH_DASHBOARD_COLLECTOR``, ``_DB``, ``_TOKEN_FILE``, ``_LAKE`` and
        ``_LAKE_DATA``."""
        return cls(
            collector_url=environ.get("LOOPWATCH_DASHBOARD_COLLECTOR") or None,
            db=environ.get("LOOPWATCH_DASHBOARD_DB") or None,
            token_file=environ.get("LOOPWATCH_DASHBOARD_TOKEN_FILE") or None,
            lake=environ.get("LOOPWATCH_DASHBOARD_LAKE") or None,
            lake_data=environ.get("LOOPWATCH_DASHBOARD_LAKE_DATA") or None,
        )

    @property
    def key(self) -> str:
        """A cache key naming the source (no secret in it: a lake catalog, which may hold
        a password, is named by its digest)."""
        if self.lake:
            digest = hashlib.sha256(self.lake.encode("utf-8", "surrogatepass")).hexdigest()
            return f"lake:{digest[:16]}:{self.lake_data or ''}"
        if self.db:
            return f"db:{self.db}"
        return f"api:{self.collector_url or DEFAULT_COLLECTOR_URL}:{self.token_file or ''}"


def open_source(
    *,
    collector_url: str | None = None,
    db: str | None = None,
    token_file: str | None = None,
    lake: str | None = None,
    lake_data: str | None = None,
) -> DataSource:
    """Open the configured source: a lake, else ``db``, else the collector (default URL).

    Raises:
        SourceUnavailable: the database or the lake cannot be opened, or the token file
            is unreadable.
        ValueError: more than one of ``collector_url``, ``db`` and ``lake`` given, a lake
            without its data path (or the reverse), or a malformed URL.
    """
    if sum(bool(v) for v in (collector_url, db, lake)) > 1:
        raise ValueError("give one of a collector URL, a database file or a lake")
    if bool(lake) != bool(lake_data):
        raise ValueError("a lake needs both its catalog and its data path")
    if lake and lake_data:
        from loopwatch.collector.lake.connect import LakeTarget

        from .lake_source import LakeSource

        return LakeSource(LakeTarget(lake, lake_data))
    if db:
        from .file_source import DuckDBSource

        return DuckDBSource(db)
    token = None
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SourceUnavailable(
                "unauthorized", f"Cannot read the token file {token_file}: {exc.strerror}."
            ) from None
    return ApiSource(collector_url or DEFAULT_COLLECTOR_URL, token)


def collectors_of(source: DataSource) -> list[str]:
    """The collector ids whose runs ``source`` holds, sorted; ``[]`` for a source without
    them (a collector's API or its file: one collector, no ``collector_id``).

    Raises:
        SourceUnavailable / QueryFailed: the source failed.
    """
    collectors = getattr(source, "collectors", None)
    return list(collectors()) if callable(collectors) else []
