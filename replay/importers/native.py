"""loopwatch's own trajectory file, ``loopwatch.trajectory/1``.

The form :mod:`loopwatch.replay.demo` ships its example runs in, and the one to write
when converting runs from elsewhere: it carries everything the data model
(:mod:`loopwatch.replay.trajectory`) holds.

Document: ``{"format": "loopwatch.trajectory/1", "runs": [run, ...]}``. A run is
``{run_id, agent, model, recorded_outcome, recorded_stop, recorded_stop_kind, metadata,
steps}``; a step ``{actor, decision, text, timestamp (Unix s), input_tokens,
output_tokens, cost_usd, tool_calls}``; a tool call ``{name, arguments, observation,
error, call_id, started_at, ended_at}`` (absent keys are ``None``/``false``). Numbers
must be finite; times are Unix seconds from 0 to the year 9999 (a millisecond value is
refused, not read as a date 1000 times later); tokens and cost are not negative. A run
breaking these is reported as a problem naming its key; the other runs are read.
``metadata.replay`` may hold ``policy`` (a profile table of the policy file format),
``mode`` (``enforce``/``observe``), ``expected_stop`` and ``crash`` (``{type,
message}``: the loop raised this after the last step); the demo honours them, and
``loopwatch replay`` ignores them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from loopwatch.instrumentation import DecisionType

from ..trajectory import FAILURE, SUCCESS, UNKNOWN, ImportProblem, Step, ToolCall, Trajectory
from . import Document
from ._numbers import check_fits

__all__ = ["FORMAT", "IMPORTER", "NAME", "write_trajectories"]

FORMAT: Final = "loopwatch.trajectory/1"
NAME: Final = "loopwatch"


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"name": call.name, "arguments": call.arguments}
    for key in ("observation", "call_id", "started_at", "ended_at"):
        if getattr(call, key) is not None:
            out[key] = getattr(call, key)
    if call.error:
        out["error"] = True
    return out


def _step_json(step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"actor": step.actor, "decision": step.decision}
    for key in ("text", "timestamp", "input_tokens", "output_tokens", "cost_usd"):
        if getattr(step, key) is not None:
            out[key] = getattr(step, key)
    if step.tool_calls:
        out["tool_calls"] = [_tool_call_json(c) for c in step.tool_calls]
    return out


def write_trajectories(path: str | Path, trajectories: Sequence[Trajectory]) -> None:
    """Write ``trajectories`` as one ``loopwatch.trajectory/1`` JSON file (UTF-8; the
    document shape is in the module docstring)."""
    runs = []
    for t in trajectories:
        runs.append(
            {
                "run_id": t.run_id,
                "agent": t.agent,
                "model": t.model,
                "recorded_outcome": t.recorded_outcome,
                "recorded_stop": t.recorded_stop,
                "recorded_stop_kind": t.recorded_stop_kind,
                "metadata": dict(t.metadata),
                "steps": [_step_json(s) for s in t.steps],
            }
        )
    text = json.dumps({"format": FORMAT, "runs": runs}, indent=1, sort_keys=False)
    Path(path).write_text(text + "\n", encoding="utf-8")


_ACTORS = ("agent", "user", "environment")
_DECISIONS = tuple(d.value for d in DecisionType)
_OUTCOMES = (SUCCESS, FAILURE, UNKNOWN)


def _num(value: Any, where: str) -> float | None:
    if value is None:
        return None
    check_fits(value, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: not a finite number: {str(value)[:40]!r}")
    return float(value)


_MAX_UNIX_SECONDS: Final = 253402300800.0
"""9999-12-31T00:00:00Z plus one day: a larger "Unix seconds" value is a timestamp in
milliseconds, microseconds or nanoseconds, or corrupt."""


def _time(value: Any, where: str) -> float | None:
    number = _num(value, where)
    if number is not None and not 0 <= number < _MAX_UNIX_SECONDS:
        hint = " (milliseconds or nanoseconds?)" if number >= _MAX_UNIX_SECONDS else ""
        raise ValueError(f"{where}: {value!r} is not Unix seconds{hint}")
    return number


def _count(value: Any, where: str) -> float | None:
    number = _num(value, where)
    if number is not None and number < 0:
        raise ValueError(f"{where}: must not be negative, got {value!r}")
    return number


def _int(value: Any, where: str) -> int | None:
    number = _count(value, where)
    return None if number is None else int(number)


def _read_run(raw: Any, source: str, where: str) -> Trajectory:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a run must be an object")
    steps = []
    raw_steps = raw.get("steps")
    if not isinstance(raw_steps, list):
        raise ValueError(f"{where}.steps: must be a list")
    for i, s in enumerate(raw_steps):
        at = f"{where}.steps[{i}]"
        if not isinstance(s, dict):
            raise ValueError(f"{at}: must be an object")
        actor = s.get("actor")
        decision = s.get("decision", "message")
        if actor not in _ACTORS:
            raise ValueError(f"{at}.actor: one of {', '.join(_ACTORS)}, got {actor!r}")
        if decision not in _DECISIONS:
            raise ValueError(f"{at}.decision: one of {', '.join(_DECISIONS)}, got {decision!r}")
        calls = []
        raw_calls = s.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise ValueError(f"{at}.tool_calls: must be a list")
        for j, c in enumerate(raw_calls):
            cat = f"{at}.tool_calls[{j}]"
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
                raise ValueError(f"{cat}: needs a non-empty name")
            observation = c.get("observation")
            calls.append(
                ToolCall(
                    name=c["name"],
                    arguments=c.get("arguments", {}),
                    observation=None if observation is None else str(observation),
                    error=bool(c.get("error", False)),
                    call_id=None if c.get("call_id") is None else str(c["call_id"]),
                    started_at=_time(c.get("started_at"), f"{cat}.started_at"),
                    ended_at=_time(c.get("ended_at"), f"{cat}.ended_at"),
                )
            )
        text = s.get("text")
        steps.append(
            Step(
                index=i,
                actor=actor,
                decision=decision,
                text=None if text is None else str(text),
                tool_calls=tuple(calls),
                timestamp=_time(s.get("timestamp"), f"{at}.timestamp"),
                input_tokens=_int(s.get("input_tokens"), f"{at}.input_tokens"),
                output_tokens=_int(s.get("output_tokens"), f"{at}.output_tokens"),
                cost_usd=_count(s.get("cost_usd"), f"{at}.cost_usd"),
            )
        )
    run_id = raw.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"{where}.run_id: must be a non-empty string")
    outcome = raw.get("recorded_outcome", UNKNOWN)
    if outcome not in _OUTCOMES:
        raise ValueError(f"{where}.recorded_outcome: one of {', '.join(_OUTCOMES)}")
    kind = raw.get("recorded_stop_kind", "inferred")
    if kind not in ("explicit", "inferred"):
        raise ValueError(f"{where}.recorded_stop_kind: explicit or inferred")
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}.metadata: must be an object")
    stop = raw.get("recorded_stop")
    return Trajectory(
        source=source,
        run_id=run_id,
        format=NAME,
        steps=tuple(steps),
        recorded_outcome=outcome,
        recorded_stop=None if stop is None else str(stop),
        recorded_stop_kind=kind,
        agent=str(raw.get("agent") or "recorded-agent"),
        model=None if raw.get("model") is None else str(raw["model"]),
        metadata=metadata,
    )


class _NativeImporter:
    """Reads ``loopwatch.trajectory/1`` documents (see the module docstring)."""

    name = NAME

    def matches(self, doc: Document) -> bool:
        # The format key may follow a long "runs" list (keys in any order), so any JSON
        # object naming the format anywhere is parsed (the parse is cached on ``doc``).
        if FORMAT not in doc.text or doc.text.lstrip()[:1] != "{":
            return False
        value = doc.json
        return isinstance(value, dict) and value.get("format") == FORMAT

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]:
        value = doc.json
        source = str(doc.path)
        if not isinstance(value, dict) or value.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        runs = value.get("runs")
        if not isinstance(runs, list):
            raise ValueError("runs: must be a list")
        for i, raw in enumerate(runs):
            try:
                yield _read_run(raw, source, f"runs[{i}]")
            except ValueError as exc:
                record, _, message = str(exc).partition(": ")
                yield ImportProblem(source, record, message)


IMPORTER: Final = _NativeImporter()
