"""The stop-reason palette covers the closed set with distinct colours."""

from __future__ import annotations

from loopwatch.dashboard.palette import OTHER_COLOR, REASON_COLORS
from loopwatch.instrumentation.outcomes import StopReason


def test_every_stop_reason_has_its_own_colour() -> None:
    assert set(REASON_COLORS) == {reason.value for reason in StopReason}
    colours = [*REASON_COLORS.values(), OTHER_COLOR]
    assert len({c.lower() for c in colours}) == len(colours)
