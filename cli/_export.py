"""``loopwatch export``: one stored run as an OTLP/JSON file ``loopwatch replay`` reads.

The run comes from a collector's read API (``--collector``, ``GET /api/v1/runs/{id}``)
or straight from a DuckDB file opened read-only (``--db``); the file is written by
:func:`loopwatch.replay.export_run.export_otlp_json`.

Exit codes: 0 written; 1 the run is not there, cannot be read, or cannot be exported (no
stored steps); 2 usage error.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

__all__ = ["export"]

_DEFAULT_COLLECTOR = "http://127.0.0.1:9464"


class _NotFound(LookupError):
    """No run with that id in the source."""


def _from_collector(base_url: str, run_id: str, token: str | None) -> dict[str, Any]:
    url = f"{base_url.rstrip('/')}/api/v1/runs/{urllib.parse.quote(run_id, safe='')}"
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise _NotFound(run_id) from None
        raise OSError(f"{url} answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OSError(f"cannot reach the collector at {base_url}: {reason}") from None


def _from_db(path: str, run_id: str) -> dict[str, Any]:
    try:
        from loopwatch.collector.store.reader import StoreReader
    except ImportError as exc:
        raise ImportError(
            "--db needs the collector extra: pip install 'loopwatch[collector]'"
        ) from exc
    if not Path(path).is_file():
        raise OSError(f"{path}: no such database file")
    try:
        reader = StoreReader.open_readonly(path, timeout_seconds=30.0, max_rows=100_000)
    except Exception as exc:  # duckdb.Error: only collector/store imports duckdb
        raise OSError(f"cannot open {path} read-only: {str(exc).splitlines()[0]}") from None
    try:
        detail = reader.get_run(run_id)
    finally:
        reader.close()
    if detail is None:
        raise _NotFound(run_id)
    return {f.name: getattr(detail, f.name) for f in fields(detail)}


@click.command("export")
@click.argument("run_id")
@click.option(
    "--collector",
    "collector_url",
    help=f"Collector read API base URL (default {_DEFAULT_COLLECTOR}).",
)
@click.option("--db", help="Read a DuckDB file directly (read-only) instead of a collector.")
@click.option("--token-file", help="Bearer token file for a collector started with --token-file.")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="The OTLP/JSON file to write ('-' for stdout).",
)
def export(
    run_id: str, collector_url: str | None, db: str | None, token_file: str | None, out: str
) -> None:
    """Write stored run RUN_ID as an OTLP/JSON file that `loopwatch replay` reads back.

    Replayed under the policy the run was stored with, the file stops with the same
    reason at the same step: attach it to the incident ticket and keep it as a policy
    regression test (docs/policy.md, "From incident to test").
    """
    from loopwatch.replay.export_run import ExportError, export_otlp_json

    if collector_url and db:
        click.echo("loopwatch export: give --collector or --db, not both", err=True)
        raise SystemExit(2)
    token = None
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            click.echo(f"loopwatch export: cannot read {token_file}: {exc.strerror}", err=True)
            raise SystemExit(2) from None
    try:
        if db:
            detail = _from_db(db, run_id)
        else:
            detail = _from_collector(collector_url or _DEFAULT_COLLECTOR, run_id, token)
        body = export_otlp_json(detail)
    except _NotFound:
        click.echo(f"loopwatch export: no run with id {run_id!r}", err=True)
        raise SystemExit(1) from None
    except (OSError, ImportError, ExportError, ValueError) as exc:
        click.echo(f"loopwatch export: {exc}", err=True)
        raise SystemExit(1) from None
    if out == "-":
        click.echo(body.decode(), nl=False)
        return
    Path(out).write_bytes(body)
    spans = len(json.loads(body)["resourceSpans"][0]["scopeSpans"][0]["spans"])
    click.echo(f"loopwatch export: wrote {out} (run {run_id}, {spans} spans)")
