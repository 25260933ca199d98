"""Fixtures for the dashboard tests: a collector fed with real runs, and its DuckDB file.

- ``fed`` (session): ``loopwatch collector`` as a subprocess, fed through the real
  instrumentation with one run per stop reason plus the 95-step loop
  (:mod:`.scenarios`); ``completed`` runs are never sampled (``completed_fraction = 0``)
  and one tool result carries a registered canary.
- ``fed.db_copy``: the collector's file and WAL copied while it runs, as an incident
  reviewer would copy them; it opens read-only.
- ``use_source``: points the pages at the collector (``api``) or the copy (``db``)
  through the environment, as ``loopwatch dashboard`` does.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import streamlit as st

from tests.integration.services import poll_until, start_collector

from .scenarios import CANARY, Fed, emit_all


@pytest.fixture(scope="session")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    tmp = tmp_path_factory.mktemp("collector")
    canaries = tmp / "canaries.txt"
    canaries.write_text(f"# test canary\n{CANARY}\n", encoding="utf-8")
    config = tmp / "collector.toml"
    config.write_text("[sampling]\ncompleted_fraction = 0.0\n", encoding="utf-8")
    with start_collector(tmp, "--canaries", str(canaries), "--config", str(config)) as collector:
        expected = emit_all(collector.otlp_url)

        def all_stopped() -> bool:
            runs = collector.runs()
            return len(runs) >= len(expected) and all(r["stop_reason"] for r in runs)

        poll_until(all_stopped, timeout_seconds=20, what="every run stored with its stop")
        incident = tmp / "incident"
        incident.mkdir()
        for path in tmp.glob("collector.duckdb*"):
            shutil.copy(path, incident / path.name)
        yield Fed(collector.http_url, collector.db_path, incident / "collector.duckdb", expected)


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


@pytest.fixture
def use_source(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``use_source(collector=URL)`` or ``use_source(db=PATH)``: the pages' source."""

    def set_source(*, collector: str | None = None, db: str | Path | None = None) -> None:
        for name in ("COLLECTOR", "DB", "TOKEN_FILE"):
            monkeypatch.delenv(f"LOOPWATCH_DASHBOARD_{name}", raising=False)
        if collector is not None:
            monkeypatch.setenv("LOOPWATCH_DASHBOARD_COLLECTOR", collector)
        if db is not None:
            monkeypatch.setenv("LOOPWATCH_DASHBOARD_DB", str(db))

    return set_source
