"""Collector options shared by ``loopwatch collector`` and ``loopwatch up``.

One definition per flag, so the two commands cannot drift apart: each flag maps to one
``[section] field`` of the collector's TOML configuration, and :func:`collector_overrides`
turns the parsed values into ``load_config``'s ``overrides`` (``None`` values, flags
not given, leave the file, environment or default in place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

__all__ = ["COLLECTOR_FLAGS", "collector_options", "collector_overrides"]

_F = TypeVar("_F", bound=Callable[..., Any])

COLLECTOR_FLAGS: Final = (
    # (parameter name, config section, config field)
    ("db", "store", "db"),
    ("otlp_http", "server", "otlp_http"),
    ("otlp_grpc", "server", "otlp_grpc"),
    ("http_addr", "server", "http"),
    ("canaries", "redaction", "canaries_file"),
    ("token_file", "server", "token_file"),
    ("retention_days", "store", "retention_days"),
)
"""Each collector flag's click parameter name and the configuration setting it overrides."""

_OPTIONS: Final = (
    click.option("--db", metavar="FILE", help="DuckDB file (default ./loopwatch.duckdb)."),
    click.option(
        "--otlp-http",
        metavar="HOST:PORT",
        help="OTLP/HTTP listen address HOST:PORT (default 127.0.0.1:4318).",
    ),
    click.option(
        "--otlp-grpc",
        metavar="HOST:PORT",
        help="Also receive OTLP/gRPC on HOST:PORT (usually 127.0.0.1:4317; default: off).",
    ),
    click.option(
        "--http",
        "http_addr",
        metavar="HOST:PORT",
        help="/metrics, /healthz and API address HOST:PORT (default 127.0.0.1:9464).",
    ),
    click.option(
        "--canaries", metavar="FILE", help="Canary file: one value per line, '#' comments."
    ),
    click.option(
        "--token-file",
        metavar="FILE",
        help="File holding the bearer token required on OTLP and the API.",
    ),
    click.option(
        "--retention-days",
        help="Remove runs whose last span arrived more than DAYS ago; counter totals stay "
        "(default 0: keep everything).",
        metavar="DAYS",
    ),
)


def collector_options(command: _F) -> _F:
    """Decorate a click command with the collector flags of :data:`COLLECTOR_FLAGS`
    (each a string option, ``None`` when not given)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def collector_overrides(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` for ``load_config(overrides=...)`` from a command's
    parsed parameters (``params`` must hold every name of :data:`COLLECTOR_FLAGS`)."""
    overrides: dict[str, dict[str, Any]] = {}
    for name, section, field in COLLECTOR_FLAGS:
        overrides.setdefault(section, {})[field] = params[name]
    return overrides
