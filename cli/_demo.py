"""Sending the demo: what ``loopwatch demo``, ``up --demo`` and ``up --fleet --demo`` share.

:func:`send_demo` runs :func:`loopwatch.replay.demo.run_demo` and prints its summary and
problems; :func:`read_token` reads a ``--token-file``; :func:`demo_canary_file` writes the
canary file that makes a collector flag the canary the demo plants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import click

__all__ = ["demo_canary_file", "read_token", "send_demo"]

_MAX_PROBLEM_LINES: Final = 5


def read_token(token_file: str | None) -> str | None:
    if not token_file:
        return None
    try:
        text = Path(token_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise click.ClickException(
            f"cannot read --token-file {token_file}: {exc.strerror}"
        ) from None
    if not text:
        raise click.ClickException(f"--token-file {token_file} is empty")
    return text


class _ProblemPrinter:
    """Prints the first few import problems to stderr, then counts the rest."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.count = 0

    def __call__(self, line: str) -> None:
        self.count += 1
        if self.count <= _MAX_PROBLEM_LINES:
            click.echo(f"{self.prefix}: skipped: {line}", err=True)

    def close(self) -> None:
        if self.count > _MAX_PROBLEM_LINES:
            click.echo(
                f"{self.prefix}: ... and {self.count - _MAX_PROBLEM_LINES} more skipped records",
                err=True,
            )


def send_demo(
    *,
    corpus: tuple[str, ...],
    verbose: bool,
    prefix: str = "loopwatch demo",
    **options: Any,
) -> int:
    """Run the demo and print its summary; returns the exit code (0, 1 or 2).

    ``options`` are :func:`loopwatch.replay.demo.run_demo`'s keyword arguments.
    """
    try:
        from loopwatch.instrumentation import PolicyError
        from loopwatch.replay.demo import CollectorUnreachable, run_demo
    except ImportError as exc:  # pragma: no cover - base install without the replay package
        click.echo(f"{prefix}: {exc}", err=True)
        return 2
    problems = _ProblemPrinter(prefix)
    try:
        report = run_demo(list(corpus) or None, on_problem=problems, **options)
    except PolicyError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid policy"
        click.echo(f"{prefix}: invalid policy: {first}", err=True)
        return 2
    except (CollectorUnreachable, ImportError, ValueError) as exc:
        click.echo(f"{prefix}: {exc}", err=True)
        return 2 if isinstance(exc, ImportError) else 1
    finally:
        problems.close()
    if verbose:
        for run in report.runs:
            click.echo(f"  {run.stop_reason:<18} {run.run_id}")
    click.echo(report.summary())
    if not report.ok:
        lost = report.spans_ended - report.spans_exported
        click.echo(
            f"{prefix}: {lost} of {report.spans_ended} spans were not accepted by the collector",
            err=True,
        )
        return 1
    return 0


def demo_canary_file(folder: Path) -> Path:
    """A canary file in ``folder`` holding the canary the demo plants, so a collector
    started with it flags the demo's canary runs (replay/demo.py ``DEMO_CANARY``)."""
    from loopwatch.replay.demo import DEMO_CANARY

    path = folder / "demo-canaries.txt"
    if not path.exists():
        path.write_text(f"# planted by loopwatch demo\n{DEMO_CANARY}\n", encoding="utf-8")
    return path
