"""ReAct ``Thought/Action/Observation`` text logs (the Reflexion HotpotQA run logs).

Format (Shinn et al., 2023, ``noahshinn/reflexion`` ``hotpotqa_runs/root/ReAct/*``):
optional ``BEGIN TRIAL n`` banners, sections ``----- BEGIN CORRECT|INCORRECT|HALTED
AGENTS -----``, and one block per run starting at ``Question:``. Inside a block an
optional ``Reflections:`` list of ``- ...`` lines (the self-critique of the previous
trial), then steps ``Thought i:`` / ``Action i: Tool[argument]`` / ``Observation i:``
(observations wrap onto unprefixed continuation lines) and, in Reflexion logs,
``Correct answer: <gold>``.

Mapping onto :class:`~loopwatch.replay.trajectory.Trajectory`:

* ``run_id`` is ``trial<t>|<section>|q<NNN>``: the trial (1 when the file has no
  trial banner), the section in lower case (``unsectioned`` before any banner) and the
  block's 1-based ordinal in the whole file, zero-padded to three digits (the ids the
  corpus README uses, e.g. ``trial2|halted|q186``).
* Step 0 is the user's question; then one agent step per ``Thought i``: its text is the
  thought, and the ``Action i`` line is parsed as the environment parses it (regex
  ``^(\\w+)\\[(.+)\\]$`` in ``hotpotqa_runs/agents.py`` ``parse_action``): the whole
  line is one action, so ``Search[A], Search[B]`` is one ``Search`` call whose
  argument is ``A], Search[B`` (the environment answered such lines with one
  ``Could not find that page``). ``Finish[answer]`` is the ``final`` decision, not a tool
  call; any other tool (``Search``, ``Lookup``, the malformed ``Compare``) is a tool
  call with arguments ``{"entity": ...}`` (Search), ``{"keyword": ...}`` (Lookup) or
  ``{"argument": ...}``. A thought with no action is a ``message`` decision.
* Error flag: the observation says the requested page or keyword does not exist or the
  action was refused: it starts with ``Could not find`` (a failed search, with or
  without ``Similar:`` suggestions), ``No Results`` (a failed lookup), ``The last page
  Searched was not found`` or ``Invalid Action``.
* ``recorded_outcome``: CORRECT is success; INCORRECT and HALTED are failure;
  unsectioned runs are unknown. ``recorded_stop`` is ``halted`` for the HALTED section
  and ``finish`` for CORRECT / INCORRECT, both ``explicit`` (the section records it);
  an unsectioned run gets ``finish`` (explicit) when it called ``Finish`` and
  ``halted`` (inferred) otherwise. Two HALTED runs of the base log end with a
  ``Finish`` step; the section still decides (``metadata["finish_called"]`` says so).

Malformed input: an ``Action`` line that is not ``Tool[argument]`` drops its run with
an :class:`~loopwatch.replay.trajectory.ImportProblem` naming the line; text outside
any run is reported once per stretch; every other run is still read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from ..trajectory import AGENT, USER, ImportProblem, Step, StopKind, ToolCall, Trajectory
from . import Document
from ._fields import outcome_of

__all__ = ["IMPORTER", "ReactImporter", "parse_action"]

_SECTION = re.compile(r"^-+\s*BEGIN (CORRECT|INCORRECT|HALTED) AGENTS\s*-*\s*$")
_TRIAL = re.compile(r"^BEGIN TRIAL (\d+)\s*$")
_BANNER = re.compile(r"^(#+|Trial summary:.*)\s*$")
_QUESTION = re.compile(r"^Question:\s?(.*)$")
_STEP = re.compile(r"^(Thought|Action|Observation) (\d+):\s?(.*)$")
_GOLD = re.compile(r"^Correct answer:\s?(.*)$")
_ACTION = re.compile(r"^(\w+)\[(.*)\]$", re.DOTALL)

_MATCH_HEAD_CHARS: Final = 256 << 10
_MATCH_QUESTION = re.compile(r"^Question:", re.MULTILINE)
_MATCH_STEP = re.compile(r"^(?:Thought|Action) \d+: ", re.MULTILINE)

_ERROR_PREFIXES: Final = (
    "Could not find",
    "No Results",
    "The last page Searched was not found",
    "Invalid Action",
)
_ARGUMENT_KEYS: Final = {"Search": "entity", "Lookup": "keyword"}
_PASSED: Final = {"CORRECT": True, "INCORRECT": False, "HALTED": False}
FINISH: Final = "Finish"


def parse_action(text: str) -> tuple[str, str] | None:
    """Split an action line's text into ``(tool, argument)`` like the ReAct environment.

    The rule is ``parse_action`` of ``noahshinn/reflexion`` ``hotpotqa_runs/agents.py``
    (``^(\\w+)\\[(.+)\\]$``), relaxed to accept an empty argument: greedy, so packed
    actions stay one action. Returns ``None`` when the text is not ``Tool[argument]``.

    Example:
        >>> parse_action("Search[A], Search[B]")
        ('Search', 'A], Search[B')
    """
    match = _ACTION.match(text.strip())
    if match is None:
        return None
    return match.group(1), match.group(2)


@dataclass
class _RawStep:
    thought: str | None = None
    action: str | None = None
    action_line: int = 0
    observation: str | None = None


@dataclass
class _Block:
    line: int
    ordinal: int
    trial: int
    section: str | None
    question: str
    reflections: list[str] = field(default_factory=list)
    steps: list[_RawStep] = field(default_factory=list)
    gold: str | None = None
    last: str = "question"

    @property
    def run_id(self) -> str:
        section = self.section.lower() if self.section else "unsectioned"
        return f"trial{self.trial}|{section}|q{self.ordinal:03d}"

    def extend(self, line: str) -> None:
        """Append an unprefixed continuation line to whatever was read last."""
        current = self.steps[-1] if self.steps else None
        if self.last == "reflection" and self.reflections:
            self.reflections[-1] += "\n" + line
        elif self.last == "thought" and current is not None and current.thought is not None:
            current.thought += "\n" + line
        elif self.last == "action" and current is not None and current.action is not None:
            current.action += "\n" + line
        elif self.last == "observation" and current is not None and current.observation is not None:
            current.observation += "\n" + line
        elif self.last == "gold" and self.gold is not None:
            self.gold += "\n" + line
        else:
            self.question += "\n" + line


class ReactImporter:
    """Reads ReAct text logs; see the module docstring for the mapping."""

    name = "react"

    def matches(self, doc: Document) -> bool:
        """A text (not JSON) file with a ``Question:`` line and numbered step lines."""
        head = doc.text[:_MATCH_HEAD_CHARS]
        if head.lstrip()[:1] in ("{", "["):
            return False
        return bool(_MATCH_QUESTION.search(head)) and bool(_MATCH_STEP.search(head))

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]:
        """Every run block of the file, in order; a malformed block becomes a problem."""
        source = str(doc.path)
        trial = 1
        section: str | None = None
        ordinal = 0
        block: _Block | None = None
        stray_reported = False
        # split on "\n" only: line numbers must match what an editor shows
        for number, raw in enumerate(doc.text.split("\n"), start=1):
            line = raw.rstrip()
            if block is None and not line.strip():
                continue
            trial_match = _TRIAL.match(line)
            section_match = _SECTION.match(line)
            question_match = _QUESTION.match(line)
            if trial_match or section_match or question_match or _BANNER.match(line):
                if block is not None:
                    yield self._build(source, block)
                    block = None
                stray_reported = False
                if trial_match:
                    trial = int(trial_match.group(1))
                    section = None
                elif section_match:
                    section = section_match.group(1)
                elif question_match:
                    ordinal += 1
                    block = _Block(number, ordinal, trial, section, question_match.group(1))
                continue
            if block is None:
                if not stray_reported:
                    yield ImportProblem(source, f"line {number}", "text outside any run")
                    stray_reported = True
                continue
            self._feed(block, number, line)
        if block is not None:
            yield self._build(source, block)

    @staticmethod
    def _feed(block: _Block, number: int, line: str) -> None:
        step_match = _STEP.match(line)
        if step_match:
            kind, text = step_match.group(1), step_match.group(3)
            current = block.steps[-1] if block.steps else None
            if kind == "Thought":
                block.steps.append(_RawStep(thought=text))
                block.last = "thought"
            elif kind == "Action":
                if current is None or current.action is not None or current.observation:
                    current = _RawStep()
                    block.steps.append(current)
                current.action = text
                current.action_line = number
                block.last = "action"
            else:
                if current is None or current.observation is not None:
                    current = _RawStep()
                    block.steps.append(current)
                current.observation = text
                block.last = "observation"
            return
        gold_match = _GOLD.match(line)
        if gold_match:
            block.gold = gold_match.group(1)
            block.last = "gold"
        elif line.strip() == "Reflections:" and not block.steps:
            block.last = "reflections"
        elif line.startswith("- ") and block.last in ("reflections", "reflection"):
            block.reflections.append(line[2:])
            block.last = "reflection"
        elif line.strip():
            block.extend(line)

    @staticmethod
    def _build(source: str, block: _Block) -> Trajectory | ImportProblem:
        run_id = block.run_id
        steps: list[Step] = [Step(index=0, actor=USER, decision="message", text=block.question)]
        final_answer: str | None = None
        for raw in block.steps:
            index = len(steps)
            if raw.action is None:
                steps.append(Step(index=index, actor=AGENT, decision="message", text=raw.thought))
                continue
            parsed = parse_action(raw.action)
            if parsed is None:
                return ImportProblem(
                    source,
                    f"line {raw.action_line}",
                    f"run {run_id}: action is not Tool[argument]: {raw.action[:80]!r}",
                )
            tool, argument = parsed
            if tool == FINISH:
                final_answer = argument
                steps.append(Step(index=index, actor=AGENT, decision="final", text=raw.thought))
                continue
            call = ToolCall(
                name=tool,
                arguments={_ARGUMENT_KEYS.get(tool, "argument"): argument},
                observation=raw.observation,
                error=raw.observation is not None and raw.observation.startswith(_ERROR_PREFIXES),
            )
            steps.append(
                Step(
                    index=index, actor=AGENT, decision="tool", text=raw.thought, tool_calls=(call,)
                )
            )
        finish_called = final_answer is not None
        stop: str
        stop_kind: StopKind = "explicit"
        if block.section == "HALTED":
            stop = "halted"
        elif block.section is not None or finish_called:
            stop = "finish"
        else:
            stop, stop_kind = "halted", "inferred"
        metadata: dict[str, Any] = {
            "trial": block.trial,
            "section": block.section,
            "question_ordinal": block.ordinal,
            "line": block.line,
            "question": block.question,
            "finish_called": finish_called,
        }
        if final_answer is not None:
            metadata["final_answer"] = final_answer
        if block.gold is not None:
            metadata["gold_answer"] = block.gold
        if block.reflections:
            metadata["reflections"] = tuple(block.reflections)
        return Trajectory(
            source=source,
            run_id=run_id,
            format=ReactImporter.name,
            steps=tuple(steps),
            recorded_outcome=outcome_of(_PASSED.get(block.section or "")),
            recorded_stop=stop,
            recorded_stop_kind=stop_kind,
            agent="react",
            metadata=metadata,
        )


IMPORTER: Final = ReactImporter()
"""The ``react`` importer instance the registry loads."""
