"""Click command tree of ``loopwatch``."""

from __future__ import annotations

import click
from loopwatch.instrumentation import __version__
from loopwatch.instrumentation.policy import check_policy_file, load_policies


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
