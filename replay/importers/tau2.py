"""tau2-bench results files: one :class:`Trajectory` per simulation.

Format (tau2-bench, ``src/tau2/data_model/simulation.py``; corpus README
``tau2-bench/README.md``): one JSON object ``{timestamp, info, tasks, simulations}``.
Each ``simulations[i]`` is ``{id, task_id, trial, start_time, end_time, duration,
termination_reason, agent_cost, user_cost, reward_info{reward, ...}, messages[]}`` and
each message is ``{role, content, tool_calls, timestamp, cost, usage, ...}``:

* ``assistant`` messages are agent steps; their ``tool_calls`` (``{id, name,
  arguments, requestor}``) are the agent's tool calls.
* ``user`` messages are simulated-user steps (actor ``user``); in dual-control domains
  (telecom) they carry the user's own device tool calls (``requestor: "user"``), kept
  on the user step and never counted as agent actions.
* ``tool`` messages ``{id, content, error}`` are observations, matched to the oldest
  unanswered call with the same ``id`` of the latest turn that has one (tau2 may reuse
  an id within a simulation and within one turn: each result answers the call it
  follows); ``error`` is the error flag.
* ``system`` messages are not turns and are skipped.

Mapping rules:

* ``run_id`` is ``task=<task_id>/trial=<trial>``; when that pair occurs more than once
  in the file every occurrence gets ``/sim=<id>`` appended (and ``/simulations[i]`` if
  the simulation id repeats too), so ids are unique per file.
* ``recorded_stop`` is ``termination_reason`` verbatim (``user_stop``, ``agent_stop``,
  ``max_steps``, ``too_many_errors``), ``recorded_stop_kind="explicit"`` (``None``
  and ``inferred`` when a simulation has none).
* ``recorded_outcome``: ``reward_info.reward`` 1.0 is ``success``, any other number is
  ``failure``, absent is ``unknown`` (tau2 rewards are 0.0 or 1.0).
* An agent message with no tool calls is a ``final`` decision when it is the last agent
  turn of a run that ended normally (``user_stop`` or ``agent_stop``), otherwise a
  ``message`` (a question or remark mid-conversation, or the last words of a run cut
  off by ``max_steps`` / ``too_many_errors``).
* Timestamps are ISO 8601; tau2 writes them without a zone, and they are read as UTC.
* ``usage.prompt_tokens`` / ``completion_tokens`` and ``cost`` go on the step.
* ``agent`` is ``tau2-<domain>`` (``-solo`` appended for the no-user solo agent),
  ``model`` is ``info.agent_info.llm``.

A simulation that cannot be read (not an object, no message list, a message or tool
call of the wrong shape, a tool result whose id matches no earlier call awaiting a
result, a token count, cost or reward too large for a float) is reported as one
:class:`ImportProblem` naming ``simulations[i]`` and the message, and skipped whole: a
partial run would replay as a different run. The other simulations are still read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, Final

from ..trajectory import (
    AGENT,
    USER,
    Actor,
    DecisionKindName,
    ImportProblem,
    Step,
    ToolCall,
    Trajectory,
)
from . import Document
from ._calls import OpenCalls
from ._fields import (
    Malformed,
    finite_float,
    iso_seconds,
    recorded_arguments,
    reward_outcome,
    text_of,
)
from ._numbers import check_fits

__all__ = ["IMPORTER", "Tau2Importer"]

NORMAL_STOPS: Final = frozenset({"user_stop", "agent_stop"})
"""tau2 ``termination_reason`` values that mean the conversation ended by itself."""


class Tau2Importer:
    """Reads tau2-bench results files (see the module docstring for the mapping)."""

    name = "tau2"

    def matches(self, doc: Document) -> bool:
        """A JSON object with a ``simulations`` list and an ``info`` or ``tasks`` key."""
        data = doc.json
        return (
            isinstance(data, dict)
            and isinstance(data.get("simulations"), list)
            and ("info" in data or "tasks" in data)
        )

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]:
        """Yield one trajectory per readable simulation, one problem per unreadable one.

        Raises:
            ValueError: the file is not a tau2 results object.
        """
        data = doc.json
        if not isinstance(data, dict) or not isinstance(data.get("simulations"), list):
            raise ValueError("not a tau2-bench results object (no 'simulations' list)")
        source = str(doc.path)
        info = data.get("info")
        agent, model, domain = _agent_and_model(info)
        simulations: list[Any] = data["simulations"]
        pairs = Counter(_pair(sim) for sim in simulations if isinstance(sim, dict))
        seen: set[str] = set()
        for index, sim in enumerate(simulations):
            record = f"simulations[{index}]"
            try:
                run = _trajectory(sim, source, agent=agent, model=model, domain=domain, pairs=pairs)
            except Malformed as exc:
                yield ImportProblem(source, record, str(exc))
                continue
            if run.run_id in seen:  # a repeated simulation id as well
                run = replace(run, run_id=f"{run.run_id}/{record}")
            seen.add(run.run_id)
            yield run


def _agent_and_model(info: Any) -> tuple[str, str | None, str | None]:
    if not isinstance(info, dict):
        info = {}
    env = info.get("environment_info")
    domain = env.get("domain_name") if isinstance(env, dict) else None
    agent_info = info.get("agent_info")
    model: str | None = None
    solo = False
    if isinstance(agent_info, dict):
        llm = agent_info.get("llm")
        model = llm if isinstance(llm, str) and llm else None
        impl = agent_info.get("implementation")
        solo = isinstance(impl, str) and impl.endswith("_solo")
    domain = domain if isinstance(domain, str) and domain else None
    agent = f"tau2-{domain}" if domain else "tau2"
    return (agent + "-solo" if solo else agent), model, domain


def _pair(sim: Mapping[str, Any]) -> tuple[str, str]:
    return str(sim.get("task_id")), str(sim.get("trial"))


def _trajectory(
    sim: Any,
    source: str,
    *,
    agent: str,
    model: str | None,
    domain: str | None,
    pairs: Counter[tuple[str, str]],
) -> Trajectory:
    if not isinstance(sim, dict):
        raise Malformed(f"a simulation must be an object, got {type(sim).__name__}")
    messages = sim.get("messages")
    if not isinstance(messages, list):
        raise Malformed("'messages' is missing or not a list")
    task_id, trial = _pair(sim)
    run_id = f"task={task_id}/trial={trial}"
    if pairs[(task_id, trial)] > 1:
        run_id += f"/sim={sim.get('id')}"

    stop = sim.get("termination_reason")
    stop = stop if isinstance(stop, str) and stop else None
    reward = _reward(sim.get("reward_info"))

    steps = _steps(messages, ended_normally=stop in NORMAL_STOPS)
    metadata: dict[str, Any] = {"task_id": task_id, "trial": sim.get("trial")}
    for key in ("id", "duration", "agent_cost", "user_cost"):
        if sim.get(key) is not None:
            metadata["simulation_id" if key == "id" else key] = sim[key]
    if domain:
        metadata["domain"] = domain
    return Trajectory(
        source=source,
        run_id=run_id,
        format=IMPORTER.name,
        steps=tuple(steps),
        recorded_outcome=reward_outcome(reward, metadata),
        recorded_stop=stop,
        recorded_stop_kind="explicit" if stop else "inferred",
        agent=agent,
        model=model,
        metadata=metadata,
    )


def _reward(reward_info: Any) -> float | None:
    if not isinstance(reward_info, dict):
        return None
    reward = reward_info.get("reward")
    check_fits(reward, "reward_info.reward", error=Malformed)
    return finite_float(reward)


def _steps(messages: list[Any], *, ended_normally: bool) -> list[Step]:
    """The simulation's turns, each tool call paired with the result that follows it.

    Results are paired by :class:`~loopwatch.replay.importers._calls.OpenCalls`: tau2
    may reuse a tool-call id within a simulation (and within one turn's parallel calls),
    and a result answers the first call with its id that has no result yet of the
    latest turn that has one.
    """
    last_agent = -1
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Malformed(f"messages[{index}] is not an object")
        if message.get("role") == "assistant":
            last_agent = index
    drafts: list[tuple[int, dict[str, Any], float | None, list[dict[str, Any]]]] = []
    open_calls: OpenCalls[dict[str, Any]] = OpenCalls()
    for index, message in enumerate(messages):
        role = message.get("role")
        where = f"messages[{index}]"
        if role == "tool":
            call_id = message.get("id")
            if not isinstance(call_id, str) or not call_id:
                raise Malformed(f"{where}: tool result has no 'id'")
            call = open_calls.answer(call_id)
            if call is None:
                raise Malformed(
                    f"{where}: tool result id {call_id!r} matches no earlier call awaiting a result"
                )
            call["observation"] = text_of(message.get("content"))
            call["error"] = message.get("error") is True
            call["ended_at"] = iso_seconds(message.get("timestamp"))
            continue
        if role == "system":
            continue
        if role not in ("assistant", "user"):
            raise Malformed(f"{where}: unknown role {role!r}")
        timestamp = iso_seconds(message.get("timestamp"))
        calls = _tool_calls(message.get("tool_calls"), where, timestamp)
        open_calls.begin_turn()
        for call in calls:
            open_calls.add(call["call_id"], call)
        drafts.append((index, message, timestamp, calls))
    steps: list[Step] = []
    decision: DecisionKindName
    actor: Actor
    for index, message, timestamp, calls in drafts:
        where = f"messages[{index}]"
        if message.get("role") == "assistant":
            if calls:
                decision = "tool"
            elif index == last_agent and ended_normally:
                decision = "final"
            else:
                decision = "message"
            actor = AGENT
        else:
            decision, actor = "message", USER
        input_tokens, output_tokens = _usage(message.get("usage"), where)
        check_fits(message.get("cost"), f"{where}.cost", error=Malformed)
        steps.append(
            Step(
                index=len(steps),
                actor=actor,
                decision=decision,
                text=text_of(message.get("content")),
                tool_calls=tuple(ToolCall(**call) for call in calls),
                timestamp=timestamp,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cost_usd=finite_float(message.get("cost")),
            )
        )
    return steps


def _tool_calls(raw: Any, where: str, timestamp: float | None) -> list[dict[str, Any]]:
    """The message's tool calls as :class:`ToolCall` keyword arguments, results unset."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Malformed(f"{where}: 'tool_calls' is not a list")
    calls: list[dict[str, Any]] = []
    for position, call in enumerate(raw):
        if not isinstance(call, dict):
            raise Malformed(f"{where}: tool_calls[{position}] is not an object")
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise Malformed(f"{where}: tool_calls[{position}] has no name")
        call_id = call.get("id")
        calls.append(
            {
                "name": name,
                "arguments": recorded_arguments(call.get("arguments")),
                "call_id": call_id if isinstance(call_id, str) and call_id else None,
                "started_at": timestamp,
            }
        )
    return calls


def _usage(usage: Any, where: str) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    for key in ("prompt_tokens", "completion_tokens"):
        check_fits(usage.get(key), f"{where}.usage.{key}", error=Malformed)
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


IMPORTER: Final = Tau2Importer()
