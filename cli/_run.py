"""``loopwatch up`` and ``loopwatch demo``.

``demo`` replays recorded trajectories through the real instrumentation into a running
collector (:mod:`loopwatch.replay.demo`). ``up`` runs the collector in this process and
the dashboard as a child process on the embedded DuckDB default, optionally feeds the
demo into it once the collector is healthy, prints the URLs (the dashboard's last), and
serves until SIGINT or SIGTERM: the collector stops accepting, commits what it holds
and checkpoints DuckDB; the dashboard child is terminated and waited for.

Exit codes: 0 done (or stopped by a signal), 1 the demo could not send (collector
unreachable, spans refused), 2 bad configuration or a missing extra.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click

from ._demo import demo_canary_file, read_token, send_demo
from ._options import (
    collector_api,
    collector_options,
    collector_overrides,
    http_ok,
    start_failure,
)

__all__ = ["demo", "up"]

_DASHBOARD_START_SECONDS: Final = 90.0
_DASHBOARD_STOP_SECONDS: Final = 10.0


_CORPUS_HELP = (
    "Recorded runs: a file or folder in any supported format (repeatable). Default: "
    "../shared/corpus when present, else the example runs shipped with loopwatch."
)
_POLICY_HELP = (
    "Replay policy: FILE[:PROFILE] or a built-in profile name. Default: the package's "
    "replay/policies/default.toml, else the guard's default profile; without --policy, a "
    "run that records its own policy (metadata.replay.policy, as the shipped examples "
    "do) plays under that one."
)


@click.command("demo")
@click.option("--corpus", multiple=True, type=click.Path(exists=True), help=_CORPUS_HELP)
@click.option(
    "--otlp",
    "otlp_url",
    help="Collector OTLP/HTTP traces URL (default http://127.0.0.1:4318/v1/traces, "
    "or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT).",
)
@click.option("--policy", help=_POLICY_HELP)
@click.option(
    "--speed",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="0: as fast as possible; K: K recorded seconds per real second (gaps capped at 5 s).",
)
@click.option("--limit", type=click.IntRange(min=0), help="Replay at most this many runs.")
@click.option(
    "--capture-content/--no-capture-content",
    default=True,
    show_default=True,
    help="Record tool arguments and results on spans (the collector redacts them).",
)
@click.option(
    "--window-hours",
    type=click.FloatRange(min=0.0),
    default=24.0,
    show_default=True,
    help="Spread the runs' span times over the last this many hours; 0: send them as "
    "they are replayed.",
)
@click.option("--token-file", help="Bearer token file of a collector started with --token-file.")
@click.option("--run-prefix", help="Run-id prefix (default demo-<6 hex digits>).")
@click.option("-v", "--verbose", is_flag=True, help="One line per run: stop reason and run id.")
def demo(token_file: str | None, window_hours: float, **options: Any) -> None:
    """Replay recorded trajectories through the real instrumentation into a collector.

    Each recorded run becomes a guarded run (decisions from a scripted model, recorded
    observations from the tools) whose spans go over OTLP/HTTP to a running collector,
    spread over the last 24 hours by their span times, with content captured. A few
    runs carry the planted canary lw-canary-demo-6b3e91f4 (put it in the collector's
    --canaries file to see them flagged). Prints runs sent, stops by reason and spans
    exported.
    """
    raise SystemExit(
        send_demo(token=read_token(token_file), window_seconds=window_hours * 3600.0, **options)
    )


# ------------------------------------------------------------------------- up


class _Dashboard:
    """The dashboard child: started at most once, never after shutdown began."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = False
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, starter: Callable[[], subprocess.Popen[bytes]]) -> bool:
        with self._lock:
            if self._closing:
                return False
            self.proc = starter()
            return True

    def close(self) -> None:
        with self._lock:
            self._closing = True
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=_DASHBOARD_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_dashboard(
    collector_url: str, port: int, token_file: str | None
) -> subprocess.Popen[bytes]:
    """Streamlit over the collector's API, quiet: its banner and info log would bury the
    URLs."""
    from loopwatch.dashboard.cli import start_dashboard

    return start_dashboard(collector_url, port=port, token_file=token_file, quiet=True)


def _port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (Streamlit would fail on a busy port only
    after the collector had started and the demo had run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As Tornado binds: a port left in TIME_WAIT by a previous dashboard is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _wait(ready: threading.Event, closing: threading.Event) -> bool:
    while not ready.wait(0.1):
        if closing.is_set():
            return False
    return not closing.is_set()


def _companion(
    *,
    ready: threading.Event,
    closing: threading.Event,
    dashboard: _Dashboard | None,
    dashboard_url: str,
    collector_url: str,
    otlp_url: str,
    dashboard_port: int,
    token_file: str | None,
    token: str | None,
    demo_options: dict[str, Any] | None,
    early: threading.Event | None = None,
    otlp_grpc: str = "",
) -> None:
    """After the collector is ready: dashboard, demo, then the URLs (dashboard last).

    A stop signal that came while the collector was starting (``early``) is sent again
    now that the collector handles it, and nothing else is started."""
    if not _wait(ready, closing):
        return
    if early is not None and early.is_set():
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if dashboard is not None:
        try:
            dashboard.start(lambda: _start_dashboard(collector_url, dashboard_port, token_file))
        except (ImportError, ValueError, OSError) as exc:
            click.echo(f"loopwatch up: dashboard not started: {exc}", err=True)
            dashboard = None
    if demo_options is not None and not closing.is_set():
        click.echo("loopwatch up: collector ready; replaying recorded agent runs into it")
        send_demo(
            otlp_url=otlp_url,
            token=token,
            stop=closing,
            prefix="loopwatch up: demo",
            verbose=False,
            **demo_options,
        )
    if dashboard is not None:
        deadline = time.monotonic() + _DASHBOARD_START_SECONDS
        while not closing.is_set() and not http_ok(f"{dashboard_url}/_stcore/health"):
            proc = dashboard.proc
            if proc is not None and proc.poll() is not None:
                click.echo(
                    f"loopwatch up: the dashboard exited ({proc.returncode}); the collector "
                    "keeps serving",
                    err=True,
                )
                dashboard = None
                break
            if time.monotonic() > deadline:
                click.echo("loopwatch up: the dashboard did not answer yet", err=True)
                break
            time.sleep(0.2)
    if closing.is_set():
        return
    click.echo("")
    click.echo(f"OTLP/HTTP:     {otlp_url}")
    if otlp_grpc:
        click.echo(f"OTLP/gRPC:     {otlp_grpc}")
    click.echo(f"Runs (API):    {collector_url}/api/v1/runs")
    click.echo(f"Metrics:       {collector_url}/metrics")
    click.echo(
        "Ctrl-C stops the collector and the dashboard."
        if dashboard is not None
        else "Ctrl-C stops the collector."
    )
    if dashboard is not None:
        click.echo(f"Dashboard:     {dashboard_url}")
    sys.stdout.flush()


def _hold_stop_signals_until_serving() -> threading.Event:
    """Catch SIGINT/SIGTERM until the collector installs its own handlers.

    A KeyboardInterrupt raised while the collector opens its store can be lost in the
    database driver, leaving a collector that serves on after Ctrl-C. Until the
    collector's event loop takes the signals over, the first one only sets the returned
    event (the companion thread repeats it once the collector is ready); a second one
    raises KeyboardInterrupt as usual, for a start that hangs.
    """
    early = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if early.is_set():
            raise KeyboardInterrupt
        early.set()
        click.echo("loopwatch up: stopping once the collector has started", err=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread (tests)
            signal.signal(sig, on_signal)
    return early


@click.command("up")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="Collector TOML.")
@collector_options
@click.option(
    "--dashboard-port",
    default=8501,
    show_default=True,
    type=int,
    envvar="LOOPWATCH_DASHBOARD_PORT",
    help="Dashboard port (env LOOPWATCH_DASHBOARD_PORT).",
)
@click.option("--no-dashboard", is_flag=True, help="Run the collector only.")
@click.option("--demo", "with_demo", is_flag=True, help="Feed the demo once the collector is up.")
@click.option("--corpus", multiple=True, type=click.Path(exists=True), help=_CORPUS_HELP)
@click.option("--policy", help=_POLICY_HELP)
@click.option("--speed", type=click.FloatRange(min=0.0), default=0.0, help="Demo replay speed.")
@click.option("--limit", type=click.IntRange(min=0), help="Demo: at most this many runs.")
@click.option("--run-prefix", help="Demo run-id prefix (default demo-<6 hex digits>).")
@click.option(
    "--fleet",
    type=click.IntRange(min=1, max=16),
    help="Fleet mode on this machine: PostgreSQL, N collectors shipping to one lake, the "
    "dashboard (docs/lake.md). Collector flags are ignored.",
)
def up(
    config_file: str | None,
    dashboard_port: int,
    no_dashboard: bool,
    with_demo: bool,
    corpus: tuple[str, ...],
    policy: str | None,
    speed: float,
    limit: int | None,
    run_prefix: str | None,
    fleet: int | None,
    **params: Any,
) -> None:
    """Collector + dashboard on the embedded DuckDB default; prints the URLs.

    Serves until Ctrl-C or SIGTERM, then stops both: the collector commits what it holds
    before exiting, the dashboard child is terminated. --demo replays recorded runs
    into the collector once it is healthy (see loopwatch demo).
    """
    api = collector_api("loopwatch up needs the collector extra", "all")
    if fleet is not None:
        from ._fleet import run_fleet

        raise SystemExit(
            run_fleet(
                fleet,
                dashboard_port=dashboard_port,
                no_dashboard=no_dashboard,
                demo_options={
                    "corpus": corpus,
                    "policy": policy,
                    "speed": speed,
                    "limit": limit,
                    "capture_content": None,
                    "run_prefix": run_prefix,
                }
                if with_demo
                else None,
            )
        )
    if not 0 < dashboard_port < 65536:
        click.echo(
            f"loopwatch up: --dashboard-port must be in 1..65535, got {dashboard_port}", err=True
        )
        raise SystemExit(2)
    try:
        config = api.load_config(config_file, overrides=collector_overrides(params))
        token = config.token()
    except api.ConfigError as exc:
        click.echo(f"loopwatch up: configuration error: {exc}", err=True)
        raise SystemExit(2) from None

    if not no_dashboard and not _port_free("127.0.0.1", dashboard_port):
        click.echo(
            f"loopwatch up: cannot start the dashboard: 127.0.0.1:{dashboard_port} is in use "
            "(pick another with --dashboard-port or LOOPWATCH_DASHBOARD_PORT, "
            "or pass --no-dashboard)",
            err=True,
        )
        raise SystemExit(2)
    if with_demo and not config.redaction.canaries_file:
        # The demo plants a canary in a few runs: flag them, so the canary panel has data.
        params["canaries"] = str(demo_canary_file(Path(tempfile.mkdtemp(prefix="lw-up-"))))
        config = api.load_config(config_file, overrides=collector_overrides(params))
    if with_demo and Path(config.store.db).exists():
        click.echo(
            f"loopwatch up: {config.store.db} already holds runs; the demo adds its own "
            "(pass --db with a new file for a fresh store)",
            err=True,
        )

    ready = threading.Event()
    closing = threading.Event()
    dashboard = None if no_dashboard else _Dashboard()
    demo_options: dict[str, Any] | None = None
    if with_demo:
        demo_options = {
            "corpus": corpus,
            "policy": policy,
            "speed": speed,
            "limit": limit,
            "capture_content": True,
            "run_prefix": run_prefix,
        }
    collector_url = f"http://{config.server.http}"
    early = _hold_stop_signals_until_serving()
    companion = threading.Thread(
        target=_companion,
        name="loopwatch-up",
        daemon=True,
        kwargs={
            "ready": ready,
            "closing": closing,
            "dashboard": dashboard,
            "dashboard_url": f"http://127.0.0.1:{dashboard_port}",
            "collector_url": collector_url,
            "otlp_url": f"http://{config.server.otlp_http}/v1/traces",
            "dashboard_port": dashboard_port,
            "token_file": config.server.token_file or None,
            "token": token,
            "demo_options": demo_options,
            "early": early,
            "otlp_grpc": config.server.otlp_grpc,
        },
    )
    code = 0
    # This process is the collector's (the dashboard is a child): see keep_pandas_unloaded.
    api.keep_pandas_unloaded()
    companion.start()
    try:
        # The companion prints the URLs once everything is up (dashboard last).
        api.serve_forever(config, ready=ready, announce=False)
    except KeyboardInterrupt:
        pass
    except api.ConfigError as exc:
        click.echo(f"loopwatch up: configuration error: {exc}", err=True)
        code = 2
    except (OSError, api.StoreUnavailable, api.LakeUnavailable) as exc:
        click.echo(f"loopwatch up: cannot start the collector: {start_failure(exc)}", err=True)
        code = 2
    finally:
        # Stopping already: a second Ctrl-C or SIGTERM must not cut the cleanup short
        # and leave the dashboard child behind.
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):
                signal.signal(sig, signal.SIG_IGN)
        closing.set()
        # A demo cut short by the signal now fails to export to the stopped collector;
        # its retries are expected and would only bury the shutdown message.
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
        if dashboard is not None:
            dashboard.close()
        companion.join(timeout=2.0)
        if companion.is_alive() and with_demo:
            click.echo(
                "loopwatch up: the demo was cut short; its unsent runs are dropped", err=True
            )
    if code == 0:
        click.echo("loopwatch up: stopped", err=True)
    raise SystemExit(code)
