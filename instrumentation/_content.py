"""Opt-in content capture: truncated, structure-preserving, scrubbed JSON.

Tool arguments and results go on spans only when the user turns capture on (the
``capture_content`` argument, else ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
set to ``true``). Captured values are scrubbed client-side with the same rules the
collector applies (:mod:`.redaction`); the collector is the second line of defence.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from . import _semconv as sc
from .fingerprint import canonicalize

if TYPE_CHECKING:
    from .redaction import Redactor

__all__ = ["capture_enabled", "capture_json", "scrub_for_digest", "truncate"]

MAX_CAPTURE_CHARS: Final = 16_384
_MAX_STRING: Final = 2_048
_MAX_ITEMS: Final = 64
_MAX_DEPTH: Final = 10
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
# redaction.PLACEHOLDER_PREFIX (that module is imported lazily, on first capture).
_PLACEHOLDER_PREFIX: Final = "[REDACTED:"
# capture_json scrubs strings cut to _MAX_STRING + this, then cuts them to size: a
# secret that straddles the final cut is redacted whole first, unless it is longer.
_SCRUB_MARGIN: Final = 8_192
_CHARS_MARKER_RE: Final = re.compile(r"…\[\+(\d+) chars\]\Z")


def capture_enabled(flag: bool | None) -> bool:
    """The effective capture switch: ``flag`` if given, else the GenAI env variable."""
    if flag is not None:
        return flag
    return os.environ.get(sc.ENV_CAPTURE_CONTENT, "").strip().lower() in _TRUE


def truncate(
    value: Any, *, max_string: int = _MAX_STRING, max_items: int = _MAX_ITEMS, _depth: int = 0
) -> Any:
    """Shorten a JSON-like value while keeping it valid JSON of the same shape.

    Long strings end with ``…[+N chars]``; long lists keep ``max_items`` items and a
    marker string; large objects keep ``max_items`` keys and a ``"…"`` key; nesting past
    10 levels becomes ``"[depth limit]"``.
    """
    if _depth > _MAX_DEPTH:
        return "[depth limit]"
    if isinstance(value, str):
        if len(value) > max_string:
            head = _cut(value, max_string)
            rest = len(value) - len(head)
            marker = _CHARS_MARKER_RE.search(value)
            if marker is not None and marker.start() >= len(head):
                # Truncated before (capture_json bounds what it scrubs): count it all.
                rest += int(marker.group(1)) - len(marker.group(0))
            return head + f"…[+{rest} chars]"
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= max_items:
                out["…"] = f"[+{len(value) - max_items} keys]"
                break
            out[_cut(str(k), max_string)] = truncate(
                v, max_string=max_string, max_items=max_items, _depth=_depth + 1
            )
        return out
    if isinstance(value, list | tuple):
        items = [
            truncate(v, max_string=max_string, max_items=max_items, _depth=_depth + 1)
            for v in value[:max_items]
        ]
        if len(value) > max_items:
            items.append(f"…[+{len(value) - max_items} items]")
        return items
    return value


def _cut(text: str, limit: int) -> str:
    # Never inside a redaction placeholder (under 64 chars, no "]" before their end).
    head = text[:limit]
    start = head.rfind("[", max(0, limit - 64))
    if start >= 0:
        rest = head[start:]
        if "]" not in rest and (
            rest.startswith(_PLACEHOLDER_PREFIX) or _PLACEHOLDER_PREFIX.startswith(rest)
        ):
            head = head[:start]
    return head


def _redactor() -> Callable[[Any], Any]:
    from .redaction import default_redactor

    return default_redactor().redact_value


def capture_json(value: Any, *, max_chars: int = MAX_CAPTURE_CHARS) -> str:
    """Scrubbed, truncated JSON of ``value`` for ``gen_ai.tool.call.arguments``/``.result``.

    Never longer than ``max_chars``: strings are shortened first; if that is not enough the
    value is replaced by ``{"truncated": true, "preview": ...}`` (still valid JSON).
    """
    # Plain objects by identity, not by state: their private fields (a session's auth, a
    # client's cookies) are not content to export.
    canon = canonicalize(value, objects="identity")
    # Scrub before the final cut: a secret or canary that straddles a cut would otherwise
    # be exported in part, which no rule recognises any more. What is scrubbed is bounded
    # first (items, depth, and strings to _MAX_STRING + _SCRUB_MARGIN chars).
    scrubbed = _redactor()(truncate(canon, max_string=_MAX_STRING + _SCRUB_MARGIN))
    text = json.dumps(scrubbed, ensure_ascii=False, separators=(",", ":"))
    if len(text) <= min(max_chars, _MAX_STRING):
        return text  # no string in it is long enough to cut
    max_string = _MAX_STRING
    for _ in range(6):
        cut = truncate(scrubbed, max_string=max_string, max_items=sys.maxsize)
        text = json.dumps(cut, ensure_ascii=False, separators=(",", ":"))
        if len(text) <= max_chars:
            return text
        max_string //= 4
    preview = _cut(text, max(max_chars // 3, 16))
    return json.dumps({"truncated": True, "preview": preview}, ensure_ascii=False)


class _DigestScrub:
    """The redactor's ``redact_value`` as a callable, with its ``clean_caches`` exposed so
    digesting can skip the walk for results already known clean."""

    __slots__ = ("clean_caches", "redact")

    def __init__(self, redactor: Redactor) -> None:
        self.redact = redactor.redact_value
        self.clean_caches = redactor.clean_caches

    def __call__(self, value: Any) -> Any:
        return self.redact(value)


def scrub_for_digest() -> Callable[[Any], Any] | None:
    """The redaction applied to results before digesting (rotating secrets are not
    progress)."""
    from .redaction import default_redactor

    return _DigestScrub(default_redactor())
