"""Snapshot and restore of a run's guard state (resume never grants a fresh budget).

The snapshot is a JSON-ready dict, format ``loopwatch.guard/1``: the usage counters, the
elapsed time, and every detector window. :func:`load` puts them back into a fresh
:class:`~.budgets.Budget` and :class:`~.detectors.Detectors`; the guard builds those (a
resumed child under its parent, capped by :func:`already_used`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Protocol

from .budgets import Budget
from .detectors import Action, Detectors
from .failures import FailureClass
from .outcomes import Stop
from .policy import Policy

__all__ = ["SNAPSHOT_FORMAT", "already_used", "check", "load", "snapshot"]


class _Named(Protocol):
    run_id: str
    policy: Policy


SNAPSHOT_FORMAT: Final = "loopwatch.guard/1"
_COUNTERS: Final = (
    "turns",
    "attempts",
    "successes",
    "errors",
    "blocked",
    "retries_total",
    "input_tokens",
    "output_tokens",
    "cost",
    "step",
    "steps_since_progress",
)
"""The numeric counters: the snapshot's names are the :class:`~.budgets.Budget`'s."""


def snapshot(
    run: _Named, budget: Budget, detectors: Detectors, stop: Stop | None, partial: str | None
) -> dict[str, Any]:
    """The run's state as a JSON-ready dict (see the module docstring); ``run`` gives the
    run id and policy."""
    d = detectors
    counters: dict[str, Any] = {name: getattr(budget, name) for name in _COUNTERS}
    counters["step_open"] = budget.step_open
    counters["step_progress"] = budget.step_progress
    return {
        "format": SNAPSHOT_FORMAT,
        "run_id": run.run_id,
        "policy": {"name": run.policy.name, "version": run.policy.version},
        "elapsed_seconds": budget.elapsed(),
        "counters": counters,
        "stop": stop.to_dict() if stop is not None else None,
        "actions": [[a.fingerprint, a.observation, a.tool, a.step, a.progress] for a in d.actions],
        "streak_steps": list(d.streak_steps),
        "streak_all": list(d.streak_all),
        "streak_count": d.streak_count,
        "streak_all_count": d.streak_all_count,
        "last_failure": [[k, v.value if v else None] for k, v in d.last_failure.items()],
        "retries": [[k, v] for k, v in d.retries.items()],
        "writes": [[k, [list(x) for x in v]] for k, v in d.writes.items()],
        "seen": [k for k, _ in d.seen.items()],
        "progress_values": [[list(k), v] for k, v in d.progress_values.items()],
        "decisions": [list(x) for x in d.decisions],
        "provided": sorted(d.provided),
        "partial": partial,
    }


def check(state: Mapping[str, Any]) -> None:
    """Refuse a state that cannot be resumed.

    Raises:
        ValueError: not a loopwatch guard snapshot, the run had already stopped, or a
            usage counter or the elapsed time is negative or not a finite number (a
            corrupted snapshot would give the resumed run budget back).
    """
    if state.get("format") != SNAPSHOT_FORMAT:
        raise ValueError("not a loopwatch guard snapshot")
    if state.get("stop"):
        raise ValueError("the run had already stopped; start a new run instead")
    c = state["counters"]
    for name, value in (
        *((k, c[k]) for k in _COUNTERS),
        ("elapsed_seconds", state["elapsed_seconds"]),
    ):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"snapshot field {name!r} is not a number") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"snapshot field {name!r} must be a finite number >= 0")


def already_used(state: Mapping[str, Any]) -> dict[str, float]:
    """What the run had used, by limit name (a resumed child stays within its cap)."""
    c = state["counters"]
    return {
        "max_model_turns": int(c["turns"]),
        "max_tool_attempts": int(c["attempts"]),
        "max_tool_successes": int(c["successes"]),
        "max_tokens": int(c["input_tokens"]) + int(c["output_tokens"]),
        "max_cost_usd": float(c["cost"]),
    }


def load(state: Mapping[str, Any], budget: Budget, detectors: Detectors) -> None:
    """Put a :func:`check`-ed state back into a fresh budget and detectors.

    An open step stays open (its no-progress accounting continues), so checkpointing
    after every step cannot defeat the no-progress check.
    """
    c = state["counters"]
    budget.elapsed_offset = float(state["elapsed_seconds"])
    for name in _COUNTERS:
        setattr(budget, name, float(c[name]) if name == "cost" else int(c[name]))
    budget.step_open = bool(c.get("step_open", False))
    budget.step_progress = bool(c.get("step_progress", False))
    d = detectors
    for fp, obs, tool, step, *rest in state["actions"]:
        d.actions.append(Action(fp, obs, tool, int(step), bool(rest[0]) if rest else False))
    if d.actions:
        d.streak = d.actions[-1]
    d.streak_steps.extend(int(s) for s in state["streak_steps"])
    # Older snapshots have no count across progress (the same steps) and no unbounded
    # counts (the steps kept were the whole streak).
    d.streak_all.extend(int(s) for s in state.get("streak_all", state["streak_steps"]))
    d.streak_count = int(state.get("streak_count", len(d.streak_steps)))
    d.streak_all_count = int(state.get("streak_all_count", len(d.streak_all)))
    for k, v in state["last_failure"]:
        d.last_failure.set(k, FailureClass(v) if v else None)
    for k, n in state["retries"]:
        d.retries.set(k, int(n))
    for k, v in state["writes"]:
        d.writes.set(k, [(x[0], int(x[1])) for x in v])
    for k in state["seen"]:
        d.seen.set(k, None)
    for k, v in state["progress_values"]:
        slot = tuple(k)
        if slot not in d.progress_values:
            d.progress_fields[slot[:2]] += 1
        d.progress_values.set(slot, v)
    for fp, step in state["decisions"]:
        d.decisions.append((fp, int(step)))
    # Counted from what the look-back kept: a snapshot taken with a longer look-back
    # (a larger limit then) must not leave counts of decisions it no longer holds.
    d.decision_counts.update(fp for fp, _ in d.decisions)
    d.provided.update(state.get("provided", []))
