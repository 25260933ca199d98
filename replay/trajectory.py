"""The recorded-run data model shared by every importer, replay and the demo.

An importer turns one file of some recorded format into :class:`Trajectory` objects.
A trajectory is a list of :class:`Step`: one actor turn each. An agent step carries the
model's decision (DESIGN section 2: ``tool``, ``final``, ``refusal``, ``message``) and
the tool calls it made, each with the recorded observation and error flag. User and
environment turns are kept (``actor`` says whose) because they are part of what the
agent saw, but only agent steps are decisions the guard judges.

Recorded outcome and recorded stop are what the *source* says about how the run ended,
normalised so replay can count false stops (a stop on a run that ended successfully):

* ``recorded_outcome``: :data:`SUCCESS`, :data:`FAILURE` or :data:`UNKNOWN` (tau reward
  1.0 / 0.0, ReAct CORRECT / INCORRECT / HALTED, ToolBench ``give_answer`` / ``give_up``...).
* ``recorded_stop``: the source's own stop label, verbatim where it has one
  (tau2 ``termination_reason`` values such as ``user_stop`` or ``max_steps``, OpenHands
  ``finish`` or its max-iteration error), and ``recorded_stop_kind`` says whether the
  source recorded it (``explicit``) or the importer derived it (``inferred``, e.g.
  tau-bench's 62-message step cap).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = [
    "AGENT",
    "ENVIRONMENT",
    "FAILURE",
    "SUCCESS",
    "UNKNOWN",
    "USER",
    "ImportProblem",
    "Step",
    "ToolCall",
    "Trajectory",
]

AGENT: Final = "agent"
USER: Final = "user"
ENVIRONMENT: Final = "environment"
"""Whose turn a step is (:attr:`Step.actor`)."""

SUCCESS: Final = "success"
FAILURE: Final = "failure"
UNKNOWN: Final = "unknown"
"""How the source says the run ended (:attr:`Trajectory.recorded_outcome`)."""

Actor = Literal["agent", "user", "environment"]
DecisionKindName = Literal["tool", "final", "refusal", "message"]
Outcome = Literal["success", "failure", "unknown"]
StopKind = Literal["explicit", "inferred"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One recorded tool call and what came back.

    Attributes:
        name: tool name as recorded (``gen_ai.tool.name``).
        arguments: decoded arguments, normally a dict; the raw string when the recorded
            arguments were not valid JSON (kept, never dropped).
        observation: the recorded result text, ``None`` when the source has none.
        error: ``True`` when the source marks the call failed (error flag, ``Error:``
            prefix, non-zero exit code, ``{"error": "..."}`` payload...).
        call_id: the source's tool-call id, when present.
        started_at / ended_at: Unix time in seconds (float), when present.
        failure_class: a failed call's failure class as the source recorded it
            (loopwatch's ``loopwatch.tool.failure_class``), else None: replay then derives
            it from the observation text.
    """

    name: str
    arguments: Any
    observation: str | None = None
    error: bool = False
    call_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    failure_class: str | None = None

    def arguments_json(self) -> str:
        """Canonical JSON text of :attr:`arguments` (sorted keys, compact)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class Step:
    """One actor turn of a recorded run.

    Attributes:
        index: 0-based position among *all* steps of the trajectory.
        actor: ``"agent"``, ``"user"`` or ``"environment"``.
        decision: for agent steps, the decision kind (``tool`` when ``tool_calls`` is
            non-empty, else ``final``, ``refusal`` or ``message``); ``"message"`` for
            user and environment turns.
        text: the turn's text (model content, thought, user message), or ``None``.
        tool_calls: the calls made in this turn, in order (user tool calls exist in
            tau2 dual-control domains; they are not agent actions).
        timestamp: Unix time in seconds, when present.
        input_tokens / output_tokens / cost_usd: usage of this turn, when recorded.
    """

    index: int
    actor: Actor
    decision: DecisionKindName
    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    timestamp: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One recorded run.

    Attributes:
        source: path of the file it came from (as given).
        run_id: id unique within the source file (e.g. ``task=23/trial=3``).
        format: importer name (``tau2``, ``chat``, ``react``, ``toolbench``,
            ``openhands``, ``otlp_json``).
        steps: every turn in order.
        recorded_outcome: ``success``, ``failure`` or ``unknown``.
        recorded_stop: the source's stop label (verbatim when recorded), or ``None``.
        recorded_stop_kind: ``explicit`` (recorded) or ``inferred`` (derived).
        agent: agent name for telemetry (``gen_ai.agent.name``), from the source.
        model: model name when recorded.
        metadata: anything else worth showing (task id, trial, domain, reward...).
    """

    source: str
    run_id: str
    format: str
    steps: tuple[Step, ...]
    recorded_outcome: Outcome = UNKNOWN
    recorded_stop: str | None = None
    recorded_stop_kind: StopKind = "inferred"
    agent: str = "recorded-agent"
    model: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def agent_steps(self) -> tuple[Step, ...]:
        """The steps whose actor is the agent (the decisions the guard judges)."""
        return tuple(s for s in self.steps if s.actor == AGENT)

    @property
    def agent_tool_calls(self) -> int:
        """Number of tool calls the agent made."""
        return sum(len(s.tool_calls) for s in self.steps if s.actor == AGENT)


@dataclass(frozen=True, slots=True)
class ImportProblem:
    """A record an importer could not read; the rest of the file is still imported.

    Attributes:
        source: file path.
        record: where in the file (``line 12``, ``simulations[4]``, ``byte 0``...).
        message: what is wrong, one line.
    """

    source: str
    record: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.record}: {self.message}"
