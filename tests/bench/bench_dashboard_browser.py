"""Dashboard benchmark in a real browser: page, run-view and policy-replay times as a
reviewer sees them (issue 28, "Speed").

Run as a script to print figures::

    .venv/bin/python tests/bench/bench_dashboard_browser.py [--repeat R] [--limit N]

or through pytest with ``LOOPWATCH_BENCH`` set (``test_bench_dashboard_browser``; smoke:
one timed load per page and 3 runs opened; full: ``--repeat 5``). Skipped without the
corpus (``../shared/corpus``), playwright or ``/usr/bin/chromium``.

What is measured, on the demo store:

- the store: a real ``loopwatch collector`` fed by ``loopwatch demo --capture-content``
  with the whole corpus (about 1,100 recorded runs), then the collector stops and
  ``loopwatch dashboard --db FILE`` serves the file;
- Playwright drives Debian's Chromium at 1440x900; a page is *ready* when its script
  run has ended and every visible table has drawn (``tests/e2e/browser_pages.py``);
- every page (Overview, Stopped runs, Tools, Run view without a run, Policy replay with
  its default 100 runs), reached from the top bar in the loaded app: one warm-up visit,
  then ``repeat`` timed visits, median (answers are cached for 15 s, as a reviewer
  moving through the app gets them);
- opening a run: a run id entered in the run view, runs not opened before (their data
  uncached), median;
- Policy replay over 500 stored runs: 500 chosen in the page's "Runs" select, until the
  results are drawn; the steps are read and the runs replayed every time (only the list
  of runs is cached), median.

Budgets: pages and opening a run 1 s, policy replay over 500 runs 2 s. The figures are
printed with their verdict; the test asserts what the pages show, not the times (the
machine may be shared).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import CORPUS  # noqa: E402
from tests.e2e.browser_pages import TITLE_IS, VIEWPORT, act_and_wait, open_page  # noqa: E402

PAGE_BUDGET_SECONDS = 1.0
REPLAY_BUDGET_SECONDS = 2.0
REPLAY_RUNS = 500
PAGES = {
    "Overview": "Overview",
    "Stopped runs": "Stopped runs",
    "Tools": "Tools",
    "Run view (no run)": "Run view",
    "Policy replay (default, 100 runs)": "Policy replay",
}
"""Figure name -> the page's link in the top bar."""


@dataclass
class Figure:
    name: str
    seconds: list[float]
    budget: float | None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def line(self) -> str:
        verdict = ""
        if self.budget is not None:
            within = self.median <= self.budget
            verdict = f"{'within' if within else 'OVER'} {self.budget:g} s"
        return (
            f"{self.name:<46} {self.median * 1000:9.0f} {max(self.seconds) * 1000:9.0f} "
            f"{len(self.seconds):>3}  {verdict}"
        )


@dataclass
class Report:
    runs_stored: int
    build_seconds: float
    figures: list[Figure] = field(default_factory=list)
    replayed: int = 0
    opened: list[str] = field(default_factory=list)

    def print(self) -> None:
        print(
            f"\ndemo store: {self.runs_stored:,} runs, built in {self.build_seconds:.1f} s; "
            f"Chromium {VIEWPORT['width']}x{VIEWPORT['height']}"
        )
        print(f"{'measured':<46} {'median ms':>9} {'max ms':>9} {'n':>3}")
        for figure in self.figures:
            print(figure.line())
        print(f"policy replay: {self.replayed} runs replayed per load")


def build_demo_store(workdir: Path, *, limit: int | None) -> tuple[Path, int]:
    """A collector fed by ``loopwatch demo`` over the corpus; returns the file and its
    run count once the collector has exited (the file is then free to open)."""
    from tests.integration.services import run_loopwatch, start_collector

    db = workdir / "demo.duckdb"
    with start_collector(workdir, db_path=db, ready_timeout_seconds=120) as collector:
        args = ["--corpus", str(CORPUS), "--capture-content", "--otlp", collector.otlp_url]
        if limit:
            args += ["--limit", str(limit)]
        # The collector acknowledges a request once committed: what the demo sent is
        # in the file when it returns.
        sent = run_loopwatch("demo", *args, cwd=workdir, timeout_seconds=600)
        assert sent.returncode == 0, sent.stdout + sent.stderr
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT count(*) FROM runs").fetchone()
    return db, int(row[0]) if row else 0


@contextlib.contextmanager
def dashboard_on(db: Path, workdir: Path) -> Iterator[str]:
    """``loopwatch dashboard --db FILE`` on a free port; yields its URL."""
    from tests.integration.services import _child_env, free_port, loopwatch_command

    port = free_port()
    log = open(workdir / "dashboard.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*loopwatch_command(), "dashboard", "--db", str(db), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=_child_env(),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((workdir / "dashboard.log").read_text(errors="replace"))
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


STOP_SHOWN = """() => Array.from(document.querySelectorAll('h1')).some(
  h => h.textContent.trim() === 'Run view') && Array.from(document.querySelectorAll('h3'))
  .some(h => h.textContent.startsWith('Stop: '))"""
"""Predicate: the run view shows a run's stop card."""

REPLAYED = """least => Array.from(document.querySelectorAll('[data-testid="stMetric"]')).some(
  m => m.textContent.startsWith('Runs replayed') &&
       parseInt(m.textContent.replace('Runs replayed', '').replace(/,/g, '')) >= least)"""
"""Predicate: the replay's "Runs replayed" figure is at least ``arg``."""


def _choose_runs(page: Any, runs: int) -> None:
    """Policy replay's "Runs" select set to ``runs``."""
    page.get_by_role("combobox", name="Runs (newest first)").click()
    page.get_by_role("option", name=str(runs), exact=True).click()


def _nav(page: Any, name: str) -> Any:
    """The top bar's link to the page ``name``."""
    return page.get_by_role("link", name=name, exact=True).first


def _stopped_run_ids(db: Path, count: int) -> list[str]:
    """Stored ``repeated_action`` runs with steps (the Stopped runs page filtered to
    that reason lists them all in its picker)."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT s.run_id FROM stops s WHERE s.reason = 'repeated_action' "
            "AND s.run_id IN (SELECT run_id FROM steps) ORDER BY s.run_id LIMIT ?",
            [count],
        ).fetchall()
    return [str(r[0]) for r in rows]


def run_benchmark(
    *,
    repeat: int,
    workdir: Path,
    runs_to_open: int,
    limit: int | None,
    db: Path | None = None,
) -> Report:
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_dashboard_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    started = time.perf_counter()
    if db is None:
        db, stored = build_demo_store(workdir, limit=limit)
    else:
        import duckdb

        with duckdb.connect(str(db), read_only=True) as con:
            row = con.execute("SELECT count(*) FROM runs").fetchone()
        stored = int(row[0]) if row else 0
    report = Report(stored, time.perf_counter() - started)
    to_open = _stopped_run_ids(db, runs_to_open + 1)  # the first one warms the run view
    with dashboard_on(db, workdir) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(120_000)
            # The app is loaded once; then the reviewer moves through it (top bar, links,
            # widgets): each figure is a script rerun in the open session until ready.
            open_page(page, url + "/run")  # then every page is one click away
            for name, link in PAGES.items():
                other = "Overview" if link == "Run view" else "Run view"
                nav, away = _nav(page, link), _nav(page, other)
                act_and_wait(page, nav.click, TITLE_IS, link)  # warm-up: the page, its caches
                seconds = []
                for _ in range(repeat):
                    act_and_wait(page, away.click, TITLE_IS, other)
                    seconds.append(act_and_wait(page, nav.click, TITLE_IS, link))
                report.figures.append(Figure(name, seconds, PAGE_BUDGET_SECONDS))
            # Opening a run: its id entered in the run view (the page's code warm, each
            # run's data read for the first time; the first run warms the page).
            seconds = []
            for run_id in to_open:
                open_page(page, f"{url}/run")
                box = page.get_by_role("textbox", name="Run id")
                box.fill(run_id)
                seconds.append(act_and_wait(page, partial(box.press, "Enter"), STOP_SHOWN))
                report.opened.append(run_id)
            report.figures.append(Figure("Opening a run", seconds[1:], PAGE_BUDGET_SECONDS))
            # Policy replay over 500 runs: chosen in the page's "Runs" select.
            seconds = []
            for _ in range(max(repeat, 2)):
                open_page(page, f"{url}/replay?reason=%28any%29&runs=25")
                pick = partial(_choose_runs, page, REPLAY_RUNS)
                seconds.append(act_and_wait(page, pick, REPLAYED, REPLAY_RUNS * 0.8))
            report.figures.append(
                Figure(f"Policy replay over {REPLAY_RUNS} runs", seconds, REPLAY_BUDGET_SECONDS)
            )
            metric = page.get_by_test_id("stMetric").filter(has_text="Runs replayed")
            report.replayed = int(metric.inner_text().split()[-1].replace(",", ""))
        except BaseException:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "bench-browser-failure.png"))
            raise
        finally:
            browser.close()
    return report


def _skip_reason() -> str | None:
    if not CORPUS.is_dir():
        return f"the corpus is absent: {CORPUS}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    if not os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium is absent"
    return None


def check_sanity(report: Report, *, runs_to_open: int) -> None:
    """What the pages showed (not timing)."""
    assert report.runs_stored >= REPLAY_RUNS, report.runs_stored
    assert report.replayed >= REPLAY_RUNS * 0.8, report.replayed
    assert len(report.opened) == runs_to_open + 1  # the first one warms the run view
    assert {f.name for f in report.figures} >= set(PAGES)


@pytest.mark.timeout(1500)
def test_bench_dashboard_browser(tmp_path: Path) -> None:
    if not os.environ.get("LOOPWATCH_BENCH"):
        pytest.skip("benchmarks run with LOOPWATCH_BENCH=smoke|full")
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    full = os.environ.get("LOOPWATCH_BENCH") == "full"
    runs_to_open = 10 if full else 3
    report = run_benchmark(
        repeat=5 if full else 1, workdir=tmp_path, runs_to_open=runs_to_open, limit=None
    )
    report.print()
    check_sanity(report, runs_to_open=runs_to_open)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs-to-open", type=int, default=10)
    parser.add_argument("--limit", type=int, default=None, help="demo runs (default: all)")
    parser.add_argument("--db", type=Path, default=None, help="an existing demo store")
    args = parser.parse_args()
    reason = _skip_reason()
    if reason:
        raise SystemExit(reason)
    with tempfile.TemporaryDirectory(prefix="lw-bench-browser-") as tmp:
        report = run_benchmark(
            repeat=args.repeat,
            workdir=Path(tmp),
            runs_to_open=args.runs_to_open,
            limit=args.limit,
            db=args.db,
        )
        report.print()
        check_sanity(report, runs_to_open=args.runs_to_open)


if __name__ == "__main__":
    main()
