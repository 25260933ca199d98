"""The dashboard at 1440x900 in a real browser (issue 28): nothing an on-call reader
needs is cut off, and the run view opens on the loop.

``loopwatch up`` (collector + dashboard, free ports, a temporary DuckDB file) receives
the fine-tuned tau2 telecom recordings of the corpus (``../shared/corpus``) from
``loopwatch demo --capture-content``. Debian's Chromium at 1440x900 then checks:

- Stopped runs, Tools, Policy replay and the run view: no table has a column outside its
  visible width (a horizontal scroll in the grid is a clipped primary column);
- Stopped runs: the run ids, as the grid can draw them in their column, are all
  different (the shared ``tau2.`` prefix is left out);
- the run view of the run that called ``get_details_by_id`` 95 times in the recording:
  its steps table ends inside the 900 px window on load, with no scrolling inside it,
  and holds the loop's collapsed row and the stop mark; the evidence shows the repeated
  call's arguments;
- no page load logs a 404 (deep links such as ``/run/_stcore/health``).

Screenshots go to ``test-artifacts/1440-*.png``. Skipped without the corpus or the tau2
importer, or without playwright or ``/usr/bin/chromium`` (failed instead under
``CI=true``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from tests.e2e.browser_pages import VIEWPORT, open_page, tables, visible_prefixes
from tests.e2e.test_dashboard_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _require_browser
from tests.integration.services import poll_until
from tests.integration.test_demo_up import TELECOM_FT, loop95_run_id, run_demo_cli, start_up

PREFIX = "tau2"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    loop_run = loop95_run_id(PREFIX)
    _require_browser()
    tmp = tmp_path_factory.mktemp("dash1440")
    with start_up(tmp) as up:
        # Content captured, as a reviewer needs it (``up --demo`` follows the env, which
        # the test harness clears).
        demo_args = ("--corpus", str(TELECOM_FT), "--run-prefix", PREFIX, "--capture-content")
        sent = run_demo_cli(*demo_args, "--otlp", up.otlp_url, cwd=tmp, timeout_seconds=120)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        poll_until(
            lambda: any(r["run_id"] == loop_run for r in up.runs()),
            timeout_seconds=30,
            what=f"{loop_run} stored",
        )
        yield up, loop_run


@pytest.fixture(scope="module")
def browser_page(demo: Any) -> Any:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(60_000)
            failed: list[str] = []
            page.on(
                "response",
                lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None,
            )
            page.failed_responses = failed  # type: ignore[attr-defined]
            yield page
        finally:
            browser.close()


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"1440-{name}.png"))


def _no_clipped_table(page: Any, name: str) -> list[Any]:
    found = tables(page)
    _shot(page, name)
    assert found, f"{name}: no table drawn"
    clipped = [t.headers for t in found if t.clipped]
    assert not clipped, f"{name}: columns outside the visible width in tables {clipped}"
    return found


@pytest.mark.timeout(240)
def test_pages_at_1440_show_every_column(demo: Any, browser_page: Any) -> None:
    up, _ = demo
    page = browser_page
    base = up.dashboard_url

    open_page(page, f"{base}/runs?range=all")
    runs = _no_clipped_table(page, "stopped-runs")[0]
    assert "sampled" in runs.headers and "run id" in runs.headers
    ids = runs.column("run id")
    assert len(ids) >= 20 and not any(i.startswith(f"{PREFIX}.") for i in ids), ids[:3]
    from loopwatch.dashboard.ui import RUN_ID_WIDTH

    drawn = visible_prefixes(page, ids, RUN_ID_WIDTH - 10)
    assert len(set(drawn)) == len(drawn), f"run ids look alike as drawn: {sorted(drawn)[:6]}"

    open_page(page, f"{base}/tools?range=all")
    tools = _no_clipped_table(page, "tools")[0]
    assert {"tool", "rep. action", "nudge recovery"} <= set(tools.headers)

    open_page(page, f"{base}/replay?range=all&runs=25")
    replay = _no_clipped_table(page, "policy-replay")
    assert any("run id" in t.headers for t in replay)
    assert not page.failed_responses, page.failed_responses


@pytest.mark.timeout(240)
def test_run_view_opens_on_the_loop(demo: Any, browser_page: Any) -> None:
    up, loop_run = demo
    page = browser_page
    open_page(page, f"{up.dashboard_url}/run?run_id={quote(loop_run, safe='')}")
    found = _no_clipped_table(page, "run-view")
    steps = found[0]
    assert steps.headers[:2] == ["steps", "action"], steps.headers
    # Visible on load: the table ends inside the window, with no scrolling inside it.
    assert page.evaluate("window.scrollY") == 0
    assert steps.bottom <= VIEWPORT["height"], f"steps table ends at {steps.bottom} px"
    assert not steps.scrolls_inside, "the steps table scrolls inside itself"
    counts = steps.column("count")
    marks = steps.column("marks")
    loop_rows = [i for i, a in enumerate(steps.column("action")) if a == "get_details_by_id"]
    assert any(int(counts[i]) > 1 for i in loop_rows), steps.rows
    assert any("stopped at step" in m for m in marks), marks
    heading = page.get_by_role("heading", name="Stop: repeated_action")
    assert heading.is_visible()
    text = page.inner_text("body")
    assert "get_details_by_id was called" in text
    assert "The repeated call: get_details_by_id" in text
    assert not page.failed_responses, page.failed_responses


@pytest.mark.timeout(240)
def test_the_run_views_export_replays_to_the_same_stop(
    demo: Any, browser_page: Any, tmp_path: Any
) -> None:
    """Issue 28, from incident to test: the run view's Export button downloads the run
    as OTLP/JSON, and ``loopwatch replay`` on that file stops it where the guard did."""
    import json

    from tests.integration.services import run_loopwatch

    up, loop_run = demo
    page = browser_page
    open_page(page, f"{up.dashboard_url}/run?run_id={quote(loop_run, safe='')}")
    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    out = tmp_path / download.value.suggested_filename
    download.value.save_as(str(out))
    assert out.name.endswith(".otlp.json")
    stored = up.get_json(f"/api/v1/runs/{quote(loop_run, safe='')}")["stop"]
    replayed = run_loopwatch("replay", str(out), "--format", "json", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    (line,) = replayed.stdout.splitlines()
    row = json.loads(line)
    assert (row["stop_reason"], row["stop_step"]) == (stored["reason"], stored["step"])
