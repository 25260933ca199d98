"""Policy loading and validation: every problem reported with its path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from loopwatch.instrumentation import (
    Decision,
    Guard,
    Policy,
    PolicyError,
    Run,
    ToolCall,
    ToolPolicy,
    builtin_profiles,
    load_policies,
    load_policy,
)
from loopwatch.instrumentation.policy import LIMIT_FIELDS, MAX_POLICY_FILE_BYTES, check_policy_file

from ...conftest import TESTDATA

POLICIES = TESTDATA / "policies"

INVALID = [
    ("negative_limit.toml", ["profiles.p.max_tokens: must be >= 0, got -5"]),
    (
        "non_finite.toml",
        ["profiles.p.max_cost_usd: must be finite", "profiles.p.max_tokens: must be finite"],
    ),
    ("zero_wall_clock.toml", ["profiles.p.max_elapsed_seconds: must be > 0, got 0"]),
    (
        "unknown_keys.toml",
        [
            "profiles.p.max_modle_turns: unknown key (did you mean 'max_model_turns'?)",
            "profiles.p.tools.t.colour: unknown key",
        ],
    ),
    (
        "bad_types.toml",
        [
            "profiles.p.max_model_turns: must be a number, got str",
            "profiles.p.repeat_limit: must be a number, got bool",
            "profiles.p.max_tool_attempts: must be a whole number",
            "profiles.p.tools.t.risk: must be 'read' or 'write'",
            "profiles.p.tools.t.volatile: must be a list of non-empty strings",
            "profiles.p.tools.t.idempotency_key: only write tools take an idempotency key",
            "profiles.p.tools.t.timeout_seconds: must be a finite number > 0",
        ],
    ),
    ("missing_version.toml", ["profiles.p.version: required"]),
    ("not_toml.toml", ["<toml>: not valid TOML"]),
    ("no_profiles.toml", ["title: unknown top-level key", "profiles: no profiles"]),
    (
        # Was: OverflowError tracebacks (math.isfinite on an int past a float's range).
        "huge_integers.toml",
        [
            "profiles.p.max_model_turns: must be <= 9223372036854775807, got a 400-digit integer",
            "profiles.p.max_cost_usd: too large for a number, got a 400-digit integer",
            "profiles.p.max_elapsed_seconds: must be > 0, got a 400-digit integer",
            "profiles.p.max_tokens: must be <= 9223372036854775807, got a 19-digit integer",
            "profiles.p.tools.t.repeat_limit: must be <= 9223372036854775807",
            "profiles.p.tools.t.timeout_seconds: too large for a number",
        ],
    ),
]


@pytest.mark.parametrize(("name", "expected"), INVALID, ids=[n for n, _ in INVALID])
def test_invalid_policy_files_report_every_problem(name: str, expected: list[str]) -> None:
    problems = [str(p) for p in check_policy_file(POLICIES / name)]
    for fragment in expected:
        assert any(fragment in p for p in problems), (fragment, problems)
    assert len(problems) >= len(expected)
    assert all(p.startswith(str(POLICIES / name)) for p in problems), "each line names the file"
    with pytest.raises(PolicyError) as info:
        load_policies(POLICIES / name)
    assert len(info.value.problems) == len(problems)


def test_zero_tool_attempts_is_legal() -> None:
    policy = load_policy(POLICIES / "zero_tools_ok.toml", environ={})
    assert policy.max_tool_attempts == 0 and policy.sources["max_tool_attempts"] == "file"


def test_missing_file_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="cannot read: No such file or directory"):
        load_policies(POLICIES / "does-not-exist.toml")


def test_a_policy_path_that_is_not_a_small_regular_file_is_refused(tmp_path: Path) -> None:
    """``check-policy /dev/zero`` grew to 3.4 GB in 4 s and a FIFO with no writer hung it
    (an adversarial review, 2026-12-02): the loader read any path whole. A FIFO is now
    refused before it is opened, and a file is read up to its cap."""
    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_bytes(b"# padding\n" * (MAX_POLICY_FILE_BYTES // 10 + 1))
    cases = [
        ("/dev/zero", "not a regular file"),
        (fifo, "not a regular file"),
        (tmp_path, "not a regular file"),
        (big, f"larger than {MAX_POLICY_FILE_BYTES} bytes"),
    ]
    for path, fragment in cases:
        with pytest.raises(PolicyError, match=re.escape(fragment)) as caught:
            load_policies(path)
        assert str(path) in str(caught.value)
        assert [str(p) for p in check_policy_file(path)] == [str(caught.value)]
    done = subprocess.run(
        [sys.executable, "-m", "loopwatch.cli", "check-policy", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "not a regular file" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_seed_profiles() -> None:
    profiles = builtin_profiles()
    assert list(profiles) == [
        "summarize-local",
        "investigate-readonly",
        "change-small",
        "external-write",
    ]
    expected = {
        "summarize-local": (3, 0),
        "investigate-readonly": (8, 12),
        "change-small": (6, 8),
        "external-write": (4, 2),
    }
    for name, (turns, tools) in expected.items():
        assert (profiles[name].max_model_turns, profiles[name].max_tool_attempts) == (turns, tools)
        assert profiles[name].version == "2026-11-30"
    ro = profiles["investigate-readonly"].tool("search_orders")
    assert ro.repeat_limit == 4 and ro.progress == frozenset({"cursor", "page"})
    email = profiles["external-write"].tool("send_email")
    assert email.risk == "write" and email.idempotency_key == "idempotency_key"


def test_limit_sources_and_precedence(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(
        '[profiles.a]\nversion = "v1"\nmax_model_turns = 8\nmax_tokens = 100\nmax_cost_usd = 2.0\n'
    )
    env = {"LOOPWATCH_POLICY_MAX_TOKENS": "50", "LOOPWATCH_POLICY_MAX_COST_USD": "1.5"}
    p = load_policy(f, environ=env, max_cost_usd=0.5)
    assert (p.max_model_turns, p.max_tokens, p.max_cost_usd) == (8, 50, 0.5)
    assert p.sources["max_model_turns"] == "file"
    assert p.sources["max_tokens"] == "env"
    assert p.sources["max_cost_usd"] == "call"
    assert p.sources["repeat_limit"] == "default"
    assert set(p.limits()) == {*LIMIT_FIELDS, "infer_write_risk"}


def test_bad_env_override_is_reported() -> None:
    with pytest.raises(PolicyError, match="LOOPWATCH_POLICY_MAX_TOKENS"):
        Policy().with_env({"LOOPWATCH_POLICY_MAX_TOKENS": "lots"})
    with pytest.raises(PolicyError, match="must be >= 0"):
        Policy().with_env({"LOOPWATCH_POLICY_MAX_TOKENS": "-1"})
    with pytest.raises(PolicyError, match="must be <= 9223372036854775807"):
        Policy().with_env({"LOOPWATCH_POLICY_MAX_TOKENS": "9" * 400})


def test_profile_selection(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('[profiles.a]\nversion = "1"\n[profiles.b]\nversion = "1"\n')
    with pytest.raises(PolicyError, match="name a profile"):
        load_policy(f, environ={})
    with pytest.raises(PolicyError, match="no such profile"):
        load_policy(f, "c", environ={})
    assert load_policy(f, "b", environ={}).name == "b"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_model_turns": -1}, "max_model_turns: must be >= 0"),
        ({"max_cost_usd": float("inf")}, "must be finite"),
        ({"max_elapsed_seconds": 0}, "must be > 0"),
        ({"repeat_limit": True}, "must be a number, got bool"),
        ({"max_turns": 3}, "unknown key"),
        ({"detector_window": 10**6}, "must be <= 4096"),
        ({"max_cost_usd": 10**400}, "max_cost_usd: too large for a number"),
        ({"max_tokens": 2**63}, "max_tokens: must be <= 9223372036854775807"),
        ({"max_model_turns": -(10**5000)}, "must be >= 0, got an integer of about 5001 digits"),
    ],
)
def test_policies_built_in_code_are_validated(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        Policy.build(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"risk": "WRITE"}, "tools.t.risk: must be 'read' or 'write', got 'WRITE'"),
        ({"timeout_seconds": float("nan")}, "timeout_seconds: must be a finite number > 0"),
        ({"timeout_seconds": -1}, "timeout_seconds: must be a finite number > 0"),
        ({"timeout_seconds": 0}, "timeout_seconds: must be a finite number > 0"),
        ({"volatile": "ts"}, "volatile: must be a collection of non-empty strings, got str"),
        ({"volatile": 3}, "volatile: must be a collection of non-empty strings, got int"),
        # A mapping's values were dropped without a word; an iterator could be endless.
        ({"volatile": {"ts": False}}, "volatile: must be a collection of non-empty strings"),
        ({"progress": iter(["page"])}, "progress: must be a collection of non-empty strings"),
        ({"progress": frozenset({""})}, "progress: must be a collection of non-empty strings"),
        ({"repeat_limit": 0}, "repeat_limit: must be a whole number >= 1"),
        ({"repeat_limit": 2.5}, "repeat_limit: must be a whole number >= 1"),
        ({"idempotency_key": "k"}, "only write tools take an idempotency key"),
        ({"risk": "write", "idempotency_key": ""}, "idempotency_key: must be a non-empty"),
    ],
)
def test_tool_policies_built_in_code_are_validated_as_files_are(
    kwargs: dict[str, object], fragment: str
) -> None:
    """A ``ToolPolicy`` built in code was never checked (an adversarial review,
    2026-12-02): ``risk="WRITE"`` made a write tool a read, so a repeated e-mail send was
    allowed; a NaN timeout timed every call out at once; ``volatile="ts"`` became the
    fields ``t`` and ``s``. The same values in a policy file were refused."""
    with pytest.raises(PolicyError, match=re.escape(fragment)):
        ToolPolicy("t", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [None, 123])
def test_a_tool_name_that_is_not_a_string_is_refused(name: object) -> None:
    """``ToolPolicy(123)`` was stored under the key ``123``, so ``tool("123")`` never
    found its settings (a review, 2026-12-02). The empty name stays legal: it is what
    ``Policy.tool`` builds for a model's empty tool call."""
    with pytest.raises(PolicyError, match="the tool name must be a string"):
        ToolPolicy(name)  # type: ignore[arg-type]


def test_a_numpy_array_field_is_a_policy_error_not_a_value_error() -> None:
    """The default-values fast path compared before checking the type, so an array's
    element-wise ``==`` raised ``ValueError`` (a review, 2026-12-02)."""

    class Elementwise(list[str]):
        def __eq__(self, other: object) -> bool:
            raise ValueError("truth value is ambiguous")

        __hash__ = None  # type: ignore[assignment]

    tool = ToolPolicy("t", volatile=Elementwise(["a"]))  # type: ignore[arg-type]
    assert tool.volatile == frozenset({"a"})


def test_tool_policy_values_are_normalised() -> None:
    """Any iterable of strings is a field set; an undeclared tool (``Policy.tool``, also
    for an empty name a model may send) is the defaults, never a ``PolicyError`` (a
    review, 2026-12-02: ``before_tool_call("")`` raised one)."""
    keys = ToolPolicy("t", volatile={"a": 1}.keys(), progress=["page"])  # type: ignore[arg-type]
    assert keys.volatile == frozenset({"a"}) and keys.progress == frozenset({"page"})
    assert Policy().tool("") == ToolPolicy("", risk_source="default")
    guard = Guard(Policy())
    guard.before_model_call()
    guard.record_decision(Decision.tool(ToolCall("", {})))
    assert guard.before_tool_call("", {}) is not None  # a ticket or a refusal, no raise
    tool = ToolPolicy("t", volatile=["a", "b"], progress=("cursor",), repeat_limit=3.0)  # type: ignore[arg-type]
    assert tool.volatile == frozenset({"a", "b"}) and tool.progress == frozenset({"cursor"})
    assert tool.repeat_limit == 3 and isinstance(tool.repeat_limit, int)
    assert ToolPolicy("t", timeout_seconds=2).timeout_seconds == 2.0


@pytest.mark.parametrize(
    "kwargs",
    [{"detector_window": 16.0}, {"cycle_max_period": 3.0}, {"repeat_limit": 4.0}],
)
def test_whole_number_floats_for_counts_become_ints(kwargs: dict[str, float]) -> None:
    """``Policy.build(detector_window=16.0)`` passed validation ("a whole number"), then
    ``Guard`` raised an untyped ``TypeError`` (an adversarial review, 2026-12-02). The
    file loader converted such values; a policy built in code, directly or through
    ``with_overrides``, now does too, and a guard runs on it."""
    ((key, value),) = kwargs.items()
    for policy in (
        Policy.build(**kwargs),
        Policy(**kwargs),  # type: ignore[arg-type]
        Policy().with_overrides(**kwargs),
    ):
        assert getattr(policy, key) == int(value)
        assert isinstance(getattr(policy, key), int)
        with Run("a", policy, tools={"poll": lambda: "pending"}) as run:
            while not run.stopped:
                run.decide(lambda: Decision.tool(ToolCall("poll")))
                if not run.stopped:
                    run.call_tool("poll", {})
        assert run.outcome.stop.reason.value == "repeated_action"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_tokens": 1e30}, "max_tokens: must be <= 9223372036854775807, got 1e+30"),
        ({"max_model_turns": -1e30}, "max_model_turns: must be >= 0, got -1e+30"),
    ],
)
def test_a_whole_float_count_beyond_64_bits_is_refused(
    kwargs: dict[str, float], fragment: str
) -> None:
    """``Policy.build(max_tokens=1e30)`` was accepted, converted to an int of 31 digits,
    and then every rebuild (``with_overrides``, ``Run``) refused it (a review,
    2026-12-02); the file loader refused it outright."""
    with pytest.raises(PolicyError, match=re.escape(fragment)):
        Policy.build(**kwargs)


def test_policy_is_immutable() -> None:
    p = Policy.build(max_model_turns=3, tools=(ToolPolicy("t"),))
    with pytest.raises(AttributeError):
        p.max_model_turns = 100  # type: ignore[misc]


def test_check_policy_cli() -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "loopwatch.cli", "check-policy", str(POLICIES / "bad_types.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    lines = bad.stdout.strip().splitlines()
    assert len(lines) == 7 and all(str(POLICIES / "bad_types.toml") in line for line in lines)
    seed = Path(__file__).resolve().parents[3] / "instrumentation" / "profiles" / "seed.toml"
    ok = subprocess.run(
        [sys.executable, "-m", "loopwatch.cli", "check-policy", str(seed)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0 and "ok (summarize-local" in ok.stdout


def test_check_policy_suggests_the_key_a_misspelt_one_was_meant_to_be(tmp_path: Path) -> None:
    path = tmp_path / "typos.toml"
    path.write_text(
        "[profile.p]\n"  # the top-level table is `profiles`
        "[profiles.q]\n"
        'version = "1"\n'
        "no_progres_patience = 4\n"
        "loop_respons = ['warn', 'stop']\n"
        "wholly_unrelated = 1\n"
        "[profiles.q.tools.search]\n"
        "repeat_limt = 2\n"
        "idempotency = 'key'\n",
        encoding="utf-8",
    )
    out = subprocess.run(
        [sys.executable, "-m", "loopwatch.cli", "check-policy", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1
    lines = {line.split(": ", 1)[1] for line in out.stdout.strip().splitlines()}
    assert lines == {
        "profile: unknown top-level key (did you mean 'profiles'?)"
        " (profiles live under [profiles.NAME])",
        "profiles.q.loop_respons: unknown key (did you mean 'loop_response'?)",
        "profiles.q.no_progres_patience: unknown key (did you mean 'no_progress_patience'?)",
        "profiles.q.tools.search.idempotency: unknown key (did you mean 'idempotency_key'?)",
        "profiles.q.tools.search.repeat_limt: unknown key (did you mean 'repeat_limit'?)",
        "profiles.q.wholly_unrelated: unknown key",
    }


def test_policies_built_in_code_suggest_the_closest_key() -> None:
    with pytest.raises(
        PolicyError, match=r"max_turns: unknown key \(did you mean 'max_model_turns'\?\)"
    ):
        Policy.build(max_turns=3)
    with pytest.raises(
        PolicyError, match=r"repeat_limt: unknown key \(did you mean 'repeat_limit'\?\)"
    ):
        Policy().with_overrides(repeat_limt=3)
