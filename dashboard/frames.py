"""Rows from either source (API items or reader dicts) shaped into the frames of
:mod:`loopwatch.dashboard.data`, so both sources tell the same story.

Pure functions of plain rows; no I/O, no Streamlit. Missing numbers become 0 in counts;
nanosecond times become UTC ``datetime64`` columns. Evidence and limits are client text
parsed leniently: what is not a JSON object is kept as ``{"raw": ...}`` / ``None``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import pandas as pd

from .data import RUN_COLUMNS, TOOLS_COLUMNS, Overview, RunData

__all__ = [
    "TRUNCATED_NOTE",
    "by_agent_frame",
    "id_prefix",
    "limits_frame",
    "loops_frame",
    "overview_from_stats",
    "parse_evidence",
    "run_data",
    "runs_frame",
    "stops_frame",
    "tools_frame",
    "utc",
]

TRUNCATED_NOTE: Final = "Figures are partial: a query hit the source's row cap."
"""The note of an answer a query's row cap cut short."""


def utc(values: Iterable[Any]) -> pd.Series:
    """Nanoseconds since the epoch (``None`` allowed) as UTC ``datetime64``."""
    return pd.to_datetime(pd.Series(list(values), dtype="Int64"), unit="ns", utc=True)


_ID_SEPARATORS: Final = frozenset("._-:/=@#+ ")


def id_prefix(ids: Sequence[str]) -> str:
    """The prefix all ``ids`` share, up to and including its last separator
    (``. _ - : / = @ # +`` or a space); ``""`` for fewer than two ids.

    Run ids of one sender share long prefixes (``demo-1c8f02.0829.task=...``): a table
    that shows each id from its start shows the same text on every row. Cutting at a
    separator keeps whole tokens (``0829``, not ``829``). Example: ``["demo-a.0001.x",
    "demo-a.0002.y"]`` -> ``"demo-a."``.
    """
    if len(ids) < 2:
        return ""
    first, last = min(ids), max(ids)  # the common prefix of all is that of these two
    size = 0
    for a, b in zip(first, last, strict=False):
        if a != b:
            break
        size += 1
    shared = first[:size]
    cut = max((i for i, c in enumerate(shared) if c in _ID_SEPARATORS), default=-1)
    # Never the whole of an id: a run id that is a prefix of another stays visible.
    while cut >= 0 and any(len(i) <= cut + 1 for i in ids):
        cut = max((i for i, c in enumerate(shared[:cut]) if c in _ID_SEPARATORS), default=-1)
    return shared[: cut + 1]


def runs_frame(items: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Run rows (API items or reader dicts) as a frame with :data:`RUN_COLUMNS`."""
    frame = pd.DataFrame(list(items))
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in RUN_COLUMNS})
    frame["time"] = utc(frame.get("time_unix_nano", pd.Series([None] * len(frame))))
    for column in RUN_COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    return frame[list(RUN_COLUMNS)].reset_index(drop=True)


def stops_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``bucket_unix_nano, stop_reason, stops`` rows as :attr:`Overview.stops`."""
    frame = pd.DataFrame(list(rows), columns=["bucket_unix_nano", "stop_reason", "stops"])
    frame.insert(0, "bucket", utc(frame.pop("bucket_unix_nano")))
    frame["stops"] = frame["stops"].astype("int64")
    return frame


def loops_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``tool, stop_reason, stops`` rows as :attr:`Overview.loops_by_tool` (``detector``)."""
    frame = pd.DataFrame(list(rows), columns=["tool", "stop_reason", "stops"])
    frame = frame.rename(columns={"stop_reason": "detector"})
    frame["tool"] = frame["tool"].fillna("")
    frame["stops"] = frame["stops"].astype("int64")
    return frame


def by_agent_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``agent, stop_reason, runs`` rows as :attr:`Overview.runs_by_agent`."""
    frame = pd.DataFrame(list(rows), columns=["agent", "stop_reason", "runs"])
    frame["agent"] = frame["agent"].fillna("")
    frame["stop_reason"] = frame["stop_reason"].fillna("")
    frame["runs"] = frame["runs"].astype("int64")
    return frame


def overview_from_stats(stats: Mapping[str, Any]) -> Overview:
    """An ``/api/v1/stats`` body as an :class:`Overview`.

    Raises:
        KeyError: ``runs_by_agent`` or ``canary_runs`` is missing.
    """
    return Overview(
        stops_frame(stats.get("stops_by_reason", [])),
        by_agent_frame(stats["runs_by_agent"]),
        loops_frame(stats.get("loops_by_tool", [])),
        int(stats["canary_runs"]),
        TRUNCATED_NOTE if stats.get("truncated") else None,
    )


def tools_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """:data:`TOOLS_COLUMNS` rows as :attr:`ToolsData.tools`, with the repeated-action
    and nudge recovery rates (a source without the nudge columns gives 0 nudges)."""
    frame = pd.DataFrame(list(rows), columns=list(TOOLS_COLUMNS))
    for column in TOOLS_COLUMNS[1:]:
        frame[column] = frame[column].fillna(0).astype("int64")
    runs = frame["runs"].where(frame["runs"] > 0)
    frame["repeated_action_rate"] = (frame["repeated_action_runs"] / runs).fillna(0.0)
    # No nudge is no rate (NaN, shown blank), not a 0 % recovery.
    nudges = frame["nudges"].where(frame["nudges"] > 0)
    frame["nudge_recovery_rate"] = frame["nudges_recovered"] / nudges
    return frame


def limits_frame(raw: Any) -> pd.DataFrame | None:
    """``{field: {"value", "source"}}`` (JSON text or dict) as ``limit, value, source``."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return None
    if not isinstance(raw, Mapping):
        return None
    rows = []
    for name, spec in sorted(raw.items()):
        if isinstance(spec, Mapping):
            rows.append(
                {"limit": name, "value": str(spec.get("value")), "source": spec.get("source")}
            )
        else:
            rows.append({"limit": name, "value": str(spec), "source": None})
    return pd.DataFrame(rows, columns=["limit", "value", "source"])


def parse_evidence(raw: Any) -> dict[str, Any]:
    """A stop's evidence (JSON text or mapping) as a dict; anything else as ``{"raw": raw}``."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return {"raw": raw}
    return dict(raw) if isinstance(raw, Mapping) else {"raw": raw}


def run_data(detail: Mapping[str, Any], limits: Any) -> RunData:
    """A run detail (the read API's ``/api/v1/runs/{id}`` body shape) as :class:`RunData`."""
    tools = pd.DataFrame(list(detail.get("tools") or []), columns=["tool", "outcome", "calls"])
    stop = detail.get("stop")
    evidence = detail.get("evidence")
    if evidence is None and stop:
        evidence = stop.get("evidence")
    return RunData(
        run=dict(detail.get("run") or {}),
        step_rows=tuple(detail.get("steps") or ()),
        steps_truncated=bool(detail.get("steps_truncated")),
        stop=dict(stop) if stop else None,
        evidence=parse_evidence(evidence),
        anomalies=[dict(a) for a in detail.get("stop_anomalies") or []],
        tools=tools,
        limits=limits_frame(limits),
        anomalies_truncated=bool(detail.get("stop_anomalies_truncated")),
        tools_truncated=bool(detail.get("tools_truncated")),
        nudges=tuple(dict(n) for n in detail.get("nudges") or [] if isinstance(n, Mapping)),
        nudges_dropped=int(detail.get("nudges_dropped") or 0),
    )
