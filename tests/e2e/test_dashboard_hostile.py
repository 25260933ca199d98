"""Hostile stored text in a real browser: no request leaves, nothing but text is drawn.

A real collector stores runs whose every client string (agent and tool names, stop
reason, message and evidence, policy, outcome, error types, arguments) is Markdown with an
image on a tracker server, a link, a heading, emphasis, colour, icon and emoji
shortcodes, LaTeX and autolinks (``tests/unit/dashboard/hostile.py``). ``loopwatch
dashboard`` serves it to Chromium; every page that shows stored text, and two URLs that
reflect a query parameter, are loaded. Before the fix a single run view made the browser
fetch 23 images from the tracker (a helper session's review, 2026-12-01).

Checked on each page: the tracker got no request; the main area holds no ``<img>``, no
link off the dashboard, no heading, emphasis, colour, KaTeX, icon or emoji made from the
data; and the data is on the page, as text. Needs the browser as
``test_dashboard_browser.py`` does.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import pytest
from loopwatch.dashboard.data import DEFAULT_OTLP_URL

from tests.integration.services import free_port, start_collector
from tests.unit.dashboard import hostile

from .test_dashboard_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    UI_TIMEOUT_MS,
    _dashboard,
    _require_browser,
)

# What the page's main area holds that data could have made. ``ours``: hosts of links the
# pages write themselves (the collector in the footer, the OTLP address in empty states).
_DOM_CHECK = """
(ours) => {
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  const out = [];
  for (const e of main.querySelectorAll('img')) out.push('img ' + e.outerHTML.slice(0, 120));
  for (const e of main.querySelectorAll('a[href]')) {
    const host = new URL(e.href, location.href).host;
    if (host !== location.host && !ours.includes(host)) out.push('link ' + e.href);
    else if (/HOSTILE|PHISH/.test(e.textContent)) out.push('data link ' + e.href);
  }
  for (const e of main.querySelectorAll('h1,h2,h3,h4,h5,h6')) {
    if (/^\\s*(HEAD-|Stop reason: completed)/.test(e.textContent)) out.push('heading ' + e.textContent.slice(0, 80));
  }
  for (const e of main.querySelectorAll('strong,em,b,i,del,s')) {
    if (/^\\s*(BOLD-|EM-)/.test(e.textContent)) out.push('emphasis ' + e.textContent.slice(0, 80));
  }
  // Code blocks only where the pages put them (st.code); a label or caption never.
  for (const e of main.querySelectorAll('pre')) {
    if (!e.closest('[data-testid="stCode"]')) out.push('code block ' + e.textContent.slice(0, 60));
  }
  for (const e of main.querySelectorAll('.katex, math')) out.push('katex ' + e.textContent.slice(0, 40));
  for (const e of main.querySelectorAll('[data-testid="stIconMaterial"]')) {
    if (e.textContent.includes('verified')) out.push('icon ' + e.textContent);
  }
  for (const e of main.querySelectorAll('span[style*="color"]')) {
    if (/RED-/.test(e.textContent)) out.push('colour ' + e.textContent.slice(0, 60));
  }
  const emoji = main.innerText.match(/[\\u2600-\\u27bf\\u{1f300}-\\u{1faff}]/u);
  if (emoji) out.push('emoji ' + emoji[0]);
  // A bidi control in Markdown text reorders the page's own text after it; in a table
  // cell, chart label or input it stays within that value.
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (/[\\u202a-\\u202e\\u2066-\\u2069]/.test(n.textContent)
        && n.parentElement.closest('[data-testid="stMarkdownContainer"], [data-testid="stMetric"], summary, h1, h2, h3')) {
      out.push('bidi control in text: ' + n.textContent.slice(0, 40));
    }
  }
  return {found: out, text: main.innerText};
}
"""


class _Tracker(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def tracker() -> Iterator[tuple[str, list[str]]]:
    """``(HOST:PORT, hits)``: an image server on loopback that records every request."""
    hits: list[str] = []
    handler = type("Tracker", (_Tracker,), {"hits": hits})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(240)
def test_hostile_stored_text_is_only_text_in_chromium(
    tmp_path: Path, tracker: tuple[str, list[str]]
) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    address, hits = tracker
    reflected = quote(hostile.payload("url", address), safe="")
    # The text each page must show of the data; the runs table is a canvas, so the
    # stopped-runs page is checked for what it must not draw only.
    shown: dict[str, str | None] = {"stopped runs": None}
    pages = {
        "overview": "overview?range=all",
        "overview, agent from the URL": f"overview?range=all&agent={reflected}",
        "tools": "tools?range=all",
        "stopped runs": "runs?range=all",
        "run view": f"run?run_id={hostile.RUNS['main']}&all=1",
        "run view, loop": f"run?run_id={hostile.RUNS['loop']}&all=1",
        "run view, setext agent": f"run?run_id={hostile.RUNS['setext']}",
        "run view, id from the URL": f"run?run_id={reflected}",
    }
    with start_collector(tmp_path) as collector:
        hostile.feed(collector.otlp_url, collector.http_url, address)
        ours = [urlsplit(collector.http_url).netloc, urlsplit(DEFAULT_OTLP_URL).netloc]
        with _dashboard(collector.http_url, tmp_path) as base, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 2400})
                page.set_default_timeout(UI_TIMEOUT_MS)
                failures: dict[str, list[str]] = {}
                for name, path in pages.items():
                    before = len(hits)
                    page.goto(f"{base}/{path}")
                    # The footer is the last element every page writes.
                    page.get_by_text("Figures are refreshed every").wait_for()
                    page.wait_for_load_state("networkidle")
                    result = page.evaluate(_DOM_CHECK, ours)
                    found = list(result["found"]) + [f"fetched {h}" for h in hits[before:]]
                    expected = shown.get(name, hostile.MARK)
                    if expected is not None and expected not in result["text"]:
                        found.append("no stored text on the page")
                    if found:
                        failures[name] = found
                        ARTIFACTS.mkdir(exist_ok=True)
                        slug = re.sub(r"[^a-z]+", "-", name)
                        shot = ARTIFACTS / f"dashboard-hostile-{slug}.png"
                        page.screenshot(path=str(shot), full_page=True)
            finally:
                browser.close()
    assert not failures, failures
    assert not hits, hits
