"""Canaries: values planted on purpose, and every form in which they are looked for.

A canary hit is the signal that data leaked; it wins over every allowlist. Canary files
hold one value a line (:func:`load_canaries`, :func:`canaries_from_env`); each canary is
looked for in its JSON-escaped, URL-encoded and base64 forms (:func:`canary_forms`)
through a :class:`CanaryMatcher` (:class:`RegexCanaryMatcher`, or the collector's
Aho-Corasick automaton), also split by line breaks or written with ``\\uXXXX`` escapes
(:func:`find_canaries`).
"""

from __future__ import annotations

import base64
import bisect
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol
from urllib.parse import quote, quote_plus

from .._semconv import ENV_CANARIES
from ._rules import PLACEHOLDER_PREFIX

MIN_CANARY_CHARS: Final = 8
# What JavaScript's encodeURIComponent and encodeURI leave unescaped beyond what
# urllib.parse.quote always leaves (letters, digits, "_.-~").
_JS_URI_COMPONENT_SAFE: Final = "!'()*"
_JS_URI_SAFE: Final = ";,/?:@&=+$#!'()*"
# A JSON escape of one BMP character (RFC 8259 section 7).
_U_ESCAPE_RE: Final = re.compile(r"\\u([0-9a-fA-F]{4})")
# Characters displays do not show (soft hyphen, zero-width space, non-joiner, joiner,
# word joiner, BOM); the dashboard also removes U+2060 from client text.
_INVISIBLE_RE: Final = re.compile("[\u00ad\u200b-\u200d\u2060\ufeff]")
# A run of line breaks (CR, LF, CRLF, or their JSON escapes) with the spaces and tabs
# after each, and of invisible characters: what MIME (RFC 2045 section 6.8: lines of at
# most 76 chars), PEM (RFC 7468: 64) and `base64` (76) insert into long base64 text,
# and what indented or folded text adds.
_FOLD_RE: Final = re.compile(
    r"(?:(?:\r\n|\r|\n|\\r\\n|\\r|\\n)[ \t]*|[\u00ad\u200b-\u200d\u2060\ufeff])+"
)


class CanaryMatcher(Protocol):
    """Finds canary occurrences; the collector plugs in an Aho-Corasick automaton."""

    def find_spans(self, text: str) -> list[tuple[int, int]]:
        """Return ``(start, end)`` of every occurrence of any canary form in ``text``.

        Spans may overlap; an empty list means no canary. Must be thread-safe.
        """
        ...


class RegexCanaryMatcher:
    """Stdlib canary matcher: one compiled alternation over every form of every canary.

    Finds overlapping occurrences (a zero-width lookahead at each position), so one form
    cannot hide another. Cost grows with the number of forms; the collector uses an
    Aho-Corasick automaton instead.

    Args:
        forms: every string to find (see :func:`canary_forms`); may be empty.
    """

    __slots__ = ("_regex",)

    def __init__(self, forms: Iterable[str]) -> None:
        ordered = sorted(set(forms), key=lambda f: (-len(f), f))
        alternation = "|".join(re.escape(f) for f in ordered)
        self._regex = re.compile(f"(?=({alternation}))") if ordered else None

    def find_spans(self, text: str) -> list[tuple[int, int]]:
        """See :meth:`CanaryMatcher.find_spans`."""
        if self._regex is None:
            return []
        return [(m.start(), m.start() + len(m.group(1))) for m in self._regex.finditer(text)]


def _base64_cores(data: bytes) -> set[str]:
    # In the base64 of any byte string holding `data` at an offset r (mod 3), the chars
    # whose 6 bits all come from `data` are fixed: chars ceil(8r/6) .. floor((8r+8n)/6)-1
    # of the encoding of r filler bytes + data. Matching those covers every alignment.
    forms: set[str] = set()
    n = len(data)
    for r in range(3):
        encoded = base64.b64encode(b"\0" * r + data + b"\0\0").decode("ascii")
        core = encoded[-(-8 * r // 6) : (8 * r + 8 * n) // 6]
        forms.add(core)
        forms.add(core.replace("+", "-").replace("/", "_"))
    for encoder in (base64.b64encode, base64.urlsafe_b64encode):
        full = encoder(data).decode("ascii")
        forms.add(full)
        forms.add(full.rstrip("="))
    return forms


def canary_forms(canary: str) -> frozenset[str]:
    """Return every form of ``canary`` that redaction looks for.

    The forms: the raw value; JSON-escaped (``ensure_ascii`` on and off, ``/`` escaped or
    not, and escaped twice for JSON inside a JSON string); URL-encoded (``quote`` with
    ``safe="/"`` and ``safe=""``, ``quote_plus``, JavaScript's ``encodeURIComponent`` and
    ``encodeURI``, WHATWG ``URLSearchParams``; upper- and lowercase hex); base64 and
    base64url of the UTF-8 bytes, padded and unpadded, plus the three alignment cores that
    occur when the canary sits inside a longer base64-encoded payload, the same for the
    JSON-escaped forms (base64 of a JSON document); and, for non-ASCII
    forms, the Latin-1 reading of their UTF-8 bytes (bytes values that are not UTF-8 are
    scanned as Latin-1).

    Args:
        canary: the exact canary value, at least :data:`MIN_CANARY_CHARS` characters.

    Returns:
        The forms; each at least 8 characters long.

    Raises:
        ValueError: the canary is too short, holds a line break, or could occur inside a
            placeholder. The message never contains the value.
    """
    if len(canary) < MIN_CANARY_CHARS:
        raise ValueError(f"a canary must be at least {MIN_CANARY_CHARS} characters long")
    if "\n" in canary or "\r" in canary:
        raise ValueError("a canary must not contain a line break")
    if PLACEHOLDER_PREFIX[1:-1] in canary.upper() or re.fullmatch(r"[0-9a-f]{1,8}", canary):
        raise ValueError("a canary must not be able to occur inside a placeholder")
    forms: set[str] = {canary}
    escaped = {json.dumps(canary)[1:-1], json.dumps(canary, ensure_ascii=False)[1:-1]}
    escaped |= {e.replace("/", "\\/") for e in escaped}
    escaped |= {json.dumps(e)[1:-1] for e in escaped}
    forms |= escaped
    encoded = {
        quote(canary),
        quote(canary, safe=""),
        quote_plus(canary),
        # JavaScript's encodeURIComponent and encodeURI (ECMA-262, "URI Handling
        # Functions") leave !'()* unescaped; WHATWG URLSearchParams (form-urlencoded)
        # leaves * and escapes ~.
        quote(canary, safe=_JS_URI_COMPONENT_SAFE),
        quote(canary, safe=_JS_URI_SAFE),
        quote_plus(canary, safe="*").replace("~", "%7E"),
    }
    encoded |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), e) for e in encoded}
    forms |= encoded
    forms |= _base64_cores(canary.encode("utf-8", "surrogatepass"))
    # Base64 of a JSON document holding the canary (a Kubernetes secret, a JWT claim set,
    # a data: URL) encodes its JSON-escaped form.
    for form in (json.dumps(canary)[1:-1], json.dumps(canary, ensure_ascii=False)[1:-1]):
        if form != canary:
            forms |= _base64_cores(form.encode("utf-8", "surrogatepass"))
    forms |= {
        f.encode("utf-8", "surrogatepass").decode("latin-1") for f in forms if not f.isascii()
    }
    return frozenset(forms)


def load_canaries(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Read a canary file: one value per line; blank lines and ``#`` lines are skipped.

    A line whose first non-blank character is ``#`` is a comment; a ``#`` elsewhere is part
    of the value. Surrounding whitespace is stripped. The file is UTF-8.

    Returns:
        The canaries, in file order, without duplicates.

    Raises:
        ValueError: the file cannot be read or a canary is invalid (:func:`canary_forms`);
            the message gives the path and line number, never the value.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"cannot read canary file {os.fspath(path)!r}: {type(exc).__name__}"
        ) from None
    canaries: dict[str, None] = {}
    for number, line in enumerate(lines, start=1):
        value = line.strip()
        if not value or value.startswith("#"):
            continue
        try:
            canary_forms(value)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}:{number}: {exc}") from None
        canaries[value] = None
    return tuple(canaries)


def canaries_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Load the canary file named by ``LOOPWATCH_REDACTION_CANARIES``, if set.

    Returns:
        The canaries, or ``()`` when the variable is unset or empty.

    Raises:
        ValueError: as :func:`load_canaries`.
    """
    path = (os.environ if environ is None else environ).get(ENV_CANARIES, "")
    return load_canaries(path) if path else ()


def find_canaries(
    matcher: CanaryMatcher, text: str, *, escapes: bool = True
) -> list[tuple[int, int]]:
    """Canary spans in ``text``, also those broken by line breaks (``_FOLD_RE``).

    Rule: a canary form split by line breaks (and the indentation after them) or by
    invisible characters (``_INVISIBLE_RE``) is still that form, so MIME-wrapped base64
    of a canary, a canary in a folded header or in a wrapped log line is found. The span
    reported covers the breaks inside it. With ``escapes``, a canary written with JSON
    ``\\uXXXX`` escapes is found as well (:func:`unescaped_canary_spans`).

    Returns:
        ``(start, end)`` spans into ``text``, possibly overlapping; empty for none.
    """
    found = matcher.find_spans(text)
    if (
        "\n" in text
        or "\r" in text
        or "\\n" in text
        or "\\r" in text
        or (not text.isascii() and _INVISIBLE_RE.search(text) is not None)
    ):
        found = _rewritten_spans(matcher, text, found, _FOLD_RE, lambda _: "")
    if escapes and "\\u" in text:
        found = unescaped_canary_spans(matcher, text, found)
    return found


def unescaped_canary_spans(
    matcher: CanaryMatcher, text: str, found: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Add to ``found`` the canary spans written with JSON ``\\uXXXX`` escapes in ``text``.

    Rule: a canary is a canary whatever characters of it a JSON writer escapes (Go's and
    .NET's HTML-safe ``\\u003c``, uppercase hex, escaped letters), also in text that is
    not parsed as JSON. ``text`` is read once more with every BMP escape decoded.
    """
    return _rewritten_spans(matcher, text, found, _U_ESCAPE_RE, lambda m: chr(int(m.group(1), 16)))


def _rewritten_spans(
    matcher: CanaryMatcher,
    text: str,
    found: list[tuple[int, int]],
    pattern: re.Pattern[str],
    replace: Callable[[re.Match[str]], str],
) -> list[tuple[int, int]]:
    """``found`` plus the canary spans of ``text`` with every ``pattern`` match replaced
    by ``replace(match)``: the rewritten text is scanned, and a match that covers a
    rewrite is mapped back onto ``text`` (one that covers none was found in ``text``)."""
    parts: list[str] = []
    ends: list[int] = []  # rewritten index where each rewrite ends
    starts: list[int] = []  # rewritten index where each rewrite starts
    shifts: list[int] = []  # chars removed up to and including each rewrite
    position = total = 0
    for match in pattern.finditer(text):
        start, end = match.span()
        new = replace(match)
        parts += (text[position:start], new)
        starts.append(start - total)
        ends.append(start - total + len(new))
        total += end - start - len(new)
        shifts.append(total)
        position = end
    if not shifts:
        return found
    parts.append(text[position:])
    extra = set(found)
    for start, end in matcher.find_spans("".join(parts)):
        first = bisect.bisect_right(ends, start)  # rewrites wholly before the match
        last = bisect.bisect_left(starts, end)  # rewrites that start before its end
        if first < last:
            extra.add((start + (shifts[first - 1] if first else 0), end + shifts[last - 1]))
    return sorted(extra)


def _merged_count(spans: list[tuple[int, int]]) -> int:
    """How many placeholders ``spans`` would make: overlapping spans count once."""
    count = 0
    reach = -1
    for start, end in sorted(spans):
        if start >= reach:
            count += 1
        reach = max(reach, end)
    return count


def count_canaries(matcher: CanaryMatcher, value: Any) -> int:
    """How many placeholders the canaries in ``value`` would make: in every string, key
    and ``bytes`` (read as Latin-1) of a JSON-like value, walked without recursion (it
    may be nested past any depth bound); overlapping matches count once."""
    found = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is bytes:
            text = item if kind is str else item.decode("latin-1")
            if len(text) >= MIN_CANARY_CHARS:
                found += _merged_count(find_canaries(matcher, text))
        elif kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return found
