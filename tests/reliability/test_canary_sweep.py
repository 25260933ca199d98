"""Canary sweep: planted canaries never come out anywhere, and each one is counted.

Two canaries (one with characters that JSON-escaping, URL-encoding and UTF-8 change) are
planted, in their raw, JSON-escaped, URL-encoded, base64, base64-inside-a-payload and
MIME-wrapped base64 forms, in every field the two real clients can send:

- Python: the OpenTelemetry SDK (one ``OTLPSpanExporter`` export, protobuf): span names,
  span attributes (string, array, JSON-in-string, attribute key), events (name,
  attributes, a recorded exception's message and stack trace), links (attributes),
  status message, resource, instrumentation scope version; plus a real loopwatch
  :class:`Run` capturing tool arguments.
- Node: the OpenTelemetry JS SDK's OTLP/HTTP JSON exporter (``node_canaries.js``): span
  names, attributes, events, links, status, resource and scope name.

Then every place a value can come out is searched for every form the redactor knows
(:func:`canary_forms`): the DuckDB file and its write-ahead log as bytes (copied while the
collector runs, and the file again after it stopped), every text column of every table
(SQL), ``/metrics``, the collector's stdout and stderr at debug level, every read API
answer, and the dashboard (``loopwatch dashboard --collector URL`` in Chromium: the
rendered HTML of every page and every websocket frame Streamlit sent). Zero occurrences;
``loopwatch_canary_detections_total`` equals the number planted, per location.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from loopwatch.instrumentation.redaction import canary_forms

from tests.e2e.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, _dashboard, _require_browser
from tests.integration.services import NODE_DIR, CollectorProcess, ServiceError, node_modules

from .support import launch_collector, store_query

pytestmark = pytest.mark.timeout(170)

C1 = 'lw-canary/7f3a"9c21+\u00e9z'
C2 = "LWCANARY-00d1e5-secret"
CANARIES = (C1, C2)
HERE = Path(__file__).resolve().parent


def json_escaped(value: str) -> str:
    return json.dumps(value)[1:-1]


def url_encoded(value: str) -> str:
    return quote(value, safe="")


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def b64_inside(value: str) -> str:
    """The canary inside a longer base64 payload, at an offset that is not a multiple of 3."""
    return base64.b64encode(b"\x00payload:" + value.encode() + b":end").decode()


def mime_wrapped(value: str) -> str:
    """MIME base64 (76-char lines, RFC 2045) with a line break inside the canary's part."""
    text = base64.encodebytes(b"p" * 50 + value.encode() + b"q" * 40).decode()
    assert not any(form in text for form in canary_forms(value)), "no break inside the canary"
    return text


class Planted(Counter[str]):
    """Canary occurrences planted, by ``location`` label."""


def _python_client(otlp_url: str) -> Planted:
    from loopwatch.instrumentation import Decision, Policy, Run, ToolCall
    from loopwatch.instrumentation.testing import ConstantTool, ScriptedModel, drive
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, Status, StatusCode

    planted = Planted()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "canary-py", "deploy.note": C2})
    )
    planted["resource"] += 1
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("canary.scope", C1)
    planted["attribute"] += 1  # scope version

    with tracer.start_as_current_span(
        f"execute_tool {C1}",
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "lookup",
            "note": json_escaped(C1),
            "tags": ["ok", url_encoded(C1)],
            "gen_ai.tool.call.arguments": json.dumps({"q": {"deep": [C2]}}),
            f"key.{C2}": "v",
        },
    ) as first:
        planted["name"] += 1
        planted["attribute"] += 4
        first.add_event(f"evt {C2}", {"payload": b64(C1), "blob": b64_inside(C2)})
        planted["event"] += 3
        try:
            raise ValueError(f"boom {C2}")
        except ValueError as exc:
            first.record_exception(exc)  # exception.message, and the stack trace's last line
        planted["event"] += 2
        first.set_status(Status(StatusCode.ERROR, url_encoded(C2)))
        planted["status"] += 1
    with tracer.start_as_current_span(
        f"stop {C2}", links=[Link(first.get_span_context(), {"cert": mime_wrapped(C2)})]
    ):
        planted["name"] += 1
        planted["attribute"] += 1

    model = ScriptedModel(
        [Decision.tool(ToolCall("search", {"query": C2, "page": 1})), Decision.final("done")]
    )
    with Run(
        "canary-agent",
        Policy.build(),
        tools={"search": ConstantTool(name="search", result={"hits": 0})},
        capture_content=True,
        run_id="canary-run",
        tracer_provider=provider,
    ) as run:
        drive(run, model)
    spans = memory.get_finished_spans()
    for span in spans:
        attributes = span.attributes or {}
        if attributes.get("loopwatch.run.id") != "canary-run":
            continue  # the spans above are counted where they were planted
        for value in attributes.values():
            planted["attribute"] += str(value).count(C2)
    exporter = OTLPSpanExporter(endpoint=otlp_url, timeout=10)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    provider.shutdown()
    return planted


def _node_client(otlp_url: str, tmp_path: Path) -> Planted:
    modules = node_modules()
    plan = {
        "resource": {"service.name": "canary-node", "owner": C1},
        "scope": {"name": f"scope-{C2}", "version": "1.0.0"},
        "spans": [
            {
                "name": C1,
                "attributes": {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "fetch",
                    "arg": url_encoded(C2),
                    "json": json.dumps({"outer": {"inner": C1}}),
                },
                "events": [{"name": f"tool {C2}", "attributes": {"b": b64(C1)}}],
                "status": json_escaped(C1),
            },
            {
                "name": "second",
                "attributes": {"list": ["a", b64_inside(C1)]},
                "linkAttributes": {"mime": mime_wrapped(C1)},
            },
        ],
    }
    path = tmp_path / "node-plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    done = subprocess.run(
        ["node", str(HERE / "node_canaries.js"), otlp_url, str(path)],
        cwd=NODE_DIR,
        env={**os.environ, "NODE_PATH": str(modules)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise ServiceError(f"node_canaries.js exited {done.returncode}: {done.stderr[-2000:]}")
    exports = json.loads(done.stdout.strip().splitlines()[-1])["exports"]
    planted = Planted()
    planted["resource"] += exports
    planted["attribute"] += exports  # scope name, scanned once per request
    planted["name"] += 1
    planted["attribute"] += 2 + 1 + 1  # arg, json; list; link attribute
    planted["event"] += 2
    planted["status"] += 1
    return planted


FORMS = sorted({form for canary in CANARIES for form in canary_forms(canary)}, key=len)
BYTE_FORMS = sorted({form.encode("utf-8", "surrogatepass") for form in FORMS}, key=len)


def _leaks(text: str) -> list[str]:
    return [form for form in FORMS if form in text]


def _byte_leaks(data: bytes) -> list[bytes]:
    return [form for form in BYTE_FORMS if form in data]


def _api_documents(collector: CollectorProcess) -> dict[str, str]:
    documents: dict[str, str] = {}
    for path in ("/api/v1/runs", "/api/v1/stats", "/api/v1/tools", "/healthz", "/metrics"):
        documents[path] = collector.get(path, since=0).text
    for canary_flag in ("true", "false"):
        documents[f"runs?canary={canary_flag}"] = collector.get(
            "/api/v1/runs", since=0, canary=canary_flag
        ).text
    for item in json.loads(documents["/api/v1/runs"])["items"]:
        path = f"/api/v1/runs/{item['run_id']}"
        documents[path] = collector.get(path).text
    return documents


def _browse(base: str, run_ids: list[str]) -> dict[str, str]:
    from playwright.sync_api import sync_playwright

    seen: dict[str, str] = {}
    frames: list[bytes] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(30_000)

            def on_socket(ws: Any) -> None:
                ws.on(
                    "framereceived",
                    lambda payload: frames.append(
                        payload if isinstance(payload, bytes) else payload.encode("utf-8")
                    ),
                )

            page.on("websocket", on_socket)
            targets = [("overview", "Overview"), ("runs", "Stopped runs"), ("tools", None)]
            targets += [(f"run?run_id={quote(r)}", "Run view") for r in run_ids]
            for path, heading in targets:
                page.goto(f"{base}/{path}")
                if heading:
                    page.get_by_role("heading", name=heading).first.wait_for()
                page.wait_for_load_state("networkidle")
                time.sleep(0.3)
                seen[f"html:{path}"] = page.content()
                seen[f"text:{path}"] = page.inner_text("body")
        finally:
            browser.close()
    seen["websocket"] = b"".join(frames).decode("latin-1")
    seen["websocket-utf8"] = b"".join(frames).decode("utf-8", "replace")
    return seen


def test_canaries_are_counted_and_never_come_out(tmp_path: Path) -> None:
    """Proves the canary contract end to end over both real clients: see the module
    docstring for the fields planted and the places searched."""
    _require_browser()
    db = tmp_path / "canary.duckdb"
    collector = launch_collector(
        tmp_path,
        db_path=db,
        canaries=CANARIES,
        config="[sampling]\ncompleted_fraction = 1.0\n",
        env={"LOOPWATCH_LOG_LEVEL": "debug"},
    )
    try:
        planted = _python_client(collector.otlp_url) + _node_client(collector.otlp_url, tmp_path)
        metrics = collector.metrics()
        counted = {
            location: metrics.value("loopwatch_canary_detections_total", location=location) or 0
            for location in ("attribute", "event", "name", "status", "resource")
        }
        assert counted == {k: float(planted[k]) for k in counted}, (counted, dict(planted))
        print(f"\ncanaries planted and counted: {dict(planted)}")

        documents = _api_documents(collector)
        runs = json.loads(documents["/api/v1/runs"])["items"]
        assert len(runs) >= 3 and any(r["canary_detected"] for r in runs), runs
        assert "[REDACTED:canary]" in "".join(documents.values())
        for where, text in documents.items():
            assert not _leaks(text), (where, _leaks(text))

        # DuckDB file and WAL as bytes, while the collector runs.
        copies = {}
        for suffix in ("", ".wal"):
            source = Path(f"{db}{suffix}")
            if source.exists():
                copies[source.name] = source.read_bytes()
        assert f"{db.name}.wal" in copies or copies[db.name], copies.keys()
        for name, data in copies.items():
            assert not _byte_leaks(data), (name, _byte_leaks(data))

        with _dashboard(collector.http_url, tmp_path) as base:
            pages = _browse(base, [r["run_id"] for r in runs])
        assert "Run view" in pages["text:run?run_id=canary-run"]
        assert "canary-run" in pages["websocket"], "no data seen on Streamlit's websocket"
        assert "[REDACTED:canary]" in pages["websocket-utf8"] + "".join(pages.values())
        for where, text in pages.items():
            assert not _leaks(text), (where, _leaks(text))
        assert collector.stop() == 0, collector.stderr_text()
    finally:
        if collector.running:
            collector.kill()

    logs = "".join(p.read_text("utf-8", "replace") for p in tmp_path.glob("collector-*.std*"))
    assert "DEBUG" in logs, "the collector did not log at debug level"
    assert not _leaks(logs), _leaks(logs)
    assert not _byte_leaks(db.read_bytes())
    tables = store_query(
        db,
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE data_type = 'VARCHAR'",
    )
    scanned = 0
    for table, column in tables:
        for (value,) in store_query(
            db, f'SELECT "{column}" FROM "{table}" WHERE "{column}" IS NOT NULL'
        ):
            scanned += 1
            assert not _leaks(value), (table, column, _leaks(value))
    assert scanned > 50
    print(
        f"canary sweep: {len(FORMS)} forms searched in {len(documents)} API answers, "
        f"{len(pages)} dashboard captures, {len(copies)} db/wal copies, {scanned} stored values"
    )
