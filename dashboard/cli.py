"""Start the Streamlit app: what ``loopwatch dashboard`` (and ``loopwatch up``) call.

The app runs as ``python -m streamlit run dashboard/server.py`` in a child process, headless,
with its source passed in the environment (``LOOPWATCH_DASHBOARD_COLLECTOR``,
``LOOPWATCH_DASHBOARD_DB``, ``LOOPWATCH_DASHBOARD_TOKEN_FILE``, or
``LOOPWATCH_DASHBOARD_LAKE`` and ``_LAKE_DATA`` for fleet mode's lake); the token itself
never appears on a command line or in the environment (a lake catalog's password, if it
has one, is in the child's environment, not on its command line). Off loopback an auth
mode is required (:mod:`loopwatch.dashboard.auth`).

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

from .auth import ENV_KEYS, AuthConfig, check_auth

__all__ = ["APP_PATH", "build_command", "build_env", "run_dashboard", "start_dashboard"]

APP_PATH: Final = Path(__file__).resolve().parent / "server.py"
"""The served entry file: ``st.App`` over the router ``app.py`` (:mod:`.server`: deep
links without 404s)."""

_ENV_KEYS: Final = (
    "LOOPWATCH_DASHBOARD_COLLECTOR",
    "LOOPWATCH_DASHBOARD_DB",
    "LOOPWATCH_DASHBOARD_TOKEN_FILE",
    "LOOPWATCH_DASHBOARD_LAKE",
    "LOOPWATCH_DASHBOARD_LAKE_DATA",
    *ENV_KEYS,
)


def _validate(
    collector_url: str | None,
    db: str | None,
    port: int,
    lake: tuple[str, str] | None = None,
) -> None:
    if sum(bool(v) for v in (collector_url, db, lake)) > 1:
        raise ValueError("give one of --collector URL, --db PATH or --lake CATALOG, not several")
    if lake is not None and not all(v.strip() for v in lake):
        raise ValueError("--lake needs both CATALOG and --lake-data PATH")
    if collector_url and not collector_url.startswith(("http://", "https://")):
        raise ValueError(f"--collector must be an http(s):// URL, got {collector_url!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")


def build_command(
    *, host: str = "127.0.0.1", port: int = 8501, secrets_file: str | None = None
) -> list[str]:
    """The ``streamlit run`` command line (headless, no usage statistics, no file watcher);
    ``secrets_file``: Streamlit's ``secrets.toml`` to read instead of its default places."""
    secrets = [] if secrets_file is None else [f"--secrets.files={secrets_file}"]
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
        *secrets,
    ]


def build_env(
    collector_url: str | None,
    db: str | None,
    *,
    token_file: str | None = None,
    base: Mapping[str, str] | None = None,
    lake: tuple[str, str] | None = None,
    auth: AuthConfig | None = None,
) -> dict[str, str]:
    """The child's environment: ``base`` (default ``os.environ``) with the source set.

    A database path is made absolute (the child's working directory may differ).
    ``lake``: ``(catalog, data_path)``; ``auth``: the checked auth mode.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _ENV_KEYS}
    if auth is not None:
        env.update(auth.env())
    if lake is not None:
        env["LOOPWATCH_DASHBOARD_LAKE"], env["LOOPWATCH_DASHBOARD_LAKE_DATA"] = lake
    elif db:
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
    lake: tuple[str, str] | None = None,
    auth: str = "none",
    auth_header: str | None = None,
    secrets_file: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start the app in a child process and return it (the caller waits or stops it).

    ``quiet`` drops Streamlit's banner and info log (warnings and errors still reach
    stderr), for a caller that prints its own URLs. ``lake``: read fleet mode's lake
    ``(catalog, data_path)``. ``auth`` / ``auth_header`` / ``secrets_file``: see
    :func:`loopwatch.dashboard.auth.check_auth` (required off loopback).

    Raises:
        ValueError: several sources given, a malformed URL, a bad port, or an auth
            problem (off loopback without ``auth``, OIDC secrets missing...).
        ImportError: Streamlit is missing (``pip install 'loopwatch[dashboard]'``).
    """

    _validate(collector_url, db, port, lake)
    secrets = None if secrets_file is None else [Path(secrets_file).expanduser().resolve()]
    auth_config = check_auth(host, auth, header=auth_header, secrets_files=secrets)
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        raise ImportError("the dashboard needs its extra: pip install 'loopwatch[dashboard]'")
    command = build_command(
        host=host, port=port, secrets_file=None if secrets is None else str(secrets[0])
    )
    return subprocess.Popen(
        [*command, "--logger.level=warning"] if quiet else command,
        env=build_env(collector_url, db, token_file=token_file, lake=lake, auth=auth_config),
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
    lake: tuple[str, str] | None = None,
    auth: str = "none",
    auth_header: str | None = None,
    secrets_file: str | None = None,
) -> int:
    """Run the app until it exits or the user interrupts; returns its exit code.

    With neither ``collector_url``, ``db`` nor ``lake`` the app reads the collector at its
    default address (``http://127.0.0.1:9464``). Ctrl-C or SIGTERM stop the child and
    return 0. The other options: see :func:`start_dashboard`.

    Raises:
        ValueError: see :func:`start_dashboard`.
        ImportError: Streamlit is missing.
    """
    proc = start_dashboard(
        collector_url,
        db,
        host,
        port,
        token_file=token_file,
        lake=lake,
        auth=auth,
        auth_header=auth_header,
        secrets_file=secrets_file,
    )
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
