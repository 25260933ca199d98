"""OpenAI chat-completions message lists, and tau-bench historical trajectories.

Accepted documents (detected by shape):

* tau-bench ``historical_trajectories/*.json``: a JSON array of runs ``{task_id, trial,
  reward, info, traj}`` where ``traj`` is a chat message list (corpus README
  ``tau-bench/README.md``).
* A list of records ``{messages: [...], ...}`` (or ``traj``), a single such object, or
  JSON Lines with one record per line.
* A bare JSON array of messages (one run).

Messages (OpenAI Chat Completions API, ``messages`` parameter):

* ``system`` / ``developer`` messages are instructions, not turns: skipped.
* ``user`` messages are user steps (actor ``user``).
* ``assistant`` messages are agent steps. ``tool_calls: [{id, type, function: {name,
  arguments}}]`` are the tool calls; ``arguments`` is a JSON string, decoded when
  valid and kept as the raw string when not. The legacy ``function_call: {name,
  arguments}`` is one tool call.
* ``tool`` messages are observations, matched to the oldest unanswered call with the
  same ``tool_call_id`` of the latest turn that has one (tau-bench reuses ids; see
  :mod:`~loopwatch.replay.importers._calls`); without one, to the oldest unanswered
  call of the latest agent step. Legacy ``function`` messages match the oldest
  unanswered call with the same ``name``.
* Error flag: an observation whose text starts with ``Error`` is an error. This is the
  tau-bench convention (its environment returns ``"Error: ..."`` for a failed call);
  plain chat logs carry no error flag, so the same rule is applied to them.

Decisions of agent steps without tool calls: ``refusal`` when the message has a
non-empty ``refusal`` field (OpenAI structured refusals); ``final`` when it is the last
agent step and the run ended normally, otherwise ``message``. A run ends normally when
its inferred stop is ``user_stop`` (tau-bench) or, for plain chat logs, when the
assistant message is the last message of the conversation.

Recorded outcome and stop:

* ``reward`` (a number): 1.0 is ``success``, any other number ``failure``; absent is
  ``unknown``.
* tau-bench does not store why a run ended; for ``traj`` records it is inferred as the
  tau-bench README says (``recorded_stop_kind="inferred"``): ``"###STOP###"`` in the last
  user message is ``user_stop``; else a last tool call to ``transfer_to_human_agents``
  is ``transfer_to_human_agents``; else a run of at least 62 messages is
  ``max_num_steps`` (tau-bench's default ``max_num_steps=30``: 1 system + 1 user +
  30 x 2 messages). Plain chat logs have no recorded stop (``None``).

Run ids: ``task=<task_id>/trial=<trial>`` for tau-bench (``/record=<i>`` appended when
the pair repeats), else the record's ``id`` when it has one, else ``record=<i>`` /
``line=<n>``, with ``/record=<i>`` or ``/line=<n>`` appended to a repeated ``id``; a
single-run file uses the file's stem. The agent name is
``tau-bench-<env>`` when the file follows tau-bench's ``<model>-<env>.json`` naming
(``airline``, ``retail``; the model is then taken from the name too), ``tau-bench``
for other tau-bench files, and the record's ``agent`` field or ``chat`` otherwise.

A run that cannot be read (a message or tool call of the wrong shape, a tool result
that answers no earlier call) gives one :class:`ImportProblem` naming the record and
the message (``[4]`` / ``traj[7]: tool_calls[0] has no name``) and is skipped whole;
the other runs of the file are still read.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from ..trajectory import AGENT, USER, DecisionKindName, ImportProblem, Step, Trajectory
from . import Document
from ._calls import CallDraft, OpenCalls, StepDraft
from ._fields import Malformed, finite_float, recorded_arguments, reward_outcome, text_of
from ._numbers import check_fits

__all__ = ["IMPORTER", "ChatImporter"]

STOP_TOKEN: Final = "###STOP###"
"""tau-bench's user-simulator end-of-conversation token (``tau_bench/envs/user.py``)."""
TRANSFER_TOOL: Final = "transfer_to_human_agents"
STEP_CAP_MESSAGES: Final = 62
"""Messages in a tau-bench run that hit the default ``max_num_steps=30``."""
ERROR_PREFIX: Final = "Error"
"""Observation prefix tau-bench's environment uses for failed tool calls."""

_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_SKIPPED_ROLES: Final = frozenset({"system", "developer"})
_TAU_FILE: Final = re.compile(r"^(?P<model>.+)-(?P<env>airline|retail)$")


class ChatImporter:
    """Reads chat-completions message lists and tau-bench trajectories.

    See the module docstring for accepted shapes and the mapping rules.

    Example::

        doc = Document(path=Path("gpt-4o-airline.json"), text=...)
        runs = [t for t in IMPORTER.read(doc) if isinstance(t, Trajectory)]
    """

    name = "chat"

    def matches(self, doc: Document) -> bool:
        """A message list, a record with ``messages``/``traj``, or a list or JSON Lines of
        such records."""
        data = doc.json
        if data is None:
            return _is_record(doc.first_json_line)
        if isinstance(data, dict):
            return _is_record(data)
        if isinstance(data, list) and data:
            return _is_record(data[0]) or all(_is_message(m) for m in data[:3])
        return False

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]:
        """Yield every readable run and one problem per unreadable record.

        Raises:
            ValueError: the document has none of the accepted shapes.
        """
        source = str(doc.path)
        data = doc.json
        labels = _file_labels(doc)
        records: list[tuple[str, str, Any]]  # (problem record, default run id, record)
        if data is None:
            lines = doc.json_lines
            if not lines:
                raise ValueError("not JSON or JSON Lines")
            records = [(f"line {n}", f"line={n}", value) for n, value in lines]
        elif isinstance(data, dict):
            records = [("file", doc.path.stem, data)]
        elif isinstance(data, list) and data and not _is_record(data[0]):
            records = [("file", doc.path.stem, {"messages": data})]
        elif isinstance(data, list):
            records = [(f"[{i}]", f"record={i}", value) for i, value in enumerate(data)]
        else:
            raise ValueError("not a chat message list or a list of chat records")
        pairs = Counter(_tau_pair(r) for _, _, r in records if isinstance(r, dict) and "traj" in r)
        seen: set[str] = set()
        for index, (where, default_id, record) in enumerate(records):
            try:
                run = _trajectory(
                    record, source, default_id=default_id, index=index, labels=labels, pairs=pairs
                )
            except Malformed as exc:
                yield ImportProblem(source, where, str(exc))
                continue
            if run.run_id in seen:  # two records with the same ``id``
                run = replace(run, run_id=f"{run.run_id}/{default_id}")
            seen.add(run.run_id)
            yield run


def _is_message(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    role = value.get("role")
    return isinstance(role, str) and role in _ROLES


def _is_record(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    for key in ("traj", "messages"):
        messages = value.get(key)
        if isinstance(messages, list) and (not messages or _is_message(messages[0])):
            return True
    return False


def _tau_pair(record: Mapping[str, Any]) -> tuple[str, str]:
    return str(record.get("task_id")), str(record.get("trial"))


@dataclass(frozen=True, slots=True)
class _Labels:
    agent: str
    model: str | None


def _file_labels(doc: Document) -> _Labels:
    match = _TAU_FILE.match(doc.path.stem)
    if match:
        return _Labels(f"tau-bench-{match['env']}", match["model"])
    return _Labels("tau-bench", None)


def _trajectory(
    record: Any,
    source: str,
    *,
    default_id: str,
    index: int,
    labels: _Labels,
    pairs: Counter[tuple[str, str]],
) -> Trajectory:
    if not isinstance(record, dict):
        error = getattr(record, "message", None)  # a JSON Lines line that did not parse
        if isinstance(error, str):
            raise Malformed(f"not valid JSON: {error}")
        raise Malformed(f"a record must be an object, got {type(record).__name__}")
    tau = "traj" in record
    key = "traj" if tau else "messages"
    messages = record.get(key)
    if not isinstance(messages, list):
        raise Malformed(f"'{key}' is missing or not a list")

    steps, last_user_text, last_call = _steps(messages, key)
    stop: str | None = None
    if tau:
        if last_user_text is not None and STOP_TOKEN in last_user_text:
            stop = "user_stop"
        elif last_call == TRANSFER_TOOL:
            stop = TRANSFER_TOOL
        elif len(messages) >= STEP_CAP_MESSAGES:
            stop = "max_num_steps"
    ended_normally = (
        stop == "user_stop"
        if tau
        else bool(messages)
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "assistant"
    )
    steps = _mark_final(steps, ended_normally=ended_normally)

    check_fits(record.get("reward"), "reward", error=Malformed)
    reward = finite_float(record.get("reward"))
    metadata: dict[str, Any] = {}
    if tau:
        task_id, trial = _tau_pair(record)
        run_id = f"task={task_id}/trial={trial}"
        if pairs[(task_id, trial)] > 1:
            run_id += f"/record={index}"
        metadata.update(task_id=record.get("task_id"), trial=record.get("trial"))
        agent, model = labels.agent, labels.model
    else:
        raw_id = record.get("id")
        run_id = str(raw_id) if isinstance(raw_id, str | int) and raw_id != "" else default_id
        agent_field, model_field = record.get("agent"), record.get("model")
        agent = agent_field if isinstance(agent_field, str) and agent_field else "chat"
        model = model_field if isinstance(model_field, str) and model_field else None
    return Trajectory(
        source=source,
        run_id=run_id,
        format=IMPORTER.name,
        steps=tuple(steps),
        recorded_outcome=reward_outcome(reward, metadata),
        recorded_stop=stop,
        recorded_stop_kind="inferred",
        agent=agent,
        model=model,
        metadata=metadata,
    )


def _steps(messages: list[Any], key: str) -> tuple[list[Step], str | None, str | None]:
    """Steps, the last user message's text and the last tool call's name."""
    drafts: list[StepDraft] = []
    by_id: OpenCalls[CallDraft] = OpenCalls()
    last_user_text: str | None = None
    last_call: str | None = None
    for index, message in enumerate(messages):
        where = f"{key}[{index}]"
        if not isinstance(message, dict):
            raise Malformed(f"{where} is not an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise Malformed(f"{where}: unknown role {role!r}")
        if role in _SKIPPED_ROLES:
            continue
        text = _content(message.get("content"))
        if role == "user":
            last_user_text = text
            drafts.append(StepDraft(USER, "message", text))
        elif role == "assistant":
            calls = _calls(message, where)
            decision: DecisionKindName = (
                "tool" if calls else "refusal" if message.get("refusal") else "message"
            )
            drafts.append(StepDraft(AGENT, decision, text, calls))
            by_id.begin_turn()
            for call in calls:
                by_id.add(call.call_id, call)
                last_call = call.name
        else:
            _answer(message, role, where, text, drafts=drafts, by_id=by_id)
    return [d.recorded(i) for i, d in enumerate(drafts)], last_user_text, last_call


def _mark_final(steps: list[Step], *, ended_normally: bool) -> list[Step]:
    if not ended_normally:
        return steps
    for i in range(len(steps) - 1, -1, -1):
        step = steps[i]
        if step.actor == AGENT:
            if step.decision == "message":
                steps[i] = Step(i, AGENT, "final", step.text)
            break
    return steps


def _calls(message: Mapping[str, Any], where: str) -> list[CallDraft]:
    raw = message.get("tool_calls")
    calls: list[CallDraft] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise Malformed(f"{where}: 'tool_calls' is not a list")
        for position, item in enumerate(raw):
            at = f"{where}: tool_calls[{position}]"
            if not isinstance(item, dict):
                raise Malformed(f"{at} is not an object")
            function = item.get("function")
            if not isinstance(function, dict):
                raise Malformed(f"{at} has no 'function' object")
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise Malformed(f"{at} has no name")
            call_id = item.get("id")
            call_id = call_id if isinstance(call_id, str) and call_id else None
            calls.append(CallDraft(name, recorded_arguments(function.get("arguments")), call_id))
    legacy = message.get("function_call")
    if legacy is not None:
        if not isinstance(legacy, dict):
            raise Malformed(f"{where}: 'function_call' is not an object")
        name = legacy.get("name")
        if not isinstance(name, str) or not name:
            raise Malformed(f"{where}: function_call has no name")
        calls.append(CallDraft(name, recorded_arguments(legacy.get("arguments")), None))
    return calls


def _answer(
    message: Mapping[str, Any],
    role: str,
    where: str,
    text: str | None,
    *,
    drafts: list[StepDraft],
    by_id: OpenCalls[CallDraft],
) -> None:
    """Attach a ``tool`` / ``function`` message to the call it answers."""
    call: CallDraft | None = None
    if role == "tool":
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str) and call_id:
            call = by_id.answer(call_id)
            if call is None or call.answered:
                raise Malformed(f"{where}: tool result {call_id!r} answers no earlier call")
        else:
            call = _oldest_unanswered(drafts, None)
    else:
        name = message.get("name")
        call = _oldest_unanswered(drafts, name if isinstance(name, str) else None)
    if call is None:
        raise Malformed(f"{where}: {role} result answers no earlier call")
    call.answered = True
    call.observation = text
    call.error = text is not None and text.startswith(ERROR_PREFIX)


def _oldest_unanswered(drafts: list[StepDraft], name: str | None) -> CallDraft | None:
    for draft in reversed(drafts):
        if draft.actor != AGENT:
            continue
        for call in draft.calls:
            if not call.answered and (name is None or call.name == name):
                return call
        return None
    return None


def _content(value: Any) -> str | None:
    """Message text: a string as is; content parts joined (text parts only)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [
            part["text"]
            for part in value
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts) if texts else None
    return text_of(value)


IMPORTER: Final = ChatImporter()
