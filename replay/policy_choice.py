"""Which policy judges a recorded run: ``--policy`` specs, shipped files, recorded tables.

``loopwatch replay`` and ``loopwatch demo`` choose policies the same way (a
``FILE[:PROFILE]`` spec, the shipped ``default`` and ``seed`` files, a built-in profile
name); a run in loopwatch's own format may also carry the policy it was recorded under
as a profile table (``metadata.replay.policy``). Environment overrides
(``LOOPWATCH_POLICY_*``) are never applied: a recording is judged by the file as written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loopwatch.instrumentation import (
    Policy,
    PolicyError,
    PolicyProblem,
    builtin_profiles,
    load_policies,
)
from loopwatch.instrumentation.policy import policy_from_table

__all__ = [
    "DEFAULT_POLICY_FILE",
    "SHIPPED_POLICY_FILES",
    "NamedPolicy",
    "default_policy",
    "load_policy_spec",
    "policy_table",
    "recorded_policy",
    "resolve_policy",
    "unique_labels",
]

DEFAULT_POLICY_FILE: Final = Path(__file__).resolve().parent / "policies" / "default.toml"
"""The shipped replay policy (``loopwatch replay`` without ``--policy``)."""

SHIPPED_POLICY_FILES: Final[Mapping[str, Path]] = {
    "default": DEFAULT_POLICY_FILE,
    "seed": Path(__file__).resolve().parents[1] / "instrumentation" / "profiles" / "seed.toml",
}
"""Policy files shipped with the package, by the short name ``--policy`` accepts."""


@dataclass(frozen=True, slots=True)
class NamedPolicy:
    """A policy with the label results carry.

    Attributes:
        label: the ``policy`` value of each result (the profile name; ``FILE:PROFILE``
            when two chosen profiles share a name).
        policy: the profile.
        origin: the file it came from.
    """

    label: str
    policy: Policy
    origin: str

    @classmethod
    def of(cls, policy: NamedPolicy | Policy) -> NamedPolicy:
        """``policy`` itself, or a bare :class:`Policy` labelled with its name."""
        return (
            policy if isinstance(policy, NamedPolicy) else cls(policy.name, policy, policy.origin)
        )


def load_policy_spec(spec: str) -> list[NamedPolicy]:
    """Policies named by a ``FILE[:PROFILE]`` spec (the ``--policy`` option).

    ``FILE`` is a path, or ``default`` / ``seed`` for the shipped files (a file of that
    name in the working directory wins). Without ``:PROFILE`` every profile of the file
    is returned, in file order. A spec that is none of these but a built-in profile name
    (``investigate-readonly``, ...: the profiles of ``seed``) is that profile, as
    ``loopwatch demo --policy`` takes it.

    Raises:
        PolicyError: the file is missing, unreadable or invalid, or has no such profile
            (the problems name the file and the key).
    """
    path_text, profile = spec, None
    if not Path(spec).is_file() and ":" in spec:
        head, _, tail = spec.rpartition(":")
        if head and tail:
            path_text, profile = head, tail
    path = Path(path_text)
    if not path.is_file():
        shipped = SHIPPED_POLICY_FILES.get(path_text)
        if shipped is None and profile is None and not path.exists():
            builtin = builtin_profiles()
            if spec in builtin:
                return [NamedPolicy(spec, builtin[spec], str(SHIPPED_POLICY_FILES["seed"]))]
        if shipped is None:
            why = (
                "is a directory, not a policy file (give FILE or FILE:PROFILE)"
                if path.is_dir()
                else "no such policy file"
            )
            raise PolicyError([PolicyProblem("<file>", why, path_text)])
        path = shipped
    profiles = load_policies(path)
    if profile is None:
        return [NamedPolicy(name, p, str(path)) for name, p in profiles.items()]
    if profile not in profiles:
        raise PolicyError(
            [
                PolicyProblem(
                    f"profiles.{profile}",
                    f"no such profile (have: {', '.join(profiles)})",
                    str(path),
                )
            ]
        )
    return [NamedPolicy(profile, profiles[profile], str(path))]


def default_policy() -> NamedPolicy:
    """The first profile of :data:`DEFAULT_POLICY_FILE` (the shipped replay default)."""
    return load_policy_spec(str(DEFAULT_POLICY_FILE))[0]


def unique_labels(policies: Sequence[NamedPolicy]) -> list[NamedPolicy]:
    """``policies`` with labels made unique (``FILE-STEM:PROFILE``, then a counter)."""
    counts = Counter(p.label for p in policies)
    out: list[NamedPolicy] = []
    seen: set[str] = set()
    for p in policies:
        label = p.label if counts[p.label] == 1 else f"{Path(p.origin).stem}:{p.label}"
        base, n = label, 2
        while label in seen:
            label, n = f"{base}#{n}", n + 1
        seen.add(label)
        out.append(NamedPolicy(label, p.policy, p.origin))
    return out


def resolve_policy(spec: str | None = None) -> Policy:
    """The one policy of ``loopwatch demo --policy``, chosen as ``loopwatch replay`` does.

    Args:
        spec: a built-in profile name (``investigate-readonly``...), or ``FILE[:PROFILE]``
            (without ``:PROFILE`` the file's first profile). None: the first profile of
            :data:`DEFAULT_POLICY_FILE`, or the guard's default profile when that file
            is absent.

    Raises:
        PolicyError: unreadable or invalid file, unknown profile.
    """
    if spec is None:
        return default_policy().policy if DEFAULT_POLICY_FILE.is_file() else Policy()
    builtin = builtin_profiles()
    if spec in builtin:
        return builtin[spec]
    return load_policy_spec(spec)[0].policy


def recorded_policy(table: Mapping[str, Any], where: str) -> Policy:
    """A policy from a profile table of the policy file format (``name`` added), checked
    by the policy file's own rules (every limit and tool setting).

    Raises:
        ValueError: not a valid profile (the message names ``where``).
    """
    raw = dict(table)
    name = str(raw.pop("name", "recorded"))
    raw["version"] = str(raw.get("version", "recorded"))
    try:
        return policy_from_table(name, raw, source=where)
    except PolicyError as exc:
        first = exc.problems[0] if exc.problems else None
        why = f"{first.path}: {first.reason}" if first is not None else str(exc)
        raise ValueError(f"{where}: invalid policy: {why[:200]}") from None


def policy_table(policy: Policy) -> dict[str, Any]:
    """The limits set in ``policy`` (not the defaults) as a profile table, ``name``
    included: what :func:`recorded_policy` reads back."""
    table: dict[str, Any] = {"name": policy.name, "version": policy.version}
    for key, entry in policy.limits().items():
        # ``tools.NAME.risk`` rows show tool risks; the tools table below carries them.
        if entry["source"] != "default" and not key.startswith("tools."):
            table[key] = entry["value"]
    tools: dict[str, Any] = {}
    for name, tp in policy.tools.items():
        spec: dict[str, Any] = {"risk": tp.risk}
        if tp.volatile:
            spec["volatile"] = sorted(tp.volatile)
        if tp.progress:
            spec["progress"] = sorted(tp.progress)
        for key in ("repeat_limit", "idempotency_key", "timeout_seconds"):
            if getattr(tp, key) is not None:
                spec[key] = getattr(tp, key)
        tools[name] = spec
    if tools:
        table["tools"] = tools
    return table
