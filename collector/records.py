"""Typed span records: what the decode stage produces and every later stage reads.

OTLP is decoded once into these records (STYLE rule 6); no later stage touches protobuf
or OTLP/JSON. Ids are lowercase hex strings (trace id: 32 chars, span id: 16 chars);
times are integers in nanoseconds since the Unix epoch, as in OTLP.

Attribute values keep the OTLP ``AnyValue`` shapes as Python values:
``str | bool | int | float | bytes | list[AttrValue] | dict[str, AttrValue]`` (a
``kvlist_value`` becomes a ``dict``), so the redact stage can walk every place a secret can
hide: resource, scope, span, event and link attributes, span names, status messages.

Records are mutable on purpose: a batch is freshly decoded per request and each stage
transforms it in place and returns it (``process(batch) -> batch``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

AttrValue = str | bool | int | float | bytes | list["AttrValue"] | dict[str, "AttrValue"] | None
Attributes = dict[str, AttrValue]

SPAN_KIND_UNSPECIFIED = 0
SPAN_KIND_INTERNAL = 1
SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
SPAN_KIND_PRODUCER = 4
SPAN_KIND_CONSUMER = 5

_C = TypeVar("_C", bound=type)


def pickled_as_tuple(cls: _C) -> _C:
    """Class decorator: pickle a ``slots`` dataclass as ``(cls, field values)``.

    A ``slots=True`` dataclass otherwise pickles through the ``__getstate__`` and
    ``__setstate__`` that :mod:`dataclasses` writes in Python, once per object. Decode
    workers hand every record of a batch to the serving process by pickle, and that
    hand-off cost about as much as decoding the batch (9.4 us/span to pickle and 9.7 to
    unpickle a 512-span batch, against 3.7 and 3.6 this way; measured here with
    ``multiprocessing``'s pickler). Unpickling calls the class with every field
    positionally, so every field must be an ``__init__`` argument.

    Raises:
        TypeError: ``cls`` is not a dataclass, or has a field that ``__init__`` skips.
    """
    names = tuple(f.name for f in fields(cls))
    if len(names) < 2 or not all(f.init for f in fields(cls)):
        raise TypeError(f"{cls.__name__}: needs two or more fields, all __init__ arguments")
    values: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)

    def __reduce__(self: Any) -> tuple[type, tuple[Any, ...]]:
        return cls, values(self)

    cls.__reduce__ = __reduce__  # type: ignore[assignment]
    return cls


STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2


@pickled_as_tuple
@dataclass(slots=True)
class ResourceRecord:
    """One OTLP ``Resource``; shared by every span of its ``ResourceSpans``."""

    attributes: Attributes = field(default_factory=dict)
    schema_url: str = ""


@pickled_as_tuple
@dataclass(slots=True)
class ScopeRecord:
    """One OTLP ``InstrumentationScope``; shared by every span of its ``ScopeSpans``."""

    name: str = ""
    version: str = ""
    attributes: Attributes = field(default_factory=dict)


@pickled_as_tuple
@dataclass(slots=True)
class SpanEventRecord:
    """A span event (``exception`` events carry ``exception.message`` and ``.stacktrace``)."""

    name: str
    time_unix_nano: int
    attributes: Attributes = field(default_factory=dict)


@pickled_as_tuple
@dataclass(slots=True)
class LinkRecord:
    """A span link; ids are lowercase hex."""

    trace_id: str
    span_id: str
    attributes: Attributes = field(default_factory=dict)
    trace_state: str = ""


@pickled_as_tuple
@dataclass(slots=True)
class SpanRecord:
    """One decoded span.

    Attributes:
        trace_id: 32 lowercase hex chars (16 bytes).
        span_id: 16 lowercase hex chars (8 bytes).
        parent_span_id: 16 lowercase hex chars, or ``""`` for a root span.
        name: span name (may hold a secret: the redact stage scrubs it).
        kind: OTLP ``SpanKind`` number (``SPAN_KIND_*``).
        start_unix_nano / end_unix_nano: nanoseconds since the Unix epoch.
        attributes: span attributes.
        status_code: ``STATUS_UNSET``, ``STATUS_OK`` or ``STATUS_ERROR``.
        status_message: status description.
        events / links: span events and links.
        resource / scope: shared records of the enclosing ``ResourceSpans`` / ``ScopeSpans``.
        flags: OTLP span flags; ``trace_state``: W3C tracestate.
    """

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_unix_nano: int
    end_unix_nano: int
    attributes: Attributes
    status_code: int = STATUS_UNSET
    status_message: str = ""
    events: list[SpanEventRecord] = field(default_factory=list)
    links: list[LinkRecord] = field(default_factory=list)
    resource: ResourceRecord = field(default_factory=ResourceRecord)
    scope: ScopeRecord = field(default_factory=ScopeRecord)
    flags: int = 0
    trace_state: str = ""


@dataclass(slots=True)
class SpanBatch:
    """The spans of one OTLP export request, plus what the pipeline refused of it.

    Attributes:
        spans: accepted spans, in request order.
        transport: ``"http_protobuf"``, ``"http_json"`` or ``"grpc"`` (a metric label).
        rejected_spans: spans refused so far (reported in ``partial_success``).
        rejection_messages: short human-readable reasons, never containing span content.
        canary_run_ids: run ids (``loopwatch.run.id`` or trace id) flagged ``canary_detected``.
    """

    spans: list[SpanRecord]
    transport: str = "http_protobuf"
    rejected_spans: int = 0
    rejection_messages: list[str] = field(default_factory=list)
    canary_run_ids: set[str] = field(default_factory=set)

    def accepted_spans(self) -> int:
        """Spans accepted so far (``len(spans)``; a batch that carries its spans in
        another shape, e.g. already mapped by a decode worker, counts those)."""
        return len(self.spans)

    def reject(self, count: int, message: str) -> None:
        """Record ``count`` refused spans with a reason (content-free)."""
        self.rejected_spans += count
        if message not in self.rejection_messages:
            self.rejection_messages.append(message)
