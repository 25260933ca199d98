"""loopwatch dashboard: a Streamlit app over the collector's read API (DESIGN section 6).

- :func:`run_dashboard`: start the app (``loopwatch dashboard``); see
  :mod:`loopwatch.dashboard.cli`.
- :mod:`loopwatch.dashboard.data`: the data sources (no Streamlit import).
- :mod:`loopwatch.dashboard.runview` and :mod:`loopwatch.dashboard.charts`: pure logic and
  charts behind the pages.

Importing this package imports neither Streamlit nor DuckDB.
"""

from __future__ import annotations

from .cli import run_dashboard

__all__ = ["run_dashboard"]
