"""Where the dashboard reads from, and opening that source.

The Streamlit process learns its source from its environment (set by
:func:`loopwatch.dashboard.cli.run_dashboard`); :func:`open_source` opens the
:class:`~loopwatch.dashboard.file_source.DuckDBSource` only when a file is given, so the
API mode imports neither DuckDB nor the collector.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .api_source import ApiSource
from .data import DEFAULT_COLLECTOR_URL, DataSource, SourceUnavailable

__all__ = ["SourceConfig", "open_source"]


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """Where the dashboard reads from (environment of the Streamlit process).

    Attributes:
        collector_url: the collector's read API (default when no database is given).
        db: a DuckDB file to open read-only instead.
        token_file: file holding the collector's bearer token.
    """

    collector_url: str | None = None
    db: str | None = None
    token_file: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SourceConfig:
        """Read ``LOOPWATCH_DASHBOARD_COLLECTOR``, ``_DB`` and ``_TOKEN_FILE``."""
        return cls(
            collector_url=environ.get("LOOPWATCH_DASHBOARD_COLLECTOR") or None,
            db=environ.get("LOOPWATCH_DASHBOARD_DB") or None,
            token_file=environ.get("LOOPWATCH_DASHBOARD_TOKEN_FILE") or None,
        )

    @property
    def key(self) -> str:
        """A cache key naming the source (no secret in it)."""
        if self.db:
            return f"db:{self.db}"
        return f"api:{self.collector_url or DEFAULT_COLLECTOR_URL}:{self.token_file or ''}"


def open_source(
    *,
    collector_url: str | None = None,
    db: str | None = None,
    token_file: str | None = None,
) -> DataSource:
    """Open the configured source: ``db`` wins; else the collector (default URL).

    Raises:
        SourceUnavailable: the database cannot be opened, or the token file is unreadable.
        ValueError: both ``collector_url`` and ``db`` given, or a malformed URL.
    """
    if collector_url and db:
        raise ValueError("give either a collector URL or a database file, not both")
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
