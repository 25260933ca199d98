"""Shared test helpers: paths, the corpus location, a scenario runner for the guard."""

from __future__ import annotations

import os
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
