"""Shared test helpers: paths, the corpus location, a scenario runner for the guard."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
TESTDATA = Path(__file__).resolve().parent / "testdata"


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """``../shared/corpus``; the test is skipped cleanly when it is absent."""
    if not CORPUS.is_dir():
        pytest.skip(f"corpus folder absent: {CORPUS}")
    return CORPUS


def slow_enabled() -> bool:
    """Slow soak and long benchmark runs run only with LOOPWATCH_SLOW=1."""
    return os.environ.get("LOOPWATCH_SLOW") == "1"


@pytest.fixture(autouse=True)
def _main_module_kept() -> Iterator[None]:
    """Put back ``sys.modules["__main__"]`` after each test.

    Streamlit's ``AppTest`` runs a page as ``__main__`` and leaves it there; a decode
    worker started later in the same test process (multiprocessing's forkserver runs the
    parent's ``__main__`` file again in the child) then ran a dashboard page and died,
    so a collector test after a dashboard test failed with "decode worker lost".
    """
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(autouse=True)
def _no_run_left_current() -> Iterator[None]:
    """Fail the test (or fixture) that leaves a loopwatch run, or any span, current.

    The current run and the current span are context variables of the test process: a
    run left open becomes the parent of every later ``@agent`` run, whose tools then
    resolve against its registry, and its span the parent of every later span, so
    unrelated tests fail far from the cause. Both are cleared before failing, so the leak
    is reported once, where it happened.
    """
    from loopwatch.instrumentation import runs as run_module
    from opentelemetry import context, trace

    yield
    left = run_module.current_run()
    span = trace.get_current_span()
    if left is None and not span.get_span_context().is_valid:
        return
    run_module._current.set(None)
    context.attach(context.Context())
    what = f"run of agent {left.agent!r}" if left is not None else "span"
    pytest.fail(f"a test left a loopwatch {what} current")
