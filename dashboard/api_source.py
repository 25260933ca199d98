"""The collector's JSON read API as a :class:`~loopwatch.dashboard.data.DataSource`.

Reads ``/api/v1/runs``, ``/api/v1/runs/{id}``, ``/api/v1/stats`` and ``/api/v1/tools``
over ``httpx`` with timeouts, and maps transport failures and the API's JSON error
envelope onto :class:`~loopwatch.dashboard.data.SourceUnavailable` and
:class:`~loopwatch.dashboard.data.QueryFailed`. A collector that lacks an aggregate is
answered from its runs pages, and the answer's note says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

import httpx
import pandas as pd

from .data import (
    LOOP_DETECTORS,
    Overview,
    QueryFailed,
    RunData,
    RunFilter,
    RunsPage,
    SourceUnavailable,
    ToolsData,
)
from .frames import (
    TRUNCATED_NOTE,
    by_agent_frame,
    loops_frame,
    run_data,
    runs_frame,
    stops_frame,
    tools_frame,
)

__all__ = ["ApiSource"]

_NS: Final = 1_000_000_000
_SCAN_PAGE: Final = 1_000
_SCAN_MAX_RUNS: Final = 10_000


class ApiSource:
    """The collector's read API over HTTP.

    Args:
        base_url: the collector's ``--http`` address, e.g. ``http://127.0.0.1:9464``.
        token: bearer token when the collector was started with ``--token-file``.
        timeout_seconds: per request (connect: at most 2 s).
        transport: an ``httpx`` transport (tests may pass an ASGI transport).

    Raises:
        ValueError: ``base_url`` is not an ``http(s)://`` URL, or the timeout is not > 0.

    Blocking: each method makes one to a few HTTP requests. When ``/api/v1/stats`` lacks
    ``runs_by_agent`` and ``canary_runs`` (and the ``agent`` filter), the overview counts
    them from up to 10,000 runs read in pages, newest first, and says so in its note.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_seconds: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        url = base_url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"collector URL must start with http:// or https://, got {url!r}")
        if not timeout_seconds > 0:
            raise ValueError("timeout_seconds must be > 0")
        self.base_url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout_seconds, connect=min(timeout_seconds, 2.0)),
            transport=transport,
        )

    @property
    def description(self) -> str:
        return f"collector at {self.base_url}"

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        try:
            response = self._client.get(path, params=dict(params or {}))
        except httpx.TimeoutException:
            raise SourceUnavailable(
                "timeout",
                f"The collector at {self.base_url} did not answer in time. "
                "Check that it is running and not overloaded.",
            ) from None
        except httpx.TransportError as exc:
            raise SourceUnavailable(
                "unreachable",
                f"Cannot reach the collector at {self.base_url} ({type(exc).__name__}). "
                "Start it with `loopwatch collector`, or open a database file with "
                "`loopwatch dashboard --db PATH`.",
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise SourceUnavailable(
                "not_loopwatch",
                f"{self.base_url} answered {response.status_code} without JSON: "
                "is it a loopwatch collector's --http address?",
            ) from None
        if response.status_code == 401:
            raise SourceUnavailable(
                "unauthorized",
                f"The collector at {self.base_url} requires a token: start the dashboard "
                "with the collector's token file.",
            )
        if response.status_code != 200:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            raise QueryFailed(
                str(error.get("code", "http_error")),
                f"The collector answered {response.status_code}: "
                f"{error.get('message', 'no message')}.",
                response.status_code,
            )
        return body

    def check(self) -> None:
        self._get("/api/v1/runs", {"limit": 1})

    def runs(self, filters: RunFilter, *, limit: int = 50, offset: int = 0) -> RunsPage:
        body = self._get(
            "/api/v1/runs", {**_filter_params(filters), "limit": limit, "offset": offset}
        )
        return RunsPage(runs_frame(body.get("items", [])), offset, body.get("next_offset"))

    def run(self, run_id: str) -> RunData | None:
        try:
            body = self._get(f"/api/v1/runs/{quote(run_id, safe='')}")
        except QueryFailed as exc:
            if exc.status == 404:
                return None
            raise
        run = body.get("run") or {}
        return run_data(body, run.get("limits"))

    def _scan(self, filters: RunFilter) -> tuple[list[dict[str, Any]], bool]:
        """Up to :data:`_SCAN_MAX_RUNS` runs, newest first; ``True`` when more exist."""
        items: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None and len(items) < _SCAN_MAX_RUNS:
            body = self._get(
                "/api/v1/runs", {**_filter_params(filters), "limit": _SCAN_PAGE, "offset": offset}
            )
            items.extend(body.get("items", []))
            offset = body.get("next_offset")
        return items[:_SCAN_MAX_RUNS], offset is not None

    def overview(
        self,
        *,
        since_unix_nano: int,
        until_unix_nano: int,
        bucket_seconds: int,
        agent: str | None = None,
    ) -> Overview:
        params: dict[str, Any] = {
            "since": since_unix_nano,
            "until": until_unix_nano,
            "bucket_seconds": bucket_seconds,
        }
        if agent is not None:
            params["agent"] = agent
        body = self._get("/api/v1/stats", params)
        if "runs_by_agent" in body and "canary_runs" in body:
            return Overview(
                stops_frame(body.get("stops_by_reason", [])),
                by_agent_frame(body["runs_by_agent"]),
                loops_frame(body.get("loops_by_tool", [])),
                int(body["canary_runs"]),
                TRUNCATED_NOTE if body.get("truncated") else None,
            )
        # A collector without these aggregates (nor the agent filter): count from run pages.
        items, more = self._scan(
            RunFilter(agent=agent, since_unix_nano=since_unix_nano, until_unix_nano=until_unix_nano)
        )
        stops, by_agent, loops, canary = _scan_overview(items, bucket_seconds)
        if agent is None:
            stops = stops_frame(body.get("stops_by_reason", []))
            loops = loops_frame(body.get("loops_by_tool", []))
        note = None
        if more:
            part = "all figures" if agent is not None else "runs by agent and canary-flagged runs"
            note = (
                f"{part.capitalize()} count the newest {_SCAN_MAX_RUNS:,} runs of the range only "
                "(the collector's API has no aggregate for them yet)."
            )
        return Overview(stops, by_agent, loops, canary, note)

    def tools(self, *, since_unix_nano: int, until_unix_nano: int) -> ToolsData:
        window = {"since": since_unix_nano, "until": until_unix_nano}
        stats = self._get("/api/v1/stats", {**window, "bucket_seconds": 86_400})
        loops = loops_frame(stats.get("loops_by_tool", []))
        try:
            body = self._get("/api/v1/tools", window)
        except QueryFailed as exc:
            if exc.status != 404:
                raise
            return ToolsData(
                None,
                loops,
                "Calls, errors and blocked calls per tool need the collector's "
                "/api/v1/tools endpoint, which this collector does not serve; open the "
                "database file with --db for them.",
            )
        truncated = body.get("truncated") or stats.get("truncated")
        return ToolsData(
            tools_frame(body.get("items", [])), loops, TRUNCATED_NOTE if truncated else None
        )

    def close(self) -> None:
        self._client.close()


def _scan_overview(
    items: Sequence[Mapping[str, Any]], bucket_seconds: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, int]:
    """Overview aggregates computed from run rows (stops, by agent, loops, canary)."""
    bucket = bucket_seconds * _NS
    stops: dict[tuple[int, str], int] = {}
    by_agent: dict[tuple[str, str], int] = {}
    loops: dict[tuple[str, str], int] = {}
    canary = 0
    for item in items:
        reason = item.get("stop_reason") or ""
        agent = item.get("agent") or ""
        by_agent[(agent, reason)] = by_agent.get((agent, reason), 0) + 1
        canary += bool(item.get("canary_detected"))
        if not reason:
            continue
        when = int(item.get("stop_unix_nano") or item.get("time_unix_nano") or 0)
        key = ((when // bucket) * bucket, reason)
        stops[key] = stops.get(key, 0) + 1
        if reason in LOOP_DETECTORS:
            # Run rows carry no loop tool: the run's top tool stands in (only for a
            # collector without /api/v1/stats, which counts by the detection's tool).
            tool_key = (item.get("top_tool") or "", reason)
            loops[tool_key] = loops.get(tool_key, 0) + 1
    stops_rows = [
        {"bucket_unix_nano": b, "stop_reason": r, "stops": n} for (b, r), n in sorted(stops.items())
    ]
    agent_rows = [{"agent": a, "stop_reason": r, "runs": n} for (a, r), n in by_agent.items()]
    loop_rows = [
        {"tool": t, "stop_reason": r, "stops": n}
        for (t, r), n in sorted(loops.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return stops_frame(stops_rows), by_agent_frame(agent_rows), loops_frame(loop_rows), canary


def _filter_params(filters: RunFilter) -> dict[str, Any]:
    params: dict[str, Any] = {
        "stop_reason": filters.stop_reason,
        "agent": filters.agent,
        "tool": filters.tool,
        "since": filters.since_unix_nano,
        "until": filters.until_unix_nano,
        "canary": None if filters.canary is None else str(filters.canary).lower(),
        "sampled": None if filters.sampled is None else str(filters.sampled).lower(),
        "detector": filters.detector,
        "loop_tool": filters.loop_tool,
    }
    return {k: v for k, v in params.items() if v is not None and v != ""}
