"""What loopwatch's own spans say only indirectly, made explicit for replay.

Read by :mod:`.otlp_json` for traces holding loopwatch spans (an exported run above
all, :mod:`loopwatch.replay.export_run`), so that the run replays to its stored stop:

* a ``message`` decision's text was not captured (content is opt-in), its
  ``loopwatch.decision.fingerprint`` was: it stands in for the text, so equal plans stay
  equal and different ones different (``repeated_decision`` compares them);
* progress the spans show only by its effect: a decision's
  ``loopwatch.steps_since_progress`` back to 0 after the first step, with no tool result
  of the step before marked ``loopwatch.progress`` (a user turn, ``run.progress()``).
  It becomes an environment turn before that step, as the live guard had it; without
  it a chat run would replay to ``no_progress`` where it ran to its end. (Before the
  first step the count is 0 anyway: nothing to tell.)
"""

from __future__ import annotations

from typing import Any

from loopwatch.collector import genai
from loopwatch.collector.records import Attributes
from loopwatch.instrumentation import _semconv as sc
from loopwatch.replay.trajectory import ENVIRONMENT, Step

__all__ = ["message_text", "progress_turn", "tool_progress"]


def message_text(attributes: Attributes) -> str | None:
    """The stand-in text of a decision: ``loopwatch.decision.fingerprint=<sha256>``."""
    fingerprint = genai.attr_str(attributes, sc.LW_DECISION_FINGERPRINT)
    return f"{sc.LW_DECISION_FINGERPRINT}={fingerprint}" if fingerprint else None


def progress_turn(
    index: int, number: int, decision: Attributes, timestamp: float | None
) -> Step | None:
    """The environment turn before agent step ``number`` (> 1) whose decision attributes
    show progress no tool result of the step before explains, else None. The caller
    checks the tool results; ``index`` is the turn's place among all steps."""
    if genai.attr_int(decision, sc.LW_STEPS_SINCE_PROGRESS) != 0:
        return None
    text = f"{sc.LW_STEPS_SINCE_PROGRESS}=0 before step {number}"  # unique: new input
    return Step(index, ENVIRONMENT, "message", text, (), timestamp)


def tool_progress(tools: list[Any]) -> bool:
    """Whether a tool span of the step recorded ``loopwatch.progress = true``."""
    return any(span.attributes.get(sc.LW_PROGRESS) is True for span in tools)
