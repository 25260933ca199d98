"""loopwatch dashboard: a Streamlit app over the collector's read API (DESIGN section 6).

- :func:`run_dashboard`: start the app (``loopwatch dashboard``); see
  :mod:`loopwatch.dashboard.cli`.
- :mod:`loopwatch.dashboard.data`: what the pages read (the source protocol, its results
  and errors); :mod:`~loopwatch.dashboard.config` opens the configured source:
  :mod:`~loopwatch.dashboard.api_source` (the collector's read API) or
  :mod:`~loopwatch.dashboard.file_source` (a DuckDB file); rows are shaped by
  :mod:`~loopwatch.dashboard.frames`. None of them imports Streamlit.
- :mod:`loopwatch.dashboard.runview` and :mod:`loopwatch.dashboard.charts`: pure logic and
  charts behind the pages.

Importing this package imports neither Streamlit nor DuckDB.
"""

from __future__ import annotations

from .cli import run_dashboard

__all__ = ["run_dashboard"]
