"""Hostile stored text for the dashboard tests: runs whose every client string is Markdown.

Whoever can post OTLP chooses every name, reason, message and id the dashboard shows. Each
string field of these runs holds :func:`payload`: four leading spaces (a code block where
a label starts with them), a right-to-left override (it reverses the text after it), a
backtick and a blank line (to leave an inline code span or a paragraph the page opened),
an image on a tracker URL (a request
from the viewer's browser), a link, a heading, emphasis, a GFM table row, a colour
directive, an icon and an emoji shortcode, LaTeX, an entity, a bare URL, a ``www.`` and an
e-mail autolink. Rendered as Markdown, any of them shows as something other than text.

Used by ``test_hostile_text.py`` (AppTest, element bodies parsed with a CommonMark parser)
and ``tests/e2e/test_dashboard_hostile.py`` (Chromium: the DOM and the tracker's hits).
Found by a helper session's review (2026-12-01): twelve places rendered such text.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any, Final

import httpx
from markdown_it import MarkdownIt
from markdown_it.token import Token

from tests.integration.services import poll_until

MARK: Final = "HOSTILE"
"""Word in every hostile value (``HOSTILE-<field>``)."""

RUNS: Final = {
    "main": "hostile-main",
    "loop": "hostile-loop",
    "setext": "hostile-setext",
    "bidi_id": "hostile-id-\u202edesrever",
}
"""Run ids: a stop with every field hostile, a repeated_action loop, a setext agent name,
and a run whose id holds a right-to-left override (its links must still open it)."""


MD: Final = MarkdownIt("commonmark").enable(["table", "strikethrough"])
"""The CommonMark parser the checks read Markdown bodies with (GFM tables, strikethrough)."""
WJ: Final = "\u2060"
"""The word joiner ``escape_md`` and ``code_md`` put after ``:`` and ``@``."""


def markdown_tokens(source: str) -> Iterator[Token]:
    """Every block token of ``source`` and every inline token inside them."""
    for token in MD.parse(source):
        yield token
        yield from token.children or ()


def rendered(source: str) -> str:
    """The text a reader sees of a Markdown body: each block's text on a line, markup
    and word joiners dropped (``"- **a**: `b`"`` -> ``"a: b"``)."""
    lines = []
    for block in MD.parse(source):
        if block.children is not None:
            kept = (t.content for t in block.children if t.type in ("text", "code_inline"))
            lines.append("".join(kept))
    return "\n".join(lines).replace(WJ, "")


def payload(field: str, tracker: str) -> str:
    """The hostile value of one field; ``tracker`` is ``HOST:PORT`` of an image server."""
    return (
        f"    {MARK}-{field}\u202e` \n\n![IMG-{field}](http://{tracker}/{field}.png) "
        f"[PHISH-{field}](http://evil.example/{field}) **BOLD-{field}** _EM-{field}_ "
        f"| a | b | :red[RED-{field}] :material/verified: :warning: $x^2$ &copy; "
        f"https://evil.example/{field} www.evil.example bob@evil.example\n\n# HEAD-{field}\n"
    )


def setext_agent() -> str:
    """An agent name that becomes a fake heading through its line breaks alone."""
    return f"support {MARK}\n\nStop reason: completed\n===\n\n    indented code"


def _kv(key: str, value: object) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _span(
    trace: str, name: str, attrs: dict[str, Any], t0: int, parent: str = ""
) -> dict[str, Any]:
    return {
        "traceId": trace,
        "spanId": os.urandom(8).hex(),
        "parentSpanId": parent,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(t0),
        "endTimeUnixNano": str(t0 + 1000),
        "attributes": [_kv(k, v) for k, v in attrs.items()],
    }


def run_spans(
    run_id: str,
    tracker: str,
    *,
    reason: str | None = None,
    agent: str | None = None,
    tool: str | None = None,
) -> list[dict[str, Any]]:
    """OTLP/JSON spans of one loopwatch run (run span, four decisions and tool results, a
    stop) with hostile text in every string attribute the dashboard shows."""

    def p(field: str) -> str:
        return payload(field, tracker)

    trace = os.urandom(16).hex()
    now = time.time_ns() - 60 * 10**9
    tool = tool if tool is not None else p("tool")
    common = {"loopwatch.run.id": run_id, "gen_ai.agent.name": agent or p("agent")}
    root = _span(
        trace,
        "invoke_agent " + p("span_name"),
        {
            **common,
            "gen_ai.operation.name": "invoke_agent",
            "loopwatch.policy.name": p("policy_name"),
            "loopwatch.policy.version": p("policy_version"),
            "loopwatch.detector.version": "1",
            "loopwatch.limits": json.dumps({p("limit"): {"value": 8, "source": p("source")}}),
            "loopwatch.mode": p("mode"),
        },
        now,
    )
    spans = [root]
    calls = [(tool, "ok"), (tool, "ok"), (tool, "ok"), ("t2" + p("tool2"), p("outcome"))]
    for i, (name, outcome) in enumerate(calls):
        step = i + 1
        spans.append(
            _span(
                trace,
                "decide",
                {
                    **common,
                    "loopwatch.event": "decision",
                    "loopwatch.step": step,
                    "loopwatch.decision.type": p("decision_type") if i == 3 else "tool",
                    "loopwatch.steps_since_progress": i,
                },
                now + step * 10**6,
                root["spanId"],
            )
        )
        attrs = {
            **common,
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": f"c{i}",
            "loopwatch.event": "tool_result",
            "loopwatch.step": step,
            "loopwatch.action.fingerprint": ("a" if i < 3 else "b") * 64,
            "loopwatch.tool.outcome": outcome,
            "loopwatch.progress": False,
            "loopwatch.steps_since_progress": i,
            "gen_ai.tool.call.arguments": json.dumps({"q": p("arguments")}),
            "gen_ai.tool.call.result": p("result") * 2,  # past the fold: a caption shows it
        }
        if i == 3:
            attrs["loopwatch.tool.blocked_by"] = p("blocked_by")
            attrs["error.type"] = p("error_type")
            attrs["loopwatch.tool.failure_class"] = p("failure_class")
        spans.append(_span(trace, "execute_tool", attrs, now + step * 10**6 + 500, root["spanId"]))
    evidence = {
        "detector": p("ev_detector"),
        "tool": p("ev_tool"),
        "failure_class": p("ev_failure_class"),
        "scope": p("ev_scope"),
        "fingerprint_previews": [p("ev_fingerprint")],
        "step_indices": [1, 2, 3],
        "detail": {p("detail_key"): p("detail_value")},
    }
    spans.append(
        _span(
            trace,
            "stop",
            {
                **common,
                "loopwatch.event": "stop",
                "loopwatch.step": 4,
                "loopwatch.stop.reason": reason or p("reason"),
                "loopwatch.stop.message": p("message"),
                "loopwatch.stop.dimension": p("dimension"),
                "loopwatch.stop.limit": 2.0,
                "loopwatch.stop.observed": 3.0,
                "loopwatch.stop.basis": p("basis"),
                "loopwatch.stop.evidence": json.dumps(evidence),
                "loopwatch.steps_since_progress": 3,
                "loopwatch.observe.stop_reason": p("observe_reason"),
                "loopwatch.observe.stop_step": 2,
                "loopwatch.observe.stop_evidence": json.dumps({"tool": p("observe_tool")}),
                "loopwatch.usage.model_turns": 4,
                "loopwatch.usage.tool_attempts": 4,
            },
            now + 10 * 10**6,
            root["spanId"],
        )
    )
    return spans


def feed(otlp_url: str, api_url: str, tracker: str) -> None:
    """Send the runs of :data:`RUNS` as OTLP/JSON and wait until each is stored."""
    runs = [
        run_spans(RUNS["main"], tracker),
        run_spans(
            RUNS["loop"],
            tracker,
            reason="repeated_action",
            agent=payload("agent2", tracker),
            tool=payload("loop_tool", tracker),
        ),
        run_spans(RUNS["setext"], tracker, reason="repeated_action", agent=setext_agent()),
        run_spans(RUNS["bidi_id"], tracker, reason="repeated_action"),
    ]
    for spans in runs:
        doc = {
            "resourceSpans": [
                {
                    "resource": {"attributes": [_kv("service.name", payload("service", tracker))]},
                    "scopeSpans": [{"scope": {"name": "hostile"}, "spans": spans}],
                }
            ]
        }
        response = httpx.post(
            otlp_url,
            content=json.dumps(doc),
            headers={"Content-Type": "application/json"},
            timeout=10,
        )
        response.raise_for_status()

    def stored() -> bool:
        return all(
            httpx.get(f"{api_url}/api/v1/runs/{run}", timeout=5).status_code == 200
            for run in RUNS.values()
        )

    poll_until(stored, timeout_seconds=20, what="the hostile runs stored")
