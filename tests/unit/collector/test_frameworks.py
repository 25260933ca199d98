"""The per-framework reading rules (collector/frameworks.py), as tables of the span
shapes issue 25 quotes and the recorded fixtures show."""

from __future__ import annotations

import json

import pytest
from loopwatch.collector.frameworks import (
    agent_label,
    is_graph_node,
    name_hint,
    strip_method,
    unwrap_arguments,
    unwrap_result,
)
from loopwatch.collector.genai import ROLE_AGENT, ROLE_MODEL, ROLE_OTHER, span_role
from loopwatch.instrumentation import _semconv as sc

OI_AGENT = {sc.OPENINFERENCE_SPAN_KIND: "AGENT"}


def _j(value: object) -> str:
    return json.dumps(value)


@pytest.mark.parametrize(
    ("raw", "unwrapped"),
    [
        # OpenLLMetry's LangChain callback envelope: inputs, without its bookkeeping.
        (
            _j(
                {
                    "input_str": "{'order_id': 'A-1'}",
                    "tags": None,
                    "metadata": {"langgraph_step": 2, "checkpoint_ns": "tools:9f1c"},
                    "inputs": {"order_id": "A-1"},
                    "kwargs": {"tool_call_id": "call_3"},
                }
            ),
            '{"order_id":"A-1"}',
        ),
        # ... whose inputs are empty: the input string, parsed when it is JSON.
        (_j({"input_str": '{"q": 1}', "inputs": {}, "metadata": {}}), '{"q":1}'),
        # A LangChain ToolCall dict: its args.
        (
            _j(
                {
                    "name": "lookup_order",
                    "args": {"order_id": "A-1"},
                    "id": "c",
                    "type": "tool_call",
                }
            ),
            '{"order_id":"A-1"}',
        ),
        # A Python call record with no positional argument: its keyword arguments
        # (OpenInference's smolagents and LlamaIndex tool inputs).
        (
            _j({"args": [], "sanitize_inputs_outputs": True, "kwargs": {"order_id": "A-1"}}),
            '{"order_id":"A-1"}',
        ),
        (_j({"kwargs": {"cursor": 2}}), '{"cursor":2}'),
        # ... but one with positional arguments is kept whole: they are the call too.
        (
            _j({"args": ["A-1"], "kwargs": {}}),
            _j({"args": ["A-1"], "kwargs": {}}),
        ),
        # Call ids and checkpoint namespaces at the top level are dropped.
        (_j({"order_id": "A-1", "tool_call_id": "call_7"}), '{"order_id":"A-1"}'),
        # Plain arguments stay exactly as received.
        ('{"order_id": "A-1"}', '{"order_id": "A-1"}'),
        ("not json {", "not json {"),
        (None, None),
    ],
)
def test_arguments_envelopes(raw: str | None, unwrapped: str | None) -> None:
    assert unwrap_arguments(raw) == unwrapped


TOOL_MESSAGE = {
    "type": "tool",
    "data": {"content": '{"status": "shipped"}', "tool_call_id": "call_3", "id": "m1"},
}
LC_MESSAGE = {
    "lc": 1,
    "type": "constructor",
    "id": ["langchain", "schema", "messages", "ToolMessage"],
    "kwargs": {"content": '{"status": "shipped"}', "tool_call_id": "call_4"},
}


@pytest.mark.parametrize(
    ("raw", "unwrapped"),
    [
        (_j(TOOL_MESSAGE), '{"status": "shipped"}'),
        (_j(LC_MESSAGE), '{"status": "shipped"}'),
        # OpenLLMetry: {"output": <the message>, "kwargs": ...} -> output.kwargs.content.
        (_j({"output": LC_MESSAGE, "kwargs": {"tags": []}}), '{"status": "shipped"}'),
        (_j({"status": "shipped", "metadata": {"checkpoint_ns": "x"}}), '{"status":"shipped"}'),
        ('{"status": "shipped"}', '{"status": "shipped"}'),
    ],
)
def test_result_envelopes(raw: str, unwrapped: str) -> None:
    assert unwrap_result(raw) == unwrapped


def test_two_calls_differing_only_in_call_ids_unwrap_the_same() -> None:
    def call(n: int) -> tuple[str | None, str | None]:
        args = {"inputs": {"order_id": "A-1"}, "metadata": {"checkpoint_ns": f"tools:{n}"}}
        message = {**TOOL_MESSAGE, "data": {**TOOL_MESSAGE["data"], "tool_call_id": f"c{n}"}}
        return unwrap_arguments(_j(args)), unwrap_result(_j(message))

    assert call(1) == call(2)


@pytest.mark.parametrize(
    ("attrs", "graph_node"),
    [
        ({**OI_AGENT, sc.OPENINFERENCE_METADATA: _j({"langgraph_node": "agent"})}, True),
        ({**OI_AGENT, sc.OPENINFERENCE_METADATA: _j({"note": "langgraph_node"})}, False),
        ({**OI_AGENT, sc.OPENINFERENCE_METADATA: "langgraph_node{"}, False),
        (OI_AGENT, False),
    ],
)
def test_langgraph_nodes_are_not_agents(attrs: dict[str, str], graph_node: bool) -> None:
    assert is_graph_node(attrs) is graph_node
    assert span_role(attrs) == (ROLE_OTHER if graph_node else ROLE_AGENT)


def test_create_agent_is_no_agent_and_llamaindex_request_preparation_no_turn() -> None:
    assert span_role({sc.GEN_AI_OPERATION_NAME: "create_agent"}) == ROLE_OTHER
    llm = {sc.OPENINFERENCE_SPAN_KIND: "LLM"}
    assert span_role(llm, "MockLLM._prepare_chat_with_tools") == ROLE_OTHER
    assert span_role(llm, "MockLLM.astream_chat") == ROLE_MODEL


@pytest.mark.parametrize(
    ("name", "attrs", "agent"),
    [
        ("invoke_agent support_bot", {sc.GEN_AI_AGENT_NAME: "support_bot"}, "support_bot"),
        ("Agent workflow", {sc.OPENINFERENCE_AGENT_NAME: "support_bot"}, "support_bot"),
        ("support_bot.on_messages_stream", {sc.OPENINFERENCE_GRAPH_NODE_ID: "sb"}, "sb"),
        ("Where is order A-1?.task", {sc.CREWAI_AGENT_ROLE: "support_bot"}, "support_bot"),
        ("smol_support.run", OI_AGENT, "smol_support"),
        ("ToolCallingAgent.run", OI_AGENT, "ToolCallingAgent"),
        ("invoke_agent triage", {}, "triage"),
        ("v1.2", {}, "v1.2"),
        ("", {}, None),
    ],
)
def test_the_agents_real_name(name: str, attrs: dict[str, str], agent: str | None) -> None:
    assert agent_label(name, attrs) == agent


def test_strip_method_keeps_names_that_end_in_no_method() -> None:
    assert strip_method("support.v2") == "support.v2"
    assert strip_method(".run") == ".run"


@pytest.mark.parametrize(
    ("name", "value", "hint"),
    [
        ("BaseWorkflowAgent.setup_agent", "AgentInput(input=[], current_agent_name='sb')", "sb"),
        ("BaseWorkflowAgent.task", _j({"current_agent_name": "sb"}), "sb"),
        ("OtherSpan.task", _j({"current_agent_name": "sb"}), None),
        ("BaseWorkflowAgent.task", "{}", None),
    ],
)
def test_llamaindex_writes_its_agent_name_on_its_workflow_spans(
    name: str, value: str, hint: str | None
) -> None:
    assert name_hint(name, {sc.OPENLLMETRY_ENTITY_OUTPUT: value}) == hint
    assert name_hint(name, {sc.OPENINFERENCE_OUTPUT_VALUE: value}) == hint
