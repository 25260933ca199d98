#!/usr/bin/env python3
"""Record the spans each agent framework's usual tracers emit, as OTLP/JSON fixtures.

For every framework and tracer of ``tests/frameworks/_route_a.py`` (pydantic-ai native and
OpenInference, openai-agents with OpenInference and OpenLLMetry, ...), runs the scripted
agent (a scripted model, no network) through the ``runaway``, ``success`` and ``paginate``
scenarios, captures the spans with the OpenTelemetry SDK's in-memory exporter, and writes
each scenario's spans to ``<out>/<framework>-<tracer>-<scenario>.json`` (an OTLP/JSON
``ExportTraceServiceRequest``: the OTel encoder's protobuf message, ids in hex). It also
writes ``<out>/versions.json``: the release of every package that shaped the spans, so a
version that moves is seen (``tests/frameworks/test_route_a.py`` compares it with what is
installed) and the fixtures are recorded again with this script.

Each framework and tracer runs in a subprocess of its framework venv (``.venv-fw``;
CrewAI in ``.venv-crewai``, see ``scripts/frameworks.sh``), because instrumentors patch
frameworks process-wide. The files carry no machine-specific data beyond trace and span
ids, timestamps and the SDK's random ``service.instance.id``.

Usage::

    python scripts/record_framework_spans.py                      # everything
    python scripts/record_framework_spans.py --framework langgraph --out /tmp/spans
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.frameworks import _route_a  # noqa: E402  (the repository root is put on the path first)

DEFAULT_OUT = ROOT / "tests" / "testdata" / "frameworks"


def venv_python(framework: str) -> Path:
    """The interpreter of the venv where ``framework`` and its tracers are installed."""
    venv = ".venv-crewai" if framework == "crewai" else ".venv-fw"
    return ROOT / venv / "bin" / "python"


def versions(python: Path, framework: str, tracer: str) -> dict[str, str]:
    """Installed release of every distribution listed for (framework, tracer)."""
    names = _route_a.DISTRIBUTIONS[framework] + _route_a.TRACER_DISTRIBUTIONS.get(
        (framework, tracer), []
    )
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))


def record(framework: str, tracer: str, out: Path) -> dict[str, str]:
    """Record one framework and tracer into ``out``; returns the versions it ran.

    Raises:
        SystemExit: the framework's venv is missing or the recording subprocess failed.
    """
    python = venv_python(framework)
    if not python.exists():
        raise SystemExit(f"{python} not found: run `bash scripts/frameworks.sh` first")
    print(f"recording {framework} / {tracer}", flush=True)
    done = subprocess.run(
        [
            str(python),
            "-m",
            "tests.frameworks._route_a",
            "--framework",
            framework,
            "--tracer",
            tracer,
            "--record",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{framework} / {tracer} failed:\n{done.stdout}\n{done.stderr}")
    return versions(python, framework, tracer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--framework",
        action="append",
        choices=sorted(_route_a.TRACERS),
        help="only this framework (repeatable; default: all)",
    )
    parser.add_argument("--tracer", action="append", help="only this tracer (repeatable)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "versions.json"
    manifest: dict[str, dict[str, str]] = {}
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for framework, tracer in _route_a.combos():
        if args.framework and framework not in args.framework:
            continue
        if args.tracer and tracer not in args.tracer:
            continue
        manifest[f"{framework}-{tracer}"] = record(framework, tracer, args.out)
    manifest_path.write_text(
        json.dumps(dict(sorted(manifest.items())), indent=1, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
