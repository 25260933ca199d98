"""Access: with a token configured, OTLP and the API refuse requests without it (401), the
comparison runs through :func:`hmac.compare_digest`, the token is never logged or stored,
and the default bind is loopback only.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path

import httpx
import pytest
from loopwatch.collector import receive as otlp_receive
from loopwatch.collector.config import load_config
from loopwatch.collector.errors import ConfigError
from loopwatch.collector.service import Collector
from starlette.testclient import TestClient

from .payloads import JSON, PROTOBUF, json_request, json_span, protobuf_request, tool_spans
from .support import launch_collector

pytestmark = pytest.mark.timeout(90)

TOKEN = "lw-access-token-5f0c2b9e7d41"
NEAR_MISS = TOKEN[:-1] + "X"
API_PATHS = ("/metrics", "/api/v1/runs", "/api/v1/runs/some-run", "/api/v1/stats", "/api/v1/tools")
BAD_HEADERS: tuple[dict[str, str | bytes], ...] = (
    {},
    {"Authorization": f"Bearer {NEAR_MISS}"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Bearer {TOKEN[:8]}"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": "Bearer"},
    {"Authorization": TOKEN},
    {"Authorization": f"Bearer {TOKEN} extra"},
    {"Authorization": "Bearer \u00e9\u00e8".encode("latin-1")},
    {"Authorization": b"Bearer \xff\xfe" + TOKEN.encode()},
)


def test_token_required_on_otlp_and_api_never_logged_or_stored(tmp_path: Path) -> None:
    """Every refusal is 401 with ``WWW-Authenticate: Bearer`` and nothing stored; the right
    token is accepted; ``/healthz`` stays open. At debug level neither the token nor the
    wrong tokens presented appear in the logs, any answer, or the DuckDB file."""
    db = tmp_path / "access.duckdb"
    collector = launch_collector(
        tmp_path, db_path=db, token=TOKEN, env={"LOOPWATCH_LOG_LEVEL": "debug"}
    )
    answers: list[str] = []
    try:
        spans = tool_spans(2)
        bodies = ((protobuf_request(spans), PROTOBUF), (json_request([json_span()]), JSON))
        with httpx.Client(timeout=10) as client:
            for headers in BAD_HEADERS:
                for body, content_type in bodies:
                    response = client.post(
                        collector.otlp_url,
                        content=body,
                        headers={"Content-Type": content_type, **headers},
                    )
                    assert response.status_code == 401, (headers, response.status_code)
                    assert response.headers["www-authenticate"] == "Bearer"
                    answers.append(response.text)
                for path in API_PATHS:
                    response = client.get(f"{collector.http_url}{path}", headers=headers)
                    assert response.status_code == 401, (path, headers)
                    assert response.json()["error"]["code"] == "unauthorized"
                    answers.append(response.text)
            assert client.get(f"{collector.http_url}/healthz").status_code == 200
            assert collector.get("/api/v1/runs", since=0).json()["items"] == []

            good = {"Authorization": f"Bearer {TOKEN}"}
            for body, content_type in bodies:
                response = client.post(
                    collector.otlp_url, content=body, headers={"Content-Type": content_type, **good}
                )
                assert response.status_code == 200
            for path in API_PATHS:
                response = client.get(f"{collector.http_url}{path}", headers=good)
                assert response.status_code == (404 if path.endswith("some-run") else 200)
                answers.append(response.text)
        assert collector.get(f"/api/v1/runs/{spans[0].trace_id}").status_code == 200
        metrics = collector.metrics()
        refused = metrics.total("loopwatch_collector_spans_rejected_total")
        assert refused == 0  # refused requests carry no counted spans
        assert collector.stop() == 0
    finally:
        if collector.running:
            collector.kill()
    logs = "".join(p.read_text("utf-8", "replace") for p in tmp_path.glob("collector-*.std*"))
    assert "DEBUG" in logs and "refused (unauthorized)" in logs
    for secret in (TOKEN, NEAR_MISS, TOKEN[:8] + "\n"):
        assert secret not in logs
        assert all(secret not in answer for answer in answers)
    assert TOKEN.encode() not in db.read_bytes()


def test_token_comparison_is_hmac_compare_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both apps compare through ``hmac.compare_digest`` over fixed-length digests, so the
    time taken reveals neither the content nor the length of the token."""
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(otlp_receive.hmac, "compare_digest", spy)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN, encoding="utf-8")
    config = load_config(
        environ={},
        overrides={
            "store": {"db": str(tmp_path / "x.duckdb")},
            "server": {"token_file": str(token_file)},
        },
    )
    collector = Collector(config)
    try:
        otlp = TestClient(collector.otlp_app())
        api = TestClient(collector.api_app())
        for presented in (TOKEN, NEAR_MISS, "short", TOKEN * 3):
            header = {"Authorization": f"Bearer {presented}", "Content-Type": JSON}
            otlp.post("/v1/traces", content=b"{}", headers=header)
            api.get("/api/v1/runs", headers=header)
    finally:
        collector.close()
    assert len(calls) == 8
    assert set(calls) == {(32, 32)}


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("127.0.0.1:4318", True),
        ("127.0.0.2:4318", True),
        ("localhost:4318", True),
        ("[::1]:4318", True),
        ("0.0.0.0:4318", False),
        ("[::]:4318", False),
        ("192.0.2.10:4318", False),
        ("example.invalid:4318", False),
    ],
)
def test_default_bind_is_loopback_only(address: str, allowed: bool) -> None:
    defaults = load_config(environ={})
    assert defaults.server.otlp_http == "127.0.0.1:4318"
    assert defaults.server.http == "127.0.0.1:9464"
    for field in ("otlp_http", "http"):
        overrides = {"server": {field: address}}
        if allowed:
            load_config(environ={}, overrides=overrides)
        else:
            with pytest.raises(ConfigError, match="not loopback"):
                load_config(environ={}, overrides=overrides)
            opened = {"server": {field: address, "allow_non_loopback": True}}
            assert getattr(load_config(environ={}, overrides=opened).server, field) == address


def test_config_description_masks_secrets(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN, encoding="utf-8")
    config = load_config(environ={}, overrides={"server": {"token_file": str(token_file)}})
    text = json.dumps(config.describe())
    assert TOKEN not in text and str(token_file) not in text and "**********" in text
