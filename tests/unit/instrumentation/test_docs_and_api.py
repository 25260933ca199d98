"""Docs list every name the code spells; the public API is what ``__all__`` says."""

from __future__ import annotations

import importlib
import re

import pytest
from loopwatch.instrumentation import _semconv as sc
from loopwatch.instrumentation.policy import LIMIT_FIELDS

from ...conftest import REPO


def semconv_names() -> dict[str, str]:
    skip = {"SEMCONV_VERSION", "DETECTOR_VERSION", "INSTRUMENTATION_NAME"}
    out = {}
    for key, value in vars(sc).items():
        if (
            key.isupper()
            and isinstance(value, str)
            and key not in skip
            and not key.startswith("SPAN_")
        ) and ("." in value or key.startswith(("ENV_", "OP_", "EVENT_", "OUTCOME_"))):
            out[key] = value
    return out


def test_semconv_doc_lists_every_name() -> None:
    doc = (REPO / "docs" / "semconv.md").read_text()
    missing = [
        f"{k}={v}" for k, v in semconv_names().items() if f"`{v}`" not in doc and v not in doc
    ]
    assert not missing, f"docs/semconv.md does not mention: {missing}"
    for template in (sc.SPAN_RUN, sc.SPAN_DECISION, sc.SPAN_TOOL, sc.SPAN_STOP):
        assert f"`{template}`" in doc


def test_no_attribute_string_literals_outside_semconv() -> None:
    pattern = re.compile(r"[\"'](loopwatch\.[a-z_]+\.[a-z_.]+|gen_ai\.[a-z_.]+)[\"']")
    offenders = []
    for path in (REPO / "instrumentation").rglob("*.py"):
        if path.name == "_semconv.py":
            continue
        for match in pattern.finditer(path.read_text()):
            offenders.append(f"{path.name}: {match.group(1)}")
    assert not [o for o in offenders if "loopwatch.instrumentation" not in o], offenders


def test_policy_doc_lists_every_limit() -> None:
    doc = (REPO / "docs" / "policy.md").read_text()
    assert [f for f in LIMIT_FIELDS if f"`{f}`" not in doc] == []


@pytest.mark.parametrize(
    "module",
    [
        "loopwatch.instrumentation",
        "loopwatch.instrumentation.testing",
        "loopwatch.instrumentation.guard",
        "loopwatch.instrumentation.policy",
        "loopwatch.instrumentation.runs",
        "loopwatch.instrumentation.decorators",
        "loopwatch.instrumentation.outcomes",
        "loopwatch.instrumentation.errors",
    ],
)
def test_all_matches_public_names(module: str) -> None:
    mod = importlib.import_module(module)
    exported = set(mod.__all__)
    for name in exported:
        assert hasattr(mod, name), f"{module}.__all__ names missing {name}"
        obj = getattr(mod, name)
        if callable(obj) and not name.startswith("__"):
            assert obj.__doc__, f"{module}.{name} has no docstring"


def test_errors_module_draws_the_tree() -> None:
    from loopwatch.instrumentation import errors

    for name in errors.__all__:
        if name != "PolicyProblem":
            assert name in (errors.__doc__ or ""), name


def test_closed_sets_are_defined_once_and_agree() -> None:
    """Every loop detector stops with the stop reason of its name; the tool outcomes are
    the values the spans carry."""
    from loopwatch.instrumentation import LoopDetector, StopReason, ToolOutcome
    from loopwatch.instrumentation import _semconv as sc

    assert {StopReason(d.value) for d in LoopDetector} <= set(StopReason)
    assert set(ToolOutcome) == {
        sc.OUTCOME_OK,
        sc.OUTCOME_ERROR,
        sc.OUTCOME_BLOCKED,
        sc.OUTCOME_NUDGED,
    }
