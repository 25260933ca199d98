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

import codecs
import importlib
import json
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from loopwatch.replay.trajectory import ImportProblem, Trajectory

__all__ = [
    "Document",
    "ImportResult",
    "Importer",
    "UnknownFormat",
    "decode_text",
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
"""Files larger than this are refused with a problem (512 MiB); at most this much plus
one byte is ever read."""


class UnknownFormat(ValueError):
    """No importer recognises the file."""


_UNSET: Any = object()


@dataclass
class Document:
    """One file's content, read once and shared by every importer's ``matches``.

    Attributes:
        path: the file.
        text: the whole file as text (see :func:`decode_text`: UTF-8, or UTF-16/32 by
            BOM or NUL pattern; undecodable bytes replaced; CRLF and lone CR normalised to
            LF; trailing NUL padding dropped).
        json: the parsed JSON document (lazy); ``None`` when the text is not one JSON
            value.
        json_lines: parsed JSON Lines (lazy): a list of ``(line_number, value_or_error)``
            where an error is the :class:`json.JSONDecodeError` message; ``None`` when
            the text is not shaped as JSON Lines (see :attr:`json_lines`). Lines are
            split on LF only: U+2028, U+0085 and the like are legal unescaped inside
            JSON strings.
        first_json_line: the first line of :attr:`json_lines` that parsed (a JSON
            object: what format detection looks at), or ``None``.
        json_error: why :attr:`json` is ``None`` (the decoder's message with line and
            column, and ``: the file ends before the document does`` when it broke at
            the end of the text), or ``None``.
    """

    path: Path
    text: str
    _json: Any = field(default=_UNSET, repr=False)

    json_error: str | None = field(default=None, repr=False)

    @property
    def json(self) -> Any:
        if self._json is _UNSET:
            try:
                self._json = json.loads(self.text)
            except RecursionError:
                self._json = None
                self.json_error = "JSON nested too deeply"
            except ValueError as exc:
                self._json = None
                self.json_error = str(exc)
                if isinstance(exc, json.JSONDecodeError) and _at_end(self.text, exc):
                    self.json_error += ": the file ends before the document does"
        return self._json

    @cached_property
    def json_lines(self) -> list[tuple[int, Any]] | None:
        """The text as JSON Lines, or ``None`` when it is not shaped as JSON Lines.

        JSON Lines: the first line that parses is a JSON object. Lines that do not
        parse, the first ones included (a record cut short or holding a raw control
        character), are kept as errors so the importer reports them and reads the rest.
        Not JSON Lines: no line parses, the first line that parses is not an object, the
        text starts with ``[``, or the first JSON value runs past the first line (a
        pretty-printed document: ``{``, ``{"runs": [``, ``{"a": {``...) while no two
        adjacent lines are each a whole JSON value. Such a document, cut short, would
        otherwise read its one-line inner objects as records. Two adjacent whole values
        cannot occur in one JSON document, so they prove JSON Lines whose first record
        is broken between tokens.
        """
        head = self.text.lstrip().split("\n", 1)[0].strip()
        if head.startswith("["):
            return None
        if _first_value_spans_lines(self.text) and not _adjacent_whole_lines(self.text):
            return None
        lines: list[tuple[int, Any]] = []
        first: Any = None
        for number, line in enumerate(self.text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                value: Any = json.loads(line)
            except (ValueError, RecursionError) as exc:
                value = _LineError(str(exc))
            else:
                if first is None:
                    if not isinstance(value, dict):
                        return None
                    first = value
            lines.append((number, value))
        return lines if first is not None else None

    @property
    def first_json_line(self) -> Any:
        lines = self.json_lines
        if lines is None:
            return None
        return next((v for _, v in lines if not isinstance(v, _LineError)), None)


@dataclass(frozen=True, slots=True)
class _LineError:
    message: str


_JSON_SPACE = " \t\n\r"
# Integers kept as their digits: converting one past 4,300 digits raises a ValueError
# that has no position.
_DECODER = json.JSONDecoder(parse_int=str)
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
# The tail of a number cut in its fraction or exponent (``1.``, ``2e+``), or a cut
# ``\u`` escape: the decoder stops at it although the text ends there.
_CUT_TAIL = re.compile(r"\.|[eE][-+]?|u[0-9a-fA-F]{0,3}")


def _at_end(text: str, exc: json.JSONDecodeError) -> bool:
    """Whether the decoder broke for want of more text (a file cut short)."""
    # An unterminated string met neither a quote nor a control character (a newline
    # included) before the end; its position is where the string starts.
    if exc.msg.startswith("Unterminated string"):
        return True
    rest = text[exc.pos :].rstrip(_JSON_SPACE)
    return (
        not rest
        or any(word.startswith(rest) for word in _LITERALS)
        or _CUT_TAIL.fullmatch(rest) is not None
    )


def _first_value_spans_lines(text: str) -> bool:
    """Whether the decoder reads the first JSON value of ``text`` past its first line
    (to the value's end or to where it breaks): one document over many lines."""
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    line_end = text.find("\n", start)
    if line_end < 0:
        return False
    try:
        end = _DECODER.raw_decode(text, start)[1]
    except json.JSONDecodeError as exc:
        end = exc.pos
    except RecursionError:
        # Too deep: no position to go by, so the first line alone says whether the
        # value runs on past it (a line too deep by itself is one bad record).
        line = text[start:line_end]
        try:
            _DECODER.raw_decode(line)
        except json.JSONDecodeError as exc:
            return _at_end(line, exc)
        except RecursionError:
            pass
        return False
    return end > line_end


# First and last characters a whole JSON value can have (a string, number, object,
# array, or true, false, null, NaN, Infinity).
_VALUE_STARTS = frozenset('{["-0123456789tfnNI')
_VALUE_ENDS = frozenset('}]"0123456789elNy')


def _adjacent_whole_lines(text: str) -> bool:
    """Whether two adjacent non-blank lines of ``text`` are each a whole JSON value."""
    # Lines that cannot be a value (``"key": 1,``, ``}``) are told by their first or
    # last character, so a long pretty-printed document costs a few parses, not one a
    # line.
    lines = [line.strip(_JSON_SPACE) for line in text.split("\n")]
    lines = [line for line in lines if line]
    maybe = [line[0] in _VALUE_STARTS and line[-1] in _VALUE_ENDS for line in lines]
    previous_whole = False
    for i, line in enumerate(lines):
        if not maybe[i] or not (previous_whole or (i + 1 < len(lines) and maybe[i + 1])):
            previous_whole = False
            continue
        try:
            json.loads(line)
        except (ValueError, RecursionError):
            previous_whole = False
            continue
        if previous_whole:
            return True
        previous_whole = True
    return False


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


_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode_text(raw: bytes) -> str:
    """A file's bytes as text, the way editors and shells write trajectory files.

    The encoding is the BOM's (UTF-8, UTF-16 or UTF-32, LE or BE; the BOM is dropped,
    and any U+FEFF after it),
    else UTF-16 when the first bytes have the NUL pattern of ASCII text in UTF-16
    (``x\\0y\\0`` or ``\\0x\\0y``: what Windows PowerShell's ``>`` writes), else
    UTF-8; undecodable bytes become U+FFFD. Trailing NUL padding (a file preallocated or
    cut short by a crash) is dropped, and CRLF and lone CR line ends become LF.
    """
    encoding = "utf-8"
    for bom, name in _BOMS:
        if raw.startswith(bom):
            encoding, raw = name, raw[len(bom) :]
            break
    else:
        head = raw[:64]
        if len(head) >= 4:
            even, odd = head[0::2], head[1::2]
            if odd.count(0) == len(odd) and even.count(0) == 0:
                encoding = "utf-16-le"
            elif even.count(0) == len(even) and odd.count(0) == 0:
                encoding = "utf-16-be"
    if encoding.startswith("utf-16"):
        raw = raw[: len(raw) - len(raw) % 2]
    # A BOM kept as text by a tool that then wrote its own is a second one.
    text = raw.decode(encoding, errors="replace").rstrip("\x00").lstrip("\ufeff")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Files under ``paths`` (folders walked recursively, sorted; ``README*`` and
    dot-files skipped; symlinked folders not followed). A file named twice (``replay
    corpus corpus/tau2-bench``, the same path given twice, a symlink to a file already
    listed) is yielded once, at its first mention: its runs would otherwise count twice.
    """
    seen: set[Path] = set()

    def first_time(path: Path) -> bool:
        try:
            key = path.resolve()
        except (OSError, RuntimeError):  # a symlink loop
            key = path.absolute()
        if key in seen:
            return False
        seen.add(key)
        return True

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and not child.name.upper().startswith("README"):
                    if any(part.startswith(".") for part in child.relative_to(path).parts):
                        continue
                    if first_time(child):
                        yield child
        elif first_time(path):
            yield path


def read_file(path: str | Path, *, format: str | None = None) -> ImportResult:
    """Read one file: every run it holds and every problem met.

    Args:
        path: file to read.
        format: importer name to force instead of detection.

    Never raises for bad input: unreadable, oversized, unknown-format and malformed
    files come back as problems naming the file (and the record, where there is one).
    A pipe (``<(zcat runs.jsonl.gz)``) is read up to :data:`MAX_FILE_BYTES`; a device or
    socket is refused. A file that is not valid JSON but starts like JSON (a run cut off
    mid-write) and is not JSON Lines is one problem with the decoder's message and
    position (``invalid JSON: ... line 40 column 3 (char 557)``, plus ``: the file ends
    before the document does`` for a cut), not an unknown format, also with ``format``
    forced. An importer that fails on unexpected input keeps the runs it read before,
    and the failure becomes a problem naming the importer. A file that holds no run (an
    empty tau2 ``simulations`` list, ``[]`` read as chat) is a problem naming it, so
    that nothing is dropped silently. Runs sharing a ``run_id``
    within the file are renamed ``ID#2``, ``ID#3``... (a problem says so) so that every
    result names one run.
    """
    path = Path(path)
    result = ImportResult()

    def file_problem(message: str) -> ImportResult:
        result.problems.append(ImportProblem(str(path), "file", message))
        return result

    try:
        mode = path.stat().st_mode
        if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
            with path.open("rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)
        else:
            return file_problem("not a regular file")
    except OSError as exc:
        return file_problem(exc.strerror or str(exc))
    if len(raw) > MAX_FILE_BYTES:
        return file_problem(f"larger than {MAX_FILE_BYTES} bytes")
    doc = Document(path=path, text=decode_text(raw))
    importer: Importer | None = None
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
    except UnknownFormat as exc:
        file_problem("empty file" if not doc.text.strip() else _broken_json(doc) or str(exc))
    except (ValueError, RecursionError) as exc:
        # A forced format on a broken document: the JSON error is the cause.
        file_problem(_broken_json(doc) or str(exc) or type(exc).__name__)
    except Exception as exc:  # an importer bug on odd input must not stop other files
        name = importer.name if importer is not None else "?"
        result.problems.append(
            ImportProblem(
                str(path),
                f"after run {len(result.trajectories)}",
                f"{name} importer failed: {type(exc).__name__}: {exc}",
            )
        )
    if importer is not None and not result.trajectories and not result.problems:
        file_problem(f"no runs in this {importer.name} file")
    _unique_run_ids(result)
    return result


def _broken_json(doc: Document) -> str | None:
    """``invalid JSON: ...`` (where it broke) for text that starts like JSON but is
    neither one JSON value nor JSON Lines, else ``None``."""
    if doc.text.lstrip()[:1] not in ("{", "[") or doc.json is not None:
        return None
    if doc.json_error is None or doc.json_lines is not None:
        return None
    return f"invalid JSON: {doc.json_error}"


def _unique_run_ids(result: ImportResult) -> None:
    """Rename runs whose ``run_id`` repeats one read before (``ID#2``...), in place."""
    seen: set[str] = set()
    next_n: dict[str, int] = {}  # per repeated id, the next suffix to try (linear time)
    for i, t in enumerate(result.trajectories):
        if t.run_id not in seen:
            seen.add(t.run_id)
            continue
        n = next_n.get(t.run_id, 2)
        while f"{t.run_id}#{n}" in seen:
            n += 1
        next_n[t.run_id] = n + 1
        new_id = f"{t.run_id}#{n}"
        seen.add(new_id)
        result.problems.append(
            ImportProblem(t.source, f"run {t.run_id!r}", f"duplicate run id, renamed {new_id!r}")
        )
        result.trajectories[i] = replace(t, run_id=new_id)


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
