"""Real local servers for the integration tests: the collector, Prometheus, the Node client.

Each helper starts a real process on free loopback ports, waits until it answers, and
hands back a small handle; use it as a context manager (or from a fixture) so the
process is ended even when the test fails. A process still running at interpreter exit
is killed as a last resort.

- :func:`start_collector`: ``loopwatch collector`` as a subprocess on its own DuckDB file.
- :func:`start_prometheus`: Debian's ``prometheus`` scraping one URL every ``interval``.
- :func:`node_modules` / :func:`send_node_spans`: the npm OpenTelemetry JS client in
  ``tests/integration/node`` (``npm ci`` once, into that folder).
- :func:`emit_loopwatch_runs`: real loopwatch runs (the instrumentation, the Python SDK,
  the OTLP/HTTP exporter) sent to a collector; returns the spans that were exported.

System packages (``prometheus``, ``nodejs``, ``npm``) are installed by
``scripts/services.sh``, never by the tests. A missing one skips the test with the
reason, except under ``CI=true``, where it fails: CI must not go green on a missing
install step.

Example::

    with start_collector(tmp_path) as collector:
        spans = emit_loopwatch_runs(collector.otlp_url, ["repeated_action"])
        collector.metrics().value("loopwatch_agent_stops_total", agent="e2e",
                                  stop_reason="repeated_action")
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "NODE_DIR",
    "STOP_SCENARIOS",
    "CollectorProcess",
    "MetricSamples",
    "PrometheusProcess",
    "ServiceError",
    "emit_loopwatch_runs",
    "free_port",
    "loopwatch_command",
    "node_modules",
    "poll_until",
    "run_collector_cli",
    "run_loopwatch",
    "send_node_spans",
    "start_collector",
    "start_prometheus",
    "tool_outcomes",
]

NODE_DIR = Path(__file__).resolve().parent / "node"
T = TypeVar("T")

_live: set[subprocess.Popen[bytes]] = set()

_CHILD_TMPDIR = Path(tempfile.mkdtemp(prefix="lw-test-children-"))
"""``TMPDIR`` of the processes the tests start, removed when the test process exits.

Tests SIGKILL collectors on purpose, and a killed collector cannot remove what it made in
the temporary folder (multiprocessing's ``pymp-*`` folder of its decode workers'
forkserver, for one): without this, every suite run left dozens of them in /tmp.
"""
# Registered before _kill_leftovers, so it runs after it (atexit runs last-in, first-out).
atexit.register(shutil.rmtree, _CHILD_TMPDIR, ignore_errors=True)


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


class ServiceError(AssertionError):
    """A service did not start, answer or stop as expected; the message carries its log."""


def _missing(what: str, install: str) -> None:
    message = f"{what} not found; install it with {install} (scripts/services.sh does)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; a small race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def poll_until(
    probe: Callable[[], T | None],
    *,
    timeout_seconds: float,
    interval_seconds: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns something other than None/False; return that.

    Raises:
        ServiceError: the deadline passed (the message names ``what`` and the last value).
    """
    deadline = time.monotonic() + timeout_seconds
    last: Any = None
    while True:
        last = probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            raise ServiceError(f"timed out after {timeout_seconds:g} s waiting for {what}")
        time.sleep(interval_seconds)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


def _child_env() -> dict[str, str]:
    # The developer's own LOOPWATCH_* and OTEL_* settings must not leak into a test's
    # collector or client.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPWATCH_", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = str(_CHILD_TMPDIR)
    return env


def _terminate(proc: subprocess.Popen[bytes], timeout_seconds: float) -> tuple[int, bool]:
    """SIGTERM, wait; SIGKILL past the deadline. Returns (returncode, ended_in_time)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout_seconds)
        in_time = True
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(timeout=10)
        in_time = False
    _live.discard(proc)
    return code, in_time


# ------------------------------------------------------------------ metrics text


@dataclass(frozen=True)
class MetricSamples:
    """Samples of one Prometheus text exposition, keyed by sample name and labels.

    Counter samples keep their exposition name (``..._total``); histogram samples are
    ``_bucket`` / ``_count`` / ``_sum``.
    """

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> MetricSamples:
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return cls(samples, types)

    def value(self, name: str, **labels: str) -> float | None:
        """The sample with exactly these labels, or None."""
        return self.samples.get((name, frozenset(labels.items())))

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, lab), v in self.samples.items() if n == name and wanted <= lab)

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        """Every sample of ``name``, by label set."""
        return {lab: v for (n, lab), v in self.samples.items() if n == name}


# ------------------------------------------------------------------- collector


def loopwatch_command() -> list[str]:
    """The ``loopwatch`` entry point of the running interpreter's venv."""
    script = Path(sys.executable).with_name("loopwatch")
    if script.exists():
        return [str(script)]
    found = shutil.which("loopwatch")
    return [found] if found else [sys.executable, "-m", "loopwatch.cli"]


@dataclass
class CollectorProcess:
    """A running ``loopwatch collector``.

    Attributes:
        proc: the subprocess. db_path: its DuckDB file. otlp_address / http_address:
        ``HOST:PORT``. stderr_path: its captured stderr. token: bearer token, if any.
    """

    proc: subprocess.Popen[bytes]
    db_path: Path
    otlp_address: str
    http_address: str
    stderr_path: Path
    token: str | None = None
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._client = httpx.Client(base_url=self.http_url, headers=headers, timeout=10.0)

    @property
    def otlp_url(self) -> str:
        """The OTLP/HTTP traces URL (``/v1/traces``)."""
        return f"http://{self.otlp_address}/v1/traces"

    @property
    def http_url(self) -> str:
        """Base URL of ``/metrics``, ``/healthz`` and ``/api/v1``."""
        return f"http://{self.http_address}"

    @property
    def metrics_url(self) -> str:
        return f"{self.http_url}/metrics"

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stderr_text(self) -> str:
        """The collector's stderr so far (the tail)."""
        return _tail(self.stderr_path)

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self._client.get(path, params={k: v for k, v in params.items() if v is not None})

    def get_json(self, path: str, **params: Any) -> Any:
        """GET ``path`` and return its JSON; a non-200 answer fails with the body shown."""
        response = self.get(path, **params)
        if response.status_code != 200:
            raise ServiceError(f"GET {path} -> {response.status_code}: {response.text[:500]}")
        return response.json()

    def runs(self, **filters: Any) -> list[dict[str, Any]]:
        """Every item of ``/api/v1/runs`` (follows ``next_offset``)."""
        items: list[dict[str, Any]] = []
        offset: int | None = 0
        for _ in range(100):
            page = self.get_json("/api/v1/runs", offset=offset, **filters)
            items.extend(page["items"])
            offset = page.get("next_offset")
            if offset is None:
                return items
        raise ServiceError("/api/v1/runs kept paging past 100 pages")

    def run(self, run_id: str) -> dict[str, Any]:
        """``/api/v1/runs/{run_id}``."""
        return dict(self.get_json(f"/api/v1/runs/{run_id}"))

    def metrics_text(self) -> str:
        response = self.get("/metrics")
        if response.status_code != 200:
            raise ServiceError(f"GET /metrics -> {response.status_code}: {response.text[:500]}")
        return response.text

    def metrics(self) -> MetricSamples:
        """``/metrics`` parsed with prometheus_client's parser."""
        return MetricSamples.parse(self.metrics_text())

    def wait_ready(self, timeout_seconds: float) -> None:
        """Poll ``/healthz`` until it answers ``{"status": "ok"}`` and OTLP accepts connections.

        Raises:
            ServiceError: the process exited or the deadline passed (stderr attached).
        """
        host, port = self.otlp_address.rsplit(":", 1)

        def ready() -> bool:
            if not self.running:
                raise ServiceError(
                    f"collector exited with {self.proc.returncode} before it was ready; "
                    f"stderr:\n{self.stderr_text()}"
                )
            try:
                health = self._client.get("/healthz", timeout=1.0)
                if health.status_code != 200 or health.json().get("status") != "ok":
                    return False
                with socket.create_connection((host, int(port)), timeout=1.0):
                    return True
            except (httpx.HTTPError, OSError, ValueError):
                return False

        try:
            poll_until(ready, timeout_seconds=timeout_seconds, what="collector /healthz")
        except ServiceError as exc:
            if self.running:
                self.kill()
                raise ServiceError(f"{exc}; stderr:\n{self.stderr_text()}") from None
            raise

    def stop(self, timeout_seconds: float = 20.0) -> int:
        """SIGTERM and wait (the collector drains its queue); returns the exit code.

        Raises:
            ServiceError: it did not end within ``timeout_seconds`` (it is then killed).
        """
        code, in_time = _terminate(self.proc, timeout_seconds)
        self._client.close()
        if not in_time:
            raise ServiceError(
                f"collector ignored SIGTERM for {timeout_seconds:g} s and was killed; "
                f"stderr:\n{self.stderr_text()}"
            )
        return code

    def kill(self) -> int:
        """SIGKILL (no drain); returns the exit code (``-9``)."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait(timeout=10)
        _live.discard(self.proc)
        self._client.close()
        return code

    def __enter__(self) -> CollectorProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.running:
            with contextlib.suppress(ServiceError):
                self.stop(timeout_seconds=10.0)
        self._client.close()


def start_collector(
    tmp_path: Path,
    *extra_args: str,
    db_path: Path | None = None,
    token: str | None = None,
    ready_timeout_seconds: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> CollectorProcess:
    """Start ``loopwatch collector`` on free loopback ports and wait until it is ready.

    Runs ``<venv>/bin/loopwatch collector --db DB --otlp-http 127.0.0.1:P1 --http
    127.0.0.1:P2 [--token-file F] *extra_args`` with stderr captured to a file in
    ``tmp_path`` (and ``LOOPWATCH_*`` variables removed from its environment).

    Args:
        tmp_path: folder for the database, token file and logs.
        extra_args: more command-line arguments.
        db_path: the DuckDB file (default ``tmp_path / "collector.duckdb"``); pass the
            same path again to restart on the same data.
        token: bearer token to require (written to a file, passed as ``--token-file``).
        ready_timeout_seconds: how long to wait for ``/healthz``.
        env: variables added to the child's environment (e.g. the lake's test hook).

    Raises:
        ServiceError: the collector exited or did not become ready (stderr attached).
    """
    db = db_path or tmp_path / "collector.duckdb"
    otlp_port = free_port()
    http_port = free_port()
    while http_port == otlp_port:
        http_port = free_port()
    args = [
        "collector",
        "--db",
        str(db),
        "--otlp-http",
        f"127.0.0.1:{otlp_port}",
        "--http",
        f"127.0.0.1:{http_port}",
    ]
    if token is not None:
        token_file = tmp_path / "collector.token"
        token_file.write_text(token + "\n", encoding="utf-8")
        args += ["--token-file", str(token_file)]
    index = len(list(tmp_path.glob("collector-*.stderr")))
    stderr_path = tmp_path / f"collector-{index}.stderr"
    with open(stderr_path, "wb") as err, open(tmp_path / f"collector-{index}.stdout", "wb") as out:
        proc = subprocess.Popen(
            [*loopwatch_command(), *args, *extra_args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env={**_child_env(), **(env or {})},
            start_new_session=True,
        )
    _live.add(proc)
    collector = CollectorProcess(
        proc, db, f"127.0.0.1:{otlp_port}", f"127.0.0.1:{http_port}", stderr_path, token
    )
    collector.wait_ready(ready_timeout_seconds)
    return collector


def run_collector_cli(
    *args: str, cwd: Path, timeout_seconds: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``loopwatch collector *args`` to completion (for config errors)."""
    return run_loopwatch("collector", *args, cwd=cwd, timeout_seconds=timeout_seconds)


def run_loopwatch(
    command: str, *args: str, cwd: Path, timeout_seconds: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``loopwatch COMMAND *args`` to completion, output captured, with a clean
    environment (no LOOPWATCH_* or OTEL_* settings of the developer's)."""
    return subprocess.run(
        [*loopwatch_command(), command, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_child_env(),
        stdin=subprocess.DEVNULL,
        timeout=timeout_seconds,
        check=False,
    )


# ------------------------------------------------------------------ prometheus


@dataclass
class PrometheusProcess:
    """A running Prometheus with one scrape job (``loopwatch``)."""

    proc: subprocess.Popen[bytes]
    address: str
    config_path: Path
    data_dir: Path
    log_path: Path
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._client = httpx.Client(base_url=self.url, timeout=10.0)

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return _tail(self.log_path)

    def query_response(self, promql: str) -> dict[str, Any]:
        """``GET /api/v1/query?query=...``: the whole JSON answer (errors included)."""
        response = self._client.get("/api/v1/query", params={"query": promql})
        try:
            body: dict[str, Any] = response.json()
        except ValueError:
            raise ServiceError(
                f"{promql!r} -> {response.status_code}: {response.text[:300]}"
            ) from None
        return body

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query; returns ``data.result``.

        Raises:
            ServiceError: Prometheus answered ``status: error`` (its message attached).
        """
        body = self.query_response(promql)
        if body.get("status") != "success":
            raise ServiceError(f"{promql!r}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(
        self,
        promql: str,
        accept: Callable[[list[dict[str, Any]]], bool],
        *,
        timeout_seconds: float = 20.0,
    ) -> list[dict[str, Any]]:
        """Poll ``promql`` until ``accept(result)``; returns that result."""
        last: list[list[dict[str, Any]]] = [[]]

        def probe() -> list[dict[str, Any]] | None:
            result = self.query(promql)
            last[0] = result
            return result if accept(result) else None

        try:
            return poll_until(
                probe, timeout_seconds=timeout_seconds, interval_seconds=0.25, what=promql
            )
        except ServiceError as exc:
            raise ServiceError(f"{exc}; last result: {last[0]}") from None

    def targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets`` active targets (scrape health and last error)."""
        body = self._client.get("/api/v1/targets").json()
        active: list[dict[str, Any]] = body["data"]["activeTargets"]
        return active

    def wait_first_scrape(self, timeout_seconds: float = 20.0) -> None:
        """Wait until the loopwatch target was scraped successfully (``up == 1``)."""
        try:
            self.wait_for(
                'up{job="loopwatch"} == 1', lambda r: len(r) == 1, timeout_seconds=timeout_seconds
            )
        except ServiceError as exc:
            raise ServiceError(
                f"{exc}; targets: {self.targets()}; log:\n{self.log_text()}"
            ) from None

    def stop(self, timeout_seconds: float = 20.0) -> int:
        code, _ = _terminate(self.proc, timeout_seconds)
        self._client.close()
        return code

    def __enter__(self) -> PrometheusProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.running:
            self.stop(timeout_seconds=10.0)
        self._client.close()


def start_prometheus(
    tmp_path: Path,
    scrape_url: str,
    interval: str = "1s",
    *,
    bearer_token_file: Path | None = None,
    rule_files: Sequence[Path] = (),
    ready_timeout_seconds: float = 30.0,
    first_scrape_timeout_seconds: float = 20.0,
) -> PrometheusProcess:
    """Start Prometheus scraping ``scrape_url`` every ``interval``; wait for its first scrape.

    Writes ``prometheus.yml`` and a fresh ``--storage.tsdb.path`` under ``tmp_path``,
    listens on a free loopback port, polls ``/-/ready``, then waits until the target is
    up (the first scrape lands a few seconds after start). ``rule_files`` are loaded as
    recording/alerting rules, evaluated every ``interval``.

    Raises:
        ServiceError: Prometheus exited, never became ready, or never scraped the target.
    """
    binary = shutil.which("prometheus")
    if binary is None:
        _missing("prometheus", "`apt-get install prometheus`")
    assert binary is not None
    target = urlsplit(scrape_url)
    root = tmp_path / f"prometheus-{len(list(tmp_path.glob('prometheus-*')))}"
    data_dir = root / "data"
    data_dir.mkdir(parents=True)
    config = [
        "global:",
        f"  scrape_interval: {interval}",
        f"  scrape_timeout: {interval}",
        f"  evaluation_interval: {interval}",
        *(["rule_files:"] if rule_files else []),
        *(f"  - {json.dumps(str(Path(path).resolve()))}" for path in rule_files),
        "scrape_configs:",
        "  - job_name: loopwatch",
        f"    scheme: {target.scheme or 'http'}",
        f"    metrics_path: {json.dumps(target.path or '/metrics')}",
        "    static_configs:",
        f"      - targets: [{json.dumps(target.netloc)}]",
    ]
    if bearer_token_file is not None:
        config += [
            "    authorization:",
            "      type: Bearer",
            f"      credentials_file: {json.dumps(str(bearer_token_file))}",
        ]
    config_path = root / "prometheus.yml"
    config_path.write_text("\n".join(config) + "\n", encoding="utf-8")
    port = free_port()
    log_path = root / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            start_new_session=True,
        )
    _live.add(proc)
    prom = PrometheusProcess(proc, f"127.0.0.1:{port}", config_path, data_dir, log_path)

    def ready() -> bool:
        if not prom.running:
            raise ServiceError(f"prometheus exited with {proc.returncode}; log:\n{prom.log_text()}")
        try:
            return httpx.get(f"{prom.url}/-/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll_until(ready, timeout_seconds=ready_timeout_seconds, what="prometheus /-/ready")
        prom.wait_first_scrape(first_scrape_timeout_seconds)
    except BaseException:
        prom.stop(timeout_seconds=10.0)
        raise
    return prom


# ------------------------------------------------------------------------ node

_node_modules: Path | None = None


def _lock_digest() -> str:
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        path = NODE_DIR / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def node_modules(timeout_seconds: float = 300.0) -> Path:
    """``tests/integration/node/node_modules``, installed from the lock file once.

    Runs ``npm ci`` (``npm install`` when there is no lock file) when the folder is
    missing or was installed from another ``package-lock.json``; a stamp file in the
    folder records which. ``scripts/services.sh`` runs the same install beforehand, so
    tests normally find it ready. Skips when node or npm is absent (fails under CI).

    Raises:
        ServiceError: npm failed (its output attached).
    """
    global _node_modules
    if _node_modules is not None:
        return _node_modules
    if shutil.which("node") is None or shutil.which("npm") is None:
        _missing("node and npm", "`apt-get install nodejs npm`")
    modules = NODE_DIR / "node_modules"
    stamp = modules / ".loopwatch-lock-sha256"
    digest = _lock_digest()
    lock_path = Path(tempfile.gettempdir()) / "loopwatch-node-modules.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text().strip() == digest):
            has_lock = (NODE_DIR / "package-lock.json").exists()
            command = ["npm", "ci"] if has_lock else ["npm", "install"]
            done = subprocess.run(
                [*command, "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=NODE_DIR,
                capture_output=True,
                text=True,
                timeout=timeout_seconds,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            if done.returncode != 0:
                raise ServiceError(
                    f"{' '.join(command)} failed ({done.returncode}):\n"
                    f"{(done.stdout + done.stderr)[-3000:]}"
                )
            stamp.write_text(digest + "\n")
    _node_modules = modules
    return modules


def send_node_spans(url: str, *args: str, timeout_seconds: float = 30.0) -> dict[str, Any]:
    """Run ``node send_spans.js URL *args``; returns the JSON line it prints.

    Raises:
        ServiceError: node exited non-zero or printed no JSON (stderr attached).
    """
    node_modules()
    try:
        done = subprocess.run(
            ["node", str(NODE_DIR / "send_spans.js"), url, *args],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"send_spans.js did not finish in {timeout_seconds:g} s") from exc
    if done.returncode != 0:
        raise ServiceError(f"send_spans.js exited {done.returncode}: {done.stderr[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ServiceError(f"send_spans.js printed no JSON: {done.stdout[-500:]!r}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# -------------------------------------------------------- loopwatch runs (Python)

STOP_SCENARIOS = ("repeated_action", "budget_exhausted", "completed")


@contextlib.contextmanager
def _exporting(otlp_url: str, token: str | None, protocol: str) -> Iterator[tuple[Any, Any]]:
    from loopwatch.instrumentation.otlp import configure_otlp
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(
            resource=Resource.create({"service.name": "loopwatch-integration"})
        )
        exporter = OTLPSpanExporter(
            endpoint=otlp_url,
            insecure=True,
            headers=(("authorization", f"Bearer {token}"),) if token else None,
            timeout=10,
        )
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    else:
        provider = configure_otlp(
            endpoint=otlp_url,
            service_name="loopwatch-integration",
            token=token,
            timeout_seconds=10.0,
            schedule_delay_millis=100,
            set_global=False,
        )
    # The same spans are kept in memory: the test's ground truth for what was exported.
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    try:
        yield provider, memory
    finally:
        provider.shutdown()


def emit_loopwatch_runs(
    otlp_url: str,
    scenarios: Sequence[str],
    *,
    agent: str = "e2e",
    token: str | None = None,
    run_id_prefix: str = "run",
    protocol: str = "http/protobuf",
) -> tuple[dict[str, str], tuple[Any, ...]]:
    """Run real guarded agent loops and export their spans over OTLP/HTTP (protobuf), or
    with ``protocol="grpc"`` through the SDK's OTLP/gRPC exporter to ``otlp_url``
    (``HOST:PORT``).

    Each scenario name is the stop reason it produces, with a real :class:`Run`, a
    :class:`ScriptedModel` and the testing kit's tools:

    - ``repeated_action``: the same ``lookup_order`` call on a :class:`ConstantTool`,
      ``repeat_limit=3`` (two ``ok`` calls, the third ``blocked``).
    - ``budget_exhausted``: paging ``search_orders`` with ``max_model_turns=2``.
    - ``completed``: one ``lookup_order`` call, then a final answer.

    Returns:
        ``({run_id: expected stop reason}, every span exported)``; ``provider.shutdown()``
        has flushed the exporter when this returns.
    """
    from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
    from loopwatch.instrumentation.testing import (
        ConstantTool,
        CursorTool,
        ScriptedModel,
        drive,
        tool_loop,
    )

    expected: dict[str, str] = {}
    with _exporting(otlp_url, token, protocol) as (provider, memory):
        for index, scenario in enumerate(scenarios):
            run_id = f"{run_id_prefix}-{index}-{scenario}"
            lookup = ConstantTool(name="lookup_order")
            if scenario == "repeated_action":
                policy = Policy.build(repeat_limit=3)
                model = tool_loop("lookup_order", {"order_id": "A-1"}, times=6, final="x")
                tools: dict[str, Any] = {"lookup_order": lookup}
            elif scenario == "budget_exhausted":
                policy = Policy.build(max_model_turns=2)
                model = ScriptedModel(
                    Decision.tool(ToolCall("search_orders", {"query": "late", "cursor": str(i)}))
                    for i in range(4)
                )
                tools = {"search_orders": CursorTool()}
            elif scenario == "completed":
                policy = Policy.build()
                model = ScriptedModel(
                    [
                        Decision.tool(ToolCall("lookup_order", {"order_id": "B-2"})),
                        Decision.final("shipped"),
                    ]
                )
                tools = {"lookup_order": lookup}
            else:
                raise ValueError(f"unknown scenario {scenario!r}")
            with Run(agent, policy, tools=tools, run_id=run_id, tracer_provider=provider) as run:
                drive(run, model)
            if run.outcome.stop.reason.value != scenario:
                raise AssertionError(f"{run_id}: scenario stopped as {run.outcome.stop.reason}")
            expected[run_id] = scenario
    return expected, tuple(memory.get_finished_spans())


def tool_outcomes(spans: Iterable[Any]) -> dict[tuple[str, str], int]:
    """``{(tool, outcome): count}`` over the loopwatch tool spans in ``spans``."""
    from loopwatch.instrumentation import _semconv as sc

    counts: dict[tuple[str, str], int] = {}
    for span in spans:
        attrs = span.attributes or {}
        if attrs.get(sc.LW_EVENT) == sc.EVENT_TOOL_RESULT:
            key = (str(attrs[sc.GEN_AI_TOOL_NAME]), str(attrs[sc.LW_TOOL_OUTCOME]))
            counts[key] = counts.get(key, 0) + 1
    return counts
