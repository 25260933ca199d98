"""Helpers for the reliability tests: a collector on chosen ports, memory readings, the store.

:func:`launch_collector` starts ``loopwatch collector`` like
:func:`tests.integration.services.start_collector`, but on ports the caller may fix, so a
collector killed with SIGKILL can be restarted where its clients keep sending, and with
a TOML config and extra environment (``LOOPWATCH_LOG_LEVEL=debug``).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import duckdb
import httpx

from tests.integration.services import (
    CollectorProcess,
    _child_env,
    _live,
    free_port,
    loopwatch_command,
)

__all__ = [
    "collector_ports",
    "launch_collector",
    "peak_rss_bytes",
    "post_until_stored",
    "rss_bytes",
    "span_keys_in_store",
    "store_query",
]


def collector_ports() -> tuple[int, int]:
    """Two distinct free loopback ports (OTLP, HTTP)."""
    otlp = free_port()
    http = free_port()
    while http == otlp:
        http = free_port()
    return otlp, http


def launch_collector(
    tmp_path: Path,
    *,
    db_path: Path,
    ports: tuple[int, int] | None = None,
    config: str | None = None,
    token: str | None = None,
    canaries: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    ready_timeout_seconds: float = 30.0,
) -> CollectorProcess:
    """Start ``loopwatch collector`` and wait for ``/healthz``.

    Args:
        tmp_path: folder for logs, config, token and canary files.
        db_path: the DuckDB file (reuse it to restart on the same data).
        ports: ``(otlp, http)``; free ones when None.
        config: TOML text written to ``collector.toml`` and passed with ``--config``.
        token: bearer token, written to a file passed with ``--token-file``.
        canaries: canary values, written to a file passed with ``--canaries``.
        env: extra environment (``LOOPWATCH_*`` of the caller's own are removed).

    Raises:
        ServiceError: the collector exited or did not become ready (stderr attached).
    """
    otlp_port, http_port = ports or collector_ports()
    args = [
        "collector",
        "--db",
        str(db_path),
        "--otlp-http",
        f"127.0.0.1:{otlp_port}",
        "--http",
        f"127.0.0.1:{http_port}",
    ]
    if config is not None:
        path = tmp_path / "collector.toml"
        path.write_text(config, encoding="utf-8")
        args += ["--config", str(path)]
    if token is not None:
        path = tmp_path / "collector.token"
        path.write_text(token + "\n", encoding="utf-8")
        args += ["--token-file", str(path)]
    values = list(canaries)
    if values:
        path = tmp_path / "canaries.txt"
        path.write_text("# planted by tests/reliability\n" + "\n".join(values) + "\n", "utf-8")
        args += ["--canaries", str(path)]
    index = len(list(tmp_path.glob("collector-*.stderr")))
    stderr_path = tmp_path / f"collector-{index}.stderr"
    child_env = _child_env()
    child_env.update(env or {})
    with open(stderr_path, "wb") as err, open(tmp_path / f"collector-{index}.stdout", "wb") as out:
        proc = subprocess.Popen(
            [*loopwatch_command(), *args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=child_env,
            start_new_session=True,
        )
    _live.add(proc)
    collector = CollectorProcess(
        proc, db_path, f"127.0.0.1:{otlp_port}", f"127.0.0.1:{http_port}", stderr_path, token
    )
    collector.wait_ready(ready_timeout_seconds)
    return collector


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` now (``VmRSS``), in bytes."""
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size of ``pid`` so far (``VmHWM``), in bytes."""
    return _status_kib(pid, "VmHWM") * 1024


def store_query(db_path: Path, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one query on a stopped collector's DuckDB file (read-only)."""
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def span_keys_in_store(db_path: Path) -> set[tuple[int, int]]:
    """``(span_key, trace_key)`` of every span recorded in ``spans_seen`` (store keys)."""
    return {
        (int(a), int(b))
        for a, b in store_query(db_path, "SELECT span_key, trace_key FROM spans_seen")
    }


def store_key(trace_id: str, span_id: str) -> tuple[int, int]:
    """The store's key of a span: 64-bit span id and low 64 bits of the trace id."""
    return int(span_id, 16), int(trace_id[-16:], 16)


def post_until_stored(
    client: httpx.Client,
    url: str,
    body: bytes,
    content_type: str,
    *,
    deadline_seconds: float = 60.0,
    honour_retry_after: bool = True,
) -> tuple[httpx.Response, int]:
    """POST ``body`` until it is answered 200; return the answer and the retries made.

    A 429/503 must carry ``Retry-After`` (else AssertionError: a refusal the client
    cannot act on); the wait is that many seconds (or 50 ms when not honoured).

    Raises:
        AssertionError: another status, a refusal without ``Retry-After``, or the deadline.
    """
    retries = 0
    end = time.monotonic() + deadline_seconds
    while True:
        response = client.post(url, content=body, headers={"Content-Type": content_type})
        if response.status_code == 200:
            return response, retries
        assert response.status_code in (429, 503), (response.status_code, response.text[:300])
        assert "retry-after" in response.headers, response.headers
        retries += 1
        assert time.monotonic() < end, f"not stored after {retries} retries"
        wait = float(response.headers["retry-after"]) if honour_retry_after else 0.05
        time.sleep(min(wait, max(end - time.monotonic(), 0)))


def env_without_loopwatch() -> dict[str, str]:
    """The environment minus ``LOOPWATCH_*`` (for client subprocesses)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
