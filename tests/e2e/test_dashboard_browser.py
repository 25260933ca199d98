"""The dashboard in a real browser: Playwright driving Debian's Chromium.

A real ``loopwatch collector`` is fed real runs (the instrumentation and the OTLP/HTTP
exporter), among them a 95-step identical-call loop stopped by ``repeated_action``;
``loopwatch dashboard --collector URL`` runs as a subprocess; Chromium, at 1280x900, opens
the stopped-runs page, picks that run and follows the "Open run view" link, then checks
the stop card and the collapsed ``get_details_by_id ×95`` row. The run view is saved as
``test-artifacts/dashboard-run-view.png`` (top: the stop card) and
``dashboard-run-view-steps.png`` (the collapsed row) at the repository root; a failure
saves ``dashboard-browser-failure.png``.

Needs the ``playwright`` Python package (the ``dev`` extra; no browser download: it
drives ``/usr/bin/chromium``, installed by ``scripts/services.sh``). Without either the
test is skipped with the reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.services import (
    CollectorProcess,
    emit_loopwatch_runs,
    free_port,
    loopwatch_command,
    poll_until,
    start_collector,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
SCREENSHOT = ARTIFACTS / "dashboard-run-view.png"
STEPS_SCREENSHOT = ARTIFACTS / "dashboard-run-view-steps.png"
FAILURE_SCREENSHOT = ARTIFACTS / "dashboard-browser-failure.png"
LOOP_RUN = "browser-loop95"
UI_TIMEOUT_MS = 30_000


def _require_browser() -> None:
    """Skip (fail under ``CI=true``) when playwright or Chromium is missing."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (apt-get install chromium; scripts/services.sh does)")
    if not missing:
        return
    message = "browser test needs " + " and ".join(missing)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def _emit_loop95(otlp_url: str) -> None:
    """The 95-step identical-call loop: ``get_details_by_id(id=7)`` until the guard stops it."""
    from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
    from loopwatch.instrumentation.otlp import configure_otlp
    from loopwatch.instrumentation.testing import ConstantTool, ScriptedModel

    provider = configure_otlp(
        endpoint=otlp_url,
        service_name="loopwatch-browser-test",
        timeout_seconds=10.0,
        schedule_delay_millis=50,
        set_global=False,
    )
    policy = Policy.build(
        repeat_limit=95,
        max_model_turns=200,
        max_tool_attempts=200,
        max_tool_successes=200,
        no_progress_patience=200,
        detector_window=128,
    )
    model = ScriptedModel([Decision.tool(ToolCall("get_details_by_id", {"id": 7}))] * 100)
    tools = {"get_details_by_id": ConstantTool(result={"id": 7, "status": "unchanged"})}
    try:
        with Run(
            "support",
            policy,
            tools=tools,
            capture_content=True,
            run_id=LOOP_RUN,
            tracer_provider=provider,
        ) as run:
            while True:
                decision = run.decide(model)
                if decision.type == "final":
                    break
                for call in decision.tool_calls:
                    run.call_tool(call.name, call.arguments)
        assert run.outcome.stop.reason.value == "repeated_action", run.outcome.stop
    finally:
        provider.force_flush()
        provider.shutdown()


@contextlib.contextmanager
def _dashboard(collector_url: str, tmp_path: Path) -> Iterator[str]:
    """``loopwatch dashboard --collector URL --port P`` until the block ends; yields its URL."""
    port = free_port()
    log = tmp_path / "dashboard.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*loopwatch_command(), "dashboard", "--collector", collector_url, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"loopwatch dashboard exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            return httpx.get(f"{base}/_stcore/health", timeout=1.0).text.strip() == "ok"
        except httpx.HTTPError:
            return False

    try:
        poll_until(healthy, timeout_seconds=45, what="the dashboard's /_stcore/health")
        yield base
    finally:
        # SIGTERM to the CLI, which stops its Streamlit child; the process group this
        # test started is killed if either lingers.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _fed_collector(tmp_path: Path) -> CollectorProcess:
    collector = start_collector(tmp_path)
    try:
        expected, _ = emit_loopwatch_runs(
            collector.otlp_url,
            ["completed", "repeated_action", "budget_exhausted"],
            agent="support",
            run_id_prefix="browser",
        )
        _emit_loop95(collector.otlp_url)
        expected[LOOP_RUN] = "repeated_action"

        def all_stopped() -> bool:
            runs = {r["run_id"]: r["stop_reason"] for r in collector.runs()}
            return all(runs.get(run_id) == reason for run_id, reason in expected.items())

        poll_until(all_stopped, timeout_seconds=30, what="every run stored with its stop")
    except BaseException:
        collector.kill()
        raise
    return collector


@pytest.mark.timeout(120)
def test_stopped_runs_to_run_view_in_chromium(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import expect, sync_playwright

    with _fed_collector(tmp_path) as collector, _dashboard(collector.http_url, tmp_path) as base:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(UI_TIMEOUT_MS)
                # expect() keeps its own 5 s default: a metric's lazily loaded component
                # took 7 s to show on a loaded 2-core machine.
                expect.set_options(timeout=UI_TIMEOUT_MS)
                try:
                    _walk(page, base, expect)
                except BaseException:
                    ARTIFACTS.mkdir(exist_ok=True)
                    page.screenshot(path=str(FAILURE_SCREENSHOT), full_page=True)
                    raise
            finally:
                browser.close()


def _walk(page: Any, base: str, expect: Any) -> None:
    # The overview is the default page, served at "/"; "/overview" showed Streamlit's
    # "Page not found" dialog until a hidden page took that pathname.
    page.goto(f"{base}/overview?range=all")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    page.get_by_text("Figures are refreshed every").wait_for()
    expect(page.get_by_text("Page not found")).to_have_count(0)
    page.goto(f"{base}/runs")
    expect(page.get_by_role("heading", name="Stopped runs")).to_be_visible()
    expect(page.get_by_text(re.compile(r"^Runs 1–4, newest first"))).to_be_visible()
    # The table is a canvas grid; its run ids also fill the "Run" picker beside the
    # "Open run view" link, which is what a keyboard or screen-reader user follows.
    picker = page.get_by_role("combobox", name="Run", exact=True)
    picker.click()
    page.get_by_role("option", name=LOOP_RUN, exact=True).click()
    expect(picker).to_have_value(LOOP_RUN)
    link = page.get_by_role("link", name="Open run view")
    expect(link).to_have_attribute("href", re.compile(rf"run_id={LOOP_RUN}$"))
    link.click()

    page.wait_for_url(re.compile(rf"/run\?run_id={LOOP_RUN}"))
    expect(page.get_by_role("heading", name="Run view")).to_be_visible()
    expect(page.get_by_role("heading", name="Stop: repeated_action")).to_be_visible()
    reason = page.get_by_test_id("stMetric").filter(has_text="Stop reason")
    expect(reason).to_contain_text("repeated_action")
    repeat = page.get_by_test_id("stExpander").filter(
        has_text=re.compile(r"get_details_by_id ×95 · steps 1–95")
    )
    expect(repeat).to_have_count(1)
    expect(repeat).to_contain_text("1 blocked, 94 ok")
    page.wait_for_load_state("networkidle")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000
    # Streamlit scrolls inside its own container, so the page is one viewport tall:
    # a second shot shows the collapsed repeat row.
    repeat.scroll_into_view_if_needed()
    page.screenshot(path=str(STEPS_SCREENSHOT))
