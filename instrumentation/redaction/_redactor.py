"""The redactor: applies the rules and the canaries to text, JSON and JSON-like values.

:class:`Redactor` walks a value (``dict``, ``list``, ``str``, ``bytes``, and JSON inside
strings, re-serialized compactly when it changes, as parsed when it has duplicate keys),
replaces what the rules, the command-line reader and the canaries find, and counts the
hits by rule. A pattern runs only on text holding one of its triggers (one ``in`` test
each, or the collector's Aho-Corasick matcher); lowercase alphanumeric strings and
strings under 5 characters skip the patterns, and clean strings are remembered in
bounded caches. :func:`default_redactor` is the agent side's instance.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Container, Iterable, Mapping, Sequence
from itertools import islice
from typing import Any, Final

from .._semconv import ENV_CANARIES
from ._canaries import (
    CanaryMatcher,
    RegexCanaryMatcher,
    canary_forms,
    count_canaries,
    find_canaries,
    load_canaries,
    unescaped_canary_spans,
)
from ._command_line import argument_list_spans, cli_password_spans, quote_closes
from ._rules import (
    HMAC_TAG_HEX_CHARS,
    PLACEHOLDER_PREFIX,
    PLACEHOLDER_RE,
    RULE_CANARY,
    RULE_CLI_PASSWORD_FLAG,
    RULE_DEPTH,
    RULE_SENSITIVE_KEY,
    Hits,
    RedactionRules,
    placeholder,
)

_logger = logging.getLogger(__name__)

_KEY_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_KEY_LOOKBACK_CHARS: Final = 128
# A percent escape, or one encoded once more ("%26", "%2526").
_PERCENT_ESCAPE_RE: Final = re.compile(r"%(?:25)?[0-9A-Fa-f]{2}")
_CLEAN_CACHE_MAX_ENTRIES: Final = 32768
_CLEAN_CACHE_MAX_CHARS: Final = 256
# JSON text that a parse and walk left unchanged, by the depth it was scrubbed at. Longer
# than the plain cache admits: the JSON of a run span (its policy's limits, 300-700
# chars, naming max_tokens) repeats for every run of a policy, and parsing and walking
# it is about half of the collector's redaction time on such spans.
_JSON_CLEAN_CACHE_MAX_ENTRIES: Final = 4096
_JSON_CLEAN_CACHE_MAX_CHARS: Final = 4096
_KEY_CACHE_MAX_ENTRIES: Final = 8192
_FIXPOINT_PASSES: Final = 4
# Shortest text any built-in rule can match: "pwd=x" (assignment) or "://:x@" (URL).
_MIN_SECRET_CHARS: Final = 5


_DEFAULT: dict[str, Redactor] = {}


def default_redactor() -> Redactor:
    """The agent side's redactor: built-in rules plus the canaries named by the environment.

    Cached per value of ``LOOPWATCH_REDACTION_CANARIES``. Never raises (telemetry must not
    break the agent): an unreadable or invalid canary file is logged, without its content,
    and the redactor runs without canaries; the collector still checks them.
    """
    path = os.environ.get(ENV_CANARIES, "")
    redactor = _DEFAULT.get(path)
    if redactor is None:
        try:
            redactor = Redactor(canaries=load_canaries(path) if path else ())
        except ValueError as exc:
            _logger.warning("redaction canaries not loaded: %s", exc)
            redactor = Redactor()
        _DEFAULT[path] = redactor
    return redactor


class Redactor:
    """Applies :class:`RedactionRules` and canaries to text and JSON-like values.

    Thread-safe: configuration is immutable; the internal caches are plain ``set``/``dict``
    whose single operations are atomic. No input value makes it raise.

    Args:
        rules: the rules (default :class:`RedactionRules()`).
        canaries: exact canary values (see :func:`canary_forms`).
        canary_matcher: a faster matcher built from ``canary_forms`` of the same canaries;
            default :class:`RegexCanaryMatcher`.
        trigger_matcher: a multi-substring matcher over :attr:`RedactionRules.triggers`,
            run on the lowercased text, replacing the default pre-filter (one ``in`` test
            per trigger). It must find every occurrence of every trigger.
        hmac_key: turns on HMAC mode: placeholders carry the first 8 hex chars of
            HMAC-SHA256(hmac_key, value). At least 16 bytes.

    Raises:
        ValueError: an invalid canary or an HMAC key shorter than 16 bytes.

    Example:
        >>> text, hits = Redactor().redact_text("postgres://app:s3cret@db:5432/x")
        >>> text, hits
        ('postgres://app:[REDACTED:url_password]@db:5432/x', {'url_password': 1})
    """

    __slots__ = (
        "_argv",
        "_clean",
        "_clean_json",
        "_hmac_key",
        "_key_cache",
        "_matcher",
        "_n_canaries",
        "_placeholders",
        "_trigger_matcher",
        "rules",
    )

    def __init__(
        self,
        rules: RedactionRules | None = None,
        *,
        canaries: Iterable[str] = (),
        canary_matcher: CanaryMatcher | None = None,
        trigger_matcher: CanaryMatcher | None = None,
        hmac_key: bytes | None = None,
    ) -> None:
        self.rules = RedactionRules() if rules is None else rules
        values = tuple(dict.fromkeys(canaries))
        forms: set[str] = set().union(*map(canary_forms, values))
        if hmac_key is not None and len(hmac_key) < 16:
            raise ValueError("hmac_key must be at least 16 bytes")
        self._hmac_key = hmac_key
        self._n_canaries = len(values)
        if canary_matcher is None and forms:
            canary_matcher = RegexCanaryMatcher(forms)
        self._matcher = canary_matcher
        self._trigger_matcher = trigger_matcher
        self._placeholders = {name: placeholder(name) for name in self.rules.rule_names}
        # Argument vectors are read as command lines when the rule that reads those is on.
        self._argv = any(c.spans is cli_password_spans for c in self.rules._compiled)
        self._clean: set[str] = set()
        self._clean_json: dict[str, int] = {}
        self._key_cache: dict[str, bool] = {}

    def __repr__(self) -> str:
        return (
            f"Redactor(rules={len(self.rules.rule_names)} rules, canaries={self._n_canaries}, "
            f"hmac={'on' if self._hmac_key else 'off'})"
        )

    @property
    def rule_names(self) -> tuple[str, ...]:
        """Every rule name a hit can carry (the bounded ``rule`` label set)."""
        return self.rules.rule_names

    def clean_caches(self) -> tuple[Container[str], Mapping[str, bool], int]:
        """What this redactor already knows to be clean, for callers that can skip it.

        Returns:
            ``(strings, keys, max_depth)``: strings that :meth:`redact_value` leaves
            unchanged, key names mapped to False when a value under them is not masked
            and the key text itself is unchanged, and the container nesting bound. A
            JSON-like value (``dict`` with ``str`` keys, ``list``, ``str``, ``int``,
            ``float``, ``bool``, ``None``) whose every string is in ``strings``, every
            key maps to False in ``keys``, and whose containers nest less than
            ``max_depth`` deep is returned unchanged by :meth:`redact_value`. Both are
            live, bounded caches (read-only for the caller; a miss only means "unknown").
        """
        return self._clean, self._key_cache, self.rules.max_json_depth

    def redact_text(self, text: str) -> tuple[str, Hits]:
        """Redact one string (JSON inside it included). Never raises.

        Returns:
            ``(redacted, hits)``; ``redacted is text`` when nothing matched. If the
            caller's stack is too deep to finish, the whole text becomes
            ``[REDACTED:depth]`` (fail closed).
        """
        hits: Hits = {}
        try:
            return self.scrub_text(text, hits), hits
        except RecursionError:
            # No function call here: the stack may have no room left for one.
            return self._placeholders[RULE_DEPTH], {RULE_DEPTH: 1}

    def redact_value(self, value: Any) -> Any:
        """Redact a JSON-like value: ``dict``/``list``/``tuple``/``str``/``bytes``/scalars.

        Copy-on-write: the input is never mutated; an unchanged value is returned as is.
        Mapping values under sensitive keys are replaced whole; strings are scanned (JSON
        inside them included); ``bytes`` are scanned as UTF-8 (Latin-1 if invalid) and stay
        ``bytes``; numbers, booleans and ``None`` pass through, and so do objects of other
        types (serialize them first). Use :meth:`scrub_value` to also get the counts.

        Returns:
            The redacted value; ``[REDACTED:depth]`` if the caller's stack is too deep to
            finish (fail closed). Never raises.
        """
        try:
            return self._walk(value, {}, 0)
        except RecursionError:
            return self._placeholders[RULE_DEPTH]

    def scrub_text(self, text: str, hits: Hits) -> str:
        """Like :meth:`redact_text`, adding counts by rule to ``hits`` (hot path).

        Raises:
            RecursionError: only if the caller's stack is nearly exhausted; the caller
                decides how to fail closed.
        """
        return self._scrub_str(text, hits, 0)

    def scrub_value(self, value: Any, hits: Hits) -> Any:
        """Like :meth:`redact_value`, adding counts by rule to ``hits`` (hot path).

        Raises:
            RecursionError: as :meth:`scrub_text`.
        """
        return self._walk(value, hits, 0)

    def _placeholder(self, rule: str, secret: str) -> str:
        if self._hmac_key is None:
            return self._placeholders[rule]
        digest = hmac.new(self._hmac_key, secret.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return placeholder(rule, digest.hexdigest()[:HMAC_TAG_HEX_CHARS])

    def _own_placeholder(self, text: str) -> bool:
        # A placeholder this redactor writes: the syntax, and one of its rule names.
        match = PLACEHOLDER_RE.fullmatch(text)
        return match is not None and match.group(1) in self._placeholders

    def _key_sensitive(self, key: str, *, remember: bool = True) -> bool:
        # The cache doubles as "this key text is clean": only keys that redaction left
        # unchanged are remembered, so a cached key skips the scan as well.
        cached = self._key_cache.get(key)
        if cached is None:
            cached = self.rules.key_is_sensitive(key)
            if remember:
                if len(self._key_cache) >= _KEY_CACHE_MAX_ENTRIES:
                    self._key_cache.clear()
                self._key_cache[key] = cached
        return cached

    def _scrub_str(self, text: str, hits: Hits, depth: int) -> str:
        if text in self._clean or self._clean_json.get(text, -1) == depth:
            return text
        out = self._scrub_once(text, hits, depth)
        if out is text:
            return text
        # A replacement can change a neighbour's boundary; iterate to a fixed point so that
        # redacting twice equals redacting once.
        for _ in range(_FIXPOINT_PASSES):
            again = self._scrub_once(out, hits, depth)
            if again == out:
                return out
            out = again
        hits[RULE_DEPTH] = hits.get(RULE_DEPTH, 0) + 1
        return self._placeholder(RULE_DEPTH, text)

    def _gate(self, text: str) -> set[int] | None:
        if self._trigger_matcher is not None:
            lowered = text.lower()
            found = self._trigger_matcher.find_spans(lowered)
            if not found:
                return None
            index = self.rules._trigger_index
            return set().union(*(index[lowered[a:b]] for a, b in found))
        fired: set[int] | None = None
        for trigger, indices in self.rules._cs_triggers:
            if trigger in text:
                fired = set(indices) if fired is None else fired | indices
        if self.rules._ci_triggers:
            lowered = text.lower()
            for trigger, indices in self.rules._ci_triggers:
                if trigger in lowered:
                    fired = set(indices) if fired is None else fired | indices
        return fired

    def _scrub_once(self, text: str, hits: Hits, depth: int) -> str:
        rules = self.rules
        json_like = rules.parse_json_strings and _looks_like_json(text)
        # JSON text that the walk will decode needs no decoded view of its \u escapes.
        canary = (
            find_canaries(self._matcher, text, escapes=not json_like)
            if self._matcher is not None
            else []
        )
        fired: set[int] | None = None
        if not (
            rules._alnum_lower_safe
            and (
                len(text) < _MIN_SECRET_CHARS
                or (text.isalnum() and (text.islower() or text.isdigit()))
            )
        ):
            fired = self._gate(text)
        # JSON escapes (\u0070assword, \/) can hide a trigger from the raw-text gate.
        escaped = json_like and "\\" in text
        if not canary and fired is None and not escaped:
            self._remember_clean(text)
            return text
        if json_like and depth < rules.max_json_depth:
            dropped: list[Any] = []
            parsed = _parse_json(text, dropped)
            if parsed is _TOO_DEEP:
                if escaped:
                    # Too deep for the parser, and escapes (\u0061) can hide a canary or
                    # a secret from the raw-text scan: fail closed.
                    return self._too_deep(text, hits)
            elif parsed is not None:
                local: Hits = {}
                new = self._walk(parsed, local, depth + 1)
                if dropped:
                    # Duplicate keys: the parse kept the last value of each, so the walk
                    # never saw the others. Re-serialize (what a last-wins reader sees),
                    # and let a canary among the dropped values still raise the signal.
                    out = _dump_json(new)
                    found = sum(self._count_canaries(v, depth + 1) for v in dropped)
                    if found:
                        local[RULE_CANARY] = local.get(RULE_CANARY, 0) + found
                else:
                    out = text if new is parsed else _dump_json(new)
                if out is text and not local and not canary:
                    self._remember_clean_json(text, depth)
                for rule, count in local.items():
                    hits[rule] = hits.get(rule, 0) + count
                if canary and self._matcher is not None:
                    # A canary written across JSON structure survives the walk.
                    rest = find_canaries(self._matcher, out)
                    if rest:
                        out = self._replace(out, rest, None, hits)
                return out
        elif escaped:
            # JSON text at the depth bound is a container past it (fail closed, as
            # _too_deep): its escapes could hide a canary or secret from the text scan.
            return self._too_deep(text, hits)
        if json_like and self._matcher is not None and "\\u" in text:
            # Not JSON after all (or too deep to parse): read its escapes as text does.
            canary = unescaped_canary_spans(self._matcher, text, canary)
        out = self._replace(text, canary, fired, hits)
        if out is text and not json_like:
            self._remember_clean(text)
        return out

    def _remember_clean(self, text: str) -> None:
        if len(text) <= _CLEAN_CACHE_MAX_CHARS:
            if len(self._clean) >= _CLEAN_CACHE_MAX_ENTRIES:
                self._clean.clear()
            self._clean.add(text)

    def _remember_clean_json(self, text: str, depth: int) -> None:
        # Keyed by depth, and only that depth is trusted: from another depth the walk
        # meets the depth limit elsewhere, so its result may differ.
        if len(text) <= _JSON_CLEAN_CACHE_MAX_CHARS:
            if len(self._clean_json) >= _JSON_CLEAN_CACHE_MAX_ENTRIES:
                self._clean_json.clear()
            self._clean_json[text] = depth

    def _replace(
        self, text: str, canary: list[tuple[int, int]], fired: set[int] | None, hits: Hits
    ) -> str:
        spans: list[tuple[int, int, int]] = [(a, b, -1) for a, b in canary]
        rules = self.rules
        if fired:
            for index in sorted(fired):
                if index == rules._key_index:
                    continue
                crule = rules._compiled[index]
                if crule.spans is not None:
                    found: Iterable[tuple[int, int]] = crule.spans(text, crule.regex)
                elif crule.is_assignment:
                    found = [
                        match.span(crule.secret_group)
                        for match in crule.regex.finditer(text)
                        if self._assignment_key_sensitive(text, match)
                        and not _closes_a_string(text, match)
                    ]
                else:
                    group = crule.secret_group
                    found = [match.span(group) for match in crule.regex.finditer(text)]
                for start, end in found:
                    if start < 0 or end <= start or not self._redactable(text[start:end]):
                        continue
                    spans.append((start, end, index))
        if spans and PLACEHOLDER_PREFIX in text:
            spans = _outside_placeholders(text, spans, self._placeholders)
        if not spans:
            return text
        spans.sort()
        merged = [list(spans[0])]
        for span in spans[1:]:
            last = merged[-1]
            if span[0] < last[1]:  # overlap: the union, tagged with the first rule
                last[1], last[2] = max(last[1], span[1]), min(last[2], span[2])
            else:
                merged.append(list(span))
        pieces: list[str] = []
        position = 0
        for start, end, index in merged:
            name = RULE_CANARY if index < 0 else self.rules._compiled[index].name
            hits[name] = hits.get(name, 0) + 1
            pieces += (text[position:start], self._placeholder(name, text[start:end]))
            position = end
        pieces.append(text[position:])
        return "".join(pieces)

    def _redactable(self, secret: str) -> bool:
        """Whether a rule's match is replaced: not a placeholder of ours (redacting twice
        equals once), nor an allowed value."""
        if secret.startswith(PLACEHOLDER_PREFIX) and self._own_placeholder(secret):
            return False
        allowed = self.rules._allowed
        return not (allowed and any(p.fullmatch(secret) for p in allowed))

    def _assignment_key_sensitive(self, text: str, match: re.Match[str]) -> bool:
        # The regex anchors on the sensitive word; the whole key ("db_password",
        # "next_page_token") decides, with the same semantics as the key-name rule.
        start = match.start()
        floor = max(0, start - _KEY_LOOKBACK_CHARS)
        while start > floor and text[start - 1] in _KEY_CHARS:
            # "%26password", "%2526password": a URL-encoded separator ends the key. The
            # cheap test first: this walk runs on every assignment match.
            if "%" in text[max(0, start - 5) : start] and (
                _PERCENT_ESCAPE_RE.fullmatch(text, max(0, start - 3), start)
                or _PERCENT_ESCAPE_RE.fullmatch(text, max(0, start - 5), start)
            ):
                break
            start -= 1
        if start >= 1 and text[start - 1] == "\\" and text[start] in "nrt":
            start += 1  # "DEBUG=1\npassword=x" written with escapes: the key is "password"
        end = match.start()
        while end < len(text) and text[end] in _KEY_CHARS:
            end += 1
        # A flag's dashes are not part of its name: "--page-token" is "page_token".
        return self._key_sensitive(text[start:end].lstrip("-"), remember=False)

    def _walk(self, value: Any, hits: Hits, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            return self._scrub_str(value, hits, depth)
        if kind is dict or kind is list or kind is tuple:
            if depth >= self.rules.max_json_depth:
                return self._too_deep(value, hits)
            if kind is dict:
                return self._walk_dict(value, hits, depth)
            return self._walk_sequence(value, hits, depth)
        if kind is bytes:
            return self._scrub_bytes(value, hits, depth)
        if kind is int or kind is float or kind is bool or value is None:
            return value
        # Subclasses and look-alikes: handled rather than passed through unscanned.
        if isinstance(value, str):
            return self._scrub_str(str(value), hits, depth)
        if isinstance(value, Mapping):
            return self._walk(dict(value), hits, depth)
        if isinstance(value, (list, tuple)):
            return self._walk(list(value), hits, depth)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._scrub_bytes(bytes(value), hits, depth)
        return value

    def _walk_sequence(self, value: list[Any] | tuple[Any, ...], hits: Hits, depth: int) -> Any:
        new: list[Any] | None = None
        for index, item in enumerate(value):
            scrubbed = self._walk(item, hits, depth + 1)
            if new is None and scrubbed is not item:
                new = list(value[:index])
            if new is not None:
                new.append(scrubbed)
        if self._argv and len(value) >= 2 and all(type(item) is str for item in value):
            new = self._scrub_argv(new if new is not None else value, hits) or new
        if new is None:
            return value
        return new if type(value) is list else tuple(new)

    def _scrub_argv(self, items: Sequence[str], hits: Hits) -> list[str] | None:
        """``items`` with the passwords of an argument vector replaced (rule
        ``cli_password_flag``: ``["redis-cli", "-a", "pw"]``), or ``None`` if none."""
        found = argument_list_spans(items)
        if not found:
            return None
        out = list(items)
        for index, spans in found.items():
            item = out[index]
            pieces: list[str] = []
            position = 0
            for start, end in sorted(spans):
                secret = item[start:end]
                if start < position or not self._redactable(secret):
                    continue
                pieces += (item[position:start], self._placeholder(RULE_CLI_PASSWORD_FLAG, secret))
                position = end
                hits[RULE_CLI_PASSWORD_FLAG] = hits.get(RULE_CLI_PASSWORD_FLAG, 0) + 1
            if pieces:
                pieces.append(item[position:])
                out[index] = "".join(pieces)
        return None if out == list(items) else out

    def _walk_dict(self, value: dict[Any, Any], hits: Hits, depth: int) -> Any:
        # Hot path of the collector: one cache lookup per key and per string value.
        clean = self._clean
        known_keys = self._key_cache
        new: dict[Any, Any] | None = None
        for index, (key, item) in enumerate(value.items()):
            new_key = key
            sensitive = known_keys.get(key)
            if sensitive is None:
                if type(key) is str:
                    new_key = self._scrub_str(key, hits, depth)
                    sensitive = self._key_sensitive(key, remember=new_key is key)
                else:
                    sensitive = False
            if sensitive:
                scrubbed = self._mask(item, hits, depth)
            else:
                kind = type(item)
                if kind is str:
                    scrubbed = item if item in clean else self._scrub_str(item, hits, depth + 1)
                elif kind is int or kind is bool or kind is float:
                    scrubbed = item
                else:
                    scrubbed = self._walk(item, hits, depth + 1)
            if new is None and (scrubbed is not item or new_key is not key):
                new = dict(islice(value.items(), index))
            if new is not None:
                new[new_key] = scrubbed
        return value if new is None else new

    def _too_deep(self, value: Any, hits: Hits) -> str:
        # What a depth placeholder replaces is not walked, but a canary in it must still
        # raise the signal.
        if self._matcher is not None:
            found = count_canaries(self._matcher, value)
            if found:
                hits[RULE_CANARY] = hits.get(RULE_CANARY, 0) + found
        hits[RULE_DEPTH] = hits.get(RULE_DEPTH, 0) + 1
        return self._placeholder(RULE_DEPTH, _canonical(value) if self._hmac_key else "")

    def _scrub_bytes(self, value: bytes, hits: Hits, depth: int) -> bytes:
        try:
            text, encoding = value.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            # Latin-1 maps bytes 1:1 to code points, so canary forms (which include the
            # Latin-1 reading of their UTF-8 bytes) and ASCII patterns still match.
            text, encoding = value.decode("latin-1"), "latin-1"
        scrubbed = self._scrub_str(text, hits, depth)
        return value if scrubbed is text else scrubbed.encode(encoding, "surrogatepass")

    def _mask(self, value: Any, hits: Hits, depth: int) -> Any:
        if value is None or value is True or value is False:
            return value
        if isinstance(value, (str, bytes)) and not value:
            return value
        text = value.decode("ascii", "replace") if type(value) is bytes else value
        if (
            type(text) is str
            and text.startswith(PLACEHOLDER_PREFIX)
            and self._own_placeholder(text)
        ):
            return value
        # A canary under a sensitive key must still raise the canary signal.
        found = self._count_canaries(value, depth)
        if found:
            hits[RULE_CANARY] = hits.get(RULE_CANARY, 0) + found
            rule = RULE_CANARY
        else:
            allowed = self.rules._allowed
            if allowed and type(value) is str and any(p.fullmatch(value) for p in allowed):
                return value
            hits[RULE_SENSITIVE_KEY] = hits.get(RULE_SENSITIVE_KEY, 0) + 1
            rule = RULE_SENSITIVE_KEY
        masked = self._placeholder(rule, _canonical(value) if self._hmac_key else "")
        return masked.encode("ascii") if type(value) is bytes else masked

    def _count_canaries(self, value: Any, depth: int) -> int:
        # Canaries in a value replaced whole (under a sensitive key, or shadowed by a
        # duplicate JSON key): the canary signal must still be raised.
        if self._matcher is None:
            return 0
        kind = type(value)
        if kind is str or kind is bytes:
            local: Hits = {}
            (self._scrub_str if kind is str else self._scrub_bytes)(value, local, depth)
            return local.get(RULE_CANARY, 0)
        if depth >= self.rules.max_json_depth:
            return count_canaries(self._matcher, value)
        if kind is dict:
            return sum(
                self._count_canaries(k, depth) + self._count_canaries(v, depth + 1)
                for k, v in value.items()
            )
        if kind is list or kind is tuple:
            return sum(self._count_canaries(v, depth + 1) for v in value)
        return 0


def _closes_a_string(text: str, match: re.Match[str]) -> bool:
    """Whether an assignment match's quote closes a string rather than opening a value
    (:func:`quote_closes`): ``print("password:", pw)``, ``"Invalid password: " + name``."""
    quote = match.group("quote")
    if not quote:
        return False
    return quote_closes(text, match.start("quote"), quote, match.start("secret"))


def _outside_placeholders(
    text: str, spans: list[tuple[int, int, int]], rule_names: Container[str]
) -> list[tuple[int, int, int]]:
    # Placeholders are atomic: a match that starts or ends inside one is ignored (rule
    # names such as "aws_secret_key" inside a placeholder must not match again). Only
    # placeholders of a rule the redactor has: "[REDACTED:<canary>]" is not one.
    inside = [m.span() for m in PLACEHOLDER_RE.finditer(text) if m.group(1) in rule_names]
    if not inside:
        return spans
    # Placeholders do not overlap and come sorted: a binary search per match keeps this
    # O((matches + placeholders) log placeholders) on hostile input.
    starts = [p for p, _ in inside]

    def within(pos: int) -> bool:
        i = bisect.bisect_left(starts, pos) - 1
        return i >= 0 and inside[i][0] < pos < inside[i][1]

    return [(a, b, rule) for a, b, rule in spans if not (within(a) or within(b))]


def _looks_like_json(text: str) -> bool:
    if len(text) < 2:
        return False
    first, last = text[0], text[-1]
    if first in " \t\r\n" or last in " \t\r\n":
        stripped = text.strip() or " "
        first, last = stripped[0], stripped[-1]
    return (first == "{" and last == "}") or (first == "[" and last == "]")


_TOO_DEEP: Final = object()
"""What :func:`_parse_json` returns for JSON nested deeper than the parser goes."""


class _DuplicateKeys(Exception):
    pass


def _unique_pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(items)
    if len(obj) != len(items):
        raise _DuplicateKeys
    return obj


# One decoder for every parse (json.loads with a hook would build one per call); a
# document with duplicate keys, rare, is parsed again to collect what they shadow.
_DECODER: Final = json.JSONDecoder(object_pairs_hook=_unique_pairs)


def _parse_json(text: str, dropped: list[Any]) -> Any:
    """Parse a JSON object or array; ``None`` if it is not one, :data:`_TOO_DEEP` if the
    parser ran out of stack. The values that duplicate keys shadow (all but the last of
    each key, as ``json.loads`` keeps) are appended to ``dropped``."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            last = {key: index for index, (key, _) in enumerate(items)}
            dropped.extend(v for index, (k, v) in enumerate(items) if last[k] != index)
        return obj

    try:
        try:
            parsed = _DECODER.decode(text)
        except _DuplicateKeys:
            parsed = json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        return _TOO_DEEP
    except ValueError:
        return None
    return parsed if isinstance(parsed, (dict, list)) else None


def _dump_json(value: Any) -> str:
    try:
        out = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        out.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (legal as \\ud800 escapes in JSON) cannot be UTF-8 encoded
        # downstream; keep them escaped.
        out = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return out


def _canonical(value: Any) -> str:
    if type(value) is str:
        return value
    if type(value) is bytes:
        return value.decode("latin-1")
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    except (ValueError, TypeError, RecursionError):
        return type(value).__name__
