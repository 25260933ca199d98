"""Every telemetry name loopwatch emits or reads, spelled once (STYLE rule 3).

The ``gen_ai.*`` names are copied from the OpenTelemetry GenAI semantic conventions,
version 1.38 (Development status; now maintained in the ``semantic-conventions-genai``
repository). ``gen_ai.agent.finish_reason`` is a proposed name, emitted alongside
``loopwatch.stop.reason``. The ``loopwatch.*`` names are this project's wire format
(DESIGN section 4) and are documented attribute by attribute in ``docs/semconv.md``.
"""

from __future__ import annotations

from typing import Final

SEMCONV_VERSION: Final = "1.38.0"
DETECTOR_VERSION: Final = "1"
INSTRUMENTATION_NAME: Final = "loopwatch.instrumentation"

# Span name templates: low-cardinality values only (STYLE rule 4).
SPAN_RUN: Final = "invoke_agent {agent}"
SPAN_DECISION: Final = "decide {agent}"
SPAN_TOOL: Final = "execute_tool {tool}"
SPAN_STOP: Final = "stop {agent}"

# OpenTelemetry GenAI semantic conventions.
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_AGENT_FINISH_REASON: Final = "gen_ai.agent.finish_reason"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_SYSTEM: Final = "gen_ai.system"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
ERROR_TYPE: Final = "error.type"

OP_INVOKE_AGENT: Final = "invoke_agent"
OP_EXECUTE_TOOL: Final = "execute_tool"
OP_CHAT: Final = "chat"

# OpenInference (Arize) names the collector also reads (DESIGN section 8).
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_TOOL_NAME: Final = "tool.name"
OPENINFERENCE_INPUT_VALUE: Final = "input.value"
OPENINFERENCE_OUTPUT_VALUE: Final = "output.value"
# Third-party agent spans, read by the collector's framework rules (collector/frameworks.py).
OPENINFERENCE_AGENT_NAME: Final = "agent.name"
OPENINFERENCE_GRAPH_NODE_ID: Final = "graph.node.id"
OPENINFERENCE_METADATA: Final = "metadata"
LANGGRAPH_NODE: Final = "langgraph_node"
CREWAI_AGENT_ROLE: Final = "crewai.agent.role"
OPENLLMETRY_ENTITY_INPUT: Final = "traceloop.entity.input"
OPENLLMETRY_ENTITY_OUTPUT: Final = "traceloop.entity.output"

# Model-output names read by the offline OTLP/JSON importer (loopwatch.replay): GenAI
# semconv 1.38 message attributes, OpenInference flattened message lists
# (``llm.output_messages.<i>.message.tool_calls.<j>.tool_call.function.name``), and
# OpenLLMetry / resource names used only as labels.
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
OPENINFERENCE_LLM_OUTPUT_MESSAGES: Final = "llm.output_messages"
OPENINFERENCE_LLM_MODEL_NAME: Final = "llm.model_name"
OPENINFERENCE_LLM_TOKEN_COUNT_PROMPT: Final = "llm.token_count.prompt"
OPENINFERENCE_LLM_TOKEN_COUNT_COMPLETION: Final = "llm.token_count.completion"
OPENINFERENCE_TOOL_CALL_ID: Final = "tool_call.id"
OPENLLMETRY_REQUEST_TYPE: Final = "llm.request.type"
OPENLLMETRY_WORKFLOW_NAME: Final = "traceloop.workflow.name"
SERVICE_NAME: Final = "service.name"

# Run span.
LW_RUN_ID: Final = "loopwatch.run.id"
LW_PARENT_RUN_ID: Final = "loopwatch.parent_run.id"
LW_POLICY_NAME: Final = "loopwatch.policy.name"
LW_POLICY_VERSION: Final = "loopwatch.policy.version"
LW_DETECTOR_VERSION: Final = "loopwatch.detector.version"
LW_LIMITS: Final = "loopwatch.limits"
LW_MODE: Final = "loopwatch.mode"

# Shared by decision, tool and stop spans.
LW_EVENT: Final = "loopwatch.event"
LW_STEP: Final = "loopwatch.step"
LW_STEPS_SINCE_PROGRESS: Final = "loopwatch.steps_since_progress"

EVENT_DECISION: Final = "decision"
EVENT_TOOL_RESULT: Final = "tool_result"
EVENT_STOP: Final = "stop"

# Decision span.
LW_DECISION_TYPE: Final = "loopwatch.decision.type"
LW_DECISION_FINGERPRINT: Final = "loopwatch.decision.fingerprint"
LW_COST_USD: Final = "loopwatch.cost.usd"

# Tool span.
LW_ACTION_FINGERPRINT: Final = "loopwatch.action.fingerprint"
LW_OBSERVATION_DIGEST: Final = "loopwatch.observation.digest"
LW_TOOL_OUTCOME: Final = "loopwatch.tool.outcome"
LW_TOOL_RISK: Final = "loopwatch.tool.risk"
LW_PROGRESS: Final = "loopwatch.progress"
LW_TOOL_BLOCKED_BY: Final = "loopwatch.tool.blocked_by"
LW_TOOL_FAILURE_CLASS: Final = "loopwatch.tool.failure_class"

OUTCOME_OK: Final = "ok"
OUTCOME_ERROR: Final = "error"
OUTCOME_BLOCKED: Final = "blocked"
OUTCOME_NUDGED: Final = "nudged"

# Loop response (the ladder, issue 26): on the tool span of a call that met a warn or
# nudge rung, and as the attributes of its ``loopwatch.loop_response`` event.
LW_LOOP_RESPONSE: Final = "loopwatch.loop.response"
LW_LOOP_RUNG: Final = "loopwatch.loop.rung"
LW_LOOP_DETECTOR: Final = "loopwatch.loop.detector"
EVENT_LOOP_RESPONSE: Final = "loopwatch.loop_response"
LW_OBSERVE_LOOP_RESPONSE: Final = "loopwatch.observe.loop_response"
RESPONSE_WARN: Final = "warn"
RESPONSE_NUDGE: Final = "nudge"
NUDGE_RECOVERED: Final = "recovered"
NUDGE_STOPPED: Final = "stopped"
NUDGE_ENDED: Final = "ended"


# Stop span.
LW_STOP_REASON: Final = "loopwatch.stop.reason"
LW_STOP_DIMENSION: Final = "loopwatch.stop.dimension"
LW_STOP_LIMIT: Final = "loopwatch.stop.limit"
LW_STOP_OBSERVED: Final = "loopwatch.stop.observed"
LW_STOP_BASIS: Final = "loopwatch.stop.basis"
LW_STOP_EVIDENCE: Final = "loopwatch.stop.evidence"
LW_STOP_MESSAGE: Final = "loopwatch.stop.message"
LW_OBSERVE_STOP_REASON: Final = "loopwatch.observe.stop_reason"
LW_OBSERVE_STOP_STEP: Final = "loopwatch.observe.stop_step"
LW_OBSERVE_STOP_EVIDENCE: Final = "loopwatch.observe.stop_evidence"
LW_USAGE_MODEL_TURNS: Final = "loopwatch.usage.model_turns"
LW_USAGE_TOOL_ATTEMPTS: Final = "loopwatch.usage.tool_attempts"
LW_USAGE_TOOL_SUCCESSES: Final = "loopwatch.usage.tool_successes"
LW_USAGE_TOKENS: Final = "loopwatch.usage.tokens"
LW_USAGE_COST_USD: Final = "loopwatch.usage.cost_usd"
LW_USAGE_ELAPSED_SECONDS: Final = "loopwatch.usage.elapsed_seconds"
LW_NUDGES: Final = "loopwatch.nudges"
LW_NUDGES_DROPPED: Final = "loopwatch.nudges.dropped"

# Content capture switch shared with other GenAI instrumentations.
ENV_CAPTURE_CONTENT: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
ENV_CANARIES: Final = "LOOPWATCH_REDACTION_CANARIES"
