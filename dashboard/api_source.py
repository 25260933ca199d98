"""The collector's JSON read API as a :class:`~loopwatch.dashboard.data.DataSource`.

Reads ``/api/v1/runs``, ``/api/v1/runs/{id}``, ``/api/v1/stats`` and ``/api/v1/tools``
over ``httpx`` with timeouts, and maps transport failures and the API's JSON error
envelope onto :class:`~loopwatch.dashboard.data.SourceUnavailable` and
:class:`~loopwatch.dashboard.data.QueryFailed`. A collector that lacks an aggregate is
answered from its runs pages, and the answer's note says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Unpack
from urllib.parse import quote

import httpx
import pandas as pd

from . import data, frames

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
            raise data.SourceUnavailable(
                "timeout",
                f"The collector at {self.base_url} did not answer in time. "
                "Check that it is running and not overloaded.",
            ) from None
        except httpx.TransportError as exc:
            raise data.SourceUnavailable(
                "unreachable",
                f"Cannot reach the collector at {self.base_url} ({type(exc).__name__}). "
                "Start it with `loopwatch collector`, or open a database file with "
                "`loopwatch dashboard --db PATH`.",
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise data.SourceUnavailable(
                "not_loopwatch",
                f"{self.base_url} answered {response.status_code} without JSON: "
                "is it a loopwatch collector's --http address?",
            ) from None
        if response.status_code == 401:
            raise data.SourceUnavailable(
                "unauthorized",
                f"The collector at {self.base_url} requires a token: start the dashboard "
                "with the collector's token file.",
            )
        if response.status_code != 200:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            raise data.QueryFailed(
                str(error.get("code", "http_error")),
                f"The collector answered {response.status_code}: "
                f"{error.get('message', 'no message')}.",
                response.status_code,
            )
        return body

    def check(self) -> None:
        self._get("/api/v1/runs", {"limit": 1})

    def runs(self, filters: data.RunFilter, *, limit: int = 50, offset: int = 0) -> data.RunsPage:
        body = self._get(
            "/api/v1/runs", {**_filter_params(filters), "limit": limit, "offset": offset}
        )
        return data.RunsPage(
            frames.runs_frame(body.get("items", [])), offset, body.get("next_offset")
        )

    def run(self, run_id: str) -> data.RunData | None:
        try:
            body = self._get(f"/api/v1/runs/{quote(run_id, safe='')}")
        except data.QueryFailed as exc:
            if exc.status == 404:
                return None
            raise
        run = body.get("run") or {}
        return frames.run_data(body, run.get("limits"))

    def _scan(self, filters: data.RunFilter) -> tuple[list[dict[str, Any]], bool]:
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

    def overview(self, **query: Unpack[data.OverviewQuery]) -> data.Overview:
        since, until, agent = query["since_unix_nano"], query["until_unix_nano"], query.get("agent")
        params = {"since": since, "until": until, "bucket_seconds": query["bucket_seconds"]}
        body = self._get("/api/v1/stats", params if agent is None else {**params, "agent": agent})
        if "runs_by_agent" in body and "canary_runs" in body:
            return frames.overview_from_stats(body)
        # A collector without these aggregates (nor the agent filter): count from run pages.
        items, more = self._scan(
            data.RunFilter(agent=agent, since_unix_nano=since, until_unix_nano=until)
        )
        stops, by_agent, loops, canary = _scan_overview(items, query["bucket_seconds"])
        if agent is None:
            stops = frames.stops_frame(body.get("stops_by_reason", []))
            loops = frames.loops_frame(body.get("loops_by_tool", []))
        note = None
        if more:
            part = "all figures" if agent is not None else "runs by agent and canary-flagged runs"
            note = (
                f"{part.capitalize()} count the newest {_SCAN_MAX_RUNS:,} runs of the range only "
                "(the collector's API has no aggregate for them yet)."
            )
        return data.Overview(stops, by_agent, loops, canary, note)

    def tools(self, *, since_unix_nano: int, until_unix_nano: int) -> data.ToolsData:
        window = {"since": since_unix_nano, "until": until_unix_nano}
        stats = self._get("/api/v1/stats", {**window, "bucket_seconds": 86_400})
        loops = frames.loops_frame(stats.get("loops_by_tool", []))
        try:
            body = self._get("/api/v1/tools", window)
        except data.QueryFailed as exc:
            if exc.status != 404:
                raise
            return data.ToolsData(
                None,
                loops,
                "Calls, errors and blocked calls per tool need the collector's "
                "/api/v1/tools endpoint, which this collector does not serve; open the "
                "database file with --db for them.",
            )
        truncated = body.get("truncated") or stats.get("truncated")
        return data.ToolsData(
            frames.tools_frame(body.get("items", [])),
            loops,
            frames.TRUNCATED_NOTE if truncated else None,
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
        if reason in data.LOOP_DETECTORS:
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
    return (
        frames.stops_frame(stops_rows),
        frames.by_agent_frame(agent_rows),
        frames.loops_frame(loop_rows),
        canary,
    )


def _filter_params(filters: data.RunFilter) -> dict[str, Any]:
    """The read API's query parameters: ``since``/``until``, booleans as ``true``/``false``."""
    return {
        name.removesuffix("_unix_nano"): str(value).lower() if isinstance(value, bool) else value
        for name, value in filters.given().items()
    }
