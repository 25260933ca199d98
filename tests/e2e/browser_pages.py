"""What the 1440x900 browser test and the browser benchmark share: when a Streamlit page
is ready, which tables are clipped, which run ids a reader can tell apart.

All checks read the page as Chromium drew it: Streamlit's tables are a canvas
(glide-data-grid) with an accessible ``<table role="grid">`` beside it that holds the
cells' text; the canvas's scroller says whether columns lie outside the visible width.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

VIEWPORT = {"width": 1440, "height": 900}
"""The issue's reviewer screen (issue 28)."""

READY_TIMEOUT_MS = 60_000

_READY_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  // Every table the reader can see has drawn, its accessible cells included (a table
  // in a closed expander never draws).
  return Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
    .filter(d => d.checkVisibility())
    .every(d => d.querySelector('.dvn-scroller') && d.querySelector('table th'));
}"""

_TABLES_JS = """() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
  .filter(d => d.checkVisibility())
  .map(d => {
    const s = d.querySelector('.dvn-scroller');
    const box = d.getBoundingClientRect();
    const heads = Array.from(d.querySelectorAll('table th')).map(th => th.textContent);
    const rows = Array.from(d.querySelectorAll('table tbody tr')).map(
      tr => Array.from(tr.querySelectorAll('td')).map(td => td.textContent));
    return {scrollWidth: s.scrollWidth, clientWidth: s.clientWidth,
            scrollHeight: s.scrollHeight, clientHeight: s.clientHeight,
            top: box.top + window.scrollY, bottom: box.bottom + window.scrollY,
            headers: heads, rows: rows};
  })"""

_TEXT_WIDTH_JS = """([texts, font]) => {
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = font;
  return texts.map(t => ctx.measureText(t).width);
}"""


@dataclass(frozen=True)
class Table:
    """One drawn table: its scroll box, its place on the page, its headers and cells."""

    scroll_width: int
    client_width: int
    scroll_height: int
    client_height: int
    top: float
    bottom: float
    headers: list[str]
    rows: list[list[str]]

    @property
    def clipped(self) -> bool:
        """Some column lies outside the visible width (a horizontal scroll)."""
        return self.scroll_width > self.client_width + 1

    @property
    def scrolls_inside(self) -> bool:
        """Some row lies below the table's visible height (a vertical scroll)."""
        return self.scroll_height > self.client_height + 1

    def column(self, header: str) -> list[str]:
        """The cells of the column headed ``header`` (rows the grid has drawn)."""
        index = self.headers.index(header)
        return [row[index] for row in self.rows if len(row) > index]


def wait_ready(page: Any, timeout_ms: int = READY_TIMEOUT_MS) -> None:
    """Until the script run ended and every visible table has drawn."""
    page.wait_for_function(_READY_JS, timeout=timeout_ms, polling=25)


def open_page(page: Any, url: str) -> float:
    """Load ``url`` and wait until ready; returns the seconds it took."""
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_selector('[data-testid="stApp"]')
    wait_ready(page)
    return time.perf_counter() - started


def tables(page: Any) -> list[Table]:
    """The visible tables of the page, in page order."""
    return [
        Table(
            int(t["scrollWidth"]),
            int(t["clientWidth"]),
            int(t["scrollHeight"]),
            int(t["clientHeight"]),
            float(t["top"]),
            float(t["bottom"]),
            list(t["headers"]),
            [list(r) for r in t["rows"]],
        )
        for t in page.evaluate(_TABLES_JS)
    ]


GRID_FONT = "14px 'Source Sans', 'Source Sans Pro', sans-serif"
CELL_PADDING_PX = 16


def visible_prefixes(page: Any, texts: list[str], column_px: int) -> list[str]:
    """What of each cell text the grid can draw in ``column_px`` (the longest prefix that
    fits beside the cell padding), measured with the grid's font in this browser."""
    room = column_px - CELL_PADDING_PX
    shown = []
    for text in texts:
        widths = page.evaluate(
            _TEXT_WIDTH_JS, [[text[:n] for n in range(len(text) + 1)], GRID_FONT]
        )
        fits = max(n for n, w in enumerate(widths) if w <= room)
        shown.append(text[:fits])
    return shown


def act_and_wait(
    page: Any, action: Any, arrived: str, arg: Any = None, timeout_ms: int = READY_TIMEOUT_MS
) -> float:
    """Do ``action()`` (a click, a choice) in the loaded app, wait until the JS predicate
    ``arrived`` (called with ``arg``) holds and the page is ready; returns the seconds
    from the action.

    ``arrived`` must be false before the action (the new page's title, the run's stop
    heading, a figure that changes): Streamlit may render a quick script run's start
    and end in one frame, so its "running" state is no signal. In-app navigation (the
    top bar, a page link, a widget) reruns the page's script in the open session, as a
    reviewer moving through the app does; :func:`open_page` is a full load.
    """
    assert not page.evaluate(arrived, arg), "the predicate holds before the action"
    started = time.perf_counter()
    action()
    page.wait_for_function(arrived, arg=arg, timeout=timeout_ms, polling=10)
    wait_ready(page, timeout_ms)
    return time.perf_counter() - started


TITLE_IS = """title => Array.from(document.querySelectorAll('h1')).some(
  h => h.textContent.trim() === title)"""
"""Predicate: a page title (``h1``) reads ``arg``."""
