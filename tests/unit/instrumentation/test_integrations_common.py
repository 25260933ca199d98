"""What every framework adapter shares: the price of a turn, the turn as a Decision, the
missing-extra error, and a stop made by the framework's own limit."""

from __future__ import annotations

import pytest
from loopwatch.instrumentation import DecisionType, Dimension, Run, StopReason
from loopwatch.instrumentation.integrations import _common
from loopwatch.instrumentation.integrations._common import (
    Price,
    import_framework,
    price_of,
    turn_decision,
)

genai_prices = pytest.importorskip("genai_prices")


def _table_price(model: str, provider: str, tin: int, tout: int) -> float:
    usage = genai_prices.Usage(input_tokens=tin, output_tokens=tout)
    return float(genai_prices.calc_price(usage, model, provider_id=provider).total_price)


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("gpt-4o", None),
        ("openai:gpt-4o", None),  # pydantic-ai's provider:model
        ("openai/gpt-4o", None),  # LiteLLM's provider/model (smolagents)
        ("gpt-4o", "scriptedchatmodel"),  # LangChain's ls_provider is no price-table id
        ("gpt-4o", "openai"),
    ],
)
def test_a_turn_is_priced_from_the_table_and_says_so(model: str, provider: str | None) -> None:
    price = price_of(model, 1000, 500, provider=provider)
    assert price.cost_usd == pytest.approx(_table_price("gpt-4o", "openai", 1000, 500))
    assert price.cost_usd > 0
    assert price.source == f"genai-prices {genai_prices.__version__}: openai/gpt-4o"


def test_a_cost_the_framework_reported_wins() -> None:
    assert price_of("gpt-4o", 1000, 500, reported_cost_usd=0.5) == Price(0.5, "framework")


@pytest.mark.parametrize(
    ("model", "tin", "tout"), [("scripted-model", 10, 10), (None, 10, 10), ("gpt-4o", 0, 0)]
)
def test_an_unknown_model_or_no_usage_costs_nothing(model: str | None, tin: int, tout: int) -> None:
    assert price_of(model, tin, tout) == Price(0.0, None)


def test_a_model_the_table_does_not_know_is_looked_up_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_common, "_UNPRICED", set())
    calls: list[str] = []
    real = genai_prices.calc_price

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(str(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(genai_prices, "calc_price", counting)
    assert price_of("local-llama", 5, 5) == Price(0.0, None)
    looked = len(calls)
    assert looked >= 1
    assert price_of("local-llama", 5, 5) == Price(0.0, None)
    assert len(calls) == looked


def test_a_turn_becomes_the_decision_the_guard_reads() -> None:
    tool = turn_decision(
        [("search", {"q": "x"}, "c1"), ("lookup", "raw text", None)],
        input_tokens=3,
        output_tokens=4,
        cost_usd=0.01,
        model="gpt-4o",
        price_source="framework",
    )
    assert tool.type is DecisionType.TOOL
    assert [(c.name, dict(c.arguments), c.call_id) for c in tool.tool_calls] == [
        ("search", {"q": "x"}, "c1"),
        ("lookup", {"input": "raw text"}, None),
    ]
    assert (tool.input_tokens, tool.output_tokens, tool.cost_usd) == (3, 4, 0.01)
    assert (tool.model, tool.price_source) == ("gpt-4o", "framework")
    final = turn_decision([], final="done", text="ignored")
    assert (final.type, final.answer, final.text) == (DecisionType.FINAL, "done", None)
    message = turn_decision([], text="thinking")
    assert (message.type, message.text) == (DecisionType.MESSAGE, "thinking")


def test_a_missing_framework_names_the_extra_to_install() -> None:
    with pytest.raises(ImportError, match=r"pip install 'loopwatch\[crewai\]'"):
        import_framework("no_such_framework_module.sub", "crewai")


def test_a_framework_limit_ends_the_run_with_its_evidence() -> None:
    with Run("support") as run:
        with run.model_call():
            pass
        outcome = run.framework_stop(
            StopReason.BUDGET_EXHAUSTED,
            framework="openai-agents",
            limit_name="MaxTurnsExceeded",
            dimension=Dimension.MODEL_TURNS,
            limit=3,
            observed=4,
        )
    stop = outcome.stop
    assert (stop.reason, stop.dimension, stop.limit, stop.observed, stop.basis) == (
        StopReason.BUDGET_EXHAUSTED,
        Dimension.MODEL_TURNS,
        3,
        4,
        "observed",
    )
    assert stop.evidence.detector == "framework_limit"
    assert dict(stop.evidence.detail) == {"framework": "openai-agents", "limit": "MaxTurnsExceeded"}
    assert run.outcome is outcome or run.outcome.stop == stop
    # A later stop does not replace it.
    again = run.guard.framework_stop(StopReason.REPEATED_ACTION, framework="x", limit_name="y")
    assert again.stop.reason is StopReason.BUDGET_EXHAUSTED


def test_a_framework_stop_ends_the_run_in_observe_mode_too() -> None:
    with Run("support", mode="observe") as run:
        outcome = run.framework_stop(
            StopReason.REPEATED_ACTION, framework="crewai", limit_name="repeated_call", tool="t"
        )
    assert outcome.stop.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.evidence.tool == "t"


class _Annotations:
    def __init__(self, **hints: object) -> None:
        self.__dict__.update(hints)


@pytest.mark.parametrize(
    ("annotations", "risk"),
    [
        (None, None),
        ({}, None),
        ({"readOnlyHint": True}, "read"),
        (
            {"readOnlyHint": True, "destructiveHint": True},
            "read",
        ),  # destructive: only if not read-only
        ({"readOnlyHint": False}, "write"),
        ({"readOnlyHint": False, "destructiveHint": False}, "write"),  # additive writes too
        ({"destructiveHint": True}, "write"),
        ({"idempotentHint": True}, None),
        ({"read_only_hint": True}, "read"),
        (_Annotations(readOnlyHint=True), "read"),
        (_Annotations(destructiveHint=True), "write"),
        (_Annotations(read_only_hint=False), "write"),
    ],
)
def test_mcp_annotations_give_a_tool_its_risk(annotations: object, risk: str | None) -> None:
    assert _common.mcp_risk(annotations) == risk
