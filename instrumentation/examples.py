"""Example agent runs covering every stop reason and the seven adversarial tool shapes.

Each example is a real guarded run: a scripted model (the decisions a real model made in
the recorded shape), real tool callables from :mod:`.testing`, and a policy. They feed a
collector with real-shaped spans when no recorded corpus is at hand (``scripts/up.sh``,
``loopwatch demo``), and they double as documentation of what each stop looks like.

Example::

    from loopwatch.instrumentation.examples import run_examples
    outcomes = run_examples(tracer_provider=provider)   # {example name: Outcome}
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import TracerProvider

from .failures import ToolFailure
from .outcomes import Decision, Outcome, ToolCall
from .policy import Policy, ToolPolicy
from .runs import Run
from .testing import (
    ConstantTool,
    CursorTool,
    ErrorTool,
    EventualTool,
    FakeClock,
    FalseProgressTool,
    HangingTool,
    OscillatingTool,
    ScriptedModel,
)

__all__ = ["EXAMPLES", "Example", "run_example", "run_examples"]


def _call(name: str, **args: Any) -> Decision:
    return Decision.tool(ToolCall(name, args), input_tokens=850, output_tokens=40, cost_usd=0.0012)


def _final(answer: str) -> Decision:
    return Decision.final(answer, input_tokens=900, output_tokens=120, cost_usd=0.0015)


@dataclass(frozen=True)
class Example:
    """One example run.

    Attributes:
        name: identifier (also the expected behaviour in words).
        agent: agent name.
        expected: the stop reason the run ends with.
        script: builds the scripted decisions.
        tools: builds ``{tool name: callable}``.
        policy: the policy.
        goal: optional goal check.
        clock_seconds_per_turn: simulated model latency on the fake clock.
        mode: ``enforce`` or ``observe``.
    """

    name: str
    agent: str
    expected: str
    script: Callable[[], list[Decision]]
    tools: Callable[[], dict[str, Callable[..., Any]]] = dict
    policy: Policy = field(default_factory=Policy)
    goal: Callable[[Any], bool] | None = None
    clock_seconds_per_turn: float = 1.0
    mode: str = "enforce"


def _policy(name: str, **limits: Any) -> Policy:
    """A profile of the examples' one policy version."""
    return Policy.build(name=name, version="2026-11-30", **limits)


EXAMPLES: tuple[Example, ...] = (
    Example(
        "answers after paging through search results (cursor tool)",
        "support",
        "completed",
        lambda: (
            [_call("search_orders", query="late", cursor=c) for c in (None, "1", "2")]
            + [_final("3 late orders")]
        ),
        lambda: {"search_orders": CursorTool(pages=3)},
        _policy("investigate-readonly", repeat_limit=3),
    ),
    Example(
        "polls a job until it is done (eventual tool)",
        "ops",
        "completed",
        lambda: [_call("poll_job", job="j-17")] * 3 + [_final("job done")],
        lambda: {"poll_job": EventualTool(pending_calls=2)},
        _policy("poller", tools=(ToolPolicy("poll_job", repeat_limit=4),)),
    ),
    Example(
        "same lookup 95 times with the same answer (constant tool)",
        "support",
        "repeated_action",
        lambda: [_call("get_details_by_id", id="ORD-4471")] * 95,
        lambda: {"get_details_by_id": ConstantTool()},
        _policy("investigate-readonly", max_model_turns=200, repeat_limit=3),
    ),
    Example(
        "status check where only the timestamp changes (false-progress tool)",
        "ops",
        "repeated_action",
        lambda: [_call("check_status", service="billing")] * 10,
        lambda: {"check_status": FalseProgressTool()},
    ),
    Example(
        "A-B-A-B between two lookups",
        "support",
        "action_cycle",
        lambda: [_call("get_customer", id=7), _call("get_orders", customer=7)] * 5,
        lambda: {
            "get_customer": ConstantTool(name="get_customer", result={"id": 7}),
            "get_orders": ConstantTool(name="get_orders", result=[]),
        },
    ),
    Example(
        "toggles a setting back and forth (oscillating tool)",
        "ops",
        "no_progress",
        lambda: [_call("toggle_state", flag="maintenance")] * 12,
        lambda: {"toggle_state": OscillatingTool()},
        _policy("change-small", no_progress_patience=4),
    ),
    Example(
        "rewrites its plan forever",
        "planner",
        "repeated_decision",
        lambda: (
            [
                Decision.message("Plan: 1) search 2) summarize"),
                Decision.message("Plan: 1) ask the user"),
            ]
            * 4
        ),
    ),
    Example(
        "retries an upstream 503 (error tool, retryable)",
        "billing",
        "budget_exhausted",
        lambda: [_call("fetch_invoice", id="INV-9")] * 6,
        lambda: {"fetch_invoice": ErrorTool(retryable=True)},
        _policy("external-read", max_retries_per_action=2),
    ),
    Example(
        "retries an invalid argument (error tool, non-retryable)",
        "billing",
        "budget_exhausted",
        lambda: [_call("fetch_invoice", id="not-an-id")] * 3,
        lambda: {"fetch_invoice": ErrorTool(retryable=False)},
    ),
    Example(
        "calls many tools in one turn",
        "research",
        "budget_exhausted",
        lambda: [
            Decision.tool(
                *[ToolCall("fetch_page", {"url": f"https://example.org/{i}"}) for i in range(20)]
            )
        ],
        lambda: {"fetch_page": ConstantTool(name="fetch_page", result={"ok": True})},
        _policy("investigate-readonly", max_tool_attempts=12),
    ),
    Example(
        "export hangs past the deadline (hanging tool)",
        "ops",
        "deadline_exceeded",
        lambda: (
            [_call("slow_export", table="orders")]
            + [Decision.message(f"waiting {i}") for i in range(6)]
        ),
        lambda: {"slow_export": HangingTool(max_seconds=0.3)},
        _policy("change-small", max_elapsed_seconds=4, tool_timeout_seconds=0.1),
    ),
    Example(
        "answers, but the goal check fails",
        "support",
        "final_unverified",
        lambda: [_call("search_orders", query="refund"), _final("Refund issued")],
        lambda: {"search_orders": CursorTool(pages=1)},
        goal=lambda answer: "REF-" in str(answer),
    ),
    Example(
        "refuses the task",
        "support",
        "refused",
        lambda: [Decision.refusal("I can't share another customer's address.")],
    ),
    Example(
        "loops unnoticed in observe mode, then answers",
        "support",
        "completed",
        lambda: [_call("get_details_by_id", id="ORD-1")] * 4 + [_final("shipped")],
        lambda: {"get_details_by_id": ConstantTool()},
        mode="observe",
    ),
)


def run_example(
    example: Example, *, tracer_provider: TracerProvider | None = None, run_id: str | None = None
) -> Outcome:
    """Run one example through the real instrumentation and return its outcome.

    Tool failures are fed back to the loop the way an agent shows them to its model.
    ``cancelled`` and ``error`` are shown by :func:`run_examples` (a cancelled run and a
    crashing loop).
    """
    clock = FakeClock()
    model = ScriptedModel(
        example.script(), tick=clock, seconds_per_call=example.clock_seconds_per_turn
    )
    tools = example.tools()
    run = Run(
        example.agent,
        example.policy,
        mode="observe" if example.mode == "observe" else "enforce",
        goal_check=example.goal,
        tools=tools or None,
        clock=clock,
        tracer_provider=tracer_provider,
        run_id=run_id,
    )
    with run:
        while True:
            decision = run.decide(model)
            if decision.type.value == "final":
                run.finish(decision.answer)
                break
            for call in decision.tool_calls:
                with contextlib.suppress(ToolFailure, TimeoutError):
                    run.call_tool(call.name, call.arguments, call_id=call.call_id)
    for tool in tools.values():
        release = getattr(tool, "release", None)
        if callable(release):
            release()
    return run.outcome


def _cancelled(tracer_provider: TracerProvider | None) -> Outcome:
    with Run("support", Policy(), tracer_provider=tracer_provider, clock=FakeClock()) as run:
        run.decide(lambda: _call("search_orders", query="x"))
        run.call_tool("search_orders", {"query": "x"}, fn=CursorTool(pages=1))
        run.cancel()
    return run.outcome


def _crashed(tracer_provider: TracerProvider | None) -> Outcome:
    run = Run("support", Policy(), tracer_provider=tracer_provider, clock=FakeClock())
    try:
        with run:
            run.decide(lambda: _call("search_orders", query="x"))
            raise ConnectionResetError("vector store connection lost")
    except ConnectionResetError:
        pass
    return run.outcome


def run_examples(*, tracer_provider: TracerProvider | None = None) -> Mapping[str, Outcome]:
    """Run every example (and a cancelled and a crashing run); ``{name: outcome}``."""
    outcomes = {ex.name: run_example(ex, tracer_provider=tracer_provider) for ex in EXAMPLES}
    outcomes["cancelled by the caller"] = _cancelled(tracer_provider)
    outcomes["the loop itself crashes"] = _crashed(tracer_provider)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    """``python -m loopwatch.instrumentation.examples [--otlp URL]``: send every example.

    Prints one line per run (stop reason and example). Needs the ``otlp`` extra.
    """
    import argparse

    from .otlp import DEFAULT_ENDPOINT, configure_otlp

    parser = argparse.ArgumentParser(description="Send loopwatch's example runs to a collector.")
    parser.add_argument("--otlp", default=DEFAULT_ENDPOINT, help="OTLP/HTTP traces URL")
    args = parser.parse_args(argv)
    provider = configure_otlp(
        endpoint=args.otlp, service_name="loopwatch-examples", set_global=False
    )
    try:
        for name, outcome in run_examples(tracer_provider=provider).items():
            print(f"{outcome.stop.reason.value:<18} {name}")
    finally:
        provider.shutdown()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
