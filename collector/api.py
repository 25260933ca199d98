"""The collector's HTTP API on ``--http``: ``/metrics``, ``/healthz`` and the read API.

Every error, on every endpoint, uses one JSON envelope (STYLE rule 11)::

    {"error": {"status": 404, "code": "not_found", "message": "no run with that id"}}

Read endpoints (JSON; times in nanoseconds since the Unix epoch):

- ``GET /api/v1/runs``: filters ``stop_reason``, ``agent``, ``tool``, ``since``, ``until``
  (ns; no default window: all runs), ``canary`` and ``sampled`` (``true``/``false``),
  ``detector`` (a loop detector that stopped the run or that observe mode recorded on
  it), ``loop_tool`` (the tool that detection named); paging ``limit`` (1..max rows)
  and ``offset``, newest first by ``order``:
  ``time`` (default; the run's time moves when its stop arrives, so pages read while
  data arrives can skip or repeat a run) or ``first_seen`` (never moves; the answer
  carries ``next_cursor``, to pass back as ``cursor`` for the next page: each run that
  matches throughout is then listed once, and runs first seen later are left out; the
  older ``seen_before`` with offsets still works, but skips a run when one listed
  earlier is removed). Answers ``{"items": [...], "next_offset": int | null}`` (plus
  ``seen_before`` and ``next_cursor``); each item has ``steps_since_progress``,
  ``observe_reason`` (the loop detector observe mode recorded on the run, so a
  ``completed`` third-party run that looped says so in the list) and ``loop_tool`` (the
  tool that loop detection named) of its stop (each ``null`` without one).
- ``GET /api/v1/runs/{run_id}`` (any run id, slashes included, percent-encoded): the
  run (with its effective ``limits``, parsed, and ``detector_version``), its steps, its
  stop and parsed evidence, stop anomalies, tool call counts (``steps_truncated``,
  ``stop_anomalies_truncated``, ``tools_truncated``: the row cap cut them), the run's
  ``nudges`` and ``nudges_dropped`` (the response ladder, issue 26).
- ``GET /api/v1/stats``: ``since``, ``until`` (default: the last 24 h), ``bucket_seconds``
  (default 3600), ``agent``. Stops by reason per bucket, loop detections per tool
  (observe mode's included, as ``loopwatch_loop_detections_total`` counts them), runs per
  agent and stop reason (``runs_by_agent``), canary-flagged runs (``canary_runs``) and
  ``truncated``.
- ``GET /api/v1/tools``: ``since``, ``until`` (default: the last 24 h). ``{"items":
  [{tool, calls, ok, errors, blocked, runs, repeated_action_runs, nudged, nudges,
  nudges_recovered, nudge_recovery_rate}], "truncated": bool}``
  (``repeated_action_runs``: stopped for it or, in observe mode, detected;
  ``nudge_recovery_rate``: ``nudges_recovered / nudges``, ``null`` with no nudge).
- ``GET /api/v1/collectors``: ``{"items": [collector_id, ...]}``, the collectors whose
  runs the lake holds (``[]`` over a collector's own file).
- Over a lake (``loopwatch api --lake``), ``runs``, ``stats`` and ``tools`` also take
  ``collector`` (a ``collector_id``: only what that collector shipped), and each run
  carries its ``collector_id``; over a collector's own file ``collector`` is a 400.
- Integer parameters outside the signed 64-bit range are refused (400).

The SQL beyond :class:`StoreReader`'s methods is in :mod:`loopwatch.collector.store.reader`
and :mod:`loopwatch.collector.store.aggregates`. Queries
are parameterized and run on a worker thread with the store's time limit and row
cap. With a token configured every endpoint but ``/healthz`` needs
``Authorization: Bearer <token>`` (compared in constant time, never logged).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any, Final

from loopwatch.instrumentation import StopReason
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .detect import LOOP_DETECTORS
from .errors import ApiError, ReadTimeout
from .map import MAX_RUN_ID_CHARS
from .receive import token_matches
from .store import aggregates
from .store import reader as queries
from .store.reader import RunDetail, RunsPage, StoreReader
from .store.schema import RUN_ORDERS

if TYPE_CHECKING:
    import uvicorn

__all__ = ["ApiError", "create_api_app", "error_response", "http_server", "serve_lake_api"]

_NS: Final = 1_000_000_000
_DAY_NS: Final = 86_400 * _NS
_METRICS_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_MAX_FILTER_CHARS: Final = MAX_RUN_ID_CHARS
"""Longest filter value or run id taken (400 past it). Names are stored whole, so this is
what an agent, tool or run id may be for the list filters and the run view to reach it;
past 4,096 characters even a percent-encoded ASCII one nears the 16 KiB request line
that the HTTP server takes."""


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one JSON error envelope."""
    return JSONResponse(
        {"error": {"status": status, "code": code, "message": message}},
        status_code=status,
        headers=headers,
    )


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def _int_param(
    request: Request, name: str, default: int | None = None, *, minimum: int | None = None
) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "bad_parameter", f"{name} must be an integer") from None
    if not _INT64_MIN <= value <= _INT64_MAX:  # DuckDB binds BIGINT; past it, a 500
        raise ApiError(400, "bad_parameter", f"{name} must fit in a signed 64-bit integer")
    if minimum is not None and value < minimum:
        raise ApiError(400, "bad_parameter", f"{name} must be >= {minimum}")
    return value


def _bool_param(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ApiError(400, "bad_parameter", f"{name} must be true or false")


_STOP_REASONS: Final = frozenset(reason.value for reason in StopReason)


def _str_param(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > _MAX_FILTER_CHARS:
        raise ApiError(
            400, "bad_parameter", f"{name} is longer than {_MAX_FILTER_CHARS} characters"
        )
    return raw


def _choice_param(request: Request, name: str, allowed: Collection[str]) -> str | None:
    """A parameter that must be one of ``allowed`` (400 naming them otherwise)."""
    value = _str_param(request, name)
    if value is not None and value not in allowed:
        choices = ", ".join(sorted(allowed))
        raise ApiError(400, "bad_parameter", f"{name} must be one of: {choices}")
    return value


def _window(request: Request) -> tuple[int, int]:
    """``since`` and ``until`` (ns); default: the 24 h before now."""
    now = time.time_ns()
    until = _int_param(request, "until", now)
    until = now if until is None else until
    since = _int_param(request, "since", until - _DAY_NS)
    return (until - _DAY_NS if since is None else since), until


def _list_runs(reader: StoreReader, **filters: Any) -> RunsPage:
    """One page of runs, each with ``steps_since_progress``, ``observe_reason`` and
    ``loop_tool`` of its stop (worker thread)."""
    page = reader.list_runs(**filters)
    items = queries.attach_stop_summary(reader, page.items)
    return RunsPage(items, page.next_offset, page.seen_before, page.next_cursor)


def _cursor_param(request: Request) -> tuple[int, int] | None:
    """``cursor``: a ``next_cursor`` of an earlier ``order=first_seen`` page,
    ``<first_seen_unix_nano>.<run_key>`` (400 when it is not one)."""
    raw = request.query_params.get("cursor")
    if raw is None or raw == "":
        return None
    seen, dot, key = raw.partition(".")
    if dot and seen.isdigit() and key.isdigit() and len(seen) <= 19 and len(key) <= 20:
        first_seen, run_key = int(seen), int(key)
        if first_seen <= _INT64_MAX and run_key < 2**64:
            return first_seen, run_key
    raise ApiError(400, "bad_parameter", "cursor must be a next_cursor of an earlier page")


def _cursor_text(cursor: tuple[int, int]) -> str:
    return f"{cursor[0]}.{cursor[1]}"


def _get_run(reader: StoreReader, run_id: str) -> RunDetail | None:
    """One run, with its effective limits and detector version (worker thread)."""
    detail = reader.get_run(run_id)
    if detail is None:
        return None
    seen = detail.run.get("first_seen_unix_nano")
    extra = queries.run_extra(reader, run_id, first_seen_unix_nano=seen)
    if extra is not None:
        detail.run.update(extra)
    return detail


def create_api_app(
    reader: StoreReader,
    *,
    metrics: Callable[[], bytes] | None,
    health: Callable[[], dict[str, Any]],
    token: str | None = None,
    max_rows: int = 10_000,
) -> Starlette:
    """Build the ``/metrics``, ``/healthz`` and ``/api/v1`` app.

    Args:
        reader: the store's read helpers.
        metrics: returns the Prometheus text exposition; ``None``: no ``/metrics``
            (``loopwatch api`` over a lake: each collector serves its own).
        health: returns a JSON-ready health document (``status`` and facts).
        token: bearer token required on every endpoint but ``/healthz``.
        max_rows: the largest page size accepted.
    """

    token_bytes = token.encode("utf-8") if token is not None else b""

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapper(request: Request) -> Response:
            if token is not None:
                header = request.headers.get("authorization", "")
                scheme, _, presented = header.partition(" ")
                if scheme.lower() != "bearer" or not token_matches(
                    presented.strip().encode("utf-8", "surrogateescape"), token_bytes
                ):
                    return error_response(
                        401,
                        "unauthorized",
                        "a valid bearer token is required",
                        {"WWW-Authenticate": "Bearer"},
                    )
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message)
            except ReadTimeout:
                return error_response(
                    503, "query_timeout", "the query exceeded its time limit", {"Retry-After": "1"}
                )
            except ValueError as exc:
                return error_response(400, "bad_parameter", str(exc)[:200])

        return wrapper

    async def runs(request: Request) -> Response:
        stop_reason = _choice_param(request, "stop_reason", _STOP_REASONS)
        detector = _choice_param(request, "detector", LOOP_DETECTORS)
        order = _choice_param(request, "order", RUN_ORDERS) or "time"
        after = _cursor_param(request)
        if after is not None and order != "first_seen":
            raise ApiError(400, "bad_parameter", "cursor pages order=first_seen only")
        offset = _int_param(request, "offset", 0, minimum=0) or 0
        since, until = _int_param(request, "since"), _int_param(request, "until")
        if since is not None and until is not None:
            queries.check_window(since, until)  # as /stats and /tools
        if after is not None and offset:
            # Both would apply, and the rows the offset passes over would be skipped.
            raise ApiError(400, "bad_parameter", "give cursor or offset, not both")
        page = await run_in_threadpool(
            _list_runs,
            reader,
            stop_reason=stop_reason,
            agent=_str_param(request, "agent"),
            tool=_str_param(request, "tool"),
            since_unix_nano=since,
            until_unix_nano=until,
            canary=_bool_param(request, "canary"),
            sampled=_bool_param(request, "sampled"),
            detector=detector,
            loop_tool=_str_param(request, "loop_tool"),
            collector=_str_param(request, "collector"),
            limit=min(_int_param(request, "limit", 50, minimum=1) or 50, max_rows),
            offset=offset,
            order=order,
            seen_before=_int_param(request, "seen_before"),
            after=after,
        )
        body: dict[str, Any] = {"items": page.items, "next_offset": page.next_offset}
        if page.seen_before is not None:
            body["seen_before"] = page.seen_before
        if order == "first_seen":
            cursor = page.next_cursor
            body["next_cursor"] = None if cursor is None else _cursor_text(cursor)
        return JSONResponse(body)

    async def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if len(run_id) > _MAX_FILTER_CHARS:  # the collector refuses longer ones at ingest
            raise ApiError(400, "bad_parameter", "run id too long")
        detail = await run_in_threadpool(_get_run, reader, run_id)
        if detail is None:
            raise ApiError(404, "not_found", "no run with that id")
        # Shallow: asdict() deep-copies every step value (0.64 s of 0.74 s for 10,000 steps).
        return JSONResponse({f.name: getattr(detail, f.name) for f in fields(detail)})

    async def stats(request: Request) -> Response:
        since, until = _window(request)
        bucket = _int_param(request, "bucket_seconds", 3600, minimum=1) or 3600
        result = await run_in_threadpool(
            aggregates.stats,
            reader,
            since_unix_nano=since,
            until_unix_nano=until,
            bucket_seconds=bucket,
            agent=_str_param(request, "agent"),
            collector=_str_param(request, "collector"),
        )
        return JSONResponse(asdict(result))

    async def tools(request: Request) -> Response:
        since, until = _window(request)
        items, truncated = await run_in_threadpool(
            aggregates.tools,
            reader,
            since_unix_nano=since,
            until_unix_nano=until,
            collector=_str_param(request, "collector"),
        )
        return JSONResponse({"items": items, "truncated": truncated})

    async def collectors(request: Request) -> Response:
        return JSONResponse({"items": await run_in_threadpool(reader.collectors)})

    async def metrics_endpoint(request: Request) -> Response:
        assert metrics is not None  # routed only with a metrics callable
        body = await run_in_threadpool(metrics)
        return Response(body, media_type=_METRICS_TYPE)

    async def healthz(request: Request) -> Response:
        return JSONResponse(health())

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, "not_found", "no such endpoint")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(405, "method_not_allowed", "method not allowed")

    async def server_error(request: Request, exc: Exception) -> Response:
        return error_response(500, "internal", "internal error")

    metrics_routes = (
        [] if metrics is None else [Route("/metrics", guarded(metrics_endpoint), methods=["GET"])]
    )
    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            *metrics_routes,
            Route("/api/v1/runs", guarded(runs), methods=["GET"]),
            # ``path``: a run id is any string the agent chose, slashes included.
            Route("/api/v1/runs/{run_id:path}", guarded(run), methods=["GET"]),
            Route("/api/v1/stats", guarded(stats), methods=["GET"]),
            Route("/api/v1/tools", guarded(tools), methods=["GET"]),
            Route("/api/v1/collectors", guarded(collectors), methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error},
    )


def serve_lake_api(
    reader: StoreReader,
    *,
    host: str = "127.0.0.1",
    port: int = 9465,
    token: str | None = None,
    describe: str = "lake",
    announce: bool = True,
) -> None:
    """Serve ``/api/v1`` over a lake reader (``loopwatch api --lake``) until SIGTERM/SIGINT.

    The same app as a collector's (:func:`create_api_app`), without ``/metrics`` (each
    collector serves its own) and without an OTLP receiver. ``/healthz`` answers
    ``{"status": "ok", "source": describe}``.

    Raises:
        OSError: the address is in use or not available (before serving starts).
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    app = create_api_app(
        reader,
        metrics=None,
        health=lambda: {"status": "ok", "source": describe},
        token=token,
        max_rows=reader.max_rows,
    )
    if announce:
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        print(f"loopwatch api: {describe}, API http://{shown}:{bound[1]}/api/v1/runs", flush=True)
    try:
        http_server(app).run(sockets=[sock])
    finally:
        sock.close()


def http_server(app: Any) -> uvicorn.Server:
    """A uvicorn server for ``app``, as every loopwatch HTTP endpoint runs (not started).

    The HTTP parser and event loop are named, not "auto": uvicorn would otherwise pick
    httptools and uvloop whenever some other package installed them, and the collector
    would parse hostile input differently depending on the environment.
    """
    import uvicorn

    config = uvicorn.Config(
        app,
        loop="asyncio",
        http="h11",
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=10,
        server_header=False,
        date_header=False,
    )
    return uvicorn.Server(config)
