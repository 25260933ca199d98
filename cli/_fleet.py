"""``loopwatch up --fleet N``: a whole fleet on this machine, for trying fleet mode out.

In order: PostgreSQL (installed with apt by ``scripts/postgres.sh install`` when missing,
run in the foreground on a free loopback port with a temporary data folder; Debian starts
no services here), the catalog database ``lake``, N collectors on their own ports (each
its own DuckDB file and ``--collector-id fleet-I``, all shipping to the lake and flagging
the demo's canary), the dashboard over the lake (every collector's runs), and
(``--demo``) ``loopwatch demo`` into each collector in turn. Prints the
URLs, then waits for Ctrl-C or SIGTERM and stops everything in reverse order: dashboard,
collectors (SIGTERM: they commit and ship what they hold), PostgreSQL (fast shutdown);
then removes the temporary folder.

Every child runs in its own session, so a Ctrl-C at the terminal reaches this process
only and the order above holds. Exit codes: 0 stopped by a signal, 1 a child failed to
start, 2 PostgreSQL is missing and cannot be installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click

from ._demo import demo_canary_file, send_demo
from ._options import http_ok

__all__ = ["run_fleet"]

_SCRIPTS: Final = Path(__file__).resolve().parents[1] / "scripts"
_START_SECONDS: Final = 90.0
_STOP_SECONDS: Final = 30.0


class FleetError(Exception):
    """A part of the fleet did not start (the message says which and why)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _loopwatch() -> list[str]:
    script = Path(sys.executable).with_name("loopwatch")
    return [str(script)] if script.exists() else [sys.executable, "-m", "loopwatch.cli"]


def _wait(what: str, ready: Any, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while not ready():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise FleetError(f"{what} exited with {proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            raise FleetError(f"{what} did not start within {_START_SECONDS:g} s (log: {log})")
        time.sleep(0.3)


@dataclass
class _Fleet:
    root: Path
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.children.append((name, proc))
        return proc, log

    def stop(self) -> None:
        """Stop the children, newest first (PostgreSQL, the first, last)."""
        for name, proc in reversed(self.children):
            if proc.poll() is not None:
                continue
            # PostgreSQL's fast shutdown is SIGINT; the others stop cleanly on SIGTERM.
            proc.send_signal(signal.SIGINT if name == "postgres" else signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                click.echo(f"loopwatch up: {name} ignored the stop; killed", err=True)
                proc.kill()
                proc.wait()


def _postgres_bin() -> None:
    """Make sure PostgreSQL is installed (apt, through scripts/postgres.sh)."""
    script = _SCRIPTS / "postgres.sh"
    if not script.exists():
        raise FleetError("scripts/postgres.sh is missing: run from a loopwatch checkout")
    found = subprocess.run(["bash", str(script), "bindir"], capture_output=True, check=False)
    if found.returncode == 0:
        return
    click.echo("loopwatch up: installing PostgreSQL (apt-get install postgresql)")
    done = subprocess.run(["bash", str(script), "install"], check=False)
    if done.returncode != 0:
        raise FleetError("PostgreSQL is not installed and apt could not install it")


def _start_postgres(fleet: _Fleet) -> str:
    """PostgreSQL on a free loopback port; returns the catalog database's DSN."""
    import psycopg

    data = fleet.root / "postgres"
    port = _free_port()
    proc, log = fleet.spawn(
        "postgres", ["bash", str(_SCRIPTS / "postgres.sh"), "run", str(data), str(port)]
    )
    admin = f"dbname=postgres host=127.0.0.1 port={port} user=postgres"

    def ready() -> bool:
        try:
            with psycopg.connect(admin, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    _wait("PostgreSQL", ready, proc, log)
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute("CREATE DATABASE lake")
    return f"dbname=lake host=127.0.0.1 port={port} user=postgres"


def run_fleet(
    members: int,
    *,
    dashboard_port: int,
    no_dashboard: bool,
    demo_options: dict[str, Any] | None,
) -> int:
    """Run the fleet until a stop signal; returns the exit code (see the module)."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    root = Path(tempfile.mkdtemp(prefix="loopwatch-fleet-"))
    if os.geteuid() == 0:
        # As root, PostgreSQL runs as `postgres` (scripts/postgres.sh), which must enter
        # every folder above its data folder (a private TMPDIR is not).
        for folder in (root, *root.parents):
            mode = folder.stat().st_mode
            if not mode & 0o001:
                folder.chmod(mode | 0o001)
    fleet = _Fleet(root)
    code = 0
    try:
        _postgres_bin()
        dsn = _start_postgres(fleet)
        catalog, data_path = f"postgres:{dsn}", str(root / "lake-data") + "/"
        collectors = _start_collectors(fleet, members, catalog, data_path)
        dashboard = ""
        if not no_dashboard and not stop.is_set():
            dashboard = _start_dashboard(fleet, dashboard_port, (catalog, data_path))
        if demo_options is not None:
            _demo(collectors, demo_options, stop)
        if not stop.is_set():
            _announce(collectors, catalog, data_path, dashboard, root)
        stop.wait()
    except FleetError as exc:
        click.echo(f"loopwatch up: {exc}", err=True)
        code = 2 if "PostgreSQL is not installed" in str(exc) else 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        fleet.stop()
        shutil.rmtree(root, ignore_errors=True)
    click.echo("loopwatch up: fleet stopped", err=True)
    return code


def _start_collectors(
    fleet: _Fleet, members: int, catalog: str, data_path: str
) -> list[tuple[str, str, str]]:
    """N collectors; returns ``(collector_id, http URL, OTLP URL)`` of each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    started = []
    for index in range(1, members + 1):
        name = f"fleet-{index}"
        otlp, http = _free_port(), _free_port()
        argv = [
            *_loopwatch(),
            "collector",
            "--db",
            str(fleet.root / f"{name}.duckdb"),
            "--otlp-http",
            f"127.0.0.1:{otlp}",
            "--http",
            f"127.0.0.1:{http}",
            "--lake",
            catalog,
            "--lake-data",
            data_path,
            "--collector-id",
            name,
            "--canaries",
            str(demo_canary_file(fleet.root)),
        ]
        proc, log = fleet.spawn(name, argv, env)
        http_url = f"http://127.0.0.1:{http}"
        started.append((name, http_url, f"http://127.0.0.1:{otlp}/v1/traces", proc, log))
        if index == 1:
            # The first attach creates the DuckLake catalog; two first attaches at once
            # race on PostgreSQL's CREATE TABLE and one fails. The others start after it.
            _wait(f"collector {name}", lambda u=http_url: http_ok(f"{u}/healthz"), proc, log)
    for name, http_url, _, proc, log in started:
        _wait(f"collector {name}", lambda u=http_url: http_ok(f"{u}/healthz"), proc, log)
    return [(name, http_url, otlp_url) for name, http_url, otlp_url, _, _ in started]


def _start_dashboard(fleet: _Fleet, port: int, lake: tuple[str, str]) -> str:
    """The dashboard over the lake (every collector's runs); returns its URL."""
    argv = [*_loopwatch(), "dashboard", "--port", str(port), "--lake", lake[0]]
    proc, log = fleet.spawn("dashboard", [*argv, "--lake-data", lake[1]])
    url = f"http://127.0.0.1:{port}"
    _wait("the dashboard", lambda: http_ok(f"{url}/_stcore/health"), proc, log)
    return url


def _demo(
    collectors: list[tuple[str, str, str]], options: dict[str, Any], stop: threading.Event
) -> None:
    for name, _, otlp_url in collectors:
        if stop.is_set():
            return
        click.echo(f"loopwatch up: replaying recorded agent runs into {name}")
        send_demo(
            otlp_url=otlp_url,
            token=None,
            stop=stop,
            prefix=f"loopwatch up: demo ({name})",
            verbose=False,
            **{**options, "run_prefix": options.get("run_prefix") or f"demo-{name}"},
        )


def _announce(
    collectors: list[tuple[str, str, str]],
    catalog: str,
    data_path: str,
    dashboard: str,
    root: Path,
) -> None:
    click.echo("")
    for name, http_url, otlp_url in collectors:
        click.echo(f"{name + ':':<13}  OTLP/HTTP {otlp_url}   API {http_url}/api/v1/runs")
    click.echo(f"Lake catalog:  ducklake:{catalog}")
    click.echo(f"Lake data:     {data_path}")
    click.echo(f"Logs:          {root}/*.log")
    if dashboard:
        click.echo(f"Dashboard:     {dashboard}   (reads the lake: every collector)")
    click.echo("Ctrl-C stops the fleet.")
    with contextlib.suppress(ValueError, OSError):
        sys.stdout.flush()
