"""Start the Streamlit app: what ``loopwatch dashboard`` (and ``loopwatch up``) call.

The app runs as ``python -m streamlit run dashboard/server.py`` in a child process, headless,
with its source passed in the environment (``LOOPWATCH_DASHBOARD_COLLECTOR``,
``LOOPWATCH_DASHBOARD_DB``, ``LOOPWATCH_DASHBOARD_TOKEN_FILE``); the token itself never
appears on a command line or in the environment.

Example:
    >>> run_dashboard(collector_url="http://127.0.0.1:9464")  # doctest: +SKIP
    >>> run_dashboard(None, "incident-copy.duckdb", port=8502)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = ["APP_PATH", "build_command", "build_env", "run_dashboard", "start_dashboard"]

APP_PATH: Final = Path(__file__).resolve().parent / "server.py"
"""The served entry file: ``st.App`` over the router ``app.py`` (:mod:`.server`: deep
links without 404s)."""

_ENV_KEYS: Final = (
    "LOOPWATCH_DASHBOARD_COLLECTOR",
    "LOOPWATCH_DASHBOARD_DB",
    "LOOPWATCH_DASHBOARD_TOKEN_FILE",
)


def _validate(collector_url: str | None, db: str | None, port: int) -> None:
    if collector_url and db:
        raise ValueError("give either --collector URL or --db PATH, not both")
    if collector_url and not collector_url.startswith(("http://", "https://")):
        raise ValueError(f"--collector must be an http(s):// URL, got {collector_url!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")


def build_command(*, host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    """The ``streamlit run`` command line (headless, no usage statistics, no file watcher)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.headless=true",
        f"--server.address={host}",
        f"--server.port={port}",
        "--server.fileWatcherType=none",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=minimal",
        "--theme.base=light",
    ]


def build_env(
    collector_url: str | None,
    db: str | None,
    *,
    token_file: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The child's environment: ``base`` (default ``os.environ``) with the source set.

    A database path is made absolute (the child's working directory may differ).
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _ENV_KEYS}
    if db:
        env["LOOPWATCH_DASHBOARD_DB"] = str(Path(db).expanduser().resolve())
    elif collector_url:
        env["LOOPWATCH_DASHBOARD_COLLECTOR"] = collector_url
    if token_file:
        env["LOOPWATCH_DASHBOARD_TOKEN_FILE"] = str(Path(token_file).expanduser().resolve())
    return env


def start_dashboard(
    collector_url: str | None = None,
    db: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8501,
    *,
    token_file: str | None = None,
    quiet: bool = False,
) -> subprocess.Popen[bytes]:
    """Start the app in a child process and return it (the caller waits or stops it).

    ``quiet`` drops Streamlit's banner and info log (warnings and errors still reach
    stderr), for a caller that prints its own URLs.

    Raises:
        ValueError: both sources given, a malformed URL, or a bad port.
        ImportError: Streamlit is missing (``pip install 'loopwatch[dashboard]'``).
    """
    _validate(collector_url, db, port)
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        raise ImportError("the dashboard needs its extra: pip install 'loopwatch[dashboard]'")
    command = build_command(host=host, port=port)
    return subprocess.Popen(
        [*command, "--logger.level=warning"] if quiet else command,
        env=build_env(collector_url, db, token_file=token_file),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if quiet else None,
    )


def run_dashboard(
    collector_url: str | None = None,
    db: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8501,
    *,
    token_file: str | None = None,
) -> int:
    """Run the app until it exits or the user interrupts; returns its exit code.

    With neither ``collector_url`` nor ``db`` the app reads the collector at its default
    address (``http://127.0.0.1:9464``). Ctrl-C or SIGTERM stop the child and return 0.

    Raises:
        ValueError: both sources given, a malformed URL, or a bad port.
        ImportError: Streamlit is missing.
    """
    proc = start_dashboard(collector_url, db, host, port, token_file=token_file)
    previous = signal.getsignal(signal.SIGTERM)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, _terminate)
    except ValueError:
        previous = None
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
