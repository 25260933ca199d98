"""Data for the dashboard tests: real agent runs, the real read API in-process, empty files.

Every run goes through the real instrumentation (:class:`Run`, a :class:`ScriptedModel`,
the testing kit's adversarial tools) and the real OTLP/HTTP exporter
(:func:`configure_otlp`, ``set_global=False``) into a collector: one run per stop reason,
plus the 95-step identical-call loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwatch.instrumentation import Decision, Policy, Run, ToolCall, ToolFailure
from loopwatch.instrumentation.errors import ScriptExhaustedError
from loopwatch.instrumentation.testing import (
    ConstantTool,
    CursorTool,
    FakeClock,
    OscillatingTool,
    ScriptedModel,
)

from tests.integration.services import free_port, poll_until

DASHBOARD = Path(__file__).resolve().parents[3] / "dashboard"
PAGES = DASHBOARD / "views"

CANARY = "lwcanary-7f3a9c2e51d84b06"
"""A canary value placed in one tool result; the collector's canary file lists it."""

LOOP_RUN = "dash-loop95"
"""The 95-step identical-call loop (``get_details_by_id`` x95, ``repeated_action``)."""


@dataclass(frozen=True)
class Fed:
    """The fed collector: its API URL, its file, a copy of it, the runs and their reasons."""

    api_url: str
    db_path: Path
    db_copy: Path
    expected: dict[str, str]


def call(name: str, **arguments: Any) -> Decision:
    return Decision.tool(ToolCall(name, arguments), input_tokens=100, output_tokens=20)


@dataclass
class Scenario:
    run_id: str
    reason: str
    agent: str
    policy: Policy
    script: list[Decision]
    tools: dict[str, Any] = field(default_factory=dict)
    goal_check: Callable[[Any], bool] | None = None
    clock: FakeClock | None = None
    after_steps: int | None = None
    """Cancel (``cancel``) or raise (``error``) after this many steps."""


def _scenarios() -> list[Scenario]:
    deadline_clock = FakeClock()
    return [
        Scenario(
            "dash-completed",
            "completed",
            "support",
            Policy.build(),
            [call("lookup_order", order_id="B-2"), Decision.final("shipped")],
            {"lookup_order": ConstantTool(name="lookup_order", result={"status": "shipped"})},
        ),
        Scenario(
            "dash-final-unverified",
            "final_unverified",
            "support",
            Policy.build(),
            [Decision.final("wrong")],
            goal_check=lambda answer: answer == "right",
        ),
        Scenario("dash-refused", "refused", "support", Policy.build(), [Decision.refusal("no")]),
        Scenario(
            "dash-budget",
            "budget_exhausted",
            "billing",
            Policy.build(max_model_turns=2),
            [call("search_orders", query="late", cursor=str(i)) for i in range(4)],
            {"search_orders": CursorTool()},
        ),
        Scenario(
            "dash-deadline",
            "deadline_exceeded",
            "billing",
            Policy.build(max_elapsed_seconds=30, repeated_decision_limit=10),
            [Decision.message(f"thinking {i}") for i in range(10)],
            clock=deadline_clock,
        ),
        Scenario(
            "dash-repeat",
            "repeated_action",
            "support",
            Policy.build(repeat_limit=3),
            [call("lookup_order", order_id="A-1")] * 6,
            {"lookup_order": ConstantTool(name="lookup_order", result={"note": CANARY})},
        ),
        Scenario(
            LOOP_RUN,
            "repeated_action",
            "support",
            Policy.build(
                repeat_limit=95,
                max_model_turns=200,
                max_tool_attempts=200,
                max_tool_successes=200,
                no_progress_patience=200,
                detector_window=128,
            ),
            [call("get_details_by_id", id=7)] * 100,
            {"get_details_by_id": ConstantTool(result={"id": 7, "status": "unchanged"})},
        ),
        Scenario(
            "dash-cycle",
            "action_cycle",
            "billing",
            Policy.build(cycle_max_period=4, cycle_repetitions=2),
            [call("open_ticket", id=1), call("close_ticket", id=1)] * 6,
            {
                "open_ticket": ConstantTool(name="open_ticket", result={"open": True}),
                "close_ticket": ConstantTool(name="close_ticket", result={"open": False}),
            },
        ),
        Scenario(
            "dash-decision",
            "repeated_decision",
            "support",
            Policy.build(repeated_decision_limit=3),
            [Decision.message("")] * 5,
        ),
        Scenario(
            "dash-no-progress",
            "no_progress",
            "billing",
            Policy.build(no_progress_patience=4, repeat_limit=3),
            [call("toggle_state")] * 20,
            {"toggle_state": OscillatingTool()},
        ),
        Scenario(
            "dash-cancelled",
            "cancelled",
            "support",
            Policy.build(),
            [call("lookup_order", order_id="C-3")] * 3,
            {"lookup_order": ConstantTool(name="lookup_order")},
            after_steps=1,
        ),
        Scenario(
            "dash-error",
            "error",
            "billing",
            Policy.build(),
            [call("lookup_order", order_id="D-4")] * 3,
            {"lookup_order": ConstantTool(name="lookup_order")},
            after_steps=1,
        ),
    ]


class _InfrastructureFailure(RuntimeError):
    """What the ``error`` scenario raises inside its run."""


def _drive(scenario: Scenario, provider: Any) -> str:
    model = ScriptedModel(
        scenario.script,
        tick=scenario.clock,
        seconds_per_call=10.0 if scenario.clock is not None else 0.0,
    )
    kwargs: dict[str, Any] = {"clock": scenario.clock} if scenario.clock is not None else {}
    try:
        with Run(
            scenario.agent,
            scenario.policy,
            tools=scenario.tools,
            goal_check=scenario.goal_check,
            capture_content=True,
            run_id=scenario.run_id,
            tracer_provider=provider,
            **kwargs,
        ) as run:
            steps = 0
            while True:
                if scenario.after_steps is not None and steps >= scenario.after_steps:
                    if scenario.reason == "cancelled":
                        run.cancel()
                        break
                    raise _InfrastructureFailure("database connection lost")
                decision = run.decide(model)
                steps += 1
                if decision.type == "final":
                    run.finish(decision.answer)
                    break
                for tool_call in decision.tool_calls:
                    with contextlib.suppress(ToolFailure):
                        run.call_tool(tool_call.name, tool_call.arguments)
    except _InfrastructureFailure:
        pass
    except ScriptExhaustedError as exc:
        raise AssertionError(f"{scenario.run_id}: script too short") from exc
    return str(run.outcome.stop.reason.value)


def emit_all(otlp_url: str) -> dict[str, str]:
    """Run every scenario, export its spans to ``otlp_url``; returns ``{run_id: reason}``.

    Raises:
        AssertionError: a scenario did not stop with its expected reason.
    """
    from loopwatch.instrumentation.otlp import configure_otlp

    provider = configure_otlp(
        endpoint=otlp_url,
        service_name="loopwatch-dashboard-test",
        timeout_seconds=10.0,
        schedule_delay_millis=50,
        set_global=False,
    )
    expected: dict[str, str] = {}
    try:
        for scenario in _scenarios():
            got = _drive(scenario, provider)
            if got != scenario.reason:
                raise AssertionError(f"{scenario.run_id} stopped as {got}, not {scenario.reason}")
            expected[scenario.run_id] = scenario.reason
    finally:
        provider.force_flush()
        provider.shutdown()
    return expected


ALL_REASONS = (
    "completed",
    "final_unverified",
    "refused",
    "budget_exhausted",
    "deadline_exceeded",
    "repeated_action",
    "action_cycle",
    "repeated_decision",
    "no_progress",
    "cancelled",
    "error",
)


@contextlib.contextmanager
def serve_api(db: Path, *, token: str | None = None) -> Iterator[str]:
    """The collector's real read API (``create_api_app``) over ``db``, in this process.

    Yields the base URL; the server runs on a free port in a thread until the block ends.
    """
    import uvicorn
    from loopwatch.collector.api import create_api_app
    from loopwatch.collector.store import StoreReader

    reader = StoreReader.open_readonly(db)
    app = create_api_app(reader, metrics=lambda: b"", health=lambda: {"status": "ok"}, token=token)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        poll_until(lambda: server.started, timeout_seconds=10, what="in-process API")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        reader.close()


def empty_database(path: Path) -> Path:
    """A loopwatch database with the schema and no rows."""
    import duckdb
    from loopwatch.collector.store import apply_migrations

    con = duckdb.connect(str(path))
    apply_migrations(con)
    con.close()
    return path


def open_expanders(at: Any) -> Any:
    """Open every tracked expander of the page an ``AppTest`` ran (the run view's step
    rows and chart send their content only once opened) and run it again; returns it.

    A tracked expander's widget id ends with its key (``$$ID-<hash>-<key>``): setting that
    key in Session State opens it, as a click does.
    """
    closed = [e.proto.id.split("-", 2)[2] for e in at.expander if e.proto.id.startswith("$$ID-")]
    for key in closed:
        at.session_state[key] = True
    return at.run() if closed else at
