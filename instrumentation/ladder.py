"""The loop-response ladder: warn, nudge, then stop (issue 26).

A profile's ``loop_response`` (and ``loop_response_by_detector``) lists the rungs that
answer successive loop detections of one run; once the ladder is used up its last rung
repeats. The default ``["stop"]`` stops at the first detection, as the guard always did:
then no :class:`Ladder` exists at all and nothing here runs.

Rungs, for a detection made when a tool call is asked for (``repeated_action``, with
``duplicate_intent`` evidence too; the other detectors stop, see
:data:`~._policy_checks.STOP_ONLY_DETECTORS`):

- ``warn``: the call runs; the detection is recorded on its tool span.
- ``nudge``: the call does not run. The model reads a nudge as the call's result, built
  only from the policy's ``nudge_template`` and facts the guard computed: the tool, how
  many times, the previous result (its captured, scrubbed, truncated preview when content
  capture is on, else its digest) and advice. No tool result or prompt can change the
  template, a rung or a limit: a result's text fills ``{unchanged}`` and is never read as
  a template.
- ``stop``: the run ends as before; its evidence says ``detail.after_nudges = n``.

Rungs count per detector: the n-th detection of ``repeated_action`` meets rung n of that
detector's ladder (its own, else the profile's).

In ``observe`` mode a nudge rung is recorded (:attr:`~.outcomes.Outcome.observed_nudges`)
and the call runs; a stop rung is an observed stop, as before.

Each nudge's result: ``recovered`` once progress evidence (a new result, a moved cursor,
:meth:`~.guard.Guard.progress`) or a completed run follows it before any further
detection; otherwise, when the run ends, ``stopped`` if a later rung stopped it, else
``ended``.

Not thread-safe on its own: the guard calls it under its lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

from . import _semconv as sc
from ._policy_checks import DEFAULT_LOOP_RESPONSE, LADDER_DETECTORS
from .outcomes import Nudge, NudgeText, Stop, StopReason, ToolTicket
from .policy import Policy

__all__ = ["MAX_NUDGES", "Ladder"]

MAX_NUDGES: Final = 64
"""Nudges kept per run (and on the stop span); the rest are counted as dropped."""
_PREVIEW_CHARS: Final = 300
_TOOL_CHARS: Final = 80
_LAST_RESULTS: Final = 64
_ADVICE: Final[dict[str, str]] = {
    "repeated_action": (
        "Do not make this call again with these arguments: use the result you already "
        "have, change the arguments, or give your final answer."
    ),
    "duplicate_intent": (
        "This write has already been made: do not make it again; check its result or "
        "give your final answer."
    ),
}


def _nudge(raw: Any) -> Nudge:
    result = raw.get("result")
    return Nudge(
        str(raw["detector"]),
        str(raw["tool"]),
        int(raw["rung"]),
        int(raw["step"]),
        None if result is None else str(result),
    )


class Ladder:
    """The ladder state of one run. Build it with :meth:`of` (None for the default).

    Args:
        policy: the run's policy (its ladders and template).
        mode: ``enforce`` or ``observe``.
        preview: ``result -> str``: the captured (scrubbed, truncated) text of a result,
            given only when content capture is on; else the nudge names the digest.
    """

    def __init__(self, policy: Policy, mode: str, preview: Callable[[Any], str] | None) -> None:
        self._profile = policy.loop_response
        self._by = policy.loop_response_by_detector
        self._template = policy.nudge_template
        self._mode = mode
        self._preview = preview
        self._counts: dict[str, int] = {}
        self._nudges: list[Nudge] = []
        self._open: list[int] = []  # nudges not yet judged: no detection since
        self._late: set[int] = set()  # a detection came first: judged at the end
        self.dropped = 0
        self.observed: list[Nudge] = []
        self._stopped_by_rung = False
        self._last: dict[str, tuple[str, str | None]] = {}

    @classmethod
    def of(
        cls, policy: Policy, mode: str, preview: Callable[[Any], str] | None = None
    ) -> Ladder | None:
        """A ladder for ``policy``, or None when every ladder is ``["stop"]``."""
        if all(
            policy.loop_response_by_detector.get(d, policy.loop_response) == DEFAULT_LOOP_RESPONSE
            for d in LADDER_DETECTORS
        ):
            return None
        return cls(policy, mode, preview)

    @property
    def nudge_count(self) -> int:
        """Nudges given so far (kept and dropped)."""
        return len(self._nudges) + self.dropped

    def respond(self, ticket: ToolTicket, stop: Stop) -> Stop | None:
        """Answer the detection ``stop`` made for ``ticket`` with the next rung.

        Returns:
            ``stop`` (the stop rung, or a detector the ladder does not act on), or None:
            a warn (the call runs) or a nudge (``ticket.nudge`` holds the text, the call
            must not run; in observe mode the call runs and ``observed_response`` says so).
        """
        key = stop.reason.value
        if key not in LADDER_DETECTORS:
            return stop
        ladder = self._by.get(key, self._profile)
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        index = min(count, len(ladder))
        rung = ladder[index - 1]
        # A further detection: the nudges before it did not break the loop.
        self._late.update(self._open)
        self._open.clear()
        if rung == "stop":
            self._stopped_by_rung = self._mode == "enforce"
            return stop
        ticket.rung = index
        ticket.detector = key
        if rung == sc.RESPONSE_WARN:
            ticket.response = rung
            return None
        nudge = Nudge(key, ticket.tool[:_TOOL_CHARS], index, ticket.step)
        if self._mode != "enforce":
            ticket.observed_response = rung
            if len(self.observed) < MAX_NUDGES:
                self.observed.append(nudge)
            return None
        ticket.response = rung
        ticket.nudge = self._text(ticket, stop)
        if len(self._nudges) < MAX_NUDGES:
            self._open.append(len(self._nudges))
            self._nudges.append(nudge)
        else:
            self.dropped += 1
        return None

    def _text(self, ticket: ToolTicket, stop: Stop) -> NudgeText:
        """The nudge: the policy's template filled with facts the guard computed."""
        last = self._last.get(ticket.fingerprint) or self._last.get(ticket.intent)
        if last is None:
            unchanged = "its earlier result has not come back yet"
        elif last[1] is not None:
            unchanged = f"previous result: {last[1]}"
        else:
            unchanged = f"result digest {last[0][:16]}"
        evidence = stop.evidence
        tool = ticket.tool[:_TOOL_CHARS]
        # The template holds only the four plain placeholders (checked at load), and
        # format() never reads a value as a template: a result cannot inject one.
        text = self._template.format(
            tool=tool,
            count=evidence.repetitions or 0,
            unchanged=unchanged,
            advice=_ADVICE.get(evidence.detector or "", _ADVICE["repeated_action"]),
        )
        return NudgeText.of(text, tool=tool, detector=ticket.detector or "", rung=ticket.rung)

    def result(self, ticket: ToolTicket, observation: str, value: Any, progress: bool) -> None:
        """Note a recorded result: kept for the next nudge's ``{unchanged}``; progress
        judges the open nudges ``recovered``."""
        if len(self._last) >= _LAST_RESULTS:
            self._last.clear()  # bounded: fingerprints come from the model's arguments
        preview = None
        if self._preview is not None and value is not None:
            text = self._preview(value)
            preview = text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "…"
        self._last[ticket.fingerprint] = (observation, preview)
        if ticket.intent != ticket.fingerprint:
            self._last[ticket.intent] = (observation, preview)
        if progress:
            self.progress()

    def progress(self) -> None:
        """Progress evidence: every open nudge is ``recovered``."""
        for i in self._open:
            self._nudges[i] = dataclasses.replace(self._nudges[i], result=sc.NUDGE_RECOVERED)
        self._open.clear()

    def close(self, stop: Stop) -> Stop:
        """Judge every nudge left at the run's end; returns ``stop`` with
        ``detail.after_nudges`` when the run had nudges."""
        if stop.reason is StopReason.COMPLETED:
            self.progress()
        end = sc.NUDGE_STOPPED if self._stopped_by_rung else sc.NUDGE_ENDED
        for i in (*self._open, *sorted(self._late)):
            if self._nudges[i].result is None:
                self._nudges[i] = dataclasses.replace(self._nudges[i], result=end)
        self._open.clear()
        self._late.clear()
        if not self.nudge_count:
            return stop
        detail = {**stop.evidence.detail, "after_nudges": self.nudge_count}
        evidence = dataclasses.replace(stop.evidence, detail=detail)
        return dataclasses.replace(stop, evidence=evidence)

    def save(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (a guard snapshot) with the ladder's position and nudges under
        ``"ladder"``: a resumed run goes on up the ladder, never back to its first rung."""
        state["ladder"] = {
            "counts": dict(self._counts),
            "nudges": [n.to_dict() for n in self._nudges],
            "open": list(self._open),
            "late": sorted(self._late),
            "dropped": self.dropped,
            "observed": [n.to_dict() for n in self.observed],
            "stopped_by_rung": self._stopped_by_rung,
        }
        return state

    def load(self, saved: Any) -> None:
        """Take back what :meth:`save` stored (nothing for an older snapshot).

        Raises:
            ValueError: a malformed ladder state.
        """
        if saved is None:
            return
        try:
            self._counts = {str(k): int(v) for k, v in saved["counts"].items()}
            self._nudges = [_nudge(n) for n in saved["nudges"]][:MAX_NUDGES]
            self._open = [int(i) for i in saved["open"] if 0 <= int(i) < len(self._nudges)]
            self._late = {int(i) for i in saved["late"] if 0 <= int(i) < len(self._nudges)}
            self.dropped = int(saved["dropped"])
            self.observed = [_nudge(n) for n in saved["observed"]][:MAX_NUDGES]
            self._stopped_by_rung = bool(saved["stopped_by_rung"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError("snapshot field 'ladder' is malformed") from None
        if any(v < 0 for v in self._counts.values()) or self.dropped < 0:
            raise ValueError("snapshot field 'ladder' is malformed")

    def outcome_fields(self) -> dict[str, Any]:
        """``nudges``, ``nudges_dropped`` and ``observed_nudges`` of the Outcome."""
        return {
            "nudges": tuple(self._nudges),
            "nudges_dropped": self.dropped,
            "observed_nudges": tuple(self.observed),
        }
