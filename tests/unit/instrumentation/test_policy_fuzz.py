"""Hostile policy files (issue 7): random bytes and random TOML through the policy loader.

Laws: loading returns profiles or raises :class:`PolicyError` (never another exception
type); every problem names the file it came from and a key path that exists in the
document (or ``<file>`` / ``<toml>`` / ``profiles`` for the file as a whole);
``check_policy_file`` never raises; each example finishes well within the deadline.
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopwatch.instrumentation.errors import PolicyError
from loopwatch.instrumentation.policy import LIMIT_FIELDS, Policy, check_policy_file, load_policies

_SETTINGS = settings(
    max_examples=300,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_WHOLE_FILE = {"<file>", "<toml>", "profiles"}
_TOOL_KEYS = ("risk", "volatile", "progress", "repeat_limit", "idempotency_key", "timeout_seconds")
_OTHER_KEYS = ("version", "description", "strict_tools", "tools", "unknown_knob")


# One folder for every example, removed when the test process exits: a folder per
# example left some 600 behind in /tmp on every run of the suite.
_FOLDER = tempfile.TemporaryDirectory(prefix="lw-policy-fuzz-")
_written = itertools.count()


def _write(data: bytes) -> Path:
    path = Path(_FOLDER.name) / f"hostile-{next(_written)}.toml"
    path.write_bytes(data)
    return path


def _key(name: str) -> str:
    bare = name and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
    return name if bare else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
names = st.one_of(
    st.sampled_from(["investigate", "a.b", "", " ", "ünï", "x" * 200]), st.text(max_size=12)
)
profile_keys = st.sampled_from((*LIMIT_FIELDS, *_OTHER_KEYS))


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """TOML text of a random policy document, and the document it spells."""
    doc: dict[str, Any] = {}
    lines: list[str] = []
    if draw(st.booleans()):
        top = draw(st.sampled_from(["profile", "limits", "version"]))
        value = draw(values)
        doc[top] = value
        lines.append(f"{_key(top)} = {_value(value)}")
    profiles: dict[str, Any] = {}
    for name in draw(st.lists(names, max_size=3, unique=True)):
        profile: dict[str, Any] = {}
        lines.append(f"[profiles.{_key(name)}]")
        for key in draw(st.lists(profile_keys, max_size=8, unique=True)):
            if key == "tools":
                continue
            value = draw(st.one_of(values, st.integers(-5, 500), st.just("2026-11-30")))
            profile[key] = value
            lines.append(f"{_key(key)} = {_value(value)}")
        tools: dict[str, Any] = {}
        for tool in draw(st.lists(names, max_size=2, unique=True)):
            table: dict[str, Any] = {}
            lines.append(f"[profiles.{_key(name)}.tools.{_key(tool)}]")
            for key in draw(
                st.lists(st.sampled_from((*_TOOL_KEYS, "bogus")), max_size=4, unique=True)
            ):
                value = draw(st.one_of(values, st.sampled_from(["read", "write"])))
                table[key] = value
                lines.append(f"{_key(key)} = {_value(value)}")
            tools[tool] = table
        if tools:
            profile["tools"] = tools
        profiles[name] = profile
    if profiles:
        doc["profiles"] = profiles
    return "\n".join(lines) + "\n", doc


def _exists(doc: dict[str, Any], path: str) -> bool:
    """Whether a problem's dotted path names a key of the document (names may hold dots,
    so every split into existing keys is tried)."""
    if path in _WHOLE_FILE or path in doc:
        return True

    def walk(node: Any, rest: str) -> bool:
        if not rest:
            return True
        if not isinstance(node, dict):
            return False
        for key, child in node.items():
            if rest == key:
                return True
            if rest.startswith(key + ".") and walk(child, rest[len(key) + 1 :]):
                return True
        return False

    return walk(doc, path)


def _load(path: Path) -> dict[str, Policy] | PolicyError:
    try:
        return load_policies(path)
    except PolicyError as exc:
        return exc


@_SETTINGS
@given(st.binary(max_size=2048))
def test_random_bytes(data: bytes) -> None:
    path = _write(data)
    outcome = _load(path)
    if isinstance(outcome, PolicyError):
        assert outcome.problems
        assert all(p.source == str(path) for p in outcome.problems)
        assert str(path) in str(outcome)
    else:
        assert all(isinstance(p, Policy) for p in outcome.values())
    assert isinstance(check_policy_file(path), list)


@_SETTINGS
@given(documents())
def test_random_toml_documents(case: tuple[str, dict[str, Any]]) -> None:
    text, doc = case
    path = _write(text.encode("utf-8", "surrogatepass"))
    outcome = _load(path)
    if isinstance(outcome, PolicyError):
        for problem in outcome.problems:
            assert problem.source == str(path), problem
            named = _exists(doc, problem.path) or (
                problem.reason.startswith("required")
                and _exists(doc, problem.path.rpartition(".")[0])
            )
            assert named, (problem, doc)
            assert problem.reason
    else:
        assert set(outcome) == set(doc.get("profiles", {}))
        for policy in outcome.values():
            for name in LIMIT_FIELDS:
                value = getattr(policy, name)
                assert math.isfinite(value) and value >= 0
    assert len(check_policy_file(path)) == (
        len(outcome.problems) if isinstance(outcome, PolicyError) else 0
    )


@pytest.mark.parametrize(
    ("label", "text"),
    [
        ("truncated table", "[profiles.x\nversion = "),
        ("nul bytes", '[profiles.x]\x00version = "1"\n'),
        ("duplicate key", '[profiles.x]\nversion = "1"\nversion = "2"\n'),
        ("huge integer", '[profiles.x]\nversion = "1"\nmax_tokens = 1' + "0" * 5000 + "\n"),
        ("integer past a float", '[profiles.x]\nversion = "1"\nmax_cost_usd = ' + "9" * 400),
        ("integer past int64", '[profiles.x]\nversion = "1"\nmax_tokens = ' + "9" * 400),
        (
            "tool integer past a float",
            '[profiles.x]\nversion = "1"\n[profiles.x.tools.t]\ntimeout_seconds = ' + "9" * 400,
        ),
        ("long line", '[profiles.x]\nversion = "' + "v" * 1_000_000 + '"\n'),
        ("many profiles", "".join(f'[profiles.p{i}]\nversion = "1"\n' for i in range(5000))),
    ],
)
def test_hostile_files(label: str, text: str) -> None:
    path = _write(text.encode("utf-8"))
    outcome = _load(path)
    if isinstance(outcome, PolicyError):
        assert all(p.source == str(path) for p in outcome.problems), label


@pytest.mark.parametrize(
    "nested",
    ["[" * 100_000 + "]" * 100_000, "{a=" * 5_000 + "1" + "}" * 5_000],
    ids=["arrays", "inline-tables"],
)
def test_deep_nesting_is_a_policy_error(nested: str) -> None:
    path = _write(f'[profiles.x]\nversion = "1"\nmax_tokens = {nested}\n'.encode())
    with pytest.raises(PolicyError) as info:
        load_policies(path)
    assert info.value.problems[0].source == str(path)


def test_a_byte_order_mark_is_not_a_syntax_error() -> None:
    """Windows Notepad saves UTF-8 with a BOM; the file is still valid TOML."""
    path = _write(b'\xef\xbb\xbf[profiles.a]\nversion = "1"\n')
    assert list(load_policies(path)) == ["a"]
