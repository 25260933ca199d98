"""Issue 28: every stop in one sentence from its evidence, the loop's repeated call with
its content (or how to capture it), run ids by their distinguishing part, and the
deep-link base URL hint."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from loopwatch.dashboard import explain, frames, runview
from loopwatch.dashboard.server import BaseUrlHint, base_url_script
from loopwatch.instrumentation import StopReason

EVIDENCE: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "completed": ({}, {"detector": "goal_check"}, "passed its goal check"),
    "final_unverified": ({}, {}, "failed its goal check"),
    "refused": ({"step": 2}, {}, "refused the task"),
    "budget_exhausted": (
        {"step": 5, "dimension": "action_retries", "limit_value": 0.0, "observed": 1.0},
        {"tool": "Search", "failure_class": "permanent"},
        "the action_retries budget ran out retrying Search after a permanent failure "
        "(observed 1 > limit 0, policy key max_retries_per_action)",
    ),
    "deadline_exceeded": (
        {"step": 4, "limit_value": 90.0, "observed": 91.5},
        {},
        "observed 91.5 > limit 90 s, policy key max_elapsed_seconds",
    ),
    "repeated_action": (
        {"step": 9, "limit_value": 3.0, "observed": 3.0},
        {"tool": "get_details_by_id", "repetitions": 3},
        "get_details_by_id was called 3 times in a row with the same arguments and an "
        "unchanged result (rule repeat_limit = 3)",
    ),
    "action_cycle": (
        {"step": 6},
        {"matched_period": 2, "repetitions": 2, "detail": {"tools": ["a", "b", "a", "b"]}},
        "the cycle a → b repeated 2 times",
    ),
    "repeated_decision": (
        {"step": 3, "limit_value": 3.0},
        {"repetitions": 3},
        "same non-tool decision 3 times in a row",
    ),
    "no_progress": (
        {"step": 26, "limit_value": 6.0},
        {"repetitions": 6, "detail": {"last_progress_step": 20}},
        "no progress for 6 steps since step 20",
    ),
    "cancelled": (
        {"step": 4},
        {"cancelled_by": "on-call", "reason": "runaway spend"},
        "Cancelled at step 4 by on-call: runaway spend.",
    ),
    "error": ({"step": 1}, {"error_type": "TimeoutError"}, "an unexpected TimeoutError error"),
}


def test_every_reason_has_a_sentence_built_from_its_evidence() -> None:
    assert set(EVIDENCE) == {r.value for r in StopReason}
    for reason, (stop, evidence, expected) in EVIDENCE.items():
        sentence = explain.stop_sentence({"reason": reason, **stop}, evidence)
        assert expected in sentence, (reason, sentence)
        assert sentence.endswith(".") and "\n" not in sentence


def test_a_cancel_without_a_reason_says_so() -> None:
    sentence = explain.stop_sentence({"reason": "cancelled", "step": 3}, {"scope": "run"})
    assert sentence == (
        "Cancelled at step 3 by the agent's own code (Run.cancel() or its framework); "
        "the stop names no reason (its evidence has none)."
    )
    assert explain.stop_sentence(None, None).startswith("No stop recorded")


def _steps(captured: bool) -> list[runview.StepView]:
    rows = []
    for step in (1, 2, 3):
        rows.append(
            {
                "kind": "tool_result",
                "step": step,
                "tool": "lookup",
                "outcome": "blocked" if step == 3 else "ok",
                "action_fingerprint": "f1",
                "observation_digest": None if step == 3 else "o1",
                "arguments": '{"id": 7}' if captured else None,
                "result": None if step == 3 or not captured else '{"status": "same"}',
            }
        )
    return runview.build_steps(rows)


def test_loop_evidence_shows_the_repeated_call_and_its_unchanged_result() -> None:
    stop = {"reason": "repeated_action", "step": 3}
    evidence = {"tool": "lookup", "step_indices": [1, 2, 3]}
    loop = explain.loop_evidence(stop, evidence, _steps(captured=True))
    assert loop is not None
    assert (loop.tool, loop.steps, loop.captured, loop.unchanged) == (
        "lookup",
        (1, 2, 3),
        True,
        True,
    )
    assert loop.arguments == '{"id": 7}' and loop.result == '{"status": "same"}'


def test_loop_evidence_without_content_points_to_capture() -> None:
    stop = {"reason": "repeated_action", "step": 3}
    loop = explain.loop_evidence(stop, {"tool": "lookup"}, _steps(captured=False))
    assert loop is not None and not loop.captured
    assert loop.arguments is None and loop.result is None
    assert "capture_content=True" in explain.CAPTURE_HINT
    assert explain.loop_evidence(stop, {}, _steps(captured=True)) is None


def test_abnormal_help_names_every_reason_it_counts() -> None:
    for reason in StopReason:
        assert f"`{reason.value}`" in explain.ABNORMAL_HELP


@pytest.mark.parametrize(
    ("ids", "prefix"),
    [
        (["demo-1c8f02.0001.a", "demo-1c8f02.0002.b", "demo-1c8f02.0100.c"], "demo-1c8f02."),
        (["tau2.0035.task=x", "tau2.0036.task=x"], "tau2."),
        (["abc", "abd"], ""),
        (["run-1", "run-1/child"], "run-"),
        (["only-one"], ""),
    ],
)
def test_id_prefix_cuts_at_a_separator_and_never_a_whole_id(ids: list[str], prefix: str) -> None:
    assert frames.id_prefix(ids) == prefix
    parts = [i[len(prefix) :] for i in ids]
    assert all(parts) and len(set(parts)) == len(parts)


def test_base_url_hint_goes_into_pages_only() -> None:
    page = b"<html><head><title>x</title></head></html>"

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        html = scope["path"] != "/static/app.js"
        body = page if html else b"console.log(1)"
        kind = b"text/html; charset=utf-8" if html else b"text/javascript"
        headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def get(path: str) -> tuple[dict[str, Any], bytes]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        scope = {"type": "http", "method": "GET", "path": path, "headers": [], "root_path": ""}
        asyncio.run(BaseUrlHint(inner)(scope, receive, send))
        return sent[0], b"".join(m.get("body", b"") for m in sent[1:])

    start, body = get("/run")
    assert body.startswith(b"<html><head>" + base_url_script(""))
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()
    assert b'new URL("/",' in base_url_script("") and b'new URL("/lw/",' in base_url_script("/lw")
    _, js = get("/static/app.js")
    assert js == b"console.log(1)"
