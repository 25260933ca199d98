"""Reading what an agent did from decoded span attributes, under the conventions in use.

The one reader of agent semantics in span attributes, shared by the collector's map stage
(:mod:`loopwatch.collector.map`) and ``loopwatch replay``'s OTLP/JSON importer
(:mod:`loopwatch.replay.importers.otlp_json`), so a span means the same thing online and
offline. Pure Python over :class:`~loopwatch.collector.records.SpanRecord` attributes: no
protobuf, no DuckDB.

Conventions read (names spelled in :mod:`loopwatch.instrumentation._semconv`):

- OpenTelemetry GenAI semantic conventions, version 1.38 (Development status):
  ``gen_ai.operation.name`` (``invoke_agent``, ``execute_tool``, ``chat``,
  ``text_completion``, ``generate_content``), ``gen_ai.agent.name``, ``gen_ai.tool.*``,
  ``gen_ai.usage.*_tokens``, and the span name templates ``invoke_agent {agent}`` and
  ``execute_tool {tool}``.
- OpenInference (Arize) semantic conventions: ``openinference.span.kind`` (``AGENT``,
  ``TOOL``, ``LLM``, any case), ``tool.name``, ``tool_call.id``, ``input.value``,
  ``output.value``, ``llm.token_count.prompt``/``.completion``.
- OpenLLMetry (Traceloop): ``llm.request.type`` ``chat``/``completion`` marks a model call.

Attribute readers never raise on odd values: a value of the wrong type, out of range or
not finite reads as ``None`` (a hostile value must not fail a whole batch), and
structured values (lists, maps, bytes) read as compact JSON text where text is wanted.
"""

from __future__ import annotations

import json
import math
from typing import Final

from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation.budgets import MAX_REPORTED_TOKENS

from .frameworks import (
    agent_label,
    is_final_answer,
    is_graph_node,
    is_model_preparation,
    unwrap_arguments,
    unwrap_result,
)
from .records import STATUS_ERROR, Attributes, AttrValue, SpanRecord

__all__ = [
    "MODEL_OPERATIONS",
    "ROLE_AGENT",
    "ROLE_MODEL",
    "ROLE_OTHER",
    "ROLE_TOOL",
    "agent_name",
    "attr_bool",
    "attr_float",
    "attr_int",
    "attr_str",
    "attr_text",
    "input_tokens",
    "output_tokens",
    "span_role",
    "span_subject",
    "tokens",
    "tool_arguments",
    "tool_call_id",
    "tool_failed",
    "tool_name",
    "tool_result",
]

ROLE_OTHER: Final = 0
ROLE_AGENT: Final = 1
ROLE_TOOL: Final = 2
ROLE_MODEL: Final = 3

MODEL_OPERATIONS: Final = frozenset({sc.OP_CHAT, "text_completion", "generate_content"})
"""``gen_ai.operation.name`` values of a model call (GenAI semconv 1.38)."""

_OPENLLMETRY_MODEL_TYPES: Final = frozenset({"chat", "completion"})
_OI_ROLES: Final = {"AGENT": ROLE_AGENT, "TOOL": ROLE_TOOL, "LLM": ROLE_MODEL}
_TOOL_PREFIX: Final = sc.SPAN_TOOL.split("{", 1)[0]
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def span_role(attrs: Attributes, name: str = "") -> int:
    """What a third-party span is: ``ROLE_AGENT``, ``ROLE_TOOL``, ``ROLE_MODEL`` or
    ``ROLE_OTHER`` (chains, workflows, HTTP spans...).

    ``gen_ai.operation.name`` decides first, then ``openinference.span.kind``, then
    OpenLLMetry's ``llm.request.type``. A graph node that looks like an agent
    (:func:`~loopwatch.collector.frameworks.is_graph_node`) is ``ROLE_OTHER``;
    ``create_agent`` (building an agent, not running it) is too, and so are a model span
    that only prepares the request and smolagents' answer tool (the span ``name`` tells,
    :func:`~loopwatch.collector.frameworks.is_model_preparation`,
    :func:`~loopwatch.collector.frameworks.is_final_answer`).
    """
    role = _role(attrs)
    if role == ROLE_MODEL and is_model_preparation(name):
        return ROLE_OTHER
    return ROLE_OTHER if role == ROLE_TOOL and is_final_answer(name, attrs) else role


def _role(attrs: Attributes) -> int:
    op = attrs.get(sc.GEN_AI_OPERATION_NAME)
    if op == sc.OP_INVOKE_AGENT:
        return ROLE_OTHER if is_graph_node(attrs) else ROLE_AGENT
    if op == sc.OP_EXECUTE_TOOL:
        return ROLE_TOOL
    # Values may be lists or maps (unhashable): test set membership on strings only.
    if isinstance(op, str) and op in MODEL_OPERATIONS:
        return ROLE_MODEL
    oi = attrs.get(sc.OPENINFERENCE_SPAN_KIND)
    if isinstance(oi, str):
        role = _OI_ROLES.get(oi.upper())
        if role == ROLE_AGENT and is_graph_node(attrs):
            return ROLE_OTHER
        if role is not None:
            return role
    request_type = attrs.get(sc.OPENLLMETRY_REQUEST_TYPE)
    if isinstance(request_type, str) and request_type in _OPENLLMETRY_MODEL_TYPES:
        return ROLE_MODEL
    return ROLE_OTHER


def span_subject(name: str, prefix: str) -> str:
    """The value a span name was made from: ``"triage"`` for ``"invoke_agent triage"``
    and prefix ``"invoke_agent "``; the whole name when it does not start so."""
    return name[len(prefix) :].strip() if name.startswith(prefix) else name


def agent_name(span: SpanRecord) -> str | None:
    """``gen_ai.agent.name``, else OpenInference ``agent.name`` or ``graph.node.id``,
    else the agent of an ``invoke_agent {agent}`` span name, else the span name without
    a method suffix (``smol_support.run`` -> ``smol_support``); ``None`` when all are
    empty (:func:`~loopwatch.collector.frameworks.agent_label`)."""
    return agent_label(span.name, span.attributes)


def tool_name(span: SpanRecord) -> str | None:
    """``gen_ai.tool.name``, else OpenInference ``tool.name``, else the tool of an
    ``execute_tool {tool}`` span name, else the span name; ``None`` when all are empty."""
    attrs = span.attributes
    return (
        attr_str(attrs, sc.GEN_AI_TOOL_NAME)
        or attr_str(attrs, sc.OPENINFERENCE_TOOL_NAME)
        or span_subject(span.name, _TOOL_PREFIX)
        or None
    )


def tool_call_id(attrs: Attributes) -> str | None:
    """``gen_ai.tool.call.id``, else OpenInference ``tool_call.id``."""
    return attr_str(attrs, sc.GEN_AI_TOOL_CALL_ID) or attr_str(attrs, sc.OPENINFERENCE_TOOL_CALL_ID)


def tool_arguments(attrs: Attributes) -> str | None:
    """A tool call's arguments as text: ``gen_ai.tool.call.arguments``, else
    OpenInference ``input.value``, without a known framework envelope
    (:func:`~loopwatch.collector.frameworks.unwrap_arguments`; otherwise JSON as
    received); present only when content capture was on."""
    arguments = attr_text(attrs, sc.GEN_AI_TOOL_CALL_ARGUMENTS)
    if arguments is None:
        arguments = attr_text(attrs, sc.OPENINFERENCE_INPUT_VALUE)
    return unwrap_arguments(arguments)


def tool_result(attrs: Attributes) -> str | None:
    """A tool call's result as text: ``gen_ai.tool.call.result``, else OpenInference
    ``output.value``, without a known framework envelope
    (:func:`~loopwatch.collector.frameworks.unwrap_result`); present only when content
    capture was on."""
    result = attr_text(attrs, sc.GEN_AI_TOOL_CALL_RESULT)
    if result is None:
        result = attr_text(attrs, sc.OPENINFERENCE_OUTPUT_VALUE)
    return unwrap_result(result)


def tool_failed(span: SpanRecord) -> bool:
    """Whether a tool span failed: status ``ERROR`` or an ``error.type`` attribute."""
    return span.status_code == STATUS_ERROR or span.attributes.get(sc.ERROR_TYPE) is not None


def tokens(attrs: Attributes, key: str, fallback: str | None = None) -> int | None:
    """A token count (``key``, else ``fallback``) clamped to ``0..MAX_REPORTED_TOKENS``,
    as the guard counts reports: two unbounded int64 counts summed overflow a total."""
    value = attr_int(attrs, key)
    if value is None and fallback is not None:
        value = attr_int(attrs, fallback)
    return None if value is None else min(max(value, 0), MAX_REPORTED_TOKENS)


def input_tokens(attrs: Attributes) -> int | None:
    """A model call's input tokens: ``gen_ai.usage.input_tokens``, else OpenInference
    ``llm.token_count.prompt`` (see :func:`tokens`)."""
    return tokens(attrs, sc.GEN_AI_USAGE_INPUT_TOKENS, sc.OPENINFERENCE_LLM_TOKEN_COUNT_PROMPT)


def output_tokens(attrs: Attributes) -> int | None:
    """A model call's output tokens: ``gen_ai.usage.output_tokens``, else OpenInference
    ``llm.token_count.completion`` (see :func:`tokens`)."""
    return tokens(attrs, sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.OPENINFERENCE_LLM_TOKEN_COUNT_COMPLETION)


def attr_str(attrs: Attributes, key: str) -> str | None:
    """A value as text: strings as is, booleans ``true``/``false``, numbers ``str()``,
    lists, maps and bytes as compact JSON (bytes as hex)."""
    value = attrs.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return _dumps(value)


def attr_text(attrs: Attributes, key: str) -> str | None:
    """A value as text for content (arguments, results, JSON attributes): strings as
    is, anything else as compact JSON with sorted keys (bytes as hex)."""
    value = attrs.get(key)
    if value is None or isinstance(value, str):
        return value
    return _dumps(value)


def _dumps(value: AttrValue) -> str:
    if isinstance(value, bytes):
        return value.hex()
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=_json_default)


def _json_default(value: object) -> str:
    return value.hex() if isinstance(value, bytes) else str(value)


def attr_int(attrs: Attributes, key: str) -> int | None:
    """An int64 value (an integral float or a decimal string counts); anything else,
    out of range, non-finite or not a number, is ``None``."""
    value = attrs.get(key)
    if isinstance(value, bool):
        return None
    result: int | None = None
    if isinstance(value, int):
        result = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        result = int(value)
    elif isinstance(value, str):
        try:
            result = int(value)
        except ValueError:
            return None
    if result is None or not _INT64_MIN <= result <= _INT64_MAX:
        return None
    return result


def attr_float(attrs: Attributes, key: str) -> float | None:
    """A finite float (an int or a decimal string counts); anything else is ``None``."""
    value = attrs.get(key)
    if isinstance(value, bool):
        return None
    number: float | None = None
    if isinstance(value, int | float):
        number = float(value) if abs(value) < 1e308 else None
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    return number if number is not None and math.isfinite(number) else None


def attr_bool(attrs: Attributes, key: str) -> bool | None:
    """A boolean, or the string ``true``/``false`` in any case; else ``None``."""
    value = attrs.get(key)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None
