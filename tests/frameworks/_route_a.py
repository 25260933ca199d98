"""Scripted agents of the seven frameworks under their usual OpenTelemetry tracers (route A).

One responsibility: run one framework's agent, driven by a scripted model (no network),
through one scenario while one third-party tracer records its spans into a given
``TracerProvider``. ``scripts/record_framework_spans.py`` uses it to write the recorded
fixtures (``tests/testdata/frameworks/``); ``tests/frameworks/test_route_a.py`` runs it as
a subprocess (``python -m tests.frameworks._route_a``) that exports OTLP/HTTP to a real
``loopwatch collector``. A subprocess per framework and tracer, because instrumentors patch
the framework process-wide and not all of them undo it cleanly, and some tracers read the
global tracer provider, which can be set once per process.

Scenarios (the issue's route A cases), each one agent invocation named :data:`AGENT_NAME`:

- ``runaway``: ``lookup_order(order_id="A-1")`` :data:`RUNAWAY_CALLS` times, the same
  result each time, then a final answer (a loop: the collector must flag it);
- ``success``: ``lookup_order`` once, then a final answer;
- ``paginate``: ``list_orders(cursor=0..3)``, each page different, then a final answer
  (progress, never a loop).

Tracers (:data:`TRACERS`): ``native`` (the framework's own OpenTelemetry spans),
``openinference`` (``openinference-instrumentation-<fw>``), ``openllmetry``
(``opentelemetry-instrumentation-<fw>``, Traceloop). Content capture is on for all
(:data:`CONTENT_ENV`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

AGENT_NAME = "support_bot"
"""The agent's real name, as given to the framework (the collector must report it)."""

RUNAWAY_CALLS = 6
PAGES = 4
SCENARIOS = ("runaway", "success", "paginate")
TOOL_CALLS = {"runaway": RUNAWAY_CALLS, "success": 1, "paginate": PAGES}
"""Tool calls each scenario makes (the collector must count exactly these)."""
LOOPING = {"runaway": True, "success": False, "paginate": False}
"""Whether the collector must flag the scenario's run as a loop."""

PROMPT = "Where is order A-1?"
FINAL = "Order A-1 has shipped."

CONTENT_ENV = {
    # OpenTelemetry GenAI instrumentations (and OpenLLMetry's newer releases).
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
    # OpenLLMetry (Traceloop) instrumentations.
    "TRACELOOP_TRACE_CONTENT": "true",
    # OpenLLMetry would otherwise create metrics instruments on the global meter provider.
    "TRACELOOP_METRICS_ENABLED": "false",
    # OpenInference captures content unless told not to (OPENINFERENCE_HIDE_*): defaults.
    # CrewAI: none of its own telemetry or cloud tracing (it would try the network).
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
}
"""Environment set before any framework is imported: content capture on, vendor
telemetry off."""


@dataclass(frozen=True)
class Turn:
    """One scripted model turn: a tool call (``tool`` and ``args``) or the final answer."""

    tool: str | None
    args: dict[str, Any]
    call_id: str = ""

    @property
    def final(self) -> bool:
        return self.tool is None


def plan(scenario: str) -> list[Turn]:
    """The model turns of ``scenario``, in order (the last is the final answer).

    Raises:
        ValueError: an unknown scenario.
    """
    if scenario == "runaway":
        calls = [("lookup_order", {"order_id": "A-1"})] * RUNAWAY_CALLS
    elif scenario == "success":
        calls = [("lookup_order", {"order_id": "A-1"})]
    elif scenario == "paginate":
        calls = [("list_orders", {"cursor": page}) for page in range(PAGES)]
    else:
        raise ValueError(f"unknown scenario {scenario!r}; known: {SCENARIOS}")
    turns = [Turn(name, dict(args), f"call_{i + 1}") for i, (name, args) in enumerate(calls)]
    return [*turns, Turn(None, {})]


def lookup_order(order_id: str) -> str:
    """Look up one order by its id."""
    return json.dumps({"order_id": order_id, "status": "shipped"})


def list_orders(cursor: int) -> str:
    """List orders, one page at a time from the cursor."""
    orders = [f"O-{cursor * 2 + 1}", f"O-{cursor * 2 + 2}"]
    return json.dumps({"orders": orders, "next_cursor": cursor + 1})


TOOLS: dict[str, Callable[..., str]] = {"lookup_order": lookup_order, "list_orders": list_orders}


def tools_of(scenario: str) -> list[Callable[..., str]]:
    """The tool functions the agent of ``scenario`` is given (the one it calls)."""
    return [list_orders] if scenario == "paginate" else [lookup_order]


def _openai_chat_client(scenario: str, *, final_tool: bool, is_async: bool = False) -> Any:
    """An object shaped like ``openai.OpenAI`` (or ``AsyncOpenAI``) whose
    ``chat.completions.create`` answers from the scenario's script with real
    ``ChatCompletion`` objects (no network), so the framework's own OpenAI model class and
    its tracing run unchanged. ``final_tool``: the final answer is a ``final_answer`` tool
    call (smolagents' way) rather than text."""
    from types import SimpleNamespace

    from openai.types.chat import ChatCompletion

    turns = iter(plan(scenario))

    def create(**kwargs: Any) -> Any:
        turn = next(turns)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "tool_calls"
        if turn.final and not final_tool:
            message["content"], finish = FINAL, "stop"
        else:
            if turn.final:
                name, args, call_id = "final_answer", {"answer": FINAL}, "call_final"
            else:
                name, args, call_id = str(turn.tool), turn.args, turn.call_id
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ]
        return ChatCompletion.model_validate(
            {
                "id": f"chatcmpl-{turn.call_id or 'final'}",
                "object": "chat.completion",
                "created": 0,
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
            }
        )

    async def acreate(**kwargs: Any) -> Any:
        return create(**kwargs)

    completions = SimpleNamespace(create=acreate if is_async else create)
    return SimpleNamespace(
        chat=SimpleNamespace(completions=completions), base_url="https://api.openai.invalid/v1/"
    )


# --------------------------------------------------------------------------- pydantic-ai


def setup_pydantic_ai(tracer: str, provider: Any) -> None:
    """Native spans need no setup (the agent is given the provider); OpenInference is a
    span processor."""
    if tracer == "openinference":
        # OpenInference for pydantic-ai is a span processor that adds its attributes to
        # pydantic-ai's own spans as they end (so it comes before the exporters).
        from openinference.instrumentation.pydantic_ai import OpenInferenceSpanProcessor

        provider.add_span_processor(OpenInferenceSpanProcessor())


def run_pydantic_ai(scenario: str, tracer: str, provider: Any) -> None:
    """pydantic-ai's own ``FunctionModel`` answers from the script."""
    from pydantic_ai import Agent
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    turns = iter(plan(scenario))

    def model(messages: Any, info: Any) -> Any:
        turn = next(turns)
        if turn.final:
            return ModelResponse(parts=[TextPart(FINAL)])
        return ModelResponse(parts=[ToolCallPart(turn.tool, turn.args, tool_call_id=turn.call_id)])

    agent = Agent(
        FunctionModel(model),
        name=AGENT_NAME,
        tools=tools_of(scenario),
        capabilities=[Instrumentation(settings=InstrumentationSettings(tracer_provider=provider))],
    )
    agent.run_sync(PROMPT)


# ------------------------------------------------------------------------- openai-agents


def setup_openai_agents(tracer: str, provider: Any) -> None:
    import agents

    # The Agents SDK traces into its own processors (exported to OpenAI by default): the
    # OTel instrumentations replace them, so nothing tries the network.
    agents.set_trace_processors([])
    if tracer == "openinference":
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    elif tracer == "openllmetry":
        from opentelemetry.instrumentation.openai_agents import (
            OpenAIAgentsInstrumentor as TraceloopInstrumentor,
        )

        TraceloopInstrumentor(replace_existing_processors=True).instrument(tracer_provider=provider)
    else:
        raise ValueError(f"openai-agents has no tracer {tracer!r}")


def run_openai_agents(scenario: str, tracer: str, provider: Any) -> None:
    import agents
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    # The SDK's own Chat Completions model over a scripted client: its generation spans
    # (model, input, output, usage) are the ones a real model call makes.
    model = OpenAIChatCompletionsModel(
        model="gpt-4o-mini",
        openai_client=_openai_chat_client(scenario, final_tool=False, is_async=True),
    )
    agent = agents.Agent(
        name=AGENT_NAME,
        instructions="Answer questions about orders.",
        model=model,
        tools=[agents.function_tool(fn) for fn in tools_of(scenario)],
    )
    agents.Runner.run_sync(agent, PROMPT, max_turns=RUNAWAY_CALLS + 4)
    agents.flush_traces()


# ----------------------------------------------------------------------------- langgraph


def _langgraph_model(scenario: str) -> Any:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    class ScriptedChatModel(GenericFakeChatModel):
        """LangChain's fake chat model, with tools bound as a real model would."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    usage = {"input_tokens": 20, "output_tokens": 5, "total_tokens": 25}
    messages = [
        AIMessage(content=FINAL, usage_metadata=usage)
        if turn.final
        else AIMessage(
            content="",
            tool_calls=[{"name": turn.tool, "args": turn.args, "id": turn.call_id}],
            usage_metadata=usage,
        )
        for turn in plan(scenario)
    ]
    return ScriptedChatModel(messages=iter(messages))


def setup_langgraph(tracer: str, provider: Any) -> None:
    if tracer == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        LangChainInstrumentor().instrument(tracer_provider=provider)
    elif tracer == "openllmetry":
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor

        LangchainInstrumentor().instrument(tracer_provider=provider)
    else:
        raise ValueError(f"langgraph has no tracer {tracer!r}")


def run_langgraph(scenario: str, tracer: str, provider: Any) -> None:
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        # LangGraph 1.x still ships create_react_agent and points to langchain's
        # create_agent, which needs the langchain package: not part of the pinned set.
        warnings.simplefilter("ignore")
        graph = create_react_agent(
            _langgraph_model(scenario),
            tools=[lc_tool(fn) for fn in tools_of(scenario)],
            name=AGENT_NAME,
        )
    graph.invoke({"messages": [("user", PROMPT)]}, {"recursion_limit": 50})


# ---------------------------------------------------------------------------- smolagents


def setup_smolagents(tracer: str, provider: Any) -> None:
    if tracer != "openinference":
        raise ValueError(f"smolagents has no tracer {tracer!r}")
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    SmolagentsInstrumentor().instrument(tracer_provider=provider)


def run_smolagents(scenario: str, tracer: str, provider: Any) -> None:
    from smolagents import OpenAIModel, ToolCallingAgent
    from smolagents import tool as smol_tool
    from smolagents.monitoring import LogLevel

    class ScriptedModel(OpenAIModel):
        """smolagents' own OpenAI model class over a scripted client: its ``generate``
        (what OpenInference wraps) runs unchanged."""

        def create_client(self) -> Any:
            return _openai_chat_client(scenario, final_tool=True)

    if scenario == "paginate":

        @smol_tool
        def list_orders(cursor: int) -> str:
            """List orders, one page at a time from the cursor.

            Args:
                cursor: where the page starts.
            """
            return TOOLS["list_orders"](cursor)

        tools = [list_orders]
    else:

        @smol_tool
        def lookup_order(order_id: str) -> str:
            """Look up one order by its id.

            Args:
                order_id: the order's id.
            """
            return TOOLS["lookup_order"](order_id)

        tools = [lookup_order]
    agent = ToolCallingAgent(
        tools=tools,
        model=ScriptedModel(model_id="gpt-4o-mini", api_key="unused"),
        name=AGENT_NAME,
        max_steps=RUNAWAY_CALLS + 4,
        verbosity_level=LogLevel.OFF,
    )
    agent.run(PROMPT)


# ---------------------------------------------------------------------------- llamaindex


def setup_llamaindex(tracer: str, provider: Any) -> None:
    if tracer == "openinference":
        from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

        LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    elif tracer == "openllmetry":
        from opentelemetry.instrumentation.llamaindex import (
            LlamaIndexInstrumentor as TraceloopInstrumentor,
        )

        TraceloopInstrumentor().instrument(tracer_provider=provider)
    else:
        raise ValueError(f"llamaindex has no tracer {tracer!r}")


def run_llamaindex(scenario: str, tracer: str, provider: Any) -> None:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.tools import FunctionTool

    turns = iter(plan(scenario))

    def respond(messages: Any, **kwargs: Any) -> Any:
        turn = next(turns)
        if turn.final:
            return ChatMessage(role=MessageRole.ASSISTANT, content=FINAL)
        block = ToolCallBlock(
            tool_call_id=turn.call_id, tool_name=str(turn.tool), tool_kwargs=turn.args
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[block])

    # LlamaIndex's own function-calling test model, answering from the script.
    llm = MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)
    agent = FunctionAgent(
        name=AGENT_NAME,
        description="Answers questions about orders.",
        tools=[FunctionTool.from_defaults(fn) for fn in tools_of(scenario)],
        llm=llm,
        system_prompt="Answer questions about orders.",
    )

    async def main() -> None:
        await agent.run(user_msg=PROMPT, max_iterations=RUNAWAY_CALLS + 4)

    asyncio.run(main())


# ------------------------------------------------------------------------------- autogen


def setup_autogen(tracer: str, provider: Any) -> None:
    # AutoGen's native spans (create_agent, invoke_agent, execute_tool) go to the global
    # tracer provider, which _main sets: they are there under every tracer, as for users.
    if tracer == "openinference":
        from openinference.instrumentation.autogen_agentchat import (
            AutogenAgentChatInstrumentor,
        )

        AutogenAgentChatInstrumentor().instrument(tracer_provider=provider)
    elif tracer != "native":
        raise ValueError(f"autogen has no tracer {tracer!r}")


def run_autogen(scenario: str, tracer: str, provider: Any) -> None:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core import FunctionCall
    from autogen_core.models import ChatCompletionClient, CreateResult, ModelInfo, RequestUsage

    turns = iter(plan(scenario))
    usage = RequestUsage(prompt_tokens=20, completion_tokens=5)

    class ScriptedClient(ChatCompletionClient):
        """An AutoGen model client answering from the scenario's script."""

        async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
            turn = next(turns)
            if turn.final:
                return CreateResult(finish_reason="stop", content=FINAL, usage=usage, cached=False)
            call = FunctionCall(
                id=turn.call_id, name=str(turn.tool), arguments=json.dumps(turn.args)
            )
            return CreateResult(
                finish_reason="function_calls", content=[call], usage=usage, cached=False
            )

        def create_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the scripted client does not stream")

        async def close(self) -> None:
            return None

        def actual_usage(self) -> RequestUsage:
            return usage

        def total_usage(self) -> RequestUsage:
            return usage

        def count_tokens(self, messages: Any, **kwargs: Any) -> int:
            return 0

        def remaining_tokens(self, messages: Any, **kwargs: Any) -> int:
            return 100_000

        @property
        def capabilities(self) -> Any:
            return self.model_info

        @property
        def model_info(self) -> ModelInfo:
            return ModelInfo(
                vision=False,
                function_calling=True,
                json_output=False,
                family="unknown",
                structured_output=False,
            )

    agent = AssistantAgent(
        AGENT_NAME,
        model_client=ScriptedClient(),
        tools=tools_of(scenario),
        max_tool_iterations=RUNAWAY_CALLS + 4,
    )

    async def main() -> None:
        await agent.run(task=PROMPT)

    asyncio.run(main())


# -------------------------------------------------------------------------------- crewai


def setup_crewai(tracer: str, provider: Any) -> None:
    if tracer == "openinference":
        from openinference.instrumentation.crewai import CrewAIInstrumentor

        CrewAIInstrumentor().instrument(tracer_provider=provider)
    elif tracer == "openllmetry":
        from opentelemetry.instrumentation.crewai import (
            CrewAIInstrumentor as TraceloopInstrumentor,
        )

        TraceloopInstrumentor().instrument(tracer_provider=provider)
    else:
        raise ValueError(f"crewai has no tracer {tracer!r}")


def run_crewai(scenario: str, tracer: str, provider: Any) -> None:
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import tool as crew_tool

    turns = iter(plan(scenario))

    class ScriptedLLM(BaseLLM):
        """A CrewAI LLM answering from the scenario's script in CrewAI's ReAct format."""

        def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
            turn = next(turns)
            if turn.final:
                return f"Thought: I now know the final answer\nFinal Answer: {FINAL}"
            return (
                "Thought: I should look this up\n"
                f"Action: {turn.tool}\nAction Input: {json.dumps(turn.args)}"
            )

        def supports_function_calling(self) -> bool:
            return False

    if scenario == "paginate":

        @crew_tool("list_orders")
        def list_orders_tool(cursor: int) -> str:
            """List orders, one page at a time from the cursor."""
            return TOOLS["list_orders"](cursor)

        tools = [list_orders_tool]
    else:

        @crew_tool("lookup_order")
        def lookup_order_tool(order_id: str) -> str:
            """Look up one order by its id."""
            return TOOLS["lookup_order"](order_id)

        tools = [lookup_order_tool]
    agent = Agent(
        role=AGENT_NAME,
        goal="Answer questions about orders.",
        backstory="Support agent of an online shop.",
        llm=ScriptedLLM(model="gpt-4o-mini"),
        tools=tools,
        max_iter=RUNAWAY_CALLS + 4,
        verbose=False,
    )
    task = Task(description=PROMPT, expected_output="Where the order is.", agent=agent)
    Crew(agents=[agent], tasks=[task], verbose=False).kickoff()


# ------------------------------------------------------------------------------ registry

SETUPS: dict[str, Callable[[str, Any], None]] = {
    "pydantic_ai": setup_pydantic_ai,
    "openai_agents": setup_openai_agents,
    "langgraph": setup_langgraph,
    "smolagents": setup_smolagents,
    "llamaindex": setup_llamaindex,
    "autogen": setup_autogen,
    "crewai": setup_crewai,
}
"""Framework -> ``setup(tracer, provider)``: switch the tracer on, once per process, before
the provider's exporting processors are added (a processor that edits spans goes first)."""

RUNNERS: dict[str, Callable[[str, str, Any], None]] = {
    "pydantic_ai": run_pydantic_ai,
    "openai_agents": run_openai_agents,
    "langgraph": run_langgraph,
    "smolagents": run_smolagents,
    "llamaindex": run_llamaindex,
    "autogen": run_autogen,
    "crewai": run_crewai,
}
"""Framework -> ``run(scenario, tracer, provider)``: one agent invocation."""

TRACERS: dict[str, tuple[str, ...]] = {
    "pydantic_ai": ("native", "openinference"),
    "openai_agents": ("openinference", "openllmetry"),
    "langgraph": ("openinference", "openllmetry"),
    "smolagents": ("openinference",),
    "llamaindex": ("openinference", "openllmetry"),
    "autogen": ("native", "openinference"),
    "crewai": ("openinference", "openllmetry"),
}
"""Framework -> the tracers recorded and tested for it (see the module docstring)."""

FRAMEWORK_MODULE = {
    "pydantic_ai": "pydantic_ai",
    "openai_agents": "agents",
    "langgraph": "langgraph",
    "smolagents": "smolagents",
    "llamaindex": "llama_index.core",
    "autogen": "autogen_agentchat",
    "crewai": "crewai",
}
"""Framework -> the module whose import says the framework is installed here."""


DISTRIBUTIONS: dict[str, list[str]] = {
    "pydantic_ai": ["pydantic-ai-slim", "opentelemetry-sdk"],
    "openai_agents": ["openai-agents", "opentelemetry-sdk"],
    "langgraph": ["langgraph", "langchain-core", "opentelemetry-sdk"],
    "smolagents": ["smolagents", "opentelemetry-sdk"],
    "llamaindex": ["llama-index-core", "opentelemetry-sdk"],
    "autogen": ["autogen-agentchat", "autogen-core", "opentelemetry-sdk"],
    "crewai": ["crewai", "opentelemetry-sdk"],
}
"""Framework -> the distributions whose release shapes its spans (``versions.json``)."""

TRACER_DISTRIBUTIONS: dict[tuple[str, str], list[str]] = {
    ("pydantic_ai", "openinference"): ["openinference-instrumentation-pydantic-ai"],
    ("openai_agents", "openinference"): ["openinference-instrumentation-openai-agents"],
    ("openai_agents", "openllmetry"): ["opentelemetry-instrumentation-openai-agents"],
    ("langgraph", "openinference"): ["openinference-instrumentation-langchain"],
    ("langgraph", "openllmetry"): ["opentelemetry-instrumentation-langchain"],
    ("smolagents", "openinference"): ["openinference-instrumentation-smolagents"],
    ("llamaindex", "openinference"): ["openinference-instrumentation-llama-index"],
    ("llamaindex", "openllmetry"): ["opentelemetry-instrumentation-llamaindex"],
    ("autogen", "openinference"): ["openinference-instrumentation-autogen-agentchat"],
    ("crewai", "openinference"): ["openinference-instrumentation-crewai"],
    ("crewai", "openllmetry"): ["opentelemetry-instrumentation-crewai"],
}
"""(framework, tracer) -> the instrumentation distributions of that tracer."""


def combos() -> list[tuple[str, str]]:
    """Every (framework, tracer) pair, in a stable order."""
    return [(fw, tracer) for fw, tracers in TRACERS.items() for tracer in tracers]


def to_otlp_json(spans: Any) -> dict[str, Any]:
    """``spans`` (SDK ``ReadableSpan``s) as an OTLP/JSON ``ExportTraceServiceRequest``.

    The OTel encoder builds the protobuf message and ``json_format`` maps it to JSON;
    the trace and span ids are then written as hex, as the OTLP specification's "JSON
    Protobuf Encoding" requires (the generic protobuf mapping writes bytes as base64).
    """
    import base64

    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    message = json.loads(json_format.MessageToJson(encode_spans(spans)))

    def hexify(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                else:
                    hexify(value)
        elif isinstance(node, list):
            for item in node:
                hexify(item)

    hexify(message)
    return dict(message)


def _dump(request: dict[str, Any]) -> str:
    """``request`` as JSON with one span per line (compact within a span)."""
    lines = ['{"resourceSpans": [']
    resources = request.get("resourceSpans", [])
    for r_index, resource in enumerate(resources):
        head = {k: v for k, v in resource.items() if k != "scopeSpans"}
        lines.append(json.dumps(head, sort_keys=True)[:-1] + ', "scopeSpans": [')
        scopes = resource.get("scopeSpans", [])
        for s_index, scope in enumerate(scopes):
            head = {k: v for k, v in scope.items() if k != "spans"}
            lines.append(json.dumps(head, sort_keys=True)[:-1] + ', "spans": [')
            spans = scope.get("spans", [])
            for index, span in enumerate(spans):
                comma = "," if index < len(spans) - 1 else ""
                lines.append(json.dumps(span, sort_keys=True) + comma)
            lines.append("]}" + ("," if s_index < len(scopes) - 1 else ""))
        lines.append("]}" + ("," if r_index < len(resources) - 1 else ""))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def _scrub_paths(text: str) -> str:
    """``text`` without this machine's paths (exception stack traces carry them): the
    site-packages folders become ``<site-packages>``, the repository ``<repo>``, the
    interpreter's prefix ``<python>``."""
    import site

    folders = [(p, "<site-packages>") for p in site.getsitepackages()]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folders += [(root, "<repo>"), (sys.base_prefix, "<python>")]
    for folder, placeholder in sorted(folders, key=lambda item: -len(item[0])):
        if folder and folder != "/":
            text = text.replace(folder, placeholder)
    return text


def _main(argv: list[str] | None = None) -> int:
    """Subprocess entry: run the scenarios of one framework and tracer, then either export
    OTLP/HTTP to ``--otlp`` and write ``{scenario: [trace ids (hex)]}`` to ``--report``, or
    write each scenario's spans as OTLP/JSON into ``--record`` (the fixtures)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", required=True, choices=sorted(RUNNERS))
    parser.add_argument("--tracer", required=True)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--otlp", help="OTLP/HTTP traces URL to export to")
    parser.add_argument("--report", help="JSON file: the trace ids of each scenario")
    parser.add_argument("--record", help="folder for <framework>-<tracer>-<scenario>.json")
    args = parser.parse_args(argv)
    if args.tracer not in TRACERS[args.framework]:
        parser.error(f"{args.framework} has no tracer {args.tracer!r}")
    for key, value in CONTENT_ENV.items():
        os.environ[key] = value

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    # Tracers that read only the global provider (AutoGen's runtime) see the same one.
    trace.set_tracer_provider(provider)
    SETUPS[args.framework](args.tracer, provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # Synchronous export: when a run returns, the collector has committed its spans.
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=args.otlp)))
    report: dict[str, list[str]] = {}
    for scenario in args.scenario or SCENARIOS:
        memory.clear()
        RUNNERS[args.framework](scenario, args.tracer, provider)
        provider.force_flush()
        spans = memory.get_finished_spans()
        report[scenario] = sorted({format(s.context.trace_id, "032x") for s in spans})
        if args.record:
            name = f"{args.framework}-{args.tracer}-{scenario}.json"
            with open(os.path.join(args.record, name), "w", encoding="utf-8") as out:
                # One line per resource/scope/span keeps the files diffable and small.
                out.write(_scrub_paths(_dump(to_otlp_json(spans))))
                out.write("\n")
    provider.shutdown()
    if args.report:
        with open(args.report, "w", encoding="utf-8") as out:
            json.dump(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
