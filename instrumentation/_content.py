"""Opt-in content capture: truncated, structure-preserving, scrubbed JSON.

Tool arguments and results go on spans only when the user turns capture on (the
``capture_content`` argument, else ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
set to ``true``). Captured values are scrubbed client-side with the same rules the
collector applies (:mod:`.redaction`); the collector is the second line of defence.
"""

from __future__ import annotations

import json
import os
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
            return value[:max_string] + f"…[+{len(value) - max_string} chars]"
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= max_items:
                out["…"] = f"[+{len(value) - max_items} keys]"
                break
            out[str(k)[:max_string]] = truncate(
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


def _redactor() -> Callable[[Any], Any]:
    from .redaction import default_redactor

    return default_redactor().redact_value


def capture_json(value: Any, *, max_chars: int = MAX_CAPTURE_CHARS) -> str:
    """Scrubbed, truncated JSON of ``value`` for ``gen_ai.tool.call.arguments``/``.result``.

    Never longer than ``max_chars``: strings are shortened first; if that is not enough the
    value is replaced by ``{"truncated": true, "preview": ...}`` (still valid JSON).
    """
    # Plain objects by identity, as before they were observed by state: their private
    # fields (a session's auth, a client's cookies) are not content to export.
    canon = canonicalize(value, objects="identity")
    scrub = _redactor()
    max_string = _MAX_STRING
    text = ""
    for _ in range(6):
        text = json.dumps(
            scrub(truncate(canon, max_string=max_string)), ensure_ascii=False, separators=(",", ":")
        )
        if len(text) <= max_chars:
            return text
        max_string //= 4
    preview = text[: max(max_chars // 3, 16)]
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
