"""The loop detectors of one run and the bounded history they read.

- repeated action: the same fingerprint with an unchanged observation, in a row, with no
  progress evidence between (or :attr:`RepeatLimits.across_progress` in a row
  whatever came between); for writes (declared, or inferred from the tool's name:
  :mod:`.tool_risk`), the same *intent* anywhere in the window after it succeeded,
  whatever it returned (``duplicate_intent``; the evidence names ``risk_source``).
  Identical calls still in flight (dispatched, result not yet recorded: parallel calls of
  one model turn) count too, at dispatch (see :class:`RepeatLimits`).
- action cycle: periods ``2..cycle_max_period`` repeated ``cycle_repetitions`` times with
  unchanged observations.
- repeated decision: the same non-tool decision ``repeated_decision_limit`` times.
- progress: a tool observation not seen before in the window, or a progress-bearing field
  (``cursor``, ``page``) moved to a value not seen before; ``no_progress`` stops after
  ``no_progress_patience`` steps without it.
- retries per action: keyed by a loose fingerprint and the previous failure class
  (:func:`~.failures.retry_allowance` decides the allowance).

Each check returns a :class:`~.outcomes.Stop` or None; the guard decides what a stop does
(end the run, or record it in ``observe`` mode). State is bounded by ``detector_window``
(or what a limit needs, up to :data:`MAX_LOOKBACK`) whatever the run's length, and the
calls in flight by how many run at once. Not thread-safe by itself: the owning guard holds
its lock around every call. Calls in flight are not part of a snapshot (:mod:`.state`): a
run is resumed between calls, and a call in flight when the snapshot was taken is either
recorded before it (then it is in the streak) or lost with the process.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from .failures import FailureClass, retry_allowance
from .fingerprint import (
    canonical_json,
    canonicalize,
    fields_lower,
    fingerprint_with,
    key_text,
    preview,
    tool_suffix,
)
from .outcomes import Decision, Dimension, Evidence, Stop, StopReason, ToolTicket, make_stop
from .policy import DEFAULT_VOLATILE_FIELDS, Policy, ToolPolicy

__all__ = [
    "MAX_LOOKBACK",
    "REPEAT_ACROSS_PROGRESS_FACTOR",
    "Action",
    "Detectors",
    "RepeatLimits",
    "ToolSettings",
]

MAX_LOOKBACK: Final = 4096
"""The longest look-back a limit can ask for (the largest ``detector_window``); a
``repeated_decision_limit`` or a cycle span (period x repetitions) beyond it can never
fire, which is how a policy switches those detectors off."""


REPEAT_ACROSS_PROGRESS_FACTOR: Final = 3
"""Progress from the environment (``Guard.progress``) starts a new count of identical
actions; this many times the repeat limit in a row is refused all the same, so an
environment that reports something new every turn cannot switch the detector off. 3: the
successful tau2 runs of the corpus re-read a line up to 6 times in a row, each after a user
turn; with 3, replaying the corpus stops the same runs as with no cap at all."""
_TOOL_CACHE_ENTRIES: Final = 256
_SHARED_POLICIES: Final = 32
"""Policies whose per-tool settings are shared across runs (:func:`_shared_tools`)."""
_shared: dict[tuple[int, frozenset[str] | None], tuple[Policy, dict[str, ToolSettings]]] = {}


def _shared_tools(policy: Policy, known_tools: frozenset[str] | None) -> dict[str, ToolSettings]:
    """The per-tool settings cache of ``policy`` (with ``known_tools``), one dict shared by
    every run guarded by that policy object.

    :class:`ToolSettings` depends only on the frozen policy, the tool name and
    ``known_tools``, so runs can share it: replaying 500 runs through two policies rebuilt
    the same settings on each call of each run (about 13 % of the replay's time). Keyed
    by the policy's identity (hashing a policy hashes every field); the entry holds the
    policy, so the id cannot be reused while cached. Bounded: past
    :data:`_SHARED_POLICIES` policies the registry starts over (a cache, nothing lost).
    Dict reads and writes are atomic under the GIL; two threads may build the same
    settings once each, which is harmless.
    """
    key = (id(policy), known_tools)
    entry = _shared.get(key)
    if entry is not None and entry[0] is policy:
        return entry[1]
    if len(_shared) >= _SHARED_POLICIES:
        _shared.clear()
    tools: dict[str, ToolSettings] = {}
    _shared[key] = (policy, tools)
    return tools


_WRITE_REPEAT_LIMIT: Final = 2
"""A write tool's repeat limit unless declared: the second run of the same intent is refused."""


class RepeatLimits(NamedTuple):
    """What ``repeat_limit`` means for one tool, decided here and nowhere else.

    Attributes:
        in_a_row: the N-th identical action (same fingerprint, unchanged observation) in a
            row with no progress between is refused; for a write, also the N-th run of the
            same intent in the window. The tool's ``repeat_limit``, else the profile's
            (reads) or 2 (writes); at least 2: the first occurrence is never a repeat.
            Identical calls still in flight count at dispatch, as if each had returned
            the streak's observation (their results are not known yet): the call is the
            (streak + in flight + 1)-th occurrence, refused when that reaches N, so a
            model turn asking for the same call many times in parallel runs its body at
            most N - 1 times, as it would in sequence. Likewise a write whose intent is
            in flight (an idempotency key it shares is a replay, not a duplicate) counts
            that run towards the N-th. The evidence then carries ``detail.in_flight``
            (how many of the counted calls were concurrent). With nothing in flight the
            rule is the sequential one above, unchanged.
        across_progress: refused in a row whatever progress came between:
            ``in_a_row`` x :data:`REPEAT_ACROSS_PROGRESS_FACTOR`.
        keyed / keyed_across_progress: the same for a write carrying its idempotency key:
            a replay with the same key acts once, so only a runaway of replays is a loop,
            judged by the larger of ``in_a_row`` and the profile's (read) limit.
    """

    in_a_row: int
    across_progress: int
    keyed: int
    keyed_across_progress: int

    @classmethod
    def of(cls, policy: Policy, tool: ToolPolicy) -> RepeatLimits:
        """The repeat limits of ``tool`` under ``policy``."""
        limit = tool.repeat_limit
        if limit is None:
            limit = _WRITE_REPEAT_LIMIT if tool.risk == "write" else policy.repeat_limit
        limit = max(limit, 2)
        keyed = max(limit, policy.repeat_limit, 2)
        factor = REPEAT_ACROSS_PROGRESS_FACTOR
        return cls(limit, limit * factor, keyed, keyed * factor)


def _take(held: dict[str, list[Any]], key: str, item: Any) -> None:
    """Remove one ``item`` from ``held[key]`` (the key too once empty); absent: nothing."""
    items = held.get(key)
    if items is None:
        return
    try:
        items.remove(item)
    except ValueError:
        return
    if not items:
        del held[key]


def _lookback(window: int, needed: int) -> int:
    """At least what a limit needs (up to MAX_LOOKBACK): a limit past the window must not
    switch its detector off without a word."""
    return max(window, min(needed, MAX_LOOKBACK))


class _LRU(OrderedDict[Any, Any]):
    """A bounded mapping: :meth:`set` past ``capacity`` evicts the oldest key (and calls
    ``on_evict`` with it, if given)."""

    def __init__(self, capacity: int, on_evict: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self._capacity = capacity
        self._on_evict = on_evict

    def set(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self._capacity:
            old, _ = self.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old)


@dataclass(slots=True)
class Action:
    """One recorded tool call: its fingerprint, observation digest, tool, step, and
    whether its result was progress evidence."""

    fingerprint: str
    observation: str
    tool: str
    step: int
    progress: bool = False


class ToolSettings:
    """Everything the hot path needs about one tool, derived once per guard (the policy
    and the known-tool set are immutable)."""

    __slots__ = (
        "drop",
        "intent_drop",
        "keep",
        "key_field",
        "repeat",
        "risk",
        "risk_source",
        "suffix",
        "timeout",
        "unknown",
        "write",
    )

    def __init__(self, policy: Policy, tool: str, known_tools: frozenset[str] | None) -> None:
        tp = policy.tool(tool)
        keep = fields_lower(tp.progress)
        volatile = DEFAULT_VOLATILE_FIELDS | fields_lower(tp.volatile)
        intent_volatile = (
            volatile | {tp.idempotency_key.lower()} if tp.idempotency_key else volatile
        )
        self.keep = keep
        self.drop = volatile - keep if keep else volatile
        self.intent_drop = intent_volatile - keep if keep else intent_volatile
        self.suffix = tool_suffix(tool)
        self.key_field = tp.idempotency_key.lower() if tp.idempotency_key else None
        self.risk = tp.risk
        self.risk_source = tp.risk_source
        self.write = tp.risk == "write"
        self.repeat = RepeatLimits.of(policy, tp)
        self.timeout = policy.timeout_for(tp)
        self.unknown = (known_tools is not None and tool not in known_tools) or (
            known_tools is None and policy.strict_tools and tool not in policy.tools
        )

    def key_value(self, arguments: Mapping[str, Any]) -> str | None:
        """The canonical value of a write's idempotency key argument; None when absent,
        None or the empty string."""
        value = None
        for k, v in arguments.items():
            # No == on the value: a hostile __eq__ (or an array) must not raise.
            if key_text(k).lower() == self.key_field and not (
                v is None or (isinstance(v, str) and str.__len__(v) == 0)
            ):
                value = canonical_json(canonicalize(v))
        return value

    def loose_key(self, arguments: Mapping[str, Any]) -> str:
        """The loose fingerprint of a call: the retry key, and a write's intent."""
        return fingerprint_with(self.suffix, arguments, self.intent_drop, loose=True)


class Detectors:
    """The detector state of one run (see the module docstring for each detector).

    Args:
        policy: the run's detector settings.
        known_tools: the tool names the agent registered (see :class:`ToolSettings`).
    """

    def __init__(self, policy: Policy, known_tools: frozenset[str] | None = None) -> None:
        window = policy.detector_window
        self.window = window
        self.policy = policy
        self.known_tools = known_tools
        # Shared by every run under this policy object (settings are immutable).
        self.tools: dict[str, ToolSettings] = _shared_tools(policy, known_tools)
        self.cycle_periods = range(2, policy.cycle_max_period + 1)
        cycle_span = policy.cycle_max_period * policy.cycle_repetitions
        self.actions: deque[Action] = deque(maxlen=_lookback(window, cycle_span))
        # The current run of identical actions (same fingerprint, same observation):
        # counted without bound (a repeat limit may exceed the window), its steps kept
        # for evidence within the window; since the last progress, and in all.
        self.streak: Action | None = None
        self.streak_steps: deque[int] = deque(maxlen=window)
        self.streak_all: deque[int] = deque(maxlen=window)
        self.streak_count = 0
        self.streak_all_count = 0
        self.last_failure = _LRU(window)
        self.retries = _LRU(window)
        self.writes = _LRU(window)
        self.seen = _LRU(window * 4)
        # How many (tool, field) slots of each pair progress_values holds, so "was this
        # field seen before" is one lookup instead of a scan of the window.
        self.progress_fields: Counter[tuple[Any, ...]] = Counter()
        self.progress_values = _LRU(window, self._forget_progress_value)
        self.decisions: deque[tuple[str, int]] = deque(
            maxlen=_lookback(window, policy.repeated_decision_limit)
        )
        self.decision_counts: Counter[str] = Counter()
        self.provided: set[str] = set()
        # Calls dispatched and not yet recorded, with their steps: by fingerprint, and a
        # write's by intent with its key. Bounded by how many calls run at once.
        self.in_flight: dict[str, list[int]] = {}
        self.writes_in_flight: dict[str, list[tuple[str | None, int]]] = {}

    # ------------------------------------------------------------ before a call

    def tool_settings(self, tool: str) -> ToolSettings:
        """The settings of ``tool``, derived once (cached in :attr:`tools`)."""
        cached = self.tools.get(tool)
        if cached is None:
            cached = ToolSettings(self.policy, tool, self.known_tools)
            if len(self.tools) >= _TOOL_CACHE_ENTRIES:
                # Bounded: a model inventing tool names must not grow the guard.
                self.tools.clear()
            self.tools[tool] = cached
        return cached

    def retry_key(self, ts: ToolSettings, arguments: Mapping[str, Any], intent: str) -> str:
        """The retry key of a call (the guard skips it while no action has failed: it
        only matters once some action has)."""
        return intent if ts.write else ts.loose_key(arguments)

    def retry_check(
        self, ticket: ToolTicket, ts: ToolSettings, step: int
    ) -> tuple[Stop | None, bool]:
        """``(stop, is_retry)``: a call after a failure of the same action is a retry,
        refused once the failure class's allowance is used up."""
        failure: FailureClass | None = self.last_failure.get(ticket.retry_key)
        if failure is None:
            return None, False
        allowance = retry_allowance(
            failure,
            write=ts.write,
            has_idempotency_key=ticket.idempotency_key is not None,
            max_retries=self.policy.max_retries_per_action,
        )
        used = self.retries.get(ticket.retry_key, 0)
        if used >= allowance:
            return self.retry_stop(ticket, failure, allowance, used, step), False
        return None, True

    def retry_stop(
        self, ticket: ToolTicket, failure: FailureClass, allowance: int, used: int, step: int
    ) -> Stop:
        """The ``budget_exhausted`` stop of a retry past its allowance."""
        return make_stop(
            StopReason.BUDGET_EXHAUSTED,
            step,
            dimension=Dimension.ACTION_RETRIES,
            limit=allowance,
            observed=used + 1,
            basis="projected",
            evidence=Evidence(
                detector="retry_rule",
                tool=ticket.tool,
                failure_class=failure.value,
                step_indices=(ticket.step,),
                fingerprint_previews=(preview(ticket.tool, ticket.fingerprint),),
            ),
        )

    def count_retry(self, key: str) -> None:
        """A retry of the action ``key`` was dispatched."""
        self.retries.set(key, self.retries.get(key, 0) + 1)

    def dispatch(self, ticket: ToolTicket, is_retry: bool) -> None:
        """An allowed call leaves the process: count it if it is a retry, and hold it in
        flight until :meth:`release` (the guard calls it for an allowed ticket only, so a
        refused call holds nothing)."""
        if is_retry:
            self.count_retry(ticket.retry_key)
        self.in_flight.setdefault(ticket.fingerprint, []).append(ticket.step)
        if ticket.risk == "write":
            held = self.writes_in_flight.setdefault(ticket.intent, [])
            held.append((ticket.idempotency_key, ticket.step))

    def release(self, ticket: ToolTicket) -> None:
        """The dispatched ``ticket`` returned, failed or timed out: it is no longer in
        flight (its result, if recorded, joins the streak)."""
        _take(self.in_flight, ticket.fingerprint, ticket.step)
        if ticket.risk == "write":
            _take(self.writes_in_flight, ticket.intent, (ticket.idempotency_key, ticket.step))

    def repeat(self, ticket: ToolTicket, ts: ToolSettings, step: int) -> Stop | None:
        """The ``repeated_action`` stop this call would make, checked before dispatch: the
        triggering duplicate is recorded but not executed. Identical calls in flight count
        as occurrences (:class:`RepeatLimits`)."""
        limits = ts.repeat
        if ts.write:
            stop = self._duplicate_intent(ticket, ts, limits.in_a_row, step)
            if stop is not None:
                return stop
        flying = self.in_flight.get(ticket.fingerprint) or ()
        streak = self.streak
        same = streak is not None and streak.fingerprint == ticket.fingerprint
        if not same and not flying:
            return None
        if ts.write and ticket.idempotency_key is not None:
            limit, cap = limits.keyed, limits.keyed_across_progress
        else:
            limit, cap = limits.in_a_row, limits.across_progress
        k = len(flying)
        since = (self.streak_count if same else 0) + k
        total = (self.streak_all_count if same else 0) + k
        across = since + 1 < limit and total + 1 >= cap
        if since + 1 < limit and not across:
            return None
        repeats: Iterable[int] = ()
        if same:
            repeats = self.streak_all if across else self.streak_steps
        count = (total if across else since) + 1
        detail: dict[str, Any] = {}
        if streak is not None and same:
            detail["observation"] = streak.observation[:12]
        if k:
            detail["in_flight"] = k
        if across:
            detail["across_progress"] = True
        if ts.write:
            detail["risk"], detail["risk_source"] = "write", ts.risk_source
        return make_stop(
            StopReason.REPEATED_ACTION,
            step,
            limit=cap if across else limit,
            observed=count,
            evidence=Evidence(
                detector="repeated_action",
                tool=ticket.tool,
                repetitions=count,
                step_indices=(*repeats, *flying[-self.window :], ticket.step),
                fingerprint_previews=(preview(ticket.tool, ticket.fingerprint),),
                detail=detail,
            ),
        )

    def _duplicate_intent(
        self, ticket: ToolTicket, ts: ToolSettings, limit: int, step: int
    ) -> Stop | None:
        """The same write intent (loose fingerprint, idempotency key left out) already
        succeeded, or is in flight, ``limit - 1`` times in the window: refused whatever
        those calls returned (a ticket created twice is not progress, even with a new id
        each time), or before they return (two parallel runs of one write are a duplicate
        side effect whatever the first returns)."""
        prior: list[tuple[str | None, int]] = self.writes.get(ticket.intent) or []
        key = ticket.idempotency_key
        if key is not None and any(k == key for k, _ in prior):
            return None  # an idempotent replay: stable completion, not a new side effect
        duplicates = [(k, s) for k, s in prior if k is None or k != key]
        flying = [
            (k, s)
            for k, s in self.writes_in_flight.get(ticket.intent) or ()
            if k is None or k != key
        ]
        duplicates += flying
        if not duplicates or len(duplicates) + 1 < limit:
            return None
        steps = (*(s for _, s in duplicates), ticket.step)
        return make_stop(
            StopReason.REPEATED_ACTION,
            step,
            limit=limit,
            observed=len(duplicates) + 1,
            evidence=Evidence(
                detector="duplicate_intent",
                tool=ticket.tool,
                repetitions=len(duplicates) + 1,
                step_indices=steps[-self.window :],
                fingerprint_previews=(preview(ticket.tool, ticket.intent),),
                detail={
                    "risk": "write",
                    "risk_source": ts.risk_source,
                    "idempotency_key_changed": key is not None,
                    **({"in_flight": len(flying)} if flying else {}),
                },
            ),
        )

    # ------------------------------------------------------------- after a call

    def remember_failure(
        self, ticket: ToolTicket, ts: ToolSettings, failure: FailureClass | None
    ) -> None:
        """Record how the call ended for the retry rule: a success ends the failure
        episode (later isolated errors start afresh)."""
        if failure is None:
            if ticket.retry_key:
                self.last_failure.pop(ticket.retry_key, None)
                self.retries.pop(ticket.retry_key, None)
            return
        if not ticket.retry_key:
            ticket.retry_key = ts.loose_key(ticket.arguments or {})
        self.last_failure.set(ticket.retry_key, failure)

    def record(
        self, ticket: ToolTicket, ts: ToolSettings, obs: str, result: Any, succeeded: bool
    ) -> bool:
        """Add a recorded call (result or error) to the window and the streak; returns
        whether it is progress evidence: a success with an observation not seen before, or
        a progress field moved. A successful write's intent is noted for duplicates."""
        progress = False
        if succeeded:
            progress = obs not in self.seen
            if ts.keep and self._progress_changed(ticket, result, ts.keep):
                progress = True
            if ts.write:
                prior = list(self.writes.get(ticket.intent) or [])
                key = ticket.idempotency_key
                if key is None or all(k != key for k, _ in prior):
                    prior.append((key, ticket.step))
                self.writes.set(ticket.intent, prior[-self.window :])
        self.seen.set(obs, None)
        action = Action(ticket.fingerprint, obs, ticket.tool, ticket.step, progress)
        self.actions.append(action)
        streak = self.streak
        if (
            streak is not None
            and streak.fingerprint == action.fingerprint
            and streak.observation == obs
        ):
            self.streak_steps.append(ticket.step)
            self.streak_all.append(ticket.step)
            self.streak_count += 1
            self.streak_all_count += 1
        else:
            self.streak = action
            self.streak_steps.clear()
            self.streak_steps.append(ticket.step)
            self.streak_all.clear()
            self.streak_all.append(ticket.step)
            self.streak_count = self.streak_all_count = 1
        return progress

    def progress_noted(self) -> None:
        """Explicit progress evidence starts a new count of identical actions (the count
        across progress goes on)."""
        self.streak_steps.clear()
        self.streak_count = 0

    def _progress_changed(self, ticket: ToolTicket, result: Any, keep: frozenset[str]) -> bool:
        """A progress field moved to a value not seen before for this tool (a flapping
        cursor that returns to an earlier value is not progress)."""
        if not isinstance(result, Mapping):
            return False
        changed = False
        for k, v in result.items():
            lowered = key_text(k).lower()
            if lowered not in keep:
                continue
            slot = (ticket.tool, lowered, canonical_json(canonicalize(v)))
            if slot not in self.progress_values:
                pair = slot[:2]
                changed = changed or self.progress_fields[pair] > 0
                self.progress_fields[pair] += 1
                self.progress_values.set(slot, None)
        return changed

    def _forget_progress_value(self, slot: tuple[Any, ...]) -> None:
        pair = slot[:2]
        left = self.progress_fields[pair] - 1
        if left > 0:
            self.progress_fields[pair] = left
        else:
            del self.progress_fields[pair]

    def cycle(self, ticket: ToolTicket, step: int) -> Stop | None:
        """A cycle of period 2..k completed by the action just recorded.

        Checked once the newest result is known: every member's observation must equal
        its counterpart one period earlier. (Checked before dispatch, the last member's
        result would be unknown, and polling where that member advances, such as reading
        new log lines between status checks, would be stopped wrongly.)
        """
        reps = self.policy.cycle_repetitions
        actions = self.actions
        n = len(actions)
        if n < 2 * reps:
            return None
        last = actions[n - 1]
        newest, newest_obs = last.fingerprint, last.observation
        # O(1) per period that cannot match (polling with new results), and the history
        # copied once, not per period (per period it is quadratic in the period).
        history: list[Action] | None = None
        same_tail = 0  # trailing actions identical to the newest one
        for period in self.cycle_periods:
            length = period * reps
            if n < length:
                break
            before = actions[n - 1 - period]
            if before.fingerprint != newest or before.observation != newest_obs:
                continue
            if history is None:
                history = list(actions)
                while same_tail < n and history[n - 1 - same_tail].fingerprint == newest:
                    same_tail += 1
            if same_tail >= period:
                continue  # the last period is one action repeated: not a cycle of it
            seq = history[n - length :]
            if len({a.fingerprint for a in seq[:period]}) < 2:
                continue
            if any(
                seq[i].fingerprint != seq[i - period].fingerprint
                or seq[i].observation != seq[i - period].observation
                for i in range(period, length)
            ):
                continue
            return make_stop(
                StopReason.ACTION_CYCLE,
                step,
                limit=reps,
                observed=reps,
                evidence=Evidence(
                    detector="action_cycle",
                    tool=ticket.tool,
                    matched_period=period,
                    repetitions=reps,
                    step_indices=tuple(a.step for a in seq),
                    fingerprint_previews=tuple(
                        preview(a.tool, a.fingerprint) for a in seq[:period]
                    ),
                    detail={"tools": [a.tool for a in seq[:period]]},
                ),
            )
        return None

    # ---------------------------------------------------------------- decisions

    def repeated_decision(self, decision: Decision, step: int) -> Stop | None:
        """The ``repeated_decision`` stop once the same non-tool decision has been seen
        ``repeated_decision_limit`` times in the look-back."""
        fp = decision.fingerprint()
        if len(self.decisions) == self.decisions.maxlen:
            old, _ = self.decisions[0]
            self.decision_counts[old] -= 1
            if self.decision_counts[old] <= 0:
                del self.decision_counts[old]
        self.decisions.append((fp, step))
        self.decision_counts[fp] += 1
        count = self.decision_counts[fp]
        limit = self.policy.repeated_decision_limit
        if count < limit:
            return None
        detail: dict[str, Any] = {
            "kind": "ask"
            if decision.asks_for
            else ("empty" if not (decision.text or "").strip() else "text")
        }
        if decision.asks_for:
            asked = sorted({f.strip().casefold() for f in decision.asks_for})
            detail["asks_for"] = asked
            already = sorted(set(asked) & self.provided)
            if already:
                detail["already_provided"] = already
        return make_stop(
            StopReason.REPEATED_DECISION,
            step,
            limit=limit,
            observed=count,
            evidence=Evidence(
                detector="repeated_decision",
                repetitions=count,
                step_indices=tuple(s for f, s in self.decisions if f == fp),
                fingerprint_previews=(f"decision#{fp[:12]}",),
                detail=detail,
            ),
        )

    def no_progress(self, step: int, since: int) -> Stop | None:
        """The ``no_progress`` stop once ``since`` steps in a row ended without progress
        evidence (``no_progress_patience``)."""
        patience = self.policy.no_progress_patience
        if since < patience:
            return None
        first = step - since + 1
        return make_stop(
            StopReason.NO_PROGRESS,
            step,
            limit=patience,
            observed=since,
            evidence=Evidence(
                detector="no_progress",
                repetitions=since,
                step_indices=tuple(range(max(first, 1), step + 1))[-self.window :],
                detail={"last_progress_step": max(first - 1, 0)},
            ),
        )
