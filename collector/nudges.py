"""Reading the response ladder's telemetry (issue 26, NUDGE.md): tool-span rungs and the
stop span's ``loopwatch.nudges`` list.

Everything here reads client text, so it is bounded and never raises:

- :func:`loop_response` reads ``loopwatch.loop.response`` / ``.rung`` / ``.detector`` of a
  tool span (falling back to its ``loopwatch.loop_response`` span event); a value out of
  its set or range maps to ``None``, as other odd attributes do in the map stage.
- :func:`parse_nudges` validates ``loopwatch.nudges`` (compact JSON text, or an OTLP array
  of maps) into a canonical compact JSON list and counts the entries it dropped: text
  over :data:`MAX_NUDGES_CHARS`, JSON that does not parse (each counts as one dropped
  entry: its length is unknown), entries past :data:`MAX_NUDGES`, and entries that are
  not ``{"detector": str, "tool": str, "rung": int >= 1, "step": int >= 0, "result":
  "recovered"|"stopped"|"ended"}`` (strings at most :data:`MAX_NAME_CHARS` characters).
  The drops add to the client's own ``loopwatch.nudges.dropped``, so a stored run says
  how many nudges it does not list, whoever dropped them.
"""

from __future__ import annotations

import json
from typing import Any, Final

from loopwatch.instrumentation import _semconv as sc

from .records import Attributes, SpanRecord

__all__ = [
    "LOOP_RESPONSES",
    "MAX_NAME_CHARS",
    "MAX_NUDGES",
    "MAX_NUDGES_CHARS",
    "NUDGE_RESULTS",
    "RESPONSE_NUDGE",
    "RESPONSE_WARN",
    "RESULT_ENDED",
    "RESULT_RECOVERED",
    "RESULT_STOPPED",
    "loop_response",
    "nudge_results",
    "parse_nudges",
]

RESPONSE_WARN: Final = "warn"
RESPONSE_NUDGE: Final = "nudge"
LOOP_RESPONSES: Final = frozenset({RESPONSE_WARN, RESPONSE_NUDGE})
"""Rungs a tool span reports (``stop`` is the stop span's business)."""
RESULT_RECOVERED: Final = "recovered"
RESULT_STOPPED: Final = "stopped"
RESULT_ENDED: Final = "ended"
NUDGE_RESULTS: Final = (RESULT_RECOVERED, RESULT_STOPPED, RESULT_ENDED)
MAX_NUDGES: Final = 64
"""Entries kept per run: the instrumentation's own cap (NUDGE.md)."""
MAX_NAME_CHARS: Final = 256
"""Longest detector or tool name accepted in an entry (a longer one drops the entry)."""
MAX_NUDGES_CHARS: Final = 64 * 1024
"""Longest ``loopwatch.nudges`` text parsed: 64 entries of long names fit well within."""
MAX_RUNG: Final = 1000
_INT64_MAX: Final = 2**63 - 1
_FIELDS: Final = ("detector", "tool", "rung", "step", "result")


def _int(value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if low <= value <= high else None


def _name(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS:
        return value
    return None


def loop_response(span: SpanRecord) -> tuple[str | None, int | None, str | None]:
    """``(response, rung, detector)`` of a tool span, or ``None`` for each one missing
    or out of range (response ``warn``/``nudge``; rung 1..1000; detector a non-empty
    name of at most :data:`MAX_NAME_CHARS` characters).

    The span's attributes win; the ``loopwatch.loop_response`` span event stands in for a
    span that carries only the event. Constant work per span (events scanned once)."""
    attrs: Attributes = span.attributes
    if sc.LW_LOOP_RESPONSE not in attrs:
        for event in span.events:
            if event.name == sc.EVENT_LOOP_RESPONSE:
                attrs = event.attributes
                break
    response = attrs.get(sc.LW_LOOP_RESPONSE)
    if not isinstance(response, str) or response not in LOOP_RESPONSES:
        return None, None, None
    rung = attrs.get(sc.LW_LOOP_RUNG)
    if isinstance(rung, str) and rung.isdigit() and len(rung) < 5:
        rung = int(rung)
    return response, _int(rung, 1, MAX_RUNG), _name(attrs.get(sc.LW_LOOP_DETECTOR))


def _entry(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    detector, tool = _name(value.get("detector")), _name(value.get("tool"))
    rung = _int(value.get("rung"), 1, MAX_RUNG)
    step = _int(value.get("step"), 0, _INT64_MAX)
    result = value.get("result")
    if detector is None or tool is None or rung is None or step is None:
        return None
    if not isinstance(result, str) or result not in NUDGE_RESULTS:
        return None
    return {"detector": detector, "tool": tool, "rung": rung, "step": step, "result": result}


def parse_nudges(attrs: Attributes) -> tuple[str | None, int | None]:
    """``(nudges, dropped)`` of a stop span's attributes.

    Returns:
        ``nudges``: the valid entries as compact JSON (keys in :data:`_FIELDS` order),
        ``None`` when none is valid; ``dropped``: the client's ``loopwatch.nudges.dropped``
        (a non-negative int, else 0) plus the entries dropped here, ``None`` when both the
        attribute and the drops are absent. Never raises.
    """
    raw = attrs.get(sc.LW_NUDGES)
    client = attrs.get(sc.LW_NUDGES_DROPPED)
    dropped = _int(client, 0, _INT64_MAX) or 0
    if raw is None:
        return None, (dropped if sc.LW_NUDGES_DROPPED in attrs else None)
    items: Any = raw
    if isinstance(raw, str):
        if len(raw) > MAX_NUDGES_CHARS:
            return None, dropped + 1
        try:
            items = json.loads(raw)
        except (ValueError, RecursionError):  # client text; nesting past the parser
            return None, dropped + 1
    if not isinstance(items, list):
        return None, dropped + 1
    kept: list[dict[str, Any]] = []
    for item in items:
        entry = _entry(item) if len(kept) < MAX_NUDGES else None
        if entry is None:
            dropped += 1
        else:
            kept.append(entry)
    text = json.dumps(kept, separators=(",", ":")) if kept else None
    return text, dropped


def nudge_results(nudges: str) -> list[tuple[str, str]]:
    """``(detector, result)`` of each entry of a stop's stored ``nudges`` (the JSON
    :func:`parse_nudges` wrote); ``[]`` for text that is not such a list. Never raises."""
    try:
        items = json.loads(nudges)
    except (ValueError, RecursionError):
        return []
    if not isinstance(items, list):
        return []
    return [
        (str(i.get("detector")), str(i.get("result")))
        for i in items[:MAX_NUDGES]
        if isinstance(i, dict)
    ]
