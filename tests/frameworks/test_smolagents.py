"""Live tests of the smolagents adapter (route B): ToolCallingAgent and CodeAgent driven by
a scripted model (a ``smolagents.Model`` subclass whose ``generate`` returns scripted
``ChatMessage`` objects), no network. smolagents has no async run, so there is no async
path to test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("smolagents")

from loopwatch.instrumentation import Policy, StopReason, StopRun, ToolPolicy
from loopwatch.instrumentation import runs as _runs
from loopwatch.instrumentation.integrations.smolagents import instrument
from smolagents import CodeAgent, Model, ToolCallingAgent, tool
from smolagents.memory import ActionStep
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
)
from smolagents.monitoring import LogLevel, TokenUsage


@pytest.fixture(autouse=True, scope="module")
def _tool_workers_started() -> None:
    """Start loopwatch's shared tool worker threads before any test: the adapter runs
    tool bodies there (under the per-call timeout), and a pool worker idling after a run
    is the process's pool, not a thread the run left behind (``no_leftovers``)."""
    release = threading.Event()
    pool = _runs._tool_executor()
    futures = [pool.submit(release.wait, 5) for _ in range(4)]
    release.set()
    for future in futures:
        future.result()


class ScriptedModel(Model):
    """A model whose n-th turn (1-based) is ``script(n)``; each turn reports 10 input and
    5 output tokens, as a provider's usage would."""

    def __init__(self, script: Callable[[int], ChatMessage], model_id: str = "scripted") -> None:
        super().__init__(model_id=model_id)
        self.script = script
        self.turns = 0

    def generate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatMessage:
        self.turns += 1
        message = self.script(self.turns)
        message.token_usage = TokenUsage(input_tokens=10, output_tokens=5)
        return message


def call(name: str, n: int, **args: Any) -> ChatMessage:
    function = ChatMessageToolCallFunction(name=name, arguments=args)
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[ChatMessageToolCall(id=f"call_{n}", type="function", function=function)],
    )


def tool_agent(
    script: Callable[[int], ChatMessage], tools: list[Any], **kw: Any
) -> ToolCallingAgent:
    return ToolCallingAgent(
        tools=tools,
        model=ScriptedModel(script),
        name="smol_support",
        verbosity_level=LogLevel.OFF,
        **kw,
    )


def run_spans(exporter: Any) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]


def make_lookup(bodies: list[str]) -> Any:
    @tool
    def lookup(q: str) -> str:
        """Look an order up.

        Args:
            q: the order to look up.
        """
        bodies.append(q)
        return "order 7: pending"

    return lookup


def test_runaway_tool_calling_agent_stops_as_repeated_action(
    spans: Any, no_leftovers: None
) -> None:
    provider, exporter = spans
    bodies: list[str] = []
    agent = tool_agent(lambda n: call("lookup", n, q="order 7"), [make_lookup(bodies)])
    guard = instrument(agent, Policy(repeat_limit=3), tracer_provider=provider)
    began = time.monotonic()
    with pytest.raises(StopRun) as raised:
        agent.run("Where is order 7?")
    assert time.monotonic() - began < 5
    assert raised.value.stop.reason is StopReason.REPEATED_ACTION
    outcome = guard.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(bodies) <= 3
    assert outcome.usage.model_turns >= 3
    assert outcome.usage.tokens == 15 * outcome.usage.model_turns
    assert len(set(outcome.stop.evidence.step_indices)) > 1  # steps advance per turn
    assert agent.interrupt_switch  # smolagents' own stop is set too
    (run_span,) = run_spans(exporter)  # named agent.name, never "smol_support.run"
    assert run_span.name == "invoke_agent smol_support"


def test_succeeding_agent_completes(no_leftovers: None) -> None:
    bodies: list[str] = []

    def script(n: int) -> ChatMessage:
        return (
            call("lookup", n, q="order 7") if n == 1 else call("final_answer", n, answer="pending")
        )

    agent = tool_agent(script, [make_lookup(bodies)])
    guard = instrument(agent)
    assert agent.run("Where is order 7?") == "pending"
    outcome = guard.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.COMPLETED
    assert outcome.answer == "pending"
    assert (outcome.usage.model_turns, outcome.usage.tool_successes, bodies) == (2, 1, ["order 7"])


def test_paginating_agent_is_not_stopped(no_leftovers: None) -> None:
    @tool
    def list_orders(page: int) -> str:
        """List one page of orders.

        Args:
            page: the page number.
        """
        return f"orders {page * 10}..{page * 10 + 9}"

    def script(n: int) -> ChatMessage:
        return call("list_orders", n, page=n) if n <= 6 else call("final_answer", n, answer="60")

    agent = tool_agent(script, [list_orders])
    guard = instrument(agent, Policy(repeat_limit=3))
    assert agent.run("How many orders?") == "60"
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.COMPLETED
    assert guard.outcome.usage.tool_successes == 6


def test_duplicate_write_is_stopped_at_the_second_call(no_leftovers: None) -> None:
    created: list[str] = []

    @tool
    def create_ticket(title: str) -> str:
        """Open a support ticket.

        Args:
            title: the ticket's title.
        """
        created.append(title)
        return f"ticket #{len(created)} created"  # a new id each call: still a duplicate

    agent = tool_agent(lambda n: call("create_ticket", n, title="refund"), [create_ticket])
    policy = Policy(tools={"create_ticket": ToolPolicy(name="create_ticket", risk="write")})
    guard = instrument(agent, policy)
    with pytest.raises(StopRun):
        agent.run("Open a refund ticket")
    assert created == ["refund"]
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert (guard.outcome.usage.tool_attempts, guard.outcome.usage.tool_blocked) == (1, 1)


def test_max_steps_is_budget_exhausted_on_model_turns(no_leftovers: None) -> None:
    @tool
    def list_orders(page: int) -> str:
        """List one page of orders.

        Args:
            page: the page number.
        """
        return f"orders page {page}"

    def script(n: int) -> ChatMessage:
        if n <= 3:
            return call("list_orders", n, page=n)
        return ChatMessage(role=MessageRole.ASSISTANT, content="I could not finish.")

    agent = tool_agent(script, [list_orders], max_steps=3)
    guard = instrument(agent, Policy(repeat_limit=3))
    # smolagents answers as usual after max_steps: one more model call for a final answer
    assert agent.run("List every order") == "I could not finish."
    outcome = guard.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.BUDGET_EXHAUSTED
    assert outcome.stop.dimension == "model_turns"
    assert (outcome.stop.limit, outcome.stop.observed) == (3, 3)
    assert outcome.stop.evidence.detail == {"framework": "smolagents", "limit": "max_steps"}
    assert outcome.usage.model_turns == 4  # three steps and the forced final answer


def test_model_turn_refused_before_the_request(no_leftovers: None) -> None:
    @tool
    def list_orders(page: int) -> str:
        """List one page of orders.

        Args:
            page: the page number.
        """
        return f"orders page {page}"

    agent = tool_agent(lambda n: call("list_orders", n, page=n), [list_orders])
    guard = instrument(agent, Policy(max_model_turns=2))
    with pytest.raises(StopRun):
        agent.run("List every order")
    assert agent.model.turns == 2  # the third turn never reached the model
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.BUDGET_EXHAUSTED


def test_runaway_code_agent_stops_with_tools_run_in_its_executor(no_leftovers: None) -> None:
    bodies: list[str] = []

    def script(n: int) -> ChatMessage:
        code = f"Thought: look it up.\n<code>\nprint(lookup(q='order 7'))  # attempt {n}\n</code>"
        return ChatMessage(role=MessageRole.ASSISTANT, content=code)

    agent = CodeAgent(
        tools=[make_lookup(bodies)],
        model=ScriptedModel(script),
        name="smol_coder",
        verbosity_level=LogLevel.OFF,
    )
    guard = instrument(agent, Policy(repeat_limit=3))
    began = time.monotonic()
    with pytest.raises(StopRun):
        agent.run("Where is order 7?")
    assert time.monotonic() - began < 5
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(bodies) <= 3
    assert guard.outcome.usage.model_turns >= 3


def test_streamed_run_stops(no_leftovers: None) -> None:
    bodies: list[str] = []
    agent = tool_agent(lambda n: call("lookup", n, q="order 7"), [make_lookup(bodies)])
    guard = instrument(agent, Policy(repeat_limit=3))
    steps = []
    with pytest.raises(StopRun):
        for step in agent.run("Where is order 7?", stream=True):
            steps.append(step)
    assert steps
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.REPEATED_ACTION
    assert len(bodies) <= 3


def test_instrument_hooks_once() -> None:
    agent = tool_agent(lambda n: call("final_answer", n, answer="x"), [make_lookup([])])
    first = instrument(agent)
    assert instrument(agent) is first
    assert agent.run("go") == "x"
    assert first.outcome is not None
    assert first.outcome.usage.model_turns == 1


def test_streamed_run_abandoned_by_its_reader_is_cancelled(no_leftovers: None) -> None:
    agent = tool_agent(lambda n: call("lookup", n, q=f"order {n}"), [make_lookup([])])
    guard = instrument(agent)
    stream = agent.run("Where is order 7?", stream=True)
    # Closed after a whole step: closed inside one, smolagents' own generator yields from
    # its finally block and Python reports that it ignored GeneratorExit.
    while not isinstance(next(stream), ActionStep):
        pass
    stream.close()
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.CANCELLED


def test_cost_comes_from_the_price_table(no_leftovers: None) -> None:
    agent = ToolCallingAgent(
        tools=[make_lookup([])],
        model=ScriptedModel(lambda n: call("final_answer", n, answer="x"), "openai/gpt-4o"),
        verbosity_level=LogLevel.OFF,
    )
    guard = instrument(agent)
    agent.run("go")
    assert guard.outcome is not None
    # genai-prices: gpt-4o at $2.50 / $10 per million input / output tokens
    assert guard.outcome.usage.cost_usd == pytest.approx((10 * 2.5 + 5 * 10) / 1e6)
    assert guard.outcome.stop.reason is StopReason.COMPLETED


def test_managed_agent_runs_as_a_child_run(spans: Any, no_leftovers: None) -> None:
    provider, exporter = spans
    bodies: list[str] = []

    def worker_script(n: int) -> ChatMessage:
        return call("lookup", n, q="order 7") if n == 1 else call("final_answer", n, answer="ok")

    worker = ToolCallingAgent(
        tools=[make_lookup(bodies)],
        model=ScriptedModel(worker_script),
        name="smol_worker",
        description="Looks orders up.",
        verbosity_level=LogLevel.OFF,
    )

    def manager_script(n: int) -> ChatMessage:
        if n == 1:
            return call("smol_worker", n, task="find order 7")
        return call("final_answer", n, answer="done")

    manager = tool_agent(manager_script, [], managed_agents=[worker])
    guard = instrument(manager, tracer_provider=provider)
    worker_guard = instrument(worker)
    assert manager.run("Where is order 7?") == "done"
    assert guard.outcome is not None and worker_guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.COMPLETED
    assert worker_guard.outcome.stop.reason is StopReason.COMPLETED
    assert bodies == ["order 7"]
    names = sorted(s.name for s in run_spans(exporter))
    assert names == ["invoke_agent smol_support", "invoke_agent smol_worker"]
    by_name = {s.name: s for s in run_spans(exporter)}
    child = by_name["invoke_agent smol_worker"]
    assert child.parent is not None  # the child run's span sits under its manager's


def test_a_hanging_tool_is_cut_at_the_policy_timeout(no_leftovers: None) -> None:
    release = threading.Event()

    @tool
    def lookup(q: str) -> str:
        """Look an order up.

        Args:
            q: the order to look up.
        """
        release.wait(30)  # hangs until the test ends
        return "order 7: pending"

    def script(n: int) -> ChatMessage:
        return call("lookup", n, q="order 7") if n == 1 else call("final_answer", n, answer="?")

    agent = tool_agent(script, [lookup])
    guard = instrument(agent, Policy(tool_timeout_seconds=0.3))
    began = time.monotonic()
    try:
        assert agent.run("Where is order 7?") == "?"
        assert time.monotonic() - began < 5  # a hanging body used to hang the run forever
    finally:
        release.set()
    outcome = guard.outcome
    assert outcome is not None
    assert outcome.stop.reason is StopReason.COMPLETED
    assert (outcome.usage.tool_errors, outcome.usage.tool_successes) == (1, 0)
    assert "timed out" in str(agent.memory.steps[1].error)


def test_a_transient_tool_failure_may_be_retried(no_leftovers: None) -> None:
    calls: list[str] = []

    @tool
    def lookup(q: str) -> str:
        """Look an order up.

        Args:
            q: the order to look up.
        """
        calls.append(q)
        if len(calls) == 1:
            raise ConnectionError("upstream reset the connection")
        return "order 7: pending"

    def script(n: int) -> ChatMessage:
        return call("lookup", n, q="order 7") if n <= 2 else call("final_answer", n, answer="ok")

    agent = tool_agent(script, [lookup])
    guard = instrument(agent, Policy(repeat_limit=3))
    assert agent.run("Where is order 7?") == "ok"
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.COMPLETED
    assert (guard.outcome.usage.tool_errors, guard.outcome.usage.retries) == (1, 1)


def test_observe_mode_refuses_nothing_and_records_the_would_stop(no_leftovers: None) -> None:
    bodies: list[str] = []

    def script(n: int) -> ChatMessage:
        return call("lookup", n, q="order 7") if n <= 5 else call("final_answer", n, answer="ok")

    agent = tool_agent(script, [make_lookup(bodies)])
    guard = instrument(agent, Policy(repeat_limit=3), mode="observe")
    assert agent.run("Where is order 7?") == "ok"
    assert len(bodies) == 5
    assert guard.outcome is not None
    assert guard.outcome.stop.reason is StopReason.COMPLETED
    assert guard.outcome.observed_stops[0].reason is StopReason.REPEATED_ACTION


def test_an_a_b_a_b_cycle_over_two_tools_stops_as_action_cycle(no_leftovers: None) -> None:
    bodies: list[str] = []

    @tool
    def status(q: str) -> str:
        """The order's status.

        Args:
            q: the order.
        """
        bodies.append("status")
        return "pending"

    agent = tool_agent(
        lambda n: call("lookup" if n % 2 else "status", n, q="order 7"),
        [make_lookup(bodies), status],
    )
    guard = instrument(agent, Policy(repeat_limit=3))
    with pytest.raises(StopRun) as raised:
        agent.run("Where is order 7?")
    assert raised.value.stop.reason is StopReason.ACTION_CYCLE
    assert len(bodies) <= 6
    assert guard.outcome is not None and guard.outcome.usage.model_turns > 0


def test_the_same_agent_run_again_gets_a_fresh_run_and_budget(no_leftovers: None) -> None:
    bodies: list[str] = []
    agent = tool_agent(lambda n: call("lookup", n, q="order 7"), [make_lookup(bodies)])
    guard = instrument(agent, Policy(repeat_limit=3))
    ids = set()
    for expected in (2, 4):
        with pytest.raises(StopRun):
            agent.run("Where is order 7?")  # smolagents resets its interrupt per run
        assert guard.outcome is not None
        assert guard.outcome.stop.reason is StopReason.REPEATED_ACTION
        assert guard.outcome.usage.tool_attempts == 2  # the third identical call is blocked
        assert len(bodies) == expected
        ids.add(guard.outcome.run_id)
    assert len(ids) == 2
