"""CrewAI adapter (route B): the loopwatch guard inside one ``kickoff`` of a crew or agent.

Setup, one call::

    from loopwatch.instrumentation.integrations.crewai import guard

    guarded = guard(crew, "investigate-readonly")   # a Crew, or an Agent
    output = guarded.kickoff(inputs={"topic": "..."})  # crewai's own result ...
    guarded.outcome                                  # ... plus the loopwatch Outcome

One kickoff is one loopwatch run, named after the agent's ``role`` (a crew with several
agents: the crew's ``name``, else its first agent's role; ``agent_name=`` overrides both),
never after the task text. What it uses of CrewAI 1.15:

- **model turns**: each LLM the crew's agents hold (``llm``, ``function_calling_llm``) has
  its ``call``/``acall`` wrapped on the instance for the kickoff only (restored after). The
  wrapper checks the turn before the request (a refused turn never reaches the model) and
  records it after with the tokens the LLM reported (``get_token_usage_summary``, taken
  before and after) and the cost from genai-prices. CrewAI's ``before/after_llm_call``
  hooks are not used for this: the executor skips the after hook for native tool-call
  responses, so a turn would go unrecorded.
- **tool calls**: ``before_tool_call``/``after_tool_call`` hooks, registered for this
  kickoff only (``crewai.hooks.dispatch.scoped_hooks``), so every CrewAI tool object
  (``BaseTool``, ``@tool``, MCP tools), sync and async, native and ReAct, is guarded. A
  refused call is blocked (the hook returns False: the tool body never runs).
- **nudges** (the policy's ``loop_response`` ladder): a before hook cannot supply a result,
  so a nudged call is blocked (its body never runs) and loopwatch's after hook, which
  CrewAI runs for a blocked call too, returns the nudge: a string an after hook returns
  replaces the result, so the model reads the nudge as the tool's result (native: the
  ``tool`` message; ReAct: the ``Observation``) instead of CrewAI's "Tool execution
  blocked by hook" text.
- **stops**: the next model turn after a stop raises :class:`LoopwatchStopped`, a
  ``crewai.hooks.HookAborted``: CrewAI's own deny, which it passes through without its
  ``max_retry_limit`` retries, so ``kickoff`` raises it to the caller (``.outcome`` holds
  the loopwatch Outcome). Nothing runs in a task nobody awaits, so nothing can hang.
- **CrewAI's own limits**: its repeated-call stop (``ToolExecutionFailedError`` with reason
  ``repeated_call``, after ``MAX_REPEATED_TOOL_CALLS`` identical calls) ends the run as
  ``repeated_action``; ``max_iter`` (CrewAI then forces one more turn for a final answer)
  ends it as ``budget_exhausted`` (dimension ``model_turns``), and the forced turn is
  refused. Both with evidence ``framework=crewai``. CrewAI's ReAct path refuses an
  identical repeat of the previous call itself ("I tried reusing the same input"); the
  guard records that refusal as the same observation again, so loopwatch's own repeat
  count goes on as if the tool had answered the same.

Tool names are the ones CrewAI gives the model (``sanitize_tool_name``: "Create Ticket"
becomes ``create_ticket``); name tools that way in a policy file. Tool risk: CrewAI 1.15
tools carry no read/write flag or MCP annotations; pass ``tool_risks={"Create Ticket":
"write"}`` (names are sanitized the same way; the policy file wins).

Honest limits:

- an LLM instance shared with code outside the kickoff is counted while the kickoff runs;
  a ``manager_llm`` (hierarchical crews) given as a model name, not an LLM object, is
  built by CrewAI during the kickoff and its turns are not counted (its agent's tool
  calls are guarded);
- an agent's ``Final Answer`` is recorded as a ``message`` turn, because CrewAI may still
  call the model after it (guardrails, output conversion, the next task): the run
  completes when ``kickoff`` returns, with the crew's ``raw`` output as the answer;
- CrewAI's ReAct path retries a tool that raised inside one call (the hooks see one call,
  recorded as the tool's error); its native path does not;
- CrewAI logs the stop once at ERROR ("Error executing listener ...: loopwatch stopped
  the run") on its way out: that is CrewAI's flow runtime, not a second failure.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import RunStateError, StopRun
from ..failures import FailureClass, ToolFailure, ToolNudged
from ..outcomes import Decision, Dimension, Outcome, StopReason
from ..policy import Policy, Risk
from ..runs import Run, resolve_policy
from ._common import import_framework, price_of, turn_decision

import_framework("crewai", "crewai")

from crewai.agents.parser import AgentAction, AgentFinish, OutputParserError, parse  # noqa: E402
from crewai.hooks.dispatch import (  # noqa: E402
    HookAborted,
    InterceptionPoint,
    register_scoped,
    scoped_hooks,
)
from crewai.tools.tool_failure import (  # noqa: E402
    ToolExecutionFailedError,
    ToolFailureReason,
)
from crewai.tools.tool_failure import ToolFailure as CrewToolFailure  # noqa: E402
from crewai.utilities.agent_utils import (  # noqa: E402
    MAX_REPEATED_TOOL_CALLS,
    extract_tool_call_info,
)
from crewai.utilities.i18n import I18N_DEFAULT  # noqa: E402
from crewai.utilities.string_utils import sanitize_tool_name  # noqa: E402

__all__ = ["FRAMEWORK", "GuardedKickoff", "LoopwatchStopped", "guard"]

FRAMEWORK = "crewai"
Mode = Literal["enforce", "observe"]

# CrewAI's ReAct tool path answers an identical repeat of the previous call with this
# text instead of running the tool; its max_iter path appends the other as a user turn
# before one last forced model call. Both come from CrewAI's own translations.
_REPEAT_REFUSAL = I18N_DEFAULT.errors("task_repeated_usage").split("{", 1)[0].strip()
_FORCE_FINAL = I18N_DEFAULT.errors("force_final_answer")
# What CrewAI hands on as the tool's result when the tool raised: its native path's
# format string, and its ReAct path's translated message.
_RAISED = (
    "Error executing tool: ",
    I18N_DEFAULT.errors("tool_usage_exception").split("{", 1)[0].strip(),
)
_FAILURE_CLASSES = {
    ToolFailureReason.UNKNOWN_TOOL: FailureClass.UNKNOWN_TOOL,
    ToolFailureReason.INVALID_INPUT: FailureClass.INVALID_ARGUMENTS,
}

# The tool call between its before and after hook: both hooks run in the same context
# (one thread, or one asyncio task, per call, also for CrewAI's parallel native calls).
# The nudge answering the call the before hook just blocked, for its after hook to return.
_pending_nudge: contextvars.ContextVar[tuple[Run, str] | None] = contextvars.ContextVar(
    "loopwatch_crewai_nudge", default=None
)
_open_tool: contextvars.ContextVar[_OpenTool | None] = contextvars.ContextVar(
    "loopwatch_crewai_tool", default=None
)


class LoopwatchStopped(HookAborted):  # type: ignore[misc]  # Any where crewai is absent
    """Raised into CrewAI when the guard stopped the run: a ``HookAborted``, so CrewAI
    ends the kickoff without retrying and ``kickoff`` raises it to the caller.

    Attributes:
        outcome: the loopwatch :class:`Outcome` (why and where the run stopped).
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(
            reason=f"loopwatch stopped the run: {outcome.stop.reason.value}",
            source="loopwatch",
        )
        self.outcome = outcome


@dataclass
class _OpenTool:
    run: Run
    key: str
    scope: Any  # ToolCallScope, entered


def _action_key(name: str, args: Mapping[str, Any]) -> str:
    return json.dumps([name, args], sort_keys=True, default=str)


def _arguments(raw: Any) -> dict[str, Any]:
    """Tool arguments as the model sent them: a JSON object string, a mapping, or text."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {"input": raw}
        return dict(value) if isinstance(value, dict) else {"input": value}
    return {} if raw is None else {"input": raw}


def _tokens(llm: Any) -> tuple[int, int]:
    """The LLM instance's cumulative (prompt, completion) tokens; (0, 0) when unknown."""
    try:
        usage = llm.get_token_usage_summary()
        return int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)
    except Exception:  # an LLM without usage tracking: the turn counts, tokens unknown
        return 0, 0


def _failure_of(raw: Any) -> ToolFailure | None:
    """The tool's failure when CrewAI's result says the call failed: a ``ToolFailure``
    the tool returned (its ``retryable`` flag and reason decide the class), or the text
    CrewAI puts in place of an exception the tool raised."""
    if isinstance(raw, CrewToolFailure):
        failure_class = _FAILURE_CLASSES.get(raw.reason, FailureClass.PERMANENT)
        if raw.retryable:
            failure_class = FailureClass.TRANSIENT
        return ToolFailure(raw.as_agent_message()[:200], failure_class)
    if isinstance(raw, str) and raw.strip().startswith(_RAISED):
        return ToolFailure(raw.strip()[:200], FailureClass.PERMANENT)
    return None


def _is_forced_final(messages: Any) -> bool:
    """True for CrewAI's ``max_iter`` turn (its forced-final-answer prompt comes last)."""
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    return isinstance(last, Mapping) and last.get("content") == _FORCE_FINAL


def _decision(response: Any, llm: Any, before: tuple[int, int]) -> Decision:
    """One model turn as a loopwatch decision: native tool calls, a ReAct ``Action``, or
    text (a ``Final Answer`` too: see the module docstring)."""
    after = _tokens(llm)
    input_tokens = max(after[0] - before[0], 0)
    output_tokens = max(after[1] - before[1], 0)
    model = getattr(llm, "model", None)
    provider = getattr(llm, "provider", None)
    price = price_of(
        model if isinstance(model, str) else None,
        input_tokens,
        output_tokens,
        provider=provider if isinstance(provider, str) else None,
    )
    calls: list[tuple[str, Any, str | None]] = []
    text: str | None = None
    if isinstance(response, list):
        for item in response:
            info = extract_tool_call_info(item)
            if info is not None:
                calls.append((info[1], _arguments(info[2]), info[0]))
    elif isinstance(response, str):
        try:
            parsed: AgentAction | AgentFinish = parse(response)
        except OutputParserError:
            text = response
        else:
            if isinstance(parsed, AgentAction):
                calls.append((parsed.tool, _arguments(parsed.tool_input), None))
            else:
                text = str(parsed.output)
    elif response is not None:
        dump = getattr(response, "model_dump_json", None)
        text = dump() if callable(dump) else str(response)
    return turn_decision(
        calls,
        text=text,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=price.cost_usd,
        model=model if isinstance(model, str) else None,
        price_source=price.source,
    )


def _agents_of(target: Any) -> list[Any]:
    agents = getattr(target, "agents", None)
    return list(agents) if isinstance(agents, list) else [target]


def _default_name(target: Any) -> str:
    agents = _agents_of(target)
    if len(agents) == 1 and getattr(agents[0], "role", None):
        return str(agents[0].role)
    name = getattr(target, "name", None)
    if isinstance(name, str) and name and name != "crew":
        return name
    for agent in agents:
        if getattr(agent, "role", None):
            return str(agent.role)
    return "crew"


class GuardedKickoff:
    """A crew (or agent) whose kickoffs run under the loopwatch guard.

    Built by :func:`guard`; each :meth:`kickoff` is one loopwatch run. Not for concurrent
    kickoffs of the same object (CrewAI refuses those too).

    Attributes:
        target: the ``Crew`` or ``Agent``.
        agent_name: the run's agent name.
        policy: the resolved policy (tool risks included).
        last_run: the :class:`Run` of the latest kickoff, or None.
    """

    def __init__(
        self,
        target: Any,
        policy: Policy | str | None = None,
        *,
        agent_name: str | None = None,
        mode: Mode = "enforce",
        tool_risks: Mapping[str, Risk] | None = None,
        capture_content: bool | None = None,
        tracer_provider: Any = None,
    ) -> None:
        resolved = resolve_policy(policy)
        self.target = target
        self.agent_name = agent_name or _default_name(target)
        risks = {sanitize_tool_name(n): r for n, r in (tool_risks or {}).items()}
        self.policy = resolved.with_tool_risks(risks) if risks else resolved
        self.mode: Mode = mode
        self.capture_content = capture_content
        self.tracer_provider = tracer_provider
        self.last_run: Run | None = None
        self._real: dict[str, Any] = {}  # action key -> the last result the tool gave

    @property
    def outcome(self) -> Outcome:
        """The loopwatch Outcome of the latest kickoff.

        Raises:
            RunStateError: no kickoff has ended yet.
        """
        if self.last_run is None:
            raise RunStateError("no kickoff has run yet")
        return self.last_run.outcome

    # ------------------------------------------------------------------ kickoff

    def kickoff(self, *args: Any, **kwargs: Any) -> Any:
        """``target.kickoff(*args, **kwargs)`` under the guard.

        Returns:
            CrewAI's own result (``CrewOutput``, or the agent's output).

        Raises:
            LoopwatchStopped: the guard stopped the run (``.outcome`` says why).
            Exception: whatever CrewAI raised (``ToolExecutionFailedError`` for its own
                repeated-call stop, ...); :attr:`outcome` holds the run's Outcome.
        """
        with self._session() as run:
            output = self.target.kickoff(*args, **kwargs)
            run.finish(getattr(output, "raw", output))
        return output

    async def kickoff_async(self, *args: Any, **kwargs: Any) -> Any:
        """Async :meth:`kickoff` (``target.kickoff_async``: CrewAI runs the sync kickoff in
        a worker thread); same results and errors."""
        with self._session() as run:
            output = await self.target.kickoff_async(*args, **kwargs)
            run.finish(getattr(output, "raw", output))
        return output

    async def akickoff(self, *args: Any, **kwargs: Any) -> Any:
        """Native async :meth:`kickoff` (``target.akickoff``); same results and errors."""
        with self._session() as run:
            output = await self.target.akickoff(*args, **kwargs)
            run.finish(getattr(output, "raw", output))
        return output

    @contextlib.contextmanager
    def _session(self) -> Iterator[Run]:
        """One kickoff's run with the hooks and LLM wrappers installed around it."""
        run = self._new_run()
        ended = False
        try:
            with run, _Installed(self, run):
                try:
                    yield run
                except ToolExecutionFailedError as exc:
                    self._framework_failure(run, exc)
                    raise
                ended = True
        except LoopwatchStopped as exc:
            exc.outcome = run.outcome  # the closed run's, elapsed time included
            raise
        if not ended:  # a StopRun the ``with run`` took: the caller still hears of it
            raise LoopwatchStopped(run.outcome)

    def _new_run(self) -> Run:
        self._real.clear()
        run = Run(
            self.agent_name,
            self.policy,
            mode=self.mode,
            capture_content=self.capture_content,
            tracer_provider=self.tracer_provider,
        )
        self.last_run = run
        return run

    def _framework_failure(self, run: Run, exc: ToolExecutionFailedError) -> None:
        """CrewAI's own repeated-call stop is a loop, not an infrastructure error."""
        record = exc.record
        if record.failure.reason is ToolFailureReason.REPEATED_CALL:
            run.framework_stop(
                StopReason.REPEATED_ACTION,
                framework=FRAMEWORK,
                limit_name="MAX_REPEATED_TOOL_CALLS",
                limit=float(MAX_REPEATED_TOOL_CALLS),
                observed=float(MAX_REPEATED_TOOL_CALLS),
                tool=record.tool_name,
            )

    # ---------------------------------------------------------------- installing

    def _llms(self) -> dict[int, tuple[Any, list[Any]]]:
        """Each LLM instance the kickoff's agents hold, with the agents holding it."""
        found: dict[int, tuple[Any, list[Any]]] = {}
        holders = [*_agents_of(self.target), self.target]
        for holder in holders:
            for attr in ("llm", "function_calling_llm", "manager_llm"):
                # Read from the instance's fields: the attribute of a deprecated field
                # (function_calling_llm) warns on every access.
                llm = getattr(holder, "__dict__", {}).get(attr)
                if llm is None or isinstance(llm, str) or not callable(getattr(llm, "call", None)):
                    continue
                entry = found.setdefault(id(llm), (llm, []))
                if holder is not self.target or not hasattr(holder, "agents"):
                    entry[1].append(holder)
        return found

    # --------------------------------------------------------------- model turns

    def _max_iter_reached(self, run: Run, agents: list[Any]) -> None:
        """CrewAI's ``max_iter`` ran out: its forced final turn is where the run ends."""
        limit: float | None = None
        for agent in agents:
            executor = getattr(agent, "agent_executor", None)
            max_iter = getattr(agent, "max_iter", None)
            if isinstance(max_iter, int) and (
                limit is None or getattr(executor, "iterations", -1) >= max_iter
            ):
                limit = float(max_iter)
        run.framework_stop(
            StopReason.BUDGET_EXHAUSTED,
            framework=FRAMEWORK,
            limit_name="max_iter",
            dimension=Dimension.MODEL_TURNS,
            limit=limit,
            observed=limit,
        )

    def _guarded_call(
        self, run: Run, llm: Any, agents: list[Any], call: Callable[..., Any]
    ) -> Callable[..., Any]:
        def guarded(messages: Any, *args: Any, **kwargs: Any) -> Any:
            self._before_turn(run, agents, messages)
            if run.stopped:  # observe mode after a framework stop: not ours to count
                return call(messages, *args, **kwargs)
            before = _tokens(llm)
            try:
                with run.model_call() as turn:
                    response = call(messages, *args, **kwargs)
                    turn.record(_decision(response, llm, before))
            except StopRun:
                raise LoopwatchStopped(run.guard.outcome()) from None
            return response

        return guarded

    def _guarded_acall(
        self, run: Run, llm: Any, agents: list[Any], acall: Callable[..., Any]
    ) -> Callable[..., Any]:
        async def guarded(messages: Any, *args: Any, **kwargs: Any) -> Any:
            self._before_turn(run, agents, messages)
            if run.stopped:
                return await acall(messages, *args, **kwargs)
            before = _tokens(llm)
            try:
                with run.model_call() as turn:
                    response = await acall(messages, *args, **kwargs)
                    turn.record(_decision(response, llm, before))
            except StopRun:
                raise LoopwatchStopped(run.guard.outcome()) from None
            return response

        return guarded

    def _before_turn(self, run: Run, agents: list[Any], messages: Any) -> None:
        """Refuse a turn of a stopped run (the stop a tool hook could only block), and
        map CrewAI's forced ``max_iter`` turn onto ``budget_exhausted``."""
        if not run.stopped and _is_forced_final(messages):
            self._max_iter_reached(run, agents)
        if run.stopped and run.mode == "enforce":
            raise LoopwatchStopped(run.guard.outcome())

    # ---------------------------------------------------------------- tool hooks

    def _before_tool(self, run: Run, ctx: Any) -> bool | None:
        """CrewAI ``before_tool_call`` hook: check the call; False blocks it."""
        _close_leftover(run)
        name = str(ctx.tool_name)
        args = dict(ctx.tool_input or {})
        scope = run.tool_call(name, args)
        try:
            scope.__enter__()
        except ToolNudged as nudged:
            # Blocked, so the tool never runs; the after hook (CrewAI runs it for a
            # blocked call too) replaces CrewAI's generic blocked message with the nudge.
            _pending_nudge.set((run, str(nudged.text)))
            return False
        except StopRun:
            return False  # blocked: the tool never runs; the next model turn ends the run
        except ToolFailure:
            return False  # not dispatched for now (every success slot is held in flight)
        _open_tool.set(_OpenTool(run, _action_key(name, args), scope))
        return None

    def _after_tool(self, run: Run, ctx: Any) -> str | None:
        """CrewAI ``after_tool_call`` hook: record what the call returned; a nudged call's
        result becomes the nudge (a returned string replaces CrewAI's result)."""
        nudge = _pending_nudge.get()
        if nudge is not None and nudge[0] is run:
            _pending_nudge.set(None)
            return nudge[1]
        open_ = _open_tool.get()
        if open_ is None or open_.run is not run:
            return None  # blocked by us, or not a call we opened
        _open_tool.set(None)
        raw = ctx.raw_tool_result if ctx.raw_tool_result is not None else ctx.tool_result
        if isinstance(raw, str) and raw.strip().startswith(_REPEAT_REFUSAL):
            # CrewAI refused an identical repeat without running the tool: nothing new
            # was observed, so it counts as the same answer again.
            raw = self._real.get(open_.key, raw)
        else:
            self._real[open_.key] = raw
        failure = _failure_of(raw)
        try:
            if failure is not None:
                open_.scope.__exit__(ToolFailure, failure, None)
            else:
                open_.scope.set_result(raw)
                open_.scope.__exit__(None, None, None)
        except StopRun:
            pass  # a cycle completed: the next model turn raises LoopwatchStopped
        return None


def _close_leftover(run: Run) -> None:
    """End a call of this context whose after hook never ran (CrewAI raised between the
    hooks), before the context's next call."""
    open_ = _open_tool.get()
    if open_ is not None:
        _open_tool.set(None)
        error = RuntimeError("the tool call ended without a result")
        with contextlib.suppress(StopRun):
            open_.scope.__exit__(RuntimeError, error, None)


_WRAPPED = ("call", "acall")


class _Installed:
    """The kickoff's hooks and LLM wrappers, removed on exit whatever happened."""

    def __init__(self, owner: GuardedKickoff, run: Run) -> None:
        self._owner = owner
        self._run = run
        self._scope: Any = None
        self._saved: list[tuple[Any, dict[str, Any]]] = []

    def __enter__(self) -> _Installed:
        owner, run = self._owner, self._run
        self._scope = scoped_hooks()
        self._scope.__enter__()
        register_scoped(InterceptionPoint.PRE_TOOL_CALL, lambda c: owner._before_tool(run, c))
        register_scoped(InterceptionPoint.POST_TOOL_CALL, lambda c: owner._after_tool(run, c))
        for llm, agents in owner._llms().values():
            # The instance attribute shadows the class method for this kickoff only;
            # BaseLLM keeps non-field attributes on the instance (its __setattr__ falls
            # back to object.__setattr__). What was there before is put back on exit.
            self._saved.append((llm, {a: llm.__dict__[a] for a in _WRAPPED if a in llm.__dict__}))
            object.__setattr__(llm, "call", owner._guarded_call(run, llm, agents, llm.call))
            if callable(getattr(llm, "acall", None)):
                object.__setattr__(llm, "acall", owner._guarded_acall(run, llm, agents, llm.acall))
        return self

    def __exit__(self, *exc: Any) -> None:
        for llm, saved in reversed(self._saved):
            for attr in _WRAPPED:
                if attr in saved:
                    object.__setattr__(llm, attr, saved[attr])
                elif attr in llm.__dict__:
                    object.__delattr__(llm, attr)
        self._saved.clear()
        if self._scope is not None:
            self._scope.__exit__(*exc)
            self._scope = None


def guard(
    target: Any,
    policy: Policy | str | None = None,
    *,
    agent_name: str | None = None,
    mode: Mode = "enforce",
    tool_risks: Mapping[str, Risk] | None = None,
    capture_content: bool | None = None,
    tracer_provider: Any = None,
) -> GuardedKickoff:
    """Put a CrewAI ``Crew`` or ``Agent`` under the loopwatch guard.

    Args:
        target: the crew or agent; its ``kickoff``/``kickoff_async`` become guarded runs.
        policy: a :class:`Policy`, a built-in profile name, or ``FILE[:PROFILE]``.
        agent_name: the run's agent name (default: see the module docstring).
        mode: ``enforce`` (stop the crew) or ``observe`` (record only).
        tool_risks: ``{tool name: "read" | "write"}`` (CrewAI tools declare none).
        capture_content: record tool arguments and results on spans (opt-in).
        tracer_provider: where loopwatch's spans go (the global provider when None).

    Returns:
        A :class:`GuardedKickoff`; call its ``kickoff`` instead of the target's.

    Raises:
        PolicyError: an invalid policy.

    Example::

        guarded = guard(crew, "investigate-readonly")
        try:
            output = guarded.kickoff(inputs={"topic": "refunds"})
        except LoopwatchStopped as stop:
            print(stop.outcome.stop.reason)
    """
    return GuardedKickoff(
        target,
        policy,
        agent_name=agent_name,
        mode=mode,
        tool_risks=tool_risks,
        capture_content=capture_content,
        tracer_provider=tracer_provider,
    )
