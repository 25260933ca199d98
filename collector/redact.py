"""The ``redact`` stage: secrets and canaries out of every field of a batch.

Runs before anything is stored, logged, counted or served (DESIGN section 5). The rules
are :mod:`loopwatch.instrumentation.redaction`, the same the agent applies client-side;
this stage adds an Aho-Corasick canary matcher (one automaton holding every form of every
canary, built once) and the walk over every place a value can hide in a
:class:`~loopwatch.collector.records.SpanBatch`:

========================================  =================
field                                     canary location
========================================  =================
resource attributes, schema URL           ``resource``
scope name, version, attributes           ``attribute``
span attributes (arrays, kvlists, bytes)  ``attribute``
span ``trace_state``; link attributes     ``attribute``
and ``trace_state``
span name                                 ``name``
event names and attributes                ``event``
(``exception.message``, ``.stacktrace``)
status message                            ``status``
========================================  =================

JSON inside string attributes (``gen_ai.tool.call.arguments``, ``input.value``, ...) is
parsed, redacted and re-serialized. Attribute keys are scanned too; a key that is
rewritten can collide with another key, and the later value wins.

A span with a canary flags its run: the run id (``loopwatch.run.id``, else the trace id)
goes into ``batch.canary_run_ids``. A canary in a shared resource or scope flags the run of
every span under it. Canary values are never logged, stored, or put in a message or label.

Counting: :meth:`RedactStage.counts` returns cumulative totals (canary hits by location,
redactions by rule, flagged runs) for the metrics stage; resource and scope records shared
by several spans are scanned, and counted, once per batch.

Failure: the stage fails closed. A span whose redaction raises (a bug, not an input: the
rules never raise on any value) is removed from the batch and reported with
``batch.reject(1, "redaction failed")``, never passed on unredacted.

Cost: per-span work is constant and proportional to the text in the span. Strings that
are common across spans (names, keys, enum values) hit a cache of known-clean values.
Thread-safe: :meth:`RedactStage.process` may run on several threads at once.

Example:
    >>> stage = RedactStage(canaries=["lw-canary-7f3a9c21"])
    >>> batch = stage.process(batch)
    >>> stage.counts().canary_by_location["attribute"]
    1
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import ahocorasick
from loopwatch.instrumentation._semconv import LW_RUN_ID
from loopwatch.instrumentation.redaction import (
    RULE_CANARY,
    Hits,
    RedactionRules,
    Redactor,
    canary_forms,
)

from .errors import ConfigError
from .records import SpanBatch, SpanRecord

__all__ = [
    "CANARY_LOCATIONS",
    "REDACTION_FAILED",
    "AhoCorasickMatcher",
    "RedactStage",
    "RedactionCounts",
]

_logger = logging.getLogger(__name__)

CANARY_LOCATIONS: Final = ("attribute", "event", "name", "status", "resource")
"""Values of the ``location`` label of ``loopwatch_canary_detections_total``."""

REDACTION_FAILED: Final = "redaction failed"
"""The ``partial_success`` message for spans refused because their redaction raised."""


class AhoCorasickMatcher:
    """Finds every occurrence of a fixed set of strings in one pass (pyahocorasick).

    Implements :class:`loopwatch.instrumentation.redaction.CanaryMatcher`; used for the
    canary forms and for the pre-filter triggers. The automaton is built once here and
    only read afterwards, so :meth:`find_spans` is thread-safe.

    Args:
        words: the strings to find (empty strings are ignored).
    """

    __slots__ = ("_automaton",)

    def __init__(self, words: Iterable[str]) -> None:
        automaton = ahocorasick.Automaton(ahocorasick.STORE_LENGTH)
        for word in set(words):
            if word:
                automaton.add_word(word)
        if len(automaton):
            automaton.make_automaton()
        self._automaton = automaton if len(automaton) else None

    @classmethod
    def for_canaries(cls, canaries: Iterable[str]) -> AhoCorasickMatcher:
        """One automaton over every :func:`canary_forms` form of every canary.

        Raises:
            ValueError: an invalid canary (the message never contains the value).
        """
        forms: set[str] = set()
        for canary in canaries:
            forms |= canary_forms(canary)
        return cls(forms)

    def find_spans(self, text: str) -> list[tuple[int, int]]:
        """Return ``(start, end)`` of every canary form in ``text`` (overlaps included)."""
        if self._automaton is None:
            return []
        return [(end + 1 - length, end + 1) for end, length in self._automaton.iter(text)]


@dataclass(frozen=True, slots=True)
class RedactionCounts:
    """Cumulative totals of one :class:`RedactStage` since construction.

    Attributes:
        spans: spans processed.
        canary_by_location: canary occurrences redacted, by location; every key of
            :data:`CANARY_LOCATIONS` is present.
        redactions_by_rule: placeholders written, by rule name (``canary`` included); every
            rule of :attr:`Redactor.rule_names` is present.
        canary_runs: runs flagged, counted once per batch that flags them.
        failed_spans: spans refused because their redaction raised.
    """

    spans: int
    canary_by_location: Mapping[str, int]
    redactions_by_rule: Mapping[str, int]
    canary_runs: int
    failed_spans: int


class RedactStage:
    """Scrubs every field of a :class:`SpanBatch` in place; ``process(batch) -> batch``.

    Args:
        rules: redaction rules (default :class:`RedactionRules()`).
        canaries: exact canary values (see ``load_canaries``/``canaries_from_env``).
        hmac_key: turns on HMAC placeholders (``[REDACTED:jwt:3f9a1c2b]``); 16+ bytes.

    Attributes:
        redactor: the :class:`Redactor` applied to every field (read-only use).

    Raises:
        ConfigError: an invalid canary or HMAC key (field ``redaction``); never echoes a
            canary value.
    """

    name = "redact"

    def __init__(
        self,
        rules: RedactionRules | None = None,
        *,
        canaries: Iterable[str] = (),
        hmac_key: bytes | None = None,
    ) -> None:
        values = tuple(dict.fromkeys(canaries))
        try:
            rules = RedactionRules() if rules is None else rules
            self.redactor = Redactor(
                rules,
                canaries=values,
                canary_matcher=AhoCorasickMatcher.for_canaries(values) if values else None,
                trigger_matcher=AhoCorasickMatcher(rules.triggers),
                hmac_key=hmac_key,
            )
        except ValueError as exc:
            raise ConfigError("redaction", str(exc)) from None
        self._lock = threading.Lock()
        self._spans = 0
        self._canary_runs = 0
        self._failed = 0
        self._by_location = dict.fromkeys(CANARY_LOCATIONS, 0)
        self._by_rule = dict.fromkeys(self.redactor.rule_names, 0)

    def process(self, batch: SpanBatch) -> SpanBatch:
        """Redact ``batch`` in place and return it.

        Blocks for the duration of the scan (CPU only, no I/O). Adds flagged run ids to
        ``batch.canary_run_ids``; refuses (``batch.reject``) spans whose redaction fails.
        """
        hits: dict[str, Hits] = {location: {} for location in CANARY_LOCATIONS}
        shared: dict[int, bool] = {}
        failed: list[int] = []
        flagged: set[str] = set()
        for index, span in enumerate(batch.spans):
            try:
                if self._process_span(span, hits, shared):
                    run_id = span.attributes.get(LW_RUN_ID)
                    flagged.add(run_id if isinstance(run_id, str) and run_id else span.trace_id)
            # Fail closed on a bug: refuse the span rather than store it unredacted. Only
            # the exception type is logged; its message could quote span content.
            except Exception as exc:
                _logger.error("redaction failed on a span (%s); span refused", type(exc).__name__)
                failed.append(index)
        batch.canary_run_ids |= flagged
        if failed:
            dropped = set(failed)
            batch.spans = [s for i, s in enumerate(batch.spans) if i not in dropped]
            batch.reject(len(failed), REDACTION_FAILED)
        with self._lock:
            self._spans += len(batch.spans)
            self._canary_runs += len(flagged)
            self._failed += len(failed)
            for location, counts in hits.items():
                for rule, count in counts.items():
                    self._by_rule[rule] = self._by_rule.get(rule, 0) + count
                    if rule == RULE_CANARY:
                        self._by_location[location] += count
        return batch

    def counts(self) -> RedactionCounts:
        """A consistent snapshot of the cumulative totals."""
        with self._lock:
            return RedactionCounts(
                spans=self._spans,
                canary_by_location=MappingProxyType(dict(self._by_location)),
                redactions_by_rule=MappingProxyType(dict(self._by_rule)),
                canary_runs=self._canary_runs,
                failed_spans=self._failed,
            )

    def _process_span(
        self, span: SpanRecord, hits: dict[str, Hits], shared: dict[int, bool]
    ) -> bool:
        """Scrub one span; return whether it (or its resource or scope) held a canary."""
        r = self.redactor
        attribute, event = hits["attribute"], hits["event"]
        name, status = hits["name"], hits["status"]
        canary = False

        resource = span.resource
        seen = shared.get(id(resource))
        if seen is None:
            counts = hits["resource"]
            before = counts.get(RULE_CANARY, 0)
            resource.attributes = r.scrub_value(resource.attributes, counts)
            resource.schema_url = r.scrub_text(resource.schema_url, counts)
            seen = shared[id(resource)] = counts.get(RULE_CANARY, 0) > before
        canary |= seen

        scope = span.scope
        seen = shared.get(id(scope))
        if seen is None:
            before = attribute.get(RULE_CANARY, 0)
            scope.name = r.scrub_text(scope.name, attribute)
            scope.version = r.scrub_text(scope.version, attribute)
            scope.attributes = r.scrub_value(scope.attributes, attribute)
            seen = shared[id(scope)] = attribute.get(RULE_CANARY, 0) > before
        canary |= seen

        counters = (attribute, event, name, status)
        before = sum(c.get(RULE_CANARY, 0) for c in counters)
        span.name = r.scrub_text(span.name, name)
        span.attributes = r.scrub_value(span.attributes, attribute)
        if span.trace_state:
            span.trace_state = r.scrub_text(span.trace_state, attribute)
        if span.status_message:
            span.status_message = r.scrub_text(span.status_message, status)
        for ev in span.events:
            ev.name = r.scrub_text(ev.name, event)
            if ev.attributes:
                ev.attributes = r.scrub_value(ev.attributes, event)
        for link in span.links:
            if link.attributes:
                link.attributes = r.scrub_value(link.attributes, attribute)
            if link.trace_state:
                link.trace_state = r.scrub_text(link.trace_state, attribute)
        after = sum(c.get(RULE_CANARY, 0) for c in counters)
        return canary or after > before
