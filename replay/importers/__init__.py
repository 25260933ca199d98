"""Readers of recorded agent runs, one per format, detected per file.

Each format module defines an object satisfying :class:`Importer` and is listed in
:data:`_MODULES`. :func:`load_paths` reads files and folders, detects each file's
format, and returns every :class:`~loopwatch.replay.trajectory.Trajectory` plus every
:class:`~loopwatch.replay.trajectory.ImportProblem` (malformed record, unknown format,
unreadable file): one bad file or record never stops the others.

Formats (module: what it reads):

* ``native`` (format name ``loopwatch``): loopwatch's own ``loopwatch.trajectory/1``
  files, as the shipped example runs use.
* ``tau2``: tau2-bench results (``{info, tasks, simulations}``).
* ``chat``: tau-bench historical trajectories and any OpenAI chat-completions message
  list (``traj`` / ``messages`` with ``tool_calls``, legacy ``function_call``).
* ``otlp_json``: OTLP/JSON trace files (``resourceSpans``), GenAI and OpenInference.
* ``react``: ReAct ``Thought/Action/Observation`` text logs (Reflexion HotpotQA).
* ``toolbench``: ToolBench DFSDT answer trees; each root-to-leaf path is a run.
* ``openhands``: OpenHands event streams (``.json`` list or ``.jsonl`` runs).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from loopwatch.replay.trajectory import ImportProblem, Trajectory

__all__ = [
    "Document",
    "ImportResult",
    "Importer",
    "UnknownFormat",
    "detect",
    "importers",
    "iter_files",
    "load_paths",
    "read_file",
]

# Order matters only for ambiguous documents: the first importer whose ``matches``
# accepts the document reads it.
_MODULES = ("native", "tau2", "toolbench", "openhands", "otlp_json", "chat", "react")

MAX_FILE_BYTES = 512 << 20
"""Files larger than this are refused with a problem (512 MiB), not read into memory."""


class UnknownFormat(ValueError):
    """No importer recognises the file."""


_UNSET: Any = object()


@dataclass
class Document:
    """One file's content, read once and shared by every importer's ``matches``.

    Attributes:
        path: the file.
        text: the whole file as text (UTF-8, undecodable bytes replaced).
        json: the parsed JSON document (lazy); ``None`` when the text is not one JSON
            value.
        json_lines: parsed JSON Lines (lazy): a list of ``(line_number, value_or_error)``
            where an error is the :class:`json.JSONDecodeError` message; ``None`` when
            the first non-blank line is not a JSON object.
    """

    path: Path
    text: str
    _json: Any = field(default=_UNSET, repr=False)

    @property
    def json(self) -> Any:
        if self._json is _UNSET:
            try:
                self._json = json.loads(self.text)
            except (ValueError, RecursionError):
                self._json = None
        return self._json

    @cached_property
    def json_lines(self) -> list[tuple[int, Any]] | None:
        lines: list[tuple[int, Any]] = []
        for number, line in enumerate(self.text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value: Any = json.loads(line)
            except (ValueError, RecursionError) as exc:
                if not lines:
                    return None
                value = _LineError(str(exc))
            if not lines and not isinstance(value, dict):
                return None
            lines.append((number, value))
        return lines or None


@dataclass(frozen=True, slots=True)
class _LineError:
    message: str


class Importer(Protocol):
    """One recorded format.

    ``name`` is the value of :attr:`Trajectory.format`. ``matches`` must be cheap and
    must not raise: it looks at the document's shape only. ``read`` yields every run it
    can read and one :class:`ImportProblem` per record it cannot (naming the record); it
    may raise :class:`ValueError` for a file that is malformed as a whole.
    """

    name: str

    def matches(self, doc: Document) -> bool: ...

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]: ...


def importers() -> list[Importer]:
    """Every available importer, in detection order."""
    found: list[Importer] = []
    for module_name in _MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{module_name}":
                continue
            raise
        found.append(module.IMPORTER)
    return found


def detect(doc: Document) -> Importer:
    """The importer that reads ``doc``.

    Raises:
        UnknownFormat: no importer recognises it (the message lists the formats tried).
    """
    tried = importers()
    for importer in tried:
        try:
            if importer.matches(doc):
                return importer
        except Exception:  # a matcher bug must not hide the other formats
            continue
    names = ", ".join(i.name for i in tried)
    raise UnknownFormat(f"not a recognised trajectory format (tried: {names})")


def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Files under ``paths`` (folders walked recursively, sorted; ``README*`` skipped)."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and not child.name.upper().startswith("README"):
                    if any(part.startswith(".") for part in child.relative_to(path).parts):
                        continue
                    yield child
        else:
            yield path


def read_file(path: str | Path, *, format: str | None = None) -> ImportResult:
    """Read one file: every run it holds and every problem met.

    Args:
        path: file to read.
        format: importer name to force instead of detection.

    Never raises for bad input: unreadable, oversized, unknown-format and malformed
    files come back as problems naming the file (and the record, where there is one).
    """
    path = Path(path)
    result = ImportResult()
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            result.problems.append(
                ImportProblem(str(path), "file", f"{size} bytes exceeds {MAX_FILE_BYTES}")
            )
            return result
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        result.problems.append(ImportProblem(str(path), "file", exc.strerror or str(exc)))
        return result
    doc = Document(path=path, text=text)
    try:
        if format is None:
            importer = detect(doc)
        else:
            by_name = {i.name: i for i in importers()}
            if format not in by_name:
                raise UnknownFormat(f"unknown format {format!r} (known: {', '.join(by_name)})")
            importer = by_name[format]
        for item in importer.read(doc):
            if isinstance(item, ImportProblem):
                result.problems.append(item)
            else:
                result.trajectories.append(item)
    except (UnknownFormat, ValueError, RecursionError) as exc:
        result.problems.append(ImportProblem(str(path), "file", str(exc)))
    return result


def load_paths(paths: Sequence[str | Path], *, format: str | None = None) -> ImportResult:
    """Read every file under ``paths`` (see :func:`read_file`), merged in order."""
    total = ImportResult()
    for path in iter_files(paths):
        one = read_file(path, format=format)
        total.trajectories.extend(one.trajectories)
        total.problems.extend(one.problems)
    return total


@dataclass
class ImportResult:
    """What a load produced: the runs read and the problems met (never raised)."""

    trajectories: list[Trajectory] = field(default_factory=list)
    problems: list[ImportProblem] = field(default_factory=list)
