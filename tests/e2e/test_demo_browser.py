"""``loopwatch up`` + ``loopwatch demo`` seen in a real browser (Playwright + Chromium).

``loopwatch up --demo`` runs as a subprocess (collector and dashboard, free ports,
temporary DuckDB file) and replays the fine-tuned tau2 telecom results into itself.
Chromium, at 1280x900, opens the stopped runs filtered to ``repeated_action``, picks
the run that called ``get_details_by_id`` 95 times in the recording, follows "Open run
view" and checks the stop card. The run view is saved as
``test-artifacts/demo-run-view.png``; a failure saves ``demo-browser-failure.png``.

Skipped when the corpus or the tau2 importer is absent, or without playwright or
``/usr/bin/chromium`` (failed instead under ``CI=true``, as in test_dashboard_browser).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_dashboard_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _require_browser
from tests.integration.services import poll_until
from tests.integration.test_demo_up import TELECOM_FT, loop95_run_id, start_up

SCREENSHOT = ARTIFACTS / "demo-run-view.png"
FAILURE_SCREENSHOT = ARTIFACTS / "demo-browser-failure.png"
UI_TIMEOUT_MS = 30_000


@pytest.mark.timeout(150)
def test_demo_loop_run_in_the_dashboard(tmp_path: Path) -> None:
    loop_run = loop95_run_id("tau2")
    _require_browser()
    from playwright.sync_api import expect, sync_playwright

    # The demo runs inside ``loopwatch up`` while Streamlit starts (``loopwatch demo``
    # into a running ``up`` is tests/integration/test_demo_up.py's case).
    demo = ("--demo", "--corpus", str(TELECOM_FT), "--run-prefix", "tau2")
    with start_up(tmp_path, *demo) as up:
        assert "replayed 38 runs" in up.output(), up.output()
        poll_until(
            lambda: any(r["run_id"] == loop_run for r in up.runs(stop_reason="repeated_action")),
            timeout_seconds=20,
            what=f"{loop_run} stored as repeated_action",
        )
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(UI_TIMEOUT_MS)
                try:
                    _walk(page, up.dashboard_url, loop_run, expect)
                except BaseException:
                    ARTIFACTS.mkdir(exist_ok=True)
                    page.screenshot(path=str(FAILURE_SCREENSHOT), full_page=True)
                    raise
            finally:
                browser.close()


def _walk(page: Any, base: str, loop_run: str, expect: Any) -> None:
    page.goto(f"{base}/runs?reason=repeated_action")
    expect(page.get_by_role("heading", name="Stopped runs")).to_be_visible()
    picker = page.get_by_role("combobox", name="Run", exact=True)
    picker.click()
    page.get_by_role("option", name=loop_run, exact=True).click()
    expect(picker).to_have_value(loop_run)
    page.get_by_role("link", name="Open run view").click()

    page.wait_for_url(re.compile(r"/run\?run_id="))
    expect(page.get_by_role("heading", name="Run view")).to_be_visible()
    expect(page.get_by_role("heading", name="Stop: repeated_action")).to_be_visible()
    reason = page.get_by_test_id("stMetric").filter(has_text="Stop reason")
    expect(reason).to_contain_text("repeated_action")
    expect(page.get_by_text("get_details_by_id").first).to_be_visible()
    page.wait_for_load_state("networkidle")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000
