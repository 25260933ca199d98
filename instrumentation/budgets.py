"""The run's usage counters and the ceilings over them: budgets, parent charging, deadline.

A :class:`Budget` holds one run's consumption (model turns, tool attempts and successes,
tokens, cost, steps, wall clock) and answers whether the next call fits. A limit of N
permits exactly N uses (DESIGN section 3): the check runs on the projected total before
the call leaves the process. A child run's budget is linked to its parent's: every use is
charged to each ancestor, and a call that an ancestor cannot afford is refused.

Not thread-safe by itself: the :class:`~.guard.Guard` that owns it holds the run tree's
lock around every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from .outcomes import Basis, Decision, Dimension, Evidence, Stop, StopReason, Usage, make_stop
from .policy import Policy

__all__ = [
    "COST_DECIMALS",
    "MAX_PRICED_IN_EVIDENCE",
    "MAX_PRICES_KEPT",
    "MAX_REPORTED_TOKENS",
    "Budget",
    "dollars",
    "usage_cost",
    "usage_tokens",
]

COST_DECIMALS: Final = 9
"""Costs are compared with budgets (and reported) rounded to 1e-9 US dollars, so that
ten calls of $0.1 make exactly the $1.0 a budget names: in binary floating point the sum
is 0.9999999999999999, and three of $0.1 are 0.30000000000000004, which would cross a
$0.3 budget after the third call instead of refusing the fourth. The running total itself
is kept exact (rounding each addition loses costs under half a nanodollar)."""

NEAR: Final = 10.0**-COST_DECIMALS
"""Closer to a budget than this, costs are compared rounded (a round() per call is not free)."""

MAX_REPORTED_TOKENS: Final = 2**40
"""The most tokens one reported count stands for (about 1.1e12, far past any model's).

A larger count (a corrupt recording, a unit mix-up) counts as this: OTLP carries
integers as signed 64-bit, and an exporter drops an attribute past that range without
raising, so the decision's usage and the run's totals would silently vanish from the
trace. Capped per report, a run's totals stay within range for 2**23 reports.
"""


MAX_PRICES_KEPT: Final = 16
"""Distinct (model, price source) pairs a run keeps the cost of; the costs of any pair
past these are summed under the model ``other``, so a run's memory stays bounded."""

MAX_PRICED_IN_EVIDENCE: Final = 3
"""(model, price source) pairs a cost stop names, the costliest first (``detail.priced_by``;
``detail.priced_by_more`` counts the rest)."""

_NAME_CHARS: Final = 120
_OTHER: Final = ("other", None)

_ONE_TOOL_CALL: Final[Mapping[Dimension, float]] = {
    Dimension.TOOL_ATTEMPTS: 1,
    Dimension.TOOL_SUCCESSES: 1,
}


def dollars(amount: float) -> float:
    """``amount`` US dollars rounded to :data:`COST_DECIMALS`."""
    return round(amount, COST_DECIMALS)


def usage_tokens(value: Any) -> int:
    """A reported token count as an int in ``0..MAX_REPORTED_TOKENS``.

    ``None`` (providers that report no usage, streaming responses) counts as 0, and so
    does anything that is not a number (NaN, ``"many"``): a broken report must not end
    the run as ``error``. An infinite count is a larger count: the cap.
    """
    if type(value) is int:
        return min(max(value, 0), MAX_REPORTED_TOKENS)
    if value is None:
        return 0
    try:
        number = float(value) if isinstance(value, float | str) else int(value)
    except Exception:  # a number from a broken report is no number
        return 0
    if isinstance(number, float):
        if math.isnan(number):
            return 0
        if math.isinf(number):
            return MAX_REPORTED_TOKENS if number > 0 else 0
        number = int(number)
    return min(max(number, 0), MAX_REPORTED_TOKENS)


def usage_cost(value: Any) -> float:
    """A reported cost in US dollars as a float >= 0 (possibly infinite).

    ``None``, NaN, negative values and anything that is not a number (a complex,
    ``"abc"``) count as 0.
    """
    if value is None:
        return 0.0
    try:
        cost = float(value)
    except Exception:  # a number from a broken report is no number
        return 0.0
    return cost if cost > 0 else 0.0  # NaN and negative costs count as nothing


class Budget:
    """One run's usage counters, clock and ceilings.

    Args:
        policy: the run's limits.
        clock: monotonic clock in seconds. A reading below the last one (``time.time``
            stepped back by NTP), NaN or infinite counts as the last reading: time never
            runs backwards for the budget, and a broken clock cannot give a run extra
            time or switch its deadline off.
        parent: the parent run's budget; every use here is charged there too.

    Attributes:
        turns / attempts / successes / errors / blocked / retries_total: counts.
        in_flight: dispatched calls (here and in children) whose result is not recorded:
            each holds a tool-success slot, so parallel calls cannot all succeed past
            ``max_tool_successes``. Not serialized: a ticket does not survive resume.
        input_tokens / output_tokens: token counts. cost: US dollars, exact running sum.
        step: the current step (1-based; 0 before the first). step_open: a step has begun
            and not ended. step_progress: the open step has progress evidence.
        steps_since_progress: steps ended without progress evidence, in a row.
        closed_by: the reason the run stopped, once it has (children refuse calls then).
        elapsed_offset: seconds used before a resume.
        priced: US dollars per ``(model, price_source)`` of the decisions that reported a
            cost (:meth:`charge_decision`; at most :data:`MAX_PRICES_KEPT` pairs), named by
            a cost stop's evidence. Not serialized: after a resume it names the models
            priced since.
    """

    def __init__(
        self, policy: Policy, clock: Callable[[], float], parent: Budget | None = None
    ) -> None:
        self.policy = policy
        self.parent = parent
        self.start_clock(clock)
        self.elapsed_offset = 0.0
        self.turns = self.attempts = self.successes = self.in_flight = 0
        self.errors = self.blocked = self.retries_total = 0
        self.input_tokens = self.output_tokens = 0
        self.cost = 0.0
        self.priced: dict[tuple[str | None, str | None], float] = {}
        self.step = self.steps_since_progress = 0
        self.step_open = self.step_progress = False
        self.closed_by: StopReason | None = None

    # ------------------------------------------------------------------ clock

    @property
    def clock(self) -> Callable[[], float]:
        """The clock this budget reads."""
        return self._clock

    def start_clock(self, clock: Callable[[], float]) -> None:
        """Start measuring elapsed time on ``clock`` from now."""
        self._clock = clock
        first = clock()
        self.started = first if math.isfinite(first) else 0.0
        self._last_reading = self.started

    def elapsed(self) -> float:
        """Seconds since the run started (resume included), one clock reading."""
        reading = self._clock()
        last = self._last_reading
        if reading > last and math.isfinite(reading):
            self._last_reading = last = reading
        return self.elapsed_offset + (last - self.started)

    def remaining(self, elapsed: float) -> float:
        """Seconds left before this run's or an ancestor's deadline, never below 0."""
        left = self.policy.max_elapsed_seconds - elapsed
        if self.parent is not None:
            left = min(left, self.parent.remaining(self.parent.elapsed()))
        return max(left, 0.0)

    def deadline_stop(self, step: int, elapsed: float) -> Stop | None:
        """The ``deadline_exceeded`` stop if this run's or an ancestor's deadline is due.

        ``elapsed >= limit`` is expired (DESIGN section 3).
        """
        limit = self.policy.max_elapsed_seconds
        if elapsed >= limit:
            return _spent(step, Dimension.ELAPSED_SECONDS, limit, elapsed, "observed")
        parent = self.parent
        if parent is not None and parent.remaining(parent.elapsed()) <= 0:
            limit = parent.policy.max_elapsed_seconds
            return _spent(
                step, Dimension.ELAPSED_SECONDS, limit, parent.elapsed(), "observed", scope="parent"
            )
        return None

    # --------------------------------------------------------------- ceilings

    def tokens(self) -> int:
        """Input plus output tokens used."""
        return self.input_tokens + self.output_tokens

    def used_and_limit(self, dim: Dimension) -> tuple[float, float]:
        """``(used, limit)`` of a budget a child shares with its parent.

        Raises:
            ValueError: ``dim`` is not shared (retries, elapsed time).
        """
        p = self.policy
        if dim is Dimension.MODEL_TURNS:
            return self.turns, p.max_model_turns
        if dim is Dimension.TOOL_ATTEMPTS:
            return self.attempts, p.max_tool_attempts
        if dim is Dimension.TOOL_SUCCESSES:
            return self.successes, p.max_tool_successes
        if dim is Dimension.TOKENS:
            return self.tokens(), p.max_tokens
        if dim is Dimension.COST:
            return dollars(self.cost), p.max_cost_usd
        raise ValueError(f"not a shared budget: {dim}")

    def model_call_stop(
        self, step: int, estimate_tokens: int | None, estimate_cost_usd: float | None
    ) -> Stop | None:
        """The ceiling a model call would cross (turns, then tokens, then cost, then an
        ancestor's), with the estimates added to the projected totals."""
        p = self.policy
        if self.turns >= p.max_model_turns:
            return _spent(
                step, Dimension.MODEL_TURNS, p.max_model_turns, self.turns + 1, "projected"
            )
        tokens = self.input_tokens + self.output_tokens
        projected = tokens + (estimate_tokens or 0)
        if (estimate_tokens is not None and projected > p.max_tokens) or tokens >= p.max_tokens:
            return _spent(step, Dimension.TOKENS, p.max_tokens, max(projected, tokens), "projected")
        if estimate_cost_usd is not None or self.cost > p.max_cost_usd - NEAR:
            cost = dollars(self.cost)
            projected_cost = dollars(self.cost + (estimate_cost_usd or 0.0))
            if (
                estimate_cost_usd is not None and projected_cost > p.max_cost_usd
            ) or cost >= p.max_cost_usd:
                return self.cost_stop(step, p.max_cost_usd, max(projected_cost, cost), "projected")
        if self.parent is not None:
            needs: dict[Dimension, float] = {
                Dimension.MODEL_TURNS: 1,
                Dimension.TOKENS: estimate_tokens or 0,
                Dimension.COST: estimate_cost_usd or 0.0,
            }
            return self.parent_block(step, needs)
        return None

    def tool_call_stop(self, step: int, tool: str) -> tuple[Stop | None, str | None]:
        """``(stop, blocked_by)`` for a tool dispatch: this run's attempt and success
        ceilings, then an ancestor's (``blocked_by`` ``ceiling`` or ``parent``)."""
        p = self.policy
        if self.attempts >= p.max_tool_attempts or self.successes >= p.max_tool_successes:
            for dim, used, limit in (
                (Dimension.TOOL_ATTEMPTS, self.attempts, p.max_tool_attempts),
                (Dimension.TOOL_SUCCESSES, self.successes, p.max_tool_successes),
            ):
                if used >= limit:
                    return _spent(step, dim, limit, used + 1, "projected", tool=tool), "ceiling"
        if self.parent is not None:
            parent_stop = self.parent_block(step, _ONE_TOOL_CALL)
            if parent_stop is not None:
                return parent_stop, "parent"
        return None, None

    def past_observed_ceiling(self) -> bool:
        """Whether tokens or cost crossed their ceiling, or a parent's may have: the
        cheap test in front of :meth:`observed_ceiling_stop` on the per-step path."""
        p = self.policy
        return (
            self.parent is not None
            or self.input_tokens + self.output_tokens > p.max_tokens
            or (self.cost > p.max_cost_usd - NEAR and dollars(self.cost) > p.max_cost_usd)
        )

    def observed_ceiling_stop(self, step: int) -> Stop | None:
        """The stop for reported tokens or cost past this run's or an ancestor's ceiling
        (basis ``observed``: usage is known only after the call)."""
        p = self.policy
        tokens = self.tokens()
        if tokens > p.max_tokens:
            return _spent(step, Dimension.TOKENS, p.max_tokens, tokens, "observed")
        if dollars(self.cost) > p.max_cost_usd:
            return self.cost_stop(step, p.max_cost_usd, dollars(self.cost), "observed")
        node = self.parent
        while node is not None:
            for dim in (Dimension.TOKENS, Dimension.COST):
                used, limit = node.used_and_limit(dim)
                if used > limit:
                    return node.spent(step, dim, limit, round(used, 6), "observed", scope="parent")
            node = node.parent
        return None

    def spent(
        self, step: int, dim: Dimension, limit: float, observed: float, basis: Basis, *, scope: str
    ) -> Stop:
        """The budget stop of ``dim`` on this run's counters (a cost stop names its prices)."""
        if dim is Dimension.COST:
            return self.cost_stop(step, limit, observed, basis, scope=scope)
        return _spent(step, dim, limit, observed, basis, scope=scope)

    def cost_stop(
        self, step: int, limit: float, observed: float, basis: Basis, *, scope: str = "run"
    ) -> Stop:
        """The ``budget_exhausted`` stop on cost, its evidence naming the models and price
        sources that made the cost (:data:`MAX_PRICED_IN_EVIDENCE`, costliest first)."""
        ranked = sorted(self.priced.items(), key=lambda item: -item[1])
        named = []
        for (model, source), usd in ranked[:MAX_PRICED_IN_EVIDENCE]:
            entry: dict[str, Any] = {"cost_usd": dollars(usd)}
            if model is not None:
                entry["model"] = model
            if source is not None:
                entry["price_source"] = source
            named.append(entry)
        detail: dict[str, Any] = {"priced_by": named} if named else {}
        if len(ranked) > MAX_PRICED_IN_EVIDENCE:
            detail["priced_by_more"] = len(ranked) - MAX_PRICED_IN_EVIDENCE
        return _spent(step, Dimension.COST, limit, observed, basis, scope=scope, detail=detail)

    def charge_decision(self, decision: Decision) -> None:
        """Add a decision's reported tokens and cost (and the model and price source behind
        the cost) here and to every ancestor."""
        input_tokens = usage_tokens(decision.input_tokens)
        output_tokens = usage_tokens(decision.output_tokens)
        cost = usage_cost(decision.cost_usd)
        price = (_name(decision.model), _name(decision.price_source)) if cost > 0 else None
        node: Budget | None = self
        while node is not None:
            node.input_tokens += input_tokens
            node.output_tokens += output_tokens
            node.cost += cost
            if price is not None:
                room = price in node.priced or len(node.priced) < MAX_PRICES_KEPT
                key = price if room else _OTHER
                node.priced[key] = node.priced.get(key, 0.0) + cost
            node = node.parent

    # ---------------------------------------------------------------- parents

    def parent_block(self, step: int, needs: Mapping[Dimension, float]) -> Stop | None:
        """A stop if some ancestor has stopped (``cancelled``) or cannot afford ``needs``
        (checked, not reserved). An amount of 0 means "unknown size": some capacity must
        be left."""
        node = self.parent
        while node is not None:
            if node.closed_by is not None:
                return make_stop(
                    StopReason.CANCELLED,
                    step,
                    evidence=Evidence(
                        detector="parent_stopped",
                        scope="parent",
                        detail={"parent_stop_reason": node.closed_by.value},
                    ),
                )
            for dim, amount in needs.items():
                used, limit = node.used_and_limit(dim)
                if used + amount > limit or (amount == 0 and used >= limit):
                    return node.spent(step, dim, limit, used + amount, "projected", scope="parent")
            node = node.parent
        return None

    def ancestor_closed(self) -> bool:
        """An ancestor run has stopped: this run's use can no longer be charged to it (a
        late result or decision in a child would change a stopped run's counters)."""
        node = self.parent
        while node is not None:
            if node.closed_by is not None:
                return True
            node = node.parent
        return False

    def success_slots_held(self) -> bool:
        """Every tool-success slot left (here or in an ancestor) is held by a call in
        flight: the next call must wait, though the run has not used its budget yet."""
        node: Budget | None = self
        while node is not None:
            if node.successes + node.in_flight >= node.policy.max_tool_successes:
                return True
            node = node.parent
        return False

    def dispatch(self, is_retry: bool, tool_timeout: float, elapsed: float) -> float:
        """Charge a dispatched tool call (an attempt, a held success slot, a retry) here and
        to every ancestor; returns its timeout in seconds: ``tool_timeout``, capped by
        the wall clock this run and its ancestors have left at ``elapsed``."""
        self.attempts += 1
        self.in_flight += 1
        if is_retry:
            self.retries_total += 1
        if self.parent is None:
            left = self.policy.max_elapsed_seconds - elapsed
            return min(tool_timeout, left if left > 0.0 else 0.0)
        self.charge_parents(attempts=1, in_flight=1)
        return min(tool_timeout, self.remaining(elapsed))

    def release(self) -> None:
        """A dispatched call's result or error arrived: its success slot is free again
        (here and in every ancestor)."""
        self.in_flight -= 1
        if self.parent is not None:
            self.charge_parents(in_flight=-1)

    def charge_parents(
        self,
        *,
        turns: int = 0,
        attempts: int = 0,
        successes: int = 0,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost: float = 0.0,
        in_flight: int = 0,
    ) -> None:
        """Add a use made here to every ancestor's counters."""
        node = self.parent
        while node is not None:
            node.turns += turns
            node.attempts += attempts
            node.successes += successes
            node.input_tokens += input_tokens
            node.output_tokens += output_tokens
            node.cost += cost
            node.in_flight += in_flight
            node = node.parent

    def child_caps(self, base: Policy, already_used: Mapping[str, float]) -> dict[str, Any]:
        """The limits of ``base`` a child must lower to what this run has left.

        ``already_used``: what a resumed child had used (it stays within the cap).
        """
        p = self.policy
        remaining = {
            "max_model_turns": p.max_model_turns - self.turns,
            "max_tool_attempts": p.max_tool_attempts - self.attempts,
            "max_tool_successes": p.max_tool_successes - self.successes,
            "max_tokens": p.max_tokens - self.tokens(),
            "max_cost_usd": dollars(p.max_cost_usd - self.cost),
        }
        caps: dict[str, Any] = {}
        for name, left in remaining.items():
            allowed = max(left, 0) + already_used.get(name, 0)
            if getattr(base, name) > allowed:
                caps[name] = type(getattr(base, name))(allowed)
        seconds_left = self.remaining(self.elapsed())
        if base.max_elapsed_seconds > seconds_left > 0:
            caps["max_elapsed_seconds"] = seconds_left
        return caps

    def usage(self) -> Usage:
        """A snapshot of the counters."""
        return Usage(
            model_turns=self.turns,
            tool_attempts=self.attempts,
            tool_successes=self.successes,
            tool_errors=self.errors,
            tool_blocked=self.blocked,
            retries=self.retries_total,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            tokens=self.tokens(),
            cost_usd=dollars(self.cost),
            elapsed_seconds=self.elapsed(),
            steps=self.step,
            steps_since_progress=self.steps_since_progress,
        )


def _name(value: Any) -> str | None:
    """A model or price-source name as bounded text (``None`` stays unknown)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value[:_NAME_CHARS]
    try:
        return str(value)[:_NAME_CHARS]
    except Exception:  # a broken __str__ must not end the run as an error
        return type(value).__name__


def _spent(
    step: int,
    dimension: Dimension,
    limit: float,
    observed: float,
    basis: Basis,
    *,
    scope: str = "run",
    tool: str | None = None,
    detail: Mapping[str, Any] | None = None,
) -> Stop:
    """A budget stop (``deadline_exceeded`` for the elapsed-seconds budget)."""
    deadline = dimension is Dimension.ELAPSED_SECONDS
    return make_stop(
        StopReason.DEADLINE_EXCEEDED if deadline else StopReason.BUDGET_EXHAUSTED,
        step,
        dimension=dimension,
        limit=limit,
        observed=observed,
        basis=basis,
        evidence=Evidence(
            detector="deadline" if deadline else "ceiling",
            tool=tool,
            scope=scope,
            detail=dict(detail) if detail else {},
        ),
    )
