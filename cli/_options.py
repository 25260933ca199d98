"""What ``loopwatch collector`` and ``loopwatch up`` share: the collector's flags and API.

One definition per flag, so the two commands cannot drift apart: each flag maps to one
``[section] field`` of the collector's TOML configuration, and :func:`collector_overrides`
turns the parsed values into ``load_config``'s ``overrides`` (``None`` values, flags
not given, leave the file, environment or default in place). The collector itself is
imported lazily (:func:`collector_api`), so the agent-side install runs the other
commands; a missing extra prints its ``pip install`` line (:func:`exit_missing_extra`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeVar

import click

__all__ = [
    "COLLECTOR_FLAGS",
    "CollectorApi",
    "collector_api",
    "collector_options",
    "collector_overrides",
    "exit_missing_extra",
    "start_failure",
]

_F = TypeVar("_F", bound=Callable[..., Any])

COLLECTOR_FLAGS: Final = (
    # (flag, click parameter, config section, config field, metavar, help)
    ("--db", "db", "store", "db", "FILE", "DuckDB file (default ./loopwatch.duckdb)."),
    (
        "--otlp-http",
        "otlp_http",
        "server",
        "otlp_http",
        "HOST:PORT",
        "OTLP/HTTP listen address HOST:PORT (default 127.0.0.1:4318).",
    ),
    (
        "--otlp-grpc",
        "otlp_grpc",
        "server",
        "otlp_grpc",
        "HOST:PORT",
        "Also receive OTLP/gRPC on HOST:PORT (usually 127.0.0.1:4317; default: off).",
    ),
    (
        "--http",
        "http_addr",
        "server",
        "http",
        "HOST:PORT",
        "/metrics, /healthz and API address HOST:PORT (default 127.0.0.1:9464).",
    ),
    (
        "--canaries",
        "canaries",
        "redaction",
        "canaries_file",
        "FILE",
        "Canary file: one value per line, '#' comments.",
    ),
    (
        "--token-file",
        "token_file",
        "server",
        "token_file",
        "FILE",
        "File holding the bearer token required on OTLP and the API.",
    ),
    (
        "--retention-days",
        "retention_days",
        "store",
        "retention_days",
        "DAYS",
        "Remove runs whose last span arrived more than DAYS ago; counter totals stay "
        "(default 0: keep everything).",
    ),
    (
        "--lake",
        "lake",
        "lake",
        "catalog",
        "CATALOG",
        "Ship finished runs to this DuckLake catalog, e.g. "
        "'postgres:dbname=lake host=127.0.0.1 port=5432' (default: no lake).",
    ),
    (
        "--lake-data",
        "lake_data",
        "lake",
        "data_path",
        "PATH",
        "The lake's data path (folder or s3://bucket/prefix/), the same for every collector.",
    ),
    (
        "--collector-id",
        "collector_id",
        "lake",
        "collector_id",
        "ID",
        "This collector's name in the lake (default: the host name).",
    ),
    (
        "--local-retention",
        "local_retention",
        "lake",
        "local_retention_seconds",
        "DURATION",
        "Remove a run from the local file this long after it shipped (90s, 15m, 12h, 7d; "
        "default 0: keep until --retention-days). Unshipped runs are never removed.",
    ),
)
"""Each collector flag: its name, click parameter, the configuration setting it
overrides (section and field), metavar and help text."""


def collector_options(command: _F) -> _F:
    """Decorate a click command with the collector flags of :data:`COLLECTOR_FLAGS`
    (each a string option, ``None`` when not given)."""
    for flag, param, _section, _field, metavar, help_text in reversed(COLLECTOR_FLAGS):
        command = click.option(flag, param, metavar=metavar, help=help_text)(command)
    return command


def collector_overrides(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` for ``load_config(overrides=...)`` from a command's
    parsed parameters (``params`` must hold every name of :data:`COLLECTOR_FLAGS`)."""
    overrides: dict[str, dict[str, Any]] = {}
    for _flag, param, section, field, _metavar, _help in COLLECTOR_FLAGS:
        overrides.setdefault(section, {})[field] = params[param]
    return overrides


def exit_missing_extra(what: str, extra: str, exc: ImportError | None = None) -> NoReturn:
    """Print ``WHAT: pip install 'loopwatch[EXTRA]' (MODULE)`` on stderr and exit 2."""
    missing = f" ({exc.name})" if exc is not None else ""
    click.echo(f"{what}: pip install 'loopwatch[{extra}]'{missing}", err=True)
    raise SystemExit(2)


@dataclass(frozen=True, slots=True)
class CollectorApi:
    """The collector entry points the commands use (imported on demand).

    ``keep_pandas_unloaded`` is for commands whose process is the collector's own
    (``collector``, ``up``): it saves the memory DuckDB would spend importing pandas.
    """

    load_config: Callable[..., Any]
    serve_forever: Callable[..., Any]
    ConfigError: type[Exception]
    StoreUnavailable: type[Exception]
    LakeUnavailable: type[Exception]
    keep_pandas_unloaded: Callable[[], bool]


def collector_api(what: str, extra: str) -> CollectorApi:
    """The collector's entry points; exits 2 naming ``extra`` when it is not installed."""
    try:
        from loopwatch.collector.config import load_config
        from loopwatch.collector.errors import ConfigError, LakeUnavailable, StoreUnavailable
        from loopwatch.collector.process_memory import keep_pandas_unloaded
        from loopwatch.collector.service import serve_forever
    except ImportError as exc:
        exit_missing_extra(what, extra, exc)
    return CollectorApi(
        load_config,
        serve_forever,
        ConfigError,
        StoreUnavailable,
        LakeUnavailable,
        keep_pandas_unloaded,
    )


def start_failure(exc: Exception) -> str:
    """Why the collector could not start: an OS error's own words, else the message."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def http_ok(url: str) -> bool:
    """Whether GET ``url`` answers 200 within 1 s (a service's health probe)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
