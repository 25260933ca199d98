"""The guard: pure stop logic for one agent run (no OpenTelemetry here).

:class:`Guard` orchestrates: it holds the run's stop and the tree's lock, and asks its
parts in order. Its parts: :mod:`.outcomes` (the typed results), :mod:`.budgets` (usage,
ceilings, parent charging, deadline), :mod:`.detectors` (repeat, cycle, repeated
decision, progress, retries) and :mod:`.state` (snapshot and restore).

The guard is checked *before* each costly call and returns a typed verdict; expected exits
are data (a :class:`Stop` inside an :class:`Outcome`), never exceptions (DESIGN section 3).
A limit of N permits exactly N calls: the budget is checked and reserved before the call
leaves the process. Checks before a tool dispatch, in order: deadline, ceilings (this
run's, then the parent's, then success slots held by calls in flight: refused without a
stop), retries per action, repeated action (identical calls in flight count). After a
tool result: action cycle. After each step, in order: goal check, ceilings (tokens and
cost as observed), then no progress. Progress evidence: the environment's, never the model's.

Thread-safety: every public method takes the guard's lock, so parallel tool calls cannot
both take the last slot. A run tree shares one lock (a child uses its root's), so a
child's check and its charge to every ancestor are one atomic step. A dispatched call
holds a tool-success slot (here and in every ancestor) until its result or error is
recorded, so calls in flight together cannot all succeed past ``max_tool_successes``: a
call that finds every slot left held is refused without ending the run.

Modes: ``enforce`` ends the run at the first stop; ``observe`` records what it would have
stopped (``Outcome.observed_stops``) and lets the run go on to its natural end. A policy's
loop-response ladder (warn, nudge, stop) answers repeated actions: :mod:`.ladder`.

Example::

    guard = Guard(Policy.build(max_model_turns=3))
    while True:
        verdict = guard.before_model_call()
        if not verdict.allowed:
            break
        decision = model(...)
        if not guard.record_decision(decision).allowed:
            break
        for call in decision.tool_calls:
            ticket = guard.before_tool_call(call.name, call.arguments)
            if not ticket.allowed:
                break
            guard.record_tool_result(ticket, result=tools[call.name](**call.arguments))
    outcome = guard.finish()
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, Literal

from .budgets import Budget
from .detectors import Detectors, ToolSettings
from .errors import RunStateError
from .failures import FailureClass, classify_exception
from .fingerprint import canonical_json, digest, fingerprint_with, observation_digest_with
from .ladder import Ladder
from .outcomes import (
    ALLOWED,
    Decision,
    DecisionType,
    Dimension,
    Evidence,
    Outcome,
    Stop,
    StopReason,
    ToolOutcome,
    ToolRecord,
    ToolTicket,
    Usage,
    Verdict,
    make_stop,
    new_record,
)
from .policy import Policy
from .state import already_used, check, load, snapshot

__all__ = ["Guard"]

Mode = Literal["enforce", "observe"]
_MAX_OBSERVED_STOPS: Final = 32
_ERROR_MESSAGE_CHARS: Final = 200
_OK: Final = ToolOutcome.OK.value
_ERROR: Final = ToolOutcome.ERROR.value
# A final answer, a refusal, a cancellation or a crash ends the run in observe mode too:
# there is no later call to let through.
_TERMINAL_EVEN_IN_OBSERVE: Final = frozenset(
    {
        StopReason.COMPLETED,
        StopReason.FINAL_UNVERIFIED,
        StopReason.REFUSED,
        StopReason.CANCELLED,
        StopReason.ERROR,
    }
)


def _with_would(verdict: Verdict, would: Stop | None) -> Verdict:
    """``verdict`` if it refuses; else allowed, carrying the first stop observe mode saw."""
    if not verdict.allowed:
        return verdict
    would = would or verdict.would_stop
    return ALLOWED if would is None else Verdict(True, would_stop=would)


class Guard:
    """Stop logic of one run. See the module docstring for the rules.

    Args:
        policy: the run's :class:`Policy`.
        clock: monotonic clock in seconds (inject a fake one in tests; a reading that
            goes back or is not finite counts as the last one, see :class:`.Budget`).
        mode: ``enforce`` or ``observe``.
        goal_check: ``answer -> bool``; a final answer that fails it stops as
            ``final_unverified`` (an exception in the check counts as a failure).
        run_id: the run id (a random UUID4 hex when omitted).
        known_tools: the tool names the agent registered; others are unknown tools. When
            None, ``policy.strict_tools`` decides (the tools the policy lists).
        scrub: redaction applied to results before digesting (see
            :func:`~.fingerprint.observation_digest`).
        parent: the parent run's guard (use :meth:`child`).
        result_preview: ``result -> str``, the captured text a nudge may quote (content
            capture on); None: a nudge names the result's digest (:mod:`.ladder`).

    Raises:
        ValueError: an unknown mode.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        clock: Callable[[], float] = time.monotonic,
        mode: Mode = "enforce",
        goal_check: Callable[[Any], bool] | None = None,
        run_id: str | None = None,
        known_tools: Collection[str] | None = None,
        scrub: Callable[[Any], Any] | None = None,
        parent: Guard | None = None,
        result_preview: Callable[[Any], str] | None = None,
    ) -> None:
        if mode not in ("enforce", "observe"):
            raise ValueError(f"mode must be 'enforce' or 'observe', got {mode!r}")
        self.policy = policy
        self.mode: Mode = mode
        self.run_id = run_id or uuid.uuid4().hex
        self.parent = parent
        self._goal_check = goal_check
        self._known_tools = frozenset(known_tools) if known_tools is not None else None
        self._scrub = scrub
        # One lock per run tree: a child's check and its charge to every ancestor happen
        # atomically, so siblings cannot both take the parent's last slot.
        self._lock: threading.RLock = parent._lock if parent is not None else threading.RLock()
        self._budget: Budget = Budget(policy, clock, parent._budget if parent is not None else None)
        self._detectors = Detectors(policy, self._known_tools)
        self._stop: Stop | None = None
        self._observed: list[Stop] = []
        self._answer: Any = None
        self._has_answer = False
        self._partial: str | None = None
        self._call_ids = itertools.count(1)
        self._preview = result_preview
        self._ladder = Ladder.of(policy, mode, result_preview)  # None: default ["stop"]

    # ------------------------------------------------------------------ state

    @property
    def stopped(self) -> bool:
        """True once the run has ended (enforce mode) or reached a natural end."""
        return self._stop is not None

    @property
    def stop_reason(self) -> StopReason | None:
        """The stop reason, once stopped."""
        return self._stop.reason if self._stop is not None else None

    @property
    def step(self) -> int:
        """The current step (1-based; 0 before the first)."""
        return self._budget.step

    @property
    def steps_since_progress(self) -> int:
        """Steps since the last progress evidence (the current step included once ended)."""
        return self._budget.steps_since_progress

    def elapsed(self) -> float:
        """Seconds since the run started on the guard's clock (resume included)."""
        return self._budget.elapsed()

    def remaining_seconds(self) -> float:
        """Seconds left before the deadline (this run's and every ancestor's)."""
        return self._budget.remaining(self._budget.elapsed())

    def usage(self) -> Usage:
        """A snapshot of the counters."""
        with self._lock:
            return self._budget.usage()

    # ------------------------------------------------------------------ stops

    def _close(self, stop: Stop) -> None:
        self._stop = stop = self._ladder.close(stop) if self._ladder else stop
        self._budget.closed_by = stop.reason

    def _decide(self, stop: Stop) -> Verdict:
        """End the run with ``stop`` (enforce) or record it (observe)."""
        if self.mode == "observe" and stop.reason not in _TERMINAL_EVEN_IN_OBSERVE:
            if len(self._observed) < _MAX_OBSERVED_STOPS:
                self._observed.append(stop)
            return Verdict(True, would_stop=stop)
        if self._stop is None:
            self._close(stop)
        return Verdict(False, stop=self._stop)

    def _open_step(self) -> None:
        b = self._budget
        b.step += 1
        b.step_open = True
        b.step_progress = False

    def child(
        self,
        policy: Policy | None = None,
        *,
        run_id: str | None = None,
        mode: Mode | None = None,
        goal_check: Callable[[Any], bool] | None = None,
        known_tools: Collection[str] | None = None,
        _already_used: Mapping[str, float] | None = None,
        _after_stop: bool = False,
    ) -> Guard:
        """A child run's guard that draws from this run's remaining budget.

        Each budget (and the deadline) is capped at what this run has left (source
        ``parent``) and every use is charged here too: 10 children of 10 turns do not make
        100 turns. Raises :class:`RunStateError` when this run has stopped.
        """
        with self._lock:
            if self._stop is not None and not _after_stop:
                raise RunStateError("cannot start a child run: the parent run has stopped")
            base = policy or self.policy
            caps = self._budget.child_caps(base, _already_used or {})
            child = Guard(
                base.with_overrides("parent", **caps) if caps else base,
                clock=self._budget.clock,
                mode=mode or self.mode,
                goal_check=goal_check,
                run_id=run_id,
                known_tools=known_tools if known_tools is not None else self._known_tools,
                scrub=self._scrub,
                parent=self,
                result_preview=self._preview,
            )
            if self._stop is not None:
                # A sub-agent asked for after the stop (``_after_stop``): it is recorded,
                # and ended before it makes any call.
                stop = child._budget.parent_block(child._budget.step, {})
                if stop is not None:
                    child._close(stop)
            return child

    # ----------------------------------------------------------- model calls

    def before_model_call(
        self, *, estimate_tokens: int | None = None, estimate_cost_usd: float | None = None
    ) -> Verdict:
        """Check and reserve one model turn; begins a new step.

        Ends the previous step first (ceilings, then no progress). With an estimate
        (``estimate_tokens``: input + output; ``estimate_cost_usd``: US dollars), the
        token and cost budgets are checked on the projected totals.

        Returns:
            ``Verdict(allowed=True)`` when the call may be made; otherwise the stop.
        """
        with self._lock:
            if self._stop is not None:
                return Verdict(False, stop=self._stop)
            b = self._budget
            # One clock reading per call: ending the previous step and this check see the
            # same time.
            elapsed = b.elapsed()
            observed: Stop | None = None
            if b.step_open:
                ended = self._end_step(elapsed)
                if not ended.allowed:
                    return ended
                observed = ended.would_stop
            stop = b.deadline_stop(b.step, elapsed) or b.model_call_stop(
                b.step, estimate_tokens, estimate_cost_usd
            )
            if stop is not None:
                verdict = self._decide(stop)
                if not verdict.allowed:
                    return verdict
                observed = observed or verdict.would_stop
            b.turns += 1
            if b.parent is not None:
                b.charge_parents(turns=1)
            self._open_step()
            return ALLOWED if observed is None else Verdict(True, would_stop=observed)

    def record_decision(self, decision: Decision) -> Verdict:
        """Record the model's decision for the current step.

        Order: usage is reconciled; a ``final`` decision runs the goal check and ends
        the run (``completed`` or ``final_unverified``); a ``refusal`` ends it
        (``refused``); a non-tool decision feeds the repeated-decision detector; then the
        token and cost ceilings are checked on the observed totals.

        Returns:
            The run's verdict after the decision (a late decision after the stop is not
            recorded and returns the existing stop).
        """
        with self._lock:
            if self._stop is not None:
                return Verdict(False, stop=self._stop)
            b = self._budget
            if b.parent is not None and b.ancestor_closed():
                parent_stop = b.parent_block(b.step, {})
                if parent_stop is not None:
                    verdict = self._decide(parent_stop)
                    if not verdict.allowed:
                        return verdict
            if not b.step_open:
                self._open_step()
            b.charge_decision(decision)
            dtype = decision.type
            if dtype.__class__ is not DecisionType:
                dtype = DecisionType(dtype)
            if dtype is DecisionType.FINAL:
                return self._finalize(decision.answer)
            if dtype is DecisionType.REFUSAL:
                self._partial = decision.text
                return self._decide(make_stop(StopReason.REFUSED, b.step))
            would: Stop | None = None
            if dtype is DecisionType.MESSAGE:
                if decision.text:
                    self._partial = decision.text
                stop = self._detectors.repeated_decision(decision, b.step)
                if stop is not None:
                    verdict = self._decide(stop)
                    if not verdict.allowed:
                        return verdict
                    would = verdict.would_stop
            if b.past_observed_ceiling():
                return self._observed_ceilings(would)
            return ALLOWED if would is None else Verdict(True, would_stop=would)

    def _observed_ceilings(self, would: Stop | None) -> Verdict:
        stop = self._budget.observed_ceiling_stop(self._budget.step)
        if stop is not None:
            return _with_would(self._decide(stop), would)
        return ALLOWED if would is None else Verdict(True, would_stop=would)

    def provided(self, *fields: str) -> None:
        """Note fields the user or environment has provided (shown in re-ask evidence)."""
        with self._lock:
            self._detectors.provided.update(f.strip().casefold() for f in fields)

    def _finalize(self, answer: Any) -> Verdict:
        self._answer = answer
        self._has_answer = True
        ok = True
        detail: dict[str, Any] = {}
        if self._goal_check is not None:
            try:
                ok = bool(self._goal_check(answer))
            except Exception as exc:  # a failing check is a failed check, not a crash
                ok = False
                detail["goal_check_error"] = type(exc).__name__
        step = self._budget.step
        if ok:
            evidence = Evidence(detector="goal_check") if self._goal_check else None
            return self._decide(make_stop(StopReason.COMPLETED, step, evidence=evidence))
        evidence = Evidence(detector="goal_check", detail=detail)
        return self._decide(make_stop(StopReason.FINAL_UNVERIFIED, step, evidence=evidence))

    # ------------------------------------------------------------ tool calls

    def before_tool_call(
        self, tool: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None
    ) -> ToolTicket:
        """Check and reserve one tool dispatch.

        ``call_id``: the model's tool-call id (one is generated when omitted).

        Returns:
            A :class:`ToolTicket`; dispatch only when ``ticket.allowed``, and always record
            an allowed one (:meth:`record_tool_result`): it holds a tool-success slot. A
            refusal that ends the run carries ``ticket.stop``. Refused without a stop, the
            run goes on: ``blocked_by="ceiling"`` (enforce mode: every slot left is held by
            a call in flight; try again once they return), ``"unknown_tool"`` (an error
            the model can see; retrying it as-is ends the run) or ``"nudge"`` (a ladder's
            nudge rung: give the model ``ticket.nudge`` as the call's result).
        """
        args: Mapping[str, Any] = arguments if arguments is not None else {}
        with self._lock:
            b = self._budget
            d = self._detectors
            ts = d.tools.get(tool) or d.tool_settings(tool)
            fp = fingerprint_with(ts.suffix, args, ts.drop)
            # Duplicate intent ignores the key and cosmetic case/space changes: a side
            # effect must not run twice because the model re-typed the recipient.
            intent = ts.loose_key(args) if ts.write else fp
            ticket = ToolTicket(
                False,
                tool,
                call_id or f"call_{next(self._call_ids)}",
                b.step if b.step > 1 else 1,
                ts.risk,
                fp,
                intent,
                d.retry_key(ts, args, intent) if d.last_failure else "",
                False,
                ts.key_value(args) if ts.key_field is not None else None,
                None,
                None,
                0.0,
                None,
                False,
                args,
                self,
            )
            if self._stop is not None:
                ticket.stop = self._stop
                ticket.blocked_by = "run_stopped"
                return ticket
            if not b.step_open and b.step == 0:
                # A tool called before the first model call (retrieval first) is step 1.
                self._open_step()
                ticket.step = 1
            if ts.unknown:
                return self._unknown_tool(ticket, ts)
            elapsed = b.elapsed()
            stop, blocked_by, is_retry = self._pre_dispatch(ticket, ts, elapsed)
            if stop is not None and self._ladder is not None:
                stop = self._ladder.respond(ticket, stop)  # warn or nudge: None
                if stop is None:
                    blocked_by = "nudge" if ticket.nudge is not None else None
            if blocked_by == "nudge":  # not run: the nudge is its result
                ticket.done = True
                ticket.blocked_by = blocked_by
                return ticket
            if stop is not None:
                verdict = self._decide(stop)
                if verdict.allowed:
                    ticket.would_stop = verdict.would_stop
                    blocked_by = None
                else:
                    ticket.stop = verdict.stop
            if blocked_by is not None:
                # Refused without a stop, the run goes on: the slots come back as the
                # calls in flight return (a failure frees its slot; a success uses it,
                # and the next call then meets the ceiling itself).
                b.blocked += 1
                ticket.blocked_by = blocked_by
                ticket.done = True
                return ticket
            ticket.allowed = True
            ticket.is_retry = is_retry
            d.dispatch(ticket, is_retry)  # held in flight: parallel repeats count at once
            ticket.timeout_seconds = b.dispatch(is_retry, ts.timeout, elapsed)
            return ticket

    def _unknown_tool(self, ticket: ToolTicket, ts: ToolSettings) -> ToolTicket:
        """Refuse a call to an unknown tool; the same call again ends the run."""
        b = self._budget
        d = self._detectors
        ticket.done = True
        if d.last_failure.get(ticket.retry_key) is FailureClass.UNKNOWN_TOOL:
            verdict = self._decide(d.retry_stop(ticket, FailureClass.UNKNOWN_TOOL, 0, 0, b.step))
            if not verdict.allowed:
                b.blocked += 1
                ticket.stop = verdict.stop
                ticket.blocked_by = "retry_rule"
                return ticket
        ticket.blocked_by = "unknown_tool"
        b.errors += 1
        d.remember_failure(ticket, ts, FailureClass.UNKNOWN_TOOL)
        return ticket

    def _pre_dispatch(
        self, ticket: ToolTicket, ts: ToolSettings, elapsed: float
    ) -> tuple[Stop | None, str | None, bool]:
        """``(stop, blocked_by, is_retry)``: deadline, ceilings, success slots held by
        calls in flight, the retry rule, then the repeated-action detectors."""
        b = self._budget
        p = self.policy
        step = b.step
        if b.parent is not None or elapsed >= p.max_elapsed_seconds:
            stop = b.deadline_stop(step, elapsed)
            if stop is not None:
                return stop, "deadline", False
        stop, blocked_by = b.tool_call_stop(step, ticket.tool)
        if blocked_by is not None:
            return stop, blocked_by, False
        if (
            (b.in_flight or b.parent is not None)
            and self.mode == "enforce"
            and b.success_slots_held()
        ):
            return None, "ceiling", False
        d = self._detectors
        if ticket.retry_key:
            stop, is_retry = d.retry_check(ticket, ts, step)
            if stop is not None:
                return stop, "retry_rule", False
            if is_retry:
                return None, None, True
        stop = d.repeat(ticket, ts, step)
        if stop is not None:
            return stop, stop.evidence.detector, False
        return None, None, False

    def record_tool_result(
        self,
        ticket: ToolTicket,
        *,
        result: Any = None,
        error: BaseException | None = None,
        failure_class: FailureClass | str | None = None,
    ) -> ToolRecord:
        """Record what a dispatched call returned (``result``) or raised (``error``).

        A result that arrives after the run stopped, or for a refused or already used
        ticket, is not recorded (``accepted=False``): a late result cannot append to a
        closed run (nor, in a child run, to a stopped ancestor's counters).

        Args:
            ticket: from :meth:`before_tool_call`.
            result: the tool's return value.
            error: the exception the tool raised (or a timeout).
            failure_class: override the classification of ``error``.

        Returns:
            A :class:`ToolRecord`.

        Raises:
            ValueError: the ticket was issued by another guard (a parent's or a child's):
                recorded here, it would free a slot this run never held and leave the
                issuing run holding one for good.
        """
        if ticket.guard is not self:
            raise ValueError("the ticket was issued by another guard: record it there")
        with self._lock:
            b = self._budget
            if ticket.allowed and not ticket.done:
                b.release()
                self._detectors.release(ticket)
            if (
                ticket.done
                or not ticket.allowed
                or self._stop is not None
                or (b.parent is not None and b.ancestor_closed())
            ):
                ticket.done = True
                return ToolRecord(accepted=False, steps_since_progress=b.steps_since_progress)
            ticket.done = True
            d = self._detectors
            ts = d.tools.get(ticket.tool) or d.tool_settings(ticket.tool)
            fc: FailureClass | None = None
            error_type: str | None = None
            if error is not None:
                fc = (
                    FailureClass(failure_class)
                    if failure_class is not None
                    else classify_exception(error)
                )
                error_type = type(error).__name__
                message = str(error)[:_ERROR_MESSAGE_CHARS]
                obs = digest(
                    canonical_json({"error": fc.value, "type": error_type, "message": message})
                )
                b.errors += 1
            else:
                obs = observation_digest_with(result, ts.drop, self._scrub)
                b.successes += 1
                if b.parent is not None:
                    b.charge_parents(successes=1)
            if fc is not None or ticket.retry_key:
                d.remember_failure(ticket, ts, fc)
            progress = d.record(ticket, ts, obs, result, error is None)
            if self._ladder is not None:
                self._ladder.result(ticket, obs, result, progress)
            if progress:
                b.step_progress = True
                b.steps_since_progress = 0
            cycle = d.cycle(ticket, b.step)
            return new_record(
                True,
                _OK if error is None else _ERROR,
                obs,
                fc,
                error_type,
                progress,
                b.steps_since_progress,
                ALLOWED if cycle is None else self._decide(cycle),
            )

    def progress(self, note: str | None = None) -> None:
        """Record progress evidence the guard cannot see (a file written, a new user turn),
        never on the model's say-so. It also starts a new count of identical actions:
        re-reading after a change is no repeat, up to ``RepeatLimits.across_progress``."""
        with self._lock:
            if self._stop is None:
                self._budget.step_progress = True
                self._budget.steps_since_progress = 0
                self._detectors.progress_noted()
                if self._ladder is not None:
                    self._ladder.progress()

    # ---------------------------------------------------------------- steps

    def end_step(self) -> Verdict:
        """End the current step: ceilings, then no progress. Idempotent per step."""
        with self._lock:
            if self._stop is not None:
                return Verdict(False, stop=self._stop)
            if not self._budget.step_open:
                return ALLOWED
            return self._end_step(self._budget.elapsed())

    def _end_step(self, elapsed: float) -> Verdict:
        b = self._budget
        b.step_open = False
        if not b.step_progress:
            b.steps_since_progress += 1
        stop = b.deadline_stop(b.step, elapsed)
        if stop is not None:
            return self._decide(stop)
        verdict = self._observed_ceilings(None) if b.past_observed_ceiling() else ALLOWED
        if not verdict.allowed:
            return verdict
        if b.steps_since_progress < self.policy.no_progress_patience:
            return verdict
        stop = self._detectors.no_progress(b.step, b.steps_since_progress)
        if stop is None:
            return verdict
        return _with_would(self._decide(stop), verdict.would_stop)

    # ------------------------------------------------------------------ end

    def finish(self, answer: Any = None) -> Outcome:
        """End the run (if not already ended) and return its :class:`Outcome`.

        A loop that returns without a recorded ``final`` decision ends with its return
        value as the final answer (goal check applies). Idempotent: later calls return
        the same stop.
        """
        with self._lock:
            if self._stop is None:
                if self._has_answer:
                    answer = self._answer
                self._finalize(answer)
            return self.outcome()

    def cancel(self) -> Outcome:
        """End the run as ``cancelled`` (if not already ended)."""
        with self._lock:
            if self._stop is None:
                self._close(make_stop(StopReason.CANCELLED, self._budget.step))
            return self.outcome()

    def framework_stop(
        self,
        reason: StopReason,
        *,
        framework: str,
        limit_name: str,
        dimension: Dimension | None = None,
        limit: float | None = None,
        observed: float | None = None,
        tool: str | None = None,
    ) -> Outcome:
        """End the run (if not already ended) because the framework's own limit stopped
        it (``MaxTurnsExceeded``, ``GraphRecursionError``...); observe mode ends it too.

        Args:
            reason: its place in the taxonomy (``budget_exhausted``, ``repeated_action``).
            framework / limit_name: the evidence (``openai-agents``, ``MaxTurnsExceeded``).
            dimension / limit / observed / tool: the budget that ran out and its figures;
                the tool of a refused repeat.
        """
        detail = {"framework": framework, "limit": limit_name}
        evidence = Evidence(detector="framework_limit", tool=tool, detail=detail)
        with self._lock:
            if self._stop is None:
                step = self._budget.step
                self._close(
                    make_stop(
                        reason,
                        step,
                        dimension=dimension,
                        limit=limit,
                        observed=observed,
                        basis="observed" if limit is not None else None,
                        evidence=evidence,
                    )
                )
            return self.outcome()

    def fail(self, exc: BaseException) -> Outcome:
        """End the run as ``error``; the exception's type is the evidence (never its text)."""
        with self._lock:
            if self._stop is None:
                detail = {"exception_type": type(exc).__name__}
                evidence = Evidence(detector="exception", detail=detail)
                self._close(make_stop(StopReason.ERROR, self._budget.step, evidence=evidence))
            return self.outcome()

    def outcome(self) -> Outcome:
        """The run's :class:`Outcome`; :class:`RunStateError` before the run stopped."""
        with self._lock:
            if self._stop is None:
                raise RunStateError("the run has not stopped yet")
            stop = self._stop
            completed = stop.reason is StopReason.COMPLETED
            answered = stop.reason in (StopReason.COMPLETED, StopReason.FINAL_UNVERIFIED)
            return Outcome(
                run_id=self.run_id,
                status="completed" if completed else "stopped",
                stop=stop,
                usage=self._budget.usage(),
                answer=self._answer if answered else None,
                partial_answer=None if completed else self._partial,
                message=stop.message,
                retryable=stop.retryable,
                observed_stops=tuple(self._observed),
                policy_name=self.policy.name,
                policy_version=self.policy.version,
                **(self._ladder.outcome_fields() if self._ladder else {}),
            )

    # --------------------------------------------------------------- resume

    def snapshot(self) -> dict[str, Any]:
        """Serialize usage and detector state (JSON-ready) so the run can be resumed;
        resuming never grants a fresh budget (:meth:`restore`, format: :mod:`.state`)."""
        with self._lock:
            state = snapshot(self, self._budget, self._detectors, self._stop, self._partial)
            return self._ladder.save(state) if self._ladder is not None else state

    @classmethod
    def restore(
        cls,
        policy: Policy,
        state: Mapping[str, Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        mode: Mode = "enforce",
        goal_check: Callable[[Any], bool] | None = None,
        known_tools: Collection[str] | None = None,
        scrub: Callable[[Any], Any] | None = None,
        parent: Guard | None = None,
        result_preview: Callable[[Any], str] | None = None,
    ) -> Guard:
        """Resume a run from :meth:`snapshot`: usage, elapsed time and detector windows.

        An open step stays open (checkpoints cannot defeat the no-progress check). A child
        run resumes under ``parent=``: capped again by what the parent has left, and
        charged to it from then on. The ladder's rungs and nudges carry over too.

        Raises:
            ValueError: not a guard snapshot, a stopped run's, or a corrupted one
                (see :func:`.state.check`).
        """
        check(state)
        run_id = str(state["run_id"])
        if parent is not None:
            g = parent.child(
                policy,
                run_id=run_id,
                mode=mode,
                goal_check=goal_check,
                known_tools=known_tools,
                _already_used=already_used(state),
            )
            g._budget.start_clock(clock)
        else:
            g = cls(
                policy,
                clock=clock,
                mode=mode,
                goal_check=goal_check,
                run_id=run_id,
                known_tools=known_tools,
                scrub=scrub,
                result_preview=result_preview,
            )
        load(state, g._budget, g._detectors)
        g._partial = state.get("partial")
        if g._ladder is not None:
            g._ladder.load(state.get("ladder"))
        return g
