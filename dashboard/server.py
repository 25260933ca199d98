"""The dashboard served as Streamlit's ASGI app (``st.App``), telling the browser where
the server is, so that deep links log no 404s.

Why: Streamlit's frontend cannot tell an app served under a base path from a page. On a
deep link such as ``/run?run_id=...`` it first probes ``/run/_stcore/health`` and
``/run/_stcore/host-config`` (404), then the parent ``/_stcore/...`` (streamlit/streamlit
issue 7074, open). The frontend skips that guess when the page sets
``window.__streamlit.BACKEND_BASE_URL`` (the hook Streamlit's own hosts use); this module
sets it through a middleware of ``st.App``, Streamlit's supported way to add routes and
middleware to its server. Pages and routing stay in :mod:`loopwatch.dashboard.app`.

``streamlit run dashboard/server.py`` finds :data:`app` (Streamlit's app discovery) and
serves it with the usual ``--server.*`` options.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import streamlit as st
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ROUTER", "BaseUrlHint", "app", "base_url_script"]

ROUTER: Final = Path(__file__).resolve().parent / "app.py"
"""The router script (``st.navigation``) the server runs per session."""


def base_url_script(root_path: str) -> bytes:
    """The ``<script>`` that tells Streamlit's frontend its server's base URL.

    Args:
        root_path: the ASGI ``root_path`` (``""`` when served at ``/``).

    Returns:
        UTF-8 bytes of one inline script, placed before the frontend's module bundle.
    """
    path = json.dumps(root_path.rstrip("/") + "/")
    return (
        "<script>window.__streamlit=Object.assign({},window.__streamlit,"
        f"{{BACKEND_BASE_URL:new URL({path},window.location.origin).href}});</script>"
    ).encode()


class BaseUrlHint:
    """ASGI middleware: puts :func:`base_url_script` at the start of every HTML page's
    ``<head>`` (Streamlit serves ``index.html`` for every page path); other responses
    pass unchanged.

    Args:
        app: the wrapped ASGI app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        page = "." not in path.rsplit("/", 1)[-1] and "/_stcore/" not in path
        if scope["type"] != "http" or scope.get("method") != "GET" or not page:
            await self.app(scope, receive, send)
            return
        # A page is index.html (a few kB): asked for uncompressed, so the script can be
        # put in (Streamlit's gzip middleware sits inside this one).
        scope = {
            **scope,
            "headers": [(k, v) for k, v in scope.get("headers") or [] if k != b"accept-encoding"],
        }
        start: dict[str, Any] = {}
        chunks: list[bytes] = []
        html = False

        async def wrapped(message: Message) -> None:
            nonlocal html
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                html = headers.get(b"content-type", b"").startswith(b"text/html")
                if not html:
                    await send(message)
                    return
                start.update(message)
                return
            if not html:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if b"<head>" in body:
                body = body.replace(
                    b"<head>", b"<head>" + base_url_script(scope.get("root_path", "")), 1
                )
            sized = [
                (k, str(len(body)).encode() if k == b"content-length" else v)
                for k, v in start.get("headers") or []
            ]
            await send({**start, "headers": sized})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, wrapped)


app = st.App(ROUTER, middleware=[Middleware(BaseUrlHint)])
"""The ASGI app ``streamlit run`` serves."""
