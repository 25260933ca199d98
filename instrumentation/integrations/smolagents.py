"""smolagents adapter (route B): one call puts an agent's runs, model turns and tool
calls under the loopwatch guard.

Setup, one line::

    from loopwatch.instrumentation.integrations.smolagents import instrument

    guard = instrument(agent, policy="investigate-readonly")
    answer = agent.run("Where is order 7?")
    guard.outcome  # why the run ended (an Outcome), also after a stop

What ``instrument`` hooks on the agent's own objects (nothing global; idempotent):

- ``agent.run``: each run is one loopwatch run named ``agent.name`` (the agent's class
  name when it has none); an agent run inside another loopwatch run (a managed agent
  called by its manager) is a child run drawing from its parent's budget;
- the model's ``generate`` (and ``generate_stream``): checked before the request (a
  refused turn never reaches the model, planning and the max-steps final answer
  included), recorded after it with the ``ChatMessage``'s ``token_usage`` and the cost
  from genai-prices for ``model.model_id``. A ToolCallingAgent turn is a ``tool``
  decision (its final answer too: smolagents' ``final_answer`` is a tool call); a
  CodeAgent turn is a ``message`` whose text is the code, so the same code written again
  and again is a ``repeated_decision``;
- every ``smolagents.Tool`` in ``agent.tools`` (its ``forward``; ``final_answer`` is the
  answer, not an action): checked before the body runs, whoever calls it (the
  ToolCallingAgent's dispatch, or a CodeAgent's code in its executor thread);
- a step callback (``step_callbacks``, smolagents' own hook) that maps the
  ``AgentMaxStepsError`` step to ``budget_exhausted`` with dimension ``model_turns``
  (``max_steps`` caps the agent's action steps, one model turn each), limit and observed
  the max steps. smolagents then returns its forced final answer as usual.

A call the policy's ladder nudges (``loop_response``) is not run: the guarded ``forward``
returns the nudge (a :class:`~loopwatch.instrumentation.NudgeText`) as the tool's output,
which a ToolCallingAgent gives the model as the call's observation (a CodeAgent's code
gets it as the function's return value).

A stop raises loopwatch's :class:`~loopwatch.instrumentation.StopRun` out of
``agent.run`` (its ``stop`` says why). It is a ``BaseException``: smolagents' ``except
Exception`` around tool calls and model calls would otherwise turn it into one more error
the model reads. The agent's ``interrupt()`` is set as well, so no further step starts.
A tool body runs in loopwatch's tool worker thread, bounded by the policy's per-call
timeout (``tool_timeout_seconds``, or the tool's ``timeout_seconds``): past it, the call
fails with ``TimeoutError`` (smolagents shows the model the error; its run goes on), and
the body's thread, which Python cannot kill, finishes in the background, its result
discarded. Honest limits: one agent object runs one task at a time (smolagents keeps one
memory per agent, and a stop interrupts the agent, so a second concurrent ``run`` of the
same agent is interrupted too). A tool function also decorated
with loopwatch's ``@tool`` would be guarded twice: drop the decorator. smolagents has no
async run. A call to a tool the agent does not have never reaches a tool (smolagents
answers it with an error), so only its model turn is guarded: ``max_steps`` or
``max_model_turns`` ends such a loop, as ``budget_exhausted``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import StopRun
from ..outcomes import Decision, Dimension, Outcome, StopReason
from ..policy import Policy
from ..runs import Mode, Run, current_run, resolve_policy
from ._common import import_framework, price_of, turn_decision

__all__ = ["SmolagentsGuard", "instrument"]

_smolagents: Any = import_framework("smolagents", "smolagents")
_FRAMEWORK = "smolagents"
_FINAL_ANSWER = "final_answer"
_WRAPPED = "__loopwatch_wrapped__"  # marks a method this module already wrapped
_GUARD = "_loopwatch_guard"  # the agent's SmolagentsGuard, so instrument() hooks it once


def _arguments(raw: Any) -> Any:
    """A tool call's arguments as the model sent them (JSON text is parsed)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw if raw is not None else {}


def _text(content: Any) -> str | None:
    """A message's text (smolagents content is a string or a list of parts)."""
    if isinstance(content, str):
        return content or None
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(parts) or None
    return None


class SmolagentsGuard:
    """The loopwatch side of one instrumented smolagents agent (see :func:`instrument`).

    Attributes:
        agent: the smolagents agent.
        policy: the resolved policy every run of the agent uses.
        run: the loopwatch run in progress, or None between runs.
        outcome: the :class:`Outcome` of the agent's last run, or None before one ended.
    """

    def __init__(
        self,
        agent: Any,
        policy: Policy,
        *,
        mode: Mode,
        capture_content: bool | None,
        tracer_provider: Any,
    ) -> None:
        self.agent = agent
        self.policy = policy
        self.mode: Mode = mode
        self.run: Run | None = None
        self.outcome: Outcome | None = None
        self._capture = capture_content
        self._provider = tracer_provider

    @property
    def name(self) -> str:
        """The agent's name: ``agent.name``, else its class name (never a method name)."""
        return str(getattr(self.agent, "name", None) or type(self.agent).__name__)

    def _active(self) -> Run | None:
        # A CodeAgent runs tools in an executor thread that does not copy the context, so
        # the run of this agent is found on the guard when the context has none.
        return current_run() or self.run

    @contextlib.contextmanager
    def _interrupting(self) -> Iterator[None]:
        """On a stop, also set smolagents' own interrupt: no further step starts even
        where something catches the StopRun (a ``BaseException`` handler)."""
        try:
            yield
        except StopRun:
            self.agent.interrupt()
            raise

    # -------------------------------------------------------------------- runs

    def _open(self) -> Run:
        parent = current_run()
        if parent is not None and not parent.stopped:
            run = parent.child(self.name, self.policy, capture_content=self._capture)
        else:
            run = Run(
                self.name,
                self.policy,
                mode=self.mode,
                capture_content=self._capture,
                tracer_provider=self._provider,
            )
        self.run = run.start()
        return run

    def _close(self, run: Run, result: Any, error: BaseException | None) -> None:
        self.run = None
        if error is None:
            self.outcome = run.finish(result)
        elif isinstance(error, GeneratorExit) or (isinstance(error, StopRun) and not run.stopped):
            # A streamed run the caller stopped reading, or a managed agent's stop that
            # came up through this agent's run: either ended it.
            self.outcome = run.cancel()
        else:
            run.__exit__(type(error), error, error.__traceback__)
            self.outcome = run.outcome

    def wrap_run(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``agent.run`` under one loopwatch run (streamed runs too)."""

        @functools.wraps(original)
        def run(task: str, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("stream") or (args and args[0] is True):
                return self._streamed(original, task, *args, **kwargs)
            loop = self._open()
            try:
                result = original(task, *args, **kwargs)
            except BaseException as exc:
                self._close(loop, None, exc)
                raise
            self._close(loop, getattr(result, "output", result), None)
            return result

        setattr(run, _WRAPPED, True)
        return run

    def _streamed(
        self, original: Callable[..., Any], task: str, *args: Any, **kwargs: Any
    ) -> Iterator[Any]:
        loop = self._open()
        last: Any = None
        try:
            for step in original(task, *args, **kwargs):
                last = step
                yield step
        except BaseException as exc:
            self._close(loop, None, exc)
            raise
        self._close(loop, getattr(last, "output", None), None)

    # ------------------------------------------------------------------ models

    def _decision(self, message: Any, model: Any) -> Decision:
        usage = getattr(message, "token_usage", None)
        input_tokens = int(getattr(usage, "input_tokens", 0) or 0)
        output_tokens = int(getattr(usage, "output_tokens", 0) or 0)
        model_id = getattr(model, "model_id", None)
        price = price_of(model_id, input_tokens, output_tokens)
        calls = [
            (str(c.function.name), _arguments(c.function.arguments), c.id)
            for c in (getattr(message, "tool_calls", None) or [])
        ]
        return turn_decision(
            calls,
            text=_text(getattr(message, "content", None)),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=price.cost_usd,
            model=model_id,
            price_source=price.source,
        )

    def wrap_generate(self, model: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        """``model.generate`` checked before the request and recorded after it."""

        @functools.wraps(original)
        def generate(*args: Any, **kwargs: Any) -> Any:
            run = self._active()
            if run is None:
                return original(*args, **kwargs)
            with self._interrupting(), run.model_call() as call:
                message = original(*args, **kwargs)
                call.record(self._decision(message, model))
            return message

        setattr(generate, _WRAPPED, True)
        return generate

    def wrap_generate_stream(self, model: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        """``model.generate_stream``: checked before the first delta, recorded after the
        last one from the deltas put together (smolagents' ``agglomerate_stream_deltas``)."""
        agglomerate = _smolagents.models.agglomerate_stream_deltas

        @functools.wraps(original)
        def generate_stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
            run = self._active()
            if run is None:
                yield from original(*args, **kwargs)
                return
            with self._interrupting(), run.model_call() as call:
                deltas = []
                for delta in original(*args, **kwargs):
                    deltas.append(delta)
                    yield delta
                call.record(self._decision(agglomerate(deltas), model))

        setattr(generate_stream, _WRAPPED, True)
        return generate_stream

    # ------------------------------------------------------------------- tools

    def wrap_forward(self, tool: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        """``tool.forward`` checked before the body runs and recorded after it."""
        name = str(tool.name)
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            run = self._active()
            if run is None:
                return original(*args, **kwargs)
            arguments: dict[str, Any] = dict(kwargs)
            if args:
                try:
                    assert signature is not None
                    arguments = dict(signature.bind_partial(*args, **kwargs).arguments)
                except (AssertionError, TypeError):
                    arguments = {"args": list(args), **kwargs}
            with self._interrupting():
                # call_tool runs the body in loopwatch's tool worker under the policy's
                # per-call timeout: a hanging tool becomes the tool's TimeoutError (which
                # smolagents hands to the model as a failed call) instead of hanging the
                # run. Its thread cannot be killed: a late result is discarded.
                return run.call_tool(name, arguments, fn=lambda **_: original(*args, **kwargs))

        setattr(forward, _WRAPPED, True)
        return forward

    # ------------------------------------------------------------------- steps

    def on_step(self, memory_step: Any, agent: Any = None) -> None:
        """smolagents' step callback: its max-steps step ends the run as
        ``budget_exhausted`` (the framework's own limit)."""
        error = getattr(memory_step, "error", None)
        run = self.run
        if run is None or not isinstance(error, _smolagents.utils.AgentMaxStepsError):
            return
        # The max-steps step is numbered one past the last action step allowed.
        limit = float(max(int(getattr(memory_step, "step_number", 1)) - 1, 0))
        run.framework_stop(
            StopReason.BUDGET_EXHAUSTED,
            framework=_FRAMEWORK,
            limit_name="max_steps",
            dimension=Dimension.MODEL_TURNS,
            limit=limit,
            observed=limit,
        )


def _wrap(
    obj: Any, method: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    """Replace ``obj.method`` on the instance with ``wrapper(original)``, once."""
    original = getattr(obj, method, None)
    if original is None or getattr(original, _WRAPPED, False):
        return
    setattr(obj, method, wrapper(original))


def instrument(
    agent: Any,
    policy: Policy | str | None = None,
    *,
    mode: Mode = "enforce",
    capture_content: bool | None = None,
    tracer_provider: Any = None,
) -> SmolagentsGuard:
    """Guard a smolagents agent (``ToolCallingAgent``, ``CodeAgent``, any
    ``MultiStepAgent``): its runs, its model's turns and its tools.

    Hooks the agent's own objects, not the classes: other agents are untouched. Called
    again on the same agent, it returns the first guard (and its policy) and hooks
    nothing twice. Instrument a managed agent
    too for its runs to be child runs of its manager's.

    Args:
        agent: the smolagents agent.
        policy: a :class:`Policy`, a built-in profile name, or ``FILE[:PROFILE]``.
        mode: ``enforce`` (refuse and stop) or ``observe`` (record only).
        capture_content / tracer_provider: as for :class:`~loopwatch.instrumentation.Run`.

    Returns:
        The :class:`SmolagentsGuard`; its ``outcome`` says how the last run ended.

    Raises:
        PolicyError: an invalid policy (before any run).
        TypeError: ``agent`` is not a smolagents agent.
    """
    if not isinstance(agent, _smolagents.agents.MultiStepAgent):
        raise TypeError(f"not a smolagents agent: {type(agent).__name__}")
    existing = getattr(agent, _GUARD, None)
    if isinstance(existing, SmolagentsGuard):
        return existing
    guard = SmolagentsGuard(
        agent,
        resolve_policy(policy),
        mode=mode,
        capture_content=capture_content,
        tracer_provider=tracer_provider,
    )
    _wrap(agent, "run", guard.wrap_run)
    model = agent.model
    _wrap(model, "generate", functools.partial(guard.wrap_generate, model))
    _wrap(model, "generate_stream", functools.partial(guard.wrap_generate_stream, model))
    for tool in agent.tools.values():
        if tool.name != _FINAL_ANSWER:
            _wrap(tool, "forward", functools.partial(guard.wrap_forward, tool))
    agent.step_callbacks.register(_smolagents.memory.ActionStep, guard.on_step)
    setattr(agent, _GUARD, guard)
    return guard
