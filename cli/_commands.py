"""Click command tree of ``loopwatch``."""

from __future__ import annotations

from typing import Any

import click
from loopwatch.instrumentation import __version__
from loopwatch.instrumentation.policy import check_policy_file, load_policies

from ._options import (
    collector_api,
    collector_options,
    collector_overrides,
    exit_missing_extra,
    start_failure,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="loopwatch")
def cli() -> None:
    """loopwatch: why did the agent loop stop?"""


@cli.command("check-policy")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def check_policy(files: tuple[str, ...]) -> None:
    """Validate policy FILES: one line per problem, exit 1 if any."""
    problems = 0
    for path in files:
        found = check_policy_file(path)
        for problem in found:
            click.echo(str(problem))
        problems += len(found)
        if not found:
            names = ", ".join(load_policies(path))
            click.echo(f"{path}: ok ({names})")
    if problems:
        raise SystemExit(1)


@cli.command("collector")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML config file.")
@collector_options
def collector(config_file: str | None, **params: Any) -> None:
    """Run the OTLP collector: redact, store in DuckDB, export Prometheus metrics.

    Precedence: flags > LOOPWATCH_<SECTION>_<FIELD> environment > --config file > defaults.
    Bad configuration prints one line and exits 2.
    """
    api = collector_api("the collector needs its extra", "collector")
    api.keep_pandas_unloaded()
    try:
        api.serve_forever(api.load_config(config_file, overrides=collector_overrides(params)))
    except api.ConfigError as exc:
        click.echo(f"loopwatch collector: configuration error: {exc}", err=True)
        raise SystemExit(2) from None
    except (OSError, api.StoreUnavailable, api.LakeUnavailable) as exc:
        click.echo(f"loopwatch collector: cannot start: {start_failure(exc)}", err=True)
        raise SystemExit(2) from None


@cli.command("dashboard")
@click.option(
    "--collector",
    "collector_url",
    help="Collector read API base URL (default http://127.0.0.1:9464).",
)
@click.option("--db", help="Read a DuckDB file directly (read-only) instead of a collector.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--port", default=8501, show_default=True, type=int, help="Listen port.")
@click.option("--token-file", help="Bearer token file for a collector started with --token-file.")
@click.option("--lake", metavar="CATALOG", help="Read fleet mode's lake (DuckLake catalog).")
@click.option("--lake-data", metavar="PATH", help="The lake's data path (with --lake).")
@click.option(
    "--auth",
    type=click.Choice(["none", "oidc", "trusted-header"]),
    default="none",
    show_default=True,
    help="Login, required off loopback: Streamlit's OIDC (secrets.toml) or a proxy's header.",
)
@click.option("--auth-header", metavar="NAME", help="Proxy user header (X-Forwarded-User).")
@click.option("--secrets", "secrets_file", metavar="FILE", help="Streamlit secrets.toml (oidc).")
def dashboard(
    collector_url: str | None,
    db: str | None,
    host: str,
    port: int,
    token_file: str | None,
    lake: str | None,
    lake_data: str | None,
    auth: str,
    auth_header: str | None,
    secrets_file: str | None,
) -> None:
    """Run the Streamlit dashboard over a collector, a DuckDB file or the lake."""
    try:
        from loopwatch.dashboard import run_dashboard
    except ImportError as exc:
        exit_missing_extra("the dashboard needs its extra", "dashboard", exc)
    if bool(lake) != bool(lake_data):
        click.echo("loopwatch dashboard: --lake and --lake-data go together", err=True)
        raise SystemExit(2)
    try:
        code = run_dashboard(
            collector_url,
            db,
            host,
            port,
            token_file=token_file,
            lake=(lake, lake_data) if lake and lake_data else None,
            auth=auth,
            auth_header=auth_header,
            secrets_file=secrets_file,
        )
    except ValueError as exc:
        click.echo(f"loopwatch dashboard: {exc}", err=True)
        raise SystemExit(2) from None
    except ImportError:
        exit_missing_extra("the dashboard needs its extra", "dashboard")
    raise SystemExit(code)


def _register() -> None:
    from loopwatch.cli._export import export
    from loopwatch.cli._lake_api import api
    from loopwatch.cli._replay import replay
    from loopwatch.cli._run import demo, up

    cli.add_command(api)
    cli.add_command(export)
    cli.add_command(replay)
    cli.add_command(up)
    cli.add_command(demo)


_register()
