"""Issue 26 through LlamaIndex: a nudged call is answered with a ``ToolOutput`` whose
content is the nudge (not an error; the body never runs), which the agent gives the model
as the tool message; a scripted MockFunctionCallingLLM, real FunctionAgents, no network."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatResponse, ToolCallBlock
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from loopwatch.instrumentation import Policy, StopReason
from loopwatch.instrumentation.integrations.llamaindex import RunStopped, instrument
from loopwatch.instrumentation.testing import assert_trace_invariants

from .test_llamaindex import _timed

POLICY = Policy(repeat_limit=3, max_model_turns=20, loop_response=("nudge", "stop"))
MARK = "loopwatch did not run this call"


class ReadingLLM(MockFunctionCallingLLM):
    """Answers turn n with ``respond(n, messages)``: ``{"order_id": ...}`` for a lookup
    call, or a final text; keeps the messages each turn read."""

    def __init__(self, respond: Callable[[int, list[Any]], Any]) -> None:
        seen: list[list[Any]] = []

        def reply(messages: Any, **kw: Any) -> ChatMessage:
            seen.append(list(messages))
            turn = respond(len(seen), list(messages))
            if isinstance(turn, str):
                return ChatMessage(role="assistant", content=turn)
            block = ToolCallBlock(
                tool_call_id=f"call_{len(seen)}", tool_name="lookup", tool_kwargs=turn
            )
            return ChatMessage(role="assistant", blocks=[block])

        super().__init__(response_generator=reply)
        self._seen = seen

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        response = super().chat(messages, **kwargs)
        response.additional_kwargs = {"prompt_tokens": 12, "completion_tokens": 4}
        return response

    @property
    def seen(self) -> list[list[Any]]:
        return self._seen


def _tool_texts(messages: list[Any]) -> list[str]:
    return [
        str(m.content)
        for m in messages
        if str(getattr(m, "role", "")) in ("tool", "MessageRole.TOOL")
    ]


def _obeying(n: int, messages: list[Any]) -> Any:
    texts = _tool_texts(messages)
    if not any(MARK in t for t in texts):
        return {"order_id": "A1"}
    if not texts[-1].startswith(MARK):
        return "A2 is pending"
    return {"order_id": "A2"}


def _guarded(respond: Any, body: list[str], provider: Any, *, is_async: bool) -> Any:
    def lookup(order_id: str) -> str:
        """Look an order up."""
        body.append(order_id)
        return "status: pending"

    async def alookup(order_id: str) -> str:
        """Look an order up."""
        return lookup(order_id)

    tool = alookup if is_async else lookup
    tool.__name__ = "lookup"
    llm = ReadingLLM(respond)
    agent = FunctionAgent(name="support_bot", llm=llm, tools=[tool], streaming=False)
    return instrument(agent, POLICY, tracer_provider=provider), llm


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_ignored_nudge_is_the_tool_message_and_the_next_repeat_stops(
    spans: Any, no_leftovers: None, is_async: bool
) -> None:
    provider, exporter = spans
    body: list[str] = []
    guarded, llm = _guarded(lambda n, m: {"order_id": "A1"}, body, provider, is_async=is_async)
    raised, elapsed = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
    assert elapsed < 5
    assert isinstance(raised, RunStopped), raised
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert body == ["A1", "A1"]
    assert outcome.usage.model_turns == 4 and len(llm.seen) == 4
    assert [(n.tool, n.rung, n.result) for n in outcome.nudges] == [("lookup", 1, "stopped")]
    texts = _tool_texts(llm.seen[3])
    assert texts[:2] == ["status: pending"] * 2 and texts[2].startswith(MARK)
    assert_trace_invariants(exporter.get_finished_spans())


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_obeyed_nudge_completes_with_one_recovered_nudge(
    spans: Any, no_leftovers: None, is_async: bool
) -> None:
    provider, exporter = spans
    body: list[str] = []
    guarded, _ = _guarded(_obeying, body, provider, is_async=is_async)
    result, elapsed = _timed(lambda: guarded.run(user_msg="where is A1?", max_iterations=25))
    assert elapsed < 5
    assert not isinstance(result, BaseException), result
    assert "A2 is pending" in str(result)
    outcome = guarded.outcome
    assert outcome.stop.reason is StopReason.COMPLETED
    assert body == ["A1", "A1", "A2"]
    assert [n.result for n in outcome.nudges] == ["recovered"]
    assert_trace_invariants(exporter.get_finished_spans())
