"""Tool risk from what is known (issue 25): declared, framework, inferred from the name,
default; a write repeated with identical arguments is a duplicate intent whatever the first
call returned; a cost stop names the models and price sources behind the cost."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from loopwatch.instrumentation import (
    Decision,
    Dimension,
    Guard,
    Policy,
    Run,
    StopReason,
    StopRun,
    ToolCall,
    ToolPolicy,
    load_policy,
)
from loopwatch.instrumentation.budgets import MAX_PRICED_IN_EVIDENCE, MAX_PRICES_KEPT
from loopwatch.instrumentation.errors import PolicyError
from loopwatch.instrumentation.policy import check_policy_file
from loopwatch.instrumentation.testing import FakeClock
from loopwatch.instrumentation.tool_risk import infer_write_risk, name_words

# ------------------------------------------------------------- the name rule

WRITES = [
    "create_ticket",
    "sendEmail",
    "tickets.delete",
    "mcp__github__create_issue",
    "server/send-message",
    "CreateTicket",
    "book_reservation",
    "book_flight",
    "cancel_reservation",
    "update_status",
    "delete_history",
    "post_message",
    "order_pizza",
    "charge_card",
    "pay_invoice",
    "refund_payment",
    "transfer_funds",
    "add_to_cart",
    "make_payment",
    "place_order",
    "issue_refund",
    "upload_file",
    "submit_form",
    "publish_post",
    "exchange_delivered_order_items",
]

READS = [
    # the brief's false positives
    "get_created_at",
    "list_posts",
    "order_status",
    "post_id",
    # a verb later in the name, or a read verb after it
    "can_send_mms",
    "api_tracking_for_pack_send",
    "get_order_details",
    "order_lookup",
    "book_search",
    "update_check",
    # a noun marker or a field of the noun after an ambiguous verb
    "update_time",
    "charge_id",
    "book_details",
    "exchange_rate",
    "pay_period",
    "order_items",
    "order_book",
    "post_comments",
    "add_numbers",
    "createdAt",
    # an ambiguous verb alone, a light verb without a transaction noun
    "post",
    "order",
    "orders.order",
    "make_chart",
    # left out on purpose: idempotent or expected to repeat
    "set_status",
    "toggle_data",
    "enable_roaming",
    "reset_apn_settings",
    "reboot_device",
    "execute_bash",
    "run",
    "HTTPPost",
    "",
    "__",
    "...",
]


@pytest.mark.parametrize("name", WRITES)
def test_a_write_verb_first_is_a_likely_write(name: str) -> None:
    assert infer_write_risk(name), name_words(name)


@pytest.mark.parametrize("name", READS)
def test_not_a_write(name: str) -> None:
    assert not infer_write_risk(name), name_words(name)


def test_name_words_split_namespaces_case_and_separators() -> None:
    assert name_words("mcp__tickets__createTicket") == ("create", "ticket")
    assert name_words("tickets.delete") == ("delete",)
    assert name_words("HTTPPostRequest") == ("http", "post", "request")
    assert name_words("send-email v2") == ("send", "email", "v")
    assert name_words("") == ()


def test_the_corpus_tool_names_inferred_as_writes() -> None:
    """The 107 tool names of the recorded corpus that the rule marks: each changes a
    reservation, an order, an account or sends something (none is a lookup)."""
    corpus = [
        "book_reservation",
        "cancel_pending_order",
        "make_payment",
        "send_certificate",
        "transfer_to_human_agents",
        "update_reservation_flights",
        "get_reservation_details",
        "search_direct_flight",
        "toggle_airplane_mode",
        "refuel_data",
        "list_of_cocktails_for_the_cocktail_db",
        "str_replace_editor",
        "Search",
        "Lookup",
        "think",
        "calculate",
    ]
    assert [n for n in corpus if infer_write_risk(n)] == corpus[:6]


# ---------------------------------------------------------------- provenance


def test_risk_source_declared_framework_inferred_default() -> None:
    policy = Policy.build(
        tools=(ToolPolicy("create_report", risk="read"), ToolPolicy("notes", risk="write"))
    ).with_tool_risks({"mcp_delete": "write", "lookup_user": "read", "notes": "read"})
    assert policy.tool("create_report").risk == "read"  # the operator's word wins
    assert policy.tool("create_report").risk_source == "declared"
    assert (policy.tool("notes").risk, policy.tool("notes").risk_source) == ("write", "declared")
    assert policy.tool("mcp_delete").risk_source == "framework"
    assert (policy.tool("lookup_user").risk, policy.tool("lookup_user").risk_source) == (
        "read",
        "framework",
    )
    assert (policy.tool("create_ticket").risk, policy.tool("create_ticket").risk_source) == (
        "write",
        "inferred",
    )
    assert (policy.tool("get_ticket").risk, policy.tool("get_ticket").risk_source) == (
        "read",
        "default",
    )


def test_inference_off_in_code_and_in_a_file(tmp_path: Path) -> None:
    off = Policy.build(infer_write_risk=False)
    assert (off.tool("create_ticket").risk, off.tool("create_ticket").risk_source) == (
        "read",
        "default",
    )
    assert off.limits()["infer_write_risk"] == {"value": False, "source": "call"}
    f = tmp_path / "p.toml"
    f.write_text('[profiles.p]\nversion = "1"\ninfer_write_risk = false\n')
    loaded = load_policy(f, environ={})
    assert loaded.infer_write_risk is False and loaded.tool("create_ticket").risk == "read"
    assert loaded.limits()["infer_write_risk"] == {"value": False, "source": "file"}
    assert Policy().limits()["infer_write_risk"] == {"value": True, "source": "default"}
    later = Policy().with_overrides(infer_write_risk=False)
    assert later.limits()["infer_write_risk"] == {"value": False, "source": "call"}
    assert later.tool("create_ticket").risk_source == "default"
    with pytest.raises(PolicyError, match="infer_write_risk"):
        Policy().with_overrides(infer_write_risk="no")


def test_limits_show_declared_tool_risks_and_their_source() -> None:
    policy = Policy.build(tools=(ToolPolicy("send_email", risk="write"),)).with_tool_risks(
        {"fs_read": "read"}
    )
    limits = json.loads(policy.limits_json())
    assert limits["tools.send_email.risk"] == {"value": "write", "source": "declared"}
    assert limits["tools.fs_read.risk"] == {"value": "read", "source": "framework"}


def test_infer_write_risk_is_validated(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('[profiles.p]\nversion = "1"\ninfer_write_risk = "no"\n')
    problems = [str(p) for p in check_policy_file(f)]
    assert problems == [f"{f}: profiles.p.infer_write_risk: must be true or false"]
    cli = subprocess.run(
        [sys.executable, "-m", "loopwatch.cli", "check-policy", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 1 and "profiles.p.infer_write_risk" in cli.stdout
    with pytest.raises(PolicyError, match="infer_write_risk"):
        Policy.build(infer_write_risk=1)
    with pytest.raises(PolicyError, match="risk_source"):
        ToolPolicy("t", risk_source="guessed")  # type: ignore[arg-type]


# ------------------------------------------------------ duplicate write intent


def _guard(policy: Policy | None = None) -> Guard:
    return Guard(policy or Policy.build(), clock=FakeClock())


def _call(g: Guard, tool: str, args: dict[str, Any], result: Any) -> Any:
    """One step calling ``tool``; the stop if the call was refused, else None."""
    assert g.before_model_call().allowed
    g.record_decision(Decision.tool(ToolCall(tool, args)))
    ticket = g.before_tool_call(tool, args)
    if not ticket.allowed:
        return ticket.stop
    g.record_tool_result(ticket, result=result)
    return None


def test_the_second_identical_write_is_stopped_whatever_the_first_returned() -> None:
    g = _guard()
    args = {"title": "Printer on fire", "priority": "high"}
    assert _call(g, "create_ticket", args, {"id": "T-1", "created_at": "10:00"}) is None
    stop = _call(g, "create_ticket", args, {"id": "T-2", "created_at": "10:01"})
    assert stop is not None and stop.reason is StopReason.REPEATED_ACTION
    assert stop.step == 2 and stop.limit == 2 and stop.observed == 2
    ev = stop.evidence
    assert ev.detector == "duplicate_intent" and ev.tool == "create_ticket"
    assert ev.step_indices == (1, 2) and ev.repetitions == 2
    assert ev.detail["risk"] == "write" and ev.detail["risk_source"] == "inferred"
    usage = g.usage()
    assert (usage.tool_attempts, usage.tool_successes, usage.tool_blocked) == (1, 1, 1)


def test_a_write_with_other_arguments_is_not_a_duplicate() -> None:
    g = _guard()
    assert _call(g, "create_ticket", {"title": "a"}, {"id": 1}) is None
    assert _call(g, "create_ticket", {"title": "b"}, {"id": 2}) is None
    assert _call(g, "create_ticket", {"title": "c"}, {"id": 3}) is None
    assert not g.stopped


def test_a_declared_read_with_a_verb_like_name_is_not_stopped() -> None:
    g = _guard(Policy.build(tools=(ToolPolicy("create_report", risk="read"),)))
    args = {"month": "2026-11"}
    assert _call(g, "create_report", args, {"id": "R-1"}) is None
    assert _call(g, "create_report", args, {"id": "R-2"}) is None
    assert not g.stopped


def test_with_inference_off_a_verb_like_name_is_not_stopped() -> None:
    g = _guard(Policy.build(infer_write_risk=False))
    args = {"title": "Printer on fire"}
    assert _call(g, "create_ticket", args, {"id": "T-1"}) is None
    assert _call(g, "create_ticket", args, {"id": "T-2"}) is None
    assert not g.stopped


def test_a_framework_write_names_its_source() -> None:
    g = _guard(Policy.build().with_tool_risks({"file_issue": "write"}))
    assert _call(g, "file_issue", {"t": 1}, {"id": 1}) is None
    stop = _call(g, "file_issue", {"t": 1}, {"id": 2})
    assert stop is not None and stop.evidence.detail["risk_source"] == "framework"


def test_a_failed_write_is_judged_by_the_retry_rule() -> None:
    """Only a write that succeeded makes the next identical one a duplicate intent. A
    retry after a transient failure is the retry rule's: none for a write without an
    idempotency key (the first attempt may have acted), which an inferred write now
    gets too; with a key declared, the retry goes through."""
    g = _guard()
    assert g.before_model_call().allowed
    t = g.before_tool_call("create_ticket", {"title": "a"})
    g.record_tool_result(t, error=ConnectionResetError("reset"))
    stop = _call(g, "create_ticket", {"title": "a"}, {"id": 1})
    assert stop is not None and stop.dimension is Dimension.ACTION_RETRIES
    assert stop.evidence.detector == "retry_rule"
    keyed = ToolPolicy("create_ticket", risk="write", idempotency_key="key")
    g = _guard(Policy.build(tools=(keyed,)))
    assert g.before_model_call().allowed
    t = g.before_tool_call("create_ticket", {"title": "a", "key": "k1"})
    g.record_tool_result(t, error=ConnectionResetError("reset"))
    assert _call(g, "create_ticket", {"title": "a", "key": "k1"}, {"id": 1}) is None
    stop = _call(g, "create_ticket", {"title": "a", "key": "k2"}, {"id": 2})
    assert stop is not None and stop.evidence.detector == "duplicate_intent"


def test_through_the_run_api_the_body_runs_once() -> None:
    ids = itertools.count(1)
    created: list[int] = []

    def create_ticket(title: str) -> dict[str, Any]:
        created.append(next(ids))
        return {"id": created[-1]}

    run = Run("support", Policy.build(), tools={"create_ticket": create_ticket})
    with run:
        for _ in range(3):
            with run.model_call() as call:
                call.record(Decision.tool(ToolCall("create_ticket", {"title": "x"})))
            run.call_tool("create_ticket", {"title": "x"})
    outcome = run.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.REPEATED_ACTION
    assert outcome.stop.evidence.detector == "duplicate_intent"
    assert created == [1]


def test_stop_run_is_what_the_loop_sees() -> None:
    run = Run("support", Policy.build(), tools={"send_email": lambda to: {"id": 1}})
    run.start()
    run.call_tool("send_email", {"to": "a@x"})
    with pytest.raises(StopRun) as info:
        run.call_tool("send_email", {"to": "a@x"})
    assert info.value.stop.evidence.detail["risk_source"] == "inferred"
    run.cancel()


# --------------------------------------------------------------- cost evidence


def _turn(g: Guard, cost: float, model: Any, source: Any) -> Any:
    verdict = g.before_model_call()
    if not verdict.allowed:
        return verdict.stop
    v = g.record_decision(
        Decision.message(f"t{g.step}", cost_usd=cost, model=model, price_source=source)
    )
    return None if v.allowed else v.stop


def test_a_cost_stop_names_the_models_and_price_sources() -> None:
    g = _guard(Policy.build(max_cost_usd=1.0, repeated_decision_limit=100))
    assert _turn(g, 0.3, "gpt-4o", "genai-prices 0.0.40: openai/gpt-4o") is None
    assert _turn(g, 0.5, "claude-sonnet-4", "framework") is None
    stop = _turn(g, 0.4, "gpt-4o", "genai-prices 0.0.40: openai/gpt-4o")
    assert stop is not None and stop.reason is StopReason.BUDGET_EXHAUSTED
    assert stop.dimension is Dimension.COST and stop.basis == "observed"
    assert stop.evidence.detail["priced_by"] == [
        {"cost_usd": 0.7, "model": "gpt-4o", "price_source": "genai-prices 0.0.40: openai/gpt-4o"},
        {"cost_usd": 0.5, "model": "claude-sonnet-4", "price_source": "framework"},
    ]
    assert "priced_by_more" not in stop.evidence.detail
    assert json.loads(json.dumps(stop.to_dict()))["evidence"]["detail"]["priced_by"]


def test_a_projected_cost_stop_names_them_too() -> None:
    g = _guard(Policy.build(max_cost_usd=0.5, repeated_decision_limit=100))
    assert _turn(g, 0.5, "m", None) is None
    verdict = g.before_model_call()
    assert not verdict.allowed and verdict.stop is not None
    assert verdict.stop.basis == "projected"
    assert verdict.stop.evidence.detail["priced_by"] == [{"cost_usd": 0.5, "model": "m"}]


def test_cost_evidence_is_bounded() -> None:
    n = MAX_PRICES_KEPT + 5
    g = _guard(
        Policy.build(
            max_cost_usd=n * 0.1 - 0.05,
            max_model_turns=1000,
            repeated_decision_limit=10_000,
            no_progress_patience=1000,
        )
    )
    stop = None
    for i in range(n):
        stop = _turn(g, 0.1 + i * 1e-6, f"model-{i}", "x" * 10_000) or stop
    assert stop is not None and stop.dimension is Dimension.COST
    priced = stop.evidence.detail["priced_by"]
    assert len(priced) == MAX_PRICED_IN_EVIDENCE
    assert all(len(p.get("price_source", "")) <= 120 for p in priced)
    # The 5 pairs past the cap are summed as one, the costliest entry here.
    assert priced[0]["model"] == "other" and "price_source" not in priced[0]
    assert stop.evidence.detail["priced_by_more"] == MAX_PRICES_KEPT + 1 - MAX_PRICED_IN_EVIDENCE
    assert len(g._budget.priced) == MAX_PRICES_KEPT + 1  # the pairs past the cap: "other"


def test_a_parent_cost_stop_names_the_models_its_children_used() -> None:
    parent = _guard(Policy.build(max_cost_usd=1.0, repeated_decision_limit=100))
    assert parent.before_model_call().allowed
    child = parent.child(Policy.build(max_cost_usd=5.0, repeated_decision_limit=100))
    assert _turn(child, 0.6, "small-model", "genai-prices") is None
    stop = _turn(child, 0.6, "small-model", "genai-prices")
    assert stop is not None and stop.dimension is Dimension.COST
    assert stop.evidence.detail["priced_by"][0]["model"] == "small-model"


def test_a_decision_without_model_or_a_broken_name_still_counts() -> None:
    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    g = _guard(Policy.build(max_cost_usd=0.1, repeated_decision_limit=100))
    stop = _turn(g, 0.2, Broken(), None)
    assert stop is not None
    assert stop.evidence.detail["priced_by"] == [{"cost_usd": 0.2, "model": "Broken"}]
    g2 = _guard(Policy.build(max_cost_usd=0.1, repeated_decision_limit=100))
    stop = _turn(g2, 0.2, None, None)
    assert stop is not None and stop.evidence.detail["priced_by"] == [{"cost_usd": 0.2}]
