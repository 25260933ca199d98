"""Policies: immutable, named, versioned limits and detector settings.

A policy (a *profile*) is loaded from TOML under source control or built in code; no limit
ever comes from a prompt or a tool result. The file format is a contract (DESIGN section 3)::

    [profiles.investigate-readonly]
    version = "2026-11-30"
    max_model_turns = 8
    max_tool_attempts = 12
    repeat_limit = 3

    [profiles.investigate-readonly.tools.search_orders]
    risk = "read"
    volatile = ["request_id", "client_timestamp"]
    progress = ["cursor", "page"]
    repeat_limit = 4

A profile may answer a loop detection with a ladder of rungs instead of a stop at once
(:mod:`.ladder`, ``docs/policy.md``)::

    loop_response = ["nudge", "stop"]            # default ["stop"]
    nudge_template = "Not run: {tool} x{count}, same result ({unchanged}). {advice}"

    [profiles.investigate-readonly.loop_response_by_detector]
    repeated_action = ["warn", "nudge", "stop"]

Every effective limit records where it came from: ``default``, ``file``, ``env``,
``call`` (a keyword override in code) or ``parent`` (capped by a parent run's remaining
budget). Precedence, highest first: call > env > file > default. Environment overrides are
``LOOPWATCH_POLICY_<FIELD>`` (e.g. ``LOOPWATCH_POLICY_MAX_MODEL_TURNS=5``).

Tool risk has a provenance too (:attr:`ToolPolicy.risk_source`): ``declared`` (a policy
file or a :class:`ToolPolicy` built in code), ``framework`` (:meth:`Policy.with_tool_risks`:
MCP annotations, framework flags), ``inferred`` (an undeclared tool whose name marks a
likely write, :mod:`.tool_risk`; a profile turns this off with ``infer_write_risk =
false``) or ``default`` (undeclared: a read).

Validation reports every problem with its path (:class:`PolicyError`): unknown keys, bad
types (a bool is not a number), negative or non-finite numbers (``inf`` and ``nan`` are
refused: an omitted limit takes its documented default, never "unbounded"), a zero wall
clock. Zero tool attempts is legal (a model-only profile).
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from ._policy_checks import (
    DEFAULT_LOOP_RESPONSE,
    DEFAULT_NUDGE_TEMPLATE,
    INT,
    LIMIT_SPEC,
    ladder_problems,
    tool_problems,
    unknown_key,
    validate_values,
)
from .errors import PolicyError, PolicyProblem
from .tool_risk import infer_write_risk

__all__ = [
    "DEFAULT_VOLATILE_FIELDS",
    "LIMIT_FIELDS",
    "MAX_POLICY_FILE_BYTES",
    "RISK_SOURCES",
    "Policy",
    "ToolPolicy",
    "builtin_profiles",
    "check_policy_file",
    "load_policies",
    "load_policy",
    "policy_from_table",
]

Risk = Literal["read", "write"]
LimitSource = Literal["default", "file", "env", "call", "parent"]
RiskSource = Literal["declared", "framework", "inferred", "default"]
RISK_SOURCES: Final[tuple[str, ...]] = ("declared", "framework", "inferred", "default")
"""Where a tool's risk came from, strongest first (see :attr:`ToolPolicy.risk_source`)."""

# Dropped before fingerprinting at any depth, for every tool (DESIGN section 3: request ids,
# trace ids and timestamps vary per call and say nothing about what the action or the
# observation was). Per-tool ``volatile`` lists add to these.
DEFAULT_VOLATILE_FIELDS: Final[frozenset[str]] = frozenset(
    {
        "request_id",
        "requestid",
        "trace_id",
        "span_id",
        "correlation_id",
        "timestamp",
        "client_timestamp",
        "server_timestamp",
        "ts",
        "now",
        "server_time",
        "fetched_at",
        "retrieved_at",
        "generated_at",
        "checked_at",
        "elapsed_ms",
        "latency_ms",
        "duration_ms",
    }
)

LIMIT_FIELDS: Final[tuple[str, ...]] = tuple(LIMIT_SPEC)
_INFER: Final = "infer_write_risk"
MAX_POLICY_FILE_BYTES: Final = 1 << 20
"""Largest policy file read, in bytes (1 MiB; the shipped seed file is under 4 KiB)."""
_LADDER_KEYS: Final = frozenset({"loop_response", "loop_response_by_detector", "nudge_template"})
_PROFILE_KEYS: Final = frozenset(
    {
        *LIMIT_SPEC,
        *_LADDER_KEYS,
        "version",
        "description",
        "strict_tools",
        "infer_write_risk",
        "tools",
    }
)
_TOOL_KEYS: Final = frozenset(
    {"risk", "volatile", "progress", "repeat_limit", "idempotency_key", "timeout_seconds"}
)


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """Per-tool settings.

    Attributes:
        name: the tool name as the agent calls it (``gen_ai.tool.name``).
        risk: ``"read"`` or ``"write"``. Writes get a stricter repeat limit and are checked
            for duplicate intent across the detector window, not only in a row.
        volatile: argument/result fields dropped before fingerprinting, at any depth, in
            addition to :data:`DEFAULT_VOLATILE_FIELDS`.
        progress: progress-bearing fields (``cursor``, ``page``): always kept, and a changed
            value in the arguments or the result is progress evidence.
        repeat_limit: the N-th identical occurrence is refused (what it means in full:
            :class:`~.detectors.RepeatLimits`). ``None``: the profile's ``repeat_limit``
            for reads, 2 for writes.
        idempotency_key: argument holding the idempotency key of a write. The key is left
            out of the *intent* fingerprint, so a fresh key per attempt does not evade the
            duplicate-intent check; repeating the same key after a success is an idempotent
            replay (stable completion), not a new side effect.
        timeout_seconds: per-call timeout; ``None`` uses the profile's
            ``tool_timeout_seconds``. The run's remaining wall clock always bounds it.
        risk_source: where ``risk`` came from: ``declared`` (a policy file or code),
            ``framework`` (:meth:`Policy.with_tool_risks`), ``inferred`` (the tool's name,
            :func:`~.tool_risk.infer_write_risk`) or ``default`` (nothing declared it).
            Stops of a write tool name it in their evidence (``detail.risk_source``).

    Validated as a policy file's tool table is (DESIGN section 3: a policy is validated
    at load), so a tool built in code cannot hold what a file could not: ``volatile`` and
    ``progress`` are taken as any collection of non-empty strings (a set, list, tuple or
    ``dict.keys()``; a bare string, a mapping or an iterator is refused, and a string
    is not split into letters), a whole-number float ``repeat_limit`` becomes an
    ``int`` and ``timeout_seconds`` a ``float``.

    Raises:
        PolicyError: every invalid field, with its path ``tools.<name>.<field>``:
            ``risk`` other than ``"read"``/``"write"``, ``repeat_limit`` not a whole
            number >= 1, ``timeout_seconds`` not a finite number > 0, an empty
            ``idempotency_key`` or one on a read tool.
    """

    name: str
    risk: Risk = "read"
    volatile: frozenset[str] = frozenset()
    progress: frozenset[str] = frozenset()
    repeat_limit: int | None = None
    idempotency_key: str | None = None
    timeout_seconds: float | None = None
    risk_source: RiskSource = "declared"

    def __post_init__(self) -> None:
        if (
            type(self.name) is str
            and type(self.volatile) is frozenset
            and type(self.progress) is frozenset
            and not self.volatile
            and not self.progress
            and self.risk in ("read", "write")
            and self.risk_source in RISK_SOURCES
            and self.repeat_limit is None
            and self.idempotency_key is None
            and self.timeout_seconds is None
        ):
            return  # Policy.tool's undeclared tool (on every new tool): valid
        path = f"tools.{self.name}"
        problems = tool_problems(
            path,
            "<code>",
            risk=self.risk,
            repeat_limit=self.repeat_limit,
            key=self.idempotency_key,
            timeout=self.timeout_seconds,
        )

        def bad(where: str, message: str) -> None:
            problems.append(PolicyProblem(where, message, "<code>"))

        if self.risk_source not in RISK_SOURCES:
            bad(
                f"{path}.risk_source",
                f"must be one of {', '.join(RISK_SOURCES)}, got {self.risk_source!r}",
            )
        if not isinstance(self.name, str):  # "" is allowed: Policy.tool's undeclared tool
            bad(path, f"the tool name must be a string, got {type(self.name).__name__}")
        for attr in ("volatile", "progress"):
            value = getattr(self, attr)
            if isinstance(value, str | bytes | Mapping) or not isinstance(value, Collection):
                bad(
                    f"{path}.{attr}",
                    f"must be a collection of non-empty strings, got {type(value).__name__}",
                )
                continue
            items = tuple(value)
            if not all(isinstance(v, str) and v for v in items):
                bad(f"{path}.{attr}", "must be a collection of non-empty strings")
            else:
                object.__setattr__(self, attr, frozenset(items))
        if problems:
            raise PolicyError(problems)
        if self.repeat_limit is not None:
            object.__setattr__(self, "repeat_limit", int(self.repeat_limit))
        if self.timeout_seconds is not None:
            object.__setattr__(self, "timeout_seconds", float(self.timeout_seconds))


@dataclass(frozen=True, slots=True)
class Policy:
    """An immutable, named, versioned profile of limits and detector settings.

    Budget limits (``limit`` permits exactly ``limit`` uses; the next is refused before it
    leaves the process):

    - ``max_model_turns`` (count), ``max_tool_attempts`` (dispatched calls),
      ``max_tool_successes`` (calls that returned without error),
      ``max_retries_per_action`` (the first attempt is not a retry),
      ``max_elapsed_seconds`` (wall clock, > 0; ``elapsed >= limit`` is expired),
      ``max_tokens`` (input + output), ``max_cost_usd``.

    Detector settings: ``repeat_limit`` (identical action with unchanged observation, in a
    row with no :meth:`Guard.progress` in between: the N-th is refused),
    ``cycle_max_period`` and ``cycle_repetitions`` (periods 2..k repeated r times with
    unchanged observations), ``no_progress_patience`` (steps without progress evidence),
    ``repeated_decision_limit`` (same non-tool decision N times in the window),
    ``detector_window`` (steps of history kept; bounds memory).

    Loop response (:mod:`.ladder`): ``loop_response`` is the ladder of rungs (``warn``,
    ``nudge``, ``stop``) answering successive loop detections of a run, the last rung
    repeating; default ``("stop",)``. ``loop_response_by_detector`` gives one detector its
    own ladder (``{"repeated_action": ("nudge", "stop")}``). ``nudge_template`` is the text
    the model reads instead of a nudged call's result (placeholders ``{tool}``,
    ``{count}``, ``{unchanged}``, ``{advice}``; at most 2 KiB). Only the policy sets them:
    no tool result or prompt can.

    ``tool_timeout_seconds`` bounds one tool call. ``strict_tools``: a tool not listed in
    ``tools`` is an unknown tool (never dispatched). ``infer_write_risk`` (default True):
    an undeclared tool whose name marks a likely write (``create_ticket``) is a write
    (:meth:`tool`, :mod:`.tool_risk`).

    Attributes:
        name / version: recorded with every run and stop.
        sources: where each limit (and ``infer_write_risk``) came from
            (``default|file|env|call|parent``).
        origin: the file the profile was read from, or ``"<code>"``.
    """

    name: str = "default"
    version: str = "builtin"
    max_model_turns: int = 20
    max_tool_attempts: int = 40
    max_tool_successes: int = 40
    max_retries_per_action: int = 2
    max_elapsed_seconds: float = 300.0
    max_tokens: int = 1_000_000
    max_cost_usd: float = 10.0
    tool_timeout_seconds: float = 60.0
    repeat_limit: int = 3
    cycle_max_period: int = 4
    cycle_repetitions: int = 2
    no_progress_patience: int = 8
    repeated_decision_limit: int = 3
    detector_window: int = 64
    strict_tools: bool = False
    infer_write_risk: bool = True
    description: str = ""
    loop_response: tuple[str, ...] = DEFAULT_LOOP_RESPONSE
    loop_response_by_detector: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    nudge_template: str = DEFAULT_NUDGE_TEMPLATE
    tools: Mapping[str, ToolPolicy] = field(default_factory=dict)
    sources: Mapping[str, LimitSource] = field(default_factory=dict)
    origin: str = "<code>"
    env_applied: bool = field(default=False, repr=False, compare=False)
    """``LOOPWATCH_POLICY_<FIELD>`` was applied (or deliberately not, with ``environ={}``):
    a run takes the policy as it is."""

    def __post_init__(self) -> None:
        path = f"profiles.{self.name}"
        problems = validate_values({f: getattr(self, f) for f in LIMIT_FIELDS}, path, self.origin)
        if not self.name:
            problems.append(PolicyProblem(path, "name is empty", self.origin))
        if (
            self.loop_response != DEFAULT_LOOP_RESPONSE
            or self.loop_response_by_detector
            or self.nudge_template is not DEFAULT_NUDGE_TEMPLATE
        ):
            problems += ladder_problems(
                {k: getattr(self, k) for k in _LADDER_KEYS}, path, self.origin
            )
        if not isinstance(self.infer_write_risk, bool):
            problems.append(PolicyProblem(f"{path}.{_INFER}", "must be true or false", self.origin))
        if problems:
            raise PolicyError(problems)
        # A whole-number float for a count (16.0) passed validation; the guard needs an int
        # (a deque's maxlen, range()), as the file loader already converts.
        for f in LIMIT_FIELDS:
            value = getattr(self, f)
            if LIMIT_SPEC[f][0] == INT and isinstance(value, float):
                object.__setattr__(self, f, int(value))
        # A limit given to the constructor without a source was set in code.
        sources = {
            f: self.sources.get(f, "default" if getattr(self, f) == LIMIT_SPEC[f][1] else "call")
            for f in LIMIT_FIELDS
        }
        sources[_INFER] = self.sources.get(_INFER, "default" if self.infer_write_risk else "call")
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "tools", dict(self.tools))
        # Lists from a file or a call become tuples: the policy stays immutable.
        object.__setattr__(self, "loop_response", tuple(self.loop_response))
        object.__setattr__(
            self,
            "loop_response_by_detector",
            {k: tuple(v) for k, v in self.loop_response_by_detector.items()},
        )

    @classmethod
    def build(cls, name: str = "default", version: str = "builtin", **overrides: Any) -> Policy:
        """Build a policy in code; every given limit is recorded with source ``call``.

        Raises:
            PolicyError: an unknown field or an invalid value (all problems listed).
        """
        tools_raw = overrides.pop("tools", None)
        allowed = {*LIMIT_SPEC, *_LADDER_KEYS, "strict_tools", "description", _INFER}
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise PolicyError(
                [PolicyProblem(f"profiles.{name}.{k}", unknown_key(k, allowed)) for k in unknown]
            )
        problems = validate_values(overrides, f"profiles.{name}", "<code>")
        problems += ladder_problems(overrides, f"profiles.{name}", "<code>")
        if problems:
            raise PolicyError(problems)
        tools: dict[str, ToolPolicy] = {}
        for t in tools_raw or ():
            tools[t.name] = t
        sources: dict[str, LimitSource] = {
            k: "call" for k in overrides if k in LIMIT_SPEC or k == _INFER
        }
        return cls(name=name, version=version, tools=tools, sources=sources, **overrides)

    def with_overrides(self, source: LimitSource = "call", **overrides: Any) -> Policy:
        """A copy with some limits (or ``infer_write_risk``, or the loop-response keys)
        replaced; the new limits record ``source``.

        Raises:
            PolicyError: an unknown field or an invalid value.
        """
        allowed = {*LIMIT_SPEC, *_LADDER_KEYS, _INFER}
        unknown = sorted(set(overrides) - allowed)
        problems = [
            PolicyProblem(f"profiles.{self.name}.{k}", unknown_key(k, allowed)) for k in unknown
        ]
        problems += validate_values(overrides, f"profiles.{self.name}", f"<{source}>")
        problems += ladder_problems(overrides, f"profiles.{self.name}", f"<{source}>")
        if problems:
            raise PolicyError(problems)
        sources = dict(self.sources)
        sources.update({k: source for k in overrides if k not in _LADDER_KEYS})
        return replace(self, sources=sources, **overrides)

    def with_env(self, environ: Mapping[str, str] | None = None) -> Policy:
        """Apply ``LOOPWATCH_POLICY_<FIELD>`` overrides from the environment.

        Limits set in code (source ``call``) win over the environment (precedence
        call > env > file > default); every other limit named there takes its value.

        Raises:
            PolicyError: a value that does not parse or validate (all problems listed).
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems: list[PolicyProblem] = []
        for name, (kind, *_rest) in LIMIT_SPEC.items():
            raw = env.get(f"LOOPWATCH_POLICY_{name.upper()}")
            if raw is None or self.sources.get(name) == "call":
                continue
            try:
                values[name] = int(raw) if kind == INT else float(raw)
            except ValueError:
                problems.append(
                    PolicyProblem(
                        f"LOOPWATCH_POLICY_{name.upper()}", f"not a number: {raw[:40]!r}", "<env>"
                    )
                )
        if problems:
            raise PolicyError(problems)
        applied = self.with_overrides("env", **values) if values else self
        return replace(applied, env_applied=True)

    def with_tool_risks(self, risks: Mapping[str, Risk]) -> Policy:
        """A copy that declares the risk a framework knows for each tool (MCP annotations,
        framework flags). A tool the policy already lists keeps its own settings: the
        policy file is the operator's word and wins.

        Args:
            risks: ``{tool name: "read" | "write"}``.

        The tools added record ``risk_source="framework"``.

        Raises:
            PolicyError: a risk other than ``"read"`` or ``"write"``.
        """
        added = {
            n: ToolPolicy(name=n, risk=r, risk_source="framework")
            for n, r in risks.items()
            if n not in self.tools
        }
        return replace(self, tools={**self.tools, **added}) if added else self

    def tool(self, name: str) -> ToolPolicy:
        """Settings of tool ``name``.

        A declared tool (policy file, code, :meth:`with_tool_risks`) has its own settings.
        An undeclared one takes the defaults: a ``write`` with ``risk_source="inferred"``
        when ``infer_write_risk`` is on and its name marks a likely write
        (:func:`~.tool_risk.infer_write_risk`: ``create_ticket``, ``sendEmail``,
        ``tickets.delete``), else a ``read`` with ``risk_source="default"``.
        """
        found = self.tools.get(name)
        if found is not None:
            return found
        if self.infer_write_risk and infer_write_risk(name):
            return ToolPolicy(name=name, risk="write", risk_source="inferred")
        return ToolPolicy(name=name, risk_source="default")

    def timeout_for(self, tool: ToolPolicy) -> float:
        """Per-call timeout of ``tool`` in seconds."""
        return (
            tool.timeout_seconds if tool.timeout_seconds is not None else self.tool_timeout_seconds
        )

    def limits(self) -> dict[str, dict[str, Any]]:
        """Each effective limit and where it came from: ``{field: {"value", "source"}}``.

        Besides :data:`LIMIT_FIELDS`: ``infer_write_risk`` (bool), and
        ``tools.NAME.risk`` for each declared tool, its source ``declared`` or
        ``framework``. An inferred risk is decided when the tool is first called, so it
        shows where it acts: in the stop's evidence (``detail.risk_source``).
        """
        out = {f: {"value": getattr(self, f), "source": self.sources[f]} for f in LIMIT_FIELDS}
        out[_INFER] = {"value": self.infer_write_risk, "source": self.sources[_INFER]}
        for name, tp in self.tools.items():
            out[f"tools.{name}.risk"] = {"value": tp.risk, "source": tp.risk_source}
        return out

    def limits_json(self) -> str:
        """:meth:`limits` as compact JSON (the ``loopwatch.limits`` span attribute)."""
        return json.dumps(self.limits(), separators=(",", ":"), sort_keys=True)


def _string_list(
    value: Any, path: str, source: str, problems: list[PolicyProblem]
) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(PolicyProblem(path, "must be a list of non-empty strings", source))
        return frozenset()
    return frozenset(value)


def _is_table(
    raw: Any, keys: frozenset[str], path: str, source: str, problems: list[PolicyProblem]
) -> bool:
    """Whether ``raw`` is a table; its unknown keys are problems."""
    if not isinstance(raw, dict):
        problems.append(PolicyProblem(path, "must be a table", source))
        return False
    problems.extend(
        PolicyProblem(f"{path}.{k}", unknown_key(k, keys), source) for k in sorted(set(raw) - keys)
    )
    return True


def _parse_tool(
    name: str, raw: Any, path: str, source: str, problems: list[PolicyProblem]
) -> ToolPolicy | None:
    before = len(problems)
    if not _is_table(raw, _TOOL_KEYS, path, source, problems):
        return None
    volatile = _string_list(raw.get("volatile", []), f"{path}.volatile", source, problems)
    progress = _string_list(raw.get("progress", []), f"{path}.progress", source, problems)
    risk = raw.get("risk", "read")
    repeat_limit = raw.get("repeat_limit")
    key = raw.get("idempotency_key")
    timeout = raw.get("timeout_seconds")
    problems.extend(
        tool_problems(path, source, risk=risk, repeat_limit=repeat_limit, key=key, timeout=timeout)
    )
    if len(problems) > before:
        return None
    return ToolPolicy(
        name=name,
        risk=risk,
        volatile=volatile,
        progress=progress,
        repeat_limit=repeat_limit,
        idempotency_key=key,
        timeout_seconds=timeout,
    )


def _parse_profile(
    name: str, raw: Any, source: str, problems: list[PolicyProblem]
) -> Policy | None:
    path = f"profiles.{name}"
    before = len(problems)
    if not _is_table(raw, _PROFILE_KEYS, path, source, problems):
        return None
    version = raw.get("version")
    if not isinstance(version, str) or not version.strip():
        problems.append(
            PolicyProblem(
                f"{path}.version", "required: a non-empty string (recorded with every stop)", source
            )
        )
        version = "invalid"
    limits = {k: raw[k] for k in LIMIT_SPEC if k in raw}
    problems.extend(validate_values(limits, path, source))

    def setting(key: str, kind: type, default: Any, message: str) -> Any:
        value = raw.get(key, default)
        if isinstance(value, kind):
            return value
        problems.append(PolicyProblem(f"{path}.{key}", message, source))
        return default

    strict_tools = setting("strict_tools", bool, False, "must be true or false")
    infer = setting(_INFER, bool, True, "must be true or false")
    description = setting("description", str, "", "must be a string")
    tools_raw = setting("tools", dict, {}, "must be a table of tool tables")
    ladder = {k: raw[k] for k in _LADDER_KEYS if k in raw}
    problems.extend(ladder_problems(ladder, path, source))
    tools: dict[str, ToolPolicy] = {}
    for tool_name, tool_raw in tools_raw.items():
        parsed = _parse_tool(tool_name, tool_raw, f"{path}.tools.{tool_name}", source, problems)
        if parsed is not None:
            tools[tool_name] = parsed
    if len(problems) > before:
        return None
    values: dict[str, Any] = {
        k: (int(v) if LIMIT_SPEC[k][0] == INT else float(v)) for k, v in limits.items()
    }
    sources: dict[str, LimitSource] = {k: "file" for k in (*values, _INFER) if k in raw}
    return Policy(
        name=name,
        version=version,
        strict_tools=strict_tools,
        infer_write_risk=infer,
        description=description,
        tools=tools,
        sources=sources,
        origin=source,
        **ladder,
        **values,
    )


def _parse_document(text: str, source: str) -> tuple[dict[str, Policy], list[PolicyProblem]]:
    problems: list[PolicyProblem] = []
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        return {}, [PolicyProblem("<toml>", "not valid TOML: nested too deeply", source)]
    except ValueError as exc:  # a TOMLDecodeError, or an int past Python's digit limit
        return {}, [PolicyProblem("<toml>", f"not valid TOML: {exc}", source)]
    for key in sorted(set(doc) - {"profiles"}):
        hint = (
            " (did you mean 'profiles'?)" if unknown_key(key, {"profiles"}) != "unknown key" else ""
        )
        problems.append(
            PolicyProblem(
                key, f"unknown top-level key{hint} (profiles live under [profiles.NAME])", source
            )
        )
    profiles_raw = doc.get("profiles")
    if not isinstance(profiles_raw, dict) or not profiles_raw:
        problems.append(
            PolicyProblem("profiles", "no profiles: add a [profiles.NAME] table", source)
        )
        return {}, problems
    out: dict[str, Policy] = {}
    for name, raw in profiles_raw.items():
        parsed = _parse_profile(name, raw, source, problems)
        if parsed is not None:
            out[name] = parsed
    return out, problems


def load_policies(path: str | os.PathLike[str]) -> dict[str, Policy]:
    """Load every profile of a policy file.

    Args:
        path: a TOML file in the format above.

    Returns:
        ``{profile name: Policy}`` in file order.

    Raises:
        PolicyError: the file is unreadable, not a regular file (a FIFO, ``/dev/zero``),
            larger than :data:`MAX_POLICY_FILE_BYTES`, or any profile is invalid (every
            problem).
    """
    source = str(path)
    try:
        # Checked before opening: opening a FIFO blocks until a writer comes, and a
        # device such as /dev/zero is read without end.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise PolicyError([PolicyProblem("<file>", "not a regular file", source)])
        with open(path, "rb") as handle:
            data = handle.read(MAX_POLICY_FILE_BYTES + 1)
        if len(data) > MAX_POLICY_FILE_BYTES:
            raise PolicyError(
                [PolicyProblem("<file>", f"larger than {MAX_POLICY_FILE_BYTES} bytes", source)]
            )
        # utf-8-sig: a byte-order mark (Windows editors write one) is not TOML syntax.
        text = data.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        # strerror ("No such file or directory") says what to fix; never the content.
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else ""
        reason = f"{why} ({exc.__class__.__name__})" if why else exc.__class__.__name__
        raise PolicyError([PolicyProblem("<file>", f"cannot read: {reason}", source)]) from None
    profiles, problems = _parse_document(text, source)
    if problems:
        raise PolicyError(problems)
    return profiles


def policy_from_table(name: str, table: Mapping[str, Any], *, source: str = "<table>") -> Policy:
    """One profile from a table shaped like a file's ``[profiles.NAME]`` (parsed TOML or
    JSON), checked by the same rules as a policy file.

    For policies that travel inside other documents (a recorded run's own policy); limits
    record source ``file``.

    Args:
        name: the profile name.
        table: ``{"version": ..., limit: value, ..., "tools": {tool: {...}}}``.
        source: what to name in problems (a file and record, say).

    Raises:
        PolicyError: every problem, each with its path (``profiles.NAME.max_tokens``).

    Example::

        policy_from_table("p", {"version": "1", "max_model_turns": 5})
    """
    problems: list[PolicyProblem] = []
    parsed = _parse_profile(name, dict(table), source, problems)
    if problems or parsed is None:
        raise PolicyError(problems)
    return parsed


def load_policy(
    path: str | os.PathLike[str],
    profile: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Policy:
    """Load one profile, then apply environment and call overrides (call > env > file).

    Args:
        path: policy TOML file.
        profile: profile name; may be omitted when the file has exactly one profile.
        environ: environment to read ``LOOPWATCH_POLICY_<FIELD>`` from (``os.environ``
            when ``None``; pass ``{}`` to ignore the environment).
        **overrides: limits set in code (source ``call``).

    Raises:
        PolicyError: invalid file, unknown or ambiguous profile, invalid override.
    """
    profiles = load_policies(path)
    return (
        _select(profiles, profile, str(path)).with_env(environ).with_overrides("call", **overrides)
    )


def _select(profiles: Mapping[str, Policy], profile: str | None, source: str) -> Policy:
    known = ", ".join(profiles)
    if profile is None:
        if len(profiles) != 1:
            raise PolicyError(
                [PolicyProblem("profiles", f"name a profile: one of {known}", source)]
            )
        return next(iter(profiles.values()))
    if profile not in profiles:
        problem = PolicyProblem(f"profiles.{profile}", f"no such profile (have: {known})", source)
        raise PolicyError([problem])
    return profiles[profile]


def builtin_profiles() -> dict[str, Policy]:
    """The seed's four example profiles shipped with the package.

    ``summarize-local`` (3 model turns, 0 tools), ``investigate-readonly`` (8, 12),
    ``change-small`` (6, 8), ``external-write`` (4, 2); see ``profiles/seed.toml``.
    """
    ref = Path(__file__).with_name("profiles") / "seed.toml"
    profiles, problems = _parse_document(ref.read_text(encoding="utf-8"), "seed.toml")
    if problems:  # pragma: no cover - the shipped file is tested
        raise PolicyError(problems)
    return profiles


def check_policy_file(path: str | os.PathLike[str]) -> list[PolicyProblem]:
    """Validate a policy file; returns every problem (empty when valid). Never raises."""
    try:
        load_policies(path)
    except PolicyError as exc:
        return list(exc.problems)
    return []
