"""Requests taken from the docs, so that tests send exactly what a reader would copy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs"

OBSERVE_RUN_ID = "a" * 16
"""The run id of docs/collector.md's observe-mode example (its root span's id)."""


def observe_example(tool_calls: int = 5) -> dict[str, Any]:
    """docs/collector.md's minimal OTLP/JSON request ("Server-side detection"), its tool
    span repeated to ``tool_calls`` identical calls (new span ids, later times), as the
    text there says to try."""
    docs = (DOCS / "collector.md").read_text(encoding="utf-8")
    section = docs[docs.index("## Server-side detection") :]
    found = re.search(r"```json\n(.*?)```", section, re.S)
    assert found is not None, "docs/collector.md lost its observe-mode JSON example"
    body: dict[str, Any] = json.loads(found.group(1))
    spans = body["resourceSpans"][0]["scopeSpans"][0]["spans"]
    tool = spans[1]
    for i in range(2, tool_calls + 1):
        spans.append(
            {
                **tool,
                "spanId": f"{i:016x}",
                "startTimeUnixNano": str(2000 + i * 200),
                "endTimeUnixNano": str(2100 + i * 200),
            }
        )
    return body
