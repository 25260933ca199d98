"""Results of a replay: one verdict per (run, policy), per-policy figures, two compared.

* *stop*: the first guard stop other than the agent's own end (``completed``,
  ``final_unverified``, ``refused``). ``stop_step`` is the guard's ``Stop.step``: the
  last agent step the guard let begin (a stop made before a model call reports the
  previous step).
* *calls saved*: recorded agent tool calls the guard would have prevented: the refused
  call and every agent call after the stop point.
* *false stop*: a stop on a run whose recorded outcome is ``success``.
* *loop onset* and *recorded loop*: see :mod:`loopwatch.replay.loops`.
* *ladder responses* (issue 26): for a policy whose ``loop_response`` (or a detector's
  ladder) is more than ``["stop"]``, every rung the ladder reaches on the recorded actions,
  in order: ``warn`` and ``nudge`` rungs, then the ``stop`` rung when a loop detection
  stopped the run (:class:`LadderResponse`: step, tool, detector, rung). A policy without
  a ladder reports none (``responses`` is ``None`` and left out of the JSON).

  Recorded runs cannot show how a model would react to a warn or a nudge: the recording
  is what the model did when it saw the real results. So replay counts the rungs reached
  on the recorded actions, and nothing more (no nudge is judged ``recovered``). After a
  nudge, the recorded call did run in reality and the model's next actions follow from
  its real result: replay feeds that recorded result to the guard as for any other call
  (the guard runs in ``observe`` mode, where a nudged call runs). Later detections are
  therefore about the recorded run: a result that changed is progress and restarts the
  repeat count, an unchanged one keeps counting (the 4th identical call counts 4, where
  a live run, whose nudged call never ran, would count 3), and the budgets count the
  calls the recording made. A stop reached after nudges carries ``detail.after_nudges``
  in its evidence, as the live stop does.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from .loops import RecordedLoop
from .trajectory import SUCCESS

__all__ = [
    "CSV_COLUMNS",
    "Comparison",
    "LadderResponse",
    "PolicySummary",
    "ReplayResult",
    "compare",
    "summarize",
]

CSV_COLUMNS: Final[tuple[str, ...]] = (
    "source",
    "run_id",
    "format",
    "recorded_outcome",
    "recorded_stop",
    "policy",
    "policy_version",
    "stop_reason",
    "stop_dimension",
    "stop_step",
    "steps_total",
    "loop_onset_step",
    "calls_total",
    "calls_saved",
    "model_calls_saved",
    "false_stop",
    "loop_kind",
    "loop_actions",
    "evidence",
)
"""Columns of the CSV output, in order (``evidence`` is JSON text)."""


@dataclass(frozen=True, slots=True)
class LadderResponse:
    """One rung of a loop-response ladder reached on a recorded action.

    Attributes:
        step: 1-based agent step of the call that met the rung.
        tool: the tool called.
        detector: the detection answered (``repeated_action``).
        rung: 1-based index of the rung in the ladder used (the last rung repeats).
        response: ``warn``, ``nudge`` or ``stop``.
    """

    step: int
    tool: str
    detector: str
    rung: int
    response: str

    def to_dict(self) -> dict[str, Any]:
        """``{step, tool, detector, rung, response}``."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What one policy does to one recorded run.

    Attributes:
        source / run_id / format: the trajectory's.
        recorded_outcome: ``success``, ``failure`` or ``unknown`` (from the source).
        recorded_stop: the source's own stop label, if any.
        policy / policy_version: the policy's label and version.
        stop_reason: the guard's stop reason (a :class:`StopReason` value), or ``None``
            when the guard would not have stopped the run before its recorded end.
        stop_dimension: the budget of a ``budget_exhausted`` / ``deadline_exceeded`` stop.
        stop_step: ``Stop.step`` of that stop (1-based agent step), or ``None``.
        steps_total: agent steps in the recording.
        loop_onset_step: see the module docstring; ``None`` when there is no loop.
        evidence: the stop's evidence (``Evidence.to_dict()`` plus ``dimension``,
            ``limit``, ``observed``, ``basis`` when set), ``None`` without a stop.
        calls_total: agent tool calls in the recording.
        calls_saved: agent tool calls the stop would have prevented.
        model_calls_saved: agent model calls (steps) the stop would have prevented.
        false_stop: a stop on a run recorded as ``success``.
        loop: the recorded loop, or ``None``.
        responses: the ladder rungs reached on the recorded actions, in order (module
            docstring), or ``None`` for a policy without a ladder.
        end_reason: how the run ends under this policy: ``stop_reason`` when the policy
            stops it, else how the recording ends
            (:func:`~loopwatch.replay.recorded.recorded_end`: ``completed``,
            ``final_unverified``, ``refused``, ``budget_exhausted`` at the recording's
            step cap, ``cancelled``, ``error``; a stop recorded by loopwatch itself, as in
            an exported run, is that stop). ``None`` only for results built without it.
        end_step: the step of that end: ``stop_step``, else the last agent step.
    """

    source: str
    run_id: str
    format: str
    recorded_outcome: str
    recorded_stop: str | None
    policy: str
    policy_version: str
    stop_reason: str | None
    stop_dimension: str | None
    stop_step: int | None
    steps_total: int
    loop_onset_step: int | None
    evidence: dict[str, Any] | None
    calls_total: int
    calls_saved: int
    model_calls_saved: int
    false_stop: bool
    loop: RecordedLoop | None
    responses: tuple[LadderResponse, ...] | None = None
    end_reason: str | None = None
    end_step: int | None = None

    @property
    def stopped(self) -> bool:
        """True when the guard stopped the run before its recorded end."""
        return self.stop_reason is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON object of ``loopwatch replay --format json`` (DESIGN section 7 fields
        first: ``source, run_id, recorded_outcome, policy, stop_reason, stop_step,
        steps_total, loop_onset_step, evidence``)."""
        return {
            "source": self.source,
            "run_id": self.run_id,
            "recorded_outcome": self.recorded_outcome,
            "policy": self.policy,
            "stop_reason": self.stop_reason,
            "stop_step": self.stop_step,
            "steps_total": self.steps_total,
            "loop_onset_step": self.loop_onset_step,
            "evidence": self.evidence,
            "format": self.format,
            "recorded_stop": self.recorded_stop,
            "policy_version": self.policy_version,
            "stop_dimension": self.stop_dimension,
            "calls_total": self.calls_total,
            "calls_saved": self.calls_saved,
            "model_calls_saved": self.model_calls_saved,
            "false_stop": self.false_stop,
            "loop": self.loop.to_dict() if self.loop is not None else None,
            "end_reason": self.end_reason,
            "end_step": self.end_step,
        } | (
            {}
            if self.responses is None
            else {"ladder_responses": [r.to_dict() for r in self.responses]}
        )

    def csv_row(self) -> dict[str, Any]:
        """One CSV row keyed by :data:`CSV_COLUMNS` (``None`` as an empty cell; the
        ``false_stop`` flag as ``true``/``false``, as the JSON format writes it)."""
        row = self.to_dict()
        loop = self.loop
        row["false_stop"] = "true" if self.false_stop else "false"
        row["loop_kind"] = loop.kind if loop is not None else None
        row["loop_actions"] = loop.actions if loop is not None else None
        if self.evidence is not None:
            row["evidence"] = json.dumps(self.evidence, sort_keys=True, separators=(",", ":"))
        return {column: row[column] for column in CSV_COLUMNS}


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy's figures over a set of replayed runs.

    Attributes:
        policy: the policy label.
        runs: runs replayed.
        stopped: runs the policy stopped before their recorded end.
        stops_by_reason: ``{stop reason: runs}`` for the stopped runs.
        loops: runs with a recorded loop (:class:`RecordedLoop`).
        loops_caught: of those, runs the policy stopped (any reason).
        successful_runs: runs recorded as ``success``.
        false_stops: of those, runs the policy stopped.
        false_stop_rate: ``false_stops / successful_runs`` (``None`` without successes).
        median_steps_onset_to_stop: median of ``stop_step - loop_onset_step`` over caught
            loops stopped at or after their onset (``None`` when there are none).
        calls_total / calls_saved: agent tool calls recorded / prevented by the stops.
        model_calls_saved: agent model calls prevented by the stops.
        ladder: the policy has a loop-response ladder (more than ``["stop"]``).
        warns / nudges / ladder_stops: rungs of each kind reached on the recorded actions
            over all runs (see the module docstring: not what a model would have done).
    """

    policy: str
    runs: int
    stopped: int
    stops_by_reason: dict[str, int]
    loops: int
    loops_caught: int
    successful_runs: int
    false_stops: int
    false_stop_rate: float | None
    median_steps_onset_to_stop: float | None
    calls_total: int
    calls_saved: int
    model_calls_saved: int
    ladder: bool = False
    warns: int = 0
    nudges: int = 0
    ladder_stops: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every attribute, in the order above; without a ladder, the
        four ladder fields are left out (the output of a ``["stop"]`` policy is as it was
        before ladders existed)."""
        out = asdict(self)
        if not self.ladder:
            for key in ("ladder", "warns", "nudges", "ladder_stops"):
                del out[key]
        return out


def summarize(results: Iterable[ReplayResult]) -> list[PolicySummary]:
    """Per-policy figures, policies in first-seen order (see :class:`PolicySummary`)."""
    by_policy: dict[str, list[ReplayResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    out: list[PolicySummary] = []
    for label, rows in by_policy.items():
        stopped = [r for r in rows if r.stopped]
        reasons = Counter(r.stop_reason for r in stopped if r.stop_reason is not None)
        loops = [r for r in rows if r.loop is not None]
        caught = [r for r in loops if r.stopped]
        gaps = [
            r.stop_step - r.loop_onset_step
            for r in caught
            if r.stop_step is not None
            and r.loop_onset_step is not None
            and r.stop_step >= r.loop_onset_step
        ]
        successes = [r for r in rows if r.recorded_outcome == SUCCESS]
        false_stops = sum(1 for r in successes if r.stopped)
        rungs = Counter(x.response for r in rows if r.responses is not None for x in r.responses)
        out.append(
            PolicySummary(
                policy=label,
                runs=len(rows),
                stopped=len(stopped),
                stops_by_reason=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
                loops=len(loops),
                loops_caught=len(caught),
                successful_runs=len(successes),
                false_stops=false_stops,
                false_stop_rate=false_stops / len(successes) if successes else None,
                median_steps_onset_to_stop=float(statistics.median(gaps)) if gaps else None,
                calls_total=sum(r.calls_total for r in rows),
                calls_saved=sum(r.calls_saved for r in rows),
                model_calls_saved=sum(r.model_calls_saved for r in rows),
                ladder=any(r.responses is not None for r in rows),
                warns=rungs["warn"],
                nudges=rungs["nudge"],
                ladder_stops=rungs["stop"],
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two policies over the same runs, run by run.

    Attributes:
        a / b: the policy labels.
        summary_a / summary_b: their :class:`PolicySummary`.
        both / only_a / only_b / neither: runs stopped by both, only one, or neither.
        same_stop: runs both stopped with the same reason at the same step.
        differing: the runs where the two verdicts differ, as
            ``(source, run_id, result_a, result_b)``.
    """

    a: str
    b: str
    summary_a: PolicySummary
    summary_b: PolicySummary
    both: int
    only_a: int
    only_b: int
    neither: int
    same_stop: int
    differing: list[tuple[str, str, ReplayResult, ReplayResult]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (differing runs as ``{source, run_id, a, b}`` with each side's
        ``stop_reason`` and ``stop_step``)."""
        return {
            "a": self.a,
            "b": self.b,
            "summary_a": self.summary_a.to_dict(),
            "summary_b": self.summary_b.to_dict(),
            "both": self.both,
            "only_a": self.only_a,
            "only_b": self.only_b,
            "neither": self.neither,
            "same_stop": self.same_stop,
            "differing": [
                {
                    "source": src,
                    "run_id": run,
                    "a": {"stop_reason": ra.stop_reason, "stop_step": ra.stop_step},
                    "b": {"stop_reason": rb.stop_reason, "stop_step": rb.stop_step},
                }
                for src, run, ra, rb in self.differing
            ],
        }


def compare(results: Iterable[ReplayResult], a: str, b: str) -> Comparison:
    """Compare policies ``a`` and ``b`` (labels) over the runs both replayed.

    Raises:
        ValueError: ``a`` or ``b`` has no results.
    """
    rows = list(results)
    side: dict[str, dict[tuple[str, str], ReplayResult]] = {a: {}, b: {}}
    for r in rows:
        if r.policy in side:
            side[r.policy][(r.source, r.run_id)] = r
    for label in (a, b):
        if not side[label]:
            raise ValueError(f"no results for policy {label!r}")
    keys = [k for k in side[a] if k in side[b]]
    both = only_a = only_b = neither = same = 0
    differing: list[tuple[str, str, ReplayResult, ReplayResult]] = []
    for key in keys:
        ra, rb = side[a][key], side[b][key]
        if ra.stopped and rb.stopped:
            both += 1
        elif ra.stopped:
            only_a += 1
        elif rb.stopped:
            only_b += 1
        else:
            neither += 1
        if (ra.stop_reason, ra.stop_step) == (rb.stop_reason, rb.stop_step):
            same += ra.stopped
        else:
            differing.append((key[0], key[1], ra, rb))
    common = set(keys)
    summaries = summarize(r for r in rows if r.policy in (a, b) and (r.source, r.run_id) in common)
    by_label = {s.policy: s for s in summaries}
    return Comparison(
        a, b, by_label[a], by_label[b], both, only_a, only_b, neither, same, differing
    )
