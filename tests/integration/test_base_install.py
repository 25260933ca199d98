"""The agent side installs and works with ``opentelemetry-api`` alone (no SDK, no extras)."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

from ..conftest import REPO

SCRIPT = r"""
import importlib.util, sys
assert importlib.util.find_spec("opentelemetry.sdk") is None, "SDK must not be installed"
assert importlib.util.find_spec("click") is None
from loopwatch.instrumentation import Decision, Policy, ToolCall, agent, decision, tool, builtin_profiles
from loopwatch.instrumentation.testing import ConstantTool, ScriptedModel

backend = ConstantTool()
model = ScriptedModel([Decision.tool(ToolCall("get_details_by_id", {"id": 1}))] * 9)

@tool
def get_details_by_id(id):
    return backend(id=id)

@decision
def decide():
    return model()

@agent(name="base", policy=Policy.build(repeat_limit=3))
def loop():
    while True:
        for c in decide().tool_calls:
            get_details_by_id(**c.arguments)

outcome = loop()
assert outcome.stop.reason.value == "repeated_action", outcome.stop
assert (model.calls, backend.calls) == (3, 2)
assert "investigate-readonly" in builtin_profiles()
forbidden = [m for m in sys.modules if m.split(".")[0] in ("duckdb", "streamlit", "yaml", "click", "prometheus_client")]
assert not forbidden, forbidden
print("BASE-OK")
"""


@pytest.mark.timeout(600)
def test_base_install_has_only_the_api(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(REPO)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    listed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert (
        "opentelemetry-api" in names and "opentelemetry-sdk" not in names and "click" not in names
    )
    run = subprocess.run(
        [str(py), "-c", SCRIPT], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert run.returncode == 0 and "BASE-OK" in run.stdout, run.stderr[-3000:]
    cli = subprocess.run(
        [str(env_dir / "bin" / "loopwatch"), "check-policy", "x.toml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 2 and "pip install 'loopwatch[cli]'" in cli.stderr
    assert "Traceback" not in cli.stderr
