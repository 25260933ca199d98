"""What agent frameworks' tracers put on their spans, read the way loopwatch means it.

:mod:`loopwatch.collector.genai` reads the conventions (GenAI semconv, OpenInference,
OpenLLMetry); this module holds the per-framework rules on top of them, each taken from
the spans the frameworks really emit (``tests/testdata/frameworks/*.json``, recorded by
``scripts/record_framework_spans.py``):

- **Graph nodes are not agents.** OpenInference's LangChain instrumentation marks a
  LangGraph node named ``agent`` (the model node of ``create_react_agent``) as an
  ``AGENT`` span; its ``metadata`` attribute (JSON) carries ``langgraph_node``. Such a
  span is a step of a graph, not an agent invocation (:func:`is_graph_node`).
- **Not a model call** (:func:`is_model_preparation`): OpenInference's LlamaIndex
  instrumentation emits an ``LLM`` span for ``<llm>._prepare_chat_with_tools`` beside the
  real call (``<llm>.astream_chat``) in every turn; it builds the request, it is no turn.
- **An answer is not a tool call** (:func:`is_final_answer`): smolagents answers
  through its own ``final_answer`` tool, which OpenInference traces as a ``TOOL`` span
  (``FinalAnswerTool``, ``tool.name=final_answer``). It is the run's final decision, not
  an action: counted as a call, every smolagents run would show one call too many.
- **The agent's name** (:func:`agent_label`): ``gen_ai.agent.name``, else OpenInference
  ``agent.name``, else ``graph.node.id`` (OpenAI Agents, AutoGen and CrewAI agent
  spans), else CrewAI's ``crewai.agent.role`` (OpenLLMetry), else
  the span name without the ``invoke_agent`` prefix and without a method suffix: the
  OpenInference smolagents, AutoGen and LlamaIndex span names are ``<agent or class
  name>.<method>`` (``smol_support.run``, ``support.on_messages_stream``), and the method
  (:data:`METHOD_SUFFIXES`) is not the agent. A trace whose run has no agent span
  (LlamaIndex workflow agents: every span is a ``CHAIN``) takes the name the framework
  wrote elsewhere (:func:`name_hint`: LlamaIndex's ``current_agent_name`` in the
  ``AgentInput`` its ``BaseWorkflowAgent.*`` spans carry as input or output, as a repr
  under OpenInference and as JSON under OpenLLMetry).
- **Content envelopes** (:func:`unwrap_arguments`, :func:`unwrap_result`): tracers that
  serialize a framework's callback payload put the call's identity and bookkeeping next
  to the content, so every call would look new (a new ``tool_call_id``, a new checkpoint
  namespace) or every result new (a serialized ``ToolMessage`` carries its call id).
  Unwrapped before fingerprinting:

  - OpenLLMetry's LangChain callback envelope on arguments,
    ``{"input_str": ..., "tags": ..., "metadata": ..., "inputs": {...}, "kwargs": ...}``
    -> ``inputs`` (``input_str`` when ``inputs`` is empty); on results
    ``{"output": ..., "kwargs": ...}`` -> ``output``;
  - a LangChain message: ``{"type": "tool", "data": {"content": ...}}`` (``dumpd``
    form) or ``{"lc": 1, "type": "constructor", "kwargs": {"content": ...}}``
    (``output.kwargs.content``) -> ``content``;
  - a Python call record with no positional argument (OpenInference's smolagents and
    LlamaIndex tool inputs, ``{"args": [], "kwargs": {...}}``) -> ``kwargs``;
  - a LangChain ``ToolCall`` dict ``{"name", "args", "id", "type": "tool_call"}`` ->
    ``args``;
  - then, at the top level of what is left, call ids (``tool_call_id``, ``call_id``),
    ``metadata`` and checkpoint namespaces (``checkpoint_ns``,
    ``langgraph_checkpoint_ns``) are dropped.

  Text that is not JSON, or JSON in none of these shapes, is returned as received.

Pure functions over decoded attributes; they never raise on odd values.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from loopwatch.instrumentation import _semconv as sc

from .records import Attributes

__all__ = [
    "DROPPED_KEYS",
    "METHOD_SUFFIXES",
    "agent_label",
    "is_final_answer",
    "is_graph_node",
    "is_model_preparation",
    "name_hint",
    "named_agent",
    "strip_method",
    "unwrap_arguments",
    "unwrap_result",
]

METHOD_SUFFIXES: Final = frozenset(
    {
        "run",
        "arun",
        "run_sync",
        "run_stream",
        "invoke",
        "ainvoke",
        "stream",
        "astream",
        "on_messages",
        "on_messages_stream",
        "kickoff",
        "execute_task",
    }
)
"""Method names that end a span name made of ``<agent>.<method>`` (OpenInference
smolagents ``.run``, AutoGen ``.on_messages_stream``, LlamaIndex ``.run``/``.arun``)."""

DROPPED_KEYS: Final = frozenset(
    {"tool_call_id", "call_id", "metadata", "checkpoint_ns", "langgraph_checkpoint_ns"}
)
"""Top-level keys dropped from unwrapped arguments and results: a call's identity and
the framework's bookkeeping, new on every call, never what the call did."""

_NAME_KEYS: Final = (
    sc.GEN_AI_AGENT_NAME,
    sc.OPENINFERENCE_AGENT_NAME,
    sc.OPENINFERENCE_GRAPH_NODE_ID,
    sc.CREWAI_AGENT_ROLE,
)
_PREPARATION_SUFFIX: Final = "._prepare_chat_with_tools"
_LLAMAINDEX_AGENT_SPAN: Final = "BaseWorkflowAgent."
# The AgentInput repr (OpenInference) or its JSON (OpenLLMetry), escaped or not.
_LLAMAINDEX_AGENT_NAME: Final = re.compile(
    r"current_agent_name(?:='|\\?\"\s*:\s*\\?\")([^'\"\\]{1,200})"
)
_HINT_KEYS: Final = (
    sc.OPENINFERENCE_INPUT_VALUE,
    sc.OPENINFERENCE_OUTPUT_VALUE,
    sc.OPENLLMETRY_ENTITY_INPUT,
    sc.OPENLLMETRY_ENTITY_OUTPUT,
)
_RUN_PREFIX: Final = sc.SPAN_RUN.split("{", 1)[0]
_CALLBACK_KEYS: Final = frozenset({"input_str", "tags", "metadata", "inputs", "kwargs"})
_CALL_KEYS: Final = frozenset({"args", "kwargs", "sanitize_inputs_outputs"})
"""A Python call recorded as its positional and keyword arguments: OpenInference's
smolagents (``{"args": [], "sanitize_inputs_outputs": true, "kwargs": {...}}``) and
LlamaIndex (``{"kwargs": {...}}``) tool spans. With no positional argument it is the
keyword arguments."""
_OUTPUT_KEYS: Final = frozenset({"output", "kwargs"})
_MAX_UNWRAP_CHARS: Final = 1_000_000


def is_graph_node(attrs: Attributes) -> bool:
    """Whether an agent-looking span is a node of a LangGraph graph (its OpenInference
    ``metadata`` JSON names a ``langgraph_node``)."""
    metadata = attrs.get(sc.OPENINFERENCE_METADATA)
    if isinstance(metadata, str):
        if sc.LANGGRAPH_NODE not in metadata:
            return False
        parsed = _loads(metadata)
        return isinstance(parsed, dict) and sc.LANGGRAPH_NODE in parsed
    return isinstance(metadata, dict) and sc.LANGGRAPH_NODE in metadata


def is_final_answer(name: str, attrs: Attributes) -> bool:
    """Whether a tool span is smolagents' answer tool (module docstring)."""
    return name == "FinalAnswerTool" and attrs.get(sc.OPENINFERENCE_TOOL_NAME) == "final_answer"


def is_model_preparation(name: str) -> bool:
    """Whether a model-call span only prepares the request (module docstring)."""
    return name.endswith(_PREPARATION_SUFFIX)


def name_hint(name: str, attrs: Attributes) -> str | None:
    """The agent name a framework wrote on a span that is not the agent's own (module
    docstring); ``None`` for other spans. Looks at LlamaIndex agent spans only."""
    if not name.startswith(_LLAMAINDEX_AGENT_SPAN):
        return None
    for key in _HINT_KEYS:
        value = attrs.get(key)
        if isinstance(value, str):
            found = _LLAMAINDEX_AGENT_NAME.search(value)
            if found:
                return found.group(1)
    return None


def named_agent(attrs: Attributes) -> str | None:
    """The agent an attribute names (:data:`_NAME_KEYS`, first found); ``None``."""
    for key in _NAME_KEYS:
        value = attrs.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def strip_method(name: str) -> str:
    """``"smol_support"`` for ``"smol_support.run"``: a span name without a trailing
    ``.<method>`` of :data:`METHOD_SUFFIXES`; other names as they are."""
    head, dot, tail = name.rpartition(".")
    return head if dot and head and tail in METHOD_SUFFIXES else name


def agent_label(name: str, attrs: Attributes) -> str | None:
    """The agent a span names (module docstring, "The agent's name"); ``None`` when
    nothing names one."""
    named = named_agent(attrs)
    if named is not None:
        return named
    subject = name[len(_RUN_PREFIX) :] if name.startswith(_RUN_PREFIX) else name
    return strip_method(subject.strip()) or None


def unwrap_arguments(text: str | None) -> str | None:
    """A tool call's arguments without a known envelope (module docstring)."""
    return _unwrap(text, arguments=True)


def unwrap_result(text: str | None) -> str | None:
    """A tool call's result without a known envelope (module docstring)."""
    return _unwrap(text, arguments=False)


def _unwrap(text: str | None, *, arguments: bool) -> str | None:
    if text is None or len(text) > _MAX_UNWRAP_CHARS or not text.lstrip().startswith("{"):
        return text
    value = _loads(text)
    if not isinstance(value, dict):
        return text
    inner = _peel(value, arguments=arguments)
    if inner is value:
        return text  # nothing to unwrap: keep the text exactly as received
    if isinstance(inner, str):
        return inner
    return json.dumps(inner, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _peel(value: Any, *, arguments: bool) -> Any:
    """Remove envelopes until none is left (bounded: each pass removes one level)."""
    for _ in range(8):
        if not isinstance(value, dict):
            return value
        keys = value.keys()
        if arguments and "inputs" in keys and keys <= _CALLBACK_KEYS:
            inputs = value.get("inputs")
            value = inputs if inputs else _loads_or_text(value.get("input_str"))
        elif not arguments and "output" in keys and keys <= _OUTPUT_KEYS:
            value = value["output"]
        elif arguments and "kwargs" in keys and keys <= _CALL_KEYS and not value.get("args"):
            value = value["kwargs"]  # a Python call record: f(**kwargs)
        elif value.get("type") == "tool_call" and "args" in keys:
            value = value["args"]
        elif value.get("type") == "tool" and isinstance(value.get("data"), dict):
            value = value["data"].get("content")
        elif value.get("lc") == 1 and isinstance(value.get("kwargs"), dict):
            value = value["kwargs"].get("content")
        elif DROPPED_KEYS.isdisjoint(keys):
            return value
        else:
            return {k: v for k, v in value.items() if k not in DROPPED_KEYS}
    return value


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _loads_or_text(value: Any) -> Any:
    if isinstance(value, str):
        parsed = _loads(value)
        return value if parsed is None else parsed
    return value
