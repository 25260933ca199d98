"""The sampling rule: which stopped runs keep their steps (DESIGN section 5, "sample").

Decided once per run, when its first stop is stored (or when its stop never comes, after
``undecided_timeout_seconds`` without a new span). The run row, its counts (steps, tool
calls, errors, blocked), its stop and evidence are kept for every run; the decision only
says whether the run's steps are kept (``sampled=True``) or deleted (``sampled=False``).

Rules, in order:

1. ``completed`` stops: kept when the run id hashes below ``completed_fraction``
   (deterministic: every collector and every retry agrees). Others fail with rule
   ``completed_fraction``.
2. Every other stop reason (abnormal), and runs decided by timeout (quota reason
   :data:`NO_STOP_REASON`), pass rule 1.
3. At most ``max_full_runs_per_hour`` runs pass per ``(stop_reason, tool)`` and clock hour
   (collector wall clock, UTC hour buckets), where ``tool`` is the run's most frequent
   tool among the steps stored when the decision is made (``""`` when none; ties go to
   the first name), recorded as ``runs.sample_tool``. This cap also applies to abnormal
   stops: it is what bounds storage in a loop storm; runs past it keep their stop row and
   evidence.

:class:`Sampler` is pure (no clock, no storage): the store keeps the per-hour counts in its
``sample_quota`` table and passes the current count in. Thread-safe.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Final

from loopwatch.instrumentation import StopReason

__all__ = [
    "NO_STOP_REASON",
    "RULE_ABNORMAL",
    "RULE_COMPLETED_FRACTION",
    "RULE_COMPLETED_SAMPLED",
    "RULE_HOURLY_CAP",
    "Sampler",
    "SamplingConfig",
    "SamplingDecision",
    "hour_bucket",
    "run_fraction",
]

NO_STOP_REASON: Final = "no_stop"
"""Quota key of a run decided by timeout (its stop never arrived)."""

RULE_ABNORMAL: Final = "abnormal"
RULE_COMPLETED_SAMPLED: Final = "completed_sampled"
RULE_COMPLETED_FRACTION: Final = "completed_fraction"
RULE_HOURLY_CAP: Final = "hourly_cap"

_COMPLETED: Final = StopReason.COMPLETED.value
_HOUR_SECONDS: Final = 3600


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """Sampling settings.

    Attributes:
        completed_fraction: share of ``completed`` runs whose steps are kept, in [0, 1].
        max_full_runs_per_hour: cap of runs kept with steps per (stop_reason, tool) and
            hour, >= 1.
        undecided_timeout_seconds: a run with no stop and no new span for this long is
            decided as :data:`NO_STOP_REASON` (bounds the staging of its steps), > 0.
    """

    completed_fraction: float = 0.1
    max_full_runs_per_hour: int = 100
    undecided_timeout_seconds: float = 3600.0

    def validate(self) -> None:
        """Check every field.

        Raises:
            ValueError: a field is out of range or not finite.
        """
        if not (math.isfinite(self.completed_fraction) and 0.0 <= self.completed_fraction <= 1.0):
            raise ValueError("completed_fraction must be a finite number in [0, 1]")
        if isinstance(self.max_full_runs_per_hour, bool) or self.max_full_runs_per_hour < 1:
            raise ValueError("max_full_runs_per_hour must be an integer >= 1")
        if not (
            math.isfinite(self.undecided_timeout_seconds) and self.undecided_timeout_seconds > 0
        ):
            raise ValueError("undecided_timeout_seconds must be a finite number > 0")


@dataclass(frozen=True, slots=True)
class SamplingDecision:
    """Outcome for one run.

    Attributes:
        sampled: keep the run's steps.
        rule: ``abnormal``, ``completed_sampled`` (kept), ``completed_fraction`` or
            ``hourly_cap`` (dropped by that rule).
        quota_reason: the stop reason the hourly cap counted (``no_stop`` on timeout).
    """

    sampled: bool
    rule: str
    quota_reason: str


def run_fraction(run_id: str) -> float:
    """Map a run id to a stable number in [0, 1) (first 8 bytes of its sha256)."""
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def hour_bucket(now_seconds: float) -> int:
    """Return the start of the UTC clock hour holding ``now_seconds``, in epoch seconds."""
    return int(now_seconds // _HOUR_SECONDS) * _HOUR_SECONDS


class Sampler:
    """Apply :class:`SamplingConfig` to one run at a time.

    Args:
        config: validated here.

    Raises:
        ValueError: invalid config.

    Example:
        >>> s = Sampler(SamplingConfig(completed_fraction=0.0, max_full_runs_per_hour=1))
        >>> s.decide(run_id="r1", stop_reason="repeated_action", kept_this_hour=0).sampled
        True
        >>> s.decide(run_id="r2", stop_reason="repeated_action", kept_this_hour=1).rule
        'hourly_cap'
    """

    def __init__(self, config: SamplingConfig | None = None) -> None:
        self.config = config if config is not None else SamplingConfig()
        self.config.validate()

    def decide(
        self, *, run_id: str, stop_reason: str | None, kept_this_hour: int
    ) -> SamplingDecision:
        """Decide one run.

        Args:
            run_id: the run id (hashed for the ``completed`` fraction).
            stop_reason: the primary stop's reason; ``None`` when decided by timeout.
            kept_this_hour: runs already kept this hour for the same (quota reason, tool).
        """
        quota_reason = stop_reason if stop_reason is not None else NO_STOP_REASON
        if stop_reason == _COMPLETED:
            if run_fraction(run_id) >= self.config.completed_fraction:
                return SamplingDecision(False, RULE_COMPLETED_FRACTION, quota_reason)
            rule = RULE_COMPLETED_SAMPLED
        else:
            rule = RULE_ABNORMAL
        if kept_this_hour >= self.config.max_full_runs_per_hour:
            return SamplingDecision(False, RULE_HOURLY_CAP, quota_reason)
        return SamplingDecision(True, rule, quota_reason)
