"""The collector's redact stage: every field of a batch, canary locations, run flags."""

from __future__ import annotations

import base64
import json
import logging
import operator
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopwatch.collector.errors import ConfigError
from loopwatch.collector.records import (
    AttrValue,
    LinkRecord,
    ResourceRecord,
    ScopeRecord,
    SpanBatch,
    SpanEventRecord,
    SpanRecord,
)
from loopwatch.collector.redact import (
    CANARY_LOCATIONS,
    AhoCorasickMatcher,
    RedactStage,
)
from loopwatch.instrumentation.redaction import (
    RedactionRules,
    Redactor,
    RegexCanaryMatcher,
    canary_forms,
    placeholder,
)

CANARY = "LWCANARY-7f3a9c21-Zq"
CANARY_ODD = 'lw/canary "q" +é&=x'
CANARY_PH = placeholder("canary")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SHA256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"


def make_span(**overrides: object) -> SpanRecord:
    span = SpanRecord(
        trace_id=TRACE_ID,
        span_id="00f067aa0ba902b7",
        parent_span_id="",
        name="execute_tool search_orders",
        kind=1,
        start_unix_nano=1,
        end_unix_nano=2,
        attributes={
            "gen_ai.tool.name": "search_orders",
            "loopwatch.run.id": "run-1",
            "loopwatch.action.fingerprint": SHA256,
        },
    )
    for name, value in overrides.items():
        setattr(span, name, value)
    return span


def _set_resource(span: SpanRecord, value: str) -> None:
    span.resource = ResourceRecord(attributes={"service.name": value})


def _set_scope_name(span: SpanRecord, value: str) -> None:
    span.scope = ScopeRecord(name=value)


def _set_scope_version(span: SpanRecord, value: str) -> None:
    span.scope = ScopeRecord(name="lib", version=value)


def _set_scope_attr(span: SpanRecord, value: str) -> None:
    span.scope = ScopeRecord(name="lib", attributes={"lib.note": value})


def _set_attr(
    key: str, wrap: Callable[[str], AttrValue] = lambda v: v
) -> Callable[[SpanRecord, str], None]:
    def plant(span: SpanRecord, value: str) -> None:
        span.attributes[key] = wrap(value)

    return plant


def _set_event(
    name: str | None = None, key: str | None = None
) -> Callable[[SpanRecord, str], None]:
    def plant(span: SpanRecord, value: str) -> None:
        attributes: dict[str, AttrValue] = {"exception.type": "ValueError"}
        if key is not None:
            attributes[key] = f"Traceback:\n  File 'a.py'\nValueError: bad {value}\n"
        span.events.append(SpanEventRecord(name if name is not None else value, 5, attributes))

    return plant


def _set_link_attr(span: SpanRecord, value: str) -> None:
    span.links.append(LinkRecord(TRACE_ID, "1111111111111111", {"note": value}))


def _set_link_state(span: SpanRecord, value: str) -> None:
    span.links.append(LinkRecord(TRACE_ID, "1111111111111111", trace_state=f"vendor={value}"))


def _set_name(span: SpanRecord, value: str) -> None:
    span.name = f"execute_tool {value}"


def _set_status(span: SpanRecord, value: str) -> None:
    span.status_code, span.status_message = 2, f"failed with {value}"


def _set_trace_state(span: SpanRecord, value: str) -> None:
    span.trace_state = f"lw={value}"


def _json(value: str) -> str:
    return json.dumps({"query": "orders", "headers": {"X-Trace": value}}, indent=1)


# (case id, planting function, expected canary location)
LOCATION_CASES: list[tuple[str, Callable[[SpanRecord, str], None], str]] = [
    ("resource attribute", _set_resource, "resource"),
    ("scope name", _set_scope_name, "attribute"),
    ("scope version", _set_scope_version, "attribute"),
    ("scope attribute", _set_scope_attr, "attribute"),
    ("span name", _set_name, "name"),
    ("span attribute", _set_attr("note"), "attribute"),
    ("attribute key", lambda s, v: s.attributes.__setitem__(f"x.{v}", 1), "attribute"),
    ("array value", _set_attr("tags", lambda v: ["a", v, 3]), "attribute"),
    ("kvlist value", _set_attr("ctx", lambda v: {"inner": {"deeper": [v]}}), "attribute"),
    ("bytes value", _set_attr("blob", lambda v: v.encode()), "attribute"),
    ("invalid utf-8 bytes", _set_attr("blob", lambda v: b"\xff\x80" + v.encode()), "attribute"),
    ("tool arguments json", _set_attr("gen_ai.tool.call.arguments", _json), "attribute"),
    ("tool result json", _set_attr("gen_ai.tool.call.result", _json), "attribute"),
    ("openinference input", _set_attr("input.value", _json), "attribute"),
    ("openinference output", _set_attr("output.value", lambda v: f"answer: {v}"), "attribute"),
    ("under sensitive key", _set_attr("http.request.header.authorization"), "attribute"),
    ("event name", _set_event(), "event"),
    ("exception message", _set_event("exception", "exception.message"), "event"),
    ("exception stacktrace", _set_event("exception", "exception.stacktrace"), "event"),
    ("link attribute", _set_link_attr, "attribute"),
    ("link trace_state", _set_link_state, "attribute"),
    ("trace_state", _set_trace_state, "attribute"),
    ("status message", _set_status, "status"),
]

ENCODINGS: dict[str, Callable[[str], str]] = {
    "raw": lambda c: c,
    "json": lambda c: json.dumps(c)[1:-1],
    "url": lambda c: urllib.parse.quote(c, safe=""),
    "base64": lambda c: base64.b64encode(b"k=" + c.encode()).decode(),
}


def _all_text(value: object) -> Iterator[str]:
    """Every string (and decoded bytes) reachable from a record or attribute value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bytes):
        yield value.decode("latin-1")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _all_text(key)
            yield from _all_text(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _all_text(item)
    elif is_dataclass(value):
        for f in fields(value):
            yield from _all_text(getattr(value, f.name))


def _survivors(batch: SpanBatch, canaries: list[str]) -> list[str]:
    forms = {form for c in canaries for form in canary_forms(c)}
    forms |= {c.encode().decode("latin-1") for c in canaries}
    return [t for span in batch.spans for t in _all_text(span) for f in forms if f in t]


@pytest.mark.parametrize(
    ("plant", "location"), [c[1:] for c in LOCATION_CASES], ids=[c[0] for c in LOCATION_CASES]
)
@pytest.mark.parametrize("encoding", list(ENCODINGS))
@pytest.mark.parametrize("canary", [CANARY, CANARY_ODD], ids=["plain", "odd"])
def test_canary_in_every_location(
    plant: Callable[[SpanRecord, str], None], location: str, encoding: str, canary: str
) -> None:
    stage = RedactStage(canaries=[CANARY, CANARY_ODD])
    span = make_span()
    plant(span, ENCODINGS[encoding](canary))
    batch = stage.process(
        SpanBatch(spans=[span, make_span(attributes={"loopwatch.run.id": "run-2"})])
    )
    assert _survivors(batch, [CANARY, CANARY_ODD]) == []
    assert batch.canary_run_ids == {"run-1"}
    counts = stage.counts()
    assert counts.canary_by_location[location] >= 1
    assert sum(counts.canary_by_location.values()) == counts.canary_by_location[location]
    assert counts.redactions_by_rule["canary"] == counts.canary_by_location[location]
    assert counts.canary_runs == 1 and counts.spans == 2
    assert span.attributes["loopwatch.action.fingerprint"] == SHA256


def test_run_id_falls_back_to_trace_id() -> None:
    stage = RedactStage(canaries=[CANARY])
    span = make_span(attributes={"note": CANARY})
    batch = stage.process(SpanBatch(spans=[span]))
    assert batch.canary_run_ids == {TRACE_ID}
    assert span.attributes == {"note": CANARY_PH}


def test_shared_resource_scanned_once_and_flags_every_run() -> None:
    stage = RedactStage(canaries=[CANARY])
    resource = ResourceRecord(attributes={"host.name": CANARY})
    spans = [
        make_span(resource=resource, attributes={"loopwatch.run.id": f"run-{i}"}) for i in range(3)
    ]
    batch = stage.process(SpanBatch(spans=spans))
    assert batch.canary_run_ids == {"run-0", "run-1", "run-2"}
    assert resource.attributes == {"host.name": CANARY_PH}
    assert stage.counts().canary_by_location["resource"] == 1


def test_secrets_and_keys_counted_by_rule() -> None:
    stage = RedactStage()
    span = make_span()
    span.attributes.update(
        {
            "db.password": "hunter2",
            "http.request.header.authorization": ["Bearer abc"],
            "gen_ai.tool.call.arguments": json.dumps({"aws": AWS_ID, "token_count": 3}),
        }
    )
    span.status_message = "connect postgres://app:pw@db failed"
    batch = stage.process(SpanBatch(spans=[span]))
    assert span.attributes["db.password"] == placeholder("sensitive_key")
    assert span.attributes["http.request.header.authorization"] == placeholder("sensitive_key")
    assert json.loads(str(span.attributes["gen_ai.tool.call.arguments"])) == {
        "aws": placeholder("aws_access_key"),
        "token_count": 3,
    }
    assert span.status_message == f"connect postgres://app:{placeholder('url_password')}@db failed"
    counts = stage.counts()
    assert counts.redactions_by_rule["sensitive_key"] == 2
    assert counts.redactions_by_rule["aws_access_key"] == 1
    assert counts.redactions_by_rule["url_password"] == 1
    assert set(counts.canary_by_location) == set(CANARY_LOCATIONS)
    assert batch.canary_run_ids == set()


def test_counts_are_snapshots_and_thread_safe() -> None:
    stage = RedactStage(canaries=[CANARY])

    def work() -> None:
        for _ in range(50):
            stage.process(SpanBatch(spans=[make_span(name=f"x {CANARY}") for _ in range(4)]))

    threads = [threading.Thread(target=work) for _ in range(4)]
    snapshot = stage.counts()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = stage.counts()
    assert counts.spans == 800 and counts.canary_by_location["name"] == 800
    assert counts.canary_runs == 200, "one flag per batch: the four spans share a run"
    assert snapshot.spans == 0 or snapshot.spans < counts.spans
    with pytest.raises(TypeError):
        operator.setitem(counts.redactions_by_rule, "canary", 0)


class _ExplodingMatcher:
    def find_spans(self, text: str) -> list[tuple[int, int]]:
        if "boom" in text:
            raise RuntimeError(f"matcher failed on {text}")
        return []


def test_fails_closed_without_echoing_content(caplog: pytest.LogCaptureFixture) -> None:
    stage = RedactStage()
    stage.redactor = Redactor(canary_matcher=_ExplodingMatcher())
    bad = make_span(attributes={"note": f"boom {CANARY}"})
    good = make_span()
    with caplog.at_level(logging.ERROR):
        batch = stage.process(SpanBatch(spans=[bad, good]))
    assert batch.spans == [good]
    assert batch.rejected_spans == 1 and batch.rejection_messages == ["redaction failed"]
    assert stage.counts().failed_spans == 1
    assert "RuntimeError" in caplog.text and CANARY not in caplog.text and "boom" not in caplog.text


def test_invalid_canary_is_a_config_error_without_the_value() -> None:
    with pytest.raises(ConfigError) as info:
        RedactStage(canaries=[CANARY, "tiny1"])
    assert info.value.field == "redaction"
    assert "tiny1" not in str(info.value)


def test_hmac_mode() -> None:
    stage = RedactStage(canaries=[CANARY], hmac_key=b"s" * 32)
    span = make_span(attributes={"a": AWS_ID, "b": f"again {AWS_ID}"})
    stage.process(SpanBatch(spans=[span]))
    tag_a = str(span.attributes["a"])
    assert tag_a.startswith("[REDACTED:aws_access_key:") and tag_a in str(span.attributes["b"])


# Aho-Corasick and the stdlib matcher agree.


def _covered(spans: list[tuple[int, int]]) -> set[int]:
    return {i for a, b in spans for i in range(a, b)}


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(max_size=10), st.sampled_from(sorted(canary_forms(CANARY_ODD)))),
        max_size=6,
    )
)
def test_aho_corasick_matches_regex_matcher(parts: list[str]) -> None:
    text = "".join(parts)
    forms = canary_forms(CANARY_ODD) | canary_forms(CANARY)
    ac, rx = AhoCorasickMatcher(forms), RegexCanaryMatcher(forms)
    assert _covered(ac.find_spans(text)) == _covered(rx.find_spans(text))


def test_aho_corasick_offsets_with_astral_characters() -> None:
    matcher = AhoCorasickMatcher.for_canaries([CANARY])
    text = "😀🎉 " + CANARY + " ✓"
    [(start, end)] = matcher.find_spans(text)
    assert text[start:end] == CANARY


def test_trigger_matcher_gives_the_same_result_as_the_stdlib_gate() -> None:
    rules = RedactionRules()
    fast = Redactor(rules, trigger_matcher=AhoCorasickMatcher(rules.triggers))
    slow = Redactor(rules)
    for text in ("Authorization: Bearer 12345678901234567890", AWS_ID, "x=1", "PASSWORD=x", SHA256):
        assert fast.redact_text(text) == slow.redact_text(text)


# Law: no canary survives in any field of generated spans.

values = st.recursive(
    st.one_of(st.text(max_size=20), st.integers(), st.booleans(), st.binary(max_size=10)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
attributes = st.dictionaries(st.text(min_size=1, max_size=12), values, max_size=6)


@st.composite
def planted_spans(draw: st.DrawFn) -> tuple[SpanBatch, set[str]]:
    spans, planted_runs = [], set()
    resource = ResourceRecord(attributes=draw(attributes))
    for index in range(draw(st.integers(1, 4))):
        run_id = f"run-{index}"
        span = make_span(
            name=draw(st.text(max_size=20)),
            attributes={**draw(attributes), "loopwatch.run.id": run_id},
            resource=resource,
            scope=ScopeRecord(name=draw(st.text(max_size=10)), attributes=draw(attributes)),
            events=[SpanEventRecord(draw(st.text(max_size=10)), 1, draw(attributes))],
            links=[LinkRecord(TRACE_ID, "1111111111111111", draw(attributes))],
            status_message=draw(st.text(max_size=20)),
        )
        spans.append(span)
        for _ in range(draw(st.integers(0, 2))):
            canary = draw(st.sampled_from([CANARY, CANARY_ODD]))
            encoded = ENCODINGS[draw(st.sampled_from(sorted(ENCODINGS)))](canary)
            where = draw(st.sampled_from([c[1] for c in LOCATION_CASES]))
            text = draw(st.text(max_size=5)) + encoded + draw(st.text(max_size=5))
            where(span, text)
            planted_runs.add(run_id)
            if where is _set_resource:
                resource = span.resource
    return SpanBatch(spans=spans), planted_runs


@settings(
    derandomize=True,
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(planted_spans())
def test_law_no_canary_survives_in_any_field(case: tuple[SpanBatch, set[str]]) -> None:
    batch, planted_runs = case
    stage = RedactStage(canaries=[CANARY, CANARY_ODD])
    stage.process(batch)
    assert _survivors(batch, [CANARY, CANARY_ODD]) == []
    assert planted_runs <= batch.canary_run_ids
    again = RedactStage(canaries=[CANARY, CANARY_ODD])
    before = [repr(s) for s in batch.spans]
    again.process(batch)
    assert [repr(s) for s in batch.spans] == before, "redacting twice equals once"
    assert sum(again.counts().redactions_by_rule.values()) == 0


# Hostile batches: no crash, no hang.


@pytest.mark.timeout(120)
def test_hostile_batches_terminate() -> None:
    stage = RedactStage(canaries=[CANARY])
    deep: AttrValue = CANARY
    for _ in range(2_000):
        deep = {"k": [deep]}
    wide = {f"attr.{i}": f"value {i}" for i in range(100_000)}
    spans = [
        make_span(attributes=wide),
        make_span(attributes={"deep": deep}),
        make_span(attributes={"json": "[" * 100_000 + "]" * 100_000}),
        make_span(attributes={"blob": bytes(range(256)) * 4_000 + CANARY.encode()}),
        make_span(name="sk-" * 200_000, status_message="a" * 2_000_000),
        make_span(
            attributes={"nested": json.dumps({"a": json.dumps({"b": json.dumps([CANARY])})})}
        ),
    ]
    start = time.monotonic()
    batch = stage.process(SpanBatch(spans=spans))
    assert time.monotonic() - start < 60
    assert len(batch.spans) == 6 and batch.rejected_spans == 0
    assert _survivors(batch, [CANARY]) == []


def test_canaries_hidden_by_json_tricks_are_counted_and_flag_the_run() -> None:
    # Helper review 2026-12-02: duplicate JSON keys, \u escapes of letters (in JSON text
    # and in plain text), JavaScript URL-encoding; each planted once, each counted once.
    odd = "lw canary!(x)*'<7f"
    stage = RedactStage(canaries=[CANARY, odd])
    letters = "".join(f"\\u{ord(c):04x}" if c.isalpha() else c for c in CANARY)
    span = make_span(
        name=f"tool {letters}",
        attributes={
            "loopwatch.run.id": "run-j",
            "gen_ai.tool.call.arguments": f'{{"q":"{letters}","q":"ok"}}',
            "url": "https://h/?q=" + urllib.parse.quote(odd, safe="-_.!~*'()"),
        },
    )
    batch = stage.process(SpanBatch(spans=[span]))
    assert batch.canary_run_ids == {"run-j"}
    assert letters not in span.name and letters not in repr(span.attributes)
    assert json.loads(span.attributes["gen_ai.tool.call.arguments"]) == {"q": "ok"}
    assert "!(x)*" not in span.attributes["url"]
    counts = stage.counts().canary_by_location
    assert (counts["attribute"], counts["name"]) == (2, 1)
