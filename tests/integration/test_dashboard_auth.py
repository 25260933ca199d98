"""A team's dashboard has a login (issue 27): refused anonymously, pages once signed in,
no secret in its output.

- Off loopback, ``loopwatch dashboard`` without an auth mode exits 2 with one line.
- ``--auth trusted-header``: a real ``loopwatch dashboard`` process, and Chromium
  (Playwright, ``/usr/bin/chromium``) without the header (refused, no page) and with it
  (the overview, "Signed in as").
- ``--auth oidc``: the router under ``AppTest`` with Streamlit's own test user
  (``AppTest.user``): anonymous sees only the login button, signed in sees the pages. A
  real ``loopwatch dashboard`` process with a real ``secrets.toml`` and a real (local)
  OpenID discovery endpoint: an anonymous browser sees only the login button, which
  leads to the provider's authorization endpoint with the client id and no secret; the
  process output, captured whole, holds neither ``client_secret`` nor ``cookie_secret``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from loopwatch.dashboard.auth import check_auth, check_oidc_secrets
from streamlit.testing.v1 import AppTest

from tests.bench.bench_dashboard import build_store
from tests.integration.services import free_port, loopwatch_command, poll_until

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CLIENT_SECRET = "cs-7d1e0b5a-never-logged"
COOKIE_SECRET = "ck-41f9c2aa-never-logged"
UI_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "store.duckdb"
    build_store(path, runs=200, long_steps=20, now_ns=time.time_ns())
    return path


def _require_browser() -> None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("needs the playwright package (pip install -e '.[dev]')")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"needs {CHROMIUM}")


# ------------------------------------------------------------------ at start


def _dashboard_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*loopwatch_command(), "dashboard", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--host", "0.0.0.0"], "--auth oidc"),
        (["--host", "10.1.2.3", "--auth", "none"], "reachable from other machines"),
        (["--host", "0.0.0.0", "--auth", "trusted-header"], "--auth-header"),
        (["--host", "0.0.0.0", "--auth", "oidc"], "secrets.toml"),
        (["--auth", "trusted-header", "--auth-header", "X Bad"], "header name"),
    ],
)
def test_a_team_dashboard_refuses_to_start_without_a_login(
    tmp_path: Path, store: Path, args: list[str], says: str
) -> None:
    done = _dashboard_cli("--db", str(store), *args, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""


def _secrets(tmp_path: Path, *, metadata_url: str, port: int, drop: str | None = None) -> Path:
    values = {
        "redirect_uri": f"http://127.0.0.1:{port}/oauth2callback",
        "cookie_secret": COOKIE_SECRET,
        "client_id": "loopwatch-dashboard",
        "client_secret": CLIENT_SECRET,
        "server_metadata_url": metadata_url,
    }
    lines = ["[auth]"] + [f'{k} = "{v}"' for k, v in values.items() if k != drop]
    path = tmp_path / "secrets.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_oidc_secrets_are_checked_without_showing_them(tmp_path: Path) -> None:
    path = _secrets(tmp_path, metadata_url="http://127.0.0.1:1/x", port=1, drop="redirect_uri")
    with pytest.raises(ValueError) as caught:
        check_oidc_secrets([path])
    message = str(caught.value)
    assert "redirect_uri" in message
    assert CLIENT_SECRET not in message and COOKIE_SECRET not in message
    path = _secrets(tmp_path, metadata_url="http://127.0.0.1:1/x", port=1)
    assert check_oidc_secrets([path]) is None  # [auth] itself is the provider
    config = check_auth("0.0.0.0", "oidc", secrets_files=[path])
    assert config.env() == {"LOOPWATCH_DASHBOARD_AUTH": "oidc"}
    assert check_auth("127.0.0.1", "none").mode == "none"


# ------------------------------------------------------------ AppTest (router)


def _router(monkeypatch: pytest.MonkeyPatch, store: Path, **env: str) -> AppTest:
    for name in ("COLLECTOR", "TOKEN_FILE", "LAKE", "LAKE_DATA", "AUTH", "AUTH_HEADER"):
        monkeypatch.delenv(f"LOOPWATCH_DASHBOARD_{name}", raising=False)
    monkeypatch.setenv("LOOPWATCH_DASHBOARD_DB", str(store))
    for name, value in env.items():
        monkeypatch.setenv(f"LOOPWATCH_DASHBOARD_{name}", value)
    return AppTest.from_file(str(APP), default_timeout=60)


def test_oidc_anonymous_session_sees_only_the_login(
    monkeypatch: pytest.MonkeyPatch, store: Path
) -> None:
    at = _router(monkeypatch, store, AUTH="oidc")
    at.user = {"is_logged_in": False}
    at.run()
    assert not at.exception
    assert [b.label for b in at.button] == ["Log in"]
    assert not at.metric and not at.dataframe
    assert "Stops" not in {m.label for m in at.metric}


def test_oidc_signed_in_session_sees_the_pages(
    monkeypatch: pytest.MonkeyPatch, store: Path
) -> None:
    at = _router(monkeypatch, store, AUTH="oidc")
    at.user = {"is_logged_in": True, "email": "alice@example.com", "name": "Alice"}
    at.run()
    assert not at.exception and not at.error
    assert "Stops" in {m.label for m in at.metric}  # the overview
    assert any("alice" in c.value for c in at.sidebar.caption)
    assert "Log out" in [b.label for b in at.sidebar.button]


def test_trusted_header_missing_is_refused_in_apptest(
    monkeypatch: pytest.MonkeyPatch, store: Path
) -> None:
    at = _router(monkeypatch, store, AUTH="trusted-header", AUTH_HEADER="X-Forwarded-User")
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and "Refused" in at.error[0].value
    assert not at.metric and not at.dataframe


# ------------------------------------------------------- real dashboard process


@contextlib.contextmanager
def _dashboard(tmp_path: Path, store: Path, port: int, *args: str) -> Iterator[Callable[[], str]]:
    """``loopwatch dashboard --db STORE --port PORT ARGS``; yields a reader of its output."""
    log = tmp_path / "dashboard.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*loopwatch_command(), "dashboard", "--db", str(store), "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"dashboard exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).text == "ok"
        except httpx.HTTPError:
            return False

    try:
        poll_until(healthy, timeout_seconds=60, what="the dashboard's /_stcore/health")
        yield lambda: log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def _browser() -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=UI_TIMEOUT_MS)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.mark.timeout(180)
def test_trusted_header_through_a_real_server(tmp_path: Path, store: Path) -> None:
    _require_browser()
    from playwright.sync_api import expect

    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    args = ("--auth", "trusted-header", "--auth-header", "X-Forwarded-User")
    with _dashboard(tmp_path, store, port, *args), _browser() as browser:
        anonymous = browser.new_page()
        anonymous.set_default_timeout(UI_TIMEOUT_MS)
        anonymous.goto(base)
        expect(anonymous.get_by_text("Refused:", exact=False)).to_be_visible()
        expect(anonymous.get_by_text("Abnormal-stop ratio")).to_have_count(0)
        proxied = browser.new_context(extra_http_headers={"X-Forwarded-User": "alice"})
        page = proxied.new_page()
        page.set_default_timeout(UI_TIMEOUT_MS)
        page.goto(base)
        expect(page.get_by_text("Abnormal-stop ratio")).to_be_visible()
        expect(page.get_by_text("Signed in as alice")).to_be_visible()
        expect(page.get_by_text("Refused:", exact=False)).to_have_count(0)


class _Provider(BaseHTTPRequestHandler):
    """An OpenID provider's discovery document and authorization endpoint (the browser
    stops there: a real login needs a real provider)."""

    authorize_queries: list[dict[str, list[str]]] = []  # noqa: RUF012 (one test's record)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        del format, args

    def do_GET(self) -> None:
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        url = urlparse(self.path)
        if url.path == "/.well-known/openid-configuration":
            body = json.dumps(
                {
                    "issuer": base,
                    "authorization_endpoint": f"{base}/authorize",
                    "token_endpoint": f"{base}/token",
                    "jwks_uri": f"{base}/jwks",
                    "response_types_supported": ["code"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["RS256"],
                }
            ).encode()
            kind = "application/json"
        elif url.path == "/authorize":
            type(self).authorize_queries.append(parse_qs(url.query))
            body, kind = b"<html><body><h1>provider login</h1></body></html>", "text/html"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.timeout(180)
def test_oidc_through_a_real_server_logs_no_secret(tmp_path: Path, store: Path) -> None:
    _require_browser()
    from playwright.sync_api import expect

    provider = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    threading.Thread(target=provider.serve_forever, daemon=True).start()
    metadata = f"http://127.0.0.1:{provider.server_address[1]}/.well-known/openid-configuration"
    port = free_port()
    secrets = _secrets(tmp_path, metadata_url=metadata, port=port)
    args = ("--auth", "oidc", "--secrets", str(secrets))
    try:
        with _dashboard(tmp_path, store, port, *args) as output, _browser() as browser:
            page = browser.new_page()
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.goto(f"http://127.0.0.1:{port}/")
            login = page.get_by_role("button", name="Log in")
            expect(login).to_be_visible()
            expect(page.get_by_text("Abnormal-stop ratio")).to_have_count(0)
            login.click()
            expect(page.get_by_text("provider login")).to_be_visible()
            query = _Provider.authorize_queries[-1]
            assert query["client_id"] == ["loopwatch-dashboard"]
            assert query["redirect_uri"] == [f"http://127.0.0.1:{port}/oauth2callback"]
            assert CLIENT_SECRET not in page.url and COOKIE_SECRET not in page.url
            text = output()
    finally:
        provider.shutdown()
    assert text.strip(), "the dashboard's output was captured"
    assert CLIENT_SECRET not in text and COOKIE_SECRET not in text
