"""Regression: a canary broken by line breaks (MIME-wrapped base64) is still found.

Rule (``instrumentation/redaction/_canaries.py``, ``find_canaries``): line breaks (CR, LF,
CRLF and their JSON escapes ``\\r`` ``\\n``) and the spaces and tabs after them are ignored
when matching canary forms, so base64 wrapped at 76 (MIME, RFC 2045; ``base64``) or 64
(PEM, RFC 7468) characters per line, indented or folded text, and a canary split across
lines are all caught; the placeholder covers the breaks inside the match. Before the
fix, the base64 of a canary whose 76-character line ended inside it passed unredacted.
"""

from __future__ import annotations

import base64

import pytest
from loopwatch.collector.records import ResourceRecord, ScopeRecord, SpanBatch, SpanRecord
from loopwatch.collector.redact import RedactStage
from loopwatch.instrumentation.redaction import Redactor, canary_forms

CANARY = 'lw-canary/7f3a"9c21+\u00e9z'


def wrapped(width: int, separator: str, shift: int) -> str:
    data = base64.b64encode(b"p" * (40 + shift) + CANARY.encode() + b"q" * 60).decode()
    return separator.join(data[i : i + width] for i in range(0, len(data), width))


CASES = [
    (width, separator, shift)
    for width in (76, 64, 57, 4)
    for separator in ("\n", "\r\n", "\r", "\\n", "\\r\\n", "\n    ", "\n\t")
    for shift in range(3)
]


@pytest.mark.parametrize(("width", "separator", "shift"), CASES)
def test_wrapped_base64_canary_is_redacted(width: int, separator: str, shift: int) -> None:
    text = wrapped(width, separator, shift)
    for redactor in (
        Redactor(canaries=[CANARY]),
        RedactStage(canaries=[CANARY]).redactor,  # the collector's Aho-Corasick matcher
    ):
        out, hits = redactor.redact_text(text)
        assert hits == {"canary": 1}, (width, repr(separator), shift, hits)
        assert "[REDACTED:canary]" in out
        folded = out.replace("\\r", "").replace("\\n", "").replace("\r", "").replace("\n", "")
        assert not any(form in folded for form in canary_forms(CANARY))


def test_a_canary_split_across_lines_and_clean_text_with_breaks() -> None:
    redactor = RedactStage(canaries=[CANARY]).redactor
    out, hits = redactor.redact_text(f"start {CANARY[:9]}\n  {CANARY[9:]} end\nnext line")
    assert hits == {"canary": 1} and out == "start [REDACTED:canary] end\nnext line"
    text = "line one\nline two\r\n\tindented\\nescaped"
    assert redactor.redact_text(text) == (text, {})


def test_wrapped_canary_in_every_span_field_is_counted() -> None:
    stage = RedactStage(canaries=[CANARY])
    value = wrapped(76, "\n", 1)
    span = SpanRecord(
        "1" * 32,
        "2" * 16,
        "",
        value,
        1,
        0,
        0,
        {"cert": value, "nested": {"pem": [value]}},
        2,
        value,
        [],
        [],
        ResourceRecord({"r": value}, ""),
        ScopeRecord("s", "1", {}),
    )
    stage.process(SpanBatch(spans=[span], transport="http_protobuf"))
    counts = stage.counts().canary_by_location
    assert dict(counts) == {"attribute": 2, "event": 0, "name": 1, "status": 1, "resource": 1}
