"""``loopwatch api``: the ``/api/v1`` read API over fleet mode's lake, for automation.

The same endpoints as a collector's ``--http`` (collector/api.py), over every collector's
shipped runs (docs/lake.md), read-only, with the same time limit and row cap; no OTLP
receiver and no ``/metrics``. Off loopback a bearer token is required (``--token-file``),
as the lake holds every collector's runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from ._options import exit_missing_extra

__all__ = ["api"]

_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def _fail(message: str) -> None:
    click.echo(f"loopwatch api: {message}", err=True)
    raise SystemExit(2)


@click.command("api")
@click.option("--lake", "catalog", required=True, metavar="CATALOG", help="DuckLake catalog.")
@click.option("--lake-data", "data_path", required=True, metavar="PATH", help="Its data path.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--port", default=9465, show_default=True, type=int, help="Listen port.")
@click.option("--token-file", help="File holding the bearer token required on /api/v1.")
@click.option(
    "--query-timeout", default=5.0, show_default=True, type=float, help="Seconds per query."
)
@click.option("--max-rows", default=10_000, show_default=True, type=int, help="Row cap.")
def api(
    catalog: str,
    data_path: str,
    host: str,
    port: int,
    token_file: str | None,
    query_timeout: float,
    max_rows: int,
) -> None:
    """Serve the /api/v1 read API over the lake (every collector's runs).

    Bad configuration (an unreachable catalog, no lake there, off loopback without
    --token-file) prints one line and exits 2.
    """
    try:
        from loopwatch.collector.api import serve_lake_api
        from loopwatch.collector.errors import LakeUnavailable
        from loopwatch.collector.lake.connect import LakeTarget, connect_lake
        from loopwatch.collector.store.reader import StoreReader
    except ImportError as exc:
        exit_missing_extra("loopwatch api needs its extras", "collector,lake", exc)
    if not 0 < port < 65536:
        _fail(f"--port must be in 1..65535, got {port}")
    token = None
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            _fail(f"cannot read the token file {token_file}: {exc.strerror}")
        if not token:
            _fail(f"the token file {token_file} is empty")
    elif host not in _LOOPBACK:
        _fail(f"--host {host} is reachable from other machines: give --token-file")
    try:
        target = LakeTarget(catalog, data_path)
        reader = StoreReader.open_lake(
            connect_lake(target, read_only=True), timeout_seconds=query_timeout, max_rows=max_rows
        )
    except ValueError as exc:
        _fail(str(exc))
    except LakeUnavailable as exc:
        _fail(str(exc))
    try:
        reader.list_runs(limit=1)  # the lake has loopwatch's tables
    except Exception as exc:  # duckdb.CatalogException and kin: the message names it
        reader.close()
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        _fail(f"{target.describe()} holds no loopwatch lake yet ({first})")
    try:
        serve_lake_api(reader, host=host, port=port, token=token, describe=target.describe())
    except OSError as exc:
        _fail(exc.strerror or str(exc))
    finally:
        reader.close()
