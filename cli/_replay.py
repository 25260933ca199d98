"""``loopwatch replay``: recorded trajectories through policies, offline.

Exit codes: 0 when at least one run was read and replayed (import problems with other
files or records are printed to stderr, one line each, naming the file and the record);
1 when nothing could be read (no run in any PATH); 2 for a usage error or a policy file
that does not load (every problem printed, naming the file and the key).
"""

from __future__ import annotations

import csv
import io
import json
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Final

import click

__all__ = ["replay"]

_PROGRESS_MIN_RUNS: Final = 500
"""Above this many runs a progress bar is drawn on stderr even when it is not a TTY."""


_MAX_TABLE_RUNS: Final = 100
"""Stopped runs listed by the table format (json and csv list every run)."""

LADDER_CAVEAT: Final = (
    "Recorded runs cannot show how a model would react to a warn or a nudge: these are "
    "the rungs reached on the recorded actions, and nothing more (after a nudge, the "
    "recorded call's real result is fed on)."
)
"""The line the table format prints under the ladder rungs (issue 26)."""


def _printable(text: str) -> str:
    """``text`` safe for one table cell: control, format (bidi overrides, zero-width)
    and line-separator characters shown as ``\\n``, ``\\x1b``, ``\\u202e``... so a run id
    cannot break a row or drive the terminal."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def _char_width(c: str) -> int:
    """Terminal columns of one character: 0 combining, 2 East Asian wide/fullwidth."""
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def _width(text: str) -> int:
    """Terminal columns ``text`` takes (see :func:`_char_width`)."""
    if text.isascii():
        return len(text)
    return sum(_char_width(c) for c in text)


def _short(text: str, width: int) -> str:
    """``text`` made printable and cut to at most ``width`` terminal columns (``…``)."""
    text = _printable(text)
    if _width(text) <= width:
        return text
    out, used = [], 0
    for c in text:
        w = _char_width(c)
        if used + w > width - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "\u2026"


_CSV_FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r")
"""Cell starts a spreadsheet reads as a formula (OWASP "CSV Injection")."""


def _csv_safe(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula, prefixed with ``'``
    (OWASP CSV Injection guidance); other values unchanged."""
    if isinstance(value, str) and value.startswith(_CSV_FORMULA_START):
        return "'" + value
    return value


def _want_progress(count: int) -> bool:
    return sys.stderr.isatty() or count >= _PROGRESS_MIN_RUNS


@contextmanager
def _output(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    with open(path, "w", encoding="utf-8", newline="") as handle:
        yield handle


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return _printable(str(value))


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    text = [[_cell(c) for c in header], *[[_cell(c) for c in r] for r in rows]]
    widths = [max(_width(r[i]) for r in text) for i in range(len(header))]
    lines = [
        "  ".join(c + " " * (w - _width(c)) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in text
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_table(results: Sequence[Any], summaries: Sequence[Any]) -> str:
    """The ``table`` format: per-policy summary side by side, then the stopped runs."""
    labels = [s.policy for s in summaries]
    reasons = sorted({r for s in summaries for r in s.stops_by_reason})
    # Budget and deadline stops broken down by dimension: "budget_exhausted 76" alone
    # hides which limit (model turns? retries of a failing call?) did the stopping.
    by_dimension: dict[tuple[str, str], Counter[str]] = {}
    for r in results:
        if r.stopped and r.stop_dimension is not None:
            by_dimension.setdefault((r.stop_reason, r.stop_dimension), Counter())[r.policy] += 1
    reason_rows: list[list[Any]] = []
    for reason in reasons:
        reason_rows.append([f"  {reason}", *[s.stops_by_reason.get(reason, 0) for s in summaries]])
        for (of, dimension), counts in sorted(by_dimension.items()):
            if of == reason:
                reason_rows.append([f"    {dimension}", *[counts[label] for label in labels]])
    metric_rows: list[list[Any]] = [
        ["runs", *[s.runs for s in summaries]],
        ["stopped", *[s.stopped for s in summaries]],
        *reason_rows,
        ["loops (recorded)", *[s.loops for s in summaries]],
        ["loops caught", *[s.loops_caught for s in summaries]],
        ["successful runs", *[s.successful_runs for s in summaries]],
        ["false stops", *[s.false_stops for s in summaries]],
        [
            "false-stop rate",
            *[
                "" if s.false_stop_rate is None else f"{100 * s.false_stop_rate:.1f}%"
                for s in summaries
            ],
        ],
        ["median steps onset->stop", *[s.median_steps_onset_to_stop for s in summaries]],
        ["tool calls recorded", *[s.calls_total for s in summaries]],
        ["tool calls saved", *[s.calls_saved for s in summaries]],
        ["model calls saved", *[s.model_calls_saved for s in summaries]],
    ]
    laddered = any(s.ladder for s in summaries)
    if laddered:
        # Only for a policy with a ladder: a ["stop"] report stays as it always was.
        metric_rows += [
            ["ladder warns", *[s.warns if s.ladder else "" for s in summaries]],
            ["ladder nudges", *[s.nudges if s.ladder else "" for s in summaries]],
            ["ladder stops", *[s.ladder_stops if s.ladder else "" for s in summaries]],
        ]
    out = [_table(metric_rows, ["policy", *labels])]
    if laddered:
        out += _ladder_lines(results)
    by_run: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        by_run.setdefault((r.source, r.run_id), {})[r.policy] = r
    stopped_rows: list[list[Any]] = []
    for (source, run_id), per in by_run.items():
        if not any(r.stopped for r in per.values()):
            continue
        first = next(iter(per.values()))
        cells = []
        for label in labels:
            r = per.get(label)
            if r is None or not r.stopped:
                cells.append("-")
            else:
                reason = r.stop_reason
                if r.stop_dimension is not None:
                    reason = f"{reason}({r.stop_dimension})"
                onset = "" if r.loop_onset_step is None else f" onset {r.loop_onset_step}"
                cells.append(f"{reason}@{r.stop_step}{onset}" + (" FALSE" if r.false_stop else ""))
        stopped_rows.append(
            [
                _short(source.replace("\\", "/").rsplit("/", 1)[-1], 32),
                _short(run_id, 64),
                first.recorded_outcome,
                first.steps_total,
                first.loop.onset_step if first.loop is not None else None,
                *cells,
            ]
        )
    if stopped_rows:
        out.append("")
        shown = stopped_rows[:_MAX_TABLE_RUNS]
        out.append(
            f"Runs stopped by a policy ({len(stopped_rows)}; reason@step, onset = that "
            "policy's loop_onset_step, FALSE = false stop on a successful run; recorded "
            "loop = first step of the loop in the recording, whatever the policy):"
        )
        out.append(_table(shown, ["file", "run", "recorded", "steps", "recorded loop", *labels]))
        if len(stopped_rows) > len(shown):
            out.append(
                f"... {len(stopped_rows) - len(shown)} more: use --format json or csv "
                "for every run."
            )
    return "\n".join(out) + "\n"


def _ladder_lines(results: Sequence[Any]) -> list[str]:
    """The ladder section of the table: each (run, policy) whose ladder reached a rung,
    as ``response@step tool detector rung N``, then :data:`LADDER_CAVEAT`."""
    rows: list[list[Any]] = []
    for r in results:
        if not r.responses:
            continue
        rungs = ", ".join(
            f"{x.response}@{x.step} {_short(x.tool, 32)} {x.detector} rung {x.rung}"
            for x in r.responses
        )
        rows.append(
            [
                _short(r.source.replace("\\", "/").rsplit("/", 1)[-1], 32),
                _short(r.run_id, 64),
                r.policy,
                rungs,
            ]
        )
    out = [""]
    if rows:
        shown = rows[:_MAX_TABLE_RUNS]
        out.append(f"Loop-response ladder rungs reached ({len(rows)} run x policy):")
        out.append(_table(shown, ["file", "run", "policy", "rungs (response@step)"]))
        if len(rows) > len(shown):
            out.append(f"... {len(rows) - len(shown)} more: use --format json for every run.")
    else:
        out.append("Loop-response ladder: no rung reached.")
    out.append(LADDER_CAVEAT)
    return out


def render_json(results: Sequence[Any]) -> str:
    """The ``json`` format: JSON Lines, one object per (run, policy) (with
    ``ladder_responses`` for a policy with a loop-response ladder)."""
    return "".join(json.dumps(r.to_dict(), sort_keys=False) + "\n" for r in results)


def render_csv(results: Sequence[Any]) -> str:
    """The ``csv`` format: one row per (run, policy), columns ``CSV_COLUMNS``.

    A text cell starting with ``=``, ``+``, ``-``, ``@``, TAB or CR (a run id such as
    ``=HYPERLINK(...)``) is prefixed with ``'`` so spreadsheets show it as text (OWASP
    CSV Injection); numbers are written as they are. The JSON format is verbatim."""
    from loopwatch.replay.engine import CSV_COLUMNS

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in results:
        writer.writerow({k: "" if v is None else _csv_safe(v) for k, v in r.csv_row().items()})
    return buffer.getvalue()


@click.command("replay")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--policy",
    "policy_specs",
    multiple=True,
    metavar="FILE[:PROFILE]",
    help="Policy file and profile (every profile of FILE when PROFILE is omitted); "
    "'default' and 'seed' name the shipped files, and a built-in profile name "
    "(investigate-readonly, ...) that profile. Repeat to compare. "
    "Default: the shipped replay policy. Every run is judged under these, also a run "
    "that records its own policy (loopwatch demo, without --policy, plays such a run "
    "under its own).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="table: summary and stopped runs; json: one object per (run, policy) per line; "
    "csv: one row per (run, policy).",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the report to FILE instead of stdout.",
)
@click.option(
    "--input-format",
    "input_format",
    default=None,
    metavar="NAME",
    help="Force one importer (loopwatch, tau2, toolbench, openhands, otlp_json, chat, "
    "react) instead of detecting each file's format.",
)
def replay(
    paths: tuple[str, ...],
    policy_specs: tuple[str, ...],
    fmt: str,
    out_path: str | None,
    input_format: str | None,
) -> None:
    """Replay recorded agent runs in PATHS through policies, offline (no model calls).

    Every file under PATHS is read with the importer of its format. Each run is fed step
    by step to the real guard under each policy; the report says where each policy would
    have stopped it, the loop onset, false stops on successful runs and tool calls saved.
    Under a policy with a loop-response ladder it also lists where the ladder would have
    warned, nudged and stopped: the rungs reached on the recorded actions, not how a
    model would have reacted to them.

    Exit codes: 0 ok (import problems, if any, listed on stderr); 1 nothing could be
    read; 2 usage error or an invalid policy file.
    """
    from loopwatch.instrumentation.errors import PolicyError
    from loopwatch.replay.engine import (
        NamedPolicy,
        default_policy,
        load_policy_spec,
        summarize,
        unique_labels,
    )
    from loopwatch.replay.engine import replay as run_replay
    from loopwatch.replay.importers import ImportResult, iter_files, read_file

    policies: list[NamedPolicy] = []
    try:
        if policy_specs:
            for spec in policy_specs:
                policies.extend(load_policy_spec(spec))
        else:
            policies.append(default_policy())
    except PolicyError as exc:
        for problem in exc.problems:
            click.echo(f"loopwatch replay: {problem}", err=True)
        raise SystemExit(2) from None
    policies = unique_labels(policies)
    if input_format is not None:
        from loopwatch.replay.importers import importers

        known = [i.name for i in importers()]
        if input_format not in known:
            raise click.BadParameter(
                f"{input_format!r} is not one of {', '.join(known)}", param_hint="--input-format"
            )
    if out_path is not None:
        # Fail before the (possibly long) replay, not after it.
        parent = Path(out_path).resolve().parent
        if not parent.is_dir():
            click.echo(
                f"loopwatch replay: cannot write {out_path}: no directory {parent}", err=True
            )
            raise SystemExit(2)

    files = list(iter_files(paths))
    loaded = ImportResult()
    show = sys.stderr.isatty() and len(files) > 1
    with click.progressbar(files, label="reading", file=sys.stderr, hidden=not show) as bar:
        for path in bar:
            one = read_file(path, format=input_format)
            loaded.trajectories.extend(one.trajectories)
            loaded.problems.extend(one.problems)
    for import_problem in loaded.problems:
        click.echo(f"loopwatch replay: {_printable(str(import_problem))}", err=True)
    runs = loaded.trajectories
    if not runs:
        if not files:
            click.echo("loopwatch replay: no files found under the given paths", err=True)
        else:
            click.echo(
                f"loopwatch replay: no run could be read from {len(files)} file(s)", err=True
            )
        raise SystemExit(1)

    with click.progressbar(
        length=len(runs),
        label=f"replaying {len(runs)} runs x {len(policies)} policies",
        file=sys.stderr,
        hidden=not _want_progress(len(runs)),
    ) as bar:
        results = run_replay(runs, policies, on_run=lambda _t: bar.update(1))

    if fmt == "json":
        text = render_json(results)
    elif fmt == "csv":
        text = render_csv(results)
    else:
        text = render_table(results, summarize(results))
    # A file name that is not UTF-8 (bytes decoded as lone surrogates) must not make
    # the write fail after the whole replay: such characters are written as \udcXX.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    try:
        with _output(out_path) as handle:
            handle.write(text)
    except OSError as exc:
        click.echo(f"loopwatch replay: cannot write {out_path}: {exc.strerror}", err=True)
        raise SystemExit(2) from None
    if out_path is not None:
        click.echo(
            f"loopwatch replay: {len(runs)} runs x {len(policies)} "
            f"{'policy' if len(policies) == 1 else 'policies'} -> {out_path}",
            err=True,
        )
