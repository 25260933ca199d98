"""The run view's logic, without Streamlit: from stored step rows to what a reviewer reads.

An incident review starts at the stop and walks back (DESIGN section 6):

- :func:`build_steps` turns stored rows (one per decision or tool result) into one
  :class:`StepView` per step.
- :func:`collapse` folds consecutive steps with identical actions into one
  :class:`StepGroup` with a count (``get_details_by_id ×95``), keeping the steps for
  expansion.
- :func:`last_steps` keeps the groups that touch the last ``n`` steps before the stop, so
  a long repeat is shown whole, with its count, not cut at the window edge.
- :func:`progress_ceased` finds the step where progress ceased: the evidence's
  ``detail.last_progress_step`` + 1, else the last step with progress + 1.
- :func:`stop_card` gathers the stop's reason, dimension, limit vs observed and evidence.
- :func:`progress_series` is steps-since-progress per step, ending on the stop's figure;
  :func:`fold` shortens long
  values (arguments and results are shown as stored: the collector redacted them).

Inputs are plain mappings (API JSON or reader rows), so every function is testable with
literal data.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pandas as pd

from .bidi import neutralise

__all__ = [
    "DEFAULT_LAST_STEPS",
    "HEADLINE_FACTS",
    "USAGE_HELP",
    "Folded",
    "ProgressMark",
    "StepGroup",
    "StepView",
    "StopCard",
    "ToolCallView",
    "anomaly_summary",
    "build_steps",
    "collapse",
    "compress_indices",
    "fold",
    "group_table",
    "last_steps",
    "limit_vs_observed",
    "mark_groups",
    "progress_ceased",
    "progress_series",
    "sampling_notice",
    "stop_card",
    "usage_counters",
]

DEFAULT_LAST_STEPS: Final = 20
"""The run view opens on this many steps before the stop (DESIGN: "its last 20 steps")."""

_FOLD_CHARS: Final = 160


@dataclass(frozen=True, slots=True)
class ToolCallView:
    """One tool result row of a step.

    Attributes:
        tool / outcome: name and ``ok``, ``error``, ``blocked`` or ``nudged``.
        action_fingerprint / observation_digest: as stored (hex).
        progress: the result was progress evidence.
        blocked_by / error_type / failure_class: why it was blocked or failed.
        arguments / result: stored JSON text (redacted, truncated), or ``None`` when
            content capture was off.
        loop_response / loop_rung / loop_detector: the response ladder's rung that
            answered the call (``warn`` or ``nudge``), or ``None``.
    """

    tool: str
    outcome: str | None = None
    action_fingerprint: str | None = None
    observation_digest: str | None = None
    progress: bool | None = None
    steps_since_progress: int | None = None
    blocked_by: str | None = None
    error_type: str | None = None
    failure_class: str | None = None
    arguments: str | None = None
    result: str | None = None
    loop_response: str | None = None
    loop_rung: int | None = None
    loop_detector: str | None = None

    @property
    def ladder_mark(self) -> str | None:
        """``nudged (repeated_action, rung 1)`` or ``warned (...)`` for a call the
        response ladder answered (issue 26), else ``None``."""
        verb = {"nudge": "nudged", "warn": "warned"}.get(self.loop_response or "")
        if verb is None:
            return None
        facts = [f for f in (self.loop_detector, self.loop_rung and f"rung {self.loop_rung}") if f]
        return verb + (f" ({', '.join(facts)})" if facts else "")


@dataclass(frozen=True, slots=True)
class StepView:
    """One step: the model's decision and the tool calls it led to.

    Attributes:
        step: 1-based step index (0 for rows stored without one).
        decision_type: ``tool``, ``final``, ``refusal``, ``message`` or ``None``.
        decision_fingerprint: fingerprint of a non-tool decision.
        calls: the step's tool results, in stored order.
        steps_since_progress: as the step's last row reports it (its last tool result
            that carries one, else its decision): the count at the end of the step, which
            is the figure a stop at this step reports.
        tokens: input + output tokens of the decision.
    """

    step: int
    decision_type: str | None = None
    decision_fingerprint: str | None = None
    calls: tuple[ToolCallView, ...] = ()
    steps_since_progress: int | None = None
    tokens: int = 0

    @property
    def progress(self) -> bool:
        """Some tool result of this step was progress evidence."""
        return any(c.progress for c in self.calls)

    @property
    def signature(self) -> tuple[Any, ...]:
        """What makes two steps the same action (tool calls by fingerprint, else decision)."""
        if self.calls:
            return tuple(
                ("call", c.action_fingerprint or (c.tool, c.arguments)) for c in self.calls
            )
        return ("decision", self.decision_type, self.decision_fingerprint)

    @property
    def label(self) -> str:
        """``tool`` names joined with ``+``, else the decision type."""
        if self.calls:
            return " + ".join(c.tool for c in self.calls)
        return f"({self.decision_type or 'step'})"


@dataclass(frozen=True, slots=True)
class StepGroup:
    """Consecutive steps with identical actions (one step when nothing repeats).

    Attributes:
        steps: the member steps, oldest first (non-empty).
        marks: notes for this group, e.g. ``progress ceased at step 2``, ``stop``.
    """

    steps: tuple[StepView, ...]
    marks: tuple[str, ...] = field(default=())

    @property
    def first_step(self) -> int:
        return self.steps[0].step

    @property
    def last_step(self) -> int:
        return self.steps[-1].step

    @property
    def count(self) -> int:
        """How many steps the group holds."""
        return len(self.steps)

    @property
    def collapsed(self) -> bool:
        """More than one step: shown as one row with a count, expandable."""
        return len(self.steps) > 1

    @property
    def label(self) -> str:
        return self.steps[0].label

    @property
    def outcomes(self) -> dict[str, int]:
        """Tool outcomes over the group's calls, e.g. ``{"ok": 94, "blocked": 1}``."""
        counts = Counter(c.outcome or "unknown" for s in self.steps for c in s.calls)
        return dict(sorted(counts.items()))

    @property
    def step_range(self) -> str:
        """``"1–95"`` or ``"7"``."""
        if self.first_step == self.last_step:
            return str(self.first_step)
        return f"{self.first_step}–{self.last_step}"

    @property
    def title(self) -> str:
        """One line: ``get_details_by_id ×95 · steps 1–95 · 94 ok, 1 blocked``."""
        parts = [f"{self.label} ×{self.count}" if self.collapsed else self.label]
        parts.append(f"step{'s' if self.collapsed else ''} {self.step_range}")
        if self.outcomes:
            parts.append(", ".join(f"{n} {o}" for o, n in self.outcomes.items()))
        return " · ".join(parts)


def _missing(value: Any) -> bool:
    """None, NaN or pandas NA (a stored NULL in either data source)."""
    if value is None:
        return True
    # Fast paths for the stored types: pd.isna per cell was a third of build_steps on a
    # 10,000-step run (issue 28, Speed). Of the floats only NaN is missing.
    kind = type(value)
    if kind is str or kind is int or kind is bool:
        return False
    if kind is float:
        return math.isnan(value)
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _int(value: Any) -> int | None:
    if type(value) is int:  # the stored type: skips _missing on 30,000 cells a long run
        return value
    if _missing(value):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _str(value: Any) -> str | None:
    if type(value) is str:
        return value
    return None if _missing(value) else str(value)


def _bool(value: Any) -> bool | None:
    if type(value) is bool:
        return value
    return None if _missing(value) else bool(value)


def build_steps(rows: Iterable[Mapping[str, Any]]) -> list[StepView]:
    """Group stored rows (``kind`` ``decision`` or ``tool_result``) into steps, in order.

    Rows without a step index go to step 0. Unknown kinds are ignored.
    """
    decisions: dict[int, Mapping[str, Any]] = {}
    calls: dict[int, list[ToolCallView]] = {}
    ends: dict[int, list[int]] = {}
    order: list[int] = []
    for row in rows:
        step = _int(row.get("step")) or 0
        if step not in decisions and step not in calls:
            order.append(step)
        kind = row.get("kind")
        if kind == "decision":
            decisions[step] = row
            calls.setdefault(step, [])
        elif kind == "tool_result":
            ends.setdefault(step, []).append(_int(row.get("end_unix_nano")) or 0)
            calls.setdefault(step, []).append(
                ToolCallView(
                    tool=_str(row.get("tool")) or "(unnamed tool)",
                    outcome=_str(row.get("outcome")),
                    action_fingerprint=_str(row.get("action_fingerprint")),
                    observation_digest=_str(row.get("observation_digest")),
                    progress=_bool(row.get("progress")),
                    steps_since_progress=_int(row.get("steps_since_progress")),
                    blocked_by=_str(row.get("blocked_by")),
                    error_type=_str(row.get("error_type")),
                    failure_class=_str(row.get("failure_class")),
                    arguments=_str(row.get("arguments")),
                    result=_str(row.get("result")),
                    loop_response=_str(row.get("loop_response")),
                    loop_rung=_int(row.get("loop_rung")),
                    loop_detector=_str(row.get("loop_detector")),
                )
            )
    steps = []
    for step in sorted(set(order)):
        decision = decisions.get(step, {})
        step_calls = tuple(calls.get(step, ()))
        # The step's last figure is its final one: the decision reports the count before
        # the step's tool results, each result the count after it (0 after progress), and
        # the stop reports the last one, so a max() would disagree with the stop card.
        # "Last" is the result that ended last: rows are stored in start order, and a
        # call started first can end last (parallel tool calls); the guard counts each
        # result as it is recorded, when its call ends.
        reported = [
            (end, i, call.steps_since_progress)
            for i, (end, call) in enumerate(zip(ends.get(step, []), step_calls, strict=True))
            if call.steps_since_progress is not None
        ]
        final = max(reported)[2] if reported else _int(decision.get("steps_since_progress"))
        steps.append(
            StepView(
                step=step,
                decision_type=_str(decision.get("decision_type")),
                decision_fingerprint=_str(decision.get("decision_fingerprint")),
                calls=step_calls,
                steps_since_progress=final,
                tokens=(_int(decision.get("input_tokens")) or 0)
                + (_int(decision.get("output_tokens")) or 0),
            )
        )
    return steps


def collapse(steps: Sequence[StepView]) -> list[StepGroup]:
    """Fold consecutive steps with the same :attr:`StepView.signature` into groups."""
    groups: list[list[StepView]] = []
    for step in steps:
        if groups and groups[-1][-1].signature == step.signature:
            groups[-1].append(step)
        else:
            groups.append([step])
    return [StepGroup(tuple(g)) for g in groups]


def last_steps(
    groups: Sequence[StepGroup], n: int, *, stop_step: int | None = None
) -> list[StepGroup]:
    """The groups touching the last ``n`` steps up to ``stop_step`` (default: the last).

    A group that starts before the window but reaches into it is kept whole.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if not groups:
        return []
    end = stop_step if stop_step is not None else groups[-1].last_step
    start = end - n + 1
    return [g for g in groups if g.last_step >= start and g.first_step <= end] or list(groups[-1:])


@dataclass(frozen=True, slots=True)
class ProgressMark:
    """Where progress ceased.

    Attributes:
        step: the first step after the last progress evidence.
        last_progress_step: the last step with progress, 0 when none was seen.
        basis: ``evidence`` (the stop's ``detail.last_progress_step``) or ``steps``.
    """

    step: int
    last_progress_step: int
    basis: str

    @property
    def text(self) -> str:
        if self.last_progress_step == 0:
            return f"no progress evidence in this run: progress never started (step {self.step})"
        where = "the stop's evidence" if self.basis == "evidence" else "the stored steps"
        return (
            f"progress ceased at step {self.step} "
            f"(last progress evidence at step {self.last_progress_step}, per {where})"
        )


def progress_ceased(
    steps: Sequence[StepView], evidence: Mapping[str, Any] | None = None
) -> ProgressMark | None:
    """The step where progress ceased, or ``None`` when the last step made progress.

    The evidence's ``detail.last_progress_step`` wins (the guard saw every step, even
    unsampled ones). Else the guard's own count, as stored with the steps: a step that
    reports ``steps_since_progress = k`` had its last progress ``k`` steps before it
    (``step - 1 - k``; the count is taken before the step's own results). Progress the
    guard counts without a tool result (a decision that brought new information) shows
    only there, so the page, the "Steps since progress" figure and its chart agree.
    Tool results flagged as progress count too. A run with no progress at all ceased
    at its first step.
    """
    detail = (evidence or {}).get("detail")
    if isinstance(detail, Mapping):
        last = _int(detail.get("last_progress_step"))
        if last is not None:
            return ProgressMark(last + 1, last, "evidence")
    if not steps:
        return None
    candidates = [s.step for s in steps if s.progress]
    counted = [
        s.step - 1 - s.steps_since_progress for s in steps if s.steps_since_progress is not None
    ]
    if counted:
        candidates.append(counted[-1])
    last = max(candidates, default=0)
    if last <= 0:
        return ProgressMark(steps[0].step, 0, "steps")
    if last >= steps[-1].step:
        return None
    return ProgressMark(last + 1, last, "steps")


def mark_groups(
    groups: Sequence[StepGroup],
    ceased: ProgressMark | None,
    stop_step: int | None,
    *,
    last_stored: int | None = None,
) -> list[StepGroup]:
    """Attach ``progress ceased`` and ``stop`` marks to the groups holding those steps,
    and a ``nudged``/``warned at step N`` mark per call the response ladder answered.

    Args:
        stop_step: the stop's step; ``None`` when the run has no stop (or one naming no
            step): then no group is marked as stopped.
        last_stored: marks ``last stored step N`` on its group (for a run without a stop
            step, where the stored steps end without saying why).
    """
    out = []
    for group in groups:
        marks = list(group.marks)
        if ceased is not None and group.first_step <= ceased.step <= group.last_step:
            marks.append(f"progress ceased at step {ceased.step}")
        if stop_step is not None and group.first_step <= stop_step <= group.last_step:
            marks.append(f"stopped at step {stop_step}")
        if last_stored is not None and group.first_step <= last_stored <= group.last_step:
            marks.append(f"last stored step {last_stored}")
        for step in group.steps:
            marks += [f"{c.ladder_mark} at step {step.step}" for c in step.calls if c.ladder_mark]
        out.append(StepGroup(group.steps, tuple(marks)))
    return out


def group_table(groups: Sequence[StepGroup]) -> pd.DataFrame:
    """One row per group: steps, action, count, outcomes, progress steps, marks."""
    rows = [
        {
            "steps": g.step_range,
            "action": g.label,
            "count": g.count,
            "outcomes": ", ".join(f"{n} {o}" for o, n in g.outcomes.items()),
            "progress": sum(1 for s in g.steps if s.progress),
            "marks": "; ".join(g.marks),
        }
        for g in groups
    ]
    return pd.DataFrame(rows, columns=["steps", "action", "count", "outcomes", "progress", "marks"])


def compress_indices(indices: Iterable[Any]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` -> ``"1–3, 5, 7–8"``."""
    values = sorted({v for v in (_int(i) for i in indices) if v is not None})
    if not values:
        return ""
    parts: list[str] = []
    start = prev = values[0]
    for value in values[1:]:
        if value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = value
    parts.append(str(start) if start == prev else f"{start}–{prev}")
    return ", ".join(parts)


def _number(value: Any) -> str:
    number = value
    if isinstance(number, float) and number.is_integer():
        return str(int(number))
    if isinstance(number, float):
        return f"{number:.4g}"
    return str(number)


def limit_vs_observed(stop: Mapping[str, Any]) -> str | None:
    """``"observed 3 > limit 2 (projected)"``, or ``None`` without a limit."""
    limit = stop.get("limit_value")
    observed = stop.get("observed")
    if limit is None or observed is None:
        return None
    try:
        relation = ">" if float(observed) > float(limit) else ("=" if observed == limit else "<")
    except (TypeError, ValueError):
        relation = "vs"
    text = f"observed {_number(observed)} {relation} limit {_number(limit)}"
    basis = stop.get("basis")
    return f"{text} ({basis})" if basis else text


@dataclass(frozen=True, slots=True)
class StopCard:
    """What the stop card shows.

    Attributes:
        reason / message / step: the stop reason, its one-line explanation, its step.
        origin: ``stop_span``, ``run_span`` or ``inferred`` (how the collector knows).
        dimension / limit_vs_observed: the budget and the crossing, for budget stops;
            ``crossing``: the same without its ``basis`` (``projected``, ...), which the
            page puts in the metric's label so that the value fits.
        detector / tool / matched_period / repetitions / step_indices /
        fingerprint_previews / failure_class / scope / detail: the evidence.
        steps_since_progress: at the stop.
        observe_reason: in ``observe`` mode, what would have stopped the run, at which
            step, on which tool.
    """

    reason: str
    message: str | None = None
    step: int | None = None
    origin: str | None = None
    dimension: str | None = None
    limit_vs_observed: str | None = None
    crossing: str | None = None
    basis: str | None = None
    detector: str | None = None
    tool: str | None = None
    matched_period: int | None = None
    repetitions: int | None = None
    step_indices: str = ""
    fingerprint_previews: tuple[str, ...] = ()
    failure_class: str | None = None
    scope: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    steps_since_progress: int | None = None
    observe_reason: str | None = None

    def facts(self, *, headline: bool = True) -> list[tuple[str, str]]:
        """``(label, value)`` pairs of the fields that are set, in reading order.

        Args:
            headline: include the four figures the page shows as metrics above the list
                (:data:`HEADLINE_FACTS`); ``False`` leaves them out so none is shown twice.
        """
        pairs: list[tuple[str, Any]] = [
            ("stop reason", self.reason),
            ("stopped at step", self.step),
            ("dimension", self.dimension),
            ("limit vs observed", self.limit_vs_observed),
            ("detector", self.detector),
            ("tool", self.tool),
            ("matched period", self.matched_period),
            ("repetitions", self.repetitions),
            ("step indices", self.step_indices or None),
            ("fingerprints", ", ".join(self.fingerprint_previews) or None),
            ("failure class", self.failure_class),
            ("steps since progress", self.steps_since_progress),
            ("scope", self.scope if self.scope not in (None, "run") else None),
            ("observe mode would have stopped as", self.observe_reason),
            ("stop known from", self.origin),
        ]
        pairs += [(f"detail: {k}", _short(v)) for k, v in sorted(self.detail.items())]
        return [
            (label, str(value))
            for label, value in pairs
            if value is not None and (headline or label not in HEADLINE_FACTS)
        ]


HEADLINE_FACTS: Final = (
    "stop reason",
    "stopped at step",
    "limit vs observed",
    "steps since progress",
)
"""Labels of :meth:`StopCard.facts` that the run view shows as metrics of their own."""


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return fold(text, 120).short


def stop_card(
    stop: Mapping[str, Any] | None, evidence: Mapping[str, Any] | None
) -> StopCard | None:
    """The stop card of a run, or ``None`` when the run has no stop."""
    if not stop:
        return None
    ev = dict(evidence or {})
    detail = ev.get("detail")
    return StopCard(
        reason=str(stop.get("reason") or "unknown"),
        message=_str(stop.get("message")),
        step=_int(stop.get("step")),
        origin=_str(stop.get("origin")),
        dimension=_str(stop.get("dimension")),
        limit_vs_observed=limit_vs_observed(stop),
        crossing=limit_vs_observed({**stop, "basis": None}),
        basis=_str(stop.get("basis")),
        detector=_str(ev.get("detector")),
        tool=_str(ev.get("tool")),
        matched_period=_int(ev.get("matched_period")),
        repetitions=_int(ev.get("repetitions")),
        step_indices=compress_indices(ev.get("step_indices") or ()),
        fingerprint_previews=tuple(str(p) for p in ev.get("fingerprint_previews") or ()),
        failure_class=_str(ev.get("failure_class")),
        scope=_str(ev.get("scope")),
        detail=dict(detail) if isinstance(detail, Mapping) else {},
        steps_since_progress=_int(stop.get("steps_since_progress")),
        observe_reason=_observed(stop),
    )


def _observed(stop: Mapping[str, Any]) -> str | None:
    """``repeated_action at step 3 on lookup_order``: what observe mode would have
    stopped, where, and the tool its evidence names (``observe_evidence``, JSON)."""
    reason = _str(stop.get("observe_reason"))
    if reason is None:
        return None
    parts = [reason]
    step = _int(stop.get("observe_step"))
    if step is not None:
        parts.append(f"at step {step}")
    raw = stop.get("observe_evidence")
    try:
        evidence = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError):
        evidence = None
    tool = _str(evidence.get("tool")) if isinstance(evidence, Mapping) else None
    if tool is not None:
        parts.append(f"on {tool}")
    return " ".join(parts)


def progress_series(steps: Sequence[StepView], stop: StopCard | None = None) -> pd.DataFrame:
    """``step``, ``steps_since_progress`` (steps that reported it), in step order.

    Each step's value is its last row's (:attr:`StepView.steps_since_progress`). The stop
    is the last row of its step: with ``stop`` (its step and figure known, and steps
    stored), the point at the stop's step is the stop's figure, so the curve ends where
    the stop card does. The stop can count the step it ends (a deadline or no_progress
    stop is decided after the step, the step's own rows before it).
    """
    values = {s.step: s.steps_since_progress for s in steps if s.steps_since_progress is not None}
    at = stop.step if stop is not None else None
    figure = stop.steps_since_progress if stop is not None else None
    if values and at is not None and figure is not None:
        values[at] = figure
    rows = [{"step": k, "steps_since_progress": v} for k, v in sorted(values.items())]
    frame = pd.DataFrame(rows, columns=["step", "steps_since_progress"])
    return frame.astype("int64")


_USAGE: Final = (
    ("model turns", "usage_model_turns", "decisions"),
    ("tool attempts", "usage_tool_attempts", "tool_calls"),
    ("tool successes", "usage_tool_successes", None),
    ("tokens", "usage_tokens", "tokens"),
    ("cost (USD)", "usage_cost_usd", None),
    ("elapsed (s)", "usage_elapsed_seconds", None),
)


USAGE_HELP: Final = {
    "tool attempts": "Calls the guard let through; calls it blocked are not attempts "
    "(the step list and the runs table count them)",
}
"""Help text of the usage figures whose meaning differs from a look-alike elsewhere."""


def usage_counters(stop: Mapping[str, Any] | None, run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(label, value)`` usage counters: the stop's, else the run's stored counts."""
    out = []
    for label, stop_key, run_key in _USAGE:
        value = (stop or {}).get(stop_key)
        if value is None and run_key is not None:
            value = run.get(run_key)
        if value is None:
            continue
        if stop_key == "usage_cost_usd":
            text = f"{float(value):.4f}"
        elif stop_key == "usage_elapsed_seconds":
            text = f"{float(value):.3f}"
        else:
            text = _number(value)
        out.append((label, text))
    return out


def anomaly_summary(anomalies: Sequence[Mapping[str, Any]]) -> str:
    """One line on a run's other stop reports (``stop_anomalies`` rows, ``kind`` column).

    ``duplicate_stop``: a second report of the same strength, never shown in place of the
    first. ``replaced_stop``: a weaker report (an inferred stop, a run span's) that a
    stronger one in a later request replaced; the metrics keep counting the first. Rows
    of any other kind (a newer store) are only counted.
    """
    duplicates = sum(1 for a in anomalies if a.get("kind") == "duplicate_stop")
    replaced = sum(1 for a in anomalies if a.get("kind") == "replaced_stop")
    other = len(anomalies) - duplicates - replaced
    parts = []
    if duplicates:
        parts.append(f"{duplicates} duplicate stop(s) arrived for this run; the first one is shown")
    if replaced:
        parts.append(
            f"{replaced} earlier stop report(s) were replaced by a stronger one; "
            "/metrics counted this run under the first"
        )
    if other:
        parts.append(f"{other} other stop report(s) arrived for this run")
    return ". ".join(parts) + "."


def sampling_notice(run: Mapping[str, Any], steps_stored: int) -> str | None:
    """Why no steps are shown, with the run's counts; ``None`` when steps are there."""
    sampled = run.get("sampled")
    counts = (
        f"{_number(run.get('steps') or 0)} steps, {_number(run.get('tool_calls') or 0)} tool "
        f"calls ({_number(run.get('tool_errors') or 0)} errors, "
        f"{_number(run.get('tool_blocked') or 0)} blocked), "
        f"{_number(run.get('tokens') or 0)} tokens"
    )
    if sampled is False:
        rule = run.get("sample_rule") or "sampling"
        return (
            f"This run was not sampled (rule: {rule}): the collector kept its stop and "
            f"counts but not its steps. Counts: {counts}."
        )
    if sampled is None and steps_stored == 0:
        return (
            "The collector has not decided yet whether to keep this run's steps "
            f"(no stop received). Counts so far: {counts}."
        )
    if steps_stored == 0:
        return f"No steps were stored for this run. Counts: {counts}."
    return None


@dataclass(frozen=True, slots=True)
class Folded:
    """A value shortened for a table cell, with the whole text kept.

    Attributes:
        short: at most the limit, ending in ``…`` when cut.
        full: the whole value, JSON pretty-printed when it parses.
        folded: ``short`` is a cut of ``full``.
    """

    short: str
    full: str
    folded: bool


def fold(value: str | None, limit: int = _FOLD_CHARS) -> Folded:
    """Shorten ``value`` to ``limit`` characters; pretty-print the whole if it is JSON.

    Both forms have their bidi controls shown as U+FFFD (:func:`~.bidi.neutralise`), as
    every value the dashboard shows: the whole form goes to ``st.code``, which no other
    escaping reaches.

    Raises:
        ValueError: ``limit`` < 2.
    """
    if limit < 2:
        raise ValueError("limit must be >= 2")
    if value is None:
        return Folded("", "", False)
    text = neutralise(str(value))
    full = text
    with contextlib.suppress(ValueError, RecursionError):
        # Again after the round trip: it turns an escaped \u202e into a live control.
        full = neutralise(
            json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False)
        )
    one_line = " ".join(text.split())
    if len(one_line) <= limit:
        return Folded(one_line, full, False)
    return Folded(one_line[: limit - 1] + "…", full, True)
