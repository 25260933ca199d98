"""The one reader of agent semantics in span attributes (map stage and replay alike)."""

from __future__ import annotations

import pytest
from loopwatch.collector import genai
from loopwatch.collector.records import STATUS_ERROR, Attributes, AttrValue, SpanRecord
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation.budgets import MAX_REPORTED_TOKENS

ROLES: list[tuple[Attributes, int]] = [
    ({sc.GEN_AI_OPERATION_NAME: "invoke_agent"}, genai.ROLE_AGENT),
    ({sc.GEN_AI_OPERATION_NAME: "execute_tool"}, genai.ROLE_TOOL),
    ({sc.GEN_AI_OPERATION_NAME: "chat"}, genai.ROLE_MODEL),
    ({sc.GEN_AI_OPERATION_NAME: "text_completion"}, genai.ROLE_MODEL),
    ({sc.GEN_AI_OPERATION_NAME: "generate_content"}, genai.ROLE_MODEL),
    ({sc.GEN_AI_OPERATION_NAME: "embeddings"}, genai.ROLE_OTHER),
    ({sc.GEN_AI_OPERATION_NAME: {"a": "chat"}}, genai.ROLE_OTHER),  # unhashable: no crash
    ({sc.OPENINFERENCE_SPAN_KIND: "AGENT"}, genai.ROLE_AGENT),
    ({sc.OPENINFERENCE_SPAN_KIND: "tool"}, genai.ROLE_TOOL),
    ({sc.OPENINFERENCE_SPAN_KIND: "Llm"}, genai.ROLE_MODEL),
    ({sc.OPENINFERENCE_SPAN_KIND: "CHAIN"}, genai.ROLE_OTHER),
    ({sc.OPENLLMETRY_REQUEST_TYPE: "completion"}, genai.ROLE_MODEL),
    ({sc.OPENLLMETRY_REQUEST_TYPE: "embedding"}, genai.ROLE_OTHER),
    ({sc.GEN_AI_OPERATION_NAME: "chat", sc.OPENINFERENCE_SPAN_KIND: "TOOL"}, genai.ROLE_MODEL),
    ({}, genai.ROLE_OTHER),
]


@pytest.mark.parametrize(("attrs", "role"), ROLES)
def test_span_role(attrs: Attributes, role: int) -> None:
    assert genai.span_role(attrs) == role


def _span(name: str, attrs: Attributes, status: int = 0) -> SpanRecord:
    return SpanRecord("a" * 32, "b" * 16, "", name, 1, 1, 2, attrs, status)


def test_names_come_from_attributes_then_the_span_name() -> None:
    assert genai.agent_name(_span("invoke_agent triage", {})) == "triage"
    assert genai.agent_name(_span("x", {sc.GEN_AI_AGENT_NAME: "named"})) == "named"
    assert genai.agent_name(_span("", {})) is None
    assert genai.tool_name(_span("execute_tool search", {})) == "search"
    assert genai.tool_name(_span("s", {sc.OPENINFERENCE_TOOL_NAME: "oi"})) == "oi"
    assert genai.tool_name(_span("s", {sc.GEN_AI_TOOL_NAME: "g", "tool.name": "oi"})) == "g"


def test_tool_call_content_and_failure() -> None:
    oi: Attributes = {
        sc.OPENINFERENCE_TOOL_CALL_ID: "t1",
        sc.OPENINFERENCE_INPUT_VALUE: '{"q": 1}',
        sc.OPENINFERENCE_OUTPUT_VALUE: {"hits": 3},
    }
    assert genai.tool_call_id(oi) == "t1"
    assert genai.tool_arguments(oi) == '{"q": 1}'
    assert genai.tool_result(oi) == '{"hits":3}'  # a map reads as compact JSON
    assert genai.tool_call_id({sc.GEN_AI_TOOL_CALL_ID: "g", **oi}) == "g"
    assert not genai.tool_failed(_span("t", {}))
    assert genai.tool_failed(_span("t", {sc.ERROR_TYPE: "Timeout"}))
    assert genai.tool_failed(_span("t", {}, STATUS_ERROR))


def test_tokens_fall_back_and_are_clamped() -> None:
    assert genai.input_tokens({sc.OPENINFERENCE_LLM_TOKEN_COUNT_PROMPT: 12}) == 12
    assert genai.input_tokens({sc.GEN_AI_USAGE_INPUT_TOKENS: 0, "llm.token_count.prompt": 5}) == 0
    assert genai.output_tokens({sc.GEN_AI_USAGE_OUTPUT_TOKENS: -3}) == 0
    assert genai.output_tokens({sc.GEN_AI_USAGE_OUTPUT_TOKENS: 2**62}) == MAX_REPORTED_TOKENS


READERS: list[tuple[AttrValue, str | None, str | None, int | None, float | None, bool | None]] = [
    # value, attr_str, attr_text, attr_int, attr_float, attr_bool
    ("7", "7", "7", 7, 7.0, None),
    ("True", "True", "True", None, None, True),
    (True, "true", "true", None, None, True),
    (3.0, "3.0", "3.0", 3, 3.0, None),
    (2.5, "2.5", "2.5", None, 2.5, None),
    (float("inf"), "inf", "Infinity", None, None, None),
    (2**63, str(2**63), str(2**63), None, float(2**63), None),
    (b"\x00\x01", "0001", "0001", None, None, None),
    ([1, "a"], '[1,"a"]', '[1,"a"]', None, None, None),
    ({"b": 1, "a": 2}, '{"a":2,"b":1}', '{"a":2,"b":1}', None, None, None),
    (None, None, None, None, None, None),
]


@pytest.mark.parametrize(("value", "text", "content", "integer", "number", "flag"), READERS)
def test_attribute_readers_never_raise(
    value: AttrValue,
    text: str | None,
    content: str | None,
    integer: int | None,
    number: float | None,
    flag: bool | None,
) -> None:
    attrs: Attributes = {"k": value}
    assert genai.attr_str(attrs, "k") == text
    assert genai.attr_text(attrs, "k") == content
    assert genai.attr_int(attrs, "k") == integer
    assert genai.attr_float(attrs, "k") == number
    assert genai.attr_bool(attrs, "k") == flag
