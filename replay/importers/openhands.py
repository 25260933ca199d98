"""OpenHands (formerly OpenDevin) event streams: CodeAct agent runs.

Three shapes, all from ``OpenHands/OpenHands``:

* ``.jsonl`` evaluation / resolver output: one run per line, ``{instance_id | issue,
  history: [...], metadata, error, test_result | success, ...}``.
* The same object pretty-printed as one ``.json`` file (one run).
* A bare ``.json`` list of events (``tests/runtime/trajs/*.json``): one run.

Events come in two formats. The **event-stream** format has ``{id, timestamp, source:
agent|user|environment, action | observation, args | extras, cause,
tool_call_metadata: {function_name, tool_call_id, model_response}}``; an observation
names its action by ``cause``. The **older flat** format (resolver output) has no ids:
actions ``{action, command | code, thought, ...}`` are each followed by their
observation ``{observation, content, exit_code}``.

Mapping onto :class:`~loopwatch.replay.trajectory.Trajectory` (``run_id``:
``instance_id``, else ``owner/repo#number`` of the resolver ``issue``, else
``line-<n>``; the file stem for a bare event list or a one-run ``.json``):

* User ``message`` actions are user steps. In the flat format (no ``source``) a
  ``message`` before the first agent action is the user's, later ones the agent's.
* Agent actions: ``finish`` is the ``final`` decision (text: ``final_thought``,
  ``thought`` or ``message``); ``reject`` is a ``refusal``; ``message`` is a
  ``message`` decision; ``system``, ``recall`` and ``change_agent_state`` are
  bookkeeping and skipped; every other action is a tool call. Tool name:
  ``tool_call_metadata.function_name``, else the ``action``. Arguments: ``args`` (the
  flat event itself) without ``thought`` (the step's text) and without fields OpenHands
  adds itself (:data:`BOOKKEEPING_KEYS`). Actions answering one model response (same
  ``model_response.id``) share one step; token usage of that response is put on it.
* Observations: matched to their action by ``cause`` (flat: the preceding action); the
  call's ``observation`` is the ``content`` and its error flag is set when the
  observation kind is ``error``, the exit code (``extras.metadata.exit_code``,
  ``extras.exit_code`` or the flat ``exit_code``) is not 0 (``-1``, a command that did
  not complete, counts as an error), or the content starts with ``ERROR:`` (how the
  ``str_replace_editor`` tool reports a failed command inside an ``edit`` / ``read``
  observation). Observations with no matching action (``recall``
  context, the ``error`` for a rejected malformed tool call) are environment steps;
  ``null`` and ``agent_state_changed`` are skipped.
* ``recorded_stop``: ``finish`` when a finish action occurs (explicit);
  ``max_iterations`` when the run's ``error`` says the agent reached its maximum
  iteration (explicit); ``error`` for any other run error (explicit); else the agent
  state of trailing ``agent_state_changed`` events (e.g. ``awaiting_user_input``,
  inferred); else ``None``.
* ``recorded_outcome``: ``test_result.report.resolved`` or ``test_result.resolved``
  when present (SWE-bench style evaluation verdicts); else the resolver's own
  ``success`` flag (its LLM-judged verdict); else ``unknown``. A ``test_result``
  holding only a ``git_patch`` is not a verdict.

Malformed input: an invalid JSON line, a line that is not an object with a
``history`` list, or a non-object event gives an
:class:`~loopwatch.replay.trajectory.ImportProblem` naming the line (and event);
the other lines are still read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..trajectory import (
    AGENT,
    ENVIRONMENT,
    USER,
    ImportProblem,
    Outcome,
    StopKind,
    Trajectory,
)
from . import Document
from ._calls import CallDraft, StepDraft
from ._fields import Malformed, int_or_none, iso_seconds, outcome_of
from ._numbers import check_fits

__all__ = ["BOOKKEEPING_KEYS", "IMPORTER", "OpenHandsImporter"]

BOOKKEEPING_KEYS: Final = frozenset(
    {
        "action",
        "action_risk",
        "blocking",
        "confirmation_state",
        "cwd",
        "hidden",
        "impl_source",
        "is_confirmed",
        "is_static",
        "keep_prompt",
        "kernel_init_code",
        "security_risk",
        "thought",
        "translated_ipython_code",
    }
)
"""Action fields OpenHands sets itself (not the model's arguments), dropped from calls."""

_SKIPPED_ACTIONS: Final = frozenset({"system", "recall", "change_agent_state"})
_SKIPPED_OBSERVATIONS: Final = frozenset({"null", "agent_state_changed", "recall"})
_ERROR_PREFIX: Final = "ERROR:"
_MAX_ITERATIONS = re.compile(r"maximum iteration", re.IGNORECASE)
_SAMPLE_EVENTS: Final = 20


class OpenHandsImporter:
    """Reads OpenHands event streams; see the module docstring for the mapping."""

    name = "openhands"

    def matches(self, doc: Document) -> bool:
        """An event list, a run object with ``history``, or JSON Lines of such runs."""
        data = doc.json
        if isinstance(data, list):
            return _looks_like_events(data)
        if isinstance(data, dict):
            return _looks_like_run(data)
        return _looks_like_run(doc.first_json_line)

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]:
        """Every run of the file; one problem per unreadable line.

        Raises:
            ValueError: the file is neither an event list, a run object, nor JSON Lines.
        """
        source = str(doc.path)
        data = doc.json
        if isinstance(data, list):
            if not _looks_like_events(data):
                raise ValueError(
                    f"not an OpenHands event list (its first {_SAMPLE_EVENTS} items are not"
                    " all objects, or none has an 'action' or 'observation')"
                )
            try:
                yield _build(source, doc.path.stem, data, {}, line=None)
            except Malformed as exc:
                yield ImportProblem(source, "file", str(exc))
            return
        if isinstance(data, dict):
            records: list[tuple[int | None, Any]] = [(None, data)]
        else:
            lines = doc.json_lines
            if lines is None:
                raise ValueError("not an OpenHands event list, run object or JSON Lines")
            records = list(lines)
        seen: set[str] = set()
        for number, record in records:
            where = "file" if number is None else f"line {number}"
            if not isinstance(record, dict):
                message = getattr(record, "message", None)
                text = f"invalid JSON: {message}" if message else "not a JSON object"
                yield ImportProblem(source, where, text)
                continue
            history = record.get("history")
            if not isinstance(history, list):
                yield ImportProblem(source, where, "no history list")
                continue
            run_id = _run_id(record, doc.path.stem if number is None else f"line-{number}")
            if run_id in seen:
                run_id = f"{run_id}@line-{number}"
            seen.add(run_id)
            try:
                yield _build(source, run_id, history, record, line=number)
            except Malformed as exc:
                yield ImportProblem(source, where, str(exc))


def _looks_like_events(items: Sequence[Any]) -> bool:
    sample = items[:_SAMPLE_EVENTS]
    return (
        bool(sample)
        and all(isinstance(e, dict) for e in sample)
        and any(isinstance(e.get("action") or e.get("observation"), str) for e in sample)
    )


def _looks_like_run(record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    history = record.get("history")
    return isinstance(history, list) and _looks_like_events(history)


def _run_id(record: Mapping[str, Any], fallback: str) -> str:
    instance = record.get("instance_id")
    if isinstance(instance, str | int) and str(instance):
        return str(instance)
    issue = record.get("issue")
    if isinstance(issue, Mapping) and issue.get("number") is not None:
        return f"{issue.get('owner')}/{issue.get('repo')}#{issue.get('number')}"
    return fallback


@dataclass
class _OpenStep(StepDraft):
    response_id: str | None = None


def _build(
    source: str,
    run_id: str,
    history: Sequence[Any],
    record: Mapping[str, Any],
    *,
    line: int | None,
) -> Trajectory:
    steps: list[_OpenStep] = []
    calls_by_id: dict[Any, CallDraft] = {}
    pending_flat: CallDraft | None = None
    seen_responses: set[str] = set()
    finished = False
    agent_acted = False
    agent_class: str | None = None
    model: str | None = None
    trailing_state: str | None = None
    for position, event in enumerate(history):
        if not isinstance(event, dict):
            raise Malformed(f"history[{position}]: event is {type(event).__name__}, not an object")
        action = event.get("action")
        observation = event.get("observation")
        if isinstance(observation, str):
            if observation == "agent_state_changed":
                trailing_state = _state(event)
                continue
            trailing_state = None
            cause = event.get("cause")
            call = calls_by_id.get(cause) if isinstance(cause, int | str) else None
            if call is None and "source" not in event and pending_flat is not None:
                call = pending_flat
            pending_flat = None
            if call is not None and call.observation is None:
                content = _text(event.get("content"))
                call.observation = content
                call.error = (
                    observation == "error"
                    or _exit_code(event) not in (None, 0)
                    or content.startswith(_ERROR_PREFIX)
                )
                call.ended_at = _timestamp(event.get("timestamp"))
            elif call is None and observation not in _SKIPPED_OBSERVATIONS:
                shown = _text(event.get("content")) or _text(event.get("message")) or None
                steps.append(_OpenStep(ENVIRONMENT, "message", shown, timestamp=_timestamp(event)))
            continue
        if not isinstance(action, str):
            continue
        trailing_state = None
        args = event.get("args")
        fields: Mapping[str, Any] = args if isinstance(args, Mapping) else event
        source_actor = event.get("source")
        if source_actor is None:
            source_actor = "agent" if action != "message" or agent_acted else "user"
        if action == "system":
            agent_class = agent_class or _text(fields.get("agent_class"))
        if action in _SKIPPED_ACTIONS or source_actor == "environment":
            continue
        if source_actor == "user":
            if action == "message":
                text = _text(fields.get("content")) or _text(event.get("message")) or None
                steps.append(_OpenStep(USER, "message", text, timestamp=_timestamp(event)))
            continue
        agent_acted = True
        metadata = event.get("tool_call_metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        response = metadata.get("model_response")
        response = response if isinstance(response, Mapping) else {}
        response_id = _text(response.get("id"))
        model = model or _text(response.get("model"))
        thought = _text(fields.get("thought")) or None
        if action == "finish":
            finished = True
            text = (
                _text(fields.get("final_thought")) or thought or _text(event.get("message")) or None
            )
            step = _OpenStep(AGENT, "final", text)
        elif action == "reject":
            step = _OpenStep(AGENT, "refusal", thought or _text(event.get("message")) or None)
        elif action == "message":
            step = _OpenStep(AGENT, "message", _text(fields.get("content")) or thought or None)
        else:
            name = _text(metadata.get("function_name")) or action
            arguments = {k: v for k, v in fields.items() if k not in BOOKKEEPING_KEYS}
            call = CallDraft(
                name,
                arguments,
                _text(metadata.get("tool_call_id")) or None,
                started_at=_timestamp(event.get("timestamp")),
            )
            if isinstance(event.get("id"), int | str):
                calls_by_id[event["id"]] = call
            if "source" not in event:
                pending_flat = call
            previous = steps[-1] if steps else None
            if (
                previous is not None
                and response_id
                and previous.response_id == response_id
                and previous.decision == "tool"
            ):
                previous.calls.append(call)
                continue
            step = _OpenStep(AGENT, "tool", thought, calls=[call])
        step.timestamp = _timestamp(event.get("timestamp"))
        if response_id:
            step.response_id = response_id
            if response_id not in seen_responses:
                seen_responses.add(response_id)
                usage = response.get("usage")
                if isinstance(usage, Mapping):
                    at = f"history[{position}].tool_call_metadata.model_response.usage"
                    step.input_tokens = _tokens(usage.get("prompt_tokens"), f"{at}.prompt_tokens")
                    step.output_tokens = _tokens(
                        usage.get("completion_tokens"), f"{at}.completion_tokens"
                    )
        steps.append(step)

    error = record.get("error")
    error_text = error if isinstance(error, str) and error.strip() else None
    stop: str | None
    stop_kind: StopKind = "explicit"
    if finished:
        stop = "finish"
    elif error_text is not None and _MAX_ITERATIONS.search(error_text):
        stop = "max_iterations"
    elif error_text is not None:
        stop = "error"
    else:
        stop, stop_kind = trailing_state, "inferred"
    run_metadata = record.get("metadata")
    run_metadata = run_metadata if isinstance(run_metadata, Mapping) else {}
    llm_config = run_metadata.get("llm_config")
    if isinstance(llm_config, Mapping) and _text(llm_config.get("model")):
        model = _text(llm_config.get("model"))
    agent = _text(run_metadata.get("agent_class")) or agent_class or "openhands"
    extra: dict[str, Any] = {"line": line}
    if error_text is not None:
        extra["error"] = error_text
    if run_metadata.get("max_iterations") is not None:
        extra["max_iterations"] = int_or_none(run_metadata.get("max_iterations"))
    return Trajectory(
        source=source,
        run_id=run_id,
        format=OpenHandsImporter.name,
        steps=tuple(step.recorded(index) for index, step in enumerate(steps)),
        recorded_outcome=_outcome(record),
        recorded_stop=stop,
        recorded_stop_kind=stop_kind,
        agent=agent,
        model=model,
        metadata=extra,
    )


def _outcome(record: Mapping[str, Any]) -> Outcome:
    result = record.get("test_result")
    if isinstance(result, Mapping):
        report = result.get("report")
        for verdict in (
            report.get("resolved") if isinstance(report, Mapping) else None,
            result.get("resolved"),
        ):
            if isinstance(verdict, bool):
                return outcome_of(verdict)
    success = record.get("success")
    return outcome_of(success if isinstance(success, bool) else None)


def _state(event: Mapping[str, Any]) -> str | None:
    extras = event.get("extras")
    state = extras.get("agent_state") if isinstance(extras, Mapping) else None
    return state if isinstance(state, str) else None


def _exit_code(event: Mapping[str, Any]) -> int | None:
    extras = event.get("extras")
    if isinstance(extras, Mapping):
        meta = extras.get("metadata")
        if isinstance(meta, Mapping) and meta.get("exit_code") is not None:
            return int_or_none(meta.get("exit_code"))
        if extras.get("exit_code") is not None:
            return int_or_none(extras.get("exit_code"))
    return int_or_none(event.get("exit_code"))


def _timestamp(value: Any) -> float | None:
    if isinstance(value, Mapping):
        value = value.get("timestamp")
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return None
    return iso_seconds(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _tokens(value: Any, where: str) -> int | None:
    """A token count (a number or a numeric string); one too large for a float makes
    the run unreadable (the guard adds counts up as floats)."""
    count = int_or_none(value)
    check_fits(count, where, error=Malformed)
    return count


IMPORTER: Final = OpenHandsImporter()
"""The ``openhands`` importer instance the registry loads."""
